/* SPDX-License-Identifier: MIT */
/*
 * A seeded fuzzer for a live kvfs mount: malformed .kvfs/ctl requests over
 * both transports (meta/kvfs_ctl.h), xattrs on every kind of inode, mutated
 * block files and namespace operations.  Run by test_fuzz.sh.
 *
 * Every decision comes from a generator seeded by (seed, target,
 * iteration), so one iteration can be replayed alone:
 *   KVFS_FUZZ_SEED=S KVFS_FUZZ_ONLY=target KVFS_FUZZ_ITER=N fuzz_client
 * (a failure prints that line). What the daemon does in the background
 * (write-back, eviction) is not seeded; no check depends on it.
 *
 * Checks, each of which fails the target: every call ends in success or an
 * errno the contract allows (documented malformations are EINVAL, never
 * success); no call outlives KVFS_FUZZ_HANG_S seconds (a watchdog thread
 * ends the program, naming the call); the daemon is alive after every
 * iteration; a block accepted at close() reads back byte for byte as
 * written and validates; a rejected one is not there; responses are
 * well-formed and what FETCH, FETCH_INTO, FETCH_CHUNKS and SAVE deliver is
 * the stored bytes; the seeded blocks are never lost or changed.
 *
 * Environment: KVFS_MNT, KVFS_NS (the seeded namespace), KVFS_PID (the
 * daemon), KVFS_FUZZ_SEEDKEYS (keys of the seeded blocks, one hex per
 * line: read, pinned, evicted from memory, never deleted), KVFS_FUZZ_GOOD
 * (a directory of good blocks made by kvfs-gen, used as templates),
 * KVFS_FUZZ_SEED (1), KVFS_FUZZ_SCALE (1: iterations multiplier),
 * KVFS_FUZZ_ONLY, KVFS_FUZZ_ITER, KVFS_FUZZ_HANG_S (60), KVFS_FUZZ_SUMMARY
 * (a file for the per-target counts instead of stdout), KVFS_FUZZ_SHM_TAG
 * (names its shm objects /kvfs-fuzz-TAG-{peer,sync}; default: its pid).
 *
 * The harness (settings, generators, journal, failures, the seeded
 * blocks) is fuzz_harness.c behind fuzz_i.h; each family of targets has
 * its own files: fuzz_ctl.c with fuzz_ctl_req.c and fuzz_ctl_resp.c
 * (.kvfs/ctl), fuzz_xattr.c, fuzz_blocks.c (block files) and fuzz_ns.c
 * (namespace operations).  This file makes them one cmocka group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fuzz_i.h"

static int setup(void **state)
{
	if (fz_read_settings())
		return -1;
	ctl_bufs_alloc();
	xattr_bufs_alloc();
	blocks_bufs_alloc();
	ns_bufs_alloc();
	return fz_start();
}

static int teardown(void **state)
{
	ctl_bufs_free();
	xattr_bufs_free();
	blocks_bufs_free();
	ns_bufs_free();
	fz_stop();
	return 0;
}

int main(void)
{
	/* Block files and xattrs first: a daemon that a ctl request
	 * brings down cannot hide what they would find.
	 */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_regress_xattr_words),
		cmocka_unit_test(test_xattr),
		cmocka_unit_test(test_blocks),
		cmocka_unit_test(test_ns_ops),
		cmocka_unit_test(test_ctl_ioctl),
		cmocka_unit_test(test_ctl_write_read),
		cmocka_unit_test(test_ctl_semantic),
		cmocka_unit_test(test_ctl_threads),
		cmocka_unit_test(test_regress_sync_word_bounds),
		cmocka_unit_test(test_regress_prefetch_count),
	};
	const char *only = getenv("KVFS_FUZZ_ONLY");
	static char filter[64];

	if (only && *only) {
		snprintf(filter, sizeof(filter), "test_%s", only);
		cmocka_set_test_filter(filter);
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
