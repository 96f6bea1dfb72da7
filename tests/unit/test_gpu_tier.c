/* SPDX-License-Identifier: MIT */
/*
 * The device tier, one suite for both backends: shm by default, and
 * KVFS_TEST_GPU=cuda runs the same tests against cuda (where a missing
 * device is a failure, not a skip).
 *
 * Clients are this program run again (/proc/self/exe) with a role, so
 * that a cuda client starts with its own CUDA context like a real engine:
 *   --client MEM OFF LEN SEED   map the pool as a client does (read-only
 *                               shm, or the IPC handle) and check bytes;
 *                               exit 0 same, 1 different, 2 error
 *   --peer-server RFD WFD SIZE  (cuda) own device memory a test uses as a
 *                               peer, exported with an IPC handle, and
 *                               fill or fetch it on request
 * shm peers need no server: the test creates and maps the object itself.
 *
 * This file holds the base and device ops and main; gpu_tier_i.h names
 * the suite's other files.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef KVFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "tier/tier.h"
#include "meta/kvfs_ctl.h"
#include "gpu/gpu.h"
#include "meta/log.h"
#include "tests/unit/gpu_tier_i.h"

/* ---- base ops ---- */

static void test_alloc(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e[16], x;
	uint64_t each = POOL_CAP / 16;

	assert_int_equal(t->id, KVFS_TIER_GPU);
	assert_int_equal(t->capacity, POOL_CAP);
	assert_int_equal(t->align, PG);
	assert_int_equal(t->ops->alloc(t, 0, &x), -EINVAL);
	assert_int_equal(t->ops->alloc(t, POOL_CAP + 1, &x), -ENOSPC);
	assert_int_equal(t->ops->alloc(t, UINT64_MAX, &x), -ENOSPC);

	assert_int_equal(t->ops->alloc(t, 1, &e[0]), 0);
	assert_int_equal(e[0].len, PG);
	assert_int_equal(gt_ld(&t->used), PG);
	t->ops->free(t, &e[0]);
	assert_int_equal(gt_ld(&t->used), 0);

	for (int i = 0; i < 16; i++) {
		assert_int_equal(t->ops->alloc(t, each - 100, &e[i]), 0);
		assert_int_equal(e[i].len, each);
		assert_true(e[i].off + e[i].len <= POOL_CAP);
		if (gt_backend == B_SHM) {
			assert_non_null(e[i].ptr);
			assert_ptr_equal(t->ops->map(t, &e[i]), e[i].ptr);
		} else {
			assert_null(e[i].ptr);
			assert_null(t->ops->map(t, &e[i]));
		}
	}
	assert_int_equal(gt_ld(&t->used), POOL_CAP);
	assert_int_equal(t->ops->alloc(t, 1, &x), -ENOSPC);

	/* A double free is logged and changes nothing. */
	t->ops->free(t, &e[5]);
	assert_int_equal(gt_ld(&t->used), POOL_CAP - each);
	t->ops->free(t, &e[5]);
	assert_int_equal(gt_ld(&t->used), POOL_CAP - each);
	assert_int_equal(t->ops->alloc(t, each + 1, &x), -ENOSPC);

	/* Claim: used ranges, the pool's end and free ranges. */
	assert_int_equal(t->ops->claim(t, &e[4]), -EEXIST);
	x.off = POOL_CAP;
	x.len = PG;
	assert_int_equal(t->ops->claim(t, &x), -EINVAL);
	assert_int_equal(t->ops->claim(t, &e[5]), 0);
	assert_int_equal(gt_ld(&t->used), POOL_CAP);
	t->ops->free(t, &e[5]);
	assert_int_equal(t->ops->alloc(t, each, &x), 0);
	assert_int_equal(x.off, e[5].off);
	e[5] = x;
	assert_int_equal(t->ops->sync(t), 0);
	for (int i = 0; i < 16; i++)
		t->ops->free(t, &e[i]);
	assert_int_equal(gt_ld(&t->used), 0);
	assert_int_equal(t->ops->alloc(t, POOL_CAP, &x), 0);
	t->ops->free(t, &x);
}

