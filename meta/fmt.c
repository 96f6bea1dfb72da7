/* SPDX-License-Identifier: MIT */
/*
 * Block file format v1: encoding, keys, sizes and validation.
 *
 * The header is encoded and decoded byte by byte in little-endian order, so
 * the on-disk bytes never depend on the host's struct layout or byte order;
 * struct kvfs_fmt_hdr only carries decoded values.
 */
#include <errno.h>
#include <string.h>

#include <isa-l/crc.h>
#include <openssl/evp.h>

#include "meta/fmt.h"
#include "meta/util.h"

#define ROOT_TAG "kvfs-ns-v1"
/* Bytes 0..83 are covered by the header CRC stored at 84. */
#define HDR_CRC_SPAN 84u
#define HDR_ENC_SIZE ((unsigned)sizeof(struct kvfs_fmt_hdr))







static void hdr_encode(const struct kvfs_fmt_hdr *h, uint8_t *p)
{
	memcpy(p, h->magic, 8);
	kvfs_util_put16(p + 8, h->version);
	kvfs_util_put16(p + 10, h->kind);
	kvfs_util_put16(p + 12, h->dtype);
	kvfs_util_put16(p + 14, h->kv_from);
	kvfs_util_put32(p + 16, h->n_layers);
	kvfs_util_put32(p + 20, h->n_kv_heads);
	kvfs_util_put32(p + 24, h->head_dim);
	kvfs_util_put32(p + 28, h->hidden_size);
	kvfs_util_put32(p + 32, h->n_tokens);
	kvfs_util_put32(p + 36, h->chunk_tokens);
	kvfs_util_put64(p + 40, h->start_pos);
	memcpy(p + 48, h->parent, KVFS_KEY_LEN);
	memcpy(p + 64, h->key, KVFS_KEY_LEN);
	kvfs_util_put32(p + 80, h->payload_crc);
	kvfs_util_put32(p + 84, h->hdr_crc);
}

static void hdr_decode(const uint8_t *p, struct kvfs_fmt_hdr *h)
{
	memcpy(h->magic, p, 8);
	h->version = kvfs_util_get16(p + 8);
	h->kind = kvfs_util_get16(p + 10);
	h->dtype = kvfs_util_get16(p + 12);
	h->kv_from = kvfs_util_get16(p + 14);
	h->n_layers = kvfs_util_get32(p + 16);
	h->n_kv_heads = kvfs_util_get32(p + 20);
	h->head_dim = kvfs_util_get32(p + 24);
	h->hidden_size = kvfs_util_get32(p + 28);
	h->n_tokens = kvfs_util_get32(p + 32);
	h->chunk_tokens = kvfs_util_get32(p + 36);
	h->start_pos = kvfs_util_get64(p + 40);
	memcpy(h->parent, p + 48, KVFS_KEY_LEN);
	memcpy(h->key, p + 64, KVFS_KEY_LEN);
	h->payload_crc = kvfs_util_get32(p + 80);
	h->hdr_crc = kvfs_util_get32(p + 84);
}

size_t kvfs_fmt_dtype_size(uint16_t dtype)
{
	switch (dtype) {
	case KVFS_DTYPE_F16:
	case KVFS_DTYPE_BF16:
		return 2;
	case KVFS_DTYPE_F32:
		return 4;
	case KVFS_DTYPE_F8_E4M3:
		return 1;
	default:
		return 0;
	}
}

static const char *const dtype_names[] = {
	[KVFS_DTYPE_F16] = "f16",
	[KVFS_DTYPE_BF16] = "bf16",
	[KVFS_DTYPE_F32] = "f32",
	[KVFS_DTYPE_F8_E4M3] = "f8_e4m3",
};

#define N_DTYPE_NAMES (sizeof(dtype_names) / sizeof(dtype_names[0]))

const char *kvfs_fmt_dtype_name(uint16_t dtype)
{
	return dtype < N_DTYPE_NAMES ? dtype_names[dtype] : NULL;
}

