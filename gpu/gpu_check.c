/* SPDX-License-Identifier: MIT */
/*
 * The checks both device backends make on every batch before anything is
 * copied, so that shm and cuda reject exactly the same input. The
 * backends call these; nothing here calls a backend.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier/extent.h"
#include "tier/tier.h"
#include "gpu/gpu.h"
#include "gpu/gpu_i.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_gpu_name_check(const char *name, size_t max, const char *who,
			const char *what)
{
	size_t len;

	if (!name) {
		kvfs_err("%s: %s: no shm name", who, what);
		return -EINVAL;
	}
	len = strnlen(name, max);
	if (len == max) {
		kvfs_err("%s: %s: shm name not NUL-terminated within %zu bytes",
			 who, what, max);
		return -EINVAL;
	}
	if (name[0] != '/' || len < 2 || memchr(name + 1, '/', len - 1)) {
		kvfs_err("%s: %s: bad shm name \"%s\": want \"/\" then a "
			 "name without '/'", who, what, name);
		return -EINVAL;
	}
	return 0;
}

static int pool_side_ok(const struct kvfs_tier *t, const struct kvfs_extent *e,
			uint64_t off, uint64_t len)
{
	const struct kvfs_gpu_pool *p = kvfs_gpu_pool_of(t, e);

	return p && e->off <= p->size && e->len <= p->size - e->off &&
	       kvfs_tier_in_extent(e, off, len);
}

int kvfs_gpu_ext_check(const struct kvfs_tier *t, const struct kvfs_extent *e,
		       uint64_t off, const void *buf, uint64_t len,
		       const char *who, const char *what)
{
	if (!e || !pool_side_ok(t, e, off, len) || (len && !buf)) {
		const struct kvfs_gpu_pool *p = e ? kvfs_gpu_pool_of(t, e) :
						    NULL;

		kvfs_err("%s: %s of [%" PRIu64 ", +%" PRIu64 ") outside the "
			 "extent [%" PRIu64 ", +%" PRIu64 ") of pool %" PRIu32
			 " (%" PRIu64 " bytes), or no buffer", who, what, off,
			 len, e ? e->off : 0, e ? e->len : 0,
			 e ? e->pool : 0, p ? p->size : 0);
		return -EINVAL;
	}
	return 0;
}

/* Where a transfer writes, for the overlap check. */
enum dst_space { DS_PEER, DS_POOL, DS_HOST, DS_N };

struct dst_range {
	uint64_t lo, len;
	size_t i;       /* the transfer */
	unsigned sp;    /* enum dst_space */
	uint32_t pool;  /* DS_POOL: which pool (offsets are per pool) */
};

/* The range transfer @i writes, if @kind asks for it to be compared. */
static bool dst_of(const struct kvfs_gpu_xfer *x, size_t i, unsigned kind,
		   struct dst_range *r)
{
	const struct kvfs_gpu_xfer *c = &x[i];

	if (!c->len)
		return false;
	r->len = c->len;
	r->i = i;
	r->pool = 0;
	if (kind & KVFS_GPU_X_PEER_DST) {
		r->sp = DS_PEER;
		r->lo = c->peer_off;
	} else if (!(kind & KVFS_GPU_X_SIDE_DST)) {
		return false;
	} else if (c->pool) {
		r->sp = DS_POOL;
		r->pool = c->pool->pool;
		r->lo = c->pool->off + c->off;
	} else {
		r->sp = DS_HOST;
		r->lo = (uintptr_t)c->host;
	}
	return true;
}

/* Whether @b, which starts no earlier than @a in the same space, starts
 * before @a ends. Written without a + len, which a host range may
 * overflow.
 */
static bool dst_overlap(const struct dst_range *a, const struct dst_range *b)
{
	return a->len > b->lo - a->lo;
}

static int dst_cmp(const void *pa, const void *pb)
{
	const struct dst_range *a = pa, *b = pb;

	if (a->sp != b->sp)
		return a->sp < b->sp ? -1 : 1;
	if (a->pool != b->pool)
		return a->pool < b->pool ? -1 : 1;
	if (a->lo != b->lo)
		return a->lo < b->lo ? -1 : 1;
	return (a->i > b->i) - (a->i < b->i);
}

/* "[start, +len)": offsets in decimal, like the other checks' lines;
 * host addresses in hex.
 */
static void dst_fmt(const struct dst_range *r, char *buf, size_t len)
{
	snprintf(buf, len, r->sp == DS_HOST ? "[%#" PRIx64 ", +%" PRIu64 ")"
					    : "[%" PRIu64 ", +%" PRIu64 ")",
		 r->lo, r->len);
}

