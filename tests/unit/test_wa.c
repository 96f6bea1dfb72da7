// SPDX-License-Identifier: MIT
/* Unit tests for the workload-aware policy (cache/policy_wa.c). */
#include <errno.h>
#include <math.h>
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

/* Test-only introspection exported by policy_wa.c. */
struct kvfs_wa_model {
	uint32_t key;
	double rate;
	double pfrac;
	double life;
	uint64_t samples;
	bool own;
	bool fitted;
};
int kvfs_policy_wa_model(struct kvfs_policy *p, uint16_t category,
			 uint16_t turn, struct kvfs_wa_model *out);
int kvfs_policy_wa_node_model(struct kvfs_policy *p,
			      const struct kvfs_pnode *n,
			      struct kvfs_wa_model *out);

#define GPU KVFS_TIER_GPU
#define DRAM KVFS_TIER_DRAM
#define FALLBACK(cont, bucket) (0x8000u | ((cont) ? 8u : 0u) | (bucket))

static uint64_t req_no;
static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Exp(mean) sample by inversion, from the seeded generator. */
static double rexp(double mean)
{
	double u = ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0;

	return -log(u) * mean;
}

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par,
		   uint16_t category, uint16_t turn)
{
	memset(n, 0, sizeof(*n));
	for (int i = 0; i < 8; i++)
		n->key[7 - i] = (uint8_t)(id >> (8 * i));
	n->key[15] = 0xa5;
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->tokens = 16;
	n->size = 1;
	n->category = category;
	n->turn = turn;
	n->next_use = UINT64_MAX;
}

static struct kvfs_policy *mkpol(const char *const *kv, size_t npairs,
				 uint64_t gpu, uint64_t dram)
{
	const char *keys[16] = { 0 }, *vals[16] = { 0 };
	uint64_t cap[KVFS_NTIERS] = { gpu, dram, 0 };
	struct kvfs_policy *p = NULL;

	for (size_t i = 0; i < npairs; i++) {
		keys[i] = kv[2 * i];
		vals[i] = kv[2 * i + 1];
	}
	assert_int_equal(kvfs_policy_new("wa", keys, vals, npairs, cap, &p),
			 0);
	return p;
}

/* Insert @n into @tier as part of a new request at time @now. */
static void ins(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		uint64_t now)
{
	struct kvfs_paccess a = { .now = now, .request = ++req_no };

	kvfs_policy_insert(p, tier, n, &a);
}

/* One request at @now touching the path root..@n. */
static void touch(struct kvfs_policy *p, struct kvfs_pnode *n, uint64_t now)
{
	struct kvfs_pnode *path[64];
	struct kvfs_paccess a = { .now = now, .request = ++req_no };
	size_t len = 0;

	for (struct kvfs_pnode *x = n; x; x = x->parent)
		path[len++] = x;
	for (size_t i = 0; i < len / 2; i++) {
		struct kvfs_pnode *t = path[i];

		path[i] = path[len - 1 - i];
		path[len - 1 - i] = t;
	}
	kvfs_policy_access(p, path, len, &a);
}

static void tick(struct kvfs_policy *p, uint64_t now)
{
	struct kvfs_paccess a = { .now = now, .request = req_no };

	kvfs_policy_tick(p, &a);
}

/*
 * Feed @n reuse intervals drawn from Exp(@mean) into category
 * (@cat, @turn): each sample is one block inserted and reused once.
 * Returns the time after the last sample.
 */
static uint64_t feed(struct kvfs_policy *p, uint16_t cat, uint16_t turn,
		     int n, double mean, uint64_t t0, uint64_t id0)
{
	uint64_t t = t0;
	struct kvfs_pnode x;

	for (int i = 0; i < n; i++) {
		uint64_t d = (uint64_t)llround(rexp(mean));

		mknode(&x, id0 + (uint64_t)i, NULL, cat, turn);
		ins(p, GPU, &x, t);
		touch(p, &x, t + d);
		kvfs_policy_forget(p, &x);
		t += d + 1;
	}
	return t;
}

