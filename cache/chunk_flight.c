/* SPDX-License-Identifier: MIT */
/*
 * Joins: in-flight speculative reads that requests can join.
 *
 * A piece a speculative load is reading has a flight (struct cflight) on
 * its chunk's score from the moment the load decides to read it until
 * that read has been checked and offered to the cache. A request that
 * misses the cache on such a piece puts itself on the flight's waiter
 * list instead of reading the piece again; resolving the flight (read
 * done, failed, or the block forgotten) moves each waiter onto its
 * request's ready list and wakes st->flight_cond. The request then takes
 * the piece from the cache like a hit, or reads it itself if it is not
 * there. Only speculative loads own flights and only other requests wait,
 * and a load resolves every flight it owns before it returns, so a wait
 * always ends.
 *
 * Cancels: a speculative load started by kvfs_chunk_speculate() asks,
 * under st->lock, before issuing each read (chunk_ssd.c) whether it has
 * been called off. If so the read is never issued and its flights are
 * resolved there and then; if not they are marked issued. A request looks
 * under the same lock and does not join a flight that is neither issued
 * nor of a live load (flight_dead): it reads that piece with its own,
 * without waiting.
 */
#include <stdlib.h>

#include "cache/chunk_i.h"

/*
 * Caller holds st->lock. Whether @f's read will never happen: its load
 * was called off before the read was issued. That cannot change any more
 * (read_issue in chunk_ssd.c decides under the same lock, and a flag once
 * set stays set), and the load resolves it without reading, so nobody
 * waits for it.
 */
static bool flight_dead(const struct cflight *f)
{
	return f->cancel && !f->issued && atomic_load(f->cancel);
}

/* Caller holds st->lock. The live flight of (@s, @layer), or NULL. */
struct cflight *kvfs_chunk_flight_find(struct cscore *s, uint32_t layer)
{
	for (struct cflight *f = s ? s->flights : NULL; f; f = f->next)
		if (f->layer == layer && !flight_dead(f))
			return f;
	return NULL;
}

/* Caller holds st->lock. A new flight on @s of a load @cancel may call
 * off; NULL on ENOMEM (nobody can join that read then).
 */
struct cflight *kvfs_chunk_flight_new(struct cscore *s, uint32_t layer,
				      const atomic_int *cancel)
{
	struct cflight *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->sc = s;
	f->layer = layer;
	f->cancel = cancel;
	f->next = s->flights;
	s->flights = f;
	return f;
}

/*
 * Caller holds st->lock. The load's read of @f is over: whatever it
 * brought is in the cache now, or never will be. Unlink it and hand each
 * waiter to its request's ready list. Idempotent. Whether anyone waited:
 * the caller then broadcasts st->flight_cond.
 */
