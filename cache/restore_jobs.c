/* SPDX-License-Identifier: MIT */
/*
 * The restoration jobs and threads (cache/rpool_i.h): one job per block
 * whatever the number of readers, queued for the restoration threads or
 * run in the reader's thread without them; a job restores from the stored
 * image in DRAM, copies the KV image down from the device pool, or streams
 * it from the SSD, and makes the result the block's DRAM copy.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/rpool_i.h"
#include "meta/log.h"
#include "meta/util.h"

/*
 * One restoration.  Every field is guarded by rp->lock except the result
 * (rc, img, img_len), which only the job's runner writes, before it marks
 * the job done; waiters read it after seeing done under rp->lock.
 */
struct kvfs_rjob {
	struct kvfs_block *b; /* a reference, dropped with the job */
	struct kvfs_rjob *qnext; /* rp->qhead list */
	struct kvfs_rjob *anext; /* rp->active list */
	unsigned refs; /* the pool's (until done) + waiters' */
	unsigned waiters; /* readers waiting for it */
	bool done;
	int rc; /* the runner's; valid once done */
	/* The runner's: the private result (done, rc 0), or NULL. */
	void *img;
	uint64_t img_len;
};

/*
 * Make @kv the DRAM copy of @b in place of the hidden image @old.  The
 * I/O lock keeps loaders and the device tier's copy-down out; the pointer
 * is unpublished first and readers of the old image, who only look at its
 * header, are waited out.  -EAGAIN if the DRAM copy is no longer @old.
 */
static int dram_swap(struct kvfs_cache *c, struct kvfs_block *b,
		     const void *old, struct kvfs_extent *kv)
{
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_extent ox;

	pthread_mutex_lock(&b->io_lock);
	pthread_mutex_lock(&b->lock);
	if (atomic_load(&b->dram_ptr) != old || b->dram.ptr != old) {
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&b->io_lock);
		return -EAGAIN;
	}
	atomic_store(&b->dram_ptr, NULL);
	while (atomic_load(&b->readers) > 0)
		sched_yield();
	ox = b->dram;
	b->dram = *kv;
	atomic_store(&b->dram_ptr, kv->ptr);
	pthread_mutex_unlock(&b->lock);
	pthread_mutex_unlock(&b->io_lock);
	dram->ops->free(dram, &ox);
	return 0;
}

/*
 * The device pool may already hold @b's KV image (a FETCH restored it
 * there): copy it down as the block's DRAM copy instead of rebuilding it.
 * Returns 0 when the DRAM copy is now the KV image, -ENOENT when the pool
 * has no copy (or DRAM no room, or the copy fails): the caller restores.
 * Needs the block durable, as any KV image that becomes the DRAM copy.
 */
