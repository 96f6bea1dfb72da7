/* SPDX-License-Identifier: MIT */
/*
 * The chunk cache's residency sets: which cached pieces stay, in the
 * device pool or in DRAM, and the copies that move them.
 *
 * Each set (device, DRAM) is a min-heap of its pieces ordered by
 * S = I * F, ties broken by the older use. A piece is admitted to a set
 * when the set has room or its S beats the set's lowest; a piece evicted
 * from the device set drops to DRAM if DRAM takes it at its score.
 *
 * Copies in and out of the device pool happen without st->lock: a piece
 * being read is pinned (a dead piece is freed by its last pin), a piece
 * being filled is not ready (lookups treat it as a miss).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk_i.h"
#include "meta/log.h"
#include "meta/util.h"

/* ---------------------------------------------------------------- heaps */

static bool e_less(const struct centry *a, const struct centry *b)
{
	double sa = kvfs_chunk_score_s(a->sc), sb = kvfs_chunk_score_s(b->sc);

	return sa < sb || (sa == sb && a->seq < b->seq);
}

static void heap_set(struct cheap *h, size_t i, struct centry *e)
{
	h->v[i] = e;
	e->hidx = i;
}

static void heap_up(struct cheap *h, size_t i)
{
	struct centry *e = h->v[i];

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (!e_less(e, h->v[p]))
			break;
		heap_set(h, i, h->v[p]);
		i = p;
	}
	heap_set(h, i, e);
}

static void heap_down(struct cheap *h, size_t i)
{
	struct centry *e = h->v[i];

	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct centry *best = e;

		if (l < h->n && e_less(h->v[l], best)) {
			m = l;
			best = h->v[l];
		}
		if (l + 1 < h->n && e_less(h->v[l + 1], best))
			m = l + 1;
		if (m == i)
			break;
		heap_set(h, i, h->v[m]);
		i = m;
	}
	heap_set(h, i, e);
}

static int heap_push(struct cheap *h, struct centry *e)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 256;
		struct centry **v = realloc(h->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	heap_set(h, h->n, e);
	h->n++;
	heap_up(h, h->n - 1);
	return 0;
}

static void heap_del(struct cheap *h, struct centry *e)
{
	size_t i = e->hidx;
	struct centry *m;

	h->n--;
	if (i == h->n)
		return;
	/* The last piece fills the hole and moves whichever way it must. */
	m = h->v[h->n];
	heap_set(h, i, m);
	heap_up(h, i);
	heap_down(h, m->hidx);
}

/* Restore @e's place after its score or use changed. */
static void heap_fix(struct cheap *h, struct centry *e)
{
	heap_up(h, e->hidx);
	heap_down(h, e->hidx);
}

/* Caller holds st->lock: re-place every piece of @s. */
void kvfs_chunk_rescore(struct kvfs_chunk_state *st, struct cscore *s)
{
	for (struct centry *e = s->pieces; e; e = e->snext)
		heap_fix(&st->heap[e->set], e);
}
/* -------------------------------------------------------------- entries */

void kvfs_chunk_entry_free(struct kvfs_cache *c, struct centry *e)
{
	free(e->host);
	if (e->ext.len)
		c->tier[KVFS_TIER_GPU]->ops->free(c->tier[KVFS_TIER_GPU],
						  &e->ext);
	free(e);
}

/* Caller holds st->lock. Take @e out of its set and its chunk's list; the
 * memory goes now, or with the last pin.
 */
void kvfs_chunk_entry_unlink(struct kvfs_cache *c, struct centry *e)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct centry **pp;

	if (!e->sc)
		return;
	heap_del(&st->heap[e->set], e);
	st->used[e->set] -= e->acct;
	for (pp = &e->sc->pieces; *pp && *pp != e; pp = &(*pp)->snext)
		;
	if (*pp)
		*pp = e->snext;
	e->sc = NULL;
	e->set = -1;
	if (!e->pins)
		kvfs_chunk_entry_free(c, e);
}

/* Caller holds st->lock. */
void kvfs_chunk_entry_put(struct kvfs_cache *c, struct centry *e)
{
	if (--e->pins == 0 && !e->sc)
		kvfs_chunk_entry_free(c, e);
}

/* Caller holds st->lock. A new piece in set @k, not ready; NULL on
 * ENOMEM.
 */
