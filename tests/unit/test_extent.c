/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tier/extent.h"
#include "meta/log.h"

#define A 4096u
#define BASE (1u << 20)

/* Sorted, never adjacent or overlapping, inside the map, sums to free. */
static void check_shape(const struct kvfs_extent_map *m)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < m->n; i++) {
		assert_true(m->r[i].len > 0);
		assert_int_equal(m->r[i].off % m->align, 0);
		assert_int_equal(m->r[i].len % m->align, 0);
		assert_true(m->r[i].off >= m->base);
		assert_true(m->r[i].off + m->r[i].len <= m->base + m->size);
		if (i)
			assert_true(m->r[i - 1].off + m->r[i - 1].len <
				    m->r[i].off);
		sum += m->r[i].len;
	}
	assert_int_equal(sum, m->free_bytes);
}

static void test_init_bad(void **state)
{
	struct kvfs_extent_map m;

	assert_int_equal(kvfs_extent_init(&m, 0, 10 * A, 0), -EINVAL);
	assert_int_equal(kvfs_extent_init(&m, 0, 10 * A, 3000), -EINVAL);
	assert_int_equal(kvfs_extent_init(&m, 100, 10 * A, A), -EINVAL);
	assert_int_equal(kvfs_extent_init(&m, 0, 10 * A + 1, A), -EINVAL);
	assert_int_equal(kvfs_extent_init(&m, UINT64_MAX - A + 1, 2 * A, A),
			 -EINVAL);
	assert_int_equal(kvfs_extent_init(&m, BASE, 10 * A, A), 0);
	assert_int_equal(m.free_bytes, 10 * A);
	assert_int_equal(m.n, 1);
	assert_int_equal(kvfs_extent_largest(&m), 10 * A);
	kvfs_extent_release(&m);
	kvfs_extent_release(&m); /* twice is harmless */
}

static void test_alloc_rounds_and_advances(void **state)
{
	struct kvfs_extent_map m;
	uint64_t a, b, c;

	assert_int_equal(kvfs_extent_init(&m, BASE, 16 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 1, &a), 0);
	assert_int_equal(a, BASE);
	assert_int_equal(m.free_bytes, 15 * A);
	assert_int_equal(kvfs_extent_alloc(&m, A + 1, &b), 0);
	assert_int_equal(b, BASE + A);
	assert_int_equal(kvfs_extent_alloc(&m, A, &c), 0);
	assert_int_equal(c, BASE + 3 * A);
	assert_int_equal(m.free_bytes, 12 * A);
	assert_int_equal(kvfs_extent_alloc(&m, 0, &c), -EINVAL);
	check_shape(&m);
	kvfs_extent_release(&m);
}

static void test_free_merges(void **state)
{
	struct kvfs_extent_map m;
	uint64_t a, b, c;

	assert_int_equal(kvfs_extent_init(&m, BASE, 3 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, A, &a), 0);
	assert_int_equal(kvfs_extent_alloc(&m, A, &b), 0);
	assert_int_equal(kvfs_extent_alloc(&m, A, &c), 0);
	assert_int_equal(m.n, 0);
	assert_int_equal(kvfs_extent_largest(&m), 0);

	/* Isolated hole, then a merge with the previous range... */
	assert_int_equal(kvfs_extent_free(&m, a, A), 0);
	assert_int_equal(m.n, 1);
	assert_int_equal(kvfs_extent_free(&m, c, A), 0);
	assert_int_equal(m.n, 2);
	check_shape(&m);
	/* ...and the middle one joins both sides into one range. */
	assert_int_equal(kvfs_extent_free(&m, b, A), 0);
	assert_int_equal(m.n, 1);
	assert_int_equal(m.r[0].off, BASE);
	assert_int_equal(m.r[0].len, 3 * A);
	assert_int_equal(kvfs_extent_largest(&m), 3 * A);

	/* Merge with the next range only. */
	assert_int_equal(kvfs_extent_alloc(&m, 3 * A, &a), 0);
	assert_int_equal(kvfs_extent_free(&m, BASE + 2 * A, A), 0);
	assert_int_equal(kvfs_extent_free(&m, BASE + A, A), 0);
	assert_int_equal(m.n, 1);
	assert_int_equal(m.r[0].off, BASE + A);
	assert_int_equal(m.r[0].len, 2 * A);
	check_shape(&m);
	kvfs_extent_release(&m);
}

