/* SPDX-License-Identifier: MIT */
/*
 * Internals shared by the control-file files (cache/ctl*.c); included only
 * from them. Bottom to top, each file calls only those below it:
 *
 *   ctl_access.c   permissions, the caller's identity
 *   ctl_quota.c    pin_quota and quota
 *   ctl_check.c    a request: its checks, its decoding, its context
 *   ctl_sync.c     delivery into the caller: sync words, kept peer, stage
 *   ctl_spec.c     speculative chunk loads and the token that calls them off
 *   ctl_session.c  sessions, their leases and pool regions, reclaim
 *   ctl_fetch.c    whole-block operations (LOOKUP ... STATS)
 *   ctl_chunks.c   FETCH_CHUNKS, SCORES
 *   ctl.c          kvfs_ctl_exec(): the dispatch
 */
#ifndef KVFS_CACHE_CTL_I_H
#define KVFS_CACHE_CTL_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache_i.h"
#include "cache/ctl.h"
#include "meta/kvfs_ctl.h"

/* One block leased by one process of a session; in s->l, under s->lock. */
struct kvfs_ctl_lease {
	struct kvfs_block *b; /* referenced while the lease exists */
	int pid; /* the process that took it */
	uint32_t count; /* takes not yet given back */
	uint64_t since; /* monotonic ns of the last take */
};

/* A pool region FETCH_CHUNKS (F_POOL) filled for a client: held like a
 * lease, by the process that asked. In s->rg, under s->lock.
 */
struct kvfs_ctl_region {
	struct kvfs_extent ext;
	int pid;
};

/*
 * Calls off speculative loads (kvfs_chunk_speculate) once the engine's
 * next real request arrives: held by the session and by each load it
 * started since its last FETCH_CHUNKS; freed by the last holder.
 * Lock-free: both fields are atomics.
 */
struct kvfs_ctl_spec_token {
	atomic_int cancel; /* set once, never cleared */
	atomic_int refs;
};

struct kvfs_ctl_session {
	struct kvfs_cache *c; /* set at open, then read-only */
	pthread_mutex_t lock; /* guards l, n, cap, rg, nrg, caprg, spec */
	struct kvfs_ctl_lease *l;
	size_t n, cap;
	struct kvfs_ctl_region *rg;
	size_t nrg, caprg;
	/* The token of the loads started since the last FETCH_CHUNKS, or
	 * NULL (none yet). s->lock.
	 */
	struct kvfs_ctl_spec_token *spec;
	/* FETCH_CHUNKS staging, kept between requests so that its pages are
	 * faulted in once, not per request. Taken by try-lock; a concurrent
	 * request on the same descriptor stages in its own buffer.
	 */
	pthread_mutex_t stage_lock; /* guards stage, stage_len, stage_* */
	uint8_t *stage;
	size_t stage_len;
	/* The stage is registered with the device tier (pinned), so its
	 * copies to a cuda peer go by DMA without a second staging copy.
	 * Tried once per session: the tier has room for a few regions only.
	 */
	bool stage_pinned, stage_pin_tried;
	/* The client memory its last FETCH_CHUNKS wrote, kept open: an
	 * engine reuses one buffer, and mapping it anew per request costs
	 * more than a sparse fetch. Taken by try-lock like the stage.
	 */
	pthread_mutex_t peer_lock; /* guards peer, peer_uid, peer_gid */
	struct kvfs_gpu_peer *peer;
	/* Who opened the kept peer: a request of anyone else (a descriptor
	 * handed to another user) opens the memory anew, as itself.
	 */
	uint32_t peer_uid, peer_gid;
	struct kvfs_ctl_session *next; /* c->ctl_lock */
};

/*
 * One request in flight. Owned by the thread running kvfs_ctl_exec(),
 * never shared: no field needs a lock. The array pointers point into the
 * request's bytes.
 */
struct kvfs_ctl_ctx {
	struct kvfs_ctl_session *s;
	struct kvfs_ctl_creds *cr; /* who sent the request */
	int pid; /* the caller's process (FETCH*, RELEASE, STATS), else 0 */
	struct kvfs_cache *c;
	const struct kvfs_ctl_req *r;
	const uint8_t (*keys)[16];
	const uint32_t *tokens;
	const struct kvfs_ctl_dst *dst;
	const uint32_t *chunks;
	const float *scores;
	struct kvfs_ns *ns;
	uint8_t (*chain)[16]; /* keys derived from tokens; exec frees it */
	size_t nk; /* keys to work on */
	struct kvfs_ctl_resp *resp;
	struct kvfs_ctl_block *blk; /* resp's block entries */
};

