/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration against an independent double-precision
 * reference.  The test writes tiny Llama-family (MHA and GQA, F32 and
 * BF16 weights, default/linear/llama3 RoPE) and Qwen2-family (with K/V
 * biases, sharded) checkpoints as real safetensors files from a seeded
 * PRNG, builds HIDDEN payloads, restores them, and compares every element
 * with K/V computed here by its own RMSNorm, mat-vec and RoPE loops (no
 * library code: the test encodes and decodes every dtype itself).
 *
 * Tolerance per output dtype, |restored - reference| <=
 *   f32:     1e-5 * |ref| + 2e-5
 *   bf16:    2^-8 * |ref| + 2e-5   (half an ulp, 8-bit significand)
 *   f16:     2^-11 * |ref| + 2e-5  (half an ulp, 11-bit significand)
 *   f8_e4m3: 2^-4 * |ref| + 2^-10 + 2e-5 (half an ulp, 4-bit
 *            significand; 2^-10 is half the subnormal step)
 * The 2e-5 absorbs the f32 arithmetic (sums of <= 64 products of O(1)
 * terms); reference values are O(1..10).
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
#include <unistd.h>

#include <cmocka.h>

#include "cache/cache.h"
#include "tier/tier.h"
#include "hcache/restore.h"
#include "meta/log.h"
#include "meta/util.h"
#include "tests/unit/ckpt_ref_i.h"

static int setup(void **state)
{
	return ckpt_dir_setup("restore");
}

static int teardown(void **state)
{
	return ckpt_dir_teardown();
}

static void log_reset(void)
{
	assert_int_equal(truncate(ckpt_log_path(), 0), 0);
}

static int log_has(const char *needle)
{
	char buf[65536];
	FILE *f = fopen(ckpt_log_path(), "r");
	size_t n;

	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (!strstr(buf, needle)) {
		print_error("log lacks \"%s\":\n%s", needle, buf);
		return 0;
	}
	return 1;
}

/* Restore @b through kvfs_restore_block() into a canary-guarded buffer
 * and check every layer.
 */
static void restore_and_check(const struct kvfs_restore *r,
			      const struct refmodel *rm, const struct block *b,
			      uint16_t kdt)
{
	size_t kl = (size_t)b->rows * 2 * rm->kvd * esize(kdt);
	size_t len = kl * rm->s.L;
	uint8_t *kv = malloc(len + 64);
	struct kvfs_restore_io io = {
		.hidden = b->hidden,
		.hidden_len = b->hidden_len,
		.hidden_dtype = b->hdt,
		.kv_len = len,
		.kv_dtype = kdt,
		.start_pos = b->pos,
		.n_tokens = b->n,
		.chunk_tokens = b->c,
	};
	double worst = 0;

	assert_non_null(kv);
	memset(kv, 0xa5, len + 64);
	io.kv = kv;
	assert_int_equal(kvfs_restore_kv_layer_bytes(&rm->m, b->n, b->c, kdt),
			 kl);
	assert_int_equal(kvfs_restore_block(r, NULL, &io), 0);
	for (size_t i = 0; i < 64; i++)
		assert_int_equal(kv[len + i], 0xa5);
	for (uint32_t l = 0; l < rm->s.L; l++)
		worst = fmax(worst, check_layer(rm, b, l, kv + l * kl, kdt));
	print_message("    hidden %u -> kv %u: worst error %.3f of tolerance\n",
		      b->hdt, kdt, worst);
	free(kv);
}

/* ------------------------------------------------------------ tests */

static void check_cb(void *arg, const struct refmodel *rm,
		     const struct block *b, uint16_t kdt)
{
	restore_and_check(arg, rm, b, kdt);
}

/* Load @t's model from @file and restore its blocks; the resident weight
 * bytes must be @mem_bytes.
 */
static void run_case(const struct ckpt_case *t, const char *file,
		     uint64_t mem_bytes)
{
	struct refmodel rm;
	struct kvfs_restore *r;

	make_model(&rm, t->spec, t->seed);
	r = ckpt_load(&rm, file, 0);
	assert_int_equal(kvfs_restore_mem_bytes(r), mem_bytes);
	ckpt_case_run(t, &rm, check_cb, r);
	kvfs_restore_free(r);
	free_model(&rm);
}

static void test_llama_mha_f32(void **state)
{
	/* F32 weights, 8-aligned data: K/V used in place, only norms copied */
	run_case(&ckpt_case_mha_f32, "llama_mha.safetensors", 2 * 32 * 4);
}

static void test_llama_gqa_bf16_llama3(void **state)
{
	/* norms + converted K and V: 3 * (48 + 2 * 16 * 48) floats */
	run_case(&ckpt_case_gqa_bf16, "llama_gqa.safetensors",
		 3 * (48 + 2 * 16 * 48) * 4);
}

static void test_llama_linear_rope(void **state)
{
	struct refmodel rm;
	struct kvfs_restore *r;

	make_model(&rm, ckpt_case_linear_f16.spec, ckpt_case_linear_f16.seed);
	r = ckpt_load(&rm, "llama_lin.safetensors", 0);
	ckpt_case_run(&ckpt_case_linear_f16, &rm, check_cb, r);
	kvfs_restore_free(r);
	free_model(&rm);
}

