/* SPDX-License-Identifier: MIT */
/*
 * bench_io: the timing half of `make bench` (tests/bench/run.sh drives it).
 *
 * Every subcommand times a kvfs path and its baseline in the same process,
 * alternating one kvfs sample and one baseline sample so that drift of the
 * machine (frequency, a neighbour's I/O) hits both alike, and prints the
 * medians and their ratio. It asserts nothing: exit status 1 means only
 * that a measurement could not be taken at all.
 *
 *   read    open + read() + close of a block (optionally after dropping its
 *           page cache), from a kvfs directory and from a baseline one
 *   mmap    open + mmap + copy-out + munmap + close of a cached block
 *   open    open + close alone: the fixed cost per block
 *   extents block name -> SSD extent, from an unmounted store's metadata
 *   ssd     cold reads of SSD-only blocks against O_DIRECT reads of the
 *           extents of other blocks in the data file
 *   create  open(O_CREAT) + write + close of new blocks, kvfs directory
 *           against a baseline directory
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/meta.h"
#include "meta/util.h"

#define ALIGN 4096u
#define MAX_SAMPLES 4096u
#define MAX_FILES 4096u
#define DRAIN_POLL_NS 2000000L /* 2 ms between write-back queue polls */
#define DRAIN_MAX_POLLS 15000u /* 30 s */

enum rw_mode {
	RW_READ = 1 << 0,
	RW_MMAP = 1 << 1,
	RW_OPEN = 1 << 2,
};

enum bench_flags {
	BF_DROP = 1 << 0, /* drop the file's page cache before each sample */
	BF_HOLD = 1 << 1, /* open once, outside the timed region */
	BF_DIRECT = 1 << 2, /* open the kvfs file with O_DIRECT */
	BF_ALL = 1 << 3,    /* print every sample, not just the summary */
};

struct opts {
	unsigned iters;
	size_t bs;
	unsigned flags;
	const char *label;
	const char *summary;
	const char *target;
	const char *data;
	const char *map;
	const char *dir;
	const char *stats;
	const char *kname;
	const char *bname;
};

struct samples {
	double v[MAX_SAMPLES];
	unsigned n;
};

struct block_file {
	char name[64];
	uint8_t *buf;
	size_t len;
};

static double now_s(void)
{
	return (double)kvfs_util_now_mono() / 1e9;
}

static void add(struct samples *s, double v)
{
	if (s->n < MAX_SAMPLES)
		s->v[s->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Sorts in place; 0 for an empty set. */
static double median(struct samples *s)
{
	if (!s->n)
		return 0;
	qsort(s->v, s->n, sizeof(s->v[0]), cmp_double);
	if (s->n & 1)
		return s->v[s->n / 2];
	return (s->v[s->n / 2 - 1] + s->v[s->n / 2]) / 2;
}

static void *alloc_buf(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, ALIGN, kvfs_util_align_up(len ? len : 1,
							 ALIGN)))
		return NULL;
	/* Fault the buffer in now, not inside the first timed sample. */
	memset(p, 0, len);
	return p;
}

/* One line per set, then the ratio; the summary file gets one
 * "label|kvfs|base|unit|ratio|target" line for run.sh's table.
 */
static void report(const struct opts *o, const char *unit,
		   struct samples *k, struct samples *b)
{
	double mk = median(k), mb = median(b);
	double ratio = mb > 0 ? mk / mb : 0;
	const char *kn = o->kname ? o->kname : "kvfs";
	const char *bn = o->bname ? o->bname : "baseline";
	FILE *f;

	if (o->flags & BF_ALL) {
		for (int j = 0; j < 2; j++) {
			const struct samples *s = j ? b : k;

			printf("    %-10s samples:", j ? bn : kn);
			for (unsigned i = 0; i < s->n; i++)
				printf(" %.2f", s->v[i]);
			printf("\n");
		}
	}
	if (k->n)
		printf("    %-10s %9.2f %s  (median of %u; min %.2f, max %.2f)\n",
		       kn, mk, unit, k->n, k->v[0], k->v[k->n - 1]);
	else
		printf("    %-10s no samples\n", kn);
	if (b->n)
		printf("    %-10s %9.2f %s  (median of %u; min %.2f, max %.2f)\n",
		       bn, mb, unit, b->n, b->v[0], b->v[b->n - 1]);
	printf("    %-10s %9.2f", "ratio", ratio);
	if (o->target)
		printf("  (target >= %s)", o->target);
	printf("\n");
	if (!o->summary)
		return;
	f = fopen(o->summary, "a");
	if (!f) {
		perror(o->summary);
		return;
	}
	fprintf(f, "%s|%.2f|%.2f|%s|%.2f|%s\n", o->label ? o->label : "-",
		mk, mb, unit, ratio, o->target ? o->target : "-");
	fclose(f);
}

