/* SPDX-License-Identifier: MIT */
/*
 * The remote tier: block images shared by many kvfs hosts through a Redis
 * Cluster (or one plain Redis server), docs/remote.md.
 *
 * Unlike the local tiers it is addressed by key, not by extent: one Redis
 * key per block, "<key_prefix>:<namespace root key hex>:<block key hex>",
 * whose value is the block file image exactly as format v1 defines it.
 * Values never change (writes are SET NX); eviction is the cluster's.
 * A reader trusts nothing it gets: every value is checked as a commit
 * checks a block (kvfs_fmt_validate against the reader's namespace) before
 * a byte of it is used; a value that fails is a miss, logged (rate-
 * limited), counted in `rejected` and deleted from the cluster.
 *
 * It embeds struct kvfs_tier (id KVFS_TIER_REMOTE, outside the engine's
 * tier array) for its name and counters; the extent ops answer
 * -EOPNOTSUPP and ->sync drains the write-back queue.
 *
 * Backends: redis (tier/redis_cluster.h), or memory: a map in this
 * process with the same semantics, for unit tests without a server.
 *
 * Locking: every function is thread-safe. The write-back queue has its
 * own lock and one thread that sends it in pipelined batches.
 *
 * Time: the callers' operations (getv, get, exists, put, poke) never
 * retry: each waits at most one connect and one round trip (`timeout`
 * each) per node its keys live on, plus a slot-map reload when the map
 * is missing or a MOVED said it changed; a failed node is then skipped
 * for its backoff.  Only the write-back queue retries, with backoff, on
 * connections of its own.
 */
#ifndef KVFS_TIER_TIER_REMOTE_H
#define KVFS_TIER_TIER_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "meta/fmt.h"
#include "meta/hist.h"
#include "tier/tier.h"

enum kvfs_remote_backend {
	KVFS_REMOTE_NONE = 0, /* no [tier.remote]: no remote tier */
	KVFS_REMOTE_REDIS = 1,
	KVFS_REMOTE_MEMORY = 2, /* unit tests */
};

enum kvfs_remote_write {
	KVFS_REMOTE_WRITE_BACK = 0, /* a queue sends after the commit */
	KVFS_REMOTE_WRITE_THROUGH = 1, /* fsync waits for the SET */
	KVFS_REMOTE_WRITE_OFF = 2, /* read-only */
};

enum kvfs_remote_admit {
	KVFS_REMOTE_ADMIT_POLICY = 0, /* what the policy would keep */
	KVFS_REMOTE_ADMIT_ALL = 1, /* every committed block */
};

#define KVFS_REMOTE_NODES_MAX 192
#define KVFS_REMOTE_PREFIX_MAX 64
#define KVFS_REMOTE_PASSWORD_MAX 128
/* "<prefix>:<32 hex>:<32 hex>" */
#define KVFS_REMOTE_KEY_MAX (KVFS_REMOTE_PREFIX_MAX + 2 * KVFS_KEY_HEX_LEN + 2)

/* [tier.remote] (docs/config.md); plain data. */
struct kvfs_remote_conf {
	int backend; /* enum kvfs_remote_backend */
	char nodes[KVFS_REMOTE_NODES_MAX]; /* seeds "host:port,..." */
	char key_prefix[KVFS_REMOTE_PREFIX_MAX]; /* default "kvfs" */
	char password[KVFS_REMOTE_PASSWORD_MAX]; /* "" = no AUTH */
	int write; /* enum kvfs_remote_write */
	int admit; /* enum kvfs_remote_admit */
	unsigned timeout_ms; /* per round trip (200) */
	unsigned queue_blocks; /* write-back bound (1024) */
	uint64_t queue_bytes; /* and in bytes (256M) */
};

/* The defaults above, backend none. */
void kvfs_remote_conf_defaults(struct kvfs_remote_conf *c);

/* What a reader checks a value against: its own namespace. */
struct kvfs_remote_ns {
	const uint8_t *root; /* the namespace root key */
	const struct kvfs_geom *g; /* its geometry */
	unsigned vflags; /* enum kvfs_fmt_vflags it accepts */
};

/* A snapshot of the counters (.kvfs/stats tier.remote.*). */
struct kvfs_remote_stats {
	uint64_t hits, misses; /* blocks looked up: found valid / not */
	uint64_t rejected; /* values that failed a check (deleted) */
	uint64_t errors; /* faults: timeouts, nodes down, ... */
	uint64_t bytes_read, bytes_written;
	uint64_t queued; /* blocks waiting in the write-back queue */
	uint64_t dropped; /* queued blocks dropped (full, or failed) */
	uint64_t nodes; /* masters in the slot map (memory: 1) */
	/* Round trips: one pipeline of commands, from send to the last
	 * reply (a miss, a fault or a timeout included), of the callers'
	 * client and of the write-back's (its retries included).
	 */
	struct kvfs_hist_snap rtt, rtt_bg;
};

