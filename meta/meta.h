/* SPDX-License-Identifier: MIT */
/*
 * kvfs metadata store over LMDB.
 *
 * Named databases of one environment (STORE/meta/):
 *   "sb"    "sb" -> struct kvfs_meta_sb          the superblock
 *   "ns"    name -> struct kvfs_meta_ns          namespaces
 *   "blk"   key[16] -> struct kvfs_meta_blk      one record per block
 *   "free"  offset (u64 big-endian) -> length (u64 LE)   SSD free extents
 *   "score" key[16] ‖ u32 BE chunk -> struct kvfs_meta_score  chunk scores
 *   "ccrc"  key[16] -> struct kvfs_meta_ccrc + u32 CRC[count]  per-chunk
 *           CRC-32C of a block (cache/chunk.h); created on open when a
 *           store made before it lacks the database
 *
 * Every value starts with a magic and a version and has a fixed size, so a
 * record written by another format version is detected, never misread.
 *
 * LMDB return codes become -errno in exactly one place (meta.c).
 *
 * Locking: LMDB serialises write transactions itself and read transactions
 * never block.  A struct kvfs_meta may be used from any number of threads;
 * a struct kvfs_meta_txn belongs to the thread that began it.
 */
#ifndef KVFS_META_META_H
#define KVFS_META_META_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

#include "meta/fmt.h"

#define KVFS_META_SB_MAGIC 0x4b564653u /* "KVFS" */
#define KVFS_META_NS_MAGIC 0x4b564e53u /* "KVNS" */
#define KVFS_META_BLK_MAGIC 0x4b56424bu /* "KVBK" */
#define KVFS_META_CCRC_MAGIC 0x4b564343u /* "KVCC" */
#define KVFS_META_SCORE_MAGIC 0x4b565343u /* "KVSC" */
#define KVFS_META_VERSION 1
#define KVFS_NS_NAME_MAX 64
#define KVFS_NS_SALT_MAX 64

struct kvfs_meta_sb {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint8_t uuid[16];
	uint64_t ssd_size;  /* bytes of the data file, header included */
	uint64_t data_off;  /* first byte usable for extents (4096) */
	uint64_t created;   /* unix seconds */
	uint64_t next_ino;  /* next block inode number to hand out */
	uint32_t next_ns_id;
	uint32_t reserved0;
	uint8_t reserved[64];
};
_Static_assert(sizeof(struct kvfs_meta_sb) == 128, "superblock size");

struct kvfs_meta_ns {
	uint32_t magic;
	uint16_t version;
	uint16_t dtype;
	uint32_t id;
	uint32_t n_layers;
	uint32_t n_kv_heads;
	uint32_t head_dim;
	uint32_t hidden_size;
	uint32_t block_tokens;
	uint32_t chunk_tokens;
	uint32_t store_as; /* 0 = kv, 1 = hidden, 2 = auto (docs/hcache.md) */
	uint8_t root[KVFS_KEY_LEN];
	char name[KVFS_NS_NAME_MAX];
	char salt[KVFS_NS_SALT_MAX];
	/* Unix ns of the record's creation; 0 in records written before
	 * this field (they read as the store's creation time).
	 */
	uint64_t created;
	uint8_t reserved[64];
};
_Static_assert(sizeof(struct kvfs_meta_ns) == 256, "namespace record size");

/* Tier bits, shared by records, the cache and xattrs. */
enum kvfs_tier_bit {
	KVFS_TIER_BIT_GPU = 1 << 0,
	KVFS_TIER_BIT_DRAM = 1 << 1,
	KVFS_TIER_BIT_SSD = 1 << 2,
};

struct kvfs_meta_blk {
	uint32_t magic;
	uint16_t version;
	uint16_t kind;     /* enum kvfs_fmt_kind of the stored form */
	uint32_t ns_id;
	uint32_t depth;    /* start_pos / block_tokens */
	uint64_t ino;
	uint8_t parent[KVFS_KEY_LEN];
	uint32_t n_tokens;
	uint32_t hdr_crc;  /* the block header's own CRC: ties extent to record */
	uint64_t size;     /* the stored image (HIDDEN, MIXED: not the KV file) */
	uint64_t ssd_off;  /* extent in the data file; 0 = none */
	uint64_t ssd_len;  /* multiple of 4096 */
	uint64_t start_pos;
	uint32_t pins;     /* enum kvfs_tier_bit */
	uint32_t category; /* workload category (policy issue) */
	uint64_t hits;
	uint64_t last_access; /* unix nanoseconds */
	uint32_t tiers;    /* enum kvfs_tier_bit, as last recorded */
	uint32_t reserved0;
	uint64_t created;  /* unix nanoseconds of the commit (mtime) */
	uint32_t kv_from;  /* kind MIXED: first layer stored as K and V; else 0 */
	uint8_t reserved[36];
};
_Static_assert(sizeof(struct kvfs_meta_blk) == 160, "block record size");

