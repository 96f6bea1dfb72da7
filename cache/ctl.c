/* SPDX-License-Identifier: MIT */
/*
 * Control-file operations (fs/kvfs_ctl.h): LOOKUP, FETCH, FETCH_INTO, SAVE,
 * RELEASE, PIN/UNPIN, PREFETCH, EVICT, STATS, and the leases they take.
 *
 * A request is checked completely before anything happens: a malformed
 * one is refused with EINVAL and a log line, and nothing is touched.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "cache/ctl.h"
#include "meta/kvfs_ctl.h"
#include "meta/guard.h"
#include "meta/log.h"
#include "meta/util.h"

struct lease {
	struct kvfs_block *b;
	int pid;        /* the process that took it */
	uint32_t count;
	uint64_t since; /* monotonic ns of the last take */
};

/* A pool region FETCH_CHUNKS (F_POOL) filled for a client: held like a
 * lease, by the process that asked.
 */
struct region {
	struct kvfs_extent ext;
	int pid;
};

/*
 * Calls off speculative loads (kvfs_chunk_speculate) once the engine's
 * next real request arrives: held by the session and by each load it
 * started since its last FETCH_CHUNKS; freed by the last holder.
 */
struct spec_token {
	atomic_int cancel; /* set once, never cleared */
	atomic_int refs;
};

struct kvfs_ctl_session {
	struct kvfs_cache *c;
	pthread_mutex_t lock; /* guards l, n, cap, rg, nrg, caprg, spec */
	struct lease *l;
	size_t n, cap;
	struct region *rg;
	size_t nrg, caprg;
	/* The token of the loads started since the last FETCH_CHUNKS, or
	 * NULL (none yet).
	 */
	struct spec_token *spec;
	/* FETCH_CHUNKS staging, kept between requests so that its pages are
	 * faulted in once, not per request. Taken by try-lock; a concurrent
	 * request on the same descriptor stages in its own buffer.
	 */
	pthread_mutex_t stage_lock; /* guards stage, stage_len, stage_* */
	uint8_t *stage;
	size_t stage_len;
	/* The stage is registered with the device tier (pinned), so its
	 * copies to a cuda peer go by DMA without a second staging copy.
	 * Tried once per session: the tier has room for a few regions only.
	 */
	bool stage_pinned, stage_pin_tried;
	/* The client memory its last FETCH_CHUNKS wrote, kept open: an
	 * engine reuses one buffer, and mapping it anew per request costs
	 * more than a sparse fetch. Taken by try-lock like the stage.
	 */
	pthread_mutex_t peer_lock; /* guards peer */
	struct kvfs_gpu_peer *peer;
	struct kvfs_ctl_session *next; /* c->ctl_lock */
};

/* ------------------------------------------------------------- sessions */

/*
 * FUSE tells us the calling thread; leases belong to its process, so that
 * any thread's close, or the process's exit, releases them all.
 */
static int tgid_of(int tid)
{
	char path[64], line[128];
	int tgid = tid;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", tid);
	f = fopen(path, "re");
	if (!f)
		return tid;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Tgid: %d", &tgid) == 1)
			break;
	fclose(f);
	return tgid;
}

static void spec_token_put(struct spec_token *t)
{
	if (t && atomic_fetch_sub(&t->refs, 1) == 1)
		free(t);
}

/* The session's token, with a reference for a new load; NULL without
 * memory (that load then runs to its end).
 */
static struct spec_token *spec_token_get(struct kvfs_ctl_session *s)
{
	struct spec_token *t;

	pthread_mutex_lock(&s->lock);
	if (!s->spec && (s->spec = calloc(1, sizeof(*s->spec))))
		atomic_init(&s->spec->refs, 1);
	t = s->spec;
	if (t)
		atomic_fetch_add(&t->refs, 1);
	pthread_mutex_unlock(&s->lock);
	return t;
}

/*
 * The engine's real request (or its leaving) supersedes the guesses the
 * session's loads are making: their reads not yet on the disk are never
 * issued, so that the request's own do not queue behind them. Reads
 * already issued finish, and the request may join them.
 */
static void spec_cancel(struct kvfs_ctl_session *s)
{
	struct spec_token *t;

	pthread_mutex_lock(&s->lock);
	t = s->spec;
	s->spec = NULL;
	pthread_mutex_unlock(&s->lock);
	if (!t)
		return;
	atomic_store(&t->cancel, 1);
	spec_token_put(t);
}

int kvfs_ctl_open(struct kvfs_cache *c, struct kvfs_ctl_session **out)
{
	struct kvfs_ctl_session *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->c = c;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->stage_lock, NULL);
	pthread_mutex_init(&s->peer_lock, NULL);
	pthread_mutex_lock(&c->ctl_lock);
	s->next = c->sessions;
	c->sessions = s;
	pthread_mutex_unlock(&c->ctl_lock);
	*out = s;
	return 0;
}

/* Caller holds s->lock. */
static void lease_drop_at(struct kvfs_ctl_session *s, size_t i)
{
	struct kvfs_block *b = s->l[i].b;

	atomic_fetch_sub(&b->leases, (int)s->l[i].count);
	atomic_fetch_sub(&s->c->st_leases, s->l[i].count);
	kvfs_cache_put(s->c, b);
	s->l[i] = s->l[--s->n];
}

/* Caller holds s->lock. */
static int lease_take(struct kvfs_ctl_session *s, int pid,
		      struct kvfs_block *b)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->l[i].b == b && s->l[i].pid == pid) {
			s->l[i].count++;
			s->l[i].since = kvfs_util_now_mono();
			goto out_count;
		}
	}
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct lease *nl = realloc(s->l, cap * sizeof(*nl));

		if (!nl)
			return -ENOMEM;
		s->l = nl;
		s->cap = cap;
	}
	kvfs_block_get_ref(b);
	s->l[s->n++] = (struct lease){ b, pid, 1, kvfs_util_now_mono() };
out_count:
	atomic_fetch_add(&b->leases, 1);
	atomic_fetch_add(&s->c->st_leases, 1);
	return 0;
}

/* Caller holds s->lock. */
static void region_drop_at(struct kvfs_ctl_session *s, size_t i)
{
	struct kvfs_tier *gpu = s->c->tier[KVFS_TIER_GPU];

	gpu->ops->free(gpu, &s->rg[i].ext);
	s->rg[i] = s->rg[--s->nrg];
}

/* Caller holds s->lock. */
static void regions_drop_pid(struct kvfs_ctl_session *s, int pid)
{
	for (size_t i = s->nrg; i-- > 0;)
		if (pid < 0 || s->rg[i].pid == pid)
			region_drop_at(s, i);
}

void kvfs_ctl_flush(struct kvfs_ctl_session *s, int tid)
{
	int pid;

	pthread_mutex_lock(&s->lock);
	if (!s->n && !s->nrg) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	pid = tgid_of(tid);
	pthread_mutex_lock(&s->lock);
	for (size_t i = s->n; i-- > 0;)
		if (s->l[i].pid == pid)
			lease_drop_at(s, i);
	regions_drop_pid(s, pid);
	pthread_mutex_unlock(&s->lock);
}

/* Pin the session's new stage for DMA to a cuda peer (see stage_pinned).
 * Caller holds s->stage_lock.  A failure is the tier's log line, once.
 */
static void stage_pin(struct kvfs_cache *c, struct kvfs_ctl_session *s)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];

	if (!s->stage || s->stage_pin_tried || !gpu || !c->gops->host_register ||
	    strcmp(gpu->ops->name, "cuda"))
		return;
	s->stage_pin_tried = true;
	s->stage_pinned = c->gops->host_register(gpu, s->stage,
						 s->stage_len) == 0;
	/* A later, larger stage may be pinned in its place. */
	if (s->stage_pinned)
		s->stage_pin_tried = false;
}

