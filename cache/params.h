/* SPDX-License-Identifier: MIT */
/*
 * The engine's parameters: what kvfs_cache_open() is told about its tiers,
 * policy, chunk cache and namespaces. The daemon fills them from kvfs.conf
 * (fs/conf.h); tests and benchmarks fill them directly. Plain data: no
 * locking, read once at open.
 */
#ifndef KVFS_CACHE_PARAMS_H
#define KVFS_CACHE_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/fmt.h"
#include "meta/meta.h"
#include "tier/sight.h"
#include "tier/tier_remote.h"

#define KVFS_PARAMS_MAX_NS 64
#define KVFS_PARAMS_MAX_OPTS 32
#define KVFS_PARAMS_STR 256

/* What a namespace keeps when an engine writes a HIDDEN-kind block; the
 * values are those of the namespace record's store_as.
 */
enum kvfs_store_as {
	KVFS_STORE_KV = 0, /* restore once at commit, store K and V */
	KVFS_STORE_HIDDEN = 1, /* store the hidden states as written */
	KVFS_STORE_AUTO = 2, /* hidden where smaller than K+V, else KV */
};

/* Hidden-state restoration (HCache, docs/hcache.md): the model knowledge
 * of a namespace.  Without weights every field is at its default and
 * HIDDEN-kind writes are refused.
 */
struct kvfs_hcache_params {
	char weights[KVFS_PARAMS_STR]; /* .safetensors or index .json; "" */
	int family; /* enum kvfs_restore_family; 0 = none */
	double rms_norm_eps; /* default 1e-6 (Hugging Face's) */
	double rope_theta; /* default 10000 */
	int rope_type; /* enum kvfs_rope_type (default) */
	double rope_factor; /* linear, llama3 */
	double rope_low_freq_factor; /* llama3 */
	double rope_high_freq_factor; /* llama3 */
	uint32_t rope_orig_max_pos; /* llama3 */
	uint32_t store_as; /* enum kvfs_store_as (kv) */
	/* hcache_kv_layers: how many last layers store_as = auto keeps as
	 * K and V, in place of the start-up schedule's choice;
	 * KVFS_PARAMS_KV_LAYERS_SCHED when not set.
	 */
	uint32_t kv_layers;
};
#define KVFS_PARAMS_KV_LAYERS_SCHED UINT32_MAX

/* model_digest: up to 64 bytes (a SHA-256 in hex), NUL-terminated. */
#define KVFS_PARAMS_DIGEST_MAX 65

/*
 * Who may use a namespace (docs/operations.md, "Sharing a host"). Zeroed,
 * the namespace is the mounting user's, mode 0755: what it was before
 * ownership could be configured.
 */
struct kvfs_ns_access {
	uint32_t uid; /* owner, when has_uid */
	uint32_t gid; /* group, when has_gid */
	uint32_t mode; /* permission bits (07777), when has_mode */
	bool has_uid, has_gid, has_mode;
	uint64_t quota; /* bytes the namespace may store; 0 = no limit */
	uint64_t pin_quota; /* bytes it may pin; 0 = no limit */
};

struct kvfs_ns_params {
	char name[KVFS_NS_NAME_MAX];
	char salt[KVFS_NS_SALT_MAX];
	/* Mixed into the root key after the salt; "" for none. kvfs.conf's
	 * `auto` is resolved by the parser (fs/conf.c), so this is always
	 * the value.
	 */
	char model_digest[KVFS_PARAMS_DIGEST_MAX];
	struct kvfs_geom geom;
	struct kvfs_hcache_params hc;
	struct kvfs_ns_access acc;
};

enum kvfs_params_gpu {
	KVFS_PARAMS_GPU_NONE = 0,
	KVFS_PARAMS_GPU_SHM = 1,
	KVFS_PARAMS_GPU_CUDA = 2,
};

/* [tier.dram] pinned: whether the DRAM tier is one pinned arena that the
 * device tier copies from directly (docs/config.md).
 */
enum kvfs_params_pinned {
	KVFS_PARAMS_PINNED_AUTO = 0, /* yes with backend = cuda, else no;
				    * pinning failure is a warning */
	KVFS_PARAMS_PINNED_YES = 1, /* pinned, or refuse to start (cuda only) */
	KVFS_PARAMS_PINNED_NO = 2, /* a heap buffer per block, staged copies */
};