static void test_write_read(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	enum { N = 64 };
	struct kvfs_extent e[N];
	struct kvfs_tier_io io[N + 1];
	uint64_t len[N], w0 = gt_ld(&t->st.writes), b0 = gt_ld(&t->st.bytes_written);
	uint64_t r0, rb0, sum = 0;
	unsigned char *buf = gt_xmalloc(64 * 1024), *out[N];

	for (int i = 0; i < N; i++) {
		len[i] = 1 + (uint64_t)i * 997 % (48 * 1024);
		assert_int_equal(t->ops->alloc(t, len[i], &e[i]), 0);
		gt_pat(buf, len[i], 100 + i);
		assert_int_equal(t->ops->write(t, &e[i], 0, buf, len[i]), 0);
		sum += len[i];
	}
	assert_int_equal(gt_ld(&t->st.writes) - w0, N);
	assert_int_equal(gt_ld(&t->st.bytes_written) - b0, sum);

	for (int i = 0; i < N; i++) {
		memset(buf, 0, len[i]);
		assert_int_equal(t->ops->read(t, &e[i], 0, buf, len[i]), 0);
		assert_true(gt_is_pat(buf, len[i], 100 + i));
	}
	/* Unaligned pieces in the middle. */
	gt_pat(buf, 1000, 7);
	assert_int_equal(t->ops->write(t, &e[N - 1], 333, buf, 1000), 0);
	memset(buf, 0, 1000);
	assert_int_equal(t->ops->read(t, &e[N - 1], 333, buf, 1000), 0);
	assert_true(gt_is_pat(buf, 1000, 7));
	gt_pat(buf, len[N - 1], 100 + N - 1);
	gt_pat(buf + 333, 1000, 7);
	assert_int_equal(t->ops->write(t, &e[N - 1], 0, buf, len[N - 1]), 0);
	gt_pat(buf, len[N - 1], 100 + N - 1);
	assert_int_equal(t->ops->write(t, &e[N - 1], 0, buf, len[N - 1]), 0);

	/* A batch, with one bad range that must not stop the others. */
	r0 = gt_ld(&t->st.reads);
	rb0 = gt_ld(&t->st.bytes_read);
	for (int i = 0; i < N; i++) {
		out[i] = gt_xmalloc(len[i]);
		memset(out[i], 0, len[i]);
		io[i] = (struct kvfs_tier_io){ .ext = &e[i], .off = 0,
					       .len = len[i], .buf = out[i],
					       .res = 1 };
	}
	io[N] = (struct kvfs_tier_io){ .ext = &e[0], .off = e[0].len,
				       .len = 1, .buf = buf, .res = 1 };
	assert_int_equal(t->ops->readv(t, io, N + 1), -EINVAL);
	assert_int_equal(io[N].res, -EINVAL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(io[i].res, 0);
		assert_true(gt_is_pat(out[i], len[i], 100 + i));
		free(out[i]);
	}
	assert_int_equal(gt_ld(&t->st.reads) - r0, N);
	assert_int_equal(gt_ld(&t->st.bytes_read) - rb0, sum);
	assert_int_equal(t->ops->readv(t, io, 0), 0);

	/* Length 0 is a no-op; ranges leaving the extent are refused. */
	assert_int_equal(t->ops->write(t, &e[0], e[0].len, buf, 0), 0);
	assert_int_equal(t->ops->read(t, &e[0], e[0].len, NULL, 0), 0);
	assert_int_equal(t->ops->write(t, &e[0], e[0].len - 1, buf, 2),
			 -EINVAL);
	assert_int_equal(t->ops->read(t, &e[0], UINT64_MAX, buf, 2), -EINVAL);
	assert_int_equal(t->ops->read(t, &e[0], 1, buf, UINT64_MAX), -EINVAL);
	assert_int_equal(t->ops->read(t, &e[0], 0, NULL, 1), -EINVAL);
	for (int i = 0; i < N; i++)
		t->ops->free(t, &e[i]);
	free(buf);
}

