/* SPDX-License-Identifier: MIT */
/*
 * Write-back to the SSD (the pass and its thread), making room on the SSD,
 * waiting for a block to be persisted, and the batched counter flush.
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

#define WB_MAX_BATCH 1024
#define WB_MAX_TRIES 3

/* ---------------------------------------------------------- SSD space */

static bool ok_ssd(struct kvfs_pnode *n, void *arg)
{
	struct kvfs_block *b = kvfs_pn_block(n);
	unsigned f = atomic_load(&b->flags);

	return (f & KVFS_B_PERSISTED) && !(f & KVFS_B_DELETED) &&
	       !atomic_load(&b->pins) && atomic_load(&b->opens) == 0 &&
	       atomic_load(&b->readers) == 0;
}

/* Said before the transaction as well as after it: after a crash, the log
 * names the eviction that was under way.
 */
static int ssd_evict(struct kvfs_cache *c, struct kvfs_block *b)
{
	char hex[KVFS_KEY_HEX_LEN + 1];
	int rc;

	kvfs_fmt_key_hex(b->pn.key, hex);
	kvfs_dbg("ns %s: evicting block %s.kv from the SSD tier",
		 b->ns->rec.name, hex);
	rc = kvfs_block_delete(c, b, "evicted from the SSD tier");
	if (!rc)
		atomic_fetch_add(&c->tier[KVFS_TIER_SSD]->st.evictions, 1);
	return rc;
}

static int ssd_full(struct kvfs_cache *c)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];

	kvfs_warn("SSD tier full (%" PRIu64 " of %" PRIu64
		  " bytes used) and nothing evictable",
		  (uint64_t)atomic_load(&ssd->used), ssd->capacity);
	return -ENOSPC;
}

/* A victim deleted by someone else, or pinned since it was picked, makes
 * way for the next one.
 */
static const struct kvfs_reserve_ops ssd_reserve_ops = {
	.tier = KVFS_TIER_SSD,
	.may_evict = ok_ssd,
	.evict = ssd_evict,
	.no_victim = ssd_full,
};

/* ----------------------------------------------------------- write-back */

struct wb_item {
	struct kvfs_block *b;
	struct kvfs_extent ext;
	int rc;
};

static void wb_requeue_or_fail(struct kvfs_cache *c, struct kvfs_block *b,
			       int rc, unsigned *tries)
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_fmt_key_hex(b->pn.key, hex);
	atomic_fetch_add(&c->st_wb_errors, 1);
	if (rc == -ENOSPC) {
		kvfs_warn("ns %s: %s.kv waits in DRAM for SSD space; fsync "
			  "reports ENOSPC until then", b->ns->rec.name, hex);
		kvfs_wb_stall(c, b, rc);
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
			it[i].rc = kvfs_reserve(c, &ssd_reserve_ops, dx.len,
						 &it[i].ext, NULL);
			if (!it[i].rc)
				it[i].rc = ssd->ops->write(ssd, &it[i].ext, 0,
							   dx.ptr, dx.len);
			if (!it[i].rc)
				nw++;
			/* While the image is at hand and held open. */
			if (!it[i].rc && c->wb_written)
				c->wb_written(c, b, dx.ptr);
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

int kvfs_counters_init(struct kvfs_cache *c)
{
	return kvfs_task_add(c, "counters flush", kvfs_counters_flush);
}

/* ------------------------------------------------------------ lifecycle */

void kvfs_wb_on_written(struct kvfs_cache *c,
			void (*fn)(struct kvfs_cache *c, struct kvfs_block *b,
				   const void *img))
{
	c->wb_written = fn;
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
	return 0;
}

void kvfs_wb_stop(struct kvfs_cache *c)
{
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

/* ------------------------------------------------------------- persisted */

int kvfs_cache_sync(struct kvfs_cache *c, struct kvfs_block *b)
{
	int rc = 0;

	pthread_mutex_lock(&c->wb_lock);
	for (;;) {
		unsigned f = atomic_load(&b->flags);

		if (f & KVFS_B_PERSISTED)
			break;
		if (f & KVFS_B_DELETED) {
			rc = -ENOENT;
			break;
		}
		if (f & KVFS_B_WBERR) {
			rc = atomic_load(&b->wb_err) ? atomic_load(&b->wb_err)
						     : -EIO;
			break;
		}
		if (!c->wb_started) {
			/* No thread (tests): run the pass ourselves. */
			pthread_mutex_unlock(&c->wb_lock);
			rc = kvfs_wb_pass(c);
			pthread_mutex_lock(&c->wb_lock);
			if (rc)
				break;
			continue;
		}
		pthread_cond_signal(&c->wb_cond);
		pthread_cond_wait(&c->wb_done, &c->wb_lock);
	}
	pthread_mutex_unlock(&c->wb_lock);
	return rc;
}
