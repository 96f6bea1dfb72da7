/* SPDX-License-Identifier: MIT */
/*
 * safetensors parser: every rejection path, on files written here, each
 * checked for its return code and for the reason in the log line (so a
 * file refused for the wrong reason fails the test); then valid single
 * files and sharded checkpoints.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "hcache/safetensors.h"
#include "meta/log.h"

static char dir[64];
static char logpath[80];

static int rm_one(const char *p, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	return remove(p);
}

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/kvfs-test-st-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(logpath, sizeof(logpath), "%s.log", dir);
	return kvfs_log_open(logpath);
}

static int teardown(void **state)
{
	kvfs_log_close();
	unlink(logpath);
	return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *path_of(const char *name)
{
	static char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

static void write_raw(const char *name, const void *buf, size_t len)
{
	FILE *f = fopen(path_of(name), "wb");

	assert_non_null(f);
	if (len)
		assert_int_equal(fwrite(buf, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* Header of @hlen bytes (may hold NULs) then @dlen bytes of data. */
static void write_st_n(const char *name, const char *hdr, size_t hlen,
		       const void *data, size_t dlen)
{
	size_t len = 8 + hlen + dlen;
	uint8_t *buf = calloc(1, len);
	uint64_t n = hlen;

	assert_non_null(buf);
	memcpy(buf, &n, 8);
	memcpy(buf + 8, hdr, hlen);
	if (data)
		memcpy(buf + 8 + hlen, data, dlen);
	write_raw(name, buf, len);
	free(buf);
}

static void write_st(const char *name, const char *hdr, const void *data,
		     size_t dlen)
{
	write_st_n(name, hdr, strlen(hdr), data, dlen);
}

static void log_reset(void)
{
	assert_int_equal(truncate(logpath, 0), 0);
}

static int log_has(const char *needle)
{
	char buf[65536];
	FILE *f = fopen(logpath, "r");
	size_t n;

	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (!strstr(buf, needle)) {
		print_error("log lacks \"%s\":\n%s", needle, buf);
		return 0;
	}
	return 1;
}

/* Open @name expecting @err and a log line with the path and @reason. */
static void expect_fail(const char *name, int err, const char *reason)
{
	struct kvfs_st *st = (struct kvfs_st *)0x1;
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s", path_of(name));
	log_reset();
	assert_int_equal(kvfs_st_open(p, &st), err);
	/* untouched on failure */
	assert_ptr_equal(st, (struct kvfs_st *)0x1);
	assert_true(log_has(p));
	if (reason)
		assert_true(log_has(reason));
}

/* --------------------------------------------------------- file level */

static void test_missing_file(void **state)
{
	expect_fail("nope.safetensors", -ENOENT, "cannot open");
}

static void test_not_regular(void **state)
{
	assert_int_equal(mkdir(path_of("adir.safetensors"), 0755), 0);
	expect_fail("adir.safetensors", -EINVAL, "not a regular file");
}

static void test_too_short(void **state)
{
	write_raw("short.safetensors", "\x02\0\0\0", 4);
	expect_fail("short.safetensors", -EINVAL, "shorter than the 8-byte");
	write_raw("empty.safetensors", "", 0);
	expect_fail("empty.safetensors", -EINVAL, "shorter than the 8-byte");
}

static void test_header_past_eof(void **state)
{
	uint8_t buf[8 + 20];
	uint64_t n = 100;

	memset(buf, ' ', sizeof(buf));
	memcpy(buf, &n, 8);
	buf[8] = '{';
	buf[9] = '}';
	write_raw("trunc.safetensors", buf, sizeof(buf));
	expect_fail("trunc.safetensors", -EINVAL, "runs past the end");
}

/* A header length over the limit is refused even when the file is big
 * enough to hold it (a sparse file, so this costs no disk).
 */
static void test_header_over_limit(void **state)
{
	uint64_t n = (uint64_t)KVFS_ST_MAX_HEADER + 1;
	int fd = open(path_of("huge.safetensors"), O_CREAT | O_WRONLY, 0644);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &n, 8, 0), 8);
	assert_int_equal(pwrite(fd, "{}", 2, 8), 2);
	assert_int_equal(ftruncate(fd, (off_t)n + 64), 0);
	close(fd);
	expect_fail("huge.safetensors", -EINVAL, "exceeds the 104857600-byte");
}

