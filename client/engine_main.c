/* SPDX-License-Identifier: MIT */
/*
 * kvfs-engine: an example inference engine's KV connector built on
 * libkvfs, and the end-to-end check of the control file.
 *
 * It plays a stream of requests whose prompts share prefixes: --prefixes
 * distinct prompts of --blocks blocks, the first --shared blocks common to
 * all (a system prompt). Request r picks a prompt from --seed. For each
 * request it looks the prompt up by token ids; a miss stores the missing
 * blocks (as files through the mount, or SAVE from a shm region); a hit
 * loads the prompt back: FETCH into the device pool (bytes checked through
 * the read-only pool mapping) and FETCH_INTO its own shm region, checking
 * each layer as soon as the sync word says it is there, then RELEASE.
 *
 * A block's payload is a pseudo-random stream seeded by its key, so every
 * byte can be checked with nothing but the key.
 *
 * Exit status: 0 all good, 1 a failure or a byte mismatch, 2 usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/libkvfs.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/util.h"

#define VOCAB 128256u
#define WAIT_NS (60ull * 1000000000ull) /* a layer later than this: stuck */

enum store_mode {
	STORE_FILES = 1 << 0,
	STORE_SAVE = 1 << 1,
};

enum load_mode {
	LOAD_POOL = 1 << 0,
	LOAD_INTO = 1 << 1,
};

struct opts {
	const char *mnt, *ns;
	uint32_t requests, prefixes, blocks, shared;
	uint64_t seed;
	unsigned store, load;
	bool quiet;
};

/* Per-phase counters. */
struct phase {
	uint64_t n, blocks, bytes, ns, checked, bad;
};

struct engine {
	struct opts o;
	struct kvfs_client *c;
	struct kvfs_client_ns info;
	uint64_t payload;       /* bytes of one full block's payload */
	uint64_t layer_bytes;
	uint32_t *toks;         /* the current prompt's token ids */
	uint8_t (*keys)[KVFS_KEY_LEN];
	uint8_t *want;          /* expected payloads of the prompt's blocks */
	uint8_t *file;          /* a block file image (files mode) */
	uint64_t *dst;
	struct kvfs_client_peer peer; /* FETCH_INTO destination, SAVE source */
	struct kvfs_client_sync sync;
	struct kvfs_ctl_mem pool;
	struct phase write, lookup, fetch, into;
	uint64_t hits, cached_blocks, layer_waits;
};

static const char usage_text[] =
	"usage: kvfs-engine MNT --ns NAME [--requests N(16)] [--seed S(1)]\n"
	"         [--prefixes P(4)] [--blocks B(8)] [--shared K(2)]\n"
	"         [--store files|save(files)] [--load pool|into|both(both)]\n"
	"         [--quiet (errors only)]\n"
	"Plays N requests over P prompts of B blocks sharing the first K:\n"
	"a miss stores the prompt's missing blocks, a hit fetches them back\n"
	"(device pool and/or its own shm region, per layer) and checks every\n"
	"byte. The namespace's geometry comes from the mount.\n";

static void usage(const char *why)
{
	if (why)
		fprintf(stderr, "kvfs-engine: %s\n", why);
	fputs(usage_text, stderr);
	exit(2);
}

/* ------------------------------------------------------ deterministic data */

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

/* Token @i of block @b of prompt @p; the shared blocks are every prompt's. */
static uint32_t token(const struct opts *o, uint32_t p, uint32_t b,
		      uint32_t i)
{
	uint64_t who = b < o->shared ? UINT32_MAX : p;

	return (uint32_t)(mix(o->seed * 0x9e3779b97f4a7c15ull ^
			      mix(who << 40 ^ (uint64_t)b << 20 ^ i)) % VOCAB);
}

static uint32_t prompt_of(const struct opts *o, uint32_t r)
{
	return (uint32_t)(mix(o->seed ^ mix(r + 1)) % o->prefixes);
}

