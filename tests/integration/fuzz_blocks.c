/* SPDX-License-Identifier: MIT */
/*
 * The block-file target of the mount fuzzer: good blocks, damaged or not,
 * written under odd names in odd patterns (pieces, holes, truncation, a
 * flush halfway).  A model of what the daemon holds follows every write,
 * so that what close() must answer, and what an accepted block must read
 * back as, is known whatever the pattern was.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/util.h"
#include "fuzz_i.h"

/* A block image and the model's, kept from setup to teardown (fuzz_i.h
 * says why).
 */
static uint8_t *bimg, *bmodel;

void blocks_bufs_alloc(void)
{
	bimg = malloc(max_file + 65536);
	bmodel = malloc(max_file + 65536);
	assert_non_null(bimg);
	assert_non_null(bmodel);
}

void blocks_bufs_free(void)
{
	free(bimg);
	free(bmodel);
}

static void fix_crcs(uint8_t *p, uint64_t len, bool payload)
{
	if (len < KVFS_FMT_HDR_SIZE)
		return;
	if (payload)
		kvfs_util_put32(p + 80, kvfs_fmt_crc32c(0, p + KVFS_FMT_HDR_SIZE,
							len - KVFS_FMT_HDR_SIZE));
	kvfs_util_put32(p + 84, kvfs_fmt_crc32c(0, p, 84));
}

/* A block name, odd or not, for @key. Sets *@len_err when the kernel
 * itself refuses it (too long).
 */
static void pick_name(struct rng *r, const uint8_t key[16], char *name,
		      size_t cap, bool *bad, bool *too_long)
{
	char hex[33];
	unsigned k = below(r, 20);

	kvfs_fmt_key_hex(key, hex);
	*bad = true;
	*too_long = false;
	if (k < 12) {
		snprintf(name, cap, "%s.kv", hex);
		*bad = false;
	} else if (k == 12) {
		for (int i = 0; i < 32; i++)
			hex[i] = (char)(hex[i] >= 'a' ? hex[i] - 32 : hex[i]);
		snprintf(name, cap, "%s.kv", hex);
		*bad = false; /* either case parses */
	} else if (k == 13) {
		snprintf(name, cap, "%s", hex);
	} else if (k == 14) {
		static const char *const sfx[] = {
			".KV", ".kvx", ".kv.tmp", ".k", ".", "kv", ".kv ",
		};
		snprintf(name, cap, "%s%s", hex, sfx[below(r, 7)]);
	} else if (k == 15) {
		snprintf(name, cap, "%.31s.kv", hex);
	} else if (k == 16) {
		snprintf(name, cap, "%s0.kv", hex);
	} else if (k == 17) {
		uint32_t at = below(r, 32);

		hex[at] = "gGz -_\n"[below(r, 7)];
		snprintf(name, cap, "%s.kv", hex);
	} else if (k == 18) {
		/* NAME_MAX is advisory: older kernels stop FUSE names at
		 * 1024 bytes, newer ones pass them on
		 */
		size_t n = (chance(r, 50) ? 250 : 1020) + below(r, 10);

		if (n >= cap)
			n = cap - 1;
		memset(name, 'a', n);
		memcpy(name + n - 3, ".kv", 4);
		*too_long = n > 1024;
	} else {
		size_t n = 1 + below(r, 40);

		for (size_t i = 0; i < n; i++) {
			char c = (char)(1 + below(r, 255));

			name[i] = c == '/' ? 'x' : c;
		}
		name[n] = 0;
		if (!strcmp(name, ".") || !strcmp(name, ".."))
			name[0] = 'y';
	}
}

/* What close() must return for the bytes @img[0..@len) under a name that
 * parses to @name_key.
 */
static int expect_commit(const uint8_t *img, uint64_t len,
			 const uint8_t name_key[16])
{
	struct kvfs_fmt_hdr h;
	enum kvfs_fmt_err e;
	int s;

	e = kvfs_fmt_validate(img, len, &g, name_key, root, 0, &h);
	if (e != KVFS_FMT_OK)
		return -kvfs_fmt_errno(e);
	if (is_root(h.parent))
		return 0;
	s = seed_of(h.parent);
	if (s < 0)
		return 0; /* an orphan: allowed */
	if (seeds[s].h.n_tokens != g.block_tokens ||
	    seeds[s].h.start_pos + g.block_tokens != h.start_pos)
		return EINVAL;
	return 0;
}

