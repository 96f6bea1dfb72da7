/* SPDX-License-Identifier: MIT */
/*
 * Hidden-state restoration on the CPU (HCache, paper 003): rebuild a
 * block's K and V from the hidden states saved at each layer's input.
 *
 * For layer l and token i at absolute position p = start_pos + i, with h
 * the residual stream entering the layer (before its input norm):
 *
 *   x̂ = h / sqrt(mean(h²) + eps) * w_norm             (RMSNorm, f32)
 *   K = RoPE(W_k · x̂ + b_k, p)                         (sgemm, f32)
 *   V = W_v · x̂ + b_v
 *
 * RoPE is Hugging Face's rotate-half form: within each head the pairs are
 * (j, j + head_dim/2) with inv_freq[j] = theta^(-2j/head_dim), optionally
 * rescaled (linear or llama3).  Angles and cos/sin are computed in double,
 * the GEMMs with OpenBLAS cblas_sgemm in f32.
 *
 * Payload layouts are meta/fmt.h's: a HIDDEN layer is, for each chunk of
 * chunk_tokens rows, X[c][hidden_size]; a KV layer is, for each chunk,
 * K[c][n_kv_heads][head_dim] then V[c][n_kv_heads][head_dim].  Rows past
 * n_tokens in the last chunk are ignored on input and zeroed on output.
 * Element types are enum kvfs_dtype: f16, bf16, f32 and f8_e4m3 (OCP
 * E4M3FN, no scale) both ways.
 *
 * gpu/restore_cuda.h is the same computation on an NVIDIA GPU; it reads
 * the weights through kvfs_restore_layer_weights().
 *
 * Locking: a struct kvfs_restore is immutable once loaded.  Any number of
 * threads may restore with one at the same time provided each uses its own
 * workspace (or NULL) and its own output buffer.  A workspace is owned by
 * one thread at a time.  OpenBLAS's own thread count is process-wide: see
 * kvfs_restore_set_blas_threads().
 */
#ifndef KVFS_GPU_RESTORE_H
#define KVFS_GPU_RESTORE_H

#include <stddef.h>
#include <stdint.h>

#include "meta/fmt.h"

enum kvfs_restore_family {
	KVFS_FAMILY_LLAMA = 1, /* no K/V biases (used if present, in pairs) */
	KVFS_FAMILY_QWEN2 = 2, /* K/V biases required */
};

enum kvfs_rope_type {
	KVFS_ROPE_DEFAULT = 0, /* plain theta^(-2j/d) */
	KVFS_ROPE_LINEAR = 1,  /* inv_freq / factor */
	KVFS_ROPE_LLAMA3 = 2,  /* Llama 3.1 wavelength-banded scaling */
};

/* What restoration needs to know about the model; the namespace config
 * provides it.  Attention query heads are not needed.
 */
struct kvfs_restore_model {
	int family;                   /* enum kvfs_restore_family */
	uint32_t n_layers;
	uint32_t hidden_size;
	uint32_t n_kv_heads;
	uint32_t head_dim;            /* even */
	double rms_norm_eps;          /* > 0 */
	double rope_theta;            /* > 0 */
	int rope_type;                /* enum kvfs_rope_type */
	double rope_factor;           /* linear, llama3: > 0 */
	double rope_low_freq_factor;  /* llama3: > 0 */
	double rope_high_freq_factor; /* llama3: > low_freq_factor */
	uint32_t rope_orig_max_pos;   /* llama3: original context, > 0 */
};

enum kvfs_restore_flags {
	/* Keep bf16/f16 K/V weights mapped and convert one layer's worth to
	 * f32 into the workspace on every call, instead of converting all of
	 * them once at load.  Saves n_layers * 2 * kv_dim * hidden_size * 4
	 * bytes of memory at the cost of a conversion pass per layer call.
	 */
	KVFS_RESTORE_LAZY = 1 << 0,
};

struct kvfs_restore;
struct kvfs_restore_ws;

