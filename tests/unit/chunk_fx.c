/* SPDX-License-Identifier: MIT */
/*
 * The fixture of the chunk-read suites (chunk_fx_i.h says what each
 * function promises).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache/cache.h"
#include "cache/chunk.h"
#include "cache/params.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/store.h"
#include "tests/unit/chunk_fx_i.h"

const char *const ns_names[NNS] = { "bf16", "f16", "f32", "f8", "odd" };

int gpu_backend = KVFS_PARAMS_GPU_SHM;

struct kvfs_geom ns_geom(int n)
{
	struct kvfs_geom g = {
		.n_layers = 4,
		.n_kv_heads = 2,
		.head_dim = 128,
		.block_tokens = 64,
		.chunk_tokens = 16,
	};
	static const uint16_t dt[NNS] = { KVFS_DTYPE_BF16, KVFS_DTYPE_F16,
					  KVFS_DTYPE_F32, KVFS_DTYPE_F8_E4M3,
					  KVFS_DTYPE_F8_E4M3 };

	g.dtype = dt[n];
	if (n == NS_ODD)
		g.head_dim = 96;
	return g;
}

uint32_t blk_tokens(int i)
{
	return i == NBLK - 1 ? 40 : 64;
}

uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

void fx_open(struct fx *f)
{
	assert_int_equal(kvfs_cache_open(f->dir, &f->conf,
					 KVFS_CACHE_NOTHREADS |
						 KVFS_CACHE_NOSYNC,
					 &f->c),
			 0);
}

/* Everything on the SSD only: the DRAM tier starts empty. */
void fx_remount(struct fx *f)
{
	kvfs_cache_free(f->c);
	f->c = NULL;
	fx_open(f);
}

struct kvfs_ns *ns_of(struct fx *f, int n)
{
	struct kvfs_ns *ns = kvfs_cache_ns_by_name(f->c, ns_names[n]);

	assert_non_null(ns);
	return ns;
}

/* Build the chains (random payloads, fixed per namespace and block). */
static void build_blocks(struct fx *f)
{
	for (int n = 0; n < NNS; n++) {
		struct kvfs_geom g = ns_geom(n);
		uint8_t parent[KVFS_KEY_LEN];

		kvfs_fmt_root_key(ns_names[n], "", parent);
		for (int i = 0; i < NBLK; i++) {
			uint32_t nt = blk_tokens(i), tok[64];
			uint64_t size =
				kvfs_fmt_file_size(&g, KVFS_KIND_KV, nt);
			uint64_t seed = 0x9e3779b97f4a7c15ull * (n * 8 + i + 1);
			uint8_t *img = malloc(size);

			assert_non_null(img);
			for (uint64_t b = 0; b < size; b += 8) {
				uint64_t v = xs(&seed);

				memcpy(img + b, &v,
				       size - b < 8 ? size - b : 8);
			}
			for (uint32_t t = 0; t < nt; t++)
				tok[t] = 1000u * (unsigned)i + t + 7u * n;
			assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV,
							parent,
							(uint64_t)i * 64, tok,
							nt, NULL, img, size),
					 0);
			memcpy(f->key[n][i], img + 64, KVFS_KEY_LEN);
			memcpy(parent, f->key[n][i], KVFS_KEY_LEN);
			kvfs_fmt_key_hex(f->key[n][i], f->name[n][i]);
			memcpy(f->name[n][i] + KVFS_KEY_HEX_LEN, ".kv", 4);
			f->img[n][i] = img;
			f->size[n][i] = size;
		}
	}
}

static void commit_blocks(struct fx *f)
{
	for (int n = 0; n < NNS; n++)
		for (int i = 0; i < NBLK; i++) {
			struct kvfs_pending *p;
			struct kvfs_block *b;

			assert_int_equal(kvfs_cache_create(f->c, ns_of(f, n),
							   f->name[n][i], &p),
					 0);
			assert_int_equal(kvfs_cache_write(p, 0, f->img[n][i],
							  f->size[n][i]),
					 0);
			assert_int_equal(kvfs_cache_commit(f->c, p, &b), 0);
			kvfs_cache_put(f->c, b);
		}
}

