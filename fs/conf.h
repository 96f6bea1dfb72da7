/* SPDX-License-Identifier: MIT */
/*
 * kvfs.conf: INI, parsed with inih.  Strict: an unknown section or key, a
 * malformed value or a duplicate namespace is an error naming the file,
 * the line and the reason, so a typo never silently changes behaviour.
 * docs/config.md documents every key; the repository's kvfs.conf is a
 * commented example.
 *
 * Not thread-safe; the daemon loads the config once at start.
 */
#ifndef KVFS_FS_CONF_H
#define KVFS_FS_CONF_H

#include <stdint.h>
#include <stddef.h>

#include "cache/params.h"

struct kvfs_conf {
	/* [daemon] */
	unsigned threads; /* max FUSE worker threads (default 16) */
	int log_level; /* enum kvfs_log_level (default info) */
	char log_file[KVFS_PARAMS_STR]; /* "" = STORE/kvfs.log when daemonised */
	/* The Prometheus endpoint's "host:port", "" = none (fs/metrics.h). */
	char metrics[64];
	/* every other section: the engine's */
	struct kvfs_cache_params cache;
};

/* Fill @c with the defaults (the engine's: kvfs_cache_params_defaults())
 * and no namespaces.
 */
void kvfs_conf_defaults(struct kvfs_conf *c);

/*
 * kvfs_conf_load() - read and check a config file.
 * Returns 0; -ENOENT/-EACCES if it cannot be opened; -EINVAL for any
 * syntax or value error. Every error is logged as "PATH:LINE: reason".
 */
int kvfs_conf_load(const char *path, struct kvfs_conf *c);
/* The same from a string; @origin names it in log lines. */
int kvfs_conf_parse(const char *text, const char *origin, struct kvfs_conf *c);

/* A namespace name is 1..63 of [A-Za-z0-9._-], not starting with '.'.
 * Returns 0 or -EINVAL.
 */
int kvfs_conf_ns_name_ok(const char *name);

#endif
