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
 * the lowest of the queue heads (O(W)).
 *
 * Node fields used: hist[0] = last access time; hist[1] = WA_* fields
 * below; t[tier].prev/.next = the category queue, t[tier].list bit 0 =
 * queued.
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

/* A fitted model as the policy uses it; see kvfs_policy_wa_model(). */
struct kvfs_wa_model {
	double rate;     /* lambda, per caller time unit */
	double pfrac;    /* fraction of intervals that end in a reuse */
	double life;     /* lifespan cap; 0 = none */
	uint64_t samples; /* reuse intervals in the window */
	bool fitted;     /* false: the pooled model or plain recency is used */
};

/*
 * Test-only introspection: the model of category (@category, @turn) as
 * the caller tags nodes (category 0 = pooled model of all categories).
 * Returns 0, -ENOENT for a category never seen, -EINVAL for another
 * policy.  Same locking as every policy call.  (Candidate for
 * cache/policy_i.h.)
 */
int kvfs_policy_wa_model(struct kvfs_policy *p, uint16_t category,
			 uint16_t turn, struct kvfs_wa_model *out);

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

struct wa_queue {
	struct kvfs_pnode *head, *tail;
	/* head-most node with the tail's time; NULL = recompute */
	struct kvfs_pnode *seg;
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
	uint64_t ghosts;      /* 0 = auto */

	struct wa_cat cats[WA_MAX_CATS];
	uint32_t ncats;
	struct {
		uint32_t key;
		uint16_t idx1; /* index + 1; 0 = empty slot */
	} map[WA_MAP_SIZE];
	struct wa_model pooled;
	uint64_t pooled_starts, pooled_reuses;

	struct wa_queue q[KVFS_NTIERS][WA_MAX_CATS];

	/* ghosts: open addressing on the key, bounded by a FIFO of keys */
	struct wa_ghost *gtab;
	uint64_t gcap;
	uint8_t (*gring)[16];
	uint64_t gring_cap, gseq_head, gseq_tail;

	uint64_t now, requests, refit_at, last_req, last_now;
	bool seen;
	double *scratch;

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

/* ---- queues ------------------------------------------------------------- */

/* (time ascending, depth descending): the head is evicted first */
static bool wa_before(const struct kvfs_pnode *a, const struct kvfs_pnode *b)
{
	if (wa_time(a) != wa_time(b))
		return wa_time(a) < wa_time(b);
	return a->depth > b->depth;
}

static void wa_link_after(struct wa_queue *q, struct kvfs_pnode *pos,
			  struct kvfs_pnode *n, int tier)
{
	struct kvfs_plink *k = &n->t[tier];

	k->prev = pos;
	k->next = pos ? pos->t[tier].next : q->head;
	if (k->next)
		k->next->t[tier].prev = n;
	else
		q->tail = n;
	if (pos)
		pos->t[tier].next = n;
	else
		q->head = n;
	k->list |= WA_QUEUED;
}

static void wa_unlink(struct wa_queue *q, struct kvfs_pnode *n, int tier)
{
	struct kvfs_plink *k = &n->t[tier];

	if (q->seg == n)
		q->seg = k->next && wa_time(k->next) == wa_time(n) ? k->next :
								      NULL;
	if (k->prev)
		k->prev->t[tier].next = k->next;
	else
		q->head = k->next;
	if (k->next)
		k->next->t[tier].prev = k->prev;
	else
		q->tail = k->prev;
	k->prev = k->next = NULL;
	k->list &= ~WA_QUEUED;
}

static void wa_link(struct wa_queue *q, struct kvfs_pnode *n, int tier)
{
	struct kvfs_pnode *pos = q->tail;

	if (!pos || wa_time(pos) < wa_time(n)) {
		wa_link_after(q, pos, n, tier);
		q->seg = n;
		return;
	}
	if (wa_time(pos) == wa_time(n)) {
		if (!q->seg) {
			q->seg = pos;
			while (q->seg->t[tier].prev &&
			       wa_time(q->seg->t[tier].prev) == wa_time(pos))
				q->seg = q->seg->t[tier].prev;
		}
		/* root-first inserts: each new node is the deepest so far */
		if (n->depth >= q->seg->depth) {
			wa_link_after(q, q->seg->t[tier].prev, n, tier);
			q->seg = n;
			return;
		}
	}
	while (pos && wa_before(n, pos))
		pos = pos->t[tier].prev;
	wa_link_after(q, pos, n, tier);
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
	unsigned oldc = wa_cat_of(n), c = oldc, queued = 0;

	if (!(n->hist[1] & WA_KNOWN)) {
		wa_create(wa, n, a);
		return;
	}
	/* the same request touching a block again is not a reuse */
	if (req == lreq)
		return;
	if (now >= wa_time(n))
		wa_sample(wa, oldc, (double)(now - wa_time(n)));
	/* a tagged block follows the tag of its latest user */
	if (n->category)
		c = wa_cat_index(wa, wa_key_of(wa, n, cont));
	wa_start(wa, c);
	for (int t = 0; t < KVFS_NTIERS; t++) {
		if (n->t[t].list & WA_QUEUED) {
			wa_unlink(&wa->q[t][oldc], n, t);
			queued |= 1u << t;
		}
	}
	n->hist[0] = now;
	wa_set_fields(n, c, cont, creq, req);
	for (int t = 0; t < KVFS_NTIERS; t++)
		if (queued & (1u << t))
			wa_link(&wa->q[t][c], n, t);
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
	} else if (!strcmp(key, "reuse_fraction")) {
		if (!strcmp(val, "1"))
			wa->reuse_fraction = true;
		else if (!strcmp(val, "0"))
			wa->reuse_fraction = false;
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
	}
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
	if (!(n->t[tier].list & WA_QUEUED))
		wa_link(&wa->q[tier][wa_cat_of(n)], n, tier);
}

