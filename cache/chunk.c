/* SPDX-License-Identifier: MIT */
/*
 * Chunk-granular reads and the attention-guided chunk cache (contracts in
 * cache/chunk.h; the decisions behind them in docs/contiguouskv.md).
 *
 * A read serves each piece from the first place that has it: the chunk
 * cache, the block's own DRAM or pool copy, else the SSD. Everything the
 * SSD must supply goes out in one readv (one io_uring batch), the ranges
 * sorted by disk offset and merged where they touch, each rounded to
 * 4 KiB for O_DIRECT. Each piece is checked against its own CRC-32C.
 *
 * Blocks stored as hidden states (kind HIDDEN, or MIXED below kv_from)
 * serve the same KV pieces: a piece's stored bytes are its chunk's
 * hidden-state rows, which are read (always through the scratch buffer),
 * checked, and projected to K and V into memory of our own before they
 * are delivered and offered to the chunk cache.
 *
 * The cache: scores live per (block key, chunk) in a hash table, cached
 * pieces per (block key, layer, chunk) hang off their chunk's score, and
 * each residency set (device, DRAM) is a min-heap of its pieces ordered by
 * S = I * F, ties broken by the older use. A piece is admitted to a set
 * when the set has room or its S beats the set's lowest.
 *
 * Decay without touching every score: I is stored multiplied by
 * scale = 2^(ticks / H). A tick grows the scale, which shrinks every real
 * I = i / scale at once and leaves the heaps' order alone (all S scale
 * alike). When the scale reaches 2^64 every stored i is divided by 2^64,
 * exactly (a power of two), so the order still holds.
 *
 * Copies in and out of the device pool and the SSD read happen without the
 * lock: a piece being read is pinned (a dead piece is freed by its last
 * pin), a piece being filled is not ready (lookups treat it as a miss).
 *
 * Joins: a piece a speculative load is reading has a flight (struct
 * cflight) on its chunk's score from the moment the load decides to read
 * it until that read has been checked and offered to the cache. A request
 * that misses the cache on such a piece puts itself on the flight's
 * waiter list instead of reading the piece again; resolving the flight
 * (read done, failed, or the block forgotten) moves each waiter onto its
 * request's ready list and wakes st->flight_cond. The request then takes
 * the piece from the cache like a hit, or reads it itself if it is not
 * there. Only speculative loads own flights and only other requests wait,
 * and a load resolves every flight it owns before it returns, so a wait
 * always ends.
 *
 * Cancels: a speculative load keeps at most st->spec_depth reads on the
 * disk, and one started by kvfs_chunk_speculate() asks, under st->lock,
 * before issuing each read (read_issue) whether it has been called off.
 * If so the read is never issued and its flights are resolved there and
 * then; if not they are marked issued. A request looks under the same
 * lock and does not join a flight that is neither issued nor of a live
 * load (flight_dead): it reads that piece with its own, without waiting.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <float.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "meta/guard.h"
#include "meta/log.h"
#include "meta/util.h"

enum { CSET_GPU = 0, CSET_DRAM = 1, CSET_N = 2 };

/* Renormalise the decay scale at 2^RENORM_EXP. */
#define RENORM_EXP 64

struct centry;
struct cflight;
struct pw;

/* The score of one chunk of one block; guarded by st->lock. */
struct cscore {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t chunk;
	double i;              /* I * st->scale */
	uint64_t f;
	bool dirty;            /* not yet in LMDB */
	uint64_t wtick;        /* st->tick_total when LMDB last matched */
	struct centry *pieces; /* cached pieces of this chunk (via snext) */
	struct cflight *flights; /* pieces of it speculative loads read */
	struct cscore *hnext;
};

/*
 * A piece a speculative load is reading from the SSD; guarded by
 * st->lock. Owned (allocated and freed) by that load's request; linked on
 * its score until resolved.
 */
struct cflight {
	struct cscore *sc;     /* NULL once resolved */
	uint32_t layer;
	struct pw *waiters;    /* requests' pieces waiting (via pw.wnext) */
	struct cflight *next;  /* in sc->flights */
	/* The load's cancel flag (kvfs_chunk_speculate), or NULL; immutable,
	 * valid while the flight is linked (the load's call).
	 */
	const atomic_int *cancel;
	bool issued;           /* its read is on the disk (read_issue) */
};

/* One cached piece; guarded by st->lock. */
struct centry {
	struct cscore *sc;     /* NULL once unlinked ("dead") */
	uint32_t layer;
	uint32_t len;          /* chunk bytes */
	int set;               /* CSET_*, -1 when dead */
	size_t hidx;           /* position in its set's heap */
	uint64_t seq;          /* last use: older goes first on a tie */
	uint64_t acct;         /* bytes charged to the set */
	void *host;            /* DRAM set: the bytes */
	struct kvfs_extent ext; /* device set: the pool extent */
	int pins;              /* copies in flight; frees wait for 0 */
	bool ready;            /* bytes in place */
	bool spec;             /* loaded speculatively, not yet used */
	struct centry *snext;
};

struct cheap {
	struct centry **v;
	size_t n, cap;
};

/* A CRC table a fallback read computed, waiting for the next flush. */
struct ccrc_todo {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t *crc;
	size_t n;
	struct ccrc_todo *next;
};

struct kvfs_chunk_state {
	pthread_mutex_t lock; /* guards everything below but the counters */
	struct cscore **sb;   /* score hash buckets */
	size_t snb, sn;
	struct cheap heap[CSET_N];
	uint64_t cap[CSET_N], used[CSET_N];
	uint64_t seq;
	unsigned halflife;    /* immutable */
	uint64_t ticks;       /* since the last renormalisation */
	uint64_t tick_total;  /* since start */
	double scale;         /* 2^(ticks / halflife) */
	struct ccrc_todo *todo;

	/* The SSD reads' buffer, kept between requests so its pages are
	 * faulted in once; a concurrent request allocates its own.
	 */
	pthread_mutex_t scratch_lock; /* guards scratch, scratch_len */
	uint8_t *scratch;
	size_t scratch_len;
	/* The restoration workspace of pieces projected from hidden
	 * states, kept like the scratch buffer; a concurrent request
	 * allocates its own.
	 */
	pthread_mutex_t ws_lock;      /* guards ws */
	struct kvfs_restore_ws *ws;

	atomic_uint_least64_t bytes_wanted, bytes_read, ssd_reads, mem_hits;
	atomic_uint_least64_t bytes_missed; /* wanted bytes the SSD served */
	atomic_uint_least64_t spec_loaded, spec_used, evictions, demotions;
	atomic_uint_least64_t prefetch_joined;
	atomic_uint_least64_t spec_cancelled; /* pieces never issued */
	unsigned spec_depth;  /* [chunks] spec_depth; immutable */

	/* Broadcast, with st->lock, whenever a flight with waiters is
	 * resolved.
	 */
	pthread_cond_t flight_cond;
	/* Tests only (kvfs_chunk_set_hook): set while no read runs. */
	kvfs_chunk_hook *hook;
	void *hook_arg;
};

/* ------------------------------------------------------------- geometry */

static uint32_t nchunks_of(const struct kvfs_block *b)
{
	uint32_t c = b->ns->geom.chunk_tokens;

	return c ? (b->n_tokens + c - 1) / c : 0;
}

size_t kvfs_chunk_ncrcs(const struct kvfs_block *b)
{
	return (size_t)b->ns->geom.n_layers * nchunks_of(b);
}

/* The table covers the stored pieces, whatever the split: hidden-state
 * rows below b->kv_from, K and V from it on. Those are the bytes the SSD
 * holds, so every piece read from it can be checked before use.
 */
void kvfs_chunk_crcs(const struct kvfs_block *b, const void *img,
		     uint32_t *out)
{
	const struct kvfs_geom *g = &b->ns->geom;
	uint32_t nc = nchunks_of(b);
	uint64_t off, len;

	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t j = 0; j < nc; j++) {
			size_t k = (size_t)l * nc + j;

			if (kvfs_fmt_piece_range(g, b->n_tokens, b->kv_from, l,
						 j, &off, &len)) {
				out[k] = 0;
				continue;
			}
			out[k] = kvfs_fmt_crc32c(0, (const uint8_t *)img + off,
						 (size_t)len);
		}
}

static void key_hex(const struct kvfs_block *b, char hex[KVFS_KEY_HEX_LEN + 1])
{
	kvfs_fmt_key_hex(b->pn.key, hex);
}

/* --------------------------------------------------------------- scores */

static size_t score_hash(const uint8_t *key, uint32_t chunk)
{
	uint64_t h;

	/* Keys are SHA-256 output: any 8 bytes are already uniform. */
	memcpy(&h, key, sizeof(h));
	return (size_t)(h ^ ((uint64_t)chunk * 0x9e3779b97f4a7c15ull));
}

/* Caller holds st->lock. */
static struct cscore *score_find(struct kvfs_chunk_state *st,
				 const uint8_t *key, uint32_t chunk)
{
	struct cscore *s;

	if (!st->snb)
		return NULL;
	s = st->sb[score_hash(key, chunk) & (st->snb - 1)];
	while (s && (s->chunk != chunk || memcmp(s->key, key, KVFS_KEY_LEN)))
		s = s->hnext;
	return s;
}

/* Caller holds st->lock. NULL on ENOMEM (the chunk then goes unscored). */
static struct cscore *score_add(struct kvfs_chunk_state *st,
				const uint8_t *key, uint32_t chunk, double i,
				uint64_t f, bool dirty)
{
	struct cscore *s;
	size_t j;

	if (st->sn + 1 > st->snb) {
		size_t nb = st->snb ? st->snb * 2 : 1024;
		struct cscore **v = calloc(nb, sizeof(*v));

		if (!v)
			return NULL;
		for (size_t b = 0; b < st->snb; b++) {
			struct cscore *x = st->sb[b], *next;

			for (; x; x = next) {
				next = x->hnext;
				j = score_hash(x->key, x->chunk) & (nb - 1);
				x->hnext = v[j];
				v[j] = x;
			}
		}
		free(st->sb);
		st->sb = v;
		st->snb = nb;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	memcpy(s->key, key, KVFS_KEY_LEN);
	s->chunk = chunk;
	s->i = i;
	s->f = f;
	s->dirty = dirty;
	s->wtick = st->tick_total;
	j = score_hash(key, chunk) & (st->snb - 1);
	s->hnext = st->sb[j];
	st->sb[j] = s;
	st->sn++;
	return s;
}

/* Caller holds st->lock; @s has no pieces left. */
static void score_remove(struct kvfs_chunk_state *st, struct cscore *s)
{
	struct cscore **pp = &st->sb[score_hash(s->key, s->chunk) &
				     (st->snb - 1)];

	while (*pp && *pp != s)
		pp = &(*pp)->hnext;
	if (*pp) {
		*pp = s->hnext;
		st->sn--;
	}
	free(s);
}

static double score_s(const struct cscore *s)
{
	return s->i * (double)s->f;
}

/* ---------------------------------------------------------------- heaps */

static bool e_less(const struct centry *a, const struct centry *b)
{
	double sa = score_s(a->sc), sb = score_s(b->sc);

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
static void score_fix(struct kvfs_chunk_state *st, struct cscore *s)
{
	for (struct centry *e = s->pieces; e; e = e->snext)
		heap_fix(&st->heap[e->set], e);
}

/* -------------------------------------------------------------- entries */

static void entry_free(struct kvfs_cache *c, struct centry *e)
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
static void entry_unlink(struct kvfs_cache *c, struct centry *e)
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
		entry_free(c, e);
}

/* Caller holds st->lock. */
static void entry_put(struct kvfs_cache *c, struct centry *e)
{
	if (--e->pins == 0 && !e->sc)
		entry_free(c, e);
}

/* Caller holds st->lock. A new piece in set @k, not ready; NULL on
 * ENOMEM.
 */
static struct centry *entry_new(struct kvfs_chunk_state *st,
				struct cscore *s, uint32_t layer, uint32_t len,
				int k, uint64_t acct)
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
static struct centry *piece_find(struct cscore *s, uint32_t layer,
				 bool ready)
{
	for (struct centry *e = s ? s->pieces : NULL; e; e = e->snext)
		if (e->layer == layer && (e->ready || !ready))
			return e;
	return NULL;
}

/* ------------------------------------------------------------ placement */

/* A copy to run once the lock is dropped. */
struct job {
	struct centry *dst;   /* pinned: the new piece */
	struct centry *src;   /* pinned: demotion source (device piece) */
	struct centry *from;  /* pinned: promotion source (DRAM piece) */
	const void *host;     /* upload source */
	void *bounce;         /* ours to free after the upload */
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
	return h->n && score_s(h->v[0]->sc) < s;
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
	double sv = score_s(s);
	struct centry *d = NULL;
	struct job *j;
	void *host;

	v->pins++;
	entry_unlink(c, v);
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
		entry_unlink(c, d);
	atomic_fetch_add(&st->evictions, 1);
	entry_put(c, v);
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
	       score_s(h->v[0]->sc) < s) {
		struct centry *v = h->v[0];

		if (k == CSET_GPU) {
			demote(c, v, jobs);
		} else {
			entry_unlink(c, v);
			atomic_fetch_add(&st->evictions, 1);
		}
	}
	return st->used[k] + acct <= st->cap[k];
}

