/* SPDX-License-Identifier: MIT */
/* The tiers' names and the DRAM tier (heap, arena, prefault). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "tier/tier.h"
#include "meta/log.h"
#include "tests/unit/tier_fx_i.h"

/* ---- names ---- */

static void test_names(void **state)
{
	assert_string_equal(kvfs_tier_name(KVFS_TIER_GPU), "gpu");
	assert_string_equal(kvfs_tier_name(KVFS_TIER_DRAM), "dram");
	assert_string_equal(kvfs_tier_name(KVFS_TIER_SSD), "ssd");
	assert_int_equal(kvfs_tier_parse("gpu"), KVFS_TIER_GPU);
	assert_int_equal(kvfs_tier_parse("dram"), KVFS_TIER_DRAM);
	assert_int_equal(kvfs_tier_parse("ssd"), KVFS_TIER_SSD);
	assert_int_equal(kvfs_tier_parse("SSD "), -EINVAL);
	assert_int_equal(kvfs_tier_parse(""), -EINVAL);
	assert_int_equal(kvfs_tier_parse(NULL), -EINVAL);
	assert_string_equal(kvfs_tier_name(KVFS_NTIERS), "?");
	assert_string_equal(kvfs_tier_name(-1), "?");
	kvfs_tier_free(NULL);
}

/* ---- dram ---- */

/* The DRAM tests run in both modes: heap (0) and arena. */
static unsigned mode_heap = 0, mode_arena = KVFS_DRAM_ARENA,
		mode_prefault = KVFS_DRAM_PREFAULT;

static unsigned dram_mode(void **state)
{
	return *(unsigned *)*state;
}

static void test_dram_capacity(void **state)
{
	struct kvfs_tier *t;
	struct kvfs_extent e[10], x;

	assert_int_equal(kvfs_tier_dram_init_flags(10 * PG, dram_mode(state),
						   &t), 0);
	assert_int_equal(t->id, KVFS_TIER_DRAM);
	assert_string_equal(t->ops->name, "dram");
	assert_int_equal(t->capacity, 10 * PG);

	assert_int_equal(t->ops->alloc(t, 1, &e[0]), 0);
	assert_int_equal(e[0].len, PG);
	assert_int_equal((uintptr_t)e[0].ptr % PG, 0);
	assert_ptr_equal(t->ops->map(t, &e[0]), e[0].ptr);
	assert_int_equal(atomic_load(&t->used), PG);

	assert_int_equal(t->ops->alloc(t, 10 * PG, &x), -ENOSPC);
	assert_int_equal(t->ops->alloc(t, 11 * PG, &x), -ENOSPC);
	assert_int_equal(t->ops->alloc(t, UINT64_MAX, &x), -ENOSPC);
	assert_int_equal(t->ops->alloc(t, 0, &x), -EINVAL);
	for (int i = 1; i < 10; i++)
		assert_int_equal(t->ops->alloc(t, PG, &e[i]), 0);
	assert_int_equal(atomic_load(&t->used), 10 * PG);
	assert_int_equal(t->ops->alloc(t, 1, &x), -ENOSPC);

	t->ops->free(t, &e[3]);
	assert_int_equal(atomic_load(&t->used), 9 * PG);
	assert_int_equal(t->ops->alloc(t, PG, &e[3]), 0);
	assert_int_equal(t->ops->claim(t, &e[3]), -EOPNOTSUPP);
	assert_int_equal(t->ops->sync(t), 0);
	for (int i = 0; i < 10; i++)
		t->ops->free(t, &e[i]);
	assert_int_equal(atomic_load(&t->used), 0);
	kvfs_tier_free(t);
}

