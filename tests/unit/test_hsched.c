/* SPDX-License-Identifier: MIT */
/*
 * Bubble-free schedule on synthetic profiles whose answer is worked out by
 * hand in each test's comment, plus a brute-force bound on random ones.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hcache/hsched.h"

static struct kvfs_hsched_profile prof(double ioh, double iokv, double ch,
				       double ctok)
{
	struct kvfs_hsched_profile p;

	memset(&p, 0, sizeof(p));
	p.io_hidden[KVFS_TIER_SSD] = ioh;
	p.io_kv[KVFS_TIER_SSD] = iokv;
	p.c_hidden = ch;
	p.c_token = ctok;
	return p;
}

/* Compute-bound, paper Table 3's 7B row shape: N = 32, IO_H = 1,
 * IO_KV = 2, C_H = 1.125: L_H = ceil(64 / 2.125) = ceil(30.12) = 31.
 * Hidden layers first: 0..30, KV: 31.
 */
static void test_kv_mode_7b(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 2, 1.125, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &pl), 0);
	assert_int_equal(pl.mode, KVFS_HSCHED_MODE_HIDDEN_KV);
	assert_int_equal(pl.n_hidden, 31);
	assert_int_equal(pl.n_kv, 1);
	assert_int_equal(pl.n_recompute, 0);
	for (uint32_t l = 0; l < 31; l++)
		assert_int_equal(kvfs_hsched_layer(&pl, l), KVFS_HSCHED_HIDDEN);
	assert_int_equal(kvfs_hsched_layer(&pl, 31), KVFS_HSCHED_KV);
	assert_int_equal(kvfs_hsched_layer(&pl, 32), 0);
	/* compute 31 * 1.125 = 34.875; I/O 31 + 2 = 33 */
	assert_true(fabs(pl.t_compute - 34.875) < 1e-12);
	assert_true(fabs(pl.t_io - 33.0) < 1e-12);
	assert_true(fabs(pl.t_total - 34.875) < 1e-12);
}

/* 13B row: N = 40, IO_H = 1, IO_KV = 2, C_H = 1.25:
 * L_H = ceil(80 / 2.25) = ceil(35.56) = 36, L_KV = 4.
 */
static void test_kv_mode_13b(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 2, 1.25, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 40, &pl), 0);
	assert_int_equal(pl.n_hidden, 36);
	assert_int_equal(pl.n_kv, 4);
	assert_int_equal(kvfs_hsched_layer(&pl, 35), KVFS_HSCHED_HIDDEN);
	assert_int_equal(kvfs_hsched_layer(&pl, 36), KVFS_HSCHED_KV);
}

/* I/O-bound with recompute, 30B row: N = 48, IO_H = 1, C_H = 0.5,
 * C_Token = 2.5: L_H = ceil(48 * 2.5 / (2.5 + 1 - 0.5)) = 40 exactly,
 * L_RE = 8, recomputed layers first.  Compute 8 * 2.5 + 40 * 0.5 = 40 =
 * I/O 40: no bubble at all.
 */
static void test_recompute_mode_30b(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 2, 0.5, 2.5);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 48, &pl), 0);
	assert_int_equal(pl.mode, KVFS_HSCHED_MODE_HIDDEN_RECOMPUTE);
	assert_int_equal(pl.n_recompute, 8);
	assert_int_equal(pl.n_hidden, 40);
	assert_int_equal(pl.n_kv, 0);
	for (uint32_t l = 0; l < 8; l++)
		assert_int_equal(kvfs_hsched_layer(&pl, l),
				 KVFS_HSCHED_RECOMPUTE);
	for (uint32_t l = 8; l < 48; l++)
		assert_int_equal(kvfs_hsched_layer(&pl, l), KVFS_HSCHED_HIDDEN);
	assert_true(fabs(pl.t_io - 40.0) < 1e-12);
	assert_true(fabs(pl.t_compute - 40.0) < 1e-12);
}

/* N = 40, IO_H = 0.3, IO_KV = 0.6, C_H = 1.3: L_H = 40 * 0.6 / 1.6 = 15
 * exactly in real arithmetic, 15.000000000000002 in binary.  Must be 15,
 * not 16.
 */
