/* SPDX-License-Identifier: MIT */
/*
 * The remote tier (tier/tier_remote.h): keys, checked reads, SET NX
 * writes and the bounded write-back queue, over the cluster client or the
 * in-process store.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meta/hist.h"
#include "meta/log.h"
#include "meta/util.h"
#include "tier/redis_cluster.h"
#include "tier/remote_i.h"
#include "tier/tier_remote.h"

/* Blocks one write-back round sends as one pipeline. */
#define WB_BATCH 64

struct wb_ent {
	struct wb_ent *next;
	char key[KVFS_REMOTE_KEY_MAX];
	size_t klen;
	void *img;
	uint64_t len;
};

struct kvfs_tier_remote {
	struct kvfs_tier base; /* first: kvfs_tier_free() */
	struct kvfs_remote_conf c;
	/* Backend redis: two clients of the same cluster.  @rc serves the
	 * callers (lookups, puts, deletes) and never retries, so that a
	 * caller waits at most one round trip per node; @rc_bg sends the
	 * write-back queue, retrying with backoff.  Each has its own
	 * connections, so a caller never queues behind a pipeline of SETs.
	 */
	struct kvfs_rc *rc;
	struct kvfs_rc *rc_bg;
	struct kvfs_remote_mem *mem; /* backend memory */
	atomic_uint_least64_t rejected, errors, dropped;
	/* Round trips of the callers' client and of the write-back's
	 * (lock-free; meta/hist.h).
	 */
	struct kvfs_hist rtt, rtt_bg;
	struct kvfs_log_rl rl;
	/* the write-back queue */
	pthread_mutex_t lock;
	pthread_cond_t cond; /* work queued, or stop */
	pthread_cond_t idle; /* queue empty and nothing in flight */
	struct wb_ent *head, *tail; /* guarded by lock: oldest first */
	uint64_t nq, qbytes; /* guarded by lock */
	unsigned inflight; /* guarded by lock: blocks being sent */
	int stop; /* guarded by lock */
	pthread_t thr;
	int thr_started;
};

void kvfs_remote_conf_defaults(struct kvfs_remote_conf *c)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->key_prefix, "kvfs");
	c->timeout_ms = 200;
	c->queue_blocks = 1024;
	c->queue_bytes = 256ull << 20;
}

int kvfs_remote_key(const char *prefix, const uint8_t root[KVFS_KEY_LEN],
		    const uint8_t key[KVFS_KEY_LEN], char *out, size_t len)
{
	char rh[KVFS_KEY_HEX_LEN + 1], kh[KVFS_KEY_HEX_LEN + 1];
	int n;

	kvfs_fmt_key_hex(root, rh);
	kvfs_fmt_key_hex(key, kh);
	n = snprintf(out, len, "%s:%s:%s", prefix, rh, kh);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}

/* One pipeline of commands, timed as one round trip (the caller's wait,
 * whatever nodes it spans).
 */
static int remote_exec(struct kvfs_tier_remote *r, struct kvfs_rc_cmd *cmd,
		       size_t n)
{
	uint64_t t0 = kvfs_util_now_mono();
	int rc = r->mem ? kvfs_remote_mem_exec(r->mem, cmd, n) :
			  kvfs_rc_exec(r->rc, cmd, n);

	kvfs_hist_add(&r->rtt, kvfs_util_now_mono() - t0);
	return rc;
}

/* The write-back thread's: with retries, which its round trip includes. */
static int remote_exec_bg(struct kvfs_tier_remote *r, struct kvfs_rc_cmd *cmd,
			  size_t n)
{
	uint64_t t0 = kvfs_util_now_mono();
	int rc = r->mem ? kvfs_remote_mem_exec(r->mem, cmd, n) :
			  kvfs_rc_exec(r->rc_bg, cmd, n);

	kvfs_hist_add(&r->rtt_bg, kvfs_util_now_mono() - t0);
	return rc;
}

/* A fault of a command (not a miss, not an existing key). */
static int is_fault(int res)
{
	return res && res != -ENOENT && res != -EEXIST;
}

static void count_faults(struct kvfs_tier_remote *r,
			 const struct kvfs_rc_cmd *cmd, size_t n)
{
	uint64_t f = 0;

	for (size_t i = 0; i < n; i++)
		f += is_fault(cmd[i].res);
	if (f)
		atomic_fetch_add_explicit(&r->errors, f, memory_order_relaxed);
}

