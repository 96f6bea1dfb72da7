/* SPDX-License-Identifier: MIT */
/*
 * FETCH_CHUNKS and SCORES against a live mount (run by test_chunks.sh).
 *
 *   chunks_client write MNT     write the test prefixes (then remount)
 *   chunks_client check MNT     the checks, on SSD-only blocks
 *   chunks_client hsetup DIR    write the checkpoint of hid and hmix
 *   chunks_client hwrite MNT    write their prefixes as HIDDEN blocks
 *   chunks_client hcheck MNT    FETCH_CHUNKS and SCORES on them (SSD-only)
 *
 * Namespaces (set up by the script), all with 4 layers, 2 KV heads,
 * head_dim 128, 64-token blocks of 16-token chunks: c16 (bf16), h16
 * (f16), f32 and f8 (f8_e4m3). Every chunk is a multiple of 4 KiB. Each
 * namespace holds one prefix of 168 tokens: two full blocks and one of 40
 * tokens, so 4 + 4 + 3 = 11 chunks, the last one partial.
 *
 * The device tier is shm, or cuda with KVFS_TEST_GPU=cuda: then the chunks
 * land in cudaMalloc'ed memory of this process, handed over by IPC handle,
 * and the pool is read through its own (dev_region_i.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/kvfs_ctl.h"
#include "hcache/restore.h"
#include "meta/fmt.h"
#include "dev_region_i.h"
#include "tests/unit/ckpt_ref_i.h"

#define NBLK 3
#define NCHUNK 11

static const char *mnt;
static char ctl_path[4096];

struct prefix {
	const char *ns;
	struct kvfs_geom g;
	uint8_t key[NBLK][16];
	uint8_t *img[NBLK];
	uint32_t ntok[NBLK];
	uint64_t cb; /* chunk bytes */
};

static struct prefix pf[4];

static void geom_of(struct prefix *p, const char *ns, int dtype)
{
	p->ns = ns;
	p->g = (struct kvfs_geom){ .n_layers = 4, .n_kv_heads = 2,
				   .head_dim = 128, .block_tokens = 64,
				   .chunk_tokens = 16, .dtype = (uint16_t)dtype };
}

/* Build (and with @write, store) the prefix of namespace @p. */
static void prefix_make(struct prefix *p, int seed, bool write_files)
{
	uint8_t parent[16], root[16];
	char path[4200], hex[33], v[64];

	snprintf(path, sizeof(path), "%s/%s", mnt, p->ns);
	assert_int_equal(getxattr(path, "user.kvfs.root", v, 32), 32);
	v[32] = 0;
	assert_int_equal(kvfs_fmt_key_parse(v, root), 0);
	memcpy(parent, root, 16);
	for (int i = 0; i < NBLK; i++) {
		uint32_t tok[64], n = i < NBLK - 1 ? 64 : 40;
		uint64_t size = kvfs_fmt_file_size(&p->g, KVFS_KIND_KV, n);
		uint64_t po = kvfs_fmt_payload_off(n);
		uint8_t *pay = malloc(size - po);

		for (uint32_t t = 0; t < n; t++)
			tok[t] = (uint32_t)(seed * 1000 + i * 64 + t);
		for (uint64_t b = 0; b < size - po; b++)
			pay[b] = (uint8_t)(b * 7 + (uint64_t)i * 13 + seed);
		p->img[i] = malloc(size);
		p->ntok[i] = n;
		assert_int_equal(kvfs_fmt_build(&p->g, KVFS_KIND_KV, parent,
						(uint64_t)i * 64, tok, n, pay,
						p->img[i], size),
				 0);
		free(pay);
		memcpy(p->key[i], p->img[i] + 64, 16);
		memcpy(parent, p->key[i], 16);
		if (!write_files)
			continue;
		kvfs_fmt_key_hex(p->key[i], hex);
		snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, p->ns, hex);
		int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);

		assert_true(fd >= 0);
		assert_int_equal(write(fd, p->img[i], size), (ssize_t)size);
		assert_int_equal(fsync(fd), 0);
		assert_int_equal(close(fd), 0);
	}
	uint64_t off, len;

	assert_int_equal(kvfs_fmt_chunk_range(&p->g, 64, 0, 0, &off, &len), 0);
	p->cb = len;
}

