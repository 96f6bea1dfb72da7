/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration through a live mount (run by test_hcache.sh).
 *
 *   hcache_client setup DIR        write the checkpoints (real safetensors
 *                                  files, good and bad) and DIR/ns.conf
 *   hcache_client write MNT        write HIDDEN blocks (and a few others)
 *   hcache_client check MNT        read every block back and compare each
 *                                  element with a double-precision
 *                                  reference computed here
 *   hcache_client concurrent MNT   one restoration for many readers,
 *                                  FETCH into the pool (restored straight
 *                                  into it: HIDDEN and MIXED blocks, from
 *                                  the SSD and from DRAM, one restoration
 *                                  for many fetchers), PREFETCH (on
 *                                  blocks not read since the mount),
 *                                  reads restored on the GPU when the
 *                                  namespace has a GPU restorer
 *   hcache_client stats MNT        the counters after all of that
 *   hcache_client crash-write MNT  write one more chain to lmix (the test
 *                                  then kills the daemon with -9)
 *   hcache_client crash-check MNT  read it back after the restart
 *   hcache_client fallback MNT     reads when the GPU restoration fails
 *                                  (a cuBLAS whose GEMMs fail): restored
 *                                  on the CPU instead, counted
 *
 * Models (tests/unit/ckpt_ref.c: weights generated from a seeded PRNG,
 * values exact in their dtype): a Llama MHA model with F32 weights, a
 * Llama MHA model with BF16 weights and llama3 RoPE scaling, and a Qwen2
 * GQA model with K/V biases.  Each block's inputs come from a seed of its
 * own; its padding rows hold NaN bytes, which restoration must not read.
 * Namespaces: lf32 (f32 blocks, store_as hidden), lbf16 (bf16, auto with
 * hcache_kv_layers = 0: MHA keeps hidden states), q2 (bf16, auto: GQA
 * stores KV), q2h (bf16, hidden although GQA), lkv (bf16, kv: converted
 * at commit), lmix (f32, auto with hcache_kv_layers = 1: layers 0-1
 * stored as hidden states, layer 2 as K and V, a MIXED block), plain (no
 * weights).
 * Each holds one chain of 4 blocks of 16-token blocks in 4-token chunks:
 * start positions 0, 16, 32, 48, the last block 11 tokens (a partial
 * last chunk).
 *
 * The reference (ckpt_ref.c) knows the exact weights and inputs and
 * computes RMSNorm, both projections (plus biases) and rotate-half RoPE
 * in double; it decodes what is read with its own decoders.  Tolerance
 * on |restored - reference| (ckpt_ref.c's tol()), by the namespace dtype:
 *   f32:  1e-5 * |ref| + 2e-5
 *   bf16: 2^-8 * |ref| + 2e-5   (half an ulp of bf16)
 * The 2e-5 covers the f32 arithmetic of the restoration (sums of at most
 * 64 products of values of order 1).
 *
 * The device pool is shm, or cuda with KVFS_TEST_GPU=cuda (read through
 * its IPC handle, dev_region_i.h); the daemon's device restorer, GPU or
 * CPU, shows in ns.NAME.hcache.device_restore.
 */
#include <errno.h>
#include <fcntl.h>
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
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/kvfs_ctl.h"
#include "hcache/restore.h"
#include "meta/fmt.h"
#include "tests/unit/ckpt_ref_i.h"
#include "dev_region_i.h"

#define NBLK 4
#define BT 16 /* block_tokens */
#define CT 4  /* chunk_tokens */
#define NREADERS 8

static const char *mnt;

/* ------------------------------------------------------ models and specs */

/* A checkpoint file and the model in it (ckpt_ref.c generates both). */
struct mspec {
	const char *file;
	struct spec s;
	uint64_t seed;
};

static const struct mspec models[] = {
	{ "llama_f32.safetensors",
	  { .family = KVFS_FAMILY_LLAMA, .L = 3, .hidden = 64, .kvh = 4,
	    .hd = 16, .wdt = KVFS_DTYPE_F32, .theta = 10000, .eps = 1e-5 },
	  11 },
	/* orig 32 with head_dim 16 puts the wavelengths in all three
	 * llama3 bands.
	 */
	{ "llama_bf16.safetensors",
	  { .family = KVFS_FAMILY_LLAMA, .L = 2, .hidden = 64, .kvh = 4,
	    .hd = 16, .wdt = KVFS_DTYPE_BF16, .rope_type = KVFS_ROPE_LLAMA3,
	    .theta = 500000, .eps = 1e-5, .factor = 8, .lo = 1, .hi = 4,
	    .orig = 32 },
	  12 },
	{ "qwen2.safetensors",
	  { .family = KVFS_FAMILY_QWEN2, .L = 2, .hidden = 64, .kvh = 2,
	    .hd = 8, .wdt = KVFS_DTYPE_BF16, .bias = true, .theta = 1000000,
	    .eps = 1e-6 },
	  13 },
};
#define NMODELS (sizeof(models) / sizeof(models[0]))

struct nspec {
	const char *name;
	int model;             /* -1: no weights */
	uint16_t dtype;
	const char *store_as;  /* NULL: not set */
	const char *stored;    /* what user.kvfs.stored_as must say */
	uint64_t seed;
	int kv_layers;         /* hcache_kv_layers; -1: not set */
	uint32_t kv_from;      /* the stored split: layers below are hidden */
};

static const struct nspec nss[] = {
	{ "lf32", 0, KVFS_DTYPE_F32, "hidden", "hidden", 101, -1, 3 },
	/* The start-up profile of these tiny models is noise: the split is
	 * fixed so that the outcome does not depend on it.
	 */
	{ "lbf16", 1, KVFS_DTYPE_BF16, "auto", "hidden", 102, 0, 2 },
	{ "q2", 2, KVFS_DTYPE_BF16, "auto", "kv", 103, -1, 0 },
	{ "q2h", 2, KVFS_DTYPE_BF16, "hidden", "hidden", 104, -1, 2 },
	{ "lkv", 0, KVFS_DTYPE_BF16, "kv", "kv", 105, -1, 0 },
	{ "lmix", 0, KVFS_DTYPE_F32, "auto", "hidden:0-1,kv:2-2", 106, 1, 2 },
};
/* Another chain in lmix, written just before a kill -9. */
static const struct nspec crash_ns = {
	"lmix", 0, KVFS_DTYPE_F32, "auto", "hidden:0-1,kv:2-2", 107, 1, 2
};
#define NNS (sizeof(nss) / sizeof(nss[0]))
static const uint32_t ntok[NBLK] = { 16, 16, 16, 11 };

static struct kvfs_geom geom_of(const struct mspec *m, uint16_t dtype)
{
	return (struct kvfs_geom){ .n_layers = m->s.L,
				   .n_kv_heads = m->s.kvh,
				   .head_dim = m->s.hd,
				   .hidden_size = m->s.hidden,
				   .block_tokens = BT, .chunk_tokens = CT,
				   .dtype = dtype };
}

/* ---------------------------------------------------------------- blocks */

struct chain {
	const struct nspec *ns;
	struct kvfs_geom g;
	struct refmodel rm;      /* the namespace's weights */
	uint8_t root[16];
	uint8_t key[NBLK][16];
	uint8_t *img[NBLK];      /* the HIDDEN files written */
	uint64_t size[NBLK];
	struct block b[NBLK];    /* their payloads and exact inputs */
};

static void root_of(const char *ns, uint8_t root[16])
{
	char path[4200], v[64];

	snprintf(path, sizeof(path), "%s/%s", mnt, ns);
	assert_int_equal(getxattr(path, "user.kvfs.root", v, 32), 32);
	v[32] = 0;
	assert_int_equal(kvfs_fmt_key_parse(v, root), 0);
}

/* The chain of namespace @ns, as written (deterministic: each block's
 * inputs come from its own seed).
 */
static void chain_make(struct chain *c, const struct nspec *ns)
{
	const struct mspec *s = &models[ns->model];
	uint8_t parent[16];

	memset(c, 0, sizeof(*c));
	c->ns = ns;
	c->g = geom_of(s, ns->dtype);
	make_model(&c->rm, &s->s, s->seed);
	root_of(ns->name, c->root);
	memcpy(parent, c->root, 16);
	for (int i = 0; i < NBLK; i++) {
		uint32_t n = ntok[i], tok[BT];
		struct block *b = &c->b[i];

		c->size[i] = kvfs_fmt_file_size(&c->g, KVFS_KIND_HIDDEN, n);
		c->img[i] = malloc(c->size[i]);
		assert_non_null(c->img[i]);
		ckpt_seed(ns->seed * 1000 + (uint64_t)i);
		make_block(b, &c->rm, ns->dtype, n, CT, (uint64_t)i * BT);
		assert_int_equal(b->hidden_len,
				 c->size[i] - kvfs_fmt_payload_off(n));
		for (uint32_t t = 0; t < n; t++)
			tok[t] = (uint32_t)(ns->seed * 10000 + i * 100 + t);
		assert_int_equal(kvfs_fmt_build(&c->g, KVFS_KIND_HIDDEN, parent,
						b->pos, tok, n, b->hidden,
						c->img[i], c->size[i]),
				 0);
		memcpy(c->key[i], c->img[i] + 64, 16);
		memcpy(parent, c->key[i], 16);
	}
}

static void chain_free(struct chain *c)
{
	for (int i = 0; i < NBLK; i++) {
		free(c->img[i]);
		free_block(&c->b[i]);
	}
	free_model(&c->rm);
}

static void block_path(char *path, size_t len, const char *ns,
		       const uint8_t key[16])
{
	char hex[33];

	kvfs_fmt_key_hex(key, hex);
	snprintf(path, len, "%s/%s/%s.kv", mnt, ns, hex);
}

/* Write @len bytes as a new block; returns 0 or the errno of fsync. */
static int put_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644), rc = 0;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	if (fsync(fd))
		rc = errno;
	if (close(fd) && !rc)
		rc = errno;
	return rc;
}

