/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration on the GPU (gpu/restore_cuda.h) against the
 * CPU path (hcache/restore.h) and the tests' double-precision reference
 * (ckpt_ref_i.h), on the same tiny checkpoints as test_restore.
 *
 * The GPU tests run only with KVFS_TEST_GPU=cuda (`make test-gpu`, on a
 * host with an NVIDIA GPU); otherwise each one skips.  test_no_device
 * always runs: it re-executes this program with no visible device
 * (CUDA_VISIBLE_DEVICES=-1) and checks that init says -ENODEV, or
 * -EOPNOTSUPP in a build without CUDA, instead of crashing.
 *
 * Bounds, per element:
 *   - against the reference: test_restore's tol() (f32 1e-5 rel + 2e-5;
 *     narrow types half an ulp + 2e-5);
 *   - against the CPU path: 2 * tol(), i.e. one ulp for narrow types:
 *     both round an f32 value that differs by summation order only, so
 *     they agree or land on neighbouring values;
 *   - KVFS_RESTORE_CUDA_BF16 (bf16 weights and x̂): additionally
 *     1.05 * 2^-7 * sum_j |w_j * x̂_j| for each projected element, summed
 *     over the two elements that RoPE mixes: two bf16 roundings (2^-8
 *     each) per product.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef KVFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cache/cache.h"
#include "hcache/restore.h"
#include "gpu/restore_cuda.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/util.h"
#include "tier/tier.h"
#include "tests/unit/ckpt_ref_i.h"

static bool on_gpu;

static int setup(void **state)
{
	const char *env = getenv("KVFS_TEST_GPU");

	on_gpu = env && !strcmp(env, "cuda");
	return ckpt_dir_setup("restore-cuda");
}

static int teardown(void **state)
{
	return ckpt_dir_teardown();
}

#define NEED_GPU()                                                        \
	do {                                                              \
		if (!on_gpu) {                                            \
			print_message("    skipped: needs KVFS_TEST_GPU=cuda " \
				      "and an NVIDIA GPU\n");             \
			skip();                                           \
		}                                                         \
	} while (0)

static struct kvfs_restore_cuda *gpu_init(const struct kvfs_restore *r,
					  unsigned flags)
{
	struct kvfs_restore_cuda *rc = NULL;

	assert_int_equal(kvfs_restore_cuda_init(r, 0, flags, &rc), 0);
	assert_non_null(rc);
	assert_int_equal(kvfs_restore_cuda_device(rc), 0);
	return rc;
}

static size_t kv_len(const struct refmodel *rm, const struct block *b,
		     uint16_t kdt)
{
	return (size_t)b->rows * 2 * rm->kvd * esize(kdt) * rm->s.L;
}

static uint8_t *cpu_block(const struct kvfs_restore *r,
			  const struct refmodel *rm, const struct block *b,
			  uint16_t kdt)
{
	struct kvfs_restore_io io = {
		.hidden = b->hidden,
		.hidden_len = b->hidden_len,
		.hidden_dtype = b->hdt,
		.kv_len = kv_len(rm, b, kdt),
		.kv_dtype = kdt,
		.start_pos = b->pos,
		.n_tokens = b->n,
		.chunk_tokens = b->c,
	};

	io.kv = malloc(io.kv_len);
	assert_non_null(io.kv);
	assert_int_equal(kvfs_restore_block(r, NULL, &io), 0);
	return io.kv;
}

static struct kvfs_restore_io gpu_io(const struct refmodel *rm,
				     const struct block *b, uint16_t kdt)
{
	return (struct kvfs_restore_io){
		.hidden = b->hidden,
		.hidden_len = b->hidden_len,
		.hidden_dtype = b->hdt,
		.kv_len = kv_len(rm, b, kdt),
		.kv_dtype = kdt,
		.start_pos = b->pos,
		.n_tokens = b->n,
		.chunk_tokens = b->c,
	};
}

/* Host to host, into a canary-guarded buffer. */
static uint8_t *gpu_block(struct kvfs_restore_cuda *rc,
			  const struct refmodel *rm, const struct block *b,
			  uint16_t kdt)
{
	struct kvfs_restore_io io = gpu_io(rm, b, kdt);
	uint8_t *kv = malloc(io.kv_len + 64);

	assert_non_null(kv);
	memset(kv, 0xa5, io.kv_len + 64);
	io.kv = kv;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), 0);
	for (size_t i = 0; i < 64; i++)
		assert_int_equal(kv[io.kv_len + i], 0xa5);
	return kv;
}

/* @g (GPU) against the reference and against @c (CPU), element-wise. */
static void compare(const struct refmodel *rm, const struct block *b,
		    const uint8_t *g, const uint8_t *c, uint16_t kdt)
{
	size_t len = kv_len(rm, b, kdt), es = esize(kdt), kl = len / rm->s.L;
	size_t n = len / es, same = 0;
	double worst_ref = 0, worst_cpu = 0;

	for (uint32_t l = 0; l < rm->s.L; l++)
		worst_ref = fmax(worst_ref,
				 check_layer(rm, b, l, g + l * kl, kdt));
	for (size_t i = 0; i < n; i++) {
		double gv = dec(kdt, g, i), cv = dec(kdt, c, i);
		double e = fabs(gv - cv) / (2 * tol(kdt, cv));

		if (!(e <= 1))
			print_error("element %zu: GPU %.9g, CPU %.9g\n", i, gv,
				    cv);
		assert_true(e <= 1);
		worst_cpu = fmax(worst_cpu, e);
		same += !memcmp(g + i * es, c + i * es, es);
	}
	print_message("    hidden %u -> kv %u, %u tokens at %llu: %.3f of the "
		      "reference bound, %.3f of the CPU bound, %.1f%% "
		      "identical\n", b->hdt, kdt, b->n,
		      (unsigned long long)b->pos, worst_ref, worst_cpu,
		      100.0 * (double)same / (double)n);
}

static void gpu_vs_cpu(struct kvfs_restore_cuda *rc,
		       const struct kvfs_restore *r, const struct refmodel *rm,
		       const struct block *b, uint16_t kdt)
{
	uint8_t *g = gpu_block(rc, rm, b, kdt), *c = cpu_block(r, rm, b, kdt);

	compare(rm, b, g, c, kdt);
	free(g);
	free(c);
}

