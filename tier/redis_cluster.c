/* SPDX-License-Identifier: MIT */
/*
 * Redis Cluster routing over hiredis (tier/redis_cluster.h).
 *
 * A batch is run in rounds: each pending command is routed (an ASK
 * target, else the slot's owner), every node gets its commands as one
 * pipeline (ASKING before a redirected one), and the replies sort the
 * commands into done and retry. A round that saw MOVED reloads the map;
 * one that saw a fault waits a backoff. Nodes are served one after the
 * other: the wait for a batch is the sum of its nodes' round trips, which
 * for a prefix fetch is what one node's pipeline costs anyway.
 *
 * A node that failed (connect refused, a timeout) is marked down for a
 * backoff that doubles per failure up to down_ms: during it its commands
 * fail at once instead of waiting out another timeout, which is what
 * keeps a FUSE request from waiting longer than one timeout per round.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "meta/log.h"
#include "meta/util.h"
#include "tier/redis_cluster.h"

#define NO_NODE UINT16_MAX

struct rc_node {
	char host[KVFS_RC_HOST_MAX];
	int port;
	pthread_mutex_t lock;
	redisContext *ctx; /* guarded by lock; NULL when closed */
	uint64_t down_until; /* guarded by lock: monotonic ns */
	unsigned fails; /* guarded by lock: consecutive faults */
};

struct kvfs_rc {
	struct kvfs_rc_conf c;
	char *seeds; /* the conf strings, owned */
	char *password;
	pthread_rwlock_t topo;
	/* guarded by topo: slot -> node index, NO_NODE when unowned */
	uint16_t slot[KVFS_RC_SLOTS];
	struct rc_node *node[KVFS_RC_MAX_NODES]; /* guarded by topo (append) */
	unsigned nnodes; /* guarded by topo */
	unsigned nseeds; /* the first nodes */
	int plain; /* guarded by topo */
	int loaded; /* guarded by topo */
	struct kvfs_rc_stats st;
	struct kvfs_log_rl rl;
};

/* ---- pure helpers ---- */

uint16_t kvfs_rc_crc16(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 :
							crc << 1);
	}
	return crc;
}

unsigned kvfs_rc_slot(const void *key, size_t len)
{
	const char *k = key;
	const char *open = memchr(k, '{', len);

	if (open) {
		size_t from = (size_t)(open - k) + 1;
		const char *close = memchr(open + 1, '}', len - from);

		if (close && close > open + 1)
			return kvfs_rc_crc16(open + 1,
					     (size_t)(close - open - 1)) &
			       (KVFS_RC_SLOTS - 1);
	}
	return kvfs_rc_crc16(k, len) & (KVFS_RC_SLOTS - 1);
}

int kvfs_rc_parse_addr(const char *s, size_t len, char *host, size_t hostlen,
		       int *port)
{
	const char *colon = NULL;
	char num[8];
	uint32_t p;

	for (size_t i = 0; i < len; i++)
		if (s[i] == ':')
			colon = s + i;
	if (!colon || (size_t)(colon - s) >= hostlen)
		return -EINVAL;
	len -= (size_t)(colon - s) + 1;
	if (!len || len >= sizeof(num))
		return -EINVAL;
	memcpy(num, colon + 1, len);
	num[len] = 0;
	if (kvfs_util_parse_u32(num, &p) || !p || p > 65535)
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = 0;
	*port = (int)p;
	return 0;
}

int kvfs_rc_parse_list(const char *list, kvfs_rc_addr_fn fn, void *arg,
		       const char **bad, size_t *badlen)
{
	char host[KVFS_RC_HOST_MAX];
	const char *p = list;
	int port, rc;

	do {
		size_t len = strcspn(p, ",");
		size_t lead = strspn(p, " \t");
		size_t n = len > lead ? len - lead : 0;

		while (n && (p[lead + n - 1] == ' ' || p[lead + n - 1] == '\t'))
			n--;
		if (kvfs_rc_parse_addr(p + lead, n, host, sizeof(host),
				       &port)) {
			if (bad)
				*bad = p;
			if (badlen)
				*badlen = len;
			return -EINVAL;
		}
		rc = fn(arg, host, port);
		if (rc)
			return rc;
		p += len;
	} while (*p++ == ',');
	return 0;
}

