/* SPDX-License-Identifier: MIT */
/*
 * The .kvfs/ctl targets of the mount fuzzer: requests by ioctl, by write
 * then read, a mix of both on one descriptor, from two threads at once,
 * and the regressions found that way.  A transport's own rules (sizes,
 * command numbers, a response pending or not) are checked here; the
 * response itself by check_resp().
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/ioctl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/kvfs_ctl.h"
#include "fuzz_ctl_i.h"

/* ------------------------------------------------------------ buffers */

/* Kept from setup to teardown (fuzz_i.h says why). */
static uint8_t *rbuf; /* a response read back */
#define RBUF_SIZE (KVFS_CTL_MAX_SIZE + 8192)
static struct rq wq, wpend; /* a request; a pending one's copy */
static struct rq wk_q[2];
static uint8_t *wk_buf[2];

static struct rq new_rq(void)
{
	struct rq q;

	memset(&q, 0, sizeof(q));
	/* Page-aligned: the kernel splits a direct write whose buffer spans
	 * more pages than one FUSE request carries (see send_write()).
	 */
	q.b = aligned_alloc(4096, KVFS_CTL_MAX_SIZE + 8192);
	assert_non_null(q.b);
	memset(q.b, 0, KVFS_CTL_MAX_SIZE + 8192);
	return q;
}

void ctl_bufs_alloc(void)
{
	rbuf = malloc(RBUF_SIZE);
	assert_non_null(rbuf);
	wq = new_rq();
	wpend = new_rq();
	for (int i = 0; i < 2; i++) {
		wk_q[i] = new_rq();
		wk_buf[i] = malloc(16384);
		assert_non_null(wk_buf[i]);
	}
}

void ctl_bufs_free(void)
{
	for (int i = 0; i < 2; i++) {
		free(wk_q[i].b);
		free(wk_buf[i]);
	}
	free(wq.b);
	free(wpend.b);
	free(rbuf);
}

/* ---------------------------------------------------------- ctl: send */

static bool big_for_ioctl(const struct rq *q)
{
	const struct kvfs_ctl_req *h = (const void *)q->b;

	return !q->malformed && q->ns_ok &&
	       (q->op == KVFS_CTL_LOOKUP || q->op == KVFS_CTL_FETCH ||
		q->op == KVFS_CTL_FETCH_INTO) &&
	       !(h->flags & KVFS_CTL_F_TOKENS) && q->nk > IOC_MAX_BLOCKS;
}

/* ioctl with @cmd; @expect_valid_cmd: the command is KVFS_IOC(q->op). */
static void send_ioctl(int fd, const struct rq *q, unsigned long cmd,
		       struct rng *r)
{
	bool valid = false;
	size_t n = q->len < KVFS_CTL_MSG_SIZE ? q->len : KVFS_CTL_MSG_SIZE;
	int e;

	for (unsigned op = 1; op <= KVFS_CTL_OP_MAX; op++)
		if (cmd == KVFS_IOC(op))
			valid = true;
	/* Past the request: anything. */
	fill(r, iobuf, 16384);
	memcpy(iobuf, q->b, n);
	op_begin("ioctl %#lx op %u len %zu%s%s", cmd, q->op, q->len,
		 q->malformed ? " malformed: " : "", q->why);
	e = err_of(ioctl(fd, cmd, iobuf));
	op_end();
	if (!valid) {
		want(e, OKS(ENOTTY), "ioctl with a foreign command");
		return;
	}
	if (q->malformed || cmd != KVFS_IOC(q->op) ||
	    q->len > KVFS_CTL_MSG_SIZE) {
		want(e, OKS(EINVAL), "malformed ioctl request");
		return;
	}
	if (big_for_ioctl(q))
		want(e, OKS(E2BIG), "ioctl with a response too big for it");
	else
		want(e, OKS(0, ENOMEM), "well-formed ioctl request");
	if (!e)
		check_resp(q, iobuf, KVFS_CTL_MSG_SIZE, "ioctl");
}

