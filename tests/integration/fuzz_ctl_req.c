/* SPDX-License-Identifier: MIT */
/*
 * Requests for .kvfs/ctl, drawn and mutated (fuzz_ctl_i.h says what each
 * function promises).  Each field is drawn mostly from what the daemon
 * knows (the seeded keys and chains, our shm objects, the geometry) and
 * otherwise from boundary values, so that requests get past the first
 * checks and reach the code behind them.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "meta/fmt.h"
#include "meta/kvfs_ctl.h"
#include "fuzz_ctl_i.h"

static struct kvfs_ctl_req *rq_hdr(struct rq *q)
{
	return (struct kvfs_ctl_req *)q->b;
}

static void pick_ns(struct rng *r, struct rq *q, bool may_be_empty)
{
	struct kvfs_ctl_req *h = rq_hdr(q);
	unsigned m = below(r, 20);

	memset(h->ns, 0, sizeof(h->ns));
	q->ns_ok = false;
	if (m < 15 || q->precise) {
		snprintf(h->ns, sizeof(h->ns), "%s", ns);
		q->ns_ok = true;
	} else if (m < 16 && may_be_empty) {
		/* "" */
	} else if (m < 17) {
		snprintf(h->ns, sizeof(h->ns), "%s%s", ns, ns);
	} else if (m < 18) {
		memset(h->ns, 'z', sizeof(h->ns) - 1);
	} else {
		for (size_t i = 0; i + 1 < sizeof(h->ns) && chance(r, 90); i++)
			h->ns[i] = (char)(1 + below(r, 255));
		q->ns_ok = !strcmp(h->ns, ns);
	}
}

static void pick_mem(struct rng *r, struct kvfs_ctl_mem *m, struct rq *q)
{
	unsigned k = below(r, 12);

	memset(m, 0, sizeof(*m));
	m->backend = KVFS_CTL_BACKEND_SHM;
	q->mem = MEM_BAD;
	if (q->precise)
		k = 0;
	if (k < 6) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", peer_name);
		m->size = PEER_SIZE;
		q->mem = MEM_PEER;
		if (k == 5) {
			/* a smaller view of the same object */
			m->size = 1 + below(r, PEER_SIZE);
			q->mem = MEM_BAD; /* no data check: may not fit */
		}
	} else if (k == 6) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", sync_name);
		m->size = SYNC_SIZE;
		q->mem = MEM_SYNCOBJ;
	} else if (k == 7) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", peer_name);
		m->size = edge64(r);
	} else if (k == 8) {
		static const char *const names[] = {
			"", "noslash", "/a/b", "/kvfs-fuzz-nonexistent", "/",
			"//", "/..", "/.",
		};
		snprintf(m->shm_name, sizeof(m->shm_name), "%s",
			 names[below(r, sizeof(names) / sizeof(names[0]))]);
		m->size = 4096;
	} else if (k == 9) {
		memset(m->shm_name, 'a', sizeof(m->shm_name));
		m->shm_name[0] = '/';
		m->size = 4096;
	} else if (k == 10) {
		snprintf(m->shm_name, sizeof(m->shm_name), "%s", peer_name);
		m->size = PEER_SIZE;
		m->backend = chance(r, 50) ? below(r, 4) : (uint32_t)rnd(r);
		m->device = chance(r, 50) ? 0 : (uint32_t)rnd(r);
		if (m->backend == KVFS_CTL_BACKEND_SHM && !m->device)
			q->mem = MEM_PEER;
	} else {
		fill(r, m, sizeof(*m));
	}
}

