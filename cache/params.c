/* SPDX-License-Identifier: MIT */
/*
 * The engine's parameter defaults (cache/params.h).
 */
#include <string.h>

#include "cache/params.h"

void kvfs_cache_params_defaults(struct kvfs_cache_params *p)
{
	memset(p, 0, sizeof(*p));
	p->flush_ms = 1000;
	p->meta_mapsize = 1ull << 30;
	p->scrub_rate = 64ull << 20;
	p->dram_capacity = 256ull << 20;
	p->ssd_rings = 4;
	p->writeback_batch = 64;
	p->gpu_capacity = 256ull << 20;
	p->lease_ms = 60000;
	p->chunk_dram = 64ull << 20;
	p->chunk_spec_depth = 8;
	strcpy(p->policy, "lru");
	kvfs_remote_conf_defaults(&p->remote);
	kvfs_sight_conf_defaults(&p->fleet);
}