static uint8_t *get_file(const char *path, size_t *len)
{
	struct stat st;
	uint8_t *buf;
	size_t got = 0;
	int fd = open(path, O_RDONLY);

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	buf = malloc((size_t)st.st_size + 1);
	assert_non_null(buf);
	for (;;) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size + 1 - got);

		assert_true(n >= 0);
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return buf;
}

/* A KV-kind block (random payload) at the root of @ns: kept as KV even
 * in a namespace that stores hidden states.
 */
static uint8_t *kv_block(const struct nspec *ns, uint8_t key[16],
			 uint64_t *size)
{
	struct kvfs_geom g = geom_of(&models[ns->model], ns->dtype);
	uint8_t root[16], *img, *pay;
	uint32_t tok[BT];
	uint64_t po = kvfs_fmt_payload_off(BT);

	root_of(ns->name, root);
	*size = kvfs_fmt_file_size(&g, KVFS_KIND_KV, BT);
	img = malloc(*size);
	pay = malloc(*size - po);
	assert_true(img && pay);
	for (uint32_t t = 0; t < BT; t++)
		tok[t] = 900000 + t;
	for (uint64_t i = 0; i < *size - po; i++)
		pay[i] = (uint8_t)(i * 13 + 5);
	if (ns->dtype == KVFS_DTYPE_F32)
		for (uint64_t i = 0; i + 4 <= *size - po; i += 4)
			pay[i + 3] = 0x3f; /* keep every f32 finite */
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, root, 0, tok, BT, pay,
					img, *size),
			 0);
	free(pay);
	memcpy(key, img + 64, 16);
	return img;
}

/* ----------------------------------------------------------------- stats */

/* The value of stats line @key into @out (@len bytes); fails the test
 * when there is none.
 */
static void stat_str(const char *key, char *out, size_t len)
{
	char path[4200], *buf = malloc(1 << 20), *p;
	size_t got = 0, kl = strlen(key);
	bool found = false;
	int fd;

	assert_non_null(buf);
	snprintf(path, sizeof(path), "%s/.kvfs/stats", mnt);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	for (;;) {
		ssize_t n = read(fd, buf + got, (1 << 20) - 1 - got);

		assert_true(n >= 0);
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	buf[got] = 0;
	for (p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, key, kl) && p[kl] == ' ') {
			int vl = (int)strcspn(p + kl + 1, "\n");

			snprintf(out, len, "%.*s", vl, p + kl + 1);
			found = true;
			break;
		}
	free(buf);
	if (!found)
		fail_msg("stats lack %s", key);
}

static uint64_t stat_u64(const char *key)
{
	char v[64];

	stat_str(key, v, sizeof(v));
	return strtoull(v, NULL, 10);
}

/* ------------------------------------------------------------ write mode */

static void test_write_hidden(void **state)
{
	uint64_t conv = stat_u64("restore.commit_conversions");
	uint64_t splits = stat_u64("restore.commit_splits");
	char path[4200];

	for (size_t n = 0; n < NNS; n++) {
		struct chain c;

		chain_make(&c, &nss[n]);
		for (int i = 0; i < NBLK; i++) {
			block_path(path, sizeof(path), nss[n].name, c.key[i]);
			if (put_file(path, c.img[i], c.size[i]))
				fail_msg("%s block %d: %s", nss[n].name, i,
					 strerror(errno));
		}
		chain_free(&c);
	}
	/* q2 (auto, GQA) and lkv (kv) restored their blocks at commit */
	assert_int_equal(stat_u64("restore.commit_conversions"), conv + 8);
	/* lmix restored layer 2 of its blocks at commit */
	assert_int_equal(stat_u64("restore.commit_splits"), splits + 4);
	assert_int_equal(stat_u64("ns.lmix.hcache.split"), 4);
	assert_int_equal(stat_u64("ns.lmix.hcache.kv_from"), 2);
	/* lf32, lbf16, q2h hidden; lmix mixed */
	assert_int_equal(stat_u64("cache.hidden_blocks"), 16);
	assert_int_equal(stat_u64("cache.mixed_blocks"), 4);
}

