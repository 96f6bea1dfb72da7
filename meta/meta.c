/* SPDX-License-Identifier: MIT */
/*
 * kvfs metadata over LMDB (contracts in meta/meta.h).
 *
 * Records are fixed-size native structs.  Every get checks the size, the
 * magic and the version so that a record of another format is reported
 * (-EUCLEAN / -EPROTO, logged), never misread.  Puts stamp the magic and the
 * version themselves, so a caller cannot write a record that its own get
 * would reject.
 *
 * The free map is keyed by the extent offset as a big-endian u64: LMDB
 * compares keys as byte strings, so big-endian keys sort numerically and a
 * cursor walk is an offset-ordered walk.  Lengths are u64 little-endian.
 *
 * KVFS_META_MEMORY puts the environment in a fresh mkdtemp() directory under
 * /dev/shm (tmpfs) and unlinks its files and the directory right after
 * mdb_env_open(): LMDB keeps using its open descriptors and mapping, and the
 * storage disappears when the environment is closed or the process dies.
 */
#include <errno.h>
#include <endian.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lmdb.h>

#include "meta/log.h"
#include "meta/meta.h"

#define META_DEFAULT_MAPSIZE (1ull << 30)
#define META_MAXDBS 8
/* Each open transaction (FUSE workers, the writer, the flusher) takes one
 * reader slot; MDB_NOTLS ties slots to transactions, not threads.
 */
#define META_MAXREADERS 256

struct kvfs_meta {
	MDB_env *env;
	/* Set once in kvfs_meta_open(), read-only afterwards. */
	MDB_dbi dbi_sb;
	MDB_dbi dbi_ns;
	MDB_dbi dbi_blk;
	MDB_dbi dbi_free;
	MDB_dbi dbi_score;
	MDB_dbi dbi_ccrc;
	unsigned flags;
};

struct kvfs_meta_txn {
	MDB_txn *txn;
	struct kvfs_meta *m;
	bool rdonly;
};

int kvfs_meta_errno(int rc)
{
	switch (rc) {
	case MDB_SUCCESS:
		return 0;
	/* Expected outcomes callers test for: not logged. */
	case MDB_NOTFOUND:
		return -ENOENT;
	case MDB_KEYEXIST:
		return -EEXIST;
	case MDB_MAP_FULL:
	case MDB_TXN_FULL:
		kvfs_warn("meta: %s (raise [daemon] meta_mapsize)",
			  mdb_strerror(rc));
		return -ENOSPC;
	case MDB_CORRUPTED:
	case MDB_PAGE_NOTFOUND:
	case MDB_INVALID:
		kvfs_err("meta: environment damaged: %s", mdb_strerror(rc));
		return -EUCLEAN;
	case MDB_VERSION_MISMATCH:
		kvfs_err("meta: %s", mdb_strerror(rc));
		return -EPROTO;
	case MDB_READERS_FULL:
		kvfs_warn("meta: %s", mdb_strerror(rc));
		return -EAGAIN;
	default:
		break;
	}
	if (rc > 0) {
		kvfs_err("meta: %s", strerror(rc));
		return -rc;
	}
	kvfs_err("meta: unexpected LMDB error %d: %s", rc, mdb_strerror(rc));
	return -EIO;
}

/* A printable description of a key for log lines: text if it is all
 * printable, else hex (truncated).
 */
static const char *key_desc(const void *data, size_t len, char *buf,
			    size_t blen)
{
	const unsigned char *p = data;
	bool text = len > 0;
	size_t i, o = 0;

	for (i = 0; i < len; i++)
		if (p[i] < 0x20 || p[i] > 0x7e)
			text = false;
	if (text) {
		snprintf(buf, blen, "'%.*s'", (int)(len > 64 ? 64 : len),
			 (const char *)data);
		return buf;
	}
	for (i = 0; i < len && o + 3 <= blen; i++)
		o += (size_t)snprintf(buf + o, blen - o, "%02x", p[i]);
	if (o == 0 && blen)
		buf[0] = '\0';
	return buf;
}

/*
 * Check a raw value against the expected record.  The version is judged
 * before the size: a record of another format version may well have another
 * size, and "other version" is the more useful diagnosis.
 * Returns 0, -EUCLEAN or -EPROTO; *version receives the stored version
 * when it could be read.
 */
static int rec_check(const MDB_val *v, size_t size, uint32_t magic,
		     unsigned *version)
{
	uint32_t m;
	uint16_t ver;

	*version = 0;
	if (v->mv_size < sizeof(m) + sizeof(ver))
		return -EUCLEAN;
	memcpy(&m, v->mv_data, sizeof(m));
	memcpy(&ver, (const char *)v->mv_data + sizeof(m), sizeof(ver));
	if (m != magic)
		return -EUCLEAN;
	*version = ver;
	if (ver != KVFS_META_VERSION)
		return -EPROTO;
	if (v->mv_size != size)
		return -EUCLEAN;
	return 0;
}

