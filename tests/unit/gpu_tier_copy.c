/* SPDX-License-Identifier: MIT */
/*
 * The device tier's copy paths (gpu_tier_i.h): registered host memory and
 * direct copies, batches that mix them, overlapping destinations, and
 * several threads copying at once.
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

/* ---- registered host memory ---- */

/*
 * host_register's argument checks, the same on both backends; on cuda the
 * bookkeeping of regions, and the runtime sees the memory as pinned.
 */
void test_host_register(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *d;
	unsigned char *base;
	void *b;
	uint64_t len;

	assert_int_equal(kvfs_tier_dram_init_flags(4 * MiB, KVFS_DRAM_ARENA,
						   &d), 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	base = b;
	assert_int_equal(f->g->host_register(f->t, NULL, PG), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base, 0), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base, len), 0);
	if (gt_backend == B_SHM) {
		/* Nothing to pin: every call is a no-op. */
		assert_int_equal(f->g->host_register(f->t, base, len), 0);
		assert_int_equal(f->g->host_unregister(f->t, base), 0);
		assert_int_equal(f->g->host_unregister(f->t, base + PG), 0);
		kvfs_tier_free(d);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	{
		struct cudaPointerAttributes a;

		assert_int_equal(cudaPointerGetAttributes(&a, base + len / 2),
				 cudaSuccess);
		assert_int_equal(a.type, cudaMemoryTypeHost);
	}
#endif
	/* The same range, a part of it, or a range across its end. */
	assert_int_equal(f->g->host_register(f->t, base, len), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base + PG, PG), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base + len - PG, 2 * PG),
			 -EINVAL);
	assert_int_equal(f->g->host_unregister(f->t, base + PG), -ENOENT);
	assert_int_equal(f->g->host_unregister(f->t, base), 0);
	assert_int_equal(f->g->host_unregister(f->t, base), -ENOENT);
#ifdef KVFS_HAVE_CUDA
	{
		struct cudaPointerAttributes a;

		assert_int_equal(cudaPointerGetAttributes(&a, base),
				 cudaSuccess);
		assert_int_equal(a.type, cudaMemoryTypeUnregistered);
	}
#endif
	/* Registered again, then left for the tier's release to undo. */
	assert_int_equal(f->g->host_register(f->t, base, len), 0);
	kvfs_tier_free(f->t);
	f->t = NULL;
	kvfs_tier_free(d);
}

/*
 * cuda: transfers whose host side is registered go direct, the others are
 * staged, in one batch, with every byte where it belongs. The sources are
 * overwritten as soon as each call returns: the stand-in defers copies,
 * so a call that returned before its copies ran shows here as wrong bytes.
 */
