/* SPDX-License-Identifier: MIT */
/*
 * mkfs.kvfs [--ssd-size SIZE] [--force] STORE
 *
 * Makes a kvfs store (meta/store.h) and prints what it made.  Exit status
 * 0 on success, 1 with "mkfs.kvfs: <reason>" on stderr otherwise.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meta/log.h"
#include "meta/store.h"
#include "meta/util.h"

#define DEFAULT_SSD_SIZE "1G"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mkfs.kvfs [--ssd-size SIZE] [--force] STORE\n"
		"\n"
		"Make a kvfs store in the directory STORE: the LMDB metadata\n"
		"(STORE/meta), a preallocated SSD data file (STORE/data.kvd) and,\n"
		"if there is none, a default STORE/kvfs.conf.\n"
		"\n"
		"  -s, --ssd-size SIZE  size of the SSD data file, e.g. 64M, 10G\n"
		"                       (default " DEFAULT_SSD_SIZE
		", minimum 1M)\n"
		"  -f, --force          accept a non-empty STORE, replacing its kvfs\n"
		"                       metadata and data file (kvfs.conf is kept)\n"
		"  -h, --help           show this help\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...)
{
	va_list ap;

	fputs("mkfs.kvfs: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* A sentence for the errors kvfs_store_create() documents. */
static const char *create_reason(int rc)
{
	switch (rc) {
	case -ENOTEMPTY:
		return "directory not empty (use --force to replace a store)";
	case -EBUSY:
		return "store is in use (unmount it first)";
	case -ENOSPC:
		return "not enough space for the data file";
	default:
		return strerror(-rc);
	}
}

static int summary(const char *dir, bool conf_existed)
{
	struct kvfs_store *s;
	char uuid[37], total[32];
	int rc;

	rc = kvfs_store_open(dir, 0, 0, &s);
	if (rc)
		return fail("%s: created, but it does not open: %s", dir,
			    strerror(-rc));
	kvfs_store_uuid_str(s->sb.uuid, uuid);
	printf("kvfs store %s\n", s->dir);
	printf("  uuid       %s\n", uuid);
	printf("  data file  %s (%s: %llu bytes, %llu for blocks)\n",
	       s->data_path,
	       kvfs_util_fmt_size(s->sb.ssd_size, total, sizeof(total)),
	       (unsigned long long)s->sb.ssd_size,
	       (unsigned long long)(s->sb.ssd_size - s->sb.data_off));
	printf("  metadata   %s\n", s->meta_dir);
	printf("  config     %s (%s)\n", s->conf_path,
	       conf_existed ? "existing, kept" : "default written");
	kvfs_store_free(s);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "ssd-size", required_argument, NULL, 's' },
		{ "force", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *size_arg = DEFAULT_SSD_SIZE;
	char conf[4096];
	bool force = false, conf_existed;
	uint64_t size;
	int c, rc;

	while ((c = getopt_long(argc, argv, "s:fh", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			size_arg = optarg;
			break;
		case 'f':
			force = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			/* getopt_long() has said what was wrong. */
			return fail("see mkfs.kvfs --help");
		}
	}
	if (optind != argc - 1 || !*argv[optind])
		return fail("%s (see mkfs.kvfs --help)",
			    optind < argc - 1 ? "more than one STORE given" :
						"no STORE given");
	rc = kvfs_util_parse_size(size_arg, &size);
	if (rc)
		return fail("bad --ssd-size '%s': %s", size_arg,
			    rc == -ERANGE ? "too large" :
					    "expected a size such as 64M or 10G");
	if ((size & ~(uint64_t)(KVFS_STORE_DATA_OFF - 1)) < KVFS_STORE_MIN_SIZE)
		return fail("--ssd-size %s is below the minimum of 1M",
			    size_arg);

	/* Only errors on the terminal: the summary says what was made. */
	kvfs_log_set_level(KVFS_LOG_WARN);
	rc = kvfs_store_path(argv[optind], KVFS_STORE_CONF_FILE, conf,
			     sizeof(conf));
	if (rc)
		return fail("%s: path too long", argv[optind]);
	conf_existed = access(conf, F_OK) == 0;
	rc = kvfs_store_create(argv[optind], size, force);
	if (rc)
		return fail("%s: %s", argv[optind], create_reason(rc));
	return summary(argv[optind], conf_existed);
}
