/* SPDX-License-Identifier: MIT */
/*
 * One .kvfs/ctl operation per run, for test_tenants.sh: the script runs it
 * as one user or another (runuser) and reads the outcome from stdout.
 *
 *   tenant_client MNT NS OP [ARGS]
 *     lookup KEY | pin KEY TIER | unpin KEY | evict KEY TIER |
 *     prefetch KEY | release [KEY] | fetch KEY | fetch_chunks KEY SHM |
 *     fetch_into KEY SHM [SYNC] (the sync word at SYNC's start, else
 *     in SHM's last 4 bytes) | save SHM |
 *     hold KEY SECONDS  (FETCH, then keep the lease that long) |
 *     kept KEY SHM UID GID  (as root: FETCH_CHUNKS into SHM, which the
 *                            session keeps open; then as UID:GID on the
 *                            same descriptor)
 *     mkshm SHM BYTES [FILL]  (create a 0600 shm object of the caller's,
 *                              every byte FILL) | sum SHM (its byte sum) |
 *     fetchmap KEY FILE  (FETCH into the pool, then map the pool it names
 *                         read-only and compare the block's payload there
 *                         with FILE's: prints pool=NAME, inside=0|1 (the
 *                         range within the pool's size), same=0|1, or
 *                         map=-errno) |
 *     pool_chunks KEY  (FETCH_CHUNKS with F_POOL, chunk 0 of layer 0:
 *                       pool=NAME and inside=0|1) |
 *     openshm SHM  (shm_open read-only: open=0 or open=-errno)
 *
 * Prints "error=E" (resp.error, 0 or -errno) and, for SAVE, "key=HEX";
 * exits 0 when the request went through the transport, 2 when it did not
 * (that errno printed), 1 on a usage error. KEY is 32 hex digits. The
 * geometry is lib.sh's test namespace (4 layers, 2 KV heads, head_dim 64,
 * bf16, 16-token blocks, 4-token chunks).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meta/fmt.h"
#include "meta/kvfs_ctl.h"

static const char *mnt, *ns;

static struct kvfs_geom geom(void)
{
	struct kvfs_geom g = {
		.n_layers = 4,
		.n_kv_heads = 2,
		.head_dim = 64,
		.block_tokens = 16,
		.chunk_tokens = 4,
		.dtype = KVFS_DTYPE_BF16,
	};

	return g;
}

static uint64_t payload_len(void)
{
	struct kvfs_geom g = geom();

	return kvfs_fmt_file_size(&g, KVFS_KIND_KV, g.block_tokens) -
	       kvfs_fmt_payload_off(g.block_tokens);
}

static void key_parse(const char *hex, uint8_t *k)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;

		if (strlen(hex) != 32 || sscanf(hex + 2 * i, "%2x", &v) != 1) {
			fprintf(stderr, "bad key %s\n", hex);
			exit(1);
		}
		k[i] = (uint8_t)v;
	}
}

static void req_init(struct kvfs_ctl_msg *m, int op, const char *key)
{
	memset(m, 0, sizeof(*m));
	m->req.magic = KVFS_CTL_MAGIC;
	m->req.abi = KVFS_CTL_ABI;
	m->req.op = (uint16_t)op;
	snprintf(m->req.ns, sizeof(m->req.ns), "%s", ns);
	m->req.size = sizeof(m->req);
	if (key) {
		key_parse(key, m->bytes + sizeof(m->req));
		m->req.n_keys = 1;
		m->req.size += 16;
	}
}

static void set_mem(struct kvfs_ctl_mem *mem, const char *name)
{
	int fd = shm_open(name, O_RDONLY, 0);
	struct stat sb;

	mem->backend = KVFS_CTL_BACKEND_SHM;
	snprintf(mem->shm_name, sizeof(mem->shm_name), "%s", name);
	/* An object the caller cannot open: the size of a block will do. */
	mem->size = payload_len();
	if (fd >= 0 && !fstat(fd, &sb))
		mem->size = (uint64_t)sb.st_size;
	if (fd >= 0)
		close(fd);
}

static int run(int fd, struct kvfs_ctl_msg *m)
{
	if (ioctl(fd, KVFS_IOC(m->req.op), m)) {
		printf("transport=%d\n", -errno);
		return 2;
	}
	printf("error=%d\n", m->resp.error);
	return 0;
}

static int ctl_open(void)
{
	char path[4096];
	int fd;

	snprintf(path, sizeof(path), "%s/.kvfs/ctl", mnt);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		printf("transport=%d\n", -errno);
		exit(2);
	}
	return fd;
}