int kvfs_fmt_dtype_parse(const char *name)
{
	if (!name)
		return -EINVAL;
	for (size_t i = 0; i < N_DTYPE_NAMES; i++)
		if (dtype_names[i] && !strcmp(name, dtype_names[i]))
			return (int)i;
	return -EINVAL;
}

uint32_t kvfs_fmt_crc32c(uint32_t crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint32_t c = ~crc;

	/* ISA-L takes an int length; feed huge buffers in pieces. */
	while (len) {
		size_t n = len > (1u << 30) ? (1u << 30) : len;

		c = crc32_iscsi((unsigned char *)p, (int)n, c);
		p += n;
		len -= n;
	}
	return ~c;
}

/*
 * SHA-256 over up to three pieces, truncated to the key length.  On an
 * OpenSSL failure (allocation) the key is all zeroes, which no valid block
 * hashes to, so a caller comparing keys rejects rather than accepts.
 */
struct piece {
	const void *p;
	size_t len;
};

static void sha_key(const struct piece *pc, size_t n,
		    uint8_t out[KVFS_KEY_LEN])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);

	for (size_t i = 0; ok && i < n; i++)
		ok = EVP_DigestUpdate(ctx, pc[i].p, pc[i].len);
	ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen >= KVFS_KEY_LEN;
	EVP_MD_CTX_free(ctx);
	if (ok)
		memcpy(out, md, KVFS_KEY_LEN);
	else
		memset(out, 0, KVFS_KEY_LEN);
}

void kvfs_fmt_root_key(const char *ns, const char *salt,
		       uint8_t out[KVFS_KEY_LEN])
{
	static const char nul;
	struct piece pc[4] = {
		{ ROOT_TAG, sizeof(ROOT_TAG) }, /* includes its 0x00 */
		{ ns ? ns : "", ns ? strlen(ns) : 0 },
		{ &nul, 1 },
		{ salt ? salt : "", salt ? strlen(salt) : 0 },
	};

	sha_key(pc, 4, out);
}

void kvfs_fmt_root_key_model(const char *ns, const char *salt,
			     const char *model, uint8_t out[KVFS_KEY_LEN])
{
	static const char nul;
	struct piece pc[6] = {
		{ ROOT_TAG, sizeof(ROOT_TAG) }, /* includes its 0x00 */
		{ ns ? ns : "", ns ? strlen(ns) : 0 },
		{ &nul, 1 },
		{ salt ? salt : "", salt ? strlen(salt) : 0 },
		{ &nul, 1 },
		{ model, model ? strlen(model) : 0 },
	};

	if (!model || !model[0]) {
		kvfs_fmt_root_key(ns, salt, out);
		return;
	}
	sha_key(pc, 6, out);
}

/* Hash input is parent ‖ tokens as u32 LE: the raw token area of a file. */
static void block_key_raw(const uint8_t parent[KVFS_KEY_LEN],
			  const uint8_t *tok_le, size_t n_tokens,
			  uint8_t out[KVFS_KEY_LEN])
{
	struct piece pc[2] = {
		{ parent, KVFS_KEY_LEN },
		{ tok_le, n_tokens * 4 },
	};

	sha_key(pc, 2, out);
}

void kvfs_fmt_block_key(const uint8_t parent[KVFS_KEY_LEN],
			const uint32_t *tokens, size_t n_tokens,
			uint8_t out[KVFS_KEY_LEN])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	uint8_t le[256 * 4];
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
		 EVP_DigestUpdate(ctx, parent, KVFS_KEY_LEN);

	/* Encode in batches so the hash input is LE on any host. */
	for (size_t i = 0; ok && i < n_tokens;) {
		size_t n = n_tokens - i > 256 ? 256 : n_tokens - i;

		for (size_t j = 0; j < n; j++)
			kvfs_util_put32(le + 4 * j, tokens[i + j]);
		ok = EVP_DigestUpdate(ctx, le, n * 4);
		i += n;
	}
	ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen >= KVFS_KEY_LEN;
	EVP_MD_CTX_free(ctx);
	if (ok)
		memcpy(out, md, KVFS_KEY_LEN);
	else
		memset(out, 0, KVFS_KEY_LEN);
}

