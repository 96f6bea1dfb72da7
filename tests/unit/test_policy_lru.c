// SPDX-License-Identifier: MIT
/* Unit tests for the policy wrappers (cache/policy.c) and lru. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache/policy.h"
#include "cache/policy_i.h"

#define GPU KVFS_TIER_GPU
#define DRAM KVFS_TIER_DRAM

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par)
{
	memset(n, 0, sizeof(*n));
	memcpy(n->key, &id, sizeof(id));
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->tokens = 16;
	n->size = 1;
	n->next_use = UINT64_MAX;
}

static struct kvfs_policy *mk(uint64_t gpu, uint64_t dram)
{
	uint64_t cap[KVFS_NTIERS] = { gpu, dram, 0 };
	struct kvfs_policy *p = NULL;

	assert_int_equal(kvfs_policy_new("lru", NULL, NULL, 0, cap, &p), 0);
	assert_non_null(p);
	return p;
}

static struct kvfs_paccess req(uint64_t r)
{
	return (struct kvfs_paccess){ .now = r * 10, .request = r };
}

/* Evict everything from @tier, recording the order. */
static size_t drain(struct kvfs_policy *p, int tier, struct kvfs_pnode **out,
		    size_t max)
{
	size_t k = 0;
	struct kvfs_pnode *v;

	while (k < max && (v = kvfs_policy_victim(p, tier, NULL, NULL))) {
		out[k++] = v;
		kvfs_policy_remove(p, tier, v);
	}
	return k;
}

static void test_new_errors(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "nope" }, *v[] = { "1" };
	struct kvfs_policy *p = (void *)1;

	assert_int_equal(kvfs_policy_new("no-such", NULL, NULL, 0, cap, &p),
			 -ENOENT);
	assert_null(p);
	assert_int_equal(kvfs_policy_new("lru", k, v, 1, cap, &p), -EINVAL);
	assert_null(p);
	kvfs_policy_free(NULL);
}

static void test_registry_names(void **state)
{
	const char *want[] = { "lru", "arc", "hotprefix", "wa", "belady" };

	for (size_t i = 0; i < 5; i++) {
		bool found = false;

		for (size_t j = 0; kvfs_policy_registry[j]; j++)
			if (!strcmp(kvfs_policy_registry[j]->name, want[i]))
				found = true;
		assert_true(found);
	}
}

/* A chain inserted by one request loses its tail before its head. */
static void test_tie_deepest_first(void **state)
{
	struct kvfs_policy *p = mk(8, 0);
	struct kvfs_pnode a, b, c, *order[3];
	struct kvfs_paccess r1 = req(1);

	mknode(&a, 1, NULL);
	mknode(&b, 2, &a);
	mknode(&c, 3, &b);
	kvfs_policy_insert(p, GPU, &a, &r1);
	kvfs_policy_insert(p, GPU, &b, &r1);
	kvfs_policy_insert(p, GPU, &c, &r1);
	assert_int_equal(p->count[GPU], 3);
	assert_int_equal(p->used[GPU], 3);
	assert_int_equal(a.children[GPU], 1);
	assert_false(kvfs_policy_is_leaf(&a, GPU));
	assert_true(kvfs_policy_is_leaf(&c, GPU));
	assert_int_equal(drain(p, GPU, order, 3), 3);
	assert_ptr_equal(order[0], &c);
	assert_ptr_equal(order[1], &b);
	assert_ptr_equal(order[2], &a);
	assert_int_equal(p->count[GPU], 0);
	assert_int_equal(p->used[GPU], 0);
	assert_int_equal(a.children[GPU], 0);
	kvfs_policy_free(p);
}

/* Same, when the chain is touched as a path by a later request, and the
 * inserts come in an unusual order (deepest first).
 */
static void test_tie_after_access(void **state)
{
	struct kvfs_policy *p = mk(8, 0);
	struct kvfs_pnode a, b, c, x, *order[4];
	struct kvfs_pnode *path[3] = { &a, &b, &c };
	struct kvfs_paccess r1 = req(1), r2 = req(2), r3 = req(3);

	mknode(&a, 1, NULL);
	mknode(&b, 2, &a);
	mknode(&c, 3, &b);
	mknode(&x, 9, NULL);
	kvfs_policy_insert(p, GPU, &c, &r1);
	kvfs_policy_insert(p, GPU, &a, &r1);
	kvfs_policy_insert(p, GPU, &b, &r1);
	kvfs_policy_insert(p, GPU, &x, &r2);
	kvfs_policy_access(p, path, 3, &r3);
	assert_int_equal(drain(p, GPU, order, 4), 4);
	assert_ptr_equal(order[0], &x); /* older than the touched chain */
	assert_ptr_equal(order[1], &c);
	assert_ptr_equal(order[2], &b);
	assert_ptr_equal(order[3], &a);
	kvfs_policy_free(p);
}

