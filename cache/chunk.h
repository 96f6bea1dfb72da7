/* SPDX-License-Identifier: MIT */
/*
 * Chunk-granular access (ContiguousKV): reading chosen chunks of chosen
 * layers of a block without reading the rest, and the attention-guided
 * chunk cache that keeps the chunks that matter in DRAM and the device
 * pool.
 *
 * A piece is (block, layer, chunk): chunk_bytes = 2 * c * kv_heads *
 * head_dim * dtype size contiguous bytes of the block file, K then V
 * (meta/fmt.h, kvfs_fmt_chunk_range). When chunk_bytes is a multiple of
 * 4 KiB every piece starts on a 4 KiB boundary of the file and of its SSD
 * extent, so a piece is read with no amplification; otherwise reads are
 * rounded out to 4 KiB.
 *
 * Every piece read from the SSD is verified against its own CRC-32C
 * (computed at commit by kvfs_fmt_chunk_crcs(), meta/fmt.h; stored in
 * LMDB with the block record): a sparse read
 * cannot use the block's payload CRC, and torn bytes are never served. A
 * block stored without them (before they existed) is read whole once and
 * checked by its block CRC; its table is rebuilt then and stored by the
 * next kvfs_chunk_flush(). docs/contiguouskv.md has the details.
 *
 * Pieces are always delivered in the served KV layout. A block stored as
 * hidden states (kind HIDDEN, or MIXED below its kv_from) holds a piece's
 * hidden-state rows instead (meta/fmt.h, kvfs_fmt_piece_range): those rows
 * are read (and checked against the CRC of the stored piece), and K and V
 * are projected from them with the namespace's checkpoint
 * (kvfs_restore_layer on that chunk alone). Once a restoration has left
 * the block's KV image in DRAM, pieces are copied from it instead.
 *
 * Scores (paper 004 §4.4): per (block, chunk), I = cumulative attention
 * reported by engines, F = loads the engines asked for, S = I * F. The
 * cache holds pieces in two sets, device and DRAM, each evicting its
 * lowest S; a piece evicted from the device set drops to DRAM if its S is
 * above DRAM's lowest. Scores survive eviction and restarts (LMDB, batched).
 *
 * Locking: the chunk cache has its own mutex (inside c->chunks), taken
 * after c->meta_lock and b->io_lock and before b->lock; it is never held
 * across an SSD read or a copy into the caller's memory. A request may
 * block (on that mutex's condition variable, holding nothing a load
 * blocks on: loads only try the shared buffers' locks) until a
 * speculative load's read of a piece it needs is done; speculative loads
 * never block on requests. Every function here
 * may be called from any thread.
 */
#ifndef KVFS_CACHE_CHUNK_H
#define KVFS_CACHE_CHUNK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct kvfs_cache;
struct kvfs_block;

/* Where a piece came from. */
enum kvfs_chunk_from {
	KVFS_CHUNK_FROM_CACHE = 1, /* the chunk cache (DRAM or device set) */
	KVFS_CHUNK_FROM_BLOCK,     /* the block's own DRAM or pool copy */
	KVFS_CHUNK_FROM_SSD,       /* read now */
};

struct kvfs_chunk_piece {
	struct kvfs_block *b;  /* referenced by the caller for the call */
	uint32_t layer;
	uint32_t chunk;        /* index within the block */
	void *dst;             /* chunk_bytes of host memory, or NULL with
				* KVFS_CHUNK_SPECULATIVE */
	int from;              /* out: enum kvfs_chunk_from, 0 if not
				* delivered */
	int spec;              /* out: the cached copy was a speculative load */
	int err;               /* out: 0, or why this piece was not
				* delivered (-EBADMSG, -EIO, -ENOENT;
				* -ECANCELED: a cancelled speculative
				* load did not read it) */
};

struct kvfs_chunk_result {
	uint64_t bytes_wanted; /* pieces * chunk_bytes */
	uint64_t bytes_read;   /* read from the SSD, alignment included */
	uint32_t ssd_reads;    /* read operations after coalescing */
	uint32_t mem_hits;     /* pieces served from memory */
	uint32_t spec_hits;    /* of those, from a speculative load */
	/* Pieces a speculative load was still reading when asked for: the
	 * request waited for that read and took the piece from the chunk
	 * cache. Counted in neither mem_hits nor bytes_read (the load's
	 * read is not this request's); a piece whose load failed or was not
	 * cached is read again and counted as any SSD piece.
	 */
	uint32_t joined;
};

enum kvfs_chunk_flags {
	/* Load into the chunk cache only (no dst): an inter-period prefetch.
	 * Such loads do not count in F until an engine request uses them.
	 */
	KVFS_CHUNK_SPECULATIVE = 1 << 0,
	/* Every dst is memory a client owns (its shm, mapped by us): it may
	 * vanish or change at any time, so it is written only by the kernel
	 * (O_DIRECT reads) or by guarded copies, and what the chunk cache
	 * keeps from it is copied once and checked again. Without it, dst
	 * is the caller's own memory.
	 */
	KVFS_CHUNK_CLIENT_DST = 1 << 1,
};

