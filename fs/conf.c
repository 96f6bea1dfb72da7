/* SPDX-License-Identifier: MIT */
/*
 * kvfs.conf parser over inih.
 *
 * inih does not tell its handler the line number, and it neither reports
 * empty sections nor keeps section names longer than 49 characters.  So the
 * text goes to ini_parse_stream() through our own line reader: it counts
 * lines, notices "[section]" headers itself (an empty namespace section
 * must still fail for its missing keys, at its own line) and strips leading
 * blanks, which also turns off inih's indented continuation lines, a
 * feature that would let a stray indent merge two settings.
 *
 * A line must fit inih's buffer (INI_MAX_LINE, 200 bytes with the line
 * end); a longer one is an error, never silently split.
 *
 * Sections and keys are tables: a new section ([tier.gpu], ...) is one more
 * row in sections[] with its key table.  The typed values a key takes
 * (sizes, names, words) are parsed in conf_value.c; this file holds the
 * sections and the checks that span keys.
 *
 * Limits (all inclusive; out of range is an error):
 *   [daemon]     threads 1..1024, log_level err|warn|info|debug,
 *                log_file (string), flush_ms 1..3600000,
 *                meta_mapsize 1M..16T, scrub_interval off|0 or a
 *                duration 1s..365d ("30s", "10m", "6h", "7d"; a bare
 *                number is seconds), scrub_rate 0..16T (bytes/s),
 *                metrics IPv4:port or [IPv6]:port (numeric; fs/metrics.h)
 *   [tier.dram]  capacity 4K..16T, pinned auto|yes|no (default auto;
 *                yes needs [tier.gpu] backend = cuda, checked once the
 *                whole file is read since the sections come in any order),
 *                prefault yes|no (default no)
 *   [tier.ssd]   rings 1..64, writeback_batch 1..4096
 *   [tier.gpu]   backend none|shm|cuda, device 0..1023, capacity 4K..16T,
 *                lease_ms 1..86400000, restore auto|gpu|cpu (default
 *                auto; needs a backend, and gpu needs cuda),
 *                restore_weights f32|bf16 (default f32; needs cuda and
 *                restore auto or gpu)
 *   [chunks]     dram_capacity 0..16T, gpu_capacity 0..16T,
 *                score_halflife 0..1e9 (requests; 0 = no decay),
 *                spec_depth 0..256 (0 = no limit)
 *   [tier.remote] (docs/remote.md) backend redis (default), nodes
 *                host:port[,host:port...] (required), key_prefix
 *                [A-Za-z0-9._-]{1,63} (default kvfs), write
 *                back|through|off, admit policy|all, timeout 1ms..60s
 *                ("200ms", "1s"; default 200ms), password (optional)
 *   [fleet]      (docs/remote.md, "Fleet sightings") sightings
 *                off|redis|memory (default off; memory: tests), nodes
 *                host:port[,host:port...] (needed by redis), password,
 *                channel [A-Za-z0-9._-]{1,63} (default kvfs), interval
 *                10ms..60s (default 1s), timeout 1ms..60s (default
 *                200ms), buffer 1..16777216 keys (default 65536)
 *   [policy]     name [a-z0-9_-]{1,31}; every other key is kept verbatim
 *                for the policy to check (at most KVFS_PARAMS_MAX_OPTS)
 *   [namespace NAME]
 *                layers 1..1024, kv_heads 1..1024, head_dim 1..4096,
 *                dtype f16|bf16|f32|f8_e4m3, block_tokens 1..65536,
 *                chunk_tokens 1..block_tokens (a chunk never spans two
 *                blocks; it need not divide block_tokens: the last chunk
 *                of a block is then partial and zero-filled),
 *                hidden_size 1..1048576 (optional: omit it when unknown),
 *                salt (optional, up to 63 bytes).
 *                A block file of the geometry may not exceed 4 GiB.
 *                Hidden-state restoration (docs/hcache.md), all optional:
 *                weights (path), family llama|qwen2, rms_norm_eps and
 *                rope_theta (positive numbers; 1e-6 and 10000 by
 *                default), rope_scaling default|linear|llama3 with
 *                rope_factor, rope_low_freq_factor, rope_high_freq_factor
 *                (positive numbers) and rope_orig_max_pos 1..2^30,
 *                store_as kv|hidden|auto (default kv).  weights needs
 *                hidden_size, family and an even head_dim; the model keys
 *                and store_as hidden|auto need weights; each rope_* key
 *                needs the scaling that uses it, and that scaling needs
 *                all of its keys (llama3: high > low).
 *                hcache_kv_layers 0..layers: the last layers auto keeps
 *                as K and V (default: the start-up schedule's); needs
 *                store_as = auto and hidden states smaller than K+V.
 *                Sharing a host (docs/operations.md), all optional:
 *                owner (a user name or uid), group (a group name or
 *                gid), mode (octal, 0..0777), quota and pin_quota
 *                (sizes 4K..16T), model_digest (1..64 of
 *                [A-Za-z0-9._:+-], or auto: computed from weights, which
 *                it then needs; fs/model_digest.h says how).
 * Every non-namespace section may appear once; every key once per section.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <ini.h>

#include "fs/conf.h"
#include "fs/conf_i.h"
#include "fs/metrics.h"
#include "fs/model_digest.h"
#include "hcache/restore.h"
#include "tier/redis_cluster.h"
#include "meta/log.h"
#include "meta/util.h"

#define MAX_BLOCK_FILE (4ull << 30)
#define NS_PREFIX "namespace"

_Static_assert(sizeof(unsigned) == sizeof(uint32_t),
	       "unsigned config fields are parsed as u32");

/* ---- sections ---- */

