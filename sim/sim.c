// SPDX-License-Identifier: MIT
/*
 * kvfs-sim engine: builds the prefix tree of a trace once, then replays it
 * through a policy created by name from the registry, so the simulator and
 * the daemon run the same policy code.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "sim/sim.h"
#include "sim/sim_i.h"
#include "meta/log.h"
#include "meta/util.h"

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Open-addressing map (parent + 1, hash id) -> node, used while building. */
struct nmap {
	uint64_t *kp;   /* parent + 1; 0 = empty slot */
	int64_t *kh;
	uint32_t *val;
	size_t cap, n;
};

static size_t nmap_slot(const struct nmap *m, uint64_t kp, int64_t kh)
{
	size_t i = mix64(kp * 0x9e3779b97f4a7c15ULL ^ (uint64_t)kh) &
		   (m->cap - 1);

	while (m->kp[i] && (m->kp[i] != kp || m->kh[i] != kh))
		i = (i + 1) & (m->cap - 1);
	return i;
}

static int nmap_grow(struct nmap *m)
{
	struct nmap nm = { .cap = m->cap ? 2 * m->cap : 1u << 16 };

	nm.kp = calloc(nm.cap, sizeof(*nm.kp));
	nm.kh = calloc(nm.cap, sizeof(*nm.kh));
	nm.val = calloc(nm.cap, sizeof(*nm.val));
	if (!nm.kp || !nm.kh || !nm.val) {
		free(nm.kp);
		free(nm.kh);
		free(nm.val);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->cap; i++) {
		size_t j;

		if (!m->kp[i])
			continue;
		j = nmap_slot(&nm, m->kp[i], m->kh[i]);
		nm.kp[j] = m->kp[i];
		nm.kh[j] = m->kh[i];
		nm.val[j] = m->val[i];
	}
	nm.n = m->n;
	free(m->kp);
	free(m->kh);
	free(m->val);
	*m = nm;
	return 0;
}

static int sim_grow_nodes(struct kvfs_sim *s)
{
	uint32_t cap = s->capnodes ? 2 * s->capnodes : 4096;
	void *p;

	if (cap <= s->capnodes || cap == NIL)
		return -ENOMEM;
#define GROW(f)                                                          \
	do {                                                             \
		p = realloc(s->f, (size_t)cap * sizeof(*s->f));          \
		if (!p)                                                  \
			return -ENOMEM;                                  \
		s->f = p;                                                \
	} while (0)
	GROW(parent);
	GROW(depth);
	GROW(tokens);
	GROW(first_child);
	GROW(next_sibling);
	GROW(key);
#undef GROW
	s->capnodes = cap;
	return 0;
}

static uint32_t sim_node(struct kvfs_sim *s, struct nmap *m, uint32_t parent,
			 int64_t h, uint32_t tokens, int *ret)
{
	uint64_t kp = (uint64_t)parent + 1;
	size_t i;
	uint32_t n;

	*ret = 0;
	if ((m->n + 1) * 2 > m->cap && (*ret = nmap_grow(m)))
		return NIL;
	i = nmap_slot(m, kp, h);
	if (m->kp[i])
		return m->val[i];
	if (s->nnodes == s->capnodes && (*ret = sim_grow_nodes(s)))
		return NIL;
	n = s->nnodes++;
	m->kp[i] = kp;
	m->kh[i] = h;
	m->val[i] = n;
	m->n++;
	s->parent[n] = parent;
	s->depth[n] = parent == NIL ? 0 : s->depth[parent] + 1;
	s->tokens[n] = tokens;
	s->first_child[n] = NIL;
	s->next_sibling[n] = NIL;
	if (parent == NIL) {
		s->key[n][0] = mix64((uint64_t)h ^ 0x6b76667321ULL);
		s->key[n][1] = mix64((uint64_t)h + 0x243f6a8885a308d3ULL);
	} else {
		s->key[n][0] = mix64(s->key[parent][0] ^
				     mix64((uint64_t)h + 1));
		s->key[n][1] = mix64(s->key[parent][1] +
				     mix64((uint64_t)h ^ 0x13198a2e03707344ULL));
		s->next_sibling[n] = s->first_child[parent];
		s->first_child[parent] = n;
	}
	return n;
}