static void pick_sync(struct rng *r, struct kvfs_ctl_sync *s, struct rq *q,
		      bool may_be_empty)
{
	static const uint64_t offs[] = {
		0, 4, 8, SYNC_SIZE - 8, SYNC_SIZE - 4, SYNC_SIZE - 3,
		SYNC_SIZE - 2, SYNC_SIZE, SYNC_SIZE + 4, 1ull << 32,
		1ull << 62, UINT64_MAX - 7, UINT64_MAX - 3, UINT64_MAX,
		UINT64_MAX - 4095,
	};
	unsigned k = below(r, 10);

	memset(s, 0, sizeof(*s));
	q->sync_ours = false;
	q->sync_outside = false;
	if (q->precise)
		k = chance(r, 30) ? 0 : 1;
	if (k == 0 && may_be_empty)
		return;
	if (k < 7) {
		snprintf(s->shm_name, sizeof(s->shm_name), "%s", sync_name);
		s->off = chance(r, q->precise ? 80 : 60)
				 ? 4ull * below(r, SYNC_SIZE / 4)
				       : offs[below(r, sizeof(offs) /
							 sizeof(offs[0]))];
		q->sync_ours = s->off <= SYNC_SIZE - 4 && !(s->off & 3);
		q->sync_outside = !q->sync_ours;
	} else if (k == 7) {
		snprintf(s->shm_name, sizeof(s->shm_name), "%s",
			 chance(r, 50) ? "nosuch" : "/kvfs-fuzz-nosuch");
	} else if (k == 8) {
		memset(s->shm_name, 'b', sizeof(s->shm_name));
		s->shm_name[0] = '/';
	} else {
		fill(r, s, sizeof(*s));
	}
}

/* Keys for a request; *@chain_seed says whether they are one seed's whole
 * chain, in order. @protect: no seeded key (the request may delete).
 */
static uint32_t pick_keys(struct rng *r, uint8_t (*k)[16], uint32_t cap,
			  int *chain_seed, bool protect, bool precise)
{
	unsigned m = precise ? below(r, 3) : below(r, 10);
	uint32_t n;

	*chain_seed = -1;
	if (protect || !n_seeds)
		m = 5 + below(r, 5);
	if (m < 5) {
		int s = (int)below(r, (uint32_t)n_seeds);
		uint32_t len = (uint32_t)seeds[s].chain_len;

		n = m < 3 ? len : 1 + below(r, len + 2);
		if (n > cap)
			n = cap;
		for (uint32_t i = 0; i < n; i++) {
			if (i < len)
				memcpy(k[i], seeds[seeds[s].chain[i]].key, 16);
			else
				fill(r, k[i], 16);
		}
		if (n == len) {
			/* the chain of its last block */
			*chain_seed = seeds[s].chain[len - 1];
		}
		if (m == 4 && n > 1) {
			/* with a duplicate */
			uint32_t to = below(r, n), from = below(r, n);

			memcpy(k[to], k[from], 16);
			*chain_seed = -1;
		}
		return n;
	}
	if (m < 8) {
		n = below(r, 9);
	} else if (m == 8) {
		n = chance(r, 50) ? IOC_MAX_BLOCKS + below(r, 3) - 1
				  : 100 + below(r, 400);
	} else {
		n = below(r, 4);
		if (n > cap)
			n = cap;
		memset(k, chance(r, 50) ? 0 : 0xff, (size_t)n * 16);
		return n;
	}
	if (n > cap)
		n = cap;
	fill(r, k, (size_t)n * 16);
	if (!protect && n_seeds && n && chance(r, 30)) {
		uint32_t at = below(r, n);

		memcpy(k[at], seeds[below(r, (uint32_t)n_seeds)].key, 16);
	}
	return n;
}

/* Token ids: a seed chain's (whole blocks, maybe plus a partial), random,
 * or the largest count a request can carry.
 */
static uint32_t pick_tokens(struct rng *r, uint32_t *t, uint32_t cap,
			    int *chain_seed, bool protect, bool precise)
{
	unsigned m = precise ? below(r, 4) : below(r, 10);
	uint32_t n;

	*chain_seed = -1;
	if (protect || !n_seeds)
		m = 4 + below(r, 6);
	if (m < 4) {
		int s = (int)below(r, (uint32_t)n_seeds);
		uint32_t len = (uint32_t)seeds[s].chain_len, bt = g.block_tokens;

		n = len * bt + (m == 3 ? below(r, bt) : 0);
		if (n > cap)
			n = cap;
		for (uint32_t i = 0; i < n; i++)
			t[i] = i / bt < len ? seeds[seeds[s].chain[i / bt]]
						      .tok[i % bt]
					    : (uint32_t)rnd(r);
		if (n / bt == len)
			*chain_seed = seeds[s].chain[len - 1];
		return n;
	}
	if (m < 9) {
		n = below(r, 5 * g.block_tokens);
	} else {
		/* the whole 1 MiB, or near it */
		n = (KVFS_CTL_MAX_SIZE - REQ_HDR) / 4 - below(r, 2);
	}
	if (n > cap)
		n = cap;
	for (uint32_t i = 0; i < n; i++)
		t[i] = (uint32_t)rnd(r);
	return n;
}

