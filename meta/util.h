/* SPDX-License-Identifier: MIT */
/*
 * Small helpers shared by every module: sizes, clocks, alignment, the
 * shm objects dead processes left.  Thread-safe.
 */
#ifndef KVFS_META_UTIL_H
#define KVFS_META_UTIL_H

#include <stdbool.h>
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

/* The struct of type @t whose member @m is at @p (the kernel's macro). */
#ifndef container_of
#define container_of(p, t, m) ((t *)((char *)(p) - offsetof(t, m)))
#endif

/* Monotonic and wall-clock time in nanoseconds. */
uint64_t kvfs_util_now_mono(void);
uint64_t kvfs_util_now_real(void);

/*
 * kvfs_util_write_full() - write all @len bytes of @buf to @fd: at offset
 *   @off (pwrite) when @off >= 0, else at the file position (write).
 *   Short writes and EINTR are retried; one call moves at most 1 GiB.
 *   0 or -errno.
 * kvfs_util_read_full() - read exactly @len bytes into @buf, likewise.
 *   0, -ENODATA when the file ends first, or -errno.
 */
int kvfs_util_write_full(int fd, const void *buf, uint64_t len, int64_t off);
int kvfs_util_read_full(int fd, void *buf, uint64_t len, int64_t off);

/*
 * kvfs_util_shm_orphans() - the POSIX shm objects a process that is gone
 *   left behind.  For each entry of /dev/shm named @prefix (no leading
 *   '/') then a rest from which @owner reads the creator's pid (0: not
 *   one of ours), whose pid names no process (kill(pid, 0) says ESRCH;
 *   never this process's), calls @fn with its shm path ("/name", for
 *   shm_unlink()), the pid and @arg.  @fn decides and does the removal.
 *   Returns the number of calls that returned true, or -errno when
 *   /dev/shm cannot be read.  No lock.
 */
int kvfs_util_shm_orphans(const char *prefix, long (*owner)(const char *rest),
			  bool (*fn)(const char *path, long pid, void *arg),
			  void *arg);

/* Little-endian stores and loads: on-disk formats never depend on the
 * host's byte order.
 */
static inline void kvfs_util_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void kvfs_util_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void kvfs_util_put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t kvfs_util_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t kvfs_util_get32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline uint64_t kvfs_util_get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Value of a hex digit (either case), or -1. */
static inline int kvfs_util_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* @v rounded up to a multiple of @a (> 0); the caller keeps it from
 * overflowing.
 */
static inline uint64_t kvfs_util_align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

#endif
