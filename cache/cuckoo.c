// SPDX-License-Identifier: MIT
/*
 * Hotness-aware cuckoo filter and its exact counterpart; see cuckoo.h for
 * the contract.  The filter is one contiguous array of 4-byte slots, four
 * per bucket, plus a short overflow list; the exact table is a linear
 * probing hash table of full keys with the same record fields.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/cuckoo.h"
#include "meta/log.h"

struct slot {
	uint8_t fp; /* 0 = empty */
	uint8_t clock;
	uint8_t freq;
	uint8_t depth;
};
_Static_assert(sizeof(struct slot) == 4, "a filter entry is 4 bytes");

struct ovf {
	uint64_t bucket; /* one of the entry's two buckets */
	struct slot s;
};

struct xent {
	uint8_t key[16];
	uint8_t used;
	uint8_t clock;
	uint8_t freq;
	uint8_t depth;
};

struct kick {
	uint64_t bucket;
	uint32_t slot;
};

struct kvfs_cuckoo {
	bool exact;
	uint8_t max_age;
	uint32_t max_kicks;
	uint64_t seed;
	uint64_t rng;
	/* filter */
	uint64_t nbuckets, mask;
	struct slot *slots;          /* nbuckets * KVFS_CUCKOO_SLOTS */
	uint64_t fph[256];           /* hash(f) & mask, per fingerprint */
	struct ovf *ovf;
	uint32_t novf, ovf_cap;
	struct kick *path;           /* kick chain, to undo a failed insert */
	/* exact table */
	struct xent *tab;
	uint64_t tab_cap, tab_n;
	struct kvfs_cuckoo_stats st;
};