/* @n distinct values below @all (n <= all), in random order. */
static void pick_distinct(struct rng *r, uint32_t *out, uint32_t n,
			  uint32_t all)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v = below(r, all);

		for (uint32_t j = 0; j < i; j++)
			if (out[j] == v) {
				v = (v + 1) % all;
				j = (uint32_t)-1; /* from the start */
			}
		out[i] = v;
	}
}

static bool is_chunk_op(uint16_t op)
{
	return op == KVFS_CTL_FETCH_CHUNKS || op == KVFS_CTL_SCORES;
}

/*
 * A well-formed request of @op (every rule of check_req()'s contract in
 * meta/kvfs_ctl.h holds), with fields drawn from real keys, our shm objects
 * and boundary values. @cap bounds its size.
 */
void build_req(struct rng *r, struct rq *q, uint16_t op, size_t cap)
{
	struct kvfs_ctl_req *h = rq_hdr(q);
	uint32_t maxk = (uint32_t)((cap - REQ_HDR) / 24);
	uint32_t maxt = (uint32_t)((cap - REQ_HDR) / 4);
	uint8_t (*keys)[16] = (void *)(q->b + REQ_HDR);
	int cs = -1;
	bool protect;

	memset(h, 0, sizeof(*h));
	q->malformed = false;
	q->why[0] = 0;
	q->op = op;
	q->nk = 0;
	q->chain_seed = -1;
	q->mem = MEM_BAD;
	q->sync_ours = false;
	q->sync_outside = false;
	h->magic = KVFS_CTL_MAGIC;
	h->abi = KVFS_CTL_ABI;
	h->op = op;
	pick_ns(r, q, op == KVFS_CTL_STATS || op == KVFS_CTL_RELEASE);
	/* EVICT from the SSD (tier 2) or everywhere (3) deletes: never a
	 * seeded block.
	 */
	if (op == KVFS_CTL_EVICT || op == KVFS_CTL_PIN ||
	    op == KVFS_CTL_UNPIN || op == KVFS_CTL_PREFETCH)
		h->tier = below(r, 4);
	protect = op == KVFS_CTL_EVICT && h->tier >= 2;

	switch (op) {
	case KVFS_CTL_FETCH_INTO:
	case KVFS_CTL_FETCH_CHUNKS:
	case KVFS_CTL_SCORES:
		h->n_keys = pick_keys(r, keys, maxk, &cs, protect, q->precise);
		if (op != KVFS_CTL_FETCH_INTO && !h->n_keys) {
			memcpy(keys[0], n_seeds ? seeds[0].key : root, 16);
			h->n_keys = 1;
			cs = n_seeds && seeds[0].chain_len == 1 ? 0 : -1;
		}
		break;
	case KVFS_CTL_STATS:
		/* keys or tokens mean nothing to STATS, but are allowed */
		if (chance(r, 70))
			break;
		__attribute__((fallthrough));
	default:
		if (chance(r, q->precise ? 20 : 35)) {
			h->flags |= KVFS_CTL_F_TOKENS;
			h->n_tokens = pick_tokens(r, (uint32_t *)keys, maxt,
						  &cs, protect, q->precise);
		} else {
			h->n_keys = pick_keys(r, keys, maxk, &cs, protect,
					      q->precise);
		}
		break;
	}
	if (op == KVFS_CTL_SAVE) {
		/* SAVE reads its token ids from n_tokens, without F_TOKENS */
		if (chance(r, 80) || q->precise) {
			h->flags &= ~(uint32_t)KVFS_CTL_F_TOKENS;
			h->n_keys = 0;
			h->n_tokens = chance(r, 80) || q->precise
					      ? 1 + below(r, g.block_tokens)
						    : below(r, 3 * g.block_tokens);
			for (uint32_t i = 0; i < h->n_tokens; i++)
				((uint32_t *)keys)[i] = (uint32_t)rnd(r);
		}
		if (chance(r, 50) || !n_seeds) {
			memcpy(h->parent, root, 16);
			h->start_pos = chance(r, 85) || q->precise ? 0 : edge64(r);
		} else if (chance(r, 70)) {
			const struct seedblk *s =
				&seeds[below(r, (uint32_t)n_seeds)];

			memcpy(h->parent, s->key, 16);
			h->start_pos = chance(r, 80) || q->precise
					       ? s->h.start_pos + g.block_tokens
					       : edge64(r);
		} else {
			fill(r, h->parent, 16);
			h->start_pos = chance(r, 50) ? g.block_tokens *
							       (1 + below(r, 9))
						     : edge64(r);
		}
		pick_mem(r, &h->peer, q);
		h->src_off = chance(r, 60) || q->precise ? 4096ull * below(r, 16)
							 : edge64(r);
	}
	if (op == KVFS_CTL_LOOKUP && chance(r, 30))
		h->flags |= KVFS_CTL_F_ACCESS;
	q->nk = h->flags & KVFS_CTL_F_TOKENS ? h->n_tokens / g.block_tokens
					     : h->n_keys;
	q->chain_seed = cs;
	if (h->flags & KVFS_CTL_F_TOKENS && (cs < 0 ||
	    h->n_tokens % g.block_tokens))
		q->chain_seed = -1;

	uint8_t *p = q->b + REQ_HDR + (size_t)h->n_keys * 16 +
		     (size_t)h->n_tokens * 4;

	if (op == KVFS_CTL_FETCH_INTO) {
		struct kvfs_ctl_dst *d = (void *)p;
		uint64_t plen = seeds ? seeds[0].len -
					kvfs_fmt_payload_off(g.block_tokens)
				      : 0;

		h->n_dst = h->n_keys;
		for (uint32_t i = 0; i < h->n_dst; i++)
			d[i].off = chance(r, 85) || q->precise ? plen * i
						 : (chance(r, 50) ? edge64(r) :
						    PEER_SIZE - plen +
							    below(r, 3) - 1);
		pick_mem(r, &h->peer, q);
		pick_sync(r, &h->sync, q, false);
		p += (size_t)h->n_dst * 8;
	}
	if (op == KVFS_CTL_FETCH_CHUNKS) {
		struct kvfs_ctl_dst *d = (void *)p;
		uint32_t per = (g.block_tokens + g.chunk_tokens - 1) /
			       g.chunk_tokens;

		if (chance(r, 30))
			h->flags |= KVFS_CTL_F_POOL;
		if (chance(r, 30))
			h->flags |= KVFS_CTL_F_SPECULATE;
		h->n_dst = h->flags & KVFS_CTL_F_POOL ? 0 : 1;
		if (h->n_dst) {
			d[0].off = chance(r, 80) || q->precise
					   ? 4096ull * below(r, 8)
					   : edge64(r);
			p += 8;
		}
		if (!(h->flags & KVFS_CTL_F_POOL) || chance(r, 10))
			pick_mem(r, &h->peer, q);
		pick_sync(r, &h->sync, q, true);
		if (chance(r, 80) || q->precise) {
			h->layer_first = below(r, g.n_layers);
			h->n_layers = 1 + below(r, g.n_layers - h->layer_first);
		} else {
			h->layer_first = chance(r, 50) ? below(r, g.n_layers + 2)
						       : edge32(r);
			h->n_layers = chance(r, 50) ? 1 + below(r, g.n_layers + 2)
						    : edge32(r);
			if (!h->n_layers)
				h->n_layers = 1;
		}
		h->sub_period = chance(r, 50) ? 0 : below(r, g.n_layers + 2);
		h->n_chunks = 1 + below(r, chance(r, 90) ? 8 : 64);
		if (q->precise) {
			/* distinct chunks of the prefix */
			uint32_t all = per * h->n_keys;

			if (h->n_chunks > all)
				h->n_chunks = all;
			pick_distinct(r, (uint32_t *)p, h->n_chunks, all);
		} else {
			for (uint32_t k = 0; k < h->n_chunks; k++)
				((uint32_t *)p)[k] =
					chance(r, 85)
						? below(r, per * (h->n_keys + 1))
						: edge32(r);
		}
		p += (size_t)h->n_chunks * 4;
	}
	if (op == KVFS_CTL_SCORES) {
		uint32_t per = (g.block_tokens + g.chunk_tokens - 1) /
			       g.chunk_tokens;
		static const float special[] = {
			0.0f, -0.0f, -1.0f, 1e-30f, 1e30f, INFINITY, -INFINITY,
			NAN, 3.5f,
		};

		h->n_chunks = h->n_scores = 1 + below(r, 16);
		if (q->precise) {
			uint32_t all = per * h->n_keys;

			if (h->n_chunks > all)
				h->n_chunks = h->n_scores = all;
			pick_distinct(r, (uint32_t *)p, h->n_chunks, all);
		} else {
			for (uint32_t k = 0; k < h->n_chunks; k++)
				((uint32_t *)p)[k] =
					chance(r, 85)
						? below(r, per * h->n_keys + 1)
						: edge32(r);
		}
		p += (size_t)h->n_chunks * 4;
		for (uint32_t k = 0; k < h->n_scores; k++) {
			unsigned sp = sizeof(special) / sizeof(special[0]);
			float f = chance(r, 70) || q->precise
					  ? (float)below(r, 1000) / 100.0f
					  : special[below(r, sp)];

			memcpy(p + 4 * k, &f, 4);
		}
		p += (size_t)h->n_scores * 4;
	}
	q->len = (size_t)(p - q->b);
	h->size = (uint32_t)q->len;
}

