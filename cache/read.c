/* SPDX-License-Identifier: MIT */
/*
 * The read path: open read handles (readers), and serving their reads from
 * the published DRAM copy without a lock, from a load, or from the
 * restoration of a block stored as hidden states.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/rpool_i.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_cache_reader_init(struct kvfs_cache *c, struct kvfs_reader *r,
			   struct kvfs_block *b)
{
	memset(r, 0, sizeof(*r));
	atomic_fetch_add(&b->opens, 1);
	/* Pairs with kvfs_block_delete(): it sets DELETED, then looks at
	 * opens; we count ourselves, then look at DELETED.
	 */
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		atomic_fetch_sub(&b->opens, 1);
		kvfs_block_try_free(c, b);
		kvfs_cache_put(c, b);
		return -ENOENT;
	}
	r->b = b;
	if (atomic_load(&b->dram_ptr))
		atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.hits, 1);
	else
		atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.misses, 1);
	kvfs_cache_touch(c, b);
	return 0;
}

void kvfs_cache_reader_release(struct kvfs_cache *c, struct kvfs_reader *r)
{
	if (!r->b)
		return;
	free(r->priv);
	atomic_fetch_sub(&r->b->opens, 1);
	kvfs_block_try_free(c, r->b);
	kvfs_cache_put(c, r->b);
	memset(r, 0, sizeof(*r));
}

/*
 * The published DRAM copy of @b if readers may be served from it, with
 * @b->readers counted; NULL (not counted) otherwise.  A block stored as
 * hidden states is served only once its DRAM copy is the KV image.
 */
static uint8_t *dram_servable(struct kvfs_block *b)
{
	uint8_t *base;

	atomic_fetch_add(&b->readers, 1);
	base = atomic_load(&b->dram_ptr);
	if (base && (!kvfs_block_needs_restore(b) ||
		     kvfs_fmt_img_kind(base) == KVFS_KIND_KV))
		return base;
	atomic_fetch_sub(&b->readers, 1);
	return NULL;
}

int kvfs_cache_read_begin(struct kvfs_cache *c, struct kvfs_reader *r,
			  uint64_t off, size_t len, const void **ptr, size_t *n)
{
	struct kvfs_block *b = r->b;
	uint8_t *base;
	int rc;

	if (off >= b->size) {
		*ptr = NULL;
		*n = 0;
		r->in_dram = false;
		return 0;
	}
	if (len > b->size - off)
		len = (size_t)(b->size - off);
	for (;;) {
		if (r->priv) {
			base = r->priv;
			r->in_dram = false;
			break;
		}
		/* Hot path: no lock. Count ourselves first, then look; the
		 * evictor unpublishes first, then checks the count.
		 */
		base = dram_servable(b);
		if (base) {
			r->in_dram = true;
			break;
		}
		if (kvfs_block_needs_restore(b)) {
			/* Never the stored bytes: wait for the KV image. */
			rc = kvfs_rpool_wait(c, b, &r->priv, &r->priv_len);
			if (rc)
				return rc;
			continue;
		}
		pthread_mutex_lock(&b->io_lock);
		rc = atomic_load(&b->dram_ptr) ?
			     0 :
			     kvfs_block_load(c, b, KVFS_LOAD_READ, &r->priv,
					     &r->priv_len);
		pthread_mutex_unlock(&b->io_lock);
		if (rc)
			return rc;
	}
	/* SSD bytes are counted by the tier as they are read from the
	 * device; here only what DRAM serves.
	 */
	if (r->in_dram)
		atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.bytes_read, len);
	*ptr = base + off;
	*n = len;
	return 0;
}

void kvfs_cache_read_end(struct kvfs_cache *c, struct kvfs_reader *r)
{
	if (r->in_dram) {
		atomic_fetch_sub(&r->b->readers, 1);
		r->in_dram = false;
	}
}
