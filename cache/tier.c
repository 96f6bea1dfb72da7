/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "cache/tier.h"

static const char *const tier_names[KVFS_NTIERS] = {
	[KVFS_TIER_GPU] = "gpu",
	[KVFS_TIER_DRAM] = "dram",
	[KVFS_TIER_SSD] = "ssd",
};

void kvfs_tier_free(struct kvfs_tier *t)
{
	if (t)
		t->ops->release(t);
}

const char *kvfs_tier_name(int id)
{
	if (id < 0 || id >= KVFS_NTIERS)
		return "?";
	return tier_names[id];
}

int kvfs_tier_parse(const char *name)
{
	if (!name)
		return -EINVAL;
	for (int i = 0; i < KVFS_NTIERS; i++)
		if (!strcmp(name, tier_names[i]))
			return i;
	return -EINVAL;
}
