/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for meta/meta.c: records, free map, errno mapping and
 * persistence.  Damaged records are written through liblmdb directly into
 * a temp-dir environment that kvfs_meta then reopens.
 */
#include <endian.h>
#include <errno.h>
#include <limits.h>
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

#include "meta/log.h"
#include "meta/meta.h"

#define MEMFLAGS (KVFS_META_MEMORY | KVFS_META_NOSYNC)

struct tdir {
	char path[PATH_MAX]; /* the temp dir */
	char env[PATH_MAX + 8]; /* path/meta */
};

static void tdir_make(struct tdir *d)
{
	const char *base = getenv("TMPDIR");

	snprintf(d->path, sizeof(d->path), "%s/kvfs-test-meta-XXXXXX",
		 base && *base ? base : "/tmp");
	assert_non_null(mkdtemp(d->path));
	snprintf(d->env, sizeof(d->env), "%s/meta", d->path);
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
	assert_non_null(m);
	return m;
}

static struct kvfs_meta_txn *wtxn(struct kvfs_meta *m)
{
	struct kvfs_meta_txn *t = NULL;

	assert_int_equal(kvfs_meta_txn_begin(m, false, &t), 0);
	return t;
}

static struct kvfs_meta_txn *rtxn(struct kvfs_meta *m)
{
	struct kvfs_meta_txn *t = NULL;

	assert_int_equal(kvfs_meta_txn_begin(m, true, &t), 0);
	return t;
}

static void mkkey(uint8_t key[KVFS_KEY_LEN], unsigned v)
{
	memset(key, 0, KVFS_KEY_LEN);
	key[0] = (uint8_t)(v >> 8);
	key[1] = (uint8_t)v;
	key[15] = 0xa5;
}

static void mkns(struct kvfs_meta_ns *ns, const char *name, uint32_t id)
{
	memset(ns, 0, sizeof(*ns));
	snprintf(ns->name, sizeof(ns->name), "%s", name);
	ns->id = id;
	ns->n_layers = 32;
	ns->n_kv_heads = 8;
	ns->head_dim = 128;
	ns->dtype = KVFS_DTYPE_BF16;
	ns->block_tokens = 16;
	ns->chunk_tokens = 16;
	memset(ns->root, (int)id, sizeof(ns->root));
	snprintf(ns->salt, sizeof(ns->salt), "salt-%u", id);
}

static void mkblk(struct kvfs_meta_blk *b, unsigned v)
{
	memset(b, 0, sizeof(*b));
	b->kind = KVFS_KIND_KV;
	b->ns_id = 1;
	b->depth = v;
	b->ino = 1000 + v;
	b->n_tokens = 16;
	b->size = 4096ull * (v + 2);
	b->ssd_off = 4096ull * v;
	b->ssd_len = 8192;
	b->start_pos = 16ull * v;
	b->hits = v * 3;
	b->last_access = 1234567890123ull + v;
	b->tiers = KVFS_TIER_BIT_DRAM;
}

/* ---- raw LMDB access for damaged records ---- */

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
	MDB_txn *txn;
	MDB_dbi dbi;

	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, db, MDB_CREATE, &dbi), 0);
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
}

static void raw_free_put(MDB_env *env, uint64_t off, uint64_t len)
{
	uint64_t be = htobe64(off), le = htole64(len);

	raw_put(env, "free", &be, sizeof(be), &le, sizeof(le));
}

/* A fresh kvfs environment in @d, closed again. */
static void tdir_env_create(struct tdir *d)
{
	struct kvfs_meta *m;

	tdir_make(d);
	assert_int_equal(kvfs_meta_open(d->env, 0,
					KVFS_META_CREATE | KVFS_META_NOSYNC,
					&m),
			 0);
	kvfs_meta_free(m);
}

/* ---- superblock ---- */

