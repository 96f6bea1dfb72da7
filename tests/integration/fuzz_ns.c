/* SPDX-License-Identifier: MIT */
/*
 * The namespace target of the mount fuzzer: everything a program may try
 * on a mount besides writing a block, on the stored blocks, the namespace,
 * the mount's root and its control files.  A stored block must refuse to
 * change, and every read of it, by offset or by mapping, must show its
 * stored bytes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/ioctl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/kvfs_ctl.h"
#include "fuzz_i.h"

/* Bytes read back, kept from setup to teardown (fuzz_i.h says why). */
static uint8_t *nsbuf;

void ns_bufs_alloc(void)
{
	nsbuf = malloc(max_file + 4096);
	assert_non_null(nsbuf);
}

void ns_bufs_free(void)
{
	free(nsbuf);
}

void test_ns_ops(void **state)
{
	char a[4300], b[4300];
	uint8_t *buf = nsbuf;

	assert_non_null(buf);
	begin_target("ns_ops");
	FOR_ITER(it, 1500) {
		struct rng r = rng_for(7, it);
		int si = n_seeds ? (int)below(&r, (uint32_t)n_seeds) : -1;
		uint8_t rk[16];
		char hex[33];
		int e, fd;

		fill(&r, rk, 16);
		kvfs_fmt_key_hex(rk, hex);
		if (si >= 0)
			key_path(a, sizeof(a), seeds[si].key);
		else
			snprintf(a, sizeof(a), "%s/%s.kv", ns_path, hex);
		switch (below(&r, 22)) {
		case 0:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("rename %s %s", a, b);
			e = err_of(rename(a, b));
			op_end();
			want(e, OKS(EPERM), "rename of a block");
			break;
		case 1:
			snprintf(b, sizeof(b), "%s/%s.kv", mnt, hex);
			op_begin("rename %s %s", a, b);
			e = err_of(renameat2(AT_FDCWD, a, AT_FDCWD, b,
					     chance(&r, 50) ? RENAME_NOREPLACE
							    : 0));
			op_end();
			want(e, OKS(EPERM, EINVAL), "rename out of a namespace");
			break;
		case 2:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("link %s %s", a, b);
			e = err_of(link(a, b));
			op_end();
			want(e, OKS(EPERM), "link of a block");
			break;
		case 3:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("symlink %s", b);
			e = err_of(symlink(a, b));
			op_end();
			want(e, OKS(EPERM), "symlink in a namespace");
			break;
		case 4:
			snprintf(b, sizeof(b), "%s/%s",
				 chance(&r, 50) ? mnt : ns_path, hex);
			op_begin("mkdir %s", b);
			e = err_of(mkdir(b, 0755));
			op_end();
			want(e, OKS(EPERM), "mkdir");
			op_begin("mkdir %s", ns_path);
			e = err_of(mkdir(ns_path, 0755));
			op_end();
			want(e, OKS(EEXIST), "mkdir of an existing namespace");
			break;
		case 5:
			op_begin("rmdir %s", ns_path);
			e = err_of(rmdir(chance(&r, 50) ? ns_path : a));
			op_end();
			want(e, OKS(EPERM, ENOTDIR, ENOTEMPTY),
			     "rmdir in a kvfs mount");
			break;
		case 6:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("mknod %s", b);
			e = err_of(mknod(b, S_IFIFO | 0644, 0));
			op_end();
			want(e, OKS(EPERM), "mknod");
			break;
		case 7:
			op_begin("unlink ctl/stats");
			e = err_of(unlink(chance(&r, 50) ? ctl_path : stats_path));
			op_end();
			want(e, OKS(EPERM), "unlink of a control file");
			break;
		case 8:
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("unlink %s", b);
			e = err_of(unlink(chance(&r, 50) ? b : ns_path));
			op_end();
			want(e, OKS(ENOENT, EISDIR, EPERM),
			     "unlink of nothing, or of a directory");
			break;
		case 9:
			op_begin("truncate %s", a);
			e = err_of(truncate(a, (off_t)(edge64(&r) & INT64_MAX)));
			op_end();
			want(e, si >= 0 ? OKS(EPERM, EINVAL, EFBIG)
					: OKS(ENOENT, EINVAL, EFBIG),
			     "truncate of a stored block");
			break;
		case 10:
			op_begin("chmod/chown/utimes %s", a);
			e = err_of(chmod(a, 0777));
			op_end();
			want(e, si >= 0 ? OKS(EPERM) : OKS(ENOENT),
			     "chmod of a block");
			op_begin("utimes %s", a);
			e = err_of(utimensat(AT_FDCWD, a, NULL, 0));
			op_end();
			/* Times are not kept: setting them is a no-op. */
			want(e, si >= 0 ? OKS(0) : OKS(ENOENT),
			     "utimes of a block");
			break;
		case 11: {
			static const int fl[] = {
				O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC,
				O_WRONLY | O_APPEND, O_RDWR | O_CREAT,
			};
			int f = fl[below(&r, 5)];

			op_begin("open %s flags %#x", a, f);
			fd = open(a, f | O_CLOEXEC, 0644);
			e = err_of(fd);
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, si >= 0 ? OKS(EPERM) :
				(f & O_CREAT) ? OKS(0) : OKS(ENOENT),
			     "open of a block for writing");
			if (si < 0 && !e)
				/* an empty block: refused at close */
				want(err_of(unlink(a)), OKS(ENOENT),
				     "an empty block is not stored");
			break;
		}
		case 12:
			op_begin("open dirs for writing");
			e = err_of(open(chance(&r, 50) ? ns_path : mnt,
					O_WRONLY | O_CLOEXEC));
			op_end();
			want(e, OKS(EISDIR), "open of a directory to write");
			op_begin("open stats for writing");
			e = err_of(fd = open(stats_path, O_WRONLY | O_CLOEXEC));
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, OKS(EACCES), "open .kvfs/stats to write");
			break;
		case 13:
			snprintf(b, sizeof(b), "%s/%s.kv",
				 chance(&r, 50) ? mnt : ctl_path, hex);
			op_begin("create %s", b);
			e = err_of(fd = open(b, O_WRONLY | O_CREAT | O_CLOEXEC,
					     0644));
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, OKS(EPERM, ENOTDIR),
			     "create outside a namespace");
			snprintf(b, sizeof(b), "%s/.kvfs/%s.kv", mnt, hex);
			op_begin("create %s", b);
			e = err_of(fd = open(b, O_WRONLY | O_CREAT | O_CLOEXEC,
					     0644));
			op_end();
			if (fd >= 0)
				close(fd);
			want(e, OKS(EPERM), "create in .kvfs");
			break;
		case 14: {
			/* reads at any offset: the stored bytes, or nothing */
			uint64_t off = edge64(&r) & INT64_MAX;

			if (chance(&r, 60))
				off = below(&r, (uint32_t)max_file + 8192);
			size_t n = 1 + below(&r, 65536);
			ssize_t got;

			if (si < 0)
				break;
			op_begin("pread %s %zu @ %" PRIu64, a, n, off);
			fd = open(a, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			if (!e) {
				got = pread(fd, buf, n, (off_t)off);
				e = err_of(got);
				close(fd);
			}
			op_end();
			want(e, OKS(0, EINVAL), "pread of a stored block");
			if (e)
				break;
			uint64_t l = seeds[si].len;
			uint64_t expect = off >= l ? 0 : l - off;

			if (expect > n)
				expect = n;

			if ((uint64_t)got != expect ||
			    (got > 0 && memcmp(buf, seeds[si].img + off,
					       (size_t)got)))
				fz_fail("pread %zu @ %" PRIu64 " of a %" PRIu64
					"-byte block: %zd bytes, or other "
					"bytes", n, off, l, got);
			break;
		}
		case 15: {
			if (si < 0)
				break;
			op_begin("mmap %s", a);
			fd = open(a, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			op_end();
			want(e, OKS(0), "open a stored block");
			void *p = mmap(NULL, (size_t)seeds[si].len, PROT_READ,
				       MAP_SHARED, fd, 0);

			close(fd);
			if (p == MAP_FAILED)
				fz_fail("mmap of a stored block: %s",
					strerror(errno));
			op_begin("compare through mmap");
			bool same = !memcmp(p, seeds[si].img,
					    (size_t)seeds[si].len);
			op_end();
			munmap(p, (size_t)seeds[si].len);
			if (!same)
				fz_fail("mmap of %s shows other bytes", a);
			break;
		}
		case 16: {
			/* readdir from arbitrary cookies */
			DIR *d;
			long cookie = (long)(edge64(&r) & INT64_MAX);

			if (chance(&r, 50))
				cookie = below(&r, 64);

			op_begin("readdir from %ld", cookie);
			d = opendir(chance(&r, 70) ? ns_path : mnt);
			if (d) {
				seekdir(d, cookie);
				while (readdir(d))
					;
				closedir(d);
			}
			op_end();
			break;
		}
		case 17: {
			/* the stats file, at odd offsets */
			ssize_t got;

			op_begin("pread stats");
			fd = open(stats_path, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			op_end();
			want(e, OKS(0), "open .kvfs/stats");
			op_begin("pread stats");
			off_t off = (off_t)(edge64(&r) & INT64_MAX);

			if (chance(&r, 50))
				off = below(&r, 4096);
			got = pread(fd, buf, 1 + below(&r, 8192), off);
			e = err_of(got);
			op_end();
			close(fd);
			want(e, OKS(0, EINVAL), "pread .kvfs/stats");
			break;
		}
		case 18:
			op_begin("opendir a file");
			e = err_of(open(si >= 0 ? a : ctl_path,
					O_RDONLY | O_DIRECTORY | O_CLOEXEC));
			op_end();
			want(e, OKS(ENOTDIR), "open a file as a directory");
			break;
		case 19: {
			struct statvfs sv;

			op_begin("statvfs");
			e = err_of(statvfs(mnt, &sv));
			op_end();
			want(e, OKS(0), "statvfs");
			break;
		}
		case 20:
			/* a block being written, then a second writer */
			snprintf(b, sizeof(b), "%s/%s.kv", ns_path, hex);
			op_begin("two creates of %s", b);
			fd = open(b, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
				  0644);
			e = err_of(fd);
			op_end();
			want(e, OKS(0), "create");
			if (fd >= 0) {
				int fd2;

				op_begin("second create of %s", b);
				fd2 = open(b, O_WRONLY | O_CREAT | O_CLOEXEC,
					   0644);
				e = err_of(fd2);
				op_end();
				if (fd2 >= 0)
					close(fd2);
				want(e, OKS(EEXIST),
				     "a second writer of one block");
				op_begin("close the first");
				e = err_of(close(fd));
				op_end();
				want(e, OKS(EINVAL), "close of an empty block");
			}
			break;
		default: {
			/* ioctls on a block and on a directory */
			int x = 0;

			if (si < 0)
				break;
			op_begin("ioctl on %s", a);
			fd = open(a, O_RDONLY | O_CLOEXEC);
			e = err_of(fd);
			if (!e) {
				e = err_of(ioctl(fd, KVFS_IOC_STATS, iobuf));
				close(fd);
			}
			op_end();
			want(e, OKS(ENOTTY), "a ctl ioctl on a block");
			op_begin("ioctl on %s", ns_path);
			fd = open(ns_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			e = err_of(fd);
			if (!e) {
				e = err_of(ioctl(fd, _IOR('K', 1, int), &x));
				close(fd);
			}
			op_end();
			want(e, OKS(ENOTTY, ENOSYS, EINVAL),
			     "an ioctl on a namespace");
			break;
		}
		}
		end_iteration(it);
	}
	listing_check();
	end_target();
}
