/* SPDX-License-Identifier: MIT */
/*
 * Shared-memory regions the mount-level test clients hand to the daemon as
 * their "device memory" (peers) and completion words. Include after
 * <cmocka.h>. The object is named for the test and the process, and is
 * unlinked by shm_drop().
 */
#ifndef KVFS_TESTS_SHM_REGION_I_H
#define KVFS_TESTS_SHM_REGION_I_H

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

struct shm_region {
	char name[64];
	uint8_t *p;
	size_t len;
};

static inline void shm_make(struct shm_region *r, const char *tag,
			    size_t len)
{
	int fd;

	snprintf(r->name, sizeof(r->name), "/kvfs-test-%s-%d", tag,
		 (int)getpid());
	shm_unlink(r->name);
	fd = shm_open(r->name, O_RDWR | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	r->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(r->p != MAP_FAILED);
	r->len = len;
}

static inline void shm_drop(struct shm_region *r)
{
	munmap(r->p, r->len);
	shm_unlink(r->name);
}

#endif
