/* SPDX-License-Identifier: MIT */
/*
 * The fixture of the chunk-read suites (test_chunk.c, test_chunk_spec.c,
 * test_chunk_hidden.c): a temp store holding, in one namespace per dtype
 * and one with an odd chunk size, the same chain of three blocks (64, 64
 * and 40 tokens) with seeded payloads, committed through the write path
 * and written back; a request builder that reads pieces (block, layer,
 * chunk) and checks every delivered byte against the block's image; and
 * small probes of where a piece lives and what it scores.  Failures are
 * cmocka assertions.  Not thread-safe, except where a function says so.
 */
#ifndef KVFS_TESTS_UNIT_CHUNK_FX_I_H
#define KVFS_TESTS_UNIT_CHUNK_FX_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "cache/chunk.h"
#include "cache/params.h"
#include "meta/fmt.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)

/*
 * Namespaces, one per dtype, and one whose chunk (2 * 16 * 2 * 96 * 1 =
 * 6144 bytes) is not a multiple of 4 KiB. The others: 4 layers, 2 heads,
 * head_dim 128, 64-token blocks of 16-token chunks, so bf16 chunks are
 * 16 KiB and a block has 4 chunks per layer.
 */
enum { NS_BF16, NS_F16, NS_F32, NS_F8, NS_ODD, NNS };
#define NBLK 3 /* a chain: two full blocks, then a 40-token one */

extern const char *const ns_names[NNS];

/* The device backend of fixtures with a device set: shm, or cuda when
 * KVFS_TEST_GPU=cuda (chunk_fx_init()).
 */
extern int gpu_backend;

/* Offset of a request's destinations from a page boundary (req_init()):
 * 0 reads into them directly, anything else through the scratch buffer.
 * Tests that change it set it back to 0.
 */
extern size_t g_misalign;

struct fx {
	char dir[64];
	struct kvfs_cache_params conf;
	struct kvfs_cache *c;
	uint8_t *img[NNS][NBLK];
	uint64_t size[NNS][NBLK];
	char name[NNS][NBLK][KVFS_FMT_NAME_LEN + 1];
	uint8_t key[NNS][NBLK][KVFS_KEY_LEN];
};

/* What a fixture's cache is given: chunk sets, half-life, speculation. */
struct opts {
	uint64_t chunk_dram, chunk_gpu;
	unsigned halflife;
	unsigned spec_depth; /* 0: the default */
};

/* A request of @np pieces (block, layer, chunk) of one namespace. */
struct req {
	struct kvfs_chunk_piece p[64];
	int blk[64];
	uint8_t *buf; /* the destinations, piece after piece */
	uint8_t *mem; /* its allocation */
	size_t np;
	struct kvfs_chunk_result res;
};

/* chunk_fx_init() - read KVFS_TEST_GPU into gpu_backend and quiet the
 * log (refusals log by design) unless KVFS_TEST_LOG is set.  Call first
 * in main().
 */
void chunk_fx_init(void);

/* ns_geom() - the geometry of namespace @n.  blk_tokens() - the tokens of
 * block @i of the chain (64, 64, 40).
 */
struct kvfs_geom ns_geom(int n);
uint32_t blk_tokens(int i);

/* xs() - the next value of the xorshift generator @s (never 0 if *@s is
 * not).  Safe from any thread for its own @s.
 */
uint64_t xs(uint64_t *s);

/*
 * fx_new() - a temp store with the chain committed in every namespace and
 *   written back, opened with background threads off; @remount reopens
 *   it so that every block starts on the SSD only.  Never NULL.
 * fx_open() - open f->dir with f->conf.  fx_remount() - close and open
 *   again: DRAM empties, what is on the SSD stays.
 * fx_free() - close, free the images and remove the directory.
 */
struct fx *fx_new(const struct opts *o, bool remount);
void fx_open(struct fx *f);
void fx_remount(struct fx *f);
void fx_free(struct fx *f);

/* cmocka setups of a fixture without chunk sets (setup_nocache) or with a
 * 64 MiB DRAM set (setup_dram), each remounted; teardown frees either.
 * They return 0.
 */
int setup_nocache(void **state);
int setup_dram(void **state);
int teardown(void **state);

/* ns_of() - namespace @n of @f.  blk() - a reference on block @i of
 * namespace @n, which the caller puts back.  Neither returns NULL.
 */
struct kvfs_ns *ns_of(struct fx *f, int n);
struct kvfs_block *blk(struct fx *f, int n, int i);

/* want() - the bytes piece (@l, @c) of block @i must hold, and their
 * length in *@len.  cbytes() - the size of a full-block chunk of
 * namespace @n.
 */
const uint8_t *want(struct fx *f, int n, int i, uint32_t l, uint32_t c,
		    uint64_t *len);
uint64_t cbytes(int n);

/*
 * req_init() - a request for the @np (at most 64) pieces @trip (block,
 *   layer, chunk triples) of namespace @n, with destinations filled with
 *   0xee at g_misalign past a page boundary; it holds a reference on each
 *   piece's block until req_free().
 * req_check() - every delivered piece holds exactly its bytes; one with an
 *   error is untouched, or zeroed after a read in place.
 * req_run() - kvfs_chunk_read() with @flags, then req_check(); returns what
 *   the read returned (0 or -errno).
 */
void req_init(struct fx *f, struct req *r, int n, const int *trip, size_t np);
void req_free(struct fx *f, struct req *r);
void req_check(struct fx *f, struct req *r, int n);
int req_run(struct fx *f, struct req *r, int n, unsigned flags);

/* read_pieces() - read @np pieces of namespace @n, which must succeed and
 * check, each served from @want_from (any when 0); returns the result.
 * one() - read piece (layer 0, chunk @c) of block @i of NS_BF16 so.
 */
struct kvfs_chunk_result read_pieces(struct fx *f, int n, const int *trip,
				     size_t np, int want_from);
void one(struct fx *f, int i, int c, int want_from);

/* stat_of() - the value of line @key of the cache's stats, which must
 * exist.
 */
uint64_t stat_of(struct fx *f, const char *key);

/* where() - where piece (@l, @c) of block @i of namespace @n is held
 * (kvfs_chunk_where()).  score() - add @a to chunk @c's I.  get_score() -
 * its I and F, checking that S = I * F.
 */
int where(struct fx *f, int n, int i, uint32_t l, uint32_t c);
void score(struct fx *f, int n, int i, uint32_t c, double a);
void get_score(struct fx *f, int n, int i, uint32_t c, double *iv,
	       uint64_t *fv);

#endif
