// SPDX-License-Identifier: MIT
/*
 * wa: the workload-aware eviction policy of "KVCache Cache in the Wild:
 * Characterizing and Optimizing KVCache Cache at a Large Cloud Provider"
 * (Wang et al., USENIX ATC 2025), §4.  docs/policy-wa.md records every
 * decision taken where the paper is silent.
 *
 * Each block belongs to a workload category w: (request type, turn) when
 * the caller tags the node (pnode->category, pnode->turn), else a fallback
 * derived from its depth and whether its request continued an earlier one.
 * Per category the policy fits an exponential reuse-time model from a
 * sliding window of reuse intervals it observes itself (access times in
 * kvfs_paccess.now; forgotten blocks leave a bounded "ghost" so a reuse
 * after eviction is still seen).  The priority of a block idle for t is
 *
 *     ( ReuseProb_w(t) = p_w * exp(-lambda_w * t), 0 once t > life_w ;
 *       -offset = -depth )
 *
 * compared lexicographically, the lowest evicted.  ReuseProb_w falls with
 * t, so within a category the least recently used block is the least
 * likely; each tier keeps one recency queue per category and the victim is
 * the lowest of the queue heads (O(W) per eviction).  With leaves_only (the
 * default) a queue holds only the tier's leaves, so an eviction never cuts
 * a resident subtree off its prefix.
 *
 * Node fields used: hist[0] = last access time; hist[1] = WA_* fields
 * below; t[tier].idx = position in the category queue (a binary heap),
 * t[tier].list bit 0 = queued.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "meta/log.h"
#include "meta/util.h"

/* A model as the policy uses it; see kvfs_policy_wa_model(). */
struct kvfs_wa_model {
	uint32_t key;     /* category: type << 16 | turn (fallback: type 0,
			   * turn 0x8000 | continued << 3 | depth bucket) */
	double rate;      /* lambda, per caller time unit */
	double pfrac;     /* p_w as used (1 with reuse_fraction = 0) */
	double life;      /* lifespan cap; 0 = none */
	uint64_t samples; /* reuse intervals in the category's window */
	bool own;         /* the category's own fit (else pooled) */
	bool fitted;      /* false: no fit yet, ReuseProb = 1 / (1 + t) */
};

/*
 * Test-only introspection (candidates for cache/policy_i.h), same locking
 * as every policy call; -EINVAL for another policy.
 * kvfs_policy_wa_model(): the fit of the tagged category (@category,
 * @turn), or the pooled fit for category 0; -ENOENT if never seen.
 * kvfs_policy_wa_node_model(): the model ReuseProb uses for @n now;
 * -ENOENT if @n is not known to the policy.
 */
int kvfs_policy_wa_model(struct kvfs_policy *p, uint16_t category,
			 uint16_t turn, struct kvfs_wa_model *out);
int kvfs_policy_wa_node_model(struct kvfs_policy *p,
			      const struct kvfs_pnode *n,
			      struct kvfs_wa_model *out);

#define WA_MAX_CATS 256
#define WA_MAP_SIZE 1024 /* category map slots, > 2 * WA_MAX_CATS */
#define WA_OTHER 0       /* category index taking keys beyond the limit */

/* hist[1] layout */
#define WA_CAT_MASK 0xffull
#define WA_KNOWN (1ull << 8)
#define WA_CONT (1ull << 9)
#define WA_CREQ_SHIFT 16
#define WA_LREQ_SHIFT 40
#define WA_REQ_MASK 0xffffffull

#define WA_QUEUED 1

/* Category keys: a tagged (type, turn), or a fallback class. */
#define WA_KEY(type, turn) (((uint32_t)(type) << 16) | (uint16_t)(turn))
#define WA_KEY_OTHER 0xffffffffu
#define WA_FALLBACK_TURN 0x8000u

struct wa_model {
	double rate, pfrac, life;
	bool fitted;
};

struct wa_cat {
	uint32_t key;
	double *win;          /* ring of reuse intervals */
	uint32_t win_n, win_head;
	uint64_t starts, reuses; /* since the last refit */
	struct wa_model m;
};

/* Min-heap of one category's candidates in one tier (see wa_less). */
struct wa_heap {
	struct kvfs_pnode **a;
	size_t n, cap;
};

