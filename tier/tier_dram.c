/* SPDX-License-Identifier: MIT */
/*
 * DRAM tier, in one of two modes.  Either way an extent's buffer never
 * moves, so map() hands out a stable pointer and reads of resident blocks
 * take no lock at all.
 *
 * heap   (default) every extent is its own 4096-aligned heap buffer;
 *        capacity is accounted with a compare-and-swap on base.used, so a
 *        request fails only when the bytes are not there.
 * arena  (KVFS_DRAM_ARENA) one anonymous mapping of the whole capacity,
 *        made at init, and extents carved from it by the extent allocator
 *        (first fit, 4096-byte units).  A device tier pins the mapping
 *        once (cudaHostRegister), after which uploads from any block are
 *        DMA from the block itself; pinning a heap buffer per extent
 *        would cost a driver call per block.  The price is fragmentation:
 *        alloc can fail with -ENOSPC while enough bytes are free in
 *        pieces.  The cache's eviction loop (kvfs_dram_reserve) keeps
 *        evicting victims until a hole is large enough or nothing is
 *        evictable, the same loop the device pool's allocator relies on.
 *        Pages are not handed back on free (pinned pages cannot be), so
 *        the resident size is the high-water mark.
 * prefault (KVFS_DRAM_PREFAULT) an arena whose every page is faulted in
 *        at init.  A load from the SSD then lands in memory that is
 *        already there: an O_DIRECT read into never-touched pages has
 *        the kernel fault and zero each one first, which on the
 *        benchmark host cost as much again as the read itself
 *        (docs/benchmarks.md, [3a]).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tier/tier.h"
#include "meta/log.h"
#include "meta/util.h"

#define DRAM_ALIGN 4096u

struct kvfs_tier_dram {
	struct kvfs_tier base;
	/* arena mode: the mapping (immutable; NULL in heap mode) */
	unsigned char *arena;
	/* arena mode: pool.lock guards pool.map, the free ranges of the
	 * arena; alloc and free take it, nothing on the read path does.
	 */
	struct kvfs_tier_pool pool;
};

static struct kvfs_tier_dram *to_dram(struct kvfs_tier *t)
{
	return (struct kvfs_tier_dram *)t;
}

static int arena_alloc(struct kvfs_tier *t, uint64_t len,
		       struct kvfs_extent *e)
{
	struct kvfs_tier_dram *d = to_dram(t);
	int err = kvfs_tier_pool_alloc(t, &d->pool, "dram", len, e);

	if (err)
		return err;
	e->ptr = d->arena + e->off;
	return 0;
}

static void arena_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	struct kvfs_tier_dram *d = to_dram(t);

	/* The pointer and the offset must agree, or the extent is not one
	 * this arena handed out (and freeing its offset would free another
	 * block's bytes).
	 */
	if (!e->ptr || e->off > t->capacity ||
	    (unsigned char *)e->ptr != d->arena + e->off) {
		kvfs_err("dram: free of an extent (off %" PRIu64 ") that is "
			 "not in the arena", e->off);
		return;
	}
	kvfs_tier_pool_free(t, &d->pool, e);
}

static int dram_alloc(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e)
{
	void *p;
	int err;

	if (to_dram(t)->arena)
		return arena_alloc(t, len, e);

	if (!len) {
		kvfs_err("dram: allocation of 0 bytes");
		return -EINVAL;
	}
	if (len > t->capacity || len > UINT64_MAX - DRAM_ALIGN)
		return -ENOSPC;
	len = kvfs_util_align_up(len, DRAM_ALIGN);
	err = kvfs_tier_reserve(t, len);
	if (err)
		return err;
	if (len > SIZE_MAX || posix_memalign(&p, DRAM_ALIGN, (size_t)len)) {
		atomic_fetch_sub(&t->used, len);
		return -ENOMEM;
	}
	e->off = 0;
	e->len = len;
	e->ptr = p;
	return 0;
}

static void dram_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	if (to_dram(t)->arena) {
		arena_free(t, e);
		return;
	}
	if (!e->ptr) {
		kvfs_err("dram: free of an extent with no buffer");
		return;
	}
	free(e->ptr);
	atomic_fetch_sub(&t->used, e->len);
}

