/* SPDX-License-Identifier: MIT */
/*
 * FUSE low-level operations.  Layout of the mount:
 *
 *   /                  root: one directory per namespace, and .kvfs
 *   /.kvfs/stats       engine statistics, "key value" lines
 *   /NS/<32 hex>.kv    one immutable file per committed prefix block
 *
 * Each handler turns the engine's 0 / -errno into exactly one reply.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/ctl.h"
#include "meta/kvfs_ctl.h"
#include "cache/policy.h"
#include "tier/tier.h"
#include "fs/fuse_i.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/fmt.h"
#include "meta/util.h"

enum fh_kind {
	FH_READ = 1,   /* a committed block opened read-only */
	FH_WRITE,      /* a new block being written */
	FH_TEXT,       /* a generated text file (.kvfs/stats) */
	FH_CTL,        /* .kvfs/ctl: a control session */
};

struct kvfs_fh {
	enum fh_kind kind;
	/* One for the open file, one per read in progress: a read replies
	 * from memory the handle owns (or keeps alive through its open
	 * count), and the kernel may send RELEASE the moment it has the
	 * data, before our reply call has returned.
	 */
	atomic_int refs;
	pthread_mutex_t lock;        /* FH_WRITE: guards p, b, rc */
	struct kvfs_reader r;        /* FH_READ */
	struct kvfs_pending *p;      /* FH_WRITE before commit */
	struct kvfs_ns *ns;          /* FH_WRITE: where it is written */
	struct kvfs_block *b;        /* FH_WRITE after commit */
	int rc;                      /* FH_WRITE: the commit's result */
	uint32_t uid, gid;           /* FH_WRITE: the writer, who owns the file
				      * until it is committed */
	bool temp;                   /* FH_WRITE: p is a temporary (rename commits it) */
	char *text;                  /* FH_TEXT; FH_CTL: pending response */
	size_t text_len;
	struct kvfs_ctl_session *ctl; /* FH_CTL */
};

static struct kvfs_fs *fs_of(fuse_req_t req)
{
	return kvfs_fuse_fs(req);
}

static struct kvfs_fh *fh_of(struct fuse_file_info *fi)
{
	return (struct kvfs_fh *)(uintptr_t)fi->fh;
}

static void reply_rc(fuse_req_t req, int rc)
{
	kvfs_fuse_reply_rc(req, rc);
}

/* ------------------------------------------------------------ attributes */

static void dir_attr(struct stat *st, uint64_t ino, nlink_t nlink)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = S_IFDIR | 0755;
	st->st_nlink = nlink;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_blksize = 4096;
}

/* A namespace's directory: its owner, group and mode (kvfs.conf). */
static void ns_attr(struct kvfs_fs *fs, struct kvfs_ns *ns, struct stat *st)
{
	struct kvfs_ctl_owner o;

	kvfs_ctl_ns_owner(fs->c, ns, &o);
	dir_attr(st, kvfs_ns_ino(ns), 2);
	st->st_mode = S_IFDIR | o.mode;
	st->st_uid = o.uid;
	st->st_gid = o.gid;
}

static void block_attr(struct kvfs_fs *fs, struct kvfs_block *b,
		       struct stat *st)
{
	struct kvfs_block_info bi;
	struct kvfs_ctl_owner o;

	kvfs_block_info(b, &bi);
	kvfs_ctl_ns_owner(fs->c, kvfs_block_ns(b), &o);
	memset(st, 0, sizeof(*st));
	st->st_ino = bi.ino;
	/* Committed blocks are immutable: the namespace's owner and group,
	 * with its read bits only (0750 gives 0440).
	 */
	st->st_mode = S_IFREG | (o.mode & 0444);
	st->st_nlink = 1;
	st->st_uid = o.uid;
	st->st_gid = o.gid;
	st->st_size = (off_t)bi.size;
	st->st_blocks = (blkcnt_t)((bi.size + 511) / 512);
	st->st_blksize = 1 << 20;
	st->st_mtim.tv_sec = (time_t)(bi.created / 1000000000ull);
	st->st_mtim.tv_nsec = (long)(bi.created % 1000000000ull);
	st->st_ctim = st->st_mtim;
	st->st_atim.tv_sec = (time_t)(bi.last_access / 1000000000ull);
	st->st_atim.tv_nsec = (long)(bi.last_access % 1000000000ull);
}

/* A file being written: its writer's, writable by it, size still
 * growing.
 */
static void pending_stat(uint64_t ino, uint64_t size, uint32_t uid,
			 uint32_t gid, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = S_IFREG | 0644;
	st->st_nlink = 1;
	st->st_uid = uid;
	st->st_gid = gid;
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
}

static void pending_attr(struct kvfs_fh *fh, struct stat *st)
{
	pending_stat(kvfs_pending_ino(fh->p), kvfs_pending_size(fh->p),
		     fh->uid, fh->gid, st);
}

static void text_attr(struct stat *st, uint64_t ino)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = S_IFREG | 0444;
	st->st_nlink = 1;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_size = 0; /* generated at open; read with direct I/O */
	st->st_blksize = 4096;
}

