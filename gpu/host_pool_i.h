/* SPDX-License-Identifier: MIT */
/*
 * Page-locked host buffers for the GPU restorer (gpu/restore_cuda.c
 * only; built with KVFS_HAVE_CUDA).
 *
 * A copy between the device and pageable host memory goes through the
 * restorer's own pinned staging buffers, one CPU memcpy each way; from
 * page-locked memory the copy engine reads and writes the bytes itself.
 * Restoring one 64-token block of a 7B-like model moves 48 MiB between
 * host and device, so where a caller can read the stored image into, or
 * build the KV image in, page-locked memory it saves those copies.
 *
 * Pinning is slow (cudaHostRegister touches and locks every page), so the
 * pool keeps up to HOST_POOL_KEEP buffers that were given back and hands
 * them out again.  A request when every kept buffer is out gets a new
 * one, unmapped when it is given back if HOST_POOL_KEEP others are kept;
 * at most HOST_POOL_MAX are out at once.
 */
#ifndef KVFS_GPU_HOST_POOL_I_H
#define KVFS_GPU_HOST_POOL_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define HOST_POOL_KEEP 4
#define HOST_POOL_MAX 16

struct kvfs_host_pool {
	pthread_mutex_t lock;
	/* Guarded by lock: every buffer of the pool (p NULL in an empty
	 * entry), each out with a caller or kept, free to hand out.
	 */
	struct {
		void *p;
		uint64_t len;
		bool out;
	} buf[HOST_POOL_MAX];
	/* Guarded by lock: the driver refused to pin memory once; from
	 * then on only kept buffers are handed out, and no new one is
	 * asked for (nor is the refusal logged again).
	 */
	bool refused;
};

/* Set up an empty pool.  0, or -errno from pthread_mutex_init(). */
int kvfs_host_pool_init(struct kvfs_host_pool *hp);

/*
 * kvfs_host_pool_release() - free every kept buffer.  The caller has
 * given every buffer back (a buffer still out is freed too, and must not
 * be used or given back afterwards).  Call with the device's context
 * current or not: page-locked host memory is not tied to a device.
 */
void kvfs_host_pool_release(struct kvfs_host_pool *hp);

/*
 * kvfs_host_pool_get() - a page-locked buffer of at least @len bytes,
 * 4096-aligned (O_DIRECT reads may land in it), in *@buf: a kept buffer
 * that is large enough, else a new one (an anonymous mapping aligned on 2
 * MiB, advised to use huge pages, then cudaHostRegister(), portable; the
 * size rounded up to 2 MiB) in an empty entry or in place of a free one
 * too small.  Not cudaHostAlloc(), which does not promise page alignment.
 * Its contents are undefined.
 * Returns 0; -EINVAL (NULL, @len 0); -EBUSY (HOST_POOL_MAX buffers are
 * out); -ENOMEM (the driver cannot pin more: the caller goes on with
 * pageable memory; logged the first time, and from then on no buffer is
 * pinned anew) or -EIO (logged).
 * Locking: takes hp->lock; never holds it across the pinning of a buffer.
 */
int kvfs_host_pool_get(struct kvfs_host_pool *hp, uint64_t len, void **buf);

/*
 * kvfs_host_pool_put() - give back @buf from kvfs_host_pool_get() (NULL,
 * or a pointer the pool did not give: nothing).  It is kept for the next
 * request, or unpinned and unmapped when HOST_POOL_KEEP others are kept.
 * Locking: takes hp->lock; unpins outside it.
 */
void kvfs_host_pool_put(struct kvfs_host_pool *hp, void *buf);

/*
 * kvfs_host_pinned() - whether the first and the last byte of [@p, @p +
 * @len) are page-locked host memory (cudaHostAlloc'd or registered with
 * cudaHostRegister), as cudaPointerGetAttributes() reports them.  A wrong
 * yes (a range whose middle is pageable) costs speed only: the runtime
 * copies pageable memory correctly, synchronously.  Any thread, no lock.
 */
bool kvfs_host_pinned(const void *p, uint64_t len);

#endif
