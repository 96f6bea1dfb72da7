/* SPDX-License-Identifier: MIT */
/* The SSD tier, over memory and over a file. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "tier/tier.h"
#include "meta/log.h"
#include "tests/unit/tier_fx_i.h"

#define NRINGS 2

/* ---- ssd, over memory and over a file ---- */

struct fx {
	bool file;
	bool no_direct; /* /tmp refuses O_DIRECT: file tests are skipped */
	char path[64];
	struct kvfs_tier *t;
};

static struct fx fx_mem = { .file = false };
static struct fx fx_file = { .file = true };

static int ssd_open_fx(struct fx *f)
{
	return kvfs_tier_ssd_init(f->file ? f->path : NULL, DATA_OFF, SSD_SIZE,
				  NRINGS, f->file ? 0 : KVFS_SSD_MEMORY, &f->t);
}

static int ssd_setup(void **state)
{
	struct fx *f = *state;
	int fd;

	f->t = NULL;
	f->no_direct = false;
	if (f->file) {
		strcpy(f->path, "/tmp/kvfs-test-tier-XXXXXX");
		fd = mkstemp(f->path);
		if (fd < 0 || ftruncate(fd, SSD_SIZE))
			return -1;
		close(fd);
		fd = open(f->path, O_RDWR | O_DIRECT);
		if (fd < 0) {
			f->no_direct = true;
			return 0;
		}
		close(fd);
	}
	return ssd_open_fx(f) ? -1 : 0;
}

static int ssd_teardown(void **state)
{
	struct fx *f = *state;

	kvfs_tier_free(f->t);
	f->t = NULL;
	if (f->file)
		unlink(f->path);
	return 0;
}

static struct kvfs_tier *fx_tier(void **state)
{
	struct fx *f = *state;

	if (f->no_direct) {
		print_message("/tmp refuses O_DIRECT: skipped\n");
		skip();
	}
	return f->t;
}

static void test_ssd_basics(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	struct kvfs_extent e;

	assert_int_equal(t->id, KVFS_TIER_SSD);
	assert_string_equal(t->ops->name, "ssd");
	assert_int_equal(t->capacity, SSD_SIZE - DATA_OFF);
	assert_int_equal(t->align, PG);
	assert_int_equal(t->ops->alloc(t, 1, &e), 0);
	assert_int_equal(e.off, DATA_OFF);
	assert_int_equal(e.len, PG);
	assert_null(e.ptr);
	assert_null(t->ops->map(t, &e));
	assert_int_equal(atomic_load(&t->used), PG);
	assert_int_equal(t->ops->alloc(t, 0, &e), -EINVAL);
	assert_int_equal(t->ops->sync(t), 0);
	t->ops->free(t, &e);
	assert_int_equal(atomic_load(&t->used), 0);
}

static void test_ssd_rw_many(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 200 };
	struct kvfs_extent e[N];
	uint64_t total = 0;
	char *buf = tfx_xalloc(16 * PG);
	unsigned seed = 1;

	for (int i = 0; i < N; i++) {
		uint64_t len = (1 + (unsigned)rand_r(&seed) % 16) * PG;

		assert_int_equal(t->ops->alloc(t, len, &e[i]), 0);
		assert_int_equal(e[i].len, len);
		tfx_fill(buf, len, (uint64_t)i);
		assert_int_equal(t->ops->write(t, &e[i], 0, buf, len), 0);
		total += len;
	}
	assert_int_equal(atomic_load(&t->used), total);
	assert_int_equal(atomic_load(&t->st.writes), N);
	assert_int_equal(atomic_load(&t->st.bytes_written), total);
	assert_int_equal(t->ops->sync(t), 0);
	/* Read back in another order. */
	for (int k = 0; k < N; k++) {
		int i = (k * 7) % N;

		memset(buf, 0, e[i].len);
		assert_int_equal(t->ops->read(t, &e[i], 0, buf, e[i].len), 0);
		assert_true(tfx_same(buf, e[i].len, (uint64_t)i));
	}
	/* A partial read inside an extent. */
	for (int i = 0; i < N; i++) {
		if (e[i].len < 3 * PG)
			continue;
		char *want = tfx_xalloc(e[i].len);

		tfx_fill(want, e[i].len, (uint64_t)i);
		assert_int_equal(t->ops->read(t, &e[i], PG, buf, PG), 0);
		assert_memory_equal(buf, want + PG, PG);
		free(want);
		break;
	}
	assert_int_equal(atomic_load(&t->st.bytes_read), total + PG);
	assert_int_equal(atomic_load(&t->st.reads), N + 1);
	for (int i = 0; i < N; i++)
		t->ops->free(t, &e[i]);
	assert_int_equal(atomic_load(&t->used), 0);
	free(buf);
}

