/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration benchmarks (HCache, docs/hcache.md), run by
 * tests/bench/run.sh.  CPU only unless --gpu: the GPU library
 * (gpu/restore_cuda.c) on its own is bench_restore_cuda's.
 *
 *   [8] restoration throughput against the raw sgemm throughput of the
 *       same OpenBLAS on the same shapes ([tokens x hidden] x [hidden x
 *       kv_dim], twice per layer), samples alternating, for a
 *       Llama-2-7B-like layer (MHA: hidden 4096, 32 KV heads of 128) and
 *       a Llama-3-8B-like one (GQA: 8 KV heads);
 *   [9] one block (64 tokens, the paper's chunk, --layers layers of the
 *       7B-like model): restore from DRAM against loading its KV form from
 *       DRAM (memcpy), and from the SSD (O_DIRECT read of the hidden image,
 *       then restore) against an O_DIRECT read of the KV image;
 *       The per-layer times of [9] also feed the daemon's schedule
 *       (kvfs_hsched_plan) for a 32-layer model, printed as information;
 *   [9c] the same block restored from the SSD by the daemon's own code
 *       (kvfs_cache_restore_stream() over the SSD tier, io_uring and
 *       O_DIRECT): pipelined, each layer projected as soon as it arrives
 *       while later layers stream, against reading the whole image,
 *       verifying it, then restoring; samples alternating;
 *   [9g] with --gpu DEVICE, [9c] again with the daemon's GPU restorer
 *       (gpu/restore_cuda.h, f32 then bf16 weights; the layers that
 *       arrived uploaded, projected and downloaded as one run), the
 *       image read into and the KV image built in pageable memory, then
 *       in page-locked memory as the daemon does, against the O_DIRECT
 *       read of the block's KV image measured in [9b];
 *   [10] bytes stored per token, hidden against KV, both geometries, bf16
 *       (arithmetic, no measurement).
 *
 * The checkpoints are real safetensors files of random BF16 weights with
 * --layers layers (default 4: 256 MiB for the 7B-like model); per-token
 * figures for the whole model scale the per-layer time by 32.  Medians of
 * --iters samples.
 *
 *   bench_hcache [--dir DIR] [--layers N] [--iters N] [--summary FILE]
 *                [--gpu DEVICE [--gpu-only]]
 *
 * --gpu-only leaves out what runs on the CPU ([8], [9a], the CPU restores
 * of [9b] and [9c], the plans and [10]'s split), which with 32 layers
 * takes minutes of a GPU host's time; [9b]'s reads still run, as [9g]'s
 * baseline.
 *
 * Exits 0 with the figures, 1 when a checkpoint cannot be made or a GPU
 * asked for cannot be used, 2 on bad arguments.
 */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "gpu/restore_cuda.h"
#include "tier/tier.h"
#include "hcache/hsched.h"
#include "hcache/restore.h"
#include "bench_ckpt_i.h"
#include "bench_i.h"
#include "meta/fmt.h"

#define FULL_LAYERS 32
#define HIDDEN 4096
#define HEAD_DIM 128
#define BLOCK_TOKENS 64
#define SSD_COPIES 16

struct model {
	const char *name;
	uint32_t kvh;
	struct kvfs_restore *r;
	struct kvfs_restore_model m;
};

static int load(struct model *md, const char *dir, uint32_t L)
{
	char path[4096];
	int rc;

	snprintf(path, sizeof(path), "%s/bench-hcache-%s.safetensors", dir,
		 md->name);
	md->m = (struct kvfs_restore_model){
		.family = KVFS_FAMILY_LLAMA, .n_layers = L,
		.hidden_size = HIDDEN, .n_kv_heads = md->kvh,
		.head_dim = HEAD_DIM, .rms_norm_eps = 1e-5,
		.rope_theta = 10000, .rope_type = KVFS_ROPE_DEFAULT,
	};
	rc = bench_write_ckpt(path, L, HIDDEN, md->kvh * HEAD_DIM);
	if (!rc)
		rc = kvfs_restore_load(&md->m, path, 0, &md->r);
	unlink(path); /* the mapping keeps what restoration needs */
	return rc;
}

/* [8]: one layer of @n tokens, restore against two sgemm. */
static void fig_throughput(struct model *md, uint32_t n, int iters,
			   const char *summ)
{
	const struct kvfs_restore_model *m = &md->m;
	uint32_t kvd = m->n_kv_heads * m->head_dim;
	uint64_t hb = kvfs_restore_hidden_layer_bytes(m, n, n, KVFS_DTYPE_BF16);
	uint64_t kb = kvfs_restore_kv_layer_bytes(m, n, n, KVFS_DTYPE_BF16);
	uint8_t *x = malloc(hb), *kv = malloc(kb);
	float *xf = malloc((size_t)n * HIDDEN * 4);
	float *w = malloc((size_t)kvd * HIDDEN * 4);
	float *c = malloc((size_t)n * kvd * 4);
	double *tr = calloc((size_t)iters, sizeof(double));
	double *ts = calloc((size_t)iters, sizeof(double));
	struct kvfs_restore_ws *ws = NULL;
	char label[128];

	if (!x || !kv || !xf || !w || !c || !tr || !ts ||
	    kvfs_restore_ws_alloc(&ws)) {
		printf("    (no figure: out of memory)\n");
		goto out_free;
	}
	bench_fill_hidden(x, hb);
	for (size_t i = 0; i < (size_t)n * HIDDEN; i++)
		xf[i] = (float)(bench_rnd() % 2001) / 1000.0f - 1.0f;
	for (size_t i = 0; i < (size_t)kvd * HIDDEN; i++)
		w[i] = (float)(bench_rnd() % 2001) / 64000.0f - 0.015625f;
	/* warm-up: workspace, pages, BLAS threads */
	kvfs_restore_layer(md->r, ws, 0, x, KVFS_DTYPE_BF16, 100, n, n, kv,
			   KVFS_DTYPE_BF16);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)kvd,
		    HIDDEN, 1.0f, xf, HIDDEN, w, HIDDEN, 0.0f, c, (int)kvd);
	for (int i = 0; i < iters; i++) {
		uint64_t t0 = bench_now_ns();

		if (kvfs_restore_layer(md->r, ws, (uint32_t)i % m->n_layers, x,
				       KVFS_DTYPE_BF16, 100, n, n, kv,
				       KVFS_DTYPE_BF16)) {
			printf("    (no figure: restore failed)\n");
			goto out_free;
		}
		tr[i] = (double)(bench_now_ns() - t0) * 1e-9;
		t0 = bench_now_ns();
		for (int k = 0; k < 2; k++)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
				    (int)n, (int)kvd, HIDDEN, 1.0f, xf, HIDDEN,
				    w, HIDDEN, 0.0f, c, (int)kvd);
		ts[i] = (double)(bench_now_ns() - t0) * 1e-9;
	}
	double r = bench_median(tr, iters), s = bench_median(ts, iters);
	double gf = 4.0 * n * kvd * HIDDEN / s * 1e-9;

	printf("  %u tokens per call: restore %.3f ms/layer, sgemm x2 %.3f "
	       "ms/layer (%.1f GFLOP/s)\n", n, r * 1e3, s * 1e3, gf);
	snprintf(label, sizeof(label), "[8] restore %s %u tok", md->name, n);
	bench_summary(summ, label, n / (r * FULL_LAYERS), n / (s * FULL_LAYERS),
		"tok/s", "-");