static void test_dram_rw(void **state)
{
	struct kvfs_tier *t;
	struct kvfs_extent e;
	struct kvfs_tier_io io[3];
	char *buf = tfx_xalloc(4 * PG), *out = tfx_xalloc(4 * PG);

	assert_int_equal(kvfs_tier_dram_init_flags(1 << 20, dram_mode(state),
						   &t), 0);
	assert_int_equal(t->ops->alloc(t, 3 * PG + 100, &e), 0);
	assert_int_equal(e.len, 4 * PG);
	tfx_fill(buf, 4 * PG, 7);
	assert_int_equal(t->ops->write(t, &e, 0, buf, 4 * PG), 0);
	/* Unaligned offsets and lengths are fine in DRAM. */
	assert_int_equal(t->ops->write(t, &e, 5, "hello", 5), 0);
	assert_int_equal(t->ops->read(t, &e, 3, out, 8), 0);
	assert_memory_equal(out, buf + 3, 2);
	assert_memory_equal(out + 2, "hello", 5);
	assert_memory_equal(out + 7, buf + 10, 1);

	/* Bounds. */
	assert_int_equal(t->ops->read(t, &e, 4 * PG - 1, out, 2), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, 4 * PG + 1, out, 0), -EINVAL);
	assert_int_equal(t->ops->write(t, &e, 1, buf, UINT64_MAX), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, UINT64_MAX, out, 2), -EINVAL);
	assert_int_equal(t->ops->read(t, &e, 4 * PG, out, 0), 0);

	io[0] = (struct kvfs_tier_io){ .ext = &e, .off = PG, .len = PG,
				       .buf = out, .res = 1 };
	io[1] = (struct kvfs_tier_io){ .ext = &e, .off = 4 * PG, .len = 1,
				       .buf = out + PG, .res = 1 };
	io[2] = (struct kvfs_tier_io){ .ext = &e, .off = 2 * PG, .len = 2 * PG,
				       .buf = out + 2 * PG, .res = 1 };
	assert_int_equal(t->ops->readv(t, io, 3), -EINVAL);
	assert_int_equal(io[0].res, 0);
	assert_int_equal(io[1].res, -EINVAL);
	assert_int_equal(io[2].res, 0);
	assert_memory_equal(out, buf + PG, PG);
	assert_memory_equal(out + 2 * PG, buf + 2 * PG, 2 * PG);

	assert_int_equal(atomic_load(&t->st.writes), 2);
	assert_int_equal(atomic_load(&t->st.bytes_written), 4 * PG + 5);
	assert_int_equal(atomic_load(&t->st.reads), 4);
	assert_int_equal(atomic_load(&t->st.bytes_read), 8 + 3 * PG);
	t->ops->free(t, &e);
	kvfs_tier_free(t);
	free(buf);
	free(out);
}

struct dram_race {
	struct kvfs_tier *t;
	struct kvfs_extent e[64];
	int n;
};

static void *dram_race_fn(void *arg)
{
	struct dram_race *r = arg;

	while (r->n < 64 && !r->t->ops->alloc(r->t, PG, &r->e[r->n]))
		r->n++;
	return NULL;
}

