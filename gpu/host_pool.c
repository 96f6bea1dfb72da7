/* SPDX-License-Identifier: MIT */
/*
 * Page-locked host buffers for the GPU restorer: see gpu/host_pool_i.h.
 */
#ifdef KVFS_HAVE_CUDA

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <cuda_runtime_api.h>

#define KVFS_CUDA_WHO "restore cuda"
#include "gpu/cuda_i.h"
#include "gpu/host_pool_i.h"
#include "meta/util.h"

/* Sizes are rounded to, and buffers aligned on, a huge page. */
#define HOST_POOL_ROUND (2ull << 20)

int kvfs_host_pool_init(struct kvfs_host_pool *hp)
{
	*hp = (struct kvfs_host_pool){ 0 };
	return -pthread_mutex_init(&hp->lock, NULL);
}

/*
 * A new page-locked buffer of @len bytes (a multiple of HOST_POOL_ROUND),
 * mapped here and then registered, so that every buffer is the same kind
 * of memory, whatever malloc's state:
 * - cudaHostAlloc() sub-allocates small requests and gave an H200's 1 MiB
 *   buffers 256-byte alignment only, less than O_DIRECT needs;
 * - nor did aligned_alloc() give one speed: on an H200 host an O_DIRECT
 *   read of 16 MiB into the registered buffer malloc returned after a
 *   first restorer's buffers had been freed took 14-20 ms, against 10-12
 *   ms into the first restorer's and into pageable memory.
 * With a mapping of its own per buffer, aligned on a huge page and advised
 * to use huge pages, reads into the pool's buffers took 7.3-8.4 ms against
 * 7.6-8.7 ms into pageable memory, for every restorer.
 */
static int host_alloc(uint64_t len, void **buf)
{
	uint8_t *m, *p;
	size_t map;
	int ret;

	if (len > SIZE_MAX - HOST_POOL_ROUND)
		return -ENOMEM;
	map = (size_t)len + HOST_POOL_ROUND;
	m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	p = (uint8_t *)kvfs_util_align_up((uintptr_t)m, HOST_POOL_ROUND);
	if (p > m)
		munmap(m, (size_t)(p - m));
	if (m + map > p + len)
		munmap(p + len, (size_t)(m + map - (p + len)));
	(void)madvise(p, (size_t)len, MADV_HUGEPAGE);
	ret = CUDA_TRY(
		cudaHostRegister(p, (size_t)len, cudaHostRegisterPortable));
	if (ret) {
		munmap(p, (size_t)len);
		return ret;
	}
	*buf = p;
	return 0;
}

/* Unpin and unmap a buffer of host_alloc() (@p NULL: nothing). */
static void host_free(void *p, uint64_t len)
{
	if (!p)
		return;
	(void)CUDA_TRY(cudaHostUnregister(p));
	munmap(p, (size_t)len);
}

void kvfs_host_pool_release(struct kvfs_host_pool *hp)
{
	for (int i = 0; i < HOST_POOL_MAX; i++)
		host_free(hp->buf[i].p, hp->buf[i].len);
	pthread_mutex_destroy(&hp->lock);
}

int kvfs_host_pool_get(struct kvfs_host_pool *hp, uint64_t len, void **buf)
{
	int slot = -1, ret;
	uint64_t want, old_len = 0;
	void *old = NULL;

	if (!hp || !buf || !len || len > UINT64_MAX - HOST_POOL_ROUND)
		return -EINVAL;
	want = kvfs_util_align_up(len, HOST_POOL_ROUND);
	pthread_mutex_lock(&hp->lock);
	for (int i = 0; i < HOST_POOL_MAX; i++) {
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
	if (hp->refused || slot < 0) {
		ret = hp->refused ? -ENOMEM : -EBUSY;
		pthread_mutex_unlock(&hp->lock);
		return ret;
	}
	/* Reserve the slot, then pin outside the lock. */
	old = hp->buf[slot].p;
	old_len = hp->buf[slot].len;
	hp->buf[slot] = (typeof(hp->buf[slot])){ .out = true };
	pthread_mutex_unlock(&hp->lock);
	host_free(old, old_len);
	ret = host_alloc(want, buf);
	if (ret == -ENOMEM)
		kvfs_warn("restore cuda: no more page-locked host memory for "
			  "restorations: they copy through the staging "
			  "buffers from now on");
	pthread_mutex_lock(&hp->lock);
	if (ret == -ENOMEM)
		hp->refused = true;
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
	uint64_t len = 0;
	void *drop = NULL;
	int kept = 0;

	if (!buf)
		return;
	pthread_mutex_lock(&hp->lock);
	for (int i = 0; i < HOST_POOL_MAX; i++)
		if (hp->buf[i].p && !hp->buf[i].out)
			kept++;
	for (int i = 0; i < HOST_POOL_MAX; i++) {
		if (hp->buf[i].p != buf || !hp->buf[i].out)
			continue;
		if (kept < HOST_POOL_KEEP) {
			hp->buf[i].out = false;
		} else {
			/* Enough are kept: this one goes. */
			drop = buf;
			len = hp->buf[i].len;
			hp->buf[i] = (typeof(hp->buf[i])){ 0 };
		}
		break;
	}
	pthread_mutex_unlock(&hp->lock);
	host_free(drop, len);
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