/* ------------------------------------------------------- no device */

/* The child of test_no_device: no device is visible. */
static int child_no_device(const char *path)
{
	struct kvfs_restore_weights *w;
	struct kvfs_restore_cuda *rc = NULL;
	struct kvfs_restore *r = NULL;
	struct refmodel rm;
	int a, b;

	make_model(&rm, &ckpt_llama_mha_f32, 11);
	write_checkpoint(path, rm.t, rm.nt);
	if (kvfs_restore_load(&rm.m, path, 0, &r))
		return 2;
	a = kvfs_restore_cuda_init(r, 0, 0, &rc);
	w = calloc(rm.m.n_layers, sizeof(*w));
	if (!w)
		return 2;
	for (uint32_t l = 0; l < rm.m.n_layers; l++)
		if (kvfs_restore_layer_weights(r, l, &w[l]))
			return 2;
	b = kvfs_restore_cuda_init_weights(&rm.m, w, 0, 0, &rc);
	fprintf(stderr, "init without a device: %d, from weights: %d\n", a, b);
	free(w);
	kvfs_restore_free(r);
	free_model(&rm);
	if (rc)
		return 1;
	return ((a == -ENODEV || a == -EOPNOTSUPP) && a == b) ? 0 : 1;
}

static void test_no_device(void **state)
{
	struct kvfs_restore_io io = { 0 };
	struct kvfs_restore_cuda *rc = NULL;
	int status = 0, ret;
	pid_t pid;

	/* Arguments are checked before any device is looked for. */
	assert_int_equal(kvfs_restore_cuda_init(NULL, 0, 0, &rc), -EINVAL);
	assert_int_equal(kvfs_restore_cuda_init_weights(NULL, NULL, 0, 0, &rc),
			 -EINVAL);
	assert_null(rc);
	ret = kvfs_restore_cuda_block(NULL, &io);
	assert_true(ret == -EINVAL || ret == -EOPNOTSUPP);
	ret = kvfs_restore_cuda_blocks(NULL, &io, 1);
	assert_true(ret == -EINVAL || ret == -EOPNOTSUPP);
	ret = kvfs_restore_cuda_layer(NULL, 0, "", KVFS_DTYPE_F32, 0, 1, 1,
				      &io, KVFS_DTYPE_F32, 0);
	assert_true(ret == -EINVAL || ret == -EOPNOTSUPP);
	ret = kvfs_restore_cuda_layers(NULL, 0, 1, "", KVFS_DTYPE_F32, 0, 1, 1,
				       &io, KVFS_DTYPE_F32, 0);
	assert_true(ret == -EINVAL || ret == -EOPNOTSUPP);
	kvfs_restore_cuda_free(NULL);
	assert_int_equal(kvfs_restore_cuda_mem_bytes(NULL), 0);
	assert_int_equal(kvfs_restore_cuda_device(NULL), -1);

	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
		execl("/proc/self/exe", "test_restore_cuda", "--no-device",
		      ckpt_path("nodev.safetensors"), (char *)NULL);
		_exit(3);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* --------------------------------------------------- against the CPU */

struct gvc {
	struct kvfs_restore_cuda *rc;
	const struct kvfs_restore *r;
};

static void gvc_cb(void *arg, const struct refmodel *rm,
		   const struct block *b, uint16_t kdt)
{
	struct gvc *g = arg;

	gpu_vs_cpu(g->rc, g->r, rm, b, kdt);
}

/* The GPU against the CPU on @t's blocks; @mem_bytes (0: unchecked) are
 * the device bytes of the weights.
 */
static void run_case(const struct ckpt_case *t, const char *file,
		     uint64_t mem_bytes)
{
	struct kvfs_restore *r;
	struct refmodel rm;
	struct gvc g;

	make_model(&rm, t->spec, t->seed);
	r = ckpt_load(&rm, file, 0);
	g.r = r;
	g.rc = gpu_init(r, 0);
	if (mem_bytes)
		assert_int_equal(kvfs_restore_cuda_mem_bytes(g.rc), mem_bytes);
	ckpt_case_run(t, &rm, gvc_cb, &g);
	kvfs_restore_cuda_free(g.rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

static void test_llama_mha_f32(void **state)
{
	NEED_GPU();
	/* norms + K/V f32 + inv_freq: 2 * (32 + 2 * 32 * 32) * 4 + 4 * 8 */
	run_case(&ckpt_case_mha_f32, "mha.safetensors",
		 2 * (32 + 2 * 32 * 32) * 4 + 4 * 8);
}

static void test_llama_gqa_bf16_llama3(void **state)
{
	NEED_GPU();
	run_case(&ckpt_case_gqa_bf16, "gqa.safetensors", 0);
}

static void test_llama_linear_rope(void **state)
{
	NEED_GPU();
	run_case(&ckpt_case_linear_f16, "lin.safetensors", 0);
}

static void test_qwen2_bias(void **state)
{
	NEED_GPU();
	run_case(&ckpt_case_qwen2, "qwen2.safetensors", 0);
}

/* A lazily loaded checkpoint hands the GPU its mapped bf16 tensors: the
 * result is the same bytes as from the resident f32 copy.
 */
static void test_lazy_source(void **state)
{
	struct kvfs_restore_cuda *a, *z;
	struct kvfs_restore *res, *lazy;
	struct refmodel rm;
	struct block b;
	uint8_t *ka, *kz;

	NEED_GPU();
	make_model(&rm, &ckpt_llama_gqa_bf16, 5);
	res = ckpt_load(&rm, "res.safetensors", 0);
	lazy = ckpt_load(&rm, "lazy.safetensors", KVFS_RESTORE_LAZY);
	a = gpu_init(res, 0);
	z = gpu_init(lazy, 0);
	assert_int_equal(kvfs_restore_cuda_mem_bytes(a),
			 kvfs_restore_cuda_mem_bytes(z));
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	ka = gpu_block(a, &rm, &b, KVFS_DTYPE_F32);
	kz = gpu_block(z, &rm, &b, KVFS_DTYPE_F32);
	assert_memory_equal(ka, kz, kv_len(&rm, &b, KVFS_DTYPE_F32));
	free(ka);
	free(kz);
	free_block(&b);
	kvfs_restore_cuda_free(a);
	kvfs_restore_cuda_free(z);
	kvfs_restore_free(res);
	kvfs_restore_free(lazy);
	free_model(&rm);
}

/* ------------------------------------------------------- bf16 weights */

/*
 * The bf16-mode bound of every element of layer @l of @g: the reference
 * plus 1.05 * 2^-7 * sum |w * x̂| (both RoPE partners for K), plus the
 * output dtype's own bound.
 */
static double check_bf16_layer(const struct refmodel *rm,
			       const struct block *b, uint32_t l,
			       const uint8_t *g, uint16_t kdt)
{
	uint32_t H = rm->s.hidden, D = rm->kvd, hd = rm->s.hd, c = b->c;
	double *k = malloc(D * sizeof(double)), *v = malloc(D * sizeof(double));
	double *sk = malloc(D * sizeof(double)), *sv = malloc(D * sizeof(double));
	double *xn = malloc(H * sizeof(double)), worst = 0;

	assert_true(k && v && sk && sv && xn);
	for (uint32_t r = 0; r < b->n; r++) {
		const double *x = b->x + ((size_t)l * b->n + r) * H;
		size_t kbase = ((size_t)(r / c) * 2 * c + r % c) * D;
		size_t vbase = kbase + (size_t)c * D;
		double ms = 0;

		ref_kv(rm, l, x, b->pos + r, k, v);
		for (uint32_t j = 0; j < H; j++)
			ms += x[j] * x[j];
		for (uint32_t j = 0; j < H; j++)
			xn[j] = x[j] / sqrt(ms / H + rm->s.eps) *
				rm->norm[(size_t)l * H + j];
		for (uint32_t o = 0; o < D; o++) {
			sk[o] = sv[o] = 0;
			for (uint32_t j = 0; j < H; j++) {
				size_t w = ((size_t)l * D + o) * H + j;

				sk[o] += fabs(rm->wk[w] * xn[j]);
				sv[o] += fabs(rm->wv[w] * xn[j]);
			}
		}
		for (uint32_t o = 0; o < D; o++) {
			uint32_t j = o % hd, mate = j < hd / 2 ? o + hd / 2 :
							      o - hd / 2;
			double ek = 1.05 * ldexp(sk[o] + sk[mate], -7);
			double ev = 1.05 * ldexp(sv[o], -7);
			double gk = dec(kdt, g, kbase + o);
			double gv = dec(kdt, g, vbase + o);
			double rk = fabs(gk - k[o]) /
				    (ek + tol(kdt, fabs(k[o]) + ek));
			double rv = fabs(gv - v[o]) /
				    (ev + tol(kdt, fabs(v[o]) + ev));

			if (!(rk <= 1) || !(rv <= 1))
				print_error("layer %u row %u elem %u: K %.9g vs %.9g, V %.9g vs %.9g\n",
					    l, r, o, gk, k[o], gv, v[o]);
			assert_true(rk <= 1);
			assert_true(rv <= 1);
			worst = fmax(worst, fmax(rk, rv));
		}
	}
	for (uint32_t r = b->n; r < b->rows; r++) {
		size_t kbase = ((size_t)(r / c) * 2 * c + r % c) * D;

		for (uint32_t o = 0; o < D; o++) {
			assert_true(dec(kdt, g, kbase + o) == 0);
			assert_true(dec(kdt, g, kbase + (size_t)c * D + o) == 0);
		}
	}
	free(k);
	free(v);
	free(sk);
	free(sv);
	free(xn);
	return worst;
}

static void bf16_mode(const struct spec *s, uint64_t seed, const char *file,
		      uint16_t hdt, uint16_t kdt)
{
	struct kvfs_restore_cuda *rc, *rc32;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	uint8_t *g;
	size_t kl;
	double worst = 0;

	make_model(&rm, s, seed);
	r = ckpt_load(&rm, file, 0);
	rc = gpu_init(r, KVFS_RESTORE_CUDA_BF16);
	rc32 = gpu_init(r, 0);
	/* bf16 K/V weights take half the f32 bytes */
	assert_int_equal(kvfs_restore_cuda_mem_bytes(rc32) -
				 kvfs_restore_cuda_mem_bytes(rc),
			 (uint64_t)rm.s.L * 2 * rm.kvd * rm.s.hidden * 2);
	make_block(&b, &rm, hdt, 37, 16, 1000);
	g = gpu_block(rc, &rm, &b, kdt);
	kl = kv_len(&rm, &b, kdt) / rm.s.L;
	for (uint32_t l = 0; l < rm.s.L; l++)
		worst = fmax(worst, check_bf16_layer(&rm, &b, l, g + l * kl,
						     kdt));
	print_message("    bf16 weights, kv %u: %.3f of the bound\n", kdt,
		      worst);
	free(g);
	free_block(&b);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_cuda_free(rc32);
	kvfs_restore_free(r);
	free_model(&rm);
}

static void test_bf16_weights(void **state)
{
	NEED_GPU();
	bf16_mode(&ckpt_llama_gqa_bf16, 12, "b16a.safetensors", KVFS_DTYPE_BF16,
		  KVFS_DTYPE_F32);
	bf16_mode(&ckpt_llama_mha_f32, 13, "b16b.safetensors", KVFS_DTYPE_F32,
		  KVFS_DTYPE_BF16);
	bf16_mode(&ckpt_qwen2_bias, 14, "b16c.safetensors", KVFS_DTYPE_BF16,
		  KVFS_DTYPE_BF16);
}

/* --------------------------------------------------------- API shapes */

/* Layer calls, and runs of layers, equal the block's slices; a layer
 * range leaves the other layers untouched; the RoPE table follows
 * start_pos and n_tokens.
 */
static void test_layer_api(void **state)
{
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore_io io;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b, b2;
	uint8_t *full, *one, *part, *again, *other;
	size_t len, kl, hl;

	NEED_GPU();
	make_model(&rm, &ckpt_llama_gqa_bf16, 6);
	r = ckpt_load(&rm, "layer.safetensors", 0);
	rc = gpu_init(r, 0);
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	full = gpu_block(rc, &rm, &b, KVFS_DTYPE_BF16);
	len = kv_len(&rm, &b, KVFS_DTYPE_BF16);
	kl = len / 3;
	hl = b.hidden_len / 3;

	one = malloc(kl);
	assert_non_null(one);
	for (uint32_t l = 0; l < 3; l++) {
		memset(one, 0x77, kl);
		assert_int_equal(kvfs_restore_cuda_layer(rc, l, b.hidden + l * hl,
							 KVFS_DTYPE_BF16, 1000,
							 37, 16, one,
							 KVFS_DTYPE_BF16, 0),
				 0);
		assert_memory_equal(one, full + l * kl, kl);
	}

	part = malloc(len);
	assert_non_null(part);
	memset(part, 0x5a, len);
	io = gpu_io(&rm, &b, KVFS_DTYPE_BF16);
	io.kv = part;
	io.first_layer = 1;
	io.n_layers = 1;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), 0);
	for (size_t i = 0; i < kl; i++) {
		assert_int_equal(part[i], 0x5a);
		assert_int_equal(part[2 * kl + i], 0x5a);
	}
	assert_memory_equal(part + kl, full + kl, kl);
	/* layers [1, end) */
	memset(part, 0x5a, len);
	io.n_layers = 0;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), 0);
	for (size_t i = 0; i < kl; i++)
		assert_int_equal(part[i], 0x5a);
	assert_memory_equal(part + kl, full + kl, 2 * kl);
	/* the same runs through kvfs_restore_cuda_layers(): all three, then
	 * [1, 3) alone; a run of none or past the last layer is refused
	 */
	memset(part, 0x5a, len);
	assert_int_equal(kvfs_restore_cuda_layers(rc, 0, 3, b.hidden,
						  KVFS_DTYPE_BF16, 1000, 37,
						  16, part, KVFS_DTYPE_BF16,
						  0),
			 0);
	assert_memory_equal(part, full, len);
	memset(part, 0x5a, len);
	assert_int_equal(kvfs_restore_cuda_layers(rc, 1, 2, b.hidden + hl,
						  KVFS_DTYPE_BF16, 1000, 37,
						  16, part + kl,
						  KVFS_DTYPE_BF16, 0),
			 0);
	for (size_t i = 0; i < kl; i++)
		assert_int_equal(part[i], 0x5a);
	assert_memory_equal(part + kl, full + kl, 2 * kl);
	assert_int_equal(kvfs_restore_cuda_layers(rc, 1, 0, b.hidden + hl,
						  KVFS_DTYPE_BF16, 1000, 37,
						  16, part + kl,
						  KVFS_DTYPE_BF16, 0),
			 -EINVAL);
	assert_int_equal(kvfs_restore_cuda_layers(rc, 2, 2, b.hidden + hl,
						  KVFS_DTYPE_BF16, 1000, 37,
						  16, part + kl,
						  KVFS_DTYPE_BF16, 0),
			 -EINVAL);

	/* a bigger block elsewhere grows the workspace and moves the
	 * table; the first block then gives the same bytes again
	 */
	make_block(&b2, &rm, KVFS_DTYPE_BF16, 300, 16, 5);
	other = gpu_block(rc, &rm, &b2, KVFS_DTYPE_BF16);
	free(other);
	again = gpu_block(rc, &rm, &b, KVFS_DTYPE_BF16);
	assert_memory_equal(again, full, len);

	free(again);
	free(part);
	free(one);
	free(full);
	free_block(&b);
	free_block(&b2);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

