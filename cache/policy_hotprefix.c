// SPDX-License-Identifier: MIT
/*
 * hotprefix: the cache policy of "HotPrefix: Hotness-Aware KV Cache
 * Scheduling for Efficient Prefix Sharing in LLM Inference Systems"
 * (Li et al., SIGMOD 2025), generalised from two tiers to kvfs's three.
 * docs/policy-hotprefix.md records every decision taken where the paper is
 * silent or inconsistent.
 *
 * Hotness records (frequency, clock, depth) live in the hotness-aware
 * cuckoo filter (cache/cuckoo.h), or in an exact table with option
 * exact = 1.  Every node on an accessed path is touched, which keeps an
 * ancestor at least as hot as its descendants: eviction and promotion rely
 * on that ordering.
 *
 * Per tier the policy keeps:
 *   - a list of every resident node (promotion scans it for roots);
 *   - a binary min-heap of the tier's leaves keyed by the cached eviction
 *     priority (tie: deeper first, then key order).  Priorities change on
 *     access (fixed in place) and on aging (whole heaps rebuilt, O(L) per
 *     aging pass); a filter collision may change a record behind the
 *     policy's back, so victim() re-checks the top before returning it.
 *
 * Node fields used: hist[0] bit 0 = the node has a record (inserted and not
 * yet forgotten); t[tier].list = HP_* bits, .idx = heap index, .prio =
 * cached eviction priority, .prev/.next = residency list.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cache/cuckoo.h"
#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"
#include "meta/util.h"

/*
 * Test-only introspection: the record the policy holds for @n.  Returns 0,
 * -ENOENT when there is none, -EINVAL for another policy.  Same locking as
 * every policy call.  (Candidate for cache/policy_i.h.)
 */
int kvfs_policy_hotprefix_record(struct kvfs_policy *p,
				 const struct kvfs_pnode *n,
				 struct kvfs_cuckoo_rec *out);

enum {
	HP_HEAP = 1 << 0, /* in this tier's leaf heap */
	HP_RES = 1 << 1,  /* in this tier's residency list */
	HP_VICT = 1 << 2, /* promotion planning: claimed as a victim */
	HP_PROT = 1 << 3, /* promotion planning: parent of a promoted node */
};

#define HP_KNOWN 1ull /* hist[0]: the node has a record */

enum hp_var {
	HP_VAR_CONST = 0,
	HP_VAR_CLOCK,
	HP_VAR_FREQ,
	HP_VAR_LENGTH,
};

#define HP_MAX_TERMS 3

/* "x op y op z": up to three terms, ops in {+, *, /}, usual precedence. */
struct hp_formula {
	int nterms;
	int var[HP_MAX_TERMS];
	double c[HP_MAX_TERMS];
	char op[HP_MAX_TERMS - 1];
};

struct hp_cand {
	struct kvfs_pnode *n;
	double hot;
};

struct hp_tier {
	struct kvfs_pnode **heap;
	size_t n, cap;
	struct kvfs_pnode *head, *tail; /* residents, oldest first */
};

struct hp_priv {
	bool configured;
	/* options */
	bool exact;
	bool keep_history;
	uint32_t threshold;
	uint32_t aging_requests;
	uint32_t max_kicks;
	uint32_t overflow;
	uint32_t promote_scan;
	uint8_t max_age;
	uint64_t buckets;   /* 0 = from capacity */
	uint64_t history;   /* ghost records kept; UINT64_MAX = auto */
	uint64_t seed;
	struct hp_formula evict, admit;

	struct kvfs_cuckoo *rec;
	/* Forgotten keys whose record is kept (keep_history): an exact set
	 * plus a FIFO ring that bounds it.
	 */
	struct kvfs_cuckoo *ghosts;
	uint8_t (*ring)[16];
	uint64_t ring_head, ring_n;

	struct hp_tier t[KVFS_NTIERS];

	uint64_t requests, aged_at, last_req, last_now;
	bool seen;

	/* scratch */
	struct kvfs_pnode **stash;
	size_t nstash, stash_cap;
	struct hp_cand *roots, *leaves;
	size_t *claim;

	/* counters */
	uint64_t agings, admitted, refused_freq, refused_hot;
	uint64_t plans, promoted, record_fail;
};

static inline struct hp_priv *hp_of(struct kvfs_policy *p)
{
	return p->priv;
}

/* ---- formulas --------------------------------------------------------- */

static const char *skip_ws(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return s;
}

