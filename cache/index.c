/* SPDX-License-Identifier: MIT */
/*
 * The block index: two hash tables of 64 shards each, by key and by inode
 * number, chaining through the blocks themselves; and the lookups fs/
 * makes through them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

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
	return (by_key ? key_hash(b->pn.key) : ino_hash(b->ino)) / KVFS_SHARDS %
	       nb;
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
		if (ns)
			atomic_fetch_add_explicit(&ns->st_misses, 1,
						  memory_order_relaxed);
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