#ifdef KVFS_HAVE_CUDA
/* Hidden and KV in device, pinned and pageable memory, in every
 * combination: the same bytes.  Wrong placements are refused and leave
 * the handle usable.
 */
static void test_placements(void **state)
{
	/* The last of each: page-locked memory passed as pageable, which
	 * the restorer notices and uses as pinned.
	 */
	static const unsigned hid[] = { 0, KVFS_RC_HIDDEN_DEVICE,
					KVFS_RC_HIDDEN_PINNED, 0 };
	static const unsigned kvw[] = { 0, KVFS_RC_KV_DEVICE,
					KVFS_RC_KV_PINNED, 0 };
	struct kvfs_restore_io io;
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	void *dh = NULL, *dk = NULL, *ph = NULL, *pk = NULL;
	uint8_t *ref, *out;
	size_t len;

	NEED_GPU();
	make_model(&rm, &ckpt_qwen2_bias, 15);
	r = ckpt_load(&rm, "place.safetensors", 0);
	rc = gpu_init(r, 0);
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	ref = gpu_block(rc, &rm, &b, KVFS_DTYPE_BF16);
	len = kv_len(&rm, &b, KVFS_DTYPE_BF16);
	out = malloc(len);
	assert_non_null(out);
	assert_int_equal(cudaSetDevice(0), cudaSuccess);
	assert_int_equal(cudaMalloc(&dh, b.hidden_len), cudaSuccess);
	assert_int_equal(cudaMalloc(&dk, len), cudaSuccess);
	assert_int_equal(cudaHostAlloc(&ph, b.hidden_len, 0), cudaSuccess);
	assert_int_equal(cudaHostAlloc(&pk, len, 0), cudaSuccess);
	assert_int_equal(cudaMemcpy(dh, b.hidden, b.hidden_len,
				    cudaMemcpyHostToDevice), cudaSuccess);
	memcpy(ph, b.hidden, b.hidden_len);

	for (int i = 0; i < 4; i++) {
		for (int j = 0; j < 4; j++) {
			io = gpu_io(&rm, &b, KVFS_DTYPE_BF16);
			io.flags = hid[i] | kvw[j];
			io.hidden = i == 1 ? dh : i >= 2 ? ph : b.hidden;
			io.kv = j == 1 ? dk : j >= 2 ? pk : out;
			assert_int_equal(cudaMemset(dk, 0x33, len),
					 cudaSuccess);
			memset(pk, 0x33, len);
			memset(out, 0x33, len);
			assert_int_equal(kvfs_restore_cuda_block(rc, &io), 0);
			if (j == 1)
				assert_int_equal(cudaMemcpy(out, dk, len,
							    cudaMemcpyDeviceToHost),
						 cudaSuccess);
			else if (j >= 2)
				memcpy(out, pk, len);
			assert_memory_equal(out, ref, len);
		}
	}

	/* pageable memory called device memory, device memory called
	 * pinned, both at once, a misaligned device pointer
	 */
	io = gpu_io(&rm, &b, KVFS_DTYPE_BF16);
	io.kv = out;
	io.flags = KVFS_RC_KV_DEVICE;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), -EINVAL);
	io.flags = KVFS_RC_HIDDEN_PINNED;
	io.hidden = dh;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), -EINVAL);
	io.flags = KVFS_RC_HIDDEN_PINNED | KVFS_RC_HIDDEN_DEVICE;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), -EINVAL);
	io.flags = KVFS_RC_KV_DEVICE;
	io.hidden = b.hidden;
	io.kv = (uint8_t *)dk + 1;
	io.kv_len = len;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), -EINVAL);
	free(ref);
	ref = gpu_block(rc, &rm, &b, KVFS_DTYPE_BF16);
	io = gpu_io(&rm, &b, KVFS_DTYPE_BF16);
	io.kv = out;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), 0);
	assert_memory_equal(out, ref, len);

	cudaFree(dh);
	cudaFree(dk);
	cudaFreeHost(ph);
	cudaFreeHost(pk);
	free(out);
	free(ref);
	free_block(&b);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

