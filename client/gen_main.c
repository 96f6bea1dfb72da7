/* SPDX-License-Identifier: MIT */
/*
 * kvfs-gen: writes and verifies example workloads of chained prefix blocks,
 * makes single (good or deliberately broken) block files, and prints key
 * chains.  Used by `make demo`, the integration tests and the benchmarks.
 *
 * Everything is deterministic: token ids come from --seed, and a block's
 * payload is a pseudo-random stream seeded by the block key alone, so
 * `verify` needs nothing but the files (or a list of keys) to check them.
 *
 * Exit status: 0 ok, 1 a failure (I/O error, bad block), 2 a usage error.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "meta/fmt.h"
#include "meta/util.h"

/* Llama-3's vocabulary size: token ids look like real ones. */
#define VOCAB 128256u
#define MAX_TOKENS (1u << 24)
#define PROGRESS_NS 100000000ull /* redraw at most every 100 ms */

enum cmd {
	CMD_WRITE = 1 << 0,
	CMD_VERIFY = 1 << 1,
	CMD_MAKE = 1 << 2,
	CMD_KEY = 1 << 3,
};

enum {
	OPT_NS = 256, OPT_SALT, OPT_LAYERS, OPT_KV_HEADS, OPT_HEAD_DIM,
	OPT_DTYPE, OPT_BLOCK_TOKENS, OPT_CHUNK_TOKENS, OPT_HIDDEN_SIZE,
	OPT_PREFIXES, OPT_BLOCKS, OPT_SHARED, OPT_SEED, OPT_FSYNC, OPT_LOG,
	OPT_QUIET, OPT_TAIL, OPT_MMAP, OPT_PARENT, OPT_START_POS, OPT_TOKENS,
	OPT_CORRUPT, OPT_END
};

#define GEOM (CMD_WRITE | CMD_VERIFY | CMD_MAKE)
#define ALL (GEOM | CMD_KEY)

/* Which subcommands take each option. */
static const unsigned opt_cmds[OPT_END - OPT_NS] = {
	[OPT_NS - OPT_NS] = ALL,
	[OPT_SALT - OPT_NS] = ALL,
	[OPT_LAYERS - OPT_NS] = GEOM,
	[OPT_KV_HEADS - OPT_NS] = GEOM,
	[OPT_HEAD_DIM - OPT_NS] = GEOM,
	[OPT_DTYPE - OPT_NS] = GEOM,
	[OPT_BLOCK_TOKENS - OPT_NS] = ALL,
	[OPT_CHUNK_TOKENS - OPT_NS] = GEOM,
	[OPT_HIDDEN_SIZE - OPT_NS] = GEOM,
	[OPT_PREFIXES - OPT_NS] = CMD_WRITE,
	[OPT_BLOCKS - OPT_NS] = CMD_WRITE,
	[OPT_SHARED - OPT_NS] = CMD_WRITE,
	[OPT_SEED - OPT_NS] = CMD_WRITE,
	[OPT_FSYNC - OPT_NS] = CMD_WRITE,
	[OPT_LOG - OPT_NS] = CMD_WRITE | CMD_VERIFY,
	[OPT_QUIET - OPT_NS] = CMD_WRITE | CMD_VERIFY,
	[OPT_TAIL - OPT_NS] = CMD_WRITE,
	[OPT_MMAP - OPT_NS] = CMD_VERIFY,
	[OPT_PARENT - OPT_NS] = CMD_MAKE | CMD_KEY,
	[OPT_START_POS - OPT_NS] = CMD_MAKE,
	[OPT_TOKENS - OPT_NS] = CMD_MAKE | CMD_KEY,
	[OPT_CORRUPT - OPT_NS] = CMD_MAKE,
};

/* In enum order: long_opts[c - OPT_NS] names option c. */
static const struct option long_opts[] = {
	{ "ns", required_argument, NULL, OPT_NS },
	{ "salt", required_argument, NULL, OPT_SALT },
	{ "layers", required_argument, NULL, OPT_LAYERS },
	{ "kv-heads", required_argument, NULL, OPT_KV_HEADS },
	{ "head-dim", required_argument, NULL, OPT_HEAD_DIM },
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS },
	{ "chunk-tokens", required_argument, NULL, OPT_CHUNK_TOKENS },
	{ "hidden-size", required_argument, NULL, OPT_HIDDEN_SIZE },
	{ "prefixes", required_argument, NULL, OPT_PREFIXES },
	{ "blocks", required_argument, NULL, OPT_BLOCKS },
	{ "shared", required_argument, NULL, OPT_SHARED },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "fsync", no_argument, NULL, OPT_FSYNC },
	{ "log", required_argument, NULL, OPT_LOG },
	{ "quiet", no_argument, NULL, OPT_QUIET },
	{ "tail", required_argument, NULL, OPT_TAIL },
	{ "mmap", no_argument, NULL, OPT_MMAP },
	{ "parent", required_argument, NULL, OPT_PARENT },
	{ "start-pos", required_argument, NULL, OPT_START_POS },
	{ "tokens", required_argument, NULL, OPT_TOKENS },
	{ "corrupt", required_argument, NULL, OPT_CORRUPT },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};
