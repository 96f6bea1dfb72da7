// SPDX-License-Identifier: MIT
/*
 * Unit tests for kvfs's own policy (cache/policy_kvfs.c): admission on
 * second sight (the fleet's sightings count too), the request's tail, its
 * new suffix, dead weight, and the CLOCK of main with the passes a deep
 * prefix buys, the history kept of
 * blocks let go and the refilled context of a conversation, each on a
 * small hand-made sequence; the history table (cache/policy_util.c); and
 * the miniature simulations (cache/policy_mini.c) that choose its horizon.
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
#include "cache/policy_kvfs_i.h"

#define GPU KVFS_TIER_GPU
#define DRAM KVFS_TIER_DRAM

static void mknode(struct kvfs_pnode *n, uint64_t id, struct kvfs_pnode *par,
		   uint32_t tokens)
{
	memset(n, 0, sizeof(*n));
	memcpy(n->key, &id, sizeof(id));
	n->parent = par;
	n->depth = par ? par->depth + 1 : 0;
	n->tokens = tokens;
	n->size = 1;
	n->next_use = UINT64_MAX;
}

static struct kvfs_policy *mk(uint64_t gpu, uint64_t dram)
{
	uint64_t cap[KVFS_NTIERS] = { gpu, dram, 0 };
	struct kvfs_policy *p = NULL;

	assert_int_equal(kvfs_policy_new("kvfs", NULL, NULL, 0, cap, &p), 0);
	return p;
}

static void ins(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		uint64_t r)
{
	struct kvfs_paccess a = { .now = r, .request = r };

	kvfs_policy_insert(p, tier, n, &a);
}

/* @n[0..count) as roots of 16 tokens, keys 1.., filled in order from
 * request @r on.
 */
static void fill_roots(struct kvfs_policy *p, struct kvfs_pnode *n,
		       size_t count, uint64_t r)
{
	for (size_t i = 0; i < count; i++) {
		mknode(&n[i], i + 1, NULL, 16);
		ins(p, GPU, &n[i], r + i);
	}
}

static struct kvfs_pnode *evict(struct kvfs_policy *p, int tier)
{
	struct kvfs_pnode *v = kvfs_policy_victim(p, tier, NULL, NULL);

	if (v)
		kvfs_policy_remove(p, tier, v);
	return v;
}

/* A block seen before (though evicted since) outlives newer first
 * sights: they are evicted first, oldest first.  That is a scan of new
 * blocks flushing nothing seen twice.
 */
static void test_second_sight(void **state)
{
	struct kvfs_policy *p = mk(4, 0);
	struct kvfs_pnode a, b, c, d;

	mknode(&a, 1, NULL, 16);
	mknode(&b, 2, NULL, 16);
	mknode(&c, 3, NULL, 16);
	mknode(&d, 4, NULL, 16);
	ins(p, GPU, &a, 1);
	kvfs_policy_forget(p, &a); /* gone, but remembered */
	ins(p, GPU, &a, 2); /* second sight: main */
	ins(p, GPU, &b, 3);
	ins(p, GPU, &c, 4);
	ins(p, GPU, &d, 5);
	assert_ptr_equal(evict(p, GPU), &b);
	assert_ptr_equal(evict(p, GPU), &c);
	assert_ptr_equal(evict(p, GPU), &d);
	assert_ptr_equal(evict(p, GPU), &a);
	kvfs_policy_free(p);
}

/* A block another host of the fleet referenced is no first sight here:
 * it enters main and outlives newer first sights.  With `sight=0` the
 * fleet's word is ignored and it is evicted first, as a first sight.
 * Other policies take the call and ignore it.
 */
static void run_sight(const char *level)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "sight" }, *v[] = { level };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode n[4], a;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	/* Not held here: the caller passes no node. */
	mknode(&a, 1, NULL, 16);
	kvfs_policy_sight(p, a.key, NULL);
	fill_roots(p, n, 4, 1);
	assert_ptr_equal(evict(p, GPU), strcmp(level, "0") ? &n[1] : &n[0]);
	kvfs_policy_free(p);
}

/* A block this host holds on its first sight, referenced by another host:
 * with `sight=3` the fleet's reference moves it to main as a hit here
 * would, and the newer first sights go before it; with 2 (the default)
 * and 1 it stays a first sight here, the oldest, and goes first.  A node
 * no tier holds is not passed on as one.
 */
static void run_sight_held(const char *level)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "sight" }, *v[] = { level };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode n[4], gone;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	fill_roots(p, n, 4, 1);
	mknode(&gone, 5, NULL, 16);
	kvfs_policy_sight(p, n[0].key, &n[0]);
	kvfs_policy_sight(p, gone.key, &gone);
	assert_int_equal(gone.tiers, 0);
	assert_ptr_equal(evict(p, GPU), strcmp(level, "3") ? &n[0] : &n[1]);
	kvfs_policy_free(p);
}

/* A block this host holds in main, referenced by another host: with
 * `sight=2` (the default) and 3 it gets one more CLOCK pass, as a hit
 * here would, and the other block of main goes before it; with 1 and 0
 * it is still the older of the two, and goes first.
 */
static void run_sight_main(const char *level)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "sight" }, *v[] = { level };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode a, b;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	mknode(&a, 1, NULL, 16);
	mknode(&b, 2, NULL, 16);
	ins(p, GPU, &a, 1);
	kvfs_policy_forget(p, &a);
	ins(p, GPU, &a, 2); /* second sight: main */
	ins(p, GPU, &b, 3);
	kvfs_policy_forget(p, &b);
	ins(p, GPU, &b, 4);
	kvfs_policy_sight(p, a.key, &a);
	assert_ptr_equal(evict(p, GPU), level[0] >= '2' ? &b : &a);
	kvfs_policy_free(p);
}

