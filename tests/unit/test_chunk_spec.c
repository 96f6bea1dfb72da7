/* SPDX-License-Identifier: MIT */
/*
 * Speculative chunk loads (cache/chunk_flight.c, docs/contiguouskv.md) on
 * the fixture of chunk_fx_i.h: what they count, a read joining a load in
 * flight (and what it does when the load fails, is corrupt or drops its
 * piece), and cancelling a load, also under stress.
 *
 * The device set uses the shm backend; KVFS_TEST_GPU=cuda runs the same
 * tests against cuda (make test-gpu).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache/cache.h"
#include "cache/chunk.h"
#include "cache/params.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "tests/unit/chunk_fx_i.h"

static int setup_spec(void **state)
{
	struct opts o = { .chunk_dram = 64 * KiB };

	*state = fx_new(&o, true);
	return 0;
}

static void spec_read(struct fx *f, const int *t, size_t np,
		      struct kvfs_chunk_result *res, int want_from)
{
	struct req r;

	req_init(f, &r, NS_BF16, t, np);
	for (size_t k = 0; k < np; k++)
		r.p[k].dst = NULL;
	assert_int_equal(kvfs_chunk_read(f->c, r.p, np, KVFS_CHUNK_SPECULATIVE,
					 &r.res),
			 0);
	for (size_t k = 0; k < np; k++)
		assert_int_equal(r.p[k].from, want_from);
	*res = r.res;
	req_free(f, &r);
}

/* Speculative loads fill the cache but count in F only once used. */
static void test_speculative(void **state)
{
	struct fx *f = *state;
	static const int s1[] = { 0, 0, 0, 0, 1, 0 };
	static const int e1[] = { 0, 0, 0 };
	static const int e2[] = { 0, 0, 1, 0, 1, 1 };
	static const int s3[] = { 0, 0, 2 };
	static const int e3[] = { 0, 0, 3 };
	static const int s4[] = { 0, 1, 3 };
	struct kvfs_chunk_result res;
	struct kvfs_chunk_stats st;
	struct req r;
	double i;
	uint64_t fv;

	spec_read(f, s1, 2, &res, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(res.ssd_reads, 2);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_int_equal(fv, 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_loaded, 2);
	assert_int_equal(st.spec_used, 0);

	req_init(f, &r, NS_BF16, e1, 1);
	assert_int_equal(req_run(f, &r, NS_BF16, 0), 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 1);
	assert_int_equal(r.res.spec_hits, 1);
	assert_int_equal(r.res.mem_hits, 1);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_int_equal(fv, 1);
	/* Used once: an ordinary piece from now on. */
	assert_int_equal(req_run(f, &r, NS_BF16, 0), 0);
	assert_int_equal(r.p[0].spec, 0);
	assert_int_equal(r.res.spec_hits, 0);
	req_free(f, &r);
	get_score(f, NS_BF16, 0, 0, &i, &fv);
	assert_int_equal(fv, 2);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_used, 1);

	/* Fill DRAM (4 pieces): chunk 1 scores S 10 on two layers. */
	score(f, NS_BF16, 0, 1, 5);
	read_pieces(f, NS_BF16, e2, 2, KVFS_CHUNK_FROM_SSD);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.dram_pieces, 4);
	/* A speculative piece that would not be kept is not even read. */
	spec_read(f, s3, 1, &res, 0);
	assert_int_equal(res.ssd_reads, 0);
	assert_int_equal(res.bytes_read, 0);
	assert_int_equal(where(f, NS_BF16, 0, 0, 2), KVFS_CHUNK_IN_NONE);
	/* One that beats the lowest (S 0) is read and kept. */
	score(f, NS_BF16, 0, 3, 1);
	read_pieces(f, NS_BF16, e3, 1, KVFS_CHUNK_FROM_SSD);
	spec_read(f, s4, 1, &res, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(where(f, NS_BF16, 0, 1, 3), KVFS_CHUNK_IN_DRAM);
	/* The two S-0 pieces (chunk 0) made room. */
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), KVFS_CHUNK_IN_NONE);
	assert_int_equal(where(f, NS_BF16, 0, 1, 0), KVFS_CHUNK_IN_NONE);
	get_score(f, NS_BF16, 0, 3, &i, &fv);
	assert_int_equal(fv, 1);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_loaded, 3);
}

/* ------------------------------------------------- joining a prefetch */

enum { GATE_PASS, GATE_EIO, GATE_CORRUPT };

