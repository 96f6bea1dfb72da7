/* SPDX-License-Identifier: MIT */
/*
 * Drives the remote tier and its cluster client against a real Redis
 * (tests/integration/test_redis_cluster.sh). Blocks are a chain of
 * namespace "m" (the mount tests' geometry) whose tokens start at
 * TAG * 100000, so runs with different tags never share keys.
 *
 *   redis_client NODES slot KEY          print kvfs's hash slot of KEY
 *   redis_client NODES key I TAG         print the Redis key of block I
 *   redis_client NODES put N TAG         SET NX N blocks (write through)
 *   redis_client NODES queue N TAG       the same through the write-back
 *                                        queue, then drain
 *   redis_client NODES get N TAG [CMD]...
 *                                        one pipelined lookup of the N
 *                                        blocks, each checked byte for
 *                                        byte; then for each CMD: run it
 *                                        (sh -c) and look up again with
 *                                        the same client
 *   redis_client NODES garble I TAG      overwrite block I with garbage
 *   redis_client NODES nodes             print the masters in the map
 *
 * A lookup prints "round R hits H misses M rejected J errors E bad B
 * nodes N ms T" and the exit status is 0 when every block of the
 * last round was a hit. Environment: REMOTE_TIMEOUT_MS (200),
 * REMOTE_PASSWORD.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/fmt.h"
#include "meta/util.h"
#include "tier/redis_cluster.h"
#include "tier/tier_remote.h"
#include "chain_i.h"

static uint8_t root[KVFS_KEY_LEN];

/* The chain's images and keys. */
static uint8_t **chain(unsigned tag, unsigned n, uint8_t (*keys)[16],
		       uint64_t *len)
{
	return chain_make(root, tag, n, keys, len);
}

static struct kvfs_tier_remote *open_tier(const char *nodes, int write)
{
	struct kvfs_remote_conf c;
	struct kvfs_tier_remote *r;
	const char *t = getenv("REMOTE_TIMEOUT_MS");
	const char *pw = getenv("REMOTE_PASSWORD");

	kvfs_remote_conf_defaults(&c);
	c.backend = KVFS_REMOTE_REDIS;
	snprintf(c.nodes, sizeof(c.nodes), "%s", nodes);
	c.write = write;
	if (t)
		c.timeout_ms = (unsigned)atoi(t);
	if (pw)
		snprintf(c.password, sizeof(c.password), "%s", pw);
	if (kvfs_tier_remote_new(&c, &r)) {
		fprintf(stderr, "cannot open the remote tier\n");
		exit(2);
	}
	return r;
}

static int lookup(struct kvfs_tier_remote *r, unsigned round, unsigned tag,
		  unsigned n)
{
	uint8_t(*keys)[16] = calloc(n, 16);
	uint64_t len;
	uint8_t **img = chain(tag, n, keys, &len);
	struct kvfs_remote_get *g = calloc(n, sizeof(*g));
	struct kvfs_remote_ns ns = { .root = root, .g = &chain_geom };
	struct kvfs_remote_stats st;
	unsigned hits = 0, bad = 0;
	uint64_t t0;
	double ms;

	for (unsigned i = 0; i < n; i++)
		g[i].key = keys[i];
	t0 = kvfs_util_now_mono();
	kvfs_tier_remote_getv(r, &ns, g, n);
	ms = (double)(kvfs_util_now_mono() - t0) / 1e6;
	for (unsigned i = 0; i < n; i++) {
		if (!g[i].res && g[i].len == len &&
		    !memcmp(g[i].img, img[i], len))
			hits++;
		else if (!g[i].res)
			bad++;
		free(g[i].img);
		free(img[i]);
	}
	kvfs_tier_remote_stats(r, &st);
	printf("round %u hits %u misses %u rejected %llu errors %llu "
	       "bad %u nodes %llu ms %.1f\n",
	       round, hits, n - hits, (unsigned long long)st.rejected,
	       (unsigned long long)st.errors, bad, (unsigned long long)st.nodes,
	       ms);
	fflush(stdout);
	free(g);
	free(img);
	free(keys);
	return hits == n && !bad ? 0 : 1;
}

