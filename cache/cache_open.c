/* SPDX-License-Identifier: MIT */
/*
 * Start-up and shutdown of the cache engine: namespaces against the
 * config, recovery of the block index from LMDB, the free-map check, and
 * an orderly stop that persists every committed block.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "cache/rpool_i.h"
#include "tier/extent.h"
#include "cache/chunk.h"
#include "cache/ctl.h"
#include <unistd.h>
#include "meta/log.h"
#include "meta/util.h"

/* ----------------------------------------------------------- namespaces */

struct ns_list {
	struct kvfs_meta_ns *v;
	size_t n, cap;
};

static int collect_ns(const struct kvfs_meta_ns *ns, void *arg)
{
	struct ns_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		void *nv = realloc(l->v, cap * sizeof(*l->v));

		if (!nv)
			return -ENOMEM;
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = *ns;
	return 0;
}

static void geom_from_rec(const struct kvfs_meta_ns *r, struct kvfs_geom *g)
{
	memset(g, 0, sizeof(*g));
	g->n_layers = r->n_layers;
	g->n_kv_heads = r->n_kv_heads;
	g->head_dim = r->head_dim;
	g->hidden_size = r->hidden_size;
	g->block_tokens = r->block_tokens;
	g->chunk_tokens = r->chunk_tokens;
	g->dtype = r->dtype;
}

/* A stored namespace's geometry is fixed: every block depends on it. */
/* The uid whose device pool holds namespace @name's blocks: its owner in
 * the config, else the mounting user.
 */
static uint32_t ns_owner(const struct kvfs_cache *c, const char *name)
{
	for (size_t i = 0; i < c->conf.n_ns; i++)
		if (!strcmp(c->conf.ns[i].name, name) &&
		    c->conf.ns[i].acc.has_uid)
			return c->conf.ns[i].acc.uid;
	return (uint32_t)getuid();
}

static int ns_compare(const struct kvfs_ns_params *cn,
		      const struct kvfs_meta_ns *r)
{
	struct kvfs_geom g;
	const char *field = NULL;
	uint8_t root[KVFS_KEY_LEN];

	geom_from_rec(r, &g);
	kvfs_fmt_root_key_model(cn->name, cn->salt, cn->model_digest, root);
	if (cn->geom.n_layers != g.n_layers)
		field = "layers";
	else if (cn->geom.n_kv_heads != g.n_kv_heads)
		field = "kv_heads";
	else if (cn->geom.head_dim != g.head_dim)
		field = "head_dim";
	else if (cn->geom.dtype != g.dtype)
		field = "dtype";
	else if (cn->geom.block_tokens != g.block_tokens)
		field = "block_tokens";
	else if (cn->geom.chunk_tokens != g.chunk_tokens)
		field = "chunk_tokens";
	else if (cn->geom.hidden_size != g.hidden_size)
		field = "hidden_size";
	else if (strcmp(cn->salt, r->salt))
		field = "salt";
	else if (memcmp(root, r->root, sizeof(root)))
		field = "model_digest";
	if (!field)
		return 0;
	kvfs_err("namespace %s: the config changes '%s' of a stored "
		 "namespace; its blocks were written for the stored value. "
		 "Restore the old value or use a new namespace name",
		 cn->name, field);
	return -EINVAL;
}

static const char *store_as_name(uint32_t v)
{
	switch (v) {
	case KVFS_STORE_KV:
		return "kv";
	case KVFS_STORE_HIDDEN:
		return "hidden";
	case KVFS_STORE_AUTO:
		return "auto";
	}
	return "unknown";
}