/* Caller holds s->stage_lock, or is the session's last user. */
static void stage_unpin(struct kvfs_cache *c, struct kvfs_ctl_session *s)
{
	if (!s->stage_pinned)
		return;
	c->gops->host_unregister(c->tier[KVFS_TIER_GPU], s->stage);
	s->stage_pinned = false;
}

void kvfs_ctl_close(struct kvfs_ctl_session *s)
{
	struct kvfs_cache *c;

	if (!s)
		return;
	c = s->c;
	pthread_mutex_lock(&c->ctl_lock);
	for (struct kvfs_ctl_session **pp = &c->sessions; *pp;
	     pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->ctl_lock);
	spec_cancel(s);
	pthread_mutex_lock(&s->lock);
	while (s->n)
		lease_drop_at(s, s->n - 1);
	regions_drop_pid(s, -1);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->stage_lock);
	if (s->peer)
		c->gops->peer_close(c->tier[KVFS_TIER_GPU], s->peer);
	pthread_mutex_destroy(&s->peer_lock);
	stage_unpin(c, s);
	free(s->stage);
	free(s->l);
	free(s->rg);
	free(s);
}

/*
 * Leases older than lease_ms are taken back, so an engine that hangs
 * cannot pin the cache forever. Runs in the mover thread.
 */
void kvfs_ctl_reclaim(struct kvfs_cache *c)
{
	uint64_t now = kvfs_util_now_mono();
	uint64_t limit = (uint64_t)c->conf.lease_ms * 1000000ull;

	pthread_mutex_lock(&c->ctl_lock);
	for (struct kvfs_ctl_session *s = c->sessions; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		for (size_t i = s->n; i-- > 0;) {
			char hex[KVFS_KEY_HEX_LEN + 1];

			if (now - s->l[i].since < limit)
				continue;
			kvfs_fmt_key_hex(s->l[i].b->pn.key, hex);
			kvfs_warn("lease on %s.kv held for more than %u ms: "
				  "reclaimed (the engine holding it may be "
				  "stuck)", hex, c->conf.lease_ms);
			atomic_fetch_add(&c->st_leases_reclaimed,
					 s->l[i].count);
			lease_drop_at(s, i);
		}
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&c->ctl_lock);
}

static int reclaim_task(struct kvfs_cache *c)
{
	kvfs_ctl_reclaim(c);
	return 0;
}

int kvfs_ctl_init(struct kvfs_cache *c)
{
	return kvfs_task_add(c, "lease reclaim", reclaim_task);
}

/* -------------------------------------------------------------- checking */

static int bad(const char *why, uint32_t op)
{
	kvfs_warn("ctl: malformed request (op %u): %s", op, why);
	return -EINVAL;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static int check_req(const struct kvfs_ctl_req *r, size_t len)
{
	uint64_t want;

	if (len < sizeof(*r))
		return bad("shorter than struct kvfs_ctl_req", 0);
	if (r->magic != KVFS_CTL_MAGIC)
		return bad("bad magic", r->op);
	if (r->abi != KVFS_CTL_ABI)
		return bad("unsupported ABI version", r->op);
	if (r->op < 1 || r->op > KVFS_CTL_OP_MAX)
		return bad("unknown operation", r->op);
	if (r->size != len)
		return bad("size field differs from the bytes sent", r->op);
	if (!memchr(r->ns, 0, sizeof(r->ns)))
		return bad("namespace not NUL-terminated", r->op);
	if (r->flags & ~(unsigned)(KVFS_CTL_F_ACCESS | KVFS_CTL_F_TOKENS |
				   KVFS_CTL_F_SPECULATE | KVFS_CTL_F_POOL))
		return bad("unknown flags", r->op);
	if (!all_zero(r->reserved, sizeof(r->reserved)))
		return bad("reserved bytes not zero", r->op);
	if (r->n_keys > KVFS_CTL_MAX_BLOCKS ||
	    r->n_tokens > KVFS_CTL_MAX_SIZE / 4 ||
	    r->n_dst > KVFS_CTL_MAX_BLOCKS)
		return bad("too many keys, tokens or destinations", r->op);
	if (r->n_chunks > KVFS_CTL_MAX_SIZE / 4 ||
	    r->n_scores > KVFS_CTL_MAX_SIZE / 4)
		return bad("too many chunks or scores", r->op);
	want = sizeof(*r) + (uint64_t)r->n_keys * 16 +
	       (uint64_t)r->n_tokens * 4 + (uint64_t)r->n_dst * 8 +
	       (uint64_t)r->n_chunks * 4 + (uint64_t)r->n_scores * 4;
	if (want != len)
		return bad("size does not match the array counts", r->op);
	if (r->tier > 3)
		return bad("tier out of range", r->op);
	if (r->op == KVFS_CTL_FETCH_INTO && r->n_dst != r->n_keys)
		return bad("FETCH_INTO needs one destination per key", r->op);
	if (r->op == KVFS_CTL_FETCH_INTO && (r->flags & KVFS_CTL_F_TOKENS))
		return bad("FETCH_INTO takes keys, not tokens", r->op);
	if (r->op == KVFS_CTL_FETCH_CHUNKS) {
		if (r->n_dst != ((r->flags & KVFS_CTL_F_POOL) ? 0u : 1u))
			return bad("FETCH_CHUNKS takes one destination, or none "
				   "with F_POOL", r->op);
		if (!r->n_keys || !r->n_chunks || !r->n_layers)
			return bad("FETCH_CHUNKS needs keys, chunks and layers",
				   r->op);
		if (r->n_scores)
			return bad("FETCH_CHUNKS takes no scores", r->op);
	} else if (r->op != KVFS_CTL_FETCH_INTO && r->n_dst) {
		return bad("destinations given to an operation without any",
			   r->op);
	}
	if (r->op == KVFS_CTL_SCORES &&
	    (!r->n_keys || !r->n_chunks || r->n_scores != r->n_chunks))
		return bad("SCORES pairs one score with each chunk", r->op);
	if (r->op != KVFS_CTL_FETCH_CHUNKS && r->op != KVFS_CTL_SCORES &&
	    (r->n_chunks || r->n_scores || r->layer_first || r->n_layers ||
	     r->sub_period))
		return bad("chunk fields given to an operation without any",
			   r->op);
	if (r->flags & (KVFS_CTL_F_SPECULATE | KVFS_CTL_F_POOL) &&
	    r->op != KVFS_CTL_FETCH_CHUNKS)
		return bad("chunk flags given to an operation without any",
			   r->op);
	return 0;
}

/* ------------------------------------------------------------- responses */

struct ctx {
	struct kvfs_ctl_session *s;
	int pid;
	struct kvfs_cache *c;
	const struct kvfs_ctl_req *r;
	const uint8_t (*keys)[16];
	const uint32_t *tokens;
	const struct kvfs_ctl_dst *dst;
	const uint32_t *chunks;
	const float *scores;
	struct kvfs_ns *ns;
	uint8_t (*chain)[16]; /* keys derived from tokens */
	size_t nk;            /* keys to work on */
	struct kvfs_ctl_resp *resp;
	struct kvfs_ctl_block *blk;
};

static const uint8_t *key_at(const struct ctx *x, size_t i)
{
	return x->chain ? x->chain[i] : x->keys[i];
}

static int fail(struct ctx *x, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct ctx *x, int err, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kvfs_info("ctl op %u: %s", x->r->op, msg);
	x->resp->error = err;
	return 0;
}

/* The namespace, and the keys the request names (directly, or chained from
 * token ids over full blocks).
 */
static int resolve(struct ctx *x)
{
	const struct kvfs_geom *g;
	uint8_t parent[16];

	/* STATS and a RELEASE of everything concern the session, not a
	 * namespace.
	 */
	if (!x->r->ns[0] && (x->r->op == KVFS_CTL_STATS ||
			     (x->r->op == KVFS_CTL_RELEASE && !x->r->n_keys &&
			      !x->r->n_tokens)))
		return 0;
	x->ns = kvfs_cache_ns_by_name(x->c, x->r->ns);
	if (!x->ns)
		return fail(x, -ENOENT, "unknown namespace '%s'", x->r->ns);
	if (!(x->r->flags & KVFS_CTL_F_TOKENS)) {
		x->nk = x->r->n_keys;
		return 0;
	}
	g = kvfs_ns_geom(x->ns);
	x->nk = x->r->n_tokens / g->block_tokens;
	x->chain = calloc(x->nk ? x->nk : 1, 16);
	if (!x->chain)
		return -ENOMEM;
	memcpy(parent, kvfs_ns_root(x->ns), 16);
	for (size_t i = 0; i < x->nk; i++) {
		kvfs_fmt_block_key(parent, x->tokens + i * g->block_tokens,
				   g->block_tokens, x->chain[i]);
		memcpy(parent, x->chain[i], 16);
	}
	return 0;
}

/* The committed block of @key in the request's namespace, referenced. */
static struct kvfs_block *find(struct ctx *x, const uint8_t *key)
{
	struct kvfs_block *b = kvfs_index_find_key(x->c, key);

	if (b && (b->ns != x->ns ||
		  (atomic_load(&b->flags) & KVFS_B_DELETED))) {
		kvfs_cache_put(x->c, b);
		b = NULL;
	}
	return b;
}

static void put_all(struct kvfs_cache *c, struct kvfs_block **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		kvfs_cache_put(c, v[i]);
}

/* Every key must name a block: fills @v (referenced) or fails the
 * response with ENOENT naming the first missing key.
 */
static int find_all(struct ctx *x, struct kvfs_block **v)
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	for (size_t i = 0; i < x->nk; i++) {
		v[i] = find(x, key_at(x, i));
		if (!v[i]) {
			put_all(x->c, v, i);
			x->resp->n_cached = (uint32_t)i;
			kvfs_fmt_key_hex(key_at(x, i), hex);
			return fail(x, -ENOENT, "block %s.kv is not cached",
				    hex);
		}
	}
	return 0;
}

