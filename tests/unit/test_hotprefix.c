// SPDX-License-Identifier: MIT
/* Unit tests for the hotprefix policy (cache/policy_hotprefix.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache/cuckoo.h"
#include "cache/policy.h"
#include "cache/policy_i.h"

/* Test-only introspection exported by policy_hotprefix.c. */
int kvfs_policy_hotprefix_record(struct kvfs_policy *p,
				 const struct kvfs_pnode *n,
				 struct kvfs_cuckoo_rec *out);

#define GPU KVFS_TIER_GPU
#define DRAM KVFS_TIER_DRAM

static uint64_t req_no;

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par,
		   uint32_t tokens, uint64_t size)
{
	memset(n, 0, sizeof(*n));
	/* big-endian id: key order follows id order */
	for (int i = 0; i < 8; i++)
		n->key[7 - i] = (uint8_t)(id >> (8 * i));
	n->key[15] = 0x5a;
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->tokens = tokens;
	n->size = size;
	n->next_use = UINT64_MAX;
}

static struct kvfs_paccess acc(void)
{
	struct kvfs_paccess a = { .now = ++req_no * 10, .request = req_no };

	return a;
}

static struct kvfs_policy *mkpol(const char *const *kv, size_t npairs,
				 uint64_t gpu, uint64_t dram)
{
	const char *keys[16] = { 0 }, *vals[16] = { 0 };
	uint64_t cap[KVFS_NTIERS] = { gpu, dram, 0 };
	struct kvfs_policy *p = NULL;

	assert_true(npairs <= 16);
	for (size_t i = 0; i < npairs; i++) {
		keys[i] = kv[2 * i];
		vals[i] = kv[2 * i + 1];
	}
	assert_int_equal(kvfs_policy_new("hotprefix", keys, vals, npairs, cap,
					 &p), 0);
	return p;
}

static void ins(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct kvfs_paccess a = acc();

	kvfs_policy_insert(p, tier, n, &a);
}

/* @times requests, each touching the path root..@n. */
static void touch(struct kvfs_policy *p, struct kvfs_pnode *n, int times)
{
	struct kvfs_pnode *path[64];
	size_t len = 0;

	for (struct kvfs_pnode *x = n; x; x = x->parent) {
		assert_true(len < 64);
		path[len++] = x;
	}
	for (size_t i = 0; i < len / 2; i++) {
		struct kvfs_pnode *t = path[i];

		path[i] = path[len - 1 - i];
		path[len - 1 - i] = t;
	}
	while (times-- > 0) {
		struct kvfs_paccess a = acc();

		kvfs_policy_access(p, path, len, &a);
	}
}

static void tick(struct kvfs_policy *p)
{
	struct kvfs_paccess a = { .now = req_no * 10, .request = req_no };

	kvfs_policy_tick(p, &a);
}

static struct kvfs_cuckoo_rec rec_of(struct kvfs_policy *p,
				     struct kvfs_pnode *n)
{
	struct kvfs_cuckoo_rec r;

	assert_int_equal(kvfs_policy_hotprefix_record(p, n, &r), 0);
	return r;
}

/* Every test runs on the filter and on the exact table. */
static const char *mode(void **state)
{
	return *state ? "1" : "0";
}

static int set_exact(void **state)
{
	*state = (void *)1;
	return 0;
}

static int set_filter(void **state)
{
	*state = NULL;
	return 0;
}

