/* SPDX-License-Identifier: MIT */
/*
 * The kvfs cache engine: namespaces, the block index, the tiers, the policy
 * and the background threads (write-back, policy/counter flusher).  fs/
 * calls only this header; it never touches tiers or metadata directly.
 *
 * Lifecycle of a block:
 *   pending   created by kvfs_cache_create(), filled by kvfs_cache_write(),
 *             invisible to other lookups;
 *   committed kvfs_cache_commit() validated it and placed it in DRAM (a
 *             namespace whose blocks cannot fit in DRAM is refused at
 *             open); immutable;
 *   persisted the write-back thread wrote it to the SSD data file, synced,
 *             then committed its LMDB record: it survives a crash;
 *   deleted   unlinked or evicted from the SSD; freed with its last ref.
 *
 * Locking (outermost first): c->meta_lock, b->io_lock, c->policy_lock,
 * index shard locks and ns->lock, b->lock.  The read path of a DRAM-resident
 * block takes no lock at all: it counts itself in b->readers and loads the
 * buffer pointer; eviction publishes NULL first and then checks readers.
 *
 * Every function returns 0 or -errno unless stated otherwise.
 */
#ifndef KVFS_CACHE_CACHE_H
#define KVFS_CACHE_CACHE_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

#include "meta/fmt.h"
#include "meta/hist.h"
#include "cache/chunk.h"
#include "cache/params.h"

/* Fixed inode numbers of the mount. */
enum kvfs_ino {
	KVFS_INO_ROOT = 1,
	KVFS_INO_CTLDIR = 2, /* .kvfs */
	KVFS_INO_STATS = 3,  /* .kvfs/stats */
	KVFS_INO_CTL = 4,    /* .kvfs/ctl (control file issue) */
	KVFS_INO_NS_BASE = 16,        /* namespace dirs: base + ns id */
	KVFS_INO_BLOCK_BASE = 1 << 20, /* blocks and pending files */
};

struct kvfs_cache;
struct kvfs_ns;
struct kvfs_block;
struct kvfs_pending;

enum kvfs_cache_flags {
	/* Skip fsync of data and metadata (benchmarks only, never a mount). */
	KVFS_CACHE_NOSYNC = 1 << 0,
	/* No background threads: tests drive write-back by hand. */
	KVFS_CACHE_NOTHREADS = 1 << 1,
};

/*
 * kvfs_cache_open() - open the store at @dir with @conf and start the engine.
 * Reconciles the config's namespaces with the stored ones (a changed
 * geometry is refused with -EINVAL naming the namespace and the field),
 * rebuilds the block index from LMDB, reconciles the SSD free map, builds
 * the tiers and the policy, and starts the background threads.
 * Errors: whatever the store, config or policy report; each is logged.
 */
int kvfs_cache_open(const char *dir, const struct kvfs_cache_params *conf,
		    unsigned flags, struct kvfs_cache **out);
/* Persist every committed block, flush counters, stop threads, close the
 * store and free. NULL is a no-op. Returns nothing: failures are logged.
 */
void kvfs_cache_free(struct kvfs_cache *c);

/* ---- namespaces (immutable after open; no locking needed) ---- */
size_t kvfs_cache_ns_count(const struct kvfs_cache *c);
struct kvfs_ns *kvfs_cache_ns_at(struct kvfs_cache *c, size_t i);
struct kvfs_ns *kvfs_cache_ns_by_name(struct kvfs_cache *c, const char *name);
struct kvfs_ns *kvfs_cache_ns_by_ino(struct kvfs_cache *c, uint64_t ino);
const char *kvfs_ns_name(const struct kvfs_ns *ns);
uint64_t kvfs_ns_ino(const struct kvfs_ns *ns);
const struct kvfs_geom *kvfs_ns_geom(const struct kvfs_ns *ns);
const uint8_t *kvfs_ns_root(const struct kvfs_ns *ns);
/* Committed blocks in the namespace. */
uint64_t kvfs_ns_nblocks(const struct kvfs_ns *ns);

/*
 * kvfs_ns_list() - call @fn for committed blocks of @ns whose inode is
 * greater than @after, in inode order, until @fn returns nonzero.
 * Takes ns->lock shared; @fn must not call back into the cache.
 */
