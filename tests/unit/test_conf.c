/* SPDX-License-Identifier: MIT */
/*
 * kvfs.conf parsing: a full valid config, the defaults, every error class
 * (with the "ORIGIN:LINE: reason" log line), and namespace name rules.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fs/conf.h"
#include "fs/model_digest.h"
#include "hcache/restore.h"
#include "meta/log.h"

static struct kvfs_conf *conf;
static char log_path[] = "/tmp/kvfs-test-conf-log-XXXXXX";
static char cfg_path[] = "/tmp/kvfs-test-conf-cfg-XXXXXX";

static int setup(void **state)
{
	int fd = mkstemp(log_path);

	if (fd < 0)
		return -1;
	close(fd);
	fd = mkstemp(cfg_path);
	if (fd < 0)
		return -1;
	close(fd);
	conf = malloc(sizeof(*conf));
	return conf ? 0 : -1;
}

static int teardown(void **state)
{
	kvfs_log_close();
	unlink(log_path);
	unlink(cfg_path);
	free(conf);
	return 0;
}

static const char ns_ok[] =
	"[namespace llama]\n"
	"layers = 32\n"
	"kv_heads = 8\n"
	"head_dim = 128\n"
	"dtype = bf16\n"
	"block_tokens = 16\n"
	"chunk_tokens = 16\n";

/* Parse @text expecting -EINVAL, logged at @line with @why in the reason. */
static void expect_err(const char *text, unsigned line, const char *why)
{
	char buf[4096], want[64];
	FILE *f;
	size_t n;

	assert_int_equal(truncate(log_path, 0), 0);
	assert_int_equal(kvfs_log_open(log_path), 0);
	assert_int_equal(kvfs_conf_parse(text, "t.conf", conf), -EINVAL);
	kvfs_log_close();
	f = fopen(log_path, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	snprintf(want, sizeof(want), " t.conf:%u: ", line);
	if (!strstr(buf, want) || !strstr(buf, why))
		fail_msg("log '%s' lacks '%s' or '%s'", buf, want, why);
	/* one error, one line */
	assert_ptr_equal(strchr(buf, '\n'), buf + n - 1);
}

static void expect_ok(const char *text)
{
	assert_int_equal(kvfs_conf_parse(text, "t.conf", conf), 0);
}

/* @ns_ok without the line of @key. */
static void ns_without(char *out, const char *key)
{
	const char *p = ns_ok;

	out[0] = '\0';
	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t n = (size_t)(nl - p) + 1;

		if (strncmp(p, key, strlen(key)) || p[strlen(key)] != ' ')
			strncat(out, p, n);
		p += n;
	}
}

static unsigned n_lines(const char *t)
{
	unsigned n = 0;

	for (; *t; t++)
		n += *t == '\n';
	return n;
}

/* @ns_ok with @line ("key = value") replacing that key's line, or added,
 * as the last line.
 */
static void ns_with(char *out, size_t len, const char *line)
{
	char key[64] = "";

	sscanf(line, "%63[a-z_]", key);
	ns_without(out, key);
	if (*line) {
		strncat(out, line, len - strlen(out) - 2);
		strcat(out, "\n");
	}
}

static void test_defaults(void **state)
{
	kvfs_conf_defaults(conf);
	assert_int_equal(conf->threads, 16);
	assert_int_equal(conf->log_level, KVFS_LOG_INFO);
	assert_string_equal(conf->log_file, "");
	assert_int_equal(conf->cache.flush_ms, 1000);
	assert_int_equal(conf->cache.meta_mapsize, 1ull << 30);
	assert_int_equal(conf->cache.dram_capacity, 256ull << 20);
	assert_int_equal(conf->cache.ssd_rings, 4);
	assert_int_equal(conf->cache.writeback_batch, 64);
	assert_int_equal(conf->cache.chunk_spec_depth, 8);
	assert_string_equal(conf->cache.policy, "lru");
	assert_int_equal(conf->cache.n_policy_opts, 0);
	assert_int_equal(conf->cache.n_ns, 0);
	/* an empty config is the defaults */
	memset(conf, 0xff, sizeof(*conf));
	expect_ok("");
	assert_int_equal(conf->threads, 16);
	assert_string_equal(conf->cache.policy, "lru");
	assert_int_equal(conf->cache.n_ns, 0);
	expect_ok("; only a comment\n\n# another\n");
	assert_int_equal(conf->cache.dram_capacity, 256ull << 20);
}

static const char full[] =
	"\xef\xbb\xbf; kvfs test config\n"
	"[daemon]\n"
	"threads = 8\n"
	"log_level = debug\n"
	"log_file = /var/log/kvfs.log\n"
	"flush_ms = 250 ; inline comment\n"
	"meta_mapsize = 2G\n"
	"\n"
	"[tier.dram]\r\n"
	"  capacity = 512MiB\r\n"
	"[tier.ssd]\n"
	"rings = 2\n"
	"writeback_batch = 32\n"
	"[policy]\n"
	"name = hotprefix\n"
	"alpha = 0.5\n"
	"window: 100\n"
	"[namespace llama-3.1_8B]\n"
	"layers = 32\n"
	"kv_heads = 8\n"
	"head_dim = 128\n"
	"dtype = bf16\n"
	"block_tokens = 16\n"
	"chunk_tokens = 4\n"
	"hidden_size = 4096\n"
	"salt = tenant-a\n"
	"[namespace tiny]\n"
	"layers = 1\n"
	"kv_heads = 1\n"
	"head_dim = 1\n"
	"dtype = f8_e4m3\n"
	"block_tokens = 1\n"
	"chunk_tokens = 1\n";

static void check_full(void)
{
	assert_int_equal(conf->threads, 8);
	assert_int_equal(conf->log_level, KVFS_LOG_DEBUG);
	assert_string_equal(conf->log_file, "/var/log/kvfs.log");
	assert_int_equal(conf->cache.flush_ms, 250);
	assert_int_equal(conf->cache.meta_mapsize, 2ull << 30);
	assert_int_equal(conf->cache.dram_capacity, 512ull << 20);
	assert_int_equal(conf->cache.ssd_rings, 2);
	assert_int_equal(conf->cache.writeback_batch, 32);
	assert_string_equal(conf->cache.policy, "hotprefix");
	assert_int_equal(conf->cache.n_policy_opts, 2);
	assert_string_equal(conf->cache.policy_keys[0], "alpha");
	assert_string_equal(conf->cache.policy_vals[0], "0.5");
	assert_string_equal(conf->cache.policy_keys[1], "window");
	assert_string_equal(conf->cache.policy_vals[1], "100");
	assert_int_equal(conf->cache.n_ns, 2);
	assert_string_equal(conf->cache.ns[0].name, "llama-3.1_8B");
	assert_string_equal(conf->cache.ns[0].salt, "tenant-a");
	assert_int_equal(conf->cache.ns[0].geom.n_layers, 32);
	assert_int_equal(conf->cache.ns[0].geom.n_kv_heads, 8);
	assert_int_equal(conf->cache.ns[0].geom.head_dim, 128);
	assert_int_equal(conf->cache.ns[0].geom.dtype, KVFS_DTYPE_BF16);
	assert_int_equal(conf->cache.ns[0].geom.block_tokens, 16);
	assert_int_equal(conf->cache.ns[0].geom.chunk_tokens, 4);
	assert_int_equal(conf->cache.ns[0].geom.hidden_size, 4096);
	assert_string_equal(conf->cache.ns[1].name, "tiny");
	assert_string_equal(conf->cache.ns[1].salt, "");
	assert_int_equal(conf->cache.ns[1].geom.dtype, KVFS_DTYPE_F8_E4M3);
	assert_int_equal(conf->cache.ns[1].geom.hidden_size, 0);
}