/* A piece to place in the cache: fresh from the SSD, or a DRAM hit that
 * may move up to the device set.
 */
struct ins {
	struct kvfs_block *b;
	uint32_t layer, chunk, len;
	const void *src;
	struct centry *from; /* pinned DRAM piece (a promotion) */
	bool spec;
	/* @src is a client's memory: copied guarded, and kept only if the
	 * copy still matches @crc (the client may have written meanwhile).
	 */
	bool client;
	bool checked;        /* @crc is the piece's verified CRC */
	uint32_t crc;
};

/* Copy into a piece's destination; guarded when a client owns it. */
static int copy_out(void *dst, const void *src, size_t len, bool client)
{
	if (client)
		return kvfs_guard_memcpy(dst, src, len);
	memcpy(dst, src, len);
	return 0;
}

/*
 * Copy @len bytes at @off of a pool extent into a piece's destination. A
 * client's memory is written only by guarded copies: from the pool's host
 * mapping where there is one, else through a bounce buffer.
 */
static int pool_out(struct kvfs_tier *gpu, const struct kvfs_extent *e,
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
static void *client_copy(const struct ins *in)
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
static void place(struct kvfs_cache *c, const struct ins *in,
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
	s = score_find(st, in->b->pn.key, in->chunk);
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
	} else if (piece_find(s, in->layer, false)) {
		return;
	}
	sv = score_s(s);
	if (st->cap[CSET_GPU] && gpu) {
		ga = acct_of(c, CSET_GPU, in->len);
		if (set_admits(st, CSET_GPU, sv, ga) &&
		    make_room(c, CSET_GPU, ga, sv, jobs)) {
			struct kvfs_extent x;

			void *bounce = in->client ? client_copy(in) : NULL;

			if (in->client && !bounce)
				return;
			if (gpu->ops->alloc(gpu, in->len, &x) == 0) {
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
					entry_unlink(c, e);
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
		entry_unlink(c, e);
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
static void cache_insert(struct kvfs_cache *c, const struct ins *in, size_t n)
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
				  "device pool failed (%s): not cached", nx,
				  strerror(-urc));
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
				entry_unlink(c, j->from);
			if (j->upload && d->spec)
				atomic_fetch_add(&st->spec_loaded, 1);
		} else if (d->sc) {
			entry_unlink(c, d);
		}
		entry_put(c, d);
		if (j->src)
			entry_put(c, j->src);
		if (j->from)
			entry_put(c, j->from);
	}
	for (size_t i = 0; i < n; i++)
		if (in[i].from)
			entry_put(c, in[i].from);
	pthread_mutex_unlock(&st->lock);
	for (size_t i = 0; i < jobs.n; i++)
		free(jobs.v[i].bounce);
	free(x);
	free(jobs.v);
}

/* ---------------------------------------------------- lazy score loads */

struct kc {
	const uint8_t *key;
	uint32_t chunk;
	double i;
	uint64_t f;
	bool dirty;
};

static int kc_cmp(const void *a, const void *b)
{
	const struct kc *x = a, *y = b;
	int d = memcmp(x->key, y->key, KVFS_KEY_LEN);

	if (d)
		return d;
	return (x->chunk > y->chunk) - (x->chunk < y->chunk);
}

/*
 * Make sure each (key, chunk) of @v has its score in the table: on first
 * touch it is read from LMDB (one read-only transaction for all), or
 * starts at zero. Reorders @v.
 */
static void scores_ensure(struct kvfs_cache *c, struct kc *v, size_t n)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_meta_txn *t = NULL;
	size_t m = 0, u = 0;
	int rc;

	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++)
		if (!score_find(st, v[i].key, v[i].chunk))
			v[m++] = v[i];
	pthread_mutex_unlock(&st->lock);
	if (!m)
		return;
	qsort(v, m, sizeof(*v), kc_cmp);
	for (size_t i = 0; i < m; i++)
		if (!u || kc_cmp(&v[u - 1], &v[i]))
			v[u++] = v[i];

	rc = kvfs_meta_txn_begin(c->store->meta, true, &t);
	if (rc)
		kvfs_warn("chunk cache: reading stored scores failed (%s): "
			  "%zu chunks start from zero", strerror(-rc), u);
	for (size_t i = 0; i < u; i++) {
		v[i].i = 0;
		v[i].f = 0;
		v[i].dirty = false;
		if (!t)
			continue;
		rc = kvfs_meta_score_get(t, v[i].key, v[i].chunk, &v[i].i,
					 &v[i].f);
		if (rc && rc != -ENOENT)
			v[i].dirty = true; /* damaged (logged): rewrite it */
		if (rc) {
			v[i].i = 0;
			v[i].f = 0;
		}
	}
	kvfs_meta_txn_abort(t);

	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < u; i++)
		if (!score_find(st, v[i].key, v[i].chunk))
			score_add(st, v[i].key, v[i].chunk, v[i].i * st->scale,
				  v[i].f, v[i].dirty);
	pthread_mutex_unlock(&st->lock);
}

/* ------------------------------------------------------------ read path */

/* Per piece. */
struct pw {
	uint64_t off, len;  /* in the served (KV) block file */
	/* In the stored image: the same as off, len but for blocks stored
	 * as hidden states (or split), where layers below b->kv_from hold
	 * hidden-state rows instead of K and V.
	 */
	uint64_t soff, slen;
	uint64_t abs;       /* in the data file (SSD pieces) */
	size_t blk;         /* index into the distinct blocks */
	struct centry *e;   /* pinned cache hit */
	size_t rg;          /* SSD pieces: index of its read */
	bool todo;          /* not delivered yet */
	bool ssd;           /* read from the SSD */
	bool direct;        /* read straight into its destination */
	bool proj;          /* stored as hidden states: K and V are
			     * projected from them */
	/* A speculative load's piece: the flight its read owns (fl_own).
	 * Another request's: the flight it waits for (join), until that is
	 * resolved (then NULL). fl and wnext are guarded by st->lock while
	 * the piece is on the flight's waiter list.
	 */
	struct cflight *fl;
	struct join *jn;    /* join: its request's waits */
	struct pw *wnext;   /* join: the flight's next waiter */
	bool fl_own;
	bool join;          /* waits for a speculative load's read */
	bool refetch;       /* join: not in the cache after all, read it */
};

/*
 * A request's pieces that wait for speculative loads' reads. The request
 * owns it; flights append to @ready when they resolve.
 */
struct join {
	struct kvfs_cache *c;
	struct kvfs_chunk_piece *p;
	struct pw *pw;
	size_t *ready;        /* pieces whose flight resolved, in order;
			       * appended under st->lock */
	atomic_size_t nready; /* entries in @ready; written under st->lock */
	size_t taken;         /* of @ready, handled (the request's thread) */
	size_t waiting;       /* joins not cancelled (the request's thread,
			       * under st->lock) */
	bool client;
	struct kvfs_chunk_result *res;
	kvfs_chunk_cb *cb;
	void *arg;
};

/*
 * Caller holds st->lock. Whether @f's read will never happen: its load
 * was called off before the read was issued. That cannot change any more
 * (read_issue decides under the same lock, and a flag once set stays
 * set), and the load resolves it without reading, so nobody waits for it.
 */
static bool flight_dead(const struct cflight *f)
{
	return f->cancel && !f->issued && atomic_load(f->cancel);
}

/* Caller holds st->lock. The live flight of (@s, @layer), or NULL. */
static struct cflight *flight_find(struct cscore *s, uint32_t layer)
{
	for (struct cflight *f = s ? s->flights : NULL; f; f = f->next)
		if (f->layer == layer && !flight_dead(f))
			return f;
	return NULL;
}

/* Caller holds st->lock. A new flight on @s of a load @cancel may call
 * off; NULL on ENOMEM (nobody can join that read then).
 */
static struct cflight *flight_new(struct cscore *s, uint32_t layer,
				  const atomic_int *cancel)
{
	struct cflight *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->sc = s;
	f->layer = layer;
	f->cancel = cancel;
	f->next = s->flights;
	s->flights = f;
	return f;
}

/*
 * Caller holds st->lock. The load's read of @f is over: whatever it
 * brought is in the cache now, or never will be. Unlink it and hand each
 * waiter to its request's ready list. Idempotent. Whether anyone waited:
 * the caller then broadcasts st->flight_cond.
 */