/* What readv's done callbacks saw. */
struct done_log {
	struct kvfs_tier_io *io; /* the batch */
	const char *src;       /* the big extent's contents */
	int calls[64];
	bool bytes_ok[64];     /* big-extent ranges: bytes in place */
};

static void note_done(struct kvfs_tier_io *io, void *arg)
{
	struct done_log *dl = arg;
	size_t i = (size_t)(io - dl->io);

	assert_true(i < 64);
	assert_int_not_equal(io->res, 1);
	dl->calls[i]++;
	if (i < 32 && !io->res)
		dl->bytes_ok[i] = !memcmp(io->buf, dl->src + io->off, PG);
}

static void test_ssd_readv(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 64 };
	struct kvfs_extent big, small[8];
	struct kvfs_tier_io io[N];
	char *src = tfx_xalloc(64 * PG), *dst = tfx_xalloc(N * 2 * PG);
	char *want = tfx_xalloc(2 * PG);
	uint64_t reads0, rbytes0, bytes = 0;
	struct done_log dl = { .io = io, .src = src };

	memset(io, 0, sizeof(io));
	assert_int_equal(t->ops->alloc(t, 64 * PG, &big), 0);
	tfx_fill(src, 64 * PG, 1000);
	assert_int_equal(t->ops->write(t, &big, 0, src, 64 * PG), 0);
	for (int i = 0; i < 8; i++) {
		assert_int_equal(t->ops->alloc(t, 2 * PG, &small[i]), 0);
		tfx_fill(want, 2 * PG, 2000 + (uint64_t)i);
		assert_int_equal(t->ops->write(t, &small[i], 0, want, 2 * PG),
				 0);
	}
	/* 32 adjacent pages of the big extent, backwards, then 32 ranges
	 * spread over the small extents.
	 */
	for (int i = 0; i < N; i++) {
		io[i].buf = dst + (size_t)i * 2 * PG;
		io[i].res = 1;
		if (i < 32) {
			io[i].ext = &big;
			io[i].off = (uint64_t)(31 - i) * PG;
			io[i].len = PG;
		} else {
			io[i].ext = &small[i % 8];
			io[i].off = (i & 8) ? PG : 0;
			io[i].len = (i & 16) ? PG : 2 * PG - io[i].off;
		}
		bytes += io[i].len;
	}
	reads0 = atomic_load(&t->st.reads);
	rbytes0 = atomic_load(&t->st.bytes_read);
	assert_int_equal(t->ops->readv(t, io, N), 0);
	assert_int_equal(atomic_load(&t->st.reads) - reads0, N);
	assert_int_equal(atomic_load(&t->st.bytes_read) - rbytes0, bytes);
	for (int i = 0; i < N; i++) {
		assert_int_equal(io[i].res, 0);
		if (i < 32) {
			assert_memory_equal(io[i].buf, src + io[i].off, PG);
		} else {
			tfx_fill(want, 2 * PG, 2000 + (uint64_t)(i % 8));
			assert_memory_equal(io[i].buf, want + io[i].off,
					    io[i].len);
		}
	}

	/* One bad range fails alone; the others still complete. Each
	 * range's done callback runs once, with its result final and, for
	 * a good range, its bytes in place.
	 */
	memset(dst, 0, N * 2 * PG);
	io[5].off = 100;
	io[40].off = 64 * PG;
	for (int i = 0; i < N; i++) {
		io[i].done = note_done;
		io[i].arg = &dl;
	}
	assert_int_equal(t->ops->readv(t, io, N), -EINVAL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(dl.calls[i], 1);
		if (i < 32)
			assert_int_equal(dl.bytes_ok[i], io[i].res == 0);
		if (i == 5 || i == 40) {
			assert_int_equal(io[i].res, -EINVAL);
			continue;
		}
		assert_int_equal(io[i].res, 0);
		if (i < 32)
			assert_memory_equal(io[i].buf, src + io[i].off, PG);
	}
	assert_int_equal(t->ops->readv(t, io, 0), 0);

	t->ops->free(t, &big);
	for (int i = 0; i < 8; i++)
		t->ops->free(t, &small[i]);
	free(src);
	free(dst);
	free(want);
}

