/* SPDX-License-Identifier: MIT */
/*
 * kvfs block file format, version 1.
 *
 * A block file is a 4096-byte header, the token ids (u32 LE, zero padded to
 * a multiple of 4096) and the payload.  The payload is chunk-major inside
 * each layer so that per-layer streaming and chunk-granular sparse reads are
 * contiguous ranges of the file (docs/format.md has a worked example).
 *
 * This module is pure: no I/O, no locks, no allocation except where noted.
 * All functions are safe to call from any thread.
 */
#ifndef KVFS_META_FMT_H
#define KVFS_META_FMT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define KVFS_FMT_MAGIC "KVFSBLK1"
#define KVFS_FMT_VERSION 1
#define KVFS_FMT_HDR_SIZE 4096u
#define KVFS_FMT_ALIGN 4096u
#define KVFS_KEY_LEN 16
#define KVFS_KEY_HEX_LEN 32
/* "<32 hex>.kv" */
#define KVFS_FMT_NAME_LEN (KVFS_KEY_HEX_LEN + 3)

enum kvfs_fmt_kind {
	KVFS_KIND_KV = 1,
	KVFS_KIND_HIDDEN = 2,
	/* Stored images only, never accepted from a client: hidden states for
	 * layers [0, kv_from), K and V for layers [kv_from, n_layers), the
	 * per-layer split of HCache's bubble-free schedule (docs/hcache.md).
	 */
	KVFS_KIND_MIXED = 3,
};

enum kvfs_dtype {
	KVFS_DTYPE_F16 = 1,
	KVFS_DTYPE_BF16 = 2,
	KVFS_DTYPE_F32 = 3,
	KVFS_DTYPE_F8_E4M3 = 4,
};

/* The namespace geometry every block of a namespace must match. */
struct kvfs_geom {
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t head_dim;
	uint32_t hidden_size; /* 0 when unknown */
	uint32_t block_tokens;
	uint32_t chunk_tokens;
	uint16_t dtype; /* enum kvfs_dtype */
};

/* On-disk header, exactly as laid out in bytes 0..87 of a block file. */
struct kvfs_fmt_hdr {
	char magic[8];
	uint16_t version;
	uint16_t kind;
	uint16_t dtype;
	/* Kind MIXED: the first layer kept as K and V, 0 < kv_from < n_layers.
	 * Zero for the other kinds.
	 */
	uint16_t kv_from;
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t head_dim;
	uint32_t hidden_size;
	uint32_t n_tokens;
	uint32_t chunk_tokens;
	uint64_t start_pos;
	uint8_t parent[KVFS_KEY_LEN];
	uint8_t key[KVFS_KEY_LEN];
	uint32_t payload_crc;
	uint32_t hdr_crc;
} __attribute__((packed));
_Static_assert(sizeof(struct kvfs_fmt_hdr) == 88, "block header is 88 bytes");

/* Why a block was rejected; kvfs_fmt_strerror() names it for the log. */
enum kvfs_fmt_err {
	KVFS_FMT_OK = 0,
	KVFS_FMT_ETOOSHORT,
	KVFS_FMT_EMAGIC,
	KVFS_FMT_EVERSION,
	KVFS_FMT_EKIND,
	KVFS_FMT_EDTYPE,
	KVFS_FMT_EGEOM,
	KVFS_FMT_ENTOKENS,
	KVFS_FMT_ECHUNK,
	KVFS_FMT_EPAD,
	KVFS_FMT_ESIZE,
	KVFS_FMT_EHDRCRC,
	KVFS_FMT_EPAYLOADCRC,
	KVFS_FMT_ENAME,
	KVFS_FMT_EKEY,
	KVFS_FMT_ESTARTPOS,
};

/* Bytes per element of a dtype, 0 for an unknown dtype. */
size_t kvfs_fmt_dtype_size(uint16_t dtype);
/* "f16", "bf16", "f32", "f8_e4m3"; NULL for unknown. */
const char *kvfs_fmt_dtype_name(uint16_t dtype);
/* Parse a dtype name. Returns the enum value, or -EINVAL. */
int kvfs_fmt_dtype_parse(const char *name);

