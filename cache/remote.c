/* SPDX-License-Identifier: MIT */
/*
 * The engine's use of the remote tier (docs/remote.md): opening it,
 * looking up blocks that are not local and importing the verified images
 * as local blocks, and sending written blocks on (the write-back listener
 * and fsync with write = through).  The tier itself, its checks, its
 * queue and its client live in tier/.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

/*
 * Blocks per lookup round.  A round is one pipeline per node (the client
 * keeps up to 64 commands in flight on each); a longer request is cut
 * into rounds so that a prefix stops at its first miss, and so that the
 * next round's replies arrive while this one is imported (a helper
 * thread looks them up).
 */
#define REMOTE_BATCH 32

/* How long unmount waits for the remote queue, at least. */
#define REMOTE_DRAIN_MIN_MS 2000

static const char *write_name(int w)
{
	return w == KVFS_REMOTE_WRITE_THROUGH ? "through" :
	       w == KVFS_REMOTE_WRITE_OFF     ? "off" :
						"back";
}

static void remote_ns_of(struct kvfs_ns *ns, struct kvfs_remote_ns *rn)
{
	rn->root = ns->rec.root;
	rn->g = &ns->geom;
	/* Only KV images travel: a block stored as hidden states needs
	 * the namespace's weights to be read, which another host may lack.
	 */
	rn->vflags = 0;
}

/* Whether @b goes to the remote tier once written locally. */
static bool remote_wants(struct kvfs_cache *c, struct kvfs_block *b)
{
	const struct kvfs_remote_conf *rc = kvfs_tier_remote_conf(c->remote);
	bool admit;

	if (rc->write == KVFS_REMOTE_WRITE_OFF || b->kind != KVFS_KIND_KV ||
	    (atomic_load(&b->flags) & (KVFS_B_REMOTE | KVFS_B_DELETED)))
		return false;
	if (rc->admit == KVFS_REMOTE_ADMIT_ALL)
		return true;
	/* What the policy would keep: its admission of the block to the
	 * SSD, the tier that outlives DRAM.
	 */
	pthread_mutex_lock(&c->policy_lock);
	admit = kvfs_policy_admit(c->policy, KVFS_TIER_DRAM, KVFS_TIER_SSD,
				  &b->pn);
	pthread_mutex_unlock(&c->policy_lock);
	return admit;
}

/* The write-back listener: queue the image just written to the SSD. The
 * queue copies it and never waits on the network.
 */
static void remote_written(struct kvfs_cache *c, struct kvfs_block *b,
			   const void *img)
{
	if (remote_wants(c, b))
		kvfs_tier_remote_queue(c->remote, b->ns->rec.root, b->pn.key,
				       img, b->ssize);
}

int kvfs_remote_init(struct kvfs_cache *c)
{
	const struct kvfs_remote_conf *rc = &c->conf.remote;
	int ret;

	if (rc->backend == KVFS_REMOTE_NONE)
		return 0;
	ret = kvfs_tier_remote_new(rc, &c->remote);
	if (ret) {
		kvfs_err("remote tier (%s): cannot start: %s", rc->nodes,
			 strerror(-ret));
		return ret;
	}
	kvfs_info("remote tier: %s, prefix %s, write %s, admit %s, timeout "
		  "%u ms",
		  rc->backend == KVFS_REMOTE_MEMORY ? "memory" : rc->nodes,
		  rc->key_prefix, write_name(rc->write),
		  rc->admit == KVFS_REMOTE_ADMIT_ALL ? "all" : "policy",
		  rc->timeout_ms);
	kvfs_wb_on_written(c, remote_written);
	return 0;
}

void kvfs_remote_fini(struct kvfs_cache *c)
{
	struct kvfs_remote_stats st;
	unsigned ms;

	if (!c->remote)
		return;
	ms = 20 * c->conf.remote.timeout_ms;
	if (ms < REMOTE_DRAIN_MIN_MS)
		ms = REMOTE_DRAIN_MIN_MS;
	if (kvfs_tier_remote_drain(c->remote, ms)) {
		kvfs_tier_remote_stats(c->remote, &st);
		kvfs_warn("remote tier: %" PRIu64 " blocks not sent after "
			  "%u ms: dropped",
			  st.queued, ms);
	}
	kvfs_tier_remote_free(c->remote);
	c->remote = NULL;
}

