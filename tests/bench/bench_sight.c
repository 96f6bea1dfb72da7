/* SPDX-License-Identifier: MIT */
/*
 * The cost of fleet sightings (docs/remote.md, "Fleet sightings";
 * docs/benchmarks.md, "Fleet sightings"), figures [15] and [16]. No
 * mount: three caches are opened in this process, each on a store of its
 * own in a temp dir (background threads off), with policy kvfs and a
 * small geometry (12 KiB blocks):
 *
 *   A1  [fleet] sightings = redis on NODES (or memory without --nodes);
 *   A0  sightings off;
 *   B   sightings on the same channel as A1: the listener, so that the
 *       server really fans each message out.
 *
 * [15] commit rate, samples alternating: K new blocks (a chain, new
 *      tokens every sample) created, written and committed on A1, then
 *      kvfs_sight_flush() of A1 (the PUBLISH of their keys), against the
 *      same on A0 without sightings. Blocks per second; ratio on / off.
 * [16] keys heard: N keys noted on A1 and flushed (messages of 4096
 *      keys), timed until B's policy has taken all of them, against the
 *      same N keys handed to a kvfs policy of B's capacities directly,
 *      under a mutex taken every 256 keys (as the engine delivers them).
 *      Keys per second; ratio through the transport / direct.
 *
 *   bench_sight [--nodes HOST:PORT] [--blocks K (256)] [--keys N (65536)]
 *               [--iters S (31)] [--dir DIR] [--summary FILE]
 *
 * Every wait is bounded: a server that dies mid-run ends the figure with
 * an error (exit 1), the caches freed and the stores removed.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_i.h"
#include "cache/cache.h"
#include "cache/cache_i.h"
#include "cache/params.h"
#include "cache/policy.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/store.h"
#include "tier/sight.h"

#define NS_NAME "s"
#define MiB (1ull << 20)
/* As the engine's deliveries (cache/fleet.c). */
#define KEYS_PER_LOCK 256
/* How long B may take to hear what A1 published: generous, since a
 * loaded machine can hold the subscriber off the CPU for a while, and
 * only a dead server should end a run.
 */
#define HEAR_DEADLINE_NS (20ull * 1000000000ull)
/* Between polls of B's counter. */
#define POLL_NS 20000
#define BLOCK_TOKENS 8

/* 2 layers x 2 KV heads x head_dim 32, bf16, 8 tokens a block: 8 KiB of
 * header and token ids and 4 KiB of K/V, so that the commit's own work
 * (index, policy, the note) is not hidden behind a large copy.
 */
static const struct kvfs_geom geom = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 32,
	.block_tokens = BLOCK_TOKENS,
	.chunk_tokens = 4,
	.dtype = KVFS_DTYPE_BF16,
};

struct opts {
	const char *nodes; /* NULL: the in-process bus */
	const char *dir;
	const char *summ;
	unsigned blocks, keys;
	int iters;
};

struct host {
	const char *name;
	char store[4096];
	bool store_made;
	struct kvfs_cache *c;
	struct kvfs_ns *ns;
};

struct bench {
	struct opts o;
	char chan[KVFS_SIGHT_CHANNEL_MAX];
	struct host on, off, hear; /* A1, A0, B */
	uint64_t img_size;
	uint8_t *img; /* o.blocks images of one sample */
	char (*names)[KVFS_FMT_NAME_LEN + 1]; /* of the images */
	uint8_t (*keys)[KVFS_KEY_LEN]; /* [16]: o.keys of one sample */
	struct kvfs_policy *direct; /* [16]'s baseline */
	uint64_t dropped0, lost0; /* A1's, once B heard the probe */
	pthread_mutex_t direct_lock;
};

static const char *backend_name(const struct bench *B)
{
	return B->o.nodes ? "redis" : "memory bus";
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };

	nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------- the caches */

