/* SPDX-License-Identifier: MIT */
/*
 * CUDA runtime errors, for gpu/tier_cuda.c and gpu/restore_cuda.c only
 * (builds with KVFS_HAVE_CUDA): one way to log a failed runtime call and
 * turn it into an errno.
 *
 * Each includer defines KVFS_CUDA_WHO before including this header: a
 * string literal, the prefix of its log lines ("cuda", "restore cuda"),
 * so that a line names the part of kvfs that made the call.
 */
#ifndef KVFS_GPU_CUDA_I_H
#define KVFS_GPU_CUDA_I_H

#include <errno.h>

#include <cuda_runtime_api.h>

#include "meta/log.h"

#ifndef KVFS_CUDA_WHO
#error "define KVFS_CUDA_WHO (the log prefix) before including gpu/cuda_i.h"
#endif

/*
 * kvfs_cuda_fail() - log that the runtime call @call (its text, already
 * prefixed with KVFS_CUDA_WHO) failed with @e, naming the error, and clear
 * a non-sticky error so that the next call does not report it again.
 * Returns -ENOMEM for cudaErrorMemoryAllocation, -EIO for anything else.
 * Any thread, no lock (cudaGetLastError() is per thread).
 */
static inline int kvfs_cuda_fail(cudaError_t e, const char *call)
{
	kvfs_err("%s: %s (%s)", call, cudaGetErrorString(e),
		 cudaGetErrorName(e));
	(void)cudaGetLastError();
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/*
 * CUDA_TRY() - run the runtime call @call (an expression of type
 * cudaError_t, evaluated once): 0 on cudaSuccess, else kvfs_cuda_fail()'s
 * -ENOMEM or -EIO, the log line reading "KVFS_CUDA_WHO: call: error
 * (name)".  A GNU statement expression.
 */
#define CUDA_TRY(call)                                                \
	({                                                            \
		cudaError_t e_ = (call);                              \
		e_ == cudaSuccess ?                                   \
			0 :                                           \
			kvfs_cuda_fail(e_, KVFS_CUDA_WHO ": " #call); \
	})

#endif
