/* SPDX-License-Identifier: MIT */
/*
 * Chunk-granular reads of hidden-state and split blocks (HCache stores,
 * docs/contiguouskv.md) on a real engine instance, with the chain of
 * chunk_fx_i.h and the checkpoints of ckpt_ref_i.h.
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
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "tests/unit/chunk_fx_i.h"
#include "tests/unit/ckpt_ref_i.h"
#include "hcache/restore.h"

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
	.family = KVFS_FAMILY_LLAMA,
	.L = 4,
	.hidden = 64,
	.kvh = 4,
	.hd = 16,
	.wdt = KVFS_DTYPE_F32,
	.theta = 10000,
	.eps = 1e-5,
};

struct hx {
	char dir[64];
	char wpath[96];
	struct kvfs_cache_params conf;
	struct kvfs_cache *c;
	struct refmodel rm;
	struct kvfs_restore *r; /* the test's own, for expected bytes */
	struct block hb[HNS][NBLK];
	uint8_t *kv[HNS][NBLK]; /* the full KV file each block serves */
	uint64_t kvsize[HNS][NBLK];
	char name[HNS][NBLK][KVFS_FMT_NAME_LEN + 1];
	uint8_t key[HNS][NBLK][KVFS_KEY_LEN];
};

static struct kvfs_geom hns_geom(int n)
{
	struct kvfs_geom g = {
		.n_layers = 4,
		.n_kv_heads = 4,
		.head_dim = 16,
		.hidden_size = 64,
		.block_tokens = 64,
		.chunk_tokens = 16,
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
		cn->hc.store_as = n == HN_MIX ? KVFS_STORE_AUTO :
						KVFS_STORE_HIDDEN;
		cn->hc.kv_layers = n == HN_MIX ? 2 :
						 KVFS_PARAMS_KV_LAYERS_SCHED;
	}
	hx_open(h);

	for (int n = 0; n < HNS; n++) {
		struct kvfs_geom g = hns_geom(n);
		uint8_t parent[KVFS_KEY_LEN];

		kvfs_fmt_root_key(hns_names[n], "", parent);
		for (int i = 0; i < NBLK; i++) {
			uint32_t nt = blk_tokens(i), tok[64];
			uint64_t pos = (uint64_t)i * 64, po;
			uint64_t hsize =
				kvfs_fmt_file_size(&g, KVFS_KIND_HIDDEN, nt);
			uint64_t ksize =
				kvfs_fmt_file_size(&g, KVFS_KIND_KV, nt);
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
			io = (struct kvfs_restore_io){ .hidden = hb->hidden,
						       .hidden_len =
							       hb->hidden_len,
						       .hidden_dtype = g.dtype,
						       .kv = kv + po,
						       .kv_len = ksize - po,
						       .kv_dtype = g.dtype,
						       .start_pos = pos,
						       .n_tokens = nt,
						       .chunk_tokens = 16 };
			assert_int_equal(kvfs_restore_block(h->r, NULL, &io),
					 0);
			assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV,
							parent, pos, tok, nt,
							NULL, kv, ksize),
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
					 n == HN_MIX ? KVFS_KIND_MIXED :
						       KVFS_KIND_HIDDEN);
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

	assert_int_equal(
		kvfs_cache_lookup(h->c,
				  kvfs_cache_ns_by_name(h->c, hns_names[n]),
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
static const uint8_t *hfull(struct hx *h, int n, int i, uint32_t l, uint32_t c)
{
	struct kvfs_geom g = hns_geom(n);
	uint64_t off, len;

	assert_int_equal(
		kvfs_fmt_chunk_range(&g, blk_tokens(i), l, c, &off, &len), 0);
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
	assert_int_equal(
		kvfs_restore_layer(
			h->r, NULL, l,
			hb->hidden + ((size_t)l * hb->rows + first) * 64 * es,
			g.dtype, hb->pos + first, in, 16, want, g.dtype),
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
static int hread(struct hx *h, int n, const int *trip, size_t np, size_t mis,
		 int want_from, bool exact, struct kvfs_chunk_piece *p,
		 struct kvfs_chunk_result *res)
{
	uint64_t cb = hcbytes(n);
	uint8_t *mem = NULL, *buf;
	int rc;

	assert_int_equal(posix_memalign((void **)&mem, 4096, np * cb + 4096),
			 0);
	buf = mem + mis;
	memset(buf, 0xee, np * cb);
	for (size_t k = 0; k < np; k++)
		p[k] = (struct kvfs_chunk_piece){
			.b = hblk(h, n, trip[3 * k]),
			.layer = (uint32_t)trip[3 * k + 1],
			.chunk = (uint32_t)trip[3 * k + 2],
			.dst = buf + k * cb
		};
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
		assert_int_equal(
			hread(h, n, t, np, mis, want_from, exact, p, &res), 0);
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
	assert_int_equal(hread(h, HN_F32, one_piece, 1, 0, KVFS_CHUNK_FROM_SSD,
			       false, p, &res),
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
		assert_int_equal(rec.kind, n == HN_MIX ? KVFS_KIND_MIXED :
							 KVFS_KIND_HIDDEN);
		fd = open(path, O_RDONLY);
		assert_true(fd >= 0);
		assert_int_equal(pread(fd, img, rec.size, (off_t)rec.ssd_off),
				 (ssize_t)rec.size);
		close(fd);
		for (uint32_t l = 0; l < 4; l++)
			for (uint32_t c = 0; c < 4; c++) {
				uint64_t off, len;

				assert_int_equal(kvfs_fmt_piece_range(
							 &g, 64, hns_kv_from(n),
							 l, c, &off, &len),
						 0);
				exp[l * 4 + c] =
					kvfs_fmt_crc32c(0, img + off, len);
			}
		free(img);
		assert_int_equal(
			kvfs_store_open(h->dir, KVFS_META_NOSYNC, 0, &s), 0);
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
		assert_int_equal(
			kvfs_fmt_piece_range(&g, 64, 4, 1, 2, &off, &len), 0);
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

		assert_int_equal(
			kvfs_store_open(h->dir, KVFS_META_NOSYNC, 0, &s), 0);
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
	assert_int_equal(hread(h, HN_MIX, kv, 2, 0, KVFS_CHUNK_FROM_SSD, false,
			       p, &res),
			 0);
	hx_free(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hidden_pieces),
		cmocka_unit_test(test_hidden_kv_image),
		cmocka_unit_test(test_hidden_crcs),
		cmocka_unit_test(test_hidden_no_weights),
	};

	chunk_fx_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
