/* SPDX-License-Identifier: MIT */
/*
 * Internal structures of the cache engine and the declarations its files
 * share, under the heading of the file that defines them, lowest first.
 * A file calls only the files listed before it, so the engine's files
 * form no circle: namespaces, blocks, the background registry and the
 * index at the bottom; the write-back queue, deletion, tier reservation,
 * write-back and DRAM above them; the restoration pool; the read path and
 * the device glue; promotion, the commit path, the chunk cache, admin,
 * ctl, and cache_open.c (start-up) on top.  The chunk cache, the
 * restoration pool and the control operations keep their own private
 * headers (chunk_i.h, rpool_i.h, ctl_i.h).  Not for use outside cache/.
 *
 * Unless a contract says otherwise, functions return 0 or -errno, take
 * a struct kvfs_cache *@c the caller keeps open, and need a reference on
 * every block passed in.  Lock order: cache.h.
 */
#ifndef KVFS_CACHE_CACHE_I_H
#define KVFS_CACHE_CACHE_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/cache.h"
#include "cache/policy.h"
#include "tier/tier.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "meta/util.h"
#include "gpu/gpu.h"
#include "hcache/hsched.h"
#include "hcache/restore.h"
#include "tier/sight.h"
#include "tier/tier_remote.h"

#define KVFS_SHARDS 64
#define KVFS_TASKS_MAX 8      /* periodic tasks of the mover (task.c) */
#define KVFS_DELETE_FNS_MAX 4 /* deletion listeners (delete.c) */

/* How a namespace's hidden-state blocks are restored when they are
 * loaded into the device pool ([tier.gpu] restore, docs/hcache.md).
 */
enum kvfs_hc_dev {
	/* No device tier or no weights: through the read path, the KV
	 * image kept in DRAM and uploaded from there.
	 */
	KVFS_HC_DEV_NONE = 0,
	/* On the CPU, straight into the pool extent: its host mapping
	 * (shm), or a bounce buffer uploaded at once (cuda).
	 */
	KVFS_HC_DEV_CPU = 1,
	/* On the GPU (kvfs_restore_cuda), straight into the extent. */
	KVFS_HC_DEV_GPU = 2,
};

struct kvfs_restore_cuda;

/*
 * Hidden-state restoration of one namespace (restore_pool.c).  Set up by
 * kvfs_rpool_start() before the mount serves requests and immutable after
 * that, except the atomics.
 */
struct kvfs_hc_ns {
	struct kvfs_restore *rst; /* NULL: no weights, HIDDEN writes refused */
	int dev;                  /* enum kvfs_hc_dev */
	/* With KVFS_HC_DEV_GPU: the weights on the pool's device.  One
	 * handle shared by FETCH and promotion (under c->gpu_load_lock), the
	 * restoration threads and readers restoring in their own thread:
	 * restore_cuda serialises its calls on the handle's own mutex, a
	 * leaf lock (gpu/restore_cuda.h).
	 */
	struct kvfs_restore_cuda *rc;
	/* With KVFS_HC_DEV_GPU, when profiled: the GPU's figures per layer
	 * of a full block (seconds).
	 */
	bool gpu_profiled;
	double gpu_compute, gpu_h2d_hidden, gpu_h2d_kv;
	/* The plans' C_H is gpu_compute (the GPU restorer does the work),
	 * not prof.c_hidden (the CPU's, always measured).
	 */
	bool plan_gpu;
	/* The split HIDDEN writes are stored with (meta/fmt.h): n_layers
	 * keeps them as written, 0 restores them to KV at commit, anything
	 * between stores them MIXED (layers from kv_from on restored).
	 */
	uint32_t kv_from;
	bool kv_fixed;            /* kv_from set by hcache_kv_layers */
	bool profiled;            /* prof is valid */
	bool planned;             /* plan[DRAM] (and [SSD]) are valid */
	bool ssd_profiled;        /* plan[SSD] is valid */
	struct kvfs_hsched_profile prof; /* seconds per layer */
	struct kvfs_hsched_plan plan[KVFS_NTIERS];
	atomic_uint_least64_t hidden_blocks; /* stored HIDDEN or MIXED now */
	atomic_uint_least64_t mixed_blocks;  /* of those, MIXED */
	atomic_uint_least64_t restored;      /* restorations for reads */
	atomic_uint_least64_t converted;     /* HIDDEN writes stored as KV */
	atomic_uint_least64_t splits;        /* HIDDEN writes stored MIXED */
};

struct kvfs_ns {
	struct kvfs_cache *c;    /* immutable after open */
	struct kvfs_meta_ns rec; /* immutable after open */
	struct kvfs_geom geom;   /* immutable after open */
	uint64_t ino;            /* immutable after open */
	uint64_t max_file;       /* immutable after open: largest valid file */
	/* Immutable after open: the uid whose device pool holds its blocks
	 * (its configured owner, else the mounting user's).
	 */
	uint32_t owner;
	/* Unix ns: the record's creation time, or the store's for a record
	 * written before namespaces kept one.  Immutable after open.
	 */
	uint64_t created;
	/* Atomic, unix ns: the last commit or deletion in the namespace (its
	 * creation until one): the directory's mtime and ctime.
	 */
	atomic_uint_least64_t changed;
	/* Atomic: the file sizes of the listed blocks (changed with the
	 * listing, under ns->lock); for .kvfs/stats and kvfsctl top, the
	 * accesses of its blocks (kvfs_cache_touch()), of those with a DRAM
	 * copy at the time, their bytes, and names looked up that it does
	 * not hold.
	 */
	atomic_uint_least64_t st_bytes, st_hits, st_dram_hits, st_bytes_read;
	atomic_uint_least64_t st_misses;
	pthread_rwlock_t lock;   /* guards blocks, n, cap */
	struct kvfs_block **blocks; /* ns->lock: committed, sorted by ino */
	size_t n, cap;              /* ns->lock */
	struct kvfs_hc_ns hc;    /* see above */
};