void kvfs_fmt_key_hex(const uint8_t key[KVFS_KEY_LEN],
		      char out[KVFS_KEY_HEX_LEN + 1])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < KVFS_KEY_LEN; i++) {
		out[2 * i] = digits[key[i] >> 4];
		out[2 * i + 1] = digits[key[i] & 15];
	}
	out[KVFS_KEY_HEX_LEN] = '\0';
}


/* Exactly KVFS_KEY_HEX_LEN hex digits at @hex; what follows is the caller's. */
static int parse_hex_prefix(const char *hex, uint8_t out[KVFS_KEY_LEN])
{
	uint8_t tmp[KVFS_KEY_LEN];

	for (int i = 0; i < KVFS_KEY_LEN; i++) {
		int hi = kvfs_util_hexval(hex[2 * i]);
		int lo = hi < 0 ? -1 : kvfs_util_hexval(hex[2 * i + 1]);

		if (lo < 0)
			return -EINVAL;
		tmp[i] = (uint8_t)(hi << 4 | lo);
	}
	memcpy(out, tmp, KVFS_KEY_LEN);
	return 0;
}

int kvfs_fmt_key_parse(const char *hex, uint8_t out[KVFS_KEY_LEN])
{
	if (!hex || strnlen(hex, KVFS_KEY_HEX_LEN + 1) != KVFS_KEY_HEX_LEN)
		return -EINVAL;
	return parse_hex_prefix(hex, out);
}

int kvfs_fmt_name_parse(const char *name, uint8_t out[KVFS_KEY_LEN])
{
	if (!name ||
	    strnlen(name, KVFS_FMT_NAME_LEN + 1) != KVFS_FMT_NAME_LEN ||
	    strcmp(name + KVFS_KEY_HEX_LEN, ".kv"))
		return -EINVAL;
	return parse_hex_prefix(name, out);
}

/* Bytes of one token row of one plane (K, V or X); 0 if impossible. */
static uint64_t row_bytes(const struct kvfs_geom *g, uint16_t kind)
{
	uint64_t esz = kvfs_fmt_dtype_size(g->dtype);
	uint64_t r;

	if (kind == KVFS_KIND_KV) {
		if (__builtin_mul_overflow((uint64_t)g->n_kv_heads,
					   (uint64_t)g->head_dim, &r))
			return 0;
	} else if (kind == KVFS_KIND_HIDDEN) {
		r = g->hidden_size;
	} else {
		return 0;
	}
	if (__builtin_mul_overflow(r, esz, &r))
		return 0;
	return r;
}

/* Bytes of one (layer, chunk) unit: K and V, or X; 0 if impossible. */
static uint64_t chunk_bytes(const struct kvfs_geom *g, uint16_t kind)
{
	uint64_t planes = kind == KVFS_KIND_KV ? 2 : 1;
	uint64_t r = row_bytes(g, kind);

	if (__builtin_mul_overflow(r, (uint64_t)g->chunk_tokens, &r) ||
	    __builtin_mul_overflow(r, planes, &r))
		return 0;
	return r;
}

static uint32_t n_chunks(const struct kvfs_geom *g, uint32_t n_tokens)
{
	return (uint32_t)(((uint64_t)n_tokens + g->chunk_tokens - 1) /
			  g->chunk_tokens);
}

uint32_t kvfs_fmt_hdr_kv_from(const struct kvfs_fmt_hdr *h)
{
	switch (h->kind) {
	case KVFS_KIND_KV:
		return 0;
	case KVFS_KIND_HIDDEN:
		return h->n_layers;
	default:
		return h->kv_from;
	}
}

uint16_t kvfs_fmt_split_kind(const struct kvfs_geom *g, uint32_t kv_from)
{
	if (!kv_from)
		return KVFS_KIND_KV;
	return kv_from >= g->n_layers ? KVFS_KIND_HIDDEN : KVFS_KIND_MIXED;
}

/* Bytes of one layer of @kind with @n_tokens; 0 if impossible. */
static uint64_t layer_bytes(const struct kvfs_geom *g, uint16_t kind,
			    uint32_t n_tokens)
{
	uint64_t cb = chunk_bytes(g, kind), r;

	if (!cb || __builtin_mul_overflow(cb, (uint64_t)n_chunks(g, n_tokens),
					  &r))
		return 0;
	return r;
}

