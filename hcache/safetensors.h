/* SPDX-License-Identifier: MIT */
/*
 * Read-only access to safetensors checkpoints: one .safetensors file, or a
 * sharded checkpoint through its model.safetensors.index.json.
 *
 * The parser is strict.  A file is an 8-byte little-endian header length N,
 * N bytes of JSON (an object; trailing 0x20 padding allowed), then the data
 * section.  Every tensor entry must have exactly "dtype", "shape" and
 * "data_offsets"; offsets are relative to the data section, and the tensors
 * must tile the data section exactly (no overlap, no hole, nothing left
 * over), as the format's reference implementation requires.  "__metadata__"
 * must be a string-to-string object and is otherwise ignored.  The JSON
 * dialect is RFC 8259 minus fractions and exponents (a number must be an
 * integer), with duplicate keys, invalid UTF-8, "\u0000" and nesting deeper
 * than 32 refused.  docs/hcache.md lists every rule.
 *
 * Files are mmapped read-only and stay mapped until kvfs_st_free(); tensor
 * pointers point into the mapping and may be unaligned (load with memcpy).
 * The files must not be truncated while open (that would be SIGBUS, as for
 * any mapping).  All data is little-endian; kvfs only builds on
 * little-endian hosts.
 *
 * Errors: -ENOENT when a named file does not exist, -EINVAL for anything
 * malformed, -ENOMEM, or another -errno from open/fstat/mmap/read.  Every
 * failure is logged once with the file, the tensor where there is one, and
 * the reason.
 *
 * Locking: a struct kvfs_st is immutable after kvfs_st_open(); lookups may
 * run from any number of threads at once.  kvfs_st_free() must not race
 * with them.
 */
#ifndef KVFS_HCACHE_SAFETENSORS_H
#define KVFS_HCACHE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Largest JSON header (or index file) accepted: 100 MiB. */
#define KVFS_ST_MAX_HEADER (100u << 20)
/* Most dimensions a tensor may have. */
#define KVFS_ST_MAX_DIMS 8

/* Every dtype of the safetensors format; only F32, F16 and BF16 are used by
 * kvfs, the rest are recognised so that a checkpoint holding them still
 * opens, and refused by whoever needs the tensor.
 */
enum kvfs_st_dtype {
	KVFS_ST_BOOL = 1,
	KVFS_ST_U8,
	KVFS_ST_I8,
	KVFS_ST_F8_E5M2,
	KVFS_ST_F8_E4M3,
	KVFS_ST_F8_E8M0,
	KVFS_ST_I16,
	KVFS_ST_U16,
	KVFS_ST_F16,
	KVFS_ST_BF16,
	KVFS_ST_I32,
	KVFS_ST_U32,
	KVFS_ST_F32,
	KVFS_ST_F64,
	KVFS_ST_I64,
	KVFS_ST_U64,
	KVFS_ST_F4,       /* 4-bit, two per byte */
	KVFS_ST_F6_E2M3,  /* 6-bit, packed */
	KVFS_ST_F6_E3M2,  /* 6-bit, packed */
};

/* One tensor; every pointer stays valid until kvfs_st_free(). */
struct kvfs_st_tensor {
	const char *name;
	const char *file;   /* path of the file holding it, for log lines */
	int dtype;          /* enum kvfs_st_dtype */
	uint32_t ndim;      /* 0 for a scalar */
	uint64_t shape[KVFS_ST_MAX_DIMS];
	uint64_t numel;     /* product of shape (1 for a scalar) */
	const void *data;   /* into the mapping; possibly unaligned */
	uint64_t nbytes;
};

struct kvfs_st;

/*
 * kvfs_st_open() - open and validate a checkpoint.
 * @path: a .safetensors file, or (name ending in ".json") a sharded
 *        checkpoint's index: an object whose "weight_map" maps tensor
 *        names to shard file names.  Shard names must be plain file names
 *        (no '/', not "." or ".."), resolved in the index's directory; each
 *        shard is opened and mapped once however many tensors it holds.
 *        Every weight_map entry must exist in its shard; shard tensors the
 *        weight_map does not name are ignored.  Other top-level keys of
 *        the index ("metadata") are ignored.
 * @out:  receives the handle on success, untouched on failure.
 *
 * Every header of every file is fully validated here, so later lookups
 * cannot fail on malformed input.
 * Returns 0, -ENOENT (a file is missing), -EINVAL (malformed), -ENOMEM or
 * another -errno.
 */
int kvfs_st_open(const char *path, struct kvfs_st **out);

/* Unmap every file and free @st.  NULL is a no-op. */
void kvfs_st_free(struct kvfs_st *st);

/*
 * kvfs_st_get() - look a tensor up by exact name.
 * Fills @out and returns 0, or returns -ENOENT (not logged: absence is
 * often expected, e.g. optional biases).  O(log n).
 */
int kvfs_st_get(const struct kvfs_st *st, const char *name,
		struct kvfs_st_tensor *out);

/* Number of tensors reachable by name (for a sharded checkpoint: the
 * weight_map entries).
 */
size_t kvfs_st_count(const struct kvfs_st *st);
/* The @i-th tensor in name order, 0 <= i < kvfs_st_count().
 * Returns 0 or -EINVAL for @i out of range.
 */
int kvfs_st_at(const struct kvfs_st *st, size_t i, struct kvfs_st_tensor *out);
/* Number of files mapped (1, or the number of distinct shards). */
size_t kvfs_st_n_files(const struct kvfs_st *st);

/* "F32", "BF16", ... ; NULL for a value outside enum kvfs_st_dtype. */
const char *kvfs_st_dtype_name(int dtype);
/* Bits per element (1 byte = 8, F4 = 4, F6_* = 6); 0 when unknown. */
unsigned kvfs_st_dtype_bits(int dtype);

#endif
