/* SPDX-License-Identifier: MIT */
/*
 * Control sessions, one per open .kvfs/ctl descriptor, and what they hold
 * for the caller's processes: leases on blocks (FETCH, FETCH_INTO) and
 * pool regions (FETCH_CHUNKS with F_POOL). A lease keeps its block where
 * it is; the mover takes back those held too long (kvfs_ctl_reclaim).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/ctl_i.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_ctl_tgid_of(int tid)
{
	char path[64], line[128];
	int tgid = tid;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", tid);
	f = fopen(path, "re");
	if (!f)
		return tid;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Tgid: %d", &tgid) == 1)
			break;
	fclose(f);
	return tgid;
}

int kvfs_ctl_open(struct kvfs_cache *c, struct kvfs_ctl_session **out)
{
	struct kvfs_ctl_session *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->c = c;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->stage_lock, NULL);
	pthread_mutex_init(&s->peer_lock, NULL);
	pthread_mutex_lock(&c->ctl_lock);
	s->next = c->sessions;
	c->sessions = s;
	pthread_mutex_unlock(&c->ctl_lock);
	*out = s;
	return 0;
}

/* Caller holds s->lock. */
static void lease_drop_at(struct kvfs_ctl_session *s, size_t i)
{
	struct kvfs_block *b = s->l[i].b;

	atomic_fetch_sub(&b->leases, (int)s->l[i].count);
	atomic_fetch_sub(&s->c->st_leases, s->l[i].count);
	kvfs_cache_put(s->c, b);
	s->l[i] = s->l[--s->n];
}

/* Caller holds s->lock. */
static int lease_take(struct kvfs_ctl_session *s, int pid, struct kvfs_block *b)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->l[i].b == b && s->l[i].pid == pid) {
			s->l[i].count++;
			s->l[i].since = kvfs_util_now_mono();
			goto out_count;
		}
	}
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct kvfs_ctl_lease *nl = realloc(s->l, cap * sizeof(*nl));

		if (!nl)
			return -ENOMEM;
		s->l = nl;
		s->cap = cap;
	}
	kvfs_block_get_ref(b);
	s->l[s->n++] =
		(struct kvfs_ctl_lease){ b, pid, 1, kvfs_util_now_mono() };
out_count:
	atomic_fetch_add(&b->leases, 1);
	atomic_fetch_add(&s->c->st_leases, 1);
	return 0;
}

/* Caller holds s->lock. */
static void region_drop_at(struct kvfs_ctl_session *s, size_t i)
{
	struct kvfs_tier *gpu = s->c->tier[KVFS_TIER_GPU];

	gpu->ops->free(gpu, &s->rg[i].ext);
	s->rg[i] = s->rg[--s->nrg];
}

/* Caller holds s->lock. */
static void regions_drop_pid(struct kvfs_ctl_session *s, int pid)
{
	for (size_t i = s->nrg; i-- > 0;)
		if (pid < 0 || s->rg[i].pid == pid)
			region_drop_at(s, i);
}

/* Caller holds s->lock. */
static void leases_drop_pid(struct kvfs_ctl_session *s, int pid)
{
	for (size_t i = s->n; i-- > 0;)
		if (s->l[i].pid == pid)
			lease_drop_at(s, i);
	regions_drop_pid(s, pid);
}

/* Caller holds s->lock. Blocks @pid holds no lease on are skipped. */
static void leases_undo_locked(struct kvfs_ctl_session *s, int pid,
			       struct kvfs_block **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < s->n; j++) {
			if (s->l[j].b != v[i] || s->l[j].pid != pid)
				continue;
			atomic_fetch_sub(&v[i]->leases, 1);
			atomic_fetch_sub(&s->c->st_leases, 1);
			if (--s->l[j].count == 0) {
				kvfs_cache_put(s->c, v[i]);
				s->l[j] = s->l[--s->n];
			}
			break;
		}
	}
}

