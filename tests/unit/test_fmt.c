/* SPDX-License-Identifier: MIT */
/*
 * Block format: keys, sizes, and every rejection path of kvfs_fmt_validate().
 * Each rejection test builds a valid block, breaks exactly one thing and
 * repairs the checksums so that only the intended check can fail.
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

/* Small geometry: 2 layers, 2 heads, dim 4, f16, 8-token blocks, 4-token
 * chunks, hidden size 8.  A 6-token block has a partial second chunk.
 */
static const struct kvfs_geom geom = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 4,
	.hidden_size = 8,
	.block_tokens = 8,
	.chunk_tokens = 4,
	.dtype = KVFS_DTYPE_F16,
};

static const uint32_t toks[6] = { 1, 2, 3, 4, 5, 100000 };

/* Computed independently:
 * python3 -c 'import hashlib; print(hashlib.sha256(
 *     b"kvfs-ns-v1\0llama\0").digest()[:16].hex())'
 */
static const char root_llama_hex[] = "feebf0027a7d68f558cfb7620bb8e449";
/* salt "pepper" */
static const char root_pepper_hex[] = "1c0667365313a067b2cdac4d22ec8051";
/* salt "pepper", model_digest "sha256:abc":
 * sha256(b"kvfs-ns-v1\0llama\0pepper\0sha256:abc")[:16]
 */
static const char root_model_hex[] = "4b3210b5bdf5821367a95f2569d73943";
/* sha256(root_llama ‖ pack("<6I", 1, 2, 3, 4, 5, 100000))[:16] */
static const char blk_hex[] = "2c88ab5eb7ad8b64bab72bd636ee5b11";
/* sha256(blk ‖ pack("<I", 0xdeadbeef))[:16] */
static const char blk2_hex[] = "9111e299d38eed85a7436aadc98502e8";

struct blk {
	uint8_t root[KVFS_KEY_LEN];
	uint8_t key[KVFS_KEY_LEN];
	uint8_t *buf;
	uint64_t len;
};

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void fix_hdr_crc(struct blk *b)
{
	put32(b->buf + 84, kvfs_fmt_crc32c(0, b->buf, 84));
}

static void fix_crcs(struct blk *b)
{
	put32(b->buf + 80, kvfs_fmt_crc32c(0, b->buf + KVFS_FMT_HDR_SIZE,
					   b->len - KVFS_FMT_HDR_SIZE));
	fix_hdr_crc(b);
}

/* A valid block of @n tokens of toks[] (cycled) under @g. */
static void make_kind(struct blk *b, const struct kvfs_geom *g, uint16_t kind,
		      uint32_t n)
{
	uint32_t t[64];

	assert_true(n <= 64);
	for (uint32_t i = 0; i < n; i++)
		t[i] = toks[i % 6] + i / 6;
	kvfs_fmt_root_key("llama", NULL, b->root);
	b->len = kvfs_fmt_file_size(g, kind, n);
	assert_true(b->len > 0);
	b->buf = malloc(b->len);
	assert_non_null(b->buf);
	for (uint64_t i = 0; i < b->len; i++)
		b->buf[i] = (uint8_t)(i * 7 + 3);
	assert_int_equal(kvfs_fmt_build(g, kind, b->root, 0, t, n, NULL,
					b->buf, b->len), 0);
	memcpy(b->key, b->buf + 64, KVFS_KEY_LEN);
}

static void make(struct blk *b)
{
	make_kind(b, &geom, KVFS_KIND_KV, 6);
}

static void expect(struct blk *b, enum kvfs_fmt_err want, int want_errno)
{
	enum kvfs_fmt_err e = kvfs_fmt_validate(b->buf, b->len, &geom, b->key,
						b->root, 0, NULL);

	assert_int_equal(e, want);
	assert_int_equal(kvfs_fmt_errno(e), want_errno);
	assert_non_null(kvfs_fmt_strerror(e));
	free(b->buf);
}

static void hex_key(const char *hex, uint8_t out[KVFS_KEY_LEN])
{
	assert_int_equal(kvfs_fmt_key_parse(hex, out), 0);
}

/* ---- checksums, keys, names ---- */

static void test_crc_check_value(void **state)
{
	const char *s = "123456789";

	assert_int_equal(kvfs_fmt_crc32c(0, s, 9), 0xE3069283u);
	/* In pieces gives the same value. */
	assert_int_equal(kvfs_fmt_crc32c(kvfs_fmt_crc32c(0, s, 4), s + 4, 5),
			 0xE3069283u);
	assert_int_equal(kvfs_fmt_crc32c(0, s, 0), 0);
}

static void test_root_key_vectors(void **state)
{
	uint8_t k[KVFS_KEY_LEN], want[KVFS_KEY_LEN];

	kvfs_fmt_root_key("llama", NULL, k);
	hex_key(root_llama_hex, want);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	kvfs_fmt_root_key("llama", "", k);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	kvfs_fmt_root_key("llama", "pepper", k);
	hex_key(root_pepper_hex, want);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	/* without a model digest, the same keys as before */
	kvfs_fmt_root_key_model("llama", "pepper", NULL, k);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	kvfs_fmt_root_key_model("llama", "pepper", "", k);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	kvfs_fmt_root_key_model("llama", "pepper", "sha256:abc", k);
	hex_key(root_model_hex, want);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
}

