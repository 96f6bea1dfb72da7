/* SPDX-License-Identifier: MIT */
/*
 * Store layout: creation (mkfs) and the checks made when a store is opened
 * (contracts in meta/store.h).
 *
 * Creation order matters for crash safety: the data file and its header
 * are durable before the superblock commits, and the superblock and the
 * free map commit in one transaction, so a store whose mkfs was interrupted
 * either has no superblock (open refuses it) or is complete.
 */
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <isa-l/crc.h>

#include "meta/log.h"
#include "meta/store.h"
#include "meta/util.h"

_Static_assert(offsetof(struct kvfs_store_dhdr, hdr_crc) == 48,
	       "data header CRC offset");

static const char default_conf[] =
	"# kvfs configuration, written by mkfs.kvfs because the store had none.\n"
	"# Every key is described in docs/config.md.\n"
	"\n"
	"[tier.dram]\n"
	"# Bytes of block data kept in memory; colder blocks are written back\n"
	"# to the SSD data file and dropped from DRAM.\n"
	"capacity = 256M\n"
	"\n"
	"[policy]\n"
	"name = lru\n"
	"\n"
	"# One section per model.  The geometry fixes the size of every block\n"
	"# file and cannot change once blocks are stored.\n"
	"[namespace demo]\n"
	"layers = 32\n"
	"kv_heads = 8\n"
	"head_dim = 128\n"
	"dtype = bf16\n"
	"block_tokens = 16\n"
	"chunk_tokens = 16\n";

const char *kvfs_store_default_conf(void)
{
	return default_conf;
}

int kvfs_store_path(const char *dir, const char *name, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/%s", dir, name);

	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

void kvfs_store_uuid_str(const uint8_t u[16], char out[37])
{
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
		 u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* Standard CRC-32C (ISA-L's crc32_iscsi is the unreflected-init form). */
static uint32_t dhdr_crc(const struct kvfs_store_dhdr *h)
{
	return ~crc32_iscsi((unsigned char *)h,
			    (int)offsetof(struct kvfs_store_dhdr, hdr_crc),
			    ~0u);
}

static void dhdr_build(struct kvfs_store_dhdr *h, const uint8_t uuid[16],
		       uint64_t size, uint64_t created)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, KVFS_STORE_DHDR_MAGIC, sizeof(h->magic));
	h->version = htole16(KVFS_STORE_DHDR_VERSION);
	memcpy(h->uuid, uuid, sizeof(h->uuid));
	h->size = htole64(size);
	h->created = htole64(created);
	h->hdr_crc = htole32(dhdr_crc(h));
}

static int uuid_generate4(uint8_t uuid[16])
{
	ssize_t n = getrandom(uuid, 16, 0);

	if (n != 16) {
		int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

		if (fd < 0)
			return -errno;
		n = read(fd, uuid, 16);
		close(fd);
		if (n != 16) {
			kvfs_err("store: cannot read /dev/urandom for a uuid");
			return -EIO;
		}
	}
	/* RFC 4122 version 4 (random), variant 1. */
	uuid[6] = (uint8_t)((uuid[6] & 0x0f) | 0x40);
	uuid[8] = (uint8_t)((uuid[8] & 0x3f) | 0x80);
	return 0;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = 0;

	if (fd < 0 || fsync(fd))
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (rc)
		kvfs_err("store: cannot sync directory %s: %s", dir,
			 strerror(-rc));
	return rc;
}

/* Make @dir (one level) or accept an existing directory.  Returns 1 if it
 * was made, 0 if it existed, or -errno.
 */
static int dir_make(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 0755) == 0)
		return 1;
	if (errno != EEXIST) {
		int rc = -errno;

		kvfs_err("store: cannot create %s: %s", dir, strerror(-rc));
		return rc;
	}
	if (stat(dir, &st)) {
		int rc = -errno;

		kvfs_err("store: %s: %s", dir, strerror(-rc));
		return rc;
	}
	if (!S_ISDIR(st.st_mode)) {
		kvfs_err("store: %s exists and is not a directory", dir);
		return -ENOTDIR;
	}
	return 0;
}

/* 1 if @dir has entries, 0 if empty, or -errno. */
static int dir_has_entries(const char *dir)
{
	struct dirent *de;
	DIR *d = opendir(dir);
	int found = 0;

	if (!d) {
		int rc = -errno;

		kvfs_err("store: cannot read %s: %s", dir, strerror(-rc));
		return rc;
	}
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			found = 1;
			break;
		}
	}
	closedir(d);
	return found;
}

