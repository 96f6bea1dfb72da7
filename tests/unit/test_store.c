/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for meta/store.c: creating a store and every check made when
 * one is opened.  Each test works in its own temp directory.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
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
#include <ftw.h>
#include <isa-l/crc.h>
#include <lmdb.h>

#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"

#define MIB (1ull << 20)

struct ctx {
	char base[PATH_MAX];  /* temp dir, removed at teardown */
	char store[PATH_MAX + 16]; /* base/store */
};

static void pjoin(char *buf, size_t len, const char *a, const char *b)
{
	assert_true((size_t)snprintf(buf, len, "%s/%s", a, b) < len);
}

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	return remove(path);
}

/* Only ever a mkdtemp() directory of this test. */
static int rm_tree(const char *path)
{
	return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state)
{
	struct ctx *c = calloc(1, sizeof(*c));
	const char *tmp = getenv("TMPDIR");

	if (!c)
		return -1;
	snprintf(c->base, sizeof(c->base), "%s/kvfs-test-store-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(c->base)) {
		free(c);
		return -1;
	}
	snprintf(c->store, sizeof(c->store), "%s/store", c->base);
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	struct ctx *c = *state;

	rm_tree(c->base);
	free(c);
	return 0;
}

static void file_write(const char *path, const void *buf, size_t len,
		       off_t off)
{
	int fd = open(path, O_WRONLY | O_CREAT, 0644);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, buf, len, off), (ssize_t)len);
	close(fd);
}

static void dhdr_read(const struct ctx *c, struct kvfs_store_dhdr *h)
{
	char p[PATH_MAX * 2];
	int fd;

	pjoin(p, sizeof(p), c->store, KVFS_STORE_DATA_FILE);
	fd = open(p, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, h, sizeof(*h), 0), (ssize_t)sizeof(*h));
	close(fd);
}

static void dhdr_write(const struct ctx *c, const struct kvfs_store_dhdr *h)
{
	char p[PATH_MAX * 2];

	pjoin(p, sizeof(p), c->store, KVFS_STORE_DATA_FILE);
	file_write(p, h, sizeof(*h), 0);
}

static uint32_t crc32c(const void *buf, size_t len)
{
	return ~crc32_iscsi((unsigned char *)buf, (int)len, ~0u);
}

static int open_rc(const struct ctx *c)
{
	struct kvfs_store *s = NULL;
	int rc = kvfs_store_open(c->store, KVFS_META_NOSYNC, 0, &s);

	if (rc)
		assert_null(s);
	kvfs_store_free(s);
	return rc;
}

struct fwalk {
	int n;
	uint64_t off, len;
};

static int free_cb(uint64_t off, uint64_t len, void *arg)
{
	struct fwalk *w = arg;

	w->n++;
	w->off = off;
	w->len = len;
	return 0;
}

static void test_create_open(void **state)
{
	struct ctx *c = *state;
	struct kvfs_store *s = NULL;
	struct kvfs_meta_txn *t;
	struct kvfs_store_dhdr h;
	struct fwalk w = { 0 };
	char p[PATH_MAX * 2], conf[4096];
	struct stat st;
	ssize_t n;
	int fd;

	/* 8 MiB + 100 bytes rounds down to 8 MiB. */
	assert_int_equal(kvfs_store_create(c->store, 8 * MIB + 100, false), 0);
	assert_int_equal(kvfs_store_open(c->store, KVFS_META_NOSYNC, 0, &s),
			 0);
	assert_non_null(s);
	assert_string_equal(s->dir, c->store);
	pjoin(p, sizeof(p), c->store, "data.kvd");
	assert_string_equal(s->data_path, p);
	pjoin(p, sizeof(p), c->store, "meta");
	assert_string_equal(s->meta_dir, p);
	pjoin(p, sizeof(p), c->store, "kvfs.conf");
	assert_string_equal(s->conf_path, p);
	pjoin(p, sizeof(p), c->store, "kvfs.log");
	assert_string_equal(s->log_path, p);
	assert_true(s->lock_fd >= 0);

	assert_int_equal(s->sb.magic, KVFS_META_SB_MAGIC);
	assert_int_equal(s->sb.version, KVFS_META_VERSION);
	assert_int_equal(s->sb.ssd_size, 8 * MIB);
	assert_int_equal(s->sb.data_off, 4096);
	assert_true(s->sb.created > 0);
	assert_int_equal(s->sb.uuid[6] >> 4, 4); /* random uuid */

	/* The data file: preallocated size, header naming the same uuid. */
	assert_int_equal(stat(s->data_path, &st), 0);
	assert_int_equal(st.st_size, 8 * MIB);
	dhdr_read(c, &h);
	assert_memory_equal(h.magic, "KVFSDAT1", 8);
	assert_int_equal(le16toh(h.version), 1);
	assert_memory_equal(h.uuid, s->sb.uuid, 16);
	assert_int_equal(le64toh(h.size), 8 * MIB);
	assert_int_equal(le32toh(h.hdr_crc),
			 crc32c(&h, offsetof(struct kvfs_store_dhdr, hdr_crc)));

	/* The free map is the whole file past the header. */
	assert_int_equal(kvfs_meta_txn_begin(s->meta, true, &t), 0);
	assert_int_equal(kvfs_meta_free_foreach(t, free_cb, &w), 0);
	kvfs_meta_txn_abort(t);
	assert_int_equal(w.n, 1);
	assert_int_equal(w.off, 4096);
	assert_int_equal(w.len, 8 * MIB - 4096);

	/* The default config. */
	fd = open(s->conf_path, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, conf, sizeof(conf) - 1);
	close(fd);
	assert_true(n > 0);
	conf[n] = '\0';
	assert_string_equal(conf, kvfs_store_default_conf());
	assert_non_null(strstr(conf, "[tier.dram]\n"));
	assert_non_null(strstr(conf, "capacity = 256M\n"));
	assert_non_null(strstr(conf, "name = lru\n"));
	assert_non_null(strstr(conf, "[namespace demo]\n"));
	assert_non_null(strstr(conf, "dtype = bf16\n"));

	/* A second open while the first holds the store is refused. */
	assert_int_equal(open_rc(c), -EBUSY);
	/* And so is --force on a store in use. */
	assert_int_equal(kvfs_store_create(c->store, 4 * MIB, true), -EBUSY);
	kvfs_store_free(s);
	assert_int_equal(open_rc(c), 0);
}

