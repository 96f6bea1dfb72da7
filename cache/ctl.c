/* SPDX-License-Identifier: MIT */
/*
 * The control file's entry point (meta/kvfs_ctl.h, docs/ctl.md): one
 * request is decoded, its response sized, and the operation dispatched to
 * the file that does it (cache/ctl_i.h lists them).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cache/ctl_i.h"
#include "meta/log.h"
#include "meta/util.h"

static const char *const op_names[] = {
	[KVFS_CTL_LOOKUP] = "LOOKUP",
	[KVFS_CTL_FETCH] = "FETCH",
	[KVFS_CTL_FETCH_INTO] = "FETCH_INTO",
	[KVFS_CTL_SAVE] = "SAVE",
	[KVFS_CTL_RELEASE] = "RELEASE",
	[KVFS_CTL_PIN] = "PIN",
	[KVFS_CTL_UNPIN] = "UNPIN",
	[KVFS_CTL_PREFETCH] = "PREFETCH",
	[KVFS_CTL_EVICT] = "EVICT",
	[KVFS_CTL_STATS] = "STATS",
	[KVFS_CTL_FETCH_CHUNKS] = "FETCH_CHUNKS",
	[KVFS_CTL_SCORES] = "SCORES",
};

/* What an operation needs of its namespace (docs/ctl.md): reading is
 * finding, fetching, hinting and reporting; writing is adding, keeping and
 * dropping blocks. STATS concerns no namespace.
 */
static unsigned op_needs(uint32_t op)
{
	switch (op) {
	case KVFS_CTL_SAVE:
	case KVFS_CTL_PIN:
	case KVFS_CTL_UNPIN:
	case KVFS_CTL_EVICT:
		return KVFS_CTL_MAY_WRITE;
	case KVFS_CTL_STATS:
		return 0;
	default:
		return KVFS_CTL_MAY_READ;
	}
}

/*
 * Refuse a caller the namespace's mode does not let in, before anything
 * is looked up: a LOOKUP must not tell whether a key exists. The device
 * pool a namespace's blocks go to is its owner's (one per owner), so it
 * is handed only to that owner, root and the mounting user; other
 * readers (its group, others) fetch into their own memory.
 */
static int check_access(struct kvfs_ctl_ctx *x)
{
	char pool[96];
	const char *why = NULL;
	uint32_t op = x->r->op;

	if (x->ns && kvfs_ctl_ns_may(x->c, x->ns, x->cr, op_needs(op)))
		why = op_needs(op) & KVFS_CTL_MAY_WRITE ?
			      "no write permission on the namespace" :
			      "no read permission on the namespace";
	else if ((op == KVFS_CTL_FETCH ||
		  (op == KVFS_CTL_FETCH_CHUNKS &&
		   (x->r->flags & KVFS_CTL_F_POOL))) &&
		 !kvfs_ctl_is_admin(x->cr) &&
		 (!x->ns || x->cr->uid != x->ns->owner)) {
		snprintf(pool, sizeof(pool),
			 "the device pool of the namespace is uid %u's, "
			 "handed only to it (use FETCH_INTO)",
			 x->ns ? x->ns->owner : 0);
		why = pool;
	}
	if (!why)
		return 0;
	kvfs_warn("ctl: uid %u may not %s in namespace %s: %s (EACCES)",
		  x->cr->uid, op_names[op], x->ns ? kvfs_ns_name(x->ns) : "-",
		  why);
	x->resp->error = -EACCES;
	return -EACCES;
}

/*
 * Blocks of the request that are not local are looked up in the remote
 * tier first (docs/remote.md), as a prefix: by the fetches always, by
 * LOOKUP when the caller asks (KVFS_CTL_F_REMOTE), by PREFETCH in the
 * background (a hint returns at once).  What is found is local when the
 * operation looks.
 */
static void ctl_remote(struct kvfs_ctl_ctx *x)
{
	const uint8_t(*keys)[16] = x->chain ? (const uint8_t(*)[16])x->chain :
					      x->keys;

	if (!kvfs_remote_on(x->c) || !x->ns || !x->nk)
		return;
	switch (x->r->op) {
	case KVFS_CTL_LOOKUP:
		if (!(x->r->flags & KVFS_CTL_F_REMOTE))
			break;
		/* fall through */
	case KVFS_CTL_FETCH:
	case KVFS_CTL_FETCH_INTO:
	case KVFS_CTL_FETCH_CHUNKS:
		kvfs_remote_fetch(x->c, x->ns, keys, x->nk, true);
		break;
	case KVFS_CTL_PREFETCH:
		kvfs_remote_fetch_async(x->c, x->ns, keys, x->nk);
		break;
	}
}