static int host_open(struct bench *B, struct host *h, int backend)
{
	struct kvfs_cache_params conf;
	struct kvfs_sight_conf *fc = &conf.fleet;
	const char *tmp = B->o.dir ? B->o.dir : getenv("TMPDIR");
	int rc;

	snprintf(h->store, sizeof(h->store), "%s/kvfs-sight.XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(h->store)) {
		rc = -errno;
		fprintf(stderr, "bench_sight: mkdtemp %s: %s\n", h->store,
			strerror(-rc));
		return rc;
	}
	h->store_made = true;
	/* Blocks stay in DRAM (no write-back thread) and are unlinked after
	 * each sample: the SSD only needs to exist.
	 */
	rc = kvfs_store_create(h->store, 16 * MiB, true);
	if (rc) {
		fprintf(stderr, "bench_sight: cannot make a store in %s: %s\n",
			h->store, strerror(-rc));
		return rc;
	}
	kvfs_cache_params_defaults(&conf);
	snprintf(conf.policy, sizeof(conf.policy), "kvfs");
	conf.dram_capacity = (uint64_t)B->o.blocks * B->img_size +
			     conf.chunk_dram + 16 * MiB;
	conf.n_ns = 1;
	snprintf(conf.ns[0].name, sizeof(conf.ns[0].name), NS_NAME);
	conf.ns[0].geom = geom;
	fc->backend = backend;
	if (backend == KVFS_SIGHT_REDIS)
		snprintf(fc->nodes, sizeof(fc->nodes), "%s", B->o.nodes);
	snprintf(fc->channel, sizeof(fc->channel), "%s", B->chan);
	/* Published by the samples' flushes only, so that a sample says
	 * when its keys leave, and none leave during the other side's.
	 */
	fc->interval_ms = 3600 * 1000;
	/* [16] notes all its keys before one flush. */
	if (fc->buffer < B->o.keys + B->o.blocks + 1)
		fc->buffer = B->o.keys + B->o.blocks + 1;
	rc = kvfs_cache_open(h->store, &conf,
			     KVFS_CACHE_NOTHREADS | KVFS_CACHE_NOSYNC, &h->c);
	if (rc) {
		fprintf(stderr, "bench_sight: cannot open cache %s: %s\n",
			h->name, strerror(-rc));
		return rc;
	}
	h->ns = kvfs_cache_ns_by_name(h->c, NS_NAME);
	if (!h->ns || (backend != KVFS_SIGHT_NONE && !h->c->sight)) {
		fprintf(stderr,
			"bench_sight: cache %s opened without its "
			"namespace or its sightings\n",
			h->name);
		return -EINVAL;
	}
	return 0;
}

static void host_close(struct host *h)
{
	char cmd[4200];

	kvfs_cache_free(h->c);
	h->c = NULL;
	if (!h->store_made)
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", h->store);
	if (system(cmd))
		fprintf(stderr, "bench_sight: could not remove %s\n", h->store);
	h->store_made = false;
}

static void sight_stats(struct host *h, struct kvfs_sight_stats *st)
{
	kvfs_sight_stats(h->c->sight, st);
}

/*
 * Wait until B has heard @want keys in all, or the deadline passes.
 * B's subscriber has no hook a waiter could sleep on (its deliveries go
 * straight to the engine's policy), and this is a benchmark: a short
 * sleep between reads of its counter costs at most POLL_NS of the time
 * measured. Returns 0 or -ETIMEDOUT.
 */
static int hear_wait(struct bench *B, uint64_t want)
{
	uint64_t end = bench_now_ns() + HEAR_DEADLINE_NS;
	struct kvfs_sight_stats st;

	for (;;) {
		sight_stats(&B->hear, &st);
		if (st.keys_in >= want)
			return 0;
		if (bench_now_ns() > end)
			break;
		sleep_ns(POLL_NS);
	}
	fprintf(stderr,
		"bench_sight: B heard %llu keys of %llu in %llu s: "
		"is the server gone?\n",
		(unsigned long long)st.keys_in, (unsigned long long)want,
		HEAR_DEADLINE_NS / 1000000000ull);
	return -ETIMEDOUT;
}

