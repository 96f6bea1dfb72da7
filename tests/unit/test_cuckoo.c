// SPDX-License-Identifier: MIT
/* Unit tests for the hotness-aware cuckoo filter (cache/cuckoo.h). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cache/cuckoo.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void make_key(uint8_t key[16], uint64_t i)
{
	uint64_t a = i * 0x9e3779b97f4a7c15ull + 1, b = ~i;

	memcpy(key, &a, 8);
	memcpy(key + 8, &b, 8);
}

static struct kvfs_cuckoo *mk(uint64_t buckets, uint32_t overflow,
			      uint8_t max_age, unsigned flags)
{
	struct kvfs_cuckoo_conf cc = {
		.buckets = buckets,
		.overflow = overflow,
		.max_age = max_age,
		.seed = 42,
		.flags = flags,
	};
	struct kvfs_cuckoo *c = NULL;

	assert_int_equal(kvfs_cuckoo_init(&cc, &c), 0);
	assert_non_null(c);
	return c;
}

static void test_bad_conf(void **state)
{
	struct kvfs_cuckoo_conf cc = { .buckets = 3, .max_age = 15 };
	struct kvfs_cuckoo *c = (void *)1;

	assert_int_equal(kvfs_cuckoo_init(&cc, &c), -EINVAL);
	assert_null(c);
	cc.buckets = 0;
	assert_int_equal(kvfs_cuckoo_init(&cc, &c), -EINVAL);
	cc.buckets = 4;
	cc.max_age = 0;
	assert_int_equal(kvfs_cuckoo_init(&cc, &c), -EINVAL);
}

static void test_insert_lookup(void **state)
{
	struct kvfs_cuckoo *c = mk(1024, 8, 255, 0);
	struct kvfs_cuckoo_rec r;
	uint8_t k[16], other[16];
	uint64_t b1, b2;
	uint8_t fp;

	make_key(k, 1);
	make_key(other, 2);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), -ENOENT);
	assert_int_equal(kvfs_cuckoo_insert(c, k, 7), 0);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	assert_int_equal(r.clock, 255);
	assert_int_equal(r.freq, 1);
	assert_int_equal(r.depth, 7);
	/* re-inserting finds the record and leaves it alone */
	assert_int_equal(kvfs_cuckoo_touch(c, k, NULL), 0);
	assert_int_equal(kvfs_cuckoo_insert(c, k, 9), 1);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	assert_int_equal(r.freq, 2);
	assert_int_equal(r.depth, 7);
	/* standard cuckoo math: two distinct buckets, alt(alt(b)) = b */
	assert_int_equal(kvfs_cuckoo_buckets_of(c, k, &b1, &b2, &fp), 0);
	assert_int_not_equal(b1, b2);
	assert_int_not_equal(fp, 0);
	assert_true(b1 < 1024 && b2 < 1024);
	assert_int_equal(kvfs_cuckoo_lookup(c, other, &r), -ENOENT);
	kvfs_cuckoo_free(c);
}

/* HotPrefix Fig. 4: max_age 15; clock 9, freq 5 -> reuse -> 15, 6. */
static void test_fig4_update(void **state)
{
	struct kvfs_cuckoo *c = mk(64, 0, 15, 0);
	struct kvfs_cuckoo_rec r;
	uint8_t k[16];

	make_key(k, 77);
	assert_int_equal(kvfs_cuckoo_insert(c, k, 2), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(kvfs_cuckoo_touch(c, k, NULL), 0);
	for (int i = 0; i < 6; i++)
		kvfs_cuckoo_age(c);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	assert_int_equal(r.clock, 9);
	assert_int_equal(r.freq, 5);
	assert_int_equal(kvfs_cuckoo_touch(c, k, &r), 0);
	assert_int_equal(r.clock, 15);
	assert_int_equal(r.freq, 6);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	assert_int_equal(r.clock, 15);
	assert_int_equal(r.freq, 6);
	kvfs_cuckoo_free(c);
}

static void test_saturation(void **state)
{
	struct kvfs_cuckoo *c = mk(64, 0, 15, 0);
	struct kvfs_cuckoo_rec r;
	uint8_t k[16];

	make_key(k, 5);
	assert_int_equal(kvfs_cuckoo_insert(c, k, 1000), 0);
	for (int i = 0; i < 300; i++)
		kvfs_cuckoo_touch(c, k, NULL);
	for (int i = 0; i < 20; i++)
		kvfs_cuckoo_age(c);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	assert_int_equal(r.freq, 255);
	assert_int_equal(r.clock, 0);
	assert_int_equal(r.depth, 255);
	/* set clamps the clock to max_age */
	r.clock = 200;
	r.freq = 3;
	assert_int_equal(kvfs_cuckoo_set(c, k, &r), 0);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	assert_int_equal(r.clock, 15);
	assert_int_equal(r.freq, 3);
	kvfs_cuckoo_free(c);
}

static void test_delete(void **state)
{
	struct kvfs_cuckoo *c = mk(256, 4, 255, 0);
	struct kvfs_cuckoo_stats st;
	struct kvfs_cuckoo_rec r;
	uint8_t k[16], k2[16];

	make_key(k, 10);
	make_key(k2, 11);
	assert_int_equal(kvfs_cuckoo_delete(c, k), -ENOENT);
	assert_int_equal(kvfs_cuckoo_insert(c, k, 1), 0);
	assert_int_equal(kvfs_cuckoo_insert(c, k2, 2), 0);
	assert_int_equal(kvfs_cuckoo_delete(c, k), 0);
	assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), -ENOENT);
	assert_int_equal(kvfs_cuckoo_touch(c, k, NULL), -ENOENT);
	assert_int_equal(kvfs_cuckoo_delete(c, k), -ENOENT);
	assert_int_equal(kvfs_cuckoo_lookup(c, k2, &r), 0);
	assert_int_equal(r.depth, 2);
	kvfs_cuckoo_get_stats(c, &st);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.deletes, 1);
	kvfs_cuckoo_free(c);
}