static void rec_log(int rc, const char *db, const MDB_val *k,
		    const MDB_val *v, size_t size, unsigned version)
{
	char kb[80];

	key_desc(k->mv_data, k->mv_size, kb, sizeof(kb));
	if (rc == -EPROTO)
		kvfs_err("meta: %s record %s: format version %u, this kvfs reads %u",
			 db, kb, version, KVFS_META_VERSION);
	else if (v->mv_size != size &&
		 (version == KVFS_META_VERSION || v->mv_size < 6))
		kvfs_err("meta: %s record %s: %zu bytes, expected %zu", db,
			 kb, v->mv_size, size);
	else
		kvfs_err("meta: %s record %s: bad magic", db, kb);
}

/*
 * Fetch and validate one record.  On -EPROTO the leading bytes of the raw
 * record are copied into @out as well, so a caller can name the version it
 * found.
 */
static int rec_get(struct kvfs_meta_txn *t, MDB_dbi dbi, const char *db,
		   MDB_val *k, void *out, size_t size, uint32_t magic)
{
	MDB_val v;
	unsigned version;
	int rc;

	rc = mdb_get(t->txn, dbi, k, &v);
	if (rc)
		return kvfs_meta_errno(rc);
	rc = rec_check(&v, size, magic, &version);
	if (rc) {
		rec_log(rc, db, k, &v, size, version);
		if (rc == -EPROTO)
			memcpy(out, v.mv_data,
			       v.mv_size < size ? v.mv_size : size);
		return rc;
	}
	memcpy(out, v.mv_data, size);
	return 0;
}

static int rec_put(struct kvfs_meta_txn *t, MDB_dbi dbi, MDB_val *k,
		   void *rec, size_t size, uint32_t magic)
{
	uint16_t ver = KVFS_META_VERSION;
	MDB_val v = { .mv_size = size, .mv_data = rec };

	if (t->rdonly) {
		kvfs_err("meta: put in a read-only transaction");
		return -EBADF;
	}
	memcpy(rec, &magic, sizeof(magic));
	memcpy((char *)rec + sizeof(magic), &ver, sizeof(ver));
	return kvfs_meta_errno(mdb_put(t->txn, dbi, k, &v, 0));
}

static int path_join(char *buf, size_t len, const char *dir, const char *name)
{
	int n = snprintf(buf, len, "%s/%s", dir, name);

	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

/* Remove the files LMDB created in a memory environment's directory. */
static void memdir_remove(const char *dir)
{
	char p[PATH_MAX];

	if (!path_join(p, sizeof(p), dir, "data.mdb"))
		unlink(p);
	if (!path_join(p, sizeof(p), dir, "lock.mdb"))
		unlink(p);
	if (rmdir(dir))
		kvfs_warn("meta: cannot remove %s: %s", dir, strerror(errno));
}

/* /dev/shm is tmpfs on every Linux we run on; /tmp is the fallback for
 * containers without it.
 */
static int memdir_make(char *buf, size_t len)
{
	static const char *const bases[] = { "/dev/shm", "/tmp" };
	int rc = -ENOENT;

	for (size_t i = 0; i < 2; i++) {
		if (path_join(buf, len, bases[i], "kvfs-meta-XXXXXX"))
			return -ENAMETOOLONG;
		if (mkdtemp(buf))
			return 0;
		rc = -errno;
		kvfs_warn("meta: memory environment: mkdtemp under %s: %s",
			  bases[i], strerror(-rc));
	}
	return rc;
}

/* With KVFS_META_CREATE, make @dir if needed and refuse one that already
 * holds an environment.  Without it, require the environment.
 */
static int dir_prepare(const char *dir, unsigned flags)
{
	char p[PATH_MAX];
	struct stat st;
	int rc;

	rc = path_join(p, sizeof(p), dir, "data.mdb");
	if (rc) {
		kvfs_err("meta: %s: path too long", dir);
		return rc;
	}
	if (flags & KVFS_META_CREATE) {
		if (mkdir(dir, 0755) && errno != EEXIST) {
			rc = -errno;
			kvfs_err("meta: cannot create %s: %s", dir,
				 strerror(errno));
			return rc;
		}
		if (stat(p, &st) == 0) {
			kvfs_err("meta: %s already holds an environment", dir);
			return -EEXIST;
		}
		return 0;
	}
	if (stat(p, &st)) {
		rc = -errno;
		if (rc == -ENOENT)
			kvfs_err("meta: no metadata environment in %s", dir);
		else
			kvfs_err("meta: %s: %s", p, strerror(errno));
		return rc;
	}
	return 0;
}

/*
 * Open every named database in one write transaction.  Without CREATE the
 * four databases of format 1 must exist; "score" and "ccrc" are created on
 * demand, so a store made before they existed opens (its blocks simply
 * have no chunk CRCs or scores yet).
 */
static int dbis_open(struct kvfs_meta *m, const char *dir, unsigned flags)
{
	static const char *const names[] = { "sb", "ns", "blk", "free",
					     "score", "ccrc" };
	MDB_dbi *dbis[] = { &m->dbi_sb, &m->dbi_ns, &m->dbi_blk,
			    &m->dbi_free, &m->dbi_score, &m->dbi_ccrc };
	unsigned cflag = (flags & (KVFS_META_CREATE | KVFS_META_MEMORY)) ?
				 MDB_CREATE :
				 0;
	MDB_txn *txn;
	int rc;

	rc = mdb_txn_begin(m->env, NULL, 0, &txn);
	if (rc)
		return kvfs_meta_errno(rc);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		unsigned f = i >= 4 ? MDB_CREATE : cflag;

		rc = mdb_dbi_open(txn, names[i], f, dbis[i]);
		if (rc == MDB_NOTFOUND) {
			kvfs_err("meta: %s is not a kvfs metadata environment (no '%s' database)",
				 dir, names[i]);
			mdb_txn_abort(txn);
			return -EUCLEAN;
		}
		if (rc) {
			mdb_txn_abort(txn);
			return kvfs_meta_errno(rc);
		}
	}
	return kvfs_meta_errno(mdb_txn_commit(txn));
}

