// SPDX-License-Identifier: MIT
/*
 * belady: the offline optimum (Belady's MIN), for the simulator only.
 *
 * The caller writes pnode->next_use (the sequence number of the next
 * request that touches the block, UINT64_MAX for never) before it calls
 * access or insert for the block.  The victim is the resident block used
 * farthest in the future; among equal next uses the deepest goes first.
 * Because a request touches its whole path, a parent is never used later
 * than its child, so the resident set stays prefix-closed and MIN's
 * optimality for demand paging carries over to the prefix hit count
 * (tests/unit/test_policy_belady.c checks it against exhaustive search).
 *
 * One binary max-heap per tier; plink.idx is the slot.  The heap keeps its
 * own copy of each key: the caller rewrites next_use of a whole path before
 * it calls access, and sifting one node against others whose live keys
 * already changed would corrupt the order.
 *
 * Blocks the caller's filter refuses (the simulator pins the request in
 * flight, whose never-reused blocks sit at the top of the heap) are parked
 * outside the heap until the caller's request number changes, so each is
 * looked at once per request rather than once per eviction.  This assumes
 * what the simulator guarantees: a block's ok() answer does not change
 * while the request number stays the same.  If only parked blocks remain,
 * they are scanned, so a victim is still found when one exists.
 */
#include <errno.h>
#include <stdlib.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"

enum { BEL_HEAP = 0, BEL_PARKED = 1 };

struct bel_ent {
	struct kvfs_pnode *node;
	uint64_t next_use; /* key as of the last insert/access */
	uint32_t depth;
};

struct bel_arr {
	struct bel_ent *a;
	size_t n, cap;
};

struct bel_priv {
	struct bel_arr h[KVFS_NTIERS];    /* heaps */
	struct bel_arr park[KVFS_NTIERS]; /* filtered in this request */
	size_t nparked;
	uint64_t req;                     /* request of the parking */
};

/* True when @x should be evicted before @y. */
static inline bool bel_before(const struct bel_ent *x, const struct bel_ent *y)
{
	if (x->next_use != y->next_use)
		return x->next_use > y->next_use;
	return x->depth > y->depth;
}

static void bel_set(struct bel_arr *h, size_t i, const struct bel_ent *x,
		    int tier)
{
	h->a[i] = *x;
	x->node->t[tier].idx = (uint32_t)i;
}

static size_t bel_up(struct bel_arr *h, size_t i, int tier)
{
	struct bel_ent x = h->a[i];

	while (i > 0) {
		size_t up = (i - 1) / 2;

		if (!bel_before(&x, &h->a[up]))
			break;
		bel_set(h, i, &h->a[up], tier);
		i = up;
	}
	bel_set(h, i, &x, tier);
	return i;
}

static void bel_down(struct bel_arr *h, size_t i, int tier)
{
	struct bel_ent x = h->a[i];

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && bel_before(&h->a[c + 1], &h->a[c]))
			c++;
		if (!bel_before(&h->a[c], &x))
			break;
		bel_set(h, i, &h->a[c], tier);
		i = c;
	}
	bel_set(h, i, &x, tier);
}

static void bel_fix(struct bel_arr *h, size_t i, int tier)
{
	bel_down(h, bel_up(h, i, tier), tier);
}

/* Append to an array (slot recorded in plink.idx). false: out of memory. */
static bool bel_push(struct bel_arr *h, const struct bel_ent *e, int tier)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 64;
		struct bel_ent *na = realloc(h->a, cap * sizeof(*na));

		if (!na)
			return false;
		h->a = na;
		h->cap = cap;
	}
	bel_set(h, h->n++, e, tier);
	return true;
}

/* Take slot @i out of @h; @heap: restore the heap order. */
static void bel_cut(struct bel_arr *h, size_t i, int tier, bool heap)
{
	h->n--;
	if (i == h->n)
		return;
	bel_set(h, i, &h->a[h->n], tier);
	if (heap)
		bel_fix(h, i, tier);
}

static void bel_heap_add(struct bel_priv *b, int tier,
			 const struct bel_ent *e)
{
	struct bel_arr *h = &b->h[tier];

	e->node->t[tier].list = BEL_HEAP;
	if (!bel_push(h, e, tier)) {
		/* Untracked: never a victim, still counted as used. */
		kvfs_err("belady: out of memory tracking a block");
		e->node->t[tier].idx = UINT32_MAX;
		return;
	}
	bel_up(h, h->n - 1, tier);
}

