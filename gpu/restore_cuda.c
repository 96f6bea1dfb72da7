/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration on an NVIDIA GPU: the host side.  The kernels
 * are in gpu/restore_kern.cu; the contract is gpu/restore_cuda.h.
 *
 * Two streams per handle: uploads of hidden rows go on the copy stream,
 * everything else on the compute stream, and events order the two so
 * that layer l + 1 travels while layer l computes:
 *   up_done[b]  recorded on the copy stream after the upload into buffer
 *               b; the compute stream waits for it before the norm, and
 *               the host before refilling pinned staging buffer b;
 *   x_free[b]   recorded on the compute stream after the norm has read
 *               device buffer b; the next upload into b waits for it;
 *   kv_done[b]  recorded after the download of a KV layer into pinned
 *               buffer b; the host waits for it before copying out.
 *
 * Many blocks per GEMM (kvfs_restore_cuda_blocks()) are in
 * gpu/restore_batch.c, over the handle of gpu/restore_handle_i.h.
 *
 * cuBLAS is dlopen'ed once per process (see blas_load()): cudart is
 * linked statically so that programs start without the CUDA libraries,
 * and there is no static cuBLAS to link.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu/restore_cuda.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/util.h"

/* The kernels need nvcc as well as the runtime headers (Makefile). */
#if !defined(KVFS_HAVE_CUDA) || !defined(KVFS_HAVE_CUDA_KERNELS)

static int no_cuda(void)
{
	kvfs_err("restore cuda: this kvfs was built without the CUDA toolkit "
		 "(or without nvcc for its kernels)");
	return -EOPNOTSUPP;
}

int kvfs_restore_cuda_init(const struct kvfs_restore *r, int device,
			   unsigned flags, struct kvfs_restore_cuda **out)
{
	return (!r || !out) ? -EINVAL : no_cuda();
}

int kvfs_restore_cuda_init_weights(const struct kvfs_restore_model *m,
				   const struct kvfs_restore_weights *w,
				   int device, unsigned flags,
				   struct kvfs_restore_cuda **out)
{
	return (!m || !w || !out) ? -EINVAL : no_cuda();
}

void kvfs_restore_cuda_free(struct kvfs_restore_cuda *rc)
{
}

uint64_t kvfs_restore_cuda_mem_bytes(const struct kvfs_restore_cuda *rc)
{
	return 0;
}

int kvfs_restore_cuda_device(const struct kvfs_restore_cuda *rc)
{
	return -1;
}

int kvfs_restore_cuda_layer(struct kvfs_restore_cuda *rc, uint32_t layer,
			    const void *x, uint16_t x_dtype,
			    uint64_t start_pos, uint32_t n_tokens,
			    uint32_t chunk_tokens, void *kv, uint16_t kv_dtype,
			    unsigned flags)
{
	return no_cuda();
}

int kvfs_restore_cuda_layers(struct kvfs_restore_cuda *rc, uint32_t first,
			     uint32_t count, const void *x, uint16_t x_dtype,
			     uint64_t start_pos, uint32_t n_tokens,
			     uint32_t chunk_tokens, void *kv,
			     uint16_t kv_dtype, unsigned flags)
{
	return no_cuda();
}

int kvfs_restore_cuda_host_get(struct kvfs_restore_cuda *rc, uint64_t len,
			       void **buf)
{
	return (!rc || !buf) ? -EINVAL : no_cuda();
}

void kvfs_restore_cuda_host_put(struct kvfs_restore_cuda *rc, void *buf)
{
}

int kvfs_restore_cuda_block(struct kvfs_restore_cuda *rc,
			    const struct kvfs_restore_io *io)
{
	return no_cuda();
}

int kvfs_restore_cuda_profile(struct kvfs_restore_cuda *rc,
			      uint32_t n_tokens, uint16_t dtype,
			      struct kvfs_restore_cuda_prof *out)
{
	return no_cuda();
}

#else /* KVFS_HAVE_CUDA && KVFS_HAVE_CUDA_KERNELS */

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#define KVFS_CUDA_WHO "restore cuda"
#include "gpu/cuda_i.h"
#include "gpu/host_pool_i.h"
#include "gpu/restore_cuda_i.h"
#include "gpu/restore_handle_i.h"

_Static_assert((int)KVFS_RC_F16 == (int)KVFS_DTYPE_F16 &&
	       (int)KVFS_RC_BF16 == (int)KVFS_DTYPE_BF16 &&
	       (int)KVFS_RC_F32 == (int)KVFS_DTYPE_F32 &&
	       (int)KVFS_RC_F8_E4M3 == (int)KVFS_DTYPE_F8_E4M3,
	       "kernel dtype codes follow meta/fmt.h");

#define PROF_RUNS 5

/* ---------------------------------------------------------- cuBLAS */

/* The few entry points used, typed by the real header's prototypes. */
struct rc_blas {
	__typeof__(cublasCreate_v2) *create;
	__typeof__(cublasDestroy_v2) *destroy;
	__typeof__(cublasSetStream_v2) *set_stream;
	__typeof__(cublasSetMathMode) *set_math_mode;
	__typeof__(cublasSgemm_v2) *sgemm;
	__typeof__(cublasGemmEx) *gemm_ex;
	__typeof__(cublasGetStatusString) *status_string; /* optional */
};

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static struct rc_blas blas;    /* written once under blas_once */
static int blas_ret = -ENODEV; /* written once under blas_once */

static void *blas_sym(void *lib, const char *name, bool *ok)
{
	void *f = dlsym(lib, name);

	if (!f) {
		kvfs_err("restore cuda: cuBLAS lacks %s", name);
		*ok = false;
	}
	return f;
}

/*
 * $KVFS_CUBLAS_LIB first when set (a cuBLAS outside the loader's path, or
 * the emulated build's stand-in); then the versioned name (the ABI this
 * was built against), through the normal search path, then the toolkit's
 * directories, then the unversioned development link.  The library stays
 * loaded for the process.
 */
