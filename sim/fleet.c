// SPDX-License-Identifier: MIT
/*
 * kvfs-sim fleet mode (sim/sim.h): several hosts, each with a private
 * cache, and one tier they share. Every cache is its own instance of the
 * policy over one tier, on its own copy of the prefix tree's nodes, so
 * the daemon's policy code decides what each keeps.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "meta/util.h"
#include "sim/sim.h"
#include "sim/sim_i.h"

#define T KVFS_TIER_DRAM /* the one tier of every cache */

struct fnode {
	struct kvfs_pnode pn; /* first: a pnode pointer is an fnode one */
	uint64_t pin; /* request (1-based) holding the block */
};

/* One cache: a host's, or the shared tier. */
struct fcache {
	struct kvfs_policy *p;
	struct fnode *nodes;
	uint64_t cur; /* the request in flight, pinned */
};

struct fleet {
	const struct kvfs_sim *s;
	const struct kvfs_sim_model *model; /* TTFT */
	double kvb; /* KV bytes per token under model */
	struct kvfs_paccess a;
	uint32_t *stack; /* orphan walk */
	/* Per path entry, the next request (1-based) routed to the same host
	 * that uses the block: what Belady must see in a private cache.  The
	 * shared tier sees every request, so it takes the trace's next[].
	 */
	uint64_t *hnext;
	/* Sightings on their way to the other hosts, oldest first. */
	struct fsight {
		uint64_t ts_ms;
		uint32_t host, node;
	} *sq;
	size_t sq_head, sq_tail;
};

/* Deliver the sightings due by @now to every host but their own. */
static void fleet_sight_due(struct fleet *f, const struct kvfs_fleet_conf *c,
			    struct fcache *host, uint64_t now,
			    struct kvfs_fleet_stats *st)
{
	uint64_t t0;

	if (f->sq_head == f->sq_tail ||
	    f->sq[f->sq_head].ts_ms + c->sight_ms > now)
		return;
	t0 = kvfs_util_now_mono();
	while (f->sq_head < f->sq_tail &&
	       f->sq[f->sq_head].ts_ms + c->sight_ms <= now) {
		const struct fsight *g = &f->sq[f->sq_head++];
		const uint8_t *key = (const uint8_t *)f->s->key[g->node];

		for (unsigned h = 0; h < c->hosts; h++) {
			if (h == g->host)
				continue;
			kvfs_policy_sight(host[h].p, key,
					  &host[h].nodes[g->node].pn);
			st->sightings++;
		}
	}
	st->sight_ns += kvfs_util_now_mono() - t0;
}

/* Request @i, just served by host @h, will be told to the others. */
static void fleet_sight_add(struct fleet *f, size_t i, unsigned h)
{
	const struct sim_req *q = &f->s->req[i];
	const uint32_t *idx = &f->s->path[q->off];

	if (f->sq_tail == f->sq_head)
		f->sq_head = f->sq_tail = 0;
	for (uint32_t j = 0; j < q->len; j++)
		f->sq[f->sq_tail++] = (struct fsight){ .ts_ms = q->ts_ms,
						       .host = h,
						       .node = idx[j] };
}

static bool fleet_ok(struct kvfs_pnode *n, void *arg)
{
	const struct fcache *c = arg;

	return ((struct fnode *)n)->pin != c->cur;
}

/* @v and its resident descendants leave @c (a descendant without its
 * parent could never be hit, and prefix-aware policies rely on it).
 */
static void fleet_discard(struct fleet *f, struct fcache *c,
			  struct kvfs_pnode *v)
{
	const struct kvfs_sim *s = f->s;
	size_t sp = 0;

	kvfs_policy_forget(c->p, v);
	f->stack[sp++] = (uint32_t)((struct fnode *)v - c->nodes);
	while (sp) {
		uint32_t n = f->stack[--sp];

		for (uint32_t ch = s->first_child[n]; ch != NIL;
		     ch = s->next_sibling[ch]) {
			if (!c->nodes[ch].pn.tiers)
				continue;
			kvfs_policy_forget(c->p, &c->nodes[ch].pn);
			f->stack[sp++] = ch;
		}
	}
}

/* Room for one block in @c. 0 or -ENOSPC. */
static int fleet_room(struct fleet *f, struct fcache *c)
{
	while (c->p->used[T] + 1 > c->p->capacity[T]) {
		struct kvfs_pnode *v = kvfs_policy_victim(c->p, T, fleet_ok, c);

		if (!v || !fleet_ok(v, c))
			return -ENOSPC;
		fleet_discard(f, c, v);
	}
	return 0;
}

