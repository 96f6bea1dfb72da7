/* SPDX-License-Identifier: MIT */
/*
 * Internal structures of the cache engine, shared by cache.c (index, read
 * and write paths), cache_wb.c (write-back and eviction) and cache_open.c
 * (recovery).  Not for use outside cache/.
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
#include "gpu/gpu.h"
#include "hcache/hsched.h"
#include "hcache/restore.h"

#define KVFS_SHARDS 64

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
	struct kvfs_cache *c;
	struct kvfs_meta_ns rec; /* immutable after open */
	struct kvfs_geom geom;   /* immutable after open */
	uint64_t ino;
	uint64_t max_file;       /* largest valid block file */
	pthread_rwlock_t lock;   /* guards blocks, n, cap */
	struct kvfs_block **blocks; /* committed, sorted by ino */
	size_t n, cap;
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

	atomic_int refs;
	atomic_int readers;     /* in-flight users of dram_ptr */
	atomic_int opens;       /* open read handles: never evicted */
	atomic_uint flags;      /* enum kvfs_bflag; changed under b->lock */
	/* enum kvfs_tier_bit.  The admin's pins, as recorded: a DRAM pin
	 * does not mean a DRAM copy.  A pin kept across a restart that could
	 * not load the block (DRAM lowered, an I/O error) waits for the next
	 * load into DRAM (a read, a promotion, a later start); from then on
	 * eviction skips the copy.  tiers says what is resident.
	 */
	atomic_uint pins;
	atomic_uint tiers;      /* enum kvfs_tier_bit; changed under b->lock */
	atomic_uint category;
	/* Published DRAM copy, or NULL.  For a block stored as hidden
	 * states it is the stored image until a restoration replaces it
	 * with the KV image it serves (restore_pool.c); the image's own
	 * header kind tells which.
	 */
	_Atomic(void *) dram_ptr;
	atomic_uint_least64_t hits, last_access;

	pthread_mutex_t lock;   /* guards dram, ssd, flag transitions */
	pthread_mutex_t io_lock; /* serialises loads of this block */
	struct kvfs_extent dram; /* b->lock */
	struct kvfs_extent ssd;  /* b->lock; valid with PERSISTED */
	struct kvfs_extent gpu;  /* b->lock; the whole image in the device pool */
	atomic_int leases;       /* ctl leases: never moved while nonzero */
	uint32_t *ccrc;          /* b->lock: per-piece CRCs (chunk.h), set at
				  * commit or loaded at the first sparse read */

	atomic_bool touched;    /* on the touch stack */
	struct kvfs_block *touch_next; /* touch stack */
	atomic_bool counters_dirty; /* hits/last_access not yet recorded */
	struct kvfs_block *wb_next; /* c->wb_lock */
	unsigned wb_tries;          /* only the write-back pass touches it */
	atomic_int wb_err;          /* -errno of a failed write-back */
	struct kvfs_block *hnext_key, *hnext_ino; /* shard locks */
};

struct kvfs_pending {
	struct kvfs_cache *c;
	struct kvfs_ns *ns;
	uint8_t key[KVFS_KEY_LEN];
	uint64_t ino;
	pthread_mutex_t lock;   /* guards buf, size, cap */
	uint8_t *buf;
	uint64_t size, cap;
	struct kvfs_pending *next; /* c->pending_lock */
};

struct kvfs_shard {
	pthread_mutex_t lock;
	struct kvfs_block **b; /* buckets; chains through hnext_key/ino */
	size_t nb, n;
};

struct kvfs_cache {
	struct kvfs_cache_params conf;
	unsigned flags;
	struct kvfs_store *store;
	struct kvfs_tier *tier[KVFS_NTIERS]; /* NULL = absent */
	const struct kvfs_gpu_ops *gops;     /* device ops of tier[GPU] */
	pthread_mutex_t gpu_load_lock;       /* one batch of loads at a time */
	pthread_mutex_t ctl_lock;            /* guards sessions */
	struct kvfs_ctl_session *sessions;
	atomic_uint_least64_t st_leases, st_leases_reclaimed;
	atomic_uint_least64_t st_fetches, st_fetch_bytes, st_fetch_into_bytes;
	atomic_uint_least64_t st_saves;

	size_t n_ns;
	struct kvfs_ns *ns;

	struct kvfs_shard by_key[KVFS_SHARDS];
	struct kvfs_shard by_ino[KVFS_SHARDS];
	atomic_uint_least64_t next_ino;
	atomic_uint_least64_t nblocks;

	pthread_mutex_t pending_lock; /* guards pending */
	struct kvfs_pending *pending;

	pthread_mutex_t meta_lock; /* serialises metadata write txns */

	pthread_mutex_t policy_lock; /* guards policy and every b->pn */
	struct kvfs_policy *policy;
	_Atomic(struct kvfs_block *) touch_head; /* lock-free stack */