uint64_t kvfs_fmt_split_payload_size(const struct kvfs_geom *g,
				     uint32_t n_tokens, uint32_t kv_from)
{
	uint64_t h = 0, k = 0, r;

	if (!g || !g->n_layers || !g->chunk_tokens || !n_tokens ||
	    kv_from > g->n_layers)
		return 0;
	if (kv_from) {
		uint64_t lb = layer_bytes(g, KVFS_KIND_HIDDEN, n_tokens);

		if (!lb || __builtin_mul_overflow(lb, (uint64_t)kv_from, &h))
			return 0;
	}
	if (kv_from < g->n_layers) {
		uint64_t lb = layer_bytes(g, KVFS_KIND_KV, n_tokens);

		if (!lb || __builtin_mul_overflow(
				   lb, (uint64_t)(g->n_layers - kv_from), &k))
			return 0;
	}
	if (__builtin_add_overflow(h, k, &r))
		return 0;
	return r;
}

uint64_t kvfs_fmt_payload_size(const struct kvfs_geom *g, uint16_t kind,
			       uint32_t n_tokens)
{
	if (!g)
		return 0;
	if (kind == KVFS_KIND_KV)
		return kvfs_fmt_split_payload_size(g, n_tokens, 0);
	if (kind == KVFS_KIND_HIDDEN)
		return kvfs_fmt_split_payload_size(g, n_tokens, g->n_layers);
	/* MIXED needs its kv_from: kvfs_fmt_split_payload_size(). */
	return 0;
}

uint64_t kvfs_fmt_payload_off(uint32_t n_tokens)
{
	uint64_t tok = (uint64_t)n_tokens * 4;

	return KVFS_FMT_HDR_SIZE + (tok + KVFS_FMT_ALIGN - 1) /
		KVFS_FMT_ALIGN * KVFS_FMT_ALIGN;
}

uint64_t kvfs_fmt_file_size(const struct kvfs_geom *g, uint16_t kind,
			    uint32_t n_tokens)
{
	uint64_t p = kvfs_fmt_payload_size(g, kind, n_tokens);
	uint64_t r;

	if (!p || __builtin_add_overflow(p, kvfs_fmt_payload_off(n_tokens), &r))
		return 0;
	return r;
}

uint64_t kvfs_fmt_split_file_size(const struct kvfs_geom *g,
				  uint32_t n_tokens, uint32_t kv_from)
{
	uint64_t p = kvfs_fmt_split_payload_size(g, n_tokens, kv_from);
	uint64_t r;

	if (!p || __builtin_add_overflow(p, kvfs_fmt_payload_off(n_tokens), &r))
		return 0;
	return r;
}

uint64_t kvfs_fmt_max_file_size(const struct kvfs_geom *g)
{
	uint64_t kv, hid = 0;

	if (!g)
		return 0;
	kv = kvfs_fmt_file_size(g, KVFS_KIND_KV, g->block_tokens);
	if (g->hidden_size)
		hid = kvfs_fmt_file_size(g, KVFS_KIND_HIDDEN, g->block_tokens);
	return kv > hid ? kv : hid;
}

int kvfs_fmt_layer_range(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t kv_from, uint32_t layer, uint64_t *off,
			 uint64_t *len)
{
	uint64_t o;

	if (!g || !off || !len || !n_tokens || n_tokens > g->block_tokens ||
	    !kvfs_fmt_split_payload_size(g, n_tokens, kv_from) ||
	    layer >= g->n_layers)
		return -EINVAL;
	/* The whole payload fits in u64 (checked above), so these do too. */
	o = kvfs_fmt_payload_off(n_tokens);
	if (layer < kv_from) {
		uint64_t lb = layer_bytes(g, KVFS_KIND_HIDDEN, n_tokens);

		*off = o + layer * lb;
		*len = lb;
	} else {
		uint64_t lb = layer_bytes(g, KVFS_KIND_KV, n_tokens);

		if (kv_from)
			o += kv_from * layer_bytes(g, KVFS_KIND_HIDDEN,
						   n_tokens);
		*off = o + (uint64_t)(layer - kv_from) * lb;
		*len = lb;
	}
	return 0;
}