int kvfs_rc_parse_redirect(const char *err, int *ask, unsigned *slot,
			   char *host, size_t hostlen, int *port)
{
	const char *p, *sp;
	uint32_t s;
	char num[8];
	int a;

	if (!strncmp(err, "MOVED ", 6)) {
		a = 0;
		p = err + 6;
	} else if (!strncmp(err, "ASK ", 4)) {
		a = 1;
		p = err + 4;
	} else {
		return -EINVAL;
	}
	sp = strchr(p, ' ');
	if (!sp || sp == p || (size_t)(sp - p) >= sizeof(num))
		return -EINVAL;
	memcpy(num, p, (size_t)(sp - p));
	num[sp - p] = 0;
	if (kvfs_util_parse_u32(num, &s) || s >= KVFS_RC_SLOTS)
		return -EINVAL;
	if (kvfs_rc_parse_addr(sp + 1, strlen(sp + 1), host, hostlen, port))
		return -EINVAL;
	*ask = a;
	*slot = s;
	return 0;
}

uint64_t kvfs_rc_backoff_ms(unsigned attempt, unsigned base_ms, unsigned cap_ms)
{
	uint64_t v = base_ms;

	for (unsigned i = 0; i < attempt && v < cap_ms; i++)
		v *= 2;
	return v < cap_ms ? v : cap_ms;
}

void kvfs_rc_conf_defaults(struct kvfs_rc_conf *c)
{
	memset(c, 0, sizeof(*c));
	c->timeout_ms = 200;
	c->retries = 3;
	c->backoff_ms = 10;
	c->down_ms = 2000;
	c->depth = 64;
}

/* ---- faults ---- */

static void rc_fault(struct kvfs_rc *rc, const struct rc_node *nd,
		     const char *what)
{
	unsigned long long missed;

	atomic_fetch_add_explicit(&rc->st.errors, 1, memory_order_relaxed);
	if (kvfs_log_rl_ok(&rc->rl, 1000, &missed))
		kvfs_warn("remote: %s:%d: %s (%llu more faults not logged)",
			  nd ? nd->host : "?", nd ? nd->port : 0, what, missed);
}

static struct timeval rc_tv(unsigned ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (long)(ms % 1000) * 1000 };
	return tv;
}

/* Close @nd's connection after a fault and skip the node for a while.
 * Caller holds nd->lock.
 */
static void node_down(struct kvfs_rc *rc, struct rc_node *nd, const char *why)
{
	uint64_t ms =
		kvfs_rc_backoff_ms(nd->fails, rc->c.backoff_ms, rc->c.down_ms);

	if (nd->ctx) {
		redisFree(nd->ctx);
		nd->ctx = NULL;
	}
	nd->fails++;
	nd->down_until = kvfs_util_now_mono() + ms * 1000000ull;
	rc_fault(rc, nd, why);
}

/* The connection of @nd, opened (and authenticated) if needed.
 * Caller holds nd->lock. 0, -EHOSTDOWN (skipped), -ECONNREFUSED,
 * -ETIMEDOUT, -EACCES.
 */