/* Before any fit: plain LRU. */
static void test_lru_before_fit(void **state)
{
	struct kvfs_policy *p = mkpol(NULL, 0, 100, 0);
	struct kvfs_pnode a, b, c;
	struct kvfs_wa_model m;

	mknode(&a, 1, NULL, 0, 0);
	mknode(&b, 2, NULL, 0, 0);
	mknode(&c, 3, NULL, 0, 0);
	ins(p, GPU, &a, 10);
	ins(p, GPU, &b, 20);
	ins(p, GPU, &c, 30);
	assert_int_equal(kvfs_policy_wa_node_model(p, &a, &m), 0);
	assert_false(m.fitted);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	touch(p, &a, 40);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_forget(p, &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &c);
	kvfs_policy_free(p);
}

static void drain_expect_depths(struct kvfs_policy *p, const uint32_t *want,
				int n)
{
	for (int i = 0; i < n; i++) {
		struct kvfs_pnode *v = kvfs_policy_victim(p, GPU, NULL, NULL);

		assert_non_null(v);
		assert_int_equal(v->depth, want[i]);
		kvfs_policy_remove(p, GPU, v);
	}
	assert_null(kvfs_policy_victim(p, GPU, NULL, NULL));
}

/* One request's blocks share a time: the prefix tail goes first. */
static void test_same_time_deeper_first(void **state)
{
	static const uint32_t order[] = { 4, 3, 2, 1, 0 };
	static const int shuffled[] = { 2, 0, 4, 1, 3 };
	struct kvfs_policy *p = mkpol(NULL, 0, 100, 0);
	struct kvfs_pnode n[5];
	struct kvfs_pnode *path[5];
	struct kvfs_paccess a = { .now = 100, .request = ++req_no };

	for (int i = 0; i < 5; i++) {
		mknode(&n[i], 10 + i, i ? &n[i - 1] : NULL, 1, 1);
		path[i] = &n[i];
	}
	/* root-first inserts in one request */
	for (int i = 0; i < 5; i++)
		kvfs_policy_insert(p, GPU, &n[i], &a);
	drain_expect_depths(p, order, 5);

	/* any insert order */
	a.request = ++req_no;
	a.now = 200;
	for (int i = 0; i < 5; i++)
		kvfs_policy_insert(p, GPU, &n[shuffled[i]], &a);
	drain_expect_depths(p, order, 5);

	/* a later access of the whole path keeps the order */
	for (int i = 0; i < 5; i++)
		kvfs_policy_insert(p, GPU, &n[i], &a);
	a.request = ++req_no;
	a.now = 300;
	kvfs_policy_access(p, path, 5, &a);
	drain_expect_depths(p, order, 5);
	for (int i = 0; i < 5; i++)
		kvfs_policy_forget(p, &n[i]);
	kvfs_policy_free(p);
}

/*
 * Category 1 reuses within ~10 time units, category 2 within ~1000.  A
 * category-1 block idle 100 is less likely to come back than an older
 * category-2 block: WA evicts the newer one, unlike LRU.
 */
static void test_across_categories(void **state)
{
	const char *kv[] = { "life_quantile", "0", "refit_requests", "1" };
	struct kvfs_policy *p = mkpol(kv, 2, 100, 0);
	struct kvfs_pnode a, b, c;
	struct kvfs_wa_model ma, mb;
	uint64_t t;

	rng_state = 11;
	t = feed(p, 1, 1, 200, 10, 1000, 100000);
	t = feed(p, 2, 1, 200, 1000, t, 200000);
	tick(p, t);
	assert_int_equal(kvfs_policy_wa_model(p, 1, 1, &ma), 0);
	assert_int_equal(kvfs_policy_wa_model(p, 2, 1, &mb), 0);
	assert_true(ma.own && mb.own);
	assert_true(ma.rate > 10 * mb.rate);

	mknode(&b, 1, NULL, 2, 1);
	mknode(&a, 2, NULL, 1, 1);
	mknode(&c, 3, NULL, 2, 1);
	ins(p, GPU, &b, t);
	ins(p, GPU, &a, t + 50);
	ins(p, GPU, &c, t + 60);
	tick(p, t + 150);
	/* a: p e^(-0.1 * 100) << b: p e^(-0.001 * 150) */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	kvfs_policy_remove(p, GPU, &a);
	/* within category 2: least recent first */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_free(p);
}