static void test_full_valid(void **state)
{
	expect_ok(full);
	check_full();
}

static void test_load_file(void **state)
{
	FILE *f = fopen(cfg_path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(full, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(kvfs_conf_load(cfg_path, conf), 0);
	check_full();
	assert_int_equal(kvfs_conf_load("/nonexistent/kvfs.conf", conf),
			 -ENOENT);
}

static void test_load_file_error_line(void **state)
{
	FILE *f = fopen(cfg_path, "w");
	char buf[2048], want[512];
	size_t n;

	assert_non_null(f);
	fputs("[daemon]\nthreads = 4\nbogus = 1\n", f);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(truncate(log_path, 0), 0);
	assert_int_equal(kvfs_log_open(log_path), 0);
	assert_int_equal(kvfs_conf_load(cfg_path, conf), -EINVAL);
	kvfs_log_close();
	f = fopen(log_path, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	snprintf(want, sizeof(want), "%s:3: unknown key 'bogus'", cfg_path);
	assert_non_null(strstr(buf, want));
}

static void test_chunk_not_dividing_ok(void **state)
{
	char t[1024];

	ns_with(t, sizeof(t), "chunk_tokens = 5");
	expect_ok(t);
	assert_int_equal(conf->cache.ns[0].geom.chunk_tokens, 5);
	ns_with(t, sizeof(t), "chunk_tokens = 1");
	expect_ok(t);
}

static void test_unknown_section(void **state)
{
	expect_err("[daemon]\nthreads = 2\n[tier.tape]\ncapacity = 1G\n", 3,
		   "unknown section [tier.tape]");
	/* even an empty one */
	expect_err("[daemon]\n\n[bogus]\n", 3, "unknown section");
	expect_err("[Daemon]\n", 1, "unknown section");
	expect_err("[namespaces x]\n", 1, "unknown section");
}

static void test_unknown_key(void **state)
{
	char t[1024];

	expect_err("[daemon]\nthreads = 2\nthread = 3\n", 3,
		   "unknown key 'thread' in [daemon]");
	expect_err("[tier.dram]\ncapacity = 1G\nrings = 2\n", 3,
		   "unknown key");
	expect_err("threads = 2\n", 1, "outside of any section");
	ns_with(t, sizeof(t), "heads = 8");
	expect_err(t, 8, "unknown key 'heads' in [namespace llama]");
}

static void test_duplicates(void **state)
{
	char t[1024];

	expect_err("[daemon]\nthreads = 2\nthreads = 3\n", 3,
		   "duplicate key 'threads'");
	expect_err("[daemon]\n[tier.dram]\n[daemon]\n", 3,
		   "duplicate section [daemon]");
	expect_err("[policy]\nname = lru\nk = 1\nk = 2\n", 4,
		   "duplicate key 'k'");
	ns_with(t, sizeof(t), "");
	strcat(t, "[namespace other]\n");
	strcat(t, ns_ok + strlen("[namespace llama]\n"));
	expect_ok(t);
	assert_int_equal(conf->cache.n_ns, 2);
	strcat(t, ns_ok);
	expect_err(t, 15, "duplicate namespace 'llama'");
	/* an indented line is not a continuation of the previous value */
	expect_err("[daemon]\nlog_file = /a\n  /b\n", 3, "syntax error");
}

static void test_bad_numbers(void **state)
{
	static const struct {
		const char *line;
		const char *why;
	} cases[] = {
		{ "layers = 0", "layers = '0'" },
		{ "layers = 1025", "1..1024" },
		{ "layers = -1", "layers = '-1'" },
		{ "layers = 3x", "layers = '3x'" },
		{ "layers = ", "layers = ''" },
		{ "layers = 99999999999", "layers" },
		{ "kv_heads = 0", "kv_heads" },
		{ "kv_heads = 1025", "kv_heads" },
		{ "head_dim = 4097", "head_dim" },
		{ "head_dim = 0", "head_dim" },
		{ "block_tokens = 0", "block_tokens" },
		{ "block_tokens = 65537", "block_tokens" },
		{ "chunk_tokens = 0", "chunk_tokens" },
		{ "hidden_size = 0", "hidden_size" },
		{ "hidden_size = 2000000", "hidden_size" },
		{ "dtype = f64", "dtype = 'f64'" },
		{ "dtype = BF16", "dtype" },
	};
	char t[1024];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ns_with(t, sizeof(t), cases[i].line);
		expect_err(t, n_lines(t), cases[i].why);
	}
	expect_err("[daemon]\nthreads = 0\n", 2, "threads");
	expect_err("[daemon]\nthreads = 1025\n", 2, "threads");
	expect_err("[daemon]\nflush_ms = 0\n", 2, "flush_ms");
	expect_err("[daemon]\nlog_level = loud\n", 2, "log_level");
	expect_err("[tier.ssd]\nrings = 0\n", 2, "rings");
	expect_err("[chunks]\nspec_depth = 257\n", 2, "spec_depth");
	expect_ok("[chunks]\nspec_depth = 0\n");
	assert_int_equal(conf->cache.chunk_spec_depth, 0);
	expect_ok("[chunks]\nspec_depth = 256\n");
	assert_int_equal(conf->cache.chunk_spec_depth, 256);
	expect_err("[tier.ssd]\nwriteback_batch = 5000\n", 2,
		   "writeback_batch");
}

static void test_bad_sizes(void **state)
{
	expect_err("[tier.dram]\ncapacity = lots\n", 2, "capacity = 'lots'");
	expect_err("[tier.dram]\ncapacity = 1Q\n", 2, "capacity");
	expect_err("[tier.dram]\ncapacity = -1G\n", 2, "capacity");
	expect_err("[tier.dram]\ncapacity = 0\n", 2, "capacity");
	expect_err("[tier.dram]\ncapacity = 99999999999999999999\n", 2,
		   "capacity");
	expect_err("[tier.dram]\ncapacity = 17T\n", 2, "capacity");
	expect_err("[daemon]\nmeta_mapsize = 4K\n", 2, "meta_mapsize");
	expect_ok("[tier.dram]\ncapacity = 64k\n");
	assert_int_equal(conf->cache.dram_capacity, 64 << 10);
}

static void test_missing_required(void **state)
{
	static const char *const keys[] = {
		"layers", "kv_heads", "head_dim", "dtype", "block_tokens",
		"chunk_tokens",
	};
	char t[1024];

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		t[0] = '\n';
		ns_without(t + 1, keys[i]);
		/* the error names the section's line, here 2 */
		expect_err(t, 2, keys[i]);
	}
	/* an empty namespace section; the next section ends it */
	expect_err("[daemon]\n[namespace a]\n[tier.dram]\n", 2,
		   "missing required key 'layers'");
	/* ... or the end of the text */
	expect_err("[namespace a]\n; nothing\n", 1, "missing required key");
}

static void test_chunk_exceeds_block(void **state)
{
	char t[1024];

	ns_with(t, sizeof(t), "chunk_tokens = 17");
	expect_err(t, 1, "chunk_tokens 17 exceeds block_tokens 16");
}

static void test_block_too_large(void **state)
{
	char t[1024];

	/* 1024 layers * 1024 heads * 128 dim * 2 * 2 bytes * 16 = 8G */
	snprintf(t, sizeof(t),
		 "[namespace big]\nlayers = 1024\nkv_heads = 1024\n"
		 "head_dim = 128\ndtype = bf16\nblock_tokens = 16\n"
		 "chunk_tokens = 16\n");
	expect_err(t, 1, "exceeds 4G");
}

static void test_namespace_names(void **state)
{
	char t[1024];
	char name[80];

	assert_int_equal(kvfs_conf_ns_name_ok("llama"), 0);
	assert_int_equal(kvfs_conf_ns_name_ok("A-b_c.9"), 0);
	assert_int_equal(kvfs_conf_ns_name_ok("x."), 0);
	assert_int_equal(kvfs_conf_ns_name_ok(""), -EINVAL);
	assert_int_equal(kvfs_conf_ns_name_ok(NULL), -EINVAL);
	assert_int_equal(kvfs_conf_ns_name_ok(".hidden"), -EINVAL);
	assert_int_equal(kvfs_conf_ns_name_ok(".kvfs"), -EINVAL);
	assert_int_equal(kvfs_conf_ns_name_ok("a/b"), -EINVAL);
	assert_int_equal(kvfs_conf_ns_name_ok("a b"), -EINVAL);
	assert_int_equal(kvfs_conf_ns_name_ok("é"), -EINVAL);
	memset(name, 'n', 63);
	name[63] = '\0';
	assert_int_equal(kvfs_conf_ns_name_ok(name), 0);
	name[63] = 'n';
	name[64] = '\0';
	assert_int_equal(kvfs_conf_ns_name_ok(name), -EINVAL);

	/* a 63-character name survives inih's short section buffer */
	name[63] = '\0';
	snprintf(t, sizeof(t), "[namespace %s]\n%s", name,
		 ns_ok + strlen("[namespace llama]\n"));
	expect_ok(t);
	assert_string_equal(conf->cache.ns[0].name, name);
	/* extra blanks around the name are allowed */
	snprintf(t, sizeof(t), "[namespace \t m1 ]\n%s",
		 ns_ok + strlen("[namespace llama]\n"));
	expect_ok(t);
	assert_string_equal(conf->cache.ns[0].name, "m1");

	expect_err("[namespace .x]\n", 1, "bad namespace name '.x'");
	expect_err("[namespace a b]\n", 1, "bad namespace name 'a b'");
	expect_err("[daemon]\n[namespace]\n", 2, "needs a name");
	expect_err("[namespace  ]\n", 1, "needs a name");
}

static void test_too_many_namespaces(void **state)
{
	size_t cap = (KVFS_PARAMS_MAX_NS + 1) * 128;
	char *t = malloc(cap);
	const char *body = ns_ok + strlen("[namespace llama]\n");
	unsigned line = 1;

	assert_non_null(t);
	t[0] = '\0';
	for (int i = 0; i <= KVFS_PARAMS_MAX_NS; i++) {
		char hdr[40];

		snprintf(hdr, sizeof(hdr), "[namespace m%d]\n", i);
		strcat(t, hdr);
		strcat(t, body);
		if (i < KVFS_PARAMS_MAX_NS)
			line += 7;
	}
	expect_err(t, line, "more than 64 namespaces");
	/* exactly the maximum is fine */
	*strstr(t, "[namespace m64]") = '\0';
	expect_ok(t);
	assert_int_equal(conf->cache.n_ns, KVFS_PARAMS_MAX_NS);
	free(t);
}

static void test_policy(void **state)
{
	char t[4096] = "[policy]\nname = arc\n";

	expect_ok(t);
	assert_string_equal(conf->cache.policy, "arc");
	expect_err("[policy]\nname = \n", 2, "name = ''");
	expect_err("[policy]\nname = Lru!\n", 2,
		   "name = 'Lru!': expected 1..31 of [a-z0-9_-]");
	expect_err("[policy]\nname = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n", 2,
		   "name");
	for (int i = 0; i <= KVFS_PARAMS_MAX_OPTS; i++) {
		char l[32];

		snprintf(l, sizeof(l), "k%d = %d\n", i, i);
		strcat(t, l);
	}
	expect_err(t, 3 + KVFS_PARAMS_MAX_OPTS, "more than 32 policy options");
}

static void test_syntax_and_long_lines(void **state)
{
	char t[600];

	expect_err("[daemon]\nthreads 4\n", 2, "syntax error");
	expect_err("[daemon\n", 1, "syntax error");
	/* inih's error comes first even though ours is found too */
	expect_err("[daemon]\njunk\nthreads = 0\n", 2, "syntax error");
	snprintf(t, sizeof(t), "[daemon]\nlog_file = /%0300d\n", 0);
	expect_err(t, 2, "line longer than");
	/* the same line without its newline, at the end of the text */
	snprintf(t, sizeof(t), "[daemon]\nlog_file = /%0300d", 0);
	expect_err(t, 2, "line longer than");
	snprintf(t, sizeof(t), "[namespace a]\nsalt = %0150d\n", 0);
	expect_err(t, 2, "salt: value longer than 63");
}

/* @ns_ok followed by @lines: the first of them is line 8. */
static void hc_text(char *t, size_t len, const char *lines)
{
	snprintf(t, len, "%s%s", ns_ok, lines);
}

static void test_hcache_keys(void **state)
{
	const struct kvfs_hcache_params *hc = &conf->cache.ns[0].hc;
	char t[2048];

	/* without them: no weights, Hugging Face's defaults, store_as kv */
	expect_ok(ns_ok);
	assert_string_equal(hc->weights, "");
	assert_int_equal(hc->family, 0);
	assert_true(hc->rms_norm_eps == 1e-6);
	assert_true(hc->rope_theta == 10000);
	assert_int_equal(hc->rope_type, KVFS_ROPE_DEFAULT);
	assert_int_equal(hc->store_as, KVFS_STORE_KV);

	hc_text(t, sizeof(t),
		"hidden_size = 4096\n"
		"weights = /models/llama/model.safetensors.index.json\n"
		"family = llama\n"
		"rms_norm_eps = 1e-5\n"
		"rope_theta = 500000\n"
		"rope_scaling = llama3\n"
		"rope_factor = 8\n"
		"rope_low_freq_factor = 1.0\n"
		"rope_high_freq_factor = 4\n"
		"rope_orig_max_pos = 8192\n"
		"store_as = auto\n");
	expect_ok(t);
	assert_string_equal(hc->weights,
			    "/models/llama/model.safetensors.index.json");
	assert_int_equal(hc->family, KVFS_FAMILY_LLAMA);
	assert_true(hc->rms_norm_eps == 1e-5);
	assert_true(hc->rope_theta == 500000);
	assert_int_equal(hc->rope_type, KVFS_ROPE_LLAMA3);
	assert_true(hc->rope_factor == 8);
	assert_true(hc->rope_low_freq_factor == 1);
	assert_true(hc->rope_high_freq_factor == 4);
	assert_int_equal(hc->rope_orig_max_pos, 8192);
	assert_int_equal(hc->store_as, KVFS_STORE_AUTO);

	hc_text(t, sizeof(t),
		"hidden_size = 3584\nweights = /m/q.safetensors\n"
		"family = qwen2\nrope_scaling = linear\nrope_factor = 2.5\n"
		"store_as = hidden\n");
	expect_ok(t);
	assert_int_equal(hc->family, KVFS_FAMILY_QWEN2);
	assert_int_equal(hc->rope_type, KVFS_ROPE_LINEAR);
	assert_true(hc->rope_factor == 2.5);
	assert_int_equal(hc->store_as, KVFS_STORE_HIDDEN);
	assert_int_equal(hc->kv_layers, KVFS_PARAMS_KV_LAYERS_SCHED);
	/* a fixed split for auto: 1024 < 2 * 8 * 128 */
	hc_text(t, sizeof(t),
		"hidden_size = 1024\nweights = /m/l.safetensors\n"
		"family = llama\nstore_as = auto\nhcache_kv_layers = 3\n");
	expect_ok(t);
	assert_int_equal(hc->kv_layers, 3);
	hc_text(t, sizeof(t),
		"hidden_size = 1024\nweights = /m/l.safetensors\n"
		"family = llama\nstore_as = auto\nhcache_kv_layers = 0\n");
	expect_ok(t);
	assert_int_equal(hc->kv_layers, 0);
	hc_text(t, sizeof(t),
		"hidden_size = 1024\nweights = /m/l.safetensors\n"
		"family = llama\nstore_as = auto\nhcache_kv_layers = 32\n");
	expect_ok(t);
	assert_int_equal(hc->kv_layers, 32);
	/* store_as = kv needs nothing */
	hc_text(t, sizeof(t), "store_as = kv\n");
	expect_ok(t);
	assert_int_equal(hc->store_as, KVFS_STORE_KV);
}

static void test_hcache_errors(void **state)
{
	static const struct {
		const char *lines;
		unsigned line;
		const char *why;
	} cases[] = {
		/* what weights needs */
		{ "weights = /m.safetensors\nfamily = llama\n", 8,
		  "weights needs hidden_size" },
		{ "hidden_size = 64\nweights = /m.safetensors\n", 9,
		  "weights needs family" },
		{ "hidden_size = 64\nweights = \nfamily = llama\n", 9,
		  "weights is empty" },
		/* what needs weights */
		{ "hidden_size = 64\nfamily = llama\n", 9,
		  "family needs weights" },
		{ "rope_theta = 1e6\n", 8, "rope_theta needs weights" },
		{ "rms_norm_eps = 1e-5\n", 8, "rms_norm_eps needs weights" },
		{ "rope_scaling = linear\n", 8, "rope_scaling needs weights" },
		{ "store_as = hidden\n", 8, "store_as = hidden needs weights" },
		{ "store_as = auto\n", 8, "store_as = auto needs weights" },
		/* malformed values, at their own line */
		{ "family = mistral\n", 8, "expected llama or qwen2" },
		{ "rms_norm_eps = 0\n", 8, "expected a positive number" },
		{ "rms_norm_eps = -1e-5\n", 8, "expected a positive number" },
		{ "rms_norm_eps = tiny\n", 8, "expected a positive number" },
		{ "rope_theta = nan\n", 8, "expected a positive number" },
		{ "rope_theta = 1e999\n", 8, "expected a positive number" },
		{ "rope_theta = 1e4x\n", 8, "expected a positive number" },
		{ "rope_scaling = yarn\n", 8,
		  "expected default, linear or llama3" },
		{ "rope_scaling = dynamic\n", 8, "not implemented" },
		{ "rope_scaling = none\n", 8, "expected default, linear" },
		{ "rope_orig_max_pos = 0\n", 8, "rope_orig_max_pos = '0'" },
		{ "store_as = both\n", 8, "expected kv, hidden or auto" },
		/* rope keys and their scaling */
		{ "hidden_size = 64\nweights = /m\nfamily = llama\n"
		  "rope_factor = 2\n", 11,
		  "rope_factor is not used by rope_scaling = default" },
		{ "hidden_size = 64\nweights = /m\nfamily = llama\n"
		  "rope_scaling = linear\nrope_low_freq_factor = 1\n"
		  "rope_factor = 2\n", 12,
		  "rope_low_freq_factor is not used by rope_scaling = linear" },
		{ "hidden_size = 64\nweights = /m\nfamily = llama\n"
		  "rope_scaling = linear\n", 11,
		  "rope_scaling = linear needs rope_factor" },
		{ "hidden_size = 64\nweights = /m\nfamily = llama\n"
		  "rope_scaling = llama3\nrope_factor = 8\n"
		  "rope_low_freq_factor = 1\nrope_high_freq_factor = 4\n", 11,
		  "rope_scaling = llama3 needs rope_orig_max_pos" },
		{ "hidden_size = 64\nweights = /m\nfamily = llama\n"
		  "rope_scaling = llama3\nrope_factor = 8\n"
		  "rope_low_freq_factor = 4\nrope_high_freq_factor = 4\n"
		  "rope_orig_max_pos = 8192\n", 14,
		  "rope_high_freq_factor must exceed rope_low_freq_factor" },
		/* hcache_kv_layers */
		{ "hcache_kv_layers = 1\n", 8,
		  "hcache_kv_layers needs weights" },
		{ "hidden_size = 1024\nweights = /m\nfamily = llama\n"
		  "hcache_kv_layers = 1\n", 11,
		  "hcache_kv_layers needs store_as = auto" },
		{ "hidden_size = 1024\nweights = /m\nfamily = llama\n"
		  "store_as = hidden\nhcache_kv_layers = 1\n", 12,
		  "hcache_kv_layers needs store_as = auto" },
		{ "hidden_size = 1024\nweights = /m\nfamily = llama\n"
		  "store_as = auto\nhcache_kv_layers = 33\n", 12,
		  "hcache_kv_layers 33 exceeds layers 32" },
		{ "hidden_size = 2048\nweights = /m\nfamily = llama\n"
		  "hcache_kv_layers = 4\nstore_as = auto\n", 11,
		  "are not smaller than K+V (2048)" },
		{ "hcache_kv_layers = -1\n", 8, "hcache_kv_layers = '-1'" },
		{ "hcache_kv_layers = 2000\n", 8,
		  "hcache_kv_layers = '2000'" },
		{ "hcache_kv_layers = some\n", 8,
		  "hcache_kv_layers = 'some'" },
		/* duplicates, as for every key */
		{ "store_as = kv\nstore_as = kv\n", 9,
		  "duplicate key 'store_as'" },
	};
	char t[2048];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		hc_text(t, sizeof(t), cases[i].lines);
		expect_err(t, cases[i].line, cases[i].why);
	}
	/* RoPE pairs element j with j + head_dim / 2 */
	snprintf(t, sizeof(t),
		 "[namespace odd]\nlayers = 2\nkv_heads = 2\nhead_dim = 63\n"
		 "dtype = bf16\nblock_tokens = 16\nchunk_tokens = 16\n"
		 "hidden_size = 126\nweights = /m\nfamily = qwen2\n");
	expect_err(t, 4, "head_dim 63 must be even");
}