static void test_block_key_vectors(void **state)
{
	uint8_t root[KVFS_KEY_LEN], k[KVFS_KEY_LEN], k2[KVFS_KEY_LEN];
	uint8_t want[KVFS_KEY_LEN];
	uint32_t t2 = 0xdeadbeef;
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_fmt_root_key("llama", NULL, root);
	kvfs_fmt_block_key(root, toks, 6, k);
	kvfs_fmt_key_hex(k, hex);
	assert_string_equal(hex, blk_hex);
	kvfs_fmt_block_key(k, &t2, 1, k2);
	hex_key(blk2_hex, want);
	assert_memory_equal(k2, want, KVFS_KEY_LEN);
}

static void test_build_key_matches(void **state)
{
	struct blk b;
	char hex[KVFS_KEY_HEX_LEN + 1];

	make(&b);
	kvfs_fmt_key_hex(b.key, hex);
	assert_string_equal(hex, blk_hex);
	free(b.buf);
}

static void test_key_hex_parse(void **state)
{
	uint8_t k[KVFS_KEY_LEN], k2[KVFS_KEY_LEN];
	char hex[KVFS_KEY_HEX_LEN + 1];

	assert_int_equal(kvfs_fmt_key_parse(blk_hex, k), 0);
	kvfs_fmt_key_hex(k, hex);
	assert_string_equal(hex, blk_hex);
	assert_int_equal(kvfs_fmt_key_parse("2C88AB5EB7AD8B64BAB72BD636EE5B11",
					    k2), 0);
	assert_memory_equal(k, k2, KVFS_KEY_LEN);
	/* wrong length, non-hex */
	assert_int_equal(kvfs_fmt_key_parse("2c88ab5eb7ad8b64bab72bd636ee5b1",
					    k2), -EINVAL);
	assert_int_equal(kvfs_fmt_key_parse("2c88ab5eb7ad8b64bab72bd636ee5b111",
					    k2), -EINVAL);
	assert_int_equal(kvfs_fmt_key_parse("2c88ab5eb7ad8b64bab72bd636ee5bg1",
					    k2), -EINVAL);
	assert_int_equal(kvfs_fmt_key_parse("", k2), -EINVAL);
	assert_int_equal(kvfs_fmt_key_parse(NULL, k2), -EINVAL);
}

static void test_name_parse(void **state)
{
	uint8_t k[KVFS_KEY_LEN], want[KVFS_KEY_LEN];

	hex_key(blk_hex, want);
	assert_int_equal(kvfs_fmt_name_parse(
		"2c88ab5eb7ad8b64bab72bd636ee5b11.kv", k), 0);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	memset(k, 0, sizeof(k));
	assert_int_equal(kvfs_fmt_name_parse(
		"2C88AB5EB7AD8B64BAB72BD636EE5B11.kv", k), 0);
	assert_memory_equal(k, want, KVFS_KEY_LEN);
	/* missing .kv, other extension, wrong length, non-hex */
	assert_int_equal(kvfs_fmt_name_parse(blk_hex, k), -EINVAL);
	assert_int_equal(kvfs_fmt_name_parse(
		"2c88ab5eb7ad8b64bab72bd636ee5b11.kx", k), -EINVAL);
	assert_int_equal(kvfs_fmt_name_parse(
		"2c88ab5eb7ad8b64bab72bd636ee5b11.kv~", k), -EINVAL);
	assert_int_equal(kvfs_fmt_name_parse(
		"2c88ab5eb7ad8b64bab72bd636ee5b1.kv", k), -EINVAL);
	assert_int_equal(kvfs_fmt_name_parse(
		"zc88ab5eb7ad8b64bab72bd636ee5b11.kv", k), -EINVAL);
	assert_int_equal(kvfs_fmt_name_parse(".kv", k), -EINVAL);
}

static void test_dtypes(void **state)
{
	assert_int_equal(kvfs_fmt_dtype_size(KVFS_DTYPE_F16), 2);
	assert_int_equal(kvfs_fmt_dtype_size(KVFS_DTYPE_BF16), 2);
	assert_int_equal(kvfs_fmt_dtype_size(KVFS_DTYPE_F32), 4);
	assert_int_equal(kvfs_fmt_dtype_size(KVFS_DTYPE_F8_E4M3), 1);
	assert_int_equal(kvfs_fmt_dtype_size(0), 0);
	assert_int_equal(kvfs_fmt_dtype_size(5), 0);
	assert_string_equal(kvfs_fmt_dtype_name(KVFS_DTYPE_F8_E4M3), "f8_e4m3");
	assert_null(kvfs_fmt_dtype_name(0));
	assert_null(kvfs_fmt_dtype_name(99));
	assert_int_equal(kvfs_fmt_dtype_parse("bf16"), KVFS_DTYPE_BF16);
	assert_int_equal(kvfs_fmt_dtype_parse("f32"), KVFS_DTYPE_F32);
	assert_int_equal(kvfs_fmt_dtype_parse("f64"), -EINVAL);
	assert_int_equal(kvfs_fmt_dtype_parse(""), -EINVAL);
}

/* ---- sizes and ranges ---- */

