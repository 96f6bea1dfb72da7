/* SPDX-License-Identifier: MIT */
/*
 * The cudart stand-in's hooks for its two companions: the C versions of
 * the restoration kernels (tests/gpu/cudaemu_kern.c, linked into the
 * emulated build's library) and the fake cuBLAS (tests/gpu/cublasemu.c, a
 * shared library that resolves these from the executable, which the
 * emulated build links with -rdynamic).  Emulated builds only.
 */
#ifndef KVFS_TESTS_GPU_CUDAEMU_I_H
#define KVFS_TESTS_GPU_CUDAEMU_I_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

/*
 * kvfs_cudaemu_enqueue() - queue "device work" on @stream (NULL: the
 * legacy default stream): @fn(@arg) runs when the stream reaches it at a
 * synchronisation point, in order with the stream's copies, memsets and
 * event waits, never from the calling thread's own call.
 * @arg: a heap block (malloc) holding everything @fn needs, copied at
 *       queue time as kernel arguments are; the stand-in frees it after
 *       @fn has run.  @fn must not call the CUDA API.
 *
 * Returns cudaSuccess, or cudaErrorInvalidValue for a NULL @fn (then @arg
 * is freed too).  Locking: takes the stand-in's stream lock; @fn runs
 * with it held.
 */
cudaError_t kvfs_cudaemu_enqueue(cudaStream_t stream, void (*fn)(void *arg),
				 void *arg);

/*
 * kvfs_cudaemu_is_device() - whether all of [@p, @p + @len) lies in one
 * live device allocation (cudaMalloc'ed, or an opened IPC mapping) of the
 * calling thread's current device: what a kernel may touch.  @len 0 is
 * treated as 1.  Locking: takes the allocation table's lock.
 */
bool kvfs_cudaemu_is_device(const void *p, size_t len);

/*
 * kvfs_cudaemu_error() - record @e as the thread's last error (what
 * cudaGetLastError() returns next), for a refused launch; returns @e.
 */
cudaError_t kvfs_cudaemu_error(cudaError_t e);

#endif
