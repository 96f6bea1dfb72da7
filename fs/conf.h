/* SPDX-License-Identifier: MIT */
/*
 * kvfs.conf: INI, parsed with inih.  Strict: an unknown section or key, a
 * malformed value or a duplicate namespace is an error naming the file,
 * the line and the reason, so a typo never silently changes behaviour.
 * docs/config.md documents every key; the repository's kvfs.conf is a
 * commented example.
 *
 * Not thread-safe; the daemon loads the config once at start.
 */
#ifndef KVFS_FS_CONF_H
#define KVFS_FS_CONF_H

#include <stdint.h>
#include <stddef.h>

#include "meta/fmt.h"
#include "meta/meta.h"

#define KVFS_CONF_MAX_NS 64
#define KVFS_CONF_MAX_OPTS 32
#define KVFS_CONF_STR 256

/* What a namespace keeps when an engine writes a HIDDEN-kind block; the
 * values are those of the namespace record's store_as.
 */
enum kvfs_conf_store_as {
	KVFS_STORE_KV = 0,     /* restore once at commit, store K and V */
	KVFS_STORE_HIDDEN = 1, /* store the hidden states as written */
	KVFS_STORE_AUTO = 2,   /* hidden where smaller than K+V, else KV */
};

/* Hidden-state restoration (HCache, docs/hcache.md): the model knowledge
 * of a namespace.  Without weights every field is at its default and
 * HIDDEN-kind writes are refused.
 */
struct kvfs_conf_hcache {
	char weights[KVFS_CONF_STR];  /* .safetensors or index .json; "" */
	int family;                   /* enum kvfs_restore_family; 0 = none */
	double rms_norm_eps;          /* default 1e-6 (Hugging Face's) */
	double rope_theta;            /* default 10000 */
	int rope_type;                /* enum kvfs_rope_type (default) */
	double rope_factor;           /* linear, llama3 */
	double rope_low_freq_factor;  /* llama3 */
	double rope_high_freq_factor; /* llama3 */
	uint32_t rope_orig_max_pos;   /* llama3 */
	uint32_t store_as;            /* enum kvfs_conf_store_as (kv) */
	/* hcache_kv_layers: how many last layers store_as = auto keeps as
	 * K and V, in place of the start-up schedule's choice;
	 * KVFS_CONF_KV_LAYERS_SCHED when not set.
	 */
	uint32_t kv_layers;
};
#define KVFS_CONF_KV_LAYERS_SCHED UINT32_MAX

struct kvfs_conf_ns {
	char name[KVFS_NS_NAME_MAX];
	char salt[KVFS_NS_SALT_MAX];
	struct kvfs_geom geom;
	struct kvfs_conf_hcache hc;
};

enum kvfs_conf_gpu {
	KVFS_CONF_GPU_NONE = 0,
	KVFS_CONF_GPU_SHM = 1,
	KVFS_CONF_GPU_CUDA = 2,
};

/* [tier.dram] pinned: whether the DRAM tier is one pinned arena that the
 * device tier copies from directly (docs/config.md).
 */
enum kvfs_conf_pinned {
	KVFS_CONF_PINNED_AUTO = 0, /* yes with backend = cuda, else no;
				    * pinning failure is a warning */
	KVFS_CONF_PINNED_YES = 1,  /* pinned, or refuse to start (cuda only) */
	KVFS_CONF_PINNED_NO = 2,   /* a heap buffer per block, staged copies */
};

/* [tier.gpu] restore: how a block stored as hidden states is rebuilt when
 * it is loaded into the device pool (docs/hcache.md).
 */
enum kvfs_conf_gpu_restore {
	KVFS_CONF_RESTORE_AUTO = 0, /* cuda: on the GPU if it can start, else
				     * the CPU; shm: the CPU */
	KVFS_CONF_RESTORE_GPU = 1,  /* on the GPU or refuse to start (cuda) */
	KVFS_CONF_RESTORE_CPU = 2,  /* on the CPU, into the pool */
};

struct kvfs_conf {
	/* [daemon] */
	unsigned threads;          /* max FUSE worker threads (default 16) */
	int log_level;             /* enum kvfs_log_level (default info) */
	char log_file[KVFS_CONF_STR]; /* "" = STORE/kvfs.log when daemonised */
	unsigned flush_ms;         /* batched hit/last-access commits (1000) */
	uint64_t meta_mapsize;     /* LMDB map size (default 1G) */
	/* [tier.dram] */
	uint64_t dram_capacity;    /* bytes (default 256M) */
	int dram_pinned;           /* enum kvfs_conf_pinned (auto) */
	/* [tier.ssd] */
	unsigned ssd_rings;        /* io_uring instances (default 4) */
	unsigned writeback_batch;  /* blocks per write-back batch (default 64) */
	/* [tier.gpu] */
	int gpu_backend;           /* enum kvfs_conf_gpu (default none) */
	unsigned gpu_device;       /* CUDA device ordinal (0) */
	uint64_t gpu_capacity;     /* bytes of the device pool */
	int gpu_restore;           /* enum kvfs_conf_gpu_restore (auto) */
	unsigned lease_ms;         /* leases older than this are reclaimed
				    * (default 60000) */
	/* [chunks] */
	uint64_t chunk_dram;       /* chunk cache in DRAM (default 64M) */
	uint64_t chunk_gpu;        /* chunk cache in the device pool (0) */
	unsigned score_halflife;   /* requests; 0 = scores never decay */
	unsigned chunk_spec_depth; /* speculative reads on the disk at once
				    * (default 8; 0 = no limit) */
	/* [policy] */
	char policy[32];           /* default "lru" */
	size_t n_policy_opts;
	char policy_keys[KVFS_CONF_MAX_OPTS][64];
	char policy_vals[KVFS_CONF_MAX_OPTS][128];
	/* [namespace NAME] sections */
	size_t n_ns;
	struct kvfs_conf_ns ns[KVFS_CONF_MAX_NS];
};

/* Fill @c with the defaults above and no namespaces. */
void kvfs_conf_defaults(struct kvfs_conf *c);

/*
 * kvfs_conf_load() - read and check a config file.
 * Returns 0; -ENOENT/-EACCES if it cannot be opened; -EINVAL for any
 * syntax or value error. Every error is logged as "PATH:LINE: reason".
 */
int kvfs_conf_load(const char *path, struct kvfs_conf *c);
/* The same from a string; @origin names it in log lines. */
int kvfs_conf_parse(const char *text, const char *origin,
		    struct kvfs_conf *c);

/* A namespace name is 1..63 of [A-Za-z0-9._-], not starting with '.'.
 * Returns 0 or -EINVAL.
 */
int kvfs_conf_ns_name_ok(const char *name);

#endif
