/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration in the engine (HCache, paper 003;
 * docs/hcache.md): each namespace's checkpoint, the start-up profile and
 * the bubble-free plan and the split HIDDEN writes are stored with, the
 * KV image built from a stored HIDDEN or MIXED image, the pipelined
 * restore from the SSD, and the restoration threads.
 *
 * A block stored as hidden states (HIDDEN, or MIXED: hidden states below
 * its kv_from, K and V from there on) reads as the KV-kind file its
 * restoration produces.  A read that finds no KV image in DRAM submits the
 * block's restoration job, or joins the one under way: jobs are keyed by
 * block, so any number of readers cause one restoration.  The job
 * restores from the stored image's DRAM copy, or, when there is none,
 * straight from the SSD with each layer projected as it arrives
 * (kvfs_cache_restore_stream(), verified before anything is used), and
 * makes the KV image the block's DRAM copy.  From then on reads, mmap and FETCH
 * are served from DRAM like any KV block, and eviction drops the KV image
 * as the block's DRAM copy; the hidden image stays on the SSD.  A block
 * the policy keeps out of DRAM gets its result as a private copy for each
 * waiter instead.
 *
 * The DRAM copy is replaced only once the block is durable: write-back
 * writes whatever the DRAM copy holds, and that must stay the stored form.
 *
 * A namespace with a GPU restorer (ns->hc.rc) projects on the GPU for
 * every restoration of a stored block (jobs and loads into the device
 * pool), falling back to the CPU for a job whose GPU restoration fails;
 * the plans then use the GPU's projection time.  Commit-time conversions
 * stay on the CPU.
 *
 * Locking: rp->lock guards the queue, the active list and every job's
 * fields except the result, which only the job's runner writes before it
 * marks the job done (waiters read it after seeing done under the lock).
 * rp->lock is innermost: nothing is called with it held.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache_i.h"
#include "gpu/restore_cuda.h"
#include "meta/log.h"
#include "meta/util.h"

/* Enough to overlap one restoration with the I/O of the next; more would
 * only split the BLAS threads further.
 */
#define RPOOL_THREADS 2
/* Start-up profile: samples per figure, the median is used. */
#define PROF_REPS 5

struct kvfs_rjob {
	struct kvfs_block *b;       /* a reference, dropped with the job */
	struct kvfs_rjob *qnext;    /* rp->queue */
	struct kvfs_rjob *anext;    /* rp->active */
	unsigned refs;              /* the pool's (until done) + waiters' */
	unsigned waiters;           /* readers waiting for it */
	bool done;
	int rc;                     /* valid once done */
	void *img;                  /* private result (done, rc 0), or NULL */
	uint64_t img_len;
};

struct kvfs_rpool {
	pthread_mutex_t lock;
	pthread_cond_t work;        /* queue not empty, or stop */
	pthread_cond_t done;        /* some job finished */
	struct kvfs_rjob *qhead, *qtail; /* waiting for a thread */
	struct kvfs_rjob *active;   /* every job not done */
	pthread_t thr[RPOOL_THREADS];
	unsigned n_threads;         /* started and not yet joined */
	bool stop;
	/* Restorations straight into the device pool on the CPU; guarded
	 * by c->gpu_load_lock (they run only under it).  NULL until the
	 * first.
	 */
	struct kvfs_restore_ws *dev_ws;
};

/* ---------------------------------------------------------- the KV image */

int kvfs_rpool_build(struct kvfs_ns *ns, struct kvfs_restore_ws *ws,
		     const uint8_t *h, uint64_t h_len, uint32_t kv_from,
		     uint8_t *dst, uint64_t dst_len)
{
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_restore_split_io io = { 0 };
	struct kvfs_fmt_hdr hd;
	enum kvfs_fmt_err fe;
	uint64_t size, po;
	uint32_t *tok, src_from;
	int rc;

	if (!ns->hc.rst)
		return -EINVAL;
	/* The image was verified when it was written or loaded; this only
	 * decodes the header (and rechecks the key, which is cheap).
	 */
	fe = kvfs_fmt_validate(h, h_len, g, NULL, ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED |
				       KVFS_FMT_SKIP_PAYLOAD_CRC,
			       &hd);
	src_from = kvfs_fmt_hdr_kv_from(&hd);
	if (fe != KVFS_FMT_OK || hd.kind == KVFS_KIND_KV ||
	    kv_from >= src_from) {
		kvfs_err("ns %s: stored image refused for restoration: %s",
			 ns->rec.name,
			 fe != KVFS_FMT_OK ? kvfs_fmt_strerror(fe) :
			 hd.kind == KVFS_KIND_KV ? "already of kind KV" :
						   "no layers to restore");
		return -EINVAL;
	}
	size = kvfs_fmt_split_file_size(g, hd.n_tokens, kv_from);
	po = kvfs_fmt_payload_off(hd.n_tokens);
	if (!size || size > dst_len)
		return -EINVAL;
	tok = malloc((size_t)hd.n_tokens * sizeof(*tok));
	if (!tok)
		return -ENOMEM;
	for (uint32_t i = 0; i < hd.n_tokens; i++)
		tok[i] = kvfs_util_get32(h + KVFS_FMT_HDR_SIZE + 4ull * i);
	io.src = h + po;
	io.src_len = h_len - po;
	io.src_kv_from = src_from;
	io.dst = dst + po;
	io.dst_len = size - po;
	io.dst_kv_from = kv_from;
	io.dtype = g->dtype;
	io.start_pos = hd.start_pos;
	io.n_tokens = hd.n_tokens;
	io.chunk_tokens = g->chunk_tokens;
	rc = kvfs_restore_split(ns->hc.rst, ws, &io);
	if (!rc)
		rc = kvfs_fmt_build_split(g, kv_from, hd.parent, hd.start_pos,
					  tok, hd.n_tokens, NULL, dst, size);
	free(tok);
	if (!rc && dst_len > size)
		memset(dst + size, 0, dst_len - size);
	return rc;
}

/* ----------------------------------------------------- the image on a GPU */

/*
 * The GPU request that rebuilds the hidden layers of @ns's stored image
 * @h (@h_len bytes, HIDDEN or MIXED): layers below the stored kv_from, the
 * whole KV payload named as the destination (its pointer and flags are
 * the caller's).  @hd receives the header, @size the KV file's size.
 * The request names whole payloads; only the hidden layers' part of the
 * stored one is read, and it must lie inside the image.  0 or -EINVAL.
 */
static int gpu_req(struct kvfs_ns *ns, const uint8_t *h, uint64_t h_len,
		   struct kvfs_fmt_hdr *hd, uint64_t *size,
		   struct kvfs_restore_cuda_io *io)
{
	const struct kvfs_geom *g = &ns->geom;
	const struct kvfs_restore_model *m = kvfs_restore_model(ns->hc.rst);
	enum kvfs_fmt_err fe;
	uint64_t po, hlb, klb;
	uint32_t n;

	fe = kvfs_fmt_validate(h, h_len, g, NULL, ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED |
				       KVFS_FMT_SKIP_PAYLOAD_CRC,
			       hd);
	if (fe != KVFS_FMT_OK || hd->kind == KVFS_KIND_KV)
		return -EINVAL;
	n = hd->n_tokens;
	po = kvfs_fmt_payload_off(n);
	*size = kvfs_fmt_file_size(g, KVFS_KIND_KV, n);
	hlb = kvfs_restore_hidden_layer_bytes(m, n, g->chunk_tokens, g->dtype);
	klb = kvfs_restore_kv_layer_bytes(m, n, g->chunk_tokens, g->dtype);
	if (!*size || !hlb || !klb ||
	    po + (uint64_t)g->n_layers * hlb > h_len ||
	    po + (uint64_t)g->n_layers * klb != *size)
		return -EINVAL;
	memset(io, 0, sizeof(*io));
	io->hidden = h + po;
	io->hidden_len = (uint64_t)g->n_layers * hlb;
	io->hidden_dtype = g->dtype;
	io->kv_len = *size - po;
	io->kv_dtype = g->dtype;
	io->start_pos = hd->start_pos;
	io->n_tokens = n;
	io->chunk_tokens = g->chunk_tokens;
	io->first_layer = 0;
	io->n_layers = kvfs_fmt_hdr_kv_from(hd);
	return 0;
}

/*
 * Where the K and V layers of a MIXED image (@src_from < n_layers) start
 * in the stored image (@so) and in the KV file (@ko): they follow each
 * other at the end of both layouts, so one copy of @size - @ko bytes
 * moves them.  0 or -EINVAL.
 */
static int gpu_kv_tail(const struct kvfs_geom *g, uint32_t n,
		       uint32_t src_from, uint64_t h_len, uint64_t size,
		       uint64_t *so, uint64_t *ko)
{
	uint64_t sl, kl;

	if (kvfs_fmt_layer_range(g, n, src_from, src_from, so, &sl) ||
	    kvfs_fmt_layer_range(g, n, 0, src_from, ko, &kl) || sl != kl ||
	    h_len - *so != size - *ko)
		return -EINVAL;
	return 0;
}

/*
 * kvfs_rpool_build() with kv_from 0 (the KV file a read serves), the
 * hidden layers projected on @ns's GPU restorer from host memory into
 * host memory @dst (pageable: restore_cuda stages through its own pinned
 * buffers).  The K and V layers of a MIXED image are copied, the header
 * and both CRCs built on the host, as on the CPU.  The values agree with
 * the CPU's within the GPU path's tolerance (docs/hcache.md), not always
 * bit for bit.  0, -EINVAL, -ENOMEM, or restore_cuda's error (logged).
 */
