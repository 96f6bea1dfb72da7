/* SPDX-License-Identifier: MIT */
/*
 * The xattr target of the mount fuzzer: known, odd and overlong names with
 * odd values, set, read, listed and removed on every kind of inode the
 * mount has, including a block still being written.  The errno a call
 * must end in follows from the name, the value, the inode and what the
 * iteration did to it before, so it is known before the call is made.
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
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/util.h"
#include "fuzz_i.h"

/* Values sent and read back, kept from setup to teardown (fuzz_i.h says
 * why).
 */
static char *xv, *xgot;

void xattr_bufs_alloc(void)
{
	xv = malloc(65540);
	xgot = malloc(65540);
	assert_non_null(xv);
	assert_non_null(xgot);
}

void xattr_bufs_free(void)
{
	free(xv);
	free(xgot);
}

static const char *const block_names[] = {
	"tier", "tokens", "parent", "hits", "last_access", "depth",
	"durable", "category", "leases", "pin", "stored_as", "stored_bytes",
};
static const char *const ns_names[] = { "root", "geometry", "blocks" };

enum node {
	N_SEED, N_SCRATCH, N_NS, N_ROOT, N_CTLDIR, N_CTL, N_STATS, N_PENDING,
	N_COUNT,
};

/* A block of ours to pin, categorise and unlink freely. */
static uint8_t scratch_key[16];