int kvfs_meta_open(const char *dir, uint64_t mapsize, unsigned flags,
		   struct kvfs_meta **out)
{
	char memdir[PATH_MAX];
	struct kvfs_meta *m;
	unsigned eflags = MDB_NOTLS;
	bool memory = flags & KVFS_META_MEMORY;
	int rc;

	*out = NULL;
	if (flags & ~(unsigned)(KVFS_META_CREATE | KVFS_META_MEMORY |
				KVFS_META_NOSYNC)) {
		kvfs_err("meta: unknown open flags %#x", flags);
		return -EINVAL;
	}
	if (!memory && (!dir || !*dir)) {
		kvfs_err("meta: no environment directory given");
		return -EINVAL;
	}
	if (flags & KVFS_META_NOSYNC)
		eflags |= MDB_NOSYNC;
	if (!mapsize)
		mapsize = META_DEFAULT_MAPSIZE;

	if (memory) {
		rc = memdir_make(memdir, sizeof(memdir));
		if (rc)
			return rc;
		dir = memdir;
	} else {
		rc = dir_prepare(dir, flags);
		if (rc)
			return rc;
	}

	m = calloc(1, sizeof(*m));
	if (!m) {
		rc = -ENOMEM;
		goto out_memdir;
	}
	m->flags = flags;
	rc = mdb_env_create(&m->env);
	if (rc) {
		rc = kvfs_meta_errno(rc);
		goto out_free;
	}
	rc = mdb_env_set_maxdbs(m->env, META_MAXDBS);
	if (!rc)
		rc = mdb_env_set_maxreaders(m->env, META_MAXREADERS);
	if (!rc)
		rc = mdb_env_set_mapsize(m->env, (size_t)mapsize);
	if (rc) {
		rc = kvfs_meta_errno(rc);
		goto out_env;
	}
	rc = mdb_env_open(m->env, dir, eflags, 0640);
	if (memory) {
		/* Open descriptors keep the files alive from here on. */
		memdir_remove(memdir);
		memory = false;
	}
	if (rc) {
		kvfs_err("meta: cannot open environment %s: %s",
			 (flags & KVFS_META_MEMORY) ? "(memory)" : dir,
			 mdb_strerror(rc));
		rc = kvfs_meta_errno(rc);
		goto out_env;
	}
	rc = dbis_open(m, dir, flags);
	if (rc)
		goto out_env;
	*out = m;
	return 0;

out_env:
	mdb_env_close(m->env);
out_free:
	free(m);
out_memdir:
	if (memory)
		memdir_remove(memdir);
	return rc;
}

void kvfs_meta_free(struct kvfs_meta *m)
{
	if (!m)
		return;
	mdb_env_close(m->env);
	free(m);
}

int kvfs_meta_txn_begin(struct kvfs_meta *m, bool rdonly,
			struct kvfs_meta_txn **out)
{
	struct kvfs_meta_txn *t;
	int rc;

	*out = NULL;
	t = malloc(sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->m = m;
	t->rdonly = rdonly;
	rc = mdb_txn_begin(m->env, NULL, rdonly ? MDB_RDONLY : 0, &t->txn);
	if (rc) {
		free(t);
		return kvfs_meta_errno(rc);
	}
	*out = t;
	return 0;
}

int kvfs_meta_txn_commit(struct kvfs_meta_txn *t)
{
	/* LMDB frees the transaction whether or not the commit succeeds. */
	int rc = mdb_txn_commit(t->txn);

	free(t);
	return kvfs_meta_errno(rc);
}

void kvfs_meta_txn_abort(struct kvfs_meta_txn *t)
{
	if (!t)
		return;
	mdb_txn_abort(t->txn);
	free(t);
}

/* ---- superblock ---- */

static MDB_val sb_key(void)
{
	return (MDB_val){ .mv_size = 2, .mv_data = (void *)"sb" };
}

int kvfs_meta_sb_get(struct kvfs_meta_txn *t, struct kvfs_meta_sb *sb)
{
	MDB_val k = sb_key();

	return rec_get(t, t->m->dbi_sb, "sb", &k, sb, sizeof(*sb),
		       KVFS_META_SB_MAGIC);
}

int kvfs_meta_sb_put(struct kvfs_meta_txn *t, const struct kvfs_meta_sb *sb)
{
	struct kvfs_meta_sb rec = *sb;
	MDB_val k = sb_key();

	return rec_put(t, t->m->dbi_sb, &k, &rec, sizeof(rec),
		       KVFS_META_SB_MAGIC);
}

/* ---- namespaces ---- */

/* The stored name must be terminated and equal to the key it sits under. */
static int ns_name_matches(const struct kvfs_meta_ns *ns, const MDB_val *k)
{
	size_t n = strnlen(ns->name, sizeof(ns->name));

	if (n == sizeof(ns->name) || n != k->mv_size ||
	    memcmp(ns->name, k->mv_data, n))
		return -EUCLEAN;
	return 0;
}

int kvfs_meta_ns_get(struct kvfs_meta_txn *t, const char *name,
		     struct kvfs_meta_ns *ns)
{
	size_t n = name ? strnlen(name, KVFS_NS_NAME_MAX) : 0;
	MDB_val k = { .mv_size = n, .mv_data = (void *)name };
	int rc;

