/* SPDX-License-Identifier: MIT */
/*
 * Offline store check and repair (meta/fsck.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meta/fsck.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/store.h"
#include "meta/util.h"

struct fns {
	struct kvfs_meta_ns rec;
	struct kvfs_geom g;
};

enum ccrc_state {
	CCRC_NONE = 0, /* no table (reads check the whole block) */
	CCRC_OK,
	CCRC_BAD, /* damaged, or disagrees with a block that verifies */
};

struct frec {
	uint8_t key[KVFS_KEY_LEN];
	struct kvfs_meta_blk r;
	bool damaged; /* the record itself is unreadable */
	bool sane; /* the extent lies inside the data file */
	bool bad; /* cannot be served */
	int ccrc; /* enum ccrc_state */
};

struct range {
	uint64_t off, len;
};

/* A chunk CRC table or chunk scores under a key with no block record. */
struct side {
	uint8_t key[KVFS_KEY_LEN];
	uint32_t n; /* score entries; 0 for a table */
};

struct fsck {
	struct kvfs_store *s;
	FILE *out;
	unsigned flags;
	int fd;
	struct fns *ns;
	size_t n_ns, cap_ns;
	struct frec *recs;
	size_t n_recs, cap_recs;
	struct range *free;
	size_t n_free, cap_free;
	struct side *ccrc_orph;
	size_t n_ccrc_orph, cap_ccrc_orph;
	struct side *score_orph;
	size_t n_score_orph, cap_score_orph;
	struct kvfs_fsck_report rep;
};

static int grow(void **arr, size_t *cap, size_t n, size_t sz)
{
	void *p;

	if (n < *cap)
		return 0;
	*cap = *cap ? *cap * 2 : 64;
	p = realloc(*arr, *cap * sz);
	if (!p)
		return -ENOMEM;
	*arr = p;
	return 0;
}

static int ns_cb(const struct kvfs_meta_ns *ns, void *arg)
{
	struct fsck *f = arg;
	struct fns *x;

	if (grow((void **)&f->ns, &f->cap_ns, f->n_ns, sizeof(*f->ns)))
		return -ENOMEM;
	x = &f->ns[f->n_ns++];
	x->rec = *ns;
	x->g = (struct kvfs_geom){
		.n_layers = ns->n_layers,
		.n_kv_heads = ns->n_kv_heads,
		.head_dim = ns->head_dim,
		.hidden_size = ns->hidden_size,
		.block_tokens = ns->block_tokens,
		.chunk_tokens = ns->chunk_tokens,
		.dtype = ns->dtype,
	};
	return 0;
}

static int blk_cb(const uint8_t *key, const struct kvfs_meta_blk *rec, bool bad,
		  void *arg)
{
	struct fsck *f = arg;
	struct frec *x;

	if (grow((void **)&f->recs, &f->cap_recs, f->n_recs, sizeof(*f->recs)))
		return -ENOMEM;
	x = &f->recs[f->n_recs++];
	memset(x, 0, sizeof(*x));
	memcpy(x->key, key, KVFS_KEY_LEN);
	x->damaged = bad;
	if (!bad)
		x->r = *rec;
	return 0;
}

static int free_cb(uint64_t off, uint64_t len, void *arg)
{
	struct fsck *f = arg;

	if (grow((void **)&f->free, &f->cap_free, f->n_free, sizeof(*f->free)))
		return -ENOMEM;
	f->free[f->n_free++] = (struct range){ off, len };
	return 0;
}

static int cmp_key(const void *key, const void *elem)
{
	const struct frec *x = elem;

	return memcmp(key, x->key, KVFS_KEY_LEN);
}

/* Whether @key has a block record, readable or not.  The records were
 * read by a key-order walk, so they are sorted by key.
 */
static bool has_record(const struct fsck *f, const uint8_t *key)
{
	return f->n_recs &&
	       bsearch(key, f->recs, f->n_recs, sizeof(*f->recs), cmp_key);
}