static void blas_load_once(void)
{
	const char *home = getenv("CUDA_HOME");
	const char *over = getenv("KVFS_CUBLAS_LIB");
	char path[2][PATH_MAX];
	const char *names[6];
	size_t nn = 0;
	void *lib = NULL;
	bool ok = true;

	if (over && *over) {
		lib = dlopen(over, RTLD_NOW | RTLD_LOCAL);
		if (lib)
			kvfs_info("restore cuda: cuBLAS from %s "
				  "(KVFS_CUBLAS_LIB)", over);
		else
			kvfs_warn("restore cuda: cannot load KVFS_CUBLAS_LIB "
				  "%s: %s; trying the usual names", over,
				  dlerror());
	}
	names[nn++] = "libcublas.so.13";
	if (home && *home) {
		snprintf(path[0], sizeof(path[0]), "%s/lib64/libcublas.so.13",
			 home);
		names[nn++] = path[0];
	}
	names[nn++] = "/usr/local/cuda/lib64/libcublas.so.13";
	names[nn++] = "libcublas.so";
	if (home && *home) {
		snprintf(path[1], sizeof(path[1]), "%s/lib64/libcublas.so",
			 home);
		names[nn++] = path[1];
	}
	for (size_t i = 0; i < nn && !lib; i++) {
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (lib)
			kvfs_info("restore cuda: cuBLAS from %s", names[i]);
	}
	if (!lib) {
		kvfs_err("restore cuda: cannot load cuBLAS ($KVFS_CUBLAS_LIB, "
			 "libcublas.so.13 or libcublas.so, also under "
			 "$CUDA_HOME/lib64 and /usr/local/cuda/lib64): %s",
			 dlerror());
		return;
	}
	blas.create = blas_sym(lib, "cublasCreate_v2", &ok);
	blas.destroy = blas_sym(lib, "cublasDestroy_v2", &ok);
	blas.set_stream = blas_sym(lib, "cublasSetStream_v2", &ok);
	blas.set_math_mode = blas_sym(lib, "cublasSetMathMode", &ok);
	blas.sgemm = blas_sym(lib, "cublasSgemm_v2", &ok);
	blas.gemm_ex = blas_sym(lib, "cublasGemmEx", &ok);
	blas.status_string = dlsym(lib, "cublasGetStatusString");
	if (!ok) {
		dlclose(lib);
		memset(&blas, 0, sizeof(blas));
		return;
	}
	blas_ret = 0;
}

static int blas_load(void)
{
	pthread_once(&blas_once, blas_load_once);
	return blas_ret;
}

static int blas_fail(cublasStatus_t s, const char *call)
{
	if (blas.status_string)
		kvfs_err("restore cuda: %s: %s (%d)", call,
			 blas.status_string(s), (int)s);
	else
		kvfs_err("restore cuda: %s: status %d", call, (int)s);
	return s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
}

#define BLAS_TRY(call)                                                  \
	({                                                              \
		cublasStatus_t s_ = (call);                             \
		s_ == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(s_, #call); \
	})

int kvfs_rcuda_dev_grow(struct rc_buf *b, size_t need)
{
	void *p = NULL;
	int ret;

	if (b->cap >= need)
		return 0;
	if (b->p)
		cudaFree(b->p);
	b->p = NULL;
	b->cap = 0;
	ret = CUDA_TRY(cudaMalloc(&p, need));
	if (ret)
		return ret;
	b->p = p;
	b->cap = need;
	return 0;
}

int kvfs_rcuda_pinned_grow(struct rc_buf *b, size_t need)
{
	void *p = NULL;
	int ret;

	if (b->cap >= need)
		return 0;
	if (b->p)
		cudaFreeHost(b->p);
	b->p = NULL;
	b->cap = 0;
	ret = CUDA_TRY(cudaHostAlloc(&p, need, cudaHostAllocDefault));
	if (ret)
		return ret;
	b->p = p;
	b->cap = need;
	return 0;
}

static int device_check(int device)
{
	cudaError_t e;
	int count = 0;

	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) {
		kvfs_err("restore cuda: cudaGetDeviceCount: %s (%s): no usable "
			 "device", cudaGetErrorString(e), cudaGetErrorName(e));
		(void)cudaGetLastError();
		return -ENODEV;
	}
	if (device < 0 || device >= count) {
		kvfs_err("restore cuda: device %d is not visible (%d device%s)",
			 device, count, count == 1 ? "" : "s");
		return -ENODEV;
	}
	return 0;
}

/* --------------------------------------------------------------- init */

static int weights_bad(uint32_t l, const char *why)
{
	kvfs_err("restore cuda: layer %u weights refused: %s", l, why);
	return -EINVAL;
}

static int weights_check(const struct kvfs_restore_model *m,
			 const struct kvfs_restore_weights *w)
{
	for (uint32_t l = 0; l < m->n_layers; l++) {
		const struct kvfs_restore_weights *x = &w[l];

		if (!x->norm || !x->wk || !x->wv)
			return weights_bad(l, "missing norm, W_k or W_v");
		if (!x->bk != !x->bv)
			return weights_bad(l, "one bias without the other");
		if (x->wk_dtype != KVFS_DTYPE_F32 &&
		    x->wk_dtype != KVFS_DTYPE_BF16 &&
		    x->wk_dtype != KVFS_DTYPE_F16)
			return weights_bad(l, "W_k dtype not F32, BF16 or F16");
		if (x->wv_dtype != KVFS_DTYPE_F32 &&
		    x->wv_dtype != KVFS_DTYPE_BF16 &&
		    x->wv_dtype != KVFS_DTYPE_F16)
			return weights_bad(l, "W_v dtype not F32, BF16 or F16");
	}
	return 0;
}