/* "llama" / "qwen2" -> enum kvfs_restore_family, else -EINVAL. */
int kvfs_restore_family_parse(const char *name);
/* "default" (or "none") / "linear" / "llama3" -> enum kvfs_rope_type.
 * Other Hugging Face types (dynamic, yarn, longrope, ...) -> -EINVAL: they
 * are not implemented and a silently different RoPE would corrupt K.
 */
int kvfs_restore_rope_parse(const char *name);

/*
 * kvfs_restore_model_check() - validate @m on its own (no checkpoint).
 * Returns 0 or -EINVAL with a log line naming the bad field.
 */
int kvfs_restore_model_check(const struct kvfs_restore_model *m);

/*
 * kvfs_restore_load() - open a checkpoint and prepare restoration.
 * @m:       the model; copied.
 * @weights: a .safetensors file or a model.safetensors.index.json
 *           (gpu/safetensors.h).  Only these tensors are read, for every
 *           layer i < n_layers:
 *             model.layers.{i}.input_layernorm.weight   [hidden_size]
 *             model.layers.{i}.self_attn.k_proj.weight  [kv_dim, hidden]
 *             model.layers.{i}.self_attn.v_proj.weight  [kv_dim, hidden]
 *             model.layers.{i}.self_attn.{k,v}_proj.bias [kv_dim]
 *           with kv_dim = n_kv_heads * head_dim, in F32, F16 or BF16.
 *           Biases are required for qwen2; for llama they are used when
 *           both are present (attention_bias models) and refused when
 *           only one is.  model.layers.{n_layers}.input_layernorm.weight
 *           must not exist (the checkpoint is deeper than the namespace).
 * @flags:   enum kvfs_restore_flags.
 * @out:     receives the handle.
 *
 * Memory: norms and biases are always copied to f32.  K/V weights that
 * are F32 and 4-byte aligned in the file are used in place (page cache);
 * others are converted to f32 at load, n_layers * 2 * kv_dim * hidden * 4
 * bytes (4 GiB for a Llama-2-7B geometry, 1 GiB for Llama-3-8B), unless
 * KVFS_RESTORE_LAZY.  kvfs_restore_mem_bytes() reports the figure.
 *
 * Returns 0, -ENOENT (file missing), -EINVAL (bad model, malformed
 * checkpoint, missing tensor, wrong shape or dtype; the log names the
 * tensor), -ENOMEM.
 */
int kvfs_restore_load(const struct kvfs_restore_model *m, const char *weights,
		      unsigned flags, struct kvfs_restore **out);

/* Release everything, including the checkpoint mapping.  NULL is a no-op. */
void kvfs_restore_free(struct kvfs_restore *r);

/* Heap bytes @r holds for weights (norms, biases, converted K/V). */
uint64_t kvfs_restore_mem_bytes(const struct kvfs_restore *r);
/* The model @r was loaded with. */
const struct kvfs_restore_model *kvfs_restore_model(
	const struct kvfs_restore *r);

/* One layer's weights as restoration uses them (read-only views). */
struct kvfs_restore_weights {
	const float *norm;      /* [hidden_size], f32 */
	const float *bk, *bv;   /* [kv_dim], f32; both NULL without biases */
	const void *wk, *wv;    /* [kv_dim][hidden_size] row-major, any
				 * alignment, in wk_dtype / wv_dtype */
	uint16_t wk_dtype;      /* enum kvfs_dtype: F32, BF16 or F16 */
	uint16_t wv_dtype;
};

/*
 * kvfs_restore_layer_weights() - views of layer @layer's weights, for
 * another implementation of the same computation (the GPU path).  K/V
 * weights are the resident f32 copy when there is one, else the mapped
 * checkpoint tensor in its own dtype (KVFS_RESTORE_LAZY, or F32 not
 * 4-byte aligned).  The pointers live as long as @r.
 * Returns 0, or -EINVAL for a NULL argument or a layer out of range.
 */
int kvfs_restore_layer_weights(const struct kvfs_restore *r, uint32_t layer,
			       struct kvfs_restore_weights *out);

