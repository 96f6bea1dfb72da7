/* SPDX-License-Identifier: MIT */
/*
 * FETCH of a long prefix into the device pool, against the raw copy the
 * backend is built on (issue 4's "FETCH of a 2 GiB prefix against the raw
 * H2D copy bandwidth", goal >= 90%). No mount: the cache is opened in this
 * process on a store in a temp dir (a real store, background threads off,
 * so nothing moves behind the samples), with a device tier of the chosen
 * backend. A chain of Llama-3-8B-like blocks (32 layers x 8 KV heads x
 * head_dim 128, bf16; 16 tokens a block by default: 2 MiB of K and V) is
 * committed to DRAM, then, samples alternating:
 *
 *   kvfs      kvfs_ctl_exec(FETCH) of the whole prefix: what the daemon
 *             runs for the ioctl (leases taken, one batched load into the
 *             pool, the response built); untimed between samples,
 *             RELEASE and EVICT from the pool, so that every sample moves
 *             every byte again;
 *   baseline  shm: memcpy of the same bytes between two warm buffers;
 *             cuda: one cudaMemcpyAsync of the same bytes from a pinned
 *             (cudaHostAlloc) buffer into a device buffer on a stream,
 *             then cudaStreamSynchronize.
 *
 * Bytes are the K/V payload FETCH hands the client (what the baseline
 * copies); the pool also receives each block's 8 KiB of header and token
 * ids, which kvfs pays for and the baseline does not. The FUSE transport
 * of the real ioctl is not included (a few microseconds a request). Then
 * the same at a few smaller prefixes (1, 16, 128 blocks), the
 * "DRAM -> device-pool bandwidth" figure of the issue.
 *
 * The cache is opened with the daemon's defaults, [tier.dram] pinned =
 * auto included (unless --pinned says otherwise): with cuda the DRAM tier
 * is one pinned arena and FETCH copies blocks straight from it. Each figure says how many bytes went
 * direct and how many through staging buffers (the device tier's
 * tier.gpu.direct_bytes and staged_bytes), so a run shows which path it
 * measured.
 *
 *   bench_gpu_fetch [--backend shm|cuda] [--device N] [--bytes SIZE]
 *                   [--block-tokens 16|32] [--iters N] [--dir DIR]
 *                   [--no-sweep] [--summary FILE]
 *                   [--pinned auto|yes|no] [--dram SIZE]
 *                   [--hidden [--layers N] [--weights f32|bf16]]
 *
 * --hidden [--layers N] is figure [11h]: the same FETCH of a prefix whose
 * blocks are stored as hidden states (HCache), so that FETCH restores each
 * into the pool (on the GPU restorer with cuda, on the CPU into the shm
 * mapping): a Llama-7B-like geometry (N layers, default 32; 32 x 128 KV
 * heads, hidden size 4096, so the stored states are half the K/V bytes),
 * random BF16 weights in a checkpoint written to the store's directory.
 * The baseline is the same raw copy of the K/V bytes FETCH delivers, so
 * the ratio says whether restoring beats moving the K/V form (which FETCH
 * does at 0.95-0.97 of it).  The restored bytes are not compared here
 * (test_hcache.sh and test_restore_cuda do); the figure says how many
 * blocks were restored into the pool and on what.  No sweep.  --weights
 * sets [tier.gpu] restore_weights (default f32): bf16 runs the GPU
 * restorer's GEMMs on tensor cores.
 *
 * --pinned sets [tier.dram] pinned, so `--pinned no` measures the staged
 * path; --dram opens a DRAM tier of at least SIZE, so the time the open
 * takes (printed, cudaHostRegister of the whole arena included when it is
 * pinned) can be had for a large tier.
 *
 * Exits 0 with the figures, 2 when the device tier cannot be had (no CUDA
 * device, or a build without CUDA), 1 on any other failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/ctl.h"
#include "cache/params.h"
#include "meta/kvfs_ctl.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/store.h"
#include "hcache/restore.h"
#include "meta/util.h"
#include "bench_ckpt_i.h"

#ifdef KVFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define NS_NAME "b"
#define MiB (1ull << 20)

struct opts {
	int backend;            /* enum kvfs_params_gpu */
	unsigned device;
	uint64_t bytes;
	uint32_t block_tokens;
	int iters;
	const char *dir;
	const char *summ;
	bool sweep;
	int pinned;             /* enum kvfs_params_pinned */
	uint64_t dram;          /* [tier.dram] capacity; 0: what the prefix needs */
	bool hidden;            /* [11h]: blocks stored as hidden states */
	bool bf16;              /* with hidden: restore_weights = bf16 */
	uint32_t layers;        /* with hidden: the model's layers */
};

struct bench {
	struct opts o;
	struct kvfs_geom g;
	char store[4096];
	bool store_made;
	struct kvfs_cache *c;
	struct kvfs_ctl_session *s;
	uint64_t file_size, payload;    /* of one block's K/V image */
	uint64_t img_size;              /* of one block as stored */
	uint32_t n;                     /* blocks in the prefix */
	uint8_t (*keys)[KVFS_KEY_LEN];
	double open_s;                  /* kvfs_cache_open(), pinning included */
	uint64_t dram_cap;              /* the DRAM tier it opened with */
	/* The baseline's buffers (host src/dst, or pinned src/device dst). */
	void *src, *dst;
#ifdef KVFS_HAVE_CUDA
	cudaStream_t st;
#endif
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[n / 2];
}