/* A1's flush, with what went wrong said. */
static int publish(struct bench *B)
{
	int rc = kvfs_sight_flush(B->on.c->sight);

	if (rc)
		fprintf(stderr, "bench_sight: A1's publish failed: %s\n",
			strerror(-rc));
	return rc;
}

/*
 * B subscribes in a thread of its own, in its own time: until it has,
 * whatever A1 publishes is lost. Publish a probe every 20 ms until B
 * hears one, for 10 s at most.
 */
static int hear_ready(struct bench *B)
{
	uint64_t end = bench_now_ns() + 10ull * 1000000000ull;
	uint8_t probe[KVFS_KEY_LEN] = { 0xb5 };
	struct kvfs_sight_stats st;

	do {
		kvfs_sight_note(B->on.c->sight, probe);
		/* A refused publish is retried here: the server may be
		 * slower to answer than the bench to start.
		 */
		(void)kvfs_sight_flush(B->on.c->sight);
		sleep_ns(20000000);
		sight_stats(&B->hear, &st);
		if (!st.keys_in)
			continue;
		/* The probes refused before the server answered are lost,
		 * and no fault of the samples'.
		 */
		sight_stats(&B->on, &st);
		B->dropped0 = st.dropped;
		B->lost0 = st.lost;
		return 0;
	} while (bench_now_ns() < end);
	fprintf(stderr, "bench_sight: B heard nothing from A1 in 10 s\n");
	return -ETIMEDOUT;
}

/* A1's notes were neither dropped nor lost: the figures would not count
 * what they say.
 */
static int publish_clean(struct bench *B)
{
	struct kvfs_sight_stats st;

	sight_stats(&B->on, &st);
	if (st.dropped == B->dropped0 && st.lost == B->lost0)
		return 0;
	fprintf(stderr, "bench_sight: A1 dropped %llu and lost %llu keys\n",
		(unsigned long long)(st.dropped - B->dropped0),
		(unsigned long long)(st.lost - B->lost0));
	return -EIO;
}

/* ------------------------------------------------------------- [15] */

/* Tokens of block @i of sample @s: never the same twice in a run, so
 * that every commit is of a new block.
 */
static uint32_t token(int s, unsigned blocks, unsigned i, unsigned t)
{
	return (uint32_t)(((uint64_t)s * blocks + i) * BLOCK_TOKENS + t);
}

/* The images of sample @s for @h's namespace (its root is its own). */
static int build_images(struct bench *B, struct host *h, int s)
{
	uint64_t poff = kvfs_fmt_payload_off(BLOCK_TOKENS);
	uint32_t tok[BLOCK_TOKENS];
	uint8_t parent[KVFS_KEY_LEN], key[KVFS_KEY_LEN];
	int rc;

	memcpy(parent, kvfs_ns_root(h->ns), KVFS_KEY_LEN);
	for (unsigned i = 0; i < B->o.blocks; i++) {
		uint8_t *img = B->img + (uint64_t)i * B->img_size;

		for (unsigned t = 0; t < BLOCK_TOKENS; t++)
			tok[t] = token(s, B->o.blocks, i, t);
		for (uint64_t b = poff; b < B->img_size; b++)
			img[b] = (uint8_t)(b * 131 + i);
		rc = kvfs_fmt_build(&geom, KVFS_KIND_KV, parent,
				    (uint64_t)i * BLOCK_TOKENS, tok,
				    BLOCK_TOKENS, NULL, img, B->img_size);
		if (rc)
			return rc;
		kvfs_fmt_block_key(parent, tok, BLOCK_TOKENS, key);
		memcpy(parent, key, KVFS_KEY_LEN);
		kvfs_fmt_key_hex(key, B->names[i]);
		memcpy(B->names[i] + KVFS_KEY_HEX_LEN, ".kv", 4);
	}
	return 0;
}