/* A forged extent reaching past the pool is refused by every op. */
static void test_forged_extent(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent bad = { .off = POOL_CAP - PG, .len = 2 * PG };
	struct kvfs_extent wrap = { .off = UINT64_MAX - PG + 1, .len = PG };
	struct kvfs_gpu_xfer x = { .pool = &bad, .host = NULL, .len = 1 };
	char buf[16] = "x";

	assert_int_equal(t->ops->write(t, &bad, 0, buf, 1), -EINVAL);
	assert_int_equal(t->ops->read(t, &wrap, 0, buf, 1), -EINVAL);
	x.host = buf;
	assert_int_equal(f->g->upload(t, &x, 1), -EINVAL);
	x.pool = &wrap;
	assert_int_equal(f->g->upload(t, &x, 1), -EINVAL);
	assert_null(t->ops->map(t, &bad));
}

/* Copy @len bytes between host memory and the address extent_addr gave:
 * a plain memcpy on shm, cudaMemcpy on cuda (device memory).
 */
static void addr_put(void *dst, const void *src, uint64_t len)
{
	if (gt_backend == B_SHM) {
		memcpy(dst, src, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	assert_int_equal(cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice),
			 cudaSuccess);
#else
	fail_msg("cuda backend in a build without CUDA");
#endif
}

static void addr_get(void *dst, const void *src, uint64_t len)
{
	if (gt_backend == B_SHM) {
		memcpy(dst, src, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	assert_int_equal(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost),
			 cudaSuccess);
#else
	fail_msg("cuda backend in a build without CUDA");
#endif
}

/*
 * extent_addr: the pool's own address of an extent (shm: the host
 * mapping, cuda: a device pointer). What is written through it is what
 * the tier's reads and clients see, and the reverse; extents keep their
 * distance; anything outside the pool is refused.
 */
static void test_extent_addr(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e[2], bad = { .off = POOL_CAP - PG, .len = 2 * PG };
	struct kvfs_extent wrap = { .off = UINT64_MAX - PG + 1, .len = PG };
	struct kvfs_extent last = { .off = POOL_CAP - PG, .len = PG };
	struct kvfs_gpu_xfer x;
	unsigned char *src = gt_xmalloc(8 * PG), *buf = gt_xmalloc(8 * PG);
	uint64_t w0 = gt_ld(&t->st.writes);
	void *a[2], *p = &buf;

	assert_non_null(f->g->extent_addr);
	assert_int_equal(t->ops->alloc(t, 3 * PG, &e[0]), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e[1]), 0);
	for (int k = 0; k < 2; k++) {
		a[k] = NULL;
		assert_int_equal(f->g->extent_addr(t, &e[k], &a[k]), 0);
		assert_non_null(a[k]);
	}
	/* one allocation: the addresses are as far apart as the offsets */
	assert_int_equal((intptr_t)((unsigned char *)a[1] -
				    (unsigned char *)a[0]),
			 (intptr_t)(e[1].off - e[0].off));

	/* written through the address, seen by the tier's read */
	gt_pat(src, 8 * PG, 77);
	addr_put(a[1], src, 8 * PG);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->read(t, &e[1], 0, buf, 8 * PG), 0);
	assert_true(gt_is_pat(buf, 8 * PG, 77));
	/* no copy of the tier's was counted */
	assert_int_equal(gt_ld(&t->st.writes), w0);

	/* uploaded, seen through the address at the same offset */
	gt_pat(src, 2 * PG, 78);
	x = (struct kvfs_gpu_xfer){ .pool = &e[0], .host = src, .off = PG,
				    .len = 2 * PG };
	assert_int_equal(f->g->upload(t, &x, 1), 0);
	memset(buf, 0, 2 * PG);
	addr_get(buf, (unsigned char *)a[0] + PG, 2 * PG);
	assert_true(gt_is_pat(buf, 2 * PG, 78));
	/* the neighbour is untouched */
	assert_int_equal(t->ops->read(t, &e[1], 0, buf, 8 * PG), 0);
	assert_true(gt_is_pat(buf, 8 * PG, 77));

	/* the last page of the pool is inside it */
	assert_int_equal(f->g->extent_addr(t, &last, &a[0]), 0);
	assert_non_null(a[0]);

	/* outside the pool, or no arguments: -EINVAL, the address cleared */
	assert_int_equal(f->g->extent_addr(t, &bad, &p), -EINVAL);
	assert_null(p);
	p = &buf;
	assert_int_equal(f->g->extent_addr(t, &wrap, &p), -EINVAL);
	assert_null(p);
	p = &buf;
	assert_int_equal(f->g->extent_addr(t, NULL, &p), -EINVAL);
	assert_null(p);
	assert_int_equal(f->g->extent_addr(t, &e[0], NULL), -EINVAL);

	for (int k = 0; k < 2; k++)
		t->ops->free(t, &e[k]);
	free(src);
	free(buf);
}