static struct centry *entry_new(struct kvfs_chunk_state *st, struct cscore *s,
				uint32_t layer, uint32_t len, int k,
				uint64_t acct)
{
	struct centry *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->sc = s;
	e->layer = layer;
	e->len = len;
	e->set = k;
	e->acct = acct;
	e->seq = ++st->seq;
	if (heap_push(&st->heap[k], e)) {
		free(e);
		return NULL;
	}
	st->used[k] += acct;
	e->snext = s->pieces;
	s->pieces = e;
	return e;
}

/* Caller holds st->lock. The piece of @s for @layer; with @ready only one
 * whose bytes are in place.
 */
struct centry *kvfs_chunk_piece_find(struct cscore *s, uint32_t layer,
				     bool ready)
{
	for (struct centry *e = s ? s->pieces : NULL; e; e = e->snext)
		if (e->layer == layer && (e->ready || !ready))
			return e;
	return NULL;
}

/* Caller holds st->lock. */
void kvfs_chunk_entry_touch(struct kvfs_chunk_state *st, struct centry *e)
{
	e->seq = ++st->seq;
	heap_fix(&st->heap[e->set], e);
}

/* ------------------------------------------------------------ placement */

/* A copy to run once the lock is dropped. */
struct job {
	struct centry *dst; /* pinned: the new piece */
	struct centry *src; /* pinned: demotion source (device piece) */
	struct centry *from; /* pinned: promotion source (DRAM piece) */
	const void *host; /* upload source */
	void *bounce; /* ours to free after the upload */
	bool upload;
	int rc;
};

struct jobs {
	struct job *v;
	size_t n, cap;
};

static struct job *job_add(struct jobs *j)
{
	if (j->n == j->cap) {
		size_t cap = j->cap ? j->cap * 2 : 64;
		struct job *v = realloc(j->v, cap * sizeof(*v));

		if (!v)
			return NULL;
		j->v = v;
		j->cap = cap;
	}
	memset(&j->v[j->n], 0, sizeof(j->v[0]));
	return &j->v[j->n++];
}

static uint64_t acct_of(struct kvfs_cache *c, int k, uint32_t len)
{
	if (k == CSET_GPU)
		return kvfs_util_align_up(len, c->tier[KVFS_TIER_GPU]->align);
	return len;
}

/* Caller holds st->lock. Whether set @k would take @acct bytes at score @s:
 * room now, or a lowest piece it beats.
 */
static bool set_admits(struct kvfs_chunk_state *st, int k, double s,
		       uint64_t acct)
{
	struct cheap *h = &st->heap[k];

	if (acct > st->cap[k])
		return false;
	if (st->used[k] + acct <= st->cap[k])
		return true;
	return h->n && kvfs_chunk_score_s(h->v[0]->sc) < s;
}

static bool make_room(struct kvfs_cache *c, int k, uint64_t acct, double s,
		      struct jobs *jobs);

/*
 * Caller holds st->lock. A device piece leaves the device set: down to
 * DRAM if DRAM takes it at its score (the copy runs later, as a job),
 * otherwise out of memory.
 */
static void demote(struct kvfs_cache *c, struct centry *v, struct jobs *jobs)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct cscore *s = v->sc;
	double sv = kvfs_chunk_score_s(s);
	struct centry *d = NULL;
	struct job *j;
	void *host;

	v->pins++;
	kvfs_chunk_entry_unlink(c, v);
	if (v->ready && set_admits(st, CSET_DRAM, sv, v->len) &&
	    make_room(c, CSET_DRAM, v->len, sv, jobs) &&
	    (host = malloc(v->len)) != NULL) {
		d = entry_new(st, s, v->layer, v->len, CSET_DRAM, v->len);
		if (d) {
			d->host = host;
			d->spec = v->spec;
			d->seq = v->seq;
			heap_fix(&st->heap[CSET_DRAM], d);
		} else {
			free(host);
		}
	}
	j = d ? job_add(jobs) : NULL;
	if (j) {
		d->pins++;
		j->dst = d;
		j->src = v; /* keeps the pin taken above */
		atomic_fetch_add(&st->demotions, 1);
		return;
	}
	if (d)
		kvfs_chunk_entry_unlink(c, d);
	atomic_fetch_add(&st->evictions, 1);
	kvfs_chunk_entry_put(c, v);
}

/* Caller holds st->lock. Evict set @k's lowest pieces while they score
 * below @s and @acct bytes do not fit. Whether they fit now.
 */
