/* SPDX-License-Identifier: MIT */
/*
 * The promotion pass, one of the mover's periodic tasks: the policy's plan
 * between the SSD and DRAM, then between DRAM and the device pool.
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
	n = kvfs_policy_promote(c->policy, KVFS_TIER_DRAM, KVFS_TIER_GPU, plan,
				32);
	for (size_t i = 0; i < n; i++) {
		blk[i] = kvfs_pn_block(plan[i].node);
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
	if (nup &&
	    kvfs_gpu_load(c, up, nup, KVFS_GPU_TRYLOCK | KVFS_GPU_NOEVICT) == 0)
		atomic_fetch_add(&c->st_promoted, nup);
	for (size_t i = 0; i < n; i++)
		kvfs_cache_put(c, blk[i]);
}

int kvfs_promote_load(struct kvfs_cache *c, struct kvfs_block *b)
{
	int rc = -ENOENT;

	/* Open, as a reader is: with a reference alone, an unlink gives
	 * the SSD extent back to the allocator at once, and the read would
	 * get whatever was written there next (logged as a checksum
	 * failure).  Pairs with kvfs_block_delete(), as in
	 * kvfs_cache_reader_init().
	 */
	atomic_fetch_add(&b->opens, 1);
	if (!(atomic_load(&b->flags) & KVFS_B_DELETED)) {
		pthread_mutex_lock(&b->io_lock);
		rc = atomic_load(&b->dram_ptr) ?
			     -EEXIST :
			     kvfs_block_load(c, b, KVFS_LOAD_MOVE, NULL, NULL);
		pthread_mutex_unlock(&b->io_lock);
	}
	/* Promoted (or prefetched) hidden states are restored before a
	 * reader asks: the read then finds the KV image in DRAM.
	 */
	if (!rc && kvfs_block_needs_restore(b))
		kvfs_rpool_ahead(c, b);
	atomic_fetch_sub(&b->opens, 1);
	kvfs_block_try_free(c, b);
	return rc;
}

/*
 * One promotion round between DRAM and the SSD: the policy's plan (e.g.
 * HotPrefix's Algorithm 2) lists blocks to move down and blocks to load
 * up. Moves down go first and loads only use room that is free, so the
 * upper tier never grows.  Then the same between DRAM and the device.
 * Runs in the mover thread, never under a FUSE request.
 */
static int promote_pass(struct kvfs_cache *c)
{
	struct kvfs_pmove plan[64];
	struct kvfs_block *blk[64];
	size_t n;

	pthread_mutex_lock(&c->policy_lock);
	kvfs_cache_drain_touches(c);
	n = kvfs_policy_promote(c->policy, KVFS_TIER_SSD, KVFS_TIER_DRAM, plan,
				64);
	for (size_t i = 0; i < n; i++) {
		blk[i] = kvfs_pn_block(plan[i].node);
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
			if (kvfs_dram_may_drop(&b->pn, NULL) &&
			    kvfs_dram_demote_locked(c, b, &discard) == 0)
				atomic_fetch_add(&c->st_demoted, 1);
			pthread_mutex_unlock(&c->policy_lock);
			if (discard)
				kvfs_dram_discard(c, b);
		} else if (plan[i].op == KVFS_PMOVE_UP &&
			   !atomic_load(&b->dram_ptr)) {
			if (kvfs_promote_load(c, b) == 0)
				atomic_fetch_add(&c->st_promoted, 1);
		}
	}
	for (size_t i = 0; i < n; i++)
		kvfs_cache_put(c, blk[i]);
	promote_gpu(c);
	return 0;
}

int kvfs_promote_init(struct kvfs_cache *c)
{
	return kvfs_task_add(c, "promotion", promote_pass);
}
