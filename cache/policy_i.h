/* SPDX-License-Identifier: MIT */
/*
 * Folder-internal declarations of the cache policies: the ops tables the
 * registry lists (policy.c, above the policies), the helpers the policies
 * share (policy_util.c, below them), and test-only introspection.
 *
 * Locking: none of their own; every call runs under the caller's policy
 * lock (c->policy_lock in the engine), like every policy call.
 */
#ifndef KVFS_CACHE_POLICY_I_H
#define KVFS_CACHE_POLICY_I_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/policy.h"

/* Defined by each policy_<name>.c, listed by the registry (policy.c). */
extern const struct kvfs_policy_ops kvfs_policy_lru_ops;
extern const struct kvfs_policy_ops kvfs_policy_arc_ops;
extern const struct kvfs_policy_ops kvfs_policy_hotprefix_ops;
extern const struct kvfs_policy_ops kvfs_policy_wa_ops;
extern const struct kvfs_policy_ops kvfs_policy_belady_ops;
extern const struct kvfs_policy_ops kvfs_policy_plfu_ops;

/*
 * Recency stamps shared by lru and arc: the clock advances whenever the
 * caller's (request, now) pair changes, so every block touched or inserted
 * on behalf of one request shares a stamp (a == NULL: always advances).
 */
struct kvfs_pclock {
	uint64_t clock;
	uint64_t req, now;
	bool started;
};

/* policy_util.c */

/*
 * kvfs_pclock_stamp() - the stamp of access @a (NULL: a fresh one) on
 *   clock @c, advancing the clock when @a starts a new (request, now)
 *   pair.  Returns the stamp; never fails.
 */
uint64_t kvfs_pclock_stamp(struct kvfs_pclock *c,
			   const struct kvfs_paccess *a);

/*
 * A per-tier list of nodes sorted by (stamp ascending, depth descending):
 * the head is the next victim; among blocks of one stamp the deepest goes
 * first, so a chain loses its tail before its head.  Linked through
 * n->t[tier].prev/next; the stamp lives in n->t[tier].prio.  Placement is
 * O(1) for the usual patterns (root-first inserts and deepest-first
 * accesses of the newest stamp), O(distance from the tail) otherwise.
 */
struct kvfs_plist {
	struct kvfs_pnode *head, *tail;
	struct kvfs_pnode *seg; /* head-most node with the tail's stamp */
	uint64_t size;          /* sum of n->size of the members */
	uint64_t count;
};

/*
 * kvfs_plist_place() - link @n (on no list of @tier) into @l at its place
 *   for @stamp, which is recorded in n->t[tier].prio.  Never fails.
 * kvfs_plist_unlink() - take @n (on @l) off it.  Never fails.
 */
void kvfs_plist_place(struct kvfs_plist *l, struct kvfs_pnode *n, int tier,
		      uint64_t stamp);
void kvfs_plist_unlink(struct kvfs_plist *l, struct kvfs_pnode *n, int tier);

/* The stamp @n was placed with on @tier's list. */
static inline uint64_t kvfs_plist_stamp(const struct kvfs_pnode *n, int tier)
{
	return (uint64_t)n->t[tier].prio;
}

/* Sizes of one tier's ARC lists, in pnode->size units. */
struct kvfs_arc_state {
	uint64_t c;                  /* capacity of the tier */
	uint64_t t1, t2, b1, b2;     /* sum of sizes per list */
	uint64_t nt1, nt2, nb1, nb2; /* entries per list */
	double p;                    /* target size of T1 */
};

/* policy_arc.c */

/*
 * kvfs_policy_arc_state() - test-only: the list sizes of @tier's ARC.
 * @p must have been created with the "arc" ops. Returns 0, or -EINVAL
 * for another policy or a bad tier. Same locking as every policy call.
 */
int kvfs_policy_arc_state(struct kvfs_policy *p, int tier,
			  struct kvfs_arc_state *st);

#endif
