/* SPDX-License-Identifier: MIT */
/*
 * Write-back, eviction, deletion and the batched counter flush.
 *
 * Durability order, per batch: reserve SSD extents in memory, write the
 * blocks with O_DIRECT, fdatasync the data file, and only then commit one
 * LMDB transaction that records the blocks and takes their extents out of
 * the persistent free map.  A crash anywhere before that commit leaves the
 * extents free in the metadata and the blocks unknown: forgotten cleanly.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "cache/ctl.h"
#include "meta/log.h"
#include "meta/util.h"

#define container_of(p, t, m) ((t *)((char *)(p) - offsetof(t, m)))
#define WB_MAX_BATCH 1024
#define WB_MAX_TRIES 3

static struct kvfs_block *pn_block(struct kvfs_pnode *n)
{
	return container_of(n, struct kvfs_block, pn);
}

/* --------------------------------------------------------------- queue */

void kvfs_wb_enqueue(struct kvfs_cache *c, struct kvfs_block *b)
{
	kvfs_block_get_ref(b);
	atomic_fetch_or(&b->flags, KVFS_B_QUEUED);
	pthread_mutex_lock(&c->wb_lock);
	b->wb_next = NULL;
	if (c->wb_tail)
		c->wb_tail->wb_next = b;
	else
		c->wb_head = b;
	c->wb_tail = b;
	c->wb_queued++;
	pthread_cond_signal(&c->wb_cond);
	pthread_mutex_unlock(&c->wb_lock);
}

/* ------------------------------------------------------------- deletion */

/*
 * Removes @b's record and gives its SSD extent back to the persistent free
 * map in one transaction (if it has a record), then takes it out of the
 * index, its namespace, the policy and the chunk cache; @why is the log's
 * verb ("unlinked", "evicted from the SSD tier", ...). Memory and the
 * extent are released once nothing has the block open. Returns 0,
 * -ENOENT if it was deleted already, -EBUSY if it is pinned, or the
 * metadata's error (nothing changed). Takes c->meta_lock and b->lock; the
 * caller holds neither, nor c->policy_lock.
 */
int kvfs_block_delete(struct kvfs_cache *c, struct kvfs_block *b,
		      const char *why)
{
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_meta_txn *t;
	unsigned f;
	int rc = 0;

	kvfs_fmt_key_hex(b->pn.key, hex);
	pthread_mutex_lock(&c->meta_lock);
	pthread_mutex_lock(&b->lock);
	f = atomic_load(&b->flags);
	if (f & KVFS_B_DELETED) {
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&c->meta_lock);
		return -ENOENT;
	}
	/*
	 * Every caller looked at the pins already, but before it held
	 * meta_lock. A pin sets its bit and then records it under meta_lock,
	 * so a pin acknowledged before this point is seen here: without this
	 * check an unlink (or an SSD eviction) that looked a moment earlier
	 * would delete a block whose pin had already been acknowledged.
	 */
	if (atomic_load(&b->pins)) {
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&c->meta_lock);
		kvfs_info("ns %s: block %s.kv was pinned meanwhile: not %s",
			  b->ns->rec.name, hex, why);
		return -EBUSY;
	}
	pthread_mutex_unlock(&b->lock);
	if (f & KVFS_B_PERSISTED) {
		rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
		if (rc)
			goto out_unlock;
		rc = kvfs_meta_blk_del(t, b->pn.key);
		if (!rc || rc == -ENOENT)
			rc = kvfs_meta_ccrc_del(t, b->pn.key);
		if (!rc)
			rc = kvfs_meta_score_del_block(t, b->pn.key);
		if (!rc)
			rc = kvfs_meta_free_give(t, b->ssd.off, b->ssd.len);
		if (rc) {
			kvfs_meta_txn_abort(t);
			goto out_unlock;
		}
		rc = kvfs_meta_txn_commit(t);
		if (rc)
			goto out_unlock;
	}
	atomic_fetch_or(&b->flags, KVFS_B_DELETED);
	pthread_mutex_unlock(&c->meta_lock);

	kvfs_index_remove(c, b);
	kvfs_ns_del(b->ns, b);
	pthread_mutex_lock(&c->policy_lock);
	kvfs_policy_forget(c->policy, &b->pn);
	pthread_mutex_unlock(&c->policy_lock);
	kvfs_chunk_forget(c, b);
	atomic_fetch_add(&c->st_deletes, 1);
	kvfs_dbg("ns %s: block %s.kv %s", b->ns->rec.name, hex, why);
	if (c->delete_hook && strcmp(why, "unlinked")) {
		char name[KVFS_FMT_NAME_LEN + 1];

		snprintf(name, sizeof(name), "%s.kv", hex);
		c->delete_hook(c->delete_hook_arg, b->ns->ino, name);
	}
	kvfs_block_try_free(c, b);
	kvfs_cache_put(c, b); /* the index's reference */
	return 0;