static int dram_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	/* DRAM contents do not survive a restart: nothing to recover. */
	return -EOPNOTSUPP;
}

static int dram_check(const char *what, const struct kvfs_extent *e,
		      uint64_t off, const void *buf, uint64_t len)
{
	if (!e->ptr || (len && !buf) || !kvfs_tier_in_extent(e, off, len)) {
		kvfs_err("dram: %s of [%" PRIu64 ", +%" PRIu64
			 ") outside extent of %" PRIu64 " bytes or no buffer",
			 what, off, len, e->len);
		return -EINVAL;
	}
	return 0;
}

static int dram_write(struct kvfs_tier *t, const struct kvfs_extent *e,
		      uint64_t off, const void *buf, uint64_t len)
{
	int err = dram_check("write", e, off, buf, len);

	if (err)
		return err;
	memcpy((char *)e->ptr + off, buf, len);
	kvfs_tier_count(&t->st.writes, &t->st.bytes_written, 1, len);
	return 0;
}

static int dram_read(struct kvfs_tier *t, const struct kvfs_extent *e,
		     uint64_t off, void *buf, uint64_t len)
{
	int err = dram_check("read", e, off, buf, len);

	if (err)
		return err;
	memcpy(buf, (const char *)e->ptr + off, len);
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, 1, len);
	return 0;
}

static int dram_readv(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n)
{
	int first = 0;

	for (size_t i = 0; i < n; i++) {
		io[i].res = io[i].ext ?
			dram_read(t, io[i].ext, io[i].off, io[i].buf,
				  io[i].len) : -EINVAL;
		kvfs_tier_io_done(&io[i]);
		if (io[i].res && !first)
			first = io[i].res;
	}
	return first;
}

static int dram_sync(struct kvfs_tier *t)
{
	return 0;
}

static void *dram_map(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return e->ptr;
}

static void dram_release(struct kvfs_tier *t)
{
	struct kvfs_tier_dram *d = to_dram(t);

	if (d->arena) {
		kvfs_tier_pool_release(&d->pool);
		munmap(d->arena, (size_t)t->capacity);
	}
	free(d);
}

