/* SPDX-License-Identifier: MIT */
/*
 * The cuda device tier: one cudaMalloc'd pool per owner uid on one device,
 * each exported once with cudaIpcGetMemHandle, and copies driven through
 * the CUDA runtime API only (no kernels).  A pool is its own allocation,
 * so its IPC handle opens that owner's blocks and nothing else: an
 * importer maps the whole allocation a handle names, and carving one
 * allocation into per-owner ranges would have handed every owner all of
 * them.  The pools are made at init, owner_capacity bytes each; the
 * capacity stays one budget they share (gpu/gpu_pools.c).
 *
 * Host memory handed to the tier is, in general, ordinary pageable
 * memory, which the copy engines cannot read directly at full speed, so
 * such copies go through pinned staging buffers.  Each stream owns a small
 * ring of them: while chunk i is in flight, the calling thread packs chunk
 * i + 1 into the next buffer (host -> device) or unpacks a finished chunk
 * (device -> host).  A chunk packs as many transfers as fit, and transfers
 * whose device ranges touch become one cudaMemcpyAsync, so a batch of many
 * blocks is a few large copies and one synchronisation.
 *
 * The packing memcpy is one CPU thread's bandwidth, well under what a
 * PCIe Gen5 copy engine moves.  So host memory can be registered once
 * (host_register: the DRAM tier's arena, pinned with cudaHostRegister):
 * a transfer whose host range lies inside a registered region is issued
 * as a cudaMemcpyAsync on the block's own bytes ("direct"), transfers
 * that continue each other in both device and host memory merging into
 * one copy; the rest of the batch is staged as before.  Both kinds go on
 * the same stream in the batch's order, so the one synchronisation at
 * the end still covers everything, and a caller may reuse its buffers as
 * soon as the call returns, exactly as with staging alone.
 *
 * Streams are independent: a caller takes any free one (trying them from
 * its own starting point, like the SSD tier's rings) and holds it for the
 * whole batch; nothing else on the copy path is shared.
 *
 * Opened IPC handles are kept in a small cache, since opening one costs
 * far more than a copy and an engine sends the same handle on every
 * request.  The cache is per process, not per tier, because the driver
 * maps a handle once per process and context.  An unused entry stays open
 * until the cache is full or the last tier is freed; while it is open the
 * client's allocation stays alive on the device.
 *
 * Built only with KVFS_HAVE_CUDA; otherwise kvfs_gpu_cuda_init() says so.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>

#include "gpu/gpu.h"
#include "meta/log.h"

#ifndef KVFS_HAVE_CUDA

int kvfs_gpu_cuda_init(int device, uint64_t capacity, unsigned flags,
		       struct kvfs_tier **out)
{
	kvfs_err("cuda: this kvfs was built without the CUDA toolkit");
	return -EOPNOTSUPP;
}

int kvfs_gpu_cuda_init_owners(int device, uint64_t capacity, unsigned flags,
			      const struct kvfs_gpu_owners *o,
			      struct kvfs_tier **out)
{
	return kvfs_gpu_cuda_init(device, capacity, flags, out);
}

#else /* KVFS_HAVE_CUDA */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "tier/tier.h"
#include "gpu/gpu_i.h"
#define KVFS_CUDA_WHO "cuda"
#include "gpu/cuda_i.h"
#include "meta/util.h"

#define CUDA_STREAMS 4u
#define CUDA_SLOTS 4u                 /* staging buffers per stream */
#define CUDA_SLOT_BYTES (4ull << 20)  /* bytes per staging buffer */
#define CUDA_IPC_CACHE 16u            /* opened handles kept unused */
#define CUDA_REGIONS 8u               /* registered host regions */

_Static_assert(sizeof(cudaIpcMemHandle_t) ==
	       sizeof(((struct kvfs_ctl_mem *)0)->ipc), "IPC handle size");

/* cuMemGetAddressRange, reached through the runtime so that nothing links
 * against the driver library.
 */
typedef CUresult (*cuda_range_fn)(CUdeviceptr *base, size_t *size,
				  CUdeviceptr ptr);

struct cuda_slot {
	unsigned char *buf;  /* pinned, CUDA_SLOT_BYTES */
	cudaEvent_t done;    /* recorded after the copies that use buf */
	bool busy;           /* done recorded and not yet waited for */
	/* device -> host: the bytes to unpack once done fires */
	size_t from_i;       /* first job */
	uint64_t from_o;     /* offset in that job */
	uint64_t fill;       /* bytes in buf */
};

struct cuda_stream {
	pthread_mutex_t lock;
	cudaStream_t st;                   /* guarded by lock */
	struct cuda_slot slot[CUDA_SLOTS]; /* guarded by lock */
	unsigned next;                     /* guarded by lock: ring position */
};

/* One opened IPC handle. */
struct cuda_ipc {
	uint8_t handle[sizeof(cudaIpcMemHandle_t)];
	int device;          /* where it is mapped */
	unsigned char *dptr;
	uint64_t alloc_size; /* bytes mapped at dptr; 0 when unknown */
	unsigned refs;       /* open peers using it */
	uint64_t last_use;   /* ipc_clock at the last open */
	struct cuda_ipc *next;
};

/* Host memory registered with host_register. */
struct cuda_region {
	unsigned char *base;
	uint64_t len;
};