static int side_add(struct side **arr, size_t *n, size_t *cap,
		    const uint8_t *key, uint32_t cnt)
{
	if (grow((void **)arr, cap, *n, sizeof(**arr)))
		return -ENOMEM;
	memcpy((*arr)[*n].key, key, KVFS_KEY_LEN);
	(*arr)[(*n)++].n = cnt;
	return 0;
}

static int ccrc_cb(const uint8_t *key, void *arg)
{
	struct fsck *f = arg;

	if (has_record(f, key))
		return 0;
	return side_add(&f->ccrc_orph, &f->n_ccrc_orph, &f->cap_ccrc_orph, key,
			0);
}

static int score_cb(const uint8_t *key, uint32_t n, void *arg)
{
	struct fsck *f = arg;

	if (has_record(f, key))
		return 0;
	return side_add(&f->score_orph, &f->n_score_orph, &f->cap_score_orph,
			key, n);
}

static const struct fns *ns_by_id(const struct fsck *f, uint32_t id)
{
	for (size_t i = 0; i < f->n_ns; i++)
		if (f->ns[i].rec.id == id)
			return &f->ns[i];
	return NULL;
}

/* One line about a block: "block KEY (ns NAME, extent OFF+LEN): WHY". */
static void say_block(struct fsck *f, const struct frec *x, const char *what)
{
	const struct fns *ns = x->damaged ? NULL : ns_by_id(f, x->r.ns_id);
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_fmt_key_hex(x->key, hex);
	if (x->damaged)
		fprintf(f->out, "block %s: %s\n", hex, what);
	else
		fprintf(f->out,
			"block %s (ns %s, extent %" PRIu64 "+%" PRIu64
			"): %s\n",
			hex, ns ? ns->rec.name : "?", x->r.ssd_off,
			x->r.ssd_len, what);
}

static void bad_block(struct fsck *f, struct frec *x, const char *why)
{
	char msg[160];

	x->bad = true;
	f->rep.bad++;
	snprintf(msg, sizeof(msg), "%s: %s", why,
		 f->flags & KVFS_FSCK_REPAIR ? "record dropped" :
					       "cannot be served");
	say_block(f, x, msg);
}

/* The chunk CRC table of a block that verified, against its image. */
static void check_ccrc(struct fsck *f, struct kvfs_meta_txn *t, struct frec *x,
		       const struct fns *ns, uint32_t kv_from, const void *img)
{
	size_t n = kvfs_fmt_chunk_ncrcs(&ns->g, x->r.n_tokens);
	uint32_t *have, *want;
	int rc;

	if (!n)
		return;
	have = malloc(n * sizeof(*have));
	want = malloc(n * sizeof(*want));
	if (!have || !want) {
		free(have);
		free(want);
		return;
	}
	rc = kvfs_meta_ccrc_get(t, x->key, have, n);
	if (rc == -ENOENT) {
		x->ccrc = CCRC_NONE;
	} else if (rc) {
		x->ccrc = CCRC_BAD;
	} else {
		kvfs_fmt_chunk_crcs(&ns->g, x->r.n_tokens, kv_from, img, want);
		x->ccrc = memcmp(have, want, n * sizeof(*have)) ? CCRC_BAD :
								  CCRC_OK;
	}
	if (x->ccrc == CCRC_BAD) {
		f->rep.ccrc_bad++;
		say_block(f, x,
			  f->flags & KVFS_FSCK_REPAIR ?
				  "chunk CRC table damaged or wrong: dropped "
				  "(the block verifies and stays)" :
				  "chunk CRC table damaged or wrong");
	}
	free(have);
	free(want);
}

static void check_record(struct fsck *f, struct kvfs_meta_txn *t,
			 struct frec *x)
{
	const struct kvfs_meta_sb *sb = &f->s->sb;
	const struct fns *ns;
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err fe;
	char why[128];
	void *buf;
	int rc;