struct wa_ghost {
	uint8_t key[16];
	uint8_t used;
	uint8_t cat;
	uint64_t time;
	uint64_t seq;
};

struct wa_priv {
	bool configured;
	/* options */
	uint32_t window;
	uint32_t refit_requests;
	uint32_t min_samples;
	uint32_t max_turn;
	uint32_t max_categories;
	double lifespan;      /* > 0: fixed cap in caller time units */
	double life_quantile; /* auto cap: this quantile; 0 = no cap */
	bool reuse_fraction;  /* scale by p_w */
	bool leaves_only;     /* candidates: leaves of the tier only */
	uint64_t ghosts;      /* 0 = auto */

	struct wa_cat cats[WA_MAX_CATS];
	uint32_t ncats;
	struct {
		uint32_t key;
		uint16_t idx1; /* index + 1; 0 = empty slot */
	} map[WA_MAP_SIZE];
	struct wa_model pooled;
	uint64_t pooled_starts, pooled_reuses;

	struct wa_heap q[KVFS_NTIERS][WA_MAX_CATS];

	/* ghosts: open addressing on the key, bounded by a FIFO of keys */
	struct wa_ghost *gtab;
	uint64_t gcap;
	uint8_t (*gring)[16];
	uint64_t gring_cap, gseq_head, gseq_tail;

	uint64_t now, requests, refit_at, last_req, last_now;
	bool seen;
	double *scratch;
	struct kvfs_pnode **stash;
	size_t nstash, stash_cap;

	uint64_t refits, evictions;
};

static inline struct wa_priv *wa_of(struct kvfs_policy *p)
{
	return p->priv;
}

static inline uint64_t wa_time(const struct kvfs_pnode *n)
{
	return n->hist[0];
}

static inline unsigned wa_cat_of(const struct kvfs_pnode *n)
{
	return (unsigned)(n->hist[1] & WA_CAT_MASK);
}

static inline uint32_t wa_req24(uint64_t r)
{
	return (uint32_t)(r & WA_REQ_MASK);
}

/* ---- categories -------------------------------------------------------- */

static uint32_t wa_map_hash(uint32_t key)
{
	return (key * 2654435761u) >> 22; /* top 10 bits: WA_MAP_SIZE */
}

static unsigned wa_cat_index(struct wa_priv *wa, uint32_t key)
{
	uint32_t i = wa_map_hash(key) % WA_MAP_SIZE;

	for (;;) {
		if (!wa->map[i].idx1)
			break;
		if (wa->map[i].key == key)
			return wa->map[i].idx1 - 1u;
		i = (i + 1) % WA_MAP_SIZE;
	}
	if (wa->ncats >= wa->max_categories)
		return WA_OTHER;
	wa->cats[wa->ncats].key = key;
	wa->map[i].key = key;
	wa->map[i].idx1 = (uint16_t)(wa->ncats + 1);
	return wa->ncats++;
}

static uint32_t wa_depth_bucket(uint32_t depth)
{
	uint32_t b = 0;

	/* 0, 1-2, 3-6, 7-14, ...: log2(depth + 1), at most 7 */
	while (b < 7 && (depth + 1) >> (b + 1))
		b++;
	return b;
}

static uint32_t wa_key_of(struct wa_priv *wa, const struct kvfs_pnode *n,
			  bool cont)
{
	uint32_t turn;

	if (!n->category)
		return WA_KEY(0, WA_FALLBACK_TURN | (cont ? 8u : 0u) |
				     wa_depth_bucket(n->depth));
	turn = n->turn ? n->turn : (cont ? 2u : 1u);
	if (turn > wa->max_turn)
		turn = wa->max_turn;
	return WA_KEY(n->category, turn);
}

static void wa_sample(struct wa_priv *wa, unsigned c, double interval)
{
	struct wa_cat *cat = &wa->cats[c];

	if (!cat->win) {
		cat->win = calloc(wa->window, sizeof(*cat->win));
		if (!cat->win) {
			kvfs_err("wa: out of memory for a reuse window");
			return;
		}
	}
	cat->win[cat->win_head] = interval;
	cat->win_head = (cat->win_head + 1) % wa->window;
	if (cat->win_n < wa->window)
		cat->win_n++;
	cat->reuses++;
	wa->pooled_reuses++;
}

static void wa_start(struct wa_priv *wa, unsigned c)
{
	wa->cats[c].starts++;
	wa->pooled_starts++;
}

