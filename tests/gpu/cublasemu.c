/* SPDX-License-Identifier: MIT */
/*
 * A fake cuBLAS for the cudart stand-in (tests/gpu/cudaemu.c): a shared
 * library, libcublas-emu.so in the emulated build, that
 * gpu/restore_cuda.c loads through KVFS_CUBLAS_LIB in place of
 * libcublas.so.13.  It has the seven entry points restore_cuda.c
 * resolves and computes GEMMs with OpenBLAS's cblas_sgemm, column-major
 * as cuBLAS is, queued on the handle's stream through
 * kvfs_cudaemu_enqueue() so that they run in stream order at the next
 * synchronisation point.  kvfs_cudaemu_* and the element converters of
 * hcache/restore.h come from the executable (linked with -rdynamic).
 *
 * Strict where cuBLAS is: leading dimensions, operations and sizes are
 * checked as cuBLAS checks them (CUBLAS_STATUS_INVALID_VALUE).  Stricter
 * where a GPU would fault later: A, B and C must be device memory of the
 * current device for the whole extent the GEMM touches, aligned to their
 * elements, or the call fails with CUBLAS_STATUS_INVALID_VALUE and a line
 * on stderr.  What it does not implement it refuses with
 * CUBLAS_STATUS_NOT_SUPPORTED instead of computing something else: math
 * modes other than the default and pedantic ones (TF32 would round what
 * this computes in full f32), and GemmEx other than A and B both F32,
 * F16 or BF16 with C F32 or A's type, computed in 32F.  alpha and beta
 * are host pointers (the default pointer mode), read at the call.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "hcache/restore.h"
#include "meta/fmt.h"
#include "tests/gpu/cudaemu_i.h"

#define HANDLE_MAGIC 0x53414c4255434b45ull /* "EKCUBLAS" */

struct cublasContext {
	uint64_t magic;
	cudaStream_t stream;
	cublasMath_t math;
};

/* One GEMM, with room for f32 copies of narrow operands. */
struct gemm {
	bool ta, tb;
	int m, n, k;
	float alpha, beta;
	const void *a, *b;
	void *c;
	cudaDataType at, bt, ct;
	int lda, ldb, ldc;
	size_t a_len, b_len, c_len; /* extents in elements */
	float buf[];                /* a_len, b_len, c_len f32 as needed */
};

