/* SPDX-License-Identifier: MIT */
/*
 * The harness of the mount fuzzer (fuzz_client.c), implemented by
 * fuzz_harness.c and used by every target file: fuzz_ctl*.c,
 * fuzz_xattr.c, fuzz_blocks.c and fuzz_ns.c.  The targets share one
 * source of randomness, one journal and one way to fail, so that a
 * failure in any of them is reported, and replayed, the same way.
 *
 * A check that does not hold ends in fz_fail(), which leaves the running
 * cmocka test by longjmp.  The targets' work buffers are therefore made
 * once, in the group's setup, and freed in its teardown (the
 * *_bufs_alloc() pairs below): a failure leaves no leak behind for
 * LeakSanitizer to report on top of it.
 *
 * Threads: only the ctl_threads target makes calls outside the main
 * thread.  What its workers may use is marked "any thread"; the rest is
 * for the main thread.
 */
#ifndef KVFS_TESTS_INTEGRATION_FUZZ_I_H
#define KVFS_TESTS_INTEGRATION_FUZZ_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/fmt.h"
#include "meta/kvfs_ctl.h"

/* The shm objects handed to the daemon as peer memory and sync words. */
#define PEER_SIZE (1u << 20)
#define SYNC_SIZE 4096u

/* Calls that may be in flight at once, each watched in its own slot. */
#define SLOTS 4

/* ------------------------------------------------------------ settings */

/*
 * Read from the environment and the mount by fz_read_settings(), then
 * only read: KVFS_MNT and KVFS_NS, the namespace's directory, its
 * .kvfs/ctl and .kvfs/stats; its geometry and root key; the largest block
 * file that geometry allows.
 */
extern const char *mnt, *ns;
extern char ctl_path[4200], stats_path[4200], ns_path[4200];
extern struct kvfs_geom g;
extern uint8_t root[16];
extern uint64_t max_file;

/* KVFS_FUZZ_ITER, the one iteration to run, or -1 for all of them. */
extern long only_iter;

/* A block stored before fuzzing began (KVFS_FUZZ_SEEDKEYS): the fuzzer
 * may read, pin and evict it, never change or delete it.
 */
struct seedblk {
	uint8_t key[16];
	uint8_t *img;
	uint64_t len;
	struct kvfs_fmt_hdr h;
	uint32_t tok[256];
	int chain[16];     /* indices into seeds[], root first */
	int chain_len;
};
extern struct seedblk *seeds;
extern int n_seeds;

/* A good block made by kvfs-gen (KVFS_FUZZ_GOOD), a start for mutants. */
struct tmpl {
	uint8_t *img;
	uint64_t len;
};
extern struct tmpl *tmpls;
extern int n_tmpls;

/* The caller's shm objects, by name and mapped: PEER_SIZE and SYNC_SIZE
 * bytes, both the fuzzer's to overwrite at will.
 */
extern char peer_name[64], sync_name[64];
extern uint8_t *peer_mem, *sync_mem;

/* An ioctl argument's worth (16 KiB), for any target's scratch use in the
 * main thread.
 */
extern uint8_t *iobuf;

/*
 * fz_read_settings() - read the environment (KVFS_MNT, KVFS_NS, KVFS_PID,
 *   KVFS_FUZZ_SEED, _SCALE, _ITER, _HANG_S, _SUMMARY) and the namespace's
 *   geometry and root key from its xattrs.  Returns 0; or -1 when
 *   KVFS_MNT, KVFS_NS or KVFS_PID is unset (said on stderr) or the
 *   namespace's xattrs are missing or not understood (said nowhere: the
 *   group's setup fails).
 * fz_start() - everything else the targets rely on: iobuf, the watchdog
 *   thread, the seeded blocks (which must all validate) and templates,
 *   and fresh shm objects named after KVFS_FUZZ_SHM_TAG; then the run's
 *   first summary line.  Call after fz_read_settings().  Returns 0, or -1
 *   when a seeded block is unreadable or invalid; an allocation failure
 *   fails the cmocka group instead.
 * fz_stop() - free and unlink what fz_start() made, and close the summary
 *   file.  The watchdog keeps running until the program exits.
 */
int fz_read_settings(void);
int fz_start(void);
void fz_stop(void);

/* -------------------------------------------------------------- random */

/* A splitmix64 generator; any thread may use its own. */
struct rng {
	uint64_t s;
};