/* HotPrefix Fig. 4 through the policy: clock 9, freq 5 -> 15, 6. */
static void test_fig4(void **state)
{
	const char *kv[] = { "exact", mode(state), "max_age", "15",
			     "aging_requests", "1" };
	struct kvfs_policy *p = mkpol(kv, 3, 100, 0);
	struct kvfs_pnode a, b;
	struct kvfs_cuckoo_rec r;

	mknode(&a, 1, NULL, 16, 1);
	mknode(&b, 2, NULL, 16, 1);
	ins(p, GPU, &a);      /* request 1: freq 1, clock 15 */
	touch(p, &a, 4);      /* requests 2..5: freq 5 */
	ins(p, GPU, &b);      /* request 6 */
	r = rec_of(p, &a);
	assert_int_equal(r.freq, 5);
	assert_int_equal(r.clock, 15);
	tick(p);              /* six requests: six aging passes */
	r = rec_of(p, &a);
	assert_int_equal(r.clock, 9);
	assert_int_equal(r.freq, 5);
	touch(p, &a, 1);
	r = rec_of(p, &a);
	assert_int_equal(r.clock, 15);
	assert_int_equal(r.freq, 6);
	/* a tick right after aging has nothing to do until more requests */
	tick(p);
	assert_int_equal(rec_of(p, &a).clock, 14);
	tick(p);
	assert_int_equal(rec_of(p, &a).clock, 14);
	kvfs_policy_free(p);
}

/* Every node of an accessed path is updated. */
static void test_path_update(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 0);
	struct kvfs_pnode a, b, c;

	mknode(&a, 1, NULL, 16, 1);
	mknode(&b, 2, &a, 16, 1);
	mknode(&c, 3, &b, 16, 1);
	ins(p, GPU, &a);
	ins(p, GPU, &b);
	ins(p, GPU, &c);
	touch(p, &c, 3);
	touch(p, &b, 2);
	assert_int_equal(rec_of(p, &a).freq, 6);
	assert_int_equal(rec_of(p, &b).freq, 6);
	assert_int_equal(rec_of(p, &c).freq, 4);
	/* moves between tiers are not reuses */
	kvfs_policy_remove(p, GPU, &c);
	assert_int_equal(rec_of(p, &c).freq, 4);
	kvfs_policy_forget(p, &c);
	kvfs_policy_free(p);
}

/* Eviction looks at leaves only, even when an inner node is colder. */
static void test_evict_leaves_only(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 100);
	struct kvfs_pnode a, b, c;

	/* a has 1000 tokens: freq + clock/1000 is below its child's */
	mknode(&a, 1, NULL, 1000, 1);
	mknode(&b, 2, &a, 1, 1);
	mknode(&c, 3, &b, 1, 1);
	ins(p, GPU, &a);
	ins(p, GPU, &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	/* a child resident in DRAM only leaves b a GPU leaf */
	ins(p, DRAM, &c);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	/* with c on the GPU too, c is the only GPU leaf */
	ins(p, GPU, &c);
	touch(p, &c, 5);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &c);
	kvfs_policy_remove(p, GPU, &c);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_remove(p, GPU, &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	kvfs_policy_remove(p, GPU, &a);
	assert_null(kvfs_policy_victim(p, GPU, NULL, NULL));
	kvfs_policy_forget(p, &c);
	kvfs_policy_forget(p, &b);
	kvfs_policy_forget(p, &a);
	kvfs_policy_free(p);
}

/* Lowest frequency + clock / length goes first. */
static void test_evict_order(void **state)
{
	const char *kv[] = { "exact", mode(state), "aging_requests", "1" };
	struct kvfs_policy *p = mkpol(kv, 2, 100, 0);
	struct kvfs_pnode a, b, c;

	mknode(&a, 1, NULL, 10, 1);
	mknode(&b, 2, NULL, 10, 1);
	mknode(&c, 3, NULL, 200, 1);
	ins(p, GPU, &a);
	ins(p, GPU, &b);
	ins(p, GPU, &c);
	touch(p, &a, 2); /* a: 3 + 255/10 */
	touch(p, &b, 1); /* b: 2 + 255/10 */
	touch(p, &c, 2); /* c: 3 + 255/200 */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &c);
	kvfs_policy_remove(p, GPU, &c);
	/* b is older but a fresh clock does not beat one more use */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	/* 300 requests elsewhere, then aging: every clock drops to 0; b is
	 * touched once more: a (3 + 0) now ranks below b (3 + 25.5)
	 */
	touch(p, &c, 300);
	tick(p);
	assert_int_equal(rec_of(p, &a).clock, 0);
	touch(p, &b, 1);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	kvfs_policy_forget(p, &a);
	kvfs_policy_forget(p, &b);
	kvfs_policy_forget(p, &c);
	kvfs_policy_free(p);
}