/*
 * The payload of a full block in block layout: per layer, per chunk, K
 * then V; rows of a last partial chunk stay zero as the format asks.
 */
static void payload(const struct engine *e, const uint8_t *key, uint8_t *out)
{
	const struct kvfs_geom *g = &e->info.geom;
	uint64_t row = (uint64_t)g->n_kv_heads * g->head_dim *
		       kvfs_fmt_dtype_size(g->dtype);
	uint32_t c = g->chunk_tokens, n = g->block_tokens;
	uint32_t nch = (n + c - 1) / c;
	uint64_t s = 0, v;

	for (int i = 0; i < KVFS_KEY_LEN; i++)
		s = s << 8 ^ (s >> 56) ^ key[i];
	s = mix(s) | 1;
	for (uint32_t l = 0; l < g->n_layers; l++) {
		for (uint32_t ch = 0; ch < nch; ch++) {
			uint32_t valid = n - ch * c < c ? n - ch * c : c;

			for (int plane = 0; plane < 2; plane++) {
				uint64_t len = valid * row;

				for (uint64_t k = 0; k < len; k += 8) {
					s ^= s << 13;
					s ^= s >> 7;
					s ^= s << 17;
					v = s;
					memcpy(out + k, &v,
					       len - k < 8 ? len - k : 8);
				}
				memset(out + len, 0, (c - valid) * row);
				out += (uint64_t)c * row;
			}
		}
	}
}

/* ----------------------------------------------------------------- store */

/* Block @b of the current prompt as a file through the mount. */
static int store_file(struct engine *e, uint32_t b, const uint8_t *parent)
{
	const struct kvfs_geom *g = &e->info.geom;
	uint32_t n = g->block_tokens;
	uint64_t size = kvfs_fmt_file_size(g, KVFS_KIND_KV, n);
	char hex[KVFS_KEY_HEX_LEN + 1], path[4096];
	int fd, rc;

	kvfs_fmt_key_hex(e->keys[b], hex);
	snprintf(path, sizeof(path), "%s/%s/%s.kv", e->o.mnt, e->o.ns, hex);
	payload(e, e->keys[b], e->file + kvfs_fmt_payload_off(n));
	rc = kvfs_fmt_build(g, KVFS_KIND_KV, parent, (uint64_t)b * n,
			    e->toks + (size_t)b * n, n, NULL, e->file, size);
	if (rc)
		return rc;
	fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	rc = kvfs_util_write_full(fd, e->file, size, -1);
	if (close(fd) && !rc)
		rc = -errno;
	if (rc)
		fprintf(stderr, "kvfs-engine: write %s: %s\n", path,
			strerror(-rc));
	return rc;
}

/* Block @b through SAVE, from the start of the engine's shm region. */
static int store_save(struct engine *e, uint32_t b, const uint8_t *parent)
{
	uint32_t n = e->info.geom.block_tokens;
	uint8_t key[KVFS_KEY_LEN];
	int rc;

	payload(e, e->keys[b], e->peer.base);
	rc = kvfs_client_save(e->c, e->o.ns, parent, (uint64_t)b * n,
			      e->toks + (size_t)b * n, n, &e->peer.mem, 0,
			      key);
	if (!rc && memcmp(key, e->keys[b], KVFS_KEY_LEN))
		rc = -EPROTO;
	if (rc && rc != -EEXIST)
		fprintf(stderr, "kvfs-engine: save block %u: %s\n", b,
			strerror(-rc));
	return rc;
}

static int store(struct engine *e, uint32_t from)
{
	uint64_t t0 = kvfs_util_now_mono();
	const uint8_t *parent;
	int rc = 0;

	e->write.n++;
	for (uint32_t b = from; b < e->o.blocks; b++) {
		parent = b ? e->keys[b - 1] : e->info.root;
		rc = e->o.store == STORE_SAVE ? store_save(e, b, parent) :
						store_file(e, b, parent);
		/* another request's copy of a shared block got there first */
		if (rc == -EEXIST) {
			rc = 0;
			continue;
		}
		if (rc)
			break;
		e->write.blocks++;
		e->write.bytes += e->payload;
	}
	e->write.ns += kvfs_util_now_mono() - t0;
	return rc;
}