static int file_size(const char *path, size_t *size)
{
	struct stat st;

	*size = 0;
	if (stat(path, &st)) {
		int err = errno;

		fprintf(stderr, "bench_io: %s: %s\n", path, strerror(err));
		return -err;
	}
	*size = (size_t)st.st_size;
	return 0;
}

/*
 * Drop @path's page cache (the pages are clean: the kernel just forgets
 * them) and return how many pages are still resident, checked through
 * mincore() on a fresh mapping; -errno if it could not be done.
 */
static long drop_cache(const char *path, size_t size)
{
	size_t pages = (size + ALIGN - 1) / ALIGN;
	unsigned char *vec;
	long resident = 0;
	void *p;
	int fd;

	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	vec = malloc(pages);
	p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (vec && p != MAP_FAILED && !mincore(p, size, vec))
		for (size_t i = 0; i < pages; i++)
			resident += vec[i] & 1;
	if (p != MAP_FAILED)
		munmap(p, size);
	free(vec);
	close(fd);
	return resident;
}

/* read() @size bytes of @fd into @buf, @bs at a time. */
static int read_all(int fd, uint8_t *buf, size_t size, size_t bs)
{
	size_t done = 0;

	while (done < size) {
		size_t want = size - done < bs ? size - done : bs;
		ssize_t n = read(fd, buf + done, want);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO; /* short file */
		done += (size_t)n;
	}
	return 0;
}

/* One timed open + read + close (or just read at offset 0 of @held_fd). */
static int time_read(const char *path, int held_fd, int oflags,
		     uint8_t *buf, size_t size, size_t bs, double *secs)
{
	double t0 = now_s();
	int fd = held_fd, rc;

	if (fd < 0) {
		fd = open(path, O_RDONLY | oflags);
		if (fd < 0)
			return -errno;
	} else if (lseek(fd, 0, SEEK_SET) < 0) {
		return -errno;
	}
	rc = read_all(fd, buf, size, bs);
	if (held_fd < 0)
		close(fd);
	*secs = now_s() - t0;
	return rc;
}

/* One timed open + close: the per-file cost every read figure pays. */
static int time_open(const char *path, double *secs)
{
	double t0 = now_s();
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -errno;
	close(fd);
	*secs = now_s() - t0;
	return 0;
}

/* One timed open + mmap + copy-out + munmap + close. */
static int time_mmap(const char *path, int held_fd, uint8_t *buf,
		     size_t size, double *secs)
{
	double t0 = now_s();
	int fd = held_fd;
	void *p;

	if (fd < 0) {
		fd = open(path, O_RDONLY);
		if (fd < 0)
			return -errno;
	}
	p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int err = -errno;

		if (held_fd < 0)
			close(fd);
		return err;
	}
	/* An engine copies the block out (to a staging or device buffer):
	 * every byte of the mapping is read once.
	 */
	memcpy(buf, p, size);
	munmap(p, size);
	if (held_fd < 0)
		close(fd);
	*secs = now_s() - t0;
	return 0;
}

/*
 * Iteration i reads NAME[i % n] from the kvfs directory, then the same name
 * from the baseline directory. Rotating over several blocks keeps the
 * working set beyond the last-level cache, as when an engine loads a long
 * prefix; a single name measures one cache-hot block.
 */
