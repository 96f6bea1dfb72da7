/* SPDX-License-Identifier: MIT */
/*
 * Strict safetensors reader.  The JSON parser below is deliberately small:
 * it builds a flat node array (indices, not pointers, so it can grow with
 * realloc) and decodes every string into one buffer that is never larger
 * than the input, so a hostile header costs at most a bounded multiple of
 * its own size.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hcache/safetensors.h"
#include "meta/log.h"
#include "meta/util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; kvfs needs a little-endian host"
#endif

/* Deep enough for any real header (three levels) with a wide margin;
 * shallow enough that the recursion cannot exhaust a thread's stack.
 */
#define JSON_MAX_DEPTH 32
/* Real headers hold a few nodes per tensor; this refuses headers built to
 * make the node array huge while still admitting ~500k tensors.
 */
#define JSON_MAX_NODES (4u << 20)

/* ---------------------------------------------------------------- JSON */

enum jtype {
	J_OBJ = 1,
	J_ARR,
	J_STR,
	J_INT,
	J_TRUE,
	J_FALSE,
	J_NULL,
};

struct jnode {
	uint8_t type;
	uint8_t neg;     /* J_INT: a '-' was present */
	uint32_t n;      /* J_OBJ/J_ARR: members; J_STR: length */
	uint32_t first;  /* J_OBJ/J_ARR: first member, 0 = none */
	uint32_t next;   /* next sibling, 0 = none (node 0 is the root) */
	uint32_t key;    /* object member: key offset in str */
	uint32_t keylen;
	uint64_t u;      /* J_INT: magnitude; J_STR: offset in str */
};

struct jparser {
	const char *s;
	size_t len;
	size_t pos;
	struct jnode *nodes;
	uint32_t n_nodes, cap;
	char *str;       /* decoded strings, each NUL-terminated */
	size_t str_len;
	const char *err; /* static reason when parsing failed */
	int nomem;
};

static int jfail(struct jparser *p, const char *why)
{
	if (!p->err)
		p->err = why;
	return -1;
}

static void jskip_ws(struct jparser *p)
{
	while (p->pos < p->len) {
		char c = p->s[p->pos];

		if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
			break;
		p->pos++;
	}
}

static int jnew(struct jparser *p, uint8_t type)
{
	if (p->n_nodes >= JSON_MAX_NODES)
		return jfail(p, "too many JSON values");
	if (p->n_nodes == p->cap) {
		uint32_t ncap = p->cap ? p->cap * 2 : 64;
		struct jnode *n = realloc(p->nodes, (size_t)ncap * sizeof(*n));

		if (!n) {
			p->nomem = 1;
			return jfail(p, "out of memory");
		}
		p->nodes = n;
		p->cap = ncap;
	}
	memset(&p->nodes[p->n_nodes], 0, sizeof(p->nodes[0]));
	p->nodes[p->n_nodes].type = type;
	return (int)p->n_nodes++;
}


static int jhex4(struct jparser *p, uint32_t *out)
{
	uint32_t v = 0;

	if (p->len - p->pos < 4)
		return jfail(p, "truncated \\u escape");
	for (int i = 0; i < 4; i++) {
		int h = kvfs_util_hexval(p->s[p->pos + i]);

		if (h < 0)
			return jfail(p, "bad hex digit in \\u escape");
		v = v << 4 | (uint32_t)h;
	}
	p->pos += 4;
	*out = v;
	return 0;
}

/* Length of the well-formed UTF-8 sequence at @s (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0.
 */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
	unsigned char c = s[0];
	size_t n;
	uint32_t cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		n = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (avail < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return n;
}

