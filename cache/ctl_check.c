/* SPDX-License-Identifier: MIT */
/*
 * A control request (meta/kvfs_ctl.h): its checks, its decoding, and the
 * context the operations work in (namespace, keys, blocks, response).
 *
 * A request is checked completely before anything happens: a malformed
 * one is refused with EINVAL and a log line, and nothing is touched.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/ctl_i.h"
#include "meta/log.h"

int kvfs_ctl_bad(const char *why, uint32_t op)
{
	kvfs_warn("ctl: malformed request (op %u): %s", op, why);
	return -EINVAL;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static int check_req(const struct kvfs_ctl_req *r, size_t len)
{
	uint64_t want;

	if (len < sizeof(*r))
		return kvfs_ctl_bad("shorter than struct kvfs_ctl_req", 0);
	if (r->magic != KVFS_CTL_MAGIC)
		return kvfs_ctl_bad("bad magic", r->op);
	if (r->abi != KVFS_CTL_ABI)
		return kvfs_ctl_bad("unsupported ABI version", r->op);
	if (r->op < 1 || r->op > KVFS_CTL_OP_MAX)
		return kvfs_ctl_bad("unknown operation", r->op);
	if (r->size != len)
		return kvfs_ctl_bad("size field differs from the bytes sent",
				    r->op);
	if (!memchr(r->ns, 0, sizeof(r->ns)))
		return kvfs_ctl_bad("namespace not NUL-terminated", r->op);
	if (r->flags & ~(unsigned)(KVFS_CTL_F_ACCESS | KVFS_CTL_F_TOKENS |
				   KVFS_CTL_F_SPECULATE | KVFS_CTL_F_POOL |
				   KVFS_CTL_F_REMOTE))
		return kvfs_ctl_bad("unknown flags", r->op);
	if (!all_zero(r->reserved, sizeof(r->reserved)))
		return kvfs_ctl_bad("reserved bytes not zero", r->op);
	if (r->n_keys > KVFS_CTL_MAX_BLOCKS ||
	    r->n_tokens > KVFS_CTL_MAX_SIZE / 4 ||
	    r->n_dst > KVFS_CTL_MAX_BLOCKS)
		return kvfs_ctl_bad("too many keys, tokens or destinations",
				    r->op);
	if (r->n_chunks > KVFS_CTL_MAX_SIZE / 4 ||
	    r->n_scores > KVFS_CTL_MAX_SIZE / 4)
		return kvfs_ctl_bad("too many chunks or scores", r->op);
	want = sizeof(*r) + (uint64_t)r->n_keys * 16 +
	       (uint64_t)r->n_tokens * 4 + (uint64_t)r->n_dst * 8 +
	       (uint64_t)r->n_chunks * 4 + (uint64_t)r->n_scores * 4;
	if (want != len)
		return kvfs_ctl_bad("size does not match the array counts",
				    r->op);
	if (r->tier > 3)
		return kvfs_ctl_bad("tier out of range", r->op);
	if (r->op == KVFS_CTL_FETCH_INTO && r->n_dst != r->n_keys)
		return kvfs_ctl_bad("FETCH_INTO needs one destination per key",
				    r->op);
	if (r->op == KVFS_CTL_FETCH_INTO && (r->flags & KVFS_CTL_F_TOKENS))
		return kvfs_ctl_bad("FETCH_INTO takes keys, not tokens", r->op);
	if (r->op == KVFS_CTL_FETCH_CHUNKS) {
		if (r->n_dst != ((r->flags & KVFS_CTL_F_POOL) ? 0u : 1u))
			return kvfs_ctl_bad(
				"FETCH_CHUNKS takes one destination, or none "
				"with F_POOL",
				r->op);
		if (!r->n_keys || !r->n_chunks || !r->n_layers)
			return kvfs_ctl_bad(
				"FETCH_CHUNKS needs keys, chunks and layers",
				r->op);
		if (r->n_scores)
			return kvfs_ctl_bad("FETCH_CHUNKS takes no scores",
					    r->op);
	} else if (r->op != KVFS_CTL_FETCH_INTO && r->n_dst) {
		return kvfs_ctl_bad(
			"destinations given to an operation without any",
			r->op);
	}
	if (r->op == KVFS_CTL_SCORES &&
	    (!r->n_keys || !r->n_chunks || r->n_scores != r->n_chunks))
		return kvfs_ctl_bad("SCORES pairs one score with each chunk",
				    r->op);
	if (r->op != KVFS_CTL_FETCH_CHUNKS && r->op != KVFS_CTL_SCORES &&
	    (r->n_chunks || r->n_scores || r->layer_first || r->n_layers ||
	     r->sub_period))
		return kvfs_ctl_bad(
			"chunk fields given to an operation without any",
			r->op);
	if (r->flags & (KVFS_CTL_F_SPECULATE | KVFS_CTL_F_POOL) &&
	    r->op != KVFS_CTL_FETCH_CHUNKS)
		return kvfs_ctl_bad(
			"chunk flags given to an operation without any", r->op);
	/* The fetches always look remotely; only LOOKUP asks. */
	if ((r->flags & KVFS_CTL_F_REMOTE) && r->op != KVFS_CTL_LOOKUP)
		return kvfs_ctl_bad("the remote flag is for LOOKUP", r->op);
	return 0;
}

