/* SPDX-License-Identifier: MIT */
/*
 * The device tier suite (test_gpu_tier), private to its files: the
 * harness (gpu_tier_harness.c: byte patterns, the tier under test, test
 * peers, and this program's other roles), the base and device ops
 * (test_gpu_tier.c, which holds main), the copy paths (gpu_tier_copy.c:
 * registered host memory, overlapping destinations, threads) and init
 * and backend-specific behaviour (gpu_tier_init.c).  One program: every
 * file's tests run in the one cmocka group main lists, against the
 * backend KVFS_TEST_GPU names.
 *
 * Not locked: cmocka runs one test at a time, and test_threads' workers
 * call only the tier under test and the byte helpers (gt_mix, gt_pat,
 * gt_is_pat), which keep no state; the gt_peer_* back door is for one
 * thread.
 */
#ifndef KVFS_TESTS_UNIT_GPU_TIER_I_H
#define KVFS_TESTS_UNIT_GPU_TIER_I_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "meta/kvfs_ctl.h"
#include "tier/tier.h"
#include "gpu/gpu.h"

#define PG 4096u
#define MiB (1ull << 20)
#define POOL_CAP (4 * MiB)
#define PEER_SIZE (2 * MiB)
#define NTHREADS 4

enum gt_backend { B_SHM, B_CUDA };

/* The backend under test: set by main before any test runs, then read. */
extern enum gt_backend gt_backend;

/* ---- bytes ---- */

/* A 64-bit mix of @x (splitmix64's finalizer): patterns and test
 * randomness, the same on every run.
 */
uint64_t gt_mix(uint64_t x);

/* gt_pat() - fill @buf with @len bytes of pattern @seed; byte i depends
 *   on i, so misplaced or shifted bytes show.
 * gt_is_pat() - whether @buf holds that pattern; false also when out of
 *   memory for the comparison.
 */
void gt_pat(void *buf, uint64_t len, uint64_t seed);
bool gt_is_pat(const void *buf, uint64_t len, uint64_t seed);

/* malloc that fails the running test instead of returning NULL. */
void *gt_xmalloc(uint64_t len);

/* @len bytes of @buf as 2 * @len hex digits and a NUL into @out. */
void gt_hex_enc(const void *buf, size_t len, char *out);

/* Run this program again with @args (args[0] is ignored): its exit
 * status, or -1 if it was killed or could not run.
 */
int gt_run_self(char **args);

/* ---- the tier under test ---- */

/* A device tier of @cap bytes on the backend under test: 0 or -errno. */
int gt_tier_make(uint64_t cap, struct kvfs_tier **t);

struct gt_fx {
	struct kvfs_tier *t; /* NULL once a test freed it itself */
	const struct kvfs_gpu_ops *g;
};

/* cmocka fixtures: a struct gt_fx over a POOL_CAP tier; teardown frees
 * it and stops the servers of peers destroyed during the test.
 */
int gt_setup(void **state);
int gt_teardown(void **state);

static inline uint64_t gt_ld(atomic_uint_least64_t *v)
{
	return atomic_load(v);
}

/* ---- test peers: client memory, with a back door to check it ---- */

struct gt_peer {
	struct kvfs_ctl_mem m;
	unsigned char *mem; /* shm: our own mapping */
	pid_t pid; /* cuda: the server */
	int to, from; /* cuda: pipes to and from the server */
};

/*
 * gt_peer_create() - @size bytes of peer memory: an shm object this
 *   program maps, or on cuda device memory a server (this program in
 *   its --peer-server role) owns and exports.  0 or -1.
 * gt_peer_fill() / gt_peer_get() - write or read peer bytes
 *   [off, off + len) through the back door; fail the test on an error.
 * gt_peer_is() - whether those bytes are pattern @seed from offset 0.
 * gt_peer_destroy() - unlink the shm object, or queue the cuda server to
 *   be stopped at teardown (a tier may still map its memory).
 * gt_peer_reap() - stop the servers of destroyed peers; call with no
 *   tier left (gt_teardown() does).
 */
int gt_peer_create(struct gt_peer *p, uint64_t size);
void gt_peer_fill(struct gt_peer *p, uint64_t off, const void *buf,
		  uint64_t len);
void gt_peer_get(struct gt_peer *p, uint64_t off, void *buf, uint64_t len);
bool gt_peer_is(struct gt_peer *p, uint64_t off, uint64_t len, uint64_t seed);
void gt_peer_destroy(struct gt_peer *p);
void gt_peer_reap(void);

/* ---- the other roles of this program ---- */

/* --client MEM OFF LEN SEED and --peer-server RFD WFD SIZE (the suite's
 * comment in test_gpu_tier.c): the process's exit status.
 */
int gt_client_main(char **argv);
int gt_peer_server_main(char **argv);

/* ---- tests of the other files, listed in main ---- */

/* gpu_tier_copy.c */
void test_host_register(void **state);
void test_direct_copies(void **state);
void test_mixed_batches(void **state);
void test_shm_register_noop(void **state);
void test_overlap(void **state);
void test_threads(void **state);

/* gpu_tier_init.c */
void test_shm_init_args(void **state);
void test_shm_one_owner_keeps_pages(void **state);
void test_owner_pools(void **state);
void test_shm_sweep(void **state);
void test_cuda_absent(void **state);
void test_cuda_init_args(void **state);
void test_cuda_handle_cache(void **state);

#endif