static void wa_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		      size_t n, const struct kvfs_paccess *a)
{
	struct wa_priv *wa = wa_of(p);

	wa_note_request(wa, a);
	/* deepest first: each lands at the queue tail in O(1) */
	for (size_t i = n; i-- > 0;)
		if (path[i])
			wa_touch(wa, path[i], a);
}

static void wa_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct wa_priv *wa = wa_of(p);

	if (n->t[tier].list & WA_QUEUED)
		wa_unlink(&wa->q[tier][wa_cat_of(n)], n, tier);
}

static void wa_forget(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	struct wa_priv *wa = wa_of(p);

	for (int t = 0; t < KVFS_NTIERS; t++)
		wa_remove(p, t, n);
	if (!(n->hist[1] & WA_KNOWN))
		return;
	wa_ghost_add(wa, n->key, wa_time(n), wa_cat_of(n));
	n->hist[1] = 0;
}

static struct kvfs_pnode *wa_victim(struct kvfs_policy *p, int tier,
				    kvfs_policy_ok_fn ok, void *arg)
{
	struct wa_priv *wa = wa_of(p);
	struct kvfs_pnode *best = NULL;
	double bprob = 0;

	for (unsigned c = 0; c < wa->ncats; c++) {
		struct kvfs_pnode *n = wa->q[tier][c].head;
		double prob, t;

		while (n && ok && !ok(n, arg))
			n = n->t[tier].next;
		if (!n)
			continue;
		t = wa->now > wa_time(n) ? (double)(wa->now - wa_time(n)) : 0;
		prob = wa_prob(wa, c, t);
		if (!best || prob < bprob ||
		    (prob == bprob && (n->depth > best->depth ||
				       (n->depth == best->depth &&
					wa_time(n) < wa_time(best))))) {
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

int kvfs_policy_wa_model(struct kvfs_policy *p, uint16_t category,
			 uint16_t turn, struct kvfs_wa_model *out)
{
	struct wa_priv *wa;
	const struct wa_model *m;
	uint64_t samples = 0;
	uint32_t key, i;

	if (!p || p->ops != &kvfs_policy_wa_ops)
		return -EINVAL;
	wa = wa_of(p);
	if (!category) {
		m = &wa->pooled;
		for (unsigned c = 0; c < wa->ncats; c++)
			samples += wa->cats[c].win_n;
		goto out_copy;
	}
	if (turn > wa->max_turn)
		turn = (uint16_t)wa->max_turn;
	key = WA_KEY(category, turn);
	for (i = wa_map_hash(key) % WA_MAP_SIZE; wa->map[i].idx1;
	     i = (i + 1) % WA_MAP_SIZE) {
		if (wa->map[i].key == key) {
			const struct wa_cat *cat =
				&wa->cats[wa->map[i].idx1 - 1];

			m = &cat->m;
			samples = cat->win_n;
			goto out_copy;
		}
	}
	return -ENOENT;

out_copy:
	out->rate = m->rate;
	out->pfrac = m->pfrac;
	out->life = m->life;
	out->fitted = m->fitted;
	out->samples = samples;
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
