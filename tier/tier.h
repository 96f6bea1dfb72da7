/* SPDX-License-Identifier: MIT */
/*
 * Storage tiers behind one const ops table.  Each tier embeds struct
 * kvfs_tier as its first member; the cache only ever sees the base.
 *
 * A tier stores opaque byte ranges ("extents").  It knows nothing about
 * blocks, policies or metadata: the cache decides what goes where.
 *
 * Backends:
 *   dram  malloc'd, 4096-aligned buffers, or (KVFS_DRAM_ARENA) extents of
 *         one region reserved up front, which a device tier can pin once;
 *         map() gives a direct pointer either way.
 *   ssd   extents of a preallocated data file, read and written with
 *         io_uring and O_DIRECT; or, for unit tests, the same allocator
 *         over an in-memory "device" (KVFS_SSD_MEMORY).
 *   gpu   device memory (gpu/): a shm stand-in or CUDA, behind the same
 *         base and the device ops of gpu/gpu.h.
 *
 * Locking: alloc/free/stats are thread-safe (each tier has its own lock for
 * its allocator; counters are atomics).  read/write/map on distinct extents
 * may run concurrently from any threads; the caller guarantees that an
 * extent is not freed while an I/O on it is in flight.
 */
#ifndef KVFS_TIER_TIER_H
#define KVFS_TIER_TIER_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/uio.h>

#include "tier/extent.h"

/* Which tier: the index of a tier in the engine's tier array, and the
 * tier a policy decision names.
 */
enum kvfs_tier_id {
	KVFS_TIER_GPU = 0,
	KVFS_TIER_DRAM = 1,
	KVFS_TIER_SSD = 2,
	KVFS_NTIERS = 3,
	/* The tier shared across hosts (tier/tier_remote.h): addressed by
	 * key, not a slot of the engine's tier array nor a policy's (so
	 * not next to them: KVFS_NTIERS stays a count).
	 */
	KVFS_TIER_REMOTE = 8,
};

struct kvfs_extent {
	uint64_t off;  /* tier-relative offset (ssd: byte offset in file) */
	uint64_t len;  /* bytes reserved, a multiple of the tier's alignment */
	void *ptr;     /* memory tiers: the buffer; NULL otherwise */
	/* Device tiers: which owner's pool holds it (an index the tier
	 * gives out, gpu/gpu.h); @off is relative to that pool. 0 elsewhere.
	 */
	uint32_t pool;
};

/*
 * One range of a batched read: @len bytes at extent offset @off to @buf.
 * @done, when set, is called exactly once per range, as soon as that
 * range's @res is final, on the thread that called ->readv, possibly while
 * later ranges are still in flight (ssd): a caller verifies and delivers
 * each range while the disk works on the rest. It must not call into the
 * same tier. @done and @issue get @arg. Fields a caller does not use
 * are zero (no iovecs, no depth of its own, no @issue).
 */
struct kvfs_tier_io {
	const struct kvfs_extent *ext;
	uint64_t off;
	uint64_t len;
	void *buf;
	/* ssd only: when set, the range is read into these @iovcnt
	 * buffers in order (one vectored read; each base and length
	 * 4096-aligned, the lengths summing to @len) and @buf is unused.
	 */
	const struct iovec *iov;
	unsigned iovcnt;
	/* ssd only: the range is issued only while fewer than @depth
	 * ranges of its batch are in flight (0: the tier's own limit, 256).
	 * Ranges are issued in index order, so one @depth on every range
	 * of a batch caps the batch: the rest wait, not yet issued, which
	 * is what lets @issue still call them off.
	 */
	unsigned depth;
	/* ssd only: when set, called on the readv thread right before the
	 * range is issued (after its checks, never for a retry of a short
	 * transfer). A nonzero return (-errno, e.g. -ECANCELED) keeps it
	 * from being issued: @res is that value, ->done is called at once,
	 * and it counts in no op. Ranges already issued are not affected.
	 * Same rules as ->done: it must not call into the same tier.
	 */
	int (*issue)(struct kvfs_tier_io *io, void *arg);
	int res; /* out: 0 or -errno */
	void (*done)(struct kvfs_tier_io *io, void *arg);
	void *arg;
};

/* Call @io->done if set (tiers' readv helper). */
static inline void kvfs_tier_io_done(struct kvfs_tier_io *io)
{
	if (io->done)
		io->done(io, io->arg);
}

struct kvfs_tier_stats {
	atomic_uint_least64_t hits, misses, evictions;
	atomic_uint_least64_t bytes_read, bytes_written;
	atomic_uint_least64_t reads, writes; /* I/O operations issued */
	atomic_uint_least64_t blocks;        /* maintained by the cache */
	/* Device tiers only (0 elsewhere): host<->device bytes copied
	 * straight from or to registered host memory, and bytes that went
	 * through a staging buffer. Counted on success, by every copy that
	 * has a host side (read/readv/write, upload, peer_read/peer_write).
	 */
	atomic_uint_least64_t direct_bytes, staged_bytes;
};

