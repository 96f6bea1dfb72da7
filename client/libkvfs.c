/* SPDX-License-Identifier: MIT */
/*
 * libkvfs: requests to MNT/.kvfs/ctl and key chains (shm peers and sync
 * words are in libkvfs_shm.c). The contract is in client/libkvfs.h; the
 * wire format in meta/kvfs_ctl.h.
 *
 * Every response is checked before anything in it is trusted: a daemon
 * bug (or a foreign file at .kvfs/ctl) must give the engine -EPROTO, not
 * an out-of-bounds read.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "client/libkvfs.h"
#include "meta/log.h"
#include "meta/util.h"

#define RESP_HDR sizeof(struct kvfs_ctl_resp)
#define BLOCK_SZ sizeof(struct kvfs_ctl_block)

/* A namespace's xattrs, read once. */
struct ns_entry {
	struct ns_entry *next;
	char name[KVFS_CTL_NS_MAX];
	struct kvfs_client_ns info;
};

/* A read-only mapping of a device pool; kept until close so that pointers
 * handed out by earlier FETCHes never dangle.
 */
struct pool_map {
	struct pool_map *next;
	char name[KVFS_CTL_NAME_MAX];
	uint64_t size;
	const uint8_t *base;
};

struct kvfs_client {
	int fd;                         /* the ctl file, -1 with custom ops */
	char *mnt;                      /* NULL with custom ops and no mount */
	const struct kvfs_client_xport_ops *ops;
	void *arg;
	/* Serializes write-then-read transactions (a response belongs to
	 * the descriptor, not to the thread) and guards @ns and @maps.
	 */
	pthread_mutex_t lock;
	struct ns_entry *ns;            /* guarded by @lock */
	struct pool_map *maps;          /* guarded by @lock */
	atomic_int last_xport;
	atomic_bool noseek;             /* the ctl file refused pwrite */
};

/* ------------------------------------------------------------ key chains */

void kvfs_client_root_key(const char *ns, const char *salt,
			  uint8_t out[KVFS_KEY_LEN])
{
	kvfs_fmt_root_key(ns ? ns : "", salt, out);
}

void kvfs_client_root_key_model(const char *ns, const char *salt,
				const char *model, uint8_t out[KVFS_KEY_LEN])
{
	kvfs_fmt_root_key_model(ns ? ns : "", salt, model, out);
}

size_t kvfs_client_chain_len(size_t n_tokens, uint32_t block_tokens,
			     unsigned flags)
{
	size_t n;

	if (!block_tokens)
		return 0;
	n = n_tokens / block_tokens;
	if ((flags & KVFS_CLIENT_CHAIN_PARTIAL) && n_tokens % block_tokens)
		n++;
	return n;
}

int kvfs_client_chain(const uint8_t parent[KVFS_KEY_LEN],
		      const uint32_t *tokens, size_t n_tokens,
		      uint32_t block_tokens, unsigned flags,
		      uint8_t (*keys)[KVFS_KEY_LEN], size_t max_keys,
		      size_t *n_keys)
{
	const uint8_t *prev = parent;
	size_t n;

	if (!parent || !n_keys || !block_tokens ||
	    (flags & ~(unsigned)KVFS_CLIENT_CHAIN_PARTIAL) ||
	    (n_tokens && !tokens)) {
		kvfs_warn("libkvfs: chain: NULL argument, block_tokens 0 or "
			  "unknown flags 0x%x", flags);
		return -EINVAL;
	}
	n = kvfs_client_chain_len(n_tokens, block_tokens, flags);
	*n_keys = n;
	if (n > max_keys)
		return -ENOSPC;
	if (n && !keys) {
		kvfs_warn("libkvfs: chain: NULL key array");
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		size_t off = i * block_tokens;
		size_t len = n_tokens - off < block_tokens ? n_tokens - off :
							     block_tokens;

		kvfs_fmt_block_key(prev, tokens + off, len, keys[i]);
		prev = keys[i];
	}
	return 0;
}

/* ------------------------------------------------------ request encoding */

static bool ns_ok(const char *ns)
{
	size_t len;

	if (!ns)
		return false;
	len = strnlen(ns, KVFS_CTL_NS_MAX);
	return len > 0 && len < KVFS_CTL_NS_MAX && !strchr(ns, '/') &&
	       strcmp(ns, ".") && strcmp(ns, "..");
}

static bool ns_needed(uint32_t op)
{
	return op != KVFS_CTL_STATS && op != KVFS_CTL_RELEASE;
}

static bool mem_ok(const struct kvfs_ctl_mem *m)
{
	if (!m || !m->size)
		return false;
	if (m->backend == KVFS_CTL_BACKEND_SHM)
		return memchr(m->shm_name, 0, sizeof(m->shm_name)) &&
		       m->shm_name[0] == '/';
	return m->backend == KVFS_CTL_BACKEND_CUDA;
}