/*
 * Head of a "ccrc" value; @count CRC-32C values (u32, host order) follow.
 * @tcrc is the CRC-32C of those values: LMDB keeps no checksums, and a
 * wrong table would make good chunks look torn.
 */
struct kvfs_meta_ccrc {
	uint32_t magic;
	uint16_t version;
	uint16_t zero;
	uint32_t count;
	uint32_t tcrc;
};
_Static_assert(sizeof(struct kvfs_meta_ccrc) == 16, "ccrc head size");

/* A chunk's attention-guided cache score (paper 004 §4.4): I is the
 * cumulative attention engines reported, F the loads they asked for.
 */
struct kvfs_meta_score {
	uint32_t magic;
	uint16_t version;
	uint16_t zero;
	uint32_t reserved0;
	uint32_t reserved1;
	double i;          /* finite, >= 0 */
	uint64_t f;
};
_Static_assert(sizeof(struct kvfs_meta_score) == 32, "score record size");

struct kvfs_meta;
struct kvfs_meta_txn;

enum kvfs_meta_flags {
	/* Create the environment (mkfs). */
	KVFS_META_CREATE = 1 << 0,
	/* Keep the environment in anonymous memory-backed storage: it vanishes
	 * on close.  For unit tests; @path is ignored.
	 */
	KVFS_META_MEMORY = 1 << 1,
	/* Do not fsync on commit (tests, benchmarks); never for a real mount. */
	KVFS_META_NOSYNC = 1 << 2,
};

/*
 * kvfs_meta_open() - open (or create) the metadata environment.
 * @dir:     the LMDB directory (STORE/meta), created with KVFS_META_CREATE.
 * @mapsize: LMDB map size in bytes; 0 for the default (1 GiB).
 * @flags:   enum kvfs_meta_flags.
 * @out:     receives the handle.
 *
 * Returns 0, -ENOENT (no environment and no CREATE), -EEXIST (CREATE on a
 * directory that already holds one), or another -errno. Logs the reason.
 */
int kvfs_meta_open(const char *dir, uint64_t mapsize, unsigned flags,
		   struct kvfs_meta **out);
/* Close and free; NULL is a no-op. No transaction may be open. */
void kvfs_meta_free(struct kvfs_meta *m);

/*
 * kvfs_meta_txn_begin() - start a transaction.
 * @rdonly: true for a read-only transaction.
 * Returns 0 or -errno (-ENOSPC when the map is full).
 */
int kvfs_meta_txn_begin(struct kvfs_meta *m, bool rdonly,
			struct kvfs_meta_txn **out);
/* Commit (durably unless NOSYNC) and free @t. Returns 0 or -errno; on
 * error the transaction is aborted and freed.
 */
int kvfs_meta_txn_commit(struct kvfs_meta_txn *t);
/* Abort and free @t; NULL is a no-op. */
void kvfs_meta_txn_abort(struct kvfs_meta_txn *t);

/* Superblock. get: 0, -ENOENT, -EUCLEAN (bad magic/size), -EPROTO (other
 * version). put: 0 or -errno.
 */
int kvfs_meta_sb_get(struct kvfs_meta_txn *t, struct kvfs_meta_sb *sb);
int kvfs_meta_sb_put(struct kvfs_meta_txn *t, const struct kvfs_meta_sb *sb);

/* Namespaces by name. get: 0, -ENOENT, -EUCLEAN, -EPROTO. */
int kvfs_meta_ns_get(struct kvfs_meta_txn *t, const char *name,
		     struct kvfs_meta_ns *ns);
int kvfs_meta_ns_put(struct kvfs_meta_txn *t, const struct kvfs_meta_ns *ns);
/* Call @fn for each namespace in name order; a nonzero return stops the
 * walk and is returned.
 */
int kvfs_meta_ns_foreach(struct kvfs_meta_txn *t,
			 int (*fn)(const struct kvfs_meta_ns *ns, void *arg),
			 void *arg);

/* Block records by key. get: 0, -ENOENT, -EUCLEAN, -EPROTO.
 * del: 0 or -ENOENT.
 */
int kvfs_meta_blk_get(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		      struct kvfs_meta_blk *rec);
int kvfs_meta_blk_put(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		      const struct kvfs_meta_blk *rec);
int kvfs_meta_blk_del(struct kvfs_meta_txn *t,
		      const uint8_t key[KVFS_KEY_LEN]);
/* Call @fn for each block record in key order. A record that fails its
 * magic/version check is passed with @bad = true (the caller logs and skips
 * or deletes it). A nonzero return from @fn stops the walk and is returned.
 */
int kvfs_meta_blk_foreach(struct kvfs_meta_txn *t,
			  int (*fn)(const uint8_t *key,
				    const struct kvfs_meta_blk *rec, bool bad,
				    void *arg),
			  void *arg);

