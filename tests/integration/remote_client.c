/* SPDX-License-Identifier: MIT */
/*
 * Drives a mount with a remote tier (tests/integration/test_remote.sh, the
 * demo, the benchmarks) with the chains of chain_i.h in namespace "m":
 *
 *   remote_client MNT write N TAG [fsync]  write blocks 0..N-1 as files
 *   remote_client MNT read N TAG [FIRST]   open and read() blocks
 *                                          FIRST..N-1, each compared byte
 *                                          for byte
 *   remote_client MNT fetch N TAG          FETCH blocks 0..N-1 into the
 *                                          device pool (shm), compared
 *   remote_client MNT lookup N TAG [remote]
 *                                          LOOKUP (with KVFS_CTL_F_REMOTE):
 *                                          print the cached prefix
 *
 * read and fetch print "<cmd> ok K missing M bad B err E ms T" (missing:
 * ENOENT; err: any other error, whose name is printed once) and exit 0
 * only when every block was served intact. write exits 0 when every block
 * was accepted.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/libkvfs.h"
#include "meta/fmt.h"
#include "meta/util.h"
#include "chain_i.h"

static uint8_t root[KVFS_KEY_LEN];

static void path_of(const char *mnt, const uint8_t *key, char *p, size_t n)
{
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_fmt_key_hex(key, hex);
	snprintf(p, n, "%s/m/%s.kv", mnt, hex);
}

static int write_all(int fd, const uint8_t *p, uint64_t len)
{
	while (len) {
		ssize_t w = write(fd, p, len);

		if (w < 0)
			return -errno;
		p += w;
		len -= (uint64_t)w;
	}
	return 0;
}

static int cmd_write(const char *mnt, unsigned n, unsigned tag, bool sync)
{
	uint8_t(*keys)[16] = calloc(n ? n : 1, 16);
	uint64_t len;
	uint8_t **img = chain_make(root, tag, n, keys, &len);
	char p[4096];
	unsigned bad = 0;

	for (unsigned i = 0; i < n; i++) {
		int fd, e;

		path_of(mnt, keys[i], p, sizeof(p));
		fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0444);
		e = fd < 0 ? -errno : write_all(fd, img[i], len);
		if (!e && sync && fsync(fd))
			e = -errno;
		if (fd >= 0 && close(fd) && !e)
			e = -errno;
		if (e) {
			fprintf(stderr, "block %u: %s\n", i, strerror(-e));
			bad++;
		}
		free(img[i]);
	}
	printf("write ok %u bad %u\n", n - bad, bad);
	free(img);
	free(keys);
	return bad ? 1 : 0;
}

/* Read the whole file at @p into @buf (@cap bytes): its length, or -errno. */
static long read_file(const char *p, uint8_t *buf, size_t cap)
{
	int fd = open(p, O_RDONLY);
	size_t got = 0;

	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t r = read(fd, buf + got, cap - got);

		if (r < 0) {
			int e = -errno;

			close(fd);
			return e;
		}
		if (!r || got + (size_t)r == cap) {
			got += (size_t)r;
			break;
		}
		got += (size_t)r;
	}
	close(fd);
	return (long)got;
}

static int report(const char *cmd, unsigned ok, unsigned missing, unsigned bad,
		  unsigned err, int first_err, uint64_t t0)
{
	printf("%s ok %u missing %u bad %u err %u ms %.1f%s%s\n", cmd, ok,
	       missing, bad, err, (double)(kvfs_util_now_mono() - t0) / 1e6,
	       first_err ? " " : "", first_err ? strerror(-first_err) : "");
	return missing || bad || err ? 1 : 0;
}

