/* SPDX-License-Identifier: MIT */
/*
 * A host-memory stand-in for the part of the CUDA runtime kvfs calls, so
 * that the cuda backend's own logic (pools, staging slots, batching,
 * streams and events, IPC handles, peer checks) and the host side of the
 * GPU restoration path run in `make test` on machines without a GPU.  It
 * proves nothing about the GPU itself: `make test-gpu` on a real device
 * stays the test of record (docs/operations.md).
 *
 * It is deliberately strict where the real runtime's contract is strict,
 * so that code which only works by luck fails here:
 *
 *  - Stream work is deferred.  cudaMemcpyAsync(), cudaMemsetAsync(),
 *    cudaStreamWaitEvent() and "kernels" (kvfs_cudaemu_enqueue(), used by
 *    tests/gpu/cudaemu_kern.c and the fake cuBLAS) only queue an op on
 *    their stream; ops run in order when the stream is synchronised, an
 *    event recorded after them is synchronised, the stream is destroyed,
 *    or memory is freed (cudaFree synchronises the device, as the runtime
 *    does).  Reusing a staging buffer, or reading a destination, before
 *    waiting shows up as wrong bytes.
 *  - A stream that waits for an event runs nothing past the wait until
 *    the recording stream has run up to the event: work on two streams is
 *    ordered only by events, as on a GPU.  A cycle of waits (a GPU hang)
 *    aborts with a message.
 *  - Every device pointer must lie inside a live allocation or an opened
 *    IPC mapping, for the whole length, in the direction the copy kind
 *    says, when the op is queued; otherwise cudaErrorInvalidValue.
 *  - cudaPointerGetAttributes() knows device, opened and pinned
 *    (cudaHostAlloc, or host memory registered with cudaHostRegister)
 *    allocations; anything else is unregistered host memory.
 *    cudaFreeHost() refuses what cudaHostAlloc() did not give, and
 *    cudaHostUnregister() what cudaHostRegister() did not register;
 *    registering a range that overlaps pinned memory fails as the runtime
 *    does.  Copies from and to registered memory are deferred like all
 *    stream work, so a direct copy whose source is reused or read before
 *    a wait shows as wrong bytes.
 *  - An IPC handle can only be opened by another process, as on a GPU.
 *
 * "Device memory" is a memfd mapping, so an IPC handle (pid, fd, size,
 * offset) can be opened by another process through /proc/PID/fd/FD.
 * KVFS_CUDAEMU_DEVICES sets the device count (default 1; 0 emulates a
 * host without a GPU); CUDA_VISIBLE_DEVICES narrows it as it does the
 * runtime's ("-1": none).  KVFS_CUDAEMU_PIN_LIMIT=BYTES makes a
 * cudaHostRegister() of more than BYTES fail with
 * cudaErrorMemoryAllocation, as a low RLIMIT_MEMLOCK can.
 * KVFS_CUDAEMU_NO_BATCH_COPY=1 makes cudaMemcpyBatchAsync() unsupported.
 * cudaHostAlloc() gives memory 256 bytes past a page boundary: the
 * runtime sub-allocates small pinned requests (an H200 gave 1 MiB ones
 * 256-byte alignment), so code must not count on pages.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "tests/gpu/cudaemu_i.h"

#define EMU_MAGIC 0x554d4543554d454bull /* "KEMUCEMU" */
#define EMU_MAX_MAPS 1024
#define EMU_MAX_OPS 4096

struct emu_handle {
	uint64_t magic;
	int32_t pid;
	int32_t fd;
	uint64_t size;
	uint64_t off;
	int32_t device;
};
_Static_assert(sizeof(struct emu_handle) <= sizeof(cudaIpcMemHandle_t),
	       "an emulated handle fits in a cudaIpcMemHandle_t");

enum emu_map_kind {
	MAP_DEVICE = 1 << 0, /* cudaMalloc of this process */
	MAP_OPENED = 1 << 1, /* another process's, through an IPC handle */
	MAP_PINNED = 1 << 2, /* cudaHostAlloc */
	MAP_REGISTERED = 1 << 3, /* cudaHostRegister: the caller's memory */
};

