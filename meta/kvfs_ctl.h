/* SPDX-License-Identifier: MIT */
/*
 * The .kvfs/ctl ABI, version 1: requests an engine sends to a mounted
 * kvfs, and the daemon's responses.  Shared by the daemon, libkvfs and
 * any other client; it depends on nothing but <stdint.h>.
 *
 * Two transports carry the same bytes:
 *
 *  - ioctl(fd, KVFS_IOC_<OP>, &msg) with a struct kvfs_ctl_msg of exactly
 *    KVFS_CTL_MSG_SIZE bytes: the request goes in, the response comes back
 *    in the same buffer. FUSE restricts an ioctl to the size its number
 *    encodes (under 16 KiB), so this carries at most KVFS_CTL_IOC_KEYS keys
 *    or KVFS_CTL_IOC_TOKENS tokens.
 *  - write(fd, req, req->size) then read(fd, buf, len) on the same open
 *    descriptor: any size up to KVFS_CTL_MAX_SIZE. The response is held
 *    for the next read; a read with no response pending returns 0 bytes,
 *    and a new write replaces an unread response.
 *
 * A request is a struct kvfs_ctl_req followed by its arrays, in this order:
 *   keys[n_keys][16], tokens[n_tokens] (u32), dst[n_dst] (struct
 *   kvfs_ctl_dst), chunks[n_chunks] (u32), scores[n_scores] (float).
 * A response is a struct kvfs_ctl_resp followed by blocks[n_blocks]
 * (struct kvfs_ctl_block).
 *
 * Every integer is in host byte order (client and daemon share a host).
 * Every struct has a fixed size checked below; reserved fields must be 0.
 *
 * Errors: a malformed request (bad magic, ABI, size, op, counts, reserved
 * bytes) fails the ioctl/write itself with EINVAL. A well-formed request
 * that cannot be done gets a response with resp.error = -errno (ENOENT for
 * an unknown namespace or key, ENOSPC, EBUSY, ...) and the transport
 * succeeds; the daemon logs why.
 */
#ifndef KVFS_CTL_H
#define KVFS_CTL_H

#include <stdint.h>

#define KVFS_CTL_MAGIC 0x5443564bu /* "KVCT" little-endian */
#define KVFS_CTL_ABI 1
#define KVFS_CTL_NS_MAX 64
#define KVFS_CTL_NAME_MAX 64
#define KVFS_CTL_MSG_SIZE 8192u
/* One FUSE request carries at most 1 MiB each way (max_write and the
 * largest read), so a request and its response must each fit in it. The
 * kernel counts that in pages of the caller's buffer: a buffer that does
 * not start on a page boundary spans one page more than its length, and a
 * full 1 MiB from it would arrive as two requests (refused: a request is
 * never assembled from pieces). One page less fits from any buffer.
 */
#define KVFS_CTL_MAX_SIZE ((1u << 20) - 4096u)
#define KVFS_CTL_MAX_BLOCKS 16384u

enum kvfs_ctl_op {
	KVFS_CTL_LOOKUP = 1,     /* how many leading blocks are cached where */
	KVFS_CTL_FETCH = 2,      /* make blocks resident in the device pool, leased */
	KVFS_CTL_FETCH_INTO = 3, /* copy blocks' KV into caller memory per layer */
	KVFS_CTL_SAVE = 4,       /* create a block from KV in caller memory */
	KVFS_CTL_RELEASE = 5,    /* drop leases (keys, or all with no keys) */
	KVFS_CTL_PIN = 6,        /* pin keys in a tier */
	KVFS_CTL_UNPIN = 7,      /* remove pins of keys */
	KVFS_CTL_PREFETCH = 8,   /* async hint: bring keys up to a tier */
	KVFS_CTL_EVICT = 9,      /* drop keys from a tier (or from all) */
	KVFS_CTL_STATS = 10,     /* counters, in resp.stats */
	KVFS_CTL_FETCH_CHUNKS = 11, /* chosen chunks of chosen layers only */
	KVFS_CTL_SCORES = 12,    /* report chunk attention scores */
	KVFS_CTL_OP_MAX = 12,
};

