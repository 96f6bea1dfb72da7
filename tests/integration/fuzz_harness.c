/* SPDX-License-Identifier: MIT */
/*
 * The fuzzer's harness (fuzz_i.h says what each function promises): its
 * settings, the seeded generators, the journal that names a failing or
 * hung call and the line that replays it, the daemon's health, and the
 * seeded blocks every target must leave intact.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/util.h"
#include "fuzz_i.h"

/* ------------------------------------------------------------- setting */

const char *mnt, *ns;
static pid_t daemon_pid;
static uint64_t seed = 1;
static double scale = 1.0;
long only_iter = -1;
static unsigned hang_s = 60;
static FILE *summary; /* what each target did: KVFS_FUZZ_SUMMARY, or stdout */
struct kvfs_geom g;
uint8_t root[16];
uint64_t max_file;
char ctl_path[4200], stats_path[4200], ns_path[4200];

struct seedblk *seeds;
int n_seeds;

struct tmpl *tmpls;
int n_tmpls;

char peer_name[64], sync_name[64];
uint8_t *peer_mem, *sync_mem;

uint8_t *iobuf;

/* ------------------------------------------------------------- random */

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t rnd(struct rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return mix64(r->s);
}

uint32_t below(struct rng *r, uint32_t n)
{
	return n ? (uint32_t)(rnd(r) % n) : 0;
}

bool chance(struct rng *r, unsigned pct)
{
	return below(r, 100) < pct;
}

void fill(struct rng *r, void *p, size_t n)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = rnd(r);

		memcpy(b + i, &v, n - i < 8 ? n - i : 8);
	}
}

uint64_t edge64(struct rng *r)
{
	static const uint64_t v[] = {
		0, 1, 2, 3, 4, 7, 8, 15, 16, 4095, 4096, 4097, 65536,
		PEER_SIZE - 4, PEER_SIZE - 1, PEER_SIZE, PEER_SIZE + 1,
		1ull << 31, 1ull << 32, (1ull << 32) - 1, 1ull << 62,
		INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX - 4096,
		UINT64_MAX - 7, UINT64_MAX - 3, UINT64_MAX - 1, UINT64_MAX,
	};

	if (chance(r, 15))
		return rnd(r);
	return v[below(r, sizeof(v) / sizeof(v[0]))];
}

uint32_t edge32(struct rng *r)
{
	static const uint32_t v[] = {
		0, 1, 2, 3, 4, 15, 16, 17, 63, 64, 65, 163, 164, 255, 256,
		4096, 16383, 16384, 16385, 262143, 262144, 262145,
		0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu,
	};

	if (chance(r, 15))
		return (uint32_t)rnd(r);
	return v[below(r, sizeof(v) / sizeof(v[0]))];
}

/* ------------------------------------------------- journal and failure */

static const char *cur_target = "setup";
long cur_iter = -1;
static pthread_mutex_t jlock = PTHREAD_MUTEX_INITIALIZER;
#define JOURNAL 16
static char journal[JOURNAL][216]; /* jlock */
static unsigned jhead;             /* jlock */
static uint64_t op_t0[SLOTS];      /* jlock; 0 when idle */
static char op_now[SLOTS][200];    /* jlock */
__thread int slot;
static bool daemon_dead;
__thread bool in_worker;
char worker_fail[512];             /* jlock */

struct fz_tally tally;

static uint64_t now_ns(void)
{
	return kvfs_util_now_mono();
}

