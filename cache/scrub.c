/* SPDX-License-Identifier: MIT */
/*
 * The scrub: a background pass that re-reads every block's SSD extent and
 * checks it as a load would (kvfs_block_verify_ssd()), so that silent
 * corruption is found before a reader hits it.  A block that fails is
 * deleted (logged, counted): its only stored copy is bad, and a restart
 * would not serve it either.
 *
 * It is a periodic task of the mover, not a thread of its own: each
 * round it reads as many bytes as the rate allows for the time since the
 * last round ([daemon] scrub_rate), walking the namespaces' listings in
 * inode order from where it stopped.  A pass starts every
 * scrub_interval, or at once when asked (kvfs_cache_scrub_now()).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

struct kvfs_scrub {
	pthread_mutex_t lock; /* guards the fields up to the counters */
	bool running; /* lock: a pass is under way */
	size_t ns_i; /* lock: the namespace being walked */
	uint64_t next_ino; /* lock: the first inode not yet checked */
	uint64_t started; /* lock: monotonic ns of the last pass's start */
	uint64_t last_round; /* lock: monotonic ns of the last round */
	double budget; /* lock: bytes this round may still read */
	uint64_t pass_blocks, pass_bad; /* lock: this pass's */
	atomic_bool requested; /* atomic: start a pass at the next round */
	atomic_uint_least64_t passes, blocks, bytes, bad; /* atomic */
};

/* The first block of @ns from inode @ino on, with a reference, or NULL. */
static struct kvfs_block *next_block(struct kvfs_ns *ns, uint64_t ino)
{
	struct kvfs_block *b = NULL;
	size_t lo = 0, hi;

	pthread_rwlock_rdlock(&ns->lock);
	hi = ns->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ns->blocks[mid]->ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < ns->n) {
		b = ns->blocks[lo];
		kvfs_block_get_ref(b);
	}
	pthread_rwlock_unlock(&ns->lock);
	return b;
}

/*
 * Read @b's SSD copy and check it; a copy that fails is dropped.  Holds
 * the block open meanwhile, as a reader does (its extent is not reused
 * under the read), without counting an access.  Returns the bytes read.
 */
static uint64_t scrub_block(struct kvfs_cache *c, struct kvfs_scrub *s,
			    struct kvfs_block *b)
{
	struct kvfs_tier *ssd = c->tier[KVFS_TIER_SSD];
	char hex[KVFS_KEY_HEX_LEN + 1];
	struct kvfs_extent sx;
	void *buf;
	int rc;

	if (!(atomic_load(&b->flags) & KVFS_B_PERSISTED))
		return 0; /* no SSD copy yet: the write-back's */
	atomic_fetch_add(&b->opens, 1);
	/* Pairs with kvfs_block_delete(), as in kvfs_cache_reader_init(). */
	if ((atomic_load(&b->flags) & KVFS_B_DELETED) ||
	    kvfs_block_ssd_get(b, &sx)) {
		atomic_fetch_sub(&b->opens, 1);
		kvfs_block_try_free(c, b);
		return 0;
	}
	if (posix_memalign(&buf, KVFS_FMT_ALIGN, sx.len)) {
		atomic_fetch_sub(&b->opens, 1);
		kvfs_block_try_free(c, b);
		return 0;
	}
	rc = ssd->ops->read(ssd, &sx, 0, buf, sx.len);
	if (!rc)
		rc = kvfs_block_verify_ssd(c, b, buf);
	free(buf);
	atomic_fetch_sub(&b->opens, 1);
	atomic_fetch_add(&s->blocks, 1);
	atomic_fetch_add(&s->bytes, sx.len);
	s->pass_blocks++;
	kvfs_fmt_key_hex(b->pn.key, hex);
	if (rc == -EBADMSG) {
		atomic_fetch_add(&s->bad, 1);
		s->pass_bad++;
		/* Its pins go with it: there is nothing left to keep. */
		atomic_store(&b->pins, 0);
		rc = kvfs_block_delete(c, b, "dropped by the scrub");
		kvfs_err("ns %s: block %s.kv fails the scrub: %s",
			 b->ns->rec.name, hex, rc ? strerror(-rc) : "dropped");
	} else if (rc) {
		/* Not the data's fault (an I/O error): the next pass tries
		 * again.
		 */
		kvfs_warn("ns %s: block %s.kv: scrub read failed: %s",
			  b->ns->rec.name, hex, strerror(-rc));
	}
	kvfs_block_try_free(c, b);
	return sx.len;
}

