/* SPDX-License-Identifier: MIT */
/*
 * The cache engine without FUSE: commit, validation, read paths, DRAM and
 * SSD pressure, deletion while open, pins, recovery and the free-map
 * check.  Background threads are off (KVFS_CACHE_NOTHREADS) so every step
 * is driven by the test and deterministic.
 */
#include <errno.h>
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
#include "cache/cache_i.h"
#include "cache/policy.h"
#include "cache/params.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"

/* 2 layers x 2 heads x 32 dims, bf16, 8-token blocks of 4-token chunks:
 * 4096 header + 4096 tokens + 2*2*2*4*2*32*2 = 8192 + 4096 = 12288 bytes.
 */
static const struct kvfs_geom geom = {
	.n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = 8,
	.chunk_tokens = 4, .dtype = KVFS_DTYPE_BF16,
};

struct fx {
	char dir[64];
	struct kvfs_cache_params conf;
	struct kvfs_cache *c;
	struct kvfs_ns *ns;
};

static void conf_init(struct kvfs_cache_params *conf, uint64_t dram)
{
	kvfs_cache_params_defaults(conf);
	conf->dram_capacity = dram;
	conf->n_ns = 1;
	snprintf(conf->ns[0].name, sizeof(conf->ns[0].name), "t");
	conf->ns[0].geom = geom;
}

static int fx_open(struct fx *f)
{
	int rc = kvfs_cache_open(f->dir, &f->conf,
				 KVFS_CACHE_NOTHREADS | KVFS_CACHE_NOSYNC,
				 &f->c);
	if (!rc)
		f->ns = kvfs_cache_ns_by_name(f->c, "t");
	return rc;
}

static int setup_size(void **state, uint64_t ssd, uint64_t dram)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvfs-tcache.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	assert_int_equal(kvfs_store_create(f->dir, ssd, true), 0);
	conf_init(&f->conf, dram);
	assert_int_equal(fx_open(f), 0);
	assert_non_null(f->ns);
	*state = f;
	return 0;
}

static int setup(void **state)
{
	/* DRAM holds 4 blocks, the SSD (1 MiB, the smallest mkfs makes) 85. */
	return setup_size(state, 1 << 20, 4 * 12288);
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];

	kvfs_cache_free(f->c);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
	return 0;
}

/* Build block @i of a chain: tokens 100*i .. 100*i+7, parent = block i-1. */
static size_t make_block(struct fx *f, int i, uint8_t *buf, size_t len,
			 char name[KVFS_FMT_NAME_LEN + 1])
{
	uint8_t parent[KVFS_KEY_LEN], key[KVFS_KEY_LEN];
	uint32_t tok[8];
	uint64_t size = kvfs_fmt_file_size(&geom, KVFS_KIND_KV, 8);
	uint8_t *payload;

	assert_true(size <= len);
	memcpy(parent, kvfs_ns_root(f->ns), KVFS_KEY_LEN);
	for (int d = 0; d <= i; d++) {
		for (int t = 0; t < 8; t++)
			tok[t] = (uint32_t)(100 * d + t);
		if (d < i) {
			kvfs_fmt_block_key(parent, tok, 8, key);
			memcpy(parent, key, KVFS_KEY_LEN);
		}
	}
	payload = malloc(size);
	assert_non_null(payload);
	for (size_t b = 0; b < size; b++)
		payload[b] = (uint8_t)(b * 7 + (size_t)i);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, parent,
					 (uint64_t)i * 8, tok, 8, payload, buf,
					 len),
			 0);
	free(payload);
	kvfs_fmt_key_hex(buf + 64, name);
	memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
	return size;
}

static int put_block(struct fx *f, int i, struct kvfs_block **out)
{
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	size_t n = make_block(f, i, buf, sizeof(buf), name);
	struct kvfs_pending *p;
	struct kvfs_block *b;
	int rc;

	rc = kvfs_cache_create(f->c, f->ns, name, &p);
	if (rc)
		return rc;
	/* Two writes, out of order, as a page-cache flush may issue them. */
	assert_int_equal(kvfs_cache_write(p, 4096, buf + 4096, n - 4096), 0);
	assert_int_equal(kvfs_cache_write(p, 0, buf, 4096), 0);
	rc = kvfs_cache_commit(f->c, p, &b);
	if (rc)
		return rc;
	if (out)
		*out = b;
	else
		kvfs_cache_put(f->c, b);
	return 0;
}

/* Read the whole block through the reader API and compare with block i. */
static void check_block(struct fx *f, int i)
{
	static uint8_t want[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	size_t n = make_block(f, i, want, sizeof(want), name), got = 0;
	struct kvfs_reader r;
	struct kvfs_block *b;

	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), 0);
	assert_int_equal(kvfs_cache_reader_init(f->c, &r, b), 0);
	while (got < n) {
		const void *p;
		size_t k;

		assert_int_equal(kvfs_cache_read_begin(f->c, &r, got, 5000,
						       &p, &k),
				 0);
		assert_true(k > 0);
		assert_memory_equal(p, want + got, k);
		got += k;
		kvfs_cache_read_end(f->c, &r);
	}
	kvfs_cache_reader_release(f->c, &r);
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

