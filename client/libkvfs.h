/* SPDX-License-Identifier: MIT */
/*
 * libkvfs: the client library an inference engine links to use a mounted
 * kvfs through its control file MNT/.kvfs/ctl (meta/kvfs_ctl.h is the ABI).
 *
 * What it gives an engine:
 *  - key chains: the root key of a namespace and the block keys of a token
 *    sequence, exactly as the daemon and the block format compute them;
 *  - a client on a mount: LOOKUP, FETCH (blocks leased in the device pool,
 *    mapped read-only for the shm backend), FETCH_INTO (copies into memory
 *    the engine owns, with per-layer completion), SAVE, RELEASE, PIN,
 *    UNPIN, PREFETCH, EVICT and STATS;
 *  - helpers for shm callers: a peer region and a sync word, and a
 *    per-layer wait (the shape of vLLM's wait_for_layer_load).
 *
 * Transports: a request that fits struct kvfs_ctl_msg together with the
 * largest response it can get goes by ioctl; anything larger goes by
 * write-then-read on the same descriptor (one write, one read). The
 * caller never chooses (it may force one through kvfs_client_call(), for
 * tests).
 *
 * Every function returns 0 or -errno unless it says otherwise. An error
 * the daemon reports in a response (resp.error) is returned as is; a
 * transport failure returns the errno of the ioctl/write/read; a response
 * that breaks the ABI returns -EPROTO. Bad arguments return -EINVAL (or
 * -E2BIG for too much of something) with a log line (meta/log.h) and send
 * nothing.
 *
 * Locking: a struct kvfs_client may be shared by threads. Calls on it are
 * thread-safe; write-then-read transactions are serialized by the
 * client's mutex, ioctls run in parallel. A client must not be used in a
 * child after fork() (the response slot belongs to the descriptor): open
 * one per process. Peer and sync helpers are plain memory: the caller
 * synchronizes their use.
 *
 * Leases: blocks returned by FETCH stay leased to the client until
 * RELEASE, kvfs_client_close() or the process's exit (or until the daemon
 * reclaims a lease past its time limit). Pool pointers stay mapped until
 * kvfs_client_close(); their bytes are only stable while leased.
 */
#ifndef KVFS_CLIENT_LIBKVFS_H
#define KVFS_CLIENT_LIBKVFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "meta/kvfs_ctl.h"
#include "meta/fmt.h"

/* Bumped when a struct below changes layout (the Python module checks). */
#define KVFS_CLIENT_VERSION 1

struct kvfs_client;

/* Tiers in requests and in struct kvfs_ctl_block.tiers (bit 1 << tier). */
enum kvfs_client_tier {
	KVFS_CLIENT_TIER_GPU = 0,
	KVFS_CLIENT_TIER_DRAM = 1,
	KVFS_CLIENT_TIER_SSD = 2,
	KVFS_CLIENT_TIER_ALL = 3, /* EVICT only: delete from every tier */
};

enum kvfs_client_chain_flags {
	/* A trailing partial block (fewer than block_tokens) gets a key. */
	KVFS_CLIENT_CHAIN_PARTIAL = 1 << 0,
};

/* ------------------------------------------------------------ key chains */

/*
 * kvfs_client_root_key() - the root key of namespace @ns with @salt (NULL
 * or "" for none), the parent of every first block. Never fails.
 */
void kvfs_client_root_key(const char *ns, const char *salt,
			  uint8_t out[KVFS_KEY_LEN]);

/*
 * kvfs_client_root_key_model() - the root key of namespace @ns with @salt
 * and the namespace's model_digest @model (NULL or "" for none: then the
 * same as kvfs_client_root_key()). With model_digest = auto in kvfs.conf
 * the value is the daemon's to compute: read the root from the
 * namespace's user.kvfs.root (kvfs_client_ns_info()) instead. Never fails.
 */
void kvfs_client_root_key_model(const char *ns, const char *salt,
				const char *model, uint8_t out[KVFS_KEY_LEN]);

/*
 * kvfs_client_chain_len() - how many keys kvfs_client_chain() makes for
 * @n_tokens tokens: the full blocks, plus one for a trailing partial block
 * with KVFS_CLIENT_CHAIN_PARTIAL. 0 when @block_tokens is 0.
 */