static int rpool_build_gpu(struct kvfs_ns *ns, const uint8_t *h,
			   uint64_t h_len, uint8_t *dst, uint64_t dst_len)
{
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_restore_cuda_io io;
	struct kvfs_fmt_hdr hd;
	uint64_t size, po, so = 0, ko = 0;
	uint32_t *tok, src_from;
	int rc;

	if (!ns->hc.rc)
		return -ENODEV;
	rc = gpu_req(ns, h, h_len, &hd, &size, &io);
	if (rc || size > dst_len)
		return -EINVAL;
	src_from = kvfs_fmt_hdr_kv_from(&hd);
	po = kvfs_fmt_payload_off(hd.n_tokens);
	if (src_from < g->n_layers &&
	    gpu_kv_tail(g, hd.n_tokens, src_from, h_len, size, &so, &ko))
		return -EINVAL;
	tok = malloc((size_t)hd.n_tokens * sizeof(*tok));
	if (!tok)
		return -ENOMEM;
	io.kv = dst + po;
	rc = kvfs_restore_cuda_block(ns->hc.rc, &io);
	if (!rc && src_from < g->n_layers)
		memcpy(dst + ko, h + so, size - ko);
	if (!rc) {
		for (uint32_t i = 0; i < hd.n_tokens; i++)
			tok[i] = kvfs_util_get32(h + KVFS_FMT_HDR_SIZE +
						 4ull * i);
		rc = kvfs_fmt_build(g, KVFS_KIND_KV, hd.parent, hd.start_pos,
				    tok, hd.n_tokens, NULL, dst, size);
	}
	free(tok);
	if (!rc && dst_len > size)
		memset(dst + size, 0, dst_len - size);
	return rc;
}

/*
 * The KV file of stored image @h into @dst for a read or a restoration
 * ahead of need: on the GPU when @ns has a GPU restorer, on the CPU
 * (@ws) otherwise or when the GPU fails (logged, restore.gpu_fallbacks).
 */
static int rpool_build_read(struct kvfs_cache *c, struct kvfs_block *b,
			    struct kvfs_restore_ws *ws, const uint8_t *h,
			    uint64_t h_len, uint8_t *dst, uint64_t dst_len)
{
	struct kvfs_ns *ns = b->ns;
	char hex[KVFS_KEY_HEX_LEN + 1];
	int rc;

	if (ns->hc.rc) {
		rc = rpool_build_gpu(ns, h, h_len, dst, dst_len);
		if (!rc) {
			atomic_fetch_add(&c->st_restore_gpu_blocks, 1);
			return 0;
		}
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_warn("ns %s: block %s.kv: restoration on the GPU failed "
			  "(%s): restoring it on the CPU", ns->rec.name, hex,
			  strerror(-rc));
		atomic_fetch_add(&c->st_restore_gpu_fallbacks, 1);
	}
	return kvfs_rpool_build(ns, ws, h, h_len, 0, dst, dst_len);
}

/* ---------------------------------------------------------------- a job */

/* ----------------------------------------------- restoring from the SSD */

/* The state of one kvfs_cache_restore_stream(): ranges complete in any
 * order, layers are processed in order.  Only the thread running the
 * tier's readv (the done callbacks run on it) touches it.
 */
struct rs_ctx {
	struct kvfs_restore_stream *rs;
	struct kvfs_restore_ws *ws;
	struct kvfs_tier_io *io;
	uint32_t *upto;   /* per range: layers below it are in once it is */
	bool *done;       /* per range */
	size_t nr;        /* ranges */
	size_t next;      /* first range not yet processed */
	uint32_t layer;   /* next layer to process */
	bool tokens;      /* the token area is in the CRC */
	uint32_t crc;     /* payload CRC of what was processed */
	uint64_t po;      /* payload offset */
	int err;          /* first failure, read or restore */
};

/* Project or copy layers [x->layer, @upto), adding them to the CRC. */
static int rs_layers(struct rs_ctx *x, uint32_t upto)
{
	struct kvfs_restore_stream *rs = x->rs;
	const struct kvfs_geom *g = rs->g;
	uint64_t so, sl, ko, kl;
	int rc;

	if (!x->tokens) {
		x->crc = kvfs_fmt_crc32c(0, rs->img + KVFS_FMT_HDR_SIZE,
					 x->po - KVFS_FMT_HDR_SIZE);
		x->tokens = true;
	}
	for (; x->layer < upto; x->layer++) {
		uint32_t l = x->layer;

		if (kvfs_fmt_layer_range(g, rs->n_tokens, rs->kv_from, l, &so,
					 &sl) ||
		    kvfs_fmt_layer_range(g, rs->n_tokens, 0, l, &ko, &kl))
			return -EINVAL;
		x->crc = kvfs_fmt_crc32c(x->crc, rs->img + so, sl);
		if (l < rs->kv_from) {
			rc = -ENODEV;
			if (rs->rc && !rs->gpu_failed) {
				rc = kvfs_restore_cuda_layer(
					rs->rc, l, rs->img + so, g->dtype,
					rs->start_pos, rs->n_tokens,
					g->chunk_tokens, rs->dst + ko,
					g->dtype, 0);
				if (rc) {
					kvfs_warn("restore: the GPU failed on "
						  "layer %u (%s): this block's "
						  "other layers are projected "
						  "on the CPU", l,
						  strerror(-rc));
					rs->gpu_failed = true;
				} else {
					rs->gpu_layers++;
				}
			}
			/* The CPU rewrites the whole layer slice, whatever
			 * a failed GPU call left there.
			 */
			if (rc)
				rc = kvfs_restore_layer(rs->rst, x->ws, l,
							rs->img + so, g->dtype,
							rs->start_pos,
							rs->n_tokens,
							g->chunk_tokens,
							rs->dst + ko, g->dtype);
			if (rc)
				return rc;
		} else {
			if (sl != kl)
				return -EINVAL;
			memcpy(rs->dst + ko, rs->img + so, kl);
		}
	}
	return 0;
}

/* A range arrived: process every layer whose bytes, and all before
 * them, are now in.
 */
static void rs_done(struct kvfs_tier_io *io, void *arg)
{
	struct rs_ctx *x = arg;

	x->done[io - x->io] = true;
	if (io->res && !x->err)
		x->err = io->res;
	while (!x->err && x->next < x->nr && x->done[x->next])
		x->err = rs_layers(x, x->upto[x->next++]);
}

/* The image must be the block the record describes.  @crc: check the
 * payload CRC here; otherwise compare @payload_crc, computed as it
 * streamed.
 */
static int rs_verify(struct kvfs_restore_stream *rs, uint64_t ssize,
		     bool crc, uint32_t payload_crc, struct kvfs_fmt_hdr *h)
{
	enum kvfs_fmt_err fe;

	fe = kvfs_fmt_validate(rs->img, ssize, rs->g, rs->key, rs->root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED |
				       (crc ? 0 : KVFS_FMT_SKIP_PAYLOAD_CRC),
			       h);
	if (fe != KVFS_FMT_OK) {
		rs->bad = kvfs_fmt_strerror(fe);
		return -EBADMSG;
	}
	if (h->hdr_crc != rs->hdr_crc ||
	    kvfs_fmt_hdr_kv_from(h) != rs->kv_from ||
	    h->n_tokens != rs->n_tokens || h->start_pos != rs->start_pos) {
		rs->bad = "header does not match the record";
		return -EBADMSG;
	}
	if (!crc && payload_crc != h->payload_crc) {
		rs->bad = kvfs_fmt_strerror(KVFS_FMT_EPAYLOADCRC);
		return -EBADMSG;
	}
	return 0;
}

