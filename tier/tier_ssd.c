/* SPDX-License-Identifier: MIT */
/*
 * SSD tier: extents of one preallocated data file, moved with io_uring and
 * O_DIRECT so the page cache never holds a second copy of what the DRAM tier
 * already caches.
 *
 * Several rings let independent submitters proceed in parallel without a
 * global lock on the I/O path: a thread tries the rings round-robin from its
 * own starting index and only blocks when every ring is busy.  A ring is
 * held for the whole of one call, so one readv() batch is one set of
 * submissions on one ring.
 *
 * KVFS_SSD_MEMORY swaps the file for an anonymous mapping with memcpy I/O
 * and identical allocation and alignment rules, so cache tests behave as
 * they would on a disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <liburing.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tier/extent.h"
#include "tier/tier.h"
#include "meta/guard.h"
#include "meta/log.h"
#include "meta/util.h"

#define SSD_ALIGN 4096u
/* In-flight requests per ring; a larger readv() batch streams through. */
#define SSD_RING_DEPTH 256u
#define SSD_MAX_RINGS 64u
/* The SQE length is 32 bits: longer transfers continue like short ones. */
#define SSD_MAX_IO (1u << 30)
/* -EAGAIN completions retried per request before giving up with -EIO. */
#define SSD_MAX_AGAIN 64u

struct ssd_ring {
	pthread_mutex_t lock;
	struct io_uring ring; /* guarded by lock */
	bool dead;            /* guarded by lock: io_uring_enter failed hard */
};

struct kvfs_tier_ssd {
	struct kvfs_tier base;
	unsigned flags;         /* enum kvfs_ssd_flags; immutable */
	int fd;                 /* -1 with KVFS_SSD_MEMORY; immutable */
	unsigned char *mem;     /* KVFS_SSD_MEMORY: @size bytes; immutable */
	uint64_t data_off;      /* immutable */
	uint64_t size;          /* immutable */
	struct kvfs_tier_pool pool;  /* the data file's extents */
	unsigned nrings;        /* immutable */
	struct ssd_ring *rings; /* array immutable; each ring has its lock */
};

/* One transfer in progress. */
struct ssd_req {
	uint64_t pos;       /* file offset of the next byte */
	unsigned char *buf; /* next byte of the caller's buffer */
	struct iovec *iov;  /* vectored: what is left of a copy of the
			     * caller's iovecs (NULL: @buf) */
	unsigned iovcnt;
	uint64_t left;      /* bytes still to transfer */
	size_t io;          /* index of the caller's kvfs_tier_io */
	long next;          /* link in the list of requests to resubmit */
	int res;            /* 0 or -errno once done */
	unsigned again;     /* -EAGAIN completions so far */
	bool write;
	bool refused;       /* readv: its ->issue kept it off the disk */
};

/* Each thread starts its search for a free ring at its own index. */
static _Thread_local unsigned ssd_ring_hint;
static _Thread_local bool ssd_ring_hint_set;
static atomic_uint ssd_ring_hint_next;

static struct kvfs_tier_ssd *to_ssd(struct kvfs_tier *t)
{
	return (struct kvfs_tier_ssd *)t;
}

static struct ssd_ring *ssd_ring_get(struct kvfs_tier_ssd *s)
{
	unsigned start;

	if (!ssd_ring_hint_set) {
		ssd_ring_hint = atomic_fetch_add(&ssd_ring_hint_next, 1);
		ssd_ring_hint_set = true;
	}
	start = ssd_ring_hint % s->nrings;
	for (unsigned i = 0; i < s->nrings; i++) {
		struct ssd_ring *r = &s->rings[(start + i) % s->nrings];

		if (!pthread_mutex_trylock(&r->lock))
			return r;
	}
	pthread_mutex_lock(&s->rings[start].lock);
	return &s->rings[start];
}

static void ssd_ring_put(struct ssd_ring *r)
{
	pthread_mutex_unlock(&r->lock);
}

static void ssd_prep(struct kvfs_tier_ssd *s, struct io_uring_sqe *sqe,
		     struct ssd_req *q, size_t i)
{
	unsigned len = q->left > SSD_MAX_IO ? SSD_MAX_IO : (unsigned)q->left;