/* Equal priorities: the deeper leaf goes first, whatever the keys. */
static void test_evict_tie_deeper(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 0);
	struct kvfs_pnode a, b, c;

	mknode(&a, 5, NULL, 10, 1);
	mknode(&b, 6, &a, 10, 1);
	mknode(&c, 1, NULL, 10, 1);
	ins(p, GPU, &a);
	ins(p, GPU, &b);
	ins(p, GPU, &c);
	assert_int_equal(rec_of(p, &b).freq, rec_of(p, &c).freq);
	assert_int_equal(rec_of(p, &b).clock, rec_of(p, &c).clock);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_free(p);
}

static bool not_pinned(struct kvfs_pnode *n, void *arg)
{
	return n != arg;
}

/* A leaf refused by the filter is skipped, and stays a candidate. */
static void test_victim_filter(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 0);
	struct kvfs_pnode a, b;

	mknode(&a, 1, NULL, 10, 1);
	mknode(&b, 2, NULL, 10, 1);
	ins(p, GPU, &a);
	ins(p, GPU, &b);
	touch(p, &b, 3);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_pinned, &a), &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_pinned, &b), &a);
	kvfs_policy_remove(p, GPU, &b);
	assert_null(kvfs_policy_victim(p, GPU, not_pinned, &a));
	kvfs_policy_forget(p, &a);
	kvfs_policy_forget(p, &b);
	kvfs_policy_free(p);
}

/* Selective admission, step 1: the frequency threshold. */
static void test_admit_threshold(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 2);
	struct kvfs_pnode n;

	mknode(&n, 1, NULL, 16, 1);
	ins(p, GPU, &n);
	touch(p, &n, 8);
	assert_int_equal(rec_of(p, &n).freq, 9);
	assert_false(kvfs_policy_admit(p, GPU, DRAM, &n));
	touch(p, &n, 1);
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &n));
	/* no tier below: never */
	assert_false(kvfs_policy_admit(p, DRAM, KVFS_TIER_SSD, &n));
	assert_false(kvfs_policy_admit(p, GPU, KVFS_NTIERS, &n));
	kvfs_policy_free(p);

	/* a configured threshold */
	{
		const char *kv2[] = { "exact", mode(state), "threshold", "3" };

		p = mkpol(kv2, 2, 100, 2);
		mknode(&n, 1, NULL, 16, 1);
		ins(p, GPU, &n);
		touch(p, &n, 1);
		assert_false(kvfs_policy_admit(p, GPU, DRAM, &n));
		touch(p, &n, 1);
		assert_true(kvfs_policy_admit(p, GPU, DRAM, &n));
		kvfs_policy_free(p);
	}
}

/* Step 2: frequency x clock against the coldest resident, when full. */
static void test_admit_hotness(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 2);
	struct kvfs_pnode n, d1, d2;

	mknode(&n, 1, NULL, 16, 1);
	mknode(&d1, 2, NULL, 16, 1);
	mknode(&d2, 3, NULL, 16, 1);
	ins(p, GPU, &n);
	touch(p, &n, 9);  /* 10 */
	ins(p, DRAM, &d1);
	touch(p, &d1, 11); /* 12 */
	/* room left: admitted although colder than d1 */
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &n));
	ins(p, DRAM, &d2);
	touch(p, &d2, 14); /* 15 */
	/* full: 10 * 255 < 12 * 255 */
	assert_false(kvfs_policy_admit(p, GPU, DRAM, &n));
	touch(p, &n, 2);   /* 12: ties with the coldest, admitted */
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &n));
	kvfs_policy_forget(p, &n);
	kvfs_policy_forget(p, &d1);
	kvfs_policy_forget(p, &d2);
	kvfs_policy_free(p);
}