static void utf8_put(char *out, size_t *o, uint32_t cp)
{
	if (cp < 0x80) {
		out[(*o)++] = (char)cp;
	} else if (cp < 0x800) {
		out[(*o)++] = (char)(0xc0 | cp >> 6);
		out[(*o)++] = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		out[(*o)++] = (char)(0xe0 | cp >> 12);
		out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[(*o)++] = (char)(0x80 | (cp & 0x3f));
	} else {
		out[(*o)++] = (char)(0xf0 | cp >> 18);
		out[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
		out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[(*o)++] = (char)(0x80 | (cp & 0x3f));
	}
}

/* Decode the string at p->pos (the opening quote) into p->str.  The decoded
 * form plus its NUL never exceeds the encoded form with its quotes, so
 * p->str (input length + 1 bytes) cannot overflow.
 */
static int jstring(struct jparser *p, uint32_t *off, uint32_t *slen)
{
	size_t o = p->str_len;

	p->pos++; /* opening quote */
	for (;;) {
		unsigned char c;

		if (p->pos >= p->len)
			return jfail(p, "unterminated string");
		c = (unsigned char)p->s[p->pos];
		if (c == '"') {
			p->pos++;
			break;
		}
		if (c < 0x20)
			return jfail(p, "control character in string");
		if (c >= 0x80) {
			size_t n = utf8_len((const unsigned char *)p->s + p->pos,
					    p->len - p->pos);

			if (!n)
				return jfail(p, "invalid UTF-8 in string");
			memcpy(p->str + o, p->s + p->pos, n);
			o += n;
			p->pos += n;
			continue;
		}
		if (c != '\\') {
			p->str[o++] = (char)c;
			p->pos++;
			continue;
		}
		if (++p->pos >= p->len)
			return jfail(p, "unterminated string");
		c = (unsigned char)p->s[p->pos++];
		switch (c) {
		case '"':
		case '\\':
		case '/':
			p->str[o++] = (char)c;
			break;
		case 'b':
			p->str[o++] = '\b';
			break;
		case 'f':
			p->str[o++] = '\f';
			break;
		case 'n':
			p->str[o++] = '\n';
			break;
		case 'r':
			p->str[o++] = '\r';
			break;
		case 't':
			p->str[o++] = '\t';
			break;
		case 'u': {
			uint32_t cp, lo;

			if (jhex4(p, &cp))
				return -1;
			if (cp >= 0xdc00 && cp <= 0xdfff)
				return jfail(p, "unpaired low surrogate");
			if (cp >= 0xd800 && cp <= 0xdbff) {
				if (p->len - p->pos < 2 || p->s[p->pos] != '\\' ||
				    p->s[p->pos + 1] != 'u')
					return jfail(p, "unpaired high surrogate");
				p->pos += 2;
				if (jhex4(p, &lo))
					return -1;
				if (lo < 0xdc00 || lo > 0xdfff)
					return jfail(p, "unpaired high surrogate");
				cp = 0x10000 + ((cp - 0xd800) << 10) +
				     (lo - 0xdc00);
			}
			if (!cp)
				return jfail(p, "\\u0000 in string");
			utf8_put(p->str, &o, cp);
			break;
		}
		default:
			return jfail(p, "bad escape in string");
		}
	}
	p->str[o] = '\0';
	*off = (uint32_t)p->str_len;
	*slen = (uint32_t)(o - p->str_len);
	p->str_len = o + 1;
	return 0;
}

static int jnumber(struct jparser *p, int idx)
{
	uint64_t v = 0;
	int neg = 0;

	if (p->s[p->pos] == '-') {
		neg = 1;
		p->pos++;
	}
	if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
		return jfail(p, "bad number");
	if (p->s[p->pos] == '0' && p->pos + 1 < p->len &&
	    p->s[p->pos + 1] >= '0' && p->s[p->pos + 1] <= '9')
		return jfail(p, "number with a leading zero");
	while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
		unsigned d = (unsigned)(p->s[p->pos] - '0');

		if (v > (UINT64_MAX - d) / 10)
			return jfail(p, "integer out of range");
		v = v * 10 + d;
		p->pos++;
	}
	if (p->pos < p->len && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' ||
				p->s[p->pos] == 'E'))
		return jfail(p, "non-integer number");
	p->nodes[idx].u = v;
	p->nodes[idx].neg = (uint8_t)neg;
	return 0;
}

struct jkey {
	const char *k;
	uint32_t len;
};

static int jkey_cmp(const void *a, const void *b)
{
	const struct jkey *x = a, *y = b;
	uint32_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(x->k, y->k, n);

	if (c)
		return c;
	return (x->len > y->len) - (x->len < y->len);
}

/* Sorting keeps this O(n log n): a header with a million members must not
 * turn the duplicate check quadratic.
 */
static int jcheck_dups(struct jparser *p, int obj)
{
	uint32_t n = p->nodes[obj].n, i = 0;
	struct jkey *keys;
	int ret = 0;

	if (n < 2)
		return 0;
	keys = malloc((size_t)n * sizeof(*keys));
	if (!keys) {
		p->nomem = 1;
		return jfail(p, "out of memory");
	}
	for (uint32_t c = p->nodes[obj].first; c; c = p->nodes[c].next) {
		keys[i].k = p->str + p->nodes[c].key;
		keys[i].len = p->nodes[c].keylen;
		i++;
	}
	qsort(keys, n, sizeof(*keys), jkey_cmp);
	for (i = 1; i < n; i++) {
		if (!jkey_cmp(&keys[i - 1], &keys[i])) {
			ret = jfail(p, "duplicate key");
			break;
		}
	}
	free(keys);
	return ret;
}