int kvfs_ctl_decode(struct kvfs_ctl_ctx *x, const void *req, size_t len)
{
	const struct kvfs_ctl_req *r = req;
	int rc;

	rc = check_req(r, len);
	if (rc)
		return rc;
	x->r = r;
	x->keys = (const void *)((const uint8_t *)req + sizeof(*r));
	x->tokens =
		(const uint32_t *)((const uint8_t *)x->keys + 16 * r->n_keys);
	x->dst = (const void *)((const uint8_t *)x->tokens + 4 * r->n_tokens);
	x->chunks = (const uint32_t *)((const uint8_t *)x->dst + 8 * r->n_dst);
	x->scores = (const float *)(x->chunks + r->n_chunks);
	if ((r->flags & KVFS_CTL_F_TOKENS) && r->n_keys)
		return kvfs_ctl_bad("F_TOKENS with keys", r->op);
	return 0;
}

int kvfs_ctl_fail(struct kvfs_ctl_ctx *x, int err, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kvfs_info("ctl op %u: %s", x->r->op, msg);
	x->resp->error = err;
	return 0;
}

int kvfs_ctl_resolve(struct kvfs_ctl_ctx *x)
{
	const struct kvfs_geom *g;
	uint8_t parent[16];

	/* STATS and a RELEASE of everything concern the session, not a
	 * namespace.
	 */
	if (!x->r->ns[0] &&
	    (x->r->op == KVFS_CTL_STATS || (x->r->op == KVFS_CTL_RELEASE &&
					    !x->r->n_keys && !x->r->n_tokens)))
		return 0;
	x->ns = kvfs_cache_ns_by_name(x->c, x->r->ns);
	if (!x->ns)
		return kvfs_ctl_fail(x, -ENOENT, "unknown namespace '%s'",
				     x->r->ns);
	if (!(x->r->flags & KVFS_CTL_F_TOKENS)) {
		x->nk = x->r->n_keys;
		return 0;
	}
	g = kvfs_ns_geom(x->ns);
	x->nk = x->r->n_tokens / g->block_tokens;
	x->chain = calloc(x->nk ? x->nk : 1, 16);
	if (!x->chain)
		return -ENOMEM;
	memcpy(parent, kvfs_ns_root(x->ns), 16);
	for (size_t i = 0; i < x->nk; i++) {
		kvfs_fmt_block_key(parent, x->tokens + i * g->block_tokens,
				   g->block_tokens, x->chain[i]);
		memcpy(parent, x->chain[i], 16);
	}
	return 0;
}

struct kvfs_block *kvfs_ctl_find(struct kvfs_ctl_ctx *x, const uint8_t *key)
{
	struct kvfs_block *b = kvfs_index_find_key(x->c, key);

	if (b &&
	    (b->ns != x->ns || (atomic_load(&b->flags) & KVFS_B_DELETED))) {
		kvfs_cache_put(x->c, b);
		b = NULL;
	}
	return b;
}

void kvfs_ctl_put_all(struct kvfs_cache *c, struct kvfs_block **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		kvfs_cache_put(c, v[i]);
}

int kvfs_ctl_find_all(struct kvfs_ctl_ctx *x, struct kvfs_block **v)
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	for (size_t i = 0; i < x->nk; i++) {
		v[i] = kvfs_ctl_find(x, kvfs_ctl_key_at(x, i));
		if (!v[i]) {
			kvfs_ctl_put_all(x->c, v, i);
			x->resp->n_cached = (uint32_t)i;
			kvfs_fmt_key_hex(kvfs_ctl_key_at(x, i), hex);
			return kvfs_ctl_fail(x, -ENOENT,
					     "block %s.kv is not cached", hex);
		}
	}
	return 0;
}

void kvfs_ctl_fill_block(struct kvfs_ctl_ctx *x, size_t i, struct kvfs_block *b)
{
	struct kvfs_ctl_block *o = &x->blk[i];

	memcpy(o->key, kvfs_ctl_key_at(x, i), 16);
	if (!b)
		return;
	o->tiers = atomic_load(&b->tiers);
	o->n_tokens = b->n_tokens;
	o->len = b->size - kvfs_block_payload_off(b);
	o->layer_bytes = o->len / b->ns->geom.n_layers;
}

int kvfs_ctl_need_gpu(struct kvfs_ctl_ctx *x)
{
	if (x->c->tier[KVFS_TIER_GPU])
		return 0;
	kvfs_ctl_fail(x, -ENODEV, "%s",
		      "no device tier configured ([tier.gpu])");
	return -ENODEV;
}
