/* SPDX-License-Identifier: MIT */
/*
 * Cache engine: block index, namespaces, the write path up to commit, the
 * read path and the admin operations.  Write-back and eviction live in
 * cache_wb.c, start-up and recovery in cache_open.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/rpool_i.h"
#include "cache/chunk.h"
#include "meta/log.h"
#include "meta/util.h"

#define container_of(p, t, m) ((t *)((char *)(p) - offsetof(t, m)))

/* ---------------------------------------------------------------- index */

static size_t key_hash(const uint8_t *key)
{
	uint64_t h;

	/* Keys are SHA-256 output: any 8 bytes are already uniform. */
	memcpy(&h, key, sizeof(h));
	return (size_t)h;
}

static size_t ino_hash(uint64_t ino)
{
	return (size_t)(ino * 0x9e3779b97f4a7c15ull >> 7);
}

static struct kvfs_block **chain_next(struct kvfs_block *b, bool by_key)
{
	return by_key ? &b->hnext_key : &b->hnext_ino;
}

static size_t bucket_of(struct kvfs_block *b, bool by_key, size_t nb)
{
	return (by_key ? key_hash(b->pn.key) : ino_hash(b->ino)) / KVFS_SHARDS % nb;
}

/* Caller holds s->lock. */
static int shard_grow(struct kvfs_shard *s, bool by_key)
{
	size_t nb = s->nb ? s->nb * 2 : 64;
	struct kvfs_block **nbk = calloc(nb, sizeof(*nbk));

	if (!nbk)
		return -ENOMEM;
	for (size_t i = 0; i < s->nb; i++) {
		struct kvfs_block *b = s->b[i], *next;

		for (; b; b = next) {
			size_t j = bucket_of(b, by_key, nb);

			next = *chain_next(b, by_key);
			*chain_next(b, by_key) = nbk[j];
			nbk[j] = b;
		}
	}
	free(s->b);
	s->b = nbk;
	s->nb = nb;
	return 0;
}

struct kvfs_block *kvfs_index_find_key(struct kvfs_cache *c,
				       const uint8_t key[KVFS_KEY_LEN])
{
	struct kvfs_shard *s = &c->by_key[key_hash(key) % KVFS_SHARDS];
	struct kvfs_block *b = NULL;

	pthread_mutex_lock(&s->lock);
	if (s->nb) {
		b = s->b[key_hash(key) / KVFS_SHARDS % s->nb];
		while (b && memcmp(b->pn.key, key, KVFS_KEY_LEN))
			b = b->hnext_key;
	}
	if (b)
		kvfs_block_get_ref(b);
	pthread_mutex_unlock(&s->lock);
	return b;
}

static struct kvfs_block *index_find_ino(struct kvfs_cache *c, uint64_t ino)
{
	struct kvfs_shard *s = &c->by_ino[ino_hash(ino) % KVFS_SHARDS];
	struct kvfs_block *b = NULL;

	pthread_mutex_lock(&s->lock);
	if (s->nb) {
		b = s->b[ino_hash(ino) / KVFS_SHARDS % s->nb];
		while (b && b->ino != ino)
			b = b->hnext_ino;
	}
	if (b)
		kvfs_block_get_ref(b);
	pthread_mutex_unlock(&s->lock);
	return b;
}

/* Insert into both tables; takes over one reference for the index.
 * -EEXIST if the key is already present.
 */
int kvfs_index_insert(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_shard *sk = &c->by_key[key_hash(b->pn.key) % KVFS_SHARDS];
	struct kvfs_shard *si = &c->by_ino[ino_hash(b->ino) % KVFS_SHARDS];
	struct kvfs_block *o;
	int rc = 0;

	pthread_mutex_lock(&sk->lock);
	if (sk->nb) {
		o = sk->b[bucket_of(b, true, sk->nb)];
		while (o && memcmp(o->pn.key, b->pn.key, KVFS_KEY_LEN))
			o = o->hnext_key;
		if (o) {
			rc = -EEXIST;
			goto out_unlock_key;
		}
	}
	if (sk->n + 1 > sk->nb * 2) {
		rc = shard_grow(sk, true);
		if (rc)
			goto out_unlock_key;
	}
	pthread_mutex_lock(&si->lock);
	if (si->n + 1 > si->nb * 2) {
		rc = shard_grow(si, false);
		if (rc) {
			pthread_mutex_unlock(&si->lock);
			goto out_unlock_key;
		}
	}
	size_t j = bucket_of(b, false, si->nb);
	b->hnext_ino = si->b[j];
	si->b[j] = b;
	si->n++;
	pthread_mutex_unlock(&si->lock);

	j = bucket_of(b, true, sk->nb);
	b->hnext_key = sk->b[j];
	sk->b[j] = b;
	sk->n++;
	atomic_fetch_add(&c->nblocks, 1);
out_unlock_key:
	pthread_mutex_unlock(&sk->lock);
	return rc;
}

static void shard_unlink(struct kvfs_shard *s, struct kvfs_block *b,
			 bool by_key)
{
	pthread_mutex_lock(&s->lock);
	if (s->nb) {
		struct kvfs_block **pp = &s->b[bucket_of(b, by_key, s->nb)];

		while (*pp && *pp != b)
			pp = chain_next(*pp, by_key);
		if (*pp) {
			*pp = *chain_next(b, by_key);
			s->n--;
		}
	}
	pthread_mutex_unlock(&s->lock);
}

/* Remove from both tables; the caller then drops the index's reference. */
void kvfs_index_remove(struct kvfs_cache *c, struct kvfs_block *b)
{
	shard_unlink(&c->by_key[key_hash(b->pn.key) % KVFS_SHARDS], b, true);
	shard_unlink(&c->by_ino[ino_hash(b->ino) % KVFS_SHARDS], b, false);
	atomic_fetch_sub(&c->nblocks, 1);
}

/* ----------------------------------------------------------- namespaces */

size_t kvfs_cache_ns_count(const struct kvfs_cache *c)
{
	return c->n_ns;
}