/*
 * Holds a speculative load's SSD read in flight (in the chunk read hook)
 * until the test releases it, optionally failing it or damaging its
 * bytes, and counts the reads and joins it sees.
 */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int mode; /* GATE_*: done to the speculative read */
	int spec_reads; /* speculative SSD reads seen */
	int reads; /* other SSD reads seen */
	size_t joined; /* pieces requests announced they wait for */
	bool held; /* a speculative read is in the hook */
	bool release;
};

static void gate_hook(void *arg, int kind, const struct kvfs_chunk_hook_ev *ev)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->lock);
	if (kind == KVFS_CHUNK_HOOK_JOIN) {
		g->joined += ev->joined;
	} else if (!ev->spec) {
		g->reads++;
	} else {
		g->spec_reads++;
		if (g->mode == GATE_EIO)
			*ev->res = -EIO;
		else if (g->mode == GATE_CORRUPT && ev->buf)
			((uint8_t *)ev->buf)[ev->len / 2] ^= 0x5a;
		g->held = true;
		pthread_cond_broadcast(&g->cond);
		while (!g->release)
			pthread_cond_wait(&g->cond, &g->lock);
	}
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

struct run {
	struct fx *f;
	struct req *r;
	unsigned flags;
	const atomic_int *cancel; /* a cancellable speculative load */
	struct gate *g;
	bool finished; /* under g->lock */
	int rc;
};

static void *run_main(void *arg)
{
	struct run *x = arg;

	if (x->cancel)
		x->rc = kvfs_chunk_speculate(x->f->c, x->r->p, x->r->np,
					     x->cancel, &x->r->res);
	else
		x->rc = kvfs_chunk_read(x->f->c, x->r->p, x->r->np, x->flags,
					&x->r->res);
	pthread_mutex_lock(&x->g->lock);
	x->finished = true;
	pthread_cond_broadcast(&x->g->cond);
	pthread_mutex_unlock(&x->g->lock);
	return NULL;
}

/*
 * A speculative load of piece @t held in flight (@mode done to its read),
 * @meanwhile run while it is, then a request @r for the same piece; the
 * load is let go once the request waits for it (or has finished without
 * waiting). Both are done on return; *@spec_rc is the load's result,
 * g->reads counts only the request's reads. Nothing here waits on time.
 */
static int join_run(struct fx *f, struct gate *g, const int *t, int mode,
		    void (*meanwhile)(struct fx *f), struct req *r,
		    int *spec_rc)
{
	struct req sr;
	struct run rs = {
		.f = f, .r = &sr, .flags = KVFS_CHUNK_SPECULATIVE, .g = g
	};
	struct run rr = { .f = f, .r = r, .g = g };
	pthread_t ts, tr;

	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->mode = mode;
	req_init(f, &sr, NS_BF16, t, 1);
	sr.p[0].dst = NULL;
	req_init(f, r, NS_BF16, t, 1);
	kvfs_chunk_set_hook(f->c, gate_hook, g);
	assert_int_equal(pthread_create(&ts, NULL, run_main, &rs), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->held && !rs.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	if (meanwhile)
		meanwhile(f);
	pthread_mutex_lock(&g->lock);
	g->reads = 0;
	pthread_mutex_unlock(&g->lock);
	assert_int_equal(pthread_create(&tr, NULL, run_main, &rr), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->joined && !rr.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	g->release = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	pthread_join(tr, NULL);
	pthread_join(ts, NULL);
	kvfs_chunk_set_hook(f->c, NULL, NULL);
	*spec_rc = rs.rc;
	assert_int_equal(g->spec_reads, 1);
	assert_int_equal(sr.res.ssd_reads, 1);
	req_free(f, &sr);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	/* The request's own bytes, wherever they came from. */
	req_check(f, r, NS_BF16);
	return rr.rc;
}

/* A request for a piece a speculative load is reading waits for that
 * read and takes the cached bytes: no second read.
 */
static void test_join(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 1, 2 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	double i;
	uint64_t fv;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_PASS, NULL, &r, &src), 0);
	assert_int_equal(src, 0);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 0);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 1);
	assert_int_equal(r.res.joined, 1);
	assert_int_equal(r.res.ssd_reads, 0);
	assert_int_equal(r.res.bytes_read, 0);
	assert_int_equal(r.res.mem_hits, 0);
	assert_int_equal(r.res.spec_hits, 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.ssd_reads, 1);
	assert_int_equal(st.prefetch_joined, 1);
	assert_int_equal(st.spec_loaded, 1);
	assert_int_equal(st.spec_used, 1);
	assert_int_equal(st.mem_hits, 0);
	/* The load's piece only: the request read nothing. */
	assert_int_equal(st.bytes_missed, cbytes(NS_BF16));
	/* The request counted in F like any other. */
	get_score(f, NS_BF16, 0, 2, &i, &fv);
	assert_int_equal(fv, 1);
	/* Used once: an ordinary hit from now on. */
	memset(r.buf, 0xee, cbytes(NS_BF16));
	assert_int_equal(req_run(f, &r, NS_BF16, 0), 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 0);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(r.res.mem_hits, 1);
	req_free(f, &r);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 1);
	assert_int_equal(st.spec_used, 1);
}

