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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvfs_block;
struct kvfs_cache;
struct kvfs_ctl_session;
struct kvfs_ns;

/* The most supplementary groups of a caller that are looked at; a caller
 * in more is judged by the first ones only (it may be refused, never let
 * in wrongly).
 */
#define KVFS_CTL_CREDS_GROUPS 64

/*
 * Who sent a request: fs/ fills it from the FUSE request. Owned by the
 * thread serving the request; no locking.
 */
struct kvfs_ctl_creds {
	int pid; /* the calling thread (FUSE's pid) */
	uint32_t uid, gid; /* its filesystem uid and gid */
	/* Its supplementary groups, read only when a check needs them:
	 * n_groups < 0 until then. get_groups() (NULL: none) fills @list
	 * with at most @max of them and returns how many, or -errno;
	 * @arg is its own (the FUSE request).
	 */
	int n_groups;
	uint32_t groups[KVFS_CTL_CREDS_GROUPS];
	int (*get_groups)(void *arg, uint32_t *list, int max);
	void *arg;
};

/* What a caller wants to do in a namespace (docs/ctl.md, "Permissions"). */
enum kvfs_ctl_may {
	KVFS_CTL_MAY_READ = 1 << 0, /* read blocks, LOOKUP, FETCH*, ... */
	KVFS_CTL_MAY_WRITE = 1 << 1, /* create blocks, SAVE, PIN, EVICT, ... */
};

/* A namespace's owner, group and permission bits, and the mounting user
 * (who, like uid 0, may do everything).
 */
struct kvfs_ctl_owner {
	uint32_t uid, gid, mode;
	uint32_t admin;
};

/*
 * kvfs_ctl_ns_owner() - @ns's owner, group and mode from the engine's
 * parameters (struct kvfs_ns_access); a namespace the config does not
 * name, or names without them, is the mounting user's, mode 0755.
 * No locks (the parameters are read-only once the cache is open).
 */
void kvfs_ctl_ns_owner(struct kvfs_cache *c, const struct kvfs_ns *ns,
		       struct kvfs_ctl_owner *o);

/*
 * kvfs_ctl_may() - whether @cr may do @want (enum kvfs_ctl_may) in a
 * namespace owned as @o says: uid 0 and o->admin may do everything;
 * otherwise the owner's, the group's (primary or supplementary) or the
 * others' bits of o->mode decide, as for a file. Reads @cr's groups when
 * it needs them (@cr is updated).
 * Returns 0 or -EACCES. No locks; logs nothing.
 */
int kvfs_ctl_may(const struct kvfs_ctl_owner *o, struct kvfs_ctl_creds *cr,
		 unsigned want);

/*
 * kvfs_ctl_ns_may() - kvfs_ctl_may() for namespace @ns of @c.
 */
int kvfs_ctl_ns_may(struct kvfs_cache *c, const struct kvfs_ns *ns,
		    struct kvfs_ctl_creds *cr, unsigned want);

/*
 * kvfs_ctl_is_admin() - whether @cr is uid 0 or the mounting user: who
 * may map the device pool, which every namespace shares.
 */
bool kvfs_ctl_is_admin(const struct kvfs_ctl_creds *cr);

/* Open a session. 0 or -ENOMEM. */
int kvfs_ctl_open(struct kvfs_cache *c, struct kvfs_ctl_session **out);
/* Release every lease of the session and free it; NULL is a no-op. */
void kvfs_ctl_close(struct kvfs_ctl_session *s);

/*
 * kvfs_ctl_pin_admit() - kvfs_cache_pin() (cache/cache.h) of @b in @tier, refused with
 * -EDQUOT (logged) when the block's namespace has a pin_quota that the
 * block's bytes would pass (every pinned block of the namespace, in any
 * tier, counts its file size; re-pinning a pinned block adds nothing).
 * Returns what kvfs_cache_pin() returns, or -EDQUOT, -ENOMEM. Takes a
 * lock of its own around the count and the pin, then the cache's.
 */
int kvfs_ctl_pin_admit(struct kvfs_cache *c, struct kvfs_block *b, int tier);

/*
 * kvfs_ctl_quota_admit() - make room for a block of @bytes about to be
 * committed in @ns, under the namespace's quota (its stored bytes): over
 * it, the namespace's own blocks that are neither pinned nor leased are
 * deleted, least recently used first, never another namespace's. Counts
 * the bytes as stored.
 * Returns 0 (also without a quota), -EDQUOT (logged: the block is larger
 * than the quota, or what is left of the namespace is pinned or leased;
 * blocks already deleted to make room stay deleted), or -ENOMEM / a
 * deletion's -errno. Takes a lock of its own, then the
 * cache's (kvfs_block_delete()).
 */
int kvfs_ctl_quota_admit(struct kvfs_cache *c, struct kvfs_ns *ns,
			 uint64_t bytes);

/*
 * kvfs_ctl_exec() - run one request.
 * @cr:          who sent it. Leases are owned by the process of cr->pid.
 *               Each operation is checked against the namespace's owner,
 *               group and mode (kvfs_ctl_may(): read for LOOKUP, FETCH,
 *               FETCH_INTO, FETCH_CHUNKS, SCORES, PREFETCH and RELEASE,
 *               write for SAVE, PIN, UNPIN and EVICT); a refusal is
 *               resp.error -EACCES and a log line. Client memory the
 *               request names is opened with the caller's filesystem
 *               identity.
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
int kvfs_ctl_exec(struct kvfs_ctl_session *s, struct kvfs_ctl_creds *cr,
		  const void *req, size_t len, size_t max_resp, void **resp,
		  size_t *rlen);

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