static int jvalue(struct jparser *p, int depth);

static int jcontainer(struct jparser *p, int depth, int is_obj)
{
	char close = is_obj ? '}' : ']';
	int idx = jnew(p, is_obj ? J_OBJ : J_ARR);
	uint32_t last = 0;

	if (idx < 0)
		return -1;
	if (depth >= JSON_MAX_DEPTH)
		return jfail(p, "JSON nested too deeply");
	p->pos++;
	jskip_ws(p);
	if (p->pos < p->len && p->s[p->pos] == close) {
		p->pos++;
		return idx;
	}
	for (;;) {
		uint32_t koff = 0, klen = 0;
		int child;

		jskip_ws(p);
		if (is_obj) {
			if (p->pos >= p->len || p->s[p->pos] != '"')
				return jfail(p, "expected a string key");
			if (jstring(p, &koff, &klen))
				return -1;
			jskip_ws(p);
			if (p->pos >= p->len || p->s[p->pos] != ':')
				return jfail(p, "expected ':'");
			p->pos++;
		}
		child = jvalue(p, depth + 1);
		if (child < 0)
			return -1;
		p->nodes[child].key = koff;
		p->nodes[child].keylen = klen;
		if (last)
			p->nodes[last].next = (uint32_t)child;
		else
			p->nodes[idx].first = (uint32_t)child;
		last = (uint32_t)child;
		p->nodes[idx].n++;
		jskip_ws(p);
		if (p->pos >= p->len)
			return jfail(p, is_obj ? "unterminated object" :
						 "unterminated array");
		if (p->s[p->pos] == ',') {
			p->pos++;
			continue;
		}
		if (p->s[p->pos] == close) {
			p->pos++;
			break;
		}
		return jfail(p, is_obj ? "expected ',' or '}'" :
					 "expected ',' or ']'");
	}
	if (is_obj && jcheck_dups(p, idx))
		return -1;
	return idx;
}

static int jliteral(struct jparser *p, const char *word, uint8_t type)
{
	size_t n = strlen(word);
	int idx;

	if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n))
		return jfail(p, "unexpected character");
	idx = jnew(p, type);
	if (idx < 0)
		return -1;
	p->pos += n;
	return idx;
}

/* Parse one value at p->pos; returns its node index or -1. */
static int jvalue(struct jparser *p, int depth)
{
	int idx;
	char c;

	jskip_ws(p);
	if (p->pos >= p->len)
		return jfail(p, "unexpected end of JSON");
	c = p->s[p->pos];
	switch (c) {
	case '{':
		return jcontainer(p, depth, 1);
	case '[':
		return jcontainer(p, depth, 0);
	case '"': {
		uint32_t off, len;

		idx = jnew(p, J_STR);
		if (idx < 0 || jstring(p, &off, &len))
			return -1;
		p->nodes[idx].u = off;
		p->nodes[idx].n = len;
		return idx;
	}
	case 't':
		return jliteral(p, "true", J_TRUE);
	case 'f':
		return jliteral(p, "false", J_FALSE);
	case 'n':
		return jliteral(p, "null", J_NULL);
	default:
		if (c == '-' || (c >= '0' && c <= '9')) {
			idx = jnew(p, J_INT);
			if (idx < 0 || jnumber(p, idx))
				return -1;
			return idx;
		}
		return jfail(p, "unexpected character");
	}
}

static void jrelease(struct jparser *p)
{
	free(p->nodes);
	free(p->str);
	p->nodes = NULL;
	p->str = NULL;
}

/* Parse @len bytes at @s as one JSON object followed only by whitespace.
 * On failure p->err says why and p->pos where; -ENOMEM or -EINVAL.
 */
static int jparse(struct jparser *p, const char *s, size_t len)
{
	int root;

	memset(p, 0, sizeof(*p));
	p->s = s;
	p->len = len;
	p->str = malloc(len + 1);
	if (!p->str)
		return -ENOMEM;
	root = jvalue(p, 0);
	if (root < 0)
		goto out_fail;
	if (p->nodes[root].type != J_OBJ) {
		jfail(p, "top level is not an object");
		goto out_fail;
	}
	jskip_ws(p);
	if (p->pos != p->len) {
		jfail(p, "trailing garbage after the JSON object");
		goto out_fail;
	}
	return 0;
out_fail:
	return p->nomem ? -ENOMEM : -EINVAL;
}

static const char *jkey_of(const struct jparser *p, uint32_t node)
{
	return p->str + p->nodes[node].key;
}

static const char *jstr_of(const struct jparser *p, uint32_t node)
{
	return p->str + p->nodes[node].u;
}

/* ---------------------------------------------------------- safetensors */