struct model {
	uint8_t *b;   /* max_file + 64 KiB, zero past len */
	uint64_t len;
	bool committed;
	int rc;       /* the commit's result once committed */
};

static void model_write(struct model *m, uint64_t off, const uint8_t *p,
			uint64_t n, int e)
{
	/* an empty write never reaches the daemon */
	if (e || m->committed || !n)
		return;
	memcpy(m->b + off, p, n);
	if (off + n > m->len)
		m->len = off + n;
}

static void model_truncate(struct model *m, uint64_t size, int e)
{
	if (e || m->committed)
		return;
	if (size < m->len)
		memset(m->b + size, 0, m->len - size);
	m->len = size;
}

/* A good block in @img: a kvfs-gen template, or one made here. */
static uint64_t block_base(struct rng *r, uint8_t *img)
{
	uint32_t n = g.block_tokens;
	uint8_t parent[16];
	uint64_t start, len;
	unsigned k;

	if (n_tmpls && chance(r, 30)) {
		const struct tmpl *t = &tmpls[below(r, (uint32_t)n_tmpls)];

		memcpy(img, t->img, t->len);
		return t->len;
	}
	if (chance(r, 50))
		n = 1 + below(r, g.block_tokens);
	k = below(r, 10);
	if (k < 4 || !n_seeds) {
		/* a first block; at 16 it is misplaced */
		memcpy(parent, root, 16);
		start = k == 3 && chance(r, 50) ? g.block_tokens : 0;
	} else if (k < 7) {
		/* a seed's child, placed right or anywhere */
		const struct seedblk *s = &seeds[below(r, (uint32_t)n_seeds)];

		memcpy(parent, s->key, 16);
		start = k == 6 ? edge64(r) : s->h.start_pos + g.block_tokens;
	} else {
		/* an orphan */
		fill(r, parent, 16);
		start = k == 9 ? edge64(r)
			       : (uint64_t)g.block_tokens * (1 + below(r, 1000));
	}
	make_block(r, img, &len, n, parent, start);
	return len;
}

/* Damage @img, or not; @key gets the key to name the file after.
 * Returns the mutation, for the journal.
 */
static unsigned block_mutate(struct rng *r, uint8_t *img, uint64_t *len,
			     uint8_t key[16])
{
	static const uint8_t fields[] = {
		8, 10, 12, 14, 16, 20, 24, 28, 32, 36, 40,
	};
	static const uint64_t cuts[] = {
		0, 1, 87, 88, 4095, 4096, 4097, 8191, 8192,
	};
	unsigned k = below(r, 12);
	uint64_t add;

	memcpy(key, img + 64, 16);
	if (k < 3) {
		/* untouched */
	} else if (k < 5) {
		/* bit flips, the header's more often; CRCs redone or not */
		for (unsigned i = 0, n = 1 + below(r, 8); i < n; i++) {
			uint64_t at = chance(r, 30) ? below(r, 88)
						    : below(r, (uint32_t)*len);

			img[at] ^= (uint8_t)(1u << below(r, 8));
		}
		if (chance(r, 50))
			fix_crcs(img, *len, true);
	} else if (k < 7) {
		/* a header field set to an edge value */
		unsigned at = fields[below(r, sizeof(fields))];

		if (at == 40)
			kvfs_util_put64(img + at, edge64(r));
		else if (at >= 16)
			kvfs_util_put32(img + at, edge32(r));
		else if (chance(r, 50))
			kvfs_util_put16(img + at, (uint16_t)below(r, 5));
		else
			kvfs_util_put16(img + at, (uint16_t)rnd(r));
		if (chance(r, 80))
			fix_crcs(img, *len, false);
	} else if (k < 9) {
		*len = chance(r, 50) ? cuts[below(r, 9)]
				     : below(r, (uint32_t)*len);
	} else if (k < 10) {
		/* longer: zeros or not, maybe past the largest block */
		add = chance(r, 50) ? 1 + below(r, 8)
				    : 4096 * (1 + below(r, 9));
		if (chance(r, 50))
			memset(img + *len, 0, add);
		else
			fill(r, img + *len, add);
		*len += add;
		if (chance(r, 50))
			fix_crcs(img, *len, true);
	} else if (k < 11) {
		/* another key: the name no longer matches */
		fill(r, key, 16);
	} else if (n_seeds) {
		/* a stored block's name */
		memcpy(key, seeds[below(r, (uint32_t)n_seeds)].key, 16);
	}
	return k;
}