struct kvfs_ns *kvfs_cache_ns_at(struct kvfs_cache *c, size_t i)
{
	return i < c->n_ns ? &c->ns[i] : NULL;
}

struct kvfs_ns *kvfs_cache_ns_by_name(struct kvfs_cache *c, const char *name)
{
	for (size_t i = 0; i < c->n_ns; i++)
		if (!strcmp(c->ns[i].rec.name, name))
			return &c->ns[i];
	return NULL;
}

struct kvfs_ns *kvfs_cache_ns_by_ino(struct kvfs_cache *c, uint64_t ino)
{
	for (size_t i = 0; i < c->n_ns; i++)
		if (c->ns[i].ino == ino)
			return &c->ns[i];
	return NULL;
}

const char *kvfs_ns_name(const struct kvfs_ns *ns)
{
	return ns->rec.name;
}

uint64_t kvfs_ns_ino(const struct kvfs_ns *ns)
{
	return ns->ino;
}

const struct kvfs_geom *kvfs_ns_geom(const struct kvfs_ns *ns)
{
	return &ns->geom;
}

const uint8_t *kvfs_ns_root(const struct kvfs_ns *ns)
{
	return ns->rec.root;
}

uint64_t kvfs_ns_nblocks(const struct kvfs_ns *ns)
{
	struct kvfs_ns *m = (struct kvfs_ns *)ns;
	uint64_t n;

	pthread_rwlock_rdlock(&m->lock);
	n = m->n;
	pthread_rwlock_unlock(&m->lock);
	return n;
}

/* First index whose ino is greater than @ino. Caller holds ns->lock. */
static size_t ns_upper(const struct kvfs_ns *ns, uint64_t ino)
{
	size_t lo = 0, hi = ns->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ns->blocks[mid]->ino <= ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void kvfs_ns_add(struct kvfs_ns *ns, struct kvfs_block *b)
{
	pthread_rwlock_wrlock(&ns->lock);
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? ns->cap * 2 : 256;
		struct kvfs_block **nb = realloc(ns->blocks, cap * sizeof(*nb));

		if (!nb) {
			/* Listing is best effort; the block stays reachable
			 * by name.
			 */
			kvfs_err("ns %s: out of memory for the listing",
				 ns->rec.name);
			goto out_unlock;
		}
		ns->blocks = nb;
		ns->cap = cap;
	}
	size_t i = ns_upper(ns, b->ino);
	memmove(&ns->blocks[i + 1], &ns->blocks[i],
		(ns->n - i) * sizeof(*ns->blocks));
	ns->blocks[i] = b;
	ns->n++;
out_unlock:
	pthread_rwlock_unlock(&ns->lock);
}

void kvfs_ns_del(struct kvfs_ns *ns, struct kvfs_block *b)
{
	pthread_rwlock_wrlock(&ns->lock);
	size_t i = ns_upper(ns, b->ino);
	if (i > 0 && ns->blocks[i - 1] == b) {
		memmove(&ns->blocks[i - 1], &ns->blocks[i],
			(ns->n - i) * sizeof(*ns->blocks));
		ns->n--;
	}
	pthread_rwlock_unlock(&ns->lock);
}

int kvfs_ns_list(struct kvfs_ns *ns, uint64_t after,
		 int (*fn)(const char *name, uint64_t ino, void *arg),
		 void *arg)
{
	char name[KVFS_FMT_NAME_LEN + 1];
	int rc = 0;

	pthread_rwlock_rdlock(&ns->lock);
	for (size_t i = ns_upper(ns, after); i < ns->n && !rc; i++) {
		kvfs_fmt_key_hex(ns->blocks[i]->pn.key, name);
		memcpy(name + KVFS_KEY_HEX_LEN, ".kv", 4);
		rc = fn(name, ns->blocks[i]->ino, arg);
	}
	pthread_rwlock_unlock(&ns->lock);
	return rc > 0 ? 0 : rc;
}

/* --------------------------------------------------------------- blocks */

struct kvfs_block *kvfs_block_alloc(struct kvfs_ns *ns)
{
	struct kvfs_block *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->ns = ns;
	pthread_mutex_init(&b->lock, NULL);
	pthread_mutex_init(&b->io_lock, NULL);
	atomic_init(&b->refs, 1);
	for (int t = 0; t < KVFS_NTIERS; t++)
		b->pn.t[t].prev = b->pn.t[t].next = NULL;
	b->pn.next_use = UINT64_MAX;
	return b;
}

void kvfs_block_get_ref(struct kvfs_block *b)
{
	atomic_fetch_add(&b->refs, 1);
}

static void block_destroy(struct kvfs_cache *c, struct kvfs_block *b)
{
	/* A live block (shutdown) still owns its DRAM copy; a deleted one gave
	 * its space back in kvfs_block_try_free().
	 */
	if (!(atomic_load(&b->flags) & KVFS_B_FREED) && b->dram.ptr) {
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM],
						   &b->dram);
		atomic_fetch_sub(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	}
	if (!(atomic_load(&b->flags) & KVFS_B_FREED) && b->gpu.len) {
		c->tier[KVFS_TIER_GPU]->ops->free(c->tier[KVFS_TIER_GPU],
						  &b->gpu);
		atomic_fetch_sub(&c->tier[KVFS_TIER_GPU]->st.blocks, 1);
	}
	if (b->parent)
		kvfs_cache_put(c, b->parent);
	free(b->ccrc);
	pthread_mutex_destroy(&b->lock);
	pthread_mutex_destroy(&b->io_lock);
	free(b);
}

/*
 * Give a deleted block's DRAM copy and SSD extent back once nobody has it
 * open. Called by the delete and by the last reader; the FREED bit makes
 * it happen exactly once. The extent was already returned to the metadata
 * free map by the delete transaction; only now may the allocator reuse it.
 */