	/* Such a name can never have been stored. */
	if (n == 0 || n == KVFS_NS_NAME_MAX)
		return -ENOENT;
	rc = rec_get(t, t->m->dbi_ns, "ns", &k, ns, sizeof(*ns),
		     KVFS_META_NS_MAGIC);
	if (rc)
		return rc;
	if (ns_name_matches(ns, &k)) {
		kvfs_err("meta: ns record '%s' holds another name", name);
		return -EUCLEAN;
	}
	return 0;
}

int kvfs_meta_ns_put(struct kvfs_meta_txn *t, const struct kvfs_meta_ns *ns)
{
	struct kvfs_meta_ns rec = *ns;
	size_t n = strnlen(rec.name, sizeof(rec.name));
	MDB_val k = { .mv_size = n, .mv_data = rec.name };

	if (n == 0 || n == sizeof(rec.name)) {
		kvfs_err("meta: namespace name empty or not terminated");
		return -EINVAL;
	}
	/* Zero whatever follows the name so records compare bytewise. */
	memset(rec.name + n, 0, sizeof(rec.name) - n);
	return rec_put(t, t->m->dbi_ns, &k, &rec, sizeof(rec),
		       KVFS_META_NS_MAGIC);
}

/*
 * Step a cursor after a callback ran.  In a write transaction the callback
 * may have changed the database (deleting the current record is the common
 * case), so the cursor is re-seeked from @key, a copy of the current key
 * that the callback could not disturb, instead of trusting its position.
 */
static int cursor_next(struct kvfs_meta_txn *t, MDB_cursor *c,
		       const void *key, size_t klen, MDB_val *k, MDB_val *v)
{
	int rc;

	if (t->rdonly)
		return mdb_cursor_get(c, k, v, MDB_NEXT);
	k->mv_data = (void *)key;
	k->mv_size = klen;
	rc = mdb_cursor_get(c, k, v, MDB_SET_RANGE);
	if (rc)
		return rc;
	if (k->mv_size == klen && !memcmp(k->mv_data, key, klen))
		return mdb_cursor_get(c, k, v, MDB_NEXT);
	return 0;
}

int kvfs_meta_ns_foreach(struct kvfs_meta_txn *t,
			 int (*fn)(const struct kvfs_meta_ns *ns, void *arg),
			 void *arg)
{
	struct kvfs_meta_ns ns;
	MDB_cursor *c;
	MDB_val k, v;
	unsigned version;
	int rc, mrc;

	mrc = mdb_cursor_open(t->txn, t->m->dbi_ns, &c);
	if (mrc)
		return kvfs_meta_errno(mrc);
	mrc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (mrc == 0) {
		rc = rec_check(&v, sizeof(ns), KVFS_META_NS_MAGIC, &version);
		if (rc) {
			rec_log(rc, "ns", &k, &v, sizeof(ns), version);
			goto out_close;
		}
		memcpy(&ns, v.mv_data, sizeof(ns));
		if (ns_name_matches(&ns, &k)) {
			char kb[80];

			kvfs_err("meta: ns record %s holds another name",
				 key_desc(k.mv_data, k.mv_size, kb,
					  sizeof(kb)));
			rc = -EUCLEAN;
			goto out_close;
		}
		rc = fn(&ns, arg);
		if (rc)
			goto out_close;
		/* The key equals ns.name, a copy that @fn cannot disturb. */
		mrc = cursor_next(t, c, ns.name, strlen(ns.name), &k, &v);
	}
	rc = mrc == MDB_NOTFOUND ? 0 : kvfs_meta_errno(mrc);
out_close:
	mdb_cursor_close(c);
	return rc;
}

/* ---- block records ---- */

static MDB_val blk_key(const uint8_t key[KVFS_KEY_LEN])
{
	return (MDB_val){ .mv_size = KVFS_KEY_LEN, .mv_data = (void *)key };
}

int kvfs_meta_blk_get(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		      struct kvfs_meta_blk *rec)
{
	MDB_val k = blk_key(key);

	return rec_get(t, t->m->dbi_blk, "blk", &k, rec, sizeof(*rec),
		       KVFS_META_BLK_MAGIC);
}

int kvfs_meta_blk_put(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		      const struct kvfs_meta_blk *rec)
{
	struct kvfs_meta_blk r = *rec;
	MDB_val k = blk_key(key);

	return rec_put(t, t->m->dbi_blk, &k, &r, sizeof(r),
		       KVFS_META_BLK_MAGIC);
}

int kvfs_meta_blk_del(struct kvfs_meta_txn *t,
		      const uint8_t key[KVFS_KEY_LEN])
{
	MDB_val k = blk_key(key);

	if (t->rdonly) {
		kvfs_err("meta: delete in a read-only transaction");
		return -EBADF;
	}
	return kvfs_meta_errno(mdb_del(t->txn, t->m->dbi_blk, &k, NULL));
}

/*
 * Walk the entries of @dbi, whose keys are block keys, in key order: @fn
 * gets a copy of each key (it may change the database under the cursor)
 * and its value.  An entry whose key is not 16 bytes has no key to hand
 * on: it is logged, naming @what, and skipped.  0, @fn's first nonzero
 * return, or an LMDB error as -errno.
 */
static int key_walk(struct kvfs_meta_txn *t, MDB_dbi dbi, const char *what,
		    int (*fn)(const uint8_t *key, const MDB_val *v,
			      void *arg),
		    void *arg)
{
	uint8_t key[KVFS_KEY_LEN];
	MDB_cursor *c;
	MDB_val k, v;
	int rc = 0, mrc;

	mrc = mdb_cursor_open(t->txn, dbi, &c);
	if (mrc)
		return kvfs_meta_errno(mrc);
	mrc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (mrc == 0) {
		if (k.mv_size != KVFS_KEY_LEN) {
			char kb[80];

			kvfs_err("meta: %s entry with a %zu-byte key %s skipped",
				 what, k.mv_size,
				 key_desc(k.mv_data, k.mv_size, kb,
					  sizeof(kb)));
			mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
			continue;
		}
		memcpy(key, k.mv_data, sizeof(key));
		rc = fn(key, &v, arg);
		if (rc)
			goto out_close;
		mrc = cursor_next(t, c, key, sizeof(key), &k, &v);
	}
	rc = mrc == MDB_NOTFOUND ? 0 : kvfs_meta_errno(mrc);
out_close:
	mdb_cursor_close(c);
	return rc;
}

struct blk_walk {
	int (*fn)(const uint8_t *key, const struct kvfs_meta_blk *rec,
		  bool bad, void *arg);
	void *arg;
};

static int blk_walk_one(const uint8_t *key, const MDB_val *v, void *arg)
{
	struct blk_walk *w = arg;
	struct kvfs_meta_blk rec;
	unsigned version;
	bool bad;

	/* A copy too: the value goes with the cursor. */
	bad = rec_check(v, sizeof(rec), KVFS_META_BLK_MAGIC, &version) != 0;
	memset(&rec, 0, sizeof(rec));
	memcpy(&rec, v->mv_data,
	       v->mv_size < sizeof(rec) ? v->mv_size : sizeof(rec));
	return w->fn(key, &rec, bad, w->arg);
}

int kvfs_meta_blk_foreach(struct kvfs_meta_txn *t,
			  int (*fn)(const uint8_t *key,
				    const struct kvfs_meta_blk *rec, bool bad,
				    void *arg),
			  void *arg)
{
	struct blk_walk w = { fn, arg };

	return key_walk(t, t->m->dbi_blk, "blk", blk_walk_one, &w);
}

/* ---- SSD free-extent map ---- */

struct fext {
	uint64_t off;
	uint64_t len;
};

static int fext_decode(const MDB_val *k, const MDB_val *v, struct fext *e)
{
	uint64_t be, le;

	if (k->mv_size != sizeof(be) || v->mv_size != sizeof(le)) {
		kvfs_err("meta: free map entry of %zu/%zu bytes, expected 8/8",
			 k->mv_size, v->mv_size);
		return -EUCLEAN;
	}
	memcpy(&be, k->mv_data, sizeof(be));
	memcpy(&le, v->mv_data, sizeof(le));
	e->off = be64toh(be);
	e->len = le64toh(le);
	if (e->len == 0 || e->off + e->len < e->off) {
		kvfs_err("meta: free map entry [%llu, +%llu) is invalid",
			 (unsigned long long)e->off,
			 (unsigned long long)e->len);
		return -EUCLEAN;
	}
	return 0;
}

static int fext_put(struct kvfs_meta_txn *t, uint64_t off, uint64_t len)
{
	uint64_t be = htobe64(off), le = htole64(len);
	MDB_val k = { .mv_size = sizeof(be), .mv_data = &be };
	MDB_val v = { .mv_size = sizeof(le), .mv_data = &le };

	return kvfs_meta_errno(mdb_put(t->txn, t->m->dbi_free, &k, &v, 0));
}

static int fext_del(struct kvfs_meta_txn *t, uint64_t off)
{
	uint64_t be = htobe64(off);
	MDB_val k = { .mv_size = sizeof(be), .mv_data = &be };

	return kvfs_meta_errno(mdb_del(t->txn, t->m->dbi_free, &k, NULL));
}

/*
 * Find the free entries around @off: *next is the first with offset >= off,
 * *prev the last with offset < off.  has_prev/has_next say which exist.
 */
static int fext_neighbours(struct kvfs_meta_txn *t, uint64_t off,
			   struct fext *prev, bool *has_prev,
			   struct fext *next, bool *has_next)
{
	uint64_t be = htobe64(off);
	MDB_cursor *c;
	MDB_val k = { .mv_size = sizeof(be), .mv_data = &be }, v;
	int rc, mrc;

