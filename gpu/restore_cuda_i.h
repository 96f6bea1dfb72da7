/* SPDX-License-Identifier: MIT */
/*
 * The kernels of the GPU restoration path (gpu/restore_kern.cu), for
 * gpu/restore_cuda.c only.  C linkage on both sides; every launcher queues
 * its kernel on @st and returns the launch's cudaError_t (cudaSuccess or
 * the error cudaGetLastError() reports; execution errors surface at the
 * next synchronisation).  Dtypes are enum kvfs_dtype values.
 *
 * Launchers never fail on sizes: callers pass n >= 1 and dimensions that
 * kvfs_restore_model_check() accepted.
 */
#ifndef KVFS_GPU_RESTORE_CUDA_I_H
#define KVFS_GPU_RESTORE_CUDA_I_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* enum kvfs_dtype's values (meta/fmt.h, a C header the kernels do not
 * include); restore_cuda.c checks that they agree.
 */
enum kvfs_rc_dtype {
	KVFS_RC_F16 = 1,
	KVFS_RC_BF16 = 2,
	KVFS_RC_F32 = 3,
	KVFS_RC_F8_E4M3 = 4,
};

/*
 * RMSNorm of @n rows of @h elements at @x (@x_dtype, contiguous rows):
 * xn[i][j] = x[i][j] * (float)(1 / sqrt(sum_j x² / h + eps)) * w[j],
 * the sum in double.  @xn is f32, or bf16 when @xn_bf16.
 */
cudaError_t kvfs_rc_norm(cudaStream_t st, const void *x, uint16_t x_dtype,
			 uint32_t n, uint32_t h, const float *w, double eps,
			 void *xn, int xn_bf16);

/*
 * The RoPE table of positions start_pos .. start_pos + n - 1:
 * cs[i][j] = { (float)cos(a), (float)sin(a) }, a = (double)(start_pos + i)
 * * inv[j], for j < @half; computed in double.
 */
cudaError_t kvfs_rc_rope_table(cudaStream_t st, const double *inv,
			       uint32_t half, uint64_t start_pos, uint32_t n,
			       float *cs);

/*
 * Bias, RoPE, conversion and scatter of one layer.  @proj is [n][2 * d]
 * f32 (K in columns 0..d-1, V in d..2d-1), d = heads * head_dim; @bkv is
 * [2 * d] f32 (K biases then V) or NULL; @cs as kvfs_rc_rope_table().
 * Writes the whole KV layer at @out in @kv_dtype: for each chunk of @c
 * rows, K[c][d] then V[c][d]; rows n .. ceil(n / c) * c - 1 are zeros.
 */
cudaError_t kvfs_rc_scatter(cudaStream_t st, const float *proj,
			    const float *bkv, const float *cs, uint32_t n,
			    uint32_t c, uint32_t heads, uint32_t head_dim,
			    void *out, uint16_t kv_dtype);

/* One block of kvfs_rc_scatter_many(). */
struct kvfs_rc_seg {
	void *out;      /* its whole KV layer, as kvfs_rc_scatter()'s @out */
	uint32_t row;   /* its first row in @proj and @cs */
	uint32_t n;     /* its rows, >= 1 */
};

/* The most blocks one kvfs_rc_scatter_many() takes: the segments travel
 * by value in the launch's parameters (24 bytes each).
 */
#define KVFS_RC_SEGS_MAX 32

/*
 * kvfs_rc_scatter() for @nseg (1 .. KVFS_RC_SEGS_MAX) blocks in one
 * launch: block i reads rows seg[i].row .. seg[i].row + seg[i].n - 1 of
 * @proj and of @cs (whose rows are that block's positions) and writes
 * its whole KV layer at seg[i].out, padding rows zeroed.  @seg is read
 * during the call only.  All blocks share @c, @bkv and @kv_dtype.
 */
cudaError_t kvfs_rc_scatter_many(cudaStream_t st, const float *proj,
				 const float *bkv, const float *cs,
				 const struct kvfs_rc_seg *seg, uint32_t nseg,
				 uint32_t c, uint32_t heads, uint32_t head_dim,
				 uint16_t kv_dtype);

#ifdef __cplusplus
}
#endif

#endif