static int setup_namespaces(struct kvfs_cache *c)
{
	struct ns_list stored = { 0 };
	struct kvfs_meta_txn *t;
	struct kvfs_meta_sb sb;
	bool dirty = false;
	size_t total;
	int rc;

	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	if (rc)
		return rc;
	rc = kvfs_meta_sb_get(t, &sb);
	if (!rc)
		rc = kvfs_meta_ns_foreach(t, collect_ns, &stored);
	if (rc)
		goto out_abort;

	total = stored.n + c->conf.n_ns;
	c->ns = calloc(total ? total : 1, sizeof(*c->ns));
	if (!c->ns) {
		rc = -ENOMEM;
		goto out_abort;
	}
	/* Stored namespaces keep their ids; a config may not hide one. */
	for (size_t i = 0; i < stored.n; i++) {
		const struct kvfs_ns_params *cn = NULL;

		for (size_t j = 0; j < c->conf.n_ns; j++)
			if (!strcmp(c->conf.ns[j].name, stored.v[i].name))
				cn = &c->conf.ns[j];
		if (cn) {
			rc = ns_compare(cn, &stored.v[i]);
			if (rc)
				goto out_abort;
			/* store_as only governs blocks written from now on:
			 * each record says what it holds.
			 */
			if (cn->hc.store_as != stored.v[i].store_as) {
				kvfs_info("namespace %s: store_as changes from "
					  "%s to %s; stored blocks keep their "
					  "form", cn->name,
					  store_as_name(stored.v[i].store_as),
					  store_as_name(cn->hc.store_as));
				stored.v[i].store_as = cn->hc.store_as;
				rc = kvfs_meta_ns_put(t, &stored.v[i]);
				if (rc)
					goto out_abort;
				dirty = true;
			}
		} else {
			if (stored.v[i].store_as > KVFS_STORE_AUTO) {
				kvfs_warn("namespace %s: stored store_as %u is "
					  "unknown; it has no weights here, so "
					  "HIDDEN writes are refused anyway",
					  stored.v[i].name,
					  stored.v[i].store_as);
			}
			kvfs_info("namespace %s is stored but not in the "
				  "config: kept, with its stored geometry",
				  stored.v[i].name);
		}
		c->ns[c->n_ns++].rec = stored.v[i];
	}
	for (size_t j = 0; j < c->conf.n_ns; j++) {
		const struct kvfs_ns_params *cn = &c->conf.ns[j];
		struct kvfs_meta_ns *r;

		if (kvfs_cache_ns_by_name(c, cn->name))
			continue;
		r = &c->ns[c->n_ns++].rec;
		memset(r, 0, sizeof(*r));
		r->magic = KVFS_META_NS_MAGIC;
		r->version = KVFS_META_VERSION;
		r->id = sb.next_ns_id ? sb.next_ns_id : 1;
		sb.next_ns_id = r->id + 1;
		r->dtype = cn->geom.dtype;
		r->n_layers = cn->geom.n_layers;
		r->n_kv_heads = cn->geom.n_kv_heads;
		r->head_dim = cn->geom.head_dim;
		r->hidden_size = cn->geom.hidden_size;
		r->block_tokens = cn->geom.block_tokens;
		r->chunk_tokens = cn->geom.chunk_tokens;
		r->store_as = cn->hc.store_as;
		snprintf(r->name, sizeof(r->name), "%s", cn->name);
		snprintf(r->salt, sizeof(r->salt), "%s", cn->salt);
		kvfs_fmt_root_key_model(r->name, r->salt, cn->model_digest,
					r->root);
		r->created = kvfs_util_now_real();
		rc = kvfs_meta_ns_put(t, r);
		if (rc)
			goto out_abort;
		dirty = true;
		kvfs_info("namespace %s created (id %u)", r->name, r->id);
	}
	if (dirty) {
		rc = kvfs_meta_sb_put(t, &sb);
		if (rc)
			goto out_abort;
		rc = kvfs_meta_txn_commit(t);
	} else {
		kvfs_meta_txn_abort(t);
	}
	free(stored.v);
	if (rc)
		return rc;

	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];

		ns->c = c;
		ns->owner = ns_owner(c, ns->rec.name);
		/* Records written before they kept a time: the store's. */
		ns->created = ns->rec.created ? ns->rec.created :
						sb.created * 1000000000ull;
		atomic_init(&ns->changed, ns->created);
		geom_from_rec(&ns->rec, &ns->geom);
		ns->ino = KVFS_INO_NS_BASE + ns->rec.id;
		ns->max_file = kvfs_fmt_max_file_size(&ns->geom);
		pthread_rwlock_init(&ns->lock, NULL);
		if (ns->rec.id >= KVFS_INO_BLOCK_BASE - KVFS_INO_NS_BASE) {
			kvfs_err("namespace %s: id %u out of range",
				 ns->rec.name, ns->rec.id);
			return -EUCLEAN;
		}
		/* DRAM is taken in 4 KiB units. */
		if (!ns->max_file ||
		    kvfs_util_align_up(ns->max_file, KVFS_FMT_ALIGN) >
			    c->conf.dram_capacity) {
			kvfs_err("namespace %s: a full block is %" PRIu64
				 " bytes, more than the DRAM tier's capacity "
				 "(%" PRIu64 "); raise [tier.dram] capacity",
				 ns->rec.name, ns->max_file,
				 c->conf.dram_capacity);
			return -EINVAL;
		}
	}
	return 0;

