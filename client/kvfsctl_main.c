/* SPDX-License-Identifier: MIT */
/*
 * kvfsctl - look after a kvfs mount or store (kvfsctl(8)).
 *
 *   kvfsctl status MNT          tiers, usage, hit ratios, write-back
 *   kvfsctl stats MNT           the raw .kvfs/stats lines
 *   kvfsctl top MNT [-n N] [-d SECS]   rates per tier and per namespace
 *   kvfsctl pin|unpin|evict MNT NS [--tier T] KEY | --prefix KEY |
 *           --tokens LIST | --all
 *   kvfsctl ls MNT [NS]         namespaces, or a namespace's blocks
 *   kvfsctl df MNT              space per tier
 *   kvfsctl scrub MNT [--wait SECS]    start a scrub pass now
 *   kvfsctl fsck [--repair] [-v] STORE   offline check (meta/fsck.h)
 *
 * On a mount it uses only what any client may: .kvfs/stats, the files,
 * their user.kvfs.* attributes and libkvfs on .kvfs/ctl.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "client/libkvfs.h"
#include "meta/fsck.h"
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
	printf("policy %s, %" PRIu64 " blocks, %" PRIu64 " commits, %" PRIu64
	       " rejected, %" PRIu64 " awaiting write-back, %" PRIu64
	       " checksum errors\n",
	       sval(v, n, "policy.name"), get(v, n, NULL, "cache.blocks"),
	       get(v, n, NULL, "cache.commits"),
	       get(v, n, NULL, "cache.rejects"),
	       get(v, n, NULL, "writeback.queued"),
	       get(v, n, NULL, "cache.checksum_errors"));
	/* The tier shared across hosts, when the mount has one. */
	if (strcmp(sval(v, n, "tier.remote.nodes"), "?"))
		printf("remote %" PRIu64 " nodes, %" PRIu64 " hits, %" PRIu64
		       " misses, %" PRIu64 " rejected, %" PRIu64
		       " errors, %s read, %s written, %" PRIu64
		       " queued, %" PRIu64 " dropped\n",
		       get(v, n, "remote", "nodes"),
		       get(v, n, "remote", "hits"),
		       get(v, n, "remote", "misses"),
		       get(v, n, "remote", "rejected"),
		       get(v, n, "remote", "errors"),
		       kvfs_util_fmt_size(get(v, n, "remote", "bytes_read"), a,
					  sizeof(a)),
		       kvfs_util_fmt_size(get(v, n, "remote", "bytes_written"),
					  b, sizeof(b)),
		       get(v, n, "remote", "queued"),
		       get(v, n, "remote", "dropped"));
	/* Fleet sightings, when the mount has them on. */
	if (strcmp(sval(v, n, "fleet.sight.keys_in"), "?"))
		printf("fleet sightings %" PRIu64 " keys sent, %" PRIu64
		       " heard, %" PRIu64 " dropped, %" PRIu64 " lost, %" PRIu64
		       " rejected, %" PRIu64 " errors\n",
		       get(v, n, NULL, "fleet.sight.keys_out"),
		       get(v, n, NULL, "fleet.sight.keys_in"),
		       get(v, n, NULL, "fleet.sight.dropped"),
		       get(v, n, NULL, "fleet.sight.lost"),
		       get(v, n, NULL, "fleet.sight.rejected"),
		       get(v, n, NULL, "fleet.sight.errors"));
}

static void usage(void)
{
	fprintf(stderr,
		"usage: kvfsctl status|stats|df MNT\n"
		"       kvfsctl top MNT [-n ITERATIONS] [-d SECONDS]\n"
		"       kvfsctl pin|unpin|evict MNT NS [--tier gpu|dram|ssd|all]"
		"\n               KEY | --prefix KEY | --tokens T,T,... | --all\n"
		"       kvfsctl ls MNT [NS]\n"
		"       kvfsctl scrub MNT [--wait SECONDS]\n"
		"       kvfsctl fsck [--repair] [-v] STORE\n");
}