struct cuda_tier {
	struct kvfs_gpu_tier g;
	int device;                  /* immutable */
	cuda_range_fn range;         /* immutable; NULL if unavailable */
	/* Immutable after init but each map (own lock); base a device
	 * pointer, desc.ipc its handle.
	 */
	struct kvfs_gpu_pools pools;
	unsigned nstreams;           /* streams set up; immutable after init */
	struct cuda_stream streams[CUDA_STREAMS];
	bool live;                   /* counted in cuda_tiers */
	/*
	 * reg_lock guards regs and nregs. A batch holds it for reading from
	 * the moment it decides which transfers go direct until its copies
	 * are complete, so a region is never unregistered under a copy;
	 * host_register/unregister take it for writing. Taken before a
	 * stream's lock, never after.
	 */
	pthread_rwlock_t reg_lock;
	struct cuda_region regs[CUDA_REGIONS];
	unsigned nregs;
};

/* The process's opened IPC handles. */
static pthread_mutex_t cuda_ipc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cuda_ipc *cuda_ipcs;  /* guarded by cuda_ipc_lock */
static unsigned cuda_nipcs;         /* guarded by cuda_ipc_lock */
static uint64_t cuda_ipc_clock;     /* guarded by cuda_ipc_lock */
static unsigned cuda_tiers;         /* guarded by cuda_ipc_lock: live tiers */

/* One host<->device copy of a batch. */
struct cuda_job {
	unsigned char *dev;
	unsigned char *host;
	uint64_t len;
	/* set by cuda_classify(): the registered region holding the host
	 * range, or -1 to stage it
	 */
	int reg;
};

static _Thread_local unsigned cuda_hint;
static _Thread_local bool cuda_hint_set;
static atomic_uint cuda_hint_next;

static struct cuda_tier *to_cuda(struct kvfs_tier *t)
{
	return (struct cuda_tier *)t;
}

/* The runtime's current device is per thread: set it on every entry. */
static int cuda_enter(struct cuda_tier *ct)
{
	return CUDA_TRY(cudaSetDevice(ct->device));
}

static struct cuda_stream *cuda_stream_get(struct cuda_tier *ct)
{
	unsigned start;

	if (!cuda_hint_set) {
		cuda_hint = atomic_fetch_add(&cuda_hint_next, 1);
		cuda_hint_set = true;
	}
	start = cuda_hint % ct->nstreams;
	for (unsigned i = 0; i < ct->nstreams; i++) {
		struct cuda_stream *s;

		s = &ct->streams[(start + i) % ct->nstreams];

		if (!pthread_mutex_trylock(&s->lock))
			return s;
	}
	pthread_mutex_lock(&ct->streams[start].lock);
	return &ct->streams[start];
}

static void cuda_stream_put(struct cuda_stream *s)
{
	pthread_mutex_unlock(&s->lock);
}

/* Wait for everything issued on @s; the staging ring is free afterwards. */
static int cuda_stream_finish(struct cuda_stream *s)
{
	int err = CUDA_TRY(cudaStreamSynchronize(s->st));

	for (unsigned k = 0; k < CUDA_SLOTS; k++)
		s->slot[k].busy = false;
	return err;
}

static int cuda_copy(struct cuda_stream *s, void *dst, const void *src,
		     uint64_t len, enum cudaMemcpyKind kind)
{
	return CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)len, kind, s->st));
}

/*
 * Copies in the making: a device range and the host bytes that match it
 * (a staging buffer's, or a registered region's). Pieces that continue
 * both, within one host allocation, become one copy.
 */
struct cuda_span {
	unsigned char *dev, *buf;
	uint64_t len;
	enum cudaMemcpyKind kind;
	int reg; /* the region of buf, or -1 for a staging buffer */
};

static int cuda_span_flush(struct cuda_stream *s, struct cuda_span *sp)
{
	int err = 0;

	if (sp->len && sp->kind == cudaMemcpyHostToDevice)
		err = cuda_copy(s, sp->dev, sp->buf, sp->len, sp->kind);
	else if (sp->len)
		err = cuda_copy(s, sp->buf, sp->dev, sp->len, sp->kind);
	sp->len = 0;
	return err;
}

static int cuda_span_add(struct cuda_stream *s, struct cuda_span *sp,
			 unsigned char *dev, unsigned char *buf, uint64_t len,
			 int reg)
{
	int err;

	if (sp->len && sp->reg == reg && sp->dev + sp->len == dev &&
	    sp->buf + sp->len == buf) {
		sp->len += len;
		return 0;
	}
	err = cuda_span_flush(s, sp);
	sp->dev = dev;
	sp->buf = buf;
	sp->len = len;
	sp->reg = reg;
	return err;
}

/* Drop region @r; with reg_lock held for writing, or from teardown. */
static int cuda_region_drop(struct cuda_tier *ct, unsigned r)
{
	int err = CUDA_TRY(cudaHostUnregister(ct->regs[r].base));

	ct->regs[r] = ct->regs[--ct->nregs];
	return err;
}

/* Issue what @sl holds and mark it in flight (when it holds anything). */
static int cuda_slot_close(struct cuda_stream *s, struct cuda_slot *sl,
			   struct cuda_span *sp)
{
	int err = cuda_span_flush(s, sp);

	if (!err && sl->fill) {
		err = CUDA_TRY(cudaEventRecord(sl->done, s->st));
		sl->busy = !err;
	}
	return err;
}

/*
 * Mark each job direct (its host range inside a registered region) or
 * staged, and add up the bytes of each kind. Called with reg_lock held
 * for reading, which the caller keeps until the jobs' copies are done.
 */
