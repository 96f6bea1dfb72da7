/* SPDX-License-Identifier: MIT */
/*
 * Making room in a tier: the one loop that takes an extent, and while the
 * tier is full asks the policy for a victim and has the tier's owner evict
 * it (demote or discard), for DRAM, the SSD and the device pool alike.
 * What differs per tier is in its struct kvfs_reserve_ops.
 */
#include <errno.h>

#include "cache/cache_i.h"

int kvfs_reserve(struct kvfs_cache *c, const struct kvfs_reserve_ops *ops,
		 uint64_t len, struct kvfs_extent *e, void *arg)
{
	struct kvfs_tier *t = c->tier[ops->tier];
	struct kvfs_pnode *v;
	struct kvfs_block *b;
	bool after;
	int rc;

	if (ops->fit_check && len > t->capacity)
		return -ENOSPC;
	for (;;) {
		rc = ops->alloc ? ops->alloc(c, len, e, arg) :
				  t->ops->alloc(t, len, e);
		if (rc != -ENOSPC)
			return rc;
		after = !ops->evict_locked;
		pthread_mutex_lock(&c->policy_lock);
		kvfs_cache_drain_touches(c);
		v = kvfs_policy_victim(c->policy, ops->tier, ops->may_evict,
				       arg);
		b = v ? kvfs_pn_block(v) : NULL;
		if (b) {
			kvfs_block_get_ref(b);
			if (ops->evict_locked)
				rc = ops->evict_locked(c, b, &after);
		}
		pthread_mutex_unlock(&c->policy_lock);
		if (!b) {
			rc = ops->no_victim(c);
			if (rc)
				return rc;
			continue;
		}
		if (after && ops->evict)
			rc = ops->evict(c, b);
		kvfs_cache_put(c, b);
		/* Gone or busy since the policy picked it: look again. */
		if (rc && rc != -ENOENT && rc != -EBUSY)
			return rc;
	}
}