/* ------------------------------------------------------------------ top */

static uint64_t rate(uint64_t now, uint64_t before, double secs)
{
	return now > before && secs > 0 ?
		       (uint64_t)((double)(now - before) / secs) :
		       0;
}

static double pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

/* The namespaces .kvfs/stats names (its "ns.NAME.blocks" lines). */
static size_t ns_names(const struct kv *v, size_t n, char names[][128],
		       size_t max)
{
	size_t k = 0;

	for (size_t i = 0; i < n && k < max; i++) {
		size_t l = strlen(v[i].key);

		if (strncmp(v[i].key, "ns.", 3) || l < 3 + 7 ||
		    strcmp(v[i].key + l - 7, ".blocks"))
			continue;
		snprintf(names[k], 128, "%.*s", (int)(l - 3 - 7), v[i].key + 3);
		k++;
	}
	return k;
}

static uint64_t nsget(const struct kv *v, size_t n, const char *ns,
		      const char *field)
{
	char key[256];

	snprintf(key, sizeof(key), "ns.%s.%s", ns, field);
	return get(v, n, NULL, key);
}

static void top_frame(const struct kv *a, size_t na, const struct kv *b,
		      size_t nb, double secs)
{
	static const char *const tiers[] = { "gpu", "dram", "ssd" };
	static char names[256][128];
	char r[32], w[32], u[32];
	size_t nn;

	printf("kvfs top: every %.1fs, policy %s, %" PRIu64 " blocks, %" PRIu64
	       " awaiting write-back\n\n",
	       secs, sval(b, nb, "policy.name"),
	       get(b, nb, NULL, "cache.blocks"),
	       get(b, nb, NULL, "writeback.queued"));
	printf("%-5s %10s %9s %9s %6s %11s %11s %9s\n", "TIER", "used",
	       "hits/s", "misses/s", "hit%", "read/s", "written/s", "evict/s");
	for (size_t i = 0; i < 3; i++) {
		uint64_t h, m;

		if (!get(b, nb, tiers[i], "capacity_bytes"))
			continue;
		h = get(b, nb, tiers[i], "hits") - get(a, na, tiers[i], "hits");
		m = get(b, nb, tiers[i], "misses") -
		    get(a, na, tiers[i], "misses");
		printf("%-5s %10s %9" PRIu64 " %9" PRIu64 " %5.1f%% %11s %11s"
		       " %9" PRIu64 "\n",
		       tiers[i],
		       kvfs_util_fmt_size(get(b, nb, tiers[i], "used_bytes"), u,
					  sizeof(u)),
		       rate(h, 0, secs), rate(m, 0, secs), pct(h, h + m),
		       kvfs_util_fmt_size(
			       rate(get(b, nb, tiers[i], "bytes_read"),
				    get(a, na, tiers[i], "bytes_read"), secs),
			       r, sizeof(r)),
		       kvfs_util_fmt_size(
			       rate(get(b, nb, tiers[i], "bytes_written"),
				    get(a, na, tiers[i], "bytes_written"),
				    secs),
			       w, sizeof(w)),
		       rate(get(b, nb, tiers[i], "evictions"),
			    get(a, na, tiers[i], "evictions"), secs));
	}
	printf("\n%-24s %9s %9s %9s %6s %6s %11s\n", "NAMESPACE", "blocks",
	       "hits/s", "misses/s", "hit%", "dram%", "read/s");
	nn = ns_names(b, nb, names, 256);
	for (size_t i = 0; i < nn; i++) {
		const char *ns = names[i];
		uint64_t h =
			nsget(b, nb, ns, "hits") - nsget(a, na, ns, "hits");
		uint64_t m =
			nsget(b, nb, ns, "misses") - nsget(a, na, ns, "misses");
		uint64_t d = nsget(b, nb, ns, "dram_hits") -
			     nsget(a, na, ns, "dram_hits");

		printf("%-24s %9" PRIu64 " %9" PRIu64 " %9" PRIu64
		       " %5.1f%% %5.1f%% %11s\n",
		       ns, nsget(b, nb, ns, "blocks"), rate(h, 0, secs),
		       rate(m, 0, secs), pct(h, h + m), pct(d, h),
		       kvfs_util_fmt_size(rate(nsget(b, nb, ns, "bytes_read"),
					       nsget(a, na, ns, "bytes_read"),
					       secs),
					  r, sizeof(r)));
	}
	fflush(stdout);
}

