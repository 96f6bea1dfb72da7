// SPDX-License-Identifier: MIT
/*
 * Trace reader and writer for kvfs-sim (the generators are in gen.c).
 *
 * The JSON reader handles exactly what the two trace formats need: one flat
 * object per line.  It is strict so that a truncated or corrupted line is
 * reported instead of silently becoming a different request.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/trace.h"
#include "meta/log.h"
#include "meta/util.h"

#define JSON_MAX_MEMBERS 32
#define JSON_KEY_MAX 32
#define JSON_STR_MAX 64
/* Lines reported individually before the rest are only counted. */
#define TRACE_REPORT_MAX 10

enum json_type { J_NUM = 1, J_STR, J_BOOL, J_NULL, J_ARR };

struct json_member {
	char key[JSON_KEY_MAX]; /* truncated keys never match a field */
	int type;
	bool is_int;
	int64_t i;
	double d;
	char s[JSON_STR_MAX];   /* decoded string, truncated */
	size_t arr_off, arr_n;  /* into the parser's int array */
	bool arr_ints;          /* every element an integer */
};

struct json_obj {
	struct json_member m[JSON_MAX_MEMBERS];
	unsigned n;
	int64_t *arr;
	size_t narr, caparr;
};

struct jp {
	const char *p, *end;
	const char *err;
	struct json_obj *o;
};

static void jp_ws(struct jp *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' ||
				 *j->p == '\r' || *j->p == '\n'))
		j->p++;
}

static bool jp_fail(struct jp *j, const char *why)
{
	if (!j->err)
		j->err = why;
	return false;
}


/* A JSON string into @out (truncated to @cap - 1 bytes, NUL-ended). */
static bool jp_string(struct jp *j, char *out, size_t cap)
{
	size_t n = 0;

	if (j->p >= j->end || *j->p != '"')
		return jp_fail(j, "expected a string");
	j->p++;
	while (j->p < j->end && *j->p != '"') {
		unsigned char c = (unsigned char)*j->p++;
		unsigned cp;

		if (c < 0x20)
			return jp_fail(j, "control character in string");
		if (c == '\\') {
			if (j->p >= j->end)
				break;
			c = (unsigned char)*j->p++;
			switch (c) {
			case '"': case '\\': case '/':
				break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case 'u':
				if (j->end - j->p < 4)
					return jp_fail(j, "short \\u escape");
				cp = 0;
				for (int k = 0; k < 4; k++) {
					int h = kvfs_util_hexval(j->p[k]);

					if (h < 0)
						return jp_fail(j,
							"bad \\u escape");
					cp = cp * 16 + (unsigned)h;
				}
				j->p += 4;
				/* Field values are ASCII; others become '?'. */
				c = cp < 0x80 ? (unsigned char)cp : '?';
				break;
			default:
				return jp_fail(j, "bad escape in string");
			}
		}
		if (n + 1 < cap)
			out[n++] = (char)c;
	}
	if (j->p >= j->end)
		return jp_fail(j, "unterminated string");
	j->p++;
	out[n] = 0;
	return true;
}

/* A JSON number; sets *is_int when it has no fraction or exponent and
 * fits an int64.
 */
static bool jp_number(struct jp *j, bool *is_int, int64_t *iv, double *dv)
{
	const char *s = j->p;
	bool neg = false, integral = true, ovf = false;
	uint64_t acc = 0;
	char buf[64];

	if (j->p < j->end && *j->p == '-') {
		neg = true;
		j->p++;
	}
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return jp_fail(j, "bad number");
	if (*j->p == '0') {
		j->p++;
		if (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			return jp_fail(j, "leading zero in number");
	} else {
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
			unsigned dgt = (unsigned)(*j->p++ - '0');

			if (acc > (UINT64_MAX - dgt) / 10)
				ovf = true;
			else
				acc = acc * 10 + dgt;
		}
	}
	if (j->p < j->end && *j->p == '.') {
		integral = false;
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return jp_fail(j, "bad fraction in number");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		integral = false;
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return jp_fail(j, "bad exponent in number");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if ((size_t)(j->p - s) >= sizeof(buf))
		return jp_fail(j, "number too long");
	memcpy(buf, s, (size_t)(j->p - s));
	buf[j->p - s] = 0;
	*dv = strtod(buf, NULL);
	if (integral && !ovf &&
	    acc <= (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) {
		*is_int = true;
		*iv = neg ? (int64_t)(0 - acc) : (int64_t)acc;
	} else {
		*is_int = false;
		*iv = 0;
	}
	return true;
}

static bool jp_lit(struct jp *j, const char *lit)
{
	size_t n = strlen(lit);

	if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n))
		return jp_fail(j, "bad literal");
	j->p += n;
	return true;
}

