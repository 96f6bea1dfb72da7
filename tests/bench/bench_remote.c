/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's figures (tests/bench/run.sh, docs/benchmarks.md),
 * against a Redis Cluster the caller started and a mount MNT whose store
 * is empty, with [tier.remote] on that cluster and a device tier:
 *
 *   bench_remote NODES MNT NS [--blocks N(64)] [--iters K(9)]
 *                [--summary FILE]
 *
 * The blocks are a chain of N blocks of namespace NS (its geometry read
 * from the mount), SET into the cluster under the data model's keys.
 * Alternating, each sample:
 *   - raw: one pipelined batch of N GETs of those keys from the cluster
 *     (tier/redis_cluster.h, the client kvfs uses), values freed unread;
 *   - LOOKUP with KVFS_CTL_F_REMOTE: the mount brings the prefix in from
 *     the cluster (checked, imported into DRAM);
 *   - FETCH: the mount brings it in and loads it into the device pool.
 * Before each kvfs sample the blocks are unlinked on the mount, so that
 * they are remote-only again. Then the write-back path:
 *   - raw: one pipelined batch of N SET NX of the images;
 *   - the tier's write-back queue (tier/tier_remote.h): N blocks queued,
 *     then drained, as the daemon's write-back does.
 * The keys are deleted before each write sample.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_i.h"
#include "client/libkvfs.h"
#include "meta/fmt.h"
#include "tier/redis_cluster.h"
#include "tier/tier_remote.h"

struct ctx {
	const char *nodes, *mnt, *ns;
	unsigned n, iters;
	const char *summary;
	struct kvfs_geom g;
	uint8_t root[KVFS_KEY_LEN];
	uint8_t (*keys)[KVFS_KEY_LEN];
	uint8_t **img;
	uint64_t len;
	char (*rkey)[KVFS_REMOTE_KEY_MAX];
	struct kvfs_rc *rc;
	struct kvfs_client *cl;
};

static void die(const char *what, int e)
{
	fprintf(stderr, "bench_remote: %s: %s\n", what,
		strerror(e < 0 ? -e : e));
	exit(1);
}

static void build_chain(struct ctx *x)
{
	unsigned bt = x->g.block_tokens;
	uint32_t *toks = malloc(bt * sizeof(*toks));
	uint64_t off = kvfs_fmt_payload_off(bt);

	x->len = kvfs_fmt_file_size(&x->g, KVFS_KIND_KV, bt);
	x->keys = calloc(x->n, KVFS_KEY_LEN);
	x->img = calloc(x->n, sizeof(*x->img));
	x->rkey = calloc(x->n, sizeof(*x->rkey));
	if (!toks || !x->keys || !x->img || !x->rkey)
		die("memory", ENOMEM);
	for (unsigned i = 0; i < x->n; i++) {
		const uint8_t *parent = i ? x->keys[i - 1] : x->root;

		x->img[i] = malloc(x->len);
		if (!x->img[i])
			die("memory", ENOMEM);
		for (unsigned j = 0; j < bt; j++)
			toks[j] = 7000000 + i * bt + j;
		for (uint64_t b = off; b < x->len; b++)
			x->img[i][b] = (uint8_t)(b * 131 + i);
		if (kvfs_fmt_build(&x->g, KVFS_KIND_KV, parent,
				   (uint64_t)i * bt, toks, bt, x->img[i] + off,
				   x->img[i], x->len))
			die("building a block", EINVAL);
		memcpy(x->keys[i], ((struct kvfs_fmt_hdr *)x->img[i])->key,
		       KVFS_KEY_LEN);
		if (kvfs_remote_key("kvfs", x->root, x->keys[i], x->rkey[i],
				    sizeof(x->rkey[i])) < 0)
			die("a key", ENAMETOOLONG);
	}
	free(toks);
}