out_abort:
	kvfs_meta_txn_abort(t);
	free(stored.v);
	return rc;
}

/* ------------------------------------------------------------- recovery */

struct rec_item {
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_meta_blk r;
};

struct rec_list {
	struct rec_item *v;
	size_t n, cap;
	size_t bad;
};

static int collect_blk(const uint8_t *key, const struct kvfs_meta_blk *r,
		       bool bad, void *arg)
{
	struct rec_list *l = arg;
	char hex[KVFS_KEY_HEX_LEN + 1];

	if (bad) {
		kvfs_fmt_key_hex(key, hex);
		kvfs_err("block record %s is damaged or of another version: "
			 "ignored", hex);
		l->bad++;
		return 0;
	}
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 1024;
		void *nv = realloc(l->v, cap * sizeof(*l->v));

		if (!nv)
			return -ENOMEM;
		l->v = nv;
		l->cap = cap;
	}
	memcpy(l->v[l->n].key, key, KVFS_KEY_LEN);
	l->v[l->n++].r = *r;
	return 0;
}

static int by_last_access(const void *a, const void *b)
{
	const struct rec_item *x = a, *y = b;

	return (x->r.last_access > y->r.last_access) -
	       (x->r.last_access < y->r.last_access);
}

struct free_cmp {
	const struct kvfs_extent_map *m;
	size_t i;
	bool differs;
};

static int cmp_free(uint64_t off, uint64_t len, void *arg)
{
	struct free_cmp *fc = arg;

	if (fc->i >= fc->m->n || fc->m->r[fc->i].off != off ||
	    fc->m->r[fc->i].len != len)
		fc->differs = true;
	fc->i++;
	return 0;
}

/*
 * The persistent free map must be the complement of the recorded extents.
 * A mismatch means damage or a bug: say so and rewrite it from the
 * records, which are the truth.
 */
static int check_free_map(struct kvfs_cache *c, struct rec_list *l)
{
	struct kvfs_extent_map m;
	struct kvfs_meta_txn *t;
	struct free_cmp fc = { 0 };
	uint64_t base = c->store->sb.data_off, size = c->store->sb.ssd_size;
	int rc;

	rc = kvfs_extent_init(&m, base, size - base, KVFS_FMT_ALIGN);
	if (rc)
		return rc;
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i].r.ssd_len)
			kvfs_extent_claim(&m, l->v[i].r.ssd_off,
					  l->v[i].r.ssd_len);
	fc.m = &m;
	rc = kvfs_meta_txn_begin(c->store->meta, true, &t);
	if (rc)
		goto out_release;
	rc = kvfs_meta_free_foreach(t, cmp_free, &fc);
	kvfs_meta_txn_abort(t);
	if (rc)
		goto out_release;
	if (fc.i != m.n)
		fc.differs = true;
	if (!fc.differs)
		goto out_release;
	kvfs_warn("the SSD free map disagrees with the block records "
		  "(%zu stored ranges, %zu expected): rewriting it from the "
		  "records", fc.i, m.n);
	pthread_mutex_lock(&c->meta_lock);
	rc = kvfs_meta_txn_begin(c->store->meta, false, &t);
	if (!rc)
		rc = kvfs_meta_free_clear(t);
	for (size_t i = 0; i < m.n && !rc; i++)
		rc = kvfs_meta_free_give(t, m.r[i].off, m.r[i].len);
	if (rc)
		kvfs_meta_txn_abort(t);
	else
		rc = kvfs_meta_txn_commit(t);
	pthread_mutex_unlock(&c->meta_lock);
out_release:
	kvfs_extent_release(&m);
	return rc;
}