static void test_upload(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	enum { N = 200 };
	struct kvfs_extent e[4];
	struct kvfs_gpu_xfer x[N + 1];
	unsigned char *src[N], *buf = gt_xmalloc(PG);
	uint64_t w0 = gt_ld(&t->st.writes), b0 = gt_ld(&t->st.bytes_written);
	uint64_t sum = 0;

	for (int k = 0; k < 4; k++)
		assert_int_equal(t->ops->alloc(t, 64 * PG, &e[k]), 0);
	/* 50 pieces of 1 page (minus i bytes) into each extent, in an order
	 * that interleaves the extents.
	 */
	for (int i = 0; i < N; i++) {
		uint64_t l = PG - (uint64_t)(i % 50);

		src[i] = gt_xmalloc(l);
		gt_pat(src[i], l, 1000 + i);
		x[i] = (struct kvfs_gpu_xfer){ .pool = &e[i % 4],
					       .host = src[i],
					       .off = (uint64_t)(i / 4) * PG,
					       .len = l };
		sum += l;
	}
	assert_int_equal(f->g->upload(t, x, N), 0);
	assert_int_equal(gt_ld(&t->st.writes) - w0, N);
	assert_int_equal(gt_ld(&t->st.bytes_written) - b0, sum);
	for (int i = 0; i < N; i++) {
		memset(buf, 0, PG);
		assert_int_equal(t->ops->read(t, &e[i % 4],
					      (uint64_t)(i / 4) * PG, buf,
					      x[i].len), 0);
		assert_true(gt_is_pat(buf, x[i].len, 1000 + i));
	}

	/* One bad transfer at the end: nothing of the batch is copied. */
	for (int i = 0; i < N; i++)
		gt_pat(src[i], x[i].len, 5000 + i);
	x[N] = (struct kvfs_gpu_xfer){ .pool = &e[0], .host = buf,
				       .off = 64 * PG - 10, .len = 11 };
	w0 = gt_ld(&t->st.writes);
	assert_int_equal(f->g->upload(t, x, N + 1), -EINVAL);
	assert_int_equal(gt_ld(&t->st.writes), w0);
	x[N].off = 0;
	x[N].host = NULL;
	assert_int_equal(f->g->upload(t, x, N + 1), -EINVAL);
	x[N].host = buf;
	x[N].pool = NULL;
	assert_int_equal(f->g->upload(t, x, N + 1), -EINVAL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(t->ops->read(t, &e[i % 4],
					      (uint64_t)(i / 4) * PG, buf,
					      x[i].len), 0);
		assert_true(gt_is_pat(buf, x[i].len, 1000 + i));
		free(src[i]);
	}
	assert_int_equal(f->g->upload(t, NULL, 0), 0);
	assert_int_equal(f->g->upload(t, NULL, 1), -EINVAL);
	for (int k = 0; k < 4; k++)
		t->ops->free(t, &e[k]);
	free(buf);
}

/*
 * More than the staging buffers hold (cuda: 4 streams x 4 x 4 MiB), in
 * pieces of odd sizes that straddle chunk boundaries, some touching in
 * the pool (one copy) and some not.
 */