#define U32(kname, type, field, lo, hi, req)                    \
	{ kname, kvfs_conf_set_u32, offsetof(type, field), lo, hi, 0, \
	  req }
#define SIZE(kname, type, field, lo, hi)                         \
	{ kname, kvfs_conf_set_size, offsetof(type, field), lo, hi, \
	  0, false }
#define STR(kname, type, field, fn) \
	{ kname, fn, offsetof(type, field), 0, 0, \
	  sizeof(((type *)0)->field), false }

/* The scrub's period: off/0, or a number with s, m, h or d (seconds
 * without), 1s..365d; kept in milliseconds.
 */
static int set_scrub_interval(struct conf_state *st, const struct conf_key *k,
			      const char *val, void *field)
{
	static const struct {
		char unit;
		uint64_t s;
	} units[] = { { 0, 1 }, { 's', 1 }, { 'm', 60 }, { 'h', 3600 },
		      { 'd', 86400 } };
	size_t n = strspn(val, "0123456789");
	uint64_t v, mul = 0;
	char num[24];

	if (!strcmp(val, "off") || !strcmp(val, "0")) {
		v = 0;
		goto out_set;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (val[n] == units[i].unit && (!val[n] || !val[n + 1]))
			mul = units[i].s;
	if (!n || n >= sizeof(num) || !mul)
		goto bad;
	memcpy(num, val, n);
	num[n] = 0;
	if (kvfs_util_parse_u64(num, &v) || !v || v > 365 * 86400 / mul)
		goto bad;
	v *= mul * 1000;
out_set:
	memcpy(field, &v, sizeof(v));
	return 0;
bad:
	return kvfs_conf_fail(
		st, st->lineno,
		"%s = '%s': expected off or a duration in 1s..365d "
		"(e.g. 30s, 10m, 6h, 7d)",
		k->name, val);
}

/* The metrics endpoint's address, as fs/metrics.c will bind it. */
static int set_metrics(struct conf_state *st, const struct conf_key *k,
		       const char *val, void *field)
{
	const char *why;

	if (kvfs_metrics_addr_parse(val, NULL, NULL, &why))
		return kvfs_conf_fail(st, st->lineno, "%s = '%s': %s", k->name,
				      val, why);
	return kvfs_conf_set_str(st, k, val, field);
}

static const struct conf_key daemon_keys[] = {
	U32("threads", struct kvfs_conf, threads, 1, 1024, false),
	{ "log_level", kvfs_conf_set_log_level,
	  offsetof(struct kvfs_conf, log_level), 0, 0, 0, false },
	STR("log_file", struct kvfs_conf, log_file, kvfs_conf_set_str),
	U32("flush_ms", struct kvfs_conf, cache.flush_ms, 1, 3600000, false),
	SIZE("meta_mapsize", struct kvfs_conf, cache.meta_mapsize, 1ull << 20,
	     16ull << 40),
	{ "scrub_interval", set_scrub_interval,
	  offsetof(struct kvfs_conf, cache.scrub_interval_ms), 0, 0, 0, false },
	SIZE("scrub_rate", struct kvfs_conf, cache.scrub_rate, 0, 16ull << 40),
	STR("metrics", struct kvfs_conf, metrics, set_metrics),
	{ NULL },
};

static int set_dram_pinned(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "auto", KVFS_PARAMS_PINNED_AUTO },
		{ "yes", KVFS_PARAMS_PINNED_YES },
		{ "no", KVFS_PARAMS_PINNED_NO },
		{ NULL, 0 },
	};
	int rc = kvfs_conf_set_word(st, k, val, field, words);

	if (!rc)
		st->pinned_line = st->lineno;
	return rc;
}

static int set_yes_no(struct conf_state *st, const struct conf_key *k,
		      const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "yes", 1 },
		{ "no", 0 },
		{ NULL, 0 },
	};
	int v = 0, rc = kvfs_conf_pick_word(st, k, val, words, &v);
	bool b = v;

	if (!rc)
		memcpy(field, &b, sizeof(b));
	return rc;
}

static const struct conf_key dram_keys[] = {
	SIZE("capacity", struct kvfs_conf, cache.dram_capacity, 4096, 16ull << 40),
	{ "pinned", set_dram_pinned, offsetof(struct kvfs_conf, cache.dram_pinned),
	  0, 0, 0, false },
	{ "prefault", set_yes_no,
	  offsetof(struct kvfs_conf, cache.dram_prefault), 0, 0, 0, false },
	{ NULL },
};

static const struct conf_key ssd_keys[] = {
	U32("rings", struct kvfs_conf, cache.ssd_rings, 1, 64, false),
	U32("writeback_batch", struct kvfs_conf, cache.writeback_batch, 1, 4096,
	    false),
	{ NULL },
};

static int set_gpu_backend(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "none", KVFS_PARAMS_GPU_NONE },
		{ "shm", KVFS_PARAMS_GPU_SHM },
		{ "cuda", KVFS_PARAMS_GPU_CUDA },
		{ NULL, 0 },
	};

	return kvfs_conf_set_word(st, k, val, field, words);
}

static int set_gpu_restore(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "auto", KVFS_PARAMS_RESTORE_AUTO },
		{ "gpu", KVFS_PARAMS_RESTORE_GPU },
		{ "cpu", KVFS_PARAMS_RESTORE_CPU },
		{ NULL, 0 },
	};

	return kvfs_conf_set_word(st, k, val, field, words);
}

