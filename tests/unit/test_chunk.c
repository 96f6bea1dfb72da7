/* SPDX-License-Identifier: MIT */
/*
 * Chunk-granular reads and the chunk cache (cache/chunk.c) on a real
 * engine instance (the fixture of chunk_fx_i.h): piece sets from memory
 * and the SSD, bad input, corrupt pieces, the two chunk sets and their
 * scores, and readers, scorers and evictions at once.  Speculative loads
 * are in test_chunk_spec.c, hidden-state blocks in test_chunk_hidden.c.
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
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "tests/unit/chunk_fx_i.h"

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
				int c = (int)(xs(&seed) %
					      (i == NBLK - 1 ? 3 : 4));
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
			struct kvfs_chunk_result res =
				read_pieces(f, n, t, np, KVFS_CHUNK_FROM_SSD);

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
	const uint8_t *w = want(l->f, NS_BF16, l->r->blk[i], l->r->p[i].layer,
				l->r->p[i].chunk, &len);

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
						    on_piece, &l),
				 0);
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
	static const int bad[][3] = {
		{ 0, 4, 0 }, { 0, 0, 4 }, { NBLK - 1, 0, 3 }, { 0, 99, 99 }
	};
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
	assert_int_equal(
		kvfs_fmt_chunk_range(&g, blk_tokens(i), l, c, &off, &len), 0);
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
	assert_int_equal(kvfs_meta_ccrc_get(t, f->key[NS_BF16][0], crc, 16), 0);
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
	enum {
		G = KVFS_CHUNK_IN_GPU,
		D = KVFS_CHUNK_IN_DRAM,
		N = KVFS_CHUNK_IN_NONE
	};
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
		unsigned flags = xs(&seed) % 5 == 0 ? KVFS_CHUNK_SPECULATIVE :
						      0;

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
		assert_int_equal(
			pthread_create(&t[k], NULL, reader_main, &th[k]), 0);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_copy),
		cmocka_unit_test_setup_teardown(test_random_sets, setup_nocache,
						teardown),
		cmocka_unit_test_setup_teardown(test_duplicates, setup_nocache,
						teardown),
		cmocka_unit_test_setup_teardown(test_coalesce, setup_nocache,
						teardown),
		cmocka_unit_test_setup_teardown(test_read_cb, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_bad_input, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_piece, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_stored_crcs,
						setup_nocache, teardown),
		cmocka_unit_test_setup_teardown(test_two_sets, setup_sets,
						teardown),
		cmocka_unit_test_setup_teardown(test_scores_persist, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_decay, setup_decay,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_decay, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_concurrent, setup_small,
						teardown),
	};

	chunk_fx_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