/* An allocation the runtime knows about. */
/* How far past a page boundary cudaHostAlloc() memory starts. */
#define EMU_HOST_SKEW 256

struct emu_map {
	uint8_t *base;
	size_t size;
	int fd;                 /* MAP_DEVICE: the memfd; else -1 */
	int device;             /* current device when made */
	enum emu_map_kind kind;
	bool live;
};

enum emu_op_kind { OP_COPY, OP_SET, OP_CALL, OP_WAIT, OP_MARK };

struct CUstream_st;
struct CUevent_st;

struct emu_op {
	enum emu_op_kind kind;
	union {
		struct {
			void *dst;
			const void *src;
			size_t len;
		} copy;
		struct {
			void *dst;
			int value;
			size_t len;
		} set;
		struct {
			void (*fn)(void *arg);
			void *arg;
		} call;
		struct {
			struct CUstream_st *s;
			uint64_t seq;
		} wait;
		struct {
			struct CUevent_st *ev;
			uint64_t gen;
		} mark;
	};
};

/*
 * A stream.  Its counters only grow, also across reuse of a destroyed
 * stream's header, so an event or a wait that names a stream and a count
 * stays satisfied once reached.  Headers are never freed: waits queued
 * elsewhere and events may still name them.
 */
struct CUstream_st {
	struct emu_op *ops;        /* emu_exec: ring of EMU_MAX_OPS */
	uint64_t queued;           /* emu_exec: ops ever queued */
	uint64_t done;             /* emu_exec: ops ever run */
	bool running;              /* emu_exec: inside stream_run() */
	bool dead;                 /* emu_exec: destroyed, header reusable */
	struct CUstream_st *next;  /* emu_exec: all headers */
};

struct CUevent_st {
	unsigned flags;
	struct CUstream_st *stream; /* emu_exec: NULL until recorded */
	uint64_t seq;               /* emu_exec: complete at stream->done */
	uint64_t gen;               /* emu_exec: records so far */
	uint64_t t_ns;              /* emu_exec: when record gen completed */
	bool timed;                 /* emu_exec: t_ns belongs to gen */
	unsigned marks;             /* emu_exec: mark ops not yet run */
	bool dead;                  /* emu_exec: destroyed with marks left */
};

static pthread_mutex_t emu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emu_map emu_maps[EMU_MAX_MAPS]; /* emu_lock */

/* Stream queues and event state; taken before emu_lock, never after. */
static pthread_mutex_t emu_exec = PTHREAD_MUTEX_INITIALIZER;
static struct emu_op emu_default_ops[EMU_MAX_OPS];
static struct CUstream_st emu_default = {
	.ops = emu_default_ops,
};
static struct CUstream_st *emu_streams = &emu_default; /* emu_exec */

static __thread cudaError_t emu_last;
static __thread int emu_device;

static cudaError_t fail(cudaError_t e)
{
	emu_last = e;
	return e;
}

cudaError_t kvfs_cudaemu_error(cudaError_t e)
{
	return fail(e);
}

/* KVFS_CUDAEMU_DEVICES, narrowed by CUDA_VISIBLE_DEVICES: the leading
 * valid ordinals of its list count, as with the real runtime.
 */
static int emu_devices(void)
{
	const char *s = getenv("KVFS_CUDAEMU_DEVICES");
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	int n = s ? atoi(s) : 1, seen = 0;

	if (n <= 0 || !vis)
		return n > 0 ? n : 0;
	while (*vis) {
		char *end;
		long v = strtol(vis, &end, 10);

		if (end == vis || v < 0 || v >= n ||
		    (*end && *end != ','))
			break;
		seen++;
		vis = *end ? end + 1 : end;
	}
	return seen;
}

/* The map of one of @kinds holding [p, p + len), or NULL. */
static struct emu_map *find_map(const void *p, size_t len, unsigned kinds)
{
	const uint8_t *b = p;

	for (int i = 0; i < EMU_MAX_MAPS; i++) {
		struct emu_map *m = &emu_maps[i];

		if (m->live && (m->kind & kinds) && b >= m->base &&
		    b < m->base + m->size &&
		    len <= (size_t)(m->base + m->size - b))
			return m;
	}
	return NULL;
}