out_free:
	kvfs_restore_ws_free(ws);
	free(x);
	free(kv);
	free(xf);
	free(w);
	free(c);
	free(tr);
	free(ts);
}

/* One block of the 7B-like model: its hidden and KV images and the
 * restore arguments.
 */
struct blk {
	uint32_t n;
	uint64_t hb, kb;
	uint8_t *h, *kv, *kv2;
	struct kvfs_restore_io io;
};

static int blk_init(struct blk *b, const struct model *md)
{
	const struct kvfs_restore_model *m = &md->m;

	memset(b, 0, sizeof(*b));
	b->n = BLOCK_TOKENS;
	b->hb = kvfs_restore_hidden_layer_bytes(m, b->n, 16,
						KVFS_DTYPE_BF16) * m->n_layers;
	b->kb = kvfs_restore_kv_layer_bytes(m, b->n, 16, KVFS_DTYPE_BF16) *
		m->n_layers;
	b->h = aligned_alloc(4096, b->hb);
	b->kv = aligned_alloc(4096, b->kb);
	b->kv2 = aligned_alloc(4096, b->kb);
	if (!b->h || !b->kv || !b->kv2)
		return -ENOMEM;
	bench_fill_hidden(b->h, b->hb);
	memset(b->kv2, 0x11, b->kb);
	b->io = (struct kvfs_restore_io){
		.hidden = b->h, .hidden_len = b->hb,
		.hidden_dtype = KVFS_DTYPE_BF16, .kv = b->kv,
		.kv_len = b->kb, .kv_dtype = KVFS_DTYPE_BF16,
		.start_pos = 4096, .n_tokens = b->n, .chunk_tokens = 16,
	};
	return 0;
}