/* ---- model ---------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void wa_fit(struct wa_priv *wa, struct wa_model *m, double sum,
		   uint64_t n, double life, uint64_t starts, uint64_t reuses)
{
	double mean = sum / (double)n;
	double pf;

	/* the caller's clock resolution bounds the mean from below */
	m->rate = 1.0 / (mean < 1.0 ? 1.0 : mean);
	m->life = life;
	if (starts >= wa->min_samples) {
		pf = (double)reuses / (double)starts;
		if (pf > 1)
			pf = 1;
		/* never 0: recency must still order a dead category */
		if (pf < 1e-6)
			pf = 1e-6;
		m->pfrac = m->fitted ? 0.5 * (m->pfrac + pf) : pf;
	} else if (!m->fitted) {
		m->pfrac = 1;
	}
	m->fitted = true;
}

static double wa_quantile(struct wa_priv *wa, const double *v, uint32_t n)
{
	uint32_t k;

	memcpy(wa->scratch, v, n * sizeof(*v));
	qsort(wa->scratch, n, sizeof(*v), cmp_double);
	k = (uint32_t)ceil(wa->life_quantile * n);
	if (k)
		k--;
	if (k >= n)
		k = n - 1;
	return wa->scratch[k];
}

static double wa_life(struct wa_priv *wa, const double *v, uint32_t n)
{
	double life;

	if (wa->lifespan > 0)
		return wa->lifespan;
	if (wa->life_quantile <= 0 || !n)
		return 0;
	life = wa_quantile(wa, v, n);
	/* a zero cap would drop every block at once: keep one tick */
	return life < 1 ? 1 : life;
}

static void wa_refit(struct wa_priv *wa)
{
	double psum = 0;
	uint64_t pn = 0;
	double *all = NULL;
	uint32_t nall = 0;

	for (unsigned c = 0; c < wa->ncats; c++) {
		struct wa_cat *cat = &wa->cats[c];
		double sum = 0;

		for (uint32_t i = 0; i < cat->win_n; i++)
			sum += cat->win[i];
		psum += sum;
		pn += cat->win_n;
		if (cat->win_n >= wa->min_samples)
			wa_fit(wa, &cat->m, sum, cat->win_n,
			       wa_life(wa, cat->win, cat->win_n),
			       cat->starts, cat->reuses);
		cat->starts = cat->reuses = 0;
	}
	if (pn >= wa->min_samples) {
		double life = wa->lifespan > 0 ? wa->lifespan : 0;

		/* pooled cap: a quantile over every step-th sample */
		if (!(wa->lifespan > 0) && wa->life_quantile > 0) {
			uint64_t step = (pn + wa->window - 1) / wa->window;
			uint64_t k = 0;

			all = wa->scratch + wa->window;
			for (unsigned c = 0; c < wa->ncats; c++) {
				struct wa_cat *cat = &wa->cats[c];

				for (uint32_t i = 0; i < cat->win_n; i++, k++)
					if (k % step == 0 && nall < wa->window)
						all[nall++] = cat->win[i];
			}
			life = wa_life(wa, all, nall);
		}
		wa_fit(wa, &wa->pooled, psum, pn, life, wa->pooled_starts,
		       wa->pooled_reuses);
	}
	wa->pooled_starts = wa->pooled_reuses = 0;
	wa->refits++;
}

/*
 * ReuseProb_w(t, life).  Before any fit, 1 / (1 + t): every category then
 * ranks by recency alone, i.e. plain LRU.
 */
static double wa_prob(struct wa_priv *wa, unsigned c, double t)
{
	const struct wa_model *m = &wa->cats[c].m;
	double pf;

	if (!m->fitted)
		m = &wa->pooled;
	if (!m->fitted)
		return 1.0 / (1.0 + t);
	if (m->life > 0 && t > m->life)
		return 0;
	pf = wa->reuse_fraction ? m->pfrac : 1.0;
	return pf * exp(-m->rate * t);
}

/* ---- ghosts ---------------------------------------------------------------- */

static uint64_t wa_ghost_hash(const uint8_t key[16])
{
	return XXH3_64bits(key, 16);
}