/* CRC-32C (Castagnoli, reflected, init and xorout 0xffffffff). @crc is the
 * value returned for the bytes so far (0 to start), so a CRC can be
 * computed in pieces.
 */
uint32_t kvfs_fmt_crc32c(uint32_t crc, const void *buf, size_t len);

/* Root key of namespace @ns with @salt (NULL or "" for none):
 * SHA-256("kvfs-ns-v1" 0x00 ns 0x00 salt)[0..16).
 */
void kvfs_fmt_root_key(const char *ns, const char *salt,
		       uint8_t out[KVFS_KEY_LEN]);
/* Root key of namespace @ns with @salt and the model fingerprint @model
 * (NULL or "" for none: then kvfs_fmt_root_key()'s):
 * SHA-256("kvfs-ns-v1" 0x00 ns 0x00 salt 0x00 model)[0..16). Neither the
 * salt nor the model holds a NUL, so no two triples hash the same bytes.
 */
void kvfs_fmt_root_key_model(const char *ns, const char *salt,
			     const char *model, uint8_t out[KVFS_KEY_LEN]);
/* Key of a block: SHA-256(parent[16] ‖ tokens as u32 LE)[0..16). */
void kvfs_fmt_block_key(const uint8_t parent[KVFS_KEY_LEN],
			const uint32_t *tokens, size_t n_tokens,
			uint8_t out[KVFS_KEY_LEN]);

/* 32 lowercase hex chars + NUL into @out. */
void kvfs_fmt_key_hex(const uint8_t key[KVFS_KEY_LEN],
		      char out[KVFS_KEY_HEX_LEN + 1]);
/* Parse exactly 32 hex chars (either case). Returns 0 or -EINVAL. */
int kvfs_fmt_key_parse(const char *hex, uint8_t out[KVFS_KEY_LEN]);
/* Parse a file name "<32 hex>.kv". Returns 0 or -EINVAL. */
int kvfs_fmt_name_parse(const char *name, uint8_t out[KVFS_KEY_LEN]);

/* Payload bytes of a block of @kind with @n_tokens under @g (chunks are
 * always whole: ceil(n_tokens / chunk_tokens) * chunk_tokens rows).
 * Returns 0 for an impossible geometry or on overflow.
 */
uint64_t kvfs_fmt_payload_size(const struct kvfs_geom *g, uint16_t kind,
			       uint32_t n_tokens);
/* Offset of the payload: header + padded token ids. */
uint64_t kvfs_fmt_payload_off(uint32_t n_tokens);
/* Whole file size, 0 on overflow or impossible geometry. */
uint64_t kvfs_fmt_file_size(const struct kvfs_geom *g, uint16_t kind,
			    uint32_t n_tokens);
/* The largest file a namespace accepts (kind KV or HIDDEN, whichever is
 * larger, at block_tokens).
 */
uint64_t kvfs_fmt_max_file_size(const struct kvfs_geom *g);

/* Byte range [*off, *off + *len) inside the file of layer @layer, chunk
 * @chunk of a KV block: K then V of that chunk, contiguous.
 * Returns 0 or -EINVAL when out of range.
 */
int kvfs_fmt_chunk_range(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t layer, uint32_t chunk, uint64_t *off,
			 uint64_t *len);

/*
 * Split layouts.  Every stored form is described by @kv_from: the layers
 * below it hold hidden-state rows (X[c][hidden_size] per chunk), the others
 * K and V.  Kind KV is kv_from 0, kind HIDDEN is kv_from n_layers, kind MIXED
 * anything in between.  Layers follow each other in order, each chunk-major,
 * so a layer and a (layer, chunk) piece are contiguous ranges in either form.
 */

/* kv_from of a decoded header: 0 for KV, n_layers for HIDDEN, the header's
 * field for MIXED.
 */
uint32_t kvfs_fmt_hdr_kv_from(const struct kvfs_fmt_hdr *h);
/* The kind whose layout @kv_from describes under @g. */
uint16_t kvfs_fmt_split_kind(const struct kvfs_geom *g, uint32_t kv_from);
/* Payload and file bytes of a split block; 0 for an impossible geometry
 * (a hidden layer without g->hidden_size, kv_from > n_layers) or overflow.
 */