/*
 * Remove STORE/meta: the files LMDB keeps there and the directory.  A
 * subdirectory inside it is not something mkfs made, so it is left alone
 * and the removal fails rather than deleting what we do not understand.
 */
/*
 * --force removes only what kvfs made: a meta/ directory holding LMDB's
 * own files. Anything else there means it is not ours, so nothing at all
 * is removed (checked before the first unlink, never half-way).
 */
static int meta_dir_check(const char *meta_dir)
{
	struct dirent *de;
	struct stat st;
	DIR *d;
	int rc = 0;

	if (lstat(meta_dir, &st))
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		goto out_foreign;
	d = opendir(meta_dir);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (strcmp(de->d_name, "data.mdb") &&
		    strcmp(de->d_name, "lock.mdb")) {
			rc = -ENOTEMPTY;
			break;
		}
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode)) {
			rc = -ENOTEMPTY;
			break;
		}
	}
	closedir(d);
	if (!rc)
		return 0;
out_foreign:
	kvfs_err("store: %s holds files kvfs did not make: not removing "
		 "anything", meta_dir);
	return -ENOTEMPTY;
}

static int meta_dir_remove(const char *meta_dir)
{
	struct dirent *de;
	struct stat st;
	DIR *d;
	int rc = 0;

	if (lstat(meta_dir, &st)) {
		if (errno == ENOENT)
			return 0;
		rc = -errno;
		goto out_log;
	}
	if (!S_ISDIR(st.st_mode)) {
		if (unlink(meta_dir))
			rc = -errno;
		goto out_log;
	}
	d = opendir(meta_dir);
	if (!d) {
		rc = -errno;
		goto out_log;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (unlinkat(dirfd(d), de->d_name, 0)) {
			rc = -errno;
			kvfs_err("store: cannot remove %s/%s: %s", meta_dir,
				 de->d_name, strerror(-rc));
			closedir(d);
			return rc;
		}
	}
	closedir(d);
	if (rmdir(meta_dir))
		rc = -errno;
out_log:
	if (rc)
		kvfs_err("store: cannot remove %s: %s", meta_dir,
			 strerror(-rc));
	return rc;
}

/* Take the store lock on an open data file: -EBUSY if a kvfs holds it. */
static int data_lock(int fd, const char *path)
{
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		return 0;
	if (errno == EWOULDBLOCK) {
		kvfs_err("store: %s is in use (is the store mounted?)", path);
		return -EBUSY;
	}
	kvfs_err("store: cannot lock %s: %s", path, strerror(errno));
	return -errno;
}

/* --force: drop the kvfs files of an old store, unless it is in use. */
static int old_store_remove(const char *meta_dir, const char *data_path)
{
	int fd, rc;

	rc = meta_dir_check(meta_dir);
	if (rc)
		return rc;
	fd = open(data_path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		rc = data_lock(fd, data_path);
		if (rc)
			goto out_close_fd;
		if (unlink(data_path)) {
			rc = -errno;
			kvfs_err("store: cannot remove %s: %s", data_path,
				 strerror(-rc));
			goto out_close_fd;
		}
		close(fd);
	} else if (errno != ENOENT) {
		rc = -errno;
		kvfs_err("store: %s: %s", data_path, strerror(-rc));
		return rc;
	}
	return meta_dir_remove(meta_dir);

out_close_fd:
	close(fd);
	return rc;
}

static int data_prealloc(int fd, const char *path, uint64_t size)
{
	char sz[32];

	if (fallocate(fd, 0, 0, (off_t)size) == 0)
		return 0;
	if (errno != EOPNOTSUPP && errno != ENOSYS) {
		int rc = -errno;

		kvfs_err("store: cannot allocate %s for %s: %s",
			 kvfs_util_fmt_size(size, sz, sizeof(sz)), path,
			 strerror(-rc));
		return rc;
	}
	kvfs_warn("store: %s: the filesystem cannot preallocate; the data file is sparse and writes may hit ENOSPC later",
		  path);
	if (ftruncate(fd, (off_t)size)) {
		int rc = -errno;

		kvfs_err("store: cannot size %s: %s", path, strerror(-rc));
		return rc;
	}
	return 0;
}