/* Expected bytes of prefix-global chunk @j, layer @l. */
static const uint8_t *expect(const struct prefix *p, uint32_t l, uint32_t j)
{
	uint64_t off, len;
	int i = 0;

	while (j >= (p->ntok[i] + 15) / 16)
		j -= (p->ntok[i++] + 15) / 16;
	assert_int_equal(kvfs_fmt_chunk_range(&p->g, p->ntok[i], l, j, &off,
					      &len),
			 0);
	return p->img[i] + off;
}

/* ----------------------------------------------------------- requests */

/* Where the chunks land, and the completion word (host memory whatever
 * the backend).
 */
static struct dev_region peer;
static struct shm_region sync_w;

/* A FETCH_CHUNKS request in @m; returns its byte size. */
static size_t chunks_req(struct kvfs_ctl_msg *m, const struct prefix *p,
			 uint32_t first, uint32_t nl, const uint32_t *ch,
			 uint32_t n, unsigned flags)
{
	uint8_t *a = m->bytes + sizeof(m->req);

	memset(m, 0, sizeof(*m));
	m->req.magic = KVFS_CTL_MAGIC;
	m->req.abi = KVFS_CTL_ABI;
	m->req.op = KVFS_CTL_FETCH_CHUNKS;
	m->req.flags = flags;
	snprintf(m->req.ns, sizeof(m->req.ns), "%s", p->ns);
	m->req.n_keys = NBLK;
	memcpy(a, p->key, 16 * NBLK);
	a += 16 * NBLK;
	if (!(flags & KVFS_CTL_F_POOL)) {
		m->req.n_dst = 1;
		memset(a, 0, 8);
		a += 8;
	}
	m->req.layer_first = first;
	m->req.n_layers = nl;
	m->req.n_chunks = n;
	memcpy(a, ch, 4 * n);
	a += 4 * n;
	dev_peer(&peer, &m->req.peer);
	snprintf(m->req.sync.shm_name, sizeof(m->req.sync.shm_name), "%s",
		 sync_w.name);
	m->req.size = (uint32_t)(a - m->bytes);
	return m->req.size;
}

static int call(int fd, struct kvfs_ctl_msg *m)
{
	int op = m->req.op;

	assert_int_equal(ioctl(fd, KVFS_IOC(op), m), 0);
	assert_int_equal(m->resp.op, op);
	return m->resp.error;
}

/* Every byte delivered at the start of the peer for layers
 * [first, first + nl) of chunks @ch.
 */
static void check_delivered(const struct prefix *p, uint32_t first, uint32_t nl,
			    const uint32_t *ch, uint32_t n)
{
	uint64_t len = (uint64_t)nl * n * p->cb;
	uint8_t *got = malloc(len);

	assert_non_null(got);
	dev_get(&peer, 0, got, len);
	for (uint32_t l = 0; l < nl; l++)
		for (uint32_t k = 0; k < n; k++)
			assert_memory_equal(got + ((uint64_t)l * n + k) * p->cb,
					    expect(p, first + l, ch[k]), p->cb);
	free(got);
}

/* Fetch into poisoned memory and compare every delivered byte; returns
 * the response.
 */
static struct kvfs_ctl_resp fetch_check(int fd, const struct prefix *p,
					uint32_t first, uint32_t nl,
					const uint32_t *ch, uint32_t n,
					unsigned flags)
{
	struct kvfs_ctl_msg m;

	dev_fill(&peer, 0xa5);
	chunks_req(&m, p, first, nl, ch, n, flags);
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(*(uint32_t *)sync_w.p, nl);
	check_delivered(p, first, nl, ch, n);
	assert_int_equal(m.resp.bytes_wanted, (uint64_t)nl * n * p->cb);
	return m.resp;
}