enum kvfs_ctl_flags {
	/* LOOKUP: count the matched prefix as an access (hotness, hits). A
	 * plain lookup changes nothing and renews no lease.
	 */
	KVFS_CTL_F_ACCESS = 1 << 0,
	/* The request gives token ids, not keys; the daemon chains the keys
	 * from the namespace root (full blocks only).
	 */
	KVFS_CTL_F_TOKENS = 1 << 1,
	/* FETCH_CHUNKS: once this period is served, speculatively load the
	 * same chunks for the next n_layers layers (inter-period prefetch).
	 * The descriptor's next FETCH_CHUNKS (or its close) calls off what
	 * that load has not issued yet.
	 */
	KVFS_CTL_F_SPECULATE = 1 << 2,
	/* FETCH_CHUNKS: deliver into a leased region of the device pool
	 * (resp.blocks[0]) instead of the caller's memory.
	 */
	KVFS_CTL_F_POOL = 1 << 3,
	/* LOOKUP: look up the keys that are not local in the remote tier
	 * ([tier.remote], docs/remote.md) and bring the found prefix in
	 * first, so the answer counts them. A plain LOOKUP stays local.
	 * The fetches and PREFETCH always look remotely; other operations
	 * refuse it (EINVAL).
	 */
	KVFS_CTL_F_REMOTE = 1 << 4,
};

/*
 * FETCH_INTO returns when every layer is copied, and stores the number of
 * finished layers in the caller's sync word as it goes: an engine issues
 * it from a loader thread and waits for layer l from its compute thread
 * (the shape of vLLM's wait_for_layer_load).
 */

/* Where a backend's memory lives. */
enum kvfs_ctl_backend {
	KVFS_CTL_BACKEND_SHM = 1,  /* POSIX shared memory (no GPU, and CI) */
	KVFS_CTL_BACKEND_CUDA = 2, /* CUDA device memory, IPC handles */
};

/* A memory region: the daemon's pool, or a caller's buffer. */
struct kvfs_ctl_mem {
	uint32_t backend;       /* enum kvfs_ctl_backend */
	uint32_t device;        /* CUDA device ordinal; 0 for shm */
	uint64_t size;          /* bytes */
	char shm_name[KVFS_CTL_NAME_MAX]; /* shm: "/name", NUL-terminated */
	uint8_t ipc[64];        /* cuda: cudaIpcMemHandle_t */
};
_Static_assert(sizeof(struct kvfs_ctl_mem) == 144, "kvfs_ctl_mem size");

/* Per-layer completion for FETCH_INTO: a u32 in a shm object of the
 * caller's. The daemon stores the number of layers whose copies are
 * complete (release order) and futex-wakes waiters after each layer; on
 * failure it stores 0x80000000 | layer.
 */
struct kvfs_ctl_sync {
	char shm_name[KVFS_CTL_NAME_MAX];
	uint64_t off;           /* 4-byte aligned offset of the u32 */
};
_Static_assert(sizeof(struct kvfs_ctl_sync) == 72, "kvfs_ctl_sync size");

#define KVFS_CTL_SYNC_FAILED 0x80000000u