/* A record's stored form must be one the namespace can serve. */
static bool record_form_ok(const struct kvfs_meta_blk *r,
			   const struct kvfs_geom *g)
{
	switch (r->kind) {
	case KVFS_KIND_KV:
		return !r->kv_from;
	case KVFS_KIND_HIDDEN:
		return g->hidden_size && !r->kv_from;
	case KVFS_KIND_MIXED:
		return g->hidden_size && r->kv_from && r->kv_from < g->n_layers;
	default:
		return false;
	}
}

static uint32_t record_kv_from(const struct kvfs_meta_blk *r,
			       const struct kvfs_geom *g)
{
	if (r->kind == KVFS_KIND_MIXED)
		return r->kv_from;
	return r->kind == KVFS_KIND_HIDDEN ? g->n_layers : 0;
}

static int recover_blocks(struct kvfs_cache *c)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	struct rec_list l = { 0 };
	struct kvfs_meta_txn *t;
	uint64_t max_ino = KVFS_INO_BLOCK_BASE;
	size_t loaded = 0, skipped = 0;
	int rc;

	rc = kvfs_meta_txn_begin(c->store->meta, true, &t);
	if (rc)
		return rc;
	rc = kvfs_meta_blk_foreach(t, collect_blk, &l);
	kvfs_meta_txn_abort(t);
	if (rc)
		goto out_free;
	/* Oldest access first, so recency-ordered policies rebuild in order. */
	if (l.n)
		qsort(l.v, l.n, sizeof(*l.v), by_last_access);

	for (size_t i = 0; i < l.n; i++) {
		const struct kvfs_meta_blk *r = &l.v[i].r;
		char hex[KVFS_KEY_HEX_LEN + 1];
		struct kvfs_ns *ns = NULL;
		struct kvfs_extent e = { .off = r->ssd_off, .len = r->ssd_len };
		struct kvfs_block *b;

		kvfs_fmt_key_hex(l.v[i].key, hex);
		for (size_t j = 0; j < c->n_ns; j++)
			if (c->ns[j].rec.id == r->ns_id)
				ns = &c->ns[j];
		if (!ns || !r->ssd_len || r->size > r->ssd_len ||
		    r->ino < KVFS_INO_BLOCK_BASE ||
		    !record_form_ok(r, &ns->geom) ||
		    ssd->ops->claim(ssd, &e)) {
			kvfs_err("block record %s is inconsistent (namespace "
				 "%u, extent %" PRIu64 "+%" PRIu64
				 "): not served", hex, r->ns_id, r->ssd_off,
				 r->ssd_len);
			skipped++;
			continue;
		}
		b = kvfs_block_alloc(ns);
		if (!b) {
			rc = -ENOMEM;
			goto out_free;
		}
		memcpy(b->pn.key, l.v[i].key, KVFS_KEY_LEN);
		b->pn.depth = r->depth;
		b->pn.tokens = r->n_tokens;
		b->pn.size = r->size;
		b->pn.category = (uint16_t)r->category;
		b->ino = r->ino;
		b->ssize = r->size;
		b->size = r->kind != KVFS_KIND_KV ?
				  kvfs_fmt_file_size(&ns->geom, KVFS_KIND_KV,
						     r->n_tokens) :
				  r->size;
		b->start_pos = r->start_pos;
		b->created = r->created;
		b->n_tokens = r->n_tokens;
		b->hdr_crc = r->hdr_crc;
		b->kind = r->kind;
		b->kv_from = record_kv_from(r, &ns->geom);
		memcpy(b->parent_key, r->parent, KVFS_KEY_LEN);
		b->ssd = e;
		atomic_store(&b->flags, KVFS_B_PERSISTED);
		atomic_store(&b->tiers, KVFS_TIER_BIT_SSD);
		atomic_store(&b->pins, r->pins &
					       (KVFS_TIER_BIT_DRAM | KVFS_TIER_BIT_SSD));
		atomic_store(&b->category, r->category);
		atomic_store(&b->hits, r->hits);
		atomic_store(&b->last_access, r->last_access);
		if (kvfs_index_insert(c, b)) {
			kvfs_err("block record %s duplicated: skipped", hex);
			ssd->ops->free(ssd, &e);
			kvfs_cache_put(c, b);
			skipped++;
			continue;
		}
		kvfs_ns_add(ns, b);
		kvfs_block_count_hidden(c, b, 1);
		struct kvfs_paccess a = { .now = r->last_access };
		kvfs_policy_insert(c->policy, KVFS_TIER_SSD, &b->pn, &a);
		atomic_fetch_add(&ssd->st.blocks, 1);
		if (r->ino >= max_ino)
			max_ino = r->ino + 1;
		loaded++;
	}
	/* Link children to parents now that every block is indexed. */
	for (size_t i = 0; i < l.n; i++) {
		struct kvfs_block *b = kvfs_index_find_key(c, l.v[i].key);
		struct kvfs_block *p;

		if (!b)
			continue;
		p = kvfs_index_find_key(c, b->parent_key);
		if (p && !b->parent) {
			b->parent = p; /* keeps the reference */
			b->pn.parent = &p->pn;
		} else if (p) {
			kvfs_cache_put(c, p);
		}
		kvfs_cache_put(c, b);
	}
	atomic_store(&c->next_ino, max_ino);
	kvfs_info("recovered %zu blocks from the metadata (%zu skipped, %zu "
		  "damaged records)", loaded, skipped, l.bad);
	for (size_t j = 0; j < c->n_ns; j++)
		if (atomic_load(&c->ns[j].hc.hidden_blocks) &&
		    !c->ns[j].hc.rst)
			kvfs_warn("namespace %s holds %" PRIu64 " blocks stored "
				  "as hidden states but has no weights: reads "
				  "of them fail with EIO until weights are "
				  "configured", c->ns[j].rec.name,
				  (uint64_t)atomic_load(
					  &c->ns[j].hc.hidden_blocks));
	rc = check_free_map(c, &l);