int kvfs_ns_list(struct kvfs_ns *ns, uint64_t after,
		 int (*fn)(const char *name, uint64_t ino, void *arg),
		 void *arg);

/* ---- block lookup and references ---- */

/* A committed block by file name in @ns, with a reference.
 * -ENOENT (absent, pending or being deleted), -EINVAL (not a block name).
 */
int kvfs_cache_lookup(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name, struct kvfs_block **out);
/*
 * kvfs_cache_lookup_remote() - a block of @ns by file name that is not
 * local, from the remote tier ([tier.remote], docs/remote.md): looked
 * up, checked, and imported as a local block (DRAM, then persisted like
 * a committed block), with a reference.  -ENOENT without a remote tier,
 * for a miss, a rejected value, or a fault: the remote tier's faults are
 * misses.  Waits at most one round trip to the block's node (no retry;
 * tier/tier_remote.h says the bound).
 */
int kvfs_cache_lookup_remote(struct kvfs_cache *c, struct kvfs_ns *ns,
			     const char *name, struct kvfs_block **out);
/* A committed block by inode, with a reference; -ENOENT. */
int kvfs_cache_get(struct kvfs_cache *c, uint64_t ino,
		   struct kvfs_block **out);
/* Drop a reference; the last one frees a deleted block's space. */
void kvfs_cache_put(struct kvfs_cache *c, struct kvfs_block *b);

/* Read-only facts of a block (valid while a reference is held). */
struct kvfs_block_info {
	uint64_t ino;
	uint64_t size;        /* the file's size: the KV-kind file it reads as */
	uint64_t stored_size; /* bytes stored (differs for hidden states) */
	uint16_t stored_kind; /* enum kvfs_fmt_kind of what is stored */
	/* Stored layers below it are hidden states, the others K and V
	 * (meta/fmt.h split layouts): 0 for KV, n_layers for HIDDEN.
	 */
	uint32_t stored_kv_from;
	uint32_t n_layers;
	uint64_t created; /* ns */
	uint64_t last_access; /* ns */
	uint64_t hits;
	uint32_t n_tokens;
	uint32_t depth;
	uint32_t tiers;  /* enum kvfs_tier_bit */
	uint32_t pins;   /* enum kvfs_tier_bit */
	uint32_t category;
	uint32_t leases; /* held through .kvfs/ctl */
	bool persisted;
	bool remote; /* the remote tier has it (fetched from it, or SET) */
	uint8_t key[KVFS_KEY_LEN];
	uint8_t parent[KVFS_KEY_LEN];
};
void kvfs_block_info(struct kvfs_block *b, struct kvfs_block_info *out);
struct kvfs_ns *kvfs_block_ns(struct kvfs_block *b);

/* ---- write path ---- */

/*
 * kvfs_cache_create() - start a new block file @name in @ns.
 * Returns -EINVAL (not "<32 hex>.kv"), -EEXIST (committed or another
 * writer has it pending), -EPERM (name exists and is immutable: use for
 * O_TRUNC opens of a committed block, decided by the caller).
 */
int kvfs_cache_create(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name, struct kvfs_pending **out);
/* Write into a pending file. -EFBIG past the namespace's largest block. */
int kvfs_cache_write(struct kvfs_pending *p, uint64_t off, const void *buf,
		     size_t len);
/* Set a pending file's size (zero-fills when growing). -EFBIG. */
int kvfs_cache_truncate(struct kvfs_pending *p, uint64_t size);
uint64_t kvfs_pending_ino(const struct kvfs_pending *p);
/* Size of the pending file with inode @ino (only its writer can reach
 * it: the name does not resolve for anyone else). 0 or -ENOENT.
 */
int kvfs_cache_pending_size(struct kvfs_cache *c, uint64_t ino,
			    uint64_t *size);
uint64_t kvfs_pending_size(const struct kvfs_pending *p);
/*
 * kvfs_cache_commit() - validate and publish a pending file. Consumes @p
 * whatever the result (a failed block is not stored). On success *out
 * gets a referenced block.
 * A HIDDEN-kind block needs a namespace with weights; it is stored as
 * written, or restored here and stored as the KV block it stands for,
 * as the namespace's store_as decides (docs/hcache.md).
 * Errors: -EINVAL / -EBADMSG (validation, or HIDDEN without weights; the
 * log names the check), -EEXIST (committed meanwhile), -ENOSPC (nothing
 * evictable), -EIO / -ENOMEM (the restoration at commit failed).
 */