out_unlock:
	pthread_mutex_unlock(&c->meta_lock);
	kvfs_err("ns %s: deleting block %s.kv failed: %s", b->ns->rec.name,
		 hex, strerror(-rc));
	return rc;
}

/* ------------------------------------------------------------- eviction */

static bool ok_dram(struct kvfs_pnode *n, void *arg)
{
	struct kvfs_block *b = pn_block(n);
	unsigned f = atomic_load(&b->flags);

	return (f & KVFS_B_PERSISTED) && !(f & KVFS_B_DELETED) &&
	       !(atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM) &&
	       atomic_load(&b->opens) == 0 && atomic_load(&b->readers) == 0;
}

static bool ok_ssd(struct kvfs_pnode *n, void *arg)
{
	struct kvfs_block *b = pn_block(n);
	unsigned f = atomic_load(&b->flags);

	return (f & KVFS_B_PERSISTED) && !(f & KVFS_B_DELETED) &&
	       !atomic_load(&b->pins) && atomic_load(&b->opens) == 0 &&
	       atomic_load(&b->readers) == 0;
}

/*
 * Drop @b's DRAM copy. Caller holds c->policy_lock. Fails with -EBUSY if a
 * lock-free reader got in first: the pointer is unpublished, then the
 * reader count checked; a reader that saw the pointer is counted.
 */
static int drop_dram(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_extent dx;
	void *p;

	pthread_mutex_lock(&b->lock);
	p = atomic_exchange(&b->dram_ptr, NULL);
	if (!p) {
		pthread_mutex_unlock(&b->lock);
		return -ENOENT;
	}
	if (atomic_load(&b->readers) > 0 || atomic_load(&b->opens) > 0) {
		atomic_store(&b->dram_ptr, p);
		pthread_mutex_unlock(&b->lock);
		return -EBUSY;
	}
	dx = b->dram;
	memset(&b->dram, 0, sizeof(b->dram));
	atomic_fetch_and(&b->tiers, ~(unsigned)KVFS_TIER_BIT_DRAM);
	pthread_mutex_unlock(&b->lock);
	kvfs_policy_remove(c->policy, KVFS_TIER_DRAM, &b->pn);
	c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM], &dx);
	atomic_fetch_sub(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.evictions, 1);
	return 0;
}

/* Wait for the write-back to make progress. False if it cannot: nothing
 * is queued, or there is no thread.
 */
static bool wait_writeback(struct kvfs_cache *c)
{
	bool progress = false;

	pthread_mutex_lock(&c->wb_lock);
	if (c->wb_queued + c->wb_inflight > 0) {
		if (c->wb_started) {
			uint64_t pass = c->wb_passes;

			pthread_cond_signal(&c->wb_cond);
			while (c->wb_passes == pass && !c->wb_stop)
				pthread_cond_wait(&c->wb_done, &c->wb_lock);
			progress = true;
		} else {
			pthread_mutex_unlock(&c->wb_lock);
			return kvfs_wb_pass(c) == 0;
		}
	}
	pthread_mutex_unlock(&c->wb_lock);
	return progress;
}

