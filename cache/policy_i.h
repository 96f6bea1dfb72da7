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
extern const struct kvfs_policy_ops kvfs_policy_s3fifo_ops;
extern const struct kvfs_policy_ops kvfs_policy_sieve_ops;
extern const struct kvfs_policy_ops kvfs_policy_kvfs_ops;

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

/*
 * A count-min sketch of block sightings keyed by the block key (4 rows of
 * 16-bit counters, conservative update), halved every @sample additions
 * so old history fades (TinyLFU's reset).  Used by plfu and kvfs: it is
 * how a policy remembers blocks it no longer holds, in a fixed size.
 */
#define KVFS_PSKETCH_ROWS 4

struct kvfs_psketch {
	uint16_t *c;     /* KVFS_PSKETCH_ROWS x width */
	uint32_t width;  /* power of two */
	uint64_t sample; /* additions between halvings */
	uint64_t adds;   /* since the last halving */
	uint64_t halvings;
};

/*
 * kvfs_psketch_init() - allocate @s with @width counters per row (a power
 *   of two, >= 64) halving every @sample (>= 1) additions.  0 or -ENOMEM.
 * kvfs_psketch_release() - free what init allocated; idempotent.
 * kvfs_psketch_get() - the estimate of @key's count (never below it,
 *   between halvings).
 * kvfs_psketch_add() - count one sighting of @key.  Returns true when this
 *   addition triggered a halving (callers with cached estimates refresh).
 */
int kvfs_psketch_init(struct kvfs_psketch *s, uint32_t width, uint64_t sample);
void kvfs_psketch_release(struct kvfs_psketch *s);
uint32_t kvfs_psketch_get(const struct kvfs_psketch *s, const uint8_t key[16]);
bool kvfs_psketch_add(struct kvfs_psketch *s, const uint8_t key[16]);

/*
 * A history table: one 48-bit word per block key that a policy wants to
 * keep about a block it let go, in a fixed size.  A node may be freed once
 * the block left every tier (the daemon deletes the block), so what a
 * policy learnt about a block and wants back when the same prefix is
 * written again lives here, keyed by the key, not in the node.
 * Buckets of 4 slots, each a 16-bit tag and the word: a bucket keeps the
 * 4 keys put into it last, so the table holds about the last @slots keys
 * put; a key whose bucket and tag both collide with another's reads the
 * other's word (about once per 16,384 lookups of a full table).
 */
struct kvfs_phist {
	uint64_t *slot; /* tag << 48 | word, newest first per bucket; 0 = empty */
	uint32_t mask;  /* buckets - 1 */
};

/*
 * kvfs_phist_init() - allocate @h with @slots slots (a power of two,
 *   >= 64).  0 or -ENOMEM.
 * kvfs_phist_release() - free what init allocated; idempotent.
 * kvfs_phist_put() - remember @word (its low 48 bits; 0 forgets) for @key,
 *   replacing what @key had; the oldest key of a full bucket is dropped.
 * kvfs_phist_take() - the word remembered for @key, and forget it; 0 when
 *   none.
 * kvfs_phist_prefetch() - start loading @key's bucket, for a take or put
 *   soon after (the table is larger than a core's caches).
 * Not locked: the policy's caller serializes them (kvfs_policy_* rules).
 */
int kvfs_phist_init(struct kvfs_phist *h, uint32_t slots);
void kvfs_phist_release(struct kvfs_phist *h);
void kvfs_phist_put(struct kvfs_phist *h, const uint8_t key[16], uint64_t word);
uint64_t kvfs_phist_take(struct kvfs_phist *h, const uint8_t key[16]);
void kvfs_phist_prefetch(const struct kvfs_phist *h, const uint8_t key[16]);

/*
 * kvfs_plist_first() - the first node from the head of @l (tier @tier)
 *   that passes @ok and, when @leaf, is a leaf of the tier; at most @max
 *   nodes are looked at (0 = no bound).  NULL when none.
 */
struct kvfs_pnode *kvfs_plist_first(const struct kvfs_plist *l, int tier,
				    kvfs_policy_ok_fn ok, void *arg,
				    bool leaf, size_t max);

/*
 * A ghost queue: the keys of blocks a policy let go, oldest first, kept
 * while the sum of their sizes is at most @cap (S3-FIFO's G).  Keys are
 * 64-bit digests of the block key; a membership table finds them in O(1).
 * Adding a key already present refreshes it (it becomes the newest).
 */