/*
 * SSD free-extent map. Entries never overlap and adjacent entries are
 * always merged, so the map is canonical.
 *
 * kvfs_meta_free_give() - mark [off, off+len) free, merging with neighbours.
 *   Returns 0, -EUCLEAN if any part of the range is already free (logged),
 *   or another -errno.
 * kvfs_meta_free_take() - mark [off, off+len) used; the range must lie inside
 *   one free entry, which is split. Returns 0, -EUCLEAN if it does not
 *   (logged), or another -errno.
 *
 * Both are order-independent: the cache reserves extents in memory, writes
 * the data, and takes the range in the same transaction that commits the
 * block record that points to it.
 */
int kvfs_meta_free_give(struct kvfs_meta_txn *t, uint64_t off, uint64_t len);
int kvfs_meta_free_take(struct kvfs_meta_txn *t, uint64_t off, uint64_t len);
/* Call @fn for each free extent in offset order; nonzero stops the walk. */
int kvfs_meta_free_foreach(struct kvfs_meta_txn *t,
			   int (*fn)(uint64_t off, uint64_t len, void *arg),
			   void *arg);
/* Remove every free-extent entry (before rebuilding the map). */
int kvfs_meta_free_clear(struct kvfs_meta_txn *t);

/*
 * Per-chunk CRC tables, one per block key (cache/chunk.h).
 * kvfs_meta_ccrc_put() - store @n (>= 1) CRCs for @key, replacing any.
 *   0, -EINVAL (@n 0 or too large, logged), -EBADF (read-only txn), or
 *   another -errno.
 * kvfs_meta_ccrc_get() - read exactly @n CRCs into @crc. 0, -ENOENT,
 *   -EUCLEAN (bad magic, size or table CRC, or a stored count other than
 *   @n; logged), -EPROTO (another format version; logged).
 * kvfs_meta_ccrc_del() - remove @key's table; 0 when there is none too.
 */
int kvfs_meta_ccrc_put(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		       const uint32_t *crc, size_t n);
int kvfs_meta_ccrc_get(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		       uint32_t *crc, size_t n);
int kvfs_meta_ccrc_del(struct kvfs_meta_txn *t,
		       const uint8_t key[KVFS_KEY_LEN]);
/*
 * kvfs_meta_ccrc_foreach() - call @fn with the key of each chunk CRC
 *   table, in key order, whether or not its block record exists (fsck
 *   looks for tables left without one).  The value is not read: a damaged
 *   table is passed like a good one.  An entry whose key is not
 *   KVFS_KEY_LEN bytes is logged and skipped.  @fn may delete the current
 *   key's table in a write transaction.
 *   Returns 0, the nonzero value of @fn that stopped the walk, or -errno.
 */
int kvfs_meta_ccrc_foreach(struct kvfs_meta_txn *t,
			   int (*fn)(const uint8_t *key, void *arg), void *arg);

/*
 * Chunk scores, keyed by block key and chunk index (the chunk as a
 * big-endian u32, so one block's chunks are adjacent and in order).
 * kvfs_meta_score_put() - 0, -EINVAL (@i negative or not finite, logged),
 *   -EBADF (read-only txn), or another -errno.
 * kvfs_meta_score_get() - 0, -ENOENT, -EUCLEAN (bad magic or size, or a
 *   stored I that is negative or not finite; logged), -EPROTO (logged).
 * kvfs_meta_score_del_block() - remove every chunk's score of @key (a
 *   cursor walk over the key's range); 0 when there are none too.
 */
int kvfs_meta_score_put(struct kvfs_meta_txn *t,
			const uint8_t key[KVFS_KEY_LEN], uint32_t chunk,
			double i, uint64_t f);
int kvfs_meta_score_get(struct kvfs_meta_txn *t,
			const uint8_t key[KVFS_KEY_LEN], uint32_t chunk,
			double *i, uint64_t *f);
int kvfs_meta_score_del_block(struct kvfs_meta_txn *t,
			      const uint8_t key[KVFS_KEY_LEN]);
/*
 * kvfs_meta_score_foreach() - call @fn once per block key that has score
 *   entries, in key order, with @n the number of entries whose key starts
 *   with it (one per chunk; an entry of another key length under the same
 *   block key is counted too, as kvfs_meta_score_del_block() removes it).
 *   Values are not read.  An entry whose key is shorter than KVFS_KEY_LEN
 *   is logged and skipped.  @fn may delete @key's scores in a write
 *   transaction.
 *   Returns 0, the nonzero value of @fn that stopped the walk, or -errno.
 */
int kvfs_meta_score_foreach(struct kvfs_meta_txn *t,
			    int (*fn)(const uint8_t *key, uint32_t n,
				      void *arg),
			    void *arg);

/* Map an LMDB return code to -errno (exported for tests). */
int kvfs_meta_errno(int mdb_rc);

#endif