int kvfs_fmt_piece_range(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t kv_from, uint32_t layer, uint32_t chunk,
			 uint64_t *off, uint64_t *len)
{
	uint64_t lo, ll, cb;
	int rc;

	if (!g || !off || !len)
		return -EINVAL;
	rc = kvfs_fmt_layer_range(g, n_tokens, kv_from, layer, &lo, &ll);
	if (rc)
		return rc;
	if (chunk >= n_chunks(g, n_tokens))
		return -EINVAL;
	cb = chunk_bytes(g, layer < kv_from ? KVFS_KIND_HIDDEN : KVFS_KIND_KV);
	*off = lo + (uint64_t)chunk * cb;
	*len = cb;
	return 0;
}

int kvfs_fmt_chunk_range(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t layer, uint32_t chunk, uint64_t *off,
			 uint64_t *len)
{
	return kvfs_fmt_piece_range(g, n_tokens, 0, layer, chunk, off, len);
}

size_t kvfs_fmt_chunk_ncrcs(const struct kvfs_geom *g, uint32_t n_tokens)
{
	uint32_t c = g->chunk_tokens;

	return c ? (size_t)g->n_layers * ((n_tokens + c - 1) / c) : 0;
}

/* The table covers the stored pieces, whatever the split: hidden-state
 * rows below @kv_from, K and V from it on. Those are the bytes the SSD
 * holds, so every piece read from it can be checked before use.
 */
void kvfs_fmt_chunk_crcs(const struct kvfs_geom *g, uint32_t n_tokens,
			 uint32_t kv_from, const void *img, uint32_t *out)
{
	uint32_t c = g->chunk_tokens;
	uint32_t nc = c ? (n_tokens + c - 1) / c : 0;
	uint64_t off, len;

	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t j = 0; j < nc; j++) {
			size_t k = (size_t)l * nc + j;

			if (kvfs_fmt_piece_range(g, n_tokens, kv_from, l, j,
						 &off, &len)) {
				out[k] = 0;
				continue;
			}
			out[k] = kvfs_fmt_crc32c(0, (const uint8_t *)img + off,
						 (size_t)len);
		}
}

static bool all_zero(const uint8_t *p, uint64_t len)
{
	/* The first byte is zero and every byte equals its successor. */
	if (!len)
		return true;
	return p[0] == 0 && !memcmp(p, p + 1, len - 1);
}

/*
 * The rows past n_tokens in each layer's last chunk are padding: they must
 * be zero, or two files of the same block could differ and a sparse reader
 * would see garbage past the prefix.
 */
/* The rows past the last token of layer @l's last chunk, in the payload
 * @pay: cleared (@clear), or checked to be zero.  True when they are.
 */
static bool layer_tail_rows(const struct kvfs_geom *g, uint32_t kv_from,
			    uint32_t n_tokens, uint32_t l, uint8_t *pay,
			    bool clear)
{
	uint32_t c = g->chunk_tokens, used = n_tokens % c;
	uint64_t nchunks = (n_tokens + c - 1) / c;
	uint16_t kind = l < kv_from ? KVFS_KIND_HIDDEN : KVFS_KIND_KV;
	int parts = kind == KVFS_KIND_HIDDEN ? 1 : 2;
	uint64_t row = row_bytes(g, kind), off, len;
	uint8_t *last;

	if (!used)
		return true;
	/* The caller checked the size, so the range exists. */
	kvfs_fmt_piece_range(g, n_tokens, kv_from, l, (uint32_t)(nchunks - 1),
			     &off, &len);
	last = pay + (off - kvfs_fmt_payload_off(n_tokens));
	for (int k = 0; k < parts; k++) {
		uint8_t *t = last + k * c * row + used * row;

		if (clear)
			memset(t, 0, (c - used) * row);
		else if (!all_zero(t, (c - used) * row))
			return false;
	}
	return true;
}

