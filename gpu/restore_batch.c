/* SPDX-License-Identifier: MIT */
/*
 * Many blocks per GEMM on the GPU restorer (kvfs_restore_cuda_blocks(),
 * gpu/restore_cuda.h).  Restoring one 16-token block a call reads each
 * layer's K/V weights (128 MiB a layer for Llama-2-7B in f32) to multiply
 * 16 rows: the GPU then waits on memory and on the launches, not on
 * arithmetic.  Here the blocks of a round share each layer's norm and
 * GEMM.
 *
 * A round is a run of consecutive requests whose rows fit the handle's
 * batch_rows (64 MiB of projections by default); block i's rows sit at row offset row_i in
 * every round buffer (dx, hx, xn, proj and the RoPE table, which holds
 * each block's own positions).  Per layer, with the events of the
 * per-block pipeline (gpu/restore_cuda.c):
 *   copy stream     each block's rows of layer k + 1 into dx[b ^ 1] at
 *                   its offset (pageable sources through hx[b ^ 1] at the
 *                   same offset), one batched copy call for them all,
 *                   then up_done[b ^ 1];
 *   compute stream  wait up_done[b]; norm and GEMM over all the round's
 *                   rows; x_free[b]; then bias, RoPE and scatter of each
 *                   block from its rows of proj into its KV payload, one
 *                   launch for up to KVFS_RC_SEGS_MAX blocks.
 * So a layer costs the host a handful of calls, not a few per block.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/restore_cuda.h"
#include "meta/fmt.h"
#include "meta/log.h"

#if !defined(KVFS_HAVE_CUDA) || !defined(KVFS_HAVE_CUDA_KERNELS)

int kvfs_restore_cuda_blocks(struct kvfs_restore_cuda *rc,
			     const struct kvfs_restore_io *io, size_t n)
{
	(void)n;
	if (!rc || !io)
		return -EINVAL;
	kvfs_err("restore cuda: this kvfs was built without the CUDA toolkit "
		 "(or without nvcc for its kernels)");
	return -EOPNOTSUPP;
}

#else /* KVFS_HAVE_CUDA && KVFS_HAVE_CUDA_KERNELS */

#include <pthread.h>
#include <stdbool.h>

#define KVFS_CUDA_WHO "restore cuda"
#include "gpu/cuda_i.h"
#include "gpu/host_pool_i.h"
#include "gpu/restore_cuda_i.h"
#include "gpu/restore_handle_i.h"

/* One request of a batch. */
struct bt_blk {
	struct rc_req q;
	uint32_t row;   /* its first row in the round's buffers */
	bool pinned;    /* its hidden payload is page-locked */
};

/* A run of requests that go through the GEMM together. */
struct bt_round {
	struct bt_blk *blk;
	size_t n;
	uint32_t rows;  /* sum of the blocks' n_tokens */
	bool staged;    /* some hidden payload is pageable: hx is used */
	/* One layer's uploads, [n] each, refilled per layer. */
	void **dst;
	const void **src;
	size_t *len;
};

static size_t row_bytes(const struct kvfs_restore_cuda *rc, uint16_t dt)
{
	return (size_t)rc->m.hidden_size * kvfs_fmt_dtype_size(dt);
}

/* Each request as kvfs_restore_cuda_block() checks it, then the rules of
 * a batch.  Reads immutable fields only: no lock.
 */
static int batch_check(struct kvfs_restore_cuda *rc,
		       const struct kvfs_restore_io *io, size_t n,
		       struct bt_blk *blk)
{
	for (size_t i = 0; i < n; i++) {
		const struct rc_req *q = &blk[i].q, *q0 = &blk[0].q;
		int ret = kvfs_rcuda_block_req(rc, &io[i], &blk[i].q);

		if (ret == -EINVAL && (!io[i].hidden || !io[i].kv))
			return kvfs_rcuda_req_bad("a request of the batch "
						  "names no payload");
		if (ret)
			return ret;
		if ((q->flags & KVFS_RC_HIDDEN_DEVICE) ||
		    !(q->flags & KVFS_RC_KV_DEVICE))
			return kvfs_rcuda_req_bad("a batch reads hidden states "
						  "from host memory and writes "
						  "K/V to device memory");
		if (q->xdt != q0->xdt || q->kdt != q0->kdt || q->c != q0->c ||
		    q->first != q0->first || q->count != q0->count)
			return kvfs_rcuda_req_bad("the requests of a batch "
						  "differ in dtype, chunk size "
						  "or layers");
	}
	return 0;
}

