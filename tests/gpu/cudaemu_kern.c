/* SPDX-License-Identifier: MIT */
/*
 * The three launchers of gpu/restore_cuda_i.h for the cudart stand-in
 * (tests/gpu/cudaemu.c): in the emulated build they replace
 * gpu/restore_kern.cu, so that gpu/restore_cuda.c's real path (buffers,
 * streams, events, cuBLAS calls) runs without a GPU.
 *
 * Each launcher checks its arguments as a launch would fail on them
 * (an empty grid) and, more strictly than a GPU, every pointer against
 * the stand-in's allocation table for the whole extent the kernel
 * touches and for element alignment: a kernel handed host memory or a
 * short buffer faults on a device and loses the context, so here the
 * launch is refused with cudaErrorInvalidValue and a line on the log.
 * The work itself is queued on the stream with its arguments copied, and
 * runs at the stream's next synchronisation point.
 *
 * The math is restore_cuda_i.h's, written from its comments and the CPU
 * path's rules, with hcache/restore.h's converters: it says nothing about
 * whether restore_kern.cu computes the same (docs/operations.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "hcache/restore.h"
#include "gpu/restore_cuda_i.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "tests/gpu/cudaemu_i.h"

static size_t esize(uint16_t dt)
{
	switch (dt) {
	case KVFS_RC_F16:
	case KVFS_RC_BF16:
		return 2;
	case KVFS_RC_F32:
		return 4;
	case KVFS_RC_F8_E4M3:
		return 1;
	default:
		return 0;
	}
}

static cudaError_t refuse(const char *launch, const char *what,
			  cudaError_t e)
{
	kvfs_err("cudaemu: %s refused: %s", launch, what);
	return kvfs_cudaemu_error(e);
}

/* @p must be device memory of the current device for @len bytes, aligned
 * to @align.
 */
static bool dev_ok(const char *launch, const char *name, const void *p,
		   uint64_t len, size_t align)
{
	if (!p || (uintptr_t)p % align) {
		kvfs_err("cudaemu: %s refused: %s %p is NULL or not aligned "
			 "to %zu bytes", launch, name, p, align);
		return false;
	}
	if (len > SIZE_MAX || !kvfs_cudaemu_is_device(p, (size_t)len)) {
		kvfs_err("cudaemu: %s refused: %s %p is not device memory of "
			 "the current device for the %llu bytes the kernel "
			 "touches", launch, name, p, (unsigned long long)len);
		return false;
	}
	return true;
}

static cudaError_t launch(cudaStream_t st, void (*fn)(void *), void *arg)
{
	if (!arg)
		return kvfs_cudaemu_error(cudaErrorMemoryAllocation);
	return kvfs_cudaemu_enqueue(st, fn, arg);
}

/* ------------------------------------------------------------ RMSNorm */

struct norm_args {
	const void *x;
	uint16_t x_dtype;
	uint32_t n, h;
	const float *w;
	double eps;
	void *xn;
	int xn_bf16;
	float row[]; /* [h]: the decoded row */
};

static void norm_run(void *arg)
{
	struct norm_args *a = arg;
	size_t es = esize(a->x_dtype);

	for (uint32_t i = 0; i < a->n; i++) {
		const uint8_t *x = (const uint8_t *)a->x +
				   (size_t)i * a->h * es;
		double ss = 0;
		float scale;

		kvfs_restore_to_f32(x, a->x_dtype, a->row, a->h);
		for (uint32_t j = 0; j < a->h; j++)
			ss += (double)a->row[j] * a->row[j];
		scale = (float)(1.0 / sqrt(ss / a->h + a->eps));
		for (uint32_t j = 0; j < a->h; j++) {
			float v = a->row[j] * scale;

			a->row[j] = v * a->w[j];
		}
		if (a->xn_bf16)
			kvfs_restore_from_f32(a->row, KVFS_DTYPE_BF16,
					      (uint16_t *)a->xn +
						      (size_t)i * a->h,
					      a->h);
		else
			memcpy((float *)a->xn + (size_t)i * a->h, a->row,
			       a->h * sizeof(float));
	}
}