static int cmd_rw(const struct opts *o, enum rw_mode mode, const char *kdir,
		  const char *bdir, int n, char **names)
{
	struct samples *k = calloc(1, sizeof(*k)), *b = calloc(1, sizeof(*b));
	const char *dir[2] = { kdir, bdir };
	char (*path)[2][4096] = calloc((size_t)n, sizeof(*path));
	int (*held)[2] = calloc((size_t)n, sizeof(*held));
	int oflags = (o->flags & BF_DIRECT) ? O_DIRECT : 0;
	size_t size = 0, s = 0;
	long left_warm = 0;
	uint8_t *buf = NULL;
	int rc = -ENOMEM;

	if (!k || !b || !path || !held)
		goto out_free;
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 2; j++) {
			held[i][j] = -1;
			snprintf(path[i][j], sizeof(path[i][j]), "%s/%s",
				 dir[j], names[i]);
			rc = file_size(path[i][j], &s);
			if (rc)
				goto out_free;
			if (size && s != size) {
				fprintf(stderr, "bench_io: %s: every file "
					"must have the same size\n",
					path[i][j]);
				rc = -EINVAL;
				goto out_free;
			}
			size = s;
		}
	}
	buf = alloc_buf(size);
	if (!buf || !size) {
		rc = buf ? -EINVAL : -ENOMEM;
		goto out_free;
	}
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 2; j++) {
			double t = 0;

			if (o->flags & BF_HOLD) {
				held[i][j] = open(path[i][j],
						  O_RDONLY | (j ? 0 : oflags));
				if (held[i][j] < 0) {
					rc = -errno;
					fprintf(stderr, "bench_io: %s: %s\n",
						path[i][j], strerror(-rc));
					goto out_close;
				}
			}
			/* Warm-up: page cache, buffer and code paths. */
			rc = time_read(path[i][j], -1, j ? 0 : oflags, buf,
				       size, o->bs, &t);
			if (rc) {
				fprintf(stderr, "bench_io: read %s: %s\n",
					path[i][j], strerror(-rc));
				goto out_close;
			}
		}
	}
	for (unsigned it = 0; it < o->iters; it++) {
		int i = (int)(it % (unsigned)n);

		for (int j = 0; j < 2; j++) {
			double t = 0;

			if (o->flags & BF_DROP) {
				long left = drop_cache(path[i][j], size);

				if (j == 0 && left > 0)
					left_warm++;
			}
			if (mode == RW_MMAP)
				rc = time_mmap(path[i][j], held[i][j], buf,
					       size, &t);
			else if (mode == RW_OPEN)
				rc = time_open(path[i][j], &t);
			else
				rc = time_read(path[i][j], held[i][j],
					       j ? 0 : oflags, buf, size,
					       o->bs, &t);
			if (rc) {
				fprintf(stderr, "bench_io: %s: %s\n",
					path[i][j], strerror(-rc));
				goto out_close;
			}
			add(j ? b : k, mode == RW_OPEN
					       ? 1 / t
					       : (double)size / t / 1e9);
		}
	}
	if (left_warm)
		printf("    note: %ld of %u drops left pages of the kvfs file "
		       "resident\n", left_warm, o->iters);
	report(o, mode == RW_OPEN ? "opens/s" : "GB/s", k, b);
	rc = 0;
out_close:
	for (int i = 0; i < n; i++)
		for (int j = 0; j < 2; j++)
			if (held[i][j] >= 0)
				close(held[i][j]);
out_free:
	free(buf);
	free(held);
	free(path);
	free(k);
	free(b);
	return rc;
}

/* ------------------------------------------------------------ extents */

/*
 * Print "NAME OFF LEN" for each block name given, from the metadata of an
 * unmounted store: the SSD baseline then reads real block extents.
 */
static int cmd_extents(const char *store, int n, char **names)
{
	struct kvfs_meta_txn *t = NULL;
	struct kvfs_meta *m = NULL;
	char dir[4096];
	int rc;

	snprintf(dir, sizeof(dir), "%s/meta", store);
	rc = kvfs_meta_open(dir, 0, 0, &m);
	if (rc) {
		fprintf(stderr, "bench_io: %s: %s\n", dir, strerror(-rc));
		return rc;
	}
	rc = kvfs_meta_txn_begin(m, true, &t);
	if (rc)
		goto out_meta;
	for (int i = 0; i < n; i++) {
		const char *base = strrchr(names[i], '/');
		uint8_t key[KVFS_KEY_LEN];
		struct kvfs_meta_blk r;

		base = base ? base + 1 : names[i];
		if (kvfs_fmt_name_parse(base, key)) {
			fprintf(stderr, "bench_io: %s is not a block name\n",
				base);
			continue;
		}
		if (kvfs_meta_blk_get(t, key, &r) || !r.ssd_off)
			continue;
		printf("%s %" PRIu64 " %" PRIu64 "\n", base, r.ssd_off,
		       r.ssd_len);
	}
	kvfs_meta_txn_abort(t);
out_meta:
	kvfs_meta_free(m);
	return rc;
}

/* ---------------------------------------------------------------- ssd */

struct extent_ent {
	char name[64];
	uint64_t off, len;
};

