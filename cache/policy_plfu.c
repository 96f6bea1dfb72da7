// SPDX-License-Identifier: MIT
/*
 * plfu: prefix-aware LFU with a TinyLFU frequency sketch and frequency-
 * based admission.  kvfs's own policy (docs/policies.md explains why it
 * exists: on the Mooncake trace most reuse distances are far longer than
 * any cache, so recency says little and frequency history says much).
 *
 *  - Frequency: a count-min sketch (4 rows of 16-bit counters) indexed by
 *    the block key counts every access of every block, resident or not,
 *    so a block remembers its history after it was evicted.  Every
 *    "sample" increments (10 x the total capacity by default) all counters
 *    are halved, so old popularity fades (TinyLFU's reset).
 *  - Eviction: only leaves of the tier (no resident child there) are
 *    candidates, so the tier's content stays prefix-closed; among them the
 *    lowest (frequency, recency stamp) goes, the deepest first on ties.
 *    One binary heap per tier holds the leaves with snapshot keys taken at
 *    insert/access (and refreshed at every reset).
 *  - Admission (multi-tier): a block leaving a tier enters the next one if
 *    it has room, or if the block's frequency beats that of the block it
 *    would displace there (TinyLFU's admission rule), or if it has
 *    resident children (dropping it would make them unreachable).
 *  - In the last tier a victim is discarded, so there a leaf whose own
 *    children live in no other tier is preferred; a block with children
 *    elsewhere goes only if no other candidate passes the caller's filter.
 *  - Promotion: none (hits are loaded on demand by the mover).
 *
 * Options: "sample" (increments between resets, 0 = 10 x capacity),
 * "width" (counters per sketch row, a power of two, default 65536).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"

#define PLFU_NIL UINT32_MAX

struct plfu_ent {
	struct kvfs_pnode *node;
	uint32_t freq;  /* snapshot of the sketch estimate */
	uint32_t depth;
	uint64_t stamp;
};

struct plfu_heap {
	struct plfu_ent *a;
	size_t n, cap;
};

struct plfu_priv {
	struct plfu_heap h[KVFS_NTIERS];
	struct kvfs_pclock clock;
	struct kvfs_psketch sk; /* sightings of every block */
	uint32_t width;         /* option: counters per row */
	uint64_t sample;        /* option: additions between halvings */
};

/* Per-tier recency stamp lives in plink.prio like the other policies. */
static inline uint64_t stamp_of(const struct kvfs_pnode *n, int tier)
{
	return (uint64_t)n->t[tier].prio;
}

static uint32_t sk_get(const struct plfu_priv *f, const uint8_t key[16])
{
	return kvfs_psketch_get(&f->sk, key);
}

static void plfu_reset(struct plfu_priv *f);

static void sk_add(struct plfu_priv *f, const uint8_t key[16])
{
	if (kvfs_psketch_add(&f->sk, key))
		plfu_reset(f);
}

static bool ent_before(const struct plfu_ent *x, const struct plfu_ent *y)
{
	if (x->freq != y->freq)
		return x->freq < y->freq;
	if (x->stamp != y->stamp)
		return x->stamp < y->stamp;
	return x->depth > y->depth;
}

static void h_set(struct plfu_heap *h, size_t i, const struct plfu_ent *e,
		  int tier)
{
	h->a[i] = *e;
	e->node->t[tier].idx = (uint32_t)i;
}

static size_t h_up(struct plfu_heap *h, size_t i, int tier)
{
	struct plfu_ent x = h->a[i];

	while (i > 0 && ent_before(&x, &h->a[(i - 1) / 2])) {
		h_set(h, i, &h->a[(i - 1) / 2], tier);
		i = (i - 1) / 2;
	}
	h_set(h, i, &x, tier);
	return i;
}

static void h_down(struct plfu_heap *h, size_t i, int tier)
{
	struct plfu_ent x = h->a[i];

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && ent_before(&h->a[c + 1], &h->a[c]))
			c++;
		if (!ent_before(&h->a[c], &x))
			break;
		h_set(h, i, &h->a[c], tier);
		i = c;
	}
	h_set(h, i, &x, tier);
}