/*
 * kvfs_restore_cuda_blocks(): blocks of different lengths and positions,
 * some hidden payloads page-locked and some pageable, restored together
 * into one device buffer, each equal to the CPU path within its bound
 * and no byte between them touched; the same with KVFS_RESTORE_BATCH_ROWS
 * small, so that the blocks go in several rounds (a GEMM of other shape
 * may sum in another order, so the two are held to the same bound rather
 * than compared byte for byte).  Then
 * what a batch refuses, and that the handle still restores afterwards.
 */
#define BATCH_N 6
static void batch_run(const struct kvfs_restore *r, const struct refmodel *rm,
		      struct block *b, uint16_t kdt, const char *rows)
{
	struct kvfs_restore_io io[BATCH_N];
	struct kvfs_restore_cuda *rc;
	size_t off[BATCH_N + 1], gap = 256;
	void *pin[BATCH_N] = { NULL };
	uint8_t *dev = NULL, *host;

	if (rows)
		setenv("KVFS_RESTORE_BATCH_ROWS", rows, 1);
	rc = gpu_init(r, 0);
	unsetenv("KVFS_RESTORE_BATCH_ROWS");
	off[0] = 0;
	for (int i = 0; i < BATCH_N; i++)
		off[i + 1] = off[i] + kv_len(rm, &b[i], kdt) + gap;
	assert_int_equal(cudaMalloc((void **)&dev, off[BATCH_N]), cudaSuccess);
	assert_int_equal(cudaMemset(dev, 0x5a, off[BATCH_N]), cudaSuccess);
	for (int i = 0; i < BATCH_N; i++) {
		io[i] = gpu_io(rm, &b[i], kdt);
		io[i].kv = dev + off[i];
		io[i].flags = KVFS_RC_KV_DEVICE;
		if (i % 3 == 1) {
			/* page-locked, said so */
			assert_int_equal(cudaHostAlloc(&pin[i],
						       b[i].hidden_len, 0),
					 cudaSuccess);
			memcpy(pin[i], b[i].hidden, b[i].hidden_len);
			io[i].hidden = pin[i];
			io[i].flags |= KVFS_RC_HIDDEN_PINNED;
		} else if (i % 3 == 2) {
			/* page-locked, passed as pageable */
			assert_int_equal(cudaHostAlloc(&pin[i],
						       b[i].hidden_len, 0),
					 cudaSuccess);
			memcpy(pin[i], b[i].hidden, b[i].hidden_len);
			io[i].hidden = pin[i];
		}
	}
	assert_int_equal(kvfs_restore_cuda_blocks(rc, io, BATCH_N), 0);
	host = malloc(off[BATCH_N]);
	assert_non_null(host);
	assert_int_equal(cudaMemcpy(host, dev, off[BATCH_N],
				    cudaMemcpyDeviceToHost), cudaSuccess);
	for (int i = 0; i < BATCH_N; i++) {
		uint8_t *c = cpu_block(r, rm, &b[i], kdt);
		size_t len = kv_len(rm, &b[i], kdt);

		compare(rm, &b[i], host + off[i], c, kdt);
		for (size_t k = 0; k < gap; k++)
			assert_int_equal(host[off[i] + len + k], 0x5a);
		free(c);
		cudaFreeHost(pin[i]);
	}
	free(host);
	cudaFree(dev);
	kvfs_restore_cuda_free(rc);
}