/* One round of a fetch: its lookups, then its imports. */
struct fetch_round {
	struct kvfs_remote_get *g;
	size_t n;
};

/* The helper that looks up round k+1 while round k is imported. */
struct fetch_ahead {
	struct kvfs_cache *c;
	const struct kvfs_remote_ns *rn;
	struct fetch_round r;
	pthread_t t;
	bool started;
};

static void *fetch_ahead_main(void *arg)
{
	struct fetch_ahead *a = arg;

	kvfs_tier_remote_getv(a->c->remote, a->rn, a->r.g, a->r.n);
	return NULL;
}

/* Import the hits of @r in order; whether every block of it is local now.
 * Frees every image.
 */
static bool fetch_import(struct kvfs_cache *c, struct kvfs_ns *ns,
			 struct fetch_round *r, size_t *got)
{
	bool all = true;

	for (size_t i = 0; i < r->n; i++) {
		struct kvfs_remote_get *g = &r->g[i];
		struct kvfs_block *b;

		if (!g->res && !kvfs_block_import(c, ns, g->key, g->img, g->len,
						  &g->hdr, &b)) {
			(*got)++;
			kvfs_cache_put(c, b);
		} else {
			all = false;
		}
		free(g->img);
		g->img = NULL;
	}
	return all;
}

size_t kvfs_remote_fetch(struct kvfs_cache *c, struct kvfs_ns *ns,
			 const uint8_t (*keys)[KVFS_KEY_LEN], size_t n,
			 bool prefix)
{
	struct kvfs_remote_ns rn;
	struct kvfs_remote_get *g;
	struct fetch_ahead ahead = { .c = c, .rn = &rn };
	size_t m = 0, got = 0;

	if (!c->remote || !n)
		return 0;
	g = calloc(n, sizeof(*g));
	if (!g)
		return 0;
	for (size_t i = 0; i < n; i++) {
		struct kvfs_block *b = kvfs_index_find_key(c, keys[i]);

		if (b) {
			kvfs_cache_put(c, b);
			continue;
		}
		g[m++].key = keys[i];
	}
	remote_ns_of(ns, &rn);
	/* Round 0 here; then each round's successor is looked up by the
	 * helper while this thread imports it.
	 */
	struct fetch_round cur = { g, m < REMOTE_BATCH ? m : REMOTE_BATCH };

	kvfs_tier_remote_getv(c->remote, &rn, cur.g, cur.n);
	for (size_t lo = 0; lo < m;) {
		size_t next = lo + cur.n;
		bool all;

		ahead.started = false;
		if (next < m) {
			ahead.r.g = g + next;
			ahead.r.n = m - next < REMOTE_BATCH ? m - next :
							      REMOTE_BATCH;
			ahead.started = !pthread_create(
				&ahead.t, NULL, fetch_ahead_main, &ahead);
		}
		all = fetch_import(c, ns, &cur, &got);
		if (next < m) {
			if (ahead.started)
				pthread_join(ahead.t, NULL);
			else
				kvfs_tier_remote_getv(c->remote, &rn, ahead.r.g,
						      ahead.r.n);
		}
		if (!all && prefix) {
			/* The prefix ends here: what was looked up ahead
			 * is dropped unimported.
			 */
			for (size_t i = next; i < m && i < next + ahead.r.n;
			     i++)
				free(g[i].img);
			break;
		}
		lo = next;
		cur = ahead.r;
	}
	free(g);
	return got;
}

struct fetch_job {
	struct kvfs_cache *c;
	struct kvfs_ns *ns;
	size_t n;
	uint8_t (*keys)[KVFS_KEY_LEN];
};