/* [tier.gpu] restore: the three values, the default, and each refusal
 * at the key's own line.
 */
static void test_gpu_restore(void **state)
{
	kvfs_conf_defaults(conf);
	assert_int_equal(conf->cache.gpu_restore, KVFS_PARAMS_RESTORE_AUTO);
	expect_ok("[tier.gpu]\nbackend = cuda\n");
	assert_int_equal(conf->cache.gpu_restore, KVFS_PARAMS_RESTORE_AUTO);
	expect_ok("[tier.gpu]\nbackend = cuda\nrestore = gpu\n");
	assert_int_equal(conf->cache.gpu_restore, KVFS_PARAMS_RESTORE_GPU);
	/* the key may come before the backend it depends on */
	expect_ok("[tier.gpu]\nrestore = cpu\nbackend = cuda\n");
	assert_int_equal(conf->cache.gpu_restore, KVFS_PARAMS_RESTORE_CPU);
	expect_ok("[tier.gpu]\nbackend = shm\nrestore = auto\n");
	assert_int_equal(conf->cache.gpu_restore, KVFS_PARAMS_RESTORE_AUTO);
	expect_ok("[tier.gpu]\nbackend = shm\nrestore = cpu\n");
	assert_int_equal(conf->cache.gpu_restore, KVFS_PARAMS_RESTORE_CPU);

	expect_err("[tier.gpu]\nbackend = cuda\nrestore = GPU\n", 3,
		   "restore = 'GPU': expected auto, gpu or cpu");
	expect_err("[tier.gpu]\nbackend = cuda\nrestore = \n", 3,
		   "expected auto, gpu or cpu");
	expect_err("[tier.gpu]\nbackend = cuda\nrestore = cuda\n", 3,
		   "expected auto, gpu or cpu");
	expect_err("[tier.gpu]\nbackend = shm\n\nrestore = gpu\n", 4,
		   "restore = gpu needs backend = cuda");
	/* without a pool the key would do nothing */
	expect_err("[tier.gpu]\ncapacity = 1M\nrestore = cpu\n", 3,
		   "restore needs a device tier");
	expect_err("[tier.gpu]\nrestore = auto\nbackend = none\n", 2,
		   "restore needs a device tier");
	expect_err("[tier.gpu]\nbackend = cuda\nrestore = gpu\n"
		   "restore = cpu\n", 4, "duplicate key 'restore'");
	/* in any other section it is unknown */
	expect_err("[tier.dram]\nrestore = cpu\n", 2,
		   "unknown key 'restore' in [tier.dram]");
	/* a checked section ends at the next header, not only at the end */
	expect_err("[tier.gpu]\nbackend = shm\nrestore = gpu\n"
		   "[tier.dram]\ncapacity = 1M\n", 3,
		   "restore = gpu needs backend = cuda");
}

