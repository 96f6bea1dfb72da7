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
 *         cudaIpcGetMemHandle; host<->device copies go asynchronously on
 *         dedicated streams, many blocks batched into few copies: straight
 *         from or to host memory registered with host_register (the DRAM
 *         tier's pinned arena), through pinned staging buffers
 *         otherwise. Peers are IPC handles of the client's device memory. Built only when the CUDA toolkit is
 *         present (KVFS_HAVE_CUDA); linked statically against cudart so
 *         the binaries still run where no driver is installed.
 *
 * Base tier ops on a device tier: alloc/free/claim manage the pool with the
 * extent allocator; write copies host -> pool, read pool -> host, readv is
 * a batch of reads; map returns a host pointer for shm and NULL for cuda
 * (extent_addr gives either backend's own address); sync waits for every
 * copy issued so far.
 *
 * Locking: like every tier, alloc/free are thread-safe and copies on
 * distinct extents may run concurrently. A peer belongs to the thread
 * that opened it.
 *
 * Both backends allocate in units of 4096 bytes (base.align) and round the
 * pool capacity down to a multiple of it. A batch is checked whole before
 * anything is copied: one bad transfer fails it with -EINVAL (logged,
 * naming the transfer) and nothing moves. A transfer of length 0 is a
 * no-op. Counters in base.st: each transfer of peer_write counts one op in
 * st.reads and its bytes in st.bytes_read (data served to a client); each
 * of peer_read and upload one op in st.writes and st.bytes_written; every
 * host-side byte moved also counts in st.direct_bytes or st.staged_bytes
 * (cuda; shm copies with memcpy and counts neither). CUDA
 * failures are -EIO (-ENOMEM when device or pinned memory runs out), with
 * a log line naming the call.
 */
#ifndef KVFS_GPU_GPU_H
#define KVFS_GPU_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tier/tier.h"
#include "meta/kvfs_ctl.h"

struct kvfs_gpu_peer;

/*
 * One copy between host memory or the pool and peer memory. For upload,
 * @host is copied to @pool at @off and @peer_off is ignored.
 */
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
	 * Also -EINVAL when the memory is smaller than m->size (shm: the
	 * object; cuda: the allocation, where the driver can tell) or is the
	 * tier's own pool. peer_size() is m->size. cuda keeps opened IPC
	 * handles in a per-process cache, so reopening one is cheap.
	 */
	int (*peer_open)(struct kvfs_tier *t, const struct kvfs_ctl_mem *m,
			 struct kvfs_gpu_peer **out);
	void (*peer_close)(struct kvfs_tier *t, struct kvfs_gpu_peer *p);
	uint64_t (*peer_size)(const struct kvfs_gpu_peer *p);
	/* The host address of byte 0 of @p, valid until peer_close, or NULL
	 * where peer memory is not host memory (cuda). The memory is the
	 * client's: it can vanish under us, so every access to it must be
	 * guarded (meta/guard.h) or made by the kernel (an O_DIRECT read
	 * into it fails with EFAULT, no signal).
	 */
	void *(*peer_map)(struct kvfs_tier *t, struct kvfs_gpu_peer *p);
	/* Whether @m names the memory @p has open (the same object, still
	 * at least as large), so an opened peer can serve the client's next
	 * request. NULL where a backend keeps no such identity (cuda keeps
	 * its own handle cache).
	 */
	bool (*peer_same)(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_ctl_mem *m);
	/* Copy @n transfers into peer memory, all complete on return.
	 * -EINVAL if any range falls outside the peer or the pool extent
	 * (or the extent outside the pool), a transfer has neither pool nor
	 * host side, two transfers' peer ranges overlap (the backends order
	 * a batch's copies differently, so the bytes left there would
	 * depend on the backend), or @p was opened by another tier.
	 * -ENOMEM if a batch not in ascending peer order cannot be sorted
	 * for that check.
	 */
	int (*peer_write)(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_gpu_xfer *x, size_t n);
	/* Copy @n transfers out of peer memory (into host or pool). Errors
	 * as peer_write, except that the ranges that must not overlap are
	 * the destinations: pool ranges among themselves, host ranges among
	 * themselves. Overlapping peer sources are fine.
	 */
	int (*peer_read)(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			 const struct kvfs_gpu_xfer *x, size_t n);
	/* Copy many host ranges into the pool as one batch. */
	int (*upload)(struct kvfs_tier *t, const struct kvfs_gpu_xfer *x,
		      size_t n);
	/* The address of byte 0 of pool extent @e in *@addr, for code that
	 * writes a block straight into the pool (hidden-state restoration):
	 * cuda a device pointer on the tier's device, shm the daemon's
	 * writable host mapping. Valid while @e stays allocated; what is
	 * written through it is what clients and read() see, with no
	 * counting (the caller counts). 0, or -EINVAL (logged, *@addr
	 * NULL) for a NULL argument or an extent not inside the pool.
	 * Lock-free.
	 */
	int (*extent_addr)(struct kvfs_tier *t, const struct kvfs_extent *e,
			   void **addr);
	/*
	 * Register [@ptr, @ptr + @len) of host memory with the device, once,
	 * so that a transfer whose host range lies wholly inside it (upload,
	 * read/readv/write, peer_write/peer_read host sides) is copied
	 * straight from or to it instead of through a staging buffer;
	 * transfers elsewhere are staged as before, and every call still
	 * completes its copies before it returns. cuda: cudaHostRegister
	 * with cudaHostRegisterPortable, logged with the size and the time
	 * it took (pinning touches every page); at most a few regions per
	 * tier. shm: nothing to do (0 after the argument checks).
	 * The memory must stay mapped until host_unregister, or until the
	 * tier is freed, which unregisters what is left (free the device
	 * tier before the memory's owner).
	 * Returns 0; -EINVAL (logged) for NULL, @len 0, a range that
	 * overlaps a registered one, or no room for another region; -ENOMEM
	 * when the driver cannot pin the pages (RLIMIT_MEMLOCK, a lack of
	 * memory) and -EIO for other CUDA failures, logged with the CUDA
	 * error. Locking: waits for copies in flight on this tier.
	 */
	int (*host_register)(struct kvfs_tier *t, void *ptr, uint64_t len);
	/*
	 * Undo host_register of the region starting at @ptr, after the
	 * copies in flight on this tier. 0; -ENOENT (logged) when @ptr does
	 * not start a registered region (cuda); shm: always 0.
	 */
	int (*host_unregister)(struct kvfs_tier *t, void *ptr);
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
 * With KVFS_GPU_PRIVATE the name is @name + "-<pid>-<n>" (describe()
 * gives it). The whole object is reserved up front (posix_fallocate), so
 * a full /dev/shm fails here (-ENOSPC), not in a later copy. -EINVAL for
 * a bad name (not "/" + a name without '/', or 64 bytes or more with
 * its suffix), a capacity under 4096 or unknown flags.
 */
int kvfs_gpu_shm_init(const char *name, uint64_t capacity, unsigned flags,
		      struct kvfs_tier **out);

/*
 * kvfs_gpu_shm_sweep() - remove the pools "@prefix-<pid>-pool" in /dev/shm
 * whose pid is dead: what daemons killed with -9 left (a clean exit
 * unlinks its own).  A pid that is alive again (reused) keeps its object
 * until a later sweep finds it dead.  Returns how many were removed
 * (each logged); a missing /dev/shm is 0.  No locking: the caller holds
 * the store that @prefix names.
 */
int kvfs_gpu_shm_sweep(const char *prefix);

/*
 * kvfs_gpu_cuda_init() - a cudaMalloc pool of @capacity bytes on @device.
 * -ENODEV (logged with the CUDA error) when no device is visible or the
 * driver is missing; -EOPNOTSUPP in builds without the CUDA toolkit.
 * Also -ENODEV for a @device that is not visible; -EINVAL for a capacity
 * under 4096 or flags other than KVFS_GPU_PRIVATE (accepted, no effect);
 * -ENOMEM or -EIO when CUDA refuses the pool, its IPC handle, its streams
 * or its pinned staging buffers (logged).
 */
int kvfs_gpu_cuda_init(int device, uint64_t capacity, unsigned flags,
		       struct kvfs_tier **out);

/* The device ops of a tier made by either init, or NULL for other tiers
 * (and for NULL).
 */
const struct kvfs_gpu_ops *kvfs_gpu_ops_of(struct kvfs_tier *t);

#endif