static int cmd_top(const char *mnt, int argc, char **argv)
{
	struct kv *a = NULL, *b = NULL;
	size_t na = 0, nb = 0;
	long iters = -1;
	double delay = 2.0;
	bool tty = isatty(STDOUT_FILENO);

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			iters = strtol(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "-d") && i + 1 < argc)
			delay = strtod(argv[++i], NULL);
		else
			return usage(), 2;
	}
	if (delay < 0.05 || iters == 0)
		return usage(), 2;
	if (load_stats(mnt, &a, &na))
		return 1;
	for (long it = 0; iters < 0 || it < iters; it++) {
		struct timespec ts = { (time_t)delay,
				       (long)((delay - (double)(time_t)delay) *
					      1e9) };

		nanosleep(&ts, NULL);
		if (load_stats(mnt, &b, &nb)) {
			free(a);
			return 1;
		}
		if (tty)
			printf("\033[H\033[2J");
		else if (it)
			printf("\n");
		top_frame(a, na, b, nb, delay);
		free(a);
		a = b;
		na = nb;
		b = NULL;
	}
	free(a);
	return 0;
}

/* ---------------------------------------------------- pin, unpin, evict */

struct keys {
	uint8_t (*k)[KVFS_KEY_LEN];
	size_t n, cap;
};

static int keys_add(struct keys *ks, const uint8_t key[KVFS_KEY_LEN])
{
	if (ks->n == ks->cap) {
		size_t cap = ks->cap ? ks->cap * 2 : 64;
		void *p = realloc(ks->k, cap * KVFS_KEY_LEN);

		if (!p)
			return -ENOMEM;
		ks->k = p;
		ks->cap = cap;
	}
	memcpy(ks->k[ks->n++], key, KVFS_KEY_LEN);
	return 0;
}

/* Read the xattr @name of @path as a string into @v. */
static int xattr_str(const char *path, const char *name, char *v, size_t len)
{
	ssize_t n = getxattr(path, name, v, len - 1);

	if (n < 0)
		return -errno;
	v[n] = 0;
	return 0;
}

/* @key and its ancestors up to the root, root first, by user.kvfs.parent. */
static int keys_prefix(const char *mnt, const char *ns, const char *hex,
		       struct keys *ks)
{
	uint8_t key[KVFS_KEY_LEN], root[KVFS_KEY_LEN];
	char path[PATH_MAX], v[128];
	struct keys rev = { 0 };
	int rc;

	snprintf(path, sizeof(path), "%s/%s", mnt, ns);
	rc = xattr_str(path, "user.kvfs.root", v, sizeof(v));
	if (rc || kvfs_fmt_key_parse(v, root))
		return rc ? rc : -EINVAL;
	if (kvfs_fmt_key_parse(hex, key))
		return -EINVAL;
	for (;;) {
		char khex[KVFS_KEY_HEX_LEN + 1];

		kvfs_fmt_key_hex(key, khex);
		snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns, khex);
		rc = xattr_str(path, "user.kvfs.parent", v, sizeof(v));
		if (rc == -ENOENT && rev.n)
			break; /* an ancestor is not stored: the prefix ends */
		if (rc) {
			fprintf(stderr, "kvfsctl: %s: %s\n", path,
				strerror(-rc));
			goto out;
		}
		rc = keys_add(&rev, key);
		if (rc || kvfs_fmt_key_parse(v, key))
			goto out;
		if (!memcmp(key, root, KVFS_KEY_LEN))
			break;
	}
	for (size_t i = rev.n; i-- > 0 && !rc;)
		rc = keys_add(ks, rev.k[i]);
