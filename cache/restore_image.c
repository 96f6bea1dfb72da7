/* SPDX-License-Identifier: MIT */
/*
 * The images of hidden-state restoration (cache/rpool_i.h): the KV image,
 * or the MIXED one a HIDDEN write is stored as, built from a stored
 * HIDDEN or MIXED image on the CPU, or on the namespace's GPU restorer
 * from host memory for a read; and the look at a block's DRAM copy that
 * tells a stored image from the KV image it was replaced by.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rpool_i.h"
#include "gpu/restore_cuda.h"
#include "meta/log.h"
#include "meta/util.h"

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
			 fe != KVFS_FMT_OK	 ? kvfs_fmt_strerror(fe) :
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

int kvfs_rpool_gpu_req(struct kvfs_ns *ns, const uint8_t *h, uint64_t h_len,
		       struct kvfs_fmt_hdr *hd, uint64_t *size,
		       struct kvfs_restore_io *io)
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

int kvfs_rpool_gpu_kv_tail(const struct kvfs_geom *g, uint32_t n,
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
static int rpool_build_gpu(struct kvfs_ns *ns, const uint8_t *h, uint64_t h_len,
			   uint8_t *dst, uint64_t dst_len)
{
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_restore_io io;
	struct kvfs_fmt_hdr hd;
	uint64_t size, po, so = 0, ko = 0;
	uint32_t *tok, src_from;
	int rc;

	if (!ns->hc.rc)
		return -ENODEV;
	rc = kvfs_rpool_gpu_req(ns, h, h_len, &hd, &size, &io);
	if (rc || size > dst_len)
		return -EINVAL;
	src_from = kvfs_fmt_hdr_kv_from(&hd);
	po = kvfs_fmt_payload_off(hd.n_tokens);
	if (src_from < g->n_layers &&
	    kvfs_rpool_gpu_kv_tail(g, hd.n_tokens, src_from, h_len, size, &so,
				   &ko))
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

int kvfs_rpool_build_read(struct kvfs_cache *c, struct kvfs_block *b,
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
			  "(%s): restoring it on the CPU",
			  ns->rec.name, hex, strerror(-rc));
		atomic_fetch_add(&c->st_restore_gpu_fallbacks, 1);
	}
	return kvfs_rpool_build(ns, ws, h, h_len, 0, dst, dst_len);
}

/* -------------------------------------------- the stored image in DRAM */

/* The readers count keeps the copy from being freed (eviction and
 * dram_swap() in restore_jobs.c wait for it to drop).
 */
int kvfs_rpool_src_get(struct kvfs_block *b, struct kvfs_rpool_src *s)
{
	uint8_t *p;

	memset(s, 0, sizeof(*s));
	atomic_fetch_add(&b->readers, 1);
	p = atomic_load(&b->dram_ptr);
	if (!p || kvfs_fmt_img_kind(p) == KVFS_KIND_KV) {
		atomic_fetch_sub(&b->readers, 1);
		return p ? 1 : -ENOENT;
	}
	s->p = p;
	s->len = b->ssize;
	s->in_dram = true;
	return 0;
}

void kvfs_rpool_src_put(struct kvfs_block *b, struct kvfs_rpool_src *s)
{
	if (s->in_dram)
		atomic_fetch_sub(&b->readers, 1);
	memset(s, 0, sizeof(*s));
}

bool kvfs_rpool_dram_is_kv(struct kvfs_block *b)
{
	const uint8_t *p;
	bool kv;

	atomic_fetch_add(&b->readers, 1);
	p = atomic_load(&b->dram_ptr);
	kv = p && kvfs_fmt_img_kind(p) == KVFS_KIND_KV;
	atomic_fetch_sub(&b->readers, 1);
	return kv;
}