/* ------------------------------------------------------------------ load */

static int load_pool(struct engine *e)
{
	struct kvfs_client_blocks out;
	uint32_t nb = e->o.blocks;
	uint64_t t0 = kvfs_util_now_mono();
	int rc;

	rc = kvfs_client_fetch(e->c, e->o.ns,
			       (const uint8_t(*)[KVFS_KEY_LEN])e->keys, nb,
			       &out);
	e->fetch.ns += kvfs_util_now_mono() - t0;
	if (rc) {
		fprintf(stderr, "kvfs-engine: fetch: %s\n", strerror(-rc));
		return rc;
	}
	e->fetch.n++;
	e->pool = out.resp.pool;
	for (uint32_t i = 0; i < out.resp.n_blocks; i++) {
		e->fetch.blocks++;
		e->fetch.bytes += out.blocks[i].len;
		if (!out.data)
			continue; /* a cuda pool: not mapped here */
		e->fetch.checked++;
		if (out.blocks[i].len != e->payload ||
		    memcmp(out.data[i], e->want + i * e->payload,
			   e->payload)) {
			e->fetch.bad++;
			fprintf(stderr, "kvfs-engine: fetch: block %u differs "
				"from what was stored\n", i);
		}
	}
	if (out.resp.n_blocks != nb) {
		fprintf(stderr, "kvfs-engine: fetch: %u blocks for %u keys\n",
			out.resp.n_blocks, nb);
		e->fetch.bad++;
	}
	kvfs_client_blocks_release(&out);
	rc = kvfs_client_release(e->c, e->o.ns,
				 (const uint8_t(*)[KVFS_KEY_LEN])e->keys, nb);
	if (rc)
		fprintf(stderr, "kvfs-engine: release: %s\n", strerror(-rc));
	return rc;
}

/*
 * FETCH_INTO the engine's region, blocks in reverse order so that a
 * destination offset mix-up cannot go unnoticed; each layer is checked as
 * soon as it is signalled, while later layers are still being copied.
 */
static int load_into(struct engine *e)
{
	const struct kvfs_geom *g = &e->info.geom;
	uint32_t nb = e->o.blocks, waited = 0;
	struct kvfs_client_blocks out;
	struct kvfs_client_job *job;
	uint64_t t0 = kvfs_util_now_mono();
	int rc, wrc = 0;

	for (uint32_t i = 0; i < nb; i++)
		e->dst[i] = (uint64_t)(nb - 1 - i) * e->payload;
	memset(e->peer.base, 0, (size_t)nb * e->payload);
	rc = kvfs_client_fetch_into_start(e->c, e->o.ns,
					  (const uint8_t(*)[KVFS_KEY_LEN])e->keys,
					  nb, &e->peer.mem, e->dst, &e->sync,
					  &job);
	if (rc) {
		fprintf(stderr, "kvfs-engine: fetch_into: %s\n",
			strerror(-rc));
		return rc;
	}
	for (uint32_t l = 0; l < g->n_layers; l++) {
		wrc = kvfs_client_wait_layer(&e->sync, l, (int64_t)WAIT_NS);
		if (wrc)
			break;
		waited++;
		for (uint32_t i = 0; i < nb; i++) {
			uint64_t at = l * e->layer_bytes;

			if (memcmp(e->peer.base + e->dst[i] + at,
				   e->want + i * e->payload + at,
				   e->layer_bytes)) {
				e->into.bad++;
				fprintf(stderr, "kvfs-engine: fetch_into: block "
					"%u layer %u differs\n", i, l);
			}
		}
	}
	rc = kvfs_client_job_join(job, &out);
	e->into.ns += kvfs_util_now_mono() - t0;
	e->layer_waits += waited;
	if (rc || wrc) {
		fprintf(stderr, "kvfs-engine: fetch_into: %s (after %u "
			"layers)\n", strerror(rc ? -rc : -wrc), waited);
		kvfs_client_blocks_release(&out);
		return rc ? rc : wrc;
	}
	e->into.n++;
	e->into.blocks += out.resp.n_blocks;
	e->into.checked += out.resp.n_blocks;
	for (uint32_t i = 0; i < out.resp.n_blocks; i++)
		e->into.bytes += out.blocks[i].len;
	kvfs_client_blocks_release(&out);
	return 0;
}