/* The fleet's sightings keep a sketch of their own, which halves on its
 * own additions: however many keys other hosts send, the host's own
 * sightings are halved only every `window` capacities of its own
 * references.  Here (window 1 of a 4-block cache, so the host's sketch
 * halves every 4 of its own) n[0] is seen once, let go, and 8 keys are
 * heard before it comes back: it is still a second sight, enters main,
 * and outlives the newer first sights.  Counted in one sketch, the 8
 * would have halved its sighting away twice.
 */
static void test_sight_own_clock(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "window", "hist", "recent" };
	const char *v[] = { "1", "0", "0" };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode n[4], h;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 3, cap, &p), 0);
	fill_roots(p, n, 1, 1);
	assert_ptr_equal(evict(p, GPU), &n[0]);
	kvfs_policy_forget(p, &n[0]);
	for (uint64_t i = 0; i < 8; i++) {
		mknode(&h, 100 + i, NULL, 16);
		kvfs_policy_sight(p, h.key, NULL);
	}
	fill_roots(p, n, 4, 2);
	assert_ptr_equal(evict(p, GPU), &n[1]);
	kvfs_policy_free(p);
}

static void test_sight(void **state)
{
	struct kvfs_policy *p = NULL;
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	struct kvfs_pnode a;

	run_sight("2");
	run_sight("1");
	run_sight("0");
	run_sight_held("3");
	run_sight_held("2");
	run_sight_held("1");
	run_sight_held("0");
	run_sight_main("3");
	run_sight_main("2");
	run_sight_main("1");
	run_sight_main("0");
	assert_int_equal(kvfs_policy_new("lru", NULL, NULL, 0, cap, &p), 0);
	mknode(&a, 7, NULL, 16);
	ins(p, GPU, &a, 1);
	kvfs_policy_sight(p, a.key, &a);
	assert_ptr_equal(evict(p, GPU), &a);
	kvfs_policy_free(p);
}

/* A block let go lately is a second sight even when the sketch has
 * forgotten it: the sketch halves its counts every `window` capacities
 * of references, and a block seen once just before a halving is gone
 * from it at once, while ARC's ghost list keeps the last capacity of
 * first sights let go, however soon they come back.  Here the sketch
 * (window 1 of a 4-block cache) is halved twice by hits on m after a
 * was let go.  With `recent=0` a is then a first sight again, and goes
 * before the newer first sight b.
 */
static void run_recent(bool on)
{
	const char *k[] = { "window", "hist", "recent" };
	const char *v[] = { "1", "0", on ? "1" : "0" };
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode m, a, b;
	struct kvfs_pnode *path[1] = { &m };

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 3, cap, &p), 0);
	mknode(&m, 1, NULL, 16);
	mknode(&a, 2, NULL, 16);
	mknode(&b, 3, NULL, 16);
	ins(p, GPU, &m, 1);
	for (uint64_t r = 2; r < 4; r++) {
		struct kvfs_paccess x = { .now = r, .request = r, .hit = true };

		kvfs_policy_access(p, path, 1, &x); /* m: main */
	}
	ins(p, GPU, &a, 4);
	assert_ptr_equal(evict(p, GPU), &a); /* a first sight: let go */
	for (uint64_t r = 5; r < 13; r++) {
		struct kvfs_paccess x = { .now = r, .request = r, .hit = true };

		kvfs_policy_access(p, path, 1, &x);
	}
	ins(p, GPU, &a, 13);
	ins(p, GPU, &b, 14);
	assert_ptr_equal(evict(p, GPU), on ? &b : &a);
	kvfs_policy_free(p);
}

static void test_recent(void **state)
{
	run_recent(true);
	run_recent(false);
}

/* A first-sight partial block (the tail of a prompt) goes before full
 * first sights, though it is newer; seen twice it is like any other.
 */
static void test_tail(void **state)
{
	struct kvfs_policy *p = mk(4, 0);
	struct kvfs_pnode x, y, t;

	mknode(&x, 10, NULL, 16);
	mknode(&y, 11, NULL, 16);
	mknode(&t, 12, &y, 5);
	ins(p, GPU, &x, 1);
	ins(p, GPU, &y, 2);
	ins(p, GPU, &t, 2);
	assert_ptr_equal(evict(p, GPU), &t);
	assert_ptr_equal(evict(p, GPU), &x);
	ins(p, GPU, &t, 3); /* second sight: main, so y goes first */
	assert_ptr_equal(evict(p, GPU), &y);
	kvfs_policy_free(p);
}

/* True when the next two victims are @a and @b, in either order (the
 * blocks of one request share an order stamp).
 */
static bool evict_pair(struct kvfs_policy *p, struct kvfs_pnode *a,
		       struct kvfs_pnode *b)
{
	struct kvfs_pnode *x = evict(p, GPU), *y = evict(p, GPU);

	return (x == a && y == b) || (x == b && y == a);
}

/* The new blocks a request adds after a prefix it found resident (its
 * suffix) go before the first sights of a new chain, though they are
 * newer, once that prefix has had a suffix before: it is then shared,
 * and what follows it is a one-off query (a few-shot question after its
 * examples).  A block under a parent on its first sight takes its
 * parent's class.  `suffix` = 0 treats them all as any first sight.
 * (The first suffix, a conversation's next turn, is test_turn's; here it
 * stays a first sight.)
 */