/*
 * Drop @b from DRAM and ask the policy whether it may stay in the tier
 * below. A refused block goes further down; below the SSD there is
 * nothing, so it is discarded (HotPrefix's selective admission). Caller
 * holds c->policy_lock; returns with it held. *discard tells the caller to
 * delete @b once the lock is released (a delete takes c->meta_lock, which
 * comes first in the lock order).
 */
static int demote_dram(struct kvfs_cache *c, struct kvfs_block *b,
		       bool *discard)
{
	int rc = drop_dram(c, b);

	*discard = false;
	if (rc)
		return rc;
	if (!kvfs_policy_admit(c->policy, KVFS_TIER_DRAM, KVFS_TIER_SSD,
			       &b->pn) &&
	    !atomic_load(&b->pins)) {
		kvfs_block_get_ref(b);
		*discard = true;
	}
	return 0;
}

static void discard_block(struct kvfs_cache *c, struct kvfs_block *b)
{
	if (kvfs_block_delete(c, b, "discarded: not admitted to the SSD "
				    "tier") == 0)
		atomic_fetch_add(&c->st_discards, 1);
	kvfs_cache_put(c, b);
}

int kvfs_dram_drop(struct kvfs_cache *c, struct kvfs_block *b)
{
	bool discard = false;
	int rc;

	pthread_mutex_lock(&c->policy_lock);
	if (!atomic_load(&b->dram_ptr))
		rc = 0;
	else if (!ok_dram(&b->pn, NULL))
		rc = -EBUSY; /* pinned, open, or not yet on the SSD */
	else
		rc = demote_dram(c, b, &discard);
	pthread_mutex_unlock(&c->policy_lock);
	if (discard)
		discard_block(c, b);
	return rc == -ENOENT ? 0 : rc;
}

int kvfs_dram_reserve(struct kvfs_cache *c, uint64_t len,
		      struct kvfs_extent *e)
{
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_pnode *v;
	bool discard = false;
	int rc;

	if (len > dram->capacity)
		return -ENOSPC;
	for (;;) {
		rc = dram->ops->alloc(dram, len, e);
		if (rc != -ENOSPC)
			return rc;
		pthread_mutex_lock(&c->policy_lock);
		kvfs_cache_drain_touches(c);
		v = kvfs_policy_victim(c->policy, KVFS_TIER_DRAM, ok_dram,
				       NULL);
		if (v)
			demote_dram(c, pn_block(v), &discard);
		pthread_mutex_unlock(&c->policy_lock);
		if (discard)
			discard_block(c, pn_block(v));
		if (v)
			continue; /* dropped, or a reader raced: look again */
		/* Unpersisted blocks are written first, then dropped. */
		if (!wait_writeback(c))
			return -ENOSPC;
	}
}

/*
 * One promotion round between DRAM and the SSD: the policy's plan (e.g.
 * HotPrefix's Algorithm 2) lists blocks to move down and blocks to load
 * up. Moves down go first and loads only use room that is free, so the
 * upper tier never grows. Runs in the mover thread, never under a FUSE
 * request.
 */
/*
 * DRAM -> device promotion: the same plan between the upper two tiers.
 * It only ever try-locks the loader, so a FETCH in progress always wins
 * and this round is simply skipped.
 */