int kvfs_cache_commit(struct kvfs_cache *c, struct kvfs_pending *p,
		      struct kvfs_block **out);
/* Drop a pending file without committing it. */
void kvfs_cache_abandon(struct kvfs_cache *c, struct kvfs_pending *p);

/*
 * Temporaries: a file in a namespace directory whose name is not a block
 * name ("<32 hex>.kv"), as rsync and editors write before renaming
 * (".NAME.XXXXXX").  It holds an uncommitted block in memory: never
 * listed, never stored, gone at restart.  It outlives its handles (rsync
 * closes before it renames) until it is renamed to its key, which commits
 * it (kvfs_cache_commit()'s validation), or unlinked; one closed and left
 * alone for KVFS_TEMP_TTL_S is dropped when the next temporary is made.
 * All take c->pending_lock (below the engine's other locks).
 */
enum {
	KVFS_TEMP_MAX = 256,   /* temporaries at once, all namespaces */
	KVFS_TEMP_TTL_S = 600, /* a closed temporary's life if not renamed */
};
/* Start temporary @name in @ns and open it: *out is the handle's
 * reference (kvfs_cache_write()/truncate() on it; kvfs_cache_temp_close()
 * at release).  -EINVAL (a block name, "." or "..", or a '/'),
 * -ENAMETOOLONG, -EEXIST (a temporary of that name exists), -ENOSPC
 * (KVFS_TEMP_MAX of them), -ENOMEM.
 */
int kvfs_cache_temp_create(struct kvfs_cache *c, struct kvfs_ns *ns,
			   const char *name, struct kvfs_pending **out);
/* Open temporary with inode @ino again (writers only): *out as
 * kvfs_cache_temp_create()'s.  -ENOENT (no such temporary).
 */
int kvfs_cache_temp_open(struct kvfs_cache *c, uint64_t ino,
			 struct kvfs_pending **out);
/* Drop a handle's reference (the file stays, named, until renamed,
 * unlinked or expired). NULL is a no-op.
 */
void kvfs_cache_temp_close(struct kvfs_cache *c, struct kvfs_pending *p);
/* True when @p is a temporary (a handle's pending file). */
bool kvfs_pending_is_temp(const struct kvfs_pending *p);
/* Inode and size of temporary @name in @ns: 0 or -ENOENT. */
int kvfs_cache_temp_stat(struct kvfs_cache *c, struct kvfs_ns *ns,
			 const char *name, uint64_t *ino, uint64_t *size);
/* Remove temporary @name (freed once its last handle closes). -ENOENT. */
int kvfs_cache_temp_unlink(struct kvfs_cache *c, struct kvfs_ns *ns,
			   const char *name);
/*
 * kvfs_cache_temp_commit() - rename temporary @name in @ns to the block
 * name @newname: the file gets that key and is committed as a close would
 * commit it (the same validation; a file that fails it is dropped, as a
 * failed close drops it).  On success *out gets a referenced block whose
 * inode is the temporary's.  -ENOENT (no such temporary), -EINVAL
 * (@newname is not a block name) or -EINVAL / -EBADMSG (the file is not
 * a valid block of that key), -EBUSY (a handle still has it open),
 * -EEXIST (the key is being written): with these the
 * temporary stays.  Onto a committed block of the same key, a valid file
 * is dropped and *out is that block (the key names the content: rsync -a
 * run again renames over every block).  kvfs_cache_commit()'s later errors (its parent checks,
 * -ENOSPC) drop it, as a failed close does.  Validates twice (here and in
 * the commit): a rename is not the engines' write path.
 */
int kvfs_cache_temp_commit(struct kvfs_cache *c, struct kvfs_ns *ns,
			   const char *name, const char *newname,
			   struct kvfs_block **out);

/* Creation and last change (a commit or deletion) of @ns, unix ns. */
void kvfs_ns_times(const struct kvfs_ns *ns, uint64_t *created,
		   uint64_t *changed);

/* Wait until @b's data and record are durable. The write-back's error if
 * it failed for good (-ENOSPC: the SSD is full of pinned or open blocks, or
 * the metadata map is full; -EIO otherwise), -ENOENT if the block was
 * deleted first.
 */
int kvfs_cache_sync(struct kvfs_cache *c, struct kvfs_block *b);