static bool handle_ok(cublasHandle_t h)
{
	return h && h->magic == HANDLE_MAGIC;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
	struct cublasContext *h;
	int count = 0;

	if (!handle)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		(void)cudaGetLastError();
		return CUBLAS_STATUS_NOT_INITIALIZED;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return CUBLAS_STATUS_ALLOC_FAILED;
	h->magic = HANDLE_MAGIC;
	h->math = CUBLAS_DEFAULT_MATH;
	*handle = h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
	if (!handle_ok(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	/* Queued GEMMs hold copies of what they need, not the handle. */
	handle->magic = 0;
	free(handle);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle,
				  cudaStream_t streamId)
{
	if (!handle_ok(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->stream = streamId;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
	unsigned base = (unsigned)mode & 0xfu;
	unsigned known = 0xfu |
		CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;

	if (!handle_ok(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if ((unsigned)mode & ~known)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH) {
		fprintf(stderr, "cublasemu: math mode %#x not emulated "
			"(tensor-core rounding)\n", (unsigned)mode);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	handle->math = mode;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
	switch (status) {
	case CUBLAS_STATUS_SUCCESS: return "success (emulated)";
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return "the library was not initialized (emulated)";
	case CUBLAS_STATUS_ALLOC_FAILED:
		return "the resource allocation failed (emulated)";
	case CUBLAS_STATUS_INVALID_VALUE:
		return "an invalid numeric value was used as an argument "
		       "(emulated)";
	case CUBLAS_STATUS_EXECUTION_FAILED:
		return "the GPU program failed to execute (emulated)";
	case CUBLAS_STATUS_NOT_SUPPORTED:
		return "the functionality requested is not supported "
		       "(emulated)";
	default: return "unknown cuBLAS status (emulated)";
	}
}

/* ------------------------------------------------------------- GEMM */

static uint16_t kvfs_dtype(cudaDataType t)
{
	switch (t) {
	case CUDA_R_32F:
		return KVFS_DTYPE_F32;
	case CUDA_R_16F:
		return KVFS_DTYPE_F16;
	case CUDA_R_16BF:
		return KVFS_DTYPE_BF16;
	default:
		return 0;
	}
}

static size_t tsize(cudaDataType t)
{
	return t == CUDA_R_32F ? 4 : 2;
}

/* An operand as f32: itself, or decoded into @tmp. */
static float *as_f32(const void *p, cudaDataType t, size_t len, float *tmp)
{
	if (t == CUDA_R_32F)
		return (float *)p;
	kvfs_restore_to_f32(p, kvfs_dtype(t), tmp, len);
	return tmp;
}

static void gemm_run(void *arg)
{
	struct gemm *g = arg;
	float *tmp = g->buf;
	const float *a, *b;
	float *c;

	a = as_f32(g->a, g->at, g->a_len, tmp);
	if (g->at != CUDA_R_32F)
		tmp += g->a_len;
	b = as_f32(g->b, g->bt, g->b_len, tmp);
	if (g->bt != CUDA_R_32F)
		tmp += g->b_len;
	c = as_f32(g->c, g->ct, g->c_len, tmp);
	cblas_sgemm(CblasColMajor, g->ta ? CblasTrans : CblasNoTrans,
		    g->tb ? CblasTrans : CblasNoTrans, g->m, g->n, g->k,
		    g->alpha, a, g->lda, b, g->ldb, g->beta, c, g->ldc);
	if (g->ct == CUDA_R_32F)
		return;
	/* Column by column: the gaps between columns stay as they were. */
	for (int j = 0; j < g->n; j++)
		kvfs_restore_from_f32(c + (size_t)j * g->ldc,
				      kvfs_dtype(g->ct),
				      (uint8_t *)g->c + (size_t)j * g->ldc *
							       tsize(g->ct),
				      (size_t)g->m);
}

static bool op_ok(cublasOperation_t op)
{
	return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

/* Elements of a column-major @rows x @cols operand with leading
 * dimension @ld.
 */
static size_t extent(int rows, int cols, int ld)
{
	return rows && cols ? (size_t)(cols - 1) * (size_t)ld + (size_t)rows :
			      0;
}

static bool operand_ok(const char *call, const char *name, const void *p,
		       size_t len, cudaDataType t)
{
	if (!len)
		return true;
	if (p && !((uintptr_t)p % tsize(t)) &&
	    kvfs_cudaemu_is_device(p, len * tsize(t)))
		return true;
	fprintf(stderr, "cublasemu: %s: %s %p is not aligned device memory of "
		"the current device for the %zu bytes the GEMM touches\n",
		call, name, p, len * tsize(t));
	return false;
}

static cublasStatus_t gemm_queue(const char *call, cublasHandle_t handle,
				 cublasOperation_t ta, cublasOperation_t tb,
				 int m, int n, int k, const float *alpha,
				 const void *a, cudaDataType at, int lda,
				 const void *b, cudaDataType bt, int ldb,
				 const float *beta, void *c, cudaDataType ct,
				 int ldc)
{
	bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
	int ar = na ? m : k, ac = na ? k : m;
	int br = nb ? k : n, bc = nb ? n : k;
	struct gemm g, *q;
	size_t tmp = 0;

	if (!handle_ok(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 ||
	    lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) ||
	    ldc < (m > 1 ? m : 1) || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!m || !n)
		return CUBLAS_STATUS_SUCCESS;
	g = (struct gemm){
		.ta = !na, .tb = !nb, .m = m, .n = n, .k = k,
		.alpha = *alpha, .beta = *beta,
		.a = a, .b = b, .c = c, .at = at, .bt = bt, .ct = ct,
		.lda = lda, .ldb = ldb, .ldc = ldc,
		.a_len = k ? extent(ar, ac, lda) : 0,
		.b_len = k ? extent(br, bc, ldb) : 0,
		.c_len = extent(m, n, ldc),
	};
	if (!operand_ok(call, "A", a, g.a_len, at) ||
	    !operand_ok(call, "B", b, g.b_len, bt) ||
	    !operand_ok(call, "C", c, g.c_len, ct))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (at != CUDA_R_32F)
		tmp += g.a_len;
	if (bt != CUDA_R_32F)
		tmp += g.b_len;
	if (ct != CUDA_R_32F)
		tmp += g.c_len;
	q = malloc(sizeof(*q) + tmp * sizeof(float));
	if (!q)
		return CUBLAS_STATUS_ALLOC_FAILED;
	*q = g;
	if (kvfs_cudaemu_enqueue(handle->stream, gemm_run, q) != cudaSuccess) {
		(void)cudaGetLastError();
		return CUBLAS_STATUS_EXECUTION_FAILED;
	}
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
			      cublasOperation_t transb, int m, int n, int k,
			      const float *alpha, const float *A, int lda,
			      const float *B, int ldb, const float *beta,
			      float *C, int ldc)
{
	return gemm_queue("cublasSgemm_v2", handle, transa, transb, m, n, k,
			  alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta,
			  C, CUDA_R_32F, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
			    cublasOperation_t transb, int m, int n, int k,
			    const void *alpha, const void *A,
			    cudaDataType Atype, int lda, const void *B,
			    cudaDataType Btype, int ldb, const void *beta,
			    void *C, cudaDataType Ctype, int ldc,
			    cublasComputeType_t computeType,
			    cublasGemmAlgo_t algo)
{
	(void)algo; /* a hint: every algorithm computes the same here */
	if (!handle_ok(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (computeType != CUBLAS_COMPUTE_32F &&
	    computeType != CUBLAS_COMPUTE_32F_PEDANTIC) {
		fprintf(stderr, "cublasemu: cublasGemmEx: compute type %d not "
			"emulated\n", (int)computeType);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	if (!kvfs_dtype(Atype) || Btype != Atype ||
	    (Ctype != CUDA_R_32F && Ctype != Atype)) {
		fprintf(stderr, "cublasemu: cublasGemmEx: types A %d, B %d, "
			"C %d not emulated\n", (int)Atype, (int)Btype,
			(int)Ctype);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	/* 32F compute: alpha and beta are floats. */
	return gemm_queue("cublasGemmEx", handle, transa, transb, m, n, k,
			  alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
			  ldc);
}
