/* SPDX-License-Identifier: MIT */
/*
 * The chunk cache in LMDB: scores, loaded lazily on a chunk's first touch
 * and written back in batches (kvfs_chunk_flush), and the CRC tables a
 * fallback read computed for blocks stored without them, written with the
 * next flush.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk_i.h"
#include "meta/log.h"

/* ---------------------------------------------------- lazy score loads */

static int kc_cmp(const void *a, const void *b)
{
	const struct ckey *x = a, *y = b;
	int d = memcmp(x->key, y->key, KVFS_KEY_LEN);

	if (d)
		return d;
	return (x->chunk > y->chunk) - (x->chunk < y->chunk);
}

/*
 * Make sure each (key, chunk) of @v has its score in the table: on first
 * touch it is read from LMDB (one read-only transaction for all), or
 * starts at zero. Reorders @v.
 */
void kvfs_chunk_scores_ensure(struct kvfs_cache *c, struct ckey *v, size_t n)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_meta_txn *t = NULL;
	size_t m = 0, u = 0;
	int rc;

	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++)
		if (!kvfs_chunk_score_find(st, v[i].key, v[i].chunk))
			v[m++] = v[i];
	pthread_mutex_unlock(&st->lock);
	if (!m)
		return;
	qsort(v, m, sizeof(*v), kc_cmp);
	for (size_t i = 0; i < m; i++)
		if (!u || kc_cmp(&v[u - 1], &v[i]))
			v[u++] = v[i];

	rc = kvfs_meta_txn_begin(c->store->meta, true, &t);
	if (rc)
		kvfs_warn("chunk cache: reading stored scores failed (%s): "
			  "%zu chunks start from zero",
			  strerror(-rc), u);
	for (size_t i = 0; i < u; i++) {
		v[i].i = 0;
		v[i].f = 0;
		v[i].dirty = false;
		if (!t)
			continue;
		rc = kvfs_meta_score_get(t, v[i].key, v[i].chunk, &v[i].i,
					 &v[i].f);
		if (rc && rc != -ENOENT)
			v[i].dirty = true; /* damaged (logged): rewrite it */
		if (rc) {
			v[i].i = 0;
			v[i].f = 0;
		}
	}
	kvfs_meta_txn_abort(t);

	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < u; i++)
		if (!kvfs_chunk_score_find(st, v[i].key, v[i].chunk))
			kvfs_chunk_score_add(st, v[i].key, v[i].chunk,
					     v[i].i * st->scale, v[i].f,
					     v[i].dirty);
	pthread_mutex_unlock(&st->lock);
}

int kvfs_chunk_get_score(struct kvfs_cache *c, struct kvfs_block *b,
			 uint32_t chunk, double *i, uint64_t *f, double *s)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_meta_txn *t;
	struct cscore *x;
	double vi = 0;
	uint64_t vf = 0;
	int rc;

	if (!st || !b || chunk >= kvfs_chunk_nchunks(b))
		return -EINVAL;
	pthread_mutex_lock(&st->lock);
	x = kvfs_chunk_score_find(st, b->pn.key, chunk);
	if (x) {
		vi = x->i / st->scale;
		vf = x->f;
	}
	pthread_mutex_unlock(&st->lock);
	if (!x) {
		rc = kvfs_meta_txn_begin(c->store->meta, true, &t);
		if (rc)
			return rc;
		rc = kvfs_meta_score_get(t, b->pn.key, chunk, &vi, &vf);
		kvfs_meta_txn_abort(t);
		if (rc)
			return rc;
	}
	if (i)
		*i = vi;
	if (f)
		*f = vf;
	if (s)
		*s = vi * (double)vf;
	return 0;
}

/* ------------------------------------------------- pending CRC tables */

struct ccrc_todo *kvfs_chunk_todo_new(const uint8_t *key, size_t n)
{
	struct ccrc_todo *td = calloc(1, sizeof(*td));

	if (!td || !(td->crc = malloc(n * sizeof(*td->crc)))) {
		free(td);
		return NULL;
	}
	memcpy(td->key, key, KVFS_KEY_LEN);
	td->n = n;
	return td;
}

void kvfs_chunk_todo_push(struct kvfs_chunk_state *st, struct ccrc_todo *td)
{
	pthread_mutex_lock(&st->lock);
	td->next = st->todo;
	st->todo = td;
	pthread_mutex_unlock(&st->lock);
}

/* Caller holds st->lock. */
void kvfs_chunk_todo_drop(struct kvfs_chunk_state *st, const uint8_t *key)
{
	for (struct ccrc_todo **pp = &st->todo; *pp;) {
		struct ccrc_todo *x = *pp;

		if (memcmp(x->key, key, KVFS_KEY_LEN)) {
			pp = &x->next;
			continue;
		}
		*pp = x->next;
		free(x->crc);
		free(x);
	}
}

/* ---------------------------------------------------------------- flush */