static int upload(void **dst, const void *src, size_t len, uint64_t *acct)
{
	void *p = NULL;
	int ret = CUDA_TRY(cudaMalloc(&p, len));

	if (ret)
		return ret;
	*dst = p;
	*acct += len;
	return CUDA_TRY(cudaMemcpy(p, src, len, cudaMemcpyHostToDevice));
}

/*
 * Layer @l to the device.  @tmp holds 2 * kv_dim * hidden floats: K/V are
 * converted there to f32 (exact from bf16/f16), then to bf16 in place of
 * the first half when the handle keeps bf16 weights.
 */
static int upload_layer(struct kvfs_restore_cuda *rc, uint32_t l,
			const struct kvfs_restore_weights *w, float *tmp)
{
	struct rc_layer *L = &rc->layers[l];
	size_t dh = (size_t)rc->kv_dim * rc->m.hidden_size;
	size_t d = rc->kv_dim;
	int ret;

	ret = upload((void **)&L->norm, w->norm,
		     rc->m.hidden_size * sizeof(float), &rc->mem_bytes);
	if (ret)
		return ret;
	if (w->bk) {
		memcpy(tmp, w->bk, d * sizeof(float));
		memcpy(tmp + d, w->bv, d * sizeof(float));
		ret = upload((void **)&L->bkv, tmp, 2 * d * sizeof(float),
			     &rc->mem_bytes);
		if (ret)
			return ret;
	}
	kvfs_restore_to_f32(w->wk, w->wk_dtype, tmp, dh);
	kvfs_restore_to_f32(w->wv, w->wv_dtype, tmp + dh, dh);
	if (rc->flags & KVFS_RESTORE_CUDA_BF16) {
		/* Narrowing in place: element i is read before the 2-byte
		 * slot i, which lies at or below it, is written.
		 */
		uint16_t *b16 = (uint16_t *)tmp;

		for (size_t i = 0; i < 2 * dh; i++)
			b16[i] = kvfs_restore_f32_to_bf16(tmp[i]);
		return upload(&L->wkv, tmp, 2 * dh * 2, &rc->mem_bytes);
	}
	return upload(&L->wkv, tmp, 2 * dh * sizeof(float), &rc->mem_bytes);
}

static int setup_streams(struct kvfs_restore_cuda *rc)
{
	int ret;

	ret = CUDA_TRY(cudaStreamCreateWithFlags(&rc->cs,
						 cudaStreamNonBlocking));
	if (!ret)
		ret = CUDA_TRY(cudaStreamCreateWithFlags(&rc->xs,
							 cudaStreamNonBlocking));
	for (int b = 0; b < 2 && !ret; b++) {
		ret = CUDA_TRY(cudaEventCreateWithFlags(&rc->up_done[b],
							cudaEventDisableTiming));
		if (!ret)
			ret = CUDA_TRY(cudaEventCreateWithFlags(
				&rc->x_free[b], cudaEventDisableTiming));
		if (!ret)
			ret = CUDA_TRY(cudaEventCreateWithFlags(
				&rc->kv_done[b], cudaEventDisableTiming));
	}
	if (ret)
		return ret;
	ret = BLAS_TRY(blas.create(&rc->blas));
	if (ret) {
		rc->blas = NULL;
		return ret;
	}
	ret = BLAS_TRY(blas.set_stream(rc->blas, rc->cs));
	/* No TF32: f32 GEMMs keep f32 precision, as on the CPU. */
	if (!ret)
		ret = BLAS_TRY(blas.set_math_mode(rc->blas,
						  CUBLAS_DEFAULT_MATH));
	return ret;
}

/*
 * The most hidden rows one round of kvfs_restore_cuda_blocks() takes:
 * what 64 MiB of projections ([rows][2 * kv_dim] f32) hold, 2,048 rows
 * of Llama-2-7B, enough that the GEMM rather than the weight reads sets
 * the pace; or $KVFS_RESTORE_BATCH_ROWS when it is a whole number from 1
 * to 2^20 (a test's small rounds, or a smaller workspace; anything else
 * is logged and ignored).
 */
static uint32_t batch_rows(uint32_t kv_dim)
{
	const char *env = getenv("KVFS_RESTORE_BATCH_ROWS");
	uint32_t rows = (64u << 20) / (2 * kv_dim * sizeof(float));
	uint64_t v;

	if (env) {
		if (!kvfs_util_parse_u64(env, &v) && v >= 1 && v <= 1u << 20)
			return (uint32_t)v;
		kvfs_warn("restore cuda: KVFS_RESTORE_BATCH_ROWS=%s is not a "
			  "row count from 1 to 1048576: ignored",
			  env);
	}
	return rows ? rows : 1;
}

int kvfs_restore_cuda_init_weights(const struct kvfs_restore_model *m,
				   const struct kvfs_restore_weights *w,
				   int device, unsigned flags,
				   struct kvfs_restore_cuda **out)
{
	struct kvfs_restore_cuda *rc;
	double *inv = NULL;
	float *tmp = NULL;
	uint32_t half;
	int ret;