static void test_sb_roundtrip(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);
	struct kvfs_meta_sb sb, got;

	assert_int_equal(kvfs_meta_sb_get(t, &got), -ENOENT);
	memset(&sb, 0, sizeof(sb));
	for (int i = 0; i < 16; i++)
		sb.uuid[i] = (uint8_t)(i * 7 + 1);
	sb.ssd_size = 64ull << 20;
	sb.data_off = 4096;
	sb.created = 1700000000;
	sb.next_ino = 42;
	sb.next_ns_id = 3;
	assert_int_equal(kvfs_meta_sb_put(t, &sb), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = rtxn(m);
	memset(&got, 0xff, sizeof(got));
	assert_int_equal(kvfs_meta_sb_get(t, &got), 0);
	/* put stamps magic and version. */
	assert_int_equal(got.magic, KVFS_META_SB_MAGIC);
	assert_int_equal(got.version, KVFS_META_VERSION);
	sb.magic = KVFS_META_SB_MAGIC;
	sb.version = KVFS_META_VERSION;
	assert_memory_equal(&got, &sb, sizeof(sb));
	/* A read-only transaction refuses writes. */
	assert_int_equal(kvfs_meta_sb_put(t, &sb), -EBADF);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
}

/* ---- namespaces ---- */

struct ns_walk {
	char names[8][KVFS_NS_NAME_MAX];
	uint32_t ids[8];
	int n;
	int stop_at; /* return 77 after this many; -1 never */
};

static int ns_cb(const struct kvfs_meta_ns *ns, void *arg)
{
	struct ns_walk *w = arg;

	assert_true(w->n < 8);
	snprintf(w->names[w->n], KVFS_NS_NAME_MAX, "%s", ns->name);
	w->ids[w->n] = ns->id;
	w->n++;
	return w->n == w->stop_at ? 77 : 0;
}

static void test_ns_roundtrip(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);
	struct kvfs_meta_ns ns, got;
	char longname[KVFS_NS_NAME_MAX + 8];

	mkns(&ns, "llama", 2);
	assert_int_equal(kvfs_meta_ns_put(t, &ns), 0);
	mkns(&ns, "demo", 1);
	assert_int_equal(kvfs_meta_ns_put(t, &ns), 0);
	mkns(&ns, "qwen-7b", 3);
	assert_int_equal(kvfs_meta_ns_put(t, &ns), 0);
	/* Overwrite keeps one record per name. */
	mkns(&ns, "demo", 1);
	ns.n_layers = 40;
	assert_int_equal(kvfs_meta_ns_put(t, &ns), 0);
	/* An empty name is refused. */
	mkns(&ns, "", 9);
	assert_int_equal(kvfs_meta_ns_put(t, &ns), -EINVAL);
	/* So is a name filling the whole field (no terminator). */
	mkns(&ns, "x", 9);
	memset(ns.name, 'a', sizeof(ns.name));
	assert_int_equal(kvfs_meta_ns_put(t, &ns), -EINVAL);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = rtxn(m);
	assert_int_equal(kvfs_meta_ns_get(t, "demo", &got), 0);
	mkns(&ns, "demo", 1);
	ns.n_layers = 40;
	ns.magic = KVFS_META_NS_MAGIC;
	ns.version = KVFS_META_VERSION;
	assert_memory_equal(&got, &ns, sizeof(ns));
	assert_int_equal(kvfs_meta_ns_get(t, "qwen-7b", &got), 0);
	assert_int_equal(got.id, 3);
	assert_string_equal(got.salt, "salt-3");
	assert_int_equal(kvfs_meta_ns_get(t, "nope", &got), -ENOENT);
	assert_int_equal(kvfs_meta_ns_get(t, "dem", &got), -ENOENT);
	assert_int_equal(kvfs_meta_ns_get(t, "", &got), -ENOENT);
	assert_int_equal(kvfs_meta_ns_get(t, NULL, &got), -ENOENT);
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	assert_int_equal(kvfs_meta_ns_get(t, longname, &got), -ENOENT);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
}