cudaError_t kvfs_rc_norm(cudaStream_t st, const void *x, uint16_t x_dtype,
			 uint32_t n, uint32_t h, const float *w, double eps,
			 void *xn, int xn_bf16)
{
	static const char *me = "kvfs_rc_norm";
	size_t es = esize(x_dtype), os = xn_bf16 ? 2 : 4;
	uint64_t elems = (uint64_t)n * h;
	struct norm_args *a;

	if (!n || !h)
		return refuse(me, "empty grid or row",
			      cudaErrorInvalidConfiguration);
	if (!es)
		return refuse(me, "unknown hidden-state dtype",
			      cudaErrorInvalidValue);
	if (!dev_ok(me, "x", x, elems * es, es) ||
	    !dev_ok(me, "w", w, (uint64_t)h * 4, 4) ||
	    !dev_ok(me, "xn", xn, elems * os, os))
		return kvfs_cudaemu_error(cudaErrorInvalidValue);
	a = malloc(sizeof(*a) + (size_t)h * sizeof(float));
	if (a)
		*a = (struct norm_args){ .x = x, .x_dtype = x_dtype, .n = n,
					 .h = h, .w = w, .eps = eps, .xn = xn,
					 .xn_bf16 = xn_bf16 };
	return launch(st, norm_run, a);
}

/* --------------------------------------------------------- RoPE table */

struct rope_args {
	const double *inv;
	uint32_t half;
	uint64_t start_pos;
	uint32_t n;
	float *cs;
};

static void rope_run(void *arg)
{
	struct rope_args *a = arg;

	for (uint32_t i = 0; i < a->n; i++) {
		float *row = a->cs + (size_t)i * a->half * 2;

		for (uint32_t j = 0; j < a->half; j++) {
			double ang = (double)(a->start_pos + i) * a->inv[j];

			row[2 * j] = (float)cos(ang);
			row[2 * j + 1] = (float)sin(ang);
		}
	}
}

cudaError_t kvfs_rc_rope_table(cudaStream_t st, const double *inv,
			       uint32_t half, uint64_t start_pos, uint32_t n,
			       float *cs)
{
	static const char *me = "kvfs_rc_rope_table";
	struct rope_args *a;

	if (!n || !half)
		return refuse(me, "empty grid", cudaErrorInvalidConfiguration);
	if (!dev_ok(me, "inv", inv, (uint64_t)half * 8, 8) ||
	    !dev_ok(me, "cs", cs, (uint64_t)n * half * 2 * 4, 4))
		return kvfs_cudaemu_error(cudaErrorInvalidValue);
	a = malloc(sizeof(*a));
	if (a)
		*a = (struct rope_args){ .inv = inv, .half = half,
					 .start_pos = start_pos, .n = n,
					 .cs = cs };
	return launch(st, rope_run, a);
}

/* ------------------------------------------------- RoPE and scatter */

struct scatter_args {
	const float *proj, *bkv, *cs;
	uint32_t n, c, heads, hd;
	void *out;
	uint16_t dt;
	float kv[]; /* [2][d]: one row's K, then V */
};