/* The load's read fails: the waiter reads the piece itself. */
static void test_join_failed(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 3, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_EIO, NULL, &r, &src), 0);
	assert_int_equal(src, -EIO);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(r.res.ssd_reads, 1);
	assert_int_equal(r.res.bytes_read, cbytes(NS_BF16));
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 0);
	assert_int_equal(st.spec_loaded, 0);
	/* The load's piece, and the request's own read of it. */
	assert_int_equal(st.bytes_missed, 2 * cbytes(NS_BF16));
	/* Its own read was cached. */
	assert_int_equal(where(f, NS_BF16, 1, 3, 0), KVFS_CHUNK_IN_DRAM);
	req_free(f, &r);
}

/* The load's bytes fail their CRC: never handed to the waiter, which
 * reads the piece itself.
 */
static void test_join_corrupt(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 2, 0, 1 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_CORRUPT, NULL, &r, &src), 0);
	assert_int_equal(src, -EBADMSG);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(stat_of(f, "cache.checksum_errors"), 1);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 0);
	req_free(f, &r);
}

/* Chunk 1 of block 0 scores 5 on every layer: the 64 KiB cache is full
 * of pieces a score-0 load cannot displace.
 */
static void fill_cache(struct fx *f)
{
	static const int t[] = { 0, 0, 1, 0, 1, 1, 0, 2, 1, 0, 3, 1 };

	score(f, NS_BF16, 0, 1, 5);
	read_pieces(f, NS_BF16, t, 4, KVFS_CHUNK_FROM_SSD);
}

/* The cache fills while the load reads: it drops the piece, and the
 * waiter, finding nothing, reads it itself.
 */
static void test_join_dropped(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 0, 0, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r;
	int src;

	assert_int_equal(join_run(f, &g, t, GATE_PASS, fill_cache, &r, &src),
			 0);
	assert_int_equal(src, 0);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(where(f, NS_BF16, 0, 0, 0), KVFS_CHUNK_IN_NONE);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.prefetch_joined, 0);
	assert_int_equal(st.spec_loaded, 0);
	assert_int_equal(st.dram_pieces, 4);
	req_free(f, &r);
}

/* ------------------------------------------ cancelling a speculation */

#define CANCEL_DEPTH 4
#define SPEC_N 16

static int setup_cancel(void **state)
{
	struct opts o = { .chunk_dram = 64 * MiB, .spec_depth = CANCEL_DEPTH };

	*state = fx_new(&o, true);
	return 0;
}

/*
 * The load of the cancel tests: chunks 0 and 2 of blocks 0 and 1 on
 * every layer. No two touch on disk, so these are 16 reads, issued four
 * a layer, layer by layer: with a depth of 4 exactly layer 0's are on
 * the disk when the first completes.
 */
static void spec16(int *t)
{
	size_t k = 0;

	for (int l = 0; l < 4; l++)
		for (int b = 0; b < 2; b++)
			for (int c = 0; c <= 2; c += 2) {
				t[k++] = b;
				t[k++] = l;
				t[k++] = c;
			}
}

/*
 * A cancellable load (spec16) is held at its first completed read; the
 * load is cancelled before request @r (@np pieces @t) starts when
 * @early, else once @r waits for a piece of it; then the load is let go.
 * Both are done on return; @sr is the load's request, to be freed by the
 * caller, *@spec_rc its result, and g->reads counts only @r's reads.
 * Nothing waits on time.
 */