/* kvfs cannot invert the projection: KV stays KV. */
static void test_write_kv_into_hidden_ns(void **state)
{
	char path[4200], v[16] = { 0 };
	uint8_t key[16], *img;
	uint64_t size;

	img = kv_block(&nss[0], key, &size);
	block_path(path, sizeof(path), nss[0].name, key);
	assert_int_equal(put_file(path, img, size), 0);
	assert_int_equal(getxattr(path, "user.kvfs.stored_as", v, sizeof(v)),
			 2);
	assert_string_equal(v, "kv");
	free(img);
}

/* A namespace without weights cannot serve hidden states: refused. */
static void test_hidden_refused_without_weights(void **state)
{
	struct nspec plain = nss[0];
	struct chain c;
	char path[4200];

	plain.name = "plain";
	chain_make(&c, &plain);
	block_path(path, sizeof(path), "plain", c.key[0]);
	assert_int_equal(put_file(path, c.img[0], c.size[0]), EINVAL);
	assert_int_equal(access(path, F_OK), -1);
	chain_free(&c);
}

/* A HIDDEN block whose rows are not the namespace's hidden_size. */
static void test_hidden_wrong_geometry(void **state)
{
	struct kvfs_geom g = geom_of(&models[0], KVFS_DTYPE_F32);
	uint8_t root[16], *img;
	uint32_t tok[BT];
	char path[4200];
	uint64_t size;

	g.hidden_size = 32;
	root_of("lf32", root);
	for (uint32_t t = 0; t < BT; t++)
		tok[t] = 777000 + t;
	size = kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN, BT);
	img = calloc(1, size);
	assert_non_null(img);
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_HIDDEN, root, 0, tok, BT,
					NULL, img, size),
			 0);
	block_path(path, sizeof(path), "lf32", img + 64);
	assert_int_equal(put_file(path, img, size), EINVAL);
	free(img);
}

/* ------------------------------------------------------------ check mode */

/* Every element of every layer of @kv (a KV file of @c's block @i)
 * against the reference.
 */
static void check_values(const struct chain *c, int i, const uint8_t *kv)
{
	const struct block *b = &c->b[i];
	uint16_t dt = c->ns->dtype;
	size_t lbytes = (size_t)b->rows * 2 * c->rm.kvd * esize(dt);
	const uint8_t *pay = kv + kvfs_fmt_payload_off(b->n);
	double worst = 0;

	for (uint32_t l = 0; l < c->rm.s.L; l++) {
		double w = check_layer(&c->rm, b, l, pay + l * lbytes, dt);

		worst = fmax(worst, w);
	}
	print_message("    %s block %d: worst error %.3f of the tolerance\n",
		      c->ns->name, i, worst);
}

/* @img must be the KV-kind file of @c's block @i. */
static void check_image(const struct chain *c, int i, const uint8_t *img,
			size_t len)
{
	struct kvfs_fmt_hdr h;

	assert_int_equal(len, kvfs_fmt_file_size(&c->g, KVFS_KIND_KV,
						 ntok[i]));
	/* Both CRCs, the key (the name), the parent chain, start_pos. */
	assert_int_equal(kvfs_fmt_validate(img, len, &c->g, c->key[i], c->root,
					   0, &h),
			 KVFS_FMT_OK);
	assert_int_equal(h.kind, KVFS_KIND_KV);
	assert_int_equal(h.n_tokens, ntok[i]);
	assert_int_equal(h.start_pos, (uint64_t)i * BT);
	assert_memory_equal(h.parent, i ? c->key[i - 1] : c->root, 16);
	/* same token ids as written */
	assert_memory_equal(img + KVFS_FMT_HDR_SIZE,
			    c->img[i] + KVFS_FMT_HDR_SIZE, 4 * ntok[i]);
	check_values(c, i, img);
}

/* The bytes a block of @c's namespace with @n tokens is stored in. */
static uint64_t stored_size(const struct chain *c, uint32_t n)
{
	return kvfs_fmt_split_file_size(&c->g, n, c->ns->kv_from);
}

static void check_ns(const struct nspec *ns)
{
	char path[4200], v[64];
	struct chain c;
	struct stat st;

	chain_make(&c, ns);
	for (int i = 0; i < NBLK; i++) {
		size_t len;
		uint8_t *img;
		void *map;
		int fd;

		block_path(path, sizeof(path), ns->name, c.key[i]);
		assert_int_equal(stat(path, &st), 0);
		/* stat reports the KV file readers get */
		assert_int_equal(st.st_size,
				 kvfs_fmt_file_size(&c.g, KVFS_KIND_KV,
						    ntok[i]));
		memset(v, 0, sizeof(v));
		assert_true(getxattr(path, "user.kvfs.stored_as", v,
				     sizeof(v) - 1) > 0);
		assert_string_equal(v, ns->stored);
		memset(v, 0, sizeof(v));
		assert_true(getxattr(path, "user.kvfs.stored_bytes", v,
				     sizeof(v) - 1) > 0);
		assert_int_equal(strtoull(v, NULL, 10),
				 stored_size(&c, ntok[i]));
		img = get_file(path, &len);
		check_image(&c, i, img, len);
		/* mmap serves the same bytes */
		fd = open(path, O_RDONLY);
		assert_true(fd >= 0);
		map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		assert_true(map != MAP_FAILED);
		assert_memory_equal(map, img, len);
		munmap(map, len);
		close(fd);
		free(img);
	}
	chain_free(&c);
}

static void test_check_lf32(void **state) { check_ns(&nss[0]); }
static void test_check_lbf16(void **state) { check_ns(&nss[1]); }
static void test_check_q2(void **state) { check_ns(&nss[2]); }
static void test_check_q2h(void **state) { check_ns(&nss[3]); }
static void test_check_lkv(void **state) { check_ns(&nss[4]); }
static void test_check_lmix(void **state) { check_ns(&nss[5]); }

/* A MIXED block is smaller than its KV file, larger than its HIDDEN
 * one, and its split is the one configured.
 */
static void test_mixed_sizes(void **state)
{
	struct kvfs_geom g = geom_of(&models[0], KVFS_DTYPE_F32);
	uint64_t m = kvfs_fmt_split_file_size(&g, ntok[3], 2);

	assert_true(m > kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN, ntok[3]));
	assert_true(m < kvfs_fmt_file_size(&g, KVFS_KIND_KV, ntok[3]));
	assert_int_equal(models[0].s.L - (uint32_t)nss[5].kv_layers,
			 nss[5].kv_from);
}