static void test_sizes_llama(void **state)
{
	const struct kvfs_geom g = {
		.n_layers = 32, .n_kv_heads = 8, .head_dim = 128,
		.block_tokens = 16, .chunk_tokens = 16,
		.dtype = KVFS_DTYPE_BF16,
	};
	/* 32 layers * 16 tokens * 8 heads * 128 dim * 2 (K, V) * 2 bytes */
	const uint64_t pay = 32ull * 16 * 8 * 128 * 2 * 2;

	assert_int_equal(pay, 2097152);
	assert_int_equal(kvfs_fmt_payload_size(&g, KVFS_KIND_KV, 16), pay);
	/* a partial block still holds one whole chunk per layer */
	assert_int_equal(kvfs_fmt_payload_size(&g, KVFS_KIND_KV, 1), pay);
	assert_int_equal(kvfs_fmt_payload_off(16), 8192);
	assert_int_equal(kvfs_fmt_payload_off(1024), 8192);
	assert_int_equal(kvfs_fmt_payload_off(1025), 12288);
	assert_int_equal(kvfs_fmt_file_size(&g, KVFS_KIND_KV, 16), 8192 + pay);
	assert_int_equal(kvfs_fmt_max_file_size(&g), 8192 + pay);
	/* No hidden size: no HIDDEN blocks. */
	assert_int_equal(kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN, 16), 0);
	assert_int_equal(kvfs_fmt_file_size(&g, KVFS_KIND_KV, 0), 0);
	assert_int_equal(kvfs_fmt_file_size(&g, 7, 16), 0);
}

static void test_sizes_hidden_and_overflow(void **state)
{
	struct kvfs_geom g = geom;

	/* 2 layers * 2 chunks * 4 rows * 8 hidden * 2 bytes */
	assert_int_equal(kvfs_fmt_payload_size(&g, KVFS_KIND_HIDDEN, 6), 256);
	/* KV at 8 tokens: 2 * 2 * (4 * 2 * 4 * 2 * 2) = 512 > hidden 256 */
	assert_int_equal(kvfs_fmt_max_file_size(&g), 8192 + 512);
	g.hidden_size = 1024;
	assert_int_equal(kvfs_fmt_max_file_size(&g), 8192 + 2 * 2 * 4 * 1024 * 2);
	g.n_layers = UINT32_MAX;
	g.n_kv_heads = UINT32_MAX;
	g.head_dim = UINT32_MAX;
	assert_int_equal(kvfs_fmt_payload_size(&g, KVFS_KIND_KV, 8), 0);
	assert_int_equal(kvfs_fmt_file_size(&g, KVFS_KIND_KV, 8), 0);
	g = geom;
	g.chunk_tokens = 0;
	assert_int_equal(kvfs_fmt_payload_size(&g, KVFS_KIND_KV, 8), 0);
	g = geom;
	g.dtype = 9;
	assert_int_equal(kvfs_fmt_payload_size(&g, KVFS_KIND_KV, 8), 0);
}

static void test_chunk_range_partial(void **state)
{
	/* 6 tokens in chunks of 4: chunk 1 is partial but stored whole.
	 * One chunk is K[4][2][4] + V[4][2][4] of f16 = 128 bytes, and the
	 * payload is layer 0 {c0, c1}, layer 1 {c0, c1}.
	 */
	uint64_t off, len, base = kvfs_fmt_payload_off(6);

	assert_int_equal(base, 8192);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, 0, 0, &off, &len), 0);
	assert_int_equal(off, base);
	assert_int_equal(len, 128);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, 0, 1, &off, &len), 0);
	assert_int_equal(off, base + 128);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, 1, 1, &off, &len), 0);
	assert_int_equal(off, base + 3 * 128);
	assert_int_equal(off + len, kvfs_fmt_file_size(&geom, KVFS_KIND_KV, 6));
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, 1, 2, &off, &len),
			 -EINVAL);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, 2, 0, &off, &len),
			 -EINVAL);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 4, 0, 1, &off, &len),
			 -EINVAL);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 0, 0, 0, &off, &len),
			 -EINVAL);
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 9, 0, 0, &off, &len),
			 -EINVAL);
}

/* ---- build ---- */

static void test_build_rejects(void **state)
{
	uint8_t root[KVFS_KEY_LEN] = { 0 };
	uint64_t len = kvfs_fmt_max_file_size(&geom);
	uint8_t *buf = malloc(len);
	struct kvfs_geom g = geom;

	assert_non_null(buf);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, root, 0, toks, 0,
					NULL, buf, len), -EINVAL);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, root, 0, toks, 9,
					NULL, buf, len), -EINVAL);
	assert_int_equal(kvfs_fmt_build(&geom, 3, root, 0, toks, 6, NULL, buf,
					len), -EINVAL);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, root, 0, toks, 6,
					NULL, buf,
					kvfs_fmt_file_size(&geom, 1, 6) - 1),
			 -EINVAL);
	g.hidden_size = 0;
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_HIDDEN, root, 0, toks, 6,
					NULL, buf, len), -EINVAL);
	free(buf);
}

