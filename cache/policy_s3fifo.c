// SPDX-License-Identifier: MIT
/*
 * s3fifo: S3-FIFO (Yang et al., SOSP '23), a baseline.  Per tier: a small
 * FIFO S (10% of the tier), a main FIFO M and a ghost queue G of keys
 * recently evicted from S (as large as M).  Each resident block has a
 * 2-bit access counter.
 *  - A block enters M when its key is in G, S otherwise.
 *  - A hit raises the counter (up to 3); nothing moves.
 *  - Eviction from S (when S holds 10% or more, or M is empty): the
 *    oldest of S goes to M if it was hit at least once, else it is the
 *    victim and its key enters G.  Eviction from M: the oldest with a
 *    nonzero counter is reinserted at M's tail with its counter lowered
 *    (a CLOCK), else it is the victim.
 * The repo's rules apply as in every policy: blocks inserted on behalf of
 * one request share an order stamp, the deepest first, and a victim must
 * be a leaf of its tier (no resident child there) and pass the caller's
 * filter; only when none does is the first block that passes returned.
 * Admission: always; promotion: none.
 */
#include <errno.h>

#include "cache/policy.h"
#include "cache/policy_i.h"

enum { S3_S = 1, S3_M = 2 };

struct s3_tier {
	struct kvfs_plist s, m;
	struct kvfs_pghost g;
};

struct s3_priv {
	struct s3_tier t[KVFS_NTIERS];
	struct kvfs_pclock clock;
};

static int s3_init(struct kvfs_policy *p)
{
	struct s3_priv *f = p->priv;

	for (int t = 0; t < KVFS_NTIERS; t++) {
		int ret = kvfs_pghost_init(
			&f->t[t].g, p->capacity[t] - p->capacity[t] / 10);

		if (ret) {
			while (t-- > 0)
				kvfs_pghost_release(&f->t[t].g);
			return ret;
		}
	}
	return 0;
}

static void s3_release(struct kvfs_policy *p)
{
	struct s3_priv *f = p->priv;

	for (int t = 0; t < KVFS_NTIERS; t++)
		kvfs_pghost_release(&f->t[t].g);
}

static void s3_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		      const struct kvfs_paccess *a)
{
	struct s3_priv *f = p->priv;
	struct s3_tier *q = &f->t[tier];
	bool ghost = kvfs_pghost_take(&q->g, n->key);

	n->t[tier].idx = 0;
	n->t[tier].list = ghost ? S3_M : S3_S;
	kvfs_plist_place(ghost ? &q->m : &q->s, n, tier,
			 kvfs_pclock_stamp(&f->clock, a));
}

static void s3_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		      size_t n, const struct kvfs_paccess *a)
{
	for (size_t i = 0; i < n; i++)
		for (int t = 0; t < KVFS_NTIERS; t++)
			if ((path[i]->tiers & (1u << t)) &&
			    path[i]->t[t].idx < 3)
				path[i]->t[t].idx++;
}

static void s3_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct s3_priv *f = p->priv;
	struct s3_tier *q = &f->t[tier];

	if (n->t[tier].list == S3_S) {
		kvfs_plist_unlink(&q->s, n, tier);
		kvfs_pghost_add(&q->g, n->key, n->size);
	} else {
		kvfs_plist_unlink(&q->m, n, tier);
	}
	n->t[tier].list = 0;
}

/* Move @x to the tail of M (a fresh stamp), counter @freq. */
static void s3_to_m(struct s3_priv *f, struct kvfs_plist *from,
		    struct kvfs_pnode *x, int tier, uint32_t freq)
{
	struct s3_tier *q = &f->t[tier];

	kvfs_plist_unlink(from, x, tier);
	x->t[tier].idx = freq;
	x->t[tier].list = S3_M;
	kvfs_plist_place(&q->m, x, tier, kvfs_pclock_stamp(&f->clock, NULL));
}

static struct kvfs_pnode *s3_victim(struct kvfs_policy *p, int tier,
				    kvfs_policy_ok_fn ok, void *arg)
{
	struct s3_priv *f = p->priv;
	struct s3_tier *q = &f->t[tier];
	uint64_t small = p->capacity[tier] / 10;
	/* Every pass lowers some counter or moves a block out of S:
	 * bounded by 4 passes over the tier.
	 */
	uint64_t budget = 4 * (q->s.count + q->m.count) + 8;
	struct kvfs_pnode *x, *nx;

	while (budget) {
		bool from_s = q->s.count && (q->s.size >= small || !q->m.count);
		struct kvfs_plist *l = from_s ? &q->s : &q->m;
		bool moved = false;

		for (x = l->head; x && budget; x = nx, budget--) {
			nx = x->t[tier].next;
			if (!from_s && x->t[tier].idx) {
				s3_to_m(f, l, x, tier, x->t[tier].idx - 1);
				moved = true;
				break;
			}
			if (from_s && x->t[tier].idx) {
				s3_to_m(f, l, x, tier, 0);
				moved = true;
				break;
			}
			if (!x->children[tier] && ok(x, arg))
				return x;
		}
		if (!moved)
			break;
	}
	/* No leaf passed: the first block that passes, S first. */
	x = kvfs_plist_first(&q->s, tier, ok, arg, false, 0);
	return x ? x : kvfs_plist_first(&q->m, tier, ok, arg, false, 0);
}

const struct kvfs_policy_ops kvfs_policy_s3fifo_ops = {
	.name = "s3fifo",
	.priv_size = sizeof(struct s3_priv),
	.init = s3_init,
	.release = s3_release,
	.insert = s3_insert,
	.access = s3_access,
	.remove = s3_remove,
	.victim = s3_victim,
};