static struct wa_ghost *wa_ghost_find(struct wa_priv *wa,
				      const uint8_t key[16])
{
	uint64_t m = wa->gcap - 1, i;

	if (!wa->gtab)
		return NULL;
	for (i = wa_ghost_hash(key) & m;; i = (i + 1) & m) {
		if (!wa->gtab[i].used)
			return NULL;
		if (!memcmp(wa->gtab[i].key, key, 16))
			return &wa->gtab[i];
	}
}

static void wa_ghost_del(struct wa_priv *wa, struct wa_ghost *g)
{
	uint64_t m = wa->gcap - 1;
	uint64_t i = (uint64_t)(g - wa->gtab), j = i;

	for (;;) {
		uint64_t home;

		j = (j + 1) & m;
		if (!wa->gtab[j].used)
			break;
		home = wa_ghost_hash(wa->gtab[j].key) & m;
		if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
			wa->gtab[i] = wa->gtab[j];
			i = j;
		}
	}
	memset(&wa->gtab[i], 0, sizeof(wa->gtab[i]));
}

static void wa_ghost_add(struct wa_priv *wa, const uint8_t key[16],
			 uint64_t time, unsigned cat)
{
	uint64_t m = wa->gcap - 1, i;
	struct wa_ghost *g;

	if (!wa->gtab)
		return;
	if (wa->gseq_tail - wa->gseq_head == wa->gring_cap) {
		uint64_t old = wa->gseq_head++;

		g = wa_ghost_find(wa, wa->gring[old % wa->gring_cap]);
		/* only if that ghost was not revived and re-added since */
		if (g && g->seq == old)
			wa_ghost_del(wa, g);
	}
	g = wa_ghost_find(wa, key);
	if (!g) {
		for (i = wa_ghost_hash(key) & m; wa->gtab[i].used;
		     i = (i + 1) & m)
			;
		g = &wa->gtab[i];
		memcpy(g->key, key, 16);
		g->used = 1;
	}
	g->time = time;
	g->cat = (uint8_t)cat;
	g->seq = wa->gseq_tail;
	memcpy(wa->gring[wa->gseq_tail % wa->gring_cap], key, 16);
	wa->gseq_tail++;
}

/* ---- queues ------------------------------------------------------------ */

/*
 * Recency order inside a category: least recent first, and among blocks
 * of one request the deepest first (-offset).  A heap rather than a list
 * because with leaves_only a parent joins its queue when its last child
 * leaves, at a position set by its own, older, access time.
 */
static bool wa_less(const struct kvfs_pnode *a, const struct kvfs_pnode *b)
{
	if (wa_time(a) != wa_time(b))
		return wa_time(a) < wa_time(b);
	if (a->depth != b->depth)
		return a->depth > b->depth;
	return memcmp(a->key, b->key, 16) < 0;
}

static void wh_set(struct wa_heap *h, size_t i, struct kvfs_pnode *n,
		   int tier)
{
	h->a[i] = n;
	n->t[tier].idx = (uint32_t)i;
}

static void wh_up(struct wa_heap *h, size_t i, int tier)
{
	struct kvfs_pnode *n = h->a[i];

	while (i) {
		size_t parent = (i - 1) / 2;

		if (!wa_less(n, h->a[parent]))
			break;
		wh_set(h, i, h->a[parent], tier);
		i = parent;
	}
	wh_set(h, i, n, tier);
}

static void wh_down(struct wa_heap *h, size_t i, int tier)
{
	struct kvfs_pnode *n = h->a[i];

	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct kvfs_pnode *best = n;

		if (l < h->n && wa_less(h->a[l], best)) {
			m = l;
			best = h->a[l];
		}
		if (l + 1 < h->n && wa_less(h->a[l + 1], best))
			m = l + 1;
		if (m == i)
			break;
		wh_set(h, i, h->a[m], tier);
		i = m;
	}
	wh_set(h, i, n, tier);
}

static void wa_queue_add(struct wa_priv *wa, int tier, struct kvfs_pnode *n)
{
	struct wa_heap *h = &wa->q[tier][wa_cat_of(n)];

	if (h->n == h->cap) {
		size_t ncap = h->cap ? h->cap * 2 : 64;
		struct kvfs_pnode **a = realloc(h->a, ncap * sizeof(*a));

		if (!a) {
			kvfs_err("wa: out of memory for a recency queue");
			return;
		}
		h->a = a;
		h->cap = ncap;
	}
	n->t[tier].list |= WA_QUEUED;
	wh_set(h, h->n++, n, tier);
	wh_up(h, h->n - 1, tier);
}