enum kvfs_bflag {
	KVFS_B_PERSISTED = 1 << 0, /* record committed, b->ssd valid */
	KVFS_B_DELETED = 1 << 1,   /* unlinked or evicted from the SSD */
	KVFS_B_QUEUED = 1 << 2,    /* on the write-back queue */
	KVFS_B_WBERR = 1 << 3,     /* write-back failed for good */
	KVFS_B_FREED = 1 << 4,     /* deleted and its space given back */
	/* The pool copy was restored on the GPU: its header's payload CRC
	 * (and so its header CRC) is not filled in; set and cleared with
	 * b->gpu.  Whoever copies the image out of the pool fills them
	 * (kvfs_fmt_img_seal()).
	 */
	KVFS_B_GPU_NOCRC = 1 << 5,
	/* The remote tier has it (docs/remote.md): the block was fetched
	 * from it, or an fsync (write = through) SET it there.  Such a
	 * block is not sent again.  Set once, never cleared.
	 */
	KVFS_B_REMOTE = 1 << 6,
};

struct kvfs_block {
	struct kvfs_pnode pn;   /* c->policy_lock (pn.key etc. immutable) */
	struct kvfs_ns *ns;     /* immutable */
	uint64_t ino;           /* immutable */
	/* Immutable.  size is the file everyone sees (stat, read, FETCH,
	 * the device pool): for a block stored as hidden states it is the
	 * KV-kind file restoration produces.  ssize is the stored image
	 * (the record's size, what the SSD extent holds, what write-back
	 * writes); the two differ only when kind is HIDDEN or MIXED.
	 */
	uint64_t size;
	uint64_t ssize;
	uint64_t start_pos;     /* immutable */
	uint64_t created;       /* immutable */
	uint32_t n_tokens;      /* immutable */
	uint32_t hdr_crc;       /* immutable */
	uint16_t kind;          /* immutable: the stored form */
	/* Immutable: the layers below it are stored as hidden states, the
	 * others as K and V (meta/fmt.h split layouts): 0 for kind KV,
	 * n_layers for HIDDEN.
	 */
	uint32_t kv_from;
	uint8_t parent_key[KVFS_KEY_LEN]; /* immutable */
	struct kvfs_block *parent; /* immutable; holds a reference */

	atomic_int refs;        /* atomic: the last put frees the block */
	atomic_int readers;     /* atomic: in-flight users of dram_ptr */
	atomic_int opens;       /* atomic: open read handles: never evicted */
	/* Atomic, enum kvfs_bflag.  PERSISTED is set under c->meta_lock and
	 * b->lock, DELETED under c->meta_lock, FREED once by whoever sets it
	 * first, GPU_NOCRC under b->lock with b->gpu; QUEUED and WBERR by
	 * the write-back (wb_queue.c, cache_wb.c).
	 */
	atomic_uint flags;
	/* enum kvfs_tier_bit.  The admin's pins, as recorded: a DRAM pin
	 * does not mean a DRAM copy.  A pin kept across a restart that could
	 * not load the block (DRAM lowered, an I/O error) waits for the next
	 * load into DRAM (a read, a promotion, a later start); from then on
	 * eviction skips the copy.  tiers says what is resident.  Atomic;
	 * recorded under c->meta_lock.
	 */
	atomic_uint pins;
	atomic_uint tiers;      /* enum kvfs_tier_bit; changed under b->lock */
	atomic_uint category;   /* atomic; pn.category is its policy copy */
	/* Published DRAM copy, or NULL.  For a block stored as hidden
	 * states it is the stored image until a restoration replaces it
	 * with the KV image it serves (restore_pool.c); the image's own
	 * header kind tells which.  Published and unpublished under
	 * b->lock, read without a lock (the read hot path).
	 */
	_Atomic(void *) dram_ptr;
	atomic_uint_least64_t hits, last_access; /* atomic */

	pthread_mutex_t lock;   /* guards dram, ssd, flag transitions */
	pthread_mutex_t io_lock; /* serialises loads of this block */
	struct kvfs_extent dram; /* b->lock */
	struct kvfs_extent ssd;  /* b->lock; valid with PERSISTED */
	struct kvfs_extent gpu;  /* b->lock; the whole image in the device pool */
	atomic_int leases;       /* atomic: ctl leases: never moved while
				  * nonzero */
	uint32_t *ccrc;          /* b->lock: per-piece CRCs (chunk.h), set at
				  * commit or loaded at the first sparse read */

	atomic_bool touched;    /* atomic: on the touch stack */
	/* The touch stack's: set by the pusher before its CAS, read by the
	 * drainer (under c->policy_lock) after its exchange.
	 */
	struct kvfs_block *touch_next;
	atomic_bool counters_dirty; /* atomic: hits/last_access not recorded */
	struct kvfs_block *wb_next; /* c->wb_lock */
	/* The write-back pass's, or kvfs_wb_unstall()'s while the block is on
	 * the stalled list, off the queue.
	 */
	unsigned wb_tries;
	atomic_int wb_err;          /* atomic: -errno of a failed write-back */
	struct kvfs_block *hnext_key; /* the by_key shard's lock */
	struct kvfs_block *hnext_ino; /* the by_ino shard's lock */
};

struct kvfs_pending {
	struct kvfs_cache *c;      /* immutable */
	struct kvfs_ns *ns;        /* immutable */
	uint8_t key[KVFS_KEY_LEN]; /* immutable */
	uint64_t ino;              /* immutable */
	pthread_mutex_t lock;   /* guards buf, size, cap */
	uint8_t *buf;              /* p->lock */
	uint64_t size, cap;        /* p->lock */
	struct kvfs_pending *next; /* c->pending_lock */
	/* A temporary (temp.c): its name, NULL for a file named by its key.
	 * Set at create; cleared under c->pending_lock when a rename gives
	 * the file its key.
	 */
	char *tname;
	/* Temporaries only, c->pending_lock: the list's reference and one
	 * per open handle; the last one frees the file.
	 */
	int trefs;
	uint64_t tclosed;   /* c->pending_lock: mono ns of the last close */
};

struct kvfs_shard {
	pthread_mutex_t lock;  /* guards b, nb, n and the chains */
	struct kvfs_block **b; /* buckets; chains through hnext_key/ino */
	size_t nb, n;
};

/* A periodic task of the mover (task.c). */
struct kvfs_task {
	const char *name;
	int (*fn)(struct kvfs_cache *c);
};

/*
 * The engine.  "Set at open" fields are written by kvfs_cache_open()
 * before the threads start and the mount serves requests, and immutable
 * after that.
 */
