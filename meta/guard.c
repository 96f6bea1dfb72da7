/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include "meta/fmt.h"
#include "meta/guard.h"
#include "meta/log.h"

/* volatile: the compiler must not sink or drop the stores around a copy
 * it thinks cannot observe them.
 */
static __thread sigjmp_buf *volatile guard_jb;
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction guard_prev; /* guard_lock */

static void guard_handler(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf *jb = guard_jb;

	if (jb) {
		guard_jb = NULL;
		siglongjmp(*jb, 1);
	}
	/* Not a guarded copy: behave as if we were never installed. */
	sigaction(SIGBUS, &guard_prev, NULL);
	raise(sig);
}

/*
 * (Re)install the handler if someone else's is in place: a test harness or
 * a library may set its own SIGBUS handler after ours. One sigaction()
 * query per guarded copy is cheap next to the copy.
 */
static void guard_install(void)
{
	struct sigaction sa, cur;

	if (sigaction(SIGBUS, NULL, &cur) == 0 &&
	    (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == guard_handler)
		return;
	pthread_mutex_lock(&guard_lock);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = guard_handler;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &guard_prev))
		kvfs_err("cannot install the SIGBUS guard: %s",
			 strerror(errno));
	pthread_mutex_unlock(&guard_lock);
}

int kvfs_guard_memcpy(void *dst, const void *src, size_t len)
{
	sigjmp_buf jb;

	guard_install();
	if (sigsetjmp(jb, 1))
		return -EFAULT;
	guard_jb = &jb;
	__asm__ volatile("" ::: "memory");
	memcpy(dst, src, len);
	__asm__ volatile("" ::: "memory");
	guard_jb = NULL;
	return 0;
}

int kvfs_guard_crc32c(uint32_t *crc, const void *src, size_t len)
{
	sigjmp_buf jb;
	uint32_t v = *crc;

	guard_install();
	if (sigsetjmp(jb, 1))
		return -EFAULT;
	guard_jb = &jb;
	__asm__ volatile("" ::: "memory");
	v = kvfs_fmt_crc32c(v, src, len);
	__asm__ volatile("" ::: "memory");
	guard_jb = NULL;
	*crc = v;
	return 0;
}

int kvfs_guard_store_u32(uint32_t *p, uint32_t v)
{
	sigjmp_buf jb;

	guard_install();
	if (sigsetjmp(jb, 1))
		return -EFAULT;
	guard_jb = &jb;
	__asm__ volatile("" ::: "memory");
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
	__asm__ volatile("" ::: "memory");
	guard_jb = NULL;
	return 0;
}
