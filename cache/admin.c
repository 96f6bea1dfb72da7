/* SPDX-License-Identifier: MIT */
/*
 * The admin operations of a block (unlink, pins, category) and the
 * engine's statistics (.kvfs/stats, statfs).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "cache/rpool_i.h"
#include "meta/log.h"
#include "meta/util.h"

void kvfs_cache_set_delete_hook(struct kvfs_cache *c,
				void (*fn)(void *arg, uint64_t dir_ino,
					   uint64_t ino, const char *name),
				void *arg)
{
	c->delete_hook = fn;
	c->delete_hook_arg = arg;
}

int kvfs_cache_unlink(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name)
{
	struct kvfs_block *b;
	int rc = kvfs_cache_lookup(c, ns, name, &b);

	if (rc)
		return rc == -EINVAL ? -ENOENT : rc;
	if (atomic_load(&b->pins)) {
		kvfs_info("ns %s: unlink %s refused: the block is pinned "
			  "(remove user.kvfs.pin first)",
			  ns->rec.name, name);
		kvfs_cache_put(c, b);
		return -EBUSY;
	}
	rc = kvfs_block_delete(c, b, "unlinked");
	kvfs_cache_put(c, b);
	return rc;
}

/* Write the block's current record, if it has one. Caller holds
 * c->meta_lock.
 */
static int record_update(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_meta_txn *t;
	struct kvfs_meta_blk r;
	int rc;

	/* Deleted (unlinked, evicted) meanwhile: its record is gone for
	 * good, and writing it again would bring the block back on an
	 * extent already freed. DELETED is set under meta_lock, which the
	 * caller holds.
	 */
	if (atomic_load(&b->flags) & KVFS_B_DELETED)
		return -ENOENT;
	if (!(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		return 0; /* the write-back will record the current state */
	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->lock);
	kvfs_cache_record_fill(b, &r);
	pthread_mutex_unlock(&b->lock);
	rc = kvfs_meta_blk_put(t, b->pn.key, &r);
	if (rc) {
		kvfs_meta_txn_abort(t);
		return rc;
	}
	return kvfs_meta_txn_commit(t);
}

int kvfs_block_pin_load(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_reader r;
	int rc;

	if (atomic_load(&b->dram_ptr))
		return 0;
	/* Held open across the load, so that a delete meanwhile cannot
	 * free the block under it.
	 */
	kvfs_block_get_ref(b);
	rc = kvfs_cache_reader_init(c, &r, b);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->io_lock);
	rc = atomic_load(&b->dram_ptr) ?
		     0 :
		     kvfs_block_load(c, b, KVFS_LOAD_PIN, NULL, NULL);
	pthread_mutex_unlock(&b->io_lock);
	kvfs_cache_reader_release(c, &r);
	return rc;
}

int kvfs_cache_pin(struct kvfs_cache *c, struct kvfs_block *b, int tier)
{
	unsigned bit, old;
	int rc = 0;

	if (tier < 0 || tier >= KVFS_NTIERS || !c->tier[tier]) {
		kvfs_warn("pin refused: tier %s is not configured",
			  kvfs_tier_name(tier));
		return -EINVAL;
	}
	bit = 1u << tier;
	if (tier == KVFS_TIER_GPU) {
		/* The pool does not survive a restart; neither does this pin,
		 * so it is not recorded.
		 */
		old = atomic_fetch_or(&b->pins, bit);
		rc = kvfs_gpu_load(c, &b, 1, 0);
		goto out_undo;
	}
	if (tier == KVFS_TIER_SSD) {
		rc = kvfs_cache_sync(c, b);
		if (rc)
			return rc;
	}
	/* Pin first so that eviction skips the block from now on, then make
	 * sure it is resident.
	 */
	old = atomic_fetch_or(&b->pins, bit);
	if (tier == KVFS_TIER_DRAM) {
		rc = kvfs_block_pin_load(c, b);
		if (rc)
			goto out_undo;
	}
	pthread_mutex_lock(&c->meta_lock);
	rc = record_update(c, b);
	pthread_mutex_unlock(&c->meta_lock);
out_undo:
	/* A failed pin takes back only what it added: a DRAM pin recorded
	 * before, one a restart could not load yet, is the admin's and
	 * stays.
	 */
	if (rc && !(old & bit))
		atomic_fetch_and(&b->pins, ~bit);
	return rc;
}