static bool is_device(const void *p, size_t len)
{
	bool r;

	pthread_mutex_lock(&emu_lock);
	r = find_map(p, len ? len : 1, MAP_DEVICE | MAP_OPENED) != NULL;
	pthread_mutex_unlock(&emu_lock);
	return r;
}

bool kvfs_cudaemu_is_device(const void *p, size_t len)
{
	struct emu_map *m;
	bool r;

	pthread_mutex_lock(&emu_lock);
	m = find_map(p, len ? len : 1, MAP_DEVICE | MAP_OPENED);
	r = m && m->device == emu_device;
	pthread_mutex_unlock(&emu_lock);
	return r;
}

static struct emu_map *add_map(void)
{
	for (int i = 0; i < EMU_MAX_MAPS; i++)
		if (!emu_maps[i].live)
			return &emu_maps[i];
	return NULL;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ streams */

static void stream_run(struct CUstream_st *s, uint64_t upto);

static void op_run(struct emu_op *op)
{
	struct CUevent_st *ev;

	switch (op->kind) {
	case OP_COPY:
		memmove(op->copy.dst, op->copy.src, op->copy.len);
		break;
	case OP_SET:
		memset(op->set.dst, op->set.value, op->set.len);
		break;
	case OP_CALL:
		op->call.fn(op->call.arg);
		free(op->call.arg);
		break;
	case OP_WAIT:
		stream_run(op->wait.s, op->wait.seq);
		break;
	case OP_MARK:
		ev = op->mark.ev;
		if (!ev->dead && ev->gen == op->mark.gen) {
			ev->t_ns = now_ns();
			ev->timed = true;
		}
		if (!--ev->marks && ev->dead)
			free(ev);
		break;
	}
}

/* KVFS_CUDAEMU_ORDER=eager: see stream_run(). */
static bool emu_eager(void)
{
	static int eager = -1; /* emu_exec */

	if (eager < 0) {
		const char *o = getenv("KVFS_CUDAEMU_ORDER");

		eager = o && !strcmp(o, "eager");
	}
	return eager;
}

/* Every stream but @s, as far as each goes without driving another one
 * (a wait not yet satisfied stops it).  emu_exec held.
 */
static void others_run(struct CUstream_st *s)
{
	bool moved = true;

	while (moved) {
		moved = false;
		for (struct CUstream_st *t = emu_streams; t; t = t->next) {
			if (t == s || t->dead || t->running)
				continue;
			while (t->done < t->queued) {
				struct emu_op *op;

				op = &t->ops[t->done % EMU_MAX_OPS];
				if (op->kind == OP_WAIT &&
				    op->wait.s->done < op->wait.seq)
					break;
				t->running = true;
				op_run(op);
				t->running = false;
				t->done++;
				moved = true;
			}
		}
	}
}

/*
 * Run @s's ops up to (not including) number @upto.  emu_exec held.
 *
 * Two orders, both ones a GPU may choose.  Lazy (the default): other
 * streams run only as far as a wait of @s needs them, so a reader whose
 * wait for a writer on another stream is missing runs first and sees
 * stale bytes.  Eager (KVFS_CUDAEMU_ORDER=eager): before each op of @s,
 * every other stream runs as far as it can, so a writer whose wait for a
 * reader on another stream ("buffer free") is missing overwrites the
 * bytes first.
 */
static void stream_run(struct CUstream_st *s, uint64_t upto)
{
	bool eager = emu_eager();

	if (s->running) {
		/* Reached through a wait of another stream while @s itself
		 * waits: only the ops before its current one can be had.
		 */
		if (upto > s->done) {
			fprintf(stderr, "cudaemu: streams wait for each other "
				"in a cycle: a GPU would hang here\n");
			abort();
		}
		return;
	}
	s->running = true;
	while (s->done < upto) {
		if (eager)
			others_run(s);
		op_run(&s->ops[s->done % EMU_MAX_OPS]);
		s->done++;
	}
	s->running = false;
}

static struct CUstream_st *stream_of(cudaStream_t stream)
{
	return stream ? stream : &emu_default;
}

/* Every stream to its end: what freeing memory waits for.  emu_exec. */
static void device_run(void)
{
	for (struct CUstream_st *s = emu_streams; s; s = s->next)
		if (!s->dead)
			stream_run(s, s->queued);
}

static cudaError_t enqueue(cudaStream_t stream, const struct emu_op *op)
{
	struct CUstream_st *s = stream_of(stream);

	pthread_mutex_lock(&emu_exec);
	if (s->dead) {
		pthread_mutex_unlock(&emu_exec);
		return fail(cudaErrorInvalidResourceHandle);
	}
	/* A full queue runs its oldest op, as a busy GPU would. */
	if (s->queued - s->done == EMU_MAX_OPS)
		stream_run(s, s->done + 1);
	s->ops[s->queued % EMU_MAX_OPS] = *op;
	s->queued++;
	pthread_mutex_unlock(&emu_exec);
	return cudaSuccess;
}

cudaError_t kvfs_cudaemu_enqueue(cudaStream_t stream, void (*fn)(void *arg),
				 void *arg)
{
	cudaError_t e;

	if (!fn) {
		free(arg);
		return fail(cudaErrorInvalidValue);
	}
	e = enqueue(stream, &(struct emu_op){ .kind = OP_CALL,
					      .call = { fn, arg } });
	if (e != cudaSuccess)
		free(arg);
	return e;
}

/* ----------------------------------------------------------- devices */

cudaError_t cudaGetDeviceCount(int *count)
{
	int n = emu_devices();

	if (!count)
		return fail(cudaErrorInvalidValue);
	*count = 0;
	if (n <= 0)
		return fail(cudaErrorNoDevice);
	*count = n;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
	if (device < 0 || device >= emu_devices())
		return fail(emu_devices() <= 0 ? cudaErrorNoDevice :
						 cudaErrorInvalidDevice);
	emu_device = device;
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	pthread_mutex_lock(&emu_exec);
	device_run();
	pthread_mutex_unlock(&emu_exec);
	return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = emu_last;

	emu_last = cudaSuccess;
	return e;
}

const char *cudaGetErrorName(cudaError_t error)
{
	switch (error) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidConfiguration:
		return "cudaErrorInvalidConfiguration";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorNotReady: return "cudaErrorNotReady";
	case cudaErrorMapBufferObjectFailed:
		return "cudaErrorMapBufferObjectFailed";
	case cudaErrorHostMemoryAlreadyRegistered:
		return "cudaErrorHostMemoryAlreadyRegistered";
	case cudaErrorHostMemoryNotRegistered:
		return "cudaErrorHostMemoryNotRegistered";
	default: return "cudaErrorUnknown";
	}
}