static void test_bad_args(void **state)
{
	struct ctx *c = *state;
	struct kvfs_store *s = NULL;
	char p[PATH_MAX * 2], uuid[37];
	static const uint8_t u[16] = { 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc,
				       0x4d, 0xef, 0x80, 1, 2, 3, 4, 5, 6,
				       0xff };

	assert_int_equal(kvfs_store_create(c->store, MIB - 1, false),
			 -EINVAL);
	/* Rounded down below the minimum. */
	assert_int_equal(kvfs_store_create(c->store, MIB + 4095 - 8192,
					   false),
			 -EINVAL);
	assert_int_equal(kvfs_store_create(NULL, 8 * MIB, false), -EINVAL);
	assert_int_equal(kvfs_store_create("", 8 * MIB, false), -EINVAL);
	/* A size no filesystem can allocate fails, and leaves no directory
	 * behind (EFBIG or ENOSPC depending on the filesystem).
	 */
	assert_true(kvfs_store_create(c->store, 1ull << 60, false) < 0);
	assert_int_equal(access(c->store, F_OK), -1);
	/* The minimum itself is fine. */
	assert_int_equal(kvfs_store_create(c->store, MIB, false), 0);
	assert_int_equal(open_rc(c), 0);
	assert_int_equal(kvfs_store_open(c->store, KVFS_META_CREATE, 0, &s),
			 -EINVAL);
	assert_null(s);

	/* A regular file where the store should be. */
	pjoin(p, sizeof(p), c->base, "file");
	file_write(p, "x", 1, 0);
	assert_int_equal(kvfs_store_create(p, 8 * MIB, false), -ENOTDIR);
	assert_int_equal(kvfs_store_open(p, 0, 0, &s), -ENOTDIR);
	pjoin(p, sizeof(p), c->base, "missing");
	assert_int_equal(kvfs_store_open(p, 0, 0, &s), -ENOENT);

	assert_int_equal(kvfs_store_path("/a/b", "kvfs.conf", p, sizeof(p)),
			 0);
	assert_string_equal(p, "/a/b/kvfs.conf");
	assert_int_equal(kvfs_store_path("/a/b", "kvfs.conf", p, 14),
			 -ENAMETOOLONG);
	kvfs_store_uuid_str(u, uuid);
	assert_string_equal(uuid, "12345678-9abc-4def-8001-0203040506ff");
}