out_free:
	free(l.v);
	return rc;
}

/* Per-block warnings at start, before they become one count. */
#define PIN_WARN_MAX 16

/*
 * A DRAM pin is the admin's recorded intent that reads never touch the
 * SSD: at start, every block pinned in DRAM is loaded back.  One that
 * cannot be (DRAM lowered below what the pins need, a failed read) keeps
 * its pin, in memory as in the record, which is not rewritten: reads are
 * served from the SSD meanwhile, and the first load into DRAM (a read, a
 * promotion, a later start with room) makes the pin resident again.
 */
static void reload_dram_pins(struct kvfs_cache *c)
{
	size_t loaded = 0, waiting = 0;
	char hex[KVFS_KEY_HEX_LEN + 1];
	int last_rc = 0;

	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];
		size_t n;

		pthread_rwlock_rdlock(&ns->lock);
		n = ns->n;
		pthread_rwlock_unlock(&ns->lock);
		for (size_t j = 0; j < n; j++) {
			struct kvfs_block *b = NULL;
			int rc;

			pthread_rwlock_rdlock(&ns->lock);
			if (j < ns->n) {
				b = ns->blocks[j];
				kvfs_block_get_ref(b);
			}
			pthread_rwlock_unlock(&ns->lock);
			if (!b)
				break;
			if (!(atomic_load(&b->pins) & KVFS_TIER_BIT_DRAM)) {
				kvfs_cache_put(c, b);
				continue;
			}
			rc = kvfs_block_pin_load(c, b);
			if (!rc) {
				loaded++;
			} else if (waiting++ < PIN_WARN_MAX) {
				kvfs_fmt_key_hex(b->pn.key, hex);
				kvfs_warn("ns %s: block %s.kv (ino %" PRIu64
					  "): DRAM pin kept but not loaded: "
					  "%s; served from the SSD until a "
					  "load brings it into DRAM",
					  ns->rec.name, hex, b->ino,
					  rc == -ENOSPC ?
						  "the DRAM tier is full of "
						  "pinned blocks ([tier.dram] "
						  "capacity is below what the "
						  "pins need)" :
						  strerror(-rc));
			}
			if (rc)
				last_rc = rc;
			kvfs_cache_put(c, b);
		}
	}
	if (waiting)
		kvfs_warn("%zu of %zu blocks pinned in DRAM could not be "
			  "loaded at start (last error: %s): their pins are "
			  "kept and they are served from the SSD until loaded "
			  "(stats: cache.dram_pins_waiting)", waiting,
			  loaded + waiting, strerror(-last_rc));
	else if (loaded)
		kvfs_info("%zu blocks pinned in DRAM loaded", loaded);
}