int kvfs_cache_restore_stream(struct kvfs_restore_stream *rs)
{
	const struct kvfs_geom *g = rs ? rs->g : NULL;
	struct kvfs_restore_ws *tmp = NULL;
	struct rs_ctx x = { 0 };
	struct kvfs_fmt_hdr h;
	uint64_t ssize, size, prev = 0;
	uint32_t *tok = NULL;
	int rc;

	if (!rs || !rs->ssd || !rs->ext || !g || !rs->rst || !rs->img ||
	    !rs->dst || !rs->key || !rs->root || !rs->kv_from ||
	    rs->kv_from > g->n_layers)
		return -EINVAL;
	rs->bad = NULL;
	rs->gpu_layers = 0;
	rs->gpu_failed = false;
	ssize = kvfs_fmt_split_file_size(g, rs->n_tokens, rs->kv_from);
	size = kvfs_fmt_file_size(g, KVFS_KIND_KV, rs->n_tokens);
	if (!ssize || ssize > rs->ext->len || !size || size > rs->dst_len) {
		kvfs_err("restore: stream refused: %" PRIu64 "-byte image in a "
			 "%" PRIu64 "-byte extent, %" PRIu64 "-byte KV image "
			 "into %" PRIu64 " bytes", ssize, rs->ext->len, size,
			 rs->dst_len);
		return -EINVAL;
	}
	x.rs = rs;
	x.ws = rs->ws;
	x.po = kvfs_fmt_payload_off(rs->n_tokens);
	x.io = calloc(g->n_layers, sizeof(*x.io));
	x.upto = calloc(g->n_layers, sizeof(*x.upto));
	x.done = calloc(g->n_layers, sizeof(*x.done));
	tok = malloc((size_t)rs->n_tokens * sizeof(*tok));
	rc = -ENOMEM;
	if (!x.io || !x.upto || !x.done || !tok)
		goto out_free;
	if (!x.ws) {
		rc = kvfs_restore_ws_alloc(&tmp);
		if (rc)
			goto out_free;
		x.ws = tmp;
	}
	if (rs->flags & KVFS_RS_WHOLE) {
		rc = rs->ssd->ops->read(rs->ssd, rs->ext, 0, rs->img,
					rs->ext->len);
		if (!rc)
			rc = rs_verify(rs, ssize, true, 0, &h);
		if (!rc)
			rc = rs_layers(&x, g->n_layers);
		goto out_build;
	}
	/* One range per layer, each ending at the 4096-aligned end of its
	 * layer (the header and tokens go with layer 0): a layer lying
	 * inside the previous range completes with it.
	 */
	for (uint32_t l = 0; l < g->n_layers; l++) {
		uint64_t off, len, end;

		if (kvfs_fmt_layer_range(g, rs->n_tokens, rs->kv_from, l, &off,
					 &len)) {
			rc = -EINVAL;
			goto out_free;
		}
		end = kvfs_util_align_up(off + len, KVFS_FMT_ALIGN);
		if (end > prev) {
			x.io[x.nr] = (struct kvfs_tier_io){
				.ext = rs->ext, .off = prev, .len = end - prev,
				.buf = rs->img + prev, .done = rs_done,
				.arg = &x };
			x.nr++;
			prev = end;
		}
		x.upto[x.nr - 1] = l + 1;
	}
	rc = rs->ssd->ops->readv(rs->ssd, x.io, x.nr);
	if (!rc)
		rc = x.err;
	if (!rc && x.layer != g->n_layers)
		rc = -EIO;
	if (!rc)
		rc = rs_verify(rs, ssize, false, x.crc, &h);
out_build:
	if (rc)
		goto out_free;
	for (uint32_t i = 0; i < rs->n_tokens; i++)
		tok[i] = kvfs_util_get32(rs->img + KVFS_FMT_HDR_SIZE +
					 4ull * i);
	rc = kvfs_fmt_build(g, KVFS_KIND_KV, h.parent, h.start_pos, tok,
			    rs->n_tokens, NULL, rs->dst, size);
	if (!rc && rs->dst_len > size)
		memset(rs->dst + size, 0, rs->dst_len - size);
out_free:
	kvfs_restore_ws_free(tmp);
	free(tok);
	free(x.io);
	free(x.upto);
	free(x.done);
	return rc;
}

/*
 * Restore @b, which has no DRAM copy, straight from its SSD image with
 * the I/O of later layers overlapping the projection of earlier ones.
 * Returns 0 with the KV image published as the DRAM copy (*@img NULL) or
 * kept private in *@img (@*img_len bytes; the policy kept it out of DRAM
 * or no room could be made), -EAGAIN when a DRAM copy appeared meanwhile
 * (restore from it instead), or -errno (-EBADMSG logged as a checksum
 * failure, like any SSD copy that fails verification).
 */
static int job_stream(struct kvfs_cache *c, struct kvfs_block *b,
		      struct kvfs_restore_ws *ws, uint8_t **img,
		      uint64_t *img_len)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_ns *ns = b->ns;
	struct kvfs_restore_stream rs = { 0 };
	struct kvfs_extent sx, ext = { 0 };
	char hex[KVFS_KEY_HEX_LEN + 1];
	uint64_t alen = kvfs_util_align_up(b->size, KVFS_FMT_ALIGN);
	uint8_t *dst, *src;
	bool admit, keep;
	int rc;

	*img = NULL;
	rc = kvfs_block_ssd_get(b, &sx);
	if (rc)
		return rc;
	admit = kvfs_block_dram_admit(c, b, KVFS_TIER_SSD);
	keep = admit && kvfs_dram_reserve(c, b->size, &ext) == 0;
	if (keep) {
		dst = ext.ptr;
		alen = ext.len;
	} else {
		dst = aligned_alloc(KVFS_FMT_ALIGN, alen);
	}
	src = aligned_alloc(KVFS_FMT_ALIGN, sx.len);
	rc = -ENOMEM;
	if (!dst || !src)
		goto out_free;
	rs.ssd = ssd;
	rs.ext = &sx;
	rs.g = &ns->geom;
	rs.rst = ns->hc.rst;
	rs.ws = ws;
	rs.rc = ns->hc.rc;
	rs.n_tokens = b->n_tokens;
	rs.kv_from = b->kv_from;
	rs.start_pos = b->start_pos;
	rs.hdr_crc = b->hdr_crc;
	rs.key = b->pn.key;
	rs.root = ns->rec.root;
	rs.img = src;
	rs.dst = dst;
	rs.dst_len = alen;
	/* Loads of this block are serialised: nobody brings the stored
	 * image into DRAM while we stream it.
	 */
	pthread_mutex_lock(&b->io_lock);
	if (atomic_load(&b->dram_ptr)) {
		pthread_mutex_unlock(&b->io_lock);
		rc = -EAGAIN;
		goto out_free;
	}
	rc = kvfs_cache_restore_stream(&rs);
	if (!rc) {
		atomic_fetch_add(&ssd->st.hits, 1);
		atomic_fetch_add(&c->st_pipelined, 1);
		if (keep && kvfs_block_publish_dram(c, b, &ext)) {
			/* Deleted meanwhile: the waiters get the result
			 * as their own copy.
			 */
			uint8_t *cp = aligned_alloc(KVFS_FMT_ALIGN, alen);

			if (cp) {
				memcpy(cp, dst, alen);
				dram->ops->free(dram, &ext);
				dst = cp;
				keep = false;
			} else {
				rc = -ENOMEM;
			}
		}
	}
	pthread_mutex_unlock(&b->io_lock);
	if (rs.rc && rs.gpu_failed) {
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_warn("ns %s: block %s.kv: restoration on the GPU failed "
			  "after %u layers: the CPU restored the others",
			  ns->rec.name, hex, rs.gpu_layers);
		atomic_fetch_add(&c->st_restore_gpu_fallbacks, 1);
	} else if (!rc && rs.rc) {
		atomic_fetch_add(&c->st_restore_gpu_blocks, 1);
	}
	if (rc == -EBADMSG) {
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_err("ns %s: block %s.kv: SSD copy at offset %" PRIu64
			 " fails verification (%s): not served",
			 ns->rec.name, hex, sx.off, rs.bad);
		atomic_fetch_add(&c->st_csum_errors, 1);
	}
	if (rc)
		goto out_free;
	free(src);
	if (!keep) {
		*img = dst;
		*img_len = alen;
	}
	return 0;

out_free:
	free(src);
	if (keep)
		dram->ops->free(dram, &ext);
	else
		free(dst);
	return rc;
}

/* The stored image of @b in DRAM, to restore from. */
struct hsrc {
	const uint8_t *p;
	uint64_t len;
	bool in_dram;   /* b->readers counts us */
};

/* 0 with @s filled, 1 when the DRAM copy is already the KV image,
 * -ENOENT when there is no DRAM copy.
 */
static int hidden_src(struct kvfs_block *b, struct hsrc *s)
{
	uint8_t *p;

	memset(s, 0, sizeof(*s));
	atomic_fetch_add(&b->readers, 1);
	p = atomic_load(&b->dram_ptr);
	if (!p || kvfs_img_kind(p) == KVFS_KIND_KV) {
		atomic_fetch_sub(&b->readers, 1);
		return p ? 1 : -ENOENT;
	}
	s->p = p;
	s->len = b->ssize;
	s->in_dram = true;
	return 0;
}

static void hidden_src_put(struct kvfs_block *b, struct hsrc *s)
{
	if (s->in_dram)
		atomic_fetch_sub(&b->readers, 1);
	memset(s, 0, sizeof(*s));
}

/*
 * Make @kv the DRAM copy of @b in place of the hidden image @old.  The
 * I/O lock keeps loaders and the device tier's copy-down out; the pointer
 * is unpublished first and readers of the old image, who only look at its
 * header, are waited out.  -EAGAIN if the DRAM copy is no longer @old.
 */
static int dram_swap(struct kvfs_cache *c, struct kvfs_block *b,
		     const void *old, struct kvfs_extent *kv)
{
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_extent ox;

	pthread_mutex_lock(&b->io_lock);
	pthread_mutex_lock(&b->lock);
	if (atomic_load(&b->dram_ptr) != old || b->dram.ptr != old) {
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&b->io_lock);
		return -EAGAIN;
	}
	atomic_store(&b->dram_ptr, NULL);
	while (atomic_load(&b->readers) > 0)
		sched_yield();
	ox = b->dram;
	b->dram = *kv;
	atomic_store(&b->dram_ptr, kv->ptr);
	pthread_mutex_unlock(&b->lock);
	pthread_mutex_unlock(&b->io_lock);
	dram->ops->free(dram, &ox);
	return 0;
}

static bool dram_is_kv(struct kvfs_block *b);

/*
 * The device pool may already hold @b's KV image (a FETCH restored it
 * there): copy it down as the block's DRAM copy instead of rebuilding it.
 * Returns 0 when the DRAM copy is now the KV image, -ENOENT when the pool
 * has no copy (or DRAM no room, or the copy fails): the caller restores.
 * Needs the block durable, as any KV image that becomes the DRAM copy.
 */