/*
 * kvfs_restore_rope_inv_freq() - the RoPE inverse frequencies of @m in
 * double, scaling applied, exactly as the CPU path uses them: writes
 * @m->head_dim / 2 values to @inv.  @m must pass kvfs_restore_model_check().
 */
void kvfs_restore_rope_inv_freq(const struct kvfs_restore_model *m,
				double *inv);

/* A per-thread scratch area that grows to the largest call seen, so that
 * steady-state restoration allocates nothing.  0 or -ENOMEM.
 */
int kvfs_restore_ws_alloc(struct kvfs_restore_ws **out);
void kvfs_restore_ws_free(struct kvfs_restore_ws *ws);

/* Bytes of one layer of a HIDDEN / KV payload (whole chunks); 0 for an
 * impossible argument or on overflow.
 */
uint64_t kvfs_restore_hidden_layer_bytes(const struct kvfs_restore_model *m,
					 uint32_t n_tokens,
					 uint32_t chunk_tokens, uint16_t dtype);
uint64_t kvfs_restore_kv_layer_bytes(const struct kvfs_restore_model *m,
				     uint32_t n_tokens, uint32_t chunk_tokens,
				     uint16_t dtype);

/*
 * kvfs_restore_request_why() - what is wrong with a restoration request
 * of @n_tokens at @start_pos in chunks of @chunk_tokens, hidden states in
 * @x_dtype and KV out in @kv_dtype, under model @m; shared by the CPU and
 * the GPU paths, which log it with their own prefix.
 * Returns NULL when it is acceptable, else a short reason.  Pure.
 */
const char *kvfs_restore_request_why(const struct kvfs_restore_model *m,
				     uint16_t x_dtype, uint64_t start_pos,
				     uint32_t n_tokens, uint32_t chunk_tokens,
				     uint16_t kv_dtype);

/*
 * kvfs_restore_layer() - rebuild one layer.
 * @r, @ws:        the model; a workspace or NULL (then one is allocated
 *                 and freed inside the call).
 * @layer:         < n_layers.
 * @x, @x_dtype:   that layer's slice of a HIDDEN payload,
 *                 kvfs_restore_hidden_layer_bytes() bytes.
 * @start_pos:     absolute position of token 0; start_pos + n_tokens must
 *                 not exceed 2^53 (positions are exact doubles).
 * @n_tokens:      >= 1, <= INT32_MAX.
 * @chunk_tokens:  >= 1.
 * @kv, @kv_dtype: that layer's slice of the KV payload to write,
 *                 kvfs_restore_kv_layer_bytes() bytes; every byte of it is
 *                 written (tail rows zeroed).  Must not overlap @x.
 *
 * Returns 0, -EINVAL (bad argument, logged) or -ENOMEM.
 */
int kvfs_restore_layer(const struct kvfs_restore *r,
		       struct kvfs_restore_ws *ws, uint32_t layer,
		       const void *x, uint16_t x_dtype, uint64_t start_pos,
		       uint32_t n_tokens, uint32_t chunk_tokens, void *kv,
		       uint16_t kv_dtype);

/*
 * Where the buffers of a request live (kvfs_restore_io.flags).  Only the
 * GPU path (kvfs_restore_cuda_block(), gpu/restore_cuda.h) reads device
 * memory; 0 means pageable host memory.
 */
enum kvfs_restore_io_flags {
	KVFS_RC_HIDDEN_DEVICE = 1 << 0, /* hidden: device memory */
	KVFS_RC_HIDDEN_PINNED = 1 << 1, /* hidden: page-locked host memory */
	KVFS_RC_KV_DEVICE = 1 << 2,     /* kv: device memory */
	KVFS_RC_KV_PINNED = 1 << 3,     /* kv: page-locked host memory */
};

/* Whole-payload restoration, on the CPU (kvfs_restore_block()) or the GPU
 * (kvfs_restore_cuda_block()).
 */
