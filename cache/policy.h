/* SPDX-License-Identifier: MIT */
/*
 * Cache policy interface: one implementation of each policy, driven by the
 * daemon's tier mover and by the trace simulator (kvfs-sim) alike.
 *
 * The caller embeds a struct kvfs_pnode in each of its blocks and tells the
 * policy what happens to it: inserted in a tier, accessed, removed from a
 * tier, forgotten.  The policy answers the questions every move needs: the
 * victim of a tier, whether a block leaving a tier is admitted into the next
 * one down, and which blocks to promote.
 *
 * The policy performs no I/O and never frees a node.  It knows the prefix
 * tree through pnode->parent and the per-tier resident-children counts that
 * the kvfs_policy_*() wrappers keep.
 *
 * Locking: a struct kvfs_policy is not thread-safe. The caller serialises
 * every call on one policy with its own lock (the daemon's policy lock).
 * Nodes are only read and written under that lock, except the fields marked
 * "caller" which belong to the caller's locking.
 */
#ifndef KVFS_CACHE_POLICY_H
#define KVFS_CACHE_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "tier/tier.h"


/* Per-tier policy links of a node (policy-private). */
struct kvfs_plink {
	struct kvfs_pnode *prev, *next;
	uint32_t idx;  /* heap index or queue number */
	uint8_t list;  /* which list (e.g. ARC T1/T2) */
	uint8_t in;    /* nonzero while the node is resident in this tier */
	uint16_t pad;
	double prio;   /* cached priority */
};

struct kvfs_pnode {
	uint8_t key[16];            /* caller: block key (ghost lists use it) */
	struct kvfs_pnode *parent;  /* caller: NULL for a root child or orphan */
	uint32_t depth;             /* caller: 0 for a root child */
	uint32_t tokens;            /* caller: tokens held by the block */
	uint64_t size;              /* caller: capacity units (bytes, blocks) */
	uint16_t category;          /* caller: workload category, 0 = unknown */
	uint16_t turn;              /* caller: conversation turn, 0 = unknown */
	uint8_t tiers;              /* wrappers: bit t set while in tier t */
	uint8_t pad[3];
	uint32_t children[KVFS_NTIERS]; /* wrappers: children resident per tier */
	uint64_t next_use;          /* caller (simulator): next access time, for
				     * belady; UINT64_MAX = never */
	uint64_t hist[2];           /* policy-private per-block words */
	struct kvfs_plink t[KVFS_NTIERS];
};

/* One step of a promotion plan, executed in array order. */
enum kvfs_pmove_op {
	KVFS_PMOVE_DOWN = 1, /* evict @node from the upper tier (via admit) */
	KVFS_PMOVE_UP = 2,   /* copy @node from the lower tier up */
};

struct kvfs_pmove {
	struct kvfs_pnode *node;
	int op;
};

/* Access context: what the caller knows about the request. */
struct kvfs_paccess {
	uint64_t now;     /* caller's clock: ns in the daemon, ms in traces */
	uint64_t request; /* request sequence number */
	bool hit;         /* the path was found resident */
};

/* Victim filter: false for blocks that must not move now (pinned,
 * leased, being read, not yet persisted...).
 */
typedef bool (*kvfs_policy_ok_fn)(struct kvfs_pnode *n, void *arg);

struct kvfs_policy;

