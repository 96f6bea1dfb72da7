/* SPDX-License-Identifier: MIT */
/*
 * The checks of .kvfs/ctl responses (fuzz_ctl_i.h says what check_resp()
 * promises): first the form every response must have, then, for what a
 * well-formed request delivered, the bytes themselves against the seeded
 * blocks, read back through the caller's memory or the daemon's pool.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/kvfs_ctl.h"
#include "fuzz_ctl_i.h"

static const int resp_errs[] = {
	0, -ENOENT, -EINVAL, -ENOSPC, -EBUSY, -ENODEV, -E2BIG, -EFAULT,
	-EIO, -EAGAIN, -EBADMSG, -EEXIST, -ENOMEM, -ENAMETOOLONG, -EACCES,
	-EFBIG, -ERANGE, -EMFILE, -ENFILE, -EOVERFLOW,
};

static void pool_read(const struct kvfs_ctl_mem *pool, uint64_t off,
		      void *dst, uint64_t len)
{
	char name[KVFS_CTL_NAME_MAX + 1];
	void *m;
	int fd;

	memcpy(name, pool->shm_name, KVFS_CTL_NAME_MAX);
	name[KVFS_CTL_NAME_MAX] = 0;
	if (pool->backend != KVFS_CTL_BACKEND_SHM || off > pool->size ||
	    len > pool->size - off)
		fz_fail("pool %s: [%" PRIu64 ", +%" PRIu64 ") outside %" PRIu64
			" bytes", name, off, len, pool->size);
	fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		fz_fail("pool %s: %s", name, strerror(errno));
	m = mmap(NULL, (size_t)pool->size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		fz_fail("pool %s: mmap: %s", name, strerror(errno));
	memcpy(dst, (uint8_t *)m + off, (size_t)len);
	munmap(m, (size_t)pool->size);
}

static const uint8_t *seed_payload(int s, uint64_t *plen)
{
	uint64_t off = kvfs_fmt_payload_off(seeds[s].h.n_tokens);

	*plen = seeds[s].len - off;
	return seeds[s].img + off;
}

/* Blocks SAVE made, unlinked by the caller once checked. */
static void unlink_saved(const uint8_t key[16])
{
	char path[4300];
	int e;

	key_path(path, sizeof(path), key);
	op_begin("unlink %s", path);
	e = err_of(unlink(path));
	op_end();
	want(e, OKS(0), "unlink of a block SAVE made");
}