/*
 * Refitting recovers the rate of a synthetic exponential: 2,000 seeded
 * samples of mean 500 give a rate within 5% of 1/500 (the standard error
 * of the estimate is 1/sqrt(2000) = 2.2%); a sliding window of 1,024 then
 * follows a change of the mean to 100 within 10%.
 */
static void test_refit_rate(void **state)
{
	const char *kv[] = { "window", "4096", "refit_requests", "1" };
	const char *kv2[] = { "window", "1024", "refit_requests", "1" };
	struct kvfs_wa_model m;
	struct kvfs_policy *p;
	uint64_t t;

	rng_state = 2024;
	p = mkpol(kv, 2, 100, 0);
	t = feed(p, 3, 2, 2000, 500, 0, 1000000);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 2, &m), 0);
	assert_false(m.fitted);
	tick(p, t);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 2, &m), 0);
	assert_true(m.fitted);
	assert_int_equal(m.samples, 2000);
	assert_true(fabs(m.rate * 500 - 1) < 0.05);
	/* one reuse per two accesses */
	assert_true(fabs(m.pfrac - 0.5) < 0.01);
	/* the pooled model sees the same samples */
	assert_int_equal(kvfs_policy_wa_model(p, 0, 0, &m), 0);
	assert_true(m.fitted);
	assert_true(fabs(m.rate * 500 - 1) < 0.05);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 1, &m), -ENOENT);
	kvfs_policy_free(p);

	p = mkpol(kv2, 2, 100, 0);
	t = feed(p, 3, 2, 2000, 500, 0, 2000000);
	tick(p, t);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 2, &m), 0);
	assert_true(fabs(m.rate * 500 - 1) < 0.1);
	t = feed(p, 3, 2, 1024, 100, t, 3000000);
	tick(p, t);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 2, &m), 0);
	assert_int_equal(m.samples, 1024);
	assert_true(fabs(m.rate * 100 - 1) < 0.1);
	kvfs_policy_free(p);
}

/* The lifespan cap: past life_w a block's reuse probability is 0. */
static void test_lifespan_cap(void **state)
{
	const char *capped[] = { "lifespan", "50", "refit_requests", "1" };
	const char *open[] = { "life_quantile", "0", "refit_requests", "1" };
	const char *autoq[] = { "life_quantile", "0.95", "refit_requests",
				"1", "window", "4096" };
	const char *const *cfg[] = { capped, open };
	struct kvfs_wa_model m;

	for (int k = 0; k < 2; k++) {
		struct kvfs_policy *p = mkpol(cfg[k], 2, 100, 0);
		struct kvfs_pnode a, b;
		uint64_t t;

		rng_state = 5;
		/* category 1 slow (mean 1000), category 2 fast (mean 10) */
		t = feed(p, 1, 1, 300, 1000, 0, 10000);
		t = feed(p, 2, 1, 300, 10, t, 20000);
		tick(p, t);
		assert_int_equal(kvfs_policy_wa_model(p, 1, 1, &m), 0);
		assert_true(m.own);
		assert_true(k == 0 ? m.life == 50 : m.life == 0);
		mknode(&a, 1, NULL, 1, 1);
		mknode(&b, 2, NULL, 2, 1);
		ins(p, GPU, &a, t);
		ins(p, GPU, &b, t + 20);
		tick(p, t + 60);
		/* a idle 60 > 50: capped, it goes although slow-decaying;
		 * uncapped, the fast category's b (idle 40) goes
		 */
		assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL),
				 k == 0 ? &a : &b);
		kvfs_policy_free(p);
	}

	/* automatic cap: the 0.95 quantile of the reuse times, which for
	 * Exp(mean 500) is 500 ln 20 = 1498
	 */
	{
		struct kvfs_policy *p = mkpol(autoq, 3, 100, 0);
		uint64_t t;

		rng_state = 77;
		t = feed(p, 4, 1, 3000, 500, 0, 50000);
		tick(p, t);
		assert_int_equal(kvfs_policy_wa_model(p, 4, 1, &m), 0);
		assert_true(fabs(m.life / (500 * log(20)) - 1) < 0.1);
		kvfs_policy_free(p);
	}
}

