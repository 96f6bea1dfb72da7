/* SPDX-License-Identifier: MIT */
/*
 * libkvfs: shared memory an engine hands the daemon (client/libkvfs.h).
 * A peer is memory the daemon copies blocks into (FETCH_INTO); a sync
 * word is the counter the daemon raises layer by layer and wakes with a
 * shared futex.  Both are POSIX shm objects the daemon opens by name, so
 * their names are fresh and exclusive, and they are unlinked on release.
 *
 * A process that dies without releasing them (killed, crashed) would
 * leave them in /dev/shm, memory nobody frees, as large as the engine's
 * buffers.  So each object is write-locked (an open file description
 * lock) by its creator for as long as it holds it, and every creation
 * first removes the objects of this kind whose lock anyone may take and
 * whose creator, named in the object's name, is gone.  The lock is what
 * says a holder is alive across PID namespaces; the PID check keeps an
 * object of an older libkvfs, which took no lock, while its process
 * lives.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client/libkvfs.h"
#include "meta/log.h"
#include "meta/util.h"

#define SYNC_MAP_LEN 4096u
#define SHM_TRIES 64

static atomic_uint shm_seq;

/* A caller's mistake: logged, and -EINVAL. */
static int bad(const char *what)
{
	kvfs_warn("libkvfs: %s", what);
	return -EINVAL;
}

/* Write-lock the whole of @fd's object, without waiting (an OFD lock:
 * held by this open file description until it is closed, whichever
 * thread or process closes it last).  0 or -errno (-EAGAIN: held).
 */
static int shm_lock(int fd)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };

	return fcntl(fd, F_OFD_SETLK, &fl) ? -errno : 0;
}

/* "<pid>-<seq>" after "kvfs-<what>-": the pid, or 0 for another name. */
static long shm_owner(const char *rest)
{
	char *end;
	long pid;

	if (*rest < '1' || *rest > '9')
		return 0;
	pid = strtol(rest, &end, 10);
	if (pid <= 0 || *end != '-' || end[1] < '0' || end[1] > '9')
		return 0;
	/* the sequence number, digits to the end */
	end += strspn(end + 1, "0123456789") + 1;
	return *end ? 0 : pid;
}

/* An orphan of a dead creator, unless its lock is held (its creator
 * lives in another PID namespace): removed, and said so.
 */
static bool shm_remove(const char *path, long pid, void *arg)
{
	bool gone = false;
	int fd;

	(void)arg;
	fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0)
		return false; /* another user's, or removed meanwhile */
	if (!shm_lock(fd) && !shm_unlink(path)) {
		kvfs_info("libkvfs: removed %s, left by process %ld, which is "
			  "gone", path, pid);
		gone = true;
	}
	close(fd);
	return gone;
}

int kvfs_client_shm_sweep(const char *what)
{
	char prefix[32];

	if ((size_t)snprintf(prefix, sizeof(prefix), "kvfs-%s-", what) >=
	    sizeof(prefix))
		return -EINVAL;
	return kvfs_util_shm_orphans(prefix, shm_owner, shm_remove, NULL);
}

/* Create a fresh shm object "/kvfs-<what>-<pid>-<seq>" of @size bytes and
 * map it shared, read-write: its name in @name, the descriptor in *@fd_out
 * and the mapping in *@base.  0, or -errno (logged) with nothing left
 * behind: the descriptor closed and the object unlinked.
 */
static int shm_create(const char *what, uint64_t size,
		      char name[KVFS_CTL_NAME_MAX], int *fd_out, void **base)
{
	const char *step = "size";
	int fd = -1, rc;
	void *m;

	(void)kvfs_client_shm_sweep(what);
	for (int i = 0; i < SHM_TRIES && fd < 0; i++) {
		snprintf(name, KVFS_CTL_NAME_MAX, "/kvfs-%s-%ld-%u", what,
			 (long)getpid(), atomic_fetch_add(&shm_seq, 1));
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
			      0600);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		rc = -errno;
		kvfs_err("libkvfs: create shm %s: %s", name, strerror(errno));
		return rc;
	}
	/* Without the lock (a kernel without OFD locks) the object is still
	 * safe from sweeps while this process lives, by its pid.
	 */
	(void)shm_lock(fd);
	if (ftruncate(fd, (off_t)size))
		goto out_unlink;
	step = "map";
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		goto out_unlink;
	*fd_out = fd;
	*base = m;
	return 0;
