/* SPDX-License-Identifier: MIT */
/*
 * The device tier, one suite for both backends: shm by default, and
 * KVFS_TEST_GPU=cuda runs the same tests against cuda (where a missing
 * device is a failure, not a skip).
 *
 * Clients are this program run again (/proc/self/exe) with a role, so
 * that a cuda client starts with its own CUDA context like a real engine:
 *   --client MEM OFF LEN SEED   map the pool as a client does (read-only
 *                               shm, or the IPC handle) and check bytes;
 *                               exit 0 same, 1 different, 2 error
 *   --peer-server RFD WFD SIZE  (cuda) own device memory a test uses as a
 *                               peer, exported with an IPC handle, and
 *                               fill or fetch it on request
 * shm peers need no server: the test creates and maps the object itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef KVFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "tier/tier.h"
#include "meta/kvfs_ctl.h"
#include "gpu/gpu.h"
#include "meta/log.h"

#define PG 4096u
#define MiB (1ull << 20)
#define POOL_CAP (4 * MiB)
#define PEER_SIZE (2 * MiB)
#define NTHREADS 4

enum backend { B_SHM, B_CUDA };

static enum backend backend = B_SHM;
static atomic_uint name_seq;

/* ---- bytes ---- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Byte i of pattern @seed, for any i: misplaced or shifted bytes show. */
static void pat(void *buf, uint64_t len, uint64_t seed)
{
	unsigned char *p = buf;
	uint64_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t v = mix(seed * 0x100000001b3ull + i / 8);

		memcpy(p + i, &v, 8);
	}
	if (i < len) {
		uint64_t v = mix(seed * 0x100000001b3ull + i / 8);

		memcpy(p + i, &v, len - i);
	}
}

static bool is_pat(const void *buf, uint64_t len, uint64_t seed)
{
	unsigned char *want = malloc(len ? len : 1);
	bool ok;

	if (!want)
		return false;
	pat(want, len, seed);
	ok = !memcmp(buf, want, len);
	free(want);
	return ok;
}

static void *xmalloc(uint64_t len)
{
	void *p = malloc(len ? len : 1);

	assert_non_null(p);
	return p;
}