static void test_commit_read_sync(void **state)
{
	struct fx *f = *state;
	struct kvfs_block_info bi;
	struct kvfs_block *b;

	assert_int_equal(put_block(f, 0, &b), 0);
	kvfs_block_info(b, &bi);
	assert_int_equal(bi.tiers, KVFS_TIER_BIT_DRAM);
	assert_false(bi.persisted);
	assert_int_equal(bi.n_tokens, 8);
	check_block(f, 0);
	assert_int_equal(kvfs_cache_sync(f->c, b), 0);
	kvfs_block_info(b, &bi);
	assert_true(bi.persisted);
	assert_int_equal(bi.tiers, KVFS_TIER_BIT_DRAM | KVFS_TIER_BIT_SSD);
	kvfs_cache_put(f->c, b);
	assert_int_equal(stat_of(f, "cache.commits"), 1);
	assert_int_equal(stat_of(f, "tier.ssd.blocks"), 1);
	assert_int_equal(kvfs_ns_nblocks(f->ns), 1);
}

static void test_reject(void **state)
{
	struct fx *f = *state;
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	size_t n = make_block(f, 0, buf, sizeof(buf), name);
	struct kvfs_pending *p;
	struct kvfs_block *b;

	/* payload flipped: checksum */
	buf[n - 1] ^= 1;
	assert_int_equal(kvfs_cache_create(f->c, f->ns, name, &p), 0);
	assert_int_equal(kvfs_cache_write(p, 0, buf, n), 0);
	assert_int_equal(kvfs_cache_commit(f->c, p, &b), -EBADMSG);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), -ENOENT);
	/* short file */
	buf[n - 1] ^= 1;
	assert_int_equal(kvfs_cache_create(f->c, f->ns, name, &p), 0);
	assert_int_equal(kvfs_cache_write(p, 0, buf, n - 4096), 0);
	assert_int_equal(kvfs_cache_commit(f->c, p, &b), -EINVAL);
	/* not a block name; past the largest block */
	assert_int_equal(kvfs_cache_create(f->c, f->ns, "x.kv", &p), -EINVAL);
	assert_int_equal(kvfs_cache_create(f->c, f->ns, name, &p), 0);
	assert_int_equal(kvfs_cache_write(p, 1 << 20, buf, 1), -EFBIG);
	assert_int_equal(kvfs_cache_truncate(p, 1 << 20), -EFBIG);
	kvfs_cache_abandon(f->c, p);
	assert_int_equal(stat_of(f, "cache.rejects"), 2);
	assert_int_equal(kvfs_ns_nblocks(f->ns), 0);
	/* and the good one is still accepted */
	assert_int_equal(put_block(f, 0, NULL), 0);
}

static void test_exists(void **state)
{
	struct fx *f = *state;
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	struct kvfs_pending *p, *q;

	make_block(f, 0, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_create(f->c, f->ns, name, &p), 0);
	/* a second writer of the same name, while the first is pending */
	assert_int_equal(kvfs_cache_create(f->c, f->ns, name, &q), -EEXIST);
	/* the pending name is invisible to lookups */
	struct kvfs_block *b;
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), -ENOENT);
	kvfs_cache_abandon(f->c, p);
	assert_int_equal(put_block(f, 0, NULL), 0);
	assert_int_equal(put_block(f, 0, NULL), -EEXIST);
}

static void test_parent_rules(void **state)
{
	struct fx *f = *state;

	/* Block 1 of the chain arrives before block 0: allowed (an orphan). */
	assert_int_equal(put_block(f, 1, NULL), 0);
	assert_int_equal(put_block(f, 0, NULL), 0);
	assert_int_equal(put_block(f, 2, NULL), 0);
	check_block(f, 2);
}

static void test_dram_pressure(void **state)
{
	struct fx *f = *state;

	/* 12 blocks through a 4-block DRAM tier. */
	for (int i = 0; i < 12; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_true(stat_of(f, "tier.dram.evictions") >= 8);
	assert_true(stat_of(f, "tier.dram.used_bytes") <= 4 * 12288);
	for (int i = 0; i < 12; i++)
		check_block(f, i);
	assert_true(stat_of(f, "tier.ssd.hits") > 0);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 0);
}

static void test_pin(void **state)
{
	struct fx *f = *state;
	struct kvfs_block_info bi;
	struct kvfs_block *b;
	char hex[KVFS_KEY_HEX_LEN + 4];

	assert_int_equal(put_block(f, 0, &b), 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_DRAM), 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_GPU), -EINVAL);
	for (int i = 1; i < 12; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	kvfs_block_info(b, &bi);
	assert_true(bi.tiers & KVFS_TIER_BIT_DRAM); /* never evicted */
	kvfs_fmt_key_hex(bi.key, hex);
	strcat(hex, ".kv");
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, hex), -EBUSY);
	assert_int_equal(kvfs_cache_unpin(f->c, b), 0);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, hex), 0);
	kvfs_cache_put(f->c, b);
}

static void test_unlink_while_open(void **state)
{
	struct fx *f = *state;
	static uint8_t want[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	size_t n = make_block(f, 0, want, sizeof(want), name);
	struct kvfs_cache_fsinfo before, mid, after;
	struct kvfs_reader r;
	struct kvfs_block *b;
	const void *p;
	size_t k;

	assert_int_equal(put_block(f, 0, &b), 0);
	assert_int_equal(kvfs_cache_sync(f->c, b), 0);
	kvfs_cache_fsinfo(f->c, &before);
	assert_int_equal(kvfs_cache_reader_init(f->c, &r, b), 0);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, name), 0);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), -ENOENT);
	/* still readable through the open reader; space not yet reusable */
	assert_int_equal(kvfs_cache_read_begin(f->c, &r, 0, n, &p, &k), 0);
	assert_int_equal(k, n);
	assert_memory_equal(p, want, n);
	kvfs_cache_read_end(f->c, &r);
	kvfs_cache_fsinfo(f->c, &mid);
	assert_int_equal(mid.ssd_free, before.ssd_free);
	kvfs_cache_reader_release(f->c, &r);
	kvfs_cache_fsinfo(f->c, &after);
	assert_int_equal(after.ssd_free, before.ssd_free + 12288);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, name), -ENOENT);
}