static void cuda_classify(struct cuda_tier *ct, struct cuda_job *j, size_t n,
			  uint64_t *direct, uint64_t *staged)
{
	*direct = *staged = 0;
	for (size_t i = 0; i < n; i++) {
		uintptr_t h = (uintptr_t)j[i].host;

		j[i].reg = -1;
		for (unsigned r = 0; r < ct->nregs && j[i].len; r++) {
			uintptr_t b = (uintptr_t)ct->regs[r].base;
			uint64_t rl = ct->regs[r].len;

			if (h >= b && h - b <= rl && j[i].len <= rl - (h - b)) {
				j[i].reg = (int)r;
				break;
			}
		}
		if (j[i].reg >= 0)
			*direct += j[i].len;
		else
			*staged += j[i].len;
	}
}

/* Take the next slot of the ring once its last copies are complete. */
static struct cuda_slot *cuda_slot_next(struct cuda_stream *s, int *err)
{
	struct cuda_slot *sl = &s->slot[s->next];

	if (sl->busy) {
		*err = CUDA_TRY(cudaEventSynchronize(sl->done));
		if (*err)
			return NULL;
		sl->busy = false;
	}
	s->next = (s->next + 1) % CUDA_SLOTS;
	return sl;
}

/*
 * Host -> device for @n jobs on @s, which the caller holds, in job order:
 * a direct job is one copy from its own bytes (merged with the next when
 * they continue each other); staged jobs are packed into a slot, whose
 * copies are issued while the next slot is packed. Complete on return,
 * also on error.
 */
static int cuda_h2d(struct cuda_stream *s, const struct cuda_job *j, size_t n)
{
	struct cuda_span dsp = { .kind = cudaMemcpyHostToDevice };
	struct cuda_span sp = { .kind = cudaMemcpyHostToDevice };
	struct cuda_slot *sl = NULL;
	size_t i = 0;
	uint64_t o = 0;
	int err = 0, fin;

	while (i < n && !err) {
		uint64_t k;

		if (j[i].reg >= 0) {
			/* What is packed so far is issued first. */
			err = cuda_span_flush(s, &sp);
			if (!err)
				err = cuda_span_add(s, &dsp, j[i].dev,
						    j[i].host, j[i].len,
						    j[i].reg);
			i++;
			continue;
		}
		/* Issued before a wait for a slot, so the copy engine has
		 * the direct copies to work on meanwhile.
		 */
		err = cuda_span_flush(s, &dsp);
		if (!err && !sl) {
			sl = cuda_slot_next(s, &err);
			if (sl)
				sl->fill = 0;
		}
		if (err || !sl)
			break;
		k = j[i].len - o;
		if (k > CUDA_SLOT_BYTES - sl->fill)
			k = CUDA_SLOT_BYTES - sl->fill;
		if (k) {
			memcpy(sl->buf + sl->fill, j[i].host + o, k);
			err = cuda_span_add(s, &sp, j[i].dev + o,
					    sl->buf + sl->fill, k, -1);
			sl->fill += k;
			o += k;
		}
		if (o == j[i].len) {
			i++;
			o = 0;
		}
		if (!err && sl->fill == CUDA_SLOT_BYTES) {
			err = cuda_slot_close(s, sl, &sp);
			sl = NULL;
		}
	}
	if (!err)
		err = cuda_span_flush(s, &dsp);
	if (!err && sl)
		err = cuda_slot_close(s, sl, &sp);
	fin = cuda_stream_finish(s);
	return err ? err : fin;
}

/* Copy a finished device -> host slot out to the jobs' host buffers. */
static int cuda_unpack(struct cuda_slot *sl, const struct cuda_job *j)
{
	size_t i = sl->from_i;
	uint64_t o = sl->from_o, left = sl->fill, pos = 0;
	int err = CUDA_TRY(cudaEventSynchronize(sl->done));

	sl->busy = false;
	if (err)
		return err;
	while (left) {
		uint64_t k = j[i].len - o;

		if (j[i].reg >= 0) {
			/* copied straight into place */
			i++;
			continue;
		}
		if (k > left)
			k = left;
		memcpy(j[i].host + o, sl->buf + pos, k);
		pos += k;
		o += k;
		left -= k;
		if (o == j[i].len) {
			i++;
			o = 0;
		}
	}
	return 0;
}

/*
 * Device -> host for @n jobs on @s, in job order: a direct job is one copy
 * into its own bytes; staged jobs fill slots around the ring, and a slot
 * is unpacked when the ring comes back to it, so that up to CUDA_SLOTS - 1
 * chunks stay in flight while the CPU unpacks.
 */
