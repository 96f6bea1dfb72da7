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
#include "fs/fuse_ops.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/util.h"

#define XATTR_PREFIX "user.kvfs."

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
	struct kvfs_block *b;        /* FH_WRITE after commit */
	int rc;                      /* FH_WRITE: the commit's result */
	bool temp;                   /* FH_WRITE: p is a temporary (rename commits it) */
	char *text;                  /* FH_TEXT; FH_CTL: pending response */
	size_t text_len;
	struct kvfs_ctl_session *ctl; /* FH_CTL */
};

static struct kvfs_fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct kvfs_fh *fh_of(struct fuse_file_info *fi)
{
	return (struct kvfs_fh *)(uintptr_t)fi->fh;
}

static void reply_rc(fuse_req_t req, int rc)
{
	fuse_reply_err(req, rc < 0 ? -rc : rc);
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

static void block_attr(struct kvfs_block *b, struct stat *st)
{
	struct kvfs_block_info bi;

	kvfs_block_info(b, &bi);
	memset(st, 0, sizeof(*st));
	st->st_ino = bi.ino;
	/* Committed blocks are immutable: read-only for everyone. */
	st->st_mode = S_IFREG | 0444;
	st->st_nlink = 1;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_size = (off_t)bi.size;
	st->st_blocks = (blkcnt_t)((bi.size + 511) / 512);
	st->st_blksize = 1 << 20;
	st->st_mtim.tv_sec = (time_t)(bi.created / 1000000000ull);
	st->st_mtim.tv_nsec = (long)(bi.created % 1000000000ull);
	st->st_ctim = st->st_mtim;
	st->st_atim.tv_sec = (time_t)(bi.last_access / 1000000000ull);
	st->st_atim.tv_nsec = (long)(bi.last_access % 1000000000ull);
}

/* A file being written: writable by its writer, size still growing. */
static void pending_stat(uint64_t ino, uint64_t size, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = S_IFREG | 0644;
	st->st_nlink = 1;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
}

static void pending_attr(struct kvfs_pending *p, struct stat *st)
{
	pending_stat(kvfs_pending_ino(p), kvfs_pending_size(p), st);
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
		dir_attr(st, ino, 2);
		dir_times(fs, ns, st);
		return 0;
	}
	if (kvfs_cache_get(fs->c, ino, &b) == 0) {
		block_attr(b, st);
		kvfs_cache_put(fs->c, b);
		return 0;
	}
	uint64_t size;
	if (kvfs_cache_pending_size(fs->c, ino, &size) == 0) {
		pending_stat(ino, size, st);
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
			pending_stat(e.ino, size, &e.attr);
			e.entry_timeout = 0;
			e.attr_timeout = 0;
			fuse_reply_entry(req, &e);
			return;
		}
		if (rc) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		block_attr(b, &e.attr);
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
			pending_attr(fh->p, &st);
		else if (fh->b)
			block_attr(fh->b, &st);
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
			block_attr(fh->b, &st);
		rc = fh->b ? attr_noop(&st, attr, to_set, false) : -EPERM;
	} else {
		pending_attr(fh->p, &st);
		rc = attr_noop(&st, attr, to_set & ~FUSE_SET_ATTR_SIZE, true);
		if (!rc && (to_set & FUSE_SET_ATTR_SIZE))
			rc = kvfs_cache_truncate(fh->p,
						 (uint64_t)attr->st_size);
		if (!rc)
			pending_attr(fh->p, &st);
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
	/* Any other name is a temporary: a rename to its key commits it. */
	temp = kvfs_fmt_name_parse(name, key) != 0;
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
	fh->temp = temp;
	memset(&e, 0, sizeof(e));
	e.ino = kvfs_pending_ino(p);
	pending_attr(p, &e.attr);
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

	/* RELEASE cannot have been sent yet: this read is still ours. */
	atomic_fetch_add(&fh->refs, 1);
	read_fh(req, fs, fh, size, off);
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

/*
 * The write-then-read transport: the whole request in one write; its
 * response waits for the next read on the same descriptor. A request
 * split over several writes is refused rather than buffered: a client
 * that does so has a bug, and a partial request must never run.
 */
static void ctl_write(fuse_req_t req, struct kvfs_fh *fh, const char *buf,
		      size_t size)
{
	void *resp;
	size_t rlen;
	int rc;

	if (size > KVFS_CTL_MAX_SIZE) {
		kvfs_warn("ctl: request of %zu bytes exceeds %u", size,
			  KVFS_CTL_MAX_SIZE);
		fuse_reply_err(req, EMSGSIZE);
		return;
	}
	rc = kvfs_ctl_exec(fh->ctl, fuse_req_ctx(req)->pid, buf, size,
			   KVFS_CTL_MAX_SIZE, &resp, &rlen);
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
		rc = kvfs_cache_sync(fs->c, b);
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
	uint8_t key[KVFS_KEY_LEN];

	if (!ns) {
		fuse_reply_err(req, parent == KVFS_INO_ROOT ||
						    parent == KVFS_INO_CTLDIR
					    ? EPERM
					    : ENOTDIR);
		return;
	}
	if (kvfs_fmt_name_parse(name, key))
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

/* ---------------------------------------------------------------- xattrs */

static int tiers_str(unsigned bits, char *buf, size_t len)
{
	static const int order[] = { KVFS_TIER_GPU, KVFS_TIER_DRAM,
				     KVFS_TIER_SSD };
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < 3; i++) {
		if (!(bits & (1u << order[i])))
			continue;
		used += (size_t)snprintf(buf + used, len - used, "%s%s",
					 used ? "," : "",
					 kvfs_tier_name(order[i]));
	}
	return (int)used;
}

/* The value of @name for a block, or -ENODATA. */
static int block_xattr(struct kvfs_block *b, const char *name, char *v,
		       size_t len)
{
	struct kvfs_block_info bi;
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_block_info(b, &bi);
	if (strncmp(name, XATTR_PREFIX, strlen(XATTR_PREFIX)))
		return -ENODATA;
	name += strlen(XATTR_PREFIX);
	if (!strcmp(name, "tier"))
		return tiers_str(bi.tiers, v, len);
	if (!strcmp(name, "tokens"))
		return snprintf(v, len, "%u", bi.n_tokens);
	if (!strcmp(name, "parent")) {
		kvfs_fmt_key_hex(bi.parent, hex);
		return snprintf(v, len, "%s", hex);
	}
	if (!strcmp(name, "hits"))
		return snprintf(v, len, "%" PRIu64, bi.hits);
	if (!strcmp(name, "last_access"))
		return snprintf(v, len, "%" PRIu64 ".%09" PRIu64,
				(uint64_t)(bi.last_access / 1000000000ull),
				(uint64_t)(bi.last_access % 1000000000ull));
	if (!strcmp(name, "depth"))
		return snprintf(v, len, "%u", bi.depth);
	if (!strcmp(name, "durable"))
		return snprintf(v, len, "%d", bi.persisted ? 1 : 0);
	if (!strcmp(name, "category"))
		return snprintf(v, len, "%u", bi.category);
	if (!strcmp(name, "leases"))
		return snprintf(v, len, "%u", bi.leases);
	/* What the store keeps; reads always see the KV-kind file.  A split
	 * block names its layer ranges, both inclusive:
	 * "hidden:0-30,kv:31-31".
	 */
	if (!strcmp(name, "stored_as")) {
		if (bi.stored_kind == KVFS_KIND_MIXED)
			return snprintf(v, len, "hidden:0-%u,kv:%u-%u",
					bi.stored_kv_from - 1,
					bi.stored_kv_from, bi.n_layers - 1);
		return snprintf(v, len, "%s",
				bi.stored_kind == KVFS_KIND_HIDDEN ? "hidden" :
								     "kv");
	}
	/* The stored image's bytes (what the SSD holds; the file's size is
	 * the KV-kind file's).
	 */
	if (!strcmp(name, "stored_bytes"))
		return snprintf(v, len, "%" PRIu64, bi.stored_size);
	if (!strcmp(name, "pin")) {
		if (!bi.pins)
			return -ENODATA;
		return tiers_str(bi.pins, v, len);
	}
	return -ENODATA;
}

static const char *const block_xattrs[] = {
	"tier", "tokens", "parent", "hits", "last_access", "depth",
	"durable", "category", "leases", "pin", "stored_as", "stored_bytes",
};

static int ns_xattr(struct kvfs_ns *ns, const char *name, char *v,
		    size_t len)
{
	const struct kvfs_geom *g = kvfs_ns_geom(ns);
	char hex[KVFS_KEY_HEX_LEN + 1];

	if (!strcmp(name, XATTR_PREFIX "root")) {
		kvfs_fmt_key_hex(kvfs_ns_root(ns), hex);
		return snprintf(v, len, "%s", hex);
	}
	if (!strcmp(name, XATTR_PREFIX "geometry"))
		return snprintf(v, len,
				"layers=%u kv_heads=%u head_dim=%u dtype=%s "
				"block_tokens=%u chunk_tokens=%u hidden_size=%u",
				g->n_layers, g->n_kv_heads, g->head_dim,
				kvfs_fmt_dtype_name(g->dtype), g->block_tokens,
				g->chunk_tokens, g->hidden_size);
	if (!strcmp(name, XATTR_PREFIX "blocks"))
		return snprintf(v, len, "%" PRIu64, kvfs_ns_nblocks(ns));
	return -ENODATA;
}

static void reply_value(fuse_req_t req, const char *v, int n, size_t size)
{
	if (n < 0)
		reply_rc(req, n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else if ((size_t)n > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, v, (size_t)n);
}

static void kvfs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			  size_t size)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_block *b;
	struct kvfs_ns *ns;
	char v[512];
	int n = -ENODATA;

	ns = kvfs_cache_ns_by_ino(fs->c, ino);
	if (ns) {
		n = ns_xattr(ns, name, v, sizeof(v));
	} else if (kvfs_cache_get(fs->c, ino, &b) == 0) {
		n = block_xattr(b, name, v, sizeof(v));
		kvfs_cache_put(fs->c, b);
	}
	reply_value(req, v, n, size);
}

