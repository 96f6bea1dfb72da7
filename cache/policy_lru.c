// SPDX-License-Identifier: MIT
/*
 * lru: the baseline.  One recency list per tier (struct kvfs_plist), least
 * recent at the head.  Every block touched or inserted on behalf of one
 * request shares a recency stamp; among equal stamps the deepest block goes
 * first, so a chain loses its tail before its head and the parent of a
 * resident block stays resident.  Admission: always; promotion: none.
 */
#include "cache/policy.h"
#include "cache/policy_i.h"

struct lru_priv {
	struct kvfs_plist l[KVFS_NTIERS];
	struct kvfs_pclock clock;
};

static void lru_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		       const struct kvfs_paccess *a)
{
	struct lru_priv *l = p->priv;

	kvfs_plist_place(&l->l[tier], n, tier,
			 kvfs_pclock_stamp(&l->clock, a));
}

static void lru_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		       size_t n, const struct kvfs_paccess *a)
{
	struct lru_priv *l = p->priv;
	uint64_t st = kvfs_pclock_stamp(&l->clock, a);

	/* Deepest first: each lands at the tail of the newest segment. */
	for (size_t i = n; i-- > 0;) {
		struct kvfs_pnode *x = path[i];

		for (int t = 0; t < KVFS_NTIERS; t++) {
			if (!(x->tiers & (1u << t)))
				continue;
			kvfs_plist_unlink(&l->l[t], x, t);
			kvfs_plist_place(&l->l[t], x, t, st);
		}
	}
}

static void lru_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct lru_priv *l = p->priv;

	kvfs_plist_unlink(&l->l[tier], n, tier);
}

static struct kvfs_pnode *lru_victim(struct kvfs_policy *p, int tier,
				     kvfs_policy_ok_fn ok, void *arg)
{
	struct lru_priv *l = p->priv;

	for (struct kvfs_pnode *x = l->l[tier].head; x; x = x->t[tier].next)
		if (ok(x, arg))
			return x;
	return NULL;
}

const struct kvfs_policy_ops kvfs_policy_lru_ops = {
	.name = "lru",
	.priv_size = sizeof(struct lru_priv),
	.insert = lru_insert,
	.access = lru_access,
	.remove = lru_remove,
	.victim = lru_victim,
};