/* Qwen2 with biases, through a sharded checkpoint (index + 2 shards). */
static void test_qwen2_sharded(void **state)
{
	struct refmodel rm;
	struct kvfs_restore *r = NULL;
	size_t half;
	FILE *f;

	make_model(&rm, ckpt_case_qwen2.spec, ckpt_case_qwen2.seed);
	half = rm.nt / 2;
	write_checkpoint(ckpt_path("q-00001-of-00002.safetensors"), rm.t,
			 half);
	write_checkpoint(ckpt_path("q-00002-of-00002.safetensors"),
			 rm.t + half, rm.nt - half);
	f = fopen(ckpt_path("model.safetensors.index.json"), "w");
	assert_non_null(f);
	fprintf(f, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
	for (size_t i = 0; i < rm.nt; i++)
		fprintf(f, "%s\"%s\":\"q-0000%d-of-00002.safetensors\"",
			i ? "," : "", rm.t[i].name, i < half ? 1 : 2);
	fprintf(f, "}}\n");
	assert_int_equal(fclose(f), 0);
	assert_int_equal(kvfs_restore_load(&rm.m,
					   ckpt_path("model.safetensors.index.json"),
					   0, &r), 0);
	ckpt_case_run(&ckpt_case_qwen2, &rm, check_cb, r);
	kvfs_restore_free(r);
	free_model(&rm);
}

static uint8_t *restore_all(const struct kvfs_restore *r,
			    struct kvfs_restore_ws *ws,
			    const struct refmodel *rm, const struct block *b,
			    uint16_t kdt, size_t *len)
{
	struct kvfs_restore_io io = {
		.hidden = b->hidden,
		.hidden_len = b->hidden_len,
		.hidden_dtype = b->hdt,
		.kv_dtype = kdt,
		.start_pos = b->pos,
		.n_tokens = b->n,
		.chunk_tokens = b->c,
	};

	*len = (size_t)b->rows * 2 * rm->kvd * esize(kdt) * rm->s.L;
	io.kv = malloc(*len);
	io.kv_len = *len;
	assert_non_null(io.kv);
	assert_int_equal(kvfs_restore_block(r, ws, &io), 0);
	return io.kv;
}

/* Lazy conversion holds less memory and gives the same bytes. */
static void test_lazy_matches_resident(void **state)
{
	struct kvfs_restore *res, *lazy;
	struct kvfs_restore_ws *ws;
	struct refmodel rm;
	struct block b;
	uint8_t *a, *z;
	size_t la, lz;

	make_model(&rm, &ckpt_llama_gqa_bf16, 5);
	res = ckpt_load(&rm, "res.safetensors", 0);
	lazy = ckpt_load(&rm, "lazy.safetensors", KVFS_RESTORE_LAZY);
	assert_int_equal(kvfs_restore_mem_bytes(lazy), 3 * 48 * 4);
	assert_true(kvfs_restore_mem_bytes(res) > kvfs_restore_mem_bytes(lazy));
	assert_int_equal(kvfs_restore_ws_alloc(&ws), 0);
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	a = restore_all(res, ws, &rm, &b, KVFS_DTYPE_F32, &la);
	z = restore_all(lazy, ws, &rm, &b, KVFS_DTYPE_F32, &lz);
	assert_int_equal(la, lz);
	assert_memory_equal(a, z, la);
	restore_and_check(lazy, &rm, &b, KVFS_DTYPE_BF16);
	free(a);
	free(z);
	free_block(&b);
	kvfs_restore_ws_free(ws);
	kvfs_restore_free(res);
	kvfs_restore_free(lazy);
	free_model(&rm);
}

/* kvfs_restore_layer() on one layer's slices equals that layer of the
 * whole-block result; a layer range leaves other layers untouched; a
 * workspace reused across different blocks gives the same bytes.
 */
static void test_layer_api(void **state)
{
	struct kvfs_restore_ws *ws;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b, b2;
	uint8_t *full, *one, *part, *again;
	size_t len, kl, hl, l2;
	struct kvfs_restore_io io;

	make_model(&rm, &ckpt_llama_gqa_bf16, 6);
	r = ckpt_load(&rm, "layer.safetensors", 0);
	assert_int_equal(kvfs_restore_ws_alloc(&ws), 0);
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	full = restore_all(r, ws, &rm, &b, KVFS_DTYPE_BF16, &len);
	kl = kvfs_restore_kv_layer_bytes(&rm.m, 37, 16, KVFS_DTYPE_BF16);
	hl = kvfs_restore_hidden_layer_bytes(&rm.m, 37, 16, KVFS_DTYPE_BF16);
	assert_int_equal(hl, 48 * 48 * 2);
	assert_int_equal(kl * 3, len);

	one = malloc(kl);
	assert_non_null(one);
	assert_int_equal(kvfs_restore_layer(r, ws, 2, b.hidden + 2 * hl,
					    KVFS_DTYPE_BF16, 1000, 37, 16, one,
					    KVFS_DTYPE_BF16), 0);
	assert_memory_equal(one, full + 2 * kl, kl);
	/* NULL workspace works too */
	memset(one, 0, kl);
	assert_int_equal(kvfs_restore_layer(r, NULL, 1, b.hidden + hl,
					    KVFS_DTYPE_BF16, 1000, 37, 16, one,
					    KVFS_DTYPE_BF16), 0);
	assert_memory_equal(one, full + kl, kl);

	/* layers [1, 2) only */
	part = malloc(len);
	assert_non_null(part);
	memset(part, 0x5a, len);
	memset(&io, 0, sizeof(io));
	io.hidden = b.hidden;
	io.hidden_len = b.hidden_len;
	io.hidden_dtype = KVFS_DTYPE_BF16;
	io.kv = part;
	io.kv_len = len;
	io.kv_dtype = KVFS_DTYPE_BF16;
	io.start_pos = 1000;
	io.n_tokens = 37;
	io.chunk_tokens = 16;
	io.first_layer = 1;
	io.n_layers = 1;
	assert_int_equal(kvfs_restore_block(r, ws, &io), 0);
	for (size_t i = 0; i < kl; i++) {
		assert_int_equal(part[i], 0x5a);
		assert_int_equal(part[2 * kl + i], 0x5a);
	}
	assert_memory_equal(part + kl, full + kl, kl);

	/* the cached cos/sin table must follow start_pos and n_tokens */
	make_block(&b2, &rm, KVFS_DTYPE_BF16, 20, 16, 5);
	free(restore_all(r, ws, &rm, &b2, KVFS_DTYPE_BF16, &l2));
	again = restore_all(r, ws, &rm, &b, KVFS_DTYPE_BF16, &l2);
	assert_memory_equal(again, full, len);

	free(again);
	free(part);
	free(one);
	free(full);
	free_block(&b);
	free_block(&b2);
	kvfs_restore_ws_free(ws);
	kvfs_restore_free(r);
	free_model(&rm);
}

/* Split layouts: hidden layers copied, the middle restored, KV layers
 * copied; every result equals the matching layers of the whole-block
 * restoration (itself checked against the reference above).
 */
static void test_split(void **state)
{
	const uint16_t dt = KVFS_DTYPE_BF16;
	struct kvfs_restore_split_io io;
	struct kvfs_restore_ws *ws;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	uint8_t *full, *mix2, *mix1, *out;
	size_t len, kl, hl;

	make_model(&rm, &ckpt_llama_gqa_bf16, 7);
	r = ckpt_load(&rm, "split.safetensors", 0);
	assert_int_equal(kvfs_restore_ws_alloc(&ws), 0);
	/* 37 tokens in chunks of 16: a partial last chunk, RoPE at 1000 */
	make_block(&b, &rm, dt, 37, 16, 1000);
	full = restore_all(r, ws, &rm, &b, dt, &len);
	kl = kvfs_restore_kv_layer_bytes(&rm.m, 37, 16, dt);
	hl = kvfs_restore_hidden_layer_bytes(&rm.m, 37, 16, dt);
	assert_int_equal(len, 3 * kl);
	mix2 = malloc(2 * hl + kl);
	mix1 = malloc(hl + 2 * kl);
	/* room for the largest layout: 2 hidden layers are larger here */
	out = malloc(3 * hl + 3 * kl);
	assert_true(mix2 && mix1 && out);

	/* HIDDEN (kv_from 3) -> MIXED kv_from 2: layers 0, 1 as written,
	 * layer 2 restored.
	 */
	memset(&io, 0, sizeof(io));
	io.src = b.hidden;
	io.src_len = b.hidden_len;
	io.src_kv_from = 3;
	io.dst = mix2;
	io.dst_len = 2 * hl + kl;
	io.dst_kv_from = 2;
	io.dtype = dt;
	io.start_pos = 1000;
	io.n_tokens = 37;
	io.chunk_tokens = 16;
	assert_int_equal(kvfs_restore_split(r, ws, &io), 0);
	assert_memory_equal(mix2, b.hidden, 2 * hl);
	assert_memory_equal(mix2 + 2 * hl, full + 2 * kl, kl);

	/* MIXED kv_from 2 -> KV: the read path. */
	io.src = mix2;
	io.src_len = 2 * hl + kl;
	io.src_kv_from = 2;
	io.dst = out;
	io.dst_len = len;
	io.dst_kv_from = 0;
	memset(out, 0x5a, len);
	assert_int_equal(kvfs_restore_split(r, NULL, &io), 0);
	assert_memory_equal(out, full, len);

	/* MIXED kv_from 2 -> MIXED kv_from 1. */
	io.dst = mix1;
	io.dst_len = hl + 2 * kl;
	io.dst_kv_from = 1;
	assert_int_equal(kvfs_restore_split(r, ws, &io), 0);
	assert_memory_equal(mix1, b.hidden, hl);
	assert_memory_equal(mix1 + hl, full + kl, 2 * kl);

	/* HIDDEN -> KV equals kvfs_restore_block(). */
	io.src = b.hidden;
	io.src_len = b.hidden_len;
	io.src_kv_from = 3;
	io.dst = out;
	io.dst_len = len;
	io.dst_kv_from = 0;
	memset(out, 0, len);
	assert_int_equal(kvfs_restore_split(r, ws, &io), 0);
	assert_memory_equal(out, full, len);

	/* The same split both sides is a copy. */
	io.src = mix2;
	io.src_len = 2 * hl + kl;
	io.src_kv_from = 2;
	io.dst = out;
	io.dst_len = 2 * hl + kl;
	io.dst_kv_from = 2;
	assert_int_equal(kvfs_restore_split(r, ws, &io), 0);
	assert_memory_equal(out, mix2, 2 * hl + kl);

	/* Refusals: more hidden layers out than in, beyond the model,
	 * lengths that do not match, a NULL payload.
	 */
	log_reset();
	io.dst_kv_from = 3;
	io.dst_len = 3 * hl;
	assert_int_equal(kvfs_restore_split(r, ws, &io), -EINVAL);
	assert_true(log_has("split layers out of order"));
	io.src_kv_from = 4;
	io.dst_kv_from = 0;
	io.dst_len = len;
	assert_int_equal(kvfs_restore_split(r, ws, &io), -EINVAL);
	io.src_kv_from = 2;
	io.src_len = 2 * hl + kl - 1;
	assert_int_equal(kvfs_restore_split(r, ws, &io), -EINVAL);
	assert_true(log_has("source payload length"));
	io.src_len = 2 * hl + kl;
	io.dst_len = len + 2;
	assert_int_equal(kvfs_restore_split(r, ws, &io), -EINVAL);
	assert_true(log_has("destination payload length"));
	io.dst_len = len;
	io.dst = NULL;
	assert_int_equal(kvfs_restore_split(r, ws, &io), -EINVAL);

	free(out);
	free(mix1);
	free(mix2);
	free(full);
	free_block(&b);
	kvfs_restore_ws_free(ws);
	kvfs_restore_free(r);
	free_model(&rm);
}

/* Put @img (@len bytes) in a fresh extent of @ssd. */
static void ssd_put(struct kvfs_tier *ssd, struct kvfs_extent *e,
		    const uint8_t *img, uint64_t len)
{
	uint64_t al = (len + 4095) / 4096 * 4096;
	uint8_t *buf = aligned_alloc(4096, al);

	assert_non_null(buf);
	memset(buf, 0, al);
	memcpy(buf, img, len);
	assert_int_equal(ssd->ops->alloc(ssd, al, e), 0);
	assert_int_equal(ssd->ops->write(ssd, e, 0, buf, al), 0);
	free(buf);
}

/* kvfs_cache_restore_stream(): a HIDDEN and a MIXED image on the SSD
 * tier give, pipelined and read whole, exactly the KV file built from the
 * whole-block restoration; a flipped payload byte, a bad header and a
 * header that is not the record's are refused with -EBADMSG, pipelined
 * too (nothing may be used).
 */
static void test_stream(void **state)
{
	const uint16_t dt = KVFS_DTYPE_BF16;
	const uint32_t n = 37, C = 16;
	struct kvfs_restore_split_io sio;
	struct kvfs_restore_stream rs;
	struct kvfs_extent eh, em;
	struct kvfs_tier *ssd;
	struct kvfs_restore *r;
	struct refmodel rm;
	struct kvfs_geom g;
	struct block b;
	uint8_t root[16], parent[16], *full, *want, *hid, *mix, *pay, *dst;
	uint8_t *src;
	uint64_t kvsz, hsz, msz, po, len;
	uint32_t tok[48];

	make_model(&rm, &ckpt_llama_gqa_bf16, 8);
	r = ckpt_load(&rm, "stream.safetensors", 0);
	make_block(&b, &rm, dt, n, C, 960);
	full = restore_all(r, NULL, &rm, &b, dt, &len);
	g = (struct kvfs_geom){ .n_layers = 3, .n_kv_heads = 2, .head_dim = 8,
				.hidden_size = 48, .block_tokens = 48,
				.chunk_tokens = C, .dtype = dt };
	for (int i = 0; i < 16; i++) {
		root[i] = (uint8_t)(i + 1);
		parent[i] = (uint8_t)(0xa0 + i);
	}
	for (uint32_t i = 0; i < n; i++)
		tok[i] = 5000 + i;
	po = kvfs_fmt_payload_off(n);
	kvsz = kvfs_fmt_file_size(&g, KVFS_KIND_KV, n);
	hsz = kvfs_fmt_split_file_size(&g, n, 3);
	msz = kvfs_fmt_split_file_size(&g, n, 2);
	assert_int_equal(kvsz - po, len);
	want = malloc(kvsz);
	hid = malloc(hsz);
	mix = malloc(msz);
	pay = malloc(msz - po);
	dst = aligned_alloc(4096, 65536);
	src = aligned_alloc(4096, 65536);
	assert_true(want && hid && mix && pay && dst && src);
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, parent, 960, tok, n,
					full, want, kvsz),
			 0);
	assert_int_equal(kvfs_fmt_build_split(&g, 3, parent, 960, tok, n,
					      b.hidden, hid, hsz),
			 0);
	memset(&sio, 0, sizeof(sio));
	sio.src = b.hidden;
	sio.src_len = b.hidden_len;
	sio.src_kv_from = 3;
	sio.dst = pay;
	sio.dst_len = msz - po;
	sio.dst_kv_from = 2;
	sio.dtype = dt;
	sio.start_pos = 960;
	sio.n_tokens = n;
	sio.chunk_tokens = C;
	assert_int_equal(kvfs_restore_split(r, NULL, &sio), 0);
	assert_int_equal(kvfs_fmt_build_split(&g, 2, parent, 960, tok, n, pay,
					      mix, msz),
			 0);

	assert_int_equal(kvfs_tier_ssd_init(NULL, 4096, 1u << 20, 1,
					    KVFS_SSD_MEMORY, &ssd),
			 0);
	ssd_put(ssd, &eh, hid, hsz);
	ssd_put(ssd, &em, mix, msz);
	assert_true(em.len <= 65536 && eh.len <= 65536);

	for (int whole = 0; whole < 2; whole++) {
		for (int k = 0; k < 2; k++) {
			memset(&rs, 0, sizeof(rs));
			rs.ssd = ssd;
			rs.ext = k ? &em : &eh;
			rs.g = &g;
			rs.rst = r;
			rs.n_tokens = n;
			rs.kv_from = k ? 2 : 3;
			rs.start_pos = 960;
			rs.hdr_crc = kvfs_util_get32(k ? mix + 84 : hid + 84);
			rs.key = k ? mix + 64 : hid + 64;
			rs.root = root;
			rs.img = src;
			rs.dst = dst;
			rs.dst_len = 65536;
			rs.flags = whole ? KVFS_RS_WHOLE : 0;
			memset(dst, 0x77, 65536);
			assert_int_equal(kvfs_cache_restore_stream(&rs), 0);
			assert_memory_equal(dst, want, kvsz);
			assert_true(dst[kvsz] == 0 && dst[65535] == 0);
		}
		/* the record says another header */
		rs.hdr_crc ^= 1;
		assert_int_equal(kvfs_cache_restore_stream(&rs), -EBADMSG);
		assert_string_equal(rs.bad, "header does not match the record");
		rs.hdr_crc ^= 1;
		/* the record's split differs from the image's */
		rs.kv_from = 1;
		assert_int_equal(kvfs_cache_restore_stream(&rs), -EBADMSG);
		rs.kv_from = 2;
	}

	/* One flipped byte in layer 1 (hidden) of the MIXED image. */
	mix[po + kvfs_restore_hidden_layer_bytes(&rm.m, n, C, dt) + 5] ^= 4;
	ssd->ops->free(ssd, &em);
	ssd_put(ssd, &em, mix, msz);
	for (int whole = 0; whole < 2; whole++) {
		rs.flags = whole ? KVFS_RS_WHOLE : 0;
		assert_int_equal(kvfs_cache_restore_stream(&rs), -EBADMSG);
		assert_string_equal(rs.bad, kvfs_fmt_strerror(
						     KVFS_FMT_EPAYLOADCRC));
	}
	/* A damaged header. */
	mix[5] ^= 1;
	ssd->ops->free(ssd, &em);
	ssd_put(ssd, &em, mix, msz);
	rs.flags = 0;
	assert_int_equal(kvfs_cache_restore_stream(&rs), -EBADMSG);
	assert_non_null(rs.bad);
	/* A destination too small, a split beyond the model. */
	rs.dst_len = kvsz - 1;
	assert_int_equal(kvfs_cache_restore_stream(&rs), -EINVAL);
	rs.dst_len = 65536;
	rs.kv_from = 4;
	assert_int_equal(kvfs_cache_restore_stream(&rs), -EINVAL);

	kvfs_tier_free(ssd);
	free(src);
	free(dst);
	free(pay);
	free(mix);
	free(hid);
	free(want);
	free(full);
	free_block(&b);
	kvfs_restore_free(r);
	free_model(&rm);
}

