/* SPDX-License-Identifier: MIT */
/*
 * Serving chunk reads (kvfs_chunk_read, kvfs_chunk_read_cb,
 * kvfs_chunk_speculate; contracts in cache/chunk.h, the decisions behind
 * them in docs/contiguouskv.md).
 *
 * A read serves each piece from the first place that has it: the chunk
 * cache, the block's own DRAM or pool copy, else the SSD (chunk_ssd.c).
 * A request that misses the cache on a piece a speculative load is
 * reading joins that read (chunk_flight.c) instead of reading it again.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk_i.h"
#include "meta/log.h"

static int ptr_cmp(const void *a, const void *b)
{
	const struct kvfs_block *const *x = a, *const *y = b;

	return (*x > *y) - (*x < *y);
}

/* A piece a cancelled load did not read ranks below every failure. */
static int err_rank(int e)
{
	return e == -EIO       ? 5 :
	       e == -EBADMSG   ? 4 :
	       e == -ENOENT    ? 3 :
	       e == -ECANCELED ? 1 :
	       e	       ? 2 :
				 0;
}

/* Validate every piece before anything happens. */
static int check_pieces(struct kvfs_chunk_piece *p, size_t n, bool spec,
			struct cpw *pw)
{
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = p[i].b;
		char hex[KVFS_KEY_HEX_LEN + 1];

		if (!b) {
			kvfs_err("chunk read: piece %zu names no block", i);
			return -EINVAL;
		}
		kvfs_chunk_key_hex(b, hex);
		if (kvfs_fmt_chunk_range(&b->ns->geom, b->n_tokens, p[i].layer,
					 p[i].chunk, &pw[i].off, &pw[i].len) ||
		    pw[i].off + pw[i].len > b->size ||
		    kvfs_fmt_piece_range(&b->ns->geom, b->n_tokens, b->kv_from,
					 p[i].layer, p[i].chunk, &pw[i].soff,
					 &pw[i].slen) ||
		    pw[i].soff + pw[i].slen > b->ssize) {
			kvfs_warn("ns %s: block %s.kv has no layer %u chunk %u "
				  "(%u layers, %u chunks): request refused",
				  b->ns->rec.name, hex, p[i].layer, p[i].chunk,
				  b->ns->geom.n_layers, kvfs_chunk_nchunks(b));
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

/* Index of @b in the sorted distinct blocks @bw[0..nb). */
static size_t bw_find(const struct cbw *bw, size_t nb,
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

/* Serve what the chunk cache holds. Pins taken under the lock, bytes
 * copied without it. DRAM hits that may move up are queued in @ins (with
 * their pin); every other pin is dropped. With @jn (not for speculative
 * requests), a miss on a piece a speculative load is reading joins that
 * read.
 */
static void serve_cache(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			struct cpw *pw, size_t n, bool spec, bool client,
			struct cjoin *jn, struct cins *ins, size_t *nins,
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
			s = kvfs_chunk_score_find(st, p[i].b->pn.key,
						  p[i].chunk);
			if (s) {
				s->f++;
				s->dirty = true;
			}
		}
		for (size_t i = 0; i < n; i++) {
			struct cscore *s;

			if (!pw[i].todo)
				continue;
			s = kvfs_chunk_score_find(st, p[i].b->pn.key,
						  p[i].chunk);
			if (s)
				kvfs_chunk_rescore(st, s);
		}
	}
	for (size_t i = 0; i < n; i++) {
		struct cflight *fl;
		struct cscore *s;
		struct centry *e;

		if (!pw[i].todo)
			continue;
		s = kvfs_chunk_score_find(st, p[i].b->pn.key, p[i].chunk);
		e = kvfs_chunk_piece_find(s, p[i].layer, true);
		if (!e && jn && (fl = kvfs_chunk_flight_find(s, p[i].layer)) &&
		    !(pw[i].proj && kvfs_chunk_kv_image(p[i].b))) {
			pw[i].fl = fl;
			pw[i].jn = jn;
			pw[i].join = true;
			pw[i].wnext = fl->waiters;
			fl->waiters = &pw[i];
			jn->waiting++;
			continue;
		}
		if (!e || (pw[i].proj && kvfs_chunk_kv_image(p[i].b)))
			continue;
		e->pins++;
		pw[i].e = e;
		if (spec)
			continue;
		kvfs_chunk_entry_touch(st, e);
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
			rc = kvfs_chunk_copy_out(p[i].dst, e->host, e->len,
						 client);
		else if (p[i].dst)
			rc = kvfs_chunk_pool_out(gpu, &e->ext, 0, p[i].dst,
						 e->len, client);
		if (rc)
			continue; /* served from below instead */
		p[i].from = KVFS_CHUNK_FROM_CACHE;
		pw[i].todo = false;
		res->mem_hits++;
		if (!spec && e->host && st->cap[CSET_GPU] && gpu) {
			ins[(*nins)++] = (struct cins){ .b = p[i].b,
							.layer = p[i].layer,
							.chunk = p[i].chunk,
							.len = e->len,
							.src = e->host,
							.from = e };
			pw[i].e = NULL;
		}
	}
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++) {
		if (pw[i].e)
			kvfs_chunk_entry_put(c, pw[i].e);
		pw[i].e = NULL;
	}
	pthread_mutex_unlock(&st->lock);
}