/* [tier.gpu] restore_weights: f32 by default, bf16 on request; refused,
 * at its own line, where no GPU restorer would use it.
 */
static void test_gpu_restore_weights(void **state)
{
	kvfs_conf_defaults(conf);
	assert_int_equal(conf->cache.gpu_restore_weights,
			 KVFS_PARAMS_RWEIGHTS_F32);
	expect_ok("[tier.gpu]\nbackend = cuda\n");
	assert_int_equal(conf->cache.gpu_restore_weights,
			 KVFS_PARAMS_RWEIGHTS_F32);
	expect_ok("[tier.gpu]\nbackend = cuda\nrestore_weights = bf16\n");
	assert_int_equal(conf->cache.gpu_restore_weights,
			 KVFS_PARAMS_RWEIGHTS_BF16);
	expect_ok("[tier.gpu]\nrestore_weights = f32\nrestore = gpu\n"
		  "backend = cuda\n");
	assert_int_equal(conf->cache.gpu_restore_weights,
			 KVFS_PARAMS_RWEIGHTS_F32);

	expect_err("[tier.gpu]\nbackend = cuda\nrestore_weights = fp16\n", 3,
		   "restore_weights = 'fp16': expected f32 or bf16");
	expect_err("[tier.gpu]\nbackend = cuda\nrestore_weights = BF16\n", 3,
		   "expected f32 or bf16");
	expect_err("[tier.gpu]\nbackend = shm\n\nrestore_weights = bf16\n", 4,
		   "restore_weights needs backend = cuda");
	expect_err("[tier.gpu]\nrestore_weights = bf16\n", 2,
		   "restore_weights needs backend = cuda");
	expect_err("[tier.gpu]\nbackend = cuda\nrestore_weights = bf16\n"
		   "restore = cpu\n", 3,
		   "restore_weights needs restore = auto or gpu");
	expect_err("[tier.dram]\nrestore_weights = bf16\n", 2,
		   "unknown key 'restore_weights' in [tier.dram]");
}