struct thr {
	const struct kvfs_restore *r;
	const struct refmodel *rm;
	const struct block *b;
	uint8_t *out;
	size_t len;
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;
	struct kvfs_restore_ws *ws;

	if (kvfs_restore_ws_alloc(&ws))
		return NULL;
	for (int i = 0; i < 4; i++) {
		free(t->out);
		t->out = restore_all(t->r, ws, t->rm, t->b, KVFS_DTYPE_F32,
				     &t->len);
	}
	kvfs_restore_ws_free(ws);
	return NULL;
}

/* One loaded model, four threads with their own workspaces and outputs:
 * every result equals the single-threaded one.
 */
static void test_threads(void **state)
{
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	struct thr t[4];
	pthread_t tid[4];
	uint8_t *ref;
	size_t len;

	make_model(&rm, &ckpt_qwen2_bias, 7);
	r = ckpt_load(&rm, "thr.safetensors", KVFS_RESTORE_LAZY);
	make_block(&b, &rm, KVFS_DTYPE_BF16, 37, 16, 1000);
	ref = restore_all(r, NULL, &rm, &b, KVFS_DTYPE_F32, &len);
	for (int i = 0; i < 4; i++) {
		t[i] = (struct thr){ .r = r, .rm = &rm, .b = &b };
		assert_int_equal(pthread_create(&tid[i], NULL, thr_main, &t[i]),
				 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(tid[i], NULL), 0);
		assert_non_null(t[i].out);
		assert_int_equal(t[i].len, len);
		assert_memory_equal(t[i].out, ref, len);
		free(t[i].out);
	}
	free(ref);
	free_block(&b);
	kvfs_restore_free(r);
	free_model(&rm);
}