static int node_connect(struct kvfs_rc *rc, struct rc_node *nd)
{
	struct timeval tv = rc_tv(rc->c.timeout_ms);
	redisReply *r;

	if (nd->ctx)
		return 0;
	if (kvfs_util_now_mono() < nd->down_until)
		return -EHOSTDOWN;
	nd->ctx = redisConnectWithTimeout(nd->host, nd->port, tv);
	if (!nd->ctx || nd->ctx->err) {
		int timed = nd->ctx && nd->ctx->err == REDIS_ERR_IO &&
			    (errno == ETIMEDOUT || errno == EINPROGRESS);

		node_down(rc, nd,
			  timed ? "connect timed out" : "cannot connect");
		return timed ? -ETIMEDOUT : -ECONNREFUSED;
	}
	atomic_fetch_add_explicit(&rc->st.connects, 1, memory_order_relaxed);
	redisSetTimeout(nd->ctx, tv);
	if (!rc->password || !*rc->password)
		return 0;
	r = redisCommand(nd->ctx, "AUTH %s", rc->password);
	if (!r || r->type == REDIS_REPLY_ERROR) {
		int rc_err = r ? -EACCES : -ETIMEDOUT;

		if (r)
			freeReplyObject(r);
		node_down(rc, nd, "AUTH failed");
		return rc_err;
	}
	freeReplyObject(r);
	return 0;
}

/* The node at @host:@port, added when new. Caller holds topo for writing.
 * Returns its index or -ENOSPC (the node limit) / -ENOMEM.
 */
static int node_add(struct kvfs_rc *rc, const char *host, int port)
{
	struct rc_node *nd;

	for (unsigned i = 0; i < rc->nnodes; i++)
		if (rc->node[i]->port == port &&
		    !strcmp(rc->node[i]->host, host))
			return (int)i;
	if (rc->nnodes == KVFS_RC_MAX_NODES)
		return -ENOSPC;
	nd = calloc(1, sizeof(*nd));
	if (!nd)
		return -ENOMEM;
	snprintf(nd->host, sizeof(nd->host), "%s", host);
	nd->port = port;
	pthread_mutex_init(&nd->lock, NULL);
	rc->node[rc->nnodes] = nd;
	return (int)rc->nnodes++;
}

/* ---- topology ---- */

/* Parse a CLUSTER SLOTS reply from @from into @map. Caller holds topo for
 * writing (nodes are added). 0 or -EINVAL.
 */
static int slots_parse(struct kvfs_rc *rc, const struct rc_node *from,
		       const redisReply *r, uint16_t *map)
{
	char host[KVFS_RC_HOST_MAX];

	if (r->type != REDIS_REPLY_ARRAY)
		return -EINVAL;
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i], *m;
		long long lo, hi;
		int idx;

		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3)
			return -EINVAL;
		m = e->element[2];
		if (e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER ||
		    m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
		    m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER)
			return -EINVAL;
		lo = e->element[0]->integer;
		hi = e->element[1]->integer;
		if (lo < 0 || hi < lo || hi >= KVFS_RC_SLOTS)
			return -EINVAL;
		/* An empty or "?" host is the node we asked (cluster-preferred-endpoint-type). */
		snprintf(host, sizeof(host), "%s",
			 m->element[0]->len && strcmp(m->element[0]->str, "?") ?
				 m->element[0]->str :
				 from->host);
		idx = node_add(rc, host, (int)m->element[1]->integer);
		if (idx < 0)
			return idx;
		for (long long s = lo; s <= hi; s++)
			map[s] = (uint16_t)idx;
	}
	return 0;
}