static int set_gpu_restore_weights(struct conf_state *st,
				   const struct conf_key *k, const char *val,
				   void *field)
{
	static const struct conf_word words[] = {
		{ "f32", KVFS_PARAMS_RWEIGHTS_F32 },
		{ "bf16", KVFS_PARAMS_RWEIGHTS_BF16 },
		{ NULL, 0 },
	};

	return kvfs_conf_set_word(st, k, val, field, words);
}

static const struct conf_key gpu_keys[] = {
	{ "backend", set_gpu_backend, offsetof(struct kvfs_conf, cache.gpu_backend),
	  0, 0, 0, false },
	U32("device", struct kvfs_conf, cache.gpu_device, 0, 1023, false),
	SIZE("capacity", struct kvfs_conf, cache.gpu_capacity, 4096, 16ull << 40),
	SIZE("owner_capacity", struct kvfs_conf, cache.gpu_owner_capacity, 0,
	     16ull << 40),
	U32("lease_ms", struct kvfs_conf, cache.lease_ms, 1, 86400000, false),
	{ "restore", set_gpu_restore, offsetof(struct kvfs_conf, cache.gpu_restore),
	  0, 0, 0, false },
	{ "restore_weights", set_gpu_restore_weights,
	  offsetof(struct kvfs_conf, cache.gpu_restore_weights), 0, 0, 0,
	  false },
	{ NULL },
};

static const struct conf_key chunk_keys[] = {
	SIZE("dram_capacity", struct kvfs_conf, cache.chunk_dram, 0, 16ull << 40),
	SIZE("gpu_capacity", struct kvfs_conf, cache.chunk_gpu, 0, 16ull << 40),
	U32("score_halflife", struct kvfs_conf, cache.score_halflife, 0,
	    1000000000, false),
	U32("spec_depth", struct kvfs_conf, cache.chunk_spec_depth, 0, 256, false),
	{ NULL },
};

static const struct conf_key policy_keys[] = {
	STR("name", struct kvfs_conf, cache.policy, kvfs_conf_set_policy_name),
	{ NULL },
};

#define G(f) geom.f
static const struct conf_key ns_keys[] = {
	U32("layers", struct kvfs_ns_params, G(n_layers), 1, 1024, true),
	U32("kv_heads", struct kvfs_ns_params, G(n_kv_heads), 1, 1024, true),
	U32("head_dim", struct kvfs_ns_params, G(head_dim), 1, 4096, true),
	{ "dtype", kvfs_conf_set_dtype,
	  offsetof(struct kvfs_ns_params, G(dtype)), 0, 0, 0, true },
	U32("block_tokens", struct kvfs_ns_params, G(block_tokens), 1, 65536,
	    true),
	/* the upper bound is block_tokens, checked when the section ends */
	U32("chunk_tokens", struct kvfs_ns_params, G(chunk_tokens), 1, 65536,
	    true),
	U32("hidden_size", struct kvfs_ns_params, G(hidden_size), 1, 1u << 20,
	    false),
	STR("salt", struct kvfs_ns_params, salt, kvfs_conf_set_str),
	STR("weights", struct kvfs_ns_params, hc.weights, kvfs_conf_set_str),
	{ "family", kvfs_conf_set_family,
	  offsetof(struct kvfs_ns_params, hc.family), 0, 0, 0, false },
	{ "rms_norm_eps", kvfs_conf_set_pos_double,
	  offsetof(struct kvfs_ns_params, hc.rms_norm_eps), 0, 0, 0, false },
	{ "rope_theta", kvfs_conf_set_pos_double,
	  offsetof(struct kvfs_ns_params, hc.rope_theta), 0, 0, 0, false },
	{ "rope_scaling", kvfs_conf_set_rope,
	  offsetof(struct kvfs_ns_params, hc.rope_type), 0, 0, 0, false },
	{ "rope_factor", kvfs_conf_set_pos_double,
	  offsetof(struct kvfs_ns_params, hc.rope_factor), 0, 0, 0, false },
	{ "rope_low_freq_factor", kvfs_conf_set_pos_double,
	  offsetof(struct kvfs_ns_params, hc.rope_low_freq_factor), 0, 0, 0,
	  false },
	{ "rope_high_freq_factor", kvfs_conf_set_pos_double,
	  offsetof(struct kvfs_ns_params, hc.rope_high_freq_factor), 0, 0, 0,
	  false },
	U32("rope_orig_max_pos", struct kvfs_ns_params, hc.rope_orig_max_pos, 1,
	    1u << 30, false),
	{ "store_as", kvfs_conf_set_store_as,
	  offsetof(struct kvfs_ns_params, hc.store_as), 0, 0, 0, false },
	/* the upper bound is layers, checked when the section ends */
	U32("hcache_kv_layers", struct kvfs_ns_params, hc.kv_layers, 0, 1024,
	    false),
	{ "owner", kvfs_conf_set_owner,
	  offsetof(struct kvfs_ns_params, acc.uid), 0, 0, 0, false },
	{ "group", kvfs_conf_set_group,
	  offsetof(struct kvfs_ns_params, acc.gid), 0, 0, 0, false },
	{ "mode", kvfs_conf_set_mode, offsetof(struct kvfs_ns_params, acc.mode),
	  0, 0, 0, false },
	SIZE("quota", struct kvfs_ns_params, acc.quota, 4096, 16ull << 40),
	SIZE("pin_quota", struct kvfs_ns_params, acc.pin_quota, 4096,
	     16ull << 40),
	STR("model_digest", struct kvfs_ns_params, model_digest,
	    kvfs_conf_set_digest),
	{ NULL },
};
#undef G
_Static_assert(sizeof(ns_keys) / sizeof(ns_keys[0]) <= 64,
	       "seen and key_line hold 64 keys");

