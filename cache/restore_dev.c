/* SPDX-License-Identifier: MIT */
/*
 * Restoration straight into the device pool (cache/rpool_i.h), for FETCH,
 * PREFETCH to the GPU and promotion: the KV image of a block stored as
 * hidden states is built in the pool extent itself, on the GPU restorer
 * or on the CPU, with no KV image in DRAM.  Blocks go in windows of
 * DEV_BATCH: on the GPU, a window's restorations share each layer's GEMM
 * (kvfs_restore_cuda_blocks()).
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

/* Blocks whose restorations go through the GPU restorer together: 512
 * rows of 16-token blocks per GEMM, and as many stored images held at
 * once (private SSD copies included) as a window may take.
 */
#define DEV_BATCH 32

/* One block of a window. */
struct dev_job {
	struct kvfs_block *b;
	const struct kvfs_extent *e;
	struct kvfs_rpool_src s;
	void *priv, *pin;               /* s.p's owner when not in DRAM */
	struct kvfs_restore_io io;      /* on the GPU: the request */
	uint64_t so, ko;                /* MIXED: the K/V tail, stored and
					 * in the KV image */
	uint64_t t0;
	int rc;                         /* 0 while it goes on */
	bool open;                      /* b->opens counts us */
};

/*
 * Take @j's block as a reader and its stored image: the DRAM copy (held
 * under b->readers) or a private, verified load from the SSD, in
 * page-locked memory when the GPU restores it (which then reads it
 * without a CPU copy).  Sets j->rc: 0 to go on, 1 for the usual path, or
 * -errno.
 */
static void job_open(struct kvfs_cache *c, struct dev_job *j)
{
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_block *b = j->b;
	struct kvfs_hc_ns *hc = &b->ns->hc;
	struct kvfs_extent sx;
	uint64_t priv_len = 0;
	int rc;

	j->t0 = kvfs_util_now_mono();
	if (!rp || !hc->rst || hc->dev == KVFS_HC_DEV_NONE ||
	    !c->tier[KVFS_TIER_GPU] || !c->gops ||
	    !kvfs_block_needs_restore(b) || j->e->len < b->size) {
		j->rc = 1;
		return;
	}
	/* A restoration under way puts the KV image in DRAM: the usual
	 * path joins it rather than restoring a second time.
	 */
	if (kvfs_rpool_busy(c, b)) {
		j->rc = 1;
		return;
	}
	/* As a reader: a delete cannot free the copies meanwhile. */
	atomic_fetch_add(&b->opens, 1);
	j->open = true;
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		j->rc = -ENOENT;
		return;
	}
	rc = kvfs_rpool_src_get(b, &j->s);
	if (rc == -ENOENT) {
		/* Only on the SSD: a private copy, which never takes DRAM
		 * room.
		 */
		pthread_mutex_lock(&b->io_lock);
		if (hc->dev == KVFS_HC_DEV_GPU &&
		    !kvfs_block_ssd_get(b, &sx) &&
		    !kvfs_restore_cuda_host_get(hc->rc, sx.len, &j->pin)) {
			rc = kvfs_block_read_ssd(c, b, j->pin, sx.len);
		} else {
			rc = kvfs_block_load(c, b, KVFS_LOAD_PRIV, &j->priv,
					     &priv_len);
		}
		pthread_mutex_unlock(&b->io_lock);
		if (!rc)
			j->s = (struct kvfs_rpool_src){
				.p = j->pin ? j->pin : j->priv,
				.len = b->ssize
			};
	}
	/* 1: the DRAM copy is the KV image */
	j->rc = rc;
}

/* Count a success, log a failure, and let go of what job_open() took. */
static void job_close(struct kvfs_cache *c, struct dev_job *j, bool *nocrc,
		      int *res)
{
	struct kvfs_block *b = j->b;
	struct kvfs_ns *ns = b->ns;
	struct kvfs_hc_ns *hc = &ns->hc;
	char hex[KVFS_KEY_HEX_LEN + 1];

	*nocrc = false;
	*res = j->rc;
	if (!j->open)
		return;
	kvfs_rpool_src_put(b, &j->s);
	if (!j->rc) {
		*nocrc = hc->dev == KVFS_HC_DEV_GPU;
		atomic_fetch_add(&c->st_restores, 1);
		atomic_fetch_add(&hc->restored, 1);
		atomic_fetch_add(&c->st_restore_dev, 1);
		if (hc->dev == KVFS_HC_DEV_GPU)
			atomic_fetch_add(&c->st_restore_gpu, 1);
		atomic_fetch_add(&c->st_restore_ns,
				 kvfs_util_now_mono() - j->t0);
	}
	kvfs_restore_cuda_host_put(hc->rc, j->pin);
	free(j->priv);
	if (j->rc < 0 && j->rc != -ENOENT && j->rc != -EBADMSG) {
		kvfs_fmt_key_hex(b->pn.key, hex);
		kvfs_err("ns %s: restoring block %s.kv into the device pool "
			 "on the %s failed: %s",
			 ns->rec.name, hex,
			 hc->dev == KVFS_HC_DEV_GPU ? "GPU" : "CPU",
			 strerror(-j->rc));
	}
	atomic_fetch_sub(&b->opens, 1);
	kvfs_block_try_free(c, b);
}

/*
 * The request that projects @j's hidden layers (those below the stored
 * kv_from) from host memory into its extent's device address, and where
 * a MIXED image's K/V tail goes.  0, -EINVAL (an image that does not
 * match the block), or the tier's error for the address.
 */
