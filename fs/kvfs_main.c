/* SPDX-License-Identifier: MIT */
/*
 * kvfs - mount a kvfs store.
 *
 *   kvfs [-f] [-d] [-c CONFIG] [-o FUSE_OPTIONS] STORE MOUNTPOINT
 *
 * Without -f the command returns once the mount is ready (or failed, with
 * the reason on stderr): the child does all the work and reports through a
 * pipe, so no thread or LMDB handle ever crosses a fork.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef KVFS_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "cache/cache.h"
#include "fs/conf.h"
#include "fs/fuse_ops.h"
#include "fs/metrics.h"
#include "meta/fmt.h"
#include "meta/log.h"

struct opts {
	bool foreground;
	bool debug;
	const char *config;
	const char *fuse_opts;
	const char *store;
	const char *mnt;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvfs [-f] [-d] [-c CONFIG] [-o FUSE_OPTIONS] STORE "
		"MOUNTPOINT\n"
		"  -f          stay in the foreground, log to stderr\n"
		"  -d          debug logging (implies -f)\n"
		"  -c CONFIG   config file (default STORE/kvfs.conf)\n"
		"  -o OPTS     FUSE mount options, e.g. allow_other\n"
		"Unmount with: fusermount3 -u MOUNTPOINT\n");
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	memset(o, 0, sizeof(*o));
	while ((ch = getopt_long(argc, argv, "+fdc:o:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'f':
			o->foreground = true;
			break;
		case 'd':
			o->debug = o->foreground = true;
			break;
		case 'c':
			o->config = optarg;
			break;
		case 'o':
			o->fuse_opts = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return -EINVAL;
		}
	}
	if (argc - optind != 2)
		return -EINVAL;
	o->store = argv[optind];
	o->mnt = argv[optind + 1];
	return 0;
}

/*
 * Tell systemd (kvfs@.service, Type=notify) where the daemon stands: a
 * no-op outside a unit or without libsystemd.
 */
static void svc_notify(const char *state, const char *store)
{
#ifdef KVFS_HAVE_SYSTEMD
	sd_notifyf(0, "%s\nSTATUS=%s %s", state,
		   strcmp(state, "READY=1") ? "writing back, then closing" :
					      "serving",
		   store);
#endif
}

/* Report to the waiting parent: "" for ready, else the reason. */
static void notify(int fd, const char *msg)
{
	if (fd < 0)
		return;
	if (write(fd, msg, strlen(msg) + 1) < 0)
		return;
	close(fd);
}

/*
 * Names the engine deleted on its own (evictions, discards) are still in
 * the kernel's dentry cache for up to the entry timeout.  Invalidating
 * the name itself takes the directory's lock in the kernel, which a
 * client holds while it waits for us: a daemon killed while this thread
 * waited for it could never exit, and so never release the clients (the
 * post-kill hang).  So only the inode's cached attributes are invalidated
 * (no lock a request holds), and the name is left to time out: a path
 * through it asks for the attributes, gets ESTALE for a block that is
 * gone (fs/fuse_ops.c), and the kernel looks the name up again, and an
 * O_EXCL create always looks it up.  Done from this thread so that the
 * engine's threads never write to /dev/fuse.
 *
 * A ctl request that deleted blocks (EVICT --tier all) waits for their
 * invalidations before it is answered (inval_sync), so that a stat after
 * kvfsctl returns does not find the attributes the kernel cached: the
 * same manners as an unlink.
 */
struct inval {
	struct inval *next;
	uint64_t ino;
};

static struct {
	pthread_mutex_t lock; /* guards head, stop */
	pthread_cond_t cond; /* head or stop changed */
	pthread_cond_t sent; /* done grew */
	struct inval *head;
	bool stop;
	/* Invalidations queued and sent since the start: written under
	 * lock, read without it by inval_sync()'s fast path.
	 */
	atomic_uint_least64_t queued, done;
	struct fuse_session *se;
} notifier = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
	.sent = PTHREAD_COND_INITIALIZER,
};

/* The longest a ctl reply waits for invalidations: past it the kernel's
 * attributes merely time out (attr_timeout).
 */
#define INVAL_SYNC_MS 2000