void test_direct_copies(void **state)
{
	enum { N = 24 };
	const uint64_t piece = 1536 * 1024; /* 1.5 MiB: slots are 4 MiB */
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t, *d;
	struct kvfs_extent dx, px;
	struct kvfs_gpu_xfer x[N];
	struct kvfs_tier_io io[N];
	unsigned char *arena, *heap, *out;
	struct kvfs_gpu_peer *p;
	struct gt_peer tp;
	uint64_t d0, s0, w0, want_d = 0, want_s = 0;
	void *b;
	uint64_t len;

	if (gt_backend != B_CUDA) {
		print_message("cuda-only test skipped (KVFS_TEST_GPU=cuda)\n");
		skip();
	}
	kvfs_tier_free(f->t);
	assert_int_equal(gt_tier_make(2 * N * piece, &f->t), 0);
	t = f->t;
	assert_int_equal(kvfs_tier_dram_init_flags(48 * MiB, KVFS_DRAM_ARENA,
						   &d), 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	assert_int_equal(f->g->host_register(t, b, len), 0);
	assert_int_equal(d->ops->alloc(d, N * piece, &dx), 0);
	assert_int_equal(t->ops->alloc(t, 2 * N * piece, &px), 0);
	arena = dx.ptr;
	heap = gt_xmalloc(N * piece);
	out = gt_xmalloc(2 * N * piece);

	/*
	 * Even pieces from the arena, odd ones from the heap; runs of two
	 * arena pieces continue each other in both memories (one copy),
	 * then the order jumps; the staged ones fill the ring more than
	 * once.
	 */
	for (int i = 0; i < N; i++) {
		bool reg = i % 2 == 0;
		unsigned char *h = (reg ? arena : heap) + (uint64_t)i * piece;
		uint64_t l = reg ? piece : piece - 3 * (uint64_t)i;

		gt_pat(h, l, 300 + i);
		x[i] = (struct kvfs_gpu_xfer){ .pool = &px, .host = h,
					       .off = (uint64_t)i * piece,
					       .peer_off = (uint64_t)i * piece,
					       .len = l };
		if (reg)
			want_d += l;
		else
			want_s += l;
	}
	d0 = gt_ld(&t->st.direct_bytes);
	s0 = gt_ld(&t->st.staged_bytes);
	w0 = gt_ld(&t->st.bytes_written);
	assert_int_equal(f->g->upload(t, x, N), 0);
	assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, want_d);
	assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, want_s);
	assert_int_equal(gt_ld(&t->st.bytes_written) - w0, want_d + want_s);
	memset(arena, 0xee, N * piece);
	memset(heap, 0xee, N * piece);
	for (int i = 0; i < N; i++) {
		memset(out, 0, x[i].len);
		assert_int_equal(t->ops->read(t, &px, x[i].off, out,
					      x[i].len), 0);
		assert_true(gt_is_pat(out, x[i].len, 300 + i));
	}

	/* Down again: into the arena direct, into the heap staged, one
	 * readv; the destinations are checked after it returns.
	 */
	for (int i = 0; i < N; i++)
		io[i] = (struct kvfs_tier_io){ .ext = &px, .off = x[i].off,
					       .len = x[i].len,
					       .buf = x[i].host };
	d0 = gt_ld(&t->st.direct_bytes);
	s0 = gt_ld(&t->st.staged_bytes);
	assert_int_equal(t->ops->readv(t, io, N), 0);
	assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, want_d);
	assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, want_s);
	for (int i = 0; i < N; i++) {
		assert_int_equal(io[i].res, 0);
		assert_true(gt_is_pat(x[i].host, x[i].len, 300 + i));
	}

	/* One write and one read of a single registered range. */
	gt_pat(arena, piece, 77);
	d0 = gt_ld(&t->st.direct_bytes);
	assert_int_equal(t->ops->write(t, &px, N * piece, arena, piece), 0);
	memset(arena, 0, piece);
	assert_int_equal(t->ops->read(t, &px, N * piece, arena, piece), 0);
	assert_true(gt_is_pat(arena, piece, 77));
	assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, 2 * piece);

	/* Per transfer: the arena's last page direct, a heap page staged. */
	s0 = gt_ld(&t->st.staged_bytes);
	d0 = gt_ld(&t->st.direct_bytes);
	assert_int_equal(t->ops->read(t, &px, 0, (unsigned char *)b + len -
				      PG, PG), 0);
	assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, PG);
	assert_int_equal(t->ops->write(t, &px, 0, out, PG), 0);
	assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, PG);

	/* Host -> peer and back, the host sides mixed the same way. */
	for (int i = 0; i < N; i++)
		gt_pat(x[i].host, x[i].len, 900 + i);
	assert_int_equal(gt_peer_create(&tp, N * piece), 0);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	for (int i = 0; i < N; i++)
		x[i].pool = NULL;
	d0 = gt_ld(&t->st.direct_bytes);
	s0 = gt_ld(&t->st.staged_bytes);
	assert_int_equal(f->g->peer_write(t, p, x, N), 0);
	memset(arena, 0xee, N * piece);
	memset(heap, 0xee, N * piece);
	for (int i = 0; i < N; i++)
		assert_true(gt_peer_is(&tp, x[i].peer_off, x[i].len, 900 + i));
	assert_int_equal(f->g->peer_read(t, p, x, N), 0);
	for (int i = 0; i < N; i++)
		assert_true(gt_is_pat(x[i].host, x[i].len, 900 + i));
	assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, 2 * want_d);
	assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, 2 * want_s);
	f->g->peer_close(t, p);
	gt_peer_destroy(&tp);

	/* Unregistered, the arena is ordinary memory: all staged. */
	assert_int_equal(f->g->host_unregister(t, b), 0);
	for (int i = 0; i < N; i++)
		x[i].pool = &px;
	for (int i = 0; i < N; i++)
		gt_pat(x[i].host, x[i].len, 500 + i);
	d0 = gt_ld(&t->st.direct_bytes);
	s0 = gt_ld(&t->st.staged_bytes);
	assert_int_equal(f->g->upload(t, x, N), 0);
	assert_int_equal(gt_ld(&t->st.direct_bytes), d0);
	assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, want_d + want_s);
	for (int i = 0; i < N; i++) {
		assert_int_equal(t->ops->read(t, &px, x[i].off, out,
					      x[i].len), 0);
		assert_true(gt_is_pat(out, x[i].len, 500 + i));
	}
	t->ops->free(t, &px);
	d->ops->free(d, &dx);
	kvfs_tier_free(d);
	free(heap);
	free(out);
}