void kvfs_block_try_free(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_extent dx, sx, gx;
	unsigned f;

	if (!(atomic_load(&b->flags) & KVFS_B_DELETED) ||
	    atomic_load(&b->opens) > 0)
		return;
	f = atomic_fetch_or(&b->flags, KVFS_B_FREED);
	if (f & KVFS_B_FREED)
		return;
	kvfs_block_count_hidden(c, b, -1);
	pthread_mutex_lock(&b->lock);
	dx = b->dram;
	sx = b->ssd;
	gx = b->gpu;
	memset(&b->dram, 0, sizeof(b->dram));
	memset(&b->gpu, 0, sizeof(b->gpu));
	atomic_store(&b->dram_ptr, NULL);
	atomic_store(&b->tiers, 0);
	pthread_mutex_unlock(&b->lock);
	if (dx.ptr) {
		c->tier[KVFS_TIER_DRAM]->ops->free(c->tier[KVFS_TIER_DRAM], &dx);
		atomic_fetch_sub(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	}
	if (gx.len) {
		c->tier[KVFS_TIER_GPU]->ops->free(c->tier[KVFS_TIER_GPU], &gx);
		atomic_fetch_sub(&c->tier[KVFS_TIER_GPU]->st.blocks, 1);
	}
	if (f & KVFS_B_PERSISTED) {
		c->tier[KVFS_TIER_SSD]->ops->free(c->tier[KVFS_TIER_SSD], &sx);
		atomic_fetch_sub(&c->tier[KVFS_TIER_SSD]->st.blocks, 1);
		kvfs_wb_unstall(c);
	}
}

void kvfs_cache_put(struct kvfs_cache *c, struct kvfs_block *b)
{
	/* Parents are released iteratively through block_destroy's
	 * recursion; chains are bounded by prefix depth.
	 */
	if (b && atomic_fetch_sub(&b->refs, 1) == 1)
		block_destroy(c, b);
}

struct kvfs_ns *kvfs_block_ns(struct kvfs_block *b)
{
	return b->ns;
}

void kvfs_block_info(struct kvfs_block *b, struct kvfs_block_info *out)
{
	memset(out, 0, sizeof(*out));
	out->ino = b->ino;
	out->size = b->size;
	out->stored_size = b->ssize;
	out->stored_kind = b->kind;
	out->stored_kv_from = b->kv_from;
	out->n_layers = b->ns->geom.n_layers;
	out->created = b->created;
	out->last_access = atomic_load(&b->last_access);
	out->hits = atomic_load(&b->hits);
	out->n_tokens = b->n_tokens;
	out->depth = b->pn.depth;
	out->tiers = atomic_load(&b->tiers);
	out->pins = atomic_load(&b->pins);
	out->category = atomic_load(&b->category);
	out->leases = (uint32_t)atomic_load(&b->leases);
	out->persisted = atomic_load(&b->flags) & KVFS_B_PERSISTED;
	memcpy(out->key, b->pn.key, KVFS_KEY_LEN);
	memcpy(out->parent, b->parent_key, KVFS_KEY_LEN);
}

void kvfs_cache_record_fill(struct kvfs_block *b, struct kvfs_meta_blk *r)
{
	memset(r, 0, sizeof(*r));
	r->magic = KVFS_META_BLK_MAGIC;
	r->version = KVFS_META_VERSION;
	r->kind = b->kind;
	r->kv_from = b->kind == KVFS_KIND_MIXED ? b->kv_from : 0;
	r->ns_id = b->ns->rec.id;
	r->depth = b->pn.depth;
	r->ino = b->ino;
	memcpy(r->parent, b->parent_key, KVFS_KEY_LEN);
	r->n_tokens = b->n_tokens;
	r->hdr_crc = b->hdr_crc;
	r->size = b->ssize;
	r->ssd_off = b->ssd.off;
	r->ssd_len = b->ssd.len;
	r->start_pos = b->start_pos;
	r->pins = atomic_load(&b->pins);
	r->category = atomic_load(&b->category);
	r->hits = atomic_load(&b->hits);
	r->last_access = atomic_load(&b->last_access);
	r->tiers = atomic_load(&b->tiers);
	r->created = b->created;
}

int kvfs_cache_lookup(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name, struct kvfs_block **out)
{
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_block *b;

	if (kvfs_fmt_name_parse(name, key))
		return -EINVAL;
	b = kvfs_index_find_key(c, key);
	if (!b) {
		/* In no tier at all: a miss of the last tier. */
		atomic_fetch_add(&c->st_lookups_missing, 1);
		atomic_fetch_add(&c->tier[KVFS_TIER_SSD]->st.misses, 1);
		return -ENOENT;
	}
	if (b->ns != ns || (atomic_load(&b->flags) & KVFS_B_DELETED)) {
		kvfs_cache_put(c, b);
		return -ENOENT;
	}
	*out = b;
	return 0;
}

int kvfs_cache_get(struct kvfs_cache *c, uint64_t ino, struct kvfs_block **out)
{
	struct kvfs_block *b = index_find_ino(c, ino);

	if (!b)
		return -ENOENT;
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		kvfs_cache_put(c, b);
		return -ENOENT;
	}
	*out = b;
	return 0;
}

/* ---------------------------------------------------------- touch stack */

/*
 * Reads must not take the policy lock, so an access only pushes the block
 * on a lock-free stack (once until drained); the policy sees the accesses
 * when the mover thread or the next eviction drains it.
 */
void kvfs_cache_touch(struct kvfs_cache *c, struct kvfs_block *b)
{
	atomic_fetch_add(&b->hits, 1);
	atomic_store(&b->last_access, kvfs_util_now_real());
	atomic_store(&b->counters_dirty, true);
	if (atomic_exchange(&b->touched, true))
		return;
	kvfs_block_get_ref(b);
	struct kvfs_block *old = atomic_load(&c->touch_head);
	do {
		b->touch_next = old;
	} while (!atomic_compare_exchange_weak(&c->touch_head, &old, b));
}