static bool flight_resolve(struct cflight *f)
{
	struct cflight **pp;
	bool woke = f->waiters != NULL;

	if (!f->sc)
		return false;
	for (pp = &f->sc->flights; *pp && *pp != f; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = f->next;
	f->sc = NULL;
	while (f->waiters) {
		struct pw *w = f->waiters;
		struct join *j = w->jn;
		size_t k = atomic_load(&j->nready);

		f->waiters = w->wnext;
		w->wnext = NULL;
		w->fl = NULL;
		j->ready[k] = (size_t)(w - j->pw);
		atomic_store(&j->nready, k + 1);
	}
	return woke;
}

/* Caller holds st->lock. Piece @w stops waiting (a block's own copy
 * served it, or the request gives up). If its flight resolved already it
 * is on the ready list, where it is skipped.
 */
static void join_leave(struct join *j, struct pw *w)
{
	struct pw **pp;

	if (!w->fl)
		return;
	for (pp = &w->fl->waiters; *pp && *pp != w; pp = &(*pp)->wnext)
		;
	if (*pp)
		*pp = w->wnext;
	w->fl = NULL;
	w->wnext = NULL;
	j->waiting--;
}

/*
 * Resolve the flights that the pieces @idx[0..@n) (all of 0..@n with @idx
 * NULL) of a speculative load own, and with @drop free them: the load is
 * done with them.
 */
static void flights_settle(struct kvfs_chunk_state *st, struct pw *pw,
			   const size_t *idx, size_t n, bool drop)
{
	bool any = false, wake = false;

	for (size_t k = 0; k < n && !any; k++)
		any = pw[idx ? idx[k] : k].fl_own;
	if (!any)
		return;
	pthread_mutex_lock(&st->lock);
	for (size_t k = 0; k < n; k++) {
		struct pw *w = &pw[idx ? idx[k] : k];

		if (!w->fl_own)
			continue;
		wake |= flight_resolve(w->fl);
		if (drop) {
			free(w->fl);
			w->fl = NULL;
			w->fl_own = false;
		}
	}
	pthread_mutex_unlock(&st->lock);
	if (wake)
		pthread_cond_broadcast(&st->flight_cond);
}

/*
 * Deliver the joined pieces whose loads are done: from the chunk cache,
 * where the load put them verified, exactly like a hit (pinned under the
 * lock, copied without it). One that is not there (the load failed, or
 * the cache did not keep the piece) is marked for a read of its own.
 * With @wait, until every join is handled; otherwise only those ready now
 * (called between the request's own reads, without blocking).
 */
static void join_take(struct join *j, bool wait)
{
	struct kvfs_cache *c = j->c;
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];

	while (j->taken < j->waiting) {
		size_t from, to;

		if (!wait && atomic_load(&j->nready) == j->taken)
			return;
		pthread_mutex_lock(&st->lock);
		while (atomic_load(&j->nready) == j->taken &&
		       j->taken < j->waiting)
			pthread_cond_wait(&st->flight_cond, &st->lock);
		from = j->taken;
		to = atomic_load(&j->nready);
		for (size_t k = from; k < to; k++) {
			size_t i = j->ready[k];
			struct kvfs_chunk_piece *p = &j->p[i];
			struct pw *w = &j->pw[i];
			struct centry *e;

			if (!w->todo)
				continue;
			e = piece_find(score_find(st, p->b->pn.key, p->chunk),
				       p->layer, true);
			if (!e) {
				w->refetch = true;
				continue;
			}
			e->pins++;
			w->e = e;
			e->seq = ++st->seq;
			heap_fix(&st->heap[e->set], e);
			if (e->spec) {
				e->spec = false;
				p->spec = 1;
				atomic_fetch_add(&st->spec_used, 1);
			}
		}
		j->taken = to;
		pthread_mutex_unlock(&st->lock);

		for (size_t k = from; k < to; k++) {
			size_t i = j->ready[k];
			struct kvfs_chunk_piece *p = &j->p[i];
			struct pw *w = &j->pw[i];
			struct centry *e = w->e;
			int rc;

			if (!e)
				continue;
			/* host and ext never change once a piece is ready. */
			if (e->host)
				rc = copy_out(p->dst, e->host, e->len, j->client);
			else
				rc = pool_out(gpu, &e->ext, 0, p->dst, e->len,
					      j->client);
			if (rc) {
				w->refetch = true;
				continue;
			}
			p->from = KVFS_CHUNK_FROM_CACHE;
			w->todo = false;
			j->res->joined++;
			atomic_fetch_add(&st->prefetch_joined, 1);
			if (j->cb)
				j->cb(j->arg, i);
		}
		pthread_mutex_lock(&st->lock);
		for (size_t k = from; k < to; k++) {
			struct pw *w = &j->pw[j->ready[k]];

			if (w->e)
				entry_put(c, w->e);
			w->e = NULL;
		}
		pthread_mutex_unlock(&st->lock);
		if (!wait)
			return;
	}
}

/* Per distinct block. */
struct bw {
	struct kvfs_block *b;
	bool held;          /* counted in b->opens */
	bool ssd;           /* has pieces for the SSD */
	bool whole;         /* no CRC table: its whole extent is read */
	bool leased;        /* holds a lease on its pool copy */
	bool checked;       /* whole: the image passed its check */
	int err;            /* whole-image check, or why it cannot be read */
	const uint32_t *crc;
	struct kvfs_extent sx, gx;
};

static int ptr_cmp(const void *a, const void *b)
{
	const struct kvfs_block *const *x = a, *const *y = b;

	return (*x > *y) - (*x < *y);
}

/* A piece a cancelled load did not read ranks below every failure. */
static int err_rank(int e)
{
	return e == -EIO ? 5 : e == -EBADMSG ? 4 : e == -ENOENT ? 3 :
	       e == -ECANCELED ? 1 : e ? 2 : 0;
}

/* Validate every piece before anything happens. */
static int check_pieces(struct kvfs_chunk_piece *p, size_t n, bool spec,
			struct pw *pw)
{
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = p[i].b;
		char hex[KVFS_KEY_HEX_LEN + 1];

		if (!b) {
			kvfs_err("chunk read: piece %zu names no block", i);
			return -EINVAL;
		}
		key_hex(b, hex);
		if (kvfs_fmt_chunk_range(&b->ns->geom, b->n_tokens, p[i].layer,
					 p[i].chunk, &pw[i].off,
					 &pw[i].len) ||
		    pw[i].off + pw[i].len > b->size ||
		    kvfs_fmt_piece_range(&b->ns->geom, b->n_tokens, b->kv_from,
					 p[i].layer, p[i].chunk, &pw[i].soff,
					 &pw[i].slen) ||
		    pw[i].soff + pw[i].slen > b->ssize) {
			kvfs_warn("ns %s: block %s.kv has no layer %u chunk %u "
				  "(%u layers, %u chunks): request refused",
				  b->ns->rec.name, hex, p[i].layer, p[i].chunk,
				  b->ns->geom.n_layers, nchunks_of(b));
			return -EINVAL;
		}
		pw[i].proj = p[i].layer < b->kv_from;
		if (pw[i].proj && !b->ns->hc.rst) {
			/* Refused at commit; a store written with weights
			 * and opened without them gets here.
			 */
			kvfs_err("ns %s: block %s.kv layer %u is stored as "
				 "hidden states and the namespace has no "
				 "weights to project them: request refused",
				 b->ns->rec.name, hex, p[i].layer);
			return -EINVAL;
		}
		if (!spec && !p[i].dst) {
			kvfs_err("chunk read: piece %zu has no destination", i);
			return -EINVAL;
		}
		p[i].from = 0;
		p[i].spec = 0;
		p[i].err = 0;
		pw[i].todo = true;
	}
	return 0;
}

/*
 * Projection of pieces stored as hidden states: a restoration workspace,
 * taken on the first such piece of a request (the shared one when free)
 * and given back at its end.
 */
struct prj {
	struct kvfs_chunk_state *st;
	struct kvfs_restore_ws *ws;
	bool shared;        /* ws is st->ws, st->ws_lock held */
};

static void prj_release(struct prj *pj)
{
	if (pj->shared)
		pthread_mutex_unlock(&pj->st->ws_lock);
	else
		kvfs_restore_ws_free(pj->ws);
	pj->ws = NULL;
	pj->shared = false;
}

/*
 * K and V of piece (@layer, @chunk) of @b, from that chunk's hidden-state
 * rows @x, into @out (one chunk in the KV layout, padding rows zeroed):
 * the restoration of the whole block (gpu/restore.h) for those rows only,
 * at their own positions. @out is the daemon's memory, never a client's.
 * 0, -ENOMEM or -EIO (logged).
 */
static int prj_run(struct prj *pj, struct kvfs_block *b, uint32_t layer,
		   uint32_t chunk, const void *x, void *out)
{
	struct kvfs_chunk_state *st = pj->st;
	const struct kvfs_geom *g = &b->ns->geom;
	uint32_t c = g->chunk_tokens, first = chunk * c;
	uint32_t n = b->n_tokens - first < c ? b->n_tokens - first : c;
	char hex[KVFS_KEY_HEX_LEN + 1];
	int rc;

	if (!pj->ws && pthread_mutex_trylock(&st->ws_lock) == 0) {
		if (!st->ws && kvfs_restore_ws_alloc(&st->ws))
			st->ws = NULL;
		if (st->ws) {
			pj->ws = st->ws;
			pj->shared = true;
		} else {
			pthread_mutex_unlock(&st->ws_lock);
		}
	}
	if (!pj->ws && kvfs_restore_ws_alloc(&pj->ws))
		return -ENOMEM;
	rc = kvfs_restore_layer(b->ns->hc.rst, pj->ws, layer, x, g->dtype,
				b->start_pos + first, n, c, out, g->dtype);
	if (rc) {
		key_hex(b, hex);
		kvfs_err("ns %s: block %s.kv layer %u chunk %u: projecting its "
			 "hidden states failed (%s): not served",
			 b->ns->rec.name, hex, layer, chunk, strerror(-rc));
		return rc == -ENOMEM ? rc : -EIO;
	}
	return 0;
}

/* The CRC tables of the blocks that go to the SSD, from LMDB where the
 * block does not have them yet. A block without one is read whole.
 */
static void load_crcs(struct kvfs_cache *c, struct bw *bw, size_t nb)
{
	struct kvfs_meta_txn *t = NULL;
	int rc;

	for (size_t k = 0; k < nb; k++) {
		struct kvfs_block *b = bw[k].b;
		char hex[KVFS_KEY_HEX_LEN + 1];
		size_t n = kvfs_chunk_ncrcs(b);
		uint32_t *crc;

		if (!bw[k].ssd || bw[k].crc || bw[k].err)
			continue;
		crc = n ? malloc(n * sizeof(*crc)) : NULL;
		if (!t && crc &&
		    (rc = kvfs_meta_txn_begin(c->store->meta, true, &t)))
			kvfs_warn("chunk read: cannot read chunk CRCs: %s",
				  strerror(-rc));
		rc = crc && t ? kvfs_meta_ccrc_get(t, b->pn.key, crc, n)
			      : -ENOMEM;
		key_hex(b, hex);
		if (rc) {
			free(crc);
			bw[k].whole = true;
			if (rc == -ENOENT)
				kvfs_dbg("ns %s: block %s.kv has no chunk CRCs "
					 "stored: reading its whole extent and "
					 "checking the block CRC",
					 b->ns->rec.name, hex);
			else
				kvfs_warn("ns %s: block %s.kv: chunk CRCs "
					  "unusable (%s): reading its whole "
					  "extent", b->ns->rec.name, hex,
					  strerror(-rc));
			continue;
		}
		pthread_mutex_lock(&b->lock);
		if (!b->ccrc)
			b->ccrc = crc;
		else
			free(crc);
		bw[k].crc = b->ccrc;
		pthread_mutex_unlock(&b->lock);
	}
	kvfs_meta_txn_abort(t);
}

/*
 * A block read whole (no CRC table): check the image like any load from
 * the SSD, then keep its CRC table, in memory now and in LMDB at the next
 * flush, so later reads of it are sparse.
 */