struct kvfs_ctl_req {
	uint32_t magic;         /* KVFS_CTL_MAGIC */
	uint16_t abi;           /* KVFS_CTL_ABI */
	uint16_t op;            /* enum kvfs_ctl_op */
	uint32_t size;          /* bytes of the request, arrays included */
	uint32_t flags;         /* enum kvfs_ctl_flags */
	char ns[KVFS_CTL_NS_MAX]; /* namespace, NUL-terminated */
	uint32_t n_keys;        /* keys that follow (chain order, root first) */
	uint32_t n_tokens;      /* token ids that follow */
	uint32_t n_dst;         /* FETCH_INTO: one per key */
	uint32_t tier;          /* PIN/UNPIN/PREFETCH/EVICT: 0 gpu 1 dram 2 ssd;
				 * EVICT: 3 = every tier (delete) */
	struct kvfs_ctl_mem peer; /* FETCH_INTO/SAVE: caller memory */
	struct kvfs_ctl_sync sync; /* FETCH_INTO: completion word */
	uint64_t src_off;       /* SAVE: payload offset in peer memory */
	uint64_t start_pos;     /* SAVE: position of the first token */
	uint8_t parent[16];     /* SAVE: parent key (the root for a first block) */
	/* FETCH_CHUNKS: layers [layer_first, layer_first + n_layers) (a
	 * period) of the chunks listed in chunks[]; chunk indices count over
	 * the whole prefix named by keys[] (chunk j holds tokens
	 * [j*c, (j+1)*c) of the prefix, c = the namespace's chunk_tokens).
	 * SCORES: chunks[] and scores[] pair up (n_scores == n_chunks).
	 */
	uint32_t layer_first;
	uint32_t n_layers;
	uint32_t n_chunks;
	uint32_t n_scores;
	/* FETCH_CHUNKS: layers read per I/O batch (ContiguousKV's
	 * sub-period): the first sub_period layers are signalled complete
	 * while the next batch is in flight; 0 = the whole period at once.
	 */
	uint32_t sub_period;
	uint8_t reserved[20];
};
_Static_assert(sizeof(struct kvfs_ctl_req) == 384, "kvfs_ctl_req size");

/*
 * FETCH_CHUNKS output layout, in the caller's memory at dst[0].off (one
 * destination) or in the pool region: for each layer of the period in
 * order, for each requested chunk in the order given, that chunk's K then
 * V (chunk_bytes = 2 * c * kv_heads * head_dim * dtype size). A chunk past
 * the prefix's last token is refused; rows past the last token of a
 * partial last chunk are zero. Completion is signalled per layer in the
 * sync word, as for FETCH_INTO.
 */

/* FETCH_INTO: where block i's payload goes in peer memory. Layer l of
 * the block lands at off + l * layer_bytes (the block file's payload
 * layout, one layer after another). The blocks' ranges [off, off + len)
 * must not overlap (touching is fine, the same key twice at two places
 * too): resp.error -EINVAL otherwise, before anything is copied. The
 * caller's own device work on these ranges must be finished (synchronised)
 * before the request: the daemon copies on streams of its own.
 */
struct kvfs_ctl_dst {
	uint64_t off;
};

struct kvfs_ctl_block {
	uint8_t key[16];
	uint32_t tiers;         /* bit t: resident in tier t (0 gpu 1 dram 2 ssd) */
	uint32_t n_tokens;
	uint64_t pool_off;      /* FETCH: payload offset in the pool */
	uint64_t len;           /* FETCH/FETCH_INTO: payload bytes */
	uint64_t layer_bytes;   /* bytes of one layer of the payload */
};
_Static_assert(sizeof(struct kvfs_ctl_block) == 48, "kvfs_ctl_block size");

struct kvfs_ctl_stats {
	uint64_t leases;        /* leases this process holds on this descriptor */
	uint64_t leases_total;  /* leases held by everyone */
	uint64_t leases_reclaimed; /* taken back after the time limit */
	uint64_t pool_capacity, pool_used, pool_blocks;
	uint64_t fetches, fetch_bytes, fetch_into_bytes, saves;
	/* FETCH_CHUNKS, since start: bytes asked for, bytes read from the
	 * SSD (read amplification = read / wanted), SSD read operations
	 * after coalescing, chunk pieces served from memory, speculative
	 * pieces loaded and of those later used.
	 */
	uint64_t chunk_bytes_wanted, chunk_bytes_read, chunk_reads;
	uint64_t chunk_hits, spec_loaded, spec_used;
};
_Static_assert(sizeof(struct kvfs_ctl_stats) == 128, "kvfs_ctl_stats size");

