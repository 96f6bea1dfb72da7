/* SPDX-License-Identifier: MIT */
/*
 * Small helpers shared by every module: sizes, clocks, alignment.
 * Pure functions; thread-safe.
 */
#ifndef KVFS_META_UTIL_H
#define KVFS_META_UTIL_H

#include <stdint.h>
#include <stddef.h>

/*
 * kvfs_util_parse_size() - parse "4096", "64K", "64M", "10G", "1T" (binary
 * multiples, optional trailing "B" or "iB").
 * Returns 0 and sets *out, or -EINVAL (garbage, empty, negative) or
 * -ERANGE (overflow).
 */
int kvfs_util_parse_size(const char *s, uint64_t *out);
/* Parse a decimal u32/u64 with nothing after it. 0, -EINVAL or -ERANGE. */
int kvfs_util_parse_u32(const char *s, uint32_t *out);
int kvfs_util_parse_u64(const char *s, uint64_t *out);
/* Format @v bytes as "1.5G" style into @buf. Returns @buf. */
char *kvfs_util_fmt_size(uint64_t v, char *buf, size_t len);

/* Monotonic and wall-clock time in nanoseconds. */
uint64_t kvfs_util_now_mono(void);
uint64_t kvfs_util_now_real(void);

static inline uint64_t kvfs_util_align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

#endif
