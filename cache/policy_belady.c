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
 * optimality for demand paging carries over to the prefix hit count.
 *
 * One binary max-heap per tier; plink.idx is the heap slot.  The heap keeps
 * its own copy of each key: the caller rewrites next_use of a whole path
 * before it calls access, and sifting one node against others whose live
 * keys already changed would corrupt the order.
 */
#include <errno.h>
#include <stdlib.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"

struct bel_ent {
	struct kvfs_pnode *node;
	uint64_t next_use; /* key as of the last insert/access */
	uint32_t depth;
};

struct bel_heap {
	struct bel_ent *a;
	size_t n, cap;
};

struct bel_priv {
	struct bel_heap h[KVFS_NTIERS];
	size_t *cand; /* victim(): best-first walk of a heap */
	size_t nc, capc;
};

/* True when @x should be evicted before @y. */
static inline bool bel_before(const struct bel_ent *x, const struct bel_ent *y)
{
	if (x->next_use != y->next_use)
		return x->next_use > y->next_use;
	return x->depth > y->depth;
}

static void bel_set(struct bel_heap *h, size_t i, const struct bel_ent *x,
		    int tier)
{
	h->a[i] = *x;
	x->node->t[tier].idx = (uint32_t)i;
}

static size_t bel_up(struct bel_heap *h, size_t i, int tier)
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

static void bel_down(struct bel_heap *h, size_t i, int tier)
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

static void bel_fix(struct bel_heap *h, size_t i, int tier)
{
	bel_down(h, bel_up(h, i, tier), tier);
}

static int bel_init(struct kvfs_policy *p)
{
	return 0;
}

static void bel_release(struct kvfs_policy *p)
{
	struct bel_priv *b = p->priv;

	for (int t = 0; t < KVFS_NTIERS; t++)
		free(b->h[t].a);
	free(b->cand);
}

static void bel_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		       const struct kvfs_paccess *a)
{
	struct bel_priv *b = p->priv;
	struct bel_heap *h = &b->h[tier];

	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 64;
		struct bel_ent *na = realloc(h->a, cap * sizeof(*na));

		if (!na) {
			/* Untracked: never a victim, still counted as used.
			 * Logged because capacity accounting now drifts.
			 */
			kvfs_err("belady: out of memory tracking a block");
			n->t[tier].idx = UINT32_MAX;
			return;
		}
		h->a = na;
		h->cap = cap;
	}
	h->a[h->n] = (struct bel_ent){ n, n->next_use, n->depth };
	n->t[tier].idx = (uint32_t)h->n;
	h->n++;
	bel_up(h, h->n - 1, tier);
}

static void bel_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		       size_t n, const struct kvfs_paccess *a)
{
	struct bel_priv *b = p->priv;

	for (size_t i = 0; i < n; i++) {
		struct kvfs_pnode *x = path[i];

		for (int t = 0; t < KVFS_NTIERS; t++) {
			uint32_t idx = x->t[t].idx;

			if (!(x->tiers & (1u << t)) || idx >= b->h[t].n ||
			    b->h[t].a[idx].node != x)
				continue;
			b->h[t].a[idx].next_use = x->next_use;
			bel_fix(&b->h[t], idx, t);
		}
	}
}

static void bel_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct bel_priv *b = p->priv;
	struct bel_heap *h = &b->h[tier];
	uint32_t idx = n->t[tier].idx;

	if (idx >= h->n || h->a[idx].node != n)
		return;
	h->n--;
	if (idx != h->n) {
		bel_set(h, idx, &h->a[h->n], tier);
		bel_fix(h, idx, tier);
	}
	n->t[tier].idx = UINT32_MAX;
}

/* Max-heap of heap slots, ordered like the nodes they hold. */
static bool bel_cand_push(struct bel_priv *b, struct bel_heap *h, size_t slot)
{
	size_t i;

	if (b->nc == b->capc) {
		size_t cap = b->capc ? 2 * b->capc : 64;
		size_t *nc = realloc(b->cand, cap * sizeof(*nc));

		if (!nc)
			return false;
		b->cand = nc;
		b->capc = cap;
	}
	i = b->nc++;
	while (i > 0 && bel_before(&h->a[slot], &h->a[b->cand[(i - 1) / 2]])) {
		b->cand[i] = b->cand[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	b->cand[i] = slot;
	return true;
}

static size_t bel_cand_pop(struct bel_priv *b, struct bel_heap *h)
{
	size_t top = b->cand[0], x = b->cand[--b->nc], i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= b->nc)
			break;
		if (c + 1 < b->nc &&
		    bel_before(&h->a[b->cand[c + 1]], &h->a[b->cand[c]]))
			c++;
		if (!bel_before(&h->a[b->cand[c]], &h->a[x]))
			break;
		b->cand[i] = b->cand[c];
		i = c;
	}
	if (b->nc)
		b->cand[i] = x;
	return top;
}

/*
 * The best block that passes @ok.  Filtered blocks (the simulator pins the
 * request in flight) sit at the top of the heap when they are never used
 * again, so the heap is walked best-first: only filtered blocks that rank
 * above the answer, and their children, are looked at.
 */
static struct kvfs_pnode *bel_victim(struct kvfs_policy *p, int tier,
				     kvfs_policy_ok_fn ok, void *arg)
{
	struct bel_priv *b = p->priv;
	struct bel_heap *h = &b->h[tier];
	struct bel_ent *best = NULL;

	if (!h->n)
		return NULL;
	if (ok(h->a[0].node, arg))
		return h->a[0].node;
	b->nc = 0;
	if (!bel_cand_push(b, h, 0))
		goto out_scan;
	while (b->nc) {
		size_t s = bel_cand_pop(b, h);

		if (ok(h->a[s].node, arg))
			return h->a[s].node;
		for (size_t c = 2 * s + 1; c <= 2 * s + 2 && c < h->n; c++)
			if (!bel_cand_push(b, h, c))
				goto out_scan;
	}
	return NULL;

out_scan:
	/* Out of memory for the walk: a plain scan needs none. */
	for (size_t i = 0; i < h->n; i++)
		if (ok(h->a[i].node, arg) &&
		    (!best || bel_before(&h->a[i], best)))
			best = &h->a[i];
	return best ? best->node : NULL;
}

const struct kvfs_policy_ops kvfs_policy_belady_ops = {
	.name = "belady",
	.priv_size = sizeof(struct bel_priv),
	.init = bel_init,
	.release = bel_release,
	.insert = bel_insert,
	.access = bel_access,
	.remove = bel_remove,
	.victim = bel_victim,
};
