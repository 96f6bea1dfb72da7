/* SPDX-License-Identifier: MIT */
/*
 * The daemon's Prometheus endpoint ([daemon] metrics, docs/operations.md
 * "Metrics"): GET /metrics answers with the engine's counters, gauges and
 * latency histograms in the Prometheus text exposition format (0.0.4),
 * served over HTTP by libmicrohttpd from its own thread.  Every other path
 * or method is 404.  A scrape takes a snapshot (kvfs_cache_stats_get());
 * it never holds an engine lock while it writes to the network, and FUSE
 * requests never wait for it.
 */
#ifndef KVFS_FS_METRICS_H
#define KVFS_FS_METRICS_H

#include <stdio.h>
#include <sys/socket.h>

#include "cache/cache.h"

struct kvfs_metrics;

/*
 * kvfs_metrics_addr_parse() - "IPv4:port" or "[IPv6]:port", numeric
 * addresses only (no names: nothing is resolved), port 1..65535 in
 * decimal, into @ss and *@len (either may be NULL to check only).
 * 0, or -EINVAL with *@why (if not NULL) set to a static reason.
 */
int kvfs_metrics_addr_parse(const char *s, struct sockaddr_storage *ss,
			    socklen_t *len, const char **why);

/*
 * kvfs_metrics_start() - listen on @addr (as kvfs_metrics_addr_parse()
 * takes it) and serve @c's metrics from a thread of libmicrohttpd until
 * kvfs_metrics_stop().  @c must outlive the server.
 * 0; -EINVAL (bad address); the bind's or listen's -errno
 * (-EADDRINUSE, -EACCES, -EADDRNOTAVAIL); -EIO (the server did not
 * start); -ENOMEM.  Each failure is logged.
 */
int kvfs_metrics_start(struct kvfs_cache *c, const char *addr,
		       struct kvfs_metrics **out);

/* Stop serving, close the socket and free. Waits for a scrape under way.
 * NULL is a no-op.
 */
void kvfs_metrics_stop(struct kvfs_metrics *m);

/*
 * kvfs_metrics_write() - the exposition text of @s to @f: every family
 * with its HELP and TYPE lines, names kvfs_<subsystem>_<name> with units
 * in the name and _total on counters.  Nothing of it fails but @f.
 */
void kvfs_metrics_write(const struct kvfs_stats *s, FILE *f);

#endif