static int pool_down(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_extent gx, dx = { 0 };
	bool nocrc, published = false;
	struct kvfs_rpool_src s;
	int rc;

	if (!gpu || !(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		return -ENOENT;
	/* A lease keeps the pool copy from being evicted while it is read. */
	pthread_mutex_lock(&b->lock);
	gx = b->gpu;
	if (gx.len)
		atomic_fetch_add(&b->leases, 1);
	nocrc = atomic_load(&b->flags) & KVFS_B_GPU_NOCRC;
	pthread_mutex_unlock(&b->lock);
	if (!gx.len)
		return -ENOENT;
	/* Restored meanwhile: no need to reserve DRAM (and evict for it). */
	if (kvfs_rpool_dram_is_kv(b)) {
		atomic_fetch_sub(&b->leases, 1);
		return 0;
	}
	if (kvfs_dram_reserve(c, b->size, &dx))
		goto out_unlease;
	if (gpu->ops->read(gpu, &gx, 0, dx.ptr, b->size))
		goto out_free;
	/* Restored on the GPU: the payload is in host memory now, so its
	 * CRC can be summed.
	 */
	if (nocrc)
		kvfs_fmt_img_seal(dx.ptr, b->size);
	memset((uint8_t *)dx.ptr + b->size, 0, dx.len - b->size);
	rc = kvfs_rpool_src_get(b, &s);
	if (rc == 0) {
		const void *old = s.p;

		kvfs_rpool_src_put(b, &s);
		published = dram_swap(c, b, old, &dx) == 0;
	} else if (rc == -ENOENT) {
		pthread_mutex_lock(&b->io_lock);
		pthread_mutex_lock(&c->policy_lock);
		pthread_mutex_lock(&b->lock);
		if (!atomic_load(&b->dram_ptr) &&
		    !(atomic_load(&b->flags) & KVFS_B_DELETED)) {
			b->dram = dx;
			atomic_store(&b->dram_ptr, dx.ptr);
			atomic_fetch_or(&b->tiers, KVFS_TIER_BIT_DRAM);
			published = true;
		}
		pthread_mutex_unlock(&b->lock);
		if (published) {
			struct kvfs_paccess a = { .now = kvfs_util_now_real() };

			kvfs_policy_insert(c->policy, KVFS_TIER_DRAM, &b->pn,
					   &a);
			atomic_fetch_add(&dram->st.blocks, 1);
		}
		pthread_mutex_unlock(&c->policy_lock);
		pthread_mutex_unlock(&b->io_lock);
	}
	if (!published)
		goto out_free;
	atomic_fetch_sub(&b->leases, 1);
	atomic_fetch_add(&c->st_restore_from_pool, 1);
	return 0;

out_free:
	dram->ops->free(dram, &dx);
out_unlease:
	atomic_fetch_sub(&b->leases, 1);
	/* The KV image may have arrived meanwhile (rc 1 of kvfs_rpool_src_get()). */
	return kvfs_rpool_dram_is_kv(b) ? 0 : -ENOENT;
}

static void job_run(struct kvfs_cache *c, struct kvfs_rjob *j,
		    struct kvfs_restore_ws *ws)
{
	struct kvfs_block *b = j->b;
	struct kvfs_ns *ns = b->ns;
	struct kvfs_extent ext = { 0 };
	char hex[KVFS_KEY_HEX_LEN + 1];
	uint64_t t0 = kvfs_util_now_mono(), alen, slen = 0;
	bool keep;
	struct kvfs_rpool_src s;
	uint8_t *dst, *sdst = NULL;
	int rc;

	kvfs_fmt_key_hex(b->pn.key, hex);
	if (!ns->hc.rst) {
		kvfs_err("ns %s: block %s.kv is stored as hidden states but "
			 "the namespace has no weights: not served",
			 ns->rec.name, hex);
		j->rc = -EIO;
		return;
	}
	/* An open keeps the copies from being freed by a delete and the
	 * DRAM copy from being evicted, as for a reader.
	 */
	atomic_fetch_add(&b->opens, 1);
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		rc = -ENOENT;
		goto out_close;
	}
	/* Only a durable block's DRAM copy may turn into the KV image. */
	if (!(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		kvfs_cache_sync(c, b);
	/* Restored into the device pool already (FETCH): copy it down. */
	if (pool_down(c, b) == 0) {
		rc = 0;
		goto out_close;
	}
	/* A stored image in DRAM is restored from there; a block only on
	 * the SSD is streamed from it, I/O overlapping the projection.
	 */
	for (;;) {
		rc = kvfs_rpool_src_get(b, &s);
		if (rc != -ENOENT)
			break;
		rc = kvfs_rpool_stream(c, b, ws, &sdst, &slen);
		if (rc == -EAGAIN)
			continue;
		if (rc)
			goto out_close;
		atomic_fetch_add(&c->st_restores, 1);
		atomic_fetch_add(&ns->hc.restored, 1);
		atomic_fetch_add(&c->st_restore_ns, kvfs_util_now_mono() - t0);
		if (sdst) {
			atomic_fetch_add(&c->st_restore_private, 1);
			j->img = sdst;
			j->img_len = slen;
		}
		goto out_close;
	}
	if (rc) {
		if (rc == 1)
			rc = 0; /* restored meanwhile, or copied down */
		goto out_close;
	}
	keep = s.in_dram && (atomic_load(&b->flags) & KVFS_B_PERSISTED);
	alen = kvfs_util_align_up(b->size, KVFS_FMT_ALIGN);
	if (keep && kvfs_dram_reserve(c, b->size, &ext) == 0) {
		dst = ext.ptr;
		alen = ext.len;
	} else {
		keep = false;
		dst = aligned_alloc(KVFS_FMT_ALIGN, alen);
		if (!dst) {
			kvfs_rpool_src_put(b, &s);
			rc = -ENOMEM;
			goto out_close;
		}
	}
	rc = kvfs_rpool_build_read(c, b, ws, s.p, s.len, dst, alen);
	if (rc) {
		kvfs_rpool_src_put(b, &s);
		goto out_free_dst;
	}
	atomic_fetch_add(&c->st_restores, 1);
	atomic_fetch_add(&ns->hc.restored, 1);
	atomic_fetch_add(&c->st_restore_ns, kvfs_util_now_mono() - t0);
	if (keep) {
		const void *old = s.p;

		kvfs_rpool_src_put(b, &s);
		if (dram_swap(c, b, old, &ext) == 0)
			goto out_close;
		/* The DRAM copy changed hands: keep the result private. */
		void *cp = aligned_alloc(KVFS_FMT_ALIGN, alen);

		if (!cp) {
			rc = -ENOMEM;
			goto out_free_dst;
		}
		memcpy(cp, dst, alen);
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &ext);
		dst = cp;
		keep = false;
	} else {
		kvfs_rpool_src_put(b, &s);
	}
	atomic_fetch_add(&c->st_restore_private, 1);
	j->img = dst;
	j->img_len = alen;
	goto out_close;

out_free_dst:
	if (keep)
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &ext);
	else
		free(dst);
out_close:
	if (rc && rc != -ENOENT) {
		atomic_fetch_add(&c->st_restore_errors, 1);
		kvfs_err("ns %s: restoring block %s.kv failed: %s",
			 ns->rec.name, hex, strerror(-rc));
	}
	j->rc = rc;
	atomic_fetch_sub(&b->opens, 1);
	kvfs_block_try_free(c, b);
}

/* Caller holds rp->lock. */
static struct kvfs_rjob *job_find(struct kvfs_rpool *rp,
				  const struct kvfs_block *b)
{
	struct kvfs_rjob *j;

	for (j = rp->active; j && j->b != b; j = j->anext)
		;
	return j;
}

/* A new active job for @b with the pool's reference. Caller holds
 * rp->lock.
 */
static struct kvfs_rjob *job_new(struct kvfs_rpool *rp, struct kvfs_block *b)
{
	struct kvfs_rjob *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	kvfs_block_get_ref(b);
	j->b = b;
	j->refs = 1;
	j->anext = rp->active;
	rp->active = j;
	return j;
}

static void job_enqueue(struct kvfs_rpool *rp, struct kvfs_rjob *j)
{
	j->qnext = NULL;
	if (rp->qtail)
		rp->qtail->qnext = j;
	else
		rp->qhead = j;
	rp->qtail = j;
	pthread_cond_signal(&rp->work);
}

/* Drop a reference; returns the job to free (outside the lock) or NULL.
 * Caller holds rp->lock.
 */
static struct kvfs_rjob *job_unref(struct kvfs_rjob *j)
{
	return --j->refs ? NULL : j;
}

static void job_free(struct kvfs_cache *c, struct kvfs_rjob *j)
{
	if (!j)
		return;
	kvfs_cache_put(c, j->b);
	free(j->img);
	free(j);
}

/* Mark @j done and take it off the active list. Caller holds rp->lock. */
static struct kvfs_rjob *job_finish(struct kvfs_rpool *rp, struct kvfs_rjob *j)
{
	struct kvfs_rjob **pp;

	for (pp = &rp->active; *pp && *pp != j; pp = &(*pp)->anext)
		;
	if (*pp)
		*pp = j->anext;
	j->done = true;
	pthread_cond_broadcast(&rp->done);
	return job_unref(j);
}

static void *rpool_main(void *arg)
{
	struct kvfs_cache *c = arg;
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_restore_ws *ws = NULL;
	struct kvfs_rjob *j, *gone;

	/* Without a workspace each restoration allocates its own. */
	if (kvfs_restore_ws_alloc(&ws))
		ws = NULL;
	pthread_mutex_lock(&rp->lock);
	for (;;) {
		while (!rp->qhead && !rp->stop)
			pthread_cond_wait(&rp->work, &rp->lock);
		j = rp->qhead;
		if (!j)
			break;
		rp->qhead = j->qnext;
		if (!rp->qhead)
			rp->qtail = NULL;
		if (rp->stop && !j->waiters) {
			/* Ahead of a need that will not come. */
			j->rc = -ECANCELED;
		} else {
			pthread_mutex_unlock(&rp->lock);
			job_run(c, j, ws);
			pthread_mutex_lock(&rp->lock);
		}
		gone = job_finish(rp, j);
		if (gone) {
			pthread_mutex_unlock(&rp->lock);
			job_free(c, gone);
			pthread_mutex_lock(&rp->lock);
		}
	}
	pthread_mutex_unlock(&rp->lock);
	kvfs_restore_ws_free(ws);
	return NULL;
}

int kvfs_rpool_wait(struct kvfs_cache *c, struct kvfs_block *b, void **priv,
		    uint64_t *priv_len)
{
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_rjob *j, *gone;
	bool run_here = false;
	int rc;

	if (!rp)
		return -EIO;
	pthread_mutex_lock(&rp->lock);
	j = job_find(rp, b);
	if (j) {
		atomic_fetch_add(&c->st_restore_joined, 1);
	} else {
		/* A job that just finished published before it left the
		 * active list: look again before starting another.
		 */
		if (kvfs_rpool_dram_is_kv(b)) {
			pthread_mutex_unlock(&rp->lock);
			return 0;
		}
		j = job_new(rp, b);
		if (!j) {
			pthread_mutex_unlock(&rp->lock);
			return -ENOMEM;
		}
		if (rp->n_threads && !rp->stop)
			job_enqueue(rp, j);
		else
			run_here = true;
	}
	atomic_fetch_add(&c->st_restore_waits, 1);
	j->refs++;
	j->waiters++;
	if (run_here) {
		pthread_mutex_unlock(&rp->lock);
		job_run(c, j, NULL);
		pthread_mutex_lock(&rp->lock);
		gone = job_finish(rp, j);
		/* our own reference is still held */
		(void)gone;
	}
	while (!j->done)
		pthread_cond_wait(&rp->done, &rp->lock);
	pthread_mutex_unlock(&rp->lock);

	rc = j->rc;
	if (!rc && j->img) {
		*priv = malloc(j->img_len);
		if (*priv) {
			memcpy(*priv, j->img, j->img_len);
			*priv_len = j->img_len;
		} else {
			rc = -ENOMEM;
		}
	}
	pthread_mutex_lock(&rp->lock);
	gone = job_unref(j);
	pthread_mutex_unlock(&rp->lock);
	job_free(c, gone);
	return rc;
}

void kvfs_rpool_ahead(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_rpool *rp = c->rpool;
	struct kvfs_rjob *j;

	/* Nothing to do once the DRAM copy is the KV image. */
	if (!rp || !kvfs_block_needs_restore(b) || !b->ns->hc.rst ||
	    kvfs_rpool_dram_is_kv(b))
		return;
	pthread_mutex_lock(&rp->lock);
	if (rp->n_threads && !rp->stop && !job_find(rp, b)) {
		j = job_new(rp, b);
		if (j) {
			job_enqueue(rp, j);
			atomic_fetch_add(&c->st_restore_ahead, 1);
		}
	}
	pthread_mutex_unlock(&rp->lock);
}

/* ------------------------------------------------------------ the threads */

int kvfs_rpool_threads_start(struct kvfs_cache *c, unsigned n)
{
	struct kvfs_rpool *rp = c->rpool;
	int rc;

	/* OpenBLAS's workers are process-wide: share the CPUs between the
	 * restoration threads (and keep some for the FUSE workers).
	 */
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int blas = cpus > 0 ? (int)(cpus / (long)n) : 1;

	kvfs_restore_set_blas_threads(blas < 1 ? 1 : blas > 4 ? 4 : blas);
	for (unsigned i = 0; i < n; i++) {
		rc = -pthread_create(&rp->thr[i], NULL, rpool_main, c);
		if (rc) {
			kvfs_err("starting a restoration thread failed: %s",
				 strerror(-rc));
			return rc;
		}
		rp->n_threads++;
	}
	kvfs_info("%u restoration threads started", rp->n_threads);
	return 0;
}

void kvfs_rpool_stop(struct kvfs_cache *c)
{
	struct kvfs_rpool *rp = c->rpool;
	unsigned n;

	if (!rp)
		return;
	pthread_mutex_lock(&rp->lock);
	rp->stop = true;
	n = rp->n_threads;
	pthread_cond_broadcast(&rp->work);
	pthread_mutex_unlock(&rp->lock);
	for (unsigned i = 0; i < n; i++)
		pthread_join(rp->thr[i], NULL);
	pthread_mutex_lock(&rp->lock);
	rp->n_threads = 0;
	pthread_mutex_unlock(&rp->lock);
}

bool kvfs_rpool_busy(struct kvfs_cache *c, const struct kvfs_block *b)
{
	struct kvfs_rpool *rp = c->rpool;
	bool busy;

	if (!rp)
		return false;
	pthread_mutex_lock(&rp->lock);
	busy = job_find(rp, b) != NULL;
	pthread_mutex_unlock(&rp->lock);
	return busy;
}