static void wa_queue_del(struct wa_priv *wa, int tier, struct kvfs_pnode *n)
{
	struct wa_heap *h = &wa->q[tier][wa_cat_of(n)];
	size_t i = n->t[tier].idx;

	n->t[tier].list &= ~WA_QUEUED;
	if (--h->n == i)
		return;
	wh_set(h, i, h->a[h->n], tier);
	wh_up(h, i, tier);
	wh_down(h, h->a[i]->t[tier].idx, tier);
}

/* Whether @n should be a candidate of @tier now. */
static bool wa_candidate(const struct wa_priv *wa, const struct kvfs_pnode *n,
			 int tier)
{
	if (!(n->tiers & (1u << tier)) || !(n->hist[1] & WA_KNOWN))
		return false;
	return !wa->leaves_only || kvfs_policy_is_leaf(n, tier);
}

static void wa_queue_check(struct wa_priv *wa, int tier, struct kvfs_pnode *n)
{
	bool want = wa_candidate(wa, n, tier);
	bool in = n->t[tier].list & WA_QUEUED;

	if (want && !in)
		wa_queue_add(wa, tier, n);
	else if (!want && in)
		wa_queue_del(wa, tier, n);
}

/* ---- bookkeeping of accesses ---------------------------------------------- */

static void wa_note_request(struct wa_priv *wa, const struct kvfs_paccess *a)
{
	if (!a)
		return;
	if (a->now > wa->now)
		wa->now = a->now;
	if (!wa->seen || a->request != wa->last_req || a->now != wa->last_now) {
		wa->requests++;
		wa->seen = true;
		wa->last_req = a->request;
		wa->last_now = a->now;
	}
}

static void wa_set_fields(struct kvfs_pnode *n, unsigned cat, bool cont,
			  uint32_t creq, uint32_t lreq)
{
	n->hist[1] = (uint64_t)cat | WA_KNOWN | (cont ? WA_CONT : 0) |
		     ((uint64_t)creq << WA_CREQ_SHIFT) |
		     ((uint64_t)lreq << WA_LREQ_SHIFT);
}

/* First sight of @n: category, and the reuse its ghost may reveal. */
static void wa_create(struct wa_priv *wa, struct kvfs_pnode *n,
		      const struct kvfs_paccess *a)
{
	uint64_t now = a ? a->now : wa->now;
	uint32_t req = wa_req24(a ? a->request : wa->last_req);
	const struct kvfs_pnode *par = n->parent;
	struct wa_ghost *g;
	bool cont = false;
	unsigned c;

	/* continues an earlier request: extends a block made before it */
	if (par && (par->hist[1] & WA_KNOWN))
		cont = ((par->hist[1] >> WA_CREQ_SHIFT) & WA_REQ_MASK) != req ||
		       (par->hist[1] & WA_CONT);
	c = wa_cat_index(wa, wa_key_of(wa, n, cont));
	g = wa_ghost_find(wa, n->key);
	if (g) {
		if (now >= g->time && g->cat < wa->ncats)
			wa_sample(wa, g->cat, (double)(now - g->time));
		wa_ghost_del(wa, g);
	}
	wa_start(wa, c);
	n->hist[0] = now;
	wa_set_fields(n, c, cont, req, req);
}

static void wa_touch(struct wa_priv *wa, struct kvfs_pnode *n,
		     const struct kvfs_paccess *a)
{
	uint64_t now = a ? a->now : wa->now;
	uint32_t req = wa_req24(a ? a->request : wa->last_req);
	uint32_t lreq = (uint32_t)((n->hist[1] >> WA_LREQ_SHIFT) & WA_REQ_MASK);
	uint32_t creq = (uint32_t)((n->hist[1] >> WA_CREQ_SHIFT) & WA_REQ_MASK);
	bool cont = n->hist[1] & WA_CONT;
	unsigned c = wa_cat_of(n), queued = 0;

	if (!(n->hist[1] & WA_KNOWN)) {
		wa_create(wa, n, a);
		return;
	}
	/* the same request touching a block again is not a reuse */
	if (req == lreq)
		return;
	if (now >= wa_time(n))
		wa_sample(wa, c, (double)(now - wa_time(n)));
	/* a tagged block follows the tag of its latest user */
	if (n->category)
		c = wa_cat_index(wa, wa_key_of(wa, n, cont));
	wa_start(wa, c);
	for (int t = 0; t < KVFS_NTIERS; t++) {
		if (n->t[t].list & WA_QUEUED) {
			wa_queue_del(wa, t, n);
			queued |= 1u << t;
		}
	}
	n->hist[0] = now;
	wa_set_fields(n, c, cont, creq, req);
	for (int t = 0; t < KVFS_NTIERS; t++)
		if (queued & (1u << t))
			wa_queue_add(wa, t, n);
}