static void blk_release(struct blk *b)
{
	free(b->h);
	free(b->kv);
	free(b->kv2);
}

/* [9a]: restore from a hidden image in DRAM against a memcpy of the KV
 * image.
 */
static void fig_block_dram(struct model *md, struct blk *b,
			   struct kvfs_restore_ws *ws, int iters,
			   const char *summ, struct kvfs_hsched_profile *prof)
{
	double *t1 = calloc((size_t)iters, sizeof(double));
	double *t2 = calloc((size_t)iters, sizeof(double));
	double *t3 = calloc((size_t)iters, sizeof(double));
	double L = md->m.n_layers;

	if (!t1 || !t2 || !t3)
		goto out_free;
	kvfs_restore_block(md->r, ws, &b->io);
	memcpy(b->kv, b->kv2, b->kb);
	for (int i = 0; i < iters; i++) {
		uint64_t t0 = bench_now_ns();

		kvfs_restore_block(md->r, ws, &b->io);
		t1[i] = (double)(bench_now_ns() - t0) * 1e-9;
		t0 = bench_now_ns();
		memcpy(b->kv, b->kv2, b->kb);
		t2[i] = (double)(bench_now_ns() - t0) * 1e-9;
		t0 = bench_now_ns();
		memcpy(b->kv, b->h, b->hb);
		t3[i] = (double)(bench_now_ns() - t0) * 1e-9;
	}
	prof->c_hidden = bench_median(t1, iters) / L;
	prof->io_kv[KVFS_TIER_DRAM] = bench_median(t2, iters) / L;
	prof->io_hidden[KVFS_TIER_DRAM] = bench_median(t3, iters) / L;
	printf("  block of %u tokens x %u layers: hidden %llu KiB, KV %llu "
	       "KiB; restore %.3f ms, KV memcpy %.3f ms\n",
	       b->n, md->m.n_layers, (unsigned long long)(b->hb >> 10),
	       (unsigned long long)(b->kb >> 10), bench_median(t1, iters) * 1e3,
	       bench_median(t2, iters) * 1e3);
	bench_summary(summ, "[9a] block from DRAM", b->n / bench_median(t1, iters),
		b->n / bench_median(t2, iters), "tok/s", "-");
out_free:
	free(t1);
	free(t2);
	free(t3);
}

/* [9b]: SSD_COPIES hidden images then as many KV images in a file under
 * @dir, read back with O_DIRECT at rotating offsets: read + restore of a
 * hidden image against the read of a KV image.  Without @cpu only the
 * reads are timed (for [9g]'s baseline).
 */
static void fig_block_ssd(struct model *md, struct blk *b,
			  struct kvfs_restore_ws *ws, const char *dir,
			  int iters, const char *summ, bool cpu,
			  struct kvfs_hsched_profile *prof)
{
	double *t1 = calloc((size_t)iters, sizeof(double));
	double *t2 = calloc((size_t)iters, sizeof(double));
	double *t3 = calloc((size_t)iters, sizeof(double));
	uint64_t kbase = SSD_COPIES * b->hb;
	char path[4096];
	int fd = -1;

