/* SPDX-License-Identifier: MIT */
/*
 * A seeded fuzzer for a live kvfs mount: malformed .kvfs/ctl requests over
 * both transports (meta/kvfs_ctl.h), xattrs on every kind of inode, mutated
 * block files and namespace operations.  Run by test_fuzz.sh.
 *
 * Every decision comes from a generator seeded by (seed, target,
 * iteration), so one iteration can be replayed alone:
 *   KVFS_FUZZ_SEED=S KVFS_FUZZ_ONLY=target KVFS_FUZZ_ITER=N fuzz_client
 * (a failure prints that line). What the daemon does in the background
 * (write-back, eviction) is not seeded; no check depends on it.
 *
 * Checks, each of which fails the target: every call ends in success or an
 * errno the contract allows (documented malformations are EINVAL, never
 * success); no call outlives KVFS_FUZZ_HANG_S seconds (a watchdog thread
 * ends the program, naming the call); the daemon is alive after every
 * iteration; a block accepted at close() reads back byte for byte as
 * written and validates; a rejected one is not there; responses are
 * well-formed and what FETCH, FETCH_INTO, FETCH_CHUNKS and SAVE deliver is
 * the stored bytes; the seeded blocks are never lost or changed.
 *
 * Environment: KVFS_MNT, KVFS_NS (the seeded namespace), KVFS_PID (the
 * daemon), KVFS_FUZZ_SEEDKEYS (keys of the seeded blocks, one hex per
 * line: read, pinned, evicted from memory, never deleted), KVFS_FUZZ_GOOD
 * (a directory of good blocks made by kvfs-gen, used as templates),
 * KVFS_FUZZ_SEED (1), KVFS_FUZZ_SCALE (1: iterations multiplier),
 * KVFS_FUZZ_ONLY, KVFS_FUZZ_ITER, KVFS_FUZZ_HANG_S (60), KVFS_FUZZ_SUMMARY
 * (a file for the per-target counts instead of stdout), KVFS_FUZZ_SHM_TAG
 * (names its shm objects /kvfs-fuzz-TAG-{peer,sync}; default: its pid).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/ioctl.h>
#include <math.h>
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
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/kvfs_ctl.h"
#include "meta/fmt.h"
#include "meta/util.h"

#define PEER_SIZE (1u << 20)
#define SYNC_SIZE 4096u
#define RESP_HDR ((uint32_t)sizeof(struct kvfs_ctl_resp))
#define BLK_SIZE ((uint32_t)sizeof(struct kvfs_ctl_block))
#define REQ_HDR ((uint32_t)sizeof(struct kvfs_ctl_req))
/* The largest response an ioctl carries whole (kvfs_ctl_exec's E2BIG). */
#define IOC_MAX_BLOCKS ((KVFS_CTL_MSG_SIZE - RESP_HDR) / BLK_SIZE)

/* ------------------------------------------------------------- setting */

static const char *mnt, *ns;
static pid_t daemon_pid;
static uint64_t seed = 1;
static double scale = 1.0;
static long only_iter = -1;
static unsigned hang_s = 60;
static FILE *summary; /* what each target did: KVFS_FUZZ_SUMMARY, or stdout */
static struct kvfs_geom g;
static uint8_t root[16];
static uint64_t max_file;
static char ctl_path[4200], stats_path[4200], ns_path[4200];

struct seedblk {
	uint8_t key[16];
	uint8_t *img;
	uint64_t len;
	struct kvfs_fmt_hdr h;
	uint32_t tok[256];
	int chain[16];     /* indices into seeds[], root first */
	int chain_len;
};
static struct seedblk *seeds;
static int n_seeds;

struct tmpl {
	uint8_t *img;
	uint64_t len;
};
static struct tmpl *tmpls;
static int n_tmpls;

static char peer_name[64], sync_name[64];
static uint8_t *peer_mem, *sync_mem;

/* ------------------------------------------------------------- random */

struct rng {
	uint64_t s;
};

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rnd(struct rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return mix64(r->s);
}

static uint32_t below(struct rng *r, uint32_t n)
{
	return n ? (uint32_t)(rnd(r) % n) : 0;
}

static bool chance(struct rng *r, unsigned pct)
{
	return below(r, 100) < pct;
}

static void fill(struct rng *r, void *p, size_t n)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = rnd(r);

		memcpy(b + i, &v, n - i < 8 ? n - i : 8);
	}
}

static uint64_t edge64(struct rng *r)
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

static uint32_t edge32(struct rng *r)
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
static long cur_iter = -1;
static pthread_mutex_t jlock = PTHREAD_MUTEX_INITIALIZER;
#define JOURNAL 16
static char journal[JOURNAL][216]; /* jlock */
static unsigned jhead;             /* jlock */
#define SLOTS 4
static uint64_t op_t0[SLOTS];      /* jlock; 0 when idle */
static char op_now[SLOTS][200];    /* jlock */
static __thread int slot;
static bool daemon_dead;
/* A worker thread's failure, reported by the main thread after join. */
static __thread bool in_worker;
static char worker_fail[512];      /* jlock */

/* What a target did, printed at its end (atomic: threads count too). */
static struct {
	unsigned long iters, calls, ok, errs;
	unsigned long resp[KVFS_CTL_OP_MAX + 1];    /* well-formed, answered */
	unsigned long resp_ok[KVFS_CTL_OP_MAX + 1]; /* ...with error 0 */
	unsigned long accepted, refused;            /* block files */
} tally;

#define COUNT(f) __atomic_fetch_add(&tally.f, 1, __ATOMIC_RELAXED)

static uint64_t now_ns(void)
{
	return kvfs_util_now_mono();
}

static void op_begin(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

static void op_begin(const char *fmt, ...)
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

static void op_end(void)
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

static void fz_fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void fz_fail(const char *fmt, ...)
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

static void check_alive(void)
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

#define END_ERR (-1)
#define OKS(...) ((const int[]){ __VA_ARGS__, END_ERR })

static const char *ename(int e)
{
	static __thread char b[64];

	if (!e)
		return "success";
	snprintf(b, sizeof(b), "%s (%d)", strerror(e), e);
	return b;
}

/* @err: 0 or an errno. Fails unless it is in @ok (END_ERR-terminated). */
static void want(int err, const int *ok, const char *what)
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

static int err_of(long rc)
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

static void key_path(char *out, size_t len, const uint8_t key[16])
{
	char hex[33];

	kvfs_fmt_key_hex(key, hex);
	snprintf(out, len, "%s/%s.kv", ns_path, hex);
}

/* The whole file at @path, or an errno. */
static int slurp(const char *path, uint8_t **out, uint64_t *len)
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

static int seed_of(const uint8_t key[16])
{
	for (int i = 0; i < n_seeds; i++)
		if (!memcmp(seeds[i].key, key, 16))
			return i;
	return -1;
}

static bool is_root(const uint8_t key[16])
{
	return !memcmp(key, root, 16);
}

/* ---------------------------------------------------------- ctl: build */

enum mem_kind {
	MEM_PEER,    /* our peer object, exactly as created */
	MEM_SYNCOBJ, /* our small object, as peer memory */
	MEM_BAD,     /* something peer_open must refuse, or garbage */
};

/* What was sent, for the checks. */
struct rq {
	uint8_t *b;        /* the bytes */
	size_t len;        /* bytes sent */
	uint16_t op;
	bool malformed;    /* a documented malformation was applied */
	char why[64];      /* which */
	bool ns_ok;        /* names the seeded namespace */
	uint32_t nk;       /* keys the daemon works on (chained or given) */
	int chain_seed;    /* >= 0: keys are that seed's chain, whole */
	enum mem_kind mem;
	bool sync_ours;    /* the sync word is in our sync object */
	bool sync_outside; /* ...named, but the word is not inside it */
	bool precise;      /* build: mostly what succeeds (real keys, our
			    * memory, ranges that fit), to reach deep
			    */
};

static const uint8_t (*rq_keys(const struct rq *q))[16]
{
	return (const void *)(q->b + REQ_HDR);
}

static struct kvfs_ctl_req *rq_hdr(struct rq *q)
{
	return (struct kvfs_ctl_req *)q->b;
}

static void pick_ns(struct rng *r, struct rq *q, bool may_be_empty)
{
	struct kvfs_ctl_req *h = rq_hdr(q);
	unsigned m = below(r, 20);

	memset(h->ns, 0, sizeof(h->ns));
	q->ns_ok = false;
	if (m < 15 || q->precise) {
		snprintf(h->ns, sizeof(h->ns), "%s", ns);
		q->ns_ok = true;
	} else if (m < 16 && may_be_empty) {
		/* "" */
	} else if (m < 17) {
		snprintf(h->ns, sizeof(h->ns), "%s%s", ns, ns);
	} else if (m < 18) {
		memset(h->ns, 'z', sizeof(h->ns) - 1);
	} else {
		for (size_t i = 0; i + 1 < sizeof(h->ns) && chance(r, 90); i++)
			h->ns[i] = (char)(1 + below(r, 255));
		q->ns_ok = !strcmp(h->ns, ns);
	}
}

static void pick_mem(struct rng *r, struct kvfs_ctl_mem *m, struct rq *q)
{
	unsigned k = below(r, 12);

	memset(m, 0, sizeof(*m));
	m->backend = KVFS_CTL_BACKEND_SHM;
	q->mem = MEM_BAD;
	if (q->precise)
		k = 0;
	if (k < 6) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", peer_name);
		m->size = PEER_SIZE;
		q->mem = MEM_PEER;
		if (k == 5) {
			/* a smaller view of the same object */
			m->size = 1 + below(r, PEER_SIZE);
			q->mem = MEM_BAD; /* no data check: may not fit */
		}
	} else if (k == 6) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", sync_name);
		m->size = SYNC_SIZE;
		q->mem = MEM_SYNCOBJ;
	} else if (k == 7) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", peer_name);
		m->size = edge64(r);
	} else if (k == 8) {
		static const char *const names[] = {
			"", "noslash", "/a/b", "/kvfs-fuzz-nonexistent", "/",
			"//", "/..", "/.",
		};
		snprintf(m->shm_name, sizeof(m->shm_name), "%s",
			 names[below(r, sizeof(names) / sizeof(names[0]))]);
		m->size = 4096;
	} else if (k == 9) {
		memset(m->shm_name, 'a', sizeof(m->shm_name));
		m->shm_name[0] = '/';
		m->size = 4096;
	} else if (k == 10) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", peer_name);
		m->size = PEER_SIZE;
		m->backend = chance(r, 50) ? below(r, 4) : (uint32_t)rnd(r);
		m->device = chance(r, 50) ? 0 : (uint32_t)rnd(r);
		if (m->backend == KVFS_CTL_BACKEND_SHM && !m->device)
			q->mem = MEM_PEER;
	} else {
		fill(r, m, sizeof(*m));
	}
}

static void pick_sync(struct rng *r, struct kvfs_ctl_sync *s, struct rq *q,
		      bool may_be_empty)
{
	static const uint64_t offs[] = {
		0, 4, 8, SYNC_SIZE - 8, SYNC_SIZE - 4, SYNC_SIZE - 3,
		SYNC_SIZE - 2, SYNC_SIZE, SYNC_SIZE + 4, 1ull << 32,
		1ull << 62, UINT64_MAX - 7, UINT64_MAX - 3, UINT64_MAX,
		UINT64_MAX - 4095,
	};
	unsigned k = below(r, 10);

	memset(s, 0, sizeof(*s));
	q->sync_ours = false;
	q->sync_outside = false;
	if (q->precise)
		k = chance(r, 30) ? 0 : 1;
	if (k == 0 && may_be_empty)
		return;
	if (k < 7) {
		snprintf(s->shm_name, sizeof(s->shm_name), "%s", sync_name);
		s->off = chance(r, q->precise ? 80 : 60)
				 ? 4ull * below(r, SYNC_SIZE / 4)
				       : offs[below(r, sizeof(offs) /
							 sizeof(offs[0]))];
		q->sync_ours = s->off <= SYNC_SIZE - 4 && !(s->off & 3);
		q->sync_outside = !q->sync_ours;
	} else if (k == 7) {
		snprintf(s->shm_name, sizeof(s->shm_name), "%s",
			 chance(r, 50) ? "nosuch" : "/kvfs-fuzz-nosuch");
	} else if (k == 8) {
		memset(s->shm_name, 'b', sizeof(s->shm_name));
		s->shm_name[0] = '/';
	} else {
		fill(r, s, sizeof(*s));
	}
}

/* Keys for a request; *@chain_seed says whether they are one seed's whole
 * chain, in order. @protect: no seeded key (the request may delete).
 */
static uint32_t pick_keys(struct rng *r, uint8_t (*k)[16], uint32_t cap,
			  int *chain_seed, bool protect, bool precise)
{
	unsigned m = precise ? below(r, 3) : below(r, 10);
	uint32_t n;

	*chain_seed = -1;
	if (protect || !n_seeds)
		m = 5 + below(r, 5);
	if (m < 5) {
		int s = (int)below(r, (uint32_t)n_seeds);
		uint32_t len = (uint32_t)seeds[s].chain_len;

		n = m < 3 ? len : 1 + below(r, len + 2);
		if (n > cap)
			n = cap;
		for (uint32_t i = 0; i < n; i++) {
			if (i < len)
				memcpy(k[i], seeds[seeds[s].chain[i]].key, 16);
			else
				fill(r, k[i], 16);
		}
		if (n == len) {
			/* the chain of its last block */
			*chain_seed = seeds[s].chain[len - 1];
		}
		if (m == 4 && n > 1) {
			/* with a duplicate */
			uint32_t to = below(r, n), from = below(r, n);

			memcpy(k[to], k[from], 16);
			*chain_seed = -1;
		}
		return n;
	}
	if (m < 8) {
		n = below(r, 9);
	} else if (m == 8) {
		n = chance(r, 50) ? IOC_MAX_BLOCKS + below(r, 3) - 1
				  : 100 + below(r, 400);
	} else {
		n = below(r, 4);
		if (n > cap)
			n = cap;
		memset(k, chance(r, 50) ? 0 : 0xff, (size_t)n * 16);
		return n;
	}
	if (n > cap)
		n = cap;
	fill(r, k, (size_t)n * 16);
	if (!protect && n_seeds && n && chance(r, 30)) {
		uint32_t at = below(r, n);

		memcpy(k[at], seeds[below(r, (uint32_t)n_seeds)].key, 16);
	}
	return n;
}

/* Token ids: a seed chain's (whole blocks, maybe plus a partial), random,
 * or the largest count a request can carry.
 */