static void test_ns_foreach(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);
	static const char *const names[] = { "zeta", "alpha", "mid", "beta" };
	struct kvfs_meta_ns ns;
	struct ns_walk w = { .stop_at = -1 };

	assert_int_equal(kvfs_meta_ns_foreach(t, ns_cb, &w), 0);
	assert_int_equal(w.n, 0);
	for (unsigned i = 0; i < 4; i++) {
		mkns(&ns, names[i], i + 1);
		assert_int_equal(kvfs_meta_ns_put(t, &ns), 0);
	}
	/* In the write transaction (re-seeking path). */
	assert_int_equal(kvfs_meta_ns_foreach(t, ns_cb, &w), 0);
	assert_int_equal(w.n, 4);
	assert_string_equal(w.names[0], "alpha");
	assert_string_equal(w.names[1], "beta");
	assert_string_equal(w.names[2], "mid");
	assert_string_equal(w.names[3], "zeta");
	assert_int_equal(w.ids[0], 2);
	assert_int_equal(w.ids[3], 1);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = rtxn(m);
	memset(&w, 0, sizeof(w));
	w.stop_at = 2;
	assert_int_equal(kvfs_meta_ns_foreach(t, ns_cb, &w), 77);
	assert_int_equal(w.n, 2);
	assert_string_equal(w.names[1], "beta");
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
}

/* ---- block records ---- */

struct blk_walk {
	uint8_t keys[16][KVFS_KEY_LEN];
	uint64_t inos[16];
	bool bad[16];
	int n;
	int stop_at;
	struct kvfs_meta_txn *del_in; /* delete each record when set */
};

static int blk_cb(const uint8_t *key, const struct kvfs_meta_blk *rec,
		  bool bad, void *arg)
{
	struct blk_walk *w = arg;

	assert_true(w->n < 16);
	memcpy(w->keys[w->n], key, KVFS_KEY_LEN);
	w->inos[w->n] = rec->ino;
	w->bad[w->n] = bad;
	w->n++;
	if (w->del_in)
		assert_int_equal(kvfs_meta_blk_del(w->del_in, key), 0);
	return w->n == w->stop_at ? -EINTR : 0;
}