static bool tail_rows(const struct kvfs_geom *g, uint32_t kv_from,
		      uint32_t n_tokens, uint8_t *pay, bool clear)
{
	for (uint32_t l = 0; l < g->n_layers; l++)
		if (!layer_tail_rows(g, kv_from, n_tokens, l, pay, clear))
			return false;
	return true;
}

void kvfs_fmt_layer_tail_clear(const struct kvfs_geom *g, uint32_t kv_from,
			       uint32_t n_tokens, uint32_t layer, void *img)
{
	layer_tail_rows(g, kv_from, n_tokens, layer,
			(uint8_t *)img + kvfs_fmt_payload_off(n_tokens), true);
}

enum kvfs_fmt_err kvfs_fmt_validate(const void *buf, uint64_t len,
				    const struct kvfs_geom *g,
				    const uint8_t *name_key,
				    const uint8_t root_key[KVFS_KEY_LEN],
				    unsigned flags, struct kvfs_fmt_hdr *out)
{
	const uint8_t *p = buf;
	struct kvfs_fmt_hdr h;
	uint64_t size, tok_end, pay_off;
	uint32_t kv_from;
	uint8_t key[KVFS_KEY_LEN];

	if (!p || len < KVFS_FMT_HDR_SIZE)
		return KVFS_FMT_ETOOSHORT;
	hdr_decode(p, &h);
	if (out)
		*out = h;
	if (memcmp(h.magic, KVFS_FMT_MAGIC, 8))
		return KVFS_FMT_EMAGIC;
	if (h.version != KVFS_FMT_VERSION)
		return KVFS_FMT_EVERSION;
	if (h.kind != KVFS_KIND_KV &&
	    !(h.kind == KVFS_KIND_HIDDEN && (flags & KVFS_FMT_ALLOW_HIDDEN)) &&
	    !(h.kind == KVFS_KIND_MIXED && (flags & KVFS_FMT_ALLOW_MIXED)))
		return KVFS_FMT_EKIND;
	if (!kvfs_fmt_dtype_size(h.dtype) || h.dtype != g->dtype)
		return KVFS_FMT_EDTYPE;
	if (h.n_layers != g->n_layers || h.n_kv_heads != g->n_kv_heads ||
	    h.head_dim != g->head_dim)
		return KVFS_FMT_EGEOM;
	if (h.kind != KVFS_KIND_KV ?
		    (!g->hidden_size || h.hidden_size != g->hidden_size) :
		    (h.hidden_size && h.hidden_size != g->hidden_size))
		return KVFS_FMT_EGEOM;
	if (!h.n_tokens || h.n_tokens > g->block_tokens)
		return KVFS_FMT_ENTOKENS;
	if (h.chunk_tokens != g->chunk_tokens)
		return KVFS_FMT_ECHUNK;
	if (kvfs_fmt_crc32c(0, p, HDR_CRC_SPAN) != h.hdr_crc)
		return KVFS_FMT_EHDRCRC;
	if (h.kind == KVFS_KIND_MIXED &&
	    (!h.kv_from || h.kv_from >= h.n_layers))
		return KVFS_FMT_EGEOM;
	kv_from = kvfs_fmt_hdr_kv_from(&h);
	size = kvfs_fmt_split_file_size(g, h.n_tokens, kv_from);
	if (!size || len != size)
		return KVFS_FMT_ESIZE;
	/* Nothing but zeroes may hide in the unused header and token bytes:
	 * the header tail is covered by no CRC at all.
	 */
	tok_end = KVFS_FMT_HDR_SIZE + (uint64_t)h.n_tokens * 4;
	pay_off = kvfs_fmt_payload_off(h.n_tokens);
	if ((h.kind != KVFS_KIND_MIXED && h.kv_from) ||
	    !all_zero(p + HDR_ENC_SIZE,
				KVFS_FMT_HDR_SIZE - HDR_ENC_SIZE) ||
	    !all_zero(p + tok_end, pay_off - tok_end) ||
	    !tail_rows(g, kv_from, h.n_tokens, (uint8_t *)p + pay_off, false))
		return KVFS_FMT_EPAD;
	if (!(flags & KVFS_FMT_SKIP_PAYLOAD_CRC) &&
	    kvfs_fmt_crc32c(0, p + KVFS_FMT_HDR_SIZE,
			    len - KVFS_FMT_HDR_SIZE) != h.payload_crc)
		return KVFS_FMT_EPAYLOADCRC;
	if (name_key && memcmp(name_key, h.key, KVFS_KEY_LEN))
		return KVFS_FMT_ENAME;
	block_key_raw(h.parent, p + KVFS_FMT_HDR_SIZE, h.n_tokens, key);
	if (memcmp(key, h.key, KVFS_KEY_LEN))
		return KVFS_FMT_EKEY;
	if (root_key && !memcmp(h.parent, root_key, KVFS_KEY_LEN)) {
		if (h.start_pos)
			return KVFS_FMT_ESTARTPOS;
	} else if (root_key && !h.start_pos) {
		/* Only the root's children start at position 0. */
		return KVFS_FMT_ESTARTPOS;
	} else if (h.start_pos % g->block_tokens) {
		return KVFS_FMT_ESTARTPOS;
	}
	return KVFS_FMT_OK;
}