out_unlink:
	rc = -errno;
	kvfs_err("libkvfs: %s shm %s (%" PRIu64 " bytes): %s", step, name, size,
		 strerror(errno));
	close(fd);
	shm_unlink(name);
	return rc;
}

int kvfs_client_peer_init(struct kvfs_client_peer *p, uint64_t size)
{
	void *base;
	int rc;

	if (!p || !size || size > (uint64_t)SIZE_MAX)
		return bad("peer_init: NULL peer or size");
	memset(p, 0, sizeof(*p));
	p->fd = -1;
	rc = shm_create("peer", size, p->mem.shm_name, &p->fd, &base);
	if (rc)
		return rc;
	p->base = base;
	p->mem.backend = KVFS_CTL_BACKEND_SHM;
	p->mem.size = size;
	return 0;
}

void kvfs_client_peer_release(struct kvfs_client_peer *p)
{
	if (!p)
		return;
	if (p->base)
		munmap(p->base, p->mem.size);
	if (p->base && p->fd >= 0) {
		close(p->fd);
		shm_unlink(p->mem.shm_name);
	}
	memset(p, 0, sizeof(*p));
	p->fd = -1;
}

int kvfs_client_sync_init(struct kvfs_client_sync *s)
{
	void *base;
	int rc;

	if (!s)
		return bad("sync_init: NULL");
	memset(s, 0, sizeof(*s));
	s->fd = -1;
	rc = shm_create("sync", SYNC_MAP_LEN, s->desc.shm_name, &s->fd, &base);
	if (rc)
		return rc;
	s->word = base;
	s->desc.off = 0;
	return 0;
}

void kvfs_client_sync_release(struct kvfs_client_sync *s)
{
	if (!s)
		return;
	if (s->word) {
		munmap(s->word, SYNC_MAP_LEN);
		if (s->fd >= 0) {
			close(s->fd);
			shm_unlink(s->desc.shm_name);
		}
	}
	memset(s, 0, sizeof(*s));
	s->fd = -1;
}

void kvfs_client_sync_reset(struct kvfs_client_sync *s)
{
	if (s && s->word)
		atomic_store_explicit((_Atomic uint32_t *)s->word, 0,
				      memory_order_release);
}

uint32_t kvfs_client_sync_load(const struct kvfs_client_sync *s)
{
	if (!s || !s->word)
		return 0;
	return atomic_load_explicit((_Atomic uint32_t *)s->word,
				    memory_order_acquire);
}

int kvfs_client_wait_layer(const struct kvfs_client_sync *s, uint32_t layer,
			   int64_t timeout_ns)
{
	uint64_t end = 0, now;
	struct timespec ts, *tp;
	uint32_t v;

	if (!s || !s->word)
		return bad("wait_layer: sync word not initialised");
	if (timeout_ns >= 0)
		end = kvfs_util_now_mono() + (uint64_t)timeout_ns;
	for (;;) {
		v = kvfs_client_sync_load(s);
		if (v & KVFS_CTL_SYNC_FAILED)
			return layer < (v & ~KVFS_CTL_SYNC_FAILED) ? 0 : -EIO;
		if (v > layer)
			return 0;
		tp = NULL;
		if (timeout_ns >= 0) {
			now = kvfs_util_now_mono();
			if (now >= end)
				return -ETIMEDOUT;
			ts.tv_sec = (time_t)((end - now) / 1000000000ull);
			ts.tv_nsec = (long)((end - now) % 1000000000ull);
			tp = &ts;
		}
		/* shared futex: the daemon wakes it from another process */
		if (syscall(SYS_futex, s->word, FUTEX_WAIT, v, tp, NULL, 0) &&
		    errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT)
			return -errno;
	}
}