static int load_map(const char *path, struct extent_ent *e, unsigned max,
		    unsigned *n)
{
	FILE *f = fopen(path, "r");
	char line[256];

	if (!f) {
		int err = errno;

		fprintf(stderr, "bench_io: %s: %s\n", path, strerror(err));
		return -err;
	}
	*n = 0;
	while (*n < max && fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %" SCNu64 " %" SCNu64, e[*n].name,
			   &e[*n].off, &e[*n].len) == 3)
			(*n)++;
	fclose(f);
	return 0;
}

static bool tier_is_ssd_only(const char *path)
{
	char v[64];
	ssize_t n = getxattr(path, "user.kvfs.tier", v, sizeof(v) - 1);

	if (n < 0)
		return false;
	v[n] = 0;
	return !strcmp(v, "ssd");
}

/* One timed open(O_DIRECT) + pread of [off, off+len) + close. */
static int time_direct(const char *data, uint64_t off, uint64_t len,
		       uint8_t *buf, double *secs)
{
	double t0 = now_s();
	uint64_t done = 0;
	int fd, rc = 0;

	fd = open(data, O_RDONLY | O_DIRECT);
	if (fd < 0)
		return -errno;
	while (done < len) {
		ssize_t n = pread(fd, buf + done, len - done,
				  (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			break;
		}
		done += (uint64_t)n;
	}
	close(fd);
	*secs = now_s() - t0;
	return rc;
}

/*
 * The map's blocks are split alternately: even entries are read through
 * kvfs (only if user.kvfs.tier says "ssd" alone and their page cache is
 * gone), odd ones straight from their extent in the data file. No extent
 * is read twice, so neither side profits from a device or host cache
 * warmed by the other.
 */
static int cmd_ssd(const struct opts *o)
{
	struct samples *k = calloc(1, sizeof(*k)), *b = calloc(1, sizeof(*b));
	struct extent_ent *e = calloc(MAX_FILES, sizeof(*e));
	unsigned n = 0, skipped = 0;
	uint64_t maxlen = 0;
	uint8_t *buf = NULL;
	int rc = -ENOMEM;

	if (!k || !b || !e)
		goto out_free;
	if (!o->data || !o->map || !o->dir) {
		fprintf(stderr, "bench_io ssd: needs --data, --map and --dir\n");
		rc = -EINVAL;
		goto out_free;
	}
	rc = load_map(o->map, e, MAX_FILES, &n);
	if (rc)
		goto out_free;
	for (unsigned i = 0; i < n; i++)
		if (e[i].len > maxlen)
			maxlen = e[i].len;
	buf = alloc_buf(maxlen);
	if (!buf) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (unsigned i = 0; i + 1 < n && k->n < o->iters; i += 2) {
		char path[4096];
		size_t size = 0;
		double t = 0;

		snprintf(path, sizeof(path), "%s/%s", o->dir, e[i].name);
		if (!tier_is_ssd_only(path) || file_size(path, &size)) {
			skipped++;
			continue;
		}
		if (drop_cache(path, size) > 0) {
			skipped++;
			continue;
		}
		rc = time_read(path, -1,
			       (o->flags & BF_DIRECT) ? O_DIRECT : 0, buf,
			       size, o->bs ? o->bs : size, &t);
		if (rc) {
			fprintf(stderr, "bench_io: %s: %s\n", path,
				strerror(-rc));
			goto out_free;
		}
		add(k, (double)size / t / 1e9);
		/* Same byte count, rounded up to the O_DIRECT alignment
		 * exactly as kvfs rounds its extents.
		 */
		rc = time_direct(o->data, e[i + 1].off,
				 kvfs_util_align_up(size, ALIGN), buf, &t);
		if (rc) {
			fprintf(stderr, "bench_io: O_DIRECT %s at %" PRIu64
				": %s\n", o->data, e[i + 1].off,
				strerror(-rc));
			goto out_free;
		}
		add(b, (double)size / t / 1e9);
	}
	if (skipped)
		printf("    note: %u blocks skipped (not SSD-only, or cached)\n",
		       skipped);
	if (k->n < o->iters)
		printf("    note: only %u samples (%u wanted): give more blocks\n",
		       k->n, o->iters);
	report(o, "GB/s", k, b);
	rc = k->n ? 0 : -ENODATA;
out_free:
	free(buf);
	free(e);
	free(k);
	free(b);
	return rc;
}

/* ------------------------------------------------------------- create */

static int load_blocks(const char *dir, struct block_file *f, unsigned max,
		       unsigned *n)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int rc = 0;

	if (!d) {
		int err = errno;

		fprintf(stderr, "bench_io: %s: %s\n", dir, strerror(err));
		return -err;
	}
	*n = 0;
	while (*n < max && (de = readdir(d))) {
		char path[4096];
		size_t len = 0;
		int fd;

		if (!strstr(de->d_name, ".kv") ||
		    strlen(de->d_name) >= sizeof(f->name))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		rc = file_size(path, &len);
		if (rc)
			break;
		f[*n].buf = alloc_buf(len);
		if (!f[*n].buf) {
			rc = -ENOMEM;
			break;
		}
		fd = open(path, O_RDONLY);
		rc = fd < 0 ? -errno : read_all(fd, f[*n].buf, len, len);
		if (fd >= 0)
			close(fd);
		if (rc) {
			free(f[*n].buf);
			f[*n].buf = NULL;
			break;
		}
		f[*n].len = len;
		/* The length was checked above. */
		memcpy(f[*n].name, de->d_name, strlen(de->d_name) + 1);
		(*n)++;
	}
	closedir(d);
	return rc;
}