static int parse_term(const char **sp, int *var, double *c)
{
	static const struct {
		const char *name;
		int var;
	} names[] = {
		{ "frequency", HP_VAR_FREQ }, { "freq", HP_VAR_FREQ },
		{ "clock", HP_VAR_CLOCK },    { "length", HP_VAR_LENGTH },
		{ "len", HP_VAR_LENGTH },
	};
	const char *s = skip_ws(*sp);
	size_t len = 0;

	if ((*s >= '0' && *s <= '9') || *s == '.') {
		char *end;
		double v = strtod(s, &end);

		if (end == s || !isfinite(v) || v < 0)
			return -EINVAL;
		*var = HP_VAR_CONST;
		*c = v;
		*sp = end;
		return 0;
	}
	while ((s[len] >= 'a' && s[len] <= 'z') ||
	       (s[len] >= 'A' && s[len] <= 'Z') || s[len] == '_')
		len++;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strlen(names[i].name) == len &&
		    !strncasecmp(s, names[i].name, len)) {
			*var = names[i].var;
			*c = 0;
			*sp = s + len;
			return 0;
		}
	}
	return -EINVAL;
}

static int hp_formula_parse(const char *str, struct hp_formula *f)
{
	const char *s = str;
	struct hp_formula g = { 0 };

	for (;;) {
		if (g.nterms == HP_MAX_TERMS)
			goto out_bad;
		if (parse_term(&s, &g.var[g.nterms], &g.c[g.nterms]))
			goto out_bad;
		g.nterms++;
		s = skip_ws(s);
		if (!*s)
			break;
		if (*s != '+' && *s != '*' && *s != '/')
			goto out_bad;
		if (g.nterms == HP_MAX_TERMS)
			goto out_bad;
		g.op[g.nterms - 1] = *s++;
	}
	*f = g;
	return 0;

out_bad:
	kvfs_err("hotprefix: bad formula '%s': want 'x op y op z' with x, y, z in {clock, frequency, length, number} and op in {+, *, /}",
		 str);
	return -EINVAL;
}

static double term_val(const struct hp_formula *f, int i, double clock,
		       double freq, double length)
{
	switch (f->var[i]) {
	case HP_VAR_CLOCK:
		return clock;
	case HP_VAR_FREQ:
		return freq;
	case HP_VAR_LENGTH:
		return length;
	default:
		return f->c[i];
	}
}

/* A zero divisor counts as 1: the variables are integers, so this keeps
 * every formula monotone in them and never yields inf or NaN.
 */
static double hp_div(double a, double b)
{
	return a / (b == 0 ? 1 : b);
}

static double hp_formula_eval(const struct hp_formula *f, double clock,
			      double freq, double length)
{
	double sum = 0, prod;

	prod = term_val(f, 0, clock, freq, length);
	for (int i = 1; i < f->nterms; i++) {
		double v = term_val(f, i, clock, freq, length);

		switch (f->op[i - 1]) {
		case '*':
			prod *= v;
			break;
		case '/':
			prod = hp_div(prod, v);
			break;
		default: /* '+' closes a product */
			sum += prod;
			prod = v;
			break;
		}
	}
	return sum + prod;
}

/* ---- records ------------------------------------------------------------ */

/* A node without a record (filter full, or its shared record deleted by a
 * colliding key) reads as the coldest possible block: frequency 1,
 * clock 0.
 */
static void hp_rec(struct hp_priv *hp, const struct kvfs_pnode *n,
		   struct kvfs_cuckoo_rec *r)
{
	if (kvfs_cuckoo_lookup(hp->rec, n->key, r)) {
		r->clock = 0;
		r->freq = 1;
		r->depth = n->depth > 255 ? 255 : (uint8_t)n->depth;
	}
}

static double hp_len(const struct kvfs_pnode *n)
{
	return n->tokens ? n->tokens : 1;
}

static double hp_evict_prio(struct hp_priv *hp, const struct kvfs_pnode *n)
{
	struct kvfs_cuckoo_rec r;

	hp_rec(hp, n, &r);
	return hp_formula_eval(&hp->evict, r.clock, r.freq, hp_len(n));
}

static double hp_hot(struct hp_priv *hp, const struct kvfs_pnode *n)
{
	struct kvfs_cuckoo_rec r;

	hp_rec(hp, n, &r);
	return hp_formula_eval(&hp->admit, r.clock, r.freq, hp_len(n));
}

static void hp_ghost_forget(struct hp_priv *hp, const uint8_t key[16])
{
	kvfs_cuckoo_delete(hp->ghosts, key);
}