/*
 * Serve what the blocks' own DRAM or pool copies hold. Pieces projected
 * from hidden states in DRAM are queued in @ins (their bytes in @kv, room
 * for @kv_cap pieces) for the chunk cache: unlike a copy, a projection costs
 * compute that the cache saves the next time. With @spec such a piece is
 * projected only if the cache would keep it.
 */
static void serve_blocks(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			 struct cpw *pw, size_t n, struct cbw *bw, size_t nb,
			 bool spec, bool client, struct cprj *pj, uint8_t *kv,
			 size_t kv_cap, struct cins *ins, size_t *nins,
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
		struct cbw *w = &bw[pw[i].blk];
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
				s = kvfs_chunk_score_find(st, p[i].b->pn.key,
							  p[i].chunk);
				keep = kvfs_chunk_would_cache(
					c, s ? kvfs_chunk_score_s(s) : 0,
					(uint32_t)pw[i].len);
				pthread_mutex_unlock(&st->lock);
				if (!keep) {
					pw[i].todo = false;
					continue;
				}
			}
			rc = kvfs_chunk_serve_split(&p[i], &pw[i], client, pj,
						    kv + nkv * pw[i].len,
						    &projected);
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
				rc = kvfs_chunk_copy_out(p[i].dst,
							 base + pw[i].off,
							 (size_t)pw[i].len,
							 client);
		} else if (w->leased) {
			if (p[i].dst)
				rc = kvfs_chunk_pool_out(gpu, &w->gx, pw[i].off,
							 p[i].dst, pw[i].len,
							 client);
		} else {
			continue;
		}
		if (rc)
			continue;
		p[i].from = KVFS_CHUNK_FROM_BLOCK;
		pw[i].todo = false;
		res->mem_hits++;
		if (projected)
			ins[(*nins)++] =
				(struct cins){ .b = p[i].b,
					       .layer = p[i].layer,
					       .chunk = p[i].chunk,
					       .len = (uint32_t)pw[i].len,
					       .src = kv + nkv++ * pw[i].len,
					       .spec = spec };
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

int kvfs_chunk_read(struct kvfs_cache *c, struct kvfs_chunk_piece *p, size_t n,
		    unsigned flags, struct kvfs_chunk_result *res)
{
	return chunk_read(c, p, n, flags, NULL, res, NULL, NULL);
}

int kvfs_chunk_read_cb(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		       size_t n, unsigned flags, struct kvfs_chunk_result *res,
		       kvfs_chunk_cb *cb, void *arg)
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
	struct cpw *pw = NULL;
	struct cbw *bw = NULL;
	struct ckey *kc = NULL;
	struct cins *ins = NULL;
	struct cprj pj = { .st = st };
	struct cjoin jn = { 0 };
	uint8_t *kv = NULL;
	size_t nb = 0, nkc = 0, nins = 0, nkv = 0, nref = 0;
	int rc, rc2, worst = 0;

	if (!res)
		res = &r0;
	memset(res, 0, sizeof(*res));
	if (flags &
	    ~(unsigned)(KVFS_CHUNK_SPECULATIVE | KVFS_CHUNK_CLIENT_DST)) {
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
		kc[nkc++] = (struct ckey){ .key = p[i].b->pn.key,
					   .chunk = p[i].chunk };
	}
	kvfs_chunk_scores_ensure(c, kc, nkc);

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
				kvfs_chunk_join_leave(&jn, &pw[i]);
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
			s = kvfs_chunk_score_find(st, p[i].b->pn.key,
						  p[i].chunk);
			if (!kvfs_chunk_would_cache(
				    c, s ? kvfs_chunk_score_s(s) : 0,
				    (uint32_t)pw[i].len) ||
			    kvfs_chunk_flight_find(s, p[i].layer)) {
				pw[i].todo = false;
				continue;
			}
			if (s && (pw[i].fl = kvfs_chunk_flight_new(
					  s, p[i].layer, cancel)))
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
	 * kvfs_chunk_read_ssd reuses the array.
	 */
	kvfs_chunk_insert(c, ins, nins);
	free(kv);
	kv = NULL;
	rc = kvfs_chunk_read_ssd(c, p, pw, n, bw, nb, spec, client, ins, &pj,
				 jn.waiting ? &jn : NULL, spec ? cancel : NULL,
				 res, cb, arg);
	for (size_t i = 0; i < n; i++)
		if (rc && pw[i].ssd && pw[i].todo && !p[i].err)
			p[i].err = rc;
	/* Every flight this load owns is resolved before it returns. */
	if (spec)
		kvfs_chunk_flights_settle(st, pw, NULL, n, true);

	/*
	 * The joins: wait for the loads still reading, then read for
	 * ourselves what they did not leave in the cache. The first batch's
	 * state is reset, so that blocks read whole then (for want of a CRC
	 * table) are checked again, or read sparsely with the table that
	 * check left.
	 */
	if (jn.waiting) {
		kvfs_chunk_join_take(&jn, true);
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
		rc2 = kvfs_chunk_read_ssd(c, p, pw, n, bw, nb, spec, client,
					  ins, &pj, NULL, NULL, res, cb, arg);
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
				kvfs_chunk_join_leave(&jn, &pw[i]);
		pthread_mutex_unlock(&st->lock);
	}
	if (spec)
		kvfs_chunk_flights_settle(st, pw, NULL, n, true);
	kvfs_chunk_prj_release(&pj);
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