/* ---- options and life cycle -------------------------------------------- */

static void wa_defaults(struct wa_priv *wa)
{
	if (wa->configured)
		return;
	wa->configured = true;
	wa->window = 1024;
	wa->refit_requests = 64;
	wa->min_samples = 32;
	wa->max_turn = 8;
	wa->max_categories = 64;
	wa->lifespan = 0;
	wa->life_quantile = 0.95;
	wa->reuse_fraction = true;
	wa->leaves_only = true;
	wa->ghosts = 0;
}

static int parse_double(const char *val, double *out)
{
	char *end;
	double v = strtod(val, &end);

	if (end == val || *end || !isfinite(v) || v < 0)
		return -EINVAL;
	*out = v;
	return 0;
}

static int wa_set(struct kvfs_policy *p, const char *key, const char *val)
{
	struct wa_priv *wa = wa_of(p);
	uint32_t u32;
	uint64_t u64;
	double d;

	wa_defaults(wa);
	if (!strcmp(key, "window")) {
		if (kvfs_util_parse_u32(val, &u32) || u32 < 2 || u32 > (1u << 20))
			goto out_bad;
		wa->window = u32;
	} else if (!strcmp(key, "refit_requests")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32)
			goto out_bad;
		wa->refit_requests = u32;
	} else if (!strcmp(key, "min_samples")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32)
			goto out_bad;
		wa->min_samples = u32;
	} else if (!strcmp(key, "max_turn")) {
		if (kvfs_util_parse_u32(val, &u32) || !u32 || u32 > 0x7fff)
			goto out_bad;
		wa->max_turn = u32;
	} else if (!strcmp(key, "max_categories")) {
		if (kvfs_util_parse_u32(val, &u32) || u32 < 2 ||
		    u32 > WA_MAX_CATS)
			goto out_bad;
		wa->max_categories = u32;
	} else if (!strcmp(key, "lifespan")) {
		if (parse_double(val, &d))
			goto out_bad;
		wa->lifespan = d;
	} else if (!strcmp(key, "life_quantile")) {
		if (parse_double(val, &d) || d > 1)
			goto out_bad;
		wa->life_quantile = d;
	} else if (!strcmp(key, "reuse_fraction") ||
		   !strcmp(key, "leaves_only")) {
		bool *b = key[0] == 'r' ? &wa->reuse_fraction :
					  &wa->leaves_only;

		if (!strcmp(val, "1"))
			*b = true;
		else if (!strcmp(val, "0"))
			*b = false;
		else
			goto out_bad;
	} else if (!strcmp(key, "ghosts")) {
		if (kvfs_util_parse_u64(val, &u64) || u64 > (1ull << 24))
			goto out_bad;
		wa->ghosts = u64;
	} else {
		kvfs_err("wa: unknown option '%s'", key);
		return -EINVAL;
	}
	return 0;

out_bad:
	kvfs_err("wa: bad value '%s' for %s", val, key);
	return -EINVAL;
}

static void wa_release(struct kvfs_policy *p)
{
	struct wa_priv *wa = wa_of(p);

	kvfs_dbg("wa: %u categories, %llu refits, %llu evictions",
		 wa->ncats, (unsigned long long)wa->refits,
		 (unsigned long long)wa->evictions);
	for (unsigned c = 0; c < WA_MAX_CATS; c++) {
		free(wa->cats[c].win);
		wa->cats[c].win = NULL;
		for (int t = 0; t < KVFS_NTIERS; t++) {
			free(wa->q[t][c].a);
			memset(&wa->q[t][c], 0, sizeof(wa->q[t][c]));
		}
	}
	free(wa->stash);
	wa->stash = NULL;
	wa->nstash = wa->stash_cap = 0;
	free(wa->gtab);
	free(wa->gring);
	free(wa->scratch);
	wa->gtab = NULL;
	wa->gring = NULL;
	wa->scratch = NULL;
}

