/* SPDX-License-Identifier: MIT */
/*
 * The pools of a device tier, one per owner uid (gpu/gpu.h), and the
 * allocator both backends run over them. The capacity is one budget
 * shared by every pool (t->used), taken before a hole in the owner's own
 * map, so owners compete for it as they did for the one pool; only where
 * a block may lie, and which memory a client is handed, differ per owner.
 * At the bottom of gpu/: it calls nothing else there.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "gpu/gpu_i.h"
#include "meta/log.h"
#include "meta/util.h"

static struct kvfs_gpu_pools *pools_of(struct kvfs_tier *t)
{
	return ((struct kvfs_gpu_tier *)t)->pools;
}

int kvfs_gpu_owners_check(const struct kvfs_gpu_owners *o, const char *who)
{
	if (!o || !o->uid || !o->n || o->n > KVFS_GPU_OWNERS_MAX) {
		kvfs_err("%s: want 1 to %d pool owners, not %zu", who,
			 KVFS_GPU_OWNERS_MAX, o && o->uid ? o->n : 0);
		return -EINVAL;
	}
	for (size_t i = 0; i < o->n; i++)
		for (size_t j = 0; j < i; j++)
			if (o->uid[i] == o->uid[j]) {
				kvfs_err("%s: uid %" PRIu32 " named twice as a "
					 "pool owner",
					 who, o->uid[i]);
				return -EINVAL;
			}
	return 0;
}

struct kvfs_gpu_pool *kvfs_gpu_pool_find(struct kvfs_tier *t, uint32_t owner)
{
	struct kvfs_gpu_pools *ps = pools_of(t);

	for (size_t i = 0; i < ps->n; i++)
		if (ps->p[i].owner == owner)
			return &ps->p[i];
	return NULL;
}

int kvfs_gpu_pool_init(struct kvfs_gpu_pool *p, uint32_t owner, uint64_t size)
{
	int err = kvfs_tier_pool_init(&p->map, 0, size, KVFS_GPU_ALIGN);

	if (err)
		return err;
	p->owner = owner;
	p->size = size;
	p->map_live = true;
	return 0;
}

void kvfs_gpu_pools_release(struct kvfs_gpu_pools *ps)
{
	for (size_t i = 0; i < KVFS_GPU_OWNERS_MAX; i++)
		if (ps->p[i].map_live) {
			kvfs_tier_pool_release(&ps->p[i].map);
			ps->p[i].map_live = false;
		}
}

int kvfs_gpu_pool_alloc(struct kvfs_tier *t, uint32_t owner, uint64_t len,
			struct kvfs_extent *e, const char *who)
{
	struct kvfs_gpu_pool *p = kvfs_gpu_pool_find(t, owner);
	uint64_t off;
	int err;

	if (!len) {
		kvfs_err("%s: allocation of 0 bytes", who);
		return -EINVAL;
	}
	if (!p) {
		kvfs_err("%s: uid %" PRIu32 " has no pool", who, owner);
		return -ENOENT;
	}
	if (len > p->size)
		return -ENOSPC;
	len = kvfs_util_align_up(len, KVFS_GPU_ALIGN);
	err = kvfs_tier_reserve(t, len);
	if (err)
		return err;
	pthread_mutex_lock(&p->map.lock);
	err = kvfs_extent_alloc(&p->map.map, len, &off);
	pthread_mutex_unlock(&p->map.lock);
	if (err) {
		atomic_fetch_sub(&t->used, len);
		return err;
	}
	e->off = off;
	e->len = len;
	e->ptr = NULL;
	e->pool = (uint32_t)(p - pools_of(t)->p);
	return 0;
}

void kvfs_gpu_pool_free(struct kvfs_tier *t, const struct kvfs_extent *e,
			void (*freed)(struct kvfs_gpu_pool *p,
				      const struct kvfs_extent *e))
{
	struct kvfs_gpu_pool *p = kvfs_gpu_pool_of(t, e);
	int err;

	if (!p) {
		kvfs_err("gpu: free of an extent of pool %" PRIu32 ", which "
			 "does not exist",
			 e->pool);
		return;
	}
	pthread_mutex_lock(&p->map.lock);
	err = kvfs_extent_free(&p->map.map, e->off, e->len);
	if (!err && freed)
		freed(p, e);
	pthread_mutex_unlock(&p->map.lock);
	/* A bad or double free is logged by the map and changes nothing. */
	if (!err)
		atomic_fetch_sub(&t->used, e->len);
}

int kvfs_gpu_pool_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	struct kvfs_gpu_pool *p = kvfs_gpu_pool_of(t, e);
	int err;

	if (!p)
		return -EINVAL;
	if (kvfs_tier_reserve(t, e->len))
		return -ENOSPC;
	pthread_mutex_lock(&p->map.lock);
	err = kvfs_extent_claim(&p->map.map, e->off, e->len);
	pthread_mutex_unlock(&p->map.lock);
	if (err)
		atomic_fetch_sub(&t->used, e->len);
	return err;
}

int kvfs_gpu_pool_describe(struct kvfs_tier *t, uint32_t owner,
			   struct kvfs_ctl_mem *out)
{
	struct kvfs_gpu_pool *p = kvfs_gpu_pool_find(t, owner);

	memset(out, 0, sizeof(*out));
	if (!p) {
		kvfs_err("gpu: uid %" PRIu32 " has no pool to describe", owner);
		return -ENOENT;
	}
	*out = p->desc;
	return 0;
}