/*
 * kvfs_cache_fsync() - kvfs_cache_sync(), and with [tier.remote] write =
 * through the remote SET of @b first (when the remote tier takes it:
 * admit, a KV block, not fetched from there).  A failed SET is logged and
 * returns -EIO (the local copy is durable all the same).
 */
int kvfs_cache_fsync(struct kvfs_cache *c, struct kvfs_block *b);

/* ---- read path ---- */

/* Per-open read state. */
struct kvfs_reader {
	struct kvfs_block *b;
	void *priv;        /* private copy when the block is not in DRAM */
	uint64_t priv_len;
	bool in_dram;      /* the current read_begin pinned the DRAM copy */
};

/* Count an open of @b (blocks being read are never evicted) and one access
 * for the policy; the reader takes over the caller's reference to @b.
 * -ENOENT (and the reference is dropped) if @b was deleted meanwhile.
 */
int kvfs_cache_reader_init(struct kvfs_cache *c, struct kvfs_reader *r,
			    struct kvfs_block *b);
/* Undo reader_init: drops the reference and any private copy. */
void kvfs_cache_reader_release(struct kvfs_cache *c, struct kvfs_reader *r);
/*
 * kvfs_cache_read_begin() - bytes [off, off+len) of the block, clamped to
 * its size, as a pointer valid until kvfs_cache_read_end(). Loads from the
 * SSD (io_uring, O_DIRECT, checksums verified) when not in DRAM.  A block
 * stored as hidden states reads as the KV-kind file its restoration
 * produces: the call waits for the restoration threads (one restoration
 * per block however many readers) and never serves the stored bytes.
 * Errors: -EIO (read failed, or hidden states without weights),
 * -EBADMSG (checksum mismatch: never served), -ENOMEM.
 */
int kvfs_cache_read_begin(struct kvfs_cache *c, struct kvfs_reader *r,
			  uint64_t off, size_t len, const void **ptr,
			  size_t *n);
void kvfs_cache_read_end(struct kvfs_cache *c, struct kvfs_reader *r);

/* ---- admin ---- */

/* Remove a block from every tier and from metadata. -EBUSY if pinned. */
int kvfs_cache_unlink(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name);
/* Pin in @tier (KVFS_TIER_DRAM or _SSD), loading/persisting as needed.
 * -EINVAL (tier not configured), -ENOSPC (no room even after eviction).
 * A failed pin takes back only a pin it added: one the block already had
 * (a DRAM pin recorded earlier, perhaps waiting for room since a restart)
 * stays, recorded.
 */
int kvfs_cache_pin(struct kvfs_cache *c, struct kvfs_block *b, int tier);
/* Remove all pins. */
int kvfs_cache_unpin(struct kvfs_cache *c, struct kvfs_block *b);
/* Set the workload category (policy issue); 0..65535. */
int kvfs_cache_set_category(struct kvfs_cache *c, struct kvfs_block *b,
			    uint32_t category);

/* Filesystem-level numbers for statfs. */
struct kvfs_cache_fsinfo {
	uint64_t ssd_capacity, ssd_free;
	uint64_t blocks;
};
void kvfs_cache_fsinfo(struct kvfs_cache *c, struct kvfs_cache_fsinfo *fi);

/*
 * kvfs_cache_scrub_now() - start a scrub pass at the mover's next round
 * (within conf.flush_ms), unless one is under way; returns at once.
 * 0, or -EOPNOTSUPP before the engine is open.  Takes no lock.
 */
int kvfs_cache_scrub_now(struct kvfs_cache *c);

/* The .kvfs/stats text ("key value\n" lines) in a malloc'd buffer. */
int kvfs_cache_stats(struct kvfs_cache *c, char **buf, size_t *len);

/* ---- statistics as structs (the metrics endpoint, fs/metrics.c) ---- */

/* Latency histograms the engine keeps (meta/hist.h). */
enum kvfs_cache_hist {
	KVFS_CACHE_HIST_LOOKUP,       /* ctl LOOKUP, request to response */
	KVFS_CACHE_HIST_FETCH,        /* ctl FETCH */
	KVFS_CACHE_HIST_FETCH_INTO,   /* ctl FETCH_INTO */
	KVFS_CACHE_HIST_FETCH_CHUNKS, /* ctl FETCH_CHUNKS */
	KVFS_CACHE_HIST_READ,         /* a FUSE read of a block (fs/) */
	KVFS_CACHE_NHIST,
};