static void test_large_batch(void **state)
{
	enum { N = 700 };
	const uint64_t total = 40 * MiB;
	struct kvfs_tier *t;
	const struct kvfs_gpu_ops *g;
	struct kvfs_extent e;
	struct kvfs_gpu_xfer *x;
	struct kvfs_tier_io *io;
	unsigned char *src, *dst;
	struct kvfs_gpu_peer *p;
	struct gt_peer tp;
	uint64_t off = 0;

	assert_int_equal(gt_tier_make(64 * MiB, &t), 0);
	x = calloc(N, sizeof(*x));
	io = calloc(N, sizeof(*io));
	src = gt_xmalloc(total);
	dst = gt_xmalloc(total);
	assert_non_null(x);
	assert_non_null(io);
	g = kvfs_gpu_ops_of(t);
	assert_int_equal(t->ops->alloc(t, total + MiB, &e), 0);
	gt_pat(src, total, 77);
	for (int i = 0; i < N; i++) {
		uint64_t l = total / N - 7 + (uint64_t)(i % 13);

		if (i == N - 1)
			l = total - off;
		/* Runs of three pieces touch in the pool, then a gap. */
		x[i] = (struct kvfs_gpu_xfer){ .pool = &e, .host = src + off,
					       .off = off + (uint64_t)(i / 3) *
							    100,
					       .peer_off = off, .len = l };
		io[i] = (struct kvfs_tier_io){ .ext = &e, .off = x[i].off,
					       .len = l, .buf = dst + off };
		off += l;
	}
	assert_int_equal(off, total);
	assert_int_equal(g->upload(t, x, N), 0);
	memset(dst, 0, total);
	assert_int_equal(t->ops->readv(t, io, N), 0);
	assert_true(gt_is_pat(dst, total, 77));

	/* The same through a peer: host -> peer, then peer -> host. */
	assert_int_equal(gt_peer_create(&tp, total), 0);
	assert_int_equal(g->peer_open(t, &tp.m, &p), 0);
	for (int i = 0; i < N; i++)
		x[i].pool = NULL;
	assert_int_equal(g->peer_write(t, p, x, N), 0);
	assert_true(gt_peer_is(&tp, 0, total, 77));
	memset(src, 0, total);
	assert_int_equal(g->peer_read(t, p, x, N), 0);
	assert_true(gt_is_pat(src, total, 77));
	g->peer_close(t, p);
	gt_peer_destroy(&tp);
	t->ops->free(t, &e);
	kvfs_tier_free(t);
	gt_peer_reap();
	free(x);
	free(io);
	free(src);
	free(dst);
}

/* ---- device ops ---- */

static void test_describe(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_ctl_mem m;
	static const uint8_t zero[sizeof(m.ipc)];

	memset(&m, 0xa5, sizeof(m));
	f->g->describe(f->t, &m);
	assert_int_equal(m.size, POOL_CAP);
	if (gt_backend == B_SHM) {
		assert_int_equal(m.backend, KVFS_CTL_BACKEND_SHM);
		assert_int_equal(m.device, 0);
		assert_int_equal(m.shm_name[0], '/');
		assert_non_null(memchr(m.shm_name, 0, sizeof(m.shm_name)));
		assert_non_null(strstr(m.shm_name, "/kvfs-test"));
		assert_memory_equal(m.ipc, zero, sizeof(zero));
	} else {
		assert_int_equal(m.backend, KVFS_CTL_BACKEND_CUDA);
		assert_int_equal(m.device, 0);
		assert_int_equal(m.shm_name[0], 0);
		assert_memory_not_equal(m.ipc, zero, sizeof(zero));
	}
	assert_ptr_equal(kvfs_gpu_ops_of(f->t), f->g);
}

static void test_ops_of(void **state)
{
	struct kvfs_tier *d;

	assert_null(kvfs_gpu_ops_of(NULL));
	assert_int_equal(kvfs_tier_dram_init(1 * MiB, &d), 0);
	assert_null(kvfs_gpu_ops_of(d));
	kvfs_tier_free(d);
}

/* A client maps the pool by what describe() says and sees the bytes. */
static void test_client_maps_pool(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e[2];
	struct kvfs_ctl_mem m;
	unsigned char *buf = gt_xmalloc(3 * PG);
	char hex[2 * sizeof(m) + 1], offs[32], lens[32];
	char *args[] = { "x", "--client", hex, offs, lens, "31", NULL };

	assert_int_equal(t->ops->alloc(t, PG, &e[0]), 0);
	assert_int_equal(t->ops->alloc(t, 3 * PG, &e[1]), 0);
	gt_pat(buf, 3 * PG - 5, 31);
	assert_int_equal(t->ops->write(t, &e[1], 5, buf, 3 * PG - 5), 0);
	f->g->describe(t, &m);
	gt_hex_enc(&m, sizeof(m), hex);
	snprintf(offs, sizeof(offs), "%" PRIu64, e[1].off + 5);
	snprintf(lens, sizeof(lens), "%" PRIu64, (uint64_t)3 * PG - 5);
	assert_int_equal(gt_run_self(args), 0);
	/* The check can fail: another seed differs. */
	args[5] = "32";
	assert_int_equal(gt_run_self(args), 1);
	t->ops->free(t, &e[0]);
	t->ops->free(t, &e[1]);
	free(buf);
}