static unsigned op_flags(uint32_t op)
{
	switch (op) {
	case KVFS_CTL_LOOKUP:
		return KVFS_CTL_F_ACCESS | KVFS_CTL_F_TOKENS |
		       KVFS_CTL_F_REMOTE;
	/* FETCH_INTO needs one offset per key, so it takes keys only */
	case KVFS_CTL_FETCH_INTO:
	case KVFS_CTL_SAVE:
	case KVFS_CTL_STATS:
		return 0;
	default:
		return KVFS_CTL_F_TOKENS;
	}
}

#define BAD(...)                                                         \
	do {                                                             \
		kvfs_warn("libkvfs: " __VA_ARGS__);                      \
		return -EINVAL;                                          \
	} while (0)

int kvfs_client_req_check(const struct kvfs_client_req *r)
{
	bool tok;
	size_t sz;

	if (!r)
		BAD("request: NULL");
	if (r->op < 1 || r->op > KVFS_CTL_OP_MAX)
		BAD("request: unknown op %u", r->op);
	if (r->xport > KVFS_CLIENT_XPORT_RW)
		BAD("request: unknown transport %u", r->xport);
	if (ns_needed(r->op) || (r->ns && r->ns[0])) {
		if (!ns_ok(r->ns))
			BAD("op %u: namespace missing, empty, longer than %u "
			    "bytes or not a name", r->op, KVFS_CTL_NS_MAX - 1);
	}
	if (r->flags & ~op_flags(r->op))
		BAD("op %u: flags 0x%x not for this op", r->op, r->flags);
	if ((r->n_keys && !r->keys) || (r->n_tokens && !r->tokens))
		BAD("op %u: NULL key or token array", r->op);
	if (r->n_keys > KVFS_CTL_MAX_BLOCKS) {
		kvfs_warn("libkvfs: op %u: %zu keys, at most %u", r->op,
			  r->n_keys, KVFS_CTL_MAX_BLOCKS);
		return -E2BIG;
	}
	tok = r->flags & KVFS_CTL_F_TOKENS;
	if (tok && r->n_keys)
		BAD("op %u: token ids and keys at once", r->op);
	switch (r->op) {
	case KVFS_CTL_LOOKUP:
	case KVFS_CTL_FETCH:
		if (tok ? !r->n_tokens : !r->n_keys || r->n_tokens)
			BAD("op %u: needs %s (and nothing else)", r->op,
			    tok ? "token ids" : "keys");
		break;
	case KVFS_CTL_FETCH_INTO:
		if (!r->n_keys || r->n_tokens)
			BAD("fetch_into: needs keys and no tokens");
		if (!r->dst_off)
			BAD("fetch_into: no destination offsets");
		if (!mem_ok(r->peer))
			BAD("fetch_into: peer memory missing or malformed");
		if (!r->sync || r->sync->shm_name[0] != '/' ||
		    !memchr(r->sync->shm_name, 0, sizeof(r->sync->shm_name)) ||
		    (r->sync->off & 3))
			BAD("fetch_into: sync word missing, its name malformed "
			    "or its offset not 4-byte aligned");
		break;
	case KVFS_CTL_SAVE:
		if (r->n_keys || !r->n_tokens)
			BAD("save: needs token ids and no keys");
		if (!r->parent)
			BAD("save: no parent key");
		if (!mem_ok(r->peer))
			BAD("save: peer memory missing or malformed");
		break;
	case KVFS_CTL_RELEASE:
		if (!tok && r->n_tokens)
			BAD("release: token ids without F_TOKENS");
		if ((r->n_keys || r->n_tokens) && !(r->ns && r->ns[0]))
			BAD("release: keys need their namespace");
		break;
	case KVFS_CTL_PIN:
	case KVFS_CTL_UNPIN:
	case KVFS_CTL_PREFETCH:
	case KVFS_CTL_EVICT:
		if (tok ? !r->n_tokens : !r->n_keys || r->n_tokens)
			BAD("op %u: needs %s (and nothing else)", r->op,
			    tok ? "token ids" : "keys");
		if (r->tier > (r->op == KVFS_CTL_EVICT ?
				       (uint32_t)KVFS_CLIENT_TIER_ALL :
				       (uint32_t)KVFS_CLIENT_TIER_SSD))
			BAD("op %u: tier %u out of range", r->op, r->tier);
		break;
	case KVFS_CTL_STATS:
		if (r->n_keys || r->n_tokens)
			BAD("stats: takes no keys or tokens");
		break;
	}
	sz = kvfs_client_req_size(r);
	if (!sz || sz > KVFS_CTL_MAX_SIZE) {
		kvfs_warn("libkvfs: op %u: request of %zu keys, %zu tokens is "
			  "over %u bytes", r->op, r->n_keys, r->n_tokens,
			  KVFS_CTL_MAX_SIZE);
		return -E2BIG;
	}
	return 0;
}

static size_t n_dst_of(const struct kvfs_client_req *r)
{
	return r->op == KVFS_CTL_FETCH_INTO ? r->n_keys : 0;
}