struct kvfs_pghost {
	struct kvfs_pghost_ent {
		uint64_t fp;
		uint64_t size;
		uint64_t seq;
	} *ring;                 /* FIFO, @head.. (mod @rcap) */
	size_t rcap, head, n;    /* ring capacity (power of two), first, count */
	uint64_t *tfp, *tseq;    /* membership: fp (0 = empty) -> newest seq */
	size_t tcap, tn;         /* table slots (power of two), used */
	uint64_t seq;            /* next sequence number */
	uint64_t size;           /* sum of sizes of live entries */
	uint64_t cap;
};

/*
 * kvfs_pghost_init() - an empty ghost bounded by @cap size units.  0 or
 *   -ENOMEM.  kvfs_pghost_release() frees it (idempotent).
 * kvfs_pghost_add() - remember @key (of @size); trims the oldest entries
 *   beyond @cap.  Returns 0 or -ENOMEM (then the key is not remembered).
 * kvfs_pghost_take() - true when @key is remembered; it is forgotten.
 * kvfs_pghost_trim() - make @cap the bound and drop the oldest entries
 *   beyond it (ARC's ghost lists, whose bounds move with the lists they
 *   shadow).  Never fails.
 */
int kvfs_pghost_init(struct kvfs_pghost *g, uint64_t cap);
void kvfs_pghost_release(struct kvfs_pghost *g);
int kvfs_pghost_add(struct kvfs_pghost *g, const uint8_t key[16],
		    uint64_t size);
bool kvfs_pghost_take(struct kvfs_pghost *g, const uint8_t key[16]);
void kvfs_pghost_trim(struct kvfs_pghost *g, uint64_t cap);

/* policy_mini.c */

/*
 * A miniature simulation (Waldspurger et al., USENIX ATC '17): a shadow
 * one-tier cache run by a policy's ops over the references a real policy
 * sees to a hash-sampled 1/2^@shift of the key space, with 1/2^@shift of
 * its capacity.  A chain below depth @depth is sampled by its ancestor at
 * that depth, so a sampled prefix chain keeps its tree in the shadow.
 * Writes hist[0] of the real nodes it samples (the sampling hash), so the
 * real policy must leave that word alone.  Same locking as every policy
 * call: under the real policy's lock.
 */
struct kvfs_pmini {
	struct kvfs_policy p;       /* the shadow policy, tier 0 only */
	struct mini_node **tab;     /* resident nodes by key (open addressing) */
	size_t tcap, tn;            /* slots (power of two), used */
	struct mini_node **stk;     /* scratch for discards */
	struct mini_node *free;     /* recycled nodes, through ->next */
	size_t stkcap;
	struct kvfs_pclock clock;   /* one stamp per request: the pin */
	uint32_t shift, depth;
	uint64_t refs, hits;        /* references seen, of them hits */
	bool ready;
};

/*
 * kvfs_pmini_init() - a shadow of @cap units run by @ops with the @n
 *   options @keys = @vals, sampling 1/2^@shift of chains split at @depth.
 *   0, -ENOMEM, or the policy's set()/init() error.
 * kvfs_pmini_release() - free it (idempotent after init).
 * kvfs_pmini_sampled() - whether real node @n is in @m's sample (caches
 *   the sampling hash in n->hist[0]).
 * kvfs_pmini_ref() - a reference to real node @n (sampled), root-most
 *   first within a request: a hit counts in @m->hits and is an access; a
 *   miss is cached (making room through the shadow policy's victims,
 *   each with its resident descendants) unless its sampled parent is not
 *   resident.  Out of memory: the reference is dropped.
 */
int kvfs_pmini_init(struct kvfs_pmini *m, const struct kvfs_policy_ops *ops,
		    const char *const *keys, const char *const *vals, size_t n,
		    uint64_t cap, uint32_t shift, uint32_t depth);
void kvfs_pmini_release(struct kvfs_pmini *m);
bool kvfs_pmini_sampled(const struct kvfs_pmini *m, struct kvfs_pnode *n);
void kvfs_pmini_ref(struct kvfs_pmini *m, struct kvfs_pnode *n,
		    const struct kvfs_paccess *a);

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