static int cuda_d2h(struct cuda_stream *s, const struct cuda_job *j, size_t n)
{
	struct cuda_span dsp = { .kind = cudaMemcpyDeviceToHost };
	struct cuda_span sp = { .kind = cudaMemcpyDeviceToHost };
	struct cuda_slot *sl = NULL;
	size_t i = 0;
	uint64_t o = 0;
	int err = 0, fin;

	while (i < n && !err) {
		uint64_t k;

		if (j[i].reg >= 0) {
			err = cuda_span_flush(s, &sp);
			if (!err)
				err = cuda_span_add(s, &dsp, j[i].dev,
						    j[i].host, j[i].len,
						    j[i].reg);
			i++;
			continue;
		}
		err = cuda_span_flush(s, &dsp);
		if (!err && !sl) {
			sl = &s->slot[s->next];
			if (sl->busy && (err = cuda_unpack(sl, j)))
				break;
			s->next = (s->next + 1) % CUDA_SLOTS;
			sl->from_i = i;
			sl->from_o = o;
			sl->fill = 0;
		}
		if (err)
			break;
		k = j[i].len - o;
		if (k > CUDA_SLOT_BYTES - sl->fill)
			k = CUDA_SLOT_BYTES - sl->fill;
		if (k) {
			err = cuda_span_add(s, &sp, j[i].dev + o,
					    sl->buf + sl->fill, k, -1);
			sl->fill += k;
			o += k;
		}
		if (o == j[i].len) {
			i++;
			o = 0;
		}
		if (!err && sl->fill == CUDA_SLOT_BYTES) {
			err = cuda_slot_close(s, sl, &sp);
			sl = NULL;
		}
	}
	if (!err)
		err = cuda_span_flush(s, &dsp);
	if (!err && sl)
		err = cuda_slot_close(s, sl, &sp);
	/* Oldest first: the slot after the last one filled. */
	for (unsigned c = 0; c < CUDA_SLOTS && !err; c++) {
		struct cuda_slot *q = &s->slot[(s->next + c) % CUDA_SLOTS];

		if (q->busy)
			err = cuda_unpack(q, j);
	}
	fin = cuda_stream_finish(s);
	return err ? err : fin;
}

static void cuda_count_host(struct cuda_tier *ct, uint64_t direct,
			    uint64_t staged)
{
	struct kvfs_tier_stats *st = &ct->g.base.st;

	atomic_fetch_add_explicit(&st->direct_bytes, direct,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&st->staged_bytes, staged,
				  memory_order_relaxed);
}

/* Run host jobs in one direction on a stream of @ct: direct where the
 * host side is registered, staged elsewhere.
 */
static int cuda_run(struct cuda_tier *ct, struct cuda_job *j, size_t n,
		    bool to_device)
{
	struct cuda_stream *s;
	uint64_t direct, staged;
	int err = cuda_enter(ct);

	if (err)
		return err;
	pthread_rwlock_rdlock(&ct->reg_lock);
	cuda_classify(ct, j, n, &direct, &staged);
	s = cuda_stream_get(ct);
	err = to_device ? cuda_h2d(s, j, n) : cuda_d2h(s, j, n);
	cuda_stream_put(s);
	pthread_rwlock_unlock(&ct->reg_lock);
	if (!err)
		cuda_count_host(ct, direct, staged);
	return err;
}

static unsigned char *cuda_at(struct kvfs_tier *t, const struct kvfs_extent *e,
			      uint64_t off)
{
	return kvfs_gpu_pool_of(t, e)->base + e->off + off;
}

/* ---- base tier ops ---- */

static int cuda_alloc_owner(struct kvfs_tier *t, uint32_t owner, uint64_t len,
			    struct kvfs_extent *e)
{
	/* ptr stays NULL: the pool is not host-addressable. */
	return kvfs_gpu_pool_alloc(t, owner, len, e, "cuda");
}

static int cuda_alloc(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e)
{
	return cuda_alloc_owner(t, to_cuda(t)->pools.p[0].owner, len, e);
}

static void cuda_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	kvfs_gpu_pool_free(t, e, NULL);
}

static int cuda_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return kvfs_gpu_pool_claim(t, e);
}

static int cuda_write(struct kvfs_tier *t, const struct kvfs_extent *e,
		      uint64_t off, const void *buf, uint64_t len)
{
	struct cuda_job j;
	int err = kvfs_gpu_ext_check(t, e, off, buf, len, "cuda", "write");

	if (err)
		return err;
	j.dev = cuda_at(t, e, off);
	j.host = (unsigned char *)buf;
	j.len = len;
	err = len ? cuda_run(to_cuda(t), &j, 1, true) : 0;
	kvfs_tier_count(&t->st.writes, &t->st.bytes_written, 1,
			err ? 0 : len);
	return err;
}

static int cuda_read(struct kvfs_tier *t, const struct kvfs_extent *e,
		     uint64_t off, void *buf, uint64_t len)
{
	struct cuda_job j;
	int err = kvfs_gpu_ext_check(t, e, off, buf, len, "cuda", "read");

	if (err)
		return err;
	j.dev = cuda_at(t, e, off);
	j.host = buf;
	j.len = len;
	err = len ? cuda_run(to_cuda(t), &j, 1, false) : 0;
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, 1, err ? 0 : len);
	return err;
}

static int cuda_readv(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n)
{
	struct cuda_job *j;
	size_t nj = 0;
	uint64_t bytes = 0;
	int err = 0, first = 0;

	if (!n)
		return 0;
	j = calloc(n, sizeof(*j));
	if (!j)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		io[i].res = kvfs_gpu_ext_check(t, io[i].ext, io[i].off,
					       io[i].buf, io[i].len, "cuda",
					       "readv");
		if (io[i].res)
			continue;
		j[nj].dev = cuda_at(t, io[i].ext, io[i].off);
		j[nj].host = io[i].buf;
		j[nj].len = io[i].len;
		bytes += io[i].len;
		nj++;
	}
	if (nj)
		err = cuda_run(to_cuda(t), j, nj, false);
	for (size_t i = 0; i < n; i++) {
		if (!io[i].res)
			io[i].res = err;
		kvfs_tier_io_done(&io[i]);
		if (io[i].res && !first)
			first = io[i].res;
	}
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, nj, err ? 0 : bytes);
	free(j);
	return first;
}

static int cuda_sync(struct kvfs_tier *t)
{
	/* Every call waits for its own copies before it returns. */
	return 0;
}

static void *cuda_map(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return NULL;
}

