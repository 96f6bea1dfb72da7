/* SPDX-License-Identifier: MIT */
/*
 * Internals of the kvfs.conf parser, shared by fs/conf.c (sections, their
 * key tables and the checks across keys) and fs/conf_value.c (the typed
 * values a key may take); included only from them.  The parser is one
 * thread's: nothing here is locked.
 */
#ifndef KVFS_FS_CONF_I_H
#define KVFS_FS_CONF_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <ini.h>

#include "fs/conf.h"

struct conf_section;

struct conf_key;

/* One parse: where it is in the input, and the first error. */
struct conf_state {
	struct kvfs_conf *c;
	const char *origin;
	/* input: exactly one of text or file */
	const char *text;
	FILE *file;
	unsigned lineno;
	/* the current section, as its header spelled it */
	const struct conf_section *sec;
	char sec_name[INI_MAX_LINE];
	unsigned sec_line;
	uint64_t seen; /* bit i: key i of sec->keys was set */
	unsigned key_line[64]; /* where key i of sec->keys was set */
	unsigned sections_seen; /* bit i: sections[i] appeared */
	struct kvfs_ns_params *ns; /* the namespace being filled */
	unsigned pinned_line; /* where [tier.dram] pinned was set, or 0 */
	/* the first error */
	bool failed;
	unsigned err_line;
	char err[256];
};

/* A key's setter: @val parsed into @field (the key's field in the section's
 * target), or kvfs_conf_fail()'s -EINVAL.
 */
typedef int (*conf_set_fn)(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field);

struct conf_key {
	const char *name;
	conf_set_fn set;
	size_t off; /* of the field in the section's target struct */
	uint64_t min, max;
	size_t len; /* string fields: buffer size */
	bool required;
};

struct conf_section {
	const char *name;
	bool named; /* "[name ARG]" */
	const struct conf_key *keys;
	/* Start a section: point the state at its target. 0 or -EINVAL. */
	int (*begin)(struct conf_state *st, const char *arg);
	/* Check the whole section once it ends. 0 or -EINVAL. */
	int (*end)(struct conf_state *st);
	/* A key not in keys[]: NULL makes it an error. */
	int (*other)(struct conf_state *st, const char *key, const char *val);
	/* The struct keys[].off is relative to. */
	void *(*target)(struct conf_state *st);
};

/* A key whose value is one of a few words. */
struct conf_word {
	const char *word;
	int value;
};

/*
 * kvfs_conf_fail() - record the first error of a parse: the message from
 * @fmt, at input line @line.  Later errors are dropped, so the user sees
 * the one that came first.  Returns -EINVAL, for the caller to return.
 */
int kvfs_conf_fail(struct conf_state *st, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * The setters below are conf_set_fn's: each parses @val for key @k of the
 * current section (st->lineno is its line) into @field, and returns 0, or
 * -EINVAL after kvfs_conf_fail() with a message that names the key, the
 * value and what was expected.  @field is left alone on error.
 */

/* A whole number in k->min..k->max, into a uint32_t. */
int kvfs_conf_set_u32(struct conf_state *st, const struct conf_key *k,
		      const char *val, void *field);

/* A size ("64M", "4K", bytes) in k->min..k->max, into a uint64_t. */
int kvfs_conf_set_size(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field);

/* A string shorter than k->len, copied with its NUL. */
int kvfs_conf_set_str(struct conf_state *st, const struct conf_key *k,
		      const char *val, void *field);

/* A word of 1..k->len-1 bytes, each one of @chars, copied with its NUL.
 * On error the message reads "expected <@alt>1..N of <@cls>": @alt names
 * a spelling @chars also allows ("auto or "), @cls the class as a user
 * reads it ("[a-z0-9_-]").
 */
int kvfs_conf_set_chars(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field, const char *chars,
			const char *alt, const char *cls);

/* A user (a name the system knows, or a uid) into a uint32_t; sets
 * st->ns->acc.has_uid.  kvfs_conf_set_group() is the same for a group
 * and has_gid.
 */
int kvfs_conf_set_owner(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field);
int kvfs_conf_set_group(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field);

/* Octal permission bits 0..0777 (1 to 4 digits) into a uint32_t; sets
 * st->ns->acc.has_mode.
 */
int kvfs_conf_set_mode(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field);

/* A model digest: 1..k->len-1 of [A-Za-z0-9._:+-] ("auto" among them). */
int kvfs_conf_set_digest(struct conf_state *st, const struct conf_key *k,
			 const char *val, void *field);

/* err, warn, info or debug, into an int (meta/log.h's levels). */
int kvfs_conf_set_log_level(struct conf_state *st, const struct conf_key *k,
			    const char *val, void *field);

/* f16, bf16, f32 or f8_e4m3, into a uint16_t (meta/fmt.h's dtypes). */
int kvfs_conf_set_dtype(struct conf_state *st, const struct conf_key *k,
			const char *val, void *field);

/* A policy name: 1..k->len-1 of [a-z0-9_-]. */
int kvfs_conf_set_policy_name(struct conf_state *st, const struct conf_key *k,
			      const char *val, void *field);

/* A positive finite decimal number, into a double. */
int kvfs_conf_set_pos_double(struct conf_state *st, const struct conf_key *k,
			     const char *val, void *field);

/* llama or qwen2, into an int (hcache/restore.h's families). */
int kvfs_conf_set_family(struct conf_state *st, const struct conf_key *k,
			 const char *val, void *field);

/* default, linear or llama3, into an int (hcache/restore.h's scalings). */
int kvfs_conf_set_rope(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field);

/* kv, hidden or auto, into a uint32_t (KVFS_STORE_*). */
int kvfs_conf_set_store_as(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field);

/*
 * kvfs_conf_pick_word() - the value of @val in @words (ended by a NULL
 * word) into *@v.  Returns 0, or kvfs_conf_fail()'s -EINVAL with
 * "expected a, b or c", the words in table order.
 */
int kvfs_conf_pick_word(struct conf_state *st, const struct conf_key *k,
			const char *val, const struct conf_word *words, int *v);

/* kvfs_conf_pick_word() into an int @field; returns as it does. */
int kvfs_conf_set_word(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field,
		       const struct conf_word *words);

#endif
