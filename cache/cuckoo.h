/* SPDX-License-Identifier: MIT */
/*
 * Hotness-aware cuckoo filter (HotPrefix, Li et al., SIGMOD 2025, §3.2).
 *
 * A table of n buckets (n a power of two) of 4 slots.  Each slot holds one
 * hotness record of a prefix-tree block in four bytes: an 8-bit fingerprint
 * of the block key, an 8-bit clock (recency credit, max_age on insert and
 * on reuse, decremented by an aging pass, saturating at 0), an 8-bit
 * cumulative frequency (saturating at 255) and an 8-bit depth (saturating
 * at 255).
 *
 * Bucket math is the standard cuckoo filter's (Fan et al. 2014), not the
 * paper's literal equations, which would make b2 = 0:
 *   h  = XXH3-64(key, seed)     b1 = h mod n     f = fingerprint from h
 *   b2 = b1 xor hash(f)         alt(b) = b xor hash(f)
 * so an entry can always be moved between its two buckets knowing only
 * its fingerprint and where it sits.
 *
 * Two keys with the same fingerprint and the same bucket pair share one
 * record: that is the filter's collision cost.  An insert of such a key
 * finds the record and returns 1 without changing it.
 *
 * When both buckets are full, insert kicks a random resident to its
 * alternate bucket, up to max_kicks times (randomness from a seeded
 * generator: runs are reproducible).  If the chain ends with an entry
 * still homeless, that entry goes to a small overflow list (an exact
 * "victim cache" of {fingerprint, bucket, record}), searched by every
 * lookup.  If the overflow list is full too, every kick is undone and the
 * insert fails with -ENOSPC: no resident record is ever lost.  A delete
 * moves overflow entries back into the freed bucket.
 *
 * KVFS_CUCKOO_EXACT replaces the filter by an exact hash table keyed by
 * the whole 16-byte key, with the same record fields and saturation, so a
 * caller can measure what the filter's collisions cost.  It grows on
 * demand; the bucket and overflow settings are ignored.
 *
 * Keys are 16 bytes (kvfs block keys: they already identify the whole
 * root-to-block token sequence).
 *
 * Locking: none.  A filter is not thread-safe; the caller serialises every
 * call on one filter (kvfs policies run under the policy lock).
 */
#ifndef KVFS_CACHE_CUCKOO_H
#define KVFS_CACHE_CUCKOO_H

#include <stdint.h>
#include <stddef.h>

#define KVFS_CUCKOO_SLOTS 4          /* slots per bucket */
#define KVFS_CUCKOO_MAX_KICKS 500    /* default kick bound */
#define KVFS_CUCKOO_OVERFLOW 64      /* default overflow entries */
#define KVFS_CUCKOO_MAX_BUCKETS (1u << 26)

enum kvfs_cuckoo_flags {
	KVFS_CUCKOO_EXACT = 1 << 0, /* exact table instead of the filter */
};

struct kvfs_cuckoo_conf {
	uint64_t buckets;   /* power of two, 1..KVFS_CUCKOO_MAX_BUCKETS */
	uint32_t overflow;  /* overflow entries; 0 = none */
	uint32_t max_kicks; /* 0 = KVFS_CUCKOO_MAX_KICKS */
	uint8_t max_age;    /* clock given on insert and reuse, >= 1 */
	uint64_t seed;      /* hash seed and kick randomness */
	unsigned flags;     /* enum kvfs_cuckoo_flags */
};

/* The hotness fields of one record. */
struct kvfs_cuckoo_rec {
	uint8_t clock;
	uint8_t freq;
	uint8_t depth;
};

struct kvfs_cuckoo_stats {
	uint64_t slots;        /* bucket slots (filter) or table size (exact) */
	uint64_t entries;      /* records held, overflow included */
	uint64_t overflow_used;
	uint64_t inserts;      /* new records created */
	uint64_t shared;       /* inserts that found an existing record */
	uint64_t kicks;        /* entries relocated by inserts */
	uint64_t overflowed;   /* inserts that needed the overflow list */
	uint64_t failed;       /* inserts refused with -ENOSPC */
	uint64_t deletes;
	uint64_t lookups;      /* lookups and touches */
	uint64_t misses;       /* of which found nothing */
	uint64_t agings;
};

struct kvfs_cuckoo;

/*
 * kvfs_cuckoo_init() - allocate and set up an empty filter.
 * @conf: geometry and behaviour; see struct kvfs_cuckoo_conf.
 * @out:  set to the new filter on success.
 * Returns 0, -EINVAL (buckets not a power of two or out of range,
 * max_age 0; logged) or -ENOMEM.
 */
int kvfs_cuckoo_init(const struct kvfs_cuckoo_conf *conf,
		     struct kvfs_cuckoo **out);
/* Release and free the filter; NULL is a no-op. */
void kvfs_cuckoo_free(struct kvfs_cuckoo *c);

/*
 * kvfs_cuckoo_insert() - create the record of @key.
 * @depth: the block's depth in the prefix tree (saturated to 255).
 * A new record starts with clock = max_age, freq = 1.
 * Returns 0 (created), 1 (a record with the same fingerprint in the same
 * bucket pair exists: it is left unchanged and now also stands for @key),
 * -ENOSPC (filter and overflow full; nothing changed) or -ENOMEM (exact
 * table could not grow).
 */
int kvfs_cuckoo_insert(struct kvfs_cuckoo *c, const uint8_t key[16],
		       uint32_t depth);

/* Copy the record of @key to @out. Returns 0 or -ENOENT. */
int kvfs_cuckoo_lookup(struct kvfs_cuckoo *c, const uint8_t key[16],
		       struct kvfs_cuckoo_rec *out);

/*
 * kvfs_cuckoo_touch() - reuse of @key: freq + 1 (saturating at 255),
 * clock = max_age.  Copies the updated record to @out when not NULL.
 * Returns 0 or -ENOENT.
 */
int kvfs_cuckoo_touch(struct kvfs_cuckoo *c, const uint8_t key[16],
		      struct kvfs_cuckoo_rec *out);

/*
 * kvfs_cuckoo_set() - overwrite the fields of @key's record (clock is
 * clamped to max_age).  For tools and tests that need a given state.
 * Returns 0 or -ENOENT.
 */
int kvfs_cuckoo_set(struct kvfs_cuckoo *c, const uint8_t key[16],
		    const struct kvfs_cuckoo_rec *rec);

/* Remove @key's record (one of them if shared). Returns 0 or -ENOENT. */
int kvfs_cuckoo_delete(struct kvfs_cuckoo *c, const uint8_t key[16]);

/* Aging pass: clock = max(clock - 1, 0) for every record. O(slots). */
void kvfs_cuckoo_age(struct kvfs_cuckoo *c);

/* The clock value records get on insert and reuse. */
uint8_t kvfs_cuckoo_max_age(const struct kvfs_cuckoo *c);

/* Counters since init. */
void kvfs_cuckoo_get_stats(const struct kvfs_cuckoo *c,
			   struct kvfs_cuckoo_stats *st);

/*
 * kvfs_cuckoo_buckets_of() - the two candidate buckets of @key in a
 * filter (equal to each other only if n == 1); for tests that need to
 * build colliding or crowded keys.  Returns 0, or -EINVAL for an exact
 * table.
 */
int kvfs_cuckoo_buckets_of(const struct kvfs_cuckoo *c, const uint8_t key[16],
			   uint64_t *b1, uint64_t *b2, uint8_t *fp);

#endif
