/* SPDX-License-Identifier: MIT */
/*
 * Who may do what in a namespace (cache/ctl.h, kvfs_ctl_may()): the
 * owner's, group's and others' bits of the namespace's mode, judged as
 * for a file, with uid 0 and the mounting user allowed everything; and the
 * supplementary groups read only when they are needed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache/ctl.h"

#define R KVFS_CTL_MAY_READ
#define W KVFS_CTL_MAY_WRITE

static int groups_calls;
static uint32_t groups_of_caller[3] = { 7, 300, 9 };

static int fake_groups(void *arg, uint32_t *list, int max)
{
	int n = 3;

	groups_calls++;
	if (arg)
		return -EIO;
	for (int i = 0; i < n && i < max; i++)
		list[i] = groups_of_caller[i];
	return n;
}

static struct kvfs_ctl_creds who(uint32_t uid, uint32_t gid)
{
	struct kvfs_ctl_creds cr = {
		.pid = 1,
		.uid = uid,
		.gid = gid,
		.n_groups = -1,
		.get_groups = fake_groups,
	};

	return cr;
}

static const struct kvfs_ctl_owner tenant = {
	.uid = 1000,
	.gid = 300,
	.mode = 0750,
	.admin = 4000,
};

static void test_owner(void **state)
{
	struct kvfs_ctl_creds cr = who(1000, 1000);

	assert_int_equal(kvfs_ctl_may(&tenant, &cr, R), 0);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, W), 0);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, R | W), 0);
	/* the owner's bits decide for the owner, even when the group's
	 * would give more
	 */
	{
		struct kvfs_ctl_owner o = tenant;

		o.mode = 0470;
		assert_int_equal(kvfs_ctl_may(&o, &cr, R), 0);
		assert_int_equal(kvfs_ctl_may(&o, &cr, W), -EACCES);
	}
}

static void test_group(void **state)
{
	struct kvfs_ctl_creds cr = who(1001, 300);

	/* the primary group: no groups read */
	groups_calls = 0;
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, R), 0);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, W), -EACCES);
	assert_int_equal(groups_calls, 0);
	/* a supplementary group: read once, then kept */
	cr = who(1001, 1001);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, R), 0);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, R), 0);
	assert_int_equal(groups_calls, 1);
	assert_int_equal(cr.n_groups, 3);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, W), -EACCES);
}

static void test_others(void **state)
{
	struct kvfs_ctl_creds cr = who(2000, 2000);
	struct kvfs_ctl_owner o = tenant;

	groups_of_caller[1] = 301;
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, R), -EACCES);
	assert_int_equal(kvfs_ctl_may(&tenant, &cr, W), -EACCES);
	o.mode = 0755;
	assert_int_equal(kvfs_ctl_may(&o, &cr, R), 0);
	assert_int_equal(kvfs_ctl_may(&o, &cr, W), -EACCES);
	o.mode = 0757;
	assert_int_equal(kvfs_ctl_may(&o, &cr, R | W), 0);
	/* groups that cannot be read count as none: refused, never let in */
	cr = who(2000, 2000);
	cr.arg = (void *)1;
	o.mode = 0070;
	assert_int_equal(kvfs_ctl_may(&o, &cr, R), -EACCES);
	assert_int_equal(cr.n_groups, 0);
	/* nor does a caller without a group reader */
	cr = who(2000, 2000);
	cr.get_groups = NULL;
	assert_int_equal(kvfs_ctl_may(&o, &cr, R), -EACCES);
	groups_of_caller[1] = 300;
}

static void test_root_and_admin(void **state)
{
	struct kvfs_ctl_owner o = tenant;
	struct kvfs_ctl_creds cr = who(0, 0);

	o.mode = 0;
	assert_int_equal(kvfs_ctl_may(&o, &cr, R | W), 0);
	cr = who(4000, 4000);
	assert_int_equal(kvfs_ctl_may(&o, &cr, R | W), 0);
	/* nothing wanted: always allowed (STATS) */
	cr = who(2000, 2000);
	assert_int_equal(kvfs_ctl_may(&o, &cr, 0), 0);
	/* the pool goes to root and the daemon's user only */
	cr = who(0, 5);
	assert_true(kvfs_ctl_is_admin(&cr));
	cr = who((uint32_t)getuid(), 5);
	assert_true(kvfs_ctl_is_admin(&cr));
	cr = who((uint32_t)getuid() + 1, 5);
	assert_false(kvfs_ctl_is_admin(&cr));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_owner),
		cmocka_unit_test(test_group),
		cmocka_unit_test(test_others),
		cmocka_unit_test(test_root_and_admin),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