static void kvfs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_block *b;
	char list[1024], v[512];
	size_t used = 0;

	if (kvfs_cache_ns_by_ino(fs->c, ino)) {
		static const char names[] = XATTR_PREFIX "root\0" XATTR_PREFIX
			"geometry\0" XATTR_PREFIX "blocks";

		memcpy(list, names, sizeof(names));
		used = sizeof(names);
	} else if (kvfs_cache_get(fs->c, ino, &b) == 0) {
		for (size_t i = 0; i < sizeof(block_xattrs) /
						sizeof(block_xattrs[0]);
		     i++) {
			char full[64];

			snprintf(full, sizeof(full), XATTR_PREFIX "%s",
				 block_xattrs[i]);
			if (block_xattr(b, full, v, sizeof(v)) < 0)
				continue;
			memcpy(list + used, full, strlen(full) + 1);
			used += strlen(full) + 1;
		}
		kvfs_cache_put(fs->c, b);
	}
	reply_value(req, list, (int)used, size);
}

/*
 * A settable value is one short word. Trailing newlines and NULs are
 * dropped (echo and some tools add them); anything else around the word,
 * or a value too long for @len, makes it garbage rather than something to
 * cut down to a word that happens to parse: -EINVAL.
 */
static int xattr_word(const char *name, const char *value, size_t size,
		      char *v, size_t len)
{
	while (size && (value[size - 1] == '\0' || value[size - 1] == '\n'))
		size--;
	if (size >= len || (size && (memchr(value, '\0', size) ||
				     memchr(value, '\n', size)))) {
		kvfs_warn("setxattr %s: a value of %zu bytes that is not one "
			  "word", name, size);
		v[0] = 0;
		return -EINVAL;
	}
	if (size)
		memcpy(v, value, size);
	v[size] = 0;
	return 0;
}

