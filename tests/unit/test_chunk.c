/* SPDX-License-Identifier: MIT */
/*
 * Chunk-granular reads and the chunk cache (cache/chunk.c) on a real
 * engine instance: a temp store, background threads off, blocks committed
 * through the write path and made SSD-only by a remount.
 *
 * The device set uses the shm backend; KVFS_TEST_GPU=cuda runs the same
 * tests against cuda (make test-gpu).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
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
#include "hcache/restore.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "tests/unit/ckpt_ref_i.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)

/*
 * Namespaces, one per dtype, and one whose chunk (2 * 16 * 2 * 96 * 1 =
 * 6144 bytes) is not a multiple of 4 KiB. The others: 4 layers, 2 heads,
 * head_dim 128, 64-token blocks of 16-token chunks, so bf16 chunks are
 * 16 KiB and a block has 4 chunks per layer.
 */
enum { NS_BF16, NS_F16, NS_F32, NS_F8, NS_ODD, NNS };
#define NBLK 3 /* a chain: two full blocks, then a 40-token one */

static const char *const ns_names[NNS] = { "bf16", "f16", "f32", "f8",
					   "odd" };

static int gpu_backend = KVFS_PARAMS_GPU_SHM;

static struct kvfs_geom ns_geom(int n)
{
	struct kvfs_geom g = {
		.n_layers = 4, .n_kv_heads = 2, .head_dim = 128,
		.block_tokens = 64, .chunk_tokens = 16,
	};
	static const uint16_t dt[NNS] = { KVFS_DTYPE_BF16, KVFS_DTYPE_F16,
					  KVFS_DTYPE_F32, KVFS_DTYPE_F8_E4M3,
					  KVFS_DTYPE_F8_E4M3 };

	g.dtype = dt[n];
	if (n == NS_ODD)
		g.head_dim = 96;
	return g;
}

static uint32_t blk_tokens(int i)
{
	return i == NBLK - 1 ? 40 : 64;
}

struct fx {
	char dir[64];
	struct kvfs_cache_params conf;
	struct kvfs_cache *c;
	uint8_t *img[NNS][NBLK];
	uint64_t size[NNS][NBLK];
	char name[NNS][NBLK][KVFS_FMT_NAME_LEN + 1];
	uint8_t key[NNS][NBLK][KVFS_KEY_LEN];
};

struct opts {
	uint64_t chunk_dram, chunk_gpu;
	unsigned halflife;
	unsigned spec_depth; /* 0: the default */
};

static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void fx_open(struct fx *f)
{
	assert_int_equal(kvfs_cache_open(f->dir, &f->conf,
					 KVFS_CACHE_NOTHREADS |
						 KVFS_CACHE_NOSYNC,
					 &f->c),
			 0);
}

/* Everything on the SSD only: the DRAM tier starts empty. */
static void fx_remount(struct fx *f)
{
	kvfs_cache_free(f->c);
	f->c = NULL;
	fx_open(f);
}

static struct kvfs_ns *ns_of(struct fx *f, int n)
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
			uint64_t size = kvfs_fmt_file_size(&g, KVFS_KIND_KV, nt);
			uint64_t seed = 0x9e3779b97f4a7c15ull * (n * 8 + i + 1);
			uint8_t *img = malloc(size);

			assert_non_null(img);
			for (uint64_t b = 0; b < size; b += 8) {
				uint64_t v = xs(&seed);

				memcpy(img + b, &v, size - b < 8 ? size - b : 8);
			}
			for (uint32_t t = 0; t < nt; t++)
				tok[t] = 1000u * (unsigned)i + t + 7u * n;
			assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, parent,
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

static struct fx *fx_new(const struct opts *o, bool remount)
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

static void fx_free(struct fx *f)
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

static int setup_nocache(void **state)
{
	struct opts o = { 0 };

	*state = fx_new(&o, true);
	return 0;
}

static int setup_dram(void **state)
{
	struct opts o = { .chunk_dram = 64 * MiB };

	*state = fx_new(&o, true);
	return 0;
}

static int teardown(void **state)
{
	fx_free(*state);
	return 0;
}

static struct kvfs_block *blk(struct fx *f, int n, int i)
{
	struct kvfs_block *b;

	assert_int_equal(kvfs_cache_lookup(f->c, ns_of(f, n), f->name[n][i],
					   &b),
			 0);
	return b;
}

/* The bytes piece (layer, chunk) of block i must hold. */
static const uint8_t *want(struct fx *f, int n, int i, uint32_t l,
			   uint32_t c, uint64_t *len)
{
	struct kvfs_geom g = ns_geom(n);
	uint64_t off;

	assert_int_equal(kvfs_fmt_chunk_range(&g, blk_tokens(i), l, c, &off,
					      len),
			 0);
	return f->img[n][i] + off;
}

static uint64_t cbytes(int n)
{
	uint64_t off, len;
	struct kvfs_geom g = ns_geom(n);

	assert_int_equal(kvfs_fmt_chunk_range(&g, 64, 0, 0, &off, &len), 0);
	return len;
}

/* A request of @np pieces (block, layer, chunk) of namespace @n. */
struct req {
	struct kvfs_chunk_piece p[64];
	int blk[64];
	uint8_t *buf;   /* the destinations, piece after piece */
	uint8_t *mem;   /* its allocation */
	size_t np;
	struct kvfs_chunk_result res;
};

/* Offset of a request's destinations from a page boundary. */
static size_t g_misalign;

static void req_init(struct fx *f, struct req *r, int n, const int *trip,
		     size_t np)
{
	uint64_t cb = cbytes(n);

	memset(r, 0, sizeof(*r));
	assert_true(np <= 64);
	r->np = np;
	/* Page-aligned destinations are read into directly; g_misalign
	 * sends a request through the scratch buffer instead.
	 */
	assert_int_equal(posix_memalign((void **)&r->mem, 4096,
					np * cb + 4096), 0);
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

static void req_free(struct fx *f, struct req *r)
{
	for (size_t k = 0; k < r->np; k++)
		kvfs_cache_put(f->c, r->p[k].b);
	free(r->mem);
}

/* Every delivered piece holds exactly its bytes; others are untouched. */
static void req_check(struct fx *f, struct req *r, int n)
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

static int req_run(struct fx *f, struct req *r, int n, unsigned flags)
{
	int rc = kvfs_chunk_read(f->c, r->p, r->np, flags, &r->res);

	req_check(f, r, n);
	return rc;
}

/* Read @np pieces and check them; returns the result. */
static struct kvfs_chunk_result read_pieces(struct fx *f, int n,
					    const int *trip, size_t np,
					    int want_from)
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

static uint64_t stat_of(struct fx *f, const char *key)
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

static int where(struct fx *f, int n, int i, uint32_t l, uint32_t c)
{
	struct kvfs_block *b = blk(f, n, i);
	int w = kvfs_chunk_where(f->c, b, l, c);

	kvfs_cache_put(f->c, b);
	return w;
}

static void score(struct fx *f, int n, int i, uint32_t c, double a)
{
	struct kvfs_block *b = blk(f, n, i);

	assert_int_equal(kvfs_chunk_score(f->c, b, c, a), 0);
	kvfs_cache_put(f->c, b);
}

static void get_score(struct fx *f, int n, int i, uint32_t c, double *iv,
		      uint64_t *fv)
{
	struct kvfs_block *b = blk(f, n, i);
	double s;

	assert_int_equal(kvfs_chunk_get_score(f->c, b, c, iv, fv, &s), 0);
	assert_true(s == *iv * (double)*fv);
	kvfs_cache_put(f->c, b);
}

/* ---------------------------------------------------------------- tests */

/* Committed, not yet on the SSD: served from the block's DRAM copy. */
static void test_block_copy(void **state)
{
	struct opts o = { .chunk_dram = 64 * MiB };
	struct fx *f = fx_new(&o, false);
	static const int t[] = { 0, 0, 0, 1, 3, 3, 2, 2, 2 };
	struct kvfs_chunk_result res;
	struct kvfs_chunk_stats st;
	struct req r;

	res = read_pieces(f, NS_BF16, t, 3, KVFS_CHUNK_FROM_BLOCK);
	assert_int_equal(res.ssd_reads, 0);
	assert_int_equal(res.bytes_read, 0);
	assert_int_equal(res.mem_hits, 3);
	/* Nothing is copied into the chunk cache: the block has it. */
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.dram_pieces, 0);
	/* A speculative load of a resident piece has nothing to do. */
	req_init(f, &r, NS_BF16, t, 1);
	r.p[0].dst = NULL;
	assert_int_equal(kvfs_chunk_read(f->c, r.p, 1, KVFS_CHUNK_SPECULATIVE,
					 &r.res),
			 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_BLOCK);
	assert_int_equal(r.res.ssd_reads, 0);
	req_free(f, &r);
	fx_free(f);
}

/* Random piece sets, every dtype, partial last chunks, all from the SSD
 * (chunk cache off), each piece exactly its bytes.
 */
static void test_random_sets(void **state)
{
	struct fx *f = *state;
	uint64_t seed = 42;

	for (int n = 0; n < NNS; n++) {
		for (int round = 0; round < 25; round++) {
			int t[3 * 64];
			size_t np = 1 + xs(&seed) % 40, k = 0;

			while (k < np) {
				int i = (int)(xs(&seed) % NBLK);
				int l = (int)(xs(&seed) % 4);
				int c = (int)(xs(&seed) % (i == NBLK - 1 ? 3
									 : 4));
				bool dup = false;

				for (size_t j = 0; j < k; j++)
					dup |= t[3 * j] == i &&
					       t[3 * j + 1] == l &&
					       t[3 * j + 2] == c;
				if (dup)
					continue;
				t[3 * k] = i;
				t[3 * k + 1] = l;
				t[3 * k + 2] = c;
				k++;
			}
			struct kvfs_chunk_result res = read_pieces(
				f, n, t, np, KVFS_CHUNK_FROM_SSD);

			assert_true(res.ssd_reads >= 1 && res.ssd_reads <= np);
			if (n == NS_ODD)
				assert_true(res.bytes_read >= res.bytes_wanted);
			else
				assert_int_equal(res.bytes_read,
						 res.bytes_wanted);
		}
	}
	/* The partial block's last chunk: 8 tokens, then zero rows. */
	for (int n = 0; n < NNS; n++) {
		static const int t[] = { NBLK - 1, 3, 2, NBLK - 1, 0, 2 };
		uint64_t len, half;
		const uint8_t *w = want(f, n, NBLK - 1, 3, 2, &len);

		read_pieces(f, n, t, 2, KVFS_CHUNK_FROM_SSD);
		/* K rows 8..15 are zero in what we compared against. */
		half = len / 2;
		for (uint64_t j = half / 2; j < half; j++)
			assert_int_equal(w[j], 0);
		assert_true(w[0] || w[1] || w[2] || w[3]);
	}
}

/*
 * One piece twice in a request (the API allows it; FETCH_CHUNKS refuses
 * it earlier): both copies delivered, read once, whether read in place
 * (page-aligned destinations) or through the scratch buffer.
 */