static void check_plan(const struct kvfs_pmove *plan, size_t n,
		       const struct kvfs_pmove *want, size_t nwant)
{
	assert_int_equal(n, nwant);
	for (size_t i = 0; i < n; i++) {
		assert_ptr_equal(plan[i].node, want[i].node);
		assert_int_equal(plan[i].op, want[i].op);
	}
}

/*
 * HotPrefix Fig. 6: host roots P3 > P4, GPU leaves P1.2 < P2.1 < P2.2.
 * P3 is larger than P1.2 alone and takes P1.2 + P2.1; P4 fits in P2.2.
 */
static void test_fig6_plan(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	struct kvfs_policy *p = mkpol(kv, 1, 100, 100);
	struct kvfs_pnode p1, p11, p12, p2, p21, p22, p3, p4;
	struct kvfs_pmove plan[16];
	const struct kvfs_pmove want[] = {
		{ &p12, KVFS_PMOVE_DOWN }, { &p21, KVFS_PMOVE_DOWN },
		{ &p3, KVFS_PMOVE_UP },    { &p22, KVFS_PMOVE_DOWN },
		{ &p4, KVFS_PMOVE_UP },
	};
	uint64_t freed = 0, loaded = 0;
	size_t n;

	mknode(&p1, 10, NULL, 16, 1);
	mknode(&p11, 11, &p1, 16, 1);
	mknode(&p12, 12, &p1, 32, 2);
	mknode(&p2, 20, NULL, 16, 1);
	mknode(&p21, 21, &p2, 32, 2);
	mknode(&p22, 22, &p2, 32, 2);
	mknode(&p3, 30, NULL, 48, 3);
	mknode(&p4, 40, NULL, 16, 1);
	ins(p, GPU, &p1);
	ins(p, GPU, &p11);
	ins(p, GPU, &p12);
	ins(p, GPU, &p2);
	ins(p, GPU, &p21);
	ins(p, GPU, &p22);
	ins(p, DRAM, &p3);
	ins(p, DRAM, &p4);
	touch(p, &p12, 1); /* 2 */
	touch(p, &p21, 2); /* 3 */
	touch(p, &p22, 3); /* 4 */
	touch(p, &p4, 5);  /* 6 */
	touch(p, &p3, 7);  /* 8 */
	touch(p, &p11, 19);

	n = kvfs_policy_promote(p, DRAM, GPU, plan, 16);
	check_plan(plan, n, want, 5);
	for (size_t i = 0; i < n; i++) {
		if (plan[i].op == KVFS_PMOVE_DOWN)
			freed += plan[i].node->size;
		else
			loaded += plan[i].node->size;
	}
	assert_true(loaded <= freed);

	/* batches hold whole groups only */
	assert_int_equal(kvfs_policy_promote(p, DRAM, GPU, plan, 4), 3);
	check_plan(plan, 3, want, 3);
	assert_int_equal(kvfs_policy_promote(p, DRAM, GPU, plan, 2), 0);
	/* planning leaves no marks: the same plan again */
	n = kvfs_policy_promote(p, DRAM, GPU, plan, 16);
	check_plan(plan, n, want, 5);

	/*
	 * P2.1 and P2.2 hotter than P3: P1.2 alone is too small for P3 and
	 * every extra victim must be colder than P3 too, so P3 waits; P4
	 * (6) now takes P1.2 (2).
	 */
	touch(p, &p21, 10);
	touch(p, &p22, 10);
	n = kvfs_policy_promote(p, DRAM, GPU, plan, 16);
	{
		const struct kvfs_pmove want2[] = {
			{ &p12, KVFS_PMOVE_DOWN }, { &p4, KVFS_PMOVE_UP },
		};

		check_plan(plan, n, want2, 2);
	}

	/* nothing colder on the GPU: no plan */
	touch(p, &p12, 40);
	touch(p, &p21, 40);
	touch(p, &p22, 40);
	assert_int_equal(kvfs_policy_promote(p, DRAM, GPU, plan, 16), 0);
	kvfs_policy_free(p);
}

