/* SPDX-License-Identifier: MIT */
/*
 * Fleet sightings (docs/remote.md, "Fleet sightings"): the block keys this
 * host referenced, batched and broadcast to the other hosts of a fleet,
 * and theirs delivered here.  Behind a round-robin balancer each host sees
 * only its share of a prefix's references; hearing the others' lets a
 * policy that admits on second sight (cache/policy_kvfs.c) count them all.
 *
 * Transport: Redis Pub/Sub, channel "<channel>:sightings".  Classic
 * Pub/Sub is broadcast across a Redis Cluster, so one subscription to any
 * node hears every publish, and a PUBLISH sent to any node reaches every
 * subscriber.  The module keeps two connections of its own, to the seeds
 * in turn, rather than publishing through tier/redis_cluster.h: slot
 * routing buys nothing for a broadcast, the cluster client's retries are
 * tuned for block lookups that a caller waits on (a sighting is never
 * worth a retry), its faults would be counted as the remote tier's, and
 * sightings need no [tier.remote] at all.  A subscribed connection cannot
 * PUBLISH (RESP2), hence two.
 *
 * Best effort throughout: keys buffered beyond the bound are dropped, a
 * batch whose PUBLISH fails is lost, and what is published while the
 * subscriber reconnects is never heard; each is counted.  Nothing is
 * retried or replayed: a sighting is a hint to a cache policy.
 *
 * Backends: redis, or memory: an in-process bus keyed by channel name
 * that hands each published message, encoded and decoded as on the wire,
 * to every other instance on the channel synchronously, for unit tests
 * without a server.
 *
 * Threads: an instance runs a sender thread (publishes the buffer every
 * interval) and, with backend redis, a subscriber thread (delivers what
 * others publish).  Each instance has a random 64-bit host id carried in
 * its messages; its own messages are never delivered to it.
 *
 * Locking: every function is thread-safe.  The buffer has a mutex of its
 * own held only for a copy; sending holds another (the connection's), so
 * kvfs_sight_note() never waits on the network.  The deliver callback is
 * called with no lock of this module held but the memory bus's (memory).
 */
#ifndef KVFS_TIER_SIGHT_H
#define KVFS_TIER_SIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "meta/fmt.h"

enum kvfs_sight_backend {
	KVFS_SIGHT_NONE = 0, /* [fleet] sightings = off */
	KVFS_SIGHT_REDIS = 1,
	KVFS_SIGHT_MEMORY = 2, /* unit tests */
};

#define KVFS_SIGHT_NODES_MAX 192
#define KVFS_SIGHT_CHANNEL_MAX 64
#define KVFS_SIGHT_PASSWORD_MAX 128

/* [fleet] (docs/config.md); plain data. */
struct kvfs_sight_conf {
	int backend; /* enum kvfs_sight_backend */
	char nodes[KVFS_SIGHT_NODES_MAX]; /* seeds "host:port,..." (redis) */
	char password[KVFS_SIGHT_PASSWORD_MAX]; /* "" = no AUTH */
	char channel[KVFS_SIGHT_CHANNEL_MAX]; /* prefix; default "kvfs" */
	unsigned interval_ms; /* a publish per interval at most (1000) */
	unsigned timeout_ms; /* connect and round trip (200) */
	unsigned buffer; /* keys buffered at most (65536) */
};

/* The defaults above, backend none. */
void kvfs_sight_conf_defaults(struct kvfs_sight_conf *c);

/*
 * The wire format: one message is this header, then count keys of 16
 * bytes.  Every field little-endian whatever the host's order; crc is
 * the CRC-32C (meta/fmt.h) of the count * 16 key bytes.  A batch of more
 * than KVFS_SIGHT_MSG_KEYS keys is sent as several messages.
 */
#define KVFS_SIGHT_MAGIC 0x5447534bu /* "KSGT" as bytes */
#define KVFS_SIGHT_VERSION 1
#define KVFS_SIGHT_MSG_KEYS 4096

struct kvfs_sight_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t hdr_size; /* sizeof(struct kvfs_sight_hdr) */
	uint64_t host; /* the sender's host id */
	uint32_t count; /* keys that follow, 0..KVFS_SIGHT_MSG_KEYS */
	uint32_t crc; /* CRC-32C of the keys */
} __attribute__((packed));
_Static_assert(sizeof(struct kvfs_sight_hdr) == 24,
	       "sightings header is 24 bytes");

#define KVFS_SIGHT_MSG_MAX \
	(sizeof(struct kvfs_sight_hdr) + KVFS_SIGHT_MSG_KEYS * KVFS_KEY_LEN)
_Static_assert(KVFS_SIGHT_MSG_MAX == 24 + 65536,
	       "a full message is the header and 4096 keys");

