/* SPDX-License-Identifier: MIT */
/*
 * Control-file benchmarks, run by tests/bench/run.sh on a mount with the
 * shm device tier. Each figure is a ratio against a baseline taken in the
 * same run, samples alternating:
 *
 *   [5] LOOKUP of a 64-block prefix through the ioctl, p50 and p99 round
 *       trip, against the bare FUSE round trip of a getxattr on the
 *       namespace directory (the floor any control request pays);
 *   [6] DRAM -> device pool: FETCH of 16 DRAM-resident blocks, then
 *       RELEASE and EVICT from the pool, against memcpy of the same bytes
 *       between two warm buffers in this process.
 *
 *   bench_ctl MNT NS [--iters N] [--summary FILE]
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>

#include "client/libkvfs.h"
#include "meta/fmt.h"
#include "bench_i.h"

#define NKEYS 64
#define NFETCH 16

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static double pct(uint64_t *v, size_t n, double p)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return (double)v[(size_t)(p * (double)(n - 1))];
}

/* Keys of the first @max blocks listed in the namespace. */
static size_t list_keys(const char *dir, uint8_t (*keys)[16], size_t max)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t n = 0;

	if (!d)
		return 0;
	while (n < max && (de = readdir(d)))
		if (kvfs_fmt_name_parse(de->d_name, keys[n]) == 0)
			n++;
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "iters", required_argument, NULL, 'i' },
		{ "summary", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	const char *summ = NULL, *mnt, *ns;
	uint8_t keys[NKEYS][16];
	struct kvfs_client_blocks out;
	struct kvfs_client *c;
	char dir[4096], v[64];
	int iters = 2000, ch, rc;

	while ((ch = getopt_long(argc, argv, "i:s:", lo, NULL)) != -1) {
		if (ch == 'i')
			iters = atoi(optarg);
		else if (ch == 's')
			summ = optarg;
		else
			return 2;
	}
	if (argc - optind != 2 || iters < 10) {
		fprintf(stderr, "usage: bench_ctl MNT NS [--iters N] "
				"[--summary FILE]\n");
		return 2;
	}
	mnt = argv[optind];
	ns = argv[optind + 1];
	snprintf(dir, sizeof(dir), "%s/%s", mnt, ns);
	if (list_keys(dir, keys, NKEYS) < NKEYS) {
		fprintf(stderr, "bench_ctl: %s holds fewer than %d blocks\n",
			dir, NKEYS);
		return 1;
	}
	rc = kvfs_client_open(mnt, &c);
	if (rc) {
		fprintf(stderr, "bench_ctl: %s: %s\n", mnt, strerror(-rc));
		return 1;
	}

	/* [5] LOOKUP round trip */
	uint64_t *tk = calloc((size_t)iters, sizeof(*tk));
	uint64_t *tb = calloc((size_t)iters, sizeof(*tb));

	for (int i = 0; i < iters; i++) {
		uint64_t t0 = bench_now_ns();

		rc = kvfs_client_lookup(c, ns, (const void *)keys, NKEYS, 0,
					&out);
		tk[i] = bench_now_ns() - t0;
		if (rc || out.resp.n_cached != NKEYS) {
			fprintf(stderr, "bench_ctl: lookup failed\n");
			return 1;
		}
		kvfs_client_blocks_release(&out);
		t0 = bench_now_ns();
		if (getxattr(dir, "user.kvfs.blocks", v, sizeof(v)) < 0)
			return 1;
		tb[i] = bench_now_ns() - t0;
	}
	printf("\n[5] ctl LOOKUP of a %d-block prefix (ioctl), against a bare "
	       "FUSE round trip (getxattr on the namespace)\n", NKEYS);
	printf("  $ bench_ctl MNT %s --iters %d\n", ns, iters);
	double k50 = pct(tk, (size_t)iters, 0.5) / 1e3;
	double k99 = pct(tk, (size_t)iters, 0.99) / 1e3;
	double b50 = pct(tb, (size_t)iters, 0.5) / 1e3;
	double b99 = pct(tb, (size_t)iters, 0.99) / 1e3;
	printf("  p50:\n");
	bench_summary(summ, "[5] LOOKUP 64 blocks p50", k50, b50, "us", "-");
	printf("  p99:\n");
	bench_summary(summ, "[5] LOOKUP 64 blocks p99", k99, b99, "us", "-");

	/* [6] DRAM -> pool */
	int reps = iters / 100 < 5 ? 5 : iters / 100;
	double *gk = calloc((size_t)reps, sizeof(*gk));
	double *gb = calloc((size_t)reps, sizeof(*gb));
	uint64_t bytes = 0;

	kvfs_client_pin(c, ns, (const void *)keys, NFETCH,
			KVFS_CLIENT_TIER_DRAM);
	for (int r = 0; r < reps; r++) {
		kvfs_client_evict(c, ns, (const void *)keys, NFETCH,
				  KVFS_CLIENT_TIER_GPU);
		uint64_t t0 = bench_now_ns();

		rc = kvfs_client_fetch(c, ns, (const void *)keys, NFETCH, &out);
		uint64_t t = bench_now_ns() - t0;

		if (rc || out.resp.error) {
			fprintf(stderr, "bench_ctl: fetch failed: %d/%d\n", rc,
				out.resp.error);
			return 1;
		}
		bytes = 0;
		for (uint32_t i = 0; i < out.resp.n_blocks; i++)
			bytes += out.blocks[i].len;
		kvfs_client_blocks_release(&out);
		kvfs_client_release(c, ns, NULL, 0);
		gk[r] = (double)bytes / (double)t;

		char *src = malloc(bytes), *dst = malloc(bytes);

		memset(src, 1, bytes);
		memset(dst, 2, bytes);
		t0 = bench_now_ns();
		memcpy(dst, src, bytes);
		t = bench_now_ns() - t0;
		gb[r] = (double)bytes / (double)t;
		if (dst[bytes - 1] != 1)
			return 1;
		free(src);
		free(dst);
	}
	kvfs_client_unpin(c, ns, (const void *)keys, NFETCH,
			  KVFS_CLIENT_TIER_DRAM);
	qsort(gk, (size_t)reps, sizeof(double), bench_cmp_double);
	qsort(gb, (size_t)reps, sizeof(double), bench_cmp_double);
	printf("\n[6] DRAM -> device pool (shm): FETCH of %d DRAM-resident "
	       "blocks (%.1f MiB), against memcpy of the same bytes\n",
	       NFETCH, (double)bytes / (1 << 20));
	printf("  $ bench_ctl MNT %s (median of %d)\n", ns, reps);
	bench_summary(summ, "[6] DRAM->pool FETCH", gk[reps / 2], gb[reps / 2],
		"GB/s", "-");
	free(tk);
	free(tb);
	free(gk);
	free(gb);
	kvfs_client_close(c);
	return 0;
}
