/* SPDX-License-Identifier: MIT */
/*
 * Page-locked host buffers for the GPU restorer: see gpu/host_pool_i.h.
 */
#ifdef KVFS_HAVE_CUDA

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#define KVFS_CUDA_WHO "restore cuda"
#include "gpu/cuda_i.h"
#include "gpu/host_pool_i.h"
#include "meta/util.h"

#define HOST_POOL_ROUND (1ull << 20)

int kvfs_host_pool_init(struct kvfs_host_pool *hp)
{
	*hp = (struct kvfs_host_pool){ 0 };
	return -pthread_mutex_init(&hp->lock, NULL);
}

/*
 * A new page-locked buffer of @len bytes (a multiple of 1 MiB), 4096-aligned
 * for O_DIRECT.  Allocated here and then registered: the runtime's
 * cudaHostAlloc() sub-allocates small requests and gave an H200's 1 MiB
 * buffers 256-byte alignment only, so it cannot promise what O_DIRECT
 * needs.
 */
static int host_alloc(uint64_t len, void **buf)
{
	void *p;
	int ret;

	if (len > SIZE_MAX || !(p = aligned_alloc(4096, (size_t)len)))
		return -ENOMEM;
	ret = CUDA_TRY(
		cudaHostRegister(p, (size_t)len, cudaHostRegisterPortable));
	if (ret) {
		free(p);
		return ret;
	}
	*buf = p;
	return 0;
}

/* Unpin and free a buffer of host_alloc(). */
static void host_free(void *p)
{
	if (!p)
		return;
	(void)CUDA_TRY(cudaHostUnregister(p));
	free(p);
}

void kvfs_host_pool_release(struct kvfs_host_pool *hp)
{
	for (int i = 0; i < HOST_POOL_KEEP; i++)
		host_free(hp->buf[i].p);
	pthread_mutex_destroy(&hp->lock);
}

int kvfs_host_pool_get(struct kvfs_host_pool *hp, uint64_t len, void **buf)
{
	int slot = -1, ret;
	bool refused;
	uint64_t want;
	void *old = NULL;

	if (!hp || !buf || !len || len > UINT64_MAX - HOST_POOL_ROUND)
		return -EINVAL;
	want = kvfs_util_align_up(len, HOST_POOL_ROUND);
	pthread_mutex_lock(&hp->lock);
	refused = hp->refused;
	for (int i = 0; i < HOST_POOL_KEEP; i++) {
		if (hp->buf[i].out)
			continue;
		if (hp->buf[i].p && hp->buf[i].len >= len) {
			hp->buf[i].out = true;
			*buf = hp->buf[i].p;
			pthread_mutex_unlock(&hp->lock);
			return 0;
		}
		/* An empty slot before a too small buffer. */
		if (slot < 0 || !hp->buf[i].p)
			slot = i;
	}
	if (refused) {
		pthread_mutex_unlock(&hp->lock);
		return -ENOMEM;
	}
	if (slot >= 0) {
		/* Reserve the slot, then pin outside the lock. */
		old = hp->buf[slot].p;
		hp->buf[slot] = (typeof(hp->buf[slot])){ .out = true };
	}
	pthread_mutex_unlock(&hp->lock);
	host_free(old);
	ret = host_alloc(want, buf);
	if (ret == -ENOMEM)
		kvfs_warn("restore cuda: no more page-locked host memory for "
			  "restorations: they copy through the staging "
			  "buffers from now on");
	pthread_mutex_lock(&hp->lock);
	if (ret == -ENOMEM)
		hp->refused = true;
	if (slot < 0) {
		pthread_mutex_unlock(&hp->lock);
		return ret;
	}
	if (ret) {
		hp->buf[slot].out = false;
	} else {
		hp->buf[slot].p = *buf;
		hp->buf[slot].len = want;
	}
	pthread_mutex_unlock(&hp->lock);
	return ret;
}

void kvfs_host_pool_put(struct kvfs_host_pool *hp, void *buf)
{
	if (!buf)
		return;
	pthread_mutex_lock(&hp->lock);
	for (int i = 0; i < HOST_POOL_KEEP; i++) {
		if (hp->buf[i].p == buf) {
			hp->buf[i].out = false;
			pthread_mutex_unlock(&hp->lock);
			return;
		}
	}
	pthread_mutex_unlock(&hp->lock);
	host_free(buf);
}

bool kvfs_host_pinned(const void *p, uint64_t len)
{
	const uint8_t *ends[2] = { p, (const uint8_t *)p + len - 1 };

	if (!p || !len)
		return false;
	for (int i = 0; i < 2; i++) {
		struct cudaPointerAttributes a;

		if (cudaPointerGetAttributes(&a, ends[i]) != cudaSuccess) {
			(void)cudaGetLastError();
			return false;
		}
		if (a.type != cudaMemoryTypeHost)
			return false;
	}
	return true;
}

#endif /* KVFS_HAVE_CUDA */