/* The line format tests/bench/run.sh prints in its closing table. */
static void summary(const char *file, const char *label, double k, double b,
		    const char *unit, const char *target)
{
	FILE *f = file ? fopen(file, "a") : NULL;

	printf("    kvfs      %10.2f %s\n    baseline  %10.2f %s\n"
	       "    ratio     %10.2f\n",
	       k, unit, b, unit, b > 0 ? k / b : 0);
	if (!f)
		return;
	fprintf(f, "%s|%.2f|%.2f|%s|%.2f|%s\n", label, k, b, unit,
		b > 0 ? k / b : 0, target);
	fclose(f);
}

/* Payload bytes of block @i: cheap to make and to check again, and no
 * two blocks alike.
 */
static void fill_payload(uint8_t *p, uint64_t len, uint32_t i)
{
	uint64_t w = (i + 1) * 0x9e3779b97f4a7c15ull;

	for (uint64_t o = 0; o + 8 <= len; o += 8) {
		uint64_t v = w ^ (o * 0xbf58476d1ce4e5b9ull);

		memcpy(p + o, &v, 8);
	}
}

/*
 * The device tier's direct and staged byte counters, from the cache's
 * stats text. -ENOENT when the stats do not carry them.
 */
static int host_copies(struct bench *B, uint64_t *direct, uint64_t *staged)
{
	char *text = NULL, *line, *save = NULL;
	size_t len = 0;
	int found = 0;

	*direct = *staged = 0;
	if (kvfs_cache_stats(B->c, &text, &len))
		return -ENOMEM;
	for (line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		unsigned long long v;

		if (sscanf(line, "tier.gpu.direct_bytes %llu", &v) == 1) {
			*direct = v;
			found |= 1;
		} else if (sscanf(line, "tier.gpu.staged_bytes %llu",
				  &v) == 1) {
			*staged = v;
			found |= 2;
		}
	}
	free(text);
	return found == 3 ? 0 : -ENOENT;
}

/* Print what went direct and what was staged since @d0, @s0 (cuda; shm
 * copies with memcpy and counts neither).
 */
static void print_copies(struct bench *B, uint64_t d0, uint64_t s0)
{
	uint64_t d, s;

	if (B->o.backend != KVFS_PARAMS_GPU_CUDA)
		return;
	if (host_copies(B, &d, &s)) {
		printf("    copies    unknown: .kvfs/stats has no "
		       "tier.gpu.direct_bytes / staged_bytes\n");
		return;
	}
	printf("    copies    %.1f MiB direct from pinned DRAM, %.1f MiB "
	       "staged\n", (double)(d - d0) / (double)MiB,
	       (double)(s - s0) / (double)MiB);
}

static void fmt_bytes(uint64_t v, char *buf, size_t len)
{
	if (v >= (1ull << 30) && !(v % (1ull << 30)))
		snprintf(buf, len, "%llu GiB", (unsigned long long)(v >> 30));
	else if (!(v % MiB))
		snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
	else
		snprintf(buf, len, "%.1f MiB", (double)v / (double)MiB);
}

/* ---------------------------------------------------------- the cache */