_Static_assert(sizeof(long_opts) / sizeof(long_opts[0]) ==
	       OPT_END - OPT_NS + 2, "one long option per OPT_ value");

struct opts {
	struct kvfs_geom g;
	const char *ns, *salt, *log, *parent, *corrupt;
	uint32_t prefixes, blocks, shared, tail;
	uint64_t seed, start_pos;
	bool fsync, quiet, mmap, have_start_pos;
	uint32_t *tokens;
	uint32_t n_tokens;
	const char *path; /* the DIR or FILE argument */
};

static const char usage_text[] =
	"usage:\n"
	"  kvfs-gen write DIR [GEOM] [--prefixes N(4)] [--blocks N(8)]\n"
	"                 [--shared K(2)] [--seed S(1)] [--tail T] [--fsync]\n"
	"                 [--log FILE] [--quiet]\n"
	"  kvfs-gen verify DIR [GEOM] [--log FILE] [--mmap] [--quiet]\n"
	"  kvfs-gen make FILE|DIR [GEOM] [--parent HEX|root] [--start-pos P]\n"
	"                 [--tokens 1,2,3] [--corrupt WHAT]\n"
	"  kvfs-gen key (--ns NAME [--salt S] | --parent HEX) --tokens 1,2,...\n"
	"                 [--block-tokens B(16)]\n"
	"GEOM: --ns NAME [--salt S] --layers L(32) --kv-heads H(8)\n"
	"      --head-dim D(128) --dtype f16|bf16|f32|f8_e4m3 (bf16)\n"
	"      --block-tokens B(16) --chunk-tokens C(16) --hidden-size X(0)\n"
	"Without --ns, write and verify read the root key from DIR's\n"
	"user.kvfs.root xattr (a kvfs namespace directory).\n"
	"write: --tail T makes the last of the --blocks blocks of each chain\n"
	"  hold T tokens; the first K blocks are shared by all chains.\n"
	"make WHAT: magic version kind dtype geom ntokens short (one byte\n"
	"  less) long (one byte more) hdrcrc payloadcrc key startpos pad\n"
	"  hidden (a well-formed HIDDEN block; hidden size defaults to\n"
	"  kv-heads * head-dim). Prints the key; a DIR gets DIR/<key>.kv.\n";