struct fx *fx_new(const struct opts *o, bool remount)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvfs-tchunk.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	assert_int_equal(kvfs_store_create(f->dir, 64 * MiB, true), 0);
	kvfs_cache_params_defaults(&f->conf);
	f->conf.dram_capacity = 16 * MiB;
	f->conf.chunk_dram = o->chunk_dram;
	f->conf.chunk_gpu = o->chunk_gpu;
	f->conf.score_halflife = o->halflife;
	if (o->spec_depth)
		f->conf.chunk_spec_depth = o->spec_depth;
	if (o->chunk_gpu) {
		f->conf.gpu_backend = gpu_backend;
		f->conf.gpu_capacity = 4 * MiB;
	}
	f->conf.n_ns = NNS;
	for (int n = 0; n < NNS; n++) {
		snprintf(f->conf.ns[n].name, sizeof(f->conf.ns[n].name), "%s",
			 ns_names[n]);
		f->conf.ns[n].geom = ns_geom(n);
	}
	fx_open(f);
	build_blocks(f);
	commit_blocks(f);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	if (remount)
		fx_remount(f);
	return f;
}

void fx_free(struct fx *f)
{
	char cmd[128];

	kvfs_cache_free(f->c);
	for (int n = 0; n < NNS; n++)
		for (int i = 0; i < NBLK; i++)
			free(f->img[n][i]);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
}

int setup_nocache(void **state)
{
	struct opts o = { 0 };

	*state = fx_new(&o, true);
	return 0;
}

int setup_dram(void **state)
{
	struct opts o = { .chunk_dram = 64 * MiB };

	*state = fx_new(&o, true);
	return 0;
}

int teardown(void **state)
{
	fx_free(*state);
	return 0;
}

struct kvfs_block *blk(struct fx *f, int n, int i)
{
	struct kvfs_block *b;

	assert_int_equal(
		kvfs_cache_lookup(f->c, ns_of(f, n), f->name[n][i], &b), 0);
	return b;
}

/* The bytes piece (layer, chunk) of block i must hold. */
const uint8_t *want(struct fx *f, int n, int i, uint32_t l, uint32_t c,
		    uint64_t *len)
{
	struct kvfs_geom g = ns_geom(n);
	uint64_t off;

	assert_int_equal(
		kvfs_fmt_chunk_range(&g, blk_tokens(i), l, c, &off, len), 0);
	return f->img[n][i] + off;
}

uint64_t cbytes(int n)
{
	uint64_t off, len;
	struct kvfs_geom g = ns_geom(n);

	assert_int_equal(kvfs_fmt_chunk_range(&g, 64, 0, 0, &off, &len), 0);
	return len;
}

size_t g_misalign;

void req_init(struct fx *f, struct req *r, int n, const int *trip, size_t np)
{
	uint64_t cb = cbytes(n);

	memset(r, 0, sizeof(*r));
	assert_true(np <= 64);
	r->np = np;
	/* Page-aligned destinations are read into directly; g_misalign
	 * sends a request through the scratch buffer instead.
	 */
	assert_int_equal(posix_memalign((void **)&r->mem, 4096, np * cb + 4096),
			 0);
	r->buf = r->mem + g_misalign;
	memset(r->buf, 0xee, np * cb);
	for (size_t k = 0; k < np; k++) {
		r->blk[k] = trip[3 * k];
		r->p[k].b = blk(f, n, trip[3 * k]);
		r->p[k].layer = (uint32_t)trip[3 * k + 1];
		r->p[k].chunk = (uint32_t)trip[3 * k + 2];
		r->p[k].dst = r->buf + k * cb;
	}
}