static uint32_t pick_tokens(struct rng *r, uint32_t *t, uint32_t cap,
			    int *chain_seed, bool protect, bool precise)
{
	unsigned m = precise ? below(r, 4) : below(r, 10);
	uint32_t n;

	*chain_seed = -1;
	if (protect || !n_seeds)
		m = 4 + below(r, 6);
	if (m < 4) {
		int s = (int)below(r, (uint32_t)n_seeds);
		uint32_t len = (uint32_t)seeds[s].chain_len, bt = g.block_tokens;

		n = len * bt + (m == 3 ? below(r, bt) : 0);
		if (n > cap)
			n = cap;
		for (uint32_t i = 0; i < n; i++)
			t[i] = i / bt < len ? seeds[seeds[s].chain[i / bt]]
						      .tok[i % bt]
					    : (uint32_t)rnd(r);
		if (n / bt == len)
			*chain_seed = seeds[s].chain[len - 1];
		return n;
	}
	if (m < 9) {
		n = below(r, 5 * g.block_tokens);
	} else {
		/* the whole 1 MiB, or near it */
		n = (KVFS_CTL_MAX_SIZE - REQ_HDR) / 4 - below(r, 2);
	}
	if (n > cap)
		n = cap;
	for (uint32_t i = 0; i < n; i++)
		t[i] = (uint32_t)rnd(r);
	return n;
}

/* @n distinct values below @all (n <= all), in random order. */
static void pick_distinct(struct rng *r, uint32_t *out, uint32_t n,
			  uint32_t all)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v = below(r, all);

		for (uint32_t j = 0; j < i; j++)
			if (out[j] == v) {
				v = (v + 1) % all;
				j = (uint32_t)-1; /* from the start */
			}
		out[i] = v;
	}
}

static bool is_chunk_op(uint16_t op)
{
	return op == KVFS_CTL_FETCH_CHUNKS || op == KVFS_CTL_SCORES;
}

/*
 * A well-formed request of @op (every rule of check_req()'s contract in
 * meta/kvfs_ctl.h holds), with fields drawn from real keys, our shm objects
 * and boundary values. @cap bounds its size.
 */
static void build_req(struct rng *r, struct rq *q, uint16_t op, size_t cap)
{
	struct kvfs_ctl_req *h = rq_hdr(q);
	uint32_t maxk = (uint32_t)((cap - REQ_HDR) / 24);
	uint32_t maxt = (uint32_t)((cap - REQ_HDR) / 4);
	uint8_t (*keys)[16] = (void *)(q->b + REQ_HDR);
	int cs = -1;
	bool protect;

	memset(h, 0, sizeof(*h));
	q->malformed = false;
	q->why[0] = 0;
	q->op = op;
	q->nk = 0;
	q->chain_seed = -1;
	q->mem = MEM_BAD;
	q->sync_ours = false;
	q->sync_outside = false;
	h->magic = KVFS_CTL_MAGIC;
	h->abi = KVFS_CTL_ABI;
	h->op = op;
	pick_ns(r, q, op == KVFS_CTL_STATS || op == KVFS_CTL_RELEASE);
	/* EVICT from the SSD (tier 2) or everywhere (3) deletes: never a
	 * seeded block.
	 */
	if (op == KVFS_CTL_EVICT || op == KVFS_CTL_PIN ||
	    op == KVFS_CTL_UNPIN || op == KVFS_CTL_PREFETCH)
		h->tier = below(r, 4);
	protect = op == KVFS_CTL_EVICT && h->tier >= 2;

	switch (op) {
	case KVFS_CTL_FETCH_INTO:
	case KVFS_CTL_FETCH_CHUNKS:
	case KVFS_CTL_SCORES:
		h->n_keys = pick_keys(r, keys, maxk, &cs, protect, q->precise);
		if (op != KVFS_CTL_FETCH_INTO && !h->n_keys) {
			memcpy(keys[0], n_seeds ? seeds[0].key : root, 16);
			h->n_keys = 1;
			cs = n_seeds && seeds[0].chain_len == 1 ? 0 : -1;
		}
		break;
	case KVFS_CTL_STATS:
		/* keys or tokens mean nothing to STATS, but are allowed */
		if (chance(r, 70))
			break;
		__attribute__((fallthrough));
	default:
		if (chance(r, q->precise ? 20 : 35)) {
			h->flags |= KVFS_CTL_F_TOKENS;
			h->n_tokens = pick_tokens(r, (uint32_t *)keys, maxt,
						  &cs, protect, q->precise);
		} else {
			h->n_keys = pick_keys(r, keys, maxk, &cs, protect,
					      q->precise);
		}
		break;
	}
	if (op == KVFS_CTL_SAVE) {
		/* SAVE reads its token ids from n_tokens, without F_TOKENS */
		if (chance(r, 80) || q->precise) {
			h->flags &= ~(uint32_t)KVFS_CTL_F_TOKENS;
			h->n_keys = 0;
			h->n_tokens = chance(r, 80) || q->precise
					      ? 1 + below(r, g.block_tokens)
						    : below(r, 3 * g.block_tokens);
			for (uint32_t i = 0; i < h->n_tokens; i++)
				((uint32_t *)keys)[i] = (uint32_t)rnd(r);
		}
		if (chance(r, 50) || !n_seeds) {
			memcpy(h->parent, root, 16);
			h->start_pos = chance(r, 85) || q->precise ? 0 : edge64(r);
		} else if (chance(r, 70)) {
			const struct seedblk *s =
				&seeds[below(r, (uint32_t)n_seeds)];

			memcpy(h->parent, s->key, 16);
			h->start_pos = chance(r, 80) || q->precise
					       ? s->h.start_pos + g.block_tokens
					       : edge64(r);
		} else {
			fill(r, h->parent, 16);
			h->start_pos = chance(r, 50) ? g.block_tokens *
							       (1 + below(r, 9))
						     : edge64(r);
		}
		pick_mem(r, &h->peer, q);
		h->src_off = chance(r, 60) || q->precise ? 4096ull * below(r, 16)
							 : edge64(r);
	}
	if (op == KVFS_CTL_LOOKUP && chance(r, 30))
		h->flags |= KVFS_CTL_F_ACCESS;
	q->nk = h->flags & KVFS_CTL_F_TOKENS ? h->n_tokens / g.block_tokens
					     : h->n_keys;
	q->chain_seed = cs;
	if (h->flags & KVFS_CTL_F_TOKENS && (cs < 0 ||
	    h->n_tokens % g.block_tokens))
		q->chain_seed = -1;

	uint8_t *p = q->b + REQ_HDR + (size_t)h->n_keys * 16 +
		     (size_t)h->n_tokens * 4;

	if (op == KVFS_CTL_FETCH_INTO) {
		struct kvfs_ctl_dst *d = (void *)p;
		uint64_t plen = seeds ? seeds[0].len -
					kvfs_fmt_payload_off(g.block_tokens)
				      : 0;

		h->n_dst = h->n_keys;
		for (uint32_t i = 0; i < h->n_dst; i++)
			d[i].off = chance(r, 85) || q->precise ? plen * i
						 : (chance(r, 50) ? edge64(r) :
						    PEER_SIZE - plen +
							    below(r, 3) - 1);
		pick_mem(r, &h->peer, q);
		pick_sync(r, &h->sync, q, false);
		p += (size_t)h->n_dst * 8;
	}
	if (op == KVFS_CTL_FETCH_CHUNKS) {
		struct kvfs_ctl_dst *d = (void *)p;
		uint32_t per = (g.block_tokens + g.chunk_tokens - 1) /
			       g.chunk_tokens;

		if (chance(r, 30))
			h->flags |= KVFS_CTL_F_POOL;
		if (chance(r, 30))
			h->flags |= KVFS_CTL_F_SPECULATE;
		h->n_dst = h->flags & KVFS_CTL_F_POOL ? 0 : 1;
		if (h->n_dst) {
			d[0].off = chance(r, 80) || q->precise
					   ? 4096ull * below(r, 8)
					   : edge64(r);
			p += 8;
		}
		if (!(h->flags & KVFS_CTL_F_POOL) || chance(r, 10))
			pick_mem(r, &h->peer, q);
		pick_sync(r, &h->sync, q, true);
		if (chance(r, 80) || q->precise) {
			h->layer_first = below(r, g.n_layers);
			h->n_layers = 1 + below(r, g.n_layers - h->layer_first);
		} else {
			h->layer_first = chance(r, 50) ? below(r, g.n_layers + 2)
						       : edge32(r);
			h->n_layers = chance(r, 50) ? 1 + below(r, g.n_layers + 2)
						    : edge32(r);
			if (!h->n_layers)
				h->n_layers = 1;
		}
		h->sub_period = chance(r, 50) ? 0 : below(r, g.n_layers + 2);
		h->n_chunks = 1 + below(r, chance(r, 90) ? 8 : 64);
		if (q->precise) {
			/* distinct chunks of the prefix */
			uint32_t all = per * h->n_keys;

			if (h->n_chunks > all)
				h->n_chunks = all;
			pick_distinct(r, (uint32_t *)p, h->n_chunks, all);
		} else {
			for (uint32_t k = 0; k < h->n_chunks; k++)
				((uint32_t *)p)[k] =
					chance(r, 85)
						? below(r, per * (h->n_keys + 1))
						: edge32(r);
		}
		p += (size_t)h->n_chunks * 4;
	}
	if (op == KVFS_CTL_SCORES) {
		uint32_t per = (g.block_tokens + g.chunk_tokens - 1) /
			       g.chunk_tokens;
		static const float special[] = {
			0.0f, -0.0f, -1.0f, 1e-30f, 1e30f, INFINITY, -INFINITY,
			NAN, 3.5f,
		};

		h->n_chunks = h->n_scores = 1 + below(r, 16);
		if (q->precise) {
			uint32_t all = per * h->n_keys;

			if (h->n_chunks > all)
				h->n_chunks = h->n_scores = all;
			pick_distinct(r, (uint32_t *)p, h->n_chunks, all);
		} else {
			for (uint32_t k = 0; k < h->n_chunks; k++)
				((uint32_t *)p)[k] =
					chance(r, 85)
						? below(r, per * h->n_keys + 1)
						: edge32(r);
		}
		p += (size_t)h->n_chunks * 4;
		for (uint32_t k = 0; k < h->n_scores; k++) {
			unsigned sp = sizeof(special) / sizeof(special[0]);
			float f = chance(r, 70) || q->precise
					  ? (float)below(r, 1000) / 100.0f
					  : special[below(r, sp)];

			memcpy(p + 4 * k, &f, 4);
		}
		p += (size_t)h->n_scores * 4;
	}
	q->len = (size_t)(p - q->b);
	h->size = (uint32_t)q->len;
}

static void malform(struct rq *q, const char *why)
{
	q->malformed = true;
	snprintf(q->why, sizeof(q->why), "%s", why);
}

/* A mutation that check_req() or kvfs_ctl_exec() must refuse (the
 * header's list: magic, ABI, size, op, counts, reserved bytes; and its
 * other rules). The size field keeps matching the bytes unless that is the
 * point.
 */
static void mutate_bad(struct rng *r, struct rq *q, size_t cap)
{
	struct kvfs_ctl_req *h = rq_hdr(q);

	switch (below(r, 15)) {
	case 0:
		do
			h->magic = (uint32_t)rnd(r);
		while (h->magic == KVFS_CTL_MAGIC);
		malform(q, "magic");
		break;
	case 1:
		h->abi = chance(r, 50) ? 0 : (uint16_t)(2 + below(r, 65534));
		malform(q, "abi");
		break;
	case 2:
		h->size = (uint32_t)q->len + (chance(r, 50) ? 1 + below(r, 64)
							    : -1 - below(r, 64));
		malform(q, "size field");
		break;
	case 3:
		memset(h->ns, chance(r, 50) ? 'x' : 0xff, sizeof(h->ns));
		malform(q, "ns not terminated");
		break;
	case 4:
		/* bits 0..4 are KVFS_CTL_F_* */
		h->flags |= 1u << (5 + below(r, 27));
		malform(q, "unknown flag");
		break;
	case 5:
		h->reserved[below(r, sizeof(h->reserved))] =
			(uint8_t)(1 + below(r, 255));
		malform(q, "reserved byte");
		break;
	case 6: {
		/* a count that no longer matches the size */
		uint32_t *c[] = { &h->n_keys, &h->n_tokens, &h->n_dst,
				  &h->n_chunks, &h->n_scores };
		uint32_t *f = c[below(r, 5)];

		*f = chance(r, 50) ? *f + 1 + below(r, 4) : edge32(r);
		if (h->n_keys * 16ull + h->n_tokens * 4ull + h->n_dst * 8ull +
			    h->n_chunks * 4ull + h->n_scores * 4ull + REQ_HDR ==
		    q->len)
			*f += 1;
		malform(q, "count");
		break;
	}
	case 7:
		/* shorter than the header; the size field says so */
		q->len = 1 + below(r, REQ_HDR - 1);
		if (q->len >= offsetof(struct kvfs_ctl_req, size) + 4)
			h->size = (uint32_t)q->len;
		malform(q, "short");
		break;
	case 8:
		h->tier = 4 + (chance(r, 50) ? below(r, 8) : (uint32_t)rnd(r) / 2);
		malform(q, "tier");
		break;
	case 9:
		if (!is_chunk_op(h->op)) {
			switch (below(r, 3)) {
			case 0: h->layer_first = 1 + below(r, 8); break;
			case 1: h->n_layers = 1 + below(r, 8); break;
			default: h->sub_period = 1 + below(r, 8); break;
			}
			malform(q, "chunk field on another op");
		} else {
			h->flags |= KVFS_CTL_F_ACCESS;
			h->n_chunks = 0;
			h->n_scores = 0;
			h->layer_first = h->n_layers = 0;
			/* counts no longer match */
			h->size = (uint32_t)q->len;
			if (h->n_keys * 16ull + h->n_tokens * 4ull +
				    h->n_dst * 8ull + REQ_HDR == q->len)
				h->n_keys++;
			malform(q, "chunk op without chunks");
		}
		break;
	case 10:
		if (h->op != KVFS_CTL_FETCH_CHUNKS)
			h->flags |= chance(r, 50) ? KVFS_CTL_F_POOL
						  : KVFS_CTL_F_SPECULATE;
		else
			h->flags |= KVFS_CTL_F_TOKENS; /* with keys */
		malform(q, "flag on the wrong op");
		break;
	case 11: {
		/* keys and F_TOKENS together (sizes consistent) */
		if (q->len + 16 > cap) {
			h->abi = 0;
			malform(q, "abi");
			break;
		}
		memmove(q->b + REQ_HDR + 16, q->b + REQ_HDR, q->len - REQ_HDR);
		memset(q->b + REQ_HDR, 0x5a, 16);
		h->n_keys++;
		h->flags |= KVFS_CTL_F_TOKENS;
		q->len += 16;
		h->size = (uint32_t)q->len;
		/* FETCH_INTO: now also a destination short */
		malform(q, "keys with F_TOKENS");
		break;
	}
	case 12:
		/* too many of something, size consistent where it can be */
		h->n_keys = KVFS_CTL_MAX_BLOCKS + 1 + below(r, 4);
		malform(q, "too many keys");
		break;
	case 13:
		h->op = chance(r, 50) ? 0 : (uint16_t)(KVFS_CTL_OP_MAX + 1 +
						       below(r, 65535 -
							     KVFS_CTL_OP_MAX));
		malform(q, "unknown op");
		break;
	default:
		/* garbage with a wrong magic */
		fill(r, q->b, q->len);
		if (h->magic == KVFS_CTL_MAGIC)
			h->magic++;
		malform(q, "garbage");
		break;
	}
}