static void promote_gpu(struct kvfs_cache *c)
{
	struct kvfs_pmove plan[32];
	struct kvfs_block *up[32], *blk[32];
	size_t n, nup = 0;

	if (!c->tier[KVFS_TIER_GPU])
		return;
	pthread_mutex_lock(&c->policy_lock);
	n = kvfs_policy_promote(c->policy, KVFS_TIER_DRAM, KVFS_TIER_GPU,
				plan, 32);
	for (size_t i = 0; i < n; i++) {
		blk[i] = pn_block(plan[i].node);
		kvfs_block_get_ref(blk[i]);
	}
	pthread_mutex_unlock(&c->policy_lock);
	for (size_t i = 0; i < n; i++) {
		if (plan[i].op == KVFS_PMOVE_DOWN) {
			if (kvfs_gpu_drop(c, blk[i]) == 0)
				atomic_fetch_add(&c->st_demoted, 1);
		} else if (plan[i].op == KVFS_PMOVE_UP) {
			up[nup++] = blk[i];
		}
	}
	if (nup && kvfs_gpu_load(c, up, nup,
				 KVFS_GPU_TRYLOCK | KVFS_GPU_NOEVICT) == 0)
		atomic_fetch_add(&c->st_promoted, nup);
	for (size_t i = 0; i < n; i++)
		kvfs_cache_put(c, blk[i]);
}

int kvfs_promote_pass(struct kvfs_cache *c)
{
	struct kvfs_pmove plan[64];
	struct kvfs_block *blk[64];
	size_t n;

	pthread_mutex_lock(&c->policy_lock);
	kvfs_cache_drain_touches(c);
	n = kvfs_policy_promote(c->policy, KVFS_TIER_SSD, KVFS_TIER_DRAM,
				plan, 64);
	for (size_t i = 0; i < n; i++) {
		blk[i] = pn_block(plan[i].node);
		kvfs_block_get_ref(blk[i]);
	}
	pthread_mutex_unlock(&c->policy_lock);
	if (n)
		atomic_fetch_add(&c->st_promote_passes, 1);

	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = blk[i];
		bool discard = false;

		if (atomic_load(&b->flags) & KVFS_B_DELETED)
			continue;
		if (plan[i].op == KVFS_PMOVE_DOWN) {
			pthread_mutex_lock(&c->policy_lock);
			if (ok_dram(&b->pn, NULL) &&
			    demote_dram(c, b, &discard) == 0)
				atomic_fetch_add(&c->st_demoted, 1);
			pthread_mutex_unlock(&c->policy_lock);
			if (discard)
				discard_block(c, b);
		} else if (plan[i].op == KVFS_PMOVE_UP &&
			   !atomic_load(&b->dram_ptr)) {
			pthread_mutex_lock(&b->io_lock);
			if (!atomic_load(&b->dram_ptr) &&
			    kvfs_block_load(c, b, KVFS_LOAD_MOVE, NULL,
					    NULL) == 0)
				atomic_fetch_add(&c->st_promoted, 1);
			pthread_mutex_unlock(&b->io_lock);
		}
	}
	for (size_t i = 0; i < n; i++)
		kvfs_cache_put(c, blk[i]);
	promote_gpu(c);
	return 0;
}

static int ssd_reserve(struct kvfs_cache *c, uint64_t len,
		       struct kvfs_extent *e)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_pnode *v;
	struct kvfs_block *b;
	int rc;

	for (;;) {
		rc = ssd->ops->alloc(ssd, len, e);
		if (rc != -ENOSPC)
			return rc;
		pthread_mutex_lock(&c->policy_lock);
		kvfs_cache_drain_touches(c);
		v = kvfs_policy_victim(c->policy, KVFS_TIER_SSD, ok_ssd, NULL);
		b = v ? pn_block(v) : NULL;
		if (b)
			kvfs_block_get_ref(b);
		pthread_mutex_unlock(&c->policy_lock);
		if (!b) {
			kvfs_warn("SSD tier full (%" PRIu64 " of %" PRIu64
				  " bytes used) and nothing evictable",
				  (uint64_t)atomic_load(&ssd->used),
				  ssd->capacity);
			return -ENOSPC;
		}
		/* Said before the transaction as well as after it: after a
		 * crash, the log names the eviction that was under way.
		 */
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_dbg("ns %s: evicting block %s.kv from the SSD tier",
			 b->ns->rec.name, hex);
		rc = kvfs_block_delete(c, b, "evicted from the SSD tier");
		if (!rc)
			atomic_fetch_add(&ssd->st.evictions, 1);
		kvfs_cache_put(c, b);
		/* Deleted by someone else, or pinned since it was picked:
		 * the next victim, then.
		 */
		if (rc && rc != -ENOENT && rc != -EBUSY)
			return rc;
	}
}