	f->rep.records++;
	if (x->damaged)
		return bad_block(f, x, "record damaged or of another version");
	if (!x->r.ssd_off || !x->r.ssd_len)
		return bad_block(f, x, "record without data (no extent)");
	if (x->r.ssd_off % KVFS_FMT_ALIGN || x->r.ssd_len % KVFS_FMT_ALIGN ||
	    x->r.ssd_off < sb->data_off || x->r.ssd_off > sb->ssd_size ||
	    x->r.ssd_len > sb->ssd_size - x->r.ssd_off)
		return bad_block(f, x, "extent outside the data file");
	x->sane = true;
	ns = ns_by_id(f, x->r.ns_id);
	if (!ns)
		return bad_block(f, x, "unknown namespace id");
	if (!x->r.size || x->r.size > x->r.ssd_len)
		return bad_block(f, x, "size exceeds its extent");
	if (posix_memalign(&buf, KVFS_FMT_ALIGN, x->r.ssd_len)) {
		/* Not a finding: the check could not be made. */
		say_block(f, x, "not checked: out of memory");
		f->rep.left++;
		return;
	}
	rc = kvfs_util_read_full(f->fd, buf, x->r.ssd_len,
				 (int64_t)x->r.ssd_off);
	if (rc) {
		snprintf(why, sizeof(why), "extent unreadable (%s)",
			 strerror(-rc));
		bad_block(f, x, why);
		goto out_free;
	}
	fe = kvfs_fmt_validate(buf, x->r.size, &ns->g, x->key, ns->rec.root,
			       KVFS_FMT_ALLOW_HIDDEN | KVFS_FMT_ALLOW_MIXED,
			       &h);
	if (fe != KVFS_FMT_OK) {
		snprintf(why, sizeof(why), "data fails verification (%s)",
			 kvfs_fmt_strerror(fe));
		bad_block(f, x, why);
		goto out_free;
	}
	if (h.hdr_crc != x->r.hdr_crc || h.kind != x->r.kind ||
	    h.n_tokens != x->r.n_tokens) {
		bad_block(f, x,
			  "data fails verification (header does not "
			  "match the record)");
		goto out_free;
	}
	f->rep.good++;
	if (f->flags & KVFS_FSCK_VERBOSE)
		say_block(f, x, "ok");
	check_ccrc(f, t, x, ns, kvfs_fmt_hdr_kv_from(&h), buf);
out_free:
	free(buf);
}

static int cmp_range(const void *a, const void *b)
{
	const struct range *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

static int cmp_idx(const void *a, const void *b, void *arg)
{
	const struct frec *recs = arg;
	const struct frec *x = &recs[*(const size_t *)a];
	const struct frec *y = &recs[*(const size_t *)b];

	return x->r.ssd_off < y->r.ssd_off ? -1 : x->r.ssd_off > y->r.ssd_off;
}

static bool held(const struct fsck *f, const struct frec *x, bool repair)
{
	return x->sane && !(repair && x->bad);
}

/* Indices of the records whose extents count as held, sorted by offset,
 * into *@out (caller frees).
 */
static int held_sorted(struct fsck *f, bool repair, size_t **out, size_t *n)
{
	size_t *idx = malloc((f->n_recs ? f->n_recs : 1) * sizeof(*idx));

	if (!idx)
		return -ENOMEM;
	*n = 0;
	for (size_t i = 0; i < f->n_recs; i++)
		if (held(f, &f->recs[i], repair))
			idx[(*n)++] = i;
	qsort_r(idx, *n, sizeof(*idx), cmp_idx, f->recs);
	*out = idx;
	return 0;
}

/* Two records sharing bytes: the one that fails is already counted; two
 * that both verify cannot be told apart and are left.
 */
static void check_overlaps(struct fsck *f, const size_t *idx, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		struct frec *a = &f->recs[idx[i - 1]], *b = &f->recs[idx[i]];
		char hex[KVFS_KEY_HEX_LEN + 1], msg[128];

		if (a->r.ssd_off + a->r.ssd_len <= b->r.ssd_off)
			continue;
		kvfs_fmt_key_hex(a->key, hex);
		snprintf(msg, sizeof(msg), "extent overlaps block %s's", hex);
		say_block(f, b, msg);
		if (!a->bad && !b->bad) {
			f->rep.overlaps++;
			f->rep.left++;
		}
	}
}