/* More ranges than one ring holds: the batch is split, none is lost. */
static void test_ssd_readv_large(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 700 };
	struct kvfs_extent e;
	struct kvfs_tier_io *io = calloc(N, sizeof(*io));
	char *src = tfx_xalloc(N * PG), *dst = tfx_xalloc(N * PG);

	assert_non_null(io);
	assert_int_equal(t->ops->alloc(t, N * PG, &e), 0);
	tfx_fill(src, N * PG, 77);
	assert_int_equal(t->ops->write(t, &e, 0, src, N * PG), 0);
	memset(dst, 0, N * PG);
	for (int i = 0; i < N; i++) {
		io[i].ext = &e;
		io[i].off = (uint64_t)((i * 37) % N) * PG;
		io[i].len = PG;
		io[i].buf = dst + io[i].off;
		io[i].res = 1;
	}
	assert_int_equal(t->ops->readv(t, io, N), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(io[i].res, 0);
	assert_memory_equal(dst, src, N * PG);
	t->ops->free(t, &e);
	free(io);
	free(src);
	free(dst);
}

/*
 * What a batch's ->issue and ->done calls saw: the order of issues, the
 * most ranges in flight at once (issued, not yet done), and whether the
 * issue callback refuses from some point on.
 */
struct issue_log {
	struct kvfs_tier_io *io;
	size_t n;
	unsigned issued, done, max_inflight;
	int issue_calls[64], done_calls[64];
	bool refuse;         /* ->issue answers -ECANCELED */
	bool refuse_at_done; /* the first done sets refuse */
	bool in_order;       /* ->issue came in index order */
};

/* Range @i was issued: the order and in-flight bookkeeping. */
static void log_issued(struct issue_log *il, size_t i)
{
	if (i != il->issued)
		il->in_order = false;
	il->issued++;
	if (il->issued - il->done > il->max_inflight)
		il->max_inflight = il->issued - il->done;
}

static int note_issue(struct kvfs_tier_io *io, void *arg)
{
	struct issue_log *il = arg;
	size_t i = (size_t)(io - il->io);

	assert_true(i < il->n);
	il->issue_calls[i]++;
	if (il->refuse)
		return -ECANCELED;
	log_issued(il, i);
	return 0;
}

static void note_issue_done(struct kvfs_tier_io *io, void *arg)
{
	struct issue_log *il = arg;
	size_t i = (size_t)(io - il->io);

	assert_true(i < il->n);
	il->done_calls[i]++;
	if (io->res == -ECANCELED)
		return;
	il->done++;
	if (il->refuse_at_done)
		il->refuse = true;
}

/* A batch of @n one-page ranges over @e (holding tfx_fill(.., 55)) into @dst,
 * each with @depth and the log's callbacks.
 */
static void issue_batch(struct kvfs_tier_io *io, size_t n,
			struct kvfs_extent *e, char *dst, unsigned depth,
			struct issue_log *il)
{
	memset(il, 0, sizeof(*il));
	il->io = io;
	il->n = n;
	il->in_order = true;
	memset(dst, 0xcc, n * PG);
	for (size_t i = 0; i < n; i++)
		io[i] = (struct kvfs_tier_io){
			.ext = e, .off = (uint64_t)((i * 7) % n) * PG,
			.len = PG, .buf = dst + i * PG, .depth = depth,
			.issue = note_issue, .done = note_issue_done,
			.arg = il };
}

/* A depth on the ranges caps the reads in flight; none means the
 * tier's own limit, which a small batch does not reach.
 */
static void test_ssd_readv_depth(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 40 };
	struct kvfs_tier_io io[N];
	struct kvfs_extent e;
	struct issue_log il;
	char *src = tfx_xalloc(N * PG), *dst = tfx_xalloc(N * PG);

	assert_int_equal(t->ops->alloc(t, N * PG, &e), 0);
	tfx_fill(src, N * PG, 55);
	assert_int_equal(t->ops->write(t, &e, 0, src, N * PG), 0);
	for (unsigned depth = 0; depth <= 3; depth += 3) {
		issue_batch(io, N, &e, dst, depth, &il);
		assert_int_equal(t->ops->readv(t, io, N), 0);
		assert_true(il.in_order);
		assert_int_equal(il.issued, N);
		assert_int_equal(il.done, N);
		/* Ranges are issued before any completes up to the cap. */
		assert_int_equal(il.max_inflight, depth ? depth : N);
		for (int i = 0; i < N; i++) {
			assert_int_equal(il.issue_calls[i], 1);
			assert_int_equal(il.done_calls[i], 1);
			assert_int_equal(io[i].res, 0);
			assert_memory_equal(io[i].buf, src + io[i].off, PG);
		}
	}
	t->ops->free(t, &e);
	free(src);
	free(dst);
}