/* Cache path nodes @idx[from..n) in @c, in order, skipping resident ones;
 * stops at the first that finds no room. Returns the blocks inserted.
 */
static uint64_t fleet_fill(struct fleet *f, struct fcache *c,
			   const uint32_t *idx, uint32_t from, uint32_t n)
{
	uint64_t k = 0;

	for (uint32_t j = from; j < n; j++) {
		struct kvfs_pnode *x = &c->nodes[idx[j]].pn;

		if (x->tiers)
			continue;
		if (fleet_room(f, c) || (x->parent && !x->parent->tiers))
			break;
		kvfs_policy_insert(c->p, T, x, &f->a);
		k++;
	}
	return k;
}

static void fleet_access(struct fleet *f, struct fcache *c,
			 struct kvfs_pnode **P, uint32_t n)
{
	if (!n)
		return;
	f->a.hit = true;
	kvfs_policy_access(c->p, P, n, &f->a);
	f->a.hit = false;
}

static void fcache_free(struct fcache *c)
{
	kvfs_policy_free(c->p);
	free(c->nodes);
}

static int fcache_init(const struct kvfs_sim *s,
		       const struct kvfs_fleet_conf *cf, uint64_t cap,
		       struct fcache *c)
{
	uint64_t caps[KVFS_NTIERS] = { 0 };
	int ret;

	caps[T] = cap;
	ret = kvfs_policy_new(cf->policy, cf->keys, cf->vals, cf->nopts, caps,
			      &c->p);
	if (ret)
		return ret;
	c->nodes = calloc(s->nnodes ? s->nnodes : 1, sizeof(*c->nodes));
	if (!c->nodes)
		return -ENOMEM;
	for (uint32_t n = 0; n < s->nnodes; n++) {
		struct kvfs_pnode *x = &c->nodes[n].pn;

		memcpy(x->key, s->key[n], 16);
		x->parent = s->parent[n] == NIL ? NULL :
						  &c->nodes[s->parent[n]].pn;
		x->depth = s->depth[n];
		x->tokens = s->tokens[n];
		x->size = 1;
		x->next_use = UINT64_MAX;
	}
	return 0;
}

static unsigned fleet_host(const struct kvfs_sim *s,
			   const struct kvfs_fleet_conf *c, size_t i)
{
	const struct sim_req *q = &s->req[i];

	if (c->route == KVFS_FLEET_AFFINITY && q->len)
		return (unsigned)(s->key[s->path[q->off]][0] % c->hosts);
	return (unsigned)(i % c->hosts);
}

struct fleet_pick {
	const struct kvfs_sim *s;
	const struct kvfs_fleet_conf *c;
	unsigned host;
};

static bool fleet_routed(size_t i, const void *arg)
{
	const struct fleet_pick *k = arg;

	return fleet_host(k->s, k->c, i) == k->host;
}

/* Fill @f->hnext: one backward pass over the trace per host, each
 * seeing only the requests routed to it.
 */
static int fleet_next(struct fleet *f, const struct kvfs_fleet_conf *c)
{
	const struct kvfs_sim *s = f->s;
	uint64_t *last;

	f->hnext = malloc((s->npath ? s->npath : 1) * sizeof(*f->hnext));
	last = malloc((s->nnodes ? s->nnodes : 1) * sizeof(*last));
	if (!f->hnext || !last) {
		free(last);
		return -ENOMEM;
	}
	for (unsigned h = 0; h < c->hosts; h++) {
		struct fleet_pick k = { .s = s, .c = c, .host = h };

		kvfs_sim_next_uses(s, f->hnext, last, fleet_routed, &k);
	}
	free(last);
	return 0;
}

/* Modeled TTFT of request @q that found @hit_tok tokens cached, of
 * which @shared_tok only in the shared tier.
 */
static void fleet_ttft(const struct fleet *f, const struct sim_req *q,
		       uint64_t hit_tok, uint64_t shared_tok,
		       struct kvfs_fleet_stats *st)
{
	const struct kvfs_sim_model *m = f->model;
	double bw = m->net_bps;

	if (m->pcie_bps > 0 && (bw <= 0 || m->pcie_bps < bw))
		bw = m->pcie_bps;
	st->ttft_s += kvfs_sim_prefill_s(m, (double)hit_tok,
					 (double)(q->tokens - hit_tok));
	if (bw > 0)
		st->ttft_s += (double)shared_tok * f->kvb / bw;
	st->ttft_nocache_s += kvfs_sim_prefill_s(m, 0, q->tokens);
}