/* Where each payload lies, as submit() checks a single request. */
static int batch_where(struct kvfs_restore_cuda *rc, struct bt_blk *blk,
		       size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct rc_req *q = &blk[i].q;
		uint64_t xlen = (uint64_t)(q->count - 1) * q->hl +
				q->n * row_bytes(rc, q->xdt);
		int ret;

		ret = kvfs_rcuda_where_check(rc, q->kv,
					     (uint64_t)q->count * q->kl,
					     kvfs_fmt_dtype_size(q->kdt), true,
					     "KV payload");
		if (!ret && (q->flags & KVFS_RC_HIDDEN_PINNED))
			ret = kvfs_rcuda_where_check(
				rc, q->x, xlen, kvfs_fmt_dtype_size(q->xdt),
				false, "hidden payload");
		if (ret)
			return ret;
		blk[i].pinned = (q->flags & KVFS_RC_HIDDEN_PINNED) ||
				kvfs_host_pinned(q->x, xlen);
	}
	return 0;
}

/* Size the round buffers and write every block's RoPE rows. */
static int round_prepare(struct kvfs_restore_cuda *rc,
			 const struct bt_round *r)
{
	uint32_t hd = rc->m.head_dim;
	size_t rows = r->rows, xb = rows * row_bytes(rc, r->blk[0].q.xdt);
	size_t xn = rows * rc->m.hidden_size *
		    ((rc->flags & KVFS_RESTORE_CUDA_BF16) ? 2 : 4);
	size_t proj = rows * 2 * rc->kv_dim * sizeof(float);
	size_t tab = rows * hd * sizeof(float);
	int ret = 0;

	for (int b = 0; b < 2 && !ret; b++) {
		ret = kvfs_rcuda_dev_grow(&rc->dx[b], xb);
		if (!ret && r->staged)
			ret = kvfs_rcuda_pinned_grow(&rc->hx[b], xb);
	}
	if (!ret)
		ret = kvfs_rcuda_dev_grow(&rc->xn, xn);
	if (!ret)
		ret = kvfs_rcuda_dev_grow(&rc->proj, proj);
	/* The table now holds many blocks' positions, not one run. */
	rc->tab_ok = false;
	if (!ret)
		ret = kvfs_rcuda_dev_grow(&rc->tab, tab);
	for (size_t i = 0; i < r->n && !ret; i++) {
		const struct bt_blk *k = &r->blk[i];

		ret = CUDA_TRY(kvfs_rc_rope_table(rc->cs, rc->inv, hd / 2,
						  k->q.pos, k->q.n,
						  (float *)rc->tab.p +
							  (size_t)k->row * hd));
	}
	return ret;
}

/*
 * Queue the copies r->dst[i] <- r->src[i] on the copy stream: one
 * cudaMemcpyBatchAsync() for the round (the host's cost of a copy call,
 * a few µs, times one copy a block and layer was most of a batch's time),
 * or, where the runtime refuses it, one cudaMemcpyAsync() each from
 * then on (logged once per handle).
 */
static int round_copy(struct kvfs_restore_cuda *rc, const struct bt_round *r)
{
	struct cudaMemcpyAttributes at = {
		.srcAccessOrder = cudaMemcpySrcAccessOrderStream,
		.flags = cudaMemcpyFlagPreferOverlapWithCompute,
	};
	size_t first = 0;
	int ret = 0;

	if (!rc->copy_one) {
		cudaError_t e = cudaMemcpyBatchAsync(
			r->dst, r->src, r->len, r->n, &at, &first, 1, rc->xs);

		if (e == cudaSuccess)
			return 0;
		(void)cudaGetLastError();
		kvfs_warn("restore cuda: cudaMemcpyBatchAsync: %s (%s): one "
			  "copy call a block from now on",
			  cudaGetErrorString(e), cudaGetErrorName(e));
		rc->copy_one = true;
	}
	for (size_t i = 0; i < r->n && !ret; i++)
		ret = CUDA_TRY(cudaMemcpyAsync(r->dst[i], r->src[i], r->len[i],
					       cudaMemcpyHostToDevice, rc->xs));
	return ret;
}

/* Queue the upload of layer @k of every block into buffer @b. */
static int round_stage(struct kvfs_restore_cuda *rc, const struct bt_round *r,
		       uint32_t k, int b)
{
	size_t rb = row_bytes(rc, r->blk[0].q.xdt);
	int ret = 0;

	/* The last upload out of staging buffer b must be done before the
	 * host refills it.
	 */
	if (r->staged)
		ret = CUDA_TRY(cudaEventSynchronize(rc->up_done[b]));
	if (!ret)
		ret = CUDA_TRY(cudaStreamWaitEvent(rc->xs, rc->x_free[b], 0));
	for (size_t i = 0; i < r->n && !ret; i++) {
		const struct bt_blk *bk = &r->blk[i];
		const uint8_t *src = bk->q.x + (uint64_t)k * bk->q.hl;
		size_t off = (size_t)bk->row * rb, len = bk->q.n * rb;

		if (!bk->pinned) {
			memcpy((uint8_t *)rc->hx[b].p + off, src, len);
			src = (const uint8_t *)rc->hx[b].p + off;
		}
		r->dst[i] = (uint8_t *)rc->dx[b].p + off;
		r->src[i] = src;
		r->len[i] = len;
	}
	if (!ret)
		ret = round_copy(rc, r);
	if (!ret)
		ret = CUDA_TRY(cudaEventRecord(rc->up_done[b], rc->xs));
	return ret;
}

