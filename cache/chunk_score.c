/* SPDX-License-Identifier: MIT */
/*
 * The chunk cache's score table and its decay (paper 004 §4.4).
 *
 * Scores live per (block key, chunk) in a hash table guarded by st->lock;
 * the pieces cached of a chunk hang off its score (chunk_resident.c).
 *
 * Decay without touching every score: I is stored multiplied by
 * scale = 2^(ticks / H). A tick grows the scale, which shrinks every real
 * I = i / scale at once and leaves the heaps' order alone (all S scale
 * alike). When the scale reaches 2^64 every stored i is divided by 2^64,
 * exactly (a power of two), so the order still holds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk_i.h"

/* Renormalise the decay scale at 2^RENORM_EXP. */
#define RENORM_EXP 64

static size_t score_hash(const uint8_t *key, uint32_t chunk)
{
	uint64_t h;

	/* Keys are SHA-256 output: any 8 bytes are already uniform. */
	memcpy(&h, key, sizeof(h));
	return (size_t)(h ^ ((uint64_t)chunk * 0x9e3779b97f4a7c15ull));
}

/* Caller holds st->lock. */
struct cscore *kvfs_chunk_score_find(struct kvfs_chunk_state *st,
				     const uint8_t *key, uint32_t chunk)
{
	struct cscore *s;

	if (!st->snb)
		return NULL;
	s = st->sb[score_hash(key, chunk) & (st->snb - 1)];
	while (s && (s->chunk != chunk || memcmp(s->key, key, KVFS_KEY_LEN)))
		s = s->hnext;
	return s;
}

/* Caller holds st->lock. NULL on ENOMEM (the chunk then goes unscored). */
struct cscore *kvfs_chunk_score_add(struct kvfs_chunk_state *st,
				    const uint8_t *key, uint32_t chunk,
				    double i, uint64_t f, bool dirty)
{
	struct cscore *s;
	size_t j;

	if (st->sn + 1 > st->snb) {
		size_t nb = st->snb ? st->snb * 2 : 1024;
		struct cscore **v = calloc(nb, sizeof(*v));

		if (!v)
			return NULL;
		for (size_t b = 0; b < st->snb; b++) {
			struct cscore *x = st->sb[b], *next;

			for (; x; x = next) {
				next = x->hnext;
				j = score_hash(x->key, x->chunk) & (nb - 1);
				x->hnext = v[j];
				v[j] = x;
			}
		}
		free(st->sb);
		st->sb = v;
		st->snb = nb;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	memcpy(s->key, key, KVFS_KEY_LEN);
	s->chunk = chunk;
	s->i = i;
	s->f = f;
	s->dirty = dirty;
	s->wtick = st->tick_total;
	j = score_hash(key, chunk) & (st->snb - 1);
	s->hnext = st->sb[j];
	st->sb[j] = s;
	st->sn++;
	return s;
}

/* Caller holds st->lock; @s has no pieces left. */
void kvfs_chunk_score_remove(struct kvfs_chunk_state *st, struct cscore *s)
{
	struct cscore **pp =
		&st->sb[score_hash(s->key, s->chunk) & (st->snb - 1)];

	while (*pp && *pp != s)
		pp = &(*pp)->hnext;
	if (*pp) {
		*pp = s->hnext;
		st->sn--;
	}
	free(s);
}

void kvfs_chunk_tick(struct kvfs_cache *c)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (!st || !st->halflife)
		return;
	pthread_mutex_lock(&st->lock);
	st->tick_total++;
	if (++st->ticks >= (uint64_t)RENORM_EXP * st->halflife) {
		/* Dividing every i by the same power of two is exact, so the
		 * heaps stay ordered.
		 */
		for (size_t k = 0; k < st->snb; k++)
			for (struct cscore *s = st->sb[k]; s; s = s->hnext)
				s->i = ldexp(s->i, -RENORM_EXP);
		st->ticks -= (uint64_t)RENORM_EXP * st->halflife;
	}
	st->scale = exp2((double)st->ticks / st->halflife);
	pthread_mutex_unlock(&st->lock);
}
