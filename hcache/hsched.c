/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "hcache/hsched.h"
#include "meta/log.h"

static bool time_ok(double t)
{
	return isfinite(t) && t >= 0;
}

/* ceil(@v) clamped to [0, @n], forgiving floating-point noise: N * a / b
 * with an exact integer ratio can come out a hair above the integer.
 */
static uint32_t ceil_layers(double v, uint32_t n)
{
	double r = nearbyint(v);

	if (!(v > 0))
		return 0;
	if (fabs(v - r) <= 1e-9 * fmax(1.0, v))
		v = r;
	else
		v = ceil(v);
	return v >= n ? n : (uint32_t)v;
}

static void finish(const struct kvfs_hsched_profile *p, int tier,
		   struct kvfs_hsched_plan *out)
{
	double ioh = p->io_hidden[tier], iokv = p->io_kv[tier];

	if (out->n_hidden == out->n_layers)
		out->mode = KVFS_HSCHED_MODE_HIDDEN_ONLY;
	else if (out->n_kv == out->n_layers)
		out->mode = KVFS_HSCHED_MODE_KV_ONLY;
	else if (out->n_recompute == out->n_layers)
		out->mode = KVFS_HSCHED_MODE_RECOMPUTE_ONLY;
	else if (out->n_kv)
		out->mode = KVFS_HSCHED_MODE_HIDDEN_KV;
	else
		out->mode = KVFS_HSCHED_MODE_HIDDEN_RECOMPUTE;
	out->t_io = ioh * out->n_hidden + iokv * out->n_kv;
	out->t_compute = p->c_hidden * out->n_hidden +
			 p->c_token * out->n_recompute;
	out->t_total = fmax(out->t_io, out->t_compute);
}

int kvfs_hsched_plan(const struct kvfs_hsched_profile *p, int tier,
		     uint32_t n_layers, struct kvfs_hsched_plan *out)
{
	double ioh, iokv, ch, ctok;
	uint32_t n = n_layers;

	if (!p || !out)
		return -EINVAL;
	if (tier < 0 || tier >= KVFS_NTIERS || !n_layers) {
		kvfs_err("hsched: bad tier %d or layer count %u", tier,
			 n_layers);
		return -EINVAL;
	}
	ioh = p->io_hidden[tier];
	iokv = p->io_kv[tier];
	ch = p->c_hidden;
	ctok = p->c_token;
	if (!time_ok(ioh) || !time_ok(iokv) || !time_ok(ch) ||
	    !time_ok(ctok)) {
		kvfs_err("hsched: profile for tier %d has a negative or non-finite time",
			 tier);
		return -EINVAL;
	}
	memset(out, 0, sizeof(*out));
	out->n_layers = n;

	if (iokv < ioh) {
		/* The KV form costs less I/O and no compute: hidden states
		 * can only lose.  (The paper assumes IO_KV = 2 IO_H.)
		 */
		out->n_kv = n;
	} else if (ch > ioh) {
		/* Compute-bound: balance C_H L_H = IO_H L_H + IO_KV L_KV.
		 * The denominator is > IO_KV >= 0, so it is positive.
		 */
		out->n_hidden = ceil_layers(n * iokv / (iokv + ch - ioh), n);
		out->n_kv = n - out->n_hidden;
	} else if (ctok > 0 && ctok < ch) {
		/* Recomputing a layer costs less than projecting it, and
		 * needs no I/O: a profile like this means no hidden layers.
		 */
		out->n_recompute = n;
	} else if (ctok > 0) {
		/* I/O-bound: balance C_Token L_RE + C_H L_H = IO_H L_H.
		 * The denominator is >= C_Token > 0.
		 */
		out->n_hidden = ceil_layers(n * ctok / (ctok + ioh - ch), n);
		out->n_recompute = n - out->n_hidden;
	} else {
		/* I/O-bound and nothing to trade I/O for. */
		out->n_hidden = n;
	}
	finish(p, tier, out);
	return 0;
}

int kvfs_hsched_layer(const struct kvfs_hsched_plan *plan, uint32_t layer)
{
	if (!plan || layer >= plan->n_layers)
		return 0;
	if (layer < plan->n_recompute)
		return KVFS_HSCHED_RECOMPUTE;
	if (layer < plan->n_recompute + plan->n_hidden)
		return KVFS_HSCHED_HIDDEN;
	return KVFS_HSCHED_KV;
}

bool kvfs_hsched_hidden_smaller(uint32_t hidden_size, uint32_t n_kv_heads,
				uint32_t head_dim)
{
	return (uint64_t)hidden_size < 2ull * n_kv_heads * head_dim;
}

int kvfs_hsched_split_auto(uint32_t hidden_size, uint32_t n_kv_heads,
			   uint32_t head_dim,
			   const struct kvfs_hsched_plan *plan,
			   uint32_t n_layers, uint32_t *kv_from)
{
	if (!kv_from || !n_layers)
		return -EINVAL;
	if (plan && plan->n_layers != n_layers) {
		kvfs_err("hsched: plan for %u layers used for %u",
			 plan->n_layers, n_layers);
		return -EINVAL;
	}
	if (!kvfs_hsched_hidden_smaller(hidden_size, n_kv_heads, head_dim))
		*kv_from = 0;
	else if (!plan)
		*kv_from = n_layers;
	else
		*kv_from = plan->n_recompute + plan->n_hidden;
	return 0;
}