/* A mutation that keeps the request well-formed: random bytes where the
 * format does not constrain them.
 */
static void mutate_ok(struct rng *r, struct rq *q)
{
	struct kvfs_ctl_req *h = rq_hdr(q);
	size_t arr = q->len > REQ_HDR ? q->len - REQ_HDR : 0;

	switch (below(r, 6)) {
	case 0:
		if (arr && !(h->op == KVFS_CTL_EVICT && h->tier >= 2 &&
			     n_seeds)) {
			size_t n = 1 + below(r, 8);

			for (size_t i = 0; i < n; i++)
				q->b[REQ_HDR + below(r, (uint32_t)arr)] ^=
					(uint8_t)(1u << below(r, 8));
			/* the keys may now be anything: no chain */
			q->chain_seed = -1;
		}
		break;
	case 1:
		fill(r, &h->peer, sizeof(h->peer));
		q->mem = MEM_BAD;
		break;
	case 2:
		fill(r, &h->sync, sizeof(h->sync));
		q->sync_ours = false;
		q->sync_outside = false;
		break;
	case 3:
		h->src_off = edge64(r);
		h->start_pos = edge64(r);
		break;
	case 4:
		fill(r, h->parent, 16);
		break;
	default:
		if (is_chunk_op(h->op)) {
			h->layer_first = edge32(r);
			h->n_layers = edge32(r) | 1;
			h->sub_period = edge32(r);
		}
		break;
	}
	if (h->op == KVFS_CTL_EVICT && h->tier >= 2) {
		for (uint32_t i = 0; i < h->n_keys; i++)
			if (seed_of(rq_keys(q)[i]) >= 0)
				h->tier = 1;
		if (h->flags & KVFS_CTL_F_TOKENS)
			h->tier = 1;
	}
}

/* ---------------------------------------------------------- ctl: send */

static uint8_t *iobuf;   /* 16 KiB: ioctl argument */
static uint8_t *rbuf;    /* a response read back */
#define RBUF_SIZE (KVFS_CTL_MAX_SIZE + 8192)

static bool big_for_ioctl(const struct rq *q)
{
	const struct kvfs_ctl_req *h = (const void *)q->b;

	return !q->malformed && q->ns_ok &&
	       (q->op == KVFS_CTL_LOOKUP || q->op == KVFS_CTL_FETCH ||
		q->op == KVFS_CTL_FETCH_INTO) &&
	       !(h->flags & KVFS_CTL_F_TOKENS) && q->nk > IOC_MAX_BLOCKS;
}

static const int resp_errs[] = {
	0, -ENOENT, -EINVAL, -ENOSPC, -EBUSY, -ENODEV, -E2BIG, -EFAULT,
	-EIO, -EAGAIN, -EBADMSG, -EEXIST, -ENOMEM, -ENAMETOOLONG, -EACCES,
	-EFBIG, -ERANGE, -EMFILE, -ENFILE, -EOVERFLOW,
};

