/* SPDX-License-Identifier: MIT */
/*
 * Drives .kvfs/ctl of a live mount through the raw ABI (meta/kvfs_ctl.h).
 * Run by test_ctl.sh, which mounts kvfs with KVFS_MNT and KVFS_NS set; the
 * namespace geometry is read from the mount.  The device tier is shm, or
 * cuda with KVFS_TEST_GPU=cuda: then the pool is read through its IPC
 * handle and the caller's "device memory" is cudaMalloc'ed, as an engine's
 * would be (make test-gpu, or the cudart stand-in of tests/gpu/cudaemu.c).
 *
 * The device pool holds exactly 6 test blocks, so pressure is easy to make.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/kvfs_ctl.h"
#include "meta/fmt.h"
#include "dev_region_i.h"

static const char *mnt, *ns;
static char ctl_path[4096];
static struct kvfs_geom g;
static uint8_t root[16];

/* ------------------------------------------------------------- blocks */

struct chain {
	int n;
	uint8_t key[8][16];
	uint32_t tok[8][64];
	uint8_t *img[8];
	uint64_t size, poff, plen;
};

/* Write chain @seed of @n full blocks as files; remember keys and bytes. */
static void chain_write(struct chain *c, int seed, int n)
{
	uint8_t parent[16];
	char path[4200], hex[33];

	memset(c, 0, sizeof(*c));
	c->n = n;
	c->size = kvfs_fmt_file_size(&g, KVFS_KIND_KV, g.block_tokens);
	c->poff = kvfs_fmt_payload_off(g.block_tokens);
	c->plen = c->size - c->poff;
	memcpy(parent, root, 16);
	for (int i = 0; i < n; i++) {
		uint8_t *pay = malloc(c->plen);
		int fd;

		assert_non_null(pay);
		for (uint32_t t = 0; t < g.block_tokens; t++)
			c->tok[i][t] = (uint32_t)(seed * 100000 + i * 100 + t);
		for (uint64_t b = 0; b < c->plen; b++)
			pay[b] = (uint8_t)(b * 31 + (uint64_t)seed * 7 + i);
		c->img[i] = malloc(c->size);
		assert_non_null(c->img[i]);
		assert_int_equal(kvfs_fmt_build(&g, KVFS_KIND_KV, parent,
						(uint64_t)i * g.block_tokens,
						c->tok[i], g.block_tokens, pay,
						c->img[i], c->size),
				 0);
		free(pay);
		memcpy(c->key[i], c->img[i] + 64, 16);
		memcpy(parent, c->key[i], 16);
		kvfs_fmt_key_hex(c->key[i], hex);
		snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns, hex);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
		if (fd < 0 && errno == EEXIST)
			continue;
		assert_true(fd >= 0);
		assert_int_equal(write(fd, c->img[i], c->size),
				 (ssize_t)c->size);
		assert_int_equal(close(fd), 0);
	}
}

static void chain_free(struct chain *c)
{
	for (int i = 0; i < c->n; i++)
		free(c->img[i]);
}

/* ---------------------------------------------------------- transport */

