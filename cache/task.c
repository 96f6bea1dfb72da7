/* SPDX-License-Identifier: MIT */
/*
 * Background duties.  The mover thread and the periodic tasks it runs:
 * each module that owns a duty (promotion, lease reclaim, the counter
 * flush, the chunk-score flush) registers it from its own init, so the
 * mover calls nothing above it.  And the count of detached background
 * jobs that shutdown waits for.
 */
#include <errno.h>
#include <time.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_task_add(struct kvfs_cache *c, const char *name,
		  int (*fn)(struct kvfs_cache *c))
{
	if (c->n_tasks == KVFS_TASKS_MAX) {
		kvfs_err("no room for periodic task '%s' (KVFS_TASKS_MAX %d)",
			 name, KVFS_TASKS_MAX);
		return -ENOSPC;
	}
	c->tasks[c->n_tasks].name = name;
	c->tasks[c->n_tasks].fn = fn;
	c->n_tasks++;
	return 0;
}

void kvfs_task_run(struct kvfs_cache *c)
{
	/* Errors are the tasks' own to log; the next round tries again. */
	for (unsigned i = 0; i < c->n_tasks; i++)
		c->tasks[i].fn(c);
}

/* The mover thread: every flush period, feeds batched accesses to the
 * policy, lets it tick, then runs the registered tasks.
 */
static void *mv_main(void *arg)
{
	struct kvfs_cache *c = arg;
	struct timespec ts;

	pthread_mutex_lock(&c->mv_lock);
	while (!c->mv_stop) {
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec +
			      (uint64_t)c->conf.flush_ms * 1000000ull;
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		pthread_cond_timedwait(&c->mv_cond, &c->mv_lock, &ts);
		if (c->mv_stop)
			break;
		pthread_mutex_unlock(&c->mv_lock);

		pthread_mutex_lock(&c->policy_lock);
		kvfs_cache_drain_touches(c);
		struct kvfs_paccess a = { .now = kvfs_util_now_real() };
		kvfs_policy_tick(c->policy, &a);
		pthread_mutex_unlock(&c->policy_lock);
		kvfs_task_run(c);

		pthread_mutex_lock(&c->mv_lock);
	}
	pthread_mutex_unlock(&c->mv_lock);
	return NULL;
}

int kvfs_task_start(struct kvfs_cache *c)
{
	int rc;

	if (c->flags & KVFS_CACHE_NOTHREADS)
		return 0;
	rc = -pthread_create(&c->mv_thread, NULL, mv_main, c);
	if (rc)
		return rc;
	c->mv_started = true;
	return 0;
}

void kvfs_task_stop(struct kvfs_cache *c)
{
	if (!c->mv_started)
		return;
	pthread_mutex_lock(&c->mv_lock);
	c->mv_stop = true;
	pthread_cond_signal(&c->mv_cond);
	pthread_mutex_unlock(&c->mv_lock);
	pthread_join(c->mv_thread, NULL);
	c->mv_started = false;
}

/* ------------------------------------------------------ background jobs */

void kvfs_bg_begin(struct kvfs_cache *c)
{
	pthread_mutex_lock(&c->bg_lock);
	c->bg_jobs++;
	pthread_mutex_unlock(&c->bg_lock);
}

void kvfs_bg_end(struct kvfs_cache *c)
{
	pthread_mutex_lock(&c->bg_lock);
	if (--c->bg_jobs == 0)
		pthread_cond_broadcast(&c->bg_cond);
	pthread_mutex_unlock(&c->bg_lock);
}