static int cache_open(struct bench *B)
{
	struct kvfs_cache_params conf;
	uint64_t img = kvfs_util_align_up(B->file_size, KVFS_FMT_ALIGN);
	const char *tmp = B->o.dir ? B->o.dir : getenv("TMPDIR");
	uint64_t t0;
	int rc;

	snprintf(B->store, sizeof(B->store), "%s/kvfs-gfetch.XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(B->store)) {
		fprintf(stderr, "bench_gpu_fetch: mkdtemp %s: %s\n", B->store,
			strerror(errno));
		return -errno;
	}
	B->store_made = true;
	/* Blocks stay in DRAM (no write-back thread) and are unlinked before
	 * the cache closes, so the SSD file only needs to exist.
	 */
	rc = kvfs_store_create(B->store, 64 * MiB, true);
	if (rc) {
		fprintf(stderr, "bench_gpu_fetch: cannot make a store in %s: "
			"%s\n", B->store, strerror(-rc));
		return rc;
	}
	kvfs_cache_params_defaults(&conf);
	kvfs_log_set_level(KVFS_LOG_WARN);
	if (B->o.hidden) {
		struct kvfs_hcache_params *hc = &conf.ns[0].hc;
		uint64_t tw = now_ns();

		if (snprintf(hc->weights, sizeof(hc->weights),
			     "%s/bench-7B-like.safetensors",
			     B->store) >= (int)sizeof(hc->weights)) {
			fprintf(stderr, "bench_gpu_fetch: %s: too long a "
				"path for the checkpoint\n", B->store);
			return -ENAMETOOLONG;
		}
		rc = bench_write_ckpt(hc->weights, B->g.n_layers,
				      B->g.hidden_size,
				      B->g.n_kv_heads * B->g.head_dim);
		if (rc) {
			fprintf(stderr, "bench_gpu_fetch: cannot write the "
				"checkpoint %s\n", hc->weights);
			return rc;
		}
		printf("  (checkpoint of random BF16 weights written in %.1f "
		       "s)\n", (double)(now_ns() - tw) / 1e9);
		hc->family = KVFS_FAMILY_LLAMA;
		hc->rms_norm_eps = 1e-6;
		hc->rope_theta = 10000;
		hc->store_as = KVFS_STORE_HIDDEN;
		hc->kv_layers = KVFS_PARAMS_KV_LAYERS_SCHED;
	}
	conf.dram_capacity = (uint64_t)B->n * img + conf.chunk_dram + 64 * MiB;
	if (B->o.dram > conf.dram_capacity)
		conf.dram_capacity = B->o.dram;
	conf.dram_pinned = B->o.pinned;
	B->dram_cap = conf.dram_capacity;
	conf.gpu_backend = B->o.backend;
	conf.gpu_device = B->o.device;
	if (B->o.bf16)
		conf.gpu_restore_weights = KVFS_PARAMS_RWEIGHTS_BF16;
	conf.gpu_capacity = (uint64_t)B->n * img + 16 * MiB;
	conf.n_ns = 1;
	snprintf(conf.ns[0].name, sizeof(conf.ns[0].name), NS_NAME);
	conf.ns[0].geom = B->g;
	t0 = now_ns();
	rc = kvfs_cache_open(B->store, &conf,
			     KVFS_CACHE_NOTHREADS | KVFS_CACHE_NOSYNC, &B->c);
	B->open_s = (double)(now_ns() - t0) / 1e9;
	if (rc == -ENODEV || rc == -EOPNOTSUPP) {
		fprintf(stderr, "bench_gpu_fetch: no device: the %s tier on "
			"device %u cannot be opened (%s); no figure\n",
			B->o.backend == KVFS_PARAMS_GPU_CUDA ? "cuda" : "shm",
			B->o.device, strerror(-rc));
		return rc;
	}
	if (rc) {
		fprintf(stderr, "bench_gpu_fetch: cannot open the cache: %s\n",
			strerror(-rc));
		return rc;
	}
	rc = kvfs_ctl_open(B->c, &B->s);
	if (rc)
		fprintf(stderr, "bench_gpu_fetch: ctl session: %s\n",
			strerror(-rc));
	return rc;
}

/* Commit the chain of @B->n blocks to DRAM through the write path. */
static int write_prefix(struct bench *B)
{
	struct kvfs_ns *ns = kvfs_cache_ns_by_name(B->c, NS_NAME);
	uint64_t poff = kvfs_fmt_payload_off(B->o.block_tokens);
	uint32_t *tok = calloc(B->o.block_tokens, sizeof(*tok));
	uint8_t *buf = malloc(B->img_size);
	uint16_t kind = B->o.hidden ? KVFS_KIND_HIDDEN : KVFS_KIND_KV;
	uint8_t parent[KVFS_KEY_LEN];
	int rc = 0;

	if (!ns || !tok || !buf) {
		rc = -ENOMEM;
		goto out_free;
	}
	memcpy(parent, kvfs_ns_root(ns), KVFS_KEY_LEN);
	for (uint32_t i = 0; i < B->n && !rc; i++) {
		char name[KVFS_FMT_NAME_LEN + 1];
		struct kvfs_pending *p;
		struct kvfs_block *b;

		for (uint32_t t = 0; t < B->o.block_tokens; t++)
			tok[t] = (i * B->o.block_tokens + t) % 128000u;
		if (B->o.hidden)
			bench_fill_hidden(buf + poff, B->img_size - poff);
		else
			fill_payload(buf + poff, B->payload, i);
		rc = kvfs_fmt_build(&B->g, kind, parent,
				    (uint64_t)i * B->o.block_tokens, tok,
				    B->o.block_tokens, NULL, buf, B->img_size);
		if (rc)
			break;
		kvfs_fmt_block_key(parent, tok, B->o.block_tokens, B->keys[i]);
		memcpy(parent, B->keys[i], KVFS_KEY_LEN);
		kvfs_fmt_key_hex(B->keys[i], name);
		memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
		rc = kvfs_cache_create(B->c, ns, name, &p);
		if (rc)
			break;
		rc = kvfs_cache_write(p, 0, buf, B->img_size);
		if (rc) {
			kvfs_cache_abandon(B->c, p);
			break;
		}
		rc = kvfs_cache_commit(B->c, p, &b);
		if (!rc)
			kvfs_cache_put(B->c, b);
	}
	if (rc)
		fprintf(stderr, "bench_gpu_fetch: writing the prefix failed: "
			"%s\n", strerror(-rc));
out_free:
	free(tok);
	free(buf);
	return rc;
}

