/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's in-process store (tier/remote_i.h): a chained hash
 * map of key -> value behind one mutex.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tier/remote_i.h"

#define NBUCKETS 1024

struct mem_ent {
	struct mem_ent *next;
	char *key;
	size_t klen;
	void *val;
	size_t vlen;
};

struct kvfs_remote_mem {
	pthread_mutex_t lock;
	struct mem_ent *bucket[NBUCKETS]; /* guarded by lock */
	size_t count; /* guarded by lock */
	int fault; /* guarded by lock */
};

int kvfs_remote_mem_new(struct kvfs_remote_mem **out)
{
	struct kvfs_remote_mem *m = calloc(1, sizeof(*m));

	*out = m;
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->lock, NULL);
	return 0;
}

void kvfs_remote_mem_free(struct kvfs_remote_mem *m)
{
	if (!m)
		return;
	for (size_t b = 0; b < NBUCKETS; b++) {
		struct mem_ent *e = m->bucket[b], *nx;

		for (; e; e = nx) {
			nx = e->next;
			free(e->key);
			free(e->val);
			free(e);
		}
	}
	pthread_mutex_destroy(&m->lock);
	free(m);
}

/* The link that points at @key's entry (or at the chain's NULL end). */
static struct mem_ent **mem_find(struct kvfs_remote_mem *m, const char *key,
				 size_t klen)
{
	struct mem_ent **pp = &m->bucket[kvfs_rc_crc16(key, klen) % NBUCKETS];

	while (*pp && ((*pp)->klen != klen || memcmp((*pp)->key, key, klen)))
		pp = &(*pp)->next;
	return pp;
}

static int mem_set(struct kvfs_remote_mem *m, struct mem_ent **pp,
		   const struct kvfs_rc_cmd *c)
{
	void *v = malloc(c->vlen ? c->vlen : 1);
	struct mem_ent *e = *pp;

	if (!v)
		return -ENOMEM;
	memcpy(v, c->val, c->vlen);
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e || !(e->key = malloc(c->klen))) {
			free(e);
			free(v);
			return -ENOMEM;
		}
		memcpy(e->key, c->key, c->klen);
		e->klen = c->klen;
		*pp = e;
		m->count++;
	}
	free(e->val);
	e->val = v;
	e->vlen = c->vlen;
	return 0;
}

static int mem_one(struct kvfs_remote_mem *m, struct kvfs_rc_cmd *c)
{
	struct mem_ent **pp = mem_find(m, c->key, c->klen), *e = *pp;

	switch (c->op) {
	case KVFS_RC_GET:
		if (!e)
			return -ENOENT;
		c->data = malloc(e->vlen ? e->vlen : 1);
		if (!c->data)
			return -ENOMEM;
		memcpy(c->data, e->val, e->vlen);
		c->len = e->vlen;
		return 0;
	case KVFS_RC_SETNX:
		if (e)
			return -EEXIST;
		return mem_set(m, pp, c);
	case KVFS_RC_SET:
		return mem_set(m, pp, c);
	case KVFS_RC_DEL:
		if (!e)
			return -ENOENT;
		*pp = e->next;
		free(e->key);
		free(e->val);
		free(e);
		m->count--;
		return 0;
	case KVFS_RC_EXISTS:
		return e ? 0 : -ENOENT;
	}
	return -EINVAL;
}

int kvfs_remote_mem_exec(struct kvfs_remote_mem *m, struct kvfs_rc_cmd *cmd,
			 size_t n)
{
	int ret = 0;

	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < n; i++) {
		cmd[i].data = NULL;
		cmd[i].len = 0;
		cmd[i].res = m->fault ? m->fault : mem_one(m, &cmd[i]);
		if (m->fault && !ret)
			ret = m->fault;
	}
	pthread_mutex_unlock(&m->lock);
	return ret;
}

void kvfs_remote_mem_fault(struct kvfs_remote_mem *m, int err)
{
	pthread_mutex_lock(&m->lock);
	m->fault = err;
	pthread_mutex_unlock(&m->lock);
}

size_t kvfs_remote_mem_count(struct kvfs_remote_mem *m)
{
	size_t n;

	pthread_mutex_lock(&m->lock);
	n = m->count;
	pthread_mutex_unlock(&m->lock);
	return n;
}
