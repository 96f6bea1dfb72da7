// SPDX-License-Identifier: MIT
/*
 * Unit tests for the FIFO-family baselines, s3fifo (Yang et al., SOSP '23)
 * and sieve (Zhang et al., NSDI '24), and the ghost queue they rest on
 * (policy_util.c): each checks a policy's defining behaviour on a small
 * hand-made sequence.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cache/policy.h"
#include "cache/policy_i.h"

#define GPU KVFS_TIER_GPU

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

static struct kvfs_policy *mk(const char *name, uint64_t cap0)
{
	uint64_t cap[KVFS_NTIERS] = { cap0, 0, 0 };
	struct kvfs_policy *p = NULL;

	assert_int_equal(kvfs_policy_new(name, NULL, NULL, 0, cap, &p), 0);
	return p;
}

static struct kvfs_paccess req(uint64_t r)
{
	return (struct kvfs_paccess){ .now = r, .request = r };
}

static void touch(struct kvfs_policy *p, struct kvfs_pnode *n, uint64_t r)
{
	struct kvfs_pnode *path[1] = { n };
	struct kvfs_paccess a = req(r);

	a.hit = true;
	kvfs_policy_access(p, path, 1, &a);
}

/* Victim, removed from the tier; its index in @n. */
static long evict(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	struct kvfs_pnode *v = kvfs_policy_victim(p, GPU, NULL, NULL);

	if (!v)
		return -1;
	kvfs_policy_remove(p, GPU, v);
	return v - n;
}

static void test_ghost_queue(void **state)
{
	struct kvfs_pghost g;
	uint8_t k[4][16] = { { 1 }, { 2 }, { 3 }, { 4 } };

	assert_int_equal(kvfs_pghost_init(&g, 2), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(kvfs_pghost_add(&g, k[i], 1), 0);
	/* Bounded by size: the oldest (k0) is gone. */
	assert_false(kvfs_pghost_take(&g, k[0]));
	assert_true(kvfs_pghost_take(&g, k[1]));
	assert_false(kvfs_pghost_take(&g, k[1])); /* taken: forgotten */
	assert_true(kvfs_pghost_take(&g, k[2]));
	assert_int_equal(g.size, 0);
	for (int r = 0; r < 1000; r++)
		assert_int_equal(kvfs_pghost_add(&g, k[r % 4], 1), 0);
	assert_true(g.size <= 2);
	kvfs_pghost_release(&g);
}

/*
 * S3-FIFO: new blocks enter the small FIFO; one hit there moves a block to
 * main when it reaches the head; a block evicted from the small FIFO
 * leaves its key in the ghost, and comes back straight into main; main
 * gives a hit block one more pass.
 */
static void test_s3fifo(void **state)
{
	struct kvfs_policy *p = mk("s3fifo", 10);
	struct kvfs_pnode n[10];
	struct kvfs_paccess a;
	long want[] = { 2, 3, 4, 5, 6, 7, 8, 9, 1, 0 };

	for (int i = 0; i < 10; i++) {
		mknode(&n[i], 100 + i, NULL);
		a = req(i + 1);
		kvfs_policy_insert(p, GPU, &n[i], &a);
	}
	touch(p, &n[1], 20);
	/* S is full (10 >= 10% of 10): its head, unhit, goes to the ghost. */
	assert_int_equal(evict(p, n), 0);
	a = req(21);
	kvfs_policy_insert(p, GPU, &n[0], &a); /* a ghost hit: main */
	touch(p, &n[0], 22); /* one more pass in main */
	/* n1 was hit in S: it moves to main instead of going; then the
	 * rest of S in order; then main, where n0's hit buys it a pass.
	 */
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		assert_int_equal(evict(p, n), want[i]);
	assert_int_equal(p->count[GPU], 0);
	kvfs_policy_free(p);
}

/* S3-FIFO and sieve take leaves first: a chain loses its tail first. */
static void test_fifo_leaves(void **state)
{
	const char *names[] = { "s3fifo", "sieve" };

	for (int k = 0; k < 2; k++) {
		struct kvfs_policy *p = mk(names[k], 4);
		struct kvfs_pnode n[3];
		struct kvfs_paccess a = req(1);

		for (int i = 0; i < 3; i++) {
			mknode(&n[i], 200 + i, i ? &n[i - 1] : NULL);
			kvfs_policy_insert(p, GPU, &n[i], &a);
		}
		assert_int_equal(evict(p, n), 2);
		assert_int_equal(evict(p, n), 1);
		assert_int_equal(evict(p, n), 0);
		kvfs_policy_free(p);
	}
}

/*
 * SIEVE: a hit sets a bit and moves nothing; the hand, from the oldest
 * towards the newest, clears set bits and takes the first clear block,
 * then stays where it stopped (so a new block can go before an old
 * visited one: quick demotion).
 */
static void test_sieve(void **state)
{
	struct kvfs_policy *p = mk("sieve", 4);
	struct kvfs_pnode n[6];
	struct kvfs_paccess a;

	for (int i = 0; i < 6; i++)
		mknode(&n[i], 300 + i, NULL);
	for (int i = 0; i < 4; i++) {
		a = req(i + 1);
		kvfs_policy_insert(p, GPU, &n[i], &a);
	}
	touch(p, &n[0], 10);
	touch(p, &n[2], 11);
	assert_int_equal(evict(p, n), 1); /* n0 visited: passed, cleared */
	a = req(12);
	kvfs_policy_insert(p, GPU, &n[4], &a);
	assert_int_equal(evict(p, n), 3); /* n2 passed, cleared */
	a = req(13);
	kvfs_policy_insert(p, GPU, &n[5], &a);
	assert_int_equal(evict(p, n), 4); /* the hand goes on: n4 */
	assert_int_equal(evict(p, n), 5);
	/* Wrapped: n0 and n2 lost their bits on the first turn. */
	assert_int_equal(evict(p, n), 0);
	assert_int_equal(evict(p, n), 2);
	kvfs_policy_free(p);
}

static bool not_n0(struct kvfs_pnode *x, void *arg)
{
	return x != arg;
}

/* The caller's filter: a refused block is passed over, not evicted. */
static void test_fifo_filter(void **state)
{
	const char *names[] = { "s3fifo", "sieve" };

	for (int k = 0; k < 2; k++) {
		struct kvfs_policy *p = mk(names[k], 4);
		struct kvfs_pnode n[2];
		struct kvfs_paccess a;

		for (int i = 0; i < 2; i++) {
			mknode(&n[i], 400 + i, NULL);
			a = req(i + 1);
			kvfs_policy_insert(p, GPU, &n[i], &a);
		}
		assert_ptr_equal(kvfs_policy_victim(p, GPU, not_n0, &n[0]),
				 &n[1]);
		/* s3fifo starts again at the head; sieve's hand stays at
		 * the block it chose, not yet removed.
		 */
		assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL),
				 k ? &n[1] : &n[0]);
		kvfs_policy_free(p);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ghost_queue),
		cmocka_unit_test(test_s3fifo),
		cmocka_unit_test(test_fifo_leaves),
		cmocka_unit_test(test_sieve),
		cmocka_unit_test(test_fifo_filter),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