/*
 * The free ranges the held records leave: the complement of their
 * extents in [data_off, ssd_size).  @idx sorted by offset.
 */
static int complement(struct fsck *f, const size_t *idx, size_t n,
		      struct range **out, size_t *nout)
{
	uint64_t pos = f->s->sb.data_off, end = f->s->sb.ssd_size;
	struct range *r = malloc((n + 1) * sizeof(*r));

	if (!r)
		return -ENOMEM;
	*nout = 0;
	for (size_t i = 0; i < n; i++) {
		const struct kvfs_meta_blk *b = &f->recs[idx[i]].r;

		if (b->ssd_off > pos)
			r[(*nout)++] = (struct range){ pos, b->ssd_off - pos };
		if (b->ssd_off + b->ssd_len > pos)
			pos = b->ssd_off + b->ssd_len;
	}
	if (pos < end)
		r[(*nout)++] = (struct range){ pos, end - pos };
	*out = r;
	return 0;
}

/* The map's own shape: inside the data file, aligned, sorted, merged. */
static void check_free_shape(struct fsck *f)
{
	const struct kvfs_meta_sb *sb = &f->s->sb;
	uint64_t prev_end = 0;

	for (size_t i = 0; i < f->n_free; i++) {
		const struct range *r = &f->free[i];
		const char *why = NULL;

		if (!r->len || r->off % KVFS_FMT_ALIGN ||
		    r->len % KVFS_FMT_ALIGN)
			why = "misaligned or empty";
		else if (r->off < sb->data_off || r->off > sb->ssd_size ||
			 r->len > sb->ssd_size - r->off)
			why = "outside the data file";
		else if (i && r->off < prev_end)
			why = "overlaps the previous entry";
		else if (i && r->off == prev_end)
			why = "not merged with the previous entry";
		if (r->off + r->len > prev_end)
			prev_end = r->off + r->len;
		if (!why)
			continue;
		f->rep.free_errors++;
		fprintf(f->out, "free map: entry %" PRIu64 "+%" PRIu64 " %s\n",
			r->off, r->len, why);
	}
}

/* The free map, clipped to the data file and merged, as ranges. */
static size_t free_norm(struct fsck *f, struct range *out)
{
	const struct kvfs_meta_sb *sb = &f->s->sb;
	size_t n = 0;

	for (size_t i = 0; i < f->n_free; i++) {
		uint64_t a = f->free[i].off, b = a + f->free[i].len;

		if (b < a)
			b = UINT64_MAX;
		a = a < sb->data_off ? sb->data_off : a;
		b = b > sb->ssd_size ? sb->ssd_size : b;
		if (a >= b)
			continue;
		if (n && a <= out[n - 1].off + out[n - 1].len) {
			if (b > out[n - 1].off + out[n - 1].len)
				out[n - 1].len = b - out[n - 1].off;
			continue;
		}
		out[n++] = (struct range){ a, b - a };
	}
	return n;
}

/*
 * Accounting against the records (@idx: held records by offset): bytes
 * the map calls free that a record holds, and bytes neither free nor
 * held (orphans).
 */
