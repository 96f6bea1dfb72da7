/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <string.h>

#include "tier/tier.h"
#include "meta/util.h"
#include "meta/log.h"

static const char *const tier_names[KVFS_NTIERS] = {
	[KVFS_TIER_GPU] = "gpu",
	[KVFS_TIER_DRAM] = "dram",
	[KVFS_TIER_SSD] = "ssd",
};

void kvfs_tier_free(struct kvfs_tier *t)
{
	if (t)
		t->ops->release(t);
}

const char *kvfs_tier_name(int id)
{
	if (id == KVFS_TIER_REMOTE)
		return "remote";
	if (id < 0 || id >= KVFS_NTIERS)
		return "?";
	return tier_names[id];
}

int kvfs_tier_parse(const char *name)
{
	if (!name)
		return -EINVAL;
	for (int i = 0; i < KVFS_NTIERS; i++)
		if (!strcmp(name, tier_names[i]))
			return i;
	return -EINVAL;
}

int kvfs_tier_pool_init(struct kvfs_tier_pool *p, uint64_t base,
			uint64_t size, uint64_t align)
{
	int err = kvfs_extent_init(&p->map, base, size, align);

	if (err)
		return err;
	err = pthread_mutex_init(&p->lock, NULL);
	if (err) {
		kvfs_extent_release(&p->map);
		return -err;
	}
	return 0;
}

void kvfs_tier_pool_release(struct kvfs_tier_pool *p)
{
	kvfs_extent_release(&p->map);
	pthread_mutex_destroy(&p->lock);
}

int kvfs_tier_pool_alloc(struct kvfs_tier *t, struct kvfs_tier_pool *p,
			 const char *who, uint64_t len, struct kvfs_extent *e)
{
	uint64_t off;
	int err;

	if (!len) {
		kvfs_err("%s: allocation of 0 bytes", who);
		return -EINVAL;
	}
	if (len > t->capacity)
		return -ENOSPC;
	len = kvfs_util_align_up(len, p->map.align);
	pthread_mutex_lock(&p->lock);
	err = kvfs_extent_alloc(&p->map, len, &off);
	pthread_mutex_unlock(&p->lock);
	if (err)
		return err;
	atomic_fetch_add(&t->used, len);
	e->off = off;
	e->len = len;
	e->ptr = NULL;
	e->pool = 0;
	return 0;
}

void kvfs_tier_pool_free(struct kvfs_tier *t, struct kvfs_tier_pool *p,
			const struct kvfs_extent *e)
{
	int err;

	pthread_mutex_lock(&p->lock);
	err = kvfs_extent_free(&p->map, e->off, e->len);
	pthread_mutex_unlock(&p->lock);
	/* A bad or double free is logged by the map and changes nothing. */
	if (!err)
		atomic_fetch_sub(&t->used, e->len);
}

int kvfs_tier_pool_claim(struct kvfs_tier *t, struct kvfs_tier_pool *p,
			const struct kvfs_extent *e)
{
	int err;

	pthread_mutex_lock(&p->lock);
	err = kvfs_extent_claim(&p->map, e->off, e->len);
	pthread_mutex_unlock(&p->lock);
	if (!err)
		atomic_fetch_add(&t->used, e->len);
	return err;
}