static int read_full(int fd, void *buf, size_t len)
{
	unsigned char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void hex_enc(const void *buf, size_t len, char *out)
{
	const unsigned char *p = buf;

	for (size_t i = 0; i < len; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
}

static int hex_dec(const char *s, void *buf, size_t len)
{
	unsigned char *p = buf;

	if (strlen(s) != 2 * len)
		return -1;
	for (size_t i = 0; i < len; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		p[i] = (unsigned char)v;
	}
	return 0;
}

/* Run this program again with @args (args[0] is ignored); its exit status,
 * or -1 if it was killed or could not run.
 */
static int run_self(char **args)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (!pid) {
		execv("/proc/self/exe", args);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/* ---- the tier under test ---- */

static int tier_make(uint64_t cap, struct kvfs_tier **t)
{
	if (backend == B_CUDA)
		return kvfs_gpu_cuda_init(0, cap, 0, t);
	return kvfs_gpu_shm_init("/kvfs-test", cap, KVFS_GPU_PRIVATE, t);
}

struct fx {
	struct kvfs_tier *t;
	const struct kvfs_gpu_ops *g;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	int err;

	if (!f)
		return -1;
	err = tier_make(POOL_CAP, &f->t);
	if (err) {
		fprintf(stderr, "cannot make a %s tier: %s\n",
			backend == B_CUDA ? "cuda" : "shm", strerror(-err));
		free(f);
		return -1;
	}
	f->g = kvfs_gpu_ops_of(f->t);
	if (!f->g) {
		kvfs_tier_free(f->t);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static void tpeer_reap(void);

static int teardown(void **state)
{
	struct fx *f = *state;

	/* NULL when a test freed the tier itself */
	kvfs_tier_free(f->t);
	free(f);
	tpeer_reap();
	return 0;
}

static uint64_t ld(atomic_uint_least64_t *v)
{
	return atomic_load(v);
}

/* ---- test peers: client memory, with a back door to check it ---- */

struct tpeer {
	struct kvfs_ctl_mem m;
	unsigned char *mem;  /* shm: our own mapping */
	pid_t pid;           /* cuda: the server */
	int to, from;        /* cuda: pipes to and from the server */
};

struct preq {
	uint32_t op;  /* 'F' fill, 'G' get, 'Q' quit */
	uint32_t pad;
	uint64_t off, len;
};

static int tpeer_create(struct tpeer *p, uint64_t size)
{
	memset(p, 0, sizeof(*p));
	p->pid = -1;
	p->to = p->from = -1;
	if (backend == B_SHM) {
		int fd;

		p->m.backend = KVFS_CTL_BACKEND_SHM;
		p->m.size = size;
		snprintf(p->m.shm_name, sizeof(p->m.shm_name),
			 "/kvfs-tpeer-%ld-%u", (long)getpid(),
			 atomic_fetch_add(&name_seq, 1));
		fd = shm_open(p->m.shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
		if (fd < 0)
			return -1;
		if (ftruncate(fd, (off_t)size)) {
			close(fd);
			return -1;
		}
		p->mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED,
			      fd, 0);
		close(fd);
		return p->mem == MAP_FAILED ? -1 : 0;
	} else {
		int a[2], b[2];
		char rfd[16], wfd[16], sz[32];
		char *args[] = { "x", "--peer-server", rfd, wfd, sz, NULL };

		if (pipe2(a, O_CLOEXEC) || pipe2(b, O_CLOEXEC))
			return -1;
		snprintf(rfd, sizeof(rfd), "%d", a[0]);
		snprintf(wfd, sizeof(wfd), "%d", b[1]);
		snprintf(sz, sizeof(sz), "%" PRIu64, size);
		p->pid = fork();
		if (p->pid < 0)
			return -1;
		if (!p->pid) {
			fcntl(a[0], F_SETFD, 0);
			fcntl(b[1], F_SETFD, 0);
			execv("/proc/self/exe", args);
			_exit(127);
		}
		close(a[0]);
		close(b[1]);
		p->to = a[1];
		p->from = b[0];
		if (read_full(p->from, &p->m, sizeof(p->m)) ||
		    p->m.backend != KVFS_CTL_BACKEND_CUDA)
			return -1;
		return 0;
	}
}

static void tpeer_fill(struct tpeer *p, uint64_t off, const void *buf,
		       uint64_t len)
{
	struct preq r = { .op = 'F', .off = off, .len = len };
	int32_t st = -1;

	assert_true(off <= p->m.size && len <= p->m.size - off);
	if (backend == B_SHM) {
		memcpy(p->mem + off, buf, len);
		return;
	}
	assert_int_equal(write_full(p->to, &r, sizeof(r)), 0);
	assert_int_equal(write_full(p->to, buf, len), 0);
	assert_int_equal(read_full(p->from, &st, sizeof(st)), 0);
	assert_int_equal(st, 0);
}

static void tpeer_get(struct tpeer *p, uint64_t off, void *buf, uint64_t len)
{
	struct preq r = { .op = 'G', .off = off, .len = len };
	int32_t st = -1;

	assert_true(off <= p->m.size && len <= p->m.size - off);
	if (backend == B_SHM) {
		memcpy(buf, p->mem + off, len);
		return;
	}
	assert_int_equal(write_full(p->to, &r, sizeof(r)), 0);
	assert_int_equal(read_full(p->from, &st, sizeof(st)), 0);
	assert_int_equal(st, 0);
	assert_int_equal(read_full(p->from, buf, len), 0);
}

/* Whether peer bytes [off, off + len) are pattern @seed from offset 0. */
static bool tpeer_is(struct tpeer *p, uint64_t off, uint64_t len,
		     uint64_t seed)
{
	unsigned char *buf = xmalloc(len);
	bool ok;

	tpeer_get(p, off, buf, len);
	ok = is_pat(buf, len, seed);
	free(buf);
	return ok;
}

/*
 * cuda servers whose memory may still be mapped here: the tier caches
 * opened IPC handles until the last tier is freed, and CUDA leaves
 * freeing exported memory that an importer still maps undefined.
 */
static struct tpeer dead_peers[64];
static unsigned n_dead_peers;

static void tpeer_stop(struct tpeer *p)
{
	if (p->to >= 0) {
		struct preq r = { .op = 'Q' };

		write_full(p->to, &r, sizeof(r));
		close(p->to);
	}
	if (p->from >= 0)
		close(p->from);
	if (p->pid > 0)
		waitpid(p->pid, NULL, 0);
}

/* Stop the servers of destroyed peers; call with no tier left. */
static void tpeer_reap(void)
{
	while (n_dead_peers)
		tpeer_stop(&dead_peers[--n_dead_peers]);
}

static void tpeer_destroy(struct tpeer *p)
{
	if (backend == B_SHM) {
		if (p->mem && p->mem != MAP_FAILED)
			munmap(p->mem, p->m.size);
		shm_unlink(p->m.shm_name);
		return;
	}
	if (n_dead_peers < sizeof(dead_peers) / sizeof(dead_peers[0]))
		dead_peers[n_dead_peers++] = *p;
	else
		tpeer_stop(p);
}

/* ---- base ops ---- */

static void test_alloc(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e[16], x;
	uint64_t each = POOL_CAP / 16;

	assert_int_equal(t->id, KVFS_TIER_GPU);
	assert_int_equal(t->capacity, POOL_CAP);
	assert_int_equal(t->align, PG);
	assert_int_equal(t->ops->alloc(t, 0, &x), -EINVAL);
	assert_int_equal(t->ops->alloc(t, POOL_CAP + 1, &x), -ENOSPC);
	assert_int_equal(t->ops->alloc(t, UINT64_MAX, &x), -ENOSPC);

	assert_int_equal(t->ops->alloc(t, 1, &e[0]), 0);
	assert_int_equal(e[0].len, PG);
	assert_int_equal(ld(&t->used), PG);
	t->ops->free(t, &e[0]);
	assert_int_equal(ld(&t->used), 0);

	for (int i = 0; i < 16; i++) {
		assert_int_equal(t->ops->alloc(t, each - 100, &e[i]), 0);
		assert_int_equal(e[i].len, each);
		assert_true(e[i].off + e[i].len <= POOL_CAP);
		if (backend == B_SHM) {
			assert_non_null(e[i].ptr);
			assert_ptr_equal(t->ops->map(t, &e[i]), e[i].ptr);
		} else {
			assert_null(e[i].ptr);
			assert_null(t->ops->map(t, &e[i]));
		}
	}
	assert_int_equal(ld(&t->used), POOL_CAP);
	assert_int_equal(t->ops->alloc(t, 1, &x), -ENOSPC);

	/* A double free is logged and changes nothing. */
	t->ops->free(t, &e[5]);
	assert_int_equal(ld(&t->used), POOL_CAP - each);
	t->ops->free(t, &e[5]);
	assert_int_equal(ld(&t->used), POOL_CAP - each);
	assert_int_equal(t->ops->alloc(t, each + 1, &x), -ENOSPC);

	/* Claim: used ranges, the pool's end and free ranges. */
	assert_int_equal(t->ops->claim(t, &e[4]), -EEXIST);
	x.off = POOL_CAP;
	x.len = PG;
	assert_int_equal(t->ops->claim(t, &x), -EINVAL);
	assert_int_equal(t->ops->claim(t, &e[5]), 0);
	assert_int_equal(ld(&t->used), POOL_CAP);
	t->ops->free(t, &e[5]);
	assert_int_equal(t->ops->alloc(t, each, &x), 0);
	assert_int_equal(x.off, e[5].off);
	e[5] = x;
	assert_int_equal(t->ops->sync(t), 0);
	for (int i = 0; i < 16; i++)
		t->ops->free(t, &e[i]);
	assert_int_equal(ld(&t->used), 0);
	assert_int_equal(t->ops->alloc(t, POOL_CAP, &x), 0);
	t->ops->free(t, &x);
}

static void test_write_read(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	enum { N = 64 };
	struct kvfs_extent e[N];
	struct kvfs_tier_io io[N + 1];
	uint64_t len[N], w0 = ld(&t->st.writes), b0 = ld(&t->st.bytes_written);
	uint64_t r0, rb0, sum = 0;
	unsigned char *buf = xmalloc(64 * 1024), *out[N];

	for (int i = 0; i < N; i++) {
		len[i] = 1 + (uint64_t)i * 997 % (48 * 1024);
		assert_int_equal(t->ops->alloc(t, len[i], &e[i]), 0);
		pat(buf, len[i], 100 + i);
		assert_int_equal(t->ops->write(t, &e[i], 0, buf, len[i]), 0);
		sum += len[i];
	}
	assert_int_equal(ld(&t->st.writes) - w0, N);
	assert_int_equal(ld(&t->st.bytes_written) - b0, sum);

	for (int i = 0; i < N; i++) {
		memset(buf, 0, len[i]);
		assert_int_equal(t->ops->read(t, &e[i], 0, buf, len[i]), 0);
		assert_true(is_pat(buf, len[i], 100 + i));
	}
	/* Unaligned pieces in the middle. */
	pat(buf, 1000, 7);
	assert_int_equal(t->ops->write(t, &e[N - 1], 333, buf, 1000), 0);
	memset(buf, 0, 1000);
	assert_int_equal(t->ops->read(t, &e[N - 1], 333, buf, 1000), 0);
	assert_true(is_pat(buf, 1000, 7));
	pat(buf, len[N - 1], 100 + N - 1);
	pat(buf + 333, 1000, 7);
	assert_int_equal(t->ops->write(t, &e[N - 1], 0, buf, len[N - 1]), 0);
	pat(buf, len[N - 1], 100 + N - 1);
	assert_int_equal(t->ops->write(t, &e[N - 1], 0, buf, len[N - 1]), 0);

	/* A batch, with one bad range that must not stop the others. */
	r0 = ld(&t->st.reads);
	rb0 = ld(&t->st.bytes_read);
	for (int i = 0; i < N; i++) {
		out[i] = xmalloc(len[i]);
		memset(out[i], 0, len[i]);
		io[i] = (struct kvfs_tier_io){ .ext = &e[i], .off = 0,
					       .len = len[i], .buf = out[i],
					       .res = 1 };
	}
	io[N] = (struct kvfs_tier_io){ .ext = &e[0], .off = e[0].len,
				       .len = 1, .buf = buf, .res = 1 };
	assert_int_equal(t->ops->readv(t, io, N + 1), -EINVAL);
	assert_int_equal(io[N].res, -EINVAL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(io[i].res, 0);
		assert_true(is_pat(out[i], len[i], 100 + i));
		free(out[i]);
	}
	assert_int_equal(ld(&t->st.reads) - r0, N);
	assert_int_equal(ld(&t->st.bytes_read) - rb0, sum);
	assert_int_equal(t->ops->readv(t, io, 0), 0);

	/* Length 0 is a no-op; ranges leaving the extent are refused. */
	assert_int_equal(t->ops->write(t, &e[0], e[0].len, buf, 0), 0);
	assert_int_equal(t->ops->read(t, &e[0], e[0].len, NULL, 0), 0);
	assert_int_equal(t->ops->write(t, &e[0], e[0].len - 1, buf, 2),
			 -EINVAL);
	assert_int_equal(t->ops->read(t, &e[0], UINT64_MAX, buf, 2), -EINVAL);
	assert_int_equal(t->ops->read(t, &e[0], 1, buf, UINT64_MAX), -EINVAL);
	assert_int_equal(t->ops->read(t, &e[0], 0, NULL, 1), -EINVAL);
	for (int i = 0; i < N; i++)
		t->ops->free(t, &e[i]);
	free(buf);
}

/* A forged extent reaching past the pool is refused by every op. */
static void test_forged_extent(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent bad = { .off = POOL_CAP - PG, .len = 2 * PG };
	struct kvfs_extent wrap = { .off = UINT64_MAX - PG + 1, .len = PG };
	struct kvfs_gpu_xfer x = { .pool = &bad, .host = NULL, .len = 1 };
	char buf[16] = "x";

	assert_int_equal(t->ops->write(t, &bad, 0, buf, 1), -EINVAL);
	assert_int_equal(t->ops->read(t, &wrap, 0, buf, 1), -EINVAL);
	x.host = buf;
	assert_int_equal(f->g->upload(t, &x, 1), -EINVAL);
	x.pool = &wrap;
	assert_int_equal(f->g->upload(t, &x, 1), -EINVAL);
	assert_null(t->ops->map(t, &bad));
}

/* Copy @len bytes between host memory and the address extent_addr gave:
 * a plain memcpy on shm, cudaMemcpy on cuda (device memory).
 */
static void addr_put(void *dst, const void *src, uint64_t len)
{
	if (backend == B_SHM) {
		memcpy(dst, src, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	assert_int_equal(cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice),
			 cudaSuccess);
#else
	fail_msg("cuda backend in a build without CUDA");
#endif
}

static void addr_get(void *dst, const void *src, uint64_t len)
{
	if (backend == B_SHM) {
		memcpy(dst, src, len);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	assert_int_equal(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost),
			 cudaSuccess);
#else
	fail_msg("cuda backend in a build without CUDA");
#endif
}

/*
 * extent_addr: the pool's own address of an extent (shm: the host
 * mapping, cuda: a device pointer). What is written through it is what
 * the tier's reads and clients see, and the reverse; extents keep their
 * distance; anything outside the pool is refused.
 */
static void test_extent_addr(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e[2], bad = { .off = POOL_CAP - PG, .len = 2 * PG };
	struct kvfs_extent wrap = { .off = UINT64_MAX - PG + 1, .len = PG };
	struct kvfs_extent last = { .off = POOL_CAP - PG, .len = PG };
	struct kvfs_gpu_xfer x;
	unsigned char *src = xmalloc(8 * PG), *buf = xmalloc(8 * PG);
	uint64_t w0 = ld(&t->st.writes);
	void *a[2], *p = &buf;

	assert_non_null(f->g->extent_addr);
	assert_int_equal(t->ops->alloc(t, 3 * PG, &e[0]), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e[1]), 0);
	for (int k = 0; k < 2; k++) {
		a[k] = NULL;
		assert_int_equal(f->g->extent_addr(t, &e[k], &a[k]), 0);
		assert_non_null(a[k]);
	}
	/* one allocation: the addresses are as far apart as the offsets */
	assert_int_equal((intptr_t)((unsigned char *)a[1] -
				    (unsigned char *)a[0]),
			 (intptr_t)(e[1].off - e[0].off));

	/* written through the address, seen by the tier's read */
	pat(src, 8 * PG, 77);
	addr_put(a[1], src, 8 * PG);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->read(t, &e[1], 0, buf, 8 * PG), 0);
	assert_true(is_pat(buf, 8 * PG, 77));
	/* no copy of the tier's was counted */
	assert_int_equal(ld(&t->st.writes), w0);

	/* uploaded, seen through the address at the same offset */
	pat(src, 2 * PG, 78);
	x = (struct kvfs_gpu_xfer){ .pool = &e[0], .host = src, .off = PG,
				    .len = 2 * PG };
	assert_int_equal(f->g->upload(t, &x, 1), 0);
	memset(buf, 0, 2 * PG);
	addr_get(buf, (unsigned char *)a[0] + PG, 2 * PG);
	assert_true(is_pat(buf, 2 * PG, 78));
	/* the neighbour is untouched */
	assert_int_equal(t->ops->read(t, &e[1], 0, buf, 8 * PG), 0);
	assert_true(is_pat(buf, 8 * PG, 77));

	/* the last page of the pool is inside it */
	assert_int_equal(f->g->extent_addr(t, &last, &a[0]), 0);
	assert_non_null(a[0]);

	/* outside the pool, or no arguments: -EINVAL, the address cleared */
	assert_int_equal(f->g->extent_addr(t, &bad, &p), -EINVAL);
	assert_null(p);
	p = &buf;
	assert_int_equal(f->g->extent_addr(t, &wrap, &p), -EINVAL);
	assert_null(p);
	p = &buf;
	assert_int_equal(f->g->extent_addr(t, NULL, &p), -EINVAL);
	assert_null(p);
	assert_int_equal(f->g->extent_addr(t, &e[0], NULL), -EINVAL);

	for (int k = 0; k < 2; k++)
		t->ops->free(t, &e[k]);
	free(src);
	free(buf);
}

static void test_upload(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	enum { N = 200 };
	struct kvfs_extent e[4];
	struct kvfs_gpu_xfer x[N + 1];
	unsigned char *src[N], *buf = xmalloc(PG);
	uint64_t w0 = ld(&t->st.writes), b0 = ld(&t->st.bytes_written);
	uint64_t sum = 0;

	for (int k = 0; k < 4; k++)
		assert_int_equal(t->ops->alloc(t, 64 * PG, &e[k]), 0);
	/* 50 pieces of 1 page (minus i bytes) into each extent, in an order
	 * that interleaves the extents.
	 */
	for (int i = 0; i < N; i++) {
		uint64_t l = PG - (uint64_t)(i % 50);

		src[i] = xmalloc(l);
		pat(src[i], l, 1000 + i);
		x[i] = (struct kvfs_gpu_xfer){ .pool = &e[i % 4],
					       .host = src[i],
					       .off = (uint64_t)(i / 4) * PG,
					       .len = l };
		sum += l;
	}
	assert_int_equal(f->g->upload(t, x, N), 0);
	assert_int_equal(ld(&t->st.writes) - w0, N);
	assert_int_equal(ld(&t->st.bytes_written) - b0, sum);
	for (int i = 0; i < N; i++) {
		memset(buf, 0, PG);
		assert_int_equal(t->ops->read(t, &e[i % 4],
					      (uint64_t)(i / 4) * PG, buf,
					      x[i].len), 0);
		assert_true(is_pat(buf, x[i].len, 1000 + i));
	}

	/* One bad transfer at the end: nothing of the batch is copied. */
	for (int i = 0; i < N; i++)
		pat(src[i], x[i].len, 5000 + i);
	x[N] = (struct kvfs_gpu_xfer){ .pool = &e[0], .host = buf,
				       .off = 64 * PG - 10, .len = 11 };
	w0 = ld(&t->st.writes);
	assert_int_equal(f->g->upload(t, x, N + 1), -EINVAL);
	assert_int_equal(ld(&t->st.writes), w0);
	x[N].off = 0;
	x[N].host = NULL;
	assert_int_equal(f->g->upload(t, x, N + 1), -EINVAL);
	x[N].host = buf;
	x[N].pool = NULL;
	assert_int_equal(f->g->upload(t, x, N + 1), -EINVAL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(t->ops->read(t, &e[i % 4],
					      (uint64_t)(i / 4) * PG, buf,
					      x[i].len), 0);
		assert_true(is_pat(buf, x[i].len, 1000 + i));
		free(src[i]);
	}
	assert_int_equal(f->g->upload(t, NULL, 0), 0);
	assert_int_equal(f->g->upload(t, NULL, 1), -EINVAL);
	for (int k = 0; k < 4; k++)
		t->ops->free(t, &e[k]);
	free(buf);
}

/*
 * More than the staging buffers hold (cuda: 4 streams x 4 x 4 MiB), in
 * pieces of odd sizes that straddle chunk boundaries, some touching in
 * the pool (one copy) and some not.
 */
static void test_large_batch(void **state)
{
	enum { N = 700 };
	const uint64_t total = 40 * MiB;
	struct kvfs_tier *t;
	const struct kvfs_gpu_ops *g;
	struct kvfs_extent e;
	struct kvfs_gpu_xfer *x;
	struct kvfs_tier_io *io;
	unsigned char *src, *dst;
	struct kvfs_gpu_peer *p;
	struct tpeer tp;
	uint64_t off = 0;

	assert_int_equal(tier_make(64 * MiB, &t), 0);
	x = calloc(N, sizeof(*x));
	io = calloc(N, sizeof(*io));
	src = xmalloc(total);
	dst = xmalloc(total);
	assert_non_null(x);
	assert_non_null(io);
	g = kvfs_gpu_ops_of(t);
	assert_int_equal(t->ops->alloc(t, total + MiB, &e), 0);
	pat(src, total, 77);
	for (int i = 0; i < N; i++) {
		uint64_t l = total / N - 7 + (uint64_t)(i % 13);

		if (i == N - 1)
			l = total - off;
		/* Runs of three pieces touch in the pool, then a gap. */
		x[i] = (struct kvfs_gpu_xfer){ .pool = &e, .host = src + off,
					       .off = off + (uint64_t)(i / 3) *
							    100,
					       .peer_off = off, .len = l };
		io[i] = (struct kvfs_tier_io){ .ext = &e, .off = x[i].off,
					       .len = l, .buf = dst + off };
		off += l;
	}
	assert_int_equal(off, total);
	assert_int_equal(g->upload(t, x, N), 0);
	memset(dst, 0, total);
	assert_int_equal(t->ops->readv(t, io, N), 0);
	assert_true(is_pat(dst, total, 77));

	/* The same through a peer: host -> peer, then peer -> host. */
	assert_int_equal(tpeer_create(&tp, total), 0);
	assert_int_equal(g->peer_open(t, &tp.m, &p), 0);
	for (int i = 0; i < N; i++)
		x[i].pool = NULL;
	assert_int_equal(g->peer_write(t, p, x, N), 0);
	assert_true(tpeer_is(&tp, 0, total, 77));
	memset(src, 0, total);
	assert_int_equal(g->peer_read(t, p, x, N), 0);
	assert_true(is_pat(src, total, 77));
	g->peer_close(t, p);
	tpeer_destroy(&tp);
	t->ops->free(t, &e);
	kvfs_tier_free(t);
	tpeer_reap();
	free(x);
	free(io);
	free(src);
	free(dst);
}

/* ---- registered host memory ---- */

/*
 * host_register's argument checks, the same on both backends; on cuda the
 * bookkeeping of regions, and the runtime sees the memory as pinned.
 */
static void test_host_register(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *d;
	unsigned char *base;
	void *b;
	uint64_t len;

	assert_int_equal(kvfs_tier_dram_init_flags(4 * MiB, KVFS_DRAM_ARENA,
						   &d), 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	base = b;
	assert_int_equal(f->g->host_register(f->t, NULL, PG), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base, 0), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base, len), 0);
	if (backend == B_SHM) {
		/* Nothing to pin: every call is a no-op. */
		assert_int_equal(f->g->host_register(f->t, base, len), 0);
		assert_int_equal(f->g->host_unregister(f->t, base), 0);
		assert_int_equal(f->g->host_unregister(f->t, base + PG), 0);
		kvfs_tier_free(d);
		return;
	}
#ifdef KVFS_HAVE_CUDA
	{
		struct cudaPointerAttributes a;

		assert_int_equal(cudaPointerGetAttributes(&a, base + len / 2),
				 cudaSuccess);
		assert_int_equal(a.type, cudaMemoryTypeHost);
	}
#endif
	/* The same range, a part of it, or a range across its end. */
	assert_int_equal(f->g->host_register(f->t, base, len), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base + PG, PG), -EINVAL);
	assert_int_equal(f->g->host_register(f->t, base + len - PG, 2 * PG),
			 -EINVAL);
	assert_int_equal(f->g->host_unregister(f->t, base + PG), -ENOENT);
	assert_int_equal(f->g->host_unregister(f->t, base), 0);
	assert_int_equal(f->g->host_unregister(f->t, base), -ENOENT);
#ifdef KVFS_HAVE_CUDA
	{
		struct cudaPointerAttributes a;

		assert_int_equal(cudaPointerGetAttributes(&a, base),
				 cudaSuccess);
		assert_int_equal(a.type, cudaMemoryTypeUnregistered);
	}
#endif
	/* Registered again, then left for the tier's release to undo. */
	assert_int_equal(f->g->host_register(f->t, base, len), 0);
	kvfs_tier_free(f->t);
	f->t = NULL;
	kvfs_tier_free(d);
}

/*
 * cuda: transfers whose host side is registered go direct, the others are
 * staged, in one batch, with every byte where it belongs. The sources are
 * overwritten as soon as each call returns: the stand-in defers copies,
 * so a call that returned before its copies ran shows here as wrong bytes.
 */
static void test_direct_copies(void **state)
{
	enum { N = 24 };
	const uint64_t piece = 1536 * 1024; /* 1.5 MiB: slots are 4 MiB */
	struct fx *f = *state;
	struct kvfs_tier *t = f->t, *d;
	struct kvfs_extent dx, px;
	struct kvfs_gpu_xfer x[N];
	struct kvfs_tier_io io[N];
	unsigned char *arena, *heap, *out;
	struct kvfs_gpu_peer *p;
	struct tpeer tp;
	uint64_t d0, s0, w0, want_d = 0, want_s = 0;
	void *b;
	uint64_t len;

	if (backend != B_CUDA) {
		print_message("cuda-only test skipped (KVFS_TEST_GPU=cuda)\n");
		skip();
	}
	kvfs_tier_free(f->t);
	assert_int_equal(tier_make(2 * N * piece, &f->t), 0);
	t = f->t;
	assert_int_equal(kvfs_tier_dram_init_flags(48 * MiB, KVFS_DRAM_ARENA,
						   &d), 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	assert_int_equal(f->g->host_register(t, b, len), 0);
	assert_int_equal(d->ops->alloc(d, N * piece, &dx), 0);
	assert_int_equal(t->ops->alloc(t, 2 * N * piece, &px), 0);
	arena = dx.ptr;
	heap = xmalloc(N * piece);
	out = xmalloc(2 * N * piece);

	/*
	 * Even pieces from the arena, odd ones from the heap; runs of two
	 * arena pieces continue each other in both memories (one copy),
	 * then the order jumps; the staged ones fill the ring more than
	 * once.
	 */
	for (int i = 0; i < N; i++) {
		bool reg = i % 2 == 0;
		unsigned char *h = (reg ? arena : heap) + (uint64_t)i * piece;
		uint64_t l = reg ? piece : piece - 3 * (uint64_t)i;

		pat(h, l, 300 + i);
		x[i] = (struct kvfs_gpu_xfer){ .pool = &px, .host = h,
					       .off = (uint64_t)i * piece,
					       .peer_off = (uint64_t)i * piece,
					       .len = l };
		if (reg)
			want_d += l;
		else
			want_s += l;
	}
	d0 = ld(&t->st.direct_bytes);
	s0 = ld(&t->st.staged_bytes);
	w0 = ld(&t->st.bytes_written);
	assert_int_equal(f->g->upload(t, x, N), 0);
	assert_int_equal(ld(&t->st.direct_bytes) - d0, want_d);
	assert_int_equal(ld(&t->st.staged_bytes) - s0, want_s);
	assert_int_equal(ld(&t->st.bytes_written) - w0, want_d + want_s);
	memset(arena, 0xee, N * piece);
	memset(heap, 0xee, N * piece);
	for (int i = 0; i < N; i++) {
		memset(out, 0, x[i].len);
		assert_int_equal(t->ops->read(t, &px, x[i].off, out,
					      x[i].len), 0);
		assert_true(is_pat(out, x[i].len, 300 + i));
	}

	/* Down again: into the arena direct, into the heap staged, one
	 * readv; the destinations are checked after it returns.
	 */
	for (int i = 0; i < N; i++)
		io[i] = (struct kvfs_tier_io){ .ext = &px, .off = x[i].off,
					       .len = x[i].len,
					       .buf = x[i].host };
	d0 = ld(&t->st.direct_bytes);
	s0 = ld(&t->st.staged_bytes);
	assert_int_equal(t->ops->readv(t, io, N), 0);
	assert_int_equal(ld(&t->st.direct_bytes) - d0, want_d);
	assert_int_equal(ld(&t->st.staged_bytes) - s0, want_s);
	for (int i = 0; i < N; i++) {
		assert_int_equal(io[i].res, 0);
		assert_true(is_pat(x[i].host, x[i].len, 300 + i));
	}

	/* One write and one read of a single registered range. */
	pat(arena, piece, 77);
	d0 = ld(&t->st.direct_bytes);
	assert_int_equal(t->ops->write(t, &px, N * piece, arena, piece), 0);
	memset(arena, 0, piece);
	assert_int_equal(t->ops->read(t, &px, N * piece, arena, piece), 0);
	assert_true(is_pat(arena, piece, 77));
	assert_int_equal(ld(&t->st.direct_bytes) - d0, 2 * piece);

	/* Per transfer: the arena's last page direct, a heap page staged. */
	s0 = ld(&t->st.staged_bytes);
	d0 = ld(&t->st.direct_bytes);
	assert_int_equal(t->ops->read(t, &px, 0, (unsigned char *)b + len -
				      PG, PG), 0);
	assert_int_equal(ld(&t->st.direct_bytes) - d0, PG);
	assert_int_equal(t->ops->write(t, &px, 0, out, PG), 0);
	assert_int_equal(ld(&t->st.staged_bytes) - s0, PG);

	/* Host -> peer and back, the host sides mixed the same way. */
	for (int i = 0; i < N; i++)
		pat(x[i].host, x[i].len, 900 + i);
	assert_int_equal(tpeer_create(&tp, N * piece), 0);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	for (int i = 0; i < N; i++)
		x[i].pool = NULL;
	d0 = ld(&t->st.direct_bytes);
	s0 = ld(&t->st.staged_bytes);
	assert_int_equal(f->g->peer_write(t, p, x, N), 0);
	memset(arena, 0xee, N * piece);
	memset(heap, 0xee, N * piece);
	for (int i = 0; i < N; i++)
		assert_true(tpeer_is(&tp, x[i].peer_off, x[i].len, 900 + i));
	assert_int_equal(f->g->peer_read(t, p, x, N), 0);
	for (int i = 0; i < N; i++)
		assert_true(is_pat(x[i].host, x[i].len, 900 + i));
	assert_int_equal(ld(&t->st.direct_bytes) - d0, 2 * want_d);
	assert_int_equal(ld(&t->st.staged_bytes) - s0, 2 * want_s);
	f->g->peer_close(t, p);
	tpeer_destroy(&tp);

	/* Unregistered, the arena is ordinary memory: all staged. */
	assert_int_equal(f->g->host_unregister(t, b), 0);
	for (int i = 0; i < N; i++)
		x[i].pool = &px;
	for (int i = 0; i < N; i++)
		pat(x[i].host, x[i].len, 500 + i);
	d0 = ld(&t->st.direct_bytes);
	s0 = ld(&t->st.staged_bytes);
	assert_int_equal(f->g->upload(t, x, N), 0);
	assert_int_equal(ld(&t->st.direct_bytes), d0);
	assert_int_equal(ld(&t->st.staged_bytes) - s0, want_d + want_s);
	for (int i = 0; i < N; i++) {
		assert_int_equal(t->ops->read(t, &px, x[i].off, out,
					      x[i].len), 0);
		assert_true(is_pat(out, x[i].len, 500 + i));
	}
	t->ops->free(t, &px);
	d->ops->free(d, &dx);
	kvfs_tier_free(d);
	free(heap);
	free(out);
}

/*
 * Batches of many transfers of random lengths (0 included, none aligned),
 * their host sides drawn from a registered half of an arena, its
 * unregistered half, ranges across the boundary between the two, and the
 * heap, in random order, some continuing each other in both memories: up
 * and down again (upload, readv, peer_write, peer_read), every byte
 * checked, and every host byte counted once as direct or staged.
 */
static void test_mixed_batches(void **state)
{
	enum { N = 64, ROUNDS = 6 };
	const uint64_t half = 32 * MiB, hsz = 32 * MiB, cap = 64 * MiB;
	const uint64_t hall = 2 * half + hsz;
	struct fx *f = *state;
	struct kvfs_tier *t, *d;
	struct kvfs_extent dx, px;
	struct kvfs_gpu_xfer x[N], y[N];
	struct kvfs_tier_io io[N];
	struct kvfs_gpu_peer *p;
	struct tpeer tp;
	unsigned char *arena, *heap, *shadow, *hshadow, *out;
	uint64_t rng = 12345, d0, s0, want_d, want_s;
	void *b;
	uint64_t len;

	kvfs_tier_free(f->t);
	assert_int_equal(tier_make(cap, &f->t), 0);
	t = f->t;
	assert_int_equal(kvfs_tier_dram_init_flags(2 * half, KVFS_DRAM_ARENA,
						   &d), 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	assert_int_equal(d->ops->alloc(d, 2 * half, &dx), 0);
	arena = dx.ptr;
	/* Only the first half is registered. */
	assert_int_equal(f->g->host_register(t, arena, half), 0);
	assert_int_equal(t->ops->alloc(t, cap, &px), 0);
	heap = xmalloc(hsz);
	shadow = xmalloc(cap);
	out = xmalloc(cap);
	hshadow = xmalloc(hall);
	assert_int_equal(tpeer_create(&tp, cap), 0);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);

	for (int round = 0; round < ROUNDS; round++) {
		/* host cursors: registered, unregistered, heap */
		unsigned char *cur[3] = { arena, arena + half + 2 * MiB,
					  heap };
		uint64_t dev = 0;
		int last = -1;
		bool across = false;

		want_d = want_s = 0;
		for (int i = 0; i < N; i++) {
			uint64_t r = mix(rng++), l = (r >> 8) % (256 * 1024);
			int k = (int)(r % 4);
			unsigned char *h;

			if (k == 3 && !across) {
				/* across the registered half's end */
				across = true;
				h = arena + half - l / 2;
			} else {
				if (k == 3)
					k = 2;
				/* continue the last one, or leave a gap */
				if (!(r >> 40 & 1) || k != last)
					cur[k] += (r >> 42) % 5000;
				h = cur[k];
				cur[k] += l;
				last = k;
			}
			if (!(r >> 48 & 1))
				dev += (r >> 50) % 9000;
			x[i] = (struct kvfs_gpu_xfer){ .pool = &px, .host = h,
						       .off = dev,
						       .peer_off = dev,
						       .len = l };
			dev += l;
			if (backend == B_SHM)
				continue;
			if (h >= arena && h + l <= arena + half && l)
				want_d += l;
			else
				want_s += l;
		}
		assert_true(cur[0] <= arena + half - MiB);
		assert_true(cur[1] <= arena + 2 * half);
		assert_true(cur[2] <= heap + hsz);
		assert_true(dev <= cap);

		/* Up: every device byte is what its host range held. */
		memset(shadow, 0, cap);
		assert_int_equal(t->ops->write(t, &px, 0, shadow, cap), 0);
		for (int i = 0; i < N; i++) {
			pat(x[i].host, x[i].len, 1000 * round + i);
			memcpy(shadow + x[i].off, x[i].host, x[i].len);
		}
		d0 = ld(&t->st.direct_bytes);
		s0 = ld(&t->st.staged_bytes);
		assert_int_equal(f->g->upload(t, x, N), 0);
		assert_int_equal(ld(&t->st.direct_bytes) - d0, want_d);
		assert_int_equal(ld(&t->st.staged_bytes) - s0, want_s);
		memset(arena, 0xee, 2 * half);
		memset(heap, 0xee, hsz);
		assert_int_equal(t->ops->read(t, &px, 0, out, cap), 0);
		assert_memory_equal(out, shadow, cap);

		/* Down again into the same host ranges, one readv. */
		for (int i = 0; i < N; i++)
			io[i] = (struct kvfs_tier_io){ .ext = &px,
						       .off = x[i].off,
						       .len = x[i].len,
						       .buf = x[i].host };
		d0 = ld(&t->st.direct_bytes);
		s0 = ld(&t->st.staged_bytes);
		assert_int_equal(t->ops->readv(t, io, N), 0);
		assert_int_equal(ld(&t->st.direct_bytes) - d0, want_d);
		assert_int_equal(ld(&t->st.staged_bytes) - s0, want_s);
		memset(hshadow, 0xee, hall);
		for (int i = 0; i < N; i++) {
			unsigned char *h = x[i].host;
			uint64_t o = h >= heap && h < heap + hsz ?
				     2 * half + (uint64_t)(h - heap) :
				     (uint64_t)(h - arena);

			assert_int_equal(io[i].res, 0);
			memcpy(hshadow + o, shadow + x[i].off, x[i].len);
		}
		assert_memory_equal(arena, hshadow, 2 * half);
		assert_memory_equal(heap, hshadow + 2 * half, hsz);

		/* Host -> peer, then peer -> host. */
		memcpy(y, x, sizeof(y));
		for (int i = 0; i < N; i++) {
			y[i].pool = NULL;
			pat(y[i].host, y[i].len, 7000 * round + i);
		}
		memset(shadow, 0, cap);
		tpeer_fill(&tp, 0, shadow, cap);
		for (int i = 0; i < N; i++)
			memcpy(shadow + y[i].peer_off, y[i].host, y[i].len);
		assert_int_equal(f->g->peer_write(t, p, y, N), 0);
		memset(arena, 0xee, 2 * half);
		memset(heap, 0xee, hsz);
		tpeer_get(&tp, 0, out, cap);
		assert_memory_equal(out, shadow, cap);
		assert_int_equal(f->g->peer_read(t, p, y, N), 0);
		memset(hshadow, 0xee, hall);
		for (int i = 0; i < N; i++) {
			unsigned char *h = y[i].host;
			uint64_t o = h >= heap && h < heap + hsz ?
				     2 * half + (uint64_t)(h - heap) :
				     (uint64_t)(h - arena);

			memcpy(hshadow + o, shadow + y[i].peer_off,
			       y[i].len);
		}
		assert_memory_equal(arena, hshadow, 2 * half);
		assert_memory_equal(heap, hshadow + 2 * half, hsz);
	}
	f->g->peer_close(t, p);
	tpeer_destroy(&tp);
	t->ops->free(t, &px);
	kvfs_tier_free(f->t);
	f->t = NULL;
	d->ops->free(d, &dx);
	kvfs_tier_free(d);
	free(heap);
	free(shadow);
	free(out);
	free(hshadow);
}

/*
 * shm: registration changes nothing, and copies count neither direct nor
 * staged bytes.
 */
static void test_shm_register_noop(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t, *d;
	struct kvfs_extent dx, px;
	struct kvfs_gpu_xfer x;
	unsigned char *out = xmalloc(PG);
	void *b;
	uint64_t len;

	if (backend != B_SHM) {
		print_message("shm-only test skipped\n");
		free(out);
		skip();
	}
	assert_int_equal(kvfs_tier_dram_init_flags(MiB, KVFS_DRAM_ARENA, &d),
			 0);
	assert_int_equal(kvfs_tier_dram_region(d, &b, &len), 0);
	assert_int_equal(f->g->host_register(t, b, len), 0);
	assert_int_equal(d->ops->alloc(d, PG, &dx), 0);
	assert_int_equal(t->ops->alloc(t, PG, &px), 0);
	pat(dx.ptr, PG, 11);
	x = (struct kvfs_gpu_xfer){ .pool = &px, .host = dx.ptr, .len = PG };
	assert_int_equal(f->g->upload(t, &x, 1), 0);
	assert_int_equal(t->ops->read(t, &px, 0, out, PG), 0);
	assert_true(is_pat(out, PG, 11));
	assert_int_equal(ld(&t->st.direct_bytes), 0);
	assert_int_equal(ld(&t->st.staged_bytes), 0);
	assert_int_equal(f->g->host_unregister(t, b), 0);
	t->ops->free(t, &px);
	d->ops->free(d, &dx);
	kvfs_tier_free(d);
	free(out);
}

/* ---- device ops ---- */

static void test_describe(void **state)
{
	struct fx *f = *state;
	struct kvfs_ctl_mem m;
	static const uint8_t zero[sizeof(m.ipc)];

	memset(&m, 0xa5, sizeof(m));
	f->g->describe(f->t, &m);
	assert_int_equal(m.size, POOL_CAP);
	if (backend == B_SHM) {
		assert_int_equal(m.backend, KVFS_CTL_BACKEND_SHM);
		assert_int_equal(m.device, 0);
		assert_int_equal(m.shm_name[0], '/');
		assert_non_null(memchr(m.shm_name, 0, sizeof(m.shm_name)));
		assert_non_null(strstr(m.shm_name, "/kvfs-test"));
		assert_memory_equal(m.ipc, zero, sizeof(zero));
	} else {
		assert_int_equal(m.backend, KVFS_CTL_BACKEND_CUDA);
		assert_int_equal(m.device, 0);
		assert_int_equal(m.shm_name[0], 0);
		assert_memory_not_equal(m.ipc, zero, sizeof(zero));
	}
	assert_ptr_equal(kvfs_gpu_ops_of(f->t), f->g);
}

static void test_ops_of(void **state)
{
	struct kvfs_tier *d;

	assert_null(kvfs_gpu_ops_of(NULL));
	assert_int_equal(kvfs_tier_dram_init(1 * MiB, &d), 0);
	assert_null(kvfs_gpu_ops_of(d));
	kvfs_tier_free(d);
}

/* A client maps the pool by what describe() says and sees the bytes. */
static void test_client_maps_pool(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e[2];
	struct kvfs_ctl_mem m;
	unsigned char *buf = xmalloc(3 * PG);
	char hex[2 * sizeof(m) + 1], offs[32], lens[32];
	char *args[] = { "x", "--client", hex, offs, lens, "31", NULL };

	assert_int_equal(t->ops->alloc(t, PG, &e[0]), 0);
	assert_int_equal(t->ops->alloc(t, 3 * PG, &e[1]), 0);
	pat(buf, 3 * PG - 5, 31);
	assert_int_equal(t->ops->write(t, &e[1], 5, buf, 3 * PG - 5), 0);
	f->g->describe(t, &m);
	hex_enc(&m, sizeof(m), hex);
	snprintf(offs, sizeof(offs), "%" PRIu64, e[1].off + 5);
	snprintf(lens, sizeof(lens), "%" PRIu64, (uint64_t)3 * PG - 5);
	assert_int_equal(run_self(args), 0);
	/* The check can fail: another seed differs. */
	args[5] = "32";
	assert_int_equal(run_self(args), 1);
	t->ops->free(t, &e[0]);
	t->ops->free(t, &e[1]);
	free(buf);
}

static void test_peer_open(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct tpeer tp;
	struct kvfs_ctl_mem m;
	struct kvfs_gpu_peer *p = NULL, *q = NULL;

	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(f->g->peer_size(p), PEER_SIZE);
	/* A smaller view of the same memory is fine. */
	m = tp.m;
	m.size = PG;
	assert_int_equal(f->g->peer_open(t, &m, &q), 0);
	assert_int_equal(f->g->peer_size(q), PG);
	f->g->peer_close(t, q);
	f->g->peer_close(t, p);
	f->g->peer_close(t, NULL);

	assert_int_equal(f->g->peer_open(t, NULL, &p), -EINVAL);
	m = tp.m;
	m.backend = backend == B_SHM ? KVFS_CTL_BACKEND_CUDA :
				       KVFS_CTL_BACKEND_SHM;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m.backend = 0;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m.backend = 77;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m = tp.m;
	m.size = 0;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	/* More than the memory has. */
	m = tp.m;
	m.size = PEER_SIZE + PG;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	m.size = UINT64_MAX;
	assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);

	if (backend == B_SHM) {
		static const char *bad[] = { "", "/", "noslash", "/a/b",
					     "//x", "x/" };

		m = tp.m;
		strcpy(m.shm_name, "/kvfs-no-such-peer");
		assert_int_equal(f->g->peer_open(t, &m, &p), -ENOENT);
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			m = tp.m;
			strcpy(m.shm_name, bad[i]);
			assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		}
		m = tp.m;
		memset(m.shm_name + 1, 'a', sizeof(m.shm_name) - 1);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		/* The pool itself is no peer. */
		f->g->describe(t, &m);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	} else {
		m = tp.m;
		m.device = 7;
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		m = tp.m;
		for (size_t i = 0; i < sizeof(m.ipc); i++)
			m.ipc[i] = (uint8_t)(i * 37 + 11);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
		f->g->describe(t, &m);
		assert_int_equal(f->g->peer_open(t, &m, &p), -EINVAL);
	}
	/* After all that, the good handle still opens. */
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	f->g->peer_close(t, p);
	tpeer_destroy(&tp);
}

static void test_peer_write(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e;
	struct kvfs_gpu_peer *p;
	struct tpeer tp;
	unsigned char *h1 = xmalloc(10000), *h2 = xmalloc(PG);
	unsigned char *z = calloc(1, PEER_SIZE);
	struct kvfs_gpu_xfer x[5];
	uint64_t r0, rb0;

	assert_non_null(z);
	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	tpeer_fill(&tp, 0, z, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	pat(z, 8 * PG, 11);
	assert_int_equal(t->ops->write(t, &e, 0, z, 8 * PG), 0);
	pat(h1, 10000, 12);
	pat(h2, PG, 13);

	/* From the pool, from host memory, mixed, to scattered places. */
	x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = 4 * PG };
	x[1] = (struct kvfs_gpu_xfer){ .host = h1, .peer_off = 100000,
				       .len = 10000 };
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 4 * PG + 3,
				       .peer_off = PEER_SIZE - (4 * PG - 3),
				       .len = 4 * PG - 3 };
	x[3] = (struct kvfs_gpu_xfer){ .host = h2, .peer_off = 50 * PG,
				       .len = PG };
	x[4] = (struct kvfs_gpu_xfer){ .host = NULL, .peer_off = 7,
				       .len = 0 };
	r0 = ld(&t->st.reads);
	rb0 = ld(&t->st.bytes_read);
	assert_int_equal(f->g->peer_write(t, p, x, 5), 0);
	assert_int_equal(ld(&t->st.reads) - r0, 5);
	assert_int_equal(ld(&t->st.bytes_read) - rb0,
			 4 * PG + 10000 + 4 * PG - 3 + PG);

	tpeer_get(&tp, 0, z, PEER_SIZE);
	{
		unsigned char *want = calloc(1, PEER_SIZE);
		unsigned char *pool = xmalloc(8 * PG);

		assert_non_null(want);
		pat(pool, 8 * PG, 11);
		memcpy(want, pool, 4 * PG);
		memcpy(want + 100000, h1, 10000);
		memcpy(want + PEER_SIZE - (4 * PG - 3), pool + 4 * PG + 3,
		       4 * PG - 3);
		memcpy(want + 50 * PG, h2, PG);
		assert_memory_equal(z, want, PEER_SIZE);
		free(want);
		free(pool);
	}
	assert_int_equal(f->g->peer_write(t, p, x, 0), 0);
	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	tpeer_destroy(&tp);
	free(h1);
	free(h2);
	free(z);
}

