/* SPDX-License-Identifier: MIT */
/*
 * Delivery into the caller's memory: the completion ("sync") words that
 * FETCH_INTO and FETCH_CHUNKS signal layer by layer, and what a session
 * keeps between requests to deliver faster (the caller's memory opened
 * once, a host stage pinned once).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cache/ctl_i.h"
#include "meta/fmt.h"
#include "meta/guard.h"
#include "meta/log.h"

/* Client memory the caller may not open itself: logged, and the
 * response fails with EACCES. Returns -EACCES.
 */
static int refuse_mem(struct kvfs_ctl_ctx *x, const char *name,
		      const char *what)
{
	kvfs_warn("ctl: uid %u may not %s in namespace %s: it cannot open "
		  "the %s %s itself (EACCES); nothing copied",
		  x->cr->uid, x->r->op == KVFS_CTL_SAVE ? "SAVE from" :
							  "deliver into",
		  x->ns ? kvfs_ns_name(x->ns) : "-", what, name);
	x->resp->error = -EACCES;
	return -EACCES;
}

/* shm_open(@name, O_RDWR) as the caller would: a descriptor or -errno. */
static int mem_open_as_caller(struct kvfs_ctl_ctx *x, const char *name)
{
	struct kvfs_ctl_ident id;
	int fd, rc;

	rc = kvfs_ctl_ident_enter(x->cr, &id);
	if (rc)
		return rc;
	fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
	rc = fd < 0 ? -errno : fd;
	kvfs_ctl_ident_leave(&id);
	return rc;
}