/*
 * kvfs_sight_encode() - one message of @n keys from @host into @buf
 * (@len bytes). Pure.
 * Returns the message's length (> 0), -EINVAL (@n over
 * KVFS_SIGHT_MSG_KEYS) or -ENOSPC (@buf too small: nothing usable in it).
 */
int kvfs_sight_encode(uint64_t host, const uint8_t (*keys)[KVFS_KEY_LEN],
		      size_t n, void *buf, size_t len);

/*
 * kvfs_sight_decode() - check the message @buf of @len bytes: its length
 * exactly a header and count keys, the magic, version, header size, count
 * at most KVFS_SIGHT_MSG_KEYS and the CRC. Pure; @buf is only read.
 * Returns 0 with *@host, *@keys (pointing into @buf) and *@n set, or
 * -EINVAL (malformed) or -EBADMSG (the CRC does not match), with nothing
 * set but *@why: what was wrong, for a log line (@why may be NULL).
 */
int kvfs_sight_decode(const void *buf, size_t len, uint64_t *host,
		      const uint8_t (**keys)[KVFS_KEY_LEN], size_t *n,
		      const char **why);

/* A snapshot of the counters (.kvfs/stats fleet.sight.*). */
struct kvfs_sight_stats {
	uint64_t keys_out, msgs_out; /* published */
	uint64_t keys_in, msgs_in; /* delivered, from other hosts */
	uint64_t dropped; /* notes dropped: the buffer was full */
	uint64_t lost; /* keys of messages whose PUBLISH failed */
	uint64_t rejected; /* malformed messages received (never used) */
	uint64_t errors; /* faults: connect, AUTH, PUBLISH, SUBSCRIBE */
	uint64_t reconnects; /* subscriptions made after the first */
	uint64_t buffered; /* keys waiting for the next publish (gauge) */
};

/*
 * The deliver callback: @n keys (n >= 1) another host referenced, in the
 * order it sent them. Called from the subscriber thread (redis) or from
 * the publisher's thread inside its kvfs_sight_flush() (memory, with the
 * bus's lock held: the callback must not call kvfs_sight_new() or
 * kvfs_sight_free()). @keys is valid only during the call.
 */
typedef void (*kvfs_sight_deliver_fn)(void *arg,
				      const uint8_t (*keys)[KVFS_KEY_LEN],
				      size_t n);

struct kvfs_sight;

/*
 * kvfs_sight_new() - an instance of @c (backend redis or memory), with
 * its threads running; delivers what other hosts publish to @deliver with
 * @arg. A server that does not answer yet is not an error: the
 * subscriber reconnects by itself, with backoff, to each seed in turn.
 * Returns 0, -EINVAL (backend none, no or bad seeds, an empty channel, a
 * zero interval or buffer), -ENOMEM, or a thread's or getrandom()'s
 * -errno.
 */
int kvfs_sight_new(const struct kvfs_sight_conf *c,
		   kvfs_sight_deliver_fn deliver, void *arg,
		   struct kvfs_sight **out);

/*
 * kvfs_sight_free() - publish what is buffered (best effort, one try),
 * stop and join the threads, leave the bus, close and free. NULL is a
 * no-op. No other call on @s may run or follow.
 */
void kvfs_sight_free(struct kvfs_sight *s);

/*
 * kvfs_sight_note() - buffer one key this host referenced, for the next
 * publish. Takes the buffer's mutex for a copy; never waits on the
 * network, so it may be called under the caller's locks. A full buffer
 * drops the key (counted in `dropped`).
 */
void kvfs_sight_note(struct kvfs_sight *s, const uint8_t key[KVFS_KEY_LEN]);

/*
 * kvfs_sight_flush() - publish what is buffered now, in messages of at
 * most KVFS_SIGHT_MSG_KEYS keys, instead of at the next interval. With
 * backend memory every other instance on the channel has been delivered
 * to when it returns. Waits for one publish at most (redis: a connect
 * and a round trip per message, `timeout` each); must not be called from
 * the deliver callback. Returns 0, or the first fault (-ECONNREFUSED,
 * -ETIMEDOUT, -EACCES, -EIO; -EHOSTDOWN while the publisher backs off
 * after a fault): what was not sent is then lost (counted).
 */
int kvfs_sight_flush(struct kvfs_sight *s);

/*
 * kvfs_sight_inject() - publish the raw bytes @msg (@len) on @s's
 * channel as a message of its own (tests: a malformed message; the
 * receivers check it as any other). 0 or a fault as kvfs_sight_flush().
 */
int kvfs_sight_inject(struct kvfs_sight *s, const void *msg, size_t len);

/* This instance's host id. */
uint64_t kvfs_sight_host(const struct kvfs_sight *s);

/* A snapshot of the counters; each read on its own. */
void kvfs_sight_stats(struct kvfs_sight *s, struct kvfs_sight_stats *out);

#endif
