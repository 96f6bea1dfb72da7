// SPDX-License-Identifier: MIT
/*
 * arc: Adaptive Replacement Cache (Megiddo & Modha, FAST'03), as paper 002
 * applies it to prefix KV blocks.  One independent ARC per tier.
 *
 * Mapping onto kvfs (every choice is argued in docs/policies.md):
 *  - Sizes.  ARC counts pages; kvfs blocks have a size in the tier's units
 *    (pnode->size).  A block of size s counts as s pages that always move
 *    together: |T1|, |T2|, |B1|, |B2| and c are sums of sizes, a ghost keeps
 *    the size its block had, and a ghost hit moves p by delta * s.
 *  - Order of events.  The caller asks for a victim before it inserts the
 *    block that needs the room, so REPLACE runs before ARC sees x.  The
 *    adaptation of p happens at insert, with delta computed from the ghost
 *    sizes as they were before those REPLACEs (the ghosts they added are
 *    tracked as "pending"), so p takes canonical values; what REPLACE cannot
 *    have is the adapted p of the same miss and the "x in B2 and |T1| == p"
 *    tie (taken as false).  Case IV's ghost trimming runs after x is added;
 *    it removes what the canonical order would (keeps |T1|+|B1| <= c and
 *    the total <= 2c).
 *  - Ties.  Blocks touched by one request share a recency stamp; inside
 *    T1 and T2 the deepest goes first among equal stamps (as vLLM does).
 *  - Prefix tree.  A victim must have no resident child in its tier, so a
 *    tier never holds a child whose parent it evicted.  The rule is applied
 *    like the caller's ok() filter (skipped blocks stay where they are);
 *    only if no leaf passes does REPLACE fall back to any block that
 *    passes ok(), and the mover then drops the unreachable descendants.
 *  - Pinned/leased blocks (ok() false) are skipped by REPLACE: they are
 *    outside the lists as far as choice goes but still count in |T1|/|T2|.
 *  - Ghosts hold keys and sizes only, never node pointers, so a node may
 *    be freed while its key is still in B1/B2.  remove() ghosts the key
 *    (any removal from a tier is an eviction for that tier's ARC); forget()
 *    does nothing more: a re-created block with the same key is the same
 *    prefix, so its ghost hit is genuine.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"

enum { ARC_T1 = 1, ARC_T2 = 2, ARC_B1 = 1, ARC_B2 = 2 };

#define ARC_NIL UINT32_MAX

struct arc_ghost {
	uint8_t key[16];
	uint64_t size;
	uint32_t prev, next;  /* LRU order inside B1 or B2 */
	uint32_t hnext;       /* hash chain; free list when unused */
	uint8_t list;         /* ARC_B1, ARC_B2, 0 = free */
};

struct arc_glist {
	uint32_t head, tail;  /* head = LRU */
	uint64_t size, count;
};

struct arc_tier {
	struct kvfs_plist t1, t2;
	struct arc_glist b1, b2;
	double p;
	/* Ghost sizes added by evictions since the last insert. */
	uint64_t pend_b1, pend_b2;
	/* Ghost pool and hash index on the key. */
	struct arc_ghost *g;
	uint32_t ng, capg, free;
	uint32_t *bucket;
	uint32_t nbucket;     /* power of two, or 0 */
};

struct arc_priv {
	struct arc_tier t[KVFS_NTIERS];
	struct kvfs_pclock clock;
};

static uint64_t key_hash(const uint8_t key[16])
{
	uint64_t a, b;

	memcpy(&a, key, 8);
	memcpy(&b, key + 8, 8);
	a ^= b * 0x9e3779b97f4a7c15ULL;
	a ^= a >> 31;
	a *= 0xbf58476d1ce4e5b9ULL;
	a ^= a >> 29;
	return a;
}

static uint32_t ghost_find(struct arc_tier *t, const uint8_t key[16])
{
	uint32_t i;

	if (!t->nbucket)
		return ARC_NIL;
	i = t->bucket[key_hash(key) & (t->nbucket - 1)];
	while (i != ARC_NIL && memcmp(t->g[i].key, key, 16))
		i = t->g[i].hnext;
	return i;
}

static int ghost_rehash(struct arc_tier *t, uint32_t nb)
{
	uint32_t *b = malloc((size_t)nb * sizeof(*b));

	if (!b)
		return -ENOMEM;
	for (uint32_t i = 0; i < nb; i++)
		b[i] = ARC_NIL;
	for (uint32_t i = 0; i < t->ng; i++) {
		struct arc_ghost *g = &t->g[i];
		uint32_t h;

		if (!g->list)
			continue;
		h = key_hash(g->key) & (nb - 1);
		g->hnext = b[h];
		b[h] = i;
	}
	free(t->bucket);
	t->bucket = b;
	t->nbucket = nb;
	return 0;
}

static struct arc_glist *glist(struct arc_tier *t, int list)
{
	return list == ARC_B1 ? &t->b1 : &t->b2;
}