static int ctl_open(void)
{
	int fd = open(ctl_path, O_RDWR | O_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

static void req_init(struct kvfs_ctl_msg *m, int op, uint32_t nkeys)
{
	memset(m, 0, sizeof(*m));
	m->req.magic = KVFS_CTL_MAGIC;
	m->req.abi = KVFS_CTL_ABI;
	m->req.op = (uint16_t)op;
	snprintf(m->req.ns, sizeof(m->req.ns), "%s", ns);
	m->req.n_keys = nkeys;
	m->req.size = (uint32_t)(sizeof(m->req) + 16 * nkeys);
}

static uint8_t (*req_keys(struct kvfs_ctl_msg *m))[16]
{
	return (void *)(m->bytes + sizeof(m->req));
}

static void put_keys(struct kvfs_ctl_msg *m, const struct chain *c, int from,
		     int n)
{
	for (int i = 0; i < n; i++)
		memcpy(req_keys(m)[i], c->key[from + i], 16);
}

static struct kvfs_ctl_block *resp_blk(struct kvfs_ctl_msg *m)
{
	return (void *)(m->bytes + sizeof(m->resp));
}

/* ioctl; returns the response's error (the transport must succeed). */
static int call(int fd, struct kvfs_ctl_msg *m)
{
	int op = m->req.op;

	assert_int_equal(ioctl(fd, KVFS_IOC(op), m), 0);
	assert_int_equal(m->resp.magic, KVFS_CTL_MAGIC);
	assert_int_equal(m->resp.op, op);
	return m->resp.error;
}

static uint64_t stat_leases(int fd, uint64_t *total, uint64_t *pool_blocks)
{
	struct kvfs_ctl_msg m;

	req_init(&m, KVFS_CTL_STATS, 0);
	assert_int_equal(call(fd, &m), 0);
	if (total)
		*total = m.resp.stats.leases_total;
	if (pool_blocks)
		*pool_blocks = m.resp.stats.pool_blocks;
	return m.resp.stats.leases;
}

static uint64_t hits_of(const struct chain *c, int i)
{
	char path[4200], hex[33], v[32] = { 0 };

	kvfs_fmt_key_hex(c->key[i], hex);
	snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns, hex);
	assert_true(getxattr(path, "user.kvfs.hits", v, sizeof(v) - 1) > 0);
	return strtoull(v, NULL, 10);
}

/* -------------------------------------------------------------- tests */

static void test_lookup(void **state)
{
	struct kvfs_ctl_msg m;
	struct chain c;
	int fd = ctl_open();
	uint64_t h0;

	chain_write(&c, 1, 4);
	req_init(&m, KVFS_CTL_LOOKUP, 6);
	put_keys(&m, &c, 0, 4);
	memset(req_keys(&m)[4], 0xab, 32); /* two unknown keys */
	h0 = hits_of(&c, 0);
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(m.resp.n_cached, 4);
	assert_int_equal(m.resp.n_blocks, 6);
	for (int i = 0; i < 4; i++) {
		assert_memory_equal(resp_blk(&m)[i].key, c.key[i], 16);
		assert_true(resp_blk(&m)[i].tiers & (1u << 1)); /* dram */
		assert_int_equal(resp_blk(&m)[i].n_tokens, g.block_tokens);
	}
	assert_int_equal(resp_blk(&m)[4].tiers, 0);
	/* A plain lookup is not an access... */
	assert_int_equal(hits_of(&c, 0), h0);
	/* ...unless asked. */
	req_init(&m, KVFS_CTL_LOOKUP, 4);
	put_keys(&m, &c, 0, 4);
	m.req.flags = KVFS_CTL_F_ACCESS;
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(hits_of(&c, 0), h0 + 1);

	/* By token ids: the daemon chains the keys itself. */
	req_init(&m, KVFS_CTL_LOOKUP, 0);
	m.req.flags = KVFS_CTL_F_TOKENS;
	m.req.n_tokens = 4 * g.block_tokens;
	m.req.size = (uint32_t)(sizeof(m.req) + 4 * m.req.n_tokens);
	for (int i = 0; i < 4; i++)
		memcpy((uint32_t *)req_keys(&m) + i * g.block_tokens, c.tok[i],
		       4 * g.block_tokens);
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(m.resp.n_cached, 4);
	assert_memory_equal(resp_blk(&m)[3].key, c.key[3], 16);
	close(fd);
	chain_free(&c);
}

/* FETCH, then read the pool as a client would and compare the payloads. */
static void fetch_check(int fd, const struct chain *c, int from, int n)
{
	struct kvfs_ctl_msg m;
	uint8_t *buf = malloc(c->plen);

	assert_non_null(buf);
	req_init(&m, KVFS_CTL_FETCH, (uint32_t)n);
	put_keys(&m, c, from, n);
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(m.resp.pool.backend, dev_backend);
	assert_int_equal(m.resp.n_blocks, n);
	for (int i = 0; i < n; i++) {
		const struct kvfs_ctl_block *b = &resp_blk(&m)[i];

		assert_int_equal(b->len, c->plen);
		assert_int_equal(b->layer_bytes, c->plen / g.n_layers);
		assert_true(b->tiers & 1u); /* gpu */
		pool_get(&m.resp.pool, b->pool_off, buf, c->plen);
		assert_memory_equal(buf, c->img[from + i] + c->poff, c->plen);
	}
	free(buf);
}

static void release_all(int fd)
{
	struct kvfs_ctl_msg m;

	req_init(&m, KVFS_CTL_RELEASE, 0);
	assert_int_equal(call(fd, &m), 0);
}

static void test_fetch_release(void **state)
{
	struct chain c;
	int fd = ctl_open();
	uint64_t pool_blocks, again;

	chain_write(&c, 2, 4);
	fetch_check(fd, &c, 0, 4);
	assert_int_equal(stat_leases(fd, NULL, &pool_blocks), 4);
	/* Fetching again loads nothing new: one copy per block. */
	fetch_check(fd, &c, 0, 4);
	assert_int_equal(stat_leases(fd, NULL, &again), 8);
	assert_int_equal(again, pool_blocks);
	release_all(fd);
	assert_int_equal(stat_leases(fd, NULL, NULL), 0);
	close(fd);
	chain_free(&c);
}

/* The pool holds 6 blocks: 4 leased leave room for 2. */
static void test_lease_blocks_eviction(void **state)
{
	struct kvfs_ctl_msg m;
	struct chain a, b;
	int fd = ctl_open();

	chain_write(&a, 3, 4);
	chain_write(&b, 4, 4);
	fetch_check(fd, &a, 0, 4);
	req_init(&m, KVFS_CTL_FETCH, 4);
	put_keys(&m, &b, 0, 4);
	assert_int_equal(call(fd, &m), -ENOSPC);
	/* The failed fetch took nothing. */
	assert_int_equal(stat_leases(fd, NULL, NULL), 4);
	/* Released, A can be evicted and B fits. */
	release_all(fd);
	fetch_check(fd, &b, 0, 4);
	req_init(&m, KVFS_CTL_LOOKUP, 4);
	put_keys(&m, &a, 0, 4);
	assert_int_equal(call(fd, &m), 0);
	int in_pool = 0;
	for (int i = 0; i < 4; i++)
		in_pool += resp_blk(&m)[i].tiers & 1u;
	assert_true(in_pool <= 2);
	release_all(fd);
	close(fd);
	chain_free(&a);
	chain_free(&b);
}

/* A client that exits, or is killed, without releasing: its leases are
 * back by the time waitpid returns (FLUSH runs during the exit).
 */
static void test_exit_frees_leases(void **state)
{
	struct chain a;
	uint64_t total;
	int fd = ctl_open();

	chain_write(&a, 5, 5);
	for (int kill_it = 0; kill_it < 2; kill_it++) {
		pid_t pid = fork();
		int status;

		assert_true(pid >= 0);
		if (pid == 0) {
			int cfd = open(ctl_path, O_RDWR);
			struct kvfs_ctl_msg m;

			req_init(&m, KVFS_CTL_FETCH, 5);
			put_keys(&m, &a, 0, 5);
			if (cfd < 0 || ioctl(cfd, KVFS_IOC_FETCH, &m) ||
			    m.resp.error)
				_exit(1);
			if (kill_it)
				raise(SIGKILL);
			_exit(0);
		}
		assert_int_equal(waitpid(pid, &status, 0), pid);
		if (kill_it)
			assert_true(WIFSIGNALED(status));
		else
			assert_int_equal(WEXITSTATUS(status), 0);
		stat_leases(fd, &total, NULL);
		assert_int_equal(total, 0);
	}
	/* And the pool is usable again for someone else. */
	fetch_check(fd, &a, 0, 5);
	release_all(fd);
	close(fd);
	chain_free(&a);
}

struct fetcher {
	const struct chain *c;
	uint64_t off[4];
	int rc;
};

static void *fetch_thread(void *arg)
{
	struct fetcher *f = arg;
	struct kvfs_ctl_msg m;
	int fd = open(ctl_path, O_RDWR);

	req_init(&m, KVFS_CTL_FETCH, 4);
	for (int i = 0; i < 4; i++)
		memcpy(req_keys(&m)[i], f->c->key[i], 16);
	f->rc = fd < 0 || ioctl(fd, KVFS_IOC_FETCH, &m) ? -errno : m.resp.error;
	for (int i = 0; i < 4 && !f->rc; i++)
		f->off[i] = resp_blk(&m)[i].pool_off;
	if (fd >= 0)
		close(fd);
	return NULL;
}

static void test_concurrent_fetchers_one_copy(void **state)
{
	struct fetcher f[4];
	pthread_t t[4];
	struct chain c;
	uint64_t before, after;
	int fd = ctl_open();

	chain_write(&c, 6, 4);
	stat_leases(fd, NULL, &before);
	for (int i = 0; i < 4; i++) {
		f[i].c = &c;
		assert_int_equal(
			pthread_create(&t[i], NULL, fetch_thread, &f[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(f[i].rc, 0);
		assert_memory_equal(f[i].off, f[0].off, sizeof(f[0].off));
	}
	stat_leases(fd, NULL, &after);
	assert_true(after <= 6);
	close(fd);
	chain_free(&c);
}

/* ---------------------------------------------------------- FETCH_INTO */

struct waiter {
	volatile uint32_t *word;
	struct dev_region *peer;
	const struct chain *c;
	int ok_layers; /* layers seen complete with the right bytes */
	int monotonic;
};

/* The engine's compute thread: wait for each layer, then use it. */
static void *wait_layers(void *arg)
{
	struct waiter *w = arg;
	uint64_t lb = w->c->plen / g.n_layers;
	uint32_t seen = 0;

	w->monotonic = 1;
	for (uint32_t l = 0; l < g.n_layers; l++) {
		uint32_t v;

		while ((v = __atomic_load_n(w->word, __ATOMIC_ACQUIRE)) <= l) {
			if (v & KVFS_CTL_SYNC_FAILED)
				return NULL;
			syscall(SYS_futex, w->word, FUTEX_WAIT, v, NULL, NULL,
				0);
		}
		if (v < seen)
			w->monotonic = 0;
		seen = v;
		for (int i = 0; i < w->c->n; i++)
			if (!dev_equal(w->peer,
				       (uint64_t)i * w->c->plen + l * lb,
				       w->c->img[i] + w->c->poff + l * lb, lb))
				return NULL;
		w->ok_layers++;
	}
	return NULL;
}

static void fill_into(struct kvfs_ctl_msg *m, const struct chain *c,
		      const struct dev_region *peer,
		      const struct shm_region *sync)
{
	struct kvfs_ctl_dst *dst;

	req_init(m, KVFS_CTL_FETCH_INTO, (uint32_t)c->n);
	put_keys(m, c, 0, c->n);
	m->req.n_dst = (uint32_t)c->n;
	m->req.size += (uint32_t)(8 * c->n);
	dst = (void *)(req_keys(m) + c->n);
	for (int i = 0; i < c->n; i++)
		dst[i].off = (uint64_t)i * c->plen;
	dev_peer(peer, &m->req.peer);
	snprintf(m->req.sync.shm_name, sizeof(m->req.sync.shm_name), "%s",
		 sync->name);
	m->req.sync.off = 64;
}

static void test_fetch_into_per_layer(void **state)
{
	struct dev_region peer;
	struct shm_region sync;
	struct kvfs_ctl_msg m;
	struct waiter w = { 0 };
	struct chain c;
	pthread_t t;
	int fd = ctl_open();

	chain_write(&c, 7, 3);
	dev_make(&peer, "peer", 3 * c.plen);
	shm_make(&sync, "sync", 4096);
	w.word = (uint32_t *)(sync.p + 64);
	w.peer = &peer;
	w.c = &c;
	assert_int_equal(pthread_create(&t, NULL, wait_layers, &w), 0);
	fill_into(&m, &c, &peer, &sync);
	assert_int_equal(call(fd, &m), 0);
	pthread_join(t, NULL);
	assert_int_equal(*w.word, g.n_layers);
	assert_int_equal(w.ok_layers, g.n_layers);
	assert_true(w.monotonic);
	for (int i = 0; i < 3; i++)
		assert_true(dev_equal(&peer, (uint64_t)i * c.plen,
				      c.img[i] + c.poff, c.plen));
	/* the copy's temporary leases are gone */
	assert_int_equal(stat_leases(fd, NULL, NULL), 0);

	/* A destination past the end of the caller's memory. */
	fill_into(&m, &c, &peer, &sync);
	((struct kvfs_ctl_dst *)(req_keys(&m) + 3))[2].off = 3 * c.plen - 8;
	assert_int_equal(call(fd, &m), -EINVAL);
	/* A handle of another backend. */
	fill_into(&m, &c, &peer, &sync);
	m.req.peer.backend = dev_backend == KVFS_CTL_BACKEND_SHM ?
				     KVFS_CTL_BACKEND_CUDA :
				     KVFS_CTL_BACKEND_SHM;
	assert_int_equal(call(fd, &m), -EINVAL);
	/* A peer that does not exist: a name nobody made, a foreign
	 * handle.
	 */
	fill_into(&m, &c, &peer, &sync);
	snprintf(m.req.peer.shm_name, sizeof(m.req.peer.shm_name),
		 "/kvfs-test-nonexistent");
	memset(m.req.peer.ipc, 0x5a, sizeof(m.req.peer.ipc));
	assert_true(call(fd, &m) < 0);
	dev_drop(&peer);
	shm_drop(&sync);
	close(fd);
	chain_free(&c);
}

/*
 * FETCH_INTO's per-layer completion as a CUDA engine sees it: a stream of
 * the client's own waits on the completion word (cuStreamWaitValue32 on
 * the word's page, registered with the device) before it touches each
 * layer. The stream is queued before the request goes out and must still
 * be blocked then; once the request returns, what it copied out layer by
 * layer must be the blocks' bytes, not the poison the destination held.
 * Only with cuda and a driver that offers stream memory operations (the
 * cudart stand-in does not: the test then says so and passes).
 */
#ifdef KVFS_HAVE_CUDA
typedef int (*wait_value32_fn)(cudaStream_t stream, unsigned long long addr,
			       uint32_t value, unsigned int flags);
#define WAIT_VALUE_GEQ 0x0 /* CU_STREAM_WAIT_VALUE_GEQ */
#endif

static void test_fetch_into_stream_wait(void **state)
{
#ifdef KVFS_HAVE_CUDA
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
	wait_value32_fn wait_value32 = NULL;
	struct dev_region peer;
	struct shm_region sync;
	struct kvfs_ctl_msg m;
	struct chain c;
	cudaStream_t s;
	cudaEvent_t first;
	uint8_t *out, *dword = NULL;
	uint64_t lb;
	int fd;

	if (dev_backend != KVFS_CTL_BACKEND_CUDA) {
		printf("# stream wait: the shm backend has no streams\n");
		return;
	}
	assert_int_equal(cudaGetDriverEntryPointByVersion(
				 "cuStreamWaitValue32", (void **)&wait_value32,
				 12000, cudaEnableDefault, &q),
			 cudaSuccess);
	if (q != cudaDriverEntryPointSuccess || !wait_value32) {
		printf("# stream wait: this runtime has no "
		       "cuStreamWaitValue32, not run\n");
		return;
	}
	fd = ctl_open();
	chain_write(&c, 13, 3);
	lb = c.plen / g.n_layers;
	dev_make(&peer, "swpeer", 3 * c.plen);
	dev_fill(&peer, 0xa5);
	shm_make(&sync, "swsync", 4096);
	assert_int_equal(cudaHostRegister(sync.p, 4096,
					  cudaHostRegisterMapped |
						  cudaHostRegisterPortable),
			 cudaSuccess);
	assert_int_equal(cudaHostGetDevicePointer((void **)&dword, sync.p, 0),
			 cudaSuccess);
	assert_int_equal(cudaHostAlloc((void **)&out, 3 * c.plen,
				       cudaHostAllocDefault),
			 cudaSuccess);
	memset(out, 0, 3 * c.plen);
	assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
			 cudaSuccess);
	assert_int_equal(cudaEventCreate(&first), cudaSuccess);
	for (uint32_t l = 0; l < g.n_layers; l++) {
		assert_int_equal(
			wait_value32(
				s, (unsigned long long)(uintptr_t)(dword + 64),
				l + 1, WAIT_VALUE_GEQ),
			0);
		for (int i = 0; i < 3; i++)
			assert_int_equal(
				cudaMemcpyAsync(out + i * c.plen + l * lb,
						peer.d + i * c.plen + l * lb,
						lb, cudaMemcpyDeviceToHost, s),
				cudaSuccess);
		if (l == 0)
			assert_int_equal(cudaEventRecord(first, s),
					 cudaSuccess);
	}
	/* Nothing has been asked for yet: the stream must be waiting. */
	assert_int_equal(cudaEventQuery(first), cudaErrorNotReady);
	fill_into(&m, &c, &peer, &sync);
	m.req.sync.off = 64;
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
	assert_int_equal(*(volatile uint32_t *)(sync.p + 64), g.n_layers);
	for (int i = 0; i < 3; i++)
		assert_memory_equal(out + i * c.plen, c.img[i] + c.poff,
				    c.plen);
	cudaEventDestroy(first);
	cudaStreamDestroy(s);
	cudaFreeHost(out);
	cudaHostUnregister(sync.p);
	shm_drop(&sync);
	dev_drop(&peer);
	close(fd);
	chain_free(&c);
#endif
}

static uint64_t stat_fetch_into_bytes(int fd)
{
	struct kvfs_ctl_msg m;

	req_init(&m, KVFS_CTL_STATS, 0);
	assert_int_equal(call(fd, &m), 0);
	return m.resp.stats.fetch_into_bytes;
}

/* Whether block @i's file still holds the bytes chain_write() gave it. */
static bool file_intact(const struct chain *c, int i)
{
	char path[4200], hex[33];
	uint8_t *buf = malloc(c->size);
	bool same;
	int bfd;

	assert_non_null(buf);
	kvfs_fmt_key_hex(c->key[i], hex);
	snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns, hex);
	bfd = open(path, O_RDONLY);
	assert_true(bfd >= 0);
	same = read(bfd, buf, c->size) == (ssize_t)c->size &&
	       !memcmp(buf, c->img[i], c->size);
	close(bfd);
	free(buf);
	return same;
}

/*
 * Two blocks of one FETCH_INTO written to overlapping bytes of the
 * caller's memory: never meaningful, and which bytes would be left there
 * depends on the order of the copies, which differs between the device
 * backends. Refused with EINVAL before anything happens: the caller's
 * memory and completion word untouched, no lease left, nothing counted,
 * the blocks intact. Destinations that only touch, in any order, are
 * fine.
 */
static void test_fetch_into_overlap(void **state)
{
	struct dev_region peer;
	struct shm_region sync;
	struct kvfs_ctl_msg m;
	struct kvfs_ctl_dst *dst;
	struct chain c;
	volatile uint32_t *word;
	uint64_t total0, total, bytes0;
	uint8_t *poison;
	int fd = ctl_open();

	chain_write(&c, 11, 3);
	const uint64_t p = c.plen;
	/* dst of blocks 0, 1, 2 */
	const uint64_t bad[][3] = {
		{ 0, 0, 2 * p }, /* two blocks in one slot */
		{ 2 * p, 0, p + 1 }, /* one byte, out of order */
		{ p, 2 * p - 1, 0 }, /* one byte, the last block first */
	};

	dev_make(&peer, "overlap", 3 * p + 4096);
	shm_make(&sync, "osync", 4096);
	word = (uint32_t *)(sync.p + 64);
	poison = malloc(peer.len);
	assert_non_null(poison);
	memset(poison, 0xa5, peer.len);
	dev_fill(&peer, 0xa5);
	stat_leases(fd, &total0, NULL);
	bytes0 = stat_fetch_into_bytes(fd);
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		*word = 0xdeadbeef;
		fill_into(&m, &c, &peer, &sync);
		dst = (void *)(req_keys(&m) + c.n);
		for (int i = 0; i < 3; i++)
			dst[i].off = bad[k][i];
		assert_int_equal(call(fd, &m), -EINVAL);
		assert_int_equal(m.resp.n_blocks, 0);
		assert_true(dev_equal(&peer, 0, poison, peer.len));
		assert_int_equal(*word, 0xdeadbeef);
		assert_int_equal(stat_leases(fd, &total, NULL), 0);
		assert_int_equal(total, total0);
		assert_int_equal(stat_fetch_into_bytes(fd), bytes0);
	}
	for (int i = 0; i < 3; i++)
		assert_true(file_intact(&c, i));

	/* Touching, in reverse order: every block lands where asked. */
	fill_into(&m, &c, &peer, &sync);
	dst = (void *)(req_keys(&m) + c.n);
	for (int i = 0; i < 3; i++)
		dst[i].off = (uint64_t)(2 - i) * p;
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(*word, g.n_layers);
	for (int i = 0; i < 3; i++)
		assert_true(dev_equal(&peer, (uint64_t)(2 - i) * p,
				      c.img[i] + c.poff, p));
	assert_true(dev_equal(&peer, 3 * p, poison, 4096));
	assert_int_equal(stat_fetch_into_bytes(fd), bytes0 + 3 * p);
	assert_int_equal(stat_leases(fd, NULL, NULL), 0);

	/* One block twice, at two disjoint places: fine. */
	dev_fill(&peer, 0xa5);
	fill_into(&m, &c, &peer, &sync);
	memcpy(req_keys(&m)[2], c.key[0], 16);
	dst = (void *)(req_keys(&m) + c.n);
	dst[2].off = 2 * p + 4096;
	assert_int_equal(call(fd, &m), 0);
	assert_true(dev_equal(&peer, 0, c.img[0] + c.poff, p));
	assert_true(dev_equal(&peer, p, c.img[1] + c.poff, p));
	assert_true(dev_equal(&peer, 2 * p, poison, 4096));
	assert_true(dev_equal(&peer, 2 * p + 4096, c.img[0] + c.poff, p));
	assert_int_equal(stat_leases(fd, &total, NULL), 0);
	assert_int_equal(total, total0);
	free(poison);
	dev_drop(&peer);
	shm_drop(&sync);
	close(fd);
	chain_free(&c);
}

static void test_save_round_trip(void **state)
{
	struct dev_region peer;
	struct kvfs_ctl_msg m;
	struct chain c;
	char path[4200], hex[33];
	uint8_t *file, *kv;
	int fd = ctl_open(), bfd;
	uint8_t saved[16];

	chain_write(&c, 8, 1); /* geometry and an expected image */
	dev_make(&peer, "save", c.plen + 4096);
	/* the caller's KV, at offset 4096 of its memory */
	kv = malloc(c.plen);
	assert_non_null(kv);
	for (uint64_t b = 0; b < c.plen; b++)
		kv[b] = (uint8_t)(b * 13 + 5);
	dev_put(&peer, 4096, kv, c.plen);

	req_init(&m, KVFS_CTL_SAVE, 0);
	m.req.n_tokens = g.block_tokens;
	m.req.size += 4 * g.block_tokens;
	for (uint32_t t = 0; t < g.block_tokens; t++)
		((uint32_t *)req_keys(&m))[t] = 900000 + t;
	dev_peer(&peer, &m.req.peer);
	m.req.src_off = 4096;
	memcpy(m.req.parent, root, 16);
	struct kvfs_ctl_msg again = m;
	assert_int_equal(call(fd, &m), 0);
	memcpy(saved, m.resp.key, 16);

	/* The block is a file like any other, with the caller's bytes. */
	kvfs_fmt_key_hex(saved, hex);
	snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns, hex);
	file = malloc(c.size);
	bfd = open(path, O_RDONLY);
	assert_true(bfd >= 0);
	assert_int_equal(read(bfd, file, c.size), (ssize_t)c.size);
	close(bfd);
	assert_memory_equal(file + c.poff, kv, c.plen);
	assert_memory_equal(file + 64, saved, 16);
	free(file);

	/* Saving it twice: EEXIST. A payload range past the caller's
	 * memory: EINVAL, and nothing stored.
	 */
	m = again;
	assert_int_equal(call(fd, &m), -EEXIST);
	m = again;
	m.req.src_off = peer.len - 100;
	((uint32_t *)req_keys(&m))[0] = 12345;
	assert_int_equal(call(fd, &m), -EINVAL);
	dev_drop(&peer);
	free(kv);
	close(fd);
	chain_free(&c);
}