static int commit_all(struct bench *B, struct host *h)
{
	for (unsigned i = 0; i < B->o.blocks; i++) {
		struct kvfs_pending *p;
		struct kvfs_block *b;
		int rc = kvfs_cache_create(h->c, h->ns, B->names[i], &p);

		if (rc)
			return rc;
		rc = kvfs_cache_write(p, 0, B->img + (uint64_t)i * B->img_size,
				      B->img_size);
		if (rc) {
			kvfs_cache_abandon(h->c, p);
			return rc;
		}
		rc = kvfs_cache_commit(h->c, p, &b);
		if (rc)
			return rc;
		kvfs_cache_put(h->c, b);
	}
	return 0;
}

/* The blocks go before the next sample, so that DRAM never fills. */
static void unlink_all(struct bench *B, struct host *h)
{
	for (unsigned i = 0; i < B->o.blocks; i++)
		kvfs_cache_unlink(h->c, h->ns, B->names[i]);
}

/* One sample of [15] on @h: blocks per second in *@rate. */
static int commit_sample(struct bench *B, struct host *h, int s, double *rate)
{
	bool sights = h == &B->on;
	struct kvfs_sight_stats st;
	uint64_t t0, t;
	int rc = build_images(B, h, s);

	if (rc) {
		fprintf(stderr, "bench_sight: building blocks: %s\n",
			strerror(-rc));
		return rc;
	}
	if (sights)
		sight_stats(&B->hear, &st);
	t0 = bench_now_ns();
	rc = commit_all(B, h);
	if (rc) {
		fprintf(stderr, "bench_sight: commit on %s: %s\n", h->name,
			strerror(-rc));
		goto out_unlink;
	}
	if (sights) {
		rc = publish(B);
		if (rc)
			goto out_unlink;
	}
	t = bench_now_ns() - t0;
	*rate = (double)B->o.blocks / ((double)t / 1e9);
	/* Untimed: B catches up before the next sample, so its deliveries
	 * do not land on A0's time, and it says the keys went out.
	 */
	if (sights) {
		rc = hear_wait(B, st.keys_in + B->o.blocks);
		if (!rc)
			rc = publish_clean(B);
	}
out_unlink:
	unlink_all(B, h);
	return rc;
}

static int figure_commits(struct bench *B)
{
	double *on = calloc((size_t)B->o.iters, sizeof(double));
	double *off = calloc((size_t)B->o.iters, sizeof(double));
	char label[96];
	int rc = 0;

	if (!on || !off) {
		rc = -ENOMEM;
		goto out_free;
	}
	printf("\n[15] commit rate with fleet sightings on (%s%s%s, B "
	       "listening) against off: %u new blocks of %llu bytes a "
	       "sample, policy kvfs; the sample on ends with the publish "
	       "(median of %d)\n",
	       backend_name(B), B->o.nodes ? " " : "",
	       B->o.nodes ? B->o.nodes : "", B->o.blocks,
	       (unsigned long long)B->img_size, B->o.iters);
	/* The first commits of a cache fault its DRAM tier in: one sample
	 * of each, untimed, before the figure.
	 */
	for (int s = 0; s < 2 * B->o.iters + 2 && !rc; s += 2) {
		int k = s / 2 - 1;
		/* Which side goes first alternates: each then follows the
		 * other equally often.
		 */
		struct host *first = (s / 2) % 2 ? &B->off : &B->on;
		struct host *second = first == &B->on ? &B->off : &B->on;
		double r1 = 0, r2 = 0;

		rc = commit_sample(B, first, s, &r1);
		if (!rc)
			rc = commit_sample(B, second, s + 1, &r2);
		if (rc || k < 0)
			continue;
		on[k] = first == &B->on ? r1 : r2;
		off[k] = first == &B->on ? r2 : r1;
	}
	if (rc)
		goto out_free;
	snprintf(label, sizeof(label), "[15] commits, sightings on/off (%s)",
		 B->o.nodes ? "redis" : "memory");
	bench_summary(B->o.summ, label, bench_median(on, B->o.iters),
		      bench_median(off, B->o.iters), "blocks/s", "-");
out_free:
	free(on);
	free(off);
	return rc;
}

/* ------------------------------------------------------------- [16] */

