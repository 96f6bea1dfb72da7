// SPDX-License-Identifier: MIT
/*
 * Helpers the policies share (policy_i.h): the recency clock, the
 * stamp-sorted per-tier lists, the sighting sketch, and the leaf test of
 * policy.h.  They sit
 * below the policies, which sit below the registry (policy.c): no policy
 * calls back into the registry.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "cache/policy_i.h"

bool kvfs_policy_is_leaf(const struct kvfs_pnode *n, int tier)
{
	if (tier < 0 || tier >= KVFS_NTIERS)
		return false;
	return (n->tiers & (1u << tier)) && !n->children[tier];
}

uint64_t kvfs_pclock_stamp(struct kvfs_pclock *c, const struct kvfs_paccess *a)
{
	if (!a) {
		c->started = false;
		return ++c->clock;
	}
	if (!c->started || a->request != c->req || a->now != c->now) {
		c->started = true;
		c->req = a->request;
		c->now = a->now;
		c->clock++;
	}
	return c->clock;
}

void kvfs_plist_unlink(struct kvfs_plist *l, struct kvfs_pnode *n, int tier)
{
	struct kvfs_plink *k = &n->t[tier];

	if (l->seg == n) {
		if (k->next && kvfs_plist_stamp(k->next, tier) ==
				       kvfs_plist_stamp(n, tier))
			l->seg = k->next;
		else
			l->seg = NULL;
	}
	if (k->prev)
		k->prev->t[tier].next = k->next;
	else
		l->head = k->next;
	if (k->next)
		k->next->t[tier].prev = k->prev;
	else
		l->tail = k->prev;
	k->prev = k->next = NULL;
	l->size -= n->size;
	l->count--;
}

/* Link @n right after @pos (NULL: at the head). */
static void plist_link_after(struct kvfs_plist *l, struct kvfs_pnode *pos,
			     struct kvfs_pnode *n, int tier)
{
	struct kvfs_plink *k = &n->t[tier];

	k->prev = pos;
	k->next = pos ? pos->t[tier].next : l->head;
	if (k->next)
		k->next->t[tier].prev = n;
	else
		l->tail = n;
	if (pos)
		pos->t[tier].next = n;
	else
		l->head = n;
	l->size += n->size;
	l->count++;
}

/* The head-most node carrying the tail's stamp, recomputed when lost. */
static struct kvfs_pnode *plist_segment(struct kvfs_plist *l, int tier)
{
	struct kvfs_pnode *s = l->tail;
	uint64_t st;

	if (l->seg || !s)
		return l->seg;
	st = kvfs_plist_stamp(s, tier);
	while (s->t[tier].prev && kvfs_plist_stamp(s->t[tier].prev, tier) == st)
		s = s->t[tier].prev;
	l->seg = s;
	return s;
}

void kvfs_plist_place(struct kvfs_plist *l, struct kvfs_pnode *n, int tier,
		      uint64_t st)
{
	struct kvfs_pnode *pos = l->tail, *seg;
	uint32_t d = n->depth;

	n->t[tier].prio = (double)st;
	if (!pos || st > kvfs_plist_stamp(pos, tier)) {
		plist_link_after(l, pos, n, tier);
		l->seg = n;
		return;
	}
	if (st == kvfs_plist_stamp(pos, tier)) {
		seg = plist_segment(l, tier);
		if (d >= seg->depth) {
			plist_link_after(l, seg->t[tier].prev, n, tier);
			l->seg = n;
			return;
		}
		if (d <= pos->depth) {
			plist_link_after(l, pos, n, tier);
			return;
		}
	}
	/* Older stamp, or the middle of the newest segment: walk back to
	 * the first node that sorts before @n.  Never lands before the
	 * segment head (seg->depth > d here), so seg stays valid.
	 */
	while (pos && (kvfs_plist_stamp(pos, tier) > st ||
		       (kvfs_plist_stamp(pos, tier) == st && pos->depth < d)))
		pos = pos->t[tier].prev;
	plist_link_after(l, pos, n, tier);
}

struct kvfs_pnode *kvfs_plist_first(const struct kvfs_plist *l, int tier,
				    kvfs_policy_ok_fn ok, void *arg,
				    bool leaf, size_t max)
{
	size_t k = 0;

	for (struct kvfs_pnode *x = l->head; x; x = x->t[tier].next) {
		if (max && k++ >= max)
			break;
		if ((!leaf || !x->children[tier]) && ok(x, arg))
			return x;
	}
	return NULL;
}

static uint64_t sketch_hash(const uint8_t key[16], int i)
{
	uint64_t a, b;

	memcpy(&a, key, 8);
	memcpy(&b, key + 8, 8);
	a = a * 0x9e3779b97f4a7c15ULL + b + (uint64_t)i * 0xd6e8feb86659fd93ULL;
	a ^= a >> 32;
	a *= 0xd6e8feb86659fd93ULL;
	a ^= a >> 32;
	return a;
}

#define PHIST_WORD ((1ull << 48) - 1)
#define PHIST_WAYS 4

