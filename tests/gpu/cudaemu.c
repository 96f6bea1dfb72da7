/* SPDX-License-Identifier: MIT */
/*
 * A host-memory stand-in for the part of the CUDA runtime kvfs calls, so
 * that the cuda backend's own logic (pools, staging slots, batching,
 * streams and events, IPC handles, peer checks) runs in `make test` on
 * machines without a GPU.  It proves nothing about the GPU itself:
 * `make test-gpu` on a real device stays the test of record
 * (docs/operations.md).
 *
 * It is deliberately strict where the real runtime's contract is strict,
 * so that code which only works by luck fails here:
 *
 *  - Asynchronous copies are deferred.  cudaMemcpyAsync() only queues the
 *    copy on its stream; the bytes move when the stream is synchronised,
 *    an event recorded after the copy is synchronised, or the stream is
 *    destroyed.  Reusing a staging buffer, or reading a destination,
 *    before waiting shows up as wrong bytes.
 *  - Every device pointer must lie inside a live allocation or an opened
 *    IPC mapping, for the whole length, in the direction the copy kind
 *    says; otherwise cudaErrorInvalidValue.
 *  - An IPC handle can only be opened by another process, as on a GPU.
 *
 * "Device memory" is a memfd mapping, so an IPC handle (pid, fd, size,
 * offset) can be opened by another process through /proc/PID/fd/FD.
 * KVFS_CUDAEMU_DEVICES sets the device count (default 1; 0 emulates a
 * host without a GPU).
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
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#define EMU_MAGIC 0x554d4543554d454bull /* "KEMUCEMU" */
#define EMU_MAX_MAPS 256
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

/* A device allocation of this process, or another's opened through IPC. */
struct emu_map {
	uint8_t *base;
	size_t size;
	int fd;      /* ours: the memfd; opened: -1 */
	bool opened; /* mapped from another process's handle */
	bool live;
};

struct emu_op {
	void *dst;
	const void *src;
	size_t len;
};

struct CUstream_st {
	pthread_mutex_t lock;
	struct emu_op ops[EMU_MAX_OPS]; /* lock */
	uint64_t queued;                /* lock: ops ever queued */
	uint64_t done;                  /* lock: ops ever executed */
};

struct CUevent_st {
	struct CUstream_st *stream; /* NULL until recorded */
	uint64_t seq;               /* the stream's queued count at record */
};

static pthread_mutex_t emu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emu_map emu_maps[EMU_MAX_MAPS]; /* emu_lock */
static struct CUstream_st emu_default = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
};
static __thread cudaError_t emu_last;
static __thread int emu_device;

static cudaError_t fail(cudaError_t e)
{
	emu_last = e;
	return e;
}

static int emu_devices(void)
{
	const char *s = getenv("KVFS_CUDAEMU_DEVICES");

	return s ? atoi(s) : 1;
}

/* The map holding [p, p + len), or NULL. */
static struct emu_map *find_map(const void *p, size_t len)
{
	const uint8_t *b = p;

	for (int i = 0; i < EMU_MAX_MAPS; i++) {
		struct emu_map *m = &emu_maps[i];

		if (m->live && b >= m->base && b < m->base + m->size &&
		    len <= (size_t)(m->base + m->size - b))
			return m;
	}
	return NULL;
}

static bool is_device(const void *p, size_t len)
{
	bool r;

	pthread_mutex_lock(&emu_lock);
	r = find_map(p, len ? len : 1) != NULL;
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
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorMapBufferObjectFailed:
		return "cudaErrorMapBufferObjectFailed";
	default: return "cudaErrorUnknown";
	}
}

const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
	case cudaSuccess: return "no error (emulated)";
	case cudaErrorInvalidValue: return "invalid argument (emulated)";
	case cudaErrorMemoryAllocation: return "out of memory (emulated)";
	case cudaErrorNoDevice: return "no CUDA-capable device (emulated)";
	case cudaErrorInvalidDevice: return "invalid device ordinal (emulated)";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle (emulated)";
	case cudaErrorMapBufferObjectFailed:
		return "mapping of buffer object failed (emulated)";
	default: return "unknown error (emulated)";
	}
}

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
				       .fd = fd, .live = true };
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

