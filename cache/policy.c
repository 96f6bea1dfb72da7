// SPDX-License-Identifier: MIT
/*
 * Policy registry and the wrappers that keep the bookkeeping every policy
 * relies on (residency bits, per-tier resident-children counts, used and
 * count per tier) before they call into the policy.
 *
 * Order of bookkeeping and hook: the wrappers update the node first and
 * call the hook after, so a hook always sees the state that results from
 * the event (in insert, @n is already resident and counted in its parent's
 * children; in remove, it no longer is).  The hooks are only called for
 * real transitions: remove of a node not in the tier is a no-op, insert of
 * a node already in the tier becomes an access of that node alone.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"

const struct kvfs_policy_ops *const kvfs_policy_registry[] = {
	&kvfs_policy_lru_ops,
	&kvfs_policy_arc_ops,
	&kvfs_policy_hotprefix_ops,
	&kvfs_policy_wa_ops,
	&kvfs_policy_plfu_ops,
	&kvfs_policy_s3fifo_ops,
	&kvfs_policy_sieve_ops,
	&kvfs_policy_kvfs_ops,
	&kvfs_policy_belady_ops,
	NULL,
};

static bool tier_ok(int tier)
{
	return tier >= 0 && tier < KVFS_NTIERS;
}

static const struct kvfs_policy_ops *find_ops(const char *name)
{
	for (size_t i = 0; kvfs_policy_registry[i]; i++)
		if (!strcmp(kvfs_policy_registry[i]->name, name))
			return kvfs_policy_registry[i];
	return NULL;
}

int kvfs_policy_new(const char *name, const char *const *keys,
		    const char *const *vals, size_t n,
		    const uint64_t cap[KVFS_NTIERS], struct kvfs_policy **out)
{
	const struct kvfs_policy_ops *ops;
	struct kvfs_policy *p;
	int ret;

	*out = NULL;
	if (!name) {
		kvfs_err("policy: no policy name given");
		return -ENOENT;
	}
	ops = find_ops(name);
	if (!ops) {
		kvfs_err("policy: unknown policy '%s'", name);
		return -ENOENT;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->ops = ops;
	for (int t = 0; t < KVFS_NTIERS; t++)
		p->capacity[t] = cap ? cap[t] : 0;
	if (ops->priv_size) {
		p->priv = calloc(1, ops->priv_size);
		if (!p->priv) {
			ret = -ENOMEM;
			goto out_free_policy;
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!keys[i] || !vals[i]) {
			kvfs_err("policy %s: option %zu has no key or value",
				 name, i);
			ret = -EINVAL;
			goto out_free_priv;
		}
		if (!ops->set) {
			kvfs_err("policy %s: takes no options (got '%s')",
				 name, keys[i]);
			ret = -EINVAL;
			goto out_free_priv;
		}
		ret = ops->set(p, keys[i], vals[i]);
		if (ret) {
			kvfs_err("policy %s: bad option %s = %s", name,
				 keys[i], vals[i]);
			ret = ret < 0 ? ret : -EINVAL;
			goto out_free_priv;
		}
	}
	if (ops->init) {
		ret = ops->init(p);
		if (ret) {
			kvfs_err("policy %s: init failed (%d)", name, ret);
			goto out_free_priv;
		}
	}
	*out = p;
	return 0;

out_free_priv:
	free(p->priv);
out_free_policy:
	free(p);
	return ret;
}

void kvfs_policy_free(struct kvfs_policy *p)
{
	if (!p)
		return;
	if (p->ops->release)
		p->ops->release(p);
	free(p->priv);
	free(p);
}

void kvfs_policy_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
			const struct kvfs_paccess *a)
{
	if (!tier_ok(tier) || !n)
		return;
	if (n->tiers & (1u << tier)) {
		struct kvfs_pnode *one[1] = { n };

		if (p->ops->access)
			p->ops->access(p, one, 1, a);
		return;
	}
	n->tiers |= 1u << tier;
	n->t[tier].in = 1;
	if (n->parent)
		n->parent->children[tier]++;
	p->used[tier] += n->size;
	p->count[tier]++;
	if (p->ops->insert)
		p->ops->insert(p, tier, n, a);
}

void kvfs_policy_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
			size_t n, const struct kvfs_paccess *a)
{
	if (n && p->ops->access)
		p->ops->access(p, path, n, a);
}

void kvfs_policy_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	if (!tier_ok(tier) || !n || !(n->tiers & (1u << tier)))
		return;
	n->tiers &= ~(1u << tier);
	n->t[tier].in = 0;
	if (n->parent && n->parent->children[tier])
		n->parent->children[tier]--;
	p->used[tier] -= n->size;
	p->count[tier]--;
	if (p->ops->remove)
		p->ops->remove(p, tier, n);
}

void kvfs_policy_forget(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	if (!n)
		return;
	for (int t = 0; t < KVFS_NTIERS; t++)
		kvfs_policy_remove(p, t, n);
	if (p->ops->forget)
		p->ops->forget(p, n);
}

static bool ok_all(struct kvfs_pnode *n, void *arg)
{
	return true;
}

struct kvfs_pnode *kvfs_policy_victim(struct kvfs_policy *p, int tier,
				      kvfs_policy_ok_fn ok, void *arg)
{
	if (!tier_ok(tier) || !p->count[tier] || !p->ops->victim)
		return NULL;
	return p->ops->victim(p, tier, ok ? ok : ok_all, arg);
}

bool kvfs_policy_admit(struct kvfs_policy *p, int from, int to,
		       struct kvfs_pnode *n)
{
	if (!tier_ok(from) || !tier_ok(to) || !p->capacity[to])
		return false;
	if (!p->ops->admit)
		return true;
	return p->ops->admit(p, from, to, n);
}

size_t kvfs_policy_promote(struct kvfs_policy *p, int lower, int upper,
			   struct kvfs_pmove *plan, size_t max)
{
	if (!tier_ok(lower) || !tier_ok(upper) || !max || !p->ops->promote)
		return 0;
	return p->ops->promote(p, lower, upper, plan, max);
}

void kvfs_policy_tick(struct kvfs_policy *p, const struct kvfs_paccess *a)
{
	if (p->ops->tick)
		p->ops->tick(p, a);
}

void kvfs_policy_sight(struct kvfs_policy *p, const uint8_t key[16],
		       struct kvfs_pnode *n)
{
	if (p->ops->sight)
		p->ops->sight(p, key, n && n->tiers ? n : NULL);
}