/*
 * ->issue refuses from the first completion on, as a cancel arriving
 * while reads are on the disk would: those finish, the rest are never
 * issued (-ECANCELED, done called once, buffers untouched, no op
 * counted).
 */
static void test_ssd_readv_cancel(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 20, D = 4 };
	struct kvfs_tier_io io[N];
	struct kvfs_extent e;
	struct issue_log il;
	char *src = tfx_xalloc(N * PG), *dst = tfx_xalloc(N * PG);
	char *untouched = tfx_xalloc(PG);
	uint64_t reads0, rbytes0;

	assert_int_equal(t->ops->alloc(t, N * PG, &e), 0);
	tfx_fill(src, N * PG, 55);
	assert_int_equal(t->ops->write(t, &e, 0, src, N * PG), 0);
	memset(untouched, 0xcc, PG);
	issue_batch(io, N, &e, dst, D, &il);
	il.refuse_at_done = true;
	reads0 = atomic_load(&t->st.reads);
	rbytes0 = atomic_load(&t->st.bytes_read);
	assert_int_equal(t->ops->readv(t, io, N), -ECANCELED);
	assert_int_equal(il.issued, D);
	assert_int_equal(il.done, D);
	assert_int_equal(atomic_load(&t->st.reads) - reads0, D);
	assert_int_equal(atomic_load(&t->st.bytes_read) - rbytes0, D * PG);
	for (int i = 0; i < N; i++) {
		assert_int_equal(il.issue_calls[i], 1);
		assert_int_equal(il.done_calls[i], 1);
		if (i < D) {
			assert_int_equal(io[i].res, 0);
			assert_memory_equal(io[i].buf, src + io[i].off, PG);
		} else {
			assert_int_equal(io[i].res, -ECANCELED);
			assert_memory_equal(io[i].buf, untouched, PG);
		}
	}
	/* Refused from the start: nothing is issued, nothing counted. */
	issue_batch(io, N, &e, dst, 0, &il);
	il.refuse = true;
	reads0 = atomic_load(&t->st.reads);
	assert_int_equal(t->ops->readv(t, io, N), -ECANCELED);
	assert_int_equal(atomic_load(&t->st.reads), reads0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(il.done_calls[i], 1);
		assert_int_equal(io[i].res, -ECANCELED);
	}
	t->ops->free(t, &e);
	free(src);
	free(dst);
	free(untouched);
}

/* test_ssd_readv_deep's callbacks: like note_issue and note_issue_done,
 * with per-range counts after the log (batches longer than 64).
 */
static int count_issue(struct kvfs_tier_io *io, void *arg)
{
	struct issue_log *il = arg;
	size_t i = (size_t)(io - il->io);

	((int *)(il + 1))[i]++;
	log_issued(il, i);
	return 0;
}

static void count_done(struct kvfs_tier_io *io, void *arg)
{
	struct issue_log *il = arg;
	size_t i = (size_t)(io - il->io);

	((int *)(il + 1))[il->n + i]++;
	il->done++;
}

/* ->issue of test_ssd_readv_refuse_some: refuses every odd range. */
static int refuse_odd(struct kvfs_tier_io *io, void *arg)
{
	struct issue_log *il = arg;
	size_t i = (size_t)(io - il->io);

	il->issue_calls[i]++;
	return i % 2 ? -ECANCELED : 0;
}

/*
 * ->issue refusing ranges in the middle of a batch, some of them
 * vectored, at a depth of 2 and at one deeper than the ring: the others
 * are still issued and read, each range's done comes once, and only the
 * issued ones count.
 */