static void *conf_target(struct conf_state *st)
{
	return st->c;
}

static void *ns_target(struct conf_state *st)
{
	return st->ns;
}

static int policy_other(struct conf_state *st, const char *key,
			const char *val)
{
	struct kvfs_conf *c = st->c;

	for (size_t i = 0; i < c->cache.n_policy_opts; i++)
		if (!strcmp(c->cache.policy_keys[i], key))
			return kvfs_conf_fail(st, st->lineno,
					      "duplicate key '%s' in [%s]", key,
					      st->sec_name);
	if (c->cache.n_policy_opts >= KVFS_PARAMS_MAX_OPTS)
		return kvfs_conf_fail(st, st->lineno,
				      "more than %d policy options",
				      KVFS_PARAMS_MAX_OPTS);
	if (strlen(key) >= sizeof(c->cache.policy_keys[0]) ||
	    strlen(val) >= sizeof(c->cache.policy_vals[0]))
		return kvfs_conf_fail(
			st, st->lineno,
			"policy option '%s' or its value is too long", key);
	strcpy(c->cache.policy_keys[c->cache.n_policy_opts], key);
	strcpy(c->cache.policy_vals[c->cache.n_policy_opts], val);
	c->cache.n_policy_opts++;
	return 0;
}

static int ns_begin(struct conf_state *st, const char *name)
{
	struct kvfs_conf *c = st->c;

	if (kvfs_conf_ns_name_ok(name))
		return kvfs_conf_fail(
			st, st->lineno,
			"bad namespace name '%s': 1..%d of [A-Za-z0-9._-], "
			"not starting with '.'",
			name, KVFS_NS_NAME_MAX - 1);
	for (size_t i = 0; i < c->cache.n_ns; i++)
		if (!strcmp(c->cache.ns[i].name, name))
			return kvfs_conf_fail(st, st->lineno,
					      "duplicate namespace '%s'", name);
	if (c->cache.n_ns >= KVFS_PARAMS_MAX_NS)
		return kvfs_conf_fail(st, st->lineno, "more than %d namespaces",
				      KVFS_PARAMS_MAX_NS);
	st->ns = &c->cache.ns[c->cache.n_ns++];
	memset(st->ns, 0, sizeof(*st->ns));
	strcpy(st->ns->name, name);
	/* Hugging Face's defaults for both families. */
	st->ns->hc.rms_norm_eps = 1e-6;
	st->ns->hc.rope_theta = 10000;
	st->ns->hc.rope_type = KVFS_ROPE_DEFAULT;
	st->ns->hc.kv_layers = KVFS_PARAMS_KV_LAYERS_SCHED;
	return 0;
}

/* The line where namespace key @name was set in the section that is
 * ending, 0 if it was not.
 */
static unsigned key_at(struct conf_state *st, const char *name)
{
	for (size_t i = 0; ns_keys[i].name; i++)
		if (!strcmp(ns_keys[i].name, name))
			return (st->seen & (1ull << i)) ? st->key_line[i] : 0;
	return 0;
}

/* hcache_kv_layers only moves the split store_as = auto makes, and auto
 * splits only where hidden states are the smaller form.
 */
static int ns_end_kv_layers(struct conf_state *st)
{
	const struct kvfs_hcache_params *hc = &st->ns->hc;
	const struct kvfs_geom *g = &st->ns->geom;
	unsigned line = key_at(st, "hcache_kv_layers");
	uint64_t kv = 2ull * g->n_kv_heads * g->head_dim;

	if (!line)
		return 0;
	if (hc->store_as != KVFS_STORE_AUTO)
		return kvfs_conf_fail(
			st, line,
			"[%s]: hcache_kv_layers needs store_as = auto",
			st->sec_name);
	if (hc->kv_layers > g->n_layers)
		return kvfs_conf_fail(
			st, line, "[%s]: hcache_kv_layers %u exceeds layers %u",
			st->sec_name, hc->kv_layers, g->n_layers);
	if ((uint64_t)g->hidden_size >= kv)
		return kvfs_conf_fail(
			st, line,
			"[%s]: hcache_kv_layers: hidden states (%u per "
			"token) are not smaller than K+V (%" PRIu64 "), so "
			"store_as = auto keeps every layer as K and V",
			st->sec_name, g->hidden_size, kv);
	return 0;
}

/* The restoration keys hang together: each one needs what gives it a
 * meaning, so a key that would silently do nothing is an error.
 */