/* [tier.dram] prefault: yes or no, no by default; anything else at its line. */
static void test_dram_prefault(void **state)
{
	(void)state;
	kvfs_conf_defaults(conf);
	assert_false(conf->cache.dram_prefault);
	memset(conf, 0xff, sizeof(*conf));
	expect_ok("[tier.dram]\ncapacity = 1M\n");
	assert_false(conf->cache.dram_prefault);
	expect_ok("[tier.dram]\nprefault = yes\n");
	assert_true(conf->cache.dram_prefault);
	expect_ok("[tier.dram]\nprefault = no\ncapacity = 8M\n");
	assert_false(conf->cache.dram_prefault);
	/* with a pinned arena too: pinning faults it in anyway */
	expect_ok("[tier.gpu]\nbackend = cuda\n[tier.dram]\npinned = yes\n"
		  "prefault = yes\n");
	assert_true(conf->cache.dram_prefault);

	expect_err("[tier.dram]\nprefault = true\n", 2,
		   "prefault = 'true': expected yes or no");
	expect_err("[tier.dram]\ncapacity = 1M\nprefault = \n", 3,
		   "expected yes or no");
	expect_err("[tier.dram]\nprefault = yes\nprefault = no\n", 3,
		   "duplicate key 'prefault'");
	expect_err("[tier.ssd]\nprefault = yes\n", 2,
		   "unknown key 'prefault' in [tier.ssd]");
}