static void test_duplicates(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 1, 2, 1, 3, 0, 0, 1, 2 };
	uint64_t cb = cbytes(NS_BF16);
	struct kvfs_chunk_result r;

	for (int m = 0; m < 2; m++) {
		g_misalign = m ? 64 : 0;
		r = read_pieces(f, NS_BF16, t, 3, KVFS_CHUNK_FROM_SSD);
		g_misalign = 0;
		assert_int_equal(r.ssd_reads, 2);
		assert_int_equal(r.bytes_read, 2 * cb);
	}
}

static void test_coalesce(void **state)
{
	struct fx *f = *state;
	uint64_t cb = cbytes(NS_BF16), io0;
	struct kvfs_chunk_result r;
	struct kvfs_chunk_stats st;

	/* Adjacent chunks of a layer: one read, no amplification. */
	{
		static const int t[] = { 0, 0, 0, 0, 0, 1 };

		io0 = stat_of(f, "tier.ssd.io_reads");
		r = read_pieces(f, NS_BF16, t, 2, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 1);
		assert_int_equal(r.bytes_read, 2 * cb);
		assert_int_equal(stat_of(f, "tier.ssd.io_reads") - io0, 1);
	}
	/* A gap: two reads. */
	{
		static const int t[] = { 0, 0, 0, 0, 0, 2 };

		r = read_pieces(f, NS_BF16, t, 2, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 2);
		assert_int_equal(r.bytes_read, 2 * cb);
	}
	/* The last chunk of a layer touches the first of the next: one
	 * read where memory is in the same order; two otherwise, so that
	 * layer 0 is not held back for layer 1.
	 */
	{
		static const int t[] = { 1, 0, 3, 1, 1, 0 };
		static const int u[] = { 1, 1, 0, 1, 0, 3 };

		r = read_pieces(f, NS_BF16, t, 2, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 1);
		r = read_pieces(f, NS_BF16, u, 2, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 2);
		/* Through the scratch buffer memory order does not matter. */
		g_misalign = 64;
		r = read_pieces(f, NS_BF16, u, 2, KVFS_CHUNK_FROM_SSD);
		g_misalign = 0;
		assert_int_equal(r.ssd_reads, 1);
		assert_int_equal(r.bytes_read, 2 * cb);
	}
	/* A whole layer in any order; plus a second block's: two reads. */
	{
		static const int t[] = { 0, 2, 3, 0, 2, 1, 0, 2, 0, 0, 2, 2,
					 1, 2, 2, 1, 2, 0, 1, 2, 1, 1, 2, 3 };

		io0 = stat_of(f, "tier.ssd.io_reads");
		r = read_pieces(f, NS_BF16, t, 8, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 2);
		assert_int_equal(r.bytes_read, 8 * cb);
		assert_int_equal(stat_of(f, "tier.ssd.io_reads") - io0, 2);
	}
	/* 6 KiB chunks: rounded out to 4 KiB, neighbours merged. Chunk 1
	 * alone is bytes [6K, 12K) of the payload: 8 KiB read.
	 */
	{
		static const int t1[] = { 0, 0, 1 };
		static const int t3[] = { 0, 0, 0, 0, 0, 1, 0, 0, 2 };

		r = read_pieces(f, NS_ODD, t1, 1, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 1);
		assert_int_equal(r.bytes_wanted, 6 * KiB);
		assert_int_equal(r.bytes_read, 8 * KiB);
		r = read_pieces(f, NS_ODD, t3, 3, KVFS_CHUNK_FROM_SSD);
		assert_int_equal(r.ssd_reads, 1);
		assert_int_equal(r.bytes_wanted, 18 * KiB);
		assert_int_equal(r.bytes_read, 20 * KiB);
	}
	kvfs_chunk_get_stats(f->c, &st);
	assert_true(st.bytes_read > st.bytes_wanted); /* the 6 KiB ones */
	assert_true(st.ssd_reads >= 8);
	assert_int_equal(st.mem_hits, 0);
}

/* What kvfs_chunk_read_cb's callback saw. */
struct cb_log {
	struct fx *f;
	struct req *r;
	int calls[64];
};

static void on_piece(void *arg, size_t i)
{
	struct cb_log *l = arg;
	uint64_t len;
	const uint8_t *w = want(l->f, NS_BF16, l->r->blk[i],
				l->r->p[i].layer, l->r->p[i].chunk, &len);

	/* Delivered means in place and verified, at the time of the call. */
	assert_true(i < l->r->np);
	assert_int_not_equal(l->r->p[i].from, 0);
	assert_memory_equal(l->r->buf + i * cbytes(NS_BF16), w, len);
	l->calls[i]++;
}

/* The callback runs once per delivered piece, from memory or the SSD,
 * straight into place or through the scratch buffer.
 */
static void test_read_cb(void **state)
{
	struct fx *f = *state;
	/* Two layers of block 0, then block 1, out of order. */
	static const int t[] = { 0, 1, 2, 0, 0, 1, 1, 0, 0, 0, 1, 0,
				 0, 0, 0, 1, 1, 3, 0, 1, 3, 0, 0, 2 };
	struct cb_log l = { .f = f };
	struct req r;

	for (int pass = 0; pass < 3; pass++) {
		g_misalign = pass == 1 ? 512 : 0;
		memset(l.calls, 0, sizeof(l.calls));
		req_init(f, &r, NS_BF16, t, 8);
		l.r = &r;
		assert_int_equal(kvfs_chunk_read_cb(f->c, r.p, 8, 0, &r.res,
						    on_piece, &l), 0);
		req_check(f, &r, NS_BF16);
		for (int k = 0; k < 8; k++)
			assert_int_equal(l.calls[k], 1);
		req_free(f, &r);
	}
	g_misalign = 0;
}

/* Bad input is refused before anything is read or written. */
static void test_bad_input(void **state)
{
	struct fx *f = *state;
	static const int good[] = { 0, 0, 0, 0, 0, 1 };
	static const int bad[][3] = { { 0, 4, 0 }, { 0, 0, 4 },
				      { NBLK - 1, 0, 3 }, { 0, 99, 99 } };
	struct kvfs_block *b;
	struct req r;

	for (size_t k = 0; k < 4; k++) {
		int t[6];

		memcpy(t, good, 3 * sizeof(int));
		memcpy(t + 3, bad[k], 3 * sizeof(int));
		req_init(f, &r, NS_BF16, t, 2);
		assert_int_equal(kvfs_chunk_read(f->c, r.p, 2, 0, &r.res),
				 -EINVAL);
		/* Not even the good piece was delivered. */
		assert_int_equal(r.p[0].from, 0);
		assert_int_equal(r.buf[0], 0xee);
		assert_int_equal(r.res.ssd_reads, 0);
		req_free(f, &r);
	}
	req_init(f, &r, NS_BF16, good, 2);
	r.p[1].dst = NULL;
	assert_int_equal(kvfs_chunk_read(f->c, r.p, 2, 0, &r.res), -EINVAL);
	assert_int_equal(kvfs_chunk_read(f->c, r.p, 2, 1u << 7, &r.res),
			 -EINVAL);
	assert_int_equal(kvfs_chunk_read(f->c, r.p, 0, 0, &r.res), 0);
	assert_int_equal(r.res.bytes_wanted, 0);
	b = r.p[1].b;
	r.p[1].b = NULL;
	assert_int_equal(kvfs_chunk_read(f->c, r.p, 2, 0, &r.res), -EINVAL);
	r.p[1].b = b;
	req_free(f, &r);

	b = blk(f, NS_BF16, NBLK - 1);
	assert_int_equal(kvfs_chunk_score(f->c, b, 3, 1.0), -EINVAL);
	assert_int_equal(kvfs_chunk_score(f->c, b, 0, -1.0), -EINVAL);
	assert_int_equal(kvfs_chunk_score(f->c, b, 0, NAN), -EINVAL);
	assert_int_equal(kvfs_chunk_score(f->c, b, 0, INFINITY), -EINVAL);
	assert_int_equal(kvfs_chunk_score(f->c, b, 2, 0.0), 0);
	assert_int_equal(kvfs_chunk_get_score(f->c, b, 3, NULL, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvfs_chunk_get_score(f->c, b, 1, NULL, NULL, NULL),
			 -ENOENT);
	kvfs_cache_put(f->c, b);
}

/* The data file offset of piece (layer, chunk) of block i, read from the
 * block's record with the cache closed.
 */
static uint64_t piece_disk_off(struct fx *f, int n, int i, uint32_t l,
			       uint32_t c)
{
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_blk rec;
	struct kvfs_geom g = ns_geom(n);
	uint64_t off, len;

	assert_int_equal(kvfs_store_open(f->dir, KVFS_META_NOSYNC, 0, &s), 0);
	assert_int_equal(kvfs_meta_txn_begin(s->meta, true, &t), 0);
	assert_int_equal(kvfs_meta_blk_get(t, f->key[n][i], &rec), 0);
	kvfs_meta_txn_abort(t);
	kvfs_store_free(s);
	assert_int_equal(kvfs_fmt_chunk_range(&g, blk_tokens(i), l, c, &off,
					      &len),
			 0);
	return rec.ssd_off + off;
}

/* Flip one byte of a piece on disk, with the cache closed. */
static void corrupt(struct fx *f, int n, int i, uint32_t l, uint32_t c)
{
	char path[128];
	uint8_t byte;
	uint64_t off;
	int fd;

	kvfs_cache_free(f->c);
	f->c = NULL;
	off = piece_disk_off(f, n, i, l, c) + 100;
	snprintf(path, sizeof(path), "%s/data.kvd", f->dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, (off_t)off), 1);
	byte ^= 0x40;
	assert_int_equal(pwrite(fd, &byte, 1, (off_t)off), 1);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	fx_open(f);
}

/* Remove a block's stored CRC table (a store written before them). */
static void drop_ccrc(struct fx *f, int n, int i)
{
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;

	kvfs_cache_free(f->c);
	f->c = NULL;
	assert_int_equal(kvfs_store_open(f->dir, KVFS_META_NOSYNC, 0, &s), 0);
	assert_int_equal(kvfs_meta_txn_begin(s->meta, false, &t), 0);
	assert_int_equal(kvfs_meta_ccrc_del(t, f->key[n][i]), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_store_free(s);
	fx_open(f);
}

static void test_corrupt_piece(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 2, 0, 1, 2, 1, 1, 2, 2, 0, 2, 1 };
	static const int other[] = { 1, 3, 1, 1, 2, 3, 2, 2, 1 };
	struct kvfs_reader rd;
	struct kvfs_block *b;
	struct req r;
	const void *p;
	size_t got;

	/* Checked with stored CRCs: the write-back keeps them. */
	corrupt(f, NS_BF16, 1, 2, 1);
	req_init(f, &r, NS_BF16, t, 4);
	assert_int_equal(req_run(f, &r, NS_BF16, 0), -EBADMSG);
	assert_int_equal(r.p[1].err, -EBADMSG);
	for (int k = 0; k < 4; k++)
		if (k != 1) {
			assert_int_equal(r.p[k].err, 0);
			assert_int_equal(r.p[k].from, KVFS_CHUNK_FROM_SSD);
		}
	/* Sparse: four pieces, three reads, no more bytes than asked. */
	assert_int_equal(r.res.ssd_reads, 2);
	assert_int_equal(r.res.bytes_read, 4 * cbytes(NS_BF16));
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 1);
	/* Again: the good pieces were cached, the bad one never is. */
	memset(r.buf, 0xee, 4 * cbytes(NS_BF16));
	assert_int_equal(req_run(f, &r, NS_BF16, 0), -EBADMSG);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[3].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[1].err, -EBADMSG);
	assert_int_equal(r.res.ssd_reads, 1);
	req_free(f, &r);
	/* The rest of the block and its neighbours are served. */
	read_pieces(f, NS_BF16, other, 3, KVFS_CHUNK_FROM_SSD);
	/* The whole-file read of the block sees the damage too. */
	b = blk(f, NS_BF16, 1);
	assert_int_equal(kvfs_cache_reader_init(f->c, &rd, b), 0);
	assert_int_equal(kvfs_cache_read_begin(f->c, &rd, 0, 4096, &p, &got),
			 -EBADMSG);
	kvfs_cache_reader_release(f->c, &rd);
	b = blk(f, NS_BF16, 0);
	assert_int_equal(kvfs_cache_reader_init(f->c, &rd, b), 0);
	assert_int_equal(kvfs_cache_read_begin(f->c, &rd, 0,
					       f->size[NS_BF16][0], &p, &got),
			 0);
	assert_memory_equal(p, f->img[NS_BF16][0], f->size[NS_BF16][0]);
	kvfs_cache_read_end(f->c, &rd);
	kvfs_cache_reader_release(f->c, &rd);
}