/* Write STORE/kvfs.conf unless one exists.  *written says which. */
static int conf_write_default(const char *path, bool *written)
{
	int fd, rc;

	*written = false;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		if (errno == EEXIST) {
			kvfs_info("store: keeping the existing %s", path);
			return 0;
		}
		rc = -errno;
		kvfs_err("store: cannot create %s: %s", path, strerror(-rc));
		return rc;
	}
	rc = kvfs_util_write_full(fd, default_conf, sizeof(default_conf) - 1, 0);
	if (!rc && fsync(fd))
		rc = -errno;
	close(fd);
	if (rc) {
		kvfs_err("store: cannot write %s: %s", path, strerror(-rc));
		unlink(path);
		return rc;
	}
	*written = true;
	return 0;
}

/* The superblock and the initial free map, in one transaction. */
static int meta_init(const char *meta_dir, const uint8_t uuid[16],
		     uint64_t size, uint64_t created)
{
	struct kvfs_meta *m;
	struct kvfs_meta_txn *t;
	struct kvfs_meta_sb sb;
	int rc;

	rc = kvfs_meta_open(meta_dir, 0, KVFS_META_CREATE, &m);
	if (rc)
		return rc;
	rc = kvfs_meta_txn_begin(m, false, &t);
	if (rc)
		goto out_free_meta;
	memset(&sb, 0, sizeof(sb));
	memcpy(sb.uuid, uuid, sizeof(sb.uuid));
	sb.ssd_size = size;
	sb.data_off = KVFS_STORE_DATA_OFF;
	sb.created = created;
	/* 0 is never a valid inode or namespace id. */
	sb.next_ino = 1;
	sb.next_ns_id = 1;
	rc = kvfs_meta_sb_put(t, &sb);
	if (!rc)
		rc = kvfs_meta_free_give(t, KVFS_STORE_DATA_OFF,
					 size - KVFS_STORE_DATA_OFF);
	if (rc) {
		kvfs_meta_txn_abort(t);
		goto out_free_meta;
	}
	rc = kvfs_meta_txn_commit(t);
out_free_meta:
	kvfs_meta_free(m);
	if (rc)
		kvfs_err("store: cannot initialise the metadata in %s: %s",
			 meta_dir, strerror(-rc));
	return rc;
}

