/* SPDX-License-Identifier: MIT */
/*
 * Fleet sightings (tier/sight.h): the wire format, the buffer, the
 * sender, the Redis subscriber and the in-process bus.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/random.h>

#include <hiredis/hiredis.h>

#include "meta/log.h"
#include "meta/util.h"
#include "tier/redis_cluster.h"
#include "tier/sight.h"

#define SEEDS_MAX 16
/* The subscriber's and the publisher's waits after a fault: doubled from
 * the first to the cap.
 */
#define BACKOFF_MS 100
#define BACKOFF_CAP_MS 5000
/* "<channel>:sightings" */
#define CHAN_SUFFIX ":sightings"
#define CHAN_MAX (KVFS_SIGHT_CHANNEL_MAX + sizeof(CHAN_SUFFIX))

struct seed {
	char host[KVFS_RC_HOST_MAX];
	int port;
};

struct kvfs_sight {
	/* Set at new, read-only after. */
	struct kvfs_sight_conf c;
	kvfs_sight_deliver_fn deliver;
	void *arg;
	uint64_t host;
	char chan[CHAN_MAX];
	size_t chanlen;
	struct seed seed[SEEDS_MAX];
	unsigned nseeds;

	/* The buffer of notes, and the sender's wait. */
	pthread_mutex_t lock;
	pthread_cond_t cond; /* lock: stop */
	uint8_t (*buf)[KVFS_KEY_LEN]; /* lock: c.buffer keys */
	size_t n; /* lock: keys in buf */
	bool stop; /* lock */

	/* Sending: what was taken from the buffer, the message being built
	 * and the publish connection.
	 */
	pthread_mutex_t send_lock;
	uint8_t (*spare)[KVFS_KEY_LEN]; /* send_lock: c.buffer keys */
	uint8_t *msg; /* send_lock: KVFS_SIGHT_MSG_MAX bytes */
	redisContext *pub; /* send_lock: NULL while down */
	unsigned pub_seed, pub_fails; /* send_lock */
	uint64_t pub_down_until; /* send_lock: monotonic ns */

	pthread_t sender, sub; /* set at new, joined at free */
	bool sender_started, sub_started; /* set at new */
	_Atomic bool sub_stop; /* the subscriber is to return */
	int wakefd; /* set at new: eventfd waking the subscriber's poll; -1 */

	struct kvfs_sight *bus_next; /* bus_lock: memory instances */

	/* Counters (relaxed atomics) and the log's rate limits (lock-free). */
	atomic_uint_least64_t keys_out, msgs_out, keys_in, msgs_in;
	atomic_uint_least64_t dropped, lost, rejected, errors, reconnects;
	struct kvfs_log_rl rl_fault, rl_bad;
};

/* The in-process bus: every instance of backend memory, any channel. */
static pthread_mutex_t bus_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvfs_sight *bus_head; /* bus_lock */

static void count(atomic_uint_least64_t *v, uint64_t n)
{
	atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

void kvfs_sight_conf_defaults(struct kvfs_sight_conf *c)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->channel, "kvfs");
	c->interval_ms = 1000;
	c->timeout_ms = 200;
	c->buffer = 65536;
}

/* ---- the wire format ---- */

int kvfs_sight_encode(uint64_t host, const uint8_t (*keys)[KVFS_KEY_LEN],
		      size_t n, void *buf, size_t len)
{
	const size_t hs = sizeof(struct kvfs_sight_hdr);
	uint8_t *p = buf;

	if (n > KVFS_SIGHT_MSG_KEYS)
		return -EINVAL;
	if (len < hs + n * KVFS_KEY_LEN)
		return -ENOSPC;
	kvfs_util_put32(p + offsetof(struct kvfs_sight_hdr, magic),
			KVFS_SIGHT_MAGIC);
	kvfs_util_put16(p + offsetof(struct kvfs_sight_hdr, version),
			KVFS_SIGHT_VERSION);
	kvfs_util_put16(p + offsetof(struct kvfs_sight_hdr, hdr_size),
			(uint16_t)hs);
	kvfs_util_put64(p + offsetof(struct kvfs_sight_hdr, host), host);
	kvfs_util_put32(p + offsetof(struct kvfs_sight_hdr, count),
			(uint32_t)n);
	if (n)
		memcpy(p + hs, keys, n * KVFS_KEY_LEN);
	kvfs_util_put32(p + offsetof(struct kvfs_sight_hdr, crc),
			kvfs_fmt_crc32c(0, p + hs, n * KVFS_KEY_LEN));
	return (int)(hs + n * KVFS_KEY_LEN);
}