/* What a well-formed request's response must be, beyond its form. */
static void check_data(const struct rq *q, const struct kvfs_ctl_resp *rs,
		       const struct kvfs_ctl_block *blk)
{
	const struct kvfs_ctl_req *h = (const void *)q->b;
	uint64_t plen;

	if (q->chain_seed >= 0 && q->ns_ok && q->op == KVFS_CTL_LOOKUP) {
		/* Every seeded block is cached somewhere, always. */
		if (rs->error || rs->n_cached != q->nk)
			fz_fail("LOOKUP of a seeded chain of %u: error %d, "
				"%u cached", q->nk, rs->error, rs->n_cached);
	}
	/* The word must lie in the object (meta/kvfs_ctl.h): a copy that
	 * goes ahead signals it, wherever the offset points.
	 */
	if (q->sync_outside && !rs->error &&
	    (q->op == KVFS_CTL_FETCH_INTO || q->op == KVFS_CTL_FETCH_CHUNKS))
		fz_fail("op %u succeeded with its sync word at %#" PRIx64
			", outside the %u-byte object", q->op, h->sync.off,
			SYNC_SIZE);
	if (rs->error)
		return;
	if (q->op == KVFS_CTL_FETCH && rs->n_blocks) {
		for (uint32_t i = 0; i < rs->n_blocks; i++) {
			int s = seed_of(blk[i].key);
			const uint8_t *want_p;
			uint8_t *got;

			if (s < 0)
				continue;
			want_p = seed_payload(s, &plen);
			if (blk[i].len != plen)
				fz_fail("FETCH: block %u len %" PRIu64
					", stored %" PRIu64, i, blk[i].len,
					plen);
			got = malloc(plen);
			assert_non_null(got);
			pool_read(&rs->pool, blk[i].pool_off, got, plen);
			if (memcmp(got, want_p, plen)) {
				free(got);
				fz_fail("FETCH: block %u's bytes in the pool "
					"differ from the stored ones", i);
			}
			free(got);
		}
	}
	if (q->op == KVFS_CTL_FETCH_INTO && q->mem == MEM_PEER) {
		const struct kvfs_ctl_dst *d =
			(const void *)(q->b + REQ_HDR + 16 * (size_t)h->n_keys);

		if (rs->n_blocks != h->n_keys)
			fz_fail("FETCH_INTO: %u blocks for %u keys",
				rs->n_blocks, h->n_keys);
		for (uint32_t i = 0; i < h->n_keys; i++) {
			int s = seed_of(rq_keys(q)[i]);
			const uint8_t *want_p;

			if (s < 0)
				continue;
			want_p = seed_payload(s, &plen);
			if (d[i].off > PEER_SIZE || plen > PEER_SIZE - d[i].off)
				fz_fail("FETCH_INTO succeeded with a "
					"destination outside the peer");
			/* Overlapping destinations are copied layer by
			 * layer: what ends up there is a mix. Not checked.
			 */
			bool overlap = false;

			for (uint32_t j = 0; j < h->n_keys; j++)
				if (j != i && d[j].off < d[i].off + plen &&
				    d[i].off < d[j].off + plen)
					overlap = true;
			if (!overlap &&
			    memcmp(peer_mem + d[i].off, want_p, plen)) {
				uint64_t at = 0;

				while (peer_mem[d[i].off + at] == want_p[at])
					at++;
				fz_fail("FETCH_INTO: key %u's bytes at %" PRIu64
					" differ from the stored ones from "
					"byte %" PRIu64 " of %" PRIu64, i,
					d[i].off, at, plen);
			}
		}
		if (q->sync_ours) {
			uint32_t w;

			memcpy(&w, sync_mem + h->sync.off, 4);
			if (w != g.n_layers)
				fz_fail("FETCH_INTO: sync word %u, want %u", w,
					g.n_layers);
		}
	}
	if (q->op == KVFS_CTL_FETCH_CHUNKS) {
		const uint32_t *ch = (const void *)(q->b + REQ_HDR +
						    16 * (size_t)h->n_keys +
						    8 * (size_t)h->n_dst);
		const struct kvfs_ctl_dst *d =
			(const void *)(q->b + REQ_HDR + 16 * (size_t)h->n_keys);
		bool pool = h->flags & KVFS_CTL_F_POOL;
		uint32_t per = (g.block_tokens + g.chunk_tokens - 1) /
			       g.chunk_tokens;
		uint64_t lo, cb, base, total;
		uint8_t *region = NULL;

		if (pool && rs->n_blocks != 1)
			fz_fail("FETCH_CHUNKS to the pool: %u blocks",
				rs->n_blocks);
		if (!pool && q->mem != MEM_PEER)
			return;
		for (uint32_t i = 0; i < h->n_keys; i++) {
			int s = seed_of(rq_keys(q)[i]);

			if (s < 0 || seeds[s].h.n_tokens != g.block_tokens)
				return; /* only seeded full blocks are known */
		}
		kvfs_fmt_chunk_range(&g, g.block_tokens, 0, 0, &lo, &cb);
		total = (uint64_t)h->n_layers * h->n_chunks * cb;
		if (pool) {
			if (blk[0].len != total)
				fz_fail("FETCH_CHUNKS: region of %" PRIu64
					" bytes, want %" PRIu64, blk[0].len,
					total);
			region = malloc(total);
			assert_non_null(region);
			pool_read(&rs->pool, blk[0].pool_off, region, total);
			base = 0;
		} else {
			base = d[0].off;
			if (base > PEER_SIZE || total > PEER_SIZE - base)
				fz_fail("FETCH_CHUNKS succeeded past the peer");
		}
		for (uint32_t l = 0; l < h->n_layers; l++)
			for (uint32_t k = 0; k < h->n_chunks; k++) {
				uint32_t j = ch[k], bi = j / per;
				uint64_t off, len;
				const uint8_t *got;
				int s;

				if (bi >= h->n_keys ||
				    h->layer_first + l >= g.n_layers) {
					free(region);
					fz_fail("FETCH_CHUNKS succeeded for "
						"chunk %u of layer %u, past "
						"the prefix", j,
						h->layer_first + l);
				}
				s = seed_of(rq_keys(q)[bi]);
				kvfs_fmt_chunk_range(&g, g.block_tokens,
						     h->layer_first + l,
						     j % per, &off, &len);
				got = (pool ? region : peer_mem + base) +
				      ((uint64_t)l * h->n_chunks + k) * cb;
				if (memcmp(got, seeds[s].img + off, len)) {
					free(region);
					fz_fail("FETCH_CHUNKS: layer %u chunk "
						"%u differs from the stored "
						"bytes", h->layer_first + l,
						j);
				}
			}
		free(region);
		if (q->sync_ours) {
			uint32_t w;

			memcpy(&w, sync_mem + h->sync.off, 4);
			if (w != h->n_layers)
				fz_fail("FETCH_CHUNKS: sync word %#x, want %u",
					w, h->n_layers);
		}
	}
	if (q->op == KVFS_CTL_SAVE) {
		char path[4300];
		uint8_t *img = NULL;
		uint64_t len = 0, off;
		struct kvfs_fmt_hdr hd;
		enum kvfs_fmt_err e;
		const uint8_t *src = q->mem == MEM_PEER ? peer_mem :
				     q->mem == MEM_SYNCOBJ ? sync_mem : NULL;
		int rc;

		key_path(path, sizeof(path), rs->key);
		rc = slurp(path, &img, &len);
		if (rc)
			fz_fail("SAVE reported success, but %s: %s", path,
				ename(rc));
		e = kvfs_fmt_validate(img, len, &g, rs->key, root, 0, &hd);
		if (e != KVFS_FMT_OK) {
			free(img);
			fz_fail("SAVE made %s, which does not validate: %s",
				path, kvfs_fmt_strerror(e));
		}
		off = kvfs_fmt_payload_off(hd.n_tokens);
		if (hd.n_tokens != h->n_tokens ||
		    memcmp(hd.parent, h->parent, 16) ||
		    hd.start_pos != h->start_pos ||
		    memcmp(img + KVFS_FMT_HDR_SIZE, rq_keys(q),
			   4ull * h->n_tokens)) {
			free(img);
			fz_fail("SAVE made %s with other tokens, parent or "
				"position than asked", path);
		}
		uint64_t osize = q->mem == MEM_PEER ? PEER_SIZE : SYNC_SIZE;

		if (src && (h->src_off > osize ||
			    len - off > osize - h->src_off)) {
			free(img);
			fz_fail("SAVE succeeded from outside the caller's "
				"memory (offset %" PRIu64 ")", h->src_off);
		}
		/* The payload is the caller's bytes, but rows past the last
		 * token are zeroed by the format: compare whole chunks only.
		 */
		if (src && h->n_tokens == g.block_tokens &&
		    memcmp(img + off, src + h->src_off, len - off)) {
			free(img);
			fz_fail("SAVE made %s from other bytes than the "
				"caller's", path);
		}
		free(img);
		unlink_saved(rs->key);
	}
}