static int pool_down(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_extent gx, dx = { 0 };
	bool nocrc, published = false;
	struct hsrc s;
	int rc;

	if (!gpu || !(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		return -ENOENT;
	/* A lease keeps the pool copy from being evicted while it is read. */
	pthread_mutex_lock(&b->lock);
	gx = b->gpu;
	if (gx.len)
		atomic_fetch_add(&b->leases, 1);
	nocrc = atomic_load(&b->flags) & KVFS_B_GPU_NOCRC;
	pthread_mutex_unlock(&b->lock);
	if (!gx.len)
		return -ENOENT;
	/* Restored meanwhile: no need to reserve DRAM (and evict for it). */
	if (dram_is_kv(b)) {
		atomic_fetch_sub(&b->leases, 1);
		return 0;
	}
	if (kvfs_dram_reserve(c, b->size, &dx))
		goto out_unlease;
	if (gpu->ops->read(gpu, &gx, 0, dx.ptr, b->size))
		goto out_free;
	/* Restored on the GPU: the payload is in host memory now, so its
	 * CRC can be summed.
	 */
	if (nocrc)
		kvfs_img_seal(dx.ptr, b->size);
	memset((uint8_t *)dx.ptr + b->size, 0, dx.len - b->size);
	rc = hidden_src(b, &s);
	if (rc == 0) {
		const void *old = s.p;

		hidden_src_put(b, &s);
		published = dram_swap(c, b, old, &dx) == 0;
	} else if (rc == -ENOENT) {
		pthread_mutex_lock(&b->io_lock);
		pthread_mutex_lock(&c->policy_lock);
		pthread_mutex_lock(&b->lock);
		if (!atomic_load(&b->dram_ptr) &&
		    !(atomic_load(&b->flags) & KVFS_B_DELETED)) {
			b->dram = dx;
			atomic_store(&b->dram_ptr, dx.ptr);
			atomic_fetch_or(&b->tiers, KVFS_TIER_BIT_DRAM);
			published = true;
		}
		pthread_mutex_unlock(&b->lock);
		if (published) {
			struct kvfs_paccess a = { .now = kvfs_util_now_real() };

			kvfs_policy_insert(c->policy, KVFS_TIER_DRAM, &b->pn,
					   &a);
			atomic_fetch_add(&dram->st.blocks, 1);
		}
		pthread_mutex_unlock(&c->policy_lock);
		pthread_mutex_unlock(&b->io_lock);
	}
	if (!published)
		goto out_free;
	atomic_fetch_sub(&b->leases, 1);
	atomic_fetch_add(&c->st_restore_from_pool, 1);
	return 0;

out_free:
	dram->ops->free(dram, &dx);
out_unlease:
	atomic_fetch_sub(&b->leases, 1);
	/* The KV image may have arrived meanwhile (rc 1 of hidden_src). */
	return dram_is_kv(b) ? 0 : -ENOENT;
}

static void job_run(struct kvfs_cache *c, struct kvfs_rjob *j,
		    struct kvfs_restore_ws *ws)
{
	struct kvfs_block *b = j->b;
	struct kvfs_ns *ns = b->ns;
	struct kvfs_extent ext = { 0 };
	char hex[KVFS_KEY_HEX_LEN + 1];
	uint64_t t0 = kvfs_util_now_mono(), alen, slen = 0;
	bool keep;
	struct hsrc s;
	uint8_t *dst, *sdst = NULL;
	int rc;

	kvfs_fmt_key_hex(b->pn.key, hex);
	if (!ns->hc.rst) {
		kvfs_err("ns %s: block %s.kv is stored as hidden states but "
			 "the namespace has no weights: not served",
			 ns->rec.name, hex);
		j->rc = -EIO;
		return;
	}
	/* An open keeps the copies from being freed by a delete and the
	 * DRAM copy from being evicted, as for a reader.
	 */
	atomic_fetch_add(&b->opens, 1);
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		rc = -ENOENT;
		goto out_close;
	}
	/* Only a durable block's DRAM copy may turn into the KV image. */
	if (!(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		kvfs_cache_sync(c, b);
	/* Restored into the device pool already (FETCH): copy it down. */
	if (pool_down(c, b) == 0) {
		rc = 0;
		goto out_close;
	}
	/* A stored image in DRAM is restored from there; a block only on
	 * the SSD is streamed from it, I/O overlapping the projection.
	 */
	for (;;) {
		rc = hidden_src(b, &s);
		if (rc != -ENOENT)
			break;
		rc = job_stream(c, b, ws, &sdst, &slen);
		if (rc == -EAGAIN)
			continue;
		if (rc)
			goto out_close;
		atomic_fetch_add(&c->st_restores, 1);
		atomic_fetch_add(&ns->hc.restored, 1);
		atomic_fetch_add(&c->st_restore_ns,
				 kvfs_util_now_mono() - t0);
		if (sdst) {
			atomic_fetch_add(&c->st_restore_private, 1);
			j->img = sdst;
			j->img_len = slen;
		}
		goto out_close;
	}
	if (rc) {
		if (rc == 1)
			rc = 0; /* restored meanwhile, or copied down */
		goto out_close;
	}
	keep = s.in_dram && (atomic_load(&b->flags) & KVFS_B_PERSISTED);
	alen = kvfs_util_align_up(b->size, KVFS_FMT_ALIGN);
	if (keep && kvfs_dram_reserve(c, b->size, &ext) == 0) {
		dst = ext.ptr;
		alen = ext.len;
	} else {
		keep = false;
		dst = aligned_alloc(KVFS_FMT_ALIGN, alen);
		if (!dst) {
			hidden_src_put(b, &s);
			rc = -ENOMEM;
			goto out_close;
		}
	}
	rc = rpool_build_read(c, b, ws, s.p, s.len, dst, alen);
	if (rc) {
		hidden_src_put(b, &s);
		goto out_free_dst;
	}
	atomic_fetch_add(&c->st_restores, 1);
	atomic_fetch_add(&ns->hc.restored, 1);
	atomic_fetch_add(&c->st_restore_ns, kvfs_util_now_mono() - t0);
	if (keep) {
		const void *old = s.p;

		hidden_src_put(b, &s);
		if (dram_swap(c, b, old, &ext) == 0)
			goto out_close;
		/* The DRAM copy changed hands: keep the result private. */
		void *cp = aligned_alloc(KVFS_FMT_ALIGN, alen);

		if (!cp) {
			rc = -ENOMEM;
			goto out_free_dst;
		}
		memcpy(cp, dst, alen);
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &ext);
		dst = cp;
		keep = false;
	} else {
		hidden_src_put(b, &s);
	}
	atomic_fetch_add(&c->st_restore_private, 1);
	j->img = dst;
	j->img_len = alen;
	goto out_close;

out_free_dst:
	if (keep)
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &ext);
	else
		free(dst);
out_close:
	if (rc && rc != -ENOENT) {
		atomic_fetch_add(&c->st_restore_errors, 1);
		kvfs_err("ns %s: restoring block %s.kv failed: %s",
			 ns->rec.name, hex, strerror(-rc));
	}
	j->rc = rc;
	atomic_fetch_sub(&b->opens, 1);
	kvfs_block_try_free(c, b);
}

/* Caller holds rp->lock. */
static struct kvfs_rjob *job_find(struct kvfs_rpool *rp,
				  const struct kvfs_block *b)
{
	struct kvfs_rjob *j;

	for (j = rp->active; j && j->b != b; j = j->anext)
		;
	return j;
}

/* A new active job for @b with the pool's reference. Caller holds
 * rp->lock.
 */
static struct kvfs_rjob *job_new(struct kvfs_rpool *rp, struct kvfs_block *b)
{
	struct kvfs_rjob *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	kvfs_block_get_ref(b);
	j->b = b;
	j->refs = 1;
	j->anext = rp->active;
	rp->active = j;
	return j;
}

static void job_enqueue(struct kvfs_rpool *rp, struct kvfs_rjob *j)
{
	j->qnext = NULL;
	if (rp->qtail)
		rp->qtail->qnext = j;
	else
		rp->qhead = j;
	rp->qtail = j;
	pthread_cond_signal(&rp->work);
}

/* Drop a reference; returns the job to free (outside the lock) or NULL.
 * Caller holds rp->lock.
 */
static struct kvfs_rjob *job_unref(struct kvfs_rjob *j)
{
	return --j->refs ? NULL : j;
}

static void job_free(struct kvfs_cache *c, struct kvfs_rjob *j)
{
	if (!j)
		return;
	kvfs_cache_put(c, j->b);
	free(j->img);
	free(j);
}

/* Mark @j done and take it off the active list. Caller holds rp->lock. */
static struct kvfs_rjob *job_finish(struct kvfs_rpool *rp,
				    struct kvfs_rjob *j)
{
	struct kvfs_rjob **pp;

	for (pp = &rp->active; *pp && *pp != j; pp = &(*pp)->anext)
		;
	if (*pp)
		*pp = j->anext;
	j->done = true;
	pthread_cond_broadcast(&rp->done);
	return job_unref(j);
}

static void *rpool_main(void *arg)
{
	struct kvfs_cache *c = arg;
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_restore_ws *ws = NULL;
	struct kvfs_rjob *j, *gone;

	/* Without a workspace each restoration allocates its own. */
	if (kvfs_restore_ws_alloc(&ws))
		ws = NULL;
	pthread_mutex_lock(&rp->lock);
	for (;;) {
		while (!rp->qhead && !rp->stop)
			pthread_cond_wait(&rp->work, &rp->lock);
		j = rp->qhead;
		if (!j)
			break;
		rp->qhead = j->qnext;
		if (!rp->qhead)
			rp->qtail = NULL;
		if (rp->stop && !j->waiters) {
			/* Ahead of a need that will not come. */
			j->rc = -ECANCELED;
		} else {
			pthread_mutex_unlock(&rp->lock);
			job_run(c, j, ws);
			pthread_mutex_lock(&rp->lock);
		}
		gone = job_finish(rp, j);
		if (gone) {
			pthread_mutex_unlock(&rp->lock);
			job_free(c, gone);
			pthread_mutex_lock(&rp->lock);
		}
	}
	pthread_mutex_unlock(&rp->lock);
	kvfs_restore_ws_free(ws);
	return NULL;
}

/* A readers-counted look at whether @b's DRAM copy is the KV image. */
static bool dram_is_kv(struct kvfs_block *b)
{
	const uint8_t *p;
	bool kv;

	atomic_fetch_add(&b->readers, 1);
	p = atomic_load(&b->dram_ptr);
	kv = p && kvfs_img_kind(p) == KVFS_KIND_KV;
	atomic_fetch_sub(&b->readers, 1);
	return kv;
}

int kvfs_rpool_wait(struct kvfs_cache *c, struct kvfs_block *b, void **priv,
		    uint64_t *priv_len)
{
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_rjob *j, *gone;
	bool run_here = false;
	int rc;

	if (!rp)
		return -EIO;
	pthread_mutex_lock(&rp->lock);
	j = job_find(rp, b);
	if (j) {
		atomic_fetch_add(&c->st_restore_joined, 1);
	} else {
		/* A job that just finished published before it left the
		 * active list: look again before starting another.
		 */
		if (dram_is_kv(b)) {
			pthread_mutex_unlock(&rp->lock);
			return 0;
		}
		j = job_new(rp, b);
		if (!j) {
			pthread_mutex_unlock(&rp->lock);
			return -ENOMEM;
		}
		if (rp->n_threads && !rp->stop)
			job_enqueue(rp, j);
		else
			run_here = true;
	}
	atomic_fetch_add(&c->st_restore_waits, 1);
	j->refs++;
	j->waiters++;
	if (run_here) {
		pthread_mutex_unlock(&rp->lock);
		job_run(c, j, NULL);
		pthread_mutex_lock(&rp->lock);
		gone = job_finish(rp, j);
		/* our own reference is still held */
		(void)gone;
	}
	while (!j->done)
		pthread_cond_wait(&rp->done, &rp->lock);
	pthread_mutex_unlock(&rp->lock);

	rc = j->rc;
	if (!rc && j->img) {
		*priv = malloc(j->img_len);
		if (*priv) {
			memcpy(*priv, j->img, j->img_len);
			*priv_len = j->img_len;
		} else {
			rc = -ENOMEM;
		}
	}
	pthread_mutex_lock(&rp->lock);
	gone = job_unref(j);
	pthread_mutex_unlock(&rp->lock);
	job_free(c, gone);
	return rc;
}

void kvfs_rpool_ahead(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_rjob *j;

	/* Nothing to do once the DRAM copy is the KV image. */
	if (!rp || !kvfs_block_needs_restore(b) || !b->ns->hc.rst ||
	    dram_is_kv(b))
		return;
	pthread_mutex_lock(&rp->lock);
	if (rp->n_threads && !rp->stop && !job_find(rp, b)) {
		j = job_new(rp, b);
		if (j) {
			job_enqueue(rp, j);
			atomic_fetch_add(&c->st_restore_ahead, 1);
		}
	}
	pthread_mutex_unlock(&rp->lock);
}

/* ------------------------------------------ straight into the device pool */

void kvfs_img_seal(uint8_t *img, uint64_t size)
{
	uint32_t crc = kvfs_fmt_crc32c(0, img + KVFS_FMT_HDR_SIZE,
				       size - KVFS_FMT_HDR_SIZE);

	kvfs_util_put32(img + offsetof(struct kvfs_fmt_hdr, payload_crc), crc);
	crc = kvfs_fmt_crc32c(0, img, offsetof(struct kvfs_fmt_hdr, hdr_crc));
	kvfs_util_put32(img + offsetof(struct kvfs_fmt_hdr, hdr_crc), crc);
}

/*
 * On the CPU: into the extent's host mapping (shm), or, where the pool
 * has none (cuda), into a bounce buffer uploaded at once.  The image is
 * complete, CRCs included.
 */
static int dev_cpu(struct kvfs_cache *c, struct kvfs_block *b,
		   const struct hsrc *s, const struct kvfs_extent *e)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_gpu_xfer x = { 0 };
	uint8_t *dst, *bounce = NULL;
	int rc;

	if (!rp->dev_ws && kvfs_restore_ws_alloc(&rp->dev_ws))
		rp->dev_ws = NULL; /* each call allocates its own */
	dst = gpu->ops->map(gpu, e);
	if (!dst) {
		bounce = aligned_alloc(KVFS_FMT_ALIGN, e->len);
		if (!bounce)
			return -ENOMEM;
		dst = bounce;
	}
	rc = kvfs_rpool_build(b->ns, rp->dev_ws, s->p, s->len, 0, dst, e->len);
	if (!rc && bounce) {
		x.pool = e;
		x.host = bounce;
		x.len = b->size;
		rc = c->gops->upload(gpu, &x, 1);
	}
	free(bounce);
	return rc;
}

