/* SPDX-License-Identifier: MIT */
/*
 * The control operations on whole blocks: LOOKUP, FETCH (into the device
 * pool, leased), FETCH_INTO (into the caller's memory, layer by layer),
 * SAVE, RELEASE, PIN/UNPIN, PREFETCH, EVICT and STATS.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunk.h"
#include "cache/ctl_i.h"
#include "cache/rpool_i.h"
#include "meta/fmt.h"
#include "meta/util.h"

int kvfs_ctl_lookup(struct kvfs_ctl_ctx *x)
{
	bool leading = true;

	x->resp->n_blocks = (uint32_t)x->nk;
	for (size_t i = 0; i < x->nk; i++) {
		struct kvfs_block *b = kvfs_ctl_find(x, kvfs_ctl_key_at(x, i));

		kvfs_ctl_fill_block(x, i, b);
		if (!b) {
			leading = false;
			continue;
		}
		if (leading)
			x->resp->n_cached++;
		/* Existence checks must not look like use: only an explicit
		 * access flag counts (Mooncake starved on the opposite).
		 */
		if (leading && (x->r->flags & KVFS_CTL_F_ACCESS))
			kvfs_cache_touch(x->c, b);
		kvfs_cache_put(x->c, b);
	}
	return 0;
}

int kvfs_ctl_fetch(struct kvfs_ctl_ctx *x)
{
	struct kvfs_block **v;
	int rc;

	if (kvfs_ctl_need_gpu(x))
		return 0;
	v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	rc = kvfs_ctl_find_all(x, v);
	if (rc || x->resp->error)
		goto out_free;
	/* Lease first: a leased block is never moved, so nothing can evict
	 * what this batch loads before the caller has it.
	 */
	rc = kvfs_ctl_leases_take(x->s, x->pid, v, x->nk);
	if (!rc) {
		rc = kvfs_gpu_load(x->c, v, x->nk, 0);
		/* Give back exactly what this request took. */
		if (rc)
			kvfs_ctl_leases_undo(x->s, x->pid, v, x->nk);
	}
	if (rc) {
		kvfs_ctl_fail(
			x, rc, "%s",
			rc == -ENOSPC ?
				"the device pool is full of leased or pinned blocks" :
				"loading into the device pool failed");
		rc = 0;
		goto out_put;
	}
	/* The pool of the namespace's owner, which holds every block of it;
	 * the offsets below are relative to it.
	 */
	x->c->gops->describe_owner(x->c->tier[KVFS_TIER_GPU], x->ns->owner,
				   &x->resp->pool);
	x->resp->n_blocks = (uint32_t)x->nk;
	x->resp->n_cached = (uint32_t)x->nk;
	for (size_t i = 0; i < x->nk; i++) {
		kvfs_ctl_fill_block(x, i, v[i]);
		pthread_mutex_lock(&v[i]->lock);
		x->blk[i].pool_off =
			v[i]->gpu.off + kvfs_block_payload_off(v[i]);
		pthread_mutex_unlock(&v[i]->lock);
		atomic_fetch_add(&x->c->st_fetch_bytes, x->blk[i].len);
		kvfs_cache_touch(x->c, v[i]);
	}
	atomic_fetch_add(&x->c->st_fetches, 1);
out_put:
	kvfs_ctl_put_all(x->c, v, x->nk);
out_free:
	free(v);
	return rc;
}

/* A FETCH_INTO destination: block @i's payload at [off, off + len). */
struct dst_range {
	uint64_t off, len;
	size_t i;
};

static int dst_cmp(const void *pa, const void *pb)
{
	const struct dst_range *a = pa, *b = pb;

	if (a->off != b->off)
		return a->off < b->off ? -1 : 1;
	return (a->i > b->i) - (a->i < b->i);
}

/*
 * FETCH_INTO's destinations must not overlap: which block's bytes would
 * end up in the shared ones depends on the order of the copies, which
 * differs between the device backends, and no engine means it (two
 * blocks in one slot of its KV cache). Sorted, an overlap shows between
 * neighbours, so this is O(n log n) for requests of thousands of blocks.
 * @ord gets the blocks in ascending destination order, the order the
 * copies are issued in (the device tier then confirms the order in one
 * pass). 0, also when the response was failed with EINVAL (logged with
 * the two blocks); -ENOMEM.
 */
