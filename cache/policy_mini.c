// SPDX-License-Identifier: MIT
/*
 * Miniature simulations of a policy (policy_i.h, struct kvfs_pmini): a
 * shadow cache of one tier, driven by the references a real policy sees
 * to a hash-sampled part of the key space, with its capacity scaled by
 * the sampling rate (Waldspurger et al., USENIX ATC '17).  It holds its
 * own nodes, one per resident block, in a table keyed by the block key,
 * and keeps their prefix tree: a block is cached only under a resident
 * parent, and a victim leaves with its resident descendants, as in the
 * last tier of the simulator and the daemon.  Below the registry: it
 * drives the policy's ops directly and does the wrappers' bookkeeping
 * itself.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "cache/policy_i.h"

struct mini_node {
	struct kvfs_pnode pn; /* first: the policy's node */
	struct mini_node *parent, *child, *prev, *next; /* prefix tree */
	uint64_t fp;
	uint64_t pin; /* stamp of the last reference */
};

#define MINI_UNIT (1ull << 63) /* hist[0]: the sampling hash is set */

static uint64_t mini_fp(const uint8_t key[16])
{
	uint64_t a, b;

	memcpy(&a, key, 8);
	memcpy(&b, key + 8, 8);
	a ^= b * 0xc2b2ae3d27d4eb4fULL;
	a ^= a >> 31;
	a *= 0x9e3779b97f4a7c15ULL;
	a ^= a >> 29;
	a *= 0xbf58476d1ce4e5b9ULL;
	a ^= a >> 32;
	return a ? a : 1;
}

/* The sampling hash of @n: a hash of its own key when it is at depth
 * @depth or above, else of its ancestor's at @depth, so a chain below that
 * depth is in the sample or out of it as a whole (kvfs samples by the
 * root: @depth 0).  Cached in hist[0], inherited from a cached parent.
 */
static uint64_t mini_unit(struct kvfs_pnode *n, uint32_t depth)
{
	const struct kvfs_pnode *x = n;
	uint64_t h;

	if (n->hist[0] & MINI_UNIT)
		return n->hist[0] & ~MINI_UNIT;
	if (n->depth > depth && n->parent && (n->parent->hist[0] & MINI_UNIT)) {
		h = n->parent->hist[0] & ~MINI_UNIT;
	} else {
		while (x->depth > depth && x->parent)
			x = x->parent;
		h = mini_fp(x->key) & ~MINI_UNIT;
	}
	n->hist[0] = h | MINI_UNIT;
	return h;
}

bool kvfs_pmini_sampled(const struct kvfs_pmini *m, struct kvfs_pnode *n)
{
	return !((mini_unit(n, m->depth) >> 20) & ((1ull << m->shift) - 1));
}

static size_t mini_slot(const struct kvfs_pmini *m, uint64_t fp,
			const uint8_t key[16])
{
	size_t i = (size_t)(fp * 0x9e3779b97f4a7c15ULL) & (m->tcap - 1);

	while (m->tab[i] &&
	       (m->tab[i]->fp != fp || memcmp(m->tab[i]->pn.key, key, 16)))
		i = (i + 1) & (m->tcap - 1);
	return i;
}

static struct mini_node *mini_find(const struct kvfs_pmini *m,
				   const uint8_t key[16])
{
	return m->tab[mini_slot(m, mini_fp(key), key)];
}

/* Nodes are recycled through a free list: the shadow frees one on
 * almost every miss.
 */
static struct mini_node *mini_alloc(struct kvfs_pmini *m)
{
	struct mini_node *x = m->free;

	if (!x)
		return calloc(1, sizeof(*x));
	m->free = x->next;
	memset(x, 0, sizeof(*x));
	return x;
}

/* Backward-shift deletion, as the ghost queue does. */
static void mini_unhash(struct kvfs_pmini *m, struct mini_node *x)
{
	size_t i = mini_slot(m, x->fp, x->pn.key), j = i;

	m->tab[i] = NULL;
	m->tn--;
	for (;;) {
		size_t home;

		j = (j + 1) & (m->tcap - 1);
		if (!m->tab[j])
			return;
		home = (size_t)(m->tab[j]->fp * 0x9e3779b97f4a7c15ULL) &
		       (m->tcap - 1);
		if (((j - home) & (m->tcap - 1)) >= ((j - i) & (m->tcap - 1))) {
			m->tab[i] = m->tab[j];
			m->tab[j] = NULL;
			i = j;
		}
	}
}

static int mini_grow(struct kvfs_pmini *m)
{
	struct mini_node **old = m->tab;
	size_t ocap = m->tcap;

	if (2 * (m->tn + 1) <= m->tcap)
		return 0;
	m->tab = calloc(2 * ocap, sizeof(*m->tab));
	if (!m->tab) {
		m->tab = old;
		return -ENOMEM;
	}
	m->tcap = 2 * ocap;
	for (size_t i = 0; i < ocap; i++)
		if (old[i])
			m->tab[mini_slot(m, old[i]->fp, old[i]->pn.key)] =
				old[i];
	free(old);
	return 0;
}

