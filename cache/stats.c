/* SPDX-License-Identifier: MIT */
/*
 * The engine's statistics: the latency histograms, the snapshot of every
 * counter as a struct (the metrics endpoint's), and the .kvfs/stats text
 * made from it, so that the two always say the same.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "cache/rpool_i.h"

void kvfs_cache_hist_add(struct kvfs_cache *c, enum kvfs_cache_hist h,
			 uint64_t ns)
{
	kvfs_hist_add(&c->hist[h], ns);
}

/*
 * Blocks pinned in DRAM, and of those the ones without a DRAM copy now (a
 * pin kept across a restart that could not load them).  Counted when
 * asked: pins change in several places, a walk over the listings cannot
 * drift from them.
 */
static void dram_pin_counts(struct kvfs_cache *c, uint64_t *pinned,
			    uint64_t *waiting)
{
	*pinned = *waiting = 0;
	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];

		pthread_rwlock_rdlock(&ns->lock);
		for (size_t j = 0; j < ns->n; j++) {
			struct kvfs_block *b = ns->blocks[j];

			if (!(atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM))
				continue;
			(*pinned)++;
			if (!(atomic_load(&b->tiers) & KVFS_TIER_BIT_DRAM))
				(*waiting)++;
		}
		pthread_rwlock_unlock(&ns->lock);
	}
}

static void tier_snap(const struct kvfs_tier *t, struct kvfs_stats_tier *o)
{
	o->present = true;
	o->capacity_bytes = t->capacity;
	o->used_bytes = atomic_load(&t->used);
	o->blocks = atomic_load(&t->st.blocks);
	o->hits = atomic_load(&t->st.hits);
	o->misses = atomic_load(&t->st.misses);
	o->evictions = atomic_load(&t->st.evictions);
	o->bytes_read = atomic_load(&t->st.bytes_read);
	o->bytes_written = atomic_load(&t->st.bytes_written);
	o->io_reads = atomic_load(&t->st.reads);
	o->io_writes = atomic_load(&t->st.writes);
	o->direct_bytes = atomic_load(&t->st.direct_bytes);
	o->staged_bytes = atomic_load(&t->st.staged_bytes);
}

static void ns_snap(struct kvfs_ns *ns, struct kvfs_stats_ns *o)
{
	struct kvfs_hc_ns *hc = &ns->hc;

	snprintf(o->name, sizeof(o->name), "%s", ns->rec.name);
	o->blocks = kvfs_ns_nblocks(ns);
	o->bytes = atomic_load(&ns->st_bytes);
	o->hits = atomic_load(&ns->st_hits);
	o->dram_hits = atomic_load(&ns->st_dram_hits);
	o->misses = atomic_load(&ns->st_misses);
	o->bytes_read = atomic_load(&ns->st_bytes_read);
	o->hidden_blocks = atomic_load(&hc->hidden_blocks);
	o->mixed_blocks = atomic_load(&hc->mixed_blocks);
	o->restored = atomic_load(&hc->restored);
	o->converted = atomic_load(&hc->converted);
	o->splits = atomic_load(&hc->splits);
}

static void restore_snap(struct kvfs_cache *c, struct kvfs_stats *s)
{
	s->hidden_blocks = atomic_load(&c->st_hidden_blocks);
	s->mixed_blocks = atomic_load(&c->st_mixed_blocks);
	s->hidden_stored_bytes = atomic_load(&c->st_hidden_stored);
	s->hidden_kv_bytes = atomic_load(&c->st_hidden_kv);
	s->restores = atomic_load(&c->st_restores);
	s->restore_ns = atomic_load(&c->st_restore_ns);
	s->restore_waits = atomic_load(&c->st_restore_waits);
	s->restore_joined = atomic_load(&c->st_restore_joined);
	s->restore_ahead = atomic_load(&c->st_restore_ahead);
	s->restore_private = atomic_load(&c->st_restore_private);
	s->restore_from_pool = atomic_load(&c->st_restore_from_pool);
	s->restore_errors = atomic_load(&c->st_restore_errors);
	s->restore_conversions = atomic_load(&c->st_converted);
	s->restore_splits = atomic_load(&c->st_splits);
	s->restore_pipelined = atomic_load(&c->st_pipelined);
	s->restore_to_device = atomic_load(&c->st_restore_dev);
	s->restore_to_device_gpu = atomic_load(&c->st_restore_gpu);
	s->restore_to_device_fallbacks =
		atomic_load(&c->st_restore_dev_fallback);
	s->restore_gpu_blocks = atomic_load(&c->st_restore_gpu_blocks);
	s->restore_gpu_fallbacks = atomic_load(&c->st_restore_gpu_fallbacks);
	s->restore_threads = c->rpool ? c->rpool->n_threads : 0;
}

