/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration in the engine (HCache, paper 003;
 * docs/hcache.md), the restoration pool: private to cache/, included by
 * the files that call the pool and by the pool's own files.
 *
 * A block stored as hidden states (HIDDEN, or MIXED: hidden states below
 * its kv_from, K and V from there on) reads as the KV-kind file its
 * restoration produces.  A read that finds no KV image in DRAM submits the
 * block's restoration job, or joins the one under way: jobs are keyed by
 * block, so any number of readers cause one restoration.  The job
 * restores from the stored image's DRAM copy, or, when there is none,
 * straight from the SSD with each layer projected as it arrives
 * (kvfs_cache_restore_stream(), verified before anything is used), and
 * makes the KV image the block's DRAM copy.  From then on reads, mmap and
 * FETCH are served from DRAM like any KV block, and eviction drops the KV
 * image as the block's DRAM copy; the hidden image stays on the SSD.  A
 * block the policy keeps out of DRAM gets its result as a private copy for
 * each waiter instead.
 *
 * The DRAM copy is replaced only once the block is durable: write-back
 * writes whatever the DRAM copy holds, and that must stay the stored form.
 *
 * A namespace with a GPU restorer (ns->hc.rc) projects on the GPU for
 * every restoration of a stored block (jobs and loads into the device
 * pool), falling back to the CPU for a job whose GPU restoration fails;
 * the plans then use the GPU's projection time.  Commit-time conversions
 * stay on the CPU.
 *
 * The files, one concern each, and the calls between them (one way, no
 * cycle):
 *   restore_image.c   building the KV (or MIXED) image from a stored one,
 *                     on the CPU or the GPU; a block's stored image in DRAM
 *   restore_stream.c  the pipelined restore straight from the SSD
 *   restore_jobs.c    the job queue, the restoration threads, wait, ahead
 *                     -> restore_image.c, restore_stream.c
 *   restore_dev.c     restoration straight into the device pool
 *                     -> restore_image.c, restore_jobs.c
 *   restore_plan.c    start-up (checkpoints, profile, plans, the split of
 *                     HIDDEN writes), shutdown, the stats lines
 *                     -> restore_jobs.c
 *
 * Locking: rp->lock guards the queue, the active list and every job's
 * fields except the result, which only the job's runner writes before it
 * marks the job done (waiters read it after seeing done under the lock).
 * rp->lock is innermost: nothing is called with it held.
 */
#ifndef KVFS_CACHE_RPOOL_I_H
#define KVFS_CACHE_RPOOL_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/cache_i.h"

/* Enough to overlap one restoration with the I/O of the next; more would
 * only split the BLAS threads further.
 */
#define KVFS_RPOOL_THREADS 2

struct kvfs_rjob; /* restore_jobs.c */

/* One per engine (c->rpool), from kvfs_rpool_start() to kvfs_rpool_free(). */
struct kvfs_rpool {
	pthread_mutex_t lock; /* innermost: see above */
	pthread_cond_t work; /* queue not empty, or stop; with rp->lock */
	pthread_cond_t done; /* some job finished; with rp->lock */
	struct kvfs_rjob *qhead, *qtail; /* rp->lock: waiting for a thread */
	struct kvfs_rjob *active; /* rp->lock: every job not done */
	/* Written by kvfs_rpool_threads_start() before any job exists,
	 * read by kvfs_rpool_stop().
	 */
	pthread_t thr[KVFS_RPOOL_THREADS];
	/* rp->lock: started and not yet joined; the stats line reads it
	 * without the lock.
	 */
	unsigned n_threads;
	bool stop; /* rp->lock */
	/* Restorations straight into the device pool on the CPU; guarded
	 * by c->gpu_load_lock (they run only under it).  NULL until the
	 * first.
	 */
	struct kvfs_restore_ws *dev_ws;
};

/* ------------------------------------------------ for the engine's files */

/*
 * kvfs_rpool_start() - load the checkpoint of every namespace whose config
 *   has weights (a bad one refuses the start, naming the tensor), profile
 *   it, start its device restorer (the GPU's profile, when it has one),
 *   plan it with the projection time of whoever restores, decide what
 *   HIDDEN writes are stored as, and start the restoration threads (none
 *   under KVFS_CACHE_NOTHREADS).  Namespaces must be set up and the tiers
 *   open; called once, before the mount serves requests, so no lock.
 *   0 or -errno (logged); on failure the caller still calls
 *   kvfs_rpool_free().
 */
int kvfs_rpool_start(struct kvfs_cache *c);
/*
 * kvfs_rpool_stop() - finish the jobs readers wait for, drop the others,
 *   join the threads.  Later waits restore in the caller's thread.  A
 *   no-op without a pool.  Takes rp->lock; the caller holds no engine lock.
 */