static void usage(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void usage(const char *fmt, ...)
{
	va_list ap;

	if (fmt) {
		fputs("kvfs-gen: ", stderr);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
	fputs(usage_text, stderr);
	exit(2);
}

/* ---- deterministic data ---- */

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Token @i of block @b of chain @chain (UINT64_MAX: the shared blocks). */
static uint32_t token_at(uint64_t seed, uint64_t chain, uint32_t b,
			 uint32_t i)
{
	return (uint32_t)(mix64(seed ^ mix64(chain ^ mix64((uint64_t)b << 32 |
							    i))) % VOCAB);
}

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: fast enough to fill gigabytes, good enough bytes */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static void rng_fill(uint64_t *s, uint8_t *p, uint64_t len)
{
	uint64_t v;

	for (; len >= 8; p += 8, len -= 8) {
		v = rng_next(s);
		memcpy(p, &v, 8);
	}
	if (len) {
		v = rng_next(s);
		memcpy(p, &v, len);
	}
}

/*
 * The payload of a block in file layout, from its key alone: per layer, per
 * chunk, K then V (or X); rows past n_tokens in the last chunk are zero as
 * the format asks.
 */
static void payload_fill(const struct kvfs_geom *g, uint16_t kind,
			 uint32_t n, const uint8_t key[KVFS_KEY_LEN],
			 uint8_t *out)
{
	uint64_t esz = kvfs_fmt_dtype_size(g->dtype);
	uint64_t row = kind == KVFS_KIND_KV ?
			       (uint64_t)g->n_kv_heads * g->head_dim * esz :
			       (uint64_t)g->hidden_size * esz;
	unsigned planes = kind == KVFS_KIND_KV ? 2 : 1;
	uint32_t c = g->chunk_tokens, nch = (n + c - 1) / c;
	uint64_t s = 0;

	for (int i = 0; i < KVFS_KEY_LEN; i++)
		s = s * 131 + key[i];
	s = mix64(s) | 1; /* xorshift must not start at 0 */
	for (uint32_t l = 0; l < g->n_layers; l++) {
		for (uint32_t ch = 0; ch < nch; ch++) {
			uint32_t valid = n - ch * c < c ? n - ch * c : c;

			for (unsigned pl = 0; pl < planes; pl++) {
				rng_fill(&s, out, valid * row);
				memset(out + valid * row, 0,
				       (uint64_t)(c - valid) * row);
				out += c * row;
			}
		}
	}
}

/* ---- small helpers ---- */




static void fix_hdr_crc(uint8_t *p)
{
	kvfs_util_put32(p + 84, kvfs_fmt_crc32c(0, p, 84));
}

static void fix_crcs(uint8_t *p, uint64_t len)
{
	kvfs_util_put32(p + 80, kvfs_fmt_crc32c(0, p + KVFS_FMT_HDR_SIZE,
				      len - KVFS_FMT_HDR_SIZE));
	fix_hdr_crc(p);
}

static void key_path(char *out, size_t len, const char *dir,
		     const uint8_t key[KVFS_KEY_LEN])
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_fmt_key_hex(key, hex);
	snprintf(out, len, "%s/%s.kv", dir, hex);
}

struct progress {
	const char *verb;
	bool quiet;
	uint64_t total, done, bytes, t0, last;
};

static void progress_show(struct progress *p, bool final)
{
	uint64_t now = kvfs_util_now_mono();
	double secs = (double)(now - p->t0) / 1e9;
	double mib = (double)p->bytes / (1 << 20);

	if (p->quiet || (!final && now - p->last < PROGRESS_NS))
		return;
	p->last = now;
	fprintf(stderr, "\r%s %llu/%llu blocks, %.1f MiB, %.1f MiB/s%s",
		p->verb, (unsigned long long)p->done,
		(unsigned long long)p->total, mib, secs > 0 ? mib / secs : 0.0,
		final ? "\n" : "");
}

/* An error line, first ending a progress line that is on screen. */
static void gen_err(const struct progress *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void gen_err(const struct progress *p, const char *fmt, ...)
{
	va_list ap;

	if (p && !p->quiet && p->last)
		fputc('\n', stderr);
	fputs("kvfs-gen: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* The root key from --ns, or from DIR's xattr on a kvfs mount. */
static int find_root(const struct opts *o, const char *dir,
		     uint8_t root[KVFS_KEY_LEN])
{
	char hex[80];
	ssize_t n;

	if (o->ns) {
		kvfs_fmt_root_key(o->ns, o->salt, root);
		return 0;
	}
	if (!dir)
		return -EINVAL;
	n = getxattr(dir, "user.kvfs.root", hex, sizeof(hex) - 1);
	if (n < KVFS_KEY_HEX_LEN)
		return -EINVAL;
	hex[KVFS_KEY_HEX_LEN] = '\0'; /* drop a trailing newline, if any */
	return kvfs_fmt_key_parse(hex, root);
}

static int parse_tokens(const char *s, struct opts *o)
{
	char *copy = strdup(s), *save = NULL, *tok;
	uint32_t n = 0;
	int rc = 0;

	free(o->tokens);
	o->tokens = calloc(strlen(s) / 2 + 1, sizeof(uint32_t));
	if (!copy || !o->tokens) {
		fprintf(stderr, "kvfs-gen: out of memory\n");
		exit(1);
	}
	for (tok = strtok_r(copy, ",", &save); tok && !rc;
	     tok = strtok_r(NULL, ",", &save))
		rc = n >= MAX_TOKENS ? -E2BIG :
				       kvfs_util_parse_u32(tok, &o->tokens[n++]);
	/* "1,,2" and a trailing comma would hide a token: refuse them */
	if (!n || strstr(s, ",,") || s[0] == ',' || s[strlen(s) - 1] == ',')
		rc = -EINVAL;
	o->n_tokens = n;
	free(copy);
	return rc;
}

/* ---- write ---- */

static int cmd_write(struct opts *o)
{
	const struct kvfs_geom *g = &o->g;
	uint64_t cap = kvfs_fmt_file_size(g, KVFS_KIND_KV, g->block_tokens);
	uint8_t root[KVFS_KEY_LEN], parent[KVFS_KEY_LEN], key[KVFS_KEY_LEN];
	struct progress pr = { .verb = "wrote", .quiet = o->quiet };
	uint32_t *toks = calloc(g->block_tokens, sizeof(*toks));
	uint8_t *buf = malloc(cap);
	uint64_t shared = 0, written = 0;
	char path[4096], hex[KVFS_KEY_HEX_LEN + 2];
	int log_fd = -1, rc = 1;

	if (find_root(o, o->path, root))
		usage("write needs --ns NAME (or a kvfs namespace DIR)");
	if (!buf || !toks) {
		fprintf(stderr, "kvfs-gen: cannot allocate %llu bytes\n",
			(unsigned long long)cap);
		goto out_free;
	}
	if (o->log && !strcmp(o->log, "-")) {
		/* "-": keys go to stdout as they become durable, one write
		 * per line, so a test can act on the Nth acknowledged block.
		 */
		log_fd = dup(STDOUT_FILENO);
	} else if (o->log) {
		log_fd = open(o->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
			      0644);
		if (log_fd < 0) {
			fprintf(stderr, "kvfs-gen: %s: %s\n", o->log,
				strerror(errno));
			goto out_free;
		}
	}
	pr.total = (uint64_t)o->prefixes * o->blocks;
	pr.t0 = kvfs_util_now_mono();
	for (uint32_t c = 0; c < o->prefixes; c++) {
		memcpy(parent, root, KVFS_KEY_LEN);
		for (uint32_t b = 0; b < o->blocks; b++) {
			uint32_t n = o->tail && b == o->blocks - 1 ?
					     o->tail : g->block_tokens;
			uint64_t chain = b < o->shared ? UINT64_MAX : c;
			uint64_t size = kvfs_fmt_file_size(g, KVFS_KIND_KV, n);
			int fd, err;

			for (uint32_t i = 0; i < n; i++)
				toks[i] = token_at(o->seed, chain, b, i);
			kvfs_fmt_block_key(parent, toks, n, key);
			key_path(path, sizeof(path), o->path, key);
			fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
				  0644);
			if (fd < 0 && errno == EEXIST) {
				shared++;
				goto next;
			}
			if (fd < 0) {
				gen_err(&pr, "create %s: %s", path,
					strerror(errno));
				goto out_close_log;
			}
			payload_fill(g, KVFS_KIND_KV, n, key,
				     buf + kvfs_fmt_payload_off(n));
			err = kvfs_fmt_build(g, KVFS_KIND_KV, parent,
					     (uint64_t)b * g->block_tokens,
					     toks, n, NULL, buf, cap);
			if (!err)
				err = kvfs_util_write_full(fd, buf, size, -1);
			if (!err && o->fsync && fsync(fd))
				err = -errno;
			if (err) {
				gen_err(&pr, "write %s: %s", path,
					strerror(-err));
				close(fd);
				goto out_close_log;
			}
			if (close(fd)) {
				gen_err(&pr, "close %s: %s", path,
					strerror(errno));
				goto out_close_log;
			}
			written++;
			pr.bytes += size;
			if (log_fd >= 0) {
				/* listed only once durable (with --fsync) */
				kvfs_fmt_key_hex(key, hex);
				strcat(hex, "\n");
				err = kvfs_util_write_full(log_fd, hex,
							   strlen(hex), -1);
				if (!err && o->fsync && strcmp(o->log, "-") &&
				    fdatasync(log_fd))
					err = -errno;
				if (err) {
					gen_err(&pr, "%s: %s", o->log,
						strerror(-err));
					goto out_close_log;
				}
			}
next:
			memcpy(parent, key, KVFS_KEY_LEN);
			pr.done++;
			progress_show(&pr, false);
		}
	}
	progress_show(&pr, true);
	if (!o->quiet) {
		double secs = (double)(kvfs_util_now_mono() - pr.t0) / 1e9;

		printf("wrote %llu blocks (%llu shared skipped), %.1f MiB in "
		       "%.3f s: %.0f blocks/s, %.1f MiB/s\n",
		       (unsigned long long)written,
		       (unsigned long long)shared,
		       (double)pr.bytes / (1 << 20), secs,
		       secs > 0 ? (double)written / secs : 0.0,
		       secs > 0 ? (double)pr.bytes / (1 << 20) / secs : 0.0);
	}
	rc = 0;
out_close_log:
	if (log_fd >= 0 && close(log_fd) && !rc) {
		fprintf(stderr, "kvfs-gen: %s: %s\n", o->log, strerror(errno));
		rc = 1;
	}
out_free:
	free(buf);
	free(toks);
	return rc;
}

/* ---- verify ---- */

struct keylist {
	uint8_t (*k)[KVFS_KEY_LEN];
	size_t n, cap;
};

static int keylist_add(struct keylist *l, const uint8_t key[KVFS_KEY_LEN])
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 256;
		void *p = realloc(l->k, cap * KVFS_KEY_LEN);

		if (!p)
			return -ENOMEM;
		l->k = p;
		l->cap = cap;
	}
	memcpy(l->k[l->n++], key, KVFS_KEY_LEN);
	return 0;
}

/* Keys from the log (one hex per line) or the DIR's *.kv names. */
static int collect_keys(const struct opts *o, struct keylist *l,
			uint64_t *bad)
{
	uint8_t key[KVFS_KEY_LEN];
	int rc = 0;

	if (o->log) {
		FILE *f = fopen(o->log, "re");
		char line[256];
		unsigned no = 0;

		if (!f) {
			fprintf(stderr, "kvfs-gen: %s: %s\n", o->log,
				strerror(errno));
			return -1;
		}
		while (fgets(line, sizeof(line), f) && !rc) {
			no++;
			line[strcspn(line, "\r\n")] = '\0';
			if (!line[0])
				continue;
			if (kvfs_fmt_key_parse(line, key)) {
				fprintf(stderr, "kvfs-gen: %s:%u: not a key\n",
					o->log, no);
				++*bad;
				continue;
			}
			rc = keylist_add(l, key);
		}
		fclose(f);
	} else {
		DIR *d = opendir(o->path);
		struct dirent *de;

		if (!d) {
			fprintf(stderr, "kvfs-gen: %s: %s\n", o->path,
				strerror(errno));
			return -1;
		}
		while (!rc && (de = readdir(d)))
			if (!kvfs_fmt_name_parse(de->d_name, key))
				rc = keylist_add(l, key);
		closedir(d);
	}
	if (rc)
		fprintf(stderr, "kvfs-gen: out of memory\n");
	return rc;
}

/* NULL if the block is good, else why not. */
static const char *verify_one(const struct opts *o, const uint8_t *root,
			      const uint8_t key[KVFS_KEY_LEN], uint8_t *buf,
			      uint64_t cap, uint8_t *scratch, uint64_t *bytes)
{
	static char why[128];
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err e;
	const uint8_t *data = buf;
	char path[4096];
	struct stat st;
	uint64_t len, off;
	void *map = NULL;
	int fd, rc;

	why[0] = '\0';
	key_path(path, sizeof(path), o->path, key);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		snprintf(why, sizeof(why), "%s", errno == ENOENT ? "missing" :
			 strerror(errno));
		if (fd >= 0)
			close(fd);
		return why;
	}
	len = (uint64_t)st.st_size;
	if (len > cap || len < KVFS_FMT_HDR_SIZE) {
		close(fd);
		snprintf(why, sizeof(why), "size %llu impossible for the geometry",
			 (unsigned long long)len);
		return why;
	}
	if (o->mmap) {
		map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		rc = map == MAP_FAILED ? -errno : 0;
		data = map;
	} else {
		rc = kvfs_util_read_full(fd, buf, len, -1);
	}
	close(fd);
	if (rc) {
		snprintf(why, sizeof(why), "%s: %s", o->mmap ? "mmap" : "read",
			 strerror(-rc));
		return why;
	}
	*bytes += len;
	e = kvfs_fmt_validate(data, len, &o->g, key, root,
			      KVFS_FMT_ALLOW_HIDDEN, &h);
	if (e) {
		snprintf(why, sizeof(why), "%s", kvfs_fmt_strerror(e));
	} else {
		off = kvfs_fmt_payload_off(h.n_tokens);
		payload_fill(&o->g, h.kind, h.n_tokens, h.key, scratch);
		if (memcmp(data + off, scratch, len - off))
			snprintf(why, sizeof(why),
				 "payload differs from the generated one");
	}
	if (map)
		munmap(map, len);
	return why[0] ? why : NULL;
}