static int wa_init(struct kvfs_policy *p)
{
	struct wa_priv *wa = wa_of(p);
	uint64_t ghosts = wa->ghosts, cap = 0;

	wa_defaults(wa);
	for (int t = 0; t < KVFS_NTIERS; t++)
		cap += p->capacity[t];
	if (!ghosts) {
		/* a reuse is seen if it comes within ~4 caches' worth of
		 * forgotten blocks; bounded for byte capacities
		 */
		ghosts = cap * 4;
		if (ghosts < 4096)
			ghosts = 4096;
		if (ghosts > (1u << 18))
			ghosts = 1u << 18;
	}
	wa->gring_cap = ghosts;
	wa->gcap = 1;
	while (wa->gcap < ghosts * 2)
		wa->gcap <<= 1;
	wa->gtab = calloc(wa->gcap, sizeof(*wa->gtab));
	wa->gring = calloc(wa->gring_cap, sizeof(*wa->gring));
	wa->scratch = calloc(2 * (size_t)wa->window, sizeof(*wa->scratch));
	if (!wa->gtab || !wa->gring || !wa->scratch)
		goto out_nomem;
	/* index 0 takes every category beyond max_categories */
	wa->ncats = 0;
	wa_cat_index(wa, WA_KEY_OTHER);
	return 0;

out_nomem:
	wa_release(p);
	return -ENOMEM;
}

/* ---- hooks -------------------------------------------------------------- */

static void wa_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		      const struct kvfs_paccess *a)
{
	struct wa_priv *wa = wa_of(p);

	wa_note_request(wa, a);
	/* a move between tiers keeps the block's recency */
	if (!(n->hist[1] & WA_KNOWN))
		wa_create(wa, n, a);
	wa_queue_check(wa, tier, n);
	if (n->parent)
		wa_queue_check(wa, tier, n->parent);
}

static void wa_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		      size_t n, const struct kvfs_paccess *a)
{
	struct wa_priv *wa = wa_of(p);

	wa_note_request(wa, a);
	for (size_t i = 0; i < n; i++)
		if (path[i])
			wa_touch(wa, path[i], a);
}

static void wa_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct wa_priv *wa = wa_of(p);

	if (n->t[tier].list & WA_QUEUED)
		wa_queue_del(wa, tier, n);
	if (n->parent)
		wa_queue_check(wa, tier, n->parent);
}

static void wa_forget(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	struct wa_priv *wa = wa_of(p);

	for (int t = 0; t < KVFS_NTIERS; t++)
		if (n->t[t].list & WA_QUEUED)
			wa_queue_del(wa, t, n);
	if (!(n->hist[1] & WA_KNOWN))
		return;
	wa_ghost_add(wa, n->key, wa_time(n), wa_cat_of(n));
	n->hist[1] = 0;
}