static void test_header_zero(void **state)
{
	write_st_n("zero.safetensors", "", 0, "{}", 2);
	expect_fail("zero.safetensors", -EINVAL, "does not start with '{'");
}

/* ---------------------------------------------------------- bad JSON */

struct bad {
	const char *hdr;
	size_t dlen;
	const char *reason;
};

static const struct bad bad_json[] = {
	{ "[]", 0, "does not start with '{'" },
	{ " {}", 0, "does not start with '{'" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
	  "unterminated object" },
	{ "{\"a", 0, "unterminated string" },
	{ "{\"a\\x\":1}", 0, "bad escape" },
	{ "{\"a\\u12G4\":1}", 0, "bad hex digit" },
	{ "{\"a\\u12", 0, "truncated \\u escape" },
	{ "{\"\\ud800\":1}", 0, "unpaired high surrogate" },
	{ "{\"\\ud800\\u0041\":1}", 0, "unpaired high surrogate" },
	{ "{\"\\udc00\":1}", 0, "unpaired low surrogate" },
	{ "{\"a\\u0000\":1}", 0, "\\u0000 in string" },
	{ "{\"a\tb\":1}", 0, "control character in string" },
	{ "{\"\xc0\x80\":1}", 0, "invalid UTF-8" },
	{ "{\"\xed\xa0\x80\":1}", 0, "invalid UTF-8" },
	{ "{\"\xf4\x90\x80\x80\":1}", 0, "invalid UTF-8" },
	{ "{\"\xe2\x82\":1}", 0, "invalid UTF-8" },
	{ "{} x", 0, "trailing garbage" },
	{ "{}{}", 0, "trailing garbage" },
	{ "{\"a\":1,}", 0, "expected a string key" },
	{ "{,}", 0, "expected a string key" },
	{ "{\"a\" 1}", 0, "expected ':'" },
	{ "{\"a\":1 \"b\":2}", 0, "expected ',' or '}'" },
	{ "{\"a\":[1 2]}", 0, "expected ',' or ']'" },
	{ "{\"a\":[1,2}", 0, "expected ',' or ']'" },
	{ "{\"a\":01}", 0, "leading zero" },
	{ "{\"a\":1.5}", 0, "non-integer number" },
	{ "{\"a\":1e3}", 0, "non-integer number" },
	{ "{\"a\":-}", 0, "bad number" },
	{ "{\"a\":18446744073709551616}", 0, "integer out of range" },
	{ "{\"a\":tru}", 0, "unexpected character" },
	{ "{\"a\":'x'}", 0, "unexpected character" },
	{ "{\"a\":", 0, "unexpected end of JSON" },
	{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
	  8, "duplicate key" },
	{ "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
	  "\"data_offsets\":[0,4]}}", 4, "duplicate key" },
};

static void test_bad_json(void **state)
{
	static const uint8_t zeros[16];

	for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
		char name[64];

		snprintf(name, sizeof(name), "json%zu.safetensors", i);
		write_st(name, bad_json[i].hdr, zeros, bad_json[i].dlen);
		print_message("json case %zu: %s\n", i, bad_json[i].reason);
		expect_fail(name, -EINVAL, bad_json[i].reason);
	}
}

/* Nesting 40 deep (deeper than the parser's 32) is refused. */
static void test_deep_nesting(void **state)
{
	char hdr[256];
	size_t o = 0;

	o += (size_t)sprintf(hdr + o, "{\"__metadata__\":");
	for (int i = 0; i < 40; i++)
		hdr[o++] = '[';
	for (int i = 0; i < 40; i++)
		hdr[o++] = ']';
	hdr[o++] = '}';
	hdr[o] = '\0';
	write_st("deep.safetensors", hdr, NULL, 0);
	expect_fail("deep.safetensors", -EINVAL, "nested too deeply");
}

/* Padding must be spaces (or JSON whitespace), not NULs. */
static void test_nul_padding(void **state)
{
	write_st_n("nul.safetensors", "{}\0\0\0\0\0\0", 8, NULL, 0);
	expect_fail("nul.safetensors", -EINVAL, "trailing garbage");
}

/* --------------------------------------------------- bad tensor entries */

#define T(d, s, o) "{\"dtype\":" d ",\"shape\":" s ",\"data_offsets\":" o "}"