void kvfs_rpool_stop(struct kvfs_cache *c);
/*
 * kvfs_rpool_free() - stop, then free the pool and every namespace's
 *   checkpoint and GPU restorer.  NULL pool is ok.  At shutdown, when
 *   nothing else runs.
 */
void kvfs_rpool_free(struct kvfs_cache *c);
/*
 * kvfs_rpool_wait() - for a read of @b (kind HIDDEN or MIXED, held by
 *   an open): submit its restoration or join the one under way, and
 *   wait.  The restoration runs on the namespace's GPU restorer when it
 *   has one, on the CPU when not or when the GPU fails (logged,
 *   restore.gpu_fallbacks).  Returns 0 when the DRAM copy now is (or
 *   was) the KV image (the caller looks again), or 0 with *@priv set to a
 *   private KV image of *@priv_len bytes (malloc'd, the reader's to free)
 *   when the result could not be kept in DRAM; -EIO (no pool, or no
 *   weights, logged), -ENOMEM, or the load's error (-EBADMSG: the SSD
 *   copy failed verification).  Takes no engine lock on entry; must not
 *   be called under one.
 */
int kvfs_rpool_wait(struct kvfs_cache *c, struct kvfs_block *b, void **priv,
		    uint64_t *priv_len);
/*
 * kvfs_rpool_ahead() - submit @b's restoration without waiting (promotion,
 *   PREFETCH); a no-op for other kinds, without threads, or when a job
 *   for @b exists.  Failures are silent (the read restores).  May be
 *   called under b->io_lock; takes rp->lock.
 */
void kvfs_rpool_ahead(struct kvfs_cache *c, struct kvfs_block *b);
/*
 * kvfs_rpool_build() - from a verified stored image @h (@h_len bytes,
 *   kind HIDDEN or MIXED) of @ns, build into @dst (@dst_len >= its size;
 *   the tail is zeroed) the image of split @kv_from (< the source's):
 *   0 gives the KV file a read serves, 0 < kv_from < n_layers the MIXED
 *   image a HIDDEN write is stored as.  Same key, parent, tokens and
 *   start_pos; both CRCs.  Always on the CPU, with workspace @ws (NULL:
 *   one of its own for the call).  0, -EINVAL (no weights; an image that
 *   cannot be restored, logged; @dst too small), -ENOMEM.  Takes no lock:
 *   @h and @dst are the caller's for the call.
 */
int kvfs_rpool_build(struct kvfs_ns *ns, struct kvfs_restore_ws *ws,
		     const uint8_t *h, uint64_t h_len, uint32_t kv_from,
		     uint8_t *dst, uint64_t dst_len);
/*
 * kvfs_rpool_to_device() - restore each of @b[0..n) (kind HIDDEN or
 *   MIXED) straight into its pool extent @e[i] (allocated by the caller,
 *   at least b[i]->size bytes): the KV file image a read serves, laid out
 *   as kvfs_gpu_load() uploads one, with no KV image in DRAM.  The stored
 *   image comes from the DRAM copy (held under b->readers) or a private,
 *   verified load from the SSD.  On the GPU (KVFS_HC_DEV_GPU) the blocks
 *   of a namespace go through its restorer in batches of up to 32, one
 *   GEMM a layer for the batch; the header goes in with its payload CRC
 *   unfilled and @nocrc[i] is set (see KVFS_B_GPU_NOCRC); otherwise the
 *   image is complete.  @res[i] receives block i's result: 0 (counted in
 *   restore.blocks and restore.to_device); 1 when it should take the
 *   usual path (not a stored image that needs restoring, no device
 *   restorer, a restoration job for it under way, which the usual path
 *   joins, or its DRAM copy already the KV image); -ENOENT (deleted),
 *   -EBADMSG (the SSD copy fails verification, logged), or another -errno
 *   (logged; a batch's failure is each member's) after which the caller
 *   may take the usual path.  Returns 0, or -ENOMEM with nothing done.
 *   Caller holds c->gpu_load_lock and a reference on each block, no
 *   other engine lock.
 */
int kvfs_rpool_to_device(struct kvfs_cache *c, struct kvfs_block **b,
			 const struct kvfs_extent *e, bool *nocrc, int *res,
			 size_t n);
/*
 * kvfs_rpool_stats() - print the restoration lines of .kvfs/stats to @f:
 *   the engine's counters, then per namespace with weights or hidden
 *   blocks its split, profile and plans.  Reads atomics and fields fixed
 *   at start; takes no lock.
 */
void kvfs_rpool_stats(struct kvfs_cache *c, FILE *f);

/* ------------------------------------------ between the pool's own files */

/* restore_image.c */

/* The stored image of a block in DRAM, to restore from. */
struct kvfs_rpool_src {
	const uint8_t *p;
	uint64_t len;
	bool in_dram; /* b->readers counts us */
};