/* The response pending on a descriptor (write-then-read). */
struct pend {
	bool any;   /* a response may be pending */
	bool sure;  /* ...and surely is */
	uint16_t op;
	struct rq q;  /* its request, for the checks */
};

static void send_write_done(const struct rq *q, struct pend *pd);

static void send_write(int fd, const struct rq *q, struct pend *pd)
{
	ssize_t n;
	int e;

	op_begin("write op %u len %zu%s%s", q->op, q->len,
		 q->malformed ? " malformed: " : "", q->why);
	n = write(fd, q->b, q->len);
	e = err_of(n);
	op_end();
	if (q->len > KVFS_CTL_MAX_SIZE) {
		/* Whatever it holds: the first FUSE write of it (all of it,
		 * or its first 1 MiB) is over the limit and refused whole.
		 */
		want(e, OKS(EMSGSIZE), "a write over KVFS_CTL_MAX_SIZE");
		pd->sure = false;
		return;
	}
	if (q->malformed) {
		want(e, OKS(EINVAL), "malformed request written");
		/* An earlier response may still be there, or not. */
		pd->sure = false;
		return;
	}
	want(e, OKS(0, ENOMEM), "well-formed request written");
	if (e)
		return;
	if ((size_t)n != q->len)
		fz_fail("write of %zu request bytes returned %zd", q->len, n);
	send_write_done(q, pd);
}

/* A request was taken whole: its response is pending. */
static void send_write_done(const struct rq *q, struct pend *pd)
{
	pd->any = pd->sure = true;
	pd->op = q->op;
	memcpy(pd->q.b, q->b, q->len);
	pd->q.len = q->len;
	pd->q.op = q->op;
	pd->q.malformed = false;
	pd->q.ns_ok = q->ns_ok;
	pd->q.nk = q->nk;
	pd->q.chain_seed = q->chain_seed;
	pd->q.mem = q->mem;
	pd->q.sync_ours = q->sync_ours;
	pd->q.sync_outside = q->sync_outside;
}

static void do_read(int fd, struct rng *r, struct pend *pd)
{
	static const size_t lens[] = {
		0, 1, RESP_HDR - 1, RESP_HDR, RESP_HDR + BLK_SIZE,
		4096, KVFS_CTL_MSG_SIZE, KVFS_CTL_MAX_SIZE,
	};
	size_t len = lens[below(r, sizeof(lens) / sizeof(lens[0]))];
	ssize_t n;
	int e;

	op_begin("read %zu", len);
	n = read(fd, rbuf, len);
	e = err_of(n);
	op_end();
	if (len == 0) {
		want(e, OKS(0), "read of 0 bytes");
		return;
	}
	if (!pd->any) {
		want(e, OKS(0), "read with no request written");
		if (n != 0)
			fz_fail("read with no request written returned %zd",
				n);
		return;
	}
	if (len < RESP_HDR) {
		/* Too small for any response: refused, kept. */
		if (pd->sure)
			want(e, OKS(EMSGSIZE), "read smaller than a response");
		else
			want(e, OKS(0, EMSGSIZE), "read smaller than a response");
		return;
	}
	want(e, len >= KVFS_CTL_MAX_SIZE ? OKS(0) : OKS(0, EMSGSIZE),
	     "read of a response");
	if (e)
		return;
	if (n == 0) {
		if (pd->sure)
			fz_fail("read %zu: nothing, but a response was due",
				len);
		pd->any = false;
		return;
	}
	check_resp(&pd->q, rbuf, (size_t)n, "write/read");
	if ((size_t)n != ((struct kvfs_ctl_resp *)rbuf)->size)
		fz_fail("read returned %zd bytes of a %u-byte response", n,
			((struct kvfs_ctl_resp *)rbuf)->size);
	pd->any = pd->sure = false;
}

static int ctl_open(void)
{
	int fd, e;

	op_begin("open %s", ctl_path);
	fd = open(ctl_path, O_RDWR | O_CLOEXEC);
	e = err_of(fd);
	op_end();
	want(e, OKS(0), "open .kvfs/ctl");
	return fd;
}

