/* SPDX-License-Identifier: MIT */
/*
 * The shm device tier: POSIX shared-memory objects stand in for device
 * memory, one pool object per owner uid.  Clients map their owner's
 * object read-only by its name, exactly as they would open a
 * cudaIpcMemHandle, and their own memory ("peers") is another shm object
 * each.  An object is owned by its uid and mode 0600: it holds only the
 * blocks of that owner's namespaces, so only that user and root may map
 * it.  Every copy is a memcpy, so this backend is the reference the cuda
 * backend's tests are held to.
 *
 * Every object spans the capacity, which the owners share, so each is
 * sparse: alloc reserves the pages of the extent it hands out
 * (fallocate), so that running out of /dev/shm is -ENOSPC there rather
 * than a SIGBUS on some later copy.  With more than one owner, free
 * punches them out again, so the objects together hold no more than the
 * shared capacity.  A tier with one owner keeps them: its one object
 * can never hold more than the capacity, and a FETCH into pages that are
 * already there does not pay for allocating and zeroing them again,
 * which made a FETCH several times slower (docs/benchmarks.md, [6]).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tier/tier.h"
#include "gpu/gpu.h"
#include "gpu/gpu_i.h"
#include "meta/guard.h"
#include "meta/log.h"
#include "meta/util.h"

/* Names tried for a KVFS_GPU_PRIVATE pool before giving up. */
#define SHM_NAME_TRIES 64

struct shm_tier {
	struct kvfs_gpu_tier g;
	struct kvfs_gpu_pools pools; /* immutable after init (maps locked) */
};

static atomic_uint shm_seq;

static struct shm_tier *to_shm(struct kvfs_tier *t)
{
	return (struct shm_tier *)t;
}

/* Only for an extent the checks passed (its pool exists). */
static unsigned char *shm_at(struct kvfs_tier *t, const struct kvfs_extent *e,
			     uint64_t off)
{
	return kvfs_gpu_pool_of(t, e)->base + e->off + off;
}

static int shm_alloc_owner(struct kvfs_tier *t, uint32_t owner, uint64_t len,
			   struct kvfs_extent *e)
{
	int err = kvfs_gpu_pool_alloc(t, owner, len, e, "shm");
	struct kvfs_gpu_pool *p;

	if (err)
		return err;
	p = kvfs_gpu_pool_of(t, e);
	err = fallocate(p->fd, 0, (off_t)e->off, (off_t)e->len);
	/* Where the shm filesystem cannot reserve (not tmpfs), the pages
	 * come at the first write, as they did before pools were sparse.
	 */
	if (err && errno != EOPNOTSUPP) {
		err = errno;
		kvfs_dbg("shm: reserve %" PRIu64 " bytes of %s: %s", e->len,
			 p->desc.shm_name, strerror(err));
		kvfs_gpu_pool_free(t, e, NULL);
		return err == ENOSPC || err == ENOMEM ? -ENOSPC : -err;
	}
	e->ptr = shm_at(t, e, 0);
	return 0;
}

static int shm_alloc(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e)
{
	return shm_alloc_owner(t, to_shm(t)->pools.p[0].owner, len, e);
}

/* Under the pool's map lock, so the range is not handed out again before
 * its pages are gone.
 */
static void shm_unreserve(struct kvfs_gpu_pool *p, const struct kvfs_extent *e)
{
	if (fallocate(p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)e->off, (off_t)e->len))
		kvfs_dbg("shm: give back %" PRIu64 " bytes of %s: %s", e->len,
			 p->desc.shm_name, strerror(errno));
}

static void shm_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	kvfs_gpu_pool_free(t, e,
			   to_shm(t)->pools.n > 1 ? shm_unreserve : NULL);
}

static int shm_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return kvfs_gpu_pool_claim(t, e);
}

static int shm_write(struct kvfs_tier *t, const struct kvfs_extent *e,
		     uint64_t off, const void *buf, uint64_t len)
{
	int err = kvfs_gpu_ext_check(t, e, off, buf, len, "shm", "write");

	if (err)
		return err;
	if (len)
		memcpy(shm_at(t, e, off), buf, len);
	kvfs_tier_count(&t->st.writes, &t->st.bytes_written, 1, len);
	return 0;
}

static int shm_read(struct kvfs_tier *t, const struct kvfs_extent *e,
		    uint64_t off, void *buf, uint64_t len)
{
	int err = kvfs_gpu_ext_check(t, e, off, buf, len, "shm", "read");

	if (err)
		return err;
	if (len)
		memcpy(buf, shm_at(t, e, off), len);
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, 1, len);
	return 0;
}