static int wa_stash(struct wa_priv *wa, struct kvfs_pnode *n)
{
	if (wa->nstash == wa->stash_cap) {
		size_t ncap = wa->stash_cap ? wa->stash_cap * 2 : 64;
		struct kvfs_pnode **a = realloc(wa->stash, ncap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		wa->stash = a;
		wa->stash_cap = ncap;
	}
	wa->stash[wa->nstash++] = n;
	return 0;
}

/* The head of one category's queue that may move now, or NULL. */
static struct kvfs_pnode *wa_head(struct wa_priv *wa, int tier, unsigned c,
				  kvfs_policy_ok_fn ok, void *arg)
{
	struct wa_heap *h = &wa->q[tier][c];
	struct kvfs_pnode *n = NULL;
	size_t base = wa->nstash;

	while (h->n) {
		n = h->a[0];
		if (!ok || ok(n, arg))
			break;
		if (wa_stash(wa, n)) {
			kvfs_err("wa: out of memory while skipping pinned blocks");
			n = NULL;
			break;
		}
		wa_queue_del(wa, tier, n);
		n = NULL;
	}
	/* refused blocks go back: they stay candidates for later calls */
	while (wa->nstash > base)
		wa_queue_add(wa, tier, wa->stash[--wa->nstash]);
	return n;
}

static struct kvfs_pnode *wa_victim(struct kvfs_policy *p, int tier,
				    kvfs_policy_ok_fn ok, void *arg)
{
	struct wa_priv *wa = wa_of(p);
	struct kvfs_pnode *best = NULL;
	double bprob = 0;

	for (unsigned c = 0; c < wa->ncats; c++) {
		struct kvfs_pnode *n = wa_head(wa, tier, c, ok, arg);
		double prob, t;

		if (!n)
			continue;
		t = wa->now > wa_time(n) ? (double)(wa->now - wa_time(n)) : 0;
		prob = wa_prob(wa, c, t);
		/* (ReuseProb, -offset) lexicographic; then recency, key */
		if (!best || prob < bprob ||
		    (prob == bprob &&
		     (n->depth != best->depth ? n->depth > best->depth :
						wa_less(n, best)))) {
			best = n;
			bprob = prob;
		}
	}
	if (best)
		wa->evictions++;
	return best;
}

static bool wa_admit(struct kvfs_policy *p, int from, int to,
		     struct kvfs_pnode *n)
{
	/* the paper swaps every HBM victim to the CPU cache */
	return to >= 0 && to < KVFS_NTIERS && p->capacity[to];
}

static void wa_tick(struct kvfs_policy *p, const struct kvfs_paccess *a)
{
	struct wa_priv *wa = wa_of(p);

	if (a && a->now > wa->now)
		wa->now = a->now;
	if (wa->requests - wa->refit_at < wa->refit_requests)
		return;
	wa->refit_at = wa->requests;
	wa_refit(wa);
}

static void wa_model_out(const struct wa_priv *wa, const struct wa_model *m,
			 struct kvfs_wa_model *out)
{
	out->rate = m->rate;
	out->pfrac = wa->reuse_fraction ? m->pfrac : 1.0;
	out->life = m->life;
	out->fitted = m->fitted;
}

int kvfs_policy_wa_model(struct kvfs_policy *p, uint16_t category,
			 uint16_t turn, struct kvfs_wa_model *out)
{
	struct wa_priv *wa;
	uint32_t key, i;

	if (!p || p->ops != &kvfs_policy_wa_ops)
		return -EINVAL;
	wa = wa_of(p);
	memset(out, 0, sizeof(*out));
	if (!category) {
		wa_model_out(wa, &wa->pooled, out);
		for (unsigned c = 0; c < wa->ncats; c++)
			out->samples += wa->cats[c].win_n;
		return 0;
	}
	if (turn > wa->max_turn)
		turn = (uint16_t)wa->max_turn;
	key = WA_KEY(category, turn);
	for (i = wa_map_hash(key) % WA_MAP_SIZE; wa->map[i].idx1;
	     i = (i + 1) % WA_MAP_SIZE) {
		if (wa->map[i].key == key) {
			const struct wa_cat *cat =
				&wa->cats[wa->map[i].idx1 - 1];

			wa_model_out(wa, &cat->m, out);
			out->key = key;
			out->own = cat->m.fitted;
			out->samples = cat->win_n;
			return 0;
		}
	}
	return -ENOENT;
}

int kvfs_policy_wa_node_model(struct kvfs_policy *p,
			      const struct kvfs_pnode *n,
			      struct kvfs_wa_model *out)
{
	const struct wa_cat *cat;
	struct wa_priv *wa;

	if (!p || p->ops != &kvfs_policy_wa_ops)
		return -EINVAL;
	wa = wa_of(p);
	if (!(n->hist[1] & WA_KNOWN))
		return -ENOENT;
	memset(out, 0, sizeof(*out));
	cat = &wa->cats[wa_cat_of(n)];
	wa_model_out(wa, cat->m.fitted ? &cat->m : &wa->pooled, out);
	out->key = cat->key;
	out->own = cat->m.fitted;
	out->samples = cat->win_n;
	return 0;
}

const struct kvfs_policy_ops kvfs_policy_wa_ops = {
	.name = "wa",
	.priv_size = sizeof(struct wa_priv),
	.set = wa_set,
	.init = wa_init,
	.release = wa_release,
	.insert = wa_insert,
	.access = wa_access,
	.remove = wa_remove,
	.forget = wa_forget,
	.victim = wa_victim,
	.admit = wa_admit,
	.tick = wa_tick,
};