	if (!m || !w || !out)
		return -EINVAL;
	if (flags & ~(unsigned)KVFS_RESTORE_CUDA_BF16) {
		kvfs_err("restore cuda: unknown flags %#x", flags);
		return -EINVAL;
	}
	ret = kvfs_restore_model_check(m);
	if (!ret)
		ret = weights_check(m, w);
	if (ret)
		return ret;
	ret = device_check(device);
	if (!ret)
		ret = blas_load();
	if (ret)
		return ret;
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	ret = -pthread_mutex_init(&rc->lock, NULL);
	if (ret) {
		free(rc);
		return ret;
	}
	ret = kvfs_host_pool_init(&rc->host);
	if (ret) {
		pthread_mutex_destroy(&rc->lock);
		free(rc);
		return ret;
	}
	rc->m = *m;
	rc->kv_dim = m->n_kv_heads * m->head_dim;
	rc->batch_rows = batch_rows(rc->kv_dim);
	rc->device = device;
	rc->flags = flags;
	half = m->head_dim / 2;
	rc->layers = calloc(m->n_layers, sizeof(*rc->layers));
	tmp = malloc(2 * (size_t)rc->kv_dim * m->hidden_size * sizeof(float));
	inv = malloc(half * sizeof(double));
	if (!rc->layers || !tmp || !inv) {
		ret = -ENOMEM;
		goto out_free;
	}
	ret = CUDA_TRY(cudaSetDevice(device));
	if (!ret)
		ret = setup_streams(rc);
	for (uint32_t l = 0; l < m->n_layers && !ret; l++)
		ret = upload_layer(rc, l, &w[l], tmp);
	if (ret)
		goto out_free;
	kvfs_restore_rope_inv_freq(m, inv);
	ret = upload((void **)&rc->inv, inv, half * sizeof(double),
		     &rc->mem_bytes);
	if (ret)
		goto out_free;
	kvfs_info("restore cuda: device %d, %u layers, kv_dim %u, hidden %u, "
		  "%llu bytes of %s weights", device, m->n_layers, rc->kv_dim,
		  m->hidden_size, (unsigned long long)rc->mem_bytes,
		  (flags & KVFS_RESTORE_CUDA_BF16) ? "bf16" : "f32");
	free(tmp);
	free(inv);
	*out = rc;
	return 0;
out_free:
	free(tmp);
	free(inv);
	kvfs_restore_cuda_free(rc);
	return ret;
}

int kvfs_restore_cuda_init(const struct kvfs_restore *r, int device,
			   unsigned flags, struct kvfs_restore_cuda **out)
{
	const struct kvfs_restore_model *m;
	struct kvfs_restore_weights *w;
	int ret = 0;

	if (!r || !out)
		return -EINVAL;
	m = kvfs_restore_model(r);
	w = calloc(m->n_layers, sizeof(*w));
	if (!w)
		return -ENOMEM;
	for (uint32_t l = 0; l < m->n_layers && !ret; l++)
		ret = kvfs_restore_layer_weights(r, l, &w[l]);
	if (!ret)
		ret = kvfs_restore_cuda_init_weights(m, w, device, flags, out);
	free(w);
	return ret;
}

static void buf_free(struct rc_buf *b, bool pinned)
{
	if (b->p && pinned)
		cudaFreeHost(b->p);
	else if (b->p)
		cudaFree(b->p);
	b->p = NULL;
	b->cap = 0;
}

void kvfs_restore_cuda_free(struct kvfs_restore_cuda *rc)
{
	if (!rc)
		return;
	if (cudaSetDevice(rc->device) == cudaSuccess) {
		if (rc->cs)
			cudaStreamSynchronize(rc->cs);
		if (rc->xs)
			cudaStreamSynchronize(rc->xs);
	}
	if (rc->blas)
		blas.destroy(rc->blas);
	for (int b = 0; b < 2; b++) {
		buf_free(&rc->dx[b], false);
		buf_free(&rc->hx[b], true);
		buf_free(&rc->hkv[b], true);
		if (rc->up_done[b])
			cudaEventDestroy(rc->up_done[b]);
		if (rc->x_free[b])
			cudaEventDestroy(rc->x_free[b]);
		if (rc->kv_done[b])
			cudaEventDestroy(rc->kv_done[b]);
	}
	buf_free(&rc->dkv, false);
	buf_free(&rc->xn, false);
	buf_free(&rc->proj, false);
	buf_free(&rc->tab, false);
	if (rc->layers) {
		for (uint32_t l = 0; l < rc->m.n_layers; l++) {
			cudaFree(rc->layers[l].wkv);
			cudaFree(rc->layers[l].norm);
			cudaFree(rc->layers[l].bkv);
		}
	}
	cudaFree(rc->inv);
	if (rc->cs)
		cudaStreamDestroy(rc->cs);
	if (rc->xs)
		cudaStreamDestroy(rc->xs);
	(void)cudaGetLastError();
	free(rc->layers);
	kvfs_host_pool_release(&rc->host);
	pthread_mutex_destroy(&rc->lock);
	free(rc);
}

uint64_t kvfs_restore_cuda_mem_bytes(const struct kvfs_restore_cuda *rc)
{
	return rc ? rc->mem_bytes : 0;
}

int kvfs_restore_cuda_device(const struct kvfs_restore_cuda *rc)
{
	return rc ? rc->device : -1;
}

/* ------------------------------------------------------------ compute */

/* proj = x̂ . [W_k; W_v]^T for @n rows of xn. */
static int gemm(struct kvfs_restore_cuda *rc, uint32_t layer, uint32_t n)
{
	const struct rc_layer *L = &rc->layers[layer];
	int m2 = (int)(2 * rc->kv_dim), h = (int)rc->m.hidden_size;
	const float one = 1.0f, zero = 0.0f;

	/* Row-major proj[n][2d] = x̂[n][h] . Wkv[2d][h]^T, which in cuBLAS's
	 * column-major terms is Wkv^T (2d x h) times x̂ (h x n).
	 */
	if (rc->flags & KVFS_RESTORE_CUDA_BF16)
		return BLAS_TRY(blas.gemm_ex(rc->blas, CUBLAS_OP_T,
					     CUBLAS_OP_N, m2, (int)n, h, &one,
					     L->wkv, CUDA_R_16BF, h, rc->xn.p,
					     CUDA_R_16BF, h, &zero, rc->proj.p,
					     CUDA_R_32F, m2, CUBLAS_COMPUTE_32F,
					     CUBLAS_GEMM_DEFAULT));
	return BLAS_TRY(blas.sgemm(rc->blas, CUBLAS_OP_T, CUBLAS_OP_N, m2,
				   (int)n, h, &one, L->wkv, h, rc->xn.p, h,
				   &zero, rc->proj.p, m2));
}