/*
 * A host root whose GPU parent the plan already evicts is skipped, even
 * when a colder GPU leaf is left for it.  Hotness is the node length here
 * so that the ancestor order of the default formula does not hide it.
 */
static void test_plan_skips_evicted_parent(void **state)
{
	const char *kv[] = { "exact", mode(state), "admit_formula", "length" };
	struct kvfs_policy *p = mkpol(kv, 2, 100, 100);
	struct kvfs_pnode z, y, w, h, x, q;
	struct kvfs_pmove plan[16];
	const struct kvfs_pmove want[] = {
		{ &z, KVFS_PMOVE_DOWN }, { &y, KVFS_PMOVE_DOWN },
		{ &h, KVFS_PMOVE_UP },   { &w, KVFS_PMOVE_DOWN },
		{ &q, KVFS_PMOVE_UP },
	};

	mknode(&z, 1, NULL, 1, 1);
	mknode(&y, 2, NULL, 2, 1);
	mknode(&w, 3, NULL, 3, 1);
	mknode(&h, 4, NULL, 10, 2);
	mknode(&x, 5, &y, 5, 1);
	mknode(&q, 6, NULL, 4, 1);
	ins(p, GPU, &z);
	ins(p, GPU, &y);
	ins(p, GPU, &w);
	ins(p, DRAM, &h);
	ins(p, DRAM, &x);
	ins(p, DRAM, &q);
	check_plan(plan, kvfs_policy_promote(p, DRAM, GPU, plan, 16), want,
		   5);
	kvfs_policy_free(p);
}

/* A promoted node's GPU parent is never its own victim. */
static void test_plan_keeps_parent(void **state)
{
	const char *kv[] = { "exact", mode(state), "admit_formula", "length" };
	struct kvfs_policy *p = mkpol(kv, 2, 100, 100);
	struct kvfs_pnode y, x, v;
	struct kvfs_pmove plan[8];
	const struct kvfs_pmove want[] = {
		{ &v, KVFS_PMOVE_DOWN }, { &x, KVFS_PMOVE_UP },
	};

	mknode(&y, 1, NULL, 1, 1); /* coldest GPU leaf, parent of x */
	mknode(&v, 2, NULL, 2, 1);
	mknode(&x, 3, &y, 9, 1);
	ins(p, GPU, &y);
	ins(p, GPU, &v);
	ins(p, DRAM, &x);
	check_plan(plan, kvfs_policy_promote(p, DRAM, GPU, plan, 8), want,
		   2);
	kvfs_policy_free(p);
}

static void test_formula_parse(void **state)
{
	static const char *const bad[] = {
		"", "clock +", "+ clock", "clock ^ frequency", "foo",
		"clock frequency", "clock + frequency + length + clock",
		"clock + -1", "clock // length", "clock +* length",
	};
	static const char *const good[] = {
		"clock", "frequency*clock", "  clock + freq / length ",
		"2 * clock", "length / clock / frequency", "CLOCK+Frequency",
		"0.5 * len",
	};
	uint64_t cap[KVFS_NTIERS] = { 10, 10, 0 };
	struct kvfs_policy *p;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *k[] = { "evict_formula" }, *v[] = { bad[i] };

		p = (void *)1;
		assert_int_equal(kvfs_policy_new("hotprefix", k, v, 1, cap, &p),
				 -EINVAL);
		assert_null(p);
		k[0] = "admit_formula";
		assert_int_equal(kvfs_policy_new("hotprefix", k, v, 1, cap, &p),
				 -EINVAL);
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		const char *k[] = { "evict_formula", "admit_formula" };
		const char *v[] = { good[i], good[i] };

		assert_int_equal(kvfs_policy_new("hotprefix", k, v, 2, cap, &p),
				 0);
		kvfs_policy_free(p);
	}
	{
		const char *k[] = { "threshold", "aging_requests", "max_age",
				    "filter_buckets", "nonsense" };
		const char *v[] = { "x", "0", "256", "1000", "1" };

		for (int i = 0; i < 5; i++)
			assert_int_equal(kvfs_policy_new("hotprefix", &k[i],
							 &v[i], 1, cap, &p),
					 -EINVAL);
	}
}