static void set_time(struct timespec *ts, uint64_t ns)
{
	ts->tv_sec = (time_t)(ns / 1000000000ull);
	ts->tv_nsec = (long)(ns % 1000000000ull);
}

/* A namespace directory changes when a block is committed or deleted; a
 * stat shows that, or the namespace's creation until then.  The root
 * changes with its namespaces.
 */
static void dir_times(struct kvfs_fs *fs, struct kvfs_ns *ns, struct stat *st)
{
	uint64_t created, changed, last = 0;

	for (size_t i = 0; !ns && i < kvfs_cache_ns_count(fs->c); i++) {
		kvfs_ns_times(kvfs_cache_ns_at(fs->c, i), &created, &changed);
		if (changed > last)
			last = changed;
	}
	if (ns)
		kvfs_ns_times(ns, &created, &last);
	set_time(&st->st_mtim, last);
	st->st_ctim = st->st_mtim;
	st->st_atim = st->st_mtim;
}

/* Attributes of any inode; -ENOENT for a stale one. */
static int ino_attr(struct kvfs_fs *fs, uint64_t ino, struct stat *st)
{
	struct kvfs_block *b;
	struct kvfs_ns *ns;

	switch (ino) {
	case KVFS_INO_ROOT:
		dir_attr(st, ino, 3 + kvfs_cache_ns_count(fs->c));
		dir_times(fs, NULL, st);
		return 0;
	case KVFS_INO_CTLDIR:
		dir_attr(st, ino, 2);
		return 0;
	case KVFS_INO_STATS:
		text_attr(st, ino);
		return 0;
	case KVFS_INO_CTL:
		text_attr(st, ino);
		/* Engines need not be root to talk to the cache. */
		st->st_mode = S_IFREG | 0666;
		return 0;
	default:
		break;
	}
	ns = kvfs_cache_ns_by_ino(fs->c, ino);
	if (ns) {
		ns_attr(fs, ns, st);
		dir_times(fs, ns, st);
		return 0;
	}
	if (kvfs_cache_get(fs->c, ino, &b) == 0) {
		block_attr(fs, b, st);
		kvfs_cache_put(fs->c, b);
		return 0;
	}
	uint64_t size;
	if (kvfs_cache_pending_size(fs->c, ino, &size) == 0) {
		/* Asked without the writer's handle: the daemon's. */
		pending_stat(ino, size, (uint32_t)getuid(), (uint32_t)getgid(),
			     st);
		return 0;
	}
	/* A block the engine deleted may still be named in the kernel's
	 * cache (names are not invalidated: fs/kvfs_main.c): ESTALE makes
	 * a path lookup ask for the name again.
	 */
	return ino >= KVFS_INO_BLOCK_BASE ? -ESTALE : -ENOENT;
}

/* ---------------------------------------------------------------- lookup */

static void kvfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct kvfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct kvfs_block *b;
	struct kvfs_ns *ns;
	int rc;

	memset(&e, 0, sizeof(e));
	e.entry_timeout = fs->entry_timeout;
	e.attr_timeout = fs->attr_timeout;
	if (parent == KVFS_INO_ROOT) {
		if (!strcmp(name, ".kvfs")) {
			e.ino = KVFS_INO_CTLDIR;
		} else {
			ns = kvfs_cache_ns_by_name(fs->c, name);
			if (!ns) {
				fuse_reply_err(req, ENOENT);
				return;
			}
			e.ino = kvfs_ns_ino(ns);
		}
	} else if (parent == KVFS_INO_CTLDIR) {
		if (!strcmp(name, "stats")) {
			e.ino = KVFS_INO_STATS;
		} else if (!strcmp(name, "ctl")) {
			e.ino = KVFS_INO_CTL;
		} else {
			fuse_reply_err(req, ENOENT);
			return;
		}
		e.attr_timeout = 0;
	} else {
		ns = kvfs_cache_ns_by_ino(fs->c, parent);
		if (!ns) {
			fuse_reply_err(req, ENOTDIR);
			return;
		}
		rc = kvfs_cache_lookup(fs->c, ns, name, &b);
		/* Not local: the remote tier may have it.  No negative
		 * entry is ever cached (an error reply), so a block that
		 * arrives there later is found by the next lookup.
		 */
		if (rc == -ENOENT)
			rc = kvfs_cache_lookup_remote(fs->c, ns, name, &b);
		if (rc == -EINVAL) {
			uint64_t size;

			/* Not a block name: a temporary, or simply absent
			 * (ENOENT), so that tools probing for other files
			 * behave.  A temporary's name must not outlive a
			 * rename or unlink in the kernel's cache.
			 */
			rc = kvfs_cache_temp_stat(fs->c, ns, name, &e.ino,
						  &size);
			if (rc) {
				fuse_reply_err(req, ENOENT);
				return;
			}
			/* A temporary is its writer's, as a pending file. */
			pending_stat(e.ino, size,
				     (uint32_t)fuse_req_ctx(req)->uid,
				     (uint32_t)fuse_req_ctx(req)->gid, &e.attr);
			e.entry_timeout = 0;
			e.attr_timeout = 0;
			fuse_reply_entry(req, &e);
			return;
		}
		if (rc) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		block_attr(fs, b, &e.attr);
		e.ino = e.attr.st_ino;
		kvfs_cache_put(fs->c, b);
		fuse_reply_entry(req, &e);
		return;
	}
	rc = ino_attr(fs, e.ino, &e.attr);
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_entry(req, &e);
}