const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
	case cudaSuccess: return "no error (emulated)";
	case cudaErrorInvalidValue: return "invalid argument (emulated)";
	case cudaErrorMemoryAllocation: return "out of memory (emulated)";
	case cudaErrorInvalidConfiguration:
		return "invalid configuration argument (emulated)";
	case cudaErrorNoDevice: return "no CUDA-capable device (emulated)";
	case cudaErrorInvalidDevice: return "invalid device ordinal (emulated)";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle (emulated)";
	case cudaErrorNotReady: return "device not ready (emulated)";
	case cudaErrorMapBufferObjectFailed:
		return "mapping of buffer object failed (emulated)";
	case cudaErrorHostMemoryAlreadyRegistered:
		return "part or all of the requested memory range is already "
		       "mapped (emulated)";
	case cudaErrorHostMemoryNotRegistered:
		return "pointer does not correspond to a registered memory "
		       "region (emulated)";
	default: return "unknown error (emulated)";
	}
}

/* ------------------------------------------------------------ memory */

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	struct emu_map *m;
	void *p;
	int fd;

	if (!devPtr)
		return fail(cudaErrorInvalidValue);
	if (emu_devices() <= 0)
		return fail(cudaErrorNoDevice);
	fd = memfd_create("kvfs-cudaemu", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)(size ? size : 1)))
		goto out_close;
	p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED,
		 fd, 0);
	if (p == MAP_FAILED)
		goto out_close;
	pthread_mutex_lock(&emu_lock);
	m = add_map();
	if (m)
		*m = (struct emu_map){ .base = p, .size = size ? size : 1,
				       .fd = fd, .device = emu_device,
				       .kind = MAP_DEVICE, .live = true };
	pthread_mutex_unlock(&emu_lock);
	if (!m) {
		munmap(p, size ? size : 1);
		goto out_close;
	}
	*devPtr = p;
	return cudaSuccess;