static int cmd_verify(struct opts *o)
{
	uint64_t cap = kvfs_fmt_max_file_size(&o->g);
	uint8_t root[KVFS_KEY_LEN];
	struct keylist l = { 0 };
	struct progress pr = { .verb = "read", .quiet = o->quiet };
	uint8_t *buf = NULL, *scratch = NULL;
	uint64_t bad = 0;
	char hex[KVFS_KEY_HEX_LEN + 1];
	int rc = 1;

	if (find_root(o, o->path, root))
		usage("verify needs --ns NAME (or a kvfs namespace DIR)");
	buf = o->mmap ? NULL : malloc(cap);
	scratch = malloc(cap);
	if ((!o->mmap && !buf) || !scratch) {
		fprintf(stderr, "kvfs-gen: out of memory\n");
		goto out_free;
	}
	if (collect_keys(o, &l, &bad))
		goto out_free;
	pr.total = l.n;
	pr.t0 = kvfs_util_now_mono();
	for (size_t i = 0; i < l.n; i++) {
		const char *why = verify_one(o, root, l.k[i], buf, cap,
					     scratch, &pr.bytes);

		if (why) {
			kvfs_fmt_key_hex(l.k[i], hex);
			gen_err(&pr, "%s: %s", hex, why);
			bad++;
		}
		pr.done++;
		progress_show(&pr, false);
	}
	progress_show(&pr, true);
	printf("verified %zu blocks, %llu bad\n", l.n,
	       (unsigned long long)bad);
	rc = bad ? 1 : 0;
out_free:
	free(l.k);
	free(buf);
	free(scratch);
	return rc;
}