static void bel_unpark(struct bel_priv *b)
{
	for (int t = 0; t < KVFS_NTIERS; t++) {
		struct bel_arr *pk = &b->park[t];

		for (size_t i = 0; i < pk->n; i++)
			bel_heap_add(b, t, &pk->a[i]);
		pk->n = 0;
	}
	b->nparked = 0;
}

/* A new request number: its pins are not the parked ones. */
static void bel_context(struct bel_priv *b, const struct kvfs_paccess *a)
{
	uint64_t req = a ? a->request : UINT64_MAX;

	if (b->nparked && (!a || req != b->req))
		bel_unpark(b);
	b->req = req;
}

static void bel_release(struct kvfs_policy *p)
{
	struct bel_priv *b = p->priv;

	for (int t = 0; t < KVFS_NTIERS; t++) {
		free(b->h[t].a);
		free(b->park[t].a);
	}
}

static void bel_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		       const struct kvfs_paccess *a)
{
	struct bel_priv *b = p->priv;
	struct bel_ent e = { n, n->next_use, n->depth };

	bel_context(b, a);
	bel_heap_add(b, tier, &e);
}

/* Whether @x has a slot in tier @t (heap or parked), and which array. */
static bool bel_tracked(struct bel_priv *b, struct kvfs_pnode *x, int t,
			struct bel_arr **arr)
{
	uint32_t idx = x->t[t].idx;

	*arr = x->t[t].list == BEL_PARKED ? &b->park[t] : &b->h[t];
	return idx < (*arr)->n && (*arr)->a[idx].node == x;
}

static void bel_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		       size_t n, const struct kvfs_paccess *a)
{
	struct bel_priv *b = p->priv;

	bel_context(b, a);
	for (size_t i = 0; i < n; i++) {
		struct kvfs_pnode *x = path[i];

		for (int t = 0; t < KVFS_NTIERS; t++) {
			struct bel_arr *arr;

			if (!(x->tiers & (1u << t)) ||
			    !bel_tracked(b, x, t, &arr))
				continue;
			arr->a[x->t[t].idx].next_use = x->next_use;
			if (arr == &b->h[t])
				bel_fix(arr, x->t[t].idx, t);
		}
	}
}

static void bel_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct bel_priv *b = p->priv;
	struct bel_arr *arr;

	if (bel_tracked(b, n, tier, &arr)) {
		bool parked = arr == &b->park[tier];

		bel_cut(arr, n->t[tier].idx, tier, !parked);
		if (parked)
			b->nparked--;
	}
	n->t[tier].idx = UINT32_MAX;
}

static struct kvfs_pnode *bel_victim(struct kvfs_policy *p, int tier,
				     kvfs_policy_ok_fn ok, void *arg)
{
	struct bel_priv *b = p->priv;
	struct bel_arr *h = &b->h[tier], *pk = &b->park[tier];
	struct bel_ent *best = NULL;

	while (h->n) {
		struct bel_ent top = h->a[0];

		if (ok(top.node, arg))
			return top.node;
		if (!bel_push(pk, &top, tier))
			break; /* out of memory: scan below */
		bel_cut(h, 0, tier, true);
		top.node->t[tier].list = BEL_PARKED;
		top.node->t[tier].idx = (uint32_t)(pk->n - 1);
		b->nparked++;
	}
	for (size_t i = 0; i < h->n; i++)
		if (ok(h->a[i].node, arg) &&
		    (!best || bel_before(&h->a[i], best)))
			best = &h->a[i];
	for (size_t i = 0; i < pk->n; i++)
		if (ok(pk->a[i].node, arg) &&
		    (!best || bel_before(&pk->a[i], best)))
			best = &pk->a[i];
	return best ? best->node : NULL;
}

const struct kvfs_policy_ops kvfs_policy_belady_ops = {
	.name = "belady",
	.priv_size = sizeof(struct bel_priv),
	.release = bel_release,
	.insert = bel_insert,
	.access = bel_access,
	.remove = bel_remove,
	.victim = bel_victim,
};