static void test_build_payload_copy(void **state)
{
	uint64_t len = kvfs_fmt_file_size(&geom, KVFS_KIND_KV, 6);
	uint64_t off = kvfs_fmt_payload_off(6);
	uint8_t *buf = calloc(1, len), *pay = malloc(len - off);
	uint8_t root[KVFS_KEY_LEN];
	struct kvfs_fmt_hdr h;

	assert_non_null(buf);
	assert_non_null(pay);
	for (uint64_t i = 0; i < len - off; i++)
		pay[i] = (uint8_t)(i ^ 0x5a);
	kvfs_fmt_root_key("llama", NULL, root);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, root, 0, toks, 6,
					pay, buf, len), 0);
	/* Layer 0's first chunk is copied as given; rows past the sixth
	 * token of the last chunk are padding and come out zero.
	 */
	uint64_t coff, clen;
	assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, 0, 0, &coff, &clen), 0);
	assert_memory_equal(buf + coff, pay + (coff - off), clen);
	assert_int_equal(kvfs_fmt_validate(buf, len, &geom, NULL, root, 0, NULL),
			 KVFS_FMT_OK);
	assert_memory_equal(buf, KVFS_FMT_MAGIC, 8);
	/* token ids are little-endian right after the header */
	assert_int_equal(buf[4096 + 20], 100000 & 0xff);
	assert_int_equal(buf[4096 + 21], (100000 >> 8) & 0xff);
	assert_int_equal(buf[4096 + 22], 100000 >> 16);
	assert_int_equal(kvfs_fmt_validate(buf, len, &geom, NULL, root, 0, &h),
			 KVFS_FMT_OK);
	assert_int_equal(h.n_tokens, 6);
	assert_int_equal(h.version, 1);
	assert_int_equal(h.hidden_size, 8);
	free(pay);
	free(buf);
}

/* ---- validation: valid blocks ---- */

static void test_valid_root_child(void **state)
{
	struct blk b;
	struct kvfs_fmt_hdr h;

	make(&b);
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   0, &h), KVFS_FMT_OK);
	assert_int_equal(h.kind, KVFS_KIND_KV);
	assert_int_equal(h.n_tokens, 6);
	assert_int_equal(h.start_pos, 0);
	assert_memory_equal(h.parent, b.root, KVFS_KEY_LEN);
	assert_memory_equal(h.key, b.key, KVFS_KEY_LEN);
	assert_int_equal(kvfs_fmt_errno(KVFS_FMT_OK), 0);
	expect(&b, KVFS_FMT_OK, 0);
}

static void test_valid_full_and_child(void **state)
{
	uint8_t root[KVFS_KEY_LEN], parent[KVFS_KEY_LEN];
	uint64_t len = kvfs_fmt_file_size(&geom, KVFS_KIND_KV, 8);
	uint8_t *buf = calloc(1, len);
	uint32_t t[8] = { 9, 8, 7, 6, 5, 4, 3, 2 };

	assert_non_null(buf);
	kvfs_fmt_root_key("llama", NULL, root);
	kvfs_fmt_block_key(root, t, 8, parent);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, parent, 16, t, 8,
					NULL, buf, len), 0);
	assert_int_equal(kvfs_fmt_validate(buf, len, &geom, NULL, root, 0,
					   NULL), KVFS_FMT_OK);
	free(buf);
}

static void test_valid_kv_without_hidden_size(void **state)
{
	struct kvfs_geom g = geom;
	struct blk b;

	/* a KV block may carry hidden_size 0 in a namespace that knows it */
	g.hidden_size = 0;
	make_kind(&b, &g, KVFS_KIND_KV, 6);
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   0, NULL), KVFS_FMT_OK);
	free(b.buf);
}

static void test_hidden_allowed(void **state)
{
	struct blk b;

	make_kind(&b, &geom, KVFS_KIND_HIDDEN, 6);
	assert_int_equal(b.len, 8192 + 256);
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   KVFS_FMT_ALLOW_HIDDEN, NULL),
			 KVFS_FMT_OK);
	expect(&b, KVFS_FMT_EKIND, -EINVAL);
}

/* A MIXED block under @g: hidden rows for layers below @kv_from. */
static void make_mixed(struct blk *b, const struct kvfs_geom *g,
		       uint32_t kv_from, uint32_t n)
{
	uint32_t t[64];

	assert_true(n <= 64);
	for (uint32_t i = 0; i < n; i++)
		t[i] = toks[i % 6] + i / 6;
	kvfs_fmt_root_key("llama", NULL, b->root);
	b->len = kvfs_fmt_split_file_size(g, n, kv_from);
	assert_true(b->len > 0);
	b->buf = malloc(b->len);
	assert_non_null(b->buf);
	for (uint64_t i = 0; i < b->len; i++)
		b->buf[i] = (uint8_t)(i * 7 + 3);
	assert_int_equal(kvfs_fmt_build_split(g, kv_from, b->root, 0, t, n,
					      NULL, b->buf, b->len), 0);
	memcpy(b->key, b->buf + 64, KVFS_KEY_LEN);
}

/* Split layouts by hand: 6 tokens are 2 chunks; a hidden layer is
 * 2 * 4 rows * 8 * 2 B = 128 B, a KV layer 2 * 2 planes * 4 * 8 * 2 = 256.
 */