/* Categories: tags with turns, and the depth/continuation fallback. */
static void test_categories(void **state)
{
	const char *kv[] = { "max_turn", "4" };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 0);
	struct kvfs_pnode r0, r1, r2, r3, t0, t1, t9, far[8];
	struct kvfs_wa_model m;
	struct kvfs_paccess a = { .now = 10, .request = ++req_no };

	/* request 1: a fresh chain */
	mknode(&r0, 1, NULL, 0, 0);
	mknode(&r1, 2, &r0, 0, 0);
	kvfs_policy_insert(p, GPU, &r0, &a);
	kvfs_policy_insert(p, GPU, &r1, &a);
	/* request 2 extends it: a continuation */
	a.request = ++req_no;
	a.now = 20;
	mknode(&r2, 3, &r1, 0, 0);
	mknode(&r3, 4, &r2, 0, 0);
	kvfs_policy_insert(p, GPU, &r2, &a);
	kvfs_policy_insert(p, GPU, &r3, &a);
	assert_int_equal(kvfs_policy_wa_node_model(p, &r0, &m), 0);
	assert_int_equal(m.key, FALLBACK(0, 0));
	assert_int_equal(kvfs_policy_wa_node_model(p, &r1, &m), 0);
	assert_int_equal(m.key, FALLBACK(0, 1)); /* depth 1 */
	assert_int_equal(kvfs_policy_wa_node_model(p, &r2, &m), 0);
	assert_int_equal(m.key, FALLBACK(1, 1)); /* depth 2 */
	assert_int_equal(kvfs_policy_wa_node_model(p, &r3, &m), 0);
	assert_int_equal(m.key, FALLBACK(1, 2)); /* depth 3 */

	/* depth buckets are log2(depth + 1), capped at 7 */
	for (int i = 0; i < 8; i++)
		mknode(&far[i], 100 + i, i ? &far[i - 1] : NULL, 0, 0);
	far[7].depth = 300;
	a.request = ++req_no;
	kvfs_policy_insert(p, GPU, &far[7], &a);
	assert_int_equal(kvfs_policy_wa_node_model(p, &far[7], &m), 0);
	assert_int_equal(m.key, FALLBACK(0, 7));

	/* tagged: (type, turn), turn capped; unknown turn from continuation */
	mknode(&t0, 10, NULL, 2, 0);
	mknode(&t9, 11, NULL, 2, 9);
	mknode(&t1, 12, &r3, 5, 0);
	kvfs_policy_insert(p, GPU, &t0, &a);
	kvfs_policy_insert(p, GPU, &t9, &a);
	kvfs_policy_insert(p, GPU, &t1, &a);
	assert_int_equal(kvfs_policy_wa_node_model(p, &t0, &m), 0);
	assert_int_equal(m.key, (2u << 16) | 1);
	assert_int_equal(kvfs_policy_wa_node_model(p, &t9, &m), 0);
	assert_int_equal(m.key, (2u << 16) | 4);
	assert_int_equal(kvfs_policy_wa_node_model(p, &t1, &m), 0);
	assert_int_equal(m.key, (5u << 16) | 2);

	/* a hit re-tags a tagged block with its latest user's category */
	t0.category = 7;
	t0.turn = 3;
	touch(p, &t0, 30);
	assert_int_equal(kvfs_policy_wa_node_model(p, &t0, &m), 0);
	assert_int_equal(m.key, (7u << 16) | 3);
	/* only leaves are candidates: of the oldest (time 20) ones, far[7],
	 * t9 and t1, the deepest goes first
	 */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &far[7]);
	kvfs_policy_free(p);
}