/* ---- reads ---- */

/* Check the value of @g against @ns: KVFS_FMT_OK or why not. */
static enum kvfs_fmt_err check_value(const struct kvfs_remote_ns *ns,
				     struct kvfs_remote_get *g)
{
	return kvfs_fmt_validate(g->img, g->len, ns->g, g->key, ns->root,
				 ns->vflags, &g->hdr);
}

int kvfs_tier_remote_getv(struct kvfs_tier_remote *r,
			  const struct kvfs_remote_ns *ns,
			  struct kvfs_remote_get *g, size_t n)
{
	struct kvfs_rc_cmd *cmd;
	char(*keys)[KVFS_REMOTE_KEY_MAX];
	size_t nbad = 0;
	uint64_t hits = 0, misses = 0, bytes = 0;
	int ret = 0;

	if (!n)
		return 0;
	cmd = calloc(n, sizeof(*cmd));
	keys = malloc(n * sizeof(*keys));
	if (!cmd || !keys) {
		free(cmd);
		free(keys);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		int kl = kvfs_remote_key(r->c.key_prefix, ns->root, g[i].key,
					 keys[i], sizeof(keys[i]));

		g[i].img = NULL;
		g[i].len = 0;
		cmd[i].op = KVFS_RC_GET;
		cmd[i].key = keys[i];
		cmd[i].klen = kl > 0 ? (size_t)kl : 0;
	}
	remote_exec(r, cmd, n);
	count_faults(r, cmd, n);
	for (size_t i = 0; i < n; i++) {
		enum kvfs_fmt_err e;
		unsigned long long missed;

		g[i].res = cmd[i].res;
		if (cmd[i].res) {
			misses++;
			if (is_fault(cmd[i].res) && !ret)
				ret = cmd[i].res;
			continue;
		}
		g[i].img = cmd[i].data;
		g[i].len = cmd[i].len;
		e = check_value(ns, &g[i]);
		if (e == KVFS_FMT_OK) {
			hits++;
			bytes += g[i].len;
			continue;
		}
		/* Never served: a miss, and gone from the cluster. */
		if (kvfs_log_rl_ok(&r->rl, 1000, &missed))
			kvfs_warn("remote: %s: rejected (%s); deleted "
				  "(%llu more not logged)",
				  keys[i], kvfs_fmt_strerror(e), missed);
		free(g[i].img);
		g[i].img = NULL;
		g[i].len = 0;
		g[i].res = -ENOENT;
		misses++;
		cmd[nbad].op = KVFS_RC_DEL;
		cmd[nbad].key = keys[i];
		cmd[nbad].klen = cmd[i].klen;
		nbad++;
	}
	if (nbad) {
		atomic_fetch_add_explicit(&r->rejected, nbad,
					  memory_order_relaxed);
		remote_exec(r, cmd, nbad);
		count_faults(r, cmd, nbad);
	}
	kvfs_tier_count(&r->base.st.hits, &r->base.st.bytes_read, hits, bytes);
	atomic_fetch_add_explicit(&r->base.st.misses, misses,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&r->base.st.reads, n, memory_order_relaxed);
	free(keys);
	free(cmd);
	return ret;
}

int kvfs_tier_remote_get(struct kvfs_tier_remote *r,
			 const struct kvfs_remote_ns *ns,
			 const uint8_t key[KVFS_KEY_LEN], void **img,
			 uint64_t *len)
{
	struct kvfs_remote_get g = { .key = key };
	int ret = kvfs_tier_remote_getv(r, ns, &g, 1);

	*img = g.img;
	*len = g.len;
	return ret ? ret : g.res;
}

int kvfs_tier_remote_exists(struct kvfs_tier_remote *r,
			    const uint8_t root[KVFS_KEY_LEN],
			    const uint8_t key[KVFS_KEY_LEN])
{
	char k[KVFS_REMOTE_KEY_MAX];
	struct kvfs_rc_cmd c = { .op = KVFS_RC_EXISTS, .key = k };
	int kl = kvfs_remote_key(r->c.key_prefix, root, key, k, sizeof(k));

	if (kl < 0)
		return kl;
	c.klen = (size_t)kl;
	remote_exec(r, &c, 1);
	count_faults(r, &c, 1);
	return c.res;
}