/* Queue layer @k of every block, from buffer @b, into its KV payload. */
static int round_compute(struct kvfs_restore_cuda *rc,
			 const struct bt_round *r, uint32_t k, int b)
{
	uint32_t layer = r->blk[0].q.first + k, hd = rc->m.head_dim;
	int ret;

	ret = CUDA_TRY(cudaStreamWaitEvent(rc->cs, rc->up_done[b], 0));
	if (!ret)
		ret = kvfs_rcuda_project(rc, layer, rc->dx[b].p,
					 r->blk[0].q.xdt, r->rows);
	if (!ret)
		ret = CUDA_TRY(cudaEventRecord(rc->x_free[b], rc->cs));
	/* Bias, RoPE and scatter: one launch per KVFS_RC_SEGS_MAX blocks. */
	for (size_t i = 0; i < r->n && !ret; i += KVFS_RC_SEGS_MAX) {
		struct kvfs_rc_seg seg[KVFS_RC_SEGS_MAX];
		size_t m = r->n - i < KVFS_RC_SEGS_MAX ? r->n - i :
							 KVFS_RC_SEGS_MAX;

		for (size_t g = 0; g < m; g++) {
			const struct bt_blk *bk = &r->blk[i + g];

			seg[g] = (struct kvfs_rc_seg){
				.out = bk->q.kv + (uint64_t)k * bk->q.kl,
				.row = bk->row,
				.n = bk->q.n,
			};
		}
		ret = CUDA_TRY(kvfs_rc_scatter_many(
			rc->cs, rc->proj.p, rc->layers[layer].bkv, rc->tab.p,
			seg, (uint32_t)m, r->blk[0].q.c, rc->m.n_kv_heads, hd,
			r->blk[0].q.kdt));
	}
	return ret;
}

/* One round, the upload of layer k + 1 queued before the compute of k.
 * Ends with both streams idle, as run() in restore_cuda.c.
 */
static int round_run(struct kvfs_restore_cuda *rc, const struct bt_round *r)
{
	uint32_t count = r->blk[0].q.count;
	int ret, fin;

	ret = round_prepare(rc, r);
	if (!ret)
		ret = round_stage(rc, r, 0, 0);
	for (uint32_t k = 0; k < count && !ret; k++) {
		int b = k & 1;

		if (k + 1 < count)
			ret = round_stage(rc, r, k + 1, b ^ 1);
		if (!ret)
			ret = round_compute(rc, r, k, b);
	}
	fin = CUDA_TRY(cudaStreamSynchronize(rc->xs));
	if (!fin)
		fin = CUDA_TRY(cudaStreamSynchronize(rc->cs));
	return ret ? ret : fin;
}

int kvfs_restore_cuda_blocks(struct kvfs_restore_cuda *rc,
			     const struct kvfs_restore_io *io, size_t n)
{
	struct bt_blk *blk;
	const void **src;
	size_t *len;
	void **dst;
	uint32_t cap;
	int ret;

	if (!rc || !io)
		return -EINVAL;
	if (!n)
		return kvfs_rcuda_req_bad("a batch of no blocks");
	blk = calloc(n, sizeof(*blk));
	dst = calloc(n, sizeof(*dst));
	src = calloc(n, sizeof(*src));
	len = calloc(n, sizeof(*len));
	if (!blk || !dst || !src || !len) {
		ret = -ENOMEM;
		goto out_free;
	}
	ret = batch_check(rc, io, n, blk);
	if (ret)
		goto out_free;
	cap = rc->batch_rows;
	pthread_mutex_lock(&rc->lock);
	ret = CUDA_TRY(cudaSetDevice(rc->device));
	if (!ret)
		ret = batch_where(rc, blk, n);
	for (size_t i = 0, j; i < n && !ret; i = j) {
		struct bt_round r = { .blk = &blk[i], .dst = dst, .src = src,
				      .len = len };

		/* A block larger than the cap goes alone. */
		for (j = i; j < n && (j == i || r.rows + blk[j].q.n <= cap);
		     j++) {
			blk[j].row = r.rows;
			r.rows += blk[j].q.n;
			r.staged |= !blk[j].pinned;
		}
		r.n = j - i;
		ret = round_run(rc, &r);
	}
	pthread_mutex_unlock(&rc->lock);
out_free:
	free(len);
	free(src);
	free(dst);
	free(blk);
	return ret;
}

#endif /* KVFS_HAVE_CUDA && KVFS_HAVE_CUDA_KERNELS */
