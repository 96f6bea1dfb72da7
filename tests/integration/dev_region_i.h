/* SPDX-License-Identifier: MIT */
/*
 * The caller's "device memory" of the mount-level test clients, on the
 * backend the device tier runs: a shm object, or with KVFS_TEST_GPU=cuda
 * cudaMalloc'ed memory handed over by IPC handle, as an engine's would be
 * (make test-gpu on a GPU, make test-gpu-emu against tests/gpu/cudaemu.c).
 * Device memory is never host-addressable, so every read and write of it
 * goes through dev_get()/dev_put(). Completion words stay shm objects
 * (shm_region_i.h): the ABI wants them in host memory on either backend.
 *
 * Include after <cmocka.h>; call dev_backend_init() before anything else.
 */
#ifndef KVFS_TESTS_DEV_REGION_I_H
#define KVFS_TESTS_DEV_REGION_I_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta/kvfs_ctl.h"
#include "shm_region_i.h"

#ifdef KVFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* enum kvfs_ctl_backend of the device tier under test. */
static uint32_t dev_backend = KVFS_CTL_BACKEND_SHM;

/* Pick the backend from KVFS_TEST_GPU ("cuda", else shm). Returns 0, or
 * -EOPNOTSUPP when cuda is asked of a build without CUDA.
 */
static inline int dev_backend_init(void)
{
	const char *v = getenv("KVFS_TEST_GPU");

	dev_backend = KVFS_CTL_BACKEND_SHM;
	if (!v || strcmp(v, "cuda"))
		return 0;
#ifdef KVFS_HAVE_CUDA
	dev_backend = KVFS_CTL_BACKEND_CUDA;
	return 0;
#else
	return -EOPNOTSUPP;
#endif
}

/* The caller's memory handed to the daemon as a peer. */
struct dev_region {
	struct shm_region shm; /* shm */
	uint8_t *d; /* cuda: the device allocation */
	size_t len;
};

/* @len zeroed bytes; @tag names the shm object. */
static inline void dev_make(struct dev_region *r, const char *tag, size_t len)
{
	memset(r, 0, sizeof(*r));
	r->len = len;
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		shm_make(&r->shm, tag, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	assert_int_equal(cudaSetDevice(0), cudaSuccess);
	assert_int_equal(cudaMalloc((void **)&r->d, len), cudaSuccess);
	assert_int_equal(cudaMemset(r->d, 0, len), cudaSuccess);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
#else
	fail_msg("no CUDA in this build");
#endif
}

static inline void dev_drop(struct dev_region *r)
{
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		shm_drop(&r->shm);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	cudaFree(r->d);
#endif
}

/* @buf gets [off, off + len) of @r. */
static inline void dev_get(const struct dev_region *r, uint64_t off, void *buf,
			   size_t len)
{
	assert_true(off <= r->len && len <= r->len - off);
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		memcpy(buf, r->shm.p + off, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	assert_int_equal(cudaMemcpy(buf, r->d + off, len,
				    cudaMemcpyDeviceToHost),
			 cudaSuccess);
#else
	fail_msg("no CUDA in this build");
#endif
}

/* [off, off + len) of @r gets @buf. */
static inline void dev_put(struct dev_region *r, uint64_t off, const void *buf,
			   size_t len)
{
	assert_true(off <= r->len && len <= r->len - off);
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		memcpy(r->shm.p + off, buf, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	/* From pageable memory the copy may return before the bytes are on
	 * the device: the daemon reads them from another context.
	 */
	assert_int_equal(cudaMemcpy(r->d + off, buf, len,
				    cudaMemcpyHostToDevice),
			 cudaSuccess);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
#else
	fail_msg("no CUDA in this build");
#endif
}

/* Every byte of @r set to @byte: poison, so that bytes the daemon should
 * have delivered cannot be left over from an earlier request.
 */
static inline void dev_fill(struct dev_region *r, int byte)
{
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		memset(r->shm.p, byte, r->len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	/* cudaMemset of device memory may return before it is done; the
	 * daemon's copies into @r must come after it.
	 */
	assert_int_equal(cudaMemset(r->d, byte, r->len), cudaSuccess);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
#else
	fail_msg("no CUDA in this build");
#endif
}

/* Whether [off, off + len) of @r holds @want. */
static inline bool dev_equal(const struct dev_region *r, uint64_t off,
			     const void *want, size_t len)
{
	uint8_t *buf = malloc(len ? len : 1);
	bool same;

	assert_non_null(buf);
	dev_get(r, off, buf, len);
	same = !memcmp(buf, want, len);
	free(buf);
	return same;
}

/* @m describes all of @r to the daemon. */
static inline void dev_peer(const struct dev_region *r, struct kvfs_ctl_mem *m)
{
	memset(m, 0, sizeof(*m));
	m->backend = dev_backend;
	m->size = r->len;
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", r->shm.name);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	cudaIpcMemHandle_t h;

	assert_int_equal(cudaIpcGetMemHandle(&h, r->d), cudaSuccess);
	memcpy(m->ipc, &h, sizeof(m->ipc));
#else
	fail_msg("no CUDA in this build");
#endif
}

/* The device pool a response names, read by this process: @out gets
 * [off, off + len) of it.
 */
static inline void pool_get(const struct kvfs_ctl_mem *pool, uint64_t off,
			    void *out, size_t len)
{
	assert_int_equal(pool->backend, dev_backend);
	assert_true(off <= pool->size && len <= pool->size - off);
	if (dev_backend == KVFS_CTL_BACKEND_SHM) {
		int pfd = shm_open(pool->shm_name, O_RDONLY, 0);
		uint8_t *p;

		assert_true(pfd >= 0);
		p = mmap(NULL, pool->size, PROT_READ, MAP_SHARED, pfd, 0);
		close(pfd);
		assert_true(p != MAP_FAILED);
		memcpy(out, p + off, len);
		munmap(p, pool->size);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	cudaIpcMemHandle_t h;
	void *d = NULL;

	memcpy(&h, pool->ipc, sizeof(h));
	assert_int_equal(cudaSetDevice((int)pool->device), cudaSuccess);
	assert_int_equal(cudaIpcOpenMemHandle(&d, h,
					      cudaIpcMemLazyEnablePeerAccess),
			 cudaSuccess);
	assert_int_equal(cudaMemcpy(out, (uint8_t *)d + off, len,
				    cudaMemcpyDeviceToHost),
			 cudaSuccess);
	assert_int_equal(cudaIpcCloseMemHandle(d), cudaSuccess);
#else
	fail_msg("no CUDA in this build");
#endif
}

#endif