/* -------------------------------------------------------------- requests */

static int request(struct engine *e, uint32_t r)
{
	uint32_t p = prompt_of(&e->o, r), bt = e->info.geom.block_tokens;
	struct kvfs_client_blocks out;
	size_t nk, nt = (size_t)e->o.blocks * bt;
	uint64_t t0;
	uint32_t cached;
	int rc;

	for (uint32_t b = 0; b < e->o.blocks; b++)
		for (uint32_t i = 0; i < bt; i++)
			e->toks[(size_t)b * bt + i] = token(&e->o, p, b, i);
	rc = kvfs_client_chain(e->info.root, e->toks, nt, bt, 0, e->keys,
			       e->o.blocks, &nk);
	if (rc)
		return rc;
	t0 = kvfs_util_now_mono();
	rc = kvfs_client_lookup_tokens(e->c, e->o.ns, e->toks, nt,
				       KVFS_CTL_F_ACCESS, &out);
	e->lookup.ns += kvfs_util_now_mono() - t0;
	if (rc) {
		fprintf(stderr, "kvfs-engine: lookup: %s\n", strerror(-rc));
		return rc;
	}
	cached = out.resp.n_cached;
	/* the daemon chained the same keys from the same tokens */
	for (uint32_t i = 0; i < out.resp.n_blocks && i < nk; i++)
		if (memcmp(out.blocks[i].key, e->keys[i], KVFS_KEY_LEN))
			e->lookup.bad++;
	kvfs_client_blocks_release(&out);
	e->lookup.n++;
	e->lookup.blocks += e->o.blocks;
	e->cached_blocks += cached;
	if (cached < e->o.blocks)
		return store(e, cached);
	e->hits++;
	for (uint32_t b = 0; b < e->o.blocks; b++)
		payload(e, e->keys[b], e->want + b * e->payload);
	if (e->o.load & LOAD_POOL) {
		rc = load_pool(e);
		if (rc)
			return rc;
	}
	if ((e->o.load & LOAD_INTO) &&
	    e->pool.backend != KVFS_CTL_BACKEND_CUDA)
		rc = load_into(e);
	return rc;
}

/* ---------------------------------------------------------------- report */

static void line(const char *what, const struct phase *ph, const char *tail)
{
	double s = (double)ph->ns / 1e9, mib = (double)ph->bytes / (1 << 20);

	printf("%-10s %5" PRIu64 " requests %6" PRIu64 " blocks %9.1f MiB "
	       "%8.3f s %9.1f MiB/s%s\n", what, ph->n, ph->blocks, mib, s,
	       s > 0 ? mib / s : 0.0, tail);
}