	if (q->iov)
		io_uring_prep_readv(sqe, s->fd, q->iov, q->iovcnt, q->pos);
	else if (q->write)
		io_uring_prep_write(sqe, s->fd, q->buf, len, q->pos);
	else
		io_uring_prep_read(sqe, s->fd, q->buf, len, q->pos);
	io_uring_sqe_set_data64(sqe, i);
}

/* Account one completion of @q; true when @q must be submitted again. */
static bool ssd_complete(struct ssd_req *q, int res)
{
	const char *what = q->write ? "write" : "read";

	if (res == -EAGAIN || res == -EINTR) {
		if (++q->again <= SSD_MAX_AGAIN)
			return true;
		res = -EIO;
	}
	if (res < 0) {
		kvfs_err("ssd: %s at %" PRIu64 " (%" PRIu64 " bytes left): %s",
			 what, q->pos, q->left, strerror(-res));
		q->res = res;
		return false;
	}
	if (res == 0) {
		kvfs_err("ssd: %s at %" PRIu64 " transferred nothing "
			 "(%" PRIu64 " bytes left): past the end of the file?",
			 what, q->pos, q->left);
		q->res = -EIO;
		return false;
	}
	if ((uint64_t)res > q->left)
		res = (int)q->left;
	q->pos += (uint64_t)res;
	q->buf += res;
	q->left -= (uint64_t)res;
	for (size_t done = (size_t)res; q->iov && done;) {
		size_t k = done < q->iov->iov_len ? done : q->iov->iov_len;

		q->iov->iov_base = (char *)q->iov->iov_base + k;
		q->iov->iov_len -= k;
		done -= k;
		if (!q->iov->iov_len && q->iovcnt > 1) {
			q->iov++;
			q->iovcnt--;
		}
	}
	if (q->left)
		return true; /* short transfer: continue with the rest */
	q->res = 0;
	return false;
}

static void ssd_finish(struct ssd_req *q, struct kvfs_tier_io *io)
{
	if (!io)
		return;
	io[q->io].res = q->res;
	kvfs_tier_io_done(&io[q->io]);
}

/* Whether @q may be issued now, with @inflight requests of its batch on
 * the disk: its range's depth, else the ring's.
 */
static bool ssd_room(const struct ssd_req *q, const struct kvfs_tier_io *io,
		     unsigned inflight)
{
	unsigned d = io ? io[q->io].depth : 0;

	if (!d || d > SSD_RING_DEPTH)
		d = SSD_RING_DEPTH;
	return inflight < d;
}

/*
 * @q is about to be issued: its range's ->issue has the last word. True
 * when it refused, and @q is then finished (its result and done).
 */
static bool ssd_refused(struct ssd_req *q, struct kvfs_tier_io *io)
{
	struct kvfs_tier_io *x;
	int rc;

	if (!io || !io[q->io].issue)
		return false;
	x = &io[q->io];
	rc = x->issue(x, x->arg);
	if (!rc)
		return false;
	q->res = rc < 0 ? rc : -ECANCELED;
	q->refused = true;
	ssd_finish(q, io);
	return true;
}

/*
 * Run @n requests on @r, which the caller holds, at most SSD_RING_DEPTH in
 * flight (fewer where a range's depth says so), issued in order and
 * refilled as they complete; wait for every one of them. Short transfers
 * are resubmitted in place.
 */
static void ssd_run(struct kvfs_tier_ssd *s, struct ssd_ring *r,
		    struct ssd_req *q, size_t n, struct kvfs_tier_io *io)
{
	struct io_uring_cqe *cqe;
	size_t next = 0;   /* first request never submitted */
	long retry = -1;   /* list of requests to continue */
	unsigned inflight = 0;
	size_t i;
	int ret;