/* More categories than max_categories share the catch-all one. */
static void test_category_limit(void **state)
{
	const char *kv[] = { "max_categories", "3" };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 0);
	struct kvfs_pnode n[4];
	struct kvfs_wa_model m;

	for (int i = 0; i < 4; i++) {
		mknode(&n[i], 1 + i, NULL, (uint16_t)(1 + i), 1);
		ins(p, GPU, &n[i], 10 + i);
	}
	assert_int_equal(kvfs_policy_wa_node_model(p, &n[0], &m), 0);
	assert_int_equal(m.key, (1u << 16) | 1);
	assert_int_equal(kvfs_policy_wa_node_model(p, &n[1], &m), 0);
	assert_int_equal(m.key, (2u << 16) | 1);
	assert_int_equal(kvfs_policy_wa_node_model(p, &n[2], &m), 0);
	assert_int_equal(m.key, 0xffffffffu);
	assert_int_equal(kvfs_policy_wa_node_model(p, &n[3], &m), 0);
	assert_int_equal(m.key, 0xffffffffu);
	/* victims still come from every queue */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &n[0]);
	kvfs_policy_remove(p, GPU, &n[0]);
	kvfs_policy_remove(p, GPU, &n[1]);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &n[2]);
	kvfs_policy_free(p);
}

/* A block re-created after eviction still yields its reuse interval. */
static void test_ghost_reuse(void **state)
{
	struct kvfs_policy *p = mkpol(NULL, 0, 100, 0);
	struct kvfs_pnode n;
	struct kvfs_wa_model m;

	mknode(&n, 1, NULL, 3, 1);
	ins(p, GPU, &n, 100);
	kvfs_policy_forget(p, &n);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 1, &m), 0);
	assert_int_equal(m.samples, 0);
	mknode(&n, 1, NULL, 3, 1);
	ins(p, GPU, &n, 350);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 1, &m), 0);
	assert_int_equal(m.samples, 1);
	/* moves between tiers are not reuses; a second request is */
	kvfs_policy_remove(p, GPU, &n);
	ins(p, DRAM, &n, 400);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 1, &m), 0);
	assert_int_equal(m.samples, 1);
	touch(p, &n, 500);
	assert_int_equal(kvfs_policy_wa_model(p, 3, 1, &m), 0);
	assert_int_equal(m.samples, 2);
	assert_ptr_equal(kvfs_policy_victim(p, DRAM, NULL, NULL), &n);
	assert_null(kvfs_policy_victim(p, GPU, NULL, NULL));
	kvfs_policy_free(p);
}

static bool not_arg(struct kvfs_pnode *n, void *arg)
{
	return n != arg;
}

static void test_admit_promote_filter(void **state)
{
	struct kvfs_policy *p = mkpol(NULL, 0, 100, 10);
	struct kvfs_pnode a, b;
	struct kvfs_pmove plan[4];

	mknode(&a, 1, NULL, 0, 0);
	mknode(&b, 2, NULL, 0, 0);
	ins(p, GPU, &a, 1);
	ins(p, GPU, &b, 2);
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &a));
	assert_false(kvfs_policy_admit(p, DRAM, KVFS_TIER_SSD, &a));
	assert_int_equal(kvfs_policy_promote(p, DRAM, GPU, plan, 4), 0);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_arg, &a), &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	kvfs_policy_free(p);

	{
		const char *bad[][2] = {
			{ "window", "1" }, { "refit_requests", "0" },
			{ "life_quantile", "2" }, { "lifespan", "-1" },
			{ "max_categories", "1000" }, { "reuse_fraction", "x" },
			{ "what", "1" },
		};
		uint64_t cap[KVFS_NTIERS] = { 1, 0, 0 };

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			const char *k = bad[i][0], *v = bad[i][1];

			assert_int_equal(kvfs_policy_new("wa", &k, &v, 1, cap,
							 &p), -EINVAL);
		}
	}
}

