/* SPDX-License-Identifier: MIT */
/*
 * The engine's use of fleet sightings (docs/remote.md, "Fleet
 * sightings"): the instance of [fleet] opened and closed with the cache,
 * this host's references noted where the policy learns of them (the
 * drained accesses, block.c; new blocks, commit.c), and the other hosts'
 * handed to the policy.  The transport lives in tier/sight.c.
 *
 * Lock order: c->policy_lock, then the instance's buffer lock (a note);
 * a delivery looks its keys up in the index (a shard lock each), then
 * takes c->policy_lock, holding none of the instance's.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"

/* Keys handed to the policy per hold of its lock: a message holds up to
 * 4,096, some 50 ns each, and commits wait on the same lock.
 */
#define FLEET_KEYS_PER_LOCK 256

/* Other hosts referenced @keys.  The blocks this host holds are looked up
 * first, outside the policy's lock, so the policy can count the fleet's
 * reference toward their place; the references taken are dropped after
 * it, since a last one may free a block.
 */
static void fleet_deliver(void *arg, const uint8_t (*keys)[KVFS_KEY_LEN],
			  size_t n)
{
	struct kvfs_block *held[FLEET_KEYS_PER_LOCK];
	struct kvfs_cache *c = arg;

	for (size_t i = 0; i < n;) {
		size_t k = n - i > FLEET_KEYS_PER_LOCK ? FLEET_KEYS_PER_LOCK :
							  n - i;

		for (size_t j = 0; j < k; j++)
			held[j] = kvfs_index_find_key(c, keys[i + j]);
		pthread_mutex_lock(&c->policy_lock);
		for (size_t j = 0; j < k; j++) {
			struct kvfs_block *b = held[j];
			bool live = b && !(atomic_load(&b->flags) &
					   KVFS_B_DELETED);

			kvfs_policy_sight(c->policy, keys[i + j],
					  live ? &b->pn : NULL);
		}
		pthread_mutex_unlock(&c->policy_lock);
		for (size_t j = 0; j < k; j++)
			if (held[j])
				kvfs_cache_put(c, held[j]);
		i += k;
	}
}

int kvfs_fleet_init(struct kvfs_cache *c)
{
	const struct kvfs_sight_conf *fc = &c->conf.fleet;
	struct kvfs_sight *s;
	int ret;

	if (fc->backend == KVFS_SIGHT_NONE)
		return 0;
	ret = kvfs_sight_new(fc, fleet_deliver, c, &s);
	if (ret) {
		kvfs_err("fleet sightings (%s): cannot start: %s",
			 fc->backend == KVFS_SIGHT_MEMORY ? "memory" :
							    fc->nodes,
			 strerror(-ret));
		return ret;
	}
	pthread_mutex_lock(&c->policy_lock);
	c->sight = s;
	pthread_mutex_unlock(&c->policy_lock);
	kvfs_info("fleet sightings: %s, channel %s:sightings, every %u ms, "
		  "buffer %u keys, host %016llx; policy %s %s them",
		  fc->backend == KVFS_SIGHT_MEMORY ? "memory" : fc->nodes,
		  fc->channel, fc->interval_ms, fc->buffer,
		  (unsigned long long)kvfs_sight_host(s), c->policy->ops->name,
		  c->policy->ops->sight ? "counts" : "ignores");
	return 0;
}

void kvfs_fleet_fini(struct kvfs_cache *c)
{
	struct kvfs_sight *s;

	pthread_mutex_lock(&c->policy_lock);
	s = c->sight;
	c->sight = NULL;
	pthread_mutex_unlock(&c->policy_lock);
	/* Outside the lock: freeing joins a subscriber that may be waiting
	 * for it in fleet_deliver().
	 */
	kvfs_sight_free(s);
}