static void test_exact_ratio_not_rounded_up(void **state)
{
	struct kvfs_hsched_profile p = prof(0.3, 0.6, 1.3, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 40, &pl), 0);
	assert_int_equal(pl.n_hidden, 15);
	assert_int_equal(pl.n_kv, 25);
	/* I/O 15 * 0.3 + 25 * 0.6 = 19.5 = compute 15 * 1.3 */
	assert_true(fabs(pl.t_io - 19.5) < 1e-9);
	assert_true(fabs(pl.t_compute - 19.5) < 1e-9);
}

/* I/O-bound (C_H = 1 < IO_H = 3) without a recompute path: KV layers
 * would add I/O, so all 32 layers are hidden.
 */
static void test_io_bound_no_recompute(void **state)
{
	struct kvfs_hsched_profile p = prof(3, 6, 1, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &pl), 0);
	assert_int_equal(pl.mode, KVFS_HSCHED_MODE_HIDDEN_ONLY);
	assert_int_equal(pl.n_hidden, 32);
	assert_true(fabs(pl.t_io - 96.0) < 1e-12);
	assert_true(fabs(pl.t_compute - 32.0) < 1e-12);
}

/* Balanced C_H == IO_H: the I/O-bound branch; with recompute
 * L_H = ceil(N * C_Token / C_Token) = N.
 */
static void test_balanced(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 2, 1, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 16, &pl), 0);
	assert_int_equal(pl.n_hidden, 16);
	p.c_token = 5;
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 16, &pl), 0);
	assert_int_equal(pl.n_hidden, 16);
	assert_int_equal(pl.n_recompute, 0);
}

/* GQA-like: IO_KV = 0.5 < IO_H = 1; loading KV is cheaper on both axes. */
static void test_kv_smaller_all_kv(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 0.5, 2, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &pl), 0);
	assert_int_equal(pl.mode, KVFS_HSCHED_MODE_KV_ONLY);
	assert_int_equal(pl.n_kv, 32);
	assert_int_equal(pl.n_hidden, 0);
	assert_int_equal(kvfs_hsched_layer(&pl, 0), KVFS_HSCHED_KV);
}

/* I/O-bound and C_Token (0.5) < C_H (1): recompute everything. */
static void test_recompute_cheaper(void **state)
{
	struct kvfs_hsched_profile p = prof(3, 6, 1, 0.5);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 8, &pl), 0);
	assert_int_equal(pl.mode, KVFS_HSCHED_MODE_RECOMPUTE_ONLY);
	assert_int_equal(pl.n_recompute, 8);
	assert_true(fabs(pl.t_io) < 1e-12);
	assert_true(fabs(pl.t_compute - 4.0) < 1e-12);
}

/* The same profile gives different splits per tier: DRAM is fast
 * (IO_H = 0.25, IO_KV = 0.5, C_H = 1: L_H = ceil(32*0.5/1.25) = 13),
 * SSD slow (IO_H = 2: all hidden).  The GPU tier (no I/O) is all KV.
 */
static void test_per_tier(void **state)
{
	struct kvfs_hsched_profile p;
	struct kvfs_hsched_plan pl;

	memset(&p, 0, sizeof(p));
	p.io_hidden[KVFS_TIER_DRAM] = 0.25;
	p.io_kv[KVFS_TIER_DRAM] = 0.5;
	p.io_hidden[KVFS_TIER_SSD] = 2;
	p.io_kv[KVFS_TIER_SSD] = 4;
	p.c_hidden = 1;
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_DRAM, 32, &pl), 0);
	assert_int_equal(pl.n_hidden, 13);
	assert_int_equal(pl.n_kv, 19);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &pl), 0);
	assert_int_equal(pl.n_hidden, 32);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_GPU, 32, &pl), 0);
	assert_int_equal(pl.mode, KVFS_HSCHED_MODE_KV_ONLY);
}