static int create_one(const char *dir, const struct block_file *f)
{
	char path[4096];
	size_t done = 0;
	int fd, rc = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, f->name);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0444);
	if (fd < 0)
		return -errno;
	while (done < f->len) {
		ssize_t n = write(fd, f->buf + done, f->len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			break;
		}
		done += (size_t)n;
	}
	/* kvfs validates and commits on close: its status counts. */
	if (close(fd) && !rc)
		rc = -errno;
	return rc;
}

/* Wait until the daemon's write-back queue is empty, so that every
 * repetition starts from the same state.
 */
static void drain(const char *stats)
{
	struct timespec ts = { 0, DRAIN_POLL_NS };

	for (unsigned i = 0; stats && i < DRAIN_MAX_POLLS; i++) {
		FILE *f = fopen(stats, "r");
		char line[256];
		long q = -1;

		if (!f)
			return;
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "writeback.queued %ld", &q) == 1)
				break;
		fclose(f);
		if (q <= 0)
			return;
		nanosleep(&ts, NULL);
	}
}

static int cmd_create(const struct opts *o, const char *src,
		      const char *kdir, const char *bdir)
{
	struct samples *k = calloc(1, sizeof(*k)), *b = calloc(1, sizeof(*b));
	struct block_file *f = calloc(MAX_FILES, sizeof(*f));
	const char *dir[2] = { kdir, bdir };
	unsigned n = 0;
	int rc = -ENOMEM;

	if (!k || !b || !f)
		goto out_free;
	rc = load_blocks(src, f, MAX_FILES, &n);
	if (rc)
		goto out_free;
	if (!n) {
		fprintf(stderr, "bench_io: no .kv files in %s\n", src);
		rc = -ENOENT;
		goto out_free;
	}
	for (unsigned r = 0; r < o->iters; r++) {
		for (int j = 0; j < 2; j++) {
			double t0 = now_s();

			for (unsigned i = 0; i < n; i++) {
				rc = create_one(dir[j], &f[i]);
				if (rc) {
					fprintf(stderr, "bench_io: create "
						"%s/%s: %s\n", dir[j],
						f[i].name, strerror(-rc));
					goto out_free;
				}
			}
			add(j ? b : k, n / (now_s() - t0));
		}
		/* Untimed: let write-back finish, then remove the blocks so
		 * the next repetition creates them anew.
		 */
		drain(o->stats);
		for (int j = 0; j < 2; j++)
			for (unsigned i = 0; i < n; i++) {
				char path[4096];

				snprintf(path, sizeof(path), "%s/%s", dir[j],
					 f[i].name);
				if (unlink(path))
					fprintf(stderr, "bench_io: unlink %s: "
						"%s\n", path, strerror(errno));
			}
	}
	printf("    (%u blocks of %zu bytes per repetition)\n", n, f[0].len);
	report(o, "creates/s", k, b);
	rc = 0;
out_free:
	for (unsigned i = 0; f && i < n; i++)
		free(f[i].buf);
	free(f);
	free(k);
	free(b);
	return rc;
}

/* --------------------------------------------------------------- main */

