/* SPDX-License-Identifier: MIT */
/*
 * GPU hidden-state restoration (gpu/restore_cuda.h) on two geometries: a
 * Llama-2-7B-like layer (MHA: hidden 4096, 32 KV heads x 128) and a
 * Llama-3-8B-like one (GQA: hidden 4096, 8 KV heads x 128), bf16 hidden
 * states and KV, chunks of 256 tokens, random weights made in memory.  In the same run,
 * for the same shapes, it times:
 *   restore   kvfs_restore_cuda_block(): pinned hidden states -> KV in
 *             device memory (also from pageable memory);
 *   gemm      the projection GEMM alone (kvfs_restore_cuda_profile());
 *   h2d kv    cudaMemcpyAsync of the KV bytes from pinned memory: what
 *             loading the KV form instead (KV offload) costs;
 * and prints per-layer times and the ratios restore/gemm and
 * h2d kv/restore (the paper's speed-up over KV offload is 1.27-1.93x).
 * Both weight modes: f32 (cublasSgemm) and bf16 (tensor cores).
 *
 *   bench_restore_cuda [TOKENS...]   (default 256 1024 4096 16384)
 *
 * Prints "skipped: no CUDA device" and exits 0 without one.  Figures only.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hcache/restore.h"
#include "gpu/restore_cuda.h"
#include "bench_i.h"

#ifndef KVFS_HAVE_CUDA

int main(void)
{
	printf("skipped: no CUDA device (built without CUDA)\n");
	return 0;
}

#else

#include <cuda_runtime_api.h>

#define LAYERS 8u
#define HIDDEN 4096u
#define MAX_HEADS 32u
#define HEAD_DIM 128u
#define CHUNK 256u
#define RUNS 5

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rng = 42;

/* A bf16 value of about +-@scale. */
static uint16_t rnd_bf16(float scale)
{
	float f;

	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	f = ((float)(rng >> 40) / (float)(1 << 24) * 2 - 1) * scale;
	return kvfs_restore_f32_to_bf16(f);
}

static void fill_bf16(uint16_t *p, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		p[i] = rnd_bf16(scale);
}

#define CK(call)                                                        \
	do {                                                            \
		cudaError_t e_ = (call);                                \
		if (e_ != cudaSuccess) {                                \
			fprintf(stderr, "%s: %s\n", #call,              \
				cudaGetErrorString(e_));                \
			exit(1);                                        \
		}                                                       \
	} while (0)

static void bench_mode(const struct kvfs_restore_model *m,
		       const struct kvfs_restore_weights *w, unsigned flags,
		       const uint32_t *toks, int ntoks, const char *label)
{
	struct kvfs_restore_cuda *rc = NULL;
	int ret;

	ret = kvfs_restore_cuda_init_weights(m, w, 0, flags, &rc);
	if (ret) {
		fprintf(stderr, "init: %s\n", strerror(-ret));
		exit(1);
	}
	printf("\n%s: weights %s, %u layers, hidden %u, %u x %u KV heads, "
	       "bf16, chunks of %u\n", label,
	       flags ? "bf16 (GemmEx)" : "f32 (Sgemm)", LAYERS, HIDDEN,
	       m->n_kv_heads, HEAD_DIM, CHUNK);
	printf("%7s %12s %12s %12s %10s %10s %12s %11s\n", "tokens",
	       "restore ms/l", "pageable", "gemm ms/l", "h2d kv", "h2d h",
	       "restore/gemm", "kv/restore");
	for (int ti = 0; ti < ntoks; ti++) {
		uint32_t n = toks[ti];
		uint64_t hl = kvfs_restore_hidden_layer_bytes(m, n, CHUNK,
							      KVFS_DTYPE_BF16);
		uint64_t kl = kvfs_restore_kv_layer_bytes(m, n, CHUNK,
							  KVFS_DTYPE_BF16);
		struct kvfs_restore_cuda_prof p;
		struct kvfs_restore_io io = {
			.hidden_len = hl * LAYERS,
			.hidden_dtype = KVFS_DTYPE_BF16,
			.kv_len = kl * LAYERS,
			.kv_dtype = KVFS_DTYPE_BF16,
			.start_pos = 4096,
			.n_tokens = n,
			.chunk_tokens = CHUNK,
			.flags = KVFS_RC_HIDDEN_PINNED | KVFS_RC_KV_DEVICE,
		};
		double tr[RUNS], tp[RUNS], tk[RUNS], t0;
		void *ph, *pk, *dk, *hh;
		cudaStream_t st;

		CK(cudaHostAlloc(&ph, hl * LAYERS, 0));
		CK(cudaHostAlloc(&pk, kl * LAYERS, 0));
		CK(cudaMalloc(&dk, kl * LAYERS));
		CK(cudaStreamCreate(&st));
		hh = malloc(hl * LAYERS);
		if (!hh)
			exit(1);
		fill_bf16(ph, hl * LAYERS / 2, 4);
		memcpy(hh, ph, hl * LAYERS);
		memset(pk, 0x3c, kl * LAYERS);
		io.hidden = ph;
		io.kv = dk;
		for (int r = -1; r < RUNS; r++) {
			t0 = now();
			ret = kvfs_restore_cuda_block(rc, &io);
			if (ret)
				exit(1);
			if (r >= 0)
				tr[r] = (now() - t0) / LAYERS;
		}
		io.hidden = hh;
		io.flags = KVFS_RC_KV_DEVICE;
		for (int r = -1; r < RUNS; r++) {
			t0 = now();
			ret = kvfs_restore_cuda_block(rc, &io);
			if (ret)
				exit(1);
			if (r >= 0)
				tp[r] = (now() - t0) / LAYERS;
		}
		for (int r = -1; r < RUNS; r++) {
			t0 = now();
			for (uint32_t l = 0; l < LAYERS; l++)
				CK(cudaMemcpyAsync((char *)dk + l * kl,
						   (char *)pk + l * kl, kl,
						   cudaMemcpyHostToDevice, st));
			CK(cudaStreamSynchronize(st));
			if (r >= 0)
				tk[r] = (now() - t0) / LAYERS;
		}
		if (kvfs_restore_cuda_profile(rc, n, KVFS_DTYPE_BF16, &p))
			exit(1);
		{
			double r = bench_median(tr, RUNS), pg = bench_median(tp, RUNS);
			double k = bench_median(tk, RUNS);

			printf("%7u %12.3f %12.3f %12.3f %10.3f %10.3f %12.2f "
			       "%10.2fx\n", n, r * 1e3, pg * 1e3, p.gemm * 1e3,
			       k * 1e3, p.h2d_hidden * 1e3, r / p.gemm, k / r);
		}
		CK(cudaStreamDestroy(st));
		CK(cudaFreeHost(ph));
		CK(cudaFreeHost(pk));
		CK(cudaFree(dk));
		free(hh);
	}
	kvfs_restore_cuda_free(rc);
}