int kvfs_cache_unpin(struct kvfs_cache *c, struct kvfs_block *b)
{
	unsigned old = atomic_exchange(&b->pins, 0);
	int rc;

	pthread_mutex_lock(&c->meta_lock);
	rc = record_update(c, b);
	pthread_mutex_unlock(&c->meta_lock);
	if (rc)
		atomic_store(&b->pins, old);
	return rc;
}

int kvfs_cache_set_category(struct kvfs_cache *c, struct kvfs_block *b,
			    uint32_t category)
{
	if (category > 0xffff)
		return -EINVAL;
	atomic_store(&b->category, category);
	pthread_mutex_lock(&c->policy_lock);
	b->pn.category = (uint16_t)category;
	pthread_mutex_unlock(&c->policy_lock);
	atomic_store(&b->counters_dirty, true);
	return 0;
}

void kvfs_cache_fsinfo(struct kvfs_cache *c, struct kvfs_cache_fsinfo *fi)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];

	fi->ssd_capacity = ssd->capacity;
	fi->ssd_free = ssd->capacity - atomic_load(&ssd->used);
	fi->blocks = atomic_load(&c->nblocks);
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

int kvfs_cache_stats(struct kvfs_cache *c, char **buf, size_t *len)
{
	uint64_t pins, waiting;
	char *s = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);

	if (!f)
		return -ENOMEM;
	for (int i = 0; i < KVFS_NTIERS; i++) {
		struct kvfs_tier *t = c->tier[i];
		const char *nm = kvfs_tier_name(i);

		if (!t)
			continue;
#define ST(k, v) fprintf(f, "tier.%s.%s %" PRIu64 "\n", nm, k, (uint64_t)(v))
		ST("capacity_bytes", t->capacity);
		ST("used_bytes", atomic_load(&t->used));
		ST("blocks", atomic_load(&t->st.blocks));
		ST("hits", atomic_load(&t->st.hits));
		ST("misses", atomic_load(&t->st.misses));
		ST("evictions", atomic_load(&t->st.evictions));
		ST("bytes_read", atomic_load(&t->st.bytes_read));
		ST("bytes_written", atomic_load(&t->st.bytes_written));
		ST("io_reads", atomic_load(&t->st.reads));
		ST("io_writes", atomic_load(&t->st.writes));
		if (i == KVFS_TIER_GPU) {
			/* Uploads straight from pinned DRAM, and through the
			 * staging buffers.
			 */
			ST("direct_bytes", atomic_load(&t->st.direct_bytes));
			ST("staged_bytes", atomic_load(&t->st.staged_bytes));
		}
#undef ST
	}
	if (c->remote) {
		struct kvfs_remote_stats rs;

		kvfs_tier_remote_stats(c->remote, &rs);
#define RS(k) fprintf(f, "tier.remote.%s %" PRIu64 "\n", #k, rs.k)
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
	pthread_mutex_lock(&c->wb_lock);
	uint64_t queued = c->wb_queued + c->wb_inflight;
	pthread_mutex_unlock(&c->wb_lock);
	pthread_mutex_lock(&c->policy_lock);
	const char *pol = c->policy->ops->name;
	pthread_mutex_unlock(&c->policy_lock);
#define CS(k, v) fprintf(f, "%s %" PRIu64 "\n", k, (uint64_t)(v))
	fprintf(f, "policy.name %s\n", pol);
	CS("cache.blocks", atomic_load(&c->nblocks));
	CS("cache.commits", atomic_load(&c->st_commits));
	CS("cache.rejects", atomic_load(&c->st_rejects));
	CS("cache.deletes", atomic_load(&c->st_deletes));
	CS("cache.lookup_misses", atomic_load(&c->st_lookups_missing));
	CS("cache.checksum_errors", atomic_load(&c->st_csum_errors));
	dram_pin_counts(c, &pins, &waiting);
	CS("cache.dram_pins", pins);
	CS("cache.dram_pins_waiting", waiting);
	CS("writeback.queued", queued);
	CS("writeback.batches", atomic_load(&c->st_wb_batches));
	CS("writeback.blocks", atomic_load(&c->st_wb_blocks));
	CS("writeback.errors", atomic_load(&c->st_wb_errors));
	CS("writeback.stalled", atomic_load(&c->wb_nstalled));
	CS("meta.counter_flushes", atomic_load(&c->st_counter_flushes));
	CS("policy.discarded", atomic_load(&c->st_discards));
	CS("policy.promoted", atomic_load(&c->st_promoted));
	CS("policy.demoted", atomic_load(&c->st_demoted));
	CS("policy.promote_passes", atomic_load(&c->st_promote_passes));
	CS("ctl.leases", atomic_load(&c->st_leases));
	CS("ctl.leases_reclaimed", atomic_load(&c->st_leases_reclaimed));
	CS("ctl.fetches", atomic_load(&c->st_fetches));
	CS("ctl.fetch_bytes", atomic_load(&c->st_fetch_bytes));
	CS("ctl.fetch_into_bytes", atomic_load(&c->st_fetch_into_bytes));
	CS("ctl.saves", atomic_load(&c->st_saves));
	if (c->chunks) {
		struct kvfs_chunk_stats ks;

		kvfs_chunk_get_stats(c, &ks);
		CS("chunk.bytes_wanted", ks.bytes_wanted);
		CS("chunk.bytes_read", ks.bytes_read);
		CS("chunk.bytes_missed", ks.bytes_missed);
		/* Bytes read from the SSD per byte the SSD had to serve, in
		 * thousandths: 1000 means no amplification.
		 */
		CS("chunk.read_amplification_milli",
		   ks.bytes_missed ? ks.bytes_read * 1000 / ks.bytes_missed :
				     0);
		CS("chunk.ssd_reads", ks.ssd_reads);
		CS("chunk.mem_hits", ks.mem_hits);
		CS("chunk.spec_loaded", ks.spec_loaded);
		CS("chunk.spec_used", ks.spec_used);
		CS("chunk.prefetch_joined", ks.prefetch_joined);
		CS("chunk.spec_cancelled", ks.spec_cancelled);
		CS("chunk.dram_used", ks.dram_used);
		CS("chunk.dram_pieces", ks.dram_pieces);
		CS("chunk.gpu_used", ks.gpu_used);
		CS("chunk.gpu_pieces", ks.gpu_pieces);
		CS("chunk.evictions", ks.evictions);
		CS("chunk.demotions", ks.demotions);
	}
	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];

		fprintf(f, "ns.%s.blocks %" PRIu64 "\n", ns->rec.name,
			kvfs_ns_nblocks(ns));
		/* Accesses, those served with a DRAM copy, their bytes and
		 * names that missed: kvfsctl top's rates.
		 */
		fprintf(f, "ns.%s.hits %" PRIu64 "\n", ns->rec.name,
			atomic_load(&ns->st_hits));
		fprintf(f, "ns.%s.dram_hits %" PRIu64 "\n", ns->rec.name,
			atomic_load(&ns->st_dram_hits));
		fprintf(f, "ns.%s.misses %" PRIu64 "\n", ns->rec.name,
			atomic_load(&ns->st_misses));
		fprintf(f, "ns.%s.bytes_read %" PRIu64 "\n", ns->rec.name,
			atomic_load(&ns->st_bytes));
	}
#undef CS
	kvfs_scrub_stats(c, f);
	kvfs_rpool_stats(c, f);
	if (fclose(f)) {
		free(s);
		return -ENOMEM;
	}
	*buf = s;
	*len = n;
	return 0;
}
