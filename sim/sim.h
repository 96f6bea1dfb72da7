/* SPDX-License-Identifier: MIT */
/*
 * Trace-driven cache simulator: replays a struct kvfs_trace through the
 * same policy code the daemon runs (cache/policy.h), over one to three
 * tiers whose capacities are counted in blocks.
 *
 * Semantics (docs/policies.md has the reasoning):
 *  - A block is a node of the prefix tree: (parent block, hash id).  Its
 *    key is a 128-bit hash chained from the root, its size one block, its
 *    tokens the block's share of input_length.
 *  - A request's hit is the longest prefix of its blocks resident in any
 *    tier at arrival; each hit block is credited to the tier it was in.
 *    The resident part of the path is then accessed, lower-tier hits are
 *    loaded into the top tier (tiers are exclusive: a load moves the
 *    block), and the missing blocks are inserted into the top tier.
 *    Every move inserts into the new tier before it removes from the old
 *    one, so a policy can tell a move (the block is in two tiers during
 *    insert) from a miss being filled (in one).
 *    Blocks of the request in flight are pinned (never victims); a block
 *    that cannot get room is not cached, nor is the rest of the path.
 *  - A victim leaves its tier and goes to the next present tier down if
 *    the policy admits it there; a refused block tries the tier below
 *    that, and is discarded when no tier is left.  When a block leaves
 *    the last tier, its resident descendants are unreachable and are
 *    discarded too ("orphans").
 *  - After each request (every promote_every requests) the promotion plan
 *    of each adjacent pair of tiers is executed; an upward move never
 *    grows the upper tier beyond its capacity.
 *
 * Not thread-safe: one simulation per struct kvfs_sim at a time.
 */
#ifndef KVFS_SIM_SIM_H
#define KVFS_SIM_SIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/policy.h"
#include "sim/trace.h"

/* Time-to-first-token model; kvfs_sim_model_default() documents defaults. */
struct kvfs_sim_model {
	double flops;        /* effective prefill FLOP/s */
	double pcie_bps;     /* host<->GPU bytes/s */
	double ssd_bps;      /* SSD read/write bytes/s */
	double net_bps;      /* host<->shared tier bytes/s (fleet) */
	double params;       /* model parameters */
	uint32_t layers;
	uint32_t hidden;     /* model width (query heads x head dim) */
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype_bytes;
};

struct kvfs_sim_conf {
	const char *policy;
	const char *const *keys; /* policy options */
	const char *const *vals;
	size_t nopts;
	uint64_t cap[KVFS_NTIERS]; /* blocks; 0 = tier absent */
	uint32_t promote_every;    /* requests between plans; 0 = never */
	uint32_t promote_max;      /* moves per plan */
	uint32_t warmup;           /* leading requests left out of stats */
	struct kvfs_sim_model model;
	/* A CSV line per counted request (kvfs_sim_run()), or NULL:
	 * policy, capacity in blocks (all tiers), the request's index in
	 * the trace, its blocks, its blocks hit (the cached prefix), its
	 * tokens and tokens hit, and its modeled TTFT in ms.
	 */
	FILE *req_out;
};

struct kvfs_sim_stats {
	uint64_t requests;        /* counted (after warm-up) */
	uint64_t block_accesses;
	uint64_t hit_blocks;
	uint64_t hit_tier[KVFS_NTIERS];
	uint64_t inserted;        /* missing blocks cached in the top tier */
	uint64_t bypassed;        /* missing blocks that found no room */
	uint64_t loaded;          /* lower-tier hits moved to the top tier */
	uint64_t evicted[KVFS_NTIERS]; /* victims taken from each tier */
	uint64_t admitted[KVFS_NTIERS]; /* blocks entering a tier from above */
	uint64_t refused;         /* admission refusals */
	uint64_t demoted;         /* victims that had a tier below */
	uint64_t discarded;       /* blocks that left the last tier */
	uint64_t orphans;         /* unreachable descendants dropped */
	uint64_t promoted;        /* upward moves of promotion plans */
	uint64_t promote_down;    /* downward moves of promotion plans */
	uint64_t promote_skipped; /* plan moves that no longer applied */
	double ttft_s;            /* sum of modeled TTFT */
	double ttft_nocache_s;    /* the same without any cache */
	double offload_s;         /* modeled time of all downward copies */
	double load_s;            /* modeled time of upward copies */
	/* Policy cost: time in access+insert hooks over block accesses, and
	 * time in victim() over victim calls.
	 */
	uint64_t access_ns, access_calls, victim_ns, victim_calls;
};