size_t kvfs_client_req_size(const struct kvfs_client_req *r)
{
	size_t sz = sizeof(struct kvfs_ctl_req);

	/* every count is capped far below overflow before this sum */
	if (!r || r->n_keys > KVFS_CTL_MAX_SIZE ||
	    r->n_tokens > KVFS_CTL_MAX_SIZE)
		return 0;
	sz += r->n_keys * KVFS_KEY_LEN;
	sz += r->n_tokens * sizeof(uint32_t);
	sz += n_dst_of(r) * sizeof(struct kvfs_ctl_dst);
	return sz;
}

int kvfs_client_req_encode(const struct kvfs_client_req *r, void *buf,
			   size_t cap, size_t *size)
{
	struct kvfs_ctl_req h;
	uint8_t *p = buf;
	size_t sz, n_dst;
	int rc;

	rc = kvfs_client_req_check(r);
	if (rc)
		return rc;
	if (!buf || !size)
		BAD("encode: NULL buffer");
	sz = kvfs_client_req_size(r);
	if (cap < sz)
		return -ENOSPC;
	n_dst = n_dst_of(r);
	memset(&h, 0, sizeof(h));
	h.magic = KVFS_CTL_MAGIC;
	h.abi = KVFS_CTL_ABI;
	h.op = (uint16_t)r->op;
	h.size = (uint32_t)sz;
	h.flags = r->flags;
	if (r->ns)
		memcpy(h.ns, r->ns, strlen(r->ns));
	h.n_keys = (uint32_t)r->n_keys;
	h.n_tokens = (uint32_t)r->n_tokens;
	h.n_dst = (uint32_t)n_dst;
	h.tier = r->tier;
	if (r->peer && (r->op == KVFS_CTL_FETCH_INTO ||
			r->op == KVFS_CTL_SAVE))
		h.peer = *r->peer;
	if (r->sync && r->op == KVFS_CTL_FETCH_INTO)
		h.sync = *r->sync;
	if (r->op == KVFS_CTL_SAVE) {
		h.src_off = r->src_off;
		h.start_pos = r->start_pos;
		memcpy(h.parent, r->parent, KVFS_KEY_LEN);
	}
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	if (r->n_keys) {
		memcpy(p, r->keys, r->n_keys * KVFS_KEY_LEN);
		p += r->n_keys * KVFS_KEY_LEN;
	}
	if (r->n_tokens) {
		memcpy(p, r->tokens, r->n_tokens * sizeof(uint32_t));
		p += r->n_tokens * sizeof(uint32_t);
	}
	for (size_t i = 0; i < n_dst; i++) {
		struct kvfs_ctl_dst d = { .off = r->dst_off[i] };

		memcpy(p, &d, sizeof(d));
		p += sizeof(d);
	}
	*size = sz;
	return 0;
}

uint32_t kvfs_client_resp_bound(const struct kvfs_client_req *r,
				uint32_t block_tokens)
{
	size_t n;

	if (!r)
		return 0;
	if (r->max_blocks)
		return r->max_blocks;
	switch (r->op) {
	case KVFS_CTL_STATS:
		return 0;
	case KVFS_CTL_SAVE:
		return 1;
	default:
		break;
	}
	if (r->flags & KVFS_CTL_F_TOKENS)
		n = block_tokens ? r->n_tokens / block_tokens : r->n_tokens;
	else
		n = r->n_keys;
	return n > KVFS_CTL_MAX_BLOCKS ? KVFS_CTL_MAX_BLOCKS : (uint32_t)n;
}

static size_t resp_cap(uint32_t max_blocks)
{
	return RESP_HDR + (size_t)max_blocks * BLOCK_SZ;
}

enum kvfs_client_xport kvfs_client_xport_pick(size_t req_size,
					      uint32_t max_blocks)
{
	if (req_size <= KVFS_CTL_MSG_SIZE &&
	    resp_cap(max_blocks) <= KVFS_CTL_MSG_SIZE)
		return KVFS_CLIENT_XPORT_IOCTL;
	return KVFS_CLIENT_XPORT_RW;
}

/* ------------------------------------------------------------- transport */

static ssize_t ctl_ioctl(int fd, const void *req, size_t req_len,
			 void *resp, size_t cap)
{
	const struct kvfs_ctl_req *h = req;
	struct kvfs_ctl_msg *m;
	size_t n;
	int rc;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	memcpy(m, req, req_len);
	do
		rc = ioctl(fd, (unsigned long)KVFS_IOC(h->op), m);
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		rc = -errno;
		free(m);
		return rc;
	}
	n = cap < sizeof(*m) ? cap : sizeof(*m);
	memcpy(resp, m, n);
	free(m);
	return (ssize_t)n;
}

/* pwrite/pread at offset 0 so that a transfer the kernel splits into
 * several FUSE requests still carries each piece's place; plain
 * write/read where the file is not seekable.
 */