/*
 * Batches of many transfers of random lengths (0 included, none aligned),
 * their host sides drawn from a registered half of an arena, its
 * unregistered half, ranges across the boundary between the two, and the
 * heap, in random order, some continuing each other in both memories: up
 * and down again (upload, readv, peer_write, peer_read), every byte
 * checked, and every host byte counted once as direct or staged.
 */
void test_mixed_batches(void **state)
{
	enum { N = 64, ROUNDS = 6 };
	const uint64_t half = 32 * MiB, hsz = 32 * MiB, cap = 64 * MiB;
	const uint64_t hall = 2 * half + hsz;
	struct gt_fx *f = *state;
	struct kvfs_tier *t, *d;
	struct kvfs_extent dx, px;
	struct kvfs_gpu_xfer x[N], y[N];
	struct kvfs_tier_io io[N];
	struct kvfs_gpu_peer *p;
	struct gt_peer tp;
	unsigned char *arena, *heap, *shadow, *hshadow, *out;
	uint64_t rng = 12345, d0, s0, want_d, want_s;
	void *b;
	uint64_t len;

	kvfs_tier_free(f->t);
	assert_int_equal(gt_tier_make(cap, &f->t), 0);
	t = f->t;
	assert_int_equal(kvfs_tier_dram_init_flags(2 * half, KVFS_DRAM_ARENA,
						   &d), 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	assert_int_equal(d->ops->alloc(d, 2 * half, &dx), 0);
	arena = dx.ptr;
	/* Only the first half is registered. */
	assert_int_equal(f->g->host_register(t, arena, half), 0);
	assert_int_equal(t->ops->alloc(t, cap, &px), 0);
	heap = gt_xmalloc(hsz);
	shadow = gt_xmalloc(cap);
	out = gt_xmalloc(cap);
	hshadow = gt_xmalloc(hall);
	assert_int_equal(gt_peer_create(&tp, cap), 0);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);

	for (int round = 0; round < ROUNDS; round++) {
		/* host cursors: registered, unregistered, heap */
		unsigned char *cur[3] = { arena, arena + half + 2 * MiB,
					  heap };
		uint64_t dev = 0;
		int last = -1;
		bool across = false;

		want_d = want_s = 0;
		for (int i = 0; i < N; i++) {
			uint64_t r = gt_mix(rng++), l = (r >> 8) % (256 * 1024);
			int k = (int)(r % 4);
			unsigned char *h;

			if (k == 3 && !across) {
				/* across the registered half's end */
				across = true;
				h = arena + half - l / 2;
			} else {
				if (k == 3)
					k = 2;
				/* continue the last one, or leave a gap */
				if (!(r >> 40 & 1) || k != last)
					cur[k] += (r >> 42) % 5000;
				h = cur[k];
				cur[k] += l;
				last = k;
			}
			if (!(r >> 48 & 1))
				dev += (r >> 50) % 9000;
			x[i] = (struct kvfs_gpu_xfer){ .pool = &px, .host = h,
						       .off = dev,
						       .peer_off = dev,
						       .len = l };
			dev += l;
			if (gt_backend == B_SHM)
				continue;
			if (h >= arena && h + l <= arena + half && l)
				want_d += l;
			else
				want_s += l;
		}
		assert_true(cur[0] <= arena + half - MiB);
		assert_true(cur[1] <= arena + 2 * half);
		assert_true(cur[2] <= heap + hsz);
		assert_true(dev <= cap);

		/* Up: every device byte is what its host range held. */
		memset(shadow, 0, cap);
		assert_int_equal(t->ops->write(t, &px, 0, shadow, cap), 0);
		for (int i = 0; i < N; i++) {
			gt_pat(x[i].host, x[i].len, 1000 * round + i);
			memcpy(shadow + x[i].off, x[i].host, x[i].len);
		}
		d0 = gt_ld(&t->st.direct_bytes);
		s0 = gt_ld(&t->st.staged_bytes);
		assert_int_equal(f->g->upload(t, x, N), 0);
		assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, want_d);
		assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, want_s);
		memset(arena, 0xee, 2 * half);
		memset(heap, 0xee, hsz);
		assert_int_equal(t->ops->read(t, &px, 0, out, cap), 0);
		assert_memory_equal(out, shadow, cap);

		/* Down again into the same host ranges, one readv. */
		for (int i = 0; i < N; i++)
			io[i] = (struct kvfs_tier_io){ .ext = &px,
						       .off = x[i].off,
						       .len = x[i].len,
						       .buf = x[i].host };
		d0 = gt_ld(&t->st.direct_bytes);
		s0 = gt_ld(&t->st.staged_bytes);
		assert_int_equal(t->ops->readv(t, io, N), 0);
		assert_int_equal(gt_ld(&t->st.direct_bytes) - d0, want_d);
		assert_int_equal(gt_ld(&t->st.staged_bytes) - s0, want_s);
		memset(hshadow, 0xee, hall);
		for (int i = 0; i < N; i++) {
			unsigned char *h = x[i].host;
			uint64_t o = h >= heap && h < heap + hsz ?
				     2 * half + (uint64_t)(h - heap) :
				     (uint64_t)(h - arena);

			assert_int_equal(io[i].res, 0);
			memcpy(hshadow + o, shadow + x[i].off, x[i].len);
		}
		assert_memory_equal(arena, hshadow, 2 * half);
		assert_memory_equal(heap, hshadow + 2 * half, hsz);

		/* Host -> peer, then peer -> host. */
		memcpy(y, x, sizeof(y));
		for (int i = 0; i < N; i++) {
			y[i].pool = NULL;
			gt_pat(y[i].host, y[i].len, 7000 * round + i);
		}
		memset(shadow, 0, cap);
		gt_peer_fill(&tp, 0, shadow, cap);
		for (int i = 0; i < N; i++)
			memcpy(shadow + y[i].peer_off, y[i].host, y[i].len);
		assert_int_equal(f->g->peer_write(t, p, y, N), 0);
		memset(arena, 0xee, 2 * half);
		memset(heap, 0xee, hsz);
		gt_peer_get(&tp, 0, out, cap);
		assert_memory_equal(out, shadow, cap);
		assert_int_equal(f->g->peer_read(t, p, y, N), 0);
		memset(hshadow, 0xee, hall);
		for (int i = 0; i < N; i++) {
			unsigned char *h = y[i].host;
			uint64_t o = h >= heap && h < heap + hsz ?
				     2 * half + (uint64_t)(h - heap) :
				     (uint64_t)(h - arena);

			memcpy(hshadow + o, shadow + y[i].peer_off,
			       y[i].len);
		}
		assert_memory_equal(arena, hshadow, 2 * half);
		assert_memory_equal(heap, hshadow + 2 * half, hsz);
	}
	f->g->peer_close(t, p);
	gt_peer_destroy(&tp);
	t->ops->free(t, &px);
	kvfs_tier_free(f->t);
	f->t = NULL;
	d->ops->free(d, &dx);
	kvfs_tier_free(d);
	free(heap);
	free(shadow);
	free(out);
	free(hshadow);
}

