/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration on an NVIDIA GPU (HCache, paper 003): the
 * computation of gpu/restore.h, with cuBLAS GEMMs and two small kernels.
 *
 * Per layer, on one CUDA stream (plus a copy stream for uploads):
 *   1. the layer's n_tokens hidden rows reach the device: from device
 *      memory as they are, from pinned memory directly, or from pageable
 *      memory through a pinned staging buffer; layer l + 1 is uploaded on
 *      the copy stream while layer l computes (two buffers);
 *   2. a kernel decodes the rows to f32 and applies RMSNorm (sum of
 *      squares in double, scale in f32, as the CPU path does), writing x̂;
 *   3. one GEMM projects x̂ on [W_k; W_v] (both stored as one
 *      [2 * kv_dim][hidden] matrix): cublasSgemm in f32, or with
 *      KVFS_RESTORE_CUDA_BF16 cublasGemmEx on bf16 inputs with f32
 *      accumulation and output;
 *   4. a kernel adds the biases, rotates K (Hugging Face rotate-half, the
 *      cos/sin table computed on the device in double from the same
 *      inv_freq the CPU uses, rounded to f32), converts to the KV dtype
 *      with the CPU path's rounding rules and scatters the rows into the
 *      chunked layout K[c][heads][dim] then V[c][heads][dim], writing
 *      zeros for the rows past n_tokens in the last chunk.
 * The KV layer is written to device memory directly, or to host memory
 * through a device buffer and a download.
 *
 * cuBLAS is loaded at run time (dlopen of $KVFS_CUBLAS_LIB when set, then
 * libcublas.so.13, $CUDA_HOME/lib64 and /usr/local/cuda/lib64, then
 * libcublas.so), so programs start, and report no device, on machines
 * without it.
 *
 * Accuracy (the tests' bounds, docs/hcache.md): in f32 mode the result
 * agrees with the CPU path to f32 rounding (different summation order);
 * for narrow KV dtypes both round the same f32 value, so they agree
 * exactly or differ by one unit in the last place where the f32 values
 * straddle a rounding boundary.  BF16 mode rounds weights and x̂ to bf16
 * before the GEMM and is looser (a relative 2^-8 of sum |w * x̂|).
 *
 * Locking: a struct kvfs_restore_cuda owns one stream pair, a cuBLAS
 * handle and a workspace; calls on one handle are serialised by its
 * internal mutex (so any thread may call, one at a time runs).  Use one
 * handle per restoration thread for parallelism.  The handle does not
 * reference the struct kvfs_restore it was made from after init.
 */
#ifndef KVFS_GPU_RESTORE_CUDA_H
#define KVFS_GPU_RESTORE_CUDA_H

#include <stdint.h>

#include "hcache/restore.h"

enum kvfs_restore_cuda_flags {
	/* Keep K/V weights in bf16 on the device (half the memory) and run
	 * tensor-core GEMMs on bf16 x̂, accumulating in f32.  Default: f32
	 * weights and cublasSgemm without TF32, matching the CPU path.
	 */
	KVFS_RESTORE_CUDA_BF16 = 1 << 0,
};

struct kvfs_restore_cuda;

/*
 * kvfs_restore_cuda_init() - upload @r's weights to @device and set up a
 * stream pair, a cuBLAS handle and a workspace.
 * @r:      a loaded checkpoint (gpu/restore.h); may be freed afterwards.
 * @device: CUDA device ordinal.
 * @flags:  enum kvfs_restore_cuda_flags.
 * @out:    receives the handle.
 *
 * Device memory for weights: n_layers * (2 * kv_dim * hidden * 4 +
 * (hidden + 2 * kv_dim) * 4) bytes in f32 mode (4 GiB for Llama-2-7B),
 * half the first term with KVFS_RESTORE_CUDA_BF16.
 *
 * Returns 0; -EINVAL for a NULL argument or unknown flags; -ENODEV (logged)
 * when no device is visible, @device is not, or cuBLAS cannot be loaded;
 * -EOPNOTSUPP in builds without the CUDA toolkit; -ENOMEM when host or
 * device memory runs out; -EIO (logged, naming the CUDA or cuBLAS call)
 * for any other failure.
 */
int kvfs_restore_cuda_init(const struct kvfs_restore *r, int device,
			   unsigned flags, struct kvfs_restore_cuda **out);

/*
 * kvfs_restore_cuda_init_weights() - the same from weights in memory:
 * @m (checked with kvfs_restore_model_check(), copied) and @w, an array
 * of @m->n_layers layer views (see kvfs_restore_layer_weights(); norms
 * and biases f32, K/V in F32, BF16 or F16; only read during the call).
 * Same returns.  For benchmarks and tests that need no checkpoint file.
 */
int kvfs_restore_cuda_init_weights(const struct kvfs_restore_model *m,
				   const struct kvfs_restore_weights *w,
				   int device, unsigned flags,
				   struct kvfs_restore_cuda **out);

/* Free the device memory, streams, handle and workspace.  Waits for
 * nothing (no call is in flight once the caller may free).  NULL is a
 * no-op.
 */
void kvfs_restore_cuda_free(struct kvfs_restore_cuda *rc);

/* Device bytes held for weights (not counting the workspace). */
uint64_t kvfs_restore_cuda_mem_bytes(const struct kvfs_restore_cuda *rc);

/* The device the handle runs on, or -1 for NULL. */
int kvfs_restore_cuda_device(const struct kvfs_restore_cuda *rc);

/*
 * kvfs_restore_cuda_layer() - rebuild one layer; mirrors
 * kvfs_restore_layer().
 * @x:      that layer's slice of a HIDDEN payload
 *          (kvfs_restore_hidden_layer_bytes() bytes; only the first
 *          n_tokens rows are read).
 * @kv:     that layer's slice of the KV payload, every byte written.
 * @flags:  enum kvfs_restore_io_flags (hcache/restore.h), saying where
 *          @x and @kv are.
 *          A device pointer must be on the handle's device.  Host
 *          memory flagged as neither device nor pinned that is in fact
 *          page-locked (cudaHostAlloc'd, or registered: the DRAM tier's
 *          pinned arena) is treated as pinned.
 * Other arguments as kvfs_restore_layer().  Complete on return.
 *
 * Returns 0, -EINVAL (bad argument, logged), -ENOMEM, or -EIO (a CUDA or
 * cuBLAS failure, logged with the call; the handle stays usable unless
 * the CUDA context itself is lost).
 */
int kvfs_restore_cuda_layer(struct kvfs_restore_cuda *rc, uint32_t layer,
			    const void *x, uint16_t x_dtype,
			    uint64_t start_pos, uint32_t n_tokens,
			    uint32_t chunk_tokens, void *kv, uint16_t kv_dtype,
			    unsigned flags);

/*
 * kvfs_restore_cuda_layers() - rebuild @count consecutive layers from
 * @first in one run: what @count calls of kvfs_restore_cuda_layer() give,
 * with the upload of each layer overlapping the compute of the one before
 * and one wait at the end instead of one per layer.
 * @x:      layer @first's slice of a HIDDEN payload; the slices of the
 *          layers after it follow at kvfs_restore_hidden_layer_bytes()
 *          strides.
 * @kv:     layer @first's slice of the KV payload; the next follow at
 *          kvfs_restore_kv_layer_bytes() strides; every byte written.
 * Other arguments as kvfs_restore_cuda_layer().  Complete on return.
 *
 * Returns as kvfs_restore_cuda_layer(); a @count of 0, or layers past the
 * model's, is -EINVAL (logged).  On failure any of the @count KV slices
 * may hold partial output.
 */
int kvfs_restore_cuda_layers(struct kvfs_restore_cuda *rc, uint32_t first,
			     uint32_t count, const void *x, uint16_t x_dtype,
			     uint64_t start_pos, uint32_t n_tokens,
			     uint32_t chunk_tokens, void *kv,
			     uint16_t kv_dtype, unsigned flags);

/*
 * kvfs_restore_cuda_host_get() - a page-locked host buffer of at least
 * @len bytes, 4096-aligned, for a restoration's input or output: the
 * restorer notices page-locked memory (below) and copies it with the
 * copy engine instead of through its staging buffers, one CPU copy fewer
 * each way.  The handle keeps a few buffers given back and hands them
 * out again (pinning is slow); more at once are pinned and let go, up to
 * 16 out at once.  Contents undefined.  *@buf receives it.
 * Returns 0; -EINVAL; -EOPNOTSUPP in builds without the CUDA toolkit;
 * -EBUSY (16 are out), -ENOMEM (logged: the driver cannot pin more) or
 * -EIO (logged): on any of them use pageable memory.  Locking: the handle's pool lock, not the one calls of
 * the restorer take, so it never waits for a restoration.
 */
int kvfs_restore_cuda_host_get(struct kvfs_restore_cuda *rc, uint64_t len,
			       void **buf);

/* Give back a buffer of kvfs_restore_cuda_host_get() (NULL: nothing),
 * before kvfs_restore_cuda_free().  Takes the pool lock.
 */
void kvfs_restore_cuda_host_put(struct kvfs_restore_cuda *rc, void *buf);

/*
 * kvfs_restore_cuda_block() - rebuild layers of a block, payload to
 * payload; mirrors kvfs_restore_block(), with @io->flags (enum
 * kvfs_restore_io_flags) saying where each payload lives.  Layers
 * outside the range are neither read nor written.  The upload of layer
 * l + 1 overlaps the compute of layer l.  Complete on return.  Same
 * returns as kvfs_restore_cuda_layer().
 *
 * To restore into the device tier, pass the device address of the
 * destination extent (the tier's extent_addr, gpu/gpu.h) with
 * KVFS_RC_KV_DEVICE, as kvfs_rpool_to_device() does.
 */
int kvfs_restore_cuda_block(struct kvfs_restore_cuda *rc,
			    const struct kvfs_restore_io *io);

/*
 * kvfs_restore_cuda_blocks() - kvfs_restore_cuda_block() for the @n
 * requests @io[0..n) at once: for each layer, the hidden rows of every
 * block go into one buffer and through one norm and one GEMM, so the
 * layer's weights are read once for all of them instead of once a block
 * (what makes restoring a prefix of small blocks compute-bound rather
 * than bound by weight reads and per-call latency; HCache restores in
 * batches for the same reason).  The RoPE and scatter stay per block,
 * each at its own start_pos, into its own KV payload.
 * Every request must name its hidden payload in host memory (pageable
 * or KVFS_RC_HIDDEN_PINNED) and its KV payload in device memory
 * (KVFS_RC_KV_DEVICE: the pool extents FETCH fills), and all must share
 * hidden_dtype, kv_dtype, chunk_tokens, first_layer and the number of
 * layers; n_tokens and start_pos may differ.  Requests past what the
 * workspace holds at once (about 64 MiB of projections) run in several
 * rounds, in order.  Complete on return.
 *
 * Returns 0; -EINVAL (logged) for a request kvfs_restore_cuda_block()
 * would refuse, one that breaks the rules above, or @n of 0; otherwise
 * as kvfs_restore_cuda_layer().  On failure any of the KV payloads may
 * hold partial output.  Locking: the handle's lock, for the whole call.
 */
int kvfs_restore_cuda_blocks(struct kvfs_restore_cuda *rc,
			     const struct kvfs_restore_io *io, size_t n);

/* Device timings of one layer of @n_tokens tokens (kvfs_restore_cuda_
 * profile()), in seconds, each the median of a few runs.
 */
struct kvfs_restore_cuda_prof {
	double gemm;        /* the projection GEMM alone */
	double compute;     /* norm + GEMM + RoPE/scatter, device to device */
	double h2d_hidden;  /* hidden rows, pinned host -> device */
	double h2d_kv;      /* the KV layer's bytes, pinned host -> device */
};

/*
 * kvfs_restore_cuda_profile() - time one layer of @n_tokens tokens in
 * @dtype (hidden and KV) on synthetic data, with CUDA events: what a
 * bubble-free plan (gpu/hsched.h) needs for the GPU tier.  Allocates
 * its own buffers and frees them.  0, -EINVAL, -ENOMEM or -EIO.
 */
int kvfs_restore_cuda_profile(struct kvfs_restore_cuda *rc,
			      uint32_t n_tokens, uint16_t dtype,
			      struct kvfs_restore_cuda_prof *out);

#endif