uint64_t kvfs_fmt_split_payload_size(const struct kvfs_geom *g,
				     uint32_t n_tokens, uint32_t kv_from);
uint64_t kvfs_fmt_split_file_size(const struct kvfs_geom *g,
				  uint32_t n_tokens, uint32_t kv_from);
/* File range of layer @layer of a split block, and of its chunk @chunk
 * (K then V of the chunk, or its X rows).  Returns 0 or -EINVAL when out
 * of range.  The hidden layers (below @kv_from) follow one another at one
 * stride, their length, and the KV layers after them at theirs: a run of
 * layers is one range (the GPU restore from the SSD relies on it).
 */
int kvfs_fmt_layer_range(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t kv_from, uint32_t layer, uint64_t *off,
			 uint64_t *len);
int kvfs_fmt_piece_range(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t kv_from, uint32_t layer, uint32_t chunk,
			 uint64_t *off, uint64_t *len);

/*
 * The per-piece CRC layout: chunk-granular reads check each (layer,
 * chunk) piece they read against its own CRC-32C, since a sparse read
 * cannot use the payload CRC.
 */

/* Number of CRCs kvfs_fmt_chunk_crcs() writes for a block of @n_tokens
 * under @g: n_layers * ceil(n_tokens / chunk_tokens), 0 when
 * g->chunk_tokens is 0. Pure; no error.
 */
size_t kvfs_fmt_chunk_ncrcs(const struct kvfs_geom *g, uint32_t n_tokens);
/*
 * kvfs_fmt_chunk_crcs() - the per-piece CRC-32C table of a stored image.
 * @g, @n_tokens: the block's geometry and tokens.
 * @kv_from:      its split (kvfs_fmt_hdr_kv_from(): 0 for KV, n_layers
 *                for HIDDEN): layers below it hold hidden-state rows.
 * @img:          the whole stored image, kvfs_fmt_split_file_size(@g,
 *                @n_tokens, @kv_from) bytes.
 * @out:          room for kvfs_fmt_chunk_ncrcs(@g, @n_tokens) values.
 *
 * Writes them layer-major, each over the stored piece
 * kvfs_fmt_piece_range(@kv_from) names (0 for one it refuses). Pure,
 * thread-safe; no error.
 */
void kvfs_fmt_chunk_crcs(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t kv_from, const void *img, uint32_t *out);

/*
 * kvfs_fmt_img_kind() - the kind (enum kvfs_fmt_kind) recorded in the
 * header of image @img, read as it is: nothing is validated, so the
 * caller must know @img to be an image kvfs built or verified (a
 * block's DRAM copy).  @img holds at least the header.  Inline: the read
 * path asks it of every DRAM copy it serves.
 */
static inline uint16_t kvfs_fmt_img_kind(const void *img)
{
	const uint8_t *p = (const uint8_t *)img +
			   offsetof(struct kvfs_fmt_hdr, kind);

	return (uint16_t)(p[0] | p[1] << 8);
}
/*
 * kvfs_fmt_img_seal() - fill in the payload CRC and then the header CRC
 * of the @size-byte image @img, whose header is otherwise complete (an
 * image whose payload was written where it could not be summed, as by a
 * restoration on the GPU).  @size covers the header, the token area and
 * the payload.  Cannot fail; no locking (the caller owns @img).
 */
void kvfs_fmt_img_seal(uint8_t *img, uint64_t size);

/* Options for kvfs_fmt_validate(). */
enum kvfs_fmt_vflags {
	/* Accept kind HIDDEN (only once hidden-state restoration exists). */
	KVFS_FMT_ALLOW_HIDDEN = 1 << 0,
	/* Skip the payload CRC (the caller checks it by streaming). */
	KVFS_FMT_SKIP_PAYLOAD_CRC = 1 << 1,
	/* Accept kind MIXED: only for images kvfs stored itself (SSD extents,
	 * recovery), never for a client's write.
	 */
	KVFS_FMT_ALLOW_MIXED = 1 << 2,
};

