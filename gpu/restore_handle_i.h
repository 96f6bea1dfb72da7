/* SPDX-License-Identifier: MIT */
/*
 * The GPU restorer's handle, for gpu/restore_cuda.c (its life, cuBLAS,
 * the per-block pipeline) and gpu/restore_batch.c (many blocks per GEMM)
 * only.  Builds with KVFS_HAVE_CUDA and KVFS_HAVE_CUDA_KERNELS only.
 *
 * Locking: every function here is called with rc->lock held, except
 * kvfs_rcuda_req_bad() and kvfs_rcuda_block_req(), which touch only
 * immutable fields.
 */
#ifndef KVFS_GPU_RESTORE_HANDLE_I_H
#define KVFS_GPU_RESTORE_HANDLE_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "gpu/host_pool_i.h"
#include "gpu/restore_cuda.h"

/* One layer on the device. */
struct rc_layer {
	void *wkv;      /* [2 * kv_dim][hidden]: W_k rows, then W_v; f32/bf16 */
	float *norm;    /* [hidden] */
	float *bkv;     /* [2 * kv_dim]: b_k then b_v, or NULL */
};

/* Buffers that grow to the largest request seen. */
struct rc_buf {
	void *p;
	size_t cap;
};

struct kvfs_restore_cuda {
	struct kvfs_restore_model m;    /* immutable */
	uint32_t kv_dim;                /* immutable */
	uint32_t batch_rows;            /* immutable: most rows of a round of
					 * kvfs_restore_cuda_blocks() */
	int device;                     /* immutable */
	unsigned flags;                 /* immutable */
	uint64_t mem_bytes;             /* immutable */
	struct rc_layer *layers;        /* immutable after init */
	double *inv;                    /* device [head_dim / 2]; immutable */
	cublasHandle_t blas;            /* guarded by lock */
	struct kvfs_host_pool host;     /* guarded by its own lock */
	pthread_mutex_t lock;
	/* Everything below is guarded by lock. */
	cudaStream_t cs, xs;            /* compute, copy */
	cudaEvent_t up_done[2], x_free[2], kv_done[2];
	struct rc_buf dx[2];            /* device: uploaded hidden rows */
	struct rc_buf hx[2];            /* pinned: staged hidden rows */
	struct rc_buf dkv;              /* device: one KV layer */
	struct rc_buf hkv[2];           /* pinned: downloaded KV layers */
	struct rc_buf xn;               /* device: x̂ */
	struct rc_buf proj;             /* device: [n][2 * kv_dim] f32 */
	struct rc_buf tab;              /* device: RoPE cos/sin */
	bool tab_ok;                    /* tab holds tab_pos, tab_n */
	bool copy_one;                  /* no cudaMemcpyBatchAsync here */
	uint64_t tab_pos;
	uint32_t tab_n;
};

/* One request, after its arguments are checked. */
struct rc_req {
	const uint8_t *x;   /* the first layer's hidden slice */
	uint8_t *kv;        /* the first layer's KV slice */
	uint64_t hl, kl;    /* bytes per layer of each payload */
	uint16_t xdt, kdt;
	uint64_t pos;
	uint32_t n, c;
	uint32_t first, count;
	unsigned flags;
};

/*
 * kvfs_rcuda_dev_grow() / kvfs_rcuda_pinned_grow() - make @b hold at
 * least @need bytes of device / page-locked host memory; the contents
 * are lost when it grows.  0, or CUDA_TRY's -ENOMEM / -EIO (logged), @b
 * then empty.
 */
int kvfs_rcuda_dev_grow(struct rc_buf *b, size_t need);
int kvfs_rcuda_pinned_grow(struct rc_buf *b, size_t need);

/* Log "request refused: @why" and return -EINVAL. */
int kvfs_rcuda_req_bad(const char *why);

/*
 * kvfs_rcuda_block_req() - check @io as kvfs_restore_cuda_block() does
 * (NULLs, flags, model limits, lengths, layer range) and fill @q from
 * it.  Where the memory lies is not checked (kvfs_rcuda_where_check()).
 * 0 or -EINVAL (logged, but for NULL arguments).
 */
int kvfs_rcuda_block_req(struct kvfs_restore_cuda *rc,
			 const struct kvfs_restore_io *io, struct rc_req *q);

/*
 * kvfs_rcuda_where_check() - that [@p, @p + @len) is memory of @rc's
 * device (@device) aligned to @es-byte elements, or page-locked host
 * memory (!@device); @what names it in the log.  0 or -EINVAL (logged).
 */
int kvfs_rcuda_where_check(const struct kvfs_restore_cuda *rc, const void *p,
			   uint64_t len, size_t es, bool device,
			   const char *what);

/*
 * kvfs_rcuda_project() - queue on rc->cs the RMSNorm of @n rows at @src
 * (device memory, @xdt) into rc->xn, then the GEMM of layer @layer into
 * rc->proj ([n][2 * kv_dim] f32).  Both buffers must already hold @n
 * rows.  0, or -EIO / -ENOMEM (logged).
 */
int kvfs_rcuda_project(struct kvfs_restore_cuda *rc, uint32_t layer,
		       const void *src, uint16_t xdt, uint32_t n);

#endif
