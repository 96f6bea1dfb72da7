// SPDX-License-Identifier: MIT
/*
 * Helpers the policies share (policy_i.h): the recency clock, the
 * stamp-sorted per-tier lists, and the leaf test of policy.h.  They sit
 * below the policies, which sit below the registry (policy.c): no policy
 * calls back into the registry.
 */
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
