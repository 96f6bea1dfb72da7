// SPDX-License-Identifier: MIT
/*
 * Unit tests for the belady policy (cache/policy_belady.c): the heap order
 * directly, and the simulator's belady hit count against an exhaustive
 * search over every eviction choice on tiny traces.
 */
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
#include "sim/sim.h"
#include "sim/trace.h"

#define GPU KVFS_TIER_GPU

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par,
		   uint64_t next)
{
	memset(n, 0, sizeof(*n));
	memcpy(n->key, &id, sizeof(id));
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->size = 1;
	n->next_use = next;
}

static bool not_node(struct kvfs_pnode *n, void *arg)
{
	return n != arg;
}

static void test_order(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 8, 0, 0 };
	struct kvfs_policy *p;
	struct kvfs_pnode a, b, c, d;
	struct kvfs_pnode *path[2] = { &a, &b };
	struct kvfs_paccess r = { .now = 1, .request = 1 };

	assert_int_equal(kvfs_policy_new("belady", NULL, NULL, 0, cap, &p),
			 0);
	mknode(&a, 1, NULL, 5);
	mknode(&b, 2, &a, 5);
	mknode(&c, 3, NULL, 9);
	mknode(&d, 4, NULL, UINT64_MAX);
	kvfs_policy_insert(p, GPU, &a, &r);
	kvfs_policy_insert(p, GPU, &b, &r);
	kvfs_policy_insert(p, GPU, &c, &r);
	kvfs_policy_insert(p, GPU, &d, &r);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &d);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_node, &d), &c);
	kvfs_policy_remove(p, GPU, &d);
	/* A path access with new next uses re-orders both nodes. */
	a.next_use = 20;
	b.next_use = 20;
	kvfs_policy_access(p, path, 2, &r);
	/* Equal next use: the deeper goes first. */
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &b);
	kvfs_policy_remove(p, GPU, &b);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_node, &a), &c);
	/* a was set aside by the filter; a new request brings it back. */
	{
		struct kvfs_paccess r2 = { .now = 2, .request = 2 };
		struct kvfs_pnode e;

		mknode(&e, 5, NULL, 3);
		kvfs_policy_insert(p, GPU, &e, &r2);
		assert_ptr_equal(kvfs_policy_victim(p, GPU, NULL, NULL), &a);
		/* Only filtered blocks left: none is returned. */
		kvfs_policy_remove(p, GPU, &c);
		kvfs_policy_remove(p, GPU, &e);
		assert_null(kvfs_policy_victim(p, GPU, not_node, &a));
		kvfs_policy_remove(p, GPU, &a);
		assert_int_equal(p->count[GPU], 0);
		assert_null(kvfs_policy_victim(p, GPU, NULL, NULL));
	}
	kvfs_policy_free(p);
}

/* ---- exhaustive optimum on tiny traces ---- */

#define MAXN 14   /* tree nodes */
#define MAXR 10   /* requests */
#define MAXL 3    /* blocks per request */

struct tiny {
	int nreq, len[MAXR], path[MAXR][MAXL];
	int nnodes, parent[MAXN];
	unsigned cap;
	int8_t *memo; /* (r, j, mask) -> best + 1, 0 = unknown */
};

/* The chains the requests are prefixes of: shared heads, branches. */
static const int64_t chains[][MAXL] = {
	{ 1, 2, 3 }, { 1, 2, 4 }, { 1, 5, 6 }, { 7, 8, 9 }, { 7, 10, 11 },
	{ 12, 13, 14 },
};

static unsigned desc_mask(const struct tiny *t, int v, unsigned mask)
{
	unsigned out = 1u << v;
	bool grew = true;

	while (grew) {
		grew = false;
		for (int n = 0; n < t->nnodes; n++)
			if (!(out & (1u << n)) && t->parent[n] >= 0 &&
			    (out & (1u << t->parent[n])) && (mask & (1u << n))) {
				out |= 1u << n;
				grew = true;
			}
	}
	return out & mask;
}

static int best_from(struct tiny *t, int r, unsigned mask);

