/* SPDX-License-Identifier: MIT */
/*
 * The write-back queue, and the list of blocks stalled for SSD space that
 * the next extent given back puts on it again.  Below deletion, which
 * gives extents back, and the write-back pass, which takes from it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_i.h"
#include "meta/log.h"
#include "meta/util.h"

void kvfs_wb_enqueue(struct kvfs_cache *c, struct kvfs_block *b)
{
	kvfs_block_get_ref(b);
	atomic_fetch_or(&b->flags, KVFS_B_QUEUED);
	pthread_mutex_lock(&c->wb_lock);
	b->wb_next = NULL;
	if (c->wb_tail)
		c->wb_tail->wb_next = b;
	else
		c->wb_head = b;
	c->wb_tail = b;
	c->wb_queued++;
	pthread_cond_signal(&c->wb_cond);
	pthread_mutex_unlock(&c->wb_lock);
}

/*
 * A block the SSD has no room for (everything there pinned or open) waits
 * on the stalled list, with fsync reporting ENOSPC meanwhile; the next
 * extent given back puts it on the queue again.
 */
void kvfs_wb_stall(struct kvfs_cache *c, struct kvfs_block *b, int rc)
{
	kvfs_block_get_ref(b);
	atomic_store(&b->wb_err, rc);
	atomic_fetch_or(&b->flags, KVFS_B_WBERR);
	pthread_mutex_lock(&c->wb_lock);
	b->wb_next = c->wb_stalled;
	c->wb_stalled = b;
	atomic_fetch_add(&c->wb_nstalled, 1);
	pthread_mutex_unlock(&c->wb_lock);
}

void kvfs_wb_unstall(struct kvfs_cache *c)
{
	struct kvfs_block *b, *next;

	if (!atomic_load(&c->wb_nstalled))
		return;
	pthread_mutex_lock(&c->wb_lock);
	b = c->wb_stalled;
	c->wb_stalled = NULL;
	atomic_store(&c->wb_nstalled, 0);
	pthread_mutex_unlock(&c->wb_lock);
	for (; b; b = next) {
		next = b->wb_next;
		atomic_fetch_and(&b->flags, ~(unsigned)KVFS_B_WBERR);
		atomic_store(&b->wb_err, 0);
		b->wb_tries = 0;
		if (!(atomic_load(&b->flags) & KVFS_B_DELETED))
			kvfs_wb_enqueue(c, b);
		kvfs_cache_put(c, b);
	}
}