static void scatter_run(void *arg)
{
	struct scatter_args *a = arg;
	uint32_t half = a->hd / 2, d = a->heads * a->hd;
	uint64_t rows = ((uint64_t)a->n + a->c - 1) / a->c * a->c;
	size_t es = esize(a->dt);
	float *k = a->kv, *v = a->kv + d;

	for (uint64_t r = 0; r < rows; r++) {
		uint64_t ch = r / a->c, i = r % a->c;
		uint64_t kb = (ch * 2 * a->c + i) * d;
		uint64_t vb = kb + (uint64_t)a->c * d;
		const float *row = a->proj + r * 2 * d;
		const float *cs = a->cs + r * half * 2;

		if (r >= a->n) {
			memset(a->kv, 0, 2 * (size_t)d * sizeof(float));
			goto store;
		}
		for (uint32_t o = 0; o < d; o++) {
			k[o] = row[o];
			v[o] = row[d + o];
			if (a->bkv) {
				k[o] = k[o] + a->bkv[o];
				v[o] = v[o] + a->bkv[d + o];
			}
		}
		for (uint32_t h = 0; h < a->heads; h++) {
			float *q = k + (size_t)h * a->hd;

			for (uint32_t j = 0; j < half; j++) {
				float x = q[j], y = q[j + half];
				float co = cs[2 * j], si = cs[2 * j + 1];
				float xc = x * co, ys = y * si;
				float yc = y * co, xs = x * si;

				q[j] = xc - ys;
				q[j + half] = yc + xs;
			}
		}
store:
		kvfs_restore_from_f32(k, a->dt, (uint8_t *)a->out + kb * es, d);
		kvfs_restore_from_f32(v, a->dt, (uint8_t *)a->out + vb * es, d);
	}
}

cudaError_t kvfs_rc_scatter(cudaStream_t st, const float *proj,
			    const float *bkv, const float *cs, uint32_t n,
			    uint32_t c, uint32_t heads, uint32_t head_dim,
			    void *out, uint16_t kv_dtype)
{
	static const char *me = "kvfs_rc_scatter";
	uint64_t d = (uint64_t)heads * head_dim, rows;
	size_t es = esize(kv_dtype);
	struct scatter_args *a;

	if (!n || !c || !heads || head_dim < 2)
		return refuse(me, "empty grid", cudaErrorInvalidConfiguration);
	if (head_dim % 2)
		return refuse(me, "odd head_dim", cudaErrorInvalidValue);
	if (!es)
		return refuse(me, "unknown KV dtype", cudaErrorInvalidValue);
	rows = ((uint64_t)n + c - 1) / c * c;
	if (!dev_ok(me, "proj", proj, (uint64_t)n * 2 * d * 4, 4) ||
	    (bkv && !dev_ok(me, "bkv", bkv, 2 * d * 4, 4)) ||
	    !dev_ok(me, "cs", cs, (uint64_t)n * head_dim * 4, 4) ||
	    !dev_ok(me, "out", out, rows * 2 * d * es, es))
		return kvfs_cudaemu_error(cudaErrorInvalidValue);
	a = malloc(sizeof(*a) + 2 * (size_t)d * sizeof(float));
	if (a)
		*a = (struct scatter_args){ .proj = proj, .bkv = bkv, .cs = cs,
					    .n = n, .c = c, .heads = heads,
					    .hd = head_dim, .out = out,
					    .dt = kv_dtype };
	return launch(st, scatter_run, a);
}

/* One emulated launch per segment: the stand-in runs kernels in stream
 * order on the host, so the result is the same as one launch's.
 */
cudaError_t kvfs_rc_scatter_many(cudaStream_t st, const float *proj,
				 const float *bkv, const float *cs,
				 const struct kvfs_rc_seg *seg, uint32_t nseg,
				 uint32_t c, uint32_t heads, uint32_t head_dim,
				 uint16_t kv_dtype)
{
	static const char *me = "kvfs_rc_scatter_many";
	uint64_t d = (uint64_t)heads * head_dim;
	cudaError_t e = cudaSuccess;

	if (!seg || !nseg || nseg > KVFS_RC_SEGS_MAX)
		return refuse(me, "segment count", cudaErrorInvalidValue);
	for (uint32_t i = 0; i < nseg && e == cudaSuccess; i++)
		e = kvfs_rc_scatter(st, proj + (uint64_t)seg[i].row * 2 * d,
				    bkv, cs + (uint64_t)seg[i].row * head_dim,
				    seg[i].n, c, heads, head_dim, seg[i].out,
				    kv_dtype);
	return e;
}