/* --------------------------------------------------------- bad input */

static void test_bad_input(void **state)
{
	struct kvfs_ctl_msg m;
	struct chain c;
	char path[4200], hex[33];
	int fd = ctl_open(), bfd;
	uint8_t big[sizeof(struct kvfs_ctl_req) + 64];

	chain_write(&c, 9, 1);
	/* malformed requests fail the transport itself with EINVAL */
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	m.req.magic = 0;
	assert_int_equal(ioctl(fd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, EINVAL);
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	m.req.abi = 99;
	assert_int_equal(ioctl(fd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, EINVAL);
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	m.req.size += 1; /* does not match the counts */
	assert_int_equal(ioctl(fd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, EINVAL);
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	m.req.reserved[3] = 1;
	assert_int_equal(ioctl(fd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, EINVAL);
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	m.req.flags = 1u << 20;
	assert_int_equal(ioctl(fd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, EINVAL);
	/* an op that differs from the ioctl number */
	req_init(&m, KVFS_CTL_FETCH, 1);
	assert_int_equal(ioctl(fd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, EINVAL);
	/* unknown ioctl numbers */
	assert_int_equal(ioctl(fd, KVFS_IOC(KVFS_CTL_OP_MAX + 1), &m), -1);
	assert_int_equal(errno, ENOTTY);
	assert_int_equal(ioctl(fd, _IOR('K', 0x41, int), &m), -1);
	/* ioctls on a block file are not control requests */
	kvfs_fmt_key_hex(c.key[0], hex);
	snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns, hex);
	bfd = open(path, O_RDONLY);
	assert_true(bfd >= 0);
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	assert_int_equal(ioctl(bfd, KVFS_IOC_LOOKUP, &m), -1);
	assert_int_equal(errno, ENOTTY);
	close(bfd);
	/* write transport: short and oversized requests */
	assert_int_equal(write(fd, "hello", 5), -1);
	assert_int_equal(errno, EINVAL);
	memset(big, 0, sizeof(big));
	assert_int_equal(write(fd, big, sizeof(big)), -1);
	assert_int_equal(errno, EINVAL);

	/* well-formed but impossible: an error in the response */
	req_init(&m, KVFS_CTL_LOOKUP, 1);
	snprintf(m.req.ns, sizeof(m.req.ns), "no-such-namespace");
	assert_int_equal(call(fd, &m), -ENOENT);
	req_init(&m, KVFS_CTL_FETCH, 1);
	memset(req_keys(&m)[0], 0x5a, 16);
	assert_int_equal(call(fd, &m), -ENOENT);
	req_init(&m, KVFS_CTL_PIN, 1);
	put_keys(&m, &c, 0, 1);
	m.req.tier = 7;
	assert_int_equal(ioctl(fd, KVFS_IOC_PIN, &m), -1);
	assert_int_equal(errno, EINVAL);

	/* the daemon is still serving */
	assert_int_equal(stat_leases(fd, NULL, NULL), 0);
	close(fd);
	chain_free(&c);
}

/* The write-then-read transport carries what an ioctl cannot. */
static void test_write_read_transport(void **state)
{
	size_t nk = KVFS_CTL_MSG_SIZE / 16 + 10;
	size_t len = sizeof(struct kvfs_ctl_req) + 16 * nk;
	size_t rlen = sizeof(struct kvfs_ctl_resp) +
		      nk * sizeof(struct kvfs_ctl_block);
	struct kvfs_ctl_req *r = calloc(1, len);
	struct kvfs_ctl_resp *resp = calloc(1, rlen + 64);
	struct chain c;
	int fd = ctl_open();

	chain_write(&c, 10, 2);
	r->magic = KVFS_CTL_MAGIC;
	r->abi = KVFS_CTL_ABI;
	r->op = KVFS_CTL_LOOKUP;
	r->size = (uint32_t)len;
	r->n_keys = (uint32_t)nk;
	snprintf(r->ns, sizeof(r->ns), "%s", ns);
	memcpy((uint8_t *)(r + 1), c.key[0], 16);
	memcpy((uint8_t *)(r + 1) + 16, c.key[1], 16);
	/* too many keys for the ioctl's fixed message */
	assert_true(len > KVFS_CTL_MSG_SIZE);
	assert_int_equal(write(fd, r, len), (ssize_t)len);
	assert_int_equal(read(fd, resp, rlen + 64), (ssize_t)rlen);
	assert_int_equal(resp->error, 0);
	assert_int_equal(resp->n_cached, 2);
	assert_int_equal(resp->n_blocks, nk);
	/* the response is read once */
	assert_int_equal(read(fd, resp, rlen), 0);
	close(fd);
	free(r);
	free(resp);
	chain_free(&c);
}

int main(void)
{
	char v[512], path[4096];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lookup),
		cmocka_unit_test(test_fetch_release),
		cmocka_unit_test(test_lease_blocks_eviction),
		cmocka_unit_test(test_exit_frees_leases),
		cmocka_unit_test(test_concurrent_fetchers_one_copy),
		cmocka_unit_test(test_fetch_into_per_layer),
		cmocka_unit_test(test_fetch_into_stream_wait),
		cmocka_unit_test(test_fetch_into_overlap),
		cmocka_unit_test(test_save_round_trip),
		cmocka_unit_test(test_bad_input),
		cmocka_unit_test(test_write_read_transport),
	};
	ssize_t n;

	mnt = getenv("KVFS_MNT");
	ns = getenv("KVFS_NS");
	if (dev_backend_init()) {
		fprintf(stderr, "ctl_client: KVFS_TEST_GPU=cuda needs a build "
				"with CUDA\n");
		return 2;
	}
	if (!mnt || !ns) {
		fprintf(stderr, "ctl_client: set KVFS_MNT and KVFS_NS\n");
		return 2;
	}
	snprintf(ctl_path, sizeof(ctl_path), "%s/.kvfs/ctl", mnt);
	snprintf(path, sizeof(path), "%s/%s", mnt, ns);
	n = getxattr(path, "user.kvfs.geometry", v, sizeof(v) - 1);
	if (n <= 0)
		return 2;
	v[n] = 0;
	char dt[16];
	if (sscanf(v,
		   "layers=%u kv_heads=%u head_dim=%u dtype=%15s "
		   "block_tokens=%u chunk_tokens=%u hidden_size=%u",
		   &g.n_layers, &g.n_kv_heads, &g.head_dim, dt, &g.block_tokens,
		   &g.chunk_tokens, &g.hidden_size) != 7)
		return 2;
	g.dtype = (uint16_t)kvfs_fmt_dtype_parse(dt);
	n = getxattr(path, "user.kvfs.root", v, sizeof(v) - 1);
	if (n != 32)
		return 2;
	v[32] = 0;
	kvfs_fmt_key_parse(v, root);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
