/* SPDX-License-Identifier: MIT */
/*
 * Free-range allocator.  The free set is kept as a sorted array rather than a
 * tree: maps hold at most a few thousand holes in practice, a memmove of a
 * few KiB is cheaper than pointer chasing, and the invariants (sorted, never
 * adjacent, never overlapping) are trivial to check.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tier/extent.h"
#include "meta/log.h"

#define EXTENT_MIN_CAP 16

static int extent_reserve(struct kvfs_extent_map *m, size_t want)
{
	struct kvfs_extent_range *r;
	size_t cap;

	if (want <= m->cap)
		return 0;
	cap = m->cap ? m->cap : EXTENT_MIN_CAP;
	while (cap < want)
		cap *= 2;
	r = realloc(m->r, cap * sizeof(*r));
	if (!r)
		return -ENOMEM;
	m->r = r;
	m->cap = cap;
	return 0;
}

/* Index of the first free range whose start is > @off (n if none). */
static size_t extent_upper(const struct kvfs_extent_map *m, uint64_t off)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->r[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int extent_insert(struct kvfs_extent_map *m, size_t i, uint64_t off,
			 uint64_t len)
{
	int err = extent_reserve(m, m->n + 1);

	if (err)
		return err;
	memmove(&m->r[i + 1], &m->r[i], (m->n - i) * sizeof(m->r[0]));
	m->r[i].off = off;
	m->r[i].len = len;
	m->n++;
	return 0;
}

static void extent_remove(struct kvfs_extent_map *m, size_t i)
{
	memmove(&m->r[i], &m->r[i + 1], (m->n - i - 1) * sizeof(m->r[0]));
	m->n--;
}

/* Alignment and bounds of a caller-supplied range; logs why it is bad. */
static int extent_check(const struct kvfs_extent_map *m, const char *what,
			uint64_t off, uint64_t len)
{
	if (!len || (off | len) & (m->align - 1)) {
		kvfs_err("extent: %s of [%" PRIu64 ", +%" PRIu64
			 ") is empty or not %" PRIu64 "-aligned",
			 what, off, len, m->align);
		return -EINVAL;
	}
	if (off < m->base || len > m->size ||
	    off - m->base > m->size - len) {
		kvfs_err("extent: %s of [%" PRIu64 ", +%" PRIu64
			 ") is outside [%" PRIu64 ", +%" PRIu64 ")",
			 what, off, len, m->base, m->size);
		return -EINVAL;
	}
	return 0;
}

int kvfs_extent_init(struct kvfs_extent_map *m, uint64_t base, uint64_t size,
		     uint64_t align)
{
	memset(m, 0, sizeof(*m));
	if (!align || (align & (align - 1)) || (base | size) & (align - 1) ||
	    base > UINT64_MAX - size) {
		kvfs_err("extent: bad map [%" PRIu64 ", +%" PRIu64
			 ") align %" PRIu64, base, size, align);
		return -EINVAL;
	}
	m->base = base;
	m->size = size;
	m->align = align;
	if (extent_reserve(m, EXTENT_MIN_CAP))
		return -ENOMEM;
	if (size) {
		m->r[0].off = base;
		m->r[0].len = size;
		m->n = 1;
	}
	m->free_bytes = size;
	return 0;
}

void kvfs_extent_release(struct kvfs_extent_map *m)
{
	free(m->r);
	m->r = NULL;
	m->n = m->cap = 0;
	m->free_bytes = 0;
}

int kvfs_extent_alloc(struct kvfs_extent_map *m, uint64_t len, uint64_t *off)
{
	if (!len) {
		kvfs_err("extent: allocation of 0 bytes");
		return -EINVAL;
	}
	if (len > m->free_bytes)
		return -ENOSPC;
	/* No overflow: len <= free_bytes <= size, a multiple of align. */
	len = (len + m->align - 1) & ~(m->align - 1);
	/* The slot this range's free may need, taken now while failing is
	 * still clean.
	 */
	if (extent_reserve(m, m->n_used + 2))
		return -ENOMEM;

	for (size_t i = 0; i < m->n; i++) {
		struct kvfs_extent_range *r = &m->r[i];

		if (r->len < len)
			continue;
		*off = r->off;
		if (r->len == len) {
			extent_remove(m, i);
		} else {
			r->off += len;
			r->len -= len;
		}
		m->free_bytes -= len;
		m->n_used++;
		return 0;
	}
	return -ENOSPC;
}

int kvfs_extent_free(struct kvfs_extent_map *m, uint64_t off, uint64_t len)
{
	size_t i;
	bool merge_prev, merge_next;
	int err;

	err = extent_check(m, "free", off, len);
	if (err)
		return err;
	i = extent_upper(m, off);
	/* r[i - 1] starts at or before off, r[i] after it. */
	if ((i > 0 && m->r[i - 1].off + m->r[i - 1].len > off) ||
	    (i < m->n && off + len > m->r[i].off)) {
		kvfs_err("extent: double free of [%" PRIu64 ", +%" PRIu64
			 "): part of it is already free", off, len);
		return -EEXIST;
	}
	merge_prev = i > 0 && m->r[i - 1].off + m->r[i - 1].len == off;
	merge_next = i < m->n && off + len == m->r[i].off;
	if (merge_prev && merge_next) {
		m->r[i - 1].len += len + m->r[i].len;
		extent_remove(m, i);
	} else if (merge_prev) {
		m->r[i - 1].len += len;
	} else if (merge_next) {
		m->r[i].off = off;
		m->r[i].len += len;
	} else {
		err = extent_insert(m, i, off, len);
		if (err)
			return err;
	}
	m->free_bytes += len;
	if (m->n_used)
		m->n_used--;
	return 0;
}

int kvfs_extent_claim(struct kvfs_extent_map *m, uint64_t off, uint64_t len)
{
	struct kvfs_extent_range *r;
	uint64_t head, tail;
	size_t i;
	int err;

	err = extent_check(m, "claim", off, len);
	if (err)
		return err;
	/* The split below and this range's free: see kvfs_extent_alloc(). */
	err = extent_reserve(m, m->n_used + 2);
	if (err)
		return err;
	i = extent_upper(m, off);
	if (!i)
		goto out_used;
	r = &m->r[i - 1];
	if (r->off + r->len < off + len)
		goto out_used;
	head = off - r->off;
	tail = r->off + r->len - (off + len);
	if (head && tail) {
		/* Split: the only case that needs a new slot. */
		err = extent_insert(m, i, off + len, tail);
		if (err)
			return err;
		m->r[i - 1].len = head;
	} else if (head) {
		r->len = head;
	} else if (tail) {
		r->off = off + len;
		r->len = tail;
	} else {
		extent_remove(m, i - 1);
	}
	m->free_bytes -= len;
	m->n_used++;
	return 0;

out_used:
	kvfs_err("extent: claim of [%" PRIu64 ", +%" PRIu64
		 ") overlaps a used range", off, len);
	return -EEXIST;
}

uint64_t kvfs_extent_largest(const struct kvfs_extent_map *m)
{
	uint64_t best = 0;

	for (size_t i = 0; i < m->n; i++)
		if (m->r[i].len > best)
			best = m->r[i].len;
	return best;
}