/* [tier.gpu] restore: how a block stored as hidden states is rebuilt when
 * it is loaded into the device pool (docs/hcache.md).
 */
enum kvfs_params_restore {
	KVFS_PARAMS_RESTORE_AUTO = 0, /* cuda: on the GPU if it can start, else
				     * the CPU; shm: the CPU */
	KVFS_PARAMS_RESTORE_GPU = 1, /* on the GPU or refuse to start (cuda) */
	KVFS_PARAMS_RESTORE_CPU = 2, /* on the CPU, into the pool */
};

/* [tier.gpu] restore_weights: the precision of W_k and W_v (and of x̂)
 * in the GPU restorer's GEMMs (gpu/restore_cuda.h).
 */
enum kvfs_params_rweights {
	KVFS_PARAMS_RWEIGHTS_F32 = 0, /* cublasSgemm, f32 throughout */
	KVFS_PARAMS_RWEIGHTS_BF16 = 1, /* bf16 tensor-core GEMMs, f32 sums */
};

struct kvfs_cache_params {
	/* [daemon] */
	unsigned flush_ms; /* batched hit/last-access commits (1000) */
	uint64_t meta_mapsize; /* LMDB map size (default 1G) */
	/* The scrub (cache/scrub.c): a pass every scrub_interval_ms (0 =
	 * only when asked), re-reading at most scrub_rate bytes/s of SSD
	 * extents (default 64M; 0 = no limit).
	 */
	uint64_t scrub_interval_ms;
	uint64_t scrub_rate;
	/* [tier.dram] */
	uint64_t dram_capacity; /* bytes (default 256M) */
	int dram_pinned; /* enum kvfs_params_pinned (auto) */
	bool dram_prefault; /* fault the whole tier in at start (false) */
	/* [tier.ssd] */
	unsigned ssd_rings; /* io_uring instances (default 4) */
	unsigned writeback_batch; /* blocks per write-back batch (default 64) */
	/* [tier.gpu] */
	int gpu_backend; /* enum kvfs_params_gpu (default none) */
	unsigned gpu_device; /* CUDA device ordinal (0) */
	uint64_t gpu_capacity; /* bytes of the device pool */
	/* cuda: bytes of each owner's pool (one allocation per namespace
	 * owner); 0 = gpu_capacity / the number of owners. shm ignores it.
	 */
	uint64_t gpu_owner_capacity;
	int gpu_restore; /* enum kvfs_params_restore (auto) */
	int gpu_restore_weights; /* enum kvfs_params_rweights (f32) */
	unsigned lease_ms; /* leases older than this are reclaimed
				    * (default 60000) */
	/* [chunks] */
	uint64_t chunk_dram; /* chunk cache in DRAM (default 64M) */
	uint64_t chunk_gpu; /* chunk cache in the device pool (0) */
	unsigned score_halflife; /* requests; 0 = scores never decay */
	unsigned chunk_spec_depth; /* speculative reads on the disk at once
				    * (default 8; 0 = no limit) */
	/* [policy] */
	char policy[32]; /* default "lru" */
	size_t n_policy_opts;
	char policy_keys[KVFS_PARAMS_MAX_OPTS][64];
	char policy_vals[KVFS_PARAMS_MAX_OPTS][128];
	/* [tier.remote]: the tier shared across hosts (docs/remote.md);
	 * remote.backend KVFS_REMOTE_NONE without the section.
	 */
	struct kvfs_remote_conf remote;
	/* [fleet]: block keys this host references, told to the other hosts
	 * and theirs heard (docs/remote.md, "Fleet sightings");
	 * fleet.backend KVFS_SIGHT_NONE without sightings.
	 */
	struct kvfs_sight_conf fleet;
	/* [namespace NAME] sections */
	size_t n_ns;
	struct kvfs_ns_params ns[KVFS_PARAMS_MAX_NS];
};

/*
 * kvfs_cache_params_defaults() - @p gets the defaults documented in
 * docs/config.md and no namespaces.
 */
void kvfs_cache_params_defaults(struct kvfs_cache_params *p);

#endif