static const struct kvfs_tier_ops dram_ops = {
	.name = "dram",
	.alloc = dram_alloc,
	.free = dram_free,
	.claim = dram_claim,
	.write = dram_write,
	.read = dram_read,
	.readv = dram_readv,
	.sync = dram_sync,
	.map = dram_map,
	.release = dram_release,
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* MemAvailable of /proc/meminfo in bytes, or 0 if it cannot be read. */
static uint64_t mem_available(void)
{
	unsigned long long kib = 0;
	char line[128];
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return (uint64_t)kib << 10;
}

/*
 * Whether an arena of @len bytes can be faulted in whole: -ENOMEM, logged,
 * when the host has less memory available, which is refused up front
 * rather than left to the OOM killer half-way through.
 */
static int prefault_fits(uint64_t len)
{
	uint64_t avail = mem_available();
	char sz[32], av[32];

	if (!avail || len <= avail)
		return 0;
	kvfs_util_fmt_size(len, sz, sizeof(sz));
	kvfs_util_fmt_size(avail, av, sizeof(av));
	kvfs_err("dram: cannot prefault a %s arena: only %s of memory is "
		 "available", sz, av);
	return -ENOMEM;
}

/*
 * Fault in every page of the arena @p of @len bytes: one madvise where
 * the kernel has MADV_POPULATE_WRITE, else a write to each page.
 */
static int arena_prefault(unsigned char *p, uint64_t len)
{
	uint64_t t0 = kvfs_util_now_mono();
	long pg = sysconf(_SC_PAGESIZE);
	char sz[32];

	kvfs_util_fmt_size(len, sz, sizeof(sz));
	if (madvise(p, (size_t)len, MADV_POPULATE_WRITE)) {
		if (errno != EINVAL) {
			int err = -errno;

			kvfs_err("dram: prefaulting the %s arena failed: %s",
				 sz, strerror(-err));
			return err;
		}
		/* An older kernel: touch each page instead. */
		for (uint64_t o = 0; o < len; o += (uint64_t)(pg > 0 ? pg : 4096))
			((volatile unsigned char *)p)[o] = 0;
	}
	kvfs_info("dram: prefaulted the %s arena in %" PRIu64 " ms", sz,
		  (kvfs_util_now_mono() - t0) / 1000000);
	return 0;
}

/*
 * Map and set up the arena of @d, @capacity bytes (a multiple of 4096),
 * with every page faulted in if @prefault.
 */
static int arena_init(struct kvfs_tier_dram *d, uint64_t capacity,
		      bool prefault)
{
	void *p;
	int err;

	if (capacity > SIZE_MAX) {
		kvfs_err("dram: an arena of %" PRIu64 " bytes does not fit "
			 "the address space", capacity);
		return -ENOMEM;
	}
	if (prefault) {
		err = prefault_fits(capacity);
		if (err)
			return err;
	}
	/* NORESERVE: like heap buffers, pages are committed when first
	 * touched (or when a device tier pins them), not at start; unless
	 * they are all to be touched now, when the kernel may as well count
	 * them.
	 */
	p = mmap(NULL, (size_t)capacity, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | (prefault ? 0 : MAP_NORESERVE),
		 -1, 0);
	if (p == MAP_FAILED) {
		err = -errno;
		kvfs_err("dram: cannot map an arena of %" PRIu64 " bytes: %s",
			 capacity, strerror(-err));
		return -ENOMEM;
	}
	err = kvfs_tier_pool_init(&d->pool, 0, capacity, DRAM_ALIGN);
	if (err) {
		munmap(p, (size_t)capacity);
		return err;
	}
	/* Fewer TLB misses, and fewer pages for the driver to pin; only a
	 * hint, so a kernel without transparent huge pages is fine.
	 */
	(void)madvise(p, (size_t)capacity, MADV_HUGEPAGE);
	if (prefault) {
		err = arena_prefault(p, capacity);
		if (err) {
			kvfs_tier_pool_release(&d->pool);
			munmap(p, (size_t)capacity);
			return err;
		}
	}
	d->arena = p;
	return 0;
}

int kvfs_tier_dram_init_flags(uint64_t capacity, unsigned flags,
			      struct kvfs_tier **out)
{
	struct kvfs_tier_dram *d;
	int err;

	if (flags & ~(unsigned)(KVFS_DRAM_ARENA | KVFS_DRAM_PREFAULT)) {
		kvfs_err("dram: unknown flags %#x", flags);
		return -EINVAL;
	}
	if (flags & KVFS_DRAM_PREFAULT)
		flags |= KVFS_DRAM_ARENA;
	if (flags & KVFS_DRAM_ARENA) {
		/* An arena is whole units: a remainder could never be used. */
		capacity -= capacity % DRAM_ALIGN;
		if (!capacity) {
			kvfs_err("dram: an arena needs at least %u bytes",
				 DRAM_ALIGN);
			return -EINVAL;
		}
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	if (flags & KVFS_DRAM_ARENA) {
		err = arena_init(d, capacity,
				 (flags & KVFS_DRAM_PREFAULT) != 0);
		if (err) {
			free(d);
			return err;
		}
	}
	d->base.ops = &dram_ops;
	d->base.id = KVFS_TIER_DRAM;
	d->base.capacity = capacity;
	d->base.align = DRAM_ALIGN;
	*out = &d->base;
	return 0;
}

int kvfs_tier_dram_init(uint64_t capacity, struct kvfs_tier **out)
{
	return kvfs_tier_dram_init_flags(capacity, 0, out);
}

int kvfs_tier_dram_region(struct kvfs_tier *t, void **base, uint64_t *len)
{
	*base = NULL;
	*len = 0;
	if (!t || t->ops != &dram_ops || !to_dram(t)->arena)
		return -EINVAL;
	*base = to_dram(t)->arena;
	*len = t->capacity;
	return 0;
}