	if (r->dead)
		goto out_fail;
	while (next < n || retry >= 0 || inflight) {
		/*
		 * A free entry is made sure of before ->issue is asked: a
		 * range it lets go is issued at once. A retry continues a
		 * range already in flight and is not asked again.
		 */
		while (inflight < SSD_RING_DEPTH && (retry >= 0 || next < n) &&
		       io_uring_sq_space_left(&r->ring)) {
			struct io_uring_sqe *sqe;

			if (retry >= 0) {
				i = (size_t)retry;
				retry = q[i].next;
			} else {
				if (!ssd_room(&q[next], io, inflight))
					break;
				i = next++;
				if (ssd_refused(&q[i], io))
					continue;
			}
			sqe = io_uring_get_sqe(&r->ring);
			ssd_prep(s, sqe, &q[i], i);
			inflight++;
		}
		/* Every range left was refused: nothing to wait for. */
		if (!inflight)
			break;
		/*
		 * Prepared entries the kernel did not take stay queued and go
		 * with the next call, so a transient failure only loops.
		 */
		ret = io_uring_submit_and_wait(&r->ring, 1);
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN &&
		    ret != -EBUSY) {
			kvfs_err("ssd: io_uring_enter: %s; ring disabled",
				 strerror(-ret));
			r->dead = true;
			goto out_fail;
		}
		while (!io_uring_peek_cqe(&r->ring, &cqe)) {
			i = (size_t)io_uring_cqe_get_data64(cqe);
			ret = cqe->res;
			io_uring_cqe_seen(&r->ring, cqe);
			inflight--;
			if (i >= n)
				continue;
			if (ssd_complete(&q[i], ret)) {
				q[i].next = retry;
				retry = (long)i;
			} else {
				ssd_finish(&q[i], io);
			}
		}
	}
	return;

out_fail:
	for (i = 0; i < n; i++)
		if (q[i].res > 0) {
			q[i].res = -EIO;
			ssd_finish(&q[i], io);
		}
}

/*
 * A read may land in memory a client owns (chunk reads straight into its
 * shm): guarded like the kernel's own copy would be, which fails with
 * EFAULT rather than a signal.
 */
static void ssd_copy_mem(struct kvfs_tier_ssd *s, struct ssd_req *q)
{
	uint64_t at = q->pos;

	if (q->write)
		memcpy(s->mem + q->pos, q->buf, q->left);
	else if (!q->iov && kvfs_guard_memcpy(q->buf, s->mem + q->pos,
					      q->left))
		q->res = -EFAULT;
	for (unsigned k = 0; q->iov && k < q->iovcnt; k++) {
		if (kvfs_guard_memcpy(q->iov[k].iov_base, s->mem + at,
				      q->iov[k].iov_len)) {
			q->res = -EFAULT;
			break;
		}
		at += q->iov[k].iov_len;
	}
	if (q->res > 0)
		q->res = 0;
}

/*
 * The memory form runs a batch as the ring would: ranges are issued in
 * order up to the same depth, and the oldest one in flight completes (is
 * copied, then done) before the next is issued, so a caller sees the
 * same order of ->issue and ->done calls, and the same ranges still
 * unissued when it cancels, as on a disk.
 */
static void ssd_run_mem(struct kvfs_tier_ssd *s, struct ssd_req *q, size_t n,
			struct kvfs_tier_io *io)
{
	size_t head = 0, next = 0; /* oldest in flight; first not issued */
	unsigned inflight = 0;

	while (head < n) {
		while (next < n && ssd_room(&q[next], io, inflight)) {
			if (!ssd_refused(&q[next], io))
				inflight++;
			next++;
		}
		while (head < next && q[head].refused)
			head++;
		if (head == next)
			continue;
		ssd_copy_mem(s, &q[head]);
		ssd_finish(&q[head], io);
		inflight--;
		head++;
	}
}

/* Check one transfer against @e, the tier and O_DIRECT's alignment. */
static int ssd_check(struct kvfs_tier_ssd *s, const char *what,
		     const struct kvfs_extent *e, uint64_t off,
		     const void *buf, uint64_t len)
{
	if (!e) {
		kvfs_err("ssd: %s with no extent", what);
		return -EINVAL;
	}
	if ((off | len | (uintptr_t)buf | e->off | e->len) & (SSD_ALIGN - 1)) {
		kvfs_err("ssd: %s of [%" PRIu64 ", +%" PRIu64 ") in extent %"
			 PRIu64 "+%" PRIu64 " to %p is not %u-aligned",
			 what, off, len, e->off, e->len, buf, SSD_ALIGN);
		return -EINVAL;
	}
	if (!kvfs_tier_in_extent(e, off, len) || e->off < s->data_off ||
	    e->len > s->size || e->off > s->size - e->len || (len && !buf)) {
		kvfs_err("ssd: %s of [%" PRIu64 ", +%" PRIu64 ") in extent %"
			 PRIu64 "+%" PRIu64 " is out of range",
			 what, off, len, e->off, e->len);
		return -EINVAL;
	}
	return 0;
}