static void test_check_kv_block(void **state)
{
	uint8_t key[16], *img, *got;
	char path[4200], v[16] = { 0 };
	uint64_t size;
	size_t len;

	img = kv_block(&nss[0], key, &size);
	block_path(path, sizeof(path), nss[0].name, key);
	got = get_file(path, &len);
	assert_int_equal(len, size);
	assert_memory_equal(got, img, size);
	assert_int_equal(getxattr(path, "user.kvfs.stored_as", v, sizeof(v)),
			 2);
	assert_string_equal(v, "kv");
	free(got);
	free(img);
}

/* ------------------------------------------------------- concurrent mode */

struct rdr {
	pthread_t t;
	pthread_barrier_t *bar;
	const char *path;
	uint8_t *img;
	size_t len;
};

static void *reader(void *arg)
{
	struct rdr *r = arg;
	struct stat st;
	size_t got = 0;
	int fd;

	pthread_barrier_wait(r->bar);
	fd = open(r->path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st))
		return NULL;
	r->img = malloc((size_t)st.st_size);
	while (r->img && got < (size_t)st.st_size) {
		ssize_t n = read(fd, r->img + got, (size_t)st.st_size - got);

		if (n <= 0)
			break;
		got += (size_t)n;
	}
	r->len = got;
	close(fd);
	return NULL;
}

/* Many readers of one SSD-only hidden block: one restoration, the same
 * correct bytes for all.
 */
static void test_one_restoration(void **state)
{
	struct rdr r[NREADERS];
	pthread_barrier_t bar;
	char path[4200];
	struct chain c;
	uint64_t before, waits;

	chain_make(&c, &nss[0]);
	block_path(path, sizeof(path), nss[0].name, c.key[2]);
	before = stat_u64("restore.blocks");
	waits = stat_u64("restore.waits");
	pthread_barrier_init(&bar, NULL, NREADERS);
	for (int i = 0; i < NREADERS; i++) {
		r[i] = (struct rdr){ .bar = &bar, .path = path };
		assert_int_equal(pthread_create(&r[i].t, NULL, reader, &r[i]),
				 0);
	}
	for (int i = 0; i < NREADERS; i++)
		pthread_join(r[i].t, NULL);
	pthread_barrier_destroy(&bar);
	assert_int_equal(stat_u64("restore.blocks"), before + 1);
	assert_true(stat_u64("restore.waits") > waits);
	assert_non_null(r[0].img);
	check_image(&c, 2, r[0].img, r[0].len);
	for (int i = 0; i < NREADERS; i++) {
		assert_non_null(r[i].img);
		assert_int_equal(r[i].len, r[0].len);
		assert_memory_equal(r[i].img, r[0].img, r[0].len);
	}
	for (int i = 0; i < NREADERS; i++)
		free(r[i].img);
	chain_free(&c);
}

static int ctl_call(int op, const char *ns, const uint8_t key[16],
		    uint32_t tier, struct kvfs_ctl_msg *m)
{
	char path[4200];
	int fd, rc;

	memset(m, 0, sizeof(*m));
	m->req.magic = KVFS_CTL_MAGIC;
	m->req.abi = KVFS_CTL_ABI;
	m->req.op = (uint16_t)op;
	snprintf(m->req.ns, sizeof(m->req.ns), "%s", ns);
	m->req.n_keys = key ? 1 : 0;
	m->req.tier = tier;
	m->req.size = (uint32_t)(sizeof(m->req) + (key ? 16 : 0));
	if (key)
		memcpy(m->bytes + sizeof(m->req), key, 16);
	snprintf(path, sizeof(path), "%s/.kvfs/ctl", mnt);
	fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ioctl(fd, KVFS_IOC(op), m), 0);
	rc = m->resp.error;
	close(fd); /* gives back any lease the request took */
	return rc;
}

/* The counters a restoration straight into the device pool moves. */
struct devstat {
	uint64_t blocks, to_dev, to_gpu, fallbacks;
};

static void devstat_get(struct devstat *d)
{
	d->blocks = stat_u64("restore.blocks");
	d->to_dev = stat_u64("restore.to_device");
	d->to_gpu = stat_u64("restore.to_device_gpu");
	d->fallbacks = stat_u64("restore.to_device_fallbacks");
}

/* Whether @ns restores on the GPU (else on the CPU, into the pool). */
static bool ns_on_gpu(const char *ns)
{
	char key[128], v[16];

	snprintf(key, sizeof(key), "ns.%s.hcache.device_restore", ns);
	stat_str(key, v, sizeof(v));
	if (strcmp(v, "gpu"))
		assert_string_equal(v, "cpu");
	return !strcmp(v, "gpu");
}

/* Since @d: @n more restorations, every one straight into the pool. */
static void devstat_moved(const struct devstat *d, uint64_t n, bool gpu)
{
	struct devstat now;

	devstat_get(&now);
	assert_int_equal(now.blocks, d->blocks + n);
	assert_int_equal(now.to_dev, d->to_dev + n);
	assert_int_equal(now.to_gpu, d->to_gpu + (gpu ? n : 0));
	assert_int_equal(now.fallbacks, d->fallbacks);
}

/*
 * The block FETCH put in the pool for @c's block @i (response @m), read
 * through the pool's own handle: its payload matches the reference; on
 * the CPU path the whole image is the KV file (both CRCs), and it equals
 * what a read returns.  On the GPU the header's payload CRC is filled in
 * only when the image leaves the pool, and the GPU may round the last
 * place differently from the CPU, so only the payload is checked.
 */
static void check_pool_at(const struct chain *c, int i,
			  const struct kvfs_ctl_msg *m, uint32_t at, bool gpu)
{
	const struct kvfs_ctl_block *blk =
		(const struct kvfs_ctl_block *)(m->bytes + sizeof(m->resp)) +
		at;
	uint64_t po = kvfs_fmt_payload_off(ntok[i]);
	uint64_t size = kvfs_fmt_file_size(&c->g, KVFS_KIND_KV, ntok[i]);
	char path[4200];
	uint8_t *img, *rd;
	size_t len;

	assert_true(at < m->resp.n_blocks);
	assert_int_equal(blk->len, size - po);
	assert_true(blk->pool_off >= po);
	img = calloc(1, size);
	assert_non_null(img);
	if (gpu) {
		pool_get(&m->resp.pool, blk->pool_off, img + po, blk->len);
		check_values(c, i, img);
	} else {
		/* the pool holds the whole image just before the payload */
		pool_get(&m->resp.pool, blk->pool_off - po, img, size);
		check_image(c, i, img, size);
		block_path(path, sizeof(path), c->ns->name, c->key[i]);
		rd = get_file(path, &len);
		assert_int_equal(len, size);
		assert_memory_equal(rd, img, size);
		free(rd);
	}
	free(img);
}

/* The same for the one block of response @m. */
static void check_pool_block(const struct chain *c, int i,
			     const struct kvfs_ctl_msg *m, bool gpu)
{
	assert_int_equal(m->resp.n_blocks, 1);
	check_pool_at(c, i, m, 0, gpu);
}

/* The counters a restoration for a read moves. */
struct rdstat {
	uint64_t blocks, gpu, fallbacks, pipelined;
};