enum frec_state {
	FR_UNWRITTEN = 0, /* the block has no record (yet, or any more) */
	FR_WRITTEN,
	FR_GONE, /* ... and it is not in the index: deleted */
};

struct frec {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t chunk;
	double i;
	uint64_t f;
	int state; /* enum frec_state */
};

void kvfs_chunk_todo_free(struct ccrc_todo *td)
{
	while (td) {
		struct ccrc_todo *next = td->next;

		free(td->crc);
		free(td);
		td = next;
	}
}

/*
 * Settle the scores a flush did not write. If the transaction failed, all
 * are dirty again. A score whose block has no record stays dirty while
 * the block is indexed (its write-back is still to come) and is dropped
 * when the block is gone. Index lookups take shard locks, so they happen
 * before st->lock.
 */
static void flush_settle(struct kvfs_cache *c, struct frec *v, size_t n,
			 bool failed)
{
	struct kvfs_chunk_state *st = c->chunks;

	for (size_t k = 0; k < n && !failed; k++) {
		struct kvfs_block *b;

		if (v[k].state != FR_UNWRITTEN)
			continue;
		b = kvfs_index_find_key(c, v[k].key);
		if (!b)
			v[k].state = FR_GONE;
		kvfs_cache_put(c, b);
	}
	pthread_mutex_lock(&st->lock);
	for (size_t k = 0; k < n; k++) {
		struct cscore *s =
			kvfs_chunk_score_find(st, v[k].key, v[k].chunk);

		if (!s)
			continue;
		if (failed || v[k].state == FR_UNWRITTEN)
			s->dirty = true;
		else if (v[k].state == FR_GONE && !s->dirty && !s->pieces &&
			 !s->flights)
			kvfs_chunk_score_remove(st, s);
	}
	pthread_mutex_unlock(&st->lock);
}

/*
 * Caller holds st->lock. A score is written when it changed, and, with
 * decay on, once per half-life even if it did not: the stored I is then
 * never more than twice the decayed one, at one write per score per
 * half-life.
 */
static bool flush_due(const struct kvfs_chunk_state *st, const struct cscore *s)
{
	return s->dirty ||
	       (st->halflife && st->tick_total - s->wtick >= st->halflife);
}

int kvfs_chunk_flush(struct kvfs_cache *c)
{
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_meta_txn *t = NULL;
	struct ccrc_todo *td;
	struct frec *v = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;

	if (!st)
		return 0;
	pthread_mutex_lock(&c->meta_lock);
	pthread_mutex_lock(&st->lock);
	for (size_t k = 0; k < st->snb; k++)
		for (struct cscore *s = st->sb[k]; s; s = s->hnext)
			cap += flush_due(st, s);
	v = cap ? calloc(cap, sizeof(*v)) : NULL;
	for (size_t k = 0; v && k < st->snb; k++)
		for (struct cscore *s = st->sb[k]; s; s = s->hnext) {
			if (!flush_due(st, s))
				continue;
			memcpy(v[n].key, s->key, KVFS_KEY_LEN);
			v[n].chunk = s->chunk;
			v[n].i = s->i / st->scale;
			v[n].f = s->f;
			s->dirty = false;
			s->wtick = st->tick_total;
			n++;
		}
	td = st->todo;
	st->todo = NULL;
	pthread_mutex_unlock(&st->lock);
	if (cap && !v) {
		pthread_mutex_unlock(&c->meta_lock);
		if (td) {
			struct ccrc_todo *x = td;

			pthread_mutex_lock(&st->lock);
			while (x->next)
				x = x->next;
			x->next = st->todo;
			st->todo = td;
			pthread_mutex_unlock(&st->lock);
		}
		return -ENOMEM;
	}
	if (!n && !td) {
		pthread_mutex_unlock(&c->meta_lock);
		return 0;
	}
	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	for (size_t k = 0; k < n && !rc; k++) {
		struct kvfs_meta_blk r;

		/* A block deleted meanwhile lost its scores in the delete's
		 * transaction: never write them back.
		 */
		if (kvfs_meta_blk_get(t, v[k].key, &r))
			continue;
		rc = kvfs_meta_score_put(t, v[k].key, v[k].chunk, v[k].i,
					 v[k].f);
		if (!rc)
			v[k].state = FR_WRITTEN;
	}
	for (struct ccrc_todo *x = td; x && !rc; x = x->next) {
		struct kvfs_meta_blk r;

		if (!kvfs_meta_blk_get(t, x->key, &r))
			rc = kvfs_meta_ccrc_put(t, x->key, x->crc, x->n);
	}
	if (rc)
		kvfs_meta_txn_abort(t);
	else
		rc = kvfs_meta_txn_commit(t);
	pthread_mutex_unlock(&c->meta_lock);
	if (rc)
		kvfs_warn("recording %zu chunk scores failed: %s", n,
			  strerror(-rc));
	flush_settle(c, v, n, rc != 0);
	kvfs_chunk_todo_free(td);
	free(v);
	return rc;
}