static bool make_room(struct kvfs_cache *c, int k, uint64_t acct, double s,
		      struct jobs *jobs)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct cheap *h = &st->heap[k];

	while (st->used[k] + acct > st->cap[k] && h->n &&
	       kvfs_chunk_score_s(h->v[0]->sc) < s) {
		struct centry *v = h->v[0];

		if (k == CSET_GPU) {
			demote(c, v, jobs);
		} else {
			kvfs_chunk_entry_unlink(c, v);
			atomic_fetch_add(&st->evictions, 1);
		}
	}
	return st->used[k] + acct <= st->cap[k];
}

/*
 * Copy @len bytes at @off of a pool extent into a piece's destination. A
 * client's memory is written only by guarded copies: from the pool's host
 * mapping where there is one, else through a bounce buffer.
 */
int kvfs_chunk_pool_out(struct kvfs_tier *gpu, const struct kvfs_extent *e,
			uint64_t off, void *dst, uint64_t len, bool client)
{
	const uint8_t *src;
	void *bounce;
	int rc;

	if (!client)
		return gpu->ops->read(gpu, e, off, dst, len);
	src = gpu->ops->map(gpu, e);
	if (src)
		return kvfs_guard_memcpy(dst, src + off, (size_t)len);
	bounce = malloc((size_t)len);
	if (!bounce)
		return -ENOMEM;
	rc = gpu->ops->read(gpu, e, off, bounce, len);
	if (!rc)
		rc = kvfs_guard_memcpy(dst, bounce, (size_t)len);
	free(bounce);
	return rc;
}

/*
 * A private, verified copy of a piece that sits in a client's memory: the
 * client may write there at any time, so what the cache keeps is copied
 * once and checked again. NULL if that memory vanished, changed, or we
 * are out of memory.
 */
static void *client_copy(const struct cins *in)
{
	void *v = malloc(in->len);

	if (!v)
		return NULL;
	if (kvfs_guard_memcpy(v, in->src, in->len) ||
	    (in->checked && kvfs_fmt_crc32c(0, v, in->len) != in->crc)) {
		kvfs_dbg("chunk cache: a piece changed in the caller's memory "
			 "before it was cached: not cached");
		free(v);
		return NULL;
	}
	return v;
}

/* Caller holds st->lock. Decide where @in goes; copies into the pool are
 * queued as jobs.
 */
static void place(struct kvfs_cache *c, const struct cins *in,
		  struct jobs *jobs)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct cscore *s;
	struct centry *e;
	struct job *j;
	uint64_t ga;
	double sv;

	if (atomic_load(&in->b->flags) & KVFS_B_DELETED)
		return; /* kvfs_chunk_forget ran or will run */
	s = kvfs_chunk_score_find(st, in->b->pn.key, in->chunk);
	if (!s)
		return;
	if (in->from) {
		/* Only a DRAM piece still live, with no other copy of its
		 * layer (one moving up already), moves up.
		 */
		if (in->from->sc != s || in->from->set != CSET_DRAM)
			return;
		for (e = s->pieces; e; e = e->snext)
			if (e != in->from && e->layer == in->layer)
				return;
	} else if (kvfs_chunk_piece_find(s, in->layer, false)) {
		return;
	}
	sv = kvfs_chunk_score_s(s);
	if (st->cap[CSET_GPU] && gpu) {
		ga = acct_of(c, CSET_GPU, in->len);
		if (set_admits(st, CSET_GPU, sv, ga) &&
		    make_room(c, CSET_GPU, ga, sv, jobs)) {
			struct kvfs_extent x;

			void *bounce = in->client ? client_copy(in) : NULL;

			if (in->client && !bounce)
				return;
			if (c->gops->alloc_owner(gpu, in->b->ns->owner,
						 in->len, &x) == 0) {
				e = entry_new(st, s, in->layer, in->len,
					      CSET_GPU, ga);
				j = e ? job_add(jobs) : NULL;
				if (j) {
					e->ext = x;
					e->spec = in->spec;
					e->pins++;
					j->dst = e;
					j->host = bounce ? bounce : in->src;
					j->bounce = bounce;
					j->upload = true;
					if (in->from) {
						in->from->pins++;
						j->from = in->from;
					}
					return;
				}
				if (e)
					kvfs_chunk_entry_unlink(c, e);
				gpu->ops->free(gpu, &x);
			}
			free(bounce);
		}
	}
	if (in->from || !st->cap[CSET_DRAM])
		return;
	if (!set_admits(st, CSET_DRAM, sv, in->len) ||
	    !make_room(c, CSET_DRAM, in->len, sv, jobs))
		return;
	e = entry_new(st, s, in->layer, in->len, CSET_DRAM, in->len);
	if (!e)
		return;
	e->host = in->client ? client_copy(in) : malloc(in->len);
	if (!e->host) {
		kvfs_chunk_entry_unlink(c, e);
		return;
	}
	if (!in->client)
		memcpy(e->host, in->src, in->len);
	e->spec = in->spec;
	e->ready = true;
	if (in->spec)
		atomic_fetch_add(&st->spec_loaded, 1);
}