static void test_peer_open(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct gt_peer tp;
	struct kvfs_ctl_mem m;
	struct kvfs_gpu_peer *p = NULL, *q = NULL;

	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(f->g->peer_size(p), PEER_SIZE);
	/* A smaller view of the same memory is fine. */
	m = tp.m;
	m.size = PG;
	assert_int_equal(f->g->peer_open(t, &m, &q), 0);
	assert_int_equal(f->g->peer_size(q), PG);
	f->g->peer_close(t, q);
	f->g->peer_close(t, p);
	f->g->peer_close(t, NULL);

	assert_int_equal(f->g->peer_open(t, NULL, &p), -EINVAL);
	m = tp.m;
	m.backend = gt_backend == B_SHM ? KVFS_CTL_BACKEND_CUDA :
				       KVFS_CTL_BACKEND_SHM;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m.backend = 0;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m.backend = 77;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m = tp.m;
	m.size = 0;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	/* More than the memory has. */
	m = tp.m;
	m.size = PEER_SIZE + PG;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m.size = UINT64_MAX;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);

	if (gt_backend == B_SHM) {
		static const char *bad[] = { "", "/", "noslash", "/a/b",
					     "//x", "x/" };

		m = tp.m;
		strcpy(m.shm_name, "/kvfs-no-such-peer");
		assert_int_equal(f->g->peer_open(t, &m, &p), -ENOENT);
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			m = tp.m;
			strcpy(m.shm_name, bad[i]);
			assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		}
		m = tp.m;
		memset(m.shm_name + 1, 'a', sizeof(m.shm_name) - 1);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		/* The pool itself is no peer. */
		f->g->describe(t, &m);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	} else {
		m = tp.m;
		m.device = 7;
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		m = tp.m;
		for (size_t i = 0; i < sizeof(m.ipc); i++)
			m.ipc[i] = (uint8_t)(i * 37 + 11);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		f->g->describe(t, &m);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	}
	/* After all that, the good handle still opens. */
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	f->g->peer_close(t, p);
	gt_peer_destroy(&tp);
}

static void test_peer_write(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e;
	struct kvfs_gpu_peer *p;
	struct gt_peer tp;
	unsigned char *h1 = gt_xmalloc(10000), *h2 = gt_xmalloc(PG);
	unsigned char *z = calloc(1, PEER_SIZE);
	struct kvfs_gpu_xfer x[5];
	uint64_t r0, rb0;

	assert_non_null(z);
	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	gt_peer_fill(&tp, 0, z, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	gt_pat(z, 8 * PG, 11);
	assert_int_equal(t->ops->write(t, &e, 0, z, 8 * PG), 0);
	gt_pat(h1, 10000, 12);
	gt_pat(h2, PG, 13);

	/* From the pool, from host memory, mixed, to scattered places. */
	x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = 4 * PG };
	x[1] = (struct kvfs_gpu_xfer){ .host = h1, .peer_off = 100000,
				       .len = 10000 };
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 4 * PG + 3,
				       .peer_off = PEER_SIZE - (4 * PG - 3),
				       .len = 4 * PG - 3 };
	x[3] = (struct kvfs_gpu_xfer){ .host = h2, .peer_off = 50 * PG,
				       .len = PG };
	x[4] = (struct kvfs_gpu_xfer){ .host = NULL, .peer_off = 7,
				       .len = 0 };
	r0 = gt_ld(&t->st.reads);
	rb0 = gt_ld(&t->st.bytes_read);
	assert_int_equal(f->g->peer_write(t, p, x, 5), 0);
	assert_int_equal(gt_ld(&t->st.reads) - r0, 5);
	assert_int_equal(gt_ld(&t->st.bytes_read) - rb0,
			 4 * PG + 10000 + 4 * PG - 3 + PG);

	gt_peer_get(&tp, 0, z, PEER_SIZE);
	{
		unsigned char *want = calloc(1, PEER_SIZE);
		unsigned char *pool = gt_xmalloc(8 * PG);

		assert_non_null(want);
		gt_pat(pool, 8 * PG, 11);
		memcpy(want, pool, 4 * PG);
		memcpy(want + 100000, h1, 10000);
		memcpy(want + PEER_SIZE - (4 * PG - 3), pool + 4 * PG + 3,
		       4 * PG - 3);
		memcpy(want + 50 * PG, h2, PG);
		assert_memory_equal(z, want, PEER_SIZE);
		free(want);
		free(pool);
	}
	assert_int_equal(f->g->peer_write(t, p, x, 0), 0);
	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	gt_peer_destroy(&tp);
	free(h1);
	free(h2);
	free(z);
}

