/* SPDX-License-Identifier: MIT */
/* The tier suites' seeded buffers (tier_fx_i.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/tier_fx_i.h"

/* Deterministic bytes for (@seed, byte position): any misplaced page shows. */
void tfx_fill(void *buf, uint64_t len, uint64_t seed)
{
	uint64_t *p = buf;

	for (uint64_t i = 0; i < len / 8; i++) {
		uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;

		x ^= x >> 31;
		x *= 0xbf58476d1ce4e5b9ull;
		p[i] = x ^ (x >> 29);
	}
}

bool tfx_same(const void *buf, uint64_t len, uint64_t seed)
{
	void *want = aligned_alloc(PG, len ? len : PG);
	bool ok;

	assert_non_null(want);
	tfx_fill(want, len, seed);
	ok = !memcmp(buf, want, len);
	free(want);
	return ok;
}

void *tfx_xalloc(uint64_t len)
{
	void *p = aligned_alloc(PG, len);

	assert_non_null(p);
	return p;
}