/*
 * shm: registration changes nothing, and copies count neither direct nor
 * staged bytes.
 */
void test_shm_register_noop(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t, *d;
	struct kvfs_extent dx, px;
	struct kvfs_gpu_xfer x;
	unsigned char *out = gt_xmalloc(PG);
	void *b;
	uint64_t len;

	if (gt_backend != B_SHM) {
		print_message("shm-only test skipped\n");
		free(out);
		skip();
	}
	assert_int_equal(kvfs_tier_dram_init_flags(MiB, KVFS_DRAM_ARENA, &d),
			 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	assert_int_equal(f->g->host_register(t, b, len), 0);
	assert_int_equal(d->ops->alloc(d, PG, &dx), 0);
	assert_int_equal(t->ops->alloc(t, PG, &px), 0);
	gt_pat(dx.ptr, PG, 11);
	x = (struct kvfs_gpu_xfer){ .pool = &px, .host = dx.ptr, .len = PG };
	assert_int_equal(f->g->upload(t, &x, 1), 0);
	assert_int_equal(t->ops->read(t, &px, 0, out, PG), 0);
	assert_true(gt_is_pat(out, PG, 11));
	assert_int_equal(gt_ld(&t->st.direct_bytes), 0);
	assert_int_equal(gt_ld(&t->st.staged_bytes), 0);
	assert_int_equal(f->g->host_unregister(t, b), 0);
	t->ops->free(t, &px);
	d->ops->free(d, &dx);
	kvfs_tier_free(d);
	free(out);
}

/* ---- overlapping destinations ---- */

static char ov_log[64];

/* Send log lines to a file of this process's, for log_has(). */
static void log_capture(void)
{
	snprintf(ov_log, sizeof(ov_log), "/tmp/kvfs-test-gpu-tier-%ld.log",
		 (long)getpid());
	unlink(ov_log);
	assert_int_equal(kvfs_log_open(ov_log), 0);
}

/* Back to stderr; whether the captured lines contain @needle. */
static bool log_has(const char *needle)
{
	char buf[8192];
	ssize_t n;
	int fd;

	kvfs_log_close();
	fd = open(ov_log, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	unlink(ov_log);
	assert_true(n >= 0);
	buf[n] = 0;
	return strstr(buf, needle) != NULL;
}

/* The whole peer holds @want. */
static bool peer_equal(struct gt_peer *tp, const unsigned char *want)
{
	unsigned char *got = gt_xmalloc(PEER_SIZE);
	bool same;

	gt_peer_get(tp, 0, got, PEER_SIZE);
	same = !memcmp(got, want, PEER_SIZE);
	free(got);
	return same;
}

/*
 * A batch that would write a byte twice is refused whole, by both
 * backends alike: cuda issues pool-side copies before host-side ones, shm
 * copies in array order, so the bytes left in an overlap would differ.
 * Only destinations count: peer ranges for peer_write; pool ranges and
 * host ranges (each among themselves) for peer_read, whose peer ranges
 * are sources and may overlap.
 */
void test_overlap(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_tier *t = f->t;
	const uint64_t nb = 1024, bl = 64;
	struct kvfs_extent e;
	struct kvfs_gpu_peer *p;
	struct gt_peer tp;
	unsigned char *want = calloc(1, PEER_SIZE), *h = gt_xmalloc(4 * PG);
	unsigned char *h2 = gt_xmalloc(4 * PG), *buf = gt_xmalloc(8 * PG);
	unsigned char *big = gt_xmalloc(nb * bl);
	struct kvfs_gpu_xfer x[3], *v = calloc(nb, sizeof(*v));
	uint64_t r0, w0, *perm = calloc(nb, sizeof(*perm));
	unsigned seed = 7;

	assert_non_null(want);
	assert_non_null(v);
	assert_non_null(perm);
	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	gt_peer_fill(&tp, 0, want, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	gt_pat(buf, 8 * PG, 51);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 8 * PG), 0);
	gt_pat(h, 4 * PG, 52);
	r0 = gt_ld(&t->st.reads);
	w0 = gt_ld(&t->st.writes);

	/* peer_write: a pool-side and a host-side transfer into [PG, 2PG)
	 * (the order cuda changes).
	 */
	x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = 2 * PG };
	x[1] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = PG,
				       .len = 2 * PG };
	log_capture();
	assert_int_equal(f->g->peer_write(t, p, x, 2), -EINVAL);
	assert_true(log_has("transfers 0 and 1 of 2 write overlapping peer "
			    "ranges"));
	/* One byte, out of order; the pair is named in array order. */
	x[0] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = 10 * PG,
				       .len = PG };
	x[1] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG, .peer_off = 0,
				       .len = PG };
	x[2] = (struct kvfs_gpu_xfer){ .host = h + PG, .peer_off = 9 * PG + 1,
				       .len = PG };
	log_capture();
	assert_int_equal(f->g->peer_write(t, p, x, 3), -EINVAL);
	assert_true(log_has("transfers 0 and 2 of 3 write overlapping peer"));
	/* Its last byte, from above. */
	x[2].peer_off = 11 * PG - 1;
	assert_int_equal(f->g->peer_write(t, p, x, 3), -EINVAL);
	assert_true(peer_equal(&tp, want));
	assert_int_equal(gt_ld(&t->st.reads), r0);

	/* Touching ranges, and an empty transfer at a used offset: fine. */
	x[2].peer_off = 11 * PG;
	x[1].peer_off = 10 * PG + 5;
	x[1].len = 0;
	assert_int_equal(f->g->peer_write(t, p, x, 3), 0);
	memcpy(want + 10 * PG, h, PG);
	memcpy(want + 11 * PG, h + PG, PG);
	assert_true(peer_equal(&tp, want));

	/* A large shuffled batch: accepted, every piece where it was sent;
	 * then one piece moved onto its neighbour's last byte: refused.
	 */
	gt_pat(big, nb * bl, 53);
	for (uint64_t i = 0; i < nb; i++)
		perm[i] = i;
	for (uint64_t i = nb - 1; i > 0; i--) {
		uint64_t j = (uint64_t)rand_r(&seed) % (i + 1), tmp = perm[i];

		perm[i] = perm[j];
		perm[j] = tmp;
	}
	for (uint64_t i = 0; i < nb; i++) {
		v[i] = (struct kvfs_gpu_xfer){ .host = big + i * bl,
					       .peer_off = 64 * PG +
							   perm[i] * bl,
					       .len = bl };
		memcpy(want + 64 * PG + perm[i] * bl, big + i * bl, bl);
	}
	assert_int_equal(f->g->peer_write(t, p, v, nb), 0);
	assert_true(peer_equal(&tp, want));
	r0 = gt_ld(&t->st.reads);
	v[500].peer_off = v[700].peer_off + bl - 1;
	gt_pat(big, nb * bl, 54);
	assert_int_equal(f->g->peer_write(t, p, v, nb), -EINVAL);
	assert_true(peer_equal(&tp, want));
	assert_int_equal(gt_ld(&t->st.reads), r0);

	/* peer_read: two host destinations sharing bytes, then two pool
	 * ones; nothing written to either.
	 */
	memset(h2, 0x3c, 4 * PG);
	x[0] = (struct kvfs_gpu_xfer){ .host = h2, .peer_off = 0,
				       .len = PG };
	x[1] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = PG };
	x[2] = (struct kvfs_gpu_xfer){ .host = h2 + PG / 2,
				       .peer_off = 10 * PG, .len = PG };
	log_capture();
	assert_int_equal(f->g->peer_read(t, p, x, 3), -EINVAL);
	assert_true(log_has("transfers 0 and 2 of 3 write overlapping host"));
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG - 1,
				       .peer_off = 10 * PG, .len = 2 * PG };
	log_capture();
	assert_int_equal(f->g->peer_read(t, p, x, 3), -EINVAL);
	assert_true(log_has("transfers 1 and 2 of 3 write overlapping pool"));
	for (unsigned i = 0; i < 4 * PG; i++)
		assert_int_equal(h2[i], 0x3c);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 8 * PG), 0);
	assert_true(gt_is_pat(buf, 8 * PG, 51));
	assert_int_equal(gt_ld(&t->st.writes), w0);

	/* Overlapping sources, disjoint destinations: fine. The pool and
	 * the host are different memory, so equal offsets do not clash.
	 */
	gt_pat(want, 2 * PG, 55);
	gt_peer_fill(&tp, 0, want, 2 * PG);
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG,
				       .peer_off = PG / 2, .len = PG };
	x[0].len = PG / 2;
	assert_int_equal(f->g->peer_read(t, p, x, 3), 0);
	assert_memory_equal(h2, want, PG / 2);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 2 * PG), 0);
	assert_memory_equal(buf, want, PG);
	assert_memory_equal(buf + PG, want + PG / 2, PG);

	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	gt_peer_destroy(&tp);
	free(want);
	free(h);
	free(h2);
	free(buf);
	free(big);
	free(v);
	free(perm);
}