int main(int argc, char **argv)
{
	static const uint32_t def[] = { 256, 1024, 4096, 16384 };
	struct kvfs_restore_model m = {
		.family = KVFS_FAMILY_LLAMA,
		.n_layers = LAYERS,
		.hidden_size = HIDDEN,
		.n_kv_heads = MAX_HEADS,
		.head_dim = HEAD_DIM,
		.rms_norm_eps = 1e-5,
		.rope_theta = 10000,
	};
	struct kvfs_restore_weights w[LAYERS];
	uint32_t toks[16];
	int ntoks = 0, count = 0;
	uint16_t *wk, *wv;
	float *norm;
	static const struct {
		const char *label;
		uint32_t heads;
	} geo[] = { { "7B MHA", 32 }, { "8B GQA", 8 } };
	size_t dh = (size_t)MAX_HEADS * HEAD_DIM * HIDDEN;

	for (int i = 1; i < argc && ntoks < 16; i++) {
		long v = strtol(argv[i], NULL, 10);

		if (v < 1 || v > 65536) {
			fprintf(stderr, "usage: %s [TOKENS (1..65536)...]\n",
				argv[0]);
			return 2;
		}
		toks[ntoks++] = (uint32_t)v;
	}
	if (!ntoks) {
		memcpy(toks, def, sizeof(def));
		ntoks = 4;
	}
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		printf("skipped: no CUDA device\n");
		return 0;
	}
	/* One layer's random weights, shared by every layer: the timing
	 * does not depend on their values.
	 */
	wk = malloc(dh * 2);
	wv = malloc(dh * 2);
	norm = malloc(HIDDEN * sizeof(float));
	if (!wk || !wv || !norm)
		return 1;
	fill_bf16(wk, dh, 0.02f);
	fill_bf16(wv, dh, 0.02f);
	for (uint32_t j = 0; j < HIDDEN; j++)
		norm[j] = 1.0f;
	for (uint32_t l = 0; l < LAYERS; l++)
		w[l] = (struct kvfs_restore_weights){
			.norm = norm, .wk = wk, .wv = wv,
			.wk_dtype = KVFS_DTYPE_BF16,
			.wv_dtype = KVFS_DTYPE_BF16,
		};
	/* The GQA geometry uses the first rows of the same weights. */
	for (size_t gi = 0; gi < sizeof(geo) / sizeof(geo[0]); gi++) {
		m.n_kv_heads = geo[gi].heads;
		bench_mode(&m, w, 0, toks, ntoks, geo[gi].label);
		bench_mode(&m, w, KVFS_RESTORE_CUDA_BF16, toks, ntoks,
			   geo[gi].label);
	}
	free(wk);
	free(wv);
	free(norm);
	return 0;
}

#endif
