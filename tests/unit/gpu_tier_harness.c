/* SPDX-License-Identifier: MIT */
/*
 * The harness of the device tier suite (gpu_tier_i.h): byte patterns,
 * the tier under test and its fixtures, test peers, and the roles this
 * program plays when a test runs it again (a client mapping the pool, a
 * cuda peer server).
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
#include "meta/util.h"
#include "tests/unit/gpu_tier_i.h"

enum gt_backend gt_backend = B_SHM;
static atomic_uint name_seq;

/* ---- bytes ---- */

uint64_t gt_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Byte i of pattern @seed, for any i: misplaced or shifted bytes show. */
void gt_pat(void *buf, uint64_t len, uint64_t seed)
{
	unsigned char *p = buf;
	uint64_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t v = gt_mix(seed * 0x100000001b3ull + i / 8);

		memcpy(p + i, &v, 8);
	}
	if (i < len) {
		uint64_t v = gt_mix(seed * 0x100000001b3ull + i / 8);

		memcpy(p + i, &v, len - i);
	}
}

bool gt_is_pat(const void *buf, uint64_t len, uint64_t seed)
{
	unsigned char *want = malloc(len ? len : 1);
	bool ok;

	if (!want)
		return false;
	gt_pat(want, len, seed);
	ok = !memcmp(buf, want, len);
	free(want);
	return ok;
}

void *gt_xmalloc(uint64_t len)
{
	void *p = malloc(len ? len : 1);

	assert_non_null(p);
	return p;
}

void gt_hex_enc(const void *buf, size_t len, char *out)
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
int gt_run_self(char **args)
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

int gt_tier_make(uint64_t cap, struct kvfs_tier **t)
{
	if (gt_backend == B_CUDA)
		return kvfs_gpu_cuda_init(0, cap, 0, t);
	return kvfs_gpu_shm_init("/kvfs-test", cap, KVFS_GPU_PRIVATE, t);
}

int gt_setup(void **state)
{
	struct gt_fx *f = calloc(1, sizeof(*f));
	int err;

	if (!f)
		return -1;
	err = gt_tier_make(POOL_CAP, &f->t);
	if (err) {
		fprintf(stderr, "cannot make a %s tier: %s\n",
			gt_backend == B_CUDA ? "cuda" : "shm", strerror(-err));
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

int gt_teardown(void **state)
{
	struct gt_fx *f = *state;

	/* NULL when a test freed the tier itself */
	kvfs_tier_free(f->t);
	free(f);
	gt_peer_reap();
	return 0;
}

/* ---- test peers: client memory, with a back door to check it ---- */

struct preq {
	uint32_t op;  /* 'F' fill, 'G' get, 'Q' quit */
	uint32_t pad;
	uint64_t off, len;
};

int gt_peer_create(struct gt_peer *p, uint64_t size)
{
	memset(p, 0, sizeof(*p));
	p->pid = -1;
	p->to = p->from = -1;
	if (gt_backend == B_SHM) {
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
		if (kvfs_util_read_full(p->from, &p->m, sizeof(p->m), -1) ||
		    p->m.backend != KVFS_CTL_BACKEND_CUDA)
			return -1;
		return 0;
	}
}

void gt_peer_fill(struct gt_peer *p, uint64_t off, const void *buf,
		       uint64_t len)
{
	struct preq r = { .op = 'F', .off = off, .len = len };
	int32_t st = -1;

	assert_true(off <= p->m.size && len <= p->m.size - off);
	if (gt_backend == B_SHM) {
		memcpy(p->mem + off, buf, len);
		return;
	}
	assert_int_equal(kvfs_util_write_full(p->to, &r, sizeof(r), -1), 0);
	assert_int_equal(kvfs_util_write_full(p->to, buf, len, -1), 0);
	assert_int_equal(kvfs_util_read_full(p->from, &st, sizeof(st), -1), 0);
	assert_int_equal(st, 0);
}

void gt_peer_get(struct gt_peer *p, uint64_t off, void *buf, uint64_t len)
{
	struct preq r = { .op = 'G', .off = off, .len = len };
	int32_t st = -1;

	assert_true(off <= p->m.size && len <= p->m.size - off);
	if (gt_backend == B_SHM) {
		memcpy(buf, p->mem + off, len);
		return;
	}
	assert_int_equal(kvfs_util_write_full(p->to, &r, sizeof(r), -1), 0);
	assert_int_equal(kvfs_util_read_full(p->from, &st, sizeof(st), -1), 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvfs_util_read_full(p->from, buf, len, -1), 0);
}

/* Whether peer bytes [off, off + len) are pattern @seed from offset 0. */
bool gt_peer_is(struct gt_peer *p, uint64_t off, uint64_t len,
		     uint64_t seed)
{
	unsigned char *buf = gt_xmalloc(len);
	bool ok;

	gt_peer_get(p, off, buf, len);
	ok = gt_is_pat(buf, len, seed);
	free(buf);
	return ok;
}

/*
 * cuda servers whose memory may still be mapped here: the tier caches
 * opened IPC handles until the last tier is freed, and CUDA leaves
 * freeing exported memory that an importer still maps undefined.
 */
static struct gt_peer dead_peers[64];
static unsigned n_dead_peers;

static void tpeer_stop(struct gt_peer *p)
{
	if (p->to >= 0) {
		struct preq r = { .op = 'Q' };

		kvfs_util_write_full(p->to, &r, sizeof(r), -1);
		close(p->to);
	}
	if (p->from >= 0)
		close(p->from);
	if (p->pid > 0)
		waitpid(p->pid, NULL, 0);
}

/* Stop the servers of destroyed peers; call with no tier left. */
void gt_peer_reap(void)
{
	while (n_dead_peers)
		tpeer_stop(&dead_peers[--n_dead_peers]);
}

void gt_peer_destroy(struct gt_peer *p)
{
	if (gt_backend == B_SHM) {
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

/* ---- the other roles of this program ---- */

int gt_client_main(char **argv)
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
		same = gt_is_pat((unsigned char *)p + off, len, seed);
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
		same = gt_is_pat(buf, len, seed);
		cudaIpcCloseMemHandle(d);
		free(buf);
		return same ? 0 : 1;
	}
#endif
	(void)buf;
	return 2;
}

int gt_peer_server_main(char **argv)
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
		kvfs_util_write_full(wfd, &m, sizeof(m), -1); /* backend 0: failed */
		return 2;
	}
	m.backend = KVFS_CTL_BACKEND_CUDA;
	m.device = 0;
	m.size = size;
	memcpy(m.ipc, &h, sizeof(m.ipc));
	if (kvfs_util_write_full(wfd, &m, sizeof(m), -1))
		return 2;
	while (!kvfs_util_read_full(rfd, &r, sizeof(r), -1)) {
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
			if (kvfs_util_read_full(rfd, buf, r.len, -1))
				return 2;
			st = cudaMemcpy(d + r.off, buf, r.len,
					cudaMemcpyHostToDevice) ==
			     cudaSuccess ? 0 : -1;
			kvfs_util_write_full(wfd, &st, sizeof(st), -1);
		} else if (r.op == 'G') {
			st = cudaMemcpy(buf, d + r.off, r.len,
					cudaMemcpyDeviceToHost) ==
			     cudaSuccess ? 0 : -1;
			kvfs_util_write_full(wfd, &st, sizeof(st), -1);
			if (!st)
				kvfs_util_write_full(wfd, buf, r.len, -1);
		}
		free(buf);
	}
	cudaFree(d);
	return 0;
#else
	return 2;
#endif
}