static void test_invalid(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 2, 1, 0);
	struct kvfs_hsched_plan pl;

	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 0, &pl), -EINVAL);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_NTIERS, 4, &pl), -EINVAL);
	assert_int_equal(kvfs_hsched_plan(&p, -1, 4, &pl), -EINVAL);
	assert_int_equal(kvfs_hsched_plan(NULL, KVFS_TIER_SSD, 4, &pl),
			 -EINVAL);
	p.c_hidden = NAN;
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 4, &pl), -EINVAL);
	p = prof(-1, 2, 1, 0);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 4, &pl), -EINVAL);
	p = prof(1, INFINITY, 1, 0);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 4, &pl), -EINVAL);
	p = prof(1, 2, 1, -3);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 4, &pl), -EINVAL);
}

static double makespan(const struct kvfs_hsched_profile *p, uint32_t nh,
		       uint32_t nkv, uint32_t nre)
{
	double io = p->io_hidden[KVFS_TIER_SSD] * nh +
		    p->io_kv[KVFS_TIER_SSD] * nkv;
	double c = p->c_hidden * nh + p->c_token * nre;

	return io > c ? io : c;
}

/* On random profiles in the paper's regime (IO_KV >= IO_H, C_Token >=
 * C_H), the closed form is within one layer's worth of the best integer
 * split of the same kind, found by brute force.
 */
static void test_random_near_optimal(void **state)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;

	for (int it = 0; it < 2000; it++) {
		struct kvfs_hsched_profile p;
		struct kvfs_hsched_plan pl;
		double r[4], best = INFINITY, slack;
		uint32_t n;

		for (int i = 0; i < 4; i++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			r[i] = (double)(s >> 11) / 9007199254740992.0 + 0.01;
		}
		n = 1 + (uint32_t)(s >> 58);
		/* io_kv in [io_h, 3 io_h], c_token in [c_h, 5 c_h] or none */
		p = prof(r[0], r[0] * (1 + 2 * r[1]), r[2],
			 (it & 1) ? r[2] * (1 + 4 * r[3]) : 0);
		assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, n, &pl), 0);
		assert_int_equal(pl.n_hidden + pl.n_kv + pl.n_recompute, n);
		assert_true(!pl.n_kv || !pl.n_recompute);
		for (uint32_t h = 0; h <= n; h++) {
			double a = makespan(&p, h, n - h, 0);
			double b = p.c_token > 0 ? makespan(&p, h, 0, n - h) :
						   INFINITY;

			best = fmin(best, fmin(a, b));
		}
		slack = fmax(p.c_hidden, p.io_hidden[KVFS_TIER_SSD]);
		assert_true(pl.t_total <= best + slack + 1e-9);
		assert_true(fabs(pl.t_total - makespan(&p, pl.n_hidden, pl.n_kv,
						       pl.n_recompute)) < 1e-9);
	}
}

/* Llama-2-7B: 4096 < 2*32*128 = 8192 -> hidden; Llama-3-8B: 4096 vs
 * 2*8*128 = 2048 -> KV; equal sizes are not "smaller".
 */
static void test_hidden_smaller(void **state)
{
	assert_true(kvfs_hsched_hidden_smaller(4096, 32, 128));
	assert_false(kvfs_hsched_hidden_smaller(4096, 8, 128));
	assert_false(kvfs_hsched_hidden_smaller(4096, 16, 128));
	assert_true(kvfs_hsched_hidden_smaller(4095, 16, 128));
	/* no 32-bit overflow in 2 * heads * dim */
	assert_true(kvfs_hsched_hidden_smaller(0xffffffffu, 0x10000u,
					       0x10000u));
}

/* store_as = auto stores each layer in one form: hidden states up to
 * the long-term tier's first KV layer, K and V after it.
 */