/*
 * On the GPU: the hidden layers (below the stored kv_from) are projected
 * by kvfs_restore_cuda_block() from host memory into the extent's device
 * address; the header, the token ids and the layers stored as K and V
 * are uploaded as they are, the header with kind KV and its payload CRC
 * left for kvfs_img_seal() (the payload is not in host memory to sum).
 */
static int dev_gpu(struct kvfs_cache *c, struct kvfs_block *b,
		   const struct hsrc *s, const struct kvfs_extent *e)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_ns *ns = b->ns;
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_restore_cuda_io io;
	struct kvfs_gpu_xfer x[2] = { { 0 } };
	struct kvfs_fmt_hdr hd;
	uint64_t po, size, so = 0, ko = 0;
	uint32_t src_from;
	uint8_t *head, *dev = NULL;
	size_t nx = 1;
	int rc;

	if (gpu_req(ns, s->p, s->len, &hd, &size, &io) ||
	    hd.n_tokens != b->n_tokens || size != b->size || size > e->len)
		return -EINVAL;
	src_from = kvfs_fmt_hdr_kv_from(&hd);
	po = kvfs_fmt_payload_off(hd.n_tokens);
	if (src_from < g->n_layers &&
	    gpu_kv_tail(g, hd.n_tokens, src_from, s->len, size, &so, &ko))
		return -EINVAL;
	rc = c->gops->extent_addr(gpu, e, (void **)&dev);
	if (rc)
		return rc;
	io.kv = dev + po;
	io.flags = KVFS_RC_KV_DEVICE;
	rc = kvfs_restore_cuda_block(ns->hc.rc, &io);
	if (rc)
		return rc;
	head = malloc(po);
	if (!head)
		return -ENOMEM;
	memcpy(head, s->p, po);
	kvfs_util_put16(head + offsetof(struct kvfs_fmt_hdr, kind),
			KVFS_KIND_KV);
	kvfs_util_put16(head + offsetof(struct kvfs_fmt_hdr, kv_from), 0);
	kvfs_util_put32(head + offsetof(struct kvfs_fmt_hdr, payload_crc), 0);
	kvfs_util_put32(head + offsetof(struct kvfs_fmt_hdr, hdr_crc),
			kvfs_fmt_crc32c(0, head,
					offsetof(struct kvfs_fmt_hdr,
						 hdr_crc)));
	x[0] = (struct kvfs_gpu_xfer){ .pool = e, .host = head, .len = po };
	if (src_from < g->n_layers) {
		x[1] = (struct kvfs_gpu_xfer){ .pool = e,
					       .host = (void *)(s->p + so),
					       .off = ko, .len = size - ko };
		nx = 2;
	}
	rc = c->gops->upload(gpu, x, nx);
	free(head);
	return rc;
}

int kvfs_rpool_to_device(struct kvfs_cache *c, struct kvfs_block *b,
			 const struct kvfs_extent *e, bool *nocrc)
{
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_ns *ns = b->ns;
	struct kvfs_hc_ns *hc = &ns->hc;
	char hex[KVFS_KEY_HEX_LEN + 1];
	uint64_t t0 = kvfs_util_now_mono(), priv_len = 0;
	void *priv = NULL;
	struct hsrc s;
	bool busy;
	int rc;

	*nocrc = false;
	if (!rp || !hc->rst || hc->dev == KVFS_HC_DEV_NONE ||
	    !c->tier[KVFS_TIER_GPU] || !c->gops ||
	    !kvfs_block_needs_restore(b) || e->len < b->size)
		return 1;
	/* A restoration under way puts the KV image in DRAM: the usual
	 * path joins it rather than restoring a second time.
	 */
	pthread_mutex_lock(&rp->lock);
	busy = job_find(rp, b) != NULL;
	pthread_mutex_unlock(&rp->lock);
	if (busy)
		return 1;
	/* As a reader: a delete cannot free the copies meanwhile. */
	atomic_fetch_add(&b->opens, 1);
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		rc = -ENOENT;
		goto out_close;
	}
	rc = hidden_src(b, &s);
	if (rc == -ENOENT) {
		/* Only on the SSD: a private, verified copy of the stored
		 * image, which never takes DRAM room.
		 */
		pthread_mutex_lock(&b->io_lock);
		rc = kvfs_block_load(c, b, KVFS_LOAD_PRIV, &priv, &priv_len);
		pthread_mutex_unlock(&b->io_lock);
		if (rc)
			goto out_close;
		s = (struct hsrc){ .p = priv, .len = b->ssize };
	} else if (rc) {
		goto out_close; /* 1: the DRAM copy is the KV image */
	}
	rc = hc->dev == KVFS_HC_DEV_GPU ? dev_gpu(c, b, &s, e) :
					  dev_cpu(c, b, &s, e);
	hidden_src_put(b, &s);
	free(priv);
	if (!rc) {
		*nocrc = hc->dev == KVFS_HC_DEV_GPU;
		atomic_fetch_add(&c->st_restores, 1);
		atomic_fetch_add(&hc->restored, 1);
		atomic_fetch_add(&c->st_restore_dev, 1);
		if (hc->dev == KVFS_HC_DEV_GPU)
			atomic_fetch_add(&c->st_restore_gpu, 1);
		atomic_fetch_add(&c->st_restore_ns,
				 kvfs_util_now_mono() - t0);
	}