static void fill_block(struct ctx *x, size_t i, struct kvfs_block *b)
{
	struct kvfs_ctl_block *o = &x->blk[i];

	memcpy(o->key, key_at(x, i), 16);
	if (!b)
		return;
	o->tiers = atomic_load(&b->tiers);
	o->n_tokens = b->n_tokens;
	o->len = b->size - kvfs_block_payload_off(b);
	o->layer_bytes = o->len / b->ns->geom.n_layers;
}

/* ------------------------------------------------------------ operations */

static int op_lookup(struct ctx *x)
{
	bool leading = true;

	x->resp->n_blocks = (uint32_t)x->nk;
	for (size_t i = 0; i < x->nk; i++) {
		struct kvfs_block *b = find(x, key_at(x, i));

		fill_block(x, i, b);
		if (!b) {
			leading = false;
			continue;
		}
		if (leading)
			x->resp->n_cached++;
		/* Existence checks must not look like use: only an explicit
		 * access flag counts (Mooncake starved on the opposite).
		 */
		if (leading && (x->r->flags & KVFS_CTL_F_ACCESS))
			kvfs_cache_touch(x->c, b);
		kvfs_cache_put(x->c, b);
	}
	return 0;
}

static int need_gpu(struct ctx *x)
{
	if (x->c->tier[KVFS_TIER_GPU])
		return 0;
	fail(x, -ENODEV, "%s", "no device tier configured ([tier.gpu])");
	return -ENODEV;
}

static int op_fetch(struct ctx *x)
{
	struct kvfs_block **v;
	int rc;

	if (need_gpu(x))
		return 0;
	v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	rc = find_all(x, v);
	if (rc || x->resp->error)
		goto out_free;
	/* Lease first: a leased block is never moved, so nothing can evict
	 * what this batch loads before the caller has it.
	 */
	pthread_mutex_lock(&x->s->lock);
	for (size_t i = 0; i < x->nk && !rc; i++)
		rc = lease_take(x->s, x->pid, v[i]);
	pthread_mutex_unlock(&x->s->lock);
	if (!rc)
		rc = kvfs_gpu_load(x->c, v, x->nk, 0);
	if (rc) {
		/* Give back exactly what this request took. */
		pthread_mutex_lock(&x->s->lock);
		for (size_t i = 0; i < x->nk; i++) {
			for (size_t j = 0; j < x->s->n; j++) {
				if (x->s->l[j].b != v[i] ||
				    x->s->l[j].pid != x->pid)
					continue;
				atomic_fetch_sub(&v[i]->leases, 1);
				atomic_fetch_sub(&x->c->st_leases, 1);
				if (--x->s->l[j].count == 0) {
					x->s->l[j].count = 0;
					kvfs_cache_put(x->c, v[i]);
					x->s->l[j] = x->s->l[--x->s->n];
				}
				break;
			}
		}
		pthread_mutex_unlock(&x->s->lock);
		fail(x, rc, "%s", rc == -ENOSPC ?
			"the device pool is full of leased or pinned blocks" :
			"loading into the device pool failed");
		rc = 0;
		goto out_put;
	}
	x->c->gops->describe(x->c->tier[KVFS_TIER_GPU], &x->resp->pool);
	x->resp->n_blocks = (uint32_t)x->nk;
	x->resp->n_cached = (uint32_t)x->nk;
	for (size_t i = 0; i < x->nk; i++) {
		fill_block(x, i, v[i]);
		pthread_mutex_lock(&v[i]->lock);
		x->blk[i].pool_off = v[i]->gpu.off +
				     kvfs_block_payload_off(v[i]);
		pthread_mutex_unlock(&v[i]->lock);
		atomic_fetch_add(&x->c->st_fetch_bytes, x->blk[i].len);
		kvfs_cache_touch(x->c, v[i]);
	}
	atomic_fetch_add(&x->c->st_fetches, 1);
out_put:
	put_all(x->c, v, x->nk);
out_free:
	free(v);
	return rc;
}

/* The caller's completion word. */
struct sync_word {
	uint32_t *w;
	void *map;
	size_t len;
};

static int sync_open(struct ctx *x, struct sync_word *sw)
{
	const struct kvfs_ctl_sync *s = &x->r->sync;
	struct stat st;
	int fd;

	memset(sw, 0, sizeof(*sw));
	if (!memchr(s->shm_name, 0, sizeof(s->shm_name)) ||
	    s->shm_name[0] != '/' || strchr(s->shm_name + 1, '/') ||
	    (s->off & 3))
		return fail(x, -EINVAL, "%s", "bad sync word (shm name or "
			    "alignment)"), -EINVAL;
	fd = shm_open(s->shm_name, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0)
		return fail(x, -ENOENT, "sync shm %s does not exist",
			    s->shm_name), -ENOENT;
	/* Not s->off + 4 <= size: an offset near 2^64 would wrap past it
	 * and put the word before the mapping.
	 */
	if (fstat(fd, &st) || st.st_size < 4 ||
	    s->off > (uint64_t)st.st_size - 4) {
		close(fd);
		return fail(x, -EINVAL, "sync word outside shm %s",
			    s->shm_name), -EINVAL;
	}
	sw->len = (size_t)st.st_size;
	sw->map = mmap(NULL, sw->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       0);
	close(fd);
	if (sw->map == MAP_FAILED) {
		sw->map = NULL;
		return fail(x, -EIO, "%s", "cannot map the sync word"), -EIO;
	}
	sw->w = (uint32_t *)((uint8_t *)sw->map + s->off);
	return 0;
}