struct st_entry {
	const char *name;
	int dtype;
	uint32_t ndim;
	uint64_t shape[KVFS_ST_MAX_DIMS];
	uint64_t numel;
	uint64_t begin, end;
};

struct st_file {
	char *path;
	const uint8_t *map;
	size_t map_len;
	const uint8_t *data;
	uint64_t data_len;
	char *strs;              /* tensor names (the parser's strings) */
	struct st_entry *ents;   /* sorted by name */
	size_t n_ents;
};

struct st_ref {
	const char *name;
	uint32_t file;
	uint32_t ent;
};

struct kvfs_st {
	struct st_file *files;
	size_t n_files;
	struct st_ref *refs;     /* sorted by name */
	size_t n_refs;
	char *strs;              /* index names, when sharded */
};

static const struct {
	const char *name;
	unsigned bits;
} st_dtypes[] = {
	[KVFS_ST_BOOL] = { "BOOL", 8 },
	[KVFS_ST_U8] = { "U8", 8 },
	[KVFS_ST_I8] = { "I8", 8 },
	[KVFS_ST_F8_E5M2] = { "F8_E5M2", 8 },
	[KVFS_ST_F8_E4M3] = { "F8_E4M3", 8 },
	[KVFS_ST_F8_E8M0] = { "F8_E8M0", 8 },
	[KVFS_ST_I16] = { "I16", 16 },
	[KVFS_ST_U16] = { "U16", 16 },
	[KVFS_ST_F16] = { "F16", 16 },
	[KVFS_ST_BF16] = { "BF16", 16 },
	[KVFS_ST_I32] = { "I32", 32 },
	[KVFS_ST_U32] = { "U32", 32 },
	[KVFS_ST_F32] = { "F32", 32 },
	[KVFS_ST_F64] = { "F64", 64 },
	[KVFS_ST_I64] = { "I64", 64 },
	[KVFS_ST_U64] = { "U64", 64 },
	[KVFS_ST_F4] = { "F4", 4 },
	[KVFS_ST_F6_E2M3] = { "F6_E2M3", 6 },
	[KVFS_ST_F6_E3M2] = { "F6_E3M2", 6 },
};

#define N_ST_DTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

const char *kvfs_st_dtype_name(int dtype)
{
	if (dtype <= 0 || (size_t)dtype >= N_ST_DTYPES)
		return NULL;
	return st_dtypes[dtype].name;
}

unsigned kvfs_st_dtype_bits(int dtype)
{
	if (dtype <= 0 || (size_t)dtype >= N_ST_DTYPES)
		return 0;
	return st_dtypes[dtype].bits;
}

static int st_dtype_parse(const char *s)
{
	for (size_t i = 1; i < N_ST_DTYPES; i++)
		if (st_dtypes[i].name && !strcmp(s, st_dtypes[i].name))
			return (int)i;
	return -EINVAL;
}