static void test_split_sizes_and_ranges(void **state)
{
	struct kvfs_geom g4 = geom;
	uint64_t off, len, po = kvfs_fmt_payload_off(6);

	assert_int_equal(kvfs_fmt_split_payload_size(&geom, 6, 0), 512);
	assert_int_equal(kvfs_fmt_split_payload_size(&geom, 6, 1), 384);
	assert_int_equal(kvfs_fmt_split_payload_size(&geom, 6, 2), 256);
	assert_int_equal(kvfs_fmt_split_payload_size(&geom, 6, 3), 0);
	assert_int_equal(kvfs_fmt_split_file_size(&geom, 6, 1), po + 384);
	assert_int_equal(kvfs_fmt_split_payload_size(&geom, 6, 0),
			 kvfs_fmt_payload_size(&geom, KVFS_KIND_KV, 6));
	assert_int_equal(kvfs_fmt_split_payload_size(&geom, 6, 2),
			 kvfs_fmt_payload_size(&geom, KVFS_KIND_HIDDEN, 6));
	/* MIXED has no size without its split */
	assert_int_equal(kvfs_fmt_payload_size(&geom, KVFS_KIND_MIXED, 6), 0);
	assert_int_equal(kvfs_fmt_split_kind(&geom, 0), KVFS_KIND_KV);
	assert_int_equal(kvfs_fmt_split_kind(&geom, 1), KVFS_KIND_MIXED);
	assert_int_equal(kvfs_fmt_split_kind(&geom, 2), KVFS_KIND_HIDDEN);

	/* layer 0 hidden, layer 1 KV right after it */
	assert_int_equal(kvfs_fmt_layer_range(&geom, 6, 1, 0, &off, &len), 0);
	assert_int_equal(off, po);
	assert_int_equal(len, 128);
	assert_int_equal(kvfs_fmt_layer_range(&geom, 6, 1, 1, &off, &len), 0);
	assert_int_equal(off, po + 128);
	assert_int_equal(len, 256);
	assert_int_equal(kvfs_fmt_piece_range(&geom, 6, 1, 0, 1, &off, &len),
			 0);
	assert_int_equal(off, po + 64);
	assert_int_equal(len, 64);
	assert_int_equal(kvfs_fmt_piece_range(&geom, 6, 1, 1, 1, &off, &len),
			 0);
	assert_int_equal(off, po + 128 + 128);
	assert_int_equal(len, 128);
	assert_int_equal(kvfs_fmt_piece_range(&geom, 6, 1, 1, 2, &off, &len),
			 -EINVAL);
	assert_int_equal(kvfs_fmt_layer_range(&geom, 6, 1, 2, &off, &len),
			 -EINVAL);
	assert_int_equal(kvfs_fmt_layer_range(&geom, 6, 3, 0, &off, &len),
			 -EINVAL);
	/* kv_from 0 is the KV layout of kvfs_fmt_chunk_range() */
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t c = 0; c < 2; c++) {
			uint64_t o2, l2;

			assert_int_equal(kvfs_fmt_chunk_range(&geom, 6, l, c,
							      &off, &len), 0);
			assert_int_equal(kvfs_fmt_piece_range(&geom, 6, 0, l,
							      c, &o2, &l2), 0);
			assert_int_equal(off, o2);
			assert_int_equal(len, l2);
		}
	/* a hidden layer needs hidden_size */
	g4.hidden_size = 0;
	assert_int_equal(kvfs_fmt_split_payload_size(&g4, 6, 1), 0);
	assert_int_equal(kvfs_fmt_split_payload_size(&g4, 6, 0), 512);
}

static void test_mixed_build_validate(void **state)
{
	struct blk b;
	struct kvfs_fmt_hdr h;
	uint64_t off, len;

	make_mixed(&b, &geom, 1, 6);
	assert_int_equal(b.len, kvfs_fmt_payload_off(6) + 384);
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   KVFS_FMT_ALLOW_MIXED, &h),
			 KVFS_FMT_OK);
	assert_int_equal(h.kind, KVFS_KIND_MIXED);
	assert_int_equal(h.kv_from, 1);
	assert_int_equal(kvfs_fmt_hdr_kv_from(&h), 1);
	/* the padding rows of both layers' last chunks were cleared */
	assert_int_equal(kvfs_fmt_piece_range(&geom, 6, 1, 0, 1, &off, &len),
			 0);
	for (uint64_t i = 2 * 16; i < len; i++)
		assert_int_equal(b.buf[off + i], 0);
	/* a client may never write one, even with hidden states allowed */
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   KVFS_FMT_ALLOW_HIDDEN, NULL),
			 KVFS_FMT_EKIND);
	expect(&b, KVFS_FMT_EKIND, -EINVAL);

	/* build_split picks the plain kinds at the ends */
	make_mixed(&b, &geom, 0, 6);
	assert_int_equal(b.buf[10], KVFS_KIND_KV);
	assert_int_equal(b.buf[14], 0);
	expect(&b, KVFS_FMT_OK, 0);
	make_mixed(&b, &geom, 2, 6);
	assert_int_equal(b.buf[10], KVFS_KIND_HIDDEN);
	assert_int_equal(b.buf[14], 0);
	free(b.buf);
}

/*
 * An image built in pieces (kvfs_fmt_tokens_put(), each layer's padding
 * cleared and summed in order, kvfs_fmt_hdr_put() with that sum) is the
 * image kvfs_fmt_build_split() builds, for every split of a 6-token block
 * (a partial last chunk), from a buffer full of junk.
 */