static bool jp_push(struct jp *j, int64_t v)
{
	struct json_obj *o = j->o;

	if (o->narr == o->caparr) {
		size_t cap = o->caparr ? 2 * o->caparr : 1024;
		int64_t *na = realloc(o->arr, cap * sizeof(*na));

		if (!na)
			return jp_fail(j, "out of memory");
		o->arr = na;
		o->caparr = cap;
	}
	o->arr[o->narr++] = v;
	return true;
}

static bool jp_array(struct jp *j, struct json_member *m)
{
	m->arr_off = j->o->narr;
	m->arr_n = 0;
	m->arr_ints = true;
	j->p++; /* '[' */
	jp_ws(j);
	if (j->p < j->end && *j->p == ']') {
		j->p++;
		return true;
	}
	for (;;) {
		bool is_int;
		int64_t iv;
		double dv;

		jp_ws(j);
		if (j->p >= j->end)
			return jp_fail(j, "unterminated array");
		if (*j->p == '[' || *j->p == '{' || *j->p == '"')
			return jp_fail(j, "array element is not a number");
		if (!jp_number(j, &is_int, &iv, &dv))
			return false;
		if (!is_int)
			m->arr_ints = false;
		if (!jp_push(j, iv))
			return false;
		m->arr_n++;
		jp_ws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		if (j->p < j->end && *j->p == ']') {
			j->p++;
			return true;
		}
		return jp_fail(j, "expected ',' or ']' in array");
	}
}

static bool jp_value(struct jp *j, struct json_member *m)
{
	jp_ws(j);
	if (j->p >= j->end)
		return jp_fail(j, "missing value");
	switch (*j->p) {
	case '"':
		m->type = J_STR;
		return jp_string(j, m->s, sizeof(m->s));
	case '[':
		m->type = J_ARR;
		return jp_array(j, m);
	case '{':
		return jp_fail(j, "nested objects are not supported");
	case 't':
		m->type = J_BOOL;
		m->i = 1;
		return jp_lit(j, "true");
	case 'f':
		m->type = J_BOOL;
		m->i = 0;
		return jp_lit(j, "false");
	case 'n':
		m->type = J_NULL;
		return jp_lit(j, "null");
	default:
		m->type = J_NUM;
		return jp_number(j, &m->is_int, &m->i, &m->d);
	}
}

/* Parse one flat object spanning all of [p, end). */
static bool json_parse_obj(struct json_obj *o, const char *p, const char *end,
			   const char **err)
{
	struct jp j = { .p = p, .end = end, .o = o };

	o->n = 0;
	o->narr = 0;
	jp_ws(&j);
	if (j.p >= j.end || *j.p != '{') {
		*err = "line is not a JSON object";
		return false;
	}
	j.p++;
	jp_ws(&j);
	if (j.p < j.end && *j.p == '}') {
		j.p++;
		goto out_tail;
	}
	for (;;) {
		struct json_member *m;

		if (o->n == JSON_MAX_MEMBERS) {
			jp_fail(&j, "too many members");
			goto out_err;
		}
		m = &o->m[o->n];
		memset(m, 0, offsetof(struct json_member, s) + 1);
		jp_ws(&j);
		if (!jp_string(&j, m->key, sizeof(m->key)))
			goto out_err;
		for (unsigned k = 0; k < o->n; k++)
			if (!strcmp(o->m[k].key, m->key)) {
				jp_fail(&j, "duplicate key");
				goto out_err;
			}
		jp_ws(&j);
		if (j.p >= j.end || *j.p != ':') {
			jp_fail(&j, "expected ':'");
			goto out_err;
		}
		j.p++;
		if (!jp_value(&j, m))
			goto out_err;
		o->n++;
		jp_ws(&j);
		if (j.p < j.end && *j.p == ',') {
			j.p++;
			continue;
		}
		if (j.p < j.end && *j.p == '}') {
			j.p++;
			break;
		}
		jp_fail(&j, "expected ',' or '}'");
		goto out_err;
	}
out_tail:
	jp_ws(&j);
	if (j.p != j.end) {
		*err = "trailing bytes after the object";
		return false;
	}
	return true;
out_err:
	*err = j.err;
	return false;
}

