/* SPDX-License-Identifier: MIT */
/*
 * The chunk operations (ContiguousKV, docs/contiguouskv.md): FETCH_CHUNKS
 * delivers chosen chunks of chosen layers into the caller's memory or a
 * pool region, layer by layer; SCORES feeds the chunk cache's attention
 * scores.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk.h"
#include "cache/ctl_i.h"
#include "meta/fmt.h"

/* Map prefix-global chunk @j over blocks @v to (block, local chunk). */
static int chunk_locate(struct kvfs_ctl_ctx *x, struct kvfs_block **v,
			uint32_t j, size_t *bi, uint32_t *local)
{
	uint32_t c = x->ns->geom.chunk_tokens;

	for (size_t i = 0; i < x->nk; i++) {
		uint32_t n = (v[i]->n_tokens + c - 1) / c;

		if (j < n) {
			*bi = i;
			*local = j;
			return 0;
		}
		j -= n;
	}
	return -EINVAL;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Per-layer completion of a FETCH_CHUNKS batch delivered in place. */
struct layer_progress {
	struct kvfs_ctl_sync_word *sw;
	uint32_t *got; /* pieces delivered, per layer of the batch */
	uint32_t nc; /* pieces per layer */
	uint32_t l0; /* the batch's first layer, request-relative */
	uint32_t nl; /* layers in the batch */
	uint32_t next; /* layers of the batch signalled so far */
};

/* kvfs_chunk_cb: piece @i (layer-major, nc a layer) is in place. Layers
 * are signalled in order, each once all of it and all before it are.
 */
static void layer_got(void *arg, size_t i)
{
	struct layer_progress *lp = arg;

	lp->got[i / lp->nc]++;
	while (lp->next < lp->nl && lp->got[lp->next] == lp->nc)
		kvfs_ctl_sync_signal(lp->sw, lp->l0 + ++lp->next);
}

int kvfs_ctl_fetch_chunks(struct kvfs_ctl_ctx *x)
{
	const struct kvfs_ctl_req *r = x->r;
	const struct kvfs_geom *g = &x->ns->geom;
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	const struct kvfs_gpu_ops *go = x->c->gops;
	struct kvfs_gpu_peer *peer = NULL;
	struct kvfs_extent region = { 0 };
	struct kvfs_chunk_piece *pc = NULL;
	struct kvfs_gpu_xfer *xf = NULL;
	struct kvfs_block **v = NULL;
	struct kvfs_ctl_sync_word sw = { 0 };
	struct layer_progress lp = { 0 };
	bool peer_kept = false;
	uint32_t *sorted = NULL, *local = NULL;
	size_t *bi = NULL;
	uint8_t *stage = NULL, *direct = NULL;
	bool own_stage = true;
	uint64_t cb = 0, lo, total, region_off = 0;
	uint32_t sp, nc = r->n_chunks;
	bool pool = r->flags & KVFS_CTL_F_POOL;
	int rc = 0;

	if (kvfs_ctl_need_gpu(x))
		return 0;
	if (r->layer_first >= g->n_layers ||
	    r->n_layers > g->n_layers - r->layer_first)
		return kvfs_ctl_fail(x, -EINVAL, "layers %u..%u outside 0..%u",
				     r->layer_first,
				     r->layer_first + r->n_layers, g->n_layers);
	if (kvfs_fmt_chunk_range(g, g->block_tokens, 0, 0, &lo, &cb) || !cb)
		return kvfs_ctl_fail(x, -EINVAL, "%s",
				     "no chunk layout for the "
				     "namespace");
	if ((uint64_t)r->n_layers * nc * cb > (64ull << 30))
		return kvfs_ctl_fail(x, -E2BIG, "%s",
				     "request larger than 64 GiB");
	v = calloc(x->nk, sizeof(*v));
	bi = calloc(nc, sizeof(*bi));
	local = calloc(nc, sizeof(*local));
	sorted = calloc(nc, sizeof(*sorted));
	if (!v || !bi || !local || !sorted) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* Duplicate indices would deliver one chunk twice: refused. */
	memcpy(sorted, x->chunks, nc * sizeof(*sorted));
	qsort(sorted, nc, sizeof(*sorted), cmp_u32);
	for (uint32_t k = 1; k < nc; k++)
		if (sorted[k] == sorted[k - 1]) {
			kvfs_ctl_fail(x, -EINVAL, "chunk %u requested twice",
				      sorted[k]);
			goto out_free;
		}
	rc = kvfs_ctl_find_all(x, v);
	if (rc || x->resp->error)
		goto out_free;
	for (uint32_t k = 0; k < nc; k++)
		if (chunk_locate(x, v, x->chunks[k], &bi[k], &local[k])) {
			kvfs_ctl_fail(x, -EINVAL,
				      "chunk %u is past the prefix's last "
				      "token",
				      x->chunks[k]);
			goto out_put;
		}
	/* This request supersedes what the session guessed it would be. */
	kvfs_ctl_spec_cancel(x->s);
	total = (uint64_t)r->n_layers * nc * cb;
	sp = r->sub_period && r->sub_period < r->n_layers ? r->sub_period :
							    r->n_layers;
	if (pool) {
		/* In the namespace's owner's pool, the one it may map. */
		rc = go->alloc_owner(gpu, x->ns->owner, total, &region);
		if (rc) {
			kvfs_ctl_fail(x, -ENOSPC, "%s",
				      "no room in the device pool for "
				      "the chunks");
			rc = 0;
			goto out_put;
		}
	} else {
		rc = kvfs_ctl_peer_get(x, &r->peer, &peer, &peer_kept);
		if (rc) {
			kvfs_ctl_fail(x, rc, "%s",
				      "cannot open the caller's memory");
			rc = 0;
			goto out_put;
		}
		if (x->dst[0].off > go->peer_size(peer) ||
		    total > go->peer_size(peer) - x->dst[0].off) {
			kvfs_ctl_fail(x, -EINVAL, "%s",
				      "the chunks do not fit in the "
				      "caller's memory at that offset");
			goto out_peer;
		}
	}
	if (r->sync.shm_name[0] && kvfs_ctl_sync_open(x, &sw))
		goto out_region;
	/*
	 * Where the destination is host memory (the shm backend's pool, or
	 * a client's shm), chunks go straight there: O_DIRECT reads land in
	 * it with no copy. Otherwise (cuda) they are staged in host memory
	 * and copied up, one copy per layer.
	 */
	direct = pool ? gpu->ops->map(gpu, &region) :
			(go->peer_map ? go->peer_map(gpu, peer) : NULL);
	if (direct && !pool)
		direct += x->dst[0].off;
	size_t need = direct ? 0 : (size_t)sp * nc * cb;

	if (!direct)
		stage = kvfs_ctl_stage_get(x, need, &own_stage);
	/* Straight into host memory, the whole request is one batch,
	 * issued layer by layer, each layer signalled once it is all there.
	 * Staged, a batch is a sub-period (the stage holds one).
	 */
	if (direct)
		sp = r->n_layers;
	pc = calloc((size_t)sp * nc, sizeof(*pc));
	xf = calloc(nc, sizeof(*xf));
	lp.got = direct ? calloc(sp, sizeof(*lp.got)) : NULL;
	lp.sw = &sw;
	lp.nc = nc;
	if ((!stage && !direct) || !pc || !xf || (direct && !lp.got)) {
		rc = -ENOMEM;
		goto out_sync;
	}
	if (sw.w)
		kvfs_ctl_sync_signal(&sw, 0);
	/* One I/O batch per sub-period of layers; each layer is signalled
	 * as soon as it has been delivered.
	 */
	for (uint32_t l0 = 0; l0 < r->n_layers; l0 += sp) {
		uint32_t nl = r->n_layers - l0 < sp ? r->n_layers - l0 : sp;
		struct kvfs_chunk_result res = { 0 };

		for (uint32_t l = 0; l < nl; l++)
			for (uint32_t k = 0; k < nc; k++) {
				struct kvfs_chunk_piece *q =
					&pc[(size_t)l * nc + k];

				memset(q, 0, sizeof(*q));
				q->b = v[bi[k]];
				q->layer = r->layer_first + l0 + l;
				q->chunk = local[k];
				q->dst = direct ? direct + ((uint64_t)(l0 + l) *
								    nc +
							    k) * cb :
						  stage + ((size_t)l * nc + k) *
								  cb;
			}
		lp.l0 = l0;
		lp.nl = nl;
		lp.next = 0;
		rc = kvfs_chunk_read_cb(
			x->c, pc, (size_t)nl * nc,
			direct && !pool ? KVFS_CHUNK_CLIENT_DST : 0, &res,
			direct && sw.w ? layer_got : NULL, &lp);
		x->resp->bytes_wanted += res.bytes_wanted;
		x->resp->bytes_read += res.bytes_read;
		x->resp->ssd_reads += res.ssd_reads;
		x->resp->mem_hits += res.mem_hits;
		x->resp->spec_hits += res.spec_hits;
		if (rc) {
			if (sw.w)
				kvfs_ctl_sync_signal(&sw,
						     KVFS_CTL_SYNC_FAILED | l0);
			kvfs_ctl_fail(x, rc, "%s",
				      rc == -EBADMSG ?
					      "a chunk failed its checksum" :
					      "reading the chunks failed");
			rc = 0;
			goto out_sync;
		}
		for (uint32_t l = lp.next; l < nl && direct; l++)
			if (sw.w)
				kvfs_ctl_sync_signal(&sw, l0 + l + 1);
		for (uint32_t l = 0; l < nl && !direct; l++) {
			uint64_t base = ((uint64_t)(l0 + l) * nc) * cb;

			for (uint32_t k = 0; k < nc; k++) {
				memset(&xf[k], 0, sizeof(xf[k]));
				xf[k].host = stage + ((size_t)l * nc + k) * cb;
				xf[k].len = cb;
				if (pool) {
					xf[k].pool = &region;
					xf[k].off = base + k * cb;
				} else {
					xf[k].peer_off =
						x->dst[0].off + base + k * cb;
				}
			}
			rc = pool ? go->upload(gpu, xf, nc) :
				    go->peer_write(gpu, peer, xf, nc);
			if (rc) {
				if (sw.w)
					kvfs_ctl_sync_signal(
						&sw, KVFS_CTL_SYNC_FAILED |
							     (l0 + l));
				kvfs_ctl_fail(x, rc, "%s",
					      "delivering the chunks "
					      "failed");
				rc = 0;
				goto out_sync;
			}
			if (sw.w)
				kvfs_ctl_sync_signal(&sw, l0 + l + 1);
		}
	}
	if (r->flags & KVFS_CTL_F_SPECULATE)
		kvfs_ctl_speculate(x, v, bi, local);
	if (pool) {
		rc = kvfs_ctl_region_keep(x->s, x->pid, &region);
		if (rc)
			goto out_sync;
		region_off = region.off;
		memset(&region, 0, sizeof(region));
		go->describe_owner(gpu, x->ns->owner, &x->resp->pool);
		x->resp->n_blocks = 1;
		x->blk[0].pool_off = region_off;
		x->blk[0].len = total;
		x->blk[0].layer_bytes = (uint64_t)nc * cb;
	}
out_sync:
	kvfs_ctl_sync_close(&sw);
out_region:
	if (region.len)
		gpu->ops->free(gpu, &region);
out_peer:
	kvfs_ctl_peer_put(x, peer, peer_kept);
out_put:
	kvfs_ctl_put_all(x->c, v, x->nk);
out_free:
	free(v);
	free(bi);
	free(local);
	free(sorted);
	kvfs_ctl_stage_put(x, stage, own_stage);
	free(pc);
	free(xf);
	free(lp.got);
	return rc;
}

int kvfs_ctl_scores(struct kvfs_ctl_ctx *x)
{
	struct kvfs_block **v = calloc(x->nk, sizeof(*v));
	int rc = 0;

	if (!v)
		return -ENOMEM;
	if (kvfs_ctl_find_all(x, v) || x->resp->error)
		goto out_free;
	/* Each report is one engine request: the unit of score decay. */
	kvfs_chunk_tick(x->c);
	for (uint32_t k = 0; k < x->r->n_chunks; k++) {
		uint32_t local;
		size_t bi;

		if (chunk_locate(x, v, x->chunks[k], &bi, &local) ||
		    kvfs_chunk_score(x->c, v[bi], local, x->scores[k])) {
			kvfs_ctl_fail(x, -EINVAL,
				      "chunk %u: out of range, or its score "
				      "is negative or not finite",
				      x->chunks[k]);
			break;
		}
	}
	kvfs_ctl_put_all(x->c, v, x->nk);
out_free:
	free(v);
	return rc;
}