/*
 * A pin that comes after the unlink of a block it still holds (it looked
 * the block up first): the record is gone for good, and the pin must not
 * write it back, which would bring the block back at the next start on an
 * extent the free map already has.
 */
static void test_pin_after_unlink(void **state)
{
	struct fx *f = *state;
	struct kvfs_cache_fsinfo before, after;
	char name[KVFS_FMT_NAME_LEN + 1];
	static uint8_t buf[16384];
	struct kvfs_block *b;

	kvfs_cache_fsinfo(f->c, &before);
	assert_int_equal(put_block(f, 0, &b), 0);
	assert_int_equal(kvfs_cache_sync(f->c, b), 0);
	make_block(f, 0, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, name), 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_SSD), -ENOENT);
	assert_int_equal(kvfs_cache_unpin(f->c, b), -ENOENT);
	kvfs_cache_put(f->c, b);
	kvfs_cache_free(f->c);
	f->c = NULL;
	assert_int_equal(fx_open(f), 0);
	assert_int_equal(kvfs_ns_nblocks(f->ns), 0);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), -ENOENT);
	kvfs_cache_fsinfo(f->c, &after);
	assert_int_equal(after.ssd_free, before.ssd_free);
}

/* A block only on the SSD, unlinked while open, then read: the load must
 * not become a DRAM copy the policy tracks, since the delete already made
 * the policy forget the block and nothing would ever remove it again.
 * Its node would stay in the DRAM list after the block is freed (a leaf:
 * nothing else holds it), and the next insert would walk into it.
 */
static void test_unlink_open_then_load(void **state)
{
	struct fx *f = *state;
	static uint8_t want[16384];
	char name[KVFS_FMT_NAME_LEN + 1], leaf[KVFS_FMT_NAME_LEN + 1];
	size_t n = make_block(f, 5, want, sizeof(want), name);
	struct kvfs_block_info bi;
	struct kvfs_reader r;
	struct kvfs_block *b;
	const void *p;
	size_t k;

	for (int i = 0; i < 5; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_int_equal(put_block(f, 5, &b), 0);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	/* Four more, not yet durable, push the durable ones out of DRAM;
	 * then they go again, so that block 5 is a leaf.
	 */
	for (int i = 6; i < 10; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	kvfs_block_info(b, &bi);
	assert_false(bi.tiers & KVFS_TIER_BIT_DRAM);
	for (int i = 9; i >= 6; i--) {
		make_block(f, i, want, sizeof(want), leaf);
		assert_int_equal(kvfs_cache_unlink(f->c, f->ns, leaf), 0);
	}
	make_block(f, 5, want, sizeof(want), name);

	assert_int_equal(kvfs_cache_reader_init(f->c, &r, b), 0);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, name), 0);
	assert_int_equal(kvfs_cache_read_begin(f->c, &r, 0, n, &p, &k), 0);
	assert_int_equal(k, n);
	assert_memory_equal(p, want, n);
	kvfs_cache_read_end(f->c, &r);
	kvfs_block_info(b, &bi);
	assert_false(bi.tiers & KVFS_TIER_BIT_DRAM);
	/* The last reference: the block is freed. */
	kvfs_cache_reader_release(f->c, &r);

	/* Inserts and evictions in the DRAM list after it. */
	for (int i = 5; i < 12; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	for (int i = 5; i < 12; i++)
		check_block(f, i);
	assert_true(stat_of(f, "tier.dram.blocks") <= 4);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 0);
}

/*
 * A promotion (the mover's, or a PREFETCH's in the background) of a block
 * that was unlinked after the promotion took its reference: the unlink
 * gave the SSD extent back, another block's write-back took it, and the
 * promotion must not read it as the deleted block's copy (it would fail
 * verification: a false checksum failure in the log and the stats).
 */
static void test_promote_after_unlink(void **state)
{
	struct fx *f = *state;
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	struct kvfs_block *b, *b2;
	uint64_t off;

	assert_int_equal(put_block(f, 0, &b), 0);
	assert_int_equal(kvfs_cache_sync(f->c, b), 0);
	assert_int_equal(kvfs_dram_drop(f->c, b), 0);
	assert_null(atomic_load(&b->dram_ptr));
	off = b->ssd.off;
	/* The promotion's reference, taken before the unlink. */
	kvfs_block_get_ref(b);
	make_block(f, 0, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, name), 0);
	kvfs_cache_put(f->c, b); /* put_block's */
	/* The next write-back takes the extent (the test needs it). */
	assert_int_equal(put_block(f, 1, &b2), 0);
	assert_int_equal(kvfs_cache_sync(f->c, b2), 0);
	assert_int_equal(b2->ssd.off, off);

	assert_int_equal(kvfs_promote_load(f->c, b), -ENOENT);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 0);
	assert_null(atomic_load(&b->dram_ptr));
	kvfs_cache_put(f->c, b);
	/* A block with a DRAM copy is left as it is. */
	assert_int_equal(kvfs_promote_load(f->c, b2), -EEXIST);
	/* And one only on the SSD is loaded, as before. */
	assert_int_equal(kvfs_dram_drop(f->c, b2), 0);
	assert_int_equal(kvfs_promote_load(f->c, b2), 0);
	assert_non_null(atomic_load(&b2->dram_ptr));
	kvfs_cache_put(f->c, b2);
	check_block(f, 1);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 0);
}