/*
 * [tier.dram] pinned: the three values and the default; yes without a
 * cuda tier is refused at the key's line, whichever section comes first.
 */
static void test_dram_pinned(void **state)
{
	kvfs_conf_defaults(conf);
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_AUTO);
	memset(conf, 0xff, sizeof(*conf));
	expect_ok("[tier.dram]\ncapacity = 1M\n");
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_AUTO);
	expect_ok("[tier.dram]\npinned = no\n");
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_NO);
	expect_ok("[tier.dram]\npinned = auto\n[tier.gpu]\nbackend = shm\n");
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_AUTO);
	expect_ok("[tier.dram]\npinned = yes\n[tier.gpu]\nbackend = cuda\n");
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_YES);
	/* the device tier may come first */
	expect_ok("[tier.gpu]\nbackend = cuda\n[tier.dram]\npinned = yes\n");
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_YES);
	expect_ok("[tier.gpu]\nbackend = shm\n[tier.dram]\npinned = no\n");
	assert_int_equal(conf->cache.dram_pinned, KVFS_PARAMS_PINNED_NO);

	expect_err("[tier.dram]\npinned = true\n", 2,
		   "pinned = 'true': expected auto, yes or no");
	expect_err("[tier.dram]\npinned = \n", 2,
		   "expected auto, yes or no");
	expect_err("[tier.dram]\npinned = YES\n", 2,
		   "expected auto, yes or no");
	expect_err("[tier.dram]\npinned = no\npinned = no\n", 3,
		   "duplicate key 'pinned'");
	expect_err("[tier.gpu]\npinned = no\nbackend = cuda\n", 2,
		   "unknown key 'pinned' in [tier.gpu]");
	/* yes needs a CUDA device to pin for: at the key's own line */
	expect_err("[tier.dram]\ncapacity = 1M\npinned = yes\n", 3,
		   "pinned = yes needs [tier.gpu] backend = cuda");
	expect_err("[tier.dram]\n\npinned = yes\n[tier.gpu]\nbackend = shm\n",
		   3, "pinned = yes needs [tier.gpu] backend = cuda");
	expect_err("[tier.gpu]\nbackend = none\n[tier.dram]\npinned = yes\n",
		   4, "pinned = yes needs [tier.gpu] backend = cuda");
	/* an earlier error is the one reported */
	expect_err("[tier.dram]\npinned = yes\n[tier.gpu]\nbackend = tape\n",
		   4, "expected none, shm or cuda");
}

/* [tier.remote]: off without the section; the example; every
 * key's errors.
 */
static void test_tier_remote(void **state)
{
	expect_ok("[tier.dram]\ncapacity = 1M\n");
	assert_int_equal(conf->cache.remote.backend, KVFS_REMOTE_NONE);
	expect_ok("[tier.remote]\n"
		  "backend = redis\n"
		  "nodes = 10.0.0.5:6379,10.0.0.6:6379   ; seeds\n"
		  "key_prefix = kvfs                      ; fleets\n"
		  "write = back\n"
		  "admit = policy\n"
		  "timeout = 200ms\n"
		  "password =\n");
	assert_int_equal(conf->cache.remote.backend, KVFS_REMOTE_REDIS);
	assert_string_equal(conf->cache.remote.nodes,
			    "10.0.0.5:6379,10.0.0.6:6379");
	assert_string_equal(conf->cache.remote.key_prefix, "kvfs");
	assert_int_equal(conf->cache.remote.write, KVFS_REMOTE_WRITE_BACK);
	assert_int_equal(conf->cache.remote.admit, KVFS_REMOTE_ADMIT_POLICY);
	assert_int_equal(conf->cache.remote.timeout_ms, 200);
	assert_string_equal(conf->cache.remote.password, "");
	/* Only nodes is needed; the rest has defaults. */
	expect_ok("[tier.remote]\nnodes = localhost:7000\nwrite = through\n"
		  "admit = all\ntimeout = 2s\nkey_prefix = fleet-A.1\n"
		  "password = s3cret\n");
	assert_int_equal(conf->cache.remote.backend, KVFS_REMOTE_REDIS);
	assert_int_equal(conf->cache.remote.write, KVFS_REMOTE_WRITE_THROUGH);
	assert_int_equal(conf->cache.remote.admit, KVFS_REMOTE_ADMIT_ALL);
	assert_int_equal(conf->cache.remote.timeout_ms, 2000);
	assert_string_equal(conf->cache.remote.key_prefix, "fleet-A.1");
	assert_string_equal(conf->cache.remote.password, "s3cret");
	expect_ok("[tier.remote]\nnodes = h:1\nwrite = off\ntimeout = 50\n");
	assert_int_equal(conf->cache.remote.write, KVFS_REMOTE_WRITE_OFF);
	assert_int_equal(conf->cache.remote.timeout_ms, 50);
	assert_string_equal(conf->cache.remote.key_prefix, "kvfs");

	expect_err("[tier.remote]\nwrite = back\n", 1,
		   "missing required key 'nodes'");
	expect_err("[tier.remote]\nnodes = h:1\nbackend = memcached\n", 3,
		   "expected redis");
	expect_err("[tier.remote]\nnodes = h\n", 2, "'h' is not host:port");
	expect_err("[tier.remote]\nnodes = h:1,,h:2\n", 2, "not host:port");
	expect_err("[tier.remote]\nnodes = h:70000\n", 2, "not host:port");
	expect_err("[tier.remote]\nnodes = h:1\nkey_prefix = a:b\n", 3,
		   "expected 1..63 of [A-Za-z0-9._-]");
	expect_err("[tier.remote]\nnodes = h:1\nkey_prefix =\n", 3,
		   "key_prefix");
	expect_err("[tier.remote]\nnodes = h:1\nwrite = later\n", 3,
		   "expected back, through or off");
	expect_err("[tier.remote]\nnodes = h:1\nadmit = some\n", 3,
		   "expected policy or all");
	expect_err("[tier.remote]\nnodes = h:1\ntimeout = 0ms\n", 3,
		   "duration in 1ms..60s");
	expect_err("[tier.remote]\nnodes = h:1\ntimeout = 61s\n", 3,
		   "duration");
	expect_err("[tier.remote]\nnodes = h:1\ntimeout = 1m\n", 3,
		   "duration");
	expect_err("[tier.remote]\nnodes = h:1\n[tier.remote]\n", 3,
		   "duplicate section [tier.remote]");
}

