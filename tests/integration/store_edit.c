/* SPDX-License-Identifier: MIT */
/*
 * store_edit - damage a kvfs store's metadata the way a bug could, for
 * test_admin.sh's fsck checks.  The store must not be mounted.
 *
 *   store_edit orphan STORE      take 8 KiB out of the free map at the
 *                                start of its first range, without a
 *                                record (allocated space nothing points to)
 *   store_edit extent STORE KEY  print KEY's record: "OFF LEN SIZE"
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
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
	} else {
		rc = -EINVAL;
	}
	kvfs_store_free(s);
	if (rc)
		fprintf(stderr, "store_edit: %s\n", strerror(-rc));
	return rc ? 1 : 0;
}