static void check_free_use(struct fsck *f, const size_t *idx, size_t n,
			   const struct range *want, size_t n_want)
{
	struct range *fr = malloc((f->n_free ? f->n_free : 1) * sizeof(*fr));
	size_t n_fr, j = 0;

	if (!fr) {
		f->rep.left++;
		return;
	}
	n_fr = free_norm(f, fr);
	for (size_t i = 0; i < n; i++) {
		struct frec *x = &f->recs[idx[i]];
		uint64_t a = x->r.ssd_off, b = a + x->r.ssd_len;

		while (j < n_fr && fr[j].off + fr[j].len <= a)
			j++;
		if (j < n_fr && fr[j].off < b) {
			f->rep.free_errors++;
			say_block(f, x, "the free map calls its extent free");
		}
	}
	/* Orphans: wanted free, but not free in the map. */
	j = 0;
	for (size_t i = 0; i < n_want; i++) {
		uint64_t pos = want[i].off, end = want[i].off + want[i].len;

		while (pos < end) {
			while (j < n_fr && fr[j].off + fr[j].len <= pos)
				j++;
			uint64_t stop =
				j < n_fr && fr[j].off < end ? fr[j].off : end;

			if (stop > pos) {
				f->rep.orphans++;
				f->rep.orphan_bytes += stop - pos;
				fprintf(f->out,
					"orphan: %" PRIu64 "+%" PRIu64
					" is allocated but no record points "
					"to it%s\n",
					pos, stop - pos,
					f->flags & KVFS_FSCK_REPAIR ?
						": freed" :
						"");
			}
			if (j >= n_fr || fr[j].off >= end)
				break;
			pos = fr[j].off + fr[j].len;
		}
	}
	free(fr);
}

/* Side records whose block record does not exist: one line per key and
 * kind.  Only a block's deletion removes them, so without a block they
 * stay for good.
 */
static void check_side(struct fsck *f)
{
	const char *fix = f->flags & KVFS_FSCK_REPAIR ? ": dropped" : "";
	char hex[KVFS_KEY_HEX_LEN + 1];

	for (size_t i = 0; i < f->n_ccrc_orph; i++) {
		kvfs_fmt_key_hex(f->ccrc_orph[i].key, hex);
		fprintf(f->out,
			"block %s: orphan chunk CRC table (no block "
			"record)%s\n",
			hex, fix);
	}
	for (size_t i = 0; i < f->n_score_orph; i++) {
		kvfs_fmt_key_hex(f->score_orph[i].key, hex);
		fprintf(f->out,
			"block %s: orphan chunk scores, %" PRIu32
			" entries (no block record)%s\n",
			hex, f->score_orph[i].n, fix);
		f->rep.score_orphan_records += f->score_orph[i].n;
	}
	f->rep.ccrc_orphans = f->n_ccrc_orph;
	f->rep.score_orphans = f->n_score_orph;
}

/* One transaction: drop bad records and tables and orphan side records,
 * rewrite the free map.
 */
static int repair(struct fsck *f, const struct range *want, size_t n_want,
		  bool rewrite_free)
{
	struct kvfs_meta_txn *t;
	int rc;

	rc = kvfs_meta_txn_begin(f->s->meta, false, &t);
	if (rc)
		return rc;
	for (size_t i = 0; i < f->n_recs && !rc; i++) {
		struct frec *x = &f->recs[i];

		if (x->bad) {
			rc = kvfs_meta_blk_del(t, x->key);
			if (!rc)
				rc = kvfs_meta_ccrc_del(t, x->key);
			if (!rc)
				rc = kvfs_meta_score_del_block(t, x->key);
		} else if (x->ccrc == CCRC_BAD) {
			rc = kvfs_meta_ccrc_del(t, x->key);
		}
	}
	for (size_t i = 0; i < f->n_ccrc_orph && !rc; i++)
		rc = kvfs_meta_ccrc_del(t, f->ccrc_orph[i].key);
	for (size_t i = 0; i < f->n_score_orph && !rc; i++)
		rc = kvfs_meta_score_del_block(t, f->score_orph[i].key);
	if (!rc && rewrite_free) {
		rc = kvfs_meta_free_clear(t);
		for (size_t i = 0; i < n_want && !rc; i++)
			rc = kvfs_meta_free_give(t, want[i].off, want[i].len);
	}
	if (rc) {
		kvfs_meta_txn_abort(t);
		return rc;
	}
	return kvfs_meta_txn_commit(t);
}