void kvfs_sim_free(struct kvfs_sim *s)
{
	if (!s)
		return;
	free(s->parent);
	free(s->depth);
	free(s->tokens);
	free(s->first_child);
	free(s->next_sibling);
	free(s->key);
	free(s->req);
	free(s->path);
	free(s->next);
	free(s);
}

void kvfs_sim_next_uses(const struct kvfs_sim *s, uint64_t *next,
			uint64_t *last, bool (*keep)(size_t i, const void *arg),
			const void *arg)
{
	for (uint32_t n = 0; n < s->nnodes; n++)
		last[n] = UINT64_MAX;
	for (size_t i = s->nreq; i-- > 0;) {
		const struct sim_req *q = &s->req[i];

		if (keep && !keep(i, arg))
			continue;
		for (uint32_t j = 0; j < q->len; j++) {
			uint32_t n = s->path[q->off + j];

			next[q->off + j] = last[n];
			last[n] = i + 1;
		}
	}
}

int kvfs_sim_new(const struct kvfs_trace *t, struct kvfs_sim **out)
{
	struct nmap m = { 0 };
	struct kvfs_sim *s;
	uint64_t *last = NULL;
	int ret = -ENOMEM;

	*out = NULL;
	if (!t->block_tokens) {
		kvfs_err("sim: trace has no block size");
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->block_tokens = t->block_tokens;
	s->nreq = t->nreq;
	s->npath = t->nhash;
	s->req = calloc(t->nreq ? t->nreq : 1, sizeof(*s->req));
	s->path = calloc(t->nhash ? t->nhash : 1, sizeof(*s->path));
	s->next = calloc(t->nhash ? t->nhash : 1, sizeof(*s->next));
	if (!s->req || !s->path || !s->next)
		goto out_free;
	for (size_t i = 0; i < t->nreq; i++) {
		const struct kvfs_trace_req *r = &t->req[i];
		struct sim_req *q = &s->req[i];
		uint32_t parent = NIL, bt = t->block_tokens, sum = 0;

		q->ts_ms = r->ts_ms;
		q->off = r->off;
		q->len = r->nhash;
		q->type = r->type;
		q->turn = r->turn;
		if (r->nhash > s->maxlen)
			s->maxlen = r->nhash;
		for (uint32_t j = 0; j < r->nhash; j++) {
			uint64_t full = (uint64_t)bt * j;
			uint32_t tok = bt;

			/* The last block holds what input_length leaves. */
			if (j + 1 == r->nhash && r->input_len > full &&
			    r->input_len - full < bt)
				tok = (uint32_t)(r->input_len - full);
			parent = sim_node(s, &m, parent, t->hash[r->off + j],
					  tok, &ret);
			if (parent == NIL)
				goto out_free;
			s->path[r->off + j] = parent;
			sum += s->tokens[parent];
		}
		q->tokens = r->input_len > sum ? r->input_len : sum;
	}
	last = malloc((s->nnodes ? s->nnodes : 1) * sizeof(*last));
	if (!last) {
		ret = -ENOMEM;
		goto out_free;
	}
	kvfs_sim_next_uses(s, s->next, last, NULL, NULL);
	free(last);
	free(m.kp);
	free(m.kh);
	free(m.val);
	*out = s;
	return 0;

out_free:
	free(m.kp);
	free(m.kh);
	free(m.val);
	kvfs_sim_free(s);
	return ret;
}

uint64_t kvfs_sim_unique_blocks(const struct kvfs_sim *s)
{
	return s->nnodes;
}

uint64_t kvfs_sim_requests(const struct kvfs_sim *s)
{
	return s->nreq;
}

void kvfs_sim_model_default(struct kvfs_sim_model *m)
{
	m->flops = 400e12;   /* ~40% of an H100's dense BF16 peak */
	m->pcie_bps = 25e9;  /* PCIe 4.0 x16, effective */
	m->ssd_bps = 6e9;    /* one NVMe 4.0 drive, sequential */
	m->net_bps = 12.5e9; /* a 100 Gb/s NIC to the shared tier */
	m->params = 8.03e9;  /* Llama-3-8B */
	m->layers = 32;
	m->hidden = 4096;
	m->kv_heads = 8;
	m->head_dim = 128;
	m->dtype_bytes = 2;
}

double kvfs_sim_kv_bytes(const struct kvfs_sim_model *m)
{
	return 2.0 * m->layers * m->kv_heads * m->head_dim * m->dtype_bytes;
}

/* ---- one replay ---- */

struct sim_pnode {
	struct kvfs_pnode pn; /* first: a pnode pointer is a sim_pnode one */
	uint32_t pin;         /* request (1-based) holding the block */
};

struct run {
	struct kvfs_sim *s;
	const struct kvfs_sim_conf *c;
	struct kvfs_policy *p;
	struct kvfs_sim_stats *st;
	struct kvfs_sim_stats dummy; /* warm-up requests count here */
	struct sim_pnode *nodes;
	uint32_t cur;                /* pinned request, 0 = none */
	int top;
	int below[KVFS_NTIERS];      /* next present tier down, -1 none */
	struct kvfs_paccess a;
	double kvb;                  /* KV bytes per token */
	uint64_t capsum;             /* blocks in all tiers, for req_out */
	uint32_t *stack;             /* orphan walk */
};

static inline uint32_t nidx(const struct run *r, const struct kvfs_pnode *n)
{
	return (uint32_t)((const struct sim_pnode *)n - r->nodes);
}

static bool sim_ok(struct kvfs_pnode *n, void *arg)
{
	struct run *r = arg;

	return !r->cur || ((struct sim_pnode *)n)->pin != r->cur;
}

static int tier_of(const struct kvfs_pnode *n)
{
	return n->tiers ? __builtin_ctz(n->tiers) : -1;
}

/* Seconds to move @tokens of KV in or out of @tier over its link. */
static double move_s(const struct run *r, int tier, uint64_t tokens)
{
	const struct kvfs_sim_model *m = &r->c->model;
	double bw;

	if (tier == KVFS_TIER_GPU)
		return 0;
	bw = m->pcie_bps;
	if (tier == KVFS_TIER_SSD && m->ssd_bps < bw)
		bw = m->ssd_bps;
	return bw > 0 ? (double)tokens * r->kvb / bw : 0;
}

static void sim_insert(struct run *r, int tier, struct kvfs_pnode *n)
{
	uint64_t t0 = kvfs_util_now_mono();

	kvfs_policy_insert(r->p, tier, n, &r->a);
	r->st->access_ns += kvfs_util_now_mono() - t0;
}

static void sim_discard(struct run *r, struct kvfs_pnode *v);

static int make_room(struct run *r, int tier, uint64_t size);

/*
 * @v is leaving @from (still resident there: moves copy first and drop
 * after, so a policy sees a move as a block in two tiers): admission into
 * a tier below, or gone.
 */
static void sim_sink(struct run *r, struct kvfs_pnode *v, int from)
{
	if (r->below[from] >= 0)
		r->st->demoted++;
	for (int u = r->below[from]; u >= 0; u = r->below[u]) {
		if (!kvfs_policy_admit(r->p, from, u, v)) {
			r->st->refused++;
			continue;
		}
		if (make_room(r, u, v->size)) {
			r->st->refused++;
			continue;
		}
		/* Making room may have dropped an ancestor's last copy,
		 * and @v with it.
		 */
		if (!(v->tiers & (1u << from)))
			return;
		if (v->parent && !v->parent->tiers)
			break;
		sim_insert(r, u, v);
		kvfs_policy_remove(r->p, from, v);
		r->st->admitted[u]++;
		r->st->offload_s += move_s(r, u, v->tokens);
		return;
	}
	sim_discard(r, v);
}

static void sim_evict(struct run *r, struct kvfs_pnode *v, int tier)
{
	sim_sink(r, v, tier);
}

static int make_room(struct run *r, int tier, uint64_t size)
{
	struct kvfs_policy *p = r->p;

	if (size > p->capacity[tier])
		return -ENOSPC;
	while (p->used[tier] + size > p->capacity[tier]) {
		uint64_t t0 = kvfs_util_now_mono();
		struct kvfs_pnode *v = kvfs_policy_victim(p, tier, sim_ok, r);

		r->st->victim_ns += kvfs_util_now_mono() - t0;
		r->st->victim_calls++;
		if (!v)
			return -ENOSPC;
		if (!(v->tiers & (1u << tier)) || !sim_ok(v, r)) {
			kvfs_err("sim: policy %s returned a bad victim",
				 p->ops->name);
			return -ENOSPC;
		}
		r->st->evicted[tier]++;
		sim_evict(r, v, tier);
	}
	return 0;
}

/* @v and every resident descendant leave the cache. */
static void sim_discard(struct run *r, struct kvfs_pnode *v)
{
	struct kvfs_sim *s = r->s;
	size_t sp = 0;

	r->st->discarded++;
	kvfs_policy_forget(r->p, v);
	r->stack[sp++] = nidx(r, v);
	while (sp) {
		uint32_t n = r->stack[--sp];

		for (uint32_t c = s->first_child[n]; c != NIL;
		     c = s->next_sibling[c]) {
			struct kvfs_pnode *cn = &r->nodes[c].pn;

			if (!cn->tiers)
				continue;
			/* Resident implies a resident parent (until now), so
			 * only resident children can hide resident nodes.
			 */
			kvfs_policy_forget(r->p, cn);
			r->st->orphans++;
			r->stack[sp++] = c;
		}
	}
}

static void sim_promote(struct run *r, struct kvfs_pmove *plan)
{
	struct kvfs_policy *p = r->p;

	for (int up = r->top; up >= 0 && r->below[up] >= 0; up = r->below[up]) {
		int lo = r->below[up];
		size_t k = kvfs_policy_promote(p, lo, up, plan,
					       r->c->promote_max);

		for (size_t i = 0; i < k && i < r->c->promote_max; i++) {
			struct kvfs_pnode *n = plan[i].node;

			if (n && plan[i].op == KVFS_PMOVE_DOWN &&
			    (n->tiers & (1u << up))) {
				r->st->promote_down++;
				sim_evict(r, n, up);
			} else if (n && plan[i].op == KVFS_PMOVE_UP &&
				   (n->tiers & (1u << lo)) &&
				   !(n->tiers & (1u << up)) &&
				   p->used[up] + n->size <= p->capacity[up] &&
				   (!n->parent || n->parent->tiers)) {
				sim_insert(r, up, n);
				kvfs_policy_remove(p, lo, n);
				r->st->promoted++;
				r->st->load_s += move_s(r, lo, n->tokens);
			} else {
				r->st->promote_skipped++;
			}
		}
	}
}

double kvfs_sim_prefill_s(const struct kvfs_sim_model *m, double hit,
			  double miss)
{
	double f = 2.0 * m->params * miss +
		   4.0 * m->layers * (double)m->hidden * miss *
			   (hit + miss / 2.0);

	return m->flops > 0 ? f / m->flops : 0;
}

static void sim_request(struct run *r, size_t i, struct kvfs_pnode **P)
{
	struct kvfs_sim *s = r->s;
	const struct sim_req *q = &s->req[i];
	struct kvfs_policy *p = r->p;
	uint64_t tok_hit[KVFS_NTIERS] = { 0 }, hit_tok = 0, t0;
	double ttft;
	uint32_t n = q->len, h = 0;

	r->cur = (uint32_t)(i + 1);
	r->a.now = q->ts_ms;
	r->a.request = i + 1;
	for (uint32_t j = 0; j < n; j++) {
		struct sim_pnode *x = &r->nodes[s->path[q->off + j]];

		x->pin = r->cur;
		x->pn.next_use = s->next[q->off + j];
		P[j] = &x->pn;
	}
	while (h < n && P[h]->tiers)
		h++;
	r->st->requests++;
	r->st->block_accesses += n;
	r->st->hit_blocks += h;
	for (uint32_t j = 0; j < h; j++) {
		int t = tier_of(P[j]);

		r->st->hit_tier[t]++;
		tok_hit[t] += P[j]->tokens;
		hit_tok += P[j]->tokens;
	}
	ttft = kvfs_sim_prefill_s(&r->c->model, (double)hit_tok,
				  (double)(q->tokens - hit_tok));
	for (int t = 1; t < KVFS_NTIERS; t++)
		ttft += move_s(r, t, tok_hit[t]);
	r->st->ttft_s += ttft;
	r->st->ttft_nocache_s +=
		kvfs_sim_prefill_s(&r->c->model, 0, q->tokens);
	if (r->c->req_out && r->st != &r->dummy)
		fprintf(r->c->req_out,
			"%s,%" PRIu64 ",%zu,%u,%u,%" PRIu64 ",%" PRIu64
			",%.3f\n",
			r->c->policy, r->capsum, i, n, h, (uint64_t)q->tokens,
			hit_tok, ttft * 1e3);

	if (h) {
		r->a.hit = true;
		t0 = kvfs_util_now_mono();
		kvfs_policy_access(p, P, h, &r->a);
		r->st->access_ns += kvfs_util_now_mono() - t0;
	}
	/* Lower-tier hits move up to where the request computes. */
	for (uint32_t j = 0; j < h; j++) {
		int t = tier_of(P[j]);

		if (t == r->top || make_room(r, r->top, P[j]->size))
			continue;
		sim_insert(r, r->top, P[j]);
		kvfs_policy_remove(p, t, P[j]);
		r->st->loaded++;
	}
	r->a.hit = false;
	for (uint32_t j = h; j < n; j++) {
		struct kvfs_pnode *x = P[j];

		if (x->tiers)
			continue;
		if (make_room(r, r->top, x->size) ||
		    (x->parent && !x->parent->tiers)) {
			r->st->bypassed += n - j;
			break;
		}
		x->category = q->type;
		x->turn = q->turn;
		sim_insert(r, r->top, x);
		r->st->inserted++;
	}
	kvfs_policy_tick(p, &r->a);
	r->cur = 0;
}

int kvfs_sim_run(struct kvfs_sim *s, const struct kvfs_sim_conf *c,
		 struct kvfs_sim_stats *st)
{
	struct run r = { .s = s, .c = c, .top = -1 };
	struct kvfs_pnode **P = NULL;
	struct kvfs_pmove *plan = NULL;
	int ret, last = -1;

	memset(st, 0, sizeof(*st));
	for (int t = KVFS_NTIERS - 1; t >= 0; t--) {
		r.below[t] = last;
		if (c->cap[t]) {
			last = t;
			r.top = t;
		}
	}
	if (r.top < 0) {
		kvfs_err("sim: no tier has a capacity");
		return -EINVAL;
	}
	ret = kvfs_policy_new(c->policy, c->keys, c->vals, c->nopts, c->cap,
			      &r.p);
	if (ret)
		return ret;
	ret = -ENOMEM;
	r.nodes = calloc(s->nnodes ? s->nnodes : 1, sizeof(*r.nodes));
	r.stack = malloc((s->nnodes ? s->nnodes : 1) * sizeof(*r.stack));
	P = malloc((s->maxlen ? s->maxlen : 1) * sizeof(*P));
	if (c->promote_every && c->promote_max)
		plan = calloc(c->promote_max, sizeof(*plan));
	if (!r.nodes || !r.stack || !P ||
	    (c->promote_every && c->promote_max && !plan))
		goto out_free;
	for (uint32_t n = 0; n < s->nnodes; n++) {
		struct kvfs_pnode *x = &r.nodes[n].pn;

		memcpy(x->key, s->key[n], 16);
		x->parent = s->parent[n] == NIL ? NULL :
			    &r.nodes[s->parent[n]].pn;
		x->depth = s->depth[n];
		x->tokens = s->tokens[n];
		x->size = 1;
		x->next_use = UINT64_MAX;
	}
	r.kvb = kvfs_sim_kv_bytes(&c->model);
	for (int t = 0; t < KVFS_NTIERS; t++)
		r.capsum += c->cap[t];
	for (size_t i = 0; i < s->nreq; i++) {
		r.st = i < c->warmup ? &r.dummy : st;
		sim_request(&r, i, P);
		if (plan && (i + 1) % c->promote_every == 0)
			sim_promote(&r, plan);
	}
	ret = 0;
out_free:
	free(plan);
	free(P);
	free(r.stack);
	free(r.nodes);
	kvfs_policy_free(r.p);
	return ret;
}