out_close:
	if (rc < 0 && rc != -ENOENT && rc != -EBADMSG) {
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_err("ns %s: restoring block %s.kv into the device pool "
			 "on the %s failed: %s", ns->rec.name, hex,
			 hc->dev == KVFS_HC_DEV_GPU ? "GPU" : "CPU",
			 strerror(-rc));
	}
	atomic_fetch_sub(&b->opens, 1);
	kvfs_block_try_free(c, b);
	return rc;
}

/* ------------------------------------------------------------- profiling */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[n / 2];
}

static double secs_since(uint64_t t0)
{
	return (double)(kvfs_util_now_mono() - t0) * 1e-9;
}

/* Median seconds of a DRAM load of @len bytes: a memcpy, as a restore
 * from DRAM reads its source.
 */
static double prof_dram(uint8_t *dst, const uint8_t *src, uint64_t len)
{
	double t[PROF_REPS];

	memcpy(dst, src, len); /* fault the pages in */
	for (int i = 0; i < PROF_REPS; i++) {
		uint64_t t0 = kvfs_util_now_mono();

		memcpy(dst, src, len);
		t[i] = secs_since(t0);
	}
	return median(t, PROF_REPS);
}

/* Median seconds of an O_DIRECT read of @len bytes from the data file
 * (read only; whatever the bytes are), at offsets that move on so that
 * no sample repeats another's range.  -1 if the file cannot be read.
 */
static double prof_ssd(struct kvfs_cache *c, int fd, uint8_t *buf,
		       uint64_t len, uint64_t *cursor)
{
	uint64_t base = c->store->sb.data_off;
	uint64_t span = c->store->sb.ssd_size - base;
	double t[PROF_REPS];

	len = kvfs_util_align_up(len, KVFS_FMT_ALIGN);
	if (span < len)
		return -1;
	for (int i = 0; i < PROF_REPS; i++) {
		uint64_t off;

		if (*cursor + len > span)
			*cursor = 0;
		off = base + *cursor;
		*cursor += len;
		uint64_t t0 = kvfs_util_now_mono();
		ssize_t n = pread(fd, buf, len, (off_t)off);

		if (n != (ssize_t)len)
			return -1;
		t[i] = secs_since(t0);
	}
	return median(t, PROF_REPS);
}

static const char *mode_name(int mode)
{
	switch (mode) {
	case KVFS_HSCHED_MODE_HIDDEN_ONLY:
		return "hidden-only";
	case KVFS_HSCHED_MODE_HIDDEN_KV:
		return "hidden+kv";
	case KVFS_HSCHED_MODE_HIDDEN_RECOMPUTE:
		return "hidden+recompute";
	case KVFS_HSCHED_MODE_KV_ONLY:
		return "kv-only";
	case KVFS_HSCHED_MODE_RECOMPUTE_ONLY:
		return "recompute-only";
	}
	return "none";
}

/*
 * Per-layer times for a full block of @ns (paper 003 §4.1): loading its
 * hidden states and its KV from DRAM and from the SSD, and projecting it.
 * There is no model runner, so token recomputation is left out (C_Token =
 * 0) and the plans never recompute.
 */
static int hc_profile(struct kvfs_cache *c, struct kvfs_ns *ns,
		      struct kvfs_restore_ws *ws)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	const struct kvfs_restore_model *m = kvfs_restore_model(hc->rst);
	const struct kvfs_geom *g = &ns->geom;
	uint32_t T = g->block_tokens, C = g->chunk_tokens;
	uint64_t hb = kvfs_restore_hidden_layer_bytes(m, T, C, g->dtype);
	uint64_t kb = kvfs_restore_kv_layer_bytes(m, T, C, g->dtype);
	uint64_t rows = (uint64_t)(T + C - 1) / C * C, cursor = 0;
	uint64_t len = kvfs_util_align_up(hb > kb ? hb : kb, KVFS_FMT_ALIGN);
	uint8_t *x = NULL, *y = NULL;
	float *xf = NULL;
	double t[PROF_REPS];
	int fd, rc = -ENOMEM;

	if (!hb || !kb)
		return -EINVAL;
	x = aligned_alloc(KVFS_FMT_ALIGN, len);
	y = aligned_alloc(KVFS_FMT_ALIGN, len);
	xf = malloc(rows * g->hidden_size * sizeof(*xf));
	if (!x || !y || !xf)
		goto out_free;
	memset(x, 0, len);
	/* Synthetic hidden states of the order of real ones. */
	for (uint64_t i = 0; i < rows * g->hidden_size; i++)
		xf[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 500.0f;
	rc = kvfs_restore_from_f32(xf, g->dtype, x, rows * g->hidden_size);
	if (rc)
		goto out_free;
	memset(&hc->prof, 0, sizeof(hc->prof));
	hc->prof.io_hidden[KVFS_TIER_DRAM] = prof_dram(y, x, hb);
	hc->prof.io_kv[KVFS_TIER_DRAM] = prof_dram(y, x, kb);

	/* The projection; the first call also grows the workspace. */
	rc = kvfs_restore_layer(hc->rst, ws, 0, x, g->dtype, 0, T, C, y,
				g->dtype);
	for (int i = 0; i < PROF_REPS && !rc; i++) {
		uint64_t t0 = kvfs_util_now_mono();

		rc = kvfs_restore_layer(hc->rst, ws, (uint32_t)i % g->n_layers,
					x, g->dtype, 0, T, C, y, g->dtype);
		t[i] = secs_since(t0);
	}
	if (rc)
		goto out_free;
	hc->prof.c_hidden = median(t, PROF_REPS);
	hc->prof.c_token = 0;

	fd = open(c->store->data_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd >= 0) {
		double ih = prof_ssd(c, fd, y, hb, &cursor);
		double ik = prof_ssd(c, fd, y, kb, &cursor);

		close(fd);
		if (ih >= 0 && ik >= 0) {
			hc->prof.io_hidden[KVFS_TIER_SSD] = ih;
			hc->prof.io_kv[KVFS_TIER_SSD] = ik;
			hc->ssd_profiled = true;
		}
	}
	if (!hc->ssd_profiled)
		kvfs_warn("ns %s: hcache: the SSD could not be profiled "
			  "(O_DIRECT read of %s failed): no SSD plan",
			  ns->rec.name, c->store->data_path);
	hc->profiled = true;
	kvfs_info("ns %s: hcache profile per layer of a %u-token block: "
		  "DRAM hidden %.1f us, KV %.1f us; SSD hidden %.1f us, KV "
		  "%.1f us; projection on the CPU %.1f us; token "
		  "recomputation: no model runner, left out",
		  ns->rec.name, T, hc->prof.io_hidden[KVFS_TIER_DRAM] * 1e6,
		  hc->prof.io_kv[KVFS_TIER_DRAM] * 1e6,
		  hc->prof.io_hidden[KVFS_TIER_SSD] * 1e6,
		  hc->prof.io_kv[KVFS_TIER_SSD] * 1e6, hc->prof.c_hidden * 1e6);
out_free:
	free(x);
	free(y);
	free(xf);
	return rc;
}

/*
 * The bubble-free plans of @ns for blocks read from DRAM and from the SSD
 * (paper 003 §4.1), from the start-up profile.  C_H is the projection
 * time of whoever restores: the GPU's (kvfs_restore_cuda_profile(), taken
 * by hc_dev_init()) when the namespace has a GPU restorer that could be
 * profiled, else the CPU's.  The I/O figures are the host's either way.
 */