/* Set up the chunk cache from the config ([chunks] capacities); 0 or
 * -errno. Called by kvfs_cache_open after the tiers exist.
 */
int kvfs_chunk_init(struct kvfs_cache *c);
/* Drop every cached piece and the score table (scores were flushed). */
void kvfs_chunk_release(struct kvfs_cache *c);

/*
 * kvfs_chunk_read() - deliver @n pieces (all of one namespace).
 * Memory first (chunk cache, then the block's DRAM or pool copy); the rest
 * is read from the SSD in one io_uring batch. A piece whose dst, offset
 * and length are 4 KiB-aligned is read straight into dst (no copy), and
 * such pieces adjacent both in the data file and in memory share one
 * read; other pieces adjacent in the data file are coalesced into one
 * read of a scratch buffer and copied out. Each read is verified and
 * delivered as soon as it completes, while the rest are on the disk. The
 * dst of a piece that failed is left as it was, or zeroed where the read
 * went straight there: torn bytes are never left in it.
 * Returns 0, -EINVAL (a layer or chunk out of range for its block, a NULL
 * dst without
 * KVFS_CHUNK_SPECULATIVE, unknown flags: checked before anything is read,
 * nothing delivered, logged), -EBADMSG (a piece failed its CRC: not
 * delivered, logged), -EIO, -ENOENT (a block was deleted meanwhile),
 * -ENOMEM. With -EBADMSG, -EIO or -ENOENT every other piece is still
 * delivered; p[i].err says which were not (-EIO wins over -EBADMSG over
 * -ENOENT in the return value). A piece stored as hidden states in a
 * namespace without a loaded checkpoint is -EINVAL (checked first, logged);
 * a projection that fails is -EIO or -ENOMEM for its piece.
 * Every non-speculative piece adds 1 to F of its (block, chunk): F counts
 * layer-chunk loads, however the engine splits them into calls.
 * With KVFS_CHUNK_SPECULATIVE a piece that is in no memory is read only if
 * the chunk cache would admit it now (its score beats a full set's
 * lowest), and not if another speculative load is reading it already;
 * p[i].from stays 0 for one that is skipped. Such a load keeps at most
 * [chunks] spec_depth reads on the disk at once (0: no limit of its own),
 * so that a request's reads do not queue behind all of it.
 * A non-speculative request that needs a piece a speculative load is
 * reading right now joins that read instead of issuing its own: it reads
 * its other pieces meanwhile, then waits for the load to offer the piece
 * to the chunk cache and takes the cached, CRC-verified bytes
 * (p[i].from = KVFS_CHUNK_FROM_CACHE, p[i].spec = 1, counted in
 * res->joined). If the load failed (I/O error, CRC mismatch), was
 * cancelled before issuing that read, or the piece did not stay in the
 * cache, the request reads it itself. A piece whose load was cancelled
 * and whose read was not issued is never joined: the request reads it
 * with its own. The wait is bounded by the load's own reads; a
 * speculative request never waits.
 * @res may be NULL.
 */
int kvfs_chunk_read(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		    size_t n, unsigned flags, struct kvfs_chunk_result *res);

/*
 * kvfs_chunk_read_cb() - kvfs_chunk_read() that also calls @cb(@arg, i) for
 * each piece p[i] as soon as it is delivered (p[i].from set), on the
 * calling thread, while later pieces may still be on the disk: an engine
 * can start on layer l while l+1.. load. Pieces that are not delivered get
 * no call. SSD reads are issued layer by layer, each layer in disk order.
 */
typedef void kvfs_chunk_cb(void *arg, size_t i);
int kvfs_chunk_read_cb(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
		       size_t n, unsigned flags,
		       struct kvfs_chunk_result *res, kvfs_chunk_cb *cb,
		       void *arg);

/*
 * kvfs_chunk_speculate() - kvfs_chunk_read(@c, @p, @n,
 * KVFS_CHUNK_SPECULATIVE, @res) that its caller can call off: once
 * *@cancel is nonzero (set by any thread, never cleared while the call
 * runs), the load issues no more SSD reads. Reads already on the disk
 * complete and are checked, cached and joinable as usual; each piece of
 * a read not issued gets err -ECANCELED and from 0, counts in the
 * spec_cancelled stat and in neither bytes_read nor ssd_reads, and a
 * request that joined it meanwhile reads it itself. @cancel must stay
 * valid until the call returns; NULL: nothing can call the load off.
 * Returns like kvfs_chunk_read(); a cancelled piece ranks below every
 * failure (-ECANCELED is returned only when nothing failed).
 */