/* --------------------------------------------------------- refusals */

static struct wt *find_wt(struct refmodel *rm, const char *name)
{
	for (size_t i = 0; i < rm->nt; i++)
		if (!strcmp(rm->t[i].name, name))
			return &rm->t[i];
	fail_msg("no tensor %s", name);
	return NULL;
}

static void drop_wt(struct refmodel *rm, const char *name)
{
	struct wt *w = find_wt(rm, name);

	free(w->bytes);
	*w = rm->t[--rm->nt];
}

static void expect_refused(struct refmodel *rm, const char *file,
			   const struct kvfs_restore_model *m, int err,
			   const char *a, const char *b)
{
	struct kvfs_restore *r = NULL;

	write_checkpoint(ckpt_path(file), rm->t, rm->nt);
	log_reset();
	assert_int_equal(kvfs_restore_load(m, ckpt_path(file), 0, &r), err);
	assert_null(r);
	if (a)
		assert_true(log_has(a));
	if (b)
		assert_true(log_has(b));
}

/* The namespace says 4 KV heads, the checkpoint has 2. */
static void test_refuse_kv_heads(void **state)
{
	struct refmodel rm;
	struct kvfs_restore_model m;

	make_model(&rm, &ckpt_llama_gqa_bf16, 8);
	m = rm.m;
	m.n_kv_heads = 4;
	expect_refused(&rm, "heads.safetensors", &m, -EINVAL,
		       "tensor \"model.layers.0.self_attn.k_proj.weight\": shape [16, 48], expected [32, 48]",
		       NULL);
	free_model(&rm);
}