static int dst_refuse(const struct dst_range *a, const struct dst_range *b,
		      size_t n, const char *who, const char *what)
{
	static const char *const name[DS_N] = { "peer", "pool", "host" };
	const struct dst_range *p = a->i < b->i ? a : b;
	const struct dst_range *q = a->i < b->i ? b : a;
	char rp[64], rq[64];

	dst_fmt(p, rp, sizeof(rp));
	dst_fmt(q, rq, sizeof(rq));
	kvfs_err("%s: %s: transfers %zu and %zu of %zu write overlapping %s "
		 "ranges %s and %s; nothing copied", who, what, p->i, q->i, n,
		 name[p->sp], rp, rq);
	return -EINVAL;
}

/*
 * No byte written twice. The batches that come here are mostly in
 * ascending order already (a prefix's blocks, a layer's chunks), which
 * one pass confirms without memory; anything else is sorted.
 */
static int dst_check(const struct kvfs_gpu_xfer *x, size_t n, unsigned kind,
		     const char *who, const char *what)
{
	struct dst_range last[DS_N], r, *v;
	bool seen[DS_N] = { false };
	size_t nv = 0;
	int err = 0;

	if (!(kind & (KVFS_GPU_X_PEER_DST | KVFS_GPU_X_SIDE_DST)))
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (!dst_of(x, i, kind, &r))
			continue;
		if (seen[r.sp] && (r.pool != last[r.sp].pool ||
				   r.lo < last[r.sp].lo ||
				   dst_overlap(&last[r.sp], &r)))
			goto out_sort;
		last[r.sp] = r;
		seen[r.sp] = true;
	}
	return 0;
out_sort:
	v = malloc(n * sizeof(*v));
	if (!v) {
		kvfs_err("%s: %s: no memory to check %zu transfers for "
			 "overlapping destinations; nothing copied", who, what,
			 n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		if (dst_of(x, i, kind, &v[nv]))
			nv++;
	qsort(v, nv, sizeof(*v), dst_cmp);
	for (size_t k = 1; k < nv && !err; k++)
		if (v[k].sp == v[k - 1].sp && v[k].pool == v[k - 1].pool &&
		    dst_overlap(&v[k - 1], &v[k]))
			err = dst_refuse(&v[k - 1], &v[k], n, who, what);
	free(v);
	return err;
}

int kvfs_gpu_xfer_check(const struct kvfs_tier *t,
			const struct kvfs_gpu_xfer *x, size_t n,
			uint64_t peer_size, unsigned kind, const char *who,
			const char *what)
{
	if (n && !x) {
		kvfs_err("%s: %s of %zu transfers without an array", who, what,
			 n);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		const struct kvfs_gpu_xfer *c = &x[i];
		const char *why = NULL;

		if (kind & KVFS_GPU_X_UPLOAD) {
			if (!c->pool)
				why = "no pool extent";
			else if (c->len && !c->host)
				why = "no host buffer";
		} else if (!c->pool && c->len && !c->host) {
			why = "neither pool extent nor host buffer";
		}
		if (!why && c->pool && !pool_side_ok(t, c->pool, c->off,
						     c->len))
			why = "pool range outside its extent or the pool";
		if (!why && (kind & KVFS_GPU_X_PEER) &&
		    (c->peer_off > peer_size ||
		     c->len > peer_size - c->peer_off))
			why = "peer range outside the peer";
		if (why) {
			kvfs_err("%s: %s: transfer %zu of %zu (off %" PRIu64
				 ", peer_off %" PRIu64 ", len %" PRIu64
				 "): %s; nothing copied", who, what, i, n,
				 c->off, c->peer_off, c->len, why);
			return -EINVAL;
		}
	}
	/* Only now: every range is known to lie inside its memory. */
	return dst_check(x, n, kind, who, what);
}

int kvfs_gpu_mem_check(const struct kvfs_ctl_mem *m, uint32_t backend,
		       const char *who)
{
	if (!m) {
		kvfs_err("%s: peer_open without a descriptor", who);
		return -EINVAL;
	}
	if (m->backend != backend) {
		kvfs_err("%s: peer of backend %" PRIu32 ", this pool is "
			 "backend %" PRIu32, who, m->backend, backend);
		return -EINVAL;
	}
	if (!m->size) {
		kvfs_err("%s: peer of size 0", who);
		return -EINVAL;
	}
	if (backend == KVFS_CTL_BACKEND_SHM)
		return kvfs_gpu_name_check(m->shm_name, sizeof(m->shm_name),
					   who, "peer");
	return 0;
}

uint64_t kvfs_gpu_peer_size(const struct kvfs_gpu_peer *p)
{
	return p ? p->size : 0;
}

int kvfs_gpu_peer_check(const struct kvfs_tier *t,
			const struct kvfs_gpu_peer *p, const char *who,
			const char *what)
{
	if (!p || p->t != t) {
		kvfs_err("%s: %s with %s", who, what,
			 p ? "a peer another tier opened" : "no peer");
		return -EINVAL;
	}
	return 0;
}

uint64_t kvfs_gpu_xfer_bytes(const struct kvfs_gpu_xfer *x, size_t n)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += x[i].len;
	return sum;
}