static int report(struct engine *e)
{
	struct kvfs_ctl_stats st;
	char tail[128], a[32], b[32];
	int rc;

	rc = kvfs_client_stats(e->c, e->o.ns, &st);
	if (rc) {
		fprintf(stderr, "kvfs-engine: stats: %s\n", strerror(-rc));
		return rc;
	}
	if (st.leases) {
		fprintf(stderr, "kvfs-engine: %" PRIu64 " leases still held "
			"after every release\n", st.leases);
		rc = -EBUSY;
	}
	if (e->o.quiet)
		return rc;
	snprintf(tail, sizeof(tail), "  (%s)",
		 e->o.store == STORE_SAVE ? "SAVE" : "files");
	line("store", &e->write, tail);
	printf("%-10s %5" PRIu64 " requests %6" PRIu64 " hits, %" PRIu64 "/%"
	       PRIu64 " blocks cached, %.1f us per lookup%s\n", "lookup",
	       e->lookup.n, e->hits, e->cached_blocks, e->lookup.blocks,
	       e->lookup.n ? (double)e->lookup.ns / 1e3 / (double)e->lookup.n :
			     0.0,
	       e->lookup.bad ? ", KEY MISMATCH" : "");
	if (e->o.load & LOAD_POOL) {
		snprintf(tail, sizeof(tail), "  %" PRIu64 "/%" PRIu64
			 " checked, %" PRIu64 " bad", e->fetch.checked,
			 e->fetch.blocks, e->fetch.bad);
		line("fetch", &e->fetch, tail);
	}
	if (e->o.load & LOAD_INTO) {
		snprintf(tail, sizeof(tail), "  %" PRIu64 " layer waits, %"
			 PRIu64 " bad", e->layer_waits, e->into.bad);
		line("fetch_into", &e->into, tail);
	}
	printf("daemon     leases %" PRIu64 " (all clients %" PRIu64
	       "), pool %s of %s in %" PRIu64 " blocks, %" PRIu64
	       " fetches, %" PRIu64 " saves\n", st.leases, st.leases_total,
	       kvfs_util_fmt_size(st.pool_used, a, sizeof(a)),
	       kvfs_util_fmt_size(st.pool_capacity, b, sizeof(b)),
	       st.pool_blocks, st.fetches, st.saves);
	return rc;
}

/* ------------------------------------------------------------------ main */

static uint32_t parse_u32(const char *s, const char *what, uint32_t min)
{
	uint32_t v;

	if (kvfs_util_parse_u32(s, &v) || v < min) {
		fprintf(stderr, "kvfs-engine: --%s '%s': expected an integer "
			">= %u\n", what, s, min);
		exit(2);
	}
	return v;
}

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "ns", required_argument, NULL, 'n' },
		{ "requests", required_argument, NULL, 'r' },
		{ "seed", required_argument, NULL, 's' },
		{ "prefixes", required_argument, NULL, 'p' },
		{ "blocks", required_argument, NULL, 'b' },
		{ "shared", required_argument, NULL, 'k' },
		{ "store", required_argument, NULL, 'S' },
		{ "load", required_argument, NULL, 'L' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	*o = (struct opts){ .requests = 16, .prefixes = 4, .blocks = 8,
			    .shared = 2, .seed = 1, .store = STORE_FILES,
			    .load = LOAD_POOL | LOAD_INTO };
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (ch) {
		case 'n':
			o->ns = optarg;
			break;
		case 'r':
			o->requests = parse_u32(optarg, "requests", 1);
			break;
		case 's':
			if (kvfs_util_parse_u64(optarg, &o->seed))
				usage("--seed: expected an integer");
			break;
		case 'p':
			o->prefixes = parse_u32(optarg, "prefixes", 1);
			break;
		case 'b':
			o->blocks = parse_u32(optarg, "blocks", 1);
			break;
		case 'k':
			o->shared = parse_u32(optarg, "shared", 0);
			break;
		case 'S':
			if (!strcmp(optarg, "files"))
				o->store = STORE_FILES;
			else if (!strcmp(optarg, "save"))
				o->store = STORE_SAVE;
			else
				usage("--store: files or save");
			break;
		case 'L':
			if (!strcmp(optarg, "pool"))
				o->load = LOAD_POOL;
			else if (!strcmp(optarg, "into"))
				o->load = LOAD_INTO;
			else if (!strcmp(optarg, "both"))
				o->load = LOAD_POOL | LOAD_INTO;
			else
				usage("--load: pool, into or both");
			break;
		case 'q':
			o->quiet = true;
			break;
		case 'h':
			usage(NULL);
			break;
		default:
			usage(NULL);
		}
	}
	if (optind != argc - 1)
		usage("one mount point, please");
	o->mnt = argv[optind];
	if (!o->ns)
		usage("--ns is required");
	if (o->shared > o->blocks)
		usage("--shared cannot exceed --blocks");
	if (o->blocks > KVFS_CTL_MAX_BLOCKS)
		usage("--blocks: too many");
}