void req_free(struct fx *f, struct req *r)
{
	for (size_t k = 0; k < r->np; k++)
		kvfs_cache_put(f->c, r->p[k].b);
	free(r->mem);
}

/* Every delivered piece holds exactly its bytes; others are untouched. */
void req_check(struct fx *f, struct req *r, int n)
{
	uint64_t cb = cbytes(n);

	for (size_t k = 0; k < r->np; k++) {
		uint64_t len;
		const uint8_t *w = want(f, n, r->blk[k], r->p[k].layer,
					r->p[k].chunk, &len);
		const uint8_t *got = r->buf + k * cb;

		assert_int_equal(len, cb);
		if (r->p[k].err) {
			/* Untouched, or zeroed after a read in place. */
			assert_int_equal(r->p[k].from, 0);
			for (uint64_t j = 0; j < cb; j++)
				assert_true(got[j] == got[0] &&
					    (got[0] == 0xee || !got[0]));
			continue;
		}
		assert_true(r->p[k].from >= KVFS_CHUNK_FROM_CACHE &&
			    r->p[k].from <= KVFS_CHUNK_FROM_SSD);
		assert_memory_equal(got, w, cb);
	}
}

int req_run(struct fx *f, struct req *r, int n, unsigned flags)
{
	int rc = kvfs_chunk_read(f->c, r->p, r->np, flags, &r->res);

	req_check(f, r, n);
	return rc;
}

/* Read @np pieces and check them; returns the result. */
struct kvfs_chunk_result read_pieces(struct fx *f, int n, const int *trip,
				     size_t np, int want_from)
{
	struct req r;

	req_init(f, &r, n, trip, np);
	assert_int_equal(req_run(f, &r, n, 0), 0);
	for (size_t k = 0; k < np && want_from; k++)
		assert_int_equal(r.p[k].from, want_from);
	assert_int_equal(r.res.bytes_wanted, np * cbytes(n));
	req_free(f, &r);
	return r.res;
}

uint64_t stat_of(struct fx *f, const char *key)
{
	char *s, *p;
	size_t len;
	uint64_t v = UINT64_MAX;

	assert_int_equal(kvfs_cache_stats(f->c, &s, &len), 0);
	for (p = s; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, key, strlen(key)) && p[strlen(key)] == ' ')
			v = strtoull(p + strlen(key) + 1, NULL, 10);
	free(s);
	assert_true(v != UINT64_MAX);
	return v;
}

int where(struct fx *f, int n, int i, uint32_t l, uint32_t c)
{
	struct kvfs_block *b = blk(f, n, i);
	int w = kvfs_chunk_where(f->c, b, l, c);

	kvfs_cache_put(f->c, b);
	return w;
}

void score(struct fx *f, int n, int i, uint32_t c, double a)
{
	struct kvfs_block *b = blk(f, n, i);

	assert_int_equal(kvfs_chunk_score(f->c, b, c, a), 0);
	kvfs_cache_put(f->c, b);
}

void get_score(struct fx *f, int n, int i, uint32_t c, double *iv, uint64_t *fv)
{
	struct kvfs_block *b = blk(f, n, i);
	double s;

	assert_int_equal(kvfs_chunk_get_score(f->c, b, c, iv, fv, &s), 0);
	assert_true(s == *iv * (double)*fv);
	kvfs_cache_put(f->c, b);
}

void one(struct fx *f, int i, int c, int want_from)
{
	int t[3] = { i, 0, c };

	read_pieces(f, NS_BF16, t, 1, want_from);
}

void chunk_fx_init(void)
{
	const char *env = getenv("KVFS_TEST_GPU");

	if (env && !strcmp(env, "cuda"))
		gpu_backend = KVFS_PARAMS_GPU_CUDA;
	/* Refusals log by design; keep the test output readable. */
	kvfs_log_set_level(getenv("KVFS_TEST_LOG") ? KVFS_LOG_DEBUG : -1);
}
