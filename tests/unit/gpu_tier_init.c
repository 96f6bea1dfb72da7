/* SPDX-License-Identifier: MIT */
/*
 * The device tier's init and what belongs to one backend (gpu_tier_i.h):
 * shm's arguments, owners and sweep; cuda's absence, arguments and its
 * cache of opened IPC handles.
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

/* ---- init and backend-specific ---- */

void test_shm_init_args(void **state)
{
	struct kvfs_tier *t = (struct kvfs_tier *)0x1, *t2;
	char name[80], longname[80];
	int fd;

	assert_int_equal(kvfs_gpu_shm_init(NULL, MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("", MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/", MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("noslash", MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/a/b", MiB, 0, &t), -EINVAL);
	memset(longname, 'a', sizeof(longname));
	longname[0] = '/';
	longname[70] = 0;
	assert_int_equal(kvfs_gpu_shm_init(longname, MiB, 0, &t), -EINVAL);
	/* 60 bytes fit alone, not with a private suffix. */
	longname[60] = 0;
	assert_int_equal(kvfs_gpu_shm_init(longname, MiB, KVFS_GPU_PRIVATE,
					   &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", 0, KVFS_GPU_PRIVATE,
					   &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", PG - 1,
					   KVFS_GPU_PRIVATE, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", MiB, 1u << 7, &t),
			 -EINVAL);
	assert_ptr_equal(t, (struct kvfs_tier *)0x1);

	/* An exact name (and the owner's uid): created once, taken while it
	 * lives, gone after.
	 */
	snprintf(name, sizeof(name), "/kvfs-test-excl-%ld", (long)getpid());
	assert_int_equal(kvfs_gpu_shm_init(name, 3 * PG + 5, 0, &t), 0);
	assert_int_equal(t->capacity, 3 * PG);
	assert_int_equal(kvfs_gpu_shm_init(name, MiB, 0, &t2), -EEXIST);
	{
		struct kvfs_ctl_mem m;

		kvfs_gpu_ops_of(t)->describe(t, &m);
		snprintf(name, sizeof(name), "/kvfs-test-excl-%ld-%u",
			 (long)getpid(), (unsigned)getuid());
		assert_string_equal(m.shm_name, name);
	}
	fd = shm_open(name, O_RDONLY, 0);
	assert_true(fd >= 0);
	{
		struct stat sb;

		assert_int_equal(fstat(fd, &sb), 0);
		assert_int_equal(sb.st_size, 3 * PG);
		assert_int_equal(sb.st_mode & 0777, 0600);
	}
	close(fd);
	kvfs_tier_free(t);
	assert_true(shm_open(name, O_RDONLY, 0) < 0);
	assert_int_equal(errno, ENOENT);

	/* Private pools of one prefix get distinct names. */
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", MiB, KVFS_GPU_PRIVATE,
					   &t), 0);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", MiB, KVFS_GPU_PRIVATE,
					   &t2), 0);
	{
		struct kvfs_ctl_mem m1, m2;

		kvfs_gpu_ops_of(t)->describe(t, &m1);
		kvfs_gpu_ops_of(t2)->describe(t2, &m2);
		assert_string_not_equal(m1.shm_name, m2.shm_name);
	}
	kvfs_tier_free(t);
	kvfs_tier_free(t2);
}

/* Bytes of shm object @name that have pages (st_blocks). */
static uint64_t shm_backed(const char *name)
{
	struct stat sb;
	int fd = shm_open(name, O_RDONLY, 0);

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	close(fd);
	return (uint64_t)sb.st_blocks * 512;
}

/*
 * shm, one owner: a freed extent keeps its pages (the one object cannot
 * outgrow the capacity), so the next FETCH into it does not allocate and
 * zero them again; the bytes a later block writes are its own.
 */
