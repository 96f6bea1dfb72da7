/* SPDX-License-Identifier: MIT */
/*
 * The remote tier on its in-process store (backend = memory): the key
 * format, reads and SET NX writes, every reject path of a value (each a
 * miss, counted, deleted, never returned), faults, write = off, and the
 * bounded write-back queue.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/util.h"
#include "tier/remote_i.h"
#include "tier/tier_remote.h"

static const struct kvfs_geom geom = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 4,
	.block_tokens = 8,
	.chunk_tokens = 4,
	.dtype = KVFS_DTYPE_F16,
};

struct blk {
	uint8_t root[KVFS_KEY_LEN];
	uint8_t key[KVFS_KEY_LEN];
	uint8_t *img;
	uint64_t len;
};

/* A valid root child of namespace "llama" with tokens @t0.. */
static void make_blk(struct blk *b, const char *ns, uint32_t t0)
{
	uint32_t toks[8];
	struct kvfs_fmt_hdr h;

	for (int i = 0; i < 8; i++)
		toks[i] = t0 + (uint32_t)i;
	kvfs_fmt_root_key(ns, NULL, b->root);
	b->len = kvfs_fmt_file_size(&geom, KVFS_KIND_KV, 8);
	b->img = calloc(1, b->len);
	assert_non_null(b->img);
	for (uint64_t i = kvfs_fmt_payload_off(8); i < b->len; i++)
		b->img[i] = (uint8_t)(i * 7 + t0);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, b->root, 0, toks,
					8, b->img + kvfs_fmt_payload_off(8),
					b->img, b->len),
			 0);
	memcpy(&h, b->img, sizeof(h));
	memcpy(b->key, h.key, KVFS_KEY_LEN);
}

static struct kvfs_tier_remote *mk(int write)
{
	struct kvfs_remote_conf c;
	struct kvfs_tier_remote *r;

	kvfs_remote_conf_defaults(&c);
	c.backend = KVFS_REMOTE_MEMORY;
	c.write = write;
	c.queue_blocks = 4;
	assert_int_equal(kvfs_tier_remote_new(&c, &r), 0);
	return r;
}

static struct kvfs_remote_ns ns_of(const struct blk *b)
{
	struct kvfs_remote_ns ns = { .root = b->root, .g = &geom };

	return ns;
}

static void test_key_format(void **state)
{
	uint8_t root[16], key[16];
	char out[KVFS_REMOTE_KEY_MAX];

	kvfs_fmt_root_key("llama", NULL, root);
	memset(key, 0xab, sizeof(key));
	assert_int_equal(kvfs_remote_key("kvfs", root, key, out, sizeof(out)),
			 4 + 1 + 32 + 1 + 32);
	assert_string_equal(out, "kvfs:feebf0027a7d68f558cfb7620bb8e449:"
				 "abababababababababababababababab");
	assert_int_equal(kvfs_remote_key("kvfs", root, key, out, 40),
			 -ENAMETOOLONG);
}

static void test_put_get(void **state)
{
	struct kvfs_tier_remote *r = mk(KVFS_REMOTE_WRITE_THROUGH);
	struct kvfs_remote_stats st;
	struct blk b;
	void *img;
	uint64_t len;

	make_blk(&b, "llama", 1);
	struct kvfs_remote_ns ns = ns_of(&b);

	assert_int_equal(kvfs_tier_remote_get(r, &ns, b.key, &img, &len),
			 -ENOENT);
	assert_null(img);
	assert_int_equal(kvfs_tier_remote_exists(r, b.root, b.key), -ENOENT);
	assert_int_equal(kvfs_tier_remote_put(r, b.root, b.key, b.img, b.len),
			 0);
	/* Immutable: a second SET NX is success and changes nothing. */
	assert_int_equal(kvfs_tier_remote_put(r, b.root, b.key, "x", 1), 0);
	assert_int_equal(kvfs_tier_remote_exists(r, b.root, b.key), 0);
	assert_int_equal(kvfs_tier_remote_get(r, &ns, b.key, &img, &len), 0);
	assert_int_equal(len, b.len);
	assert_memory_equal(img, b.img, b.len);
	free(img);
	kvfs_tier_remote_stats(r, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.bytes_read, b.len);
	assert_int_equal(st.bytes_written, b.len);
	assert_int_equal(st.rejected, 0);
	assert_int_equal(st.nodes, 1);
	assert_string_equal(kvfs_tier_name(kvfs_tier_remote_base(r)->id),
			    "remote");
	kvfs_tier_free(kvfs_tier_remote_base(r));
	free(b.img);
}