/* ---- writes ---- */

int kvfs_tier_remote_put(struct kvfs_tier_remote *r,
			 const uint8_t root[KVFS_KEY_LEN],
			 const uint8_t key[KVFS_KEY_LEN], const void *img,
			 uint64_t len)
{
	char k[KVFS_REMOTE_KEY_MAX];
	struct kvfs_rc_cmd c = {
		.op = KVFS_RC_SETNX, .key = k, .val = img, .vlen = len
	};
	int kl;

	if (r->c.write == KVFS_REMOTE_WRITE_OFF)
		return -EROFS;
	kl = kvfs_remote_key(r->c.key_prefix, root, key, k, sizeof(k));
	if (kl < 0)
		return kl;
	c.klen = (size_t)kl;
	remote_exec(r, &c, 1);
	count_faults(r, &c, 1);
	atomic_fetch_add_explicit(&r->base.st.writes, 1, memory_order_relaxed);
	if (!c.res)
		atomic_fetch_add_explicit(&r->base.st.bytes_written, len,
					  memory_order_relaxed);
	return c.res == -EEXIST ? 0 : c.res;
}

int kvfs_tier_remote_poke(struct kvfs_tier_remote *r,
			  const uint8_t root[KVFS_KEY_LEN],
			  const uint8_t key[KVFS_KEY_LEN], const void *val,
			  size_t len)
{
	char k[KVFS_REMOTE_KEY_MAX];
	struct kvfs_rc_cmd c = {
		.op = KVFS_RC_SET, .key = k, .val = val, .vlen = len
	};
	int kl = kvfs_remote_key(r->c.key_prefix, root, key, k, sizeof(k));

	if (kl < 0)
		return kl;
	c.klen = (size_t)kl;
	remote_exec(r, &c, 1);
	return c.res;
}

static void wb_free(struct wb_ent *e)
{
	free(e->img);
	free(e);
}

/* Unlink the oldest entry. Caller holds r->lock; the queue is not empty. */
static struct wb_ent *wb_pop(struct kvfs_tier_remote *r)
{
	struct wb_ent *e = r->head;

	r->head = e->next;
	if (!r->head)
		r->tail = NULL;
	r->nq--;
	r->qbytes -= e->len;
	return e;
}

/* Drop the oldest entries until @len more bytes and one more block fit.
 * Caller holds r->lock.
 */
static void wb_make_room(struct kvfs_tier_remote *r, uint64_t len)
{
	while (r->head && (r->nq + 1 > r->c.queue_blocks ||
			   r->qbytes + len > r->c.queue_bytes)) {
		wb_free(wb_pop(r));
		atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
	}
}

int kvfs_tier_remote_queue(struct kvfs_tier_remote *r,
			   const uint8_t root[KVFS_KEY_LEN],
			   const uint8_t key[KVFS_KEY_LEN], const void *img,
			   uint64_t len)
{
	struct wb_ent *e;
	int kl;

	if (r->c.write == KVFS_REMOTE_WRITE_OFF)
		return -EROFS;
	if (len > r->c.queue_bytes || !r->c.queue_blocks)
		return -E2BIG;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	kl = kvfs_remote_key(r->c.key_prefix, root, key, e->key,
			     sizeof(e->key));
	e->img = malloc(len ? len : 1);
	if (kl < 0 || !e->img) {
		wb_free(e);
		return kl < 0 ? kl : -ENOMEM;
	}
	e->klen = (size_t)kl;
	memcpy(e->img, img, len);
	e->len = len;
	pthread_mutex_lock(&r->lock);
	wb_make_room(r, len);
	if (r->tail)
		r->tail->next = e;
	else
		r->head = e;
	r->tail = e;
	r->nq++;
	r->qbytes += len;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	return 0;
}

/* Put back the entries of a failed round, oldest first, ahead of what
 * came since, as long as they fit; the rest is dropped. Caller holds
 * r->lock.
 */
