// SPDX-License-Identifier: MIT
/* Unit tests for the arc policy (cache/policy_arc.c). */
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

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par,
		   uint64_t size)
{
	memset(n, 0, sizeof(*n));
	memcpy(n->key, &id, sizeof(id));
	n->key[15] = 0xa5;
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->tokens = 16;
	n->size = size;
	n->next_use = UINT64_MAX;
}

static struct kvfs_policy *mk(uint64_t gpu, uint64_t dram)
{
	uint64_t cap[KVFS_NTIERS] = { gpu, dram, 0 };
	struct kvfs_policy *p = NULL;

	assert_int_equal(kvfs_policy_new("arc", NULL, NULL, 0, cap, &p), 0);
	reqno = 0;
	return p;
}

/*
 * One request for @n in @tier, as a cache would issue it: a hit is an
 * access; a miss evicts victims until @n fits, then inserts it.
 * Returns the first victim (NULL if none).
 */
static struct kvfs_pnode *request(struct kvfs_policy *p, int tier,
				  struct kvfs_pnode *n)
{
	struct kvfs_paccess a = { .now = ++reqno, .request = reqno };
	struct kvfs_pnode *first = NULL, *v;

	if (n->tiers & (1u << tier)) {
		struct kvfs_pnode *one[1] = { n };

		kvfs_policy_access(p, one, 1, &a);
		return NULL;
	}
	while (p->used[tier] + n->size > p->capacity[tier]) {
		v = kvfs_policy_victim(p, tier, NULL, NULL);
		assert_non_null(v);
		if (!first)
			first = v;
		kvfs_policy_remove(p, tier, v);
	}
	kvfs_policy_insert(p, tier, n, &a);
	return first;
}

static struct kvfs_arc_state st(struct kvfs_policy *p, int tier)
{
	struct kvfs_arc_state s;

	assert_int_equal(kvfs_policy_arc_state(p, tier, &s), 0);
	return s;
}

static void expect(struct kvfs_policy *p, uint64_t t1, uint64_t t2,
		   uint64_t b1, uint64_t b2, double pv)
{
	struct kvfs_arc_state s = st(p, GPU);

	assert_int_equal(s.t1, t1);
	assert_int_equal(s.t2, t2);
	assert_int_equal(s.b1, b1);
	assert_int_equal(s.b2, b2);
	assert_true(s.p > pv - 1e-9 && s.p < pv + 1e-9);
}

static void check_invariants(struct kvfs_policy *p, int tier)
{
	struct kvfs_arc_state s = st(p, tier);

	assert_true(s.t1 + s.t2 <= s.c);
	assert_true(s.t1 + s.b1 <= s.c);
	assert_true(s.t1 + s.t2 + s.b1 + s.b2 <= 2 * s.c);
	assert_true(s.p >= 0 && s.p <= (double)s.c);
	/* The lists hold exactly the resident blocks. */
	assert_int_equal(s.t1 + s.t2, p->used[tier]);
	assert_int_equal(s.nt1 + s.nt2, p->count[tier]);
}

static void test_introspection_rejects(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	struct kvfs_policy *p;
	struct kvfs_arc_state s;

	assert_int_equal(kvfs_policy_new("lru", NULL, NULL, 0, cap, &p), 0);
	assert_int_equal(kvfs_policy_arc_state(p, GPU, &s), -EINVAL);
	kvfs_policy_free(p);
	p = mk(4, 0);
	assert_int_equal(kvfs_policy_arc_state(p, KVFS_NTIERS, &s), -EINVAL);
	kvfs_policy_free(p);
}

/*
 * c = 2, unit blocks.  Worked by hand from the ARC paper's rules:
 *   A B        T1=[A B]
 *   A (hit)    T1=[B] T2=[A]
 *   C          REPLACE: |T1|=1 > p=0, B -> B1; T1=[C] T2=[A] B1=[B]
 *   B (B1 hit) REPLACE: C -> B1; delta=1 (|B1|=1 >= |B2|=0) p=1;
 *              T2=[A B] B1=[C]
 *   C (B1 hit) REPLACE: |T1|=0, A -> B2; delta=1, p=2; T2=[B C] B2=[A]
 *   A (B2 hit) REPLACE: |T1|=0, B -> B2; delta=1 (|B2|=1 >= |B1|=0)
 *              p=1; T2=[C A] B2=[B]
 */