static const struct json_member *json_get(const struct json_obj *o,
					  const char *key)
{
	for (unsigned k = 0; k < o->n; k++)
		if (!strcmp(o->m[k].key, key))
			return &o->m[k];
	return NULL;
}

uint32_t kvfs_trace_default_block_tokens(int format)
{
	switch (format) {
	case KVFS_TRACE_MOONCAKE:
		return 512;
	case KVFS_TRACE_BAILIAN:
		return 16;
	default:
		return 0;
	}
}

int kvfs_trace_format_parse(const char *name)
{
	if (!name)
		return -EINVAL;
	if (!strcmp(name, "mooncake"))
		return KVFS_TRACE_MOONCAKE;
	if (!strcmp(name, "bailian"))
		return KVFS_TRACE_BAILIAN;
	return -EINVAL;
}

void kvfs_trace_init(struct kvfs_trace *t, int format, uint32_t block_tokens)
{
	memset(t, 0, sizeof(*t));
	t->format = format;
	t->block_tokens = block_tokens ? block_tokens :
			  kvfs_trace_default_block_tokens(format);
}

void kvfs_trace_release(struct kvfs_trace *t)
{
	int format = t->format;
	uint32_t bt = t->block_tokens;

	free(t->req);
	free(t->hash);
	for (unsigned i = 0; i < t->ntypes; i++)
		free(t->types[i]);
	kvfs_trace_init(t, format, bt);
}

static int trace_type(struct kvfs_trace *t, const char *name)
{
	for (unsigned i = 0; i < t->ntypes; i++)
		if (!strcmp(t->types[i], name))
			return (int)i + 1;
	if (t->ntypes == KVFS_TRACE_MAX_TYPES)
		return -E2BIG;
	t->types[t->ntypes] = strdup(name);
	if (!t->types[t->ntypes])
		return -ENOMEM;
	return (int)++t->ntypes;
}

int kvfs_trace_add(struct kvfs_trace *t, const struct kvfs_trace_req *r,
		   const int64_t *hash, uint32_t nhash, const char *type_name)
{
	struct kvfs_trace_req *nr;
	int type = r->type;

	if (type_name) {
		type = trace_type(t, type_name);
		if (type < 0)
			return type;
	}
	if (t->nreq == t->capreq) {
		size_t cap = t->capreq ? 2 * t->capreq : 1024;

		nr = realloc(t->req, cap * sizeof(*nr));
		if (!nr)
			return -ENOMEM;
		t->req = nr;
		t->capreq = cap;
	}
	if (t->nhash + nhash > t->caphash) {
		size_t cap = t->caphash ? t->caphash : 16384;
		int64_t *nh;

		while (cap < t->nhash + nhash)
			cap *= 2;
		nh = realloc(t->hash, cap * sizeof(*nh));
		if (!nh)
			return -ENOMEM;
		t->hash = nh;
		t->caphash = cap;
	}
	nr = &t->req[t->nreq++];
	*nr = *r;
	nr->type = (uint16_t)type;
	nr->nhash = nhash;
	nr->off = t->nhash;
	if (nhash)
		memcpy(t->hash + t->nhash, hash, nhash * sizeof(*hash));
	t->nhash += nhash;
	return 0;
}

