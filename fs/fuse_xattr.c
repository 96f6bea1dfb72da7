/* SPDX-License-Identifier: MIT */
/*
 * The user.kvfs.* extended attributes: a namespace's root key, geometry
 * and block count; a block's tiers, tokens, lineage, counters and pins
 * (docs/operations.md). Reading them needs read permission on the
 * namespace; setting or removing a pin or a category needs write
 * permission, and a pin is held to the namespace's pin_quota.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cache/cache.h"
#include "fs/fuse_i.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/util.h"
#include "tier/tier.h"

static int tiers_str(unsigned bits, char *buf, size_t len)
{
	static const int order[] = { KVFS_TIER_GPU, KVFS_TIER_DRAM,
				     KVFS_TIER_SSD };
	size_t used = 0;

	buf[0] = 0;
	for (size_t i = 0; i < 3; i++) {
		if (!(bits & (1u << order[i])))
			continue;
		used += (size_t)snprintf(buf + used, len - used, "%s%s",
					 used ? "," : "",
					 kvfs_tier_name(order[i]));
	}
	return (int)used;
}

/* The value of @name for a block, or -ENODATA. */
static int block_xattr(struct kvfs_block *b, const char *name, char *v,
		       size_t len)
{
	struct kvfs_block_info bi;
	char hex[KVFS_KEY_HEX_LEN + 1];

	kvfs_block_info(b, &bi);
	if (strncmp(name, XATTR_PREFIX, strlen(XATTR_PREFIX)))
		return -ENODATA;
	name += strlen(XATTR_PREFIX);
	if (!strcmp(name, "tier")) {
		int n = tiers_str(bi.tiers, v, len);

		/* Where else a copy is: the tier shared across hosts. */
		if (bi.remote && (size_t)n < len)
			n += snprintf(v + n, len - (size_t)n, "%sremote",
				      n ? "," : "");
		return n;
	}
	if (!strcmp(name, "tokens"))
		return snprintf(v, len, "%u", bi.n_tokens);
	if (!strcmp(name, "parent")) {
		kvfs_fmt_key_hex(bi.parent, hex);
		return snprintf(v, len, "%s", hex);
	}
	if (!strcmp(name, "hits"))
		return snprintf(v, len, "%" PRIu64, bi.hits);
	if (!strcmp(name, "last_access"))
		return snprintf(v, len, "%" PRIu64 ".%09" PRIu64,
				(uint64_t)(bi.last_access / 1000000000ull),
				(uint64_t)(bi.last_access % 1000000000ull));
	if (!strcmp(name, "depth"))
		return snprintf(v, len, "%u", bi.depth);
	if (!strcmp(name, "durable"))
		return snprintf(v, len, "%d", bi.persisted ? 1 : 0);
	if (!strcmp(name, "category"))
		return snprintf(v, len, "%u", bi.category);
	if (!strcmp(name, "leases"))
		return snprintf(v, len, "%u", bi.leases);
	/* What the store keeps; reads always see the KV-kind file.  A split
	 * block names its layer ranges, both inclusive:
	 * "hidden:0-30,kv:31-31".
	 */
	if (!strcmp(name, "stored_as")) {
		if (bi.stored_kind == KVFS_KIND_MIXED)
			return snprintf(v, len, "hidden:0-%u,kv:%u-%u",
					bi.stored_kv_from - 1,
					bi.stored_kv_from, bi.n_layers - 1);
		return snprintf(v, len, "%s",
				bi.stored_kind == KVFS_KIND_HIDDEN ? "hidden" :
								     "kv");
	}
	/* The stored image's bytes (what the SSD holds; the file's size is
	 * the KV-kind file's).
	 */
	if (!strcmp(name, "stored_bytes"))
		return snprintf(v, len, "%" PRIu64, bi.stored_size);
	if (!strcmp(name, "pin")) {
		if (!bi.pins)
			return -ENODATA;
		return tiers_str(bi.pins, v, len);
	}
	return -ENODATA;
}

static const char *const block_xattrs[] = {
	"tier",	   "tokens",   "parent", "hits", "last_access", "depth",
	"durable", "category", "leases", "pin",	 "stored_as",	"stored_bytes",
};

static int ns_xattr(struct kvfs_ns *ns, const char *name, char *v, size_t len)
{
	const struct kvfs_geom *g = kvfs_ns_geom(ns);
	char hex[KVFS_KEY_HEX_LEN + 1];

	if (!strcmp(name, XATTR_PREFIX "root")) {
		kvfs_fmt_key_hex(kvfs_ns_root(ns), hex);
		return snprintf(v, len, "%s", hex);
	}
	if (!strcmp(name, XATTR_PREFIX "geometry"))
		return snprintf(
			v, len,
			"layers=%u kv_heads=%u head_dim=%u dtype=%s "
			"block_tokens=%u chunk_tokens=%u hidden_size=%u",
			g->n_layers, g->n_kv_heads, g->head_dim,
			kvfs_fmt_dtype_name(g->dtype), g->block_tokens,
			g->chunk_tokens, g->hidden_size);
	if (!strcmp(name, XATTR_PREFIX "blocks"))
		return snprintf(v, len, "%" PRIu64, kvfs_ns_nblocks(ns));
	return -ENODATA;
}