static void ghost_unlink(struct arc_tier *t, uint32_t i)
{
	struct arc_ghost *g = &t->g[i];
	struct arc_glist *l = glist(t, g->list);
	uint32_t *pp = &t->bucket[key_hash(g->key) & (t->nbucket - 1)];

	while (*pp != i)
		pp = &t->g[*pp].hnext;
	*pp = g->hnext;
	if (g->prev != ARC_NIL)
		t->g[g->prev].next = g->next;
	else
		l->head = g->next;
	if (g->next != ARC_NIL)
		t->g[g->next].prev = g->prev;
	else
		l->tail = g->prev;
	l->size -= g->size;
	l->count--;
	g->list = 0;
	g->hnext = t->free;
	t->free = i;
}

/* Add @key at the MRU end of @list.  Out of memory: the ghost is lost,
 * which only weakens adaptation (logged).
 */
static void ghost_push(struct arc_tier *t, int list, const uint8_t key[16],
		       uint64_t size)
{
	struct arc_glist *l = glist(t, list);
	struct arc_ghost *g;
	uint32_t i, h;

	if (!size)
		return; /* a zero-size ghost would never be trimmed */
	if (t->free == ARC_NIL) {
		if (t->ng == t->capg) {
			uint32_t cap = t->capg ? 2 * t->capg : 256;
			struct arc_ghost *ng;

			if (cap <= t->capg || cap == ARC_NIL)
				goto out_nomem;
			ng = realloc(t->g, (size_t)cap * sizeof(*ng));
			if (!ng)
				goto out_nomem;
			t->g = ng;
			t->capg = cap;
		}
		t->g[t->ng].list = 0;
		t->free = t->ng++;
		t->g[t->free].hnext = ARC_NIL;
	}
	if (t->ng > t->nbucket && ghost_rehash(t, t->nbucket ?
					       2 * t->nbucket : 256))
		goto out_nomem;
	i = t->free;
	g = &t->g[i];
	t->free = g->hnext;
	memcpy(g->key, key, 16);
	g->size = size;
	g->list = (uint8_t)list;
	h = key_hash(key) & (t->nbucket - 1);
	g->hnext = t->bucket[h];
	t->bucket[h] = i;
	g->next = ARC_NIL;
	g->prev = l->tail;
	if (l->tail != ARC_NIL)
		t->g[l->tail].next = i;
	else
		l->head = i;
	l->tail = i;
	l->size += size;
	l->count++;
	return;

out_nomem:
	kvfs_err("arc: out of memory for a ghost entry");
}

static uint64_t c_of(struct kvfs_policy *p, int tier)
{
	return p->capacity[tier];
}

/* Keep |T1|+|B1| <= c and |T1|+|T2|+|B1|+|B2| <= 2c by dropping the LRU
 * ghosts that canonical ARC's case IV drops.
 */
static void arc_trim(struct kvfs_policy *p, int tier)
{
	struct arc_tier *t = &((struct arc_priv *)p->priv)->t[tier];
	uint64_t c = c_of(p, tier);

	while (t->b1.count && t->t1.size + t->b1.size > c)
		ghost_unlink(t, t->b1.head);
	while (t->b2.count &&
	       t->t1.size + t->t2.size + t->b1.size + t->b2.size > 2 * c)
		ghost_unlink(t, t->b2.head);
	/* Only when T2 alone overflows (an overfull tier): B1 last. */
	while (t->b1.count &&
	       t->t1.size + t->t2.size + t->b1.size + t->b2.size > 2 * c)
		ghost_unlink(t, t->b1.head);
}

static struct kvfs_plist *tlist(struct arc_tier *t, int list)
{
	return list == ARC_T1 ? &t->t1 : &t->t2;
}

static void arc_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		       const struct kvfs_paccess *a)
{
	struct arc_priv *ap = p->priv;
	struct arc_tier *t = &ap->t[tier];
	uint64_t st = kvfs_pclock_stamp(&ap->clock, a);
	double c = (double)c_of(p, tier), s = (double)n->size, d;
	uint32_t gi = ghost_find(t, n->key);
	int list = ARC_T1;

	if (gi != ARC_NIL) {
		/* Cases II and III: a ghost hit adapts p, x goes to T2.  The
		 * list sizes are those before this miss's REPLACEs.
		 */
		uint64_t b1 = t->b1.size > t->pend_b1 ?
			      t->b1.size - t->pend_b1 : 0;
		uint64_t b2 = t->b2.size > t->pend_b2 ?
			      t->b2.size - t->pend_b2 : 0;

		/* x itself was in its ghost list: never divide by 0. */
		if (t->g[gi].list == ARC_B1) {
			if (b1 < t->g[gi].size)
				b1 = t->g[gi].size;
			d = b1 >= b2 ? 1.0 : (double)b2 / (double)b1;
			t->p = t->p + d * s > c ? c : t->p + d * s;
		} else {
			if (b2 < t->g[gi].size)
				b2 = t->g[gi].size;
			d = b2 >= b1 ? 1.0 : (double)b1 / (double)b2;
			t->p = t->p - d * s < 0 ? 0 : t->p - d * s;
		}
		ghost_unlink(t, gi);
		list = ARC_T2;
	}
	t->pend_b1 = t->pend_b2 = 0;
	n->t[tier].list = (uint8_t)list;
	kvfs_plist_place(tlist(t, list), n, tier, st);
	arc_trim(p, tier);
}

