/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the chunk records of meta/meta.c: per-chunk CRC tables
 * ("ccrc") and chunk scores ("score"). Most run in an in-memory
 * environment; damaged records and stores older than the "ccrc" database
 * are written through liblmdb directly into a temp-dir environment.
 */
#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <lmdb.h>

#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"

#define MEMFLAGS (KVFS_META_MEMORY | KVFS_META_NOSYNC)

struct tdir {
	char path[PATH_MAX];
	char env[PATH_MAX + 8];
};

static void tdir_make(struct tdir *d)
{
	const char *base = getenv("TMPDIR");

	snprintf(d->path, sizeof(d->path), "%s/kvfs-test-mchunk-XXXXXX",
		 base && *base ? base : "/tmp");
	assert_non_null(mkdtemp(d->path));
	snprintf(d->env, sizeof(d->env), "%s/meta", d->path);
	assert_int_equal(mkdir(d->env, 0755), 0);
}

static void tdir_remove(struct tdir *d)
{
	char p[PATH_MAX + 32];

	snprintf(p, sizeof(p), "%s/data.mdb", d->env);
	unlink(p);
	snprintf(p, sizeof(p), "%s/lock.mdb", d->env);
	unlink(p);
	rmdir(d->env);
	rmdir(d->path);
}

static struct kvfs_meta *mem_open(void)
{
	struct kvfs_meta *m = NULL;

	assert_int_equal(kvfs_meta_open(NULL, 0, MEMFLAGS, &m), 0);
	return m;
}

static struct kvfs_meta_txn *txn(struct kvfs_meta *m, bool rdonly)
{
	struct kvfs_meta_txn *t = NULL;

	assert_int_equal(kvfs_meta_txn_begin(m, rdonly, &t), 0);
	return t;
}

static void mkkey(uint8_t key[KVFS_KEY_LEN], unsigned v)
{
	memset(key, 0x5a, KVFS_KEY_LEN);
	key[0] = (uint8_t)(v >> 8);
	key[15] = (uint8_t)v;
}

/* ---- raw LMDB access ---- */

static MDB_env *raw_open(const char *dir)
{
	MDB_env *env;

	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
	assert_int_equal(mdb_env_open(env, dir, MDB_NOSYNC, 0600), 0);
	return env;
}

static void raw_put(MDB_env *env, const char *db, const void *key,
		    size_t klen, const void *val, size_t vlen)
{
	MDB_val k = { .mv_size = klen, .mv_data = (void *)key };
	MDB_val v = { .mv_size = vlen, .mv_data = (void *)val };
	MDB_txn *t;
	MDB_dbi dbi;

	assert_int_equal(mdb_txn_begin(env, NULL, 0, &t), 0);
	assert_int_equal(mdb_dbi_open(t, db, MDB_CREATE, &dbi), 0);
	assert_int_equal(mdb_put(t, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(t), 0);
}

/* Whether the environment in @dir has a named database @db. */
static bool raw_has_db(const char *dir, const char *db)
{
	MDB_env *env = raw_open(dir);
	MDB_txn *t;
	MDB_dbi dbi;
	int rc;

	assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &t), 0);
	rc = mdb_dbi_open(t, db, 0, &dbi);
	mdb_txn_abort(t);
	mdb_env_close(env);
	return rc == 0;
}

/* ---- ccrc ---- */