/*
 * kvfs_cache_hist_add() - count one event of @ns nanoseconds in histogram
 * @h.  Lock-free (a few relaxed atomic adds): callable on hot paths from
 * any thread.
 */
void kvfs_cache_hist_add(struct kvfs_cache *c, enum kvfs_cache_hist h,
			 uint64_t ns);

/* One tier's figures; the names are .kvfs/stats' tier.NAME.* keys. */
struct kvfs_stats_tier {
	bool present; /* configured; every other field 0 if not */
	uint64_t capacity_bytes, used_bytes, blocks;
	uint64_t hits, misses, evictions;
	uint64_t bytes_read, bytes_written, io_reads, io_writes;
	uint64_t direct_bytes, staged_bytes; /* the device tier's only */
};

/* One namespace's figures. */
struct kvfs_stats_ns {
	char name[KVFS_NS_NAME_MAX];
	uint64_t blocks; /* committed now */
	uint64_t bytes;  /* their file sizes */
	uint64_t hits;   /* accesses of its blocks since the mount */
	uint64_t dram_hits;  /* of those, with a DRAM copy at the time */
	uint64_t misses;     /* names looked up that it does not hold */
	uint64_t bytes_read; /* the bytes of the accesses */
	/* Hidden-state restoration (docs/hcache.md). */
	uint64_t hidden_blocks, mixed_blocks, restored, converted, splits;
};

/*
 * A snapshot of the engine's counters: each field read atomically on its
 * own, the whole not one instant.  Counters (monotonic since the mount)
 * and gauges are named as .kvfs/stats names them.
 */
struct kvfs_stats {
	struct kvfs_stats_tier tier[KVFS_NTIERS]; /* by enum kvfs_tier_id */
	bool remote; /* [tier.remote] configured: remote_st is valid */
	struct kvfs_remote_stats remote_st;
	bool fleet; /* [fleet] sightings on: fleet_st is valid */
	struct kvfs_sight_stats fleet_st;
	char policy[32];
	uint64_t blocks, commits, rejects, deletes, lookup_misses;
	uint64_t checksum_errors, dram_pins, dram_pins_waiting;
	uint64_t wb_queued, wb_batches, wb_blocks, wb_errors, wb_stalled;
	uint64_t counter_flushes;
	uint64_t discarded, promoted, demoted, promote_passes;
	uint64_t leases; /* held now */
	uint64_t leases_reclaimed, fetches, fetch_bytes, fetch_into_bytes;
	uint64_t saves;
	bool chunks; /* the chunk cache runs: chunk is valid */
	struct kvfs_chunk_stats chunk;
	/* Hidden-state restoration (restore.* of .kvfs/stats). */
	uint64_t hidden_blocks, mixed_blocks, hidden_stored_bytes;
	uint64_t hidden_kv_bytes, restores, restore_ns, restore_waits;
	uint64_t restore_joined, restore_ahead, restore_private;
	uint64_t restore_from_pool, restore_errors, restore_conversions;
	uint64_t restore_splits, restore_pipelined, restore_to_device;
	uint64_t restore_to_device_gpu, restore_to_device_fallbacks;
	uint64_t restore_gpu_blocks, restore_gpu_fallbacks, restore_threads;
	struct kvfs_hist_snap hist[KVFS_CACHE_NHIST];
	size_t n_ns;
	struct kvfs_stats_ns ns[]; /* n_ns of them, in config order */
};

/*
 * kvfs_cache_stats_get() - a malloc'd snapshot (free with
 * kvfs_cache_stats_free()).  Takes each namespace's lock shared in turn
 * (to count DRAM pins) and the write-back and policy locks briefly: never
 * call it from the read hot path.  0 or -ENOMEM.
 */
int kvfs_cache_stats_get(struct kvfs_cache *c, struct kvfs_stats **out);
/* NULL is a no-op. */
void kvfs_cache_stats_free(struct kvfs_stats *s);

/*
 * kvfs_cache_set_delete_hook() - be told when the engine itself deletes a
 * block (eviction from the SSD, a discard, EVICT through ctl), so that the
 * kernel's cached attributes of inode @ino (named @name in directory
 * @dir_ino) can be invalidated. @fn is called from engine threads with no
 * engine lock held and must not block on a FUSE request.
 * Deletions by unlink are not reported: the kernel already knows.
 */