out_close:
	if (fd >= 0)
		close(fd);
	return fail(cudaErrorMemoryAllocation);
}

/* Forget the allocation based at @p, of @kind; its queued work is done
 * first, as the runtime's frees synchronise the device.
 */
static cudaError_t unmap(void *p, enum emu_map_kind kind)
{
	struct emu_map *m;
	struct emu_map copy;

	pthread_mutex_lock(&emu_exec);
	device_run();
	pthread_mutex_lock(&emu_lock);
	m = find_map(p, 1, kind);
	if (!m || m->base != p) {
		pthread_mutex_unlock(&emu_lock);
		pthread_mutex_unlock(&emu_exec);
		return fail(cudaErrorInvalidValue);
	}
	copy = *m;
	m->live = false;
	pthread_mutex_unlock(&emu_lock);
	pthread_mutex_unlock(&emu_exec);
	if (kind == MAP_PINNED) {
		free(copy.base - EMU_HOST_SKEW);
		return cudaSuccess;
	}
	munmap(copy.base, copy.size);
	if (copy.fd >= 0)
		close(copy.fd);
	return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
	if (!devPtr)
		return cudaSuccess;
	return unmap(devPtr, MAP_DEVICE);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	struct emu_map *m;
	void *p;

	(void)flags;
	if (!pHost)
		return fail(cudaErrorInvalidValue);
	if (emu_devices() <= 0)
		return fail(cudaErrorNoDevice);
	if (posix_memalign(&p, 4096, EMU_HOST_SKEW + (size ? size : 1)))
		return fail(cudaErrorMemoryAllocation);
	p = (uint8_t *)p + EMU_HOST_SKEW;
	pthread_mutex_lock(&emu_lock);
	m = add_map();
	if (m)
		*m = (struct emu_map){ .base = p, .size = size ? size : 1,
				       .fd = -1, .device = emu_device,
				       .kind = MAP_PINNED, .live = true };
	pthread_mutex_unlock(&emu_lock);
	if (!m) {
		free((uint8_t *)p - EMU_HOST_SKEW);
		return fail(cudaErrorMemoryAllocation);
	}
	*pHost = p;
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
	if (!ptr)
		return cudaSuccess;
	return unmap(ptr, MAP_PINNED);
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	const unsigned known = cudaHostRegisterPortable |
			       cudaHostRegisterMapped |
			       cudaHostRegisterIoMemory |
			       cudaHostRegisterReadOnly;
	const char *lim = getenv("KVFS_CUDAEMU_PIN_LIMIT");
	const uint8_t *b = ptr;
	struct emu_map *m = NULL;
	bool overlap = false;

	if (!ptr || !size || (flags & ~known))
		return fail(cudaErrorInvalidValue);
	if (emu_devices() <= 0)
		return fail(cudaErrorNoDevice);
	if (lim && size > strtoull(lim, NULL, 0))
		return fail(cudaErrorMemoryAllocation);
	pthread_mutex_lock(&emu_lock);
	for (int i = 0; i < EMU_MAX_MAPS; i++) {
		struct emu_map *o = &emu_maps[i];

		if (o->live && (o->kind & (MAP_PINNED | MAP_REGISTERED)) &&
		    b < o->base + o->size && o->base < b + size)
			overlap = true;
	}
	if (!overlap)
		m = add_map();
	if (m)
		*m = (struct emu_map){ .base = ptr, .size = size, .fd = -1,
				       .device = emu_device,
				       .kind = MAP_REGISTERED, .live = true };
	pthread_mutex_unlock(&emu_lock);
	if (overlap)
		return fail(cudaErrorHostMemoryAlreadyRegistered);
	return m ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

/* The memory stays the caller's: only forgotten, after the queued work,
 * as the runtime's unregister synchronises.
 */
cudaError_t cudaHostUnregister(void *ptr)
{
	struct emu_map *m;

	pthread_mutex_lock(&emu_exec);
	device_run();
	pthread_mutex_lock(&emu_lock);
	m = ptr ? find_map(ptr, 1, MAP_REGISTERED) : NULL;
	if (m && m->base == ptr)
		m->live = false;
	else
		m = NULL;
	pthread_mutex_unlock(&emu_lock);
	pthread_mutex_unlock(&emu_exec);
	return m ? cudaSuccess : fail(cudaErrorHostMemoryNotRegistered);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr,
				     const void *ptr)
{
	struct emu_map *m;

	if (!attr)
		return fail(cudaErrorInvalidValue);
	*attr = (struct cudaPointerAttributes){
		.type = cudaMemoryTypeUnregistered,
		.device = -2,
		.hostPointer = (void *)ptr,
	};
	pthread_mutex_lock(&emu_lock);
	m = find_map(ptr, 1, MAP_DEVICE | MAP_OPENED | MAP_PINNED |
		     MAP_REGISTERED);
	if (m) {
		attr->device = m->device;
		attr->devicePointer = (void *)ptr;
		if (m->kind & (MAP_PINNED | MAP_REGISTERED)) {
			attr->type = cudaMemoryTypeHost;
		} else {
			attr->type = cudaMemoryTypeDevice;
			attr->hostPointer = NULL;
		}
	}
	pthread_mutex_unlock(&emu_lock);
	return cudaSuccess;
}

/* Host memory is its own device address here, as under UVA. */
cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost,
				     unsigned int flags)
{
	struct emu_map *m;

	if (!pDevice || !pHost || flags)
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&emu_lock);
	m = find_map(pHost, 1, MAP_PINNED | MAP_REGISTERED);
	pthread_mutex_unlock(&emu_lock);
	if (!m)
		return fail(cudaErrorInvalidValue);
	*pDevice = pHost;
	return cudaSuccess;
}

