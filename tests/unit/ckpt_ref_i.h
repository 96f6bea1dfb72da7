/* SPDX-License-Identifier: MIT */
/*
 * Restoration test support shared by tests/unit/test_restore.c (CPU),
 * tests/unit/test_restore_cuda.c (GPU), tests/unit/test_chunk.c and the
 * integration clients chunks_client and hcache_client: tiny Llama/Qwen2
 * checkpoints written as real safetensors files from a seeded PRNG,
 * HIDDEN payloads, the tests' own dtype decoders and tolerances, an
 * independent double-precision reference of K and V, and the fixture of
 * the two restoration suites (a temp dir, a log, the models they share).
 * Failures are cmocka assertions.  Not thread-safe (one PRNG, one dir).
 */
#ifndef KVFS_TESTS_UNIT_CKPT_REF_I_H
#define KVFS_TESTS_UNIT_CKPT_REF_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hcache/restore.h"

/* One tensor to write. */
struct wt {
	char name[96];
	const char *dtype;
	uint32_t ndim;
	uint64_t shape[2];
	uint8_t *bytes;
	size_t nbytes;
};

/* A tiny model: family, geometry, weight dtype, biases, RoPE. */
struct spec {
	int family;
	uint32_t L, hidden, kvh, hd;
	uint16_t wdt;       /* weight dtype, KVFS_DTYPE_* */
	bool bias;
	int rope_type;
	double theta, eps, factor, lo, hi;
	uint32_t orig;
};

/* A generated model: its tensors and their exact values in double. */
struct refmodel {
	struct spec s;
	struct kvfs_restore_model m;
	uint32_t kvd;
	double *norm, *wk, *wv, *bk, *bv; /* [L][...] */
	struct wt *t;
	size_t nt;
};

/* A generated HIDDEN payload and its exact input values. */
struct block {
	uint32_t n, c, rows;
	uint64_t pos;
	uint16_t hdt;
	uint8_t *hidden;     /* HIDDEN payload */
	size_t hidden_len;
	double *x;           /* [L][n][hidden] exact input values */
};

/* Bytes per element of a KV/hidden dtype (f32 4, f8 1, else 2). */
size_t esize(uint16_t dt);
/* Element @i of @base in @dt, decoded by the tests' own code. */
double dec(uint16_t dt, const void *base, size_t i);
/* The bound on |restored - reference| for output dtype @dt at @ref
 * (docs/hcache.md, Tolerances).
 */
double tol(uint16_t dt, double ref);

/* Write @n tensors as a safetensors file at @path. */
void write_checkpoint(const char *path, const struct wt *t, size_t n);
/* Generate a model from @s with PRNG seed @seed; free_model() frees it. */
void make_model(struct refmodel *rm, const struct spec *s, uint64_t seed);
void free_model(struct refmodel *rm);

/* Reference K and V (double) of layer @l for a token with values @x
 * ([hidden]) at position @pos; @k and @v hold kv_dim values.
 */
void ref_kv(const struct refmodel *rm, uint32_t l, const double *x,
	    uint64_t pos, double *k, double *v);

/* A HIDDEN payload of @n tokens in chunks of @c at @pos, in @hdt, with
 * NaN bytes in the padding rows; free_block() frees it.
 */
void make_block(struct block *b, const struct refmodel *rm, uint16_t hdt,
		uint32_t n, uint32_t c, uint64_t pos);
void free_block(struct block *b);

/* Restart the PRNG at @seed, so that what is drawn next (make_block())
 * depends on @seed only, not on what was generated before.
 */
void ckpt_seed(uint64_t seed);

/* Check layer @l of a KV payload (@kvl, in @kdt) element by element
 * against ref_kv() within tol(), and the padding rows for zeros.  Returns
 * the largest error / tolerance ratio.
 */
double check_layer(const struct refmodel *rm, const struct block *b,
		   uint32_t l, const uint8_t *kvl, uint16_t kdt);

/* ------------------------------------------- restoration suites' fixture */

/* The models test_restore and test_restore_cuda both restore. */
extern const struct spec ckpt_llama_mha_f32;   /* MHA, F32 weights */
extern const struct spec ckpt_llama_gqa_bf16;  /* GQA, BF16, llama3 RoPE */
extern const struct spec ckpt_qwen2_bias;      /* GQA, BF16, K/V biases */
extern const struct spec ckpt_llama_linear_f16; /* F16, linear RoPE */
/* Every KV output dtype: f32, bf16, f16, f8_e4m3. */
extern const uint16_t ckpt_kv_dtypes[4];

/*
 * The blocks both suites restore for a model: @n tokens in chunks of @c at
 * @pos, hidden states in @hdt, each into every KV dtype of @kdt (a 0 ends
 * the list).  A 0 @n ends a case's blocks.
 */
struct ckpt_block {
	uint16_t hdt;
	uint32_t n, c;
	uint64_t pos;
	uint16_t kdt[5];
};

struct ckpt_case {
	const struct spec *spec;
	uint64_t seed;
	struct ckpt_block b[4];
};

extern const struct ckpt_case ckpt_case_mha_f32, ckpt_case_gqa_bf16,
	ckpt_case_linear_f16, ckpt_case_qwen2;

/* For each block of @t: make it from @rm (the model of @t->spec) and call
 * @fn(@arg, @rm, block, kdt) for each of its KV dtypes.
 */
void ckpt_case_run(const struct ckpt_case *t, const struct refmodel *rm,
		   void (*fn)(void *arg, const struct refmodel *rm,
			      const struct block *b, uint16_t kdt),
		   void *arg);

/* Create a temp dir /tmp/kvfs-test-@tag-XXXXXX, open the kvfs log at the
 * dir's name + ".log" and give BLAS 2 threads.  For a cmocka group
 * setup; returns 0, else -1 or -errno.
 */
int ckpt_dir_setup(const char *tag);
/* Close the log, remove it and the dir with all files.  Returns 0 or
 * -1.
 */
int ckpt_dir_teardown(void);
/* The path of @name in the dir (a static buffer, valid to the next call). */
const char *ckpt_path(const char *name);
/* The path of the log file. */
const char *ckpt_log_path(void);

/* Write @rm's checkpoint as @file in the dir and load it with
 * kvfs_restore_load(@flags, KVFS_RESTORE_*), which must succeed.
 */
struct kvfs_restore *ckpt_load(struct refmodel *rm, const char *file,
			       unsigned flags);

#endif