	snprintf(path, sizeof(path), "%s/bench-hcache-ssd.data", dir);
	if (!t1 || !t2 || !t3)
		goto out_fail;
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		goto out_fail;
	for (int i = 0; i < SSD_COPIES; i++)
		if (pwrite(fd, b->h, b->hb, (off_t)(i * b->hb)) !=
		    (ssize_t)b->hb)
			goto out_fail;
	for (int i = 0; i < SSD_COPIES; i++)
		if (pwrite(fd, b->kv2, b->kb, (off_t)(kbase + i * b->kb)) !=
		    (ssize_t)b->kb)
			goto out_fail;
	if (fdatasync(fd))
		goto out_fail;
	close(fd);
	/* O_DIRECT: the page cache must not serve the reads */
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	unlink(path);
	if (fd < 0)
		goto out_fail;
	for (int i = 0; i < iters; i++) {
		int j = i % SSD_COPIES;
		uint64_t t0 = bench_now_ns();

		if (pread(fd, b->h, b->hb, (off_t)(j * b->hb)) !=
		    (ssize_t)b->hb)
			goto out_fail;
		t3[i] = (double)(bench_now_ns() - t0) * 1e-9;
		if (cpu)
			kvfs_restore_block(md->r, ws, &b->io);
		t1[i] = (double)(bench_now_ns() - t0) * 1e-9;
		t0 = bench_now_ns();
		if (pread(fd, b->kv, b->kb, (off_t)(kbase + j * b->kb)) !=
		    (ssize_t)b->kb)
			goto out_fail;
		t2[i] = (double)(bench_now_ns() - t0) * 1e-9;
	}
	close(fd);
	prof->io_hidden[KVFS_TIER_SSD] = bench_median(t3, iters) / md->m.n_layers;
	prof->io_kv[KVFS_TIER_SSD] = bench_median(t2, iters) / md->m.n_layers;
	if (!cpu) {
		printf("  SSD: hidden read %.3f ms; KV read %.3f ms (no CPU "
		       "restore: --gpu-only)\n", bench_median(t3, iters) * 1e3,
		       bench_median(t2, iters) * 1e3);
		goto out_free;
	}
	printf("  SSD: hidden read %.3f ms + restore = %.3f ms; KV read "
	       "%.3f ms (read then restore, not overlapped)\n",
	       bench_median(t3, iters) * 1e3, bench_median(t1, iters) * 1e3,
	       bench_median(t2, iters) * 1e3);
	bench_summary(summ, "[9b] block from SSD", b->n / bench_median(t1, iters),
		b->n / bench_median(t2, iters), "tok/s", "-");
	goto out_free;
out_fail:
	printf("    (no figure: the file under %s could not be written or "
	       "read with O_DIRECT)\n", dir);
	if (fd >= 0)
		close(fd);
	unlink(path);
out_free:
	free(t1);
	free(t2);
	free(t3);
}

/* Time @iters restorations of @rs pipelined (@tp) and whole (@tw), after
 * one untimed pair, alternating, each at the next of the SSD_COPIES
 * extents @e (so no read is served twice in a row from one place).
 * Returns 0 or the first failure's -errno.
 */
/* Where the restores' time went: the sums of @rs's ns_ fields over the
 * timed samples, pipelined [0] and whole [1].
 */
struct stream_split {
	uint64_t gpu[2], cpu[2], tail[2], io[2], runs[2];
};

static int stream_times(struct kvfs_restore_stream *rs,
			const struct kvfs_extent *e, int iters, double *tp,
			double *tw, struct stream_split *sp)
{
	if (sp)
		*sp = (struct stream_split){ 0 };
	for (int i = -1; i < iters; i++) {
		for (int w = 0; w < 2; w++) {
			uint64_t t0 = bench_now_ns();
			int rc;

			rs->ext = &e[(2 * (i + 1) + w) % SSD_COPIES];
			rs->flags = w ? KVFS_RS_WHOLE : 0;
			rc = kvfs_cache_restore_stream(rs);
			if (rc)
				return rc;
			/* A GPU figure must not time the CPU's fallback. */
			if (rs->rc && (rs->gpu_failed ||
				       rs->gpu_layers != rs->kv_from)) {
				printf("    (no [9g] figure: the GPU projected "
				       "%u of %u layers)\n", rs->gpu_layers,
				       rs->kv_from);
				return -EIO;
			}
			if (i >= 0)
				(w ? tw : tp)[i] = (double)(bench_now_ns() - t0) *
						   1e-9;
			if (i >= 0 && sp) {
				sp->gpu[w] += rs->ns_gpu;
				sp->cpu[w] += rs->ns_cpu;
				sp->tail[w] += rs->ns_tail;
				sp->io[w] += rs->ns_io;
				sp->runs[w] += rs->gpu_runs;
			}
		}
	}
	return 0;
}

/* The image read whole through the SSD tier into @rs->img (pageable) and
 * into @pinned (page-locked), alternating: whether the kind of memory
 * changes the read.  Prints the medians; @ta and @tb are scratch.
 */