static void test_hand_unit(void **state)
{
	struct kvfs_policy *p = mk(2, 0);
	struct kvfs_pnode a, b, c;

	mknode(&a, 1, NULL, 1);
	mknode(&b, 2, NULL, 1);
	mknode(&c, 3, NULL, 1);
	assert_null(request(p, GPU, &a));
	assert_null(request(p, GPU, &b));
	expect(p, 2, 0, 0, 0, 0);
	request(p, GPU, &a);
	expect(p, 1, 1, 0, 0, 0);
	assert_ptr_equal(request(p, GPU, &c), &b);
	expect(p, 1, 1, 1, 0, 0);
	assert_ptr_equal(request(p, GPU, &b), &c);
	expect(p, 0, 2, 1, 0, 1);
	assert_ptr_equal(request(p, GPU, &c), &a);
	expect(p, 0, 2, 0, 1, 2);
	assert_ptr_equal(request(p, GPU, &a), &b);
	expect(p, 0, 2, 0, 1, 1);
	/* T2 = [C A]: C is the LRU. */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &c);
	kvfs_policy_free(p);
}

/*
 * Case IV ghost trimming, c = 2: A B fill T1; C evicts A to B1, and
 * inserting C makes |T1|+|B1| = 3 > c, so A's ghost is dropped: a later
 * A is a plain miss (T1), not a ghost hit.
 */
static void test_hand_trim(void **state)
{
	struct kvfs_policy *p = mk(2, 0);
	struct kvfs_pnode a, b, c;

	mknode(&a, 1, NULL, 1);
	mknode(&b, 2, NULL, 1);
	mknode(&c, 3, NULL, 1);
	request(p, GPU, &a);
	request(p, GPU, &b);
	assert_ptr_equal(request(p, GPU, &c), &a);
	expect(p, 2, 0, 0, 0, 0);
	assert_ptr_equal(request(p, GPU, &a), &b);
	/* B went to B1 (|T1|+|B1| = 2), A came back into T1 as a miss. */
	expect(p, 2, 0, 0, 0, 0);
	kvfs_policy_free(p);
}

/*
 * Variable sizes and a delta above 1; c = 4 units.
 *   X(2) X     T2=[X]
 *   Y(2)       T1=[Y]                           used 4
 *   Z(1)       REPLACE: |T1|=2 > 0: Y -> B1     T1=[Z] T2=[X] B1=[Y]
 *   W(1)       fits                            T1=[Z W]
 *   V(1)       Z -> B1; then |T1|+|B1| = 2+3 > 4: drop Y
 *                                               T1=[W V] B1=[Z]
 *   Z (B1 hit) W -> B1; delta from |B1|=1,|B2|=0: 1; p = 0 + 1*1 = 1
 *                                               T1=[V] T2=[X Z] B1=[W]
 *   U(2)       |T1|=1 > p=1 is false: X(2) -> B2
 *                                               T1=[V U] T2=[Z] B2=[X]
 *   W (B1 hit) |T1|=3 > 1: V -> B1; before that REPLACE |B1|=1,
 *              |B2|=2: delta = 2, p = 1 + 2*1 = 3
 *                                               T1=[U] T2=[Z W] B1=[V]
 */
static void test_hand_sizes(void **state)
{
	struct kvfs_policy *p = mk(4, 0);
	struct kvfs_pnode x, y, z, w, v, u;

	mknode(&x, 1, NULL, 2);
	mknode(&y, 2, NULL, 2);
	mknode(&z, 3, NULL, 1);
	mknode(&w, 4, NULL, 1);
	mknode(&v, 5, NULL, 1);
	mknode(&u, 6, NULL, 2);
	request(p, GPU, &x);
	request(p, GPU, &x);
	request(p, GPU, &y);
	expect(p, 2, 2, 0, 0, 0);
	assert_ptr_equal(request(p, GPU, &z), &y);
	expect(p, 1, 2, 2, 0, 0);
	assert_null(request(p, GPU, &w));
	expect(p, 2, 2, 2, 0, 0);
	assert_ptr_equal(request(p, GPU, &v), &z);
	expect(p, 2, 2, 1, 0, 0);
	assert_ptr_equal(request(p, GPU, &z), &w);
	expect(p, 1, 3, 1, 0, 1);
	assert_ptr_equal(request(p, GPU, &u), &x);
	expect(p, 3, 1, 1, 2, 1);
	assert_ptr_equal(request(p, GPU, &w), &v);
	expect(p, 2, 2, 1, 2, 3);
	kvfs_policy_free(p);
}