int kvfs_cache_stats_get(struct kvfs_cache *c, struct kvfs_stats **out)
{
	struct kvfs_stats *s;

	s = calloc(1, sizeof(*s) + c->n_ns * sizeof(s->ns[0]));
	if (!s)
		return -ENOMEM;
	for (int i = 0; i < KVFS_NTIERS; i++)
		if (c->tier[i])
			tier_snap(c->tier[i], &s->tier[i]);
	if (c->remote) {
		s->remote = true;
		kvfs_tier_remote_stats(c->remote, &s->remote_st);
	}
	pthread_mutex_lock(&c->wb_lock);
	s->wb_queued = c->wb_queued + c->wb_inflight;
	pthread_mutex_unlock(&c->wb_lock);
	pthread_mutex_lock(&c->policy_lock);
	snprintf(s->policy, sizeof(s->policy), "%s", c->policy->ops->name);
	if (c->sight) {
		s->fleet = true;
		kvfs_sight_stats(c->sight, &s->fleet_st);
	}
	pthread_mutex_unlock(&c->policy_lock);
	s->blocks = atomic_load(&c->nblocks);
	s->commits = atomic_load(&c->st_commits);
	s->rejects = atomic_load(&c->st_rejects);
	s->deletes = atomic_load(&c->st_deletes);
	s->lookup_misses = atomic_load(&c->st_lookups_missing);
	s->checksum_errors = atomic_load(&c->st_csum_errors);
	dram_pin_counts(c, &s->dram_pins, &s->dram_pins_waiting);
	s->wb_batches = atomic_load(&c->st_wb_batches);
	s->wb_blocks = atomic_load(&c->st_wb_blocks);
	s->wb_errors = atomic_load(&c->st_wb_errors);
	s->wb_stalled = atomic_load(&c->wb_nstalled);
	s->counter_flushes = atomic_load(&c->st_counter_flushes);
	s->discarded = atomic_load(&c->st_discards);
	s->promoted = atomic_load(&c->st_promoted);
	s->demoted = atomic_load(&c->st_demoted);
	s->promote_passes = atomic_load(&c->st_promote_passes);
	s->leases = atomic_load(&c->st_leases);
	s->leases_reclaimed = atomic_load(&c->st_leases_reclaimed);
	s->fetches = atomic_load(&c->st_fetches);
	s->fetch_bytes = atomic_load(&c->st_fetch_bytes);
	s->fetch_into_bytes = atomic_load(&c->st_fetch_into_bytes);
	s->saves = atomic_load(&c->st_saves);
	if (c->chunks) {
		s->chunks = true;
		kvfs_chunk_get_stats(c, &s->chunk);
	}
	restore_snap(c, s);
	for (int i = 0; i < KVFS_CACHE_NHIST; i++)
		kvfs_hist_read(&c->hist[i], &s->hist[i]);
	s->n_ns = c->n_ns;
	for (size_t i = 0; i < c->n_ns; i++)
		ns_snap(&c->ns[i], &s->ns[i]);
	*out = s;
	return 0;
}

void kvfs_cache_stats_free(struct kvfs_stats *s)
{
	free(s);
}

static void tier_text(FILE *f, int i, const struct kvfs_stats_tier *t)
{
	const char *nm = kvfs_tier_name(i);

#define ST(k, v) fprintf(f, "tier.%s.%s %" PRIu64 "\n", nm, k, (uint64_t)(v))
	ST("capacity_bytes", t->capacity_bytes);
	ST("used_bytes", t->used_bytes);
	ST("blocks", t->blocks);
	ST("hits", t->hits);
	ST("misses", t->misses);
	ST("evictions", t->evictions);
	ST("bytes_read", t->bytes_read);
	ST("bytes_written", t->bytes_written);
	ST("io_reads", t->io_reads);
	ST("io_writes", t->io_writes);
	if (i == KVFS_TIER_GPU) {
		/* Uploads straight from pinned DRAM, and through the staging
		 * buffers.
		 */
		ST("direct_bytes", t->direct_bytes);
		ST("staged_bytes", t->staged_bytes);
	}
#undef ST
}

static void remote_text(FILE *f, const struct kvfs_remote_stats *rs)
{
#define RS(k) fprintf(f, "tier.remote.%s %" PRIu64 "\n", #k, rs->k)
	RS(hits);
	RS(misses);
	RS(rejected);
	RS(errors);
	RS(bytes_read);
	RS(bytes_written);
	RS(queued);
	RS(dropped);
	RS(nodes);
#undef RS
}

static void fleet_text(FILE *f, const struct kvfs_sight_stats *fs)
{
#define FS(k) fprintf(f, "fleet.sight.%s %" PRIu64 "\n", #k, fs->k)
	FS(keys_out);
	FS(msgs_out);
	FS(keys_in);
	FS(msgs_in);
	FS(dropped);
	FS(lost);
	FS(rejected);
	FS(errors);
	FS(reconnects);
	FS(buffered);
#undef FS
}