static void wb_requeue(struct kvfs_tier_remote *r, struct wb_ent **e, size_t n)
{
	for (size_t i = n; i-- > 0;) {
		if (r->nq + 1 > r->c.queue_blocks ||
		    r->qbytes + e[i]->len > r->c.queue_bytes) {
			wb_free(e[i]);
			atomic_fetch_add_explicit(&r->dropped, 1,
						  memory_order_relaxed);
			continue;
		}
		e[i]->next = r->head;
		r->head = e[i];
		if (!r->tail)
			r->tail = e[i];
		r->nq++;
		r->qbytes += e[i]->len;
	}
}

static void wb_sleep(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* Send one round: returns whether it met a fault (the caller backs off). */
static int wb_round(struct kvfs_tier_remote *r, struct wb_ent **e, size_t n)
{
	struct kvfs_rc_cmd cmd[WB_BATCH];
	struct wb_ent *again[WB_BATCH];
	size_t nagain = 0;
	uint64_t bytes = 0;

	memset(cmd, 0, sizeof(cmd));
	for (size_t i = 0; i < n; i++) {
		cmd[i].op = KVFS_RC_SETNX;
		cmd[i].key = e[i]->key;
		cmd[i].klen = e[i]->klen;
		cmd[i].val = e[i]->img;
		cmd[i].vlen = e[i]->len;
	}
	remote_exec_bg(r, cmd, n);
	count_faults(r, cmd, n);
	atomic_fetch_add_explicit(&r->base.st.writes, n, memory_order_relaxed);
	for (size_t i = 0; i < n; i++) {
		if (!cmd[i].res)
			bytes += e[i]->len;
		/* A full cluster or a refused AUTH will not get better by
		 * retrying this block: dropped.
		 */
		if (is_fault(cmd[i].res) && cmd[i].res != -ENOSPC &&
		    cmd[i].res != -EACCES && cmd[i].res != -EIO) {
			again[nagain++] = e[i];
			continue;
		}
		if (is_fault(cmd[i].res))
			atomic_fetch_add_explicit(&r->dropped, 1,
						  memory_order_relaxed);
		wb_free(e[i]);
	}
	atomic_fetch_add_explicit(&r->base.st.bytes_written, bytes,
				  memory_order_relaxed);
	pthread_mutex_lock(&r->lock);
	wb_requeue(r, again, nagain);
	r->inflight = 0;
	if (!r->nq)
		pthread_cond_broadcast(&r->idle);
	pthread_mutex_unlock(&r->lock);
	return nagain > 0;
}

static void *wb_thread(void *arg)
{
	struct kvfs_tier_remote *r = arg;
	struct wb_ent *e[WB_BATCH];
	unsigned faults = 0;

	pthread_mutex_lock(&r->lock);
	for (;;) {
		size_t n = 0;

		while (!r->stop && !r->head)
			pthread_cond_wait(&r->cond, &r->lock);
		if (r->stop)
			break;
		while (n < WB_BATCH && r->head)
			e[n++] = wb_pop(r);
		r->inflight = (unsigned)n;
		pthread_mutex_unlock(&r->lock);
		if (wb_round(r, e, n))
			wb_sleep((unsigned)kvfs_rc_backoff_ms(
				faults++, 10, 4 * (r->c.timeout_ms ?: 200)));
		else
			faults = 0;
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

int kvfs_tier_remote_drain(struct kvfs_tier_remote *r, unsigned timeout_ms)
{
	struct timespec ts;
	int ret = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&r->lock);
	while ((r->nq || r->inflight) && !ret)
		ret = pthread_cond_timedwait(&r->idle, &r->lock, &ts) ?
			      -ETIMEDOUT :
			      0;
	pthread_mutex_unlock(&r->lock);
	return ret;
}

void kvfs_tier_remote_stats(struct kvfs_tier_remote *r,
			    struct kvfs_remote_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->hits = atomic_load(&r->base.st.hits);
	out->misses = atomic_load(&r->base.st.misses);
	out->bytes_read = atomic_load(&r->base.st.bytes_read);
	out->bytes_written = atomic_load(&r->base.st.bytes_written);
	out->rejected = atomic_load(&r->rejected);
	out->errors = atomic_load(&r->errors);
	out->dropped = atomic_load(&r->dropped);
	pthread_mutex_lock(&r->lock);
	out->queued = r->nq + r->inflight;
	pthread_mutex_unlock(&r->lock);
	out->nodes = r->rc ? kvfs_rc_nodes(r->rc) : 1;
	kvfs_hist_read(&r->rtt, &out->rtt);
	kvfs_hist_read(&r->rtt_bg, &out->rtt_bg);
}

/* ---- the tier base ---- */

static int remote_alloc(struct kvfs_tier *t, uint64_t len,
			struct kvfs_extent *e)
{
	return -EOPNOTSUPP;
}

static void remote_free_ext(struct kvfs_tier *t, const struct kvfs_extent *e)
{
}

static int remote_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return -EOPNOTSUPP;
}

static int remote_write(struct kvfs_tier *t, const struct kvfs_extent *e,
			uint64_t off, const void *buf, uint64_t len)
{
	return -EOPNOTSUPP;
}

static int remote_read(struct kvfs_tier *t, const struct kvfs_extent *e,
		       uint64_t off, void *buf, uint64_t len)
{
	return -EOPNOTSUPP;
}

static int remote_readv(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		io[i].res = -EOPNOTSUPP;
		kvfs_tier_io_done(&io[i]);
	}
	return n ? -EOPNOTSUPP : 0;
}