void op_begin(const char *fmt, ...)
{
	char d[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(d, sizeof(d), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&jlock);
	snprintf(journal[jhead++ % JOURNAL], sizeof(journal[0]), "[%d] %s",
		 slot, d);
	memcpy(op_now[slot], d, sizeof(d));
	op_t0[slot] = now_ns();
	pthread_mutex_unlock(&jlock);
	COUNT(calls);
}

void op_end(void)
{
	pthread_mutex_lock(&jlock);
	op_t0[slot] = 0;
	pthread_mutex_unlock(&jlock);
}

/* Caller holds jlock. */
static void journal_dump(FILE *f)
{
	unsigned n = jhead < JOURNAL ? jhead : JOURNAL;

	fprintf(f, "# last %u calls, oldest first:\n", n);
	for (unsigned i = jhead - n; i != jhead; i++)
		fprintf(f, "#   %s\n", journal[i % JOURNAL]);
}

static void repro_line(FILE *f, const char *pfx)
{
	fprintf(f, "%sreproduce: KVFS_FUZZ_SEED=%" PRIu64 " KVFS_FUZZ_ONLY=%s",
		pfx, seed, cur_target);
	if (cur_iter >= 0)
		fprintf(f, " KVFS_FUZZ_ITER=%ld", cur_iter);
	fprintf(f, " bash tests/integration/test_fuzz.sh\n");
}

void fz_fail(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&jlock);
	if (in_worker) {
		if (!worker_fail[0])
			snprintf(worker_fail, sizeof(worker_fail), "%s", msg);
		pthread_mutex_unlock(&jlock);
		pthread_exit(NULL);
	}
	fflush(stdout);
	fprintf(stderr, "# FUZZ FAILURE in %s, iteration %ld, seed %" PRIu64
		": %s\n", cur_target, cur_iter, seed, msg);
	journal_dump(stderr);
	repro_line(stderr, "# ");
	fflush(stderr);
	if (summary && summary != stdout) {
		fprintf(summary, "FAILURE in %s, iteration %ld: %s\n",
			cur_target, cur_iter, msg);
		repro_line(summary, "  ");
		fflush(summary);
	}
	pthread_mutex_unlock(&jlock);
	fail_msg("%s", msg);
	abort();
}

/* A hung FUSE call cannot be interrupted by a signal handler in its own
 * thread; this thread ends the whole program, which SIGKILLs the caller
 * out of its killable wait.
 */
static void *watchdog(void *arg)
{
	struct timespec ts = { 0, 200 * 1000 * 1000 };

	for (;;) {
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&jlock);
		for (int i = 0; i < SLOTS; i++) {
			if (!op_t0[i] ||
			    now_ns() - op_t0[i] < (uint64_t)hang_s * 1000000000ull)
				continue;
			fprintf(stderr, "# FUZZ HANG in %s, iteration %ld, seed %"
				PRIu64 ": '%s' has not returned after %u s\n",
				cur_target, cur_iter, seed, op_now[i], hang_s);
			journal_dump(stderr);
			repro_line(stderr, "# ");
			fflush(stderr);
			if (summary && summary != stdout) {
				fprintf(summary, "HANG in %s, iteration %ld: "
					"%s\n", cur_target, cur_iter,
					op_now[i]);
				repro_line(summary, "  ");
				fflush(summary);
			}
			_exit(124);
		}
		pthread_mutex_unlock(&jlock);
	}
	return NULL;
}

/* --------------------------------------------------------- the daemon */

void check_alive(void)
{
	char path[64], buf[512], *p;
	struct stat st;
	FILE *f;

	if (kill(daemon_pid, 0) && errno == ESRCH) {
		daemon_dead = true;
		fz_fail("the daemon (pid %d) is gone", (int)daemon_pid);
	}
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)daemon_pid);
	f = fopen(path, "re");
	if (f) {
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);

		fclose(f);
		buf[n] = 0;
		p = strrchr(buf, ')');
		if (p && (p[2] == 'Z' || p[2] == 'X')) {
			daemon_dead = true;
			fz_fail("the daemon (pid %d) has exited", (int)daemon_pid);
		}
	}
	if (stat(ns_path, &st) && errno == ENOTCONN) {
		daemon_dead = true;
		fz_fail("the mount is dead (ENOTCONN)");
	}
}

/* ------------------------------------------------------- errno checks */

const char *ename(int e)
{
	static __thread char b[64];

	if (!e)
		return "success";
	snprintf(b, sizeof(b), "%s (%d)", strerror(e), e);
	return b;
}

/* @err: 0 or an errno. Fails unless it is in @ok (END_ERR-terminated). */
void want(int err, const int *ok, const char *what)
{
	char list[256] = "";
	size_t used = 0;

	if (err == ENOTCONN || err == ECONNABORTED) {
		daemon_dead = true;
		fz_fail("%s: %s: the daemon is gone", what, ename(err));
	}
	for (int i = 0; ok[i] != END_ERR; i++) {
		if (ok[i] == err) {
			if (err)
				COUNT(errs);
			else
				COUNT(ok);
			return;
		}
		used += (size_t)snprintf(list + used, sizeof(list) - used,
					 "%s%s", i ? ", " : "",
					 ok[i] ? strerror(ok[i]) : "success");
		if (used >= sizeof(list))
			used = sizeof(list) - 1;
	}
	fz_fail("%s: got %s, expected %s", what, ename(err), list);
}

int err_of(long rc)
{
	return rc < 0 ? errno : 0;
}

