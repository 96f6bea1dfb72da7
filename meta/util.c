/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "meta/util.h"

int kvfs_util_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (*end)
		return -EINVAL;
	*out = v;
	return 0;
}

int kvfs_util_parse_u32(const char *s, uint32_t *out)
{
	uint64_t v;
	int rc = kvfs_util_parse_u64(s, &v);

	if (rc)
		return rc;
	if (v > UINT32_MAX)
		return -ERANGE;
	*out = (uint32_t)v;
	return 0;
}

int kvfs_util_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	switch (toupper((unsigned char)*end)) {
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	default: break;
	}
	if (shift && (*end == 'i' || *end == 'I'))
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}

char *kvfs_util_fmt_size(uint64_t v, char *buf, size_t len)
{
	static const char units[] = "BKMGT";
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 4) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%lluB", (unsigned long long)v);
	else
		snprintf(buf, len, "%.1f%c", d, units[u]);
	return buf;
}

uint64_t kvfs_util_now_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvfs_util_now_real(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Larger transfers are split: Linux moves at most about 2 GiB a call. */
#define UTIL_IO_MAX (1ull << 30)

int kvfs_util_write_full(int fd, const void *buf, uint64_t len, int64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		size_t k = len > UTIL_IO_MAX ? UTIL_IO_MAX : (size_t)len;
		ssize_t n = off >= 0 ? pwrite(fd, p, k, (off_t)off) :
				       write(fd, p, k);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (uint64_t)n;
		if (off >= 0)
			off += n;
	}
	return 0;
}

int kvfs_util_read_full(int fd, void *buf, uint64_t len, int64_t off)
{
	uint8_t *p = buf;

	while (len) {
		size_t k = len > UTIL_IO_MAX ? UTIL_IO_MAX : (size_t)len;
		ssize_t n = off >= 0 ? pread(fd, p, k, (off_t)off) :
				       read(fd, p, k);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;
		p += n;
		len -= (uint64_t)n;
		if (off >= 0)
			off += n;
	}
	return 0;
}

int kvfs_util_shm_orphans(const char *prefix, long (*owner)(const char *rest),
			  bool (*fn)(const char *path, long pid, void *arg),
			  void *arg)
{
	size_t plen = strlen(prefix);
	char path[NAME_MAX + 2];
	struct dirent *d;
	int n = 0;
	DIR *dir;

	dir = opendir("/dev/shm");
	if (!dir)
		return -errno;
	while ((d = readdir(dir))) {
		long pid;

		if (strncmp(d->d_name, prefix, plen))
			continue;
		pid = owner(d->d_name + plen);
		/* EPERM: alive, someone else's. */
		if (!pid || pid == (long)getpid() || !kill((pid_t)pid, 0) ||
		    errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), "/%s", d->d_name);
		if (fn(path, pid, arg))
			n++;
	}
	closedir(dir);
	return n;
}