static int store(const char *nodes, unsigned n, unsigned tag, int queued)
{
	struct kvfs_tier_remote *r =
		open_tier(nodes, queued ? KVFS_REMOTE_WRITE_BACK :
					  KVFS_REMOTE_WRITE_THROUGH);
	uint8_t(*keys)[16] = calloc(n, 16);
	uint64_t len;
	uint8_t **img = chain(tag, n, keys, &len);
	struct kvfs_remote_stats st;
	int ret = 0;

	for (unsigned i = 0; i < n; i++) {
		int e = queued ? kvfs_tier_remote_queue(r, root, keys[i],
							img[i], len) :
				 kvfs_tier_remote_put(r, root, keys[i], img[i],
						      len);
		if (e && !ret)
			ret = e;
		free(img[i]);
	}
	if (queued && !ret)
		ret = kvfs_tier_remote_drain(r, 30000);
	kvfs_tier_remote_stats(r, &st);
	printf("stored %u errors %llu dropped %llu bytes %llu res %d\n", n,
	       (unsigned long long)st.errors, (unsigned long long)st.dropped,
	       (unsigned long long)st.bytes_written, ret);
	kvfs_tier_remote_free(r);
	free(img);
	free(keys);
	return ret || st.dropped ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *nodes, *cmd;
	int ret = 0;

	if (argc < 3) {
		fprintf(stderr, "usage: see the comment atop redis_client.c\n");
		return 2;
	}
	nodes = argv[1];
	cmd = argv[2];
	kvfs_fmt_root_key("m", NULL, root);
	if (!strcmp(cmd, "slot") && argc == 4) {
		printf("%u\n", kvfs_rc_slot(argv[3], strlen(argv[3])));
	} else if (!strcmp(cmd, "key") && argc == 5) {
		unsigned i = (unsigned)atoi(argv[3]);
		uint8_t(*keys)[16] = calloc(i + 1, 16);
		uint64_t len;
		uint8_t **img =
			chain((unsigned)atoi(argv[4]), i + 1, keys, &len);
		char k[KVFS_REMOTE_KEY_MAX];

		kvfs_remote_key("kvfs", root, keys[i], k, sizeof(k));
		printf("%s\n", k);
		for (unsigned j = 0; j <= i; j++)
			free(img[j]);
		free(img);
		free(keys);
	} else if ((!strcmp(cmd, "put") || !strcmp(cmd, "queue")) &&
		   argc == 5) {
		ret = store(nodes, (unsigned)atoi(argv[3]),
			    (unsigned)atoi(argv[4]), !strcmp(cmd, "queue"));
	} else if (!strcmp(cmd, "get") && argc >= 5) {
		struct kvfs_tier_remote *r =
			open_tier(nodes, KVFS_REMOTE_WRITE_OFF);
		unsigned n = (unsigned)atoi(argv[3]);
		unsigned tag = (unsigned)atoi(argv[4]);

		ret = lookup(r, 0, tag, n);
		for (int a = 5; a < argc; a++) {
			if (system(argv[a]) != 0)
				fprintf(stderr, "command failed: %s\n",
					argv[a]);
			ret = lookup(r, (unsigned)(a - 4), tag, n);
		}
		kvfs_tier_remote_free(r);
	} else if (!strcmp(cmd, "garble") && argc == 5) {
		struct kvfs_tier_remote *r =
			open_tier(nodes, KVFS_REMOTE_WRITE_OFF);
		unsigned i = (unsigned)atoi(argv[3]);
		uint8_t(*keys)[16] = calloc(i + 1, 16);
		uint64_t len;
		uint8_t **img =
			chain((unsigned)atoi(argv[4]), i + 1, keys, &len);

		/* A valid header over a payload that is not: only the CRC
		 * can tell.
		 */
		img[i][len - 1] ^= 0xff;
		ret = kvfs_tier_remote_poke(r, root, keys[i], img[i], len) ? 1 :
									     0;
		for (unsigned j = 0; j <= i; j++)
			free(img[j]);
		free(img);
		free(keys);
		kvfs_tier_remote_free(r);
	} else if (!strcmp(cmd, "nodes")) {
		struct kvfs_tier_remote *r =
			open_tier(nodes, KVFS_REMOTE_WRITE_OFF);
		struct kvfs_remote_stats st;

		kvfs_tier_remote_stats(r, &st);
		printf("%llu\n", (unsigned long long)st.nodes);
		kvfs_tier_remote_free(r);
	} else {
		fprintf(stderr, "bad command\n");
		return 2;
	}
	return ret;
}