int kvfs_rc_refresh(struct kvfs_rc *rc)
{
	uint16_t *map = malloc(sizeof(rc->slot));
	unsigned n;
	int ret = -EHOSTDOWN;

	if (!map)
		return -ENOMEM;
	pthread_rwlock_rdlock(&rc->topo);
	n = rc->nnodes;
	pthread_rwlock_unlock(&rc->topo);
	for (unsigned i = 0; i < n && ret; i++) {
		struct rc_node *nd;
		redisReply *r;

		pthread_rwlock_rdlock(&rc->topo);
		nd = rc->node[i];
		pthread_rwlock_unlock(&rc->topo);
		pthread_mutex_lock(&nd->lock);
		if (node_connect(rc, nd)) {
			pthread_mutex_unlock(&nd->lock);
			continue;
		}
		r = redisCommand(nd->ctx, "CLUSTER SLOTS");
		if (!r) {
			node_down(rc, nd, "CLUSTER SLOTS: no answer");
			pthread_mutex_unlock(&nd->lock);
			continue;
		}
		nd->fails = 0;
		pthread_mutex_unlock(&nd->lock);
		for (unsigned s = 0; s < KVFS_RC_SLOTS; s++)
			map[s] = NO_NODE;
		pthread_rwlock_wrlock(&rc->topo);
		/* "ERR This instance has cluster support disabled"; not
		 * NOAUTH and the like, which say nothing about the mode.
		 */
		if (r->type == REDIS_REPLY_ERROR && i < rc->nseeds &&
		    rc->nseeds == 1 && !strncmp(r->str, "ERR", 3)) {
			/* cluster support disabled: a plain server */
			for (unsigned s = 0; s < KVFS_RC_SLOTS; s++)
				rc->slot[s] = (uint16_t)i;
			rc->plain = 1;
			rc->loaded = 1;
			ret = 0;
		} else if (r->type != REDIS_REPLY_ERROR &&
			   !slots_parse(rc, nd, r, map)) {
			memcpy(rc->slot, map, sizeof(rc->slot));
			rc->plain = 0;
			rc->loaded = 1;
			ret = 0;
		}
		pthread_rwlock_unlock(&rc->topo);
		if (ret)
			rc_fault(rc, nd, "CLUSTER SLOTS: unusable answer");
		freeReplyObject(r);
	}
	free(map);
	if (!ret)
		atomic_fetch_add_explicit(&rc->st.refreshes, 1,
					  memory_order_relaxed);
	return ret;
}

unsigned kvfs_rc_nodes(struct kvfs_rc *rc)
{
	uint8_t seen[KVFS_RC_MAX_NODES] = { 0 };
	unsigned n = 0;

	pthread_rwlock_rdlock(&rc->topo);
	for (unsigned s = 0; s < KVFS_RC_SLOTS; s++)
		if (rc->slot[s] != NO_NODE && !seen[rc->slot[s]]) {
			seen[rc->slot[s]] = 1;
			n++;
		}
	pthread_rwlock_unlock(&rc->topo);
	return n;
}

int kvfs_rc_is_plain(struct kvfs_rc *rc)
{
	int p;

	pthread_rwlock_rdlock(&rc->topo);
	p = rc->plain;
	pthread_rwlock_unlock(&rc->topo);
	return p;
}

const struct kvfs_rc_stats *kvfs_rc_stats(struct kvfs_rc *rc)
{
	return &rc->st;
}

/* ---- batches ---- */

enum cmd_state {
	CMD_DONE = 0,
	CMD_RETRY = 1, /* a fault: retry after a backoff */
	CMD_REDIRECT = 2, /* retry at once */
};

struct batch {
	struct kvfs_rc_cmd *cmd;
	uint8_t *state; /* enum cmd_state */
	int16_t *ask; /* ASK target node, -1 none */
	uint16_t *route; /* this round's node */
	int moved; /* this round saw MOVED */
	int fault; /* this round saw a fault */
};

static void cmd_fail(struct batch *b, size_t i, int err, int state)
{
	b->cmd[i].res = err;
	b->state[i] = (uint8_t)state;
	if (state == CMD_RETRY)
		b->fault = 1;
}

static void cmd_append(redisContext *ctx, const struct kvfs_rc_cmd *c)
{
	const char *argv[4];
	size_t len[4];
	int argc = 2;

	len[1] = c->klen;
	argv[1] = c->key;
	switch (c->op) {
	case KVFS_RC_GET:
		argv[0] = "GET";
		break;
	case KVFS_RC_DEL:
		argv[0] = "DEL";
		break;
	case KVFS_RC_EXISTS:
		argv[0] = "EXISTS";
		break;
	default:
		argv[0] = "SET";
		argv[2] = c->val;
		len[2] = c->vlen;
		argc = 3;
		if (c->op == KVFS_RC_SETNX) {
			argv[3] = "NX";
			len[3] = 2;
			argc = 4;
		}
		break;
	}
	len[0] = strlen(argv[0]);
	redisAppendCommandArgv(ctx, argc, argv, len);
}