static void test_blk_roundtrip(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);
	struct kvfs_meta_blk b, got;
	uint8_t k1[KVFS_KEY_LEN], k2[KVFS_KEY_LEN];

	mkkey(k1, 1);
	mkkey(k2, 2);
	assert_int_equal(kvfs_meta_blk_get(t, k1, &got), -ENOENT);
	mkblk(&b, 1);
	assert_int_equal(kvfs_meta_blk_put(t, k1, &b), 0);
	mkblk(&b, 2);
	assert_int_equal(kvfs_meta_blk_put(t, k2, &b), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = rtxn(m);
	assert_int_equal(kvfs_meta_blk_get(t, k1, &got), 0);
	mkblk(&b, 1);
	b.magic = KVFS_META_BLK_MAGIC;
	b.version = KVFS_META_VERSION;
	assert_memory_equal(&got, &b, sizeof(b));
	assert_int_equal(kvfs_meta_blk_del(t, k1), -EBADF);
	kvfs_meta_txn_abort(t);

	t = wtxn(m);
	assert_int_equal(kvfs_meta_blk_del(t, k1), 0);
	assert_int_equal(kvfs_meta_blk_del(t, k1), -ENOENT);
	assert_int_equal(kvfs_meta_blk_get(t, k1, &got), -ENOENT);
	assert_int_equal(kvfs_meta_blk_get(t, k2, &got), 0);
	assert_int_equal(got.ino, 1002);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

static void test_blk_foreach(void **state)
{
	static const unsigned order[] = { 300, 5, 77, 1, 256, 2 };
	static const unsigned sorted[] = { 1, 2, 5, 77, 256, 300 };
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);
	struct kvfs_meta_blk b, got;
	struct blk_walk w = { .stop_at = -1 };
	uint8_t k[KVFS_KEY_LEN];

	for (unsigned i = 0; i < 6; i++) {
		mkkey(k, order[i]);
		mkblk(&b, order[i]);
		assert_int_equal(kvfs_meta_blk_put(t, k, &b), 0);
	}
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = rtxn(m);
	assert_int_equal(kvfs_meta_blk_foreach(t, blk_cb, &w), 0);
	assert_int_equal(w.n, 6);
	for (int i = 0; i < 6; i++) {
		mkkey(k, sorted[i]);
		assert_memory_equal(w.keys[i], k, KVFS_KEY_LEN);
		assert_int_equal(w.inos[i], 1000 + sorted[i]);
		assert_false(w.bad[i]);
	}
	memset(&w, 0, sizeof(w));
	w.stop_at = 3;
	assert_int_equal(kvfs_meta_blk_foreach(t, blk_cb, &w), -EINTR);
	assert_int_equal(w.n, 3);
	kvfs_meta_txn_abort(t);

	/* Deleting the current record from the callback visits each one
	 * exactly once and leaves nothing behind.
	 */
	t = wtxn(m);
	memset(&w, 0, sizeof(w));
	w.stop_at = -1;
	w.del_in = t;
	assert_int_equal(kvfs_meta_blk_foreach(t, blk_cb, &w), 0);
	assert_int_equal(w.n, 6);
	for (int i = 0; i < 6; i++) {
		mkkey(k, sorted[i]);
		assert_memory_equal(w.keys[i], k, KVFS_KEY_LEN);
		assert_int_equal(kvfs_meta_blk_get(t, k, &got), -ENOENT);
	}
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

/* ---- free map ---- */

struct fwalk {
	uint64_t off[16];
	uint64_t len[16];
	int n;
	int stop_at;
};

static int free_cb(uint64_t off, uint64_t len, void *arg)
{
	struct fwalk *w = arg;

	assert_true(w->n < 16);
	w->off[w->n] = off;
	w->len[w->n] = len;
	w->n++;
	return w->n == w->stop_at ? 5 : 0;
}

/* Assert the map equals the (off, len) pairs that follow @n. */
static void free_expect(struct kvfs_meta_txn *t, int n, ...)
{
	struct fwalk w = { .stop_at = -1 };
	va_list ap;

	assert_int_equal(kvfs_meta_free_foreach(t, free_cb, &w), 0);
	assert_int_equal(w.n, n);
	va_start(ap, n);
	for (int i = 0; i < n; i++) {
		uint64_t off = va_arg(ap, uint64_t);
		uint64_t len = va_arg(ap, uint64_t);

		assert_int_equal(w.off[i], off);
		assert_int_equal(w.len[i], len);
	}
	va_end(ap);
}

#define U(x) ((uint64_t)(x))

static void test_free_give_merge(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);

	free_expect(t, 0);
	assert_int_equal(kvfs_meta_free_give(t, 40960, 4096), 0);
	assert_int_equal(kvfs_meta_free_give(t, 8192, 4096), 0);
	/* Offsets past 2^32 and 2^8 sort numerically (big-endian keys). */
	assert_int_equal(kvfs_meta_free_give(t, 1ull << 33, 4096), 0);
	assert_int_equal(kvfs_meta_free_give(t, 256, 16), 0);
	free_expect(t, 4, U(256), U(16), U(8192), U(4096), U(40960), U(4096),
		    U(1) << 33, U(4096));
	/* Adjacent to the previous extent only. */
	assert_int_equal(kvfs_meta_free_give(t, 12288, 4096), 0);
	free_expect(t, 4, U(256), U(16), U(8192), U(8192), U(40960), U(4096),
		    U(1) << 33, U(4096));
	/* Adjacent to the next extent only. */
	assert_int_equal(kvfs_meta_free_give(t, 36864, 4096), 0);
	free_expect(t, 4, U(256), U(16), U(8192), U(8192), U(36864), U(8192),
		    U(1) << 33, U(4096));
	/* Bridging both neighbours collapses three into one. */
	assert_int_equal(kvfs_meta_free_give(t, 16384, 20480), 0);
	free_expect(t, 3, U(256), U(16), U(8192), U(36864), U(1) << 33,
		    U(4096));
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	/* Visible to a later reader, with early stop. */
	t = rtxn(m);
	{
		struct fwalk w = { .stop_at = 2 };

		assert_int_equal(kvfs_meta_free_foreach(t, free_cb, &w), 5);
		assert_int_equal(w.n, 2);
		assert_int_equal(w.off[1], 8192);
	}
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
}