void kvfs_cache_set_delete_hook(struct kvfs_cache *c,
				void (*fn)(void *arg, uint64_t dir_ino,
					   uint64_t ino, const char *name),
				void *arg);

/* Run one write-back pass now and wait for it (tests). */
int kvfs_cache_writeback_now(struct kvfs_cache *c);

/*
 * Restoring a stored split image (kind HIDDEN or MIXED, docs/hcache.md)
 * read from the SSD tier: the daemon's restoration jobs use it for blocks
 * with no DRAM copy, and tests/bench/bench_hcache.c times its two modes.
 */
struct kvfs_tier;
struct kvfs_extent;
struct kvfs_restore;
struct kvfs_restore_ws;
struct kvfs_restore_cuda;

enum kvfs_restore_stream_flags {
	/* Read the whole image, verify it, then restore: the way a block
	 * is loaded without pipelining (the benchmark's baseline).
	 */
	KVFS_RS_WHOLE = 1 << 0,
};

struct kvfs_restore_stream {
	struct kvfs_tier *ssd;          /* the SSD tier */
	const struct kvfs_extent *ext;  /* the stored image's extent */
	const struct kvfs_geom *g;      /* the namespace geometry */
	const struct kvfs_restore *rst; /* its loaded checkpoint */
	struct kvfs_restore_ws *ws;     /* or NULL: one is made per call */
	/* Or NULL.  When set, hidden layers are projected on the GPU
	 * (kvfs_restore_cuda_layers(), host memory in and out, the layers
	 * that arrived together as one run); from the first run the GPU
	 * fails on, the rest are projected on the CPU with @rst (logged,
	 * @gpu_failed set).
	 */
	struct kvfs_restore_cuda *rc;
	/* What the block record says; the image must agree. */
	uint32_t n_tokens;
	uint32_t kv_from;               /* 0 < kv_from <= n_layers */
	uint64_t start_pos;
	uint32_t hdr_crc;
	const uint8_t *key;             /* the block's key */
	const uint8_t *root;            /* the namespace root key */
	uint8_t *img;   /* 4096-aligned, ext->len bytes: the stored image */
	uint8_t *dst;   /* receives the KV file image; the tail is zeroed */
	uint64_t dst_len; /* >= kvfs_fmt_file_size(g, KVFS_KIND_KV, n) */
	unsigned flags; /* enum kvfs_restore_stream_flags */
	const char *bad; /* out: why verification failed, for the log */
	uint32_t gpu_layers; /* out: layers projected on the GPU */
	bool gpu_failed;     /* out: the GPU failed, the CPU took over */
	/* out: where the call's time went, in nanoseconds (for
	 * bench_hcache): in the GPU restorer's calls; in the CPU's work on
	 * layers as they arrive (CRC, copies, the CPU's projections); and
	 * after the last byte was in (validation, the KV image's header
	 * and payload CRC).  @ns_io: the read (whole), or the batch of
	 * reads with the layers' work done as they arrive (pipelined).
	 */
	uint64_t ns_gpu, ns_cpu, ns_tail, ns_io;
	uint32_t gpu_runs; /* out: calls to the GPU restorer */
};

/*
 * kvfs_cache_restore_stream() - build the KV file image of a block from
 * its stored split image on the SSD.  By default pipelined: the image is
 * read as one batch of per-layer ranges (4096-aligned, in layer order;
 * ->readv with a done callback), and each layer is projected (layers below
 * kv_from) or copied (K and V layers) as soon as its bytes and all before
 * them have arrived, while later layers stream in.  The payload CRC is
 * computed over the layers as they are processed; once every range is in,
 * the image is validated (header CRC, layout, key, start position, the
 * record's header CRC) and the CRC compared.  Nothing in @rs->dst may be
 * used unless this returns 0.
 * Returns 0; -EBADMSG when the image fails verification (@rs->bad says
 * why; the caller logs it); the read's -errno; -EINVAL (bad arguments or
 * a refused restoration, logged); -ENOMEM.  Takes no lock (a GPU call
 * takes @rs->rc's own mutex); the caller keeps the extent from being
 * freed.
 */
int kvfs_cache_restore_stream(struct kvfs_restore_stream *rs);

#endif