/* Sort the reply @r of command @i of @b. @nd answered it. */
static void cmd_reply(struct kvfs_rc *rc, struct batch *b, size_t i,
		      struct rc_node *nd, const redisReply *r)
{
	struct kvfs_rc_cmd *c = &b->cmd[i];
	char host[KVFS_RC_HOST_MAX];
	unsigned slot;
	int ask, port, idx;

	b->ask[i] = -1;
	if (r->type == REDIS_REPLY_ERROR) {
		if (!kvfs_rc_parse_redirect(r->str, &ask, &slot, host,
					    sizeof(host), &port)) {
			pthread_rwlock_wrlock(&rc->topo);
			idx = node_add(rc, *host ? host : nd->host, port);
			if (idx >= 0 && !ask)
				rc->slot[slot] = (uint16_t)idx;
			pthread_rwlock_unlock(&rc->topo);
			if (idx < 0)
				return cmd_fail(b, i, -EIO, CMD_DONE);
			if (ask) {
				b->ask[i] = (int16_t)idx;
				atomic_fetch_add_explicit(&rc->st.ask, 1,
							  memory_order_relaxed);
			} else {
				b->moved = 1;
				atomic_fetch_add_explicit(&rc->st.moved, 1,
							  memory_order_relaxed);
			}
			return cmd_fail(b, i, -EAGAIN, CMD_REDIRECT);
		}
		rc_fault(rc, nd, r->str);
		if (!strncmp(r->str, "TRYAGAIN", 8) ||
		    !strncmp(r->str, "CLUSTERDOWN", 11) ||
		    !strncmp(r->str, "LOADING", 7) ||
		    !strncmp(r->str, "MASTERDOWN", 10)) {
			/* resharding or a failover: the map may be stale */
			b->moved = 1;
			return cmd_fail(b, i, -EAGAIN, CMD_RETRY);
		}
		if (!strncmp(r->str, "OOM", 3))
			return cmd_fail(b, i, -ENOSPC, CMD_DONE);
		if (!strncmp(r->str, "NOAUTH", 6) ||
		    !strncmp(r->str, "WRONGPASS", 9))
			return cmd_fail(b, i, -EACCES, CMD_DONE);
		return cmd_fail(b, i, -EIO, CMD_DONE);
	}
	b->state[i] = CMD_DONE;
	switch (c->op) {
	case KVFS_RC_GET:
		if (r->type == REDIS_REPLY_NIL) {
			c->res = -ENOENT;
		} else if (r->type != REDIS_REPLY_STRING) {
			c->res = -EIO;
		} else {
			c->data = malloc(r->len ? r->len : 1);
			c->res = c->data ? 0 : -ENOMEM;
			if (c->data) {
				memcpy(c->data, r->str, r->len);
				c->len = r->len;
			}
		}
		break;
	case KVFS_RC_SETNX:
	case KVFS_RC_SET:
		c->res = r->type == REDIS_REPLY_NIL    ? -EEXIST :
			 r->type == REDIS_REPLY_STATUS ? 0 :
							 -EIO;
		break;
	default:
		c->res = r->type != REDIS_REPLY_INTEGER ? -EIO :
			 r->integer			? 0 :
							  -ENOENT;
		break;
	}
}