static void arc_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		       size_t n, const struct kvfs_paccess *a)
{
	struct arc_priv *ap = p->priv;
	uint64_t st = kvfs_pclock_stamp(&ap->clock, a);

	/* Case I for every resident block of the path, deepest first so
	 * the parent ends up the more recent of the two.
	 */
	for (size_t i = n; i-- > 0;) {
		struct kvfs_pnode *x = path[i];

		for (int tier = 0; tier < KVFS_NTIERS; tier++) {
			struct arc_tier *t = &ap->t[tier];

			if (!(x->tiers & (1u << tier)))
				continue;
			kvfs_plist_unlink(tlist(t, x->t[tier].list), x, tier);
			x->t[tier].list = ARC_T2;
			kvfs_plist_place(&t->t2, x, tier, st);
		}
	}
}

static void arc_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct arc_priv *ap = p->priv;
	struct arc_tier *t = &ap->t[tier];
	int list = n->t[tier].list;

	kvfs_plist_unlink(tlist(t, list), n, tier);
	n->t[tier].list = 0;
	/* A key can be in at most one of T1, T2, B1, B2. */
	if (ghost_find(t, n->key) == ARC_NIL) {
		ghost_push(t, list == ARC_T1 ? ARC_B1 : ARC_B2, n->key,
			   n->size);
		if (list == ARC_T1)
			t->pend_b1 += n->size;
		else
			t->pend_b2 += n->size;
	}
	arc_trim(p, tier);
}

static bool arc_leaf_ok(struct kvfs_pnode *n, int tier)
{
	return !n->children[tier];
}

static struct kvfs_pnode *arc_scan(struct kvfs_plist *l, int tier,
				   kvfs_policy_ok_fn ok, void *arg,
				   bool leaves)
{
	for (struct kvfs_pnode *x = l->head; x; x = x->t[tier].next)
		if ((!leaves || arc_leaf_ok(x, tier)) && ok(x, arg))
			return x;
	return NULL;
}

/* REPLACE: the LRU of T1 when |T1| exceeds the target p, else of T2. */
static struct kvfs_pnode *arc_victim(struct kvfs_policy *p, int tier,
				     kvfs_policy_ok_fn ok, void *arg)
{
	struct arc_tier *t = &((struct arc_priv *)p->priv)->t[tier];
	struct kvfs_plist *first = &t->t2, *second = &t->t1;
	struct kvfs_pnode *v;

	if (t->t1.count && (double)t->t1.size > t->p) {
		first = &t->t1;
		second = &t->t2;
	}
	v = arc_scan(first, tier, ok, arg, true);
	if (!v)
		v = arc_scan(second, tier, ok, arg, true);
	if (!v)
		v = arc_scan(first, tier, ok, arg, false);
	if (!v)
		v = arc_scan(second, tier, ok, arg, false);
	return v;
}

static void arc_release(struct kvfs_policy *p)
{
	struct arc_priv *ap = p->priv;

	for (int i = 0; i < KVFS_NTIERS; i++) {
		free(ap->t[i].g);
		free(ap->t[i].bucket);
	}
}

static int arc_init(struct kvfs_policy *p)
{
	struct arc_priv *ap = p->priv;

	for (int i = 0; i < KVFS_NTIERS; i++) {
		struct arc_tier *t = &ap->t[i];

		t->b1.head = t->b1.tail = ARC_NIL;
		t->b2.head = t->b2.tail = ARC_NIL;
		t->free = ARC_NIL;
		t->p = 0;
	}
	return 0;
}

const struct kvfs_policy_ops kvfs_policy_arc_ops = {
	.name = "arc",
	.priv_size = sizeof(struct arc_priv),
	.init = arc_init,
	.release = arc_release,
	.insert = arc_insert,
	.access = arc_access,
	.remove = arc_remove,
	.victim = arc_victim,
};

int kvfs_policy_arc_state(struct kvfs_policy *p, int tier,
			  struct kvfs_arc_state *st)
{
	struct arc_tier *t;

	if (!p || p->ops != &kvfs_policy_arc_ops || tier < 0 ||
	    tier >= KVFS_NTIERS)
		return -EINVAL;
	t = &((struct arc_priv *)p->priv)->t[tier];
	st->c = p->capacity[tier];
	st->t1 = t->t1.size;
	st->t2 = t->t2.size;
	st->b1 = t->b1.size;
	st->b2 = t->b2.size;
	st->nt1 = t->t1.count;
	st->nt2 = t->t2.count;
	st->nb1 = t->b1.count;
	st->nb2 = t->b2.count;
	st->p = t->p;
	return 0;
}