/* One raw batch of @op over every key; exits on a failed command. */
static void raw_batch(struct ctx *x, int op)
{
	struct kvfs_rc_cmd *c = calloc(x->n, sizeof(*c));

	if (!c)
		die("memory", ENOMEM);
	for (unsigned i = 0; i < x->n; i++) {
		c[i].op = op;
		c[i].key = x->rkey[i];
		c[i].klen = strlen(x->rkey[i]);
		if (op == KVFS_RC_SET || op == KVFS_RC_SETNX) {
			c[i].val = x->img[i];
			c[i].vlen = x->len;
		}
	}
	kvfs_rc_exec(x->rc, c, x->n);
	for (unsigned i = 0; i < x->n; i++) {
		if (c[i].res && !(op == KVFS_RC_DEL && c[i].res == -ENOENT))
			die("a raw command", c[i].res);
		if (op == KVFS_RC_GET && c[i].len != x->len)
			die("a raw GET's length", EIO);
		free(c[i].data);
	}
	free(c);
}

/* Make the blocks remote-only on the mount again. */
static void unlink_all(struct ctx *x)
{
	char p[4096], hex[KVFS_KEY_HEX_LEN + 1];

	for (unsigned i = 0; i < x->n; i++) {
		kvfs_fmt_key_hex(x->keys[i], hex);
		snprintf(p, sizeof(p), "%s/%s/%s.kv", x->mnt, x->ns, hex);
		if (unlink(p) && errno != ENOENT)
			die("unlink", errno);
	}
}

static double mbps(const struct ctx *x, uint64_t ns)
{
	return (double)x->n * (double)x->len / 1048576.0 / ((double)ns / 1e9);
}

static void bench_fetch(struct ctx *x)
{
	double *raw = calloc(x->iters, sizeof(double));
	double *lk = calloc(x->iters, sizeof(double));
	double *fe = calloc(x->iters, sizeof(double));
	char label[64];

	for (unsigned s = 0; s < x->iters; s++) {
		struct kvfs_client_blocks out = { 0 };
		uint64_t t0;
		int e;

		t0 = bench_now_ns();
		raw_batch(x, KVFS_RC_GET);
		raw[s] = mbps(x, bench_now_ns() - t0);

		unlink_all(x);
		t0 = bench_now_ns();
		e = kvfs_client_lookup(x->cl, x->ns,
				       (const uint8_t(*)[KVFS_KEY_LEN])x->keys,
				       x->n, KVFS_CTL_F_REMOTE, &out);
		lk[s] = mbps(x, bench_now_ns() - t0);
		if (e || out.resp.n_cached != x->n)
			die("LOOKUP with KVFS_CTL_F_REMOTE", e ? e : ENOENT);
		kvfs_client_blocks_release(&out);

		unlink_all(x);
		t0 = bench_now_ns();
		e = kvfs_client_fetch(x->cl, x->ns,
				      (const uint8_t(*)[KVFS_KEY_LEN])x->keys,
				      x->n, &out);
		fe[s] = mbps(x, bench_now_ns() - t0);
		if (e)
			die("FETCH", e);
		kvfs_client_blocks_release(&out);
		kvfs_client_release(x->cl, x->ns, NULL, 0);
	}
	snprintf(label, sizeof(label), "remote: %u-block prefix in", x->n);
	printf("[r1] %s (LOOKUP remote) vs raw GETs\n", label);
	bench_summary(x->summary, label, bench_median(lk, (int)x->iters),
		      bench_median(raw, (int)x->iters), "MiB/s", ">=0.8");
	snprintf(label, sizeof(label), "remote: FETCH %u into the pool", x->n);
	printf("[r2] %s vs raw GETs\n", label);
	bench_summary(x->summary, label, bench_median(fe, (int)x->iters),
		      bench_median(raw, (int)x->iters), "MiB/s", "-");
	free(raw);
	free(lk);
	free(fe);
}