struct kvfs_tier;

struct kvfs_tier_ops {
	const char *name;
	/* Reserve @len bytes (rounded up to the alignment). 0 or -ENOSPC;
	 * -EINVAL for @len 0; -ENOMEM (dram).
	 */
	int (*alloc)(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e);
	/* Return an extent. Never fails (a double free is logged and
	 * ignored).
	 */
	void (*free)(struct kvfs_tier *t, const struct kvfs_extent *e);
	/* Mark an extent used at a known place (recovery from metadata).
	 * 0, -EINVAL (out of range), -EEXIST (overlaps something used),
	 * -EOPNOTSUPP (dram: nothing there survives a restart).
	 */
	int (*claim)(struct kvfs_tier *t, const struct kvfs_extent *e);
	/* Copy in/out. For ssd, @buf, @off and @len must be 4096-aligned.
	 * 0 or -errno (-EIO on a short transfer); -EINVAL (logged) when the
	 * range leaves the extent or is unaligned. @len 0 is a no-op.
	 * Each call counts one op in st.reads/writes and, on success, @len
	 * in st.bytes_read/written.
	 */
	int (*write)(struct kvfs_tier *t, const struct kvfs_extent *e,
		     uint64_t off, const void *buf, uint64_t len);
	int (*read)(struct kvfs_tier *t, const struct kvfs_extent *e,
		    uint64_t off, void *buf, uint64_t len);
	/* Submit every range of @io as one batch (one io_uring submission for
	 * ssd) and wait for all. Returns 0 if all succeeded, else the first
	 * error (lowest index); each io->res says its own result. A range
	 * that fails the checks of ->read is not issued (res -EINVAL), nor
	 * is one its ->issue refuses (res its return); each issued range
	 * counts one op in st.reads. ssd issues ranges in index order, at
	 * most io->depth (or 256) in flight, KVFS_SSD_MEMORY included (its
	 * copies are then made as the oldest range in flight completes).
	 * Every range's ->done, if set, has been called when readv returns.
	 */
	int (*readv)(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n);
	/* Make every completed write durable (fdatasync). 0 or -errno. */
	int (*sync)(struct kvfs_tier *t);
	/* Direct pointer to the extent's bytes, or NULL if not addressable
	 * (always NULL for ssd, KVFS_SSD_MEMORY included).
	 */
	void *(*map)(struct kvfs_tier *t, const struct kvfs_extent *e);
	/* Free the tier; NULL-safe through kvfs_tier_free(). */
	void (*release)(struct kvfs_tier *t);
};

struct kvfs_tier {
	const struct kvfs_tier_ops *ops;
	int id;                          /* enum kvfs_tier_id */
	uint64_t capacity;               /* bytes */
	uint64_t align;                  /* allocation unit */
	atomic_uint_least64_t used;      /* bytes reserved */
	struct kvfs_tier_stats st;
};

/*
 * The extent allocator a tier reserves its space from (SSD data file,
 * device pool), with its lock; the tier's `used` is kept in step.
 * Locking: p->lock guards p->map; every call takes it.
 */
struct kvfs_tier_pool {
	pthread_mutex_t lock;
	struct kvfs_extent_map map; /* guarded by lock */
};

/* Manage [@base, @base + @size) in @align units. 0, -EINVAL or -ENOMEM. */
int kvfs_tier_pool_init(struct kvfs_tier_pool *p, uint64_t base,
			uint64_t size, uint64_t align);
/* Free the map and destroy the lock; no allocation may be in use. */
void kvfs_tier_pool_release(struct kvfs_tier_pool *p);
/*
 * The ops alloc/free/claim of a tier over @p, keeping @t->used. alloc
 * rounds @len up to the pool's alignment and sets e->off and e->len (the
 * caller sets e->ptr); -EINVAL for 0 bytes (logged with @who), -ENOSPC.
 * free logs and ignores a bad or double free. claim: 0, -EINVAL, -EEXIST.
 */
int kvfs_tier_pool_alloc(struct kvfs_tier *t, struct kvfs_tier_pool *p,
			 const char *who, uint64_t len, struct kvfs_extent *e);
void kvfs_tier_pool_free(struct kvfs_tier *t, struct kvfs_tier_pool *p,
			 const struct kvfs_extent *e);
int kvfs_tier_pool_claim(struct kvfs_tier *t, struct kvfs_tier_pool *p,
			 const struct kvfs_extent *e);

/* DRAM tier of @capacity bytes, heap mode. 0 or -ENOMEM. */
int kvfs_tier_dram_init(uint64_t capacity, struct kvfs_tier **out);