bool kvfs_chunk_flight_resolve(struct cflight *f)
{
	struct cflight **pp;
	bool woke = f->waiters != NULL;

	if (!f->sc)
		return false;
	for (pp = &f->sc->flights; *pp && *pp != f; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = f->next;
	f->sc = NULL;
	while (f->waiters) {
		struct cpw *w = f->waiters;
		struct cjoin *j = w->jn;
		size_t k = atomic_load(&j->nready);

		f->waiters = w->wnext;
		w->wnext = NULL;
		w->fl = NULL;
		j->ready[k] = (size_t)(w - j->pw);
		atomic_store(&j->nready, k + 1);
	}
	return woke;
}

/* Caller holds st->lock. Piece @w stops waiting (a block's own copy
 * served it, or the request gives up). If its flight resolved already it
 * is on the ready list, where it is skipped.
 */
void kvfs_chunk_join_leave(struct cjoin *j, struct cpw *w)
{
	struct cpw **pp;

	if (!w->fl)
		return;
	for (pp = &w->fl->waiters; *pp && *pp != w; pp = &(*pp)->wnext)
		;
	if (*pp)
		*pp = w->wnext;
	w->fl = NULL;
	w->wnext = NULL;
	j->waiting--;
}

/*
 * Resolve the flights that the pieces @idx[0..@n) (all of 0..@n with @idx
 * NULL) of a speculative load own, and with @drop free them: the load is
 * done with them.
 */
void kvfs_chunk_flights_settle(struct kvfs_chunk_state *st, struct cpw *pw,
			       const size_t *idx, size_t n, bool drop)
{
	bool any = false, wake = false;

	for (size_t k = 0; k < n && !any; k++)
		any = pw[idx ? idx[k] : k].fl_own;
	if (!any)
		return;
	pthread_mutex_lock(&st->lock);
	for (size_t k = 0; k < n; k++) {
		struct cpw *w = &pw[idx ? idx[k] : k];

		if (!w->fl_own)
			continue;
		wake |= kvfs_chunk_flight_resolve(w->fl);
		if (drop) {
			free(w->fl);
			w->fl = NULL;
			w->fl_own = false;
		}
	}
	pthread_mutex_unlock(&st->lock);
	if (wake)
		pthread_cond_broadcast(&st->flight_cond);
}

/*
 * Deliver the joined pieces whose loads are done: from the chunk cache,
 * where the load put them verified, exactly like a hit (pinned under the
 * lock, copied without it). One that is not there (the load failed, or
 * the cache did not keep the piece) is marked for a read of its own.
 * With @wait, until every join is handled; otherwise only those ready now
 * (called between the request's own reads, without blocking).
 */
void kvfs_chunk_join_take(struct cjoin *j, bool wait)
{
	struct kvfs_cache *c = j->c;
	struct kvfs_chunk_state *st = c->chunks;
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];

	while (j->taken < j->waiting) {
		size_t from, to;

		if (!wait && atomic_load(&j->nready) == j->taken)
			return;
		pthread_mutex_lock(&st->lock);
		while (atomic_load(&j->nready) == j->taken &&
		       j->taken < j->waiting)
			pthread_cond_wait(&st->flight_cond, &st->lock);
		from = j->taken;
		to = atomic_load(&j->nready);
		for (size_t k = from; k < to; k++) {
			size_t i = j->ready[k];
			struct kvfs_chunk_piece *p = &j->p[i];
			struct cpw *w = &j->pw[i];
			struct centry *e;

			if (!w->todo)
				continue;
			e = kvfs_chunk_piece_find(
				kvfs_chunk_score_find(st, p->b->pn.key,
						      p->chunk),
				p->layer, true);
			if (!e) {
				w->refetch = true;
				continue;
			}
			e->pins++;
			w->e = e;
			kvfs_chunk_entry_touch(st, e);
			if (e->spec) {
				e->spec = false;
				p->spec = 1;
				atomic_fetch_add(&st->spec_used, 1);
			}
		}
		j->taken = to;
		pthread_mutex_unlock(&st->lock);

		for (size_t k = from; k < to; k++) {
			size_t i = j->ready[k];
			struct kvfs_chunk_piece *p = &j->p[i];
			struct cpw *w = &j->pw[i];
			struct centry *e = w->e;
			int rc;

			if (!e)
				continue;
			/* host and ext never change once a piece is ready. */
			if (e->host)
				rc = kvfs_chunk_copy_out(p->dst, e->host,
							 e->len, j->client);
			else
				rc = kvfs_chunk_pool_out(gpu, &e->ext, 0,
							 p->dst, e->len,
							 j->client);
			if (rc) {
				w->refetch = true;
				continue;
			}
			p->from = KVFS_CHUNK_FROM_CACHE;
			w->todo = false;
			j->res->joined++;
			atomic_fetch_add(&st->prefetch_joined, 1);
			if (j->cb)
				j->cb(j->arg, i);
		}
		pthread_mutex_lock(&st->lock);
		for (size_t k = from; k < to; k++) {
			struct cpw *w = &j->pw[j->ready[k]];

			if (w->e)
				kvfs_chunk_entry_put(c, w->e);
			w->e = NULL;
		}
		pthread_mutex_unlock(&st->lock);
		if (!wait)
			return;
	}
}