static const struct bad bad_entries[] = {
	{ "{\"t\":5}", 0, "entry is not an object" },
	{ "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
	  "missing dtype" },
	{ "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
	  "missing shape" },
	{ "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
	  "missing data_offsets" },
	{ "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
	  "\"foo\":1}}", 4, "unknown field \"foo\"" },
	{ "{\"t\":" T("32", "[1]", "[0,4]") "}", 4, "dtype is not a string" },
	{ "{\"t\":" T("\"F13\"", "[1]", "[0,4]") "}", 4,
	  "unknown dtype \"F13\"" },
	{ "{\"t\":" T("\"f32\"", "[1]", "[0,4]") "}", 4,
	  "unknown dtype \"f32\"" },
	{ "{\"t\":" T("\"F32\"", "5", "[0,4]") "}", 4,
	  "shape is not an array" },
	{ "{\"t\":" T("\"F32\"", "[-1]", "[0,4]") "}", 4,
	  "shape is not an array" },
	{ "{\"t\":" T("\"F32\"", "[\"1\"]", "[0,4]") "}", 4,
	  "shape is not an array" },
	{ "{\"t\":" T("\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4,
	  "more than 8 dimensions" },
	{ "{\"t\":" T("\"F32\"", "[1]", "[0,4,8]") "}", 8,
	  "data_offsets is not [begin, end]" },
	{ "{\"t\":" T("\"F32\"", "[1]", "[4]") "}", 4,
	  "data_offsets is not [begin, end]" },
	{ "{\"t\":" T("\"F32\"", "[1]", "[-4,0]") "}", 4,
	  "data_offsets is not [begin, end]" },
	{ "{\"t\":" T("\"F32\"", "[1]", "[8,4]") "}", 8,
	  "data_offsets end 4 before begin 8" },
	{ "{\"t\":" T("\"F32\"", "[2]", "[0,8]") "}", 4,
	  "data_offsets end 8 beyond the data section (4 bytes)" },
	/* offsets near 2^64 must not wrap around into the header */
	{ "{\"t\":" T("\"F32\"", "[1]",
		      "[18446744073709551608,18446744073709551612]") "}", 4,
	  "beyond the data section" },
	{ "{\"t\":" T("\"F32\"", "[2]", "[0,4]") "}", 4,
	  "size mismatch: shape and dtype need 8 bytes, data_offsets span 4" },
	{ "{\"t\":" T("\"BF16\"", "[2]", "[0,8]") "}", 8,
	  "size mismatch: shape and dtype need 4 bytes, data_offsets span 8" },
	{ "{\"t\":" T("\"F32\"", "[4294967296,4294967296,2]", "[0,4]") "}",
	  4, "shape size overflows" },
	{ "{\"t\":" T("\"F32\"", "[4611686018427387904]", "[0,4]") "}", 4,
	  "shape size overflows" },
	{ "{\"t\":" T("\"F4\"", "[3]", "[0,1]") "}", 1,
	  "not a whole number of bytes" },
	{ "{\"a\":" T("\"F32\"", "[2]", "[0,8]") ",\"b\":"
	  T("\"F32\"", "[2]", "[4,12]") "}", 12,
	  "overlaps tensor \"a\"" },
	{ "{\"a\":" T("\"F32\"", "[1]", "[0,4]") ",\"b\":"
	  T("\"F32\"", "[1]", "[8,12]") "}", 12, "gap of 4 bytes" },
	{ "{\"a\":" T("\"F32\"", "[1]", "[4,8]") "}", 8, "gap of 4 bytes" },
	{ "{\"a\":" T("\"F32\"", "[1]", "[0,4]") "}", 8,
	  "4 bytes after the last tensor" },
	{ "{}", 4, "4 bytes after the last tensor" },
	{ "{\"__metadata__\":5}", 0, "__metadata__ is not an object" },
	{ "{\"__metadata__\":{\"format\":1}}", 0,
	  "__metadata__ value \"format\" is not a string" },
	{ "{\"\":" T("\"F32\"", "[1]", "[0,4]") "}", 4, "empty tensor name" },
};

static void test_bad_entries(void **state)
{
	static const uint8_t zeros[16];

	for (size_t i = 0; i < sizeof(bad_entries) / sizeof(bad_entries[0]);
	     i++) {
		char name[64];

		snprintf(name, sizeof(name), "ent%zu.safetensors", i);
		write_st(name, bad_entries[i].hdr, zeros, bad_entries[i].dlen);
		print_message("entry case %zu: %s\n", i, bad_entries[i].reason);
		expect_fail(name, -EINVAL, bad_entries[i].reason);
	}
}

/* The tensor is named in the log line. */
static void test_reject_names_tensor(void **state)
{
	write_st("named.safetensors",
		 "{\"model.layers.3.self_attn.k_proj.weight\":"
		 T("\"F32\"", "[3]", "[0,8]") "}", "\0\0\0\0\0\0\0\0", 8);
	expect_fail("named.safetensors", -EINVAL,
		    "tensor \"model.layers.3.self_attn.k_proj.weight\": size mismatch");
}

/* ---------------------------------------------------------- valid files */

static void test_valid_single(void **state)
{
	/* 13-byte padding puts the data at an odd offset: pointers into the
	 * mapping are unaligned and must still be right.
	 */
	const char *hdr =
		"{\"__metadata__\":{\"format\":\"pt\"},"
		"\"w\\u00e9ight\":" T("\"F32\"", "[2,3]", "[0,24]") ","
		"\"b\" : " T("\"BF16\"", "[4]", "[24,32]") ",\n"
		"\"s\":" T("\"I64\"", "[]", "[32,40]") ","
		"\"z\":" T("\"F16\"", "[0,5]", "[40,40]") ","
		"\"q\":" T("\"F8_E4M3\"", "[2]", "[40,42]") ","
		"\"e\":{}"
		"}             ";
	uint8_t data[42];
	struct kvfs_st_tensor t;
	struct kvfs_st *st;
	float f[6];
	int ret;

	/* "e" is an entry without fields: refused first, then dropped */
	for (int i = 0; i < 6; i++)
		f[i] = (float)i + 0.5f;
	memcpy(data, f, 24);
	for (int i = 0; i < 18; i++)
		data[24 + i] = (uint8_t)(0xa0 + i);
	write_st("bad_e.safetensors", hdr, data, sizeof(data));
	expect_fail("bad_e.safetensors", -EINVAL, "tensor \"e\": missing dtype");

	hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
	      "\"w\\u00e9ight\":" T("\"F32\"", "[2,3]", "[0,24]") ","
	      "\"b\" : " T("\"BF16\"", "[4]", "[24,32]") ",\n"
	      "\"s\":" T("\"I64\"", "[]", "[32,40]") ","
	      "\"z\":" T("\"F16\"", "[0,5]", "[40,40]") ","
	      "\"q\":" T("\"F8_E4M3\"", "[2]", "[40,42]") "}   ";
	write_st("ok.safetensors", hdr, data, sizeof(data));
	log_reset();
	ret = kvfs_st_open(path_of("ok.safetensors"), &st);
	assert_int_equal(ret, 0);
	assert_int_equal(kvfs_st_count(st), 5);
	assert_int_equal(kvfs_st_n_files(st), 1);

	assert_int_equal(kvfs_st_get(st, "w\xc3\xa9ight", &t), 0);
	assert_int_equal(t.dtype, KVFS_ST_F32);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 2);
	assert_int_equal(t.shape[1], 3);
	assert_int_equal(t.numel, 6);
	assert_int_equal(t.nbytes, 24);
	assert_memory_equal(t.data, f, 24);
	assert_string_equal(t.file, path_of("ok.safetensors"));

	assert_int_equal(kvfs_st_get(st, "b", &t), 0);
	assert_int_equal(t.dtype, KVFS_ST_BF16);
	assert_int_equal(t.nbytes, 8);
	assert_memory_equal(t.data, data + 24, 8);

	assert_int_equal(kvfs_st_get(st, "s", &t), 0);
	assert_int_equal(t.dtype, KVFS_ST_I64);
	assert_int_equal(t.ndim, 0);
	assert_int_equal(t.numel, 1);
	assert_int_equal(t.nbytes, 8);

	assert_int_equal(kvfs_st_get(st, "z", &t), 0);
	assert_int_equal(t.numel, 0);
	assert_int_equal(t.nbytes, 0);
	assert_int_equal(t.ndim, 2);

	assert_int_equal(kvfs_st_get(st, "q", &t), 0);
	assert_int_equal(t.dtype, KVFS_ST_F8_E4M3);
	assert_memory_equal(t.data, data + 40, 2);

	/* offsets are relative to the data section, right after the header */
	assert_int_equal(kvfs_st_get(st, "w\xc3\xa9ight", &t), 0);
	{
		struct kvfs_st_tensor b;

		assert_int_equal(kvfs_st_get(st, "b", &b), 0);
		assert_ptr_equal((const uint8_t *)b.data,
				 (const uint8_t *)t.data + 24);
	}

	assert_int_equal(kvfs_st_get(st, "missing", &t), -ENOENT);
	assert_int_equal(kvfs_st_get(st, "__metadata__", &t), -ENOENT);
	assert_int_equal(kvfs_st_get(st, "w\xc3\xa9igh", &t), -ENOENT);

	/* name order */
	assert_int_equal(kvfs_st_at(st, 0, &t), 0);
	assert_string_equal(t.name, "b");
	assert_int_equal(kvfs_st_at(st, 3, &t), 0);
	assert_string_equal(t.name, "w\xc3\xa9ight");
	assert_int_equal(kvfs_st_at(st, 4, &t), 0);
	assert_string_equal(t.name, "z");
	assert_int_equal(kvfs_st_at(st, 5, &t), -EINVAL);
	kvfs_st_free(st);
}