static int hc_plan(struct kvfs_ns *ns)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_hsched_profile p;
	int rc;

	if (!hc->profiled)
		return 0;
	p = hc->prof;
	hc->plan_gpu = hc->rc && hc->gpu_profiled;
	if (hc->plan_gpu)
		p.c_hidden = hc->gpu_compute;
	rc = kvfs_hsched_plan(&p, KVFS_TIER_DRAM, g->n_layers,
			      &hc->plan[KVFS_TIER_DRAM]);
	if (!rc && hc->ssd_profiled)
		rc = kvfs_hsched_plan(&p, KVFS_TIER_SSD, g->n_layers,
				      &hc->plan[KVFS_TIER_SSD]);
	if (rc) {
		kvfs_warn("ns %s: hcache: no plan (%s)", ns->rec.name,
			  strerror(-rc));
		return 0;
	}
	hc->planned = true;
	if (hc->plan_gpu)
		kvfs_info("ns %s: hcache plans use the GPU's projection time, "
			  "%.1f us per layer (the CPU's: %.1f us): the GPU "
			  "restores reads, FETCH and restorations ahead of "
			  "need", ns->rec.name, p.c_hidden * 1e6,
			  hc->prof.c_hidden * 1e6);
	else
		kvfs_info("ns %s: hcache plans use the CPU's projection time, "
			  "%.1f us per layer (%s)", ns->rec.name,
			  p.c_hidden * 1e6,
			  hc->rc ? "the GPU restorer could not be profiled" :
				   "no GPU restorer");
	for (int tier = KVFS_TIER_DRAM; tier <= KVFS_TIER_SSD; tier++) {
		const struct kvfs_hsched_plan *pl = &hc->plan[tier];

		if (tier == KVFS_TIER_SSD && !hc->ssd_profiled)
			continue;
		kvfs_info("ns %s: hcache plan for blocks read from %s: %s, "
			  "%u hidden + %u KV + %u recomputed layers, "
			  "predicted %.1f us (I/O %.1f, compute %.1f)",
			  ns->rec.name, kvfs_tier_name(tier),
			  mode_name(pl->mode), pl->n_hidden, pl->n_kv,
			  pl->n_recompute, pl->t_total * 1e6, pl->t_io * 1e6,
			  pl->t_compute * 1e6);
	}
	return 0;
}

/*
 * The split HIDDEN writes to @ns are stored with, from its store_as, the
 * SSD plan and hcache_kv_layers (@cn).  store_as = auto follows the plan
 * of the SSD, where blocks live for the long term: its hidden layers stay
 * hidden states, its KV layers are stored only as K and V.
 */
static int hc_decide(struct kvfs_ns *ns, const struct kvfs_ns_params *cn)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	const struct kvfs_geom *g = &ns->geom;
	uint32_t n = g->n_layers, kv = 2 * g->n_kv_heads * g->head_dim;
	bool smaller = kvfs_hsched_hidden_smaller(g->hidden_size,
						  g->n_kv_heads, g->head_dim);
	bool ssd = hc->planned && hc->ssd_profiled;
	const char *why;
	int rc;

	switch (ns->rec.store_as) {
	case KVFS_STORE_KV:
		hc->kv_from = 0;
		return 0;
	case KVFS_STORE_HIDDEN:
		hc->kv_from = n;
		if (!smaller)
			kvfs_warn("ns %s: store_as = hidden although hidden "
				  "states (%u per token) are not smaller than "
				  "K+V (%u): they take more room",
				  ns->rec.name, g->hidden_size, kv);
		return 0;
	case KVFS_STORE_AUTO:
		break;
	default:
		kvfs_err("ns %s: unknown store_as %u in the namespace record",
			 ns->rec.name, ns->rec.store_as);
		return -EUCLEAN;
	}
	if (cn->hc.kv_layers != KVFS_PARAMS_KV_LAYERS_SCHED && smaller &&
	    cn->hc.kv_layers <= n) {
		/* fs/conf.c checked the bounds and the sizes. */
		hc->kv_from = n - cn->hc.kv_layers;
		hc->kv_fixed = true;
		why = "hcache_kv_layers";
	} else {
		rc = kvfs_hsched_split_auto(g->hidden_size, g->n_kv_heads,
					    g->head_dim,
					    ssd ? &hc->plan[KVFS_TIER_SSD] :
						  NULL,
					    n, &hc->kv_from);
		if (rc)
			return rc;
		why = !ssd ? "no SSD plan" :
		      hc->plan_gpu ? "SSD plan, GPU projection time" :
				     "SSD plan, CPU projection time";
	}
	if (!smaller)
		kvfs_info("ns %s: store_as = auto: hidden states (%u per "
			  "token) are not smaller than K+V (%u): HIDDEN writes "
			  "are stored as KV", ns->rec.name, g->hidden_size, kv);
	else if (!hc->kv_from)
		kvfs_info("ns %s: store_as = auto keeps layers 0..%u as KV "
			  "(%s)", ns->rec.name, n - 1, why);
	else if (hc->kv_from == n)
		kvfs_info("ns %s: store_as = auto keeps layers 0..%u as hidden "
			  "states (%s)", ns->rec.name, n - 1, why);
	else
		kvfs_info("ns %s: store_as = auto keeps layers 0..%u as hidden "
			  "states, %u..%u as KV (%s)", ns->rec.name,
			  hc->kv_from - 1, hc->kv_from, n - 1, why);
	return 0;
}

static const struct kvfs_ns_params *conf_ns(struct kvfs_cache *c,
					  const char *name)
{
	for (size_t i = 0; i < c->conf.n_ns; i++)
		if (!strcmp(c->conf.ns[i].name, name))
			return &c->conf.ns[i];
	return NULL;
}

static int hc_load(struct kvfs_cache *c, struct kvfs_ns *ns,
		   const struct kvfs_ns_params *cn, struct kvfs_restore_ws *ws)
{
	struct kvfs_restore_model m = {
		.family = cn->hc.family,
		.n_layers = ns->geom.n_layers,
		.hidden_size = ns->geom.hidden_size,
		.n_kv_heads = ns->geom.n_kv_heads,
		.head_dim = ns->geom.head_dim,
		.rms_norm_eps = cn->hc.rms_norm_eps,
		.rope_theta = cn->hc.rope_theta,
		.rope_type = cn->hc.rope_type,
		.rope_factor = cn->hc.rope_factor,
		.rope_low_freq_factor = cn->hc.rope_low_freq_factor,
		.rope_high_freq_factor = cn->hc.rope_high_freq_factor,
		.rope_orig_max_pos = cn->hc.rope_orig_max_pos,
	};
	int rc;

	rc = kvfs_restore_model_check(&m);
	if (!rc)
		rc = kvfs_restore_load(&m, cn->hc.weights, 0, &ns->hc.rst);
	if (rc) {
		kvfs_err("namespace %s: checkpoint %s refused (%s; the line "
			 "above names the tensor): not starting",
			 ns->rec.name, cn->hc.weights, strerror(-rc));
		return rc;
	}
	kvfs_info("namespace %s: checkpoint %s loaded for hidden-state "
		  "restoration (%" PRIu64 " bytes of converted weights)",
		  ns->rec.name, cn->hc.weights,
		  kvfs_restore_mem_bytes(ns->hc.rst));
	rc = hc_profile(c, ns, ws);
	if (rc)
		kvfs_warn("ns %s: hcache profiling failed (%s): no plan",
			  ns->rec.name, strerror(-rc));
	return 0;
}

/*
 * The device restorer of @ns ([tier.gpu] restore): the GPU with the cuda
 * backend when it can start (restore = gpu refuses the start otherwise,
 * auto falls back to the CPU, saying why), the CPU into the pool
 * otherwise.  Without a device tier there is none.  A GPU restorer also
 * serves the restoration jobs, and its profile feeds hc_plan().
 */
static int hc_dev_init(struct kvfs_cache *c, struct kvfs_ns *ns)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	struct kvfs_restore_cuda_prof p;
	int want = c->conf.gpu_restore, rc;

	hc->dev = KVFS_HC_DEV_NONE;
	if (!c->tier[KVFS_TIER_GPU] || !c->gops)
		return 0;
	if (c->conf.gpu_backend != KVFS_PARAMS_GPU_CUDA ||
	    want == KVFS_PARAMS_RESTORE_CPU) {
		hc->dev = KVFS_HC_DEV_CPU;
		kvfs_info("ns %s: blocks stored as hidden states are restored "
			  "on the CPU straight into the device pool when it "
			  "loads them ([tier.gpu] restore = %s)", ns->rec.name,
			  want == KVFS_PARAMS_RESTORE_CPU ? "cpu" : "auto");
		return 0;
	}
	rc = kvfs_restore_cuda_init(hc->rst, (int)c->conf.gpu_device, 0,
				    &hc->rc);
	if (rc) {
		hc->rc = NULL;
		if (want == KVFS_PARAMS_RESTORE_GPU) {
			kvfs_err("ns %s: [tier.gpu] restore = gpu, but GPU "
				 "restoration cannot start on CUDA device %u "
				 "(%s): refusing to start", ns->rec.name,
				 c->conf.gpu_device, strerror(-rc));
			return rc;
		}
		hc->dev = KVFS_HC_DEV_CPU;
		kvfs_warn("ns %s: [tier.gpu] restore = auto: GPU restoration "
			  "cannot start on CUDA device %u (%s): blocks stored "
			  "as hidden states are restored on the CPU and "
			  "uploaded", ns->rec.name, c->conf.gpu_device,
			  strerror(-rc));
		return 0;
	}
	hc->dev = KVFS_HC_DEV_GPU;
	kvfs_info("ns %s: blocks stored as hidden states are restored on "
		  "CUDA device %u straight into the device pool, and into "
		  "host memory for reads and restorations ahead of need (%"
		  PRIu64 " bytes of weights there)", ns->rec.name,
		  c->conf.gpu_device, kvfs_restore_cuda_mem_bytes(hc->rc));
	rc = kvfs_restore_cuda_profile(hc->rc, ns->geom.block_tokens,
				       ns->geom.dtype, &p);
	if (rc) {
		kvfs_warn("ns %s: hcache: the GPU could not be profiled (%s)",
			  ns->rec.name, strerror(-rc));
		return 0;
	}
	hc->gpu_profiled = true;
	hc->gpu_compute = p.compute;
	hc->gpu_h2d_hidden = p.h2d_hidden;
	hc->gpu_h2d_kv = p.h2d_kv;
	kvfs_info("ns %s: hcache GPU profile per layer of a %u-token block: "
		  "projection %.1f us (GEMM %.1f), H2D hidden %.1f us, KV "
		  "%.1f us", ns->rec.name, ns->geom.block_tokens,
		  p.compute * 1e6, p.gemm * 1e6, p.h2d_hidden * 1e6,
		  p.h2d_kv * 1e6);
	return 0;
}