/* x̂ of @n rows at @src, then the GEMM into proj. */
int kvfs_rcuda_project(struct kvfs_restore_cuda *rc, uint32_t layer,
		       const void *src, uint16_t xdt, uint32_t n)
{
	int ret;

	ret = CUDA_TRY(kvfs_rc_norm(rc->cs, src, xdt, n, rc->m.hidden_size,
				    rc->layers[layer].norm,
				    rc->m.rms_norm_eps, rc->xn.p,
				    !!(rc->flags & KVFS_RESTORE_CUDA_BF16)));
	return ret ? ret : gemm(rc, layer, n);
}

static int finish_layer(struct kvfs_restore_cuda *rc, uint32_t layer,
			uint32_t n, uint32_t c, void *dst, uint16_t kdt)
{
	return CUDA_TRY(kvfs_rc_scatter(rc->cs, rc->proj.p,
					rc->layers[layer].bkv, rc->tab.p, n, c,
					rc->m.n_kv_heads, rc->m.head_dim, dst,
					kdt));
}

/* Size the workspace for @q; only what its buffer placement needs. */
static int ws_prepare(struct kvfs_restore_cuda *rc, const struct rc_req *q)
{
	size_t xb = (size_t)q->n * rc->m.hidden_size *
		    kvfs_fmt_dtype_size(q->xdt);
	size_t xn = (size_t)q->n * rc->m.hidden_size *
		    ((rc->flags & KVFS_RESTORE_CUDA_BF16) ? 2 : 4);
	size_t proj = (size_t)q->n * 2 * rc->kv_dim * sizeof(float);
	size_t tab = (size_t)q->n * rc->m.head_dim * sizeof(float);
	int ret = 0;

	for (int b = 0; b < 2 && !ret; b++) {
		if (!(q->flags & KVFS_RC_HIDDEN_DEVICE))
			ret = kvfs_rcuda_dev_grow(&rc->dx[b], xb);
		if (!ret && !(q->flags & (KVFS_RC_HIDDEN_DEVICE |
					  KVFS_RC_HIDDEN_PINNED)))
			ret = kvfs_rcuda_pinned_grow(&rc->hx[b], xb);
		if (!ret && !(q->flags & (KVFS_RC_KV_DEVICE |
					  KVFS_RC_KV_PINNED)))
			ret = kvfs_rcuda_pinned_grow(&rc->hkv[b], q->kl);
	}
	if (!ret && !(q->flags & KVFS_RC_KV_DEVICE))
		ret = kvfs_rcuda_dev_grow(&rc->dkv, q->kl);
	if (!ret)
		ret = kvfs_rcuda_dev_grow(&rc->xn, xn);
	if (!ret)
		ret = kvfs_rcuda_dev_grow(&rc->proj, proj);
	if (!ret && tab > rc->tab.cap) {
		rc->tab_ok = false;
		ret = kvfs_rcuda_dev_grow(&rc->tab, tab);
	}
	if (ret || (rc->tab_ok && rc->tab_pos == q->pos && rc->tab_n == q->n))
		return ret;
	/* The layers of a block, and blocks at the same positions, share
	 * one table.
	 */
	rc->tab_ok = false;
	ret = CUDA_TRY(kvfs_rc_rope_table(rc->cs, rc->inv,
					  rc->m.head_dim / 2, q->pos, q->n,
					  rc->tab.p));
	if (ret)
		return ret;
	rc->tab_ok = true;
	rc->tab_pos = q->pos;
	rc->tab_n = q->n;
	return 0;
}

/* Start the upload of layer @k of @q into device buffer @b. */
static int stage_in(struct kvfs_restore_cuda *rc, const struct rc_req *q,
		    uint32_t k, int b)
{
	size_t xb = (size_t)q->n * rc->m.hidden_size *
		    kvfs_fmt_dtype_size(q->xdt);
	const uint8_t *src = q->x + (uint64_t)k * q->hl;
	int ret;

	if (q->flags & KVFS_RC_HIDDEN_DEVICE)
		return 0;
	if (!(q->flags & KVFS_RC_HIDDEN_PINNED)) {
		/* The previous upload from this staging buffer must be
		 * done before it is refilled.
		 */
		ret = CUDA_TRY(cudaEventSynchronize(rc->up_done[b]));
		if (ret)
			return ret;
		memcpy(rc->hx[b].p, src, xb);
		src = rc->hx[b].p;
	}
	ret = CUDA_TRY(cudaStreamWaitEvent(rc->xs, rc->x_free[b], 0));
	if (!ret)
		ret = CUDA_TRY(cudaMemcpyAsync(rc->dx[b].p, src, xb,
					       cudaMemcpyHostToDevice, rc->xs));
	if (!ret)
		ret = CUDA_TRY(cudaEventRecord(rc->up_done[b], rc->xs));
	return ret;
}

/* Copy a downloaded KV layer out of pinned buffer @b, if one waits. */
static int drain(struct kvfs_restore_cuda *rc, const struct rc_req *q,
		 int b, int64_t *pending)
{
	int ret;

	if (pending[b] < 0)
		return 0;
	ret = CUDA_TRY(cudaEventSynchronize(rc->kv_done[b]));
	if (!ret)
		memcpy(q->kv + (uint64_t)pending[b] * q->kl, rc->hkv[b].p,
		       q->kl);
	pending[b] = -1;
	return ret;
}