static int shm_readv(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n)
{
	int first = 0;

	for (size_t i = 0; i < n; i++) {
		io[i].res = shm_read(t, io[i].ext, io[i].off, io[i].buf,
				     io[i].len);
		kvfs_tier_io_done(&io[i]);
		if (io[i].res && !first)
			first = io[i].res;
	}
	return first;
}

static int shm_sync(struct kvfs_tier *t)
{
	/* Every copy is complete when its call returns. */
	return 0;
}

static void *shm_map(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	if (kvfs_gpu_ext_check(t, e, 0, NULL, 0, "shm", "map"))
		return NULL;
	return shm_at(t, e, 0);
}

/* Unmap, close and unlink every pool set up so far. */
static void shm_pools_destroy(struct shm_tier *s)
{
	for (size_t i = 0; i < KVFS_GPU_OWNERS_MAX; i++) {
		struct kvfs_gpu_pool *p = &s->pools.p[i];

		if (p->base)
			munmap(p->base, (size_t)p->size);
		if (p->fd >= 0)
			close(p->fd);
		if (p->desc.shm_name[0] && shm_unlink(p->desc.shm_name) &&
		    errno != ENOENT)
			kvfs_warn("shm: unlink %s: %s", p->desc.shm_name,
				  strerror(errno));
	}
	kvfs_gpu_pools_release(&s->pools);
}

static void shm_release(struct kvfs_tier *t)
{
	struct shm_tier *s = to_shm(t);

	shm_pools_destroy(s);
	free(s);
}

const struct kvfs_tier_ops kvfs_gpu_shm_tier_ops = {
	.name = "shm",
	.alloc = shm_alloc,
	.free = shm_free,
	.claim = shm_claim,
	.write = shm_write,
	.read = shm_read,
	.readv = shm_readv,
	.sync = shm_sync,
	.map = shm_map,
	.release = shm_release,
};

/* ---- device ops ---- */

static void shm_describe(struct kvfs_tier *t, struct kvfs_ctl_mem *out)
{
	*out = to_shm(t)->pools.p[0].desc;
}

/* Whether @sb is one of @s's pool objects. */
static bool shm_is_pool(struct shm_tier *s, const struct stat *sb)
{
	for (size_t i = 0; i < s->pools.n; i++)
		if ((uint64_t)sb->st_dev == s->pools.p[i].dev &&
		    (uint64_t)sb->st_ino == s->pools.p[i].ino)
			return true;
	return false;
}

static int shm_peer_open(struct kvfs_tier *t, const struct kvfs_ctl_mem *m,
			 struct kvfs_gpu_peer **out)
{
	struct shm_tier *s = to_shm(t);
	struct kvfs_gpu_peer *p;
	struct stat sb;
	void *mem;
	int fd, err;

	err = kvfs_gpu_mem_check(m, KVFS_CTL_BACKEND_SHM, "shm");
	if (err)
		return err;
	if (m->size > SIZE_MAX || m->size > (uint64_t)INT64_MAX) {
		kvfs_err("shm: peer %s: size %" PRIu64 " too large",
			 m->shm_name, m->size);
		return -EINVAL;
	}
	fd = shm_open(m->shm_name, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0) {
		err = -errno;
		kvfs_err("shm: peer %s: %s", m->shm_name, strerror(-err));
		return err;
	}
	if (fstat(fd, &sb)) {
		err = -errno;
		kvfs_err("shm: peer %s: fstat: %s", m->shm_name,
			 strerror(-err));
		goto out_close_fd;
	}
	if (shm_is_pool(s, &sb)) {
		kvfs_err("shm: peer %s is one of this tier's pools",
			 m->shm_name);
		err = -EINVAL;
		goto out_close_fd;
	}
	if (!S_ISREG(sb.st_mode) || sb.st_size < 0 ||
	    (uint64_t)sb.st_size < m->size) {
		kvfs_err("shm: peer %s has %jd bytes, the request says %"
			 PRIu64, m->shm_name, (intmax_t)sb.st_size, m->size);
		err = -EINVAL;
		goto out_close_fd;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		err = -ENOMEM;
		goto out_close_fd;
	}
	/* Populated at once: a fetch writes all of it, and one call is far
	 * cheaper than a page fault per 4 KiB.
	 */
	mem = mmap(NULL, (size_t)m->size, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_POPULATE, fd, 0);
	if (mem == MAP_FAILED) {
		err = -errno;
		kvfs_err("shm: peer %s: mmap of %" PRIu64 " bytes: %s",
			 m->shm_name, m->size, strerror(-err));
		goto out_free_peer;
	}
	close(fd);
	p->t = t;
	p->base = mem;
	p->size = m->size;
	p->dev = (uint64_t)sb.st_dev;
	p->ino = (uint64_t)sb.st_ino;
	*out = p;
	return 0;

out_free_peer:
	free(p);
out_close_fd:
	close(fd);
	return err;
}