/* Key @i of sample @s: distinct across the run, spread like a hash. */
static void make_keys(struct bench *B, int s)
{
	for (unsigned i = 0; i < B->o.keys; i++) {
		uint64_t a = ((uint64_t)s << 32 | i) * 0x9e3779b97f4a7c15ull;
		uint64_t b = (a ^ (a >> 29)) * 0xbf58476d1ce4e5b9ull;

		memcpy(B->keys[i], &a, 8);
		memcpy(B->keys[i] + 8, &b, 8);
	}
}

/* The keys through A1, the server and B into B's policy. */
static int heard_sample(struct bench *B, double *rate)
{
	static const uint8_t fence[KVFS_KEY_LEN] = { 0xfe };
	struct kvfs_sight *a = B->on.c->sight;
	struct kvfs_sight_stats st;
	uint64_t t0;
	int rc;

	sight_stats(&B->hear, &st);
	t0 = bench_now_ns();
	for (unsigned i = 0; i < B->o.keys; i++)
		kvfs_sight_note(a, B->keys[i]);
	rc = publish(B);
	/* B counts a message's keys before it hands them to the policy; a
	 * message of one key after the others, heard, says the last of
	 * theirs is in the policy.
	 */
	if (!rc) {
		kvfs_sight_note(a, fence);
		rc = publish(B);
	}
	if (!rc)
		rc = hear_wait(B, st.keys_in + B->o.keys + 1);
	if (!rc)
		rc = publish_clean(B);
	*rate = (double)B->o.keys / ((double)(bench_now_ns() - t0) / 1e9);
	return rc;
}

/* The same keys straight into a policy like B's, locked as B's is. */
static double direct_sample(struct bench *B)
{
	uint64_t t0 = bench_now_ns();

	for (unsigned i = 0; i < B->o.keys;) {
		unsigned end = B->o.keys - i > KEYS_PER_LOCK ?
				       i + KEYS_PER_LOCK :
				       B->o.keys;

		pthread_mutex_lock(&B->direct_lock);
		for (; i < end; i++)
			kvfs_policy_sight(B->direct, B->keys[i], NULL);
		pthread_mutex_unlock(&B->direct_lock);
	}
	return (double)B->o.keys / ((double)(bench_now_ns() - t0) / 1e9);
}

static int direct_open(struct bench *B)
{
	uint64_t cap[KVFS_NTIERS] = { 0 };
	struct kvfs_cache *c = B->hear.c;
	int rc;

	for (int t = 0; t < KVFS_NTIERS; t++)
		if (c->tier[t])
			cap[t] = c->tier[t]->capacity;
	rc = kvfs_policy_new("kvfs", NULL, NULL, 0, cap, &B->direct);
	if (rc)
		fprintf(stderr, "bench_sight: a kvfs policy: %s\n",
			strerror(-rc));
	return rc;
}

static int figure_heard(struct bench *B)
{
	double *tr = calloc((size_t)B->o.iters, sizeof(double));
	double *di = calloc((size_t)B->o.iters, sizeof(double));
	double k, b;
	char label[96];
	int rc = 0;

	if (!tr || !di) {
		rc = -ENOMEM;
		goto out_free;
	}
	printf("\n[16] keys heard per second: %u keys published by A1 in "
	       "messages of %u through the %s, into B's policy, against the "
	       "same keys given to a kvfs policy of B's capacities directly "
	       "(median of %d)\n",
	       B->o.keys, KVFS_SIGHT_MSG_KEYS,
	       B->o.nodes ? "server" : "memory bus", B->o.iters);
	for (int s = 0; s < B->o.iters && !rc; s++) {
		make_keys(B, s);
		if (s % 2) {
			di[s] = direct_sample(B);
			rc = heard_sample(B, &tr[s]);
		} else {
			rc = heard_sample(B, &tr[s]);
			di[s] = direct_sample(B);
		}
	}
	if (rc)
		goto out_free;
	k = bench_median(tr, B->o.iters);
	b = bench_median(di, B->o.iters);
	snprintf(label, sizeof(label), "[16] sightings heard (%s)",
		 B->o.nodes ? "redis" : "memory");
	bench_summary(B->o.summ, label, k, b, "keys/s", "-");
	printf("    per key   %12.1f ns through the %s, %.1f ns direct\n",
	       1e9 / k, B->o.nodes ? "server" : "bus", 1e9 / b);
out_free:
	free(tr);
	free(di);
	return rc;
}