/* ---------------------------------------------------------------- I/O */

static int read_all(int fd, uint8_t *buf, uint64_t cap, uint64_t *len)
{
	uint64_t got = 0;

	for (;;) {
		ssize_t n = read(fd, buf + got, cap - got);

		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		got += (uint64_t)n;
		if (got == cap) {
			uint8_t c;

			n = read(fd, &c, 1);
			if (n != 0)
				return -EFBIG;
			break;
		}
	}
	*len = got;
	return 0;
}

void key_path(char *out, size_t len, const uint8_t key[16])
{
	char hex[33];

	kvfs_fmt_key_hex(key, hex);
	snprintf(out, len, "%s/%s.kv", ns_path, hex);
}

/* The whole file at @path, or an errno. */
int slurp(const char *path, uint8_t **out, uint64_t *len)
{
	uint8_t *buf = malloc(max_file + 1);
	int fd, rc;

	if (!buf)
		return ENOMEM;
	op_begin("read %s", path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = errno;
		op_end();
		free(buf);
		return rc;
	}
	rc = -read_all(fd, buf, max_file + 1, len);
	close(fd);
	op_end();
	if (rc) {
		free(buf);
		return rc;
	}
	*out = buf;
	return 0;
}

/* Every seeded block is there, byte for byte. */
static void seeds_check(const char *when)
{
	char path[4300];

	for (int i = 0; i < n_seeds; i++) {
		uint8_t *b = NULL;
		uint64_t len = 0;
		int rc;

		key_path(path, sizeof(path), seeds[i].key);
		rc = slurp(path, &b, &len);
		if (rc)
			fz_fail("%s: seeded block %s: %s", when, path,
				ename(rc));
		if (len != seeds[i].len || memcmp(b, seeds[i].img, len)) {
			free(b);
			fz_fail("%s: seeded block %s changed (%" PRIu64
				" bytes, was %" PRIu64 ")", when, path, len,
				seeds[i].len);
		}
		free(b);
	}
}

int seed_of(const uint8_t key[16])
{
	for (int i = 0; i < n_seeds; i++)
		if (!memcmp(seeds[i].key, key, 16))
			return i;
	return -1;
}

bool is_root(const uint8_t key[16])
{
	return !memcmp(key, root, 16);
}

void make_block(struct rng *r, uint8_t *img, uint64_t *len, uint32_t n,
		const uint8_t parent[16], uint64_t start)
{
	uint32_t tok[256];
	uint64_t size = kvfs_fmt_file_size(&g, KVFS_KIND_KV, n);
	uint64_t off = kvfs_fmt_payload_off(n);

	for (uint32_t i = 0; i < n; i++)
		tok[i] = (uint32_t)rnd(r);
	fill(r, img + off, size - off);
	assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, parent, start, tok,
					n, NULL, img, size),
			 0);
	*len = size;
}

/* The blocks in the namespace besides the seeds (none, between
 * iterations: every accepted block is unlinked).
 */
void listing_check(void)
{
	DIR *d;
	struct dirent *de;
	int seen = 0;

	op_begin("readdir %s", ns_path);
	d = opendir(ns_path);
	if (!d) {
		int e = errno;

		op_end();
		want(e, OKS(0), "opendir the namespace");
		return;
	}
	while ((de = readdir(d))) {
		uint8_t k[16];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (kvfs_fmt_name_parse(de->d_name, k) || seed_of(k) < 0) {
			closedir(d);
			op_end();
			fz_fail("the namespace lists %s, which nothing "
				"stored", de->d_name);
		}
		seen++;
	}
	closedir(d);
	op_end();
	if (seen != n_seeds)
		fz_fail("the namespace lists %d blocks, %d were seeded", seen,
			n_seeds);
}

/* ---------------------------------------------------------- iterations */

/* One generator per (target, iteration): each replays alone. */
struct rng rng_for(unsigned target, long iter)
{
	struct rng r = { mix64(seed ^ mix64(target + 1) ^
			       mix64(0x51ed270b27ull * (uint64_t)(iter + 1))) };

	return r;
}

long iters(long base)
{
	long n = (long)((double)base * scale);

	return n < 1 ? 1 : n;
}

void begin_target(const char *name)
{
	cur_target = name;
	cur_iter = -1;
	memset(&tally, 0, sizeof(tally));
	if (daemon_dead)
		fail_msg("the daemon died earlier: nothing to fuzz");
	check_alive();
}

