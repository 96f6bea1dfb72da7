/* SPDX-License-Identifier: MIT */
/*
 * The chunk cache's SSD batch: what memory cannot serve goes out in one
 * readv (one io_uring batch), the ranges sorted by disk offset and merged
 * where they touch, each rounded to 4 KiB for O_DIRECT, and issued layer
 * by layer. Each piece is checked against its own CRC-32C (or, for a
 * block stored without a CRC table, its whole image against the block
 * CRC), projected if stored as hidden states (chunk_hidden.c), delivered,
 * and offered to the cache (chunk_resident.c) as soon as its read
 * completes.
 *
 * A speculative load keeps at most st->spec_depth reads on the disk, and
 * one started by kvfs_chunk_speculate() asks, under st->lock, before
 * issuing each read (read_issue) whether it has been called off
 * (chunk_flight.c has the other side).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "cache/chunk_i.h"
#include "meta/log.h"
#include "meta/util.h"

/* The CRC tables of the blocks that go to the SSD, from LMDB where the
 * block does not have them yet. A block without one is read whole.
 */
static void load_crcs(struct kvfs_cache *c, struct cbw *bw, size_t nb)
{
	struct kvfs_meta_txn *t = NULL;
	int rc;

	for (size_t k = 0; k < nb; k++) {
		struct kvfs_block *b = bw[k].b;
		char hex[KVFS_KEY_HEX_LEN + 1];
		size_t n = kvfs_fmt_chunk_ncrcs(&b->ns->geom, b->n_tokens);
		uint32_t *crc;

		if (!bw[k].ssd || bw[k].crc || bw[k].err)
			continue;
		crc = n ? malloc(n * sizeof(*crc)) : NULL;
		if (!t && crc &&
		    (rc = kvfs_meta_txn_begin(c->store->meta, true, &t)))
			kvfs_warn("chunk read: cannot read chunk CRCs: %s",
				  strerror(-rc));
		rc = crc && t ? kvfs_meta_ccrc_get(t, b->pn.key, crc, n) :
				-ENOMEM;
		kvfs_chunk_key_hex(b, hex);
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
					  "extent",
					  b->ns->rec.name, hex, strerror(-rc));
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
static int check_whole(struct kvfs_cache *c, struct cbw *w, const void *img)
{
	struct kvfs_block *b = w->b;
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;
	struct ccrc_todo *td;
	size_t n = kvfs_fmt_chunk_ncrcs(&b->ns->geom, b->n_tokens);
	uint32_t *crc;

	fe = kvfs_fmt_validate(img, b->ssize, &b->ns->geom, b->pn.key,
			       b->ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED,
			       &h);
	if (fe != KVFS_FMT_OK || h.hdr_crc != b->hdr_crc) {
		kvfs_chunk_key_hex(b, hex);
		kvfs_err("ns %s: block %s.kv: SSD copy at offset %" PRIu64
			 " fails verification (%s): its chunks are not served",
			 b->ns->rec.name, hex, w->sx.off,
			 fe == KVFS_FMT_OK ?
				 "header does not match the record" :
				 kvfs_fmt_strerror(fe));
		atomic_fetch_add(&c->st_csum_errors, 1);
		return -EBADMSG;
	}
	crc = malloc(n * sizeof(*crc));
	td = crc ? kvfs_chunk_todo_new(b->pn.key, n) : NULL;
	if (!td) {
		free(crc);
		return 0;
	}
	kvfs_fmt_chunk_crcs(&b->ns->geom, b->n_tokens, b->kv_from, img, crc);
	memcpy(td->crc, crc, n * sizeof(*crc));
	pthread_mutex_lock(&b->lock);
	if (!b->ccrc) {
		b->ccrc = crc;
		crc = NULL;
	}
	pthread_mutex_unlock(&b->lock);
	free(crc);
	kvfs_chunk_todo_push(c->chunks, td);
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
static uint8_t *buf_get(struct kvfs_chunk_state *st, size_t len, bool *shared)
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
	uint64_t pos; /* scratch reads: offset in the buffer */
	uint8_t *dst; /* direct reads: where the first piece goes */
	size_t first, n; /* its pieces: rd.ord[first .. first + n) */
	uint32_t layer; /* the lowest layer among them */
	/* direct reads: a vectored read when its pieces are adjacent on
	 * disk but not in memory
	 */
	struct iovec *iov;
	unsigned iovcnt;
	bool contig; /* direct: memory adjacent so far */
	bool multi; /* direct: spans layers (then contig) */
	bool cancelled; /* never issued: its load was called off */
};

/* What the completion of each read needs. */
struct rd {
	struct kvfs_cache *c;
	struct kvfs_chunk_piece *p;
	struct cpw *pw;
	struct cbw *bw;
	struct rng *r;
	struct kvfs_tier_io *io;
	size_t *ord; /* piece indices grouped by read */
	uint8_t *buf; /* the scratch reads' buffer */
	bool shared; /* @buf is st->scratch (buf_get) */
	struct cins *ins; /* room for the pieces of one read */
	struct iovec *iov; /* the direct reads' iovecs */
	struct cprj *pj; /* projections of hidden-state pieces */
	struct cjoin *jn; /* pieces waiting for speculative loads */
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
	const struct cpw *pw = arg;
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
		if (kvfs_chunk_copy_out(dst + k, zero, sizeof(zero), d->client))
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
		struct cpw *w = &d->pw[d->ord[r->first + j]];

		if (!w->fl_own)
			continue;
		/* Requests that joined before the cancel read it now. */
		if (off)
			wake |= kvfs_chunk_flight_resolve(w->fl);
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
		struct kvfs_chunk_hook_ev ev = { .spec = d->spec,
						 .res = &io->res,
						 .buf = io->iov ? NULL :
								  io->buf,
						 .len = io->len };

		st->hook(st->hook_arg, KVFS_CHUNK_HOOK_READ, &ev);
	}
	for (size_t j = 0; j < r->n; j++) {
		size_t i = d->ord[r->first + j];
		struct kvfs_chunk_piece *p = &d->p[i];
		struct cpw *pw = &d->pw[i];
		struct cbw *w = &d->bw[pw->blk];
		bool direct = pw->direct;
		const uint8_t *src;
		char hex[KVFS_KEY_HEX_LEN + 1];
		uint32_t want, crc = 0;
		int rc;

		if (io->res) {
			if (!j)
				kvfs_err("chunk read: %" PRIu64 " bytes at "
					 "offset %" PRIu64 " of the data file: "
					 "%s",
					 r->end - r->start, r->start,
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
			want = w->crc[(size_t)p->layer *
					      kvfs_chunk_nchunks(w->b) +
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
				kvfs_chunk_key_hex(w->b, hex);
				kvfs_err(
					"ns %s: block %s.kv layer %u chunk %u: "
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
			rc = kvfs_chunk_prj_run(d->pj, w->b, p->layer, p->chunk,
						src, kv + nkv * pw->len);
			if (rc) {
				p->err = rc;
				continue;
			}
			src = kv + nkv++ * pw->len;
			direct = false;
		}
		if (!direct && p->dst &&
		    kvfs_chunk_copy_out(p->dst, src, (size_t)pw->len,
					d->client)) {
			kvfs_err("chunk read: the caller's memory vanished "
				 "while chunks were copied into it");
			p->err = -EIO;
			continue;
		}
		p->from = KVFS_CHUNK_FROM_SSD;
		pw->todo = false;
		if (d->cb)
			d->cb(d->arg, i);
		d->ins[nins++] =
			(struct cins){ .b = w->b,
				       .layer = p->layer,
				       .chunk = p->chunk,
				       .len = (uint32_t)pw->len,
				       .src = src,
				       .spec = d->spec,
				       .client = direct && d->client,
				       .crc = w->whole ? 0 : crc,
				       .checked = !w->whole && !pw->proj };
	}
	kvfs_chunk_insert(c, d->ins, nins);
	free(kv);
	/* What this read brought is in the cache now (or failed): requests
	 * waiting for it go on.
	 */
	if (d->spec)
		kvfs_chunk_flights_settle(st, d->pw, d->ord + r->first, r->n,
					  false);
	/* Between our own reads, hand over joined pieces already loaded, so
	 * that their layers are not held back until the batch ends.
	 */
	if (d->jn)
		kvfs_chunk_join_take(d->jn, false);
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
int kvfs_chunk_read_ssd(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			struct cpw *pw, size_t n, struct cbw *bw, size_t nb,
			bool spec, bool client, struct cins *ins,
			struct cprj *pj, struct cjoin *jn,
			const atomic_int *cancel, struct kvfs_chunk_result *res,
			kvfs_chunk_cb *cb, void *arg)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	struct rd d = { .c = c,
			.p = p,
			.pw = pw,
			.bw = bw,
			.ins = ins,
			.pj = pj,
			.jn = jn,
			.cancel = cancel,
			.spec = spec,
			.client = client,
			.cb = cb,
			.arg = arg };
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
				 "tier",
				 b->ino);
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
		struct cbw *w = &bw[pw[i].blk];

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
			d.r[nr++] = (struct rng){ .start = bw[k].sx.off,
						  .end = bw[k].sx.off +
							 bw[k].sx.len };
	for (size_t i = 0; i < n; i++) {
		struct cbw *w = &bw[pw[i].blk];

		if (!pw[i].ssd || pw[i].direct || w->whole)
			continue;
		d.r[nr++] = (struct rng){
			.start = pw[i].abs & ~(uint64_t)(KVFS_FMT_ALIGN - 1),
			.end = w->sx.off +
			       kvfs_util_align_up(pw[i].soff + pw[i].slen,
						  KVFS_FMT_ALIGN)
		};
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
			struct iovec *last =
				g->iovcnt ? &g->iov[g->iovcnt - 1] : NULL;
			uint8_t *dst = p[o[j]].dst;

			if (last &&
			    (uint8_t *)last->iov_base + last->iov_len == dst) {
				last->iov_len += (size_t)pw[o[j]].slen;
				continue;
			}
			g->iov[g->iovcnt++] =
				(struct iovec){ .iov_base = dst,
						.iov_len =
							(size_t)pw[o[j]].slen };
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
			d.io[i].buf = d.r[i].iovcnt ? d.r[i].iov[0].iov_base :
						      d.buf + d.r[i].pos;
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