static int check_whole(struct kvfs_cache *c, struct bw *w, const void *img)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_block *b = w->b;
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;
	struct ccrc_todo *td;
	size_t n = kvfs_chunk_ncrcs(b);
	uint32_t *crc;

	fe = kvfs_fmt_validate(img, b->ssize, &b->ns->geom, b->pn.key,
			       b->ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED,
			       &h);
	if (fe != KVFS_FMT_OK || h.hdr_crc != b->hdr_crc) {
		key_hex(b, hex);
		kvfs_err("ns %s: block %s.kv: SSD copy at offset %" PRIu64
			 " fails verification (%s): its chunks are not served",
			 b->ns->rec.name, hex, w->sx.off,
			 fe == KVFS_FMT_OK ? "header does not match the record"
					   : kvfs_fmt_strerror(fe));
		atomic_fetch_add(&c->st_csum_errors, 1);
		return -EBADMSG;
	}
	crc = malloc(n * sizeof(*crc));
	td = calloc(1, sizeof(*td));
	if (!crc || !td || !(td->crc = malloc(n * sizeof(*crc)))) {
		free(crc);
		free(td);
		return 0;
	}
	kvfs_chunk_crcs(b, img, crc);
	memcpy(td->crc, crc, n * sizeof(*crc));
	memcpy(td->key, b->pn.key, KVFS_KEY_LEN);
	td->n = n;
	pthread_mutex_lock(&b->lock);
	if (!b->ccrc) {
		b->ccrc = crc;
		crc = NULL;
	}
	pthread_mutex_unlock(&b->lock);
	free(crc);
	pthread_mutex_lock(&st->lock);
	td->next = st->todo;
	st->todo = td;
	pthread_mutex_unlock(&st->lock);
	return 0;
}

/* Give back an SSD read buffer: the shared scratch (@shared, as buf_get
 * said: st->scratch may be read only under its lock) is unlocked, any
 * other freed. NULL is a no-op.
 */
static void buf_release(struct kvfs_chunk_state *st, void *buf, bool shared)
{
	if (!buf)
		return;
	if (shared)
		pthread_mutex_unlock(&st->scratch_lock);
	else
		free(buf);
}

/* The shared scratch when free and large enough, else a buffer of our own;
 * 4 KiB-aligned for O_DIRECT. NULL when out of memory.
 */
static uint8_t *buf_get(struct kvfs_chunk_state *st, size_t len,
		       bool *shared)
{
	uint8_t *buf = NULL;

	*shared = false;
	if (pthread_mutex_trylock(&st->scratch_lock) == 0) {
		if (st->scratch_len < len) {
			free(st->scratch);
			st->scratch_len = 0;
			if (posix_memalign((void **)&st->scratch,
					   KVFS_FMT_ALIGN, len))
				st->scratch = NULL;
			else
				st->scratch_len = len;
		}
		if (st->scratch) {
			*shared = true;
			return st->scratch;
		}
		pthread_mutex_unlock(&st->scratch_lock);
	}
	if (posix_memalign((void **)&buf, KVFS_FMT_ALIGN, len))
		return NULL;
	return buf;
}

/*
 * One read of an SSD batch: a span of the data file and where it lands.
 * A direct read lands in its pieces' own destinations; the others land in
 * the scratch buffer at @pos and are copied out once checked.
 */
struct rng {
	uint64_t start, end;
	uint64_t pos;        /* scratch reads: offset in the buffer */
	uint8_t *dst;        /* direct reads: where the first piece goes */
	size_t first, n;     /* its pieces: rd.ord[first .. first + n) */
	uint32_t layer;      /* the lowest layer among them */
	/* direct reads: a vectored read when its pieces are adjacent on
	 * disk but not in memory
	 */
	struct iovec *iov;
	unsigned iovcnt;
	bool contig;         /* direct: memory adjacent so far */
	bool multi;          /* direct: spans layers (then contig) */
	bool cancelled;      /* never issued: its load was called off */
};

/* What the completion of each read needs. */
struct rd {
	struct kvfs_cache *c;
	struct kvfs_chunk_piece *p;
	struct pw *pw;
	struct bw *bw;
	struct rng *r;
	struct kvfs_tier_io *io;
	size_t *ord;         /* piece indices grouped by read */
	uint8_t *buf;        /* the scratch reads' buffer */
	bool shared;         /* @buf is st->scratch (buf_get) */
	struct ins *ins;     /* room for the pieces of one read */
	struct iovec *iov;   /* the direct reads' iovecs */
	struct prj *pj;      /* projections of hidden-state pieces */
	struct join *jn;     /* pieces waiting for speculative loads */
	const atomic_int *cancel; /* a speculative load's, or NULL */
	bool spec, client;
	kvfs_chunk_cb *cb;
	void *arg;
};

static int rng_cmp(const void *a, const void *b)
{
	const struct rng *x = a, *y = b;

	return (x->start > y->start) - (x->start < y->start);
}

/* Piece indices by their place in the data file. */
static int abs_cmp(const void *a, const void *b, void *arg)
{
	const struct pw *pw = arg;
	uint64_t x = pw[*(const size_t *)a].abs, y = pw[*(const size_t *)b].abs;

	return (x > y) - (x < y);
}

/* Issue order: layer by layer, each in disk order. */
static int rng_layer_cmp(const void *a, const void *b)
{
	const struct rng *x = a, *y = b;

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return rng_cmp(a, b);
}

/* A piece read in place failed: its destination must not keep torn
 * bytes that look like data.
 */
static void scrub(struct rd *d, size_t i)
{
	static const uint8_t zero[KVFS_FMT_ALIGN];
	uint8_t *dst = d->p[i].dst;

	if (!d->pw[i].direct)
		return;
	for (uint64_t k = 0; k < d->pw[i].slen; k += sizeof(zero))
		if (copy_out(dst + k, zero, sizeof(zero), d->client))
			return;
}

/*
 * ->issue of a cancellable speculative load's read: it goes to the disk
 * unless the load has been called off, and then never. Decided under
 * st->lock, where a request deciding whether to join one of its pieces
 * looks (flight_dead): it finds either a read on the disk, which it may
 * wait for, or one that will never be, which it reads itself.
 */
static int read_issue(struct kvfs_tier_io *io, void *arg)
{
	struct rd *d = arg;
	struct rng *r = &d->r[io - d->io];
	struct kvfs_chunk_state *st = d->c->chunks;
	bool off, wake = false;

	pthread_mutex_lock(&st->lock);
	off = atomic_load(d->cancel) != 0;
	for (size_t j = 0; j < r->n; j++) {
		struct pw *w = &d->pw[d->ord[r->first + j]];

		if (!w->fl_own)
			continue;
		/* Requests that joined before the cancel read it now. */
		if (off)
			wake |= flight_resolve(w->fl);
		else
			w->fl->issued = true;
	}
	pthread_mutex_unlock(&st->lock);
	if (wake)
		pthread_cond_broadcast(&st->flight_cond);
	if (!off)
		return 0;
	r->cancelled = true;
	return -ECANCELED;
}

/* A read read_issue kept off the disk: its pieces were never read. */
static void read_cancelled(struct rd *d, const struct rng *r)
{
	struct kvfs_chunk_state *st = d->c->chunks;

	for (size_t j = 0; j < r->n; j++) {
		size_t i = d->ord[r->first + j];

		d->p[i].err = -ECANCELED;
		atomic_fetch_sub(&st->bytes_missed, d->pw[i].len);
		atomic_fetch_add(&st->spec_cancelled, 1);
	}
}

/*
 * One read has finished: check each of its pieces by its CRC (or its
 * block's image by the block CRC), project the ones stored as hidden
 * states, deliver them, and offer them to the chunk cache, while the rest
 * of the batch is still on the disk.
 */
static void read_done(struct kvfs_tier_io *io, void *arg)
{
	struct rd *d = arg;
	struct kvfs_cache *c = d->c;
	const struct rng *r = &d->r[io - d->io];
	struct kvfs_chunk_state *st = c->chunks;
	uint8_t *kv = NULL;
	size_t nins = 0, nkv = 0;

	if (r->cancelled) {
		read_cancelled(d, r);
		return;
	}
	if (st->hook) {
		struct kvfs_chunk_hook_ev ev = {
			.spec = d->spec, .res = &io->res,
			.buf = io->iov ? NULL : io->buf, .len = io->len };

		st->hook(st->hook_arg, KVFS_CHUNK_HOOK_READ, &ev);
	}
	for (size_t j = 0; j < r->n; j++) {
		size_t i = d->ord[r->first + j];
		struct kvfs_chunk_piece *p = &d->p[i];
		struct pw *pw = &d->pw[i];
		struct bw *w = &d->bw[pw->blk];
		bool direct = pw->direct;
		const uint8_t *src;
		char hex[KVFS_KEY_HEX_LEN + 1];
		uint32_t want, crc = 0;
		int rc;

		if (io->res) {
			if (!j)
				kvfs_err("chunk read: %" PRIu64 " bytes at "
					 "offset %" PRIu64 " of the data file: "
					 "%s", r->end - r->start, r->start,
					 strerror(-io->res));
			p->err = -EIO;
			scrub(d, i);
			continue;
		}
		src = direct ? p->dst : d->buf + r->pos + (pw->abs - r->start);
		if (w->whole) {
			if (!w->err && !w->checked) {
				w->err = check_whole(c, w, src - pw->soff);
				w->checked = !w->err;
			}
			if (w->err) {
				p->err = w->err;
				continue;
			}
		} else {
			want = w->crc[(size_t)p->layer * nchunks_of(w->b) +
				      p->chunk];
			if (direct && d->client &&
			    kvfs_guard_crc32c(&crc, src, (size_t)pw->slen)) {
				kvfs_err("chunk read: the caller's memory "
					 "vanished while chunks were read into "
					 "it");
				p->err = -EIO;
				continue;
			}
			if (!(direct && d->client))
				crc = kvfs_fmt_crc32c(0, src, (size_t)pw->slen);
			if (crc != want) {
				key_hex(w->b, hex);
				kvfs_err("ns %s: block %s.kv layer %u chunk %u: "
					 "the SSD bytes at offset %" PRIu64
					 " fail their CRC: not served",
					 w->b->ns->rec.name, hex, p->layer,
					 p->chunk, pw->abs);
				atomic_fetch_add(&c->st_csum_errors, 1);
				p->err = -EBADMSG;
				scrub(d, i);
				continue;
			}
		}
		if (pw->proj) {
			/* Into our own memory first: the projection is not a
			 * guarded write, and what the cache keeps must not be
			 * a client's.
			 */
			if (!kv && !(kv = malloc((size_t)r->n * pw->len))) {
				p->err = -ENOMEM;
				continue;
			}
			rc = prj_run(d->pj, w->b, p->layer, p->chunk, src,
				     kv + nkv * pw->len);
			if (rc) {
				p->err = rc;
				continue;
			}
			src = kv + nkv++ * pw->len;
			direct = false;
		}
		if (!direct && p->dst &&
		    copy_out(p->dst, src, (size_t)pw->len, d->client)) {
			kvfs_err("chunk read: the caller's memory vanished "
				 "while chunks were copied into it");
			p->err = -EIO;
			continue;
		}
		p->from = KVFS_CHUNK_FROM_SSD;
		pw->todo = false;
		if (d->cb)
			d->cb(d->arg, i);
		d->ins[nins++] = (struct ins){
			.b = w->b, .layer = p->layer, .chunk = p->chunk,
			.len = (uint32_t)pw->len, .src = src, .spec = d->spec,
			.client = direct && d->client,
			.crc = w->whole ? 0 : crc,
			.checked = !w->whole && !pw->proj };
	}
	cache_insert(c, d->ins, nins);
	free(kv);
	/* What this read brought is in the cache now (or failed): requests
	 * waiting for it go on.
	 */
	if (d->spec)
		flights_settle(st, d->pw, d->ord + r->first, r->n, false);
	/* Between our own reads, hand over joined pieces already loaded, so
	 * that their layers are not held back until the batch ends.
	 */
	if (d->jn)
		join_take(d->jn, false);
}

