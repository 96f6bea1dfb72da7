/* SPDX-License-Identifier: MIT */
/*
 * The simulator's prefix tree and request paths (struct kvfs_sim), shared
 * by the single-host replay (sim/sim.c) and the fleet (sim/fleet.c).
 * Included only from sim/. Built once by kvfs_sim_new(), read-only after.
 */
#ifndef KVFS_SIM_SIM_I_H
#define KVFS_SIM_SIM_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NIL UINT32_MAX /* no node */

struct kvfs_sim {
	uint32_t block_tokens;
	/* tree nodes */
	uint32_t nnodes, capnodes;
	uint32_t *parent, *depth, *tokens, *first_child, *next_sibling;
	uint64_t (*key)[2];
	/* requests */
	size_t nreq;
	struct sim_req {
		uint64_t ts_ms;
		size_t off; /* into path[] and next[] */
		uint32_t len;
		uint32_t tokens; /* tokens of the prompt */
		uint16_t type, turn;
	} * req;
	uint32_t *path; /* node per request position */
	uint64_t *next; /* next request (1-based) using it */
	size_t npath;
	uint32_t maxlen;
};

struct kvfs_sim_model;

/*
 * kvfs_sim_prefill_s() - modeled prefill seconds of @miss tokens computed
 * after @hit tokens found in the cache (their attention reads the hit
 * ones), under @m; 0 when @m has no FLOP rate.
 */
double kvfs_sim_prefill_s(const struct kvfs_sim_model *m, double hit,
			  double miss);
/* kvfs_sim_kv_bytes() - bytes of K and V of one token under @m. */
double kvfs_sim_kv_bytes(const struct kvfs_sim_model *m);

/*
 * kvfs_sim_next_uses() - for each path entry of the requests @keep
 * accepts (every request when @keep is NULL), write into @next (npath
 * entries, indexed as next[]) the next accepted request (1-based) that
 * reads the same block, UINT64_MAX if none.  @last is scratch of nnodes
 * entries.  Entries of requests not accepted are left alone.  No errors.
 */
void kvfs_sim_next_uses(const struct kvfs_sim *s, uint64_t *next,
			uint64_t *last, bool (*keep)(size_t i, const void *arg),
			const void *arg);

#endif