static void test_ssd_readv_refuse_some(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 40 };
	static const unsigned depths[] = { 2, 100000 };
	struct kvfs_tier_io io[N];
	struct iovec iov[N][2];
	struct kvfs_extent e;
	struct issue_log il;
	char *src = tfx_xalloc(N * PG), *dst = tfx_xalloc(2 * N * PG);
	uint64_t reads0, rbytes0;

	assert_int_equal(t->ops->alloc(t, N * PG, &e), 0);
	tfx_fill(src, N * PG, 77);
	assert_int_equal(t->ops->write(t, &e, 0, src, N * PG), 0);
	for (size_t d = 0; d < 2; d++) {
		issue_batch(io, N, &e, dst, depths[d], &il);
		/* Every third range vectored: two pages, apart in memory. */
		for (size_t i = 0; i < N; i += 3) {
			io[i].off = (uint64_t)(i / 3) * 2 * PG;
			io[i].len = 2 * PG;
			io[i].buf = NULL;
			iov[i][0] = (struct iovec){ dst + N * PG + i * PG, PG };
			iov[i][1] = (struct iovec){ dst + i * PG, PG };
			io[i].iov = iov[i];
			io[i].iovcnt = 2;
		}
		for (size_t i = 0; i < N; i++)
			io[i].issue = refuse_odd;
		memset(dst, 0xcc, 2 * N * PG);
		reads0 = atomic_load(&t->st.reads);
		rbytes0 = atomic_load(&t->st.bytes_read);
		assert_int_equal(t->ops->readv(t, io, N), -ECANCELED);
		assert_int_equal(atomic_load(&t->st.reads) - reads0, N / 2);
		for (size_t i = 0; i < N; i++) {
			const char *at = src + io[i].off;

			assert_int_equal(il.issue_calls[i], 1);
			assert_int_equal(il.done_calls[i], 1);
			if (i % 2) {
				assert_int_equal(io[i].res, -ECANCELED);
				continue;
			}
			assert_int_equal(io[i].res, 0);
			rbytes0 += io[i].len;
			if (!io[i].iov) {
				assert_memory_equal(io[i].buf, at, PG);
				continue;
			}
			assert_memory_equal(iov[i][0].iov_base, at, PG);
			assert_memory_equal(iov[i][1].iov_base, at + PG, PG);
		}
		assert_int_equal(atomic_load(&t->st.bytes_read), rbytes0);
		/* Refused ranges' memory is untouched. */
		for (size_t i = 1; i < N; i += 2) {
			const unsigned char *b = io[i].iov ?
				iov[i][0].iov_base : io[i].buf;

			assert_int_equal(b[0], 0xcc);
			assert_int_equal(b[PG - 1], 0xcc);
		}
	}
	t->ops->free(t, &e);
	free(src);
	free(dst);
}

/*
 * A batch longer than the ring with a depth deeper than the ring: the
 * ring's limit holds, every range is issued once, in order, and read.
 */
static void test_ssd_readv_deep(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	enum { N = 300 };
	struct kvfs_tier_io *io = calloc(N, sizeof(*io));
	struct kvfs_extent e;
	struct issue_log *il = calloc(1, sizeof(*il) +
				      2 * N * sizeof(int));
	char *src = tfx_xalloc(N * PG), *dst = tfx_xalloc(N * PG);
	int *ic, *dc;

	assert_non_null(io);
	assert_non_null(il);
	assert_int_equal(t->ops->alloc(t, N * PG, &e), 0);
	tfx_fill(src, N * PG, 91);
	assert_int_equal(t->ops->write(t, &e, 0, src, N * PG), 0);
	for (unsigned depth = 256; depth <= 257; depth++) {
		memset(dst, 0xcc, N * PG);
		memset(il, 0, sizeof(*il));
		il->io = io;
		il->n = N;
		il->in_order = true;
		for (size_t i = 0; i < N; i++)
			io[i] = (struct kvfs_tier_io){
				.ext = &e, .off = (uint64_t)i * PG, .len = PG,
				.buf = dst + i * PG, .depth = depth,
				.issue = count_issue, .done = count_done,
				.arg = il };
		ic = (int *)(il + 1);
		dc = ic + N;
		memset(ic, 0, 2 * N * sizeof(int));
		assert_int_equal(t->ops->readv(t, io, N), 0);
		assert_true(il->in_order);
		assert_int_equal(il->issued, N);
		assert_int_equal(il->done, N);
		assert_true(il->max_inflight <= 256);
		for (size_t i = 0; i < N; i++) {
			assert_int_equal(ic[i], 1);
			assert_int_equal(dc[i], 1);
		}
		assert_memory_equal(dst, src, N * PG);
	}
	t->ops->free(t, &e);
	free(io);
	free(il);
	free(src);
	free(dst);
}