/* ---- make ---- */

static const char *const corruptions[] = {
	"magic", "version", "kind", "dtype", "geom", "ntokens", "short",
	"long", "hdrcrc", "payloadcrc", "key", "startpos", "hidden", "pad",
};
#define N_CORRUPTIONS (sizeof(corruptions) / sizeof(corruptions[0]))

/* Break exactly one property of a valid block; CRCs are repaired unless
 * they are the point, so only the intended check fails.
 */
static void corrupt(const char *what, const struct kvfs_geom *g,
		    bool root_child, uint32_t n, uint8_t *p, uint64_t *len)
{
	uint64_t tok_end = KVFS_FMT_HDR_SIZE + (uint64_t)n * 4;

	if (!strcmp(what, "magic")) {
		p[0] = 'X';
	} else if (!strcmp(what, "version")) {
		kvfs_util_put16(p + 8, KVFS_FMT_VERSION + 1);
	} else if (!strcmp(what, "kind")) {
		kvfs_util_put16(p + 10, 7);
	} else if (!strcmp(what, "dtype")) {
		kvfs_util_put16(p + 12, 99);
	} else if (!strcmp(what, "geom")) {
		kvfs_util_put32(p + 16, g->n_layers + 1);
	} else if (!strcmp(what, "ntokens")) {
		kvfs_util_put32(p + 32, g->block_tokens + 1);
	} else if (!strcmp(what, "short")) {
		--*len;
		return;
	} else if (!strcmp(what, "long")) {
		p[(*len)++] = 0;
		fix_crcs(p, *len);
		return;
	} else if (!strcmp(what, "hdrcrc")) {
		p[84] ^= 1;
		return;
	} else if (!strcmp(what, "payloadcrc")) {
		p[*len - 1] ^= 1;
		return;
	} else if (!strcmp(what, "key")) {
		p[64] ^= 1;
	} else if (!strcmp(what, "startpos")) {
		kvfs_util_put64(p + 40, root_child ? g->block_tokens : 0);
	} else if (!strcmp(what, "pad")) {
		/* token padding if there is any, else the header's tail */
		if (tok_end < kvfs_fmt_payload_off(n)) {
			p[tok_end] = 1;
			fix_crcs(p, *len);
		} else {
			p[KVFS_FMT_HDR_SIZE - 1] = 1;
		}
		return;
	}
	fix_hdr_crc(p);
}