static int ns_end_hcache(struct conf_state *st)
{
	static const char *const model_keys[] = {
		"family", "rms_norm_eps", "rope_theta", "rope_scaling",
		"rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
		"rope_orig_max_pos", "hcache_kv_layers",
	};
	static const struct {
		const char *key;
		unsigned types; /* 1 << enum kvfs_rope_type using it */
	} rope_keys[] = {
		{ "rope_factor",
		  1u << KVFS_ROPE_LINEAR | 1u << KVFS_ROPE_LLAMA3 },
		{ "rope_low_freq_factor", 1u << KVFS_ROPE_LLAMA3 },
		{ "rope_high_freq_factor", 1u << KVFS_ROPE_LLAMA3 },
		{ "rope_orig_max_pos", 1u << KVFS_ROPE_LLAMA3 },
	};
	const struct kvfs_hcache_params *hc = &st->ns->hc;
	const struct kvfs_geom *g = &st->ns->geom;
	unsigned wl = key_at(st, "weights"), line;

	if (!wl) {
		for (size_t i = 0; i < sizeof(model_keys) / sizeof(*model_keys);
		     i++)
			if ((line = key_at(st, model_keys[i])))
				return kvfs_conf_fail(
					st, line,
					"[%s]: %s needs weights (the "
					"checkpoint restoration uses)",
					st->sec_name, model_keys[i]);
		if (hc->store_as != KVFS_STORE_KV)
			return kvfs_conf_fail(
				st, key_at(st, "store_as"),
				"[%s]: store_as = %s needs weights",
				st->sec_name,
				hc->store_as == KVFS_STORE_HIDDEN ? "hidden" :
								    "auto");
		return 0;
	}
	if (!hc->weights[0])
		return kvfs_conf_fail(st, wl, "[%s]: weights is empty",
				      st->sec_name);
	if (!g->hidden_size)
		return kvfs_conf_fail(st, wl, "[%s]: weights needs hidden_size",
				      st->sec_name);
	if (!hc->family)
		return kvfs_conf_fail(st, wl,
				      "[%s]: weights needs family (llama or "
				      "qwen2)",
				      st->sec_name);
	if (g->head_dim % 2)
		return kvfs_conf_fail(st, key_at(st, "head_dim"),
				      "[%s]: head_dim %u must be even for RoPE",
				      st->sec_name, g->head_dim);
	for (size_t i = 0; i < sizeof(rope_keys) / sizeof(*rope_keys); i++) {
		line = key_at(st, rope_keys[i].key);
		if (line && !(rope_keys[i].types & (1u << hc->rope_type)))
			return kvfs_conf_fail(
				st, line,
				"[%s]: %s is not used by rope_scaling = %s",
				st->sec_name, rope_keys[i].key,
				hc->rope_type == KVFS_ROPE_LINEAR ? "linear" :
								    "default");
		if (!line && (rope_keys[i].types & (1u << hc->rope_type)))
			return kvfs_conf_fail(
				st, key_at(st, "rope_scaling"),
				"[%s]: rope_scaling = %s needs %s",
				st->sec_name,
				hc->rope_type == KVFS_ROPE_LINEAR ? "linear" :
								    "llama3",
				rope_keys[i].key);
	}
	if (hc->rope_type == KVFS_ROPE_LLAMA3 &&
	    !(hc->rope_high_freq_factor > hc->rope_low_freq_factor))
		return kvfs_conf_fail(st, key_at(st, "rope_high_freq_factor"),
				      "[%s]: rope_high_freq_factor must exceed "
				      "rope_low_freq_factor",
				      st->sec_name);
	return ns_end_kv_layers(st);
}

/* model_digest = auto: the fingerprint of the checkpoint named by
 * weights, computed now so that the engine only ever sees a value.
 */
static int ns_end_digest(struct conf_state *st)
{
	unsigned line = key_at(st, "model_digest");
	char why[160];

	if (!line || strcmp(st->ns->model_digest, "auto"))
		return 0;
	if (!key_at(st, "weights") || !st->ns->hc.weights[0])
		return kvfs_conf_fail(
			st, line,
			"[%s]: model_digest = auto needs weights (the "
			"checkpoint it is computed from)",
			st->sec_name);
	if (kvfs_model_digest(st->ns->hc.weights, st->ns->model_digest, why,
			      sizeof(why)))
		return kvfs_conf_fail(st, line, "[%s]: model_digest = auto: %s",
				      st->sec_name, why);
	return 0;
}

static int ns_end(struct conf_state *st)
{
	const struct kvfs_geom *g = &st->ns->geom;
	uint64_t max = kvfs_fmt_max_file_size(g);
	int rc;

	if (g->chunk_tokens > g->block_tokens)
		return kvfs_conf_fail(
			st, st->sec_line,
			"[%s]: chunk_tokens %u exceeds block_tokens %u",
			st->sec_name, g->chunk_tokens, g->block_tokens);
	if (!max || max > MAX_BLOCK_FILE)
		return kvfs_conf_fail(
			st, st->sec_line,
			"[%s]: a block of this geometry exceeds 4G",
			st->sec_name);
	rc = ns_end_hcache(st);
	return rc ? rc : ns_end_digest(st);
}

/* The line where key @name of table @keys was set in the section that
 * is ending, 0 if it was not.
 */
static unsigned key_line_in(struct conf_state *st,
			    const struct conf_key *keys, const char *name)
{
	for (size_t i = 0; keys[i].name; i++)
		if (!strcmp(keys[i].name, name))
			return (st->seen & (1ull << i)) ? st->key_line[i] : 0;
	return 0;
}

/* restore chooses how hidden-state blocks reach the device pool: without
 * a pool it would do nothing, and only the cuda backend has a GPU; nor
 * would restore_weights do anything without the GPU restorer.
 */
static int gpu_end(struct conf_state *st)
{
	const struct kvfs_conf *c = st->c;
	unsigned line = key_line_in(st, gpu_keys, "restore");
	unsigned wline = key_line_in(st, gpu_keys, "restore_weights");

	/* Only the GPU restorer has weights of a precision to choose. */
	if (wline && c->cache.gpu_backend != KVFS_PARAMS_GPU_CUDA)
		return kvfs_conf_fail(
			st, wline,
			"[%s]: restore_weights needs backend = cuda (it "
			"sets the GPU restorer's precision)",
			st->sec_name);
	if (wline && c->cache.gpu_restore == KVFS_PARAMS_RESTORE_CPU)
		return kvfs_conf_fail(
			st, wline,
			"[%s]: restore_weights needs restore = auto or "
			"gpu (restore = cpu does not restore on the GPU)",
			st->sec_name);
	if (!line)
		return 0;
	if (c->cache.gpu_backend == KVFS_PARAMS_GPU_NONE)
		return kvfs_conf_fail(
			st, line,
			"[%s]: restore needs a device tier (backend = shm "
			"or cuda)",
			st->sec_name);
	if (c->cache.gpu_restore == KVFS_PARAMS_RESTORE_GPU &&
	    c->cache.gpu_backend != KVFS_PARAMS_GPU_CUDA)
		return kvfs_conf_fail(
			st, line,
			"[%s]: restore = gpu needs backend = cuda (the shm "
			"pool is host memory: use cpu or auto)",
			st->sec_name);
	return 0;
}