static void reply_value(fuse_req_t req, const char *v, int n, size_t size)
{
	if (n < 0)
		kvfs_fuse_reply_rc(req, n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else if ((size_t)n > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, v, (size_t)n);
}

void kvfs_fuse_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	struct kvfs_fs *fs = kvfs_fuse_fs(req);
	struct kvfs_block *b;
	struct kvfs_ns *ns;
	char v[512];
	int n = -ENODATA;

	ns = kvfs_cache_ns_by_ino(fs->c, ino);
	if (ns) {
		n = kvfs_fuse_may(req, ns, KVFS_CTL_MAY_READ, "getxattr");
		if (!n)
			n = ns_xattr(ns, name, v, sizeof(v));
	} else if (kvfs_cache_get(fs->c, ino, &b) == 0) {
		n = kvfs_fuse_may(req, kvfs_block_ns(b), KVFS_CTL_MAY_READ,
				  "getxattr");
		if (!n)
			n = block_xattr(b, name, v, sizeof(v));
		kvfs_cache_put(fs->c, b);
	}
	reply_value(req, v, n, size);
}

void kvfs_fuse_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct kvfs_fs *fs = kvfs_fuse_fs(req);
	struct kvfs_block *b;
	struct kvfs_ns *ns;
	char list[1024], v[512];
	size_t used = 0;
	int rc;

	ns = kvfs_cache_ns_by_ino(fs->c, ino);
	if (ns &&
	    (rc = kvfs_fuse_may(req, ns, KVFS_CTL_MAY_READ, "listxattr"))) {
		kvfs_fuse_reply_rc(req, rc);
		return;
	}
	if (ns) {
		static const char names[] = XATTR_PREFIX
			"root\0" XATTR_PREFIX "geometry\0" XATTR_PREFIX
			"blocks";

		memcpy(list, names, sizeof(names));
		used = sizeof(names);
	} else if (kvfs_cache_get(fs->c, ino, &b) == 0) {
		rc = kvfs_fuse_may(req, kvfs_block_ns(b), KVFS_CTL_MAY_READ,
				   "listxattr");
		if (rc) {
			kvfs_cache_put(fs->c, b);
			kvfs_fuse_reply_rc(req, rc);
			return;
		}
		for (size_t i = 0;
		     i < sizeof(block_xattrs) / sizeof(block_xattrs[0]); i++) {
			char full[64];

			snprintf(full, sizeof(full), XATTR_PREFIX "%s",
				 block_xattrs[i]);
			if (block_xattr(b, full, v, sizeof(v)) < 0)
				continue;
			memcpy(list + used, full, strlen(full) + 1);
			used += strlen(full) + 1;
		}
		kvfs_cache_put(fs->c, b);
	}
	reply_value(req, list, (int)used, size);
}

/*
 * A settable value is one short word. Trailing newlines and NULs are
 * dropped (echo and some tools add them); anything else around the word,
 * or a value too long for @len, makes it garbage rather than something to
 * cut down to a word that happens to parse: -EINVAL.
 */
static int xattr_word(const char *name, const char *value, size_t size, char *v,
		      size_t len)
{
	while (size && (value[size - 1] == '\0' || value[size - 1] == '\n'))
		size--;
	if (size >= len || (size && (memchr(value, '\0', size) ||
				     memchr(value, '\n', size)))) {
		kvfs_warn("setxattr %s: a value of %zu bytes that is not one "
			  "word",
			  name, size);
		v[0] = 0;
		return -EINVAL;
	}
	if (size)
		memcpy(v, value, size);
	v[size] = 0;
	return 0;
}

/*
 * user.kvfs.scrub = now on the mount's root starts a scrub pass (kvfsctl
 * scrub): an attribute rather than a ctl operation, so that the ABI,
 * libkvfs and kvfs.py stay as they are.  Root and the mounting user only.
 */
static int root_setxattr(fuse_req_t req, const char *name, const char *value,
			 size_t size)
{
	struct kvfs_ctl_creds cr;
	char v[16];
	int rc;

	if (strcmp(name, XATTR_PREFIX "scrub"))
		return -ENOTSUP;
	kvfs_fuse_creds(req, &cr);
	if (!kvfs_ctl_is_admin(&cr)) {
		kvfs_warn("uid %u may not start a scrub (EACCES)", cr.uid);
		return -EACCES;
	}
	rc = xattr_word(name, value, size, v, sizeof(v));
	if (rc || strcmp(v, "now")) {
		kvfs_warn("setxattr %s: expected 'now'", name);
		return -EINVAL;
	}
	return kvfs_cache_scrub_now(kvfs_fuse_fs(req)->c);
}