/*
 * Read every piece still to do from the SSD, as one readv batch issued
 * layer by layer. A piece whose destination, offset and length are 4 KiB
 * multiples is read straight into its destination (no copy); such pieces
 * adjacent on disk share one read, vectored within a layer, and across
 * layers only where memory is adjacent too. The others are read into a
 * scratch buffer through merged, 4 KiB-rounded ranges and copied out once
 * checked. Each read is checked and delivered as soon as it completes;
 * after each, the pieces of @jn (may be NULL) whose loads are done are
 * delivered too. A speculative load keeps at most st->spec_depth reads on
 * the disk, and with @cancel issues none once *@cancel is set.
 */
static int read_ssd(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		    struct pw *pw, size_t n, struct bw *bw, size_t nb,
		    bool spec, bool client, struct ins *ins, struct prj *pj,
		    struct join *jn, const atomic_int *cancel,
		    struct kvfs_chunk_result *res, kvfs_chunk_cb *cb,
		    void *arg)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	struct rd d = { .c = c, .p = p, .pw = pw, .bw = bw, .ins = ins,
			.pj = pj, .jn = jn, .cancel = cancel, .spec = spec,
			.client = client, .cb = cb, .arg = arg };
	struct kvfs_extent *ex = NULL;
	size_t nr = 0, nd = 0, m, *cnt = NULL;
	uint64_t total = 0;
	int rc = 0;

	for (size_t k = 0; k < nb; k++) {
		struct kvfs_block *b = bw[k].b;

		if (!bw[k].ssd)
			continue;
		pthread_mutex_lock(&b->lock);
		bw[k].crc = b->ccrc;
		bw[k].sx = b->ssd;
		if (!(atomic_load(&b->flags) & KVFS_B_PERSISTED))
			bw[k].err = -EIO;
		pthread_mutex_unlock(&b->lock);
		if (bw[k].err)
			kvfs_err("block ino %" PRIu64 " has no copy in any "
				 "tier", b->ino);
	}
	load_crcs(c, bw, nb);

	d.r = calloc(n + nb, sizeof(*d.r));
	d.ord = calloc(n, sizeof(*d.ord));
	cnt = calloc(n + nb + 1, sizeof(*cnt));
	if (!d.r || !d.ord || !cnt) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* Direct reads first: one per piece, merged below. */
	for (size_t i = 0; i < n; i++) {
		struct bw *w = &bw[pw[i].blk];

		pw[i].direct = false;
		if (!pw[i].ssd)
			continue;
		if (w->err) {
			p[i].err = w->err;
			pw[i].ssd = false;
			continue;
		}
		pw[i].abs = w->sx.off + pw[i].soff;
		/* Hidden-state rows are projected, never delivered as
		 * read: they go through the scratch buffer.
		 */
		if (w->whole || !p[i].dst || pw[i].proj ||
		    (((uintptr_t)p[i].dst | pw[i].soff | pw[i].slen) &
		     (KVFS_FMT_ALIGN - 1)))
			continue;
		pw[i].direct = true;
		d.ord[nd++] = i;
	}
	/*
	 * A piece asked for twice cannot be read in place: one read cannot
	 * land in two places, and two reads of one span would both claim
	 * its pieces. Its copies go through the scratch buffer, where they
	 * share one read.
	 */
	qsort_r(d.ord, nd, sizeof(*d.ord), abs_cmp, pw);
	for (size_t k = 0, j; k < nd; k = j) {
		for (j = k + 1; j < nd && pw[d.ord[j]].abs == pw[d.ord[k]].abs;
		     j++)
			;
		for (size_t x = k; j - k > 1 && x < j; x++)
			pw[d.ord[x]].direct = false;
	}
	m = nd;
	nd = 0;
	for (size_t k = 0; k < m; k++) {
		size_t i = d.ord[k];

		if (!pw[i].direct)
			continue;
		d.r[nd++] = (struct rng){ .start = pw[i].abs,
					  .end = pw[i].abs + pw[i].slen,
					  .dst = p[i].dst,
					  .layer = p[i].layer,
					  .contig = true };
	}
	/*
	 * Adjacent on disk: one read. Within a layer it may be vectored
	 * (one iovec per piece at most, so at most IOV_MAX pieces a read);
	 * across layers only where memory is adjacent too, so a read never
	 * holds back an earlier layer for a later one's sake.
	 */
	qsort(d.r, nd, sizeof(*d.r), rng_cmp);
	if (nd) {
		size_t k = 0;

		d.r[0].n = 1;
		for (size_t i = 1; i < nd; i++) {
			struct rng *g = &d.r[k];
			bool flat = g->contig &&
				    d.r[i].dst == g->dst + (g->end - g->start);

			if (d.r[i].start == g->end && g->n < IOV_MAX &&
			    (flat || (!g->multi && d.r[i].layer == g->layer))) {
				g->multi |= d.r[i].layer != g->layer;
				g->contig = flat;
				g->end = d.r[i].end;
				g->n++;
			} else {
				d.r[++k] = d.r[i];
				d.r[k].n = 1;
			}
		}
		nd = k + 1;
	}
	/* Then the scratch ranges, which touching or overlapping merge. */
	nr = nd;
	for (size_t k = 0; k < nb; k++)
		if (bw[k].ssd && bw[k].whole && !bw[k].err)
			d.r[nr++] = (struct rng){
				.start = bw[k].sx.off,
				.end = bw[k].sx.off + bw[k].sx.len };
	for (size_t i = 0; i < n; i++) {
		struct bw *w = &bw[pw[i].blk];

		if (!pw[i].ssd || pw[i].direct || w->whole)
			continue;
		d.r[nr++] = (struct rng){
			.start = pw[i].abs & ~(uint64_t)(KVFS_FMT_ALIGN - 1),
			.end = w->sx.off +
			       kvfs_util_align_up(pw[i].soff + pw[i].slen,
						  KVFS_FMT_ALIGN) };
	}
	if (!nr)
		goto out_free;
	qsort(d.r + nd, nr - nd, sizeof(*d.r), rng_cmp);
	m = nd;
	for (size_t i = nd + 1; i < nr; i++) {
		if (d.r[i].start <= d.r[m].end) {
			if (d.r[i].end > d.r[m].end)
				d.r[m].end = d.r[i].end;
		} else {
			d.r[++m] = d.r[i];
		}
	}
	if (nr > nd)
		nr = m + 1;
	for (size_t i = nd; i < nr; i++) {
		d.r[i].pos = total;
		total += d.r[i].end - d.r[i].start;
	}
	/* Each piece's read: the last one starting at or before it, among
	 * its kind (both kinds are sorted by start).
	 */
	for (size_t i = 0; i < n; i++) {
		size_t lo = pw[i].direct ? 0 : nd, hi = pw[i].direct ? nd : nr;

		if (!pw[i].ssd)
			continue;
		while (hi - lo > 1) {
			size_t mid = lo + (hi - lo) / 2;

			if (d.r[mid].start <= pw[i].abs)
				lo = mid;
			else
				hi = mid;
		}
		pw[i].rg = lo;
		cnt[lo + 1]++;
	}
	for (size_t i = 0; i < nr; i++) {
		d.r[i].first = cnt[i];
		d.r[i].n = cnt[i + 1];
		cnt[i + 1] += cnt[i];
	}
	for (size_t i = 0; i < nr; i++)
		d.r[i].layer = UINT32_MAX;
	for (size_t i = 0; i < n; i++)
		if (pw[i].ssd) {
			struct rng *g = &d.r[pw[i].rg];

			d.ord[cnt[pw[i].rg]++] = i;
			if (p[i].layer < g->layer)
				g->layer = p[i].layer;
		}
	/* A direct read's pieces in disk order, as iovecs: pieces
	 * adjacent in memory too share one.
	 */
	if (nd && !(d.iov = malloc(n * sizeof(*d.iov)))) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t k = 0, v = 0; k < nd; k++) {
		struct rng *g = &d.r[k];
		size_t *o = d.ord + g->first;

		qsort_r(o, g->n, sizeof(*o), abs_cmp, pw);
		g->iov = d.iov + v;
		g->iovcnt = 0;
		for (size_t j = 0; j < g->n; j++) {
			struct iovec *last = g->iovcnt ?
					     &g->iov[g->iovcnt - 1] : NULL;
			uint8_t *dst = p[o[j]].dst;

			if (last && (uint8_t *)last->iov_base +
						last->iov_len == dst) {
				last->iov_len += (size_t)pw[o[j]].slen;
				continue;
			}
			g->iov[g->iovcnt++] = (struct iovec){
				.iov_base = dst,
				.iov_len = (size_t)pw[o[j]].slen };
		}
		v += g->iovcnt;
	}
	/* A period's early layers are wanted first (paper 004 §4.3). */
	qsort(d.r, nr, sizeof(*d.r), rng_layer_cmp);

	d.io = calloc(nr, sizeof(*d.io));
	ex = calloc(nr, sizeof(*ex));
	if (!d.io || !ex) {
		rc = -ENOMEM;
		goto out_free;
	}
	if (total && !(d.buf = buf_get(st, (size_t)total, &d.shared))) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* Every range is a span of the data file that only blocks we hold
	 * open occupy: it can be named as an extent of its own.
	 */
	for (size_t i = 0; i < nr; i++) {
		ex[i].off = d.r[i].start;
		ex[i].len = d.r[i].end - d.r[i].start;
		d.io[i].ext = &ex[i];
		d.io[i].len = ex[i].len;
		if (d.r[i].iovcnt > 1) {
			d.io[i].iov = d.r[i].iov;
			d.io[i].iovcnt = d.r[i].iovcnt;
		} else {
			d.io[i].buf = d.r[i].iovcnt ? d.r[i].iov[0].iov_base
						    : d.buf + d.r[i].pos;
		}
		d.io[i].done = read_done;
		d.io[i].arg = &d;
		/* The rest stays off the disk, where a request's reads
		 * need not queue behind it and a cancel still stops it.
		 */
		if (spec)
			d.io[i].depth = st->spec_depth;
		if (cancel)
			d.io[i].issue = read_issue;
	}
	ssd->ops->readv(ssd, d.io, nr);
	for (size_t i = 0; i < nr; i++) {
		if (d.r[i].cancelled)
			continue;
		res->ssd_reads++;
		res->bytes_read += ex[i].len;
	}
out_free:
	buf_release(st, d.buf, d.shared);
	free(d.iov);
	free(d.io);
	free(ex);
	free(d.r);
	free(d.ord);
	free(cnt);
	return rc;
}