/* ---- [tier.remote] ---- */

static int set_remote_backend(struct conf_state *st, const struct conf_key *k,
			      const char *val, void *field)
{
	int v = KVFS_REMOTE_REDIS;

	if (strcmp(val, "redis"))
		return kvfs_conf_fail(
			st, st->lineno,
			"%s = '%s': expected redis (Redis Cluster, Valkey "
			"or one plain server)",
			k->name, val);
	memcpy(field, &v, sizeof(v));
	return 0;
}

/* kvfs_rc_addr_fn for checking a list: every well-formed address is fine. */
static int addr_ok(void *arg, const char *host, int port)
{
	(void)arg;
	(void)host;
	(void)port;
	return 0;
}

/* A list of host:port seeds, each as the cluster client parses it. */
static int set_remote_nodes(struct conf_state *st, const struct conf_key *k,
			    const char *val, void *field)
{
	const char *bad = val;
	size_t badlen = 0;

	if (strlen(val) >= k->len)
		return kvfs_conf_fail(st, st->lineno,
				      "%s: value longer than %zu bytes",
				      k->name, k->len - 1);
	if (kvfs_rc_parse_list(val, addr_ok, NULL, &bad, &badlen))
		return kvfs_conf_fail(st, st->lineno,
				      "%s: '%.*s' is not host:port",
				      k->name, (int)badlen, bad);
	memcpy(field, val, strlen(val) + 1);
	return 0;
}

static int set_remote_prefix(struct conf_state *st, const struct conf_key *k,
			     const char *val, void *field)
{
	return kvfs_conf_set_chars(st, k, val, field,
				   "abcdefghijklmnopqrstuvwxyz"
				   "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
				   "", "[A-Za-z0-9._-]");
}

static int set_remote_write(struct conf_state *st, const struct conf_key *k,
			    const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "back", KVFS_REMOTE_WRITE_BACK },
		{ "through", KVFS_REMOTE_WRITE_THROUGH },
		{ "off", KVFS_REMOTE_WRITE_OFF },
		{ NULL, 0 },
	};

	return kvfs_conf_set_word(st, k, val, field, words);
}

static int set_remote_admit(struct conf_state *st, const struct conf_key *k,
			    const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "policy", KVFS_REMOTE_ADMIT_POLICY },
		{ "all", KVFS_REMOTE_ADMIT_ALL },
		{ NULL, 0 },
	};

	return kvfs_conf_set_word(st, k, val, field, words);
}

/* @ms as a duration reads: "60s", "250ms". */
static void fmt_ms(uint64_t ms, char *buf, size_t len)
{
	if (ms && !(ms % 1000))
		snprintf(buf, len, "%" PRIu64 "s", ms / 1000);
	else
		snprintf(buf, len, "%" PRIu64 "ms", ms);
}

/* A duration in milliseconds, k->min..k->max: "250ms", "2s", or a bare
 * number of ms.
 */
static int set_duration_ms(struct conf_state *st, const struct conf_key *k,
			   const char *val, void *field)
{
	char num[16], lo[24], hi[24];
	size_t n = strspn(val, "0123456789");
	uint32_t v;
	unsigned mul = 1;

	if (!strcmp(val + n, "s"))
		mul = 1000;
	else if (*(val + n) && strcmp(val + n, "ms"))
		n = 0;
	if (!n || n >= sizeof(num))
		goto bad;
	memcpy(num, val, n);
	num[n] = 0;
	if (kvfs_util_parse_u32(num, &v) || v > k->max / mul ||
	    (uint64_t)v * mul < k->min)
		goto bad;
	v *= mul;
	memcpy(field, &v, sizeof(v));
	return 0;
bad:
	fmt_ms(k->min, lo, sizeof(lo));
	fmt_ms(k->max, hi, sizeof(hi));
	return kvfs_conf_fail(
		st, st->lineno,
		"%s = '%s': expected a duration in %s..%s (e.g. 200ms or 2s)",
		k->name, val, lo, hi);
}

#define REMOTE(kname, fn, field) \
	{ kname, fn, offsetof(struct kvfs_conf, cache.remote.field), 0, 0, \
	  sizeof(((struct kvfs_conf *)0)->cache.remote.field), false }

static const struct conf_key remote_keys[] = {
	REMOTE("backend", set_remote_backend, backend),
	{ "nodes", set_remote_nodes,
	  offsetof(struct kvfs_conf, cache.remote.nodes), 0, 0,
	  sizeof(((struct kvfs_conf *)0)->cache.remote.nodes), true },
	REMOTE("key_prefix", set_remote_prefix, key_prefix),
	REMOTE("write", set_remote_write, write),
	REMOTE("admit", set_remote_admit, admit),
	{ "timeout", set_duration_ms,
	  offsetof(struct kvfs_conf, cache.remote.timeout_ms), 1, 60000,
	  sizeof(((struct kvfs_conf *)0)->cache.remote.timeout_ms), false },
	REMOTE("password", kvfs_conf_set_str, password),
	{ NULL },
};
#undef REMOTE

