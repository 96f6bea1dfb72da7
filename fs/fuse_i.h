/* SPDX-License-Identifier: MIT */
/*
 * Internals shared by the FUSE handler files of fs/; included only from
 * them. fuse_ops.c holds the file and directory operations and the
 * operations table, fuse_xattr.c the user.kvfs.* attributes, and
 * fuse_access.c who the caller is and what it may see.
 */
#ifndef KVFS_FS_FUSE_I_H
#define KVFS_FS_FUSE_I_H

#include <stddef.h>

#include "cache/ctl.h"
#include "fs/fuse_ops.h"

struct kvfs_ns;

#define XATTR_PREFIX "user.kvfs."

static inline struct kvfs_fs *kvfs_fuse_fs(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* Reply with the error of an engine's 0 / -errno (0: success). */
static inline void kvfs_fuse_reply_rc(fuse_req_t req, int rc)
{
	fuse_reply_err(req, rc < 0 ? -rc : rc);
}

/* ---------------------------------------------------------- fuse_access.c */

/*
 * kvfs_fuse_creds() - the caller of @req as the engine judges it: uid,
 * gid and thread from the request, its supplementary groups read from
 * /proc only when a check needs them (fuse_req_getgroups()). @cr must not
 * outlive @req.
 */
void kvfs_fuse_creds(fuse_req_t req, struct kvfs_ctl_creds *cr);

/*
 * kvfs_fuse_may() - whether the caller of @req may do @want (enum
 * kvfs_ctl_may) in @ns (kvfs_ctl_may()). A refusal is logged, naming the
 * uid, the namespace and @what (the operation).
 * Returns 0 or -EACCES. No locks.
 */
int kvfs_fuse_may(fuse_req_t req, const struct kvfs_ns *ns, unsigned want,
		  const char *what);

/*
 * kvfs_fuse_stats_filter() - drop from the stats text @text (@len bytes,
 * "key value" lines) the per-namespace lines ("ns.NAME.*") of every
 * namespace the caller of @req may not read: global counters are
 * everyone's, a namespace's figures its readers'. In place; returns the
 * new length.
 */
size_t kvfs_fuse_stats_filter(fuse_req_t req, char *text, size_t len);

/* ----------------------------------------------------------- fuse_xattr.c */

/* The user.kvfs.* attributes of namespaces and blocks: reading them
 * needs read permission on the namespace, setting or removing a pin or a
 * category write permission (docs/operations.md).
 */
void kvfs_fuse_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size);
void kvfs_fuse_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void kvfs_fuse_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags);
void kvfs_fuse_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

#endif