static void test_empty_checkpoint(void **state)
{
	struct kvfs_st *st;
	struct kvfs_st_tensor t;

	write_st("none.safetensors", "{}", NULL, 0);
	assert_int_equal(kvfs_st_open(path_of("none.safetensors"), &st), 0);
	assert_int_equal(kvfs_st_count(st), 0);
	assert_int_equal(kvfs_st_get(st, "x", &t), -ENOENT);
	kvfs_st_free(st);
	kvfs_st_free(NULL);
}

static void test_dtype_table(void **state)
{
	assert_string_equal(kvfs_st_dtype_name(KVFS_ST_BF16), "BF16");
	assert_int_equal(kvfs_st_dtype_bits(KVFS_ST_BF16), 16);
	assert_int_equal(kvfs_st_dtype_bits(KVFS_ST_F64), 64);
	assert_int_equal(kvfs_st_dtype_bits(KVFS_ST_F4), 4);
	assert_int_equal(kvfs_st_dtype_bits(0), 0);
	assert_int_equal(kvfs_st_dtype_bits(999), 0);
	assert_null(kvfs_st_dtype_name(-1));
}

/* ------------------------------------------------------------- sharded */

static void write_shards(void)
{
	float a[2] = { 1.0f, 2.0f }, b[3] = { 3.0f, 4.0f, 5.0f };
	float c[1] = { 6.0f };
	uint8_t d1[8 + 4], d2[12];

	memcpy(d1, a, 8);
	memcpy(d1 + 8, c, 4);
	write_st("m-00001-of-00002.safetensors",
		 "{\"a\":" T("\"F32\"", "[2]", "[0,8]") ","
		 "\"extra\":" T("\"F32\"", "[1]", "[8,12]") "}", d1, 12);
	memcpy(d2, b, 12);
	write_st("m-00002-of-00002.safetensors",
		 "{\"b\":" T("\"F32\"", "[3]", "[0,12]") "}", d2, 12);
}