static int cmd_make(struct opts *o)
{
	struct kvfs_geom g = o->g;
	uint16_t kind = KVFS_KIND_KV;
	uint8_t root[KVFS_KEY_LEN], parent[KVFS_KEY_LEN], key[KVFS_KEY_LEN];
	bool root_child = true, have_root = !find_root(o, NULL, root);
	char path[4096], hex[KVFS_KEY_HEX_LEN + 1];
	uint64_t len, start_pos;
	uint8_t *buf;
	struct stat st;
	int fd, err;

	if (o->corrupt && !strcmp(o->corrupt, "hidden")) {
		kind = KVFS_KIND_HIDDEN;
		if (!g.hidden_size)
			g.hidden_size = g.n_kv_heads * g.head_dim;
	}
	if (!o->parent || !strcmp(o->parent, "root")) {
		if (!have_root)
			usage("--parent root needs --ns NAME");
		memcpy(parent, root, KVFS_KEY_LEN);
	} else {
		if (kvfs_fmt_key_parse(o->parent, parent))
			usage("bad --parent '%s'", o->parent);
		root_child = have_root && !memcmp(parent, root, KVFS_KEY_LEN);
	}
	if (!o->tokens) {
		o->tokens = calloc(g.block_tokens, sizeof(uint32_t));
		if (!o->tokens)
			return 1;
		for (uint32_t i = 0; i < g.block_tokens; i++)
			o->tokens[i] = i + 1;
		o->n_tokens = g.block_tokens;
	}
	if (o->n_tokens > g.block_tokens)
		usage("more --tokens than --block-tokens");
	start_pos = o->have_start_pos ? o->start_pos :
			root_child ? 0 : g.block_tokens;
	len = kvfs_fmt_file_size(&g, kind, o->n_tokens);
	buf = calloc(1, len + 1); /* room for --corrupt long */
	if (!buf) {
		fprintf(stderr, "kvfs-gen: out of memory\n");
		return 1;
	}
	/* the payload is seeded by the key, as in write */
	kvfs_fmt_block_key(parent, o->tokens, o->n_tokens, key);
	payload_fill(&g, kind, o->n_tokens, key,
		     buf + kvfs_fmt_payload_off(o->n_tokens));
	if (kvfs_fmt_build(&g, kind, parent, start_pos, o->tokens,
			   o->n_tokens, NULL, buf, len)) {
		free(buf);
		usage("cannot build a block of this geometry");
	}
	if (o->corrupt)
		corrupt(o->corrupt, &g, root_child, o->n_tokens, buf, &len);

	kvfs_fmt_key_hex(buf + 64, hex);
	if (!stat(o->path, &st) && S_ISDIR(st.st_mode))
		key_path(path, sizeof(path), o->path, buf + 64);
	else
		snprintf(path, sizeof(path), "%s", o->path);
	printf("%s\n", hex);
	fflush(stdout);

	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "kvfs-gen: create %s: %s\n", path,
			strerror(errno));
		free(buf);
		return 1;
	}
	err = kvfs_util_write_full(fd, buf, len, -1);
	free(buf);
	if (err) {
		fprintf(stderr, "kvfs-gen: write %s: %s\n", path,
			strerror(-err));
		close(fd);
		return 1;
	}
	if (close(fd)) {
		fprintf(stderr, "kvfs-gen: close %s: %s\n", path,
			strerror(errno));
		return 1;
	}
	return 0;
}

