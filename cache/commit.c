/* SPDX-License-Identifier: MIT */
/*
 * The write path up to commit: pending files (create, write, truncate,
 * abandon) and their commit into DRAM as blocks, validated, restored to K
 * and V where the namespace says so, indexed and queued for write-back.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/chunk.h"
#include "cache/rpool_i.h"
#include "meta/log.h"
#include "meta/util.h"

uint64_t kvfs_pending_ino(const struct kvfs_pending *p)
{
	return p->ino;
}

uint64_t kvfs_pending_size(const struct kvfs_pending *p)
{
	struct kvfs_pending *m = (struct kvfs_pending *)p;
	uint64_t n;

	pthread_mutex_lock(&m->lock);
	n = m->size;
	pthread_mutex_unlock(&m->lock);
	return n;
}

int kvfs_cache_pending_size(struct kvfs_cache *c, uint64_t ino, uint64_t *size)
{
	struct kvfs_pending *q;

	pthread_mutex_lock(&c->pending_lock);
	for (q = c->pending; q && q->ino != ino; q = q->next)
		;
	if (q)
		*size = kvfs_pending_size(q);
	pthread_mutex_unlock(&c->pending_lock);
	return q ? 0 : -ENOENT;
}

int kvfs_cache_create(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name, struct kvfs_pending **out)
{
	struct kvfs_pending *p, *q;
	struct kvfs_block *b;
	int rc = 0;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	if (kvfs_fmt_name_parse(name, p->key)) {
		kvfs_warn("ns %s: create '%s' refused: not a block name "
			  "(<32 hex>.kv)",
			  ns->rec.name, name);
		free(p);
		return -EINVAL;
	}
	p->c = c;
	p->ns = ns;
	pthread_mutex_init(&p->lock, NULL);

	b = kvfs_index_find_key(c, p->key);
	if (b) {
		kvfs_cache_put(c, b);
		rc = -EEXIST;
		goto out_free;
	}
	pthread_mutex_lock(&c->pending_lock);
	for (q = c->pending; q; q = q->next)
		if (!q->tname && !memcmp(q->key, p->key, KVFS_KEY_LEN))
			break;
	if (q) {
		pthread_mutex_unlock(&c->pending_lock);
		rc = -EEXIST;
		goto out_free;
	}
	p->ino = atomic_fetch_add(&c->next_ino, 1);
	p->next = c->pending;
	c->pending = p;
	pthread_mutex_unlock(&c->pending_lock);
	*out = p;
	return 0;

out_free:
	pthread_mutex_destroy(&p->lock);
	free(p);
	return rc;
}

/* Caller holds p->lock. */
static int pending_reserve(struct kvfs_pending *p, uint64_t size)
{
	uint64_t cap;
	uint8_t *nb;

	if (size > p->ns->max_file)
		return -EFBIG;
	if (size <= p->cap)
		return 0;
	cap = p->cap ? p->cap : 1 << 16;
	while (cap < size)
		cap *= 2;
	if (cap > p->ns->max_file)
		cap = kvfs_util_align_up(p->ns->max_file, KVFS_FMT_ALIGN);
	nb = realloc(p->buf, cap);
	if (!nb)
		return -ENOMEM;
	memset(nb + p->cap, 0, cap - p->cap);
	p->buf = nb;
	p->cap = cap;
	return 0;
}

int kvfs_cache_write(struct kvfs_pending *p, uint64_t off, const void *buf,
		     size_t len)
{
	int rc;

	if (off > UINT64_MAX - len)
		return -EFBIG;
	pthread_mutex_lock(&p->lock);
	rc = pending_reserve(p, off + len);
	if (rc) {
		if (rc == -EFBIG)
			kvfs_warn(
				"ns %s: write past the largest block (%" PRIu64
				" bytes) refused",
				p->ns->rec.name, p->ns->max_file);
		goto out_unlock;
	}
	memcpy(p->buf + off, buf, len);
	if (off + len > p->size)
		p->size = off + len;
out_unlock:
	pthread_mutex_unlock(&p->lock);
	return rc;
}