int kvfs_phist_init(struct kvfs_phist *h, uint32_t slots)
{
	h->mask = slots / PHIST_WAYS - 1;
	h->slot = calloc(slots, sizeof(*h->slot));
	return h->slot ? 0 : -ENOMEM;
}

void kvfs_phist_release(struct kvfs_phist *h)
{
	free(h->slot);
	h->slot = NULL;
}

/* A key's bucket (PHIST_WAYS slots, newest first) and tag.  Row
 * KVFS_PSKETCH_ROWS of the sketch's hash: independent of its rows.
 */
static uint64_t *phist_bucket(struct kvfs_phist *h, const uint8_t key[16],
			      uint64_t *tag)
{
	uint64_t x = sketch_hash(key, KVFS_PSKETCH_ROWS);

	*tag = (x >> 48) << 48;
	return &h->slot[(x & h->mask) * PHIST_WAYS];
}

/* Take slot @i of bucket @b out, closing the gap at the old end. */
static void phist_drop(uint64_t *b, int i)
{
	for (; i < PHIST_WAYS - 1; i++)
		b[i] = b[i + 1];
	b[PHIST_WAYS - 1] = 0;
}

void kvfs_phist_put(struct kvfs_phist *h, const uint8_t key[16], uint64_t word)
{
	uint64_t tag, *b = phist_bucket(h, key, &tag);
	int i;

	for (i = 0; i < PHIST_WAYS; i++)
		if (b[i] && (b[i] & ~PHIST_WORD) == tag) {
			phist_drop(b, i);
			break;
		}
	word &= PHIST_WORD;
	if (!word)
		return;
	/* The oldest falls off the end. */
	for (i = PHIST_WAYS - 1; i > 0; i--)
		b[i] = b[i - 1];
	b[0] = tag | word;
}

uint64_t kvfs_phist_take(struct kvfs_phist *h, const uint8_t key[16])
{
	uint64_t tag, *b = phist_bucket(h, key, &tag), word;

	for (int i = 0; i < PHIST_WAYS && b[i]; i++)
		if ((b[i] & ~PHIST_WORD) == tag) {
			word = b[i] & PHIST_WORD;
			phist_drop(b, i);
			return word;
		}
	return 0;
}

void kvfs_phist_prefetch(const struct kvfs_phist *h, const uint8_t key[16])
{
	uint64_t x = sketch_hash(key, KVFS_PSKETCH_ROWS);

	__builtin_prefetch(&h->slot[(x & h->mask) * PHIST_WAYS], 1);
}

int kvfs_psketch_init(struct kvfs_psketch *s, uint32_t width, uint64_t sample)
{
	s->width = width;
	s->sample = sample ? sample : 1;
	s->adds = 0;
	s->halvings = 0;
	s->c = calloc((size_t)KVFS_PSKETCH_ROWS * width, sizeof(*s->c));
	return s->c ? 0 : -ENOMEM;
}

void kvfs_psketch_release(struct kvfs_psketch *s)
{
	free(s->c);
	s->c = NULL;
}

uint32_t kvfs_psketch_get(const struct kvfs_psketch *s, const uint8_t key[16])
{
	uint32_t m = UINT16_MAX;

	for (int i = 0; i < KVFS_PSKETCH_ROWS; i++) {
		uint32_t v = s->c[(size_t)i * s->width +
				  (sketch_hash(key, i) & (s->width - 1))];

		if (v < m)
			m = v;
	}
	return m;
}

bool kvfs_psketch_add(struct kvfs_psketch *s, const uint8_t key[16])
{
	uint32_t m = kvfs_psketch_get(s, key);

	if (m < UINT16_MAX) {
		/* Conservative update: only the minimal counters grow. */
		for (int i = 0; i < KVFS_PSKETCH_ROWS; i++) {
			uint16_t *c =
				&s->c[(size_t)i * s->width +
				      (sketch_hash(key, i) & (s->width - 1))];

			if (*c == m)
				(*c)++;
		}
	}
	if (++s->adds < s->sample)
		return false;
	for (size_t i = 0; i < (size_t)KVFS_PSKETCH_ROWS * s->width; i++)
		s->c[i] >>= 1;
	s->adds = 0;
	s->halvings++;
	return true;
}

static uint64_t ghost_fp(const uint8_t key[16])
{
	uint64_t fp = sketch_hash(key, 7);

	return fp ? fp : 1;
}

static size_t ghost_slot(const struct kvfs_pghost *g, uint64_t fp)
{
	size_t i = (size_t)(fp * 0x9e3779b97f4a7c15ULL) & (g->tcap - 1);

	while (g->tfp[i] && g->tfp[i] != fp)
		i = (i + 1) & (g->tcap - 1);
	return i;
}

/* Backward-shift deletion keeps linear probing free of tombstones. */
static void ghost_del_slot(struct kvfs_pghost *g, size_t i)
{
	size_t j = i;

	g->tfp[i] = 0;
	g->tn--;
	for (;;) {
		size_t home;

		j = (j + 1) & (g->tcap - 1);
		if (!g->tfp[j])
			return;
		home = (size_t)(g->tfp[j] * 0x9e3779b97f4a7c15ULL) &
		       (g->tcap - 1);
		if (((j - home) & (g->tcap - 1)) >=
		    ((j - i) & (g->tcap - 1))) {
			g->tfp[i] = g->tfp[j];
			g->tseq[i] = g->tseq[j];
			g->tfp[j] = 0;
			i = j;
		}
	}
}