static int bad(const char **why, const char *what, int err)
{
	if (why)
		*why = what;
	return err;
}

int kvfs_sight_decode(const void *buf, size_t len, uint64_t *host,
		      const uint8_t (**keys)[KVFS_KEY_LEN], size_t *n,
		      const char **why)
{
	const size_t hs = sizeof(struct kvfs_sight_hdr);
	const uint8_t *p = buf;
	uint32_t cnt;

	if (!p || len < hs)
		return bad(why, "shorter than a header", -EINVAL);
	if (kvfs_util_get32(p + offsetof(struct kvfs_sight_hdr, magic)) !=
	    KVFS_SIGHT_MAGIC)
		return bad(why, "bad magic", -EINVAL);
	if (kvfs_util_get16(p + offsetof(struct kvfs_sight_hdr, version)) !=
	    KVFS_SIGHT_VERSION)
		return bad(why, "unknown version", -EINVAL);
	if (kvfs_util_get16(p + offsetof(struct kvfs_sight_hdr, hdr_size)) !=
	    hs)
		return bad(why, "bad header size", -EINVAL);
	cnt = kvfs_util_get32(p + offsetof(struct kvfs_sight_hdr, count));
	if (cnt > KVFS_SIGHT_MSG_KEYS)
		return bad(why, "too many keys", -EINVAL);
	if (len != hs + (size_t)cnt * KVFS_KEY_LEN)
		return bad(why, "length does not match the key count", -EINVAL);
	if (kvfs_util_get32(p + offsetof(struct kvfs_sight_hdr, crc)) !=
	    kvfs_fmt_crc32c(0, p + hs, (size_t)cnt * KVFS_KEY_LEN))
		return bad(why, "CRC mismatch", -EBADMSG);
	*host = kvfs_util_get64(p + offsetof(struct kvfs_sight_hdr, host));
	*keys = (const uint8_t(*)[KVFS_KEY_LEN])(p + hs);
	*n = cnt;
	return 0;
}

/* ---- receiving ---- */

/* One message from the channel: checked, then handed on unless it is
 * this host's own.
 */
static void sight_receive(struct kvfs_sight *s, const void *msg, size_t len)
{
	const uint8_t(*keys)[KVFS_KEY_LEN];
	unsigned long long missed;
	const char *why = "?";
	uint64_t host;
	size_t n;

	if (kvfs_sight_decode(msg, len, &host, &keys, &n, &why)) {
		count(&s->rejected, 1);
		if (kvfs_log_rl_ok(&s->rl_bad, 1000, &missed))
			kvfs_warn("fleet sightings: %s: a message of %zu "
				  "bytes rejected: %s (%llu more not logged)",
				  s->chan, len, why, missed);
		return;
	}
	if (host == s->host)
		return;
	count(&s->msgs_in, 1);
	if (!n)
		return;
	count(&s->keys_in, n);
	s->deliver(s->arg, keys, n);
}

/* Memory: every instance on @s's channel, @s among them, gets the
 * message now.
 */
static void bus_publish(struct kvfs_sight *s, const void *msg, size_t len)
{
	pthread_mutex_lock(&bus_lock);
	for (struct kvfs_sight *t = bus_head; t; t = t->bus_next)
		if (!strcmp(t->chan, s->chan))
			sight_receive(t, msg, len);
	pthread_mutex_unlock(&bus_lock);
}

/* ---- connections ---- */

static void fault(struct kvfs_sight *s, const struct seed *sd, const char *what,
		  const char *detail)
{
	unsigned long long missed;

	count(&s->errors, 1);
	if (kvfs_log_rl_ok(&s->rl_fault, 1000, &missed))
		kvfs_warn("fleet sightings: %s:%d: %s%s%s (%llu more faults "
			  "not logged)",
			  sd->host, sd->port, what, detail ? ": " : "",
			  detail ? detail : "", missed);
}

static struct timeval ms_tv(unsigned ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (long)(ms % 1000) * 1000 };
	return tv;
}

/* A connection to seed @i, authenticated. 0, -ECONNREFUSED, -ETIMEDOUT
 * or -EACCES (counted and logged).
 */