const char *kvfs_fmt_strerror(enum kvfs_fmt_err e)
{
	switch (e) {
	case KVFS_FMT_OK: return "ok";
	case KVFS_FMT_ETOOSHORT: return "file shorter than the header";
	case KVFS_FMT_EMAGIC: return "bad magic";
	case KVFS_FMT_EVERSION: return "unsupported format version";
	case KVFS_FMT_EKIND: return "unsupported block kind";
	case KVFS_FMT_EDTYPE: return "dtype differs from the namespace";
	case KVFS_FMT_EGEOM: return "geometry differs from the namespace";
	case KVFS_FMT_ENTOKENS: return "n_tokens out of range";
	case KVFS_FMT_ECHUNK: return "chunk_tokens differs from the namespace";
	case KVFS_FMT_EPAD: return "nonzero padding";
	case KVFS_FMT_ESIZE: return "file size does not match the header";
	case KVFS_FMT_EHDRCRC: return "header checksum mismatch";
	case KVFS_FMT_EPAYLOADCRC: return "payload checksum mismatch";
	case KVFS_FMT_ENAME: return "key differs from the file name";
	case KVFS_FMT_EKEY: return "key is not the hash of parent and tokens";
	case KVFS_FMT_ESTARTPOS: return "start_pos does not fit the parent";
	}
	return "unknown format error";
}

int kvfs_fmt_errno(enum kvfs_fmt_err e)
{
	switch (e) {
	case KVFS_FMT_OK:
		return 0;
	case KVFS_FMT_EHDRCRC:
	case KVFS_FMT_EPAYLOADCRC:
		return -EBADMSG;
	default:
		return -EINVAL;
	}
}

void kvfs_fmt_tokens_put(void *img, const uint32_t *tokens, uint32_t n)
{
	uint8_t *p = img;

	memset(p + KVFS_FMT_HDR_SIZE, 0,
	       kvfs_fmt_payload_off(n) - KVFS_FMT_HDR_SIZE);
	for (uint32_t i = 0; i < n; i++)
		kvfs_util_put32(p + KVFS_FMT_HDR_SIZE + 4 * (uint64_t)i,
				tokens[i]);
}

/* The checks kvfs_fmt_build_split() and kvfs_fmt_hdr_put() share: the
 * image's size, or 0 when the arguments are bad.
 */
static uint64_t build_size(const struct kvfs_geom *g, uint32_t kv_from,
			   const uint8_t *parent, uint32_t n, const void *buf,
			   uint64_t buf_len)
{
	uint64_t size;

	if (!g || !parent || !buf || !n || n > g->block_tokens ||
	    kv_from > g->n_layers || (kv_from && !g->hidden_size) ||
	    kv_from > UINT16_MAX)
		return 0;
	size = kvfs_fmt_split_file_size(g, n, kv_from);
	return size <= buf_len ? size : 0;
}