/* The i-th key the request works on (given, or chained from tokens). */
static inline const uint8_t *kvfs_ctl_key_at(const struct kvfs_ctl_ctx *x,
					     size_t i)
{
	return x->chain ? x->chain[i] : x->keys[i];
}

/* ----------------------------------------------------------- ctl_access.c */

/*
 * kvfs_ctl_ns_params() - the config's parameters of @ns, or NULL for a
 * namespace that is only stored. No locks (read-only once open).
 */
const struct kvfs_ns_params *kvfs_ctl_ns_params(struct kvfs_cache *c,
						const struct kvfs_ns *ns);

/* The daemon's filesystem identity, saved while a thread opens client
 * memory as the caller. Owned by that thread.
 */
struct kvfs_ctl_ident {
	bool on; /* the thread has taken on the caller's identity */
	uid_t fsuid;
	gid_t fsgid;
	int n_saved;
	gid_t saved[KVFS_CTL_CREDS_GROUPS];
};

/*
 * kvfs_ctl_ident_enter() - make this thread's filesystem identity (fsuid,
 * fsgid, supplementary groups) @cr's, so that what it opens next the
 * caller could have opened itself. uid 0 keeps the daemon's. A daemon
 * that is not root cannot change identity: it serves only its own user.
 * Returns 0 (@id says what to restore; kvfs_ctl_ident_leave() is always
 * safe on it), or -EACCES (a caller the daemon cannot act as), -errno.
 * Per thread: the raw setgroups call touches no other thread.
 */
int kvfs_ctl_ident_enter(struct kvfs_ctl_creds *cr, struct kvfs_ctl_ident *id);

/* kvfs_ctl_ident_leave() - restore the identity @id saved, if any. */
void kvfs_ctl_ident_leave(struct kvfs_ctl_ident *id);

/* ------------------------------------------------------------ ctl_check.c */

/*
 * kvfs_ctl_bad() - refuse a malformed request.
 * @why: what was wrong, for the log line; @op: the request's op (0 when
 * not yet known).
 * Returns -EINVAL always. No locks.
 */
int kvfs_ctl_bad(const char *why, uint32_t op);

/*
 * kvfs_ctl_decode() - check the @len bytes of @req completely and point
 * @x's request and array fields into them.
 * Returns 0, or -EINVAL for a malformed request (logged with the reason;
 * @x's array fields may then be partly set). Touches nothing else. No
 * locks.
 */
int kvfs_ctl_decode(struct kvfs_ctl_ctx *x, const void *req, size_t len);

/*
 * kvfs_ctl_fail() - fail the operation, not the request: logs the message
 * (info) and sets x->resp->error to @err.
 * Returns 0, so that an operation can return kvfs_ctl_fail(...). No locks.
 */