static void test_ccrc_roundtrip(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = txn(m, false);
	uint8_t k1[KVFS_KEY_LEN], k2[KVFS_KEY_LEN];
	uint32_t crc[100], got[100];

	mkkey(k1, 1);
	mkkey(k2, 2);
	for (unsigned i = 0; i < 100; i++)
		crc[i] = 0x9e3779b9u * (i + 1);
	assert_int_equal(kvfs_meta_ccrc_get(t, k1, got, 100), -ENOENT);
	assert_int_equal(kvfs_meta_ccrc_put(t, k1, crc, 100), 0);
	assert_int_equal(kvfs_meta_ccrc_put(t, k2, crc + 50, 7), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = txn(m, true);
	memset(got, 0, sizeof(got));
	assert_int_equal(kvfs_meta_ccrc_get(t, k1, got, 100), 0);
	assert_memory_equal(got, crc, sizeof(crc));
	memset(got, 0, sizeof(got));
	assert_int_equal(kvfs_meta_ccrc_get(t, k2, got, 7), 0);
	assert_memory_equal(got, crc + 50, 7 * sizeof(*crc));
	/* The caller's count must be the stored one. */
	assert_int_equal(kvfs_meta_ccrc_get(t, k1, got, 99), -EUCLEAN);
	assert_int_equal(kvfs_meta_ccrc_get(t, k2, got, 8), -EUCLEAN);
	/* Writes refused in a read-only transaction. */
	assert_int_equal(kvfs_meta_ccrc_put(t, k1, crc, 3), -EBADF);
	assert_int_equal(kvfs_meta_ccrc_del(t, k1), -EBADF);
	kvfs_meta_txn_abort(t);

	/* Replace with another count; delete; deleting again is fine. */
	t = txn(m, false);
	assert_int_equal(kvfs_meta_ccrc_put(t, k1, crc + 10, 3), 0);
	assert_int_equal(kvfs_meta_ccrc_get(t, k1, got, 3), 0);
	assert_memory_equal(got, crc + 10, 3 * sizeof(*crc));
	assert_int_equal(kvfs_meta_ccrc_get(t, k1, got, 100), -EUCLEAN);
	assert_int_equal(kvfs_meta_ccrc_del(t, k1), 0);
	assert_int_equal(kvfs_meta_ccrc_get(t, k1, got, 3), -ENOENT);
	assert_int_equal(kvfs_meta_ccrc_del(t, k1), 0);
	/* The other key is untouched. */
	assert_int_equal(kvfs_meta_ccrc_get(t, k2, got, 7), 0);
	/* Nothing to store is refused. */
	assert_int_equal(kvfs_meta_ccrc_put(t, k1, crc, 0), -EINVAL);
	assert_int_equal(kvfs_meta_ccrc_put(t, k1, NULL, 4), -EINVAL);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

static void test_ccrc_damaged(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	uint8_t kmag[KVFS_KEY_LEN], kver[KVFS_KEY_LEN], ksz[KVFS_KEY_LEN],
		ktc[KVFS_KEY_LEN], kshort[KVFS_KEY_LEN], kgood[KVFS_KEY_LEN];
	struct {
		struct kvfs_meta_ccrc h;
		uint32_t crc[4];
	} v;
	uint32_t crc[4] = { 1, 2, 3, 4 }, got[4];
	MDB_env *env;

	tdir_make(&d);
	assert_int_equal(kvfs_meta_open(d.env, 0,
					KVFS_META_CREATE | KVFS_META_NOSYNC,
					&m),
			 0);
	mkkey(kgood, 10);
	t = txn(m, false);
	assert_int_equal(kvfs_meta_ccrc_put(t, kgood, crc, 4), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);

	mkkey(kmag, 11);
	mkkey(kver, 12);
	mkkey(ksz, 13);
	mkkey(ktc, 14);
	mkkey(kshort, 15);
	env = raw_open(d.env);
	memset(&v, 0, sizeof(v));
	v.h.magic = KVFS_META_CCRC_MAGIC;
	v.h.version = KVFS_META_VERSION;
	v.h.count = 4;
	memcpy(v.crc, crc, sizeof(crc));
	v.h.tcrc = kvfs_fmt_crc32c(0, crc, sizeof(crc));
	/* The good layout, written raw, reads back: the format is as
	 * documented.
	 */
	raw_put(env, "ccrc", ktc, KVFS_KEY_LEN, &v, sizeof(v));
	v.h.magic ^= 1;
	raw_put(env, "ccrc", kmag, KVFS_KEY_LEN, &v, sizeof(v));
	v.h.magic ^= 1;
	v.h.version = 7;
	raw_put(env, "ccrc", kver, KVFS_KEY_LEN, &v, sizeof(v));
	v.h.version = KVFS_META_VERSION;
	raw_put(env, "ccrc", ksz, KVFS_KEY_LEN, &v, sizeof(v) - 4);
	raw_put(env, "ccrc", kshort, KVFS_KEY_LEN, &v, 10);
	mdb_env_close(env);

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_get(t, ktc, got, 4), 0);
	assert_memory_equal(got, crc, sizeof(crc));
	assert_int_equal(kvfs_meta_ccrc_get(t, kgood, got, 4), 0);
	assert_int_equal(kvfs_meta_ccrc_get(t, kmag, got, 4), -EUCLEAN);
	assert_int_equal(kvfs_meta_ccrc_get(t, kver, got, 4), -EPROTO);
	assert_int_equal(kvfs_meta_ccrc_get(t, ksz, got, 4), -EUCLEAN);
	assert_int_equal(kvfs_meta_ccrc_get(t, kshort, got, 4), -EUCLEAN);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);

	/* A flipped CRC in the table fails the table's own CRC. */
	env = raw_open(d.env);
	v.crc[2] ^= 0x100;
	raw_put(env, "ccrc", ktc, KVFS_KEY_LEN, &v, sizeof(v));
	mdb_env_close(env);
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_get(t, ktc, got, 4), -EUCLEAN);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