/* Insert position @j of request @r onwards; returns future hits. */
static int best_ins(struct tiny *t, int r, int j, unsigned mask)
{
	size_t key = ((size_t)r * (MAXL + 1) + (size_t)j) << MAXN | mask;
	unsigned pinned = 0;
	int best = -1, x;

	if (j == t->len[r])
		return best_from(t, r + 1, mask);
	if (t->memo[key])
		return t->memo[key] - 1;
	x = t->path[r][j];
	if ((unsigned)__builtin_popcount(mask) + 1 <= t->cap) {
		best = best_ins(t, r, j + 1, mask | 1u << x);
	} else {
		for (int k = 0; k < t->len[r]; k++)
			pinned |= 1u << t->path[r][k];
		for (int v = 0; v < t->nnodes; v++) {
			int h;

			if (!(mask & (1u << v)) || (pinned & (1u << v)))
				continue;
			h = best_ins(t, r, j, mask & ~desc_mask(t, v, mask));
			if (h > best)
				best = h;
		}
		if (best < 0) /* no victim: the rest is not cached */
			best = best_from(t, r + 1, mask);
	}
	t->memo[key] = (int8_t)(best + 1);
	return best;
}

static int best_from(struct tiny *t, int r, unsigned mask)
{
	int h = 0;

	if (r == t->nreq)
		return 0;
	while (h < t->len[r] && (mask & (1u << t->path[r][h])))
		h++;
	return h + best_ins(t, r, h, mask);
}

static void build_tiny(struct tiny *t, struct kvfs_trace *tr, unsigned *seed)
{
	int64_t nodekey[MAXN];

	memset(t, 0, sizeof(*t));
	t->nreq = 4 + rand_r(seed) % (MAXR - 3);
	t->cap = 1 + (unsigned)(rand_r(seed) % 4);
	kvfs_trace_init(tr, KVFS_TRACE_MOONCAKE, 16);
	for (int r = 0; r < t->nreq; r++) {
		int c = rand_r(seed) % 6, len = 1 + rand_r(seed) % MAXL;
		struct kvfs_trace_req q = { .ts_ms = (uint64_t)r,
					    .input_len = 16u * (unsigned)len };
		int parent = -1;

		t->len[r] = len;
		for (int j = 0; j < len; j++) {
			int n;

			/* Chains are prefix-consistent: the id names the
			 * node.
			 */
			for (n = 0; n < t->nnodes; n++)
				if (nodekey[n] == chains[c][j])
					break;
			if (n == t->nnodes) {
				nodekey[n] = chains[c][j];
				t->parent[n] = parent;
				t->nnodes++;
			}
			t->path[r][j] = n;
			parent = n;
		}
		assert_int_equal(kvfs_trace_add(tr, &q, chains[c],
						(uint32_t)len, NULL), 0);
	}
}

static uint64_t sim_hits(const struct kvfs_trace *tr, const char *policy,
			 unsigned cap)
{
	struct kvfs_sim_conf c = { .policy = policy, .cap = { cap, 0, 0 } };
	struct kvfs_sim_stats st;
	struct kvfs_sim *s;

	kvfs_sim_model_default(&c.model);
	assert_int_equal(kvfs_sim_new(tr, &s), 0);
	assert_int_equal(kvfs_sim_run(s, &c, &st), 0);
	kvfs_sim_free(s);
	return st.hit_blocks;
}

static void test_bruteforce(void **state)
{
	unsigned seed = 12345;
	int differs_from_lru = 0;

	for (int it = 0; it < 300; it++) {
		struct tiny t;
		struct kvfs_trace tr;
		int opt;
		uint64_t bel, lru;

		build_tiny(&t, &tr, &seed);
		t.memo = calloc((size_t)MAXR * (MAXL + 1) << MAXN, 1);
		assert_non_null(t.memo);
		opt = best_from(&t, 0, 0);
		bel = sim_hits(&tr, "belady", t.cap);
		lru = sim_hits(&tr, "lru", t.cap);
		assert_int_equal((int)bel, opt);
		assert_true(lru <= bel);
		assert_true(sim_hits(&tr, "arc", t.cap) <= bel);
		if (lru < bel)
			differs_from_lru++;
		free(t.memo);
		kvfs_trace_release(&tr);
	}
	/* The traces are hard enough for the optimum to matter. */
	assert_true(differs_from_lru > 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_bruteforce),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