static void cuda_ipc_close(struct cuda_ipc *c)
{
	cudaError_t e = cudaIpcCloseMemHandle(c->dptr);

	if (e != cudaSuccess)
		kvfs_cuda_fail(e, KVFS_CUDA_WHO ": cudaIpcCloseMemHandle");
	free(c);
}

/* Free whatever init set up; every field may still be empty. */
static void cuda_teardown(struct cuda_tier *ct)
{
	bool dev = cudaSetDevice(ct->device) == cudaSuccess;

	pthread_mutex_lock(&cuda_ipc_lock);
	if (ct->live && !--cuda_tiers) {
		/*
		 * The last tier: close every idle handle. One still in use
		 * is a caller's bug; it stays mapped rather than leave a peer
		 * pointing at freed memory.
		 */
		struct cuda_ipc **pp = &cuda_ipcs;

		while (*pp) {
			struct cuda_ipc *c = *pp;

			if (c->refs) {
				kvfs_warn("cuda: last tier freed with %u peers "
					  "of a handle still open", c->refs);
				pp = &c->next;
				continue;
			}
			*pp = c->next;
			cuda_nipcs--;
			cudaSetDevice(c->device);
			cuda_ipc_close(c);
		}
		if (dev)
			cudaSetDevice(ct->device);
	}
	pthread_mutex_unlock(&cuda_ipc_lock);
	for (unsigned i = 0; i < ct->nstreams; i++) {
		struct cuda_stream *s = &ct->streams[i];

		if (dev && s->st)
			cudaStreamSynchronize(s->st);
		for (unsigned k = 0; k < CUDA_SLOTS; k++) {
			if (s->slot[k].done)
				cudaEventDestroy(s->slot[k].done);
			if (s->slot[k].buf)
				cudaFreeHost(s->slot[k].buf);
		}
		if (s->st)
			cudaStreamDestroy(s->st);
		pthread_mutex_destroy(&s->lock);
	}
	/* Every copy is complete: nothing reads the regions any more. */
	if (ct->nregs) {
		kvfs_info("cuda: host<->device copies: %" PRIu64 " bytes "
			  "direct, %" PRIu64 " staged",
			  (uint64_t)atomic_load(&ct->g.base.st.direct_bytes),
			  (uint64_t)atomic_load(&ct->g.base.st.staged_bytes));
	}
	while (ct->nregs)
		(void)cuda_region_drop(ct, ct->nregs - 1);
	pthread_rwlock_destroy(&ct->reg_lock);
	for (size_t i = 0; i < KVFS_GPU_OWNERS_MAX; i++)
		if (ct->pools.p[i].base)
			cudaFree(ct->pools.p[i].base);
	kvfs_gpu_pools_release(&ct->pools);
	(void)cudaGetLastError();
	free(ct);
}

static void cuda_release(struct kvfs_tier *t)
{
	cuda_teardown(to_cuda(t));
}

const struct kvfs_tier_ops kvfs_gpu_cuda_tier_ops = {
	.name = "cuda",
	.alloc = cuda_alloc,
	.free = cuda_free,
	.claim = cuda_claim,
	.write = cuda_write,
	.read = cuda_read,
	.readv = cuda_readv,
	.sync = cuda_sync,
	.map = cuda_map,
	.release = cuda_release,
};

/* ---- device ops ---- */

static void cuda_describe(struct kvfs_tier *t, struct kvfs_ctl_mem *out)
{
	*out = to_cuda(t)->pools.p[0].desc;
}

/*
 * Open @handle on @ct's device, or take it from the cache. Called with
 * cuda_ipc_lock held, and the device current.
 */
static int cuda_ipc_get(struct cuda_tier *ct, const uint8_t *handle,
			struct cuda_ipc **out)
{
	struct cuda_ipc *c, **pp, **victim = NULL;
	cudaIpcMemHandle_t h;
	void *ptr = NULL;
	cudaError_t e;

	for (c = cuda_ipcs; c; c = c->next) {
		if (c->device == ct->device &&
		    !memcmp(c->handle, handle, sizeof(c->handle))) {
			c->refs++;
			c->last_use = ++cuda_ipc_clock;
			*out = c;
			return 0;
		}
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	memcpy(&h, handle, sizeof(h));
	e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess) {
		kvfs_err("cuda: peer: cudaIpcOpenMemHandle: %s (%s): not a "
			 "live handle of device %d's memory",
			 cudaGetErrorString(e), cudaGetErrorName(e),
			 ct->device);
		(void)cudaGetLastError();
		free(c);
		return -EINVAL;
	}
	c->dptr = ptr;
	if (ct->range) {
		CUdeviceptr base = 0;
		size_t size = 0;

		if (ct->range(&base, &size, (CUdeviceptr)(uintptr_t)ptr) ==
		    CUDA_SUCCESS && base <= (CUdeviceptr)(uintptr_t)ptr)
			c->alloc_size = size -
				((CUdeviceptr)(uintptr_t)ptr - base);
	}
	memcpy(c->handle, handle, sizeof(c->handle));
	c->device = ct->device;
	c->refs = 1;
	c->last_use = ++cuda_ipc_clock;
	/* Keep the cache bounded: close the least recently used idle one. */
	if (cuda_nipcs >= CUDA_IPC_CACHE) {
		for (pp = &cuda_ipcs; *pp; pp = &(*pp)->next)
			if (!(*pp)->refs &&
			    (!victim || (*pp)->last_use < (*victim)->last_use))
				victim = pp;
		if (victim) {
			struct cuda_ipc *v = *victim;

			*victim = v->next;
			cuda_nipcs--;
			cudaSetDevice(v->device);
			cuda_ipc_close(v);
			cudaSetDevice(ct->device);
		}
	}
	c->next = cuda_ipcs;
	cuda_ipcs = c;
	cuda_nipcs++;
	*out = c;
	return 0;
}

