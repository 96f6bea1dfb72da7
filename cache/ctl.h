/* SPDX-License-Identifier: MIT */
/*
 * The engine side of .kvfs/ctl (ABI in meta/kvfs_ctl.h): one session per open
 * descriptor, holding its leases. fs/ turns transports (ioctl, write then
 * read) into kvfs_ctl_exec() calls.
 *
 * Locking: a session may be used by several threads (a descriptor shared
 * after fork, concurrent ioctls); its own mutex guards its lease table.
 * Sessions are linked in the cache under c->ctl_lock for lease reclaim.
 */
#ifndef KVFS_CACHE_CTL_H
#define KVFS_CACHE_CTL_H

#include <stddef.h>

struct kvfs_cache;
struct kvfs_ctl_session;

/* Open a session. 0 or -ENOMEM. */
int kvfs_ctl_open(struct kvfs_cache *c, struct kvfs_ctl_session **out);
/* Release every lease of the session and free it; NULL is a no-op. */
void kvfs_ctl_close(struct kvfs_ctl_session *s);

/*
 * kvfs_ctl_exec() - run one request.
 * @pid:         the calling thread (FUSE's pid); leases are owned by its
 *               process.
 * @req, @len:   the request bytes (struct kvfs_ctl_req and its arrays).
 * @resp, @rlen: on success a malloc'd response the caller frees.
 * @max_resp:    the largest response the transport can carry; a response
 *               that would be larger fails with -E2BIG (use the
 *               write-then-read transport).
 *
 * Returns 0 when the request was well formed: the response says whether
 * the operation succeeded (resp.error). -EINVAL for a malformed request
 * (logged with the reason), -E2BIG, -ENOMEM.
 */
int kvfs_ctl_exec(struct kvfs_ctl_session *s, int pid, const void *req,
		  size_t len, size_t max_resp, void **resp, size_t *rlen);

/*
 * kvfs_ctl_flush() - release the leases that the process of thread @pid
 * took through @s.
 * fs/ calls it from FLUSH, which the kernel sends synchronously on every
 * close() of the descriptor and on process exit, so a client that closes
 * or dies has its leases back before close() or exit completes.
 */
void kvfs_ctl_flush(struct kvfs_ctl_session *s, int pid);

/*
 * kvfs_ctl_reclaim() - take back every lease held longer than
 * c->conf.lease_ms (each logged, and counted in ctl.leases_reclaimed), so
 * that an engine that hangs cannot pin the cache forever. Pool regions
 * are not reclaimed.
 * The mover thread calls it. Locking: takes c->ctl_lock, then each
 * session's lock in turn; the caller holds neither.
 */
void kvfs_ctl_reclaim(struct kvfs_cache *c);

/*
 * kvfs_ctl_init() - register the lease reclaim with the mover as a
 * periodic task (cache/task.c), so the mover calls nothing above it.
 * Called once by kvfs_cache_open() before the threads start.
 * Returns 0 or the registry's -errno.
 */
int kvfs_ctl_init(struct kvfs_cache *c);

#endif