/* Caller holds c->policy_lock. */
void kvfs_cache_drain_touches(struct kvfs_cache *c)
{
	struct kvfs_block *b = atomic_exchange(&c->touch_head, NULL);
	static atomic_uint_least64_t reqno;

	while (b) {
		struct kvfs_block *next = b->touch_next;
		struct kvfs_pnode *path = &b->pn;
		struct kvfs_paccess a = {
			.now = atomic_load(&b->last_access),
			.request = atomic_fetch_add(&reqno, 1),
			.hit = true,
		};

		atomic_store(&b->touched, false);
		if (!(atomic_load(&b->flags) & KVFS_B_DELETED) && b->pn.tiers)
			kvfs_policy_access(c->policy, &path, 1, &a);
		kvfs_cache_put(c, b);
		b = next;
	}
}

/* ----------------------------------------------------------- write path */

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

int kvfs_cache_pending_size(struct kvfs_cache *c, uint64_t ino,
			    uint64_t *size)
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
			  "(<32 hex>.kv)", ns->rec.name, name);
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
		if (!memcmp(q->key, p->key, KVFS_KEY_LEN))
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
			kvfs_warn("ns %s: write past the largest block (%" PRIu64
				  " bytes) refused", p->ns->rec.name,
				  p->ns->max_file);
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
	free(p->buf);
	free(p);
}

/* Prefix-tree checks the format cannot do alone: the parent, when we
 * have it, must be a full block that ends where this one starts.
 */
static int check_parent(struct kvfs_cache *c, struct kvfs_pending *p,
			const struct kvfs_fmt_hdr *h, struct kvfs_block **parent)
{
	struct kvfs_block *pb;
	char hex[KVFS_KEY_HEX_LEN + 1];

	*parent = NULL;
	if (!memcmp(h->parent, p->ns->rec.root, KVFS_KEY_LEN))
		return 0;
	pb = kvfs_index_find_key(c, h->parent);
	if (!pb)
		return 0; /* out-of-order writes are allowed: an orphan */
	kvfs_fmt_key_hex(p->key, hex);
	if (pb->ns != p->ns) {
		kvfs_warn("ns %s: block %s.kv rejected: its parent belongs to "
			  "namespace %s", p->ns->rec.name, hex,
			  pb->ns->rec.name);
		goto out_reject;
	}
	if (pb->n_tokens != p->ns->geom.block_tokens) {
		kvfs_warn("ns %s: block %s.kv rejected: its parent is a partial "
			  "block (%u of %u tokens) and cannot have children",
			  p->ns->rec.name, hex, pb->n_tokens,
			  p->ns->geom.block_tokens);
		goto out_reject;
	}
	if (pb->start_pos + pb->n_tokens != h->start_pos) {
		kvfs_warn("ns %s: block %s.kv rejected: start_pos %" PRIu64
			  " does not follow its parent's (%" PRIu64 ")",
			  p->ns->rec.name, hex, (uint64_t)h->start_pos,
			  pb->start_pos + pb->n_tokens);
		goto out_reject;
	}
	*parent = pb;
	return 0;
out_reject:
	kvfs_cache_put(c, pb);
	return -EINVAL;
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
			  "restoration, docs/hcache.md)", p->ns->rec.name, hex);
		rc = -EINVAL;
		goto out_reject;
	}
	fe = kvfs_fmt_validate(p->buf, p->size, &p->ns->geom, p->key,
			       p->ns->rec.root,
			       hc->rst ? KVFS_FMT_ALLOW_HIDDEN : 0, &h);
	pthread_mutex_unlock(&p->lock);
	if (fe != KVFS_FMT_OK) {
		kvfs_warn("ns %s: block %s.kv rejected (%" PRIu64
			  " bytes): %s", p->ns->rec.name, hex, p->size,
			  kvfs_fmt_strerror(fe));
		rc = kvfs_fmt_errno(fe);
		goto out_reject;
	}
	rc = check_parent(c, p, &h, &parent);
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
			  "nothing evictable", p->ns->rec.name, hex);
		goto out_put_parent;
	}
	if (convert) {
		uint64_t t0 = kvfs_util_now_mono();

		rc = kvfs_rpool_build(p->ns, NULL, p->buf, p->size,
				      hc->kv_from, ext.ptr, ext.len);
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

	b = kvfs_block_alloc(p->ns);
	if (!b) {
		rc = -ENOMEM;
		goto out_free_ext;
	}
	memcpy(b->pn.key, p->key, KVFS_KEY_LEN);
	b->pn.parent = parent ? &parent->pn : NULL;
	b->parent = parent;
	parent = NULL;
	/* An orphan may claim any position: saturate, don't wrap. */
	b->pn.depth = h.start_pos / p->ns->geom.block_tokens > UINT32_MAX ?
			      UINT32_MAX :
			      (uint32_t)(h.start_pos /
					 p->ns->geom.block_tokens);
	b->pn.tokens = h.n_tokens;
	b->pn.size = ssize;
	b->ino = p->ino;
	b->ssize = ssize;
	b->size = h.kind != KVFS_KIND_KV ?
			  kvfs_fmt_file_size(&p->ns->geom, KVFS_KIND_KV,
					     h.n_tokens) :
			  ssize;
	b->start_pos = h.start_pos;
	b->created = kvfs_util_now_real();
	b->n_tokens = h.n_tokens;
	b->hdr_crc = h.hdr_crc;
	b->kind = h.kind;
	b->kv_from = kvfs_fmt_hdr_kv_from(&h);
	memcpy(b->parent_key, h.parent, KVFS_KEY_LEN);
	b->dram = ext;
	atomic_store(&b->dram_ptr, ext.ptr);
	atomic_store(&b->tiers, KVFS_TIER_BIT_DRAM);
	atomic_store(&b->last_access, b->created);
	atomic_fetch_add(&dram->st.blocks, 1);
	/* Per-chunk checksums, while the image is at hand: sparse reads
	 * from the SSD verify each chunk with them.
	 */
	b->ccrc =
		kvfs_fmt_chunk_ncrcs(&b->ns->geom, b->n_tokens) ?
			malloc(kvfs_fmt_chunk_ncrcs(&b->ns->geom, b->n_tokens) *
			       sizeof(*b->ccrc)) :
			NULL;
	if (kvfs_fmt_chunk_ncrcs(&b->ns->geom, b->n_tokens) && !b->ccrc) {
		rc = -ENOMEM;
		goto out_free_block;
	}
	if (b->ccrc)
		kvfs_fmt_chunk_crcs(&b->ns->geom, b->n_tokens, b->kv_from,
				    ext.ptr, b->ccrc);

	/* One reference for the index, one for the caller. */
	atomic_store(&b->refs, 2);
	rc = kvfs_index_insert(c, b);
	if (rc) {
		kvfs_warn("ns %s: block %s.kv: committed concurrently by "
			  "another writer", p->ns->rec.name, hex);
		atomic_store(&b->refs, 1);
		kvfs_cache_put(c, b); /* frees the DRAM extent with it */
		b = NULL;
		goto out_abandon;
	}
	kvfs_ns_add(p->ns, b);
	atomic_fetch_add(&dram->st.bytes_written, b->ssize);
	kvfs_block_count_hidden(c, b, 1);

	pthread_mutex_lock(&c->policy_lock);
	struct kvfs_paccess a = { .now = b->created };
	kvfs_policy_insert(c->policy, KVFS_TIER_DRAM, &b->pn, &a);
	pthread_mutex_unlock(&c->policy_lock);

	atomic_fetch_add(&c->st_commits, 1);
	kvfs_wb_enqueue(c, b);
	kvfs_cache_abandon(c, p);
	*out = b;
	return 0;

out_free_block:
	atomic_store(&b->refs, 1);
	kvfs_cache_put(c, b); /* frees the DRAM extent with it */
	ext.ptr = NULL;
	goto out_put_parent;
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

int kvfs_cache_sync(struct kvfs_cache *c, struct kvfs_block *b)
{
	int rc = 0;

	pthread_mutex_lock(&c->wb_lock);
	for (;;) {
		unsigned f = atomic_load(&b->flags);

		if (f & KVFS_B_PERSISTED)
			break;
		if (f & KVFS_B_DELETED) {
			rc = -ENOENT;
			break;
		}
		if (f & KVFS_B_WBERR) {
			rc = atomic_load(&b->wb_err) ? atomic_load(&b->wb_err)
						     : -EIO;
			break;
		}
		if (!c->wb_started) {
			/* No thread (tests): run the pass ourselves. */
			pthread_mutex_unlock(&c->wb_lock);
			rc = kvfs_wb_pass(c);
			pthread_mutex_lock(&c->wb_lock);
			if (rc)
				break;
			continue;
		}
		pthread_cond_signal(&c->wb_cond);
		pthread_cond_wait(&c->wb_done, &c->wb_lock);
	}
	pthread_mutex_unlock(&c->wb_lock);
	return rc;
}

/* ------------------------------------------------------------ read path */

int kvfs_cache_reader_init(struct kvfs_cache *c, struct kvfs_reader *r,
			   struct kvfs_block *b)
{
	memset(r, 0, sizeof(*r));
	atomic_fetch_add(&b->opens, 1);
	/* Pairs with kvfs_block_delete(): it sets DELETED, then looks at
	 * opens; we count ourselves, then look at DELETED.
	 */
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		atomic_fetch_sub(&b->opens, 1);
		kvfs_block_try_free(c, b);
		kvfs_cache_put(c, b);
		return -ENOENT;
	}
	r->b = b;
	if (atomic_load(&b->dram_ptr))
		atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.hits, 1);
	else
		atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.misses, 1);
	kvfs_cache_touch(c, b);
	return 0;
}

