// SPDX-License-Identifier: MIT
/*
 * sieve: SIEVE (Zhang et al., NSDI '24), a baseline.  Per tier one FIFO
 * queue in insertion order, a visited bit per block and a hand.  A hit
 * sets the bit; nothing moves.  To evict, the hand walks from where it
 * stopped towards newer blocks (wrapping to the oldest): a visited block
 * has its bit cleared and is passed over, the first unvisited one is the
 * victim, and the hand stays at its newer neighbour.
 * As in every kvfs policy, blocks inserted on behalf of one request share
 * an order stamp (deepest first), and a victim must be a leaf of its tier
 * and pass the caller's filter: the hand clears bits as usual and passes
 * over unvisited blocks it may not take.  Only when no block qualifies
 * after two turns of the hand is the first block that passes the filter
 * returned.
 * Admission: always; promotion: none.
 */
#include "cache/policy.h"
#include "cache/policy_i.h"

struct sieve_priv {
	struct kvfs_plist q[KVFS_NTIERS];
	struct kvfs_pnode *hand[KVFS_NTIERS]; /* NULL: start at the oldest */
	struct kvfs_pclock clock;
};

static void sieve_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
			 const struct kvfs_paccess *a)
{
	struct sieve_priv *f = p->priv;

	n->t[tier].idx = 0;
	kvfs_plist_place(&f->q[tier], n, tier, kvfs_pclock_stamp(&f->clock, a));
}

static void sieve_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
			 size_t n, const struct kvfs_paccess *a)
{
	for (size_t i = 0; i < n; i++)
		for (int t = 0; t < KVFS_NTIERS; t++)
			if (path[i]->tiers & (1u << t))
				path[i]->t[t].idx = 1;
}

static void sieve_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct sieve_priv *f = p->priv;

	if (f->hand[tier] == n)
		f->hand[tier] = n->t[tier].next;
	kvfs_plist_unlink(&f->q[tier], n, tier);
}

static struct kvfs_pnode *sieve_victim(struct kvfs_policy *p, int tier,
				       kvfs_policy_ok_fn ok, void *arg)
{
	struct sieve_priv *f = p->priv;
	struct kvfs_plist *q = &f->q[tier];
	struct kvfs_pnode *x = f->hand[tier];
	uint64_t steps = 2 * q->count + 2;

	while (steps--) {
		if (!x)
			x = q->head;
		if (!x)
			break;
		if (x->t[tier].idx) {
			x->t[tier].idx = 0;
		} else if (!x->children[tier] && ok(x, arg)) {
			f->hand[tier] = x;
			return x;
		}
		x = x->t[tier].next;
	}
	f->hand[tier] = x;
	return kvfs_plist_first(q, tier, ok, arg, false, 0);
}

const struct kvfs_policy_ops kvfs_policy_sieve_ops = {
	.name = "sieve",
	.priv_size = sizeof(struct sieve_priv),
	.insert = sieve_insert,
	.access = sieve_access,
	.remove = sieve_remove,
	.victim = sieve_victim,
};
