/* SPDX-License-Identifier: MIT */
/*
 * The shm device tier: one POSIX shared-memory object stands in for device
 * memory.  Clients map it read-only by its name, exactly as they would
 * open a cudaIpcMemHandle, and their own memory ("peers") is another shm
 * object each.  Every copy is a memcpy, so this backend is the reference
 * the cuda backend's tests are held to.
 *
 * The object is fully allocated at init (posix_fallocate) so that running
 * out of /dev/shm is an init error rather than a SIGBUS on some later
 * copy.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

/* Names tried for a KVFS_GPU_PRIVATE pool before giving up. */
#define SHM_NAME_TRIES 64

struct shm_tier {
	struct kvfs_gpu_tier g;
	char name[KVFS_CTL_NAME_MAX]; /* immutable */
	unsigned char *mem;           /* capacity bytes; immutable */
	dev_t dev;                    /* the object's identity; immutable */
	ino_t ino;
	struct kvfs_tier_pool pool;    /* has its own lock */
};

static atomic_uint shm_seq;

static struct shm_tier *to_shm(struct kvfs_tier *t)
{
	return (struct shm_tier *)t;
}

static unsigned char *shm_at(struct kvfs_tier *t, const struct kvfs_extent *e,
			     uint64_t off)
{
	return to_shm(t)->mem + e->off + off;
}

static int shm_alloc(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e)
{
	int err = kvfs_tier_pool_alloc(t, &to_shm(t)->pool, "shm", len, e);

	if (!err)
		e->ptr = shm_at(t, e, 0);
	return err;
}

static void shm_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	kvfs_tier_pool_free(t, &to_shm(t)->pool, e);
}

static int shm_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return kvfs_tier_pool_claim(t, &to_shm(t)->pool, e);
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

static void shm_release(struct kvfs_tier *t)
{
	struct shm_tier *s = to_shm(t);

	munmap(s->mem, (size_t)t->capacity);
	if (shm_unlink(s->name) && errno != ENOENT)
		kvfs_warn("shm: unlink %s: %s", s->name, strerror(errno));
	kvfs_tier_pool_release(&s->pool);
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
	struct shm_tier *s = to_shm(t);

	memset(out, 0, sizeof(*out));
	out->backend = KVFS_CTL_BACKEND_SHM;
	out->size = t->capacity;
	memcpy(out->shm_name, s->name, sizeof(out->shm_name));
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
	if (sb.st_dev == s->dev && sb.st_ino == s->ino) {
		kvfs_err("shm: peer %s is this tier's own pool", m->shm_name);
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

int kvfs_gpu_shm_sweep(const char *prefix)
{
	const char *p = prefix[0] == '/' ? prefix + 1 : prefix;
	size_t len = strlen(p);
	struct dirent *de;
	int n = 0;
	DIR *d;

	d = opendir("/dev/shm");
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		char name[sizeof(de->d_name) + 1], *end;
		long pid;

		if (strncmp(de->d_name, p, len) || de->d_name[len] != '-')
			continue;
		errno = 0;
		pid = strtol(de->d_name + len + 1, &end, 10);
		if (errno || end == de->d_name + len + 1 || pid <= 0 ||
		    strcmp(end, "-pool") || pid == (long)getpid())
			continue;
		/* EPERM: alive, another user's; only ESRCH is dead. */
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(name, sizeof(name), "/%s", de->d_name);
		if (shm_unlink(name) == 0) {
			kvfs_info("shm: removed %s, the device pool of a dead "
				  "daemon (pid %ld) of this store",
				  name, pid);
			n++;
		}
	}
	closedir(d);
	return n;
}

/*
 * Create the object: @name itself, or with KVFS_GPU_PRIVATE @name plus a
 * suffix unique to this process and call. The name used goes to s->name.
 */
static int shm_create(struct shm_tier *s, const char *name, unsigned flags)
{
	for (unsigned try = 0; try < SHM_NAME_TRIES; try++) {
		int fd, n;

		if (flags & KVFS_GPU_PRIVATE)
			n = snprintf(s->name, sizeof(s->name), "%s-%ld-%u",
				     name, (long)getpid(),
				     atomic_fetch_add(&shm_seq, 1));
		else
			n = snprintf(s->name, sizeof(s->name), "%s", name);
		if (n < 0 || (size_t)n >= sizeof(s->name)) {
			kvfs_err("shm: pool name %s too long (at most %zu "
				 "bytes with its suffix)", name,
				 sizeof(s->name) - 1);
			return -EINVAL;
		}
		fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC,
			      0644);
		if (fd >= 0)
			return fd;
		if (errno == EEXIST && (flags & KVFS_GPU_PRIVATE))
			continue;
		n = errno;
		kvfs_err("shm: create %s: %s", s->name, strerror(n));
		return -n;
	}
	kvfs_err("shm: no free name for a private pool after %d tries",
		 SHM_NAME_TRIES);
	return -EEXIST;
}

int kvfs_gpu_shm_init(const char *name, uint64_t capacity, unsigned flags,
		      struct kvfs_tier **out)
{
	struct shm_tier *s;
	struct stat sb;
	void *mem;
	int fd, err;

	if (flags & ~(unsigned)KVFS_GPU_PRIVATE) {
		kvfs_err("shm: unknown flags %#x", flags);
		return -EINVAL;
	}
	err = kvfs_gpu_name_check(name, KVFS_CTL_NAME_MAX, "shm", "pool");
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
	fd = shm_create(s, name, flags);
	if (fd < 0) {
		err = fd;
		goto out_free;
	}
	/* The umask must not hide the pool from the clients that map it. */
	if (fchmod(fd, 0644) || ftruncate(fd, (off_t)capacity) ||
	    fstat(fd, &sb)) {
		err = -errno;
		kvfs_err("shm: size %s to %" PRIu64 " bytes: %s", s->name,
			 capacity, strerror(-err));
		goto out_unlink;
	}
	err = posix_fallocate(fd, 0, (off_t)capacity);
	if (err && err != EOPNOTSUPP && err != EINVAL) {
		kvfs_err("shm: reserve %" PRIu64 " bytes for %s: %s (is "
			 "/dev/shm large enough?)", capacity, s->name,
			 strerror(err));
		err = -err;
		goto out_unlink;
	}
	mem = mmap(NULL, (size_t)capacity, PROT_READ | PROT_WRITE, MAP_SHARED,
		   fd, 0);
	if (mem == MAP_FAILED) {
		err = -errno;
		kvfs_err("shm: mmap %s: %s", s->name, strerror(-err));
		goto out_unlink;
	}
	err = kvfs_tier_pool_init(&s->pool, 0, capacity, KVFS_GPU_ALIGN);
	if (err)
		goto out_unmap;
	close(fd);
	s->mem = mem;
	s->dev = sb.st_dev;
	s->ino = sb.st_ino;
	s->g.base.ops = &kvfs_gpu_shm_tier_ops;
	s->g.base.id = KVFS_TIER_GPU;
	s->g.base.capacity = capacity;
	s->g.base.align = KVFS_GPU_ALIGN;
	s->g.gops = &shm_gpu_ops;
	*out = &s->g.base;
	return 0;

out_unmap:
	munmap(mem, (size_t)capacity);
out_unlink:
	shm_unlink(s->name);
	close(fd);
out_free:
	free(s);
	return err;
}
