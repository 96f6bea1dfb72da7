/* SPDX-License-Identifier: MIT */
/*
 * The chunk cache's private interface: the state its files share and the
 * functions they call across files. Included only by cache/chunk*.c.
 *
 * The files, bottom to top (a file calls only those below it):
 *
 *   chunk_score.c     the score table (per block key and chunk) and decay
 *   chunk_resident.c  the residency sets (device, DRAM): heaps, admission,
 *                     eviction, demotion, promotion, copies to the pool
 *   chunk_persist.c   scores and fallback CRC tables in LMDB
 *   chunk_flight.c    speculative loads' reads others can join
 *   chunk_hidden.c    pieces of blocks stored as hidden states
 *   chunk_ssd.c       the SSD batch: CRC tables, coalescing, checking
 *   chunk_read.c      serving a request (kvfs_chunk_read*, speculate)
 *   chunk.c           set-up, release, forget, scores reported, stats
 *
 * Lock order (chunk.h): c->meta_lock, b->io_lock, st->lock, b->lock.
 * st->lock is never held across an SSD read or a copy into a caller's
 * memory; st->scratch_lock and st->ws_lock are only ever tried while
 * anything else is held.
 */
#ifndef KVFS_CACHE_CHUNK_I_H
#define KVFS_CACHE_CHUNK_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "meta/guard.h"

/* The residency sets, each a min-heap by S. */
enum { CSET_GPU = 0, CSET_DRAM = 1, CSET_N = 2 };

struct centry;
struct cflight;
struct cpw;

/* The score of one chunk of one block; guarded by st->lock. */
struct cscore {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t chunk;
	double i; /* I * st->scale */
	uint64_t f;
	bool dirty; /* not yet in LMDB */
	uint64_t wtick; /* st->tick_total when LMDB last matched */
	struct centry *pieces; /* cached pieces of this chunk (via snext) */
	struct cflight *flights; /* pieces of it speculative loads read */
	struct cscore *hnext;
};

/*
 * A piece a speculative load is reading from the SSD; guarded by
 * st->lock. Owned (allocated and freed) by that load's request; linked on
 * its score until resolved.
 */
struct cflight {
	struct cscore *sc; /* NULL once resolved */
	uint32_t layer;
	struct cpw *waiters; /* requests' pieces waiting (via cpw.wnext) */
	struct cflight *next; /* in sc->flights */
	/* The load's cancel flag (kvfs_chunk_speculate), or NULL; immutable,
	 * valid while the flight is linked (the load's call).
	 */
	const atomic_int *cancel;
	bool issued; /* its read is on the disk (chunk_ssd.c) */
};

/* One cached piece; guarded by st->lock. */
struct centry {
	struct cscore *sc; /* NULL once unlinked ("dead") */
	uint32_t layer;
	uint32_t len; /* chunk bytes */
	int set; /* CSET_*, -1 when dead */
	size_t hidx; /* position in its set's heap */
	uint64_t seq; /* last use: older goes first on a tie */
	uint64_t acct; /* bytes charged to the set */
	/* host and ext never change once the piece is ready: a pinned,
	 * ready piece is copied from without st->lock.
	 */
	void *host; /* DRAM set: the bytes */
	struct kvfs_extent ext; /* device set: the pool extent */
	int pins; /* copies in flight; frees wait for 0 */
	bool ready; /* bytes in place */
	bool spec; /* loaded speculatively, not yet used */
	struct centry *snext;
};

/* A residency set's heap; guarded by st->lock. */
struct cheap {
	struct centry **v;
	size_t n, cap;
};

/* A CRC table a fallback read computed, waiting for the next flush;
 * guarded by st->lock while on st->todo.
 */
struct ccrc_todo {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t *crc;
	size_t n;
	struct ccrc_todo *next;
};

struct kvfs_chunk_state {
	pthread_mutex_t lock; /* guards everything below but the counters */
	struct cscore **sb; /* score hash buckets (chunk_score.c) */
	size_t snb, sn;
	struct cheap heap[CSET_N]; /* chunk_resident.c */
	uint64_t cap[CSET_N]; /* immutable */
	uint64_t used[CSET_N];
	uint64_t seq;
	unsigned halflife; /* immutable */
	uint64_t ticks; /* since the last renormalisation */
	uint64_t tick_total; /* since start */
	double scale; /* 2^(ticks / halflife) */
	struct ccrc_todo *todo; /* chunk_persist.c */