size_t kvfs_client_chain_len(size_t n_tokens, uint32_t block_tokens,
			     unsigned flags);

/*
 * kvfs_client_chain() - the block keys of a token sequence.
 * @parent:       the key the chain continues from: the namespace root for
 *                tokens that start at position 0, else the key of the
 *                block just before @tokens[0].
 * @tokens:       @n_tokens token ids (may be NULL when @n_tokens is 0).
 * @block_tokens: tokens of a full block (the namespace's block_tokens).
 * @flags:        enum kvfs_client_chain_flags.
 * @keys:         receives the keys, first block first.
 * @max_keys:     room in @keys.
 * @n_keys:       receives the number of keys (also on -ENOSPC: the number
 *                needed).
 *
 * Block i covers tokens [i * block_tokens, (i + 1) * block_tokens); its
 * key is kvfs_fmt_block_key(key of block i - 1, its tokens).
 * Returns 0, -EINVAL (a NULL pointer, @block_tokens 0, unknown flags) or
 * -ENOSPC (@max_keys too small; nothing is written).
 */
int kvfs_client_chain(const uint8_t parent[KVFS_KEY_LEN],
		      const uint32_t *tokens, size_t n_tokens,
		      uint32_t block_tokens, unsigned flags,
		      uint8_t (*keys)[KVFS_KEY_LEN], size_t max_keys,
		      size_t *n_keys);

/* ---------------------------------------------------------------- client */

/*
 * kvfs_client_open() - a client on the kvfs mounted at @mnt: opens
 * @mnt/.kvfs/ctl read-write (close-on-exec).
 * Returns 0 and sets *@out, -EINVAL for a NULL argument, -ENOMEM, or the
 * errno of open(2) (-ENOENT: not a kvfs mount, or one without a control
 * file).
 */
int kvfs_client_open(const char *mnt, struct kvfs_client **out);

/*
 * kvfs_client_close() - close the control file (the daemon then drops
 * every lease this client holds), unmap the pool, free @c. NULL is a
 * no-op. The caller must not use @c, or pool pointers it returned, after.
 */
void kvfs_client_close(struct kvfs_client *c);

/* What a namespace directory's xattrs say. */
struct kvfs_client_ns {
	uint8_t root[KVFS_KEY_LEN];     /* user.kvfs.root */
	struct kvfs_geom geom;          /* user.kvfs.geometry */
};

/*
 * kvfs_client_ns_info() - the root key and geometry of namespace @ns, read
 * from the xattrs user.kvfs.root and user.kvfs.geometry of MNT/@ns on
 * first use and cached in @c (a namespace's root and geometry never
 * change while it exists).
 * Returns 0, -EINVAL (bad name, unparseable xattr), -ENOENT (no such
 * namespace, or a client opened without a mount point), or the errno of
 * getxattr(2).
 */
int kvfs_client_ns_info(struct kvfs_client *c, const char *ns,
			struct kvfs_client_ns *out);

/* ------------------------------------------------------------ operations */

/*
 * Blocks a call returned. Filled by lookup, fetch, fetch_into and
 * kvfs_client_call(); free the arrays with kvfs_client_blocks_release().
 */
struct kvfs_client_blocks {
	struct kvfs_ctl_resp resp;      /* the response header: n_cached,
					 * n_blocks, pool (FETCH), key (SAVE) */
	struct kvfs_ctl_block *blocks;  /* resp.n_blocks entries, or NULL */
	/* FETCH on the shm backend: per block, a read-only pointer to its
	 * payload in the pool (resp.n_blocks entries); NULL otherwise.
	 */
	const uint8_t **data;
};

/* Free the arrays of @b and zero it. Drops no lease. NULL is a no-op. */
void kvfs_client_blocks_release(struct kvfs_client_blocks *b);

/*
 * kvfs_client_lookup() - how many leading blocks of a prefix are cached,
 * and where each is.
 * @c, @ns:    client and namespace.
 * @keys:      @n_keys (>= 1) block keys in chain order.
 * @flags:     0, or KVFS_CTL_F_ACCESS to count the matched prefix as an
 *             access (a plain lookup changes nothing, renews no lease);
 *             KVFS_CTL_F_REMOTE to bring in first the blocks the remote
 *             tier has (docs/remote.md; a plain lookup stays local).
 * @out:       receives resp.n_cached and the blocks (key and tiers).
 * Returns 0 (also when nothing is cached: n_cached 0), the daemon's error
 * (-ENOENT for an unknown namespace), or a transport error. On error *@out
 * holds no arrays.
 */