struct kvfs_cache {
	struct kvfs_cache_params conf;       /* set at open */
	unsigned flags;                      /* set at open */
	struct kvfs_store *store;            /* set at open */
	struct kvfs_tier *tier[KVFS_NTIERS]; /* set at open; NULL = absent */
	const struct kvfs_gpu_ops *gops;     /* set at open: ops of tier[GPU] */
	pthread_mutex_t gpu_load_lock;       /* one batch of loads at a time */
	pthread_mutex_t ctl_lock;            /* guards sessions */
	struct kvfs_ctl_session *sessions;   /* c->ctl_lock */
	atomic_uint_least64_t st_leases, st_leases_reclaimed; /* atomic */
	atomic_uint_least64_t st_fetches, st_fetch_bytes, st_fetch_into_bytes;
	atomic_uint_least64_t st_saves;      /* atomic, as the two above */
	/* Latency histograms (enum kvfs_cache_hist): lock-free. */
	struct kvfs_hist hist[KVFS_CACHE_NHIST];

	size_t n_ns;         /* set at open */
	struct kvfs_ns *ns;  /* set at open (each ns: its own comments) */

	struct kvfs_shard by_key[KVFS_SHARDS]; /* each shard: its lock */
	struct kvfs_shard by_ino[KVFS_SHARDS]; /* each shard: its lock */
	atomic_uint_least64_t next_ino;        /* atomic */
	atomic_uint_least64_t nblocks;         /* atomic: blocks indexed */

	pthread_mutex_t pending_lock; /* guards pending */
	struct kvfs_pending *pending; /* c->pending_lock */

	pthread_mutex_t meta_lock; /* serialises metadata write txns */

	pthread_mutex_t policy_lock; /* guards policy and every b->pn */
	struct kvfs_policy *policy;  /* c->policy_lock; the pointer set at open */
	_Atomic(struct kvfs_block *) touch_head; /* atomic: lock-free stack */

	pthread_mutex_t wb_lock; /* guards the queue and the fields below */
	pthread_cond_t wb_cond;   /* work for the write-back thread */
	pthread_cond_t wb_done;   /* a pass finished */
	struct kvfs_block *wb_head, *wb_tail; /* c->wb_lock */
	struct kvfs_block *wb_stalled; /* c->wb_lock: waiting for SSD space */
	/* Written under c->wb_lock, read without it (a cheap "any?") */
	atomic_uint_least64_t wb_nstalled;
	uint64_t wb_queued;       /* c->wb_lock: blocks on the queue */
	uint64_t wb_passes;       /* c->wb_lock: finished passes */
	uint64_t wb_inflight;     /* c->wb_lock: taken by the running pass */
	bool wb_stop;             /* c->wb_lock */
	pthread_t wb_thread;      /* kvfs_wb_start()/stop()'s */
	bool wb_started;          /* c->wb_lock; set at open */

	pthread_mutex_t mv_lock;  /* guards mv_stop */
	pthread_cond_t mv_cond;   /* wakes the mover to stop */
	bool mv_stop;             /* c->mv_lock */
	pthread_t mv_thread;      /* kvfs_task_start()/stop()'s */
	bool mv_started;          /* kvfs_task_start()/stop()'s */
	/* Set at open, in registration order (task.c). */
	struct kvfs_task tasks[KVFS_TASKS_MAX];
	unsigned n_tasks;
	/* Set at open: called by kvfs_block_delete() (delete.c). */
	void (*delete_fns[KVFS_DELETE_FNS_MAX])(struct kvfs_cache *c,
						 struct kvfs_block *b);
	unsigned n_delete_fns;

	/* Set at open; inside, the chunk cache's and the pool's own locks. */
	struct kvfs_chunk_state *chunks; /* chunk.c: the chunk cache */
	struct kvfs_rpool *rpool;        /* restore_pool.c */
	struct kvfs_scrub *scrub;        /* scrub.c */
	pthread_mutex_t bg_lock;  /* guards bg_jobs */
	pthread_cond_t bg_cond;   /* bg_jobs reached 0 */
	unsigned bg_jobs;         /* c->bg_lock: detached jobs running */

	/* Set at open: the tier shared across hosts ([tier.remote]), or
	 * NULL; thread-safe itself (tier/tier_remote.h).  remote.c uses it.
	 */
	struct kvfs_tier_remote *remote;
	/* Fleet sightings ([fleet], fleet.c): set at open, or NULL; cleared
	 * under c->policy_lock at close, so a note under that lock never
	 * sees a freed instance.  Thread-safe itself (tier/sight.h).
	 */
	struct kvfs_sight *sight;
	/* Set at open: called by the write-back pass for each block whose
	 * image it has just written to the SSD (cache_wb.c).
	 */
	void (*wb_written)(struct kvfs_cache *c, struct kvfs_block *b,
			   const void *img);

	/* set once before the mount serves requests */
	void (*delete_hook)(void *arg, uint64_t dir_ino, uint64_t ino,
			    const char *name);
	void *delete_hook_arg;

	/* engine counters (atomic) */
	atomic_uint_least64_t st_commits, st_rejects, st_deletes;
	atomic_uint_least64_t st_wb_batches, st_wb_blocks, st_wb_errors;
	atomic_uint_least64_t st_csum_errors, st_counter_flushes;
	atomic_uint_least64_t st_lookups_missing;
	atomic_uint_least64_t st_discards, st_promoted, st_demoted;
	atomic_uint_least64_t st_promote_passes;
	/* hidden-state restoration (restore_pool.c; atomic) */
	atomic_uint_least64_t st_hidden_blocks;    /* stored HIDDEN or MIXED */
	atomic_uint_least64_t st_mixed_blocks;     /* of those, MIXED */
	atomic_uint_least64_t st_hidden_stored;    /* their stored bytes */
	atomic_uint_least64_t st_hidden_kv;        /* their KV file bytes */
	atomic_uint_least64_t st_restores;         /* for reads and ahead */
	atomic_uint_least64_t st_restore_ns;       /* time in them */
	atomic_uint_least64_t st_restore_waits;    /* reads that waited */
	atomic_uint_least64_t st_restore_joined;   /* ... on a job under way */
	atomic_uint_least64_t st_restore_ahead;    /* submitted ahead of need */
	atomic_uint_least64_t st_restore_private;  /* results kept out of DRAM */
	atomic_uint_least64_t st_restore_from_pool; /* KV copied down, not rebuilt */
	atomic_uint_least64_t st_restore_errors;
	atomic_uint_least64_t st_converted;        /* HIDDEN writes made KV */
	atomic_uint_least64_t st_splits;           /* HIDDEN made MIXED */
	atomic_uint_least64_t st_pipelined;        /* SSD restores streamed */
	atomic_uint_least64_t st_restore_dev;      /* straight into the pool */
	atomic_uint_least64_t st_restore_gpu;      /* ... of those on the GPU */
	atomic_uint_least64_t st_restore_dev_fallback; /* failed: via DRAM */
	/* Reads and restorations ahead of need (the restoration jobs): */
	atomic_uint_least64_t st_restore_gpu_blocks;    /* done on the GPU */
	atomic_uint_least64_t st_restore_gpu_fallbacks; /* GPU failed: CPU */
};