/*
 * Give @n a record.  A record already there (the key's history, kept
 * after an earlier discard, or a colliding key's record) counts the
 * re-creation as one more reuse.
 */
static void hp_record_create(struct hp_priv *hp, struct kvfs_pnode *n)
{
	int ret = kvfs_cuckoo_insert(hp->rec, n->key, n->depth);

	if (ret == 1)
		kvfs_cuckoo_touch(hp->rec, n->key, NULL);
	if (ret < 0 && !hp->record_fail++)
		kvfs_warn("hotprefix: no room for a hotness record (%d); such blocks count as coldest",
			  ret);
	if (hp->ghosts)
		hp_ghost_forget(hp, n->key);
	n->hist[0] |= HP_KNOWN;
}

static void hp_record_touch(struct hp_priv *hp, struct kvfs_pnode *n)
{
	if (!(n->hist[0] & HP_KNOWN)) {
		hp_record_create(hp, n);
		return;
	}
	if (kvfs_cuckoo_touch(hp->rec, n->key, NULL) == -ENOENT)
		hp_record_create(hp, n);
}

/* Keep @key's record as history; the oldest history beyond the bound is
 * deleted.
 */
static void hp_ghost_add(struct hp_priv *hp, const uint8_t key[16])
{
	struct kvfs_cuckoo_rec r;

	if (!hp->history) {
		kvfs_cuckoo_delete(hp->rec, key);
		return;
	}
	if (hp->ring_n == hp->history) {
		uint8_t *old = hp->ring[hp->ring_head];

		/* not in the set: revived since, so the record is live */
		if (!kvfs_cuckoo_lookup(hp->ghosts, old, &r)) {
			kvfs_cuckoo_delete(hp->ghosts, old);
			kvfs_cuckoo_delete(hp->rec, old);
		}
		hp->ring_head = (hp->ring_head + 1) % hp->history;
		hp->ring_n--;
	}
	if (kvfs_cuckoo_insert(hp->ghosts, key, 0) < 0) {
		kvfs_cuckoo_delete(hp->rec, key);
		return;
	}
	memcpy(hp->ring[(hp->ring_head + hp->ring_n) % hp->history], key, 16);
	hp->ring_n++;
}

/* ---- leaf heaps --------------------------------------------------------- */

static bool hp_less(const struct kvfs_pnode *a, const struct kvfs_pnode *b,
		    int tier)
{
	if (a->t[tier].prio != b->t[tier].prio)
		return a->t[tier].prio < b->t[tier].prio;
	if (a->depth != b->depth)
		return a->depth > b->depth;
	return memcmp(a->key, b->key, 16) < 0;
}

static void heap_set(struct hp_tier *ht, size_t i, struct kvfs_pnode *n,
		     int tier)
{
	ht->heap[i] = n;
	n->t[tier].idx = (uint32_t)i;
}

static void heap_up(struct hp_tier *ht, size_t i, int tier)
{
	struct kvfs_pnode *n = ht->heap[i];

	while (i) {
		size_t parent = (i - 1) / 2;

		if (!hp_less(n, ht->heap[parent], tier))
			break;
		heap_set(ht, i, ht->heap[parent], tier);
		i = parent;
	}
	heap_set(ht, i, n, tier);
}

static void heap_down(struct hp_tier *ht, size_t i, int tier)
{
	struct kvfs_pnode *n = ht->heap[i];

	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct kvfs_pnode *best = n;

		if (l < ht->n && hp_less(ht->heap[l], best, tier)) {
			m = l;
			best = ht->heap[l];
		}
		if (l + 1 < ht->n && hp_less(ht->heap[l + 1], best, tier))
			m = l + 1;
		if (m == i)
			break;
		heap_set(ht, i, ht->heap[m], tier);
		i = m;
	}
	heap_set(ht, i, n, tier);
}

static void heap_fix(struct hp_tier *ht, size_t i, int tier)
{
	heap_up(ht, i, tier);
	heap_down(ht, ht->heap[i]->t[tier].idx, tier);
}

static int heap_push(struct hp_priv *hp, int tier, struct kvfs_pnode *n)
{
	struct hp_tier *ht = &hp->t[tier];

	if (ht->n == ht->cap) {
		size_t ncap = ht->cap ? ht->cap * 2 : 256;
		struct kvfs_pnode **a = realloc(ht->heap, ncap * sizeof(*a));

		if (!a) {
			kvfs_err("hotprefix: out of memory for the leaf heap of tier %d",
				 tier);
			return -ENOMEM;
		}
		ht->heap = a;
		ht->cap = ncap;
	}
	n->t[tier].prio = hp_evict_prio(hp, n);
	n->t[tier].list |= HP_HEAP;
	heap_set(ht, ht->n++, n, tier);
	heap_up(ht, ht->n - 1, tier);
	return 0;
}