static void bench_write(struct ctx *x)
{
	struct kvfs_remote_conf rc;
	struct kvfs_tier_remote *t;
	double *raw = calloc(x->iters, sizeof(double));
	double *wb = calloc(x->iters, sizeof(double));
	int e;

	kvfs_remote_conf_defaults(&rc);
	rc.backend = KVFS_REMOTE_REDIS;
	snprintf(rc.nodes, sizeof(rc.nodes), "%s", x->nodes);
	e = kvfs_tier_remote_new(&rc, &t);
	if (e)
		die("the remote tier", e);
	for (unsigned s = 0; s < x->iters; s++) {
		uint64_t t0;

		raw_batch(x, KVFS_RC_DEL);
		t0 = bench_now_ns();
		raw_batch(x, KVFS_RC_SETNX);
		raw[s] = mbps(x, bench_now_ns() - t0);

		raw_batch(x, KVFS_RC_DEL);
		t0 = bench_now_ns();
		for (unsigned i = 0; i < x->n; i++) {
			e = kvfs_tier_remote_queue(t, x->root, x->keys[i],
						   x->img[i], x->len);
			if (e)
				die("queue", e);
		}
		e = kvfs_tier_remote_drain(t, 60000);
		wb[s] = mbps(x, bench_now_ns() - t0);
		if (e)
			die("drain", e);
	}
	{
		struct kvfs_remote_stats st;

		kvfs_tier_remote_stats(t, &st);
		printf("    (the queue's tier: %llu errors, %llu dropped)\n",
		       (unsigned long long)st.errors,
		       (unsigned long long)st.dropped);
	}
	printf("[r3] remote: write-back of %u blocks vs raw SETs\n", x->n);
	bench_summary(x->summary, "remote: write-back queue",
		      bench_median(wb, (int)x->iters),
		      bench_median(raw, (int)x->iters), "MiB/s", ">=0.8");
	kvfs_tier_remote_free(t);
	free(raw);
	free(wb);
}

int main(int argc, char **argv)
{
	struct ctx x = { .n = 64, .iters = 9 };
	struct kvfs_client_ns ni;
	struct kvfs_rc_conf rcc;
	int e;

	if (argc < 4) {
		fprintf(stderr, "usage: bench_remote NODES MNT NS [--blocks N] "
				"[--iters K] [--summary FILE]\n");
		return 2;
	}
	x.nodes = argv[1];
	x.mnt = argv[2];
	x.ns = argv[3];
	for (int i = 4; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--blocks"))
			x.n = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--iters"))
			x.iters = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--summary"))
			x.summary = argv[i + 1];
	}
	if (!x.n || !x.iters)
		return 2;
	e = kvfs_client_open(x.mnt, &x.cl);
	if (e)
		die("open the mount", e);
	e = kvfs_client_ns_info(x.cl, x.ns, &ni);
	if (e)
		die("namespace", e);
	x.g = ni.geom;
	memcpy(x.root, ni.root, KVFS_KEY_LEN);
	build_chain(&x);
	kvfs_rc_conf_defaults(&rcc);
	rcc.nodes = x.nodes;
	/* The baseline never waits out a timeout: a batch of 64 values of
	 * 2 MiB can hold a socket longer than the daemon's 200 ms.
	 */
	rcc.timeout_ms = 5000;
	e = kvfs_rc_new(&rcc, &x.rc);
	if (e)
		die("the cluster client", e);
	raw_batch(&x, KVFS_RC_SET);
	printf("    %u blocks of %.2f MiB, %u samples each\n", x.n,
	       (double)x.len / 1048576.0, x.iters);
	bench_fetch(&x);
	bench_write(&x);
	raw_batch(&x, KVFS_RC_DEL);
	kvfs_rc_free(x.rc);
	kvfs_client_close(x.cl);
	for (unsigned i = 0; i < x.n; i++)
		free(x.img[i]);
	free(x.img);
	free(x.keys);
	free(x.rkey);
	return 0;
}