/* ---------------------------------------------------------------- main */

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "nodes", required_argument, NULL, 'N' },
		{ "blocks", required_argument, NULL, 'b' },
		{ "keys", required_argument, NULL, 'k' },
		{ "iters", required_argument, NULL, 'i' },
		{ "dir", required_argument, NULL, 'D' },
		{ "summary", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct opts){ .blocks = 256, .keys = 65536, .iters = 31 };
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'N':
			o->nodes = *optarg ? optarg : NULL;
			break;
		case 'b':
			o->blocks = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'k':
			o->keys = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'i':
			o->iters = atoi(optarg);
			break;
		case 'D':
			o->dir = optarg;
			break;
		case 's':
			o->summ = optarg;
			break;
		default:
			goto usage;
		}
	}
	if (optind == argc && o->blocks && o->blocks <= 65536 && o->keys &&
	    o->keys <= 16u << 20 && o->iters > 0 && o->iters <= 1000)
		return 0;
usage:
	fprintf(stderr, "usage: bench_sight [--nodes HOST:PORT] [--blocks K "
			"(256)] [--keys N (65536)]\n"
			"       [--iters S (31)] [--dir DIR] [--summary "
			"FILE]\n");
	return -EINVAL;
}

int main(int argc, char **argv)
{
	struct bench B = { .on.name = "A1",
			   .off.name = "A0",
			   .hear.name = "B" };
	int be, rc;

	if (parse(argc, argv, &B.o))
		return 2;
	kvfs_log_set_level(KVFS_LOG_WARN);
	be = B.o.nodes ? KVFS_SIGHT_REDIS : KVFS_SIGHT_MEMORY;
	/* A channel of this run's own: two runs on one server do not hear
	 * each other.
	 */
	snprintf(B.chan, sizeof(B.chan), "kvfs-bench-%ld", (long)getpid());
	pthread_mutex_init(&B.direct_lock, NULL);
	B.img_size = kvfs_fmt_file_size(&geom, KVFS_KIND_KV, BLOCK_TOKENS);
	B.img = malloc((size_t)B.o.blocks * B.img_size);
	B.names = calloc(B.o.blocks, sizeof(*B.names));
	B.keys = calloc(B.o.keys, KVFS_KEY_LEN);
	if (!B.img || !B.names || !B.keys) {
		rc = -ENOMEM;
		goto out_free;
	}
	printf("  (fleet sightings: %s%s%s, channel %s:sightings)\n",
	       backend_name(&B), B.o.nodes ? " on " : " (no --nodes)",
	       B.o.nodes ? B.o.nodes : "", B.chan);
	rc = host_open(&B, &B.hear, be);
	if (rc)
		goto out_close;
	rc = host_open(&B, &B.on, be);
	if (rc)
		goto out_close;
	rc = host_open(&B, &B.off, KVFS_SIGHT_NONE);
	if (rc)
		goto out_close;
	rc = direct_open(&B);
	if (rc)
		goto out_close;
	rc = hear_ready(&B);
	if (!rc)
		rc = figure_commits(&B);
	if (!rc)
		rc = figure_heard(&B);
	kvfs_policy_free(B.direct);
out_close:
	/* B first: nothing is delivered to a cache being freed, and A1's
	 * free publishes nothing left (the samples flushed it all).
	 */
	host_close(&B.hear);
	host_close(&B.on);
	host_close(&B.off);
out_free:
	free(B.img);
	free(B.names);
	free(B.keys);
	pthread_mutex_destroy(&B.direct_lock);
	if (rc)
		fprintf(stderr, "bench_sight: no figure: %s\n", strerror(-rc));
	return rc ? 1 : 0;
}