void kvfs_cache_reader_release(struct kvfs_cache *c, struct kvfs_reader *r)
{
	if (!r->b)
		return;
	free(r->priv);
	atomic_fetch_sub(&r->b->opens, 1);
	kvfs_block_try_free(c, r->b);
	kvfs_cache_put(c, r->b);
	memset(r, 0, sizeof(*r));
}

/* Verify a block image read back from the SSD against what we know of it;
 * torn or misdirected bytes are never served.
 */
static int verify_loaded(struct kvfs_cache *c, struct kvfs_block *b,
			 const void *buf)
{
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;

	fe = kvfs_fmt_validate(buf, b->ssize, &b->ns->geom, b->pn.key,
			       b->ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED,
			       &h);
	if (fe == KVFS_FMT_OK && h.hdr_crc == b->hdr_crc)
		return 0;
	kvfs_fmt_key_hex(b->pn.key, hex);
	kvfs_err("ns %s: block %s.kv: SSD copy at offset %" PRIu64
		 " fails verification (%s): not served",
		 b->ns->rec.name, hex, b->ssd.off,
		 fe == KVFS_FMT_OK ? "header does not match the record"
				   : kvfs_fmt_strerror(fe));
	atomic_fetch_add(&c->st_csum_errors, 1);
	return -EBADMSG;
}

int kvfs_block_publish_dram(struct kvfs_cache *c, struct kvfs_block *b,
			    const struct kvfs_extent *ext)
{
	struct kvfs_paccess a = { .now = kvfs_util_now_real() };

	/* The delete sets DELETED, then makes the policy forget the block
	 * under policy_lock: seen here under that lock, DELETED means the
	 * forget is done or will follow this insert.  Once deleted, nothing
	 * would take the node out of the policy again before the block is
	 * freed, so a deleted block gets no DRAM copy.
	 */
	pthread_mutex_lock(&c->policy_lock);
	pthread_mutex_lock(&b->lock);
	if (atomic_load(&b->flags) & KVFS_B_DELETED) {
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&c->policy_lock);
		return -ENOENT;
	}
	b->dram = *ext;
	atomic_store(&b->dram_ptr, ext->ptr);
	atomic_fetch_or(&b->tiers, KVFS_TIER_BIT_DRAM);
	pthread_mutex_unlock(&b->lock);
	kvfs_policy_insert(c->policy, KVFS_TIER_DRAM, &b->pn, &a);
	pthread_mutex_unlock(&c->policy_lock);
	atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.blocks, 1);
	return 0;
}