static void kvfs_getattr(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_fh *fh = fi ? fh_of(fi) : NULL;
	struct stat st;
	int rc;

	/* A file being written is known only to its writer's handle. */
	if (fh && fh->kind == FH_WRITE) {
		pthread_mutex_lock(&fh->lock);
		if (fh->p)
			pending_attr(fh, &st);
		else if (fh->b)
			block_attr(fs, fh->b, &st);
		rc = (fh->p || fh->b) ? 0 : -ENOENT;
		pthread_mutex_unlock(&fh->lock);
	} else {
		rc = ino_attr(fs, ino, &st);
	}
	if (rc)
		reply_rc(req, rc);
	else
		/* A file being written changes size: never cache it. */
		fuse_reply_attr(req, &st,
				S_ISREG(st.st_mode) && (st.st_mode & S_IWUSR) &&
						ino != KVFS_INO_CTL
					? 0
					: fs->attr_timeout);
}

/*
 * What cp -a, tar -x and rsync ask after writing a file: the same owner,
 * the mode it has (or, for a file being written, any permission bits: it
 * becomes 0444 at commit), any times.  Nothing is kept, so these succeed
 * as no-ops; anything that would change what a stat shows is -EPERM.
 * Times are not kept: a block's mtime is its commit, a directory's its
 * last change.
 */
static int attr_noop(const struct stat *cur, const struct stat *attr,
		     int to_set, bool pending)
{
	if ((to_set & FUSE_SET_ATTR_UID) && attr->st_uid != cur->st_uid)
		return -EPERM;
	if ((to_set & FUSE_SET_ATTR_GID) && attr->st_gid != cur->st_gid)
		return -EPERM;
	if ((to_set & FUSE_SET_ATTR_MODE) &&
	    ((attr->st_mode & S_IFMT && (attr->st_mode & S_IFMT) !=
						(cur->st_mode & S_IFMT)) ||
	     (pending ? (attr->st_mode & 07000) != 0 :
			(attr->st_mode & 07777) != (cur->st_mode & 07777))))
		return -EPERM;
	if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size != cur->st_size)
		return -EPERM;
	return 0;
}

static void kvfs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			 int to_set, struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_fh *fh = fi ? fh_of(fi) : NULL;
	struct stat st;
	int rc = 0;

	if (!fh || fh->kind != FH_WRITE) {
		/* Everything but the new block's own writer sees an immutable
		 * file (a file being written is one whose attributes say
		 * it is writable).
		 */
		rc = ino_attr(fs, ino, &st);
		if (!rc)
			rc = attr_noop(&st, attr, to_set,
				       S_ISREG(st.st_mode) &&
					       (st.st_mode & S_IWUSR) &&
					       ino != KVFS_INO_CTL);
		if (rc)
			reply_rc(req, rc);
		else
			fuse_reply_attr(req, &st,
					S_ISREG(st.st_mode) &&
							(st.st_mode & S_IWUSR)
						? 0
						: fs->attr_timeout);
		return;
	}
	pthread_mutex_lock(&fh->lock);
	if (!fh->p) {
		if (fh->b)
			block_attr(fs, fh->b, &st);
		rc = fh->b ? attr_noop(&st, attr, to_set, false) : -EPERM;
	} else {
		pending_attr(fh, &st);
		rc = attr_noop(&st, attr, to_set & ~FUSE_SET_ATTR_SIZE, true);
		if (!rc && (to_set & FUSE_SET_ATTR_SIZE))
			rc = kvfs_cache_truncate(fh->p,
						 (uint64_t)attr->st_size);
		if (!rc)
			pending_attr(fh, &st);
	}
	pthread_mutex_unlock(&fh->lock);
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_attr(req, &st, 0);
}

/* ---------------------------------------------------------------- readdir */

struct dirbuf {
	fuse_req_t req;
	char *buf;
	size_t size, used;
};

/* Returns 1 when the buffer is full. */
static int dirbuf_add(struct dirbuf *d, const char *name, uint64_t ino,
		      mode_t mode, off_t next)
{
	struct stat st = { .st_ino = ino, .st_mode = mode };
	size_t n = fuse_add_direntry(d->req, d->buf + d->used,
				     d->size - d->used, name, &st, next);

	if (n > d->size - d->used)
		return 1;
	d->used += n;
	return 0;
}

static int add_block(const char *name, uint64_t ino, void *arg)
{
	/* The offset cookie is the inode: stable while blocks come and go. */
	return dirbuf_add(arg, name, ino, S_IFREG, (off_t)ino);
}