	pthread_mutex_t wb_lock; /* guards the queue and the counters below */
	pthread_cond_t wb_cond;   /* work for the write-back thread */
	pthread_cond_t wb_done;   /* a pass finished */
	struct kvfs_block *wb_head, *wb_tail;
	struct kvfs_block *wb_stalled; /* waiting for SSD space */
	atomic_uint_least64_t wb_nstalled;
	uint64_t wb_queued;       /* blocks on the queue */
	uint64_t wb_passes;       /* finished passes */
	uint64_t wb_inflight;     /* blocks taken by the running pass */
	bool wb_stop;
	pthread_t wb_thread;
	bool wb_started;

	pthread_mutex_t mv_lock;  /* guards mv_stop */
	pthread_cond_t mv_cond;
	bool mv_stop;
	pthread_t mv_thread;
	bool mv_started;

	struct kvfs_chunk_state *chunks; /* chunk.c: the chunk cache */
	struct kvfs_rpool *rpool;        /* restore_pool.c */
	pthread_mutex_t bg_lock;  /* guards bg_jobs */
	pthread_cond_t bg_cond;   /* bg_jobs reached 0 */
	unsigned bg_jobs;         /* detached prefetch threads running */

	/* set once before the mount serves requests */
	void (*delete_hook)(void *arg, uint64_t dir_ino, const char *name);
	void *delete_hook_arg;

	/* engine counters (atomics) */
	atomic_uint_least64_t st_commits, st_rejects, st_deletes;
	atomic_uint_least64_t st_wb_batches, st_wb_blocks, st_wb_errors;
	atomic_uint_least64_t st_csum_errors, st_counter_flushes;
	atomic_uint_least64_t st_lookups_missing;
	atomic_uint_least64_t st_discards, st_promoted, st_demoted;
	atomic_uint_least64_t st_promote_passes;
	/* hidden-state restoration (restore_pool.c) */
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

/* cache.c */
void kvfs_block_get_ref(struct kvfs_block *b);
int kvfs_index_insert(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_index_remove(struct kvfs_cache *c, struct kvfs_block *b);
struct kvfs_block *kvfs_index_find_key(struct kvfs_cache *c,
				       const uint8_t key[KVFS_KEY_LEN]);
void kvfs_ns_add(struct kvfs_ns *ns, struct kvfs_block *b);
void kvfs_ns_del(struct kvfs_ns *ns, struct kvfs_block *b);
struct kvfs_block *kvfs_block_alloc(struct kvfs_ns *ns);
void kvfs_cache_drain_touches(struct kvfs_cache *c);
void kvfs_cache_touch(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_cache_record_fill(struct kvfs_block *b, struct kvfs_meta_blk *r);

enum kvfs_load_mode {
	KVFS_LOAD_READ = 1,
	KVFS_LOAD_PIN,
	KVFS_LOAD_MOVE,
	KVFS_LOAD_PRIV,
};
int kvfs_block_load(struct kvfs_cache *c, struct kvfs_block *b, int mode,
		    void **priv, uint64_t *priv_len);
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
 * caller's); 0 otherwise.
 */
int kvfs_block_publish_dram(struct kvfs_cache *c, struct kvfs_block *b,
			    const struct kvfs_extent *ext);

/* cache_gpu.c */
struct kvfs_ctl_session;
enum kvfs_gpu_load_flags {
	KVFS_GPU_TRYLOCK = 1 << 0, /* -EBUSY rather than wait for a loader */
	KVFS_GPU_NOEVICT = 1 << 1, /* only free room: never grow by evicting */
};
int kvfs_gpu_load(struct kvfs_cache *c, struct kvfs_block **b, size_t n,
		  unsigned flags);
int kvfs_gpu_drop(struct kvfs_cache *c, struct kvfs_block *b);
uint64_t kvfs_block_payload_off(const struct kvfs_block *b);

/* Detached background jobs (prefetch, speculative chunk loads) count
 * themselves so that shutdown can wait for them.
 */
void kvfs_bg_begin(struct kvfs_cache *c);
void kvfs_bg_end(struct kvfs_cache *c);

/* cache_wb.c */
int kvfs_wb_start(struct kvfs_cache *c);
void kvfs_wb_stop(struct kvfs_cache *c);
void kvfs_wb_enqueue(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_wb_unstall(struct kvfs_cache *c);
int kvfs_wb_pass(struct kvfs_cache *c);
int kvfs_dram_reserve(struct kvfs_cache *c, uint64_t len,
		      struct kvfs_extent *e);
int kvfs_dram_drop(struct kvfs_cache *c, struct kvfs_block *b);
int kvfs_block_delete(struct kvfs_cache *c, struct kvfs_block *b,
		      const char *why);
int kvfs_counters_flush(struct kvfs_cache *c);
int kvfs_promote_pass(struct kvfs_cache *c);
void kvfs_block_try_free(struct kvfs_cache *c, struct kvfs_block *b);

#endif