/* Index of @b in the sorted distinct blocks @bw[0..nb). */
static size_t bw_find(const struct bw *bw, size_t nb,
		      const struct kvfs_block *b)
{
	size_t lo = 0, hi = nb;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (bw[mid].b < b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Caller holds st->lock. Whether either set would take a piece now. */
static bool would_cache(struct kvfs_cache *c, double s, uint32_t len)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (st->cap[CSET_GPU] && c->tier[KVFS_TIER_GPU] &&
	    set_admits(st, CSET_GPU, s, acct_of(c, CSET_GPU, len)))
		return true;
	return st->cap[CSET_DRAM] && set_admits(st, CSET_DRAM, s, len);
}

/*
 * Whether the DRAM copy of @b, stored as hidden states, is the KV image a
 * restoration left there. Its pieces are then the served file's bytes
 * exactly, which a cached projection need not be (docs/contiguouskv.md):
 * they are taken from the image instead.
 */
static bool kv_image(struct kvfs_block *b)
{
	const uint8_t *base;
	bool kv;

	atomic_fetch_add(&b->readers, 1);
	base = atomic_load(&b->dram_ptr);
	kv = base && kvfs_img_kind(base) == KVFS_KIND_KV;
	atomic_fetch_sub(&b->readers, 1);
	return kv;
}

/* Serve what the chunk cache holds. Pins taken under the lock, bytes
 * copied without it. DRAM hits that may move up are queued in @ins (with
 * their pin); every other pin is dropped. With @jn (not for speculative
 * requests), a miss on a piece a speculative load is reading joins that
 * read.
 */
static void serve_cache(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			struct pw *pw, size_t n, bool spec, bool client,
			struct join *jn, struct ins *ins, size_t *nins,
			struct kvfs_chunk_result *res)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];

	pthread_mutex_lock(&st->lock);
	if (!spec) {
		/* F counts every piece an engine asked for. */
		for (size_t i = 0; i < n; i++) {
			struct cscore *s;

			if (!pw[i].todo)
				continue;
			s = score_find(st, p[i].b->pn.key, p[i].chunk);
			if (s) {
				s->f++;
				s->dirty = true;
			}
		}
		for (size_t i = 0; i < n; i++) {
			struct cscore *s;

			if (!pw[i].todo)
				continue;
			s = score_find(st, p[i].b->pn.key, p[i].chunk);
			if (s)
				score_fix(st, s);
		}
	}
	for (size_t i = 0; i < n; i++) {
		struct cflight *fl;
		struct cscore *s;
		struct centry *e;

		if (!pw[i].todo)
			continue;
		s = score_find(st, p[i].b->pn.key, p[i].chunk);
		e = piece_find(s, p[i].layer, true);
		if (!e && jn && (fl = flight_find(s, p[i].layer)) &&
		    !(pw[i].proj && kv_image(p[i].b))) {
			pw[i].fl = fl;
			pw[i].jn = jn;
			pw[i].join = true;
			pw[i].wnext = fl->waiters;
			fl->waiters = &pw[i];
			jn->waiting++;
			continue;
		}
		if (!e || (pw[i].proj && kv_image(p[i].b)))
			continue;
		e->pins++;
		pw[i].e = e;
		if (spec)
			continue;
		e->seq = ++st->seq;
		heap_fix(&st->heap[e->set], e);
		if (e->spec) {
			e->spec = false;
			p[i].spec = 1;
			res->spec_hits++;
			atomic_fetch_add(&st->spec_used, 1);
		}
	}
	pthread_mutex_unlock(&st->lock);

	for (size_t i = 0; i < n; i++) {
		struct centry *e = pw[i].e;
		int rc = 0;

		if (!e)
			continue;
		/* host and ext never change once a piece is ready. */
		if (p[i].dst && e->host)
			rc = copy_out(p[i].dst, e->host, e->len, client);
		else if (p[i].dst)
			rc = pool_out(gpu, &e->ext, 0, p[i].dst, e->len,
				      client);
		if (rc)
			continue; /* served from below instead */
		p[i].from = KVFS_CHUNK_FROM_CACHE;
		pw[i].todo = false;
		res->mem_hits++;
		if (!spec && e->host && st->cap[CSET_GPU] && gpu) {
			ins[(*nins)++] = (struct ins){
				.b = p[i].b, .layer = p[i].layer,
				.chunk = p[i].chunk, .len = e->len,
				.src = e->host, .from = e };
			pw[i].e = NULL;
		}
	}
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++) {
		if (pw[i].e)
			entry_put(c, pw[i].e);
		pw[i].e = NULL;
	}
	pthread_mutex_unlock(&st->lock);
}

/*
 * Piece @i from the DRAM copy of a block stored as hidden states (or
 * split). That copy is the stored image until a restoration swaps in the
 * KV image, which frees the old one once its readers are gone: the piece
 * is taken under b->readers. From the KV image, or a stored KV layer, the
 * bytes are copied; from stored hidden-state rows they are projected,
 * into @kv (chunk bytes of our own), then copied out. 1 when there is no
 * DRAM copy, 0 when delivered (*@projected says whether @kv holds it),
 * -errno when the copy or the projection failed.
 */
static int serve_split(struct kvfs_chunk_piece *p, struct pw *pw,
		       bool client, struct prj *pj, uint8_t *kv,
		       bool *projected)
{
	struct kvfs_block *b = p->b;
	const uint8_t *base;
	int rc = 0;

	*projected = false;
	atomic_fetch_add(&b->readers, 1);
	base = atomic_load(&b->dram_ptr);
	if (!base) {
		rc = 1;
	} else if (kvfs_img_kind(base) == KVFS_KIND_KV) {
		if (p->dst)
			rc = copy_out(p->dst, base + pw->off, (size_t)pw->len,
				      client);
	} else if (!pw->proj) {
		if (p->dst)
			rc = copy_out(p->dst, base + pw->soff,
				      (size_t)pw->slen, client);
	} else {
		rc = prj_run(pj, b, p->layer, p->chunk, base + pw->soff, kv);
		*projected = !rc;
	}
	atomic_fetch_sub(&b->readers, 1);
	if (*projected && p->dst)
		rc = copy_out(p->dst, kv, (size_t)pw->len, client);
	return rc;
}

/*
 * Serve what the blocks' own DRAM or pool copies hold. Pieces projected
 * from hidden states in DRAM are queued in @ins (their bytes in @kv, room
 * for @kv_cap pieces) for the chunk cache: unlike a copy, a projection costs
 * compute that the cache saves the next time. With @spec such a piece is
 * projected only if the cache would keep it.
 */
static void serve_blocks(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			 struct pw *pw, size_t n, struct bw *bw, size_t nb,
			 bool spec, bool client, struct prj *pj, uint8_t *kv,
			 size_t kv_cap, struct ins *ins, size_t *nins,
			 struct kvfs_chunk_result *res)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	size_t nkv = 0;

	/* A lease keeps the pool copy from moving while we copy from it
	 * (gpu_unpublish refuses leased blocks); our open keeps the DRAM
	 * copy (eviction and the deferred free refuse open blocks). The
	 * pool copy is always the KV file the block serves.
	 */
	for (size_t k = 0; k < nb && gpu; k++) {
		struct kvfs_block *b = bw[k].b;

		if (!bw[k].held || atomic_load(&b->dram_ptr))
			continue;
		atomic_fetch_add(&b->leases, 1);
		pthread_mutex_lock(&b->lock);
		bw[k].gx = b->gpu;
		pthread_mutex_unlock(&b->lock);
		if (bw[k].gx.len)
			bw[k].leased = true;
		else
			atomic_fetch_sub(&b->leases, 1);
	}
	for (size_t i = 0; i < n; i++) {
		struct bw *w = &bw[pw[i].blk];
		const uint8_t *base;
		bool projected = false;
		int rc = 0;

		if (!pw[i].todo)
			continue;
		if (w->b->kv_from && atomic_load(&w->b->dram_ptr)) {
			/* @kv was sized before a load may have published
			 * this copy: without room, the SSD serves the piece.
			 */
			if (pw[i].proj && nkv == kv_cap)
				continue;
			if (spec && pw[i].proj) {
				struct cscore *s;
				bool keep;

				pthread_mutex_lock(&st->lock);
				s = score_find(st, p[i].b->pn.key, p[i].chunk);
				keep = would_cache(c, s ? score_s(s) : 0,
						   (uint32_t)pw[i].len);
				pthread_mutex_unlock(&st->lock);
				if (!keep) {
					pw[i].todo = false;
					continue;
				}
			}
			rc = serve_split(&p[i], &pw[i], client, pj,
					 kv + nkv * pw[i].len, &projected);
			if (rc < 0 && pw[i].proj && !projected) {
				/* Projection failed: no other copy helps. */
				p[i].err = rc;
				pw[i].todo = false;
				continue;
			}
			if (rc)
				continue;
		} else if ((base = atomic_load(&w->b->dram_ptr)) != NULL) {
			if (p[i].dst)
				rc = copy_out(p[i].dst, base + pw[i].off,
					      (size_t)pw[i].len, client);
		} else if (w->leased) {
			if (p[i].dst)
				rc = pool_out(gpu, &w->gx, pw[i].off, p[i].dst,
					      pw[i].len, client);
		} else {
			continue;
		}
		if (rc)
			continue;
		p[i].from = KVFS_CHUNK_FROM_BLOCK;
		pw[i].todo = false;
		res->mem_hits++;
		if (projected)
			ins[(*nins)++] = (struct ins){
				.b = p[i].b, .layer = p[i].layer,
				.chunk = p[i].chunk, .len = (uint32_t)pw[i].len,
				.src = kv + nkv++ * pw[i].len, .spec = spec };
	}
	for (size_t k = 0; k < nb; k++)
		if (bw[k].leased) {
			atomic_fetch_sub(&bw[k].b->leases, 1);
			bw[k].leased = false;
		}
}

static int chunk_read(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		      size_t n, unsigned flags, const atomic_int *cancel,
		      struct kvfs_chunk_result *res, kvfs_chunk_cb *cb,
		      void *arg);

int kvfs_chunk_read(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		    size_t n, unsigned flags, struct kvfs_chunk_result *res)
{
	return chunk_read(c, p, n, flags, NULL, res, NULL, NULL);
}

int kvfs_chunk_read_cb(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		       size_t n, unsigned flags,
		       struct kvfs_chunk_result *res, kvfs_chunk_cb *cb,
		       void *arg)
{
	return chunk_read(c, p, n, flags, NULL, res, cb, arg);
}

int kvfs_chunk_speculate(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			 size_t n, const atomic_int *cancel,
			 struct kvfs_chunk_result *res)
{
	return chunk_read(c, p, n, KVFS_CHUNK_SPECULATIVE, cancel, res, NULL,
			  NULL);
}

