/* SPDX-License-Identifier: MIT */
/*
 * store_edit - damage a kvfs store's metadata the way a bug could, for
 * test_admin.sh's fsck checks.  The store must not be mounted.
 *
 *   store_edit orphan STORE      take 8 KiB out of the free map at the
 *                                start of its first range, without a
 *                                record (allocated space nothing points to)
 *   store_edit extent STORE KEY  print KEY's record: "OFF LEN SIZE"
 *   store_edit ccrc STORE KEY    give KEY a chunk CRC table (4 CRCs);
 *                                refused if KEY has a block record
 *   store_edit score STORE KEY N give KEY scores for chunks 0..N-1;
 *                                refused the same way
 *   store_edit sides STORE       print how many keys have a chunk CRC
 *                                table and how many have scores
 *
 * The last two plant side records a crash between transactions could
 * leave: their block record does not exist.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/fmt.h"
#include "meta/meta.h"
#include "meta/store.h"

static int first_free(uint64_t off, uint64_t len, void *arg)
{
	uint64_t *r = arg;

	if (len < 8192)
		return 0;
	r[0] = off;
	r[1] = len;
	return 1;
}

static int count_ccrc(const uint8_t *key, void *arg)
{
	(void)key;
	((uint64_t *)arg)[0]++;
	return 0;
}

static int count_score(const uint8_t *key, uint32_t n, void *arg)
{
	(void)key;
	(void)n;
	((uint64_t *)arg)[1]++;
	return 0;
}

/* Side records for @key, which must have no block record. */
static int plant(struct kvfs_store *s, const char *what, const char *hex,
		 uint32_t n)
{
	static const uint32_t crc[4] = { 0x1234, 0x5678, 0x9abc, 0xdef0 };
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_meta_blk b;
	struct kvfs_meta_txn *t;
	int rc;

	rc = kvfs_fmt_key_parse(hex, key);
	if (rc)
		return rc;
	rc = kvfs_meta_txn_begin(s->meta, false, &t);
	if (rc)
		return rc;
	rc = kvfs_meta_blk_get(t, key, &b);
	if (rc == 0) {
		rc = -EEXIST;
	} else if (rc == -ENOENT) {
		rc = 0;
		if (!strcmp(what, "ccrc"))
			rc = kvfs_meta_ccrc_put(t, key, crc, 4);
		for (uint32_t c = 0; c < n && !rc; c++)
			rc = kvfs_meta_score_put(t, key, c, 1.0 + c, c);
	}
	return rc ? (kvfs_meta_txn_abort(t), rc) : kvfs_meta_txn_commit(t);
}

int main(int argc, char **argv)
{
	struct kvfs_store *s;
	struct kvfs_meta_txn *t;
	uint64_t r[2] = { 0, 0 };
	int rc;

	if (argc < 3)
		return 2;
	rc = kvfs_store_open(argv[2], 0, 0, &s);
	if (rc)
		return 1;
	if (!strcmp(argv[1], "orphan")) {
		rc = kvfs_meta_txn_begin(s->meta, false, &t);
		if (!rc && kvfs_meta_free_foreach(t, first_free, r) == 1)
			rc = kvfs_meta_free_take(t, r[0], 8192);
		else if (!rc)
			rc = -ENOSPC;
		rc = rc ? (kvfs_meta_txn_abort(t), rc) :
			  kvfs_meta_txn_commit(t);
		if (!rc)
			printf("%" PRIu64 "\n", r[0]);
	} else if (!strcmp(argv[1], "extent") && argc == 4) {
		struct kvfs_meta_blk b;
		uint8_t key[KVFS_KEY_LEN];

		rc = kvfs_fmt_key_parse(argv[3], key);
		if (!rc)
			rc = kvfs_meta_txn_begin(s->meta, true, &t);
		if (!rc) {
			rc = kvfs_meta_blk_get(t, key, &b);
			kvfs_meta_txn_abort(t);
		}
		if (!rc)
			printf("%" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
			       b.ssd_off, b.ssd_len, b.size);
	} else if (!strcmp(argv[1], "sides")) {
		rc = kvfs_meta_txn_begin(s->meta, true, &t);
		if (!rc) {
			rc = kvfs_meta_ccrc_foreach(t, count_ccrc, r);
			if (!rc)
				rc = kvfs_meta_score_foreach(t, count_score, r);
			kvfs_meta_txn_abort(t);
		}
		if (!rc)
			printf("%" PRIu64 " %" PRIu64 "\n", r[0], r[1]);
	} else if (!strcmp(argv[1], "ccrc") && argc == 4) {
		rc = plant(s, "ccrc", argv[3], 0);
	} else if (!strcmp(argv[1], "score") && argc == 5) {
		rc = plant(s, "score", argv[3], (uint32_t)atoi(argv[4]));
	} else {
		rc = -EINVAL;
	}
	kvfs_store_free(s);
	if (rc)
		fprintf(stderr, "store_edit: %s\n", strerror(-rc));
	return rc ? 1 : 0;
}