static void test_peer_read(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e;
	struct kvfs_gpu_peer *p;
	struct tpeer tp;
	unsigned char *src = xmalloc(PEER_SIZE), *h = xmalloc(3 * PG + 1);
	unsigned char *buf = xmalloc(8 * PG);
	struct kvfs_gpu_xfer x[3];
	uint64_t w0, wb0;

	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	pat(src, PEER_SIZE, 21);
	tpeer_fill(&tp, 0, src, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 8 * PG), 0);
	memset(h, 0, 3 * PG + 1);

	x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG,
				       .peer_off = 12345, .len = 5 * PG };
	x[1] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = PEER_SIZE -
							    (3 * PG + 1),
				       .len = 3 * PG + 1 };
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 7 * PG,
				       .peer_off = 0, .len = 10 };
	w0 = ld(&t->st.writes);
	wb0 = ld(&t->st.bytes_written);
	assert_int_equal(f->g->peer_read(t, p, x, 3), 0);
	assert_int_equal(ld(&t->st.writes) - w0, 3);
	assert_int_equal(ld(&t->st.bytes_written) - wb0,
			 5 * PG + 3 * PG + 1 + 10);
	assert_memory_equal(h, src + PEER_SIZE - (3 * PG + 1), 3 * PG + 1);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 8 * PG), 0);
	{
		unsigned char *want = calloc(1, 8 * PG);

		assert_non_null(want);
		memcpy(want + PG, src + 12345, 5 * PG);
		memcpy(want + 7 * PG, src, 10);
		assert_memory_equal(buf, want, 8 * PG);
		free(want);
	}
	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	tpeer_destroy(&tp);
	free(src);
	free(h);
	free(buf);
}