/*
 * The owners the device tier makes pools for: the mounting user's first
 * (namespaces without an owner, stored ones the config no longer names),
 * then each namespace's owner once. 0 or -EINVAL (logged: too many).
 */
static int gpu_owners(struct kvfs_cache *c, uint32_t *uid, size_t *n)
{
	*n = 0;
	uid[(*n)++] = (uint32_t)getuid();
	for (size_t i = 0; i < c->n_ns; i++) {
		bool seen = false;

		for (size_t k = 0; k < *n; k++)
			seen |= uid[k] == c->ns[i].owner;
		if (seen)
			continue;
		if (*n == KVFS_GPU_OWNERS_MAX) {
			kvfs_err("[tier.gpu]: namespaces have more than %d "
				 "owners, each of which needs a pool",
				 KVFS_GPU_OWNERS_MAX);
			return -EINVAL;
		}
		uid[(*n)++] = c->ns[i].owner;
	}
	return 0;
}

/* The device tier, if [tier.gpu] asks for one: one pool per owner. A
 * cuda tier without a visible device refuses the start: silently running
 * without it would hide a broken host.
 */
static int open_gpu(struct kvfs_cache *c)
{
	uint32_t uid[KVFS_GPU_OWNERS_MAX];
	struct kvfs_gpu_owners o = {
		.uid = uid,
		.owner_capacity = c->conf.gpu_owner_capacity,
	};
	char name[64];
	int rc;

	/* Whatever the backend now: a daemon of this store killed with -9
	 * left its pools behind, and only a start of the store knows it.
	 */
	snprintf(name, sizeof(name), "/kvfs-%02x%02x%02x%02x-",
		 c->store->sb.uuid[0], c->store->sb.uuid[1],
		 c->store->sb.uuid[2], c->store->sb.uuid[3]);
	kvfs_gpu_shm_sweep(name);
	if (c->conf.gpu_backend != KVFS_PARAMS_GPU_SHM &&
	    c->conf.gpu_backend != KVFS_PARAMS_GPU_CUDA)
		return 0;
	rc = gpu_owners(c, uid, &o.n);
	if (rc)
		return rc;
	switch (c->conf.gpu_backend) {
	case KVFS_PARAMS_GPU_SHM:
		snprintf(name, sizeof(name), "/kvfs-%02x%02x%02x%02x-",
			 c->store->sb.uuid[0], c->store->sb.uuid[1],
			 c->store->sb.uuid[2], c->store->sb.uuid[3]);
		snprintf(name + strlen(name), sizeof(name) - strlen(name),
			 "%d-pool", (int)getpid());
		rc = kvfs_gpu_shm_init_owners(name, c->conf.gpu_capacity, 0,
					      &o, &c->tier[KVFS_TIER_GPU]);
		break;
	case KVFS_PARAMS_GPU_CUDA:
		rc = kvfs_gpu_cuda_init_owners((int)c->conf.gpu_device,
					       c->conf.gpu_capacity, 0, &o,
					       &c->tier[KVFS_TIER_GPU]);
		if (rc)
			kvfs_err("[tier.gpu] backend = cuda, but CUDA device "
				 "%u cannot be used (%s): refusing to start",
				 c->conf.gpu_device, strerror(-rc));
		break;
	default:
		return 0;
	}
	if (rc)
		return rc;
	c->gops = kvfs_gpu_ops_of(c->tier[KVFS_TIER_GPU]);
	return 0;
}

/* [tier.dram] pinned, resolved: whether the DRAM tier is one arena that
 * the device tier registers.
 */
static bool dram_wants_pinning(const struct kvfs_cache_params *conf)
{
	return conf->dram_pinned == KVFS_PARAMS_PINNED_YES ||
	       (conf->dram_pinned == KVFS_PARAMS_PINNED_AUTO &&
		conf->gpu_backend == KVFS_PARAMS_GPU_CUDA);
}

/*
 * Register the DRAM arena with the device tier, so uploads DMA from the
 * blocks themselves. Asked for explicitly, a failure refuses the start;
 * under auto the daemon runs on with staged copies, saying so. The
 * device tier unregisters it when it is freed, which kvfs_cache_free()
 * does before it frees the DRAM tier (tiers go in id order, GPU first).
 */