static void kvfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			 off_t off, struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct dirbuf d = { .req = req, .size = size };
	struct kvfs_ns *ns = NULL;

	if (ino != KVFS_INO_ROOT && ino != KVFS_INO_CTLDIR) {
		ns = kvfs_cache_ns_by_ino(fs->c, ino);
		if (!ns) {
			fuse_reply_err(req, ENOTDIR);
			return;
		}
		if (kvfs_fuse_may(req, ns, KVFS_CTL_MAY_READ,
					     "list")) {
			fuse_reply_err(req, EACCES);
			return;
		}
	}
	d.buf = malloc(size);
	if (!d.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* Offsets 1 and 2 are "." and ".."; then entries. */
	if (off < 1 && dirbuf_add(&d, ".", ino, S_IFDIR, 1))
		goto out_reply;
	if (off < 2 && dirbuf_add(&d, "..", KVFS_INO_ROOT, S_IFDIR, 2))
		goto out_reply;
	if (ino == KVFS_INO_ROOT) {
		size_t n = kvfs_cache_ns_count(fs->c);

		if (off < 3 && dirbuf_add(&d, ".kvfs", KVFS_INO_CTLDIR,
					  S_IFDIR, 3))
			goto out_reply;
		for (size_t i = off > 3 ? (size_t)off - 3 : 0; i < n; i++) {
			struct kvfs_ns *x = kvfs_cache_ns_at(fs->c, i);

			if (dirbuf_add(&d, kvfs_ns_name(x), kvfs_ns_ino(x),
				       S_IFDIR, (off_t)(4 + i)))
				break;
		}
	} else if (ino == KVFS_INO_CTLDIR) {
		if (off < 3 && dirbuf_add(&d, "stats", KVFS_INO_STATS, S_IFREG, 3))
			goto out_reply;
		if (off < 4)
			dirbuf_add(&d, "ctl", KVFS_INO_CTL, S_IFREG, 4);
	} else {
		kvfs_ns_list(ns, off < 2 ? 0 : (uint64_t)off, add_block, &d);
	}
out_reply:
	fuse_reply_buf(req, d.buf, d.used);
	free(d.buf);
}

/* ------------------------------------------------------------ open/create */

static struct kvfs_fh *fh_new(enum fh_kind kind)
{
	struct kvfs_fh *fh = calloc(1, sizeof(*fh));

	if (fh) {
		fh->kind = kind;
		atomic_init(&fh->refs, 1);
		pthread_mutex_init(&fh->lock, NULL);
	}
	return fh;
}

static void fh_destroy(struct kvfs_fs *fs, struct kvfs_fh *fh)
{
	switch (fh->kind) {
	case FH_READ:
		kvfs_cache_reader_release(fs->c, &fh->r);
		break;
	case FH_WRITE:
		if (fh->temp)
			kvfs_cache_temp_close(fs->c, fh->p);
		else
			kvfs_cache_abandon(fs->c, fh->p);
		kvfs_cache_put(fs->c, fh->b);
		break;
	case FH_TEXT:
		free(fh->text);
		break;
	case FH_CTL:
		/* Closing the descriptor (or the process dying) releases
		 * every lease it held.
		 */
		kvfs_ctl_close(fh->ctl);
		free(fh->text);
		break;
	}
	pthread_mutex_destroy(&fh->lock);
	free(fh);
}

/* Drop a reference; the last one frees the handle. */
static void fh_free(struct kvfs_fs *fs, struct kvfs_fh *fh)
{
	if (atomic_fetch_sub(&fh->refs, 1) == 1)
		fh_destroy(fs, fh);
}