/* Formulas are evaluated with * and / before +. */
static void test_formula_eval(void **state)
{
	/* a: freq 5, clock 0; b: freq 1, clock 15 (max_age 15) */
	static const struct {
		const char *f;
		int want; /* 0: a, 1: b */
	} cases[] = {
		{ "frequency + clock / length", 1 }, /* a 5, b 1.15 */
		{ "clock + frequency / length", 0 }, /* a .05, b 15.01 */
		/* precedence: freq + (clock * 0) = freq -> b; left to right
		 * would give 0 for both and the key order would pick a
		 */
		{ "frequency + clock * 0", 1 },
		{ "frequency * clock", 0 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *kv[] = { "exact", mode(state), "max_age", "15",
				     "aging_requests", "1", "evict_formula",
				     cases[i].f };
		struct kvfs_policy *p = mkpol(kv, 4, 100, 10);
		struct kvfs_pnode a, b, d;

		mknode(&a, 1, NULL, 100, 1);
		mknode(&b, 2, NULL, 100, 1);
		mknode(&d, 3, NULL, 100, 1);
		ins(p, GPU, &a);
		touch(p, &a, 4);
		/* 20 requests that do not touch a, then 25 aging passes */
		ins(p, DRAM, &d);
		touch(p, &d, 20);
		tick(p);
		ins(p, GPU, &b);
		assert_int_equal(rec_of(p, &a).clock, 0);
		assert_int_equal(rec_of(p, &a).freq, 5);
		assert_int_equal(rec_of(p, &b).clock, 15);
		assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL),
				 cases[i].want ? &b : &a);
		kvfs_policy_free(p);
	}
}