/*
 * Random workload: the O(W) victim equals the brute-force minimum of
 * (ReuseProb, -depth, last access) over every resident block, or every
 * resident leaf with leaves_only.
 */
static void test_random_brute_force(void **state)
{
	enum { N = 400 };
	bool leaves = *state;
	const char *kv[] = { "life_quantile", "0", "refit_requests", "7",
			     "min_samples", "8", "leaves_only",
			     leaves ? "1" : "0" };
	struct kvfs_policy *p = mkpol(kv, 4, 1000, 0);
	static struct kvfs_pnode nodes[N];
	static uint64_t last[N];
	uint64_t now = 1000;
	int made = 0;

	rng_state = 31337;
	for (int step = 0; step < 8000; step++) {
		uint64_t r = rnd() % 100;

		now += rnd() % 20;
		if (made < N && (r < 25 || !made)) {
			struct kvfs_pnode *par = NULL;
			uint64_t pi = rnd() % (made + 1);

			if (pi < (uint64_t)made)
				par = &nodes[pi];
			mknode(&nodes[made], 5000 + made, par,
			       (uint16_t)(rnd() % 4), (uint16_t)(rnd() % 3));
			ins(p, GPU, &nodes[made], now);
			last[made] = now;
			made++;
		} else if (r < 75) {
			int i = (int)(rnd() % made);

			/* touch() also refreshes every ancestor */
			touch(p, &nodes[i], now);
			for (struct kvfs_pnode *x = &nodes[i]; x; x = x->parent)
				last[x - nodes] = now;
			/* the node may have been forgotten: it is back */
			for (struct kvfs_pnode *x = &nodes[i]; x; x = x->parent)
				if (!(x->tiers & (1u << GPU)))
					ins(p, GPU, x, now);
		} else if (r < 95) {
			struct kvfs_pnode *v;
			double bp = 0;
			int bi = -1;

			/* victim() measures idle time up to the latest now
			 * the policy was told
			 */
			tick(p, now);
			v = kvfs_policy_victim(p, GPU, NULL, NULL);
			if (!v)
				continue;
			for (int i = 0; i < made; i++) {
				struct kvfs_wa_model m;
				double t, prob;

				if (!(nodes[i].tiers & (1u << GPU)))
					continue;
				if (leaves && !kvfs_policy_is_leaf(&nodes[i], GPU))
					continue;
				assert_int_equal(kvfs_policy_wa_node_model(
							 p, &nodes[i], &m), 0);
				t = (double)(now - last[i]);
				prob = !m.fitted ? 1.0 / (1.0 + t) :
						   m.pfrac * exp(-m.rate * t);
				if (bi < 0 || prob < bp ||
				    (prob == bp &&
				     (nodes[i].depth > nodes[bi].depth ||
				      (nodes[i].depth == nodes[bi].depth &&
				       last[i] < last[bi])))) {
					bi = i;
					bp = prob;
				}
			}
			assert_true(bi >= 0);
			assert_int_equal(v->depth, nodes[bi].depth);
			assert_int_equal(last[v - nodes], last[bi]);
			kvfs_policy_forget(p, v);
		} else {
			tick(p, now);
		}
	}
	for (int i = 0; i < made; i++)
		kvfs_policy_forget(p, &nodes[i]);
	assert_int_equal(p->count[GPU], 0);
	kvfs_policy_free(p);
}

static int set_leaves(void **state)
{
	*state = (void *)1;
	return 0;
}

static int set_all(void **state)
{
	*state = NULL;
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lru_before_fit),
		cmocka_unit_test(test_same_time_deeper_first),
		cmocka_unit_test(test_across_categories),
		cmocka_unit_test(test_refit_rate),
		cmocka_unit_test(test_lifespan_cap),
		cmocka_unit_test(test_categories),
		cmocka_unit_test(test_category_limit),
		cmocka_unit_test(test_ghost_reuse),
		cmocka_unit_test(test_admit_promote_filter),
		cmocka_unit_test_setup(test_random_brute_force, set_all),
		cmocka_unit_test_setup(test_random_brute_force, set_leaves),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
