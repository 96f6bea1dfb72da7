/* SPDX-License-Identifier: MIT */
/*
 * Kernels of the GPU restoration path (gpu/restore_cuda.h): RMSNorm, the
 * RoPE table, and bias + RoPE + conversion + scatter.  Launchers are
 * declared in gpu/restore_cuda_i.h.
 *
 * The element conversions are the CPU path's rules (gpu/restore.c), bit
 * for bit: round to nearest even, f16/bf16 overflow to infinity, f8_e4m3
 * saturating to +-448, NaN kept quiet.  Arithmetic that the CPU does as
 * separate multiplies and adds uses the _rn intrinsics so that the
 * compiler cannot fuse it into FMAs with a different rounding.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "gpu/restore_cuda_i.h"

#define NORM_THREADS 256
#define EW_THREADS 256
/* Grid-stride kernels never need more blocks than this to fill a GPU. */
#define EW_MAX_BLOCKS 65535u

/* ------------------------------------------------------- conversions */

__device__ static float f16_to_f32(uint16_t v)
{
	uint32_t sign = (uint32_t)(v & 0x8000u) << 16;
	uint32_t exp = (v >> 10) & 0x1fu, man = v & 0x3ffu;

	if (exp == 0)
		return __uint_as_float(__float_as_uint((float)man * 0x1p-24f) |
				       sign);
	if (exp == 31)
		return __uint_as_float(sign | 0x7f800000u | man << 13);
	return __uint_as_float(sign | (exp + 112) << 23 | man << 13);
}

__device__ static float f8_to_f32(uint8_t v)
{
	uint32_t exp = (v >> 3) & 0xfu, man = v & 7u;
	float f;

	if (exp == 15 && man == 7)
		return __uint_as_float((v & 0x80u) ? 0xffc00000u : 0x7fc00000u);
	if (exp == 0)
		f = (float)man * 0x1p-9f;
	else
		f = ldexpf((float)(8 + man), (int)exp - 10);
	return (v & 0x80) ? -f : f;
}

__device__ static float load_elem(const void *base, uint16_t dt, uint64_t i)
{
	switch (dt) {
	case KVFS_RC_F32:
		return ((const float *)base)[i];
	case KVFS_RC_BF16:
		return __uint_as_float((uint32_t)((const uint16_t *)base)[i]
				       << 16);
	case KVFS_RC_F16:
		return f16_to_f32(((const uint16_t *)base)[i]);
	default:
		return f8_to_f32(((const uint8_t *)base)[i]);
	}
}

/* @m >> @shift rounded to nearest, ties to even; @shift in 1..31. */
__device__ static uint32_t shift_rne(uint32_t m, unsigned shift)
{
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1);
	uint32_t half = 1u << (shift - 1);

	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

/* |f| (bits @a, finite) times 2^@scale_log2 rounded to an integer. */
__device__ static uint32_t subnormal_rne(uint32_t a, int scale_log2)
{
	int e = (int)(a >> 23);
	uint32_t mant = a & 0x7fffffu;
	int shift;

	if (e)
		mant |= 0x800000u;
	else
		e = 1;
	shift = 150 - e - scale_log2;
	if (shift <= 0)
		return mant << -shift;
	if (shift > 24)
		return 0;
	return shift_rne(mant, (unsigned)shift);
}

__device__ static uint16_t f32_to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