static int ctl_open(void)
{
	int fd = open(ctl_path, O_RDWR | O_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

static void stats(int fd, struct kvfs_ctl_stats *st)
{
	struct kvfs_ctl_msg m;

	memset(&m, 0, sizeof(m));
	m.req.magic = KVFS_CTL_MAGIC;
	m.req.abi = KVFS_CTL_ABI;
	m.req.op = KVFS_CTL_STATS;
	m.req.size = sizeof(m.req);
	assert_int_equal(call(fd, &m), 0);
	*st = m.resp.stats;
}

/* -------------------------------------------------------------- tests */

static void test_exact_bytes_random_sets(void **state)
{
	int fd = ctl_open();
	unsigned seed = 7;

	for (int round = 0; round < 30; round++) {
		struct prefix *p = &pf[round % 4];
		uint32_t ch[NCHUNK], n = 0;
		uint32_t first = (uint32_t)(rand_r(&seed) % 4);
		uint32_t nl = 1 + (uint32_t)(rand_r(&seed) % (4 - first));

		for (uint32_t j = 0; j < NCHUNK; j++)
			if (rand_r(&seed) % 3 == 0)
				ch[n++] = j;
		if (!n)
			ch[n++] = NCHUNK - 1; /* the partial last chunk */
		/* any order: the output follows the request's order */
		if (n > 1 && round % 2) {
			uint32_t t = ch[0];

			ch[0] = ch[n - 1];
			ch[n - 1] = t;
		}
		fetch_check(fd, p, first, nl, ch, n, 0);
	}
	close(fd);
}

/* Adjacent chunks of one layer of one block are one read, no more bytes
 * than asked; the blocks are on the SSD only and these pieces uncached.
 */
static void test_coalescing(void **state)
{
	struct kvfs_ctl_resp r;
	int fd = ctl_open();
	const uint32_t adj[] = { 0, 1, 2, 3 }, gap[] = { 4, 6 };

	r = fetch_check(fd, &pf[0], 3, 1, adj, 4, 0);
	assert_int_equal(r.mem_hits, 0);
	assert_int_equal(r.ssd_reads, 1);
	assert_int_equal(r.bytes_read, r.bytes_wanted);
	r = fetch_check(fd, &pf[0], 3, 1, gap, 2, 0);
	assert_int_equal(r.ssd_reads, 2);
	assert_int_equal(r.bytes_read, r.bytes_wanted);
	/* the same pieces again come from memory */
	r = fetch_check(fd, &pf[0], 3, 1, adj, 4, 0);
	assert_int_equal(r.ssd_reads, 0);
	assert_int_equal(r.mem_hits, 4);
	assert_int_equal(r.bytes_read, 0);
	close(fd);
}

/* Inter-period prefetch: period 0 (layers 0-1) with SPECULATE loads the
 * same chunks for layers 2-3; period 1 then asks for one more chunk and
 * reads only the difference from the SSD.
 */
static void test_inter_period_difference(void **state)
{
	struct kvfs_ctl_stats st;
	struct kvfs_ctl_resp r;
	int fd = ctl_open();
	const uint32_t p0[] = { 7, 8 }, p1[] = { 7, 8, 9 };
	uint64_t loaded0;

	stats(fd, &st);
	loaded0 = st.spec_loaded;
	fetch_check(fd, &pf[1], 0, 2, p0, 2, KVFS_CTL_F_SPECULATE);
	/* The speculative loads run in the background while an engine would
	 * compute; wait for them by their counter (bounded).
	 */
	for (int i = 0; i < 1000000; i++) {
		stats(fd, &st);
		if (st.spec_loaded >= loaded0 + 4)
			break;
		sched_yield();
	}
	assert_true(st.spec_loaded >= loaded0 + 4);
	r = fetch_check(fd, &pf[1], 2, 2, p1, 3, 0);
	assert_int_equal(r.spec_hits, 4);  /* chunks 7, 8 of layers 2, 3 */
	assert_int_equal(r.mem_hits, 4);
	assert_int_equal(r.bytes_read, 2 * pf[1].cb); /* only chunk 9 */
	stats(fd, &st);
	assert_true(st.spec_used >= 4);
	close(fd);
}

/*
 * The next period's request arrives at once, while the speculation its
 * predecessor started is still loading: the request calls off what the
 * load has not issued, joins what is on the disk, and reads the rest
 * itself; whatever the timing, it gets exactly its bytes.
 */
static void test_inter_period_superseded(void **state)
{
	int fd = ctl_open();
	unsigned seed = 11;

	for (int round = 0; round < 24; round++) {
		struct prefix *p = &pf[round % 4];
		uint32_t a[NCHUNK], b[NCHUNK], na = 0, nb = 0;

		for (uint32_t j = 0; j < NCHUNK; j++) {
			if (rand_r(&seed) % 2)
				a[na++] = j;
			if (rand_r(&seed) % 2)
				b[nb++] = j;
		}
		if (!na)
			a[na++] = 0;
		if (!nb)
			b[nb++] = NCHUNK - 1;
		fetch_check(fd, p, 0, 2, a, na, KVFS_CTL_F_SPECULATE);
		fetch_check(fd, p, 2, 2, b, nb, round % 2 ?
			    KVFS_CTL_F_SPECULATE : 0);
	}
	close(fd);
}

struct layer_waiter {
	volatile uint32_t *word;
	const struct prefix *p;
	const uint32_t *ch;
	uint32_t first, nl, n;
	uint32_t ok_layers; /* layers seen complete with the right bytes */
	int monotonic;
};

/* An engine's compute thread: wait for each layer of the period, then
 * check its bytes while later layers are still arriving.
 */
static void *wait_layers(void *arg)
{
	struct layer_waiter *w = arg;
	uint64_t lb = (uint64_t)w->n * w->p->cb;
	uint32_t seen = 0;

	w->monotonic = 1;
	for (uint32_t l = 0; l < w->nl; l++) {
		uint32_t v;

		while ((v = __atomic_load_n(w->word, __ATOMIC_ACQUIRE)) <= l) {
			if (v & KVFS_CTL_SYNC_FAILED)
				return NULL;
			syscall(SYS_futex, w->word, FUTEX_WAIT, v, NULL, NULL,
				0);
		}
		if (v & KVFS_CTL_SYNC_FAILED)
			return NULL;
		if (v < seen)
			w->monotonic = 0;
		seen = v;
		for (uint32_t k = 0; k < w->n; k++)
			if (!dev_equal(&peer, l * lb + k * w->p->cb,
				       expect(w->p, w->first + l, w->ch[k]),
				       w->p->cb))
				return NULL;
		w->ok_layers++;
	}
	return NULL;
}

/* Sub-periods (ContiguousKV): layers are read @sub at a time and each
 * signalled as it lands; a waiter sees every layer complete, in order,
 * before the request returns. Staged (cuda), the stage is reused batch
 * after batch, the last one partial when @sub does not divide the period.
 */
static void per_layer(int fd, const struct prefix *p, uint32_t sub)
{
	const uint32_t ch[] = { 10, 2, 3, 7, 0 };
	struct layer_waiter w = { 0 };
	volatile uint32_t *word = (volatile uint32_t *)sync_w.p;
	struct kvfs_ctl_msg m;
	uint32_t done;
	pthread_t t;
	int rc;

	dev_fill(&peer, 0xa5);
	__atomic_store_n(word, 0, __ATOMIC_RELEASE);
	w.word = word;
	w.p = p;
	w.ch = ch;
	w.first = 0;
	w.nl = 4;
	w.n = 5;
	chunks_req(&m, p, w.first, w.nl, ch, w.n, 0);
	m.req.sub_period = sub;
	assert_int_equal(pthread_create(&t, NULL, wait_layers, &w), 0);
	rc = call(fd, &m);
	done = __atomic_load_n(word, __ATOMIC_ACQUIRE);
	if (done != w.nl) {
		/* release a waiter the daemon never finished */
		__atomic_store_n(word, KVFS_CTL_SYNC_FAILED, __ATOMIC_RELEASE);
		syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
	}
	pthread_join(t, NULL);
	assert_int_equal(rc, 0);
	assert_int_equal(done, w.nl);
	assert_int_equal(w.ok_layers, w.nl);
	assert_true(w.monotonic);
	assert_int_equal(m.resp.bytes_wanted, (uint64_t)w.nl * w.n * p->cb);
	check_delivered(p, w.first, w.nl, ch, w.n);
}

static void test_sub_period_per_layer(void **state)
{
	int fd = ctl_open();

	per_layer(fd, &pf[3], 1);
	per_layer(fd, &pf[2], 3);
	close(fd);
}

static void test_pool_mode(void **state)
{
	struct kvfs_ctl_msg m;
	const uint32_t ch[] = { 10, 0 };
	uint8_t *pool;
	int fd = ctl_open();

	chunks_req(&m, &pf[2], 1, 2, ch, 2, KVFS_CTL_F_POOL);
	m.req.sync.shm_name[0] = 0;
	assert_int_equal(call(fd, &m), 0);
	assert_int_equal(m.resp.n_blocks, 1);
	struct kvfs_ctl_block *b = (void *)(m.bytes + sizeof(m.resp));

	assert_int_equal(b->len, 4 * pf[2].cb);
	assert_int_equal(b->layer_bytes, 2 * pf[2].cb);
	/* the region, read from the pool as the backend allows */
	pool = malloc(b->len);
	assert_non_null(pool);
	pool_get(&m.resp.pool, b->pool_off, pool, b->len);
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t k = 0; k < 2; k++)
			assert_memory_equal(pool + (l * 2 + k) * pf[2].cb,
					    expect(&pf[2], 1 + l, ch[k]),
					    pf[2].cb);
	free(pool);
	close(fd);
}

static void test_scores(void **state)
{
	struct kvfs_ctl_msg m;
	uint8_t *a = m.bytes + sizeof(m.req);
	int fd = ctl_open();
	const uint32_t ch[] = { 1, 5 };
	const float sc[] = { 0.75f, 2.5f }, bad_sc[] = { NAN, 1.0f };

	memset(&m, 0, sizeof(m));
	m.req.magic = KVFS_CTL_MAGIC;
	m.req.abi = KVFS_CTL_ABI;
	m.req.op = KVFS_CTL_SCORES;
	snprintf(m.req.ns, sizeof(m.req.ns), "%s", pf[0].ns);
	m.req.n_keys = NBLK;
	memcpy(a, pf[0].key, 16 * NBLK);
	m.req.n_chunks = 2;
	m.req.n_scores = 2;
	memcpy(a + 16 * NBLK, ch, 8);
	memcpy(a + 16 * NBLK + 8, sc, 8);
	m.req.size = (uint32_t)(sizeof(m.req) + 16 * NBLK + 16);
	struct kvfs_ctl_msg again = m;

	assert_int_equal(call(fd, &m), 0);
	m = again;
	memcpy(m.bytes + sizeof(m.req) + 16 * NBLK + 8, bad_sc, 8);
	assert_int_equal(call(fd, &m), -EINVAL);
	m = again;
	((uint32_t *)(m.bytes + sizeof(m.req) + 16 * NBLK))[1] = NCHUNK;
	assert_int_equal(call(fd, &m), -EINVAL);
	close(fd);
}

static void test_bad_input(void **state)
{
	struct kvfs_ctl_msg m;
	int fd = ctl_open();
	const uint32_t past[] = { NCHUNK }, dup[] = { 2, 2 }, ok[] = { 1 };

	chunks_req(&m, &pf[0], 0, 1, past, 1, 0);
	assert_int_equal(call(fd, &m), -EINVAL); /* past the last token */
	chunks_req(&m, &pf[0], 3, 2, ok, 1, 0);
	assert_int_equal(call(fd, &m), -EINVAL); /* layers 3..4 of 4 */
	chunks_req(&m, &pf[0], 4, 1, ok, 1, 0);
	assert_int_equal(call(fd, &m), -EINVAL);
	chunks_req(&m, &pf[0], 0, 1, dup, 2, 0);
	assert_int_equal(call(fd, &m), -EINVAL); /* duplicates */
	chunks_req(&m, &pf[0], 0, 1, ok, 1, 0);
	snprintf(m.req.ns, sizeof(m.req.ns), "nope");
	assert_int_equal(call(fd, &m), -ENOENT); /* wrong namespace */
	chunks_req(&m, &pf[0], 0, 1, ok, 1, 0);
	snprintf(m.req.ns, sizeof(m.req.ns), "%s", pf[1].ns);
	assert_int_equal(call(fd, &m), -ENOENT); /* keys of another ns */
	chunks_req(&m, &pf[0], 0, 4, ok, 1, 0);
	m.req.peer.size = 4096; /* shrink what we claim to own: too small */
	((uint64_t *)(m.bytes + sizeof(m.req) + 16 * NBLK))[0] =
		peer.len - 4096;
	assert_true(call(fd, &m) < 0);
	/* empty sets and missing layers are malformed: EINVAL at once */
	chunks_req(&m, &pf[0], 0, 1, ok, 1, 0);
	m.req.n_chunks = 0;
	m.req.size -= 4;
	assert_int_equal(ioctl(fd, KVFS_IOC_FETCH_CHUNKS, &m), -1);
	assert_int_equal(errno, EINVAL);
	chunks_req(&m, &pf[0], 0, 0, ok, 1, 0);
	assert_int_equal(ioctl(fd, KVFS_IOC_FETCH_CHUNKS, &m), -1);
	assert_int_equal(errno, EINVAL);
	/* and nothing broke */
	fetch_check(fd, &pf[0], 0, 1, ok, 1, 0);
	close(fd);
}

/* ------------------------------------------- blocks stored as hidden states */

/*
 * Two namespaces with a checkpoint (tiny Llama MHA, F32 weights; 4 layers,
 * hidden 256, 4 KV heads of 64, bf16): hid keeps HIDDEN writes as hidden
 * states, hmix splits them (layers 0-1 hidden states, 2-3 K and V: kind
 * MIXED). Each holds a 64 + 64 + 40-token prefix written as HIDDEN blocks.
 * A KV chunk is 16 KiB, a chunk of hidden-state rows 8 KiB.
 */
#define HNS 2
static struct prefix hp[HNS];
static const uint32_t hkv_from[HNS] = { 4, 2 };

static const struct spec hspec = {
	.family = KVFS_FAMILY_LLAMA, .L = 4, .hidden = 256, .kvh = 4, .hd = 64,
	.wdt = KVFS_DTYPE_F32, .theta = 10000, .eps = 1e-5,
};

static int hsetup(const char *dir)
{
	struct refmodel rm;
	char path[4200];

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	make_model(&rm, &hspec, 5);
	write_checkpoint(path, rm.t, rm.nt);
	free_model(&rm);
	return 0;
}

/* The keys of namespace @p's prefix, and with @rm its HIDDEN blocks
 * written through the mount.
 */
static void hprefix_make(struct prefix *p, const char *ns, int seed,
			 const struct refmodel *rm)
{
	uint8_t parent[16];
	char path[4200], hex[33], v[64];
	uint64_t off, len;

	p->ns = ns;
	p->g = (struct kvfs_geom){ .n_layers = 4, .n_kv_heads = 4,
				   .head_dim = 64, .hidden_size = 256,
				   .block_tokens = 64, .chunk_tokens = 16,
				   .dtype = KVFS_DTYPE_BF16 };
	snprintf(path, sizeof(path), "%s/%s", mnt, ns);
	assert_int_equal(getxattr(path, "user.kvfs.root", v, 32), 32);
	v[32] = 0;
	assert_int_equal(kvfs_fmt_key_parse(v, parent), 0);
	for (int i = 0; i < NBLK; i++) {
		uint32_t tok[64], n = i < NBLK - 1 ? 64 : 40;
		uint64_t size = kvfs_fmt_file_size(&p->g, KVFS_KIND_HIDDEN, n);
		uint8_t *img = malloc(size);
		struct block hb;

		assert_non_null(img);
		for (uint32_t t = 0; t < n; t++)
			tok[t] = (uint32_t)(seed * 1000 + i * 64 + t);
		if (rm)
			make_block(&hb, rm, KVFS_DTYPE_BF16, n, 16,
				   (uint64_t)i * 64);
		assert_int_equal(kvfs_fmt_build(&p->g, KVFS_KIND_HIDDEN,
						parent, (uint64_t)i * 64, tok,
						n, rm ? hb.hidden : NULL, img,
						size),
				 0);
		p->ntok[i] = n;
		memcpy(p->key[i], img + 64, 16);
		memcpy(parent, p->key[i], 16);
		if (rm) {
			kvfs_fmt_key_hex(p->key[i], hex);
			snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, ns,
				 hex);
			int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);

			assert_true(fd >= 0);
			assert_int_equal(write(fd, img, size), (ssize_t)size);
			assert_int_equal(fsync(fd), 0);
			assert_int_equal(close(fd), 0);
			free_block(&hb);
		}
		free(img);
	}
	assert_int_equal(kvfs_fmt_chunk_range(&p->g, 64, 0, 0, &off, &len), 0);
	p->cb = len;
}