static int compute(struct kvfs_restore_cuda *rc, const struct rc_req *q,
		   uint32_t k, int b, int64_t *pending)
{
	uint32_t layer = q->first + k;
	const void *src = q->x + (uint64_t)k * q->hl;
	uint8_t *dst = q->kv + (uint64_t)k * q->kl;
	int ret = 0;

	if (!(q->flags & KVFS_RC_HIDDEN_DEVICE)) {
		src = rc->dx[b].p;
		ret = CUDA_TRY(cudaStreamWaitEvent(rc->cs, rc->up_done[b], 0));
	}
	if (!ret)
		ret = kvfs_rcuda_project(rc, layer, src, q->xdt, q->n);
	if (!ret && !(q->flags & KVFS_RC_HIDDEN_DEVICE))
		ret = CUDA_TRY(cudaEventRecord(rc->x_free[b], rc->cs));
	if (ret)
		return ret;
	if (q->flags & KVFS_RC_KV_DEVICE)
		return finish_layer(rc, layer, q->n, q->c, dst, q->kdt);
	ret = finish_layer(rc, layer, q->n, q->c, rc->dkv.p, q->kdt);
	if (ret)
		return ret;
	if (q->flags & KVFS_RC_KV_PINNED)
		return CUDA_TRY(cudaMemcpyAsync(dst, rc->dkv.p, q->kl,
						cudaMemcpyDeviceToHost,
						rc->cs));
	ret = CUDA_TRY(cudaMemcpyAsync(rc->hkv[b].p, rc->dkv.p, q->kl,
				       cudaMemcpyDeviceToHost, rc->cs));
	if (!ret)
		ret = CUDA_TRY(cudaEventRecord(rc->kv_done[b], rc->cs));
	if (!ret)
		pending[b] = k;
	return ret;
}

/*
 * Run @q with the lock held.  The upload of layer k + 1 is queued before
 * the compute of layer k, so the copy engine works while the SMs do; the
 * host copies of pageable buffers run while the GPU works on the layer
 * before.  Every path ends with both streams idle.
 */
static int run(struct kvfs_restore_cuda *rc, const struct rc_req *q)
{
	int64_t pending[2] = { -1, -1 };
	int ret, fin;

	ret = CUDA_TRY(cudaSetDevice(rc->device));
	if (ret)
		return ret;
	ret = ws_prepare(rc, q);
	if (!ret)
		ret = stage_in(rc, q, 0, 0);
	for (uint32_t k = 0; k < q->count && !ret; k++) {
		int b = k & 1;

		if (k + 1 < q->count)
			ret = stage_in(rc, q, k + 1, b ^ 1);
		if (!ret)
			ret = drain(rc, q, b, pending);
		if (!ret)
			ret = compute(rc, q, k, b, pending);
	}
	for (int i = 0; i < 2 && !ret; i++)
		ret = drain(rc, q, i, pending);
	fin = CUDA_TRY(cudaStreamSynchronize(rc->xs));
	if (!fin)
		fin = CUDA_TRY(cudaStreamSynchronize(rc->cs));
	if (ret || fin)
		rc->tab_ok = false;
	return ret ? ret : fin;
}

/* ------------------------------------------------------------ requests */

int kvfs_rcuda_req_bad(const char *why)
{
	kvfs_err("restore cuda: request refused: %s", why);
	return -EINVAL;
}

static int check_args(const struct kvfs_restore_cuda *rc, uint16_t x_dtype,
		      uint64_t start_pos, uint32_t n_tokens,
		      uint32_t chunk_tokens, uint16_t kv_dtype, unsigned flags)
{
	const char *why;

	if (flags & ~(unsigned)(KVFS_RC_HIDDEN_DEVICE | KVFS_RC_HIDDEN_PINNED |
				KVFS_RC_KV_DEVICE | KVFS_RC_KV_PINNED))
		return kvfs_rcuda_req_bad("unknown flags");
	if ((flags & KVFS_RC_HIDDEN_DEVICE) && (flags & KVFS_RC_HIDDEN_PINNED))
		return kvfs_rcuda_req_bad("hidden payload both device and pinned");
	if ((flags & KVFS_RC_KV_DEVICE) && (flags & KVFS_RC_KV_PINNED))
		return kvfs_rcuda_req_bad("KV payload both device and pinned");
	why = kvfs_restore_request_why(&rc->m, x_dtype, start_pos, n_tokens,
				       chunk_tokens, kv_dtype);
	return why ? kvfs_rcuda_req_bad(why) : 0;
}

/*
 * A buffer said to be device memory must be on this device (its first and
 * last byte: a host pointer would make a kernel fault and lose the whole
 * context), and element-aligned; one said to be pinned must be
 * page-locked host memory.
 */
int kvfs_rcuda_where_check(const struct kvfs_restore_cuda *rc, const void *p,
			   uint64_t len, size_t es, bool device,
			   const char *what)
{
	const uint8_t *ends[2] = { p, (const uint8_t *)p + len - 1 };

	if (device && (uintptr_t)p % es) {
		kvfs_err("restore cuda: %s: device pointer not aligned to its "
			 "elements", what);
		return -EINVAL;
	}
	for (int i = 0; i < 2; i++) {
		struct cudaPointerAttributes a;
		cudaError_t e = cudaPointerGetAttributes(&a, ends[i]);
		bool ok;

		if (e != cudaSuccess) {
			(void)cudaGetLastError();
			ok = false;
		} else if (device) {
			ok = (a.type == cudaMemoryTypeDevice ||
			      a.type == cudaMemoryTypeManaged) &&
			     a.device == rc->device;
		} else {
			ok = a.type == cudaMemoryTypeHost;
		}
		if (!ok) {
			kvfs_err("restore cuda: %s: not %s", what,
				 device ? "memory of this handle's device" :
					  "page-locked host memory");
			return -EINVAL;
		}
	}
	return 0;
}