/* Four threads racing to fill the tier get exactly its capacity. */
static void test_dram_concurrent_alloc(void **state)
{
	struct dram_race r[4];
	pthread_t th[4];
	struct kvfs_tier *t;
	int total = 0;

	assert_int_equal(kvfs_tier_dram_init_flags(100 * PG, dram_mode(state),
						   &t), 0);
	for (int i = 0; i < 4; i++) {
		r[i].t = t;
		r[i].n = 0;
		assert_int_equal(pthread_create(&th[i], NULL, dram_race_fn,
						&r[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		total += r[i].n;
	}
	assert_int_equal(total, 100);
	assert_int_equal(atomic_load(&t->used), 100 * PG);
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < r[i].n; j++)
			t->ops->free(t, &r[i].e[j]);
	assert_int_equal(atomic_load(&t->used), 0);
	kvfs_tier_free(t);
}

/* ---- dram arena ---- */

/* How many of the @len bytes' pages at @p are resident (mincore). */
static size_t resident_pages(void *p, uint64_t len)
{
	size_t n = (size_t)((len + PG - 1) / PG), k = 0;
	unsigned char *v = calloc(n, 1);

	assert_non_null(v);
	assert_int_equal(mincore(p, (size_t)len, v), 0);
	for (size_t i = 0; i < n; i++)
		k += v[i] & 1;
	free(v);
	return k;
}

/*
 * A prefaulted arena has every page resident before any extent is
 * written; a plain one has none until they are touched.  More than the
 * memory available is refused, not left to the OOM killer.
 */
static void test_dram_prefault(void **state)
{
	struct kvfs_tier *t;
	struct kvfs_extent e;
	uint64_t len;
	void *b;

	(void)state;
	assert_int_equal(kvfs_tier_dram_init_flags(64 * PG, KVFS_DRAM_ARENA,
						   &t), 0);
	assert_int_equal(kvfs_tier_dram_region(t, &b, &len), 0);
	assert_int_equal(resident_pages(b, len), 0);
	kvfs_tier_free(t);

	/* PREFAULT alone makes an arena. */
	assert_int_equal(kvfs_tier_dram_init_flags(64 * PG + 7,
						   KVFS_DRAM_PREFAULT, &t), 0);
	assert_int_equal(t->capacity, 64 * PG);
	assert_int_equal(kvfs_tier_dram_region(t, &b, &len), 0);
	assert_int_equal(len, 64 * PG);
	assert_int_equal(resident_pages(b, len), 64);
	assert_int_equal(t->ops->alloc(t, 3 * PG, &e), 0);
	assert_ptr_equal(e.ptr, (unsigned char *)b + e.off);
	t->ops->free(t, &e);
	kvfs_tier_free(t);

	assert_int_equal(kvfs_tier_dram_init_flags(16ull << 40,
						   KVFS_DRAM_PREFAULT, &t),
			 -ENOMEM);
}

/* Extents lie in the arena at base + off, aligned, and stay put. */
static void test_dram_arena_layout(void **state)
{
	struct kvfs_tier *t, *h, *ssd;
	struct kvfs_extent e[4], x;
	unsigned char *base;
	void *b;
	uint64_t len, l;

	/* The capacity is whole pages; less than one is refused. */
	assert_int_equal(kvfs_tier_dram_init_flags(PG - 1, KVFS_DRAM_ARENA,
						   &t), -EINVAL);
	assert_int_equal(kvfs_tier_dram_init_flags(PG, 1u << 7, &t), -EINVAL);
	assert_int_equal(kvfs_tier_dram_init_flags(8 * PG + 100,
						   KVFS_DRAM_ARENA, &t), 0);
	assert_int_equal(t->capacity, 8 * PG);
	assert_int_equal(t->align, PG);
	assert_int_equal(kvfs_tier_dram_region(t, &b, &len), 0);
	base = b;
	assert_non_null(base);
	assert_int_equal((uintptr_t)base % PG, 0);
	assert_int_equal(len, 8 * PG);

	/* Heap mode and other tiers have no region. */
	assert_int_equal(kvfs_tier_dram_init(8 * PG, &h), 0);
	assert_int_equal(kvfs_tier_dram_region(h, &b, &l), -EINVAL);
	assert_null(b);
	assert_int_equal(l, 0);
	kvfs_tier_free(h);
	assert_int_equal(kvfs_tier_ssd_init(NULL, DATA_OFF, SSD_SIZE, 1,
					    KVFS_SSD_MEMORY, &ssd), 0);
	assert_int_equal(kvfs_tier_dram_region(ssd, &b, &l), -EINVAL);
	kvfs_tier_free(ssd);
	assert_int_equal(kvfs_tier_dram_region(NULL, &b, &l), -EINVAL);

	for (int i = 0; i < 4; i++) {
		assert_int_equal(t->ops->alloc(t, PG + 1, &e[i]), 0);
		assert_int_equal(e[i].len, 2 * PG);
		assert_int_equal(e[i].off % PG, 0);
		assert_ptr_equal(e[i].ptr, base + e[i].off);
		assert_ptr_equal(t->ops->map(t, &e[i]), e[i].ptr);
		assert_true(e[i].off + e[i].len <= len);
		for (int k = 0; k < i; k++)
			assert_true(e[k].off + e[k].len <= e[i].off ||
				    e[i].off + e[i].len <= e[k].off);
		tfx_fill(e[i].ptr, e[i].len, 100 + i);
	}
	/* Full: used is the capacity. */
	assert_int_equal(atomic_load(&t->used), 8 * PG);
	assert_int_equal(t->ops->alloc(t, 1, &x), -ENOSPC);

	/* Freeing and reusing one extent moves none of the others, and
	 * the freed space is handed out again (first fit).
	 */
	t->ops->free(t, &e[1]);
	assert_int_equal(atomic_load(&t->used), 6 * PG);
	assert_int_equal(t->ops->alloc(t, 2 * PG, &x), 0);
	assert_int_equal(x.off, e[1].off);
	assert_ptr_equal(x.ptr, e[1].ptr);
	tfx_fill(x.ptr, x.len, 200);
	for (int i = 0; i < 4; i++)
		if (i != 1)
			assert_true(tfx_same(t->ops->map(t, &e[i]), e[i].len,
					 100 + i));
	e[1] = x;

	/* A forged extent (pointer and offset disagree) and a double free
	 * are logged and change nothing.
	 */
	x = e[2];
	x.ptr = base + e[3].off;
	t->ops->free(t, &x);
	assert_int_equal(atomic_load(&t->used), 8 * PG);
	x.ptr = NULL;
	t->ops->free(t, &x);
	assert_int_equal(atomic_load(&t->used), 8 * PG);
	t->ops->free(t, &e[2]);
	t->ops->free(t, &e[2]);
	assert_int_equal(atomic_load(&t->used), 6 * PG);
	assert_true(tfx_same(e[3].ptr, e[3].len, 103));

	t->ops->free(t, &e[0]);
	t->ops->free(t, &e[1]);
	t->ops->free(t, &e[3]);
	assert_int_equal(atomic_load(&t->used), 0);
	/* Everything merged back: one extent of the whole arena. */
	assert_int_equal(t->ops->alloc(t, 8 * PG, &x), 0);
	assert_ptr_equal(x.ptr, base);
	t->ops->free(t, &x);
	kvfs_tier_free(t);
}

/*
 * Free bytes in pieces: a request larger than every hole fails with
 * -ENOSPC although used + len <= capacity (the heap mode would succeed),
 * and succeeds once a neighbour is freed.
 */
static void test_dram_arena_fragmentation(void **state)
{
	struct kvfs_tier *t;
	struct kvfs_extent e[8], x;

	assert_int_equal(kvfs_tier_dram_init_flags(8 * PG, KVFS_DRAM_ARENA,
						   &t), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(t->ops->alloc(t, PG, &e[i]), 0);
	for (int i = 0; i < 8; i += 2)
		t->ops->free(t, &e[i]);
	assert_int_equal(atomic_load(&t->used), 4 * PG);
	assert_int_equal(t->ops->alloc(t, 2 * PG, &x), -ENOSPC);
	assert_int_equal(atomic_load(&t->used), 4 * PG);
	/* One page still fits, in the first hole. */
	assert_int_equal(t->ops->alloc(t, PG, &x), 0);
	assert_int_equal(x.off, e[0].off);
	t->ops->free(t, &x);
	/* Freeing e[3] joins the holes of e[2], e[3] and e[4]. */
	t->ops->free(t, &e[3]);
	assert_int_equal(t->ops->alloc(t, 3 * PG, &x), 0);
	assert_int_equal(x.off, e[2].off);
	assert_int_equal(t->ops->alloc(t, 2 * PG, &e[3]), -ENOSPC);
	t->ops->free(t, &x);
	for (int i = 1; i < 8; i += 2)
		if (i != 3)
			t->ops->free(t, &e[i]);
	assert_int_equal(atomic_load(&t->used), 0);
	assert_int_equal(t->ops->alloc(t, 8 * PG, &x), 0);
	t->ops->free(t, &x);
	kvfs_tier_free(t);
}

struct arena_worker {
	struct kvfs_tier *t;
	unsigned id;
	unsigned fails;  /* allocations refused (ENOSPC) */
	unsigned bad;    /* extents whose bytes another thread changed */
};

/*
 * Allocate extents of varied sizes, fill them with this thread's pattern,
 * free them in a different order, checking the bytes before each free:
 * an allocator that hands one range to two threads shows as bad bytes.
 */
static void *arena_worker_fn(void *arg)
{
	struct arena_worker *w = arg;
	struct kvfs_extent e[6];
	bool held[6] = { false };

	for (unsigned it = 0; it < 300; it++) {
		for (unsigned k = 0; k < 6; k++) {
			uint64_t len = (uint64_t)((it + k + w->id) % 4 + 1) *
				       PG - 17 * k;

			if (w->t->ops->alloc(w->t, len, &e[k])) {
				w->fails++;
				continue;
			}
			held[k] = true;
			tfx_fill(e[k].ptr, e[k].len,
			     (uint64_t)w->id << 32 | it << 4 | k);
		}
		for (unsigned q = 0; q < 6; q++) {
			unsigned k = (q * 5 + it) % 6;

			if (!held[k])
				continue;
			if (!tfx_same(e[k].ptr, e[k].len,
				  (uint64_t)w->id << 32 | it << 4 | k))
				w->bad++;
			w->t->ops->free(w->t, &e[k]);
			held[k] = false;
		}
	}
	return NULL;
}

static void test_dram_arena_threads(void **state)
{
	struct arena_worker w[4];
	pthread_t th[4];
	struct kvfs_tier *t;
	struct kvfs_extent x;

	/* Four times what the threads can hold at once (6 extents of at
	 * most 4 pages each), more than first fit's worst-case
	 * fragmentation for sizes within a factor of 4: nothing may fail.
	 */
	assert_int_equal(kvfs_tier_dram_init_flags(4 * 4 * 6 * 4 * PG,
						   KVFS_DRAM_ARENA, &t), 0);
	for (unsigned i = 0; i < 4; i++) {
		w[i] = (struct arena_worker){ .t = t, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, arena_worker_fn,
						&w[i]), 0);
	}
	for (unsigned i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(w[i].bad, 0);
		assert_int_equal(w[i].fails, 0);
	}
	assert_int_equal(atomic_load(&t->used), 0);
	/* Every range came back and merged. */
	assert_int_equal(t->ops->alloc(t, t->capacity, &x), 0);
	t->ops->free(t, &x);
	kvfs_tier_free(t);
}

/* One DRAM test in one mode, named so that failures say which. */
#define DRAM_TEST(fn, mode) { #fn "/" #mode, fn, NULL, NULL, &(mode_##mode) }

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		DRAM_TEST(test_dram_capacity, heap),
		DRAM_TEST(test_dram_capacity, arena),
		DRAM_TEST(test_dram_rw, heap),
		DRAM_TEST(test_dram_rw, arena),
		DRAM_TEST(test_dram_concurrent_alloc, heap),
		DRAM_TEST(test_dram_concurrent_alloc, arena),
		DRAM_TEST(test_dram_capacity, prefault),
		DRAM_TEST(test_dram_rw, prefault),
		DRAM_TEST(test_dram_concurrent_alloc, prefault),
		cmocka_unit_test(test_dram_prefault),
		cmocka_unit_test(test_dram_arena_layout),
		cmocka_unit_test(test_dram_arena_fragmentation),
		cmocka_unit_test(test_dram_arena_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