out:
	free(rev.k);
	return rc;
}

/* The keys of a token list's blocks, from the namespace's root. */
static int keys_tokens(struct kvfs_client *c, const char *ns, const char *list,
		       struct keys *ks)
{
	struct kvfs_client_ns info;
	uint32_t *tok = NULL;
	size_t nt = 0, nk = 0;
	char *dup = strdup(list), *save = NULL;
	int rc = dup ? kvfs_client_ns_info(c, ns, &info) : -ENOMEM;

	for (char *t = rc ? NULL : strtok_r(dup, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		uint32_t *p = realloc(tok, (nt + 1) * sizeof(*tok));

		if (!p) {
			rc = -ENOMEM;
			break;
		}
		tok = p;
		if (kvfs_util_parse_u32(t, &tok[nt])) {
			rc = -EINVAL;
			break;
		}
		nt++;
	}
	free(dup);
	if (!rc && !nt)
		rc = -EINVAL;
	if (!rc) {
		nk = kvfs_client_chain_len(nt, info.geom.block_tokens,
					   KVFS_CLIENT_CHAIN_PARTIAL);
		ks->k = calloc(nk ? nk : 1, KVFS_KEY_LEN);
		rc = ks->k ? kvfs_client_chain(info.root, tok, nt,
					       info.geom.block_tokens,
					       KVFS_CLIENT_CHAIN_PARTIAL, ks->k,
					       nk, &ks->n) :
			     -ENOMEM;
		ks->cap = nk;
	}
	free(tok);
	return rc;
}

/* Every block of @ns, from its directory. */
static int keys_all(const char *mnt, const char *ns, struct keys *ks)
{
	char path[PATH_MAX];
	struct dirent *de;
	uint8_t key[KVFS_KEY_LEN];
	DIR *d;
	int rc = 0;

	snprintf(path, sizeof(path), "%s/%s", mnt, ns);
	d = opendir(path);
	if (!d)
		return -errno;
	while (!rc && (de = readdir(d)))
		if (!kvfs_fmt_name_parse(de->d_name, key))
			rc = keys_add(ks, key);
	closedir(d);
	return rc;
}

static int tier_parse(const char *s, bool evict)
{
	if (!strcmp(s, "gpu"))
		return KVFS_CLIENT_TIER_GPU;
	if (!strcmp(s, "dram"))
		return KVFS_CLIENT_TIER_DRAM;
	if (!strcmp(s, "ssd"))
		return KVFS_CLIENT_TIER_SSD;
	if (evict && !strcmp(s, "all"))
		return KVFS_CLIENT_TIER_ALL;
	return -1;
}

static int one_op(struct kvfs_client *c, const char *verb, const char *ns,
		  const uint8_t (*k)[KVFS_KEY_LEN], size_t n, int tier)
{
	if (!strcmp(verb, "pin"))
		return kvfs_client_pin(c, ns, k, n, tier);
	if (!strcmp(verb, "unpin"))
		return kvfs_client_unpin(c, ns, k, n, tier);
	return kvfs_client_evict(c, ns, k, n, tier);
}

/* A batch at a time; a batch that fails is retried key by key, so that
 * the report names each key that failed.  Returns the failures.
 */
static size_t apply(struct kvfs_client *c, const char *verb, const char *ns,
		    const struct keys *ks, int tier)
{
	const size_t batch = 256;
	size_t failed = 0;

	for (size_t i = 0; i < ks->n; i += batch) {
		size_t n = ks->n - i < batch ? ks->n - i : batch;

		if (!one_op(c, verb, ns,
			    (const uint8_t(*)[KVFS_KEY_LEN])ks->k + i, n, tier))
			continue;
		for (size_t j = i; j < i + n; j++) {
			char hex[KVFS_KEY_HEX_LEN + 1];
			int rc = one_op(c, verb, ns,
					(const uint8_t(*)[KVFS_KEY_LEN])ks->k +
						j,
					1, tier);

			if (!rc)
				continue;
			failed++;
			kvfs_fmt_key_hex(ks->k[j], hex);
			fprintf(stderr, "kvfsctl: %s %s/%s.kv: %s\n", verb, ns,
				hex, strerror(-rc));
		}
	}
	return failed;
}

static int cmd_keys(const char *verb, const char *mnt, int argc, char **argv)
{
	const char *ns, *tier_s = NULL, *key = NULL, *prefix = NULL,
			*tokens = NULL;
	bool all = false, evict = !strcmp(verb, "evict");
	struct kvfs_client *c = NULL;
	struct keys ks = { 0 };
	size_t failed;
	int rc, tier, sel;

	if (argc < 1)
		return usage(), 2;
	ns = argv[0];
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--tier") && i + 1 < argc)
			tier_s = argv[++i];
		else if (!strcmp(argv[i], "--prefix") && i + 1 < argc)
			prefix = argv[++i];
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = argv[++i];
		else if (!strcmp(argv[i], "--all"))
			all = true;
		else if (!key && argv[i][0] != '-')
			key = argv[i];
		else
			return usage(), 2;
	}
	sel = !!key + !!prefix + !!tokens + all;
	/* Pins and evictions go to DRAM unless told: neither loses data. */
	tier = tier_parse(tier_s ? tier_s : "dram", evict);
	if (sel != 1 || tier < 0)
		return usage(), 2;
	rc = kvfs_client_open(mnt, &c);
	if (rc) {
		fprintf(stderr, "kvfsctl: %s: %s (is a kvfs mounted there?)\n",
			mnt, strerror(-rc));
		return 1;
	}
	if (key) {
		uint8_t k[KVFS_KEY_LEN];

		rc = kvfs_fmt_key_parse(key, k) ? kvfs_fmt_name_parse(key, k) :
						  0;
		if (!rc)
			rc = keys_add(&ks, k);
	} else if (prefix) {
		rc = keys_prefix(mnt, ns, prefix, &ks);
	} else if (tokens) {
		rc = keys_tokens(c, ns, tokens, &ks);
	} else {
		rc = keys_all(mnt, ns, &ks);
	}
	if (rc) {
		fprintf(stderr, "kvfsctl: %s: cannot name the blocks: %s\n",
			verb, strerror(-rc));
		goto out;
	}
	failed = apply(c, verb, ns, &ks, tier);
	printf("%s: %zu of %zu blocks\n", verb, ks.n - failed, ks.n);
	rc = failed ? -EIO : 0;
out:
	kvfs_client_close(c);
	free(ks.k);
	return rc ? 1 : 0;
}

