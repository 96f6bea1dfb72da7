/* SPDX-License-Identifier: MIT */
/*
 * The pipelined restore straight from the SSD (cache/rpool_i.h,
 * kvfs_cache_restore_stream() in cache/cache.h): a block's stored image is
 * read one layer range at a time and each layer is projected, on the GPU
 * restorer or the CPU, as soon as it and all before it are in; the whole
 * image is verified before the result is used.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rpool_i.h"
#include "gpu/restore_cuda.h"
#include "meta/log.h"
#include "meta/util.h"

/* ----------------------------------------------- restoring from the SSD */

/* The state of one kvfs_cache_restore_stream(): ranges complete in any
 * order, layers are processed in order.  Only the thread running the
 * tier's readv (the done callbacks run on it) touches it.
 */
struct rs_ctx {
	struct kvfs_restore_stream *rs;
	struct kvfs_restore_ws *ws;
	struct kvfs_tier_io *io;
	uint32_t *upto; /* per range: layers below it are in once it is */
	bool *done; /* per range */
	size_t nr; /* ranges */
	size_t next; /* first range not yet processed */
	uint32_t layer; /* next layer to process */
	bool tokens; /* the token area is in the CRC */
	uint32_t crc; /* payload CRC of what was processed */
	/* The KV image's payload CRC, summed as its layers are done so
	 * that the sum overlaps the reads of later layers: over @rs->dst's
	 * token area and layers [0, kv_sum), which end at @kv_end.
	 */
	uint32_t kv_crc;
	uint32_t kv_sum;
	uint64_t kv_end;
	uint32_t *tok; /* the token ids, once the token area is in */
	uint64_t po; /* payload offset */
	int err; /* first failure, read or restore */
};

/*
 * Hidden layers [@l, @l + @n) on the GPU as one run.  The format lays
 * out a split image's hidden layers, and a KV image's layers, one after
 * the other at one stride each (meta/fmt.h), which is what a run of
 * kvfs_restore_cuda_layers() reads and writes.  Returns 0, or the GPU's
 * -errno after marking @rs->gpu_failed (logged): the caller then
 * projects those layers on the CPU, which rewrites whatever the failed
 * call left.
 */
static int rs_gpu(struct rs_ctx *x, uint32_t l, uint32_t n)
{
	struct kvfs_restore_stream *rs = x->rs;
	const struct kvfs_geom *g = rs->g;
	uint64_t so, sl, ko, kl, t0;
	int rc;

	if (kvfs_fmt_layer_range(g, rs->n_tokens, rs->kv_from, l, &so, &sl) ||
	    kvfs_fmt_layer_range(g, rs->n_tokens, 0, l, &ko, &kl))
		return -EINVAL;
	t0 = kvfs_util_now_mono();
	rc = kvfs_restore_cuda_layers(rs->rc, l, n, rs->img + so, g->dtype,
				      rs->start_pos, rs->n_tokens,
				      g->chunk_tokens, rs->dst + ko, g->dtype,
				      0);
	rs->ns_gpu += kvfs_util_now_mono() - t0;
	rs->gpu_runs++;
	if (rc) {
		kvfs_warn("restore: the GPU failed on layers %u-%u (%s): this "
			  "block's other layers are projected on the CPU",
			  l, l + n - 1, strerror(-rc));
		rs->gpu_failed = true;
	} else {
		rs->gpu_layers += n;
	}
	return rc;
}

/*
 * Add the KV image's layers done since the last call, [x->kv_sum,
 * x->layer), to its payload CRC, their padding rows cleared first as
 * kvfs_fmt_build() would.  The layers lie one after the other from the
 * payload's start (meta/fmt.h); -EINVAL if the layout says otherwise.
 */
static int rs_kv_sum(struct rs_ctx *x)
{
	struct kvfs_restore_stream *rs = x->rs;
	uint64_t ko, kl;

	for (; x->kv_sum < x->layer; x->kv_sum++) {
		if (kvfs_fmt_layer_range(rs->g, rs->n_tokens, 0, x->kv_sum, &ko,
					 &kl) ||
		    ko != x->kv_end)
			return -EINVAL;
		kvfs_fmt_layer_tail_clear(rs->g, 0, rs->n_tokens, x->kv_sum,
					  rs->dst);
		x->kv_crc = kvfs_fmt_crc32c(x->kv_crc, rs->dst + ko, kl);
		x->kv_end = ko + kl;
	}
	return 0;
}