/*
 * Fill a small filter to 90%: inserts must kick entries around, and every
 * record must follow its entry (depth tags each key).
 */
static void test_kicks_keep_records(void **state)
{
	enum { NB = 64, N = NB * KVFS_CUCKOO_SLOTS * 9 / 10 };
	struct kvfs_cuckoo *c = mk(NB, 0, 255, 0);
	struct kvfs_cuckoo_stats st;
	struct kvfs_cuckoo_rec r;
	static uint8_t keys[N][16];
	static bool own[N];
	int owned = 0;

	for (int i = 0; i < N; i++) {
		int ret;

		make_key(keys[i], 1000 + i);
		ret = kvfs_cuckoo_insert(c, keys[i], 0);
		assert_true(ret == 0 || ret == 1);
		own[i] = ret == 0;
		if (own[i]) {
			r.clock = 255;
			r.freq = (uint8_t)(1 + i % 200);
			r.depth = (uint8_t)(i % 251);
			assert_int_equal(kvfs_cuckoo_set(c, keys[i], &r), 0);
			owned++;
		}
	}
	kvfs_cuckoo_get_stats(c, &st);
	assert_true(st.kicks > 0);
	assert_int_equal(st.failed, 0);
	assert_int_equal(st.entries, (uint64_t)owned);
	assert_true(owned > N - 10); /* 8-bit fingerprints: a few share */
	for (int i = 0; i < N; i++) {
		if (!own[i])
			continue;
		assert_int_equal(kvfs_cuckoo_lookup(c, keys[i], &r), 0);
		assert_int_equal(r.depth, i % 251);
		assert_int_equal(r.freq, 1 + i % 200);
	}
	kvfs_cuckoo_free(c);
}

/* Same seed, same operations: the same kicks. */
static void test_deterministic(void **state)
{
	struct kvfs_cuckoo_stats a, b;
	struct kvfs_cuckoo *c1 = mk(32, 0, 255, 0), *c2 = mk(32, 0, 255, 0);
	uint8_t k[16];

	for (int i = 0; i < 120; i++) {
		make_key(k, 5000 + i);
		assert_int_equal(kvfs_cuckoo_insert(c1, k, 0),
				 kvfs_cuckoo_insert(c2, k, 0));
	}
	kvfs_cuckoo_get_stats(c1, &a);
	kvfs_cuckoo_get_stats(c2, &b);
	assert_true(a.kicks > 0);
	assert_int_equal(a.kicks, b.kicks);
	assert_int_equal(a.entries, b.entries);
	kvfs_cuckoo_free(c1);
	kvfs_cuckoo_free(c2);
}

/* Find @n keys with pairwise distinct fingerprints in @c. */
static void distinct_fp_keys(struct kvfs_cuckoo *c, uint8_t (*keys)[16],
			     int n, uint64_t base)
{
	bool used[256] = { false };
	int got = 0;

	for (uint64_t i = base; got < n; i++) {
		uint64_t b1, b2;
		uint8_t fp;

		make_key(keys[got], i);
		assert_int_equal(kvfs_cuckoo_buckets_of(c, keys[got], &b1, &b2,
							&fp), 0);
		if (used[fp])
			continue;
		used[fp] = true;
		got++;
	}
}