/* ---- key ---- */

static int cmd_key(struct opts *o)
{
	uint8_t parent[KVFS_KEY_LEN], key[KVFS_KEY_LEN];
	char hex[KVFS_KEY_HEX_LEN + 1];
	uint32_t b = o->g.block_tokens;

	if (!o->tokens)
		usage("key needs --tokens");
	if (o->parent && strcmp(o->parent, "root")) {
		if (kvfs_fmt_key_parse(o->parent, parent))
			usage("bad --parent '%s'", o->parent);
	} else if (find_root(o, NULL, parent)) {
		usage("key needs --ns NAME or --parent HEX");
	}
	for (uint32_t off = 0; off < o->n_tokens; off += b) {
		uint32_t n = o->n_tokens - off < b ? o->n_tokens - off : b;

		kvfs_fmt_block_key(parent, o->tokens + off, n, key);
		kvfs_fmt_key_hex(key, hex);
		printf("%s\n", hex);
		memcpy(parent, key, KVFS_KEY_LEN);
	}
	return 0;
}

/* ---- main ---- */

/* Numeric options: where each one goes and its range. */
static uint32_t *u32_field(struct opts *o, int c, uint32_t *min,
			   uint32_t *max)
{
	*min = 1;
	*max = 1u << 20;
	switch (c) {
	case OPT_LAYERS: return &o->g.n_layers;
	case OPT_KV_HEADS: return &o->g.n_kv_heads;
	case OPT_HEAD_DIM: return &o->g.head_dim;
	case OPT_BLOCK_TOKENS: return &o->g.block_tokens;
	case OPT_CHUNK_TOKENS: return &o->g.chunk_tokens;
	case OPT_HIDDEN_SIZE: *min = 0; return &o->g.hidden_size;
	}
	*max = UINT32_MAX;
	switch (c) {
	case OPT_PREFIXES: return &o->prefixes;
	case OPT_BLOCKS: return &o->blocks;
	case OPT_TAIL: return &o->tail;
	case OPT_SHARED: *min = 0; return &o->shared;
	}
	return NULL;
}