int kvfs_store_create(const char *dir, uint64_t ssd_size, bool force)
{
	char meta_dir[PATH_MAX], data_path[PATH_MAX], conf_path[PATH_MAX];
	struct kvfs_store_dhdr hdr;
	uint64_t size = ssd_size & ~(uint64_t)(KVFS_STORE_DATA_OFF - 1);
	uint64_t created = (uint64_t)time(NULL);
	uint8_t uuid[16];
	bool conf_written, dir_made;
	char sz[32];
	int fd, rc;

	if (!dir || !*dir) {
		kvfs_err("store: no store directory given");
		return -EINVAL;
	}
	if (size < KVFS_STORE_MIN_SIZE) {
		kvfs_err("store: SSD size %llu bytes is below the minimum of %s",
			 (unsigned long long)ssd_size,
			 kvfs_util_fmt_size(KVFS_STORE_MIN_SIZE, sz,
					    sizeof(sz)));
		return -EINVAL;
	}
	if (kvfs_store_path(dir, KVFS_STORE_META_DIR, meta_dir,
			    sizeof(meta_dir)) ||
	    kvfs_store_path(dir, KVFS_STORE_DATA_FILE, data_path,
			    sizeof(data_path)) ||
	    kvfs_store_path(dir, KVFS_STORE_CONF_FILE, conf_path,
			    sizeof(conf_path))) {
		kvfs_err("store: path too long: %s", dir);
		return -ENAMETOOLONG;
	}

	rc = dir_make(dir);
	if (rc < 0)
		return rc;
	dir_made = rc;
	rc = dir_has_entries(dir);
	if (rc < 0)
		goto out_rmdir;
	if (rc) {
		if (!force) {
			kvfs_err("store: %s is not empty (--force replaces its kvfs metadata and data file)",
				 dir);
			return -ENOTEMPTY;
		}
		rc = old_store_remove(meta_dir, data_path);
		if (rc)
			return rc;
	}
	rc = uuid_generate4(uuid);
	if (rc)
		goto out_rmdir;

	fd = open(data_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
	if (fd < 0) {
		rc = -errno;
		kvfs_err("store: cannot create %s: %s", data_path,
			 strerror(-rc));
		goto out_rmdir;
	}
	/* Held until mkfs is done: a kvfs starting meanwhile sees -EBUSY. */
	rc = data_lock(fd, data_path);
	if (rc)
		goto out_unlink_data;
	rc = data_prealloc(fd, data_path, size);
	if (rc)
		goto out_unlink_data;
	dhdr_build(&hdr, uuid, size, created);
	rc = kvfs_util_write_full(fd, &hdr, sizeof(hdr), 0);
	if (!rc && fsync(fd))
		rc = -errno;
	if (rc) {
		kvfs_err("store: cannot write the header of %s: %s",
			 data_path, strerror(-rc));
		goto out_unlink_data;
	}

	rc = meta_init(meta_dir, uuid, size, created);
	if (rc)
		goto out_remove_meta;
	rc = conf_write_default(conf_path, &conf_written);
	if (rc)
		goto out_remove_meta;
	rc = fsync_dir(meta_dir);
	if (!rc)
		rc = fsync_dir(dir);
	if (rc)
		goto out_remove_conf;
	close(fd);
	return 0;

out_remove_conf:
	if (conf_written)
		unlink(conf_path);
out_remove_meta:
	meta_dir_remove(meta_dir);
out_unlink_data:
	unlink(data_path);
	close(fd);
out_rmdir:
	/* Leave no trace of a store that was never made. */
	if (dir_made)
		rmdir(dir);
	return rc;
}

/* ---- open ---- */

static char *path_dup(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

static int sb_check(const struct kvfs_store *s)
{
	const struct kvfs_meta_sb *sb = &s->sb;

	if (sb->data_off != KVFS_STORE_DATA_OFF) {
		kvfs_err("store: %s: superblock data offset %llu, expected %u",
			 s->dir, (unsigned long long)sb->data_off,
			 KVFS_STORE_DATA_OFF);
		return -EUCLEAN;
	}
	if (sb->ssd_size < KVFS_STORE_MIN_SIZE ||
	    sb->ssd_size % KVFS_STORE_DATA_OFF) {
		kvfs_err("store: %s: superblock SSD size %llu is invalid",
			 s->dir, (unsigned long long)sb->ssd_size);
		return -EUCLEAN;
	}
	return 0;
}

static int sb_read(struct kvfs_store *s)
{
	struct kvfs_meta_txn *t;
	int rc;

	rc = kvfs_meta_txn_begin(s->meta, true, &t);
	if (rc)
		return rc;
	rc = kvfs_meta_sb_get(t, &s->sb);
	kvfs_meta_txn_abort(t);
	switch (rc) {
	case 0:
		return sb_check(s);
	case -ENOENT:
		kvfs_err("store: %s: no superblock (mkfs.kvfs did not finish?)",
			 s->dir);
		return -EUCLEAN;
	case -EPROTO:
		kvfs_err("store: %s: format version %u, this kvfs reads %u",
			 s->dir, s->sb.version, KVFS_META_VERSION);
		return rc;
	case -EUCLEAN:
		kvfs_err("store: %s: superblock damaged", s->dir);
		return rc;
	default:
		return rc;
	}
}

/* Check data.kvd against the superblock; leaves it open and locked. */
static int data_check(struct kvfs_store *s)
{
	struct kvfs_store_dhdr h;
	char u1[37], u2[37];
	struct stat st;
	ssize_t n;
	int fd, rc;

	fd = open(s->data_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		kvfs_err("store: data file %s: %s", s->data_path,
			 strerror(-rc));
		return rc;
	}
	rc = data_lock(fd, s->data_path);
	if (rc)
		goto out_close_fd;
	n = pread(fd, &h, sizeof(h), 0);
	if (n < 0) {
		rc = -errno;
		kvfs_err("store: cannot read %s: %s", s->data_path,
			 strerror(-rc));
		goto out_close_fd;
	}
	rc = -EUCLEAN;
	if ((size_t)n < sizeof(h)) {
		kvfs_err("store: data file %s: header truncated (%zd bytes)",
			 s->data_path, n);
		goto out_close_fd;
	}
	if (memcmp(h.magic, KVFS_STORE_DHDR_MAGIC, sizeof(h.magic))) {
		kvfs_err("store: data file %s: bad magic", s->data_path);
		goto out_close_fd;
	}
	if (le16toh(h.version) != KVFS_STORE_DHDR_VERSION) {
		kvfs_err("store: data file %s: format version %u, this kvfs reads %u",
			 s->data_path, le16toh(h.version),
			 KVFS_STORE_DHDR_VERSION);
		rc = -EPROTO;
		goto out_close_fd;
	}
	if (le32toh(h.hdr_crc) != dhdr_crc(&h)) {
		kvfs_err("store: data file %s: header checksum mismatch",
			 s->data_path);
		goto out_close_fd;
	}
	if (memcmp(h.uuid, s->sb.uuid, sizeof(h.uuid))) {
		kvfs_store_uuid_str(h.uuid, u1);
		kvfs_store_uuid_str(s->sb.uuid, u2);
		kvfs_err("store: data file %s: uuid %s is not the superblock's %s (data file of another store?)",
			 s->data_path, u1, u2);
		goto out_close_fd;
	}
	if (le64toh(h.size) != s->sb.ssd_size) {
		kvfs_err("store: data file %s: header size %llu, superblock says %llu",
			 s->data_path, (unsigned long long)le64toh(h.size),
			 (unsigned long long)s->sb.ssd_size);
		goto out_close_fd;
	}
	if (fstat(fd, &st)) {
		rc = -errno;
		goto out_close_fd;
	}
	if ((uint64_t)st.st_size != s->sb.ssd_size) {
		kvfs_err("store: data file %s: %llu bytes, superblock says %llu (truncated or resized?)",
			 s->data_path, (unsigned long long)st.st_size,
			 (unsigned long long)s->sb.ssd_size);
		goto out_close_fd;
	}
	s->lock_fd = fd;
	return 0;

out_close_fd:
	close(fd);
	return rc;
}

int kvfs_store_open(const char *dir, unsigned meta_flags, uint64_t mapsize,
		    struct kvfs_store **out)
{
	struct kvfs_store *s;
	struct stat st;
	char envfile[PATH_MAX];
	int rc;

	*out = NULL;
	if (meta_flags & ~(unsigned)KVFS_META_NOSYNC) {
		kvfs_err("store: open flags %#x not allowed", meta_flags);
		return -EINVAL;
	}
	if (!dir || !*dir) {
		kvfs_err("store: no store directory given");
		return -EINVAL;
	}
	if (stat(dir, &st)) {
		rc = -errno;
		kvfs_err("store: %s: %s", dir, strerror(-rc));
		return rc;
	}
	if (!S_ISDIR(st.st_mode)) {
		kvfs_err("store: %s is not a directory", dir);
		return -ENOTDIR;
	}

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lock_fd = -1;
	s->dir = strdup(dir);
	s->meta_dir = path_dup(dir, KVFS_STORE_META_DIR);
	s->data_path = path_dup(dir, KVFS_STORE_DATA_FILE);
	s->conf_path = path_dup(dir, KVFS_STORE_CONF_FILE);
	s->log_path = path_dup(dir, KVFS_STORE_LOG_FILE);
	if (!s->dir || !s->meta_dir || !s->data_path || !s->conf_path ||
	    !s->log_path) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = kvfs_store_path(s->meta_dir, "data.mdb", envfile,
			     sizeof(envfile));
	if (rc)
		goto out_free;
	if (stat(envfile, &st)) {
		rc = -errno;
		if (rc == -ENOENT)
			kvfs_err("store: %s: not a kvfs store (run mkfs.kvfs)",
				 dir);
		else
			kvfs_err("store: %s: %s", envfile, strerror(-rc));
		goto out_free;
	}
	rc = kvfs_meta_open(s->meta_dir, mapsize, meta_flags, &s->meta);
	if (rc)
		goto out_free;
	rc = sb_read(s);
	if (rc)
		goto out_free;
	rc = data_check(s);
	if (rc)
		goto out_free;
	*out = s;
	return 0;

out_free:
	kvfs_store_free(s);
	return rc;
}

void kvfs_store_free(struct kvfs_store *s)
{
	if (!s)
		return;
	kvfs_meta_free(s->meta);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	free(s->dir);
	free(s->meta_dir);
	free(s->data_path);
	free(s->conf_path);
	free(s->log_path);
	free(s);
}