static void test_batch(void **state)
{
	/* n_tokens and start_pos: full, partial, long and one-row blocks */
	static const uint32_t n[BATCH_N] = { 16, 16, 7, 37, 1, 16 };
	static const uint64_t pos[BATCH_N] = { 0, 16, 32, 1000, 5, 48 };
	struct kvfs_restore_io io[2], one;
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b[BATCH_N];
	uint8_t *dk = NULL, *kv;
	size_t len;

	NEED_GPU();
	make_model(&rm, &ckpt_qwen2_bias, 19);
	r = ckpt_load(&rm, "batch.safetensors", 0);
	for (int i = 0; i < BATCH_N; i++)
		make_block(&b[i], &rm, KVFS_DTYPE_BF16, n[i], 16, pos[i]);
	batch_run(r, &rm, b, KVFS_DTYPE_BF16, NULL);
	/* 20 rows a round: {16}, {16}, {7}, {37} alone, {1, 16} */
	batch_run(r, &rm, b, KVFS_DTYPE_BF16, "20");
	/* Where the runtime has no batched copies, one call a block (the
	 * stand-in refuses them on request; a GPU ignores the variable).
	 */
	setenv("KVFS_CUDAEMU_NO_BATCH_COPY", "1", 1);
	batch_run(r, &rm, b, KVFS_DTYPE_BF16, NULL);
	unsetenv("KVFS_CUDAEMU_NO_BATCH_COPY");

	rc = gpu_init(r, 0);
	len = kv_len(&rm, &b[0], KVFS_DTYPE_BF16);
	assert_int_equal(cudaMalloc((void **)&dk, 2 * len), cudaSuccess);
	for (int i = 0; i < 2; i++) {
		io[i] = gpu_io(&rm, &b[i], KVFS_DTYPE_BF16);
		io[i].kv = dk + i * len;
		io[i].flags = KVFS_RC_KV_DEVICE;
	}
	assert_int_equal(kvfs_restore_cuda_blocks(NULL, io, 2), -EINVAL);
	assert_int_equal(kvfs_restore_cuda_blocks(rc, NULL, 2), -EINVAL);
	assert_int_equal(kvfs_restore_cuda_blocks(rc, io, 0), -EINVAL);
#define BATCH_REFUSED(field, value)                                      \
	do {                                                             \
		one = io[1];                                             \
		io[1].field = value;                                     \
		assert_int_equal(kvfs_restore_cuda_blocks(rc, io, 2),    \
				 -EINVAL);                               \
		io[1] = one;                                             \
	} while (0)
	/* one bad request refuses the batch */
	BATCH_REFUSED(hidden_len, b[1].hidden_len - 1);
	BATCH_REFUSED(hidden, NULL);
	/* the rules of a batch */
	BATCH_REFUSED(flags, 0);
	BATCH_REFUSED(flags, KVFS_RC_KV_PINNED);
	BATCH_REFUSED(n_layers, 1);
	BATCH_REFUSED(first_layer, 1);
	BATCH_REFUSED(kv_dtype, KVFS_DTYPE_F32);
	/* device memory that is not */
	kv = malloc(len);
	assert_non_null(kv);
	BATCH_REFUSED(kv, kv);
#undef BATCH_REFUSED
	/* still usable */
	assert_int_equal(kvfs_restore_cuda_blocks(rc, io, 2), 0);
	for (int i = 0; i < 2; i++) {
		uint8_t *c = cpu_block(r, &rm, &b[i], KVFS_DTYPE_BF16);

		assert_int_equal(cudaMemcpy(kv, dk + i * len, len,
					    cudaMemcpyDeviceToHost),
				 cudaSuccess);
		compare(&rm, &b[i], kv, c, KVFS_DTYPE_BF16);
		free(c);
	}
	free(kv);
	cudaFree(dk);
	kvfs_restore_cuda_free(rc);
	for (int i = 0; i < BATCH_N; i++)
		free_block(&b[i]);
	kvfs_restore_free(r);
	free_model(&rm);
}
#else
static void test_placements(void **state)
{
	NEED_GPU();
	fail_msg("KVFS_TEST_GPU=cuda on a build without CUDA");
}