/* Discarded blocks keep their record as history (keep_history = 1). */
static void test_history(void **state)
{
	const char *kv[] = { "exact", mode(state) };
	const char *kv0[] = { "exact", mode(state), "keep_history", "0" };
	struct kvfs_pnode n;
	struct kvfs_cuckoo_rec r;
	struct kvfs_policy *p = mkpol(kv, 1, 100, 0);

	mknode(&n, 1, NULL, 16, 1);
	ins(p, GPU, &n);
	touch(p, &n, 4);
	kvfs_policy_forget(p, &n);
	mknode(&n, 1, NULL, 16, 1);
	ins(p, GPU, &n); /* re-created: one more use */
	assert_int_equal(rec_of(p, &n).freq, 6);
	kvfs_policy_free(p);

	p = mkpol(kv0, 2, 100, 0);
	mknode(&n, 1, NULL, 16, 1);
	ins(p, GPU, &n);
	touch(p, &n, 4);
	kvfs_policy_forget(p, &n);
	assert_int_equal(kvfs_policy_hotprefix_record(p, &n, &r), -ENOENT);
	mknode(&n, 1, NULL, 16, 1);
	ins(p, GPU, &n);
	assert_int_equal(rec_of(p, &n).freq, 1);
	kvfs_policy_free(p);

	/* history is bounded: the oldest ghost's record goes */
	{
		const char *kv2[] = { "exact", mode(state), "history", "2" };
		struct kvfs_pnode g[3];

		p = mkpol(kv2, 2, 100, 0);
		for (int i = 0; i < 3; i++) {
			mknode(&g[i], 100 + i, NULL, 16, 1);
			ins(p, GPU, &g[i]);
		}
		for (int i = 0; i < 3; i++)
			kvfs_policy_forget(p, &g[i]);
		assert_int_equal(kvfs_policy_hotprefix_record(p, &g[0], &r),
				 -ENOENT);
		assert_int_equal(kvfs_policy_hotprefix_record(p, &g[1], &r), 0);
		assert_int_equal(kvfs_policy_hotprefix_record(p, &g[2], &r), 0);
		kvfs_policy_free(p);
	}
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double prio_of(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	struct kvfs_cuckoo_rec r = rec_of(p, n);

	return r.freq + (double)r.clock / n->tokens;
}

/*
 * Random forest of inserts, accesses, removals and agings on two tiers:
 * the victim is always a resident leaf with the lowest priority.
 */
static void test_random_victims(void **state)
{
	enum { N = 300 };
	const char *kv[] = { "exact", mode(state), "aging_requests", "3" };
	struct kvfs_policy *p = mkpol(kv, 2, 1000, 1000);
	static struct kvfs_pnode nodes[N];
	int made = 0;

	rng_state = 1234;
	for (int step = 0; step < 6000; step++) {
		uint64_t r = rnd() % 100;

		if (made < N && (r < 20 || !made)) {
			struct kvfs_pnode *par = NULL;
			uint64_t pi = rnd() % (made + 1);

			/* parents stay resident on the GPU while children are */
			if (pi < (uint64_t)made &&
			    (nodes[pi].tiers & (1u << GPU)))
				par = &nodes[pi];
			mknode(&nodes[made], 1000 + made, par,
			       (uint32_t)(1 + rnd() % 64), 1);
			ins(p, GPU, &nodes[made]);
			made++;
		} else if (r < 70) {
			touch(p, &nodes[rnd() % made], 1);
		} else if (r < 85) {
			struct kvfs_pnode *v =
				kvfs_policy_victim(p, GPU, NULL, NULL);
			double best = 1e300;

			if (!v)
				continue;
			assert_true(kvfs_policy_is_leaf(v, GPU));
			for (int i = 0; i < made; i++)
				if (kvfs_policy_is_leaf(&nodes[i], GPU) &&
				    prio_of(p, &nodes[i]) < best)
					best = prio_of(p, &nodes[i]);
			/* the filter may merge records: exact mode only */
			if (*state)
				assert_true(prio_of(p, v) == best);
			kvfs_policy_remove(p, GPU, v);
			if (kvfs_policy_admit(p, GPU, DRAM, v))
				ins(p, DRAM, v);
		} else {
			tick(p);
		}
	}
	for (int i = 0; i < made; i++)
		kvfs_policy_forget(p, &nodes[i]);
	assert_int_equal(p->count[GPU], 0);
	assert_int_equal(p->count[DRAM], 0);
	assert_null(kvfs_policy_victim(p, GPU, NULL, NULL));
	kvfs_policy_free(p);
}

int main(void)
{
#define BOTH(t)                                                      \
	cmocka_unit_test_setup(t, set_filter),                       \
		cmocka_unit_test_setup(t, set_exact)
	const struct CMUnitTest tests[] = {
		BOTH(test_fig4),
		BOTH(test_path_update),
		BOTH(test_evict_leaves_only),
		BOTH(test_evict_order),
		BOTH(test_evict_tie_deeper),
		BOTH(test_victim_filter),
		BOTH(test_admit_threshold),
		BOTH(test_admit_hotness),
		BOTH(test_fig6_plan),
		BOTH(test_plan_skips_evicted_parent),
		BOTH(test_plan_keeps_parent),
		cmocka_unit_test(test_formula_parse),
		BOTH(test_formula_eval),
		BOTH(test_history),
		BOTH(test_random_victims),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
