// SPDX-License-Identifier: MIT
/* Unit tests for the plfu policy (cache/policy_plfu.c). */
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

static uint64_t reqno;

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par)
{
	memset(n, 0, sizeof(*n));
	memcpy(n->key, &id, sizeof(id));
	n->key[12] = 0x3c;
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->size = 1;
}

static struct kvfs_policy *mk(uint64_t gpu, uint64_t dram, const char *sample)
{
	uint64_t cap[KVFS_NTIERS] = { gpu, dram, 0 };
	const char *k[] = { "sample" }, *v[] = { sample };
	struct kvfs_policy *p = NULL;

	assert_int_equal(kvfs_policy_new("plfu", k, v, sample ? 1 : 0, cap,
					 &p), 0);
	reqno = 0;
	return p;
}

static struct kvfs_paccess next_req(bool hit)
{
	return (struct kvfs_paccess){ .now = ++reqno, .request = reqno,
				      .hit = hit };
}

static void touch(struct kvfs_policy *p, struct kvfs_pnode *n, int times)
{
	for (int i = 0; i < times; i++) {
		struct kvfs_paccess a = next_req(true);
		struct kvfs_pnode *one[1] = { n };

		kvfs_policy_access(p, one, 1, &a);
	}
}

static void put(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct kvfs_paccess a = next_req(false);

	kvfs_policy_insert(p, tier, n, &a);
}

static void test_options(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	struct kvfs_policy *p;
	const char *k1[] = { "width" }, *v1[] = { "1000" };
	const char *k2[] = { "bogus" }, *v2[] = { "1" };
	const char *k3[] = { "sample" }, *v3[] = { "-3" };

	assert_int_equal(kvfs_policy_new("plfu", k1, v1, 1, cap, &p),
			 -EINVAL);
	assert_int_equal(kvfs_policy_new("plfu", k2, v2, 1, cap, &p),
			 -EINVAL);
	assert_int_equal(kvfs_policy_new("plfu", k3, v3, 1, cap, &p),
			 -EINVAL);
	v1[0] = "4096";
	assert_int_equal(kvfs_policy_new("plfu", k1, v1, 1, cap, &p), 0);
	kvfs_policy_free(p);
}

/* The least frequent leaf goes; the oldest among equals. */
static void test_frequency_order(void **state)
{
	struct kvfs_policy *p = mk(8, 0, NULL);
	struct kvfs_pnode a, b, c;

	mknode(&a, 1, NULL);
	mknode(&b, 2, NULL);
	mknode(&c, 3, NULL);
	put(p, GPU, &a);
	put(p, GPU, &b);
	put(p, GPU, &c);
	touch(p, &a, 3);
	touch(p, &c, 1);
	/* a: 4, b: 1, c: 2 */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_remove(p, GPU, &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &c);
	/* History outlives residency: b comes back with 2 > a new block. */
	{
		struct kvfs_pnode d;

		mknode(&d, 4, NULL);
		put(p, GPU, &b);
		put(p, GPU, &d);
		assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &d);
	}
	kvfs_policy_free(p);
}

/* A parent with a resident child is never chosen, even if colder. */
static void test_leaves_only(void **state)
{
	struct kvfs_policy *p = mk(8, 0, NULL);
	struct kvfs_pnode a, b, x;

	mknode(&a, 1, NULL);
	mknode(&b, 2, &a);
	mknode(&x, 3, NULL);
	put(p, GPU, &a);
	put(p, GPU, &b);
	put(p, GPU, &x);
	touch(p, &b, 5); /* the child alone: now hotter than its parent */
	touch(p, &x, 2);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &x);
	kvfs_policy_remove(p, GPU, &x);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_remove(p, GPU, &b);
	/* Now a is a leaf again. */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	kvfs_policy_free(p);
}

/* Halving every "sample" increments lets old popularity fade. */
static void test_aging(void **state)
{
	struct kvfs_policy *p = mk(8, 0, "16");
	struct kvfs_pnode a, b;

	mknode(&a, 1, NULL);
	mknode(&b, 2, NULL);
	put(p, GPU, &a);
	touch(p, &a, 6);  /* a: 7 (7 increments so far) */
	put(p, GPU, &b);  /* 8 */
	touch(p, &b, 6);  /* b: 7, 14 increments */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	touch(p, &b, 2);  /* the 16th increment resets: a 3, b 4 */
	touch(p, &a, 2);  /* a 5 > b 4: b is older and colder now */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_free(p);
}

static void test_admission(void **state)
{
	struct kvfs_policy *p = mk(4, 2, NULL);
	struct kvfs_pnode a, b, hot, cold;

	mknode(&a, 1, NULL);
	mknode(&b, 2, NULL);
	mknode(&hot, 3, NULL);
	mknode(&cold, 4, NULL);
	put(p, GPU, &hot);
	touch(p, &hot, 4);
	put(p, GPU, &cold);
	/* DRAM has room: anything goes in. */
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &cold));
	put(p, DRAM, &a);
	touch(p, &a, 1);
	put(p, DRAM, &b);
	touch(p, &b, 1);
	/* DRAM full of blocks seen twice: a one-timer may not displace
	 * them, a block seen five times may.
	 */
	assert_false(kvfs_policy_admit(p, GPU, DRAM, &cold));
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &hot));
	/* No tier below the last. */
	assert_false(kvfs_policy_admit(p, DRAM, KVFS_TIER_SSD, &hot));
	kvfs_policy_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_options),
		cmocka_unit_test(test_frequency_order),
		cmocka_unit_test(test_leaves_only),
		cmocka_unit_test(test_aging),
		cmocka_unit_test(test_admission),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