static void heap_del(struct hp_priv *hp, int tier, struct kvfs_pnode *n)
{
	struct hp_tier *ht = &hp->t[tier];
	size_t i = n->t[tier].idx;

	n->t[tier].list &= ~HP_HEAP;
	if (--ht->n == i)
		return;
	heap_set(ht, i, ht->heap[ht->n], tier);
	heap_fix(ht, i, tier);
}

static void heap_rebuild(struct hp_priv *hp, int tier)
{
	struct hp_tier *ht = &hp->t[tier];

	for (size_t i = 0; i < ht->n; i++)
		ht->heap[i]->t[tier].prio = hp_evict_prio(hp, ht->heap[i]);
	for (size_t i = ht->n / 2; i-- > 0;)
		heap_down(ht, i, tier);
}

/* Make the cached priority of the top exact (see the file comment). */
static struct kvfs_pnode *heap_top(struct hp_priv *hp, int tier)
{
	struct hp_tier *ht = &hp->t[tier];

	while (ht->n) {
		struct kvfs_pnode *n = ht->heap[0];
		double prio = hp_evict_prio(hp, n);

		if (prio == n->t[tier].prio)
			return n;
		n->t[tier].prio = prio;
		heap_down(ht, 0, tier);
	}
	return NULL;
}

static void hp_leaf_check(struct hp_priv *hp, int tier, struct kvfs_pnode *n)
{
	bool leaf = kvfs_policy_is_leaf(n, tier);
	bool in = n->t[tier].list & HP_HEAP;

	if (leaf && !in)
		heap_push(hp, tier, n);
	else if (!leaf && in)
		heap_del(hp, tier, n);
}

/* ---- residency lists ----------------------------------------------------- */

static void res_add(struct hp_tier *ht, struct kvfs_pnode *n, int tier)
{
	struct kvfs_plink *k = &n->t[tier];

	k->prev = ht->tail;
	k->next = NULL;
	if (ht->tail)
		ht->tail->t[tier].next = n;
	else
		ht->head = n;
	ht->tail = n;
	k->list |= HP_RES;
}

static void res_del(struct hp_tier *ht, struct kvfs_pnode *n, int tier)
{
	struct kvfs_plink *k = &n->t[tier];

	if (k->prev)
		k->prev->t[tier].next = k->next;
	else
		ht->head = k->next;
	if (k->next)
		k->next->t[tier].prev = k->prev;
	else
		ht->tail = k->prev;
	k->prev = k->next = NULL;
	k->list &= ~HP_RES;
}

/* ---- requests and aging --------------------------------------------------- */

static void hp_note_request(struct hp_priv *hp, const struct kvfs_paccess *a)
{
	if (!a)
		return;
	/* a new (request, now) pair is a new request, as for lru */
	if (!hp->seen || a->request != hp->last_req || a->now != hp->last_now) {
		hp->requests++;
		hp->seen = true;
		hp->last_req = a->request;
		hp->last_now = a->now;
	}
}

static void hp_age(struct hp_priv *hp)
{
	uint64_t steps = (hp->requests - hp->aged_at) / hp->aging_requests;

	if (!steps)
		return;
	hp->aged_at += steps * hp->aging_requests;
	/* beyond max_age passes every clock is 0 already */
	if (steps > hp->max_age)
		steps = hp->max_age;
	while (steps--) {
		kvfs_cuckoo_age(hp->rec);
		hp->agings++;
	}
	for (int t = 0; t < KVFS_NTIERS; t++)
		heap_rebuild(hp, t);
}

/* ---- options and life cycle ------------------------------------------- */

static void hp_defaults(struct hp_priv *hp)
{
	if (hp->configured)
		return;
	hp->configured = true;
	hp->exact = false;
	hp->keep_history = true;
	hp->threshold = 10;
	hp->aging_requests = 1;
	hp->max_kicks = KVFS_CUCKOO_MAX_KICKS;
	hp->overflow = KVFS_CUCKOO_OVERFLOW;
	hp->promote_scan = 256;
	hp->max_age = 255;
	hp->buckets = 0;
	hp->history = UINT64_MAX;
	hp->seed = 0x686f747072656678ull;
	hp_formula_parse("frequency + clock / length", &hp->evict);
	hp_formula_parse("frequency * clock", &hp->admit);
}