static int cancel_run(struct fx *f, struct gate *g, bool early, const int *t,
		      size_t np, struct req *r, struct req *sr, int *spec_rc)
{
	static atomic_int cancel;
	int st[3 * SPEC_N];
	struct run rs = { .f = f, .r = sr, .cancel = &cancel, .g = g };
	struct run rr = { .f = f, .r = r, .g = g };
	pthread_t ts, tr;

	atomic_store(&cancel, 0);
	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->mode = GATE_PASS;
	spec16(st);
	req_init(f, sr, NS_BF16, st, SPEC_N);
	for (size_t k = 0; k < SPEC_N; k++)
		sr->p[k].dst = NULL;
	req_init(f, r, NS_BF16, t, np);
	kvfs_chunk_set_hook(f->c, gate_hook, g);
	assert_int_equal(pthread_create(&ts, NULL, run_main, &rs), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->held && !rs.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	g->reads = 0;
	pthread_mutex_unlock(&g->lock);
	if (early)
		atomic_store(&cancel, 1);
	assert_int_equal(pthread_create(&tr, NULL, run_main, &rr), 0);
	pthread_mutex_lock(&g->lock);
	while (!g->joined && !rr.finished)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	if (!early)
		atomic_store(&cancel, 1);
	pthread_mutex_lock(&g->lock);
	g->release = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	pthread_join(tr, NULL);
	pthread_join(ts, NULL);
	kvfs_chunk_set_hook(f->c, NULL, NULL);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	req_check(f, r, NS_BF16);
	*spec_rc = rs.rc;
	return rr.rc;
}

/* The load's pieces: layer 0's read (the four on the disk when it was
 * cancelled) and cached, every other one cancelled.
 */
static void check_cancelled_load(struct fx *f, struct req *sr, int rc)
{
	uint64_t cb = cbytes(NS_BF16);

	assert_int_equal(rc, -ECANCELED);
	assert_int_equal(sr->res.ssd_reads, CANCEL_DEPTH);
	assert_int_equal(sr->res.bytes_read, CANCEL_DEPTH * cb);
	for (size_t k = 0; k < SPEC_N; k++) {
		if (sr->p[k].layer == 0) {
			assert_int_equal(sr->p[k].err, 0);
			assert_int_equal(sr->p[k].from, KVFS_CHUNK_FROM_SSD);
		} else {
			assert_int_equal(sr->p[k].err, -ECANCELED);
			assert_int_equal(sr->p[k].from, 0);
		}
	}
	/* Read by nobody: not cached. */
	assert_int_equal(where(f, NS_BF16, 1, 3, 2), KVFS_CHUNK_IN_NONE);
	assert_int_equal(where(f, NS_BF16, 0, 1, 0), KVFS_CHUNK_IN_NONE);
}

/*
 * A request that supersedes a speculative load: the load's reads not
 * yet issued never are, those on the disk (no more than the depth) finish
 * and stay joinable, and a piece whose read was never issued is read by
 * the request with its own, without waiting.
 */
static void test_cancel(void **state)
{
	struct fx *f = *state;
	/* issued (layer 0), never issued (layer 2), not in the load */
	static const int t[] = { 0, 0, 2, 1, 2, 0, 0, 3, 1 };
	uint64_t cb = cbytes(NS_BF16);
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r, sr;
	uint64_t reads0;
	int src;

	reads0 = stat_of(f, "tier.ssd.io_reads");
	assert_int_equal(cancel_run(f, &g, true, t, 3, &r, &sr, &src), 0);
	/* Only the issued piece was waited for. */
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.spec_reads, CANCEL_DEPTH);
	assert_int_equal(g.reads, 2);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.p[0].spec, 1);
	assert_int_equal(r.p[1].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.p[2].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.res.joined, 1);
	assert_int_equal(r.res.ssd_reads, 2);
	assert_int_equal(r.res.bytes_read, 2 * cb);
	check_cancelled_load(f, &sr, src);
	/* The tier issued the load's four reads and the request's two. */
	assert_int_equal(stat_of(f, "tier.ssd.io_reads") - reads0,
			 CANCEL_DEPTH + 2);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_cancelled, SPEC_N - CANCEL_DEPTH);
	assert_int_equal(stat_of(f, "chunk.spec_cancelled"),
			 SPEC_N - CANCEL_DEPTH);
	assert_int_equal(st.spec_loaded, CANCEL_DEPTH);
	assert_int_equal(st.spec_used, 1);
	assert_int_equal(st.prefetch_joined, 1);
	assert_int_equal(st.ssd_reads, CANCEL_DEPTH + 2);
	/* What was read: the load's four pieces and the request's two. */
	assert_int_equal(st.bytes_missed, (CANCEL_DEPTH + 2) * cb);
	assert_int_equal(st.bytes_read, (CANCEL_DEPTH + 2) * cb);
	/* The piece the request read itself is cached as its own. */
	assert_int_equal(where(f, NS_BF16, 1, 2, 0), KVFS_CHUNK_IN_DRAM);
	req_free(f, &r);
	req_free(f, &sr);
}