static void ctl_close(int fd)
{
	int e;

	op_begin("close ctl fd %d", fd);
	e = err_of(close(fd));
	op_end();
	want(e, OKS(0), "close .kvfs/ctl");
}

/*
 * SAVE requests whose response was never read (write-then-read, threads)
 * leave blocks nobody checked: each must be a valid block, and goes.
 * Nothing else in these targets creates one.
 */
static void ctl_sweep(void)
{
	char path[4700];
	struct dirent *de;
	DIR *d;
	int e;

	op_begin("readdir %s", ns_path);
	d = opendir(ns_path);
	e = err_of(d ? 0 : -1);
	op_end();
	want(e, OKS(0), "opendir the namespace");
	while ((de = readdir(d))) {
		uint8_t k[16], *img = NULL;
		uint64_t len = 0;
		enum kvfs_fmt_err fe;
		int rc;

		if (kvfs_fmt_name_parse(de->d_name, k) || seed_of(k) >= 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", ns_path, de->d_name);
		rc = slurp(path, &img, &len);
		if (rc) {
			closedir(d);
			fz_fail("a block SAVE made (%s): %s", path, ename(rc));
		}
		fe = kvfs_fmt_validate(img, len, &g, k, root, 0, NULL);
		free(img);
		if (fe != KVFS_FMT_OK) {
			closedir(d);
			fz_fail("a block SAVE made (%s) does not validate: %s",
				path, kvfs_fmt_strerror(fe));
		}
		op_begin("unlink %s", path);
		e = err_of(unlink(path));
		op_end();
		want(e, OKS(0), "unlink a block SAVE made");
	}
	closedir(d);
}

/* Leave no pin, lease or saved block behind for the next target. */
static void ctl_cleanup(void)
{
	struct kvfs_ctl_msg m;
	int fd = ctl_open(), e;

	memset(&m, 0, sizeof(m));
	m.req.magic = KVFS_CTL_MAGIC;
	m.req.abi = KVFS_CTL_ABI;
	m.req.op = KVFS_CTL_UNPIN;
	snprintf(m.req.ns, sizeof(m.req.ns), "%s", ns);
	for (int i = 0; i < n_seeds; i++)
		memcpy(m.bytes + REQ_HDR + 16 * i, seeds[i].key, 16);
	m.req.n_keys = (uint32_t)n_seeds;
	m.req.size = REQ_HDR + 16 * (uint32_t)n_seeds;
	op_begin("ioctl UNPIN of the seeds");
	e = err_of(ioctl(fd, KVFS_IOC_UNPIN, &m));
	op_end();
	want(e, OKS(0), "UNPIN of the seeds");
	if (m.resp.error)
		fz_fail("UNPIN of the seeds: %d", m.resp.error);
	ctl_close(fd);
	ctl_sweep();
}

/* ------------------------------------------------------------ targets */

static uint16_t pick_op(struct rng *r)
{
	return (uint16_t)(1 + below(r, KVFS_CTL_OP_MAX));
}

/* -- target: ioctl transport, command numbers and contents */
void test_ctl_ioctl(void **state)
{
	struct rq q = wq;

	begin_target("ctl_ioctl");
	FOR_ITER(it, 4500) {
		struct rng r = rng_for(1, it);
		int fd = ctl_open();
		unsigned calls = 1 + below(&r, 6);

		for (unsigned c = 0; c < calls; c++) {
			uint16_t op = pick_op(&r);
			unsigned long cmd = KVFS_IOC(op);

			build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
			if (chance(&r, 55))
				mutate_bad(&r, &q, KVFS_CTL_MSG_SIZE);
			else if (chance(&r, 50))
				mutate_ok(&r, &q);
			if (chance(&r, 25)) {
				static const unsigned char types[] = {
					'K', 'K', 'K', 'k', 'Z', 'q', 0xab,
				};
				static const unsigned sizes[] = {
					0, 4, 8, 384, 8191, KVFS_CTL_MSG_SIZE,
					KVFS_CTL_MSG_SIZE, 8193, 16383,
				};
				unsigned dir = below(&r, 4);
				unsigned nr = chance(&r, 70)
						      ? KVFS_IOC_NR(below(&r, 16))
						      : below(&r, 256);

				cmd = _IOC(dir, types[below(&r, sizeof(types))],
					   nr, sizes[below(&r, sizeof(sizes) /
							     sizeof(sizes[0]))]);
			}
			send_ioctl(fd, &q, cmd, &r);
		}
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -- target: write-then-read transactions, interleaved with ioctls */
void test_ctl_write_read(void **state)
{
	struct rq q = wq;
	struct pend pd;

	memset(&pd, 0, sizeof(pd));
	pd.q = wpend;
	begin_target("ctl_write_read");
	FOR_ITER(it, 3000) {
		struct rng r = rng_for(2, it);
		int fd = ctl_open();
		unsigned steps = 1 + below(&r, 8);

		pd.any = pd.sure = false;
		for (unsigned s = 0; s < steps; s++) {
			unsigned k = below(&r, 10);
			uint16_t op = pick_op(&r);

			if (k < 4) {
				size_t cap = chance(&r, 90) ? 16384
							    : KVFS_CTL_MAX_SIZE;

				build_req(&r, &q, op, cap);
				if (chance(&r, 40))
					mutate_bad(&r, &q, cap);
				else if (chance(&r, 40))
					mutate_ok(&r, &q);
				if (!q.malformed && chance(&r, 8)) {
					/* the request cut short, or with a
					 * tail: its size field is then wrong
					 */
					if (chance(&r, 50) && q.len > 1) {
						q.len = REQ_HDR / 2 +
							below(&r, (uint32_t)q.len -
								  REQ_HDR / 2);
						malform(&q, "truncated");
					} else {
						size_t add = chance(&r, 50)
							? 1 + below(&r, 64)
							: KVFS_CTL_MAX_SIZE + 1 -
								  q.len;

						fill(&r, q.b + q.len, add);
						q.len += add;
						malform(&q, "trailing bytes");
					}
				}
				send_write(fd, &q, &pd);
			} else if (k < 8) {
				do_read(fd, &r, &pd);
			} else if (k < 9) {
				build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
				if (chance(&r, 40))
					mutate_bad(&r, &q, KVFS_CTL_MSG_SIZE);
				send_ioctl(fd, &q, KVFS_IOC(op), &r);
			} else {
				/* a descriptor that cannot seek or sync */
				int e;

				op_begin("lseek/pread/fsync/fstat on ctl");
				e = err_of(lseek(fd, (off_t)below(&r, 4096),
						 SEEK_SET));
				op_end();
				want(e, OKS(ESPIPE), "lseek on .kvfs/ctl");
				op_begin("pread on ctl");
				e = err_of(pread(fd, rbuf, 4096, 4096));
				op_end();
				want(e, OKS(ESPIPE), "pread on .kvfs/ctl");
				op_begin("fsync on ctl");
				e = err_of(fsync(fd));
				op_end();
				want(e, OKS(0, ENOSYS, EINVAL),
				     "fsync on .kvfs/ctl");
				struct stat st;

				op_begin("fstat on ctl");
				e = err_of(fstat(fd, &st));
				op_end();
				want(e, OKS(0), "fstat on .kvfs/ctl");
			}
		}
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -- target: well-formed requests on real blocks and memory */
void test_ctl_semantic(void **state)
{
	struct rq q = wq;
	struct pend pd;

	memset(&pd, 0, sizeof(pd));
	pd.q = wpend;
	begin_target("ctl_semantic");
	FOR_ITER(it, 2100) {
		struct rng r = rng_for(3, it);
		int fd = ctl_open();
		unsigned calls = 1 + below(&r, 4);

		fill(&r, peer_mem, 64 * 1024);
		for (unsigned c = 0; c < calls; c++) {
			uint16_t op = pick_op(&r);

			if (chance(&r, 30))
				op = KVFS_CTL_FETCH_CHUNKS;
			else if (chance(&r, 20))
				op = KVFS_CTL_FETCH_INTO;
			q.precise = chance(&r, 60);
			build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
			if (chance(&r, 15))
				mutate_ok(&r, &q);
			if (chance(&r, 70)) {
				send_ioctl(fd, &q, KVFS_IOC(op), &r);
			} else {
				pd.any = pd.sure = false;
				send_write(fd, &q, &pd);
				memset(rbuf, 0, RESP_HDR);
				op_begin("read the response");
				ssize_t n = read(fd, rbuf, KVFS_CTL_MAX_SIZE);
				int e = err_of(n);

				op_end();
				want(e, OKS(0), "read of a response");
				if (pd.any && n <= 0)
					fz_fail("no response after a "
						"well-formed write");
				if (pd.any)
					check_resp(&pd.q, rbuf, (size_t)n,
						   "write/read");
			}
		}
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -- target: two threads on one descriptor */
struct worker {
	int fd;
	long it;
	int id;
	struct rq q;
	uint8_t *buf; /* 16 KiB */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct rng r = rng_for(40 + (unsigned)w->id, w->it);
	struct rq q = w->q;
	uint8_t *buf = w->buf;

	in_worker = true;
	slot = 1 + w->id;
	for (unsigned s = 0; s < 12; s++) {
		uint16_t op = pick_op(&r);
		ssize_t n;
		int e;

		build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
		if (chance(&r, 40))
			mutate_bad(&r, &q, KVFS_CTL_MSG_SIZE);
		switch (below(&r, 3)) {
		case 0:
			memset(buf, 0, 16384);
			memcpy(buf, q.b, q.len);
			op_begin("thread ioctl op %u", op);
			e = err_of(ioctl(w->fd, KVFS_IOC(op), buf));
			op_end();
			want(e, OKS(0, EINVAL, E2BIG, ENOMEM),
			     "ioctl from two threads");
			break;
		case 1:
			op_begin("thread write op %u", op);
			e = err_of(write(w->fd, q.b, q.len));
			op_end();
			want(e, OKS(0, EINVAL, ENOMEM), "write from two threads");
			break;
		default:
			op_begin("thread read");
			n = read(w->fd, buf, chance(&r, 50) ? 16384 : 100);
			e = err_of(n);
			op_end();
			want(e, OKS(0, EMSGSIZE), "read from two threads");
			if (n > 0 && ((struct kvfs_ctl_resp *)buf)->magic !=
					     KVFS_CTL_MAGIC)
				fz_fail("a read from two threads: no response");
			break;
		}
	}
	return NULL;
}

void test_ctl_threads(void **state)
{
	begin_target("ctl_threads");
	FOR_ITER(it, 450) {
		struct worker w[2];
		pthread_t t[2];
		int fd = ctl_open();

		for (int i = 0; i < 2; i++) {
			w[i] = (struct worker){ fd, it, i, wk_q[i], wk_buf[i] };
			assert_int_equal(pthread_create(&t[i], NULL,
							worker_main, &w[i]),
					 0);
		}
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		if (worker_fail[0])
			fz_fail("%s", worker_fail);
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* ---------------------------------------------------------- regressions */

/* One ctl request by ioctl; the response's error. */
static int ctl_call(int fd, struct kvfs_ctl_msg *m)
{
	int op = m->req.op, e;

	op_begin("ioctl op %d", op);
	e = err_of(ioctl(fd, KVFS_IOC(op), m));
	op_end();
	want(e, OKS(0), "a well-formed ioctl");
	if (m->resp.magic != KVFS_CTL_MAGIC || m->resp.op != op)
		fz_fail("op %d: not a response", op);
	return m->resp.error;
}

static void msg_init(struct kvfs_ctl_msg *m, int op, int nkeys)
{
	memset(m, 0, sizeof(*m));
	m->req.magic = KVFS_CTL_MAGIC;
	m->req.abi = KVFS_CTL_ABI;
	m->req.op = (uint16_t)op;
	snprintf(m->req.ns, sizeof(m->req.ns), "%s", ns);
	m->req.n_keys = (uint32_t)nkeys;
	for (int i = 0; i < nkeys; i++)
		memcpy(m->bytes + REQ_HDR + 16 * i, seeds[i % n_seeds].key, 16);
	m->req.size = REQ_HDR + 16 * (uint32_t)nkeys;
}

/*
 * cache/ctl.c sync_open() checked the sync word with st_size < off + 4,
 * which wraps for off = 2^64 - 4: the word was stored 4 bytes before the
 * daemon's mapping of the caller's object, and the request succeeded.
 */
void test_regress_sync_word_bounds(void **state)
{
	static const uint64_t outside[] = {
		UINT64_MAX - 3, UINT64_MAX - 7, UINT64_MAX - 4095,
		SYNC_SIZE, SYNC_SIZE - 2, 1ull << 63,
	};
	struct kvfs_ctl_msg m;
	uint32_t w;
	int fd, err;

	begin_target("regress_sync_word_bounds");
	if (!n_seeds)
		skip();
	fd = ctl_open();
	for (int chunks = 0; chunks < 2; chunks++) {
		for (size_t i = 0; i <= sizeof(outside) / sizeof(outside[0]);
		     i++) {
			bool in = i == sizeof(outside) / sizeof(outside[0]);

			msg_init(&m, chunks ? KVFS_CTL_FETCH_CHUNKS
					    : KVFS_CTL_FETCH_INTO, 1);
			m.req.n_dst = 1; /* dst[0].off = 0 */
			m.req.size += 8;
			if (chunks) {
				m.req.n_layers = g.n_layers;
				m.req.n_chunks = 1; /* chunk 0 */
				m.req.size += 4;
			}
			m.req.peer.backend = KVFS_CTL_BACKEND_SHM;
			m.req.peer.size = PEER_SIZE;
			snprintf(m.req.peer.shm_name,
				 sizeof(m.req.peer.shm_name), "%s", peer_name);
			snprintf(m.req.sync.shm_name,
				 sizeof(m.req.sync.shm_name), "%s", sync_name);
			m.req.sync.off = in ? SYNC_SIZE - 4 : outside[i];
			memset(sync_mem + SYNC_SIZE - 4, 0xee, 4);
			err = ctl_call(fd, &m);
			if (!in && err != -EINVAL)
				fz_fail("%s with the sync word at %#" PRIx64
					" of a %u-byte object: error %d, "
					"want %d", chunks ? "FETCH_CHUNKS" :
					"FETCH_INTO", outside[i], SYNC_SIZE,
					err, -EINVAL);
			if (!in)
				continue;
			memcpy(&w, sync_mem + SYNC_SIZE - 4, 4);
			if (err || w != g.n_layers)
				fz_fail("%s with the sync word in the last 4 "
					"bytes: error %d, word %#x",
					chunks ? "FETCH_CHUNKS" : "FETCH_INTO",
					err, w);
		}
	}
	ctl_close(fd);
	end_target();
}

/*
 * cache/ctl.c op_prefetch() read the job's block count after handing the
 * job to a detached thread that frees it (a use after free ASan reports;
 * otherwise a count from freed memory). Blocks already in DRAM make the
 * thread finish at once.
 */
void test_regress_prefetch_count(void **state)
{
	struct kvfs_ctl_msg m;
	int fd, err;

	begin_target("regress_prefetch_count");
	if (!n_seeds)
		skip();
	fd = ctl_open();
	for (int i = 0; i < 500; i++) {
		cur_iter = i;
		msg_init(&m, KVFS_CTL_PREFETCH, n_seeds);
		m.req.tier = 1; /* dram */
		err = ctl_call(fd, &m);
		if (err || m.resp.n_cached != (uint32_t)n_seeds)
			fz_fail("PREFETCH of %d stored blocks: error %d, %u "
				"found", n_seeds, err, m.resp.n_cached);
	}
	ctl_close(fd);
	check_alive();
	end_target();
}