/* Random requests (with deletions), invariants after every step. */
static void run_random(uint64_t c, uint32_t nkeys, bool sizes, unsigned seed)
{
	struct kvfs_policy *p = mk(c, 0);
	struct kvfs_pnode *n = calloc(nkeys, sizeof(*n));
	uint64_t max_b2 = 0, max_total = 0;
	double max_p = 0;

	assert_non_null(n);
	for (uint32_t i = 0; i < nkeys; i++)
		mknode(&n[i], i, NULL,
		       sizes ? 1 + (uint64_t)(rand_r(&seed) % 3) : 1);
	for (int step = 0; step < 20000; step++) {
		/* Skewed keys so that T2 and both ghosts get traffic. */
		uint32_t k = (uint32_t)(rand_r(&seed) % nkeys);

		if (rand_r(&seed) % 2)
			k = k % (nkeys / 4 + 1);
		if (rand_r(&seed) % 50 == 0 && n[k].tiers) {
			kvfs_policy_forget(p, &n[k]);
		} else {
			request(p, GPU, &n[k]);
		}
		check_invariants(p, GPU);
		{
			struct kvfs_arc_state s = st(p, GPU);

			max_b2 = s.b2 > max_b2 ? s.b2 : max_b2;
			max_p = s.p > max_p ? s.p : max_p;
			if (s.t1 + s.t2 + s.b1 + s.b2 > max_total)
				max_total = s.t1 + s.t2 + s.b1 + s.b2;
		}
	}
	/* The run exercised adaptation and both ghost lists. */
	assert_true(max_b2 > 0);
	assert_true(max_p > 0);
	assert_true(max_total > c);
	kvfs_policy_free(p);
	free(n);
}

static void test_property_unit(void **state)
{
	run_random(16, 64, false, 1);
	run_random(5, 11, false, 2);
	run_random(64, 1000, false, 3);
}

static void test_property_sizes(void **state)
{
	run_random(16, 64, true, 4);
	run_random(7, 20, true, 5);
}

/* A parent is skipped while its child is resident in the same tier. */
static void test_leaf_rule(void **state)
{
	struct kvfs_policy *p = mk(3, 0);
	struct kvfs_pnode a, b, x;
	struct kvfs_paccess r1 = { .now = 1, .request = 1 };
	struct kvfs_paccess r2 = { .now = 2, .request = 2 };
	struct kvfs_paccess r3 = { .now = 3, .request = 3 };

	mknode(&a, 1, NULL, 1);
	mknode(&b, 2, &a, 1);
	mknode(&x, 3, NULL, 1);
	/* The parent is the LRU of T1, its child the next: the parent is
	 * skipped while the child is there.
	 */
	kvfs_policy_insert(p, GPU, &a, &r1);
	kvfs_policy_insert(p, GPU, &b, &r2);
	kvfs_policy_insert(p, GPU, &x, &r3);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_remove(p, GPU, &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	kvfs_policy_free(p);
}

static bool not_node(struct kvfs_pnode *n, void *arg)
{
	return n != arg;
}

static void test_filter_fallback(void **state)
{
	struct kvfs_policy *p = mk(3, 0);
	struct kvfs_pnode a, b;
	struct kvfs_paccess r1 = { .now = 1, .request = 1 };

	mknode(&a, 1, NULL, 1);
	mknode(&b, 2, &a, 1);
	kvfs_policy_insert(p, GPU, &a, &r1);
	kvfs_policy_insert(p, GPU, &b, &r1);
	/* b pinned: the only block left is a non-leaf; better that than
	 * no victim (the mover then drops b as unreachable).
	 */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_node, &b), &a);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_free(p);
}

/* Each tier has its own ARC: ghosts of one do not adapt the other. */
static void test_per_tier(void **state)
{
	struct kvfs_policy *p = mk(2, 1);
	struct kvfs_pnode a, b, c;
	struct kvfs_arc_state s;

	mknode(&a, 1, NULL, 1);
	mknode(&b, 2, NULL, 1);
	mknode(&c, 3, NULL, 1);
	request(p, GPU, &a);
	request(p, GPU, &a);
	request(p, GPU, &b);
	assert_ptr_equal(request(p, GPU, &c), &b); /* b -> GPU's B1 */
	request(p, DRAM, &b);                      /* miss in DRAM's ARC */
	s = st(p, DRAM);
	assert_int_equal(s.t1, 1);
	assert_int_equal(s.t2, 0);
	assert_true(s.p == 0);
	s = st(p, GPU);
	assert_int_equal(s.b1, 1);
	kvfs_policy_remove(p, DRAM, &b);
	s = st(p, DRAM);
	assert_int_equal(s.b1, 1);
	assert_ptr_equal(request(p, GPU, &b), &c); /* GPU's B1 hit */
	s = st(p, GPU);
	assert_int_equal(s.t2, 2);
	assert_int_equal(s.b1, 1);
	assert_true(s.p == 1);
	s = st(p, DRAM);
	assert_true(s.p == 0);
	kvfs_policy_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_introspection_rejects),
		cmocka_unit_test(test_hand_unit),
		cmocka_unit_test(test_hand_trim),
		cmocka_unit_test(test_hand_sizes),
		cmocka_unit_test(test_property_unit),
		cmocka_unit_test(test_property_sizes),
		cmocka_unit_test(test_leaf_rule),
		cmocka_unit_test(test_filter_fallback),
		cmocka_unit_test(test_per_tier),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