/* Store a corrupt version of a valid value under its key: the reader
 * gets a miss, the value is deleted, `rejected` counts it.
 */
static void reject_one(void (*breakit)(struct blk *b, uint8_t *v,
				       uint64_t *len))
{
	struct kvfs_tier_remote *r = mk(KVFS_REMOTE_WRITE_BACK);
	struct kvfs_remote_stats st;
	struct blk b;
	uint8_t *v;
	uint64_t vlen;
	void *img = (void *)1;
	uint64_t len = 1;

	make_blk(&b, "llama", 1);
	struct kvfs_remote_ns ns = ns_of(&b);

	v = malloc(b.len + 16);
	memcpy(v, b.img, b.len);
	vlen = b.len;
	breakit(&b, v, &vlen);
	assert_int_equal(kvfs_tier_remote_poke(r, b.root, b.key, v, vlen), 0);
	assert_int_equal(kvfs_remote_mem_count(kvfs_tier_remote_mem(r)), 1);
	assert_int_equal(kvfs_tier_remote_get(r, &ns, b.key, &img, &len),
			 -ENOENT);
	assert_null(img);
	assert_int_equal(len, 0);
	kvfs_tier_remote_stats(r, &st);
	assert_int_equal(st.rejected, 1);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.hits, 0);
	assert_int_equal(st.bytes_read, 0);
	/* gone from the store */
	assert_int_equal(kvfs_remote_mem_count(kvfs_tier_remote_mem(r)), 0);
	kvfs_tier_remote_free(r);
	free(v);
	free(b.img);
}

static void brk_empty(struct blk *b, uint8_t *v, uint64_t *len)
{
	*len = 0;
}

static void brk_short(struct blk *b, uint8_t *v, uint64_t *len)
{
	*len -= 1;
}

static void brk_long(struct blk *b, uint8_t *v, uint64_t *len)
{
	v[(*len)++] = 0;
}

static void brk_magic(struct blk *b, uint8_t *v, uint64_t *len)
{
	v[0] ^= 1;
}

static void brk_hdr_crc(struct blk *b, uint8_t *v, uint64_t *len)
{
	v[offsetof(struct kvfs_fmt_hdr, start_pos) + 7] ^= 1;
}

static void brk_payload(struct blk *b, uint8_t *v, uint64_t *len)
{
	v[*len - 1] ^= 0x80;
}

static void brk_token(struct blk *b, uint8_t *v, uint64_t *len)
{
	/* A token id changed with the payload intact: the key no longer
	 * is the chained hash. The header CRC does not cover the tokens.
	 */
	v[KVFS_FMT_HDR_SIZE] ^= 1;
}

/* A token changed and both CRCs repaired: only the chained hash can tell
 * the key does not belong to these tokens.
 */
static void brk_key_hash(struct blk *b, uint8_t *v, uint64_t *len)
{
	v[KVFS_FMT_HDR_SIZE] ^= 1;
	kvfs_util_put32(v + 80, kvfs_fmt_crc32c(0, v + KVFS_FMT_HDR_SIZE,
						*len - KVFS_FMT_HDR_SIZE));
	kvfs_util_put32(v + 84, kvfs_fmt_crc32c(0, v, 84));
	assert_int_equal(kvfs_fmt_validate(v, *len, &geom, NULL, b->root, 0,
					   NULL),
			 KVFS_FMT_EKEY);
}

/* Another block's valid image stored under this block's key. */
static void brk_other_key(struct blk *b, uint8_t *v, uint64_t *len)
{
	struct blk o;

	make_blk(&o, "llama", 100);
	assert_int_equal(o.len, *len);
	memcpy(v, o.img, o.len);
	free(o.img);
}

/* A block of another namespace (another root key) under this one's
 * prefix: its parent is not this namespace's root.
 */