static int chunk_read(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		      size_t n, unsigned flags, const atomic_int *cancel,
		      struct kvfs_chunk_result *res, kvfs_chunk_cb *cb,
		      void *arg)
{
	struct kvfs_chunk_state *st = c->chunks;
	bool spec = flags & KVFS_CHUNK_SPECULATIVE;
	bool client = flags & KVFS_CHUNK_CLIENT_DST;
	struct kvfs_chunk_result r0;
	struct kvfs_block **bs = NULL;
	struct pw *pw = NULL;
	struct bw *bw = NULL;
	struct kc *kc = NULL;
	struct ins *ins = NULL;
	struct prj pj = { .st = st };
	struct join jn = { 0 };
	uint8_t *kv = NULL;
	size_t nb = 0, nkc = 0, nins = 0, nkv = 0, nref = 0;
	int rc, rc2, worst = 0;

	if (!res)
		res = &r0;
	memset(res, 0, sizeof(*res));
	if (flags & ~(unsigned)(KVFS_CHUNK_SPECULATIVE |
				KVFS_CHUNK_CLIENT_DST)) {
		kvfs_err("chunk read: unknown flags %#x", flags);
		return -EINVAL;
	}
	if (!st) {
		kvfs_err("chunk read: the chunk cache is not set up");
		return -EINVAL;
	}
	if (!n)
		return 0;
	if (!p) {
		kvfs_err("chunk read: %zu pieces and no array", n);
		return -EINVAL;
	}
	pw = calloc(n, sizeof(*pw));
	bs = malloc(n * sizeof(*bs));
	bw = calloc(n, sizeof(*bw));
	kc = calloc(n, sizeof(*kc));
	ins = calloc(n, sizeof(*ins));
	jn.ready = spec ? NULL : calloc(n, sizeof(*jn.ready));
	if (!pw || !bs || !bw || !kc || !ins || (!spec && !jn.ready)) {
		rc = -ENOMEM;
		goto out_free;
	}
	jn.c = c;
	jn.p = p;
	jn.pw = pw;
	jn.client = client;
	jn.res = res;
	jn.cb = cb;
	jn.arg = arg;
	rc = check_pieces(p, n, spec, pw);
	if (rc)
		goto out_free;

	/* Each distinct block is held open for the call, so neither its
	 * SSD extent nor its DRAM copy can go while we read them.
	 */
	for (size_t i = 0; i < n; i++)
		bs[i] = p[i].b;
	qsort(bs, n, sizeof(*bs), ptr_cmp);
	for (size_t i = 0; i < n; i++)
		if (!nb || bs[i] != bw[nb - 1].b)
			bw[nb++].b = bs[i];
	for (size_t k = 0; k < nb; k++) {
		struct kvfs_block *b = bw[k].b;

		/* The same order as kvfs_cache_reader_init(). */
		atomic_fetch_add(&b->opens, 1);
		if (atomic_load(&b->flags) & KVFS_B_DELETED) {
			atomic_fetch_sub(&b->opens, 1);
			kvfs_block_try_free(c, b);
			bw[k].err = -ENOENT;
			continue;
		}
		bw[k].held = true;
		if (!spec)
			kvfs_cache_touch(c, b);
	}
	for (size_t i = 0; i < n; i++) {
		pw[i].blk = bw_find(bw, nb, p[i].b);
		res->bytes_wanted += pw[i].len;
		if (bw[pw[i].blk].err) {
			p[i].err = bw[pw[i].blk].err;
			pw[i].todo = false;
			continue;
		}
		kc[nkc++] = (struct kc){ .key = p[i].b->pn.key,
					 .chunk = p[i].chunk };
	}
	scores_ensure(c, kc, nkc);

	serve_cache(c, p, pw, n, spec, client, spec ? NULL : &jn, ins, &nins,
		    res);
	/* Room for the pieces a DRAM copy of hidden states may project. */
	for (size_t i = 0; i < n; i++)
		nkv += pw[i].todo && pw[i].proj &&
		       atomic_load(&p[i].b->dram_ptr);
	if (nkv && !(kv = malloc(nkv * (size_t)pw[0].len))) {
		rc = -ENOMEM;
		goto out_close;
	}
	serve_blocks(c, p, pw, n, bw, nb, spec, client, &pj, kv, nkv, ins,
		     &nins, res);
	if (jn.waiting) {
		/* Joined pieces a block's own copy served wait no more. */
		pthread_mutex_lock(&st->lock);
		for (size_t i = 0; i < n; i++)
			if (pw[i].join && !pw[i].todo)
				join_leave(&jn, &pw[i]);
		pthread_mutex_unlock(&st->lock);
	}
	for (size_t i = 0; i < n && cb; i++)
		if (p[i].from)
			cb(arg, i);

	/* A speculative piece is worth a read only if it would be kept, and
	 * only one load reads it; the requests that need it meanwhile wait
	 * for that read (its flight).
	 */
	if (spec) {
		pthread_mutex_lock(&st->lock);
		for (size_t i = 0; i < n; i++) {
			struct cscore *s;

			if (!pw[i].todo)
				continue;
			s = score_find(st, p[i].b->pn.key, p[i].chunk);
			if (!would_cache(c, s ? score_s(s) : 0,
					 (uint32_t)pw[i].len) ||
			    flight_find(s, p[i].layer)) {
				pw[i].todo = false;
				continue;
			}
			if (s && (pw[i].fl = flight_new(s, p[i].layer,
							 cancel)))
				pw[i].fl_own = true;
		}
		pthread_mutex_unlock(&st->lock);
	}
	for (size_t i = 0; i < n; i++)
		if (pw[i].todo && !pw[i].join) {
			pw[i].ssd = true;
			bw[pw[i].blk].ssd = true;
			atomic_fetch_add(&st->bytes_missed, pw[i].len);
		}
	if (jn.waiting && st->hook) {
		struct kvfs_chunk_hook_ev ev = { .joined = jn.waiting };

		st->hook(st->hook_arg, KVFS_CHUNK_HOOK_JOIN, &ev);
	}
	/* serve_cache's promotions and serve_blocks' projections first:
	 * read_ssd reuses the array.
	 */
	cache_insert(c, ins, nins);
	free(kv);
	kv = NULL;
	rc = read_ssd(c, p, pw, n, bw, nb, spec, client, ins, &pj,
		      jn.waiting ? &jn : NULL, spec ? cancel : NULL, res, cb,
		      arg);
	for (size_t i = 0; i < n; i++)
		if (rc && pw[i].ssd && pw[i].todo && !p[i].err)
			p[i].err = rc;
	/* Every flight this load owns is resolved before it returns. */
	if (spec)
		flights_settle(st, pw, NULL, n, true);

	/*
	 * The joins: wait for the loads still reading, then read for
	 * ourselves what they did not leave in the cache. The first batch's
	 * state is reset, so that blocks read whole then (for want of a CRC
	 * table) are checked again, or read sparsely with the table that
	 * check left.
	 */
	if (jn.waiting) {
		join_take(&jn, true);
		for (size_t k = 0; k < nb; k++) {
			bw[k].ssd = false;
			bw[k].whole = false;
			bw[k].checked = false;
		}
		for (size_t i = 0; i < n; i++) {
			pw[i].ssd = pw[i].refetch && pw[i].todo;
			if (!pw[i].ssd)
				continue;
			bw[pw[i].blk].ssd = true;
			atomic_fetch_add(&st->bytes_missed, pw[i].len);
			nref++;
		}
	}
	if (nref) {
		rc2 = read_ssd(c, p, pw, n, bw, nb, spec, client, ins, &pj,
			       NULL, NULL, res, cb, arg);
		for (size_t i = 0; i < n; i++)
			if (rc2 && pw[i].ssd && pw[i].todo && !p[i].err)
				p[i].err = rc2;
		if (!rc)
			rc = rc2;
	}

	for (size_t i = 0; i < n; i++)
		if (err_rank(p[i].err) > err_rank(worst))
			worst = p[i].err;
	if (!rc)
		rc = worst;
	atomic_fetch_add(&st->bytes_wanted, res->bytes_wanted);
	atomic_fetch_add(&st->bytes_read, res->bytes_read);
	atomic_fetch_add(&st->ssd_reads, res->ssd_reads);
	atomic_fetch_add(&st->mem_hits, res->mem_hits);
out_close:
	/* Every path out leaves no wait and no flight behind. */
	if (jn.waiting) {
		pthread_mutex_lock(&st->lock);
		for (size_t i = 0; i < n; i++)
			if (pw[i].join)
				join_leave(&jn, &pw[i]);
		pthread_mutex_unlock(&st->lock);
	}
	if (spec)
		flights_settle(st, pw, NULL, n, true);
	prj_release(&pj);
	free(kv);
	for (size_t k = 0; k < nb; k++) {
		if (!bw[k].held)
			continue;
		atomic_fetch_sub(&bw[k].b->opens, 1);
		kvfs_block_try_free(c, bw[k].b);
	}
out_free:
	free(pw);
	free(bs);
	free(bw);
	free(kc);
	free(ins);
	free(jn.ready);
	return rc;
}

/* ------------------------------------------------------- scores (API) */

int kvfs_chunk_score(struct kvfs_cache *c, struct kvfs_block *b,
		     uint32_t chunk, double a)
{
	struct kvfs_chunk_state *st = c->chunks;
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kc one;
	struct cscore *s;

	if (!st || !b)
		return -EINVAL;
	key_hex(b, hex);
	if (chunk >= nchunks_of(b)) {
		kvfs_warn("ns %s: block %s.kv has no chunk %u (%u chunks): "
			  "score refused", b->ns->rec.name, hex, chunk,
			  nchunks_of(b));
		return -EINVAL;
	}
	if (!isfinite(a) || a < 0) {
		kvfs_warn("ns %s: block %s.kv chunk %u: score %g refused "
			  "(finite, >= 0)", b->ns->rec.name, hex, chunk, a);
		return -EINVAL;
	}
	one = (struct kc){ .key = b->pn.key, .chunk = chunk };
	scores_ensure(c, &one, 1);
	pthread_mutex_lock(&st->lock);
	s = score_find(st, b->pn.key, chunk);
	if (!s) {
		pthread_mutex_unlock(&st->lock);
		return -ENOMEM;
	}
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		/* kvfs_chunk_forget may have run already: no new score. */
		if (!s->pieces && !s->flights)
			score_remove(st, s);
		pthread_mutex_unlock(&st->lock);
		return 0;
	}
	s->i += a * st->scale;
	if (!isfinite(s->i))
		s->i = DBL_MAX;
	s->dirty = true;
	score_fix(st, s);
	pthread_mutex_unlock(&st->lock);
	return 0;
}

void kvfs_chunk_tick(struct kvfs_cache *c)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (!st || !st->halflife)
		return;
	pthread_mutex_lock(&st->lock);
	st->tick_total++;
	if (++st->ticks >= (uint64_t)RENORM_EXP * st->halflife) {
		/* Dividing every i by the same power of two is exact, so the
		 * heaps stay ordered.
		 */
		for (size_t k = 0; k < st->snb; k++)
			for (struct cscore *s = st->sb[k]; s; s = s->hnext)
				s->i = ldexp(s->i, -RENORM_EXP);
		st->ticks -= (uint64_t)RENORM_EXP * st->halflife;
	}
	st->scale = exp2((double)st->ticks / st->halflife);
	pthread_mutex_unlock(&st->lock);
}

