/* SPDX-License-Identifier: MIT */
/*
 * The namespace quotas of kvfs.conf: pin_quota (bytes a namespace may
 * have pinned) and quota (bytes it may store; a commit over it evicts the
 * namespace's own least recently used blocks, never another's). At the
 * bottom of the control files with ctl_access.c (cache/ctl_i.h): it calls
 * none of the others.
 *
 * Neither count is kept by the engine: a namespace is walked when a
 * decision needs it. For quota, the walk's result and its victims, oldest
 * first, are kept per namespace (under quota_lock) and reused while they
 * last: what is stored only shrinks behind the count's back (unlinks,
 * evictions), so a kept count is an upper bound, and a namespace below
 * its quota commits without walking.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/ctl_i.h"
#include "meta/fmt.h"
#include "meta/log.h"

struct ino_list {
	uint64_t *v;
	size_t n, cap;
};

static int collect_ino(const char *name, uint64_t ino, void *arg)
{
	struct ino_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 256;
		uint64_t *nv = realloc(l->v, cap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = ino;
	return 0;
}

/* The inodes of @ns's committed blocks into @l (l->v malloc'd). */
static int ns_inodes(struct kvfs_ns *ns, struct ino_list *l)
{
	int rc = kvfs_ns_list(ns, 0, collect_ino, l);

	return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------ pin quota */

/* Serialises the admission of pins into namespaces with a pin quota:
 * two pins may not both fit in the room of one.
 */
static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;

/* Bytes of @ns's blocks pinned in any tier. Walks the namespace: a PIN
 * in a namespace with a quota is rare enough to pay for it.
 */
static int pinned_bytes(struct kvfs_cache *c, struct kvfs_ns *ns, uint64_t *out)
{
	struct ino_list l = { 0 };
	int rc;

	*out = 0;
	rc = ns_inodes(ns, &l);
	for (size_t i = 0; !rc && i < l.n; i++) {
		struct kvfs_block_info bi;
		struct kvfs_block *b;

		if (kvfs_cache_get(c, l.v[i], &b))
			continue;
		kvfs_block_info(b, &bi);
		if (bi.pins)
			*out += bi.size;
		kvfs_cache_put(c, b);
	}
	free(l.v);
	return rc;
}

int kvfs_ctl_pin_admit(struct kvfs_cache *c, struct kvfs_block *b, int tier)
{
	struct kvfs_ns *ns = kvfs_block_ns(b);
	const struct kvfs_ns_params *p = kvfs_ctl_ns_params(c, ns);
	struct kvfs_block_info bi;
	uint64_t used = 0;
	int rc;

	if (!p || !p->acc.pin_quota)
		return kvfs_cache_pin(c, b, tier);
	pthread_mutex_lock(&pin_lock);
	kvfs_block_info(b, &bi);
	/* A pinned block moving to another tier pins no more bytes. */
	rc = bi.pins ? 0 : pinned_bytes(c, ns, &used);
	if (!rc && !bi.pins && used + bi.size > p->acc.pin_quota) {
		kvfs_warn("namespace %s: pinning %" PRIu64 " more bytes would "
			  "pass its pin_quota (%" PRIu64 " of %" PRIu64
			  " pinned): refused",
			  kvfs_ns_name(ns), bi.size, used, p->acc.pin_quota);
		rc = -EDQUOT;
	}
	if (!rc)
		rc = kvfs_cache_pin(c, b, tier);
	pthread_mutex_unlock(&pin_lock);
	return rc;
}

/* ---------------------------------------------------------------- quota */

/* A block that may make room: its inode, and when it was last used. */
struct victim {
	uint64_t ino, last;
};

/* One namespace with a quota, of one cache. */
struct quota_ns {
	const struct kvfs_cache *c;
	const struct kvfs_ns *ns;
	uint64_t used; /* bytes stored, at most (an upper bound) */
	struct victim *v; /* oldest first, from the last walk */
	size_t nv, pos; /* v[pos..nv) not yet tried */
};

static pthread_mutex_t quota_lock = PTHREAD_MUTEX_INITIALIZER;
/* quota_lock; one entry per namespace with a quota, of any cache. */
static struct quota_ns *quotas;
static size_t n_quotas;

static struct quota_ns *quota_of(struct kvfs_cache *c, struct kvfs_ns *ns)
{
	struct quota_ns *q;

	for (size_t i = 0; i < n_quotas; i++)
		if (quotas[i].c == c && quotas[i].ns == ns)
			return &quotas[i];
	q = realloc(quotas, (n_quotas + 1) * sizeof(*q));
	if (!q)
		return NULL;
	quotas = q;
	q = &quotas[n_quotas++];
	memset(q, 0, sizeof(*q));
	q->c = c;
	q->ns = ns;
	q->used = UINT64_MAX; /* unknown: the first commit walks */
	return q;
}

static int cmp_victim(const void *pa, const void *pb)
{
	const struct victim *a = pa, *b = pb;

	if (a->last != b->last)
		return a->last < b->last ? -1 : 1;
	return (a->ino > b->ino) - (a->ino < b->ino);
}

/* Count what @q's namespace stores, and list its blocks oldest first. */
static int quota_walk(struct kvfs_cache *c, struct kvfs_ns *ns,
		      struct quota_ns *q)
{
	struct ino_list l = { 0 };
	size_t n = 0;
	int rc;

	rc = ns_inodes(ns, &l);
	free(q->v);
	q->v = NULL;
	q->nv = q->pos = 0;
	if (!rc && l.n && !(q->v = calloc(l.n, sizeof(*q->v))))
		rc = -ENOMEM;
	q->used = 0;
	for (size_t i = 0; !rc && i < l.n; i++) {
		struct kvfs_block_info bi;
		struct kvfs_block *b;

		if (kvfs_cache_get(c, l.v[i], &b))
			continue;
		kvfs_block_info(b, &bi);
		q->used += bi.stored_size;
		q->v[n].ino = bi.ino;
		q->v[n++].last = bi.last_access;
		kvfs_cache_put(c, b);
	}
	free(l.v);
	if (rc) {
		q->used = UINT64_MAX;
		return rc;
	}
	if (n)
		qsort(q->v, n, sizeof(*q->v), cmp_victim);
	q->nv = n;
	return 0;
}

/* Delete @q's next victim that is neither pinned nor leased. Returns 0
 * (q->used lowered), -ENOENT (no victim left), or the deletion's error.
 */
static int quota_evict_one(struct kvfs_cache *c, struct quota_ns *q)
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	while (q->pos < q->nv) {
		struct kvfs_block_info bi;
		struct kvfs_block *b;
		int rc;

		if (kvfs_cache_get(c, q->v[q->pos++].ino, &b))
			continue;
		kvfs_block_info(b, &bi);
		if (bi.pins || bi.leases || atomic_load(&b->leases)) {
			kvfs_cache_put(c, b);
			continue;
		}
		rc = kvfs_block_delete(c, b,
				       "evicted for its namespace's quota");
		kvfs_cache_put(c, b);
		if (rc == -EBUSY || rc == -ENOENT)
			continue;
		if (rc)
			return rc;
		q->used = q->used > bi.stored_size ? q->used - bi.stored_size :
						     0;
		kvfs_fmt_key_hex(bi.key, hex);
		kvfs_info("namespace %s: block %s.kv evicted for its "
			  "namespace's quota",
			  kvfs_ns_name(q->ns), hex);
		return 0;
	}
	return -ENOENT;
}