	/* The SSD reads' buffer, kept between requests so its pages are
	 * faulted in once; a concurrent request allocates its own.
	 */
	pthread_mutex_t scratch_lock; /* guards scratch, scratch_len */
	uint8_t *scratch;
	size_t scratch_len;
	/* The restoration workspace of pieces projected from hidden
	 * states, kept like the scratch buffer; a concurrent request
	 * allocates its own.
	 */
	pthread_mutex_t ws_lock; /* guards ws */
	struct kvfs_restore_ws *ws;

	/* Counters: atomics, no lock. */
	atomic_uint_least64_t bytes_wanted, bytes_read, ssd_reads, mem_hits;
	atomic_uint_least64_t bytes_missed; /* wanted bytes the SSD served */
	atomic_uint_least64_t spec_loaded, spec_used, evictions, demotions;
	atomic_uint_least64_t prefetch_joined;
	atomic_uint_least64_t spec_cancelled; /* pieces never issued */
	unsigned spec_depth; /* [chunks] spec_depth; immutable */

	/* Broadcast, with st->lock, whenever a flight with waiters is
	 * resolved.
	 */
	pthread_cond_t flight_cond;
	/* Tests only (kvfs_chunk_set_hook): set while no read runs. */
	kvfs_chunk_hook *hook;
	void *hook_arg;
};

/* A (block key, chunk) whose score a request needs (scores_ensure). */
struct ckey {
	const uint8_t *key;
	uint32_t chunk;
	double i;
	uint64_t f;
	bool dirty;
};

/*
 * A piece to place in the cache: fresh from the SSD, or a DRAM hit that
 * may move up to the device set. Owned by the calling thread.
 */
struct cins {
	struct kvfs_block *b;
	uint32_t layer, chunk, len;
	const void *src;
	struct centry *from; /* pinned DRAM piece (a promotion) */
	bool spec;
	/* @src is a client's memory: copied guarded, and kept only if the
	 * copy still matches @crc (the client may have written meanwhile).
	 */
	bool client;
	bool checked; /* @crc is the piece's verified CRC */
	uint32_t crc;
};

/*
 * A request's state for one piece. Owned by the request's thread, except
 * fl and wnext, guarded by st->lock while the piece is on a flight's
 * waiter list.
 */
struct cpw {
	uint64_t off, len; /* in the served (KV) block file */
	/* In the stored image: the same as off, len but for blocks stored
	 * as hidden states (or split), where layers below b->kv_from hold
	 * hidden-state rows instead of K and V.
	 */
	uint64_t soff, slen;
	uint64_t abs; /* in the data file (SSD pieces) */
	size_t blk; /* index into the distinct blocks */
	struct centry *e; /* pinned cache hit */
	size_t rg; /* SSD pieces: index of its read */
	bool todo; /* not delivered yet */
	bool ssd; /* read from the SSD */
	bool direct; /* read straight into its destination */
	bool proj; /* stored as hidden states: K and V are
			     * projected from them */
	/* A speculative load's piece: the flight its read owns (fl_own).
	 * Another request's: the flight it waits for (join), until that is
	 * resolved (then NULL).
	 */
	struct cflight *fl;
	struct cjoin *jn; /* join: its request's waits */
	struct cpw *wnext; /* join: the flight's next waiter */
	bool fl_own;
	bool join; /* waits for a speculative load's read */
	bool refetch; /* join: not in the cache after all, read it */
};

/*
 * A request's pieces that wait for speculative loads' reads. The request
 * owns it; flights append to @ready when they resolve.
 */
struct cjoin {
	struct kvfs_cache *c;
	struct kvfs_chunk_piece *p;
	struct cpw *pw;
	size_t *ready; /* pieces whose flight resolved, in order;
			       * appended under st->lock */
	atomic_size_t nready; /* entries in @ready; written under st->lock */
	size_t taken; /* of @ready, handled (the request's thread) */
	size_t waiting; /* joins not cancelled (the request's thread,
			       * under st->lock) */
	bool client;
	struct kvfs_chunk_result *res;
	kvfs_chunk_cb *cb;
	void *arg;
};