static void run_suffix(bool on)
{
	const char *k[] = { "suffix", "turn" }, *v[] = { on ? "1" : "0", "0" };
	uint64_t cap[KVFS_NTIERS] = { 8, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode h, s1, s2, u1, u2, r1, r2;
	struct kvfs_pnode *path[1] = { &h };
	struct kvfs_paccess a3 = { .now = 3, .request = 3, .hit = true };
	struct kvfs_paccess a4 = { .now = 4, .request = 4, .hit = true };

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 2, cap, &p), 0);
	mknode(&h, 30, NULL, 16);
	mknode(&s1, 31, &h, 16);
	mknode(&s2, 32, &s1, 16);
	mknode(&u1, 35, &h, 16);
	mknode(&u2, 36, &u1, 16);
	mknode(&r1, 33, NULL, 16);
	mknode(&r2, 34, &r1, 16);
	ins(p, GPU, &h, 1);
	ins(p, GPU, &r1, 2); /* a new chain */
	ins(p, GPU, &r2, 2);
	kvfs_policy_access(p, path, 1, &a3); /* h: a known prefix */
	ins(p, GPU, &s1, 3); /* its first suffix */
	ins(p, GPU, &s2, 3);
	kvfs_policy_access(p, path, 1, &a4);
	ins(p, GPU, &u1, 4); /* its second: h is shared */
	ins(p, GPU, &u2, 4);
	if (on)
		assert_true(evict_pair(p, &u1, &u2));
	assert_true(evict_pair(p, &r1, &r2));
	assert_true(evict_pair(p, &s1, &s2));
	if (!on)
		assert_true(evict_pair(p, &u1, &u2));
	assert_ptr_equal(evict(p, GPU), &h);
	kvfs_policy_free(p);
}

static void test_suffix(void **state)
{
	run_suffix(true);
	run_suffix(false);
}

/* The first suffix a known prefix gets is a conversation's next turn: it
 * enters main, so it outlives a newer new chain (with `turn` = 0 it is a
 * first sight, older, and goes first).  A turn and the blocks below it
 * are the conversation's: their hits buy at most `conv` CLOCK passes (1),
 * so with the same hits the prefix they hang from outlives them; with
 * `conv` = 3 it is the other way round, the prefix being older.
 */
/* A conversation going on: @h (key @id) filled at request 1 and read
 * again at 2, a known prefix, then its next turn @t1 -> @t2 filled at 3.
 */
static void turn_fill(struct kvfs_policy *p, struct kvfs_pnode *h,
		      struct kvfs_pnode *t1, struct kvfs_pnode *t2, uint64_t id)
{
	struct kvfs_pnode *path[1] = { h };
	struct kvfs_paccess a = { .now = 2, .request = 2, .hit = true };

	mknode(h, id, NULL, 16);
	mknode(t1, id + 1, h, 16);
	mknode(t2, id + 2, t1, 16);
	ins(p, GPU, h, 1);
	kvfs_policy_access(p, path, 1, &a);
	ins(p, GPU, t1, 3);
	ins(p, GPU, t2, 3);
}

static void run_turn(bool on, const char *conv)
{
	const char *k[] = { "turn", "conv" }, *v[] = { on ? "1" : "0", conv };
	uint64_t cap[KVFS_NTIERS] = { 8, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode h, t1, t2, r1, r2;
	struct kvfs_pnode *path[3] = { &h, &t1, &t2 };

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 2, cap, &p), 0);
	turn_fill(p, &h, &t1, &t2, 60);
	mknode(&r1, 63, NULL, 16);
	mknode(&r2, 64, &r1, 16);
	ins(p, GPU, &r1, 4); /* a new chain, newer */
	ins(p, GPU, &r2, 4);
	if (!on) {
		assert_true(evict_pair(p, &t1, &t2));
		assert_true(evict_pair(p, &r1, &r2));
		kvfs_policy_free(p);
		return;
	}
	assert_true(evict_pair(p, &r1, &r2));
	/* The turn read again three times, with its prefix. */
	for (uint64_t r = 5; r < 8; r++) {
		struct kvfs_paccess b = { .now = r, .request = r, .hit = true };

		kvfs_policy_access(p, path, 3, &b);
	}
	if (!strcmp(conv, "1")) {
		assert_true(evict_pair(p, &t1, &t2));
		assert_ptr_equal(evict(p, GPU), &h);
	} else {
		assert_ptr_equal(evict(p, GPU), &h);
		assert_true(evict_pair(p, &t1, &t2));
	}
	kvfs_policy_free(p);
}

static void test_turn(void **state)
{
	run_turn(true, "1");
	run_turn(true, "3");
	run_turn(false, "1");
}

/* What a miss costs.  With `deep` at 32 tokens (two blocks), a chain
 * c0 -> c1 -> c2 the fleet has seen enters main 48 tokens deep: c2 gets a
 * CLOCK pass, and so do its ancestors, so the newer root b, with none,
 * goes first.  With `deep=0` main is in order and the chain, older, goes
 * first.
 */
static void run_deep(const char *deep)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "deep" }, *v[] = { deep };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode c0, c1, c2, b, *x;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	mknode(&c0, 90, NULL, 16);
	mknode(&c1, 91, &c0, 16);
	mknode(&c2, 92, &c1, 16);
	mknode(&b, 93, NULL, 16);
	kvfs_policy_sight(p, c0.key, NULL);
	kvfs_policy_sight(p, c1.key, NULL);
	kvfs_policy_sight(p, c2.key, NULL);
	kvfs_policy_sight(p, b.key, NULL);
	ins(p, GPU, &c0, 1);
	ins(p, GPU, &c1, 1);
	ins(p, GPU, &c2, 1);
	ins(p, GPU, &b, 2);
	x = evict(p, GPU);
	if (strcmp(deep, "0"))
		assert_ptr_equal(x, &b);
	else
		assert_true(x == &c0 || x == &c1 || x == &c2);
	kvfs_policy_free(p);
}

/* A conversation's blocks get no pass for their depth: a turn t1 -> t2
 * under a known prefix h, however deep, stays in main's order, and h,
 * the oldest there, goes before the newer root b.
 */
static void test_deep_conv(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k[] = { "deep" }, *v[] = { "32" };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode h, t1, t2, b;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	/* h in main, the turn t1 -> t2 a conversation's */
	turn_fill(p, &h, &t1, &t2, 94);
	mknode(&b, 97, NULL, 16);
	kvfs_policy_sight(p, b.key, NULL);
	ins(p, GPU, &b, 4);
	assert_ptr_equal(evict(p, GPU), &h);
	kvfs_policy_free(p);
}