static void inval_push(void *arg, uint64_t dir, uint64_t ino, const char *name)
{
	struct inval *iv = calloc(1, sizeof(*iv));

	if (!iv)
		return; /* the attributes merely time out */
	iv->ino = ino;
	pthread_mutex_lock(&notifier.lock);
	iv->next = notifier.head;
	notifier.head = iv;
	atomic_fetch_add(&notifier.queued, 1);
	pthread_cond_signal(&notifier.cond);
	pthread_mutex_unlock(&notifier.lock);
}

static void *notifier_main(void *arg)
{
	pthread_mutex_lock(&notifier.lock);
	for (;;) {
		while (!notifier.head && !notifier.stop)
			pthread_cond_wait(&notifier.cond, &notifier.lock);
		struct inval *iv = notifier.head;
		uint64_t n = 0;

		notifier.head = NULL;
		pthread_mutex_unlock(&notifier.lock);
		while (iv) {
			struct inval *next = iv->next;

			/* A negative offset: attributes only, no page
			 * locks (a reader may hold one while it waits).
			 */
			if (!notifier.stop)
				fuse_lowlevel_notify_inval_inode(notifier.se,
								 iv->ino, -1, 0);
			free(iv);
			iv = next;
			n++;
		}
		pthread_mutex_lock(&notifier.lock);
		atomic_fetch_add(&notifier.done, n);
		pthread_cond_broadcast(&notifier.sent);
		if (notifier.stop && !notifier.head)
			break;
	}
	pthread_mutex_unlock(&notifier.lock);
	return NULL;
}

/* Wait until every invalidation queued so far is sent (or the notifier
 * stops, or INVAL_SYNC_MS pass).  Lock-free when none is pending, which
 * is every ctl request but those that deleted blocks.
 */
static void inval_sync(void)
{
	uint64_t want = atomic_load(&notifier.queued);
	struct timespec dl;

	if (atomic_load(&notifier.done) >= want)
		return;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += INVAL_SYNC_MS / 1000;
	dl.tv_nsec += (INVAL_SYNC_MS % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&notifier.lock);
	while (atomic_load(&notifier.done) < want && !notifier.stop)
		if (pthread_cond_timedwait(&notifier.sent, &notifier.lock,
					   &dl) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&notifier.lock);
}

/* STORE/kvfs.pid lets scripts wait for the daemon to finish after an
 * unmount (fusermount3 -u returns before the final write-back is done).
 */
static void write_pidfile(const char *store)
{
	char path[PATH_MAX];
	FILE *f;

	snprintf(path, sizeof(path), "%s/kvfs.pid", store);
	f = fopen(path, "w");
	if (!f) {
		kvfs_warn("cannot write %s: %s", path, strerror(errno));
		return;
	}
	fprintf(f, "%ld\n", (long)getpid());
	fclose(f);
}

/*
 * The kernel reads ahead 128 KiB on a FUSE mount unless told otherwise;
 * blocks are megabytes and read whole, so ask for @bytes, a whole block
 * (kvfs_fs_readahead()): its READs then go out together instead of each
 * after the reader consumed the last. Best effort: without it reads are
 * merely slower.
 */
static void raise_readahead(const char *mnt, uint32_t bytes)
{
	char real[PATH_MAX], line[PATH_MAX + 256], path[128], dev[32];
	char point[PATH_MAX];
	bool found = false;
	FILE *f;

	/* Not stat(): nothing serves the mount yet. mountinfo names its
	 * device without asking it.
	 */
	if (!realpath(mnt, real))
		return;
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%*d %*d %31s %*s %4095s", dev, point) == 2 &&
			!strcmp(point, real) && strstr(line, " fuse");
	fclose(f);
	if (!found)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb", dev);
	f = fopen(path, "w");
	if (!f) {
		kvfs_dbg("cannot raise read-ahead (%s): %s", path,
			 strerror(errno));
		return;
	}
	fprintf(f, "%u\n", bytes >> 10);
	if (fclose(f))
		kvfs_dbg("cannot raise read-ahead: %s", strerror(errno));
}