void malform(struct rq *q, const char *why)
{
	q->malformed = true;
	snprintf(q->why, sizeof(q->why), "%s", why);
}

/* A mutation that check_req() or kvfs_ctl_exec() must refuse (the
 * header's list: magic, ABI, size, op, counts, reserved bytes; and its
 * other rules). The size field keeps matching the bytes unless that is the
 * point.
 */
void mutate_bad(struct rng *r, struct rq *q, size_t cap)
{
	struct kvfs_ctl_req *h = rq_hdr(q);

	switch (below(r, 15)) {
	case 0:
		do
			h->magic = (uint32_t)rnd(r);
		while (h->magic == KVFS_CTL_MAGIC);
		malform(q, "magic");
		break;
	case 1:
		h->abi = chance(r, 50) ? 0 : (uint16_t)(2 + below(r, 65534));
		malform(q, "abi");
		break;
	case 2:
		h->size = (uint32_t)q->len + (chance(r, 50) ? 1 + below(r, 64)
							    : -1 - below(r, 64));
		malform(q, "size field");
		break;
	case 3:
		memset(h->ns, chance(r, 50) ? 'x' : 0xff, sizeof(h->ns));
		malform(q, "ns not terminated");
		break;
	case 4:
		/* bits 0..4 are KVFS_CTL_F_* */
		h->flags |= 1u << (5 + below(r, 27));
		malform(q, "unknown flag");
		break;
	case 5:
		h->reserved[below(r, sizeof(h->reserved))] =
			(uint8_t)(1 + below(r, 255));
		malform(q, "reserved byte");
		break;
	case 6: {
		/* a count that no longer matches the size */
		uint32_t *c[] = { &h->n_keys, &h->n_tokens, &h->n_dst,
				  &h->n_chunks, &h->n_scores };
		uint32_t *f = c[below(r, 5)];

		*f = chance(r, 50) ? *f + 1 + below(r, 4) : edge32(r);
		if (h->n_keys * 16ull + h->n_tokens * 4ull + h->n_dst * 8ull +
			    h->n_chunks * 4ull + h->n_scores * 4ull + REQ_HDR ==
		    q->len)
			*f += 1;
		malform(q, "count");
		break;
	}
	case 7:
		/* shorter than the header; the size field says so */
		q->len = 1 + below(r, REQ_HDR - 1);
		if (q->len >= offsetof(struct kvfs_ctl_req, size) + 4)
			h->size = (uint32_t)q->len;
		malform(q, "short");
		break;
	case 8:
		h->tier = 4 + (chance(r, 50) ? below(r, 8) : (uint32_t)rnd(r) / 2);
		malform(q, "tier");
		break;
	case 9:
		if (!is_chunk_op(h->op)) {
			switch (below(r, 3)) {
			case 0: h->layer_first = 1 + below(r, 8); break;
			case 1: h->n_layers = 1 + below(r, 8); break;
			default: h->sub_period = 1 + below(r, 8); break;
			}
			malform(q, "chunk field on another op");
		} else {
			h->flags |= KVFS_CTL_F_ACCESS;
			h->n_chunks = 0;
			h->n_scores = 0;
			h->layer_first = h->n_layers = 0;
			/* counts no longer match */
			h->size = (uint32_t)q->len;
			if (h->n_keys * 16ull + h->n_tokens * 4ull +
				    h->n_dst * 8ull + REQ_HDR == q->len)
				h->n_keys++;
			malform(q, "chunk op without chunks");
		}
		break;
	case 10:
		if (h->op != KVFS_CTL_FETCH_CHUNKS)
			h->flags |= chance(r, 50) ? KVFS_CTL_F_POOL
						  : KVFS_CTL_F_SPECULATE;
		else
			h->flags |= KVFS_CTL_F_TOKENS; /* with keys */
		malform(q, "flag on the wrong op");
		break;
	case 11: {
		/* keys and F_TOKENS together (sizes consistent) */
		if (q->len + 16 > cap) {
			h->abi = 0;
			malform(q, "abi");
			break;
		}
		memmove(q->b + REQ_HDR + 16, q->b + REQ_HDR, q->len - REQ_HDR);
		memset(q->b + REQ_HDR, 0x5a, 16);
		h->n_keys++;
		h->flags |= KVFS_CTL_F_TOKENS;
		q->len += 16;
		h->size = (uint32_t)q->len;
		/* FETCH_INTO: now also a destination short */
		malform(q, "keys with F_TOKENS");
		break;
	}
	case 12:
		/* too many of something, size consistent where it can be */
		h->n_keys = KVFS_CTL_MAX_BLOCKS + 1 + below(r, 4);
		malform(q, "too many keys");
		break;
	case 13:
		h->op = chance(r, 50) ? 0 : (uint16_t)(KVFS_CTL_OP_MAX + 1 +
						       below(r, 65535 -
							     KVFS_CTL_OP_MAX));
		malform(q, "unknown op");
		break;
	default:
		/* garbage with a wrong magic */
		fill(r, q->b, q->len);
		if (h->magic == KVFS_CTL_MAGIC)
			h->magic++;
		malform(q, "garbage");
		break;
	}
}