/* A store made before the "ccrc" database existed opens, gains it, and
 * keeps it.
 */
static void test_ccrc_old_store(void **state)
{
	static const char *const dbs[] = { "sb", "ns", "blk", "free" };
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	uint8_t k[KVFS_KEY_LEN];
	uint32_t crc[3] = { 7, 8, 9 }, got[3];
	MDB_env *env;
	MDB_txn *rt;
	MDB_dbi dbi;

	tdir_make(&d);
	env = raw_open(d.env);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &rt), 0);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(mdb_dbi_open(rt, dbs[i], MDB_CREATE, &dbi),
				 0);
	assert_int_equal(mdb_txn_commit(rt), 0);
	mdb_env_close(env);
	assert_false(raw_has_db(d.env, "ccrc"));

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	mkkey(k, 3);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_get(t, k, got, 3), -ENOENT);
	kvfs_meta_txn_abort(t);
	t = txn(m, false);
	assert_int_equal(kvfs_meta_ccrc_put(t, k, crc, 3), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
	assert_true(raw_has_db(d.env, "ccrc"));

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_get(t, k, got, 3), 0);
	assert_memory_equal(got, crc, sizeof(crc));
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

/* ---- scores ---- */

static void test_score_roundtrip(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = txn(m, false);
	uint8_t k[KVFS_KEY_LEN];
	double i;
	uint64_t f;

	mkkey(k, 1);
	assert_int_equal(kvfs_meta_score_get(t, k, 0, &i, &f), -ENOENT);
	assert_int_equal(kvfs_meta_score_put(t, k, 0, 1.5, 3), 0);
	assert_int_equal(kvfs_meta_score_put(t, k, 7, 0.0, 0), 0);
	assert_int_equal(kvfs_meta_score_put(t, k, 0xfffffffeu, 1e300,
					     UINT64_MAX),
			 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = txn(m, true);
	assert_int_equal(kvfs_meta_score_get(t, k, 0, &i, &f), 0);
	assert_true(i == 1.5);
	assert_int_equal(f, 3);
	assert_int_equal(kvfs_meta_score_get(t, k, 7, &i, &f), 0);
	assert_true(i == 0.0);
	assert_int_equal(f, 0);
	assert_int_equal(kvfs_meta_score_get(t, k, 0xfffffffeu, &i, &f), 0);
	assert_true(i == 1e300);
	assert_true(f == UINT64_MAX);
	assert_int_equal(kvfs_meta_score_get(t, k, 1, &i, &f), -ENOENT);
	assert_int_equal(kvfs_meta_score_put(t, k, 1, 1.0, 1), -EBADF);
	kvfs_meta_txn_abort(t);

	/* Overwrite; bad values refused and the old one kept. */
	t = txn(m, false);
	assert_int_equal(kvfs_meta_score_put(t, k, 0, 2.25, 4), 0);
	assert_int_equal(kvfs_meta_score_put(t, k, 0, -1.0, 5), -EINVAL);
	assert_int_equal(kvfs_meta_score_put(t, k, 0, NAN, 5), -EINVAL);
	assert_int_equal(kvfs_meta_score_put(t, k, 0, INFINITY, 5), -EINVAL);
	assert_int_equal(kvfs_meta_score_get(t, k, 0, &i, &f), 0);
	assert_true(i == 2.25);
	assert_int_equal(f, 4);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

static void test_score_del_block(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = txn(m, false);
	uint8_t lo[KVFS_KEY_LEN], k[KVFS_KEY_LEN], hi[KVFS_KEY_LEN];
	double i;
	uint64_t f;

	/* Neighbours on both sides in key order, one byte apart. */
	mkkey(k, 0x0101);
	memcpy(lo, k, KVFS_KEY_LEN);
	lo[15]--;
	memcpy(hi, k, KVFS_KEY_LEN);
	hi[15]++;
	for (uint32_t j = 0; j < 1000; j++) {
		assert_int_equal(kvfs_meta_score_put(t, k, j * 3, j, j), 0);
		if (j < 5) {
			assert_int_equal(kvfs_meta_score_put(t, lo, j, 1, 1),
					 0);
			assert_int_equal(kvfs_meta_score_put(t, hi, j, 2, 2),
					 0);
		}
	}
	assert_int_equal(kvfs_meta_score_put(t, lo, 0xffffffffu, 1, 1), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = txn(m, true);
	assert_int_equal(kvfs_meta_score_del_block(t, k), -EBADF);
	kvfs_meta_txn_abort(t);

	t = txn(m, false);
	assert_int_equal(kvfs_meta_score_del_block(t, k), 0);
	for (uint32_t j = 0; j < 1000; j++)
		assert_int_equal(kvfs_meta_score_get(t, k, j * 3, &i, &f),
				 -ENOENT);
	for (uint32_t j = 0; j < 5; j++) {
		assert_int_equal(kvfs_meta_score_get(t, lo, j, &i, &f), 0);
		assert_true(i == 1.0);
		assert_int_equal(kvfs_meta_score_get(t, hi, j, &i, &f), 0);
		assert_true(i == 2.0);
	}
	assert_int_equal(kvfs_meta_score_get(t, lo, 0xffffffffu, &i, &f), 0);
	/* Nothing left to delete: still 0. */
	assert_int_equal(kvfs_meta_score_del_block(t, k), 0);
	/* The last key of the database. */
	assert_int_equal(kvfs_meta_score_del_block(t, hi), 0);
	assert_int_equal(kvfs_meta_score_get(t, hi, 0, &i, &f), -ENOENT);
	assert_int_equal(kvfs_meta_score_get(t, lo, 4, &i, &f), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

static void test_score_damaged(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_score rec;
	uint8_t k[KVFS_KEY_LEN], kb[KVFS_KEY_LEN + 4];
	uint32_t be;
	double i;
	uint64_t f;
	MDB_env *env;

	tdir_make(&d);
	assert_int_equal(kvfs_meta_open(d.env, 0,
					KVFS_META_CREATE | KVFS_META_NOSYNC,
					&m),
			 0);
	kvfs_meta_free(m);
	mkkey(k, 9);
	env = raw_open(d.env);
	memset(&rec, 0, sizeof(rec));
	rec.magic = KVFS_META_SCORE_MAGIC;
	rec.version = KVFS_META_VERSION;
	rec.i = 4.5;
	rec.f = 2;
	memcpy(kb, k, KVFS_KEY_LEN);
	/* chunk 1: the documented layout, read back */
	be = htobe32(1);
	memcpy(kb + KVFS_KEY_LEN, &be, 4);
	raw_put(env, "score", kb, sizeof(kb), &rec, sizeof(rec));
	/* chunk 2: I is NaN */
	rec.i = NAN;
	be = htobe32(2);
	memcpy(kb + KVFS_KEY_LEN, &be, 4);
	raw_put(env, "score", kb, sizeof(kb), &rec, sizeof(rec));
	/* chunk 3: negative I */
	rec.i = -2;
	be = htobe32(3);
	memcpy(kb + KVFS_KEY_LEN, &be, 4);
	raw_put(env, "score", kb, sizeof(kb), &rec, sizeof(rec));
	/* chunk 4: short */
	rec.i = 1;
	be = htobe32(4);
	memcpy(kb + KVFS_KEY_LEN, &be, 4);
	raw_put(env, "score", kb, sizeof(kb), &rec, sizeof(rec) - 8);
	/* chunk 5: another version */
	rec.version = 9;
	be = htobe32(5);
	memcpy(kb + KVFS_KEY_LEN, &be, 4);
	raw_put(env, "score", kb, sizeof(kb), &rec, sizeof(rec));
	mdb_env_close(env);

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_score_get(t, k, 1, &i, &f), 0);
	assert_true(i == 4.5);
	assert_int_equal(f, 2);
	assert_int_equal(kvfs_meta_score_get(t, k, 2, &i, &f), -EUCLEAN);
	assert_int_equal(kvfs_meta_score_get(t, k, 3, &i, &f), -EUCLEAN);
	assert_int_equal(kvfs_meta_score_get(t, k, 4, &i, &f), -EUCLEAN);
	assert_int_equal(kvfs_meta_score_get(t, k, 5, &i, &f), -EPROTO);
	kvfs_meta_txn_abort(t);
	/* del_block removes damaged records too. */
	t = txn(m, false);
	assert_int_equal(kvfs_meta_score_del_block(t, k), 0);
	for (uint32_t j = 1; j <= 5; j++)
		assert_int_equal(kvfs_meta_score_get(t, k, j, &i, &f),
				 -ENOENT);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

static void test_persist(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	uint8_t k[KVFS_KEY_LEN];
	uint32_t crc[2] = { 0xdeadbeef, 0x12345678 }, got[2];
	double i;
	uint64_t f;

	tdir_make(&d);
	assert_int_equal(kvfs_meta_open(d.env, 0,
					KVFS_META_CREATE | KVFS_META_NOSYNC,
					&m),
			 0);
	mkkey(k, 4);
	t = txn(m, false);
	assert_int_equal(kvfs_meta_ccrc_put(t, k, crc, 2), 0);
	assert_int_equal(kvfs_meta_score_put(t, k, 3, 0.125, 17), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	/* An aborted transaction leaves nothing behind. */
	t = txn(m, false);
	assert_int_equal(kvfs_meta_score_put(t, k, 4, 1, 1), 0);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_get(t, k, got, 2), 0);
	assert_memory_equal(got, crc, sizeof(crc));
	assert_int_equal(kvfs_meta_score_get(t, k, 3, &i, &f), 0);
	assert_true(i == 0.125);
	assert_int_equal(f, 17);
	assert_int_equal(kvfs_meta_score_get(t, k, 4, &i, &f), -ENOENT);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

/* ---- walks over the keys (fsck's orphan check) ---- */

struct walk {
	uint8_t keys[8][KVFS_KEY_LEN];
	uint32_t n[8];
	size_t calls;
	size_t stop_at; /* return 99 on this call (1-based); 0 never */
	struct kvfs_meta_txn *del; /* delete each key's records in it */
};

static int walk_ccrc_cb(const uint8_t *key, void *arg)
{
	struct walk *w = arg;

	assert_true(w->calls < 8);
	memcpy(w->keys[w->calls++], key, KVFS_KEY_LEN);
	if (w->del)
		assert_int_equal(kvfs_meta_ccrc_del(w->del, key), 0);
	return w->calls == w->stop_at ? 99 : 0;
}

static int walk_score_cb(const uint8_t *key, uint32_t n, void *arg)
{
	struct walk *w = arg;

	assert_true(w->calls < 8);
	w->n[w->calls] = n;
	memcpy(w->keys[w->calls++], key, KVFS_KEY_LEN);
	if (w->del)
		assert_int_equal(kvfs_meta_score_del_block(w->del, key), 0);
	return w->calls == w->stop_at ? 99 : 0;
}

static void test_ccrc_foreach(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = txn(m, false);
	uint8_t k[3][KVFS_KEY_LEN];
	uint32_t crc[2] = { 5, 6 }, got[2];
	struct walk w = { 0 };

	/* Put out of order; the walk is in key order. */
	mkkey(k[0], 0x0001);
	mkkey(k[1], 0x0100);
	mkkey(k[2], 0x0102);
	assert_int_equal(kvfs_meta_ccrc_foreach(t, walk_ccrc_cb, &w), 0);
	assert_int_equal(w.calls, 0);
	assert_int_equal(kvfs_meta_ccrc_put(t, k[2], crc, 2), 0);
	assert_int_equal(kvfs_meta_ccrc_put(t, k[0], crc, 1), 0);
	assert_int_equal(kvfs_meta_ccrc_put(t, k[1], crc, 2), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_foreach(t, walk_ccrc_cb, &w), 0);
	assert_int_equal(w.calls, 3);
	for (size_t i = 0; i < 3; i++)
		assert_memory_equal(w.keys[i], k[i], KVFS_KEY_LEN);
	memset(&w, 0, sizeof(w));
	w.stop_at = 2;
	assert_int_equal(kvfs_meta_ccrc_foreach(t, walk_ccrc_cb, &w), 99);
	assert_int_equal(w.calls, 2);
	kvfs_meta_txn_abort(t);

	/* Deleting each key as it is visited visits each once. */
	t = txn(m, false);
	memset(&w, 0, sizeof(w));
	w.del = t;
	assert_int_equal(kvfs_meta_ccrc_foreach(t, walk_ccrc_cb, &w), 0);
	assert_int_equal(w.calls, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_memory_equal(w.keys[i], k[i], KVFS_KEY_LEN);
		assert_int_equal(kvfs_meta_ccrc_get(t, k[i], got, 2), -ENOENT);
	}
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

static void test_score_foreach(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = txn(m, false);
	uint8_t lo[KVFS_KEY_LEN], k[KVFS_KEY_LEN], hi[KVFS_KEY_LEN];
	struct walk w = { 0 };
	double i;
	uint64_t f;

	/* Neighbours one byte apart: the grouping is by the whole key. */
	mkkey(k, 0x0101);
	memcpy(lo, k, KVFS_KEY_LEN);
	lo[15]--;
	memcpy(hi, k, KVFS_KEY_LEN);
	hi[15]++;
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 0);
	assert_int_equal(w.calls, 0);
	for (uint32_t j = 0; j < 1000; j++)
		assert_int_equal(kvfs_meta_score_put(t, k, j * 3, j, j), 0);
	for (uint32_t j = 0; j < 5; j++)
		assert_int_equal(kvfs_meta_score_put(t, lo, j, 1, 1), 0);
	assert_int_equal(kvfs_meta_score_put(t, lo, 0xffffffffu, 1, 1), 0);
	assert_int_equal(kvfs_meta_score_put(t, hi, 0, 2, 2), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = txn(m, true);
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 0);
	assert_int_equal(w.calls, 3);
	assert_memory_equal(w.keys[0], lo, KVFS_KEY_LEN);
	assert_int_equal(w.n[0], 6);
	assert_memory_equal(w.keys[1], k, KVFS_KEY_LEN);
	assert_int_equal(w.n[1], 1000);
	assert_memory_equal(w.keys[2], hi, KVFS_KEY_LEN);
	assert_int_equal(w.n[2], 1);
	memset(&w, 0, sizeof(w));
	w.stop_at = 1;
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 99);
	assert_int_equal(w.calls, 1);
	kvfs_meta_txn_abort(t);

	/* Deleting each block's scores as it is visited visits each once;
	 * and so does a walk where nothing is deleted in a write txn.
	 */
	t = txn(m, false);
	memset(&w, 0, sizeof(w));
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 0);
	assert_int_equal(w.calls, 3);
	memset(&w, 0, sizeof(w));
	w.del = t;
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 0);
	assert_int_equal(w.calls, 3);
	assert_int_equal(w.n[1], 1000);
	assert_int_equal(kvfs_meta_score_get(t, k, 3, &i, &f), -ENOENT);
	assert_int_equal(kvfs_meta_score_get(t, lo, 0, &i, &f), -ENOENT);
	assert_int_equal(kvfs_meta_score_get(t, hi, 0, &i, &f), -ENOENT);
	memset(&w, 0, sizeof(w));
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 0);
	assert_int_equal(w.calls, 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

/* Entries of the wrong key length, as only a hand edit makes them. */
static void test_foreach_odd_keys(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_score rec = { .magic = KVFS_META_SCORE_MAGIC,
				       .version = KVFS_META_VERSION };
	uint8_t k[KVFS_KEY_LEN], kb[KVFS_KEY_LEN + 1];
	struct walk w = { 0 };
	MDB_env *env;

	tdir_make(&d);
	assert_int_equal(kvfs_meta_open(d.env, 0,
					KVFS_META_CREATE | KVFS_META_NOSYNC,
					&m),
			 0);
	mkkey(k, 7);
	t = txn(m, false);
	assert_int_equal(kvfs_meta_ccrc_put(t, k, (uint32_t[]){ 1 }, 1), 0);
	assert_int_equal(kvfs_meta_score_put(t, k, 0, 1, 1), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);

	env = raw_open(d.env);
	raw_put(env, "ccrc", "short", 5, &rec, sizeof(rec));
	raw_put(env, "score", "tiny", 4, &rec, sizeof(rec));
	/* 17 bytes under k: counted with k's scores. */
	memcpy(kb, k, KVFS_KEY_LEN);
	kb[KVFS_KEY_LEN] = 1;
	raw_put(env, "score", kb, sizeof(kb), &rec, sizeof(rec));
	mdb_env_close(env);

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = txn(m, true);
	assert_int_equal(kvfs_meta_ccrc_foreach(t, walk_ccrc_cb, &w), 0);
	assert_int_equal(w.calls, 1);
	assert_memory_equal(w.keys[0], k, KVFS_KEY_LEN);
	memset(&w, 0, sizeof(w));
	assert_int_equal(kvfs_meta_score_foreach(t, walk_score_cb, &w), 0);
	assert_int_equal(w.calls, 1);
	assert_memory_equal(w.keys[0], k, KVFS_KEY_LEN);
	assert_int_equal(w.n[0], 2);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ccrc_roundtrip),
		cmocka_unit_test(test_ccrc_damaged),
		cmocka_unit_test(test_ccrc_old_store),
		cmocka_unit_test(test_score_roundtrip),
		cmocka_unit_test(test_score_del_block),
		cmocka_unit_test(test_score_damaged),
		cmocka_unit_test(test_persist),
		cmocka_unit_test(test_ccrc_foreach),
		cmocka_unit_test(test_score_foreach),
		cmocka_unit_test(test_foreach_odd_keys),
	};

	/* Refusals log by design; keep the test output readable. */
	kvfs_log_set_level(getenv("KVFS_TEST_LOG") ? KVFS_LOG_DEBUG : -1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
