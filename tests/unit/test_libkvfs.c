/* SPDX-License-Identifier: MIT */
/*
 * libkvfs without a daemon: key chains (against hashes computed outside
 * kvfs and against kvfs_fmt_block_key), request encoding byte by byte,
 * argument errors, the transport chosen for each size, response checking
 * (a fake transport answers), shm pool pointers, and the sync word.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/libkvfs.h"
#include "meta/fmt.h"
#include "meta/log.h"

#define NS "llama"

/* ---------------------------------------------------------- fake daemon */

/*
 * A transport that records what it was sent and answers with a canned
 * response (or one built by a hook from the request).
 */
struct fake {
	int calls;
	enum kvfs_client_xport how;
	uint8_t *req;
	size_t req_len, cap;
	uint8_t resp[1 << 16];
	size_t resp_len;
	int err; /* returned instead of a response when set */
	void (*hook)(struct fake *f);
};

static ssize_t fake_call(void *arg, enum kvfs_client_xport how,
			 const void *req, size_t req_len, void *resp,
			 size_t cap)
{
	struct fake *f = arg;

	f->calls++;
	f->how = how;
	free(f->req);
	f->req = malloc(req_len);
	assert_non_null(f->req);
	memcpy(f->req, req, req_len);
	f->req_len = req_len;
	f->cap = cap;
	if (f->err)
		return f->err;
	if (f->hook)
		f->hook(f);
	if (f->resp_len > cap)
		return -EMSGSIZE;
	memcpy(resp, f->resp, f->resp_len);
	return (ssize_t)f->resp_len;
}

static const struct kvfs_client_xport_ops fake_ops = { .call = fake_call };

/* A well-formed response to @op with @n blocks. */
static struct kvfs_ctl_resp *fake_resp(struct fake *f, uint16_t op,
				       uint32_t n)
{
	struct kvfs_ctl_resp *h = (struct kvfs_ctl_resp *)f->resp;

	memset(f->resp, 0, sizeof(f->resp));
	h->magic = KVFS_CTL_MAGIC;
	h->abi = KVFS_CTL_ABI;
	h->op = op;
	h->n_blocks = n;
	h->size = (uint32_t)(sizeof(*h) + n * sizeof(struct kvfs_ctl_block));
	f->resp_len = h->size;
	return h;
}

static struct kvfs_ctl_block *fake_block(struct fake *f, uint32_t i)
{
	return (struct kvfs_ctl_block *)(f->resp +
					 sizeof(struct kvfs_ctl_resp)) + i;
}

static const struct kvfs_ctl_req *sent(const struct fake *f)
{
	return (const struct kvfs_ctl_req *)f->req;
}

struct fx {
	struct fake f;
	struct kvfs_client *c;
};

static int fx_setup(void **state)
{
	struct fx *x = calloc(1, sizeof(*x));

	if (!x || kvfs_client_open_xport(NULL, &fake_ops, &x->f, &x->c))
		return -1;
	*state = x;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *x = *state;

	kvfs_client_close(x->c);
	free(x->f.req);
	free(x);
	return 0;
}

static void make_keys(uint8_t (*k)[KVFS_KEY_LEN], size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (int j = 0; j < KVFS_KEY_LEN; j++)
			k[i][j] = (uint8_t)(i * 31 + j);
}

static void zero_bytes(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_int_equal(p[i], 0);
}

/* ------------------------------------------------------------ key chains */

static void test_root_key(void **state)
{
	uint8_t a[KVFS_KEY_LEN], b[KVFS_KEY_LEN], want[KVFS_KEY_LEN];

	(void)state;
	/* hashlib.sha256(b"kvfs-ns-v1\0llama\0").digest()[:16] */
	assert_int_equal(kvfs_fmt_key_parse("feebf0027a7d68f558cfb7620bb8e449",
					    want), 0);
	kvfs_client_root_key(NS, NULL, a);
	kvfs_client_root_key(NS, "", b);
	assert_memory_equal(a, want, KVFS_KEY_LEN);
	assert_memory_equal(b, want, KVFS_KEY_LEN);
	kvfs_client_root_key(NS, "pepper", b);
	assert_memory_not_equal(a, b, KVFS_KEY_LEN);
	kvfs_fmt_root_key(NS, "pepper", want);
	assert_memory_equal(b, want, KVFS_KEY_LEN);
}

/*
 * Tokens 7i+1, i < 40, 16-token blocks, from the root of "llama"; keys
 * computed with Python's hashlib:
 *   sha256(parent ‖ struct.pack("<16I", *block)).digest()[:16]
 */
static const char *const chain_hex[] = {
	"1d408b52004b0f862fbcb5d053b2dfb2",
	"1b42788ab84eba47188df65b142a130c",
	"8c0d1eb4013df81f30106d576163f5b2", /* the 8-token tail */
};