static int submit(struct kvfs_restore_cuda *rc, const struct rc_req *q)
{
	uint64_t xlen = (uint64_t)(q->count - 1) * q->hl +
			(uint64_t)q->n * rc->m.hidden_size *
				kvfs_fmt_dtype_size(q->xdt);
	uint64_t klen = (uint64_t)q->count * q->kl;
	struct rc_req p = *q;
	int ret;

	pthread_mutex_lock(&rc->lock);
	ret = CUDA_TRY(cudaSetDevice(rc->device));
	if (!ret && (q->flags & (KVFS_RC_HIDDEN_DEVICE | KVFS_RC_HIDDEN_PINNED)))
		ret = kvfs_rcuda_where_check(rc, q->x, xlen,
					     kvfs_fmt_dtype_size(q->xdt),
					     q->flags & KVFS_RC_HIDDEN_DEVICE,
					     "hidden payload");
	if (!ret && (q->flags & (KVFS_RC_KV_DEVICE | KVFS_RC_KV_PINNED)))
		ret = kvfs_rcuda_where_check(rc, q->kv, klen,
					     kvfs_fmt_dtype_size(q->kdt),
					     q->flags & KVFS_RC_KV_DEVICE,
					     "KV payload");
	/* Host memory said to be pageable that is in fact page-locked (the
	 * DRAM tier's pinned arena, a buffer of kvfs_restore_cuda_host_get())
	 * is copied by the copy engine, without the staging buffers.
	 */
	if (!(q->flags & (KVFS_RC_HIDDEN_DEVICE | KVFS_RC_HIDDEN_PINNED)) &&
	    kvfs_host_pinned(q->x, xlen))
		p.flags |= KVFS_RC_HIDDEN_PINNED;
	if (!(q->flags & (KVFS_RC_KV_DEVICE | KVFS_RC_KV_PINNED)) &&
	    kvfs_host_pinned(q->kv, klen))
		p.flags |= KVFS_RC_KV_PINNED;
	q = &p;
	if (!ret)
		ret = run(rc, q);
	pthread_mutex_unlock(&rc->lock);
	return ret;
}

int kvfs_restore_cuda_layer(struct kvfs_restore_cuda *rc, uint32_t layer,
			    const void *x, uint16_t x_dtype,
			    uint64_t start_pos, uint32_t n_tokens,
			    uint32_t chunk_tokens, void *kv, uint16_t kv_dtype,
			    unsigned flags)
{
	return kvfs_restore_cuda_layers(rc, layer, 1, x, x_dtype, start_pos,
					n_tokens, chunk_tokens, kv, kv_dtype,
					flags);
}

int kvfs_restore_cuda_layers(struct kvfs_restore_cuda *rc, uint32_t first,
			     uint32_t count, const void *x, uint16_t x_dtype,
			     uint64_t start_pos, uint32_t n_tokens,
			     uint32_t chunk_tokens, void *kv,
			     uint16_t kv_dtype, unsigned flags)
{
	struct rc_req q;
	int ret;

	if (!rc || !x || !kv)
		return -EINVAL;
	if (!count)
		return kvfs_rcuda_req_bad("no layers");
	if (first >= rc->m.n_layers || count > rc->m.n_layers - first)
		return kvfs_rcuda_req_bad("layer out of range");
	ret = check_args(rc, x_dtype, start_pos, n_tokens, chunk_tokens,
			 kv_dtype, flags);
	if (ret)
		return ret;
	q = (struct rc_req){
		.x = x,
		.kv = kv,
		.hl = kvfs_restore_hidden_layer_bytes(&rc->m, n_tokens,
						      chunk_tokens, x_dtype),
		.kl = kvfs_restore_kv_layer_bytes(&rc->m, n_tokens,
						  chunk_tokens, kv_dtype),
		.xdt = x_dtype,
		.kdt = kv_dtype,
		.pos = start_pos,
		.n = n_tokens,
		.c = chunk_tokens,
		.first = first,
		.count = count,
		.flags = flags,
	};
	return submit(rc, &q);
}

int kvfs_restore_cuda_host_get(struct kvfs_restore_cuda *rc, uint64_t len,
			       void **buf)
{
	if (!rc)
		return -EINVAL;
	return kvfs_host_pool_get(&rc->host, len, buf);
}

void kvfs_restore_cuda_host_put(struct kvfs_restore_cuda *rc, void *buf)
{
	if (rc)
		kvfs_host_pool_put(&rc->host, buf);
}

int kvfs_rcuda_block_req(struct kvfs_restore_cuda *rc,
			 const struct kvfs_restore_io *io, struct rc_req *q)
{
	uint64_t hl, kl, count;
	uint32_t nl;
	int ret;

	if (!rc || !io || !io->hidden || !io->kv)
		return -EINVAL;
	ret = check_args(rc, io->hidden_dtype, io->start_pos, io->n_tokens,
			 io->chunk_tokens, io->kv_dtype, io->flags);
	if (ret)
		return ret;
	nl = rc->m.n_layers;
	hl = kvfs_restore_hidden_layer_bytes(&rc->m, io->n_tokens,
					     io->chunk_tokens,
					     io->hidden_dtype);
	kl = kvfs_restore_kv_layer_bytes(&rc->m, io->n_tokens,
					 io->chunk_tokens, io->kv_dtype);
	if (hl > UINT64_MAX / nl || kl > UINT64_MAX / nl)
		return kvfs_rcuda_req_bad("payload size overflows");
	if (io->hidden_len != hl * nl)
		return kvfs_rcuda_req_bad("hidden payload length does not match the geometry");
	if (io->kv_len != kl * nl)
		return kvfs_rcuda_req_bad("KV payload length does not match the geometry");
	if (io->first_layer >= nl)
		return kvfs_rcuda_req_bad("first layer out of range");
	count = io->n_layers ? io->n_layers : nl - io->first_layer;
	if (count > nl - io->first_layer)
		return kvfs_rcuda_req_bad("layer range out of bounds");
	*q = (struct rc_req){
		.x = (const uint8_t *)io->hidden + io->first_layer * hl,
		.kv = (uint8_t *)io->kv + io->first_layer * kl,
		.hl = hl,
		.kl = kl,
		.xdt = io->hidden_dtype,
		.kdt = io->kv_dtype,
		.pos = io->start_pos,
		.n = io->n_tokens,
		.c = io->chunk_tokens,
		.first = io->first_layer,
		.count = (uint32_t)count,
		.flags = io->flags,
	};
	return 0;
}