static void test_ssd_pressure(void **state)
{
	struct fx *f = *state;
	struct kvfs_block *b;

	/* 100 blocks into an 85-block SSD: the oldest are deleted. */
	for (int i = 0; i < 100; i++) {
		assert_int_equal(put_block(f, i, &b), 0);
		assert_int_equal(kvfs_cache_sync(f->c, b), 0);
		kvfs_cache_put(f->c, b);
	}
	assert_true(stat_of(f, "tier.ssd.evictions") >= 15);
	assert_true(kvfs_ns_nblocks(f->ns) <= 85);
	for (int i = 90; i < 100; i++)
		check_block(f, i);
}

static void test_recovery(void **state)
{
	struct fx *f = *state;
	struct kvfs_block_info bi;
	struct kvfs_block *b;
	char name[KVFS_FMT_NAME_LEN + 1];
	static uint8_t buf[16384];

	for (int i = 0; i < 6; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	make_block(f, 3, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_SSD), 0);
	kvfs_cache_put(f->c, b);
	/* an orderly close persists everything */
	kvfs_cache_free(f->c);
	f->c = NULL;
	assert_int_equal(fx_open(f), 0);
	assert_int_equal(kvfs_ns_nblocks(f->ns), 6);
	for (int i = 0; i < 6; i++)
		check_block(f, i);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), 0);
	kvfs_block_info(b, &bi);
	assert_true(bi.persisted);
	assert_int_equal(bi.pins, KVFS_TIER_BIT_SSD);
	assert_int_equal(bi.depth, 3);
	kvfs_cache_put(f->c, b);
	/* a changed geometry is refused */
	kvfs_cache_free(f->c);
	f->c = NULL;
	f->conf.ns[0].geom.n_layers = 3;
	assert_int_equal(fx_open(f), -EINVAL);
	f->conf.ns[0].geom.n_layers = geom.n_layers;
	assert_int_equal(fx_open(f), 0);
}

/* ------------------------------------------------- DRAM pins on restart */

#define BLK 12288u

static int setup_big(void **state)
{
	/* DRAM holds 8 blocks. */
	return setup_size(state, 1 << 20, 8 * BLK);
}

static void reopen(struct fx *f, uint64_t dram)
{
	kvfs_cache_free(f->c);
	f->c = NULL;
	f->conf.dram_capacity = dram;
	assert_int_equal(fx_open(f), 0);
	assert_non_null(f->ns);
}

static struct kvfs_block *lookup_block(struct fx *f, int i)
{
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	struct kvfs_block *b;

	make_block(f, i, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), 0);
	return b;
}

static struct kvfs_block_info info_of(struct fx *f, int i)
{
	struct kvfs_block *b = lookup_block(f, i);
	struct kvfs_block_info bi;

	kvfs_block_info(b, &bi);
	kvfs_cache_put(f->c, b);
	return bi;
}

/* Blocks 0..n-1, durable, each pinned in DRAM. */
static void put_pinned(struct fx *f, int n)
{
	struct kvfs_block *b;

	for (int i = 0; i < n; i++) {
		assert_int_equal(put_block(f, i, &b), 0);
		assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_DRAM), 0);
		kvfs_cache_put(f->c, b);
	}
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
}

/* The key of block @i (the cache open: the namespace root is its). */
static void key_of(struct fx *f, int i, uint8_t key[KVFS_KEY_LEN])
{
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];

	make_block(f, i, buf, sizeof(buf), name);
	assert_int_equal(kvfs_fmt_name_parse(name, key), 0);
}

/* The pins field of the record of @key, read from LMDB with the cache
 * closed.
 */
static uint32_t recorded_pins(struct fx *f, const uint8_t key[KVFS_KEY_LEN])
{
	struct kvfs_meta_blk r;
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;

	assert_int_equal(kvfs_store_open(f->dir, KVFS_META_NOSYNC, 0, &s), 0);
	assert_int_equal(kvfs_meta_txn_begin(s->meta, true, &t), 0);
	assert_int_equal(kvfs_meta_blk_get(t, key, &r), 0);
	kvfs_meta_txn_abort(t);
	kvfs_store_free(s);
	return r.pins;
}

/*
 * DRAM lowered below what the pins need: the start loads what fits and
 * keeps the other pins (in memory, through later record updates, in the
 * record), serves those blocks from the SSD, and loads them again at a
 * start with room.
 */