/* Commit at a flush (fsync, a dup's close, a child's exit). */
static void model_commit(struct model *m, const uint8_t name_key[16])
{
	if (!m->committed) {
		m->committed = true;
		m->rc = expect_commit(m->b, m->len, name_key);
	}
}

/* One pwrite of @n bytes of @src at @off, checked against the model. */
static void block_pwrite(int fd, struct model *m, const uint8_t *src,
			 uint64_t n, uint64_t off)
{
	ssize_t w;
	int e;

	op_begin("pwrite %" PRIu64 " @ %" PRIu64, n, off);
	w = pwrite(fd, src, n, (off_t)off);
	e = err_of(w);
	op_end();
	if (off > (uint64_t)INT64_MAX - n || off + n > (1ull << 62))
		want(e, OKS(EFBIG, EINVAL), "pwrite at a huge offset");
	else if (m->committed && n)
		want(e, OKS(EPERM), "pwrite after commit");
	else if (off + n > max_file)
		want(e, n ? OKS(EFBIG) : OKS(0, EFBIG),
		     "pwrite past the largest block");
	else
		want(e, OKS(0), "pwrite");
	if (!e && (uint64_t)w != n)
		fz_fail("pwrite of %" PRIu64 " wrote %zd", n, w);
	model_write(m, off, src, n, e);
}

static void block_ftruncate(int fd, struct model *m, uint64_t to)
{
	int e;

	op_begin("ftruncate %" PRIu64, to);
	e = err_of(ftruncate(fd, (off_t)to));
	op_end();
	if (m->committed)
		want(e, OKS(EPERM), "ftruncate after commit");
	else
		want(e, to > max_file ? OKS(EFBIG, EINVAL) : OKS(0),
		     "ftruncate of a block being written");
	model_truncate(m, to, e);
}

/*
 * Write @img[0..@len) through @fd: whole, in order in pieces, or in random
 * overlapping pieces (holes, offsets past the largest block) then maybe the
 * whole over them; with ftruncate, fsync, a dup closed and a child's exit
 * on the way. @m follows what the daemon must hold.
 */
static void block_write(struct rng *r, int fd, const uint8_t *img,
			uint64_t len, struct model *m,
			const uint8_t name_key[16])
{
	unsigned pattern = below(r, 10);
	uint64_t done = 0;
	int e;

	if (pattern == 9 && chance(r, 50))
		block_ftruncate(fd, m, len);
	while (pattern < 6 && done < len) {
		uint64_t n = len - done;

		if (pattern >= 3 && n > 1)
			n = 1 + below(r, (uint32_t)(n < 9000 ? n : 9000));
		block_pwrite(fd, m, img + done, n, done);
		done += n;
		if (pattern == 5 && chance(r, 15) && !m->committed) {
			/* fsync commits what is there */
			op_begin("fsync mid-write");
			e = err_of(fsync(fd));
			op_end();
			model_commit(m, name_key);
			want(e, OKS(m->rc), "fsync of a partial block");
		}
		if (pattern == 4 && chance(r, 15)) {
			/* so does a dup's close */
			int dupfd = dup(fd);

			op_begin("close a dup mid-write");
			e = err_of(close(dupfd));
			op_end();
			model_commit(m, name_key);
			want(e, OKS(m->rc), "close of a dup");
		}
	}
	while (pattern >= 6 && !chance(r, 25)) {
		uint64_t off = below(r, (uint32_t)len + 1);
		uint64_t n = below(r, (uint32_t)(len - off + 1));

		if (chance(r, 10)) {
			off = chance(r, 50) ? max_file - 1 + below(r, 3)
					    : edge64(r) & INT64_MAX;
			n = 1 + below(r, 4096);
		}
		block_pwrite(fd, m, off < len ? img + off : img, n, off);
	}
	if (pattern >= 6 && !m->committed && chance(r, 70)) {
		/* the whole image over whatever is there */
		block_pwrite(fd, m, img, len, 0);
		if (m->len > len && len <= max_file)
			block_ftruncate(fd, m, len);
	}
	if (pattern == 9 && chance(r, 50))
		block_ftruncate(fd, m, chance(r, 50)
					       ? below(r, (uint32_t)len + 1)
					       : edge64(r) & INT64_MAX);
	if (!m->committed && chance(r, 30)) {
		struct stat st;

		op_begin("fstat mid-write");
		e = err_of(fstat(fd, &st));
		op_end();
		want(e, OKS(0), "fstat of a block being written");
		if ((uint64_t)st.st_size != m->len)
			fz_fail("fstat of a block being written: %jd bytes, "
				"%" PRIu64 " written", (intmax_t)st.st_size,
				m->len);
	}
	if (chance(r, 10)) {
		op_begin("read on a write descriptor");
		e = err_of(read(fd, iobuf, 16));
		op_end();
		want(e, OKS(EBADF), "read of a block being written");
	}
	if (chance(r, 5)) {
		/* a writer that exits: its exit flushes for it */
		pid_t pid = fork();
		int status;

		assert_true(pid >= 0);
		if (pid == 0)
			_exit(0);
		op_begin("a child with the descriptor exits");
		waitpid(pid, &status, 0);
		op_end();
		model_commit(m, name_key);
	}
}