static void chunk_text(FILE *f, const struct kvfs_chunk_stats *ks)
{
#define CS(k, v) fprintf(f, "%s %" PRIu64 "\n", k, (uint64_t)(v))
	CS("chunk.bytes_wanted", ks->bytes_wanted);
	CS("chunk.bytes_read", ks->bytes_read);
	CS("chunk.bytes_missed", ks->bytes_missed);
	/* Bytes read from the SSD per byte the SSD had to serve, in
	 * thousandths: 1000 means no amplification.
	 */
	CS("chunk.read_amplification_milli",
	   ks->bytes_missed ? ks->bytes_read * 1000 / ks->bytes_missed : 0);
	CS("chunk.ssd_reads", ks->ssd_reads);
	CS("chunk.mem_hits", ks->mem_hits);
	CS("chunk.spec_loaded", ks->spec_loaded);
	CS("chunk.spec_used", ks->spec_used);
	CS("chunk.prefetch_joined", ks->prefetch_joined);
	CS("chunk.spec_cancelled", ks->spec_cancelled);
	CS("chunk.dram_used", ks->dram_used);
	CS("chunk.dram_pieces", ks->dram_pieces);
	CS("chunk.gpu_used", ks->gpu_used);
	CS("chunk.gpu_pieces", ks->gpu_pieces);
	CS("chunk.evictions", ks->evictions);
	CS("chunk.demotions", ks->demotions);
#undef CS
}

int kvfs_cache_stats(struct kvfs_cache *c, char **buf, size_t *len)
{
	struct kvfs_stats *s;
	char *txt = NULL;
	size_t n = 0;
	FILE *f;
	int rc;

	rc = kvfs_cache_stats_get(c, &s);
	if (rc)
		return rc;
	f = open_memstream(&txt, &n);
	if (!f) {
		kvfs_cache_stats_free(s);
		return -ENOMEM;
	}
	for (int i = 0; i < KVFS_NTIERS; i++)
		if (s->tier[i].present)
			tier_text(f, i, &s->tier[i]);
	if (s->remote)
		remote_text(f, &s->remote_st);
	if (s->fleet)
		fleet_text(f, &s->fleet_st);
#define CS(k, v) fprintf(f, "%s %" PRIu64 "\n", k, (uint64_t)(v))
	fprintf(f, "policy.name %s\n", s->policy);
	CS("cache.blocks", s->blocks);
	CS("cache.commits", s->commits);
	CS("cache.rejects", s->rejects);
	CS("cache.deletes", s->deletes);
	CS("cache.lookup_misses", s->lookup_misses);
	CS("cache.checksum_errors", s->checksum_errors);
	CS("cache.dram_pins", s->dram_pins);
	CS("cache.dram_pins_waiting", s->dram_pins_waiting);
	CS("writeback.queued", s->wb_queued);
	CS("writeback.batches", s->wb_batches);
	CS("writeback.blocks", s->wb_blocks);
	CS("writeback.errors", s->wb_errors);
	CS("writeback.stalled", s->wb_stalled);
	CS("meta.counter_flushes", s->counter_flushes);
	CS("policy.discarded", s->discarded);
	CS("policy.promoted", s->promoted);
	CS("policy.demoted", s->demoted);
	CS("policy.promote_passes", s->promote_passes);
	CS("ctl.leases", s->leases);
	CS("ctl.leases_reclaimed", s->leases_reclaimed);
	CS("ctl.fetches", s->fetches);
	CS("ctl.fetch_bytes", s->fetch_bytes);
	CS("ctl.fetch_into_bytes", s->fetch_into_bytes);
	CS("ctl.saves", s->saves);
#undef CS
	if (s->chunks)
		chunk_text(f, &s->chunk);
	for (size_t i = 0; i < s->n_ns; i++) {
		const struct kvfs_stats_ns *ns = &s->ns[i];

		fprintf(f, "ns.%s.blocks %" PRIu64 "\n", ns->name, ns->blocks);
		/* Accesses, those served with a DRAM copy, names that missed
		 * and the bytes of the accesses: kvfsctl top's rates.
		 */
		fprintf(f, "ns.%s.hits %" PRIu64 "\n", ns->name, ns->hits);
		fprintf(f, "ns.%s.dram_hits %" PRIu64 "\n", ns->name,
			ns->dram_hits);
		fprintf(f, "ns.%s.misses %" PRIu64 "\n", ns->name, ns->misses);
		fprintf(f, "ns.%s.bytes_read %" PRIu64 "\n", ns->name,
			ns->bytes_read);
	}
	kvfs_scrub_stats(c, f);
	kvfs_rpool_stats(c, f);
	kvfs_cache_stats_free(s);
	if (fclose(f)) {
		free(txt);
		return -ENOMEM;
	}
	*buf = txt;
	*len = n;
	return 0;
}