static void kvfs_open(fuse_req_t req, fuse_ino_t ino,
		      struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_pending *fh_p;
	struct kvfs_block *b;
	uint64_t psize;
	struct kvfs_fh *fh;
	int rc;

	if (ino == KVFS_INO_CTL) {
		fh = fh_new(FH_CTL);
		if (!fh) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		rc = kvfs_ctl_open(fs->c, &fh->ctl);
		if (rc) {
			fh->kind = FH_TEXT;
			fh_free(fs, fh);
			reply_rc(req, rc);
			return;
		}
		fi->direct_io = 1;
		fi->nonseekable = 1;
		fi->fh = (uintptr_t)fh;
		if (fuse_reply_open(req, fi) == -ENOENT)
			fh_free(fs, fh);
		return;
	}
	if (ino == KVFS_INO_STATS) {
		if ((fi->flags & O_ACCMODE) != O_RDONLY) {
			fuse_reply_err(req, EACCES);
			return;
		}
		fh = fh_new(FH_TEXT);
		if (!fh) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		rc = kvfs_cache_stats(fs->c, &fh->text, &fh->text_len);
		if (!rc)
			fh->text_len = kvfs_fuse_stats_filter(req, fh->text,
							      fh->text_len);
		if (rc) {
			fh_free(fs, fh);
			reply_rc(req, rc);
			return;
		}
		fi->direct_io = 1;
		fi->fh = (uintptr_t)fh;
		if (fuse_reply_open(req, fi) == -ENOENT)
			fh_free(fs, fh);
		return;
	}
	rc = kvfs_cache_get(fs->c, ino, &b);
	if (rc && ino >= KVFS_INO_BLOCK_BASE &&
	    kvfs_cache_pending_size(fs->c, ino, &psize)) {
		/* Gone since the kernel cached its name: ESTALE makes open()
		 * look the name up again (and create it, with O_CREAT).
		 */
		fuse_reply_err(req, ESTALE);
		return;
	}
	if (rc && (fi->flags & O_ACCMODE) != O_RDONLY &&
	    kvfs_cache_temp_open(fs->c, ino, &fh_p) == 0) {
		/* A temporary opened again to be (re)written. */
		fh = fh_new(FH_WRITE);
		if (!fh) {
			kvfs_cache_temp_close(fs->c, fh_p);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		fh->p = fh_p;
		fh->temp = true;
		if (fi->flags & O_TRUNC)
			kvfs_cache_truncate(fh_p, 0);
		fi->direct_io = 1;
		fi->fh = (uintptr_t)fh;
		if (fuse_reply_open(req, fi) == -ENOENT)
			fh_free(fs, fh);
		return;
	}
	if (rc) {
		fuse_reply_err(req, kvfs_cache_ns_by_ino(fs->c, ino) ||
						    ino == KVFS_INO_ROOT ||
						    ino == KVFS_INO_CTLDIR
					    ? EISDIR
					    : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		/* Committed blocks are immutable. */
		kvfs_cache_put(fs->c, b);
		fuse_reply_err(req, EPERM);
		return;
	}
	rc = kvfs_fuse_may(req, kvfs_block_ns(b), KVFS_CTL_MAY_READ,
			   "open a block");
	if (rc) {
		kvfs_cache_put(fs->c, b);
		reply_rc(req, rc);
		return;
	}
	fh = fh_new(FH_READ);
	if (!fh) {
		kvfs_cache_put(fs->c, b);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	rc = kvfs_cache_reader_init(fs->c, &fh->r, b);
	if (rc) {
		fh->kind = FH_TEXT; /* nothing to release */
		fh_free(fs, fh);
		reply_rc(req, rc);
		return;
	}
	/* The bytes of a block never change, so the page cache may keep
	 * them across opens: mmap re-reads run at page-cache speed.
	 */
	fi->keep_cache = 1;
	/* Nothing to do at close for a reader: spare the round trip. */
	fi->noflush = 1;
	fi->fh = (uintptr_t)fh;
	if (fuse_reply_open(req, fi) == -ENOENT)
		fh_free(fs, fh);
}

static void kvfs_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode, struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct kvfs_ns *ns = kvfs_cache_ns_by_ino(fs->c, parent);
	struct kvfs_pending *p;
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_fh *fh;
	bool temp;
	int rc;

	if (!ns) {
		/* Only namespace directories hold blocks. */
		fuse_reply_err(req, parent == KVFS_INO_ROOT ||
						    parent == KVFS_INO_CTLDIR
					    ? EPERM
					    : ENOTDIR);
		return;
	}
	/* The kernel checked the directory's mode (default_permissions);
	 * the engine's own rule says the same, whatever the mount options.
	 */
	rc = kvfs_fuse_may(req, ns, KVFS_CTL_MAY_WRITE, "create a block");
	/* Any other name is a temporary: a rename to its key commits it. */
	temp = kvfs_fmt_name_parse(name, key) != 0;
	if (!rc)
		rc = temp ? kvfs_cache_temp_create(fs->c, ns, name, &p)
			  : kvfs_cache_create(fs->c, ns, name, &p);
	if (rc) {
		reply_rc(req, rc);
		return;
	}
	fh = fh_new(FH_WRITE);
	if (!fh) {
		if (temp)
			kvfs_cache_temp_close(fs->c, p);
		else
			kvfs_cache_abandon(fs->c, p);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fh->p = p;
	fh->ns = ns;
	fh->uid = (uint32_t)fuse_req_ctx(req)->uid;
	fh->gid = (uint32_t)fuse_req_ctx(req)->gid;
	fh->temp = temp;
	memset(&e, 0, sizeof(e));
	e.ino = kvfs_pending_ino(p);
	pending_attr(fh, &e.attr);
	/* Not cached: the name must not resolve for others until commit. */
	e.entry_timeout = 0;
	e.attr_timeout = 0;
	fi->direct_io = 1;
	fi->fh = (uintptr_t)fh;
	if (fuse_reply_create(req, &e, fi) == -ENOENT)
		fh_free(fs, fh);
}

/* ------------------------------------------------------------------- I/O */

static void read_fh(fuse_req_t req, struct kvfs_fs *fs, struct kvfs_fh *fh,
		    size_t size, off_t off);

static void kvfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_fh *fh = fh_of(fi);
	uint64_t t0 = kvfs_util_now_mono();

	/* RELEASE cannot have been sent yet: this read is still ours. */
	atomic_fetch_add(&fh->refs, 1);
	read_fh(req, fs, fh, size, off);
	/* A block's read, reply included (metrics: kvfs_fuse_read_...). */
	if (fh->kind == FH_READ)
		kvfs_cache_hist_add(fs->c, KVFS_CACHE_HIST_READ,
				    kvfs_util_now_mono() - t0);
	fh_free(fs, fh);
}

static void read_fh(fuse_req_t req, struct kvfs_fs *fs, struct kvfs_fh *fh,
		    size_t size, off_t off)
{
	struct kvfs_reader r;
	const void *p;
	size_t n;
	int rc;

	switch (fh->kind) {
	case FH_TEXT:
		if ((size_t)off >= fh->text_len)
			fuse_reply_buf(req, NULL, 0);
		else
			fuse_reply_buf(req, fh->text + off,
				       size < fh->text_len - (size_t)off
					       ? size
					       : fh->text_len - (size_t)off);
		return;
	case FH_CTL: {
		/* The response of the last write, once; taken out of the
		 * handle before replying (see below).
		 */
		char *t = NULL;
		size_t tl = 0;

		pthread_mutex_lock(&fh->lock);
		if (fh->text && size >= fh->text_len) {
			t = fh->text;
			tl = fh->text_len;
			fh->text = NULL;
			fh->text_len = 0;
		} else if (fh->text) {
			tl = fh->text_len;
		}
		pthread_mutex_unlock(&fh->lock);
		if (t)
			fuse_reply_buf(req, t, tl);
		else if (tl)
			fuse_reply_err(req, EMSGSIZE);
		else
			fuse_reply_buf(req, NULL, 0);
		free(t);
		return;
	}
	case FH_WRITE:
		fuse_reply_err(req, EBADF);
		return;
	case FH_READ:
		break;
	}
	/* Concurrent reads on one handle each get their own view of the
	 * reader; the private copy, once loaded, is shared and immutable.
	 */
	pthread_mutex_lock(&fh->lock);
	r = fh->r;
	pthread_mutex_unlock(&fh->lock);
	rc = kvfs_cache_read_begin(fs->c, &r, (uint64_t)off, size, &p, &n);
	if (rc) {
		reply_rc(req, rc);
		return;
	}
	/*
	 * Nothing may touch the handle after the reply: the kernel can send
	 * RELEASE, and free it, as soon as it has the data. The open handle
	 * itself keeps the DRAM copy from being dropped (eviction skips open
	 * blocks), so the in-flight count can end before the reply.
	 */
	kvfs_cache_read_end(fs->c, &r);
	if (r.priv) {
		pthread_mutex_lock(&fh->lock);
		if (!fh->r.priv) {
			fh->r.priv = r.priv;
			fh->r.priv_len = r.priv_len;
			r.priv = NULL;
		} else if (fh->r.priv == r.priv) {
			r.priv = NULL;
		}
		pthread_mutex_unlock(&fh->lock);
	}
	fuse_reply_buf(req, p, n);
	/* A copy a concurrent read loaded first: ours served this reply. */
	free(r.priv);
}

/* Blocks a ctl request deleted are gone for the kernel too before the
 * reply: a stat right after kvfsctl evict --tier all must not find them.
 */
static void ctl_inval_sync(fuse_req_t req)
{
	struct kvfs_fs *fs = fs_of(req);

	if (fs->inval_sync)
		fs->inval_sync();
}

/*
 * The write-then-read transport: the whole request in one write; its
 * response waits for the next read on the same descriptor. A request
 * split over several writes is refused rather than buffered: a client
 * that does so has a bug, and a partial request must never run.
 */
static void ctl_write(fuse_req_t req, struct kvfs_fh *fh, const char *buf,
		      size_t size)
{
	struct kvfs_ctl_creds cr;
	void *resp;
	size_t rlen;
	int rc;

	if (size > KVFS_CTL_MAX_SIZE) {
		kvfs_warn("ctl: request of %zu bytes exceeds %u", size,
			  KVFS_CTL_MAX_SIZE);
		fuse_reply_err(req, EMSGSIZE);
		return;
	}
	kvfs_fuse_creds(req, &cr);
	rc = kvfs_ctl_exec(fh->ctl, &cr, buf, size, KVFS_CTL_MAX_SIZE, &resp,
			   &rlen);
	ctl_inval_sync(req);
	if (rc) {
		reply_rc(req, rc);
		return;
	}
	pthread_mutex_lock(&fh->lock);
	free(fh->text);
	fh->text = resp;
	fh->text_len = rlen;
	pthread_mutex_unlock(&fh->lock);
	fuse_reply_write(req, size);
}

static void kvfs_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		       size_t size, off_t off, struct fuse_file_info *fi)
{
	struct kvfs_fh *fh = fh_of(fi);
	int rc;

	if (fh->kind == FH_CTL) {
		ctl_write(req, fh, buf, size);
		return;
	}
	if (fh->kind != FH_WRITE) {
		fuse_reply_err(req, EBADF);
		return;
	}
	pthread_mutex_lock(&fh->lock);
	rc = fh->p ? kvfs_cache_write(fh->p, (uint64_t)off, buf, size)
		   : -EPERM;
	pthread_mutex_unlock(&fh->lock);
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_write(req, size);
}

/* Commit the handle's block once; later calls return the first result.
 * Caller holds fh->lock.
 */
static int fh_commit(struct kvfs_fs *fs, struct kvfs_fh *fh)
{
	/* A temporary commits when it is renamed, not at close. */
	if (fh->p && !fh->temp) {
		/* Room under the namespace's quota first, made from its own
		 * blocks: over it with nothing to evict, close fails (EDQUOT).
		 */
		fh->rc = kvfs_ctl_quota_admit(fs->c, fh->ns,
					      kvfs_pending_size(fh->p));
		if (fh->rc)
			kvfs_cache_abandon(fs->c, fh->p);
		else
			fh->rc = kvfs_cache_commit(fs->c, fh->p, &fh->b);
		fh->p = NULL;
	}
	return fh->rc;
}

static void kvfs_flush(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct kvfs_fh *fh = fh_of(fi);
	int rc = 0;

	/* close() returns flush's result, not release's: validation and
	 * commit happen here so that a bad block fails visibly.
	 */
	if (fh->kind == FH_WRITE) {
		pthread_mutex_lock(&fh->lock);
		rc = fh_commit(fs_of(req), fh);
		pthread_mutex_unlock(&fh->lock);
	} else if (fh->kind == FH_CTL) {
		/* Sent synchronously on close() and at process exit: the
		 * closing process's leases are back before it returns.
		 */
		kvfs_ctl_flush(fh->ctl, fuse_req_ctx(req)->pid);
	}
	reply_rc(req, rc);
}

static void kvfs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		       struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_fh *fh = fh_of(fi);
	struct kvfs_block *b = NULL;
	int rc = 0;

	if (fh->kind == FH_WRITE) {
		pthread_mutex_lock(&fh->lock);
		rc = fh_commit(fs, fh);
		b = fh->b;
		pthread_mutex_unlock(&fh->lock);
	} else if (fh->kind == FH_READ) {
		b = fh->r.b;
	}
	if (!rc && b)
		rc = kvfs_cache_fsync(fs->c, b);
	reply_rc(req, rc);
}