static int pin_dram(struct kvfs_cache *c)
{
	void *base;
	uint64_t len;
	char sz[32];
	int rc;

	if (!c->gops ||
	    kvfs_tier_dram_region(c->tier[KVFS_TIER_DRAM], &base, &len))
		return 0;
	rc = c->gops->host_register(c->tier[KVFS_TIER_GPU], base, len);
	if (!rc)
		return 0;
	kvfs_util_fmt_size(len, sz, sizeof(sz));
	if (c->conf.dram_pinned == KVFS_PARAMS_PINNED_YES) {
		kvfs_err("[tier.dram] pinned = yes, but the %s DRAM tier "
			 "cannot be pinned (%s): refusing to start (raise "
			 "RLIMIT_MEMLOCK or lower the capacity, or set "
			 "pinned = auto or no)", sz, strerror(-rc));
		return rc;
	}
	kvfs_warn("[tier.dram] pinned = auto: the %s DRAM tier cannot be "
		  "pinned (%s); uploads to the device go through staging "
		  "buffers", sz, strerror(-rc));
	return 0;
}

/* ------------------------------------------------------------ lifecycle */

int kvfs_cache_open(const char *dir, const struct kvfs_cache_params *conf,
		    unsigned flags, struct kvfs_cache **out)
{
	struct kvfs_cache *c;
	uint64_t cap[KVFS_NTIERS] = { 0 };
	const char *keys[KVFS_PARAMS_MAX_OPTS], *vals[KVFS_PARAMS_MAX_OPTS];
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->conf = *conf;
	c->flags = flags;
	for (int i = 0; i < KVFS_SHARDS; i++) {
		pthread_mutex_init(&c->by_key[i].lock, NULL);
		pthread_mutex_init(&c->by_ino[i].lock, NULL);
	}
	pthread_mutex_init(&c->pending_lock, NULL);
	pthread_mutex_init(&c->meta_lock, NULL);
	pthread_mutex_init(&c->policy_lock, NULL);
	pthread_mutex_init(&c->wb_lock, NULL);
	pthread_cond_init(&c->wb_cond, NULL);
	pthread_cond_init(&c->wb_done, NULL);
	pthread_mutex_init(&c->mv_lock, NULL);
	pthread_mutex_init(&c->gpu_load_lock, NULL);
	pthread_mutex_init(&c->ctl_lock, NULL);
	pthread_mutex_init(&c->bg_lock, NULL);
	pthread_cond_init(&c->bg_cond, NULL);
	pthread_cond_init(&c->mv_cond, NULL);
	atomic_store(&c->next_ino, KVFS_INO_BLOCK_BASE);

	rc = kvfs_store_open(dir,
			     (flags & KVFS_CACHE_NOSYNC) ? KVFS_META_NOSYNC : 0,
			     conf->meta_mapsize, &c->store);
	if (rc)
		goto out_free;
	rc = setup_namespaces(c);
	if (rc)
		goto out_free;
	rc = kvfs_tier_dram_init_flags(conf->dram_capacity,
				       (dram_wants_pinning(conf) ?
						KVFS_DRAM_ARENA : 0) |
				       (conf->dram_prefault ?
						KVFS_DRAM_PREFAULT : 0),
				       &c->tier[KVFS_TIER_DRAM]);
	if (rc) {
		if (conf->dram_prefault)
			kvfs_err("[tier.dram] prefault = yes: the DRAM tier "
				 "cannot be faulted in (%s): refusing to "
				 "start (lower capacity, or set prefault = "
				 "no)", strerror(-rc));
		goto out_free;
	}
	rc = kvfs_tier_ssd_init(c->store->data_path, c->store->sb.data_off,
				c->store->sb.ssd_size,
				conf->ssd_rings ? conf->ssd_rings : 1,
				(flags & KVFS_CACHE_NOSYNC) ? KVFS_SSD_NOSYNC : 0,
				&c->tier[KVFS_TIER_SSD]);
	if (rc) {
		kvfs_err("opening the SSD data file %s failed: %s",
			 c->store->data_path, strerror(-rc));
		goto out_free;
	}
	rc = open_gpu(c);
	if (rc)
		goto out_free;
	rc = pin_dram(c);
	if (rc)
		goto out_free;
	rc = kvfs_rpool_start(c);
	if (rc)
		goto out_free;
	if (!strcmp(conf->policy, "belady")) {
		kvfs_err("policy belady needs to know the future: it exists "
			 "only in kvfs-sim");
		rc = -EINVAL;
		goto out_free;
	}
	for (size_t i = 0; i < conf->n_policy_opts; i++) {
		keys[i] = conf->policy_keys[i];
		vals[i] = conf->policy_vals[i];
	}
	if (c->tier[KVFS_TIER_GPU])
		cap[KVFS_TIER_GPU] = c->tier[KVFS_TIER_GPU]->capacity;
	cap[KVFS_TIER_DRAM] = c->tier[KVFS_TIER_DRAM]->capacity;
	cap[KVFS_TIER_SSD] = c->tier[KVFS_TIER_SSD]->capacity;
	rc = kvfs_policy_new(conf->policy[0] ? conf->policy : "lru", keys, vals,
			     conf->n_policy_opts, cap, &c->policy);
	if (rc)
		goto out_free;
	rc = recover_blocks(c);
	if (rc)
		goto out_free;
	/* The mover runs its tasks in the order they register here. */
	rc = kvfs_promote_init(c);
	if (!rc)
		rc = kvfs_ctl_init(c);
	if (!rc)
		rc = kvfs_counters_init(c);
	if (rc)
		goto out_free;
	rc = kvfs_chunk_init(c);
	if (!rc)
		rc = kvfs_remote_init(c);
	if (!rc)
		rc = kvfs_fleet_init(c);
	if (!rc)
		rc = kvfs_scrub_init(c);
	if (rc)
		goto out_free;
	rc = kvfs_wb_start(c);
	if (rc)
		goto out_free;
	rc = kvfs_task_start(c);
	if (rc)
		goto out_free;
	reload_dram_pins(c);
	*out = c;
	return 0;

out_free:
	kvfs_cache_free(c);
	return rc;
}