static void rdstat_get(struct rdstat *r)
{
	r->blocks = stat_u64("restore.blocks");
	r->pipelined = stat_u64("restore.pipelined");
	r->gpu = stat_u64("restore.gpu_blocks");
	r->fallbacks = stat_u64("restore.gpu_fallbacks");
}

/*
 * Blocks 0 and 1 of a chain of @base nobody wrote yet (its seed moved by
 * @seed_off), written, block 1 then dropped from DRAM, and each read
 * once: block 0 with its stored image in DRAM, block 1 from the SSD
 * (streamed layer by layer: the lru policy of these mounts promotes
 * nothing back into DRAM).
 * Each read restores once and matches the reference.  @gpu: the
 * namespace has a GPU restorer, so each restoration runs there
 * (restore.gpu_blocks), or, with @fail (its cuBLAS fails every GEMM),
 * falls back to the CPU (restore.gpu_fallbacks).  Without a GPU restorer
 * neither moves.
 */
static void read_two(const struct nspec *base, uint64_t seed_off, bool gpu,
		     bool fail)
{
	struct nspec alt = *base;
	struct kvfs_ctl_msg m;
	struct rdstat r, now;
	struct chain c;
	char path[2][4200];
	uint8_t *img;
	size_t len;

	alt.seed += seed_off;
	chain_make(&c, &alt);
	for (int i = 0; i < 2; i++) {
		block_path(path[i], sizeof(path[i]), alt.name, c.key[i]);
		assert_int_equal(put_file(path[i], c.img[i], c.size[i]), 0);
	}
	assert_int_equal(ctl_call(KVFS_CTL_EVICT, alt.name, c.key[1],
				  1 /* dram */, &m),
			 0);
	for (int i = 0; i < 2; i++) {
		rdstat_get(&r);
		img = get_file(path[i], &len);
		check_image(&c, i, img, len);
		free(img);
		rdstat_get(&now);
		assert_int_equal(now.blocks, r.blocks + 1);
		assert_int_equal(now.pipelined, r.pipelined + (uint64_t)i);
		assert_int_equal(now.gpu, r.gpu + (gpu && !fail ? 1 : 0));
		assert_int_equal(now.fallbacks,
				 r.fallbacks + (gpu && fail ? 1 : 0));
	}
	/* gone again, so that the stats mode counts the four-block chains */
	for (int i = 1; i >= 0; i--)
		assert_int_equal(unlink(path[i]), 0);
	chain_free(&c);
}

/* Reads of HIDDEN (f32 and bf16) and MIXED blocks restore on the GPU
 * when the namespace has a GPU restorer, from DRAM and from the SSD.
 */
static void test_read_on_gpu(void **state)
{
	read_two(&nss[0], 900, ns_on_gpu(nss[0].name), false);
	read_two(&nss[1], 900, ns_on_gpu(nss[1].name), false);
	read_two(&nss[5], 900, ns_on_gpu(nss[5].name), false);
}

/* FETCH of an SSD-only hidden block (q2h, HIDDEN): restored straight into
 * the pool, once, with no KV image in DRAM; a second FETCH finds it
 * there.  Evicted from the pool, its image goes down to DRAM complete
 * (on the GPU path its CRCs are filled in then), and a read is served
 * from that copy without restoring again.
 */
static void test_fetch(void **state)
{
	const struct kvfs_ctl_block *blk;
	struct kvfs_ctl_msg m;
	struct devstat d;
	struct chain c;
	bool gpu = ns_on_gpu(nss[3].name);
	uint64_t po = kvfs_fmt_payload_off(ntok[3]), blocks;
	char path[4200];
	uint8_t *img, *pay;
	size_t len;

	chain_make(&c, &nss[3]);
	devstat_get(&d);
	assert_int_equal(ctl_call(KVFS_CTL_FETCH, nss[3].name, c.key[3], 0,
				  &m),
			 0);
	devstat_moved(&d, 1, gpu);
	assert_int_equal(ctl_call(KVFS_CTL_FETCH, nss[3].name, c.key[3], 0,
				  &m),
			 0);
	devstat_moved(&d, 1, gpu);
	blk = (const void *)(m.bytes + sizeof(m.resp));
	assert_int_equal(m.resp.n_blocks, 1);
	assert_int_equal(blk->len,
			 kvfs_fmt_file_size(&c.g, KVFS_KIND_KV, ntok[3]) - po);
	pay = calloc(1, po + blk->len);
	assert_non_null(pay);
	pool_get(&m.resp.pool, blk->pool_off, pay + po, blk->len);
	check_values(&c, 3, pay);

	assert_int_equal(ctl_call(KVFS_CTL_EVICT, nss[3].name, c.key[3],
				  0 /* gpu */, &m),
			 0);
	blocks = stat_u64("restore.blocks");
	block_path(path, sizeof(path), nss[3].name, c.key[3]);
	img = get_file(path, &len);
	check_image(&c, 3, img, len);
	assert_memory_equal(img + po, pay + po, len - po);
	assert_int_equal(stat_u64("restore.blocks"), blocks);
	free(img);
	free(pay);
	chain_free(&c);
}

/* A read of a hidden block whose KV image is in the device pool (a FETCH
 * restored it there) copies that image down instead of rebuilding it.
 */
static void test_read_after_fetch(void **state)
{
	struct nspec alt = nss[3];
	struct kvfs_ctl_msg m;
	struct chain c;
	char path[4200];
	uint64_t blocks, down;
	uint8_t *img;
	size_t len;

	alt.seed += 700; /* a prefix nobody wrote yet */
	chain_make(&c, &alt);
	block_path(path, sizeof(path), alt.name, c.key[0]);
	assert_int_equal(put_file(path, c.img[0], c.size[0]), 0);
	assert_int_equal(ctl_call(KVFS_CTL_FETCH, alt.name, c.key[0], 0, &m),
			 0);
	blocks = stat_u64("restore.blocks");
	down = stat_u64("restore.from_pool");
	img = get_file(path, &len);
	check_image(&c, 0, img, len);
	assert_int_equal(stat_u64("restore.from_pool"), down + 1);
	assert_int_equal(stat_u64("restore.blocks"), blocks);
	free(img);
	/* now a KV image in DRAM: served from there, nothing more */
	img = get_file(path, &len);
	check_image(&c, 0, img, len);
	assert_int_equal(stat_u64("restore.from_pool"), down + 1);
	assert_int_equal(stat_u64("restore.blocks"), blocks);
	free(img);
	/* gone again, so that the stats mode counts the four-block chains */
	assert_int_equal(unlink(path), 0);
	chain_free(&c);
}

/*
 * FETCH of a whole chain of @base nobody wrote yet (its seed moved by
 * @seed_off), two of its blocks in DRAM and two only on the SSD, the
 * last one partial: one request, each block in the pool with the right
 * values at the place the response gives.  Every block is restored
 * straight into the pool (on the GPU, in one batch through the
 * restorer), or with @fail (the namespace's cuBLAS fails every GEMM) the
 * batch fails, and each of its blocks falls back to the path through
 * DRAM (restore.to_device_fallbacks), restored there on the CPU.
 */