void test_shm_one_owner_keeps_pages(void **state)
{
	const uint64_t cap = 32 * PG;
	struct kvfs_extent a, b;
	struct kvfs_ctl_mem m;
	struct kvfs_tier *t;
	unsigned char *buf = gt_xmalloc(8 * PG), *got = gt_xmalloc(8 * PG);

	(void)state;
	if (gt_backend != B_SHM) {
		free(buf);
		free(got);
		skip();
	}
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-test", cap,
					   KVFS_GPU_PRIVATE, &t), 0);
	kvfs_gpu_ops_of(t)->describe(t, &m);
	assert_true(shm_backed(m.shm_name) == 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &a), 0);
	gt_pat(buf, 8 * PG, 7);
	assert_int_equal(t->ops->write(t, &a, 0, buf, 8 * PG), 0);
	assert_true(shm_backed(m.shm_name) >= 8 * PG);
	t->ops->free(t, &a);
	assert_int_equal(t->used, 0);
	assert_true(shm_backed(m.shm_name) >= 8 * PG);
	/* The same range again: its new bytes, and no more pages. */
	assert_int_equal(t->ops->alloc(t, 8 * PG, &b), 0);
	assert_int_equal(b.off, a.off);
	gt_pat(buf, 8 * PG, 9);
	assert_int_equal(t->ops->write(t, &b, 0, buf, 8 * PG), 0);
	assert_int_equal(t->ops->read(t, &b, 0, got, 8 * PG), 0);
	assert_true(gt_is_pat(got, 8 * PG, 9));
	assert_true(shm_backed(m.shm_name) <= 9 * PG);
	t->ops->free(t, &b);
	kvfs_tier_free(t);
	free(buf);
	free(got);
}

static int owners_make(uint64_t cap, const struct kvfs_gpu_owners *o,
		       struct kvfs_tier **t)
{
	if (gt_backend == B_CUDA)
		return kvfs_gpu_cuda_init_owners(0, cap, 0, o, t);
	return kvfs_gpu_shm_init_owners("/kvfs-test", cap, KVFS_GPU_PRIVATE, o,
					t);
}

/*
 * One pool per owner: distinct objects (shm: of the owner's uid, mode
 * 0600) or allocations, offsets relative to each pool, a client of one
 * pool sees that pool's bytes only, and one capacity shared by all.
 */
