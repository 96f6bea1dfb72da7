/* SPDX-License-Identifier: MIT */
/*
 * Chunk-granular reads and the attention-guided chunk cache (ContiguousKV;
 * contracts in cache/chunk.h, the decisions behind them in
 * docs/contiguouskv.md, the files and their order in cache/chunk_i.h).
 *
 * This file sets the cache up and tears it down, forgets deleted blocks,
 * takes the scores engines report, and reports stats; it sits above the
 * other chunk files and none of them calls it.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk_i.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_chunk_score(struct kvfs_cache *c, struct kvfs_block *b, uint32_t chunk,
		     double a)
{
	struct kvfs_chunk_state *st = c->chunks;
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct ckey one;
	struct cscore *s;

	if (!st || !b)
		return -EINVAL;
	kvfs_chunk_key_hex(b, hex);
	if (chunk >= kvfs_chunk_nchunks(b)) {
		kvfs_warn("ns %s: block %s.kv has no chunk %u (%u chunks): "
			  "score refused",
			  b->ns->rec.name, hex, chunk, kvfs_chunk_nchunks(b));
		return -EINVAL;
	}
	if (!isfinite(a) || a < 0) {
		kvfs_warn("ns %s: block %s.kv chunk %u: score %g refused "
			  "(finite, >= 0)",
			  b->ns->rec.name, hex, chunk, a);
		return -EINVAL;
	}
	one = (struct ckey){ .key = b->pn.key, .chunk = chunk };
	kvfs_chunk_scores_ensure(c, &one, 1);
	pthread_mutex_lock(&st->lock);
	s = kvfs_chunk_score_find(st, b->pn.key, chunk);
	if (!s) {
		pthread_mutex_unlock(&st->lock);
		return -ENOMEM;
	}
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		/* kvfs_chunk_forget may have run already: no new score. */
		if (!s->pieces && !s->flights)
			kvfs_chunk_score_remove(st, s);
		pthread_mutex_unlock(&st->lock);
		return 0;
	}
	s->i += a * st->scale;
	if (!isfinite(s->i))
		s->i = DBL_MAX;
	s->dirty = true;
	kvfs_chunk_rescore(st, s);
	pthread_mutex_unlock(&st->lock);
	return 0;
}

/* ------------------------------------------------------------ lifecycle */

int kvfs_chunk_init(struct kvfs_cache *c)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_chunk_state *st;
	char b1[32], b2[32];

	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	pthread_mutex_init(&st->lock, NULL);
	pthread_mutex_init(&st->scratch_lock, NULL);
	pthread_mutex_init(&st->ws_lock, NULL);
	pthread_cond_init(&st->flight_cond, NULL);
	st->cap[CSET_DRAM] = c->conf.chunk_dram;
	st->cap[CSET_GPU] = gpu && c->gops ? c->conf.chunk_gpu : 0;
	if (c->conf.chunk_gpu && !st->cap[CSET_GPU])
		kvfs_warn("[chunks] gpu_capacity is set but there is no "
			  "device tier ([tier.gpu] backend): chunks are "
			  "cached in DRAM only");
	if (gpu && st->cap[CSET_GPU] > gpu->capacity)
		kvfs_warn("[chunks] gpu_capacity exceeds the device pool; "
			  "the pool's free room limits it");
	st->halflife = c->conf.score_halflife;
	st->spec_depth = c->conf.chunk_spec_depth;
	st->scale = 1;
	c->chunks = st;
	kvfs_info("chunk cache: %s in DRAM, %s in the device pool, scores %s",
		  kvfs_util_fmt_size(st->cap[CSET_DRAM], b1, sizeof(b1)),
		  kvfs_util_fmt_size(st->cap[CSET_GPU], b2, sizeof(b2)),
		  st->halflife ? "decay" : "never decay");
	if (kvfs_block_on_delete(c, kvfs_chunk_forget))
		return -ENOSPC;
	return kvfs_task_add(c, "chunk-score flush", kvfs_chunk_flush);
}

void kvfs_chunk_release(struct kvfs_cache *c)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (!st)
		return;
	for (size_t k = 0; k < st->snb; k++) {
		struct cscore *s = st->sb[k], *next;

		for (; s; s = next) {
			next = s->hnext;
			while (s->pieces) {
				struct centry *e = s->pieces;

				s->pieces = e->snext;
				kvfs_chunk_entry_free(c, e);
			}
			free(s);
		}
	}
	free(st->sb);
	for (int k = 0; k < CSET_N; k++)
		free(st->heap[k].v);
	kvfs_chunk_todo_free(st->todo);
	pthread_mutex_destroy(&st->lock);
	pthread_mutex_destroy(&st->scratch_lock);
	pthread_mutex_destroy(&st->ws_lock);
	pthread_cond_destroy(&st->flight_cond);
	kvfs_restore_ws_free(st->ws);
	free(st->scratch);
	free(st);
	c->chunks = NULL;
}

void kvfs_chunk_forget(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_chunk_state *st = c->chunks;
	bool wake = false;
	uint32_t nc;

	if (!st || !b)
		return;
	nc = kvfs_chunk_nchunks(b);
	pthread_mutex_lock(&st->lock);
	for (uint32_t j = 0; j < nc; j++) {
		struct cscore *s = kvfs_chunk_score_find(st, b->pn.key, j);

		if (!s)
			continue;
		while (s->pieces)
			kvfs_chunk_entry_unlink(c, s->pieces);
		/* Loads still reading its pieces will not cache them (the
		 * block is deleted): their waiters read for themselves.
		 */
		while (s->flights)
			wake |= kvfs_chunk_flight_resolve(s->flights);
		kvfs_chunk_score_remove(st, s);
	}
	if (wake)
		pthread_cond_broadcast(&st->flight_cond);
	kvfs_chunk_todo_drop(st, b->pn.key);
	pthread_mutex_unlock(&st->lock);
}

void kvfs_chunk_get_stats(struct kvfs_cache *c, struct kvfs_chunk_stats *o)
{
	struct kvfs_chunk_state *st = c->chunks;

	memset(o, 0, sizeof(*o));
	if (!st)
		return;
	pthread_mutex_lock(&st->lock);
	o->dram_used = st->used[CSET_DRAM];
	o->dram_capacity = st->cap[CSET_DRAM];
	o->dram_pieces = st->heap[CSET_DRAM].n;
	o->gpu_used = st->used[CSET_GPU];
	o->gpu_capacity = st->cap[CSET_GPU];
	o->gpu_pieces = st->heap[CSET_GPU].n;
	pthread_mutex_unlock(&st->lock);
	o->bytes_wanted = atomic_load(&st->bytes_wanted);
	o->bytes_missed = atomic_load(&st->bytes_missed);
	o->bytes_read = atomic_load(&st->bytes_read);
	o->ssd_reads = atomic_load(&st->ssd_reads);
	o->mem_hits = atomic_load(&st->mem_hits);
	o->spec_loaded = atomic_load(&st->spec_loaded);
	o->spec_used = atomic_load(&st->spec_used);
	o->evictions = atomic_load(&st->evictions);
	o->demotions = atomic_load(&st->demotions);
	o->prefetch_joined = atomic_load(&st->prefetch_joined);
	o->spec_cancelled = atomic_load(&st->spec_cancelled);
}

void kvfs_chunk_set_hook(struct kvfs_cache *c, kvfs_chunk_hook *fn, void *arg)
{
	struct kvfs_chunk_state *st = c->chunks;

	if (!st)
		return;
	st->hook = fn;
	st->hook_arg = arg;
}