/* One pipelined round of the commands @idx[0..n) on node @ni. */
static void node_round(struct kvfs_rc *rc, struct batch *b, unsigned ni,
		       const size_t *idx, size_t n)
{
	struct rc_node *nd;
	size_t depth = rc->c.depth ? rc->c.depth : 64;
	int err;

	pthread_rwlock_rdlock(&rc->topo);
	nd = rc->node[ni];
	pthread_rwlock_unlock(&rc->topo);
	pthread_mutex_lock(&nd->lock);
	for (size_t lo = 0; lo < n; lo += depth) {
		size_t hi = lo + depth < n ? lo + depth : n, got;

		err = node_connect(rc, nd);
		if (err) {
			for (size_t k = lo; k < n; k++)
				cmd_fail(b, idx[k], err, CMD_RETRY);
			break;
		}
		for (size_t k = lo; k < hi; k++) {
			if (b->ask[idx[k]] >= 0)
				redisAppendCommand(nd->ctx, "ASKING");
			cmd_append(nd->ctx, &b->cmd[idx[k]]);
		}
		for (got = lo; got < hi; got++) {
			redisReply *r = NULL;

			if (b->ask[idx[got]] >= 0) {
				if (redisGetReply(nd->ctx, (void **)&r) !=
				    REDIS_OK)
					break;
				freeReplyObject(r);
				r = NULL;
			}
			if (redisGetReply(nd->ctx, (void **)&r) != REDIS_OK)
				break;
			cmd_reply(rc, b, idx[got], nd, r);
			freeReplyObject(r);
		}
		if (got < hi) {
			int timed = nd->ctx->err == REDIS_ERR_IO &&
				    (errno == EAGAIN || errno == EWOULDBLOCK ||
				     errno == ETIMEDOUT);

			if (timed)
				atomic_fetch_add_explicit(&rc->st.timeouts, 1,
							  memory_order_relaxed);
			node_down(rc, nd,
				  timed ? "timed out" : "connection lost");
			for (size_t k = got; k < n; k++)
				cmd_fail(b, idx[k], timed ? -ETIMEDOUT : -EIO,
					 CMD_RETRY);
			break;
		}
		nd->fails = 0;
	}
	pthread_mutex_unlock(&nd->lock);
}

static void batch_round(struct kvfs_rc *rc, struct batch *b, size_t n,
			size_t *idx)
{
	uint8_t used[KVFS_RC_MAX_NODES] = { 0 };

	pthread_rwlock_rdlock(&rc->topo);
	for (size_t i = 0; i < n; i++) {
		if (b->state[i] == CMD_DONE)
			continue;
		b->route[i] = b->ask[i] >= 0 ?
				      (uint16_t)b->ask[i] :
				      rc->slot[kvfs_rc_slot(b->cmd[i].key,
							    b->cmd[i].klen)];
		if (b->route[i] == NO_NODE) {
			b->moved = 1; /* an unowned slot: reload the map */
			cmd_fail(b, i, -EAGAIN, CMD_RETRY);
			continue;
		}
		used[b->route[i]] = 1;
	}
	pthread_rwlock_unlock(&rc->topo);
	for (unsigned ni = 0; ni < KVFS_RC_MAX_NODES; ni++) {
		size_t k = 0;

		if (!used[ni])
			continue;
		for (size_t i = 0; i < n; i++)
			if (b->state[i] != CMD_DONE && b->route[i] == ni)
				idx[k++] = i;
		if (k)
			node_round(rc, b, ni, idx, k);
	}
}