/* [fleet]: sightings off without the section or the key; redis needs
 * nodes; every key's range, and the errors naming the key and its line.
 */
static void test_fleet(void **state)
{
	expect_ok("[daemon]\n");
	assert_int_equal(conf->cache.fleet.backend, KVFS_SIGHT_NONE);
	assert_string_equal(conf->cache.fleet.channel, "kvfs");
	assert_int_equal(conf->cache.fleet.interval_ms, 1000);
	assert_int_equal(conf->cache.fleet.timeout_ms, 200);
	assert_int_equal(conf->cache.fleet.buffer, 65536);
	expect_ok("[fleet]\nnodes = h:1\n");
	assert_int_equal(conf->cache.fleet.backend, KVFS_SIGHT_NONE);
	expect_ok("[fleet]\nsightings = redis\n"
		  "nodes = 10.0.0.1:7000, 10.0.0.2:7000\n"
		  "password = s3cret\nchannel = fleet-A.1\ninterval = 250ms\n"
		  "timeout = 2s\nbuffer = 1024\n");
	assert_int_equal(conf->cache.fleet.backend, KVFS_SIGHT_REDIS);
	assert_string_equal(conf->cache.fleet.nodes,
			    "10.0.0.1:7000, 10.0.0.2:7000");
	assert_string_equal(conf->cache.fleet.password, "s3cret");
	assert_string_equal(conf->cache.fleet.channel, "fleet-A.1");
	assert_int_equal(conf->cache.fleet.interval_ms, 250);
	assert_int_equal(conf->cache.fleet.timeout_ms, 2000);
	assert_int_equal(conf->cache.fleet.buffer, 1024);
	expect_ok("[fleet]\nsightings = memory\ninterval = 2s\n");
	assert_int_equal(conf->cache.fleet.backend, KVFS_SIGHT_MEMORY);
	assert_int_equal(conf->cache.fleet.interval_ms, 2000);
	expect_ok("[fleet]\nsightings = off\ninterval = 10\nbuffer = 1\n");
	assert_int_equal(conf->cache.fleet.interval_ms, 10);
	assert_int_equal(conf->cache.fleet.buffer, 1);
	/* The remote tier's and the fleet's settings stay apart. */
	expect_ok("[tier.remote]\nnodes = r:1\nkey_prefix = blocks\n"
		  "[fleet]\nsightings = redis\nnodes = s:2\n");
	assert_string_equal(conf->cache.remote.nodes, "r:1");
	assert_string_equal(conf->cache.fleet.nodes, "s:2");
	assert_string_equal(conf->cache.fleet.channel, "kvfs");

	expect_err("[fleet]\nsightings = redis\n", 2,
		   "sightings = redis needs nodes");
	expect_err("[fleet]\nsightings = yes\n", 2,
		   "expected off, redis or memory");
	expect_err("[fleet]\nnodes = h\n", 2, "'h' is not host:port");
	expect_err("[fleet]\nnodes = h:1,h:0\n", 2, "not host:port");
	expect_err("[fleet]\nchannel = a:b\n", 2,
		   "expected 1..63 of [A-Za-z0-9._-]");
	expect_err("[fleet]\nchannel =\n", 2, "channel");
	expect_err("[fleet]\ninterval = 5ms\n", 2,
		   "interval = '5ms': expected a duration in 10ms..60s");
	expect_err("[fleet]\ninterval = 61s\n", 2, "duration in 10ms..60s");
	expect_err("[fleet]\ninterval = 1m\n", 2, "duration");
	expect_err("[fleet]\ninterval = soon\n", 2, "duration");
	expect_err("[fleet]\ntimeout = 0\n", 2, "duration in 1ms..60s");
	expect_err("[fleet]\nbuffer = 0\n", 2, "buffer");
	expect_err("[fleet]\nbuffer = 16777217\n", 2, "buffer");
	expect_err("[fleet]\nbuffer = 64K\n", 2, "buffer");
	expect_err("[fleet]\nspeed = 1\n", 2, "unknown key 'speed' in [fleet]");
	expect_err("[fleet]\nbuffer = 1\nbuffer = 2\n", 3,
		   "duplicate key 'buffer'");
	expect_err("[fleet]\n[fleet]\n", 2, "duplicate section [fleet]");
}

/* The documented example at the repository root must stay valid. */

/* owner, group, mode, quota, pin_quota (docs/operations.md, "Sharing a
 * host"): each at its own line, strictly.
 */
static void test_tenant_keys(void **state)
{
	const struct kvfs_ns_access *a = &conf->cache.ns[0].acc;
	char t[2048];

	/* without them: the mounting user's, 0755, no quotas */
	expect_ok(ns_ok);
	assert_false(a->has_uid);
	assert_false(a->has_gid);
	assert_false(a->has_mode);
	assert_int_equal(a->quota, 0);
	assert_int_equal(a->pin_quota, 0);
	assert_string_equal(conf->cache.ns[0].model_digest, "");

	hc_text(t, sizeof(t),
		"owner = root\ngroup = root\nmode = 0750\nquota = 1G\n"
		"pin_quota = 64M\n");
	expect_ok(t);
	assert_true(a->has_uid && a->has_gid && a->has_mode);
	assert_int_equal(a->uid, 0);
	assert_int_equal(a->gid, 0);
	assert_int_equal(a->mode, 0750);
	assert_int_equal(a->quota, 1ull << 30);
	assert_int_equal(a->pin_quota, 64ull << 20);

	/* numbers need not name an account, as with chown */
	hc_text(t, sizeof(t), "owner = 4242\ngroup = 4343\nmode = 640\n");
	expect_ok(t);
	assert_int_equal(a->uid, 4242);
	assert_int_equal(a->gid, 4343);
	assert_int_equal(a->mode, 0640);
	hc_text(t, sizeof(t), "mode = 0\n");
	expect_ok(t);
	assert_true(a->has_mode);
	assert_int_equal(a->mode, 0);

	hc_text(t, sizeof(t), "owner = no-such-user-kvfs\n");
	expect_err(t, 8, "owner = 'no-such-user-kvfs': no such user");
	hc_text(t, sizeof(t), "group = no-such-group-kvfs\n");
	expect_err(t, 8, "group = 'no-such-group-kvfs': no such group");
	hc_text(t, sizeof(t), "owner = 4294967295\n");
	expect_err(t, 8, "expected a user name or a number");
	hc_text(t, sizeof(t), "group = 12x\n");
	expect_err(t, 8, "expected a group name or a number");
	hc_text(t, sizeof(t), "mode = 0800\n");
	expect_err(t, 8, "mode = '0800': expected octal permission bits");
	hc_text(t, sizeof(t), "mode = 1755\n");
	expect_err(t, 8, "expected octal permission bits 0..0777");
	hc_text(t, sizeof(t), "mode = 07500\n");
	expect_err(t, 8, "expected octal permission bits");
	hc_text(t, sizeof(t), "mode = rwx\n");
	expect_err(t, 8, "expected octal permission bits");
	hc_text(t, sizeof(t), "mode =\n");
	expect_err(t, 8, "expected octal permission bits");
	hc_text(t, sizeof(t), "quota = 1K\n");
	expect_err(t, 8, "quota = '1K': expected a size in");
	hc_text(t, sizeof(t), "pin_quota = lots\n");
	expect_err(t, 8, "pin_quota = 'lots': expected a size in");
	hc_text(t, sizeof(t), "owner = root\nowner = 0\n");
	expect_err(t, 9, "duplicate key 'owner'");
	/* outside a namespace they are unknown */
	expect_err("[daemon]\nmode = 0750\n", 2, "unknown key 'mode'");
}