/* ---- threads ---- */

struct thr {
	struct gt_fx *f;
	struct gt_peer *tp;
	int id;
	int fail; /* line of the first failed check, 0 if none */
};

#define THR_CHECK(c)                    \
	do {                            \
		if (!(c)) {             \
			a->fail = __LINE__; \
			goto out;       \
		}                       \
	} while (0)

#define THR_REGION (PEER_SIZE / NTHREADS)
#define THR_ROUNDS 25

static void *thr_main(void *arg)
{
	struct thr *a = arg;
	struct kvfs_tier *t = a->f->t;
	const struct kvfs_gpu_ops *g = a->f->g;
	uint64_t len = THR_REGION / 2 + (uint64_t)a->id * 1000;
	unsigned char *src = malloc(len), *dst = malloc(len);
	struct kvfs_gpu_peer *p = NULL;
	struct kvfs_extent e = { 0 };
	bool have_e = false;

	THR_CHECK(src && dst);
	THR_CHECK(g->peer_open(t, &a->tp->m, &p) == 0);
	for (int r = 0; r < THR_ROUNDS; r++) {
		uint64_t seed = (uint64_t)a->id * 1000 + (uint64_t)r;
		uint64_t po = (uint64_t)a->id * THR_REGION + (uint64_t)r;
		uint64_t half = len / 2;
		struct kvfs_gpu_xfer up[2] = {
			{ .pool = &e, .host = src, .off = 0, .len = half },
			{ .pool = &e, .host = src + half, .off = half,
			  .len = len - half },
		};
		struct kvfs_gpu_xfer out = { .pool = &e, .off = 0,
					     .peer_off = po, .len = len };
		struct kvfs_gpu_xfer back = { .host = dst, .peer_off = po,
					      .len = len };

		THR_CHECK(t->ops->alloc(t, len, &e) == 0);
		have_e = true;
		gt_pat(src, len, seed);
		THR_CHECK(g->upload(t, up, 2) == 0);
		THR_CHECK(g->peer_write(t, p, &out, 1) == 0);
		memset(dst, 0, len);
		THR_CHECK(g->peer_read(t, p, &back, 1) == 0);
		THR_CHECK(gt_is_pat(dst, len, seed));
		memset(dst, 0, len);
		THR_CHECK(t->ops->read(t, &e, 0, dst, len) == 0);
		THR_CHECK(gt_is_pat(dst, len, seed));
		t->ops->free(t, &e);
		have_e = false;
	}
out:
	if (have_e)
		t->ops->free(t, &e);
	if (p)
		g->peer_close(t, p);
	free(src);
	free(dst);
	return NULL;
}

void test_threads(void **state)
{
	struct gt_fx *f = *state;
	struct gt_peer tp;
	pthread_t th[NTHREADS];
	struct thr a[NTHREADS];

	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	for (int i = 0; i < NTHREADS; i++) {
		a[i] = (struct thr){ .f = f, .tp = &tp, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, thr_main, &a[i]),
				 0);
	}
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		if (a[i].fail)
			fail_msg("thread %d failed at line %d", i, a[i].fail);
	}
	/* Each thread's last round is what its region holds. */
	for (int i = 0; i < NTHREADS; i++) {
		uint64_t len = THR_REGION / 2 + (uint64_t)i * 1000;
		uint64_t po = (uint64_t)i * THR_REGION + THR_ROUNDS - 1;

		assert_true(gt_peer_is(&tp, po, len,
				     (uint64_t)i * 1000 + THR_ROUNDS - 1));
	}
	assert_int_equal(gt_ld(&f->t->used), 0);
	gt_peer_destroy(&tp);
}
