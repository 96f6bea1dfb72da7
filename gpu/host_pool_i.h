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
 * them out again.  A request when every kept buffer is out gets a buffer
 * of its own, freed when it is given back.
 */
#ifndef KVFS_GPU_HOST_POOL_I_H
#define KVFS_GPU_HOST_POOL_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define HOST_POOL_KEEP 4

struct kvfs_host_pool {
	pthread_mutex_t lock;
	/* Guarded by lock: the kept buffers (p NULL where none yet), each
	 * out with a caller or free to hand out.
	 */
	struct {
		void *p;
		uint64_t len;
		bool out;
	} buf[HOST_POOL_KEEP];
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
 * that is large enough, else a new one (aligned_alloc() then
 * cudaHostRegister(), portable, rounded up to 1 MiB: cudaHostAlloc()
 * does not promise 4096-byte alignment) kept in a free or too small
 * slot, else one of its own.  Its contents are undefined.
 * Returns 0; -EINVAL (NULL, @len 0); -ENOMEM (the driver cannot pin more:
 * the caller goes on with pageable memory; logged the first time, and
 * from then on no buffer is pinned anew) or -EIO (logged).
 * Locking: takes hp->lock; never holds it across the allocation of a
 * buffer of its own.
 */
int kvfs_host_pool_get(struct kvfs_host_pool *hp, uint64_t len, void **buf);

/*
 * kvfs_host_pool_put() - give back @buf from kvfs_host_pool_get() (NULL:
 * nothing).  A kept buffer is marked free; one of its own is freed.
 * Locking: takes hp->lock.
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