int kvfs_ctl_leases_take(struct kvfs_ctl_session *s, int pid,
			 struct kvfs_block **v, size_t n)
{
	size_t i;
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	for (i = 0; i < n; i++) {
		rc = lease_take(s, pid, v[i]);
		if (rc)
			break;
	}
	if (rc)
		leases_undo_locked(s, pid, v, i);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void kvfs_ctl_leases_undo(struct kvfs_ctl_session *s, int pid,
			  struct kvfs_block **v, size_t n)
{
	pthread_mutex_lock(&s->lock);
	leases_undo_locked(s, pid, v, n);
	pthread_mutex_unlock(&s->lock);
}

void kvfs_ctl_leases_release(struct kvfs_ctl_session *s, int pid,
			     const uint8_t (*keys)[16], size_t n)
{
	pthread_mutex_lock(&s->lock);
	if (!n)
		leases_drop_pid(s, pid);
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < s->n; j++) {
			if (s->l[j].pid == pid &&
			    !memcmp(s->l[j].b->pn.key, keys[i], 16)) {
				lease_drop_at(s, j);
				break;
			}
		}
	}
	pthread_mutex_unlock(&s->lock);
}

uint64_t kvfs_ctl_leases_count(struct kvfs_ctl_session *s, int pid)
{
	uint64_t n = 0;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->n; i++)
		if (s->l[i].pid == pid)
			n += s->l[i].count;
	pthread_mutex_unlock(&s->lock);
	return n;
}

int kvfs_ctl_region_keep(struct kvfs_ctl_session *s, int pid,
			 const struct kvfs_extent *ext)
{
	int rc = -ENOMEM;

	pthread_mutex_lock(&s->lock);
	if (s->nrg == s->caprg) {
		size_t cap = s->caprg ? s->caprg * 2 : 8;
		struct kvfs_ctl_region *nr = realloc(s->rg, cap * sizeof(*nr));

		if (nr) {
			s->rg = nr;
			s->caprg = cap;
		}
	}
	if (s->nrg < s->caprg) {
		s->rg[s->nrg++] = (struct kvfs_ctl_region){ *ext, pid };
		rc = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void kvfs_ctl_flush(struct kvfs_ctl_session *s, int tid)
{
	int pid;

	pthread_mutex_lock(&s->lock);
	if (!s->n && !s->nrg) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	pid = kvfs_ctl_tgid_of(tid);
	pthread_mutex_lock(&s->lock);
	leases_drop_pid(s, pid);
	pthread_mutex_unlock(&s->lock);
}

void kvfs_ctl_close(struct kvfs_ctl_session *s)
{
	struct kvfs_cache *c;

	if (!s)
		return;
	c = s->c;
	pthread_mutex_lock(&c->ctl_lock);
	for (struct kvfs_ctl_session **pp = &c->sessions; *pp;
	     pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->ctl_lock);
	kvfs_ctl_spec_cancel(s);
	pthread_mutex_lock(&s->lock);
	while (s->n)
		lease_drop_at(s, s->n - 1);
	regions_drop_pid(s, -1);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->stage_lock);
	kvfs_ctl_kept_release(s);
	pthread_mutex_destroy(&s->peer_lock);
	free(s->l);
	free(s->rg);
	free(s);
}

void kvfs_ctl_reclaim(struct kvfs_cache *c)
{
	uint64_t now = kvfs_util_now_mono();
	uint64_t limit = (uint64_t)c->conf.lease_ms * 1000000ull;

	pthread_mutex_lock(&c->ctl_lock);
	for (struct kvfs_ctl_session *s = c->sessions; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		for (size_t i = s->n; i-- > 0;) {
			char hex[KVFS_KEY_HEX_LEN + 1];

			if (now - s->l[i].since < limit)
				continue;
			kvfs_fmt_key_hex(s->l[i].b->pn.key, hex);
			kvfs_warn("lease on %s.kv held for more than %u ms: "
				  "reclaimed (the engine holding it may be "
				  "stuck)",
				  hex, c->conf.lease_ms);
			atomic_fetch_add(&c->st_leases_reclaimed,
					 s->l[i].count);
			lease_drop_at(s, i);
		}
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&c->ctl_lock);
}

static int reclaim_task(struct kvfs_cache *c)
{
	kvfs_ctl_reclaim(c);
	return 0;
}

int kvfs_ctl_init(struct kvfs_cache *c)
{
	return kvfs_task_add(c, "lease reclaim", reclaim_task);
}
