/* SPDX-License-Identifier: MIT */
/*
 * Deletion of a block (unlink, SSD eviction, discard): its record and
 * extent go in one transaction, then the block leaves the index, its
 * namespace, the policy and whatever module registered for deletions;
 * its memory and extents are given back once nothing has it open.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_block_on_delete(struct kvfs_cache *c,
			 void (*fn)(struct kvfs_cache *c, struct kvfs_block *b))
{
	if (c->n_delete_fns == KVFS_DELETE_FNS_MAX) {
		kvfs_err("no room for another deletion listener "
			 "(KVFS_DELETE_FNS_MAX %d)",
			 KVFS_DELETE_FNS_MAX);
		return -ENOSPC;
	}
	c->delete_fns[c->n_delete_fns++] = fn;
	return 0;
}

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
	for (unsigned i = 0; i < c->n_delete_fns; i++)
		c->delete_fns[i](c, b);
	atomic_fetch_add(&c->st_deletes, 1);
	kvfs_dbg("ns %s: block %s.kv %s", b->ns->rec.name, hex, why);
	if (c->delete_hook && strcmp(why, "unlinked")) {
		char name[KVFS_FMT_NAME_LEN + 1];

		snprintf(name, sizeof(name), "%s.kv", hex);
		c->delete_hook(c->delete_hook_arg, b->ns->ino, b->ino, name);
	}
	kvfs_block_try_free(c, b);
	kvfs_cache_put(c, b); /* the index's reference */
	return 0;

out_unlock:
	pthread_mutex_unlock(&c->meta_lock);
	kvfs_err("ns %s: deleting block %s.kv failed: %s", b->ns->rec.name, hex,
		 strerror(-rc));
	return rc;
}

/*
 * Give a deleted block's DRAM copy and SSD extent back once nobody has it
 * open. Called by the delete and by the last reader; the FREED bit makes
 * it happen exactly once. The extent was already returned to the metadata
 * free map by the delete transaction; only now may the allocator reuse it.
 */
void kvfs_block_try_free(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_extent dx, sx, gx;
	unsigned f;

	if (!(atomic_load(&b->flags) & KVFS_B_DELETED) ||
	    atomic_load(&b->opens) > 0)
		return;
	f = atomic_fetch_or(&b->flags, KVFS_B_FREED);
	if (f & KVFS_B_FREED)
		return;
	kvfs_block_count_hidden(c, b, -1);
	pthread_mutex_lock(&b->lock);
	dx = b->dram;
	sx = b->ssd;
	gx = b->gpu;
	memset(&b->dram, 0, sizeof(b->dram));
	memset(&b->gpu, 0, sizeof(b->gpu));
	atomic_store(&b->dram_ptr, NULL);
	atomic_store(&b->tiers, 0);
	pthread_mutex_unlock(&b->lock);
	if (dx.ptr) {
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &dx);
		atomic_fetch_sub(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	}
	if (gx.len) {
		c->tier[KVFS_TIER_GPU]->ops->free(c->tier[KVFS_TIER_GPU], &gx);
		atomic_fetch_sub(&c->tier[KVFS_TIER_GPU]->st.blocks, 1);
	}
	if (f & KVFS_B_PERSISTED) {
		c->tier[KVFS_TIER_SSD]->ops->free(c->tier[KVFS_TIER_SSD], &sx);
		atomic_fetch_sub(&c->tier[KVFS_TIER_SSD]->st.blocks, 1);
		kvfs_wb_unstall(c);
	}
}