static void test_nonempty_and_force(void **state)
{
	struct ctx *c = *state;
	struct kvfs_store *s;
	uint8_t uuid1[16];
	char p[PATH_MAX * 2], conf[64];
	int fd;
	ssize_t n;

	/* A directory with an unrelated file. */
	assert_int_equal(mkdir(c->store, 0755), 0);
	pjoin(p, sizeof(p), c->store, "notes.txt");
	file_write(p, "hello", 5, 0);
	assert_int_equal(kvfs_store_create(c->store, 4 * MIB, false),
			 -ENOTEMPTY);
	pjoin(p, sizeof(p), c->store, "data.kvd");
	assert_int_equal(access(p, F_OK), -1);
	assert_int_equal(kvfs_store_create(c->store, 4 * MIB, true), 0);
	pjoin(p, sizeof(p), c->store, "notes.txt");
	assert_int_equal(access(p, F_OK), 0);

	assert_int_equal(kvfs_store_open(c->store, 0, 0, &s), 0);
	memcpy(uuid1, s->sb.uuid, 16);
	kvfs_store_free(s);

	/* An existing store is refused without --force ... */
	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false),
			 -ENOTEMPTY);
	assert_int_equal(kvfs_store_open(c->store, 0, 0, &s), 0);
	assert_memory_equal(s->sb.uuid, uuid1, 16);
	assert_int_equal(s->sb.ssd_size, 4 * MIB);
	kvfs_store_free(s);

	/* ... and replaced with it, keeping a user-edited kvfs.conf. */
	pjoin(p, sizeof(p), c->store, "kvfs.conf");
	assert_int_equal(unlink(p), 0);
	file_write(p, "[policy]\nname = lru\n", 20, 0);
	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, true), 0);
	assert_int_equal(kvfs_store_open(c->store, 0, 0, &s), 0);
	assert_memory_not_equal(s->sb.uuid, uuid1, 16);
	assert_int_equal(s->sb.ssd_size, 2 * MIB);
	kvfs_store_free(s);
	fd = open(p, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, conf, sizeof(conf));
	close(fd);
	assert_int_equal(n, 20);
	assert_memory_equal(conf, "[policy]\nname = lru\n", 20);

	/* --force refuses to delete a directory it did not make. */
	pjoin(p, sizeof(p), c->store, "meta/sub");
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_not_equal(kvfs_store_create(c->store, 2 * MIB, true), 0);
	assert_int_equal(access(p, F_OK), 0);
}

static void test_missing_meta(void **state)
{
	struct ctx *c = *state;
	char p[PATH_MAX * 2];

	/* An empty directory is not a store. */
	assert_int_equal(mkdir(c->store, 0755), 0);
	assert_int_equal(open_rc(c), -ENOENT);

	/* Nor is a data file without its metadata. */
	assert_int_equal(rmdir(c->store), 0);
	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	pjoin(p, sizeof(p), c->store, "meta/data.mdb");
	assert_int_equal(unlink(p), 0);
	assert_int_equal(open_rc(c), -ENOENT);
}

static void test_missing_data(void **state)
{
	struct ctx *c = *state;
	char p[PATH_MAX * 2];

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	pjoin(p, sizeof(p), c->store, "data.kvd");
	assert_int_equal(unlink(p), 0);
	assert_int_equal(open_rc(c), -ENOENT);
}

static void test_corrupt_data_header(void **state)
{
	struct ctx *c = *state;
	struct kvfs_store_dhdr h, good;

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	dhdr_read(c, &good);

	/* One flipped bit in the uuid: the CRC catches it. */
	h = good;
	h.uuid[3] ^= 0x10;
	dhdr_write(c, &h);
	assert_int_equal(open_rc(c), -EUCLEAN);
	/* Bad magic. */
	h = good;
	memcpy(h.magic, "KVFSBLK1", 8);
	dhdr_write(c, &h);
	assert_int_equal(open_rc(c), -EUCLEAN);
	/* A zeroed header. */
	memset(&h, 0, sizeof(h));
	dhdr_write(c, &h);
	assert_int_equal(open_rc(c), -EUCLEAN);
	/* Another data format version, with a valid CRC. */
	h = good;
	h.version = htole16(2);
	h.hdr_crc = htole32(
		crc32c(&h, offsetof(struct kvfs_store_dhdr, hdr_crc)));
	dhdr_write(c, &h);
	assert_int_equal(open_rc(c), -EPROTO);
	/* A consistent header that disagrees with the superblock's size. */
	h = good;
	h.size = htole64(4 * MIB);
	h.hdr_crc = htole32(
		crc32c(&h, offsetof(struct kvfs_store_dhdr, hdr_crc)));
	dhdr_write(c, &h);
	assert_int_equal(open_rc(c), -EUCLEAN);
	/* Restoring the header restores the store. */
	dhdr_write(c, &good);
	assert_int_equal(open_rc(c), 0);
}