static void test_pin_restart_no_room(void **state)
{
	struct fx *f = *state;
	int waiting[6], nw = 0, resident = 0;
	uint8_t key[3][KVFS_KEY_LEN];
	struct kvfs_block_info bi;
	struct kvfs_block *b;

	put_pinned(f, 6);
	reopen(f, 3 * BLK);
	for (int i = 0; i < 6; i++) {
		bi = info_of(f, i);
		assert_int_equal(bi.pins, KVFS_TIER_BIT_DRAM);
		assert_true(bi.persisted);
		if (bi.tiers & KVFS_TIER_BIT_DRAM)
			resident++;
		else
			waiting[nw++] = i;
	}
	assert_int_equal(resident, 3);
	assert_int_equal(nw, 3);
	assert_int_equal(stat_of(f, "tier.dram.blocks"), 3);
	assert_int_equal(stat_of(f, "tier.dram.used_bytes"), 3 * BLK);
	assert_int_equal(stat_of(f, "cache.dram_pins"), 6);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 3);

	/* Record updates of the waiting blocks for other reasons: an SSD
	 * pin (written at once), a category (written by the counter flush
	 * at close), and a DRAM pin again that still cannot be loaded: it
	 * fails, and the recorded pin stays.
	 */
	b = lookup_block(f, waiting[0]);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_SSD), 0);
	kvfs_cache_put(f->c, b);
	b = lookup_block(f, waiting[1]);
	assert_int_equal(kvfs_cache_set_category(f->c, b, 7), 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_DRAM), -ENOSPC);
	kvfs_cache_put(f->c, b);
	bi = info_of(f, waiting[0]);
	assert_int_equal(bi.pins, KVFS_TIER_BIT_DRAM | KVFS_TIER_BIT_SSD);
	bi = info_of(f, waiting[1]);
	assert_int_equal(bi.pins, KVFS_TIER_BIT_DRAM);
	/* The third one is unpinned: that is the admin's to do. */
	b = lookup_block(f, waiting[2]);
	assert_int_equal(kvfs_cache_unpin(f->c, b), 0);
	kvfs_cache_put(f->c, b);
	assert_int_equal(stat_of(f, "cache.dram_pins"), 5);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 2);

	/* Served from the SSD: DRAM is all pinned, so the reads get private
	 * copies and nothing resident moves.
	 */
	for (int i = 0; i < 6; i++)
		check_block(f, i);
	assert_int_equal(stat_of(f, "tier.dram.blocks"), 3);
	assert_int_equal(stat_of(f, "tier.dram.used_bytes"), 3 * BLK);
	assert_int_equal(stat_of(f, "tier.dram.evictions"), 0);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 0);

	for (int k = 0; k < 3; k++)
		key_of(f, waiting[k], key[k]);
	kvfs_cache_free(f->c);
	f->c = NULL;
	f->ns = NULL;
	assert_int_equal(recorded_pins(f, key[0]),
			 KVFS_TIER_BIT_DRAM | KVFS_TIER_BIT_SSD);
	assert_int_equal(recorded_pins(f, key[1]), KVFS_TIER_BIT_DRAM);
	assert_int_equal(recorded_pins(f, key[2]), 0);

	/* Room again: every pinned block is resident; the unpinned one is
	 * not loaded.
	 */
	f->conf.dram_capacity = 8 * BLK;
	assert_int_equal(fx_open(f), 0);
	for (int i = 0; i < 6; i++) {
		bi = info_of(f, i);
		if (i == waiting[2]) {
			assert_int_equal(bi.pins, 0);
			assert_int_equal(bi.tiers, KVFS_TIER_BIT_SSD);
			continue;
		}
		assert_true(bi.pins & KVFS_TIER_BIT_DRAM);
		assert_true(bi.tiers & KVFS_TIER_BIT_DRAM);
	}
	assert_int_equal(info_of(f, waiting[0]).pins,
			 KVFS_TIER_BIT_DRAM | KVFS_TIER_BIT_SSD);
	assert_int_equal(info_of(f, waiting[1]).category, 7);
	assert_int_equal(stat_of(f, "tier.dram.blocks"), 5);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 0);
	for (int i = 0; i < 6; i++)
		check_block(f, i);
}

/*
 * A pin that waits is honoured by the first read that loads the block,
 * even where the policy would not admit it (HotPrefix refuses blocks read
 * fewer than 10 times), and from then on the copy stays under pressure.
 */
static void test_pin_restart_read_loads(void **state)
{
	struct fx *f = *state;
	int waiting = -1, unpinned[2] = { -1, -1 };
	struct kvfs_block_info bi;
	struct kvfs_block *b;

	put_pinned(f, 6);
	assert_int_equal(put_block(f, 6, NULL), 0); /* not pinned */
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	snprintf(f->conf.policy, sizeof(f->conf.policy), "hotprefix");
	reopen(f, 5 * BLK);
	for (int i = 0; i < 6; i++) {
		bi = info_of(f, i);
		assert_int_equal(bi.pins, KVFS_TIER_BIT_DRAM);
		if (!(bi.tiers & KVFS_TIER_BIT_DRAM)) {
			assert_int_equal(waiting, -1);
			waiting = i;
		} else {
			unpinned[0] = unpinned[1];
			unpinned[1] = i;
		}
	}
	assert_true(waiting >= 0);
	assert_true(unpinned[0] >= 0);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 1);
	/* The two deepest resident blocks lose their pins: room the read
	 * can make (HotPrefix evicts leaves of the prefix tree only).
	 */
	for (int k = 0; k < 2; k++) {
		b = lookup_block(f, unpinned[k]);
		assert_int_equal(kvfs_cache_unpin(f->c, b), 0);
		kvfs_cache_put(f->c, b);
	}
	assert_int_equal(stat_of(f, "tier.dram.blocks"), 5);

	/* The control: a block not pinned, read once from the SSD, is
	 * refused by the policy and served from a private copy.
	 */
	assert_int_equal(info_of(f, 6).tiers, KVFS_TIER_BIT_SSD);
	check_block(f, 6);
	assert_int_equal(info_of(f, 6).tiers, KVFS_TIER_BIT_SSD);
	assert_int_equal(stat_of(f, "tier.dram.evictions"), 0);

	check_block(f, waiting);
	bi = info_of(f, waiting);
	assert_int_equal(bi.pins, KVFS_TIER_BIT_DRAM);
	assert_int_equal(bi.tiers, KVFS_TIER_BIT_DRAM | KVFS_TIER_BIT_SSD);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 0);
	assert_int_equal(stat_of(f, "tier.dram.blocks"), 5);
	assert_int_equal(stat_of(f, "tier.dram.evictions"), 1);

	/* Pressure: new blocks through the one DRAM slot not pinned (what
	 * HotPrefix does not admit to the SSD on the way down it discards;
	 * never a pinned block).
	 */
	for (int i = 7; i < 15; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_true(stat_of(f, "tier.dram.evictions") >= 8);
	assert_true(stat_of(f, "tier.dram.blocks") <= 5);
	assert_true(stat_of(f, "tier.dram.used_bytes") <= 5 * BLK);
	for (int i = 0; i < 6; i++) {
		if (i == unpinned[0] || i == unpinned[1])
			continue;
		bi = info_of(f, i);
		assert_int_equal(bi.pins, KVFS_TIER_BIT_DRAM);
		assert_true(bi.tiers & KVFS_TIER_BIT_DRAM);
		check_block(f, i);
	}
	assert_int_equal(stat_of(f, "cache.dram_pins"), 4);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 0);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 0);
}