/* The header of the image @p (@size bytes, token area and payload in
 * place), with @crc as its payload CRC.
 */
static void hdr_put(const struct kvfs_geom *g, uint32_t kv_from,
		    const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		    uint32_t n, uint32_t crc, uint8_t *p)
{
	struct kvfs_fmt_hdr h;
	uint16_t kind = kvfs_fmt_split_kind(g, kv_from);

	memset(&h, 0, sizeof(h));
	memcpy(h.magic, KVFS_FMT_MAGIC, 8);
	h.version = KVFS_FMT_VERSION;
	h.kind = kind;
	h.kv_from = kind == KVFS_KIND_MIXED ? (uint16_t)kv_from : 0;
	h.dtype = g->dtype;
	h.n_layers = g->n_layers;
	h.n_kv_heads = g->n_kv_heads;
	h.head_dim = g->head_dim;
	h.hidden_size = g->hidden_size;
	h.n_tokens = n;
	h.chunk_tokens = g->chunk_tokens;
	h.start_pos = start_pos;
	memcpy(h.parent, parent, KVFS_KEY_LEN);
	block_key_raw(parent, p + KVFS_FMT_HDR_SIZE, n, h.key);
	h.payload_crc = crc;
	memset(p, 0, KVFS_FMT_HDR_SIZE);
	hdr_encode(&h, p);
	h.hdr_crc = kvfs_fmt_crc32c(0, p, HDR_CRC_SPAN);
	kvfs_util_put32(p + 84, h.hdr_crc);
}

int kvfs_fmt_build_split(const struct kvfs_geom *g, uint32_t kv_from,
			 const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
			 const uint32_t *tokens, uint32_t n,
			 const void *payload, void *buf, uint64_t buf_len)
{
	uint64_t size = build_size(g, kv_from, parent, n, buf, buf_len);
	uint8_t *p = buf;
	uint64_t pay_off;

	if (!size || !tokens)
		return -EINVAL;
	pay_off = kvfs_fmt_payload_off(n);
	/* The payload may already be in place: only rewrite what precedes
	 * it.
	 */
	kvfs_fmt_tokens_put(p, tokens, n);
	if (payload)
		memmove(p + pay_off, payload, size - pay_off);
	/* Rows past the last token are padding, always zero. */
	tail_rows(g, kv_from, n, p + pay_off, true);
	hdr_put(g, kv_from, parent, start_pos, n,
		kvfs_fmt_crc32c(0, p + KVFS_FMT_HDR_SIZE,
				size - KVFS_FMT_HDR_SIZE),
		p);
	return 0;
}

int kvfs_fmt_hdr_put(const struct kvfs_geom *g, uint32_t kv_from,
		     const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		     uint32_t n, uint32_t payload_crc, void *buf,
		     uint64_t buf_len)
{
	if (!build_size(g, kv_from, parent, n, buf, buf_len))
		return -EINVAL;
	hdr_put(g, kv_from, parent, start_pos, n, payload_crc, buf);
	return 0;
}

void kvfs_fmt_img_seal(uint8_t *img, uint64_t size)
{
	uint32_t crc = kvfs_fmt_crc32c(0, img + KVFS_FMT_HDR_SIZE,
				       size - KVFS_FMT_HDR_SIZE);

	kvfs_util_put32(img + offsetof(struct kvfs_fmt_hdr, payload_crc), crc);
	crc = kvfs_fmt_crc32c(0, img, offsetof(struct kvfs_fmt_hdr, hdr_crc));
	kvfs_util_put32(img + offsetof(struct kvfs_fmt_hdr, hdr_crc), crc);
}

int kvfs_fmt_build(const struct kvfs_geom *g, uint16_t kind,
		   const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		   const uint32_t *tokens, uint32_t n, const void *payload,
		   void *buf, uint64_t buf_len)
{
	if (!g || (kind != KVFS_KIND_KV && kind != KVFS_KIND_HIDDEN))
		return -EINVAL;
	return kvfs_fmt_build_split(g, kind == KVFS_KIND_KV ? 0 : g->n_layers,
				    parent, start_pos, tokens, n, payload, buf,
				    buf_len);
}