/* The section's presence turns the tier on (backend defaults to redis). */
static int remote_begin(struct conf_state *st, const char *arg)
{
	st->c->cache.remote.backend = KVFS_REMOTE_REDIS;
	return 0;
}

/* ---- [fleet] ---- */

static int set_fleet_sightings(struct conf_state *st, const struct conf_key *k,
			       const char *val, void *field)
{
	static const struct conf_word words[] = {
		{ "off", KVFS_SIGHT_NONE },
		{ "redis", KVFS_SIGHT_REDIS },
		{ "memory", KVFS_SIGHT_MEMORY },
		{ NULL, 0 },
	};

	return kvfs_conf_set_word(st, k, val, field, words);
}

#define FLEET(kname, fn, field, lo, hi)                                  \
	{ kname, fn, offsetof(struct kvfs_conf, cache.fleet.field), lo, hi, \
	  sizeof(((struct kvfs_conf *)0)->cache.fleet.field), false }

static const struct conf_key fleet_keys[] = {
	FLEET("sightings", set_fleet_sightings, backend, 0, 0),
	FLEET("nodes", set_remote_nodes, nodes, 0, 0),
	FLEET("password", kvfs_conf_set_str, password, 0, 0),
	FLEET("channel", set_remote_prefix, channel, 0, 0),
	FLEET("interval", set_duration_ms, interval_ms, 10, 60000),
	FLEET("timeout", set_duration_ms, timeout_ms, 1, 60000),
	FLEET("buffer", kvfs_conf_set_u32, buffer, 1, 1u << 24),
	{ NULL },
};
#undef FLEET

/* sightings = redis needs somewhere to publish. */
static int fleet_end(struct conf_state *st)
{
	if (st->c->cache.fleet.backend == KVFS_SIGHT_REDIS &&
	    !key_line_in(st, fleet_keys, "nodes"))
		return kvfs_conf_fail(st,
				      key_line_in(st, fleet_keys, "sightings"),
				      "[%s]: sightings = redis needs nodes "
				      "(host:port[,host:port...])",
				      st->sec_name);
	return 0;
}

static const struct conf_section sections[] = {
	{ .name = "daemon", .keys = daemon_keys, .target = conf_target },
	{ .name = "tier.dram", .keys = dram_keys, .target = conf_target },
	{ .name = "tier.ssd", .keys = ssd_keys, .target = conf_target },
	{ .name = "tier.gpu", .keys = gpu_keys, .target = conf_target,
	  .end = gpu_end },
	{ .name = "chunks", .keys = chunk_keys, .target = conf_target },
	{ .name = "tier.remote", .keys = remote_keys, .target = conf_target,
	  .begin = remote_begin },
	{ .name = "fleet", .keys = fleet_keys, .target = conf_target,
	  .end = fleet_end },
	{ .name = "policy", .keys = policy_keys, .target = conf_target,
	  .other = policy_other },
	{ .name = NS_PREFIX, .named = true, .keys = ns_keys,
	  .target = ns_target, .begin = ns_begin, .end = ns_end },
};

#define N_SECTIONS (sizeof(sections) / sizeof(sections[0]))
_Static_assert(N_SECTIONS <= 32, "sections_seen is 32 bits");

/* ---- section tracking ---- */

static int section_end(struct conf_state *st)
{
	const struct conf_section *s = st->sec;

	if (!s)
		return 0;
	st->sec = NULL;
	for (size_t i = 0; s->keys[i].name; i++)
		if (s->keys[i].required && !(st->seen & (1ull << i)))
			return kvfs_conf_fail(st, st->sec_line,
					      "[%s]: missing required key '%s'",
					      st->sec_name, s->keys[i].name);
	return s->end ? s->end(st) : 0;
}

static int section_begin(struct conf_state *st, const char *hdr, size_t len)
{
	const struct conf_section *s = NULL;
	const char *arg = NULL;
	size_t i;
	int rc = section_end(st);

	if (rc)
		return rc;
	while (len && (hdr[len - 1] == ' ' || hdr[len - 1] == '\t'))
		len--;
	snprintf(st->sec_name, sizeof(st->sec_name), "%.*s", (int)len, hdr);
	st->sec_line = st->lineno;
	st->seen = 0;
	for (i = 0; i < N_SECTIONS; i++) {
		size_t n = strlen(sections[i].name);

		if (strncmp(st->sec_name, sections[i].name, n))
			continue;
		if (!sections[i].named && !st->sec_name[n]) {
			s = &sections[i];
			break;
		}
		if (sections[i].named && (st->sec_name[n] == ' ' ||
					  st->sec_name[n] == '\t')) {
			s = &sections[i];
			arg = st->sec_name + n + strspn(st->sec_name + n, " \t");
			break;
		}
		if (sections[i].named && !st->sec_name[n])
			return kvfs_conf_fail(st, st->lineno,
					      "[%s] needs a name: [%s NAME]",
					      st->sec_name, sections[i].name);
	}
	if (!s)
		return kvfs_conf_fail(st, st->lineno, "unknown section [%s]",
				      st->sec_name);
	if (!s->named) {
		if (st->sections_seen & (1u << i))
			return kvfs_conf_fail(st, st->lineno,
					      "duplicate section [%s]",
					      st->sec_name);
		st->sections_seen |= 1u << i;
	}
	if (s->begin && (rc = s->begin(st, arg)))
		return rc;
	st->sec = s;
	return 0;
}

/* ---- inih glue ---- */

