/* SPDX-License-Identifier: MIT */
/*
 * Temporaries: pending files under a name that is not a block name, so
 * that tools which write a temporary and rename it (rsync, editors) work.
 * They live on c->pending with the writers' files, never reach a tier or
 * the store, and become blocks only through kvfs_cache_temp_commit(),
 * which hands them to kvfs_cache_commit().
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

/* Caller holds c->pending_lock.  Unlist @p and drop the list's reference;
 * returns true when the caller must free it (no handle left).
 */
static bool temp_unlist(struct kvfs_cache *c, struct kvfs_pending *p)
{
	for (struct kvfs_pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	return --p->trefs == 0;
}

static void temp_free(struct kvfs_pending *p)
{
	pthread_mutex_destroy(&p->lock);
	free(p->tname);
	free(p->buf);
	free(p);
}

/* Caller holds c->pending_lock. */
static struct kvfs_pending *temp_find(struct kvfs_cache *c, struct kvfs_ns *ns,
				      const char *name)
{
	for (struct kvfs_pending *q = c->pending; q; q = q->next)
		if (q->tname && q->ns == ns && !strcmp(q->tname, name))
			return q;
	return NULL;
}

/* Caller holds c->pending_lock.  Drops closed temporaries past their
 * time onto *@dead (freed by the caller, outside the lock); returns how
 * many temporaries remain.
 */
static size_t temp_expire(struct kvfs_cache *c, struct kvfs_pending **dead)
{
	uint64_t now = kvfs_util_now_mono();
	struct kvfs_pending **pp = &c->pending;
	size_t n = 0;

	while (*pp) {
		struct kvfs_pending *q = *pp;

		if (!q->tname) {
			pp = &q->next;
			continue;
		}
		if (q->trefs == 1 &&
		    now - q->tclosed >
			    (uint64_t)KVFS_TEMP_TTL_S * 1000000000ull) {
			kvfs_info(
				"ns %s: temporary '%s' never renamed: dropped",
				q->ns->rec.name, q->tname);
			*pp = q->next;
			q->trefs = 0;
			q->next = *dead;
			*dead = q;
			continue;
		}
		n++;
		pp = &q->next;
	}
	return n;
}

int kvfs_cache_temp_create(struct kvfs_cache *c, struct kvfs_ns *ns,
			   const char *name, struct kvfs_pending **out)
{
	struct kvfs_pending *p, *dead = NULL;
	uint8_t key[KVFS_KEY_LEN];
	size_t len = strlen(name);
	int rc = 0;

	if (!len || !strcmp(name, ".") || !strcmp(name, "..") ||
	    strchr(name, '/') || !kvfs_fmt_name_parse(name, key))
		return -EINVAL;
	if (len > 255)
		return -ENAMETOOLONG;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->tname = strdup(name);
	if (!p->tname) {
		free(p);
		return -ENOMEM;
	}
	p->c = c;
	p->ns = ns;
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_lock(&c->pending_lock);
	if (temp_expire(c, &dead) >= KVFS_TEMP_MAX) {
		rc = -ENOSPC;
	} else if (temp_find(c, ns, name)) {
		rc = -EEXIST;
	} else {
		/* The list's reference and the handle's. */
		p->trefs = 2;
		p->ino = atomic_fetch_add(&c->next_ino, 1);
		p->next = c->pending;
		c->pending = p;
		*out = p;
	}
	pthread_mutex_unlock(&c->pending_lock);
	while (dead) {
		struct kvfs_pending *next = dead->next;

		temp_free(dead);
		dead = next;
	}
	if (rc) {
		if (rc == -ENOSPC)
			kvfs_warn("ns %s: temporary '%s' refused: %d "
				  "temporaries already wait for a rename",
				  ns->rec.name, name, KVFS_TEMP_MAX);
		temp_free(p);
	}
	return rc;
}

int kvfs_cache_temp_open(struct kvfs_cache *c, uint64_t ino,
			 struct kvfs_pending **out)
{
	struct kvfs_pending *q;

	pthread_mutex_lock(&c->pending_lock);
	for (q = c->pending; q && !(q->tname && q->ino == ino); q = q->next)
		;
	if (q) {
		q->trefs++;
		*out = q;
	}
	pthread_mutex_unlock(&c->pending_lock);
	return q ? 0 : -ENOENT;
}

void kvfs_cache_temp_close(struct kvfs_cache *c, struct kvfs_pending *p)
{
	bool last;

	if (!p)
		return;
	pthread_mutex_lock(&c->pending_lock);
	p->tclosed = kvfs_util_now_mono();
	last = --p->trefs == 0;
	pthread_mutex_unlock(&c->pending_lock);
	if (last)
		temp_free(p);
}

bool kvfs_pending_is_temp(const struct kvfs_pending *p)
{
	/* A handle's temporary keeps its name for as long as the handle:
	 * a rename refuses an open one.
	 */
	return p->tname != NULL;
}

int kvfs_cache_temp_stat(struct kvfs_cache *c, struct kvfs_ns *ns,
			 const char *name, uint64_t *ino, uint64_t *size)
{
	struct kvfs_pending *p;

	pthread_mutex_lock(&c->pending_lock);
	p = temp_find(c, ns, name);
	if (p) {
		*ino = p->ino;
		*size = kvfs_pending_size(p);
	}
	pthread_mutex_unlock(&c->pending_lock);
	return p ? 0 : -ENOENT;
}

int kvfs_cache_temp_unlink(struct kvfs_cache *c, struct kvfs_ns *ns,
			   const char *name)
{
	struct kvfs_pending *p;
	bool last = false;

	pthread_mutex_lock(&c->pending_lock);
	p = temp_find(c, ns, name);
	if (p)
		last = temp_unlist(c, p);
	pthread_mutex_unlock(&c->pending_lock);
	if (last)
		temp_free(p);
	return p ? 0 : -ENOENT;
}

int kvfs_cache_temp_commit(struct kvfs_cache *c, struct kvfs_ns *ns,
			   const char *name, const char *newname,
			   struct kvfs_block **out)
{
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_pending *p, *q;
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;
	struct kvfs_block *b;
	char *tname = NULL;
	int rc = 0;

	if (kvfs_fmt_name_parse(newname, key)) {
		pthread_mutex_lock(&c->pending_lock);
		p = temp_find(c, ns, name);
		pthread_mutex_unlock(&c->pending_lock);
		return p ? -EINVAL : -ENOENT;
	}
	b = kvfs_index_find_key(c, key);
	pthread_mutex_lock(&c->pending_lock);
	p = temp_find(c, ns, name);
	if (!p) {
		rc = -ENOENT;
		goto out_unlock;
	}
	if (p->trefs > 1) {
		rc = -EBUSY;
		goto out_unlock;
	}
	for (q = c->pending; q; q = q->next)
		if (!q->tname && !memcmp(q->key, key, KVFS_KEY_LEN))
			break;
	if (q) {
		rc = -EEXIST;
		goto out_unlock;
	}
	/* A block that would fail validation under @key keeps its
	 * temporary: mv retries a renameat2() that failed with EINVAL as a
	 * plain rename, which must see the same error, not a vanished file.
	 */
	pthread_mutex_lock(&p->lock);
	fe = kvfs_fmt_validate(p->buf, p->size, &ns->geom, key, ns->rec.root,
			       ns->hc.rst ? KVFS_FMT_ALLOW_HIDDEN : 0, &h);
	pthread_mutex_unlock(&p->lock);
	if (fe != KVFS_FMT_OK) {
		kvfs_warn("ns %s: rename of '%s' to %s refused: %s",
			  ns->rec.name, name, newname, kvfs_fmt_strerror(fe));
		rc = kvfs_fmt_errno(fe);
		goto out_unlock;
	}
	if (b) {
		/* The same key is the same content: the file is redundant. */
		bool last = temp_unlist(c, p); /* no handle: see -EBUSY */

		pthread_mutex_unlock(&c->pending_lock);
		if (last)
			temp_free(p);
		*out = b;
		return 0;
	}
	/* From here it is a writer's file under its key: a create of the
	 * same key sees it, and the commit below consumes it.
	 */
	memcpy(p->key, key, KVFS_KEY_LEN);
	tname = p->tname;
	p->tname = NULL;
out_unlock:
	pthread_mutex_unlock(&c->pending_lock);
	kvfs_cache_put(c, b);
	if (rc) {
		if (rc == -EBUSY)
			kvfs_warn("ns %s: rename of '%s' refused: still open",
				  ns->rec.name, name);
		return rc;
	}
	free(tname);
	return kvfs_cache_commit(c, p, out);
}