static int fetch_chunks(int fd, const char *key, const char *shm)
{
	struct kvfs_ctl_msg m;
	uint8_t *p;

	req_init(&m, KVFS_CTL_FETCH_CHUNKS, key);
	set_mem(&m.req.peer, shm);
	m.req.n_dst = 1;
	m.req.n_chunks = 1;
	m.req.n_layers = 1;
	p = m.bytes + m.req.size;
	memset(p, 0, 8); /* dst[0].off = 0 */
	memset(p + 8, 0, 4); /* chunk 0 */
	m.req.size += 12;
	return run(fd, &m);
}

/* Whether the region a response gives lies inside the pool it names. */
static void print_region(const struct kvfs_ctl_msg *m)
{
	const struct kvfs_ctl_block *b =
		(const void *)(m->bytes + sizeof(m->resp));

	printf("pool=%s\ninside=%d\n", m->resp.pool.shm_name,
	       m->resp.n_blocks == 1 && b->len &&
		       b->pool_off <= m->resp.pool.size &&
		       b->len <= m->resp.pool.size - b->pool_off);
}

static int fetchmap(int fd, const char *key, const char *file)
{
	const struct kvfs_ctl_block *b;
	struct kvfs_ctl_msg m;
	uint8_t *want, *p;
	int rc, pfd, ffd;
	bool same;

	req_init(&m, KVFS_CTL_FETCH, key);
	rc = run(fd, &m);
	if (rc || m.resp.error)
		return rc;
	print_region(&m);
	b = (const void *)(m.bytes + sizeof(m.resp));
	pfd = shm_open(m.resp.pool.shm_name, O_RDONLY, 0);
	if (pfd < 0) {
		printf("map=%d\n", -errno);
		return 0;
	}
	p = mmap(NULL, (size_t)m.resp.pool.size, PROT_READ, MAP_SHARED, pfd,
		 0);
	close(pfd);
	want = malloc(b->len);
	ffd = open(file, O_RDONLY);
	if (p == MAP_FAILED || !want || ffd < 0 ||
	    pread(ffd, want, b->len,
		  (off_t)kvfs_fmt_payload_off(geom().block_tokens)) !=
		    (ssize_t)b->len)
		return perror("fetchmap"), 1;
	close(ffd);
	same = !memcmp(p + b->pool_off, want, b->len);
	printf("same=%d\n", same);
	free(want);
	munmap(p, (size_t)m.resp.pool.size);
	return 0;
}

static int pool_chunks(int fd, const char *key)
{
	struct kvfs_ctl_msg m;

	req_init(&m, KVFS_CTL_FETCH_CHUNKS, key);
	m.req.flags = KVFS_CTL_F_POOL;
	m.req.n_chunks = 1;
	m.req.n_layers = 1;
	memset(m.bytes + m.req.size, 0, 4); /* chunk 0 */
	m.req.size += 4;
	if (run(fd, &m))
		return 2;
	if (!m.resp.error)
		print_region(&m);
	return 0;
}

static int openshm(const char *name)
{
	int fd = shm_open(name, O_RDONLY, 0);

	printf("open=%d\n", fd < 0 ? -errno : 0);
	if (fd >= 0)
		close(fd);
	return 0;
}

static int mkshm(const char *name, size_t len, int fill)
{
	uint8_t *p;
	int fd;

	shm_unlink(name);
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)len))
		return perror(name), 1;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return perror("mmap"), 1;
	memset(p, fill, len);
	munmap(p, len);
	return 0;
}

static int sum(const char *name)
{
	uint64_t s = 0;
	struct stat sb;
	uint8_t *p;
	int fd = shm_open(name, O_RDONLY, 0);

	if (fd < 0 || fstat(fd, &sb))
		return perror(name), 1;
	p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return perror("mmap"), 1;
	for (off_t i = 0; i < sb.st_size; i++)
		s += p[i];
	printf("sum=%llu\n", (unsigned long long)s);
	return 0;
}