void kvfs_cache_free(struct kvfs_cache *c)
{
	if (!c)
		return;
	/* Background loads hold block references and use the tiers. */
	pthread_mutex_lock(&c->bg_lock);
	while (c->bg_jobs)
		pthread_cond_wait(&c->bg_cond, &c->bg_lock);
	pthread_mutex_unlock(&c->bg_lock);
	/* Restoration jobs hold block references and use the tiers and
	 * the write-back; with the pool stopped a late wait (the mover's
	 * device promotion) restores in its own thread.
	 */
	kvfs_rpool_stop(c);
	kvfs_task_stop(c);
	kvfs_wb_stop(c);
	kvfs_remote_fini(c);
	while (c->sessions)
		kvfs_ctl_close(c->sessions);
	if (c->policy) {
		pthread_mutex_lock(&c->policy_lock);
		kvfs_cache_drain_touches(c);
		pthread_mutex_unlock(&c->policy_lock);
	}
	/* After the last drain, whose notes it publishes; before the
	 * policy, which its deliveries use.
	 */
	kvfs_fleet_fini(c);
	if (c->store)
		kvfs_counters_flush(c);
	if (c->chunks) {
		kvfs_chunk_flush(c);
		kvfs_chunk_release(c);
	}
	while (c->pending)
		kvfs_cache_abandon(c, c->pending);
	/* Children hold references to parents, so drop every index
	 * reference first; the structs go when their last reference does.
	 */
	for (int s = 0; s < KVFS_SHARDS; s++) {
		struct kvfs_shard *sh = &c->by_ino[s];

		for (size_t i = 0; i < sh->nb; i++) {
			struct kvfs_block *b = sh->b[i], *next;

			for (; b; b = next) {
				next = b->hnext_ino;
				kvfs_cache_put(c, b);
			}
		}
		free(sh->b);
		free(c->by_key[s].b);
	}
	kvfs_rpool_free(c);
	kvfs_scrub_free(c);
	for (size_t i = 0; i < c->n_ns; i++) {
		free(c->ns[i].blocks);
		if (c->ns[i].c)
			pthread_rwlock_destroy(&c->ns[i].lock);
	}
	free(c->ns);
	kvfs_policy_free(c->policy);
	for (int i = 0; i < KVFS_NTIERS; i++)
		kvfs_tier_free(c->tier[i]);
	kvfs_store_free(c->store);
	free(c);
}