static void kvfs_release(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_file_info *fi)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_fh *fh = fh_of(fi);

	if (fh->kind == FH_WRITE && fh->p && !fh->temp) {
		/* No flush reached us (the writer vanished mid-way): commit
		 * what is there; a bad block is logged and dropped.
		 */
		fh_commit(fs, fh);
	}
	fh_free(fs, fh);
	fuse_reply_err(req, 0);
}

/* --------------------------------------------------------- namespace ops */

static void kvfs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_ns *ns = kvfs_cache_ns_by_ino(fs->c, parent);
	int rc;
	uint8_t key[KVFS_KEY_LEN];

	if (!ns) {
		fuse_reply_err(req, parent == KVFS_INO_ROOT ||
						    parent == KVFS_INO_CTLDIR
					    ? EPERM
					    : ENOTDIR);
		return;
	}
	rc = kvfs_fuse_may(req, ns, KVFS_CTL_MAY_WRITE, "unlink a block");
	if (rc)
		reply_rc(req, rc);
	else if (kvfs_fmt_name_parse(name, key))
		reply_rc(req, kvfs_cache_temp_unlink(fs->c, ns, name));
	else
		reply_rc(req, kvfs_cache_unlink(fs->c, ns, name));
}

static void kvfs_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			fuse_ino_t newparent, const char *newname,
			unsigned int flags)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_ns *ns = kvfs_cache_ns_by_ino(fs->c, parent);
	struct kvfs_block *b;
	int rc;

	/* A block's name is its content hash: renaming one would lie.  A
	 * temporary renamed to its key (rsync's last step) commits it.
	 * The target never exists (-EEXIST otherwise), so NOREPLACE holds.
	 */
	if (!ns || newparent != parent || (flags & ~RENAME_NOREPLACE)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	/* Committing a temporary adds a block: the same rules as close. */
	rc = kvfs_fuse_may(req, ns, KVFS_CTL_MAY_WRITE, "rename a block");
	if (!rc) {
		uint64_t ino, size;

		if (!kvfs_cache_temp_stat(fs->c, ns, name, &ino, &size))
			rc = kvfs_ctl_quota_admit(fs->c, ns, size);
	}
	if (rc) {
		reply_rc(req, rc);
		return;
	}
	rc = kvfs_cache_temp_commit(fs->c, ns, name, newname, &b);
	if (rc == -ENOENT) {
		rc = kvfs_cache_lookup(fs->c, ns, name, &b);
		if (!rc)
			kvfs_cache_put(fs->c, b);
		rc = rc ? -ENOENT : -EPERM;
	} else if (!rc) {
		kvfs_cache_put(fs->c, b);
	}
	reply_rc(req, rc);
}