int kvfs_chunk_get_score(struct kvfs_cache *c, struct kvfs_block *b,
			 uint32_t chunk, double *i, uint64_t *f, double *s)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_meta_txn *t;
	struct cscore *x;
	double vi = 0;
	uint64_t vf = 0;
	int rc;

	if (!st || !b || chunk >= nchunks_of(b))
		return -EINVAL;
	pthread_mutex_lock(&st->lock);
	x = score_find(st, b->pn.key, chunk);
	if (x) {
		vi = x->i / st->scale;
		vf = x->f;
	}
	pthread_mutex_unlock(&st->lock);
	if (!x) {
		rc = kvfs_meta_txn_begin(c->store->meta, true, &t);
		if (rc)
			return rc;
		rc = kvfs_meta_score_get(t, b->pn.key, chunk, &vi, &vf);
		kvfs_meta_txn_abort(t);
		if (rc)
			return rc;
	}
	if (i)
		*i = vi;
	if (f)
		*f = vf;
	if (s)
		*s = vi * (double)vf;
	return 0;
}

int kvfs_chunk_where(struct kvfs_cache *c, struct kvfs_block *b,
		     uint32_t layer, uint32_t chunk)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct centry *e;
	int w = KVFS_CHUNK_IN_NONE;

	if (!st || !b)
		return w;
	pthread_mutex_lock(&st->lock);
	e = piece_find(score_find(st, b->pn.key, chunk), layer, true);
	if (e)
		w = e->set == CSET_GPU ? KVFS_CHUNK_IN_GPU : KVFS_CHUNK_IN_DRAM;
	pthread_mutex_unlock(&st->lock);
	return w;
}

/* ---------------------------------------------------------------- flush */

enum frec_state {
	FR_UNWRITTEN = 0, /* the block has no record (yet, or any more) */
	FR_WRITTEN,
	FR_GONE,          /* ... and it is not in the index: deleted */
};

struct frec {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t chunk;
	double i;
	uint64_t f;
	int state;        /* enum frec_state */
};

static void todo_free(struct ccrc_todo *td)
{
	while (td) {
		struct ccrc_todo *next = td->next;

		free(td->crc);
		free(td);
		td = next;
	}
}

/*
 * Settle the scores a flush did not write. If the transaction failed, all
 * are dirty again. A score whose block has no record stays dirty while
 * the block is indexed (its write-back is still to come) and is dropped
 * when the block is gone. Index lookups take shard locks, so they happen
 * before st->lock.
 */
static void flush_settle(struct kvfs_cache *c, struct frec *v, size_t n,
			 bool failed)
{
	struct kvfs_chunk_state *st = c->chunks;

	for (size_t k = 0; k < n && !failed; k++) {
		struct kvfs_block *b;

		if (v[k].state != FR_UNWRITTEN)
			continue;
		b = kvfs_index_find_key(c, v[k].key);
		if (!b)
			v[k].state = FR_GONE;
		kvfs_cache_put(c, b);
	}
	pthread_mutex_lock(&st->lock);
	for (size_t k = 0; k < n; k++) {
		struct cscore *s = score_find(st, v[k].key, v[k].chunk);

		if (!s)
			continue;
		if (failed || v[k].state == FR_UNWRITTEN)
			s->dirty = true;
		else if (v[k].state == FR_GONE && !s->dirty && !s->pieces &&
			 !s->flights)
			score_remove(st, s);
	}
	pthread_mutex_unlock(&st->lock);
}

/*
 * Caller holds st->lock. A score is written when it changed, and, with
 * decay on, once per half-life even if it did not: the stored I is then
 * never more than twice the decayed one, at one write per score per
 * half-life.
 */
static bool flush_due(const struct kvfs_chunk_state *st,
		      const struct cscore *s)
{
	return s->dirty ||
	       (st->halflife && st->tick_total - s->wtick >= st->halflife);
}

int kvfs_chunk_flush(struct kvfs_cache *c)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_meta_txn *t = NULL;
	struct ccrc_todo *td;
	struct frec *v = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;

	if (!st)
		return 0;
	pthread_mutex_lock(&c->meta_lock);
	pthread_mutex_lock(&st->lock);
	for (size_t k = 0; k < st->snb; k++)
		for (struct cscore *s = st->sb[k]; s; s = s->hnext)
			cap += flush_due(st, s);
	v = cap ? calloc(cap, sizeof(*v)) : NULL;
	for (size_t k = 0; v && k < st->snb; k++)
		for (struct cscore *s = st->sb[k]; s; s = s->hnext) {
			if (!flush_due(st, s))
				continue;
			memcpy(v[n].key, s->key, KVFS_KEY_LEN);
			v[n].chunk = s->chunk;
			v[n].i = s->i / st->scale;
			v[n].f = s->f;
			s->dirty = false;
			s->wtick = st->tick_total;
			n++;
		}
	td = st->todo;
	st->todo = NULL;
	pthread_mutex_unlock(&st->lock);
	if (cap && !v) {
		pthread_mutex_unlock(&c->meta_lock);
		if (td) {
			struct ccrc_todo *x = td;

			pthread_mutex_lock(&st->lock);
			while (x->next)
				x = x->next;
			x->next = st->todo;
			st->todo = td;
			pthread_mutex_unlock(&st->lock);
		}
		return -ENOMEM;
	}
	if (!n && !td) {
		pthread_mutex_unlock(&c->meta_lock);
		return 0;
	}
	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	for (size_t k = 0; k < n && !rc; k++) {
		struct kvfs_meta_blk r;

		/* A block deleted meanwhile lost its scores in the delete's
		 * transaction: never write them back.
		 */
		if (kvfs_meta_blk_get(t, v[k].key, &r))
			continue;
		rc = kvfs_meta_score_put(t, v[k].key, v[k].chunk, v[k].i,
					 v[k].f);
		if (!rc)
			v[k].state = FR_WRITTEN;
	}
	for (struct ccrc_todo *x = td; x && !rc; x = x->next) {
		struct kvfs_meta_blk r;

		if (!kvfs_meta_blk_get(t, x->key, &r))
			rc = kvfs_meta_ccrc_put(t, x->key, x->crc, x->n);
	}
	if (rc)
		kvfs_meta_txn_abort(t);
	else
		rc = kvfs_meta_txn_commit(t);
	pthread_mutex_unlock(&c->meta_lock);
	if (rc)
		kvfs_warn("recording %zu chunk scores failed: %s", n,
			  strerror(-rc));
	flush_settle(c, v, n, rc != 0);
	todo_free(td);
	free(v);
	return rc;
}

/* ------------------------------------------------------------ lifecycle */

int kvfs_chunk_init(struct kvfs_cache *c)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_chunk_state *st;
	char b1[32], b2[32];

	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_init(&st->scratch_lock, NULL);
	pthread_mutex_init(&st->ws_lock, NULL);
	pthread_cond_init(&st->flight_cond, NULL);
	st->cap[CSET_DRAM] = c->conf.chunk_dram;
	st->cap[CSET_GPU] = gpu && c->gops ? c->conf.chunk_gpu : 0;
	if (c->conf.chunk_gpu && !st->cap[CSET_GPU])
		kvfs_warn("[chunks] gpu_capacity is set but there is no "
			  "device tier ([tier.gpu] backend): chunks are "
			  "cached in DRAM only");
	if (gpu && st->cap[CSET_GPU] > gpu->capacity)
		kvfs_warn("[chunks] gpu_capacity exceeds the device pool; "
			  "the pool's free room limits it");
	st->halflife = c->conf.score_halflife;
	st->spec_depth = c->conf.chunk_spec_depth;
	st->scale = 1;
	c->chunks = st;
	kvfs_info("chunk cache: %s in DRAM, %s in the device pool, scores %s",
		  kvfs_util_fmt_size(st->cap[CSET_DRAM], b1, sizeof(b1)),
		  kvfs_util_fmt_size(st->cap[CSET_GPU], b2, sizeof(b2)),
		  st->halflife ? "decay" : "never decay");
	if (kvfs_block_on_delete(c, kvfs_chunk_forget))
		return -ENOSPC;
	return kvfs_task_add(c, "chunk-score flush", kvfs_chunk_flush);
}

void kvfs_chunk_release(struct kvfs_cache *c)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (!st)
		return;
	for (size_t k = 0; k < st->snb; k++) {
		struct cscore *s = st->sb[k], *next;

		for (; s; s = next) {
			next = s->hnext;
			while (s->pieces) {
				struct centry *e = s->pieces;

				s->pieces = e->snext;
				entry_free(c, e);
			}
			free(s);
		}
	}
	free(st->sb);
	for (int k = 0; k < CSET_N; k++)
		free(st->heap[k].v);
	todo_free(st->todo);
	pthread_mutex_destroy(&st->lock);
	pthread_mutex_destroy(&st->scratch_lock);
	pthread_mutex_destroy(&st->ws_lock);
	pthread_cond_destroy(&st->flight_cond);
	kvfs_restore_ws_free(st->ws);
	free(st->scratch);
	free(st);
	c->chunks = NULL;
}

void kvfs_chunk_forget(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_chunk_state *st = c->chunks;
	bool wake = false;
	uint32_t nc;

	if (!st || !b)
		return;
	nc = nchunks_of(b);
	pthread_mutex_lock(&st->lock);
	for (uint32_t j = 0; j < nc; j++) {
		struct cscore *s = score_find(st, b->pn.key, j);

		if (!s)
			continue;
		while (s->pieces)
			entry_unlink(c, s->pieces);
		/* Loads still reading its pieces will not cache them (the
		 * block is deleted): their waiters read for themselves.
		 */
		while (s->flights)
			wake |= flight_resolve(s->flights);
		score_remove(st, s);
	}
	if (wake)
		pthread_cond_broadcast(&st->flight_cond);
	for (struct ccrc_todo **pp = &st->todo; *pp;) {
		struct ccrc_todo *x = *pp;

		if (memcmp(x->key, b->pn.key, KVFS_KEY_LEN)) {
			pp = &x->next;
			continue;
		}
		*pp = x->next;
		free(x->crc);
		free(x);
	}
	pthread_mutex_unlock(&st->lock);
}

void kvfs_chunk_get_stats(struct kvfs_cache *c, struct kvfs_chunk_stats *o)
{
	struct kvfs_chunk_state *st = c->chunks;

	memset(o, 0, sizeof(*o));
	if (!st)
		return;
	pthread_mutex_lock(&st->lock);
	o->dram_used = st->used[CSET_DRAM];
	o->dram_capacity = st->cap[CSET_DRAM];
	o->dram_pieces = st->heap[CSET_DRAM].n;
	o->gpu_used = st->used[CSET_GPU];
	o->gpu_capacity = st->cap[CSET_GPU];
	o->gpu_pieces = st->heap[CSET_GPU].n;
	pthread_mutex_unlock(&st->lock);
	o->bytes_wanted = atomic_load(&st->bytes_wanted);
	o->bytes_missed = atomic_load(&st->bytes_missed);
	o->bytes_read = atomic_load(&st->bytes_read);
	o->ssd_reads = atomic_load(&st->ssd_reads);
	o->mem_hits = atomic_load(&st->mem_hits);
	o->spec_loaded = atomic_load(&st->spec_loaded);
	o->spec_used = atomic_load(&st->spec_used);
	o->evictions = atomic_load(&st->evictions);
	o->demotions = atomic_load(&st->demotions);
	o->prefetch_joined = atomic_load(&st->prefetch_joined);
	o->spec_cancelled = atomic_load(&st->spec_cancelled);
}

void kvfs_chunk_set_hook(struct kvfs_cache *c, kvfs_chunk_hook *fn,
			 void *arg)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (!st)
		return;
	st->hook = fn;
	st->hook_arg = arg;
}