static int parse_bool(const char *val, bool *out)
{
	if (!strcmp(val, "1") || !strcasecmp(val, "true") ||
	    !strcasecmp(val, "yes") || !strcasecmp(val, "on"))
		*out = true;
	else if (!strcmp(val, "0") || !strcasecmp(val, "false") ||
		 !strcasecmp(val, "no") || !strcasecmp(val, "off"))
		*out = false;
	else
		return -EINVAL;
	return 0;
}

static int hp_set(struct kvfs_policy *p, const char *key, const char *val)
{
	struct hp_priv *hp = hp_of(p);
	uint32_t u32;
	uint64_t u64;

	hp_defaults(hp);
	if (!strcmp(key, "exact"))
		return parse_bool(val, &hp->exact);
	if (!strcmp(key, "keep_history"))
		return parse_bool(val, &hp->keep_history);
	if (!strcmp(key, "evict_formula"))
		return hp_formula_parse(val, &hp->evict);
	if (!strcmp(key, "admit_formula"))
		return hp_formula_parse(val, &hp->admit);
	if (!strcmp(key, "threshold")) {
		if (kvfs_util_parse_u32(val, &u32))
			goto out_bad;
		hp->threshold = u32;
		return 0;
	}
	if (!strcmp(key, "aging_requests")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32)
			goto out_bad;
		hp->aging_requests = u32;
		return 0;
	}
	if (!strcmp(key, "max_age")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32 || u32 > 255)
			goto out_bad;
		hp->max_age = (uint8_t)u32;
		return 0;
	}
	if (!strcmp(key, "max_kicks")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32 || u32 > 100000)
			goto out_bad;
		hp->max_kicks = u32;
		return 0;
	}
	if (!strcmp(key, "filter_overflow")) {
		if (kvfs_util_parse_u32(val, &u32) || u32 > 65536)
			goto out_bad;
		hp->overflow = u32;
		return 0;
	}
	if (!strcmp(key, "promote_scan")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32 || u32 > 65536)
			goto out_bad;
		hp->promote_scan = u32;
		return 0;
	}
	if (!strcmp(key, "filter_buckets")) {
		if (kvfs_util_parse_u64(val, &u64) ||
		    u64 > KVFS_CUCKOO_MAX_BUCKETS || (u64 & (u64 - 1)))
			goto out_bad;
		hp->buckets = u64;
		return 0;
	}
	if (!strcmp(key, "history")) {
		if (kvfs_util_parse_u64(val, &u64) || u64 > (1ull << 26))
			goto out_bad;
		hp->history = u64;
		return 0;
	}
	if (!strcmp(key, "seed")) {
		if (kvfs_util_parse_u64(val, &u64))
			goto out_bad;
		hp->seed = u64;
		return 0;
	}
	kvfs_err("hotprefix: unknown option '%s'", key);
	return -EINVAL;

out_bad:
	kvfs_err("hotprefix: bad value '%s' for %s", val, key);
	return -EINVAL;
}

static uint64_t next_pow2(uint64_t v)
{
	uint64_t r = 1;

	while (r < v)
		r <<= 1;
	return r;
}

static void hp_release(struct kvfs_policy *p)
{
	struct hp_priv *hp = hp_of(p);

	if (hp->rec) {
		struct kvfs_cuckoo_stats st;

		kvfs_cuckoo_get_stats(hp->rec, &st);
		kvfs_dbg("hotprefix: %llu records, %llu kicks, %llu overflowed, %llu failed; admitted %llu, refused %llu (freq) %llu (hotness); %llu promoted",
			 (unsigned long long)st.entries,
			 (unsigned long long)st.kicks,
			 (unsigned long long)st.overflowed,
			 (unsigned long long)st.failed,
			 (unsigned long long)hp->admitted,
			 (unsigned long long)hp->refused_freq,
			 (unsigned long long)hp->refused_hot,
			 (unsigned long long)hp->promoted);
	}
	for (int t = 0; t < KVFS_NTIERS; t++) {
		free(hp->t[t].heap);
		hp->t[t].heap = NULL;
		hp->t[t].n = hp->t[t].cap = 0;
		hp->t[t].head = hp->t[t].tail = NULL;
	}
	free(hp->stash);
	free(hp->roots);
	free(hp->leaves);
	free(hp->claim);
	free(hp->ring);
	kvfs_cuckoo_free(hp->ghosts);
	kvfs_cuckoo_free(hp->rec);
	hp->stash = NULL;
	hp->roots = hp->leaves = NULL;
	hp->claim = NULL;
	hp->ring = NULL;
	hp->ghosts = hp->rec = NULL;
}