/* Every bad range refuses the whole batch before a byte moves. */
static void test_out_of_range(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	struct kvfs_extent e, forged;
	struct kvfs_gpu_peer *p, *other;
	struct kvfs_tier *t2;
	struct tpeer tp;
	unsigned char *z = calloc(1, PEER_SIZE), *h = xmalloc(2 * PG);
	unsigned char *buf = xmalloc(4 * PG);
	struct kvfs_gpu_xfer good, bad[7], x[2];
	uint64_t r0, w0;

	assert_non_null(z);
	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	tpeer_fill(&tp, 0, z, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 4 * PG, &e), 0);
	pat(buf, 4 * PG, 41);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 4 * PG), 0);
	pat(h, 2 * PG, 42);
	forged = (struct kvfs_extent){ .off = POOL_CAP, .len = PG };

	good = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = 2 * PG };
	bad[0] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = PEER_SIZE - 1,
					 .len = 2 };
	bad[1] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = UINT64_MAX,
					 .len = 1 };
	bad[2] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = 1,
					 .len = UINT64_MAX };
	bad[3] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 3 * PG + 1,
					 .peer_off = 0, .len = PG };
	bad[4] = (struct kvfs_gpu_xfer){ .pool = &forged, .off = 0,
					 .peer_off = 0, .len = 1 };
	bad[5] = (struct kvfs_gpu_xfer){ .host = NULL, .peer_off = 0,
					 .len = 1 };
	bad[6] = (struct kvfs_gpu_xfer){ .pool = &e, .off = UINT64_MAX,
					 .peer_off = 0, .len = 2 };
	r0 = ld(&t->st.reads);
	w0 = ld(&t->st.writes);
	for (int i = 0; i < 7; i++) {
		x[0] = good;
		x[1] = bad[i];
		assert_int_equal(f->g->peer_write(t, p, x, 2), -EINVAL);
		/* peer_read: the good one would land in the pool */
		x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0,
					       .peer_off = 100, .len = 2 * PG };
		assert_int_equal(f->g->peer_read(t, p, x, 2), -EINVAL);
	}
	x[0] = good;
	x[1] = bad[0];
	x[1].peer_off = PEER_SIZE - 2;
	assert_int_equal(f->g->peer_write(t, p, x, 2), 0); /* just fits */
	assert_int_equal(ld(&t->st.reads) - r0, 2);
	assert_int_equal(ld(&t->st.writes), w0);
	assert_int_equal(f->g->peer_write(t, p, NULL, 1), -EINVAL);
	assert_int_equal(f->g->peer_write(t, NULL, &good, 1), -EINVAL);

	/* Only the last successful batch reached the peer or the pool. */
	memset(z, 0, PEER_SIZE);
	memcpy(z, buf, 2 * PG);
	memcpy(z + PEER_SIZE - 2, h, 2);
	{
		unsigned char *got = xmalloc(PEER_SIZE);

		tpeer_get(&tp, 0, got, PEER_SIZE);
		assert_memory_equal(got, z, PEER_SIZE);
		free(got);
	}
	memset(buf, 0, 4 * PG);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 4 * PG), 0);
	assert_true(is_pat(buf, 4 * PG, 41));

	/* A peer opened by another tier is refused. */
	assert_int_equal(tier_make(POOL_CAP, &t2), 0);
	assert_int_equal(kvfs_gpu_ops_of(t2)->peer_open(t2, &tp.m, &other), 0);
	x[0] = good;
	assert_int_equal(f->g->peer_write(t, other, x, 1), -EINVAL);
	kvfs_gpu_ops_of(t2)->peer_close(t2, other);
	kvfs_tier_free(t2);

	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	tpeer_destroy(&tp);
	free(z);
	free(h);
	free(buf);
}

