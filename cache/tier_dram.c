/* SPDX-License-Identifier: MIT */
/*
 * DRAM tier: every extent is its own 4096-aligned heap buffer, so map()
 * hands out a stable pointer and reads of resident blocks take no lock at
 * all.  Capacity is accounted with a compare-and-swap on base.used.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/tier.h"
#include "cache/tier_i.h"
#include "meta/log.h"
#include "meta/util.h"

#define DRAM_ALIGN 4096u

struct kvfs_tier_dram {
	struct kvfs_tier base;
};

static int dram_alloc(struct kvfs_tier *t, uint64_t len, struct kvfs_extent *e)
{
	void *p;
	int err;

	if (!len) {
		kvfs_err("dram: allocation of 0 bytes");
		return -EINVAL;
	}
	if (len > t->capacity || len > UINT64_MAX - DRAM_ALIGN)
		return -ENOSPC;
	len = kvfs_util_align_up(len, DRAM_ALIGN);
	err = kvfs_tier_reserve(t, len);
	if (err)
		return err;
	if (len > SIZE_MAX || posix_memalign(&p, DRAM_ALIGN, (size_t)len)) {
		atomic_fetch_sub(&t->used, len);
		return -ENOMEM;
	}
	e->off = 0;
	e->len = len;
	e->ptr = p;
	return 0;
}

static void dram_free(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	if (!e->ptr) {
		kvfs_err("dram: free of an extent with no buffer");
		return;
	}
	free(e->ptr);
	atomic_fetch_sub(&t->used, e->len);
}

static int dram_claim(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	/* DRAM contents do not survive a restart: nothing to recover. */
	return -EOPNOTSUPP;
}

static int dram_check(const char *what, const struct kvfs_extent *e,
		      uint64_t off, const void *buf, uint64_t len)
{
	if (!e->ptr || (len && !buf) || !kvfs_tier_in_extent(e, off, len)) {
		kvfs_err("dram: %s of [%" PRIu64 ", +%" PRIu64
			 ") outside extent of %" PRIu64 " bytes or no buffer",
			 what, off, len, e->len);
		return -EINVAL;
	}
	return 0;
}

static int dram_write(struct kvfs_tier *t, const struct kvfs_extent *e,
		      uint64_t off, const void *buf, uint64_t len)
{
	int err = dram_check("write", e, off, buf, len);

	if (err)
		return err;
	memcpy((char *)e->ptr + off, buf, len);
	kvfs_tier_count(&t->st.writes, &t->st.bytes_written, 1, len);
	return 0;
}

static int dram_read(struct kvfs_tier *t, const struct kvfs_extent *e,
		     uint64_t off, void *buf, uint64_t len)
{
	int err = dram_check("read", e, off, buf, len);

	if (err)
		return err;
	memcpy(buf, (const char *)e->ptr + off, len);
	kvfs_tier_count(&t->st.reads, &t->st.bytes_read, 1, len);
	return 0;
}

static int dram_readv(struct kvfs_tier *t, struct kvfs_tier_io *io, size_t n)
{
	int first = 0;

	for (size_t i = 0; i < n; i++) {
		io[i].res = io[i].ext ?
			dram_read(t, io[i].ext, io[i].off, io[i].buf,
				  io[i].len) : -EINVAL;
		kvfs_tier_io_done(&io[i]);
		if (io[i].res && !first)
			first = io[i].res;
	}
	return first;
}

static int dram_sync(struct kvfs_tier *t)
{
	return 0;
}

static void *dram_map(struct kvfs_tier *t, const struct kvfs_extent *e)
{
	return e->ptr;
}

static void dram_release(struct kvfs_tier *t)
{
	free((struct kvfs_tier_dram *)t);
}

static const struct kvfs_tier_ops dram_ops = {
	.name = "dram",
	.alloc = dram_alloc,
	.free = dram_free,
	.claim = dram_claim,
	.write = dram_write,
	.read = dram_read,
	.readv = dram_readv,
	.sync = dram_sync,
	.map = dram_map,
	.release = dram_release,
};

int kvfs_tier_dram_init(uint64_t capacity, struct kvfs_tier **out)
{
	struct kvfs_tier_dram *d = calloc(1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	d->base.ops = &dram_ops;
	d->base.id = KVFS_TIER_DRAM;
	d->base.capacity = capacity;
	d->base.align = DRAM_ALIGN;
	*out = &d->base;
	return 0;
}