/* Whether @b's stored form has hidden-state layers, so that reads need
 * its restoration (kind HIDDEN or MIXED).
 */
static inline bool kvfs_block_needs_restore(const struct kvfs_block *b)
{
	return b->kind == KVFS_KIND_HIDDEN || b->kind == KVFS_KIND_MIXED;
}

/* Count @b in (@sign 1) or out of (-1) the hidden-state statistics;
 * a no-op for a KV-stored block.
 */
static inline void kvfs_block_count_hidden(struct kvfs_cache *c,
					   struct kvfs_block *b, int sign)
{
	struct kvfs_hc_ns *hc = &b->ns->hc;
	bool mixed = b->kind == KVFS_KIND_MIXED;

	if (!kvfs_block_needs_restore(b))
		return;
	if (sign > 0) {
		atomic_fetch_add(&c->st_hidden_blocks, 1);
		atomic_fetch_add(&c->st_hidden_stored, b->ssize);
		atomic_fetch_add(&c->st_hidden_kv, b->size);
		atomic_fetch_add(&hc->hidden_blocks, 1);
		if (mixed) {
			atomic_fetch_add(&c->st_mixed_blocks, 1);
			atomic_fetch_add(&hc->mixed_blocks, 1);
		}
	} else {
		atomic_fetch_sub(&c->st_hidden_blocks, 1);
		atomic_fetch_sub(&c->st_hidden_stored, b->ssize);
		atomic_fetch_sub(&c->st_hidden_kv, b->size);
		atomic_fetch_sub(&hc->hidden_blocks, 1);
		if (mixed) {
			atomic_fetch_sub(&c->st_mixed_blocks, 1);
			atomic_fetch_sub(&hc->mixed_blocks, 1);
		}
	}
}

/* The block whose policy node is @n. */
static inline struct kvfs_block *kvfs_pn_block(struct kvfs_pnode *n)
{
	return container_of(n, struct kvfs_block, pn);
}

/* ----------------------------------------------------------------- ns.c */

/*
 * kvfs_ns_add() - list committed block @b in @ns (sorted by ino) and move
 *   the namespace's last change up to its commit time.  Out of
 *   memory, the block is left out of the listing (logged) and stays
 *   reachable by name.  Takes ns->lock.
 * kvfs_ns_del() - take @b out of the listing (the namespace changes
 *   now); a no-op if it is not
 *   there.  Takes ns->lock.
 */
void kvfs_ns_add(struct kvfs_ns *ns, struct kvfs_block *b);
void kvfs_ns_del(struct kvfs_ns *ns, struct kvfs_block *b);

/* -------------------------------------------------------------- block.c */

/*
 * kvfs_block_alloc() - a zeroed block of @ns with one reference (the
 *   caller's), its locks initialised and its policy node unlinked; NULL
 *   out of memory.  The caller fills in the immutable fields before it
 *   publishes the block (kvfs_index_insert()).
 * kvfs_block_get_ref() - take one more reference on @b (the caller holds
 *   one, or a lock that keeps @b alive: a shard lock, ns->lock,
 *   c->policy_lock for a block the policy holds).  Never fails.
 * (kvfs_cache_put(), cache.h, drops one; the last frees the block, its
 *   live DRAM and device extents, and its parent reference.)
 */
struct kvfs_block *kvfs_block_alloc(struct kvfs_ns *ns);
void kvfs_block_get_ref(struct kvfs_block *b);
/*
 * kvfs_cache_record_fill() - fill metadata record @r from @b's current
 *   state.  Caller holds b->lock (b->ssd, b->dram).  Never fails.
 */
void kvfs_cache_record_fill(struct kvfs_block *b, struct kvfs_meta_blk *r);
/*
 * kvfs_block_payload_off() - where the payload starts in @b's file image
 *   (what clients of the device pool are given).  Pure.
 */
uint64_t kvfs_block_payload_off(const struct kvfs_block *b);
/*
 * kvfs_block_ssd_get() - copy @b's SSD extent into *@sx under b->lock, to
 *   use outside the lock.  0, or -EIO (logged) when @b has no SSD copy
 *   (not persisted): then *@sx is meaningless.  Takes b->lock, which the
 *   caller must not hold.
 */
int kvfs_block_ssd_get(struct kvfs_block *b, struct kvfs_extent *sx);
/*
 * kvfs_cache_touch() - count an access of @b (hits, last_access, the
 *   counters to record) and push @b once on the lock-free touch stack
 *   (with a reference) for the policy to see later: the read path takes
 *   no policy lock.  Lock-free; never fails.
 * kvfs_cache_drain_touches() - feed the stacked accesses to the policy
 *   and drop their references.  Caller holds c->policy_lock.
 */
