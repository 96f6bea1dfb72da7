/* SPDX-License-Identifier: MIT */
/*
 * The on-disk layout of a kvfs store, shared by mkfs.kvfs and the daemon.
 *
 *   STORE/meta/      LMDB environment (meta/meta.h): superblock, namespaces,
 *                    block records, SSD free-extent map
 *   STORE/data.kvd   the SSD tier's data file: a 4096-byte header
 *                    (struct kvfs_store_dhdr), then extents from
 *                    sb.data_off to sb.ssd_size
 *   STORE/kvfs.conf  the default config (written by mkfs if absent)
 *   STORE/kvfs.log   the daemon's log
 *
 * The data file's header repeats the superblock's uuid and size so that a
 * data file from another store, or one that was truncated or replaced, is
 * refused at open instead of serving foreign bytes.
 *
 * No global state; the functions are safe to call from any thread, on
 * different stores.
 */
#ifndef KVFS_META_STORE_H
#define KVFS_META_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/meta.h"

#define KVFS_STORE_META_DIR "meta"
#define KVFS_STORE_DATA_FILE "data.kvd"
#define KVFS_STORE_CONF_FILE "kvfs.conf"
#define KVFS_STORE_LOG_FILE "kvfs.log"

#define KVFS_STORE_DHDR_MAGIC "KVFSDAT1"
#define KVFS_STORE_DHDR_VERSION 1
/* The header block; the first extent starts here (sb.data_off). */
#define KVFS_STORE_DATA_OFF 4096u
/* Smallest data file mkfs accepts. */
#define KVFS_STORE_MIN_SIZE (1ull << 20)

/*
 * Header of STORE/data.kvd, little-endian, exactly one 4096-byte block so
 * that the extents after it stay aligned for O_DIRECT.  hdr_crc is the
 * standard CRC-32C of bytes [0, offsetof(hdr_crc)); the rest of the block
 * is zero.
 */
struct kvfs_store_dhdr {
	char magic[8];      /* KVFS_STORE_DHDR_MAGIC, no NUL */
	uint16_t version;   /* KVFS_STORE_DHDR_VERSION */
	uint16_t flags;     /* 0 */
	uint32_t reserved0; /* 0 */
	uint8_t uuid[16];   /* equals the superblock's */
	uint64_t size;      /* file size in bytes, equals sb.ssd_size */
	uint64_t created;   /* unix seconds, equals sb.created */
	uint32_t hdr_crc;
	uint8_t pad[4096 - 52];
};
_Static_assert(sizeof(struct kvfs_store_dhdr) == 4096, "data header size");

/* An open store.  Every field is set by kvfs_store_open() and read-only
 * afterwards, so no lock guards them.
 */
struct kvfs_store {
	char *dir;       /* STORE as given */
	char *meta_dir;  /* STORE/meta */
	char *data_path; /* STORE/data.kvd */
	char *conf_path; /* STORE/kvfs.conf (may not exist) */
	char *log_path;  /* STORE/kvfs.log */
	struct kvfs_meta *meta; /* the open metadata environment */
	struct kvfs_meta_sb sb; /* the superblock as read at open */
	/* data.kvd opened read-only and holding an exclusive flock for the
	 * store's lifetime: a second daemon, or mkfs --force, on a store in
	 * use fails with -EBUSY.  The tiers open their own descriptors.
	 */
	int lock_fd;
};

/*
 * kvfs_store_create() - make a new store (mkfs).
 * @dir:      the store directory; created (one level) if missing.
 * @ssd_size: data file size in bytes, header included; rounded down to a
 *            multiple of 4096; at least KVFS_STORE_MIN_SIZE.
 * @force:    accept a non-empty @dir, removing an existing STORE/meta/ and
 *            STORE/data.kvd first (other files, kvfs.conf included, stay).
 *
 * Preallocates the data file (fallocate; ftruncate with a warning where
 * the filesystem cannot), writes and fsyncs its header, creates the
 * environment and commits the superblock and a free map of one extent
 * [4096, ssd_size) in one transaction, writes STORE/kvfs.conf from a
 * default text if there is none, and fsyncs the directories.  On failure
 * the meta/ and data.kvd it made are removed again.
 *
 * Returns 0; -EINVAL (bad size); -ENOTEMPTY (non-empty @dir without
 * @force); -ENOTDIR; -EBUSY (the store is open by a running kvfs);
 * -ENOSPC; or another -errno.  Every failure is logged.
 */
int kvfs_store_create(const char *dir, uint64_t ssd_size, bool force);

/*
 * kvfs_store_open() - open and check a store made by kvfs_store_create().
 * @dir:        the store directory.
 * @meta_flags: 0 or KVFS_META_NOSYNC (tests); other flags are -EINVAL.
 * @mapsize:    LMDB map size, 0 for the default.
 * @out:        receives the store, to be released with kvfs_store_free().
 *
 * Checks, in order: @dir exists; STORE/meta holds an environment;
 * the superblock is present and valid; the data file exists, its header's
 * magic, version and CRC, uuid == sb.uuid, header size and file size ==
 * sb.ssd_size.
 *
 * Returns 0; -ENOENT (no @dir, "not a kvfs store (run mkfs.kvfs)", or no
 * data file); -EUCLEAN (a damaged or mismatched superblock or data
 * header; the log names which check failed); -EPROTO (superblock or data
 * header of another format version); -EBUSY (another process has the
 * store open); or another -errno.  Every failure is logged.
 */
int kvfs_store_open(const char *dir, unsigned meta_flags, uint64_t mapsize,
		    struct kvfs_store **out);

/* Close the environment, drop the lock and free @s; NULL is a no-op. No
 * metadata transaction may be open.
 */
void kvfs_store_free(struct kvfs_store *s);

/*
 * kvfs_store_path() - STORE/@name into @buf, for callers that need a path
 * before (or without) opening the store, e.g. the daemon's default config
 * KVFS_STORE_CONF_FILE.
 * Returns 0, or -ENAMETOOLONG if @len is too small.
 */
int kvfs_store_path(const char *dir, const char *name, char *buf, size_t len);

/* Format @uuid as the 36-character 8-4-4-4-12 lowercase form plus NUL. */
void kvfs_store_uuid_str(const uint8_t uuid[16], char out[37]);

/* The kvfs.conf text kvfs_store_create() writes (a NUL-terminated
 * constant).
 */
const char *kvfs_store_default_conf(void);

#endif
