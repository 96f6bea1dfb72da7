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
 * Pools per owner: a tier holds one pool per owner uid (made at init,
 * struct kvfs_gpu_owners), so that a client is handed only memory that
 * holds blocks it may read (docs/ctl.md, "Permissions"). shm: one object
 * per owner, of that uid, mode 0600, each spanning the capacity but
 * sparse (pages are reserved by alloc and given back by free); cuda: one
 * cudaMalloc per owner, of owner_capacity bytes, with its own IPC handle.
 * The capacity (base.capacity, base.used) is one budget shared by every
 * pool. An extent names its pool (kvfs_extent.pool) and its offset is
 * relative to that pool, as are the offsets clients are given.
 *
 * Base tier ops on a device tier: alloc/free/claim manage the pools with
 * the extent allocator (alloc: the default owner's pool, the first one); write copies host -> pool, read pool -> host, readv is
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
	/* Describe the default owner's pool for clients. */
	void (*describe)(struct kvfs_tier *t, struct kvfs_ctl_mem *out);
	/* Describe uid @owner's pool for clients (FETCH's response): its
	 * shm name or IPC handle, and its size. 0, or -ENOENT (logged) when
	 * @owner has no pool. Lock-free.
	 */
	int (*describe_owner)(struct kvfs_tier *t, uint32_t owner,
			      struct kvfs_ctl_mem *out);
	/* Reserve @len bytes in uid @owner's pool, as base alloc does in
	 * the default owner's; e->pool names the pool. 0; -ENOSPC when the
	 * shared capacity is spent, the pool has no hole that large, or
	 * (shm) /dev/shm cannot back the pages; -EINVAL for 0 bytes;
	 * -ENOENT (logged) when @owner has no pool. Thread-safe.
	 */
	int (*alloc_owner)(struct kvfs_tier *t, uint32_t owner, uint64_t len,
			   struct kvfs_extent *e);
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

struct kvfs_gpu_pools;

/* A device tier is a kvfs_tier whose ops table is embedded here. */
struct kvfs_gpu_tier {
	struct kvfs_tier base;
	const struct kvfs_gpu_ops *gops;
	struct kvfs_gpu_pools *pools; /* gpu/ only; immutable after init */
};

/* Most owners (pools) one device tier holds. */
#define KVFS_GPU_OWNERS_MAX 64

/*
 * The owners a tier makes pools for, at init. @uid[0] is the default
 * owner (base alloc and describe); the uids must differ. For cuda each
 * pool is one allocation of @owner_capacity bytes (0: capacity / @n,
 * rounded down to 4096), all made at init; shm ignores it (every pool
 * spans the capacity, sparse). The pools share the capacity either way.
 */
struct kvfs_gpu_owners {
	const uint32_t *uid;
	size_t n; /* 1..KVFS_GPU_OWNERS_MAX */
	uint64_t owner_capacity;
};

enum kvfs_gpu_flags {
	/* shm: create the pool under a unique name and unlink it at free. */
	KVFS_GPU_PRIVATE = 1 << 0,
};

/*
 * kvfs_gpu_shm_init() - kvfs_gpu_shm_init_owners() with one owner, the
 * caller's uid (getuid()).
 */
int kvfs_gpu_shm_init(const char *name, uint64_t capacity, unsigned flags,
		      struct kvfs_tier **out);

/*
 * kvfs_gpu_shm_init_owners() - shared-memory pools sharing @capacity
 * bytes, one object per owner of @o, named @name + "-<uid>" (@name is
 * "/kvfs-<something>"; each created O_EXCL, fchown'ed to its uid, mode
 * 0600, unlinked on free). With KVFS_GPU_PRIVATE the names are @name +
 * "-<pid>-<n>-<uid>" (describe() gives them). Each object is sized to
 * the capacity but sparse: alloc reserves the pages it hands out
 * (fallocate), so a full /dev/shm is -ENOSPC from alloc, never a SIGBUS
 * in a copy, and free gives them back. A daemon that may not give an
 * object away (not root) keeps it as its own, with a warning.
 * 0, -EEXIST, -EINVAL, or another -errno (logged). -EINVAL for a bad
 * name (not "/" + a name without '/', or 64 bytes or more with its
 * suffixes), a capacity under 4096, unknown flags, no owner, too many,
 * or one uid twice.
 */
int kvfs_gpu_shm_init_owners(const char *name, uint64_t capacity,
			     unsigned flags, const struct kvfs_gpu_owners *o,
			     struct kvfs_tier **out);

/*
 * kvfs_gpu_shm_sweep() - remove the pool objects that daemons of a store
 * left behind when they died: every /dev/shm/<@prefix><pid>-pool... whose
 * pid is no running process (@prefix is "/kvfs-<store id>-"). Objects of
 * this process and of live ones stay. Returns how many were removed
 * (each logged), or -errno when /dev/shm cannot be read.
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

/*
 * kvfs_gpu_cuda_init_owners() - as kvfs_gpu_cuda_init(), with one pool
 * per owner of @o: a cudaMalloc of @o->owner_capacity bytes each (0:
 * @capacity / @o->n), exported with its own IPC handle, all made here.
 * -EINVAL also for no owner, too many, one uid twice or a pool under
 * 4096 bytes.
 */
int kvfs_gpu_cuda_init_owners(int device, uint64_t capacity, unsigned flags,
			      const struct kvfs_gpu_owners *o,
			      struct kvfs_tier **out);

/* The device ops of a tier made by either init, or NULL for other tiers
 * (and for NULL).
 */
const struct kvfs_gpu_ops *kvfs_gpu_ops_of(struct kvfs_tier *t);

#endif
