/* SPDX-License-Identifier: MIT */
/*
 * kvfs.conf: the typed values a key may take (fs/conf_i.h).  Each setter
 * checks the whole value before it writes the field, so a bad line leaves
 * the configuration as it was and names what it expected.
 */
#include <errno.h>
#include <grp.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/conf_i.h"
#include "hcache/restore.h"
#include "meta/fmt.h"
#include "meta/log.h"
#include "meta/util.h"

int kvfs_conf_fail(struct conf_state *st, unsigned line, const char *fmt, ...)
{
	va_list ap;

	if (st->failed)
		return -EINVAL;
	st->failed = true;
	st->err_line = line;
	va_start(ap, fmt);
	vsnprintf(st->err, sizeof(st->err), fmt, ap);
	va_end(ap);
	return -EINVAL;
}

int kvfs_conf_set_u32(struct conf_state *st, const struct conf_key *k,
		      const char *val, void *field)
{
	uint32_t v;

	if (kvfs_util_parse_u32(val, &v) || v < k->min || v > k->max)
		return kvfs_conf_fail(
			st, st->lineno,
			"%s = '%s': expected a whole number in %llu..%llu",
			k->name, val, (unsigned long long)k->min,
			(unsigned long long)k->max);
	memcpy(field, &v, sizeof(v));
	return 0;
}

int kvfs_conf_set_size(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field)
{
	uint64_t v;
	char lo[16], hi[16];

	if (kvfs_util_parse_size(val, &v) || v < k->min || v > k->max)
		return kvfs_conf_fail(
			st, st->lineno,
			"%s = '%s': expected a size in %s..%s (e.g. 64M)",
			k->name, val,
			kvfs_util_fmt_size(k->min, lo, sizeof(lo)),
			kvfs_util_fmt_size(k->max, hi, sizeof(hi)));
	memcpy(field, &v, sizeof(v));
	return 0;
}

int kvfs_conf_set_str(struct conf_state *st, const struct conf_key *k,
		      const char *val, void *field)
{
	size_t n = strlen(val);

	if (n >= k->len)
		return kvfs_conf_fail(st, st->lineno,
				      "%s: value longer than %zu bytes",
				      k->name, k->len - 1);
	memcpy(field, val, n + 1);
	return 0;
}

int kvfs_conf_set_chars(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field, const char *chars,
			const char *alt, const char *cls)
{
	size_t n = strlen(val);

	if (!n || n >= k->len || strspn(val, chars) != n)
		return kvfs_conf_fail(st, st->lineno,
				      "%s = '%s': expected %s1..%zu of %s",
				      k->name, val, alt, k->len - 1, cls);
	memcpy(field, val, n + 1);
	return 0;
}

/* A user or group: a name the system knows, or a number (which need not
 * name an account, as with chown).
 */
static int set_id(struct conf_state *st, const struct conf_key *k,
		  const char *val, void *field, bool user)
{
	struct kvfs_ns_access *a = &st->ns->acc;
	char buf[4096];
	uint32_t id;
	int rc;

	if (val[0] >= '0' && val[0] <= '9') {
		if (kvfs_util_parse_u32(val, &id) || id == UINT32_MAX)
			return kvfs_conf_fail(
				st, st->lineno,
				"%s = '%s': expected a %s name or a number "
				"below 4294967295",
				k->name, val, user ? "user" : "group");
	} else if (user) {
		struct passwd pw, *res = NULL;

		rc = getpwnam_r(val, &pw, buf, sizeof(buf), &res);
		if (rc || !res)
			return kvfs_conf_fail(st, st->lineno,
					      "%s = '%s': no such user%s%s",
					      k->name, val, rc ? ": " : "",
					      rc ? strerror(rc) : "");
		id = res->pw_uid;
	} else {
		struct group gr, *res = NULL;

		rc = getgrnam_r(val, &gr, buf, sizeof(buf), &res);
		if (rc || !res)
			return kvfs_conf_fail(st, st->lineno,
					      "%s = '%s': no such group%s%s",
					      k->name, val, rc ? ": " : "",
					      rc ? strerror(rc) : "");
		id = res->gr_gid;
	}
	memcpy(field, &id, sizeof(id));
	if (user)
		a->has_uid = true;
	else
		a->has_gid = true;
	return 0;
}

int kvfs_conf_set_owner(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field)
{
	return set_id(st, k, val, field, true);
}

int kvfs_conf_set_group(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field)
{
	return set_id(st, k, val, field, false);
}

/* Octal permission bits, as chmod takes them: 1 to 4 digits, 0..0777. */
int kvfs_conf_set_mode(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field)
{
	size_t n = strlen(val);
	uint32_t v = 0;

	if (!n || n > 4 || strspn(val, "01234567") != n)
		goto out_bad;
	for (size_t i = 0; i < n; i++)
		v = v * 8 + (uint32_t)(val[i] - '0');
	if (v > 0777)
		goto out_bad;
	memcpy(field, &v, sizeof(v));
	st->ns->acc.has_mode = true;
	return 0;
out_bad:
	return kvfs_conf_fail(
		st, st->lineno,
		"%s = '%s': expected octal permission bits 0..0777 "
		"(e.g. 0750)",
		k->name, val);
}