/* Accepted: there, byte for byte as written, valid; then removed. Refused:
 * not there.
 */
static void block_outcome(const char *path, const char *name,
			  const struct model *m, const uint8_t name_key[16])
{
	uint8_t *back = NULL;
	uint64_t blen = 0;
	struct stat st;
	int rc, e;

	if (!m->rc) {
		COUNT(accepted);
		rc = slurp(path, &back, &blen);
		if (rc)
			fz_fail("an accepted block (%s): %s", name, ename(rc));
		if (blen != m->len || memcmp(back, m->b, blen)) {
			free(back);
			fz_fail("an accepted block (%s) reads back other "
				"bytes (%" PRIu64 " of %" PRIu64 ")", name,
				blen, m->len);
		}
		if (kvfs_fmt_validate(back, blen, &g, name_key, root, 0,
				      NULL) != KVFS_FMT_OK) {
			free(back);
			fz_fail("an accepted block (%s) does not validate",
				name);
		}
		free(back);
		op_begin("unlink %s", name);
		e = err_of(unlink(path));
		op_end();
		want(e, OKS(0), "unlink an accepted block");
	} else {
		COUNT(refused);
	}
	op_begin("stat %s", name);
	e = err_of(stat(path, &st));
	op_end();
	want(e, OKS(ENOENT), "a refused (or removed) block is absent");
}

void test_blocks(void **state)
{
	struct model m = { .b = bmodel };
	char path[5400], name[1100];

	begin_target("blocks");
	FOR_ITER(it, 1500) {
		struct rng r = rng_for(6, it);
		uint8_t key[16], name_key[16];
		bool bad_name, too_long;
		uint64_t len = block_base(&r, bimg);
		unsigned k = block_mutate(&r, bimg, &len, key);
		int fd, e, flags = O_CREAT | O_CLOEXEC;

		pick_name(&r, key, name, sizeof(name), &bad_name, &too_long);
		snprintf(path, sizeof(path), "%s/%s", ns_path, name);
		if (!bad_name)
			assert_int_equal(kvfs_fmt_name_parse(name, name_key), 0);
		flags |= chance(&r, 80) ? O_WRONLY : O_RDWR;
		flags |= chance(&r, 60) ? O_EXCL : 0;
		op_begin("create %s flags %#x (%" PRIu64 " bytes, mutation %u)",
			 name, flags, len, k);
		fd = open(path, flags, 0644);
		e = err_of(fd);
		op_end();
		if (too_long) {
			/* the kernel's limit, or the daemon's refusal */
			want(e, OKS(ENAMETOOLONG, EINVAL),
			     "create of a too-long name");
		} else if (bad_name) {
			/* Another name is a temporary (one rename commits it,
			 * test_manners.sh); the daemon keeps names to 255.
			 */
			want(e, strlen(name) > 255 ? OKS(ENAMETOOLONG) : OKS(0),
			     "create of a temporary");
			if (fd >= 0) {
				close(fd);
				want(err_of(unlink(path)), OKS(0),
				     "unlink of a temporary");
			}
		} else if (seed_of(name_key) >= 0) {
			want(e, flags & O_EXCL ? OKS(EEXIST) : OKS(EPERM),
			     "create over a stored block");
		} else {
			want(e, OKS(0), "create");
			memset(m.b, 0, max_file + 65536);
			m.len = 0;
			m.committed = false;
			block_write(&r, fd, bimg, len, &m, name_key);
			model_commit(&m, name_key);
			op_begin("close %s", name);
			e = err_of(close(fd));
			op_end();
			want(e, OKS(m.rc), "close commits the block");
			block_outcome(path, name, &m, name_key);
		}
		end_iteration(it);
		if (it % 50 == 49)
			listing_check();
	}
	listing_check();
	end_target();
}