void end_iteration(long it)
{
	COUNT(iters);
	check_alive();
	if (it % 200 == 199)
		seeds_check("during fuzzing");
}

void end_target(void)
{
	char ops[256] = "";
	size_t used = 0;

	cur_iter = -1;
	check_alive();
	seeds_check("after the target");
	for (int op = 1; op <= KVFS_CTL_OP_MAX; op++)
		if (tally.resp[op])
			used += (size_t)snprintf(ops + used, sizeof(ops) - used,
						 " %d:%lu/%lu", op,
						 tally.resp_ok[op],
						 tally.resp[op]);
	fprintf(summary, "%s: %lu iterations, %lu calls (%lu succeeded, %lu "
		"failed as expected)", cur_target, tally.iters, tally.calls,
		tally.ok, tally.errs);
	if (used)
		fprintf(summary, "; ops done/well-formed:%s", ops);
	if (tally.accepted || tally.refused)
		fprintf(summary, "; blocks accepted %lu, refused %lu",
			tally.accepted, tally.refused);
	fprintf(summary, "\n");
	fflush(summary);
	memset(&tally, 0, sizeof(tally));
}

/* ------------------------------------------------------ start and stop */

static int load_seeds(const char *file)
{
	FILE *f = fopen(file, "re");
	char line[128], path[4300];

	if (!f) {
		fprintf(stderr, "fuzz_client: %s: %s\n", file, strerror(errno));
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		struct seedblk *s;
		uint8_t *img;
		uint64_t len;
		int rc;

		line[strcspn(line, "\r\n")] = 0;
		if (!line[0])
			continue;
		seeds = realloc(seeds, sizeof(*seeds) * (size_t)(n_seeds + 1));
		assert_non_null(seeds);
		s = &seeds[n_seeds];
		memset(s, 0, sizeof(*s));
		if (kvfs_fmt_key_parse(line, s->key)) {
			fprintf(stderr, "fuzz_client: %s: bad key '%s'\n",
				file, line);
			fclose(f);
			return -1;
		}
		key_path(path, sizeof(path), s->key);
		rc = slurp(path, &img, &len);
		if (rc || kvfs_fmt_validate(img, len, &g, s->key, root, 0,
					    &s->h) != KVFS_FMT_OK ||
		    s->h.n_tokens > 256) {
			fprintf(stderr, "fuzz_client: seeded block %s is not "
				"valid before fuzzing (%s)\n", path,
				rc ? strerror(rc) : "does not validate");
			fclose(f);
			return -1;
		}
		s->img = img;
		s->len = len;
		for (uint32_t i = 0; i < s->h.n_tokens; i++)
			s->tok[i] = kvfs_util_get32(img + KVFS_FMT_HDR_SIZE +
						    4 * i);
		n_seeds++;
	}
	fclose(f);
	/* chains, root first */
	for (int i = 0; i < n_seeds; i++) {
		int rev[16], n = 0, at = i;

		while (at >= 0 && n < 16) {
			rev[n++] = at;
			if (is_root(seeds[at].h.parent))
				break;
			at = seed_of(seeds[at].h.parent);
		}
		seeds[i].chain_len = n;
		for (int j = 0; j < n; j++)
			seeds[i].chain[j] = rev[n - 1 - j];
		if (at < 0 || !is_root(seeds[seeds[i].chain[0]].h.parent)) {
			/* not rooted among the seeds: no chain checks */
			seeds[i].chain_len = 1;
			seeds[i].chain[0] = i;
		}
	}
	return 0;
}

static void load_templates(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char path[4300];

	if (!d)
		return;
	while ((de = readdir(d))) {
		uint8_t k[16], *img;
		uint64_t len;
		int fd;

		if (kvfs_fmt_name_parse(de->d_name, k))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		img = malloc(max_file + 65536);
		assert_non_null(img);
		if (read_all(fd, img, max_file + 1, &len) ||
		    kvfs_fmt_validate(img, len, &g, k, root, 0, NULL) !=
			    KVFS_FMT_OK) {
			/* not a good block of this namespace: unused */
			free(img);
			close(fd);
			continue;
		}
		close(fd);
		tmpls = realloc(tmpls, sizeof(*tmpls) * (size_t)(n_tmpls + 1));
		assert_non_null(tmpls);
		tmpls[n_tmpls++] = (struct tmpl){ img, len };
	}
	closedir(d);
}

static uint8_t *shm_make(const char *name, size_t size)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	void *p;

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(p != MAP_FAILED);
	return p;
}