static void *fetch_job_main(void *arg)
{
	struct fetch_job *j = arg;

	kvfs_remote_fetch(j->c, j->ns, (const uint8_t(*)[KVFS_KEY_LEN])j->keys,
			  j->n, false);
	kvfs_bg_end(j->c);
	free(j->keys);
	free(j);
	return NULL;
}

int kvfs_remote_fetch_async(struct kvfs_cache *c, struct kvfs_ns *ns,
			    const uint8_t (*keys)[KVFS_KEY_LEN], size_t n)
{
	struct fetch_job *j;
	pthread_attr_t at;
	pthread_t t;
	int ret;

	if (!c->remote || !n)
		return 0;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->keys = malloc(n * KVFS_KEY_LEN);
	if (!j->keys) {
		free(j);
		return -ENOMEM;
	}
	memcpy(j->keys, keys, n * KVFS_KEY_LEN);
	j->c = c;
	j->ns = ns;
	j->n = n;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	kvfs_bg_begin(c);
	ret = -pthread_create(&t, &at, fetch_job_main, j);
	pthread_attr_destroy(&at);
	if (ret) {
		kvfs_bg_end(c);
		free(j->keys);
		free(j);
		return -EAGAIN;
	}
	return 0;
}

int kvfs_cache_lookup_remote(struct kvfs_cache *c, struct kvfs_ns *ns,
			     const char *name, struct kvfs_block **out)
{
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_block *b;

	if (!c->remote || kvfs_fmt_name_parse(name, key))
		return -ENOENT;
	kvfs_remote_fetch(c, ns, (const uint8_t(*)[KVFS_KEY_LEN])key, 1, false);
	b = kvfs_index_find_key(c, key);
	if (b && (b->ns != ns || (atomic_load(&b->flags) & KVFS_B_DELETED))) {
		kvfs_cache_put(c, b);
		b = NULL;
	}
	if (!b)
		return -ENOENT;
	*out = b;
	return 0;
}

/* SET @b in the remote tier now, from its DRAM copy or through the read
 * path.  0 or the fault.
 */
static int remote_put_block(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_reader r;
	const void *p;
	size_t got;
	int ret;

	/* The lock-free reader's protocol keeps the DRAM copy. */
	atomic_fetch_add(&b->readers, 1);
	p = atomic_load(&b->dram_ptr);
	if (p) {
		ret = kvfs_tier_remote_put(c->remote, b->ns->rec.root,
					   b->pn.key, p, b->ssize);
		atomic_fetch_sub(&b->readers, 1);
		return ret;
	}
	atomic_fetch_sub(&b->readers, 1);
	kvfs_block_get_ref(b);
	ret = kvfs_cache_reader_init(c, &r, b);
	if (ret)
		return ret;
	ret = kvfs_cache_read_begin(c, &r, 0, b->size, &p, &got);
	if (!ret) {
		ret = got == b->size ?
			      kvfs_tier_remote_put(c->remote, b->ns->rec.root,
						   b->pn.key, p, got) :
			      -EIO;
		kvfs_cache_read_end(c, &r);
	}
	kvfs_cache_reader_release(c, &r);
	return ret;
}

int kvfs_cache_fsync(struct kvfs_cache *c, struct kvfs_block *b)
{
	char hex[KVFS_KEY_HEX_LEN + 1];
	int ret = 0, rc;

	if (c->remote &&
	    kvfs_tier_remote_conf(c->remote)->write ==
		    KVFS_REMOTE_WRITE_THROUGH &&
	    remote_wants(c, b)) {
		ret = remote_put_block(c, b);
		if (ret) {
			kvfs_fmt_key_hex(b->pn.key, hex);
			kvfs_err("ns %s: block %s.kv: the remote SET failed "
				 "(%s): fsync fails with EIO",
				 b->ns->rec.name, hex, strerror(-ret));
			ret = -EIO;
		} else {
			atomic_fetch_or(&b->flags, KVFS_B_REMOTE);
		}
	}
	rc = kvfs_cache_sync(c, b);
	return rc ? rc : ret;
}