void test_owner_pools(void **state)
{
	uint32_t me = (uint32_t)getuid();
	uint32_t uid[3] = { me, me + 1001, me + 1002 };
	struct kvfs_gpu_owners o = { .uid = uid, .n = 3 };
	const uint64_t cap = 48 * PG;
	const uint64_t psize = gt_backend == B_SHM ? cap : 16 * PG;
	const struct kvfs_gpu_ops *g;
	struct kvfs_extent a, b, c, x, y;
	struct kvfs_ctl_mem m[3], md;
	struct kvfs_tier *t;
	unsigned char *buf = gt_xmalloc(2 * PG), *got = gt_xmalloc(2 * PG);
	char hex[2 * sizeof(md) + 1], offs[32] = "0", lens[32];
	char *args[] = { "x", "--client", hex, offs, lens, "41", NULL };

	assert_int_equal(owners_make(cap, &o, &t), 0);
	g = kvfs_gpu_ops_of(t);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(g->describe_owner(t, uid[i], &m[i]), 0);
		assert_int_equal(m[i].size, psize);
	}
	assert_int_equal(g->describe_owner(t, me + 5, &md), -ENOENT);
	g->describe(t, &md);
	assert_memory_equal(&md, &m[0], sizeof(md));
	if (gt_backend == B_SHM) {
		assert_string_not_equal(m[0].shm_name, m[1].shm_name);
		assert_string_not_equal(m[1].shm_name, m[2].shm_name);
	} else {
		assert_memory_not_equal(m[0].ipc, m[1].ipc, sizeof(m[0].ipc));
		assert_memory_not_equal(m[1].ipc, m[2].ipc, sizeof(m[0].ipc));
	}

	/* Each owner's first extent is at offset 0 of its own pool. */
	assert_int_equal(t->ops->alloc(t, PG, &a), 0);
	assert_int_equal(g->alloc_owner(t, uid[1], 2 * PG, &b), 0);
	assert_int_equal(g->alloc_owner(t, uid[2], 2 * PG, &c), 0);
	assert_int_equal(a.pool, 0);
	assert_int_equal(b.pool, 1);
	assert_int_equal(c.pool, 2);
	assert_int_equal(a.off | b.off | c.off, 0);
	assert_int_equal(g->alloc_owner(t, me + 5, PG, &x), -ENOENT);
	assert_int_equal(g->alloc_owner(t, uid[1], 0, &x), -EINVAL);
	assert_int_equal(t->used, 5 * PG);

	/* The same offset in two pools is two places. */
	gt_pat(buf, 2 * PG, 41);
	assert_int_equal(t->ops->write(t, &b, 0, buf, 2 * PG), 0);
	gt_pat(buf, 2 * PG, 42);
	assert_int_equal(g->upload(t, &(struct kvfs_gpu_xfer){
					       .pool = &c, .host = buf,
					       .len = 2 * PG }, 1), 0);
	assert_int_equal(t->ops->read(t, &b, 0, got, 2 * PG), 0);
	assert_true(gt_is_pat(got, 2 * PG, 41));
	assert_int_equal(t->ops->read(t, &c, 0, got, 2 * PG), 0);
	assert_true(gt_is_pat(got, 2 * PG, 42));

	/* A client mapping an owner's pool finds that owner's bytes at the
	 * offset it was given, and not the other's.
	 */
	snprintf(lens, sizeof(lens), "%" PRIu64, (uint64_t)2 * PG);
	gt_hex_enc(&m[1], sizeof(m[1]), hex);
	assert_int_equal(gt_run_self(args), 0);
	gt_hex_enc(&m[2], sizeof(m[2]), hex);
	assert_int_equal(gt_run_self(args), 1);
	args[5] = "42";
	assert_int_equal(gt_run_self(args), 0);

	if (gt_backend == B_SHM) {
		for (int i = 0; i < 3; i++) {
			struct stat sb;
			int fd = shm_open(m[i].shm_name, O_RDONLY, 0);

			assert_true(fd >= 0);
			assert_int_equal(fstat(fd, &sb), 0);
			close(fd);
			assert_int_equal(sb.st_mode & 0777, 0600);
			assert_int_equal(sb.st_size, cap);
			if (geteuid() == 0)
				assert_int_equal(sb.st_uid, uid[i]);
			/* Sparse: only what was handed out is backed. */
			assert_true((uint64_t)sb.st_blocks * 512 <= 2 * PG);
		}
		/* One capacity for every pool. */
		assert_int_equal(g->alloc_owner(t, uid[1], cap - 5 * PG, &x),
				 0);
		assert_int_equal(t->used, cap);
		assert_int_equal(g->alloc_owner(t, uid[2], PG, &y), -ENOSPC);
		assert_true(shm_backed(m[1].shm_name) >= cap - 3 * PG);
		t->ops->free(t, &x);
		/* With several owners a free gives its pages back, so the
		 * objects together hold no more than the capacity.
		 */
		assert_true(shm_backed(m[1].shm_name) <= 2 * PG);
		assert_int_equal(g->alloc_owner(t, uid[2], PG, &y), 0);
		t->ops->free(t, &y);
	} else {
		/* Each owner's allocation is its own: one full leaves the
		 * others their room.
		 */
		assert_int_equal(g->alloc_owner(t, uid[1], psize - 2 * PG,
						&x), 0);
		assert_int_equal(g->alloc_owner(t, uid[1], PG, &y), -ENOSPC);
		assert_int_equal(g->alloc_owner(t, uid[2], PG, &y), 0);
		t->ops->free(t, &x);
		t->ops->free(t, &y);
	}
	assert_int_equal(g->alloc_owner(t, uid[0], psize + PG, &x), -ENOSPC);

	/* An extent naming no pool is refused, never served. */
	x = a;
	x.pool = 7;
	assert_int_equal(t->ops->write(t, &x, 0, buf, PG), -EINVAL);
	assert_int_equal(t->ops->read(t, &x, 0, got, PG), -EINVAL);
	t->ops->free(t, &x);
	assert_int_equal(t->used, 5 * PG);

	t->ops->free(t, &a);
	t->ops->free(t, &b);
	t->ops->free(t, &c);
	assert_int_equal(t->used, 0);
	kvfs_tier_free(t);
	if (gt_backend == B_SHM)
		for (int i = 0; i < 3; i++) {
			assert_true(shm_open(m[i].shm_name, O_RDONLY, 0) < 0);
			assert_int_equal(errno, ENOENT);
		}

	/* Owner lists: one uid twice, none, too many. */
	uid[1] = me;
	assert_int_equal(owners_make(cap, &o, &t), -EINVAL);
	o.n = 0;
	assert_int_equal(owners_make(cap, &o, &t), -EINVAL);
	o.n = KVFS_GPU_OWNERS_MAX + 1;
	assert_int_equal(owners_make(cap, &o, &t), -EINVAL);
	free(buf);
	free(got);
}

