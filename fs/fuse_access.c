/* SPDX-License-Identifier: MIT */
/*
 * Who sent a FUSE request, and what it may see: the caller's credentials
 * for the engine's permission checks (cache/ctl.h), and the stats a
 * caller is shown.
 */
#include <errno.h>
#include <string.h>
#include <sys/types.h>

#include "cache/cache.h"
#include "fs/fuse_i.h"
#include "meta/log.h"

_Static_assert(sizeof(gid_t) == sizeof(uint32_t), "groups are u32");

static int req_groups(void *arg, uint32_t *list, int max)
{
	int n = fuse_req_getgroups(arg, max, (gid_t *)list);

	return n < 0 ? n : n > max ? max : n;
}

void kvfs_fuse_creds(fuse_req_t req, struct kvfs_ctl_creds *cr)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	memset(cr, 0, sizeof(*cr));
	cr->pid = (int)ctx->pid;
	cr->uid = (uint32_t)ctx->uid;
	cr->gid = (uint32_t)ctx->gid;
	cr->n_groups = -1;
	cr->get_groups = req_groups;
	cr->arg = req;
}

int kvfs_fuse_may(fuse_req_t req, const struct kvfs_ns *ns, unsigned want,
		  const char *what)
{
	struct kvfs_ctl_creds cr;

	kvfs_fuse_creds(req, &cr);
	if (!kvfs_ctl_ns_may(kvfs_fuse_fs(req)->c, ns, &cr, want))
		return 0;
	kvfs_warn("uid %u may not %s in namespace %s: no %s permission "
		  "(EACCES)",
		  cr.uid, what, kvfs_ns_name(ns),
		  want & KVFS_CTL_MAY_WRITE ? "write" : "read");
	return -EACCES;
}

size_t kvfs_fuse_stats_filter(fuse_req_t req, char *text, size_t len)
{
	struct kvfs_cache *c = kvfs_fuse_fs(req)->c;
	struct kvfs_ctl_creds cr;
	size_t in = 0, out = 0;

	kvfs_fuse_creds(req, &cr);
	if (kvfs_ctl_is_admin(&cr))
		return len;
	while (in < len) {
		const char *nl = memchr(text + in, '\n', len - in);
		size_t n = nl ? (size_t)(nl - (text + in)) + 1 : len - in;
		bool keep = true;

		/* Names may hold dots: the longest that fits is the one. */
		if (n > 3 && !memcmp(text + in, "ns.", 3)) {
			struct kvfs_ns *best = NULL;
			size_t best_len = 0;

			for (size_t i = 0; i < kvfs_cache_ns_count(c); i++) {
				struct kvfs_ns *ns = kvfs_cache_ns_at(c, i);
				const char *nm = kvfs_ns_name(ns);
				size_t l = strlen(nm);

				if (l > best_len && n > 3 + l &&
				    !memcmp(text + in + 3, nm, l) &&
				    text[in + 3 + l] == '.') {
					best = ns;
					best_len = l;
				}
			}
			/* A line of no namespace known: shown to no tenant. */
			keep = best && !kvfs_ctl_ns_may(c, best, &cr,
							KVFS_CTL_MAY_READ);
		}
		if (keep) {
			memmove(text + out, text + in, n);
			out += n;
		}
		in += n;
	}
	return out;
}