static int conf_handler(void *user, const char *section, const char *name,
			const char *value)
{
	struct conf_state *st = user;
	const struct conf_section *s = st->sec;
	size_t i;

	if (st->failed)
		return 0;
	if (!s) {
		kvfs_conf_fail(st, st->lineno, "'%s' outside of any section",
			       name);
		return 0;
	}
	for (i = 0; s->keys[i].name; i++)
		if (!strcmp(s->keys[i].name, name))
			break;
	if (!s->keys[i].name) {
		if (!s->other)
			kvfs_conf_fail(st, st->lineno,
				       "unknown key '%s' in [%s]", name,
				       st->sec_name);
		else
			s->other(st, name, value);
		return !st->failed;
	}
	if (st->seen & (1ull << i)) {
		kvfs_conf_fail(st, st->lineno, "duplicate key '%s' in [%s]",
			       name, st->sec_name);
		return 0;
	}
	st->seen |= 1ull << i;
	if (i < sizeof(st->key_line) / sizeof(st->key_line[0]))
		st->key_line[i] = st->lineno;
	s->keys[i].set(st, &s->keys[i], value,
		       (char *)s->target(st) + s->keys[i].off);
	return !st->failed;
}

/* One line of the input into @buf (fgets semantics); NULL at the end. */
static char *next_line(struct conf_state *st, char *buf, int size)
{
	size_t n;

	if (st->file)
		return fgets(buf, size, st->file);
	if (!*st->text)
		return NULL;
	n = strcspn(st->text, "\n");
	if (st->text[n] == '\n')
		n++;
	if (n > (size_t)size - 1)
		n = (size_t)size - 1;
	memcpy(buf, st->text, n);
	buf[n] = '\0';
	st->text += n;
	return buf;
}

static char *conf_reader(char *buf, int size, void *stream)
{
	struct conf_state *st = stream;
	char *p, *end;
	size_t n;

	/* Stop at the first error: later lines would only add noise. */
	if (st->failed || size < 2 || !next_line(st, buf, size))
		return NULL;
	st->lineno++;
	n = strlen(buf);
	if (n == (size_t)size - 1 && buf[n - 1] != '\n') {
		bool at_end = st->file ? (ungetc(getc(st->file), st->file) == EOF)
				       : !*st->text;

		if (!at_end) {
			kvfs_conf_fail(st, st->lineno,
				       "line longer than %d bytes", size - 2);
			return NULL;
		}
	}
	if (st->lineno == 1 && !strncmp(buf, "\xef\xbb\xbf", 3))
		memmove(buf, buf + 3, strlen(buf + 3) + 1);
	p = buf + strspn(buf, " \t\r\v\f");
	memmove(buf, p, strlen(p) + 1);
	if (buf[0] == '[') {
		end = strchr(buf, ']');
		/* without ']' inih reports the line as a syntax error */
		if (end && section_begin(st, buf + 1, (size_t)(end - buf - 1)))
			return NULL;
	}
	return buf;
}

int kvfs_conf_ns_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	if (!n || n >= KVFS_NS_NAME_MAX || name[0] == '.' ||
	    strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
			 "0123456789._-") != n)
		return -EINVAL;
	return 0;
}

void kvfs_conf_defaults(struct kvfs_conf *c)
{
	memset(c, 0, sizeof(*c));
	c->threads = 16;
	c->log_level = KVFS_LOG_INFO;
	kvfs_cache_params_defaults(&c->cache);
}

/* Checks that need more than one section, once every section is read. */
static int conf_end(struct conf_state *st)
{
	const struct kvfs_conf *c = st->c;

	/* Only a CUDA device pins host memory: shm copies with memcpy. */
	if (c->cache.dram_pinned == KVFS_PARAMS_PINNED_YES &&
	    c->cache.gpu_backend != KVFS_PARAMS_GPU_CUDA)
		return kvfs_conf_fail(
			st, st->pinned_line,
			"[tier.dram]: pinned = yes needs [tier.gpu] "
			"backend = cuda (use auto or no)");
	return 0;
}

/* Runs the parse for either input; starts from the defaults. */
static int conf_run(struct conf_state *st)
{
	int line;

	kvfs_conf_defaults(st->c);
	line = ini_parse_stream(conf_reader, st, conf_handler, st);
	if (!st->failed) {
		if (line > 0)
			kvfs_conf_fail(
				st, (unsigned)line,
				"syntax error: expected [section] or key = value");
		else if (line < 0)
			kvfs_conf_fail(st, st->lineno,
				       "cannot parse (error %d)", line);
		else if (!section_end(st))
			conf_end(st);
	} else if (line > 0 && (unsigned)line < st->err_line) {
		/* inih's syntax error came before our own */
		st->err_line = (unsigned)line;
		snprintf(st->err, sizeof(st->err),
			 "syntax error: expected [section] or key = value");
	}
	if (st->failed) {
		kvfs_err("%s:%u: %s", st->origin, st->err_line, st->err);
		return -EINVAL;
	}
	return 0;
}

int kvfs_conf_parse(const char *text, const char *origin,
		    struct kvfs_conf *c)
{
	struct conf_state st = {
		.c = c,
		.origin = origin ? origin : "<string>",
		.text = text ? text : "",
	};

	return conf_run(&st);
}

int kvfs_conf_load(const char *path, struct kvfs_conf *c)
{
	struct conf_state st = { .c = c, .origin = path };
	int rc;

	st.file = fopen(path, "re");
	if (!st.file) {
		rc = -errno;
		kvfs_err("%s: cannot open config: %s", path, strerror(-rc));
		return rc;
	}
	rc = conf_run(&st);
	if (!rc && ferror(st.file)) {
		kvfs_err("%s: read error", path);
		rc = -EIO;
	}
	fclose(st.file);
	return rc;
}