/* Without stored CRCs: the whole extent is read and checked, the table is
 * rebuilt, later reads are sparse, and the next flush stores it.
 */
static void test_no_stored_crcs(void **state)
{
	struct fx *f = *state;
	static const int t1[] = { 0, 1, 2 };
	static const int t2[] = { 0, 1, 3 };
	static const int t3[] = { 1, 0, 0 };
	uint64_t ext = (f->size[NS_BF16][0] + 4095) & ~4095ull;
	struct kvfs_chunk_result res;
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;
	uint32_t crc[16], exp[16];
	struct req r;

	drop_ccrc(f, NS_BF16, 0);
	res = read_pieces(f, NS_BF16, t1, 1, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(res.ssd_reads, 1);
	assert_int_equal(res.bytes_read, ext);
	res = read_pieces(f, NS_BF16, t2, 1, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(res.bytes_read, cbytes(NS_BF16));

	assert_int_equal(kvfs_chunk_flush(f->c), 0);
	kvfs_cache_free(f->c);
	f->c = NULL;
	for (uint32_t l = 0; l < 4; l++)
		for (uint32_t c = 0; c < 4; c++) {
			uint64_t len;
			const uint8_t *w = want(f, NS_BF16, 0, l, c, &len);

			exp[l * 4 + c] = kvfs_fmt_crc32c(0, w, len);
		}
	assert_int_equal(kvfs_store_open(f->dir, KVFS_META_NOSYNC, 0, &s), 0);
	assert_int_equal(kvfs_meta_txn_begin(s->meta, true, &t), 0);
	assert_int_equal(kvfs_meta_ccrc_get(t, f->key[NS_BF16][0], crc, 16),
			 0);
	kvfs_meta_txn_abort(t);
	kvfs_store_free(s);
	assert_memory_equal(crc, exp, sizeof(crc));
	fx_open(f);
	res = read_pieces(f, NS_BF16, t1, 1, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(res.bytes_read, cbytes(NS_BF16));

	/* A damaged block without CRCs: none of its pieces is served, even
	 * the intact ones (only the block CRC can speak for them).
	 */
	drop_ccrc(f, NS_BF16, 1);
	corrupt(f, NS_BF16, 1, 3, 3);
	req_init(f, &r, NS_BF16, t3, 1);
	assert_int_equal(req_run(f, &r, NS_BF16, 0), -EBADMSG);
	assert_int_equal(r.p[0].err, -EBADMSG);
	req_free(f, &r);
	read_pieces(f, NS_BF16, t2, 1, KVFS_CHUNK_FROM_SSD);
}

static int setup_sets(void **state)
{
	struct opts o = { .chunk_dram = 32 * KiB, .chunk_gpu = 32 * KiB };

	*state = fx_new(&o, true);
	return 0;
}

static void one(struct fx *f, int i, int c, int want_from)
{
	int t[3] = { i, 0, c };

	read_pieces(f, NS_BF16, t, 1, want_from);
}

/*
 * Device and DRAM sets of two 16 KiB pieces each: placement by S = I * F,
 * demotion of device victims that still beat DRAM's lowest, drops of
 * those that do not, refusal of pieces that beat neither, and a DRAM
 * piece moving up when its score grows.
 */
static void test_two_sets(void **state)
{
	struct fx *f = *state;
	struct kvfs_chunk_stats st;
	enum { G = KVFS_CHUNK_IN_GPU, D = KVFS_CHUNK_IN_DRAM,
	       N = KVFS_CHUNK_IN_NONE };
	const int ssd = KVFS_CHUNK_FROM_SSD, mem = KVFS_CHUNK_FROM_CACHE;

	for (int c = 0; c < 4; c++)
		score(f, NS_BF16, 0, (uint32_t)c, c + 1);
	one(f, 0, 0, ssd); /* S 1 */
	one(f, 0, 1, ssd); /* S 2 */
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), G);
	assert_int_equal(where(f, NS_BF16, 0, 0, 1), G);
	one(f, 0, 2, ssd); /* S 3: chunk 0 (S 1) moves down */
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), D);
	assert_int_equal(where(f, NS_BF16, 0, 0, 2), G);
	one(f, 0, 3, ssd); /* S 4: chunk 1 (S 2) moves down */
	assert_int_equal(where(f, NS_BF16, 0, 0, 1), D);
	assert_int_equal(where(f, NS_BF16, 0, 0, 3), G);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.demotions, 2);
	assert_int_equal(st.evictions, 0);
	assert_int_equal(st.gpu_pieces, 2);
	assert_int_equal(st.dram_pieces, 2);
	assert_int_equal(st.dram_used, 32 * KiB);
	assert_int_equal(st.gpu_used, 32 * KiB);
	/* DRAM's pieces become the valuable ones: S 101 and 202. */
	score(f, NS_BF16, 0, 0, 100);
	score(f, NS_BF16, 0, 1, 200);

	/* S 10 takes the device slot of S 3, which is below DRAM's lowest
	 * (101): dropped, not demoted.
	 */
	score(f, NS_BF16, 1, 0, 10);
	one(f, 1, 0, ssd);
	assert_int_equal(where(f, NS_BF16, 1, 0, 0), G);
	assert_int_equal(where(f, NS_BF16, 0, 0, 2), N);
	/* S 0.5 beats neither set's lowest: not cached. */
	score(f, NS_BF16, 1, 1, 0.5);
	one(f, 1, 1, ssd);
	assert_int_equal(where(f, NS_BF16, 1, 0, 1), N);
	score(f, NS_BF16, 1, 2, 150);
	one(f, 1, 2, ssd); /* evicts S 4 */
	score(f, NS_BF16, 1, 3, 120);
	one(f, 1, 3, ssd); /* evicts S 10 */
	assert_int_equal(where(f, NS_BF16, 0, 0, 3), N);
	assert_int_equal(where(f, NS_BF16, 1, 0, 0), N);
	assert_int_equal(where(f, NS_BF16, 1, 0, 2), G);
	assert_int_equal(where(f, NS_BF16, 1, 0, 3), G);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.demotions, 2);
	assert_int_equal(st.evictions, 3);

	/* Chunk 1 of block 0 (S 202, now 404 with this load) is served from
	 * DRAM and moves up: the device's lowest (S 120) moves down, pushing
	 * DRAM's lowest (S 101) out.
	 */
	one(f, 0, 1, mem);
	assert_int_equal(where(f, NS_BF16, 0, 0, 1), G);
	assert_int_equal(where(f, NS_BF16, 1, 0, 3), D);
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), N);
	assert_int_equal(where(f, NS_BF16, 1, 0, 2), G);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.demotions, 3);
	assert_int_equal(st.evictions, 4);
	assert_int_equal(st.gpu_pieces, 2);
	assert_int_equal(st.dram_pieces, 1);
	assert_int_equal(st.dram_used, 16 * KiB);

	/* Both sets serve the right bytes; S 240 does not beat the device's
	 * lowest (S 300, after this very request), so nothing moves.
	 */
	{
		static const int t[] = { 1, 0, 2, 1, 0, 3 };

		read_pieces(f, NS_BF16, t, 2, mem);
	}
	assert_int_equal(where(f, NS_BF16, 1, 0, 3), D);
	assert_int_equal(where(f, NS_BF16, 1, 0, 2), G);
}

static int setup_spec(void **state)
{
	struct opts o = { .chunk_dram = 64 * KiB };

	*state = fx_new(&o, true);
	return 0;
}

static void spec_read(struct fx *f, const int *t, size_t np,
		      struct kvfs_chunk_result *res, int want_from)
{
	struct req r;

	req_init(f, &r, NS_BF16, t, np);
	for (size_t k = 0; k < np; k++)
		r.p[k].dst = NULL;
	assert_int_equal(kvfs_chunk_read(f->c, r.p, np,
					 KVFS_CHUNK_SPECULATIVE, &r.res),
			 0);
	for (size_t k = 0; k < np; k++)
		assert_int_equal(r.p[k].from, want_from);
	*res = r.res;
	req_free(f, &r);
}

/* Speculative loads fill the cache but count in F only once used. */
static void test_speculative(void **state)
{
	struct fx *f = *state;
	static const int s1[] = { 0, 0, 0, 0, 1, 0 };
	static const int e1[] = { 0, 0, 0 };
	static const int e2[] = { 0, 0, 1, 0, 1, 1 };
	static const int s3[] = { 0, 0, 2 };
	static const int e3[] = { 0, 0, 3 };
	static const int s4[] = { 0, 1, 3 };
	struct kvfs_chunk_result res;
	struct kvfs_chunk_stats st;
	struct req r;
	double i;
	uint64_t fv;

	spec_read(f, s1, 2, &res, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(res.ssd_reads, 2);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_int_equal(fv, 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_loaded, 2);
	assert_int_equal(st.spec_used, 0);

	req_init(f, &r, NS_BF16, e1, 1);
	assert_int_equal(req_run(f, &r, NS_BF16, 0), 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 1);
	assert_int_equal(r.res.spec_hits, 1);
	assert_int_equal(r.res.mem_hits, 1);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_int_equal(fv, 1);
	/* Used once: an ordinary piece from now on. */
	assert_int_equal(req_run(f, &r, NS_BF16, 0), 0);
	assert_int_equal(r.p[0].spec, 0);
	assert_int_equal(r.res.spec_hits, 0);
	req_free(f, &r);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_int_equal(fv, 2);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_used, 1);

	/* Fill DRAM (4 pieces): chunk 1 scores S 10 on two layers. */
	score(f, NS_BF16, 0, 1, 5);
	read_pieces(f, NS_BF16, e2, 2, KVFS_CHUNK_FROM_SSD);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.dram_pieces, 4);
	/* A speculative piece that would not be kept is not even read. */
	spec_read(f, s3, 1, &res, 0);
	assert_int_equal(res.ssd_reads, 0);
	assert_int_equal(res.bytes_read, 0);
	assert_int_equal(where(f, NS_BF16, 0, 0, 2), KVFS_CHUNK_IN_NONE);
	/* One that beats the lowest (S 0) is read and kept. */
	score(f, NS_BF16, 0, 3, 1);
	read_pieces(f, NS_BF16, e3, 1, KVFS_CHUNK_FROM_SSD);
	spec_read(f, s4, 1, &res, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(where(f, NS_BF16, 0, 1, 3), KVFS_CHUNK_IN_DRAM);
	/* The two S-0 pieces (chunk 0) made room. */
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), KVFS_CHUNK_IN_NONE);
	assert_int_equal(where(f, NS_BF16, 0, 1, 0), KVFS_CHUNK_IN_NONE);
	get_score(f, NS_BF16, 0, 3, &i, &fv);
	assert_int_equal(fv, 1);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_loaded, 3);
}