/* A new DRAM pin that cannot be loaded fails with the errno and is not
 * recorded, not even by a later record update.
 */
static void test_pin_fails_not_recorded(void **state)
{
	struct fx *f = *state;
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_block *b;

	/* DRAM holds 4: blocks 2..5 end up resident, 0 and 1 on the SSD. */
	for (int i = 0; i < 6; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	assert_false(info_of(f, 0).tiers & KVFS_TIER_BIT_DRAM);
	for (int i = 2; i < 6; i++) {
		b = lookup_block(f, i);
		assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_DRAM), 0);
		kvfs_cache_put(f->c, b);
	}
	b = lookup_block(f, 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_DRAM), -ENOSPC);
	assert_int_equal(info_of(f, 0).pins, 0);
	assert_int_equal(kvfs_cache_pin(f->c, b, KVFS_TIER_SSD), 0);
	kvfs_cache_put(f->c, b);
	assert_int_equal(info_of(f, 0).pins, KVFS_TIER_BIT_SSD);
	assert_int_equal(stat_of(f, "cache.dram_pins"), 4);
	assert_int_equal(stat_of(f, "cache.dram_pins_waiting"), 0);
	key_of(f, 0, key);
	kvfs_cache_free(f->c);
	f->c = NULL;
	f->ns = NULL;
	assert_int_equal(recorded_pins(f, key), KVFS_TIER_BIT_SSD);
	assert_int_equal(fx_open(f), 0);
	assert_int_equal(info_of(f, 0).pins, KVFS_TIER_BIT_SSD);
	assert_false(info_of(f, 0).tiers & KVFS_TIER_BIT_DRAM);
}

/* A damaged free map (here: an extent that records still use marked free)
 * is rewritten from the records, so new blocks never overwrite old ones.
 */