int kvfs_rc_exec(struct kvfs_rc *rc, struct kvfs_rc_cmd *cmd, size_t n)
{
	struct batch b = { .cmd = cmd };
	size_t *idx;
	unsigned fault_tries = 0, redirects = 0;
	int ret = -ENOMEM;

	if (!n)
		return 0;
	b.state = malloc(n);
	b.ask = malloc(n * sizeof(*b.ask));
	b.route = malloc(n * sizeof(*b.route));
	idx = malloc(n * sizeof(*idx));
	if (!b.state || !b.ask || !b.route || !idx)
		goto out_free;
	for (size_t i = 0; i < n; i++) {
		cmd[i].res = -EAGAIN;
		cmd[i].data = NULL;
		cmd[i].len = 0;
		b.state[i] = CMD_RETRY;
		b.ask[i] = -1;
	}
	pthread_rwlock_rdlock(&rc->topo);
	b.moved = !rc->loaded;
	pthread_rwlock_unlock(&rc->topo);
	for (;;) {
		size_t left = 0, waiting = 0;

		if (b.moved)
			kvfs_rc_refresh(rc);
		b.moved = b.fault = 0;
		batch_round(rc, &b, n, idx);
		for (size_t i = 0; i < n; i++) {
			left += b.state[i] != CMD_DONE;
			waiting += b.state[i] == CMD_RETRY;
		}
		if (!left)
			break;
		/* A redirect costs no try, but a loop of them is bounded. */
		if (!waiting && ++redirects <= 16)
			continue;
		if (fault_tries >= rc->c.retries)
			break;
		{
			uint64_t ms = kvfs_rc_backoff_ms(
				fault_tries++, rc->c.backoff_ms,
				rc->c.timeout_ms ? rc->c.timeout_ms : 200);
			struct timespec ts = {
				.tv_sec = (time_t)(ms / 1000),
				.tv_nsec = (long)(ms % 1000) * 1000000,
			};

			nanosleep(&ts, NULL);
		}
		for (size_t i = 0; i < n; i++)
			if (b.state[i] == CMD_RETRY)
				b.ask[i] = -1;
	}
	ret = 0;
	for (size_t i = 0; i < n; i++) {
		if (b.state[i] != CMD_DONE && !ret)
			ret = cmd[i].res;
	}
out_free:
	free(idx);
	free(b.route);
	free(b.ask);
	free(b.state);
	return ret;
}

/* ---- life ---- */

/* kvfs_rc_addr_fn for the seeds: each becomes a node. */
static int seed_add(void *arg, const char *host, int port)
{
	struct kvfs_rc *rc = arg;
	int ret;

	pthread_rwlock_wrlock(&rc->topo);
	ret = node_add(rc, host, port);
	pthread_rwlock_unlock(&rc->topo);
	return ret < 0 ? ret : 0;
}

int kvfs_rc_new(const struct kvfs_rc_conf *c, struct kvfs_rc **out)
{
	struct kvfs_rc *rc;
	const char *bad = NULL;
	size_t badlen = 0;
	int ret = -EINVAL;

	*out = NULL;
	if (!c->nodes || !*c->nodes)
		return -EINVAL;
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	rc->c = *c;
	pthread_rwlock_init(&rc->topo, NULL);
	for (unsigned s = 0; s < KVFS_RC_SLOTS; s++)
		rc->slot[s] = NO_NODE;
	rc->seeds = strdup(c->nodes);
	rc->password = c->password ? strdup(c->password) : NULL;
	if (!rc->seeds || (c->password && !rc->password)) {
		ret = -ENOMEM;
		goto out_free;
	}
	rc->c.nodes = rc->seeds;
	rc->c.password = rc->password;
	ret = kvfs_rc_parse_list(rc->seeds, seed_add, rc, &bad, &badlen);
	if (ret == -EINVAL)
		kvfs_err("remote: bad node address '%.*s' (host:port)",
			 (int)badlen, bad);
	if (ret)
		goto out_free;
	rc->nseeds = rc->nnodes;
	if (kvfs_rc_refresh(rc))
		kvfs_warn("remote: no seed of '%s' answers yet", rc->seeds);
	*out = rc;
	return 0;
out_free:
	kvfs_rc_free(rc);
	return ret < 0 && ret != -ENOSPC ? ret : -EINVAL;
}

void kvfs_rc_free(struct kvfs_rc *rc)
{
	if (!rc)
		return;
	for (unsigned i = 0; i < rc->nnodes; i++) {
		if (rc->node[i]->ctx)
			redisFree(rc->node[i]->ctx);
		pthread_mutex_destroy(&rc->node[i]->lock);
		free(rc->node[i]);
	}
	pthread_rwlock_destroy(&rc->topo);
	free(rc->password);
	free(rc->seeds);
	free(rc);
}