/*
 * Place @n pieces, run the pool copies without the lock, then publish
 * them. Takes over the hit pin of every in[i].from.
 */
void kvfs_chunk_insert(struct kvfs_cache *c, const struct cins *in, size_t n)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct jobs jobs = { 0 };
	struct kvfs_gpu_xfer *x = NULL;
	size_t nx = 0;
	int urc = 0;

	if (!n)
		return;
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++)
		place(c, &in[i], &jobs);
	pthread_mutex_unlock(&st->lock);

	for (size_t i = 0; i < jobs.n; i++)
		nx += jobs.v[i].upload;
	if (nx) {
		x = calloc(nx, sizeof(*x));
		nx = 0;
		for (size_t i = 0; x && i < jobs.n; i++) {
			struct job *j = &jobs.v[i];

			if (!j->upload)
				continue;
			x[nx].pool = &j->dst->ext;
			x[nx].host = (void *)j->host;
			x[nx].len = j->dst->len;
			nx++;
		}
		/* One batch for every piece going up. */
		urc = x ? c->gops->upload(gpu, x, nx) : -ENOMEM;
		if (urc)
			kvfs_warn("chunk cache: copying %zu pieces into the "
				  "device pool failed (%s): not cached",
				  nx, strerror(-urc));
	}
	for (size_t i = 0; i < jobs.n; i++) {
		struct job *j = &jobs.v[i];

		if (j->upload)
			j->rc = urc;
		else
			j->rc = gpu->ops->read(gpu, &j->src->ext, 0,
					       j->dst->host, j->dst->len);
	}

	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < jobs.n; i++) {
		struct job *j = &jobs.v[i];
		struct centry *d = j->dst;

		if (!j->rc && d->sc) {
			d->ready = true;
			/* The DRAM copy of a piece that moved up goes. */
			if (j->from && j->from->sc)
				kvfs_chunk_entry_unlink(c, j->from);
			if (j->upload && d->spec)
				atomic_fetch_add(&st->spec_loaded, 1);
		} else if (d->sc) {
			kvfs_chunk_entry_unlink(c, d);
		}
		kvfs_chunk_entry_put(c, d);
		if (j->src)
			kvfs_chunk_entry_put(c, j->src);
		if (j->from)
			kvfs_chunk_entry_put(c, j->from);
	}
	for (size_t i = 0; i < n; i++)
		if (in[i].from)
			kvfs_chunk_entry_put(c, in[i].from);
	pthread_mutex_unlock(&st->lock);
	for (size_t i = 0; i < jobs.n; i++)
		free(jobs.v[i].bounce);
	free(x);
	free(jobs.v);
}

/* Caller holds st->lock. Whether either set would take a piece now. */
bool kvfs_chunk_would_cache(struct kvfs_cache *c, double s, uint32_t len)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (st->cap[CSET_GPU] && c->tier[KVFS_TIER_GPU] &&
	    set_admits(st, CSET_GPU, s, acct_of(c, CSET_GPU, len)))
		return true;
	return st->cap[CSET_DRAM] && set_admits(st, CSET_DRAM, s, len);
}

int kvfs_chunk_where(struct kvfs_cache *c, struct kvfs_block *b, uint32_t layer,
		     uint32_t chunk)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct centry *e;
	int w = KVFS_CHUNK_IN_NONE;

	if (!st || !b)
		return w;
	pthread_mutex_lock(&st->lock);
	e = kvfs_chunk_piece_find(kvfs_chunk_score_find(st, b->pn.key, chunk),
				  layer, true);
	if (e)
		w = e->set == CSET_GPU ? KVFS_CHUNK_IN_GPU : KVFS_CHUNK_IN_DRAM;
	pthread_mutex_unlock(&st->lock);
	return w;
}