static void test_ssd_unaligned(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	struct kvfs_extent e, bad;
	char *buf = tfx_xalloc(4 * PG);
	uint64_t w0 = atomic_load(&t->st.writes);

	assert_int_equal(t->ops->alloc(t, 2 * PG, &e), 0);
	assert_int_equal(t->ops->write(t, &e, 0, buf + 512, PG), -EINVAL);
	assert_int_equal(t->ops->write(t, &e, 512, buf, PG), -EINVAL);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 1000), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, 0, buf + 1, PG), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, PG, buf, 2 * PG), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, 2 * PG, buf, PG), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, UINT64_MAX - PG + 1, buf, PG),
			 -EINVAL);
	assert_int_equal(t->ops->read(t, &e, 0, NULL, PG), -EINVAL);
	assert_int_equal(t->ops->readv(t, NULL, 1), -EINVAL);
	/* Extents that the tier could not have handed out. */
	bad = (struct kvfs_extent){ .off = 0, .len = PG };
	assert_int_equal(t->ops->read(t, &bad, 0, buf, PG), -EINVAL);
	bad = (struct kvfs_extent){ .off = SSD_SIZE, .len = PG };
	assert_int_equal(t->ops->write(t, &bad, 0, buf, PG), -EINVAL);
	bad = (struct kvfs_extent){ .off = DATA_OFF + 100, .len = PG };
	assert_int_equal(t->ops->read(t, &bad, 0, buf, PG), -EINVAL);
	/* Nothing was issued. */
	assert_int_equal(atomic_load(&t->st.writes), w0);
	/* Zero bytes is a no-op. */
	assert_int_equal(t->ops->read(t, &e, 2 * PG, buf, 0), 0);
	t->ops->free(t, &e);
	free(buf);
}

static bool overlaps(const struct kvfs_extent *a, const struct kvfs_extent *b)
{
	return a->off < b->off + b->len && b->off < a->off + a->len;
}

static void test_ssd_claim(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	struct kvfs_extent c[3] = {
		{ .off = DATA_OFF + 8 * PG, .len = 4 * PG },
		{ .off = DATA_OFF + 100 * PG, .len = PG },
		{ .off = SSD_SIZE - 2 * PG, .len = 2 * PG },
	};
	struct kvfs_extent bad, *got;
	size_t ngot = 0, cap = (SSD_SIZE - DATA_OFF) / PG;
	uint64_t claimed = 0;

	for (int i = 0; i < 3; i++) {
		assert_int_equal(t->ops->claim(t, &c[i]), 0);
		claimed += c[i].len;
	}
	assert_int_equal(atomic_load(&t->used), claimed);
	assert_int_equal(t->ops->claim(t, &c[0]), -EEXIST);
	bad = (struct kvfs_extent){ .off = DATA_OFF + 9 * PG, .len = 8 * PG };
	assert_int_equal(t->ops->claim(t, &bad), -EEXIST);
	bad = (struct kvfs_extent){ .off = 0, .len = PG };
	assert_int_equal(t->ops->claim(t, &bad), -EINVAL);
	bad = (struct kvfs_extent){ .off = SSD_SIZE, .len = PG };
	assert_int_equal(t->ops->claim(t, &bad), -EINVAL);
	bad = (struct kvfs_extent){ .off = DATA_OFF + PG + 1, .len = PG };
	assert_int_equal(t->ops->claim(t, &bad), -EINVAL);
	assert_int_equal(atomic_load(&t->used), claimed);

	/* Fill the rest with allocations of mixed sizes. */
	got = calloc(cap, sizeof(*got));
	assert_non_null(got);
	for (unsigned k = 0;; k++) {
		uint64_t len = (k % 3 + 1) * PG;

		if (t->ops->alloc(t, len, &got[ngot])) {
			if (len == PG)
				break;
			continue;
		}
		for (int i = 0; i < 3; i++)
			assert_false(overlaps(&got[ngot], &c[i]));
		assert_true(got[ngot].off >= DATA_OFF);
		assert_true(got[ngot].off + got[ngot].len <= SSD_SIZE);
		ngot++;
	}
	assert_int_equal(atomic_load(&t->used), SSD_SIZE - DATA_OFF);
	assert_int_equal(t->ops->alloc(t, PG, &bad), -ENOSPC);
	for (size_t i = 1; i < ngot; i++)
		assert_false(overlaps(&got[i - 1], &got[i]));

	/* A double free changes nothing. */
	t->ops->free(t, &got[0]);
	t->ops->free(t, &got[0]);
	assert_int_equal(atomic_load(&t->used),
			 SSD_SIZE - DATA_OFF - got[0].len);
	for (size_t i = 1; i < ngot; i++)
		t->ops->free(t, &got[i]);
	for (int i = 0; i < 3; i++)
		t->ops->free(t, &c[i]);
	assert_int_equal(atomic_load(&t->used), 0);
	assert_int_equal(t->ops->alloc(t, SSD_SIZE - DATA_OFF, &bad), 0);
	t->ops->free(t, &bad);
	free(got);
}

struct worker {
	struct kvfs_tier *t;
	unsigned id;
	int err;
};