/* ------------------------------------------------------------- ls, df */

static int ls_ns(const char *mnt, const char *ns)
{
	char path[PATH_MAX], tier[64], pin[64], tok[32], hits[32], sz[32];
	struct dirent *de;
	uint8_t key[KVFS_KEY_LEN];
	DIR *d;

	snprintf(path, sizeof(path), "%s/%s", mnt, ns);
	d = opendir(path);
	if (!d) {
		fprintf(stderr, "kvfsctl: %s: %s\n", path, strerror(errno));
		return 1;
	}
	printf("%-35s %10s %7s %-14s %-10s %8s\n", "BLOCK", "size", "tokens",
	       "tier", "pin", "hits");
	while ((de = readdir(d))) {
		struct stat st;

		if (kvfs_fmt_name_parse(de->d_name, key))
			continue;
		snprintf(path, sizeof(path), "%s/%s/%s", mnt, ns, de->d_name);
		if (stat(path, &st))
			continue; /* removed meanwhile */
		if (xattr_str(path, "user.kvfs.tier", tier, sizeof(tier)))
			strcpy(tier, "?");
		if (xattr_str(path, "user.kvfs.pin", pin, sizeof(pin)))
			strcpy(pin, "-");
		if (xattr_str(path, "user.kvfs.tokens", tok, sizeof(tok)))
			strcpy(tok, "?");
		if (xattr_str(path, "user.kvfs.hits", hits, sizeof(hits)))
			strcpy(hits, "?");
		printf("%-35s %10s %7s %-14s %-10s %8s\n", de->d_name,
		       kvfs_util_fmt_size((uint64_t)st.st_size, sz, sizeof(sz)),
		       tok, tier, pin[0] ? pin : "-", hits);
	}
	closedir(d);
	return 0;
}

