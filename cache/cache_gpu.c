/* SPDX-License-Identifier: MIT */
/*
 * The device tier inside the engine: loading blocks into the pool in
 * batches, and evicting from it through the policy (a victim goes through
 * the policy's admission into DRAM).
 *
 * The pool holds a block's whole file image, so a copy can go back to DRAM
 * without touching the SSD; clients are given the payload's offset.  The
 * tier has one pool per owner uid (gpu/gpu.h): a block goes to the pool
 * of its namespace's owner (ns->owner), and room is made there.  A
 * block stored as hidden states is restored straight into its extent
 * (kvfs_rpool_to_device()); one restored on the GPU has its header's
 * payload CRC filled in only when its image is copied out (gpu_demote).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/rpool_i.h"
#include "meta/log.h"
#include "meta/util.h"

/* What a reservation in the pool is for: the victim filter's argument. */
struct gpu_want {
	struct kvfs_cache *c;
	uint32_t owner; /* whose pool */
	uint64_t len;
};

static bool ok_gpu(struct kvfs_pnode *n, void *arg)
{
	struct kvfs_block *b = kvfs_pn_block(n);
	const struct gpu_want *w = arg;
	struct kvfs_tier *gpu;

	if (atomic_load(&b->leases) ||
	    (atomic_load(&b->pins) & KVFS_TIER_BIT_GPU) ||
	    (atomic_load(&b->flags) & KVFS_B_DELETED))
		return false;
	if (!w || b->ns->owner == w->owner)
		return true;
	/* Another owner's block makes no hole in this pool; it helps only
	 * while the capacity the pools share is what is short.
	 */
	gpu = w->c->tier[KVFS_TIER_GPU];
	return atomic_load(&gpu->used) > gpu->capacity - w->len;
}

static int gpu_alloc(struct kvfs_cache *c, uint64_t len, struct kvfs_extent *e,
		     void *arg)
{
	const struct gpu_want *w = arg;

	return c->gops->alloc_owner(c->tier[KVFS_TIER_GPU], w->owner, len, e);
}

/* Caller holds c->policy_lock.  *@nocrc: the image's payload CRC is
 * not filled in (KVFS_B_GPU_NOCRC).
 */
static int gpu_unpublish(struct kvfs_cache *c, struct kvfs_block *b,
			 struct kvfs_extent *out, bool *nocrc)
{
	pthread_mutex_lock(&b->lock);
	if (!b->gpu.len) {
		pthread_mutex_unlock(&b->lock);
		return -ENOENT;
	}
	if (atomic_load(&b->leases)) {
		pthread_mutex_unlock(&b->lock);
		return -EBUSY;
	}
	*out = b->gpu;
	memset(&b->gpu, 0, sizeof(b->gpu));
	*nocrc = atomic_fetch_and(&b->flags, ~(unsigned)KVFS_B_GPU_NOCRC) &
		 KVFS_B_GPU_NOCRC;
	atomic_fetch_and(&b->tiers, ~(unsigned)KVFS_TIER_BIT_GPU);
	pthread_mutex_unlock(&b->lock);
	kvfs_policy_remove(c->policy, KVFS_TIER_GPU, &b->pn);
	return 0;
}

/*
 * Move @b out of the pool. If the policy admits it into DRAM and DRAM has
 * no copy, the image is copied down first; otherwise the copies below (an
 * SSD copy always exists for a block without a DRAM copy) serve it.
 * -EBUSY while leased.
 */