/* ------------------------------------------------- joining a prefetch */

enum { GATE_PASS, GATE_EIO, GATE_CORRUPT };

/*
 * Holds a speculative load's SSD read in flight (in the chunk read hook)
 * until the test releases it, optionally failing it or damaging its
 * bytes, and counts the reads and joins it sees.
 */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int mode;           /* GATE_*: done to the speculative read */
	int spec_reads;     /* speculative SSD reads seen */
	int reads;          /* other SSD reads seen */
	size_t joined;      /* pieces requests announced they wait for */
	bool held;          /* a speculative read is in the hook */
	bool release;
};

static void gate_hook(void *arg, int kind, const struct kvfs_chunk_hook_ev *ev)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->lock);
	if (kind == KVFS_CHUNK_HOOK_JOIN) {
		g->joined += ev->joined;
	} else if (!ev->spec) {
		g->reads++;
	} else {
		g->spec_reads++;
		if (g->mode == GATE_EIO)
			*ev->res = -EIO;
		else if (g->mode == GATE_CORRUPT && ev->buf)
			((uint8_t *)ev->buf)[ev->len / 2] ^= 0x5a;
		g->held = true;
		pthread_cond_broadcast(&g->cond);
		while (!g->release)
			pthread_cond_wait(&g->cond, &g->lock);
	}
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

struct run {
	struct fx *f;
	struct req *r;
	unsigned flags;
	const atomic_int *cancel; /* a cancellable speculative load */
	struct gate *g;
	bool finished;      /* under g->lock */
	int rc;
};

static void *run_main(void *arg)
{
	struct run *x = arg;

	if (x->cancel)
		x->rc = kvfs_chunk_speculate(x->f->c, x->r->p, x->r->np,
					     x->cancel, &x->r->res);
	else
		x->rc = kvfs_chunk_read(x->f->c, x->r->p, x->r->np, x->flags,
					&x->r->res);
	pthread_mutex_lock(&x->g->lock);
	x->finished = true;
	pthread_cond_broadcast(&x->g->cond);
	pthread_mutex_unlock(&x->g->lock);
	return NULL;
}

/*
 * A speculative load of piece @t held in flight (@mode done to its read),
 * @meanwhile run while it is, then a request @r for the same piece; the
 * load is let go once the request waits for it (or has finished without
 * waiting). Both are done on return; *@spec_rc is the load's result,
 * g->reads counts only the request's reads. Nothing here waits on time.
 */
static int join_run(struct fx *f, struct gate *g, const int *t, int mode,
		    void (*meanwhile)(struct fx *f), struct req *r,
		    int *spec_rc)
{
	struct req sr;
	struct run rs = { .f = f, .r = &sr, .flags = KVFS_CHUNK_SPECULATIVE,
			  .g = g };
	struct run rr = { .f = f, .r = r, .g = g };
	pthread_t ts, tr;

	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->mode = mode;
	req_init(f, &sr, NS_BF16, t, 1);
	sr.p[0].dst = NULL;
	req_init(f, r, NS_BF16, t, 1);
	kvfs_chunk_set_hook(f->c, gate_hook, g);
	assert_int_equal(pthread_create(&ts, NULL, run_main, &rs), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->held && !rs.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	if (meanwhile)
		meanwhile(f);
	pthread_mutex_lock(&g->lock);
	g->reads = 0;
	pthread_mutex_unlock(&g->lock);
	assert_int_equal(pthread_create(&tr, NULL, run_main, &rr), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->joined && !rr.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	g->release = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	pthread_join(tr, NULL);
	pthread_join(ts, NULL);
	kvfs_chunk_set_hook(f->c, NULL, NULL);
	*spec_rc = rs.rc;
	assert_int_equal(g->spec_reads, 1);
	assert_int_equal(sr.res.ssd_reads, 1);
	req_free(f, &sr);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	/* The request's own bytes, wherever they came from. */
	req_check(f, r, NS_BF16);
	return rr.rc;
}

/* A request for a piece a speculative load is reading waits for that
 * read and takes the cached bytes: no second read.
 */
static void test_join(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 1, 2 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	double i;
	uint64_t fv;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_PASS, NULL, &r, &src), 0);
	assert_int_equal(src, 0);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 0);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 1);
	assert_int_equal(r.res.joined, 1);
	assert_int_equal(r.res.ssd_reads, 0);
	assert_int_equal(r.res.bytes_read, 0);
	assert_int_equal(r.res.mem_hits, 0);
	assert_int_equal(r.res.spec_hits, 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.ssd_reads, 1);
	assert_int_equal(st.prefetch_joined, 1);
	assert_int_equal(st.spec_loaded, 1);
	assert_int_equal(st.spec_used, 1);
	assert_int_equal(st.mem_hits, 0);
	/* The load's piece only: the request read nothing. */
	assert_int_equal(st.bytes_missed, cbytes(NS_BF16));
	/* The request counted in F like any other. */
	get_score(f, NS_BF16, 0, 2, &i, &fv);
	assert_int_equal(fv, 1);
	/* Used once: an ordinary hit from now on. */
	memset(r.buf, 0xee, cbytes(NS_BF16));
	assert_int_equal(req_run(f, &r, NS_BF16, 0), 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 0);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(r.res.mem_hits, 1);
	req_free(f, &r);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 1);
	assert_int_equal(st.spec_used, 1);
}

/* The load's read fails: the waiter reads the piece itself. */
static void test_join_failed(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 3, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_EIO, NULL, &r, &src), 0);
	assert_int_equal(src, -EIO);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(r.res.ssd_reads, 1);
	assert_int_equal(r.res.bytes_read, cbytes(NS_BF16));
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 0);
	assert_int_equal(st.spec_loaded, 0);
	/* The load's piece, and the request's own read of it. */
	assert_int_equal(st.bytes_missed, 2 * cbytes(NS_BF16));
	/* Its own read was cached. */
	assert_int_equal(where(f, NS_BF16, 1, 3, 0), KVFS_CHUNK_IN_DRAM);
	req_free(f, &r);
}

/* The load's bytes fail their CRC: never handed to the waiter, which
 * reads the piece itself.
 */
static void test_join_corrupt(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 2, 0, 1 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_CORRUPT, NULL, &r, &src), 0);
	assert_int_equal(src, -EBADMSG);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 1);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 0);
	req_free(f, &r);
}

/* Chunk 1 of block 0 scores 5 on every layer: the 64 KiB cache is full
 * of pieces a score-0 load cannot displace.
 */
static void fill_cache(struct fx *f)
{
	static const int t[] = { 0, 0, 1, 0, 1, 1, 0, 2, 1, 0, 3, 1 };

	score(f, NS_BF16, 0, 1, 5);
	read_pieces(f, NS_BF16, t, 4, KVFS_CHUNK_FROM_SSD);
}

/* The cache fills while the load reads: it drops the piece, and the
 * waiter, finding nothing, reads it itself.
 */
static void test_join_dropped(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 0, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_PASS, fill_cache, &r, &src),
			 0);
	assert_int_equal(src, 0);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), KVFS_CHUNK_IN_NONE);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 0);
	assert_int_equal(st.spec_loaded, 0);
	assert_int_equal(st.dram_pieces, 4);
	req_free(f, &r);
}

/* ------------------------------------------ cancelling a speculation */

#define CANCEL_DEPTH 4
#define SPEC_N 16

static int setup_cancel(void **state)
{
	struct opts o = { .chunk_dram = 64 * MiB,
			  .spec_depth = CANCEL_DEPTH };

	*state = fx_new(&o, true);
	return 0;
}

/*
 * The load of the cancel tests: chunks 0 and 2 of blocks 0 and 1 on
 * every layer. No two touch on disk, so these are 16 reads, issued four
 * a layer, layer by layer: with a depth of 4 exactly layer 0's are on
 * the disk when the first completes.
 */
static void spec16(int *t)
{
	size_t k = 0;

	for (int l = 0; l < 4; l++)
		for (int b = 0; b < 2; b++)
			for (int c = 0; c <= 2; c += 2) {
				t[k++] = b;
				t[k++] = l;
				t[k++] = c;
			}
}

/*
 * A cancellable load (spec16) is held at its first completed read; the
 * load is cancelled before request @r (@np pieces @t) starts when
 * @early, else once @r waits for a piece of it; then the load is let go.
 * Both are done on return; @sr is the load's request, to be freed by the
 * caller, *@spec_rc its result, and g->reads counts only @r's reads.
 * Nothing waits on time.
 */