/*
 * Load @b from the SSD (io_uring, O_DIRECT, verified). @mode says where
 * the copy goes:
 *   KVFS_LOAD_READ   into DRAM if the policy admits it there (a block
 *                    pinned in DRAM always is) and room can be made, else
 *                    into a private buffer returned in *priv (the
 *                    reader's own copy);
 *   KVFS_LOAD_PIN    into DRAM, evicting others if needed, or -ENOSPC;
 *   KVFS_LOAD_MOVE   into DRAM only if it has free room now (promotion
 *                    never grows the upper tier), else -ENOSPC;
 *   KVFS_LOAD_PRIV   always into a private buffer (*priv, 4096-aligned,
 *                    *priv_len the SSD extent's length; the caller frees
 *                    it): a stored image wanted only once, for a
 *                    restoration straight into the device pool.
 * Caller holds b->io_lock.
 */
int kvfs_block_load(struct kvfs_cache *c, struct kvfs_block *b, int mode,
		    void **priv, uint64_t *priv_len)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	struct kvfs_tier *dram = c->tier[KVFS_TIER_DRAM];
	struct kvfs_extent ext = { 0 }, sx;
	bool admit = true;
	void *buf;
	int rc;

	pthread_mutex_lock(&b->lock);
	sx = b->ssd;
	rc = (atomic_load(&b->flags) & KVFS_B_PERSISTED) ? 0 : -EIO;
	pthread_mutex_unlock(&b->lock);
	if (rc) {
		kvfs_err("block ino %" PRIu64 " has no copy in any tier",
			 b->ino);
		return rc;
	}
	if (mode == KVFS_LOAD_READ)
		admit = kvfs_block_dram_admit(c, b, KVFS_TIER_SSD);
	if (mode == KVFS_LOAD_MOVE)
		rc = dram->ops->alloc(dram, sx.len, &ext);
	else if (admit && mode != KVFS_LOAD_PRIV)
		rc = kvfs_dram_reserve(c, sx.len, &ext);
	else
		rc = -ENOSPC;
	if (rc && mode != KVFS_LOAD_READ && mode != KVFS_LOAD_PRIV)
		return rc;
	if (!rc)
		buf = ext.ptr;
	else if (posix_memalign(&buf, KVFS_FMT_ALIGN, sx.len))
		return -ENOMEM;
	rc = ssd->ops->read(ssd, &sx, 0, buf, sx.len);
	if (!rc)
		rc = verify_loaded(c, b, buf);
	if (rc)
		goto out_free;
	atomic_fetch_add(&ssd->st.hits, 1);
	if (!ext.ptr) {
		*priv = buf;
		*priv_len = sx.len;
		return 0;
	}
	if (kvfs_block_publish_dram(c, b, &ext)) {
		/* Deleted meanwhile (still open): a reader gets its own
		 * copy, a move or a pin has nothing left to do.
		 */
		rc = -ENOENT;
		if (mode != KVFS_LOAD_READ)
			goto out_free;
		if (posix_memalign(&buf, KVFS_FMT_ALIGN, sx.len)) {
			rc = -ENOMEM;
			goto out_free;
		}
		memcpy(buf, ext.ptr, sx.len);
		dram->ops->free(dram, &ext);
		*priv = buf;
		*priv_len = sx.len;
		return 0;
	}
	/* Promoted (or prefetched) hidden states are restored before a
	 * reader asks: the read then finds the KV image in DRAM.
	 */
	if (mode == KVFS_LOAD_MOVE && kvfs_block_needs_restore(b))
		kvfs_rpool_ahead(c, b);
	return 0;

out_free:
	if (ext.ptr)
		dram->ops->free(dram, &ext);
	else
		free(buf);
	return rc;
}

/*
 * The published DRAM copy of @b if readers may be served from it, with
 * @b->readers counted; NULL (not counted) otherwise.  A block stored as
 * hidden states is served only once its DRAM copy is the KV image.
 */
static uint8_t *dram_servable(struct kvfs_block *b)
{
	uint8_t *base;

	atomic_fetch_add(&b->readers, 1);
	base = atomic_load(&b->dram_ptr);
	if (base && (!kvfs_block_needs_restore(b) ||
		     kvfs_fmt_img_kind(base) == KVFS_KIND_KV))
		return base;
	atomic_fetch_sub(&b->readers, 1);
	return NULL;
}

int kvfs_cache_read_begin(struct kvfs_cache *c, struct kvfs_reader *r,
			  uint64_t off, size_t len, const void **ptr,
			  size_t *n)
{
	struct kvfs_block *b = r->b;
	uint8_t *base;
	int rc;

	if (off >= b->size) {
		*ptr = NULL;
		*n = 0;
		r->in_dram = false;
		return 0;
	}
	if (len > b->size - off)
		len = (size_t)(b->size - off);
	for (;;) {
		if (r->priv) {
			base = r->priv;
			r->in_dram = false;
			break;
		}
		/* Hot path: no lock. Count ourselves first, then look; the
		 * evictor unpublishes first, then checks the count.
		 */
		base = dram_servable(b);
		if (base) {
			r->in_dram = true;
			break;
		}
		if (kvfs_block_needs_restore(b)) {
			/* Never the stored bytes: wait for the KV image. */
			rc = kvfs_rpool_wait(c, b, &r->priv, &r->priv_len);
			if (rc)
				return rc;
			continue;
		}
		pthread_mutex_lock(&b->io_lock);
		rc = atomic_load(&b->dram_ptr)
			     ? 0
			     : kvfs_block_load(c, b, KVFS_LOAD_READ, &r->priv,
					       &r->priv_len);
		pthread_mutex_unlock(&b->io_lock);
		if (rc)
			return rc;
	}
	/* SSD bytes are counted by the tier as they are read from the
	 * device; here only what DRAM serves.
	 */
	if (r->in_dram)
		atomic_fetch_add(&c->tier[KVFS_TIER_DRAM]->st.bytes_read, len);
	*ptr = base + off;
	*n = len;
	return 0;
}