/* A vectored range: @len is the sum of its iovecs, each 4 KiB-aligned. */
static int ssd_check_iov(struct kvfs_tier_ssd *s, const struct kvfs_tier_io *io)
{
	uint64_t sum = 0;

	if (!io->iovcnt || io->iovcnt > IOV_MAX) {
		kvfs_err("ssd: readv of %u iovecs (1 to %d)", io->iovcnt,
			 IOV_MAX);
		return -EINVAL;
	}
	for (unsigned k = 0; k < io->iovcnt; k++) {
		int err = ssd_check(s, "readv", io->ext, io->off + sum,
				    io->iov[k].iov_base, io->iov[k].iov_len);

		if (err)
			return err;
		sum += io->iov[k].iov_len;
	}
	if (sum != io->len) {
		kvfs_err("ssd: readv iovecs hold %" PRIu64 " bytes, the range "
			 "%" PRIu64, sum, io->len);
		return -EINVAL;
	}
	return 0;
}

static void ssd_req_init(struct ssd_req *q, const struct kvfs_extent *e,
			 uint64_t off, void *buf, uint64_t len, bool write,
			 size_t io)
{
	q->pos = e->off + off;
	q->buf = buf;
	q->iov = NULL;
	q->iovcnt = 0;
	q->left = len;
	q->io = io;
	q->next = -1;
	q->res = 1;
	q->again = 0;
	q->write = write;
	q->refused = false;
}

/*
 * Run @n requests on a ring already held, or in memory.
 * With @io (readv), each request's range gets its result and its done
 * callback as soon as it finishes.
 */
static void ssd_submit(struct kvfs_tier_ssd *s, struct ssd_ring *r,
		       struct ssd_req *q, size_t n, struct kvfs_tier_io *io)
{
	if (s->mem)
		ssd_run_mem(s, q, n, io);
	else
		ssd_run(s, r, q, n, io);
}

static int ssd_rw(struct kvfs_tier *t, const struct kvfs_extent *e,
		  uint64_t off, void *buf, uint64_t len, bool write)
{
	struct kvfs_tier_ssd *s = to_ssd(t);
	struct ssd_ring *r = NULL;
	struct ssd_req q;
	int err;

	err = ssd_check(s, write ? "write" : "read", e, off, buf, len);
	if (err || !len)
		return err;
	ssd_req_init(&q, e, off, buf, len, write, 0);
	if (!s->mem)
		r = ssd_ring_get(s);
	ssd_submit(s, r, &q, 1, NULL);
	if (r)
		ssd_ring_put(r);
	if (write)
		kvfs_tier_count(&t->st.writes, &t->st.bytes_written, 1,
				q.res ? 0 : len);
	else
		kvfs_tier_count(&t->st.reads, &t->st.bytes_read, 1,
				q.res ? 0 : len);
	return q.res;
}

static int ssd_write(struct kvfs_tier *t, const struct kvfs_extent *e,
		     uint64_t off, const void *buf, uint64_t len)
{
	/* The buffer is only read from; the cast serves the shared path. */
	return ssd_rw(t, e, off, (void *)buf, len, true);
}

static int ssd_read(struct kvfs_tier *t, const struct kvfs_extent *e,
		    uint64_t off, void *buf, uint64_t len)
{
	return ssd_rw(t, e, off, buf, len, false);
}

/* Finish a window of readv requests: counters of those issued. */
static void ssd_readv_done(struct kvfs_tier *t, struct kvfs_tier_io *io,
			   const struct ssd_req *q, size_t n)
{
	uint64_t bytes = 0, ops = 0;

	for (size_t j = 0; j < n; j++) {
		if (q[j].refused)
			continue;
		ops++;
		if (!q[j].res)
			bytes += io[q[j].io].len;
	}
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, ops, bytes);
}