static int hwrite(void)
{
	struct refmodel rm;

	make_model(&rm, &hspec, 5);
	hprefix_make(&hp[0], "hid", 30, &rm);
	hprefix_make(&hp[1], "hmix", 31, &rm);
	free_model(&rm);
	return 0;
}

/* The whole file of block @i, as read() returns it, into p->img[i]. */
static void hread_file(struct prefix *p, int i)
{
	uint64_t size = kvfs_fmt_file_size(&p->g, KVFS_KIND_KV, p->ntok[i]);
	char path[4200], hex[33];
	struct stat st;
	int fd;

	kvfs_fmt_key_hex(p->key[i], hex);
	snprintf(path, sizeof(path), "%s/%s/%s.kv", mnt, p->ns, hex);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, size);
	free(p->img[i]);
	p->img[i] = malloc(size);
	assert_non_null(p->img[i]);
	assert_int_equal(pread(fd, p->img[i], size, 0), (ssize_t)size);
	close(fd);
}

/*
 * FETCH_CHUNKS of SSD-only hidden and split blocks: stored K and V come
 * back exactly as a full read has them, projected chunks within the
 * restoration tolerance of it (both are within tolerance of the true K
 * and V), reading half the bytes; once the full read has restored a block
 * into DRAM, every chunk is exactly the file's.
 */