static void shm_peer_close(struct kvfs_tier *t, struct kvfs_gpu_peer *p)
{
	if (!p)
		return;
	if (kvfs_gpu_peer_check(t, p, "shm", "peer_close"))
		return;
	munmap(p->base, (size_t)p->size);
	free(p);
}

/* A transfer's pool or host side. */
static unsigned char *shm_side(struct kvfs_tier *t,
			       const struct kvfs_gpu_xfer *x)
{
	return x->pool ? shm_at(t, x->pool, x->off) : x->host;
}

/* The client shrank its object under the copy (SIGBUS, caught). */
static int peer_vanished(const char *op)
{
	kvfs_warn("shm: %s: the peer object shrank during the copy", op);
	return -EFAULT;
}

static bool shm_peer_same(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_ctl_mem *m)
{
	struct stat sb;
	bool same;
	int fd;

	if (!p || p->t != t || m->backend != KVFS_CTL_BACKEND_SHM ||
	    m->size != p->size ||
	    !memchr(m->shm_name, 0, sizeof(m->shm_name)))
		return false;
	fd = shm_open(m->shm_name, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return false;
	same = !fstat(fd, &sb) && (uint64_t)sb.st_dev == p->dev &&
	       (uint64_t)sb.st_ino == p->ino && sb.st_size >= 0 &&
	       (uint64_t)sb.st_size >= p->size;
	close(fd);
	return same;
}

static void *shm_peer_map(struct kvfs_tier *t, struct kvfs_gpu_peer *p)
{
	if (kvfs_gpu_peer_check(t, p, "shm", "peer_map"))
		return NULL;
	return p->base;
}

static int shm_peer_write(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_gpu_xfer *x, size_t n)
{
	int err = kvfs_gpu_peer_check(t, p, "shm", "peer_write");

	if (!err)
		err = kvfs_gpu_xfer_check(t, x, n, p->size,
					  KVFS_GPU_X_PEER | KVFS_GPU_X_PEER_DST,
					  "shm", "peer_write");
	if (err)
		return err;
	for (size_t i = 0; i < n; i++)
		if (x[i].len && kvfs_guard_memcpy(p->base + x[i].peer_off,
						  shm_side(t, &x[i]),
						  x[i].len))
			return peer_vanished("peer_write");
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, n,
			kvfs_gpu_xfer_bytes(x, n));
	return 0;
}

static int shm_peer_read(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			 const struct kvfs_gpu_xfer *x, size_t n)
{
	int err = kvfs_gpu_peer_check(t, p, "shm", "peer_read");

	if (!err)
		err = kvfs_gpu_xfer_check(t, x, n, p->size,
					  KVFS_GPU_X_PEER | KVFS_GPU_X_SIDE_DST,
					  "shm", "peer_read");
	if (err)
		return err;
	for (size_t i = 0; i < n; i++)
		if (x[i].len && kvfs_guard_memcpy(shm_side(t, &x[i]),
						  p->base + x[i].peer_off,
						  x[i].len))
			return peer_vanished("peer_read");
	kvfs_tier_count(&t->st.writes, &t->st.bytes_written, n,
			kvfs_gpu_xfer_bytes(x, n));
	return 0;
}

static int shm_upload(struct kvfs_tier *t, const struct kvfs_gpu_xfer *x,
		      size_t n)
{
	int err = kvfs_gpu_xfer_check(t, x, n, 0, KVFS_GPU_X_UPLOAD, "shm",
				      "upload");

	if (err)
		return err;
	for (size_t i = 0; i < n; i++)
		if (x[i].len)
			memcpy(shm_at(t, x[i].pool, x[i].off), x[i].host,
			       x[i].len);
	kvfs_tier_count(&t->st.writes, &t->st.bytes_written, n,
			kvfs_gpu_xfer_bytes(x, n));
	return 0;
}