/*
 * Project or copy layers [x->layer, @upto), adding them to the CRC.  With
 * a GPU restorer the hidden layers among them go to it in one run
 * (rs_gpu()), so that layers which arrived together are uploaded and
 * projected back to back instead of one wait each.
 */
static int rs_layers_do(struct rs_ctx *x, uint32_t upto)
{
	struct kvfs_restore_stream *rs = x->rs;
	const struct kvfs_geom *g = rs->g;
	uint32_t gpu_end = x->layer; /* layers below it the GPU has done */
	uint64_t so, sl, ko, kl;
	int rc;

	if (!x->tokens) {
		x->crc = kvfs_fmt_crc32c(0, rs->img + KVFS_FMT_HDR_SIZE,
					 x->po - KVFS_FMT_HDR_SIZE);
		for (uint32_t i = 0; i < rs->n_tokens; i++)
			x->tok[i] = kvfs_util_get32(rs->img + KVFS_FMT_HDR_SIZE +
						    4ull * i);
		kvfs_fmt_tokens_put(rs->dst, x->tok, rs->n_tokens);
		x->kv_crc = kvfs_fmt_crc32c(0, rs->dst + KVFS_FMT_HDR_SIZE,
					    x->po - KVFS_FMT_HDR_SIZE);
		x->kv_end = x->po;
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
			if (l < gpu_end) {
				rc = 0;
			} else if (rs->rc && !rs->gpu_failed) {
				uint32_t end = upto < rs->kv_from ? upto :
								    rs->kv_from;

				rc = rs_gpu(x, l, end - l);
				if (!rc)
					gpu_end = end;
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
	return rs_kv_sum(x);
}

/* rs_layers_do(), its time less the GPU's counted as the CPU's. */
static int rs_layers(struct rs_ctx *x, uint32_t upto)
{
	struct kvfs_restore_stream *rs = x->rs;
	uint64_t t0 = kvfs_util_now_mono(), gpu = rs->ns_gpu;
	int rc = rs_layers_do(x, upto);

	rs->ns_cpu += kvfs_util_now_mono() - t0 - (rs->ns_gpu - gpu);
	return rc;
}

/* Ranges arrived: process every layer whose bytes, and all before them,
 * are now in, in one go.
 */
static void rs_done(struct kvfs_tier_io *io, void *arg)
{
	struct rs_ctx *x = arg;
	size_t next = x->next;

	x->done[io - x->io] = true;
	if (io->res && !x->err)
		x->err = io->res;
	while (next < x->nr && x->done[next])
		next++;
	if (!x->err && next > x->next)
		x->err = rs_layers(x, x->upto[next - 1]);
	x->next = next;
}

/* The image must be the block the record describes.  @crc: check the
 * payload CRC here; otherwise compare @payload_crc, computed as it
 * streamed.
 */
static int rs_verify(struct kvfs_restore_stream *rs, uint64_t ssize, bool crc,
		     uint32_t payload_crc, struct kvfs_fmt_hdr *h)
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
	uint64_t ssize, size, prev = 0, t_in = 0;
	uint32_t *tok = NULL;
	int rc;

	if (!rs || !rs->ssd || !rs->ext || !g || !rs->rst || !rs->img ||
	    !rs->dst || !rs->key || !rs->root || !rs->kv_from ||
	    rs->kv_from > g->n_layers)
		return -EINVAL;
	rs->bad = NULL;
	rs->gpu_layers = 0;
	rs->gpu_failed = false;
	rs->ns_gpu = rs->ns_cpu = rs->ns_tail = rs->ns_io = 0;
	rs->gpu_runs = 0;
	ssize = kvfs_fmt_split_file_size(g, rs->n_tokens, rs->kv_from);
	size = kvfs_fmt_file_size(g, KVFS_KIND_KV, rs->n_tokens);
	if (!ssize || ssize > rs->ext->len || !size || size > rs->dst_len) {
		kvfs_err("restore: stream refused: %" PRIu64 "-byte image in a "
			 "%" PRIu64 "-byte extent, %" PRIu64 "-byte KV image "
			 "into %" PRIu64 " bytes",
			 ssize, rs->ext->len, size, rs->dst_len);
		return -EINVAL;
	}
	x.rs = rs;
	x.ws = rs->ws;
	x.po = kvfs_fmt_payload_off(rs->n_tokens);
	x.io = calloc(g->n_layers, sizeof(*x.io));
	x.upto = calloc(g->n_layers, sizeof(*x.upto));
	x.done = calloc(g->n_layers, sizeof(*x.done));
	tok = malloc((size_t)rs->n_tokens * sizeof(*tok));
	x.tok = tok;
	rc = -ENOMEM;
	if (!x.io || !x.upto || !x.done || !tok)
		goto out_free;
	if (!x.ws) {
		rc = kvfs_restore_ws_alloc(&tmp);
		if (rc)
			goto out_free;
		x.ws = tmp;
	}
	t_in = kvfs_util_now_mono();
	if (rs->flags & KVFS_RS_WHOLE) {
		rc = rs->ssd->ops->read(rs->ssd, rs->ext, 0, rs->img,
					rs->ext->len);
		rs->ns_io = kvfs_util_now_mono() - t_in;
		t_in += rs->ns_io;
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
			x.io[x.nr] =
				(struct kvfs_tier_io){ .ext = rs->ext,
						       .off = prev,
						       .len = end - prev,
						       .buf = rs->img + prev,
						       .done = rs_done,
						       .arg = &x };
			x.nr++;
			prev = end;
		}
		x.upto[x.nr - 1] = l + 1;
	}
	t_in = kvfs_util_now_mono();
	rc = rs->ssd->ops->readv(rs->ssd, x.io, x.nr);
	rs->ns_io = kvfs_util_now_mono() - t_in;
	t_in += rs->ns_io;
	if (!rc)
		rc = x.err;
	if (!rc && x.layer != g->n_layers)
		rc = -EIO;
	if (!rc)
		rc = rs_verify(rs, ssize, false, x.crc, &h);
out_build:
	if (rc)
		goto out_free;
	/* The token area and every layer were summed as they were done. */
	if (x.kv_end != size) {
		rc = -EINVAL;
		goto out_free;
	}
	rc = kvfs_fmt_hdr_put(g, 0, h.parent, h.start_pos, rs->n_tokens,
			      x.kv_crc, rs->dst, size);
	if (!rc && rs->dst_len > size)
		memset(rs->dst + size, 0, rs->dst_len - size);
	/* Whole: the layers' work after the read is counted as theirs. */
	rs->ns_tail = kvfs_util_now_mono() - t_in;
	if (rs->flags & KVFS_RS_WHOLE)
		rs->ns_tail -= rs->ns_gpu + rs->ns_cpu;
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
int kvfs_rpool_stream(struct kvfs_cache *c, struct kvfs_block *b,
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
	void *pin = NULL;
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
	/* With a GPU restorer the stored image is read into page-locked
	 * memory, which the GPU reads without a CPU copy; into pageable
	 * memory when none can be had.
	 */
	if (ns->hc.rc && !kvfs_restore_cuda_host_get(ns->hc.rc, sx.len, &pin))
		src = pin;
	else
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
	if (rc == -EBADMSG)
		kvfs_block_ssd_bad(c, b, sx.off, rs.bad, src, b->ssize);
	if (rc)
		goto out_free;
	if (pin)
		kvfs_restore_cuda_host_put(ns->hc.rc, pin);
	else
		free(src);
	if (!keep) {
		*img = dst;
		*img_len = alen;
	}
	return 0;

out_free:
	if (pin)
		kvfs_restore_cuda_host_put(ns->hc.rc, pin);
	else
		free(src);
	if (keep)
		dram->ops->free(dram, &ext);
	else
		free(dst);
	return rc;
}