static int dst_order(struct kvfs_ctl_ctx *x, struct kvfs_block **v, size_t *ord)
{
	struct dst_range *d = calloc(x->nk ? x->nk : 1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	for (size_t i = 0; i < x->nk; i++) {
		d[i].off = x->dst[i].off;
		d[i].len = v[i]->size - kvfs_block_payload_off(v[i]);
		d[i].i = i;
	}
	qsort(d, x->nk, sizeof(*d), dst_cmp);
	for (size_t k = 0; k < x->nk; k++)
		ord[k] = d[k].i;
	for (size_t k = 1; k < x->nk; k++) {
		const struct dst_range *a = &d[k - 1], *b = &d[k];

		/* b starts no earlier than a: no a.off + a.len to overflow */
		if (a->len <= b->off - a->off)
			continue;
		if (a->i > b->i) {
			const struct dst_range *t = a;

			a = b;
			b = t;
		}
		kvfs_ctl_fail(x, -EINVAL,
			      "destinations of blocks %zu [%" PRIu64
			      ", +%" PRIu64 ") and %zu [%" PRIu64 ", +%" PRIu64
			      ") overlap in "
			      "the caller's memory; nothing copied",
			      a->i, a->off, a->len, b->i, b->off, b->len);
		break;
	}
	free(d);
	return 0;
}

struct src {
	struct kvfs_block *b;
	struct kvfs_reader r;
	const uint8_t *host; /* image when not in the pool */
	struct kvfs_extent gpu;
	bool reading;
};

int kvfs_ctl_fetch_into(struct kvfs_ctl_ctx *x)
{
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	const struct kvfs_gpu_ops *go = x->c->gops;
	struct kvfs_gpu_peer *peer = NULL;
	struct kvfs_gpu_xfer *xf = NULL;
	struct kvfs_block **v = NULL;
	struct src *src = NULL;
	struct kvfs_ctl_sync_word sw = { 0 };
	uint64_t lb = 0, layers, psize;
	size_t *ord = NULL;
	bool leased = false;
	int rc = 0;

	if (kvfs_ctl_need_gpu(x))
		return 0;
	v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	src = calloc(x->nk ? x->nk : 1, sizeof(*src));
	xf = calloc(x->nk ? x->nk : 1, sizeof(*xf));
	ord = calloc(x->nk ? x->nk : 1, sizeof(*ord));
	if (!v || !src || !xf || !ord) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = kvfs_ctl_find_all(x, v);
	if (rc || x->resp->error)
		goto out_free;
	/* Before anything is opened, leased or copied: only the blocks'
	 * references are held, and out_put drops them.
	 */
	rc = dst_order(x, v, ord);
	if (rc || x->resp->error)
		goto out_put;
	layers = x->ns->geom.n_layers;
	rc = kvfs_ctl_peer_open(x, &x->r->peer, &peer);
	if (rc) {
		if (rc != -EACCES)
			kvfs_ctl_fail(x, rc, "%s",
				      "cannot open the caller's memory");
		rc = 0;
		goto out_put;
	}
	psize = go->peer_size(peer);
	/* Every destination range is checked before any byte moves. */
	for (size_t i = 0; i < x->nk; i++) {
		uint64_t len = v[i]->size - kvfs_block_payload_off(v[i]);

		if (x->dst[i].off > psize || len > psize - x->dst[i].off) {
			kvfs_ctl_fail(x, -EINVAL, "%s",
				      "a destination range falls "
				      "outside the caller's memory");
			goto out_peer;
		}
	}
	if (kvfs_ctl_sync_open(x, &sw))
		goto out_peer;
	/* Hold every source: a lease keeps the pool copy, an open handle
	 * keeps the DRAM copy.
	 */
	rc = kvfs_ctl_leases_take(x->s, x->pid, v, x->nk);
	leased = !rc;
	for (size_t i = 0; i < x->nk && !rc; i++) {
		src[i].b = v[i];
		pthread_mutex_lock(&v[i]->lock);
		src[i].gpu = v[i]->gpu;
		pthread_mutex_unlock(&v[i]->lock);
		if (src[i].gpu.len)
			continue;
		size_t n;

		kvfs_block_get_ref(v[i]);
		rc = kvfs_cache_reader_init(x->c, &src[i].r, v[i]);
		if (!rc) {
			rc = kvfs_cache_read_begin(x->c, &src[i].r, 0,
						   v[i]->size,
						   (const void **)&src[i].host,
						   &n);
			if (rc)
				kvfs_cache_reader_release(x->c, &src[i].r);
			else
				src[i].reading = true;
		}
	}
	if (rc) {
		kvfs_ctl_fail(x, rc, "%s", "reading a block failed");
		kvfs_ctl_sync_signal(&sw, KVFS_CTL_SYNC_FAILED);
		rc = 0;
		goto out_release;
	}
	/* Layer by layer across all blocks: the engine may start layer l
	 * while later layers are still being copied. Within a layer, in
	 * ascending destination order (any order leaves the same bytes,
	 * the destinations being disjoint).
	 */
	kvfs_ctl_sync_signal(&sw, 0);
	for (uint64_t l = 0; l < layers; l++) {
		for (size_t k = 0; k < x->nk; k++) {
			size_t i = ord[k];
			uint64_t po = kvfs_block_payload_off(v[i]);

			lb = (v[i]->size - po) / layers;
			xf[k].pool = src[i].gpu.len ? &src[i].gpu : NULL;
			xf[k].off = po + l * lb;
			xf[k].host = src[i].gpu.len ? NULL :
						      (void *)(src[i].host +
							       po + l * lb);
			xf[k].peer_off = x->dst[i].off + l * lb;
			xf[k].len = lb;
		}
		rc = go->peer_write(gpu, peer, xf, x->nk);
		if (rc) {
			kvfs_ctl_sync_signal(&sw, KVFS_CTL_SYNC_FAILED |
							  (uint32_t)l);
			kvfs_ctl_fail(x, rc, "%s",
				      "copying into the caller's memory "
				      "failed");
			rc = 0;
			goto out_release;
		}
		kvfs_ctl_sync_signal(&sw, (uint32_t)(l + 1));
	}
	x->resp->n_blocks = (uint32_t)x->nk;
	x->resp->n_cached = (uint32_t)x->nk;
	for (size_t i = 0; i < x->nk; i++) {
		kvfs_ctl_fill_block(x, i, v[i]);
		atomic_fetch_add(&x->c->st_fetch_into_bytes, x->blk[i].len);
		kvfs_cache_touch(x->c, v[i]);
	}
out_release:
	for (size_t i = 0; i < x->nk; i++) {
		if (src[i].reading) {
			kvfs_cache_read_end(x->c, &src[i].r);
			kvfs_cache_reader_release(x->c, &src[i].r);
		}
	}
	/* The temporary leases of the copy. */
	if (leased)
		kvfs_ctl_leases_undo(x->s, x->pid, v, x->nk);
	kvfs_ctl_sync_close(&sw);
out_peer:
	go->peer_close(gpu, peer);
out_put:
	kvfs_ctl_put_all(x->c, v, x->nk);
out_free:
	free(v);
	free(src);
	free(xf);
	free(ord);
	return rc;
}

int kvfs_ctl_save(struct kvfs_ctl_ctx *x)
{
	const struct kvfs_geom *g = kvfs_ns_geom(x->ns);
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	struct kvfs_gpu_peer *peer = NULL;
	struct kvfs_pending *p;
	struct kvfs_block *b;
	struct kvfs_gpu_xfer xf = { 0 };
	uint64_t size, off, plen;
	char name[KVFS_FMT_NAME_LEN + 1];
	uint8_t *buf;
	int rc;

	if (kvfs_ctl_need_gpu(x))
		return 0;
	if (x->r->n_keys || !x->r->n_tokens ||
	    x->r->n_tokens > g->block_tokens ||
	    (x->r->flags & KVFS_CTL_F_TOKENS))
		return kvfs_ctl_fail(x, -EINVAL, "%s",
				     "SAVE takes 1..block_tokens "
				     "token ids and no keys");
	size = kvfs_fmt_file_size(g, KVFS_KIND_KV, x->r->n_tokens);
	off = kvfs_fmt_payload_off(x->r->n_tokens);
	plen = size - off;
	buf = aligned_alloc(KVFS_FMT_ALIGN,
			    kvfs_util_align_up(size, KVFS_FMT_ALIGN));
	if (!buf)
		return -ENOMEM;
	rc = kvfs_ctl_peer_open(x, &x->r->peer, &peer);
	if (rc) {
		if (rc != -EACCES)
			kvfs_ctl_fail(x, rc, "%s",
				      "cannot open the caller's memory");
		goto out_free;
	}
	xf.host = buf + off;
	xf.peer_off = x->r->src_off;
	xf.len = plen;
	if (x->r->src_off > x->c->gops->peer_size(peer) ||
	    plen > x->c->gops->peer_size(peer) - x->r->src_off)
		rc = -EINVAL;
	else
		rc = x->c->gops->peer_read(gpu, peer, &xf, 1);
	x->c->gops->peer_close(gpu, peer);
	if (rc) {
		kvfs_ctl_fail(x, rc, "%s",
			      "the payload range is outside the caller's "
			      "memory, or the copy failed");
		goto out_free;
	}
	/* The header, key and checksums are ours; validation is the same as
	 * for a written file.
	 */
	rc = kvfs_fmt_build(g, KVFS_KIND_KV, x->r->parent, x->r->start_pos,
			    x->tokens, x->r->n_tokens, NULL, buf, size);
	if (rc) {
		kvfs_ctl_fail(x, rc, "%s",
			      "cannot build a block from the request");
		goto out_free;
	}
	kvfs_fmt_key_hex(buf + 64, name);
	memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
	memcpy(x->resp->key, buf + 64, 16);
	rc = kvfs_cache_create(x->c, x->ns, name, &p);
	if (!rc)
		rc = kvfs_cache_write(p, 0, buf, size);
	/* Room under the namespace's quota, from its own blocks. */
	if (!rc && (rc = kvfs_ctl_quota_admit(x->c, x->ns, size))) {
		kvfs_cache_abandon(x->c, p);
	} else if (!rc) {
		rc = kvfs_cache_commit(x->c, p, &b);
		p = NULL;
		if (!rc)
			kvfs_cache_put(x->c, b);
	} else if (rc != -EEXIST) {
		kvfs_cache_abandon(x->c, p);
	}
	if (rc)
		kvfs_ctl_fail(x, rc, "block %s not saved", name);
	else
		atomic_fetch_add(&x->c->st_saves, 1);
out_free:
	free(buf);
	return 0;
}

int kvfs_ctl_release(struct kvfs_ctl_ctx *x)
{
	kvfs_ctl_leases_release(
		x->s, x->pid,
		x->chain ? (const uint8_t(*)[16])x->chain : x->keys, x->nk);
	return 0;
}

int kvfs_ctl_pin(struct kvfs_ctl_ctx *x, bool pin)
{
	struct kvfs_block **v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	int rc = 0;

	if (!v)
		return -ENOMEM;
	if (kvfs_ctl_find_all(x, v) || x->resp->error)
		goto out_free;
	for (size_t i = 0; i < x->nk && !rc; i++) {
		if (!pin) {
			rc = kvfs_cache_unpin(x->c, v[i]);
		} else if (x->r->tier < KVFS_NTIERS) {
			rc = kvfs_ctl_pin_admit(x->c, v[i], (int)x->r->tier);
		} else {
			rc = -EINVAL;
		}
	}
	if (rc)
		kvfs_ctl_fail(x, rc, "%s", pin ? "pin failed" : "unpin failed");
	kvfs_ctl_put_all(x->c, v, x->nk);
out_free:
	free(v);
	return 0;
}

struct prefetch_job {
	struct kvfs_cache *c;
	struct kvfs_block **v;
	size_t n;
	uint32_t tier;
};

static void *prefetch_main(void *arg)
{
	struct prefetch_job *j = arg;

	if (j->tier == KVFS_TIER_GPU) {
		kvfs_gpu_load(j->c, j->v, j->n, 0);
	} else {
		for (size_t i = 0; i < j->n; i++)
			(void)kvfs_promote_load(j->c, j->v[i]);
	}
	kvfs_ctl_put_all(j->c, j->v, j->n);
	kvfs_bg_end(j->c);
	free(j->v);
	free(j);
	return NULL;
}

/* A hint: blocks that exist are brought up in the background; the call
 * returns at once and missing keys are ignored.
 */
int kvfs_ctl_prefetch(struct kvfs_ctl_ctx *x)
{
	struct prefetch_job *j;
	pthread_attr_t at;
	pthread_t t;

	if (x->r->tier != KVFS_TIER_GPU && x->r->tier != KVFS_TIER_DRAM)
		return kvfs_ctl_fail(x, -EINVAL, "%s",
				     "PREFETCH goes to gpu or dram");
	if (x->r->tier == KVFS_TIER_GPU && kvfs_ctl_need_gpu(x))
		return 0;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->v = calloc(x->nk ? x->nk : 1, sizeof(*j->v));
	if (!j->v) {
		free(j);
		return -ENOMEM;
	}
	j->c = x->c;
	j->tier = x->r->tier;
	for (size_t i = 0; i < x->nk; i++) {
		struct kvfs_block *b = kvfs_ctl_find(x, kvfs_ctl_key_at(x, i));

		if (!b)
			continue;
		j->v[j->n++] = b;
		/* Hidden states already in DRAM load nothing, so the thread
		 * below would never restore them: submit the restoration
		 * here (it only queues a job; the loads' own restorations
		 * are submitted as each load completes).
		 */
		if (atomic_load(&b->dram_ptr))
			kvfs_rpool_ahead(x->c, b);
	}
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	/* Before the thread starts: it frees @j. */
	x->resp->n_cached = (uint32_t)j->n;
	kvfs_bg_begin(x->c);
	if (pthread_create(&t, &at, prefetch_main, j)) {
		x->resp->n_cached = 0;
		kvfs_bg_end(x->c);
		kvfs_ctl_put_all(x->c, j->v, j->n);
		free(j->v);
		free(j);
		pthread_attr_destroy(&at);
		return kvfs_ctl_fail(x, -EAGAIN, "%s",
				     "no thread for the prefetch");
	}
	pthread_attr_destroy(&at);
	return 0;
}

int kvfs_ctl_evict(struct kvfs_ctl_ctx *x)
{
	struct kvfs_block **v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	int rc = 0;

	if (!v)
		return -ENOMEM;
	if (kvfs_ctl_find_all(x, v) || x->resp->error)
		goto out_free;
	for (size_t i = 0; i < x->nk && !rc; i++) {
		if (atomic_load(&v[i]->leases)) {
			rc = -EBUSY;
			break;
		}
		switch (x->r->tier) {
		case KVFS_TIER_GPU:
			rc = kvfs_gpu_drop(x->c, v[i]);
			if (rc == -ENOENT)
				rc = 0;
			break;
		case KVFS_TIER_DRAM:
			rc = kvfs_dram_drop(x->c, v[i]);
			break;
		default:
			rc = atomic_load(&v[i]->pins) ?
				     -EBUSY :
				     kvfs_block_delete(x->c, v[i],
						       "evicted through ctl");
			break;
		}
	}
	if (rc)
		kvfs_ctl_fail(x, rc, "%s",
			      rc == -EBUSY ? "a block is leased, pinned or "
					     "open" :
					     "evict failed");
	kvfs_ctl_put_all(x->c, v, x->nk);
out_free:
	free(v);
	return 0;
}

int kvfs_ctl_stats(struct kvfs_ctl_ctx *x)
{
	struct kvfs_ctl_stats *st = &x->resp->stats;
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];

	st->leases = kvfs_ctl_leases_count(x->s, x->pid);
	st->leases_total = atomic_load(&x->c->st_leases);
	st->leases_reclaimed = atomic_load(&x->c->st_leases_reclaimed);
	if (gpu) {
		st->pool_capacity = gpu->capacity;
		st->pool_used = atomic_load(&gpu->used);
		st->pool_blocks = atomic_load(&gpu->st.blocks);
	}
	st->fetches = atomic_load(&x->c->st_fetches);
	st->fetch_bytes = atomic_load(&x->c->st_fetch_bytes);
	st->fetch_into_bytes = atomic_load(&x->c->st_fetch_into_bytes);
	st->saves = atomic_load(&x->c->st_saves);
	struct kvfs_chunk_stats cs;

	kvfs_chunk_get_stats(x->c, &cs);
	st->chunk_bytes_wanted = cs.bytes_wanted;
	st->chunk_bytes_read = cs.bytes_read;
	st->chunk_reads = cs.ssd_reads;
	st->chunk_hits = cs.mem_hits;
	st->spec_loaded = cs.spec_loaded;
	st->spec_used = cs.spec_used;
	return 0;
}