__device__ static uint16_t f32_to_f16(float f)
{
	uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu, h;
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);

	if (a > 0x7f800000u)
		return sign | 0x7e00u;
	if (a >= 0x477ff000u)
		return sign | 0x7c00u;
	if (a < 0x38800000u)
		return (uint16_t)(sign | subnormal_rne(a, 24));
	h = (a >> 13) - (112u << 10);
	if ((a & 0x1fffu) > 0x1000u || ((a & 0x1fffu) == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

__device__ static uint8_t f32_to_f8(float f)
{
	uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu, m;
	uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
	int e;

	if (a > 0x7f800000u)
		return sign | 0x7fu;
	if (a >= 0x43e00000u)
		return sign | 0x7eu;
	if (a < 0x3c800000u)
		return (uint8_t)(sign | subnormal_rne(a, 9));
	e = (int)(a >> 23) - 127;
	m = shift_rne((a & 0x7fffffu) | 0x800000u, 20);
	if (m == 16) {
		m = 8;
		e++;
	}
	m = (uint32_t)(e + 7) << 3 | (m & 7u);
	if (m > 0x7eu)
		m = 0x7eu;
	return (uint8_t)(sign | m);
}

__device__ static void store_elem(void *base, uint16_t dt, uint64_t i,
				  float v)
{
	switch (dt) {
	case KVFS_RC_F32:
		((float *)base)[i] = v;
		break;
	case KVFS_RC_BF16:
		((uint16_t *)base)[i] = f32_to_bf16(v);
		break;
	case KVFS_RC_F16:
		((uint16_t *)base)[i] = f32_to_f16(v);
		break;
	default:
		((uint8_t *)base)[i] = f32_to_f8(v);
		break;
	}
}

static unsigned ew_blocks(uint64_t n)
{
	uint64_t b = (n + EW_THREADS - 1) / EW_THREADS;

	return b > EW_MAX_BLOCKS ? EW_MAX_BLOCKS : (unsigned)b;
}

/* ------------------------------------------------------------ RMSNorm */

/* One block per row: the sum of squares is reduced in double, like the
 * CPU's sequential double sum (the order differs, the result by far less
 * than an f32 ulp).
 */
__global__ static void norm_kernel(const void *x, uint16_t dt, uint32_t h,
				   const float *w, double eps, void *xn,
				   int xn_bf16)
{
	__shared__ double part[NORM_THREADS];
	uint64_t base = (uint64_t)blockIdx.x * h;
	double ss = 0;
	float scale;

	for (uint32_t j = threadIdx.x; j < h; j += blockDim.x) {
		float v = load_elem(x, dt, base + j);

		ss += (double)v * v;
	}
	part[threadIdx.x] = ss;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s; s /= 2) {
		if (threadIdx.x < s)
			part[threadIdx.x] += part[threadIdx.x + s];
		__syncthreads();
	}
	scale = (float)(1.0 / sqrt(part[0] / h + eps));
	for (uint32_t j = threadIdx.x; j < h; j += blockDim.x) {
		float v = __fmul_rn(__fmul_rn(load_elem(x, dt, base + j),
					      scale), w[j]);

		if (xn_bf16)
			((uint16_t *)xn)[base + j] = f32_to_bf16(v);
		else
			((float *)xn)[base + j] = v;
	}
}

extern "C" cudaError_t kvfs_rc_norm(cudaStream_t st, const void *x,
				    uint16_t x_dtype, uint32_t n, uint32_t h,
				    const float *w, double eps, void *xn,
				    int xn_bf16)
{
	norm_kernel<<<n, NORM_THREADS, 0, st>>>(x, x_dtype, h, w, eps, xn,
						 xn_bf16);
	return cudaGetLastError();
}

/* --------------------------------------------------------- RoPE table */

__global__ static void rope_table_kernel(const double *inv, uint32_t half,
					 uint64_t start_pos, uint32_t n,
					 float *cs)
{
	uint64_t total = (uint64_t)n * half;

	for (uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     t < total; t += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t i = t / half;
		uint32_t j = (uint32_t)(t % half);
		double a = (double)(start_pos + i) * inv[j], s, c;

		sincos(a, &s, &c);
		cs[2 * t] = (float)c;
		cs[2 * t + 1] = (float)s;
	}
}

extern "C" cudaError_t kvfs_rc_rope_table(cudaStream_t st, const double *inv,
					  uint32_t half, uint64_t start_pos,
					  uint32_t n, float *cs)
{
	uint64_t total = (uint64_t)n * half;

	rope_table_kernel<<<ew_blocks(total), EW_THREADS, 0, st>>>(
		inv, half, start_pos, n, cs);
	return cudaGetLastError();
}

/* ------------------------------------------------- RoPE and scatter */

/* One thread per (row, rotation pair): it writes K[j], K[j + half] and
 * the V elements at the same places, so neighbouring threads write
 * neighbouring elements.  Thread @t0 of @step, in a grid-stride loop.
 */
__device__ static void scatter_rows(const float *proj, const float *bkv,
				    const float *cs, uint32_t n, uint32_t c,
				    uint32_t heads, uint32_t hd, uint64_t rows,
				    void *out, uint16_t dt, uint64_t t0,
				    uint64_t step)
{
	uint32_t half = hd / 2, d = heads * hd, pairs = heads * half;
	uint64_t total = rows * pairs;

	for (uint64_t t = t0; t < total; t += step) {
		uint64_t r = t / pairs, ch = r / c, i = r % c;
		uint32_t p = (uint32_t)(t % pairs), j = p % half;
		uint32_t o1 = (p / half) * hd + j, o2 = o1 + half;
		uint64_t kb = (ch * 2 * c + i) * d, vb = kb + (uint64_t)c * d;
		float k1 = 0, k2 = 0, v1 = 0, v2 = 0;

		if (r < n) {
			const float *row = proj + r * 2 * d;
			const float *rc = cs + (r * half + j) * 2;
			float a = row[o1], b = row[o2];

			v1 = row[d + o1];
			v2 = row[d + o2];
			if (bkv) {
				a = __fadd_rn(a, bkv[o1]);
				b = __fadd_rn(b, bkv[o2]);
				v1 = __fadd_rn(v1, bkv[d + o1]);
				v2 = __fadd_rn(v2, bkv[d + o2]);
			}
			k1 = __fsub_rn(__fmul_rn(a, rc[0]), __fmul_rn(b, rc[1]));
			k2 = __fadd_rn(__fmul_rn(b, rc[0]), __fmul_rn(a, rc[1]));
		}
		store_elem(out, dt, kb + o1, k1);
		store_elem(out, dt, kb + o2, k2);
		store_elem(out, dt, vb + o1, v1);
		store_elem(out, dt, vb + o2, v2);
	}
}

__global__ static void scatter_kernel(const float *proj, const float *bkv,
				      const float *cs, uint32_t n, uint32_t c,
				      uint32_t heads, uint32_t hd,
				      uint64_t rows, void *out, uint16_t dt)
{
	scatter_rows(proj, bkv, cs, n, c, heads, hd, rows, out, dt,
		     (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
		     (uint64_t)gridDim.x * blockDim.x);
}

/* The segments of one launch, by value. */
struct seg_set {
	struct kvfs_rc_seg s[KVFS_RC_SEGS_MAX];
};

/* Grid row y is segment y. */
__global__ static void scatter_many_kernel(const float *proj,
					   const float *bkv, const float *cs,
					   struct seg_set set, uint32_t c,
					   uint32_t heads, uint32_t hd,
					   uint16_t dt)
{
	const struct kvfs_rc_seg *g = &set.s[blockIdx.y];
	uint64_t rows = ((uint64_t)g->n + c - 1) / c * c;

	scatter_rows(proj + (uint64_t)g->row * 2 * heads * hd, bkv,
		     cs + (uint64_t)g->row * hd, g->n, c, heads, hd, rows,
		     g->out, dt,
		     (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
		     (uint64_t)gridDim.x * blockDim.x);
}

extern "C" cudaError_t kvfs_rc_scatter_many(cudaStream_t st,
					    const float *proj,
					    const float *bkv, const float *cs,
					    const struct kvfs_rc_seg *seg,
					    uint32_t nseg, uint32_t c,
					    uint32_t heads, uint32_t head_dim,
					    uint16_t kv_dtype)
{
	struct seg_set set;
	uint64_t most = 0;

	if (!nseg || nseg > KVFS_RC_SEGS_MAX)
		return cudaErrorInvalidValue;
	for (uint32_t i = 0; i < nseg; i++) {
		uint64_t rows = ((uint64_t)seg[i].n + c - 1) / c * c;
		uint64_t total = rows * heads * (head_dim / 2);

		set.s[i] = seg[i];
		if (total > most)
			most = total;
	}
	scatter_many_kernel<<<dim3(ew_blocks(most), nseg), EW_THREADS, 0,
			      st>>>(proj, bkv, cs, set, c, heads, head_dim,
				    kv_dtype);
	return cudaGetLastError();
}

extern "C" cudaError_t kvfs_rc_scatter(cudaStream_t st, const float *proj,
				       const float *bkv, const float *cs,
				       uint32_t n, uint32_t c, uint32_t heads,
				       uint32_t head_dim, void *out,
				       uint16_t kv_dtype)
{
	uint64_t rows = ((uint64_t)n + c - 1) / c * c;
	uint64_t total = rows * heads * (head_dim / 2);

	scatter_kernel<<<ew_blocks(total), EW_THREADS, 0, st>>>(
		proj, bkv, cs, n, c, heads, head_dim, rows, out, kv_dtype);
	return cudaGetLastError();
}