static void test_refuse_bad_shapes(void **state)
{
	struct refmodel rm;
	struct wt *w;

	make_model(&rm, &ckpt_qwen2_bias, 9);
	/* layer 1's v_proj transposed */
	w = find_wt(&rm, "model.layers.1.self_attn.v_proj.weight");
	w->shape[0] = 64;
	w->shape[1] = 32;
	expect_refused(&rm, "vt.safetensors", &rm.m, -EINVAL,
		       "model.layers.1.self_attn.v_proj.weight\": shape [64, 32], expected [32, 64]",
		       NULL);
	w->shape[0] = 32;
	w->shape[1] = 64;
	/* bias of the wrong length: reshape [32] as [16, 2] */
	w = find_wt(&rm, "model.layers.0.self_attn.k_proj.bias");
	w->ndim = 2;
	w->shape[0] = 16;
	w->shape[1] = 2;
	expect_refused(&rm, "bias.safetensors", &rm.m, -EINVAL,
		       "model.layers.0.self_attn.k_proj.bias\": shape [16, 2], expected [32]",
		       NULL);
	w->ndim = 1;
	w->shape[0] = 32;
	/* norm wrong */
	w = find_wt(&rm, "model.layers.1.input_layernorm.weight");
	w->ndim = 2;
	w->shape[0] = 32;
	w->shape[1] = 2;
	expect_refused(&rm, "norm.safetensors", &rm.m, -EINVAL,
		       "model.layers.1.input_layernorm.weight\": shape [32, 2], expected [64]",
		       NULL);
	free_model(&rm);
}