int kvfs_client_lookup(struct kvfs_client *c, const char *ns,
		       const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		       unsigned flags, struct kvfs_client_blocks *out);

/*
 * kvfs_client_lookup_tokens() - kvfs_client_lookup() by token ids: the
 * daemon chains the keys of the full blocks from the namespace root.
 * @tokens: @n_tokens (>= 1) token ids from position 0.
 */
int kvfs_client_lookup_tokens(struct kvfs_client *c, const char *ns,
			      const uint32_t *tokens, size_t n_tokens,
			      unsigned flags, struct kvfs_client_blocks *out);

/*
 * kvfs_client_fetch() - make a prefix resident in the device pool, leased
 * to @c, in one batch.
 * @keys, @n_keys: the prefix's keys in chain order (>= 1); one block
 *                 comes back per key.
 * @out:           receives the blocks (pool_off, len, layer_bytes) and
 *                 resp.pool; for the shm backend also out->data, pointers
 *                 into the pool mapped read-only in this process.
 * Returns 0, the daemon's error (-ENOENT unknown namespace or key, -ENOSPC
 * the pool cannot hold the prefix, -ENODEV no device tier configured, ...),
 * a transport error, -EPROTO for a block outside the pool, or the errno of
 * mapping the pool. When the daemon succeeded but this side then fails
 * (-EPROTO, mapping), the leases it took stay until RELEASE or close.
 */
int kvfs_client_fetch(struct kvfs_client *c, const char *ns,
		      const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		      struct kvfs_client_blocks *out);

/* kvfs_client_fetch() by token ids (full blocks, chained by the daemon). */
int kvfs_client_fetch_tokens(struct kvfs_client *c, const char *ns,
			     const uint32_t *tokens, size_t n_tokens,
			     struct kvfs_client_blocks *out);

struct kvfs_client_sync;

/*
 * kvfs_client_fetch_into() - copy blocks' payloads into memory the caller
 * owns (its paged KV cache). Returns when every layer is copied; as it
 * goes, the daemon stores the number of finished layers in @sync, so an
 * engine calls this from a loader thread (or uses
 * kvfs_client_fetch_into_start()) and waits for layer l with
 * kvfs_client_wait_layer() from its compute thread.
 * @keys, @n_keys: the blocks (>= 1).
 * @peer:          the caller's memory (a struct kvfs_client_peer's mem for
 *                 shm, or an IPC handle for cuda).
 * @dst_off:       @n_keys offsets in @peer: layer l of block i lands at
 *                 dst_off[i] + l * layer_bytes. The blocks' ranges must
 *                 not overlap, and the caller's device work on them must
 *                 be synchronised before the call.
 * @sync:          the completion word; reset to 0 here before the request
 *                 goes out (reset it yourself with kvfs_client_sync_reset()
 *                 before a waiter thread can look at it).
 * @out:           NULL, or receives the blocks (len, layer_bytes).
 * Returns 0, the daemon's error (-EINVAL an offset out of range,
 * overlapping destinations or a foreign handle, -ENOENT unknown key,
 * -ENODEV no device tier), or a transport error.
 */
int kvfs_client_fetch_into(struct kvfs_client *c, const char *ns,
			   const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
			   const struct kvfs_ctl_mem *peer,
			   const uint64_t *dst_off,
			   struct kvfs_client_sync *sync,
			   struct kvfs_client_blocks *out);

/* A FETCH_INTO running on a thread of its own. */
struct kvfs_client_job;

/*
 * kvfs_client_fetch_into_start() - kvfs_client_fetch_into() on a new
 * thread: resets @sync, copies @keys and @dst_off (the caller may free
 * them at once) and returns; wait for layers with
 * kvfs_client_wait_layer(), then collect the result with
 * kvfs_client_job_join(). @c, @peer and @sync must live until the join.
 * Returns 0 and sets *@job, -EINVAL (checked as the request would be),
 * -ENOMEM, or the error of pthread_create.
 */