/* A data file from another store: valid header, foreign uuid. */
static void test_uuid_mismatch(void **state)
{
	struct ctx *c = *state;
	struct kvfs_store_dhdr h;

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	dhdr_read(c, &h);
	h.uuid[0] ^= 0xff;
	h.hdr_crc = htole32(
		crc32c(&h, offsetof(struct kvfs_store_dhdr, hdr_crc)));
	dhdr_write(c, &h);
	assert_int_equal(open_rc(c), -EUCLEAN);
}

static void sb_rewrite(const struct ctx *c,
		       void (*edit)(struct kvfs_meta_sb *sb))
{
	char p[PATH_MAX * 2];
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_sb sb;

	pjoin(p, sizeof(p), c->store, "meta");
	assert_int_equal(kvfs_meta_open(p, 0, KVFS_META_NOSYNC, &m), 0);
	assert_int_equal(kvfs_meta_txn_begin(m, false, &t), 0);
	assert_int_equal(kvfs_meta_sb_get(t, &sb), 0);
	edit(&sb);
	assert_int_equal(kvfs_meta_sb_put(t, &sb), 0);
	assert_int_equal(kvfs_meta_txn_commit(t), 0);
	kvfs_meta_free(m);
}

static void edit_uuid(struct kvfs_meta_sb *sb)
{
	sb->uuid[15] ^= 1;
}

static void edit_data_off(struct kvfs_meta_sb *sb)
{
	sb->data_off = 8192;
}

static void edit_size(struct kvfs_meta_sb *sb)
{
	sb->ssd_size = 2 * MIB + 100;
}

/* The superblock side of the cross-checks. */
static void test_sb_mismatch(void **state)
{
	struct ctx *c = *state;

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	sb_rewrite(c, edit_uuid);
	assert_int_equal(open_rc(c), -EUCLEAN);
	sb_rewrite(c, edit_uuid); /* flips it back */
	assert_int_equal(open_rc(c), 0);
	sb_rewrite(c, edit_data_off);
	assert_int_equal(open_rc(c), -EUCLEAN);
}

static void test_sb_bad_size(void **state)
{
	struct ctx *c = *state;

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	sb_rewrite(c, edit_size);
	assert_int_equal(open_rc(c), -EUCLEAN);
}

/* A superblock of another format version (as a future kvfs would write). */
static void test_sb_wrong_version(void **state)
{
	struct ctx *c = *state;
	struct kvfs_meta_sb sb;
	char p[PATH_MAX * 2];
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = { .mv_size = 2, .mv_data = "sb" }, v;

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	pjoin(p, sizeof(p), c->store, "meta");
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
	assert_int_equal(mdb_env_open(env, p, MDB_NOSYNC, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "sb", 0, &dbi), 0);
	assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
	assert_int_equal(v.mv_size, sizeof(sb));
	memcpy(&sb, v.mv_data, sizeof(sb));
	sb.version = 2;
	v.mv_data = &sb;
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
	assert_int_equal(open_rc(c), -EPROTO);
}

static void test_no_superblock(void **state)
{
	struct ctx *c = *state;
	char p[PATH_MAX * 2];
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;

	assert_int_equal(kvfs_store_create(c->store, 2 * MIB, false), 0);
	pjoin(p, sizeof(p), c->store, "meta");
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
	assert_int_equal(mdb_env_open(env, p, MDB_NOSYNC, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "sb", 0, &dbi), 0);
	assert_int_equal(mdb_drop(txn, dbi, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
	assert_int_equal(open_rc(c), -EUCLEAN);
}

static void test_truncated_data(void **state)
{
	struct ctx *c = *state;
	char p[PATH_MAX * 2];

	assert_int_equal(kvfs_store_create(c->store, 4 * MIB, false), 0);
	pjoin(p, sizeof(p), c->store, "data.kvd");
	/* Shorter than the superblock says. */
	assert_int_equal(truncate(p, 2 * MIB), 0);
	assert_int_equal(open_rc(c), -EUCLEAN);
	/* Grown past it. */
	assert_int_equal(truncate(p, 4 * MIB + 4096), 0);
	assert_int_equal(open_rc(c), -EUCLEAN);
	/* Cut inside the header. */
	assert_int_equal(truncate(p, 100), 0);
	assert_int_equal(open_rc(c), -EUCLEAN);
	assert_int_equal(truncate(p, 0), 0);
	assert_int_equal(open_rc(c), -EUCLEAN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_open, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nonempty_and_force, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_missing_meta, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_missing_data, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_data_header, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_uuid_mismatch, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_sb_mismatch, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_sb_bad_size, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_sb_wrong_version, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_superblock, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_truncated_data, setup,
						teardown),
	};

	/* Refusals log by design; keep the test output readable. */
	kvfs_log_set_level(getenv("KVFS_TEST_LOG") ? KVFS_LOG_DEBUG : -1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