static void test_refuse_qwen2_no_bias(void **state)
{
	struct refmodel rm;
	struct spec s = ckpt_qwen2_bias;

	s.bias = false;
	make_model(&rm, &s, 10);
	expect_refused(&rm, "nobias.safetensors", &rm.m, -EINVAL,
		       "model.layers.0.self_attn.k_proj.bias",
		       "qwen2 has K/V biases");
	free_model(&rm);
}

static void test_llama_biases(void **state)
{
	struct refmodel rm;
	struct kvfs_restore *r;
	struct spec s = ckpt_qwen2_bias;
	struct block b;

	/* A llama checkpoint with both biases (attention_bias) uses them. */
	s.family = KVFS_FAMILY_LLAMA;
	make_model(&rm, &s, 11);
	r = ckpt_load(&rm, "lbias.safetensors", 0);
	make_block(&b, &rm, KVFS_DTYPE_F32, 5, 4, 100);
	restore_and_check(r, &rm, &b, KVFS_DTYPE_F32);
	free_block(&b);
	kvfs_restore_free(r);
	/* ... and one bias alone is refused, naming the missing one. */
	drop_wt(&rm, "model.layers.1.self_attn.v_proj.bias");
	expect_refused(&rm, "onebias.safetensors", &rm.m, -EINVAL,
		       "tensor \"model.layers.1.self_attn.v_proj.bias\": missing while the other projection has a bias",
		       NULL);
	free_model(&rm);
}

static void test_refuse_missing_and_extra(void **state)
{
	struct refmodel rm;
	struct kvfs_restore_model m;
	struct wt *w;

	make_model(&rm, &ckpt_llama_gqa_bf16, 12);
	/* the namespace has 2 layers, the checkpoint 3 */
	m = rm.m;
	m.n_layers = 2;
	expect_refused(&rm, "deep.safetensors", &m, -EINVAL,
		       "tensor \"model.layers.2.input_layernorm.weight\": present, but the namespace has 2 layers",
		       NULL);
	/* the namespace has 4 */
	m.n_layers = 4;
	expect_refused(&rm, "shallow.safetensors", &m, -EINVAL,
		       "tensor \"model.layers.3.input_layernorm.weight\": missing from the checkpoint",
		       NULL);
	/* unusable dtype */
	w = find_wt(&rm, "model.layers.0.self_attn.k_proj.weight");
	w->dtype = "I16";
	expect_refused(&rm, "i16.safetensors", &rm.m, -EINVAL,
		       "tensor \"model.layers.0.self_attn.k_proj.weight\": dtype I16 is not usable",
		       NULL);
	w->dtype = "BF16";
	drop_wt(&rm, "model.layers.2.self_attn.v_proj.weight");
	expect_refused(&rm, "nov.safetensors", &rm.m, -EINVAL,
		       "tensor \"model.layers.2.self_attn.v_proj.weight\": missing from the checkpoint",
		       NULL);
	free_model(&rm);
}