static int ssd_readv(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n)
{
	struct kvfs_tier_ssd *s = to_ssd(t);
	struct ssd_req stack_q[SSD_RING_DEPTH], *q = stack_q;
	struct ssd_ring *r = NULL;
	struct iovec *iov = NULL;
	size_t nq = 0, win = SSD_RING_DEPTH, niov = 0;
	int first = 0;

	if (n && !io) {
		kvfs_err("ssd: readv of %zu ranges with no array", n);
		return -EINVAL;
	}
	/*
	 * A large batch runs as one stream: the ring is refilled as reads
	 * complete, so the disk never drains between windows. Without the
	 * memory for that, it runs in windows of the ring's depth.
	 */
	if (n > SSD_RING_DEPTH) {
		q = malloc(n * sizeof(*q));
		if (q)
			win = n;
		else
			q = stack_q;
	}
	/* Vectored reads advance through copies of their iovecs. */
	for (size_t i = 0; i < n; i++)
		niov += io[i].iov ? io[i].iovcnt : 0;
	if (niov && !(iov = malloc(niov * sizeof(*iov)))) {
		if (q != stack_q)
			free(q);
		for (size_t i = 0; i < n; i++) {
			io[i].res = -ENOMEM;
			kvfs_tier_io_done(&io[i]);
		}
		return -ENOMEM;
	}
	niov = 0;
	for (size_t i = 0; i < n; i++) {
		io[i].res = io[i].iov ? ssd_check_iov(s, &io[i])
				      : ssd_check(s, "readv", io[i].ext,
						  io[i].off, io[i].buf,
						  io[i].len);
		if (io[i].res || !io[i].len) {
			kvfs_tier_io_done(&io[i]);
			continue;
		}
		ssd_req_init(&q[nq], io[i].ext, io[i].off, io[i].buf,
			     io[i].len, false, i);
		if (io[i].iov) {
			q[nq].iov = iov + niov;
			q[nq].iovcnt = io[i].iovcnt;
			memcpy(iov + niov, io[i].iov,
			       io[i].iovcnt * sizeof(*iov));
			niov += io[i].iovcnt;
		}
		nq++;
		if (nq < win)
			continue;
		if (!s->mem && !r)
			r = ssd_ring_get(s);
		ssd_submit(s, r, q, nq, io);
		ssd_readv_done(t, io, q, nq);
		nq = 0;
	}
	if (nq) {
		if (!s->mem && !r)
			r = ssd_ring_get(s);
		ssd_submit(s, r, q, nq, io);
		ssd_readv_done(t, io, q, nq);
	}
	if (r)
		ssd_ring_put(r);
	if (q != stack_q)
		free(q);
	free(iov);
	for (size_t i = 0; i < n && !first; i++)
		first = io[i].res;
	return first;
}

static int ssd_sync(struct kvfs_tier *t)
{
	struct kvfs_tier_ssd *s = to_ssd(t);

	if (s->mem || (s->flags & KVFS_SSD_NOSYNC))
		return 0;
	if (fdatasync(s->fd)) {
		int err = -errno;

		kvfs_err("ssd: fdatasync: %s", strerror(-err));
		return err;
	}
	return 0;
}

static int ssd_alloc(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e)
{
	return kvfs_tier_pool_alloc(t, &to_ssd(t)->pool, "ssd", len, e);
}

static void ssd_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	kvfs_tier_pool_free(t, &to_ssd(t)->pool, e);
}

static int ssd_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return kvfs_tier_pool_claim(t, &to_ssd(t)->pool, e);
}

static void *ssd_map(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	/* Even over memory: callers must take the same path as on a disk. */
	return NULL;
}

static void ssd_rings_exit(struct kvfs_tier_ssd *s, unsigned n)
{
	while (n--) {
		io_uring_queue_exit(&s->rings[n].ring);
		pthread_mutex_destroy(&s->rings[n].lock);
	}
	free(s->rings);
	s->rings = NULL;
}

static void ssd_release(struct kvfs_tier *t)
{
	struct kvfs_tier_ssd *s = to_ssd(t);

	if (s->rings)
		ssd_rings_exit(s, s->nrings);
	if (s->fd >= 0)
		close(s->fd);
	if (s->mem)
		munmap(s->mem, (size_t)s->size);
	kvfs_tier_pool_release(&s->pool);
	free(s);
}