static void kvfs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		      const char *newname)
{
	fuse_reply_err(req, EPERM);
}

static void kvfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		       mode_t mode)
{
	/* Namespaces come from kvfs.conf, where their geometry is. */
	fuse_reply_err(req, EPERM);
}

static void kvfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, EPERM);
}

static void kvfs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		       mode_t mode, dev_t rdev)
{
	fuse_reply_err(req, EPERM);
}

static void kvfs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			 const char *name)
{
	fuse_reply_err(req, EPERM);
}

static void kvfs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct kvfs_cache_fsinfo fi;
	struct statvfs st;

	kvfs_cache_fsinfo(fs_of(req)->c, &fi);
	memset(&st, 0, sizeof(st));
	st.f_bsize = 4096;
	st.f_frsize = 4096;
	st.f_blocks = fi.ssd_capacity / 4096;
	st.f_bfree = fi.ssd_free / 4096;
	st.f_bavail = st.f_bfree;
	st.f_files = fi.blocks + st.f_bfree;
	st.f_ffree = st.f_bfree;
	st.f_favail = st.f_bfree;
	st.f_namemax = 255;
	fuse_reply_statfs(req, &st);
}

static void kvfs_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd,
		       void *arg, struct fuse_file_info *fi, unsigned flags,
		       const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	struct kvfs_fh *fh = fh_of(fi);
	const struct kvfs_ctl_req *r = in_buf;
	struct kvfs_ctl_creds cr;
	void *resp;
	size_t rlen;
	int rc;

	if (ino != KVFS_INO_CTL || fh->kind != FH_CTL) {
		/* cp tries FICLONE and friends: not a block operation. */
		fuse_reply_err(req, ENOTTY);
		return;
	}
	if (flags & FUSE_IOCTL_COMPAT) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	if (_IOC_TYPE(cmd) != KVFS_IOC_TYPE ||
	    _IOC_SIZE(cmd) != KVFS_CTL_MSG_SIZE ||
	    _IOC_NR(cmd) < KVFS_IOC_NR(1) ||
	    _IOC_NR(cmd) > KVFS_IOC_NR(KVFS_CTL_OP_MAX) ||
	    _IOC_DIR(cmd) != (_IOC_READ | _IOC_WRITE)) {
		kvfs_warn("ctl: unknown ioctl 0x%x", cmd);
		fuse_reply_err(req, ENOTTY);
		return;
	}
	if (in_bufsz != KVFS_CTL_MSG_SIZE || out_bufsz != KVFS_CTL_MSG_SIZE) {
		kvfs_warn("ctl: ioctl buffer of %zu/%zu bytes, expected %u",
			  in_bufsz, out_bufsz, KVFS_CTL_MSG_SIZE);
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (r->op != _IOC_NR(cmd) - KVFS_IOC_NR(0)) {
		kvfs_warn("ctl: ioctl 0x%x carries op %u", cmd, r->op);
		fuse_reply_err(req, EINVAL);
		return;
	}
	/* The message is fixed-size: the request's own size says how much
	 * of it is the request.
	 */
	kvfs_fuse_creds(req, &cr);
	rc = kvfs_ctl_exec(fh->ctl, &cr, in_buf,
			   r->size <= KVFS_CTL_MSG_SIZE ? r->size : in_bufsz,
			   KVFS_CTL_MSG_SIZE, &resp, &rlen);
	ctl_inval_sync(req);
	if (rc) {
		reply_rc(req, rc);
		return;
	}
	fuse_reply_ioctl(req, 0, resp, rlen);
	free(resp);
}

