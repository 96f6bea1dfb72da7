/* SPDX-License-Identifier: MIT */
/*
 * Offline check of a kvfs store (kvfsctl fsck, docs/operations.md).
 *
 * Every block record is checked against its extent in STORE/data.kvd:
 * the record itself (magic, version, namespace, extent inside the data
 * file), both CRCs of the block image and every other check a load from
 * the SSD makes (kvfs_fmt_validate(), the header CRC equal to the
 * record's), and the per-chunk CRC table if there is one.  Then the free
 * map: its entries (inside the file, aligned, sorted, merged, not
 * overlapping), and its accounting against the records: space the map
 * calls free that a record holds, and space neither free nor held by any
 * record (an orphan allocation).  Last, the per-block side records: a
 * chunk CRC table or chunk scores under a key that has no block record
 * at all (left by a crash between transactions, an older bug, or a hand
 * edit) are orphans too.
 *
 * Everything lives here, in meta/: the store, its records and the block
 * format are this layer's, and reading the data file is a plain pread.
 *
 * Repair (KVFS_FSCK_REPAIR), in one LMDB transaction: a record whose
 * block fails (or that cannot be read at all) is deleted with its chunk
 * CRCs and scores; a chunk CRC table that is damaged or disagrees with a
 * block that verifies is deleted (reads then check the whole block); the
 * free map is rewritten as the complement of the records kept; orphan
 * chunk CRC tables and scores are deleted.  A block that verifies is
 * never removed.  Two records that verify and overlap cannot be
 * repaired: that is an error left.
 *
 * Not thread-safe with itself on one store; the store lock (flock on
 * data.kvd) keeps a daemon out while it runs.
 */
#ifndef KVFS_META_FSCK_H
#define KVFS_META_FSCK_H

#include <stdint.h>
#include <stdio.h>

enum kvfs_fsck_flags {
	KVFS_FSCK_REPAIR = 1
			   << 0, /* drop what cannot be served, free orphans */
	KVFS_FSCK_VERBOSE = 1 << 1, /* also name every block that verifies */
};

/* e2fsck's exit codes, which kvfs_fsck_run() returns. */
enum kvfs_fsck_result {
	KVFS_FSCK_CLEAN = 0,
	KVFS_FSCK_REPAIRED = 1,
	KVFS_FSCK_ERRORS_LEFT = 4,
};

struct kvfs_fsck_report {
	uint64_t records; /* block records read */
	uint64_t good; /* blocks that verify */
	uint64_t bad; /* records whose block cannot be served */
	uint64_t ccrc_bad; /* chunk CRC tables damaged or wrong */
	uint64_t free_errors; /* free-map entries malformed or holding a block */
	uint64_t orphans; /* ranges allocated but held by no record */
	uint64_t orphan_bytes;
	uint64_t overlaps; /* pairs of records sharing bytes */
	uint64_t ccrc_orphans; /* chunk CRC tables of no block record */
	uint64_t score_orphans; /* block keys with scores but no record */
	uint64_t score_orphan_records; /* the score entries under those keys */
	uint64_t repaired; /* errors fixed */
	uint64_t left; /* errors not fixed */
};

/*
 * kvfs_fsck_run() - check (and with KVFS_FSCK_REPAIR repair) the store
 * at @dir, which must not be mounted.
 * @flags: enum kvfs_fsck_flags.
 * @out:   where every finding is printed, one line each, naming the
 *         block by key ("block KEY (ns NAME, extent OFF+LEN): REASON";
 *         "block KEY: REASON" for a record that cannot be read and for
 *         side records without a block record, one line per key and
 *         kind).
 * @rep:   if not NULL, receives the counts.
 *
 * Returns KVFS_FSCK_CLEAN, KVFS_FSCK_REPAIRED (errors found, all
 * repaired), KVFS_FSCK_ERRORS_LEFT, or -errno when the store cannot be
 * checked at all: -EBUSY (a daemon has it open), what kvfs_store_open()
 * returns, -ENOMEM, or an I/O or LMDB error (logged).
 */
int kvfs_fsck_run(const char *dir, unsigned flags, FILE *out,
		  struct kvfs_fsck_report *rep);

#endif