static int conn_open(struct kvfs_sight *s, unsigned i, redisContext **out)
{
	const struct seed *sd = &s->seed[i];
	struct timeval tv = ms_tv(s->c.timeout_ms);
	redisContext *ctx;
	redisReply *r;
	int rc;

	ctx = redisConnectWithTimeout(sd->host, sd->port, tv);
	if (!ctx || ctx->err) {
		rc = ctx && ctx->err == REDIS_ERR_IO &&
				     (errno == ETIMEDOUT ||
				      errno == EINPROGRESS) ?
			     -ETIMEDOUT :
			     -ECONNREFUSED;
		fault(s, sd, "cannot connect", ctx ? ctx->errstr : NULL);
		if (ctx)
			redisFree(ctx);
		return rc;
	}
	redisSetTimeout(ctx, tv);
	if (s->c.password[0]) {
		r = redisCommand(ctx, "AUTH %s", s->c.password);
		if (!r || r->type == REDIS_REPLY_ERROR) {
			rc = r ? -EACCES : -ETIMEDOUT;
			fault(s, sd, "AUTH failed", r ? r->str : ctx->errstr);
			if (r)
				freeReplyObject(r);
			redisFree(ctx);
			return rc;
		}
		freeReplyObject(r);
	}
	*out = ctx;
	return 0;
}

/* The publish connection after a fault: closed, and the next seed's
 * turn. Caller holds send_lock.
 */
static void pub_close(struct kvfs_sight *s)
{
	if (s->pub) {
		redisFree(s->pub);
		s->pub = NULL;
	}
	s->pub_seed = (s->pub_seed + 1) % s->nseeds;
}

/* Open the publish connection: each seed in turn from the current one,
 * once; when none answers, none is tried again before a backoff. Caller
 * holds send_lock. 0, -EHOSTDOWN (in the backoff), or the last seed's
 * fault.
 */
static int pub_connect(struct kvfs_sight *s)
{
	int rc = -EHOSTDOWN;
	uint64_t ms;

	if (kvfs_util_now_mono() < s->pub_down_until)
		return rc;
	for (unsigned i = 0; i < s->nseeds; i++) {
		rc = conn_open(s, s->pub_seed, &s->pub);
		if (!rc)
			return 0;
		s->pub = NULL;
		pub_close(s);
	}
	ms = kvfs_rc_backoff_ms(s->pub_fails++, BACKOFF_MS, BACKOFF_CAP_MS);
	s->pub_down_until = kvfs_util_now_mono() + ms * 1000000ull;
	return rc;
}

/*
 * hiredis writes with write(2), so a write to a peer that is gone raises
 * SIGPIPE in the writing thread, which ends a process that does not
 * ignore it (the daemon's FUSE handlers ignore it, but not during the
 * unmount's last flush, nor in a test).  Our writes run with it blocked,
 * and one they raise is taken back before the mask is restored.
 */
struct pipe_guard {
	sigset_t old;
	bool was_pending;
};