void kvfs_fuse_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	struct kvfs_fs *fs = kvfs_fuse_fs(req);
	struct kvfs_block *b;
	char v[64], junk[512];
	uint32_t cat;
	int rc, tier;

	if (ino == FUSE_ROOT_ID) {
		kvfs_fuse_reply_rc(req, root_setxattr(req, name, value, size));
		return;
	}
	if (kvfs_cache_ns_by_ino(fs->c, ino)) {
		rc = ns_xattr(kvfs_cache_ns_by_ino(fs->c, ino), name, junk,
			      sizeof(junk));
		kvfs_fuse_reply_rc(req, rc >= 0 ? -EPERM : -ENOTSUP);
		return;
	}
	rc = kvfs_cache_get(fs->c, ino, &b);
	if (rc) {
		uint64_t psize;

		/* A file being written keeps no attributes: cp -a's ACLs
		 * and xattrs meet a filesystem without them.
		 */
		kvfs_fuse_reply_rc(req, ino < KVFS_INO_BLOCK_BASE ||
						!kvfs_cache_pending_size(
							fs->c, ino, &psize)
						? -ENOTSUP
						: rc);
		return;
	}
	if ((!strcmp(name, XATTR_PREFIX "pin") ||
	     !strcmp(name, XATTR_PREFIX "category")) &&
	    (rc = kvfs_fuse_may(req, kvfs_block_ns(b), KVFS_CTL_MAY_WRITE,
				"setxattr"))) {
		/* refused: rc is -EACCES */
	} else if (!strcmp(name, XATTR_PREFIX "pin")) {
		tier = xattr_word(name, value, size, v, sizeof(v));
		if (!tier)
			tier = kvfs_tier_parse(v);
		if (tier < 0) {
			kvfs_warn("setxattr %s=%s: expected gpu, dram or ssd",
				  name, v);
			rc = -EINVAL;
		} else {
			rc = kvfs_ctl_pin_admit(fs->c, b, tier);
		}
	} else if (!strcmp(name, XATTR_PREFIX "category")) {
		rc = xattr_word(name, value, size, v, sizeof(v));
		if (!rc)
			rc = kvfs_util_parse_u32(v, &cat);
		if (rc || cat > 0xffff) {
			kvfs_warn("setxattr %s=%s: expected 0..65535", name, v);
			rc = -EINVAL;
		} else {
			rc = kvfs_cache_set_category(fs->c, b, cat);
		}
	} else if (block_xattr(b, name, junk, sizeof(junk)) >= 0 ||
		   !strcmp(name, XATTR_PREFIX "pin")) {
		rc = -EPERM;
	} else {
		bool ours = !strncmp(name, XATTR_PREFIX, strlen(XATTR_PREFIX));
		size_t i;

		for (i = 0;
		     ours && i < sizeof(block_xattrs) / sizeof(block_xattrs[0]);
		     i++)
			if (!strcmp(name + strlen(XATTR_PREFIX),
				    block_xattrs[i]))
				break;
		rc = ours && i < sizeof(block_xattrs) /
						     sizeof(block_xattrs[0]) ?
			     -EPERM :
			     -ENOTSUP;
	}
	kvfs_cache_put(fs->c, b);
	kvfs_fuse_reply_rc(req, rc);
}

void kvfs_fuse_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct kvfs_fs *fs = kvfs_fuse_fs(req);
	struct kvfs_block *b;
	char junk[512];
	int rc;

	rc = kvfs_cache_get(fs->c, ino, &b);
	if (rc) {
		kvfs_fuse_reply_rc(req, kvfs_cache_ns_by_ino(fs->c, ino) ?
						-EPERM :
						-ENODATA);
		return;
	}
	if (!strcmp(name, XATTR_PREFIX "pin")) {
		struct kvfs_block_info bi;

		kvfs_block_info(b, &bi);
		rc = kvfs_fuse_may(req, kvfs_block_ns(b), KVFS_CTL_MAY_WRITE,
				   "removexattr");
		if (!rc)
			rc = bi.pins ? kvfs_cache_unpin(fs->c, b) : -ENODATA;
	} else if (block_xattr(b, name, junk, sizeof(junk)) >= 0) {
		rc = -EPERM;
	} else {
		rc = -ENODATA;
	}
	kvfs_cache_put(fs->c, b);
	kvfs_fuse_reply_rc(req, rc);
}