/* A required non-negative integer field. */
static const char *field_uint(const struct json_obj *o, const char *key,
			      uint64_t max, uint64_t *out)
{
	const struct json_member *m = json_get(o, key);

	if (!m)
		return "missing field";
	if (m->type != J_NUM || !m->is_int)
		return "not an integer";
	if (m->i < 0 || (uint64_t)m->i > max)
		return "out of range";
	*out = (uint64_t)m->i;
	return NULL;
}

static const char *field_int(const struct json_obj *o, const char *key,
			     int64_t *out)
{
	const struct json_member *m = json_get(o, key);

	if (!m)
		return "missing field";
	if (m->type == J_NULL) {
		*out = -1;
		return NULL;
	}
	if (m->type != J_NUM || !m->is_int)
		return "not an integer";
	*out = m->i;
	return NULL;
}

/* Timestamp in ms: mooncake gives ms, bailian seconds (maybe fractional). */
static const char *field_ts(const struct json_obj *o, int format,
			    uint64_t *out)
{
	const struct json_member *m = json_get(o, "timestamp");
	double v;

	if (!m)
		return "missing field";
	if (m->type != J_NUM)
		return "not a number";
	v = m->is_int ? (double)m->i : m->d;
	if (format == KVFS_TRACE_BAILIAN)
		v *= 1000.0;
	if (!(v >= 0) || v > 1e18)
		return "out of range";
	*out = (uint64_t)llround(v);
	return NULL;
}

/* Parse one line; returns NULL or why it is bad (in @why). */
static const char *trace_line(struct kvfs_trace *t, struct json_obj *o,
			      const char *p, const char *end, char *why,
			      size_t whylen, int *ret)
{
	struct kvfs_trace_req r = { .chat_id = -1, .parent_chat_id = -1 };
	const struct json_member *h, *ty = NULL;
	const char *err = NULL, *field;
	uint64_t v;

	*ret = 0;
	if (!json_parse_obj(o, p, end, &err))
		return err ? err : "bad JSON";
	field = "timestamp";
	if ((err = field_ts(o, t->format, &r.ts_ms)))
		goto out_field;
	field = "input_length";
	if ((err = field_uint(o, field, UINT32_MAX, &v)))
		goto out_field;
	r.input_len = (uint32_t)v;
	field = "output_length";
	if ((err = field_uint(o, field, UINT32_MAX, &v)))
		goto out_field;
	r.output_len = (uint32_t)v;
	if (t->format == KVFS_TRACE_BAILIAN) {
		field = "chat_id";
		if ((err = field_int(o, field, &r.chat_id)))
			goto out_field;
		field = "parent_chat_id";
		if ((err = field_int(o, field, &r.parent_chat_id)))
			goto out_field;
		field = "turn";
		if ((err = field_uint(o, field, UINT16_MAX, &v)))
			goto out_field;
		r.turn = (uint16_t)v;
		field = "type";
		ty = json_get(o, field);
		if (!ty || ty->type != J_STR) {
			err = ty ? "not a string" : "missing field";
			goto out_field;
		}
	}
	field = "hash_ids";
	h = json_get(o, field);
	if (!h || h->type != J_ARR || !h->arr_ints || h->arr_n > UINT32_MAX) {
		err = !h ? "missing field" : h->type != J_ARR ?
		      "not an array" : !h->arr_ints ?
		      "non-integer element" : "too many elements";
		goto out_field;
	}
	*ret = kvfs_trace_add(t, &r, o->arr + h->arr_off, (uint32_t)h->arr_n,
			      ty ? ty->s : NULL);
	if (*ret == -E2BIG) {
		*ret = 0;
		return "too many distinct request types";
	}
	return NULL;
out_field:
	snprintf(why, whylen, "%s: %s", field, err);
	return why;
}