static void cache_close(struct bench *B)
{
	struct kvfs_ns *ns;
	char cmd[4200];

	kvfs_ctl_close(B->s);
	ns = B->c ? kvfs_cache_ns_by_name(B->c, NS_NAME) : NULL;
	/* Unlinked, the blocks are not written back when the cache closes. */
	for (uint32_t i = 0; ns && i < B->n; i++) {
		char name[KVFS_FMT_NAME_LEN + 1];

		kvfs_fmt_key_hex(B->keys[i], name);
		memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
		kvfs_cache_unlink(B->c, ns, name);
	}
	kvfs_cache_free(B->c);
	if (B->store_made) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", B->store);
		if (system(cmd))
			fprintf(stderr, "bench_gpu_fetch: could not remove "
				"%s\n", B->store);
	}
}

/* ------------------------------------------------------- ctl requests */

static void *req_make(uint16_t op, uint32_t tier,
		      const uint8_t (*keys)[KVFS_KEY_LEN], uint32_t n,
		      size_t *len)
{
	struct kvfs_ctl_req *r;

	*len = sizeof(*r) + (size_t)n * KVFS_KEY_LEN;
	r = calloc(1, *len);
	if (!r)
		return NULL;
	r->magic = KVFS_CTL_MAGIC;
	r->abi = KVFS_CTL_ABI;
	r->op = op;
	r->size = (uint32_t)*len;
	r->tier = tier;
	r->n_keys = n;
	snprintf(r->ns, sizeof(r->ns), NS_NAME);
	memcpy(r + 1, keys, (size_t)n * KVFS_KEY_LEN);
	return r;
}

/* Run @req; 0 with the response in *@out (the caller frees it), or the
 * transport's or the operation's -errno.
 */
static int ctl_do(struct bench *B, const void *req, size_t len,
		  struct kvfs_ctl_resp **out)
{
	struct kvfs_ctl_creds cr = {
		.pid = (int)getpid(),
		.uid = (uint32_t)getuid(),
		.gid = (uint32_t)getgid(),
	};
	void *resp = NULL;
	size_t rlen;
	int rc = kvfs_ctl_exec(B->s, &cr, req, len, KVFS_CTL_MAX_SIZE, &resp,
			       &rlen);

	if (!rc && ((struct kvfs_ctl_resp *)resp)->error)
		rc = ((struct kvfs_ctl_resp *)resp)->error;
	if (rc || !out)
		free(resp);
	else
		*out = resp;
	return rc;
}

/* Give the leases back and drop the first @n blocks from the pool. */
static int pool_empty(struct bench *B, uint32_t n)
{
	size_t len;
	void *rel = req_make(KVFS_CTL_RELEASE, 0, B->keys, 0, &len);
	int rc = rel ? ctl_do(B, rel, len, NULL) : -ENOMEM;
	void *ev;

	free(rel);
	if (rc)
		return rc;
	ev = req_make(KVFS_CTL_EVICT, 0, B->keys, n, &len);
	rc = ev ? ctl_do(B, ev, len, NULL) : -ENOMEM;
	free(ev);
	return rc;
}

#ifdef KVFS_HAVE_CUDA
/*
 * cuda: a process cannot open its own IPC handle, and a forked child
 * cannot use CUDA, so this program runs itself again as a client that
 * opens the pool's handle and compares each payload, as an engine would.
 * Its standard input: the handle (64 bytes), then per block its index and
 * pool offset (u32, u64).  Exit 0 when every payload is the one written.
 */
static int verify_child(uint32_t device, uint64_t pool_size,
			uint64_t payload, uint32_t n)
{
	cudaIpcMemHandle_t h;
	uint8_t *want = malloc(payload), *got = malloc(payload);
	void *d = NULL;
	int bad = 1;

	if (!want || !got || fread(&h, sizeof(h), 1, stdin) != 1 ||
	    cudaSetDevice((int)device) != cudaSuccess ||
	    cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess) !=
		    cudaSuccess)
		goto out;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i;
		uint64_t off;

		if (fread(&i, sizeof(i), 1, stdin) != 1 ||
		    fread(&off, sizeof(off), 1, stdin) != 1 ||
		    off > pool_size || payload > pool_size - off ||
		    cudaMemcpy(got, (uint8_t *)d + off, payload,
			       cudaMemcpyDeviceToHost) != cudaSuccess)
			goto out_close;
		fill_payload(want, payload, i);
		if (memcmp(got, want, payload))
			goto out_close;
	}
	bad = 0;
out_close:
	cudaIpcCloseMemHandle(d);
out:
	free(want);
	free(got);
	return bad;
}