int kvfs_client_fetch_into_start(struct kvfs_client *c, const char *ns,
				 const uint8_t (*keys)[KVFS_KEY_LEN],
				 size_t n_keys,
				 const struct kvfs_ctl_mem *peer,
				 const uint64_t *dst_off,
				 struct kvfs_client_sync *sync,
				 struct kvfs_client_job **job);

/*
 * kvfs_client_job_join() - wait for @job's thread, return what its
 * kvfs_client_fetch_into() returned, put its blocks in @out (may be
 * NULL) and free @job.
 */
int kvfs_client_job_join(struct kvfs_client_job *job,
			 struct kvfs_client_blocks *out);

/*
 * kvfs_client_save() - create one block from KV in the caller's memory;
 * it is validated and persisted like a written file.
 * @parent:        the parent key (the namespace root for a first block).
 * @start_pos:     position of @tokens[0] (0 for a first block, else a
 *                 multiple of block_tokens).
 * @tokens:        the block's @n_tokens token ids (1..block_tokens).
 * @peer, @src_off: the payload, in block layout, at @src_off in @peer.
 * @key:           NULL, or receives the new block's key (checked against
 *                 the key computed here; a mismatch is -EPROTO).
 * Returns 0, the daemon's error (-EEXIST, -EINVAL a bad payload, -ENOSPC,
 * -ENOENT unknown namespace or parent), or a transport error.
 */
int kvfs_client_save(struct kvfs_client *c, const char *ns,
		     const uint8_t parent[KVFS_KEY_LEN], uint64_t start_pos,
		     const uint32_t *tokens, size_t n_tokens,
		     const struct kvfs_ctl_mem *peer, uint64_t src_off,
		     uint8_t key[KVFS_KEY_LEN]);

/*
 * kvfs_client_release() - drop this client's leases on @n_keys blocks of
 * @ns, or every lease it holds when @n_keys is 0 (@ns may then be NULL).
 */
int kvfs_client_release(struct kvfs_client *c, const char *ns,
			const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys);

/*
 * kvfs_client_pin(), kvfs_client_unpin() - pin @n_keys (>= 1) blocks in
 * @tier (GPU, DRAM or SSD), or remove those pins.
 * kvfs_client_prefetch() - an asynchronous hint to bring blocks up to
 * @tier; returns once queued.
 * kvfs_client_evict() - drop blocks from @tier; KVFS_CLIENT_TIER_ALL
 * deletes them (-EBUSY for a leased or pinned block).
 */
int kvfs_client_pin(struct kvfs_client *c, const char *ns,
		    const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		    enum kvfs_client_tier tier);
int kvfs_client_unpin(struct kvfs_client *c, const char *ns,
		      const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		      enum kvfs_client_tier tier);
int kvfs_client_prefetch(struct kvfs_client *c, const char *ns,
			 const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
			 enum kvfs_client_tier tier);
int kvfs_client_evict(struct kvfs_client *c, const char *ns,
		      const uint8_t (*keys)[KVFS_KEY_LEN], size_t n_keys,
		      enum kvfs_client_tier tier);

/*
 * kvfs_client_stats() - the daemon's counters (leases, pool, fetches).
 * @ns: a namespace the request names, or NULL (the counters are global).
 */
int kvfs_client_stats(struct kvfs_client *c, const char *ns,
		      struct kvfs_ctl_stats *out);

/* ------------------------------------------------- shm peer and sync word */

/*
 * Each object below is write-locked (an OFD lock on the descriptor the
 * struct keeps) by the process that made it, until its release.  Making
 * one first calls kvfs_client_shm_sweep() for its kind, so the objects a
 * killed engine left in /dev/shm are freed by the next engine that makes
 * one.
 */

/*
 * kvfs_client_shm_sweep() - remove the shm objects "/kvfs-@what-<pid>-<n>"
 * (@what "peer" or "sync") whose process is gone: kill(pid, 0) says
 * ESRCH and the object's lock can be taken.  Another user's objects
 * cannot be opened and stay.  Returns the number removed (each logged at
 * info), -EINVAL for a @what too long, or -errno when /dev/shm cannot be
 * read.  No lock of libkvfs's; safe from any thread.
 */