/* ----------------------------------------------------------- write-back */

struct wb_item {
	struct kvfs_block *b;
	struct kvfs_extent ext;
	int rc;
};

/*
 * A block the SSD has no room for (everything there pinned or open) waits
 * on the stalled list, with fsync reporting ENOSPC meanwhile; the next
 * extent given back puts it on the queue again.
 */
static void wb_stall(struct kvfs_cache *c, struct kvfs_block *b, int rc)
{
	kvfs_block_get_ref(b);
	atomic_store(&b->wb_err, rc);
	atomic_fetch_or(&b->flags, KVFS_B_WBERR);
	pthread_mutex_lock(&c->wb_lock);
	b->wb_next = c->wb_stalled;
	c->wb_stalled = b;
	atomic_fetch_add(&c->wb_nstalled, 1);
	pthread_mutex_unlock(&c->wb_lock);
}

void kvfs_wb_unstall(struct kvfs_cache *c)
{
	struct kvfs_block *b, *next;

	if (!atomic_load(&c->wb_nstalled))
		return;
	pthread_mutex_lock(&c->wb_lock);
	b = c->wb_stalled;
	c->wb_stalled = NULL;
	atomic_store(&c->wb_nstalled, 0);
	pthread_mutex_unlock(&c->wb_lock);
	for (; b; b = next) {
		next = b->wb_next;
		atomic_fetch_and(&b->flags, ~(unsigned)KVFS_B_WBERR);
		atomic_store(&b->wb_err, 0);
		b->wb_tries = 0;
		if (!(atomic_load(&b->flags) & KVFS_B_DELETED))
			kvfs_wb_enqueue(c, b);
		kvfs_cache_put(c, b);
	}
}

static void wb_requeue_or_fail(struct kvfs_cache *c, struct kvfs_block *b,
			       int rc, unsigned *tries)
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_fmt_key_hex(b->pn.key, hex);
	atomic_fetch_add(&c->st_wb_errors, 1);
	if (rc == -ENOSPC) {
		kvfs_warn("ns %s: %s.kv waits in DRAM for SSD space; fsync "
			  "reports ENOSPC until then", b->ns->rec.name, hex);
		wb_stall(c, b, rc);
		return;
	}
	if (++*tries < WB_MAX_TRIES) {
		kvfs_warn("ns %s: write-back of %s.kv failed (%s); retrying",
			  b->ns->rec.name, hex, strerror(-rc));
		kvfs_wb_enqueue(c, b);
		return;
	}
	kvfs_err("ns %s: write-back of %s.kv failed (%s): the block stays "
		 "in DRAM only and fsync reports the error",
		 b->ns->rec.name, hex, strerror(-rc));
	atomic_store(&b->wb_err, rc);
	atomic_fetch_or(&b->flags, KVFS_B_WBERR);
}