	*has_prev = *has_next = false;
	mrc = mdb_cursor_open(t->txn, t->m->dbi_free, &c);
	if (mrc)
		return kvfs_meta_errno(mrc);
	mrc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	if (mrc == 0) {
		rc = fext_decode(&k, &v, next);
		if (rc)
			goto out_close;
		*has_next = true;
		mrc = mdb_cursor_get(c, &k, &v, MDB_PREV);
	} else if (mrc == MDB_NOTFOUND) {
		mrc = mdb_cursor_get(c, &k, &v, MDB_LAST);
	}
	if (mrc == 0) {
		rc = fext_decode(&k, &v, prev);
		if (rc)
			goto out_close;
		*has_prev = true;
	} else if (mrc != MDB_NOTFOUND) {
		rc = kvfs_meta_errno(mrc);
		goto out_close;
	}
	rc = 0;
out_close:
	mdb_cursor_close(c);
	return rc;
}

static int frange_ok(struct kvfs_meta_txn *t, const char *op, uint64_t off,
		     uint64_t len)
{
	if (t->rdonly) {
		kvfs_err("meta: free_%s in a read-only transaction", op);
		return -EBADF;
	}
	if (len == 0 || off + len < off) {
		kvfs_err("meta: free_%s of an invalid range [%llu, +%llu)", op,
			 (unsigned long long)off, (unsigned long long)len);
		return -EINVAL;
	}
	return 0;
}

int kvfs_meta_free_give(struct kvfs_meta_txn *t, uint64_t off, uint64_t len)
{
	struct fext prev, next;
	bool has_prev, has_next;
	uint64_t new_off = off, new_len = len;
	int rc;

	rc = frange_ok(t, "give", off, len);
	if (rc)
		return rc;
	rc = fext_neighbours(t, off, &prev, &has_prev, &next, &has_next);
	if (rc)
		return rc;
	if ((has_next && next.off < off + len) ||
	    (has_prev && prev.off + prev.len > off)) {
		const struct fext *o = (has_next && next.off < off + len) ?
					       &next :
					       &prev;

		kvfs_err("meta: free_give [%llu, %llu) overlaps free extent [%llu, %llu)",
			 (unsigned long long)off,
			 (unsigned long long)(off + len),
			 (unsigned long long)o->off,
			 (unsigned long long)(o->off + o->len));
		return -EUCLEAN;
	}
	if (has_prev && prev.off + prev.len == off) {
		new_off = prev.off;
		new_len += prev.len;
	}
	if (has_next && next.off == off + len) {
		rc = fext_del(t, next.off);
		if (rc)
			return rc;
		new_len += next.len;
	}
	/* When merging with prev this overwrites prev's entry in place. */
	return fext_put(t, new_off, new_len);
}

int kvfs_meta_free_take(struct kvfs_meta_txn *t, uint64_t off, uint64_t len)
{
	struct fext prev, next, e;
	bool has_prev, has_next;
	int rc;

	rc = frange_ok(t, "take", off, len);
	if (rc)
		return rc;
	rc = fext_neighbours(t, off, &prev, &has_prev, &next, &has_next);
	if (rc)
		return rc;
	if (has_next && next.off == off)
		e = next;
	else if (has_prev)
		e = prev;
	else
		goto out_bad;
	if (e.off > off || off + len > e.off + e.len)
		goto out_bad;

	if (e.off == off)
		rc = fext_del(t, e.off);
	else
		rc = fext_put(t, e.off, off - e.off);
	if (rc)
		return rc;
	if (off + len < e.off + e.len)
		rc = fext_put(t, off + len, e.off + e.len - (off + len));
	return rc;

out_bad:
	kvfs_err("meta: free_take [%llu, %llu) is not inside one free extent",
		 (unsigned long long)off, (unsigned long long)(off + len));
	return -EUCLEAN;
}

int kvfs_meta_free_foreach(struct kvfs_meta_txn *t,
			   int (*fn)(uint64_t off, uint64_t len, void *arg),
			   void *arg)
{
	struct fext e;
	uint64_t end = 0, kbe;
	bool first = true;
	MDB_cursor *c;
	MDB_val k, v;
	int rc = 0, mrc;

	mrc = mdb_cursor_open(t->txn, t->m->dbi_free, &c);
	if (mrc)
		return kvfs_meta_errno(mrc);
	mrc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (mrc == 0) {
		rc = fext_decode(&k, &v, &e);
		if (rc)
			goto out_close;
		/* Entries touching or overlapping mean the map is not
		 * canonical: something wrote it behind this module's back.
		 */
		if (!first && e.off <= end) {
			kvfs_err("meta: free map not canonical at %llu (previous extent ends at %llu)",
				 (unsigned long long)e.off,
				 (unsigned long long)end);
			rc = -EUCLEAN;
			goto out_close;
		}
		first = false;
		end = e.off + e.len;
		rc = fn(e.off, e.len, arg);
		if (rc)
			goto out_close;
		kbe = htobe64(e.off);
		mrc = cursor_next(t, c, &kbe, sizeof(kbe), &k, &v);
	}
	rc = mrc == MDB_NOTFOUND ? 0 : kvfs_meta_errno(mrc);
out_close:
	mdb_cursor_close(c);
	return rc;
}

int kvfs_meta_free_clear(struct kvfs_meta_txn *t)
{
	if (t->rdonly) {
		kvfs_err("meta: free_clear in a read-only transaction");
		return -EBADF;
	}
	return kvfs_meta_errno(mdb_drop(t->txn, t->m->dbi_free, 0));
}

/* ---- per-chunk CRC tables ---- */

/* Far more than any block has (layers * chunks per block), small enough
 * that the value size cannot overflow.
 */
#define CCRC_MAX (1u << 24)

int kvfs_meta_ccrc_put(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		       const uint32_t *crc, size_t n)
{
	struct kvfs_meta_ccrc h = { .magic = KVFS_META_CCRC_MAGIC,
				    .version = KVFS_META_VERSION };
	MDB_val k = blk_key(key), v;
	int rc;

	if (t->rdonly) {
		kvfs_err("meta: ccrc put in a read-only transaction");
		return -EBADF;
	}
	if (n == 0 || n > CCRC_MAX || !crc) {
		kvfs_err("meta: ccrc put of %zu CRCs refused (1..%u)", n,
			 CCRC_MAX);
		return -EINVAL;
	}
	h.count = (uint32_t)n;
	h.tcrc = kvfs_fmt_crc32c(0, crc, n * sizeof(*crc));
	v.mv_size = sizeof(h) + n * sizeof(*crc);
	/* Reserve the value in place: one copy, no temporary buffer. */
	rc = mdb_put(t->txn, t->m->dbi_ccrc, &k, &v, MDB_RESERVE);
	if (rc)
		return kvfs_meta_errno(rc);
	memcpy(v.mv_data, &h, sizeof(h));
	memcpy((char *)v.mv_data + sizeof(h), crc, n * sizeof(*crc));
	return 0;
}

int kvfs_meta_ccrc_get(struct kvfs_meta_txn *t, const uint8_t key[KVFS_KEY_LEN],
		       uint32_t *crc, size_t n)
{
	struct kvfs_meta_ccrc h;
	MDB_val k = blk_key(key), v;
	char kb[80];
	const char *why;
	int rc;

	rc = mdb_get(t->txn, t->m->dbi_ccrc, &k, &v);
	if (rc)
		return kvfs_meta_errno(rc);
	key_desc(key, KVFS_KEY_LEN, kb, sizeof(kb));
	if (v.mv_size < sizeof(h)) {
		why = "too short";
		goto out_bad;
	}
	memcpy(&h, v.mv_data, sizeof(h));
	if (h.magic != KVFS_META_CCRC_MAGIC) {
		why = "bad magic";
		goto out_bad;
	}
	if (h.version != KVFS_META_VERSION) {
		kvfs_err("meta: ccrc record %s: format version %u, this kvfs "
			 "reads %u", kb, h.version, KVFS_META_VERSION);
		return -EPROTO;
	}
	if (h.count > CCRC_MAX ||
	    v.mv_size != sizeof(h) + (size_t)h.count * sizeof(*crc)) {
		why = "size does not match its count";
		goto out_bad;
	}
	if (h.count != n) {
		kvfs_err("meta: ccrc record %s holds %u CRCs, the block has %zu "
			 "chunks", kb, h.count, n);
		return -EUCLEAN;
	}
	if (kvfs_fmt_crc32c(0, (const char *)v.mv_data + sizeof(h),
			    n * sizeof(*crc)) != h.tcrc) {
		why = "table CRC mismatch";
		goto out_bad;
	}
	memcpy(crc, (const char *)v.mv_data + sizeof(h), n * sizeof(*crc));
	return 0;

out_bad:
	kvfs_err("meta: ccrc record %s: %s", kb, why);
	return -EUCLEAN;
}

int kvfs_meta_ccrc_del(struct kvfs_meta_txn *t,
		       const uint8_t key[KVFS_KEY_LEN])
{
	MDB_val k = blk_key(key);
	int rc;

	if (t->rdonly) {
		kvfs_err("meta: ccrc delete in a read-only transaction");
		return -EBADF;
	}
	rc = mdb_del(t->txn, t->m->dbi_ccrc, &k, NULL);
	return rc == MDB_NOTFOUND ? 0 : kvfs_meta_errno(rc);
}

struct ccrc_walk {
	int (*fn)(const uint8_t *key, void *arg);
	void *arg;
};

static int ccrc_walk_one(const uint8_t *key, const MDB_val *v, void *arg)
{
	struct ccrc_walk *w = arg;

	(void)v;
	return w->fn(key, w->arg);
}

int kvfs_meta_ccrc_foreach(struct kvfs_meta_txn *t,
			   int (*fn)(const uint8_t *key, void *arg), void *arg)
{
	struct ccrc_walk w = { fn, arg };

	return key_walk(t, t->m->dbi_ccrc, "ccrc", ccrc_walk_one, &w);
}

/* ---- chunk scores ---- */

#define SCORE_KEY_LEN (KVFS_KEY_LEN + 4)

static MDB_val score_key(const uint8_t key[KVFS_KEY_LEN], uint32_t chunk,
			 uint8_t buf[SCORE_KEY_LEN])
{
	uint32_t be = htobe32(chunk);

	memcpy(buf, key, KVFS_KEY_LEN);
	memcpy(buf + KVFS_KEY_LEN, &be, sizeof(be));
	return (MDB_val){ .mv_size = SCORE_KEY_LEN, .mv_data = buf };
}

int kvfs_meta_score_put(struct kvfs_meta_txn *t,
			const uint8_t key[KVFS_KEY_LEN], uint32_t chunk,
			double i, uint64_t f)
{
	struct kvfs_meta_score rec = { .i = i, .f = f };
	uint8_t kb[SCORE_KEY_LEN];
	MDB_val k = score_key(key, chunk, kb);

	if (!isfinite(i) || i < 0) {
		kvfs_err("meta: score put with I = %g refused (finite, >= 0)",
			 i);
		return -EINVAL;
	}
	return rec_put(t, t->m->dbi_score, &k, &rec, sizeof(rec),
		       KVFS_META_SCORE_MAGIC);
}

int kvfs_meta_score_get(struct kvfs_meta_txn *t,
			const uint8_t key[KVFS_KEY_LEN], uint32_t chunk,
			double *i, uint64_t *f)
{
	struct kvfs_meta_score rec;
	uint8_t kb[SCORE_KEY_LEN];
	MDB_val k = score_key(key, chunk, kb);
	int rc;

	rc = rec_get(t, t->m->dbi_score, "score", &k, &rec, sizeof(rec),
		     KVFS_META_SCORE_MAGIC);
	if (rc)
		return rc;
	if (!isfinite(rec.i) || rec.i < 0) {
		char d[80];

		kvfs_err("meta: score record %s holds I = %g",
			 key_desc(kb, sizeof(kb), d, sizeof(d)), rec.i);
		return -EUCLEAN;
	}
	*i = rec.i;
	*f = rec.f;
	return 0;
}

int kvfs_meta_score_del_block(struct kvfs_meta_txn *t,
			      const uint8_t key[KVFS_KEY_LEN])
{
	uint8_t kb[SCORE_KEY_LEN];
	MDB_cursor *c;
	MDB_val k, v;
	int mrc;

	if (t->rdonly) {
		kvfs_err("meta: score delete in a read-only transaction");
		return -EBADF;
	}
	mrc = mdb_cursor_open(t->txn, t->m->dbi_score, &c);
	if (mrc)
		return kvfs_meta_errno(mrc);
	/* Seek again after every delete rather than trust where a deletion
	 * leaves the cursor; a block has few chunks.
	 */
	for (;;) {
		k = score_key(key, 0, kb);
		mrc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
		if (mrc)
			break;
		if (k.mv_size < KVFS_KEY_LEN ||
		    memcmp(k.mv_data, key, KVFS_KEY_LEN))
			break;
		mrc = mdb_cursor_del(c, 0);
		if (mrc)
			break;
	}
	mdb_cursor_close(c);
	return mrc == MDB_NOTFOUND || mrc == 0 ? 0 : kvfs_meta_errno(mrc);
}

/* Whether the cursor's entry @k lies under block key @key. */
static bool score_under(const MDB_val *k, const uint8_t *key)
{
	return k->mv_size >= KVFS_KEY_LEN &&
	       !memcmp(k->mv_data, key, KVFS_KEY_LEN);
}

int kvfs_meta_score_foreach(struct kvfs_meta_txn *t,
			    int (*fn)(const uint8_t *key, uint32_t n,
				      void *arg),
			    void *arg)
{
	uint8_t key[KVFS_KEY_LEN];
	MDB_cursor *c;
	MDB_val k, v;
	uint32_t n;
	int rc = 0, mrc;

	mrc = mdb_cursor_open(t->txn, t->m->dbi_score, &c);
	if (mrc)
		return kvfs_meta_errno(mrc);
	mrc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (mrc == 0) {
		if (k.mv_size < KVFS_KEY_LEN) {
			char kb[80];

			kvfs_err("meta: score entry with a %zu-byte key %s skipped",
				 k.mv_size,
				 key_desc(k.mv_data, k.mv_size, kb,
					  sizeof(kb)));
			mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
			continue;
		}
		/* One block's entries are adjacent: count them, leaving the
		 * cursor on the next block's first entry.
		 */
		memcpy(key, k.mv_data, sizeof(key));
		n = 0;
		do {
			if (n < UINT32_MAX)
				n++;
			mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
		} while (mrc == 0 && score_under(&k, key));
		if (mrc && mrc != MDB_NOTFOUND)
			break;
		rc = fn(key, n, arg);
		if (rc)
			goto out_close;
		if (t->rdonly)
			continue;
		/* @fn may have deleted entries: seek again past @key's.  The
		 * bare block key sorts before every entry under it.
		 */
		k.mv_data = key;
		k.mv_size = sizeof(key);
		mrc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
		while (mrc == 0 && score_under(&k, key))
			mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	rc = mrc == MDB_NOTFOUND ? 0 : kvfs_meta_errno(mrc);
out_close:
	mdb_cursor_close(c);
	return rc;
}