static void test_free_map_repair(void **state)
{
	struct fx *f = *state;
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;

	for (int i = 0; i < 4; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	kvfs_cache_free(f->c);
	f->c = NULL;
	assert_int_equal(kvfs_store_open(f->dir, KVFS_META_NOSYNC, 0, &s), 0);
	assert_int_equal(kvfs_meta_txn_begin(s->meta, false, &t), 0);
	assert_int_equal(kvfs_meta_free_clear(t), 0);
	assert_int_equal(kvfs_meta_free_give(t, s->sb.data_off,
					     s->sb.ssd_size - s->sb.data_off),
			 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_store_free(s);

	assert_int_equal(fx_open(f), 0);
	for (int i = 4; i < 10; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	kvfs_cache_free(f->c);
	f->c = NULL;
	assert_int_equal(fx_open(f), 0);
	for (int i = 0; i < 10; i++)
		check_block(f, i);
}

static int setup_remote(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvfs-tcache.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	assert_int_equal(kvfs_store_create(f->dir, 1 << 20, true), 0);
	conf_init(&f->conf, 4 * 12288);
	/* The tier's in-process store: no network (tier/tier_remote.h). */
	f->conf.remote.backend = KVFS_REMOTE_MEMORY;
	assert_int_equal(fx_open(f), 0);
	*state = f;
	return 0;
}

/* The remote queue sent everything (its thread runs even here). */
static void remote_drained(struct fx *f)
{
	for (int i = 0; i < 500 && stat_of(f, "tier.remote.queued"); i++)
		usleep(2000);
	assert_int_equal(stat_of(f, "tier.remote.queued"), 0);
}

/*
 * A written block goes to the remote tier after its local write-back; once
 * deleted locally, a lookup by name misses locally and finds it remotely:
 * it is imported (flagged remote, served byte for byte, persisted like a
 * committed block) and never sent back.  write = through: fsync SETs.
 */
static void test_remote_roundtrip(void **state)
{
	struct fx *f = *state;
	char name[KVFS_FMT_NAME_LEN + 1];
	static uint8_t buf[16384];
	struct kvfs_block_info bi;
	struct kvfs_block *b;
	uint64_t sent;

	for (int i = 0; i < 3; i++)
		assert_int_equal(put_block(f, i, NULL), 0);
	assert_int_equal(stat_of(f, "tier.remote.bytes_written"), 0);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	remote_drained(f);
	sent = stat_of(f, "tier.remote.bytes_written");
	assert_true(sent > 0);
	assert_int_equal(stat_of(f, "tier.remote.nodes"), 1);

	make_block(f, 1, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_unlink(f->c, f->ns, name), 0);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), -ENOENT);
	assert_int_equal(kvfs_cache_lookup_remote(f->c, f->ns, name, &b), 0);
	kvfs_block_info(b, &bi);
	assert_true(bi.remote);
	assert_false(bi.persisted);
	assert_int_equal(bi.tiers, KVFS_TIER_BIT_DRAM);
	kvfs_cache_put(f->c, b);
	check_block(f, 1);
	assert_int_equal(stat_of(f, "tier.remote.hits"), 1);
	assert_int_equal(kvfs_cache_writeback_now(f->c), 0);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), 0);
	kvfs_block_info(b, &bi);
	assert_true(bi.persisted);
	kvfs_cache_put(f->c, b);
	remote_drained(f);
	assert_int_equal(stat_of(f, "tier.remote.bytes_written"), sent);

	/* Absent everywhere: a miss, counted. */
	make_block(f, 7, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_lookup_remote(f->c, f->ns, name, &b),
			 -ENOENT);
	assert_int_equal(stat_of(f, "tier.remote.misses"), 1);

	/* write = through: fsync sends the block itself. */
	kvfs_cache_free(f->c);
	f->c = NULL;
	f->conf.remote.write = KVFS_REMOTE_WRITE_THROUGH;
	assert_int_equal(fx_open(f), 0);
	assert_int_equal(put_block(f, 3, &b), 0);
	assert_int_equal(kvfs_cache_fsync(f->c, b), 0);
	kvfs_block_info(b, &bi);
	assert_true(bi.remote);
	assert_true(bi.persisted);
	kvfs_cache_put(f->c, b);
	assert_true(stat_of(f, "tier.remote.bytes_written") > 0);
}

/* ---- fleet sightings ([fleet] sightings = memory) ---- */

/* Three caches with policy kvfs: A and B hear each other on one channel,
 * C is alone on another.
 */
static int setup_fleet(void **state)
{
	static const char *const chan[3] = { "fleet", "fleet", "alone" };
	struct fx *f = calloc(3, sizeof(*f));

	assert_non_null(f);
	for (int i = 0; i < 3; i++) {
		snprintf(f[i].dir, sizeof(f[i].dir), "/tmp/kvfs-tcache.XXXXXX");
		assert_non_null(mkdtemp(f[i].dir));
		assert_int_equal(kvfs_store_create(f[i].dir, 1 << 20, true), 0);
		conf_init(&f[i].conf, 4 * 12288);
		strcpy(f[i].conf.policy, "kvfs");
		f[i].conf.fleet.backend = KVFS_SIGHT_MEMORY;
		strcpy(f[i].conf.fleet.channel, chan[i]);
		/* Published by the test's flushes only. */
		f[i].conf.fleet.interval_ms = 3600 * 1000;
		assert_int_equal(fx_open(&f[i]), 0);
		assert_non_null(f[i].c->sight);
	}
	*state = f;
	return 0;
}

static int teardown_fleet(void **state)
{
	struct fx *f = *state;
	char cmd[128];

	for (int i = 0; i < 3; i++) {
		kvfs_cache_free(f[i].c);
		snprintf(cmd, sizeof(cmd), "rm -rf %s", f[i].dir);
		assert_int_equal(system(cmd), 0);
	}
	free(f);
	return 0;
}

/* Block @i's place in the DRAM tier's policy lists: its list (kvfs's
 * first sights or main) and its CLOCK passes there.
 */
static struct kvfs_plink dram_link(struct fx *f, int i)
{
	static uint8_t buf[16384];
	char name[KVFS_FMT_NAME_LEN + 1];
	struct kvfs_block *b;
	struct kvfs_plink l;

	make_block(f, i, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_lookup(f->c, f->ns, name, &b), 0);
	pthread_mutex_lock(&f->c->policy_lock);
	assert_true(b->pn.tiers & KVFS_TIER_BIT_DRAM);
	l = b->pn.t[KVFS_TIER_DRAM];
	pthread_mutex_unlock(&f->c->policy_lock);
	kvfs_cache_put(f->c, b);
	return l;
}

/* The policy list block @i entered DRAM on in @f's cache. */
static int dram_list(struct fx *f, int i)
{
	return dram_link(f, i).list;
}

/* The CLOCK passes block @i has in the DRAM tier (kvfs's main). */
static unsigned dram_passes(struct fx *f, int i)
{
	return dram_link(f, i).idx;
}

static void drain(struct fx *f)
{
	pthread_mutex_lock(&f->c->policy_lock);
	kvfs_cache_drain_touches(f->c);
	pthread_mutex_unlock(&f->c->policy_lock);
}

/*
 * A block committed on A, and a read of it, reach B's policy as
 * sightings (fleet.sight.* counts them); C, on another channel, hears
 * nothing.  With policy kvfs a sighting counts as a first sight: the
 * block B then writes for the first time enters the list that a block
 * seen before enters (as C's block does on its second write), not the
 * list of a first sight (C's first write).
 */