static int gpu_demote(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_extent gx, dx = { 0 };
	bool admit, nocrc = false;
	int rc;

	pthread_mutex_lock(&c->policy_lock);
	/* A DRAM pin still waiting for its block (kvfs_block_dram_admit())
	 * takes the copy whatever the policy says; that helper takes
	 * policy_lock itself, hence the test inline.
	 */
	admit = (atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM) ||
		kvfs_policy_admit(c->policy, KVFS_TIER_GPU, KVFS_TIER_DRAM,
				  &b->pn);
	rc = gpu_unpublish(c, b, &gx, &nocrc);
	pthread_mutex_unlock(&c->policy_lock);
	if (rc)
		return rc;
	if (admit && !atomic_load(&b->dram_ptr) &&
	    kvfs_dram_reserve(c, gx.len, &dx) == 0) {
		pthread_mutex_lock(&b->io_lock);
		if (atomic_load(&b->dram_ptr) ||
		    gpu->ops->read(gpu, &gx, 0, dx.ptr, gx.len)) {
			c->tier[KVFS_TIER_DRAM]->ops->free(
				c->tier[KVFS_TIER_DRAM], &dx);
		} else {
			/* Restored on the GPU: the payload is in host
			 * memory now, so its CRC can be summed.
			 */
			if (nocrc)
				kvfs_fmt_img_seal(dx.ptr, b->size);
			/* Not for a block deleted meanwhile. */
			if (kvfs_block_publish_dram(c, b, &dx))
				c->tier[KVFS_TIER_DRAM]->ops->free(
					c->tier[KVFS_TIER_DRAM], &dx);
		}
		pthread_mutex_unlock(&b->io_lock);
	}
	gpu->ops->free(gpu, &gx);
	atomic_fetch_sub(&gpu->st.blocks, 1);
	atomic_fetch_add(&gpu->st.evictions, 1);
	return 0;
}

int kvfs_gpu_drop(struct kvfs_cache *c, struct kvfs_block *b)
{
	if (!c->tier[KVFS_TIER_GPU])
		return -EINVAL;
	return gpu_demote(c, b);
}

/* A victim leased, pinned or gone since it was picked makes way for the
 * next one; with none left, everything there is leased or pinned.
 */
static int gpu_no_victim(struct kvfs_cache *c)
{
	return -ENOSPC;
}

static const struct kvfs_reserve_ops gpu_reserve_ops = {
	.tier = KVFS_TIER_GPU,
	.fit_check = true,
	.may_evict = ok_gpu,
	.alloc = gpu_alloc,
	.evict = gpu_demote,
	.no_victim = gpu_no_victim,
};

/* Room for @len bytes in @owner's pool; without @evict, only free room
 * is taken.
 */
static int gpu_reserve(struct kvfs_cache *c, uint32_t owner, uint64_t len,
		       struct kvfs_extent *e, bool evict)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct gpu_want w = {
		.c = c,
		.owner = owner,
		.len = kvfs_util_align_up(len, gpu->align),
	};
	struct kvfs_ctl_mem pool;
	int rc;

	/* Larger than the owner's pool: evicting would not help. */
	rc = c->gops->describe_owner(gpu, owner, &pool);
	if (rc)
		return rc;
	if (!len || w.len > pool.size || w.len > gpu->capacity)
		return len ? -ENOSPC : -EINVAL;
	if (!evict)
		return c->gops->alloc_owner(gpu, owner, len, e);
	return kvfs_reserve(c, &gpu_reserve_ops, len, e, &w);
}

/* A host image of @b to copy from: its DRAM copy (held by an open count
 * so it cannot be dropped) or a private copy loaded from the SSD.
 */
struct host_img {
	struct kvfs_reader r;
	const void *p;
};

static int host_img_get(struct kvfs_cache *c, struct kvfs_block *b,
			struct host_img *h)
{
	size_t n;
	int rc;

	kvfs_block_get_ref(b);
	rc = kvfs_cache_reader_init(c, &h->r, b);
	if (rc)
		return rc;
	rc = kvfs_cache_read_begin(c, &h->r, 0, b->size, &h->p, &n);
	if (rc) {
		kvfs_cache_reader_release(c, &h->r);
		return rc;
	}
	return 0;
}

static void host_img_put(struct kvfs_cache *c, struct host_img *h)
{
	kvfs_cache_read_end(c, &h->r);
	kvfs_cache_reader_release(c, &h->r);
}

/*
 * Make @n blocks resident in the pool, in one batch: reserve extents,
 * gather host images, one upload, then publish. Concurrent callers are
 * serialised, so a block wanted by two fetchers is loaded once (and a
 * block stored as hidden states restored once).  Such a block is
 * restored straight into its extent when its namespace has a device
 * restorer (kvfs_rpool_to_device()); if that fails it takes the usual
 * path: restored through DRAM by the read path and uploaded.
 */