/* The latency of an operation that has a histogram, whatever its result. */
static void ctl_time(struct kvfs_cache *c, uint32_t op, uint64_t t0)
{
	int h;

	switch (op) {
	case KVFS_CTL_LOOKUP:
		h = KVFS_CACHE_HIST_LOOKUP;
		break;
	case KVFS_CTL_FETCH:
		h = KVFS_CACHE_HIST_FETCH;
		break;
	case KVFS_CTL_FETCH_INTO:
		h = KVFS_CACHE_HIST_FETCH_INTO;
		break;
	case KVFS_CTL_FETCH_CHUNKS:
		h = KVFS_CACHE_HIST_FETCH_CHUNKS;
		break;
	default:
		return;
	}
	kvfs_hist_add(&c->hist[h], kvfs_util_now_mono() - t0);
}

int kvfs_ctl_exec(struct kvfs_ctl_session *s, struct kvfs_ctl_creds *cr,
		  const void *req, size_t len, size_t max_resp, void **resp,
		  size_t *rlen)
{
	const struct kvfs_ctl_req *r = req;
	struct kvfs_ctl_ctx x = { .s = s, .c = s->c, .r = r, .cr = cr };
	uint64_t t0 = kvfs_util_now_mono();
	size_t nblk, size;
	int rc;

	rc = kvfs_ctl_decode(&x, req, len);
	if (rc)
		return rc;

	/* Room for one block entry per key (token chains: per block). */
	nblk = r->n_keys;
	if (r->flags & KVFS_CTL_F_TOKENS)
		nblk = r->n_tokens; /* an upper bound; trimmed below */
	if (r->op == KVFS_CTL_FETCH_CHUNKS)
		nblk = (r->flags & KVFS_CTL_F_POOL) ? 1 : 0;
	else if (r->op != KVFS_CTL_LOOKUP && r->op != KVFS_CTL_FETCH &&
		 r->op != KVFS_CTL_FETCH_INTO)
		nblk = 0;
	size = sizeof(struct kvfs_ctl_resp) +
	       nblk * sizeof(struct kvfs_ctl_block);
	x.resp = calloc(1, size);
	if (!x.resp)
		return -ENOMEM;
	x.blk = (struct kvfs_ctl_block *)(x.resp + 1);
	x.resp->magic = KVFS_CTL_MAGIC;
	x.resp->abi = KVFS_CTL_ABI;
	x.resp->op = r->op;

	if (r->op == KVFS_CTL_FETCH || r->op == KVFS_CTL_FETCH_INTO ||
	    r->op == KVFS_CTL_RELEASE || r->op == KVFS_CTL_STATS ||
	    r->op == KVFS_CTL_FETCH_CHUNKS)
		x.pid = kvfs_ctl_tgid_of(cr->pid);
	rc = kvfs_ctl_resolve(&x);
	if (rc || x.resp->error || check_access(&x))
		goto out_done;
	/* Refuse before acting if the answer cannot travel back. */
	if (nblk && r->op != KVFS_CTL_FETCH_CHUNKS &&
	    sizeof(struct kvfs_ctl_resp) +
			    x.nk * sizeof(struct kvfs_ctl_block) >
		    max_resp) {
		rc = -E2BIG;
		goto out_done;
	}
	ctl_remote(&x);
	switch (r->op) {
	case KVFS_CTL_LOOKUP:
		rc = kvfs_ctl_lookup(&x);
		break;
	case KVFS_CTL_FETCH:
		rc = kvfs_ctl_fetch(&x);
		break;
	case KVFS_CTL_FETCH_INTO:
		rc = kvfs_ctl_fetch_into(&x);
		break;
	case KVFS_CTL_SAVE:
		rc = kvfs_ctl_save(&x);
		break;
	case KVFS_CTL_RELEASE:
		rc = kvfs_ctl_release(&x);
		break;
	case KVFS_CTL_PIN:
		rc = kvfs_ctl_pin(&x, true);
		break;
	case KVFS_CTL_UNPIN:
		rc = kvfs_ctl_pin(&x, false);
		break;
	case KVFS_CTL_PREFETCH:
		rc = kvfs_ctl_prefetch(&x);
		break;
	case KVFS_CTL_EVICT:
		rc = kvfs_ctl_evict(&x);
		break;
	case KVFS_CTL_STATS:
		rc = kvfs_ctl_stats(&x);
		break;
	case KVFS_CTL_FETCH_CHUNKS:
		rc = kvfs_ctl_fetch_chunks(&x);
		break;
	case KVFS_CTL_SCORES:
		rc = kvfs_ctl_scores(&x);
		break;
	}
out_done:
	free(x.chain);
	ctl_time(x.c, r->op, t0);
	if (rc) {
		free(x.resp);
		return rc;
	}
	size = sizeof(struct kvfs_ctl_resp) +
	       (size_t)x.resp->n_blocks * sizeof(struct kvfs_ctl_block);
	x.resp->size = (uint32_t)size;
	*resp = x.resp;
	*rlen = size;
	return 0;
}