/*
 * rng_for() - the generator of iteration @iter of target number @target:
 *   every target and iteration gets its own, so that one replays alone.
 *   A target's number is part of what a seed means: it never changes.
 * rnd() - the next 64 random bits of @r.
 * below() - a value in [0, @n), or 0 when @n is 0.
 * chance() - true with probability @pct percent.
 * fill() - @n random bytes at @p.
 * edge64(), edge32() - mostly a boundary value (0, powers of two and their
 *   neighbours, PEER_SIZE's, the type's largest), sometimes any value.
 * Any thread, each with its own @r; none fails.
 */
struct rng rng_for(unsigned target, long iter);
uint64_t rnd(struct rng *r);
uint32_t below(struct rng *r, uint32_t n);
bool chance(struct rng *r, unsigned pct);
void fill(struct rng *r, void *p, size_t n);
uint64_t edge64(struct rng *r);
uint32_t edge32(struct rng *r);

/* ------------------------------------------------ journal and failures */

/* The iteration running, -1 between iterations; FOR_ITER sets it, the
 * replay line reports it.
 */
extern long cur_iter;

/* The watchdog slot of the calling thread: 0 for the main thread, 1 + its
 * index for a ctl_threads worker (below SLOTS).
 */
extern __thread int slot;

/* Set by a ctl_threads worker: fz_fail() then ends only that thread and
 * leaves the first message in worker_fail, for the main thread to report
 * after pthread_join() ("" while none failed).
 */
extern __thread bool in_worker;
extern char worker_fail[512];

/*
 * What the running target did, printed by end_target().  Counted with
 * COUNT() (atomically: workers count too); resp[] and resp_ok[] by ctl op
 * (well-formed responses, and those with error 0), accepted and refused
 * by the block-file target.
 */
struct fz_tally {
	unsigned long iters, calls, ok, errs;
	unsigned long resp[KVFS_CTL_OP_MAX + 1];
	unsigned long resp_ok[KVFS_CTL_OP_MAX + 1];
	unsigned long accepted, refused;
};
extern struct fz_tally tally;

#define COUNT(f) __atomic_fetch_add(&tally.f, 1, __ATOMIC_RELAXED)

/*
 * op_begin() - journal the call about to be made (printf @fmt) and start
 *   the watchdog's clock on the caller's slot; counts one call.
 * op_end() - the call returned: stop that clock.
 * Every call into the mount sits between the two, so that a hang or a
 * failure names it.  Any thread; neither fails.
 */
