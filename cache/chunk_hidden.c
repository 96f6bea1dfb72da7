/* SPDX-License-Identifier: MIT */
/*
 * Chunk pieces of blocks stored as hidden states (kind HIDDEN, or MIXED
 * below kv_from). They serve the same KV pieces: a piece's stored bytes
 * are its chunk's hidden-state rows, and K and V are projected from them
 * with the namespace's checkpoint (kvfs_restore_layer on that chunk
 * alone) into memory of our own before they are delivered and offered to
 * the chunk cache. Once a restoration has left the block's KV image in
 * DRAM, pieces are copied from it instead.
 */
#include <errno.h>
#include <string.h>

#include "cache/chunk_i.h"
#include "meta/log.h"

void kvfs_chunk_prj_release(struct cprj *pj)
{
	if (pj->shared)
		pthread_mutex_unlock(&pj->st->ws_lock);
	else
		kvfs_restore_ws_free(pj->ws);
	pj->ws = NULL;
	pj->shared = false;
}

/*
 * K and V of piece (@layer, @chunk) of @b, from that chunk's hidden-state
 * rows @x, into @out (one chunk in the KV layout, padding rows zeroed):
 * the restoration of the whole block (hcache/restore.h) for those rows only,
 * at their own positions. @out is the daemon's memory, never a client's.
 * 0, -ENOMEM or -EIO (logged).
 */
int kvfs_chunk_prj_run(struct cprj *pj, struct kvfs_block *b, uint32_t layer,
		       uint32_t chunk, const void *x, void *out)
{
	struct kvfs_chunk_state *st = pj->st;
	const struct kvfs_geom *g = &b->ns->geom;
	uint32_t c = g->chunk_tokens, first = chunk * c;
	uint32_t n = b->n_tokens - first < c ? b->n_tokens - first : c;
	char hex[KVFS_KEY_HEX_LEN + 1];
	int rc;

	if (!pj->ws && pthread_mutex_trylock(&st->ws_lock) == 0) {
		if (!st->ws && kvfs_restore_ws_alloc(&st->ws))
			st->ws = NULL;
		if (st->ws) {
			pj->ws = st->ws;
			pj->shared = true;
		} else {
			pthread_mutex_unlock(&st->ws_lock);
		}
	}
	if (!pj->ws && kvfs_restore_ws_alloc(&pj->ws))
		return -ENOMEM;
	rc = kvfs_restore_layer(b->ns->hc.rst, pj->ws, layer, x, g->dtype,
				b->start_pos + first, n, c, out, g->dtype);
	if (rc) {
		kvfs_chunk_key_hex(b, hex);
		kvfs_err("ns %s: block %s.kv layer %u chunk %u: projecting its "
			 "hidden states failed (%s): not served",
			 b->ns->rec.name, hex, layer, chunk, strerror(-rc));
		return rc == -ENOMEM ? rc : -EIO;
	}
	return 0;
}

/*
 * Whether the DRAM copy of @b, stored as hidden states, is the KV image a
 * restoration left there. Its pieces are then the served file's bytes
 * exactly, which a cached projection need not be (docs/contiguouskv.md):
 * they are taken from the image instead.
 */
bool kvfs_chunk_kv_image(struct kvfs_block *b)
{
	const uint8_t *base;
	bool kv;

	atomic_fetch_add(&b->readers, 1);
	base = atomic_load(&b->dram_ptr);
	kv = base && kvfs_fmt_img_kind(base) == KVFS_KIND_KV;
	atomic_fetch_sub(&b->readers, 1);
	return kv;
}

/*
 * Piece @i from the DRAM copy of a block stored as hidden states (or
 * split). That copy is the stored image until a restoration swaps in the
 * KV image, which frees the old one once its readers are gone: the piece
 * is taken under b->readers. From the KV image, or a stored KV layer, the
 * bytes are copied; from stored hidden-state rows they are projected,
 * into @kv (chunk bytes of our own), then copied out. 1 when there is no
 * DRAM copy, 0 when delivered (*@projected says whether @kv holds it),
 * -errno when the copy or the projection failed.
 */
int kvfs_chunk_serve_split(struct kvfs_chunk_piece *p, struct cpw *pw,
			   bool client, struct cprj *pj, uint8_t *kv,
			   bool *projected)
{
	struct kvfs_block *b = p->b;
	const uint8_t *base;
	int rc = 0;

	*projected = false;
	atomic_fetch_add(&b->readers, 1);
	base = atomic_load(&b->dram_ptr);
	if (!base) {
		rc = 1;
	} else if (kvfs_fmt_img_kind(base) == KVFS_KIND_KV) {
		if (p->dst)
			rc = kvfs_chunk_copy_out(p->dst, base + pw->off,
						 (size_t)pw->len, client);
	} else if (!pw->proj) {
		if (p->dst)
			rc = kvfs_chunk_copy_out(p->dst, base + pw->soff,
						 (size_t)pw->slen, client);
	} else {
		rc = kvfs_chunk_prj_run(pj, b, p->layer, p->chunk,
					base + pw->soff, kv);
		*projected = !rc;
	}
	atomic_fetch_sub(&b->readers, 1);
	if (*projected && p->dst)
		rc = kvfs_chunk_copy_out(p->dst, kv, (size_t)pw->len, client);
	return rc;
}