static ssize_t xfer(int fd, bool wr, bool seek, void *buf, size_t len,
		    size_t off)
{
	ssize_t n;

	do {
		if (wr)
			n = seek ? pwrite(fd, buf, len, (off_t)off) :
				   write(fd, buf, len);
		else
			n = seek ? pread(fd, buf, len, (off_t)off) :
				   read(fd, buf, len);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

static ssize_t ctl_rw(struct kvfs_client *c, const void *req, size_t req_len,
		      void *resp, size_t cap)
{
	bool seek = !atomic_load(&c->noseek);
	int fd = c->fd;
	size_t done = 0, want = cap;
	ssize_t n;

	while (done < req_len) {
		n = xfer(fd, true, seek, (uint8_t *)req + done,
			 req_len - done, done);
		if (n == -ESPIPE && seek && !done) {
			seek = false;
			atomic_store(&c->noseek, true);
			continue;
		}
		if (n < 0)
			return n;
		if (n == 0)
			return -EIO;
		done += (size_t)n;
	}
	done = 0;
	while (done < want) {
		n = xfer(fd, false, seek, (uint8_t *)resp + done, want - done,
			 done);
		if (n < 0)
			return n;
		if (n == 0)
			break;
		done += (size_t)n;
		/* stop at the response's own length: a daemon that ignores
		 * offsets would otherwise hand the same bytes again
		 */
		if (done >= RESP_HDR) {
			const struct kvfs_ctl_resp *h = resp;
			uint32_t sz = h->size;

			if (sz >= RESP_HDR && sz < want)
				want = sz;
		}
	}
	return (ssize_t)done;
}

static ssize_t ctl_call(void *arg, enum kvfs_client_xport how,
			const void *req, size_t req_len, void *resp, size_t cap)
{
	struct kvfs_client *c = arg;

	if (how == KVFS_CLIENT_XPORT_IOCTL)
		return ctl_ioctl(c->fd, req, req_len, resp, cap);
	return ctl_rw(c, req, req_len, resp, cap);
}

static const struct kvfs_client_xport_ops ctl_ops = { .call = ctl_call };

/* ---------------------------------------------------------------- client */

static int client_new(const char *mnt, struct kvfs_client **out)
{
	struct kvfs_client *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->fd = -1;
	if (mnt) {
		c->mnt = strdup(mnt);
		if (!c->mnt) {
			free(c);
			return -ENOMEM;
		}
	}
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

int kvfs_client_open(const char *mnt, struct kvfs_client **out)
{
	struct kvfs_client *c;
	char *path;
	int rc;

	if (!mnt || !out)
		BAD("open: NULL mount point or result");
	rc = client_new(mnt, &c);
	if (rc)
		return rc;
	if (asprintf(&path, "%s/.kvfs/ctl", mnt) < 0) {
		rc = -ENOMEM;
		goto out_free;
	}
	c->fd = open(path, O_RDWR | O_CLOEXEC);
	if (c->fd < 0) {
		rc = -errno;
		kvfs_warn("libkvfs: open %s: %s", path, strerror(errno));
		free(path);
		goto out_free;
	}
	free(path);
	c->ops = &ctl_ops;
	c->arg = c;
	*out = c;
	return 0;
out_free:
	kvfs_client_close(c);
	return rc;
}

int kvfs_client_open_xport(const char *mnt,
			   const struct kvfs_client_xport_ops *ops, void *arg,
			   struct kvfs_client **out)
{
	struct kvfs_client *c;
	int rc;

	if (!ops || !ops->call || !out)
		BAD("open_xport: NULL transport or result");
	rc = client_new(mnt, &c);
	if (rc)
		return rc;
	c->ops = ops;
	c->arg = arg;
	*out = c;
	return 0;
}

void kvfs_client_close(struct kvfs_client *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	while (c->ns) {
		struct ns_entry *e = c->ns;

		c->ns = e->next;
		free(e);
	}
	while (c->maps) {
		struct pool_map *m = c->maps;

		c->maps = m->next;
		munmap((void *)m->base, m->size);
		free(m);
	}
	pthread_mutex_destroy(&c->lock);
	free(c->mnt);
	free(c);
}

enum kvfs_client_xport kvfs_client_last_xport(const struct kvfs_client *c)
{
	return c ? (enum kvfs_client_xport)atomic_load(&c->last_xport) :
		   KVFS_CLIENT_XPORT_AUTO;
}

/* --------------------------------------------------------- namespace info */

static int read_xattr(const char *path, const char *name, char *buf,
		      size_t len)
{
	ssize_t n = getxattr(path, name, buf, len - 1);

	if (n < 0)
		return errno == ENODATA ? -ENOENT : -errno;
	buf[n] = 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = 0;
	return 0;
}

/* "layers=32 kv_heads=8 head_dim=128 dtype=bf16 block_tokens=16 ..." */
static int parse_geom(char *s, struct kvfs_geom *g)
{
	static const char *const names[] = {
		"layers", "kv_heads", "head_dim", "hidden_size",
		"block_tokens", "chunk_tokens",
	};
	uint32_t *fields[] = {
		&g->n_layers, &g->n_kv_heads, &g->head_dim, &g->hidden_size,
		&g->block_tokens, &g->chunk_tokens,
	};
	unsigned seen = 0, all = (1u << 7) - 1;
	char *save = NULL, *tok, *eq;
	int d;

	memset(g, 0, sizeof(*g));
	for (tok = strtok_r(s, " \t", &save); tok;
	     tok = strtok_r(NULL, " \t", &save)) {
		eq = strchr(tok, '=');
		if (!eq)
			return -EINVAL;
		*eq++ = 0;
		if (!strcmp(tok, "dtype")) {
			d = kvfs_fmt_dtype_parse(eq);
			if (d < 0)
				return -EINVAL;
			g->dtype = (uint16_t)d;
			seen |= 1u << 6;
			continue;
		}
		for (unsigned i = 0; i < 6; i++) {
			if (strcmp(tok, names[i]))
				continue;
			if (kvfs_util_parse_u32(eq, fields[i]))
				return -EINVAL;
			seen |= 1u << i;
		}
		/* an unknown key is a newer daemon's addition: ignored */
	}
	/* hidden_size may be absent (0 = unknown) */
	seen |= 1u << 3;
	return seen == all && g->block_tokens ? 0 : -EINVAL;
}

int kvfs_client_ns_info(struct kvfs_client *c, const char *ns,
			struct kvfs_client_ns *out)
{
	struct kvfs_client_ns info;
	struct ns_entry *e;
	char buf[512], *path;
	int rc;

	if (!c || !out || !ns_ok(ns))
		BAD("ns_info: NULL client or result, or a bad namespace name");
	pthread_mutex_lock(&c->lock);
	for (e = c->ns; e; e = e->next) {
		if (!strcmp(e->name, ns)) {
			*out = e->info;
			pthread_mutex_unlock(&c->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (!c->mnt)
		return -ENOENT;
	if (asprintf(&path, "%s/%s", c->mnt, ns) < 0)
		return -ENOMEM;
	rc = read_xattr(path, "user.kvfs.root", buf, sizeof(buf));
	if (!rc && kvfs_fmt_key_parse(buf, info.root)) {
		kvfs_warn("libkvfs: %s: user.kvfs.root '%s' is not a key",
			  path, buf);
		rc = -EINVAL;
	}
	if (!rc)
		rc = read_xattr(path, "user.kvfs.geometry", buf, sizeof(buf));
	if (!rc && parse_geom(buf, &info.geom)) {
		kvfs_warn("libkvfs: %s: cannot parse user.kvfs.geometry",
			  path);
		rc = -EINVAL;
	}
	free(path);
	if (rc)
		return rc;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	memcpy(e->name, ns, strlen(ns) + 1);
	e->info = info;
	pthread_mutex_lock(&c->lock);
	/* two threads may race to add the same name: harmless duplicates */
	e->next = c->ns;
	c->ns = e;
	pthread_mutex_unlock(&c->lock);
	*out = info;
	return 0;
}

/* ------------------------------------------------------------ pool maps */

static int pool_map(struct kvfs_client *c, const struct kvfs_ctl_mem *pool,
		    const uint8_t **base)
{
	struct pool_map *m;
	struct stat st;
	void *p;
	int fd, rc = 0;

	pthread_mutex_lock(&c->lock);
	for (m = c->maps; m; m = m->next) {
		if (!strcmp(m->name, pool->shm_name) && m->size >= pool->size) {
			*base = m->base;
			goto out_unlock;
		}
	}
	fd = shm_open(pool->shm_name, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		kvfs_err("libkvfs: pool %s: %s", pool->shm_name,
			 strerror(errno));
		goto out_unlock;
	}
	if (fstat(fd, &st) || (uint64_t)st.st_size < pool->size) {
		rc = -EPROTO;
		kvfs_err("libkvfs: pool %s is smaller than the %" PRIu64
			 " bytes the daemon says", pool->shm_name, pool->size);
		goto out_close;
	}
	p = mmap(NULL, pool->size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		kvfs_err("libkvfs: map pool %s: %s", pool->shm_name,
			 strerror(errno));
		goto out_close;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		munmap(p, pool->size);
		rc = -ENOMEM;
		goto out_close;
	}
	memcpy(m->name, pool->shm_name, sizeof(m->name));
	m->size = pool->size;
	m->base = p;
	m->next = c->maps;
	c->maps = m;
	*base = p;
out_close:
	close(fd);
out_unlock:
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Pointers into the shm pool for each fetched block. */
static int set_data(struct kvfs_client *c, struct kvfs_client_blocks *out)
{
	const struct kvfs_ctl_mem *pool = &out->resp.pool;
	uint32_t n = out->resp.n_blocks;
	const uint8_t *base = NULL;
	int rc;

	if (!n || pool->backend != KVFS_CTL_BACKEND_SHM)
		return 0;
	if (!mem_ok(pool)) {
		kvfs_err("libkvfs: fetch: the daemon's pool description is "
			 "malformed");
		return -EPROTO;
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct kvfs_ctl_block *b = &out->blocks[i];

		if (b->pool_off > pool->size ||
		    b->len > pool->size - b->pool_off) {
			kvfs_err("libkvfs: fetch: block %u at %" PRIu64
				 "+%" PRIu64 " is outside the %" PRIu64
				 "-byte pool", i, b->pool_off, b->len,
				 pool->size);
			return -EPROTO;
		}
	}
	rc = pool_map(c, pool, &base);
	if (rc)
		return rc;
	out->data = calloc(n, sizeof(*out->data));
	if (!out->data)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		out->data[i] = base + out->blocks[i].pool_off;
	return 0;
}

/* ------------------------------------------------------------------ call */

void kvfs_client_blocks_release(struct kvfs_client_blocks *b)
{
	if (!b)
		return;
	free(b->blocks);
	free((void *)b->data);
	memset(b, 0, sizeof(*b));
}

static int resp_parse(const struct kvfs_client_req *r, const uint8_t *buf,
		      size_t len, uint32_t bound,
		      struct kvfs_client_blocks *out)
{
	struct kvfs_ctl_resp h;

	if (len < RESP_HDR) {
		kvfs_err("libkvfs: op %u: short response (%zu bytes)", r->op,
			 len);
		return -EPROTO;
	}
	memcpy(&h, buf, sizeof(h));
	if (h.magic != KVFS_CTL_MAGIC || h.abi != KVFS_CTL_ABI ||
	    h.op != r->op) {
		kvfs_err("libkvfs: op %u: response magic 0x%08x abi %u op %u",
			 r->op, h.magic, h.abi, h.op);
		return -EPROTO;
	}
	if (h.size > len || h.n_blocks > bound ||
	    h.size != RESP_HDR + (size_t)h.n_blocks * BLOCK_SZ) {
		kvfs_err("libkvfs: op %u: response of %u bytes with %u blocks "
			 "(got %zu bytes, at most %u blocks expected)", r->op,
			 h.size, h.n_blocks, len, bound);
		return -EPROTO;
	}
	if (h.error > 0 || h.error < -4095) {
		kvfs_err("libkvfs: op %u: response error %d", r->op, h.error);
		return -EPROTO;
	}
	out->resp = h;
	if (h.error)
		return h.error;
	if (h.n_blocks) {
		out->blocks = malloc((size_t)h.n_blocks * BLOCK_SZ);
		if (!out->blocks)
			return -ENOMEM;
		memcpy(out->blocks, buf + RESP_HDR,
		       (size_t)h.n_blocks * BLOCK_SZ);
	}
	return 0;
}

int kvfs_client_call(struct kvfs_client *c, const struct kvfs_client_req *r,
		     struct kvfs_client_blocks *out)
{
	enum kvfs_client_xport how;
	struct kvfs_client_ns info;
	uint32_t bt = 0, bound;
	uint8_t *req, *resp;
	size_t size, cap;
	ssize_t n;
	int rc;

	if (out)
		memset(out, 0, sizeof(*out));
	if (!c || !out)
		BAD("call: NULL client or result");
	rc = kvfs_client_req_check(r);
	if (rc)
		return rc;
	size = kvfs_client_req_size(r);
	if ((r->flags & KVFS_CTL_F_TOKENS) && !r->max_blocks && c->mnt &&
	    !kvfs_client_ns_info(c, r->ns, &info))
		bt = info.geom.block_tokens;
	bound = kvfs_client_resp_bound(r, bt);
	how = r->xport ? (enum kvfs_client_xport)r->xport :
			 kvfs_client_xport_pick(size, bound);
	if (how == KVFS_CLIENT_XPORT_IOCTL) {
		if (size > KVFS_CTL_MSG_SIZE) {
			kvfs_warn("libkvfs: op %u: %zu bytes do not fit an "
				  "ioctl", r->op, size);
			return -E2BIG;
		}
		/* a forced ioctl can only bring back what fits */
		if (resp_cap(bound) > KVFS_CTL_MSG_SIZE)
			bound = KVFS_CTL_IOC_KEYS;
		cap = KVFS_CTL_MSG_SIZE;
	} else {
		cap = resp_cap(bound);
	}
	req = malloc(size);
	resp = malloc(cap);
	if (!req || !resp) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = kvfs_client_req_encode(r, req, size, &size);
	if (rc)
		goto out_free;
	atomic_store(&c->last_xport, (int)how);
	if (how == KVFS_CLIENT_XPORT_RW)
		pthread_mutex_lock(&c->lock);
	n = c->ops->call(c->arg, how, req, size, resp, cap);
	if (how == KVFS_CLIENT_XPORT_RW)
		pthread_mutex_unlock(&c->lock);
	if (n < 0) {
		rc = (int)n;
		goto out_free;
	}
	rc = resp_parse(r, resp, (size_t)n > cap ? cap : (size_t)n, bound,
			out);
	if (!rc && r->op == KVFS_CTL_FETCH)
		rc = set_data(c, out);
	if (rc) {
		struct kvfs_ctl_resp h = out->resp;

		kvfs_client_blocks_release(out);
		out->resp = h;
	}
out_free:
	free(req);
	free(resp);
	return rc;
}

/* -------------------------------------------------------------- wrappers */

int kvfs_client_lookup(struct kvfs_client *c, const char *ns,
		       const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		       unsigned flags, struct kvfs_client_blocks *out)
{
	struct kvfs_client_req r = {
		.op = KVFS_CTL_LOOKUP, .ns = ns, .flags = flags,
		.keys = keys, .n_keys = n_keys,
	};

	if (flags & KVFS_CTL_F_TOKENS)
		BAD("lookup: use kvfs_client_lookup_tokens() for token ids");
	return kvfs_client_call(c, &r, out);
}

int kvfs_client_lookup_tokens(struct kvfs_client *c, const char *ns,
			      const uint32_t *tokens, size_t n_tokens,
			      unsigned flags, struct kvfs_client_blocks *out)
{
	struct kvfs_client_req r = {
		.op = KVFS_CTL_LOOKUP, .ns = ns,
		.flags = flags | KVFS_CTL_F_TOKENS,
		.tokens = tokens, .n_tokens = n_tokens,
	};

	return kvfs_client_call(c, &r, out);
}

int kvfs_client_fetch(struct kvfs_client *c, const char *ns,
		      const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		      struct kvfs_client_blocks *out)
{
	struct kvfs_client_req r = {
		.op = KVFS_CTL_FETCH, .ns = ns, .keys = keys, .n_keys = n_keys,
	};

	return kvfs_client_call(c, &r, out);
}

int kvfs_client_fetch_tokens(struct kvfs_client *c, const char *ns,
			     const uint32_t *tokens, size_t n_tokens,
			     struct kvfs_client_blocks *out)
{
	struct kvfs_client_req r = {
		.op = KVFS_CTL_FETCH, .ns = ns, .flags = KVFS_CTL_F_TOKENS,
		.tokens = tokens, .n_tokens = n_tokens,
	};

	return kvfs_client_call(c, &r, out);
}

int kvfs_client_fetch_into(struct kvfs_client *c, const char *ns,
			   const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
			   const struct kvfs_ctl_mem *peer,
			   const uint64_t *dst_off,
			   struct kvfs_client_sync *sync,
			   struct kvfs_client_blocks *out)
{
	struct kvfs_client_blocks tmp;
	struct kvfs_client_req r = {
		.op = KVFS_CTL_FETCH_INTO, .ns = ns, .keys = keys,
		.n_keys = n_keys, .dst_off = dst_off, .peer = peer,
		.sync = sync ? &sync->desc : NULL,
	};
	int rc;

	if (!sync || !sync->word)
		BAD("fetch_into: no sync word, or not initialised");
	kvfs_client_sync_reset(sync);
	rc = kvfs_client_call(c, &r, out ? out : &tmp);
	if (!out)
		kvfs_client_blocks_release(&tmp);
	return rc;
}

struct kvfs_client_job {
	pthread_t thread;
	struct kvfs_client *c;
	char ns[KVFS_CTL_NS_MAX];
	uint8_t (*keys)[KVFS_KEY_LEN];
	uint64_t *dst_off;
	size_t n_keys;
	const struct kvfs_ctl_mem *peer;
	struct kvfs_client_sync *sync;
	struct kvfs_client_blocks out;
	int rc;
};

static void *job_main(void *arg)
{
	struct kvfs_client_job *j = arg;

	j->rc = kvfs_client_fetch_into(j->c, j->ns,
				       (const uint8_t(*)[KVFS_KEY_LEN])j->keys,
				       j->n_keys, j->peer, j->dst_off, j->sync,
				       &j->out);
	return NULL;
}

int kvfs_client_fetch_into_start(struct kvfs_client *c, const char *ns,
				 const uint8_t (*keys)[KVFS_KEY_LEN],
				 size_t n_keys,
				 const struct kvfs_ctl_mem *peer,
				 const uint64_t *dst_off,
				 struct kvfs_client_sync *sync,
				 struct kvfs_client_job **job)
{
	struct kvfs_client_req r = {
		.op = KVFS_CTL_FETCH_INTO, .ns = ns, .keys = keys,
		.n_keys = n_keys, .dst_off = dst_off, .peer = peer,
		.sync = sync ? &sync->desc : NULL,
	};
	struct kvfs_client_job *j;
	int rc;

	if (!c || !job || !sync || !sync->word)
		BAD("fetch_into_start: NULL client, job or sync word");
	rc = kvfs_client_req_check(&r);
	if (rc)
		return rc;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->keys = malloc(n_keys * KVFS_KEY_LEN);
	j->dst_off = malloc(n_keys * sizeof(*dst_off));
	if (!j->keys || !j->dst_off) {
		rc = -ENOMEM;
		goto out_free;
	}
	memcpy(j->keys, keys, n_keys * KVFS_KEY_LEN);
	memcpy(j->dst_off, dst_off, n_keys * sizeof(*dst_off));
	memcpy(j->ns, ns, strlen(ns) + 1);
	j->c = c;
	j->n_keys = n_keys;
	j->peer = peer;
	j->sync = sync;
	/* before the thread exists, so a waiter never sees an old count */
	kvfs_client_sync_reset(sync);
	rc = -pthread_create(&j->thread, NULL, job_main, j);
	if (rc)
		goto out_free;
	*job = j;
	return 0;
out_free:
	free(j->keys);
	free(j->dst_off);
	free(j);
	return rc;
}

int kvfs_client_job_join(struct kvfs_client_job *j,
			 struct kvfs_client_blocks *out)
{
	int rc;

	if (!j)
		BAD("job_join: NULL job");
	pthread_join(j->thread, NULL);
	rc = j->rc;
	if (out)
		*out = j->out;
	else
		kvfs_client_blocks_release(&j->out);
	free(j->keys);
	free(j->dst_off);
	free(j);
	return rc;
}

int kvfs_client_save(struct kvfs_client *c, const char *ns,
		     const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		     const uint32_t *tokens, size_t n_tokens,
		     const struct kvfs_ctl_mem *peer, uint64_t src_off,
		     uint8_t key[KVFS_KEY_LEN])
{
	struct kvfs_client_blocks out;
	struct kvfs_client_req r = {
		.op = KVFS_CTL_SAVE, .ns = ns, .tokens = tokens,
		.n_tokens = n_tokens, .peer = peer, .src_off = src_off,
		.start_pos = start_pos, .parent = parent,
	};
	uint8_t want[KVFS_KEY_LEN];
	int rc;

	rc = kvfs_client_call(c, &r, &out);
	if (rc)
		return rc;
	kvfs_fmt_block_key(parent, tokens, n_tokens, want);
	if (memcmp(want, out.resp.key, KVFS_KEY_LEN)) {
		char a[KVFS_KEY_HEX_LEN + 1], b[KVFS_KEY_HEX_LEN + 1];

		kvfs_fmt_key_hex(want, a);
		kvfs_fmt_key_hex(out.resp.key, b);
		kvfs_err("libkvfs: save: the daemon made key %s, expected %s",
			 b, a);
		rc = -EPROTO;
	} else if (key) {
		memcpy(key, want, KVFS_KEY_LEN);
	}
	kvfs_client_blocks_release(&out);
	return rc;
}

static int keys_op(struct kvfs_client *c, uint32_t op, const char *ns,
		   const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		   uint32_t tier)
{
	struct kvfs_client_blocks out;
	struct kvfs_client_req r = {
		.op = op, .ns = ns, .keys = keys, .n_keys = n_keys,
		.tier = tier,
	};
	int rc;

	rc = kvfs_client_call(c, &r, &out);
	kvfs_client_blocks_release(&out);
	return rc;
}

int kvfs_client_release(struct kvfs_client *c, const char *ns,
			const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys)
{
	return keys_op(c, KVFS_CTL_RELEASE, ns, keys, n_keys, 0);
}

int kvfs_client_pin(struct kvfs_client *c, const char *ns,
		    const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		    enum kvfs_client_tier tier)
{
	return keys_op(c, KVFS_CTL_PIN, ns, keys, n_keys, tier);
}

int kvfs_client_unpin(struct kvfs_client *c, const char *ns,
		      const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		      enum kvfs_client_tier tier)
{
	return keys_op(c, KVFS_CTL_UNPIN, ns, keys, n_keys, tier);
}

int kvfs_client_prefetch(struct kvfs_client *c, const char *ns,
			 const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
			 enum kvfs_client_tier tier)
{
	return keys_op(c, KVFS_CTL_PREFETCH, ns, keys, n_keys, tier);
}

int kvfs_client_evict(struct kvfs_client *c, const char *ns,
		      const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		      enum kvfs_client_tier tier)
{
	return keys_op(c, KVFS_CTL_EVICT, ns, keys, n_keys, tier);
}

int kvfs_client_stats(struct kvfs_client *c, const char *ns,
		      struct kvfs_ctl_stats *out)
{
	struct kvfs_client_blocks b;
	struct kvfs_client_req r = { .op = KVFS_CTL_STATS, .ns = ns };
	int rc;

	if (!out)
		BAD("stats: NULL result");
	rc = kvfs_client_call(c, &r, &b);
	if (!rc)
		*out = b.resp.stats;
	kvfs_client_blocks_release(&b);
	return rc;
}

size_t kvfs_client_sizeof(int which)
{
	switch (which) {
	case KVFS_CLIENT_S_BLOCKS:
		return sizeof(struct kvfs_client_blocks);
	case KVFS_CLIENT_S_PEER:
		return sizeof(struct kvfs_client_peer);
	case KVFS_CLIENT_S_SYNC:
		return sizeof(struct kvfs_client_sync);
	case KVFS_CLIENT_S_NS:
		return sizeof(struct kvfs_client_ns);
	case KVFS_CLIENT_S_REQ:
		return sizeof(struct kvfs_client_req);
	default:
		return 0;
	}
}