static void test_deep(void **state)
{
	run_deep("32");
	run_deep("0");
}

/* Main is a CLOCK: a hit buys one more pass; hits move nothing. */
static void test_main_clock(void **state)
{
	struct kvfs_policy *p = mk(4, 0);
	struct kvfs_pnode a, b;
	struct kvfs_pnode *path[1] = { &a };
	struct kvfs_paccess acc = { .now = 9, .request = 9, .hit = true };

	mknode(&a, 20, NULL, 16);
	mknode(&b, 21, NULL, 16);
	ins(p, GPU, &a, 1);
	ins(p, GPU, &b, 2);
	kvfs_policy_access(p, path, 1, &acc); /* a: main, no credit yet */
	path[0] = &b;
	kvfs_policy_access(p, path, 1, &acc); /* b: main */
	path[0] = &a;
	kvfs_policy_access(p, path, 1, &acc); /* a: one credit */
	assert_ptr_equal(evict(p, GPU), &b);
	assert_ptr_equal(evict(p, GPU), &a);
	kvfs_policy_free(p);
}

/* Dead weight: a block whose parent is resident nowhere is never
 * admitted below; with its parent resident it is.
 */
static void test_dead_weight(void **state)
{
	struct kvfs_policy *p = mk(1, 1);
	struct kvfs_pnode par, ch, other, tl, par2, c1, c2;

	mknode(&par, 30, NULL, 16);
	mknode(&ch, 31, &par, 16);
	mknode(&other, 32, NULL, 16);
	ins(p, DRAM, &par, 1);
	ins(p, GPU, &ch, 1);
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &ch));
	kvfs_policy_remove(p, DRAM, &par);
	assert_false(kvfs_policy_admit(p, GPU, DRAM, &ch));
	/* A full lower tier refuses a first-sight tail, not a full block
	 * (a suffix of a shared prefix, evicted as early as a tail, is
	 * still admitted).
	 */
	ins(p, DRAM, &other, 2);
	ch.parent = NULL;
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &ch));
	mknode(&tl, 33, NULL, 5);
	ins(p, GPU, &tl, 3);
	assert_false(kvfs_policy_admit(p, GPU, DRAM, &tl));
	mknode(&par2, 34, NULL, 16);
	mknode(&c1, 35, &par2, 16);
	mknode(&c2, 36, &par2, 16);
	ins(p, DRAM, &par2, 4);
	ins(p, GPU, &c1, 5);
	ins(p, GPU, &c2, 6); /* par2's second suffix */
	assert_true(kvfs_policy_admit(p, GPU, DRAM, &c2));
	assert_ptr_equal(evict(p, GPU), &tl);
	assert_ptr_equal(evict(p, GPU), &c2);
	assert_ptr_equal(evict(p, GPU), &ch);
	assert_ptr_equal(evict(p, GPU), &c1);
	kvfs_policy_free(p);
}

static bool not_arg(struct kvfs_pnode *x, void *arg)
{
	return x != arg;
}

/* The caller's filter (pins, leases, readers) is honoured in every list;
 * with nothing allowed, no victim.
 */
static void test_filter(void **state)
{
	struct kvfs_policy *p = mk(4, 0);
	struct kvfs_pnode a, b;

	mknode(&a, 40, NULL, 16);
	mknode(&b, 41, NULL, 16);
	ins(p, GPU, &a, 1);
	ins(p, GPU, &b, 2);
	assert_ptr_equal(kvfs_policy_victim(p, GPU, not_arg, &a), &b);
	kvfs_policy_remove(p, GPU, &b);
	assert_null(kvfs_policy_victim(p, GPU, not_arg, &a));
	kvfs_policy_free(p);
}

static void test_options(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 4, 0, 0 };
	const char *k1[] = { "window" }, *v1[] = { "0" };
	const char *k2[] = { "nope" }, *v2[] = { "1" };
	const char *k4[] = { "mini", "span" }, *v4[] = { "0", "32" };
	const char *k5[] = { "mini" }, *v5[] = { "2" };
	const char *k6[] = { "suffix" }, *v6[] = { "2" };
	const char *k7[] = { "turn" }, *v7[] = { "2" };
	const char *k8[] = { "conv" }, *v8[] = { "4" };
	const char *k9[] = { "refill" }, *v9[] = { "3" };
	const char *k10[] = { "sess" }, *v10[] = { "3" };
	const char *k11[] = { "sight" }, *v11[] = { "4" };
	const char *k12[] = { "deep" }, *v12[] = { "1073741825" };
	const char *k13[] = { "aside" }, *v13[] = { "2" };
	const char *k14[] = { "stay", "aside" }, *v14[] = { "0", "1" };
	const char *k15[] = { "stay" }, *v15[] = { "3" };
	const char *k3[] = { "ghost", "tail", "leaf", "prob", "window" };
	const char *v3[] = { "0", "0", "1", "100", "32" };
	struct kvfs_policy *p = NULL;

	assert_int_equal(kvfs_policy_new("kvfs", k1, v1, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k2, v2, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k3, v3, 5, cap, &p), 0);
	kvfs_policy_free(p);
	assert_int_equal(kvfs_policy_new("kvfs", k4, v4, 2, cap, &p), 0);
	kvfs_policy_free(p);
	assert_int_equal(kvfs_policy_new("kvfs", k5, v5, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k6, v6, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k7, v7, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k8, v8, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k9, v9, 1, cap, &p), -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k10, v10, 1, cap, &p),
			 -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k11, v11, 1, cap, &p),
			 -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k12, v12, 1, cap, &p),
			 -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k13, v13, 1, cap, &p),
			 -EINVAL);
	assert_int_equal(kvfs_policy_new("kvfs", k14, v14, 2, cap, &p), 0);
	kvfs_policy_free(p);
	assert_int_equal(kvfs_policy_new("kvfs", k15, v15, 1, cap, &p),
			 -EINVAL);
	v15[0] = "1";
	assert_int_equal(kvfs_policy_new("kvfs", k15, v15, 1, cap, &p), 0);
	kvfs_policy_free(p);
}

