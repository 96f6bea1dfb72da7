/* SPDX-License-Identifier: MIT */
/*
 * The engine's use of fleet sightings (docs/remote.md, "Fleet
 * sightings"): the instance of [fleet] opened and closed with the cache,
 * this host's references noted where the policy learns of them (the
 * drained accesses, block.c; new blocks, commit.c), and the other hosts'
 * handed to the policy.  The transport lives in tier/sight.c.
 *
 * Lock order: c->policy_lock, then the instance's buffer lock (a note);
 * a delivery takes c->policy_lock holding none of the instance's.
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

/* Other hosts referenced @keys. */
static void fleet_deliver(void *arg, const uint8_t (*keys)[KVFS_KEY_LEN],
			  size_t n)
{
	struct kvfs_cache *c = arg;

	for (size_t i = 0; i < n;) {
		size_t end = n - i > FLEET_KEYS_PER_LOCK ?
				     i + FLEET_KEYS_PER_LOCK :
				     n;

		pthread_mutex_lock(&c->policy_lock);
		for (; i < end; i++)
			kvfs_policy_sight(c->policy, keys[i]);
		pthread_mutex_unlock(&c->policy_lock);
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
