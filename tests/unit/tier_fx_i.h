/* SPDX-License-Identifier: MIT */
/*
 * What the tier suites (test_tier.c: names and the DRAM tier;
 * test_tier_ssd.c: the SSD tier) share: page-aligned buffers of bytes
 * that depend on a seed and on their position, so that a page read back
 * from the wrong place shows.  Failures are cmocka assertions.  The
 * functions keep no state: any thread may call them.
 */
#ifndef KVFS_TESTS_UNIT_TIER_FX_I_H
#define KVFS_TESTS_UNIT_TIER_FX_I_H

#include <stdbool.h>
#include <stdint.h>

#define PG 4096u
/* An SSD tier of both suites: its data area and its device size. */
#define DATA_OFF (16 * PG)
#define SSD_SIZE (16u << 20)

/* tfx_fill() - @len bytes (a multiple of 8) of @buf, from @seed. */
void tfx_fill(void *buf, uint64_t len, uint64_t seed);

/* tfx_same() - whether @buf holds what tfx_fill() writes for @seed. */
bool tfx_same(const void *buf, uint64_t len, uint64_t seed);

/* tfx_xalloc() - @len bytes aligned to PG (a multiple of PG); fails the
 * running test when out of memory.  free() them.
 */
void *tfx_xalloc(uint64_t len);

#endif