static void *worker_fn(void *arg)
{
	struct worker *w = arg;
	struct kvfs_tier *t = w->t;
	struct kvfs_extent e[8];
	uint64_t gen[8];
	char *buf = aligned_alloc(PG, 8 * PG);
	char *want = aligned_alloc(PG, 8 * PG);
	unsigned seed = w->id + 1;
	int ne = 0;

	w->err = -ENOMEM;
	if (!buf || !want)
		goto out;
	for (ne = 0; ne < 8; ne++) {
		w->err = t->ops->alloc(t, (1 + (unsigned)ne % 8) * PG, &e[ne]);
		if (w->err)
			goto out;
		gen[ne] = 0;
	}
	for (int it = 0; it < 400; it++) {
		int i = rand_r(&seed) % 8;
		uint64_t tag = ((uint64_t)w->id << 32) | ((uint64_t)i << 24);

		if (rand_r(&seed) % 2 || !gen[i]) {
			gen[i]++;
			tfx_fill(buf, e[i].len, tag | gen[i]);
			w->err = t->ops->write(t, &e[i], 0, buf, e[i].len);
		} else {
			w->err = t->ops->read(t, &e[i], 0, buf, e[i].len);
			tfx_fill(want, e[i].len, tag | gen[i]);
			if (!w->err && memcmp(buf, want, e[i].len))
				w->err = -EILSEQ;
		}
		if (w->err)
			goto out;
	}
	w->err = 0;
out:
	while (ne--)
		t->ops->free(t, &e[ne]);
	free(buf);
	free(want);
	return NULL;
}

/* 4 threads on 2 rings: some must wait for a ring, all data stays right. */
static void test_ssd_concurrent(void **state)
{
	struct kvfs_tier *t = fx_tier(state);
	struct worker w[4];
	pthread_t th[4];

	for (unsigned i = 0; i < 4; i++) {
		w[i] = (struct worker){ .t = t, .id = i, .err = 1 };
		assert_int_equal(pthread_create(&th[i], NULL, worker_fn,
						&w[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 4; i++)
		assert_int_equal(w[i].err, 0);
	assert_int_equal(atomic_load(&t->used), 0);
}

/* ---- ssd, file only ---- */

static void test_ssd_persist(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = fx_tier(state);
	struct kvfs_extent e[16];
	char *buf = tfx_xalloc(8 * PG);
	char hdr[PG], got[PG];
	int fd;

	/* The file header below data_off is never touched by the tier. */
	memset(hdr, 0xab, sizeof(hdr));
	fd = open(f->path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, hdr, PG, DATA_OFF - PG), PG);

	for (int i = 0; i < 16; i++) {
		uint64_t len = (uint64_t)(i % 4 + 1) * 2 * PG;

		assert_int_equal(t->ops->alloc(t, len, &e[i]), 0);
		tfx_fill(buf, len, 500 + (uint64_t)i);
		assert_int_equal(t->ops->write(t, &e[i], 0, buf, len), 0);
	}
	assert_int_equal(t->ops->sync(t), 0);

	/* Offsets are file offsets: a plain pread sees the same bytes. */
	assert_int_equal(pread(fd, buf, e[3].len, (off_t)e[3].off),
			 (ssize_t)e[3].len);
	assert_true(tfx_same(buf, e[3].len, 503));

	kvfs_tier_free(t);
	f->t = NULL;
	assert_int_equal(ssd_open_fx(f), 0);
	t = f->t;
	assert_int_equal(atomic_load(&t->used), 0);
	for (int i = 0; i < 16; i++)
		assert_int_equal(t->ops->claim(t, &e[i]), 0);
	for (int i = 15; i >= 0; i--) {
		memset(buf, 0, e[i].len);
		assert_int_equal(t->ops->read(t, &e[i], 0, buf, e[i].len), 0);
		assert_true(tfx_same(buf, e[i].len, 500 + (uint64_t)i));
	}
	assert_int_equal(pread(fd, got, PG, DATA_OFF - PG), PG);
	assert_memory_equal(got, hdr, PG);
	close(fd);
	free(buf);
}

/* Reads past the end of a file that shrank under the tier fail with -EIO:
 * a read that stops short is continued and then gets nothing.
 */
static void test_ssd_truncated_eio(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = fx_tier(state);
	struct kvfs_extent e;
	struct kvfs_tier_io io[2];
	char *buf = tfx_xalloc(8 * PG);

	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	tfx_fill(buf, 8 * PG, 9);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 8 * PG), 0);
	assert_int_equal(truncate(f->path, (off_t)(e.off + 3 * PG)), 0);

	assert_int_equal(t->ops->read(t, &e, 0, buf, 8 * PG), -EIO);
	assert_int_equal(t->ops->read(t, &e, 4 * PG, buf, PG), -EIO);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 3 * PG), 0);
	assert_true(tfx_same(buf, 3 * PG, 9));

	io[0] = (struct kvfs_tier_io){ .ext = &e, .off = 0, .len = PG,
				       .buf = buf, .res = 1 };
	io[1] = (struct kvfs_tier_io){ .ext = &e, .off = 2 * PG, .len = 2 * PG,
				       .buf = buf + PG, .res = 1 };
	assert_int_equal(t->ops->readv(t, io, 2), -EIO);
	assert_int_equal(io[0].res, 0);
	assert_int_equal(io[1].res, -EIO);
	t->ops->free(t, &e);
	free(buf);
}