/*
 * A request joined a read the load had not issued yet; then the load is
 * cancelled: the read never happens, and the request reads the piece
 * itself, with the right bytes.
 */
static void test_cancel_joined(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 2, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r, sr;
	int src;

	assert_int_equal(cancel_run(f, &g, false, t, 1, &r, &sr, &src), 0);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.spec_reads, CANCEL_DEPTH);
	assert_int_equal(g.reads, 1);
	assert_int_equal(r.p[0].err, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_SSD);
	assert_int_equal(r.p[0].spec, 0);
	assert_int_equal(r.res.joined, 0);
	assert_int_equal(r.res.ssd_reads, 1);
	check_cancelled_load(f, &sr, src);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_cancelled, SPEC_N - CANCEL_DEPTH);
	assert_int_equal(st.prefetch_joined, 0);
	assert_int_equal(st.spec_loaded, CANCEL_DEPTH);
	assert_int_equal(st.spec_used, 0);
	assert_int_equal(where(f, NS_BF16, 1, 2, 0), KVFS_CHUNK_IN_DRAM);
	req_free(f, &r);
	req_free(f, &sr);
}

/* With no depth of its own (spec_depth 0) the whole load is on the disk
 * at its first completion, and a cancel then stops nothing.
 */
static void test_cancel_nocap(void **state)
{
	struct fx *f = *state;
	static const int t[] = { 1, 2, 0 };
	struct kvfs_chunk_stats st;
	struct gate g;
	struct req r, sr;
	int src;

	f->conf.chunk_spec_depth = 0;
	fx_remount(f);
	assert_int_equal(cancel_run(f, &g, true, t, 1, &r, &sr, &src), 0);
	assert_int_equal(src, 0);
	assert_int_equal(g.spec_reads, SPEC_N);
	assert_int_equal(g.joined, 1);
	assert_int_equal(g.reads, 0);
	assert_int_equal(r.p[0].from, KVFS_CHUNK_FROM_CACHE);
	assert_int_equal(r.res.joined, 1);
	assert_int_equal(sr.res.ssd_reads, SPEC_N);
	for (size_t k = 0; k < SPEC_N; k++)
		assert_int_equal(sr.p[k].err, 0);
	kvfs_chunk_get_stats(f->c, &st);
	assert_int_equal(st.spec_cancelled, 0);
	assert_int_equal(st.spec_loaded, SPEC_N);
	req_free(f, &r);
	req_free(f, &sr);
}

/*
 * Cancellable loads (two sharing one token, one with its own) and
 * requests over overlapping random pieces, run at once, one token set
 * while they run: every call returns, every request gets its bytes, a
 * load's pieces are read or cancelled, the counters agree with the calls
 * and the tier, and no flight is left behind (a last request for every
 * piece would wait on one forever).
 */
#define STRESS_NP 44
static void stress_pieces(uint64_t *seed, int *t, size_t np)
{
	int all[3 * STRESS_NP];
	size_t k = 0;

	for (int b = 0; b < NBLK; b++)
		for (int l = 0; l < 4; l++)
			for (int c = 0; c < (b == NBLK - 1 ? 3 : 4); c++) {
				all[3 * k] = b;
				all[3 * k + 1] = l;
				all[3 * k + 2] = c;
				k++;
			}
	assert_int_equal(k, STRESS_NP);
	/* A random subset, no piece twice. */
	for (size_t i = 0; i < np; i++) {
		size_t j = i + xs(seed) % (STRESS_NP - i);
		int x[3];

		memcpy(x, &all[3 * j], sizeof(x));
		memmove(&all[3 * j], &all[3 * i], sizeof(x));
		memcpy(&all[3 * i], x, sizeof(x));
		memcpy(&t[3 * i], x, sizeof(x));
	}
}