static void test_free_take_split(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);

	assert_int_equal(kvfs_meta_free_give(t, 4096, 1 << 20), 0);
	/* Middle: split in two. */
	assert_int_equal(kvfs_meta_free_take(t, 8192, 4096), 0);
	free_expect(t, 2, U(4096), U(4096), U(12288), U((1 << 20) - 8192));
	/* Head of an extent. */
	assert_int_equal(kvfs_meta_free_take(t, 12288, 8192), 0);
	free_expect(t, 2, U(4096), U(4096), U(20480), U((1 << 20) - 16384));
	/* Tail of an extent. */
	assert_int_equal(kvfs_meta_free_take(t, (1 << 20), 4096), 0);
	free_expect(t, 2, U(4096), U(4096), U(20480), U((1 << 20) - 20480));
	/* A whole extent. */
	assert_int_equal(kvfs_meta_free_take(t, 4096, 4096), 0);
	free_expect(t, 1, U(20480), U((1 << 20) - 20480));
	/* Giving everything back restores the single extent. */
	assert_int_equal(kvfs_meta_free_give(t, 4096, 16384), 0);
	assert_int_equal(kvfs_meta_free_give(t, 1 << 20, 4096), 0);
	free_expect(t, 1, U(4096), U(1 << 20));
	/* clear empties the map. */
	assert_int_equal(kvfs_meta_free_clear(t), 0);
	free_expect(t, 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);

	t = rtxn(m);
	free_expect(t, 0);
	assert_int_equal(kvfs_meta_free_give(t, 0, 4096), -EBADF);
	assert_int_equal(kvfs_meta_free_take(t, 0, 4096), -EBADF);
	assert_int_equal(kvfs_meta_free_clear(t), -EBADF);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
}

static void test_free_euclean(void **state)
{
	struct kvfs_meta *m = mem_open();
	struct kvfs_meta_txn *t = wtxn(m);

	/* Taking from an empty map. */
	assert_int_equal(kvfs_meta_free_take(t, 4096, 4096), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_give(t, 10000, 1000), 0);
	assert_int_equal(kvfs_meta_free_give(t, 20000, 1000), 0);
	/* give: exact duplicate, inside, overlapping head, overlapping tail,
	 * covering a whole extent, spanning both.
	 */
	assert_int_equal(kvfs_meta_free_give(t, 10000, 1000), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_give(t, 10100, 10), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_give(t, 9000, 1001), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_give(t, 10999, 100), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_give(t, 9000, 3000), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_give(t, 10500, 10000), -EUCLEAN);
	/* take: before the first, between, after the last, spanning two,
	 * running past an extent's end, starting before an extent.
	 */
	assert_int_equal(kvfs_meta_free_take(t, 0, 100), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_take(t, 15000, 100), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_take(t, 30000, 100), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_take(t, 10500, 10000), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_take(t, 10500, 501), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_take(t, 9999, 10), -EUCLEAN);
	/* Degenerate ranges are bad arguments, not damage. */
	assert_int_equal(kvfs_meta_free_give(t, 50000, 0), -EINVAL);
	assert_int_equal(kvfs_meta_free_take(t, 10000, 0), -EINVAL);
	assert_int_equal(kvfs_meta_free_give(t, UINT64_MAX - 10, 100),
			 -EINVAL);
	/* None of the refusals changed the map. */
	free_expect(t, 2, U(10000), U(1000), U(20000), U(1000));
	/* Touching is fine: exactly between the two merges all. */
	assert_int_equal(kvfs_meta_free_give(t, 11000, 9000), 0);
	free_expect(t, 1, U(10000), U(11000));
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

/* A map written behind kvfs_meta's back is reported, not trusted. */
static void test_free_damaged(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct fwalk w = { .stop_at = -1 };
	MDB_env *env;
	uint64_t be = htobe64(90000);
	uint32_t shortv = 7;

	/* Overlapping entries. */
	tdir_env_create(&d);
	env = raw_open(d.env);
	raw_free_put(env, 10000, 1000);
	raw_free_put(env, 10500, 1000);
	mdb_env_close(env);
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = wtxn(m);
	assert_int_equal(kvfs_meta_free_foreach(t, free_cb, &w), -EUCLEAN);
	assert_int_equal(w.n, 1);
	/* A give inside the second entry is caught as an overlap. */
	assert_int_equal(kvfs_meta_free_give(t, 11000, 100), -EUCLEAN);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);

	/* Touching entries (not merged) and a zero-length entry. */
	tdir_env_create(&d);
	env = raw_open(d.env);
	raw_free_put(env, 10000, 1000);
	raw_free_put(env, 11000, 1000);
	mdb_env_close(env);
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = rtxn(m);
	memset(&w, 0, sizeof(w));
	w.stop_at = -1;
	assert_int_equal(kvfs_meta_free_foreach(t, free_cb, &w), -EUCLEAN);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);

	tdir_env_create(&d);
	env = raw_open(d.env);
	raw_free_put(env, 5000, 0);
	raw_put(env, "free", &be, sizeof(be), &shortv, sizeof(shortv));
	mdb_env_close(env);
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = wtxn(m);
	assert_int_equal(kvfs_meta_free_foreach(t, free_cb, &w), -EUCLEAN);
	/* The zero-length entry is the successor of 1000. */
	assert_int_equal(kvfs_meta_free_give(t, 1000, 100), -EUCLEAN);
	/* The 4-byte value is the predecessor of 100000 and the entry at
	 * 90000 itself.
	 */
	assert_int_equal(kvfs_meta_free_give(t, 100000, 100), -EUCLEAN);
	assert_int_equal(kvfs_meta_free_take(t, 90000, 100), -EUCLEAN);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

