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

#include "cache/cache.h"
#include "cache/policy.h"
#include "cache/tier.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "gpu/gpu.h"

#define KVFS_SHARDS 64

struct kvfs_ns {
	struct kvfs_cache *c;
	struct kvfs_meta_ns rec; /* immutable after open */
	struct kvfs_geom geom;   /* immutable after open */
	uint64_t ino;
	uint64_t max_file;       /* largest valid block file */
	pthread_rwlock_t lock;   /* guards blocks, n, cap */
	struct kvfs_block **blocks; /* committed, sorted by ino */
	size_t n, cap;
};

enum kvfs_bflag {
	KVFS_B_PERSISTED = 1 << 0, /* record committed, b->ssd valid */
	KVFS_B_DELETED = 1 << 1,   /* unlinked or evicted from the SSD */
	KVFS_B_QUEUED = 1 << 2,    /* on the write-back queue */
	KVFS_B_WBERR = 1 << 3,     /* write-back failed for good */
	KVFS_B_FREED = 1 << 4,     /* deleted and its space given back */
};

struct kvfs_block {
	struct kvfs_pnode pn;   /* c->policy_lock (pn.key etc. immutable) */
	struct kvfs_ns *ns;     /* immutable */
	uint64_t ino;           /* immutable */
	uint64_t size;          /* immutable */
	uint64_t start_pos;     /* immutable */
	uint64_t created;       /* immutable */
	uint32_t n_tokens;      /* immutable */
	uint32_t hdr_crc;       /* immutable */
	uint16_t kind;          /* immutable */
	uint8_t parent_key[KVFS_KEY_LEN]; /* immutable */
	struct kvfs_block *parent; /* immutable; holds a reference */

	atomic_int refs;
	atomic_int readers;     /* in-flight users of dram_ptr */
	atomic_int opens;       /* open read handles: never evicted */
	atomic_uint flags;      /* enum kvfs_bflag; changed under b->lock */
	atomic_uint pins;       /* enum kvfs_tier_bit */
	atomic_uint tiers;      /* enum kvfs_tier_bit; changed under b->lock */
	atomic_uint category;
	_Atomic(void *) dram_ptr; /* published DRAM copy, or NULL */
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
	struct kvfs_conf conf;
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
};

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
};
int kvfs_block_load(struct kvfs_cache *c, struct kvfs_block *b, int mode,
		    void **priv, uint64_t *priv_len);

/* cache_gpu.c */
struct kvfs_ctl_session;
enum kvfs_gpu_load_flags {
	KVFS_GPU_TRYLOCK = 1 << 0, /* -EBUSY rather than wait for a loader */
	KVFS_GPU_NOEVICT = 1 << 1, /* only free room: never grow by evicting */
};
int kvfs_gpu_load(struct kvfs_cache *c, struct kvfs_block **b, size_t n,
		  unsigned flags);
int kvfs_gpu_drop(struct kvfs_cache *c, struct kvfs_block *b);
void kvfs_ctl_reclaim(struct kvfs_cache *c);
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
