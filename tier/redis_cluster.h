/* SPDX-License-Identifier: MIT */
/*
 * A small Redis Cluster client over hiredis (which has no cluster
 * support): CRC16 hash slots with hash tags, CLUSTER SLOTS discovery from
 * seed nodes, MOVED and ASK redirects, a topology refresh when a redirect
 * says it changed, one connection per node reopened after a fault,
 * per-round-trip timeouts, AUTH, pipelined batches, retries with
 * exponential backoff and rate-limited fault lines. A plain server (one
 * seed address, cluster mode off: CLUSTER SLOTS answers an error) owns
 * every slot.
 *
 * The remote tier (tier/tier_remote.h) is its only user; the pure helpers
 * (slots, redirect parsing, backoff) are exported for the unit tests.
 *
 * Locking: a client may be used from any number of threads. The slot map
 * is guarded by an rwlock (read by every batch, written by a refresh or a
 * MOVED); each node's connection by the node's mutex, held for one
 * pipelined round of that node. Nodes are never freed before the client.
 */
#ifndef KVFS_TIER_REDIS_CLUSTER_H
#define KVFS_TIER_REDIS_CLUSTER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVFS_RC_SLOTS 16384
#define KVFS_RC_MAX_NODES 128
#define KVFS_RC_HOST_MAX 64

/* CRC16-CCITT (XModem: poly 0x1021, init 0), the cluster's key hash. */
uint16_t kvfs_rc_crc16(const void *buf, size_t len);
/*
 * kvfs_rc_slot() - the hash slot of a key: CRC16 mod 16384 of the key, or
 * of the part between the first '{' and the next '}' when that part is
 * not empty (a hash tag). Pure.
 */
unsigned kvfs_rc_slot(const void *key, size_t len);

/*
 * kvfs_rc_parse_redirect() - parse an error reply "MOVED 3999 127.0.0.1:6381"
 * or "ASK 3999 127.0.0.1:6381" (the host may be empty: ":6381", meaning
 * the node that answered). Sets *@ask (0 MOVED, 1 ASK), *@slot, @host
 * (@hostlen bytes, NUL-terminated) and *@port.
 * Returns 0, or -EINVAL for anything else (then nothing is set). Pure.
 */
int kvfs_rc_parse_redirect(const char *err, int *ask, unsigned *slot,
			   char *host, size_t hostlen, int *port);

/*
 * kvfs_rc_backoff_ms() - the wait before retry @attempt (0-based):
 * @base_ms * 2^attempt, at most @cap_ms. Pure.
 */
uint64_t kvfs_rc_backoff_ms(unsigned attempt, unsigned base_ms,
			    unsigned cap_ms);

/*
 * kvfs_rc_parse_addr() - "host:port" (IPv4 or a name; the port 1..65535)
 * into @host and *@port. 0 or -EINVAL.
 */
int kvfs_rc_parse_addr(const char *s, size_t len, char *host, size_t hostlen,
		       int *port);

/*
 * kvfs_rc_addr_fn - called by kvfs_rc_parse_list() once per address, in
 * order. Returns 0 to go on; anything else stops the walk and is returned.
 */
typedef int (*kvfs_rc_addr_fn)(void *arg, const char *host, int port);

/*
 * kvfs_rc_parse_list() - walk "host:port[,host:port...]", blanks around
 * each item allowed, calling @fn(@arg, host, port) for each. An empty
 * item (an empty @list, a doubled or trailing comma) is malformed.
 * Returns 0, -EINVAL on the first malformed item (then *@bad and *@badlen,
 * where not NULL, name it as written, for the caller's message), or what
 * @fn returned. Pure apart from @fn.
 */
int kvfs_rc_parse_list(const char *list, kvfs_rc_addr_fn fn, void *arg,
		       const char **bad, size_t *badlen);