/* ---- map full ---- */

static void test_map_full(void **state)
{
	struct kvfs_meta *m = NULL;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_blk b;
	uint8_t k[KVFS_KEY_LEN];
	int rc = 0;
	unsigned i;

	assert_int_equal(kvfs_meta_open(NULL, 64 * 1024, MEMFLAGS, &m), 0);
	t = wtxn(m);
	mkblk(&b, 1);
	for (i = 0; i < 100000 && rc == 0; i++) {
		memset(k, 0, sizeof(k));
		memcpy(k, &i, sizeof(i));
		rc = kvfs_meta_blk_put(t, k, &b);
	}
	assert_int_equal(rc, -ENOSPC);
	/* A 64 KiB map cannot hold thousands of 160-byte records. */
	assert_true(i < 2000);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
}

/* ---- errno mapping ---- */

static void test_errno_table(void **state)
{
	static const struct {
		int mdb;
		int err;
	} tab[] = {
		{ MDB_SUCCESS, 0 },
		{ MDB_NOTFOUND, -ENOENT },
		{ MDB_MAP_FULL, -ENOSPC },
		{ MDB_TXN_FULL, -ENOSPC },
		{ MDB_KEYEXIST, -EEXIST },
		{ MDB_CORRUPTED, -EUCLEAN },
		{ MDB_PAGE_NOTFOUND, -EUCLEAN },
		{ MDB_INVALID, -EUCLEAN },
		{ MDB_VERSION_MISMATCH, -EPROTO },
		{ MDB_READERS_FULL, -EAGAIN },
		{ ENOMEM, -ENOMEM },
		{ EACCES, -EACCES },
		{ ENOSPC, -ENOSPC },
		{ EIO, -EIO },
		{ MDB_PANIC, -EIO },
		{ MDB_BAD_TXN, -EIO },
		{ MDB_BAD_VALSIZE, -EIO },
		{ MDB_MAP_RESIZED, -EIO },
		{ -1, -EIO },
	};

	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		assert_int_equal(kvfs_meta_errno(tab[i].mdb), tab[i].err);
}

/* ---- persistence and opening ---- */