struct kvfs_sim;

/* Llama-3-8B on an H100 over PCIe 4 with an NVMe SSD (see docs). */
void kvfs_sim_model_default(struct kvfs_sim_model *m);

/*
 * kvfs_sim_new() - build the prefix tree, per-request paths and next-use
 * times of @t (which may be freed afterwards).
 * Returns 0, -EINVAL (a trace with no block size) or -ENOMEM.
 */
int kvfs_sim_new(const struct kvfs_trace *t, struct kvfs_sim **out);
/* Free what kvfs_sim_new() built; NULL is a no-op. */
void kvfs_sim_free(struct kvfs_sim *s);
/* Distinct blocks (tree nodes) of the trace. */
uint64_t kvfs_sim_unique_blocks(const struct kvfs_sim *s);
/* Requests and block accesses of the whole trace. */
uint64_t kvfs_sim_requests(const struct kvfs_sim *s);

/*
 * kvfs_sim_run() - replay the trace under @c into @st (zeroed first).
 * Returns 0, or the error of kvfs_policy_new() (-ENOENT, -EINVAL,
 * -ENOMEM, or the policy's init error), or -EINVAL for a configuration
 * without any tier.
 */
int kvfs_sim_run(struct kvfs_sim *s, const struct kvfs_sim_conf *c,
		 struct kvfs_sim_stats *st);

/*
 * Fleet mode: @hosts hosts, each with a private cache of @host_cap blocks
 * under its own instance of the policy, and optionally one tier shared
 * by all of them (@shared_cap blocks, its own policy instance, as a Redis
 * Cluster evicting by LRU). Requests go to a host round-robin or by
 * prefix affinity (the hash of their first block). A request's hit is the
 * longest prefix of blocks each resident in its host's cache or in the
 * shared tier; the host then caches the whole path (a shared hit is
 * loaded), and the blocks it had to compute are written to the shared
 * tier (admit = all). Either capacity may be 0 (no private caches: one
 * shared tier; no shared tier: private caches only).
 * TTFT is modeled as in the single-tier replay: the prefill of the tokens
 * past the hit, with a private hit free (the private cache stands where
 * the single tier does, so their tables compare) and a shared hit loaded
 * at the slower of @model's NIC and PCIe rates.
 */
enum kvfs_fleet_route {
	KVFS_FLEET_RR = 0,       /* request i to host i mod hosts */
	KVFS_FLEET_AFFINITY = 1, /* by the first block's key */
};

struct kvfs_fleet_conf {
	const char *policy;
	const char *const *keys; /* policy options */
	const char *const *vals;
	size_t nopts;
	unsigned hosts;
	int route;            /* enum kvfs_fleet_route */
	uint64_t host_cap;    /* blocks per host; 0 = none */
	uint64_t shared_cap;  /* blocks; 0 = no shared tier */
	/* With @sight, hosts tell each other the blocks of their requests,
	 * each told sight_ms (trace time) after the request.
	 */
	bool sight;
	uint64_t sight_ms;
	struct kvfs_sim_model model; /* TTFT; zeroed: none (0 s) */
};

struct kvfs_fleet_stats {
	uint64_t requests, block_accesses;
	uint64_t hit_blocks;   /* hit_local + hit_shared */
	uint64_t hit_local;    /* found in the request's host */
	uint64_t hit_shared;   /* found only in the shared tier */
	uint64_t shared_writes; /* blocks written to the shared tier */
	uint64_t sightings;    /* heard by the hosts' policies (sight) */
	uint64_t sight_ns;     /* time in kvfs_policy_sight() */
	double ttft_s;         /* sum of modeled TTFT */
	double ttft_nocache_s; /* the same without any cache */
};

/*
 * kvfs_sim_fleet_run() - replay the trace of @s over the fleet @c into
 * @st (zeroed first). Returns 0, -EINVAL (no host, or neither capacity),
 * -ENOMEM, or the error of kvfs_policy_new().
 */
int kvfs_sim_fleet_run(struct kvfs_sim *s, const struct kvfs_fleet_conf *c,
		       struct kvfs_fleet_stats *st);

#endif