static void brk_other_ns(struct blk *b, uint8_t *v, uint64_t *len)
{
	struct blk o;

	make_blk(&o, "qwen", 1);
	memcpy(v, o.img, o.len);
	memcpy(b->key, o.key, KVFS_KEY_LEN);
	free(o.img);
}

/* A valid block of another geometry. */
static void brk_geom(struct blk *b, uint8_t *v, uint64_t *len)
{
	struct kvfs_geom g = geom;
	uint32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint64_t n;

	g.head_dim = 8;
	n = kvfs_fmt_file_size(&g, KVFS_KIND_KV, 4);
	assert_true(n <= *len + 16);
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, b->root, 0, toks, 4,
					NULL, v, n),
			 0);
	memcpy(b->key, ((struct kvfs_fmt_hdr *)v)->key, KVFS_KEY_LEN);
	*len = n;
}

static void garbage(struct blk *b, uint8_t *v, uint64_t *len)
{
	memset(v, 'G', *len);
}

static void test_reject_empty(void **s)
{
	reject_one(brk_empty);
}
static void test_reject_short(void **s)
{
	reject_one(brk_short);
}
static void test_reject_long(void **s)
{
	reject_one(brk_long);
}
static void test_reject_magic(void **s)
{
	reject_one(brk_magic);
}
static void test_reject_hdr_crc(void **s)
{
	reject_one(brk_hdr_crc);
}
static void test_reject_payload_crc(void **s)
{
	reject_one(brk_payload);
}
static void test_reject_token(void **s)
{
	reject_one(brk_token);
}
static void test_reject_key_hash(void **s)
{
	reject_one(brk_key_hash);
}
static void test_reject_other_key(void **s)
{
	reject_one(brk_other_key);
}
static void test_reject_other_ns(void **s)
{
	reject_one(brk_other_ns);
}
static void test_reject_geom(void **s)
{
	reject_one(brk_geom);
}
static void test_reject_garbage(void **s)
{
	reject_one(garbage);
}

/* A batch mixes hits, misses and a reject; each gets its own result. */
static void test_getv(void **state)
{
	struct kvfs_tier_remote *r = mk(KVFS_REMOTE_WRITE_THROUGH);
	struct kvfs_remote_stats st;
	struct blk b[3];
	struct kvfs_remote_get g[3];

	for (int i = 0; i < 3; i++)
		make_blk(&b[i], "llama", 10 * (uint32_t)i + 1);
	struct kvfs_remote_ns ns = ns_of(&b[0]);

	assert_int_equal(kvfs_tier_remote_put(r, b[0].root, b[0].key, b[0].img,
					      b[0].len),
			 0);
	assert_int_equal(
		kvfs_tier_remote_poke(r, b[2].root, b[2].key, "bad", 3), 0);
	for (int i = 0; i < 3; i++)
		g[i].key = b[i].key;
	assert_int_equal(kvfs_tier_remote_getv(r, &ns, g, 3), 0);
	assert_int_equal(g[0].res, 0);
	assert_int_equal(g[0].len, b[0].len);
	assert_int_equal(g[0].hdr.n_tokens, 8);
	assert_memory_equal(g[0].img, b[0].img, b[0].len);
	assert_int_equal(g[1].res, -ENOENT);
	assert_int_equal(g[2].res, -ENOENT);
	assert_null(g[2].img);
	free(g[0].img);
	kvfs_tier_remote_stats(r, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.rejected, 1);
	kvfs_tier_remote_free(r);
	for (int i = 0; i < 3; i++)
		free(b[i].img);
}

static void test_faults(void **state)
{
	struct kvfs_tier_remote *r = mk(KVFS_REMOTE_WRITE_THROUGH);
	struct kvfs_remote_stats st;
	struct blk b;
	void *img;
	uint64_t len;

	make_blk(&b, "llama", 1);
	struct kvfs_remote_ns ns = ns_of(&b);

	kvfs_remote_mem_fault(kvfs_tier_remote_mem(r), -ETIMEDOUT);
	assert_int_equal(kvfs_tier_remote_put(r, b.root, b.key, b.img, b.len),
			 -ETIMEDOUT);
	assert_int_equal(kvfs_tier_remote_get(r, &ns, b.key, &img, &len),
			 -ETIMEDOUT);
	assert_null(img);
	kvfs_tier_remote_stats(r, &st);
	assert_int_equal(st.errors, 2);
	assert_int_equal(st.bytes_written, 0);
	kvfs_remote_mem_fault(kvfs_tier_remote_mem(r), 0);
	assert_int_equal(kvfs_tier_remote_put(r, b.root, b.key, b.img, b.len),
			 0);
	kvfs_tier_remote_free(r);
	free(b.img);
}