int kvfs_cache_truncate(struct kvfs_pending *p, uint64_t size)
{
	int rc;

	pthread_mutex_lock(&p->lock);
	rc = pending_reserve(p, size);
	if (!rc) {
		if (size < p->size)
			memset(p->buf + size, 0, p->size - size);
		p->size = size;
	}
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static void pending_unlist(struct kvfs_cache *c, struct kvfs_pending *p)
{
	pthread_mutex_lock(&c->pending_lock);
	for (struct kvfs_pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->pending_lock);
}

void kvfs_cache_abandon(struct kvfs_cache *c, struct kvfs_pending *p)
{
	if (!p)
		return;
	pending_unlist(c, p);
	pthread_mutex_destroy(&p->lock);
	free(p->tname);
	free(p->buf);
	free(p);
}

/* Prefix-tree checks the format cannot do alone: the parent, when we
 * have it, must be a full block that ends where this one starts.
 */
static int check_parent(struct kvfs_cache *c, struct kvfs_ns *ns,
			const uint8_t *key, const struct kvfs_fmt_hdr *h,
			struct kvfs_block **parent)
{
	struct kvfs_block *pb;
	char hex[KVFS_KEY_HEX_LEN + 1];

	*parent = NULL;
	if (!memcmp(h->parent, ns->rec.root, KVFS_KEY_LEN))
		return 0;
	pb = kvfs_index_find_key(c, h->parent);
	if (!pb)
		return 0; /* out-of-order writes are allowed: an orphan */
	kvfs_fmt_key_hex(key, hex);
	if (pb->ns != ns) {
		kvfs_warn("ns %s: block %s.kv rejected: its parent belongs to "
			  "namespace %s",
			  ns->rec.name, hex, pb->ns->rec.name);
		goto out_reject;
	}
	if (pb->n_tokens != ns->geom.block_tokens) {
		kvfs_warn(
			"ns %s: block %s.kv rejected: its parent is a partial "
			"block (%u of %u tokens) and cannot have children",
			ns->rec.name, hex, pb->n_tokens, ns->geom.block_tokens);
		goto out_reject;
	}
	if (pb->start_pos + pb->n_tokens != h->start_pos) {
		kvfs_warn("ns %s: block %s.kv rejected: start_pos %" PRIu64
			  " does not follow its parent's (%" PRIu64 ")",
			  ns->rec.name, hex, (uint64_t)h->start_pos,
			  pb->start_pos + pb->n_tokens);
		goto out_reject;
	}
	*parent = pb;
	return 0;
out_reject:
	kvfs_cache_put(c, pb);
	return -EINVAL;
}

/*
 * Make a block of @ns from the validated image in DRAM extent @ext (its
 * header @h, @ssize bytes stored) under @key and @ino: index, listing,
 * DRAM counters, the policy (inserted into DRAM) and the fleet's
 * sightings (a new block is a reference the other hosts hear of).  Takes
 * over @ext and *@parent (a reference, or NULL; cleared) whatever the
 * result.  On success *@out gets a referenced block, not yet queued for
 * write-back.  0, -EEXIST (the key is indexed already), -ENOMEM.
 */
static int block_publish(struct kvfs_cache *c, struct kvfs_ns *ns,
			 const uint8_t *key, uint64_t ino,
			 const struct kvfs_fmt_hdr *h, uint64_t ssize,
			 const struct kvfs_extent *ext,
			 struct kvfs_block **parent, unsigned bflags,
			 struct kvfs_block **out)
{
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	size_t ncrcs = kvfs_fmt_chunk_ncrcs(&ns->geom, h->n_tokens);
	struct kvfs_block *b = kvfs_block_alloc(ns);
	int rc;

	if (!b) {
		dram->ops->free(dram, ext);
		kvfs_cache_put(c, *parent);
		*parent = NULL;
		return -ENOMEM;
	}
	memcpy(b->pn.key, key, KVFS_KEY_LEN);
	b->pn.parent = *parent ? &(*parent)->pn : NULL;
	b->parent = *parent;
	*parent = NULL;
	/* An orphan may claim any position: saturate, don't wrap. */
	b->pn.depth = h->start_pos / ns->geom.block_tokens > UINT32_MAX ?
			      UINT32_MAX :
			      (uint32_t)(h->start_pos / ns->geom.block_tokens);
	b->pn.tokens = h->n_tokens;
	b->pn.size = ssize;
	b->ino = ino;
	b->ssize = ssize;
	b->size = h->kind != KVFS_KIND_KV ?
			  kvfs_fmt_file_size(&ns->geom, KVFS_KIND_KV,
					     h->n_tokens) :
			  ssize;
	b->start_pos = h->start_pos;
	b->created = kvfs_util_now_real();
	b->n_tokens = h->n_tokens;
	b->hdr_crc = h->hdr_crc;
	b->kind = h->kind;
	b->kv_from = kvfs_fmt_hdr_kv_from(h);
	memcpy(b->parent_key, h->parent, KVFS_KEY_LEN);
	b->dram = *ext;
	atomic_store(&b->dram_ptr, ext->ptr);
	atomic_store(&b->tiers, KVFS_TIER_BIT_DRAM);
	atomic_store(&b->flags, bflags);
	atomic_store(&b->last_access, b->created);
	atomic_fetch_add(&dram->st.blocks, 1);
	/* Per-chunk checksums, while the image is at hand: sparse reads
	 * from the SSD verify each chunk with them.
	 */
	b->ccrc = ncrcs ? malloc(ncrcs * sizeof(*b->ccrc)) : NULL;
	if (ncrcs && !b->ccrc) {
		rc = -ENOMEM;
		goto out_put;
	}
	if (b->ccrc)
		kvfs_fmt_chunk_crcs(&ns->geom, b->n_tokens, b->kv_from,
				    ext->ptr, b->ccrc);

	/* One reference for the index, one for the caller. */
	atomic_store(&b->refs, 2);
	rc = kvfs_index_insert(c, b);
	if (rc) {
		atomic_store(&b->refs, 1);
		goto out_put;
	}
	kvfs_ns_add(ns, b);
	atomic_fetch_add(&dram->st.bytes_written, b->ssize);
	kvfs_block_count_hidden(c, b, 1);

	pthread_mutex_lock(&c->policy_lock);
	struct kvfs_paccess a = { .now = b->created };
	kvfs_policy_insert(c->policy, KVFS_TIER_DRAM, &b->pn, &a);
	kvfs_fleet_note(c, b->pn.key);
	pthread_mutex_unlock(&c->policy_lock);
	*out = b;
	return 0;

out_put:
	kvfs_cache_put(c, b); /* frees the DRAM extent with it */
	return rc;
}

int kvfs_cache_commit(struct kvfs_cache *c, struct kvfs_pending *p,
		      struct kvfs_block **out)
{
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_fmt_hdr h;
	struct kvfs_block *b = NULL, *parent = NULL;
	struct kvfs_extent ext = { 0 };
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_hc_ns *hc = &p->ns->hc;
	enum kvfs_fmt_err fe;
	bool convert = false;
	uint64_t ssize;
	int rc;

	kvfs_fmt_key_hex(p->key, hex);
	pthread_mutex_lock(&p->lock);
	if (p->size >= KVFS_FMT_HDR_SIZE &&
	    kvfs_fmt_img_kind(p->buf) == KVFS_KIND_HIDDEN && !hc->rst) {
		pthread_mutex_unlock(&p->lock);
		kvfs_warn("ns %s: block %s.kv rejected: a HIDDEN-kind block "
			  "needs a namespace with weights (hidden-state "
			  "restoration, docs/hcache.md)",
			  p->ns->rec.name, hex);
		rc = -EINVAL;
		goto out_reject;
	}
	fe = kvfs_fmt_validate(p->buf, p->size, &p->ns->geom, p->key,
			       p->ns->rec.root,
			       hc->rst ? KVFS_FMT_ALLOW_HIDDEN : 0, &h);
	pthread_mutex_unlock(&p->lock);
	if (fe != KVFS_FMT_OK) {
		kvfs_warn("ns %s: block %s.kv rejected (%" PRIu64 " bytes): %s",
			  p->ns->rec.name, hex, p->size, kvfs_fmt_strerror(fe));
		rc = kvfs_fmt_errno(fe);
		goto out_reject;
	}
	rc = check_parent(c, p->ns, p->key, &h, &parent);
	if (rc)
		goto out_reject;

	/* The layers the namespace does not keep as hidden states are
	 * restored once, here: every layer (stored as the KV block they
	 * stand for) or those from its kv_from on (stored MIXED).
	 */
	convert = h.kind == KVFS_KIND_HIDDEN &&
		  hc->kv_from < p->ns->geom.n_layers;
	ssize = convert ? kvfs_fmt_split_file_size(&p->ns->geom, h.n_tokens,
						   hc->kv_from) :
			  p->size;
	rc = kvfs_dram_reserve(c, ssize, &ext);
	if (rc) {
		kvfs_warn("ns %s: block %s.kv refused: DRAM tier full and "
			  "nothing evictable",
			  p->ns->rec.name, hex);
		goto out_put_parent;
	}
	if (convert) {
		uint64_t t0 = kvfs_util_now_mono();

		rc = kvfs_rpool_build(p->ns, NULL, p->buf, p->size, hc->kv_from,
				      ext.ptr, ext.len);
		fe = rc ? KVFS_FMT_OK :
			  kvfs_fmt_validate(ext.ptr, ssize, &p->ns->geom,
					    p->key, p->ns->rec.root,
					    KVFS_FMT_ALLOW_MIXED, &h);
		if (!rc && fe != KVFS_FMT_OK)
			rc = -EIO;
		if (rc) {
			kvfs_err("ns %s: block %s.kv refused: restoring its "
				 "hidden states to K and V failed (%s)",
				 p->ns->rec.name, hex,
				 fe != KVFS_FMT_OK ? kvfs_fmt_strerror(fe) :
						     strerror(-rc));
			atomic_fetch_add(&c->st_restore_errors, 1);
			goto out_free_ext;
		}
		if (h.kind == KVFS_KIND_MIXED) {
			atomic_fetch_add(&c->st_splits, 1);
			atomic_fetch_add(&hc->splits, 1);
		} else {
			atomic_fetch_add(&c->st_converted, 1);
			atomic_fetch_add(&hc->converted, 1);
		}
		atomic_fetch_add(&c->st_restore_ns, kvfs_util_now_mono() - t0);
	} else {
		memcpy(ext.ptr, p->buf, p->size);
		/* O_DIRECT writes the whole extent: the tail must be zeros. */
		memset((uint8_t *)ext.ptr + p->size, 0, ext.len - p->size);
	}

	rc = block_publish(c, p->ns, p->key, p->ino, &h, ssize, &ext, &parent,
			   0, &b);
	if (rc == -EEXIST) {
		kvfs_warn("ns %s: block %s.kv: committed concurrently by "
			  "another writer",
			  p->ns->rec.name, hex);
		goto out_abandon;
	}
	if (rc)
		goto out_put_parent;
	atomic_fetch_add(&c->st_commits, 1);
	kvfs_wb_enqueue(c, b);
	kvfs_cache_abandon(c, p);
	*out = b;
	return 0;

out_free_ext:
	dram->ops->free(dram, &ext);
out_put_parent:
	kvfs_cache_put(c, parent);
out_reject:
	atomic_fetch_add(&c->st_rejects, 1);
out_abandon:
	kvfs_cache_abandon(c, p);
	return rc;
}

int kvfs_block_import(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const uint8_t *key, const void *img, uint64_t len,
		      const struct kvfs_fmt_hdr *h, struct kvfs_block **out)
{
	struct kvfs_block *b, *parent = NULL;
	struct kvfs_extent ext = { 0 };
	int rc;

	b = kvfs_index_find_key(c, key);
	if (b) {
		*out = b;
		return 0;
	}
	rc = check_parent(c, ns, key, h, &parent);
	if (rc)
		return rc;
	rc = kvfs_dram_reserve(c, len, &ext);
	if (rc) {
		kvfs_cache_put(c, parent);
		return rc;
	}
	memcpy(ext.ptr, img, len);
	/* O_DIRECT writes the whole extent: the tail must be zeros. */
	memset((uint8_t *)ext.ptr + len, 0, ext.len - len);
	rc = block_publish(c, ns, key, atomic_fetch_add(&c->next_ino, 1), h,
			   len, &ext, &parent, KVFS_B_REMOTE, &b);
	if (rc == -EEXIST) {
		/* Fetched or committed meanwhile: that one it is. */
		b = kvfs_index_find_key(c, key);
		if (!b)
			return -ENOENT;
		*out = b;
		return 0;
	}
	if (rc)
		return rc;
	/* Local from now on: persisted like a committed block. */
	kvfs_wb_enqueue(c, b);
	*out = b;
	return 0;
}