/*
 * kvfs_rpool_src_get() - take @b's DRAM copy as the stored image to
 *   restore from, counted in b->readers until kvfs_rpool_src_put().
 *   Returns 0 with @s filled; 1 when the DRAM copy is already the KV
 *   image; -ENOENT when there is none (@s is then cleared).  Lock-free.
 */
int kvfs_rpool_src_get(struct kvfs_block *b, struct kvfs_rpool_src *s);
/* Release what kvfs_rpool_src_get() took, if anything, and clear @s.  A
 * source the caller filled itself (in_dram false) is only cleared.
 */
void kvfs_rpool_src_put(struct kvfs_block *b, struct kvfs_rpool_src *s);
/* Whether @b's DRAM copy is the KV image: a look counted in b->readers,
 * lock-free.
 */
bool kvfs_rpool_dram_is_kv(struct kvfs_block *b);
/*
 * kvfs_rpool_gpu_req() - the GPU request that rebuilds the hidden layers
 *   of @ns's stored image @h (@h_len bytes, HIDDEN or MIXED): layers below
 *   the stored kv_from, the whole KV payload named as the destination
 *   (io->kv and io->flags are left for the caller).  @hd receives the
 *   header, @size the KV file's size.  The request names whole payloads;
 *   only the hidden layers' part of the stored one is read, and it must
 *   lie inside the image.  0 or -EINVAL.  No lock.
 */
int kvfs_rpool_gpu_req(struct kvfs_ns *ns, const uint8_t *h, uint64_t h_len,
		       struct kvfs_fmt_hdr *hd, uint64_t *size,
		       struct kvfs_restore_io *io);
/*
 * kvfs_rpool_gpu_kv_tail() - where the K and V layers of a MIXED image
 *   (@src_from < n_layers, @n tokens under @g) start in the stored image
 *   of @h_len bytes (*@so) and in the KV file of @size bytes (*@ko): they
 *   follow each other at the end of both layouts, so one copy of
 *   @size - *@ko bytes moves them.  0 or -EINVAL.  No lock.
 */
int kvfs_rpool_gpu_kv_tail(const struct kvfs_geom *g, uint32_t n,
			   uint32_t src_from, uint64_t h_len, uint64_t size,
			   uint64_t *so, uint64_t *ko);
/*
 * kvfs_rpool_build_read() - the KV file of @b's stored image @h (@h_len
 *   bytes) into @dst (@dst_len bytes, the tail zeroed) for a read or a
 *   restoration ahead of need: on the GPU when the namespace has a GPU
 *   restorer, on the CPU (@ws, may be NULL) otherwise or when the GPU
 *   fails (logged, restore.gpu_fallbacks; restore.gpu_blocks counts
 *   successes).  Returns kvfs_rpool_build()'s.  No engine lock needed;
 *   the GPU restorer serialises on its own mutex.
 */
int kvfs_rpool_build_read(struct kvfs_cache *c, struct kvfs_block *b,
			  struct kvfs_restore_ws *ws, const uint8_t *h,
			  uint64_t h_len, uint8_t *dst, uint64_t dst_len);

/* restore_stream.c */

/*
 * kvfs_rpool_stream() - restore @b, which has no DRAM copy, straight from
 *   its SSD image with the I/O of later layers overlapping the projection
 *   of earlier ones (kvfs_cache_restore_stream(); @ws may be NULL).
 *   Returns 0 with the KV image published as the DRAM copy (*@img NULL)
 *   or kept private in *@img (*@img_len bytes, aligned_alloc'd, the
 *   caller's; the policy kept it out of DRAM or no room could be made),
 *   -EAGAIN when a DRAM copy appeared meanwhile (restore from it
 *   instead), or -errno (-EBADMSG logged as a checksum failure, like any
 *   SSD copy that fails verification).  Caller holds a reference and an
 *   open on @b and no engine lock; takes b->lock, then b->io_lock for the
 *   stream.
 */
int kvfs_rpool_stream(struct kvfs_cache *c, struct kvfs_block *b,
		      struct kvfs_restore_ws *ws, uint8_t **img,
		      uint64_t *img_len);

/* restore_jobs.c */

/*
 * kvfs_rpool_threads_start() - start @n (<= KVFS_RPOOL_THREADS)
 *   restoration threads on c->rpool, after sharing the CPUs' BLAS threads
 *   between them.  0, or the -errno of a failed pthread_create() (logged;
 *   the threads started so far stay counted for kvfs_rpool_stop()).
 *   Called once from kvfs_rpool_start(), before any job exists.
 */
int kvfs_rpool_threads_start(struct kvfs_cache *c, unsigned n);
/*
 * kvfs_rpool_busy() - whether a restoration job for @b is under way (not
 *   done).  False without a pool.  Takes rp->lock.
 */
bool kvfs_rpool_busy(struct kvfs_cache *c, const struct kvfs_block *b);

#endif