static int engine_init(struct engine *e)
{
	const struct kvfs_geom *g = &e->info.geom;
	uint64_t region;
	int rc;

	rc = kvfs_client_open(e->o.mnt, &e->c);
	if (rc) {
		fprintf(stderr, "kvfs-engine: %s is not a kvfs mount with a "
			"control file: %s\n", e->o.mnt, strerror(-rc));
		return rc;
	}
	rc = kvfs_client_ns_info(e->c, e->o.ns, &e->info);
	if (rc) {
		fprintf(stderr, "kvfs-engine: namespace %s: %s\n", e->o.ns,
			strerror(-rc));
		return rc;
	}
	e->payload = kvfs_fmt_payload_size(g, KVFS_KIND_KV, g->block_tokens);
	if (!e->payload || !g->n_layers)
		return -EINVAL;
	e->layer_bytes = e->payload / g->n_layers;
	e->toks = calloc((size_t)e->o.blocks * g->block_tokens,
			 sizeof(*e->toks));
	e->keys = calloc(e->o.blocks, KVFS_KEY_LEN);
	e->dst = calloc(e->o.blocks, sizeof(*e->dst));
	e->want = malloc((size_t)e->o.blocks * e->payload);
	e->file = malloc(kvfs_fmt_file_size(g, KVFS_KIND_KV,
					    g->block_tokens));
	if (!e->toks || !e->keys || !e->dst || !e->want || !e->file)
		return -ENOMEM;
	region = (uint64_t)e->o.blocks * e->payload;
	rc = kvfs_client_peer_init(&e->peer, region);
	if (!rc)
		rc = kvfs_client_sync_init(&e->sync);
	if (rc)
		fprintf(stderr, "kvfs-engine: shm region: %s\n",
			strerror(-rc));
	return rc;
}

static void engine_release(struct engine *e)
{
	kvfs_client_sync_release(&e->sync);
	kvfs_client_peer_release(&e->peer);
	kvfs_client_close(e->c);
	free(e->toks);
	free(e->keys);
	free(e->dst);
	free(e->want);
	free(e->file);
}

int main(int argc, char **argv)
{
	struct engine e;
	char sz[32];
	int rc;

	memset(&e, 0, sizeof(e));
	e.peer.fd = -1;
	e.sync.fd = -1;
	parse(argc, argv, &e.o);
	rc = engine_init(&e);
	if (rc)
		goto out_release;
	if (!e.o.quiet)
		printf("kvfs-engine: %s/%s, %u requests over %u prompts of %u "
		       "blocks (%u shared), %s per block, %u layers\n",
		       e.o.mnt, e.o.ns, e.o.requests, e.o.prefixes,
		       e.o.blocks, e.o.shared,
		       kvfs_util_fmt_size(e.payload, sz, sizeof(sz)),
		       e.info.geom.n_layers);
	for (uint32_t r = 0; r < e.o.requests && !rc; r++)
		rc = request(&e, r);
	if (!rc || rc == -EPROTO) {
		int rrc = report(&e);

		rc = rc ? rc : rrc;
	}
	if (!rc && (e.fetch.bad || e.into.bad || e.lookup.bad))
		rc = -EIO;
out_release:
	engine_release(&e);
	if (rc)
		fprintf(stderr, "kvfs-engine: FAILED (%s)\n", strerror(-rc));
	return rc ? 1 : 0;
}