int kvfs_pmini_init(struct kvfs_pmini *m, const struct kvfs_policy_ops *ops,
		    const char *const *keys, const char *const *vals, size_t n,
		    uint64_t cap, uint32_t shift, uint32_t depth)
{
	int ret;

	memset(m, 0, sizeof(*m));
	m->shift = shift;
	m->depth = depth;
	m->p.ops = ops;
	m->p.capacity[0] = cap;
	m->tcap = 64;
	m->tab = calloc(m->tcap, sizeof(*m->tab));
	if (!m->tab)
		return -ENOMEM;
	if (ops->priv_size) {
		m->p.priv = calloc(1, ops->priv_size);
		if (!m->p.priv) {
			ret = -ENOMEM;
			goto out_tab;
		}
	}
	for (size_t i = 0; i < n; i++) {
		ret = ops->set ? ops->set(&m->p, keys[i], vals[i]) : -EINVAL;
		if (ret)
			goto out_priv;
	}
	ret = ops->init ? ops->init(&m->p) : 0;
	if (ret)
		goto out_priv;
	m->ready = true;
	return 0;
out_priv:
	free(m->p.priv);
	m->p.priv = NULL;
out_tab:
	free(m->tab);
	m->tab = NULL;
	return ret;
}

void kvfs_pmini_release(struct kvfs_pmini *m)
{
	if (m->ready && m->p.ops->release)
		m->p.ops->release(&m->p);
	m->ready = false;
	for (size_t i = 0; m->tab && i < m->tcap; i++)
		free(m->tab[i]);
	while (m->free) {
		struct mini_node *x = m->free;

		m->free = x->next;
		free(x);
	}
	free(m->tab);
	free(m->stk);
	free(m->p.priv);
	m->stk = NULL;
	m->stkcap = 0;
	m->tab = NULL;
	m->p.priv = NULL;
}

static bool mini_ok(struct kvfs_pnode *n, void *arg)
{
	const struct kvfs_pmini *m = arg;

	return ((struct mini_node *)n)->pin != m->clock.clock;
}

/* Take @v and its resident descendants out of the policy and recycle
 * them: gathered first (parents before children), removed children first
 * so a parent outlives its children's bookkeeping.  0 or -ENOMEM (then
 * nothing changed).
 */
static int mini_discard(struct kvfs_pmini *m, struct mini_node *v)
{
	struct kvfs_policy *p = &m->p;
	struct mini_node *x;
	size_t k = 0, n = 0;

	/* The subtree is at most every resident node. */
	if (m->stkcap < m->tn) {
		void *s = realloc(m->stk, 2 * m->tn * sizeof(*m->stk));

		if (!s)
			return -ENOMEM;
		m->stk = s;
		m->stkcap = 2 * m->tn;
	}
	m->stk[n++] = v;
	while (k < n) {
		x = m->stk[k++];
		for (struct mini_node *c = x->child; c; c = c->next)
			m->stk[n++] = c;
	}
	while (n--) {
		x = m->stk[n];
		x->pn.tiers = 0;
		x->pn.t[0].in = 0;
		if (x->pn.parent && x->pn.parent->children[0])
			x->pn.parent->children[0]--;
		p->used[0] -= x->pn.size;
		p->count[0]--;
		if (p->ops->remove)
			p->ops->remove(p, 0, &x->pn);
		if (p->ops->forget)
			p->ops->forget(p, &x->pn);
		mini_unhash(m, x);
		if (x->parent && x->parent->child == x)
			x->parent->child = x->next;
		if (x->prev)
			x->prev->next = x->next;
		if (x->next)
			x->next->prev = x->prev;
		x->next = m->free;
		m->free = x;
	}
	return 0;
}

void kvfs_pmini_ref(struct kvfs_pmini *m, struct kvfs_pnode *n,
		    const struct kvfs_paccess *a)
{
	struct kvfs_policy *p = &m->p;
	uint64_t fp = mini_fp(n->key);
	struct mini_node *x = m->tab[mini_slot(m, fp, n->key)], *pa = NULL;
	uint64_t st = kvfs_pclock_stamp(&m->clock, a);

	m->refs++;
	if (x) {
		struct kvfs_pnode *one[1] = { &x->pn };

		x->pin = st;
		m->hits++;
		if (p->ops->access)
			p->ops->access(p, one, 1, a);
		return;
	}
	if (n->size > p->capacity[0])
		return;
	while (p->used[0] + n->size > p->capacity[0]) {
		struct kvfs_pnode *v = p->ops->victim(p, 0, mini_ok, m);

		if (!v)
			return;
		if (mini_discard(m, (struct mini_node *)v))
			return;
	}
	/* A parent in the sample must be resident (looked up after the
	 * evictions, which may have taken it); one outside the sample makes
	 * @n a root here.
	 */
	if (n->parent && kvfs_pmini_sampled(m, n->parent)) {
		pa = mini_find(m, n->parent->key);
		if (!pa)
			return;
	}
	if (mini_grow(m))
		return;
	x = mini_alloc(m);
	if (!x)
		return;
	memcpy(x->pn.key, n->key, 16);
	x->fp = fp;
	x->pin = st;
	x->pn.depth = n->depth;
	x->pn.tokens = n->tokens;
	x->pn.size = n->size;
	x->pn.category = n->category;
	x->pn.turn = n->turn;
	x->pn.next_use = UINT64_MAX;
	m->tab[mini_slot(m, fp, n->key)] = x;
	m->tn++;
	if (pa) {
		x->parent = pa;
		x->pn.parent = &pa->pn;
		x->next = pa->child;
		if (pa->child)
			pa->child->prev = x;
		pa->child = x;
		pa->pn.children[0]++;
	}
	x->pn.tiers = 1;
	x->pn.t[0].in = 1;
	p->used[0] += x->pn.size;
	p->count[0]++;
	if (p->ops->insert)
		p->ops->insert(p, 0, &x->pn, a);
}