__attribute__((format(printf, 3, 4)))
static int st_reject(const char *file, const char *tensor, const char *fmt,
		     ...)
{
	char why[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (tensor)
		kvfs_err("safetensors %s: tensor \"%s\": %s", file, tensor,
			 why);
	else
		kvfs_err("safetensors %s: %s", file, why);
	return -EINVAL;
}

/* @what says whose byte offset it is: "header" or "index". */
static int jreject(const char *file, const char *what,
		   const struct jparser *p, int ret)
{
	if (ret == -ENOMEM) {
		kvfs_err("safetensors %s: out of memory parsing JSON", file);
		return ret;
	}
	return st_reject(file, NULL, "bad JSON at %s byte %zu: %s", what,
			 p->pos, p->err ? p->err : "malformed");
}

/* An array of non-negative integers, at most @max of them. */
static int st_uint_array(const struct jparser *p, uint32_t node, uint64_t *out,
			 uint32_t max, uint32_t *n)
{
	uint32_t i = 0;

	if (p->nodes[node].type != J_ARR || p->nodes[node].n > max)
		return -1;
	for (uint32_t c = p->nodes[node].first; c; c = p->nodes[c].next) {
		if (p->nodes[c].type != J_INT || p->nodes[c].neg)
			return -1;
		out[i++] = p->nodes[c].u;
	}
	*n = i;
	return 0;
}

static int st_entry_parse(const char *file, const struct jparser *p,
			  uint32_t node, uint64_t data_len, struct st_entry *e)
{
	const char *name = jkey_of(p, node);
	int have_dtype = 0, have_shape = 0, have_off = 0;
	uint64_t off[2] = { 0, 0 }, bits, nbytes;
	uint32_t n_off = 0;

	memset(e, 0, sizeof(*e));
	e->name = name;
	if (!*name)
		return st_reject(file, name, "empty tensor name");
	if (p->nodes[node].type != J_OBJ)
		return st_reject(file, name, "entry is not an object");
	for (uint32_t c = p->nodes[node].first; c; c = p->nodes[c].next) {
		const char *k = jkey_of(p, c);

		if (!strcmp(k, "dtype")) {
			if (p->nodes[c].type != J_STR)
				return st_reject(file, name,
						 "dtype is not a string");
			e->dtype = st_dtype_parse(jstr_of(p, c));
			if (e->dtype < 0)
				return st_reject(file, name,
						 "unknown dtype \"%s\"",
						 jstr_of(p, c));
			have_dtype = 1;
		} else if (!strcmp(k, "shape")) {
			if (p->nodes[c].type == J_ARR &&
			    p->nodes[c].n > KVFS_ST_MAX_DIMS)
				return st_reject(file, name,
						 "more than %d dimensions",
						 KVFS_ST_MAX_DIMS);
			if (st_uint_array(p, c, e->shape, KVFS_ST_MAX_DIMS,
					  &e->ndim))
				return st_reject(file, name,
						 "shape is not an array of non-negative integers");
			have_shape = 1;
		} else if (!strcmp(k, "data_offsets")) {
			if (st_uint_array(p, c, off, 2, &n_off) || n_off != 2)
				return st_reject(file, name,
						 "data_offsets is not [begin, end] of non-negative integers");
			have_off = 1;
		} else {
			return st_reject(file, name, "unknown field \"%s\"", k);
		}
	}
	if (!have_dtype)
		return st_reject(file, name, "missing dtype");
	if (!have_shape)
		return st_reject(file, name, "missing shape");
	if (!have_off)
		return st_reject(file, name, "missing data_offsets");

	e->numel = 1;
	for (uint32_t i = 0; i < e->ndim; i++)
		if (__builtin_mul_overflow(e->numel, e->shape[i], &e->numel))
			return st_reject(file, name, "shape size overflows");
	if (__builtin_mul_overflow(e->numel, (uint64_t)kvfs_st_dtype_bits(
						     e->dtype), &bits))
		return st_reject(file, name, "shape size overflows");
	if (bits % 8)
		return st_reject(file, name,
				 "%llu elements of %s are not a whole number of bytes",
				 (unsigned long long)e->numel,
				 kvfs_st_dtype_name(e->dtype));
	nbytes = bits / 8;
	if (off[1] < off[0])
		return st_reject(file, name,
				 "data_offsets end %llu before begin %llu",
				 (unsigned long long)off[1],
				 (unsigned long long)off[0]);
	if (off[1] > data_len)
		return st_reject(file, name,
				 "data_offsets end %llu beyond the data section (%llu bytes)",
				 (unsigned long long)off[1],
				 (unsigned long long)data_len);
	if (off[1] - off[0] != nbytes)
		return st_reject(file, name,
				 "size mismatch: shape and dtype need %llu bytes, data_offsets span %llu",
				 (unsigned long long)nbytes,
				 (unsigned long long)(off[1] - off[0]));
	e->begin = off[0];
	e->end = off[1];
	return 0;
}

static int ent_cmp_off(const void *a, const void *b)
{
	const struct st_entry *x = a, *y = b;

	if (x->begin != y->begin)
		return (x->begin > y->begin) - (x->begin < y->begin);
	return (x->end > y->end) - (x->end < y->end);
}

static int ent_cmp_name(const void *a, const void *b)
{
	const struct st_entry *x = a, *y = b;

	return strcmp(x->name, y->name);
}

/* The format's reference reader requires the tensors to tile the data
 * section exactly; anything else means a writer bug or a spliced file.
 */
static int st_check_tiling(struct st_file *f)
{
	uint64_t at = 0;

	qsort(f->ents, f->n_ents, sizeof(f->ents[0]), ent_cmp_off);
	for (size_t i = 0; i < f->n_ents; i++) {
		const struct st_entry *e = &f->ents[i];

		if (e->begin < at)
			return st_reject(f->path, e->name,
					 "data [%llu, %llu) overlaps tensor \"%s\"",
					 (unsigned long long)e->begin,
					 (unsigned long long)e->end,
					 f->ents[i - 1].name);
		if (e->begin > at)
			return st_reject(f->path, e->name,
					 "gap of %llu bytes before its data",
					 (unsigned long long)(e->begin - at));
		at = e->end;
	}
	if (at != f->data_len)
		return st_reject(f->path, NULL,
				 "%llu bytes after the last tensor's data",
				 (unsigned long long)(f->data_len - at));
	return 0;
}

static int st_parse_header(struct st_file *f, const char *hdr, size_t len)
{
	struct jparser p;
	size_t n = 0;
	int ret;

	ret = jparse(&p, hdr, len);
	if (ret) {
		ret = jreject(f->path, "header", &p, ret);
		goto out_release;
	}
	/* Upper bound: every member may be a tensor. */
	f->ents = calloc(p.nodes[0].n ? p.nodes[0].n : 1, sizeof(*f->ents));
	if (!f->ents) {
		ret = -ENOMEM;
		goto out_release;
	}
	for (uint32_t c = p.nodes[0].first; c; c = p.nodes[c].next) {
		if (!strcmp(jkey_of(&p, c), "__metadata__")) {
			if (p.nodes[c].type != J_OBJ) {
				ret = st_reject(f->path, NULL,
						"__metadata__ is not an object");
				goto out_release;
			}
			for (uint32_t m = p.nodes[c].first; m;
			     m = p.nodes[m].next) {
				if (p.nodes[m].type != J_STR) {
					ret = st_reject(f->path, NULL,
							"__metadata__ value \"%s\" is not a string",
							jkey_of(&p, m));
					goto out_release;
				}
			}
			continue;
		}
		ret = st_entry_parse(f->path, &p, c, f->data_len, &f->ents[n]);
		if (ret)
			goto out_release;
		n++;
	}
	f->n_ents = n;
	ret = st_check_tiling(f);
	if (ret)
		goto out_release;
	qsort(f->ents, f->n_ents, sizeof(f->ents[0]), ent_cmp_name);
	/* Names point into the parser's strings: keep those, drop nodes. */
	f->strs = p.str;
	p.str = NULL;
out_release:
	jrelease(&p);
	return ret;
}

static void st_file_release(struct st_file *f)
{
	if (f->map)
		munmap((void *)f->map, f->map_len);
	free(f->ents);
	free(f->strs);
	free(f->path);
	memset(f, 0, sizeof(*f));
}

static int st_open_fd(const char *path, int *fd, struct stat *stb)
{
	int ret;

	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0) {
		ret = -errno;
		kvfs_err("safetensors %s: cannot open: %s", path,
			 strerror(-ret));
		return ret;
	}
	if (fstat(*fd, stb)) {
		ret = -errno;
		kvfs_err("safetensors %s: fstat: %s", path, strerror(-ret));
		goto out_close_fd;
	}
	if (!S_ISREG(stb->st_mode)) {
		ret = st_reject(path, NULL, "not a regular file");
		goto out_close_fd;
	}
	return 0;
out_close_fd:
	close(*fd);
	return ret;
}