static void cuda_ipc_put(struct cuda_ipc *c)
{
	pthread_mutex_lock(&cuda_ipc_lock);
	c->refs--;
	pthread_mutex_unlock(&cuda_ipc_lock);
}

static int cuda_peer_open(struct kvfs_tier *t, const struct kvfs_ctl_mem *m,
			  struct kvfs_gpu_peer **out)
{
	struct cuda_tier *ct = to_cuda(t);
	struct kvfs_gpu_peer *p;
	struct cuda_ipc *c;
	int err;

	err = kvfs_gpu_mem_check(m, KVFS_CTL_BACKEND_CUDA, "cuda");
	if (err)
		return err;
	if (m->device != (uint32_t)ct->device) {
		kvfs_err("cuda: peer on device %" PRIu32 ", this pool is on "
			 "device %d", m->device, ct->device);
		return -EINVAL;
	}
	for (size_t i = 0; i < ct->pools.n; i++)
		if (!memcmp(m->ipc, ct->pools.p[i].desc.ipc, sizeof(m->ipc))) {
			kvfs_err("cuda: peer handle is one of this tier's "
				 "pools");
			return -EINVAL;
		}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	err = cuda_enter(ct);
	if (err)
		goto out_free_peer;
	pthread_mutex_lock(&cuda_ipc_lock);
	err = cuda_ipc_get(ct, m->ipc, &c);
	pthread_mutex_unlock(&cuda_ipc_lock);
	if (err)
		goto out_free_peer;
	if (c->alloc_size && c->alloc_size < m->size) {
		kvfs_err("cuda: peer allocation has %" PRIu64 " bytes, the "
			 "request says %" PRIu64, c->alloc_size, m->size);
		err = -EINVAL;
		goto out_put_ipc;
	}
	p->t = t;
	p->base = c->dptr;
	p->size = m->size;
	p->priv = c;
	*out = p;
	return 0;

out_put_ipc:
	cuda_ipc_put(c);
out_free_peer:
	free(p);
	return err;
}

static void cuda_peer_close(struct kvfs_tier *t, struct kvfs_gpu_peer *p)
{
	if (!p)
		return;
	if (kvfs_gpu_peer_check(t, p, "cuda", "peer_close"))
		return;
	cuda_ipc_put(p->priv);
	free(p);
}

/*
 * A peer batch: transfers with a pool side are device-to-device copies
 * issued first; host ones go direct or through the staging ring, whose
 * final synchronisation also covers the former. That is not the batch's
 * order (shm copies in array order), which is why kvfs_gpu_xfer_check()
 * refuses a batch whose destinations overlap: with disjoint destinations
 * the order cannot be seen, and both backends leave the same bytes.
 */
static int cuda_peer_xfer(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_gpu_xfer *x, size_t n,
			  bool to_peer)
{
	const char *what = to_peer ? "peer_write" : "peer_read";
	struct cuda_tier *ct = to_cuda(t);
	struct cuda_stream *s;
	struct cuda_job *j = NULL;
	uint64_t direct = 0, staged = 0;
	size_t nj = 0;
	int err;

	err = kvfs_gpu_peer_check(t, p, "cuda", what);
	if (!err)
		err = kvfs_gpu_xfer_check(t, x, n, p->size,
					  KVFS_GPU_X_PEER |
						  (to_peer ? KVFS_GPU_X_PEER_DST
							   : KVFS_GPU_X_SIDE_DST),
					  "cuda", what);
	if (err || !n)
		return err;
	j = calloc(n, sizeof(*j));
	if (!j)
		return -ENOMEM;
	err = cuda_enter(ct);
	if (err)
		goto out_free_jobs;
	pthread_rwlock_rdlock(&ct->reg_lock);
	s = cuda_stream_get(ct);
	for (size_t i = 0; i < n && !err; i++) {
		unsigned char *peer = p->base + x[i].peer_off, *pool;

		if (!x[i].len)
			continue;
		if (!x[i].pool) {
			j[nj].dev = peer;
			j[nj].host = x[i].host;
			j[nj].len = x[i].len;
			nj++;
			continue;
		}
		pool = cuda_at(t, x[i].pool, x[i].off);
		err = cuda_copy(s, to_peer ? peer : pool, to_peer ? pool : peer,
				x[i].len, cudaMemcpyDeviceToDevice);
	}
	if (err) {
		(void)cuda_stream_finish(s);
	} else {
		cuda_classify(ct, j, nj, &direct, &staged);
		err = to_peer ? cuda_h2d(s, j, nj) : cuda_d2h(s, j, nj);
	}
	cuda_stream_put(s);
	pthread_rwlock_unlock(&ct->reg_lock);
	if (!err) {
		cuda_count_host(ct, direct, staged);
		if (to_peer)
			kvfs_tier_count(&t->st.reads, &t->st.bytes_read, n,
					kvfs_gpu_xfer_bytes(x, n));
		else
			kvfs_tier_count(&t->st.writes, &t->st.bytes_written,
					n, kvfs_gpu_xfer_bytes(x, n));
	}
out_free_jobs:
	free(j);
	return err;
}

