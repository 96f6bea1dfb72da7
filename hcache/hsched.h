/* SPDX-License-Identifier: MIT */
/*
 * Bubble-free restoration schedule (HCache, paper 003 §4.1) and the
 * store_as = auto decision.
 *
 * Restoring a block layer by layer overlaps two resources: I/O (loading a
 * layer's hidden states or its KV from a tier) and compute (projecting
 * hidden states to K/V, or recomputing a layer from tokens).  When one
 * resource finishes early the other leaves a bubble.  The paper splits the
 * layers, never the tokens of a layer, between methods so that both finish
 * together, with per-layer times profiled on the host:
 *
 *   IO_H   load one layer's hidden states      C_H     project one layer
 *   IO_KV  load one layer's K and V            C_Token recompute one layer
 *                                                      from tokens
 *
 * Compute-bound (C_H > IO_H): hidden states + KV load,
 *   L_H = ceil(N * IO_KV / (IO_KV + C_H - IO_H)),  L_KV = N - L_H;
 *   the hidden layers are the first L_H, the KV layers the last L_KV.
 * I/O-bound (C_H <= IO_H) with a token recompute path: hidden states +
 * recompute,
 *   L_H = ceil(N * C_Token / (C_Token + IO_H - C_H)),  L_RE = N - L_H;
 *   the recomputed layers are the first L_RE (a forward pass from tokens
 *   produces layer inputs in order), the hidden layers the rest.
 * I/O-bound without one: every layer from hidden states (moving a layer to
 * KV would only add I/O).
 *
 * Two cases the paper's formulas assume away are decided directly
 * (docs/hcache.md): IO_KV < IO_H (the KV form is smaller, e.g. GQA) makes
 * every layer KV; in the I/O-bound case C_Token < C_H makes every layer
 * recomputed.  A ceiling within 1e-9 relative of an integer is taken as
 * that integer so that exact ratios do not gain a layer from rounding
 * noise.
 *
 * Pure functions; thread-safe.
 */
#ifndef KVFS_HCACHE_HSCHED_H
#define KVFS_HCACHE_HSCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tier/tier.h"

/* Profiled per-layer times for one block size (any unit, the same for
 * all; the daemon uses seconds).  io_* are per source tier; the GPU tier's
 * entries describe data already on the device (normally 0).
 */
struct kvfs_hsched_profile {
	double io_hidden[KVFS_NTIERS]; /* IO_H */
	double io_kv[KVFS_NTIERS];     /* IO_KV */
	double c_hidden;               /* C_H */
	double c_token;                /* C_Token; 0 = no model runner */
};

enum kvfs_hsched_method {
	KVFS_HSCHED_HIDDEN = 1,    /* load hidden states, project */
	KVFS_HSCHED_KV = 2,        /* load the KV form */
	KVFS_HSCHED_RECOMPUTE = 3, /* recompute from tokens */
};

enum kvfs_hsched_mode {
	KVFS_HSCHED_MODE_HIDDEN_ONLY = 1,
	KVFS_HSCHED_MODE_HIDDEN_KV = 2,        /* compute-bound */
	KVFS_HSCHED_MODE_HIDDEN_RECOMPUTE = 3, /* I/O-bound */
	KVFS_HSCHED_MODE_KV_ONLY = 4,          /* KV form is cheaper */
	KVFS_HSCHED_MODE_RECOMPUTE_ONLY = 5,   /* recompute is cheaper */
};

/* A schedule for one block: layers [0, n_recompute) are recomputed,
 * [n_recompute, n_recompute + n_hidden) restored from hidden states, the
 * remaining n_kv layers loaded as KV.  (At most two of the counts are
 * nonzero.)
 */
struct kvfs_hsched_plan {
	int mode;                 /* enum kvfs_hsched_mode */
	uint32_t n_layers;
	uint32_t n_hidden;
	uint32_t n_kv;
	uint32_t n_recompute;
	/* Predicted times of the pipelined restore, in profile units. */
	double t_io;
	double t_compute;
	double t_total;           /* max(t_io, t_compute) */
};

/*
 * kvfs_hsched_plan() - split @n_layers for blocks read from @tier.
 * @p:     profile; every time finite and >= 0.
 * @tier:  enum kvfs_tier_id of the block's source.
 * @out:   the plan.
 * Returns 0 or -EINVAL (bad tier, n_layers 0, negative/NaN/inf time;
 * logged).
 */
int kvfs_hsched_plan(const struct kvfs_hsched_profile *p, int tier,
		     uint32_t n_layers, struct kvfs_hsched_plan *out);

/* How layer @layer (< plan->n_layers) is restored under @plan; 0 when
 * @layer is out of range.
 */
int kvfs_hsched_layer(const struct kvfs_hsched_plan *plan, uint32_t layer);

/*
 * kvfs_hsched_hidden_smaller() - whether a token's hidden state (one row
 * of hidden_size) is strictly smaller than its K plus V (2 * n_kv_heads *
 * head_dim), element type being the same.  True for MHA, false for most
 * GQA models (Llama-3-8B: 4096 vs 2048).
 */
bool kvfs_hsched_hidden_smaller(uint32_t hidden_size, uint32_t n_kv_heads,
				uint32_t head_dim);

/*
 * kvfs_hsched_split_auto() - the per-layer split store_as = auto stores:
 * layers [0, *kv_from) as hidden states, [*kv_from, n_layers) as K and V
 * only (each layer in one form, as in the paper, so a block never takes
 * more room than its KV form).
 * @plan:     the schedule of the tier blocks are kept on for the long term
 *            (the daemon passes its SSD plan), or NULL when there is none.
 * @kv_from:  out.
 *
 * When the hidden form is not smaller (kvfs_hsched_hidden_smaller()),
 * *kv_from is 0: every layer is KV.  Otherwise it is the plan's first KV
 * layer, n_recompute + n_hidden (recomputed layers keep their hidden state
 * so that a tier without a recompute path can still restore them), or
 * @n_layers without a plan.
 * Returns 0, or -EINVAL (NULL @kv_from, @n_layers 0, or a plan for a
 * different layer count; logged).
 */
int kvfs_hsched_split_auto(uint32_t hidden_size, uint32_t n_kv_heads,
			   uint32_t head_dim,
			   const struct kvfs_hsched_plan *plan,
			   uint32_t n_layers, uint32_t *kv_from);

#endif