static void test_build_in_pieces(void **state)
{
	uint32_t t[6];
	uint8_t root[KVFS_KEY_LEN];

	for (uint32_t i = 0; i < 6; i++)
		t[i] = toks[i];
	kvfs_fmt_root_key("llama", NULL, root);
	for (uint32_t kv_from = 0; kv_from <= geom.n_layers; kv_from++) {
		uint64_t len = kvfs_fmt_split_file_size(&geom, 6, kv_from);
		uint64_t po = kvfs_fmt_payload_off(6), end = po, off, l;
		uint8_t *want = malloc(len), *got = malloc(len);
		uint32_t crc;

		assert_non_null(want);
		assert_non_null(got);
		for (uint64_t i = 0; i < len; i++)
			want[i] = got[i] = (uint8_t)(i * 13 + 5);
		assert_int_equal(kvfs_fmt_build_split(&geom, kv_from, root, 0,
						      t, 6, NULL, want, len),
				 0);
		kvfs_fmt_tokens_put(got, t, 6);
		crc = kvfs_fmt_crc32c(0, got + KVFS_FMT_HDR_SIZE,
				      po - KVFS_FMT_HDR_SIZE);
		for (uint32_t layer = 0; layer < geom.n_layers; layer++) {
			assert_int_equal(kvfs_fmt_layer_range(&geom, 6, kv_from,
							      layer, &off, &l),
					 0);
			assert_int_equal(off, end);
			kvfs_fmt_layer_tail_clear(&geom, kv_from, 6, layer,
						  got);
			crc = kvfs_fmt_crc32c(crc, got + off, l);
			end = off + l;
		}
		assert_int_equal(end, len);
		assert_int_equal(kvfs_fmt_hdr_put(&geom, kv_from, root, 0, 6,
						  crc, got, len),
				 0);
		assert_memory_equal(got, want, len);
		/* the arguments build_split refuses */
		assert_int_equal(kvfs_fmt_hdr_put(&geom, kv_from, root, 0, 6,
						  crc, got, len - 1),
				 -EINVAL);
		assert_int_equal(kvfs_fmt_hdr_put(&geom, kv_from, root, 0, 9,
						  crc, got, len),
				 -EINVAL);
		assert_int_equal(kvfs_fmt_hdr_put(&geom, geom.n_layers + 1,
						  root, 0, 6, crc, got, len),
				 -EINVAL);
		free(want);
		free(got);
	}
}

static void test_mixed_rejects(void **state)
{
	struct blk b;
	uint32_t t[6] = { 1, 2, 3, 4, 5, 6 };
	uint8_t buf[16384];
	struct kvfs_geom g0 = geom;

	/* kv_from must leave both forms some layers */
	for (uint32_t kv_from = 0; kv_from <= 2; kv_from += 2) {
		make_mixed(&b, &geom, 1, 6);
		b.buf[14] = (uint8_t)kv_from;
		fix_hdr_crc(&b);
		assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key,
						   b.root,
						   KVFS_FMT_ALLOW_MIXED, NULL),
				 KVFS_FMT_EGEOM);
		free(b.buf);
	}
	/* the split decides the size */
	make_mixed(&b, &geom, 1, 6);
	b.len -= 64;
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   KVFS_FMT_ALLOW_MIXED, NULL),
			 KVFS_FMT_ESIZE);
	free(b.buf);
	/* a dirty padding row of the hidden layer */
	make_mixed(&b, &geom, 1, 6);
	b.buf[kvfs_fmt_payload_off(6) + 127] = 1;
	fix_crcs(&b);
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   KVFS_FMT_ALLOW_MIXED, NULL),
			 KVFS_FMT_EPAD);
	free(b.buf);
	/* the namespace must know hidden_size */
	make_mixed(&b, &geom, 1, 6);
	g0.hidden_size = 0;
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &g0, b.key, b.root,
					   KVFS_FMT_ALLOW_MIXED, NULL),
			 KVFS_FMT_EGEOM);
	free(b.buf);
	/* and build refuses what it could not describe */
	assert_int_equal(kvfs_fmt_build_split(&geom, 3, b.root, 0, t, 6, NULL,
					      buf, sizeof(buf)), -EINVAL);
	assert_int_equal(kvfs_fmt_build_split(&g0, 1, b.root, 0, t, 6, NULL,
					      buf, sizeof(buf)), -EINVAL);
	assert_int_equal(kvfs_fmt_build_split(&geom, 1, b.root, 0, t, 6, NULL,
					      buf, 8192 + 383), -EINVAL);
}

/* ---- validation: one test per rejection path ---- */

static void test_reject_too_short(void **state)
{
	struct blk b;

	make(&b);
	b.len = KVFS_FMT_HDR_SIZE - 1;
	expect(&b, KVFS_FMT_ETOOSHORT, -EINVAL);
}

static void test_reject_magic(void **state)
{
	struct blk b;

	make(&b);
	b.buf[7] = '2';
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EMAGIC, -EINVAL);
}

static void test_reject_version(void **state)
{
	struct blk b;

	make(&b);
	b.buf[8] = 2;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EVERSION, -EINVAL);
}

static void test_reject_kind(void **state)
{
	struct blk b;

	make(&b);
	b.buf[10] = 3;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EKIND, -EINVAL);
}

static void test_reject_hidden_kind(void **state)
{
	struct blk b;

	make_kind(&b, &geom, KVFS_KIND_HIDDEN, 6);
	expect(&b, KVFS_FMT_EKIND, -EINVAL);
}

static void test_reject_dtype_unknown(void **state)
{
	struct blk b;

	make(&b);
	b.buf[12] = 9;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EDTYPE, -EINVAL);
}

static void test_reject_dtype_mismatch(void **state)
{
	struct blk b;

	make(&b);
	b.buf[12] = KVFS_DTYPE_BF16;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EDTYPE, -EINVAL);
}

static void test_reject_geom_layers(void **state)
{
	struct blk b;

	make(&b);
	b.buf[16] = 3;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EGEOM, -EINVAL);
}

static void test_reject_geom_heads(void **state)
{
	struct blk b;

	make(&b);
	b.buf[20] = 1;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EGEOM, -EINVAL);
}

