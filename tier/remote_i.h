/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's in-process store (backend = memory): the commands of
 * tier/redis_cluster.h against a map in this process, so the tier's unit
 * tests run without a server. Included only from tier/ (and white-box
 * tests).
 *
 * Locking: one mutex guards the map; every call is thread-safe.
 */
#ifndef KVFS_TIER_REMOTE_I_H
#define KVFS_TIER_REMOTE_I_H

#include <stddef.h>

#include "tier/redis_cluster.h"

struct kvfs_remote_mem;

/* An empty store. 0 or -ENOMEM. */
int kvfs_remote_mem_new(struct kvfs_remote_mem **out);
/* Free it and every value; NULL is a no-op. */
void kvfs_remote_mem_free(struct kvfs_remote_mem *m);
/*
 * kvfs_remote_mem_exec() - kvfs_rc_exec() on the map: the same results
 * per command (GET copies the value). While a fault is set with
 * kvfs_remote_mem_fault(), every command gets it instead. Returns 0 or
 * the first fault.
 */
int kvfs_remote_mem_exec(struct kvfs_remote_mem *m, struct kvfs_rc_cmd *cmd,
			 size_t n);
/* Make every later command fail with @err (-errno), or 0 to stop. */
void kvfs_remote_mem_fault(struct kvfs_remote_mem *m, int err);
/* Keys stored. */
size_t kvfs_remote_mem_count(struct kvfs_remote_mem *m);

struct kvfs_tier_remote;
/* The store of a backend = memory tier, NULL for another backend. */
struct kvfs_remote_mem *kvfs_tier_remote_mem(struct kvfs_tier_remote *r);

#endif