/* ---- overlapping destinations ---- */

static char ov_log[64];

/* Send log lines to a file of this process's, for log_has(). */
static void log_capture(void)
{
	snprintf(ov_log, sizeof(ov_log), "/tmp/kvfs-test-gpu-tier-%ld.log",
		 (long)getpid());
	unlink(ov_log);
	assert_int_equal(kvfs_log_open(ov_log), 0);
}

/* Back to stderr; whether the captured lines contain @needle. */
static bool log_has(const char *needle)
{
	char buf[8192];
	ssize_t n;
	int fd;

	kvfs_log_close();
	fd = open(ov_log, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	unlink(ov_log);
	assert_true(n >= 0);
	buf[n] = 0;
	return strstr(buf, needle) != NULL;
}

/* The whole peer holds @want. */
static bool tpeer_equal(struct tpeer *tp, const unsigned char *want)
{
	unsigned char *got = xmalloc(PEER_SIZE);
	bool same;

	tpeer_get(tp, 0, got, PEER_SIZE);
	same = !memcmp(got, want, PEER_SIZE);
	free(got);
	return same;
}

/*
 * A batch that would write a byte twice is refused whole, by both
 * backends alike: cuda issues pool-side copies before host-side ones, shm
 * copies in array order, so the bytes left in an overlap would differ.
 * Only destinations count: peer ranges for peer_write; pool ranges and
 * host ranges (each among themselves) for peer_read, whose peer ranges
 * are sources and may overlap.
 */
static void test_overlap(void **state)
{
	struct fx *f = *state;
	struct kvfs_tier *t = f->t;
	const uint64_t nb = 1024, bl = 64;
	struct kvfs_extent e;
	struct kvfs_gpu_peer *p;
	struct tpeer tp;
	unsigned char *want = calloc(1, PEER_SIZE), *h = xmalloc(4 * PG);
	unsigned char *h2 = xmalloc(4 * PG), *buf = xmalloc(8 * PG);
	unsigned char *big = xmalloc(nb * bl);
	struct kvfs_gpu_xfer x[3], *v = calloc(nb, sizeof(*v));
	uint64_t r0, w0, *perm = calloc(nb, sizeof(*perm));
	unsigned seed = 7;

	assert_non_null(want);
	assert_non_null(v);
	assert_non_null(perm);
	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	tpeer_fill(&tp, 0, want, PEER_SIZE);
	assert_int_equal(f->g->peer_open(t, &tp.m, &p), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &e), 0);
	pat(buf, 8 * PG, 51);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 8 * PG), 0);
	pat(h, 4 * PG, 52);
	r0 = ld(&t->st.reads);
	w0 = ld(&t->st.writes);

	/* peer_write: a pool-side and a host-side transfer into [PG, 2PG)
	 * (the order cuda changes).
	 */
	x[0] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = 2 * PG };
	x[1] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = PG,
				       .len = 2 * PG };
	log_capture();
	assert_int_equal(f->g->peer_write(t, p, x, 2), -EINVAL);
	assert_true(log_has("transfers 0 and 1 of 2 write overlapping peer "
			    "ranges"));
	/* One byte, out of order; the pair is named in array order. */
	x[0] = (struct kvfs_gpu_xfer){ .host = h, .peer_off = 10 * PG,
				       .len = PG };
	x[1] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG, .peer_off = 0,
				       .len = PG };
	x[2] = (struct kvfs_gpu_xfer){ .host = h + PG, .peer_off = 9 * PG + 1,
				       .len = PG };
	log_capture();
	assert_int_equal(f->g->peer_write(t, p, x, 3), -EINVAL);
	assert_true(log_has("transfers 0 and 2 of 3 write overlapping peer"));
	/* Its last byte, from above. */
	x[2].peer_off = 11 * PG - 1;
	assert_int_equal(f->g->peer_write(t, p, x, 3), -EINVAL);
	assert_true(tpeer_equal(&tp, want));
	assert_int_equal(ld(&t->st.reads), r0);

	/* Touching ranges, and an empty transfer at a used offset: fine. */
	x[2].peer_off = 11 * PG;
	x[1].peer_off = 10 * PG + 5;
	x[1].len = 0;
	assert_int_equal(f->g->peer_write(t, p, x, 3), 0);
	memcpy(want + 10 * PG, h, PG);
	memcpy(want + 11 * PG, h + PG, PG);
	assert_true(tpeer_equal(&tp, want));

	/* A large shuffled batch: accepted, every piece where it was sent;
	 * then one piece moved onto its neighbour's last byte: refused.
	 */
	pat(big, nb * bl, 53);
	for (uint64_t i = 0; i < nb; i++)
		perm[i] = i;
	for (uint64_t i = nb - 1; i > 0; i--) {
		uint64_t j = (uint64_t)rand_r(&seed) % (i + 1), tmp = perm[i];

		perm[i] = perm[j];
		perm[j] = tmp;
	}
	for (uint64_t i = 0; i < nb; i++) {
		v[i] = (struct kvfs_gpu_xfer){ .host = big + i * bl,
					       .peer_off = 64 * PG +
							   perm[i] * bl,
					       .len = bl };
		memcpy(want + 64 * PG + perm[i] * bl, big + i * bl, bl);
	}
	assert_int_equal(f->g->peer_write(t, p, v, nb), 0);
	assert_true(tpeer_equal(&tp, want));
	r0 = ld(&t->st.reads);
	v[500].peer_off = v[700].peer_off + bl - 1;
	pat(big, nb * bl, 54);
	assert_int_equal(f->g->peer_write(t, p, v, nb), -EINVAL);
	assert_true(tpeer_equal(&tp, want));
	assert_int_equal(ld(&t->st.reads), r0);

	/* peer_read: two host destinations sharing bytes, then two pool
	 * ones; nothing written to either.
	 */
	memset(h2, 0x3c, 4 * PG);
	x[0] = (struct kvfs_gpu_xfer){ .host = h2, .peer_off = 0,
				       .len = PG };
	x[1] = (struct kvfs_gpu_xfer){ .pool = &e, .off = 0, .peer_off = 0,
				       .len = PG };
	x[2] = (struct kvfs_gpu_xfer){ .host = h2 + PG / 2,
				       .peer_off = 10 * PG, .len = PG };
	log_capture();
	assert_int_equal(f->g->peer_read(t, p, x, 3), -EINVAL);
	assert_true(log_has("transfers 0 and 2 of 3 write overlapping host"));
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG - 1,
				       .peer_off = 10 * PG, .len = 2 * PG };
	log_capture();
	assert_int_equal(f->g->peer_read(t, p, x, 3), -EINVAL);
	assert_true(log_has("transfers 1 and 2 of 3 write overlapping pool"));
	for (unsigned i = 0; i < 4 * PG; i++)
		assert_int_equal(h2[i], 0x3c);
	memset(buf, 0, 8 * PG);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 8 * PG), 0);
	assert_true(is_pat(buf, 8 * PG, 51));
	assert_int_equal(ld(&t->st.writes), w0);

	/* Overlapping sources, disjoint destinations: fine. The pool and
	 * the host are different memory, so equal offsets do not clash.
	 */
	pat(want, 2 * PG, 55);
	tpeer_fill(&tp, 0, want, 2 * PG);
	x[2] = (struct kvfs_gpu_xfer){ .pool = &e, .off = PG,
				       .peer_off = PG / 2, .len = PG };
	x[0].len = PG / 2;
	assert_int_equal(f->g->peer_read(t, p, x, 3), 0);
	assert_memory_equal(h2, want, PG / 2);
	assert_int_equal(t->ops->read(t, &e, 0, buf, 2 * PG), 0);
	assert_memory_equal(buf, want, PG);
	assert_memory_equal(buf + PG, want + PG / 2, PG);

	f->g->peer_close(t, p);
	t->ops->free(t, &e);
	tpeer_destroy(&tp);
	free(want);
	free(h);
	free(h2);
	free(buf);
	free(big);
	free(v);
	free(perm);
}

