/* SPDX-License-Identifier: MIT */
/*
 * The admin operations of a block (unlink, pins, category) and statfs's
 * figures; the statistics are stats.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
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
