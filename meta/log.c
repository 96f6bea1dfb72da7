/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "meta/log.h"

static atomic_int log_level = KVFS_LOG_INFO;
static atomic_int log_fd = STDERR_FILENO;

static const char *const level_names[] = { "err", "warn", "info", "debug" };

void kvfs_log_set_level(int level)
{
	atomic_store(&log_level, level);
}

int kvfs_log_level_parse(const char *name)
{
	for (int i = 0; i < 4; i++)
		if (!strcasecmp(name, level_names[i]))
			return i;
	return -EINVAL;
}

int kvfs_log_open(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);

	if (fd < 0)
		return -errno;
	int old = atomic_exchange(&log_fd, fd);
	if (old != STDERR_FILENO)
		close(old);
	return 0;
}

void kvfs_log_close(void)
{
	int old = atomic_exchange(&log_fd, STDERR_FILENO);

	if (old != STDERR_FILENO)
		close(old);
}

void kvfs_log(int level, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	if (level > atomic_load(&log_level))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ kvfs %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
		     level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line: concurrent threads never interleave mid-line. */
	if (write(atomic_load(&log_fd), line, (size_t)n) < 0)
		return;
}

int kvfs_log_rl_ok(struct kvfs_log_rl *rl, unsigned interval_ms,
		   unsigned long long *missed)
{
	struct timespec ts;
	unsigned long long now, next;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (unsigned long long)ts.tv_sec * 1000000000ull +
	      (unsigned long long)ts.tv_nsec;
	next = atomic_load(&rl->next_ns);
	/* One thread wins the slot; the others count as dropped. */
	if (now < next || !atomic_compare_exchange_strong(
				  &rl->next_ns, &next,
				  now + interval_ms * 1000000ull)) {
		atomic_fetch_add(&rl->missed, 1);
		return 0;
	}
	*missed = atomic_exchange(&rl->missed, 0);
	return 1;
}