static void kvfs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			  const char *value, size_t size, int flags)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_block *b;
	char v[64], junk[512];
	uint32_t cat;
	int rc, tier;

	if (kvfs_cache_ns_by_ino(fs->c, ino)) {
		rc = ns_xattr(kvfs_cache_ns_by_ino(fs->c, ino), name, junk,
			      sizeof(junk));
		reply_rc(req, rc >= 0 ? -EPERM : -ENOTSUP);
		return;
	}
	rc = kvfs_cache_get(fs->c, ino, &b);
	if (rc) {
		uint64_t psize;

		/* A file being written keeps no attributes: cp -a's ACLs
		 * and xattrs meet a filesystem without them.
		 */
		reply_rc(req, ino < KVFS_INO_BLOCK_BASE ||
				      !kvfs_cache_pending_size(fs->c, ino,
							       &psize)
			      ? -ENOTSUP
			      : rc);
		return;
	}
	if (!strcmp(name, XATTR_PREFIX "pin")) {
		tier = xattr_word(name, value, size, v, sizeof(v));
		if (!tier)
			tier = kvfs_tier_parse(v);
		if (tier < 0) {
			kvfs_warn("setxattr %s=%s: expected gpu, dram or ssd",
				  name, v);
			rc = -EINVAL;
		} else {
			rc = kvfs_cache_pin(fs->c, b, tier);
		}
	} else if (!strcmp(name, XATTR_PREFIX "category")) {
		rc = xattr_word(name, value, size, v, sizeof(v));
		if (!rc)
			rc = kvfs_util_parse_u32(v, &cat);
		if (rc || cat > 0xffff) {
			kvfs_warn("setxattr %s=%s: expected 0..65535", name, v);
			rc = -EINVAL;
		} else {
			rc = kvfs_cache_set_category(fs->c, b, cat);
		}
	} else if (block_xattr(b, name, junk, sizeof(junk)) >= 0 ||
		   !strcmp(name, XATTR_PREFIX "pin")) {
		rc = -EPERM;
	} else {
		bool ours = !strncmp(name, XATTR_PREFIX, strlen(XATTR_PREFIX));
		size_t i;

		for (i = 0; ours && i < sizeof(block_xattrs) /
						sizeof(block_xattrs[0]);
		     i++)
			if (!strcmp(name + strlen(XATTR_PREFIX),
				    block_xattrs[i]))
				break;
		rc = ours && i < sizeof(block_xattrs) / sizeof(block_xattrs[0])
			     ? -EPERM
			     : -ENOTSUP;
	}
	kvfs_cache_put(fs->c, b);
	reply_rc(req, rc);
}