static void test_cancel_stress(void **state)
{
	struct fx *f = *state;
	enum { NL = 3, NR = 2 };
	uint64_t seed = 4242;

	for (int it = 0; it < 24; it++) {
		static atomic_int tok[2];
		struct req lr[NL], rr[NR], last;
		struct run ru[NL + NR];
		pthread_t th[NL + NR];
		struct gate g = { 0 };
		struct kvfs_chunk_stats s0, s1;
		uint64_t io0, cancelled = 0, bread = 0, nreads = 0;
		int t[3 * STRESS_NP];

		f->conf.chunk_spec_depth = 1 + (unsigned)(it % 3);
		fx_remount(f);
		pthread_mutex_init(&g.lock, NULL);
		pthread_cond_init(&g.cond, NULL);
		atomic_store(&tok[0], 0);
		atomic_store(&tok[1], 0);
		for (int k = 0; k < NL; k++) {
			size_t np = 8 + xs(&seed) % 24;

			stress_pieces(&seed, t, np);
			req_init(f, &lr[k], NS_BF16, t, np);
			for (size_t j = 0; j < np; j++)
				lr[k].p[j].dst = NULL;
			ru[k] = (struct run){ .f = f,
					      .r = &lr[k],
					      .g = &g,
					      .cancel = &tok[k == 2] };
		}
		for (int k = 0; k < NR; k++) {
			size_t np = 4 + xs(&seed) % 20;

			g_misalign = (it + k) % 2 ? 64 : 0;
			stress_pieces(&seed, t, np);
			req_init(f, &rr[k], NS_BF16, t, np);
			ru[NL + k] =
				(struct run){ .f = f, .r = &rr[k], .g = &g };
		}
		g_misalign = 0;
		kvfs_chunk_get_stats(f->c, &s0);
		io0 = stat_of(f, "tier.ssd.io_reads");
		for (int k = 0; k < NL + NR; k++)
			assert_int_equal(pthread_create(&th[k], NULL, run_main,
							&ru[k]),
					 0);
		atomic_store(&tok[it % 2], 1);
		for (int k = 0; k < NL + NR; k++)
			pthread_join(th[k], NULL);
		for (int k = 0; k < NR; k++) {
			assert_int_equal(ru[NL + k].rc, 0);
			req_check(f, &rr[k], NS_BF16);
			bread += rr[k].res.bytes_read;
			nreads += rr[k].res.ssd_reads;
		}
		for (int k = 0; k < NL; k++) {
			assert_true(ru[k].rc == 0 || ru[k].rc == -ECANCELED);
			for (size_t j = 0; j < lr[k].np; j++) {
				int e = lr[k].p[j].err;

				assert_true(e == 0 || e == -ECANCELED);
				cancelled += e == -ECANCELED;
				if (e)
					assert_int_equal(lr[k].p[j].from, 0);
			}
			bread += lr[k].res.bytes_read;
			nreads += lr[k].res.ssd_reads;
		}
		kvfs_chunk_get_stats(f->c, &s1);
		assert_int_equal(s1.spec_cancelled - s0.spec_cancelled,
				 cancelled);
		assert_int_equal(s1.bytes_read - s0.bytes_read, bread);
		assert_int_equal(s1.ssd_reads - s0.ssd_reads, nreads);
		assert_int_equal(stat_of(f, "tier.ssd.io_reads") - io0, nreads);
		/* Nothing read more than it wanted: every SSD byte was a
		 * wanted one (aligned pieces, CRC tables).
		 */
		assert_int_equal(s1.bytes_missed - s0.bytes_missed, bread);
		/* No flight left: this would wait on one forever. */
		stress_pieces(&seed, t, STRESS_NP);
		req_init(f, &last, NS_BF16, t, STRESS_NP);
		assert_int_equal(kvfs_chunk_read(f->c, last.p, last.np, 0,
						 &last.res),
				 0);
		req_check(f, &last, NS_BF16);
		req_free(f, &last);
		for (int k = 0; k < NL; k++)
			req_free(f, &lr[k]);
		for (int k = 0; k < NR; k++)
			req_free(f, &rr[k]);
		pthread_cond_destroy(&g.cond);
		pthread_mutex_destroy(&g.lock);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_speculative, setup_spec,
						teardown),
		cmocka_unit_test_setup_teardown(test_join, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_join_failed, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_join_corrupt, setup_dram,
						teardown),
		cmocka_unit_test_setup_teardown(test_join_dropped, setup_spec,
						teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup_cancel,
						teardown),
		cmocka_unit_test_setup_teardown(test_cancel_joined,
						setup_cancel, teardown),
		cmocka_unit_test_setup_teardown(test_cancel_nocap, setup_cancel,
						teardown),
		cmocka_unit_test_setup_teardown(test_cancel_stress,
						setup_cancel, teardown),
	};

	chunk_fx_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
