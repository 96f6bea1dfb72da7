/* SPDX-License-Identifier: MIT */
/*
 * Guarded copies: a mapping whose object shrank raises SIGBUS on access;
 * the guard turns that into -EFAULT and the process lives on.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "meta/guard.h"

static uint8_t *map_shrunk(int *fd)
{
	char name[64];
	uint8_t *p;

	snprintf(name, sizeof(name), "/kvfs-test-guard-%d", (int)getpid());
	shm_unlink(name);
	*fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	assert_true(*fd >= 0);
	shm_unlink(name);
	assert_int_equal(ftruncate(*fd, 8192), 0);
	p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 7, 8192);
	/* The owner shrinks it: the second page is gone. */
	assert_int_equal(ftruncate(*fd, 4096), 0);
	return p;
}

static void test_copy_ok(void **state)
{
	char a[64] = "hello", b[64] = { 0 };
	uint32_t w = 0;

	assert_int_equal(kvfs_guard_memcpy(b, a, sizeof(a)), 0);
	assert_string_equal(b, "hello");
	assert_int_equal(kvfs_guard_store_u32(&w, 42), 0);
	assert_int_equal(w, 42);
}

static void test_shrunk_object(void **state)
{
	uint8_t buf[8192];
	int fd;
	uint8_t *p = map_shrunk(&fd);

	/* The first page is still there... */
	assert_int_equal(kvfs_guard_memcpy(buf, p, 4096), 0);
	assert_int_equal(buf[100], 7);
	/* ...the second faults, in both directions, and we survive. */
	assert_int_equal(kvfs_guard_memcpy(buf, p + 4096, 4096), -EFAULT);
	assert_int_equal(kvfs_guard_memcpy(p + 4096, buf, 4096), -EFAULT);
	assert_int_equal(kvfs_guard_store_u32((uint32_t *)(p + 4100), 1),
			 -EFAULT);
	/* and the guard still works afterwards */
	assert_int_equal(kvfs_guard_store_u32((uint32_t *)p, 5), 0);
	assert_int_equal(*(uint32_t *)p, 5);
	munmap(p, 8192);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copy_ok),
		cmocka_unit_test(test_shrunk_object),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