static int cmd_read(const char *mnt, unsigned n, unsigned tag, unsigned first)
{
	uint8_t(*keys)[16] = calloc(n ? n : 1, 16);
	uint64_t len;
	uint8_t **img = chain_make(root, tag, n, keys, &len);
	uint8_t *buf = malloc(len + 1);
	unsigned ok = 0, missing = 0, bad = 0, err = 0;
	int first_err = 0;
	char p[4096];
	uint64_t t0 = kvfs_util_now_mono();

	for (unsigned i = first; i < n; i++) {
		long r;

		path_of(mnt, keys[i], p, sizeof(p));
		r = read_file(p, buf, len + 1);
		if (r == -ENOENT) {
			missing++;
		} else if (r < 0) {
			err++;
			if (!first_err)
				first_err = (int)r;
		} else if ((uint64_t)r != len || memcmp(buf, img[i], len)) {
			bad++;
		} else {
			ok++;
		}
	}
	for (unsigned i = 0; i < n; i++)
		free(img[i]);
	free(img);
	free(keys);
	free(buf);
	return report("read", ok, missing, bad, err, first_err, t0);
}

static int cmd_fetch(const char *mnt, unsigned n, unsigned tag)
{
	uint8_t(*keys)[16] = calloc(n ? n : 1, 16);
	uint64_t len, off = kvfs_fmt_payload_off(16);
	uint8_t **img = chain_make(root, tag, n, keys, &len);
	struct kvfs_client_blocks out = { 0 };
	struct kvfs_client *c;
	unsigned ok = 0, bad = 0;
	uint64_t t0;
	int e;

	e = kvfs_client_open(mnt, &c);
	if (e) {
		fprintf(stderr, "open %s: %s\n", mnt, strerror(-e));
		return 2;
	}
	t0 = kvfs_util_now_mono();
	e = kvfs_client_fetch(c, "m", (const uint8_t(*)[16])keys, n, &out);
	if (!e) {
		for (unsigned i = 0; i < n; i++) {
			if (out.blocks[i].len == len - off && out.data &&
			    !memcmp(out.data[i], img[i] + off, len - off))
				ok++;
			else
				bad++;
		}
	}
	e = report("fetch", ok, e == -ENOENT ? n : 0, bad,
		   e && e != -ENOENT ? n : 0, e, t0);
	kvfs_client_blocks_release(&out);
	kvfs_client_close(c);
	for (unsigned i = 0; i < n; i++)
		free(img[i]);
	free(img);
	free(keys);
	return e;
}

static int cmd_lookup(const char *mnt, unsigned n, unsigned tag, bool remote)
{
	uint8_t(*keys)[16] = calloc(n ? n : 1, 16);
	uint64_t len;
	uint8_t **img = chain_make(root, tag, n, keys, &len);
	struct kvfs_client_blocks out = { 0 };
	struct kvfs_client *c;
	int e;

	e = kvfs_client_open(mnt, &c);
	if (!e)
		e = kvfs_client_lookup(c, "m", (const uint8_t(*)[16])keys, n,
				       remote ? KVFS_CTL_F_REMOTE : 0, &out);
	if (e)
		fprintf(stderr, "lookup: %s\n", strerror(-e));
	else
		printf("%u\n", out.resp.n_cached);
	kvfs_client_blocks_release(&out);
	if (c)
		kvfs_client_close(c);
	for (unsigned i = 0; i < n; i++)
		free(img[i]);
	free(img);
	free(keys);
	return e ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *mnt, *cmd;
	unsigned n, tag;

	if (argc < 5) {
		fprintf(stderr,
			"usage: see the comment atop remote_client.c\n");
		return 2;
	}
	mnt = argv[1];
	cmd = argv[2];
	n = (unsigned)atoi(argv[3]);
	tag = (unsigned)atoi(argv[4]);
	kvfs_fmt_root_key("m", NULL, root);
	if (!strcmp(cmd, "write"))
		return cmd_write(mnt, n, tag,
				 argc > 5 && !strcmp(argv[5], "fsync"));
	if (!strcmp(cmd, "read"))
		return cmd_read(mnt, n, tag,
				argc > 5 ? (unsigned)atoi(argv[5]) : 0);
	if (!strcmp(cmd, "fetch"))
		return cmd_fetch(mnt, n, tag);
	if (!strcmp(cmd, "lookup"))
		return cmd_lookup(mnt, n, tag,
				  argc > 5 && !strcmp(argv[5], "remote"));
	fprintf(stderr, "unknown command %s\n", cmd);
	return 2;
}