/* A request's state for one distinct block; owned by its thread. */
struct cbw {
	struct kvfs_block *b;
	bool held; /* counted in b->opens */
	bool ssd; /* has pieces for the SSD */
	bool whole; /* no CRC table: its whole extent is read */
	bool leased; /* holds a lease on its pool copy */
	bool checked; /* whole: the image passed its check */
	int err; /* whole-image check, or why it cannot be read */
	const uint32_t *crc;
	struct kvfs_extent sx, gx;
};

/*
 * Projection of pieces stored as hidden states: a restoration workspace,
 * taken on the first such piece of a request (the shared one when free)
 * and given back at its end. Owned by the request's thread.
 */
struct cprj {
	struct kvfs_chunk_state *st;
	struct kvfs_restore_ws *ws;
	bool shared; /* ws is st->ws, st->ws_lock held */
};

/* ------------------------------------------------------------- helpers */

/* Chunks of @b (0 for a geometry without chunks). Any thread, no lock. */
static inline uint32_t kvfs_chunk_nchunks(const struct kvfs_block *b)
{
	uint32_t c = b->ns->geom.chunk_tokens;

	return c ? (b->n_tokens + c - 1) / c : 0;
}

/* @b's key as 32 hex chars + NUL, for log lines. */
static inline void kvfs_chunk_key_hex(const struct kvfs_block *b,
				      char hex[KVFS_KEY_HEX_LEN + 1])
{
	kvfs_fmt_key_hex(b->pn.key, hex);
}

/* S = I * F of @s (I scaled by st->scale: only compare, never report).
 * Caller holds st->lock.
 */
static inline double kvfs_chunk_score_s(const struct cscore *s)
{
	return s->i * (double)s->f;
}

/* Copy @len bytes into a piece's destination @dst; guarded when a client
 * owns it (@client). 0, or -EFAULT from the guard (that memory vanished).
 * Call without st->lock (chunk.h: never held across a copy into a
 * caller's memory).
 */
static inline int kvfs_chunk_copy_out(void *dst, const void *src, size_t len,
				      bool client)
{
	if (client)
		return kvfs_guard_memcpy(dst, src, len);
	memcpy(dst, src, len);
	return 0;
}

/* ------------------------------------------------- chunk_score.c: table */

/* The score of (@key, @chunk), or NULL. Caller holds st->lock. */
struct cscore *kvfs_chunk_score_find(struct kvfs_chunk_state *st,
				     const uint8_t *key, uint32_t chunk);
/* Add a score (@i already scaled by st->scale, @f, @dirty) for (@key,
 * @chunk), which must not have one; grows the table as needed. The new
 * score, or NULL on ENOMEM (the chunk then goes unscored). Caller holds
 * st->lock.
 */
struct cscore *kvfs_chunk_score_add(struct kvfs_chunk_state *st,
				    const uint8_t *key, uint32_t chunk,
				    double i, uint64_t f, bool dirty);
/* Unlink and free @s, which has no pieces and no flights left. Caller
 * holds st->lock.
 */
void kvfs_chunk_score_remove(struct kvfs_chunk_state *st, struct cscore *s);

/* ------------------------------------------- chunk_resident.c: the sets */

/* Free @e and its bytes (DRAM copy, pool extent) now: @e is unlinked and
 * unpinned, or the whole cache is being released. Any lock or none.
 */
void kvfs_chunk_entry_free(struct kvfs_cache *c, struct centry *e);
/* Take @e out of its set and its chunk's list (a no-op if dead already);
 * its memory goes now, or with the last pin. Caller holds st->lock.
 */
void kvfs_chunk_entry_unlink(struct kvfs_cache *c, struct centry *e);
/* Drop a pin of @e; the last pin of a dead piece frees it. Caller holds
 * st->lock.
 */
void kvfs_chunk_entry_put(struct kvfs_cache *c, struct centry *e);
/* @e was just used (a hit): it becomes the newest of its score in its
 * set's order. Caller holds st->lock.
 */
void kvfs_chunk_entry_touch(struct kvfs_chunk_state *st, struct centry *e);
/* The piece of @s (may be NULL) for @layer, or NULL; with @ready only one
 * whose bytes are in place. Caller holds st->lock.
 */
struct centry *kvfs_chunk_piece_find(struct cscore *s, uint32_t layer,
				     bool ready);