/* ---- threads ---- */

struct thr {
	struct fx *f;
	struct tpeer *tp;
	int id;
	int fail; /* line of the first failed check, 0 if none */
};

#define THR_CHECK(c)                    \
	do {                            \
		if (!(c)) {             \
			a->fail = __LINE__; \
			goto out;       \
		}                       \
	} while (0)

#define THR_REGION (PEER_SIZE / NTHREADS)
#define THR_ROUNDS 25

static void *thr_main(void *arg)
{
	struct thr *a = arg;
	struct kvfs_tier *t = a->f->t;
	const struct kvfs_gpu_ops *g = a->f->g;
	uint64_t len = THR_REGION / 2 + (uint64_t)a->id * 1000;
	unsigned char *src = malloc(len), *dst = malloc(len);
	struct kvfs_gpu_peer *p = NULL;
	struct kvfs_extent e = { 0 };
	bool have_e = false;

	THR_CHECK(src && dst);
	THR_CHECK(g->peer_open(t, &a->tp->m, &p) == 0);
	for (int r = 0; r < THR_ROUNDS; r++) {
		uint64_t seed = (uint64_t)a->id * 1000 + (uint64_t)r;
		uint64_t po = (uint64_t)a->id * THR_REGION + (uint64_t)r;
		uint64_t half = len / 2;
		struct kvfs_gpu_xfer up[2] = {
			{ .pool = &e, .host = src, .off = 0, .len = half },
			{ .pool = &e, .host = src + half, .off = half,
			  .len = len - half },
		};
		struct kvfs_gpu_xfer out = { .pool = &e, .off = 0,
					     .peer_off = po, .len = len };
		struct kvfs_gpu_xfer back = { .host = dst, .peer_off = po,
					      .len = len };

		THR_CHECK(t->ops->alloc(t, len, &e) == 0);
		have_e = true;
		pat(src, len, seed);
		THR_CHECK(g->upload(t, up, 2) == 0);
		THR_CHECK(g->peer_write(t, p, &out, 1) == 0);
		memset(dst, 0, len);
		THR_CHECK(g->peer_read(t, p, &back, 1) == 0);
		THR_CHECK(is_pat(dst, len, seed));
		memset(dst, 0, len);
		THR_CHECK(t->ops->read(t, &e, 0, dst, len) == 0);
		THR_CHECK(is_pat(dst, len, seed));
		t->ops->free(t, &e);
		have_e = false;
	}
out:
	if (have_e)
		t->ops->free(t, &e);
	if (p)
		g->peer_close(t, p);
	free(src);
	free(dst);
	return NULL;
}

static void test_threads(void **state)
{
	struct fx *f = *state;
	struct tpeer tp;
	pthread_t th[NTHREADS];
	struct thr a[NTHREADS];

	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	for (int i = 0; i < NTHREADS; i++) {
		a[i] = (struct thr){ .f = f, .tp = &tp, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, thr_main, &a[i]),
				 0);
	}
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		if (a[i].fail)
			fail_msg("thread %d failed at line %d", i, a[i].fail);
	}
	/* Each thread's last round is what its region holds. */
	for (int i = 0; i < NTHREADS; i++) {
		uint64_t len = THR_REGION / 2 + (uint64_t)i * 1000;
		uint64_t po = (uint64_t)i * THR_REGION + THR_ROUNDS - 1;

		assert_true(tpeer_is(&tp, po, len,
				     (uint64_t)i * 1000 + THR_ROUNDS - 1));
	}
	assert_int_equal(ld(&f->t->used), 0);
	tpeer_destroy(&tp);
}

/* ---- init and backend-specific ---- */