static void usage(FILE *out)
{
	fprintf(out,
		"usage:\n"
		"  bench_io read    [--drop] [--hold] [--direct] [--bs SIZE]\n"
		"                   KVFS_DIR BASE_DIR NAME...\n"
		"  bench_io mmap    [--hold] KVFS_DIR BASE_DIR NAME...\n"
		"  bench_io open    KVFS_DIR BASE_DIR NAME...  (open + close)\n"
		"  bench_io extents STORE FILE...  (the store unmounted)\n"
		"  bench_io ssd     --dir DIR --map MAPFILE --data DATAFILE\n"
		"                   [--direct] [--bs SIZE]\n"
		"  bench_io create  [--stats MNT/.kvfs/stats]\n"
		"                   SRC_DIR KVFS_DIR BASE_DIR\n"
		"common: --iters N (samples; repetitions for create),\n"
		"  --all (print every sample, sorted), --names K,B,\n"
		"  --label L, --target T, --summary FILE (appends\n"
		"  \"label|kvfs|base|unit|ratio|target\")\n"
		"Prints medians and the ratio kvfs/baseline; asserts nothing.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "iters", required_argument, NULL, 'i' },
		{ "bs", required_argument, NULL, 'b' },
		{ "drop", no_argument, NULL, 'D' },
		{ "hold", no_argument, NULL, 'H' },
		{ "direct", no_argument, NULL, 'O' },
		{ "all", no_argument, NULL, 'A' },
		{ "label", required_argument, NULL, 'l' },
		{ "summary", required_argument, NULL, 's' },
		{ "target", required_argument, NULL, 't' },
		{ "data", required_argument, NULL, 'd' },
		{ "map", required_argument, NULL, 'm' },
		{ "dir", required_argument, NULL, 'r' },
		{ "stats", required_argument, NULL, 'S' },
		{ "names", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .iters = 15 };
	const char *cmd;
	uint64_t v;
	char *comma;
	int c, rc;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
		usage(stdout);
		return 0;
	}
	optind = 2;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'i':
			if (kvfs_util_parse_u64(optarg, &v) || !v ||
			    v > MAX_SAMPLES) {
				fprintf(stderr, "bench_io: bad --iters %s\n",
					optarg);
				return 2;
			}
			o.iters = (unsigned)v;
			break;
		case 'b':
			if (kvfs_util_parse_size(optarg, &v) || !v) {
				fprintf(stderr, "bench_io: bad --bs %s\n",
					optarg);
				return 2;
			}
			o.bs = (size_t)v;
			break;
		case 'D':
			o.flags |= BF_DROP;
			break;
		case 'H':
			o.flags |= BF_HOLD;
			break;
		case 'O':
			o.flags |= BF_DIRECT;
			break;
		case 'A':
			o.flags |= BF_ALL;
			break;
		case 'l':
			o.label = optarg;
			break;
		case 's':
			o.summary = optarg;
			break;
		case 't':
			o.target = optarg;
			break;
		case 'd':
			o.data = optarg;
			break;
		case 'm':
			o.map = optarg;
			break;
		case 'r':
			o.dir = optarg;
			break;
		case 'S':
			o.stats = optarg;
			break;
		case 'n':
			comma = strchr(optarg, ',');
			if (!comma) {
				fprintf(stderr, "bench_io: --names K,B\n");
				return 2;
			}
			*comma = 0;
			o.kname = optarg;
			o.bname = comma + 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	argc -= optind;
	argv += optind;
	if (!o.bs)
		o.bs = SIZE_MAX;
	if (!strcmp(cmd, "read") && argc >= 3) {
		rc = cmd_rw(&o, RW_READ, argv[0], argv[1], argc - 2, argv + 2);
	} else if (!strcmp(cmd, "mmap") && argc >= 3) {
		rc = cmd_rw(&o, RW_MMAP, argv[0], argv[1], argc - 2, argv + 2);
	} else if (!strcmp(cmd, "open") && argc >= 3) {
		rc = cmd_rw(&o, RW_OPEN, argv[0], argv[1], argc - 2, argv + 2);
	} else if (!strcmp(cmd, "extents") && argc >= 1) {
		rc = cmd_extents(argv[0], argc - 1, argv + 1);
	} else if (!strcmp(cmd, "ssd") && argc == 0) {
		if (o.bs == SIZE_MAX)
			o.bs = 0;
		rc = cmd_ssd(&o);
	} else if (!strcmp(cmd, "create") && argc == 3) {
		rc = cmd_create(&o, argv[0], argv[1], argv[2]);
	} else {
		usage(stderr);
		return 2;
	}
	return rc ? 1 : 0;
}