static int hp_init(struct kvfs_policy *p)
{
	struct hp_priv *hp = hp_of(p);
	struct kvfs_cuckoo_conf cc = { 0 };
	uint64_t cap = 0, slots;
	int ret;

	hp_defaults(hp);
	for (int t = 0; t < KVFS_NTIERS; t++)
		cap += p->capacity[t];
	/*
	 * Auto size, when capacities count blocks: 16 slots per resident
	 * block and history for twice the resident blocks, so at most ~20%
	 * of the slots are used and an 8-bit fingerprint matches a foreign
	 * record on under 1% of inserts (measured: at 50-75% load the
	 * merged records cost LFU-like eviction a third of its hits on
	 * the mooncake trace).  Bounded to 4 MiB for byte capacities.
	 */
	cc.buckets = hp->buckets;
	if (!cc.buckets) {
		cc.buckets = next_pow2(cap > (1u << 18) ? (1u << 18) : 4 * cap);
		if (cc.buckets < 1024)
			cc.buckets = 1024;
		if (cc.buckets > (1u << 18))
			cc.buckets = 1u << 18;
	}
	slots = cc.buckets * KVFS_CUCKOO_SLOTS;
	if (hp->history == UINT64_MAX) {
		hp->history = 2 * cap;
		if (hp->history > slots / 4)
			hp->history = slots / 4;
	}
	if (!hp->keep_history)
		hp->history = 0;
	cc.overflow = hp->overflow;
	cc.max_kicks = hp->max_kicks;
	cc.max_age = hp->max_age;
	cc.seed = hp->seed;
	cc.flags = hp->exact ? KVFS_CUCKOO_EXACT : 0;
	ret = kvfs_cuckoo_init(&cc, &hp->rec);
	if (ret)
		return ret;
	if (hp->history) {
		struct kvfs_cuckoo_conf gc = {
			.max_age = 1,
			.seed = hp->seed ^ 0x67686f7374ull,
			.flags = KVFS_CUCKOO_EXACT,
		};

		ret = kvfs_cuckoo_init(&gc, &hp->ghosts);
		if (ret)
			goto out_release;
		hp->ring = calloc(hp->history, sizeof(*hp->ring));
		if (!hp->ring)
			goto out_nomem;
	}
	hp->roots = calloc(hp->promote_scan, sizeof(*hp->roots));
	hp->leaves = calloc(hp->promote_scan, sizeof(*hp->leaves));
	hp->claim = calloc(hp->promote_scan, sizeof(*hp->claim));
	if (!hp->roots || !hp->leaves || !hp->claim)
		goto out_nomem;
	return 0;

out_nomem:
	ret = -ENOMEM;
out_release:
	hp_release(p);
	return ret;
}

/* ---- hooks -------------------------------------------------------------- */

static void hp_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		      const struct kvfs_paccess *a)
{
	struct hp_priv *hp = hp_of(p);

	hp_note_request(hp, a);
	/* a move between tiers is not a reuse: the record stays as it is */
	if (!(n->hist[0] & HP_KNOWN))
		hp_record_create(hp, n);
	if (!(n->t[tier].list & HP_RES))
		res_add(&hp->t[tier], n, tier);
	hp_leaf_check(hp, tier, n);
	if (n->parent)
		hp_leaf_check(hp, tier, n->parent);
}

static void hp_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		      size_t n, const struct kvfs_paccess *a)
{
	struct hp_priv *hp = hp_of(p);

	hp_note_request(hp, a);
	for (size_t i = 0; i < n; i++) {
		struct kvfs_pnode *x = path[i];

		if (!x)
			continue;
		hp_record_touch(hp, x);
		for (int t = 0; t < KVFS_NTIERS; t++) {
			if (!(x->t[t].list & HP_HEAP))
				continue;
			x->t[t].prio = hp_evict_prio(hp, x);
			heap_fix(&hp->t[t], x->t[t].idx, t);
		}
	}
}

static void hp_unlink(struct hp_priv *hp, int tier, struct kvfs_pnode *n)
{
	if (n->t[tier].list & HP_HEAP)
		heap_del(hp, tier, n);
	if (n->t[tier].list & HP_RES)
		res_del(&hp->t[tier], n, tier);
}

static void hp_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct hp_priv *hp = hp_of(p);

	hp_unlink(hp, tier, n);
	if (n->parent)
		hp_leaf_check(hp, tier, n->parent);
}