static void test_persist_reopen(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_blk b, got;
	struct kvfs_meta_ns ns;
	uint8_t k1[KVFS_KEY_LEN], k2[KVFS_KEY_LEN];

	tdir_make(&d);
	/* No environment yet. */
	assert_int_equal(kvfs_meta_open(d.env, 0, 0, &m), -ENOENT);
	assert_null(m);
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_CREATE, &m), 0);
	mkkey(k1, 1);
	mkkey(k2, 2);
	t = wtxn(m);
	mkblk(&b, 1);
	assert_int_equal(kvfs_meta_blk_put(t, k1, &b), 0);
	mkns(&ns, "demo", 1);
	assert_int_equal(kvfs_meta_ns_put(t, &ns), 0);
	assert_int_equal(kvfs_meta_free_give(t, 4096, 65536), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	/* Aborted work must not survive. */
	t = wtxn(m);
	mkblk(&b, 2);
	assert_int_equal(kvfs_meta_blk_put(t, k2, &b), 0);
	assert_int_equal(kvfs_meta_free_take(t, 4096, 4096), 0);
	assert_int_equal(kvfs_meta_blk_del(t, k1), 0);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);

	/* CREATE on an existing environment is refused. */
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_CREATE, &m),
			 -EEXIST);
	assert_int_equal(kvfs_meta_open(d.env, 0, 0, &m), 0);
	t = rtxn(m);
	assert_int_equal(kvfs_meta_blk_get(t, k1, &got), 0);
	assert_int_equal(got.ino, 1001);
	assert_int_equal(kvfs_meta_blk_get(t, k2, &got), -ENOENT);
	assert_int_equal(kvfs_meta_ns_get(t, "demo", &ns), 0);
	assert_int_equal(ns.id, 1);
	free_expect(t, 1, U(4096), U(65536));
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	/* Unknown flags are refused. */
	assert_int_equal(kvfs_meta_open(d.env, 0, 1u << 20, &m), -EINVAL);
	tdir_remove(&d);
}

/* An LMDB environment that kvfs did not make is not a kvfs environment. */
static void test_foreign_env(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	MDB_env *env;

	tdir_make(&d);
	assert_int_equal(mkdir(d.env, 0700), 0);
	env = raw_open(d.env);
	raw_put(env, "other", "k", 1, "v", 1);
	mdb_env_close(env);
	assert_int_equal(kvfs_meta_open(d.env, 0, 0, &m), -EUCLEAN);
	assert_null(m);
	tdir_remove(&d);
}

/* ---- damaged records ---- */

struct bad_walk {
	int n;
	int n_bad;
	uint64_t good_ino;
};

static int bad_cb(const uint8_t *key, const struct kvfs_meta_blk *rec,
		  bool bad, void *arg)
{
	struct bad_walk *w = arg;

	w->n++;
	if (bad)
		w->n_bad++;
	else
		w->good_ino = rec->ino;
	return 0;
}