static void test_hidden_fetch(void **state)
{
	int fd = ctl_open();
	const uint32_t all[NCHUNK] = { 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 };
	const uint32_t some[] = { 9, 2, 10 };
	const uint32_t one = 5;

	(void)state;
	for (int k = 0; k < HNS; k++) {
		struct prefix *p = &hp[k];
		uint64_t len = 4ull * NCHUNK * p->cb;
		struct kvfs_ctl_msg m;
		uint8_t *got = malloc(len);

		assert_non_null(got);
		/* One chunk of a hidden layer: 8 KiB read for 16 KiB. */
		chunks_req(&m, p, 0, 1, &one, 1, 0);
		assert_int_equal(call(fd, &m), 0);
		assert_int_equal(m.resp.bytes_wanted, p->cb);
		assert_int_equal(m.resp.bytes_read, p->cb / 2);
		/* Every chunk of every layer, from the SSD. */
		dev_fill(&peer, 0xa5);
		chunks_req(&m, p, 0, 4, all, NCHUNK, 0);
		assert_int_equal(call(fd, &m), 0);
		assert_int_equal(*(uint32_t *)sync_w.p, 4);
		assert_int_equal(m.resp.bytes_wanted, len);
		assert_true(m.resp.bytes_read < len);
		dev_get(&peer, 0, got, len);
		for (int i = 0; i < NBLK; i++)
			hread_file(p, i);
		for (uint32_t l = 0; l < 4; l++)
			for (uint32_t c = 0; c < NCHUNK; c++) {
				const uint8_t *g = got +
						   ((uint64_t)l * NCHUNK + c) *
							   p->cb;
				const uint8_t *w = expect(p, l, all[c]);

				if (l >= hkv_from[k]) {
					assert_memory_equal(g, w, p->cb);
					continue;
				}
				for (uint64_t e = 0; e < p->cb / 2; e++) {
					double a = dec(KVFS_DTYPE_BF16, g, e);
					double b = dec(KVFS_DTYPE_BF16, w, e);

					assert_true(fabs(a - b) <=
						    2 * tol(KVFS_DTYPE_BF16,
							    b));
				}
			}
		/* Restored into DRAM by the reads: the file's bytes, from
		 * the block's copy, whatever the chunk cache holds.
		 */
		struct kvfs_ctl_resp r = fetch_check(fd, p, 0, 4, all, NCHUNK,
						     0);

		assert_int_equal(r.mem_hits, 4 * NCHUNK);
		assert_int_equal(r.bytes_read, 0);
		fetch_check(fd, p, 1, 2, some, 3, 0);
		free(got);
	}
	close(fd);
}