void kvfs_cache_read_end(struct kvfs_cache *c, struct kvfs_reader *r)
{
	if (r->in_dram) {
		atomic_fetch_sub(&r->b->readers, 1);
		r->in_dram = false;
	}
}

/* ---------------------------------------------------------------- admin */

void kvfs_cache_set_delete_hook(struct kvfs_cache *c,
				void (*fn)(void *arg, uint64_t dir_ino,
					   const char *name),
				void *arg)
{
	c->delete_hook = fn;
	c->delete_hook_arg = arg;
}

int kvfs_cache_unlink(struct kvfs_cache *c, struct kvfs_ns *ns,
		      const char *name)
{
	struct kvfs_block *b;
	int rc = kvfs_cache_lookup(c, ns, name, &b);

	if (rc)
		return rc == -EINVAL ? -ENOENT : rc;
	if (atomic_load(&b->pins)) {
		kvfs_info("ns %s: unlink %s refused: the block is pinned "
			  "(remove user.kvfs.pin first)", ns->rec.name, name);
		kvfs_cache_put(c, b);
		return -EBUSY;
	}
	rc = kvfs_block_delete(c, b, "unlinked");
	kvfs_cache_put(c, b);
	return rc;
}

/* Write the block's current record, if it has one. Caller holds
 * c->meta_lock.
 */
static int record_update(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_meta_txn *t;
	struct kvfs_meta_blk r;
	int rc;

	/* Deleted (unlinked, evicted) meanwhile: its record is gone for
	 * good, and writing it again would bring the block back on an
	 * extent already freed. DELETED is set under meta_lock, which the
	 * caller holds.
	 */
	if (atomic_load(&b->flags) & KVFS_B_DELETED)
		return -ENOENT;
	if (!(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		return 0; /* the write-back will record the current state */
	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->lock);
	kvfs_cache_record_fill(b, &r);
	pthread_mutex_unlock(&b->lock);
	rc = kvfs_meta_blk_put(t, b->pn.key, &r);
	if (rc) {
		kvfs_meta_txn_abort(t);
		return rc;
	}
	return kvfs_meta_txn_commit(t);
}

int kvfs_block_pin_load(struct kvfs_cache *c, struct kvfs_block *b)
{
	struct kvfs_reader r;
	int rc;

	if (atomic_load(&b->dram_ptr))
		return 0;
	/* Held open across the load, so that a delete meanwhile cannot
	 * free the block under it.
	 */
	kvfs_block_get_ref(b);
	rc = kvfs_cache_reader_init(c, &r, b);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->io_lock);
	rc = atomic_load(&b->dram_ptr)
		     ? 0
		     : kvfs_block_load(c, b, KVFS_LOAD_PIN, NULL, NULL);
	pthread_mutex_unlock(&b->io_lock);
	kvfs_cache_reader_release(c, &r);
	return rc;
}

int kvfs_cache_pin(struct kvfs_cache *c, struct kvfs_block *b, int tier)
{
	unsigned bit, old;
	int rc = 0;

	if (tier < 0 || tier >= KVFS_NTIERS || !c->tier[tier]) {
		kvfs_warn("pin refused: tier %s is not configured",
			  kvfs_tier_name(tier));
		return -EINVAL;
	}
	bit = 1u << tier;
	if (tier == KVFS_TIER_GPU) {
		/* The pool does not survive a restart; neither does this pin,
		 * so it is not recorded.
		 */
		old = atomic_fetch_or(&b->pins, bit);
		rc = kvfs_gpu_load(c, &b, 1, 0);
		goto out_undo;
	}
	if (tier == KVFS_TIER_SSD) {
		rc = kvfs_cache_sync(c, b);
		if (rc)
			return rc;
	}
	/* Pin first so that eviction skips the block from now on, then make
	 * sure it is resident.
	 */
	old = atomic_fetch_or(&b->pins, bit);
	if (tier == KVFS_TIER_DRAM) {
		rc = kvfs_block_pin_load(c, b);
		if (rc)
			goto out_undo;
	}
	pthread_mutex_lock(&c->meta_lock);
	rc = record_update(c, b);
	pthread_mutex_unlock(&c->meta_lock);
out_undo:
	/* A failed pin takes back only what it added: a DRAM pin recorded
	 * before, one a restart could not load yet, is the admin's and
	 * stays.
	 */
	if (rc && !(old & bit))
		atomic_fetch_and(&b->pins, ~bit);
	return rc;
}

int kvfs_cache_unpin(struct kvfs_cache *c, struct kvfs_block *b)
{
	unsigned old = atomic_exchange(&b->pins, 0);
	int rc;

	pthread_mutex_lock(&c->meta_lock);
	rc = record_update(c, b);
	pthread_mutex_unlock(&c->meta_lock);
	if (rc)
		atomic_store(&b->pins, old);
	return rc;
}

int kvfs_cache_set_category(struct kvfs_cache *c, struct kvfs_block *b,
			    uint32_t category)
{
	if (category > 0xffff)
		return -EINVAL;
	atomic_store(&b->category, category);
	pthread_mutex_lock(&c->policy_lock);
	b->pn.category = (uint16_t)category;
	pthread_mutex_unlock(&c->policy_lock);
	atomic_store(&b->counters_dirty, true);
	return 0;
}

void kvfs_cache_fsinfo(struct kvfs_cache *c, struct kvfs_cache_fsinfo *fi)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];

	fi->ssd_capacity = ssd->capacity;
	fi->ssd_free = ssd->capacity - atomic_load(&ssd->used);
	fi->blocks = atomic_load(&c->nblocks);
}

/*
 * Blocks pinned in DRAM, and of those the ones without a DRAM copy now (a
 * pin kept across a restart that could not load them).  Counted when
 * asked: pins change in several places, a walk over the listings cannot
 * drift from them.
 */