int kvfs_restore_cuda_block(struct kvfs_restore_cuda *rc,
			    const struct kvfs_restore_io *io)
{
	struct rc_req q;
	int ret = kvfs_rcuda_block_req(rc, io, &q);

	return ret ? ret : submit(rc, &q);
}

/* ------------------------------------------------------------ profile */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

enum prof_what { P_GEMM, P_COMPUTE, P_H2D_HIDDEN, P_H2D_KV };

struct prof_bufs {
	void *dx, *dkv, *hx, *hkv;
	uint64_t xb, kl;
	uint16_t dt;
	uint32_t n;
};

static int prof_issue(struct kvfs_restore_cuda *rc, enum prof_what w,
		      const struct prof_bufs *pb)
{
	switch (w) {
	case P_GEMM:
		return gemm(rc, 0, pb->n);
	case P_COMPUTE:
		return kvfs_rcuda_project(rc, 0, pb->dx, pb->dt, pb->n) ?:
		       finish_layer(rc, 0, pb->n, pb->n, pb->dkv, pb->dt);
	case P_H2D_HIDDEN:
		return CUDA_TRY(cudaMemcpyAsync(pb->dx, pb->hx, pb->xb,
						cudaMemcpyHostToDevice,
						rc->cs));
	default:
		return CUDA_TRY(cudaMemcpyAsync(pb->dkv, pb->hkv, pb->kl,
						cudaMemcpyHostToDevice,
						rc->cs));
	}
}

/* Median over PROF_RUNS of @w, after one untimed run. */
static int prof_time(struct kvfs_restore_cuda *rc, enum prof_what w,
		     const struct prof_bufs *pb, cudaEvent_t e0,
		     cudaEvent_t e1, double *out)
{
	double t[PROF_RUNS];
	float ms;
	int ret = prof_issue(rc, w, pb);

	if (!ret)
		ret = CUDA_TRY(cudaStreamSynchronize(rc->cs));
	for (int i = 0; i < PROF_RUNS && !ret; i++) {
		ret = CUDA_TRY(cudaEventRecord(e0, rc->cs));
		if (!ret)
			ret = prof_issue(rc, w, pb);
		if (!ret)
			ret = CUDA_TRY(cudaEventRecord(e1, rc->cs));
		if (!ret)
			ret = CUDA_TRY(cudaEventSynchronize(e1));
		if (!ret)
			ret = CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
		t[i] = ms / 1e3;
	}
	if (ret)
		return ret;
	qsort(t, PROF_RUNS, sizeof(t[0]), cmp_double);
	*out = t[PROF_RUNS / 2];
	return 0;
}

int kvfs_restore_cuda_profile(struct kvfs_restore_cuda *rc,
			      uint32_t n_tokens, uint16_t dtype,
			      struct kvfs_restore_cuda_prof *out)
{
	struct prof_bufs pb = { .dt = dtype, .n = n_tokens };
	cudaEvent_t e0 = NULL, e1 = NULL;
	struct rc_req q;
	int ret;

	if (!rc || !out)
		return -EINVAL;
	ret = check_args(rc, dtype, 0, n_tokens, n_tokens, dtype, 0);
	if (ret)
		return ret;
	pb.xb = kvfs_restore_hidden_layer_bytes(&rc->m, n_tokens, n_tokens,
						dtype);
	pb.kl = kvfs_restore_kv_layer_bytes(&rc->m, n_tokens, n_tokens, dtype);
	/* Sizes the workspace and the RoPE table as a request would. */
	q = (struct rc_req){ .hl = pb.xb, .kl = pb.kl, .xdt = dtype,
			     .kdt = dtype, .n = n_tokens, .c = n_tokens,
			     .count = 1,
			     .flags = KVFS_RC_HIDDEN_DEVICE | KVFS_RC_KV_DEVICE };
	pthread_mutex_lock(&rc->lock);
	ret = CUDA_TRY(cudaSetDevice(rc->device));
	if (!ret)
		ret = ws_prepare(rc, &q);
	if (!ret)
		ret = CUDA_TRY(cudaMalloc(&pb.dx, pb.xb));
	if (!ret)
		ret = CUDA_TRY(cudaMalloc(&pb.dkv, pb.kl));
	if (!ret)
		ret = CUDA_TRY(cudaHostAlloc(&pb.hx, pb.xb,
					     cudaHostAllocDefault));
	if (!ret)
		ret = CUDA_TRY(cudaHostAlloc(&pb.hkv, pb.kl,
					     cudaHostAllocDefault));
	if (!ret)
		ret = CUDA_TRY(cudaEventCreate(&e0));
	if (!ret)
		ret = CUDA_TRY(cudaEventCreate(&e1));
	if (ret)
		goto out_free;
	/* Small finite values in every dtype (0x3c bytes). */
	memset(pb.hx, 0x3c, pb.xb);
	memset(pb.hkv, 0x3c, pb.kl);
	ret = CUDA_TRY(cudaMemsetAsync(pb.dx, 0x3c, pb.xb, rc->cs));
	if (!ret)
		ret = prof_time(rc, P_COMPUTE, &pb, e0, e1, &out->compute);
	if (!ret)
		ret = prof_time(rc, P_GEMM, &pb, e0, e1, &out->gemm);
	if (!ret)
		ret = prof_time(rc, P_H2D_HIDDEN, &pb, e0, e1,
				&out->h2d_hidden);
	if (!ret)
		ret = prof_time(rc, P_H2D_KV, &pb, e0, e1, &out->h2d_kv);
out_free:
	cudaStreamSynchronize(rc->cs);
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	cudaFree(pb.dx);
	cudaFree(pb.dkv);
	cudaFreeHost(pb.hx);
	cudaFreeHost(pb.hkv);
	(void)cudaGetLastError();
	pthread_mutex_unlock(&rc->lock);
	return ret;
}

#endif /* KVFS_HAVE_CUDA && KVFS_HAVE_CUDA_KERNELS */