struct kvfs_tier_remote;

/*
 * kvfs_remote_key() - the Redis key of block @key of the namespace with
 * root key @root under @prefix into @out (@len bytes).
 * Returns the key's length, or -ENAMETOOLONG (nothing usable in @out).
 */
int kvfs_remote_key(const char *prefix, const uint8_t root[KVFS_KEY_LEN],
		    const uint8_t key[KVFS_KEY_LEN], char *out, size_t len);

/*
 * kvfs_tier_remote_new() - the remote tier of @c (backend redis or
 * memory) with its write-back thread. A cluster that does not answer yet
 * is not an error (the tier reconnects by itself).
 * Returns 0, -EINVAL (backend none, bad nodes), -ENOMEM, or the thread's
 * -errno.
 */
int kvfs_tier_remote_new(const struct kvfs_remote_conf *c,
			 struct kvfs_tier_remote **out);
/* Stop the thread (what is still queued is dropped: drain first) and
 * free; NULL is a no-op.
 */
void kvfs_tier_remote_free(struct kvfs_tier_remote *r);
/* The embedded base (for kvfs_tier_free() and the tier's name). */
struct kvfs_tier *kvfs_tier_remote_base(struct kvfs_tier_remote *r);
/* The configuration it runs with. */
const struct kvfs_remote_conf *
kvfs_tier_remote_conf(const struct kvfs_tier_remote *r);

/* One block of a batched lookup. */
struct kvfs_remote_get {
	const uint8_t *key; /* in: the block key */
	/* out: 0 (a valid image in @img), -ENOENT (a miss or a rejected
	 * value), or the fault (-ETIMEDOUT, -EHOSTDOWN, ...).
	 */
	int res;
	void *img; /* the image, to free() */
	uint64_t len; /* its length */
	struct kvfs_fmt_hdr hdr; /* its decoded header */
};

/*
 * kvfs_tier_remote_getv() - look up @n blocks of namespace @ns in one
 * pipelined batch; check each value, delete and count the ones that fail.
 * Returns 0 when every block got an answer (found or not), else the
 * first fault; each @g[i].res says its own. Counts hits, misses,
 * rejected, errors, bytes_read.
 */
int kvfs_tier_remote_getv(struct kvfs_tier_remote *r,
			  const struct kvfs_remote_ns *ns,
			  struct kvfs_remote_get *g, size_t n);
/* One block: 0 with *@img (to free()) and *@len, -ENOENT, or a fault. */
int kvfs_tier_remote_get(struct kvfs_tier_remote *r,
			 const struct kvfs_remote_ns *ns,
			 const uint8_t key[KVFS_KEY_LEN], void **img,
			 uint64_t *len);
/* Whether block @key of namespace root @root is stored (no check of the
 * value: a stat, not a read). 0, -ENOENT, or a fault.
 */
int kvfs_tier_remote_exists(struct kvfs_tier_remote *r,
			    const uint8_t root[KVFS_KEY_LEN],
			    const uint8_t key[KVFS_KEY_LEN]);

/*
 * kvfs_tier_remote_put() - SET NX the image now (write = through); a key
 * already there is success. Returns 0, -EROFS (write = off), or the
 * fault. Counts bytes_written, errors.
 */
int kvfs_tier_remote_put(struct kvfs_tier_remote *r,
			 const uint8_t root[KVFS_KEY_LEN],
			 const uint8_t key[KVFS_KEY_LEN], const void *img,
			 uint64_t len);
/*
 * kvfs_tier_remote_queue() - copy the image into the write-back queue;
 * never waits on the network. A full queue drops its oldest entries
 * (counted in `dropped`). Returns 0, -EROFS (write = off), -E2BIG (larger
 * than the whole queue), -ENOMEM.
 */
int kvfs_tier_remote_queue(struct kvfs_tier_remote *r,
			   const uint8_t root[KVFS_KEY_LEN],
			   const uint8_t key[KVFS_KEY_LEN], const void *img,
			   uint64_t len);
/* Wait until the queue is empty and nothing is in flight, at most
 * @timeout_ms. 0 or -ETIMEDOUT.
 */
int kvfs_tier_remote_drain(struct kvfs_tier_remote *r, unsigned timeout_ms);

/* A snapshot of the counters. */
void kvfs_tier_remote_stats(struct kvfs_tier_remote *r,
			    struct kvfs_remote_stats *out);

/*
 * kvfs_tier_remote_poke() - SET the raw bytes @val at the key of @root,
 * @key, replacing what is there (tests: a corrupt or foreign value).
 * 0 or the fault.
 */
int kvfs_tier_remote_poke(struct kvfs_tier_remote *r,
			  const uint8_t root[KVFS_KEY_LEN],
			  const uint8_t key[KVFS_KEY_LEN], const void *val,
			  size_t len);

#endif