int kvfs_ctl_sync_open(struct kvfs_ctl_ctx *x, struct kvfs_ctl_sync_word *sw)
{
	const struct kvfs_ctl_sync *s = &x->r->sync;
	struct stat st;
	int fd;

	memset(sw, 0, sizeof(*sw));
	if (!memchr(s->shm_name, 0, sizeof(s->shm_name)) ||
	    s->shm_name[0] != '/' || strchr(s->shm_name + 1, '/') ||
	    (s->off & 3))
		return kvfs_ctl_fail(x, -EINVAL, "%s",
				     "bad sync word (shm name or "
				     "alignment)"),
		       -EINVAL;
	fd = mem_open_as_caller(x, s->shm_name);
	if (fd == -EACCES)
		return refuse_mem(x, s->shm_name, "sync word");
	if (fd < 0)
		return kvfs_ctl_fail(x, -ENOENT, "sync shm %s does not exist",
				     s->shm_name),
		       -ENOENT;
	/* Not s->off + 4 <= size: an offset near 2^64 would wrap past it
	 * and put the word before the mapping.
	 */
	if (fstat(fd, &st) || st.st_size < 4 ||
	    s->off > (uint64_t)st.st_size - 4) {
		close(fd);
		return kvfs_ctl_fail(x, -EINVAL, "sync word outside shm %s",
				     s->shm_name),
		       -EINVAL;
	}
	sw->len = (size_t)st.st_size;
	sw->map =
		mmap(NULL, sw->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (sw->map == MAP_FAILED) {
		sw->map = NULL;
		return kvfs_ctl_fail(x, -EIO, "%s", "cannot map the sync word"),
		       -EIO;
	}
	sw->w = (uint32_t *)((uint8_t *)sw->map + s->off);
	return 0;
}

void kvfs_ctl_sync_signal(struct kvfs_ctl_sync_word *sw, uint32_t v)
{
	/* The word lives in the caller's object, which it may shrink. */
	if (kvfs_guard_store_u32(sw->w, v)) {
		kvfs_warn("ctl: the sync word's shm object shrank");
		return;
	}
	/* Shared futex: waiters in other processes wake on this word. */
	syscall(SYS_futex, sw->w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

void kvfs_ctl_sync_close(struct kvfs_ctl_sync_word *sw)
{
	if (sw->map)
		munmap(sw->map, sw->len);
}

/*
 * A shm peer is opened with the caller's filesystem identity, so the
 * kernel lets the daemon in only where the caller could go itself. A
 * CUDA IPC handle names no owner the daemon could check (docs/ctl.md).
 */
int kvfs_ctl_peer_open(struct kvfs_ctl_ctx *x, const struct kvfs_ctl_mem *m,
		       struct kvfs_gpu_peer **out)
{
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	struct kvfs_ctl_ident id;
	int rc;

	if (m->backend != KVFS_CTL_BACKEND_SHM)
		return x->c->gops->peer_open(gpu, m, out);
	rc = kvfs_ctl_ident_enter(x->cr, &id);
	if (!rc)
		rc = x->c->gops->peer_open(gpu, m, out);
	kvfs_ctl_ident_leave(&id);
	if (rc == -EACCES)
		refuse_mem(x, memchr(m->shm_name, 0, sizeof(m->shm_name)) ?
				      m->shm_name :
				      "(unterminated name)",
			   "shm object");
	return rc;
}

int kvfs_ctl_peer_get(struct kvfs_ctl_ctx *x, const struct kvfs_ctl_mem *m,
		      struct kvfs_gpu_peer **out, bool *kept)
{
	struct kvfs_tier *gpu = x->c->tier[KVFS_TIER_GPU];
	const struct kvfs_gpu_ops *go = x->c->gops;
	struct kvfs_ctl_session *s = x->s;
	struct kvfs_ctl_ident id;
	bool same;
	int rc;

	*kept = false;
	if (!go->peer_same || pthread_mutex_trylock(&s->peer_lock))
		return kvfs_ctl_peer_open(x, m, out);
	/* The kept peer serves only whoever opened it, and only while the
	 * name still leads to it for them.
	 */
	same = s->peer && s->peer_uid == x->cr->uid &&
	       s->peer_gid == x->cr->gid;
	if (same && m->backend == KVFS_CTL_BACKEND_SHM) {
		same = !kvfs_ctl_ident_enter(x->cr, &id) &&
		       go->peer_same(gpu, s->peer, m);
		kvfs_ctl_ident_leave(&id);
	} else if (same) {
		same = go->peer_same(gpu, s->peer, m);
	}
	if (same) {
		*out = s->peer;
		*kept = true;
		return 0;
	}
	if (s->peer) {
		go->peer_close(gpu, s->peer);
		s->peer = NULL;
	}
	rc = kvfs_ctl_peer_open(x, m, &s->peer);
	if (rc) {
		s->peer = NULL;
		pthread_mutex_unlock(&s->peer_lock);
		return rc;
	}
	s->peer_uid = x->cr->uid;
	s->peer_gid = x->cr->gid;
	*out = s->peer;
	*kept = true;
	return 0;
}

void kvfs_ctl_peer_put(struct kvfs_ctl_ctx *x, struct kvfs_gpu_peer *p,
		       bool kept)
{
	if (kept)
		pthread_mutex_unlock(&x->s->peer_lock);
	else if (p)
		x->c->gops->peer_close(x->c->tier[KVFS_TIER_GPU], p);
}

/* Pin the session's new stage for DMA to a cuda peer (see stage_pinned).
 * Caller holds s->stage_lock.  A failure is the tier's log line, once.
 */
static void stage_pin(struct kvfs_cache *c, struct kvfs_ctl_session *s)
{
	struct kvfs_tier *gpu = c->tier[KVFS_TIER_GPU];

	if (!s->stage || s->stage_pin_tried || !gpu ||
	    !c->gops->host_register || strcmp(gpu->ops->name, "cuda"))
		return;
	s->stage_pin_tried = true;
	s->stage_pinned = c->gops->host_register(gpu, s->stage, s->stage_len) ==
			  0;
	/* A later, larger stage may be pinned in its place. */
	if (s->stage_pinned)
		s->stage_pin_tried = false;
}

/* Caller holds s->stage_lock, or is the session's last user. */
static void stage_unpin(struct kvfs_cache *c, struct kvfs_ctl_session *s)
{
	if (!s->stage_pinned)
		return;
	c->gops->host_unregister(c->tier[KVFS_TIER_GPU], s->stage);
	s->stage_pinned = false;
}

uint8_t *kvfs_ctl_stage_get(struct kvfs_ctl_ctx *x, size_t need, bool *own)
{
	uint8_t *stage = NULL;

	*own = true;
	if (pthread_mutex_trylock(&x->s->stage_lock) == 0) {
		if (x->s->stage_len < need) {
			stage_unpin(x->c, x->s);
			free(x->s->stage);
			if (posix_memalign((void **)&x->s->stage,
					   KVFS_FMT_ALIGN, need))
				x->s->stage = NULL;
			x->s->stage_len = x->s->stage ? need : 0;
			stage_pin(x->c, x->s);
		}
		stage = x->s->stage;
		*own = !stage;
		if (!stage)
			pthread_mutex_unlock(&x->s->stage_lock);
	}
	if (!stage && posix_memalign((void **)&stage, KVFS_FMT_ALIGN, need))
		stage = NULL;
	return stage;
}

void kvfs_ctl_stage_put(struct kvfs_ctl_ctx *x, uint8_t *stage, bool own)
{
	if (own)
		free(stage);
	else
		pthread_mutex_unlock(&x->s->stage_lock);
}

void kvfs_ctl_kept_release(struct kvfs_ctl_session *s)
{
	struct kvfs_cache *c = s->c;

	if (s->peer)
		c->gops->peer_close(c->tier[KVFS_TIER_GPU], s->peer);
	s->peer = NULL;
	stage_unpin(c, s);
	free(s->stage);
	s->stage = NULL;
}