static void test_refuse_files(void **state)
{
	struct refmodel rm;
	struct kvfs_restore *r = NULL;
	FILE *f;

	make_model(&rm, &ckpt_llama_mha_f32, 13);
	assert_int_equal(kvfs_restore_load(&rm.m, ckpt_path("absent.safetensors"),
					   0, &r), -ENOENT);
	f = fopen(ckpt_path("garbage.safetensors"), "w");
	assert_non_null(f);
	fputs("this is not a checkpoint", f);
	fclose(f);
	log_reset();
	assert_int_equal(kvfs_restore_load(&rm.m, ckpt_path("garbage.safetensors"),
					   0, &r), -EINVAL);
	assert_true(log_has("checkpoint refused"));
	assert_null(r);
	free_model(&rm);
}

static void test_model_check(void **state)
{
	struct kvfs_restore_model ok = {
		.family = KVFS_FAMILY_LLAMA, .n_layers = 2, .hidden_size = 32,
		.n_kv_heads = 4, .head_dim = 8, .rms_norm_eps = 1e-5,
		.rope_theta = 10000,
	}, m;

	assert_int_equal(kvfs_restore_model_check(&ok), 0);
	m = ok;
	m.family = 9;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);
	m = ok;
	m.head_dim = 7;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);
	m = ok;
	m.n_layers = 0;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);
	m = ok;
	m.rms_norm_eps = 0;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);
	m = ok;
	m.rope_theta = NAN;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);
	m = ok;
	m.rope_type = KVFS_ROPE_LINEAR;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL); /* factor 0 */
	m.rope_factor = 2;
	assert_int_equal(kvfs_restore_model_check(&m), 0);
	m = ok;
	m.rope_type = KVFS_ROPE_LLAMA3;
	m.rope_factor = 8;
	m.rope_low_freq_factor = 4;
	m.rope_high_freq_factor = 4;
	m.rope_orig_max_pos = 8192;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL); /* hi <= lo */
	m.rope_low_freq_factor = 1;
	assert_int_equal(kvfs_restore_model_check(&m), 0);
	m.rope_orig_max_pos = 0;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);
	m = ok;
	m.rope_type = 7;
	assert_int_equal(kvfs_restore_model_check(&m), -EINVAL);

	assert_int_equal(kvfs_restore_family_parse("llama"), KVFS_FAMILY_LLAMA);
	assert_int_equal(kvfs_restore_family_parse("qwen2"), KVFS_FAMILY_QWEN2);
	assert_int_equal(kvfs_restore_family_parse("mistral"), -EINVAL);
	assert_int_equal(kvfs_restore_rope_parse("llama3"), KVFS_ROPE_LLAMA3);
	assert_int_equal(kvfs_restore_rope_parse("linear"), KVFS_ROPE_LINEAR);
	assert_int_equal(kvfs_restore_rope_parse("default"), KVFS_ROPE_DEFAULT);
	assert_int_equal(kvfs_restore_rope_parse("yarn"), -EINVAL);
	assert_int_equal(kvfs_restore_rope_parse("dynamic"), -EINVAL);
}

static void test_bad_requests(void **state)
{
	struct kvfs_restore *r;
	struct refmodel rm;
	struct block b;
	struct kvfs_restore_io io, good;
	uint8_t *kv;
	size_t len;

	make_model(&rm, &ckpt_llama_mha_f32, 14);
	r = ckpt_load(&rm, "req.safetensors", 0);
	make_block(&b, &rm, KVFS_DTYPE_F32, 10, 4, 50);
	len = (size_t)b.rows * 2 * rm.kvd * 4 * rm.s.L;
	kv = malloc(len);
	assert_non_null(kv);
	memset(&good, 0, sizeof(good));
	good.hidden = b.hidden;
	good.hidden_len = b.hidden_len;
	good.hidden_dtype = KVFS_DTYPE_F32;
	good.kv = kv;
	good.kv_len = len;
	good.kv_dtype = KVFS_DTYPE_F32;
	good.start_pos = 50;
	good.n_tokens = 10;
	good.chunk_tokens = 4;
	assert_int_equal(kvfs_restore_block(r, NULL, &good), 0);

	io = good;
	io.n_tokens = 0;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.chunk_tokens = 0;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.kv_dtype = 0;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.hidden_dtype = 9;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.hidden_len--;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.kv_len++;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.chunk_tokens = 8; /* payload sized for chunks of 4 */
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.first_layer = 2;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.first_layer = 1;
	io.n_layers = 2;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.start_pos = (1ull << 53) - 5;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	io = good;
	io.kv = NULL;
	assert_int_equal(kvfs_restore_block(r, NULL, &io), -EINVAL);
	assert_int_equal(kvfs_restore_layer(r, NULL, 2, b.hidden,
					    KVFS_DTYPE_F32, 0, 10, 4, kv,
					    KVFS_DTYPE_F32), -EINVAL);
	free(kv);
	free_block(&b);
	kvfs_restore_free(r);
	free_model(&rm);
}

/* ------------------------------------------------------- conversions */

static void test_convert_bf16(void **state)
{
	/* ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
	assert_int_equal(kvfs_restore_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	/* 1 + 3 * 2^-8: halfway between 1 + 2^-7 (odd) and 1 + 2^-6 */
	assert_int_equal(kvfs_restore_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
	/* just above halfway rounds up */
	assert_int_equal(kvfs_restore_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f),
			 0x3f81);
	assert_int_equal(kvfs_restore_f32_to_bf16(-2.0f), 0xc000);
	assert_int_equal(kvfs_restore_f32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(kvfs_restore_f32_to_bf16(3.4e38f), 0x7f80);
	assert_true(isnan(kvfs_restore_bf16_to_f32(
		kvfs_restore_f32_to_bf16(NAN))));
	/* every non-NaN pattern round-trips */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = kvfs_restore_bf16_to_f32((uint16_t)h);

		if (isnan(f))
			continue;
		assert_int_equal(kvfs_restore_f32_to_bf16(f), h);
		assert_true(f == (float)dec(KVFS_DTYPE_BF16, &h, 0));
	}
}

