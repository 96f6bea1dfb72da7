/* SPDX-License-Identifier: MIT */
/*
 * Which device backend a tier is: the one place that knows both ops
 * tables, above the backends (which call gpu_check.c, below them).
 */
#include <stddef.h>

#include "tier/tier.h"
#include "gpu/gpu.h"
#include "gpu/gpu_i.h"

const struct kvfs_gpu_ops *kvfs_gpu_ops_of(struct kvfs_tier *t)
{
	if (!t)
		return NULL;
	if (t->ops == &kvfs_gpu_shm_tier_ops)
		return ((struct kvfs_gpu_tier *)t)->gops;
#ifdef KVFS_HAVE_CUDA
	if (t->ops == &kvfs_gpu_cuda_tier_ops)
		return ((struct kvfs_gpu_tier *)t)->gops;
#endif
	return NULL;
}