static cudaError_t unmap(void *p, bool opened)
{
	struct emu_map *m;
	struct emu_map copy;

	pthread_mutex_lock(&emu_lock);
	m = find_map(p, 1);
	if (!m || m->base != p || m->opened != opened) {
		pthread_mutex_unlock(&emu_lock);
		return fail(cudaErrorInvalidValue);
	}
	copy = *m;
	m->live = false;
	pthread_mutex_unlock(&emu_lock);
	munmap(copy.base, copy.size);
	if (copy.fd >= 0)
		close(copy.fd);
	return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
	if (!devPtr)
		return cudaSuccess;
	return unmap(devPtr, false);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	(void)flags;
	if (!pHost)
		return fail(cudaErrorInvalidValue);
	if (posix_memalign(pHost, 4096, size ? size : 1))
		return fail(cudaErrorMemoryAllocation);
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
	free(ptr);
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

static void stream_run(struct CUstream_st *s, uint64_t upto)
{
	while (s->done < upto) {
		struct emu_op *op = &s->ops[s->done % EMU_MAX_OPS];

		memmove(op->dst, op->src, op->len);
		s->done++;
	}
}

static struct CUstream_st *stream_of(cudaStream_t stream)
{
	return stream ? stream : &emu_default;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
			    enum cudaMemcpyKind kind, cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);

	if (!count)
		return cudaSuccess;
	if (!copy_ok(dst, src, count, kind))
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&s->lock);
	/* A full queue drains its oldest copies, as a busy GPU would. */
	if (s->queued - s->done == EMU_MAX_OPS)
		stream_run(s, s->done + 1);
	s->ops[s->queued % EMU_MAX_OPS] =
		(struct emu_op){ .dst = dst, .src = src, .len = count };
	s->queued++;
	pthread_mutex_unlock(&s->lock);
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
		       enum cudaMemcpyKind kind)
{
	if (!count)
		return cudaSuccess;
	if (!copy_ok(dst, src, count, kind))
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&emu_default.lock);
	stream_run(&emu_default, emu_default.queued);
	pthread_mutex_unlock(&emu_default.lock);
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

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream,
				      unsigned int flags)
{
	struct CUstream_st *s;

	(void)flags;
	if (!pStream)
		return fail(cudaErrorInvalidValue);
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(cudaErrorMemoryAllocation);
	pthread_mutex_init(&s->lock, NULL);
	*pStream = s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);

	pthread_mutex_lock(&s->lock);
	stream_run(s, s->queued);
	pthread_mutex_unlock(&s->lock);
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	if (!stream)
		return fail(cudaErrorInvalidResourceHandle);
	/* Work queued before the destroy still completes. */
	cudaStreamSynchronize(stream);
	pthread_mutex_destroy(&stream->lock);
	free(stream);
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	(void)flags;
	if (!event)
		return fail(cudaErrorInvalidValue);
	*event = calloc(1, sizeof(**event));
	return *event ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	struct CUstream_st *s = stream_of(stream);

	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&s->lock);
	event->stream = s;
	event->seq = s->queued;
	pthread_mutex_unlock(&s->lock);
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	struct CUstream_st *s;

	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	s = event->stream;
	if (!s)
		return cudaSuccess;
	pthread_mutex_lock(&s->lock);
	stream_run(s, event->seq);
	pthread_mutex_unlock(&s->lock);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	if (!event)
		return fail(cudaErrorInvalidResourceHandle);
	free(event);
	return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
	struct emu_handle h = { .magic = EMU_MAGIC, .pid = getpid() };
	struct emu_map *m;

	if (!handle)
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&emu_lock);
	m = find_map(devPtr, 1);
	if (m && !m->opened) {
		h.fd = m->fd;
		h.size = m->size;
		h.off = (uint64_t)((uint8_t *)devPtr - m->base);
		h.device = emu_device;
	}
	pthread_mutex_unlock(&emu_lock);
	if (!m || m->opened)
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
				       .opened = true, .live = true };
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
	return unmap(devPtr, true);
}

static CUresult emu_mem_range(CUdeviceptr *base, size_t *size,
			      CUdeviceptr dptr)
{
	struct emu_map *m;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&emu_lock);
	m = find_map((const void *)(uintptr_t)dptr, 1);
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