/* ---------------------------------------------------------- lifecycle */

int kvfs_rpool_start(struct kvfs_cache *c)
{
	struct kvfs_restore_ws *ws = NULL;
	struct kvfs_rpool *rp;
	unsigned want = 0;
	int rc = 0;

	rp = calloc(1, sizeof(*rp));
	if (!rp)
		return -ENOMEM;
	pthread_mutex_init(&rp->lock, NULL);
	pthread_cond_init(&rp->work, NULL);
	pthread_cond_init(&rp->done, NULL);
	c->rpool = rp;
	rc = kvfs_restore_ws_alloc(&ws);
	if (rc)
		return rc;
	for (size_t i = 0; i < c->n_ns && !rc; i++) {
		struct kvfs_ns *ns = &c->ns[i];
		const struct kvfs_ns_params *cn = conf_ns(c, ns->rec.name);

		if (!cn || !cn->hc.weights[0])
			continue;
		/* The device restorer first: its profile feeds the plans,
		 * and the plans the split HIDDEN writes are stored with.
		 */
		rc = hc_load(c, ns, cn, ws);
		if (!rc)
			rc = hc_dev_init(c, ns);
		if (!rc)
			rc = hc_plan(ns);
		if (!rc)
			rc = hc_decide(ns, cn);
		want = RPOOL_THREADS;
	}
	kvfs_restore_ws_free(ws);
	if (rc || !want || (c->flags & KVFS_CACHE_NOTHREADS))
		return rc;
	/* OpenBLAS's workers are process-wide: share the CPUs between the
	 * restoration threads (and keep some for the FUSE workers).
	 */
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int blas = cpus > 0 ? (int)(cpus / (long)want) : 1;

	kvfs_restore_set_blas_threads(blas < 1 ? 1 : blas > 4 ? 4 : blas);
	for (unsigned i = 0; i < want; i++) {
		rc = -pthread_create(&rp->thr[i], NULL, rpool_main, c);
		if (rc) {
			kvfs_err("starting a restoration thread failed: %s",
				 strerror(-rc));
			return rc;
		}
		rp->n_threads++;
	}
	kvfs_info("%u restoration threads started", rp->n_threads);
	return 0;
}

void kvfs_rpool_stop(struct kvfs_cache *c)
{
	struct kvfs_rpool *rp = c->rpool;
	unsigned n;

	if (!rp)
		return;
	pthread_mutex_lock(&rp->lock);
	rp->stop = true;
	n = rp->n_threads;
	pthread_cond_broadcast(&rp->work);
	pthread_mutex_unlock(&rp->lock);
	for (unsigned i = 0; i < n; i++)
		pthread_join(rp->thr[i], NULL);
	pthread_mutex_lock(&rp->lock);
	rp->n_threads = 0;
	pthread_mutex_unlock(&rp->lock);
}

void kvfs_rpool_free(struct kvfs_cache *c)
{
	struct kvfs_rpool *rp = c->rpool;

	if (rp) {
		kvfs_rpool_stop(c);
		pthread_mutex_destroy(&rp->lock);
		pthread_cond_destroy(&rp->work);
		pthread_cond_destroy(&rp->done);
		kvfs_restore_ws_free(rp->dev_ws);
		free(rp);
		c->rpool = NULL;
	}
	for (size_t i = 0; i < c->n_ns; i++) {
		kvfs_restore_cuda_free(c->ns[i].hc.rc);
		c->ns[i].hc.rc = NULL;
		kvfs_restore_free(c->ns[i].hc.rst);
		c->ns[i].hc.rst = NULL;
	}
}

/* ---------------------------------------------------------------- stats */

static const char *const store_names[] = { "kv", "hidden", "auto" };

void kvfs_rpool_stats(struct kvfs_cache *c, FILE *f)
{
	uint64_t stored = atomic_load(&c->st_hidden_stored);
	uint64_t kv = atomic_load(&c->st_hidden_kv);

#define CS(k, v) fprintf(f, "%s %" PRIu64 "\n", k, (uint64_t)(v))
	CS("cache.hidden_blocks", atomic_load(&c->st_hidden_blocks));
	CS("cache.mixed_blocks", atomic_load(&c->st_mixed_blocks));
	CS("cache.hidden_stored_bytes", stored);
	CS("cache.hidden_kv_bytes", kv);
	fprintf(f, "cache.hidden_bytes_saved %" PRId64 "\n",
		(int64_t)(kv - stored));
	CS("restore.blocks", atomic_load(&c->st_restores));
	CS("restore.ns_total", atomic_load(&c->st_restore_ns));
	CS("restore.waits", atomic_load(&c->st_restore_waits));
	CS("restore.joined", atomic_load(&c->st_restore_joined));
	CS("restore.ahead", atomic_load(&c->st_restore_ahead));
	CS("restore.private", atomic_load(&c->st_restore_private));
	CS("restore.from_pool", atomic_load(&c->st_restore_from_pool));
	CS("restore.errors", atomic_load(&c->st_restore_errors));
	CS("restore.commit_conversions", atomic_load(&c->st_converted));
	CS("restore.commit_splits", atomic_load(&c->st_splits));
	CS("restore.pipelined", atomic_load(&c->st_pipelined));
	CS("restore.to_device", atomic_load(&c->st_restore_dev));
	CS("restore.to_device_gpu", atomic_load(&c->st_restore_gpu));
	CS("restore.to_device_fallbacks",
	   atomic_load(&c->st_restore_dev_fallback));
	CS("restore.gpu_blocks", atomic_load(&c->st_restore_gpu_blocks));
	CS("restore.gpu_fallbacks",
	   atomic_load(&c->st_restore_gpu_fallbacks));
	CS("restore.threads", c->rpool ? c->rpool->n_threads : 0);
#undef CS
	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];
		struct kvfs_hc_ns *hc = &ns->hc;
		const char *nm = ns->rec.name;

		if (!hc->rst && !atomic_load(&hc->hidden_blocks))
			continue;
#define NS(k, fmt, v) fprintf(f, "ns.%s.hcache.%s " fmt "\n", nm, k, v)
		NS("store_as", "%s",
		   ns->rec.store_as <= KVFS_STORE_AUTO ?
			   store_names[ns->rec.store_as] :
			   "unknown");
		NS("hidden_writes_kept_as", "%s",
		   hc->kv_from == ns->geom.n_layers ? "hidden" :
		   hc->kv_from ? "mixed" : "kv");
		NS("kv_from", "%u", hc->kv_from);
		NS("kv_from_source", "%s",
		   ns->rec.store_as != KVFS_STORE_AUTO ? "store_as" :
		   hc->kv_fixed ? "hcache_kv_layers" :
		   hc->planned && hc->ssd_profiled ? "ssd_plan" : "no_plan");
		NS("weights", "%d", hc->rst ? 1 : 0);
		NS("hidden_blocks", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->hidden_blocks));
		NS("restored", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->restored));
		NS("mixed_blocks", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->mixed_blocks));
		NS("converted", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->converted));
		NS("split", "%" PRIu64, (uint64_t)atomic_load(&hc->splits));
		NS("device_restore", "%s",
		   hc->dev == KVFS_HC_DEV_GPU ? "gpu" :
		   hc->dev == KVFS_HC_DEV_CPU ? "cpu" : "none");
		if (hc->gpu_profiled) {
			NS("profile.gpu.compute_ns", "%" PRIu64,
			   (uint64_t)llround(hc->gpu_compute * 1e9));
			NS("profile.gpu.h2d_hidden_ns", "%" PRIu64,
			   (uint64_t)llround(hc->gpu_h2d_hidden * 1e9));
			NS("profile.gpu.h2d_kv_ns", "%" PRIu64,
			   (uint64_t)llround(hc->gpu_h2d_kv * 1e9));
		}
		if (!hc->planned)
			continue;
		NS("profile.compute_ns", "%" PRIu64,
		   (uint64_t)llround(hc->prof.c_hidden * 1e9));
		NS("plan.compute", "%s", hc->plan_gpu ? "gpu" : "cpu");
		NS("profile.recompute", "%s", "none");
		for (int t = KVFS_TIER_DRAM; t <= KVFS_TIER_SSD; t++) {
			const struct kvfs_hsched_plan *p = &hc->plan[t];
			const char *tn = kvfs_tier_name(t);

			if (t == KVFS_TIER_SSD && !hc->ssd_profiled)
				continue;
#define TS(a, b, fmt, v) \
	fprintf(f, "ns.%s.hcache.%s.%s.%s " fmt "\n", nm, a, tn, b, v)
			TS("profile", "io_hidden_ns", "%" PRIu64,
			   (uint64_t)llround(hc->prof.io_hidden[t] * 1e9));
			TS("profile", "io_kv_ns", "%" PRIu64,
			   (uint64_t)llround(hc->prof.io_kv[t] * 1e9));
			TS("plan", "mode", "%s", mode_name(p->mode));
			TS("plan", "hidden_layers", "%u", p->n_hidden);
			TS("plan", "kv_layers", "%u", p->n_kv);
			TS("plan", "recompute_layers", "%u", p->n_recompute);
			TS("plan", "t_total_ns", "%" PRIu64,
			   (uint64_t)llround(p->t_total * 1e9));
#undef TS
		}
#undef NS
	}
}