static void test_convert_f16(void **state)
{
	assert_int_equal(kvfs_restore_f32_to_f16(1.0f), 0x3c00);
	assert_int_equal(kvfs_restore_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(kvfs_restore_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(kvfs_restore_f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(kvfs_restore_f32_to_f16(65519.0f), 0x7bff);
	assert_int_equal(kvfs_restore_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(kvfs_restore_f32_to_f16(-1e9f), 0xfc00);
	/* subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 3*2^-25 to 2 */
	assert_int_equal(kvfs_restore_f32_to_f16(0x1p-24f), 0x0001);
	assert_int_equal(kvfs_restore_f32_to_f16(0x1p-25f), 0x0000);
	assert_int_equal(kvfs_restore_f32_to_f16(3 * 0x1p-25f), 0x0002);
	assert_int_equal(kvfs_restore_f32_to_f16(-0x1p-26f), 0x8000);
	/* the largest subnormal rounds up into the smallest normal */
	assert_int_equal(kvfs_restore_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400);
	assert_int_equal(kvfs_restore_f32_to_f16(1e-40f), 0x0000);
	assert_true(isnan(kvfs_restore_f16_to_f32(
		kvfs_restore_f32_to_f16(NAN))));
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = kvfs_restore_f16_to_f32((uint16_t)h);
		uint16_t h16 = (uint16_t)h;

		if (isnan(f))
			continue;
		assert_int_equal(kvfs_restore_f32_to_f16(f), h);
		assert_true(f == (float)dec(KVFS_DTYPE_F16, &h16, 0));
	}
}

static void test_convert_f8(void **state)
{
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(1.0f), 0x38);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(448.0f), 0x7e);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(1000.0f), 0x7e);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(-INFINITY), 0xfe);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
	/* 1 + 2^-4 is halfway between 1 and 1.125: even is 1 */
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(1.0f + 0x1p-4f), 0x38);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(1.0f + 3 * 0x1p-4f), 0x3a);
	/* 1.9375 rounds up across the exponent to 2 */
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(1.9375f), 0x40);
	/* subnormals: step 2^-9 */
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(0x1p-9f), 0x01);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(0x1p-10f), 0x00);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(3 * 0x1p-10f), 0x02);
	assert_int_equal(kvfs_restore_f32_to_f8e4m3(0x1p-6f), 0x08);
	for (uint32_t b = 0; b < 0x100; b++) {
		uint8_t b8 = (uint8_t)b;
		float f = kvfs_restore_f8e4m3_to_f32(b8);

		if ((b & 0x7f) == 0x7f) {
			assert_true(isnan(f));
			continue;
		}
		assert_int_equal(kvfs_restore_f32_to_f8e4m3(f), b);
		assert_true(f == (float)dec(KVFS_DTYPE_F8_E4M3, &b8, 0));
	}
}

static void test_convert_bulk(void **state)
{
	float src[5] = { 1.5f, -0.0f, 3.25f, 1e-3f, -7.0f }, back[5];
	uint8_t buf[20];

	for (size_t d = 0; d < 4; d++) {
		assert_int_equal(kvfs_restore_from_f32(src, ckpt_kv_dtypes[d], buf,
						       5), 0);
		assert_int_equal(kvfs_restore_to_f32(buf, ckpt_kv_dtypes[d], back,
						     5), 0);
		for (int i = 0; i < 5; i++)
			assert_true(fabs(back[i] - src[i]) <=
				    tol(ckpt_kv_dtypes[d], src[i]));
	}
	/* unaligned source */
	assert_int_equal(kvfs_restore_from_f32(src, KVFS_DTYPE_BF16, buf + 1,
					       5), 0);
	assert_int_equal(kvfs_restore_to_f32(buf + 1, KVFS_DTYPE_BF16, back, 5),
			 0);
	assert_true(back[2] == 3.25f);
	assert_int_equal(kvfs_restore_to_f32(buf, 0, back, 1), -EINVAL);
	assert_int_equal(kvfs_restore_from_f32(src, 42, buf, 1), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_convert_bf16),
		cmocka_unit_test(test_convert_f16),
		cmocka_unit_test(test_convert_f8),
		cmocka_unit_test(test_convert_bulk),
		cmocka_unit_test(test_model_check),
		cmocka_unit_test(test_llama_mha_f32),
		cmocka_unit_test(test_llama_gqa_bf16_llama3),
		cmocka_unit_test(test_llama_linear_rope),
		cmocka_unit_test(test_qwen2_sharded),
		cmocka_unit_test(test_llama_biases),
		cmocka_unit_test(test_lazy_matches_resident),
		cmocka_unit_test(test_layer_api),
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_stream),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_refuse_kv_heads),
		cmocka_unit_test(test_refuse_bad_shapes),
		cmocka_unit_test(test_refuse_qwen2_no_bias),
		cmocka_unit_test(test_refuse_missing_and_extra),
		cmocka_unit_test(test_refuse_files),
		cmocka_unit_test(test_bad_requests),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