static void test_first_fit(void **state)
{
	struct kvfs_extent_map m;
	uint64_t off;

	assert_int_equal(kvfs_extent_init(&m, BASE, 20 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 20 * A, &off), 0);
	/* Holes: 2 units at 1, 4 units at 5, 3 units at 12. */
	assert_int_equal(kvfs_extent_free(&m, BASE + 1 * A, 2 * A), 0);
	assert_int_equal(kvfs_extent_free(&m, BASE + 5 * A, 4 * A), 0);
	assert_int_equal(kvfs_extent_free(&m, BASE + 12 * A, 3 * A), 0);
	check_shape(&m);

	/* 3 units skip the 2-unit hole and take the head of the 4-unit one. */
	assert_int_equal(kvfs_extent_alloc(&m, 3 * A, &off), 0);
	assert_int_equal(off, BASE + 5 * A);
	/* 2 units: the lowest hole that fits. */
	assert_int_equal(kvfs_extent_alloc(&m, 2 * A, &off), 0);
	assert_int_equal(off, BASE + 1 * A);
	/* 1 unit: what remains of the 4-unit hole. */
	assert_int_equal(kvfs_extent_alloc(&m, A, &off), 0);
	assert_int_equal(off, BASE + 8 * A);
	/* 3 free units remain, contiguous. */
	assert_int_equal(kvfs_extent_alloc(&m, 4 * A, &off), -ENOSPC);
	assert_int_equal(kvfs_extent_alloc(&m, 3 * A, &off), 0);
	assert_int_equal(off, BASE + 12 * A);
	assert_int_equal(m.free_bytes, 0);
	kvfs_extent_release(&m);
}

static void test_claim(void **state)
{
	struct kvfs_extent_map m;
	uint64_t off;

	assert_int_equal(kvfs_extent_init(&m, BASE, 10 * A, A), 0);
	/* Split in the middle. */
	assert_int_equal(kvfs_extent_claim(&m, BASE + 4 * A, 2 * A), 0);
	assert_int_equal(m.n, 2);
	assert_int_equal(m.free_bytes, 8 * A);
	check_shape(&m);
	/* Overlapping a used range, partly or wholly. */
	assert_int_equal(kvfs_extent_claim(&m, BASE + 3 * A, 2 * A), -EEXIST);
	assert_int_equal(kvfs_extent_claim(&m, BASE + 5 * A, 2 * A), -EEXIST);
	assert_int_equal(kvfs_extent_claim(&m, BASE + 4 * A, A), -EEXIST);
	assert_int_equal(kvfs_extent_claim(&m, BASE + 2 * A, 6 * A), -EEXIST);
	/* Head and tail of a range. */
	assert_int_equal(kvfs_extent_claim(&m, BASE, A), 0);
	assert_int_equal(kvfs_extent_claim(&m, BASE + 9 * A, A), 0);
	assert_int_equal(m.free_bytes, 6 * A);
	check_shape(&m);
	/* Bad arguments. */
	assert_int_equal(kvfs_extent_claim(&m, BASE + 1, A), -EINVAL);
	assert_int_equal(kvfs_extent_claim(&m, BASE + A, 100), -EINVAL);
	assert_int_equal(kvfs_extent_claim(&m, BASE + A, 0), -EINVAL);
	assert_int_equal(kvfs_extent_claim(&m, BASE - A, A), -EINVAL);
	assert_int_equal(kvfs_extent_claim(&m, BASE + 9 * A, 2 * A), -EINVAL);
	assert_int_equal(m.free_bytes, 6 * A);

	/* Allocations never land on claimed ranges. */
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvfs_extent_alloc(&m, A, &off), 0);
		assert_false(off == BASE || off == BASE + 9 * A ||
			     off == BASE + 4 * A || off == BASE + 5 * A);
	}
	assert_int_equal(kvfs_extent_alloc(&m, A, &off), -ENOSPC);
	/* An exactly matching free range disappears. */
	assert_int_equal(kvfs_extent_free(&m, BASE + 2 * A, A), 0);
	assert_int_equal(kvfs_extent_claim(&m, BASE + 2 * A, A), 0);
	assert_int_equal(m.n, 0);
	kvfs_extent_release(&m);
}