int fz_read_settings(void)
{
	const char *e;
	char v[512], dt[32];
	int n;

	mnt = getenv("KVFS_MNT");
	ns = getenv("KVFS_NS");
	e = getenv("KVFS_PID");
	if (!mnt || !ns || !e) {
		fprintf(stderr, "fuzz_client: KVFS_MNT, KVFS_NS and KVFS_PID "
			"must be set\n");
		return -1;
	}
	daemon_pid = (pid_t)atoi(e);
	if ((e = getenv("KVFS_FUZZ_SEED")))
		seed = strtoull(e, NULL, 0);
	if ((e = getenv("KVFS_FUZZ_SCALE")))
		scale = atof(e);
	if ((e = getenv("KVFS_FUZZ_ITER")))
		only_iter = atol(e);
	if ((e = getenv("KVFS_FUZZ_HANG_S")))
		hang_s = (unsigned)atoi(e);
	summary = stdout;
	if ((e = getenv("KVFS_FUZZ_SUMMARY")) && !(summary = fopen(e, "ae")))
		summary = stdout;
	snprintf(ctl_path, sizeof(ctl_path), "%s/.kvfs/ctl", mnt);
	snprintf(stats_path, sizeof(stats_path), "%s/.kvfs/stats", mnt);
	snprintf(ns_path, sizeof(ns_path), "%s/%s", mnt, ns);

	n = (int)getxattr(ns_path, "user.kvfs.geometry", v, sizeof(v) - 1);
	if (n <= 0)
		return -1;
	v[n] = 0;
	if (sscanf(v, "layers=%u kv_heads=%u head_dim=%u dtype=%31s "
		   "block_tokens=%u chunk_tokens=%u hidden_size=%u",
		   &g.n_layers, &g.n_kv_heads, &g.head_dim, dt,
		   &g.block_tokens, &g.chunk_tokens, &g.hidden_size) != 7 ||
	    kvfs_fmt_dtype_parse(dt) < 0 || g.block_tokens > 256)
		return -1;
	g.dtype = (uint16_t)kvfs_fmt_dtype_parse(dt);
	n = (int)getxattr(ns_path, "user.kvfs.root", v, sizeof(v) - 1);
	if (n != 32)
		return -1;
	v[n] = 0;
	if (kvfs_fmt_key_parse(v, root))
		return -1;
	max_file = kvfs_fmt_max_file_size(&g);
	return 0;
}

int fz_start(void)
{
	const char *e;
	char tag[32];
	pthread_t wd;

	iobuf = aligned_alloc(4096, 16384);
	assert_non_null(iobuf);
	assert_int_equal(pthread_create(&wd, NULL, watchdog, NULL), 0);
	pthread_detach(wd);

	if ((e = getenv("KVFS_FUZZ_SEEDKEYS")) && load_seeds(e))
		return -1;
	if ((e = getenv("KVFS_FUZZ_GOOD")))
		load_templates(e);
	/* Named after the caller's tag, so that it can remove what a
	 * client that died leaves behind.
	 */
	snprintf(tag, sizeof(tag), "%d", (int)getpid());
	if ((e = getenv("KVFS_FUZZ_SHM_TAG")) && *e && !strchr(e, '/'))
		snprintf(tag, sizeof(tag), "%s", e);
	snprintf(peer_name, sizeof(peer_name), "/kvfs-fuzz-%s-peer", tag);
	snprintf(sync_name, sizeof(sync_name), "/kvfs-fuzz-%s-sync", tag);
	shm_unlink(peer_name);
	shm_unlink(sync_name);
	peer_mem = shm_make(peer_name, PEER_SIZE);
	sync_mem = shm_make(sync_name, SYNC_SIZE);
	fprintf(summary, "seed %" PRIu64 ", scale %g, %d seeded blocks, %d "
		"templates%s\n", seed, scale, n_seeds, n_tmpls,
		only_iter >= 0 ? ", one iteration" : "");
	fflush(summary);
	return 0;
}

void fz_stop(void)
{
	for (int i = 0; i < n_seeds; i++)
		free(seeds[i].img);
	free(seeds);
	for (int i = 0; i < n_tmpls; i++)
		free(tmpls[i].img);
	free(tmpls);
	free(iobuf);
	munmap(peer_mem, PEER_SIZE);
	munmap(sync_mem, SYNC_SIZE);
	shm_unlink(peer_name);
	shm_unlink(sync_name);
	if (summary != stdout)
		fclose(summary);
}