int kvfs_ctl_quota_admit(struct kvfs_cache *c, struct kvfs_ns *ns,
			 uint64_t bytes)
{
	const struct kvfs_ns_params *p = kvfs_ctl_ns_params(c, ns);
	uint64_t quota = p ? p->acc.quota : 0;
	struct quota_ns *q;
	bool walked = false;
	int rc = 0;

	if (!quota)
		return 0;
	if (bytes > quota) {
		kvfs_warn("namespace %s: a block of %" PRIu64
			  " bytes is larger "
			  "than its quota (%" PRIu64 "): refused",
			  kvfs_ns_name(ns), bytes, quota);
		return -EDQUOT;
	}
	pthread_mutex_lock(&quota_lock);
	q = quota_of(c, ns);
	if (!q) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	while (q->used == UINT64_MAX || q->used + bytes > quota) {
		/* The kept count may be stale: count anew before evicting,
		 * and again once the kept victims are used up.
		 */
		if (!walked || q->pos == q->nv) {
			if (walked && q->pos == q->nv)
				break;
			rc = quota_walk(c, ns, q);
			walked = true;
			if (rc)
				goto out_unlock;
			continue;
		}
		rc = quota_evict_one(c, q);
		if (rc == -ENOENT)
			break;
		if (rc)
			goto out_unlock;
	}
	if (q->used + bytes > quota) {
		kvfs_warn("namespace %s: storing %" PRIu64 " more bytes would "
			  "pass its quota (%" PRIu64 " of %" PRIu64 " stored), "
			  "and every other block of it is pinned or leased: "
			  "refused",
			  kvfs_ns_name(ns), bytes, q->used, quota);
		rc = -EDQUOT;
		goto out_unlock;
	}
	/* Counted now: a commit that fails leaves an upper bound, which the
	 * next walk corrects.
	 */
	q->used += bytes;
	rc = 0;
out_unlock:
	pthread_mutex_unlock(&quota_lock);
	return rc;
}