/* The history table gives a key's word back once, keeps the keys put
 * last when buckets overflow, and a zero word forgets.
 */
static void test_hist_table(void **state)
{
	struct kvfs_phist h;
	uint8_t k[16] = { 0 };
	int kept = 0;

	assert_int_equal(kvfs_phist_init(&h, 64), 0);
	k[0] = 1;
	assert_int_equal(kvfs_phist_take(&h, k), 0);
	kvfs_phist_put(&h, k, 0x123456789abcull);
	assert_int_equal(kvfs_phist_take(&h, k), 0x123456789abcull);
	assert_int_equal(kvfs_phist_take(&h, k), 0);
	kvfs_phist_put(&h, k, 7);
	kvfs_phist_put(&h, k, 8); /* replaces, not a second copy */
	assert_int_equal(kvfs_phist_take(&h, k), 8);
	assert_int_equal(kvfs_phist_take(&h, k), 0);
	kvfs_phist_put(&h, k, 9);
	kvfs_phist_put(&h, k, 0);
	assert_int_equal(kvfs_phist_take(&h, k), 0);
	/* Bits above the word's 48 are not kept. */
	kvfs_phist_put(&h, k, (1ull << 48) | 5);
	assert_int_equal(kvfs_phist_take(&h, k), 5);
	/* 1,000 keys into 64 slots: the last one put is there, and no
	 * more than 64 are.
	 */
	for (uint32_t i = 0; i < 1000; i++) {
		memcpy(k + 4, &i, sizeof(i));
		kvfs_phist_put(&h, k, i + 1);
	}
	assert_int_equal(kvfs_phist_take(&h, k), 1000);
	for (uint32_t i = 0; i < 999; i++) {
		uint64_t w;

		memcpy(k + 4, &i, sizeof(i));
		w = kvfs_phist_take(&h, k);
		assert_true(w == 0 || w == i + 1);
		kept += w != 0;
	}
	assert_true(kept > 0 && kept < 64);
	kvfs_phist_release(&h);
	kvfs_phist_release(&h);
}

/* What the policy learnt of a block outlives its node: forget() leaves
 * the node as a new one (the daemon frees it), and the block written
 * again gets its history back from the table.  Here a prefix that had
 * two suffixes is still a shared prefix after it was let go: its next
 * suffix is a one-off query and goes before an older new chain, where a
 * prefix with no history would take it as a conversation's next turn.
 */