static void test_peer_read(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e;
	struct kvfs_gpu_peer *p;
	struct gt_peer tp;
	unsigned char *src = gt_xmalloc(PEER_SIZE), *h = gt_xmalloc(3 * PG + 1);
	unsigned char *buf = gt_xmalloc(8 * PG);
	struct kvfs_gpu_xfer x[3];
	uint64_t w0, wb0;

	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	gt_pat(src, PEER_SIZE, 21);
	gt_peer_fill(&tp, 0, src, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 8 * PG), 0);
	memset(h, 0, 3 * PG + 1);

	x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG,
				       .peer_off = 12345, .len = 5 * PG };
	x[1] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = PEER_SIZE -
							    (3 * PG + 1),
				       .len = 3 * PG + 1 };
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 7 * PG,
				       .peer_off = 0, .len = 10 };
	w0 = gt_ld(&t->st.writes);
	wb0 = gt_ld(&t->st.bytes_written);
	assert_int_equal(f->g->peer_read(t, p, x, 3), 0);
	assert_int_equal(gt_ld(&t->st.writes) - w0, 3);
	assert_int_equal(gt_ld(&t->st.bytes_written) - wb0,
			 5 * PG + 3 * PG + 1 + 10);
	assert_memory_equal(h, src + PEER_SIZE - (3 * PG + 1), 3 * PG + 1);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 8 * PG), 0);
	{
		unsigned char *want = calloc(1, 8 * PG);

		assert_non_null(want);
		memcpy(want + PG, src + 12345, 5 * PG);
		memcpy(want + 7 * PG, src, 10);
		assert_memory_equal(buf, want, 8 * PG);
		free(want);
	}
	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	gt_peer_destroy(&tp);
	free(src);
	free(h);
	free(buf);
}