int main(int argc, char **argv)
{
	const char *op;
	struct kvfs_ctl_msg m;
	int fd, rc;

	if (argc < 4)
		return fprintf(stderr, "usage: see the source\n"), 1;
	mnt = argv[1];
	ns = argv[2];
	op = argv[3];
	argv += 4;
	argc -= 4;
	if (!strcmp(op, "mkshm") && argc >= 2)
		return mkshm(argv[0], strtoull(argv[1], NULL, 0),
			     argc > 2 ? atoi(argv[2]) : 0);
	if (!strcmp(op, "sum") && argc == 1)
		return sum(argv[0]);
	if (!strcmp(op, "openshm") && argc == 1)
		return openshm(argv[0]);
	fd = ctl_open();
	if (!strcmp(op, "lookup") && argc == 1) {
		req_init(&m, KVFS_CTL_LOOKUP, argv[0]);
		rc = run(fd, &m);
		if (!rc)
			printf("n_cached=%u tiers=%u\n", m.resp.n_cached,
			       ((struct kvfs_ctl_block *)(m.bytes +
							  sizeof(m.resp)))
				       ->tiers);
		return rc;
	}
	if ((!strcmp(op, "pin") || !strcmp(op, "evict")) && argc == 2) {
		req_init(&m, op[0] == 'p' ? KVFS_CTL_PIN : KVFS_CTL_EVICT,
			 argv[0]);
		m.req.tier = (uint32_t)atoi(argv[1]);
		return run(fd, &m);
	}
	if (!strcmp(op, "unpin") && argc == 1) {
		req_init(&m, KVFS_CTL_UNPIN, argv[0]);
		return run(fd, &m);
	}
	if (!strcmp(op, "prefetch") && argc == 1) {
		req_init(&m, KVFS_CTL_PREFETCH, argv[0]);
		m.req.tier = 1;
		return run(fd, &m);
	}
	if (!strcmp(op, "release") && argc <= 1) {
		req_init(&m, KVFS_CTL_RELEASE, argc ? argv[0] : NULL);
		if (!argc)
			m.req.ns[0] = 0;
		return run(fd, &m);
	}
	if (!strcmp(op, "fetch") && argc == 1) {
		req_init(&m, KVFS_CTL_FETCH, argv[0]);
		return run(fd, &m);
	}
	if (!strcmp(op, "hold") && argc == 2) {
		req_init(&m, KVFS_CTL_FETCH, argv[0]);
		rc = run(fd, &m);
		fflush(stdout);
		sleep((unsigned)atoi(argv[1]));
		return rc;
	}
	if (!strcmp(op, "fetchmap") && argc == 2)
		return fetchmap(fd, argv[0], argv[1]);
	if (!strcmp(op, "pool_chunks") && argc == 1)
		return pool_chunks(fd, argv[0]);
	if (!strcmp(op, "fetch_chunks") && argc == 2)
		return fetch_chunks(fd, argv[0], argv[1]);
	if (!strcmp(op, "fetch_into") && argc >= 2) {
		req_init(&m, KVFS_CTL_FETCH_INTO, argv[0]);
		set_mem(&m.req.peer, argv[1]);
		m.req.n_dst = 1;
		memset(m.bytes + m.req.size, 0, 8);
		m.req.size += 8;
		/* The word: in SYNC, else in the last 4 bytes of SHM. */
		snprintf(m.req.sync.shm_name, sizeof(m.req.sync.shm_name), "%s",
			 argc > 2 ? argv[2] : argv[1]);
		m.req.sync.off = argc > 2 ? 0 : m.req.peer.size - 4;
		return run(fd, &m);
	}
	if (!strcmp(op, "save") && argc == 1) {
		struct kvfs_geom g = geom();
		uint32_t *tok;
		char hex[33];

		req_init(&m, KVFS_CTL_SAVE, NULL);
		set_mem(&m.req.peer, argv[0]);
		kvfs_fmt_root_key(ns, NULL, m.req.parent);
		tok = (uint32_t *)(m.bytes + m.req.size);
		for (uint32_t t = 0; t < g.block_tokens; t++)
			tok[t] = 777000 + t;
		m.req.n_tokens = g.block_tokens;
		m.req.size += 4 * g.block_tokens;
		rc = run(fd, &m);
		kvfs_fmt_key_hex(m.resp.key, hex);
		if (!rc && !m.resp.error)
			printf("key=%s\n", hex);
		return rc;
	}
	if (!strcmp(op, "kept") && argc == 4) {
		gid_t gid = (gid_t)atoi(argv[3]);

		rc = fetch_chunks(fd, argv[0], argv[1]);
		fflush(stdout);
		if (rc || setgroups(1, &gid) || setgid(gid) ||
		    setuid((uid_t)atoi(argv[2])))
			return perror("kept"), 1;
		return fetch_chunks(fd, argv[0], argv[1]);
	}
	fprintf(stderr, "unknown op or arguments: %s\n", op);
	return 1;
}