static int cancel_run(struct fx *f, struct gate *g, bool early, const int *t,
		      size_t np, struct req *r, struct req *sr, int *spec_rc)
{
	static atomic_int cancel;
	int st[3 * SPEC_N];
	struct run rs = { .f = f, .r = sr, .cancel = &cancel, .g = g };
	struct run rr = { .f = f, .r = r, .g = g };
	pthread_t ts, tr;

	atomic_store(&cancel, 0);
	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->mode = GATE_PASS;
	spec16(st);
	req_init(f, sr, NS_BF16, st, SPEC_N);
	for (size_t k = 0; k < SPEC_N; k++)
		sr->p[k].dst = NULL;
	req_init(f, r, NS_BF16, t, np);
	kvfs_chunk_set_hook(f->c, gate_hook, g);
	assert_int_equal(pthread_create(&ts, NULL, run_main, &rs), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->held && !rs.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	g->reads = 0;
	pthread_mutex_unlock(&g->lock);
	if (early)
		atomic_store(&cancel, 1);
	assert_int_equal(pthread_create(&tr, NULL, run_main, &rr), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->joined && !rr.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	if (!early)
		atomic_store(&cancel, 1);
	pthread_mutex_lock(&g->lock);
	g->release = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	pthread_join(tr, NULL);
	pthread_join(ts, NULL);
	kvfs_chunk_set_hook(f->c, NULL, NULL);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	req_check(f, r, NS_BF16);
	*spec_rc = rs.rc;
	return rr.rc;
}

/* The load's pieces: layer 0's read (the four on the disk when it was
 * cancelled) and cached, every other one cancelled.
 */
static void check_cancelled_load(struct fx *f, struct req *sr, int rc)
{
	uint64_t cb = cbytes(NS_BF16);

	assert_int_equal(rc, -ECANCELED);
	assert_int_equal(sr->res.ssd_reads, CANCEL_DEPTH);
	assert_int_equal(sr->res.bytes_read, CANCEL_DEPTH * cb);
	for (size_t k = 0; k < SPEC_N; k++) {
		if (sr->p[k].layer == 0) {
			assert_int_equal(sr->p[k].err, 0);
			assert_int_equal(sr->p[k].from, KVFS_CHUNK_FROM_SSD);
		} else {
			assert_int_equal(sr->p[k].err, -ECANCELED);
			assert_int_equal(sr->p[k].from, 0);
		}
	}
	/* Read by nobody: not cached. */
	assert_int_equal(where(f, NS_BF16, 1, 3, 2), KVFS_CHUNK_IN_NONE);
	assert_int_equal(where(f, NS_BF16, 0, 1, 0), KVFS_CHUNK_IN_NONE);
}

/*
 * A request that supersedes a speculative load: the load's reads not
 * yet issued never are, those on the disk (no more than the depth) finish
 * and stay joinable, and a piece whose read was never issued is read by
 * the request with its own, without waiting.
 */
static void test_cancel(void **state)
{
	struct fx *f = *state;
	/* issued (layer 0), never issued (layer 2), not in the load */
	static const int t[] = { 0, 0, 2, 1, 2, 0, 0, 3, 1 };
	uint64_t cb = cbytes(NS_BF16);
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r, sr;
	uint64_t reads0;
	int src;

	reads0 = stat_of(f, "tier.ssd.io_reads");
	assert_int_equal(cancel_run(f, &g, true, t, 3, &r, &sr, &src), 0);
	/* Only the issued piece was waited for. */
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.spec_reads, CANCEL_DEPTH);
	assert_int_equal(g.reads, 2);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 1);
	assert_int_equal(r.p[1].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.p[2].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 1);
	assert_int_equal(r.res.ssd_reads, 2);
	assert_int_equal(r.res.bytes_read, 2 * cb);
	check_cancelled_load(f, &sr, src);
	/* The tier issued the load's four reads and the request's two. */
	assert_int_equal(stat_of(f, "tier.ssd.io_reads") - reads0,
			 CANCEL_DEPTH + 2);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_cancelled, SPEC_N - CANCEL_DEPTH);
	assert_int_equal(stat_of(f, "chunk.spec_cancelled"),
			 SPEC_N - CANCEL_DEPTH);
	assert_int_equal(st.spec_loaded, CANCEL_DEPTH);
	assert_int_equal(st.spec_used, 1);
	assert_int_equal(st.prefetch_joined, 1);
	assert_int_equal(st.ssd_reads, CANCEL_DEPTH + 2);
	/* What was read: the load's four pieces and the request's two. */
	assert_int_equal(st.bytes_missed, (CANCEL_DEPTH + 2) * cb);
	assert_int_equal(st.bytes_read, (CANCEL_DEPTH + 2) * cb);
	/* The piece the request read itself is cached as its own. */
	assert_int_equal(where(f, NS_BF16, 1, 2, 0), KVFS_CHUNK_IN_DRAM);
	req_free(f, &r);
	req_free(f, &sr);
}

/*
 * A request joined a read the load had not issued yet; then the load is
 * cancelled: the read never happens, and the request reads the piece
 * itself, with the right bytes.
 */
static void test_cancel_joined(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 2, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r, sr;
	int src;

	assert_int_equal(cancel_run(f, &g, false, t, 1, &r, &sr, &src), 0);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.spec_reads, CANCEL_DEPTH);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.p[0].spec, 0);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(r.res.ssd_reads, 1);
	check_cancelled_load(f, &sr, src);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_cancelled, SPEC_N - CANCEL_DEPTH);
	assert_int_equal(st.prefetch_joined, 0);
	assert_int_equal(st.spec_loaded, CANCEL_DEPTH);
	assert_int_equal(st.spec_used, 0);
	assert_int_equal(where(f, NS_BF16, 1, 2, 0), KVFS_CHUNK_IN_DRAM);
	req_free(f, &r);
	req_free(f, &sr);
}

/* With no depth of its own (spec_depth 0) the whole load is on the disk
 * at its first completion, and a cancel then stops nothing.
 */
static void test_cancel_nocap(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 2, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r, sr;
	int src;

	f->conf.chunk_spec_depth = 0;
	fx_remount(f);
	assert_int_equal(cancel_run(f, &g, true, t, 1, &r, &sr, &src), 0);
	assert_int_equal(src, 0);
	assert_int_equal(g.spec_reads, SPEC_N);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.res.joined, 1);
	assert_int_equal(sr.res.ssd_reads, SPEC_N);
	for (size_t k = 0; k < SPEC_N; k++)
		assert_int_equal(sr.p[k].err, 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_cancelled, 0);
	assert_int_equal(st.spec_loaded, SPEC_N);
	req_free(f, &r);
	req_free(f, &sr);
}

/*
 * Cancellable loads (two sharing one token, one with its own) and
 * requests over overlapping random pieces, run at once, one token set
 * while they run: every call returns, every request gets its bytes, a
 * load's pieces are read or cancelled, the counters agree with the calls
 * and the tier, and no flight is left behind (a last request for every
 * piece would wait on one forever).
 */
#define STRESS_NP 44
static void stress_pieces(uint64_t *seed, int *t, size_t np)
{
	int all[3 * STRESS_NP];
	size_t k = 0;

	for (int b = 0; b < NBLK; b++)
		for (int l = 0; l < 4; l++)
			for (int c = 0; c < (b == NBLK - 1 ? 3 : 4); c++) {
				all[3 * k] = b;
				all[3 * k + 1] = l;
				all[3 * k + 2] = c;
				k++;
			}
	assert_int_equal(k, STRESS_NP);
	/* A random subset, no piece twice. */
	for (size_t i = 0; i < np; i++) {
		size_t j = i + xs(seed) % (STRESS_NP - i);
		int x[3];

		memcpy(x, &all[3 * j], sizeof(x));
		memmove(&all[3 * j], &all[3 * i], sizeof(x));
		memcpy(&all[3 * i], x, sizeof(x));
		memcpy(&t[3 * i], x, sizeof(x));
	}
}

static void test_cancel_stress(void **state)
{
	struct fx *f = *state;
	enum { NL = 3, NR = 2 };
	uint64_t seed = 4242;

	for (int it = 0; it < 24; it++) {
		static atomic_int tok[2];
		struct req lr[NL], rr[NR], last;
		struct run ru[NL + NR];
		pthread_t th[NL + NR];
		struct gate g = { 0 };
		struct kvfs_chunk_stats s0, s1;
		uint64_t io0, cancelled = 0, bread = 0, nreads = 0;
		int t[3 * STRESS_NP];

		f->conf.chunk_spec_depth = 1 + (unsigned)(it % 3);
		fx_remount(f);
		pthread_mutex_init(&g.lock, NULL);
		pthread_cond_init(&g.cond, NULL);
		atomic_store(&tok[0], 0);
		atomic_store(&tok[1], 0);
		for (int k = 0; k < NL; k++) {
			size_t np = 8 + xs(&seed) % 24;

			stress_pieces(&seed, t, np);
			req_init(f, &lr[k], NS_BF16, t, np);
			for (size_t j = 0; j < np; j++)
				lr[k].p[j].dst = NULL;
			ru[k] = (struct run){ .f = f, .r = &lr[k], .g = &g,
					      .cancel = &tok[k == 2] };
		}
		for (int k = 0; k < NR; k++) {
			size_t np = 4 + xs(&seed) % 20;

			g_misalign = (it + k) % 2 ? 64 : 0;
			stress_pieces(&seed, t, np);
			req_init(f, &rr[k], NS_BF16, t, np);
			ru[NL + k] = (struct run){ .f = f, .r = &rr[k],
						   .g = &g };
		}
		g_misalign = 0;
		kvfs_chunk_get_stats(f->c, &s0);
		io0 = stat_of(f, "tier.ssd.io_reads");
		for (int k = 0; k < NL + NR; k++)
			assert_int_equal(pthread_create(&th[k], NULL, run_main,
							&ru[k]), 0);
		atomic_store(&tok[it % 2], 1);
		for (int k = 0; k < NL + NR; k++)
			pthread_join(th[k], NULL);
		for (int k = 0; k < NR; k++) {
			assert_int_equal(ru[NL + k].rc, 0);
			req_check(f, &rr[k], NS_BF16);
			bread += rr[k].res.bytes_read;
			nreads += rr[k].res.ssd_reads;
		}
		for (int k = 0; k < NL; k++) {
			assert_true(ru[k].rc == 0 || ru[k].rc == -ECANCELED);
			for (size_t j = 0; j < lr[k].np; j++) {
				int e = lr[k].p[j].err;

				assert_true(e == 0 || e == -ECANCELED);
				cancelled += e == -ECANCELED;
				if (e)
					assert_int_equal(lr[k].p[j].from, 0);
			}
			bread += lr[k].res.bytes_read;
			nreads += lr[k].res.ssd_reads;
		}
		kvfs_chunk_get_stats(f->c, &s1);
		assert_int_equal(s1.spec_cancelled - s0.spec_cancelled,
				 cancelled);
		assert_int_equal(s1.bytes_read - s0.bytes_read, bread);
		assert_int_equal(s1.ssd_reads - s0.ssd_reads, nreads);
		assert_int_equal(stat_of(f, "tier.ssd.io_reads") - io0,
				 nreads);
		/* Nothing read more than it wanted: every SSD byte was a
		 * wanted one (aligned pieces, CRC tables).
		 */
		assert_int_equal(s1.bytes_missed - s0.bytes_missed, bread);
		/* No flight left: this would wait on one forever. */
		stress_pieces(&seed, t, STRESS_NP);
		req_init(f, &last, NS_BF16, t, STRESS_NP);
		assert_int_equal(kvfs_chunk_read(f->c, last.p, last.np, 0,
						 &last.res), 0);
		req_check(f, &last, NS_BF16);
		req_free(f, &last);
		for (int k = 0; k < NL; k++)
			req_free(f, &lr[k]);
		for (int k = 0; k < NR; k++)
			req_free(f, &rr[k]);
		pthread_cond_destroy(&g.cond);
		pthread_mutex_destroy(&g.lock);
	}
}

/* Scores survive a restart (flushed in batches, and at close), and go
 * with their block.
 */
static void test_scores_persist(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 0, 1, 0, 2, 1 };
	static const int t2[] = { 0, 1, 1 };
	static const int tl[] = { NBLK - 1, 0, 0, NBLK - 1, 1, 2 };
	struct kvfs_chunk_stats st;
	struct kvfs_block *b;
	double i;
	uint64_t fv;

	score(f, NS_F16, 0, 1, 2.5);
	score(f, NS_F16, 0, 1, 0.25);
	read_pieces(f, NS_F16, t, 2, KVFS_CHUNK_FROM_SSD);
	get_score(f, NS_F16, 0, 1, &i, &fv);
	assert_true(i == 2.75);
	assert_int_equal(fv, 2);
	assert_int_equal(kvfs_chunk_flush(f->c), 0);
	assert_int_equal(kvfs_chunk_flush(f->c), 0); /* nothing dirty */
	fx_remount(f);
	get_score(f, NS_F16, 0, 1, &i, &fv);
	assert_true(i == 2.75);
	assert_int_equal(fv, 2);
	read_pieces(f, NS_F16, t2, 1, KVFS_CHUNK_FROM_SSD);
	fx_remount(f); /* the close flushes */
	get_score(f, NS_F16, 0, 1, &i, &fv);
	assert_true(i == 2.75);
	assert_int_equal(fv, 3);

	/* Deleting a block drops its cached pieces and its scores. */
	score(f, NS_F16, NBLK - 1, 0, 1);
	read_pieces(f, NS_F16, tl, 2, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(kvfs_chunk_flush(f->c), 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.dram_pieces, 2);
	b = blk(f, NS_F16, NBLK - 1);
	assert_int_equal(kvfs_cache_unlink(f->c, ns_of(f, NS_F16),
					   f->name[NS_F16][NBLK - 1]),
			 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.dram_pieces, 0);
	assert_int_equal(st.dram_used, 0);
	assert_int_equal(kvfs_chunk_get_score(f->c, b, 0, &i, &fv, NULL),
			 -ENOENT);
	kvfs_cache_put(f->c, b);
	assert_int_equal(kvfs_chunk_flush(f->c), 0);
	/* Other blocks keep theirs. */
	get_score(f, NS_F16, 0, 1, &i, &fv);
	assert_int_equal(fv, 3);
}