struct kvfs_ctl_resp {
	uint32_t magic;         /* KVFS_CTL_MAGIC */
	uint16_t abi;           /* KVFS_CTL_ABI */
	uint16_t op;            /* the request's op */
	uint32_t size;          /* bytes of the response, blocks included */
	int32_t error;          /* 0 or -errno */
	uint32_t n_blocks;      /* blocks that follow */
	uint32_t n_cached;      /* LOOKUP: leading blocks resident anywhere */
	uint8_t key[16];        /* SAVE: the new block's key */
	struct kvfs_ctl_mem pool; /* FETCH: the device pool to map */
	struct kvfs_ctl_stats stats; /* STATS */
	/* FETCH_CHUNKS, this request only */
	uint64_t bytes_wanted;  /* chunk bytes delivered */
	uint64_t bytes_read;    /* bytes read from the SSD for them */
	uint32_t ssd_reads;     /* read operations after coalescing */
	uint32_t mem_hits;      /* pieces served from DRAM or the pool */
	uint32_t spec_hits;     /* of those, loaded by a previous SPECULATE */
	uint8_t reserved[12];
};
_Static_assert(sizeof(struct kvfs_ctl_resp) == 352, "kvfs_ctl_resp size");

/* The fixed-size ioctl buffer: a request or a response with its arrays. */
struct kvfs_ctl_msg {
	union {
		struct kvfs_ctl_req req;
		struct kvfs_ctl_resp resp;
		uint8_t bytes[KVFS_CTL_MSG_SIZE];
	};
};
_Static_assert(sizeof(struct kvfs_ctl_msg) == KVFS_CTL_MSG_SIZE, "msg size");

/* What fits in one ioctl. */
#define KVFS_CTL_IOC_KEYS \
	((KVFS_CTL_MSG_SIZE - sizeof(struct kvfs_ctl_resp)) / \
	 sizeof(struct kvfs_ctl_block))
#define KVFS_CTL_IOC_TOKENS \
	((KVFS_CTL_MSG_SIZE - sizeof(struct kvfs_ctl_req)) / sizeof(uint32_t))

#define KVFS_IOC_TYPE 'K'
#define KVFS_IOC_NR(op) (0x40 + (op))
/* _IOWR('K', 0x40 + op, struct kvfs_ctl_msg), spelled out so that this
 * header needs no kernel header.
 */
#define KVFS_IOC(op)                                                        \
	((3u << 30) | ((uint32_t)KVFS_CTL_MSG_SIZE << 16) |                  \
	 ((uint32_t)KVFS_IOC_TYPE << 8) | (uint32_t)KVFS_IOC_NR(op))
#define KVFS_IOC_LOOKUP KVFS_IOC(KVFS_CTL_LOOKUP)
#define KVFS_IOC_FETCH KVFS_IOC(KVFS_CTL_FETCH)
#define KVFS_IOC_FETCH_INTO KVFS_IOC(KVFS_CTL_FETCH_INTO)
#define KVFS_IOC_SAVE KVFS_IOC(KVFS_CTL_SAVE)
#define KVFS_IOC_RELEASE KVFS_IOC(KVFS_CTL_RELEASE)
#define KVFS_IOC_PIN KVFS_IOC(KVFS_CTL_PIN)
#define KVFS_IOC_UNPIN KVFS_IOC(KVFS_CTL_UNPIN)
#define KVFS_IOC_PREFETCH KVFS_IOC(KVFS_CTL_PREFETCH)
#define KVFS_IOC_EVICT KVFS_IOC(KVFS_CTL_EVICT)
#define KVFS_IOC_STATS KVFS_IOC(KVFS_CTL_STATS)
#define KVFS_IOC_FETCH_CHUNKS KVFS_IOC(KVFS_CTL_FETCH_CHUNKS)
#define KVFS_IOC_SCORES KVFS_IOC(KVFS_CTL_SCORES)

#endif