static void test_history(void **state)
{
	uint64_t cap[KVFS_NTIERS] = { 8, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode h, s1, s2, s3, r1;
	struct kvfs_pnode *path[1] = { &h };
	struct kvfs_paccess a = { .hit = true };

	assert_int_equal(kvfs_policy_new("kvfs", NULL, NULL, 0, cap, &p), 0);
	mknode(&h, 70, NULL, 16);
	mknode(&s1, 71, &h, 16);
	mknode(&s2, 72, &h, 16);
	mknode(&s3, 73, &h, 16);
	mknode(&r1, 74, NULL, 16);
	ins(p, GPU, &h, 1);
	for (uint64_t r = 2; r < 4; r++) {
		a.now = a.request = r;
		kvfs_policy_access(p, path, 1, &a);
		ins(p, GPU, r == 2 ? &s1 : &s2, r);
	}
	kvfs_policy_forget(p, &s1);
	kvfs_policy_forget(p, &s2);
	kvfs_policy_forget(p, &h);
	assert_int_equal(h.hist[1], 0);
	ins(p, GPU, &h, 4); /* seen before: main, and shared again */
	ins(p, GPU, &r1, 5); /* a new chain */
	a.now = a.request = 6;
	kvfs_policy_access(p, path, 1, &a);
	ins(p, GPU, &s3, 6); /* h's third suffix */
	assert_ptr_equal(evict(p, GPU), &s3);
	assert_ptr_equal(evict(p, GPU), &r1);
	assert_ptr_equal(evict(p, GPU), &h);
	kvfs_policy_free(p);
}

/* A policy with `refill` = @mode, and a conversation in it: system prompt
 * @h, a turn @t1 @t2 (h's first suffix) written at request 2 and let go,
 * then @t1 @t2 refilled at request 3, after a hit on @h.
 */
static struct kvfs_policy *conversation(const char *mode, struct kvfs_pnode *h,
					struct kvfs_pnode *t1,
					struct kvfs_pnode *t2)
{
	const char *k[] = { "refill" }, *v[] = { mode };
	uint64_t cap[KVFS_NTIERS] = { 16, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode *path[1] = { h };
	struct kvfs_paccess a = { .now = 2, .request = 2, .hit = true };

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	ins(p, GPU, h, 1);
	kvfs_policy_access(p, path, 1, &a);
	ins(p, GPU, t1, 2); /* h's next turn: a conversation's */
	ins(p, GPU, t2, 2);
	kvfs_policy_forget(p, t2);
	kvfs_policy_forget(p, t1);
	a.now = a.request = 3;
	kvfs_policy_access(p, path, 1, &a);
	ins(p, GPU, t1, 3); /* refilled */
	ins(p, GPU, t2, 3);
	return p;
}

/* A conversation: system prompt h, a turn t1 t2 (h's first suffix), let
 * go.  A later request refills t1 t2.  With `refill` = 2 the refills are
 * held in probation: if the request goes on past them with a new block
 * (the next turn, n) they stay there, n with them, and all go before a
 * newer new chain r; if it does not (the same question again) they move
 * to main at the next request and outlive r.  With `refill` = 0, and
 * with 1 before the gate has seen enough, refills enter main at once and
 * n, t2's first suffix, follows them as a next turn.
 */
static void run_refill(const char *mode, bool extend)
{
	struct kvfs_policy *p;
	struct kvfs_pnode h, t1, t2, n, r;
	bool held = !strcmp(mode, "2");

	mknode(&h, 80, NULL, 16);
	mknode(&t1, 81, &h, 16);
	mknode(&t2, 82, &t1, 16);
	mknode(&n, 83, &t2, 16);
	mknode(&r, 84, NULL, 16);
	p = conversation(mode, &h, &t1, &t2);
	if (extend)
		ins(p, GPU, &n, 3); /* the next turn */
	ins(p, GPU, &r, 4);
	if (held && extend) {
		struct kvfs_pnode *x = evict(p, GPU), *y = evict(p, GPU),
				  *z = evict(p, GPU);

		assert_true(x != &r && y != &r && z != &r && x != &h &&
			    y != &h && z != &h);
		assert_ptr_equal(evict(p, GPU), &r);
	} else {
		/* In main, and n with them: t2's first suffix, a turn. */
		assert_ptr_equal(evict(p, GPU), &r);
	}
	kvfs_policy_free(p);
}

static void test_refill(void **state)
{
	run_refill("2", true);
	run_refill("2", false);
	run_refill("0", true);
	run_refill("0", false);
	run_refill("1", true);
}

/* Held refills may be deleted (unlinked) before the request ends: the
 * policy must not walk to them after forget(), when their nodes are
 * freed (the address sanitizer watches this one).
 */
static void test_refill_forget(void **state)
{
	struct kvfs_policy *p;
	struct kvfs_pnode h, *t1 = malloc(sizeof(*t1)),
			     *t2 = malloc(sizeof(*t2)), r;
	struct kvfs_pnode *path[1] = { &h };
	struct kvfs_paccess a = { .now = 5, .request = 5, .hit = true };

	assert_non_null(t1);
	assert_non_null(t2);
	mknode(&h, 90, NULL, 16);
	mknode(t1, 91, &h, 16);
	mknode(t2, 92, t1, 16);
	mknode(&r, 93, NULL, 16);
	p = conversation("2", &h, t1, t2); /* t1 t2 held */
	kvfs_policy_forget(p, t2);
	kvfs_policy_forget(p, t1);
	free(t2);
	free(t1);
	ins(p, GPU, &r, 4); /* a new request: nothing held is left */
	kvfs_policy_access(p, path, 1, &a);
	assert_ptr_equal(evict(p, GPU), &r);
	assert_ptr_equal(evict(p, GPU), &h);
	kvfs_policy_free(p);
}

/* The refill gate's margin.  80 conversations, each a user's prompt u[i]
 * (hit once, so in main) and a turn t[i] under it, are read again after
 * 80 fills of one-off blocks: the mean gap between a conversation's
 * references is then 158 fills.  @gone of them are let go, which leaves
 * main's reach (blocks in main over entries into main per fill) at
 * (161 - 2 x @gone) x 241 / 161 fills when conversation 0 comes back.
 * With @gone = 36 the reach is 133: the mean is past it, but by less
 * than a third, and the refill enters main, so a next turn n follows it
 * there and a newer one-off block r goes first.  With @gone = 46 the
 * reach is 103 and the refill is held: t[0] and n go before r.
 */
static void run_refill_margin(unsigned gone, bool held)
{
	enum { NC = 80, NF = 80 };
	const char *k[] = { "mini" }, *v[] = { "0" };
	uint64_t cap[KVFS_NTIERS] = { 4096, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode u[NC], t[NC], f, n, r, *x, *y;
	struct kvfs_pnode *path[2];
	struct kvfs_paccess a = { .hit = true };
	uint64_t req = 1;

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 1, cap, &p), 0);
	for (unsigned i = 0; i < NC; i++) {
		mknode(&u[i], 1000 + i, NULL, 16);
		mknode(&t[i], 2000 + i, &u[i], 16);
		ins(p, GPU, &u[i], req);
		a.now = a.request = ++req;
		path[0] = &u[i];
		kvfs_policy_access(p, path, 1, &a);
		ins(p, GPU, &t[i], req++); /* u[i]'s first suffix: a turn */
	}
	for (unsigned j = 0; j < NF; j++) {
		mknode(&f, 3000 + j, NULL, 16);
		ins(p, GPU, &f, req++);
		kvfs_policy_forget(p, &f);
	}
	for (unsigned i = 0; i < NC; i++) {
		a.now = a.request = req++;
		path[0] = &u[i];
		path[1] = &t[i];
		kvfs_policy_access(p, path, 2, &a);
	}
	for (unsigned i = 0; i < gone; i++) {
		kvfs_policy_forget(p, &t[i]);
		kvfs_policy_forget(p, &u[i]);
	}
	/* Conversation 0's next request: its context refilled, then a new
	 * block past it.
	 */
	ins(p, GPU, &u[0], req);
	ins(p, GPU, &t[0], req);
	mknode(&n, 4000, &t[0], 16);
	ins(p, GPU, &n, req++);
	mknode(&r, 4001, NULL, 16);
	ins(p, GPU, &r, req);
	if (held) {
		x = evict(p, GPU);
		y = evict(p, GPU);
		assert_true((x == &t[0] && y == &n) || (x == &n && y == &t[0]));
	}
	assert_ptr_equal(evict(p, GPU), &r);
	kvfs_policy_free(p);
}

static void test_refill_margin(void **state)
{
	run_refill_margin(36, false);
	run_refill_margin(46, true);
}

/* New sessions under one system prompt h: 80 of them, each session's
 * block read again by the next request, so their first reuse comes long
 * before main's reach.  With `sess` = 1 the gate then opens and the next
 * session's block enters main, outliving a newer new chain r; before it
 * has seen enough (no session read again), and with `sess` = 0, the
 * block is a suffix of a shared prefix and goes first.
 */
static void run_session(const char *mode, bool reread)
{
	enum { NS = 80 };
	const char *k[] = { "sess", "mini" }, *v[] = { mode, "0" };
	uint64_t cap[KVFS_NTIERS] = { 1024, 0, 0 };
	struct kvfs_policy *p = NULL;
	struct kvfs_pnode h, s[NS], sn, r;
	struct kvfs_pnode *path[2] = { &h, NULL };
	struct kvfs_paccess a = { .hit = true };
	bool open = !strcmp(mode, "2") || (!strcmp(mode, "1") && reread);

	assert_int_equal(kvfs_policy_new("kvfs", k, v, 2, cap, &p), 0);
	mknode(&h, 100, NULL, 16);
	ins(p, GPU, &h, 1);
	for (uint64_t i = 0; i < NS; i++) {
		a.now = a.request = 2 * i + 2;
		kvfs_policy_access(p, path, 1, &a);
		mknode(&s[i], 200 + i, &h, 16);
		ins(p, GPU, &s[i], a.request);
		if (!reread)
			continue;
		a.now = a.request = 2 * i + 3; /* the session's next turn */
		path[1] = &s[i];
		kvfs_policy_access(p, path, 2, &a);
	}
	a.now = a.request = 2 * NS + 2;
	kvfs_policy_access(p, path, 1, &a);
	mknode(&sn, 300, &h, 16);
	ins(p, GPU, &sn, a.request);
	mknode(&r, 301, NULL, 16);
	ins(p, GPU, &r, a.request + 1);
	if (open) {
		assert_ptr_equal(evict(p, GPU), &r);
	} else if (reread) {
		assert_ptr_equal(evict(p, GPU), &sn);
		assert_ptr_equal(evict(p, GPU), &r);
	} else {
		/* The sessions never read again wait on the same list,
		 * older: they go first, then sn, then r.  (s[0], h's first
		 * suffix, was taken for a conversation's next turn: main.)
		 */
		for (int i = 1; i < NS; i++)
			assert_ptr_equal(evict(p, GPU), &s[i]);
		assert_ptr_equal(evict(p, GPU), &sn);
		assert_ptr_equal(evict(p, GPU), &r);
	}
	kvfs_policy_free(p);
}

static void test_session(void **state)
{
	run_session("1", true);
	run_session("1", false);
	run_session("0", true);
	run_session("2", false);
}

static void mref(struct kvfs_pmini *m, struct kvfs_pnode *n, uint64_t r)
{
	struct kvfs_paccess a = { .now = r, .request = r };

	assert_true(kvfs_pmini_sampled(m, n));
	kvfs_pmini_ref(m, n, &a);
}

/* A miniature simulation keeps the prefix tree: a victim leaves with its
 * resident descendants, and a block whose parent is not resident is not
 * cached.  At rate 1 every node is in the sample.
 */
static void test_mini_tree(void **state)
{
	const char *k[] = { "mini", "window" }, *v[] = { "0", "8" };
	struct kvfs_pnode a, b, c;
	struct kvfs_pmini m;

	mknode(&a, 50, NULL, 16);
	mknode(&b, 51, &a, 16);
	mknode(&c, 52, NULL, 16);
	assert_int_equal(kvfs_pmini_init(&m, &kvfs_policy_kvfs_ops, k, v, 2, 2,
					 0, 0),
			 0);
	mref(&m, &a, 1);
	mref(&m, &b, 2);
	assert_int_equal(m.p.count[0], 2);
	mref(&m, &a, 3); /* a hit: main */
	assert_int_equal(m.hits, 1);
	mref(&m, &c, 4); /* probation goes first: b */
	assert_int_equal(m.p.count[0], 2);
	mref(&m, &b, 5); /* a miss; room from c, a first sight */
	assert_int_equal(m.hits, 1);
	mref(&m, &a, 6);
	mref(&m, &b, 6);
	assert_int_equal(m.hits, 3);
	kvfs_pmini_release(&m);

	assert_int_equal(kvfs_pmini_init(&m, &kvfs_policy_kvfs_ops, k, v, 2, 2,
					 0, 0),
			 0);
	mref(&m, &a, 1);
	mref(&m, &b, 2);
	mref(&m, &c, 3); /* probation head: a (older), and b with it */
	assert_int_equal(m.p.count[0], 1);
	assert_int_equal(m.p.used[0], 1);
	mref(&m, &b, 4); /* parent gone: not cached */
	assert_int_equal(m.p.count[0], 1);
	assert_int_equal(m.hits, 0);
	kvfs_pmini_release(&m);
}

/* Sampling is by the chain's root: a chain is in or out as a whole, and
 * about 1/2^shift of the roots are in.
 */
static void test_mini_sample(void **state)
{
	const char *k[] = { "mini" }, *v[] = { "0" };
	static struct kvfs_pnode r[4096], ch[4096];
	struct kvfs_pmini m;
	int in = 0;

	assert_int_equal(kvfs_pmini_init(&m, &kvfs_policy_kvfs_ops, k, v, 1, 64,
					 3, 0),
			 0);
	for (int i = 0; i < 4096; i++) {
		mknode(&r[i], 1000 + (uint64_t)i, NULL, 16);
		mknode(&ch[i], 100000 + (uint64_t)i, &r[i], 16);
		assert_int_equal(kvfs_pmini_sampled(&m, &ch[i]),
				 kvfs_pmini_sampled(&m, &r[i]));
		in += kvfs_pmini_sampled(&m, &r[i]);
	}
	assert_true(in > 4096 / 16 && in < 4096 / 4);
	kvfs_pmini_release(&m);
}

/* The count of main's blocks with no pass left (stay's bar, `stay=2`)
 * follows every change of a count or a list: after each call of a
 * random run over two tiers (fills, hits, sightings, moves down,
 * evictions, with main as a CLOCK, as an LRU, with no pass for a
 * conversation's blocks, and with passes for depth) it equals a recount
 * of the lists.
 */
#define IDLE_CHAINS 12
#define IDLE_DEPTH 4

struct idle_run {
	struct kvfs_policy *p;
	struct kvfs_pnode n[IDLE_CHAINS * IDLE_DEPTH];
	uint64_t rng, req;
	int chain; /* the chain the request in flight pins, or -1 */
};

static uint32_t idle_rand(struct idle_run *r)
{
	r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(r->rng >> 33);
}

static bool idle_ok(struct kvfs_pnode *n, void *arg)
{
	struct idle_run *r = arg;

	return r->chain < 0 || (n - r->n) / IDLE_DEPTH != r->chain;
}

static void idle_check(struct idle_run *r)
{
	struct kvfs_pkvfs *f = r->p->priv;
	uint64_t idle = 0;

	for (int t = 0; t < KVFS_NTIERS; t++)
		for (struct kvfs_pnode *x = f->t[t].l[KV_MAIN].head; x;
		     x = x->t[t].next)
			idle += !x->t[t].idx;
	assert_int_equal(f->st_idle, idle);
}

/* Evict one block of @tier (moving it to DRAM when it leaves the GPU and
 * DRAM takes it); false when none passes the filter.
 */
static bool idle_evict(struct idle_run *r, int tier)
{
	struct kvfs_pnode *v = kvfs_policy_victim(r->p, tier, idle_ok, r);

	if (!v)
		return false;
	if (tier == GPU && kvfs_policy_admit(r->p, GPU, DRAM, v)) {
		while (r->p->used[DRAM] + v->size > r->p->capacity[DRAM] &&
		       idle_evict(r, DRAM))
			;
		if (r->p->used[DRAM] + v->size <= r->p->capacity[DRAM]) {
			struct kvfs_paccess a = { .now = r->req,
						  .request = r->req };

			kvfs_policy_insert(r->p, DRAM, v, &a);
			idle_check(r);
		}
	}
	kvfs_policy_remove(r->p, tier, v);
	if (!v->tiers)
		kvfs_policy_forget(r->p, v);
	idle_check(r);
	return true;
}

static void idle_request(struct idle_run *r)
{
	struct kvfs_paccess a = { .now = ++r->req, .request = r->req };
	struct kvfs_pnode *path[IDLE_DEPTH];
	int c = (int)(idle_rand(r) % IDLE_CHAINS);
	int d = (int)(idle_rand(r) % IDLE_DEPTH) + 1, hit = 0;
	struct kvfs_pnode *n = &r->n[c * IDLE_DEPTH];

	while (hit < d && n[hit].tiers)
		path[hit] = &n[hit], hit++;
	r->chain = c;
	if (hit) {
		kvfs_policy_access(r->p, path, (size_t)hit, &a);
		idle_check(r);
	}
	for (int i = hit; i < d; i++) {
		while (r->p->used[GPU] + n[i].size > r->p->capacity[GPU] &&
		       idle_evict(r, GPU))
			;
		if (r->p->used[GPU] + n[i].size > r->p->capacity[GPU])
			break;
		kvfs_policy_insert(r->p, GPU, &n[i], &a);
		idle_check(r);
	}
	r->chain = -1;
}

static void run_idle(const char *key, const char *val)
{
	uint64_t cap[KVFS_NTIERS] = { 12, 12, 0 };
	const char *k[] = { key }, *v[] = { val };
	struct idle_run r = { .rng = 42, .chain = -1 };

	assert_int_equal(kvfs_policy_new("kvfs", k, v, key ? 1 : 0, cap, &r.p),
			 0);
	for (int i = 0; i < IDLE_CHAINS * IDLE_DEPTH; i++)
		mknode(&r.n[i], (uint64_t)i + 1,
		       i % IDLE_DEPTH ? &r.n[i - 1] : NULL,
		       i % IDLE_DEPTH == IDLE_DEPTH - 1 ? 8 : 16);
	for (int step = 0; step < 4000; step++) {
		uint32_t op = idle_rand(&r) % 10;
		struct kvfs_pnode *x =
			&r.n[idle_rand(&r) % (IDLE_CHAINS * IDLE_DEPTH)];

		if (op < 6) {
			idle_request(&r);
		} else if (op < 8) {
			kvfs_policy_sight(r.p, x->key, x->tiers ? x : NULL);
			idle_check(&r);
		} else {
			idle_evict(&r, op == 8 ? GPU : DRAM);
		}
	}
	kvfs_policy_free(r.p);
}

static void test_idle_count(void **state)
{
	run_idle(NULL, NULL);
	run_idle("lru", "1");
	run_idle("conv", "0");
	run_idle("deep", "16");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_second_sight),
		cmocka_unit_test(test_sight),
		cmocka_unit_test(test_sight_own_clock),
		cmocka_unit_test(test_recent),
		cmocka_unit_test(test_tail),
		cmocka_unit_test(test_suffix),
		cmocka_unit_test(test_turn),
		cmocka_unit_test(test_main_clock),
		cmocka_unit_test(test_deep),
		cmocka_unit_test(test_deep_conv),
		cmocka_unit_test(test_dead_weight),
		cmocka_unit_test(test_filter),
		cmocka_unit_test(test_options),
		cmocka_unit_test(test_hist_table),
		cmocka_unit_test(test_history),
		cmocka_unit_test(test_refill),
		cmocka_unit_test(test_refill_forget),
		cmocka_unit_test(test_refill_margin),
		cmocka_unit_test(test_session),
		cmocka_unit_test(test_mini_tree),
		cmocka_unit_test(test_mini_sample),
		cmocka_unit_test(test_idle_count),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
