/* SPDX-License-Identifier: MIT */
/*
 * Block objects: allocation, references and their release, the facts fs/
 * and the records read off a block, and the touch stack through which
 * accesses reach the policy without the read path taking its lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

struct kvfs_block *kvfs_block_alloc(struct kvfs_ns *ns)
{
	struct kvfs_block *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->ns = ns;
	pthread_mutex_init(&b->lock, NULL);
	pthread_mutex_init(&b->io_lock, NULL);
	atomic_init(&b->refs, 1);
	for (int t = 0; t < KVFS_NTIERS; t++)
		b->pn.t[t].prev = b->pn.t[t].next = NULL;
	b->pn.next_use = UINT64_MAX;
	return b;
}

void kvfs_block_get_ref(struct kvfs_block *b)
{
	atomic_fetch_add(&b->refs, 1);
}

static void block_destroy(struct kvfs_cache *c, struct kvfs_block *b)
{
	/* A live block (shutdown) still owns its DRAM copy; a deleted one gave
	 * its space back in kvfs_block_try_free().
	 */
	if (!(atomic_load(&b->flags) & KVFS_B_FREED) && b->dram.ptr) {
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &b->dram);
		atomic_fetch_sub(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	}
	if (!(atomic_load(&b->flags) & KVFS_B_FREED) && b->gpu.len) {
		c->tier[KVFS_TIER_GPU]->ops->free(c->tier[KVFS_TIER_GPU],
						  &b->gpu);
		atomic_fetch_sub(&c->tier[KVFS_TIER_GPU]->st.blocks, 1);
	}
	if (b->parent)
		kvfs_cache_put(c, b->parent);
	free(b->ccrc);
	pthread_mutex_destroy(&b->lock);
	pthread_mutex_destroy(&b->io_lock);
	free(b);
}

void kvfs_cache_put(struct kvfs_cache *c, struct kvfs_block *b)
{
	/* Parents are released iteratively through block_destroy's
	 * recursion; chains are bounded by prefix depth.
	 */
	if (b && atomic_fetch_sub(&b->refs, 1) == 1)
		block_destroy(c, b);
}

struct kvfs_ns *kvfs_block_ns(struct kvfs_block *b)
{
	return b->ns;
}

void kvfs_block_info(struct kvfs_block *b, struct kvfs_block_info *out)
{
	memset(out, 0, sizeof(*out));
	out->ino = b->ino;
	out->size = b->size;
	out->stored_size = b->ssize;
	out->stored_kind = b->kind;
	out->stored_kv_from = b->kv_from;
	out->n_layers = b->ns->geom.n_layers;
	out->created = b->created;
	out->last_access = atomic_load(&b->last_access);
	out->hits = atomic_load(&b->hits);
	out->n_tokens = b->n_tokens;
	out->depth = b->pn.depth;
	out->tiers = atomic_load(&b->tiers);
	out->pins = atomic_load(&b->pins);
	out->category = atomic_load(&b->category);
	out->leases = (uint32_t)atomic_load(&b->leases);
	out->persisted = atomic_load(&b->flags) & KVFS_B_PERSISTED;
	out->remote = atomic_load(&b->flags) & KVFS_B_REMOTE;
	memcpy(out->key, b->pn.key, KVFS_KEY_LEN);
	memcpy(out->parent, b->parent_key, KVFS_KEY_LEN);
}

void kvfs_cache_record_fill(struct kvfs_block *b, struct kvfs_meta_blk *r)
{
	memset(r, 0, sizeof(*r));
	r->magic = KVFS_META_BLK_MAGIC;
	r->version = KVFS_META_VERSION;
	r->kind = b->kind;
	r->kv_from = b->kind == KVFS_KIND_MIXED ? b->kv_from : 0;
	r->ns_id = b->ns->rec.id;
	r->depth = b->pn.depth;
	r->ino = b->ino;
	memcpy(r->parent, b->parent_key, KVFS_KEY_LEN);
	r->n_tokens = b->n_tokens;
	r->hdr_crc = b->hdr_crc;
	r->size = b->ssize;
	r->ssd_off = b->ssd.off;
	r->ssd_len = b->ssd.len;
	r->start_pos = b->start_pos;
	r->pins = atomic_load(&b->pins);
	r->category = atomic_load(&b->category);
	r->hits = atomic_load(&b->hits);
	r->last_access = atomic_load(&b->last_access);
	r->tiers = atomic_load(&b->tiers);
	r->created = b->created;
}

uint64_t kvfs_block_payload_off(const struct kvfs_block *b)
{
	return kvfs_fmt_payload_off(b->n_tokens);
}

int kvfs_block_ssd_get(struct kvfs_block *b, struct kvfs_extent *sx)
{
	int rc;

	pthread_mutex_lock(&b->lock);
	*sx = b->ssd;
	rc = (atomic_load(&b->flags) & KVFS_B_PERSISTED) ? 0 : -EIO;
	pthread_mutex_unlock(&b->lock);
	if (rc)
		kvfs_err("block ino %" PRIu64 " has no copy in any tier",
			 b->ino);
	return rc;
}

/* ---------------------------------------------------------- touch stack */

/*
 * Reads must not take the policy lock, so an access only pushes the block
 * on a lock-free stack (once until drained); the policy sees the accesses
 * when the mover thread or the next eviction drains it.
 */
void kvfs_cache_touch(struct kvfs_cache *c, struct kvfs_block *b)
{
	atomic_fetch_add(&b->hits, 1);
	atomic_fetch_add_explicit(&b->ns->st_hits, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&b->ns->st_bytes_read, b->size,
				  memory_order_relaxed);
	if (atomic_load_explicit(&b->dram_ptr, memory_order_relaxed))
		atomic_fetch_add_explicit(&b->ns->st_dram_hits, 1,
					  memory_order_relaxed);
	atomic_store(&b->last_access, kvfs_util_now_real());
	atomic_store(&b->counters_dirty, true);
	if (atomic_exchange(&b->touched, true))
		return;
	kvfs_block_get_ref(b);
	struct kvfs_block *old = atomic_load(&c->touch_head);
	do {
		b->touch_next = old;
	} while (!atomic_compare_exchange_weak(&c->touch_head, &old, b));
}

/* Caller holds c->policy_lock. */
void kvfs_cache_drain_touches(struct kvfs_cache *c)
{
	struct kvfs_block *b = atomic_exchange(&c->touch_head, NULL);
	static atomic_uint_least64_t reqno;

	while (b) {
		struct kvfs_block *next = b->touch_next;
		struct kvfs_pnode *path = &b->pn;
		struct kvfs_paccess a = {
			.now = atomic_load(&b->last_access),
			.request = atomic_fetch_add(&reqno, 1),
			.hit = true,
		};

		atomic_store(&b->touched, false);
		if (!(atomic_load(&b->flags) & KVFS_B_DELETED) && b->pn.tiers) {
			kvfs_policy_access(c->policy, &path, 1, &a);
			kvfs_fleet_note(c, b->pn.key);
		}
		kvfs_cache_put(c, b);
		b = next;
	}
}