/* A start removes the pools daemons of its store left when they died. */
void test_shm_sweep(void **state)
{
	char prefix[40], dead[64], mine[64], live[64], other[64];
	const char *keep[] = { mine, live, other };
	int status, fd;
	pid_t pid;

	if (gt_backend != B_SHM)
		skip();
	pid = fork();
	assert_true(pid >= 0);
	if (!pid)
		_exit(0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	snprintf(prefix, sizeof(prefix), "/kvfs-sweep%ld-", (long)getpid());
	snprintf(dead, sizeof(dead), "%s%ld-pool-0", prefix, (long)pid);
	snprintf(mine, sizeof(mine), "%s%ld-pool-0", prefix, (long)getpid());
	snprintf(live, sizeof(live), "%s1-pool", prefix);
	snprintf(other, sizeof(other), "%s%ld-other", prefix, (long)pid);
	for (int i = 0; i < 4; i++) {
		fd = shm_open(i ? keep[i - 1] : dead, O_CREAT | O_RDWR, 0600);
		assert_true(fd >= 0);
		close(fd);
	}
	assert_int_equal(kvfs_gpu_shm_sweep(prefix), 1);
	assert_true(shm_open(dead, O_RDONLY, 0) < 0);
	for (int i = 0; i < 3; i++) {
		fd = shm_open(keep[i], O_RDONLY, 0);
		assert_true(fd >= 0);
		close(fd);
		shm_unlink(keep[i]);
	}
	assert_int_equal(kvfs_gpu_shm_sweep("nope"), -EINVAL);
}

/* Here, without KVFS_TEST_GPU=cuda: the cuda backend must say why not. */
void test_cuda_absent(void **state)
{
	struct kvfs_tier *t = (struct kvfs_tier *)0x1;
	int err;

	if (gt_backend == B_CUDA) {
		print_message("cuda backend selected: absence not tested\n");
		skip();
	}
#ifdef KVFS_HAVE_CUDA
	{
		int count = 0;

		if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
			print_message("a CUDA device is visible: run make "
				      "test-gpu\n");
			skip();
		}
	}
	err = kvfs_gpu_cuda_init(0, MiB, 0, &t);
	assert_int_equal(err, -ENODEV);
	assert_int_equal(kvfs_gpu_cuda_init(-1, MiB, 0, &t), -ENODEV);
#else
	err = kvfs_gpu_cuda_init(0, MiB, 0, &t);
	assert_int_equal(err, -EOPNOTSUPP);
#endif
	assert_ptr_equal(t, (struct kvfs_tier *)0x1);
}

void test_cuda_init_args(void **state)
{
	struct kvfs_tier *t = (struct kvfs_tier *)0x1;

	if (gt_backend != B_CUDA) {
		print_message("cuda-only test skipped (KVFS_TEST_GPU=cuda)\n");
		skip();
	}
	assert_int_equal(kvfs_gpu_cuda_init(0, 0, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_cuda_init(0, PG - 1, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_cuda_init(0, MiB, 1u << 7, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_cuda_init(-1, MiB, 0, &t), -ENODEV);
	assert_int_equal(kvfs_gpu_cuda_init(4096, MiB, 0, &t), -ENODEV);
	assert_ptr_equal(t, (struct kvfs_tier *)0x1);
	assert_int_equal(kvfs_gpu_cuda_init(0, 3 * PG + 1, 0, &t), 0);
	assert_int_equal(t->capacity, 3 * PG);
	kvfs_tier_free(t);
}

/* cuda: one handle opened twice maps once (the handle cache). */
void test_cuda_handle_cache(void **state)
{
	struct gt_fx *f = *state;
	struct kvfs_gpu_peer *p, *q;
	struct kvfs_gpu_xfer x;
	struct gt_peer tp;
	unsigned char *buf = gt_xmalloc(PG);

	if (gt_backend != B_CUDA) {
		print_message("cuda-only test skipped (KVFS_TEST_GPU=cuda)\n");
		free(buf);
		skip();
	}
	assert_int_equal(gt_peer_create(&tp, PEER_SIZE), 0);
	for (int round = 0; round < 3; round++) {
		assert_int_equal(f->g->peer_open(f->t, &tp.m, &p), 0);
		assert_int_equal(f->g->peer_open(f->t, &tp.m, &q), 0);
		gt_pat(buf, PG, 60 + round);
		x = (struct kvfs_gpu_xfer){ .host = buf, .peer_off = PG,
					    .len = PG };
		assert_int_equal(f->g->peer_write(f->t, p, &x, 1), 0);
		memset(buf, 0, PG);
		assert_int_equal(f->g->peer_read(f->t, q, &x, 1), 0);
		assert_true(gt_is_pat(buf, PG, 60 + round));
		f->g->peer_close(f->t, p);
		f->g->peer_close(f->t, q);
	}
	gt_peer_destroy(&tp);
	free(buf);
}