struct kvfs_restore_io {
	const void *hidden;     /* HIDDEN payload, all n_layers */
	uint64_t hidden_len;    /* exactly n_layers * hidden layer bytes */
	uint16_t hidden_dtype;
	void *kv;               /* KV payload, all n_layers */
	uint64_t kv_len;        /* exactly n_layers * kv layer bytes */
	uint16_t kv_dtype;
	uint64_t start_pos;
	uint32_t n_tokens;
	uint32_t chunk_tokens;
	uint32_t first_layer;   /* restore layers [first_layer, */
	uint32_t n_layers;      /*  first_layer + n_layers); 0 = to the end */
	unsigned flags;         /* enum kvfs_restore_io_flags */
};

/*
 * kvfs_restore_block() - rebuild layers of a block, payload to payload.
 * Layers outside the range are neither read nor written, so a scheduler
 * can fill them from the KV form.  Same rules and returns as
 * kvfs_restore_layer(); lengths must match exactly.  Host memory only:
 * -EINVAL (logged) when @io->flags names device memory; the pinned flags
 * are host memory and accepted.
 */
int kvfs_restore_block(const struct kvfs_restore *r,
		       struct kvfs_restore_ws *ws,
		       const struct kvfs_restore_io *io);

/* Split-layout restoration, see kvfs_restore_split(). */
struct kvfs_restore_split_io {
	const void *src;        /* payload of split @src_kv_from */
	uint64_t src_len;       /* exactly its length */
	uint32_t src_kv_from;   /* layers below it are hidden states */
	void *dst;              /* payload of split @dst_kv_from */
	uint64_t dst_len;       /* exactly its length */
	uint32_t dst_kv_from;   /* <= src_kv_from */
	uint16_t dtype;         /* of both payloads, hidden and KV layers */
	uint64_t start_pos;
	uint32_t n_tokens;
	uint32_t chunk_tokens;
};

/*
 * kvfs_restore_split() - turn a payload of one split layout (meta/fmt.h:
 * layers [0, kv_from) as hidden-state rows, the rest as K and V, each
 * layer's bytes following the last's) into another with fewer hidden
 * layers: layers below @io->dst_kv_from are copied as hidden states,
 * layers [dst_kv_from, src_kv_from) are restored, and layers from
 * src_kv_from on are copied as K and V.  dst_kv_from 0 gives the KV
 * payload (a read of a HIDDEN or MIXED block); src_kv_from n_layers is a
 * HIDDEN payload (a HIDDEN write stored MIXED).  @src and @dst must not
 * overlap.  Same rules and returns as kvfs_restore_layer(); -EINVAL also
 * when dst_kv_from > src_kv_from, src_kv_from > n_layers, or a length
 * does not match exactly.
 */
int kvfs_restore_split(const struct kvfs_restore *r,
		       struct kvfs_restore_ws *ws,
		       const struct kvfs_restore_split_io *io);

/* Set OpenBLAS's worker count (process-wide).  @n <= 0 picks
 * min(online CPUs, 4).  Restoration threads running in parallel should
 * each get few BLAS threads; 1 when there are as many restoration threads
 * as cores.
 */
void kvfs_restore_set_blas_threads(int n);

/* Scalar conversions.  Narrowing rounds to nearest, ties to even.  f16 and
 * bf16 overflow to infinity; f8_e4m3 (no infinity) saturates to +-448,
 * infinities included.  NaN stays NaN (quiet) in every format.
 */
float kvfs_restore_bf16_to_f32(uint16_t v);
uint16_t kvfs_restore_f32_to_bf16(float f);
float kvfs_restore_f16_to_f32(uint16_t v);
uint16_t kvfs_restore_f32_to_f16(float f);
float kvfs_restore_f8e4m3_to_f32(uint8_t v);
uint8_t kvfs_restore_f32_to_f8e4m3(float f);

/* Convert @n elements of @dtype (enum kvfs_dtype) at @src (any alignment)
 * to f32, or f32 to @dtype.  Returns 0 or -EINVAL for an unknown dtype.
 */
int kvfs_restore_to_f32(const void *src, uint16_t dtype, float *dst,
			size_t n);
int kvfs_restore_from_f32(const float *src, uint16_t dtype, void *dst,
			  size_t n);

#endif