/* A one-bucket filter: 4 slots, then the overflow list, then -ENOSPC. */
static void test_full_fallback(void **state)
{
	struct kvfs_cuckoo *c = mk(1, 2, 255, 0);
	struct kvfs_cuckoo_stats st;
	struct kvfs_cuckoo_rec r;
	uint8_t keys[8][16];

	distinct_fp_keys(c, keys, 8, 100);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvfs_cuckoo_insert(c, keys[i], (uint32_t)i),
				 0);
		r.clock = 255;
		r.freq = (uint8_t)(10 + i);
		r.depth = (uint8_t)i;
		assert_int_equal(kvfs_cuckoo_set(c, keys[i], &r), 0);
	}
	kvfs_cuckoo_get_stats(c, &st);
	assert_int_equal(st.overflowed, 2);
	assert_int_equal(st.overflow_used, 2);
	assert_int_equal(st.entries, 6);

	/* full: refused, and the undone kicks lost no record */
	assert_int_equal(kvfs_cuckoo_insert(c, keys[6], 6), -ENOSPC);
	kvfs_cuckoo_get_stats(c, &st);
	assert_int_equal(st.failed, 1);
	assert_int_equal(st.entries, 6);
	assert_int_equal(kvfs_cuckoo_lookup(c, keys[6], &r), -ENOENT);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvfs_cuckoo_lookup(c, keys[i], &r), 0);
		assert_int_equal(r.freq, 10 + i);
		assert_int_equal(r.depth, i);
	}
	/* aging reaches the overflow list too */
	kvfs_cuckoo_age(c);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvfs_cuckoo_lookup(c, keys[i], &r), 0);
		assert_int_equal(r.clock, 254);
	}

	/*
	 * Deletes free bucket slots or overflow entries; either way the
	 * overflow list holds only what the bucket cannot.
	 */
	for (int i = 0; i < 6; i++) {
		assert_int_equal(kvfs_cuckoo_delete(c, keys[i]), 0);
		kvfs_cuckoo_get_stats(c, &st);
		assert_int_equal(st.entries, 5 - i);
		assert_int_equal(st.overflow_used,
				 st.entries > 4 ? st.entries - 4 : 0);
		for (int j = i + 1; j < 6; j++) {
			assert_int_equal(kvfs_cuckoo_lookup(c, keys[j], &r), 0);
			assert_int_equal(r.depth, j);
		}
		if (i == 0) {
			/* room again: the refused key now fits */
			assert_int_equal(kvfs_cuckoo_insert(c, keys[6], 6), 0);
			assert_int_equal(kvfs_cuckoo_delete(c, keys[6]), 0);
		}
	}
	kvfs_cuckoo_free(c);
}

/* Without an overflow list the fifth key of a one-bucket filter fails. */
static void test_full_no_overflow(void **state)
{
	struct kvfs_cuckoo *c = mk(1, 0, 255, 0);
	struct kvfs_cuckoo_rec r;
	uint8_t keys[5][16];

	distinct_fp_keys(c, keys, 5, 300);
	for (int i = 0; i < 4; i++)
		assert_int_equal(kvfs_cuckoo_insert(c, keys[i], (uint32_t)i),
				 0);
	assert_int_equal(kvfs_cuckoo_insert(c, keys[4], 4), -ENOSPC);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(kvfs_cuckoo_lookup(c, keys[i], &r), 0);
		assert_int_equal(r.depth, i);
	}
	kvfs_cuckoo_free(c);
}

/* Two keys with one fingerprint and one bucket pair share a record. */
static void test_collision_shares(void **state)
{
	struct kvfs_cuckoo *c = mk(1, 0, 255, 0);
	struct kvfs_cuckoo_rec r;
	uint8_t a[16], b[16];
	uint64_t b1, b2;
	uint8_t fa, fb;

	make_key(a, 1);
	kvfs_cuckoo_buckets_of(c, a, &b1, &b2, &fa);
	for (uint64_t i = 2;; i++) {
		make_key(b, i);
		kvfs_cuckoo_buckets_of(c, b, &b1, &b2, &fb);
		if (fb == fa)
			break;
	}
	assert_int_equal(kvfs_cuckoo_insert(c, a, 3), 0);
	assert_int_equal(kvfs_cuckoo_insert(c, b, 4), 1);
	assert_int_equal(kvfs_cuckoo_touch(c, b, NULL), 0);
	assert_int_equal(kvfs_cuckoo_lookup(c, a, &r), 0);
	assert_int_equal(r.freq, 2);
	assert_int_equal(r.depth, 3);
	/* the exact table keeps them apart */
	{
		struct kvfs_cuckoo *x = mk(0, 0, 255, KVFS_CUCKOO_EXACT);

		assert_int_equal(kvfs_cuckoo_insert(x, a, 3), 0);
		assert_int_equal(kvfs_cuckoo_insert(x, b, 4), 0);
		assert_int_equal(kvfs_cuckoo_touch(x, b, NULL), 0);
		assert_int_equal(kvfs_cuckoo_lookup(x, a, &r), 0);
		assert_int_equal(r.freq, 1);
		assert_int_equal(kvfs_cuckoo_buckets_of(x, a, &b1, &b2, &fa),
				 -EINVAL);
		kvfs_cuckoo_free(x);
	}
	kvfs_cuckoo_free(c);
}