static void read_into(struct kvfs_restore_stream *rs,
		      const struct kvfs_extent *e, void *pinned, int iters,
		      double *ta, double *tb)
{
	for (int i = -1; i < iters; i++) {
		for (int w = 0; w < 2; w++) {
			const struct kvfs_extent *x =
				&e[(2 * (i + 1) + w) % SSD_COPIES];
			uint64_t t0 = bench_now_ns();

			if (rs->ssd->ops->read(rs->ssd, x, 0,
					       w ? pinned : rs->img, x->len))
				return;
			if (i >= 0)
				(w ? tb : ta)[i] =
					(double)(bench_now_ns() - t0) * 1e-9;
		}
	}
	printf("    the image read alone, medians: into pageable memory "
	       "%.3f ms, into page-locked memory %.3f ms\n",
	       bench_median(ta, iters) * 1e3, bench_median(tb, iters) * 1e3);
}

/* One [9g] row: @rs restored with @rc_gpu, its image read into and its KV
 * image built in pageable memory (as the bench allocated them) or in the
 * restorer's page-locked buffers (@pinned, as the daemon does).  Prints
 * the figure and adds its summary lines.  0 or -errno.
 */
static int stream_gpu_row(struct kvfs_restore_stream *rs,
			  struct kvfs_restore_cuda *rc_gpu, bool pinned,
			  const char *mode, const struct kvfs_extent *e,
			  int gpu, double kv_read, int iters, double *tp,
			  double *tw, const char *summ)
{
	uint8_t *img = rs->img, *dst = rs->dst;
	void *pimg = NULL, *pdst = NULL;
	uint32_t n = rs->n_tokens;
	struct stream_split sp;
	char label[80];
	double p, w;
	int rc = 0;

	if (pinned) {
		rc = kvfs_restore_cuda_host_get(rc_gpu, e[0].len, &pimg);
		if (!rc)
			rc = kvfs_restore_cuda_host_get(rc_gpu, rs->dst_len,
							&pdst);
		if (rc) {
			printf("    (no [9g] figure: no page-locked buffers: "
			       "%s)\n", strerror(-rc));
			goto out_put;
		}
		rs->img = pimg;
		rs->dst = pdst;
	}
	rs->rc = rc_gpu;
	rc = stream_times(rs, e, iters, tp, tw, &sp);
	rs->rc = NULL;
	rs->img = img;
	rs->dst = dst;
	if (rc)
		goto out_put;
	p = bench_median(tp, iters);
	w = bench_median(tw, iters);
	printf("  SSD, the daemon's restore on GPU %d (%s weights, %s "
	       "buffers): pipelined %.3f ms, whole read then restore %.3f ms; "
	       "KV read %.3f ms\n", gpu, mode, pinned ? "page-locked" :
	       "pageable", p * 1e3, w * 1e3, kv_read * 1e3);
	for (int k = 0; k < 2; k++)
		printf("    %s, means: read%s %.3f ms; GPU calls %.3f ms (%.1f "
		       "runs), CPU on layers %.3f ms, after the read %.3f ms\n",
		       k ? "whole" : "pipelined",
		       k ? "" : " with the layers' work", 
		       (double)sp.io[k] / iters * 1e-6,
		       (double)sp.gpu[k] / iters * 1e-6,
		       (double)sp.runs[k] / iters,
		       (double)sp.cpu[k] / iters * 1e-6,
		       (double)sp.tail[k] / iters * 1e-6);
	if (pinned)
		read_into(rs, e, pimg, iters, tp, tw);
	snprintf(label, sizeof(label), "[9g] SSD restore GPU %s%s/KV read",
		 mode, pinned ? "" : " pageable");
	bench_summary(summ, label, n / p, kv_read > 0 ? n / kv_read : 0,
		      "tok/s", "-");
	snprintf(label, sizeof(label), "[9g] SSD restore GPU %s%s "
		 "pipelined/whole", mode, pinned ? "" : " pageable");
	bench_summary(summ, label, n / p, n / w, "tok/s", "-");
out_put:
	kvfs_restore_cuda_host_put(rc_gpu, pimg);
	kvfs_restore_cuda_host_put(rc_gpu, pdst);
	return rc;
}

/* [9g]: @rs (set up by [9c]) again with a GPU restorer on @gpu, f32 then
 * bf16 weights, each with pageable then page-locked buffers.  A
 * restoration the GPU did not do whole (the CPU took over) fails the
 * figure (stream_times()): it would time the CPU.  @kv_read is [9b]'s
 * median O_DIRECT read of the block's KV image, in seconds (0: none).
 * Returns 0, or -errno (logged by the restorer, said here) when the GPU
 * restorer cannot start or fails.
 */