static void test_sharded(void **state)
{
	struct kvfs_st_tensor t;
	struct kvfs_st *st;
	const char *idx =
		"{\n  \"metadata\": {\"total_size\": 20, \"x\": [null, true, false]},\n"
		"  \"weight_map\": {\n"
		"    \"a\": \"m-00001-of-00002.safetensors\",\n"
		"    \"b\": \"m-00002-of-00002.safetensors\"\n  }\n}\n";

	write_shards();
	write_raw("model.safetensors.index.json", idx, strlen(idx));
	assert_int_equal(kvfs_st_open(path_of("model.safetensors.index.json"),
				      &st), 0);
	assert_int_equal(kvfs_st_count(st), 2);
	assert_int_equal(kvfs_st_n_files(st), 2);
	assert_int_equal(kvfs_st_get(st, "a", &t), 0);
	assert_int_equal(((const float *)t.data)[1] == 2.0f, 1);
	assert_non_null(strstr(t.file, "m-00001-of-00002.safetensors"));
	assert_int_equal(kvfs_st_get(st, "b", &t), 0);
	assert_int_equal(t.numel, 3);
	assert_non_null(strstr(t.file, "m-00002-of-00002.safetensors"));
	{
		float v;

		memcpy(&v, (const uint8_t *)t.data + 8, 4);
		assert_true(v == 5.0f);
	}
	/* in a shard but not in the weight_map: not reachable */
	assert_int_equal(kvfs_st_get(st, "extra", &t), -ENOENT);
	kvfs_st_free(st);
}