int kvfs_pghost_init(struct kvfs_pghost *g, uint64_t cap)
{
	memset(g, 0, sizeof(*g));
	g->cap = cap;
	g->rcap = 64;
	g->tcap = 128;
	g->seq = 1;
	g->ring = calloc(g->rcap, sizeof(*g->ring));
	g->tfp = calloc(g->tcap, sizeof(*g->tfp));
	g->tseq = calloc(g->tcap, sizeof(*g->tseq));
	if (!g->ring || !g->tfp || !g->tseq) {
		kvfs_pghost_release(g);
		return -ENOMEM;
	}
	return 0;
}

void kvfs_pghost_release(struct kvfs_pghost *g)
{
	free(g->ring);
	free(g->tfp);
	free(g->tseq);
	g->ring = NULL;
	g->tfp = g->tseq = NULL;
	g->n = g->tn = 0;
}

/* Is ring entry @e the newest sighting of its key? */
static bool ghost_live(const struct kvfs_pghost *g,
		       const struct kvfs_pghost_ent *e)
{
	size_t i = ghost_slot(g, e->fp);

	return g->tfp[i] && g->tseq[i] == e->seq;
}

static void ghost_pop(struct kvfs_pghost *g)
{
	struct kvfs_pghost_ent *e = &g->ring[g->head];
	size_t i = ghost_slot(g, e->fp);

	if (g->tfp[i] && g->tseq[i] == e->seq) {
		ghost_del_slot(g, i);
		g->size -= e->size;
	}
	g->head = (g->head + 1) & (g->rcap - 1);
	g->n--;
}

static int ghost_grow(struct kvfs_pghost *g)
{
	if (g->n == g->rcap) {
		struct kvfs_pghost_ent *r =
			malloc(2 * g->rcap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		for (size_t k = 0; k < g->n; k++)
			r[k] = g->ring[(g->head + k) & (g->rcap - 1)];
		free(g->ring);
		g->ring = r;
		g->head = 0;
		g->rcap *= 2;
	}
	if (2 * (g->tn + 1) > g->tcap) {
		struct kvfs_pghost ng = *g;

		ng.tcap = 2 * g->tcap;
		ng.tfp = calloc(ng.tcap, sizeof(*ng.tfp));
		ng.tseq = calloc(ng.tcap, sizeof(*ng.tseq));
		if (!ng.tfp || !ng.tseq) {
			free(ng.tfp);
			free(ng.tseq);
			return -ENOMEM;
		}
		for (size_t i = 0; i < g->tcap; i++) {
			size_t j;

			if (!g->tfp[i])
				continue;
			j = ghost_slot(&ng, g->tfp[i]);
			ng.tfp[j] = g->tfp[i];
			ng.tseq[j] = g->tseq[i];
		}
		free(g->tfp);
		free(g->tseq);
		g->tfp = ng.tfp;
		g->tseq = ng.tseq;
		g->tcap = ng.tcap;
	}
	return 0;
}

int kvfs_pghost_add(struct kvfs_pghost *g, const uint8_t key[16],
		    uint64_t size)
{
	uint64_t fp = ghost_fp(key);
	struct kvfs_pghost_ent *e;
	size_t i;

	if (!g->cap || size > g->cap)
		return 0;
	kvfs_pghost_take(g, key);
	/* Entries made stale by take() still occupy the ring: drop them
	 * from the head so it holds about as many entries as live ones.
	 */
	while (g->n && !ghost_live(g, &g->ring[g->head]))
		ghost_pop(g);
	while (g->n && g->size + size > g->cap)
		ghost_pop(g);
	if (ghost_grow(g))
		return -ENOMEM;
	e = &g->ring[(g->head + g->n) & (g->rcap - 1)];
	e->fp = fp;
	e->size = size;
	e->seq = g->seq++;
	g->n++;
	i = ghost_slot(g, fp);
	g->tfp[i] = fp;
	g->tseq[i] = e->seq;
	g->tn++;
	g->size += size;
	return 0;
}

bool kvfs_pghost_take(struct kvfs_pghost *g, const uint8_t key[16])
{
	uint64_t fp = ghost_fp(key);
	size_t i;

	if (!g->tfp)
		return false;
	i = ghost_slot(g, fp);
	if (!g->tfp[i])
		return false;
	/* Sequence numbers are consecutive along the ring. */
	g->size -= g->ring[(g->head + (g->tseq[i] - g->ring[g->head].seq)) &
			   (g->rcap - 1)].size;
	ghost_del_slot(g, i);
	return true;
}

void kvfs_pghost_trim(struct kvfs_pghost *g, uint64_t cap)
{
	g->cap = cap;
	while (g->n && (g->size > cap || !ghost_live(g, &g->ring[g->head])))
		ghost_pop(g);
}
