/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the device tier backends (gpu/tier_*.c, gpu/gpu.c and gpu/gpu_check.c
 * only): the pool allocator, the checks every copy goes through before
 * anything moves, and the ops tables kvfs_gpu_ops_of() recognises.
 */
#ifndef KVFS_GPU_GPU_I_H
#define KVFS_GPU_GPU_I_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tier/extent.h"
#include "tier/tier.h"
#include "meta/kvfs_ctl.h"
#include "gpu/gpu.h"

/* Allocation unit of a device pool. */
#define KVFS_GPU_ALIGN 4096u

extern const struct kvfs_tier_ops kvfs_gpu_shm_tier_ops;
#ifdef KVFS_HAVE_CUDA
extern const struct kvfs_tier_ops kvfs_gpu_cuda_tier_ops;
#endif

/*
 * A client's memory opened with ->peer_open. Owned by the thread that
 * opened it; every field is immutable until ->peer_close.
 */
struct kvfs_gpu_peer {
	struct kvfs_tier *t;   /* the tier that opened it */
	unsigned char *base;   /* shm: our mapping; cuda: device pointer */
	uint64_t size;         /* usable bytes: the descriptor's size */
	void *priv;            /* cuda: its handle cache entry */
	uint64_t dev, ino;     /* shm: the object's identity */
};

/*
 * One owner's pool. Set up by the backend's init and immutable after it,
 * but for @map (its own lock).
 */
struct kvfs_gpu_pool {
	uint32_t owner;            /* the uid it belongs to */
	uint64_t size;             /* bytes, a multiple of KVFS_GPU_ALIGN */
	unsigned char *base;       /* shm: our mapping; cuda: device pointer */
	struct kvfs_ctl_mem desc;  /* what describe hands to clients */
	int fd;                    /* shm: the object (page reservations) */
	uint64_t dev, ino;         /* shm: the object's identity */
	bool map_live;             /* @map initialised */
	struct kvfs_tier_pool map; /* its extents; has its own lock */
};

/* Every pool of a tier: @p[0..n) are set up, p[0] the default owner's. */
struct kvfs_gpu_pools {
	size_t n;
	struct kvfs_gpu_pool p[KVFS_GPU_OWNERS_MAX];
};

/* The pool holding @e, or NULL for an index no pool has. Lock-free. */
static inline struct kvfs_gpu_pool *kvfs_gpu_pool_of(const struct kvfs_tier *t,
						     const struct kvfs_extent *e)
{
	struct kvfs_gpu_pools *ps = ((const struct kvfs_gpu_tier *)t)->pools;

	return e->pool < ps->n ? &ps->p[e->pool] : NULL;
}

/*
 * Check @o (1..KVFS_GPU_OWNERS_MAX owners, no uid twice). 0 or -EINVAL,
 * logged with @who.
 */
int kvfs_gpu_owners_check(const struct kvfs_gpu_owners *o, const char *who);

/* uid @owner's pool of @t, or NULL. Lock-free. */
struct kvfs_gpu_pool *kvfs_gpu_pool_find(struct kvfs_tier *t, uint32_t owner);

/*
 * Set up @p's extent map over [0, @size) for uid @owner (the backend
 * sets the rest). 0, -EINVAL or -ENOMEM.
 */
int kvfs_gpu_pool_init(struct kvfs_gpu_pool *p, uint32_t owner,
		       uint64_t size);

/* Free every pool's map (the backend freed their memory). */
void kvfs_gpu_pools_release(struct kvfs_gpu_pools *ps);

/*
 * The allocator half of ->alloc_owner: take @len (rounded up to
 * KVFS_GPU_ALIGN) from the tier's shared capacity (t->used), then a hole
 * in @owner's pool; sets e->off, e->len, e->pool and e->ptr = NULL.
 * 0; -EINVAL for 0 bytes; -ENOSPC; -ENOENT (logged) for an owner without
 * a pool. Takes the pool's map lock.
 */
int kvfs_gpu_pool_alloc(struct kvfs_tier *t, uint32_t owner, uint64_t len,
			struct kvfs_extent *e, const char *who);