static int cmd_ls(const char *mnt, int argc, char **argv)
{
	static char names[256][128];
	struct kv *v = NULL;
	size_t n = 0, nn;

	if (argc > 1)
		return usage(), 2;
	if (argc == 1)
		return ls_ns(mnt, argv[0]);
	if (load_stats(mnt, &v, &n))
		return 1;
	nn = ns_names(v, n, names, 256);
	printf("%-24s %9s %9s\n", "NAMESPACE", "blocks", "hits");
	for (size_t i = 0; i < nn; i++)
		printf("%-24s %9" PRIu64 " %9" PRIu64 "\n", names[i],
		       nsget(v, n, names[i], "blocks"),
		       nsget(v, n, names[i], "hits"));
	free(v);
	return 0;
}

static int cmd_df(const char *mnt)
{
	static const char *const tiers[] = { "gpu", "dram", "ssd" };
	struct statvfs sv;
	struct kv *v = NULL;
	size_t n = 0;
	char a[32], b[32], c[32];

	if (statvfs(mnt, &sv)) {
		fprintf(stderr, "kvfsctl: %s: %s\n", mnt, strerror(errno));
		return 1;
	}
	if (load_stats(mnt, &v, &n))
		return 1;
	printf("%-5s %10s %10s %10s %6s %9s\n", "TIER", "size", "used", "avail",
	       "use%", "blocks");
	for (size_t i = 0; i < 3; i++) {
		uint64_t cap = get(v, n, tiers[i], "capacity_bytes");
		uint64_t used = get(v, n, tiers[i], "used_bytes");

		if (!cap)
			continue;
		printf("%-5s %10s %10s %10s %5.1f%% %9" PRIu64 "\n", tiers[i],
		       kvfs_util_fmt_size(cap, a, sizeof(a)),
		       kvfs_util_fmt_size(used, b, sizeof(b)),
		       kvfs_util_fmt_size(used < cap ? cap - used : 0, c,
					  sizeof(c)),
		       pct(used, cap), get(v, n, tiers[i], "blocks"));
	}
	printf("%s: %s, %s free (statfs), %" PRIu64 " blocks\n", mnt,
	       kvfs_util_fmt_size((uint64_t)sv.f_blocks * sv.f_frsize, a,
				  sizeof(a)),
	       kvfs_util_fmt_size((uint64_t)sv.f_bavail * sv.f_frsize, b,
				  sizeof(b)),
	       get(v, n, NULL, "cache.blocks"));
	free(v);
	return 0;
}

/* ------------------------------------------------------ scrub and fsck */

static int cmd_scrub(const char *mnt, int argc, char **argv)
{
	struct kv *v = NULL;
	size_t n = 0;
	double wait = -1;
	uint64_t before = 0;

	if (argc == 2 && !strcmp(argv[0], "--wait"))
		wait = strtod(argv[1], NULL);
	else if (argc)
		return usage(), 2;
	if (wait >= 0) {
		if (load_stats(mnt, &v, &n))
			return 1;
		before = get(v, n, NULL, "scrub.passes");
		free(v);
	}
	if (setxattr(mnt, "user.kvfs.scrub", "now", 3, 0)) {
		fprintf(stderr, "kvfsctl: scrub %s: %s\n", mnt,
			strerror(errno));
		return 1;
	}
	if (wait < 0) {
		printf("scrub: pass requested\n");
		return 0;
	}
	for (uint64_t t0 = kvfs_util_now_mono();;) {
		uint64_t passes;

		if (load_stats(mnt, &v, &n))
			return 1;
		passes = get(v, n, NULL, "scrub.passes");
		if (passes > before) {
			printf("scrub: pass done: %" PRIu64 " blocks checked, "
			       "%" PRIu64 " dropped (since start)\n",
			       get(v, n, NULL, "scrub.blocks"),
			       get(v, n, NULL, "scrub.bad"));
			free(v);
			return 0;
		}
		free(v);
		if ((double)(kvfs_util_now_mono() - t0) / 1e9 > wait) {
			fprintf(stderr,
				"kvfsctl: scrub: no pass finished "
				"within %.0f s\n",
				wait);
			return 1;
		}
		usleep(100000);
	}
}

