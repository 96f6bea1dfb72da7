/* SPDX-License-Identifier: MIT */
/*
 * The device tier: a struct kvfs_tier (cache/tier.h) over a memory pool
 * that engines map, plus the operations only a device tier has: export the
 * pool to clients, and copy to and from memory a client owns ("peer"
 * memory: its paged KV cache).
 *
 * Two backends with the same semantics and the same tests:
 *   shm   a POSIX shared-memory pool standing in for device memory on hosts
 *         without a GPU (and in CI); clients map it read-only. Peers are
 *         the clients' own shm objects.
 *   cuda  cudaMalloc'd pool on one device, exported once with
 *         cudaIpcGetMemHandle; host<->device copies go through pinned
 *         staging buffers, asynchronously on dedicated streams, many
 *         blocks batched into few copies. Peers are IPC handles of the
 *         client's device memory. Built only when the CUDA toolkit is
 *         present (KVFS_HAVE_CUDA); linked statically against cudart so
 *         the binaries still run where no driver is installed.
 *
 * Base tier ops on a device tier: alloc/free/claim manage the pool with the
 * extent allocator; write copies host -> pool, read pool -> host, readv is
 * a batch of reads; map returns a host pointer for shm and NULL for cuda;
 * sync waits for every copy issued so far.
 *
 * Locking: like every tier, alloc/free are thread-safe and copies on
 * distinct extents may run concurrently. A peer belongs to the thread
 * that opened it.
 */
#ifndef KVFS_GPU_GPU_H
#define KVFS_GPU_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cache/tier.h"
#include "fs/kvfs_ctl.h"

struct kvfs_gpu_peer;

/* One copy between host memory or the pool and peer memory. */
struct kvfs_gpu_xfer {
	const struct kvfs_extent *pool; /* source/dest in the pool, or NULL */
	void *host;     /* host memory when @pool is NULL */
	uint64_t off;   /* offset inside the pool extent (when @pool) */
	uint64_t peer_off; /* offset in peer memory */
	uint64_t len;
};

struct kvfs_gpu_ops {
	/* Describe the pool for clients (FETCH's response). */
	void (*describe)(struct kvfs_tier *t, struct kvfs_ctl_mem *out);
	/* Open a client's memory. -EINVAL for a handle of another backend or
	 * device, a bad shm name or a size of 0; -ENOENT if it does not
	 * exist; each logged.
	 */
	int (*peer_open)(struct kvfs_tier *t, const struct kvfs_ctl_mem *m,
			 struct kvfs_gpu_peer **out);
	void (*peer_close)(struct kvfs_tier *t, struct kvfs_gpu_peer *p);
	uint64_t (*peer_size)(const struct kvfs_gpu_peer *p);
	/* Copy @n transfers into peer memory, all complete on return.
	 * -EINVAL if any range falls outside the peer or the pool extent.
	 */
	int (*peer_write)(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_gpu_xfer *x, size_t n);
	/* Copy @n transfers out of peer memory (into host or pool). */
	int (*peer_read)(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			 const struct kvfs_gpu_xfer *x, size_t n);
	/* Copy many host ranges into the pool as one batch. */
	int (*upload)(struct kvfs_tier *t, const struct kvfs_gpu_xfer *x,
		      size_t n);
};

/* A device tier is a kvfs_tier whose ops table is embedded here. */
struct kvfs_gpu_tier {
	struct kvfs_tier base;
	const struct kvfs_gpu_ops *gops;
};

enum kvfs_gpu_flags {
	/* shm: create the pool under a unique name and unlink it at free. */
	KVFS_GPU_PRIVATE = 1 << 0,
};

/*
 * kvfs_gpu_shm_init() - a shared-memory pool of @capacity bytes named
 * @name ("/kvfs-<something>", created O_EXCL, mode 0644, unlinked on
 * free). 0, -EEXIST, -EINVAL, or another -errno (logged).
 */
int kvfs_gpu_shm_init(const char *name, uint64_t capacity, unsigned flags,
		      struct kvfs_tier **out);

/*
 * kvfs_gpu_cuda_init() - a cudaMalloc pool of @capacity bytes on @device.
 * -ENODEV (logged with the CUDA error) when no device is visible or the
 * driver is missing; -EOPNOTSUPP in builds without the CUDA toolkit.
 */
int kvfs_gpu_cuda_init(int device, uint64_t capacity, unsigned flags,
		       struct kvfs_tier **out);

/* The device ops of a tier made by either init, or NULL for other tiers. */
const struct kvfs_gpu_ops *kvfs_gpu_ops_of(struct kvfs_tier *t);

#endif