/* Start a pass if one is due; whether one is under way. Caller holds
 * s->lock.
 */
static bool pass_due(struct kvfs_cache *c, struct kvfs_scrub *s, uint64_t now)
{
	uint64_t every = c->conf.scrub_interval_ms * 1000000ull;

	if (s->running)
		return true;
	if (!atomic_exchange(&s->requested, false) &&
	    (!every || now - s->started < every))
		return false;
	s->running = true;
	s->ns_i = 0;
	s->next_ino = 0;
	s->started = now;
	s->budget = 0;
	s->pass_blocks = s->pass_bad = 0;
	kvfs_info("scrub: pass started");
	return true;
}

static int scrub_round(struct kvfs_cache *c)
{
	struct kvfs_scrub *s = c->scrub;
	uint64_t now = kvfs_util_now_mono();
	double rate = (double)c->conf.scrub_rate;

	pthread_mutex_lock(&s->lock);
	if (!pass_due(c, s, now)) {
		s->last_round = now;
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	/* What the rate allows since the last round, at most one second's
	 * worth (a long round does not buy a burst); a block larger than
	 * that is read whole and paid for in the next rounds.
	 */
	if (rate > 0) {
		s->budget += rate * (double)(now - s->last_round) / 1e9;
		if (s->budget > rate)
			s->budget = rate;
	}
	s->last_round = now;
	while (rate <= 0 || s->budget > 0) {
		struct kvfs_block *b = NULL;

		if (s->ns_i < c->n_ns)
			b = next_block(&c->ns[s->ns_i], s->next_ino);
		if (!b && s->ns_i < c->n_ns) {
			s->ns_i++;
			s->next_ino = 0;
			continue;
		}
		if (!b) {
			s->running = false;
			atomic_fetch_add(&s->passes, 1);
			kvfs_info("scrub: pass done: %" PRIu64
				  " blocks checked, %" PRIu64 " dropped",
				  s->pass_blocks, s->pass_bad);
			break;
		}
		s->next_ino = b->ino + 1;
		s->budget -= (double)scrub_block(c, s, b);
		kvfs_cache_put(c, b);
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int kvfs_scrub_init(struct kvfs_cache *c)
{
	struct kvfs_scrub *s = calloc(1, sizeof(*s));
	int rc;

	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	s->started = s->last_round = kvfs_util_now_mono();
	c->scrub = s;
	rc = kvfs_task_add(c, "scrub", scrub_round);
	if (rc) {
		kvfs_scrub_free(c);
		return rc;
	}
	return 0;
}

void kvfs_scrub_free(struct kvfs_cache *c)
{
	if (!c->scrub)
		return;
	pthread_mutex_destroy(&c->scrub->lock);
	free(c->scrub);
	c->scrub = NULL;
}

void kvfs_scrub_stats(struct kvfs_cache *c, FILE *f)
{
	struct kvfs_scrub *s = c->scrub;

	if (!s)
		return;
	fprintf(f, "scrub.passes %" PRIu64 "\n", atomic_load(&s->passes));
	fprintf(f, "scrub.blocks %" PRIu64 "\n", atomic_load(&s->blocks));
	fprintf(f, "scrub.bytes %" PRIu64 "\n", atomic_load(&s->bytes));
	fprintf(f, "scrub.bad %" PRIu64 "\n", atomic_load(&s->bad));
}

int kvfs_cache_scrub_now(struct kvfs_cache *c)
{
	if (!c->scrub)
		return -EOPNOTSUPP;
	atomic_store(&c->scrub->requested, true);
	kvfs_info("scrub: a pass was asked for");
	return 0;
}
