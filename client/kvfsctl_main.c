/* SPDX-License-Identifier: MIT */
/*
 * kvfsctl - look at a mounted kvfs.
 *
 *   kvfsctl status MOUNTPOINT   tiers, usage, hit ratios, write-back
 *   kvfsctl stats MOUNTPOINT    the raw .kvfs/stats lines
 *
 * It reads MOUNTPOINT/.kvfs/stats only, so it needs no privileges beyond
 * the mount's and cannot disturb the daemon.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/util.h"

struct kv {
	char key[128];
	char val[128];
};

static int load_stats(const char *mnt, struct kv **out, size_t *n)
{
	char path[PATH_MAX], line[512];
	struct kv *v = NULL;
	size_t cap = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/.kvfs/stats", mnt);
	f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "kvfsctl: %s: %s (is a kvfs mounted there?)\n",
			path, strerror(errno));
		return -errno;
	}
	*n = 0;
	while (fgets(line, sizeof(line), f)) {
		if (*n == cap) {
			cap = cap ? cap * 2 : 64;
			struct kv *nv = realloc(v, cap * sizeof(*v));

			if (!nv) {
				fclose(f);
				free(v);
				return -ENOMEM;
			}
			v = nv;
		}
		if (sscanf(line, "%127s %127s", v[*n].key, v[*n].val) == 2)
			(*n)++;
	}
	fclose(f);
	*out = v;
	return 0;
}

/* Value of "tier.TIER.FIELD", or of FIELD when @tier is NULL. */
static uint64_t get(const struct kv *v, size_t n, const char *tier,
		    const char *field)
{
	char key[128];

	if (tier)
		snprintf(key, sizeof(key), "tier.%s.%s", tier, field);
	else
		snprintf(key, sizeof(key), "%s", field);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].key, key))
			return strtoull(v[i].val, NULL, 10);
	return 0;
}

static const char *sval(const struct kv *v, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].key, key))
			return v[i].val;
	return "?";
}

static void status(const struct kv *v, size_t n)
{
	static const char *const tiers[] = { "gpu", "dram", "ssd" };
	char a[32], b[32];

	printf("%-5s %10s %10s %6s %9s %9s %9s %10s\n", "tier", "used",
	       "capacity", "use%", "blocks", "hits", "misses", "evictions");
	for (size_t i = 0; i < 3; i++) {
		uint64_t cap = get(v, n, tiers[i], "capacity_bytes");
		uint64_t used = get(v, n, tiers[i], "used_bytes");

		if (!cap)
			continue;
		printf("%-5s %10s %10s %5.1f%% %9" PRIu64 " %9" PRIu64
		       " %9" PRIu64 " %10" PRIu64 "\n",
		       tiers[i], kvfs_util_fmt_size(used, a, sizeof(a)),
		       kvfs_util_fmt_size(cap, b, sizeof(b)),
		       100.0 * (double)used / (double)cap,
		       get(v, n, tiers[i], "blocks"),
		       get(v, n, tiers[i], "hits"),
		       get(v, n, tiers[i], "misses"),
		       get(v, n, tiers[i], "evictions"));
	}
	printf("policy %s, %" PRIu64 " blocks, %" PRIu64
	       " commits, %" PRIu64 " rejected, %" PRIu64
	       " awaiting write-back, %" PRIu64 " checksum errors\n",
	       sval(v, n, "policy.name"), get(v, n, NULL, "cache.blocks"),
	       get(v, n, NULL, "cache.commits"), get(v, n, NULL, "cache.rejects"),
	       get(v, n, NULL, "writeback.queued"),
	       get(v, n, NULL, "cache.checksum_errors"));
	/* The tier shared across hosts, when the mount has one. */
	if (strcmp(sval(v, n, "tier.remote.nodes"), "?"))
		printf("remote %" PRIu64 " nodes, %" PRIu64 " hits, %" PRIu64
		       " misses, %" PRIu64 " rejected, %" PRIu64
		       " errors, %s read, %s written, %" PRIu64
		       " queued, %" PRIu64 " dropped\n",
		       get(v, n, "remote", "nodes"), get(v, n, "remote", "hits"),
		       get(v, n, "remote", "misses"),
		       get(v, n, "remote", "rejected"),
		       get(v, n, "remote", "errors"),
		       kvfs_util_fmt_size(get(v, n, "remote", "bytes_read"), a,
					  sizeof(a)),
		       kvfs_util_fmt_size(get(v, n, "remote", "bytes_written"),
					  b, sizeof(b)),
		       get(v, n, "remote", "queued"),
		       get(v, n, "remote", "dropped"));
}

int main(int argc, char **argv)
{
	struct kv *v = NULL;
	size_t n = 0;
	int rc;

	if (argc != 3 || (strcmp(argv[1], "status") &&
			  strcmp(argv[1], "stats"))) {
		fprintf(stderr, "usage: kvfsctl status|stats MOUNTPOINT\n");
		return 2;
	}
	rc = load_stats(argv[2], &v, &n);
	if (rc)
		return 1;
	if (!strcmp(argv[1], "stats")) {
		for (size_t i = 0; i < n; i++)
			printf("%s %s\n", v[i].key, v[i].val);
	} else {
		status(v, n);
	}
	free(v);
	return 0;
}