int kvfs_client_shm_sweep(const char *what);

/* A POSIX shm region of the caller's, for FETCH_INTO and SAVE. */
struct kvfs_client_peer {
	struct kvfs_ctl_mem mem;        /* what requests carry */
	uint8_t *base;                  /* mem.size bytes, read-write */
	int fd;
};

/*
 * kvfs_client_peer_init() - create a fresh shm object of @size bytes
 * (zeroed, mode 0600: the daemon must run as the same user) under a
 * unique name and map it read-write.
 * Returns 0, -EINVAL (@size 0), or the errno of shm_open/ftruncate/mmap.
 */
int kvfs_client_peer_init(struct kvfs_client_peer *p, uint64_t size);
/* Unmap and unlink the object. Safe on a zeroed or released @p. */
void kvfs_client_peer_release(struct kvfs_client_peer *p);

/* FETCH_INTO's completion word, in a shm object of its own. */
struct kvfs_client_sync {
	struct kvfs_ctl_sync desc;      /* what requests carry */
	uint32_t *word;                 /* the mapped word */
	int fd;
};

/*
 * kvfs_client_sync_init() - a one-page shm object (mode 0600) holding the
 * word at offset 0, mapped read-write, the word 0.
 * Returns 0 or the errno of shm_open/ftruncate/mmap.
 */
int kvfs_client_sync_init(struct kvfs_client_sync *s);
/* Unmap and unlink. Safe on a zeroed or released @s. */
void kvfs_client_sync_release(struct kvfs_client_sync *s);
/* The word now: layers complete, or KVFS_CTL_SYNC_FAILED | layer. */
uint32_t kvfs_client_sync_load(const struct kvfs_client_sync *s);
/* Store 0 (nothing copied yet). */
void kvfs_client_sync_reset(struct kvfs_client_sync *s);

/*
 * kvfs_client_wait_layer() - wait until layer @layer (0-based) of the
 * FETCH_INTO in flight on @s is complete, sleeping on the word with a
 * shared futex (the daemon wakes it after each layer).
 * @timeout_ns: how long to wait at most; negative waits forever.
 * Returns 0 when the word is > @layer (or the copy failed at a later
 * layer), -EIO when it failed at @layer or before, -ETIMEDOUT, -EINVAL for
 * an unset @s.
 */
int kvfs_client_wait_layer(const struct kvfs_client_sync *s, uint32_t layer,
			   int64_t timeout_ns);

/* ------------------------------------------------------------- low level */

enum kvfs_client_xport {
	KVFS_CLIENT_XPORT_AUTO = 0,     /* by size (what the calls above do) */
	KVFS_CLIENT_XPORT_IOCTL = 1,
	KVFS_CLIENT_XPORT_RW = 2,       /* write-then-read */
};

/* One request, before encoding. Unused fields are 0/NULL. */
struct kvfs_client_req {
	uint32_t op;                    /* enum kvfs_ctl_op */
	uint32_t flags;                 /* enum kvfs_ctl_flags */
	const char *ns;                 /* NULL or "" for STATS, RELEASE */
	uint32_t tier;                  /* enum kvfs_client_tier */
	uint32_t xport;                 /* enum kvfs_client_xport */
	const uint8_t (*keys)[KVFS_KEY_LEN];
	size_t n_keys;
	const uint32_t *tokens;
	size_t n_tokens;
	const uint64_t *dst_off;        /* FETCH_INTO: n_keys offsets */
	const struct kvfs_ctl_mem *peer;  /* FETCH_INTO, SAVE */
	const struct kvfs_ctl_sync *sync; /* FETCH_INTO */
	uint64_t src_off;               /* SAVE */
	uint64_t start_pos;             /* SAVE */
	const uint8_t *parent;          /* SAVE: 16 bytes */
	/* Blocks the response can hold at most; 0: the library's bound for
	 * the op (see kvfs_client_resp_bound()).
	 */
	uint32_t max_blocks;
};