static void test_reject_geom_head_dim(void **state)
{
	struct blk b;

	make(&b);
	b.buf[27] = 1;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EGEOM, -EINVAL);
}

static void test_reject_geom_hidden_size(void **state)
{
	struct blk b;

	make(&b);
	b.buf[28] = 16;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EGEOM, -EINVAL);
}

static void test_reject_hidden_unknown_size(void **state)
{
	struct kvfs_geom g = geom;
	struct blk b;

	/* The namespace has no hidden size: no HIDDEN block can match. */
	make_kind(&b, &geom, KVFS_KIND_HIDDEN, 6);
	g.hidden_size = 0;
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &g, b.key, b.root,
					   KVFS_FMT_ALLOW_HIDDEN, NULL),
			 KVFS_FMT_EGEOM);
	free(b.buf);
}

static void test_reject_ntokens_zero(void **state)
{
	struct blk b;

	make(&b);
	b.buf[32] = 0;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_ENTOKENS, -EINVAL);
}

static void test_reject_ntokens_over(void **state)
{
	struct blk b;

	make(&b);
	b.buf[32] = 9;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_ENTOKENS, -EINVAL);
}

static void test_reject_chunk(void **state)
{
	struct blk b;

	make(&b);
	b.buf[36] = 2;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_ECHUNK, -EINVAL);
}

static void test_reject_hdr_crc(void **state)
{
	struct blk b;

	make(&b);
	b.buf[84] ^= 1;
	expect(&b, KVFS_FMT_EHDRCRC, -EBADMSG);
}

static void test_reject_hdr_crc_covers_fields(void **state)
{
	struct blk b;

	/* start_pos is only checked last: a changed byte must trip the CRC */
	make(&b);
	b.buf[40] = 8;
	expect(&b, KVFS_FMT_EHDRCRC, -EBADMSG);
}

static void test_reject_size_short(void **state)
{
	struct blk b;

	make(&b);
	b.len--;
	expect(&b, KVFS_FMT_ESIZE, -EINVAL);
}

static void test_reject_size_long(void **state)
{
	struct blk b;

	make(&b);
	b.buf = realloc(b.buf, b.len + 1);
	assert_non_null(b.buf);
	b.buf[b.len++] = 0;
	fix_crcs(&b);
	expect(&b, KVFS_FMT_ESIZE, -EINVAL);
}

static void test_reject_size_ntokens(void **state)
{
	struct blk b;

	/* 5 tokens need as many chunks as 6, so claim 4: one chunk less */
	make(&b);
	b.buf[32] = 4;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_ESIZE, -EINVAL);
}

static void test_reject_pad_tokens(void **state)
{
	struct blk b;

	make(&b);
	b.buf[KVFS_FMT_HDR_SIZE + 6 * 4] = 1;
	fix_crcs(&b);
	expect(&b, KVFS_FMT_EPAD, -EINVAL);
}

static void test_reject_pad_token_area_end(void **state)
{
	struct blk b;

	make(&b);
	b.buf[kvfs_fmt_payload_off(6) - 1] = 0x80;
	fix_crcs(&b);
	expect(&b, KVFS_FMT_EPAD, -EINVAL);
}

static void test_reject_pad_header_tail(void **state)
{
	struct blk b;

	/* no CRC covers bytes 88..4095, so no fix-up is needed */
	make(&b);
	b.buf[88] = 1;
	expect(&b, KVFS_FMT_EPAD, -EINVAL);
	make(&b);
	b.buf[4095] = 0xff;
	expect(&b, KVFS_FMT_EPAD, -EINVAL);
}

static void test_reject_pad_zero_field(void **state)
{
	struct blk b;

	make(&b);
	b.buf[15] = 1;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EPAD, -EINVAL);
}

static void test_reject_payload_crc(void **state)
{
	struct blk b;

	make(&b);
	/* a byte of real data, not of the zero padding rows */
	b.buf[kvfs_fmt_payload_off(6) + 1] ^= 0x10;
	assert_int_equal(kvfs_fmt_validate(b.buf, b.len, &geom, b.key, b.root,
					   KVFS_FMT_SKIP_PAYLOAD_CRC, NULL),
			 KVFS_FMT_OK);
	expect(&b, KVFS_FMT_EPAYLOADCRC, -EBADMSG);
}

/* Rows past n_tokens in a layer's last chunk must be zero. */
static void test_reject_tail_rows(void **state)
{
	struct blk b;

	make(&b);
	b.buf[b.len - 1] ^= 0x10;
	expect(&b, KVFS_FMT_EPAD, -EINVAL);
}

static void test_reject_payload_crc_field(void **state)
{
	struct blk b;

	make(&b);
	b.buf[80] ^= 1;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EPAYLOADCRC, -EBADMSG);
}

static void test_reject_name(void **state)
{
	struct blk b;

	make(&b);
	b.key[15] ^= 1;
	expect(&b, KVFS_FMT_ENAME, -EINVAL);
}

static void test_reject_key_field(void **state)
{
	struct blk b;

	make(&b);
	b.buf[64] ^= 1;
	b.key[0] ^= 1; /* the name follows the header: only the hash fails */
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EKEY, -EINVAL);
}

static void test_reject_key_tokens(void **state)
{
	struct blk b;

	make(&b);
	b.buf[KVFS_FMT_HDR_SIZE] ^= 1;
	fix_crcs(&b);
	expect(&b, KVFS_FMT_EKEY, -EINVAL);
}