static void test_double_free(void **state)
{
	struct kvfs_extent_map m;
	uint64_t a, b;

	assert_int_equal(kvfs_extent_init(&m, BASE, 8 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 2 * A, &a), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 2 * A, &b), 0);
	assert_int_equal(kvfs_extent_free(&m, a, 2 * A), 0);
	assert_int_equal(kvfs_extent_free(&m, a, 2 * A), -EEXIST);
	/* Partly free on either side. */
	assert_int_equal(kvfs_extent_free(&m, a + A, 2 * A), -EEXIST);
	assert_int_equal(kvfs_extent_free(&m, b + A, 2 * A), -EEXIST);
	/* Covering a used range and free ones. */
	assert_int_equal(kvfs_extent_free(&m, a, 8 * A), -EEXIST);
	assert_int_equal(m.free_bytes, 6 * A);
	check_shape(&m);
	assert_int_equal(kvfs_extent_free(&m, b, 2 * A), 0);
	assert_int_equal(m.free_bytes, 8 * A);
	assert_int_equal(m.n, 1);
	kvfs_extent_release(&m);
}

static void test_enospc(void **state)
{
	struct kvfs_extent_map m;
	uint64_t off;

	assert_int_equal(kvfs_extent_init(&m, BASE, 4 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 5 * A, &off), -ENOSPC);
	assert_int_equal(kvfs_extent_alloc(&m, UINT64_MAX, &off), -ENOSPC);
	for (int i = 0; i < 4; i++)
		assert_int_equal(kvfs_extent_alloc(&m, A, &off), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 1, &off), -ENOSPC);
	/* Two free units, but not contiguous. */
	assert_int_equal(kvfs_extent_free(&m, BASE, A), 0);
	assert_int_equal(kvfs_extent_free(&m, BASE + 2 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 2 * A, &off), -ENOSPC);
	assert_int_equal(kvfs_extent_largest(&m), A);
	kvfs_extent_release(&m);

	/* An empty map is legal and always full. */
	assert_int_equal(kvfs_extent_init(&m, BASE, 0, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, A, &off), -ENOSPC);
	kvfs_extent_release(&m);
}

static void test_unaligned(void **state)
{
	struct kvfs_extent_map m;
	uint64_t a;

	assert_int_equal(kvfs_extent_init(&m, BASE, 8 * A, A), 0);
	assert_int_equal(kvfs_extent_alloc(&m, 8 * A, &a), 0);
	assert_int_equal(kvfs_extent_free(&m, a + 1, A), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, a, A - 1), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, a, 0), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, BASE - A, A), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, BASE + 8 * A, A), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, BASE + 7 * A, 2 * A), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, UINT64_MAX - A + 1, A), -EINVAL);
	assert_int_equal(kvfs_extent_free(&m, BASE + A, UINT64_MAX - A + 1),
			 -EINVAL);
	assert_int_equal(m.free_bytes, 0);
	assert_int_equal(m.n, 0);
	kvfs_extent_release(&m);
}

/* The model: one bool per unit, true when free. */
#define NU 512

static bool model_all(const bool *fr, size_t u, size_t n, bool v)
{
	for (size_t i = u; i < u + n; i++)
		if (fr[i] != v)
			return false;
	return true;
}

/* First-fit answer of the model: lowest start of a free run of @n units. */
static long model_first_fit(const bool *fr, size_t n)
{
	size_t run = 0;

	for (size_t i = 0; i < NU; i++) {
		run = fr[i] ? run + 1 : 0;
		if (run == n)
			return (long)(i + 1 - n);
	}
	return -1;
}

static void check_against_model(const struct kvfs_extent_map *m,
				const bool *fr)
{
	bool seen[NU] = { false };
	size_t nfree = 0;

	check_shape(m);
	for (size_t i = 0; i < m->n; i++)
		for (uint64_t o = m->r[i].off; o < m->r[i].off + m->r[i].len;
		     o += A) {
			size_t u = (size_t)((o - BASE) / A);

			assert_true(fr[u]);
			assert_false(seen[u]);
			seen[u] = true;
		}
	for (size_t u = 0; u < NU; u++) {
		assert_int_equal(seen[u], fr[u]);
		nfree += fr[u];
	}
	assert_int_equal(m->free_bytes, nfree * A);
}

/* Frees of what was handed out never grow the range array: alloc and
 * claim reserved the slot, so a free cannot fail for lack of memory, even
 * at the worst fragmentation (every other range freed).
 */
