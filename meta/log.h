/* SPDX-License-Identifier: MIT */
/*
 * Logging for every kvfs module.  Lines go to stderr (foreground, tools,
 * tests) or to the file set with kvfs_log_open() (the daemon), one line per
 * call, written with a single write(2) so concurrent lines never interleave.
 *
 * Thread-safe; takes no lock.
 */
#ifndef KVFS_META_LOG_H
#define KVFS_META_LOG_H

enum kvfs_log_level {
	KVFS_LOG_ERR = 0,
	KVFS_LOG_WARN = 1,
	KVFS_LOG_INFO = 2,
	KVFS_LOG_DEBUG = 3,
};

/* Lines above @level are dropped. Default KVFS_LOG_INFO. */
void kvfs_log_set_level(int level);
/* Parse "err", "warn", "info", "debug". Returns the level or -EINVAL. */
int kvfs_log_level_parse(const char *name);
/* Append to @path instead of stderr. Returns 0 or -errno. */
int kvfs_log_open(const char *path);
/* Back to stderr, closing a file opened by kvfs_log_open(). */
void kvfs_log_close(void);

/*
 * One log line at @level (dropped below the level set): a timestamp, the
 * level and the formatted text. Thread-safe: a line is written with one
 * call, so lines of several threads never interleave.
 */
void kvfs_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * A rate limit for lines about faults that can repeat many times a second
 * (a network peer down): zero-initialise one per kind of fault.
 */
struct kvfs_log_rl {
	_Atomic unsigned long long next_ns; /* monotonic: next line allowed */
	_Atomic unsigned long long missed;  /* lines dropped since the last */
};

/*
 * kvfs_log_rl_ok() - whether a line may be written now: at most one per
 * @interval_ms. Returns 1 and sets *@missed to the lines dropped since
 * the last one written, or 0 (the line is counted as dropped). Lock-free,
 * any thread.
 */
int kvfs_log_rl_ok(struct kvfs_log_rl *rl, unsigned interval_ms,
		   unsigned long long *missed);

#define kvfs_err(...) kvfs_log(KVFS_LOG_ERR, __VA_ARGS__)
#define kvfs_warn(...) kvfs_log(KVFS_LOG_WARN, __VA_ARGS__)
#define kvfs_info(...) kvfs_log(KVFS_LOG_INFO, __VA_ARGS__)
#define kvfs_dbg(...) kvfs_log(KVFS_LOG_DEBUG, __VA_ARGS__)

#endif
