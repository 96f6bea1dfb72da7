/* SPDX-License-Identifier: MIT */
/*
 * The FUSE low-level operations of kvfs.  This is the only place where an
 * -errno from the engine becomes a fuse_reply_err(), and every request gets
 * exactly one reply.
 *
 * The session's userdata is a struct kvfs_fs.  Operations run concurrently
 * on the multi-threaded session loop; all state they share lives in the
 * cache engine, which does its own locking.
 */
#ifndef KVFS_FS_FUSE_OPS_H
#define KVFS_FS_FUSE_OPS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

struct kvfs_cache;

struct kvfs_fs {
	struct kvfs_cache *c;
	double entry_timeout; /* committed blocks are immutable: cacheable */
	double attr_timeout;
	/* The mount's read-ahead in bytes: the largest block file of any
	 * namespace (at least 1 MiB, at most 64 MiB), so that the kernel asks
	 * for the whole of a block at once rather than one request after the
	 * other. Set before the session starts; immutable after.
	 */
	uint32_t readahead;
	/* Wait for the kernel to have been told of the blocks the engine
	 * deleted so far (fs/kvfs_main.c's notifier); NULL: nothing to wait
	 * for.  Set before the session starts.  Called after a ctl request
	 * ran, before its reply; bounded, and lock-free when none is
	 * pending.
	 */
	void (*inval_sync)(void);
};

/*
 * kvfs_fs_readahead() - the read-ahead for the mount of @c, in bytes: its
 * largest block file rounded up to 1 MiB, between 1 and 64 MiB. No locks
 * (the namespaces are fixed once the cache is open).
 */
uint32_t kvfs_fs_readahead(struct kvfs_cache *c);

extern const struct fuse_lowlevel_ops kvfs_fuse_ops;

#endif