void kvfs_cache_touch(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_cache_drain_touches(struct kvfs_cache *c);

/* --------------------------------------------------------------- task.c */

/*
 * kvfs_task_add() - register @fn, under @name (for the log), as a periodic
 *   task of the mover: each round (every conf.flush_ms) it runs the tasks
 *   in registration order, after feeding the policy its accesses and tick.
 *   Call before kvfs_task_start(), from the owning module's init; @name
 *   must outlive @c.  @fn's return is ignored (it logs its own errors).
 *   0, or -ENOSPC past KVFS_TASKS_MAX (logged).  No locking: open only.
 * kvfs_task_run() - run every registered task once, in the caller's
 *   thread (the mover's round).  Caller holds no engine lock.
 * kvfs_task_start() - start the mover thread (none under
 *   KVFS_CACHE_NOTHREADS).  0 or the -errno of pthread_create.
 * kvfs_task_stop() - stop and join the mover; a no-op if not started.
 *   Called by the thread that frees @c, before kvfs_wb_stop().
 */
int kvfs_task_add(struct kvfs_cache *c, const char *name,
		  int (*fn)(struct kvfs_cache *c));
void kvfs_task_run(struct kvfs_cache *c);
int kvfs_task_start(struct kvfs_cache *c);
void kvfs_task_stop(struct kvfs_cache *c);
/*
 * kvfs_bg_begin(), kvfs_bg_end() - a detached background job (prefetch, a
 *   speculative chunk load) counts itself in before it starts and out when
 *   done, so that kvfs_cache_free() can wait for the count to reach 0.
 *   Take c->bg_lock, a leaf lock.
 */
void kvfs_bg_begin(struct kvfs_cache *c);
void kvfs_bg_end(struct kvfs_cache *c);

/* -------------------------------------------------------------- index.c */

/*
 * kvfs_index_insert() - index @b by key and by ino, taking over one
 *   reference for the index.  0, -EEXIST (the key is indexed: nothing
 *   changed, the reference stays the caller's), -ENOMEM.  Takes the two
 *   shard locks (key's first).
 * kvfs_index_remove() - take @b out of both tables; the caller then drops
 *   the index's reference.  Takes each shard lock in turn.
 * kvfs_index_find_key() - the block indexed under @key, with a reference
 *   for the caller (deleted or not), or NULL.  Takes a shard lock.
 */
int kvfs_index_insert(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_index_remove(struct kvfs_cache *c, struct kvfs_block *b);
struct kvfs_block *kvfs_index_find_key(struct kvfs_cache *c,
				       const uint8_t key[KVFS_KEY_LEN]);

/* ----------------------------------------------------------- wb_queue.c */

/*
 * kvfs_wb_enqueue() - queue committed @b for write-back (the queue takes a
 *   reference) and wake the write-back thread.  Takes c->wb_lock.
 * kvfs_wb_stall() - park @b, which found no SSD space, on the stalled
 *   list (with a reference), failing fsync with @rc meanwhile (WBERR).
 *   Takes c->wb_lock.
 * kvfs_wb_unstall() - SSD space was given back: queue every stalled block
 *   again (those deleted meanwhile are dropped).  Cheap when none is
 *   stalled.  Takes c->wb_lock; caller holds none of the engine's locks
 *   but may be in any thread.
 */
void kvfs_wb_enqueue(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_wb_stall(struct kvfs_cache *c, struct kvfs_block *b, int rc);
void kvfs_wb_unstall(struct kvfs_cache *c);

/* -------------------------------------------------------------- scrub.c */

/*
 * kvfs_scrub_init() - set up the scrub's state and register its round as
 *   a periodic task (a pass every conf.scrub_interval_ms, 0 = only when
 *   asked, reading at most conf.scrub_rate bytes/s).  0, -ENOMEM, or
 *   kvfs_task_add()'s error.  Open only.
 * kvfs_scrub_free() - free that state; the mover must be stopped.  A
 *   no-op without it.
 * kvfs_scrub_stats() - print the scrub.* lines of .kvfs/stats to @f.
 *   Takes no lock (atomic counters).
 */
int kvfs_scrub_init(struct kvfs_cache *c);
void kvfs_scrub_free(struct kvfs_cache *c);
void kvfs_scrub_stats(struct kvfs_cache *c, FILE *f);

/* ------------------------------------------------------------- delete.c */

/*
 * kvfs_block_delete() - remove @b's record and give its SSD extent back
 *   to the persistent free map in one transaction (if it has a record),
 *   then take it out of the index, its namespace, the policy, and tell
 *   every deletion listener; @why is the log's verb ("unlinked", "evicted
 *   from the SSD tier", ...; any but "unlinked" also calls fs/'s delete
 *   hook).  Memory and extents are released once nothing has the block
 *   open (kvfs_block_try_free()).  0, -ENOENT (deleted already), -EBUSY
 *   (pinned, logged), or the metadata's error (nothing changed, logged).
 *   Takes c->meta_lock, b->lock, the shard locks, ns->lock and
 *   c->policy_lock; the caller holds none of them.
 * kvfs_block_try_free() - give a deleted @b's DRAM copy, device and SSD
 *   extents back once nothing has it open (opens == 0); exactly once
 *   (FREED).  A no-op for a live or open block.  Called by the delete and
 *   by the last of its readers.  Takes b->lock and c->wb_lock (unstalls
 *   the write-back when SSD space came back).
 * kvfs_block_on_delete() - register @fn to be called by every successful
 *   kvfs_block_delete(), after the policy forgot the block and before its
 *   resources go, with no engine lock held: modules that keep state per
 *   block drop it there.  Call at open, before the threads start.  0, or
 *   -ENOSPC past KVFS_DELETE_FNS_MAX (logged).
 */
int kvfs_block_delete(struct kvfs_cache *c, struct kvfs_block *b,
		      const char *why);
void kvfs_block_try_free(struct kvfs_cache *c, struct kvfs_block *b);
int kvfs_block_on_delete(struct kvfs_cache *c,
			 void (*fn)(struct kvfs_cache *c,
				    struct kvfs_block *b));

/* ------------------------------------------------------------ reserve.c */

/*
 * How kvfs_reserve() makes room in one tier; each tier's owner has one
 * (dram.c, cache_wb.c for the SSD, cache_gpu.c for the device pool).
 */
struct kvfs_reserve_ops {
	int tier;       /* enum kvfs_tier_id */
	bool fit_check; /* -ENOSPC at once for a length over the capacity */
	/* Whether a victim may go (the policy's filter, given kvfs_reserve's
	 * @arg); under c->policy_lock, with no other lock.
	 */
	kvfs_policy_ok_fn may_evict;
	/* Optional: take the extent (default: the tier's alloc), given
	 * kvfs_reserve's @arg. 0, -ENOSPC (full: evict), or another error.
	 */
	int (*alloc)(struct kvfs_cache *c, uint64_t len, struct kvfs_extent *e,
		     void *arg);
	/* Optional: evict victim @b under c->policy_lock; *@after (false on
	 * entry) asks for evict() once the lock is released.
	 */
	int (*evict_locked)(struct kvfs_cache *c, struct kvfs_block *b,
			    bool *after);
	/* Evict victim @b with no engine lock held (always, without
	 * evict_locked).  The reservation holds a reference on @b.
	 */
	int (*evict)(struct kvfs_cache *c, struct kvfs_block *b);
	/* No victim left: 0 to look again (room may have been made), or
	 * the -errno the reservation fails with.  No engine lock held.
	 */
	int (*no_victim)(struct kvfs_cache *c);
};

/*
 * kvfs_reserve() - allocate @len bytes of tier @ops->tier into *@e; while
 *   the tier is full, ask the policy for a victim (after draining the
 *   touch stack) and evict it through @ops.  A victim whose eviction
 *   returns -ENOENT or -EBUSY (gone, or busy since it was picked) is
 *   followed by the next one; any other error fails the reservation.
 *   0, -ENOSPC, or the allocator's or the eviction's error.  @arg goes
 *   to @ops->alloc and @ops->may_evict (the device pool: which owner's
 *   pool).  Takes c->policy_lock; the caller holds no engine lock but
 *   b->io_lock.
 */
int kvfs_reserve(struct kvfs_cache *c, const struct kvfs_reserve_ops *ops,
		 uint64_t len, struct kvfs_extent *e, void *arg);

/* ----------------------------------------------------------- cache_wb.c */

/*
 * kvfs_wb_pass() - one write-back batch (up to conf.writeback_batch
 *   blocks off the queue): SSD extents (evicting from the SSD through the
 *   policy), O_DIRECT writes, fdatasync, then one metadata transaction.
 *   Failed blocks are retried, stalled for space, or marked WBERR.
 *   Returns 0 or the batch's -errno (sync or metadata: logged).  Takes
 *   c->wb_lock, c->meta_lock, c->policy_lock in turn; caller holds none.
 *   Run by the write-back thread, or by callers without one.
 * kvfs_wb_start() - start the write-back thread (none under
 *   KVFS_CACHE_NOTHREADS).  0 or pthread_create's -errno.
 * kvfs_wb_stop() - let the thread drain the queue and join it, write what
 *   is left, and drop the stalled blocks (logged as lost).  Called by the
 *   thread that frees @c, after kvfs_task_stop().
 * (kvfs_cache_sync() and kvfs_cache_writeback_now(), cache.h, wait for
 *   the write-back.)
 */
int kvfs_wb_pass(struct kvfs_cache *c);
int kvfs_wb_start(struct kvfs_cache *c);
void kvfs_wb_stop(struct kvfs_cache *c);
/*
 * kvfs_counters_flush() - rewrite the record of every persisted block
 *   whose counters (hits, last access, category) changed, in one
 *   transaction (never one write per read).  0,
 *   or the metadata's error (logged; the blocks stay dirty).  Takes shard
 *   locks, then c->meta_lock and b->lock; caller holds none.
 * kvfs_counters_init() - register the flush as a periodic task.
 */
int kvfs_counters_flush(struct kvfs_cache *c);
int kvfs_counters_init(struct kvfs_cache *c);
/*
 * kvfs_wb_on_written() - have @fn called by every write-back pass for
 *   each block it wrote to the SSD, with the image it wrote (b->ssize
 *   bytes, valid during the call: the pass holds the block open), before
 *   the batch's record commits; no engine lock held.  The upper module
 *   that sends blocks on (remote.c) registers it.  Call at open, before
 *   the threads start; one listener.
 */
void kvfs_wb_on_written(struct kvfs_cache *c,
			void (*fn)(struct kvfs_cache *c, struct kvfs_block *b,
				   const void *img));

/* --------------------------------------------------------------- dram.c */

/*
 * kvfs_dram_reserve() - an extent of @len bytes in the DRAM tier, evicting
 *   through the policy: a persisted, unpinned, unopened victim is dropped,
 *   and discarded if the policy does not admit it to the SSD; with none,
 *   the write-back is waited for (or run, without its thread) so that
 *   written blocks can go.  0, -ENOSPC (longer than the tier, or nothing
 *   can go), or the allocator's error.  Caller holds no engine lock but
 *   b->io_lock.
 * kvfs_dram_drop() - drop @b's DRAM copy (demoting it as an eviction
 *   would).  0 (dropped or none), -EBUSY (pinned in DRAM, open, read, or
 *   not yet on the SSD).  Caller holds no engine lock.
 */
int kvfs_dram_reserve(struct kvfs_cache *c, uint64_t len,
		      struct kvfs_extent *e);
int kvfs_dram_drop(struct kvfs_cache *c, struct kvfs_block *b);
/*
 * kvfs_dram_may_drop() - whether @n's DRAM copy may be dropped now:
 *   persisted, not deleted, not pinned in DRAM, not open or being read (a
 *   kvfs_policy_ok_fn; @arg unused).  Caller holds c->policy_lock.
 * kvfs_dram_demote_locked() - drop @b's DRAM copy and ask the policy
 *   whether it may stay on the SSD.  0 (dropped), -ENOENT (no copy),
 *   -EBUSY (a lock-free reader got in first: the copy stays).  *@discard:
 *   refused and unpinned, the caller must kvfs_dram_discard() @b once it
 *   released the lock (a reference is taken for that).  Caller holds
 *   c->policy_lock, and keeps it.
 * kvfs_dram_discard() - delete a block refused by the SSD (counted in
 *   policy.discarded) and drop the reference demote took.  Caller holds
 *   no engine lock.
 */
bool kvfs_dram_may_drop(struct kvfs_pnode *n, void *arg);
int kvfs_dram_demote_locked(struct kvfs_cache *c, struct kvfs_block *b,
			    bool *discard);
void kvfs_dram_discard(struct kvfs_cache *c, struct kvfs_block *b);

enum kvfs_load_mode {
	KVFS_LOAD_READ = 1,
	KVFS_LOAD_PIN,
	KVFS_LOAD_MOVE,
	KVFS_LOAD_PRIV,
};
/*
 * kvfs_block_load() - load @b from the SSD (io_uring, O_DIRECT, verified
 *   against its record).  @mode says where the copy goes:
 *   KVFS_LOAD_READ   into DRAM if the policy admits it there (a block
 *                    pinned in DRAM always is) and room can be made, else
 *                    into a private buffer returned in *@priv (the
 *                    reader's own copy);
 *   KVFS_LOAD_PIN    into DRAM, evicting others if needed, or -ENOSPC;
 *   KVFS_LOAD_MOVE   into DRAM only if it has free room now (promotion
 *                    never grows the upper tier), else -ENOSPC;
 *   KVFS_LOAD_PRIV   always into a private buffer (*@priv, 4096-aligned,
 *                    *@priv_len the SSD extent's length; the caller frees
 *                    it): a stored image wanted only once, for a
 *                    restoration straight into the device pool.
 *   A DRAM copy is published (kvfs_block_publish_dram()).  0; -EIO (no
 *   SSD copy, or the read failed), -EBADMSG (fails verification, logged),
 *   -ENOENT (deleted meanwhile: for READ a private copy instead), -ENOSPC,
 *   -ENOMEM.  Caller holds b->io_lock and has seen no DRAM copy under it.
 */
int kvfs_block_load(struct kvfs_cache *c, struct kvfs_block *b, int mode,
		    void **priv, uint64_t *priv_len);
/*
 * kvfs_block_read_ssd() - read @b's stored image from the SSD into @buf
 *   (@cap bytes, 4096-aligned: the caller's, e.g. page-locked memory for
 *   the GPU restorer) and verify it against its record, as
 *   KVFS_LOAD_PRIV does into a buffer of its own.  The image is
 *   b->ssize bytes; the read fills the whole extent.  0; -EINVAL (@buf
 *   misaligned, or @cap under the extent's length), -EIO (no SSD copy,
 *   or the read failed), -EBADMSG (logged).  Caller holds b->io_lock and
 *   keeps @b from being freed.
 */
int kvfs_block_read_ssd(struct kvfs_cache *c, struct kvfs_block *b,
			void *buf, uint64_t cap);
/*
 * kvfs_block_verify_ssd() - check @buf, @b's stored image as read back
 *   from its SSD extent: every format check (kvfs_fmt_validate(), both
 *   CRCs) and the header CRC equal to the record's.  0, or -EBADMSG
 *   (logged as "SSD copy at offset O fails verification", counted in
 *   cache.checksum_errors).  No locking (@b's immutable fields only).
 */
int kvfs_block_verify_ssd(struct kvfs_cache *c, struct kvfs_block *b,
			  const void *buf);
/*
 * kvfs_block_ssd_bad() - log that @b's SSD copy at offset @off failed
 *   verification for the reason @why, and count it in
 *   cache.checksum_errors.  When @img (@len bytes read back, or NULL)
 *   starts with a sound header of another block, the line names that
 *   block: misdirected bytes, not torn ones.  No locking.
 */
void kvfs_block_ssd_bad(struct kvfs_cache *c, struct kvfs_block *b,
			uint64_t off, const char *why, const void *img,
			uint64_t len);
/*
 * Whether a load of @b from tier @from may keep a copy in DRAM: always
 * for a block pinned in DRAM (the pin is the admin's word, and a pin not
 * yet resident is honoured by the first load), else the policy's
 * admission.  Takes c->policy_lock, which the caller must not hold
 * (b->io_lock may be held).
 */
static inline bool kvfs_block_dram_admit(struct kvfs_cache *c,
					 struct kvfs_block *b, int from)
{
	bool admit;

	if (atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM)
		return true;
	pthread_mutex_lock(&c->policy_lock);
	admit = kvfs_policy_admit(c->policy, from, KVFS_TIER_DRAM, &b->pn);
	pthread_mutex_unlock(&c->policy_lock);
	return admit;
}
/* Make @ext (a DRAM tier extent) @b's published DRAM copy and tell the
 * policy.  Caller holds b->io_lock and has seen no DRAM copy under it.
 * -ENOENT, publishing nothing, when @b is deleted (the extent stays the
 * caller's); 0 otherwise.  Takes c->policy_lock and b->lock.
 */
int kvfs_block_publish_dram(struct kvfs_cache *c, struct kvfs_block *b,
			    const struct kvfs_extent *ext);

/* -------------------------------------------------------------- read.c */

/* The read path: kvfs_cache_reader_init(), kvfs_cache_read_begin(),
 * kvfs_cache_read_end() and kvfs_cache_reader_release() in cache.h.
 */

/* ---------------------------------------------------------- cache_gpu.c */

enum kvfs_gpu_load_flags {
	KVFS_GPU_TRYLOCK = 1 << 0, /* -EBUSY rather than wait for a loader */
	KVFS_GPU_NOEVICT = 1 << 1, /* only free room: never grow by evicting */
};
/*
 * kvfs_gpu_load() - make the @n blocks of @b resident in the device pool,
 *   in one batch: reserve extents (evicting through the policy unless
 *   KVFS_GPU_NOEVICT), gather host images (through the read path, or a
 *   restoration straight into the extent for hidden states), one upload,
 *   then publish.  Blocks resident already, and duplicates, are skipped.
 *   0; -EINVAL (no device tier), -EBUSY (KVFS_GPU_TRYLOCK and a load under
 *   way), -ENOSPC, -ENOMEM, or a read's or the upload's error: nothing of
 *   the batch is published then.  Takes c->gpu_load_lock (serialising
 *   loaders), then the read path's and c->policy_lock; caller holds none.
 * kvfs_gpu_drop() - move @b out of the pool: copied down into DRAM first
 *   when the policy admits it there (or it is pinned there) and it has no
 *   DRAM copy.  0, -EINVAL (no device tier), -ENOENT (not in the pool),
 *   -EBUSY (leased).  Caller holds no engine lock.
 */
int kvfs_gpu_load(struct kvfs_cache *c, struct kvfs_block **b, size_t n,
		  unsigned flags);
int kvfs_gpu_drop(struct kvfs_cache *c, struct kvfs_block *b);

/* ----------------------------------------------------------- promote.c */

/*
 * kvfs_promote_load() - load @b into DRAM only if it has free room now
 *   (KVFS_LOAD_MOVE), and start the restoration of a block stored as
 *   hidden states, so a later read finds the KV image.  Holds @b open
 *   meanwhile, as a reader does, so that an unlink cannot free its SSD
 *   extent under the read.  Returns kvfs_block_load()'s, -EEXIST when
 *   @b has a DRAM copy already, -ENOENT when it was deleted.  The caller
 *   holds a reference and not b->io_lock, which this takes.
 * kvfs_promote_init() - register the promotion pass (SSD -> DRAM, then
 *   DRAM -> device, each as the policy plans) as a periodic task.
 */
int kvfs_promote_load(struct kvfs_cache *c, struct kvfs_block *b);
int kvfs_promote_init(struct kvfs_cache *c);

/* ------------------------------------------------------------ commit.c */

/* The commit path: kvfs_cache_create(), kvfs_cache_write(),
 * kvfs_cache_truncate(), kvfs_cache_commit() and kvfs_cache_abandon() in
 * cache.h.
 */

/*
 * kvfs_block_import() - make the image @img (@len bytes, already checked
 *   by kvfs_fmt_validate() against @ns: header @h, kind KV) a block of
 *   @ns under @key, local from now on: a DRAM extent reserved through
 *   the policy (evicting as a commit does), the index, the namespace's
 *   listing, the policy (inserted into DRAM), and the write-back queue
 *   (persisted like a committed block), flagged KVFS_B_REMOTE.  A block
 *   already indexed under @key is returned instead.  *@out gets a
 *   referenced block.  0; -EINVAL (the prefix tree refuses it, logged),
 *   -ENOSPC (DRAM full of unevictable blocks), -ENOMEM.  Caller holds
 *   no engine lock.
 */
int kvfs_block_import(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const uint8_t *key, const void *img, uint64_t len,
		      const struct kvfs_fmt_hdr *h, struct kvfs_block **out);
/* -------------------------------------------------------------- temp.c */

/* Temporaries: kvfs_cache_temp_*() in cache.h. */

/* ------------------------------------------------------------- chunk.c */

/* The chunk cache: chunk.h.  It registers its score flush (task.c) and a
 * deletion listener (delete.c) from kvfs_chunk_init().
 */

/* ------------------------------------------------------------ remote.c */

/*
 * The engine's use of the remote tier (docs/remote.md); every function
 * is a no-op (or -ENOENT) without [tier.remote].
 * kvfs_remote_init() - open the tier of conf.remote and register the
 *   write-back listener that queues written blocks (write = back or
 *   through; admit = policy asks the policy).  A cluster that does not
 *   answer is not an error.  0, or the tier's -errno (logged).  Open only.
 * kvfs_remote_fini() - drain the remote queue (bounded: what is left is
 *   dropped and counted), then free the tier.  Called after
 *   kvfs_wb_stop(), so that the last local write-back is sent too.
 * kvfs_remote_fetch() - bring the blocks @keys[0..n) of @ns that are not
 *   local from the remote tier: looked up in pipelined batches, checked
 *   (the tier), imported (kvfs_block_import()).  With @prefix, batches
 *   stop after the first that misses (a prefix ends there).  Returns
 *   the number of blocks imported; faults and misses are not errors (the
 *   blocks stay missing).  No retries: each batch waits at most one
 *   round trip per node (tier_remote.h).  Caller holds no engine lock.
 * kvfs_remote_fetch_async() - the same in a detached background job
 *   (kvfs_bg_begin()), for hints: returns at once.  0, -ENOMEM, -EAGAIN.
 */
int kvfs_remote_init(struct kvfs_cache *c);
void kvfs_remote_fini(struct kvfs_cache *c);
size_t kvfs_remote_fetch(struct kvfs_cache *c, struct kvfs_ns *ns,
			 const uint8_t (*keys)[KVFS_KEY_LEN], size_t n,
			 bool prefix);
int kvfs_remote_fetch_async(struct kvfs_cache *c, struct kvfs_ns *ns,
			    const uint8_t (*keys)[KVFS_KEY_LEN], size_t n);
/* Whether a remote tier is configured (set at open). */
static inline bool kvfs_remote_on(const struct kvfs_cache *c)
{
	return c->remote != NULL;
}

/* ------------------------------------------------------------- fleet.c */

/*
 * Fleet sightings (docs/remote.md): the keys of the blocks this host
 * references go to the other hosts, and theirs to the policy
 * (kvfs_policy_sight()).  Every function is a no-op without [fleet].
 * kvfs_fleet_init() - open conf.fleet's instance; a server that does not
 *   answer is not an error.  0, or its -errno (logged).  Open only, after
 *   the policy exists.
 * kvfs_fleet_fini() - detach the instance under c->policy_lock, then free
 *   it (its last batch published, best effort); the policy must still
 *   exist: a delivery in flight uses it.  Caller holds no engine lock.
 * kvfs_fleet_note() - this host referenced the block @key: buffered for
 *   the next publish.  Never waits on the network.  Caller holds
 *   c->policy_lock (which orders it against kvfs_fleet_fini()).
 */
int kvfs_fleet_init(struct kvfs_cache *c);
void kvfs_fleet_fini(struct kvfs_cache *c);
static inline void kvfs_fleet_note(struct kvfs_cache *c,
				   const uint8_t key[KVFS_KEY_LEN])
{
	if (c->sight)
		kvfs_sight_note(c->sight, key);
}

/* ------------------------------------------------------------- admin.c */

/*
 * kvfs_block_pin_load() - give @b (pinned in DRAM by the caller) a DRAM
 *   copy unless it has one: loaded from the SSD, evicting blocks that are
 *   not pinned.  The pin bit and the record stay the caller's: the
 *   interactive pin takes a new pin back on failure, the start-up reload
 *   keeps the recorded one.  Counted as an open (tier.dram.hits/misses,
 *   the block's hits).  Returns 0; -ENOENT (deleted), -ENOSPC (DRAM
 *   cannot hold it: full of pinned or open blocks), -EIO, -EBADMSG (the
 *   SSD copy fails verification), -ENOMEM.  Caller holds a reference on
 *   @b and no engine lock.
 */
int kvfs_block_pin_load(struct kvfs_cache *c, struct kvfs_block *b);

#endif