/* One request at host cache @h (NULL: none) with shared cache @sh. */
static void fleet_request(struct fleet *f, struct fcache *h, struct fcache *sh,
			  size_t i, struct kvfs_pnode **PL,
			  struct kvfs_pnode **PS, struct kvfs_fleet_stats *st)
{
	const struct kvfs_sim *s = f->s;
	const struct sim_req *q = &s->req[i];
	const uint32_t *idx = &s->path[q->off];
	uint32_t n = q->len, hit = 0, nl = 0, ns = 0;
	uint64_t hit_tok = 0, shared_tok = 0;

	f->a.now = q->ts_ms;
	f->a.request = i + 1;
	for (uint32_t j = 0; j < n; j++) {
		if (h) {
			h->nodes[idx[j]].pin = i + 1;
			h->nodes[idx[j]].pn.next_use = f->hnext[q->off + j];
		}
		if (sh) {
			sh->nodes[idx[j]].pin = i + 1;
			sh->nodes[idx[j]].pn.next_use = s->next[q->off + j];
		}
	}
	if (h)
		h->cur = i + 1;
	if (sh)
		sh->cur = i + 1;
	for (; hit < n; hit++) {
		struct kvfs_pnode *l = h ? &h->nodes[idx[hit]].pn : NULL;
		struct kvfs_pnode *r = sh ? &sh->nodes[idx[hit]].pn : NULL;

		if (l && l->tiers) {
			PL[nl++] = l;
			st->hit_local++;
		} else if (r && r->tiers) {
			PS[ns++] = r;
			st->hit_shared++;
			shared_tok += s->tokens[idx[hit]];
		} else {
			break;
		}
		hit_tok += s->tokens[idx[hit]];
	}
	st->requests++;
	st->block_accesses += n;
	st->hit_blocks += hit;
	fleet_ttft(f, q, hit_tok, shared_tok, st);
	if (h) {
		fleet_access(f, h, PL, nl);
		/* shared hits are loaded, misses computed: all cached */
		fleet_fill(f, h, idx, 0, n);
		kvfs_policy_tick(h->p, &f->a);
		h->cur = 0;
	}
	if (sh) {
		fleet_access(f, sh, PS, ns);
		/* what the host computed is written back */
		st->shared_writes += fleet_fill(f, sh, idx, hit, n);
		kvfs_policy_tick(sh->p, &f->a);
		sh->cur = 0;
	}
}

int kvfs_sim_fleet_run(struct kvfs_sim *s, const struct kvfs_fleet_conf *c,
		       struct kvfs_fleet_stats *st)
{
	struct fleet f = { .s = s,
			   .model = &c->model,
			   .kvb = kvfs_sim_kv_bytes(&c->model) };
	struct fcache *host = NULL, shared = { 0 };
	struct kvfs_pnode **PL = NULL, **PS = NULL;
	int ret = -EINVAL;

	memset(st, 0, sizeof(*st));
	if (!c->hosts || (!c->host_cap && !c->shared_cap))
		return -EINVAL;
	ret = -ENOMEM;
	f.stack = malloc((s->nnodes ? s->nnodes : 1) * sizeof(*f.stack));
	PL = malloc((s->maxlen ? s->maxlen : 1) * sizeof(*PL));
	PS = malloc((s->maxlen ? s->maxlen : 1) * sizeof(*PS));
	if (c->host_cap)
		host = calloc(c->hosts, sizeof(*host));
	if (!f.stack || !PL || !PS || (c->host_cap && !host))
		goto out_free;
	if (host && fleet_next(&f, c))
		goto out_free;
	for (unsigned i = 0; host && i < c->hosts; i++) {
		ret = fcache_init(s, c, c->host_cap, &host[i]);
		if (ret)
			goto out_free;
	}
	if (c->shared_cap) {
		ret = fcache_init(s, c, c->shared_cap, &shared);
		if (ret)
			goto out_free;
	}
	if (host && c->sight) {
		f.sq = malloc((s->npath ? s->npath : 1) * sizeof(*f.sq));
		if (!f.sq)
			goto out_free;
	}
	for (size_t i = 0; i < s->nreq; i++) {
		unsigned h = host ? fleet_host(s, c, i) : 0;

		if (f.sq)
			fleet_sight_due(&f, c, host, s->req[i].ts_ms, st);
		fleet_request(&f, host ? &host[h] : NULL,
			      c->shared_cap ? &shared : NULL, i, PL, PS, st);
		if (f.sq)
			fleet_sight_add(&f, i, h);
	}
	ret = 0;
out_free:
	for (unsigned i = 0; host && i < c->hosts; i++)
		fcache_free(&host[i]);
	fcache_free(&shared);
	free(host);
	free(PS);
	free(PL);
	free(f.stack);
	free(f.hnext);
	free(f.sq);
	return ret;
}