static int shm_extent_addr(struct kvfs_tier *t, const struct kvfs_extent *e,
			   void **addr)
{
	if (!addr)
		return -EINVAL;
	*addr = NULL;
	if (kvfs_gpu_ext_check(t, e, 0, NULL, 0, "shm", "extent_addr"))
		return -EINVAL;
	*addr = shm_at(t, e, 0);
	return 0;
}

/* The pool is host memory: memcpy needs nothing registered. The
 * arguments are still checked, so that both backends refuse the same.
 */
static int shm_host_register(struct kvfs_tier *t, void *ptr, uint64_t len)
{
	if (!ptr || !len) {
		kvfs_err("shm: host_register of %s", ptr ? "0 bytes" :
			 "a NULL range");
		return -EINVAL;
	}
	return 0;
}

static int shm_host_unregister(struct kvfs_tier *t, void *ptr)
{
	return 0;
}

static const struct kvfs_gpu_ops shm_gpu_ops = {
	.describe = shm_describe,
	.describe_owner = kvfs_gpu_pool_describe,
	.alloc_owner = shm_alloc_owner,
	.peer_open = shm_peer_open,
	.peer_close = shm_peer_close,
	.peer_size = kvfs_gpu_peer_size,
	.peer_map = shm_peer_map,
	.peer_same = shm_peer_same,
	.peer_write = shm_peer_write,
	.peer_read = shm_peer_read,
	.upload = shm_upload,
	.extent_addr = shm_extent_addr,
	.host_register = shm_host_register,
	.host_unregister = shm_host_unregister,
};

/* ---- init ---- */

/*
 * Create @p's object @base + "-<uid>", of the owner's uid and mode 0600,
 * sized @size (sparse), and map it. -EEXIST when the name is taken (not
 * logged: a private pool tries another).
 */
static int shm_pool_create(struct kvfs_gpu_pool *p, const char *base,
			   uint32_t owner, uint64_t size)
{
	char *name = p->desc.shm_name;
	struct stat sb;
	void *mem;
	int fd, n, err;

	n = snprintf(name, sizeof(p->desc.shm_name), "%s-%" PRIu32, base,
		     owner);
	if (n < 0 || (size_t)n >= sizeof(p->desc.shm_name)) {
		kvfs_err("shm: pool name %s-%" PRIu32 " too long (at most %zu "
			 "bytes)", base, owner, sizeof(p->desc.shm_name) - 1);
		name[0] = 0;
		return -EINVAL;
	}
	fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0) {
		err = -errno;
		name[0] = 0; /* not ours to unlink */
		if (err != -EEXIST)
			kvfs_err("shm: create %s-%" PRIu32 ": %s", base, owner,
				 strerror(-err));
		return err;
	}
	p->fd = fd;
	/* Only its owner (and root) may map it, whatever the umask
	 * (docs/ctl.md). A daemon that is not root cannot give it away: it
	 * stays the daemon's, which its owner then cannot open.
	 */
	if (fchown(fd, (uid_t)owner, (gid_t)-1) && (uint32_t)geteuid() != owner)
		kvfs_warn("shm: cannot give pool %s to uid %" PRIu32 " (%s): "
			  "it stays the daemon's, and its owner cannot map it",
			  name, owner, strerror(errno));
	if (fchmod(fd, 0600) || ftruncate(fd, (off_t)size) || fstat(fd, &sb)) {
		err = -errno;
		kvfs_err("shm: size %s to %" PRIu64 " bytes: %s", name, size,
			 strerror(-err));
		return err;
	}
	mem = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		   0);
	if (mem == MAP_FAILED) {
		err = -errno;
		kvfs_err("shm: mmap %s: %s", name, strerror(-err));
		return err;
	}
	p->base = mem;
	p->dev = (uint64_t)sb.st_dev;
	p->ino = (uint64_t)sb.st_ino;
	p->desc.backend = KVFS_CTL_BACKEND_SHM;
	p->desc.size = size;
	return kvfs_gpu_pool_init(p, owner, size);
}

/* No pool set up: nothing to unmap, close or unlink. */
static void shm_pools_reset(struct shm_tier *s)
{
	memset(&s->pools, 0, sizeof(s->pools));
	for (size_t i = 0; i < KVFS_GPU_OWNERS_MAX; i++)
		s->pools.p[i].fd = -1;
}

/*
 * Create every pool under @name, or with KVFS_GPU_PRIVATE under @name
 * plus a suffix unique to this process and call.
 */