static int run(const struct opts *o, int report_fd)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_loop_config *lc = NULL;
	struct fuse_session *se = NULL;
	struct kvfs_cache *c = NULL;
	struct kvfs_metrics *metrics = NULL;
	struct kvfs_conf conf;
	struct kvfs_fs fs = { .entry_timeout = 1.0, .attr_timeout = 1.0 };
	char path[PATH_MAX], logpath[PATH_MAX] = "/dev/null";
	char msg[PATH_MAX + 512];
	bool mounted = false, nt_started = false;
	pthread_t nt;
	int rc;

	if (o->config)
		snprintf(path, sizeof(path), "%s", o->config);
	else
		snprintf(path, sizeof(path), "%s/kvfs.conf", o->store);
	kvfs_conf_defaults(&conf);
	rc = kvfs_conf_load(path, &conf);
	if (rc) {
		snprintf(msg, sizeof(msg), "config %s: %s (see the log lines "
			 "above)", path, strerror(-rc));
		goto out_notify;
	}
	kvfs_log_set_level(o->debug ? KVFS_LOG_DEBUG : conf.log_level);
	snprintf(path, sizeof(path), "%s/meta", o->store);
	/* Not a store: say so on the terminal, leave no log file behind. */
	if (!o->foreground && access(path, F_OK) == 0) {
		if (conf.log_file[0])
			snprintf(path, sizeof(path), "%s", conf.log_file);
		else
			snprintf(path, sizeof(path), "%s/kvfs.log", o->store);
		rc = kvfs_log_open(path);
		snprintf(logpath, sizeof(logpath), "%s", path);
		if (rc) {
			snprintf(msg, sizeof(msg), "log file %s: %s", path,
				 strerror(-rc));
			goto out_notify;
		}
	}
	/* Block buffers come and go at the DRAM tier's rate: keep freed ones
	 * in the heap for reuse instead of returning them to the kernel and
	 * faulting fresh pages in for the next block.
	 */
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD,
		(int)(conf.cache.dram_capacity < (1u << 30) ? conf.cache.dram_capacity
						      : (1u << 30)));
	/* The cache's network threads (the remote tier, fleet sightings)
	 * write to peers that may be gone: that must be EPIPE, not the end
	 * of the daemon, from before the FUSE session sets its handlers
	 * until after the unmount's last flush.
	 */
	signal(SIGPIPE, SIG_IGN);
	rc = kvfs_cache_open(o->store, &conf.cache, 0, &c);
	if (rc) {
		snprintf(msg, sizeof(msg), "store %s: %s (the log says why)",
			 o->store, strerror(-rc));
		goto out_notify;
	}
	fs.c = c;
	fs.readahead = kvfs_fs_readahead(c);

	if (fuse_opt_add_arg(&args, "kvfs") ||
	    fuse_opt_add_arg(&args, "-o") ||
	    fuse_opt_add_arg(&args, "fsname=kvfs,subtype=kvfs,"
				    "default_permissions") ||
	    (o->fuse_opts && (fuse_opt_add_arg(&args, "-o") ||
			      fuse_opt_add_arg(&args, o->fuse_opts)))) {
		snprintf(msg, sizeof(msg), "out of memory");
		rc = -ENOMEM;
		goto out_free_cache;
	}
	se = fuse_session_new(&args, &kvfs_fuse_ops, sizeof(kvfs_fuse_ops),
			      &fs);
	if (!se) {
		snprintf(msg, sizeof(msg), "bad FUSE options '%s'",
			 o->fuse_opts ? o->fuse_opts : "");
		rc = -EINVAL;
		goto out_free_cache;
	}
	if (fuse_set_signal_handlers(se)) {
		snprintf(msg, sizeof(msg), "cannot install signal handlers");
		rc = -EIO;
		goto out_destroy;
	}
	if (fuse_session_mount(se, o->mnt)) {
		snprintf(msg, sizeof(msg), "cannot mount on %s (does it exist, "
			 "and is /dev/fuse usable?)", o->mnt);
		rc = -EIO;
		goto out_signals;
	}
	kvfs_info("mounted %s on %s (%zu namespaces, policy %s)", o->store,
		  o->mnt, kvfs_cache_ns_count(c), conf.cache.policy);
	write_pidfile(o->store);
	raise_readahead(o->mnt, fs.readahead);
	mounted = true;
	/* Once mounted, so that a scrape never sees a store that is not
	 * served; a port that cannot be had stops the start, as a bad
	 * config line would.
	 */
	if (conf.metrics[0]) {
		rc = kvfs_metrics_start(c, conf.metrics, &metrics);
		if (rc) {
			snprintf(msg, sizeof(msg), "metrics %s: %s (the log "
				 "says why)", conf.metrics, strerror(-rc));
			goto out_unmount;
		}
	}
	notify(report_fd, "");
	report_fd = -1;
	svc_notify("READY=1", o->store);
	if (!o->foreground) {
		/* Detach from the terminal; anything a library or a
		 * sanitizer prints still lands in the log.
		 */
		int lfd = open(logpath, O_WRONLY | O_APPEND | O_CLOEXEC);

		if (lfd >= 0) {
			dup2(lfd, STDERR_FILENO);
			close(lfd);
		}
	}

	notifier.se = se;
	if (pthread_create(&nt, NULL, notifier_main, NULL) == 0) {
		nt_started = true;
		fs.inval_sync = inval_sync;
		kvfs_cache_set_delete_hook(c, inval_push, NULL);
	}
	lc = fuse_loop_cfg_create();
	if (!lc) {
		rc = -ENOMEM;
		goto out_unmount;
	}
	fuse_loop_cfg_set_clone_fd(lc, 0);
	fuse_loop_cfg_set_max_threads(lc, conf.threads);
	fuse_loop_cfg_set_idle_threads(lc, conf.threads / 2 ? conf.threads / 2 : 1);
	rc = fuse_session_loop_mt(se, lc);
	fuse_loop_cfg_destroy(lc);
	rc = rc > 0 ? 0 : rc;
	svc_notify("STOPPING=1", o->store);
	/* The kernel has let go of the mount: no scrape outlives it. */
	kvfs_metrics_stop(metrics);
	metrics = NULL;
	kvfs_cache_set_delete_hook(c, NULL, NULL);
	if (nt_started) {
		pthread_mutex_lock(&notifier.lock);
		notifier.stop = true;
		pthread_cond_signal(&notifier.cond);
		pthread_cond_broadcast(&notifier.sent);
		pthread_mutex_unlock(&notifier.lock);
		pthread_join(nt, NULL);
	}