/* Whether a copy of @kind may touch @dst and @src for @len bytes. */
static bool copy_ok(void *dst, const void *src, size_t len,
		    enum cudaMemcpyKind kind)
{
	bool dd = kind == cudaMemcpyHostToDevice ||
		  kind == cudaMemcpyDeviceToDevice;
	bool sd = kind == cudaMemcpyDeviceToHost ||
		  kind == cudaMemcpyDeviceToDevice;

	if (!dst || !src)
		return false;
	if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost)
		return true;
	if (dd != is_device(dst, len) || sd != is_device(src, len))
		return false;
	return true;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
			    enum cudaMemcpyKind kind, cudaStream_t stream)
{
	if (!count)
		return cudaSuccess;
	if (!copy_ok(dst, src, count, kind))
		return fail(cudaErrorInvalidValue);
	return enqueue(stream, &(struct emu_op){
		.kind = OP_COPY,
		.copy = { .dst = dst, .src = src, .len = count } });
}

/*
 * The batch as the runtime checks it (attributes for every copy, the
 * first index 0, a stream order set, not the legacy stream), then each
 * copy queued as cudaMemcpyAsync() with the kind inferred.  With
 * KVFS_CUDAEMU_NO_BATCH_COPY=1 it answers cudaErrorNotSupported, as a
 * driver without it would.
 */
cudaError_t cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs,
				 const size_t *sizes, size_t count,
				 struct cudaMemcpyAttributes *attrs,
				 size_t *attrsIdxs, size_t numAttrs,
				 cudaStream_t stream)
{
	const char *off = getenv("KVFS_CUDAEMU_NO_BATCH_COPY");
	cudaError_t e = cudaSuccess;

	if (off && !strcmp(off, "1"))
		return fail(cudaErrorNotSupported);
	if (!dsts || !srcs || !sizes || !count || !attrs || !attrsIdxs ||
	    !numAttrs || numAttrs > count || attrsIdxs[0] || !stream)
		return fail(cudaErrorInvalidValue);
	for (size_t i = 0; i < numAttrs; i++)
		if (attrs[i].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid ||
		    (i && attrsIdxs[i] <= attrsIdxs[i - 1]) ||
		    attrsIdxs[i] >= count)
			return fail(cudaErrorInvalidValue);
	for (size_t i = 0; i < count && e == cudaSuccess; i++)
		e = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i],
				    cudaMemcpyDefault, stream);
	return e;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
		       enum cudaMemcpyKind kind)
{
	if (!count)
		return cudaSuccess;
	if (!copy_ok(dst, src, count, kind))
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&emu_exec);
	stream_run(&emu_default, emu_default.queued);
	pthread_mutex_unlock(&emu_exec);
	memmove(dst, src, count);
	return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	if (!is_device(devPtr, count))
		return fail(cudaErrorInvalidValue);
	memset(devPtr, value, count);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
			    cudaStream_t stream)
{
	if (!count)
		return cudaSuccess;
	if (!is_device(devPtr, count))
		return fail(cudaErrorInvalidValue);
	return enqueue(stream, &(struct emu_op){
		.kind = OP_SET,
		.set = { .dst = devPtr, .value = value, .len = count } });
}