static int st_file_open(struct st_file *f, const char *path)
{
	struct stat stb;
	uint64_t hlen;
	void *map;
	int fd, ret;

	memset(f, 0, sizeof(*f));
	f->path = strdup(path);
	if (!f->path)
		return -ENOMEM;
	ret = st_open_fd(path, &fd, &stb);
	if (ret)
		goto out_release;
	if (stb.st_size < 8) {
		ret = st_reject(path, NULL,
				"file of %lld bytes is shorter than the 8-byte header length",
				(long long)stb.st_size);
		goto out_close_fd;
	}
	if ((uint64_t)stb.st_size > SIZE_MAX) {
		ret = st_reject(path, NULL, "file too large to map");
		goto out_close_fd;
	}
	map = mmap(NULL, (size_t)stb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		ret = -errno;
		kvfs_err("safetensors %s: mmap: %s", path, strerror(-ret));
		goto out_close_fd;
	}
	f->map = map;
	f->map_len = (size_t)stb.st_size;
	memcpy(&hlen, f->map, 8);
	if (hlen > KVFS_ST_MAX_HEADER) {
		ret = st_reject(path, NULL,
				"header length %llu exceeds the %u-byte limit",
				(unsigned long long)hlen, KVFS_ST_MAX_HEADER);
		goto out_close_fd;
	}
	if (hlen > f->map_len - 8) {
		ret = st_reject(path, NULL,
				"header length %llu runs past the end of the file (%zu bytes)",
				(unsigned long long)hlen, f->map_len);
		goto out_close_fd;
	}
	if (hlen < 2 || f->map[8] != '{') {
		ret = st_reject(path, NULL,
				"header does not start with '{'");
		goto out_close_fd;
	}
	f->data = f->map + 8 + hlen;
	f->data_len = f->map_len - 8 - hlen;
	ret = st_parse_header(f, (const char *)f->map + 8, (size_t)hlen);
out_close_fd:
	close(fd);
	if (!ret)
		return 0;
out_release:
	st_file_release(f);
	return ret;
}