out_unmount:
	kvfs_metrics_stop(metrics);
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
	/* That restores SIGPIPE's default, which kills; see above. */
	signal(SIGPIPE, SIG_IGN);
out_destroy:
	fuse_session_destroy(se);
out_free_cache:
	fuse_opt_free_args(&args);
	if (mounted) {
		/* The pid file is ours while we hold the store. */
		snprintf(path, sizeof(path), "%s/kvfs.pid", o->store);
		unlink(path);
	}
	/* Persists every committed block before returning. */
	kvfs_cache_free(c);
	if (mounted)
		kvfs_info("unmounted %s", o->mnt);
out_notify:
	if (rc && report_fd >= 0) {
		kvfs_err("%s", msg);
		notify(report_fd, msg);
	}
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int pfd[2];
	pid_t pid;

	if (parse_args(argc, argv, &o)) {
		usage(stderr);
		return 2;
	}
	if (o.foreground)
		return run(&o, -1);

	if (pipe2(pfd, O_CLOEXEC)) {
		perror("kvfs: pipe");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("kvfs: fork");
		return 1;
	}
	if (pid == 0) {
		int nul;

		close(pfd[0]);
		setsid();
		/* Keep stderr until the log file is open; then detach. */
		nul = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (nul >= 0) {
			dup2(nul, STDIN_FILENO);
			dup2(nul, STDOUT_FILENO);
		}
		int rc = run(&o, pfd[1]);
		_exit(rc);
	}
	close(pfd[1]);
	char buf[PATH_MAX + 512];
	ssize_t n, got = 0;

	while ((n = read(pfd[0], buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
		got += n;
	buf[got > 0 ? got : 0] = 0;
	if (got > 0 && buf[0] == 0)
		return 0; /* mounted */
	fprintf(stderr, "kvfs: %s\n", got > 0 ? buf : "daemon exited before "
			"the mount was ready (see the log)");
	return 1;
}