static void parse_opt(struct opts *o, int c, const char *arg)
{
	uint32_t *u, min, max;
	int d;

	u = u32_field(o, c, &min, &max);
	if (u) {
		if (kvfs_util_parse_u32(arg, u) || *u < min || *u > max)
			usage("bad value '%s' for --%s", arg,
			      long_opts[c - OPT_NS].name);
		return;
	}
	switch (c) {
	case OPT_NS: o->ns = arg; break;
	case OPT_SALT: o->salt = arg; break;
	case OPT_LOG: o->log = arg; break;
	case OPT_PARENT: o->parent = arg; break;
	case OPT_FSYNC: o->fsync = true; break;
	case OPT_QUIET: o->quiet = true; break;
	case OPT_MMAP: o->mmap = true; break;
	case OPT_DTYPE:
		d = kvfs_fmt_dtype_parse(arg);
		if (d < 0)
			usage("bad --dtype '%s'", arg);
		o->g.dtype = (uint16_t)d;
		break;
	case OPT_SEED:
		if (kvfs_util_parse_u64(arg, &o->seed))
			usage("bad --seed '%s'", arg);
		break;
	case OPT_START_POS:
		if (kvfs_util_parse_u64(arg, &o->start_pos))
			usage("bad --start-pos '%s'", arg);
		o->have_start_pos = true;
		break;
	case OPT_TOKENS:
		if (parse_tokens(arg, o))
			usage("bad --tokens '%s'", arg);
		break;
	case OPT_CORRUPT:
		o->corrupt = arg;
		for (size_t i = 0; i < N_CORRUPTIONS; i++)
			if (!strcmp(arg, corruptions[i]))
				return;
		usage("bad --corrupt '%s'", arg);
	}
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		enum cmd cmd;
		int (*run)(struct opts *o);
		int n_args;
	} cmds[] = {
		{ "write", CMD_WRITE, cmd_write, 1 },
		{ "verify", CMD_VERIFY, cmd_verify, 1 },
		{ "make", CMD_MAKE, cmd_make, 1 },
		{ "key", CMD_KEY, cmd_key, 0 },
	};
	struct opts o = {
		.g = {
			.n_layers = 32, .n_kv_heads = 8, .head_dim = 128,
			.block_tokens = 16, .chunk_tokens = 16,
			.dtype = KVFS_DTYPE_BF16,
		},
		.prefixes = 4, .blocks = 8, .shared = 2, .seed = 1,
	};
	size_t ci;
	int c, rc;

	if (argc < 2)
		usage(NULL);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fputs(usage_text, stdout);
		return 0;
	}
	for (ci = 0; ci < sizeof(cmds) / sizeof(cmds[0]); ci++)
		if (!strcmp(argv[1], cmds[ci].name))
			break;
	if (ci == sizeof(cmds) / sizeof(cmds[0]))
		usage("unknown command '%s'", argv[1]);

	opterr = 0;
	argc--;
	argv++;
	while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
		if (c == ':')
			usage("%s needs a value", argv[optind - 1]);
		if (c == 'h') {
			fputs(usage_text, stdout);
			return 0;
		}
		if (c < OPT_NS || c >= OPT_END)
			usage("bad option '%s'", argv[optind - 1]);
		if (!(opt_cmds[c - OPT_NS] & cmds[ci].cmd))
			usage("--%s does not apply to %s",
			      long_opts[c - OPT_NS].name, cmds[ci].name);
		parse_opt(&o, c, optarg);
	}
	if (argc - optind != cmds[ci].n_args)
		usage(cmds[ci].n_args ? "%s needs exactly one path" :
					"%s takes no path", cmds[ci].name);
	o.path = cmds[ci].n_args ? argv[optind] : NULL;
	if (cmds[ci].cmd != CMD_KEY &&
	    (o.g.chunk_tokens > o.g.block_tokens ||
	     !kvfs_fmt_max_file_size(&o.g)))
		usage("impossible geometry (is --chunk-tokens > --block-tokens?)");
	if (o.shared > o.blocks)
		usage("--shared exceeds --blocks");
	if (o.tail > o.g.block_tokens)
		usage("--tail exceeds --block-tokens");
	rc = cmds[ci].run(&o);
	free(o.tokens);
	return rc;
}