/* SCORES on a hidden block's chunks. */
static void test_hidden_scores(void **state)
{
	struct kvfs_ctl_msg m;
	uint8_t *a = m.bytes + sizeof(m.req);
	int fd = ctl_open();
	const uint32_t ch[] = { 0, 10 };
	const float sc[] = { 0.5f, 1.5f };

	(void)state;
	memset(&m, 0, sizeof(m));
	m.req.magic = KVFS_CTL_MAGIC;
	m.req.abi = KVFS_CTL_ABI;
	m.req.op = KVFS_CTL_SCORES;
	snprintf(m.req.ns, sizeof(m.req.ns), "%s", hp[0].ns);
	m.req.n_keys = NBLK;
	memcpy(a, hp[0].key, 16 * NBLK);
	m.req.n_chunks = 2;
	m.req.n_scores = 2;
	memcpy(a + 16 * NBLK, ch, 8);
	memcpy(a + 16 * NBLK + 8, sc, 8);
	m.req.size = (uint32_t)(sizeof(m.req) + 16 * NBLK + 16);
	assert_int_equal(call(fd, &m), 0);
	close(fd);
}

static int hcheck(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hidden_fetch),
		cmocka_unit_test(test_hidden_scores),
	};
	int rc;

	hprefix_make(&hp[0], "hid", 30, NULL);
	hprefix_make(&hp[1], "hmix", 31, NULL);
	dev_make(&peer, "chunks-hpeer", 4 * NCHUNK * 64 * 1024);
	shm_make(&sync_w, "chunks-hsync", 4096);
	rc = cmocka_run_group_tests_name("hidden", tests, NULL, NULL);
	dev_drop(&peer);
	shm_drop(&sync_w);
	return rc;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_coalescing),
		cmocka_unit_test(test_inter_period_difference),
		cmocka_unit_test(test_inter_period_superseded),
		cmocka_unit_test(test_exact_bytes_random_sets),
		cmocka_unit_test(test_sub_period_per_layer),
		cmocka_unit_test(test_pool_mode),
		cmocka_unit_test(test_scores),
		cmocka_unit_test(test_bad_input),
	};
	bool write_files;
	int rc;

	if (argc != 3)
		return 2;
	if (dev_backend_init()) {
		fprintf(stderr, "chunks_client: KVFS_TEST_GPU=cuda needs a "
			"build with CUDA\n");
		return 2;
	}
	if (!strcmp(argv[1], "hsetup"))
		return hsetup(argv[2]);
	write_files = !strcmp(argv[1], "write");
	mnt = argv[2];
	snprintf(ctl_path, sizeof(ctl_path), "%s/.kvfs/ctl", mnt);
	if (!strcmp(argv[1], "hwrite"))
		return hwrite();
	if (!strcmp(argv[1], "hcheck"))
		return hcheck();
	geom_of(&pf[0], "c16", KVFS_DTYPE_BF16);
	geom_of(&pf[1], "h16", KVFS_DTYPE_F16);
	geom_of(&pf[2], "f32", KVFS_DTYPE_F32);
	geom_of(&pf[3], "f8", KVFS_DTYPE_F8_E4M3);
	for (int i = 0; i < 4; i++)
		prefix_make(&pf[i], 10 + i, write_files);
	if (write_files)
		return 0;
	dev_make(&peer, "chunks-peer", 4 * NCHUNK * 64 * 1024);
	shm_make(&sync_w, "chunks-sync", 4096);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	dev_drop(&peer);
	shm_drop(&sync_w);
	return rc;
}