static int fig_stream_gpu(struct model *md, struct kvfs_restore_stream *rs,
			  const struct kvfs_extent *e, int gpu, double kv_read,
			  int iters, double *tp, double *tw, const char *summ)
{
	static const struct {
		unsigned flags;
		const char *name;
	} mode[] = { { 0, "f32" }, { KVFS_RESTORE_CUDA_BF16, "bf16" } };
	int rc = 0;

	for (size_t m = 0; m < sizeof(mode) / sizeof(mode[0]) && !rc; m++) {
		struct kvfs_restore_cuda *rc_gpu = NULL;

		rc = kvfs_restore_cuda_init(md->r, gpu, mode[m].flags, &rc_gpu);
		if (rc) {
			printf("    (no [9g] figure: the GPU restorer on device "
			       "%d cannot start: %s)\n", gpu, strerror(-rc));
			break;
		}
		for (int pinned = 0; pinned < 2 && !rc; pinned++)
			rc = stream_gpu_row(rs, rc_gpu, pinned, mode[m].name, e,
					    gpu, kv_read, iters, tp, tw, summ);
		kvfs_restore_cuda_free(rc_gpu);
	}
	return rc;
}

/* [9c]: SSD_COPIES HIDDEN block files in extents of an SSD tier over a
 * file under @dir, restored by kvfs_cache_restore_stream() pipelined and
 * whole-read-then-restore, alternately, at rotating extents (unless
 * !@cpu); then [9g] on GPU @gpu unless it is negative, against @kv_read.
 * Returns 0; -EIO when no figure could be had (said on stdout); the GPU
 * figure's -errno.
 */
static int fig_block_stream(struct model *md, struct blk *b,
			    struct kvfs_restore_ws *ws, const char *dir,
			    int iters, const char *summ, bool cpu, int gpu,
			    double kv_read)
{
	struct kvfs_geom g = {
		.n_layers = md->m.n_layers, .n_kv_heads = md->kvh,
		.head_dim = HEAD_DIM, .hidden_size = HIDDEN,
		.block_tokens = BLOCK_TOKENS, .chunk_tokens = 16,
		.dtype = KVFS_DTYPE_BF16,
	};
	uint64_t hs = kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN, b->n);
	uint64_t ks = kvfs_fmt_file_size(&g, KVFS_KIND_KV, b->n);
	uint64_t al = (hs + 4095) / 4096 * 4096;
	uint64_t fsz = 4096 + SSD_COPIES * al;
	double *tp = calloc((size_t)iters, sizeof(double));
	double *tw = calloc((size_t)iters, sizeof(double));
	struct kvfs_extent e[SSD_COPIES];
	struct kvfs_tier *ssd = NULL;
	struct kvfs_restore_stream rs;
	uint8_t root[16], parent[16], hdr[KVFS_FMT_HDR_SIZE];
	uint8_t *img = aligned_alloc(4096, al);
	uint8_t *dst = aligned_alloc(4096, (ks + 4095) / 4096 * 4096);
	uint32_t tok[BLOCK_TOKENS];
	char path[4096];
	bool ok = false;
	int fd, rc, rc_gpu = 0;

	snprintf(path, sizeof(path), "%s/bench-hcache-stream.data", dir);
	if (!tp || !tw || !img || !dst)
		goto out_free;
	for (int i = 0; i < 16; i++) {
		root[i] = (uint8_t)(0x10 + i);
		parent[i] = (uint8_t)(0x80 + i);
	}
	for (uint32_t i = 0; i < b->n; i++)
		tok[i] = 1000 + i;
	memset(img, 0, al);
	if (kvfs_fmt_build(&g, KVFS_KIND_HIDDEN, parent, 4096, tok, b->n,
			   b->h, img, hs))
		goto out_free;
	memcpy(hdr, img, sizeof(hdr));
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		goto out_free;
	rc = ftruncate(fd, (off_t)fsz);
	close(fd);
	if (rc || kvfs_tier_ssd_init(path, 4096, fsz, 1, KVFS_SSD_NOSYNC,
				     &ssd))
		goto out_unlink;
	for (int i = 0; i < SSD_COPIES; i++)
		if (ssd->ops->alloc(ssd, al, &e[i]) ||
		    ssd->ops->write(ssd, &e[i], 0, img, al))
			goto out_unlink;
	memset(&rs, 0, sizeof(rs));
	rs.ssd = ssd;
	rs.g = &g;
	rs.rst = md->r;
	rs.ws = ws;
	rs.n_tokens = b->n;
	rs.kv_from = g.n_layers;
	rs.start_pos = 4096;
	rs.hdr_crc = (uint32_t)hdr[84] | (uint32_t)hdr[85] << 8 |
		     (uint32_t)hdr[86] << 16 | (uint32_t)hdr[87] << 24;
	rs.key = hdr + 64;
	rs.root = root;
	rs.img = img;
	rs.dst = dst;
	rs.dst_len = ks;
	if (cpu) {
		if (stream_times(&rs, e, iters, tp, tw, NULL))
			goto out_unlink;
		printf("  SSD, the daemon's restore (%u layers, %llu KiB "
		       "stored): pipelined %.3f ms, whole read then restore "
		       "%.3f ms\n", g.n_layers, (unsigned long long)(hs >> 10),
		       bench_median(tp, iters) * 1e3,
		       bench_median(tw, iters) * 1e3);
		bench_summary(summ, "[9c] SSD restore pipelined/whole",
			      b->n / bench_median(tp, iters),
			      b->n / bench_median(tw, iters), "tok/s", "-");
	}
	ok = true;
	if (gpu >= 0)
		rc_gpu = fig_stream_gpu(md, &rs, e, gpu, kv_read, iters, tp,
					tw, summ);