static const struct kvfs_tier_ops ssd_ops = {
	.name = "ssd",
	.alloc = ssd_alloc,
	.free = ssd_free,
	.claim = ssd_claim,
	.write = ssd_write,
	.read = ssd_read,
	.readv = ssd_readv,
	.sync = ssd_sync,
	.map = ssd_map,
	.release = ssd_release,
};

/* The size of the open data file or block device. */
static int ssd_file_size(const char *path, int fd, uint64_t *out)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	if (S_ISREG(st.st_mode)) {
		*out = (uint64_t)st.st_size;
		return 0;
	}
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, out))
			return -errno;
		return 0;
	}
	kvfs_err("ssd: %s is neither a regular file nor a block device", path);
	return -EINVAL;
}

static int ssd_open(struct kvfs_tier_ssd *s, const char *path)
{
	uint64_t have;
	int err;

	s->fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
	if (s->fd < 0) {
		err = -errno;
		if (err == -EINVAL)
			kvfs_err("ssd: %s: the filesystem refuses O_DIRECT",
				 path);
		else
			kvfs_err("ssd: cannot open %s: %s", path,
				 strerror(-err));
		return err;
	}
	err = ssd_file_size(path, s->fd, &have);
	if (err)
		goto out_close_fd;
	if (have < s->size) {
		kvfs_err("ssd: %s holds %" PRIu64 " bytes, expected %" PRIu64,
			 path, have, s->size);
		err = -EINVAL;
		goto out_close_fd;
	}
	s->rings = calloc(s->nrings, sizeof(*s->rings));
	if (!s->rings) {
		err = -ENOMEM;
		goto out_close_fd;
	}
	for (unsigned i = 0; i < s->nrings; i++) {
		err = io_uring_queue_init(SSD_RING_DEPTH, &s->rings[i].ring, 0);
		if (err) {
			kvfs_err("ssd: io_uring_queue_init: %s",
				 strerror(-err));
			ssd_rings_exit(s, i);
			goto out_close_fd;
		}
		pthread_mutex_init(&s->rings[i].lock, NULL);
	}
	return 0;

out_close_fd:
	close(s->fd);
	s->fd = -1;
	return err;
}

int kvfs_tier_ssd_init(const char *path, uint64_t data_off, uint64_t size,
		       unsigned nrings, unsigned flags, struct kvfs_tier **out)
{
	struct kvfs_tier_ssd *s;
	int err;

	if (flags & ~(unsigned)(KVFS_SSD_MEMORY | KVFS_SSD_NOSYNC) ||
	    !nrings || nrings > SSD_MAX_RINGS ||
	    (!path && !(flags & KVFS_SSD_MEMORY))) {
		kvfs_err("ssd: bad arguments (flags %#x, %u rings, path %s)",
			 flags, nrings, path ? path : "none");
		return -EINVAL;
	}
	if ((data_off | size) & (SSD_ALIGN - 1) || data_off >= size ||
	    size > SIZE_MAX) {
		kvfs_err("ssd: data range [%" PRIu64 ", %" PRIu64
			 ") is empty or not %u-aligned", data_off, size,
			 SSD_ALIGN);
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->fd = -1;
	s->flags = flags;
	s->data_off = data_off;
	s->size = size;
	s->nrings = nrings;
	err = kvfs_tier_pool_init(&s->pool, data_off, size - data_off,
				  SSD_ALIGN);
	if (err)
		goto out_free;
	if (flags & KVFS_SSD_MEMORY) {
		void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);

		if (p == MAP_FAILED) {
			err = -errno;
			kvfs_err("ssd: cannot map %" PRIu64 " bytes: %s", size,
				 strerror(-err));
			goto out_release_map;
		}
		s->mem = p;
	} else {
		err = ssd_open(s, path);
		if (err)
			goto out_release_map;
	}
	s->base.ops = &ssd_ops;
	s->base.id = KVFS_TIER_SSD;
	s->base.capacity = size - data_off;
	s->base.align = SSD_ALIGN;
	*out = &s->base;
	return 0;

out_release_map:
	kvfs_tier_pool_release(&s->pool);
out_free:
	free(s);
	return err;
}