static int gpu_prep(struct kvfs_cache *c, struct dev_job *j)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_fmt_hdr hd;
	uint64_t size;
	uint8_t *dev = NULL;
	int rc;

	if (kvfs_rpool_gpu_req(j->b->ns, j->s.p, j->s.len, &hd, &size,
			       &j->io) ||
	    hd.n_tokens != j->b->n_tokens || size != j->b->size ||
	    size > j->e->len)
		return -EINVAL;
	if (j->io.n_layers < j->b->ns->geom.n_layers &&
	    kvfs_rpool_gpu_kv_tail(&j->b->ns->geom, hd.n_tokens,
				   j->io.n_layers, j->s.len, size, &j->so,
				   &j->ko))
		return -EINVAL;
	rc = c->gops->extent_addr(gpu, j->e, (void **)&dev);
	if (rc)
		return rc;
	j->io.kv = dev + kvfs_fmt_payload_off(hd.n_tokens);
	j->io.flags = KVFS_RC_KV_DEVICE;
	return 0;
}

/*
 * After the projection: the header, with kind KV and its payload CRC
 * left for kvfs_fmt_img_seal() (the payload is not in host memory to
 * sum), the token ids and the layers stored as K and V, uploaded as they
 * are.  0, -ENOMEM, or the tier's upload error.
 */
static int gpu_rest(struct kvfs_cache *c, struct dev_job *j)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	const struct kvfs_geom *g = &j->b->ns->geom;
	struct kvfs_gpu_xfer x[2] = { { 0 } };
	uint32_t n = j->b->n_tokens, src_from = j->io.n_layers;
	uint64_t po = kvfs_fmt_payload_off(n), size = j->b->size;
	uint8_t *head;
	size_t nx = 1;
	int rc;

	head = malloc(po);
	if (!head)
		return -ENOMEM;
	memcpy(head, j->s.p, po);
	kvfs_util_put16(head + offsetof(struct kvfs_fmt_hdr, kind),
			KVFS_KIND_KV);
	kvfs_util_put16(head + offsetof(struct kvfs_fmt_hdr, kv_from), 0);
	kvfs_util_put32(head + offsetof(struct kvfs_fmt_hdr, payload_crc), 0);
	kvfs_util_put32(
		head + offsetof(struct kvfs_fmt_hdr, hdr_crc),
		kvfs_fmt_crc32c(0, head,
				offsetof(struct kvfs_fmt_hdr, hdr_crc)));
	x[0] = (struct kvfs_gpu_xfer){ .pool = j->e, .host = head, .len = po };
	if (src_from < g->n_layers) {
		x[1] = (struct kvfs_gpu_xfer){ .pool = j->e,
					       .host = (void *)(j->s.p + j->so),
					       .off = j->ko,
					       .len = size - j->ko };
		nx = 2;
	}
	rc = c->gops->upload(gpu, x, nx);
	free(head);
	return rc;
}

/*
 * The GPU jobs of a window (rc 0, namespace on the GPU): requests built,
 * then each set that shares a restorer and a layer count (MIXED images
 * stop at their kv_from) through kvfs_restore_cuda_blocks() at once; a
 * failure of the set is every member's.
 */
static void gpu_window(struct kvfs_cache *c, struct dev_job *j, size_t n)
{
	struct kvfs_restore_io io[DEV_BATCH];
	struct dev_job *set[DEV_BATCH];
	bool done[DEV_BATCH] = { false };

	for (size_t i = 0; i < n; i++) {
		if (j[i].rc || j[i].b->ns->hc.dev != KVFS_HC_DEV_GPU)
			done[i] = true;
		else if ((j[i].rc = gpu_prep(c, &j[i])))
			done[i] = true;
	}
	for (size_t i = 0; i < n; i++) {
		struct kvfs_restore_cuda *rst = j[i].b->ns->hc.rc;
		size_t k = 0;
		int ret;

		if (done[i])
			continue;
		for (size_t m = i; m < n; m++) {
			if (done[m] || j[m].b->ns->hc.rc != rst ||
			    j[m].io.n_layers != j[i].io.n_layers)
				continue;
			done[m] = true;
			io[k] = j[m].io;
			set[k++] = &j[m];
		}
		ret = kvfs_restore_cuda_blocks(rst, io, k);
		for (size_t m = 0; m < k; m++)
			set[m]->rc = ret ? ret : gpu_rest(c, set[m]);
	}
}

int kvfs_rpool_to_device(struct kvfs_cache *c, struct kvfs_block **b,
			 const struct kvfs_extent *e, bool *nocrc, int *res,
			 size_t n)
{
	struct dev_job *j;

	j = calloc(n < DEV_BATCH ? (n ? n : 1) : DEV_BATCH, sizeof(*j));
	if (!j)
		return -ENOMEM;
	for (size_t w = 0; w < n; w += DEV_BATCH) {
		size_t k = n - w < DEV_BATCH ? n - w : DEV_BATCH;

		memset(j, 0, k * sizeof(*j));
		for (size_t i = 0; i < k; i++) {
			j[i].b = b[w + i];
			j[i].e = &e[w + i];
			job_open(c, &j[i]);
		}
		gpu_window(c, j, k);
		for (size_t i = 0; i < k; i++)
			if (!j[i].rc &&
			    j[i].b->ns->hc.dev != KVFS_HC_DEV_GPU)
				j[i].rc = dev_cpu(c, j[i].b, &j[i].s, j[i].e);
		for (size_t i = 0; i < k; i++)
			job_close(c, &j[i], &nocrc[w + i], &res[w + i]);
	}
	free(j);
	return 0;
}