struct kvfs_policy_ops {
	const char *name;
	size_t priv_size; /* bytes of private state at kvfs_policy.priv */
	/* Set one "key = value" option before init. 0 or -EINVAL (unknown key
	 * or bad value, logged).
	 */
	int (*set)(struct kvfs_policy *p, const char *key, const char *val);
	int (*init)(struct kvfs_policy *p);
	void (*release)(struct kvfs_policy *p);
	void (*insert)(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		       const struct kvfs_paccess *a);
	/* @path is root-most first; each node may be resident in any tiers. */
	void (*access)(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		       size_t n, const struct kvfs_paccess *a);
	void (*remove)(struct kvfs_policy *p, int tier, struct kvfs_pnode *n);
	/* The node is gone from every tier (deleted or discarded). */
	void (*forget)(struct kvfs_policy *p, struct kvfs_pnode *n);
	struct kvfs_pnode *(*victim)(struct kvfs_policy *p, int tier,
				     kvfs_policy_ok_fn ok, void *arg);
	bool (*admit)(struct kvfs_policy *p, int from, int to,
		      struct kvfs_pnode *n);
	size_t (*promote)(struct kvfs_policy *p, int lower, int upper,
			  struct kvfs_pmove *plan, size_t max);
	/* Periodic work: aging, refits. */
	void (*tick)(struct kvfs_policy *p, const struct kvfs_paccess *a);
	/* Another host of the fleet referenced the block of key @key; @n
	 * is this cache's node of it while a tier holds it, else NULL.
	 */
	void (*sight)(struct kvfs_policy *p, const uint8_t key[16],
		      struct kvfs_pnode *n);
};

struct kvfs_policy {
	const struct kvfs_policy_ops *ops;
	uint64_t capacity[KVFS_NTIERS]; /* units; 0 = tier absent */
	uint64_t used[KVFS_NTIERS];     /* kept by the wrappers */
	uint64_t count[KVFS_NTIERS];    /* resident nodes, kept by wrappers */
	void *priv;
};

/* The policies this build knows, NULL-terminated. */
extern const struct kvfs_policy_ops *const kvfs_policy_registry[];

/*
 * kvfs_policy_new() - create a policy by name.
 * @name:    "lru", "arc", "hotprefix", "wa", "belady", ...
 * @keys, @vals, @n: options passed to ops->set before init.
 * @cap:     capacity per tier in units (0 = tier absent).
 * Returns 0, -ENOENT for an unknown name, -EINVAL for a bad option,
 * -ENOMEM. Logs the reason.
 */
int kvfs_policy_new(const char *name, const char *const *keys,
		    const char *const *vals, size_t n,
		    const uint64_t cap[KVFS_NTIERS], struct kvfs_policy **out);
/* Release and free; NULL is a no-op. */
void kvfs_policy_free(struct kvfs_policy *p);

/* Wrappers: keep tiers/children/used/count, then call the policy. A node
 * already in @tier is not inserted twice (the call is an access then).
 */
void kvfs_policy_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
			const struct kvfs_paccess *a);
void kvfs_policy_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
			size_t n, const struct kvfs_paccess *a);
void kvfs_policy_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n);
void kvfs_policy_forget(struct kvfs_policy *p, struct kvfs_pnode *n);
/* NULL when no resident node passes @ok. */
struct kvfs_pnode *kvfs_policy_victim(struct kvfs_policy *p, int tier,
				      kvfs_policy_ok_fn ok, void *arg);
/* Whether @n leaving @from may enter @to (to == KVFS_NTIERS: never). */
bool kvfs_policy_admit(struct kvfs_policy *p, int from, int to,
		       struct kvfs_pnode *n);
size_t kvfs_policy_promote(struct kvfs_policy *p, int lower, int upper,
			   struct kvfs_pmove *plan, size_t max);
void kvfs_policy_tick(struct kvfs_policy *p, const struct kvfs_paccess *a);
/*
 * kvfs_policy_sight() - another host of the fleet referenced the block of
 * key @key, which this cache may never have held.  @n is this cache's
 * node of the block when a tier of it holds the block (n->tiers != 0),
 * else NULL: a policy may then count the reference toward the block's
 * place, as the fleet's demand for it.  A policy without ->sight ignores
 * the call.  Never fails; the caller's lock as for every call.
 */
void kvfs_policy_sight(struct kvfs_policy *p, const uint8_t key[16],
		       struct kvfs_pnode *n);
/* True when @n is resident in @tier and no child of it is. */
bool kvfs_policy_is_leaf(const struct kvfs_pnode *n, int tier);

#endif