/*
 * kvfs_client_req_check() - whether @r is a request the daemon could
 * accept: known op; namespace given (except STATS, RELEASE) and shorter
 * than KVFS_CTL_NS_MAX; flags the op takes (ACCESS: LOOKUP; TOKENS: not
 * SAVE, FETCH_INTO or STATS); keys, or tokens with F_TOKENS, as the op
 * wants; offsets, a peer and a sync word for FETCH_INTO; a peer, parent
 * and 1+ tokens for SAVE; a tier in range for
 * PIN/UNPIN/PREFETCH (0..2) and EVICT (0..3); at most
 * KVFS_CTL_MAX_BLOCKS keys, and KVFS_CTL_MAX_SIZE bytes encoded.
 * Returns 0, -EINVAL or -E2BIG, with a log line saying why.
 */
int kvfs_client_req_check(const struct kvfs_client_req *r);

/* Bytes of @r encoded (header and arrays); 0 on overflow. */
size_t kvfs_client_req_size(const struct kvfs_client_req *r);

/*
 * kvfs_client_req_encode() - check @r, then write it as the ABI's bytes
 * (struct kvfs_ctl_req, keys, tokens, dst) into @buf of @cap bytes,
 * zeroing every reserved byte. *@size receives the length.
 * Returns 0, -EINVAL/-E2BIG as kvfs_client_req_check(), or -ENOSPC when
 * @cap is too small.
 */
int kvfs_client_req_encode(const struct kvfs_client_req *r, void *buf,
			   size_t cap, size_t *size);

/*
 * kvfs_client_resp_bound() - the most blocks a response to @r can carry:
 * max_blocks if set; else n_keys (n_tokens / @block_tokens with
 * F_TOKENS, or n_tokens itself when @block_tokens is 0 = unknown); 0 for
 * STATS, 1 for SAVE.
 */
uint32_t kvfs_client_resp_bound(const struct kvfs_client_req *r,
				uint32_t block_tokens);

/*
 * kvfs_client_xport_pick() - the transport for an encoded request of
 * @req_size bytes whose response holds at most @max_blocks blocks: IOCTL
 * when both fit in KVFS_CTL_MSG_SIZE, else RW.
 */
enum kvfs_client_xport kvfs_client_xport_pick(size_t req_size,
					      uint32_t max_blocks);

/*
 * A transport, for tests and in-process proxies: send @req_len bytes of
 * @req by @how, put the response in @resp (up to @cap bytes) and return
 * its length, or -errno. The default one uses the ctl descriptor.
 */
struct kvfs_client_xport_ops {
	ssize_t (*call)(void *arg, enum kvfs_client_xport how,
			const void *req, size_t req_len, void *resp,
			size_t cap);
};

/*
 * kvfs_client_open_xport() - a client whose requests go to @ops->call
 * (with @arg) instead of a control file. @mnt may be NULL (then
 * kvfs_client_ns_info() is -ENOENT and token requests assume nothing of
 * block_tokens). Returns 0, -EINVAL or -ENOMEM.
 */
int kvfs_client_open_xport(const char *mnt,
			   const struct kvfs_client_xport_ops *ops, void *arg,
			   struct kvfs_client **out);

/*
 * kvfs_client_call() - check, encode and send @r by its transport (xport
 * AUTO picks by size), then check the response against the ABI (magic,
 * version, op, size, block count within the bound) and fill @out. For
 * FETCH on shm also maps the pool and sets out->data.
 * Returns 0, resp.error, a transport error, -EPROTO, -EINVAL/-E2BIG for a
 * bad request, or -E2BIG for IOCTL forced on a request that does not fit.
 */
int kvfs_client_call(struct kvfs_client *c, const struct kvfs_client_req *r,
		     struct kvfs_client_blocks *out);

/* The transport kvfs_client_call() used last on @c (tests, benchmarks). */
enum kvfs_client_xport kvfs_client_last_xport(const struct kvfs_client *c);

/* Sizes of this library's structs, for bindings that mirror them. */
enum kvfs_client_struct {
	KVFS_CLIENT_S_BLOCKS = 1,
	KVFS_CLIENT_S_PEER = 2,
	KVFS_CLIENT_S_SYNC = 3,
	KVFS_CLIENT_S_NS = 4,
	KVFS_CLIENT_S_REQ = 5,
};
/* sizeof the struct @which names, 0 for an unknown one. */
size_t kvfs_client_sizeof(int which);

#endif
