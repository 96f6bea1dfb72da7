/* SPDX-License-Identifier: MIT */
/*
 * Reading the latency histograms of meta/hist.h.
 */
#include "meta/hist.h"

double kvfs_hist_bound_s(unsigned i)
{
	return (double)(1ull << i) * 1e-6;
}

void kvfs_hist_read(const struct kvfs_hist *h, struct kvfs_hist_snap *out)
{
	uint64_t acc = 0;

	/* Not one atomic copy: events recorded meanwhile may be in the
	 * sum and not the counts, or in some buckets and not others.
	 * Every figure only grows, which is what a scraper relies on.
	 */
	out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
	for (unsigned i = 0; i <= KVFS_HIST_BUCKETS; i++) {
		acc += atomic_load_explicit(&h->n[i], memory_order_relaxed);
		out->le[i] = acc;
	}
	out->count = acc;
}