int kvfs_chunk_speculate(struct kvfs_cache *c, struct kvfs_chunk_piece *p,
			 size_t n, const atomic_int *cancel,
			 struct kvfs_chunk_result *res);

/* Add an engine-reported attention score to chunk @chunk of @b: I += @a
 * (a sum that would overflow stays at DBL_MAX). 0, -EINVAL (chunk out of
 * range, score negative or not finite; logged), -ENOMEM. A block deleted
 * meanwhile gets no score (0).
 */
int kvfs_chunk_score(struct kvfs_cache *c, struct kvfs_block *b,
		     uint32_t chunk, double a);

/* One engine request has finished (SCORES): with [chunks] score_halflife
 * H > 0 every I is multiplied by 2^(-1/H); a no-op with H = 0.
 */
void kvfs_chunk_tick(struct kvfs_cache *c);

/* Write dirty scores (and CRC tables computed by a fallback read) to LMDB
 * in one transaction, under c->meta_lock (mover thread, shutdown). Scores
 * of a block without a record yet (not written back) stay dirty for the
 * next flush. 0 or -errno (logged; everything stays dirty).
 */
int kvfs_chunk_flush(struct kvfs_cache *c);

/* Forget a deleted block's pieces and its in-memory scores (not its
 * scores' records: the delete transaction removes those). Called with no
 * lock held, after KVFS_B_DELETED is set: pieces loaded concurrently are
 * then never cached.
 */
void kvfs_chunk_forget(struct kvfs_cache *c, struct kvfs_block *b);

/* Introspection for tests and stats. Counters are since start;
 * evictions are pieces dropped from memory, demotions pieces moved from
 * the device set to DRAM; spec_loaded counts speculative pieces cached,
 * spec_used those an engine request used afterwards, from the cache
 * (also in mem_hits) or by waiting for their load (prefetch_joined, in
 * neither mem_hits nor bytes_missed); spec_cancelled counts pieces a
 * speculative load meant to read and did not, because it was cancelled
 * (kvfs_chunk_speculate) before issuing their reads.
 */
struct kvfs_chunk_stats {
	uint64_t dram_used, dram_capacity, dram_pieces;
	uint64_t gpu_used, gpu_capacity, gpu_pieces;
	uint64_t bytes_wanted, bytes_read, ssd_reads, mem_hits;
	uint64_t bytes_missed; /* of bytes_wanted, those read from the SSD */
	uint64_t spec_loaded, spec_used, evictions, demotions;
	uint64_t prefetch_joined, spec_cancelled;
};
void kvfs_chunk_get_stats(struct kvfs_cache *c, struct kvfs_chunk_stats *st);
/* Score of (b, chunk): I, F and S = I * F (each pointer may be NULL);
 * -ENOENT if never seen, -EINVAL for a chunk out of range, or an LMDB
 * error.
 */
int kvfs_chunk_get_score(struct kvfs_cache *c, struct kvfs_block *b,
			 uint32_t chunk, double *i, uint64_t *f, double *s);

/* Where the chunk cache holds piece (b, layer, chunk) now (tests,
 * diagnostics). A piece still being copied in counts as not held.
 */
enum kvfs_chunk_where {
	KVFS_CHUNK_IN_NONE = 0,
	KVFS_CHUNK_IN_DRAM = 1,
	KVFS_CHUNK_IN_GPU = 2,
};
int kvfs_chunk_where(struct kvfs_cache *c, struct kvfs_block *b,
		     uint32_t layer, uint32_t chunk);

/*
 * Tests only: a hook the read path calls, to hold a read in flight, fail
 * it or damage its bytes deterministically. KVFS_CHUNK_HOOK_READ: an SSD
 * read has completed and its pieces are about to be checked; the hook
 * may change *@res (0 or -errno) and the bytes at @buf (NULL for a read
 * vectored into several destinations), and may block: the rest of that
 * batch waits. KVFS_CHUNK_HOOK_JOIN: a request is about to read its
 * other pieces and then wait for @joined pieces speculative loads are
 * reading. Both run on the reading thread with no lock of the chunk cache
 * held. Set @fn (NULL to clear) only while no read runs.
 */
enum kvfs_chunk_hook_kind {
	KVFS_CHUNK_HOOK_READ = 1,
	KVFS_CHUNK_HOOK_JOIN = 2,
};
struct kvfs_chunk_hook_ev {
	int spec;        /* READ: the read is a speculative load's */
	int *res;        /* READ: the read's result */
	void *buf;       /* READ: its bytes, or NULL */
	uint64_t len;    /* READ: bytes at @buf */
	size_t joined;   /* JOIN: pieces the request waits for */
};
typedef void kvfs_chunk_hook(void *arg, int kind,
			     const struct kvfs_chunk_hook_ev *ev);
void kvfs_chunk_set_hook(struct kvfs_cache *c, kvfs_chunk_hook *fn,
			 void *arg);

#endif