/* A value (what the engine side knows the checkpoint by) or auto,
 * resolved once the section's weights is known (ns_end_digest).
 */
int kvfs_conf_set_digest(struct conf_state *st, const struct conf_key *k,
			 const char *val, void *field)
{
	return kvfs_conf_set_chars(st, k, val, field,
				   "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
				   "abcdefghijklmnopqrstuvwxyz0123456789._:+-",
				   "auto or ", "[A-Za-z0-9._:+-]");
}

int kvfs_conf_set_log_level(struct conf_state *st, const struct conf_key *k,
			    const char *val, void *field)
{
	int lvl = kvfs_log_level_parse(val);

	if (lvl < 0)
		return kvfs_conf_fail(
			st, st->lineno,
			"%s = '%s': expected err, warn, info or debug", k->name,
			val);
	memcpy(field, &lvl, sizeof(lvl));
	return 0;
}

int kvfs_conf_set_dtype(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field)
{
	int d = kvfs_fmt_dtype_parse(val);
	uint16_t v;

	if (d < 0)
		return kvfs_conf_fail(
			st, st->lineno,
			"%s = '%s': expected f16, bf16, f32 or f8_e4m3",
			k->name, val);
	v = (uint16_t)d;
	memcpy(field, &v, sizeof(v));
	return 0;
}

int kvfs_conf_set_policy_name(struct conf_state *st, const struct conf_key *k,
			      const char *val, void *field)
{
	return kvfs_conf_set_chars(st, k, val, field,
				   "abcdefghijklmnopqrstuvwxyz0123456789_-", "",
				   "[a-z0-9_-]");
}

/* A positive finite decimal number ("1e-5", "500000", "0.25"). */
int kvfs_conf_set_pos_double(struct conf_state *st, const struct conf_key *k,
			     const char *val, void *field)
{
	char *end;
	double v;

	errno = 0;
	v = *val && strspn(val, "0123456789.eE+-") == strlen(val) ?
		    strtod(val, &end) :
		    -1;
	if (v == -1 || *end || errno || !isfinite(v) || !(v > 0))
		return kvfs_conf_fail(st, st->lineno,
				      "%s = '%s': expected a positive number",
				      k->name, val);
	memcpy(field, &v, sizeof(v));
	return 0;
}

int kvfs_conf_set_family(struct conf_state *st, const struct conf_key *k,
			 const char *val, void *field)
{
	int v = kvfs_restore_family_parse(val);

	if (v < 0)
		return kvfs_conf_fail(st, st->lineno,
				      "%s = '%s': expected llama or qwen2",
				      k->name, val);
	memcpy(field, &v, sizeof(v));
	return 0;
}

int kvfs_conf_set_rope(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field)
{
	int v = kvfs_restore_rope_parse(val);

	/* "none" is an alias kvfs_restore_rope_parse() accepts; the config
	 * documents one spelling.
	 */
	if (v < 0 || !strcmp(val, "none"))
		return kvfs_conf_fail(
			st, st->lineno,
			"%s = '%s': expected default, linear or llama3 "
			"(other scalings are not implemented)",
			k->name, val);
	memcpy(field, &v, sizeof(v));
	return 0;
}

int kvfs_conf_pick_word(struct conf_state *st, const struct conf_key *k,
			const char *val, const struct conf_word *words, int *v)
{
	char list[128];
	size_t n = 0;

	for (size_t i = 0; words[i].word; i++)
		if (!strcmp(val, words[i].word)) {
			*v = words[i].value;
			return 0;
		}
	list[0] = 0;
	for (size_t i = 0; words[i].word && n < sizeof(list); i++) {
		const char *sep = !i ? "" : words[i + 1].word ? ", " : " or ";

		n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", sep,
				      words[i].word);
	}
	return kvfs_conf_fail(st, st->lineno, "%s = '%s': expected %s", k->name,
			      val, list);
}

int kvfs_conf_set_word(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field,
		       const struct conf_word *words)
{
	int v = 0, rc = kvfs_conf_pick_word(st, k, val, words, &v);

	if (!rc)
		memcpy(field, &v, sizeof(v));
	return rc;
}

int kvfs_conf_set_store_as(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "kv", KVFS_STORE_KV },
		{ "hidden", KVFS_STORE_HIDDEN },
		{ "auto", KVFS_STORE_AUTO },
		{ NULL, 0 },
	};
	int v = 0, rc = kvfs_conf_pick_word(st, k, val, words, &v);
	uint32_t u = (uint32_t)v;

	if (!rc)
		memcpy(field, &u, sizeof(u));
	return rc;
}