static void test_recency(void **state)
{
	struct kvfs_policy *p = mk(8, 0);
	struct kvfs_pnode n[4], *one[1], *order[4];

	for (int i = 0; i < 4; i++) {
		struct kvfs_paccess a = req((uint64_t)i + 1);

		mknode(&n[i], (uint64_t)i, NULL);
		kvfs_policy_insert(p, GPU, &n[i], &a);
	}
	one[0] = &n[0];
	{
		struct kvfs_paccess a = req(10);

		kvfs_policy_access(p, one, 1, &a);
	}
	/* Inserting again is an access, not a second copy. */
	{
		struct kvfs_paccess a = req(11);

		kvfs_policy_insert(p, GPU, &n[1], &a);
	}
	assert_int_equal(p->count[GPU], 4);
	assert_int_equal(drain(p, GPU, order, 4), 4);
	assert_ptr_equal(order[0], &n[2]);
	assert_ptr_equal(order[1], &n[3]);
	assert_ptr_equal(order[2], &n[0]);
	assert_ptr_equal(order[3], &n[1]);
	kvfs_policy_free(p);
}

static bool not_pinned(struct kvfs_pnode *n, void *arg)
{
	return n != arg;
}

static void test_filter_and_tiers(void **state)
{
	struct kvfs_policy *p = mk(4, 4);
	struct kvfs_pnode a, b, c;
	struct kvfs_paccess r1 = req(1), r2 = req(2);

	mknode(&a, 1, NULL);
	mknode(&b, 2, NULL);
	mknode(&c, 3, &a);
	kvfs_policy_insert(p, GPU, &a, &r1);
	kvfs_policy_insert(p, GPU, &b, &r2);
	/* The oldest is filtered out: the next one is chosen. */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_pinned, &a), &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	/* A node in two tiers is counted in both; its parent's children
	 * count is per tier.
	 */
	kvfs_policy_insert(p, DRAM, &a, &r2);
	kvfs_policy_insert(p, DRAM, &c, &r2);
	assert_int_equal(a.tiers, (1u << GPU) | (1u << DRAM));
	assert_int_equal(a.children[DRAM], 1);
	assert_int_equal(a.children[GPU], 0);
	assert_true(kvfs_policy_is_leaf(&a, GPU));
	assert_false(kvfs_policy_is_leaf(&a, DRAM));
	assert_false(kvfs_policy_is_leaf(&c, GPU));
	/* Removing from a tier it is not in changes nothing. */
	kvfs_policy_remove(p, GPU, &c);
	assert_int_equal(p->count[GPU], 2);
	kvfs_policy_forget(p, &a);
	assert_int_equal(a.tiers, 0);
	assert_int_equal(p->count[GPU], 1);
	assert_int_equal(p->count[DRAM], 1);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	assert_ptr_equal(kvfs_policy_victim(p, DRAM, NULL, NULL), &c);
	/* lru admits everything, promotes nothing; absent tier: never. */
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &b));
	assert_false(kvfs_policy_admit(p, DRAM, KVFS_TIER_SSD, &c));
	assert_false(kvfs_policy_admit(p, DRAM, KVFS_NTIERS, &c));
	{
		struct kvfs_pmove plan[4];

		assert_int_equal(kvfs_policy_promote(p, DRAM, GPU, plan, 4),
				 0);
	}
	assert_null(kvfs_policy_victim(p, KVFS_TIER_SSD, NULL, NULL));
	kvfs_policy_free(p);
}

/* Randomised: the victim is always the minimum of (stamp, -depth). */
static void test_random_order(void **state)
{
	enum { N = 64 };
	struct kvfs_policy *p = mk(N, 0);
	struct kvfs_pnode n[N];
	uint64_t stamp[N];
	unsigned seed = 7;

	for (int i = 0; i < N; i++) {
		mknode(&n[i], (uint64_t)i, NULL);
		n[i].depth = (uint32_t)(rand_r(&seed) % 5);
	}
	for (uint64_t r = 1; r < 2000; r++) {
		struct kvfs_paccess a = req(r / 3 + 1); /* some shared */
		int i = rand_r(&seed) % N;

		if (n[i].tiers && rand_r(&seed) % 4 == 0) {
			kvfs_policy_remove(p, GPU, &n[i]);
		} else if (n[i].tiers) {
			struct kvfs_pnode *one[1] = { &n[i] };

			kvfs_policy_access(p, one, 1, &a);
			stamp[i] = a.request;
		} else {
			kvfs_policy_insert(p, GPU, &n[i], &a);
			stamp[i] = a.request;
		}
		if (p->count[GPU]) {
			struct kvfs_pnode *v = kvfs_policy_victim(p, GPU,
								  NULL, NULL);
			int vi = (int)(v - n);

			for (int k = 0; k < N; k++) {
				if (!n[k].tiers)
					continue;
				assert_true(stamp[vi] < stamp[k] ||
					    (stamp[vi] == stamp[k] &&
					     n[vi].depth >= n[k].depth));
			}
		}
	}
	kvfs_policy_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_new_errors),
		cmocka_unit_test(test_registry_names),
		cmocka_unit_test(test_tie_deepest_first),
		cmocka_unit_test(test_tie_after_access),
		cmocka_unit_test(test_recency),
		cmocka_unit_test(test_filter_and_tiers),
		cmocka_unit_test(test_random_order),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