struct kvfs_rc_conf {
	const char *nodes; /* seeds: "host:port[,host:port...]" */
	const char *password; /* AUTH; NULL or "" for none */
	unsigned timeout_ms; /* per round trip and per connect (200) */
	unsigned retries; /* tries after the first (3) */
	unsigned backoff_ms; /* first wait, doubled per try (10) */
	unsigned down_ms; /* most a failed node is skipped (2000) */
	unsigned depth; /* commands in flight per node (64) */
};

/* The defaults in the comments above; @c->nodes NULL. */
void kvfs_rc_conf_defaults(struct kvfs_rc_conf *c);

enum kvfs_rc_op {
	KVFS_RC_GET = 1, /* ok: @data/@len hold the value (malloc'd) */
	KVFS_RC_SETNX = 2, /* SET key val NX; -EEXIST: the key was there */
	KVFS_RC_SET = 3, /* SET key val (tests overwrite with it) */
	KVFS_RC_DEL = 4, /* -ENOENT: no such key */
	KVFS_RC_EXISTS = 5, /* 0 present, -ENOENT absent */
};

/* One command of a batch. The caller fills op, key, klen (and val, vlen
 * for a SET); exec fills res and, for a GET hit, data and len.
 */
struct kvfs_rc_cmd {
	int op;
	const char *key;
	size_t klen;
	const void *val;
	size_t vlen;
	/* out: 0; -ENOENT (GET/DEL/EXISTS: no key); -EEXIST (SETNX);
	 * -ETIMEDOUT, -ECONNREFUSED, -EHOSTDOWN, -EIO (the node, after
	 * every retry); -EAGAIN (the cluster resharding or down after every
	 * retry); -ENOSPC (OOM); -EACCES (auth); -ENOMEM.
	 */
	int res;
	void *data; /* GET: the value, to free() */
	size_t len;
};

/* Counters, relaxed atomics. */
struct kvfs_rc_stats {
	atomic_uint_least64_t errors; /* faults: I/O, timeouts, error replies */
	atomic_uint_least64_t timeouts;
	atomic_uint_least64_t moved, ask; /* redirects followed */
	atomic_uint_least64_t refreshes; /* CLUSTER SLOTS reloads */
	atomic_uint_least64_t connects; /* connections opened */
};

struct kvfs_rc;

/*
 * kvfs_rc_new() - a client of the seeds in @c->nodes. Loads the topology
 * from the first seed that answers; a seed that answers CLUSTER SLOTS with
 * an error is a plain server owning every slot. When no seed answers the
 * client is still made (the map is loaded at the first batch).
 * Returns 0, -EINVAL (no or malformed seeds, more than the node limit),
 * -ENOMEM.
 */
int kvfs_rc_new(const struct kvfs_rc_conf *c, struct kvfs_rc **out);
/* Close every connection and free; NULL is a no-op. No batch may run. */
void kvfs_rc_free(struct kvfs_rc *rc);

/*
 * kvfs_rc_exec() - run @n commands as pipelined rounds, grouped by node,
 * at most conf.depth per round trip. A redirect is followed (and MOVED
 * refreshes the map), a fault retried with backoff, conf.retries times;
 * a node that failed is skipped (its commands fail at once, retryable)
 * for a backoff that grows to conf.down_ms. Each command gets its own
 * res. Returns 0 when every command got an answer (a miss or -EEXIST is
 * an answer), else the first command's fault (-errno). Thread-safe.
 */
int kvfs_rc_exec(struct kvfs_rc *rc, struct kvfs_rc_cmd *cmd, size_t n);

/*
 * kvfs_rc_refresh() - reload the slot map now (CLUSTER SLOTS from the
 * first known node that answers). 0, or -EHOSTDOWN when none did.
 */
int kvfs_rc_refresh(struct kvfs_rc *rc);

/* Masters that own slots in the current map (1 for a plain server). */
unsigned kvfs_rc_nodes(struct kvfs_rc *rc);
/* Whether the map came from a plain server. */
int kvfs_rc_is_plain(struct kvfs_rc *rc);
/* The client's counters (live; read with atomic loads). */
const struct kvfs_rc_stats *kvfs_rc_stats(struct kvfs_rc *rc);

#endif