static void pipe_block(struct pipe_guard *g)
{
	sigset_t set, pend;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	sigpending(&pend);
	g->was_pending = sigismember(&pend, SIGPIPE) == 1;
	pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void pipe_unblock(struct pipe_guard *g)
{
	struct timespec zero = { 0, 0 };
	sigset_t set, pend;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	sigpending(&pend);
	if (!g->was_pending && sigismember(&pend, SIGPIPE) == 1)
		sigtimedwait(&set, NULL, &zero);
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* PUBLISH one message on the open connection, opening it first if
 * needed. Caller holds send_lock and has SIGPIPE blocked.
 */
static int pub_redis(struct kvfs_sight *s, const void *msg, size_t len)
{
	redisReply *r;
	int rc;

	if (!s->pub && (rc = pub_connect(s)))
		return rc;
	r = redisCommand(s->pub, "PUBLISH %b %b", s->chan, s->chanlen, msg,
			 len);
	if (r && r->type == REDIS_REPLY_INTEGER) {
		freeReplyObject(r);
		s->pub_fails = 0;
		return 0;
	}
	if (!r) {
		/* hiredis leaves EAGAIN in errno after a read timeout */
		rc = s->pub->err == REDIS_ERR_IO && errno == EAGAIN ?
			     -ETIMEDOUT :
			     -EIO;
		fault(s, &s->seed[s->pub_seed], "PUBLISH failed",
		      s->pub->errstr);
	} else {
		rc = r->type == REDIS_REPLY_ERROR &&
				     !strncmp(r->str, "NOAUTH", 6) ?
			     -EACCES :
			     -EIO;
		fault(s, &s->seed[s->pub_seed], "PUBLISH refused",
		      r->type == REDIS_REPLY_ERROR ? r->str :
						     "unexpected reply");
		freeReplyObject(r);
	}
	/* The message is lost; the next one tries the next seed. */
	pub_close(s);
	return rc;
}

/* PUBLISH one message. Caller holds send_lock. 0, -EHOSTDOWN (in a
 * backoff), or the connection's fault.
 */
static int pub_send(struct kvfs_sight *s, const void *msg, size_t len)
{
	struct pipe_guard g;
	int rc;

	if (s->c.backend == KVFS_SIGHT_MEMORY) {
		bus_publish(s, msg, len);
		return 0;
	}
	pipe_block(&g);
	rc = pub_redis(s, msg, len);
	pipe_unblock(&g);
	return rc;
}

/* ---- sending ---- */

/* Publish what is buffered: swapped out under the buffer's lock, sent
 * under send_lock only. The first fault loses the rest of the batch.
 */
static int sight_send(struct kvfs_sight *s)
{
	uint8_t(*t)[KVFS_KEY_LEN];
	size_t n, off;
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	t = s->buf;
	s->buf = s->spare;
	s->spare = t;
	n = s->n;
	s->n = 0;
	pthread_mutex_unlock(&s->lock);
	for (off = 0; off < n;) {
		size_t m = n - off < KVFS_SIGHT_MSG_KEYS ? n - off :
							   KVFS_SIGHT_MSG_KEYS;
		int len = kvfs_sight_encode(
			s->host,
			(const uint8_t(*)[KVFS_KEY_LEN])(s->spare + off), m,
			s->msg, KVFS_SIGHT_MSG_MAX);

		rc = len < 0 ? len : pub_send(s, s->msg, (size_t)len);
		if (rc)
			break;
		count(&s->msgs_out, 1);
		count(&s->keys_out, m);
		off += m;
	}
	if (off < n)
		count(&s->lost, n - off);
	return rc;
}

int kvfs_sight_flush(struct kvfs_sight *s)
{
	int rc;

	pthread_mutex_lock(&s->send_lock);
	rc = sight_send(s);
	pthread_mutex_unlock(&s->send_lock);
	return rc;
}

int kvfs_sight_inject(struct kvfs_sight *s, const void *msg, size_t len)
{
	int rc;

	pthread_mutex_lock(&s->send_lock);
	rc = pub_send(s, msg, len);
	pthread_mutex_unlock(&s->send_lock);
	return rc;
}

void kvfs_sight_note(struct kvfs_sight *s, const uint8_t key[KVFS_KEY_LEN])
{
	pthread_mutex_lock(&s->lock);
	if (s->n < s->c.buffer) {
		memcpy(s->buf[s->n++], key, KVFS_KEY_LEN);
		pthread_mutex_unlock(&s->lock);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	count(&s->dropped, 1);
}

/* The sender: a publish per interval while there are notes. */
static void *sender_main(void *arg)
{
	struct kvfs_sight *s = arg;
	struct timespec dl;

	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		clock_gettime(CLOCK_MONOTONIC, &dl);
		dl.tv_sec += s->c.interval_ms / 1000;
		dl.tv_nsec += (long)(s->c.interval_ms % 1000) * 1000000;
		if (dl.tv_nsec >= 1000000000) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000;
		}
		while (!s->stop && pthread_cond_timedwait(&s->cond, &s->lock,
							  &dl) != ETIMEDOUT)
			;
		if (s->stop || !s->n)
			continue;
		pthread_mutex_unlock(&s->lock);
		kvfs_sight_flush(s);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- the subscriber (redis) ---- */

static bool sub_stopping(struct kvfs_sight *s)
{
	return atomic_load(&s->sub_stop);
}

/* Sleep @ms, or less when told to stop. */
static void sub_wait(struct kvfs_sight *s, uint64_t ms)
{
	struct pollfd p = { .fd = s->wakefd, .events = POLLIN };

	if (!sub_stopping(s))
		poll(&p, 1, (int)ms);
}

/* One reply on the subscribed connection: a message is received, the
 * rest (confirmations) ignored.
 */
static void sub_reply(struct kvfs_sight *s, const redisReply *r)
{
	const redisReply *kind, *data;

	if (r->type != REDIS_REPLY_ARRAY || r->elements != 3)
		return;
	kind = r->element[0];
	data = r->element[2];
	if (kind->type != REDIS_REPLY_STRING || strcmp(kind->str, "message") ||
	    data->type != REDIS_REPLY_STRING)
		return;
	sight_receive(s, data->str, data->len);
}

/* SUBSCRIBE on @ctx and wait for its confirmation. 0 or -EIO. */
static int sub_subscribe(struct kvfs_sight *s, unsigned i, redisContext *ctx)
{
	redisReply *r;
	void *rv = NULL;
	int ok;

	if (redisAppendCommand(ctx, "SUBSCRIBE %b", s->chan, s->chanlen) !=
		    REDIS_OK ||
	    redisGetReply(ctx, &rv) != REDIS_OK || !rv) {
		fault(s, &s->seed[i], "SUBSCRIBE failed", ctx->errstr);
		if (rv)
			freeReplyObject(rv);
		return -EIO;
	}
	r = rv;
	ok = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
	     r->element[0]->type == REDIS_REPLY_STRING &&
	     !strcmp(r->element[0]->str, "subscribe");
	if (!ok)
		fault(s, &s->seed[i], "SUBSCRIBE refused",
		      r->type == REDIS_REPLY_ERROR ? r->str :
						     "unexpected reply");
	freeReplyObject(r);
	return ok ? 0 : -EIO;
}

/* Read messages until told to stop (0) or the connection fails (-EIO). A
 * poll with the wake fd stands in for a read timeout: hiredis gives a
 * blocking context up after one.
 */
static int sub_loop(struct kvfs_sight *s, unsigned i, redisContext *ctx)
{
	for (;;) {
		struct pollfd p[2] = { { .fd = ctx->fd, .events = POLLIN },
				       { .fd = s->wakefd, .events = POLLIN } };
		void *r = NULL;
		int k;

		if (redisGetReplyFromReader(ctx, &r) != REDIS_OK) {
			fault(s, &s->seed[i], "bad reply", ctx->errstr);
			return -EIO;
		}
		if (r) {
			sub_reply(s, r);
			freeReplyObject(r);
			continue;
		}
		if (sub_stopping(s))
			return 0;
		k = poll(p, 2, (int)s->c.interval_ms);
		if (sub_stopping(s))
			return 0;
		if (k < 0 && errno != EINTR) {
			fault(s, &s->seed[i], "poll", strerror(errno));
			return -EIO;
		}
		if (k > 0 && p[0].revents && redisBufferRead(ctx) != REDIS_OK) {
			fault(s, &s->seed[i], "subscription lost", ctx->errstr);
			return -EIO;
		}
	}
}

static void *sub_main(void *arg)
{
	struct kvfs_sight *s = arg;
	unsigned seed = 0, attempt = 0;
	bool first = true;
	sigset_t set;

	/* This thread's writes (AUTH, SUBSCRIBE) never raise SIGPIPE: a
	 * write to a closed peer fails with EPIPE instead (pipe_block()).
	 */
	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	while (!sub_stopping(s)) {
		redisContext *ctx = NULL;
		int rc = conn_open(s, seed, &ctx);

		if (!rc)
			rc = sub_subscribe(s, seed, ctx);
		if (!rc) {
			if (!first) {
				count(&s->reconnects, 1);
				kvfs_info("fleet sightings: subscribed again "
					  "at %s:%d",
					  s->seed[seed].host,
					  s->seed[seed].port);
			}
			first = false;
			attempt = 0;
			rc = sub_loop(s, seed, ctx);
		}
		if (ctx)
			redisFree(ctx);
		if (!rc || sub_stopping(s))
			break;
		seed = (seed + 1) % s->nseeds;
		sub_wait(s, kvfs_rc_backoff_ms(attempt++, BACKOFF_MS,
					       BACKOFF_CAP_MS));
	}
	return NULL;
}

/* ---- the instance ---- */

/* "host:port[,host:port...]" into s->seed. 0 or -EINVAL. */
/* kvfs_rc_addr_fn for the seeds of a redis bus. */
static int seed_add(void *arg, const char *host, int port)
{
	struct kvfs_sight *s = arg;

	if (s->nseeds == SEEDS_MAX)
		return -EINVAL;
	snprintf(s->seed[s->nseeds].host, sizeof(s->seed[0].host), "%s", host);
	s->seed[s->nseeds++].port = port;
	return 0;
}

int kvfs_sight_new(const struct kvfs_sight_conf *c,
		   kvfs_sight_deliver_fn deliver, void *arg,
		   struct kvfs_sight **out)
{
	pthread_condattr_t ca;
	struct kvfs_sight *s;
	int rc;

	if ((c->backend != KVFS_SIGHT_REDIS &&
	     c->backend != KVFS_SIGHT_MEMORY) ||
	    !c->channel[0] || !c->interval_ms || !c->buffer || !c->timeout_ms ||
	    !deliver)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->c = *c;
	s->deliver = deliver;
	s->arg = arg;
	s->wakefd = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->send_lock, NULL);
	/* The sender's deadlines are monotonic: a clock step is no burst. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &ca);
	pthread_condattr_destroy(&ca);
	s->chanlen = (size_t)snprintf(s->chan, sizeof(s->chan), "%.*s%s",
				      KVFS_SIGHT_CHANNEL_MAX - 1, c->channel,
				      CHAN_SUFFIX);
	if (getrandom(&s->host, sizeof(s->host), 0) != sizeof(s->host)) {
		rc = errno ? -errno : -EIO;
		goto out_free;
	}
	if (c->backend == KVFS_SIGHT_REDIS &&
	    (!c->nodes[0] || kvfs_rc_parse_list(c->nodes, seed_add, s, NULL, NULL))) {
		rc = -EINVAL;
		goto out_free;
	}
	s->buf = malloc((size_t)c->buffer * KVFS_KEY_LEN);
	s->spare = malloc((size_t)c->buffer * KVFS_KEY_LEN);
	s->msg = malloc(KVFS_SIGHT_MSG_MAX);
	if (!s->buf || !s->spare || !s->msg) {
		rc = -ENOMEM;
		goto out_free;
	}
	if (c->backend == KVFS_SIGHT_MEMORY) {
		pthread_mutex_lock(&bus_lock);
		s->bus_next = bus_head;
		bus_head = s;
		pthread_mutex_unlock(&bus_lock);
	} else {
		s->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (s->wakefd < 0) {
			rc = -errno;
			goto out_free;
		}
		rc = -pthread_create(&s->sub, NULL, sub_main, s);
		if (rc)
			goto out_free;
		s->sub_started = true;
	}
	rc = -pthread_create(&s->sender, NULL, sender_main, s);
	if (rc)
		goto out_free;
	s->sender_started = true;
	*out = s;
	return 0;

out_free:
	kvfs_sight_free(s);
	return rc;
}

void kvfs_sight_free(struct kvfs_sight *s)
{
	uint64_t one = 1;

	if (!s)
		return;
	if (s->sender_started) {
		pthread_mutex_lock(&s->lock);
		s->stop = true;
		pthread_cond_signal(&s->cond);
		pthread_mutex_unlock(&s->lock);
		pthread_join(s->sender, NULL);
		kvfs_sight_flush(s);
	}
	if (s->sub_started) {
		atomic_store(&s->sub_stop, true);
		if (write(s->wakefd, &one, sizeof(one)) < 0)
			kvfs_dbg("fleet sightings: wake: %s", strerror(errno));
		pthread_join(s->sub, NULL);
	}
	if (s->c.backend == KVFS_SIGHT_MEMORY) {
		pthread_mutex_lock(&bus_lock);
		for (struct kvfs_sight **pp = &bus_head; *pp;
		     pp = &(*pp)->bus_next)
			if (*pp == s) {
				*pp = s->bus_next;
				break;
			}
		pthread_mutex_unlock(&bus_lock);
	}
	if (s->wakefd >= 0)
		close(s->wakefd);
	if (s->pub)
		redisFree(s->pub);
	free(s->buf);
	free(s->spare);
	free(s->msg);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->send_lock);
	free(s);
}

uint64_t kvfs_sight_host(const struct kvfs_sight *s)
{
	return s->host;
}

void kvfs_sight_stats(struct kvfs_sight *s, struct kvfs_sight_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->keys_out = atomic_load(&s->keys_out);
	out->msgs_out = atomic_load(&s->msgs_out);
	out->keys_in = atomic_load(&s->keys_in);
	out->msgs_in = atomic_load(&s->msgs_in);
	out->dropped = atomic_load(&s->dropped);
	out->lost = atomic_load(&s->lost);
	out->rejected = atomic_load(&s->rejected);
	out->errors = atomic_load(&s->errors);
	out->reconnects = atomic_load(&s->reconnects);
	pthread_mutex_lock(&s->lock);
	out->buffered = s->n;
	pthread_mutex_unlock(&s->lock);
}
