/* SPDX-License-Identifier: MIT */
/*
 * Who may do what in a namespace (docs/ctl.md, "Permissions"): the
 * owner, group and mode a namespace has in the config, judged as for a
 * file; and the caller's filesystem identity around the opening of client
 * memory. At the bottom of the control files (cache/ctl_i.h): it calls
 * none of the others.
 */
#include <errno.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cache/ctl_i.h"
#include "meta/log.h"

/* Without owner, group or mode in the config: the mounting user's, as a
 * namespace was before they could be set.
 */
#define NS_MODE_DEFAULT 0755

const struct kvfs_ns_params *kvfs_ctl_ns_params(struct kvfs_cache *c,
						const struct kvfs_ns *ns)
{
	const char *name = kvfs_ns_name(ns);

	for (size_t i = 0; i < c->conf.n_ns; i++)
		if (!strcmp(c->conf.ns[i].name, name))
			return &c->conf.ns[i];
	return NULL;
}

void kvfs_ctl_ns_owner(struct kvfs_cache *c, const struct kvfs_ns *ns,
		       struct kvfs_ctl_owner *o)
{
	const struct kvfs_ns_params *p = kvfs_ctl_ns_params(c, ns);

	o->admin = (uint32_t)getuid();
	o->uid = p && p->acc.has_uid ? p->acc.uid : (uint32_t)getuid();
	o->gid = p && p->acc.has_gid ? p->acc.gid : (uint32_t)getgid();
	o->mode = p && p->acc.has_mode ? p->acc.mode : NS_MODE_DEFAULT;
}

/* Read @cr's supplementary groups, once. */
static void load_groups(struct kvfs_ctl_creds *cr)
{
	int n = 0;

	if (cr->n_groups >= 0)
		return;
	if (cr->get_groups)
		n = cr->get_groups(cr->arg, cr->groups, KVFS_CTL_CREDS_GROUPS);
	if (n < 0)
		n = 0; /* unknown: judged by the primary group alone */
	if (n > KVFS_CTL_CREDS_GROUPS)
		n = KVFS_CTL_CREDS_GROUPS;
	cr->n_groups = n;
}

static bool in_groups(struct kvfs_ctl_creds *cr, uint32_t gid)
{
	if (cr->gid == gid)
		return true;
	load_groups(cr);
	for (int i = 0; i < cr->n_groups; i++)
		if (cr->groups[i] == gid)
			return true;
	return false;
}

int kvfs_ctl_may(const struct kvfs_ctl_owner *o, struct kvfs_ctl_creds *cr,
		 unsigned want)
{
	unsigned bits = 0, need = 0;

	if (cr->uid == 0 || cr->uid == o->admin)
		return 0;
	if (cr->uid == o->uid)
		bits = (o->mode >> 6) & 7;
	else if (in_groups(cr, o->gid))
		bits = (o->mode >> 3) & 7;
	else
		bits = o->mode & 7;
	if (want & KVFS_CTL_MAY_READ)
		need |= 4;
	if (want & KVFS_CTL_MAY_WRITE)
		need |= 2;
	return (bits & need) == need ? 0 : -EACCES;
}

int kvfs_ctl_ns_may(struct kvfs_cache *c, const struct kvfs_ns *ns,
		    struct kvfs_ctl_creds *cr, unsigned want)
{
	struct kvfs_ctl_owner o;

	kvfs_ctl_ns_owner(c, ns, &o);
	return kvfs_ctl_may(&o, cr, want);
}

bool kvfs_ctl_is_admin(const struct kvfs_ctl_creds *cr)
{
	return cr->uid == 0 || cr->uid == (uint32_t)getuid();
}

/* ------------------------------------------------------------- identity */

int kvfs_ctl_ident_enter(struct kvfs_ctl_creds *cr, struct kvfs_ctl_ident *id)
{
	gid_t g[KVFS_CTL_CREDS_GROUPS];
	int n;

	memset(id, 0, sizeof(*id));
	if (cr->uid == 0)
		return 0;
	if (geteuid() != 0)
		/* No identity to take on: only the daemon's own user. */
		return cr->uid == (uint32_t)geteuid() ? 0 : -EACCES;
	load_groups(cr);
	id->n_saved = getgroups(KVFS_CTL_CREDS_GROUPS, id->saved);
	if (id->n_saved < 0)
		return -errno;
	for (n = 0; n < cr->n_groups; n++)
		g[n] = (gid_t)cr->groups[n];
	/* The raw calls change this thread only (glibc's setgroups() would
	 * change every thread of the daemon).
	 */
	if (syscall(SYS_setgroups, (size_t)n, g))
		return -errno;
	id->fsgid = setfsgid((gid_t)cr->gid);
	id->fsuid = setfsuid((uid_t)cr->uid);
	id->on = true;
	if ((uint32_t)setfsuid((uid_t)-1) != cr->uid ||
	    (uint32_t)setfsgid((gid_t)-1) != cr->gid) {
		kvfs_ctl_ident_leave(id);
		kvfs_err("ctl: cannot take on uid %u gid %u to open client "
			 "memory",
			 cr->uid, cr->gid);
		return -EACCES;
	}
	return 0;
}

void kvfs_ctl_ident_leave(struct kvfs_ctl_ident *id)
{
	if (!id->on)
		return;
	setfsuid(id->fsuid);
	setfsgid(id->fsgid);
	if (syscall(SYS_setgroups, (size_t)id->n_saved, id->saved))
		kvfs_err("ctl: cannot restore the daemon's groups: %s",
			 strerror(errno));
	id->on = false;
}