static int remote_sync(struct kvfs_tier *t)
{
	struct kvfs_tier_remote *r = (struct kvfs_tier_remote *)t;

	/* The queue's bound in round trips, each at most a timeout. */
	return kvfs_tier_remote_drain(r, r->c.timeout_ms * 16 + 1000);
}

static void *remote_map(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return NULL;
}

static void remote_release(struct kvfs_tier *t)
{
	kvfs_tier_remote_free((struct kvfs_tier_remote *)t);
}

static const struct kvfs_tier_ops remote_ops = {
	.name = "remote",
	.alloc = remote_alloc,
	.free = remote_free_ext,
	.claim = remote_claim,
	.write = remote_write,
	.read = remote_read,
	.readv = remote_readv,
	.sync = remote_sync,
	.map = remote_map,
	.release = remote_release,
};

struct kvfs_tier *kvfs_tier_remote_base(struct kvfs_tier_remote *r)
{
	return &r->base;
}

const struct kvfs_remote_conf *
kvfs_tier_remote_conf(const struct kvfs_tier_remote *r)
{
	return &r->c;
}

struct kvfs_remote_mem *kvfs_tier_remote_mem(struct kvfs_tier_remote *r)
{
	return r->mem;
}

int kvfs_tier_remote_new(const struct kvfs_remote_conf *c,
			 struct kvfs_tier_remote **out)
{
	struct kvfs_tier_remote *r;
	int ret;

	*out = NULL;
	if (c->backend != KVFS_REMOTE_REDIS && c->backend != KVFS_REMOTE_MEMORY)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->base.ops = &remote_ops;
	r->base.id = KVFS_TIER_REMOTE;
	r->base.align = 1;
	r->c = *c;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	pthread_cond_init(&r->idle, NULL);
	if (c->backend == KVFS_REMOTE_MEMORY) {
		ret = kvfs_remote_mem_new(&r->mem);
	} else {
		struct kvfs_rc_conf rcc;

		kvfs_rc_conf_defaults(&rcc);
		rcc.nodes = c->nodes;
		rcc.password = c->password;
		if (c->timeout_ms)
			rcc.timeout_ms = c->timeout_ms;
		ret = kvfs_rc_new(&rcc, &r->rc_bg);
		rcc.retries = 0;
		if (!ret)
			ret = kvfs_rc_new(&rcc, &r->rc);
	}
	if (ret)
		goto out_free;
	ret = -pthread_create(&r->thr, NULL, wb_thread, r);
	if (ret)
		goto out_free;
	r->thr_started = 1;
	*out = r;
	return 0;
out_free:
	kvfs_tier_remote_free(r);
	return ret;
}

void kvfs_tier_remote_free(struct kvfs_tier_remote *r)
{
	if (!r)
		return;
	if (r->thr_started) {
		pthread_mutex_lock(&r->lock);
		r->stop = 1;
		pthread_cond_signal(&r->cond);
		pthread_mutex_unlock(&r->lock);
		pthread_join(r->thr, NULL);
	}
	while (r->head) {
		wb_free(wb_pop(r));
		atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
	}
	kvfs_rc_free(r->rc);
	kvfs_rc_free(r->rc_bg);
	kvfs_remote_mem_free(r->mem);
	pthread_cond_destroy(&r->idle);
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r);
}
