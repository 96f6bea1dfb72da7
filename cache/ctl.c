/* SPDX-License-Identifier: MIT */
/*
 * The control file's entry point (meta/kvfs_ctl.h, docs/ctl.md): one
 * request is decoded, its response sized, and the operation dispatched to
 * the file that does it (cache/ctl_i.h lists them).
 */
#include <errno.h>
#include <stdlib.h>

#include "cache/ctl_i.h"

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

int kvfs_ctl_exec(struct kvfs_ctl_session *s, int pid, const void *req,
		  size_t len, size_t max_resp, void **resp, size_t *rlen)
{
	const struct kvfs_ctl_req *r = req;
	struct kvfs_ctl_ctx x = { .s = s, .c = s->c, .r = r };
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
		x.pid = kvfs_ctl_tgid_of(pid);
	rc = kvfs_ctl_resolve(&x);
	if (rc || x.resp->error)
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