/* ---------------------------------------------------- streams (API) */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream,
				      unsigned int flags)
{
	struct emu_op *ops;
	struct CUstream_st *s;

	(void)flags;
	if (!pStream)
		return fail(cudaErrorInvalidValue);
	ops = calloc(EMU_MAX_OPS, sizeof(*ops));
	if (!ops)
		return fail(cudaErrorMemoryAllocation);
	pthread_mutex_lock(&emu_exec);
	for (s = emu_streams; s && !s->dead; s = s->next)
		;
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s) {
			pthread_mutex_unlock(&emu_exec);
			free(ops);
			return fail(cudaErrorMemoryAllocation);
		}
		s->next = emu_streams;
		emu_streams = s;
	}
	/* A reused header keeps its counters (done == queued). */
	s->ops = ops;
	s->dead = false;
	pthread_mutex_unlock(&emu_exec);
	*pStream = s;
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);

	pthread_mutex_lock(&emu_exec);
	if (s->dead) {
		pthread_mutex_unlock(&emu_exec);
		return fail(cudaErrorInvalidResourceHandle);
	}
	stream_run(s, s->queued);
	pthread_mutex_unlock(&emu_exec);
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	struct emu_op *ops;

	if (!stream)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	if (stream->dead) {
		pthread_mutex_unlock(&emu_exec);
		return fail(cudaErrorInvalidResourceHandle);
	}
	/* Work queued before the destroy still completes. */
	stream_run(stream, stream->queued);
	ops = stream->ops;
	stream->ops = NULL;
	stream->dead = true;
	pthread_mutex_unlock(&emu_exec);
	free(ops);
	return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
				unsigned int flags)
{
	struct emu_op op = { .kind = OP_WAIT };

	(void)flags;
	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	op.wait.s = event->stream;
	op.wait.seq = event->seq;
	pthread_mutex_unlock(&emu_exec);
	/* An event never recorded is complete: nothing to wait for. */
	if (!op.wait.s)
		return cudaSuccess;
	return enqueue(stream, &op);
}

/* ------------------------------------------------------------- events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	if (!event)
		return fail(cudaErrorInvalidValue);
	*event = calloc(1, sizeof(**event));
	if (!*event)
		return fail(cudaErrorMemoryAllocation);
	(*event)->flags = flags;
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);

	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	if (s->dead) {
		pthread_mutex_unlock(&emu_exec);
		return fail(cudaErrorInvalidResourceHandle);
	}
	event->gen++;
	event->timed = false;
	if (!(event->flags & cudaEventDisableTiming)) {
		/* The mark takes the time when the stream reaches it. */
		if (s->queued - s->done == EMU_MAX_OPS)
			stream_run(s, s->done + 1);
		s->ops[s->queued % EMU_MAX_OPS] = (struct emu_op){
			.kind = OP_MARK,
			.mark = { .ev = event, .gen = event->gen } };
		s->queued++;
		event->marks++;
	}
	event->stream = s;
	event->seq = s->queued;
	pthread_mutex_unlock(&emu_exec);
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	if (event->stream)
		stream_run(event->stream, event->seq);
	pthread_mutex_unlock(&emu_exec);
	return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
	bool done;

	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	done = !event->stream || event->stream->done >= event->seq;
	pthread_mutex_unlock(&emu_exec);
	return done ? cudaSuccess : cudaErrorNotReady;
}