static void test_bad_records(void **state)
{
	struct tdir d;
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_sb sb;
	struct kvfs_meta_ns ns;
	struct kvfs_meta_blk b;
	struct bad_walk bw = { 0 };
	struct ns_walk nw = { .stop_at = -1 };
	uint8_t kgood[KVFS_KEY_LEN], kver[KVFS_KEY_LEN], kmag[KVFS_KEY_LEN];
	uint8_t ksize[KVFS_KEY_LEN], big[300];
	MDB_env *env;

	tdir_env_create(&d);
	mkkey(kgood, 1);
	mkkey(kver, 2);
	mkkey(kmag, 3);
	mkkey(ksize, 4);
	env = raw_open(d.env);
	/* sb: right magic and version, one byte short. */
	memset(&sb, 0, sizeof(sb));
	sb.magic = KVFS_META_SB_MAGIC;
	sb.version = KVFS_META_VERSION;
	raw_put(env, "sb", "sb", 2, &sb, sizeof(sb) - 1);
	/* ns "badmagic": a block record's magic. */
	mkns(&ns, "badmagic", 1);
	ns.magic = KVFS_META_BLK_MAGIC;
	ns.version = KVFS_META_VERSION;
	raw_put(env, "ns", "badmagic", 8, &ns, sizeof(ns));
	/* ns "v2": version 2 and a larger record. */
	memset(big, 0, sizeof(big));
	mkns(&ns, "v2", 2);
	ns.magic = KVFS_META_NS_MAGIC;
	ns.version = 2;
	memcpy(big, &ns, sizeof(ns));
	raw_put(env, "ns", "v2", 2, big, sizeof(big));
	/* ns "alias": valid record whose name is not its key. */
	mkns(&ns, "other", 3);
	ns.magic = KVFS_META_NS_MAGIC;
	ns.version = KVFS_META_VERSION;
	raw_put(env, "ns", "alias", 5, &ns, sizeof(ns));
	/* blk: one good, one other version, one bad magic, one too long. */
	mkblk(&b, 1);
	b.magic = KVFS_META_BLK_MAGIC;
	b.version = KVFS_META_VERSION;
	raw_put(env, "blk", kgood, KVFS_KEY_LEN, &b, sizeof(b));
	b.version = 7;
	raw_put(env, "blk", kver, KVFS_KEY_LEN, &b, sizeof(b));
	b.version = KVFS_META_VERSION;
	b.magic = 0xdeadbeef;
	raw_put(env, "blk", kmag, KVFS_KEY_LEN, &b, sizeof(b));
	b.magic = KVFS_META_BLK_MAGIC;
	memset(big, 0, sizeof(big));
	memcpy(big, &b, sizeof(b));
	raw_put(env, "blk", ksize, KVFS_KEY_LEN, big, sizeof(b) + 8);
	/* A blk entry with a key that is not 16 bytes, and a 2-byte value. */
	raw_put(env, "blk", "short", 5, &b, 2);
	mdb_env_close(env);

	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = rtxn(m);
	assert_int_equal(kvfs_meta_sb_get(t, &sb), -EUCLEAN);
	assert_int_equal(kvfs_meta_ns_get(t, "badmagic", &ns), -EUCLEAN);
	memset(&ns, 0, sizeof(ns));
	assert_int_equal(kvfs_meta_ns_get(t, "v2", &ns), -EPROTO);
	/* On -EPROTO the caller can still name the version it found. */
	assert_int_equal(ns.version, 2);
	assert_int_equal(kvfs_meta_ns_get(t, "alias", &ns), -EUCLEAN);
	assert_int_equal(kvfs_meta_ns_foreach(t, ns_cb, &nw), -EUCLEAN);
	assert_int_equal(kvfs_meta_blk_get(t, kgood, &b), 0);
	assert_int_equal(b.ino, 1001);
	assert_int_equal(kvfs_meta_blk_get(t, kver, &b), -EPROTO);
	assert_int_equal(kvfs_meta_blk_get(t, kmag, &b), -EUCLEAN);
	assert_int_equal(kvfs_meta_blk_get(t, ksize, &b), -EUCLEAN);
	/* foreach: the 4 well-keyed entries, 3 of them flagged bad; the
	 * 5-byte key is skipped.
	 */
	assert_int_equal(kvfs_meta_blk_foreach(t, bad_cb, &bw), 0);
	assert_int_equal(bw.n, 4);
	assert_int_equal(bw.n_bad, 3);
	assert_int_equal(bw.good_ino, 1001);
	kvfs_meta_txn_abort(t);

	/* Another sb version is -EPROTO; a put repairs it. */
	t = wtxn(m);
	memset(&sb, 0, sizeof(sb));
	sb.ssd_size = 1 << 20;
	assert_int_equal(kvfs_meta_sb_put(t, &sb), 0);
	assert_int_equal(kvfs_meta_sb_get(t, &sb), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);

	env = raw_open(d.env);
	memset(&sb, 0, sizeof(sb));
	sb.magic = KVFS_META_SB_MAGIC;
	sb.version = 2;
	raw_put(env, "sb", "sb", 2, &sb, sizeof(sb));
	mdb_env_close(env);
	assert_int_equal(kvfs_meta_open(d.env, 0, KVFS_META_NOSYNC, &m), 0);
	t = rtxn(m);
	assert_int_equal(kvfs_meta_sb_get(t, &sb), -EPROTO);
	assert_int_equal(sb.version, 2);
	kvfs_meta_txn_abort(t);
	kvfs_meta_free(m);
	tdir_remove(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sb_roundtrip),
		cmocka_unit_test(test_ns_roundtrip),
		cmocka_unit_test(test_ns_foreach),
		cmocka_unit_test(test_blk_roundtrip),
		cmocka_unit_test(test_blk_foreach),
		cmocka_unit_test(test_free_give_merge),
		cmocka_unit_test(test_free_take_split),
		cmocka_unit_test(test_free_euclean),
		cmocka_unit_test(test_free_damaged),
		cmocka_unit_test(test_map_full),
		cmocka_unit_test(test_errno_table),
		cmocka_unit_test(test_persist_reopen),
		cmocka_unit_test(test_foreign_env),
		cmocka_unit_test(test_bad_records),
	};

	/* Refusals log by design; keep the test output readable. */
	kvfs_log_set_level(getenv("KVFS_TEST_LOG") ? KVFS_LOG_DEBUG :
						     -1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