static int write_block(const char *path, const uint8_t *img, uint64_t len)
{
	int fd, e;

	op_begin("create %s", path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	e = err_of(fd);
	op_end();
	if (e)
		return e;
	op_begin("write %" PRIu64 " bytes", len);
	e = err_of(write(fd, img, len));
	op_end();
	op_begin("close %s", path);
	if (close(fd) && !e)
		e = errno;
	op_end();
	return e;
}

static void scratch_make(struct rng *r)
{
	uint8_t *img = malloc(max_file);
	uint64_t len;
	char path[4300];

	assert_non_null(img);
	make_block(r, img, &len, g.block_tokens, root, 0);
	memcpy(scratch_key, img + 64, 16);
	key_path(path, sizeof(path), scratch_key);
	want(write_block(path, img, len), OKS(0), "write the scratch block");
	free(img);
}

static void scratch_drop(void)
{
	char path[4300];
	int e;

	key_path(path, sizeof(path), scratch_key);
	op_begin("removexattr pin %s", path);
	e = err_of(removexattr(path, "user.kvfs.pin"));
	op_end();
	want(e, OKS(0, ENODATA), "unpin the scratch block");
	op_begin("unlink %s", path);
	e = err_of(unlink(path));
	op_end();
	want(e, OKS(0), "unlink the scratch block");
}

static void rand_name(struct rng *r, char *out, size_t cap)
{
	unsigned k = below(r, 12);

	if (k < 4) {
		snprintf(out, cap, "user.kvfs.%s",
			 block_names[below(r, sizeof(block_names) /
						      sizeof(block_names[0]))]);
	} else if (k < 6) {
		snprintf(out, cap, "user.kvfs.%s",
			 ns_names[below(r, 3)]);
	} else if (k == 6) {
		static const char *const odd[] = {
			"user.kvfs.", "user.kvfs.PIN", "user.kvfs.pin ",
			"user.kvfs.pinx", "user.kvfs.tier.x", "user.kvfs",
			"user.other", "trusted.kvfs.pin", "security.kvfs",
			"user.kvfs..pin", "user.kvfs.category\n",
		};
		snprintf(out, cap, "%s", odd[below(r, sizeof(odd) /
						      sizeof(odd[0]))]);
	} else if (k == 7) {
		/* the longest the kernel passes, and one more */
		size_t n = 254 + below(r, 4);

		if (n >= cap)
			n = cap - 1;
		memcpy(out, "user.kvfs.", 10);
		memset(out + 10, 'a', n - 10);
		out[n] = 0;
	} else {
		size_t n = 1 + below(r, 40);

		memcpy(out, "user.", 5);
		for (size_t i = 5; i < n + 5 && i + 1 < cap; i++)
			out[i] = (char)(1 + below(r, 255));
		out[n + 5 < cap ? n + 5 : cap - 1] = 0;
	}
}

struct word {
	const char *v;
	size_t n; /* bytes, embedded NULs included */
};

#define W(lit) { lit, sizeof(lit) - 1 }

static size_t rand_value(struct rng *r, char *v, size_t cap)
{
	static const struct word words[] = {
		W("gpu"), W("dram"), W("ssd"), W("gpu\n"), W("dram\0"),
		W("ssd\n\0"), W("GPU"), W("dram "), W(" ssd"), W("nvme"),
		W("0"), W("1"), W("65535"), W("65536"), W("-1"),
		W("4294967296"), W("99999999999999999999"), W("7\n"), W("7\0"),
		W("0x10"), W("1e3"), W(""), W("5\nabc"), W("dram\ngpu"),
		W("12\0junk"), W("ssd\0\0\n"),
		/* longer than the daemon's value buffer */
		W("0000000000000000000000000000000000000000000000000000000000000"
		  "00042"),
		W("ssdddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
		  "dd"),
	};
	unsigned k = below(r, 10);
	size_t n;

	if (k < 6) {
		const struct word *w = &words[below(r, sizeof(words) /
						       sizeof(words[0]))];

		memcpy(v, w->v, w->n);
		return w->n;
	}
	if (k < 8) {
		n = below(r, 80);
		fill(r, v, n);
		return n;
	}
	if (k == 8)
		return 0;
	n = chance(r, 50) ? 65536 : 65537;
	if (n > cap)
		n = cap;
	memset(v, '7', n);
	return n;
}

/* The value as the daemon must read it: the bytes up to trailing NULs
 * and newlines, none of which may appear before them.
 */
static bool value_word(const char *v, size_t n, char *out, size_t cap)
{
	while (n && (v[n - 1] == '\0' || v[n - 1] == '\n'))
		n--;
	if (n >= cap || memchr(v, '\0', n) || memchr(v, '\n', n))
		return false;
	memcpy(out, v, n);
	out[n] = 0;
	return true;
}

static bool parse_u32(const char *s, uint32_t *out)
{
	return kvfs_util_parse_u32(s, out) == 0;
}

static void node_path(enum node nd, int si, char *p, size_t cap)
{
	switch (nd) {
	case N_SEED:
		key_path(p, cap, seeds[si].key);
		break;
	case N_SCRATCH:
		key_path(p, cap, scratch_key);
		break;
	case N_NS:
		snprintf(p, cap, "%s", ns_path);
		break;
	case N_ROOT:
		snprintf(p, cap, "%s", mnt);
		break;
	case N_CTLDIR:
		snprintf(p, cap, "%s/.kvfs", mnt);
		break;
	case N_CTL:
		snprintf(p, cap, "%s", ctl_path);
		break;
	case N_STATS:
		snprintf(p, cap, "%s", stats_path);
		break;
	default:
		snprintf(p, cap, "(pending)");
		break;
	}
}

static bool known_block_name(const char *name)
{
	if (strncmp(name, "user.kvfs.", 10))
		return false;
	for (size_t i = 0; i < sizeof(block_names) / sizeof(block_names[0]); i++)
		if (!strcmp(name + 10, block_names[i]))
			return true;
	return false;
}

static bool known_ns_name(const char *name)
{
	if (strncmp(name, "user.kvfs.", 10))
		return false;
	for (size_t i = 0; i < 3; i++)
		if (!strcmp(name + 10, ns_names[i]))
			return true;
	return false;
}

/* The kernel's own refusals of a name or value, before the daemon. */
static bool kernel_refuses(const char *name, size_t vlen, int *err)
{
	if (strlen(name) > 255) {
		*err = ERANGE;
		return true;
	}
	if (vlen > 65536) {
		*err = E2BIG;
		return true;
	}
	return false;
}

/* One xattr call's target, and what this iteration did to it. */
struct xnode {
	enum node nd;
	int si;          /* N_SEED: which */
	char path[4300];
	int fd;          /* N_PENDING: the writer's descriptor */
	uint32_t *category; /* the scratch block's, UINT32_MAX: not set */
	bool *pinned;       /* the scratch block pinned */
};

static bool is_block(const struct xnode *x)
{
	return x->nd == N_SEED || x->nd == N_SCRATCH;
}

static bool is_tier_word(const char *w)
{
	return !strcmp(w, "gpu") || !strcmp(w, "dram") || !strcmp(w, "ssd");
}

static void xattr_set(struct rng *r, const struct xnode *x, const char *name)
{
	char word[64];
	size_t vlen = rand_value(r, xv, 65540);
	bool wok = value_word(xv, vlen, word, sizeof(word));
	uint32_t cat;
	int e, kerr;

	op_begin("setxattr %s %s (%zu bytes)", x->path, name, vlen);
	if (x->nd == N_PENDING)
		e = err_of(fsetxattr(x->fd, name, xv, vlen, 0));
	else
		e = err_of(setxattr(x->path, name, xv, vlen,
				    chance(r, 20) ? XATTR_CREATE : 0));
	op_end();
	if (kernel_refuses(name, vlen, &kerr)) {
		want(e, OKS(kerr), "setxattr past the kernel's limits");
	} else if (is_block(x) && !strcmp(name, "user.kvfs.pin")) {
		want(e, wok && is_tier_word(word) ? OKS(0, ENOSPC, EBUSY)
						  : OKS(EINVAL),
		     "setxattr pin");
		if (!e && x->nd == N_SCRATCH)
			*x->pinned = true;
	} else if (is_block(x) && !strcmp(name, "user.kvfs.category")) {
		bool t = wok && parse_u32(word, &cat) && cat <= 0xffff;

		want(e, t ? OKS(0) : OKS(EINVAL), "setxattr category");
		if (!e && x->nd == N_SCRATCH)
			*x->category = cat;
	} else if (is_block(x) && known_block_name(name)) {
		want(e, OKS(EPERM), "setxattr of a read-only name");
	} else if (x->nd == N_NS && known_ns_name(name)) {
		want(e, OKS(EPERM), "setxattr of a namespace's name");
	} else if ((is_block(x) || x->nd == N_NS) &&
		   !strncmp(name, "user.", 5)) {
		want(e, OKS(ENOTSUP), "setxattr of an unknown name");
	} else if (x->nd == N_PENDING) {
		want(e, OKS(ENOTSUP, EPERM, ENOENT, EACCES),
		     "setxattr on a block being written");
	} else {
		/* control inodes; other namespaces than user.* */
		want(e, OKS(ENOTSUP, EPERM, EACCES), "setxattr");
	}
}

/* A value the seeds or the scratch block must have. */
static void xattr_value_check(const struct xnode *x, const char *name,
			      const char *v, ssize_t n)
{
	char want_s[40] = "";

	if (x->nd == N_SEED && !strcmp(name, "user.kvfs.tokens"))
		snprintf(want_s, sizeof(want_s), "%u",
			 seeds[x->si].h.n_tokens);
	else if (x->nd == N_SEED && !strcmp(name, "user.kvfs.parent"))
		kvfs_fmt_key_hex(seeds[x->si].h.parent, want_s);
	else if (x->nd == N_SEED && !strcmp(name, "user.kvfs.depth"))
		snprintf(want_s, sizeof(want_s), "%" PRIu64,
			 seeds[x->si].h.start_pos / g.block_tokens);
	else if (x->nd == N_SCRATCH && !strcmp(name, "user.kvfs.category") &&
		 *x->category != UINT32_MAX)
		snprintf(want_s, sizeof(want_s), "%u", *x->category);
	else if (x->nd == N_NS && !strcmp(name, "user.kvfs.root"))
		kvfs_fmt_key_hex(root, want_s);
	else if (x->nd == N_SCRATCH && !strcmp(name, "user.kvfs.pin") &&
		 !*x->pinned)
		fz_fail("getxattr pin: '%.*s' on an unpinned block", (int)n,
			v);
	if (want_s[0] && ((size_t)n != strlen(want_s) ||
			  memcmp(v, want_s, (size_t)n)))
		fz_fail("getxattr %s of %s: '%.*s', want '%s'", name, x->path,
			(int)n, v, want_s);
}

static void xattr_get(struct rng *r, const struct xnode *x, const char *name)
{
	/* a size query, a buffer too small for most values, or room */
	size_t cap = !below(r, 3) ? 0 : chance(r, 50) ? 1 + below(r, 8)
						       : 65536;
	bool pin = is_block(x) && !strcmp(name, "user.kvfs.pin");
	bool has = (is_block(x) && known_block_name(name) && !pin) ||
		   (x->nd == N_NS && known_ns_name(name));
	ssize_t n;
	int e;

	op_begin("getxattr %s %s size %zu", x->path, name, cap);
	n = x->nd == N_PENDING ? fgetxattr(x->fd, name, xgot, cap)
			       : getxattr(x->path, name, xgot, cap);
	e = err_of(n);
	op_end();
	if (strlen(name) > 255)
		want(e, OKS(ERANGE), "getxattr of a too-long name");
	else if (has && cap == 0)
		want(e, OKS(0), "getxattr size query");
	else if (has && cap < 9)
		want(e, OKS(0, ERANGE), "getxattr into a small buffer");
	else if (has)
		want(e, OKS(0), "getxattr");
	else if (pin)
		want(e, OKS(0, ENODATA, ERANGE), "getxattr pin");
	else if (!strncmp(name, "user.", 5))
		want(e, OKS(ENODATA), "getxattr of an absent name");
	else
		want(e, OKS(ENODATA, ENOTSUP, EPERM, EACCES),
		     "getxattr outside user.*");
	if (has && !e && n <= 0)
		fz_fail("getxattr %s of %s: an empty value", name, x->path);
	if (!e && cap >= 9 && n > 0)
		xattr_value_check(x, name, xgot, n);
}

static void xattr_list(struct rng *r, const struct xnode *x)
{
	size_t cap = chance(r, 30) ? 0 : chance(r, 30) ? 1 + below(r, 16)
						       : 65536;
	const char *must = x->nd == N_NS ? "user.kvfs.root" :
			   is_block(x)	 ? "user.kvfs.tokens" :
					   NULL;
	bool found = false;
	ssize_t n;
	int e;

	op_begin("listxattr %s size %zu", x->path, cap);
	n = x->nd == N_PENDING ? flistxattr(x->fd, xgot, cap)
			       : listxattr(x->path, xgot, cap);
	e = err_of(n);
	op_end();
	want(e, OKS(0, ERANGE), "listxattr");
	if (e || cap != 65536)
		return;
	if (!must) {
		/* a control inode, or the block being written: none */
		if (n)
			fz_fail("listxattr %s: %zd bytes of names", x->path,
				n);
		return;
	}
	if (n <= 0 || xgot[n - 1])
		fz_fail("listxattr %s: not a list of names", x->path);
	for (ssize_t o = 0; o < n; o += (ssize_t)strlen(xgot + o) + 1)
		if (!strcmp(xgot + o, must))
			found = true;
	if (!found)
		fz_fail("listxattr %s lacks %s", x->path, must);
}

static void xattr_remove(const struct xnode *x, const char *name)
{
	int e;

	op_begin("removexattr %s %s", x->path, name);
	e = x->nd == N_PENDING ? err_of(fremovexattr(x->fd, name))
			       : err_of(removexattr(x->path, name));
	op_end();
	if (strlen(name) > 255) {
		want(e, OKS(ERANGE), "removexattr of a too-long name");
	} else if (is_block(x) && !strcmp(name, "user.kvfs.pin")) {
		want(e, OKS(0, ENODATA), "removexattr pin");
		if (x->nd == N_SCRATCH && *x->pinned && e)
			fz_fail("removexattr pin of a pinned block: %s",
				ename(e));
		if (x->nd == N_SCRATCH)
			*x->pinned = false;
	} else if (is_block(x) && known_block_name(name)) {
		want(e, OKS(EPERM), "removexattr of a read-only name");
	} else if (x->nd == N_NS) {
		want(e, OKS(EPERM, ENOTSUP, EACCES),
		     "removexattr on a namespace");
	} else if (!strncmp(name, "user.", 5)) {
		want(e, OKS(ENODATA), "removexattr of an absent name");
	} else {
		want(e, OKS(ENODATA, ENOTSUP, EPERM, EACCES),
		     "removexattr outside user.*");
	}
}

void test_xattr(void **state)
{
	char name[300], path[4300];

	begin_target("xattr");
	FOR_ITER(it, 1800) {
		struct rng r = rng_for(5, it);
		uint32_t category = UINT32_MAX;
		bool pinned = false;
		int pfd = -1, e;

		scratch_make(&r);
		if (chance(&r, 30)) {
			/* a block being written: only its writer sees it */
			uint8_t k[16];

			fill(&r, k, 16);
			key_path(path, sizeof(path), k);
			op_begin("create %s", path);
			pfd = open(path, O_WRONLY | O_CREAT | O_EXCL |
						 O_CLOEXEC, 0644);
			e = err_of(pfd);
			op_end();
			want(e, OKS(0), "create a pending block");
		}
		for (unsigned s = 0, n = 4 + below(&r, 8); s < n; s++) {
			struct xnode x = {
				.fd = pfd,
				.category = &category,
				.pinned = &pinned,
			};
			unsigned what;

			/* one draw per statement: the order is the seed's */
			x.nd = (enum node)below(&r, N_COUNT);
			x.si = (int)below(&r, (uint32_t)n_seeds);
			what = below(&r, 10);

			if ((x.nd == N_SEED && !n_seeds) ||
			    (x.nd == N_PENDING && pfd < 0))
				x.nd = N_SCRATCH;
			node_path(x.nd, x.si, x.path, sizeof(x.path));
			rand_name(&r, name, sizeof(name));
			if (what < 4)
				xattr_set(&r, &x, name);
			else if (what < 7)
				xattr_get(&r, &x, name);
			else if (what < 9)
				xattr_list(&r, &x);
			else
				xattr_remove(&x, name);
		}
		if (pfd >= 0) {
			op_begin("close the pending block");
			e = err_of(close(pfd));
			op_end();
			want(e, OKS(EINVAL), "close of an empty block");
		}
		for (int i = 0; i < n_seeds; i++) {
			key_path(path, sizeof(path), seeds[i].key);
			op_begin("removexattr pin %s", path);
			e = err_of(removexattr(path, "user.kvfs.pin"));
			op_end();
			want(e, OKS(0, ENODATA), "unpin a seed");
		}
		scratch_drop();
		end_iteration(it);
	}
	end_target();
}

/* ---------------------------------------------------------- regressions */

/*
 * fs/fuse_ops.c took the word of a settable xattr from the first 63 bytes
 * up to a newline or NUL: "12\0junk", "5\nabc" and a long zero-padded
 * number were accepted as something else. Trailing newlines and NULs are
 * still fine.
 */
void test_regress_xattr_words(void **state)
{
	static const struct word bad_cat[] = {
		W("12\0junk"), W("5\nabc"), W("7\n\n8"), W("\0" "3"),
		W("0000000000000000000000000000000000000000000000000000000000000"
		  "00042"),
	};
	static const struct word good_cat[] = {
		W("7"), W("8\n"), W("9\0"), W("10\n\0"), W("11\0\0\n"),
	};
	static const struct word bad_pin[] = {
		W("dram\ngpu"), W("ssd\0x"), W("dram "),
		W("ssdddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
		  "dddddd"),
	};
	char path[4300], v[32];
	struct rng r = rng_for(100, 0);
	ssize_t n;
	int e;

	begin_target("regress_xattr_words");
	scratch_make(&r);
	key_path(path, sizeof(path), scratch_key);
	for (size_t i = 0; i < sizeof(bad_cat) / sizeof(bad_cat[0]); i++) {
		op_begin("setxattr category, bad value %zu", i);
		e = err_of(setxattr(path, "user.kvfs.category", bad_cat[i].v,
				    bad_cat[i].n, 0));
		op_end();
		want(e, OKS(EINVAL), "a category that is not one number");
	}
	for (size_t i = 0; i < sizeof(good_cat) / sizeof(good_cat[0]); i++) {
		op_begin("setxattr category, good value %zu", i);
		e = err_of(setxattr(path, "user.kvfs.category", good_cat[i].v,
				    good_cat[i].n, 0));
		op_end();
		want(e, OKS(0), "a category with a trailing newline or NUL");
		char want_s[8];

		snprintf(want_s, sizeof(want_s), "%zu", 7 + i);
		n = getxattr(path, "user.kvfs.category", v, sizeof(v) - 1);
		if (n != (ssize_t)strlen(want_s) ||
		    memcmp(v, want_s, (size_t)n))
			fz_fail("category after setting %s (value %zu): "
				"'%.*s'", want_s, i, (int)(n > 0 ? n : 0), v);
	}
	for (size_t i = 0; i < sizeof(bad_pin) / sizeof(bad_pin[0]); i++) {
		op_begin("setxattr pin, bad value %zu", i);
		e = err_of(setxattr(path, "user.kvfs.pin", bad_pin[i].v,
				    bad_pin[i].n, 0));
		op_end();
		want(e, OKS(EINVAL), "a pin that is not one tier");
	}
	n = getxattr(path, "user.kvfs.pin", v, sizeof(v));
	if (n >= 0)
		fz_fail("a refused pin left the block pinned ('%.*s')",
			(int)n, v);
	e = err_of(setxattr(path, "user.kvfs.pin", "dram\n", 5, 0));
	want(e, OKS(0), "a pin with a trailing newline");
	scratch_drop();
	end_target();
}