/*
 * kvfs_fmt_validate() - check a whole block file image against a namespace.
 * @buf, @len:    the complete file bytes.
 * @g:            the namespace geometry.
 * @name_key:     the key parsed from the file name, or NULL to skip.
 * @root_key:     the namespace root key (a block whose parent is the root
 *                must have start_pos 0; any other parent needs a
 *                start_pos that is a nonzero multiple of block_tokens).
 * @flags:        enum kvfs_fmt_vflags.
 * @out:          if not NULL, receives the decoded header.
 *
 * Checks, in this order: size >= header, magic, version, kind, dtype,
 * geometry, n_tokens range, chunk_tokens, header CRC, exact file size,
 * zero padding of the token area, payload CRC, key == name, key ==
 * hash(parent, tokens), start_pos.
 *
 * Returns KVFS_FMT_OK or the first failed check. kvfs_fmt_errno() maps the
 * result to -EINVAL, or -EBADMSG for a checksum.
 */
enum kvfs_fmt_err kvfs_fmt_validate(const void *buf, uint64_t len,
				    const struct kvfs_geom *g,
				    const uint8_t *name_key,
				    const uint8_t root_key[KVFS_KEY_LEN],
				    unsigned flags, struct kvfs_fmt_hdr *out);
/* A short human-readable reason for @e, for log lines. */
const char *kvfs_fmt_strerror(enum kvfs_fmt_err e);
/* 0, -EINVAL or -EBADMSG. */
int kvfs_fmt_errno(enum kvfs_fmt_err e);

/*
 * kvfs_fmt_build() - write a complete, valid block file image.
 * @g, @kind:      geometry and kind; @kind HIDDEN needs g->hidden_size.
 * @parent:        parent key (the root key for a first block).
 * @start_pos:     absolute position of the first token.
 * @tokens, @n:    the token ids, 1 <= n <= block_tokens.
 * @payload:       the payload in block layout, or NULL to leave it as is
 *                 in @buf (the caller filled it in place).
 * @buf, @buf_len: destination; must hold kvfs_fmt_file_size() bytes.
 *
 * Computes the key and both CRCs. Returns 0 or -EINVAL.
 */
int kvfs_fmt_build(const struct kvfs_geom *g, uint16_t kind,
		   const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		   const uint32_t *tokens, uint32_t n, const void *payload,
		   void *buf, uint64_t buf_len);
/*
 * Building an image in pieces, for a caller that fills the payload layer
 * by layer and sums it as it goes (the pipelined restore): what
 * kvfs_fmt_build_split() does in one call, split so that the payload CRC
 * can be computed before the header exists.
 *
 * kvfs_fmt_tokens_put() - the token area of the image @img, [header end,
 * kvfs_fmt_payload_off(@n)): the @n ids, then zeros.  The bytes are those
 * kvfs_fmt_build() writes.  Cannot fail; no locking.
 *
 * kvfs_fmt_layer_tail_clear() - zero layer @layer's rows past the last
 * token (the last chunk's padding, zero in every valid image) in the image
 * @img of the layout @kv_from describes.  The caller checked the image's
 * size.  No locking.
 *
 * kvfs_fmt_hdr_put() - the header of the image @buf (@buf_len bytes),
 * whose token area and payload are in place, with @payload_crc, the
 * CRC-32C of everything after the header, as the caller computed it: the
 * key from the token area, then the header CRC.  Returns 0, or -EINVAL
 * for the arguments kvfs_fmt_build_split() refuses.  No locking.
 */
void kvfs_fmt_tokens_put(void *img, const uint32_t *tokens, uint32_t n);
void kvfs_fmt_layer_tail_clear(const struct kvfs_geom *g, uint32_t kv_from,
			       uint32_t n_tokens, uint32_t layer, void *img);
int kvfs_fmt_hdr_put(const struct kvfs_geom *g, uint32_t kv_from,
		     const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		     uint32_t n, uint32_t payload_crc, void *buf,
		     uint64_t buf_len);

/* kvfs_fmt_build() for the layout @kv_from describes: kind KV, MIXED or
 * HIDDEN (kvfs_fmt_split_kind()); @buf must hold kvfs_fmt_split_file_size()
 * bytes.  Returns 0 or -EINVAL.
 */
int kvfs_fmt_build_split(const struct kvfs_geom *g, uint32_t kv_from,
			 const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
			 const uint32_t *tokens, uint32_t n,
			 const void *payload, void *buf, uint64_t buf_len);

#endif