static void fetch_chain(const struct nspec *base, uint64_t seed_off,
			bool fail)
{
	struct nspec alt = *base;
	struct kvfs_ctl_msg m;
	struct devstat d, now;
	struct chain c;
	bool gpu = ns_on_gpu(alt.name);
	char path[NBLK][4200], ctl[4200];
	int fd;

	alt.seed += seed_off;
	chain_make(&c, &alt);
	for (int i = 0; i < NBLK; i++) {
		block_path(path[i], sizeof(path[i]), alt.name, c.key[i]);
		assert_int_equal(put_file(path[i], c.img[i], c.size[i]), 0);
	}
	for (int i = 1; i < NBLK; i += 2)
		assert_int_equal(ctl_call(KVFS_CTL_EVICT, alt.name, c.key[i],
					  1 /* dram */, &m),
				 0);
	devstat_get(&d);
	memset(&m, 0, sizeof(m));
	m.req.magic = KVFS_CTL_MAGIC;
	m.req.abi = KVFS_CTL_ABI;
	m.req.op = KVFS_CTL_FETCH;
	snprintf(m.req.ns, sizeof(m.req.ns), "%s", alt.name);
	m.req.n_keys = NBLK;
	m.req.size = (uint32_t)(sizeof(m.req) + 16 * NBLK);
	for (int i = 0; i < NBLK; i++)
		memcpy(m.bytes + sizeof(m.req) + 16 * i, c.key[i], 16);
	snprintf(ctl, sizeof(ctl), "%s/.kvfs/ctl", mnt);
	fd = open(ctl, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ioctl(fd, KVFS_IOC(KVFS_CTL_FETCH), &m), 0);
	assert_int_equal(m.resp.error, 0);
	assert_int_equal(m.resp.n_blocks, NBLK);
	if (!fail) {
		devstat_moved(&d, NBLK, gpu);
	} else {
		devstat_get(&now);
		assert_int_equal(now.blocks, d.blocks + NBLK);
		assert_int_equal(now.to_dev, d.to_dev);
		assert_int_equal(now.to_gpu, d.to_gpu);
		assert_int_equal(now.fallbacks, d.fallbacks + NBLK);
	}
	/* through DRAM the pool holds the whole image, CRCs included */
	for (int i = 0; i < NBLK; i++)
		check_pool_at(&c, i, &m, (uint32_t)i, gpu && !fail);
	close(fd);
	/* gone again, so that the stats mode counts the four-block chains */
	for (int i = NBLK - 1; i >= 0; i--)
		assert_int_equal(unlink(path[i]), 0);
	chain_free(&c);
}

/* A chain of lf32 (HIDDEN, f32) in one FETCH. */
static void test_fetch_chain(void **state)
{
	fetch_chain(&nss[0], 800, false);
}

struct fetcher {
	pthread_t t;
	pthread_barrier_t *bar;
	const char *ns;
	const uint8_t *key;
	struct kvfs_ctl_msg m;
	int rc;
};

static void *fetcher_main(void *arg)
{
	struct fetcher *f = arg;
	char path[4200];
	int fd;

	memset(&f->m, 0, sizeof(f->m));
	f->m.req.magic = KVFS_CTL_MAGIC;
	f->m.req.abi = KVFS_CTL_ABI;
	f->m.req.op = KVFS_CTL_FETCH;
	snprintf(f->m.req.ns, sizeof(f->m.req.ns), "%s", f->ns);
	f->m.req.n_keys = 1;
	f->m.req.size = (uint32_t)(sizeof(f->m.req) + 16);
	memcpy(f->m.bytes + sizeof(f->m.req), f->key, 16);
	snprintf(path, sizeof(path), "%s/.kvfs/ctl", mnt);
	pthread_barrier_wait(f->bar);
	f->rc = -1;
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (ioctl(fd, KVFS_IOC(KVFS_CTL_FETCH), &f->m) == 0)
		f->rc = f->m.resp.error;
	close(fd);
	return NULL;
}

/* FETCH of MIXED blocks (lmix: layers 0-1 hidden states, 2 K and V):
 * from the SSD by many fetchers at once (one restoration, the same pool
 * copy for all), and of a block just written, whose stored image is in
 * DRAM.
 */
static void test_fetch_mixed(void **state)
{
	struct fetcher f[NREADERS];
	pthread_barrier_t bar;
	struct kvfs_ctl_msg m;
	struct nspec alt = nss[5];
	struct devstat d;
	struct chain c, a;
	char path[4200];
	bool gpu = ns_on_gpu(nss[5].name);

	chain_make(&c, &nss[5]);
	devstat_get(&d);
	pthread_barrier_init(&bar, NULL, NREADERS);
	for (int i = 0; i < NREADERS; i++) {
		f[i].bar = &bar;
		f[i].ns = nss[5].name;
		f[i].key = c.key[1];
		assert_int_equal(pthread_create(&f[i].t, NULL, fetcher_main,
						&f[i]),
				 0);
	}
	for (int i = 0; i < NREADERS; i++)
		pthread_join(f[i].t, NULL);
	pthread_barrier_destroy(&bar);
	devstat_moved(&d, 1, gpu);
	for (int i = 0; i < NREADERS; i++) {
		const struct kvfs_ctl_block *b0 = (const void *)(
			f[0].m.bytes + sizeof(f[0].m.resp));
		const struct kvfs_ctl_block *bi = (const void *)(
			f[i].m.bytes + sizeof(f[i].m.resp));

		assert_int_equal(f[i].rc, 0);
		assert_int_equal(bi->pool_off, b0->pool_off);
		assert_int_equal(bi->len, b0->len);
	}
	check_pool_block(&c, 1, &f[0].m, gpu);

	/* Just written: the stored (MIXED) image is in DRAM. */
	alt.seed += 700;
	chain_make(&a, &alt);
	block_path(path, sizeof(path), alt.name, a.key[0]);
	assert_int_equal(put_file(path, a.img[0], a.size[0]), 0);
	devstat_get(&d);
	assert_int_equal(ctl_call(KVFS_CTL_FETCH, alt.name, a.key[0], 0, &m),
			 0);
	devstat_moved(&d, 1, gpu);
	check_pool_block(&a, 0, &m, gpu);
	/* gone again, so that the stats mode counts the four-block chains */
	assert_int_equal(unlink(path), 0);
	chain_free(&a);
	chain_free(&c);
}

/* A PREFETCH and a read of the same block: still one restoration, and
 * whichever gets there first does it.
 */