static int cuda_peer_write(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			   const struct kvfs_gpu_xfer *x, size_t n)
{
	return cuda_peer_xfer(t, p, x, n, true);
}

static int cuda_peer_read(struct kvfs_tier *t, struct kvfs_gpu_peer *p,
			  const struct kvfs_gpu_xfer *x, size_t n)
{
	return cuda_peer_xfer(t, p, x, n, false);
}

static int cuda_upload(struct kvfs_tier *t, const struct kvfs_gpu_xfer *x,
		       size_t n)
{
	struct cuda_job *j;
	int err = kvfs_gpu_xfer_check(t, x, n, 0, KVFS_GPU_X_UPLOAD, "cuda",
				      "upload");

	if (err || !n)
		return err;
	j = calloc(n, sizeof(*j));
	if (!j)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		j[i].dev = cuda_at(t, x[i].pool, x[i].off);
		j[i].host = x[i].host;
		j[i].len = x[i].len;
	}
	err = cuda_run(to_cuda(t), j, n, true);
	if (!err)
		kvfs_tier_count(&t->st.writes, &t->st.bytes_written, n,
				kvfs_gpu_xfer_bytes(x, n));
	free(j);
	return err;
}

/* Peer memory is device memory: never host-addressable. */
static void *cuda_peer_map(struct kvfs_tier *t, struct kvfs_gpu_peer *p)
{
	return NULL;
}

static int cuda_extent_addr(struct kvfs_tier *t, const struct kvfs_extent *e,
			    void **addr)
{
	if (!addr)
		return -EINVAL;
	*addr = NULL;
	if (kvfs_gpu_ext_check(t, e, 0, NULL, 0, "cuda", "extent_addr"))
		return -EINVAL;
	*addr = cuda_at(t, e, 0);
	return 0;
}

static int cuda_host_register(struct kvfs_tier *t, void *ptr, uint64_t len)
{
	struct cuda_tier *ct = to_cuda(t);
	unsigned char *p = ptr;
	uint64_t t0, dt;
	cudaError_t e;
	int err;

	if (!p || !len || len > SIZE_MAX || (uintptr_t)p > UINTPTR_MAX - len) {
		kvfs_err("cuda: host_register of %" PRIu64 " bytes at %p: "
			 "empty, NULL or past the address space", len, ptr);
		return -EINVAL;
	}
	err = cuda_enter(ct);
	if (err)
		return err;
	pthread_rwlock_wrlock(&ct->reg_lock);
	for (unsigned r = 0; r < ct->nregs; r++) {
		const struct cuda_region *g = &ct->regs[r];

		if (p < g->base + g->len && g->base < p + len) {
			kvfs_err("cuda: host_register: [%p, +%" PRIu64 ") "
				 "overlaps a registered region", ptr, len);
			err = -EINVAL;
			goto out_unlock;
		}
	}
	if (ct->nregs == CUDA_REGIONS) {
		kvfs_err("cuda: host_register: %u regions registered "
			 "already", CUDA_REGIONS);
		err = -EINVAL;
		goto out_unlock;
	}
	t0 = kvfs_util_now_mono();
	e = cudaHostRegister(ptr, (size_t)len, cudaHostRegisterPortable);
	dt = kvfs_util_now_mono() - t0;
	if (e != cudaSuccess) {
		kvfs_err("cuda: cudaHostRegister of %.1f MiB: %s (%s): the "
			 "pages could not be pinned (RLIMIT_MEMLOCK, or not "
			 "enough memory?)", (double)len / 1048576.0,
			 cudaGetErrorString(e), cudaGetErrorName(e));
		(void)cudaGetLastError();
		err = e == cudaErrorHostMemoryAlreadyRegistered ? -EINVAL :
		      e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
		goto out_unlock;
	}
	ct->regs[ct->nregs].base = p;
	ct->regs[ct->nregs].len = len;
	ct->nregs++;
	kvfs_info("cuda: pinned %.1f MiB of host memory for device %d in "
		  "%.1f ms: copies from and to it skip the staging buffers",
		  (double)len / 1048576.0, ct->device, (double)dt / 1e6);
out_unlock:
	pthread_rwlock_unlock(&ct->reg_lock);
	return err;
}

static int cuda_host_unregister(struct kvfs_tier *t, void *ptr)
{
	struct cuda_tier *ct = to_cuda(t);
	int err = cuda_enter(ct);

	if (err)
		return err;
	pthread_rwlock_wrlock(&ct->reg_lock);
	err = -ENOENT;
	for (unsigned r = 0; r < ct->nregs; r++) {
		if (ct->regs[r].base == ptr) {
			err = cuda_region_drop(ct, r);
			break;
		}
	}
	pthread_rwlock_unlock(&ct->reg_lock);
	if (err == -ENOENT)
		kvfs_err("cuda: host_unregister of %p: no region registered "
			 "there", ptr);
	return err;
}

static const struct kvfs_gpu_ops cuda_gpu_ops = {
	.describe = cuda_describe,
	.describe_owner = kvfs_gpu_pool_describe,
	.alloc_owner = cuda_alloc_owner,
	.peer_open = cuda_peer_open,
	.peer_close = cuda_peer_close,
	.peer_size = kvfs_gpu_peer_size,
	.peer_map = cuda_peer_map,
	.peer_write = cuda_peer_write,
	.peer_read = cuda_peer_read,
	.upload = cuda_upload,
	.extent_addr = cuda_extent_addr,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
};

/* ---- init ---- */