/* A safetensors file: an 8-byte header length, the header, @data bytes
 * of tensor data (each its offset's low byte, xored with @salt).
 */
static void write_st(const char *path, const char *hdr, size_t data,
		     uint8_t salt)
{
	FILE *f = fopen(path, "w");
	uint64_t n = strlen(hdr);

	assert_non_null(f);
	for (int i = 0; i < 8; i++)
		fputc((int)((n >> (8 * i)) & 0xff), f);
	fputs(hdr, f);
	for (size_t i = 0; i < data; i++)
		fputc((int)((i & 0xff) ^ salt), f);
	assert_int_equal(fclose(f), 0);
}

static void test_model_digest(void **state)
{
	char dir[] = "/tmp/kvfs-test-digest-XXXXXX", t[2048], p[256], q[256];
	char d1[65], d2[65], why[160];
	const char *md = conf->cache.ns[0].model_digest;

	/* a value */
	hc_text(t, sizeof(t), "model_digest = sha256:0123abcd\n");
	expect_ok(t);
	assert_string_equal(md, "sha256:0123abcd");
	hc_text(t, sizeof(t), "model_digest = has blank\n");
	expect_err(t, 8, "expected auto or 1..64 of");
	snprintf(p, sizeof(p), "model_digest = %065d\n", 0);
	hc_text(t, sizeof(t), p);
	expect_err(t, 8, "expected auto or 1..64 of");
	/* auto needs weights */
	hc_text(t, sizeof(t), "model_digest = auto\n");
	expect_err(t, 8, "model_digest = auto needs weights");

	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/model.safetensors", dir);
	/* a header and 3 MiB of data: both ends are sampled */
	write_st(p, "{\"__metadata__\":{}}", 3u << 20, 0);
	assert_int_equal(kvfs_model_digest(p, d1, why, sizeof(why)), 0);
	assert_int_equal(strlen(d1), 64);
	assert_int_equal(kvfs_model_digest(p, d2, why, sizeof(why)), 0);
	assert_string_equal(d1, d2);
	/* the same header with other weights (a fine-tune): another digest */
	write_st(p, "{\"__metadata__\":{}}", 3u << 20, 1);
	assert_int_equal(kvfs_model_digest(p, d2, why, sizeof(why)), 0);
	assert_string_not_equal(d1, d2);

	snprintf(t, sizeof(t), "%shidden_size = 1024\nfamily = llama\n"
		 "weights = %s\nmodel_digest = auto\n", ns_ok, p);
	expect_ok(t);
	assert_string_equal(md, d2);

	/* an index: its bytes and every shard it names */
	snprintf(q, sizeof(q), "%s/model.safetensors.index.json", dir);
	{
		FILE *f = fopen(q, "w");

		assert_non_null(f);
		fputs("{\"weight_map\": {\"a\": \"model.safetensors\", "
		      "\"b\": \"model.safetensors\"}}", f);
		assert_int_equal(fclose(f), 0);
	}
	assert_int_equal(kvfs_model_digest(q, d1, why, sizeof(why)), 0);
	assert_string_not_equal(d1, d2);

	/* what cannot be read fails the parse at the key's line */
	snprintf(q, sizeof(q), "%s/nothing.safetensors", dir);
	snprintf(t, sizeof(t), "%shidden_size = 1024\nfamily = llama\n"
		 "weights = %s\nmodel_digest = auto\n", ns_ok, q);
	expect_err(t, 11, "model_digest = auto: ");
	write_st(q, "", 0, 0);
	assert_int_equal(kvfs_model_digest(q, d1, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "not a safetensors file"));
	unlink(q);
	snprintf(q, sizeof(q), "%s/model.safetensors.index.json", dir);
	unlink(q);
	unlink(p);
	rmdir(dir);
}

static void test_example_conf(void **state)
{
	struct kvfs_conf c;

	assert_int_equal(kvfs_conf_load("kvfs.conf", &c), 0);
	assert_true(c.cache.n_ns >= 1);
	assert_int_equal(c.cache.gpu_backend, KVFS_PARAMS_GPU_SHM);
	assert_int_equal(c.cache.gpu_restore, KVFS_PARAMS_RESTORE_AUTO);
	assert_int_equal(c.cache.dram_pinned, KVFS_PARAMS_PINNED_AUTO);
	assert_true(c.cache.dram_prefault);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_example_conf),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_full_valid),
		cmocka_unit_test(test_load_file),
		cmocka_unit_test(test_load_file_error_line),
		cmocka_unit_test(test_chunk_not_dividing_ok),
		cmocka_unit_test(test_unknown_section),
		cmocka_unit_test(test_unknown_key),
		cmocka_unit_test(test_duplicates),
		cmocka_unit_test(test_bad_numbers),
		cmocka_unit_test(test_bad_sizes),
		cmocka_unit_test(test_missing_required),
		cmocka_unit_test(test_chunk_exceeds_block),
		cmocka_unit_test(test_block_too_large),
		cmocka_unit_test(test_namespace_names),
		cmocka_unit_test(test_too_many_namespaces),
		cmocka_unit_test(test_policy),
		cmocka_unit_test(test_syntax_and_long_lines),
		cmocka_unit_test(test_hcache_keys),
		cmocka_unit_test(test_hcache_errors),
		cmocka_unit_test(test_gpu_restore),
		cmocka_unit_test(test_gpu_restore_weights),
		cmocka_unit_test(test_dram_pinned),
		cmocka_unit_test(test_dram_prefault),
		cmocka_unit_test(test_tier_remote),
		cmocka_unit_test(test_fleet),
		cmocka_unit_test(test_tenant_keys),
		cmocka_unit_test(test_model_digest),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