/* The form of any response; then the data checks. */
void check_resp(const struct rq *q, const uint8_t *buf, size_t got,
		const char *tr)
{
	struct kvfs_ctl_resp rs;
	const struct kvfs_ctl_block *blk =
		(const void *)(buf + sizeof(struct kvfs_ctl_resp));
	const struct kvfs_ctl_req *h = (const void *)q->b;
	bool ok = false;

	if (got < sizeof(rs))
		fz_fail("%s op %u: a response of %zu bytes", tr, q->op, got);
	memcpy(&rs, buf, sizeof(rs));
	if (rs.magic != KVFS_CTL_MAGIC || rs.abi != KVFS_CTL_ABI ||
	    rs.op != q->op)
		fz_fail("%s op %u: response magic %#x abi %u op %u", tr, q->op,
			rs.magic, rs.abi, rs.op);
	if (rs.size != RESP_HDR + (uint64_t)rs.n_blocks * BLK_SIZE ||
	    rs.size > got)
		fz_fail("%s op %u: response size %u for %u blocks, %zu bytes "
			"came", tr, q->op, rs.size, rs.n_blocks, got);
	for (size_t i = 0; i < sizeof(resp_errs) / sizeof(resp_errs[0]); i++)
		if (rs.error == resp_errs[i])
			ok = true;
	if (!ok)
		fz_fail("%s op %u: response error %d", tr, q->op, rs.error);
	if (q->op <= KVFS_CTL_OP_MAX) {
		COUNT(resp[q->op]);
		if (!rs.error)
			COUNT(resp_ok[q->op]);
	}
	for (size_t i = 0; i < sizeof(rs.reserved); i++)
		if (rs.reserved[i])
			fz_fail("%s op %u: reserved response bytes set", tr,
				q->op);
	switch (q->op) {
	case KVFS_CTL_LOOKUP:
		if (!rs.error && rs.n_blocks != q->nk)
			fz_fail("LOOKUP of %u keys: %u blocks", q->nk,
				rs.n_blocks);
		if (rs.n_cached > rs.n_blocks)
			fz_fail("LOOKUP: %u cached of %u", rs.n_cached,
				rs.n_blocks);
		if (!rs.error && !(h->flags & KVFS_CTL_F_TOKENS))
			for (uint32_t i = 0; i < rs.n_blocks; i++)
				if (memcmp(blk[i].key, rq_keys(q)[i], 16))
					fz_fail("LOOKUP: block %u is not "
						"the key asked for", i);
		break;
	case KVFS_CTL_FETCH:
	case KVFS_CTL_FETCH_INTO:
		if (rs.n_blocks > q->nk)
			fz_fail("op %u: %u blocks for %u keys", q->op,
				rs.n_blocks, q->nk);
		break;
	case KVFS_CTL_FETCH_CHUNKS:
		if (rs.n_blocks > 1)
			fz_fail("FETCH_CHUNKS: %u blocks", rs.n_blocks);
		break;
	default:
		if (rs.n_blocks)
			fz_fail("op %u: %u blocks", q->op, rs.n_blocks);
		break;
	}
	check_data(q, &rs, blk);
}