static void kvfs_removexattr(fuse_req_t req, fuse_ino_t ino,
			     const char *name)
{
	struct kvfs_fs *fs = fs_of(req);
	struct kvfs_block *b;
	char junk[512];
	int rc;

	rc = kvfs_cache_get(fs->c, ino, &b);
	if (rc) {
		reply_rc(req, kvfs_cache_ns_by_ino(fs->c, ino) ? -EPERM
							       : -ENODATA);
		return;
	}
	if (!strcmp(name, XATTR_PREFIX "pin")) {
		struct kvfs_block_info bi;

		kvfs_block_info(b, &bi);
		rc = bi.pins ? kvfs_cache_unpin(fs->c, b) : -ENODATA;
	} else if (block_xattr(b, name, junk, sizeof(junk)) >= 0) {
		rc = -EPERM;
	} else {
		rc = -ENODATA;
	}
	kvfs_cache_put(fs->c, b);
	reply_rc(req, rc);
}

static void kvfs_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd,
		       void *arg, struct fuse_file_info *fi, unsigned flags,
		       const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	struct kvfs_fh *fh = fh_of(fi);
	const struct kvfs_ctl_req *r = in_buf;
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
	rc = kvfs_ctl_exec(fh->ctl, fuse_req_ctx(req)->pid, in_buf,
			   r->size <= KVFS_CTL_MSG_SIZE ? r->size : in_bufsz,
			   KVFS_CTL_MSG_SIZE, &resp, &rlen);
	if (rc) {
		reply_rc(req, rc);
		return;
	}
	fuse_reply_ioctl(req, 0, resp, rlen);
	free(resp);
}

static void kvfs_init(void *userdata, struct fuse_conn_info *conn)
{
	/* Blocks are megabytes: move them in large requests. */
	conn->max_write = 1 << 20;
	conn->max_readahead = 1 << 20;
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
	.getxattr = kvfs_getxattr,
	.listxattr = kvfs_listxattr,
	.setxattr = kvfs_setxattr,
	.removexattr = kvfs_removexattr,
	.ioctl = kvfs_ioctl,
};