static void hp_forget(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	struct hp_priv *hp = hp_of(p);

	for (int t = 0; t < KVFS_NTIERS; t++)
		hp_unlink(hp, t, n);
	if (!(n->hist[0] & HP_KNOWN))
		return;
	n->hist[0] &= ~HP_KNOWN;
	if (hp->keep_history)
		hp_ghost_add(hp, n->key);
	else
		kvfs_cuckoo_delete(hp->rec, n->key);
}

static int stash_push(struct hp_priv *hp, struct kvfs_pnode *n)
{
	if (hp->nstash == hp->stash_cap) {
		size_t ncap = hp->stash_cap ? hp->stash_cap * 2 : 64;
		struct kvfs_pnode **a = realloc(hp->stash, ncap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		hp->stash = a;
		hp->stash_cap = ncap;
	}
	hp->stash[hp->nstash++] = n;
	return 0;
}

static struct kvfs_pnode *hp_victim(struct kvfs_policy *p, int tier,
				    kvfs_policy_ok_fn ok, void *arg)
{
	struct hp_priv *hp = hp_of(p);
	struct kvfs_pnode *n, *res = NULL;

	/* Leaves that may not move now are set aside and put back after. */
	while ((n = heap_top(hp, tier))) {
		if (!ok || ok(n, arg)) {
			res = n;
			break;
		}
		if (stash_push(hp, n)) {
			kvfs_err("hotprefix: out of memory while skipping pinned leaves");
			break;
		}
		heap_del(hp, tier, n);
	}
	while (hp->nstash)
		heap_push(hp, tier, hp->stash[--hp->nstash]);
	return res;
}

static bool hp_admit(struct kvfs_policy *p, int from, int to,
		     struct kvfs_pnode *n)
{
	struct hp_priv *hp = hp_of(p);
	struct kvfs_cuckoo_rec r;
	struct kvfs_pnode *cold;

	if (to < 0 || to >= KVFS_NTIERS || !p->capacity[to])
		return false;
	hp_rec(hp, n, &r);
	if (r.freq < hp->threshold) {
		hp->refused_freq++;
		return false;
	}
	/* Step 2 only when the block would displace something. */
	if (p->used[to] + n->size <= p->capacity[to])
		goto out_admit;
	cold = heap_top(hp, to);
	if (!cold || cold == n)
		goto out_admit;
	if (hp_hot(hp, n) < hp_hot(hp, cold)) {
		hp->refused_hot++;
		return false;
	}
out_admit:
	hp->admitted++;
	return true;
}

/* ---- promotion (Algorithm 2) ----------------------------------------- */

/*
 * Keep the @k best candidates seen so far in @a (*na of them), as a heap
 * whose root is the worst kept: the hottest roots (want_hot) or the
 * coldest leaves.
 */
static bool cand_worse(const struct hp_cand *x, const struct hp_cand *y,
		       bool want_hot)
{
	if (x->hot != y->hot)
		return want_hot ? x->hot < y->hot : x->hot > y->hot;
	/* deterministic tie order: shallower roots, deeper leaves first */
	if (x->n->depth != y->n->depth)
		return want_hot ? x->n->depth > y->n->depth :
				  x->n->depth < y->n->depth;
	return memcmp(x->n->key, y->n->key, 16) > 0;
}

static void cand_sift(struct hp_cand *a, size_t n, size_t i, bool want_hot)
{
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct hp_cand tmp;

		if (l < n && cand_worse(&a[l], &a[m], want_hot))
			m = l;
		if (l + 1 < n && cand_worse(&a[l + 1], &a[m], want_hot))
			m = l + 1;
		if (m == i)
			return;
		tmp = a[i];
		a[i] = a[m];
		a[m] = tmp;
		i = m;
	}
}

static void cand_offer(struct hp_cand *a, size_t *na, size_t k,
		       struct kvfs_pnode *n, double hot, bool want_hot)
{
	struct hp_cand c = { n, hot };

	if (*na < k) {
		size_t i = (*na)++;

		a[i] = c;
		while (i) {
			size_t parent = (i - 1) / 2;
			struct hp_cand tmp;

			if (!cand_worse(&a[i], &a[parent], want_hot))
				break;
			tmp = a[i];
			a[i] = a[parent];
			a[parent] = tmp;
			i = parent;
		}
		return;
	}
	if (!cand_worse(&a[0], &c, want_hot))
		return;
	a[0] = c;
	cand_sift(a, *na, 0, want_hot);
}

