/* SPDX-License-Identifier: MIT */
/*
 * In-memory extent allocator over [base, base + size): first fit over a
 * sorted array of free ranges, merging neighbours on free.  Used by the SSD
 * tier (and later the device pool).
 *
 * Locking: none inside; the owning tier serialises calls with its lock.
 */
#ifndef KVFS_TIER_EXTENT_H
#define KVFS_TIER_EXTENT_H

#include <stdint.h>
#include <stddef.h>

struct kvfs_extent_range {
	uint64_t off, len;
};

struct kvfs_extent_map {
	struct kvfs_extent_range *r; /* sorted by off, never adjacent */
	size_t n, cap;
	/* Ranges handed out by alloc or claim and not yet freed.  Free
	 * ranges never outnumber them by more than one, so reserving
	 * n_used + 1 slots when handing one out means a free never needs
	 * memory.
	 */
	size_t n_used;
	uint64_t base, size, align;
	uint64_t free_bytes;
};

/* @base, @size, @align: the managed range and the allocation unit (a power
 * of two; base and size must be multiples). The whole range starts free.
 * 0 or -EINVAL/-ENOMEM.
 */
int kvfs_extent_init(struct kvfs_extent_map *m, uint64_t base, uint64_t size,
		     uint64_t align);
/* Free @m's ranges; @m may be zeroed or already released. */
void kvfs_extent_release(struct kvfs_extent_map *m);
/* Allocate @len (rounded up to align), first fit (lowest offset).
 * 0 and *off, or -ENOSPC/-ENOMEM (the slot its free will need could not
 * be reserved; the map is unchanged); -EINVAL for @len 0 (logged).
 */
int kvfs_extent_alloc(struct kvfs_extent_map *m, uint64_t len, uint64_t *off);
/* Free a range. 0, -EINVAL (outside, unaligned or empty), -EEXIST (some
 * part is already free: a double free, logged). On error the map is
 * unchanged. A free of what alloc or claim handed out never fails for
 * lack of memory: they reserved its slot.
 */
int kvfs_extent_free(struct kvfs_extent_map *m, uint64_t off, uint64_t len);
/* Mark a specific range used. 0, -EINVAL (outside, unaligned or empty),
 * -EEXIST (not wholly free), -ENOMEM. Errors are logged.
 */
int kvfs_extent_claim(struct kvfs_extent_map *m, uint64_t off, uint64_t len);
/* Largest free range, for diagnostics. */
uint64_t kvfs_extent_largest(const struct kvfs_extent_map *m);

#endif