static int setup_decay(void **state)
{
	struct opts o = { .chunk_dram = 64 * MiB, .halflife = 1 };

	*state = fx_new(&o, true);
	return 0;
}

/* With score_halflife 1 each request halves I; F never decays. */
static void test_decay(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 0, 0 };
	double i;
	uint64_t fv;

	score(f, NS_BF16, 0, 0, 8);
	score(f, NS_BF16, 0, 1, 3);
	read_pieces(f, NS_BF16, t, 1, KVFS_CHUNK_FROM_SSD);
	kvfs_chunk_tick(f->c);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_true(i == 4);
	assert_int_equal(fv, 1);
	/* New attention adds at full weight. */
	score(f, NS_BF16, 0, 0, 4);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_true(i == 8);
	kvfs_chunk_tick(f->c);
	kvfs_chunk_tick(f->c);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_true(i == 2);
	/* Past the renormalisation (64 half-lives) nothing jumps. */
	for (int k = 0; k < 70; k++)
		kvfs_chunk_tick(f->c);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_true(i == ldexp(2, -70));
	get_score(f, NS_BF16, 0, 1, &i, &fv);
	assert_true(i == ldexp(3, -73));
	/* The decayed value is what is stored. */
	fx_remount(f);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_true(i == ldexp(2, -70));
	/* A score that did not change is rewritten once a half-life has
	 * passed, so a restart does not bring back undecayed values.
	 */
	score(f, NS_BF16, 0, 2, 8);
	assert_int_equal(kvfs_chunk_flush(f->c), 0);
	kvfs_chunk_tick(f->c);
	assert_int_equal(kvfs_chunk_flush(f->c), 0);
	kvfs_chunk_tick(f->c);
	kvfs_chunk_tick(f->c);
	fx_remount(f);
	get_score(f, NS_BF16, 0, 2, &i, &fv);
	assert_true(i == 1);
}

/* Without a half-life a tick changes nothing. */
static void test_no_decay(void **state)
{
	struct fx *f = *state;
	double i;
	uint64_t fv;

	score(f, NS_BF16, 2, 2, 8);
	kvfs_chunk_tick(f->c);
	get_score(f, NS_BF16, 2, 2, &i, &fv);
	assert_true(i == 8);
}

/* ---- concurrency: readers, scorers and evictions at once ---- */

struct thr {
	struct fx *f;
	unsigned seed;
	int fails;
};

static void *reader_main(void *arg)
{
	struct thr *th = arg;
	struct fx *f = th->f;
	uint64_t seed = th->seed;
	uint64_t cb = cbytes(NS_BF16);
	uint8_t *buf = malloc(8 * cb);

	for (int it = 0; it < 300 && buf; it++) {
		struct kvfs_chunk_piece p[8];
		int bi[8];
		size_t np = 1 + xs(&seed) % 8;
		unsigned flags = xs(&seed) % 5 == 0 ? KVFS_CHUNK_SPECULATIVE
						    : 0;

		memset(p, 0, sizeof(p));
		for (size_t k = 0; k < np; k++) {
			int i = (int)(xs(&seed) % 2);

			bi[k] = i;
			if (kvfs_cache_lookup(f->c, ns_of(f, NS_BF16),
					      f->name[NS_BF16][i], &p[k].b))
				th->fails++;
			p[k].layer = (uint32_t)(xs(&seed) % 4);
			p[k].chunk = (uint32_t)(xs(&seed) % 4);
			p[k].dst = flags ? NULL : buf + k * cb;
		}
		if (xs(&seed) % 3 == 0 &&
		    kvfs_chunk_score(f->c, p[0].b, p[0].chunk,
				     (double)(xs(&seed) % 100)))
			th->fails++;
		if (kvfs_chunk_read(f->c, p, np, flags, NULL))
			th->fails++;
		for (size_t k = 0; k < np; k++) {
			uint64_t len;
			const uint8_t *w = want(f, NS_BF16, bi[k], p[k].layer,
						p[k].chunk, &len);

			if (!flags && memcmp(buf + k * cb, w, cb))
				th->fails++;
			kvfs_cache_put(f->c, p[k].b);
		}
	}
	free(buf);
	return NULL;
}

static int setup_small(void **state)
{
	struct opts o = { .chunk_dram = 48 * KiB, .chunk_gpu = 48 * KiB };

	*state = fx_new(&o, true);
	return 0;
}

static void test_concurrent(void **state)
{
	struct fx *f = *state;
	struct kvfs_chunk_stats st;
	struct thr th[4];
	pthread_t t[4];

	for (int k = 0; k < 4; k++) {
		th[k] = (struct thr){ .f = f, .seed = 1234u + 77u * k };
		assert_int_equal(pthread_create(&t[k], NULL, reader_main,
						&th[k]),
				 0);
	}
	for (int k = 0; k < 4; k++) {
		pthread_join(t[k], NULL);
		assert_int_equal(th[k].fails, 0);
	}
	kvfs_chunk_get_stats(f->c, &st);
	assert_true(st.gpu_used <= st.gpu_capacity);
	assert_true(st.dram_used <= st.dram_capacity);
	assert_int_equal(st.gpu_used, st.gpu_pieces * 16 * KiB);
	assert_int_equal(st.dram_used, st.dram_pieces * 16 * KiB);
	assert_true(st.mem_hits > 0);
	assert_int_equal(kvfs_chunk_flush(f->c), 0);
}

/* ------------------------------------------- hidden-state and split blocks */

/*
 * Namespaces with a checkpoint (a tiny Llama MHA model from ckpt_ref.c: 4
 * layers, hidden 64, 4 heads of 16, F32 weights) that keep HIDDEN writes
 * as hidden states (bf16, f32) or split them (bf16, store_as = auto with
 * the last 2 layers as K and V: kind MIXED, kv_from 2). Blocks are the
 * same 64, 64, 40-token chain at start positions 0, 64, 128.
 *
 * What a piece must hold: a piece of a layer stored as K and V, or one
 * served from the KV image a restoration left in DRAM, is exactly the
 * bytes of the full restored file. A piece projected from hidden states
 * is exactly kvfs_restore_layer() run on that chunk's rows alone, and,
 * element by element, within the restoration tolerance of the
 * double-precision reference (docs/contiguouskv.md says why it need not
 * be bit-identical with the full file's restoration).
 */
enum { HN_BF16, HN_F32, HN_MIX, HNS };

static const char *const hns_names[HNS] = { "hid", "hid32", "mix" };

static const struct spec h_spec = {
	.family = KVFS_FAMILY_LLAMA, .L = 4, .hidden = 64, .kvh = 4, .hd = 16,
	.wdt = KVFS_DTYPE_F32, .theta = 10000, .eps = 1e-5,
};

struct hx {
	char dir[64];
	char wpath[96];
	struct kvfs_cache_params conf;
	struct kvfs_cache *c;
	struct refmodel rm;
	struct kvfs_restore *r;  /* the test's own, for expected bytes */
	struct block hb[HNS][NBLK];
	uint8_t *kv[HNS][NBLK];  /* the full KV file each block serves */
	uint64_t kvsize[HNS][NBLK];
	char name[HNS][NBLK][KVFS_FMT_NAME_LEN + 1];
	uint8_t key[HNS][NBLK][KVFS_KEY_LEN];
};

static struct kvfs_geom hns_geom(int n)
{
	struct kvfs_geom g = {
		.n_layers = 4, .n_kv_heads = 4, .head_dim = 16,
		.hidden_size = 64, .block_tokens = 64, .chunk_tokens = 16,
		.dtype = n == HN_F32 ? KVFS_DTYPE_F32 : KVFS_DTYPE_BF16,
	};

	return g;
}

static uint32_t hns_kv_from(int n)
{
	return n == HN_MIX ? 2 : 4;
}

static void hx_open(struct hx *h)
{
	assert_int_equal(kvfs_cache_open(h->dir, &h->conf,
					 KVFS_CACHE_NOTHREADS |
						 KVFS_CACHE_NOSYNC,
					 &h->c),
			 0);
}

static void hx_remount(struct hx *h)
{
	kvfs_cache_free(h->c);
	h->c = NULL;
	hx_open(h);
}

static struct hx *hx_new(uint64_t chunk_dram, bool remount)
{
	struct hx *h = calloc(1, sizeof(*h));

	assert_non_null(h);
	snprintf(h->dir, sizeof(h->dir), "/tmp/kvfs-tchunkh.XXXXXX");
	assert_non_null(mkdtemp(h->dir));
	snprintf(h->wpath, sizeof(h->wpath), "%s/model.safetensors", h->dir);
	make_model(&h->rm, &h_spec, 11);
	write_checkpoint(h->wpath, h->rm.t, h->rm.nt);
	assert_int_equal(kvfs_restore_load(&h->rm.m, h->wpath, 0, &h->r), 0);
	assert_int_equal(kvfs_store_create(h->dir, 64 * MiB, true), 0);
	kvfs_cache_params_defaults(&h->conf);
	h->conf.dram_capacity = 16 * MiB;
	h->conf.chunk_dram = chunk_dram;
	h->conf.n_ns = HNS;
	for (int n = 0; n < HNS; n++) {
		struct kvfs_ns_params *cn = &h->conf.ns[n];

		snprintf(cn->name, sizeof(cn->name), "%s", hns_names[n]);
		cn->geom = hns_geom(n);
		snprintf(cn->hc.weights, sizeof(cn->hc.weights), "%s",
			 h->wpath);
		cn->hc.family = KVFS_FAMILY_LLAMA;
		cn->hc.rms_norm_eps = h_spec.eps;
		cn->hc.rope_theta = h_spec.theta;
		cn->hc.rope_type = KVFS_ROPE_DEFAULT;
		cn->hc.store_as = n == HN_MIX ? KVFS_STORE_AUTO
					      : KVFS_STORE_HIDDEN;
		cn->hc.kv_layers = n == HN_MIX ? 2 : KVFS_PARAMS_KV_LAYERS_SCHED;
	}
	hx_open(h);