static uint64_t rng_next(struct kvfs_cuckoo *c)
{
	/* splitmix64: seeded, so kick choices are reproducible */
	uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t key_hash(const struct kvfs_cuckoo *c,
				const uint8_t key[16])
{
	return XXH3_64bits_withSeed(key, 16, c->seed);
}

static inline uint8_t fp_of(uint64_t h)
{
	/* 1..255: 0 marks an empty slot */
	return (uint8_t)((h >> 32) % 255 + 1);
}

static inline uint64_t alt_bucket(const struct kvfs_cuckoo *c, uint64_t b,
				  uint8_t fp)
{
	return b ^ c->fph[fp];
}

static inline struct slot *bucket(struct kvfs_cuckoo *c, uint64_t b)
{
	return &c->slots[b * KVFS_CUCKOO_SLOTS];
}

static inline uint8_t sat8(uint32_t v)
{
	return v > 255 ? 255 : (uint8_t)v;
}

static void to_rec(uint8_t clock, uint8_t freq, uint8_t depth,
		   struct kvfs_cuckoo_rec *out)
{
	if (!out)
		return;
	out->clock = clock;
	out->freq = freq;
	out->depth = depth;
}

/* ---- exact table ---------------------------------------------------- */

static struct xent *x_find(struct kvfs_cuckoo *c, const uint8_t key[16])
{
	uint64_t m = c->tab_cap - 1;
	uint64_t i = key_hash(c, key) & m;

	for (;;) {
		struct xent *e = &c->tab[i];

		if (!e->used)
			return NULL;
		if (!memcmp(e->key, key, 16))
			return e;
		i = (i + 1) & m;
	}
}

static struct xent *x_slot_for(struct xent *tab, uint64_t cap,
			       uint64_t h)
{
	uint64_t m = cap - 1;
	uint64_t i = h & m;

	while (tab[i].used)
		i = (i + 1) & m;
	return &tab[i];
}

static int x_grow(struct kvfs_cuckoo *c)
{
	uint64_t ncap = c->tab_cap * 2;
	struct xent *nt;

	nt = calloc(ncap, sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	for (uint64_t i = 0; i < c->tab_cap; i++) {
		if (c->tab[i].used)
			*x_slot_for(nt, ncap, key_hash(c, c->tab[i].key)) =
				c->tab[i];
	}
	free(c->tab);
	c->tab = nt;
	c->tab_cap = ncap;
	c->st.slots = ncap;
	return 0;
}

static int x_insert(struct kvfs_cuckoo *c, const uint8_t key[16],
		    uint32_t depth)
{
	struct xent *e;
	int ret;

	if (x_find(c, key)) {
		c->st.shared++;
		return 1;
	}
	/* keep the load under 3/4 so probe chains stay short */
	if ((c->tab_n + 1) * 4 > c->tab_cap * 3) {
		ret = x_grow(c);
		if (ret) {
			c->st.failed++;
			return ret;
		}
	}
	e = x_slot_for(c->tab, c->tab_cap, key_hash(c, key));
	memcpy(e->key, key, 16);
	e->used = 1;
	e->clock = c->max_age;
	e->freq = 1;
	e->depth = sat8(depth);
	c->tab_n++;
	c->st.inserts++;
	return 0;
}

static void x_delete(struct kvfs_cuckoo *c, struct xent *e)
{
	uint64_t m = c->tab_cap - 1;
	uint64_t i = (uint64_t)(e - c->tab);
	uint64_t j = i;

	/* backward-shift deletion: no tombstones to slow later probes */
	for (;;) {
		uint64_t home;

		j = (j + 1) & m;
		if (!c->tab[j].used)
			break;
		home = key_hash(c, c->tab[j].key) & m;
		/* move j back to i unless its home lies cyclically in (i, j] */
		if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
			c->tab[i] = c->tab[j];
			i = j;
		}
	}
	memset(&c->tab[i], 0, sizeof(c->tab[i]));
	c->tab_n--;
}

/* ---- filter ----------------------------------------------------------- */

/* The slot holding fingerprint @fp for the bucket pair (b1, b2), or NULL;
 * *ovf_idx is set when the hit is in the overflow list.
 */
static struct slot *f_find(struct kvfs_cuckoo *c, uint8_t fp, uint64_t b1,
			   uint64_t b2, int64_t *ovf_idx)
{
	struct slot *s;

	*ovf_idx = -1;
	s = bucket(c, b1);
	for (int i = 0; i < KVFS_CUCKOO_SLOTS; i++)
		if (s[i].fp == fp)
			return &s[i];
	s = bucket(c, b2);
	for (int i = 0; i < KVFS_CUCKOO_SLOTS; i++)
		if (s[i].fp == fp)
			return &s[i];
	for (uint32_t i = 0; i < c->novf; i++) {
		struct ovf *o = &c->ovf[i];

		if (o->s.fp == fp && (o->bucket == b1 || o->bucket == b2)) {
			*ovf_idx = i;
			return &o->s;
		}
	}
	return NULL;
}

static bool f_place(struct kvfs_cuckoo *c, uint64_t b, const struct slot *v)
{
	struct slot *s = bucket(c, b);

	for (int i = 0; i < KVFS_CUCKOO_SLOTS; i++) {
		if (!s[i].fp) {
			s[i] = *v;
			return true;
		}
	}
	return false;
}

static void f_pair(const struct kvfs_cuckoo *c, const uint8_t key[16],
		   uint64_t *b1, uint64_t *b2, uint8_t *fp)
{
	uint64_t h = key_hash(c, key);

	*fp = fp_of(h);
	*b1 = h & c->mask;
	*b2 = alt_bucket(c, *b1, *fp);
}

static int f_insert(struct kvfs_cuckoo *c, const uint8_t key[16],
		    uint32_t depth)
{
	struct slot cur, tmp;
	uint64_t b1, b2, b;
	uint32_t steps = 0;
	int64_t oi;

	f_pair(c, key, &b1, &b2, &cur.fp);
	if (f_find(c, cur.fp, b1, b2, &oi)) {
		c->st.shared++;
		return 1;
	}
	cur.clock = c->max_age;
	cur.freq = 1;
	cur.depth = sat8(depth);
	if (f_place(c, b1, &cur) || f_place(c, b2, &cur))
		goto out_placed;

	b = (rng_next(c) & 1) ? b2 : b1;
	while (steps < c->max_kicks) {
		uint32_t i = (uint32_t)(rng_next(c) % KVFS_CUCKOO_SLOTS);
		struct slot *s = &bucket(c, b)[i];

		tmp = *s;
		*s = cur;
		cur = tmp;
		c->path[steps].bucket = b;
		c->path[steps].slot = i;
		steps++;
		c->st.kicks++;
		b = alt_bucket(c, b, cur.fp);
		if (f_place(c, b, &cur))
			goto out_placed;
	}
	if (c->novf < c->ovf_cap) {
		c->ovf[c->novf].bucket = b;
		c->ovf[c->novf].s = cur;
		c->novf++;
		c->st.overflowed++;
		c->st.overflow_used = c->novf;
		goto out_placed;
	}
	/* Undo the chain so the entries it moved keep their records. */
	while (steps--) {
		struct slot *s = &bucket(c, c->path[steps].bucket)
					  [c->path[steps].slot];

		tmp = *s;
		*s = cur;
		cur = tmp;
	}
	c->st.failed++;
	return -ENOSPC;

out_placed:
	c->st.entries++;
	c->st.inserts++;
	return 0;
}

/* A slot of bucket @b was freed: pull back an overflow entry that may
 * live there, so the overflow list drains as the filter empties.
 */
static void f_drain(struct kvfs_cuckoo *c, uint64_t b)
{
	for (uint32_t i = 0; i < c->novf; i++) {
		struct ovf *o = &c->ovf[i];

		if (o->bucket != b && alt_bucket(c, o->bucket, o->s.fp) != b)
			continue;
		if (!f_place(c, b, &o->s))
			return;
		c->ovf[i] = c->ovf[--c->novf];
		c->st.overflow_used = c->novf;
		return;
	}
}

/* ---- common ------------------------------------------------------------ */

static struct slot *f_lookup(struct kvfs_cuckoo *c, const uint8_t key[16])
{
	uint64_t b1, b2;
	uint8_t fp;
	int64_t oi;

	f_pair(c, key, &b1, &b2, &fp);
	return f_find(c, fp, b1, b2, &oi);
}

int kvfs_cuckoo_init(const struct kvfs_cuckoo_conf *conf,
		     struct kvfs_cuckoo **out)
{
	struct kvfs_cuckoo *c;

	*out = NULL;
	if (!conf->max_age) {
		kvfs_err("cuckoo: max_age must be at least 1");
		return -EINVAL;
	}
	if (!(conf->flags & KVFS_CUCKOO_EXACT) &&
	    (!conf->buckets || conf->buckets > KVFS_CUCKOO_MAX_BUCKETS ||
	     (conf->buckets & (conf->buckets - 1)))) {
		kvfs_err("cuckoo: %llu buckets: need a power of two in 1..%u",
			 (unsigned long long)conf->buckets,
			 KVFS_CUCKOO_MAX_BUCKETS);
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->exact = conf->flags & KVFS_CUCKOO_EXACT;
	c->max_age = conf->max_age;
	c->max_kicks = conf->max_kicks ? conf->max_kicks :
					 KVFS_CUCKOO_MAX_KICKS;
	c->seed = conf->seed;
	c->rng = conf->seed ^ 0x6b76667363756b6full;

	if (c->exact) {
		c->tab_cap = 1024;
		c->tab = calloc(c->tab_cap, sizeof(*c->tab));
		if (!c->tab)
			goto out_free;
		c->st.slots = c->tab_cap;
		*out = c;
		return 0;
	}

	c->nbuckets = conf->buckets;
	c->mask = conf->buckets - 1;
	c->slots = calloc(c->nbuckets * KVFS_CUCKOO_SLOTS, sizeof(*c->slots));
	if (!c->slots)
		goto out_free;
	c->path = calloc(c->max_kicks, sizeof(*c->path));
	if (!c->path)
		goto out_free_slots;
	c->ovf_cap = conf->overflow;
	if (c->ovf_cap) {
		c->ovf = calloc(c->ovf_cap, sizeof(*c->ovf));
		if (!c->ovf)
			goto out_free_path;
	}
	for (int f = 0; f < 256; f++) {
		uint8_t b = (uint8_t)f;
		uint64_t v = XXH3_64bits_withSeed(&b, 1, ~c->seed) & c->mask;

		/* a zero offset would make both buckets the same one */
		c->fph[f] = v ? v : (1 & c->mask);
	}
	c->st.slots = c->nbuckets * KVFS_CUCKOO_SLOTS;
	*out = c;
	return 0;

out_free_path:
	free(c->path);
out_free_slots:
	free(c->slots);
out_free:
	free(c->tab);
	free(c);
	return -ENOMEM;
}

void kvfs_cuckoo_free(struct kvfs_cuckoo *c)
{
	if (!c)
		return;
	free(c->ovf);
	free(c->path);
	free(c->slots);
	free(c->tab);
	free(c);
}

int kvfs_cuckoo_insert(struct kvfs_cuckoo *c, const uint8_t key[16],
		       uint32_t depth)
{
	int ret;

	if (!c->exact)
		return f_insert(c, key, depth);
	ret = x_insert(c, key, depth);
	if (!ret)
		c->st.entries = c->tab_n;
	return ret;
}

int kvfs_cuckoo_lookup(struct kvfs_cuckoo *c, const uint8_t key[16],
		       struct kvfs_cuckoo_rec *out)
{
	c->st.lookups++;
	if (c->exact) {
		struct xent *e = x_find(c, key);

		if (!e)
			goto out_miss;
		to_rec(e->clock, e->freq, e->depth, out);
	} else {
		struct slot *s = f_lookup(c, key);

		if (!s)
			goto out_miss;
		to_rec(s->clock, s->freq, s->depth, out);
	}
	return 0;

out_miss:
	c->st.misses++;
	return -ENOENT;
}

int kvfs_cuckoo_touch(struct kvfs_cuckoo *c, const uint8_t key[16],
		      struct kvfs_cuckoo_rec *out)
{
	uint8_t *clock, *freq, *depth;

	c->st.lookups++;
	if (c->exact) {
		struct xent *e = x_find(c, key);

		if (!e)
			goto out_miss;
		clock = &e->clock;
		freq = &e->freq;
		depth = &e->depth;
	} else {
		struct slot *s = f_lookup(c, key);

		if (!s)
			goto out_miss;
		clock = &s->clock;
		freq = &s->freq;
		depth = &s->depth;
	}
	if (*freq < 255)
		(*freq)++;
	*clock = c->max_age;
	to_rec(*clock, *freq, *depth, out);
	return 0;

out_miss:
	c->st.misses++;
	return -ENOENT;
}

int kvfs_cuckoo_set(struct kvfs_cuckoo *c, const uint8_t key[16],
		    const struct kvfs_cuckoo_rec *rec)
{
	uint8_t clock = rec->clock > c->max_age ? c->max_age : rec->clock;

	if (c->exact) {
		struct xent *e = x_find(c, key);

		if (!e)
			return -ENOENT;
		e->clock = clock;
		e->freq = rec->freq;
		e->depth = rec->depth;
	} else {
		struct slot *s = f_lookup(c, key);

		if (!s)
			return -ENOENT;
		s->clock = clock;
		s->freq = rec->freq;
		s->depth = rec->depth;
	}
	return 0;
}

int kvfs_cuckoo_delete(struct kvfs_cuckoo *c, const uint8_t key[16])
{
	uint64_t b1, b2;
	struct slot *s;
	uint8_t fp;
	int64_t oi;

	if (c->exact) {
		struct xent *e = x_find(c, key);

		if (!e)
			return -ENOENT;
		x_delete(c, e);
		c->st.entries = c->tab_n;
		c->st.deletes++;
		return 0;
	}
	f_pair(c, key, &b1, &b2, &fp);
	s = f_find(c, fp, b1, b2, &oi);
	if (!s)
		return -ENOENT;
	if (oi >= 0) {
		c->ovf[oi] = c->ovf[--c->novf];
		c->st.overflow_used = c->novf;
	} else {
		uint64_t b = (uint64_t)(s - c->slots) / KVFS_CUCKOO_SLOTS;

		memset(s, 0, sizeof(*s));
		f_drain(c, b);
	}
	c->st.entries--;
	c->st.deletes++;
	return 0;
}

void kvfs_cuckoo_age(struct kvfs_cuckoo *c)
{
	c->st.agings++;
	if (c->exact) {
		for (uint64_t i = 0; i < c->tab_cap; i++)
			if (c->tab[i].used && c->tab[i].clock)
				c->tab[i].clock--;
		return;
	}
	for (uint64_t i = 0; i < c->nbuckets * KVFS_CUCKOO_SLOTS; i++)
		if (c->slots[i].fp && c->slots[i].clock)
			c->slots[i].clock--;
	for (uint32_t i = 0; i < c->novf; i++)
		if (c->ovf[i].s.clock)
			c->ovf[i].s.clock--;
}

uint8_t kvfs_cuckoo_max_age(const struct kvfs_cuckoo *c)
{
	return c->max_age;
}

void kvfs_cuckoo_get_stats(const struct kvfs_cuckoo *c,
			   struct kvfs_cuckoo_stats *st)
{
	*st = c->st;
}

int kvfs_cuckoo_buckets_of(const struct kvfs_cuckoo *c, const uint8_t key[16],
			   uint64_t *b1, uint64_t *b2, uint8_t *fp)
{
	if (c->exact)
		return -EINVAL;
	f_pair(c, key, b1, b2, fp);
	return 0;
}