void op_begin(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void op_end(void);

/*
 * fz_fail() - fail the running target with the message @fmt.  In the main
 * thread: the message, the last calls of the journal and the line that
 * replays the iteration go to stderr (and to the KVFS_FUZZ_SUMMARY file),
 * then cmocka's fail_msg() leaves the test by longjmp.  In a worker
 * (in_worker): the message goes to worker_fail and the thread exits.
 * Never returns; any thread.
 */
void fz_fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

/* check_alive() - the daemon process exists, is not a zombie, and the
 * mount answers; otherwise the daemon is marked dead (later targets then
 * fail at once) and fz_fail().
 */
void check_alive(void);

/* ------------------------------------------------------- errno checks */

/* A list of allowed outcomes for want(): 0 for success, or errnos. */
#define END_ERR (-1)
#define OKS(...) ((const int[]){ __VA_ARGS__, END_ERR })

/*
 * ename() - "success", or @e's text and number; a buffer of the calling
 *   thread's, valid until its next call.
 * want() - @err (0 or an errno) must be in @ok (an OKS() list): counts it
 *   in tally.ok or tally.errs and returns.  ENOTCONN or ECONNABORTED mark
 *   the daemon dead; those and anything outside @ok fz_fail(), naming
 *   @what and the outcomes allowed.
 * err_of() - errno when @rc is negative (a failed call), else 0.
 * Any thread.
 */
const char *ename(int e);
void want(int err, const int *ok, const char *what);
int err_of(long rc);

/* ------------------------------------------- blocks and the namespace */

/*
 * key_path() - the path of the block @key in the namespace, into @out
 *   (@len bytes, truncated to fit).
 * slurp() - the whole file at @path (at most max_file bytes) into *@out,
 *   malloc'ed for the caller to free, and its length into *@len.  Returns
 *   0, or an errno (EFBIG when the file is longer) with nothing to free.
 */
void key_path(char *out, size_t len, const uint8_t key[16]);
int slurp(const char *path, uint8_t **out, uint64_t *len);

/*
 * seed_of() - the index in seeds[] of the block @key, or -1.
 * is_root() - @key is the namespace's root key (a first block's parent).
 */
int seed_of(const uint8_t key[16]);
bool is_root(const uint8_t key[16]);

/* make_block() - a valid block of @n tokens after @parent at token
 * position @start, with random tokens and payload, into @img (room for
 * max_file bytes); its size into *@len.  A build failure fails the test.
 */
void make_block(struct rng *r, uint8_t *img, uint64_t *len, uint32_t n,
		const uint8_t parent[16], uint64_t start);

/* listing_check() - the namespace lists the seeded blocks and nothing
 * else; fz_fail() otherwise, or when it cannot be read.
 */
void listing_check(void);

/* ------------------------------------------------------------- targets */

/* The iterations of a target of @base iterations at KVFS_FUZZ_SCALE (at
 * least one).
 */
long iters(long base);

/* Run a target's loop: iterations 0..iters(@base) - 1, or KVFS_FUZZ_ITER
 * alone, with cur_iter following @var.
 */
#define FOR_ITER(var, base)                                                 \
	for (long var = only_iter >= 0 ? only_iter : 0,                      \
		  var##_end = only_iter >= 0 ? only_iter + 1 : iters(base);   \
	     (cur_iter = var) < var##_end; var++)

/*
 * begin_target() - start target @name (the KVFS_FUZZ_ONLY word): counts
 *   from zero, and the daemon must be alive; a daemon that died in an
 *   earlier target fails this one at once.
 * end_iteration() - after iteration @it: the daemon is alive, and every
 *   200 iterations the seeded blocks are intact.
 * end_target() - the daemon is alive and the seeded blocks are intact;
 *   then the target's counts go to the summary.
 * Each fails the target by fz_fail() (or fail_msg()) when a check fails.
 */
void begin_target(const char *name);
void end_iteration(long it);
void end_target(void);

/*
 * The families' work buffers, made in the group's setup (after
 * fz_read_settings(): some are max_file long) and freed in its teardown.
 * An allocation failure fails the group.
 */
void ctl_bufs_alloc(void);
void ctl_bufs_free(void);
void xattr_bufs_alloc(void);
void xattr_bufs_free(void);
void blocks_bufs_alloc(void);
void blocks_bufs_free(void);
void ns_bufs_alloc(void);
void ns_bufs_free(void);

/*
 * The cmocka tests, one fuzz target or regression each (its name less
 * "test_" is its KVFS_FUZZ_ONLY word).  @state is cmocka's, unused.  Each
 * runs between begin_target() and end_target(), after the group's setup,
 * and fails by fz_fail().  The two ctl regressions need seeded blocks and
 * are skipped without them.
 *
 * fuzz_ctl.c, .kvfs/ctl requests:
 * test_ctl_ioctl() - well-formed, mutated and malformed requests by
 *   ioctl, under valid and foreign command numbers.
 * test_ctl_write_read() - the same written and read back, with short and
 *   oversized reads and writes, interleaved with ioctls on one descriptor.
 * test_ctl_semantic() - mostly well-formed requests on the seeded blocks
 *   and the caller's memory, whose delivered bytes are checked.
 * test_ctl_threads() - two threads sharing one descriptor.
 * test_regress_sync_word_bounds() - a sync word past the end of its
 *   object is refused, the last word of it is not.
 * test_regress_prefetch_count() - PREFETCH of the seeded blocks to DRAM,
 *   500 times, finds them all each time.
 *
 * fuzz_xattr.c:
 * test_xattr() - set, get, list and remove of odd names and values on
 *   blocks, namespaces, control inodes and a block being written.
 * test_regress_xattr_words() - a category or pin value is one word, up to
 *   trailing newlines and NULs.
 *
 * fuzz_blocks.c:
 * test_blocks() - mutated block files under odd names, written in odd
 *   patterns; accepted ones read back as written, refused ones are absent.
 *
 * fuzz_ns.c:
 * test_ns_ops() - renames, links, directories, truncation, opens, reads
 *   and ioctls on and around the stored blocks.
 */
void test_ctl_ioctl(void **state);
void test_ctl_write_read(void **state);
void test_ctl_semantic(void **state);
void test_ctl_threads(void **state);
void test_regress_sync_word_bounds(void **state);
void test_regress_prefetch_count(void **state);
void test_xattr(void **state);
void test_regress_xattr_words(void **state);
void test_blocks(void **state);
void test_ns_ops(void **state);

#endif