enum kvfs_dram_flags {
	/*
	 * Reserve the whole capacity (rounded down to 4096) as one
	 * anonymous mapping up front and carve extents from it, instead of
	 * a heap buffer per extent: one region a device tier can register
	 * once (gpu.h host_register) so uploads DMA from the blocks
	 * themselves. Extents are 4096-aligned; alloc can fail with
	 * -ENOSPC for fragmentation while used + len <= capacity (the
	 * cache's eviction loop then frees more). Memory touched once
	 * stays resident until the tier is freed.
	 */
	KVFS_DRAM_ARENA = 1 << 0,
	/*
	 * An arena (implies KVFS_DRAM_ARENA) whose every page is faulted
	 * in at init, so no load pays for faulting and zeroing the pages it
	 * lands in. Init then takes time in proportion to the capacity
	 * (logged), and fails with -ENOMEM, logged, when the capacity is
	 * larger than the host's available memory.
	 */
	KVFS_DRAM_PREFAULT = 1 << 1,
};

/*
 * kvfs_tier_dram_init_flags() - the DRAM tier with enum kvfs_dram_flags.
 * Returns 0; -EINVAL (unknown flags, or an arena under 4096 bytes);
 * -ENOMEM (the arena could not be mapped, or is larger than the memory
 * available to prefault: logged); -errno of a failed prefault (logged).
 */
int kvfs_tier_dram_init_flags(uint64_t capacity, unsigned flags,
			      struct kvfs_tier **out);

/*
 * kvfs_tier_dram_region() - the arena of a KVFS_DRAM_ARENA tier: its
 * first byte and length (== capacity), fixed for the tier's life.
 * 0, or -EINVAL for a heap-mode tier or a tier that is not DRAM (*@base
 * NULL, *@len 0). Lock-free.
 */
int kvfs_tier_dram_region(struct kvfs_tier *t, void **base, uint64_t *len);

enum kvfs_ssd_flags {
	/* Back the tier by anonymous memory instead of @path (unit tests). */
	KVFS_SSD_MEMORY = 1 << 0,
	/* Skip fdatasync (benchmarks of the data path only). */
	KVFS_SSD_NOSYNC = 1 << 1,
};

/*
 * kvfs_tier_ssd_init() - open the SSD tier over the data file @path
 * (a regular file or block device; NULL with KVFS_SSD_MEMORY).
 * @data_off:  first usable byte (the data file header precedes it).
 * @size:      size of the file; extents live in [data_off, size).
 * @nrings:    io_uring instances (concurrent submitters), 1..64.
 * @flags:     enum kvfs_ssd_flags.
 * The whole range starts free; recovery claims used extents with ->claim.
 * Returns 0, -ENOENT, -EINVAL (size not aligned, data_off >= size, bad
 * nrings or flags, file shorter than @size, O_DIRECT refused), or another
 * -errno. Every failure is logged.
 */
int kvfs_tier_ssd_init(const char *path, uint64_t data_off, uint64_t size,
		       unsigned nrings, unsigned flags, struct kvfs_tier **out);

/* Release @t; NULL is a no-op. */
void kvfs_tier_free(struct kvfs_tier *t);

/* Name of a tier id: "gpu", "dram", "ssd", "remote"; "?" for any other
 * id.
 */
const char *kvfs_tier_name(int id);
/* Parse the name of a local tier (not "remote"). Returns the id or
 * -EINVAL.
 */
int kvfs_tier_parse(const char *name);

/* Helpers for tier backends (tier/ and the device tiers of gpu/). */
/* Whether [off, off + len) lies inside @e, without overflowing. */
static inline int kvfs_tier_in_extent(const struct kvfs_extent *e,
				      uint64_t off, uint64_t len)
{
	return off <= e->len && len <= e->len - off;
}

/*
 * Reserve @len bytes of @t->capacity in @t->used without a lock.
 * 0 or -ENOSPC.
 */
static inline int kvfs_tier_reserve(struct kvfs_tier *t, uint64_t len)
{
	uint64_t cur = atomic_load(&t->used);

	do {
		if (len > t->capacity || cur > t->capacity - len)
			return -ENOSPC;
	} while (!atomic_compare_exchange_weak(&t->used, &cur, cur + len));
	return 0;
}

/*
 * Count @nops operations of @nbytes bytes in a tier's counters @ops and
 * @bytes: relaxed atomics, since the counters are only ever summed for
 * stats. Any thread, no lock.
 */
static inline void kvfs_tier_count(atomic_uint_least64_t *ops,
				   atomic_uint_least64_t *bytes,
				   uint64_t nops, uint64_t nbytes)
{
	atomic_fetch_add_explicit(ops, nops, memory_order_relaxed);
	atomic_fetch_add_explicit(bytes, nbytes, memory_order_relaxed);
}

#endif