/* Every bad range refuses the whole batch before a byte moves. */
static void test_out_of_range(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e, forged;
	struct kvfs_gpu_peer *p, *other;
	struct kvfs_tier *t2;
	struct gt_peer tp;
	unsigned char *z = calloc(1, PEER_SIZE), *h = gt_xmalloc(2 * PG);
	unsigned char *buf = gt_xmalloc(4 * PG);
	struct kvfs_gpu_xfer good, bad[7], x[2];
	uint64_t r0, w0;

	assert_non_null(z);
	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	gt_peer_fill(&tp, 0, z, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 4 * PG, &e), 0);
	gt_pat(buf, 4 * PG, 41);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 4 * PG), 0);
	gt_pat(h, 2 * PG, 42);
	forged = (struct kvfs_extent){ .off = POOL_CAP, .len = PG };

	good = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = 2 * PG };
	bad[0] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = PEER_SIZE - 1,
					 .len = 2 };
	bad[1] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = UINT64_MAX,
					 .len = 1 };
	bad[2] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = 1,
					 .len = UINT64_MAX };
	bad[3] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 3 * PG + 1,
					 .peer_off = 0, .len = PG };
	bad[4] = (struct kvfs_gpu_xfer){ .pool = &forged, .off = 0,
					 .peer_off = 0, .len = 1 };
	bad[5] = (struct kvfs_gpu_xfer){ .host = NULL, .peer_off = 0,
					 .len = 1 };
	bad[6] = (struct kvfs_gpu_xfer){ .pool = &e, .off = UINT64_MAX,
					 .peer_off = 0, .len = 2 };
	r0 = gt_ld(&t->st.reads);
	w0 = gt_ld(&t->st.writes);
	for (int i = 0; i < 7; i++) {
		x[0] = good;
		x[1] = bad[i];
		assert_int_equal(f->g->peer_write(t, p, x, 2), -EINVAL);
		/* peer_read: the good one would land in the pool */
		x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0,
					       .peer_off = 100, .len = 2 * PG };
		assert_int_equal(f->g->peer_read(t, p, x, 2), -EINVAL);
	}
	x[0] = good;
	x[1] = bad[0];
	x[1].peer_off = PEER_SIZE - 2;
	assert_int_equal(f->g->peer_write(t, p, x, 2), 0); /* just fits */
	assert_int_equal(gt_ld(&t->st.reads) - r0, 2);
	assert_int_equal(gt_ld(&t->st.writes), w0);
	assert_int_equal(f->g->peer_write(t, p, NULL, 1), -EINVAL);
	assert_int_equal(f->g->peer_write(t, NULL, &good, 1), -EINVAL);

	/* Only the last successful batch reached the peer or the pool. */
	memset(z, 0, PEER_SIZE);
	memcpy(z, buf, 2 * PG);
	memcpy(z + PEER_SIZE - 2, h, 2);
	{
		unsigned char *got = gt_xmalloc(PEER_SIZE);

		gt_peer_get(&tp, 0, got, PEER_SIZE);
		assert_memory_equal(got, z, PEER_SIZE);
		free(got);
	}
	memset(buf, 0, 4 * PG);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 4 * PG), 0);
	assert_true(gt_is_pat(buf, 4 * PG, 41));

	/* A peer opened by another tier is refused. */
	assert_int_equal(gt_tier_make(POOL_CAP, &t2), 0);
	assert_int_equal(kvfs_gpu_ops_of(t2)->peer_open(t2, &tp.m, &other), 0);
	x[0] = good;
	assert_int_equal(f->g->peer_write(t, other, x, 1), -EINVAL);
	kvfs_gpu_ops_of(t2)->peer_close(t2, other);
	kvfs_tier_free(t2);

	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	gt_peer_destroy(&tp);
	free(z);
	free(h);
	free(buf);
}

int main(int argc, char **argv)
{
	const char *env = getenv("KVFS_TEST_GPU");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shm_init_args),
		cmocka_unit_test(test_owner_pools),
		cmocka_unit_test(test_shm_one_owner_keeps_pages),
		cmocka_unit_test(test_shm_sweep),
		cmocka_unit_test(test_cuda_absent),
		cmocka_unit_test(test_cuda_init_args),
		cmocka_unit_test(test_ops_of),
		cmocka_unit_test_setup_teardown(test_alloc, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_write_read, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_forged_extent, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_upload, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_extent_addr, gt_setup,
						gt_teardown),
		cmocka_unit_test(test_large_batch),
		cmocka_unit_test_setup_teardown(test_describe, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_client_maps_pool, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_peer_open, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_peer_write, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_peer_read, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_out_of_range, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_overlap, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_threads, gt_setup, gt_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_handle_cache, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_host_register, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_direct_copies, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_shm_register_noop, gt_setup,
						gt_teardown),
		cmocka_unit_test_setup_teardown(test_mixed_batches, gt_setup,
						gt_teardown),
	};

	if (argc == 6 && !strcmp(argv[1], "--client"))
		return gt_client_main(argv);
	if (argc == 5 && !strcmp(argv[1], "--peer-server"))
		return gt_peer_server_main(argv);
	if (env && !strcmp(env, "cuda")) {
		gt_backend = B_CUDA;
	} else if (env && *env && strcmp(env, "shm")) {
		fprintf(stderr, "KVFS_TEST_GPU=%s: want shm or cuda\n", env);
		return 1;
	}
	/* A dead peer server must fail a test, not kill the program. */
	signal(SIGPIPE, SIG_IGN);
	kvfs_log_set_level(KVFS_LOG_WARN);
	return cmocka_run_group_tests_name(gt_backend == B_CUDA ? "gpu_tier/cuda" :
							       "gpu_tier/shm",
					   tests, NULL, NULL);
}