/* Re-place every piece of @s after its score changed. Caller holds
 * st->lock.
 */
void kvfs_chunk_rescore(struct kvfs_chunk_state *st, struct cscore *s);
/* Whether either set would take a piece of @len bytes at score @s now.
 * Caller holds st->lock.
 */
bool kvfs_chunk_would_cache(struct kvfs_cache *c, double s, uint32_t len);
/*
 * kvfs_chunk_insert() - offer @n pieces to the cache: decide where each
 * goes (evicting and demoting lower pieces), run the copies into and out
 * of the device pool without the lock, then publish them. Takes over the
 * hit pin of every in[i].from. Pieces of a deleted or unscored block, and
 * those no set admits, are not kept; nothing is reported (failed copies
 * are logged). Takes st->lock itself: call with it not held.
 */
void kvfs_chunk_insert(struct kvfs_cache *c, const struct cins *in, size_t n);
/*
 * Copy @len bytes at @off of the pool extent @e of @gpu into a piece's
 * destination @dst. A client's memory (@client) is written only by
 * guarded copies: from the pool's host mapping where there is one, else
 * through a bounce buffer. 0, -ENOMEM, or the tier's or the guard's
 * -errno. Call without st->lock; @e must be kept (pinned piece, lease).
 */
int kvfs_chunk_pool_out(struct kvfs_tier *gpu, const struct kvfs_extent *e,
			uint64_t off, void *dst, uint64_t len, bool client);

/* ----------------------------------------------- chunk_persist.c: LMDB */

/*
 * Make sure each (key, chunk) of @v[0..@n) has its score in the table: on
 * first touch it is read from LMDB (one read-only transaction for all),
 * or starts at zero (an unreadable record is logged and rewritten at the
 * next flush). Reorders @v. No error: a chunk left unscored (ENOMEM) is
 * simply not cached. Takes st->lock itself: call with it not held.
 */
void kvfs_chunk_scores_ensure(struct kvfs_cache *c, struct ckey *v, size_t n);
/* A pending CRC table for block @key with room for @n CRCs (in ->crc),
 * not yet queued; NULL on ENOMEM. No lock.
 */
struct ccrc_todo *kvfs_chunk_todo_new(const uint8_t *key, size_t n);
/* Queue @td for the next kvfs_chunk_flush(). Takes st->lock itself. */
void kvfs_chunk_todo_push(struct kvfs_chunk_state *st, struct ccrc_todo *td);
/* Drop the pending CRC tables of block @key (deleted). Caller holds
 * st->lock.
 */
void kvfs_chunk_todo_drop(struct kvfs_chunk_state *st, const uint8_t *key);
/* Free the list @td (NULL is a no-op). No lock: it is off st->todo. */
void kvfs_chunk_todo_free(struct ccrc_todo *td);

/* ------------------------------------------------ chunk_flight.c: joins */

/* The live flight of (@s, @layer) (@s may be NULL): one whose read is on
 * the disk or may still be issued. NULL if none. Caller holds st->lock.
 */
struct cflight *kvfs_chunk_flight_find(struct cscore *s, uint32_t layer);
/* A new flight on @s for @layer of a load @cancel (may be NULL) may call
 * off, linked on @s and owned by the caller; NULL on ENOMEM (nobody can
 * join that read then). Caller holds st->lock.
 */
struct cflight *kvfs_chunk_flight_new(struct cscore *s, uint32_t layer,
				      const atomic_int *cancel);
/*
 * The load's read of @f is over: whatever it brought is in the cache now,
 * or never will be. Unlink it and hand each waiter to its request's ready
 * list. Idempotent. Returns whether anyone waited: the caller then
 * broadcasts st->flight_cond (after dropping st->lock). Caller holds
 * st->lock.
 */
bool kvfs_chunk_flight_resolve(struct cflight *f);
/* Piece @w of @j stops waiting (a block's own copy served it, or the
 * request gives up); a no-op if its flight resolved already. Caller holds
 * st->lock.
 */
void kvfs_chunk_join_leave(struct cjoin *j, struct cpw *w);
/*
 * Resolve the flights that the pieces @idx[0..@n) (all of 0..@n with @idx
 * NULL) of a speculative load's @pw own, and with @drop free them: the
 * load is done with them. Wakes the waiters. Takes st->lock itself.
 */