/* Three tensors in one shard: the shard is mapped once. */
static void test_sharded_dedup(void **state)
{
	struct kvfs_st *st;
	float v[3] = { 1, 2, 3 };
	const char *idx = "{\"weight_map\":{\"x\":\"one.safetensors\","
			  "\"y\":\"one.safetensors\",\"z\":\"one.safetensors\"}}";

	write_st("one.safetensors",
		 "{\"x\":" T("\"F32\"", "[1]", "[0,4]") ","
		 "\"y\":" T("\"F32\"", "[1]", "[4,8]") ","
		 "\"z\":" T("\"F32\"", "[1]", "[8,12]") "}", v, 12);
	write_raw("dedup.index.json", idx, strlen(idx));
	assert_int_equal(kvfs_st_open(path_of("dedup.index.json"), &st), 0);
	assert_int_equal(kvfs_st_count(st), 3);
	assert_int_equal(kvfs_st_n_files(st), 1);
	kvfs_st_free(st);
}

static const struct {
	const char *json;
	int err;
	const char *reason;
} bad_index[] = {
	{ "{\"metadata\":{}}", -EINVAL, "no weight_map" },
	{ "{\"weight_map\":[]}", -EINVAL, "weight_map is not an object" },
	{ "{\"weight_map\":{\"a\":1}}", -EINVAL,
	  "weight_map value is not a string" },
	{ "{\"weight_map\":{\"a\":\"../m-00001-of-00002.safetensors\"}}",
	  -EINVAL, "is not a plain file name" },
	{ "{\"weight_map\":{\"a\":\"..\"}}", -EINVAL,
	  "is not a plain file name" },
	{ "{\"weight_map\":{\"a\":\"\"}}", -EINVAL,
	  "is not a plain file name" },
	{ "{\"weight_map\":{\"a\":\"gone.safetensors\"}}", -ENOENT,
	  "gone.safetensors" },
	{ "{\"weight_map\":{\"b\":\"m-00001-of-00002.safetensors\"}}",
	  -EINVAL, "tensor \"b\": weight_map names shard "
		   "\"m-00001-of-00002.safetensors\", which does not hold it" },
	{ "{\"weight_map\":{\"a\":\"m-00001-of-00002.safetensors\","
	  "\"a\":\"m-00001-of-00002.safetensors\"}}", -EINVAL,
	  "duplicate key" },
	{ "{\"weight_map\":{}} trailing", -EINVAL, "trailing garbage" },
	{ "[1]", -EINVAL, "top level is not an object" },
	{ "{\"weight_map\":{\"a\":\"bad.safetensors\"}}", -EINVAL,
	  "shard \"bad.safetensors\" refused" },
};

static void test_sharded_bad(void **state)
{
	write_shards();
	write_st("bad.safetensors", "{\"a\":1}", NULL, 0);
	for (size_t i = 0; i < sizeof(bad_index) / sizeof(bad_index[0]); i++) {
		char name[64];

		snprintf(name, sizeof(name), "bad%zu.index.json", i);
		write_raw(name, bad_index[i].json, strlen(bad_index[i].json));
		print_message("index case %zu: %s\n", i, bad_index[i].reason);
		expect_fail(name, bad_index[i].err, bad_index[i].reason);
	}
}

static void test_missing_index(void **state)
{
	expect_fail("nothere.index.json", -ENOENT, "cannot open");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_not_regular),
		cmocka_unit_test(test_too_short),
		cmocka_unit_test(test_header_past_eof),
		cmocka_unit_test(test_header_over_limit),
		cmocka_unit_test(test_header_zero),
		cmocka_unit_test(test_bad_json),
		cmocka_unit_test(test_deep_nesting),
		cmocka_unit_test(test_nul_padding),
		cmocka_unit_test(test_bad_entries),
		cmocka_unit_test(test_reject_names_tensor),
		cmocka_unit_test(test_valid_single),
		cmocka_unit_test(test_empty_checkpoint),
		cmocka_unit_test(test_dtype_table),
		cmocka_unit_test(test_sharded),
		cmocka_unit_test(test_sharded_dedup),
		cmocka_unit_test(test_sharded_bad),
		cmocka_unit_test(test_missing_index),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