int kvfs_wb_pass(struct kvfs_cache *c)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	unsigned max = c->conf.writeback_batch;
	struct kvfs_meta_txn *t = NULL;
	struct wb_item *it;
	size_t n = 0;
	int rc = 0;

	if (max == 0 || max > WB_MAX_BATCH)
		max = WB_MAX_BATCH;
	it = calloc(max, sizeof(*it));
	if (!it)
		return -ENOMEM;

	pthread_mutex_lock(&c->wb_lock);
	while (c->wb_head && n < max) {
		struct kvfs_block *b = c->wb_head;

		c->wb_head = b->wb_next;
		if (!c->wb_head)
			c->wb_tail = NULL;
		c->wb_queued--;
		it[n++].b = b;
	}
	c->wb_inflight = n;
	pthread_mutex_unlock(&c->wb_lock);

	/* 1. data: reserve and write. Eviction never drops the DRAM copy of
	 *    an unpersisted block, but a delete (unlink) frees it at once
	 *    unless the block is open: the pass counts itself as a reader
	 *    while it copies, as kvfs_cache_reader_init() does, and the last
	 *    of a delete and the pass frees the copy.
	 */
	size_t nw = 0;
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = it[i].b;
		struct kvfs_extent dx;

		atomic_fetch_and(&b->flags, ~(unsigned)KVFS_B_QUEUED);
		atomic_fetch_add(&b->opens, 1);
		if (atomic_load(&b->flags) & KVFS_B_DELETED) {
			it[i].rc = -ENOENT;
		} else {
			pthread_mutex_lock(&b->lock);
			dx = b->dram;
			pthread_mutex_unlock(&b->lock);
			it[i].rc = ssd_reserve(c, dx.len, &it[i].ext);
			if (!it[i].rc)
				it[i].rc = ssd->ops->write(ssd, &it[i].ext, 0,
							   dx.ptr, dx.len);
			if (!it[i].rc)
				nw++;
		}
		atomic_fetch_sub(&b->opens, 1);
		kvfs_block_try_free(c, b);
	}
	/* 2. make the data durable before any record points to it */
	if (nw && !(c->flags & KVFS_CACHE_NOSYNC)) {
		rc = ssd->ops->sync(ssd);
		if (rc) {
			kvfs_err("fdatasync of the SSD data file failed: %s",
				 strerror(-rc));
			for (size_t i = 0; i < n; i++)
				if (!it[i].rc)
					it[i].rc = rc;
			nw = 0;
		}
	}
	/* 3. one transaction for the batch */
	pthread_mutex_lock(&c->meta_lock);
	if (nw) {
		rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
		for (size_t i = 0; i < n && !rc; i++) {
			struct kvfs_block *b = it[i].b;
			struct kvfs_meta_blk r;

			if (it[i].rc)
				continue;
			if (atomic_load(&b->flags) & KVFS_B_DELETED) {
				it[i].rc = -ENOENT;
				continue;
			}
			pthread_mutex_lock(&b->lock);
			b->ssd = it[i].ext;
			kvfs_cache_record_fill(b, &r);
			r.tiers |= KVFS_TIER_BIT_SSD;
			pthread_mutex_unlock(&b->lock);
			rc = kvfs_meta_blk_put(t, b->pn.key, &r);
			if (!rc && b->ccrc)
				rc = kvfs_meta_ccrc_put(
					t, b->pn.key, b->ccrc,
					kvfs_fmt_chunk_ncrcs(&b->ns->geom,
							     b->n_tokens));
			if (!rc)
				rc = kvfs_meta_free_take(t, it[i].ext.off,
							 it[i].ext.len);
		}
		if (rc) {
			kvfs_meta_txn_abort(t);
		} else {
			rc = kvfs_meta_txn_commit(t);
		}
		if (rc) {
			kvfs_err("committing a write-back batch of %zu blocks "
				 "failed: %s", nw, strerror(-rc));
			for (size_t i = 0; i < n; i++)
				if (!it[i].rc)
					it[i].rc = rc;
		}
	}
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = it[i].b;

		if (it[i].rc)
			continue;
		pthread_mutex_lock(&b->lock);
		atomic_fetch_or(&b->flags, KVFS_B_PERSISTED);
		atomic_fetch_or(&b->tiers, KVFS_TIER_BIT_SSD);
		pthread_mutex_unlock(&b->lock);
		atomic_fetch_add(&ssd->st.blocks, 1);
	}
	pthread_mutex_unlock(&c->meta_lock);

	/* 4. tell the policy, settle failures, release the queue's refs */
	pthread_mutex_lock(&c->policy_lock);
	for (size_t i = 0; i < n; i++) {
		struct kvfs_paccess a = { .now = kvfs_util_now_real() };

		if (!it[i].rc && !(atomic_load(&it[i].b->flags) &
				   KVFS_B_DELETED))
			kvfs_policy_insert(c->policy, KVFS_TIER_SSD,
					   &it[i].b->pn, &a);
	}
	pthread_mutex_unlock(&c->policy_lock);
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = it[i].b;

		if (it[i].rc && it[i].ext.len)
			ssd->ops->free(ssd, &it[i].ext);
		if (it[i].rc && it[i].rc != -ENOENT)
			wb_requeue_or_fail(c, b, it[i].rc, &b->wb_tries);
		kvfs_cache_put(c, b);
	}
	if (nw)
		atomic_fetch_add(&c->st_wb_batches, 1);
	atomic_fetch_add(&c->st_wb_blocks, nw);

	pthread_mutex_lock(&c->wb_lock);
	c->wb_inflight = 0;
	c->wb_passes++;
	pthread_cond_broadcast(&c->wb_done);
	pthread_mutex_unlock(&c->wb_lock);
	free(it);
	return rc;
}