static int cuda_pool_check(struct bench *B, const struct kvfs_ctl_resp *r)
{
	const struct kvfs_ctl_block *blk = (const void *)(r + 1);
	char dev[16], size[32], pay[32], n[16];
	int in[2], st = -1;
	FILE *f;
	pid_t pid;

	snprintf(dev, sizeof(dev), "%u", r->pool.device);
	snprintf(size, sizeof(size), "%llu", (unsigned long long)r->pool.size);
	snprintf(pay, sizeof(pay), "%llu", (unsigned long long)B->payload);
	snprintf(n, sizeof(n), "%u", r->n_blocks);
	if (pipe(in))
		return -errno;
	pid = fork();
	if (pid == 0) {
		dup2(in[0], 0);
		close(in[0]);
		close(in[1]);
		execl("/proc/self/exe", "bench_gpu_fetch", "--verify-child",
		      dev, size, pay, n, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	f = pid > 0 ? fdopen(in[1], "w") : NULL;
	if (!f) {
		close(in[1]);
	} else {
		fwrite(r->pool.ipc, 64, 1, f);
		for (uint32_t i = 0; i < r->n_blocks; i++) {
			uint64_t off = blk[i].pool_off;

			fwrite(&i, sizeof(i), 1, f);
			fwrite(&off, sizeof(off), 1, f);
		}
		fclose(f);
	}
	if (pid > 0)
		waitpid(pid, &st, 0);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}
#endif

/* Every payload in the pool is the one written (the first sample): read
 * through the shm mapping, or by a client of the cuda pool's IPC handle.
 */
static int pool_check(struct bench *B, const struct kvfs_ctl_resp *r)
{
	const struct kvfs_ctl_block *blk = (const void *)(r + 1);
	uint8_t *want = malloc(B->payload);
	void *map = MAP_FAILED;
	int fd = -1, rc = -EIO;

	if (!want)
		return -ENOMEM;
	if (r->pool.backend == KVFS_CTL_BACKEND_SHM) {
		fd = shm_open(r->pool.shm_name, O_RDONLY, 0);
		if (fd >= 0)
			map = mmap(NULL, r->pool.size, PROT_READ, MAP_SHARED,
				   fd, 0);
		if (map == MAP_FAILED)
			goto out;
	}
	for (uint32_t i = 0; i < r->n_blocks; i++) {
		if (blk[i].len != B->payload ||
		    blk[i].pool_off + blk[i].len > r->pool.size ||
		    memcmp(blk[i].key, B->keys[i], KVFS_KEY_LEN))
			goto out;
		if (map == MAP_FAILED)
			continue;
		fill_payload(want, B->payload, i);
		if (memcmp((uint8_t *)map + blk[i].pool_off, want, B->payload))
			goto out;
	}
	rc = 0;
#ifdef KVFS_HAVE_CUDA
	if (r->pool.backend == KVFS_CTL_BACKEND_CUDA)
		rc = cuda_pool_check(B, r);
#endif
out:
	if (map != MAP_FAILED)
		munmap(map, r->pool.size);
	if (fd >= 0)
		close(fd);
	free(want);
	if (rc)
		fprintf(stderr, "bench_gpu_fetch: the pool does not hold the "
			"prefix as written\n");
	return rc;
}

/* One FETCH of the first @n blocks: its time in *@ns, then emptied. */
static int kvfs_sample(struct bench *B, const void *req, size_t len,
		       uint32_t n, bool check, uint64_t *ns)
{
	struct kvfs_ctl_resp *r = NULL;
	uint64_t t0 = now_ns();
	int rc = ctl_do(B, req, len, &r);

	*ns = now_ns() - t0;
	if (rc) {
		fprintf(stderr, "bench_gpu_fetch: FETCH of %u blocks: %s\n", n,
			strerror(-rc));
		return rc;
	}
	if (r->n_blocks != n) {
		fprintf(stderr, "bench_gpu_fetch: FETCH returned %u blocks, "
			"not %u\n", r->n_blocks, n);
		rc = -EIO;
	}
	if (!rc && check)
		rc = pool_check(B, r);
	free(r);
	if (rc)
		return rc;
	rc = pool_empty(B, n);
	if (rc)
		fprintf(stderr, "bench_gpu_fetch: RELEASE/EVICT: %s\n",
			strerror(-rc));
	return rc;
}

/* How many blocks FETCH restored into the pool, and on what. */
struct restored_count {
	uint64_t dev, gpu, fallbacks;
	bool set;
};

/*
 * The first call notes the counters in *@r0; the next says what the
 * samples since then restored.  -EIO when a restoration fell back to the
 * path through DRAM, or none went into the pool: the figure would not
 * time what it says.
 */
static int restored(struct bench *B, struct restored_count *r0)
{
	struct kvfs_stats *st = NULL;
	struct restored_count r;
	int rc = kvfs_cache_stats_get(B->c, &st);

	if (rc)
		return rc;
	r = (struct restored_count){ st->restore_to_device,
				     st->restore_to_device_gpu,
				     st->restore_to_device_fallbacks, true };
	free(st);
	if (!r0->set) {
		*r0 = r;
		return 0;
	}
	printf("  restored into the pool: %llu blocks, %llu of them on the "
	       "GPU, %llu fell back\n",
	       (unsigned long long)(r.dev - r0->dev),
	       (unsigned long long)(r.gpu - r0->gpu),
	       (unsigned long long)(r.fallbacks - r0->fallbacks));
	if (r.dev == r0->dev || r.fallbacks != r0->fallbacks) {
		fprintf(stderr, "bench_gpu_fetch: FETCH did not restore every "
			"block into the pool: no [11h] figure\n");
		return -EIO;
	}
	return 0;
}

/* ------------------------------------------------------- the baseline */

static int base_init(struct bench *B, uint64_t bytes)
{
	if (B->o.backend == KVFS_PARAMS_GPU_SHM) {
		B->src = malloc(bytes);
		B->dst = malloc(bytes);
		if (!B->src || !B->dst)
			return -ENOMEM;
		/* Touch both sides so that no sample pays a page fault. */
		memset(B->src, 1, bytes);
		memset(B->dst, 2, bytes);
		return 0;
	}
#ifdef KVFS_HAVE_CUDA
	cudaError_t e = cudaSetDevice((int)B->o.device);

	if (e == cudaSuccess)
		e = cudaHostAlloc(&B->src, bytes, cudaHostAllocDefault);
	if (e == cudaSuccess)
		e = cudaMalloc(&B->dst, bytes);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&B->st, cudaStreamNonBlocking);
	if (e == cudaSuccess) {
		memset(B->src, 1, bytes);
		/* One copy untimed: first use of the buffers and stream. */
		e = cudaMemcpyAsync(B->dst, B->src, bytes,
				    cudaMemcpyHostToDevice, B->st);
	}
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(B->st);
	if (e != cudaSuccess) {
		fprintf(stderr, "bench_gpu_fetch: baseline buffers: %s: %s\n",
			cudaGetErrorName(e), cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
#else
	return -EOPNOTSUPP;
#endif
}

static void base_release(struct bench *B)
{
	if (B->o.backend == KVFS_PARAMS_GPU_SHM) {
		free(B->src);
		free(B->dst);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	if (B->st)
		cudaStreamDestroy(B->st);
	if (B->dst)
		cudaFree(B->dst);
	if (B->src)
		cudaFreeHost(B->src);
#endif
}

static int base_sample(struct bench *B, uint64_t bytes, uint64_t *ns)
{
	uint64_t t0 = now_ns();

	if (B->o.backend == KVFS_PARAMS_GPU_SHM) {
		memcpy(B->dst, B->src, bytes);
		*ns = now_ns() - t0;
		/* The copy must not be optimised away. */
		return ((volatile uint8_t *)B->dst)[bytes - 1] == 1 ? 0 : -EIO;
	}
#ifdef KVFS_HAVE_CUDA
	cudaError_t e = cudaMemcpyAsync(B->dst, B->src, bytes,
					cudaMemcpyHostToDevice, B->st);

	if (e == cudaSuccess)
		e = cudaStreamSynchronize(B->st);
	*ns = now_ns() - t0;
	if (e != cudaSuccess) {
		fprintf(stderr, "bench_gpu_fetch: cudaMemcpyAsync: %s\n",
			cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
#else
	return -EOPNOTSUPP;
#endif
}

/* ---------------------------------------------------------- a figure */

/*
 * FETCH of the first @n blocks against the baseline on the same bytes,
 * @iters samples each, alternating; medians in GB/s.
 */
static int figure(struct bench *B, uint32_t n, int iters, bool check,
		  double *k, double *b)
{
	uint64_t bytes = (uint64_t)n * B->payload, t;
	double *gk = calloc((size_t)iters, sizeof(*gk));
	double *gb = calloc((size_t)iters, sizeof(*gb));
	size_t len;
	void *req = req_make(KVFS_CTL_FETCH, 0, B->keys, n, &len);
	int rc = 0;

	if (!gk || !gb || !req) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* Untimed warm-up of both sides (and, once, the bytes checked). */
	rc = kvfs_sample(B, req, len, n, check, &t);
	if (!rc)
		rc = base_sample(B, bytes, &t);
	for (int i = 0; i < iters && !rc; i++) {
		rc = kvfs_sample(B, req, len, n, false, &t);
		gk[i] = (double)bytes / (double)t;
		if (!rc)
			rc = base_sample(B, bytes, &t);
		gb[i] = (double)bytes / (double)t;
	}
	if (!rc) {
		*k = median(gk, iters);
		*b = median(gb, iters);
	}
out_free:
	free(gk);
	free(gb);
	free(req);
	return rc;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "backend", required_argument, NULL, 'B' },
		{ "device", required_argument, NULL, 'd' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "block-tokens", required_argument, NULL, 't' },
		{ "iters", required_argument, NULL, 'i' },
		{ "dir", required_argument, NULL, 'D' },
		{ "no-sweep", no_argument, NULL, 'n' },
		{ "summary", required_argument, NULL, 's' },
		{ "pinned", required_argument, NULL, 'p' },
		{ "dram", required_argument, NULL, 'm' },
		{ "hidden", no_argument, NULL, 'H' },
		{ "layers", required_argument, NULL, 'L' },
		{ "weights", required_argument, NULL, 'W' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	*o = (struct opts){ .backend = KVFS_PARAMS_GPU_SHM, .bytes = 2048 * MiB,
			    .block_tokens = 16, .iters = 11, .sweep = true,
			    .layers = 32 };
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'B':
			if (!strcmp(optarg, "shm"))
				o->backend = KVFS_PARAMS_GPU_SHM;
			else if (!strcmp(optarg, "cuda"))
				o->backend = KVFS_PARAMS_GPU_CUDA;
			else
				goto usage;
			break;
		case 'd':
			if (kvfs_util_parse_u32(optarg, &o->device))
				goto usage;
			break;
		case 'b':
			if (kvfs_util_parse_size(optarg, &o->bytes) ||
			    !o->bytes)
				goto usage;
			break;
		case 't':
			if (kvfs_util_parse_u32(optarg, &o->block_tokens) ||
			    (o->block_tokens != 16 && o->block_tokens != 32))
				goto usage;
			break;
		case 'i':
			o->iters = atoi(optarg);
			if (o->iters < 1 || o->iters > 10000)
				goto usage;
			break;
		case 'D':
			o->dir = optarg;
			break;
		case 'n':
			o->sweep = false;
			break;
		case 's':
			o->summ = optarg;
			break;
		case 'p':
			if (!strcmp(optarg, "auto"))
				o->pinned = KVFS_PARAMS_PINNED_AUTO;
			else if (!strcmp(optarg, "yes"))
				o->pinned = KVFS_PARAMS_PINNED_YES;
			else if (!strcmp(optarg, "no"))
				o->pinned = KVFS_PARAMS_PINNED_NO;
			else
				goto usage;
			break;
		case 'm':
			if (kvfs_util_parse_size(optarg, &o->dram))
				goto usage;
			break;
		case 'H':
			o->hidden = true;
			o->sweep = false;
			break;
		case 'W':
			if (!strcmp(optarg, "f32"))
				o->bf16 = false;
			else if (!strcmp(optarg, "bf16"))
				o->bf16 = true;
			else
				goto usage;
			break;
		case 'L':
			if (kvfs_util_parse_u32(optarg, &o->layers) ||
			    !o->layers || o->layers > 128)
				goto usage;
			break;
		default:
			goto usage;
		}
	}
	if (optind == argc)
		return 0;
usage:
	fprintf(stderr, "usage: bench_gpu_fetch [--backend shm|cuda] "
			"[--device N] [--bytes SIZE (2G)]\n"
			"       [--block-tokens 16|32] [--iters N (11)] "
			"[--dir DIR] [--no-sweep] [--summary FILE]\n"
			"       [--pinned auto|yes|no] [--dram SIZE] "
			"[--hidden [--layers N (32)] "
			"[--weights f32|bf16]]\n");
	return -EINVAL;
}

int main(int argc, char **argv)
{
	static const uint32_t sweep[] = { 1, 16, 128 };
	struct bench B = { 0 };
	const char *be;
	static const char *const pin_names[] = {
		[KVFS_PARAMS_PINNED_AUTO] = "auto",
		[KVFS_PARAMS_PINNED_YES] = "yes",
		[KVFS_PARAMS_PINNED_NO] = "no",
	};
	char label[96], sz[32], dsz[32];
	struct restored_count r0 = { 0 };
	uint64_t t0, d0, s0;
	double k, b;
	int rc;

#ifdef KVFS_HAVE_CUDA
	if (argc == 6 && !strcmp(argv[1], "--verify-child"))
		return verify_child((uint32_t)atoi(argv[2]),
				    strtoull(argv[3], NULL, 10),
				    strtoull(argv[4], NULL, 10),
				    (uint32_t)atoi(argv[5]));
#endif
	if (parse(argc, argv, &B.o))
		return 1;
	be = B.o.backend == KVFS_PARAMS_GPU_CUDA ? "cuda" : "shm";
#ifndef KVFS_HAVE_CUDA
	if (B.o.backend == KVFS_PARAMS_GPU_CUDA) {
		fprintf(stderr, "bench_gpu_fetch: no device: built without "
			"the CUDA toolkit; no figure\n");
		return 2;
	}
#endif
	kvfs_log_set_level(KVFS_LOG_WARN);
	B.g = (struct kvfs_geom){ .n_layers = 32, .n_kv_heads = 8,
				  .head_dim = 128,
				  .block_tokens = B.o.block_tokens,
				  .chunk_tokens = B.o.block_tokens,
				  .dtype = KVFS_DTYPE_BF16 };
	if (B.o.hidden) {
		/* MHA: the stored states are half the K/V bytes. */
		B.g.n_layers = B.o.layers;
		B.g.n_kv_heads = 32;
		B.g.hidden_size = 4096;
	}
	B.file_size = kvfs_fmt_file_size(&B.g, KVFS_KIND_KV,
					 B.o.block_tokens);
	B.img_size = B.o.hidden ? kvfs_fmt_file_size(&B.g, KVFS_KIND_HIDDEN,
						     B.o.block_tokens) :
				  B.file_size;
	B.payload = B.file_size - kvfs_fmt_payload_off(B.o.block_tokens);
	if (B.o.bytes / B.payload > KVFS_CTL_MAX_BLOCKS) {
		fprintf(stderr, "bench_gpu_fetch: --bytes: at most %u blocks "
			"of %llu bytes in one FETCH\n", KVFS_CTL_MAX_BLOCKS,
			(unsigned long long)B.payload);
		return 1;
	}
	B.n = (uint32_t)((B.o.bytes + B.payload - 1) / B.payload);
	B.keys = calloc(B.n, KVFS_KEY_LEN);
	if (!B.keys)
		return 1;

	rc = cache_open(&B);
	if (!rc)
		rc = base_init(&B, (uint64_t)B.n * B.payload);
	if (rc)
		goto out;
	fmt_bytes((uint64_t)B.n * B.payload, sz, sizeof(sz));
	if (B.o.hidden)
		printf("\n[11h] FETCH of a %s prefix stored as hidden states, "
		       "restored into the device pool (%s, %s weights): %u "
		       "blocks of %u tokens (Llama-7B-like, %u layers: %llu "
		       "KiB of K/V each, %llu KiB stored), DRAM-resident, "
		       "against %s of the K/V bytes\n",
		       sz, be, B.o.bf16 ? "bf16" : "f32", B.n,
		       B.o.block_tokens, B.g.n_layers,
		       (unsigned long long)(B.payload >> 10),
		       (unsigned long long)((B.img_size -
					     kvfs_fmt_payload_off(
						     B.o.block_tokens)) >>
					    10),
		       B.o.backend == KVFS_PARAMS_GPU_CUDA ?
			       "cudaMemcpyAsync from pinned memory" :
			       "memcpy between two warm buffers");
	else
		printf("\n[11] FETCH of a %s prefix into the device pool "
		       "(%s): %u blocks of %u tokens (Llama-3-8B-like: %llu "
		       "KiB of K/V each), DRAM-resident, against %s of the "
		       "same bytes\n",
		       sz, be, B.n, B.o.block_tokens,
		       (unsigned long long)(B.payload >> 10),
		       B.o.backend == KVFS_PARAMS_GPU_CUDA ?
			       "cudaMemcpyAsync from pinned memory" :
			       "memcpy between two warm buffers");
	printf("  $ bench_gpu_fetch --backend %s --bytes %llu%s "
	       "--block-tokens %u --iters %d%s%s%s (median of %d)\n", be,
	       (unsigned long long)(B.o.bytes % MiB ? B.o.bytes :
				    B.o.bytes >> 20),
	       B.o.bytes % MiB ? "" : "M", B.o.block_tokens, B.o.iters,
	       B.o.pinned ? " --pinned " : "",
	       B.o.pinned ? pin_names[B.o.pinned] : "",
	       B.o.hidden ? (B.o.bf16 ? " --hidden --weights bf16" :
					" --hidden") :
			    "",
	       B.o.iters);
	t0 = now_ns();
	rc = write_prefix(&B);
	if (rc)
		goto out;
	fmt_bytes(B.dram_cap, dsz, sizeof(dsz));
	printf("  (cache opened in %.2f s with a %s DRAM tier, [tier.dram] "
	       "pinned = %s; prefix committed to DRAM in %.1f s)\n",
	       B.open_s, dsz, pin_names[B.o.pinned],
	       (double)(now_ns() - t0) / 1e9);
	(void)host_copies(&B, &d0, &s0);
	if (B.o.hidden)
		restored(&B, &r0);
	rc = figure(&B, B.n, B.o.iters, !B.o.hidden, &k, &b);
	if (rc)
		goto out;
	if (B.o.hidden) {
		rc = restored(&B, &r0);
		if (rc)
			goto out;
		snprintf(label, sizeof(label),
			 "[11h] FETCH %s prefix, hidden states (%s, %s)", sz,
			 be, B.o.bf16 ? "bf16" : "f32");
		summary(B.o.summ, label, k, b, "GB/s", "-");
		goto out;
	}
	snprintf(label, sizeof(label), "[11] FETCH %s prefix (%s%s%s)", sz, be,
		 B.o.pinned ? ", pinned = " : "",
		 B.o.pinned ? pin_names[B.o.pinned] : "");
	summary(B.o.summ, label, k, b, "GB/s",
		B.o.backend == KVFS_PARAMS_GPU_CUDA ? "0.90" : "-");
	print_copies(&B, d0, s0);

	if (!B.o.sweep)
		goto out;
	for (size_t i = 0; i < sizeof(sweep) / sizeof(sweep[0]); i++) {
		int it = B.o.iters * 3 < 15 ? 15 : B.o.iters * 3;

		if (sweep[i] >= B.n)
			break;
		fmt_bytes((uint64_t)sweep[i] * B.payload, sz, sizeof(sz));
		printf("\n[11b] DRAM -> device pool (%s): FETCH of %u block%s "
		       "(%s) (median of %d)\n", be, sweep[i],
		       sweep[i] > 1 ? "s" : "", sz, it);
		(void)host_copies(&B, &d0, &s0);
		rc = figure(&B, sweep[i], it, false, &k, &b);
		if (rc)
			goto out;
		snprintf(label, sizeof(label), "[11b] DRAM->pool %s (%s%s%s)",
			 sz, be, B.o.pinned ? ", pinned = " : "",
			 B.o.pinned ? pin_names[B.o.pinned] : "");
		summary(B.o.summ, label, k, b, "GB/s", "-");
		print_copies(&B, d0, s0);
	}
out:
	base_release(&B);
	cache_close(&B);
	free(B.keys);
	if (rc == -ENODEV || rc == -EOPNOTSUPP)
		return 2;
	return rc ? 1 : 0;
}