static void st_fill(const struct kvfs_st *st, const struct st_ref *r,
		    struct kvfs_st_tensor *out)
{
	const struct st_file *f = &st->files[r->file];
	const struct st_entry *e = &f->ents[r->ent];

	memset(out, 0, sizeof(*out));
	out->name = r->name;
	out->file = f->path;
	out->dtype = e->dtype;
	out->ndim = e->ndim;
	memcpy(out->shape, e->shape, sizeof(out->shape));
	out->numel = e->numel;
	out->data = f->data + e->begin;
	out->nbytes = e->end - e->begin;
}

static int ref_cmp(const void *a, const void *b)
{
	const struct st_ref *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static const struct st_entry *ent_find(const struct st_file *f,
				       const char *name, size_t *idx)
{
	size_t lo = 0, hi = f->n_ents;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, f->ents[mid].name);

		if (!c) {
			*idx = mid;
			return &f->ents[mid];
		}
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

static int st_open_single(struct kvfs_st *st, const char *path)
{
	int ret;

	st->files = calloc(1, sizeof(*st->files));
	if (!st->files)
		return -ENOMEM;
	ret = st_file_open(&st->files[0], path);
	if (ret)
		return ret;
	st->n_files = 1;
	st->n_refs = st->files[0].n_ents;
	st->refs = calloc(st->n_refs ? st->n_refs : 1, sizeof(*st->refs));
	if (!st->refs)
		return -ENOMEM;
	for (size_t i = 0; i < st->n_refs; i++) {
		st->refs[i].name = st->files[0].ents[i].name;
		st->refs[i].file = 0;
		st->refs[i].ent = (uint32_t)i;
	}
	return 0;
}

/* Read a whole (small) file into a malloc'd buffer. */
static int st_slurp(const char *path, char **buf, size_t *len)
{
	struct stat stb;
	int fd, ret;

	ret = st_open_fd(path, &fd, &stb);
	if (ret)
		return ret;
	if ((uint64_t)stb.st_size > KVFS_ST_MAX_HEADER) {
		ret = st_reject(path, NULL,
				"index of %lld bytes exceeds the %u-byte limit",
				(long long)stb.st_size, KVFS_ST_MAX_HEADER);
		goto out_close_fd;
	}
	*buf = malloc((size_t)stb.st_size + 1);
	if (!*buf) {
		ret = -ENOMEM;
		goto out_close_fd;
	}
	ret = kvfs_util_read_full(fd, *buf, (uint64_t)stb.st_size, -1);
	if (ret) {
		/* The file ending early is an I/O error here. */
		if (ret == -ENODATA)
			ret = -EIO;
		kvfs_err("safetensors %s: read: %s", path, strerror(-ret));
		free(*buf);
		*buf = NULL;
		goto out_close_fd;
	}
	*len = (size_t)stb.st_size;
out_close_fd:
	close(fd);
	return ret;
}

struct shard_name {
	const char *name;
};

static int shard_cmp(const void *a, const void *b)
{
	return strcmp(((const struct shard_name *)a)->name,
		      ((const struct shard_name *)b)->name);
}

static int shard_name_ok(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static int st_open_index(struct kvfs_st *st, const char *path)
{
	struct shard_name *shards = NULL;
	const char **shard_of = NULL;
	struct jparser p;
	uint32_t wm = 0, n_wm;
	size_t len = 0, n_shards = 0, dirlen;
	const char *slash;
	char *buf = NULL;
	int ret;

	ret = st_slurp(path, &buf, &len);
	if (ret)
		return ret;
	ret = jparse(&p, buf, len);
	if (ret) {
		ret = jreject(path, "index", &p, ret);
		goto out_release;
	}
	for (uint32_t c = p.nodes[0].first; c; c = p.nodes[c].next)
		if (!strcmp(jkey_of(&p, c), "weight_map"))
			wm = c;
	if (!wm || p.nodes[wm].type != J_OBJ) {
		ret = st_reject(path, NULL,
				wm ? "weight_map is not an object" :
				     "no weight_map");
		goto out_release;
	}
	n_wm = p.nodes[wm].n;
	shards = calloc(n_wm ? n_wm : 1, sizeof(*shards));
	shard_of = calloc(n_wm ? n_wm : 1, sizeof(*shard_of));
	st->refs = calloc(n_wm ? n_wm : 1, sizeof(*st->refs));
	if (!shards || !shard_of || !st->refs) {
		ret = -ENOMEM;
		goto out_release;
	}
	for (uint32_t c = p.nodes[wm].first, i = 0; c; c = p.nodes[c].next) {
		const char *tname = jkey_of(&p, c);

		if (p.nodes[c].type != J_STR) {
			ret = st_reject(path, tname,
					"weight_map value is not a string");
			goto out_release;
		}
		if (!shard_name_ok(jstr_of(&p, c))) {
			ret = st_reject(path, tname,
					"shard \"%s\" is not a plain file name",
					jstr_of(&p, c));
			goto out_release;
		}
		st->refs[i].name = tname;
		shard_of[i] = jstr_of(&p, c);
		shards[i].name = shard_of[i];
		i++;
	}
	qsort(shards, n_wm, sizeof(*shards), shard_cmp);
	for (size_t i = 0; i < n_wm; i++)
		if (!n_shards || strcmp(shards[n_shards - 1].name,
					shards[i].name))
			shards[n_shards++] = shards[i];

	st->files = calloc(n_shards ? n_shards : 1, sizeof(*st->files));
	if (!st->files) {
		ret = -ENOMEM;
		goto out_release;
	}
	slash = strrchr(path, '/');
	dirlen = slash ? (size_t)(slash - path) : 0;
	for (size_t i = 0; i < n_shards; i++) {
		size_t nlen = strlen(shards[i].name);
		char *sp = malloc(dirlen + nlen + 3);

		if (!sp) {
			ret = -ENOMEM;
			goto out_release;
		}
		if (slash)
			snprintf(sp, dirlen + nlen + 3, "%.*s/%s", (int)dirlen,
				 path, shards[i].name);
		else
			snprintf(sp, dirlen + nlen + 3, "%s", shards[i].name);
		ret = st_file_open(&st->files[i], sp);
		free(sp);
		if (ret) {
			kvfs_err("safetensors %s: shard \"%s\" refused", path,
				 shards[i].name);
			goto out_release;
		}
		st->n_files++;
	}
	for (size_t i = 0; i < n_wm; i++) {
		struct shard_name key = { shard_of[i] };
		struct shard_name *s = bsearch(&key, shards, n_shards,
					       sizeof(*shards), shard_cmp);
		size_t ent;

		/* s cannot be NULL: every name went into the table. */
		st->refs[i].file = (uint32_t)(s - shards);
		if (!ent_find(&st->files[st->refs[i].file], st->refs[i].name,
			      &ent)) {
			ret = st_reject(path, st->refs[i].name,
					"weight_map names shard \"%s\", which does not hold it",
					shard_of[i]);
			goto out_release;
		}
		st->refs[i].ent = (uint32_t)ent;
	}
	st->n_refs = n_wm;
	qsort(st->refs, st->n_refs, sizeof(*st->refs), ref_cmp);
	st->strs = p.str;
	p.str = NULL;
out_release:
	jrelease(&p);
	free(shards);
	free(shard_of);
	free(buf);
	return ret;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && !strcmp(s + n - m, suffix);
}

int kvfs_st_open(const char *path, struct kvfs_st **out)
{
	struct kvfs_st *st;
	int ret;

	if (!path || !out)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	if (ends_with(path, ".json"))
		ret = st_open_index(st, path);
	else
		ret = st_open_single(st, path);
	if (ret) {
		if (ret == -ENOMEM)
			kvfs_err("safetensors %s: out of memory", path);
		kvfs_st_free(st);
		return ret;
	}
	*out = st;
	return 0;
}

void kvfs_st_free(struct kvfs_st *st)
{
	if (!st)
		return;
	if (st->files) {
		/* A failed open may leave one half-opened file past n_files;
		 * release is idempotent on a zeroed struct.
		 */
		for (size_t i = 0; i < st->n_files; i++)
			st_file_release(&st->files[i]);
	}
	free(st->files);
	free(st->refs);
	free(st->strs);
	free(st);
}

int kvfs_st_get(const struct kvfs_st *st, const char *name,
		struct kvfs_st_tensor *out)
{
	struct st_ref key = { .name = name };
	const struct st_ref *r;

	if (!st || !name || !out)
		return -EINVAL;
	r = bsearch(&key, st->refs, st->n_refs, sizeof(*st->refs), ref_cmp);
	if (!r)
		return -ENOENT;
	st_fill(st, r, out);
	return 0;
}

size_t kvfs_st_count(const struct kvfs_st *st)
{
	return st ? st->n_refs : 0;
}

int kvfs_st_at(const struct kvfs_st *st, size_t i, struct kvfs_st_tensor *out)
{
	if (!st || !out || i >= st->n_refs)
		return -EINVAL;
	st_fill(st, &st->refs[i], out);
	return 0;
}

size_t kvfs_st_n_files(const struct kvfs_st *st)
{
	return st ? st->n_files : 0;
}