static void test_fleet_sightings(void **state)
{
	struct fx *f = *state, *a = &f[0], *b = &f[1], *c = &f[2];
	char name[KVFS_FMT_NAME_LEN + 1];
	static uint8_t buf[16384];
	int first, second;

	assert_int_equal(put_block(a, 0, NULL), 0);
	assert_int_equal(stat_of(a, "fleet.sight.buffered"), 1);
	assert_int_equal(kvfs_sight_flush(a->c->sight), 0);
	assert_int_equal(stat_of(a, "fleet.sight.keys_out"), 1);
	assert_int_equal(stat_of(b, "fleet.sight.keys_in"), 1);
	assert_int_equal(stat_of(b, "fleet.sight.msgs_in"), 1);
	assert_int_equal(stat_of(a, "fleet.sight.keys_in"), 0);
	assert_int_equal(stat_of(c, "fleet.sight.keys_in"), 0);

	/* A read is a reference too, once the policy learns of it. */
	check_block(a, 0);
	assert_int_equal(stat_of(a, "fleet.sight.buffered"), 0);
	drain(a);
	assert_int_equal(stat_of(a, "fleet.sight.buffered"), 1);
	assert_int_equal(kvfs_sight_flush(a->c->sight), 0);
	assert_int_equal(stat_of(b, "fleet.sight.keys_in"), 2);

	/* C: a first sight, then (deleted and written again) a second. */
	assert_int_equal(put_block(c, 0, NULL), 0);
	first = dram_list(c, 0);
	make_block(c, 0, buf, sizeof(buf), name);
	assert_int_equal(kvfs_cache_unlink(c->c, c->ns, name), 0);
	assert_int_equal(put_block(c, 0, NULL), 0);
	second = dram_list(c, 0);
	assert_int_not_equal(first, second);

	/* B writes the block A sighted: its first local sight, a second
	 * one for the policy.
	 */
	assert_int_equal(put_block(b, 0, NULL), 0);
	assert_int_equal(dram_list(b, 0), second);
	check_block(b, 0);

	/* B's own notes go to A, never back to B. */
	assert_int_equal(kvfs_sight_flush(b->c->sight), 0);
	assert_int_equal(stat_of(a, "fleet.sight.keys_in"), 1);
	assert_int_equal(stat_of(b, "fleet.sight.keys_in"), 2);
	assert_int_equal(stat_of(c, "fleet.sight.keys_in"), 0);
	assert_int_equal(stat_of(b, "fleet.sight.rejected") +
				 stat_of(b, "fleet.sight.dropped") +
				 stat_of(b, "fleet.sight.errors"),
			 0);
}

/*
 * Blocks held when another host references them.  B's word reaches A's
 * policy with A's copy of the block: A holds it on its first sight, and
 * it stays on the list of first sights (the session that read it on B
 * goes on elsewhere; policy option sight=3 would move it).  B's copy,
 * which A's sighting had made a second sight there, is in main: A's read
 * of the block reaches B with it and gives it one more CLOCK pass, as a
 * hit on B would.  Block 5 is an orphan on both (its parent, 4, was never
 * written), so no prefix rule applies.
 */
static void test_fleet_sighting_held(void **state)
{
	struct fx *f = *state, *a = &f[0], *b = &f[1];
	unsigned passes;
	int before, seen;

	assert_int_equal(put_block(a, 5, NULL), 0);
	before = dram_list(a, 5);
	assert_int_equal(kvfs_sight_flush(a->c->sight), 0);
	assert_int_equal(stat_of(b, "fleet.sight.keys_in"), 1);
	assert_int_equal(put_block(b, 5, NULL), 0);
	seen = dram_list(b, 5);
	assert_int_not_equal(before, seen);
	assert_int_equal(dram_list(a, 5), before);
	assert_int_equal(kvfs_sight_flush(b->c->sight), 0);
	assert_int_equal(stat_of(a, "fleet.sight.keys_in"), 1);
	assert_int_equal(dram_list(a, 5), before);

	passes = dram_passes(b, 5);
	check_block(a, 5);
	drain(a);
	assert_int_equal(kvfs_sight_flush(a->c->sight), 0);
	assert_int_equal(stat_of(b, "fleet.sight.keys_in"), 2);
	assert_int_equal(dram_list(b, 5), seen);
	assert_int_equal(dram_passes(b, 5), passes + 1);
	check_block(b, 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_commit_read_sync, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_reject, setup, teardown),
		cmocka_unit_test_setup_teardown(test_exists, setup, teardown),
		cmocka_unit_test_setup_teardown(test_parent_rules, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_dram_pressure, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_pin, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_after_unlink, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_unlink_while_open, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_promote_after_unlink,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_unlink_open_then_load,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_ssd_pressure, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_recovery, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_map_repair, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_pin_restart_no_room,
						setup_big, teardown),
		cmocka_unit_test_setup_teardown(test_pin_restart_read_loads,
						setup_big, teardown),
		cmocka_unit_test_setup_teardown(test_pin_fails_not_recorded,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_fleet_sightings,
						setup_fleet, teardown_fleet),
		cmocka_unit_test_setup_teardown(test_fleet_sighting_held,
						setup_fleet, teardown_fleet),
		cmocka_unit_test_setup_teardown(test_remote_roundtrip,
						setup_remote, teardown),
	};

	kvfs_log_set_level(KVFS_LOG_ERR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