static void pool_read(const struct kvfs_ctl_mem *pool, uint64_t off,
		      void *dst, uint64_t len)
{
	char name[KVFS_CTL_NAME_MAX + 1];
	void *m;
	int fd;

	memcpy(name, pool->shm_name, KVFS_CTL_NAME_MAX);
	name[KVFS_CTL_NAME_MAX] = 0;
	if (pool->backend != KVFS_CTL_BACKEND_SHM || off > pool->size ||
	    len > pool->size - off)
		fz_fail("pool %s: [%" PRIu64 ", +%" PRIu64 ") outside %" PRIu64
			" bytes", name, off, len, pool->size);
	fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		fz_fail("pool %s: %s", name, strerror(errno));
	m = mmap(NULL, (size_t)pool->size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		fz_fail("pool %s: mmap: %s", name, strerror(errno));
	memcpy(dst, (uint8_t *)m + off, (size_t)len);
	munmap(m, (size_t)pool->size);
}

static const uint8_t *seed_payload(int s, uint64_t *plen)
{
	uint64_t off = kvfs_fmt_payload_off(seeds[s].h.n_tokens);

	*plen = seeds[s].len - off;
	return seeds[s].img + off;
}

/* Blocks SAVE made, unlinked by the caller once checked. */
static void unlink_saved(const uint8_t key[16])
{
	char path[4300];
	int e;

	key_path(path, sizeof(path), key);
	op_begin("unlink %s", path);
	e = err_of(unlink(path));
	op_end();
	want(e, OKS(0), "unlink of a block SAVE made");
}

/* What a well-formed request's response must be, beyond its form. */
static void check_data(const struct rq *q, const struct kvfs_ctl_resp *rs,
		       const struct kvfs_ctl_block *blk)
{
	const struct kvfs_ctl_req *h = (const void *)q->b;
	uint64_t plen;

	if (q->chain_seed >= 0 && q->ns_ok && q->op == KVFS_CTL_LOOKUP) {
		/* Every seeded block is cached somewhere, always. */
		if (rs->error || rs->n_cached != q->nk)
			fz_fail("LOOKUP of a seeded chain of %u: error %d, "
				"%u cached", q->nk, rs->error, rs->n_cached);
	}
	/* The word must lie in the object (meta/kvfs_ctl.h): a copy that
	 * goes ahead signals it, wherever the offset points.
	 */
	if (q->sync_outside && !rs->error &&
	    (q->op == KVFS_CTL_FETCH_INTO || q->op == KVFS_CTL_FETCH_CHUNKS))
		fz_fail("op %u succeeded with its sync word at %#" PRIx64
			", outside the %u-byte object", q->op, h->sync.off,
			SYNC_SIZE);
	if (rs->error)
		return;
	if (q->op == KVFS_CTL_FETCH && rs->n_blocks) {
		for (uint32_t i = 0; i < rs->n_blocks; i++) {
			int s = seed_of(blk[i].key);
			const uint8_t *want_p;
			uint8_t *got;

			if (s < 0)
				continue;
			want_p = seed_payload(s, &plen);
			if (blk[i].len != plen)
				fz_fail("FETCH: block %u len %" PRIu64
					", stored %" PRIu64, i, blk[i].len,
					plen);
			got = malloc(plen);
			assert_non_null(got);
			pool_read(&rs->pool, blk[i].pool_off, got, plen);
			if (memcmp(got, want_p, plen)) {
				free(got);
				fz_fail("FETCH: block %u's bytes in the pool "
					"differ from the stored ones", i);
			}
			free(got);
		}
	}
	if (q->op == KVFS_CTL_FETCH_INTO && q->mem == MEM_PEER) {
		const struct kvfs_ctl_dst *d =
			(const void *)(q->b + REQ_HDR + 16 * (size_t)h->n_keys);

		if (rs->n_blocks != h->n_keys)
			fz_fail("FETCH_INTO: %u blocks for %u keys",
				rs->n_blocks, h->n_keys);
		for (uint32_t i = 0; i < h->n_keys; i++) {
			int s = seed_of(rq_keys(q)[i]);
			const uint8_t *want_p;

			if (s < 0)
				continue;
			want_p = seed_payload(s, &plen);
			if (d[i].off > PEER_SIZE || plen > PEER_SIZE - d[i].off)
				fz_fail("FETCH_INTO succeeded with a "
					"destination outside the peer");
			/* Overlapping destinations are copied layer by
			 * layer: what ends up there is a mix. Not checked.
			 */
			bool overlap = false;

			for (uint32_t j = 0; j < h->n_keys; j++)
				if (j != i && d[j].off < d[i].off + plen &&
				    d[i].off < d[j].off + plen)
					overlap = true;
			if (!overlap &&
			    memcmp(peer_mem + d[i].off, want_p, plen)) {
				uint64_t at = 0;

				while (peer_mem[d[i].off + at] == want_p[at])
					at++;
				fz_fail("FETCH_INTO: key %u's bytes at %" PRIu64
					" differ from the stored ones from "
					"byte %" PRIu64 " of %" PRIu64, i,
					d[i].off, at, plen);
			}
		}
		if (q->sync_ours) {
			uint32_t w;

			memcpy(&w, sync_mem + h->sync.off, 4);
			if (w != g.n_layers)
				fz_fail("FETCH_INTO: sync word %u, want %u", w,
					g.n_layers);
		}
	}
	if (q->op == KVFS_CTL_FETCH_CHUNKS) {
		const uint32_t *ch = (const void *)(q->b + REQ_HDR +
						    16 * (size_t)h->n_keys +
						    8 * (size_t)h->n_dst);
		const struct kvfs_ctl_dst *d =
			(const void *)(q->b + REQ_HDR + 16 * (size_t)h->n_keys);
		bool pool = h->flags & KVFS_CTL_F_POOL;
		uint32_t per = (g.block_tokens + g.chunk_tokens - 1) /
			       g.chunk_tokens;
		uint64_t lo, cb, base, total;
		uint8_t *region = NULL;

		if (pool && rs->n_blocks != 1)
			fz_fail("FETCH_CHUNKS to the pool: %u blocks",
				rs->n_blocks);
		if (!pool && q->mem != MEM_PEER)
			return;
		for (uint32_t i = 0; i < h->n_keys; i++) {
			int s = seed_of(rq_keys(q)[i]);

			if (s < 0 || seeds[s].h.n_tokens != g.block_tokens)
				return; /* only seeded full blocks are known */
		}
		kvfs_fmt_chunk_range(&g, g.block_tokens, 0, 0, &lo, &cb);
		total = (uint64_t)h->n_layers * h->n_chunks * cb;
		if (pool) {
			if (blk[0].len != total)
				fz_fail("FETCH_CHUNKS: region of %" PRIu64
					" bytes, want %" PRIu64, blk[0].len,
					total);
			region = malloc(total);
			assert_non_null(region);
			pool_read(&rs->pool, blk[0].pool_off, region, total);
			base = 0;
		} else {
			base = d[0].off;
			if (base > PEER_SIZE || total > PEER_SIZE - base)
				fz_fail("FETCH_CHUNKS succeeded past the peer");
		}
		for (uint32_t l = 0; l < h->n_layers; l++)
			for (uint32_t k = 0; k < h->n_chunks; k++) {
				uint32_t j = ch[k], bi = j / per;
				uint64_t off, len;
				const uint8_t *got;
				int s;

				if (bi >= h->n_keys ||
				    h->layer_first + l >= g.n_layers) {
					free(region);
					fz_fail("FETCH_CHUNKS succeeded for "
						"chunk %u of layer %u, past "
						"the prefix", j,
						h->layer_first + l);
				}
				s = seed_of(rq_keys(q)[bi]);
				kvfs_fmt_chunk_range(&g, g.block_tokens,
						     h->layer_first + l,
						     j % per, &off, &len);
				got = (pool ? region : peer_mem + base) +
				      ((uint64_t)l * h->n_chunks + k) * cb;
				if (memcmp(got, seeds[s].img + off, len)) {
					free(region);
					fz_fail("FETCH_CHUNKS: layer %u chunk "
						"%u differs from the stored "
						"bytes", h->layer_first + l,
						j);
				}
			}
		free(region);
		if (q->sync_ours) {
			uint32_t w;

			memcpy(&w, sync_mem + h->sync.off, 4);
			if (w != h->n_layers)
				fz_fail("FETCH_CHUNKS: sync word %#x, want %u",
					w, h->n_layers);
		}
	}
	if (q->op == KVFS_CTL_SAVE) {
		char path[4300];
		uint8_t *img = NULL;
		uint64_t len = 0, off;
		struct kvfs_fmt_hdr hd;
		enum kvfs_fmt_err e;
		const uint8_t *src = q->mem == MEM_PEER ? peer_mem :
				     q->mem == MEM_SYNCOBJ ? sync_mem : NULL;
		int rc;

		key_path(path, sizeof(path), rs->key);
		rc = slurp(path, &img, &len);
		if (rc)
			fz_fail("SAVE reported success, but %s: %s", path,
				ename(rc));
		e = kvfs_fmt_validate(img, len, &g, rs->key, root, 0, &hd);
		if (e != KVFS_FMT_OK) {
			free(img);
			fz_fail("SAVE made %s, which does not validate: %s",
				path, kvfs_fmt_strerror(e));
		}
		off = kvfs_fmt_payload_off(hd.n_tokens);
		if (hd.n_tokens != h->n_tokens ||
		    memcmp(hd.parent, h->parent, 16) ||
		    hd.start_pos != h->start_pos ||
		    memcmp(img + KVFS_FMT_HDR_SIZE, rq_keys(q),
			   4ull * h->n_tokens)) {
			free(img);
			fz_fail("SAVE made %s with other tokens, parent or "
				"position than asked", path);
		}
		uint64_t osize = q->mem == MEM_PEER ? PEER_SIZE : SYNC_SIZE;

		if (src && (h->src_off > osize ||
			    len - off > osize - h->src_off)) {
			free(img);
			fz_fail("SAVE succeeded from outside the caller's "
				"memory (offset %" PRIu64 ")", h->src_off);
		}
		/* The payload is the caller's bytes, but rows past the last
		 * token are zeroed by the format: compare whole chunks only.
		 */
		if (src && h->n_tokens == g.block_tokens &&
		    memcmp(img + off, src + h->src_off, len - off)) {
			free(img);
			fz_fail("SAVE made %s from other bytes than the "
				"caller's", path);
		}
		free(img);
		unlink_saved(rs->key);
	}
}

/* The form of any response; then the data checks. */
static void check_resp(const struct rq *q, const uint8_t *buf, size_t got,
		       const char *tr)
{
	struct kvfs_ctl_resp rs;
	const struct kvfs_ctl_block *blk =
		(const void *)(buf + sizeof(struct kvfs_ctl_resp));
	const struct kvfs_ctl_req *h = (const void *)q->b;
	bool ok = false;

	if (got < sizeof(rs))
		fz_fail("%s op %u: a response of %zu bytes", tr, q->op, got);
	memcpy(&rs, buf, sizeof(rs));
	if (rs.magic != KVFS_CTL_MAGIC || rs.abi != KVFS_CTL_ABI ||
	    rs.op != q->op)
		fz_fail("%s op %u: response magic %#x abi %u op %u", tr, q->op,
			rs.magic, rs.abi, rs.op);
	if (rs.size != RESP_HDR + (uint64_t)rs.n_blocks * BLK_SIZE ||
	    rs.size > got)
		fz_fail("%s op %u: response size %u for %u blocks, %zu bytes "
			"came", tr, q->op, rs.size, rs.n_blocks, got);
	for (size_t i = 0; i < sizeof(resp_errs) / sizeof(resp_errs[0]); i++)
		if (rs.error == resp_errs[i])
			ok = true;
	if (!ok)
		fz_fail("%s op %u: response error %d", tr, q->op, rs.error);
	if (q->op <= KVFS_CTL_OP_MAX) {
		COUNT(resp[q->op]);
		if (!rs.error)
			COUNT(resp_ok[q->op]);
	}
	for (size_t i = 0; i < sizeof(rs.reserved); i++)
		if (rs.reserved[i])
			fz_fail("%s op %u: reserved response bytes set", tr,
				q->op);
	switch (q->op) {
	case KVFS_CTL_LOOKUP:
		if (!rs.error && rs.n_blocks != q->nk)
			fz_fail("LOOKUP of %u keys: %u blocks", q->nk,
				rs.n_blocks);
		if (rs.n_cached > rs.n_blocks)
			fz_fail("LOOKUP: %u cached of %u", rs.n_cached,
				rs.n_blocks);
		if (!rs.error && !(h->flags & KVFS_CTL_F_TOKENS))
			for (uint32_t i = 0; i < rs.n_blocks; i++)
				if (memcmp(blk[i].key, rq_keys(q)[i], 16))
					fz_fail("LOOKUP: block %u is not "
						"the key asked for", i);
		break;
	case KVFS_CTL_FETCH:
	case KVFS_CTL_FETCH_INTO:
		if (rs.n_blocks > q->nk)
			fz_fail("op %u: %u blocks for %u keys", q->op,
				rs.n_blocks, q->nk);
		break;
	case KVFS_CTL_FETCH_CHUNKS:
		if (rs.n_blocks > 1)
			fz_fail("FETCH_CHUNKS: %u blocks", rs.n_blocks);
		break;
	default:
		if (rs.n_blocks)
			fz_fail("op %u: %u blocks", q->op, rs.n_blocks);
		break;
	}
	check_data(q, &rs, blk);
}

/* ioctl with @cmd; @expect_valid_cmd: the command is KVFS_IOC(q->op). */
static void send_ioctl(int fd, const struct rq *q, unsigned long cmd,
		       struct rng *r)
{
	bool valid = false;
	size_t n = q->len < KVFS_CTL_MSG_SIZE ? q->len : KVFS_CTL_MSG_SIZE;
	int e;

	for (unsigned op = 1; op <= KVFS_CTL_OP_MAX; op++)
		if (cmd == KVFS_IOC(op))
			valid = true;
	/* Past the request: anything. */
	fill(r, iobuf, 16384);
	memcpy(iobuf, q->b, n);
	op_begin("ioctl %#lx op %u len %zu%s%s", cmd, q->op, q->len,
		 q->malformed ? " malformed: " : "", q->why);
	e = err_of(ioctl(fd, cmd, iobuf));
	op_end();
	if (!valid) {
		want(e, OKS(ENOTTY), "ioctl with a foreign command");
		return;
	}
	if (q->malformed || cmd != KVFS_IOC(q->op) ||
	    q->len > KVFS_CTL_MSG_SIZE) {
		want(e, OKS(EINVAL), "malformed ioctl request");
		return;
	}
	if (big_for_ioctl(q))
		want(e, OKS(E2BIG), "ioctl with a response too big for it");
	else
		want(e, OKS(0, ENOMEM), "well-formed ioctl request");
	if (!e)
		check_resp(q, iobuf, KVFS_CTL_MSG_SIZE, "ioctl");
}

/* The response pending on a descriptor (write-then-read). */
struct pend {
	bool any;   /* a response may be pending */
	bool sure;  /* ...and surely is */
	uint16_t op;
	struct rq q;  /* its request, for the checks */
};

static void send_write_done(const struct rq *q, struct pend *pd);

static void send_write(int fd, const struct rq *q, struct pend *pd)
{
	ssize_t n;
	int e;

	op_begin("write op %u len %zu%s%s", q->op, q->len,
		 q->malformed ? " malformed: " : "", q->why);
	n = write(fd, q->b, q->len);
	e = err_of(n);
	op_end();
	if (q->len > KVFS_CTL_MAX_SIZE) {
		/* Whatever it holds: the first FUSE write of it (all of it,
		 * or its first 1 MiB) is over the limit and refused whole.
		 */
		want(e, OKS(EMSGSIZE), "a write over KVFS_CTL_MAX_SIZE");
		pd->sure = false;
		return;
	}
	if (q->malformed) {
		want(e, OKS(EINVAL), "malformed request written");
		/* An earlier response may still be there, or not. */
		pd->sure = false;
		return;
	}
	want(e, OKS(0, ENOMEM), "well-formed request written");
	if (e)
		return;
	if ((size_t)n != q->len)
		fz_fail("write of %zu request bytes returned %zd", q->len, n);
	send_write_done(q, pd);
}

/* A request was taken whole: its response is pending. */
static void send_write_done(const struct rq *q, struct pend *pd)
{
	pd->any = pd->sure = true;
	pd->op = q->op;
	memcpy(pd->q.b, q->b, q->len);
	pd->q.len = q->len;
	pd->q.op = q->op;
	pd->q.malformed = false;
	pd->q.ns_ok = q->ns_ok;
	pd->q.nk = q->nk;
	pd->q.chain_seed = q->chain_seed;
	pd->q.mem = q->mem;
	pd->q.sync_ours = q->sync_ours;
	pd->q.sync_outside = q->sync_outside;
}

static void do_read(int fd, struct rng *r, struct pend *pd)
{
	static const size_t lens[] = {
		0, 1, RESP_HDR - 1, RESP_HDR, RESP_HDR + BLK_SIZE,
		4096, KVFS_CTL_MSG_SIZE, KVFS_CTL_MAX_SIZE,
	};
	size_t len = lens[below(r, sizeof(lens) / sizeof(lens[0]))];
	ssize_t n;
	int e;

	op_begin("read %zu", len);
	n = read(fd, rbuf, len);
	e = err_of(n);
	op_end();
	if (len == 0) {
		want(e, OKS(0), "read of 0 bytes");
		return;
	}
	if (!pd->any) {
		want(e, OKS(0), "read with no request written");
		if (n != 0)
			fz_fail("read with no request written returned %zd",
				n);
		return;
	}
	if (len < RESP_HDR) {
		/* Too small for any response: refused, kept. */
		if (pd->sure)
			want(e, OKS(EMSGSIZE), "read smaller than a response");
		else
			want(e, OKS(0, EMSGSIZE), "read smaller than a response");
		return;
	}
	want(e, len >= KVFS_CTL_MAX_SIZE ? OKS(0) : OKS(0, EMSGSIZE),
	     "read of a response");
	if (e)
		return;
	if (n == 0) {
		if (pd->sure)
			fz_fail("read %zu: nothing, but a response was due",
				len);
		pd->any = false;
		return;
	}
	check_resp(&pd->q, rbuf, (size_t)n, "write/read");
	if ((size_t)n != ((struct kvfs_ctl_resp *)rbuf)->size)
		fz_fail("read returned %zd bytes of a %u-byte response", n,
			((struct kvfs_ctl_resp *)rbuf)->size);
	pd->any = pd->sure = false;
}

static int ctl_open(void)
{
	int fd, e;

	op_begin("open %s", ctl_path);
	fd = open(ctl_path, O_RDWR | O_CLOEXEC);
	e = err_of(fd);
	op_end();
	want(e, OKS(0), "open .kvfs/ctl");
	return fd;
}

static void ctl_close(int fd)
{
	int e;

	op_begin("close ctl fd %d", fd);
	e = err_of(close(fd));
	op_end();
	want(e, OKS(0), "close .kvfs/ctl");
}

/*
 * SAVE requests whose response was never read (write-then-read, threads)
 * leave blocks nobody checked: each must be a valid block, and goes.
 * Nothing else in these targets creates one.
 */
static void ctl_sweep(void)
{
	char path[4700];
	struct dirent *de;
	DIR *d;
	int e;

	op_begin("readdir %s", ns_path);
	d = opendir(ns_path);
	e = err_of(d ? 0 : -1);
	op_end();
	want(e, OKS(0), "opendir the namespace");
	while ((de = readdir(d))) {
		uint8_t k[16], *img = NULL;
		uint64_t len = 0;
		enum kvfs_fmt_err fe;
		int rc;

		if (kvfs_fmt_name_parse(de->d_name, k) || seed_of(k) >= 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", ns_path, de->d_name);
		rc = slurp(path, &img, &len);
		if (rc) {
			closedir(d);
			fz_fail("a block SAVE made (%s): %s", path, ename(rc));
		}
		fe = kvfs_fmt_validate(img, len, &g, k, root, 0, NULL);
		free(img);
		if (fe != KVFS_FMT_OK) {
			closedir(d);
			fz_fail("a block SAVE made (%s) does not validate: %s",
				path, kvfs_fmt_strerror(fe));
		}
		op_begin("unlink %s", path);
		e = err_of(unlink(path));
		op_end();
		want(e, OKS(0), "unlink a block SAVE made");
	}
	closedir(d);
}

/* Leave no pin, lease or saved block behind for the next target. */
static void ctl_cleanup(void)
{
	struct kvfs_ctl_msg m;
	int fd = ctl_open(), e;

	memset(&m, 0, sizeof(m));
	m.req.magic = KVFS_CTL_MAGIC;
	m.req.abi = KVFS_CTL_ABI;
	m.req.op = KVFS_CTL_UNPIN;
	snprintf(m.req.ns, sizeof(m.req.ns), "%s", ns);
	for (int i = 0; i < n_seeds; i++)
		memcpy(m.bytes + REQ_HDR + 16 * i, seeds[i].key, 16);
	m.req.n_keys = (uint32_t)n_seeds;
	m.req.size = REQ_HDR + 16 * (uint32_t)n_seeds;
	op_begin("ioctl UNPIN of the seeds");
	e = err_of(ioctl(fd, KVFS_IOC_UNPIN, &m));
	op_end();
	want(e, OKS(0), "UNPIN of the seeds");
	if (m.resp.error)
		fz_fail("UNPIN of the seeds: %d", m.resp.error);
	ctl_close(fd);
	ctl_sweep();
}

/* ---------------------------------------------------------- iterations */

/* One generator per (target, iteration): each replays alone. */
static struct rng rng_for(unsigned target, long iter)
{
	struct rng r = { mix64(seed ^ mix64(target + 1) ^
			       mix64(0x51ed270b27ull * (uint64_t)(iter + 1))) };

	return r;
}

static long iters(long base)
{
	long n = (long)((double)base * scale);

	return n < 1 ? 1 : n;
}

#define FOR_ITER(var, base)                                                 \
	for (long var = only_iter >= 0 ? only_iter : 0,                      \
		  var##_end = only_iter >= 0 ? only_iter + 1 : iters(base);   \
	     (cur_iter = var) < var##_end; var++)

static void begin_target(const char *name)
{
	cur_target = name;
	cur_iter = -1;
	memset(&tally, 0, sizeof(tally));
	if (daemon_dead)
		fail_msg("the daemon died earlier: nothing to fuzz");
	check_alive();
}

static void end_iteration(long it)
{
	COUNT(iters);
	check_alive();
	if (it % 200 == 199)
		seeds_check("during fuzzing");
}

static void end_target(void)
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

static uint16_t pick_op(struct rng *r)
{
	return (uint16_t)(1 + below(r, KVFS_CTL_OP_MAX));
}

/*
 * Work buffers live from setup to teardown: a failed check leaves its
 * target by longjmp, and must not leave a leak behind for LeakSanitizer
 * to report on top of the failure.
 */
static struct rq wq, wpend;            /* a request; a pending one's copy */
static char *xv, *xgot;                /* xattr values */
static uint8_t *bimg, *bmodel, *nsbuf; /* block images, reads */

static struct rq new_rq(void)
{
	struct rq q;

	memset(&q, 0, sizeof(q));
	/* Page-aligned: the kernel splits a direct write whose buffer spans
	 * more pages than one FUSE request carries (see send_write()).
	 */
	q.b = aligned_alloc(4096, KVFS_CTL_MAX_SIZE + 8192);
	assert_non_null(q.b);
	memset(q.b, 0, KVFS_CTL_MAX_SIZE + 8192);
	return q;
}

/* -- target: ioctl transport, command numbers and contents */
static void test_ctl_ioctl(void **state)
{
	struct rq q = wq;

	begin_target("ctl_ioctl");
	FOR_ITER(it, 4500) {
		struct rng r = rng_for(1, it);
		int fd = ctl_open();
		unsigned calls = 1 + below(&r, 6);

		for (unsigned c = 0; c < calls; c++) {
			uint16_t op = pick_op(&r);
			unsigned long cmd = KVFS_IOC(op);

			build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
			if (chance(&r, 55))
				mutate_bad(&r, &q, KVFS_CTL_MSG_SIZE);
			else if (chance(&r, 50))
				mutate_ok(&r, &q);
			if (chance(&r, 25)) {
				static const unsigned char types[] = {
					'K', 'K', 'K', 'k', 'Z', 'q', 0xab,
				};
				static const unsigned sizes[] = {
					0, 4, 8, 384, 8191, KVFS_CTL_MSG_SIZE,
					KVFS_CTL_MSG_SIZE, 8193, 16383,
				};
				unsigned dir = below(&r, 4);
				unsigned nr = chance(&r, 70)
						      ? KVFS_IOC_NR(below(&r, 16))
						      : below(&r, 256);

				cmd = _IOC(dir, types[below(&r, sizeof(types))],
					   nr, sizes[below(&r, sizeof(sizes) /
							     sizeof(sizes[0]))]);
			}
			send_ioctl(fd, &q, cmd, &r);
		}
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -- target: write-then-read transactions, interleaved with ioctls */
static void test_ctl_write_read(void **state)
{
	struct rq q = wq;
	struct pend pd;

	memset(&pd, 0, sizeof(pd));
	pd.q = wpend;
	begin_target("ctl_write_read");
	FOR_ITER(it, 3000) {
		struct rng r = rng_for(2, it);
		int fd = ctl_open();
		unsigned steps = 1 + below(&r, 8);

		pd.any = pd.sure = false;
		for (unsigned s = 0; s < steps; s++) {
			unsigned k = below(&r, 10);
			uint16_t op = pick_op(&r);

			if (k < 4) {
				size_t cap = chance(&r, 90) ? 16384
							    : KVFS_CTL_MAX_SIZE;

				build_req(&r, &q, op, cap);
				if (chance(&r, 40))
					mutate_bad(&r, &q, cap);
				else if (chance(&r, 40))
					mutate_ok(&r, &q);
				if (!q.malformed && chance(&r, 8)) {
					/* the request cut short, or with a
					 * tail: its size field is then wrong
					 */
					if (chance(&r, 50) && q.len > 1) {
						q.len = REQ_HDR / 2 +
							below(&r, (uint32_t)q.len -
								  REQ_HDR / 2);
						malform(&q, "truncated");
					} else {
						size_t add = chance(&r, 50)
							? 1 + below(&r, 64)
							: KVFS_CTL_MAX_SIZE + 1 -
								  q.len;

						fill(&r, q.b + q.len, add);
						q.len += add;
						malform(&q, "trailing bytes");
					}
				}
				send_write(fd, &q, &pd);
			} else if (k < 8) {
				do_read(fd, &r, &pd);
			} else if (k < 9) {
				build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
				if (chance(&r, 40))
					mutate_bad(&r, &q, KVFS_CTL_MSG_SIZE);
				send_ioctl(fd, &q, KVFS_IOC(op), &r);
			} else {
				/* a descriptor that cannot seek or sync */
				int e;

				op_begin("lseek/pread/fsync/fstat on ctl");
				e = err_of(lseek(fd, (off_t)below(&r, 4096),
						 SEEK_SET));
				op_end();
				want(e, OKS(ESPIPE), "lseek on .kvfs/ctl");
				op_begin("pread on ctl");
				e = err_of(pread(fd, rbuf, 4096, 4096));
				op_end();
				want(e, OKS(ESPIPE), "pread on .kvfs/ctl");
				op_begin("fsync on ctl");
				e = err_of(fsync(fd));
				op_end();
				want(e, OKS(0, ENOSYS, EINVAL),
				     "fsync on .kvfs/ctl");
				struct stat st;

				op_begin("fstat on ctl");
				e = err_of(fstat(fd, &st));
				op_end();
				want(e, OKS(0), "fstat on .kvfs/ctl");
			}
		}
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -- target: well-formed requests on real blocks and memory */
static void test_ctl_semantic(void **state)
{
	struct rq q = wq;
	struct pend pd;

	memset(&pd, 0, sizeof(pd));
	pd.q = wpend;
	begin_target("ctl_semantic");
	FOR_ITER(it, 2100) {
		struct rng r = rng_for(3, it);
		int fd = ctl_open();
		unsigned calls = 1 + below(&r, 4);

		fill(&r, peer_mem, 64 * 1024);
		for (unsigned c = 0; c < calls; c++) {
			uint16_t op = pick_op(&r);

			if (chance(&r, 30))
				op = KVFS_CTL_FETCH_CHUNKS;
			else if (chance(&r, 20))
				op = KVFS_CTL_FETCH_INTO;
			q.precise = chance(&r, 60);
			build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
			if (chance(&r, 15))
				mutate_ok(&r, &q);
			if (chance(&r, 70)) {
				send_ioctl(fd, &q, KVFS_IOC(op), &r);
			} else {
				pd.any = pd.sure = false;
				send_write(fd, &q, &pd);
				memset(rbuf, 0, RESP_HDR);
				op_begin("read the response");
				ssize_t n = read(fd, rbuf, KVFS_CTL_MAX_SIZE);
				int e = err_of(n);

				op_end();
				want(e, OKS(0), "read of a response");
				if (pd.any && n <= 0)
					fz_fail("no response after a "
						"well-formed write");
				if (pd.any)
					check_resp(&pd.q, rbuf, (size_t)n,
						   "write/read");
			}
		}
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -- target: two threads on one descriptor */
struct worker {
	int fd;
	long it;
	int id;
	struct rq q;
	uint8_t *buf; /* 16 KiB */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct rng r = rng_for(40 + (unsigned)w->id, w->it);
	struct rq q = w->q;
	uint8_t *buf = w->buf;

	in_worker = true;
	slot = 1 + w->id;
	for (unsigned s = 0; s < 12; s++) {
		uint16_t op = pick_op(&r);
		ssize_t n;
		int e;

		build_req(&r, &q, op, KVFS_CTL_MSG_SIZE);
		if (chance(&r, 40))
			mutate_bad(&r, &q, KVFS_CTL_MSG_SIZE);
		switch (below(&r, 3)) {
		case 0:
			memset(buf, 0, 16384);
			memcpy(buf, q.b, q.len);
			op_begin("thread ioctl op %u", op);
			e = err_of(ioctl(w->fd, KVFS_IOC(op), buf));
			op_end();
			want(e, OKS(0, EINVAL, E2BIG, ENOMEM),
			     "ioctl from two threads");
			break;
		case 1:
			op_begin("thread write op %u", op);
			e = err_of(write(w->fd, q.b, q.len));
			op_end();
			want(e, OKS(0, EINVAL, ENOMEM), "write from two threads");
			break;
		default:
			op_begin("thread read");
			n = read(w->fd, buf, chance(&r, 50) ? 16384 : 100);
			e = err_of(n);
			op_end();
			want(e, OKS(0, EMSGSIZE), "read from two threads");
			if (n > 0 && ((struct kvfs_ctl_resp *)buf)->magic !=
					     KVFS_CTL_MAGIC)
				fz_fail("a read from two threads: no response");
			break;
		}
	}
	return NULL;
}

static struct rq wk_q[2];
static uint8_t *wk_buf[2];

static void test_ctl_threads(void **state)
{
	begin_target("ctl_threads");
	FOR_ITER(it, 450) {
		struct worker w[2];
		pthread_t t[2];
		int fd = ctl_open();

		for (int i = 0; i < 2; i++) {
			w[i] = (struct worker){ fd, it, i, wk_q[i], wk_buf[i] };
			assert_int_equal(pthread_create(&t[i], NULL,
							worker_main, &w[i]),
					 0);
		}
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		if (worker_fail[0])
			fz_fail("%s", worker_fail);
		ctl_close(fd);
		end_iteration(it);
	}
	ctl_cleanup();
	end_target();
}

/* -------------------------------------------------------------- xattrs */

static const char *const block_names[] = {
	"tier", "tokens", "parent", "hits", "last_access", "depth",
	"durable", "category", "leases", "pin", "stored_as", "stored_bytes",
};
static const char *const ns_names[] = { "root", "geometry", "blocks" };

enum node {
	N_SEED, N_SCRATCH, N_NS, N_ROOT, N_CTLDIR, N_CTL, N_STATS, N_PENDING,
	N_COUNT,
};

/* A block of ours to pin, categorise and unlink freely. */
static uint8_t scratch_key[16];

static int write_block(const char *path, const uint8_t *img, uint64_t len)
{
	int fd, e;

	op_begin("create %s", path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	e = err_of(fd);
	op_end();
	if (e)
		return e;
	op_begin("write %" PRIu64 " bytes", len);
	e = err_of(write(fd, img, len));
	op_end();
	op_begin("close %s", path);
	if (close(fd) && !e)
		e = errno;
	op_end();
	return e;
}

static void make_block(struct rng *r, uint8_t *img, uint64_t *len,
		       uint32_t n, const uint8_t parent[16], uint64_t start)
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

static void scratch_make(struct rng *r)
{
	uint8_t *img = malloc(max_file);
	uint64_t len;
	char path[4300];

	assert_non_null(img);
	make_block(r, img, &len, g.block_tokens, root, 0);
	memcpy(scratch_key, img + 64, 16);
	key_path(path, sizeof(path), scratch_key);
	want(write_block(path, img, len), OKS(0), "write the scratch block");
	free(img);
}

static void scratch_drop(void)
{
	char path[4300];
	int e;

	key_path(path, sizeof(path), scratch_key);
	op_begin("removexattr pin %s", path);
	e = err_of(removexattr(path, "user.kvfs.pin"));
	op_end();
	want(e, OKS(0, ENODATA), "unpin the scratch block");
	op_begin("unlink %s", path);
	e = err_of(unlink(path));
	op_end();
	want(e, OKS(0), "unlink the scratch block");
}

static void rand_name(struct rng *r, char *out, size_t cap)
{
	unsigned k = below(r, 12);

	if (k < 4) {
		snprintf(out, cap, "user.kvfs.%s",
			 block_names[below(r, sizeof(block_names) /
						      sizeof(block_names[0]))]);
	} else if (k < 6) {
		snprintf(out, cap, "user.kvfs.%s",
			 ns_names[below(r, 3)]);
	} else if (k == 6) {
		static const char *const odd[] = {
			"user.kvfs.", "user.kvfs.PIN", "user.kvfs.pin ",
			"user.kvfs.pinx", "user.kvfs.tier.x", "user.kvfs",
			"user.other", "trusted.kvfs.pin", "security.kvfs",
			"user.kvfs..pin", "user.kvfs.category\n",
		};
		snprintf(out, cap, "%s", odd[below(r, sizeof(odd) /
						      sizeof(odd[0]))]);
	} else if (k == 7) {
		/* the longest the kernel passes, and one more */
		size_t n = 254 + below(r, 4);

		if (n >= cap)
			n = cap - 1;
		memcpy(out, "user.kvfs.", 10);
		memset(out + 10, 'a', n - 10);
		out[n] = 0;
	} else {
		size_t n = 1 + below(r, 40);

		memcpy(out, "user.", 5);
		for (size_t i = 5; i < n + 5 && i + 1 < cap; i++)
			out[i] = (char)(1 + below(r, 255));
		out[n + 5 < cap ? n + 5 : cap - 1] = 0;
	}
}

struct word {
	const char *v;
	size_t n; /* bytes, embedded NULs included */
};

#define W(lit) { lit, sizeof(lit) - 1 }

static size_t rand_value(struct rng *r, char *v, size_t cap)
{
	static const struct word words[] = {
		W("gpu"), W("dram"), W("ssd"), W("gpu\n"), W("dram\0"),
		W("ssd\n\0"), W("GPU"), W("dram "), W(" ssd"), W("nvme"),
		W("0"), W("1"), W("65535"), W("65536"), W("-1"),
		W("4294967296"), W("99999999999999999999"), W("7\n"), W("7\0"),
		W("0x10"), W("1e3"), W(""), W("5\nabc"), W("dram\ngpu"),
		W("12\0junk"), W("ssd\0\0\n"),
		/* longer than the daemon's value buffer */
		W("0000000000000000000000000000000000000000000000000000000000000"
		  "00042"),
		W("ssdddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
		  "dd"),
	};
	unsigned k = below(r, 10);
	size_t n;

	if (k < 6) {
		const struct word *w = &words[below(r, sizeof(words) /
						       sizeof(words[0]))];

		memcpy(v, w->v, w->n);
		return w->n;
	}
	if (k < 8) {
		n = below(r, 80);
		fill(r, v, n);
		return n;
	}
	if (k == 8)
		return 0;
	n = chance(r, 50) ? 65536 : 65537;
	if (n > cap)
		n = cap;
	memset(v, '7', n);
	return n;
}

/* The value as the daemon must read it: the bytes up to trailing NULs
 * and newlines, none of which may appear before them.
 */
static bool value_word(const char *v, size_t n, char *out, size_t cap)
{
	while (n && (v[n - 1] == '\0' || v[n - 1] == '\n'))
		n--;
	if (n >= cap || memchr(v, '\0', n) || memchr(v, '\n', n))
		return false;
	memcpy(out, v, n);
	out[n] = 0;
	return true;
}

static bool parse_u32(const char *s, uint32_t *out)
{
	return kvfs_util_parse_u32(s, out) == 0;
}

static void node_path(enum node nd, int si, char *p, size_t cap)
{
	switch (nd) {
	case N_SEED:
		key_path(p, cap, seeds[si].key);
		break;
	case N_SCRATCH:
		key_path(p, cap, scratch_key);
		break;
	case N_NS:
		snprintf(p, cap, "%s", ns_path);
		break;
	case N_ROOT:
		snprintf(p, cap, "%s", mnt);
		break;
	case N_CTLDIR:
		snprintf(p, cap, "%s/.kvfs", mnt);
		break;
	case N_CTL:
		snprintf(p, cap, "%s", ctl_path);
		break;
	case N_STATS:
		snprintf(p, cap, "%s", stats_path);
		break;
	default:
		snprintf(p, cap, "(pending)");
		break;
	}
}

static bool known_block_name(const char *name)
{
	if (strncmp(name, "user.kvfs.", 10))
		return false;
	for (size_t i = 0; i < sizeof(block_names) / sizeof(block_names[0]); i++)
		if (!strcmp(name + 10, block_names[i]))
			return true;
	return false;
}

static bool known_ns_name(const char *name)
{
	if (strncmp(name, "user.kvfs.", 10))
		return false;
	for (size_t i = 0; i < 3; i++)
		if (!strcmp(name + 10, ns_names[i]))
			return true;
	return false;
}

/* The kernel's own refusals of a name or value, before the daemon. */
static bool kernel_refuses(const char *name, size_t vlen, int *err)
{
	if (strlen(name) > 255) {
		*err = ERANGE;
		return true;
	}
	if (vlen > 65536) {
		*err = E2BIG;
		return true;
	}
	return false;
}

/* One xattr call's target, and what this iteration did to it. */
struct xnode {
	enum node nd;
	int si;          /* N_SEED: which */
	char path[4300];
	int fd;          /* N_PENDING: the writer's descriptor */
	uint32_t *category; /* the scratch block's, UINT32_MAX: not set */
	bool *pinned;       /* the scratch block pinned */
};

static bool is_block(const struct xnode *x)
{
	return x->nd == N_SEED || x->nd == N_SCRATCH;
}

static bool is_tier_word(const char *w)
{
	return !strcmp(w, "gpu") || !strcmp(w, "dram") || !strcmp(w, "ssd");
}

static void xattr_set(struct rng *r, const struct xnode *x, const char *name)
{
	char word[64];
	size_t vlen = rand_value(r, xv, 65540);
	bool wok = value_word(xv, vlen, word, sizeof(word));
	uint32_t cat;
	int e, kerr;

	op_begin("setxattr %s %s (%zu bytes)", x->path, name, vlen);
	if (x->nd == N_PENDING)
		e = err_of(fsetxattr(x->fd, name, xv, vlen, 0));
	else
		e = err_of(setxattr(x->path, name, xv, vlen,
				    chance(r, 20) ? XATTR_CREATE : 0));
	op_end();
	if (kernel_refuses(name, vlen, &kerr)) {
		want(e, OKS(kerr), "setxattr past the kernel's limits");
	} else if (is_block(x) && !strcmp(name, "user.kvfs.pin")) {
		want(e, wok && is_tier_word(word) ? OKS(0, ENOSPC, EBUSY)
						  : OKS(EINVAL),
		     "setxattr pin");
		if (!e && x->nd == N_SCRATCH)
			*x->pinned = true;
	} else if (is_block(x) && !strcmp(name, "user.kvfs.category")) {
		bool t = wok && parse_u32(word, &cat) && cat <= 0xffff;

		want(e, t ? OKS(0) : OKS(EINVAL), "setxattr category");
		if (!e && x->nd == N_SCRATCH)
			*x->category = cat;
	} else if (is_block(x) && known_block_name(name)) {
		want(e, OKS(EPERM), "setxattr of a read-only name");
	} else if (x->nd == N_NS && known_ns_name(name)) {
		want(e, OKS(EPERM), "setxattr of a namespace's name");
	} else if ((is_block(x) || x->nd == N_NS) &&
		   !strncmp(name, "user.", 5)) {
		want(e, OKS(ENOTSUP), "setxattr of an unknown name");
	} else if (x->nd == N_PENDING) {
		want(e, OKS(ENOTSUP, EPERM, ENOENT, EACCES),
		     "setxattr on a block being written");
	} else {
		/* control inodes; other namespaces than user.* */
		want(e, OKS(ENOTSUP, EPERM, EACCES), "setxattr");
	}
}

/* A value the seeds or the scratch block must have. */
static void xattr_value_check(const struct xnode *x, const char *name,
			      const char *v, ssize_t n)
{
	char want_s[40] = "";

	if (x->nd == N_SEED && !strcmp(name, "user.kvfs.tokens"))
		snprintf(want_s, sizeof(want_s), "%u",
			 seeds[x->si].h.n_tokens);
	else if (x->nd == N_SEED && !strcmp(name, "user.kvfs.parent"))
		kvfs_fmt_key_hex(seeds[x->si].h.parent, want_s);
	else if (x->nd == N_SEED && !strcmp(name, "user.kvfs.depth"))
		snprintf(want_s, sizeof(want_s), "%" PRIu64,
			 seeds[x->si].h.start_pos / g.block_tokens);
	else if (x->nd == N_SCRATCH && !strcmp(name, "user.kvfs.category") &&
		 *x->category != UINT32_MAX)
		snprintf(want_s, sizeof(want_s), "%u", *x->category);
	else if (x->nd == N_NS && !strcmp(name, "user.kvfs.root"))
		kvfs_fmt_key_hex(root, want_s);
	else if (x->nd == N_SCRATCH && !strcmp(name, "user.kvfs.pin") &&
		 !*x->pinned)
		fz_fail("getxattr pin: '%.*s' on an unpinned block", (int)n,
			v);
	if (want_s[0] && ((size_t)n != strlen(want_s) ||
			  memcmp(v, want_s, (size_t)n)))
		fz_fail("getxattr %s of %s: '%.*s', want '%s'", name, x->path,
			(int)n, v, want_s);
}

static void xattr_get(struct rng *r, const struct xnode *x, const char *name)
{
	/* a size query, a buffer too small for most values, or room */
	size_t cap = !below(r, 3) ? 0 : chance(r, 50) ? 1 + below(r, 8)
						       : 65536;
	bool pin = is_block(x) && !strcmp(name, "user.kvfs.pin");
	bool has = (is_block(x) && known_block_name(name) && !pin) ||
		   (x->nd == N_NS && known_ns_name(name));
	ssize_t n;
	int e;

	op_begin("getxattr %s %s size %zu", x->path, name, cap);
	n = x->nd == N_PENDING ? fgetxattr(x->fd, name, xgot, cap)
			       : getxattr(x->path, name, xgot, cap);
	e = err_of(n);
	op_end();
	if (strlen(name) > 255)
		want(e, OKS(ERANGE), "getxattr of a too-long name");
	else if (has && cap == 0)
		want(e, OKS(0), "getxattr size query");
	else if (has && cap < 9)
		want(e, OKS(0, ERANGE), "getxattr into a small buffer");
	else if (has)
		want(e, OKS(0), "getxattr");
	else if (pin)
		want(e, OKS(0, ENODATA, ERANGE), "getxattr pin");
	else if (!strncmp(name, "user.", 5))
		want(e, OKS(ENODATA), "getxattr of an absent name");
	else
		want(e, OKS(ENODATA, ENOTSUP, EPERM, EACCES),
		     "getxattr outside user.*");
	if (has && !e && n <= 0)
		fz_fail("getxattr %s of %s: an empty value", name, x->path);
	if (!e && cap >= 9 && n > 0)
		xattr_value_check(x, name, xgot, n);
}

static void xattr_list(struct rng *r, const struct xnode *x)
{
	size_t cap = chance(r, 30) ? 0 : chance(r, 30) ? 1 + below(r, 16)
						       : 65536;
	const char *must = x->nd == N_NS ? "user.kvfs.root" :
			   is_block(x)	 ? "user.kvfs.tokens" :
					   NULL;
	bool found = false;
	ssize_t n;
	int e;

	op_begin("listxattr %s size %zu", x->path, cap);
	n = x->nd == N_PENDING ? flistxattr(x->fd, xgot, cap)
			       : listxattr(x->path, xgot, cap);
	e = err_of(n);
	op_end();
	want(e, OKS(0, ERANGE), "listxattr");
	if (e || cap != 65536)
		return;
	if (!must) {
		/* a control inode, or the block being written: none */
		if (n)
			fz_fail("listxattr %s: %zd bytes of names", x->path,
				n);
		return;
	}
	if (n <= 0 || xgot[n - 1])
		fz_fail("listxattr %s: not a list of names", x->path);
	for (ssize_t o = 0; o < n; o += (ssize_t)strlen(xgot + o) + 1)
		if (!strcmp(xgot + o, must))
			found = true;
	if (!found)
		fz_fail("listxattr %s lacks %s", x->path, must);
}

static void xattr_remove(const struct xnode *x, const char *name)
{
	int e;

	op_begin("removexattr %s %s", x->path, name);
	e = x->nd == N_PENDING ? err_of(fremovexattr(x->fd, name))
			       : err_of(removexattr(x->path, name));
	op_end();
	if (strlen(name) > 255) {
		want(e, OKS(ERANGE), "removexattr of a too-long name");
	} else if (is_block(x) && !strcmp(name, "user.kvfs.pin")) {
		want(e, OKS(0, ENODATA), "removexattr pin");
		if (x->nd == N_SCRATCH && *x->pinned && e)
			fz_fail("removexattr pin of a pinned block: %s",
				ename(e));
		if (x->nd == N_SCRATCH)
			*x->pinned = false;
	} else if (is_block(x) && known_block_name(name)) {
		want(e, OKS(EPERM), "removexattr of a read-only name");
	} else if (x->nd == N_NS) {
		want(e, OKS(EPERM, ENOTSUP, EACCES),
		     "removexattr on a namespace");
	} else if (!strncmp(name, "user.", 5)) {
		want(e, OKS(ENODATA), "removexattr of an absent name");
	} else {
		want(e, OKS(ENODATA, ENOTSUP, EPERM, EACCES),
		     "removexattr outside user.*");
	}
}

static void test_xattr(void **state)
{
	char name[300], path[4300];

	begin_target("xattr");
	FOR_ITER(it, 1800) {
		struct rng r = rng_for(5, it);
		uint32_t category = UINT32_MAX;
		bool pinned = false;
		int pfd = -1, e;

		scratch_make(&r);
		if (chance(&r, 30)) {
			/* a block being written: only its writer sees it */
			uint8_t k[16];

			fill(&r, k, 16);
			key_path(path, sizeof(path), k);
			op_begin("create %s", path);
			pfd = open(path, O_WRONLY | O_CREAT | O_EXCL |
						 O_CLOEXEC, 0644);
			e = err_of(pfd);
			op_end();
			want(e, OKS(0), "create a pending block");
		}
		for (unsigned s = 0, n = 4 + below(&r, 8); s < n; s++) {
			struct xnode x = {
				.fd = pfd,
				.category = &category,
				.pinned = &pinned,
			};
			unsigned what;

			/* one draw per statement: the order is the seed's */
			x.nd = (enum node)below(&r, N_COUNT);
			x.si = (int)below(&r, (uint32_t)n_seeds);
			what = below(&r, 10);

			if ((x.nd == N_SEED && !n_seeds) ||
			    (x.nd == N_PENDING && pfd < 0))
				x.nd = N_SCRATCH;
			node_path(x.nd, x.si, x.path, sizeof(x.path));
			rand_name(&r, name, sizeof(name));
			if (what < 4)
				xattr_set(&r, &x, name);
			else if (what < 7)
				xattr_get(&r, &x, name);
			else if (what < 9)
				xattr_list(&r, &x);
			else
				xattr_remove(&x, name);
		}
		if (pfd >= 0) {
			op_begin("close the pending block");
			e = err_of(close(pfd));
			op_end();
			want(e, OKS(EINVAL), "close of an empty block");
		}
		for (int i = 0; i < n_seeds; i++) {
			key_path(path, sizeof(path), seeds[i].key);
			op_begin("removexattr pin %s", path);
			e = err_of(removexattr(path, "user.kvfs.pin"));
			op_end();
			want(e, OKS(0, ENODATA), "unpin a seed");
		}
		scratch_drop();
		end_iteration(it);
	}
	end_target();
}

/* ---------------------------------------------------------- block files */

/* The blocks in the namespace besides the seeds (none, between
 * iterations: every accepted block is unlinked).
 */
static void listing_check(void)
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

static void fix_crcs(uint8_t *p, uint64_t len, bool payload)
{
	if (len < KVFS_FMT_HDR_SIZE)
		return;
	if (payload)
		kvfs_util_put32(p + 80, kvfs_fmt_crc32c(0, p + KVFS_FMT_HDR_SIZE,
							len - KVFS_FMT_HDR_SIZE));
	kvfs_util_put32(p + 84, kvfs_fmt_crc32c(0, p, 84));
}

/* A block name, odd or not, for @key. Sets *@len_err when the kernel
 * itself refuses it (too long).
 */
static void pick_name(struct rng *r, const uint8_t key[16], char *name,
		      size_t cap, bool *bad, bool *too_long)
{
	char hex[33];
	unsigned k = below(r, 20);

	kvfs_fmt_key_hex(key, hex);
	*bad = true;
	*too_long = false;
	if (k < 12) {
		snprintf(name, cap, "%s.kv", hex);
		*bad = false;
	} else if (k == 12) {
		for (int i = 0; i < 32; i++)
			hex[i] = (char)(hex[i] >= 'a' ? hex[i] - 32 : hex[i]);
		snprintf(name, cap, "%s.kv", hex);
		*bad = false; /* either case parses */
	} else if (k == 13) {
		snprintf(name, cap, "%s", hex);
	} else if (k == 14) {
		static const char *const sfx[] = {
			".KV", ".kvx", ".kv.tmp", ".k", ".", "kv", ".kv ",
		};
		snprintf(name, cap, "%s%s", hex, sfx[below(r, 7)]);
	} else if (k == 15) {
		snprintf(name, cap, "%.31s.kv", hex);
	} else if (k == 16) {
		snprintf(name, cap, "%s0.kv", hex);
	} else if (k == 17) {
		uint32_t at = below(r, 32);

		hex[at] = "gGz -_\n"[below(r, 7)];
		snprintf(name, cap, "%s.kv", hex);
	} else if (k == 18) {
		/* NAME_MAX is advisory: older kernels stop FUSE names at
		 * 1024 bytes, newer ones pass them on
		 */
		size_t n = (chance(r, 50) ? 250 : 1020) + below(r, 10);

		if (n >= cap)
			n = cap - 1;
		memset(name, 'a', n);
		memcpy(name + n - 3, ".kv", 4);
		*too_long = n > 1024;
	} else {
		size_t n = 1 + below(r, 40);

		for (size_t i = 0; i < n; i++) {
			char c = (char)(1 + below(r, 255));

			name[i] = c == '/' ? 'x' : c;
		}
		name[n] = 0;
		if (!strcmp(name, ".") || !strcmp(name, ".."))
			name[0] = 'y';
	}
}

/* What close() must return for the bytes @img[0..@len) under a name that
 * parses to @name_key.
 */
static int expect_commit(const uint8_t *img, uint64_t len,
			 const uint8_t name_key[16])
{
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err e;
	int s;

	e = kvfs_fmt_validate(img, len, &g, name_key, root, 0, &h);
	if (e != KVFS_FMT_OK)
		return -kvfs_fmt_errno(e);
	if (is_root(h.parent))
		return 0;
	s = seed_of(h.parent);
	if (s < 0)
		return 0; /* an orphan: allowed */
	if (seeds[s].h.n_tokens != g.block_tokens ||
	    seeds[s].h.start_pos + g.block_tokens != h.start_pos)
		return EINVAL;
	return 0;
}

struct model {
	uint8_t *b;   /* max_file + 64 KiB, zero past len */
	uint64_t len;
	bool committed;
	int rc;       /* the commit's result once committed */
};

static void model_write(struct model *m, uint64_t off, const uint8_t *p,
			uint64_t n, int e)
{
	/* an empty write never reaches the daemon */
	if (e || m->committed || !n)
		return;
	memcpy(m->b + off, p, n);
	if (off + n > m->len)
		m->len = off + n;
}

static void model_truncate(struct model *m, uint64_t size, int e)
{
	if (e || m->committed)
		return;
	if (size < m->len)
		memset(m->b + size, 0, m->len - size);
	m->len = size;
}

/* A good block in @img: a kvfs-gen template, or one made here. */
static uint64_t block_base(struct rng *r, uint8_t *img)
{
	uint32_t n = g.block_tokens;
	uint8_t parent[16];
	uint64_t start, len;
	unsigned k;

	if (n_tmpls && chance(r, 30)) {
		const struct tmpl *t = &tmpls[below(r, (uint32_t)n_tmpls)];

		memcpy(img, t->img, t->len);
		return t->len;
	}
	if (chance(r, 50))
		n = 1 + below(r, g.block_tokens);
	k = below(r, 10);
	if (k < 4 || !n_seeds) {
		/* a first block; at 16 it is misplaced */
		memcpy(parent, root, 16);
		start = k == 3 && chance(r, 50) ? g.block_tokens : 0;
	} else if (k < 7) {
		/* a seed's child, placed right or anywhere */
		const struct seedblk *s = &seeds[below(r, (uint32_t)n_seeds)];

		memcpy(parent, s->key, 16);
		start = k == 6 ? edge64(r) : s->h.start_pos + g.block_tokens;
	} else {
		/* an orphan */
		fill(r, parent, 16);
		start = k == 9 ? edge64(r)
			       : (uint64_t)g.block_tokens * (1 + below(r, 1000));
	}
	make_block(r, img, &len, n, parent, start);
	return len;
}

/* Damage @img, or not; @key gets the key to name the file after.
 * Returns the mutation, for the journal.
 */
static unsigned block_mutate(struct rng *r, uint8_t *img, uint64_t *len,
			     uint8_t key[16])
{
	static const uint8_t fields[] = {
		8, 10, 12, 14, 16, 20, 24, 28, 32, 36, 40,
	};
	static const uint64_t cuts[] = {
		0, 1, 87, 88, 4095, 4096, 4097, 8191, 8192,
	};
	unsigned k = below(r, 12);
	uint64_t add;

	memcpy(key, img + 64, 16);
	if (k < 3) {
		/* untouched */
	} else if (k < 5) {
		/* bit flips, the header's more often; CRCs redone or not */
		for (unsigned i = 0, n = 1 + below(r, 8); i < n; i++) {
			uint64_t at = chance(r, 30) ? below(r, 88)
						    : below(r, (uint32_t)*len);

			img[at] ^= (uint8_t)(1u << below(r, 8));
		}
		if (chance(r, 50))
			fix_crcs(img, *len, true);
	} else if (k < 7) {
		/* a header field set to an edge value */
		unsigned at = fields[below(r, sizeof(fields))];

		if (at == 40)
			kvfs_util_put64(img + at, edge64(r));
		else if (at >= 16)
			kvfs_util_put32(img + at, edge32(r));
		else if (chance(r, 50))
			kvfs_util_put16(img + at, (uint16_t)below(r, 5));
		else
			kvfs_util_put16(img + at, (uint16_t)rnd(r));
		if (chance(r, 80))
			fix_crcs(img, *len, false);
	} else if (k < 9) {
		*len = chance(r, 50) ? cuts[below(r, 9)]
				     : below(r, (uint32_t)*len);
	} else if (k < 10) {
		/* longer: zeros or not, maybe past the largest block */
		add = chance(r, 50) ? 1 + below(r, 8)
				    : 4096 * (1 + below(r, 9));
		if (chance(r, 50))
			memset(img + *len, 0, add);
		else
			fill(r, img + *len, add);
		*len += add;
		if (chance(r, 50))
			fix_crcs(img, *len, true);
	} else if (k < 11) {
		/* another key: the name no longer matches */
		fill(r, key, 16);
	} else if (n_seeds) {
		/* a stored block's name */
		memcpy(key, seeds[below(r, (uint32_t)n_seeds)].key, 16);
	}
	return k;
}

/* Commit at a flush (fsync, a dup's close, a child's exit). */
static void model_commit(struct model *m, const uint8_t name_key[16])
{
	if (!m->committed) {
		m->committed = true;
		m->rc = expect_commit(m->b, m->len, name_key);
	}
}

/* One pwrite of @n bytes of @src at @off, checked against the model. */
static void block_pwrite(int fd, struct model *m, const uint8_t *src,
			 uint64_t n, uint64_t off)
{
	ssize_t w;
	int e;

	op_begin("pwrite %" PRIu64 " @ %" PRIu64, n, off);
	w = pwrite(fd, src, n, (off_t)off);
	e = err_of(w);
	op_end();
	if (off > (uint64_t)INT64_MAX - n || off + n > (1ull << 62))
		want(e, OKS(EFBIG, EINVAL), "pwrite at a huge offset");
	else if (m->committed && n)
		want(e, OKS(EPERM), "pwrite after commit");
	else if (off + n > max_file)
		want(e, n ? OKS(EFBIG) : OKS(0, EFBIG),
		     "pwrite past the largest block");
	else
		want(e, OKS(0), "pwrite");
	if (!e && (uint64_t)w != n)
		fz_fail("pwrite of %" PRIu64 " wrote %zd", n, w);
	model_write(m, off, src, n, e);
}

static void block_ftruncate(int fd, struct model *m, uint64_t to)
{
	int e;

	op_begin("ftruncate %" PRIu64, to);
	e = err_of(ftruncate(fd, (off_t)to));
	op_end();
	if (m->committed)
		want(e, OKS(EPERM), "ftruncate after commit");
	else
		want(e, to > max_file ? OKS(EFBIG, EINVAL) : OKS(0),
		     "ftruncate of a block being written");
	model_truncate(m, to, e);
}

/*
 * Write @img[0..@len) through @fd: whole, in order in pieces, or in random
 * overlapping pieces (holes, offsets past the largest block) then maybe the
 * whole over them; with ftruncate, fsync, a dup closed and a child's exit
 * on the way. @m follows what the daemon must hold.
 */
static void block_write(struct rng *r, int fd, const uint8_t *img,
			uint64_t len, struct model *m,
			const uint8_t name_key[16])
{
	unsigned pattern = below(r, 10);
	uint64_t done = 0;
	int e;

	if (pattern == 9 && chance(r, 50))
		block_ftruncate(fd, m, len);
	while (pattern < 6 && done < len) {
		uint64_t n = len - done;

		if (pattern >= 3 && n > 1)
			n = 1 + below(r, (uint32_t)(n < 9000 ? n : 9000));
		block_pwrite(fd, m, img + done, n, done);
		done += n;
		if (pattern == 5 && chance(r, 15) && !m->committed) {
			/* fsync commits what is there */
			op_begin("fsync mid-write");
			e = err_of(fsync(fd));
			op_end();
			model_commit(m, name_key);
			want(e, OKS(m->rc), "fsync of a partial block");
		}
		if (pattern == 4 && chance(r, 15)) {
			/* so does a dup's close */
			int dupfd = dup(fd);

			op_begin("close a dup mid-write");
			e = err_of(close(dupfd));
			op_end();
			model_commit(m, name_key);
			want(e, OKS(m->rc), "close of a dup");
		}
	}
	while (pattern >= 6 && !chance(r, 25)) {
		uint64_t off = below(r, (uint32_t)len + 1);
		uint64_t n = below(r, (uint32_t)(len - off + 1));

		if (chance(r, 10)) {
			off = chance(r, 50) ? max_file - 1 + below(r, 3)
					    : edge64(r) & INT64_MAX;
			n = 1 + below(r, 4096);
		}
		block_pwrite(fd, m, off < len ? img + off : img, n, off);
	}
	if (pattern >= 6 && !m->committed && chance(r, 70)) {
		/* the whole image over whatever is there */
		block_pwrite(fd, m, img, len, 0);
		if (m->len > len && len <= max_file)
			block_ftruncate(fd, m, len);
	}
	if (pattern == 9 && chance(r, 50))
		block_ftruncate(fd, m, chance(r, 50)
					       ? below(r, (uint32_t)len + 1)
					       : edge64(r) & INT64_MAX);
	if (!m->committed && chance(r, 30)) {
		struct stat st;

		op_begin("fstat mid-write");
		e = err_of(fstat(fd, &st));
		op_end();
		want(e, OKS(0), "fstat of a block being written");
		if ((uint64_t)st.st_size != m->len)
			fz_fail("fstat of a block being written: %jd bytes, "
				"%" PRIu64 " written", (intmax_t)st.st_size,
				m->len);
	}
	if (chance(r, 10)) {
		op_begin("read on a write descriptor");
		e = err_of(read(fd, iobuf, 16));
		op_end();
		want(e, OKS(EBADF), "read of a block being written");
	}
	if (chance(r, 5)) {
		/* a writer that exits: its exit flushes for it */
		pid_t pid = fork();
		int status;

		assert_true(pid >= 0);
		if (pid == 0)
			_exit(0);
		op_begin("a child with the descriptor exits");
		waitpid(pid, &status, 0);
		op_end();
		model_commit(m, name_key);
	}
}

/* Accepted: there, byte for byte as written, valid; then removed. Refused:
 * not there.
 */
static void block_outcome(const char *path, const char *name,
			  const struct model *m, const uint8_t name_key[16])
{
	uint8_t *back = NULL;
	uint64_t blen = 0;
	struct stat st;
	int rc, e;

	if (!m->rc) {
		COUNT(accepted);
		rc = slurp(path, &back, &blen);
		if (rc)
			fz_fail("an accepted block (%s): %s", name, ename(rc));
		if (blen != m->len || memcmp(back, m->b, blen)) {
			free(back);
			fz_fail("an accepted block (%s) reads back other "
				"bytes (%" PRIu64 " of %" PRIu64 ")", name,
				blen, m->len);
		}
		if (kvfs_fmt_validate(back, blen, &g, name_key, root, 0,
				      NULL) != KVFS_FMT_OK) {
			free(back);
			fz_fail("an accepted block (%s) does not validate",
				name);
		}
		free(back);
		op_begin("unlink %s", name);
		e = err_of(unlink(path));
		op_end();
		want(e, OKS(0), "unlink an accepted block");
	} else {
		COUNT(refused);
	}
	op_begin("stat %s", name);
	e = err_of(stat(path, &st));
	op_end();
	want(e, OKS(ENOENT), "a refused (or removed) block is absent");
}

static void test_blocks(void **state)
{
	struct model m = { .b = bmodel };
	char path[5400], name[1100];

	begin_target("blocks");
	FOR_ITER(it, 1500) {
		struct rng r = rng_for(6, it);
		uint8_t key[16], name_key[16];
		bool bad_name, too_long;
		uint64_t len = block_base(&r, bimg);
		unsigned k = block_mutate(&r, bimg, &len, key);
		int fd, e, flags = O_CREAT | O_CLOEXEC;

		pick_name(&r, key, name, sizeof(name), &bad_name, &too_long);
		snprintf(path, sizeof(path), "%s/%s", ns_path, name);
		if (!bad_name)
			assert_int_equal(kvfs_fmt_name_parse(name, name_key), 0);
		flags |= chance(&r, 80) ? O_WRONLY : O_RDWR;
		flags |= chance(&r, 60) ? O_EXCL : 0;
		op_begin("create %s flags %#x (%" PRIu64 " bytes, mutation %u)",
			 name, flags, len, k);
		fd = open(path, flags, 0644);
		e = err_of(fd);
		op_end();
		if (too_long) {
			/* the kernel's limit, or the daemon's refusal */
			want(e, OKS(ENAMETOOLONG, EINVAL),
			     "create of a too-long name");
		} else if (bad_name) {
			/* Another name is a temporary (one rename commits it,
			 * test_manners.sh); the daemon keeps names to 255.
			 */
			want(e, strlen(name) > 255 ? OKS(ENAMETOOLONG) : OKS(0),
			     "create of a temporary");
			if (fd >= 0) {
				close(fd);
				want(err_of(unlink(path)), OKS(0),
				     "unlink of a temporary");
			}
		} else if (seed_of(name_key) >= 0) {
			want(e, flags & O_EXCL ? OKS(EEXIST) : OKS(EPERM),
			     "create over a stored block");
		} else {
			want(e, OKS(0), "create");
			memset(m.b, 0, max_file + 65536);
			m.len = 0;
			m.committed = false;
			block_write(&r, fd, bimg, len, &m, name_key);
			model_commit(&m, name_key);
			op_begin("close %s", name);
			e = err_of(close(fd));
			op_end();
			want(e, OKS(m.rc), "close commits the block");
			block_outcome(path, name, &m, name_key);
		}
		end_iteration(it);
		if (it % 50 == 49)
			listing_check();
	}
	listing_check();
	end_target();
}

/* ----------------------------------------------------- namespace ops */

static void test_ns_ops(void **state)
{
	char a[4300], b[4300];
	uint8_t *buf = nsbuf;

	assert_non_null(buf);
	begin_target("ns_ops");
	FOR_ITER(it, 1500) {
		struct rng r = rng_for(7, it);
		int si = n_seeds ? (int)below(&r, (uint32_t)n_seeds) : -1;
		uint8_t rk[16];
		char hex[33];
		int e, fd;

		fill(&r, rk, 16);
		kvfs_fmt_key_hex(rk, hex);
		if (si >= 0)
			key_path(a, sizeof(a), seeds[si].key);
		else
			snprintf(a, sizeof(a), "%s/%s.kv", ns_path, hex);
		switch (below(&r, 22)) {
		case 0:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("rename %s %s", a, b);
			e = err_of(rename(a, b));
			op_end();
			want(e, OKS(EPERM), "rename of a block");
			break;
		case 1:
			snprintf(b, sizeof(b), "%s/%s.kv", mnt, hex);
			op_begin("rename %s %s", a, b);
			e = err_of(renameat2(AT_FDCWD, a, AT_FDCWD, b,
					     chance(&r, 50) ? RENAME_NOREPLACE
							    : 0));
			op_end();
			want(e, OKS(EPERM, EINVAL), "rename out of a namespace");
			break;
		case 2:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("link %s %s", a, b);
			e = err_of(link(a, b));
			op_end();
			want(e, OKS(EPERM), "link of a block");
			break;
		case 3:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("symlink %s", b);
			e = err_of(symlink(a, b));
			op_end();
			want(e, OKS(EPERM), "symlink in a namespace");
			break;
		case 4:
			snprintf(b, sizeof(b), "%s/%s",
				 chance(&r, 50) ? mnt : ns_path, hex);
			op_begin("mkdir %s", b);
			e = err_of(mkdir(b, 0755));
			op_end();
			want(e, OKS(EPERM), "mkdir");
			op_begin("mkdir %s", ns_path);
			e = err_of(mkdir(ns_path, 0755));
			op_end();
			want(e, OKS(EEXIST), "mkdir of an existing namespace");
			break;
		case 5:
			op_begin("rmdir %s", ns_path);
			e = err_of(rmdir(chance(&r, 50) ? ns_path : a));
			op_end();
			want(e, OKS(EPERM, ENOTDIR, ENOTEMPTY),
			     "rmdir in a kvfs mount");
			break;
		case 6:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("mknod %s", b);
			e = err_of(mknod(b, S_IFIFO | 0644, 0));
			op_end();
			want(e, OKS(EPERM), "mknod");
			break;
		case 7:
			op_begin("unlink ctl/stats");
			e = err_of(unlink(chance(&r, 50) ? ctl_path : stats_path));
			op_end();
			want(e, OKS(EPERM), "unlink of a control file");
			break;
		case 8:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("unlink %s", b);
			e = err_of(unlink(chance(&r, 50) ? b : ns_path));
			op_end();
			want(e, OKS(ENOENT, EISDIR, EPERM),
			     "unlink of nothing, or of a directory");
			break;
		case 9:
			op_begin("truncate %s", a);
			e = err_of(truncate(a, (off_t)(edge64(&r) & INT64_MAX)));
			op_end();
			want(e, si >= 0 ? OKS(EPERM, EINVAL, EFBIG)
					: OKS(ENOENT, EINVAL, EFBIG),
			     "truncate of a stored block");
			break;
		case 10:
			op_begin("chmod/chown/utimes %s", a);
			e = err_of(chmod(a, 0777));
			op_end();
			want(e, si >= 0 ? OKS(EPERM) : OKS(ENOENT),
			     "chmod of a block");
			op_begin("utimes %s", a);
			e = err_of(utimensat(AT_FDCWD, a, NULL, 0));
			op_end();
			/* Times are not kept: setting them is a no-op. */
			want(e, si >= 0 ? OKS(0) : OKS(ENOENT),
			     "utimes of a block");
			break;
		case 11: {
			static const int fl[] = {
				O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC,
				O_WRONLY | O_APPEND, O_RDWR | O_CREAT,
			};
			int f = fl[below(&r, 5)];

			op_begin("open %s flags %#x", a, f);
			fd = open(a, f | O_CLOEXEC, 0644);
			e = err_of(fd);
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, si >= 0 ? OKS(EPERM) :
				(f & O_CREAT) ? OKS(0) : OKS(ENOENT),
			     "open of a block for writing");
			if (si < 0 && !e)
				/* an empty block: refused at close */
				want(err_of(unlink(a)), OKS(ENOENT),
				     "an empty block is not stored");
			break;
		}
		case 12:
			op_begin("open dirs for writing");
			e = err_of(open(chance(&r, 50) ? ns_path : mnt,
					O_WRONLY | O_CLOEXEC));
			op_end();
			want(e, OKS(EISDIR), "open of a directory to write");
			op_begin("open stats for writing");
			e = err_of(fd = open(stats_path, O_WRONLY | O_CLOEXEC));
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, OKS(EACCES), "open .kvfs/stats to write");
			break;
		case 13:
			snprintf(b, sizeof(b), "%s/%s.kv",
				 chance(&r, 50) ? mnt : ctl_path, hex);
			op_begin("create %s", b);
			e = err_of(fd = open(b, O_WRONLY | O_CREAT | O_CLOEXEC,
					     0644));
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, OKS(EPERM, ENOTDIR),
			     "create outside a namespace");
			snprintf(b, sizeof(b), "%s/.kvfs/%s.kv", mnt, hex);
			op_begin("create %s", b);
			e = err_of(fd = open(b, O_WRONLY | O_CREAT | O_CLOEXEC,
					     0644));
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, OKS(EPERM), "create in .kvfs");
			break;
		case 14: {
			/* reads at any offset: the stored bytes, or nothing */
			uint64_t off = edge64(&r) & INT64_MAX;

			if (chance(&r, 60))
				off = below(&r, (uint32_t)max_file + 8192);
			size_t n = 1 + below(&r, 65536);
			ssize_t got;

			if (si < 0)
				break;
			op_begin("pread %s %zu @ %" PRIu64, a, n, off);
			fd = open(a, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			if (!e) {
				got = pread(fd, buf, n, (off_t)off);
				e = err_of(got);
				close(fd);
			}
			op_end();
			want(e, OKS(0, EINVAL), "pread of a stored block");
			if (e)
				break;
			uint64_t l = seeds[si].len;
			uint64_t expect = off >= l ? 0 : l - off;

			if (expect > n)
				expect = n;

			if ((uint64_t)got != expect ||
			    (got > 0 && memcmp(buf, seeds[si].img + off,
					       (size_t)got)))
				fz_fail("pread %zu @ %" PRIu64 " of a %" PRIu64
					"-byte block: %zd bytes, or other "
					"bytes", n, off, l, got);
			break;
		}
		case 15: {
			if (si < 0)
				break;
			op_begin("mmap %s", a);
			fd = open(a, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			op_end();
			want(e, OKS(0), "open a stored block");
			void *p = mmap(NULL, (size_t)seeds[si].len, PROT_READ,
				       MAP_SHARED, fd, 0);

			close(fd);
			if (p == MAP_FAILED)
				fz_fail("mmap of a stored block: %s",
					strerror(errno));
			op_begin("compare through mmap");
			bool same = !memcmp(p, seeds[si].img,
					    (size_t)seeds[si].len);
			op_end();
			munmap(p, (size_t)seeds[si].len);
			if (!same)
				fz_fail("mmap of %s shows other bytes", a);
			break;
		}
		case 16: {
			/* readdir from arbitrary cookies */
			DIR *d;
			long cookie = (long)(edge64(&r) & INT64_MAX);

			if (chance(&r, 50))
				cookie = below(&r, 64);

			op_begin("readdir from %ld", cookie);
			d = opendir(chance(&r, 70) ? ns_path : mnt);
			if (d) {
				seekdir(d, cookie);
				while (readdir(d))
					;
				closedir(d);
			}
			op_end();
			break;
		}
		case 17: {
			/* the stats file, at odd offsets */
			ssize_t got;

			op_begin("pread stats");
			fd = open(stats_path, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			op_end();
			want(e, OKS(0), "open .kvfs/stats");
			op_begin("pread stats");
			off_t off = (off_t)(edge64(&r) & INT64_MAX);

			if (chance(&r, 50))
				off = below(&r, 4096);
			got = pread(fd, buf, 1 + below(&r, 8192), off);
			e = err_of(got);
			op_end();
			close(fd);
			want(e, OKS(0, EINVAL), "pread .kvfs/stats");
			break;
		}
		case 18:
			op_begin("opendir a file");
			e = err_of(open(si >= 0 ? a : ctl_path,
					O_RDONLY | O_DIRECTORY | O_CLOEXEC));
			op_end();
			want(e, OKS(ENOTDIR), "open a file as a directory");
			break;
		case 19: {
			struct statvfs sv;

			op_begin("statvfs");
			e = err_of(statvfs(mnt, &sv));
			op_end();
			want(e, OKS(0), "statvfs");
			break;
		}
		case 20:
			/* a block being written, then a second writer */
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("two creates of %s", b);
			fd = open(b, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
				  0644);
			e = err_of(fd);
			op_end();
			want(e, OKS(0), "create");
			if (fd >= 0) {
				int fd2;

				op_begin("second create of %s", b);
				fd2 = open(b, O_WRONLY | O_CREAT | O_CLOEXEC,
					   0644);
				e = err_of(fd2);
				op_end();
				if (fd2 >= 0)
					close(fd2);
				want(e, OKS(EEXIST),
				     "a second writer of one block");
				op_begin("close the first");
				e = err_of(close(fd));
				op_end();
				want(e, OKS(EINVAL), "close of an empty block");
			}
			break;
		default: {
			/* ioctls on a block and on a directory */
			int x = 0;

			if (si < 0)
				break;
			op_begin("ioctl on %s", a);
			fd = open(a, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			if (!e) {
				e = err_of(ioctl(fd, KVFS_IOC_STATS, iobuf));
				close(fd);
			}
			op_end();
			want(e, OKS(ENOTTY), "a ctl ioctl on a block");
			op_begin("ioctl on %s", ns_path);
			fd = open(ns_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			e = err_of(fd);
			if (!e) {
				e = err_of(ioctl(fd, _IOR('K', 1, int), &x));
				close(fd);
			}
			op_end();
			want(e, OKS(ENOTTY, ENOSYS, EINVAL),
			     "an ioctl on a namespace");
			break;
		}
		}
		end_iteration(it);
	}
	listing_check();
	end_target();
}

/* ---------------------------------------------------------- regressions */

/* One ctl request by ioctl; the response's error. */
static int ctl_call(int fd, struct kvfs_ctl_msg *m)
{
	int op = m->req.op, e;

	op_begin("ioctl op %d", op);
	e = err_of(ioctl(fd, KVFS_IOC(op), m));
	op_end();
	want(e, OKS(0), "a well-formed ioctl");
	if (m->resp.magic != KVFS_CTL_MAGIC || m->resp.op != op)
		fz_fail("op %d: not a response", op);
	return m->resp.error;
}

static void msg_init(struct kvfs_ctl_msg *m, int op, int nkeys)
{
	memset(m, 0, sizeof(*m));
	m->req.magic = KVFS_CTL_MAGIC;
	m->req.abi = KVFS_CTL_ABI;
	m->req.op = (uint16_t)op;
	snprintf(m->req.ns, sizeof(m->req.ns), "%s", ns);
	m->req.n_keys = (uint32_t)nkeys;
	for (int i = 0; i < nkeys; i++)
		memcpy(m->bytes + REQ_HDR + 16 * i, seeds[i % n_seeds].key, 16);
	m->req.size = REQ_HDR + 16 * (uint32_t)nkeys;
}

/*
 * fs/fuse_ops.c took the word of a settable xattr from the first 63 bytes
 * up to a newline or NUL: "12\0junk", "5\nabc" and a long zero-padded
 * number were accepted as something else. Trailing newlines and NULs are
 * still fine.
 */
static void test_regress_xattr_words(void **state)
{
	static const struct word bad_cat[] = {
		W("12\0junk"), W("5\nabc"), W("7\n\n8"), W("\0" "3"),
		W("0000000000000000000000000000000000000000000000000000000000000"
		  "00042"),
	};
	static const struct word good_cat[] = {
		W("7"), W("8\n"), W("9\0"), W("10\n\0"), W("11\0\0\n"),
	};
	static const struct word bad_pin[] = {
		W("dram\ngpu"), W("ssd\0x"), W("dram "),
		W("ssdddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
		  "dddddd"),
	};
	char path[4300], v[32];
	struct rng r = rng_for(100, 0);
	ssize_t n;
	int e;

	begin_target("regress_xattr_words");
	scratch_make(&r);
	key_path(path, sizeof(path), scratch_key);
	for (size_t i = 0; i < sizeof(bad_cat) / sizeof(bad_cat[0]); i++) {
		op_begin("setxattr category, bad value %zu", i);
		e = err_of(setxattr(path, "user.kvfs.category", bad_cat[i].v,
				    bad_cat[i].n, 0));
		op_end();
		want(e, OKS(EINVAL), "a category that is not one number");
	}
	for (size_t i = 0; i < sizeof(good_cat) / sizeof(good_cat[0]); i++) {
		op_begin("setxattr category, good value %zu", i);
		e = err_of(setxattr(path, "user.kvfs.category", good_cat[i].v,
				    good_cat[i].n, 0));
		op_end();
		want(e, OKS(0), "a category with a trailing newline or NUL");
		char want_s[8];

		snprintf(want_s, sizeof(want_s), "%zu", 7 + i);
		n = getxattr(path, "user.kvfs.category", v, sizeof(v) - 1);
		if (n != (ssize_t)strlen(want_s) ||
		    memcmp(v, want_s, (size_t)n))
			fz_fail("category after setting %s (value %zu): "
				"'%.*s'", want_s, i, (int)(n > 0 ? n : 0), v);
	}
	for (size_t i = 0; i < sizeof(bad_pin) / sizeof(bad_pin[0]); i++) {
		op_begin("setxattr pin, bad value %zu", i);
		e = err_of(setxattr(path, "user.kvfs.pin", bad_pin[i].v,
				    bad_pin[i].n, 0));
		op_end();
		want(e, OKS(EINVAL), "a pin that is not one tier");
	}
	n = getxattr(path, "user.kvfs.pin", v, sizeof(v));
	if (n >= 0)
		fz_fail("a refused pin left the block pinned ('%.*s')",
			(int)n, v);
	e = err_of(setxattr(path, "user.kvfs.pin", "dram\n", 5, 0));
	want(e, OKS(0), "a pin with a trailing newline");
	scratch_drop();
	end_target();
}

/*
 * cache/ctl.c sync_open() checked the sync word with st_size < off + 4,
 * which wraps for off = 2^64 - 4: the word was stored 4 bytes before the
 * daemon's mapping of the caller's object, and the request succeeded.
 */
static void test_regress_sync_word_bounds(void **state)
{
	static const uint64_t outside[] = {
		UINT64_MAX - 3, UINT64_MAX - 7, UINT64_MAX - 4095,
		SYNC_SIZE, SYNC_SIZE - 2, 1ull << 63,
	};
	struct kvfs_ctl_msg m;
	uint32_t w;
	int fd, err;

	begin_target("regress_sync_word_bounds");
	if (!n_seeds)
		skip();
	fd = ctl_open();
	for (int chunks = 0; chunks < 2; chunks++) {
		for (size_t i = 0; i <= sizeof(outside) / sizeof(outside[0]);
		     i++) {
			bool in = i == sizeof(outside) / sizeof(outside[0]);

			msg_init(&m, chunks ? KVFS_CTL_FETCH_CHUNKS
					    : KVFS_CTL_FETCH_INTO, 1);
			m.req.n_dst = 1; /* dst[0].off = 0 */
			m.req.size += 8;
			if (chunks) {
				m.req.n_layers = g.n_layers;
				m.req.n_chunks = 1; /* chunk 0 */
				m.req.size += 4;
			}
			m.req.peer.backend = KVFS_CTL_BACKEND_SHM;
			m.req.peer.size = PEER_SIZE;
			snprintf(m.req.peer.shm_name,
				 sizeof(m.req.peer.shm_name), "%s", peer_name);
			snprintf(m.req.sync.shm_name,
				 sizeof(m.req.sync.shm_name), "%s", sync_name);
			m.req.sync.off = in ? SYNC_SIZE - 4 : outside[i];
			memset(sync_mem + SYNC_SIZE - 4, 0xee, 4);
			err = ctl_call(fd, &m);
			if (!in && err != -EINVAL)
				fz_fail("%s with the sync word at %#" PRIx64
					" of a %u-byte object: error %d, "
					"want %d", chunks ? "FETCH_CHUNKS" :
					"FETCH_INTO", outside[i], SYNC_SIZE,
					err, -EINVAL);
			if (!in)
				continue;
			memcpy(&w, sync_mem + SYNC_SIZE - 4, 4);
			if (err || w != g.n_layers)
				fz_fail("%s with the sync word in the last 4 "
					"bytes: error %d, word %#x",
					chunks ? "FETCH_CHUNKS" : "FETCH_INTO",
					err, w);
		}
	}
	ctl_close(fd);
	end_target();
}

/*
 * cache/ctl.c op_prefetch() read the job's block count after handing the
 * job to a detached thread that frees it (a use after free ASan reports;
 * otherwise a count from freed memory). Blocks already in DRAM make the
 * thread finish at once.
 */
static void test_regress_prefetch_count(void **state)
{
	struct kvfs_ctl_msg m;
	int fd, err;

	begin_target("regress_prefetch_count");
	if (!n_seeds)
		skip();
	fd = ctl_open();
	for (int i = 0; i < 500; i++) {
		cur_iter = i;
		msg_init(&m, KVFS_CTL_PREFETCH, n_seeds);
		m.req.tier = 1; /* dram */
		err = ctl_call(fd, &m);
		if (err || m.resp.n_cached != (uint32_t)n_seeds)
			fz_fail("PREFETCH of %d stored blocks: error %d, %u "
				"found", n_seeds, err, m.resp.n_cached);
	}
	ctl_close(fd);
	check_alive();
	end_target();
}

/* ---------------------------------------------------------------- main */

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

static int setup(void **state)
{
	const char *e;
	char v[512], dt[32], tag[32];
	pthread_t wd;
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

	iobuf = aligned_alloc(4096, 16384);
	rbuf = malloc(RBUF_SIZE);
	assert_non_null(iobuf);
	assert_non_null(rbuf);
	wq = new_rq();
	wpend = new_rq();
	for (int i = 0; i < 2; i++) {
		wk_q[i] = new_rq();
		wk_buf[i] = malloc(16384);
		assert_non_null(wk_buf[i]);
	}
	xv = malloc(65540);
	xgot = malloc(65540);
	bimg = malloc(max_file + 65536);
	bmodel = malloc(max_file + 65536);
	nsbuf = malloc(max_file + 4096);
	assert_non_null(xv);
	assert_non_null(xgot);
	assert_non_null(bimg);
	assert_non_null(bmodel);
	assert_non_null(nsbuf);
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

static int teardown(void **state)
{
	for (int i = 0; i < n_seeds; i++)
		free(seeds[i].img);
	free(seeds);
	for (int i = 0; i < n_tmpls; i++)
		free(tmpls[i].img);
	free(tmpls);
	for (int i = 0; i < 2; i++) {
		free(wk_q[i].b);
		free(wk_buf[i]);
	}
	free(wq.b);
	free(wpend.b);
	free(xv);
	free(xgot);
	free(bimg);
	free(bmodel);
	free(nsbuf);
	free(iobuf);
	free(rbuf);
	munmap(peer_mem, PEER_SIZE);
	munmap(sync_mem, SYNC_SIZE);
	shm_unlink(peer_name);
	shm_unlink(sync_name);
	if (summary != stdout)
		fclose(summary);
	return 0;
}

int main(void)
{
	/* Block files and xattrs first: a daemon that a ctl request
	 * brings down cannot hide what they would find.
	 */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_regress_xattr_words),
		cmocka_unit_test(test_xattr),
		cmocka_unit_test(test_blocks),
		cmocka_unit_test(test_ns_ops),
		cmocka_unit_test(test_ctl_ioctl),
		cmocka_unit_test(test_ctl_write_read),
		cmocka_unit_test(test_ctl_semantic),
		cmocka_unit_test(test_ctl_threads),
		cmocka_unit_test(test_regress_sync_word_bounds),
		cmocka_unit_test(test_regress_prefetch_count),
	};
	const char *only = getenv("KVFS_FUZZ_ONLY");
	static char filter[64];

	if (only && *only) {
		snprintf(filter, sizeof(filter), "test_%s", only);
		cmocka_set_test_filter(filter);
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