static bool h_has(const struct plfu_heap *h, const struct kvfs_pnode *n,
		  int tier)
{
	uint32_t i = n->t[tier].idx;

	return i < h->n && h->a[i].node == n;
}

static void h_add(struct plfu_priv *f, int tier, struct kvfs_pnode *n)
{
	struct plfu_heap *h = &f->h[tier];

	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 256;
		struct plfu_ent *na = realloc(h->a, cap * sizeof(*na));

		if (!na) {
			/* Not a candidate then; logged, capacity drifts. */
			kvfs_err("plfu: out of memory tracking a block");
			n->t[tier].idx = PLFU_NIL;
			return;
		}
		h->a = na;
		h->cap = cap;
	}
	h->a[h->n] = (struct plfu_ent){ n, sk_get(f, n->key), n->depth,
					stamp_of(n, tier) };
	n->t[tier].idx = (uint32_t)h->n;
	h->n++;
	h_up(h, h->n - 1, tier);
}

static void h_del(struct plfu_heap *h, struct kvfs_pnode *n, int tier)
{
	uint32_t i = n->t[tier].idx;

	if (!h_has(h, n, tier))
		return;
	h->n--;
	if (i != h->n) {
		h_set(h, i, &h->a[h->n], tier);
		h_down(h, h_up(h, i, tier), tier);
	}
	n->t[tier].idx = PLFU_NIL;
}

static void h_refresh(struct plfu_priv *f, struct kvfs_pnode *n, int tier)
{
	struct plfu_heap *h = &f->h[tier];
	uint32_t i = n->t[tier].idx;

	if (!h_has(h, n, tier))
		return;
	h->a[i].freq = sk_get(f, n->key);
	h->a[i].stamp = stamp_of(n, tier);
	h_down(h, h_up(h, i, tier), tier);
}

static void plfu_reset(struct plfu_priv *f)
{
	/* The sketch was just halved. Every snapshot changed: re-key and re-heapify. */
	for (int t = 0; t < KVFS_NTIERS; t++) {
		struct plfu_heap *h = &f->h[t];

		for (size_t i = 0; i < h->n; i++)
			h->a[i].freq = sk_get(f, h->a[i].node->key);
		for (size_t i = h->n / 2; i-- > 0;)
			h_down(h, i, t);
	}
}

static int plfu_set(struct kvfs_policy *p, const char *key, const char *val)
{
	struct plfu_priv *f = p->priv;
	char *end;
	unsigned long long v;

	v = strtoull(val, &end, 10);
	if (end == val || *end || *val == '-') {
		kvfs_err("plfu: %s wants a number, got '%s'", key, val);
		return -EINVAL;
	}
	if (!strcmp(key, "sample")) {
		f->sample = v;
	} else if (!strcmp(key, "width")) {
		if (v < 64 || v > (1u << 26) || (v & (v - 1))) {
			kvfs_err("plfu: width must be a power of two in "
				 "64..2^26");
			return -EINVAL;
		}
		f->width = (uint32_t)v;
	} else {
		kvfs_err("plfu: unknown option '%s'", key);
		return -EINVAL;
	}
	return 0;
}

static int plfu_init(struct kvfs_policy *p)
{
	struct plfu_priv *f = p->priv;
	uint64_t total = 0;

	for (int t = 0; t < KVFS_NTIERS; t++)
		total += p->capacity[t];
	if (!f->width)
		f->width = 1u << 16;
	if (!f->sample)
		f->sample = total ? 10 * total : 1u << 20;
	return kvfs_psketch_init(&f->sk, f->width, f->sample);
}

static void plfu_release(struct kvfs_policy *p)
{
	struct plfu_priv *f = p->priv;

	for (int t = 0; t < KVFS_NTIERS; t++)
		free(f->h[t].a);
	kvfs_psketch_release(&f->sk);
}

static void plfu_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
			const struct kvfs_paccess *a)
{
	struct plfu_priv *f = p->priv;
	struct kvfs_pnode *par = n->parent;

	/* A block that enters the cache (resident nowhere else: a miss being
	 * filled, a new write) is being accessed; a block moving between
	 * tiers is inserted before it is removed (two tiers now) and was
	 * counted when it was touched.
	 */
	n->t[tier].prio = (double)kvfs_pclock_stamp(&f->clock, a);
	if (n->tiers == (1u << tier))
		sk_add(f, n->key);
	if (par && (par->tiers & (1u << tier)) && par->children[tier] == 1)
		h_del(&f->h[tier], par, tier);
	if (!n->children[tier])
		h_add(f, tier, n);
}