static void *wb_main(void *arg)
{
	struct kvfs_cache *c = arg;

	pthread_mutex_lock(&c->wb_lock);
	for (;;) {
		while (!c->wb_head && !c->wb_stop)
			pthread_cond_wait(&c->wb_cond, &c->wb_lock);
		if (!c->wb_head && c->wb_stop)
			break;
		pthread_mutex_unlock(&c->wb_lock);
		kvfs_wb_pass(c);
		pthread_mutex_lock(&c->wb_lock);
	}
	pthread_mutex_unlock(&c->wb_lock);
	return NULL;
}

/* ------------------------------------------------------------- counters */

/*
 * Hits and last-access times are recorded in one transaction per period,
 * never one write per read. Walks the index under each shard lock only
 * long enough to collect references.
 */
int kvfs_counters_flush(struct kvfs_cache *c)
{
	struct kvfs_block **v = NULL;
	size_t n = 0, cap = 0;
	struct kvfs_meta_txn *t;
	int rc = 0;

	for (int s = 0; s < KVFS_SHARDS; s++) {
		struct kvfs_shard *sh = &c->by_ino[s];

		pthread_mutex_lock(&sh->lock);
		for (size_t i = 0; i < sh->nb; i++) {
			for (struct kvfs_block *b = sh->b[i]; b;
			     b = b->hnext_ino) {
				if (!atomic_load(&b->counters_dirty) ||
				    !(atomic_load(&b->flags) &
				      KVFS_B_PERSISTED))
					continue;
				if (n == cap) {
					size_t nc = cap ? cap * 2 : 256;
					void *nv = realloc(v, nc * sizeof(*v));

					if (!nv)
						break;
					v = nv;
					cap = nc;
				}
				kvfs_block_get_ref(b);
				v[n++] = b;
			}
		}
		pthread_mutex_unlock(&sh->lock);
	}
	if (!n)
		goto out_free;
	pthread_mutex_lock(&c->meta_lock);
	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	for (size_t i = 0; i < n && !rc; i++) {
		struct kvfs_block *b = v[i];
		struct kvfs_meta_blk r;

		if (atomic_load(&b->flags) & KVFS_B_DELETED)
			continue;
		atomic_store(&b->counters_dirty, false);
		pthread_mutex_lock(&b->lock);
		kvfs_cache_record_fill(b, &r);
		pthread_mutex_unlock(&b->lock);
		rc = kvfs_meta_blk_put(t, b->pn.key, &r);
	}
	if (rc)
		kvfs_meta_txn_abort(t);
	else
		rc = kvfs_meta_txn_commit(t);
	pthread_mutex_unlock(&c->meta_lock);
	if (rc)
		kvfs_warn("recording access counters failed: %s",
			  strerror(-rc));
	else
		atomic_fetch_add(&c->st_counter_flushes, 1);
	for (size_t i = 0; i < n; i++) {
		if (rc)
			atomic_store(&v[i]->counters_dirty, true);
		kvfs_cache_put(c, v[i]);
	}
out_free:
	free(v);
	return rc;
}