static void test_free_needs_no_memory(void **state)
{
	enum { K = 200 };
	struct kvfs_extent_map m;
	uint64_t off[K];
	size_t cap;

	assert_int_equal(kvfs_extent_init(&m, BASE, 2 * K * (uint64_t)A, A),
			 0);
	for (int i = 0; i < K; i++)
		assert_int_equal(kvfs_extent_alloc(&m, A, &off[i]), 0);
	/* Claimed ranges count too: the second half of the map. */
	for (int i = 0; i < K; i++)
		assert_int_equal(kvfs_extent_claim(&m, BASE + (uint64_t)(K + i) *
							 A, A), 0);
	cap = m.cap;
	assert_true(cap >= 2 * K + 1);
	for (int i = 0; i < K; i += 2)
		assert_int_equal(kvfs_extent_free(&m, off[i], A), 0);
	for (int i = K + 1; i < 2 * K; i += 2)
		assert_int_equal(kvfs_extent_free(&m, BASE + (uint64_t)i * A,
						  A), 0);
	assert_int_equal(m.n, K);
	assert_int_equal(m.cap, cap);
	for (int i = 1; i < K; i += 2)
		assert_int_equal(kvfs_extent_free(&m, off[i], A), 0);
	for (int i = K; i < 2 * K; i += 2)
		assert_int_equal(kvfs_extent_free(&m, BASE + (uint64_t)i * A,
						  A), 0);
	assert_int_equal(m.cap, cap);
	assert_int_equal(m.n, 1);
	assert_int_equal(m.free_bytes, 2 * K * (uint64_t)A);
	assert_int_equal(m.n_used, 0);
	kvfs_extent_release(&m);
}

static void test_random_vs_bitmap(void **state)
{
	struct kvfs_extent_map m;
	bool fr[NU];
	unsigned seed = 12345;
	unsigned ok[3] = { 0 }, refused[3] = { 0 };

	/* The double frees and overlaps below are expected: keep quiet. */
	kvfs_log_set_level(-1);
	assert_int_equal(kvfs_extent_init(&m, BASE, NU * (uint64_t)A, A), 0);
	for (size_t u = 0; u < NU; u++)
		fr[u] = true;

	for (int step = 0; step < 20000; step++) {
		unsigned op = (unsigned)rand_r(&seed) % 3;
		size_t n = 1 + (size_t)rand_r(&seed) % 24;
		size_t u = (size_t)rand_r(&seed) % (NU - n + 1);
		uint64_t off;
		int err;

		if (op == 0) {
			long want = model_first_fit(fr, n);
			/* Lengths that are not multiples of A round up. */
			uint64_t len = n * (uint64_t)A - (rand_r(&seed) % A);

			err = kvfs_extent_alloc(&m, len, &off);
			if (want < 0) {
				assert_int_equal(err, -ENOSPC);
			} else {
				assert_int_equal(err, 0);
				assert_int_equal(off,
						 BASE + (uint64_t)want * A);
				for (size_t i = 0; i < n; i++)
					fr[(size_t)want + i] = false;
			}
		} else if (op == 1) {
			bool used = model_all(fr, u, n, false);

			err = kvfs_extent_free(&m, BASE + u * (uint64_t)A,
					       n * (uint64_t)A);
			assert_int_equal(err, used ? 0 : -EEXIST);
			if (used)
				for (size_t i = u; i < u + n; i++)
					fr[i] = true;
		} else {
			bool isfree = model_all(fr, u, n, true);

			err = kvfs_extent_claim(&m, BASE + u * (uint64_t)A,
						n * (uint64_t)A);
			assert_int_equal(err, isfree ? 0 : -EEXIST);
			if (isfree)
				for (size_t i = u; i < u + n; i++)
					fr[i] = false;
		}
		if (err)
			refused[op]++;
		else
			ok[op]++;
		check_against_model(&m, fr);
	}
	/* The walk must have exercised every outcome of every call. */
	for (int i = 0; i < 3; i++) {
		assert_true(ok[i] >= 100);
		assert_true(refused[i] >= 100);
	}
	kvfs_log_set_level(KVFS_LOG_INFO);
	kvfs_extent_release(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_bad),
		cmocka_unit_test(test_free_needs_no_memory),
		cmocka_unit_test(test_alloc_rounds_and_advances),
		cmocka_unit_test(test_free_merges),
		cmocka_unit_test(test_first_fit),
		cmocka_unit_test(test_claim),
		cmocka_unit_test(test_double_free),
		cmocka_unit_test(test_enospc),
		cmocka_unit_test(test_unaligned),
		cmocka_unit_test(test_random_vs_bitmap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