static void test_prefetch_then_read(void **state)
{
	struct kvfs_ctl_msg m;
	char path[4200];
	struct chain c;
	uint64_t before;
	uint8_t *img;
	size_t len;

	chain_make(&c, &nss[1]);
	before = stat_u64("restore.blocks");
	assert_int_equal(ctl_call(KVFS_CTL_PREFETCH, nss[1].name, c.key[1], 1,
				  &m),
			 0);
	block_path(path, sizeof(path), nss[1].name, c.key[1]);
	img = get_file(path, &len);
	check_image(&c, 1, img, len);
	assert_int_equal(stat_u64("restore.blocks"), before + 1);
	free(img);
	chain_free(&c);
}

/* A PREFETCH to DRAM of a block whose hidden states are already in DRAM
 * (just written) loads nothing, but restores it ahead: submitted before
 * the call returns.  The read then joins or finds that restoration, and a
 * second PREFETCH finds the KV image and submits nothing.
 */
static void test_prefetch_in_dram(void **state)
{
	struct nspec alt = nss[1];
	struct kvfs_ctl_msg m;
	char path[4200];
	struct chain c;
	uint64_t before, ahead;
	uint8_t *img;
	size_t len;

	alt.seed += 500; /* a prefix nobody wrote yet */
	chain_make(&c, &alt);
	block_path(path, sizeof(path), alt.name, c.key[0]);
	assert_int_equal(put_file(path, c.img[0], c.size[0]), 0);
	before = stat_u64("restore.blocks");
	ahead = stat_u64("restore.ahead");
	assert_int_equal(ctl_call(KVFS_CTL_PREFETCH, alt.name, c.key[0], 1,
				  &m),
			 0);
	assert_int_equal(stat_u64("restore.ahead"), ahead + 1);
	img = get_file(path, &len);
	check_image(&c, 0, img, len);
	assert_int_equal(stat_u64("restore.blocks"), before + 1);
	assert_int_equal(ctl_call(KVFS_CTL_PREFETCH, alt.name, c.key[0], 1,
				  &m),
			 0);
	assert_int_equal(stat_u64("restore.ahead"), ahead + 1);
	/* gone again, so that the stats mode counts the four-block chains */
	assert_int_equal(unlink(path), 0);
	free(img);
	chain_free(&c);
}

/* ------------------------------------------------------------ crash mode */

static void test_crash_write(void **state)
{
	uint64_t splits = stat_u64("restore.commit_splits");
	char path[4200];
	struct chain c;

	chain_make(&c, &crash_ns);
	for (int i = 0; i < NBLK; i++) {
		block_path(path, sizeof(path), crash_ns.name, c.key[i]);
		/* fsync: durable before the kill */
		assert_int_equal(put_file(path, c.img[i], c.size[i]), 0);
	}
	assert_int_equal(stat_u64("restore.commit_splits"), splits + NBLK);
	chain_free(&c);
}

static void test_crash_check(void **state)
{
	check_ns(&crash_ns);
	/* read from the SSD: the streamed restore served them */
	assert_true(stat_u64("restore.pipelined") >= NBLK);
	assert_int_equal(stat_u64("restore.errors"), 0);
	assert_int_equal(stat_u64("cache.mixed_blocks"), 8);
}

/* ------------------------------------------------------------ stats mode */

static void test_stats(void **state)
{
	uint64_t stored = 0, kv = 0;

	/* lf32, lbf16, q2h keep their 4 blocks as hidden states, lmix its
	 * 4 as MIXED
	 */
	assert_int_equal(stat_u64("cache.hidden_blocks"), 16);
	assert_int_equal(stat_u64("cache.mixed_blocks"), 4);
	assert_int_equal(stat_u64("ns.lmix.hcache.mixed_blocks"), 4);
	assert_int_equal(stat_u64("ns.lmix.hcache.hidden_blocks"), 4);
	assert_int_equal(stat_u64("ns.lmix.hcache.kv_from"), 2);
	assert_int_equal(stat_u64("ns.lbf16.hcache.mixed_blocks"), 0);
	/* the stored bytes are the true stored images, MIXED included */
	for (size_t n = 0; n < NNS; n++) {
		struct kvfs_geom g = geom_of(&models[nss[n].model],
					     nss[n].dtype);

		if (!nss[n].kv_from)
			continue;
		for (int i = 0; i < NBLK; i++) {
			stored += kvfs_fmt_split_file_size(&g, ntok[i],
							   nss[n].kv_from);
			kv += kvfs_fmt_file_size(&g, KVFS_KIND_KV, ntok[i]);
		}
	}
	assert_int_equal(stat_u64("cache.hidden_stored_bytes"), stored);
	assert_int_equal(stat_u64("cache.hidden_kv_bytes"), kv);
	assert_int_equal(stat_u64("restore.errors"), 0);
	assert_int_equal(stat_u64("cache.checksum_errors"), 0);
	/* FETCH restored q2h's and lmix's blocks straight into the pool */
	assert_true(stat_u64("restore.to_device") >= 3);
	assert_int_equal(stat_u64("restore.to_device_fallbacks"), 0);
	assert_true(stat_u64("cache.hidden_kv_bytes") >
		    stat_u64("cache.hidden_stored_bytes"));
	assert_int_equal(stat_u64("restore.threads"), 2);
	/* the plans are shown for both tiers */
	assert_int_equal(stat_u64("ns.lf32.hcache.plan.dram.hidden_layers") +
				 stat_u64("ns.lf32.hcache.plan.dram.kv_layers"),
			 models[0].s.L);
	assert_int_equal(stat_u64("ns.lf32.hcache.plan.ssd.hidden_layers") +
				 stat_u64("ns.lf32.hcache.plan.ssd.kv_layers"),
			 models[0].s.L);
	assert_int_equal(stat_u64("ns.lf32.hcache.plan.ssd.recompute_layers"),
			 0);
	/* reads restored on the GPU when there is a GPU restorer, whose
	 * projection time the plans then use; never a fallback here
	 */
	assert_int_equal(stat_u64("restore.gpu_fallbacks"), 0);
	for (size_t n = 0; n < NNS; n++) {
		char key[128], v[16];
		bool gpu = ns_on_gpu(nss[n].name);

		snprintf(key, sizeof(key), "ns.%s.hcache.plan.compute",
			 nss[n].name);
		stat_str(key, v, sizeof(v));
		assert_string_equal(v, gpu ? "gpu" : "cpu");
	}
	if (ns_on_gpu(nss[0].name))
		assert_true(stat_u64("restore.gpu_blocks") >= 6);
	else
		assert_int_equal(stat_u64("restore.gpu_blocks"), 0);
}

/* --------------------------------------------------------- fallback mode */

/*
 * The daemon runs with a cuBLAS whose GEMMs all fail (test_hcache.sh):
 * the GPU restorer starts, its profile fails, so the plans use the CPU's
 * projection time; every read's GPU restoration fails and the CPU
 * restores it instead, with the right bytes; a FETCH's batch fails as a
 * whole and each of its blocks reaches the pool through DRAM.
 */