static int cuda_stream_init(struct cuda_stream *s)
{
	int err = -pthread_mutex_init(&s->lock, NULL);

	if (err)
		return err;
	err = CUDA_TRY(cudaStreamCreateWithFlags(&s->st,
						 cudaStreamNonBlocking));
	for (unsigned k = 0; k < CUDA_SLOTS && !err; k++) {
		void *buf = NULL;

		err = CUDA_TRY(cudaHostAlloc(&buf, CUDA_SLOT_BYTES,
					     cudaHostAllocDefault));
		s->slot[k].buf = buf;
		if (!err)
			err = CUDA_TRY(cudaEventCreateWithFlags(
				&s->slot[k].done, cudaEventDisableTiming));
	}
	return err;
}

static cuda_range_fn cuda_find_range(void)
{
	enum cudaDriverEntryPointQueryResult q;
	void *fn = NULL;
	cudaError_t e;

	e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn,
					     12000, cudaEnableDefault, &q);
	if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
		(void)cudaGetLastError();
		kvfs_warn("cuda: cuMemGetAddressRange unavailable: peer sizes "
			  "cannot be checked against their allocations");
		return NULL;
	}
	return (cuda_range_fn)fn;
}

/* Make one pool per owner of @o, @size bytes each: an allocation and
 * its IPC handle. The device is current.
 */
static int cuda_pools_create(struct cuda_tier *ct,
			     const struct kvfs_gpu_owners *o, uint64_t size)
{
	int err = 0;

	for (size_t i = 0; i < o->n && !err; i++) {
		struct kvfs_gpu_pool *p = &ct->pools.p[i];
		cudaIpcMemHandle_t h;
		void *mem = NULL;

		err = kvfs_gpu_pool_init(p, o->uid[i], size);
		if (!err)
			err = CUDA_TRY(cudaMalloc(&mem, (size_t)size));
		p->base = mem;
		if (!err)
			err = CUDA_TRY(cudaIpcGetMemHandle(&h, mem));
		if (err)
			break;
		p->desc.backend = KVFS_CTL_BACKEND_CUDA;
		p->desc.device = (uint32_t)ct->device;
		p->desc.size = size;
		memcpy(p->desc.ipc, &h, sizeof(p->desc.ipc));
	}
	if (!err)
		ct->pools.n = o->n;
	return err;
}

int kvfs_gpu_cuda_init_owners(int device, uint64_t capacity, unsigned flags,
			      const struct kvfs_gpu_owners *o,
			      struct kvfs_tier **out)
{
	struct cuda_tier *ct;
	uint64_t size;
	cudaError_t e;
	int count = 0, err;

	if (flags & ~(unsigned)KVFS_GPU_PRIVATE) {
		kvfs_err("cuda: unknown flags %#x", flags);
		return -EINVAL;
	}
	err = kvfs_gpu_owners_check(o, "cuda");
	if (err)
		return err;
	/* A pool is whole allocation units; a remainder could never be used. */
	capacity -= capacity % KVFS_GPU_ALIGN;
	size = o->owner_capacity ? o->owner_capacity : capacity / o->n;
	size -= size % KVFS_GPU_ALIGN;
	if (!capacity || capacity > SIZE_MAX || !size || size > SIZE_MAX) {
		kvfs_err("cuda: pool capacity (and each owner's, %" PRIu64
			 " bytes) must be at least %u bytes", size,
			 KVFS_GPU_ALIGN);
		return -EINVAL;
	}
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) {
		kvfs_err("cuda: cudaGetDeviceCount: %s (%s): no usable device",
			 cudaGetErrorString(e), cudaGetErrorName(e));
		(void)cudaGetLastError();
		return -ENODEV;
	}
	if (device < 0 || device >= count) {
		kvfs_err("cuda: device %d is not visible (%d device%s)",
			 device, count, count == 1 ? "" : "s");
		return -ENODEV;
	}
	ct = calloc(1, sizeof(*ct));
	if (!ct)
		return -ENOMEM;
	ct->device = device;
	ct->g.pools = &ct->pools;
	err = -pthread_rwlock_init(&ct->reg_lock, NULL);
	if (err)
		goto out_free;
	err = cuda_enter(ct);
	if (!err)
		err = cuda_pools_create(ct, o, size);
	for (unsigned i = 0; i < CUDA_STREAMS && !err; i++) {
		/* Counted first: teardown must undo a half-built stream. */
		ct->nstreams = i + 1;
		err = cuda_stream_init(&ct->streams[i]);
	}
	if (err)
		goto out_teardown;
	pthread_mutex_lock(&cuda_ipc_lock);
	cuda_tiers++;
	ct->live = true;
	pthread_mutex_unlock(&cuda_ipc_lock);
	ct->range = cuda_find_range();
	ct->g.base.ops = &kvfs_gpu_cuda_tier_ops;
	ct->g.base.id = KVFS_TIER_GPU;
	ct->g.base.capacity = capacity;
	ct->g.base.align = KVFS_GPU_ALIGN;
	ct->g.gops = &cuda_gpu_ops;
	*out = &ct->g.base;
	return 0;

out_teardown:
	cuda_teardown(ct);
	return err;
out_free:
	free(ct);
	return err;
}

int kvfs_gpu_cuda_init(int device, uint64_t capacity, unsigned flags,
		       struct kvfs_tier **out)
{
	uint32_t me = (uint32_t)getuid();
	struct kvfs_gpu_owners o = { .uid = &me, .n = 1 };

	return kvfs_gpu_cuda_init_owners(device, capacity, flags, &o, out);
}

#endif /* KVFS_HAVE_CUDA */
