/* SPDX-License-Identifier: MIT */
/*
 * Latency histograms cheap enough for hot paths: fixed log-spaced buckets
 * of atomic counters, no lock, no allocation.  Recording is a handful of
 * relaxed atomic adds; a reader (the metrics endpoint) copies the counters
 * whenever it likes, without stopping the writers, so a copy may be a few
 * events apart between buckets and sum: counters only grow, which is all
 * a Prometheus histogram needs.
 *
 * Bucket i counts the events that took at most 2^i microseconds (and
 * more than the bucket before); the last one, KVFS_HIST_BUCKETS, the rest
 * (Prometheus' +Inf).  The bounds run from 1 us to 2^25 us (about 33.6 s).
 */
#ifndef KVFS_META_HIST_H
#define KVFS_META_HIST_H

#include <stdatomic.h>
#include <stdint.h>

enum {
	KVFS_HIST_BUCKETS = 26, /* finite bounds: 2^0 .. 2^25 us */
};

struct kvfs_hist {
	/* atomic: events per bucket, not cumulative; [KVFS_HIST_BUCKETS]
	 * is +Inf.
	 */
	atomic_uint_least64_t n[KVFS_HIST_BUCKETS + 1];
	atomic_uint_least64_t sum_ns; /* atomic: of every event */
};

/* A copy of a histogram, cumulative as Prometheus exposes it. */
struct kvfs_hist_snap {
	uint64_t le[KVFS_HIST_BUCKETS + 1]; /* events <= bound i; last: all */
	uint64_t count; /* == le[KVFS_HIST_BUCKETS] */
	uint64_t sum_ns;
};

/* The bucket of an event of @ns nanoseconds. */
static inline unsigned kvfs_hist_bucket(uint64_t ns)
{
	/* ns <= 1000 * 2^k exactly when ceil(ns / 1000) <= 2^k. */
	uint64_t us = (ns + 999) / 1000;
	unsigned k = us <= 1 ? 0 : 64 - (unsigned)__builtin_clzll(us - 1);

	return k < KVFS_HIST_BUCKETS ? k : KVFS_HIST_BUCKETS;
}

/* Count one event of @ns nanoseconds. Lock-free; any thread. */
static inline void kvfs_hist_add(struct kvfs_hist *h, uint64_t ns)
{
	atomic_fetch_add_explicit(&h->n[kvfs_hist_bucket(ns)], 1,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

/* Upper bound of bucket @i (< KVFS_HIST_BUCKETS) in seconds. */
double kvfs_hist_bound_s(unsigned i);

/* Copy @h into @out (cumulative). Lock-free; any thread. */
void kvfs_hist_read(const struct kvfs_hist *h, struct kvfs_hist_snap *out);

#endif