static void plfu_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
			size_t n, const struct kvfs_paccess *a)
{
	struct plfu_priv *f = p->priv;
	uint64_t st = kvfs_pclock_stamp(&f->clock, a);

	for (size_t i = 0; i < n; i++) {
		struct kvfs_pnode *x = path[i];

		sk_add(f, x->key);
		for (int t = 0; t < KVFS_NTIERS; t++) {
			if (!(x->tiers & (1u << t)))
				continue;
			x->t[t].prio = (double)st;
			h_refresh(f, x, t);
		}
	}
}

static void plfu_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct plfu_priv *f = p->priv;
	struct kvfs_pnode *par = n->parent;

	h_del(&f->h[tier], n, tier);
	if (par && (par->tiers & (1u << tier)) && !par->children[tier] &&
	    !h_has(&f->h[tier], par, tier))
		h_add(f, tier, par);
}

static bool has_children(const struct kvfs_pnode *n)
{
	for (int t = 0; t < KVFS_NTIERS; t++)
		if (n->children[t])
			return true;
	return false;
}

/* The best heap entry passing @ok (and, with @strict, childless in every
 * tier).  Filtered entries are few (the blocks of the request in flight):
 * the heap is walked depth-first, pruning subtrees that cannot beat the
 * best passing entry found so far.
 */
static struct kvfs_pnode *plfu_find(struct plfu_heap *h, kvfs_policy_ok_fn ok,
				    void *arg, bool strict)
{
	size_t stack[64], sp = 0;
	struct plfu_ent *best = NULL;

	if (!h->n)
		return NULL;
	stack[sp++] = 0;
	while (sp) {
		size_t i = stack[--sp];

		if (best && !ent_before(&h->a[i], best))
			continue;
		if ((!strict || !has_children(h->a[i].node)) &&
		    ok(h->a[i].node, arg)) {
			best = &h->a[i];
			continue;
		}
		for (size_t c = 2 * i + 1; c <= 2 * i + 2 && c < h->n; c++) {
			if (sp == sizeof(stack) / sizeof(stack[0]))
				goto out_scan;
			stack[sp++] = c;
		}
	}
	return best ? best->node : NULL;

out_scan:
	for (size_t i = 0; i < h->n; i++)
		if ((!strict || !has_children(h->a[i].node)) &&
		    ok(h->a[i].node, arg) &&
		    (!best || ent_before(&h->a[i], best)))
			best = &h->a[i];
	return best ? best->node : NULL;
}

static struct kvfs_pnode *plfu_victim(struct kvfs_policy *p, int tier,
				      kvfs_policy_ok_fn ok, void *arg)
{
	struct plfu_priv *f = p->priv;
	struct plfu_heap *h = &f->h[tier];
	struct kvfs_pnode *v = NULL;
	bool last = true;

	for (int t = tier + 1; t < KVFS_NTIERS; t++)
		if (p->capacity[t])
			last = false;
	if (last)
		v = plfu_find(h, ok, arg, true);
	return v ? v : plfu_find(h, ok, arg, false);
}

static bool plfu_admit(struct kvfs_policy *p, int from, int to,
		       struct kvfs_pnode *n)
{
	struct plfu_priv *f = p->priv;
	struct plfu_heap *h = &f->h[to];

	if (p->used[to] + n->size <= p->capacity[to] || !h->n ||
	    has_children(n))
		return true;
	return sk_get(f, n->key) > h->a[0].freq;
}

const struct kvfs_policy_ops kvfs_policy_plfu_ops = {
	.name = "plfu",
	.priv_size = sizeof(struct plfu_priv),
	.set = plfu_set,
	.init = plfu_init,
	.release = plfu_release,
	.insert = plfu_insert,
	.access = plfu_access,
	.remove = plfu_remove,
	.victim = plfu_victim,
	.admit = plfu_admit,
};