static void test_batch(void **state)
{
	NEED_GPU();
	fail_msg("KVFS_TEST_GPU=cuda on a build without CUDA");
}
#endif

/* Defined only by the cudart stand-in (tests/gpu/cudaemu.c): whether this
 * build runs on it, where KVFS_CUDAEMU_PIN_LIMIT can refuse pinning.
 */
bool kvfs_cudaemu_is_device(const void *p, size_t len) __attribute__((weak));

/* The restorer's page-locked buffers: page-locked and 4096-aligned, a
 * buffer given back is handed out again, a larger request gets a larger
 * one, and more than the pool keeps at once still get buffers.  A
 * restoration from and into them equals one from and into the heap.
 */
static void test_host_buffers(void **state)
{
	struct kvfs_restore_io io;
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	void *p[6] = { 0 }, *q = NULL;
	uint8_t *ref;
	size_t len;

	NEED_GPU();
	make_model(&rm, &ckpt_llama_gqa_bf16, 2);
	r = ckpt_load(&rm, "host.safetensors", 0);
	rc = gpu_init(r, 0);
	assert_int_equal(kvfs_restore_cuda_host_get(rc, 0, &q), -EINVAL);
	assert_int_equal(kvfs_restore_cuda_host_get(NULL, 1, &q), -EINVAL);
	assert_null(q);

	assert_int_equal(kvfs_restore_cuda_host_get(rc, 5000, &p[0]), 0);
	assert_non_null(p[0]);
	assert_int_equal((uintptr_t)p[0] % 4096, 0);
#ifdef KVFS_HAVE_CUDA
	{
		struct cudaPointerAttributes a;

		assert_int_equal(cudaPointerGetAttributes(&a, p[0]),
				 cudaSuccess);
		assert_int_equal(a.type, cudaMemoryTypeHost);
	}
#endif
	memset(p[0], 0x5c, 5000);
	kvfs_restore_cuda_host_put(rc, p[0]);
	assert_int_equal(kvfs_restore_cuda_host_get(rc, 4096, &q), 0);
	assert_ptr_equal(q, p[0]);
	/* more than the pool keeps, one larger than the rest */
	for (int i = 1; i < 6; i++) {
		assert_int_equal(kvfs_restore_cuda_host_get(
					 rc, i == 3 ? (3u << 20) : 4096, &p[i]),
				 0);
		assert_non_null(p[i]);
		assert_int_equal((uintptr_t)p[i] % 4096, 0);
		assert_ptr_not_equal(p[i], q);
		for (int j = 1; j < i; j++)
			assert_ptr_not_equal(p[i], p[j]);
		memset(p[i], i, i == 3 ? (3u << 20) : 4096);
	}
	kvfs_restore_cuda_host_put(rc, q);
	for (int i = 1; i < 6; i++)
		kvfs_restore_cuda_host_put(rc, p[i]);
	kvfs_restore_cuda_host_put(rc, NULL);
	/* the larger kept buffer serves a larger request again */
	assert_int_equal(kvfs_restore_cuda_host_get(rc, 2u << 20, &q), 0);
	assert_ptr_equal(q, p[3]);

	make_block(&b, &rm, KVFS_DTYPE_BF16, 21, 16, 77);
	ref = gpu_block(rc, &rm, &b, KVFS_DTYPE_BF16);
	len = kv_len(&rm, &b, KVFS_DTYPE_BF16);
	assert_int_equal(kvfs_restore_cuda_host_get(rc, b.hidden_len, &p[0]),
			 0);
	memcpy(p[0], b.hidden, b.hidden_len);
	memset(q, 0x33, len);
	io = gpu_io(&rm, &b, KVFS_DTYPE_BF16);
	io.hidden = p[0];
	io.kv = q;
	assert_int_equal(kvfs_restore_cuda_block(rc, &io), 0);
	assert_memory_equal(q, ref, len);
	kvfs_restore_cuda_host_put(rc, p[0]);
	kvfs_restore_cuda_host_put(rc, q);

	/* At most 16 are out at once: the 17th request is refused, and
	 * served again once one is given back.
	 */
	{
		void *many[16];

		for (int i = 0; i < 16; i++) {
			assert_int_equal(kvfs_restore_cuda_host_get(
						 rc, 4096, &many[i]),
					 0);
			assert_int_equal((uintptr_t)many[i] % 4096, 0);
		}
		assert_int_equal(kvfs_restore_cuda_host_get(rc, 4096, &q),
				 -EBUSY);
		kvfs_restore_cuda_host_put(rc, many[7]);
		assert_int_equal(kvfs_restore_cuda_host_get(rc, 4096, &q), 0);
		assert_ptr_equal(q, many[7]);
		many[7] = q;
		for (int i = 0; i < 16; i++)
			kvfs_restore_cuda_host_put(rc, many[i]);
		/* not the pool's: ignored */
		kvfs_restore_cuda_host_put(rc, &many[0]);
	}

	/* The stand-in refuses a cudaHostRegister() larger than
	 * KVFS_CUDAEMU_PIN_LIMIT, as a low RLIMIT_MEMLOCK can: a request no
	 * kept buffer can serve is refused with -ENOMEM, and from then on
	 * none is pinned anew, while kept buffers are still handed out.
	 */
	if (kvfs_cudaemu_is_device) {
		setenv("KVFS_CUDAEMU_PIN_LIMIT", "4194304", 1);
		assert_int_equal(kvfs_restore_cuda_host_get(rc, 5u << 20, &q),
				 -ENOMEM);
		unsetenv("KVFS_CUDAEMU_PIN_LIMIT");
		assert_int_equal(kvfs_restore_cuda_host_get(rc, 5u << 20, &q),
				 -ENOMEM);
		assert_int_equal(kvfs_restore_cuda_host_get(rc, 4096, &q), 0);
		kvfs_restore_cuda_host_put(rc, q);
	}

	free(ref);
	free_block(&b);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

/*
 * The daemon's restore from the SSD (kvfs_cache_restore_stream()) with a
 * GPU restorer: a HIDDEN image on an in-memory SSD tier,
 * pipelined (the layers in runs as they arrive) and read whole (one run
 * of every layer), from and into heap memory and page-locked buffers,
 * gives the KV file built from the GPU's whole-block restoration, byte
 * for byte: the same kernels and GEMMs per layer, however the layers are
 * grouped.  Every layer is projected on the GPU.
 */
static void test_stream_on_gpu(void **state)
{
	const uint16_t dt = KVFS_DTYPE_BF16;
	const uint32_t n = 37, C = 16;
	struct kvfs_restore_stream rs;
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore *r;
	struct kvfs_extent e;
	struct kvfs_tier *ssd;
	struct refmodel rm;
	struct kvfs_geom g;
	struct block b;
	uint8_t root[16], parent[16], *full, *want, *hid, *heap[2];
	void *pin[2] = { NULL, NULL };
	uint64_t kvsz, hsz, po, al;
	uint32_t tok[48], L;

	NEED_GPU();
	make_model(&rm, &ckpt_llama_gqa_bf16, 8);
	L = rm.m.n_layers;
	r = ckpt_load(&rm, "stream.safetensors", 0);
	rc = gpu_init(r, 0);
	make_block(&b, &rm, dt, n, C, 960);
	full = gpu_block(rc, &rm, &b, dt);
	g = (struct kvfs_geom){ .n_layers = L,
				.n_kv_heads = rm.m.n_kv_heads,
				.head_dim = rm.m.head_dim,
				.hidden_size = rm.m.hidden_size,
				.block_tokens = 48,
				.chunk_tokens = C,
				.dtype = dt };
	for (int i = 0; i < 16; i++) {
		root[i] = (uint8_t)(i + 1);
		parent[i] = (uint8_t)(0xa0 + i);
	}
	for (uint32_t i = 0; i < n; i++)
		tok[i] = 5000 + i;
	po = kvfs_fmt_payload_off(n);
	kvsz = kvfs_fmt_file_size(&g, KVFS_KIND_KV, n);
	hsz = kvfs_fmt_split_file_size(&g, n, L);
	al = kvfs_util_align_up(hsz, 4096);
	assert_int_equal(kvsz - po, kv_len(&rm, &b, dt));
	want = malloc(kvsz);
	hid = aligned_alloc(4096, al);
	heap[0] = aligned_alloc(4096, al);
	heap[1] = aligned_alloc(4096, kvfs_util_align_up(kvsz, 4096));
	assert_true(want && hid && heap[0] && heap[1]);
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, parent, 960, tok, n,
					full, want, kvsz),
			 0);
	memset(hid, 0, al);
	assert_int_equal(kvfs_fmt_build_split(&g, L, parent, 960, tok, n,
					      b.hidden, hid, hsz),
			 0);
	assert_int_equal(kvfs_tier_ssd_init(NULL, 4096, 1u << 22, 1,
					    KVFS_SSD_MEMORY, &ssd),
			 0);
	assert_int_equal(ssd->ops->alloc(ssd, al, &e), 0);
	assert_int_equal(ssd->ops->write(ssd, &e, 0, hid, al), 0);
	assert_int_equal(kvfs_restore_cuda_host_get(rc, al, &pin[0]), 0);
	assert_int_equal(kvfs_restore_cuda_host_get(rc, kvsz, &pin[1]), 0);

	for (int locked = 0; locked < 2; locked++) {
		for (int whole = 0; whole < 2; whole++) {
			memset(&rs, 0, sizeof(rs));
			rs.ssd = ssd;
			rs.ext = &e;
			rs.g = &g;
			rs.rst = r;
			rs.rc = rc;
			rs.n_tokens = n;
			rs.kv_from = L;
			rs.start_pos = 960;
			rs.hdr_crc = kvfs_util_get32(hid + 84);
			rs.key = hid + 64;
			rs.root = root;
			rs.img = locked ? pin[0] : heap[0];
			rs.dst = locked ? pin[1] : heap[1];
			rs.dst_len = kvsz;
			rs.flags = whole ? KVFS_RS_WHOLE : 0;
			memset(rs.dst, 0x77, kvsz);
			assert_int_equal(kvfs_cache_restore_stream(&rs), 0);
			assert_false(rs.gpu_failed);
			assert_int_equal(rs.gpu_layers, L);
			assert_memory_equal(rs.dst, want, kvsz);
		}
	}

	kvfs_restore_cuda_host_put(rc, pin[0]);
	kvfs_restore_cuda_host_put(rc, pin[1]);
	kvfs_tier_free(ssd);
	free(want);
	free(hid);
	free(heap[0]);
	free(heap[1]);
	free(full);
	free_block(&b);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