uint32_t kvfs_fs_readahead(struct kvfs_cache *c)
{
	uint64_t most = 1u << 20;

	for (size_t i = 0; i < kvfs_cache_ns_count(c); i++) {
		uint64_t sz = kvfs_fmt_max_file_size(
			kvfs_ns_geom(kvfs_cache_ns_at(c, i)));

		if (sz > most)
			most = sz;
	}
	most = kvfs_util_align_up(most, 1u << 20);
	return most > (64u << 20) ? 64u << 20 : (uint32_t)most;
}

static void kvfs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct kvfs_fs *fs = userdata;

	/* Blocks are megabytes: move them in large requests. */
	conn->max_write = 1 << 20;
	/* The kernel keeps the smaller of this and the mount's read_ahead_kb
	 * (which the daemon raises to the same value).
	 */
	conn->max_readahead = fs->readahead;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
}

const struct fuse_lowlevel_ops kvfs_fuse_ops = {
	.init = kvfs_init,
	.lookup = kvfs_lookup,
	.getattr = kvfs_getattr,
	.setattr = kvfs_setattr,
	.readdir = kvfs_readdir,
	.open = kvfs_open,
	.create = kvfs_create,
	.read = kvfs_read,
	.write = kvfs_write,
	.flush = kvfs_flush,
	.fsync = kvfs_fsync,
	.release = kvfs_release,
	.unlink = kvfs_unlink,
	.rename = kvfs_rename,
	.link = kvfs_link,
	.mkdir = kvfs_mkdir,
	.rmdir = kvfs_rmdir,
	.mknod = kvfs_mknod,
	.symlink = kvfs_symlink,
	.statfs = kvfs_statfs,
	.getxattr = kvfs_fuse_getxattr,
	.listxattr = kvfs_fuse_listxattr,
	.setxattr = kvfs_fuse_setxattr,
	.removexattr = kvfs_fuse_removexattr,
	.ioctl = kvfs_ioctl,
};
