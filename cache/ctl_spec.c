/* SPDX-License-Identifier: MIT */
/*
 * Inter-period prefetch for FETCH_CHUNKS (F_SPECULATE): while the engine
 * computes one period of layers, a background thread loads the same
 * chunks of the next period into the chunk cache, until the session's
 * next real request calls it off through the session's token.
 */
#include <pthread.h>
#include <stdlib.h>

#include "cache/chunk.h"
#include "cache/ctl_i.h"

static void spec_token_put(struct kvfs_ctl_spec_token *t)
{
	if (t && atomic_fetch_sub(&t->refs, 1) == 1)
		free(t);
}

/* The session's token, with a reference for a new load; NULL without
 * memory (that load then runs to its end).
 */
static struct kvfs_ctl_spec_token *spec_token_get(struct kvfs_ctl_session *s)
{
	struct kvfs_ctl_spec_token *t;

	pthread_mutex_lock(&s->lock);
	if (!s->spec && (s->spec = calloc(1, sizeof(*s->spec))))
		atomic_init(&s->spec->refs, 1);
	t = s->spec;
	if (t)
		atomic_fetch_add(&t->refs, 1);
	pthread_mutex_unlock(&s->lock);
	return t;
}

void kvfs_ctl_spec_cancel(struct kvfs_ctl_session *s)
{
	struct kvfs_ctl_spec_token *t;

	pthread_mutex_lock(&s->lock);
	t = s->spec;
	s->spec = NULL;
	pthread_mutex_unlock(&s->lock);
	if (!t)
		return;
	atomic_store(&t->cancel, 1);
	spec_token_put(t);
}

struct spec_job {
	struct kvfs_cache *c;
	struct kvfs_block **v;
	size_t nv;
	struct kvfs_chunk_piece *p;
	size_t n;
	/* A reference; NULL: cannot be called off. */
	struct kvfs_ctl_spec_token *tok;
};

static void *spec_main(void *arg)
{
	struct spec_job *j = arg;
	struct kvfs_chunk_result res;

	/* One superseded before it began has nothing to load. */
	if (!j->tok)
		kvfs_chunk_read(j->c, j->p, j->n, KVFS_CHUNK_SPECULATIVE, &res);
	else if (!atomic_load(&j->tok->cancel))
		kvfs_chunk_speculate(j->c, j->p, j->n, &j->tok->cancel, &res);
	spec_token_put(j->tok);
	kvfs_ctl_put_all(j->c, j->v, j->nv);
	kvfs_bg_end(j->c);
	free(j->v);
	free(j->p);
	free(j);
	return NULL;
}

void kvfs_ctl_speculate(struct kvfs_ctl_ctx *x, struct kvfs_block **v,
			const size_t *bi, const uint32_t *local)
{
	uint32_t first = x->r->layer_first + x->r->n_layers;
	uint32_t nl = x->r->n_layers, layers = x->ns->geom.n_layers;
	struct spec_job *j;
	pthread_attr_t at;
	pthread_t t;

	if (first >= layers)
		return; /* the last period: nothing follows */
	if (first + nl > layers)
		nl = layers - first; /* a remainder period */
	j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->c = x->c;
	j->n = (size_t)nl * x->r->n_chunks;
	j->p = calloc(j->n, sizeof(*j->p));
	j->v = calloc(x->nk, sizeof(*j->v));
	if (!j->p || !j->v)
		goto out_free;
	for (size_t i = 0; i < x->nk; i++) {
		kvfs_block_get_ref(v[i]);
		j->v[j->nv++] = v[i];
	}
	for (uint32_t l = 0; l < nl; l++)
		for (uint32_t k = 0; k < x->r->n_chunks; k++) {
			struct kvfs_chunk_piece *pc =
				&j->p[(size_t)l * x->r->n_chunks + k];

			pc->b = v[bi[k]];
			pc->layer = first + l;
			pc->chunk = local[k];
		}
	j->tok = spec_token_get(x->s);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	kvfs_bg_begin(x->c);
	if (pthread_create(&t, &at, spec_main, j) == 0) {
		pthread_attr_destroy(&at);
		return;
	}
	kvfs_bg_end(x->c);
	pthread_attr_destroy(&at);
	spec_token_put(j->tok);
	kvfs_ctl_put_all(x->c, j->v, j->nv);
out_free:
	free(j->p);
	free(j->v);
	free(j);
}