static void test_split_auto(void **state)
{
	struct kvfs_hsched_profile p = prof(1, 2, 1.125, 0);
	struct kvfs_hsched_plan ssd, dram, re;
	uint32_t kv_from = 12345;

	/* SSD: 31 H + 1 KV (Table 3's 7B shape) -> KV from layer 31. */
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &ssd), 0);
	assert_int_equal(ssd.n_hidden, 31);
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, &ssd, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 31);
	/* DRAM, IO_H 0.25, IO_KV 0.5:
	 * ceil(32 * 0.5 / (0.5 + 1.125 - 0.25)) = ceil(11.64) = 12 H.
	 */
	p.io_hidden[KVFS_TIER_DRAM] = 0.25;
	p.io_kv[KVFS_TIER_DRAM] = 0.5;
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_DRAM, 32, &dram), 0);
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, &dram, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 12);
	/* No plan: every layer hidden. */
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, NULL, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 32);
	/* GQA (4096 vs 2048): every layer KV, whatever the plan says. */
	assert_int_equal(kvfs_hsched_split_auto(4096, 8, 128, &ssd, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 0);
	assert_int_equal(kvfs_hsched_split_auto(4096, 8, 128, NULL, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 0);
	/* Equal sizes are not smaller: KV. */
	assert_int_equal(kvfs_hsched_split_auto(4096, 16, 128, NULL, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 0);
	/* I/O-bound, no recompute: hidden-only plan -> all hidden. */
	p = prof(2, 4, 1, 0);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 40, &ssd), 0);
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, &ssd, 40,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 40);
	/* Recomputed layers keep their hidden states: 40 H + 8 RE (the
	 * 30B row of test_recompute_mode_30b) -> every layer hidden.
	 */
	p = prof(1, 2, 0.5, 2.5);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 48, &re), 0);
	assert_int_equal(re.n_recompute, 8);
	assert_int_equal(re.n_hidden, 40);
	assert_int_equal(kvfs_hsched_split_auto(7168, 56, 128, &re, 48,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 48);
	/* The KV form cheaper on this tier (profile noise on MHA): the plan
	 * loads every layer as KV, so every layer is stored as KV.
	 */
	p = prof(2, 1, 3, 0);
	assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &ssd), 0);
	assert_int_equal(ssd.n_kv, 32);
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, &ssd, 32,
						&kv_from),
			 0);
	assert_int_equal(kv_from, 0);
	/* A plan for another depth, no output, no layers. */
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, &ssd, 16,
						&kv_from),
			 -EINVAL);
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, NULL, 32, NULL),
			 -EINVAL);
	assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, NULL, 0,
						&kv_from),
			 -EINVAL);
}

/*
 * The daemon plans with the projection time of whoever restores: the
 * same SSD I/O (N = 32, IO_H = 1, IO_KV = 2) with the CPU's C_H = 30
 * (20-50 times the read, as measured) is compute-bound,
 * L_H = ceil(64 / 31) = 3, so store_as = auto keeps 3 layers hidden; with
 * a GPU's C_H = 0.5 <= IO_H it is I/O-bound and keeps all 32; with
 * C_H = 1.125 (just compute-bound) 31, as in the 7B row.  MHA 7B shapes.
 */
static void test_split_follows_compute(void **state)
{
	static const struct {
		double ch;
		uint32_t kv_from;
	} v[] = { { 30, 3 }, { 0.5, 32 }, { 1.125, 31 } };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		struct kvfs_hsched_profile p = prof(1, 2, v[i].ch, 0);
		struct kvfs_hsched_plan pl;
		uint32_t kv_from = 0;

		assert_int_equal(kvfs_hsched_plan(&p, KVFS_TIER_SSD, 32, &pl),
				 0);
		assert_int_equal(kvfs_hsched_split_auto(4096, 32, 128, &pl, 32,
							&kv_from),
				 0);
		assert_int_equal(kv_from, v[i].kv_from);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kv_mode_7b),
		cmocka_unit_test(test_kv_mode_13b),
		cmocka_unit_test(test_recompute_mode_30b),
		cmocka_unit_test(test_exact_ratio_not_rounded_up),
		cmocka_unit_test(test_io_bound_no_recompute),
		cmocka_unit_test(test_balanced),
		cmocka_unit_test(test_kv_smaller_all_kv),
		cmocka_unit_test(test_recompute_cheaper),
		cmocka_unit_test(test_per_tier),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_random_near_optimal),
		cmocka_unit_test(test_hidden_smaller),
		cmocka_unit_test(test_split_auto),
		cmocka_unit_test(test_split_follows_compute),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