int kvfs_ctl_fail(struct kvfs_ctl_ctx *x, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * kvfs_ctl_resolve() - the request's namespace (x->ns) and the keys it
 * names (x->nk, and x->chain when chained from token ids over full
 * blocks). STATS and RELEASE of everything without a namespace leave
 * x->ns NULL.
 * Returns 0 (with x->resp->error -ENOENT for an unknown namespace) or
 * -ENOMEM. No locks held; takes none.
 */
int kvfs_ctl_resolve(struct kvfs_ctl_ctx *x);

/*
 * kvfs_ctl_find() - the committed, undeleted block of @key in the
 * request's namespace, referenced (kvfs_cache_put() it), or NULL.
 * Takes the index shard's lock.
 */
struct kvfs_block *kvfs_ctl_find(struct kvfs_ctl_ctx *x, const uint8_t *key);

/*
 * kvfs_ctl_find_all() - every key of the request must name a block: fills
 * @v[0..x->nk) with referenced blocks.
 * Returns 0; when a key is missing, none is held, x->resp->n_cached is the
 * count of blocks found before it and the response fails with -ENOENT
 * naming it. As kvfs_ctl_find() for locks.
 */
int kvfs_ctl_find_all(struct kvfs_ctl_ctx *x, struct kvfs_block **v);

/* kvfs_ctl_put_all() - drop the references on @v[0..n). No locks held. */
void kvfs_ctl_put_all(struct kvfs_cache *c, struct kvfs_block **v, size_t n);

/*
 * kvfs_ctl_fill_block() - response entry @i: key @i, and when @b is not
 * NULL its tiers, token count, payload length and layer size.
 */
void kvfs_ctl_fill_block(struct kvfs_ctl_ctx *x, size_t i,
			 struct kvfs_block *b);

/*
 * kvfs_ctl_need_gpu() - 0 when a device tier is configured; else fails
 * the response with -ENODEV and returns -ENODEV (the caller returns 0).
 */
int kvfs_ctl_need_gpu(struct kvfs_ctl_ctx *x);

/* ------------------------------------------------------------- ctl_sync.c */

/* The caller's completion word, mapped from its shm object. */
struct kvfs_ctl_sync_word {
	uint32_t *w; /* NULL: none opened */
	void *map;
	size_t len;
};

/*
 * kvfs_ctl_sync_open() - map the completion word x->r->sync names,
 * opened with the caller's filesystem identity.
 * Returns 0, or -EINVAL, -ENOENT, -EACCES, -EIO with the response failed
 * by the same error (a bad name or alignment, no such shm object, one the
 * caller could not open itself (logged), a word outside it, a failed
 * map). @sw is zeroed first, so kvfs_ctl_sync_close() is
 * always safe on it. No locks.
 */
int kvfs_ctl_sync_open(struct kvfs_ctl_ctx *x, struct kvfs_ctl_sync_word *sw);

/*
 * kvfs_ctl_sync_signal() - store @v in the word and wake every futex
 * waiter on it, in any process. A word whose object the caller shrank is
 * logged, not stored. No locks.
 */
void kvfs_ctl_sync_signal(struct kvfs_ctl_sync_word *sw, uint32_t v);

/* kvfs_ctl_sync_close() - unmap the word, if one was mapped. */
void kvfs_ctl_sync_close(struct kvfs_ctl_sync_word *sw);

/*
 * kvfs_ctl_peer_open() - the device tier's peer_open of the client memory
 * @m, as the caller: a shm object is opened with the caller's filesystem
 * identity (kvfs_ctl_ident_enter()). One the caller could not open
 * itself is refused: -EACCES, logged, and the response failed with it.
 * Returns 0 or peer_open's -errno. No locks.
 */
int kvfs_ctl_peer_open(struct kvfs_ctl_ctx *x, const struct kvfs_ctl_mem *m,
		       struct kvfs_gpu_peer **out);

/*
 * kvfs_ctl_peer_get() - open the client memory @m for a request: the
 * session's kept peer when it names the same object and the same user
 * opened it, else a new one (kvfs_ctl_peer_open()), kept for next time. *@kept says whether kvfs_ctl_peer_put() must hand it back
 * rather than close it.
 * Returns 0 or the device tier's -errno from peer_open.
 * Locking: on 0 with *@kept, s->peer_lock is held until kvfs_ctl_peer_put();
 * it is only try-locked, so a concurrent request opens its own peer.
 */
int kvfs_ctl_peer_get(struct kvfs_ctl_ctx *x, const struct kvfs_ctl_mem *m,
		      struct kvfs_gpu_peer **out, bool *kept);

/* kvfs_ctl_peer_put() - end the use of kvfs_ctl_peer_get()'s @p (NULL: a
 * no-op): unlocks s->peer_lock when @kept, else closes @p.
 */
void kvfs_ctl_peer_put(struct kvfs_ctl_ctx *x, struct kvfs_gpu_peer *p,
		       bool kept);

/*
 * kvfs_ctl_stage_get() - a host buffer of @need bytes, aligned for
 * O_DIRECT: the session's stage (grown, and pinned for DMA when the
 * device tier is cuda) when s->stage_lock is free, else a buffer of the
 * request's own (*@own set).
 * Returns the buffer, or NULL without memory (*@own then set: nothing to
 * hand back). Locking: unless *@own, s->stage_lock is held until
 * kvfs_ctl_stage_put().
 */
uint8_t *kvfs_ctl_stage_get(struct kvfs_ctl_ctx *x, size_t need, bool *own);

/* kvfs_ctl_stage_put() - end the use of kvfs_ctl_stage_get()'s @stage:
 * frees it when @own (NULL allowed), else unlocks s->stage_lock.
 */
void kvfs_ctl_stage_put(struct kvfs_ctl_ctx *x, uint8_t *stage, bool own);

/*
 * kvfs_ctl_kept_release() - close the session's kept peer and unpin and
 * free its stage. The caller is the session's last user (no locks).
 */
void kvfs_ctl_kept_release(struct kvfs_ctl_session *s);

/* ------------------------------------------------------------- ctl_spec.c */

/*
 * kvfs_ctl_spec_cancel() - the engine's real request (or its leaving)
 * supersedes the guesses the session's speculative loads are making:
 * their reads not yet on the disk are never issued, so that the
 * request's own do not queue behind them. Reads already issued finish,
 * and the request may join them. Takes and releases s->lock.
 */
void kvfs_ctl_spec_cancel(struct kvfs_ctl_session *s);

/*
 * kvfs_ctl_speculate() - start a background load into the chunk cache of
 * the chunks of a FETCH_CHUNKS request (@v its blocks, chunk k being
 * local chunk @local[k] of block @bi[k]) for the layers of the next
 * period, until the session's next FETCH_CHUNKS calls it off. The last
 * period has nothing to load.
 * Best effort: without memory or a thread nothing is loaded. Takes
 * s->lock briefly; the thread holds its own block references.
 */
void kvfs_ctl_speculate(struct kvfs_ctl_ctx *x, struct kvfs_block **v,
			const size_t *bi, const uint32_t *local);

/* ---------------------------------------------------------- ctl_session.c */

/*
 * kvfs_ctl_tgid_of() - the process of thread @tid (FUSE gives threads;
 * leases belong to processes, so that any thread's close, or the
 * process's exit, releases them all). @tid itself when /proc does not say.
 */
int kvfs_ctl_tgid_of(int tid);

/*
 * kvfs_ctl_leases_take() - lease @v[0..n) to process @pid: a leased block
 * is never moved, so nothing can evict it before the caller has it.
 * All or nothing: returns 0, or -ENOMEM with every lease it took given
 * back. Takes and releases s->lock.
 */
int kvfs_ctl_leases_take(struct kvfs_ctl_session *s, int pid,
			 struct kvfs_block **v, size_t n);

/*
 * kvfs_ctl_leases_undo() - give back one lease of @pid on each of
 * @v[0..n): the only rollback of kvfs_ctl_leases_take(), for a request
 * that fails after taking its leases or that held them only for its copy.
 * Takes and releases s->lock.
 */
void kvfs_ctl_leases_undo(struct kvfs_ctl_session *s, int pid,
			  struct kvfs_block **v, size_t n);

/*
 * kvfs_ctl_leases_release() - RELEASE: drop every lease @pid holds on the
 * keys @keys[0..n) (the first entry of each), or with @n == 0 all its
 * leases and pool regions. Keys not leased are ignored. Takes and
 * releases s->lock.
 */
void kvfs_ctl_leases_release(struct kvfs_ctl_session *s, int pid,
			     const uint8_t (*keys)[16], size_t n);

/* kvfs_ctl_leases_count() - the leases @pid holds through @s. Takes and
 * releases s->lock.
 */
uint64_t kvfs_ctl_leases_count(struct kvfs_ctl_session *s, int pid);

/*
 * kvfs_ctl_region_keep() - hand the pool region @ext, filled for process
 * @pid, to the session: held like a lease until RELEASE, FLUSH or close.
 * Returns 0 (the session now frees it) or -ENOMEM (the caller still owns
 * it). Takes and releases s->lock.
 */
int kvfs_ctl_region_keep(struct kvfs_ctl_session *s, int pid,
			 const struct kvfs_extent *ext);

/* ------------------------------------------------------------ ctl_fetch.c */

/*
 * The whole-block operations. Each runs a decoded, resolved request @x
 * and returns 0 (the outcome in x->resp, error included) or -ENOMEM (the
 * request fails). They take the session's and blocks' locks themselves;
 * the caller holds none. kvfs_ctl_pin() does PIN when @pin, else UNPIN.
 */
int kvfs_ctl_lookup(struct kvfs_ctl_ctx *x);
int kvfs_ctl_fetch(struct kvfs_ctl_ctx *x);
int kvfs_ctl_fetch_into(struct kvfs_ctl_ctx *x);
int kvfs_ctl_save(struct kvfs_ctl_ctx *x);
int kvfs_ctl_release(struct kvfs_ctl_ctx *x);
int kvfs_ctl_pin(struct kvfs_ctl_ctx *x, bool pin);
int kvfs_ctl_prefetch(struct kvfs_ctl_ctx *x);
int kvfs_ctl_evict(struct kvfs_ctl_ctx *x);
int kvfs_ctl_stats(struct kvfs_ctl_ctx *x);

/* ----------------------------------------------------------- ctl_chunks.c */

/*
 * FETCH_CHUNKS and SCORES, under the same contract as the whole-block
 * operations above.
 */
int kvfs_ctl_fetch_chunks(struct kvfs_ctl_ctx *x);
int kvfs_ctl_scores(struct kvfs_ctl_ctx *x);

#endif