static void test_shm_init_args(void **state)
{
	struct kvfs_tier *t = (struct kvfs_tier *)0x1, *t2;
	char name[80], longname[80];
	int fd;

	assert_int_equal(kvfs_gpu_shm_init(NULL, MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("", MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/", MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("noslash", MiB, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/a/b", MiB, 0, &t), -EINVAL);
	memset(longname, 'a', sizeof(longname));
	longname[0] = '/';
	longname[70] = 0;
	assert_int_equal(kvfs_gpu_shm_init(longname, MiB, 0, &t), -EINVAL);
	/* 60 bytes fit alone, not with a private suffix. */
	longname[60] = 0;
	assert_int_equal(kvfs_gpu_shm_init(longname, MiB, KVFS_GPU_PRIVATE,
					   &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", 0, KVFS_GPU_PRIVATE,
					   &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", PG - 1,
					   KVFS_GPU_PRIVATE, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", MiB, 1u << 7, &t),
			 -EINVAL);
	assert_ptr_equal(t, (struct kvfs_tier *)0x1);

	/* An exact name (and the owner's uid): created once, taken while it
	 * lives, gone after.
	 */
	snprintf(name, sizeof(name), "/kvfs-test-excl-%ld", (long)getpid());
	assert_int_equal(kvfs_gpu_shm_init(name, 3 * PG + 5, 0, &t), 0);
	assert_int_equal(t->capacity, 3 * PG);
	assert_int_equal(kvfs_gpu_shm_init(name, MiB, 0, &t2), -EEXIST);
	{
		struct kvfs_ctl_mem m;

		kvfs_gpu_ops_of(t)->describe(t, &m);
		snprintf(name, sizeof(name), "/kvfs-test-excl-%ld-%u",
			 (long)getpid(), (unsigned)getuid());
		assert_string_equal(m.shm_name, name);
	}
	fd = shm_open(name, O_RDONLY, 0);
	assert_true(fd >= 0);
	{
		struct stat sb;

		assert_int_equal(fstat(fd, &sb), 0);
		assert_int_equal(sb.st_size, 3 * PG);
		assert_int_equal(sb.st_mode & 0777, 0600);
	}
	close(fd);
	kvfs_tier_free(t);
	assert_true(shm_open(name, O_RDONLY, 0) < 0);
	assert_int_equal(errno, ENOENT);

	/* Private pools of one prefix get distinct names. */
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", MiB, KVFS_GPU_PRIVATE,
					   &t), 0);
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-t", MiB, KVFS_GPU_PRIVATE,
					   &t2), 0);
	{
		struct kvfs_ctl_mem m1, m2;

		kvfs_gpu_ops_of(t)->describe(t, &m1);
		kvfs_gpu_ops_of(t2)->describe(t2, &m2);
		assert_string_not_equal(m1.shm_name, m2.shm_name);
	}
	kvfs_tier_free(t);
	kvfs_tier_free(t2);
}

/* Bytes of shm object @name that have pages (st_blocks). */
static uint64_t shm_backed(const char *name)
{
	struct stat sb;
	int fd = shm_open(name, O_RDONLY, 0);

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	close(fd);
	return (uint64_t)sb.st_blocks * 512;
}

/*
 * shm, one owner: a freed extent keeps its pages (the one object cannot
 * outgrow the capacity), so the next FETCH into it does not allocate and
 * zero them again; the bytes a later block writes are its own.
 */
static void test_shm_one_owner_keeps_pages(void **state)
{
	const uint64_t cap = 32 * PG;
	struct kvfs_extent a, b;
	struct kvfs_ctl_mem m;
	struct kvfs_tier *t;
	unsigned char *buf = xmalloc(8 * PG), *got = xmalloc(8 * PG);

	(void)state;
	if (backend != B_SHM) {
		free(buf);
		free(got);
		skip();
	}
	assert_int_equal(kvfs_gpu_shm_init("/kvfs-test", cap,
					   KVFS_GPU_PRIVATE, &t), 0);
	kvfs_gpu_ops_of(t)->describe(t, &m);
	assert_true(shm_backed(m.shm_name) == 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &a), 0);
	pat(buf, 8 * PG, 7);
	assert_int_equal(t->ops->write(t, &a, 0, buf, 8 * PG), 0);
	assert_true(shm_backed(m.shm_name) >= 8 * PG);
	t->ops->free(t, &a);
	assert_int_equal(t->used, 0);
	assert_true(shm_backed(m.shm_name) >= 8 * PG);
	/* The same range again: its new bytes, and no more pages. */
	assert_int_equal(t->ops->alloc(t, 8 * PG, &b), 0);
	assert_int_equal(b.off, a.off);
	pat(buf, 8 * PG, 9);
	assert_int_equal(t->ops->write(t, &b, 0, buf, 8 * PG), 0);
	assert_int_equal(t->ops->read(t, &b, 0, got, 8 * PG), 0);
	assert_true(is_pat(got, 8 * PG, 9));
	assert_true(shm_backed(m.shm_name) <= 9 * PG);
	t->ops->free(t, &b);
	kvfs_tier_free(t);
	free(buf);
	free(got);
}

static int owners_make(uint64_t cap, const struct kvfs_gpu_owners *o,
		       struct kvfs_tier **t)
{
	if (backend == B_CUDA)
		return kvfs_gpu_cuda_init_owners(0, cap, 0, o, t);
	return kvfs_gpu_shm_init_owners("/kvfs-test", cap, KVFS_GPU_PRIVATE, o,
					t);
}

/*
 * One pool per owner: distinct objects (shm: of the owner's uid, mode
 * 0600) or allocations, offsets relative to each pool, a client of one
 * pool sees that pool's bytes only, and one capacity shared by all.
 */
static void test_owner_pools(void **state)
{
	uint32_t me = (uint32_t)getuid();
	uint32_t uid[3] = { me, me + 1001, me + 1002 };
	struct kvfs_gpu_owners o = { .uid = uid, .n = 3 };
	const uint64_t cap = 48 * PG;
	const uint64_t psize = backend == B_SHM ? cap : 16 * PG;
	const struct kvfs_gpu_ops *g;
	struct kvfs_extent a, b, c, x, y;
	struct kvfs_ctl_mem m[3], md;
	struct kvfs_tier *t;
	unsigned char *buf = xmalloc(2 * PG), *got = xmalloc(2 * PG);
	char hex[2 * sizeof(md) + 1], offs[32] = "0", lens[32];
	char *args[] = { "x", "--client", hex, offs, lens, "41", NULL };

	assert_int_equal(owners_make(cap, &o, &t), 0);
	g = kvfs_gpu_ops_of(t);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(g->describe_owner(t, uid[i], &m[i]), 0);
		assert_int_equal(m[i].size, psize);
	}
	assert_int_equal(g->describe_owner(t, me + 5, &md), -ENOENT);
	g->describe(t, &md);
	assert_memory_equal(&md, &m[0], sizeof(md));
	if (backend == B_SHM) {
		assert_string_not_equal(m[0].shm_name, m[1].shm_name);
		assert_string_not_equal(m[1].shm_name, m[2].shm_name);
	} else {
		assert_memory_not_equal(m[0].ipc, m[1].ipc, sizeof(m[0].ipc));
		assert_memory_not_equal(m[1].ipc, m[2].ipc, sizeof(m[0].ipc));
	}

	/* Each owner's first extent is at offset 0 of its own pool. */
	assert_int_equal(t->ops->alloc(t, PG, &a), 0);
	assert_int_equal(g->alloc_owner(t, uid[1], 2 * PG, &b), 0);
	assert_int_equal(g->alloc_owner(t, uid[2], 2 * PG, &c), 0);
	assert_int_equal(a.pool, 0);
	assert_int_equal(b.pool, 1);
	assert_int_equal(c.pool, 2);
	assert_int_equal(a.off | b.off | c.off, 0);
	assert_int_equal(g->alloc_owner(t, me + 5, PG, &x), -ENOENT);
	assert_int_equal(g->alloc_owner(t, uid[1], 0, &x), -EINVAL);
	assert_int_equal(t->used, 5 * PG);

	/* The same offset in two pools is two places. */
	pat(buf, 2 * PG, 41);
	assert_int_equal(t->ops->write(t, &b, 0, buf, 2 * PG), 0);
	pat(buf, 2 * PG, 42);
	assert_int_equal(g->upload(t, &(struct kvfs_gpu_xfer){
					       .pool = &c, .host = buf,
					       .len = 2 * PG }, 1), 0);
	assert_int_equal(t->ops->read(t, &b, 0, got, 2 * PG), 0);
	assert_true(is_pat(got, 2 * PG, 41));
	assert_int_equal(t->ops->read(t, &c, 0, got, 2 * PG), 0);
	assert_true(is_pat(got, 2 * PG, 42));

	/* A client mapping an owner's pool finds that owner's bytes at the
	 * offset it was given, and not the other's.
	 */
	snprintf(lens, sizeof(lens), "%" PRIu64, (uint64_t)2 * PG);
	hex_enc(&m[1], sizeof(m[1]), hex);
	assert_int_equal(run_self(args), 0);
	hex_enc(&m[2], sizeof(m[2]), hex);
	assert_int_equal(run_self(args), 1);
	args[5] = "42";
	assert_int_equal(run_self(args), 0);

	if (backend == B_SHM) {
		for (int i = 0; i < 3; i++) {
			struct stat sb;
			int fd = shm_open(m[i].shm_name, O_RDONLY, 0);

			assert_true(fd >= 0);
			assert_int_equal(fstat(fd, &sb), 0);
			close(fd);
			assert_int_equal(sb.st_mode & 0777, 0600);
			assert_int_equal(sb.st_size, cap);
			if (geteuid() == 0)
				assert_int_equal(sb.st_uid, uid[i]);
			/* Sparse: only what was handed out is backed. */
			assert_true((uint64_t)sb.st_blocks * 512 <= 2 * PG);
		}
		/* One capacity for every pool. */
		assert_int_equal(g->alloc_owner(t, uid[1], cap - 5 * PG, &x),
				 0);
		assert_int_equal(t->used, cap);
		assert_int_equal(g->alloc_owner(t, uid[2], PG, &y), -ENOSPC);
		assert_true(shm_backed(m[1].shm_name) >= cap - 3 * PG);
		t->ops->free(t, &x);
		/* With several owners a free gives its pages back, so the
		 * objects together hold no more than the capacity.
		 */
		assert_true(shm_backed(m[1].shm_name) <= 2 * PG);
		assert_int_equal(g->alloc_owner(t, uid[2], PG, &y), 0);
		t->ops->free(t, &y);
	} else {
		/* Each owner's allocation is its own: one full leaves the
		 * others their room.
		 */
		assert_int_equal(g->alloc_owner(t, uid[1], psize - 2 * PG,
						&x), 0);
		assert_int_equal(g->alloc_owner(t, uid[1], PG, &y), -ENOSPC);
		assert_int_equal(g->alloc_owner(t, uid[2], PG, &y), 0);
		t->ops->free(t, &x);
		t->ops->free(t, &y);
	}
	assert_int_equal(g->alloc_owner(t, uid[0], psize + PG, &x), -ENOSPC);

	/* An extent naming no pool is refused, never served. */
	x = a;
	x.pool = 7;
	assert_int_equal(t->ops->write(t, &x, 0, buf, PG), -EINVAL);
	assert_int_equal(t->ops->read(t, &x, 0, got, PG), -EINVAL);
	t->ops->free(t, &x);
	assert_int_equal(t->used, 5 * PG);

	t->ops->free(t, &a);
	t->ops->free(t, &b);
	t->ops->free(t, &c);
	assert_int_equal(t->used, 0);
	kvfs_tier_free(t);
	if (backend == B_SHM)
		for (int i = 0; i < 3; i++) {
			assert_true(shm_open(m[i].shm_name, O_RDONLY, 0) < 0);
			assert_int_equal(errno, ENOENT);
		}

	/* Owner lists: one uid twice, none, too many. */
	uid[1] = me;
	assert_int_equal(owners_make(cap, &o, &t), -EINVAL);
	o.n = 0;
	assert_int_equal(owners_make(cap, &o, &t), -EINVAL);
	o.n = KVFS_GPU_OWNERS_MAX + 1;
	assert_int_equal(owners_make(cap, &o, &t), -EINVAL);
	free(buf);
	free(got);
}