/* ---------------------------------------------------------------- mover */

/* The mover thread: feeds batched accesses to the policy, runs its
 * periodic work and records counters every flush period.
 */
static void *mv_main(void *arg)
{
	struct kvfs_cache *c = arg;
	struct timespec ts;

	pthread_mutex_lock(&c->mv_lock);
	while (!c->mv_stop) {
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec +
			      (uint64_t)c->conf.flush_ms * 1000000ull;
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		pthread_cond_timedwait(&c->mv_cond, &c->mv_lock, &ts);
		if (c->mv_stop)
			break;
		pthread_mutex_unlock(&c->mv_lock);

		pthread_mutex_lock(&c->policy_lock);
		kvfs_cache_drain_touches(c);
		struct kvfs_paccess a = { .now = kvfs_util_now_real() };
		kvfs_policy_tick(c->policy, &a);
		pthread_mutex_unlock(&c->policy_lock);
		kvfs_promote_pass(c);
		kvfs_ctl_reclaim(c);
		kvfs_counters_flush(c);
		kvfs_chunk_flush(c);

		pthread_mutex_lock(&c->mv_lock);
	}
	pthread_mutex_unlock(&c->mv_lock);
	return NULL;
}

int kvfs_wb_start(struct kvfs_cache *c)
{
	int rc;

	if (c->flags & KVFS_CACHE_NOTHREADS)
		return 0;
	rc = -pthread_create(&c->wb_thread, NULL, wb_main, c);
	if (rc)
		return rc;
	c->wb_started = true;
	rc = -pthread_create(&c->mv_thread, NULL, mv_main, c);
	if (rc)
		return rc;
	c->mv_started = true;
	return 0;
}

void kvfs_wb_stop(struct kvfs_cache *c)
{
	if (c->mv_started) {
		pthread_mutex_lock(&c->mv_lock);
		c->mv_stop = true;
		pthread_cond_signal(&c->mv_cond);
		pthread_mutex_unlock(&c->mv_lock);
		pthread_join(c->mv_thread, NULL);
		c->mv_started = false;
	}
	if (c->wb_started) {
		/* The thread drains the queue before it exits. */
		pthread_mutex_lock(&c->wb_lock);
		c->wb_stop = true;
		pthread_cond_broadcast(&c->wb_cond);
		pthread_cond_broadcast(&c->wb_done);
		pthread_mutex_unlock(&c->wb_lock);
		pthread_join(c->wb_thread, NULL);
		pthread_mutex_lock(&c->wb_lock);
		c->wb_started = false;
		pthread_mutex_unlock(&c->wb_lock);
	}
	while (c->wb_head)
		if (kvfs_wb_pass(c))
			break;
	if (c->wb_stalled) {
		struct kvfs_block *b = c->wb_stalled, *next;
		size_t n = 0;

		c->wb_stalled = NULL;
		for (; b; b = next, n++) {
			next = b->wb_next;
			kvfs_cache_put(c, b);
		}
		kvfs_err("%zu committed blocks never found room on the SSD "
			 "(all of it pinned or open) and are lost", n);
	}
}

int kvfs_cache_writeback_now(struct kvfs_cache *c)
{
	int rc = 0;

	pthread_mutex_lock(&c->wb_lock);
	if (!c->wb_started) {
		pthread_mutex_unlock(&c->wb_lock);
		while (c->wb_head && !rc)
			rc = kvfs_wb_pass(c);
		return rc;
	}
	while (c->wb_head || c->wb_inflight) {
		uint64_t pass = c->wb_passes;

		pthread_cond_signal(&c->wb_cond);
		while (c->wb_passes == pass)
			pthread_cond_wait(&c->wb_done, &c->wb_lock);
	}
	pthread_mutex_unlock(&c->wb_lock);
	return rc;
}