/* A mutation that keeps the request well-formed: random bytes where the
 * format does not constrain them.
 */
void mutate_ok(struct rng *r, struct rq *q)
{
	struct kvfs_ctl_req *h = rq_hdr(q);
	size_t arr = q->len > REQ_HDR ? q->len - REQ_HDR : 0;

	switch (below(r, 6)) {
	case 0:
		if (arr && !(h->op == KVFS_CTL_EVICT && h->tier >= 2 &&
			     n_seeds)) {
			size_t n = 1 + below(r, 8);

			for (size_t i = 0; i < n; i++)
				q->b[REQ_HDR + below(r, (uint32_t)arr)] ^=
					(uint8_t)(1u << below(r, 8));
			/* the keys may now be anything: no chain */
			q->chain_seed = -1;
		}
		break;
	case 1:
		fill(r, &h->peer, sizeof(h->peer));
		q->mem = MEM_BAD;
		break;
	case 2:
		fill(r, &h->sync, sizeof(h->sync));
		q->sync_ours = false;
		q->sync_outside = false;
		break;
	case 3:
		h->src_off = edge64(r);
		h->start_pos = edge64(r);
		break;
	case 4:
		fill(r, h->parent, 16);
		break;
	default:
		if (is_chunk_op(h->op)) {
			h->layer_first = edge32(r);
			h->n_layers = edge32(r) | 1;
			h->sub_period = edge32(r);
		}
		break;
	}
	if (h->op == KVFS_CTL_EVICT && h->tier >= 2) {
		for (uint32_t i = 0; i < h->n_keys; i++)
			if (seed_of(rq_keys(q)[i]) >= 0)
				h->tier = 1;
		if (h->flags & KVFS_CTL_F_TOKENS)
			h->tier = 1;
	}
}