/*
 * Host time between the moments the two streams ran the records, at
 * least 1 ns: it measures the emulation, not a GPU.  The runtime's
 * errors: an event made without timing or never recorded, or one whose
 * work has not completed.
 */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
				 cudaEvent_t end)
{
	cudaError_t e = cudaSuccess;
	int64_t d;

	if (!ms)
		return fail(cudaErrorInvalidValue);
	if (!start || !end)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	if (((start->flags | end->flags) & cudaEventDisableTiming) ||
	    !start->stream || !end->stream)
		e = cudaErrorInvalidResourceHandle;
	else if (!start->timed || !end->timed)
		e = cudaErrorNotReady;
	d = (int64_t)(end->t_ns - start->t_ns);
	pthread_mutex_unlock(&emu_exec);
	if (e != cudaSuccess)
		return fail(e);
	*ms = (float)(d > 0 ? d : 1) / 1e6f;
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&emu_exec);
	/* Pending records still name it: the last one frees it. */
	if (event->marks) {
		event->dead = true;
		event = NULL;
	}
	pthread_mutex_unlock(&emu_exec);
	free(event);
	return cudaSuccess;
}

/* -------------------------------------------------------------- IPC */

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
	struct emu_handle h = { .magic = EMU_MAGIC, .pid = getpid() };
	struct emu_map *m;

	if (!handle)
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&emu_lock);
	m = find_map(devPtr, 1, MAP_DEVICE);
	if (m) {
		h.fd = m->fd;
		h.size = m->size;
		h.off = (uint64_t)((uint8_t *)devPtr - m->base);
		h.device = m->device;
	}
	pthread_mutex_unlock(&emu_lock);
	if (!m)
		return fail(cudaErrorInvalidValue);
	memset(handle, 0, sizeof(*handle));
	memcpy(handle, &h, sizeof(h));
	return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
				 unsigned int flags)
{
	struct emu_handle h;
	struct emu_map *m;
	char path[64];
	void *p;
	int fd;

	(void)flags;
	memcpy(&h, &handle, sizeof(h));
	if (!devPtr || h.magic != EMU_MAGIC || !h.size || h.off >= h.size)
		return fail(cudaErrorInvalidValue);
	/* The real runtime refuses a process its own handles. */
	if (h.pid == getpid())
		return fail(cudaErrorInvalidResourceHandle);
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail(cudaErrorMapBufferObjectFailed);
	p = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return fail(cudaErrorMapBufferObjectFailed);
	pthread_mutex_lock(&emu_lock);
	m = add_map();
	if (m)
		*m = (struct emu_map){ .base = p, .size = h.size, .fd = -1,
				       .device = emu_device,
				       .kind = MAP_OPENED, .live = true };
	pthread_mutex_unlock(&emu_lock);
	if (!m) {
		munmap(p, h.size);
		return fail(cudaErrorMemoryAllocation);
	}
	/* The handle names the allocation's base, as on a GPU. */
	*devPtr = p;
	return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
	return unmap(devPtr, MAP_OPENED);
}

static CUresult emu_mem_range(CUdeviceptr *base, size_t *size,
			      CUdeviceptr dptr)
{
	struct emu_map *m;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&emu_lock);
	m = find_map((const void *)(uintptr_t)dptr, 1,
		     MAP_DEVICE | MAP_OPENED);
	if (m) {
		if (base)
			*base = (CUdeviceptr)(uintptr_t)m->base;
		if (size)
			*size = m->size;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_lock);
	return r;
}

cudaError_t cudaGetDriverEntryPointByVersion(
	const char *symbol, void **funcPtr, unsigned int cudaVersion,
	unsigned long long flags,
	enum cudaDriverEntryPointQueryResult *driverStatus)
{
	(void)cudaVersion;
	(void)flags;
	if (!symbol || !funcPtr)
		return fail(cudaErrorInvalidValue);
	*funcPtr = NULL;
	if (strcmp(symbol, "cuMemGetAddressRange")) {
		if (driverStatus)
			*driverStatus = cudaDriverEntryPointSymbolNotFound;
		return cudaSuccess;
	}
	*funcPtr = (void *)emu_mem_range;
	if (driverStatus)
		*driverStatus = cudaDriverEntryPointSuccess;
	return cudaSuccess;
}