static void test_bad_requests(void **state)
{
	struct kvfs_restore_cuda *rc = NULL;
	struct kvfs_restore_io io, ok;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	uint8_t *kv, *ref;
	size_t len;

	NEED_GPU();
	make_model(&rm, &ckpt_llama_mha_f32, 16);
	r = ckpt_load(&rm, "bad.safetensors", 0);
	assert_int_equal(kvfs_restore_cuda_init(r, 0, 1u << 7, &rc), -EINVAL);
	assert_int_equal(kvfs_restore_cuda_init(r, 4096, 0, &rc), -ENODEV);
	assert_int_equal(kvfs_restore_cuda_init(r, -1, 0, &rc), -ENODEV);
	assert_null(rc);
	rc = gpu_init(r, 0);
	make_block(&b, &rm, KVFS_DTYPE_F32, 10, 4, 50);
	len = kv_len(&rm, &b, KVFS_DTYPE_F32);
	kv = malloc(len);
	assert_non_null(kv);
	ok = gpu_io(&rm, &b, KVFS_DTYPE_F32);
	ok.kv = kv;

#define REFUSED(field, value)                                             \
	do {                                                              \
		io = ok;                                                  \
		io.field = value;                                         \
		assert_int_equal(kvfs_restore_cuda_block(rc, &io), -EINVAL); \
	} while (0)
	REFUSED(hidden_len, b.hidden_len - 1);
	REFUSED(kv_len, len + 4);
	REFUSED(hidden_dtype, 9);
	REFUSED(kv_dtype, 0);
	REFUSED(n_tokens, 0);
	REFUSED(chunk_tokens, 0);
	REFUSED(start_pos, (1ull << 53) - 5);
	REFUSED(first_layer, 2);
	REFUSED(n_layers, 3);
	REFUSED(flags, 1u << 9);
	REFUSED(hidden, NULL);
#undef REFUSED
	assert_int_equal(kvfs_restore_cuda_layer(rc, 2, b.hidden,
						 KVFS_DTYPE_F32, 50, 10, 4, kv,
						 KVFS_DTYPE_F32, 0), -EINVAL);
	assert_int_equal(kvfs_restore_cuda_profile(rc, 0, KVFS_DTYPE_F32,
						   &(struct kvfs_restore_cuda_prof){ 0 }),
			 -EINVAL);
	/* still usable, and right */
	ref = cpu_block(r, &rm, &b, KVFS_DTYPE_F32);
	assert_int_equal(kvfs_restore_cuda_block(rc, &ok), 0);
	compare(&rm, &b, kv, ref, KVFS_DTYPE_F32);
	free(ref);
	free(kv);
	free_block(&b);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

struct thr {
	struct kvfs_restore_cuda *rc;
	const struct refmodel *rm;
	const struct block *b;
	uint8_t *out;
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;
	struct kvfs_restore_io io = gpu_io(t->rm, t->b, KVFS_DTYPE_F32);

	t->out = malloc(io.kv_len);
	if (!t->out)
		return NULL;
	io.kv = t->out;
	for (int i = 0; i < 8; i++)
		if (kvfs_restore_cuda_block(t->rc, &io)) {
			free(t->out);
			t->out = NULL;
			break;
		}
	return NULL;
}

/* Four threads on one handle: calls are serialised, results identical. */
static void test_threads(void **state)
{
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	struct thr t[4];
	pthread_t tid[4];
	uint8_t *ref;

	NEED_GPU();
	make_model(&rm, &ckpt_qwen2_bias, 7);
	r = ckpt_load(&rm, "thr.safetensors", 0);
	rc = gpu_init(r, 0);
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	ref = gpu_block(rc, &rm, &b, KVFS_DTYPE_F32);
	for (int i = 0; i < 4; i++) {
		t[i] = (struct thr){ .rc = rc, .rm = &rm, .b = &b };
		assert_int_equal(pthread_create(&tid[i], NULL, thr_main, &t[i]),
				 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(tid[i], NULL), 0);
		assert_non_null(t[i].out);
		assert_memory_equal(t[i].out, ref,
				    kv_len(&rm, &b, KVFS_DTYPE_F32));
		free(t[i].out);
	}
	free(ref);
	free_block(&b);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

static void test_profile(void **state)
{
	struct kvfs_restore_cuda_prof p = { 0 };
	struct kvfs_restore_cuda *rc;
	struct kvfs_restore *r;
	struct refmodel rm;

	NEED_GPU();
	make_model(&rm, &ckpt_qwen2_bias, 17);
	r = ckpt_load(&rm, "prof.safetensors", 0);
	rc = gpu_init(r, 0);
	assert_int_equal(kvfs_restore_cuda_profile(rc, 64, KVFS_DTYPE_BF16,
						   &p), 0);
	assert_true(p.gemm > 0 && p.compute > 0 && p.h2d_hidden > 0 &&
		    p.h2d_kv > 0);
	print_message("    64 tokens: gemm %.1f us, compute %.1f us, H2D "
		      "hidden %.1f us, KV %.1f us\n", p.gemm * 1e6,
		      p.compute * 1e6, p.h2d_hidden * 1e6, p.h2d_kv * 1e6);
	kvfs_restore_cuda_free(rc);
	kvfs_restore_free(r);
	free_model(&rm);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_device),
		cmocka_unit_test(test_llama_mha_f32),
		cmocka_unit_test(test_llama_gqa_bf16_llama3),
		cmocka_unit_test(test_llama_linear_rope),
		cmocka_unit_test(test_qwen2_bias),
		cmocka_unit_test(test_lazy_source),
		cmocka_unit_test(test_bf16_weights),
		cmocka_unit_test(test_layer_api),
		cmocka_unit_test(test_placements),
		cmocka_unit_test(test_batch),
		cmocka_unit_test(test_host_buffers),
		cmocka_unit_test(test_stream_on_gpu),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_profile),
	};

	if (argc == 3 && !strcmp(argv[1], "--no-device"))
		return child_no_device(argv[2]);
	return cmocka_run_group_tests(tests, setup, teardown);
}