/* Give @e back to its pool and the shared capacity; a bad or double free
 * is logged and ignored. @freed, if set, runs under the pool's map lock
 * once the range is free and before anyone can take it again (shm gives
 * its pages back there). Takes the pool's map lock.
 */
void kvfs_gpu_pool_free(struct kvfs_tier *t, const struct kvfs_extent *e,
			void (*freed)(struct kvfs_gpu_pool *p,
				      const struct kvfs_extent *e));

/* Mark @e used in its pool (base claim). 0, -EINVAL, -EEXIST, -ENOMEM. */
int kvfs_gpu_pool_claim(struct kvfs_tier *t, const struct kvfs_extent *e);

/* ->describe_owner of both backends: a copy of the pool's desc. */
int kvfs_gpu_pool_describe(struct kvfs_tier *t, uint32_t owner,
			   struct kvfs_ctl_mem *out);

/* ->peer_size of both backends. */
uint64_t kvfs_gpu_peer_size(const struct kvfs_gpu_peer *p);

/*
 * @p was opened by @t. 0 or -EINVAL (logged with @who, @what): a peer
 * handed to another tier would read memory that tier never mapped.
 */
int kvfs_gpu_peer_check(const struct kvfs_tier *t,
			const struct kvfs_gpu_peer *p, const char *who,
			const char *what);

/*
 * A valid shm object name: "/" then 1..@max-2 bytes, none of them '/',
 * NUL-terminated within @max bytes (@name need not be a C string: only
 * @max bytes are read). 0 or -EINVAL, logged with @who and @what.
 */
int kvfs_gpu_name_check(const char *name, size_t max, const char *who,
			const char *what);

/*
 * [off, off + len) inside extent @e, and @e inside its pool of @t; @buf
 * non-NULL when @len is not 0. 0 or -EINVAL (logged with @who, @what).
 */
int kvfs_gpu_ext_check(const struct kvfs_tier *t, const struct kvfs_extent *e,
		       uint64_t off, const void *buf, uint64_t len,
		       const char *who, const char *what);

enum kvfs_gpu_xfer_kind {
	KVFS_GPU_X_PEER = 1 << 0,   /* peer_off + len must fit in the peer */
	KVFS_GPU_X_UPLOAD = 1 << 1, /* pool and host both required */
	/* peer_write: the peer ranges are written, so no two may overlap */
	KVFS_GPU_X_PEER_DST = 1 << 2,
	/* peer_read: the pool and host ranges are written, so no two pool
	 * ranges (by pool offset) and no two host ranges (by address) may
	 * overlap
	 */
	KVFS_GPU_X_SIDE_DST = 1 << 3,
};

/*
 * Check every transfer of a batch before any copy starts: the pool side
 * (extent inside the pool, range inside the extent) or a host pointer, and
 * with KVFS_GPU_X_PEER the peer range inside @peer_size. With
 * KVFS_GPU_X_PEER_DST or KVFS_GPU_X_SIDE_DST, also that the batch writes
 * no byte twice: the backends issue a batch's copies in different orders
 * (cuda: pool-side copies first, and staged bytes land after later direct
 * ones), so where two destinations overlapped, the bytes left there would
 * depend on the backend. Transfers of length 0 write nothing and are not
 * compared. The overlap check is O(n) when the destinations come in
 * ascending order (each kind of memory on its own), O(n log n) otherwise.
 * 0; -EINVAL with a log line naming the first bad transfer, or the two
 * overlapping ones; -ENOMEM when the unsorted case cannot get memory to
 * sort in. @x may be NULL only when @n is 0.
 */
int kvfs_gpu_xfer_check(const struct kvfs_tier *t,
			const struct kvfs_gpu_xfer *x, size_t n,
			uint64_t peer_size, unsigned kind, const char *who,
			const char *what);

/*
 * The peer descriptor @m names @backend's memory of a non-zero size (and a
 * valid shm name for shm). 0 or -EINVAL, logged with @who.
 */
int kvfs_gpu_mem_check(const struct kvfs_ctl_mem *m, uint32_t backend,
		       const char *who);

/* Bytes moved by a batch, for the counters. */
uint64_t kvfs_gpu_xfer_bytes(const struct kvfs_gpu_xfer *x, size_t n);

#endif