	for (int n = 0; n < HNS; n++) {
		struct kvfs_geom g = hns_geom(n);
		uint8_t parent[KVFS_KEY_LEN];

		kvfs_fmt_root_key(hns_names[n], "", parent);
		for (int i = 0; i < NBLK; i++) {
			uint32_t nt = blk_tokens(i), tok[64];
			uint64_t pos = (uint64_t)i * 64, po;
			uint64_t hsize = kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN,
							    nt);
			uint64_t ksize = kvfs_fmt_file_size(&g, KVFS_KIND_KV,
							    nt);
			struct block *hb = &h->hb[n][i];
			uint8_t *img = malloc(hsize), *kv = calloc(1, ksize);
			struct kvfs_restore_io io = { 0 };
			struct kvfs_pending *p;
			struct kvfs_block *b;
			struct kvfs_block_info bi;

			assert_true(img && kv);
			make_block(hb, &h->rm, g.dtype, nt, 16, pos);
			for (uint32_t t = 0; t < nt; t++)
				tok[t] = 500u * (unsigned)i + t + 3u * n;
			assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_HIDDEN,
							parent, pos, tok, nt,
							hb->hidden, img, hsize),
					 0);
			/* The file every reader sees: all layers restored. */
			po = kvfs_fmt_payload_off(nt);
			io = (struct kvfs_restore_io){
				.hidden = hb->hidden,
				.hidden_len = hb->hidden_len,
				.hidden_dtype = g.dtype,
				.kv = kv + po, .kv_len = ksize - po,
				.kv_dtype = g.dtype, .start_pos = pos,
				.n_tokens = nt, .chunk_tokens = 16 };
			assert_int_equal(kvfs_restore_block(h->r, NULL, &io), 0);
			assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, parent,
							pos, tok, nt, NULL, kv,
							ksize),
					 0);
			memcpy(h->key[n][i], img + 64, KVFS_KEY_LEN);
			memcpy(parent, h->key[n][i], KVFS_KEY_LEN);
			kvfs_fmt_key_hex(h->key[n][i], h->name[n][i]);
			memcpy(h->name[n][i] + KVFS_KEY_HEX_LEN, ".kv", 4);
			h->kv[n][i] = kv;
			h->kvsize[n][i] = ksize;

			assert_int_equal(
				kvfs_cache_create(h->c,
						  kvfs_cache_ns_by_name(
							  h->c, hns_names[n]),
						  h->name[n][i], &p),
				0);
			assert_int_equal(kvfs_cache_write(p, 0, img, hsize), 0);
			assert_int_equal(kvfs_cache_commit(h->c, p, &b), 0);
			kvfs_block_info(b, &bi);
			assert_int_equal(bi.stored_kind,
					 n == HN_MIX ? KVFS_KIND_MIXED
						     : KVFS_KIND_HIDDEN);
			assert_int_equal(bi.size, ksize);
			kvfs_cache_put(h->c, b);
			free(img);
		}
	}
	assert_int_equal(kvfs_cache_writeback_now(h->c), 0);
	if (remount)
		hx_remount(h);
	return h;
}

static void hx_free(struct hx *h)
{
	char cmd[128];

	kvfs_cache_free(h->c);
	for (int n = 0; n < HNS; n++)
		for (int i = 0; i < NBLK; i++) {
			free(h->kv[n][i]);
			free_block(&h->hb[n][i]);
		}
	kvfs_restore_free(h->r);
	free_model(&h->rm);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", h->dir);
	assert_int_equal(system(cmd), 0);
	free(h);
}

static struct kvfs_block *hblk(struct hx *h, int n, int i)
{
	struct kvfs_block *b;

	assert_int_equal(kvfs_cache_lookup(h->c,
					   kvfs_cache_ns_by_name(h->c,
								 hns_names[n]),
					   h->name[n][i], &b),
			 0);
	return b;
}

static uint64_t hcbytes(int n)
{
	struct kvfs_geom g = hns_geom(n);
	uint64_t off, len;

	assert_int_equal(kvfs_fmt_chunk_range(&g, 64, 0, 0, &off, &len), 0);
	return len;
}

/* Piece (l, c) of block i of the full KV file. */
static const uint8_t *hfull(struct hx *h, int n, int i, uint32_t l,
			    uint32_t c)
{
	struct kvfs_geom g = hns_geom(n);
	uint64_t off, len;

	assert_int_equal(kvfs_fmt_chunk_range(&g, blk_tokens(i), l, c, &off,
					      &len),
			 0);
	assert_int_equal(len, hcbytes(n));
	return h->kv[n][i] + off;
}

/*
 * @got must be piece (l, c) of block i: the full file's bytes where they
 * are copied (@exact, or a layer stored as K and V), else the chunk's own
 * projection, within tolerance of the reference, padding rows zero.
 */
static void hcheck(struct hx *h, int n, int i, uint32_t l, uint32_t c,
		   const uint8_t *got, bool exact)
{
	struct kvfs_geom g = hns_geom(n);
	struct block *hb = &h->hb[n][i];
	uint64_t cb = hcbytes(n);
	uint32_t nt = blk_tokens(i), first = c * 16;
	uint32_t in = nt - first < 16 ? nt - first : 16, D = h->rm.kvd;
	size_t es = esize(g.dtype), row = (size_t)D * es;
	uint8_t *want = malloc(cb);
	double k[64], v[64];

	assert_non_null(want);
	if (exact || l >= hns_kv_from(n)) {
		assert_memory_equal(got, hfull(h, n, i, l, c), cb);
		free(want);
		return;
	}
	assert_int_equal(kvfs_restore_layer(h->r, NULL, l,
					    hb->hidden + ((size_t)l * hb->rows +
							  first) *
								 64 * es,
					    g.dtype, hb->pos + first, in, 16,
					    want, g.dtype),
			 0);
	assert_memory_equal(got, want, cb);
	for (uint32_t t = 0; t < 16; t++) {
		const uint8_t *kr = got + t * row, *vr = got + (16 + t) * row;

		if (t >= in) {
			for (size_t j = 0; j < row; j++)
				assert_true(!kr[j] && !vr[j]);
			continue;
		}
		ref_kv(&h->rm, l, hb->x + ((size_t)l * nt + first + t) * 64,
		       hb->pos + first + t, k, v);
		for (uint32_t j = 0; j < D; j++) {
			assert_true(fabs(dec(g.dtype, kr, j) - k[j]) <=
				    tol(g.dtype, k[j]));
			assert_true(fabs(dec(g.dtype, vr, j) - v[j]) <=
				    tol(g.dtype, v[j]));
		}
	}
	free(want);
}

/* Read the pieces (block, layer, chunk) @trip of namespace @n into fresh
 * 0xee-filled memory (offset @mis from a page); check every delivered
 * one. Returns kvfs_chunk_read()'s result.
 */
static int hread(struct hx *h, int n, const int *trip, size_t np,
		 size_t mis, int want_from, bool exact,
		 struct kvfs_chunk_piece *p, struct kvfs_chunk_result *res)
{
	uint64_t cb = hcbytes(n);
	uint8_t *mem = NULL, *buf;
	int rc;

	assert_int_equal(posix_memalign((void **)&mem, 4096,
					np * cb + 4096), 0);
	buf = mem + mis;
	memset(buf, 0xee, np * cb);
	for (size_t k = 0; k < np; k++)
		p[k] = (struct kvfs_chunk_piece){
			.b = hblk(h, n, trip[3 * k]),
			.layer = (uint32_t)trip[3 * k + 1],
			.chunk = (uint32_t)trip[3 * k + 2],
			.dst = buf + k * cb };
	rc = kvfs_chunk_read(h->c, p, np, 0, res);
	for (size_t k = 0; k < np; k++) {
		if (p[k].err || rc == -EINVAL) {
			/* Not delivered: not touched either. */
			assert_int_equal(p[k].from, 0);
			for (uint64_t j = 0; j < cb; j++)
				assert_int_equal(buf[k * cb + j], 0xee);
		} else {
			/* Stored K and V may be cached: the same bytes. */
			if (want_from && !(p[k].from == KVFS_CHUNK_FROM_CACHE &&
					   p[k].layer >= hns_kv_from(n)))
				assert_int_equal(p[k].from, want_from);
			hcheck(h, n, trip[3 * k], p[k].layer, p[k].chunk,
			       buf + k * cb, exact);
		}
		kvfs_cache_put(h->c, p[k].b);
	}
	free(mem);
	return rc;
}

/* Every piece of every block of @n, one layer per request. */
static void hread_all(struct hx *h, int n, size_t mis, int want_from,
		      bool exact)
{
	struct kvfs_chunk_piece p[12];
	struct kvfs_chunk_result res;

	for (int l = 0; l < 4; l++) {
		int t[3 * 12];
		size_t np = 0;

		for (int i = NBLK - 1; i >= 0; i--)
			for (int c = 0; c < (i == NBLK - 1 ? 3 : 4); c++) {
				t[3 * np] = i;
				t[3 * np + 1] = l;
				t[3 * np + 2] = c;
				np++;
			}
		assert_int_equal(hread(h, n, t, np, mis, want_from, exact, p,
				       &res),
				 0);
		assert_int_equal(res.bytes_wanted, np * hcbytes(n));
	}
}

/*
 * Hidden and split blocks: right after commit (their stored image in
 * DRAM), then from the SSD, aligned and not, then from the chunk cache;
 * what the SSD reads for a hidden piece; scores on them.
 */
static void test_hidden_pieces(void **state)
{
	struct hx *h = hx_new(64 * MiB, false);
	static const int one_piece[] = { 1, 0, 1 };
	struct kvfs_chunk_piece p[4];
	struct kvfs_chunk_result res;
	struct kvfs_chunk_stats st;
	struct kvfs_block *b;
	double iv, sv;
	uint64_t fv;

	(void)state;
	/* In DRAM as stored: projected (or copied) from the block's copy,
	 * and the projected ones are kept by the chunk cache.
	 */
	for (int n = 0; n < HNS; n++)
		hread_all(h, n, 0, KVFS_CHUNK_FROM_BLOCK, false);
	kvfs_chunk_get_stats(h->c, &st);
	/* hid, hid32: 4 layers; mix: 2 of 4; 11 chunks each. */
	assert_int_equal(st.dram_pieces, (4 + 4 + 2) * 11);
	hread_all(h, HN_BF16, 0, KVFS_CHUNK_FROM_CACHE, false);

	/* From the SSD, into place where aligned, and through the scratch
	 * buffer; then from the chunk cache.
	 */
	hx_remount(h);
	for (int n = 0; n < HNS; n++) {
		hread_all(h, n, 0, KVFS_CHUNK_FROM_SSD, false);
		hread_all(h, n, 0, KVFS_CHUNK_FROM_CACHE, false);
	}
	hx_remount(h);
	for (int n = 0; n < HNS; n++)
		hread_all(h, n, 512, KVFS_CHUNK_FROM_SSD, false);

	/* f32: a hidden piece is 16 rows of 64 floats, 4 KiB, for an 8 KiB
	 * KV piece: the SSD reads half what is delivered.
	 */
	hx_remount(h);
	assert_int_equal(hread(h, HN_F32, one_piece, 1, 0,
			       KVFS_CHUNK_FROM_SSD, false, p, &res),
			 0);
	assert_int_equal(res.bytes_wanted, 8 * KiB);
	assert_int_equal(res.bytes_read, 4 * KiB);
	assert_int_equal(res.ssd_reads, 1);

	/* Scores work on them like on any block. */
	b = hblk(h, HN_MIX, 2);
	assert_int_equal(kvfs_chunk_score(h->c, b, 2, 0.5), 0);
	assert_int_equal(kvfs_chunk_score(h->c, b, 3, 0.5), -EINVAL);
	assert_int_equal(kvfs_chunk_get_score(h->c, b, 2, &iv, &fv, &sv), 0);
	assert_true(iv == 0.5);
	kvfs_cache_put(h->c, b);
	hx_free(h);
}