out_unlink:
	if (!ok)
		printf("    (no figure: the SSD tier over %s failed)\n", path);
	kvfs_tier_free(ssd);
	unlink(path);
out_free:
	free(img);
	free(dst);
	free(tp);
	free(tw);
	return ok ? rc_gpu : -EIO;
}

/* [10]: bytes per token of each form, bf16, and of a 16-token block file
 * (header and token ids included).
 */
static void fig_bytes(const char *name, uint32_t kvh, const char *summ)
{
	struct kvfs_geom g = {
		.n_layers = FULL_LAYERS, .n_kv_heads = kvh,
		.head_dim = HEAD_DIM, .hidden_size = HIDDEN,
		.block_tokens = 16, .chunk_tokens = 16,
		.dtype = KVFS_DTYPE_BF16,
	};
	double h = FULL_LAYERS * HIDDEN * 2.0 / 1024;
	double kv = FULL_LAYERS * 2.0 * kvh * HEAD_DIM * 2 / 1024;
	char label[96];

	printf("\n[10] bytes stored per token, %s (32 layers, %u KV heads, "
	       "bf16): hidden %.0f KiB, KV %.0f KiB; 16-token block files "
	       "%.1f / %.1f KiB per token\n", name, kvh, h, kv,
	       kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN, 16) / 16.0 / 1024,
	       kvfs_fmt_file_size(&g, KVFS_KIND_KV, 16) / 16.0 / 1024);
	snprintf(label, sizeof(label), "[10] stored/token %s (hid/KV)", name);
	bench_summary(summ, label, h, kv, "KiB", "-");
}

/* [10] for store_as = auto: bytes per token of the 7B-like model split as
 * the SSD plan says (hidden states for the first @kv_from layers, K and V
 * for the rest), against K and V for every layer.
 */