static int trace_one(struct kvfs_trace *t, struct json_obj *o,
		     const char *p, size_t len, size_t lineno)
{
	const char *end = p + len, *q = p, *why;
	char buf[96];
	int ret;

	while (q < end && (*q == ' ' || *q == '\t' || *q == '\r'))
		q++;
	if (q == end)
		return 0; /* blank line */
	t->lines++;
	why = trace_line(t, o, p, end, buf, sizeof(buf), &ret);
	if (ret)
		return ret;
	if (why) {
		t->bad_lines++;
		if (t->bad_lines <= TRACE_REPORT_MAX)
			kvfs_warn("trace line %zu: %s; line skipped", lineno,
				  why);
	}
	return 0;
}

static void trace_summary(const struct kvfs_trace *t)
{
	if (t->bad_lines > TRACE_REPORT_MAX)
		kvfs_warn("trace: %zu bad lines skipped in all (first %d shown)",
			  t->bad_lines, TRACE_REPORT_MAX);
}

int kvfs_trace_parse_buf(struct kvfs_trace *t, const char *buf, size_t len,
			 size_t first_line)
{
	struct json_obj o = { 0 };
	size_t lineno = first_line;
	const char *p = buf, *end = buf + len;
	int ret = 0;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);

		ret = trace_one(t, &o, p, n, lineno++);
		if (ret)
			break;
		p += n + (nl ? 1 : 0);
	}
	free(o.arr);
	trace_summary(t);
	return ret;
}

int kvfs_trace_load(struct kvfs_trace *t, const char *path)
{
	struct json_obj o = { 0 };
	char *line = NULL;
	size_t cap = 0, lineno = 1;
	ssize_t n;
	int ret = 0;
	FILE *f = fopen(path, "r");

	if (!f) {
		ret = -errno;
		kvfs_err("trace %s: cannot open: %s", path, strerror(-ret));
		return ret;
	}
	while ((n = getline(&line, &cap, f)) >= 0) {
		if (n && line[n - 1] == '\n')
			n--;
		if (memchr(line, 0, (size_t)n)) {
			t->lines++;
			t->bad_lines++;
			if (t->bad_lines <= TRACE_REPORT_MAX)
				kvfs_warn("trace line %zu: NUL byte in line; "
					  "line skipped", lineno);
			lineno++;
			continue;
		}
		ret = trace_one(t, &o, line, (size_t)n, lineno++);
		if (ret)
			break;
	}
	if (!ret && ferror(f)) {
		ret = -EIO;
		kvfs_err("trace %s: read error", path);
	}
	free(line);
	free(o.arr);
	fclose(f);
	trace_summary(t);
	return ret;
}

int kvfs_trace_write(const struct kvfs_trace *t, const char *path)
{
	FILE *f = fopen(path, "w");
	int ret = 0;

	if (!f) {
		ret = -errno;
		kvfs_err("trace %s: cannot create: %s", path, strerror(-ret));
		return ret;
	}
	for (size_t i = 0; i < t->nreq; i++) {
		const struct kvfs_trace_req *r = &t->req[i];
		const int64_t *h = t->hash + r->off;

		if (t->format == KVFS_TRACE_BAILIAN) {
			const char *ty = r->type && r->type <= t->ntypes ?
					 t->types[r->type - 1] : "unknown";

			fprintf(f, "{\"chat_id\": %" PRId64
				", \"parent_chat_id\": %" PRId64
				", \"timestamp\": %.3f, \"input_length\": %u"
				", \"output_length\": %u, \"type\": \"%s\""
				", \"turn\": %u, \"hash_ids\": [",
				r->chat_id, r->parent_chat_id,
				(double)r->ts_ms / 1000.0, r->input_len,
				r->output_len, ty, r->turn);
		} else {
			fprintf(f, "{\"timestamp\": %" PRIu64
				", \"input_length\": %u, \"output_length\": %u"
				", \"hash_ids\": [", r->ts_ms, r->input_len,
				r->output_len);
		}
		for (uint32_t k = 0; k < r->nhash; k++)
			fprintf(f, k ? ", %" PRId64 : "%" PRId64, h[k]);
		fputs("]}\n", f);
	}
	if (fflush(f) || ferror(f))
		ret = -EIO;
	if (fclose(f) && !ret)
		ret = -errno;
	if (ret)
		kvfs_err("trace %s: write failed", path);
	return ret;
}