/* Read block i of @n whole, through the reader: the restoration leaves
 * the KV image as the block's DRAM copy. It must be the expected file.
 */
static void hread_file(struct hx *h, int n, int i)
{
	struct kvfs_block *b = hblk(h, n, i);
	struct kvfs_reader rd;
	const void *ptr;
	size_t got;

	assert_int_equal(kvfs_cache_reader_init(h->c, &rd, b), 0);
	assert_int_equal(kvfs_cache_read_begin(h->c, &rd, 0, h->kvsize[n][i],
					       &ptr, &got),
			 0);
	assert_int_equal(got, h->kvsize[n][i]);
	assert_memory_equal(ptr, h->kv[n][i], got);
	kvfs_cache_read_end(h->c, &rd);
	kvfs_cache_reader_release(h->c, &rd);
}

/* Once a read restored the block into DRAM, its pieces are the KV
 * image's: the full file's bytes exactly, projected layers included, and
 * even where the chunk cache holds a projection of them.
 */
static void test_hidden_kv_image(void **state)
{
	struct hx *h = hx_new(64 * MiB, true);

	(void)state;
	for (int n = 0; n < HNS; n++) {
		hread_all(h, n, 0, KVFS_CHUNK_FROM_SSD, false);
		for (int i = 0; i < NBLK; i++)
			hread_file(h, n, i);
		hread_all(h, n, 0, KVFS_CHUNK_FROM_BLOCK, true);
		hread_all(h, n, 100, KVFS_CHUNK_FROM_BLOCK, true);
	}
	hx_free(h);
}

/* Block i's record: its SSD offset, stored kind and split. */
static struct kvfs_meta_blk hrec(struct hx *h, int n, int i)
{
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_blk rec;

	assert_int_equal(kvfs_store_open(h->dir, KVFS_META_NOSYNC, 0, &s), 0);
	assert_int_equal(kvfs_meta_txn_begin(s->meta, true, &t), 0);
	assert_int_equal(kvfs_meta_blk_get(t, h->key[n][i], &rec), 0);
	kvfs_meta_txn_abort(t);
	kvfs_store_free(s);
	return rec;
}

/*
 * The stored CRC tables cover the stored pieces (hidden rows below the
 * split); a damaged hidden piece on the SSD is refused and leaves its
 * destination alone, the others are served; without a table the whole
 * stored image is read and checked once.
 */
static void test_hidden_crcs(void **state)
{
	struct hx *h = hx_new(0, true);
	static const int t[] = { 1, 0, 0, 1, 1, 2, 1, 3, 1 };
	static const int t1[] = { 0, 1, 3 };
	struct kvfs_chunk_piece p[3];
	struct kvfs_chunk_result res;
	struct kvfs_geom g;
	char path[128];
	uint32_t crc[16], exp[16];
	uint64_t ext;
	int fd;

	(void)state;
	kvfs_cache_free(h->c);
	h->c = NULL;
	snprintf(path, sizeof(path), "%s/data.kvd", h->dir);
	for (int n = 0; n < HNS; n++) {
		struct kvfs_meta_blk rec = hrec(h, n, 1);
		struct kvfs_store *s;
		struct kvfs_meta_txn *tx;
		uint8_t *img = malloc(rec.size);

		g = hns_geom(n);
		assert_non_null(img);
		assert_int_equal(rec.kind, n == HN_MIX ? KVFS_KIND_MIXED
						       : KVFS_KIND_HIDDEN);
		fd = open(path, O_RDONLY);
		assert_true(fd >= 0);
		assert_int_equal(pread(fd, img, rec.size, (off_t)rec.ssd_off),
				 (ssize_t)rec.size);
		close(fd);
		for (uint32_t l = 0; l < 4; l++)
			for (uint32_t c = 0; c < 4; c++) {
				uint64_t off, len;

				assert_int_equal(kvfs_fmt_piece_range(
						 &g, 64, hns_kv_from(n), l, c,
						 &off, &len),
						 0);
				exp[l * 4 + c] = kvfs_fmt_crc32c(0, img + off,
								 len);
			}
		free(img);
		assert_int_equal(kvfs_store_open(h->dir, KVFS_META_NOSYNC, 0,
						 &s),
				 0);
		assert_int_equal(kvfs_meta_txn_begin(s->meta, true, &tx), 0);
		assert_int_equal(kvfs_meta_ccrc_get(tx, h->key[n][1], crc, 16),
				 0);
		kvfs_meta_txn_abort(tx);
		kvfs_store_free(s);
		assert_memory_equal(crc, exp, sizeof(crc));
	}

	/* Damage block 1's layer 1 chunk 2, stored as hidden rows. */
	{
		struct kvfs_meta_blk rec = hrec(h, HN_BF16, 1);
		uint64_t off, len;
		uint8_t byte;

		g = hns_geom(HN_BF16);
		assert_int_equal(kvfs_fmt_piece_range(&g, 64, 4, 1, 2, &off,
						      &len),
				 0);
		fd = open(path, O_RDWR);
		assert_true(fd >= 0);
		off += rec.ssd_off + 77;
		assert_int_equal(pread(fd, &byte, 1, (off_t)off), 1);
		byte ^= 0x10;
		assert_int_equal(pwrite(fd, &byte, 1, (off_t)off), 1);
		assert_int_equal(fsync(fd), 0);
		close(fd);
	}
	hx_open(h);
	assert_int_equal(hread(h, HN_BF16, t, 3, 0, 0, false, p, &res),
			 -EBADMSG);
	assert_int_equal(p[1].err, -EBADMSG);
	assert_int_equal(p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(p[2].from, KVFS_CHUNK_FROM_SSD);
	/* Misaligned destinations: the same. */
	assert_int_equal(hread(h, HN_BF16, t, 3, 64, 0, false, p, &res),
			 -EBADMSG);
	assert_int_equal(p[1].err, -EBADMSG);
	assert_int_equal(p[0].err, 0);

	/* No table: the whole stored image, checked by the block CRC. */
	kvfs_cache_free(h->c);
	h->c = NULL;
	{
		struct kvfs_store *s;
		struct kvfs_meta_txn *tx;

		assert_int_equal(kvfs_store_open(h->dir, KVFS_META_NOSYNC, 0,
						 &s),
				 0);
		assert_int_equal(kvfs_meta_txn_begin(s->meta, false, &tx), 0);
		assert_int_equal(kvfs_meta_ccrc_del(tx, h->key[HN_MIX][0]), 0);
		assert_int_equal(kvfs_meta_ccrc_del(tx, h->key[HN_BF16][1]), 0);
		assert_int_equal(kvfs_meta_txn_commit(tx), 0);
		kvfs_store_free(s);
	}
	ext = (hrec(h, HN_MIX, 0).size + 4095) & ~4095ull;
	hx_open(h);
	assert_int_equal(hread(h, HN_MIX, t1, 1, 0, KVFS_CHUNK_FROM_SSD, false,
			       p, &res),
			 0);
	assert_int_equal(res.bytes_read, ext);
	assert_int_equal(hread(h, HN_MIX, t1, 1, 0, KVFS_CHUNK_FROM_SSD, false,
			       p, &res),
			 0);
	assert_true(res.bytes_read < hcbytes(HN_MIX) * 2);
	/* The damaged block without a table: nothing of it is served. */
	assert_int_equal(hread(h, HN_BF16, t, 3, 0, 0, false, p, &res),
			 -EBADMSG);
	for (int k = 0; k < 3; k++)
		assert_int_equal(p[k].err, -EBADMSG);
	hx_free(h);
}

/* A store with hidden blocks opened without the weights: pieces that
 * need projecting are refused before any I/O; stored K and V still serve.
 */
static void test_hidden_no_weights(void **state)
{
	struct hx *h = hx_new(0, false);
	static const int hid[] = { 0, 3, 0, 0, 0, 1 };
	static const int kv[] = { 0, 2, 0, 1, 3, 3 };
	struct kvfs_chunk_piece p[2];
	struct kvfs_chunk_result res;

	(void)state;
	kvfs_cache_free(h->c);
	h->c = NULL;
	for (int n = 0; n < HNS; n++) {
		h->conf.ns[n].hc.weights[0] = '\0';
		h->conf.ns[n].hc.family = 0;
		h->conf.ns[n].hc.store_as = KVFS_STORE_KV;
		h->conf.ns[n].hc.kv_layers = KVFS_PARAMS_KV_LAYERS_SCHED;
	}
	hx_open(h);
	for (int n = 0; n < HNS; n++) {
		assert_int_equal(hread(h, n, hid, 2, 0, 0, false, p, &res),
				 -EINVAL);
		assert_int_equal(res.ssd_reads, 0);
	}
	assert_int_equal(hread(h, HN_MIX, kv, 2, 0, KVFS_CHUNK_FROM_SSD,
			       false, p, &res),
			 0);
	hx_free(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_copy),
		cmocka_unit_test_setup_teardown(test_random_sets,
						setup_nocache, teardown),
		cmocka_unit_test_setup_teardown(test_duplicates,
						setup_nocache, teardown),
		cmocka_unit_test_setup_teardown(test_coalesce, setup_nocache,
						teardown),
		cmocka_unit_test_setup_teardown(test_read_cb, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_bad_input, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_piece,
						setup_dram, teardown),
		cmocka_unit_test_setup_teardown(test_no_stored_crcs,
						setup_nocache, teardown),
		cmocka_unit_test_setup_teardown(test_two_sets, setup_sets,
						teardown),
		cmocka_unit_test_setup_teardown(test_speculative, setup_spec,
						teardown),
		cmocka_unit_test_setup_teardown(test_join, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_join_failed, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_join_corrupt, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_join_dropped, setup_spec,
						teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup_cancel,
						teardown),
		cmocka_unit_test_setup_teardown(test_cancel_joined,
						setup_cancel, teardown),
		cmocka_unit_test_setup_teardown(test_cancel_nocap,
						setup_cancel, teardown),
		cmocka_unit_test_setup_teardown(test_cancel_stress,
						setup_cancel, teardown),
		cmocka_unit_test_setup_teardown(test_scores_persist,
						setup_dram, teardown),
		cmocka_unit_test_setup_teardown(test_decay, setup_decay,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_decay, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_concurrent, setup_small,
						teardown),
		cmocka_unit_test(test_hidden_pieces),
		cmocka_unit_test(test_hidden_kv_image),
		cmocka_unit_test(test_hidden_crcs),
		cmocka_unit_test(test_hidden_no_weights),
	};
	const char *env = getenv("KVFS_TEST_GPU");

	if (env && !strcmp(env, "cuda"))
		gpu_backend = KVFS_PARAMS_GPU_CUDA;
	/* Refusals log by design; keep the test output readable. */
	kvfs_log_set_level(getenv("KVFS_TEST_LOG") ? KVFS_LOG_DEBUG : -1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