static int shm_pools_create(struct shm_tier *s, const char *name,
			    unsigned flags, const struct kvfs_gpu_owners *o,
			    uint64_t size)
{
	char base[KVFS_CTL_NAME_MAX];
	int err = -EEXIST;

	for (unsigned try = 0; try < SHM_NAME_TRIES && err == -EEXIST; try++) {
		int n;

		if (flags & KVFS_GPU_PRIVATE)
			n = snprintf(base, sizeof(base), "%s-%ld-%u", name,
				     (long)getpid(),
				     atomic_fetch_add(&shm_seq, 1));
		else
			n = snprintf(base, sizeof(base), "%s", name);
		if (n < 0 || (size_t)n >= sizeof(base)) {
			kvfs_err("shm: pool name %s too long (at most %zu "
				 "bytes with its suffixes)", name,
				 sizeof(base) - 1);
			return -EINVAL;
		}
		err = 0;
		for (size_t i = 0; i < o->n && !err; i++)
			err = shm_pool_create(&s->pools.p[i], base, o->uid[i],
					      size);
		if (!err)
			return 0;
		shm_pools_destroy(s);
		shm_pools_reset(s);
		if (err == -EEXIST && !(flags & KVFS_GPU_PRIVATE)) {
			kvfs_err("shm: create %s-...: a pool of that name "
				 "exists", base);
			return err;
		}
	}
	if (err == -EEXIST)
		kvfs_err("shm: no free name for a private pool after %d tries",
			 SHM_NAME_TRIES);
	return err;
}

int kvfs_gpu_shm_init_owners(const char *name, uint64_t capacity,
			     unsigned flags, const struct kvfs_gpu_owners *o,
			     struct kvfs_tier **out)
{
	struct shm_tier *s;
	int err;

	if (flags & ~(unsigned)KVFS_GPU_PRIVATE) {
		kvfs_err("shm: unknown flags %#x", flags);
		return -EINVAL;
	}
	err = kvfs_gpu_name_check(name, KVFS_CTL_NAME_MAX, "shm", "pool");
	if (!err)
		err = kvfs_gpu_owners_check(o, "shm");
	if (err)
		return err;
	/* A pool is whole allocation units; a remainder could never be used. */
	capacity -= capacity % KVFS_GPU_ALIGN;
	if (!capacity || capacity > SIZE_MAX ||
	    capacity > (uint64_t)INT64_MAX) {
		kvfs_err("shm: pool capacity must be between %u bytes and "
			 "the address space", KVFS_GPU_ALIGN);
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->g.pools = &s->pools;
	shm_pools_reset(s);
	err = shm_pools_create(s, name, flags, o, capacity);
	if (err) {
		free(s);
		return err;
	}
	s->pools.n = o->n;
	s->g.base.ops = &kvfs_gpu_shm_tier_ops;
	s->g.base.id = KVFS_TIER_GPU;
	s->g.base.capacity = capacity;
	s->g.base.align = KVFS_GPU_ALIGN;
	s->g.gops = &shm_gpu_ops;
	*out = &s->g.base;
	return 0;
}

int kvfs_gpu_shm_init(const char *name, uint64_t capacity, unsigned flags,
		      struct kvfs_tier **out)
{
	uint32_t me = (uint32_t)getuid();
	struct kvfs_gpu_owners o = { .uid = &me, .n = 1 };

	return kvfs_gpu_shm_init_owners(name, capacity, flags, &o, out);
}

/* "<pid>-pool..." after the prefix: the pid, or 0 for another name. */
static long sweep_pid(const char *rest)
{
	char *end;
	long pid;

	if (*rest < '1' || *rest > '9')
		return 0;
	pid = strtol(rest, &end, 10);
	return pid > 0 && !strncmp(end, "-pool", 5) ? pid : 0;
}

/* A pool of a dead daemon: removed, and said so. */
static bool sweep_remove(const char *path, long pid, void *arg)
{
	(void)arg;
	if (shm_unlink(path)) {
		kvfs_warn("shm: remove %s, left by daemon %ld, which is gone: "
			  "%s", path, pid, strerror(errno));
		return false;
	}
	kvfs_info("shm: removed %s, left by daemon %ld, which is gone", path,
		  pid);
	return true;
}

int kvfs_gpu_shm_sweep(const char *prefix)
{
	if (!prefix || prefix[0] != '/' || !prefix[1])
		return -EINVAL;
	return kvfs_util_shm_orphans(prefix + 1, sweep_pid, sweep_remove,
				     NULL);
}