/* A start removes the pools daemons of its store left when they died. */
static void test_shm_sweep(void **state)
{
	char prefix[40], dead[64], mine[64], live[64], other[64];
	const char *keep[] = { mine, live, other };
	int status, fd;
	pid_t pid;

	if (backend != B_SHM)
		skip();
	pid = fork();
	assert_true(pid >= 0);
	if (!pid)
		_exit(0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	snprintf(prefix, sizeof(prefix), "/kvfs-sweep%ld-", (long)getpid());
	snprintf(dead, sizeof(dead), "%s%ld-pool-0", prefix, (long)pid);
	snprintf(mine, sizeof(mine), "%s%ld-pool-0", prefix, (long)getpid());
	snprintf(live, sizeof(live), "%s1-pool", prefix);
	snprintf(other, sizeof(other), "%s%ld-other", prefix, (long)pid);
	for (int i = 0; i < 4; i++) {
		fd = shm_open(i ? keep[i - 1] : dead, O_CREAT | O_RDWR, 0600);
		assert_true(fd >= 0);
		close(fd);
	}
	assert_int_equal(kvfs_gpu_shm_sweep(prefix), 1);
	assert_true(shm_open(dead, O_RDONLY, 0) < 0);
	for (int i = 0; i < 3; i++) {
		fd = shm_open(keep[i], O_RDONLY, 0);
		assert_true(fd >= 0);
		close(fd);
		shm_unlink(keep[i]);
	}
	assert_int_equal(kvfs_gpu_shm_sweep("nope"), -EINVAL);
}

/* Here, without KVFS_TEST_GPU=cuda: the cuda backend must say why not. */
static void test_cuda_absent(void **state)
{
	struct kvfs_tier *t = (struct kvfs_tier *)0x1;
	int err;

	if (backend == B_CUDA) {
		print_message("cuda backend selected: absence not tested\n");
		skip();
	}
#ifdef KVFS_HAVE_CUDA
	{
		int count = 0;

		if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
			print_message("a CUDA device is visible: run make "
				      "test-gpu\n");
			skip();
		}
	}
	err = kvfs_gpu_cuda_init(0, MiB, 0, &t);
	assert_int_equal(err, -ENODEV);
	assert_int_equal(kvfs_gpu_cuda_init(-1, MiB, 0, &t), -ENODEV);
#else
	err = kvfs_gpu_cuda_init(0, MiB, 0, &t);
	assert_int_equal(err, -EOPNOTSUPP);
#endif
	assert_ptr_equal(t, (struct kvfs_tier *)0x1);
}

static void test_cuda_init_args(void **state)
{
	struct kvfs_tier *t = (struct kvfs_tier *)0x1;

	if (backend != B_CUDA) {
		print_message("cuda-only test skipped (KVFS_TEST_GPU=cuda)\n");
		skip();
	}
	assert_int_equal(kvfs_gpu_cuda_init(0, 0, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_cuda_init(0, PG - 1, 0, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_cuda_init(0, MiB, 1u << 7, &t), -EINVAL);
	assert_int_equal(kvfs_gpu_cuda_init(-1, MiB, 0, &t), -ENODEV);
	assert_int_equal(kvfs_gpu_cuda_init(4096, MiB, 0, &t), -ENODEV);
	assert_ptr_equal(t, (struct kvfs_tier *)0x1);
	assert_int_equal(kvfs_gpu_cuda_init(0, 3 * PG + 1, 0, &t), 0);
	assert_int_equal(t->capacity, 3 * PG);
	kvfs_tier_free(t);
}

/* cuda: one handle opened twice maps once (the handle cache). */
static void test_cuda_handle_cache(void **state)
{
	struct fx *f = *state;
	struct kvfs_gpu_peer *p, *q;
	struct kvfs_gpu_xfer x;
	struct tpeer tp;
	unsigned char *buf = xmalloc(PG);

	if (backend != B_CUDA) {
		print_message("cuda-only test skipped (KVFS_TEST_GPU=cuda)\n");
		free(buf);
		skip();
	}
	assert_int_equal(tpeer_create(&tp, PEER_SIZE), 0);
	for (int round = 0; round < 3; round++) {
		assert_int_equal(f->g->peer_open(f->t, &tp.m, &p), 0);
		assert_int_equal(f->g->peer_open(f->t, &tp.m, &q), 0);
		pat(buf, PG, 60 + round);
		x = (struct kvfs_gpu_xfer){ .host = buf, .peer_off = PG,
					    .len = PG };
		assert_int_equal(f->g->peer_write(f->t, p, &x, 1), 0);
		memset(buf, 0, PG);
		assert_int_equal(f->g->peer_read(f->t, q, &x, 1), 0);
		assert_true(is_pat(buf, PG, 60 + round));
		f->g->peer_close(f->t, p);
		f->g->peer_close(f->t, q);
	}
	tpeer_destroy(&tp);
	free(buf);
}

/* ---- the other roles of this program ---- */

static int client_main(char **argv)
{
	struct kvfs_ctl_mem m;
	uint64_t off, len, seed;
	unsigned char *buf;
	int same;

	if (hex_dec(argv[2], &m, sizeof(m)) ||
	    sscanf(argv[3], "%" SCNu64, &off) != 1 ||
	    sscanf(argv[4], "%" SCNu64, &len) != 1 ||
	    sscanf(argv[5], "%" SCNu64, &seed) != 1 || off > m.size ||
	    len > m.size - off)
		return 2;
	if (m.backend == KVFS_CTL_BACKEND_SHM) {
		/* Read-only, as a client: the object and the mapping. */
		int fd = shm_open(m.shm_name, O_RDONLY, 0);
		void *p;

		if (fd < 0)
			return 2;
		p = mmap(NULL, m.size, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (p == MAP_FAILED)
			return 2;
		same = is_pat((unsigned char *)p + off, len, seed);
		munmap(p, m.size);
		return same ? 0 : 1;
	}
#ifdef KVFS_HAVE_CUDA
	if (m.backend == KVFS_CTL_BACKEND_CUDA) {
		cudaIpcMemHandle_t h;
		void *d = NULL;

		memcpy(&h, m.ipc, sizeof(h));
		buf = malloc(len ? len : 1);
		if (!buf || cudaSetDevice((int)m.device) != cudaSuccess ||
		    cudaIpcOpenMemHandle(&d, h,
					 cudaIpcMemLazyEnablePeerAccess) !=
			    cudaSuccess ||
		    cudaMemcpy(buf, (unsigned char *)d + off, len,
			       cudaMemcpyDeviceToHost) != cudaSuccess)
			return 2;
		same = is_pat(buf, len, seed);
		cudaIpcCloseMemHandle(d);
		free(buf);
		return same ? 0 : 1;
	}
#endif
	(void)buf;
	return 2;
}

static int peer_server_main(char **argv)
{
#ifdef KVFS_HAVE_CUDA
	int rfd = atoi(argv[2]), wfd = atoi(argv[3]);
	uint64_t size = strtoull(argv[4], NULL, 10);
	struct kvfs_ctl_mem m = { 0 };
	cudaIpcMemHandle_t h;
	unsigned char *d = NULL;
	struct preq r;

	if (cudaSetDevice(0) != cudaSuccess ||
	    cudaMalloc((void **)&d, size) != cudaSuccess ||
	    cudaMemset(d, 0, size) != cudaSuccess ||
	    cudaIpcGetMemHandle(&h, d) != cudaSuccess) {
		write_full(wfd, &m, sizeof(m)); /* backend 0: failed */
		return 2;
	}
	m.backend = KVFS_CTL_BACKEND_CUDA;
	m.device = 0;
	m.size = size;
	memcpy(m.ipc, &h, sizeof(m.ipc));
	if (write_full(wfd, &m, sizeof(m)))
		return 2;
	while (!read_full(rfd, &r, sizeof(r))) {
		int32_t st = -1;
		unsigned char *buf;

		if (r.op == 'Q')
			break;
		if (r.off > size || r.len > size - r.off)
			return 2;
		buf = malloc(r.len ? r.len : 1);
		if (!buf)
			return 2;
		if (r.op == 'F') {
			if (read_full(rfd, buf, r.len))
				return 2;
			st = cudaMemcpy(d + r.off, buf, r.len,
					cudaMemcpyHostToDevice) ==
			     cudaSuccess ? 0 : -1;
			write_full(wfd, &st, sizeof(st));
		} else if (r.op == 'G') {
			st = cudaMemcpy(buf, d + r.off, r.len,
					cudaMemcpyDeviceToHost) ==
			     cudaSuccess ? 0 : -1;
			write_full(wfd, &st, sizeof(st));
			if (!st)
				write_full(wfd, buf, r.len);
		}
		free(buf);
	}
	cudaFree(d);
	return 0;
#else
	return 2;
#endif
}

int main(int argc, char **argv)
{
	const char *env = getenv("KVFS_TEST_GPU");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shm_init_args),
		cmocka_unit_test(test_owner_pools),
		cmocka_unit_test(test_shm_one_owner_keeps_pages),
		cmocka_unit_test(test_shm_sweep),
		cmocka_unit_test(test_cuda_absent),
		cmocka_unit_test(test_cuda_init_args),
		cmocka_unit_test(test_ops_of),
		cmocka_unit_test_setup_teardown(test_alloc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_write_read, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_forged_extent, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_upload, setup, teardown),
		cmocka_unit_test_setup_teardown(test_extent_addr, setup,
						teardown),
		cmocka_unit_test(test_large_batch),
		cmocka_unit_test_setup_teardown(test_describe, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_client_maps_pool, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_peer_open, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_peer_write, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_peer_read, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_out_of_range, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cuda_handle_cache, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_host_register, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_direct_copies, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_shm_register_noop, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_mixed_batches, setup,
						teardown),
	};

	if (argc == 6 && !strcmp(argv[1], "--client"))
		return client_main(argv);
	if (argc == 5 && !strcmp(argv[1], "--peer-server"))
		return peer_server_main(argv);
	if (env && !strcmp(env, "cuda")) {
		backend = B_CUDA;
	} else if (env && *env && strcmp(env, "shm")) {
		fprintf(stderr, "KVFS_TEST_GPU=%s: want shm or cuda\n", env);
		return 1;
	}
	/* A dead peer server must fail a test, not kill the program. */
	signal(SIGPIPE, SIG_IGN);
	kvfs_log_set_level(KVFS_LOG_WARN);
	return cmocka_run_group_tests_name(backend == B_CUDA ? "gpu_tier/cuda" :
							       "gpu_tier/shm",
					   tests, NULL, NULL);
}