static void fig_split(uint32_t kv_from, const char *summ)
{
	struct kvfs_geom g = {
		.n_layers = FULL_LAYERS, .n_kv_heads = 32,
		.head_dim = HEAD_DIM, .hidden_size = HIDDEN,
		.block_tokens = 16, .chunk_tokens = 16,
		.dtype = KVFS_DTYPE_BF16,
	};
	double sp = kvfs_fmt_split_payload_size(&g, 16, kv_from) / 16.0 / 1024;
	double kv = kvfs_fmt_split_payload_size(&g, 16, 0) / 16.0 / 1024;

	printf("\n[10] bytes stored per token, 7B-like, store_as = auto with "
	       "this machine's SSD plan (%u hidden + %u KV layers): %.0f KiB "
	       "against %.0f KiB as KV\n", kv_from, FULL_LAYERS - kv_from, sp,
	       kv);
	bench_summary(summ, "[10] stored/token 7B-like auto split (split/KV)", sp,
		kv, "KiB", "-");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "dir", required_argument, NULL, 'd' },
		{ "layers", required_argument, NULL, 'l' },
		{ "iters", required_argument, NULL, 'i' },
		{ "summary", required_argument, NULL, 's' },
		{ "gpu", required_argument, NULL, 'g' },
		{ "gpu-only", no_argument, NULL, 'G' },
		{ NULL, 0, NULL, 0 },
	};
	struct model mha = { .name = "7B-like", .kvh = 32 };
	struct model gqa = { .name = "8B-like", .kvh = 8 };
	const char *dir = "/tmp", *summ = NULL;
	int layers = 4, iters = 21, gpu = -1, ret = 0, ch;
	bool cpu = true;

	while ((ch = getopt_long(argc, argv, "d:l:i:s:g:", lo, NULL)) != -1) {
		switch (ch) {
		case 'd':
			dir = optarg;
			break;
		case 'l':
			layers = atoi(optarg);
			break;
		case 'i':
			iters = atoi(optarg);
			break;
		case 's':
			summ = optarg;
			break;
		case 'g':
			gpu = atoi(optarg);
			if (gpu < 0) {
				fprintf(stderr, "bench_hcache: bad --gpu\n");
				return 2;
			}
			break;
		case 'G':
			cpu = false;
			break;
		default:
			fprintf(stderr, "usage: bench_hcache [--dir DIR] "
					"[--layers N] [--iters N] "
					"[--summary FILE] [--gpu DEVICE "
					"[--gpu-only]]\n");
			return 2;
		}
	}
	if (layers < 1 || layers > FULL_LAYERS || iters < 1 ||
	    (!cpu && gpu < 0)) {
		fprintf(stderr, "bench_hcache: bad --layers or --iters, or "
				"--gpu-only without --gpu\n");
		return 2;
	}
	kvfs_restore_set_blas_threads(0);
	printf("\nhidden-state restoration, CPU (OpenBLAS, %d threads), "
	       "%d-layer checkpoints of random BF16 weights in %s\n",
	       openblas_get_num_threads(), layers, dir);
	if (load(&mha, dir, (uint32_t)layers) ||
	    load(&gqa, dir, (uint32_t)layers)) {
		fprintf(stderr, "bench_hcache: writing or loading a checkpoint "
				"in %s failed\n", dir);
		return 1;
	}
	if (cpu)
		printf("\n[8] restoration against raw sgemm, same shapes "
		       "(tokens/s for all 32 layers = per-layer rate / 32)\n");
	for (int g = 0; g < 2 && cpu; g++) {
		struct model *md = g ? &gqa : &mha;
		static const uint32_t ns[] = { 64, 1024 };

		printf(" %s (hidden %u, %u KV heads x %u):\n", md->name, HIDDEN,
		       md->kvh, HEAD_DIM);
		for (size_t i = 0; i < 2; i++)
			fig_throughput(md, ns[i], iters, summ);
	}

	struct kvfs_hsched_profile prof = { 0 };
	struct kvfs_restore_ws *ws = NULL;
	struct blk b = { 0 };
	uint32_t ssd_hidden = FULL_LAYERS;

	printf("\n[9] one block of the 7B-like model, %d layers\n", layers);
	if (kvfs_restore_ws_alloc(&ws) || blk_init(&b, &mha)) {
		printf("    (no figure: out of memory)\n");
	} else {
		if (cpu)
			fig_block_dram(&mha, &b, ws, iters, summ, &prof);
		fig_block_ssd(&mha, &b, ws, dir, iters, summ, cpu, &prof);
		if (fig_block_stream(&mha, &b, ws, dir, iters, summ, cpu, gpu,
				     prof.io_kv[KVFS_TIER_SSD] * layers) &&
		    gpu >= 0)
			ret = 1;
		/* The plans need the CPU's projection time. */
		for (int t = KVFS_TIER_DRAM; t <= KVFS_TIER_SSD && cpu; t++) {
			struct kvfs_hsched_plan p;

			if (kvfs_hsched_plan(&prof, t, FULL_LAYERS, &p))
				continue;
			if (t == KVFS_TIER_SSD)
				ssd_hidden = p.n_hidden;
			printf("  schedule for 32 layers read from %s "
			       "(per-layer times above, no recompute): %u "
			       "hidden + %u KV layers, %.1f ms predicted\n",
			       t == KVFS_TIER_DRAM ? "DRAM" : "the SSD",
			       p.n_hidden, p.n_kv, p.t_total * 1e3);
		}
	}
	blk_release(&b);
	kvfs_restore_ws_free(ws);
	fig_bytes("7B-like", 32, summ);
	fig_bytes("8B-like", 8, summ);
	if (cpu)
		fig_split(ssd_hidden, summ);
	if (gpu < 0)
		printf("\nGPU restoration: bench_restore_cuda, and [9g] with "
		       "--gpu DEVICE, on a GPU host.\n");
	kvfs_restore_free(mha.r);
	kvfs_restore_free(gqa.r);
	return ret;
}