static void test_reject_key_parent(void **state)
{
	struct blk b;

	/* start_pos 0 with a parent that is not the root would also fail,
	 * but the key check comes first
	 */
	make(&b);
	b.buf[48] ^= 1;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_EKEY, -EINVAL);
}

static void test_reject_startpos_root_child(void **state)
{
	struct blk b;

	make(&b);
	b.buf[40] = 8;
	fix_hdr_crc(&b);
	expect(&b, KVFS_FMT_ESTARTPOS, -EINVAL);
}

static void build_child(struct blk *b, uint64_t start_pos)
{
	uint8_t parent[KVFS_KEY_LEN];

	kvfs_fmt_root_key("llama", NULL, b->root);
	kvfs_fmt_block_key(b->root, toks, 6, parent);
	b->len = kvfs_fmt_file_size(&geom, KVFS_KIND_KV, 6);
	b->buf = calloc(1, b->len);
	assert_non_null(b->buf);
	assert_int_equal(kvfs_fmt_build(&geom, KVFS_KIND_KV, parent, start_pos,
					toks, 6, NULL, b->buf, b->len), 0);
	memcpy(b->key, b->buf + 64, KVFS_KEY_LEN);
}

static void test_reject_startpos_child_zero(void **state)
{
	struct blk b;

	build_child(&b, 0);
	expect(&b, KVFS_FMT_ESTARTPOS, -EINVAL);
}

static void test_reject_startpos_child_unaligned(void **state)
{
	struct blk b;

	build_child(&b, 12);
	expect(&b, KVFS_FMT_ESTARTPOS, -EINVAL);
	build_child(&b, 24);
	expect(&b, KVFS_FMT_OK, 0);
}

static void test_errno_mapping(void **state)
{
	for (int e = KVFS_FMT_ETOOSHORT; e <= KVFS_FMT_ESTARTPOS; e++) {
		int want = e == KVFS_FMT_EHDRCRC || e == KVFS_FMT_EPAYLOADCRC ?
				   -EBADMSG : -EINVAL;

		assert_int_equal(kvfs_fmt_errno(e), want);
		assert_string_not_equal(kvfs_fmt_strerror(e), "ok");
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc_check_value),
		cmocka_unit_test(test_root_key_vectors),
		cmocka_unit_test(test_block_key_vectors),
		cmocka_unit_test(test_build_key_matches),
		cmocka_unit_test(test_key_hex_parse),
		cmocka_unit_test(test_name_parse),
		cmocka_unit_test(test_dtypes),
		cmocka_unit_test(test_sizes_llama),
		cmocka_unit_test(test_sizes_hidden_and_overflow),
		cmocka_unit_test(test_chunk_range_partial),
		cmocka_unit_test(test_build_rejects),
		cmocka_unit_test(test_build_payload_copy),
		cmocka_unit_test(test_valid_root_child),
		cmocka_unit_test(test_valid_full_and_child),
		cmocka_unit_test(test_valid_kv_without_hidden_size),
		cmocka_unit_test(test_hidden_allowed),
		cmocka_unit_test(test_split_sizes_and_ranges),
		cmocka_unit_test(test_mixed_build_validate),
		cmocka_unit_test(test_build_in_pieces),
		cmocka_unit_test(test_mixed_rejects),
		cmocka_unit_test(test_reject_too_short),
		cmocka_unit_test(test_reject_magic),
		cmocka_unit_test(test_reject_version),
		cmocka_unit_test(test_reject_kind),
		cmocka_unit_test(test_reject_hidden_kind),
		cmocka_unit_test(test_reject_dtype_unknown),
		cmocka_unit_test(test_reject_dtype_mismatch),
		cmocka_unit_test(test_reject_geom_layers),
		cmocka_unit_test(test_reject_geom_heads),
		cmocka_unit_test(test_reject_geom_head_dim),
		cmocka_unit_test(test_reject_geom_hidden_size),
		cmocka_unit_test(test_reject_hidden_unknown_size),
		cmocka_unit_test(test_reject_ntokens_zero),
		cmocka_unit_test(test_reject_ntokens_over),
		cmocka_unit_test(test_reject_chunk),
		cmocka_unit_test(test_reject_hdr_crc),
		cmocka_unit_test(test_reject_hdr_crc_covers_fields),
		cmocka_unit_test(test_reject_size_short),
		cmocka_unit_test(test_reject_size_long),
		cmocka_unit_test(test_reject_size_ntokens),
		cmocka_unit_test(test_reject_pad_tokens),
		cmocka_unit_test(test_reject_pad_token_area_end),
		cmocka_unit_test(test_reject_pad_header_tail),
		cmocka_unit_test(test_reject_pad_zero_field),
		cmocka_unit_test(test_reject_payload_crc),
		cmocka_unit_test(test_reject_tail_rows),
		cmocka_unit_test(test_reject_payload_crc_field),
		cmocka_unit_test(test_reject_name),
		cmocka_unit_test(test_reject_key_field),
		cmocka_unit_test(test_reject_key_tokens),
		cmocka_unit_test(test_reject_key_parent),
		cmocka_unit_test(test_reject_startpos_root_child),
		cmocka_unit_test(test_reject_startpos_child_zero),
		cmocka_unit_test(test_reject_startpos_child_unaligned),
		cmocka_unit_test(test_errno_mapping),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