static void dram_pin_counts(struct kvfs_cache *c, uint64_t *pinned,
			    uint64_t *waiting)
{
	*pinned = *waiting = 0;
	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];

		pthread_rwlock_rdlock(&ns->lock);
		for (size_t j = 0; j < ns->n; j++) {
			struct kvfs_block *b = ns->blocks[j];

			if (!(atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM))
				continue;
			(*pinned)++;
			if (!(atomic_load(&b->tiers) & KVFS_TIER_BIT_DRAM))
				(*waiting)++;
		}
		pthread_rwlock_unlock(&ns->lock);
	}
}

int kvfs_cache_stats(struct kvfs_cache *c, char **buf, size_t *len)
{
	uint64_t pins, waiting;
	char *s = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);

	if (!f)
		return -ENOMEM;
	for (int i = 0; i < KVFS_NTIERS; i++) {
		struct kvfs_tier *t = c->tier[i];
		const char *nm = kvfs_tier_name(i);

		if (!t)
			continue;
#define ST(k, v) fprintf(f, "tier.%s.%s %" PRIu64 "\n", nm, k, (uint64_t)(v))
		ST("capacity_bytes", t->capacity);
		ST("used_bytes", atomic_load(&t->used));
		ST("blocks", atomic_load(&t->st.blocks));
		ST("hits", atomic_load(&t->st.hits));
		ST("misses", atomic_load(&t->st.misses));
		ST("evictions", atomic_load(&t->st.evictions));
		ST("bytes_read", atomic_load(&t->st.bytes_read));
		ST("bytes_written", atomic_load(&t->st.bytes_written));
		ST("io_reads", atomic_load(&t->st.reads));
		ST("io_writes", atomic_load(&t->st.writes));
		if (i == KVFS_TIER_GPU) {
			/* Uploads straight from pinned DRAM, and through the
			 * staging buffers.
			 */
			ST("direct_bytes", atomic_load(&t->st.direct_bytes));
			ST("staged_bytes", atomic_load(&t->st.staged_bytes));
		}
#undef ST
	}
	pthread_mutex_lock(&c->wb_lock);
	uint64_t queued = c->wb_queued + c->wb_inflight;
	pthread_mutex_unlock(&c->wb_lock);
	pthread_mutex_lock(&c->policy_lock);
	const char *pol = c->policy->ops->name;
	pthread_mutex_unlock(&c->policy_lock);
#define CS(k, v) fprintf(f, "%s %" PRIu64 "\n", k, (uint64_t)(v))
	fprintf(f, "policy.name %s\n", pol);
	CS("cache.blocks", atomic_load(&c->nblocks));
	CS("cache.commits", atomic_load(&c->st_commits));
	CS("cache.rejects", atomic_load(&c->st_rejects));
	CS("cache.deletes", atomic_load(&c->st_deletes));
	CS("cache.lookup_misses", atomic_load(&c->st_lookups_missing));
	CS("cache.checksum_errors", atomic_load(&c->st_csum_errors));
	dram_pin_counts(c, &pins, &waiting);
	CS("cache.dram_pins", pins);
	CS("cache.dram_pins_waiting", waiting);
	CS("writeback.queued", queued);
	CS("writeback.batches", atomic_load(&c->st_wb_batches));
	CS("writeback.blocks", atomic_load(&c->st_wb_blocks));
	CS("writeback.errors", atomic_load(&c->st_wb_errors));
	CS("writeback.stalled", atomic_load(&c->wb_nstalled));
	CS("meta.counter_flushes", atomic_load(&c->st_counter_flushes));
	CS("policy.discarded", atomic_load(&c->st_discards));
	CS("policy.promoted", atomic_load(&c->st_promoted));
	CS("policy.demoted", atomic_load(&c->st_demoted));
	CS("policy.promote_passes", atomic_load(&c->st_promote_passes));
	CS("ctl.leases", atomic_load(&c->st_leases));
	CS("ctl.leases_reclaimed", atomic_load(&c->st_leases_reclaimed));
	CS("ctl.fetches", atomic_load(&c->st_fetches));
	CS("ctl.fetch_bytes", atomic_load(&c->st_fetch_bytes));
	CS("ctl.fetch_into_bytes", atomic_load(&c->st_fetch_into_bytes));
	CS("ctl.saves", atomic_load(&c->st_saves));
	if (c->chunks) {
		struct kvfs_chunk_stats ks;

		kvfs_chunk_get_stats(c, &ks);
		CS("chunk.bytes_wanted", ks.bytes_wanted);
		CS("chunk.bytes_read", ks.bytes_read);
		CS("chunk.bytes_missed", ks.bytes_missed);
		/* Bytes read from the SSD per byte the SSD had to serve, in
		 * thousandths: 1000 means no amplification.
		 */
		CS("chunk.read_amplification_milli",
		   ks.bytes_missed ? ks.bytes_read * 1000 / ks.bytes_missed
				   : 0);
		CS("chunk.ssd_reads", ks.ssd_reads);
		CS("chunk.mem_hits", ks.mem_hits);
		CS("chunk.spec_loaded", ks.spec_loaded);
		CS("chunk.spec_used", ks.spec_used);
		CS("chunk.prefetch_joined", ks.prefetch_joined);
		CS("chunk.spec_cancelled", ks.spec_cancelled);
		CS("chunk.dram_used", ks.dram_used);
		CS("chunk.dram_pieces", ks.dram_pieces);
		CS("chunk.gpu_used", ks.gpu_used);
		CS("chunk.gpu_pieces", ks.gpu_pieces);
		CS("chunk.evictions", ks.evictions);
		CS("chunk.demotions", ks.demotions);
	}
	for (size_t i = 0; i < c->n_ns; i++)
		fprintf(f, "ns.%s.blocks %" PRIu64 "\n", c->ns[i].rec.name,
			kvfs_ns_nblocks(&c->ns[i]));
#undef CS
	kvfs_rpool_stats(c, f);
	if (fclose(f)) {
		free(s);
		return -ENOMEM;
	}
	*buf = s;
	*len = n;
	return 0;
}