void kvfs_chunk_flights_settle(struct kvfs_chunk_state *st, struct cpw *pw,
			       const size_t *idx, size_t n, bool drop);
/*
 * Deliver the joined pieces of @j whose loads are done, from the chunk
 * cache, exactly like a hit (counted in res->joined, @j->cb called). One
 * that is not there (the load failed, or the cache did not keep the
 * piece) or whose copy failed is marked refetch, for a read of its own.
 * With @wait, blocks on st->flight_cond until every join is handled;
 * otherwise delivers only those ready now. Takes st->lock itself; the
 * request's thread only.
 */
void kvfs_chunk_join_take(struct cjoin *j, bool wait);

/* -------------------------------------- chunk_hidden.c: hidden states */

/* Give back @pj's workspace (the shared one is unlocked, our own freed).
 * @pj may hold none. The request's thread.
 */
void kvfs_chunk_prj_release(struct cprj *pj);
/*
 * K and V of piece (@layer, @chunk) of @b, from that chunk's hidden-state
 * rows @x, into @out (one chunk in the KV layout, padding rows zeroed),
 * with the namespace's checkpoint. @out is the daemon's memory, never a
 * client's. Takes a workspace into @pj on first use (st->ws_lock is only
 * tried). 0, -ENOMEM or -EIO (logged). Call without st->lock.
 */
int kvfs_chunk_prj_run(struct cprj *pj, struct kvfs_block *b, uint32_t layer,
		       uint32_t chunk, const void *x, void *out);
/* Whether the DRAM copy of @b, stored as hidden states, is the KV image a
 * restoration left there (its pieces are then taken from it). Under
 * b->readers; no lock.
 */
bool kvfs_chunk_kv_image(struct kvfs_block *b);
/*
 * Piece @p (its state @pw) from the DRAM copy of a block stored as
 * hidden states (or split), under b->readers: copied from the KV image
 * or a stored KV layer, projected (into @kv, chunk bytes of our own, via
 * @pj) from stored hidden-state rows, then copied out (@client: guarded).
 * 1 when there is no DRAM copy, 0 when delivered (*@projected says
 * whether @kv holds it), -errno when the copy or the projection failed.
 * Call without st->lock; the block must be held open.
 */
int kvfs_chunk_serve_split(struct kvfs_chunk_piece *p, struct cpw *pw,
			   bool client, struct cprj *pj, uint8_t *kv,
			   bool *projected);

/* ---------------------------------------------- chunk_ssd.c: SSD batch */

/*
 * kvfs_chunk_read_ssd() - read every piece of @p[0..@n) marked pw[i].ssd
 * (their blocks bw[k].ssd, held open) as one readv batch issued layer by
 * layer. A piece whose destination, offset and length are 4 KiB
 * multiples is read straight into its destination; such pieces adjacent
 * on disk share one read (vectored within a layer, across layers only
 * where memory is adjacent too). The others are read into a scratch
 * buffer through merged, 4 KiB-rounded ranges and copied out once
 * checked. A block with no CRC table (bw[k].whole) is read whole and
 * checked by its block CRC, and its table computed and queued for the
 * next flush. Each read is checked, projected where stored as hidden
 * states (@pj), delivered (@cb(@arg, i)) and offered to the cache (@ins:
 * room for @n) as soon as it completes; after each, the pieces of @jn
 * (may be NULL) whose loads are done are delivered too. With @spec,
 * each read resolves the flights its pieces own once checked, at most
 * st->spec_depth reads are on the disk, and with @cancel none is issued
 * once *@cancel is set (their pieces get -ECANCELED). Adds to
 * res->ssd_reads and bytes_read. A piece that failed gets p[i].err
 * (-EIO, -EBADMSG, -ENOMEM, or its block's error). Returns 0 or -ENOMEM
 * (nothing read). Takes the locks it needs; call with none held.
 */
int kvfs_chunk_read_ssd(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			struct cpw *pw, size_t n, struct cbw *bw, size_t nb,
			bool spec, bool client, struct cins *ins,
			struct cprj *pj, struct cjoin *jn,
			const atomic_int *cancel, struct kvfs_chunk_result *res,
			kvfs_chunk_cb *cb, void *arg);

#endif