static void test_fallback(void **state)
{
	char key[128], v[16];

	if (!ns_on_gpu(nss[0].name))
		fail_msg("fallback mode needs a GPU restorer");
	snprintf(key, sizeof(key), "ns.%s.hcache.plan.compute", nss[0].name);
	stat_str(key, v, sizeof(v));
	assert_string_equal(v, "cpu");
	read_two(&nss[0], 1100, true, true);
	read_two(&nss[1], 1100, true, true);
	read_two(&nss[5], 1100, true, true);
	fetch_chain(&nss[0], 1200, true);
	assert_int_equal(stat_u64("restore.gpu_blocks"), 0);
	assert_int_equal(stat_u64("restore.errors"), 0);
}

/* ------------------------------------------------------------ setup mode */

/* @rm's checkpoint at @path, but without tensor @skip, and with tensor
 * @reshape declared (and stored) with its first dimension halved.
 */
static void write_bad(const char *path, const struct refmodel *rm,
		      const char *skip, const char *reshape)
{
	struct wt *t = calloc(rm->nt, sizeof(*t));
	size_t n = 0;

	assert_non_null(t);
	for (size_t i = 0; i < rm->nt; i++) {
		if (skip && !strcmp(rm->t[i].name, skip))
			continue;
		t[n] = rm->t[i];
		if (reshape && !strcmp(t[n].name, reshape)) {
			t[n].shape[0] /= 2;
			t[n].nbytes /= 2;
		}
		n++;
	}
	write_checkpoint(path, t, n);
	free(t);
}

static const char *family_name(int family)
{
	return family == KVFS_FAMILY_QWEN2 ? "qwen2" : "llama";
}

static int setup_dir(const char *dir)
{
	char path[4200];
	FILE *f;

	for (size_t i = 0; i < NMODELS; i++) {
		struct refmodel rm;

		make_model(&rm, &models[i].s, models[i].seed);
		snprintf(path, sizeof(path), "%s/%s", dir, models[i].file);
		write_checkpoint(path, rm.t, rm.nt);
		if (i == 0) {
			snprintf(path, sizeof(path),
				 "%s/bad_missing.safetensors", dir);
			write_bad(path, &rm,
				  "model.layers.1.self_attn.v_proj.weight",
				  NULL);
			snprintf(path, sizeof(path), "%s/bad_shape.safetensors",
				 dir);
			write_bad(path, &rm, NULL,
				  "model.layers.2.self_attn.k_proj.weight");
		}
		free_model(&rm);
	}
	snprintf(path, sizeof(path), "%s/ns.conf", dir);
	f = fopen(path, "w");
	if (!f)
		return 1;
	for (size_t n = 0; n <= NNS; n++) {
		const struct nspec *ns = n < NNS ? &nss[n] : &nss[0];
		const struct spec *s = &models[ns->model].s;

		fprintf(f, "[namespace %s]\nlayers = %u\nkv_heads = %u\n"
			   "head_dim = %u\nhidden_size = %u\ndtype = %s\n"
			   "block_tokens = %u\nchunk_tokens = %u\n",
			n < NNS ? ns->name : "plain", s->L, s->kvh, s->hd,
			s->hidden, kvfs_fmt_dtype_name(ns->dtype), BT, CT);
		if (n == NNS) {
			fprintf(f, "\n");
			continue;
		}
		fprintf(f, "weights = %s/%s\nfamily = %s\nrms_norm_eps = %g\n"
			   "rope_theta = %g\nstore_as = %s\n",
			dir, models[ns->model].file, family_name(s->family),
			s->eps, s->theta, ns->store_as);
		if (ns->kv_layers >= 0)
			fprintf(f, "hcache_kv_layers = %d\n", ns->kv_layers);
		if (s->rope_type == KVFS_ROPE_LLAMA3)
			fprintf(f, "rope_scaling = llama3\nrope_factor = %g\n"
				   "rope_low_freq_factor = %g\n"
				   "rope_high_freq_factor = %g\n"
				   "rope_orig_max_pos = %u\n",
				s->factor, s->lo, s->hi, s->orig);
		fprintf(f, "\n");
	}
	return fclose(f) ? 1 : 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest write_tests[] = {
		cmocka_unit_test(test_write_hidden),
		cmocka_unit_test(test_write_kv_into_hidden_ns),
		cmocka_unit_test(test_hidden_refused_without_weights),
		cmocka_unit_test(test_hidden_wrong_geometry),
	};
	const struct CMUnitTest check_tests[] = {
		cmocka_unit_test(test_check_lf32),
		cmocka_unit_test(test_check_lbf16),
		cmocka_unit_test(test_check_q2),
		cmocka_unit_test(test_check_q2h),
		cmocka_unit_test(test_check_lkv),
		cmocka_unit_test(test_check_lmix),
		cmocka_unit_test(test_mixed_sizes),
		cmocka_unit_test(test_check_kv_block),
	};
	const struct CMUnitTest concurrent_tests[] = {
		cmocka_unit_test(test_one_restoration),
		cmocka_unit_test(test_fetch),
		cmocka_unit_test(test_read_after_fetch),
		cmocka_unit_test(test_fetch_chain),
		cmocka_unit_test(test_fetch_mixed),
		cmocka_unit_test(test_prefetch_then_read),
		cmocka_unit_test(test_prefetch_in_dram),
		cmocka_unit_test(test_read_on_gpu),
	};
	const struct CMUnitTest fallback_tests[] = {
		cmocka_unit_test(test_fallback),
	};
	const struct CMUnitTest stats_tests[] = {
		cmocka_unit_test(test_stats),
	};
	const struct CMUnitTest crash_write_tests[] = {
		cmocka_unit_test(test_crash_write),
	};
	const struct CMUnitTest crash_check_tests[] = {
		cmocka_unit_test(test_crash_check),
	};

	if (argc != 3) {
		fprintf(stderr, "usage: hcache_client setup DIR | "
				"write|check|concurrent|stats|crash-write|"
				"crash-check|fallback MNT\n");
		return 2;
	}
	if (!strcmp(argv[1], "setup"))
		return setup_dir(argv[2]);
	mnt = argv[2];
	if (dev_backend_init()) {
		fprintf(stderr, "KVFS_TEST_GPU=cuda in a build without CUDA\n");
		return 2;
	}
	if (!strcmp(argv[1], "write"))
		return cmocka_run_group_tests(write_tests, NULL, NULL);
	if (!strcmp(argv[1], "check"))
		return cmocka_run_group_tests(check_tests, NULL, NULL);
	if (!strcmp(argv[1], "concurrent"))
		return cmocka_run_group_tests(concurrent_tests, NULL, NULL);
	if (!strcmp(argv[1], "stats"))
		return cmocka_run_group_tests(stats_tests, NULL, NULL);
	if (!strcmp(argv[1], "crash-write"))
		return cmocka_run_group_tests(crash_write_tests, NULL, NULL);
	if (!strcmp(argv[1], "crash-check"))
		return cmocka_run_group_tests(crash_check_tests, NULL, NULL);
	if (!strcmp(argv[1], "fallback"))
		return cmocka_run_group_tests(fallback_tests, NULL, NULL);
	return 2;
}