static void test_ssd_init_errors(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = NULL;

	fx_tier(state);
	assert_int_equal(kvfs_tier_ssd_init("/tmp/kvfs-no-such-file-here",
					    DATA_OFF, SSD_SIZE, 1, 0, &t),
			 -ENOENT);
	assert_int_equal(kvfs_tier_ssd_init(f->path, DATA_OFF, SSD_SIZE + 1, 1,
					    0, &t), -EINVAL);
	assert_int_equal(kvfs_tier_ssd_init(f->path, DATA_OFF + 1, SSD_SIZE, 1,
					    0, &t), -EINVAL);
	assert_int_equal(kvfs_tier_ssd_init(f->path, SSD_SIZE, SSD_SIZE, 1, 0,
					    &t), -EINVAL);
	assert_int_equal(kvfs_tier_ssd_init(f->path, DATA_OFF, SSD_SIZE, 0, 0,
					    &t), -EINVAL);
	assert_int_equal(kvfs_tier_ssd_init(NULL, DATA_OFF, SSD_SIZE, 1, 0,
					    &t), -EINVAL);
	assert_int_equal(kvfs_tier_ssd_init(f->path, DATA_OFF, SSD_SIZE, 1,
					    1u << 7, &t), -EINVAL);
	/* The file is smaller than the size asked for. */
	assert_int_equal(kvfs_tier_ssd_init(f->path, DATA_OFF, 2 * SSD_SIZE, 1,
					    0, &t), -EINVAL);
	/* A directory is no data file. */
	assert_true(kvfs_tier_ssd_init("/tmp", DATA_OFF, SSD_SIZE, 1, 0, &t)
		    < 0);
	assert_null(t);
	/* With NOSYNC, sync is a no-op that succeeds. */
	assert_int_equal(kvfs_tier_ssd_init(f->path, DATA_OFF, SSD_SIZE, 1,
					    KVFS_SSD_NOSYNC, &t), 0);
	assert_int_equal(t->ops->sync(t), 0);
	kvfs_tier_free(t);
}

/* One test over one backing, named so that failures say which. */
#define SSD_TEST(fn, fx) { #fn "/" #fx, fn, ssd_setup, ssd_teardown, &(fx) }

int main(void)
{
	const struct CMUnitTest tests[] = {
		SSD_TEST(test_ssd_basics, fx_mem),
		SSD_TEST(test_ssd_basics, fx_file),
		SSD_TEST(test_ssd_rw_many, fx_mem),
		SSD_TEST(test_ssd_rw_many, fx_file),
		SSD_TEST(test_ssd_readv, fx_mem),
		SSD_TEST(test_ssd_readv, fx_file),
		SSD_TEST(test_ssd_readv_large, fx_mem),
		SSD_TEST(test_ssd_readv_large, fx_file),
		SSD_TEST(test_ssd_readv_depth, fx_mem),
		SSD_TEST(test_ssd_readv_depth, fx_file),
		SSD_TEST(test_ssd_readv_cancel, fx_mem),
		SSD_TEST(test_ssd_readv_cancel, fx_file),
		SSD_TEST(test_ssd_readv_refuse_some, fx_mem),
		SSD_TEST(test_ssd_readv_refuse_some, fx_file),
		SSD_TEST(test_ssd_readv_deep, fx_mem),
		SSD_TEST(test_ssd_readv_deep, fx_file),
		SSD_TEST(test_ssd_unaligned, fx_mem),
		SSD_TEST(test_ssd_unaligned, fx_file),
		SSD_TEST(test_ssd_claim, fx_mem),
		SSD_TEST(test_ssd_claim, fx_file),
		SSD_TEST(test_ssd_concurrent, fx_mem),
		SSD_TEST(test_ssd_concurrent, fx_file),
		SSD_TEST(test_ssd_persist, fx_file),
		SSD_TEST(test_ssd_truncated_eio, fx_file),
		SSD_TEST(test_ssd_init_errors, fx_file),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