/* Exact table: growth, backward-shift deletes, no lost keys. */
static void test_exact_table(void **state)
{
	enum { N = 20000 };
	struct kvfs_cuckoo *x = mk(0, 0, 100, KVFS_CUCKOO_EXACT);
	struct kvfs_cuckoo_stats st;
	struct kvfs_cuckoo_rec r;
	uint8_t k[16];

	rng_state = 7;
	for (int i = 0; i < N; i++) {
		make_key(k, (uint64_t)i);
		assert_int_equal(kvfs_cuckoo_insert(x, k, (uint32_t)(i % 200)),
				 0);
	}
	for (int i = 0; i < N; i += 2) {
		make_key(k, (uint64_t)i);
		assert_int_equal(kvfs_cuckoo_delete(x, k), 0);
	}
	kvfs_cuckoo_age(x);
	for (int i = 0; i < N; i++) {
		make_key(k, (uint64_t)i);
		if (i % 2 == 0) {
			assert_int_equal(kvfs_cuckoo_lookup(x, k, &r),
					 -ENOENT);
			continue;
		}
		assert_int_equal(kvfs_cuckoo_lookup(x, k, &r), 0);
		assert_int_equal(r.depth, i % 200);
		assert_int_equal(r.clock, 99);
	}
	kvfs_cuckoo_get_stats(x, &st);
	assert_int_equal(st.entries, N / 2);
	assert_true(st.slots >= N);
	/* random churn against a shadow bitmap */
	{
		static bool in[4096];

		memset(in, 0, sizeof(in));
		for (int i = 0; i < 100000; i++) {
			uint64_t v = rnd() % 4096;

			make_key(k, 1000000 + v);
			if (in[v]) {
				assert_int_equal(kvfs_cuckoo_delete(x, k), 0);
				in[v] = false;
			} else {
				assert_int_equal(kvfs_cuckoo_insert(x, k, 0),
						 0);
				in[v] = true;
			}
		}
		for (uint64_t v = 0; v < 4096; v++) {
			make_key(k, 1000000 + v);
			assert_int_equal(kvfs_cuckoo_lookup(x, k, &r),
					 in[v] ? 0 : -ENOENT);
		}
	}
	kvfs_cuckoo_free(x);
}

/* Churn on a filter: inserts and deletes against a shadow set. */
static void test_filter_churn(void **state)
{
	enum { U = 600 };
	struct kvfs_cuckoo *c = mk(256, 16, 255, 0);
	struct kvfs_cuckoo_stats st;
	struct kvfs_cuckoo_rec r;
	static bool in[U];
	uint8_t k[16];
	int n = 0;

	memset(in, 0, sizeof(in));
	rng_state = 99;
	for (int i = 0; i < 50000; i++) {
		uint64_t v = rnd() % U;
		int ret;

		make_key(k, 777000 + v);
		if (in[v]) {
			assert_int_equal(kvfs_cuckoo_delete(c, k), 0);
			in[v] = false;
			n--;
			continue;
		}
		ret = kvfs_cuckoo_insert(c, k, (uint32_t)(v % 256));
		assert_true(ret == 0 || ret == 1);
		if (ret == 0) {
			in[v] = true;
			n++;
		}
	}
	kvfs_cuckoo_get_stats(c, &st);
	assert_int_equal(st.entries, (uint64_t)n);
	assert_int_equal(st.failed, 0);
	for (uint64_t v = 0; v < U; v++) {
		make_key(k, 777000 + v);
		if (in[v])
			assert_int_equal(kvfs_cuckoo_lookup(c, k, &r), 0);
	}
	kvfs_cuckoo_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_conf),
		cmocka_unit_test(test_insert_lookup),
		cmocka_unit_test(test_fig4_update),
		cmocka_unit_test(test_saturation),
		cmocka_unit_test(test_delete),
		cmocka_unit_test(test_kicks_keep_records),
		cmocka_unit_test(test_deterministic),
		cmocka_unit_test(test_full_fallback),
		cmocka_unit_test(test_full_no_overflow),
		cmocka_unit_test(test_collision_shares),
		cmocka_unit_test(test_exact_table),
		cmocka_unit_test(test_filter_churn),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