static int cmd_fsck(int argc, char **argv)
{
	struct kvfs_fsck_report r;
	unsigned flags = 0;
	const char *store = NULL;
	int rc;

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--repair") || !strcmp(argv[i], "-y"))
			flags |= KVFS_FSCK_REPAIR;
		else if (!strcmp(argv[i], "-v"))
			flags |= KVFS_FSCK_VERBOSE;
		else if (!store && argv[i][0] != '-')
			store = argv[i];
		else
			return usage(), 8;
	}
	if (!store)
		return usage(), 8;
	rc = kvfs_fsck_run(store, flags, stdout, &r);
	if (rc < 0) {
		fprintf(stderr, "kvfsctl: fsck %s: %s%s\n", store,
			strerror(-rc),
			rc == -EBUSY ? " (the store is mounted: unmount it "
				       "first)" :
				       "");
		/* e2fsck's "operational error" */
		return 8;
	}
	printf("%s: %" PRIu64 " blocks, %" PRIu64 " verify, %" PRIu64
	       " bad, %" PRIu64 " bad chunk CRC tables, %" PRIu64
	       " free-map errors, %" PRIu64 " orphan ranges (%" PRIu64
	       " bytes), %" PRIu64 " orphan chunk CRC tables, %" PRIu64
	       " keys with orphan chunk scores (%" PRIu64 " entries), %" PRIu64
	       " overlaps; %s\n",
	       store, r.records, r.good, r.bad, r.ccrc_bad, r.free_errors,
	       r.orphans, r.orphan_bytes, r.ccrc_orphans, r.score_orphans,
	       r.score_orphan_records, r.overlaps,
	       rc == KVFS_FSCK_CLEAN	? "clean" :
	       rc == KVFS_FSCK_REPAIRED ? "errors repaired" :
					  "errors left");
	return rc;
}

int main(int argc, char **argv)
{
	const char *verb = argc > 1 ? argv[1] : "";
	struct kv *v = NULL;
	size_t n = 0;

	if (!strcmp(verb, "fsck"))
		return cmd_fsck(argc - 2, argv + 2);
	if (argc < 3) {
		usage();
		return 2;
	}
	if (!strcmp(verb, "top"))
		return cmd_top(argv[2], argc - 3, argv + 3);
	if (!strcmp(verb, "pin") || !strcmp(verb, "unpin") ||
	    !strcmp(verb, "evict"))
		return cmd_keys(verb, argv[2], argc - 3, argv + 3);
	if (!strcmp(verb, "ls"))
		return cmd_ls(argv[2], argc - 3, argv + 3);
	if (!strcmp(verb, "scrub"))
		return cmd_scrub(argv[2], argc - 3, argv + 3);
	if (argc != 3 || (strcmp(verb, "status") && strcmp(verb, "stats") &&
			  strcmp(verb, "df"))) {
		usage();
		return 2;
	}
	if (!strcmp(verb, "df"))
		return cmd_df(argv[2]);
	if (load_stats(argv[2], &v, &n))
		return 1;
	if (!strcmp(verb, "stats")) {
		for (size_t i = 0; i < n; i++)
			printf("%s %s\n", v[i].key, v[i].val);
	} else {
		status(v, n);
	}
	free(v);
	return 0;
}
