/* SPDX-License-Identifier: MIT */
/*
 * The block chains the remote-tier tests share (redis_client.c,
 * remote_client.c): namespace "m" with the mount tests' geometry, no
 * salt; chain TAG's tokens start at TAG * 100000, so chains of different
 * tags never share keys.  Block i's payload is a pattern of i and TAG.
 */
#ifndef KVFS_TESTS_CHAIN_I_H
#define KVFS_TESTS_CHAIN_I_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta/fmt.h"

static const struct kvfs_geom chain_geom = {
	.n_layers = 4,
	.n_kv_heads = 2,
	.head_dim = 64,
	.block_tokens = 16,
	.chunk_tokens = 4,
	.dtype = KVFS_DTYPE_BF16,
};

/* Block @i of chain @tag after @parent: the image (to free; exits on
 * failure), its key into @key, its length into *@len.
 */
static inline uint8_t *chain_block(unsigned tag, unsigned i,
				   const uint8_t *parent,
				   uint8_t key[KVFS_KEY_LEN], uint64_t *len)
{
	uint32_t toks[16];
	uint64_t n = kvfs_fmt_file_size(&chain_geom, KVFS_KIND_KV, 16);
	uint64_t off = kvfs_fmt_payload_off(16);
	uint8_t *img = calloc(1, n);

	if (!img)
		exit(2);
	for (unsigned j = 0; j < 16; j++)
		toks[j] = tag * 100000 + i * 16 + j;
	for (uint64_t b = off; b < n; b++)
		img[b] = (uint8_t)(b * 31 + i * 7 + tag);
	if (kvfs_fmt_build(&chain_geom, KVFS_KIND_KV, parent, (uint64_t)i * 16,
			   toks, 16, img + off, img, n))
		exit(2);
	memcpy(key, ((struct kvfs_fmt_hdr *)img)->key, KVFS_KEY_LEN);
	*len = n;
	return img;
}

/* The first @n blocks of chain @tag from namespace root @root: images
 * (each to free, and the array) and keys into @keys.
 */
static inline uint8_t **chain_make(const uint8_t *root, unsigned tag,
				   unsigned n, uint8_t (*keys)[KVFS_KEY_LEN],
				   uint64_t *len)
{
	uint8_t **img = calloc(n ? n : 1, sizeof(*img));

	if (!img)
		exit(2);
	for (unsigned i = 0; i < n; i++)
		img[i] = chain_block(tag, i, i ? keys[i - 1] : root, keys[i],
				     len);
	return img;
}

#endif