static void test_chain_known_values(void **state)
{
	uint8_t root[KVFS_KEY_LEN], keys[4][KVFS_KEY_LEN], want[KVFS_KEY_LEN];
	uint32_t toks[40];
	size_t n = 99;

	(void)state;
	for (uint32_t i = 0; i < 40; i++)
		toks[i] = i * 7 + 1;
	kvfs_client_root_key(NS, NULL, root);
	assert_int_equal(kvfs_client_chain(root, toks, 40, 16, 0, keys, 4, &n),
			 0);
	assert_int_equal(n, 2);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(kvfs_fmt_key_parse(chain_hex[i], want), 0);
		assert_memory_equal(keys[i], want, KVFS_KEY_LEN);
	}
	assert_int_equal(kvfs_client_chain(root, toks, 40, 16,
					   KVFS_CLIENT_CHAIN_PARTIAL, keys, 4,
					   &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(kvfs_fmt_key_parse(chain_hex[2], want), 0);
	assert_memory_equal(keys[2], want, KVFS_KEY_LEN);
}

static void test_chain_matches_fmt(void **state)
{
	uint8_t parent[KVFS_KEY_LEN], keys[9][KVFS_KEY_LEN], k[KVFS_KEY_LEN];
	uint32_t toks[100];
	size_t n;

	(void)state;
	for (uint32_t i = 0; i < 100; i++)
		toks[i] = (i * 2654435761u) % 128256u;
	kvfs_fmt_root_key("m", "s", parent);
	assert_int_equal(kvfs_client_chain(parent, toks, 100, 12,
					   KVFS_CLIENT_CHAIN_PARTIAL, keys, 9,
					   &n), 0);
	assert_int_equal(n, 9); /* 8 full + a 4-token tail */
	for (size_t i = 0; i < n; i++) {
		size_t len = i < 8 ? 12 : 4;

		kvfs_fmt_block_key(parent, toks + i * 12, len, k);
		assert_memory_equal(keys[i], k, KVFS_KEY_LEN);
		memcpy(parent, k, KVFS_KEY_LEN);
	}
}

static void test_chain_continues(void **state)
{
	uint8_t root[KVFS_KEY_LEN], all[4][KVFS_KEY_LEN], tail[2][KVFS_KEY_LEN];
	uint32_t toks[64];
	size_t n;

	(void)state;
	for (uint32_t i = 0; i < 64; i++)
		toks[i] = 5000 + i;
	kvfs_client_root_key(NS, NULL, root);
	assert_int_equal(kvfs_client_chain(root, toks, 64, 16, 0, all, 4, &n),
			 0);
	/* the second half chained from block 1's key is the same chain */
	assert_int_equal(kvfs_client_chain(all[1], toks + 32, 32, 16, 0, tail,
					   2, &n), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(tail, all[2], 2 * KVFS_KEY_LEN);
}

static void test_chain_errors(void **state)
{
	uint8_t root[KVFS_KEY_LEN] = { 0 }, keys[2][KVFS_KEY_LEN];
	uint32_t toks[40] = { 0 };
	size_t n = 0;

	(void)state;
	assert_int_equal(kvfs_client_chain(root, toks, 40, 0, 0, keys, 2, &n),
			 -EINVAL);
	assert_int_equal(kvfs_client_chain(NULL, toks, 40, 16, 0, keys, 2,
					   &n), -EINVAL);
	assert_int_equal(kvfs_client_chain(root, NULL, 40, 16, 0, keys, 2,
					   &n), -EINVAL);
	assert_int_equal(kvfs_client_chain(root, toks, 40, 16, 1u << 5, keys,
					   2, &n), -EINVAL);
	assert_int_equal(kvfs_client_chain(root, toks, 40, 16, 0, keys, 2,
					   NULL), -EINVAL);
	/* too small: says how many it needs, writes nothing */
	memset(keys, 0xab, sizeof(keys));
	assert_int_equal(kvfs_client_chain(root, toks, 40, 16,
					   KVFS_CLIENT_CHAIN_PARTIAL, keys, 2,
					   &n), -ENOSPC);
	assert_int_equal(n, 3);
	for (size_t i = 0; i < sizeof(keys); i++)
		assert_int_equal(((uint8_t *)keys)[i], 0xab);
	/* fewer tokens than a block: no key without PARTIAL */
	assert_int_equal(kvfs_client_chain(root, toks, 15, 16, 0, NULL, 0, &n),
			 0);
	assert_int_equal(n, 0);
	assert_int_equal(kvfs_client_chain_len(15, 16,
					       KVFS_CLIENT_CHAIN_PARTIAL), 1);
	assert_int_equal(kvfs_client_chain_len(32, 16,
					       KVFS_CLIENT_CHAIN_PARTIAL), 2);
	assert_int_equal(kvfs_client_chain_len(33, 16, 0), 2);
	assert_int_equal(kvfs_client_chain_len(33, 0, 0), 0);
}

/* -------------------------------------------------------------- encoding */

static void test_encode_lookup(void **state)
{
	uint8_t keys[3][KVFS_KEY_LEN], buf[1024];
	struct kvfs_client_req r = {
		.op = KVFS_CTL_LOOKUP, .ns = NS, .flags = KVFS_CTL_F_ACCESS,
		.keys = (const uint8_t(*)[KVFS_KEY_LEN])keys, .n_keys = 3,
	};
	const struct kvfs_ctl_req *h = (const void *)buf;
	size_t size = 0;

	(void)state;
	make_keys(keys, 3);
	memset(buf, 0xee, sizeof(buf));
	assert_int_equal(kvfs_client_req_size(&r), 384 + 48);
	assert_int_equal(kvfs_client_req_encode(&r, buf, sizeof(buf), &size),
			 0);
	assert_int_equal(size, 384 + 3 * 16);
	assert_int_equal(h->magic, KVFS_CTL_MAGIC);
	assert_int_equal(h->abi, KVFS_CTL_ABI);
	assert_int_equal(h->op, KVFS_CTL_LOOKUP);
	assert_int_equal(h->size, size);
	assert_int_equal(h->flags, KVFS_CTL_F_ACCESS);
	assert_string_equal(h->ns, NS);
	zero_bytes((const uint8_t *)h->ns + strlen(NS),
		   KVFS_CTL_NS_MAX - strlen(NS));
	assert_int_equal(h->n_keys, 3);
	assert_int_equal(h->n_tokens, 0);
	assert_int_equal(h->n_dst, 0);
	assert_int_equal(h->tier, 0);
	/* nothing the op does not use leaks in: peer, sync, save fields */
	zero_bytes((const uint8_t *)&h->peer,
		   offsetof(struct kvfs_ctl_req, reserved) -
			   offsetof(struct kvfs_ctl_req, peer));
	zero_bytes(h->reserved, sizeof(h->reserved));
	assert_memory_equal(buf + 384, keys, sizeof(keys));
	/* the buffer past the request is untouched */
	assert_int_equal(buf[size], 0xee);
	/* too small a buffer */
	assert_int_equal(kvfs_client_req_encode(&r, buf, size - 1, &size),
			 -ENOSPC);
}

static void test_encode_tokens(void **state)
{
	uint32_t toks[5] = { 1, 2, 3, 0xffffffffu, 0 };
	uint8_t buf[512];
	struct kvfs_client_req r = {
		.op = KVFS_CTL_FETCH, .ns = NS, .flags = KVFS_CTL_F_TOKENS,
		.tokens = toks, .n_tokens = 5,
	};
	const struct kvfs_ctl_req *h = (const void *)buf;
	size_t size;

	(void)state;
	assert_int_equal(kvfs_client_req_encode(&r, buf, sizeof(buf), &size),
			 0);
	assert_int_equal(size, 384 + 20);
	assert_int_equal(h->op, KVFS_CTL_FETCH);
	assert_int_equal(h->flags, KVFS_CTL_F_TOKENS);
	assert_int_equal(h->n_keys, 0);
	assert_int_equal(h->n_tokens, 5);
	assert_memory_equal(buf + 384, toks, sizeof(toks));
}

static void test_encode_fetch_into(void **state)
{
	uint8_t keys[2][KVFS_KEY_LEN], buf[1024];
	uint64_t dst[2] = { 4096, 1ull << 40 };
	struct kvfs_ctl_mem peer = {
		.backend = KVFS_CTL_BACKEND_SHM, .size = 1 << 20,
		.shm_name = "/peer-x",
	};
	struct kvfs_ctl_sync sync = { .shm_name = "/sync-y", .off = 8 };
	struct kvfs_client_req r = {
		.op = KVFS_CTL_FETCH_INTO, .ns = NS,
		.keys = (const uint8_t(*)[KVFS_KEY_LEN])keys, .n_keys = 2,
		.dst_off = dst, .peer = &peer, .sync = &sync,
		.src_off = 77, /* not a FETCH_INTO field: must not be sent */
	};
	const struct kvfs_ctl_req *h = (const void *)buf;
	size_t size;
	uint64_t d;

	(void)state;
	make_keys(keys, 2);
	assert_int_equal(kvfs_client_req_encode(&r, buf, sizeof(buf), &size),
			 0);
	assert_int_equal(size, 384 + 2 * 16 + 2 * 8);
	assert_int_equal(h->n_keys, 2);
	assert_int_equal(h->n_dst, 2);
	assert_memory_equal(&h->peer, &peer, sizeof(peer));
	assert_memory_equal(&h->sync, &sync, sizeof(sync));
	assert_int_equal(h->src_off, 0);
	assert_memory_equal(buf + 384, keys, sizeof(keys));
	memcpy(&d, buf + 384 + 32, 8);
	assert_int_equal(d, 4096);
	memcpy(&d, buf + 384 + 40, 8);
	assert_int_equal(d, 1ull << 40);
}

static void test_encode_save_and_tier(void **state)
{
	uint8_t parent[KVFS_KEY_LEN], keys[1][KVFS_KEY_LEN], buf[1024];
	uint32_t toks[3] = { 9, 8, 7 };
	struct kvfs_ctl_mem peer = {
		.backend = KVFS_CTL_BACKEND_SHM, .size = 4096,
		.shm_name = "/p",
	};
	struct kvfs_client_req r = {
		.op = KVFS_CTL_SAVE, .ns = NS, .tokens = toks, .n_tokens = 3,
		.peer = &peer, .src_off = 512, .start_pos = 32,
		.parent = parent,
	};
	const struct kvfs_ctl_req *h = (const void *)buf;
	size_t size;

	(void)state;
	memset(parent, 0x5a, sizeof(parent));
	assert_int_equal(kvfs_client_req_encode(&r, buf, sizeof(buf), &size),
			 0);
	assert_int_equal(h->n_tokens, 3);
	assert_int_equal(h->src_off, 512);
	assert_int_equal(h->start_pos, 32);
	assert_memory_equal(h->parent, parent, KVFS_KEY_LEN);
	assert_memory_equal(buf + 384, toks, sizeof(toks));

	make_keys(keys, 1);
	memset(&r, 0, sizeof(r));
	r.op = KVFS_CTL_EVICT;
	r.ns = NS;
	r.keys = (const uint8_t(*)[KVFS_KEY_LEN])keys;
	r.n_keys = 1;
	r.tier = KVFS_CLIENT_TIER_ALL;
	assert_int_equal(kvfs_client_req_encode(&r, buf, sizeof(buf), &size),
			 0);
	assert_int_equal(h->tier, 3);
	/* STATS and RELEASE-all go without a namespace */
	memset(&r, 0, sizeof(r));
	r.op = KVFS_CTL_STATS;
	assert_int_equal(kvfs_client_req_encode(&r, buf, sizeof(buf), &size),
			 0);
	assert_int_equal(size, 384);
	zero_bytes((const uint8_t *)h->ns, KVFS_CTL_NS_MAX);
	r.op = KVFS_CTL_RELEASE;
	assert_int_equal(kvfs_client_req_check(&r), 0);
}

/* ------------------------------------------------------ argument errors */

static void test_req_check_errors(void **state)
{
	char long_ns[KVFS_CTL_NS_MAX + 1];
	uint8_t keys[2][KVFS_KEY_LEN] = { { 0 } };
	uint32_t toks[4] = { 0 };
	uint64_t dst[2] = { 0 };
	struct kvfs_ctl_mem peer = {
		.backend = KVFS_CTL_BACKEND_SHM, .size = 4096,
		.shm_name = "/p",
	};
	struct kvfs_ctl_sync sync = { .shm_name = "/s" };
	const uint8_t(*k)[KVFS_KEY_LEN] = (const uint8_t(*)[KVFS_KEY_LEN])keys;
	struct kvfs_client_req ok = {
		.op = KVFS_CTL_LOOKUP, .ns = NS, .keys = k, .n_keys = 2,
	};
	struct kvfs_client_req r;

	(void)state;
	assert_int_equal(kvfs_client_req_check(&ok), 0);
	assert_int_equal(kvfs_client_req_check(NULL), -EINVAL);

#define EXPECT(err, ...)                                                   \
	do {                                                               \
		r = ok;                                                    \
		__VA_ARGS__;                                               \
		assert_int_equal(kvfs_client_req_check(&r), err);          \
	} while (0)

	EXPECT(-EINVAL, r.op = 0);
	EXPECT(-EINVAL, r.op = KVFS_CTL_OP_MAX + 1);
	EXPECT(-EINVAL, r.xport = 3);
	EXPECT(-EINVAL, r.ns = NULL);
	EXPECT(-EINVAL, r.ns = "");
	EXPECT(-EINVAL, r.ns = "a/b");
	EXPECT(-EINVAL, r.ns = "..");
	memset(long_ns, 'n', KVFS_CTL_NS_MAX);
	long_ns[KVFS_CTL_NS_MAX] = 0;
	EXPECT(-EINVAL, r.ns = long_ns);
	long_ns[KVFS_CTL_NS_MAX - 1] = 0; /* 63 bytes: the longest */
	EXPECT(0, r.ns = long_ns);
	EXPECT(-EINVAL, r.flags = 1u << 7);
	EXPECT(-EINVAL, r.n_keys = 0);
	EXPECT(-EINVAL, r.keys = NULL);
	EXPECT(-EINVAL, r.tokens = toks; r.n_tokens = 4);
	EXPECT(-EINVAL, r.flags = KVFS_CTL_F_TOKENS);  /* keys, no tokens */
	EXPECT(0, r.flags = KVFS_CTL_F_TOKENS; r.keys = NULL; r.n_keys = 0;
	       r.tokens = toks; r.n_tokens = 4);
	EXPECT(-EINVAL, r.flags = KVFS_CTL_F_TOKENS; r.n_keys = 0;
	       r.tokens = NULL; r.n_tokens = 4);
	EXPECT(-E2BIG, r.n_keys = KVFS_CTL_MAX_BLOCKS + 1);
	EXPECT(-E2BIG, r.flags = KVFS_CTL_F_TOKENS; r.n_keys = 0;
	       r.tokens = toks; r.n_tokens = KVFS_CTL_MAX_SIZE / 4);
	/* ACCESS is LOOKUP's only */
	EXPECT(-EINVAL, r.op = KVFS_CTL_FETCH; r.flags = KVFS_CTL_F_ACCESS);
	EXPECT(0, r.op = KVFS_CTL_FETCH);

	/* FETCH_INTO: offsets, a peer and a sync word, keys only */
	ok.op = KVFS_CTL_FETCH_INTO;
	ok.dst_off = dst;
	ok.peer = &peer;
	ok.sync = &sync;
	EXPECT(0, (void)0);
	EXPECT(-EINVAL, r.dst_off = NULL);
	EXPECT(-EINVAL, r.peer = NULL);
	EXPECT(-EINVAL, r.sync = NULL);
	EXPECT(-EINVAL, r.flags = KVFS_CTL_F_TOKENS; r.n_keys = 0;
	       r.tokens = toks; r.n_tokens = 4);
	sync.off = 2;
	EXPECT(-EINVAL, (void)0);
	sync.off = 0;
	peer.size = 0;
	EXPECT(-EINVAL, (void)0);
	peer.size = 4096;
	peer.shm_name[0] = 'p'; /* no leading slash */
	EXPECT(-EINVAL, (void)0);
	peer.shm_name[0] = '/';
	peer.backend = 7;
	EXPECT(-EINVAL, (void)0);
	peer.backend = KVFS_CTL_BACKEND_CUDA;
	EXPECT(0, (void)0);
	peer.backend = KVFS_CTL_BACKEND_SHM;

	/* SAVE: tokens, a parent, a peer */
	memset(&ok, 0, sizeof(ok));
	ok.op = KVFS_CTL_SAVE;
	ok.ns = NS;
	ok.tokens = toks;
	ok.n_tokens = 4;
	ok.parent = keys[0];
	ok.peer = &peer;
	EXPECT(0, (void)0);
	EXPECT(-EINVAL, r.parent = NULL);
	EXPECT(-EINVAL, r.n_tokens = 0);
	EXPECT(-EINVAL, r.keys = k; r.n_keys = 1);
	EXPECT(-EINVAL, r.flags = KVFS_CTL_F_TOKENS);

	/* tiers */
	memset(&ok, 0, sizeof(ok));
	ok.op = KVFS_CTL_PIN;
	ok.ns = NS;
	ok.keys = k;
	ok.n_keys = 1;
	EXPECT(0, r.tier = KVFS_CLIENT_TIER_SSD);
	EXPECT(-EINVAL, r.tier = KVFS_CLIENT_TIER_ALL);
	EXPECT(-EINVAL, r.op = KVFS_CTL_UNPIN; r.tier = 4);
	EXPECT(0, r.op = KVFS_CTL_EVICT; r.tier = KVFS_CLIENT_TIER_ALL);
	EXPECT(-EINVAL, r.op = KVFS_CTL_EVICT; r.tier = 4);
	EXPECT(-EINVAL, r.op = KVFS_CTL_PREFETCH; r.n_keys = 0);

	/* RELEASE: keys need their namespace; STATS takes nothing */
	EXPECT(-EINVAL, r.op = KVFS_CTL_RELEASE; r.ns = NULL);
	EXPECT(0, r.op = KVFS_CTL_RELEASE; r.ns = NULL; r.n_keys = 0);
	EXPECT(-EINVAL, r.op = KVFS_CTL_STATS);
	EXPECT(-EINVAL, r.op = KVFS_CTL_STATS; r.n_keys = 0;
	       r.flags = KVFS_CTL_F_TOKENS);
#undef EXPECT
}

/* The wrappers refuse bad input without sending anything. */
static void test_wrapper_errors(void **state)
{
	struct fx *x = *state;
	struct kvfs_client_blocks b;
	struct kvfs_client_peer p;
	struct kvfs_client_sync s = { 0 };
	uint8_t keys[1][KVFS_KEY_LEN] = { { 0 } };
	uint64_t dst = 0;
	struct kvfs_ctl_mem peer = {
		.backend = KVFS_CTL_BACKEND_SHM, .size = 64, .shm_name = "/p",
	};

	assert_int_equal(kvfs_client_lookup(x->c, NS, NULL, 1, 0, &b),
			 -EINVAL);
	assert_int_equal(kvfs_client_lookup(x->c, NS,
					    (const uint8_t(*)[16])keys, 1,
					    KVFS_CTL_F_TOKENS, &b), -EINVAL);
	assert_int_equal(kvfs_client_lookup(NULL, NS,
					    (const uint8_t(*)[16])keys, 1, 0,
					    &b), -EINVAL);
	assert_int_equal(kvfs_client_lookup(x->c, NS,
					    (const uint8_t(*)[16])keys, 1, 0,
					    NULL), -EINVAL);
	assert_int_equal(kvfs_client_lookup_tokens(x->c, NS, NULL, 0, 0, &b),
			 -EINVAL);
	assert_int_equal(kvfs_client_fetch(x->c, "", (const uint8_t(*)[16])keys,
					   1, &b), -EINVAL);
	/* an uninitialised sync word */
	assert_int_equal(kvfs_client_fetch_into(x->c, NS,
						(const uint8_t(*)[16])keys, 1,
						&peer, &dst, &s, NULL),
			 -EINVAL);
	assert_int_equal(kvfs_client_fetch_into(x->c, NS,
						(const uint8_t(*)[16])keys, 1,
						&peer, &dst, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvfs_client_save(x->c, NS, keys[0], 0, NULL, 0, &peer,
					  0, NULL), -EINVAL);
	assert_int_equal(kvfs_client_pin(x->c, NS, (const uint8_t(*)[16])keys,
					 1, (enum kvfs_client_tier)9),
			 -EINVAL);
	assert_int_equal(kvfs_client_stats(x->c, NULL, NULL), -EINVAL);
	assert_int_equal(kvfs_client_peer_init(&p, 0), -EINVAL);
	assert_int_equal(kvfs_client_wait_layer(&s, 0, 0), -EINVAL);
	assert_int_equal(x->f.calls, 0);
	assert_int_equal(kvfs_client_open(NULL, &x->c), -EINVAL);
	assert_int_equal(kvfs_client_open_xport(NULL, NULL, NULL, &x->c),
			 -EINVAL);
}

/* ------------------------------------------------------ transport choice */

static void test_xport_pick(void **state)
{
	(void)state;
	/* what fits one ioctl, exactly */
	assert_int_equal(KVFS_CTL_IOC_KEYS, 163);
	assert_int_equal(KVFS_CTL_IOC_TOKENS, 1952);
	assert_int_equal(kvfs_client_xport_pick(384 + 163 * 16, 163),
			 KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(kvfs_client_xport_pick(384 + 164 * 16, 164),
			 KVFS_CLIENT_XPORT_RW);
	assert_int_equal(kvfs_client_xport_pick(KVFS_CTL_MSG_SIZE, 0),
			 KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(kvfs_client_xport_pick(KVFS_CTL_MSG_SIZE + 1, 0),
			 KVFS_CLIENT_XPORT_RW);
	/* a small request whose answer cannot fit */
	assert_int_equal(kvfs_client_xport_pick(400, 164),
			 KVFS_CLIENT_XPORT_RW);
}

static void test_resp_bound(void **state)
{
	struct kvfs_client_req r = { .op = KVFS_CTL_LOOKUP, .n_keys = 10 };

	(void)state;
	assert_int_equal(kvfs_client_resp_bound(&r, 0), 10);
	r.op = KVFS_CTL_FETCH;
	assert_int_equal(kvfs_client_resp_bound(&r, 0), 10);
	r.flags = KVFS_CTL_F_TOKENS;
	r.n_keys = 0;
	r.n_tokens = 100;
	assert_int_equal(kvfs_client_resp_bound(&r, 16), 6);
	assert_int_equal(kvfs_client_resp_bound(&r, 0), 100);
	r.max_blocks = 3;
	assert_int_equal(kvfs_client_resp_bound(&r, 16), 3);
	r.max_blocks = 0;
	r.flags = 0;
	r.op = KVFS_CTL_STATS;
	assert_int_equal(kvfs_client_resp_bound(&r, 16), 0);
	r.op = KVFS_CTL_SAVE;
	assert_int_equal(kvfs_client_resp_bound(&r, 16), 1);
}

/* Requests go by ioctl while they and their answers fit, else by RW. */
static void test_call_transport_by_size(void **state)
{
	struct fx *x = *state;
	static uint8_t keys[200][KVFS_KEY_LEN];
	static uint32_t toks[3000];
	struct kvfs_client_blocks b;

	make_keys(keys, 200);
	fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	assert_int_equal(kvfs_client_lookup(x->c, NS,
					    (const uint8_t(*)[16])keys, 163, 0,
					    &b), 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(kvfs_client_last_xport(x->c), KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(x->f.req_len, 384 + 163 * 16);
	assert_int_equal(sent(&x->f)->size, x->f.req_len);
	assert_memory_equal(x->f.req + 384, keys, 163 * 16);
	assert_int_equal(kvfs_client_lookup(x->c, NS,
					    (const uint8_t(*)[16])keys, 164, 0,
					    &b), 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_RW);
	/* room for the largest answer: one block per key */
	assert_true(x->f.cap >= 352 + 164 * 48);
	assert_int_equal(kvfs_client_lookup(x->c, NS,
					    (const uint8_t(*)[16])keys, 200, 0,
					    &b), 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_RW);
	assert_int_equal(sent(&x->f)->n_keys, 200);

	/* tokens with no mount: block_tokens unknown, so the bound is one
	 * block per token
	 */
	assert_int_equal(kvfs_client_lookup_tokens(x->c, NS, toks, 163, 0, &b),
			 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(sent(&x->f)->flags, KVFS_CTL_F_TOKENS);
	assert_int_equal(kvfs_client_lookup_tokens(x->c, NS, toks, 164, 0, &b),
			 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_RW);
	assert_int_equal(kvfs_client_lookup_tokens(x->c, NS, toks, 3000, 0,
						   &b), 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_RW);
	assert_int_equal(x->f.req_len, 384 + 3000 * 4);
}

/* Forcing a transport: IOCTL refuses what does not fit, RW takes all. */
static void test_call_forced(void **state)
{
	struct fx *x = *state;
	static uint8_t keys[600][KVFS_KEY_LEN];
	struct kvfs_client_blocks b;
	struct kvfs_client_req r = {
		.op = KVFS_CTL_LOOKUP, .ns = NS,
		.keys = (const uint8_t(*)[16])keys, .n_keys = 600,
		.xport = KVFS_CLIENT_XPORT_IOCTL,
	};

	fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	assert_int_equal(kvfs_client_call(x->c, &r, &b), -E2BIG);
	assert_int_equal(x->f.calls, 0);
	r.n_keys = 2;
	r.xport = KVFS_CLIENT_XPORT_RW;
	assert_int_equal(kvfs_client_call(x->c, &r, &b), 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_RW);
	r.xport = KVFS_CLIENT_XPORT_IOCTL;
	assert_int_equal(kvfs_client_call(x->c, &r, &b), 0);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(x->f.cap, KVFS_CTL_MSG_SIZE);
}

/* With a mount, token requests learn block_tokens from the xattrs. */
static void test_ns_info_and_token_bound(void **state)
{
	char dir[] = "/tmp/kvfs-test-libkvfs.XXXXXX", path[128];
	static const char geom[] = "layers=4 kv_heads=2 head_dim=64 "
				   "dtype=bf16 block_tokens=16 "
				   "chunk_tokens=4 hidden_size=0\n";
	static uint32_t toks[1000];
	uint8_t root[KVFS_KEY_LEN];
	char hex[KVFS_KEY_HEX_LEN + 2];
	struct kvfs_client_blocks b;
	struct kvfs_client_ns ns;
	struct kvfs_client *c;
	struct fake f = { 0 };

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/%s", dir, NS);
	assert_int_equal(mkdir(path, 0755), 0);
	kvfs_client_root_key(NS, NULL, root);
	kvfs_fmt_key_hex(root, hex);
	strcat(hex, "\n");
	if (setxattr(path, "user.kvfs.root", hex, strlen(hex), 0) ||
	    setxattr(path, "user.kvfs.geometry", geom, strlen(geom), 0)) {
		rmdir(path);
		rmdir(dir);
		skip(); /* no user xattrs on this file system */
	}
	assert_int_equal(kvfs_client_open_xport(dir, &fake_ops, &f, &c), 0);
	assert_int_equal(kvfs_client_ns_info(c, NS, &ns), 0);
	assert_memory_equal(ns.root, root, KVFS_KEY_LEN);
	assert_int_equal(ns.geom.n_layers, 4);
	assert_int_equal(ns.geom.n_kv_heads, 2);
	assert_int_equal(ns.geom.head_dim, 64);
	assert_int_equal(ns.geom.dtype, KVFS_DTYPE_BF16);
	assert_int_equal(ns.geom.block_tokens, 16);
	assert_int_equal(ns.geom.chunk_tokens, 4);
	assert_int_equal(kvfs_client_ns_info(c, "other", &ns), -ENOENT);
	assert_int_equal(kvfs_client_ns_info(c, "a/b", &ns), -EINVAL);

	/* 1000 tokens = 62 blocks: request and answer fit an ioctl */
	fake_resp(&f, KVFS_CTL_LOOKUP, 0);
	assert_int_equal(kvfs_client_lookup_tokens(c, NS, toks, 1000, 0, &b),
			 0);
	assert_int_equal(f.how, KVFS_CLIENT_XPORT_IOCTL);
	/* an answer with more blocks than the tokens make is refused */
	fake_resp(&f, KVFS_CTL_LOOKUP, 63);
	assert_int_equal(kvfs_client_lookup_tokens(c, NS, toks, 1000, 0, &b),
			 -EPROTO);
	kvfs_client_close(c);

	/* the cache: changing the xattr afterwards changes nothing */
	assert_int_equal(kvfs_client_open_xport(dir, &fake_ops, &f, &c), 0);
	assert_int_equal(setxattr(path, "user.kvfs.geometry", "layers=x", 8,
				  0), 0);
	assert_int_equal(kvfs_client_ns_info(c, NS, &ns), -EINVAL);
	assert_int_equal(setxattr(path, "user.kvfs.geometry", geom,
				  strlen(geom), 0), 0);
	assert_int_equal(kvfs_client_ns_info(c, NS, &ns), 0);
	assert_int_equal(setxattr(path, "user.kvfs.geometry", "layers=x", 8,
				  0), 0);
	assert_int_equal(kvfs_client_ns_info(c, NS, &ns), 0);
	assert_int_equal(ns.geom.block_tokens, 16);
	kvfs_client_close(c);
	free(f.req);
	rmdir(path);
	rmdir(dir);
}

/* ------------------------------------------------------------- responses */

static void test_call_lookup_response(void **state)
{
	struct fx *x = *state;
	uint8_t keys[3][KVFS_KEY_LEN];
	struct kvfs_client_blocks b;
	struct kvfs_ctl_resp *h;

	make_keys(keys, 3);
	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 3);
	h->n_cached = 2;
	for (uint32_t i = 0; i < 3; i++) {
		memcpy(fake_block(&x->f, i)->key, keys[i], KVFS_KEY_LEN);
		fake_block(&x->f, i)->tiers = i < 2 ? 1u << i : 0;
	}
	assert_int_equal(kvfs_client_lookup(x->c, NS,
					    (const uint8_t(*)[16])keys, 3,
					    KVFS_CTL_F_ACCESS, &b), 0);
	assert_int_equal(sent(&x->f)->flags, KVFS_CTL_F_ACCESS);
	assert_int_equal(b.resp.n_cached, 2);
	assert_int_equal(b.resp.n_blocks, 3);
	assert_non_null(b.blocks);
	assert_null(b.data);
	assert_memory_equal(b.blocks[2].key, keys[2], KVFS_KEY_LEN);
	assert_int_equal(b.blocks[1].tiers, 2);
	kvfs_client_blocks_release(&b);
	assert_null(b.blocks);
	kvfs_client_blocks_release(NULL);
}

static void test_call_daemon_error(void **state)
{
	struct fx *x = *state;
	uint8_t keys[1][KVFS_KEY_LEN] = { { 1 } };
	struct kvfs_client_blocks b;

	fake_resp(&x->f, KVFS_CTL_FETCH, 0)->error = -ENOENT;
	assert_int_equal(kvfs_client_fetch(x->c, NS, (const uint8_t(*)[16])keys,
					   1, &b), -ENOENT);
	assert_int_equal(b.resp.error, -ENOENT);
	assert_null(b.blocks);
	assert_null(b.data);
	/* a transport error comes back as is */
	x->f.err = -ENOTTY;
	assert_int_equal(kvfs_client_fetch(x->c, NS, (const uint8_t(*)[16])keys,
					   1, &b), -ENOTTY);
	x->f.err = 0;
	/* pin/evict/release/stats answers */
	fake_resp(&x->f, KVFS_CTL_EVICT, 0)->error = -EBUSY;
	assert_int_equal(kvfs_client_evict(x->c, NS, (const uint8_t(*)[16])keys,
					   1, KVFS_CLIENT_TIER_ALL), -EBUSY);
	assert_int_equal(sent(&x->f)->tier, 3);
	fake_resp(&x->f, KVFS_CTL_RELEASE, 0);
	assert_int_equal(kvfs_client_release(x->c, NULL, NULL, 0), 0);
	assert_int_equal(sent(&x->f)->n_keys, 0);
	fake_resp(&x->f, KVFS_CTL_STATS, 0)->stats.leases = 42;
	{
		struct kvfs_ctl_stats st;

		assert_int_equal(kvfs_client_stats(x->c, NS, &st), 0);
		assert_int_equal(st.leases, 42);
		assert_string_equal(sent(&x->f)->ns, NS);
	}
}

/* Every way a response can break the ABI gives -EPROTO, never a crash. */
static void test_call_bad_responses(void **state)
{
	struct fx *x = *state;
	uint8_t keys[2][KVFS_KEY_LEN] = { { 1 }, { 2 } };
	const uint8_t(*k)[16] = (const uint8_t(*)[16])keys;
	struct kvfs_client_blocks b;
	struct kvfs_ctl_resp *h;

	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	h->magic ^= 1;
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	h->abi = 2;
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	fake_resp(&x->f, KVFS_CTL_FETCH, 0); /* another op's answer */
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	fake_resp(&x->f, KVFS_CTL_LOOKUP, 3); /* more blocks than keys */
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 2);
	h->size += 1; /* size disagrees with n_blocks */
	x->f.resp_len = h->size;
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 2);
	x->f.resp_len = h->size - 1; /* truncated */
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	x->f.resp_len = 100; /* shorter than a header */
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	h->error = 5; /* positive */
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	h = fake_resp(&x->f, KVFS_CTL_LOOKUP, 0);
	h->error = -100000;
	assert_int_equal(kvfs_client_lookup(x->c, NS, k, 2, 0, &b), -EPROTO);
	assert_null(b.blocks);
}

/* FETCH on shm: pointers into the pool, mapped read-only; blocks outside
 * the pool are refused.
 */
static void test_fetch_shm_pointers(void **state)
{
	struct fx *x = *state;
	uint8_t keys[2][KVFS_KEY_LEN] = { { 1 }, { 2 } };
	const uint8_t(*k)[16] = (const uint8_t(*)[16])keys;
	struct kvfs_client_peer pool; /* stands in for the daemon's pool */
	struct kvfs_client_blocks b;
	struct kvfs_ctl_resp *h;

	assert_int_equal(kvfs_client_peer_init(&pool, 1 << 16), 0);
	for (uint32_t i = 0; i < 1 << 16; i++)
		pool.base[i] = (uint8_t)(i * 13 + 5);
	h = fake_resp(&x->f, KVFS_CTL_FETCH, 2);
	h->pool = pool.mem;
	h->n_cached = 2;
	fake_block(&x->f, 0)->pool_off = 4096;
	fake_block(&x->f, 0)->len = 100;
	fake_block(&x->f, 1)->pool_off = 60000;
	fake_block(&x->f, 1)->len = 65536 - 60000;
	assert_int_equal(kvfs_client_fetch(x->c, NS, k, 2, &b), 0);
	assert_non_null(b.data);
	assert_memory_equal(b.data[0], pool.base + 4096, 100);
	assert_memory_equal(b.data[1], pool.base + 60000, 5536);
	/* the client's own mapping, not the pool's writable one */
	assert_ptr_not_equal(b.data[0], pool.base + 4096);
	/* later writes to the pool show through the mapping */
	pool.base[4096] ^= 0xff;
	assert_int_equal(b.data[0][0], pool.base[4096]);
	kvfs_client_blocks_release(&b);

	/* one byte past the end */
	fake_block(&x->f, 1)->len = 65536 - 60000 + 1;
	assert_int_equal(kvfs_client_fetch(x->c, NS, k, 2, &b), -EPROTO);
	assert_null(b.data);
	fake_block(&x->f, 1)->pool_off = UINT64_MAX;
	fake_block(&x->f, 1)->len = 2;
	assert_int_equal(kvfs_client_fetch(x->c, NS, k, 2, &b), -EPROTO);
	fake_block(&x->f, 1)->pool_off = 0;
	/* a pool name that does not exist */
	h->pool.shm_name[1] ^= 1;
	assert_int_equal(kvfs_client_fetch(x->c, NS, k, 2, &b), -ENOENT);
	/* cuda: no pointers, offsets only */
	h->pool.backend = KVFS_CTL_BACKEND_CUDA;
	assert_int_equal(kvfs_client_fetch(x->c, NS, k, 2, &b), 0);
	assert_null(b.data);
	assert_int_equal(b.blocks[0].pool_off, 4096);
	kvfs_client_blocks_release(&b);
	kvfs_client_peer_release(&pool);
}

static void save_hook(struct fake *f)
{
	const struct kvfs_ctl_req *r = sent(f);
	struct kvfs_ctl_resp *h = fake_resp(f, KVFS_CTL_SAVE, 0);

	kvfs_fmt_block_key(r->parent, (const uint32_t *)(f->req + 384),
			   r->n_tokens, h->key);
}

static void test_save(void **state)
{
	struct fx *x = *state;
	uint8_t root[KVFS_KEY_LEN], key[KVFS_KEY_LEN], want[KVFS_KEY_LEN];
	uint32_t toks[16];
	struct kvfs_ctl_mem peer = {
		.backend = KVFS_CTL_BACKEND_SHM, .size = 1 << 20,
		.shm_name = "/p",
	};

	for (uint32_t i = 0; i < 16; i++)
		toks[i] = i + 40;
	kvfs_client_root_key(NS, NULL, root);
	kvfs_fmt_block_key(root, toks, 16, want);
	x->f.hook = save_hook;
	assert_int_equal(kvfs_client_save(x->c, NS, root, 0, toks, 16, &peer,
					  8192, key), 0);
	assert_memory_equal(key, want, KVFS_KEY_LEN);
	assert_int_equal(sent(&x->f)->src_off, 8192);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_IOCTL);
	/* a daemon that names another key */
	x->f.hook = NULL;
	fake_resp(&x->f, KVFS_CTL_SAVE, 0)->key[3] = 1;
	assert_int_equal(kvfs_client_save(x->c, NS, root, 0, toks, 16, &peer,
					  8192, key), -EPROTO);
	fake_resp(&x->f, KVFS_CTL_SAVE, 0)->error = -EEXIST;
	assert_int_equal(kvfs_client_save(x->c, NS, root, 0, toks, 16, &peer,
					  8192, NULL), -EEXIST);
}

/* ------------------------------------------------------ peers and syncs */

static void test_peer_and_sync_objects(void **state)
{
	struct kvfs_client_peer p;
	struct kvfs_client_sync s;
	char path[128];
	struct stat st;

	(void)state;
	assert_int_equal(kvfs_client_peer_init(&p, 12345), 0);
	assert_int_equal(p.mem.backend, KVFS_CTL_BACKEND_SHM);
	assert_int_equal(p.mem.size, 12345);
	assert_int_equal(strncmp(p.mem.shm_name, "/kvfs-peer-", 11), 0);
	snprintf(path, sizeof(path), "/dev/shm%s", p.mem.shm_name);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 12345);
	assert_int_equal(st.st_mode & 0777, 0600);
	p.base[12344] = 7; /* writable to the end */
	kvfs_client_peer_release(&p);
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(errno, ENOENT);
	kvfs_client_peer_release(&p); /* twice is harmless */

	assert_int_equal(kvfs_client_sync_init(&s), 0);
	assert_int_equal(s.desc.off, 0);
	assert_int_equal(kvfs_client_sync_load(&s), 0);
	snprintf(path, sizeof(path), "/dev/shm%s", s.desc.shm_name);
	assert_int_equal(stat(path, &st), 0);
	kvfs_client_sync_release(&s);
	assert_int_equal(stat(path, &st), -1);
	kvfs_client_sync_release(&s);
}

static bool shm_exists(const char *name)
{
	char path[KVFS_CTL_NAME_MAX + 16];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm%s", name);
	return stat(path, &st) == 0;
}

/*
 * A process that dies holding a peer and a sync word leaves both in
 * /dev/shm; the next peer, then the next sync word, made here removes
 * them.  A live process's peer stays, and so does an object named after
 * the dead process that a live one holds locked (its creator in another
 * PID namespace), until that one exits too.
 */
static void test_shm_left_by_dead_process(void **state)
{
	char dead_peer[KVFS_CTL_NAME_MAX], dead_sync[KVFS_CTL_NAME_MAX];
	char live_peer[KVFS_CTL_NAME_MAX], held[KVFS_CTL_NAME_MAX];
	struct kvfs_client_peer p;
	struct kvfs_client_sync s;
	int out[2], go[2], status;
	pid_t dead, live;
	char c = 0;

	(void)state;
	assert_int_equal(pipe(out), 0);
	dead = fork();
	assert_true(dead >= 0);
	if (!dead) {
		/* made, then never released: as if killed */
		if (kvfs_client_peer_init(&p, 4096) ||
		    kvfs_client_sync_init(&s) ||
		    write(out[1], p.mem.shm_name, KVFS_CTL_NAME_MAX) !=
			    KVFS_CTL_NAME_MAX ||
		    write(out[1], s.desc.shm_name, KVFS_CTL_NAME_MAX) !=
			    KVFS_CTL_NAME_MAX)
			_exit(1);
		_exit(0);
	}
	assert_int_equal(read(out[0], dead_peer, sizeof(dead_peer)),
			 sizeof(dead_peer));
	assert_int_equal(read(out[0], dead_sync, sizeof(dead_sync)),
			 sizeof(dead_sync));
	assert_int_equal(waitpid(dead, &status, 0), dead);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_true(shm_exists(dead_peer) && shm_exists(dead_sync));

	snprintf(held, sizeof(held), "/kvfs-peer-%ld-77", (long)dead);
	assert_int_equal(pipe(go), 0);
	live = fork();
	assert_true(live >= 0);
	if (!live) {
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
		int fd = shm_open(held, O_RDWR | O_CREAT | O_EXCL, 0600);

		if (fd < 0 || fcntl(fd, F_OFD_SETLK, &fl) ||
		    kvfs_client_peer_init(&p, 4096) ||
		    write(out[1], p.mem.shm_name, KVFS_CTL_NAME_MAX) !=
			    KVFS_CTL_NAME_MAX ||
		    read(go[0], &c, 1) != 1)
			_exit(1);
		kvfs_client_peer_release(&p);
		_exit(0);
	}
	assert_int_equal(read(out[0], live_peer, sizeof(live_peer)),
			 sizeof(live_peer));

	assert_int_equal(kvfs_client_peer_init(&p, 4096), 0);
	assert_false(shm_exists(dead_peer));
	assert_true(shm_exists(dead_sync)); /* another kind */
	assert_true(shm_exists(live_peer));
	assert_true(shm_exists(held));
	assert_int_equal(kvfs_client_sync_init(&s), 0);
	assert_false(shm_exists(dead_sync));

	assert_int_equal(write(go[1], &c, 1), 1);
	assert_int_equal(waitpid(live, &status, 0), live);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_false(shm_exists(live_peer));
	assert_true(shm_exists(held));
	/* its holder gone, the held one goes with the next sweep */
	assert_true(kvfs_client_shm_sweep("peer") >= 1);
	assert_false(shm_exists(held));
	assert_int_equal(kvfs_client_shm_sweep("a-kind-far-too-long-for-a-name"),
			 -EINVAL);

	kvfs_client_peer_release(&p);
	kvfs_client_sync_release(&s);
	close(out[0]);
	close(out[1]);
	close(go[0]);
	close(go[1]);
}

static void test_wait_layer_values(void **state)
{
	struct kvfs_client_sync s;

	(void)state;
	assert_int_equal(kvfs_client_sync_init(&s), 0);
	*s.word = 3;
	assert_int_equal(kvfs_client_wait_layer(&s, 0, 0), 0);
	assert_int_equal(kvfs_client_wait_layer(&s, 2, 0), 0);
	assert_int_equal(kvfs_client_wait_layer(&s, 3, 0), -ETIMEDOUT);
	assert_int_equal(kvfs_client_wait_layer(&s, 3, 1000000), -ETIMEDOUT);
	/* failed at layer 2: layers 0 and 1 were done */
	*s.word = KVFS_CTL_SYNC_FAILED | 2;
	assert_int_equal(kvfs_client_wait_layer(&s, 1, 0), 0);
	assert_int_equal(kvfs_client_wait_layer(&s, 2, -1), -EIO);
	assert_int_equal(kvfs_client_wait_layer(&s, 30, -1), -EIO);
	kvfs_client_sync_reset(&s);
	assert_int_equal(kvfs_client_sync_load(&s), 0);
	kvfs_client_sync_release(&s);
}

/*
 * A fake daemon that behaves like the real one for FETCH_INTO: opens the
 * caller's peer and sync word by name, copies layer by layer, and after
 * each layer stores the count and wakes waiters. Layer l of block i is
 * filled with the byte (i * 16 + l).
 */
#define FI_LAYERS 6
#define FI_LB 1000u

struct fi_gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t allowed;       /* layers the copier may do; guarded by lock */
};

static struct fi_gate gate = {
	PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0,
};

static void fi_hook(struct fake *f)
{
	const struct kvfs_ctl_req *r = sent(f);
	const uint64_t *dst = (const uint64_t *)(f->req + 384 + 16 * r->n_keys);
	struct kvfs_ctl_resp *h;
	uint8_t *peer;
	uint32_t *word;
	int fd;

	fd = shm_open(r->peer.shm_name, O_RDWR, 0);
	assert_true(fd >= 0);
	peer = mmap(NULL, r->peer.size, PROT_READ | PROT_WRITE, MAP_SHARED,
		    fd, 0);
	close(fd);
	fd = shm_open(r->sync.shm_name, O_RDWR, 0);
	assert_true(fd >= 0);
	word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(peer != MAP_FAILED && word != MAP_FAILED);
	for (uint32_t l = 0; l < FI_LAYERS; l++) {
		/* the test lets the copier go one layer at a time */
		pthread_mutex_lock(&gate.lock);
		while (gate.allowed <= l)
			pthread_cond_wait(&gate.cond, &gate.lock);
		pthread_mutex_unlock(&gate.lock);
		for (uint32_t i = 0; i < r->n_keys; i++)
			memset(peer + dst[i] + l * FI_LB, (int)(i * 16 + l),
			       FI_LB);
		__atomic_store_n(word, l + 1, __ATOMIC_RELEASE);
		syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
	}
	h = fake_resp(f, KVFS_CTL_FETCH_INTO, r->n_keys);
	for (uint32_t i = 0; i < r->n_keys; i++) {
		fake_block(f, i)->len = FI_LAYERS * FI_LB;
		fake_block(f, i)->layer_bytes = FI_LB;
	}
	h->n_cached = r->n_keys;
	munmap(peer, r->peer.size);
	munmap(word, 4096);
}

static void test_fetch_into_per_layer(void **state)
{
	struct fx *x = *state;
	uint8_t keys[3][KVFS_KEY_LEN];
	uint64_t dst[3] = { 2 * FI_LAYERS * FI_LB, 0, 7 * FI_LAYERS * FI_LB };
	struct kvfs_client_peer p;
	struct kvfs_client_sync s;
	struct kvfs_client_blocks b;
	struct kvfs_client_job *job;

	make_keys(keys, 3);
	assert_int_equal(kvfs_client_peer_init(&p, 8 * FI_LAYERS * FI_LB), 0);
	assert_int_equal(kvfs_client_sync_init(&s), 0);
	*s.word = 99; /* a stale count from an earlier request */
	x->f.hook = fi_hook;
	gate.allowed = 0;
	assert_int_equal(kvfs_client_fetch_into_start(x->c, NS,
						      (const uint8_t(*)[16])keys,
						      3, &p.mem, dst, &s,
						      &job), 0);
	/* the stale count was cleared before the copier started */
	assert_int_equal(kvfs_client_wait_layer(&s, 0, 0), -ETIMEDOUT);
	for (uint32_t l = 0; l < FI_LAYERS; l++) {
		pthread_mutex_lock(&gate.lock);
		gate.allowed = l + 1;
		pthread_cond_broadcast(&gate.cond);
		pthread_mutex_unlock(&gate.lock);
		assert_int_equal(kvfs_client_wait_layer(&s, l, -1), 0);
		/* layer l of every block is there; layer l + 1 is not yet */
		for (uint32_t i = 0; i < 3; i++) {
			const uint8_t *d = p.base + dst[i] + l * FI_LB;

			assert_int_equal(d[0], i * 16 + l);
			assert_int_equal(d[FI_LB - 1], i * 16 + l);
			if (l + 1 < FI_LAYERS)
				assert_int_equal(d[FI_LB], 0);
		}
		if (l + 1 < FI_LAYERS)
			assert_int_equal(kvfs_client_wait_layer(&s, l + 1, 0),
					 -ETIMEDOUT);
	}
	assert_int_equal(kvfs_client_job_join(job, &b), 0);
	assert_int_equal(b.resp.n_blocks, 3);
	assert_int_equal(b.blocks[1].layer_bytes, FI_LB);
	assert_int_equal(sent(&x->f)->n_dst, 3);
	assert_int_equal(x->f.how, KVFS_CLIENT_XPORT_IOCTL);
	kvfs_client_blocks_release(&b);
	kvfs_client_sync_release(&s);
	kvfs_client_peer_release(&p);
}

/* ------------------------------------------------ the default transport */

/*
 * A mount point whose .kvfs/ctl is a plain file: ioctl is ENOTTY, and the
 * write-then-read path reads back its own request, which is no response.
 */
static void test_plain_file_ctl(void **state)
{
	char dir[] = "/tmp/kvfs-test-libkvfs.XXXXXX", path[128];
	static uint8_t keys[300][KVFS_KEY_LEN];
	struct kvfs_client_blocks b;
	struct kvfs_client *c;
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	assert_int_equal(kvfs_client_open(dir, &c), -ENOENT);
	snprintf(path, sizeof(path), "%s/.kvfs", dir);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/.kvfs/ctl", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(kvfs_client_open(dir, &c), 0);
	assert_int_equal(kvfs_client_lookup(c, NS, (const uint8_t(*)[16])keys,
					    1, 0, &b), -ENOTTY);
	assert_int_equal(kvfs_client_last_xport(c), KVFS_CLIENT_XPORT_IOCTL);
	assert_int_equal(kvfs_client_lookup(c, NS, (const uint8_t(*)[16])keys,
					    300, 0, &b), -EPROTO);
	assert_int_equal(kvfs_client_last_xport(c), KVFS_CLIENT_XPORT_RW);
	kvfs_client_close(c);
	unlink(path);
	snprintf(path, sizeof(path), "%s/.kvfs", dir);
	rmdir(path);
	rmdir(dir);
}

static void test_sizeof(void **state)
{
	(void)state;
	assert_int_equal(kvfs_client_sizeof(KVFS_CLIENT_S_BLOCKS),
			 sizeof(struct kvfs_client_blocks));
	assert_int_equal(kvfs_client_sizeof(KVFS_CLIENT_S_REQ),
			 sizeof(struct kvfs_client_req));
	assert_int_equal(kvfs_client_sizeof(0), 0);
	assert_int_equal(kvfs_client_sizeof(99), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_root_key),
		cmocka_unit_test(test_chain_known_values),
		cmocka_unit_test(test_chain_matches_fmt),
		cmocka_unit_test(test_chain_continues),
		cmocka_unit_test(test_chain_errors),
		cmocka_unit_test(test_encode_lookup),
		cmocka_unit_test(test_encode_tokens),
		cmocka_unit_test(test_encode_fetch_into),
		cmocka_unit_test(test_encode_save_and_tier),
		cmocka_unit_test(test_req_check_errors),
		cmocka_unit_test_setup_teardown(test_wrapper_errors, fx_setup,
						fx_teardown),
		cmocka_unit_test(test_xport_pick),
		cmocka_unit_test(test_resp_bound),
		cmocka_unit_test_setup_teardown(test_call_transport_by_size,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_call_forced, fx_setup,
						fx_teardown),
		cmocka_unit_test(test_ns_info_and_token_bound),
		cmocka_unit_test_setup_teardown(test_call_lookup_response,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_call_daemon_error,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_call_bad_responses,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_fetch_shm_pointers,
						fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_save, fx_setup,
						fx_teardown),
		cmocka_unit_test(test_peer_and_sync_objects),
		cmocka_unit_test(test_shm_left_by_dead_process),
		cmocka_unit_test(test_wait_layer_values),
		cmocka_unit_test_setup_teardown(test_fetch_into_per_layer,
						fx_setup, fx_teardown),
		cmocka_unit_test(test_plain_file_ctl),
		cmocka_unit_test(test_sizeof),
	};

	/* the refusals log by design; keep the output to the results */
	kvfs_log_set_level(KVFS_LOG_ERR - 1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