/* Pop the kept heap into best-first order. */
static void cand_sort(struct hp_cand *a, size_t n, bool want_hot)
{
	for (size_t end = n; end > 1; end--) {
		struct hp_cand tmp = a[0];

		a[0] = a[end - 1];
		a[end - 1] = tmp;
		cand_sift(a, end - 1, 0, want_hot);
	}
}

static size_t hp_promote(struct kvfs_policy *p, int lower, int upper,
			 struct kvfs_pmove *plan, size_t max)
{
	struct hp_priv *hp = hp_of(p);
	struct hp_tier *ut = &hp->t[upper];
	size_t nr = 0, nl = 0, steps = 0, cursor = 0;
	uint8_t ubit = (uint8_t)(1u << upper);

	if (lower == upper || !p->capacity[upper] || max < 2)
		return 0;

	/* GPU-side candidates: the leaves of the upper tier, coldest first */
	for (size_t i = 0; i < ut->n; i++)
		cand_offer(hp->leaves, &nl, hp->promote_scan, ut->heap[i],
			   hp_hot(hp, ut->heap[i]), false);
	if (!nl)
		return 0;
	cand_sort(hp->leaves, nl, false);

	/* host-side candidates: roots of the lower tier, hottest first */
	for (struct kvfs_pnode *x = hp->t[lower].head; x;
	     x = x->t[lower].next) {
		double hot;

		if (x->tiers & ubit)
			continue;
		if (x->parent && !(x->parent->tiers & ubit))
			continue;
		hot = hp_hot(hp, x);
		/* hopeless: not hotter than the coldest upper leaf */
		if (hot <= hp->leaves[0].hot)
			continue;
		cand_offer(hp->roots, &nr, hp->promote_scan, x, hot, true);
	}
	cand_sort(hp->roots, nr, true);

	for (size_t i = 0; i < nr; i++) {
		struct kvfs_pnode *x = hp->roots[i].n, *y = x->parent;
		uint64_t got = 0;
		size_t nv = 0;

		/* parent already planned for eviction: pointless */
		if (y && (y->t[upper].list & HP_VICT))
			continue;
		for (size_t j = cursor; j < nl; j++) {
			struct kvfs_pnode *z = hp->leaves[j].n;

			if (z->t[upper].list & (HP_VICT | HP_PROT) || z == y)
				continue;
			if (!(hp->roots[i].hot > hp->leaves[j].hot))
				break;
			hp->claim[nv++] = j;
			got += z->size;
			if (got >= x->size)
				break;
		}
		if (!nv || got < x->size)
			continue;
		if (steps + nv + 1 > max)
			break;
		for (size_t v = 0; v < nv; v++) {
			struct kvfs_pnode *z = hp->leaves[hp->claim[v]].n;

			z->t[upper].list |= HP_VICT;
			plan[steps].node = z;
			plan[steps++].op = KVFS_PMOVE_DOWN;
		}
		plan[steps].node = x;
		plan[steps++].op = KVFS_PMOVE_UP;
		if (y)
			y->t[upper].list |= HP_PROT;
		hp->promoted++;
		while (cursor < nl &&
		       (hp->leaves[cursor].n->t[upper].list & HP_VICT))
			cursor++;
	}

	/* planning marks live only for this call */
	for (size_t j = 0; j < nl; j++)
		hp->leaves[j].n->t[upper].list &= ~(HP_VICT | HP_PROT);
	for (size_t s = 0; s < steps; s++)
		if (plan[s].op == KVFS_PMOVE_UP && plan[s].node->parent)
			plan[s].node->parent->t[upper].list &= ~HP_PROT;
	if (steps)
		hp->plans++;
	return steps;
}

static void hp_tick(struct kvfs_policy *p, const struct kvfs_paccess *a)
{
	hp_age(hp_of(p));
}

int kvfs_policy_hotprefix_record(struct kvfs_policy *p,
				 const struct kvfs_pnode *n,
				 struct kvfs_cuckoo_rec *out)
{
	if (!p || p->ops != &kvfs_policy_hotprefix_ops)
		return -EINVAL;
	return kvfs_cuckoo_lookup(hp_of(p)->rec, n->key, out);
}

const struct kvfs_policy_ops kvfs_policy_hotprefix_ops = {
	.name = "hotprefix",
	.priv_size = sizeof(struct hp_priv),
	.set = hp_set,
	.init = hp_init,
	.release = hp_release,
	.insert = hp_insert,
	.access = hp_access,
	.remove = hp_remove,
	.forget = hp_forget,
	.victim = hp_victim,
	.admit = hp_admit,
	.promote = hp_promote,
	.tick = hp_tick,
};