int kvfs_gpu_load(struct kvfs_cache *c, struct kvfs_block **blocks, size_t n,
		  unsigned flags)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_gpu_xfer *x = NULL;
	struct kvfs_extent *ext = NULL;
	struct host_img *img = NULL;
	struct kvfs_block **blk = NULL;
	bool *noimg = NULL, *nocrc = NULL; /* noimg: img[i] not held */
	int *res = NULL;
	size_t m = 0, nx = 0;
	int rc = 0;

	if (!gpu)
		return -EINVAL;
	if (!(flags & KVFS_GPU_TRYLOCK))
		pthread_mutex_lock(&c->gpu_load_lock);
	else if (pthread_mutex_trylock(&c->gpu_load_lock))
		return -EBUSY;
	x = calloc(n ? n : 1, sizeof(*x));
	ext = calloc(n ? n : 1, sizeof(*ext));
	img = calloc(n ? n : 1, sizeof(*img));
	blk = calloc(n ? n : 1, sizeof(*blk));
	noimg = calloc(n ? n : 1, sizeof(*noimg));
	nocrc = calloc(n ? n : 1, sizeof(*nocrc));
	res = calloc(n ? n : 1, sizeof(*res));
	if (!x || !ext || !img || !blk || !noimg || !nocrc || !res) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = blocks[i];
		bool dup = false;

		if (b->gpu.len)
			continue;
		for (size_t j = 0; j < i; j++)
			dup |= blocks[j] == b;
		if (dup)
			continue;
		/* Counted in m at once, so an undo frees the extent. */
		rc = gpu_reserve(c, b->ns->owner, b->size, &ext[m],
				 !(flags & KVFS_GPU_NOEVICT));
		if (rc)
			goto out_undo;
		blk[m] = b;
		noimg[m] = true; /* until host_img_get() holds one */
		m++;
	}
	/* Stored hidden states straight into their extents, the GPU's in
	 * batches; res[i] 1 for every other block.
	 */
	rc = m ? kvfs_rpool_to_device(c, blk, ext, nocrc, res, m) : 0;
	if (rc)
		goto out_undo;
	for (size_t i = 0; i < m; i++) {
		struct kvfs_block *b = blk[i];

		if (!res[i])
			continue;
		if (res[i] == -ENOENT || res[i] == -EBADMSG) {
			rc = res[i];
			goto out_undo;
		}
		if (res[i] < 0) {
			/* Logged; the usual path never serves what failed
			 * there.
			 */
			atomic_fetch_add(&c->st_restore_dev_fallback, 1);
			kvfs_warn("ns %s: restoring through DRAM instead",
				  b->ns->rec.name);
		}
		nocrc[i] = false;
		rc = host_img_get(c, b, &img[i]);
		if (rc)
			goto out_undo;
		noimg[i] = false;
		x[nx].pool = &ext[i];
		x[nx].host = (void *)img[i].p;
		x[nx].len = b->size;
		nx++;
	}
	if (nx) {
		rc = c->gops->upload(gpu, x, nx);
		if (rc)
			goto out_undo;
	}
	pthread_mutex_lock(&c->policy_lock);
	for (size_t i = 0; i < m; i++) {
		struct kvfs_block *b = blk[i];
		struct kvfs_paccess a = { .now = kvfs_util_now_real() };

		pthread_mutex_lock(&b->lock);
		b->gpu = ext[i];
		if (nocrc[i])
			atomic_fetch_or(&b->flags, KVFS_B_GPU_NOCRC);
		atomic_fetch_or(&b->tiers, KVFS_TIER_BIT_GPU);
		pthread_mutex_unlock(&b->lock);
		kvfs_policy_insert(c->policy, KVFS_TIER_GPU, &b->pn, &a);
		atomic_fetch_add(&gpu->st.blocks, 1);
		atomic_fetch_add(&gpu->st.bytes_written, b->size);
	}
	pthread_mutex_unlock(&c->policy_lock);
	for (size_t i = 0; i < m; i++)
		if (!noimg[i])
			host_img_put(c, &img[i]);
	goto out_unlock;

out_undo:
	for (size_t i = 0; i < m; i++) {
		gpu->ops->free(gpu, &ext[i]);
		if (!noimg[i])
			host_img_put(c, &img[i]);
	}
out_unlock:
	pthread_mutex_unlock(&c->gpu_load_lock);
	free(x);
	free(ext);
	free(img);
	free(blk);
	free(noimg);
	free(nocrc);
	free(res);
	return rc;
}
