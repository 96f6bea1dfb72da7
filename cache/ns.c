/* SPDX-License-Identifier: MIT */
/*
 * Namespaces: lookups of the namespace table (fixed at open) and each
 * namespace's listing of its committed blocks, sorted by inode number.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

size_t kvfs_cache_ns_count(const struct kvfs_cache *c)
{
	return c->n_ns;
}

struct kvfs_ns *kvfs_cache_ns_at(struct kvfs_cache *c, size_t i)
{
	return i < c->n_ns ? &c->ns[i] : NULL;
}

struct kvfs_ns *kvfs_cache_ns_by_name(struct kvfs_cache *c, const char *name)
{
	for (size_t i = 0; i < c->n_ns; i++)
		if (!strcmp(c->ns[i].rec.name, name))
			return &c->ns[i];
	return NULL;
}

struct kvfs_ns *kvfs_cache_ns_by_ino(struct kvfs_cache *c, uint64_t ino)
{
	for (size_t i = 0; i < c->n_ns; i++)
		if (c->ns[i].ino == ino)
			return &c->ns[i];
	return NULL;
}

const char *kvfs_ns_name(const struct kvfs_ns *ns)
{
	return ns->rec.name;
}

uint64_t kvfs_ns_ino(const struct kvfs_ns *ns)
{
	return ns->ino;
}

const struct kvfs_geom *kvfs_ns_geom(const struct kvfs_ns *ns)
{
	return &ns->geom;
}

const uint8_t *kvfs_ns_root(const struct kvfs_ns *ns)
{
	return ns->rec.root;
}

uint64_t kvfs_ns_nblocks(const struct kvfs_ns *ns)
{
	struct kvfs_ns *m = (struct kvfs_ns *)ns;
	uint64_t n;

	pthread_rwlock_rdlock(&m->lock);
	n = m->n;
	pthread_rwlock_unlock(&m->lock);
	return n;
}

/* First index whose ino is greater than @ino. Caller holds ns->lock. */
static size_t ns_upper(const struct kvfs_ns *ns, uint64_t ino)
{
	size_t lo = 0, hi = ns->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ns->blocks[mid]->ino <= ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void kvfs_ns_times(const struct kvfs_ns *ns, uint64_t *created,
		   uint64_t *changed)
{
	*created = ns->created;
	*changed = atomic_load(&((struct kvfs_ns *)ns)->changed);
}

/* Recovery adds blocks in any order: the newest commit wins. */
static void ns_touch(struct kvfs_ns *ns, uint64_t t)
{
	uint64_t cur = atomic_load(&ns->changed);

	while (cur < t && !atomic_compare_exchange_weak(&ns->changed, &cur, t))
		;
}

void kvfs_ns_add(struct kvfs_ns *ns, struct kvfs_block *b)
{
	ns_touch(ns, b->created);
	pthread_rwlock_wrlock(&ns->lock);
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? ns->cap * 2 : 256;
		struct kvfs_block **nb = realloc(ns->blocks, cap * sizeof(*nb));

		if (!nb) {
			/* Listing is best effort; the block stays reachable
			 * by name.
			 */
			kvfs_err("ns %s: out of memory for the listing",
				 ns->rec.name);
			goto out_unlock;
		}
		ns->blocks = nb;
		ns->cap = cap;
	}
	size_t i = ns_upper(ns, b->ino);
	memmove(&ns->blocks[i + 1], &ns->blocks[i],
		(ns->n - i) * sizeof(*ns->blocks));
	ns->blocks[i] = b;
	ns->n++;
	atomic_fetch_add_explicit(&ns->st_bytes, b->size, memory_order_relaxed);
out_unlock:
	pthread_rwlock_unlock(&ns->lock);
}

void kvfs_ns_del(struct kvfs_ns *ns, struct kvfs_block *b)
{
	ns_touch(ns, kvfs_util_now_real());
	pthread_rwlock_wrlock(&ns->lock);
	size_t i = ns_upper(ns, b->ino);
	if (i > 0 && ns->blocks[i - 1] == b) {
		memmove(&ns->blocks[i - 1], &ns->blocks[i],
			(ns->n - i) * sizeof(*ns->blocks));
		ns->n--;
		atomic_fetch_sub_explicit(&ns->st_bytes, b->size,
					  memory_order_relaxed);
	}
	pthread_rwlock_unlock(&ns->lock);
}

int kvfs_ns_list(struct kvfs_ns *ns, uint64_t after,
		 int (*fn)(const char *name, uint64_t ino, void *arg),
		 void *arg)
{
	char name[KVFS_FMT_NAME_LEN + 1];
	int rc = 0;

	pthread_rwlock_rdlock(&ns->lock);
	for (size_t i = ns_upper(ns, after); i < ns->n && !rc; i++) {
		kvfs_fmt_key_hex(ns->blocks[i]->pn.key, name);
		memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
		rc = fn(name, ns->blocks[i]->ino, arg);
	}
	pthread_rwlock_unlock(&ns->lock);
	return rc > 0 ? 0 : rc;
}
