/* SPDX-License-Identifier: MIT */
/*
 * Restoration straight into the device pool (cache/rpool_i.h), for FETCH,
 * PREFETCH to the GPU and promotion: the KV image of a block stored as
 * hidden states is built in the pool extent itself, on the GPU restorer
 * or on the CPU, with no KV image in DRAM.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rpool_i.h"
#include "gpu/restore_cuda.h"
#include "meta/log.h"
#include "meta/util.h"

/*
 * On the CPU: into the extent's host mapping (shm), or, where the pool
 * has none (cuda), into a bounce buffer uploaded at once.  The image is
 * complete, CRCs included.
 */
static int dev_cpu(struct kvfs_cache *c, struct kvfs_block *b,
		   const struct kvfs_rpool_src *s, const struct kvfs_extent *e)
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
 * left for kvfs_fmt_img_seal() (the payload is not in host memory to sum).
 */
static int dev_gpu(struct kvfs_cache *c, struct kvfs_block *b,
		   const struct kvfs_rpool_src *s, const struct kvfs_extent *e)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_ns *ns = b->ns;
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_restore_io io;
	struct kvfs_gpu_xfer x[2] = { { 0 } };
	struct kvfs_fmt_hdr hd;
	uint64_t po, size, so = 0, ko = 0;
	uint32_t src_from;
	uint8_t *head, *dev = NULL;
	size_t nx = 1;
	int rc;

	if (kvfs_rpool_gpu_req(ns, s->p, s->len, &hd, &size, &io) ||
	    hd.n_tokens != b->n_tokens || size != b->size || size > e->len)
		return -EINVAL;
	src_from = kvfs_fmt_hdr_kv_from(&hd);
	po = kvfs_fmt_payload_off(hd.n_tokens);
	if (src_from < g->n_layers &&
	    kvfs_rpool_gpu_kv_tail(g, hd.n_tokens, src_from, s->len, size, &so,
				   &ko))
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
	kvfs_util_put32(
		head + offsetof(struct kvfs_fmt_hdr, hdr_crc),
		kvfs_fmt_crc32c(0, head,
				offsetof(struct kvfs_fmt_hdr, hdr_crc)));
	x[0] = (struct kvfs_gpu_xfer){ .pool = e, .host = head, .len = po };
	if (src_from < g->n_layers) {
		x[1] = (struct kvfs_gpu_xfer){ .pool = e,
					       .host = (void *)(s->p + so),
					       .off = ko,
					       .len = size - ko };
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
	struct kvfs_extent sx;
	void *priv = NULL, *pin = NULL;
	struct kvfs_rpool_src s;
	int rc;

	*nocrc = false;
	if (!rp || !hc->rst || hc->dev == KVFS_HC_DEV_NONE ||
	    !c->tier[KVFS_TIER_GPU] || !c->gops ||
	    !kvfs_block_needs_restore(b) || e->len < b->size)
		return 1;
	/* A restoration under way puts the KV image in DRAM: the usual
	 * path joins it rather than restoring a second time.
	 */
	if (kvfs_rpool_busy(c, b))
		return 1;
	/* As a reader: a delete cannot free the copies meanwhile. */
	atomic_fetch_add(&b->opens, 1);
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		rc = -ENOENT;
		goto out_close;
	}
	rc = kvfs_rpool_src_get(b, &s);
	if (rc == -ENOENT) {
		/* Only on the SSD: a private, verified copy of the stored
		 * image, which never takes DRAM room; in page-locked memory
		 * when the GPU restores it, which then reads it without a
		 * CPU copy.
		 */
		pthread_mutex_lock(&b->io_lock);
		if (hc->dev == KVFS_HC_DEV_GPU &&
		    !kvfs_block_ssd_get(b, &sx) &&
		    !kvfs_restore_cuda_host_get(hc->rc, sx.len, &pin)) {
			rc = kvfs_block_read_ssd(c, b, pin, sx.len);
		} else {
			rc = kvfs_block_load(c, b, KVFS_LOAD_PRIV, &priv,
					     &priv_len);
		}
		pthread_mutex_unlock(&b->io_lock);
		if (rc)
			goto out_close;
		s = (struct kvfs_rpool_src){ .p = pin ? pin : priv,
					     .len = b->ssize };
	} else if (rc) {
		goto out_close; /* 1: the DRAM copy is the KV image */
	}
	rc = hc->dev == KVFS_HC_DEV_GPU ? dev_gpu(c, b, &s, e) :
					  dev_cpu(c, b, &s, e);
	kvfs_rpool_src_put(b, &s);
	if (!rc) {
		*nocrc = hc->dev == KVFS_HC_DEV_GPU;
		atomic_fetch_add(&c->st_restores, 1);
		atomic_fetch_add(&hc->restored, 1);
		atomic_fetch_add(&c->st_restore_dev, 1);
		if (hc->dev == KVFS_HC_DEV_GPU)
			atomic_fetch_add(&c->st_restore_gpu, 1);
		atomic_fetch_add(&c->st_restore_ns, kvfs_util_now_mono() - t0);
	}
out_close:
	kvfs_restore_cuda_host_put(hc->rc, pin);
	free(priv);
	if (rc < 0 && rc != -ENOENT && rc != -EBADMSG) {
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_err("ns %s: restoring block %s.kv into the device pool "
			 "on the %s failed: %s",
			 ns->rec.name, hex,
			 hc->dev == KVFS_HC_DEV_GPU ? "GPU" : "CPU",
			 strerror(-rc));
	}
	atomic_fetch_sub(&b->opens, 1);
	kvfs_block_try_free(c, b);
	return rc;
}