static int load(struct fsck *f)
{
	struct kvfs_meta_txn *t;
	int rc;

	rc = kvfs_meta_txn_begin(f->s->meta, true, &t);
	if (rc)
		return rc;
	rc = kvfs_meta_ns_foreach(t, ns_cb, f);
	if (!rc)
		rc = kvfs_meta_blk_foreach(t, blk_cb, f);
	if (!rc)
		rc = kvfs_meta_free_foreach(t, free_cb, f);
	/* In the same transaction as the records they are judged against. */
	if (!rc)
		rc = kvfs_meta_ccrc_foreach(t, ccrc_cb, f);
	if (!rc)
		rc = kvfs_meta_score_foreach(t, score_cb, f);
	for (size_t i = 0; i < f->n_recs && !rc; i++)
		check_record(f, t, &f->recs[i]);
	kvfs_meta_txn_abort(t);
	if (!rc)
		qsort(f->free, f->n_free, sizeof(*f->free), cmp_range);
	return rc;
}

static int run(struct fsck *f)
{
	bool rep_mode = f->flags & KVFS_FSCK_REPAIR;
	struct range *want = NULL, *want_all = NULL;
	size_t *idx = NULL, *idx_all = NULL, n, n_all, n_want, n_want_all;
	uint64_t errs;
	int rc;

	rc = load(f);
	if (rc)
		return rc;
	/* Overlaps and accounting are judged on what the records hold now;
	 * a repair writes the map the kept records leave.
	 */
	rc = held_sorted(f, false, &idx_all, &n_all);
	if (!rc)
		rc = complement(f, idx_all, n_all, &want_all, &n_want_all);
	if (!rc)
		rc = held_sorted(f, true, &idx, &n);
	if (!rc)
		rc = complement(f, idx, n, &want, &n_want);
	if (rc)
		goto out_free;
	check_overlaps(f, idx_all, n_all);
	check_free_shape(f);
	check_free_use(f, idx_all, n_all, want_all, n_want_all);
	check_side(f);
	errs = f->rep.bad + f->rep.ccrc_bad + f->rep.free_errors +
	       f->rep.orphans + f->rep.ccrc_orphans + f->rep.score_orphans;
	if (rep_mode && errs) {
		rc = repair(f, want, n_want,
			    f->rep.bad || f->rep.free_errors || f->rep.orphans);
		if (rc) {
			kvfs_err("fsck: repair failed: %s", strerror(-rc));
			goto out_free;
		}
		f->rep.repaired = errs;
	} else {
		f->rep.left += errs;
	}
out_free:
	free(idx);
	free(idx_all);
	free(want);
	free(want_all);
	return rc;
}

int kvfs_fsck_run(const char *dir, unsigned flags, FILE *out,
		  struct kvfs_fsck_report *rep)
{
	struct fsck f = { .flags = flags, .out = out, .fd = -1 };
	int rc;

	rc = kvfs_store_open(dir, 0, 0, &f.s);
	if (rc)
		return rc;
	f.fd = open(f.s->data_path, O_RDONLY | O_CLOEXEC);
	if (f.fd < 0) {
		rc = -errno;
		kvfs_err("fsck: %s: %s", f.s->data_path, strerror(-rc));
		goto out_store;
	}
	rc = run(&f);
	close(f.fd);
out_store:
	kvfs_store_free(f.s);
	free(f.ns);
	free(f.recs);
	free(f.free);
	free(f.ccrc_orph);
	free(f.score_orph);
	if (rep)
		*rep = f.rep;
	if (rc)
		return rc;
	if (f.rep.left)
		return KVFS_FSCK_ERRORS_LEFT;
	return f.rep.repaired ? KVFS_FSCK_REPAIRED : KVFS_FSCK_CLEAN;
}