static void sync_signal(struct sync_word *sw, uint32_t v)
{
	/* The word lives in the caller's object, which it may shrink. */
	if (kvfs_guard_store_u32(sw->w, v)) {
		kvfs_warn("ctl: the sync word's shm object shrank");
		return;
	}
	/* Shared futex: waiters in other processes wake on this word. */
	syscall(SYS_futex, sw->w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static void sync_close(struct sync_word *sw)
{
	if (sw->map)
		munmap(sw->map, sw->len);
}

/* A FETCH_INTO destination: block @i's payload at [off, off + len). */
struct dst_range {
	uint64_t off, len;
	size_t i;
};

static int dst_cmp(const void *pa, const void *pb)
{
	const struct dst_range *a = pa, *b = pb;

	if (a->off != b->off)
		return a->off < b->off ? -1 : 1;
	return (a->i > b->i) - (a->i < b->i);
}

/*
 * FETCH_INTO's destinations must not overlap: which block's bytes would
 * end up in the shared ones depends on the order of the copies, which
 * differs between the device backends, and no engine means it (two
 * blocks in one slot of its KV cache). Sorted, an overlap shows between
 * neighbours, so this is O(n log n) for requests of thousands of blocks.
 * @ord gets the blocks in ascending destination order, the order the
 * copies are issued in (the device tier then confirms the order in one
 * pass). 0, also when the response was failed with EINVAL (logged with
 * the two blocks); -ENOMEM.
 */
static int dst_order(struct ctx *x, struct kvfs_block **v, size_t *ord)
{
	struct dst_range *d = calloc(x->nk ? x->nk : 1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	for (size_t i = 0; i < x->nk; i++) {
		d[i].off = x->dst[i].off;
		d[i].len = v[i]->size - kvfs_block_payload_off(v[i]);
		d[i].i = i;
	}
	qsort(d, x->nk, sizeof(*d), dst_cmp);
	for (size_t k = 0; k < x->nk; k++)
		ord[k] = d[k].i;
	for (size_t k = 1; k < x->nk; k++) {
		const struct dst_range *a = &d[k - 1], *b = &d[k];

		/* b starts no earlier than a: no a.off + a.len to overflow */
		if (a->len <= b->off - a->off)
			continue;
		if (a->i > b->i) {
			const struct dst_range *t = a;

			a = b;
			b = t;
		}
		fail(x, -EINVAL, "destinations of blocks %zu [%" PRIu64 ", +%"
		     PRIu64 ") and %zu [%" PRIu64 ", +%" PRIu64 ") overlap in "
		     "the caller's memory; nothing copied", a->i, a->off,
		     a->len, b->i, b->off, b->len);
		break;
	}
	free(d);
	return 0;
}

struct src {
	struct kvfs_block *b;
	struct kvfs_reader r;
	const uint8_t *host;  /* image when not in the pool */
	struct kvfs_extent gpu;
	bool reading;
};

static int op_fetch_into(struct ctx *x)
{
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	const struct kvfs_gpu_ops *go = x->c->gops;
	struct kvfs_gpu_peer *peer = NULL;
	struct kvfs_gpu_xfer *xf = NULL;
	struct kvfs_block **v = NULL;
	struct src *src = NULL;
	struct sync_word sw = { 0 };
	uint64_t lb = 0, layers, psize;
	size_t *ord = NULL;
	int rc = 0;

	if (need_gpu(x))
		return 0;
	v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	src = calloc(x->nk ? x->nk : 1, sizeof(*src));
	xf = calloc(x->nk ? x->nk : 1, sizeof(*xf));
	ord = calloc(x->nk ? x->nk : 1, sizeof(*ord));
	if (!v || !src || !xf || !ord) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = find_all(x, v);
	if (rc || x->resp->error)
		goto out_free;
	/* Before anything is opened, leased or copied: only the blocks'
	 * references are held, and out_put drops them.
	 */
	rc = dst_order(x, v, ord);
	if (rc || x->resp->error)
		goto out_put;
	layers = x->ns->geom.n_layers;
	rc = go->peer_open(gpu, &x->r->peer, &peer);
	if (rc) {
		fail(x, rc, "%s", "cannot open the caller's memory");
		rc = 0;
		goto out_put;
	}
	psize = go->peer_size(peer);
	/* Every destination range is checked before any byte moves. */
	for (size_t i = 0; i < x->nk; i++) {
		uint64_t len = v[i]->size - kvfs_block_payload_off(v[i]);

		if (x->dst[i].off > psize || len > psize - x->dst[i].off) {
			fail(x, -EINVAL, "%s", "a destination range falls "
			     "outside the caller's memory");
			goto out_peer;
		}
	}
	if (sync_open(x, &sw))
		goto out_peer;
	/* Hold every source: a lease keeps the pool copy, an open handle
	 * keeps the DRAM copy.
	 */
	pthread_mutex_lock(&x->s->lock);
	for (size_t i = 0; i < x->nk && !rc; i++)
		rc = lease_take(x->s, x->pid, v[i]);
	pthread_mutex_unlock(&x->s->lock);
	for (size_t i = 0; i < x->nk && !rc; i++) {
		src[i].b = v[i];
		pthread_mutex_lock(&v[i]->lock);
		src[i].gpu = v[i]->gpu;
		pthread_mutex_unlock(&v[i]->lock);
		if (src[i].gpu.len)
			continue;
		size_t n;

		kvfs_block_get_ref(v[i]);
		rc = kvfs_cache_reader_init(x->c, &src[i].r, v[i]);
		if (!rc) {
			rc = kvfs_cache_read_begin(x->c, &src[i].r, 0,
						   v[i]->size,
						   (const void **)&src[i].host,
						   &n);
			if (rc)
				kvfs_cache_reader_release(x->c, &src[i].r);
			else
				src[i].reading = true;
		}
	}
	if (rc) {
		fail(x, rc, "%s", "reading a block failed");
		sync_signal(&sw, KVFS_CTL_SYNC_FAILED);
		rc = 0;
		goto out_release;
	}
	/* Layer by layer across all blocks: the engine may start layer l
	 * while later layers are still being copied. Within a layer, in
	 * ascending destination order (any order leaves the same bytes,
	 * the destinations being disjoint).
	 */
	sync_signal(&sw, 0);
	for (uint64_t l = 0; l < layers; l++) {
		for (size_t k = 0; k < x->nk; k++) {
			size_t i = ord[k];
			uint64_t po = kvfs_block_payload_off(v[i]);

			lb = (v[i]->size - po) / layers;
			xf[k].pool = src[i].gpu.len ? &src[i].gpu : NULL;
			xf[k].off = po + l * lb;
			xf[k].host = src[i].gpu.len ?
					     NULL :
					     (void *)(src[i].host + po + l * lb);
			xf[k].peer_off = x->dst[i].off + l * lb;
			xf[k].len = lb;
		}
		rc = go->peer_write(gpu, peer, xf, x->nk);
		if (rc) {
			sync_signal(&sw, KVFS_CTL_SYNC_FAILED | (uint32_t)l);
			fail(x, rc, "%s", "copying into the caller's memory "
			     "failed");
			rc = 0;
			goto out_release;
		}
		sync_signal(&sw, (uint32_t)(l + 1));
	}
	x->resp->n_blocks = (uint32_t)x->nk;
	x->resp->n_cached = (uint32_t)x->nk;
	for (size_t i = 0; i < x->nk; i++) {
		fill_block(x, i, v[i]);
		atomic_fetch_add(&x->c->st_fetch_into_bytes, x->blk[i].len);
		kvfs_cache_touch(x->c, v[i]);
	}
out_release:
	for (size_t i = 0; i < x->nk; i++) {
		if (src[i].reading) {
			kvfs_cache_read_end(x->c, &src[i].r);
			kvfs_cache_reader_release(x->c, &src[i].r);
		}
	}
	/* The temporary leases of the copy. */
	pthread_mutex_lock(&x->s->lock);
	for (size_t i = 0; i < x->nk; i++) {
		for (size_t j = 0; j < x->s->n; j++) {
			if (x->s->l[j].b != v[i] || x->s->l[j].pid != x->pid)
				continue;
			atomic_fetch_sub(&v[i]->leases, 1);
			atomic_fetch_sub(&x->c->st_leases, 1);
			if (--x->s->l[j].count == 0) {
				kvfs_cache_put(x->c, v[i]);
				x->s->l[j] = x->s->l[--x->s->n];
			}
			break;
		}
	}
	pthread_mutex_unlock(&x->s->lock);
	sync_close(&sw);
out_peer:
	go->peer_close(gpu, peer);
out_put:
	put_all(x->c, v, x->nk);
out_free:
	free(v);
	free(src);
	free(xf);
	free(ord);
	return rc;
}

static int op_save(struct ctx *x)
{
	const struct kvfs_geom *g = kvfs_ns_geom(x->ns);
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	struct kvfs_gpu_peer *peer = NULL;
	struct kvfs_pending *p;
	struct kvfs_block *b;
	struct kvfs_gpu_xfer xf = { 0 };
	uint64_t size, off, plen;
	char name[KVFS_FMT_NAME_LEN + 1];
	uint8_t *buf;
	int rc;

	if (need_gpu(x))
		return 0;
	if (x->r->n_keys || !x->r->n_tokens || x->r->n_tokens > g->block_tokens ||
	    (x->r->flags & KVFS_CTL_F_TOKENS))
		return fail(x, -EINVAL, "%s", "SAVE takes 1..block_tokens "
			    "token ids and no keys");
	size = kvfs_fmt_file_size(g, KVFS_KIND_KV, x->r->n_tokens);
	off = kvfs_fmt_payload_off(x->r->n_tokens);
	plen = size - off;
	buf = aligned_alloc(KVFS_FMT_ALIGN,
			    kvfs_util_align_up(size, KVFS_FMT_ALIGN));
	if (!buf)
		return -ENOMEM;
	rc = x->c->gops->peer_open(gpu, &x->r->peer, &peer);
	if (rc) {
		fail(x, rc, "%s", "cannot open the caller's memory");
		goto out_free;
	}
	xf.host = buf + off;
	xf.peer_off = x->r->src_off;
	xf.len = plen;
	if (x->r->src_off > x->c->gops->peer_size(peer) ||
	    plen > x->c->gops->peer_size(peer) - x->r->src_off)
		rc = -EINVAL;
	else
		rc = x->c->gops->peer_read(gpu, peer, &xf, 1);
	x->c->gops->peer_close(gpu, peer);
	if (rc) {
		fail(x, rc, "%s", "the payload range is outside the caller's "
		     "memory, or the copy failed");
		goto out_free;
	}
	/* The header, key and checksums are ours; validation is the same as
	 * for a written file.
	 */
	rc = kvfs_fmt_build(g, KVFS_KIND_KV, x->r->parent, x->r->start_pos,
			    x->tokens, x->r->n_tokens, NULL, buf, size);
	if (rc) {
		fail(x, rc, "%s", "cannot build a block from the request");
		goto out_free;
	}
	kvfs_fmt_key_hex(buf + 64, name);
	memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
	memcpy(x->resp->key, buf + 64, 16);
	rc = kvfs_cache_create(x->c, x->ns, name, &p);
	if (!rc)
		rc = kvfs_cache_write(p, 0, buf, size);
	if (!rc) {
		rc = kvfs_cache_commit(x->c, p, &b);
		p = NULL;
		if (!rc)
			kvfs_cache_put(x->c, b);
	} else if (rc != -EEXIST) {
		kvfs_cache_abandon(x->c, p);
	}
	if (rc)
		fail(x, rc, "block %s not saved", name);
	else
		atomic_fetch_add(&x->c->st_saves, 1);
out_free:
	free(buf);
	return 0;
}

static int op_release(struct ctx *x)
{
	pthread_mutex_lock(&x->s->lock);
	if (!x->nk) {
		for (size_t j = x->s->n; j-- > 0;)
			if (x->s->l[j].pid == x->pid)
				lease_drop_at(x->s, j);
		regions_drop_pid(x->s, x->pid);
	}
	for (size_t i = 0; i < x->nk; i++) {
		for (size_t j = 0; j < x->s->n; j++) {
			if (x->s->l[j].pid == x->pid &&
			    !memcmp(x->s->l[j].b->pn.key, key_at(x, i), 16)) {
				lease_drop_at(x->s, j);
				break;
			}
		}
	}
	pthread_mutex_unlock(&x->s->lock);
	return 0;
}

static int op_pin(struct ctx *x, bool pin)
{
	struct kvfs_block **v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	int rc = 0;

	if (!v)
		return -ENOMEM;
	if (find_all(x, v) || x->resp->error)
		goto out_free;
	for (size_t i = 0; i < x->nk && !rc; i++) {
		if (!pin) {
			rc = kvfs_cache_unpin(x->c, v[i]);
		} else if (x->r->tier < KVFS_NTIERS) {
			rc = kvfs_cache_pin(x->c, v[i], (int)x->r->tier);
		} else {
			rc = -EINVAL;
		}
	}
	if (rc)
		fail(x, rc, "%s", pin ? "pin failed" : "unpin failed");
	put_all(x->c, v, x->nk);
out_free:
	free(v);
	return 0;
}

struct prefetch_job {
	struct kvfs_cache *c;
	struct kvfs_block **v;
	size_t n;
	uint32_t tier;
};

static void *prefetch_main(void *arg)
{
	struct prefetch_job *j = arg;

	if (j->tier == KVFS_TIER_GPU) {
		kvfs_gpu_load(j->c, j->v, j->n, 0);
	} else {
		for (size_t i = 0; i < j->n; i++) {
			struct kvfs_block *b = j->v[i];

			pthread_mutex_lock(&b->io_lock);
			if (!atomic_load(&b->dram_ptr))
				kvfs_promote_load(j->c, b);
			pthread_mutex_unlock(&b->io_lock);
		}
	}
	put_all(j->c, j->v, j->n);
	kvfs_bg_end(j->c);
	free(j->v);
	free(j);
	return NULL;
}

/* A hint: blocks that exist are brought up in the background; the call
 * returns at once and missing keys are ignored.
 */
static int op_prefetch(struct ctx *x)
{
	struct prefetch_job *j;
	pthread_attr_t at;
	pthread_t t;

	if (x->r->tier != KVFS_TIER_GPU && x->r->tier != KVFS_TIER_DRAM)
		return fail(x, -EINVAL, "%s", "PREFETCH goes to gpu or dram");
	if (x->r->tier == KVFS_TIER_GPU && need_gpu(x))
		return 0;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->v = calloc(x->nk ? x->nk : 1, sizeof(*j->v));
	if (!j->v) {
		free(j);
		return -ENOMEM;
	}
	j->c = x->c;
	j->tier = x->r->tier;
	for (size_t i = 0; i < x->nk; i++) {
		struct kvfs_block *b = find(x, key_at(x, i));

		if (!b)
			continue;
		j->v[j->n++] = b;
		/* Hidden states already in DRAM load nothing, so the thread
		 * below would never restore them: submit the restoration
		 * here (it only queues a job; the loads' own restorations
		 * are submitted as each load completes).
		 */
		if (atomic_load(&b->dram_ptr))
			kvfs_rpool_ahead(x->c, b);
	}
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	/* Before the thread starts: it frees @j. */
	x->resp->n_cached = (uint32_t)j->n;
	kvfs_bg_begin(x->c);
	if (pthread_create(&t, &at, prefetch_main, j)) {
		x->resp->n_cached = 0;
		kvfs_bg_end(x->c);
		put_all(x->c, j->v, j->n);
		free(j->v);
		free(j);
		pthread_attr_destroy(&at);
		return fail(x, -EAGAIN, "%s", "no thread for the prefetch");
	}
	pthread_attr_destroy(&at);
	return 0;
}

static int op_evict(struct ctx *x)
{
	struct kvfs_block **v = calloc(x->nk ? x->nk : 1, sizeof(*v));
	int rc = 0;

	if (!v)
		return -ENOMEM;
	if (find_all(x, v) || x->resp->error)
		goto out_free;
	for (size_t i = 0; i < x->nk && !rc; i++) {
		if (atomic_load(&v[i]->leases)) {
			rc = -EBUSY;
			break;
		}
		switch (x->r->tier) {
		case KVFS_TIER_GPU:
			rc = kvfs_gpu_drop(x->c, v[i]);
			if (rc == -ENOENT)
				rc = 0;
			break;
		case KVFS_TIER_DRAM:
			rc = kvfs_dram_drop(x->c, v[i]);
			break;
		default:
			rc = atomic_load(&v[i]->pins) ?
				     -EBUSY :
				     kvfs_block_delete(x->c, v[i],
						       "evicted through ctl");
			break;
		}
	}
	if (rc)
		fail(x, rc, "%s", rc == -EBUSY ? "a block is leased, pinned or "
			     "open" : "evict failed");
	put_all(x->c, v, x->nk);
out_free:
	free(v);
	return 0;
}

static int op_stats(struct ctx *x)
{
	struct kvfs_ctl_stats *st = &x->resp->stats;
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];

	pthread_mutex_lock(&x->s->lock);
	for (size_t i = 0; i < x->s->n; i++)
		if (x->s->l[i].pid == x->pid)
			st->leases += x->s->l[i].count;
	pthread_mutex_unlock(&x->s->lock);
	st->leases_total = atomic_load(&x->c->st_leases);
	st->leases_reclaimed = atomic_load(&x->c->st_leases_reclaimed);
	if (gpu) {
		st->pool_capacity = gpu->capacity;
		st->pool_used = atomic_load(&gpu->used);
		st->pool_blocks = atomic_load(&gpu->st.blocks);
	}
	st->fetches = atomic_load(&x->c->st_fetches);
	st->fetch_bytes = atomic_load(&x->c->st_fetch_bytes);
	st->fetch_into_bytes = atomic_load(&x->c->st_fetch_into_bytes);
	st->saves = atomic_load(&x->c->st_saves);
	struct kvfs_chunk_stats cs;

	kvfs_chunk_get_stats(x->c, &cs);
	st->chunk_bytes_wanted = cs.bytes_wanted;
	st->chunk_bytes_read = cs.bytes_read;
	st->chunk_reads = cs.ssd_reads;
	st->chunk_hits = cs.mem_hits;
	st->spec_loaded = cs.spec_loaded;
	st->spec_used = cs.spec_used;
	return 0;
}

/* ------------------------------------------------------ chunks (issue 6) */

/* Map prefix-global chunk @j over blocks @v to (block, local chunk). */
static int chunk_locate(struct ctx *x, struct kvfs_block **v, uint32_t j,
			size_t *bi, uint32_t *local)
{
	uint32_t c = x->ns->geom.chunk_tokens;

	for (size_t i = 0; i < x->nk; i++) {
		uint32_t n = (v[i]->n_tokens + c - 1) / c;

		if (j < n) {
			*bi = i;
			*local = j;
			return 0;
		}
		j -= n;
	}
	return -EINVAL;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

struct spec_job {
	struct kvfs_cache *c;
	struct kvfs_block **v;
	size_t nv;
	struct kvfs_chunk_piece *p;
	size_t n;
	struct spec_token *tok; /* a reference; NULL: cannot be called off */
};

static void *spec_main(void *arg)
{
	struct spec_job *j = arg;
	struct kvfs_chunk_result res;

	/* One superseded before it began has nothing to load. */
	if (!j->tok)
		kvfs_chunk_read(j->c, j->p, j->n, KVFS_CHUNK_SPECULATIVE,
				&res);
	else if (!atomic_load(&j->tok->cancel))
		kvfs_chunk_speculate(j->c, j->p, j->n, &j->tok->cancel, &res);
	spec_token_put(j->tok);
	put_all(j->c, j->v, j->nv);
	kvfs_bg_end(j->c);
	free(j->v);
	free(j->p);
	free(j);
	return NULL;
}

/*
 * Inter-period prefetch: the same chunks for the next period's layers,
 * loaded into the chunk cache by a background thread while the engine
 * computes this period, until the session's next FETCH_CHUNKS calls it
 * off (spec_cancel).
 */
static void speculate(struct ctx *x, struct kvfs_block **v,
		      const size_t *bi, const uint32_t *local)
{
	uint32_t first = x->r->layer_first + x->r->n_layers;
	uint32_t nl = x->r->n_layers, layers = x->ns->geom.n_layers;
	struct spec_job *j;
	pthread_attr_t at;
	pthread_t t;

	if (first >= layers)
		return; /* the last period: nothing follows */
	if (first + nl > layers)
		nl = layers - first; /* a remainder period */
	j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->c = x->c;
	j->n = (size_t)nl * x->r->n_chunks;
	j->p = calloc(j->n, sizeof(*j->p));
	j->v = calloc(x->nk, sizeof(*j->v));
	if (!j->p || !j->v)
		goto out_free;
	for (size_t i = 0; i < x->nk; i++) {
		kvfs_block_get_ref(v[i]);
		j->v[j->nv++] = v[i];
	}
	for (uint32_t l = 0; l < nl; l++)
		for (uint32_t k = 0; k < x->r->n_chunks; k++) {
			struct kvfs_chunk_piece *pc =
				&j->p[(size_t)l * x->r->n_chunks + k];

			pc->b = v[bi[k]];
			pc->layer = first + l;
			pc->chunk = local[k];
		}
	j->tok = spec_token_get(x->s);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	kvfs_bg_begin(x->c);
	if (pthread_create(&t, &at, spec_main, j) == 0) {
		pthread_attr_destroy(&at);
		return;
	}
	kvfs_bg_end(x->c);
	pthread_attr_destroy(&at);
	spec_token_put(j->tok);
	put_all(x->c, j->v, j->nv);
out_free:
	free(j->p);
	free(j->v);
	free(j);
}

/*
 * Open the client memory @m for a request: the session's kept peer when
 * it names the same object, else a new one, kept for next time. *@kept
 * says whether peer_put() must hand it back rather than close it.
 */
static int peer_get(struct ctx *x, const struct kvfs_ctl_mem *m,
		    struct kvfs_gpu_peer **out, bool *kept)
{
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	const struct kvfs_gpu_ops *go = x->c->gops;
	struct kvfs_ctl_session *s = x->s;
	int rc;

	*kept = false;
	if (!go->peer_same || pthread_mutex_trylock(&s->peer_lock))
		return go->peer_open(gpu, m, out);
	if (s->peer && go->peer_same(gpu, s->peer, m)) {
		*out = s->peer;
		*kept = true;
		return 0;
	}
	if (s->peer) {
		go->peer_close(gpu, s->peer);
		s->peer = NULL;
	}
	rc = go->peer_open(gpu, m, &s->peer);
	if (rc) {
		s->peer = NULL;
		pthread_mutex_unlock(&s->peer_lock);
		return rc;
	}
	*out = s->peer;
	*kept = true;
	return 0;
}

static void peer_put(struct ctx *x, struct kvfs_gpu_peer *p, bool kept)
{
	if (kept)
		pthread_mutex_unlock(&x->s->peer_lock);
	else if (p)
		x->c->gops->peer_close(x->c->tier[KVFS_TIER_GPU], p);
}

/* Per-layer completion of a FETCH_CHUNKS batch delivered in place. */
struct layer_progress {
	struct sync_word *sw;
	uint32_t *got;  /* pieces delivered, per layer of the batch */
	uint32_t nc;    /* pieces per layer */
	uint32_t l0;    /* the batch's first layer, request-relative */
	uint32_t nl;    /* layers in the batch */
	uint32_t next;  /* layers of the batch signalled so far */
};

/* kvfs_chunk_cb: piece @i (layer-major, nc a layer) is in place. Layers
 * are signalled in order, each once all of it and all before it are.
 */
static void layer_got(void *arg, size_t i)
{
	struct layer_progress *lp = arg;

	lp->got[i / lp->nc]++;
	while (lp->next < lp->nl && lp->got[lp->next] == lp->nc)
		sync_signal(lp->sw, lp->l0 + ++lp->next);
}

static int op_fetch_chunks(struct ctx *x)
{
	const struct kvfs_ctl_req *r = x->r;
	const struct kvfs_geom *g = &x->ns->geom;
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	const struct kvfs_gpu_ops *go = x->c->gops;
	struct kvfs_gpu_peer *peer = NULL;
	struct kvfs_extent region = { 0 };
	struct kvfs_chunk_piece *pc = NULL;
	struct kvfs_gpu_xfer *xf = NULL;
	struct kvfs_block **v = NULL;
	struct sync_word sw = { 0 };
	struct layer_progress lp = { 0 };
	bool peer_kept = false;
	uint32_t *sorted = NULL, *local = NULL;
	size_t *bi = NULL;
	uint8_t *stage = NULL, *direct = NULL;
	bool own_stage = true;
	uint64_t cb = 0, lo, total, region_off = 0;
	uint32_t sp, nc = r->n_chunks;
	bool pool = r->flags & KVFS_CTL_F_POOL;
	int rc = 0;

	if (need_gpu(x))
		return 0;
	if (r->layer_first >= g->n_layers ||
	    r->n_layers > g->n_layers - r->layer_first)
		return fail(x, -EINVAL, "layers %u..%u outside 0..%u",
			    r->layer_first, r->layer_first + r->n_layers,
			    g->n_layers);
	if (kvfs_fmt_chunk_range(g, g->block_tokens, 0, 0, &lo, &cb) || !cb)
		return fail(x, -EINVAL, "%s", "no chunk layout for the "
			    "namespace");
	if ((uint64_t)r->n_layers * nc * cb > (64ull << 30))
		return fail(x, -E2BIG, "%s", "request larger than 64 GiB");
	v = calloc(x->nk, sizeof(*v));
	bi = calloc(nc, sizeof(*bi));
	local = calloc(nc, sizeof(*local));
	sorted = calloc(nc, sizeof(*sorted));
	if (!v || !bi || !local || !sorted) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* Duplicate indices would deliver one chunk twice: refused. */
	memcpy(sorted, x->chunks, nc * sizeof(*sorted));
	qsort(sorted, nc, sizeof(*sorted), cmp_u32);
	for (uint32_t k = 1; k < nc; k++)
		if (sorted[k] == sorted[k - 1]) {
			fail(x, -EINVAL, "chunk %u requested twice",
			     sorted[k]);
			goto out_free;
		}
	rc = find_all(x, v);
	if (rc || x->resp->error)
		goto out_free;
	for (uint32_t k = 0; k < nc; k++)
		if (chunk_locate(x, v, x->chunks[k], &bi[k], &local[k])) {
			fail(x, -EINVAL, "chunk %u is past the prefix's last "
			     "token", x->chunks[k]);
			goto out_put;
		}
	/* This request supersedes what the session guessed it would be. */
	spec_cancel(x->s);
	total = (uint64_t)r->n_layers * nc * cb;
	sp = r->sub_period && r->sub_period < r->n_layers ? r->sub_period
							   : r->n_layers;
	if (pool) {
		rc = gpu->ops->alloc(gpu, total, &region);
		if (rc) {
			fail(x, -ENOSPC, "%s", "no room in the device pool for "
			     "the chunks");
			rc = 0;
			goto out_put;
		}
	} else {
		rc = peer_get(x, &r->peer, &peer, &peer_kept);
		if (rc) {
			fail(x, rc, "%s", "cannot open the caller's memory");
			rc = 0;
			goto out_put;
		}
		if (x->dst[0].off > go->peer_size(peer) ||
		    total > go->peer_size(peer) - x->dst[0].off) {
			fail(x, -EINVAL, "%s", "the chunks do not fit in the "
			     "caller's memory at that offset");
			goto out_peer;
		}
	}
	if (r->sync.shm_name[0] && sync_open(x, &sw))
		goto out_region;
	/*
	 * Where the destination is host memory (the shm backend's pool, or
	 * a client's shm), chunks go straight there: O_DIRECT reads land in
	 * it with no copy. Otherwise (cuda) they are staged in host memory
	 * and copied up, one copy per layer.
	 */
	direct = pool ? gpu->ops->map(gpu, &region)
		      : (go->peer_map ? go->peer_map(gpu, peer) : NULL);
	if (direct && !pool)
		direct += x->dst[0].off;
	size_t need = direct ? 0 : (size_t)sp * nc * cb;

	if (direct) {
		/* no staging */
	} else if (pthread_mutex_trylock(&x->s->stage_lock) == 0) {
		if (x->s->stage_len < need) {
			stage_unpin(x->c, x->s);
			free(x->s->stage);
			if (posix_memalign((void **)&x->s->stage,
					   KVFS_FMT_ALIGN, need))
				x->s->stage = NULL;
			x->s->stage_len = x->s->stage ? need : 0;
			stage_pin(x->c, x->s);
		}
		stage = x->s->stage;
		own_stage = !stage;
		if (!stage)
			pthread_mutex_unlock(&x->s->stage_lock);
	}
	if (!stage && !direct &&
	    posix_memalign((void **)&stage, KVFS_FMT_ALIGN, need))
		stage = NULL;
	/* Straight into host memory, the whole request is one batch,
	 * issued layer by layer, each layer signalled once it is all there.
	 * Staged, a batch is a sub-period (the stage holds one).
	 */
	if (direct)
		sp = r->n_layers;
	pc = calloc((size_t)sp * nc, sizeof(*pc));
	xf = calloc(nc, sizeof(*xf));
	lp.got = direct ? calloc(sp, sizeof(*lp.got)) : NULL;
	lp.sw = &sw;
	lp.nc = nc;
	if ((!stage && !direct) || !pc || !xf || (direct && !lp.got)) {
		rc = -ENOMEM;
		goto out_sync;
	}
	if (sw.w)
		sync_signal(&sw, 0);
	/* One I/O batch per sub-period of layers; each layer is signalled
	 * as soon as it has been delivered.
	 */
	for (uint32_t l0 = 0; l0 < r->n_layers; l0 += sp) {
		uint32_t nl = r->n_layers - l0 < sp ? r->n_layers - l0 : sp;
		struct kvfs_chunk_result res = { 0 };

		for (uint32_t l = 0; l < nl; l++)
			for (uint32_t k = 0; k < nc; k++) {
				struct kvfs_chunk_piece *q =
					&pc[(size_t)l * nc + k];

				memset(q, 0, sizeof(*q));
				q->b = v[bi[k]];
				q->layer = r->layer_first + l0 + l;
				q->chunk = local[k];
				q->dst = direct ? direct + ((uint64_t)(l0 + l) *
							    nc + k) * cb
						: stage + ((size_t)l * nc + k) *
							  cb;
			}
		lp.l0 = l0;
		lp.nl = nl;
		lp.next = 0;
		rc = kvfs_chunk_read_cb(x->c, pc, (size_t)nl * nc,
					direct && !pool ? KVFS_CHUNK_CLIENT_DST
							: 0, &res,
					direct && sw.w ? layer_got : NULL, &lp);
		x->resp->bytes_wanted += res.bytes_wanted;
		x->resp->bytes_read += res.bytes_read;
		x->resp->ssd_reads += res.ssd_reads;
		x->resp->mem_hits += res.mem_hits;
		x->resp->spec_hits += res.spec_hits;
		if (rc) {
			if (sw.w)
				sync_signal(&sw, KVFS_CTL_SYNC_FAILED | l0);
			fail(x, rc, "%s", rc == -EBADMSG ?
				"a chunk failed its checksum" :
				"reading the chunks failed");
			rc = 0;
			goto out_sync;
		}
		for (uint32_t l = lp.next; l < nl && direct; l++)
			if (sw.w)
				sync_signal(&sw, l0 + l + 1);
		for (uint32_t l = 0; l < nl && !direct; l++) {
			uint64_t base = ((uint64_t)(l0 + l) * nc) * cb;

			for (uint32_t k = 0; k < nc; k++) {
				memset(&xf[k], 0, sizeof(xf[k]));
				xf[k].host = stage + ((size_t)l * nc + k) * cb;
				xf[k].len = cb;
				if (pool) {
					xf[k].pool = &region;
					xf[k].off = base + k * cb;
				} else {
					xf[k].peer_off = x->dst[0].off + base +
							 k * cb;
				}
			}
			rc = pool ? go->upload(gpu, xf, nc) :
				    go->peer_write(gpu, peer, xf, nc);
			if (rc) {
				if (sw.w)
					sync_signal(&sw, KVFS_CTL_SYNC_FAILED |
							     (l0 + l));
				fail(x, rc, "%s", "delivering the chunks "
				     "failed");
				rc = 0;
				goto out_sync;
			}
			if (sw.w)
				sync_signal(&sw, l0 + l + 1);
		}
	}
	if (r->flags & KVFS_CTL_F_SPECULATE)
		speculate(x, v, bi, local);
	if (pool) {
		pthread_mutex_lock(&x->s->lock);
		if (x->s->nrg == x->s->caprg) {
			size_t cap = x->s->caprg ? x->s->caprg * 2 : 8;
			struct region *nr = realloc(x->s->rg,
						    cap * sizeof(*nr));

			if (nr) {
				x->s->rg = nr;
				x->s->caprg = cap;
			}
		}
		if (x->s->nrg < x->s->caprg) {
			x->s->rg[x->s->nrg++] =
				(struct region){ region, x->pid };
			region_off = region.off;
			memset(&region, 0, sizeof(region));
		}
		pthread_mutex_unlock(&x->s->lock);
		if (region.len) {
			rc = -ENOMEM;
			goto out_sync;
		}
		go->describe(gpu, &x->resp->pool);
		x->resp->n_blocks = 1;
		x->blk[0].pool_off = region_off;
		x->blk[0].len = total;
		x->blk[0].layer_bytes = (uint64_t)nc * cb;
	}
out_sync:
	sync_close(&sw);
out_region:
	if (region.len)
		gpu->ops->free(gpu, &region);
out_peer:
	peer_put(x, peer, peer_kept);
out_put:
	put_all(x->c, v, x->nk);
out_free:
	free(v);
	free(bi);
	free(local);
	free(sorted);
	if (own_stage)
		free(stage);
	else
		pthread_mutex_unlock(&x->s->stage_lock);
	free(pc);
	free(xf);
	free(lp.got);
	return rc;
}

static int op_scores(struct ctx *x)
{
	struct kvfs_block **v = calloc(x->nk, sizeof(*v));
	int rc = 0;

	if (!v)
		return -ENOMEM;
	if (find_all(x, v) || x->resp->error)
		goto out_free;
	/* Each report is one engine request: the unit of score decay. */
	kvfs_chunk_tick(x->c);
	for (uint32_t k = 0; k < x->r->n_chunks; k++) {
		uint32_t local;
		size_t bi;

		if (chunk_locate(x, v, x->chunks[k], &bi, &local) ||
		    kvfs_chunk_score(x->c, v[bi], local, x->scores[k])) {
			fail(x, -EINVAL, "chunk %u: out of range, or its score "
			     "is negative or not finite", x->chunks[k]);
			break;
		}
	}
	put_all(x->c, v, x->nk);
out_free:
	free(v);
	return rc;
}

int kvfs_ctl_exec(struct kvfs_ctl_session *s, int pid, const void *req,
		  size_t len, size_t max_resp, void **resp, size_t *rlen)
{
	const struct kvfs_ctl_req *r = req;
	struct ctx x = { .s = s, .c = s->c, .r = r };
	size_t nblk, size;
	int rc;

	rc = check_req(r, len);
	if (rc)
		return rc;
	x.keys = (const void *)((const uint8_t *)req + sizeof(*r));
	x.tokens = (const uint32_t *)((const uint8_t *)x.keys + 16 * r->n_keys);
	x.dst = (const void *)((const uint8_t *)x.tokens + 4 * r->n_tokens);
	x.chunks = (const uint32_t *)((const uint8_t *)x.dst + 8 * r->n_dst);
	x.scores = (const float *)(x.chunks + r->n_chunks);
	if ((r->flags & KVFS_CTL_F_TOKENS) && r->n_keys)
		return bad("F_TOKENS with keys", r->op);

	/* Room for one block entry per key (token chains: per block). */
	nblk = r->n_keys;
	if (r->flags & KVFS_CTL_F_TOKENS)
		nblk = r->n_tokens; /* an upper bound; trimmed below */
	if (r->op == KVFS_CTL_FETCH_CHUNKS)
		nblk = (r->flags & KVFS_CTL_F_POOL) ? 1 : 0;
	else if (r->op != KVFS_CTL_LOOKUP && r->op != KVFS_CTL_FETCH &&
		 r->op != KVFS_CTL_FETCH_INTO)
		nblk = 0;
	size = sizeof(struct kvfs_ctl_resp) + nblk * sizeof(struct kvfs_ctl_block);
	x.resp = calloc(1, size);
	if (!x.resp)
		return -ENOMEM;
	x.blk = (struct kvfs_ctl_block *)(x.resp + 1);
	x.resp->magic = KVFS_CTL_MAGIC;
	x.resp->abi = KVFS_CTL_ABI;
	x.resp->op = r->op;

	if (r->op == KVFS_CTL_FETCH || r->op == KVFS_CTL_FETCH_INTO ||
	    r->op == KVFS_CTL_RELEASE || r->op == KVFS_CTL_STATS ||
	    r->op == KVFS_CTL_FETCH_CHUNKS)
		x.pid = tgid_of(pid);
	rc = resolve(&x);
	if (rc || x.resp->error)
		goto out_done;
	/* Refuse before acting if the answer cannot travel back. */
	if (nblk && r->op != KVFS_CTL_FETCH_CHUNKS &&
	    sizeof(struct kvfs_ctl_resp) +
			    x.nk * sizeof(struct kvfs_ctl_block) > max_resp) {
		rc = -E2BIG;
		goto out_done;
	}
	switch (r->op) {
	case KVFS_CTL_LOOKUP: rc = op_lookup(&x); break;
	case KVFS_CTL_FETCH: rc = op_fetch(&x); break;
	case KVFS_CTL_FETCH_INTO: rc = op_fetch_into(&x); break;
	case KVFS_CTL_SAVE: rc = op_save(&x); break;
	case KVFS_CTL_RELEASE: rc = op_release(&x); break;
	case KVFS_CTL_PIN: rc = op_pin(&x, true); break;
	case KVFS_CTL_UNPIN: rc = op_pin(&x, false); break;
	case KVFS_CTL_PREFETCH: rc = op_prefetch(&x); break;
	case KVFS_CTL_EVICT: rc = op_evict(&x); break;
	case KVFS_CTL_STATS: rc = op_stats(&x); break;
	case KVFS_CTL_FETCH_CHUNKS: rc = op_fetch_chunks(&x); break;
	case KVFS_CTL_SCORES: rc = op_scores(&x); break;
	}
out_done:
	free(x.chain);
	if (rc) {
		free(x.resp);
		return rc;
	}
	size = sizeof(struct kvfs_ctl_resp) +
	       (size_t)x.resp->n_blocks * sizeof(struct kvfs_ctl_block);
	x.resp->size = (uint32_t)size;
	*resp = x.resp;
	*rlen = size;
	return 0;
}
