/* SPDX-License-Identifier: MIT */
/*
 * The DRAM tier inside the engine: making room (eviction through the
 * policy: a victim leaves DRAM, and one the policy does not admit to the
 * SSD is discarded), dropping a copy, and loading blocks from the SSD
 * into it (verified) and publishing them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

bool kvfs_dram_may_drop(struct kvfs_pnode *n, void *arg)
{
	struct kvfs_block *b = kvfs_pn_block(n);
	unsigned f = atomic_load(&b->flags);

	return (f & KVFS_B_PERSISTED) && !(f & KVFS_B_DELETED) &&
	       !(atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM) &&
	       atomic_load(&b->opens) == 0 && atomic_load(&b->readers) == 0;
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

/* A refused block goes further down; below the SSD there is nothing, so it
 * is discarded (HotPrefix's selective admission).  The delete waits for
 * the caller to release policy_lock: it takes c->meta_lock, which comes
 * first in the lock order.
 */
int kvfs_dram_demote_locked(struct kvfs_cache *c, struct kvfs_block *b,
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

void kvfs_dram_discard(struct kvfs_cache *c, struct kvfs_block *b)
{
	if (kvfs_block_delete(c, b,
			      "discarded: not admitted to the SSD "
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
	else if (!kvfs_dram_may_drop(&b->pn, NULL))
		rc = -EBUSY; /* pinned, open, or not yet on the SSD */
	else
		rc = kvfs_dram_demote_locked(c, b, &discard);
	pthread_mutex_unlock(&c->policy_lock);
	if (discard)
		kvfs_dram_discard(c, b);
	return rc == -ENOENT ? 0 : rc;
}

static int dram_discard_after(struct kvfs_cache *c, struct kvfs_block *b)
{
	kvfs_dram_discard(c, b);
	return 0;
}

/* Unpersisted blocks are written first, then dropped. */
static int dram_no_victim(struct kvfs_cache *c)
{
	return wait_writeback(c) ? 0 : -ENOSPC;
}

/* A victim dropped, or one a reader raced to, is followed by another
 * look.
 */
static const struct kvfs_reserve_ops dram_reserve_ops = {
	.tier = KVFS_TIER_DRAM,
	.fit_check = true,
	.may_evict = kvfs_dram_may_drop,
	.evict_locked = kvfs_dram_demote_locked,
	.evict = dram_discard_after,
	.no_victim = dram_no_victim,
};

int kvfs_dram_reserve(struct kvfs_cache *c, uint64_t len, struct kvfs_extent *e)
{
	return kvfs_reserve(c, &dram_reserve_ops, len, e, NULL);
}

/* ---------------------------------------------------------------- loads */

void kvfs_block_ssd_bad(struct kvfs_cache *c, struct kvfs_block *b,
			uint64_t off, const char *why, const void *img,
			uint64_t len)
{
	char hex[KVFS_KEY_HEX_LEN + 1], held[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;

	kvfs_fmt_key_hex(b->pn.key, hex);
	/* Torn bytes and another block's image call for different fixes:
	 * say whose header the extent holds, if any.
	 */
	fe = img ? kvfs_fmt_validate(img, len, &b->ns->geom, NULL,
				     b->ns->rec.root,
				     KVFS_FMT_ALLOW_HIDDEN |
					     KVFS_FMT_ALLOW_MIXED,
				     &h) :
		   KVFS_FMT_ETOOSHORT;
	if (fe != KVFS_FMT_ETOOSHORT && fe != KVFS_FMT_EMAGIC &&
	    fe != KVFS_FMT_EVERSION && fe != KVFS_FMT_EHDRCRC &&
	    memcmp(h.key, b->pn.key, KVFS_KEY_LEN)) {
		kvfs_fmt_key_hex(h.key, held);
		kvfs_err("ns %s: block %s.kv: SSD copy at offset %" PRIu64
			 " fails verification (%s): not served; the extent "
			 "holds the header of block %s.kv (kind %u, dtype "
			 "%u, %u tokens at %" PRIu64 ")",
			 b->ns->rec.name, hex, off, why, held, h.kind,
			 h.dtype, h.n_tokens, h.start_pos);
	} else {
		kvfs_err("ns %s: block %s.kv: SSD copy at offset %" PRIu64
			 " fails verification (%s): not served",
			 b->ns->rec.name, hex, off, why);
	}
	atomic_fetch_add(&c->st_csum_errors, 1);
}

/* Torn or misdirected bytes are never served (nor kept by the scrub). */
int kvfs_block_verify_ssd(struct kvfs_cache *c, struct kvfs_block *b,
			  const void *buf)
{
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;

	fe = kvfs_fmt_validate(buf, b->ssize, &b->ns->geom, b->pn.key,
			       b->ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED,
			       &h);
	if (fe == KVFS_FMT_OK && h.hdr_crc == b->hdr_crc)
		return 0;
	kvfs_block_ssd_bad(c, b, b->ssd.off,
			   fe == KVFS_FMT_OK ?
				   "header does not match the record" :
				   kvfs_fmt_strerror(fe),
			   buf, b->ssize);
	return -EBADMSG;
}

int kvfs_block_publish_dram(struct kvfs_cache *c, struct kvfs_block *b,
			    const struct kvfs_extent *ext)
{
	struct kvfs_paccess a = { .now = kvfs_util_now_real() };

	/* The delete sets DELETED, then makes the policy forget the block
	 * under policy_lock: seen here under that lock, DELETED means the
	 * forget is done or will follow this insert.  Once deleted, nothing
	 * would take the node out of the policy again before the block is
	 * freed, so a deleted block gets no DRAM copy.
	 */
	pthread_mutex_lock(&c->policy_lock);
	pthread_mutex_lock(&b->lock);
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&c->policy_lock);
		return -ENOENT;
	}
	b->dram = *ext;
	atomic_store(&b->dram_ptr, ext->ptr);
	atomic_fetch_or(&b->tiers, KVFS_TIER_BIT_DRAM);
	pthread_mutex_unlock(&b->lock);
	kvfs_policy_insert(c->policy, KVFS_TIER_DRAM, &b->pn, &a);
	pthread_mutex_unlock(&c->policy_lock);
	atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	return 0;
}

/* Read the SSD copy @sx of @b into @buf and verify it; a hit of the SSD
 * tier.  0 or -errno (-EBADMSG logged).
 */
static int block_read_ssd(struct kvfs_cache *c, struct kvfs_block *b,
			  const struct kvfs_extent *sx, void *buf)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	int rc;

	rc = ssd->ops->read(ssd, sx, 0, buf, sx->len);
	if (!rc)
		rc = kvfs_block_verify_ssd(c, b, buf);
	if (!rc)
		atomic_fetch_add(&ssd->st.hits, 1);
	return rc;
}

int kvfs_block_read_ssd(struct kvfs_cache *c, struct kvfs_block *b,
			void *buf, uint64_t cap)
{
	struct kvfs_extent sx;
	int rc;

	rc = kvfs_block_ssd_get(b, &sx);
	if (rc)
		return rc;
	if (cap < sx.len || (uintptr_t)buf % KVFS_FMT_ALIGN)
		return -EINVAL;
	return block_read_ssd(c, b, &sx, buf);
}

int kvfs_block_load(struct kvfs_cache *c, struct kvfs_block *b, int mode,
		    void **priv, uint64_t *priv_len)
{
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_extent ext = { 0 }, sx;
	bool admit = true;
	void *buf;
	int rc;

	rc = kvfs_block_ssd_get(b, &sx);
	if (rc)
		return rc;
	if (mode == KVFS_LOAD_READ)
		admit = kvfs_block_dram_admit(c, b, KVFS_TIER_SSD);
	if (mode == KVFS_LOAD_MOVE)
		rc = dram->ops->alloc(dram, sx.len, &ext);
	else if (admit && mode != KVFS_LOAD_PRIV)
		rc = kvfs_dram_reserve(c, sx.len, &ext);
	else
		rc = -ENOSPC;
	if (rc && mode != KVFS_LOAD_READ && mode != KVFS_LOAD_PRIV)
		return rc;
	if (!rc)
		buf = ext.ptr;
	else if (posix_memalign(&buf, KVFS_FMT_ALIGN, sx.len))
		return -ENOMEM;
	rc = block_read_ssd(c, b, &sx, buf);
	if (rc)
		goto out_free;
	if (!ext.ptr) {
		*priv = buf;
		*priv_len = sx.len;
		return 0;
	}
	if (kvfs_block_publish_dram(c, b, &ext)) {
		/* Deleted meanwhile (still open): a reader gets its own
		 * copy, a move or a pin has nothing left to do.
		 */
		rc = -ENOENT;
		if (mode != KVFS_LOAD_READ)
			goto out_free;
		if (posix_memalign(&buf, KVFS_FMT_ALIGN, sx.len)) {
			rc = -ENOMEM;
			goto out_free;
		}
		memcpy(buf, ext.ptr, sx.len);
		dram->ops->free(dram, &ext);
		*priv = buf;
		*priv_len = sx.len;
		return 0;
	}
	return 0;

out_free:
	if (ext.ptr)
		dram->ops->free(dram, &ext);
	else
		free(buf);
	return rc;
}