static void test_write_off(void **state)
{
	struct kvfs_tier_remote *r = mk(KVFS_REMOTE_WRITE_OFF);
	struct blk b;

	make_blk(&b, "llama", 1);
	assert_int_equal(kvfs_tier_remote_put(r, b.root, b.key, b.img, b.len),
			 -EROFS);
	assert_int_equal(kvfs_tier_remote_queue(r, b.root, b.key, b.img, b.len),
			 -EROFS);
	assert_int_equal(kvfs_remote_mem_count(kvfs_tier_remote_mem(r)), 0);
	kvfs_tier_remote_free(r);
	free(b.img);
}

static void test_queue(void **state)
{
	struct kvfs_tier_remote *r = mk(KVFS_REMOTE_WRITE_BACK);
	struct kvfs_remote_mem *m = kvfs_tier_remote_mem(r);
	struct kvfs_remote_stats st;
	struct blk b[10];

	for (int i = 0; i < 10; i++)
		make_blk(&b[i], "llama", 10 * (uint32_t)i + 1);
	/* Sent in the background. */
	for (int i = 0; i < 3; i++)
		assert_int_equal(kvfs_tier_remote_queue(r, b[i].root, b[i].key,
							b[i].img, b[i].len),
				 0);
	assert_int_equal(kvfs_tier_remote_drain(r, 5000), 0);
	assert_int_equal(kvfs_remote_mem_count(m), 3);
	/* A store that fails: the queue keeps at most 4 blocks, dropping
	 * the oldest, and never waits.
	 */
	kvfs_remote_mem_fault(m, -EHOSTDOWN);
	for (int i = 3; i < 10; i++)
		assert_int_equal(kvfs_tier_remote_queue(r, b[i].root, b[i].key,
							b[i].img, b[i].len),
				 0);
	assert_int_equal(kvfs_tier_remote_drain(r, 100), -ETIMEDOUT);
	kvfs_tier_remote_stats(r, &st);
	assert_true(st.queued <= 4);
	assert_true(st.dropped >= 3);
	assert_true(st.errors >= 1);
	/* The store back: what is left drains. */
	kvfs_remote_mem_fault(m, 0);
	assert_int_equal(kvfs_tier_remote_drain(r, 10000), 0);
	kvfs_tier_remote_stats(r, &st);
	assert_int_equal(st.queued, 0);
	assert_int_equal(kvfs_remote_mem_count(m), 3 + 7 - st.dropped);
	/* The last blocks queued are the ones kept. */
	assert_int_equal(kvfs_tier_remote_exists(r, b[9].root, b[9].key), 0);
	/* Larger than the whole queue. */
	assert_int_equal(kvfs_tier_remote_queue(r, b[0].root, b[0].key,
						b[0].img, 1ull << 40),
			 -E2BIG);
	kvfs_tier_remote_free(r);
	for (int i = 0; i < 10; i++)
		free(b[i].img);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_format),
		cmocka_unit_test(test_put_get),
		cmocka_unit_test(test_reject_empty),
		cmocka_unit_test(test_reject_short),
		cmocka_unit_test(test_reject_long),
		cmocka_unit_test(test_reject_magic),
		cmocka_unit_test(test_reject_hdr_crc),
		cmocka_unit_test(test_reject_payload_crc),
		cmocka_unit_test(test_reject_token),
		cmocka_unit_test(test_reject_key_hash),
		cmocka_unit_test(test_reject_other_key),
		cmocka_unit_test(test_reject_other_ns),
		cmocka_unit_test(test_reject_geom),
		cmocka_unit_test(test_reject_garbage),
		cmocka_unit_test(test_getv),
		cmocka_unit_test(test_faults),
		cmocka_unit_test(test_write_off),
		cmocka_unit_test(test_queue),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
