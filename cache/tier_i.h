/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the tier backends (cache/tier_*.c only).
 */
#ifndef KVFS_CACHE_TIER_I_H
#define KVFS_CACHE_TIER_I_H

#include <errno.h>
#include <stdint.h>

#include "cache/tier.h"

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

static inline void kvfs_tier_count(atomic_uint_least64_t *ops,
				   atomic_uint_least64_t *bytes,
				   uint64_t nops, uint64_t nbytes)
{
	atomic_fetch_add_explicit(ops, nops, memory_order_relaxed);
	atomic_fetch_add_explicit(bytes, nbytes, memory_order_relaxed);
}

#endif
