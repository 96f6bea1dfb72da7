/* SPDX-License-Identifier: MIT */
/*
 * The Prometheus endpoint (fs/metrics.h): the exposition text made from
 * the engine's snapshot, and the HTTP server around it.
 *
 * Label values need no escaping: tier names are fixed, namespace and
 * policy names are [A-Za-z0-9._-] (fs/conf.c refuses anything else).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>

#include "fs/metrics.h"
#include "meta/log.h"
#include "meta/util.h"

struct kvfs_metrics {
	struct kvfs_cache *c; /* immutable */
	struct MHD_Daemon *d; /* immutable while serving */
};

/* ---- the address ---- */

static int parse_port(const char *s, in_port_t *port)
{
	uint32_t v;

	if (!*s || kvfs_util_parse_u32(s, &v) || v < 1 || v > 65535)
		return -EINVAL;
	*port = htons((uint16_t)v);
	return 0;
}

int kvfs_metrics_addr_parse(const char *s, struct sockaddr_storage *ss,
			    socklen_t *len, const char **why)
{
	struct sockaddr_storage tmp;
	char host[INET6_ADDRSTRLEN];
	const char *colon, *h = s;
	size_t hl;
	in_port_t port;

	if (!ss)
		ss = &tmp;
	memset(ss, 0, sizeof(*ss));
	if (*s == '[') {
		const char *close = strchr(s, ']');

		if (!close || close[1] != ':')
			goto bad;
		h = s + 1;
		hl = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			goto bad;
		hl = (size_t)(colon - s);
	}
	if (!hl || hl >= sizeof(host))
		goto bad;
	memcpy(host, h, hl);
	host[hl] = 0;
	if (parse_port(colon + 1, &port)) {
		if (why)
			*why = "the port must be 1..65535";
		return -EINVAL;
	}
	if (*s == '[') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;

		if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
			goto bad;
		a->sin6_family = AF_INET6;
		a->sin6_port = port;
		if (len)
			*len = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;

		if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
			goto bad;
		a->sin_family = AF_INET;
		a->sin_port = port;
		if (len)
			*len = sizeof(*a);
	}
	return 0;
bad:
	if (why)
		*why = "expected IPv4:port or [IPv6]:port with a numeric "
		       "address (127.0.0.1:9464, [::1]:9464)";
	return -EINVAL;
}

/* ---- the exposition text ---- */

static void head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one series without labels. */
static void one(FILE *f, const char *name, const char *type, const char *help,
		uint64_t v)
{
	head(f, name, type, help);
	fprintf(f, "%s %" PRIu64 "\n", name, v);
}

#define U64_AT(p, off) (*(const uint64_t *)((const char *)(p) + (off)))

struct fam {
	const char *name, *type, *help;
	size_t off; /* of a uint64_t in the struct the table is for */
};

#define GAUGE "gauge"
#define COUNTER "counter"

/* Per tier; the remote tier has those marked (below). */
static const struct fam tier_fams[] = {
#define T(n, ty, h, f)                                                     \
	{                                                                  \
		"kvfs_tier_" n, ty, h, offsetof(struct kvfs_stats_tier, f) \
	}
	T("capacity_bytes", GAUGE, "Bytes the tier can hold.", capacity_bytes),
	T("used_bytes", GAUGE, "Bytes the tier holds (reserved).", used_bytes),
	T("blocks", GAUGE, "Blocks with a copy in the tier.", blocks),
	T("hits_total", COUNTER, "Blocks found in the tier when wanted.", hits),
	T("misses_total", COUNTER, "Blocks not found in the tier when wanted.",
	  misses),
	T("evictions_total", COUNTER, "Blocks evicted from the tier.",
	  evictions),
	T("read_bytes_total", COUNTER, "Bytes read from the tier.", bytes_read),
	T("written_bytes_total", COUNTER, "Bytes written to the tier.",
	  bytes_written),
	T("io_reads_total", COUNTER, "Read operations issued to the tier.",
	  io_reads),
	T("io_writes_total", COUNTER, "Write operations issued to the tier.",
	  io_writes),
#undef T
};

/* The remote tier's figures among tier_fams (it has no capacity). */
static bool remote_has(size_t off)
{
	return off == offsetof(struct kvfs_stats_tier, hits) ||
	       off == offsetof(struct kvfs_stats_tier, misses) ||
	       off == offsetof(struct kvfs_stats_tier, bytes_read) ||
	       off == offsetof(struct kvfs_stats_tier, bytes_written);
}

static void tiers(const struct kvfs_stats *s, FILE *f)
{
	struct kvfs_stats_tier rt = {
		.hits = s->remote_st.hits,
		.misses = s->remote_st.misses,
		.bytes_read = s->remote_st.bytes_read,
		.bytes_written = s->remote_st.bytes_written,
	};

	for (size_t i = 0; i < sizeof(tier_fams) / sizeof(tier_fams[0]); i++) {
		const struct fam *m = &tier_fams[i];

		head(f, m->name, m->type, m->help);
		for (int t = 0; t < KVFS_NTIERS; t++)
			if (s->tier[t].present)
				fprintf(f, "%s{tier=\"%s\"} %" PRIu64 "\n",
					m->name, kvfs_tier_name(t),
					U64_AT(&s->tier[t], m->off));
		if (s->remote && remote_has(m->off))
			fprintf(f, "%s{tier=\"remote\"} %" PRIu64 "\n", m->name,
				U64_AT(&rt, m->off));
	}
	if (!s->tier[KVFS_TIER_GPU].present)
		return;
	head(f, "kvfs_tier_direct_bytes_total", COUNTER,
	     "Host-device bytes copied straight from or to registered host "
	     "memory.");
	fprintf(f, "kvfs_tier_direct_bytes_total{tier=\"gpu\"} %" PRIu64 "\n",
		s->tier[KVFS_TIER_GPU].direct_bytes);
	head(f, "kvfs_tier_staged_bytes_total", COUNTER,
	     "Host-device bytes copied through a staging buffer.");
	fprintf(f, "kvfs_tier_staged_bytes_total{tier=\"gpu\"} %" PRIu64 "\n",
		s->tier[KVFS_TIER_GPU].staged_bytes);
}

static void remote(const struct kvfs_stats *s, FILE *f)
{
	const struct kvfs_remote_stats *r = &s->remote_st;

	if (!s->remote)
		return;
	one(f, "kvfs_remote_rejected_total", COUNTER,
	    "Remote values that failed a check (deleted there).", r->rejected);
	one(f, "kvfs_remote_errors_total", COUNTER,
	    "Remote faults: timeouts, nodes down.", r->errors);
	one(f, "kvfs_remote_queued_blocks", GAUGE,
	    "Blocks waiting in the remote write-back queue.", r->queued);
	one(f, "kvfs_remote_dropped_total", COUNTER,
	    "Queued blocks dropped (queue full, or failed).", r->dropped);
	one(f, "kvfs_remote_nodes", GAUGE, "Masters in the cluster's slot map.",
	    r->nodes);
}

/* Fleet sightings (docs/remote.md), with [fleet] sightings on. */
static void fleet(const struct kvfs_stats *s, FILE *f)
{
	const struct kvfs_sight_stats *r = &s->fleet_st;

	if (!s->fleet)
		return;
	one(f, "kvfs_fleet_sight_keys_sent_total", COUNTER,
	    "Block keys this host published to the fleet.", r->keys_out);
	one(f, "kvfs_fleet_sight_messages_sent_total", COUNTER,
	    "Sighting messages this host published.", r->msgs_out);
	one(f, "kvfs_fleet_sight_keys_received_total", COUNTER,
	    "Block keys other hosts referenced, handed to the policy.",
	    r->keys_in);
	one(f, "kvfs_fleet_sight_messages_received_total", COUNTER,
	    "Sighting messages received from other hosts.", r->msgs_in);
	one(f, "kvfs_fleet_sight_dropped_total", COUNTER,
	    "Keys not buffered: the sightings buffer was full.", r->dropped);
	one(f, "kvfs_fleet_sight_lost_total", COUNTER,
	    "Keys of messages whose publish failed.", r->lost);
	one(f, "kvfs_fleet_sight_rejected_total", COUNTER,
	    "Malformed sighting messages received (never used).", r->rejected);
	one(f, "kvfs_fleet_sight_errors_total", COUNTER,
	    "Sightings faults: connect, AUTH, PUBLISH, SUBSCRIBE.", r->errors);
	one(f, "kvfs_fleet_sight_reconnects_total", COUNTER,
	    "Subscriptions made again after a fault.", r->reconnects);
	one(f, "kvfs_fleet_sight_buffered_keys", GAUGE,
	    "Keys waiting for the next publish.", r->buffered);
}

static const struct fam cache_fams[] = {
#define C(n, ty, h, f)                                           \
	{                                                        \
		"kvfs_" n, ty, h, offsetof(struct kvfs_stats, f) \
	}
	C("cache_blocks", GAUGE, "Committed blocks.", blocks),
	C("cache_commits_total", COUNTER, "Blocks committed.", commits),
	C("cache_rejects_total", COUNTER, "Blocks refused at commit.", rejects),
	C("cache_deletes_total", COUNTER, "Blocks deleted.", deletes),
	C("cache_lookup_misses_total", COUNTER,
	  "Names looked up that are not blocks here.", lookup_misses),
	C("cache_checksum_errors_total", COUNTER,
	  "Block reads that failed their checksum.", checksum_errors),
	C("cache_dram_pins", GAUGE, "Blocks pinned in DRAM.", dram_pins),
	C("cache_dram_pins_waiting", GAUGE,
	  "Blocks pinned in DRAM without a DRAM copy yet.", dram_pins_waiting),
	C("writeback_queued_blocks", GAUGE,
	  "Blocks waiting for or in write-back to the SSD.", wb_queued),
	C("writeback_batches_total", COUNTER, "Write-back batches written.",
	  wb_batches),
	C("writeback_blocks_total", COUNTER, "Blocks written back to the SSD.",
	  wb_blocks),
	C("writeback_errors_total", COUNTER, "Write-backs that failed.",
	  wb_errors),
	C("writeback_stalled_blocks", GAUGE, "Blocks waiting for SSD space.",
	  wb_stalled),
	/* Not "counter_flushes": promtool refuses a type in a name. */
	C("meta_flushes_total", COUNTER,
	  "Transactions recording blocks' hits and last accesses.",
	  counter_flushes),
	C("policy_discards_total", COUNTER,
	  "Blocks the policy dropped from every tier.", discarded),
	C("policy_promotions_total", COUNTER, "Blocks promoted.", promoted),
	C("policy_demotions_total", COUNTER, "Blocks demoted.", demoted),
	C("policy_promote_passes_total", COUNTER, "Promotion passes run.",
	  promote_passes),
	C("ctl_leases", GAUGE, "Leases held through .kvfs/ctl.", leases),
	C("ctl_leases_reclaimed_total", COUNTER,
	  "Leases reclaimed from dead or expired holders.", leases_reclaimed),
	C("ctl_fetches_total", COUNTER, "FETCH requests served.", fetches),
	C("ctl_fetch_bytes_total", COUNTER,
	  "Payload bytes FETCH made resident in the device pool.", fetch_bytes),
	C("ctl_fetch_into_bytes_total", COUNTER, "Bytes of FETCH_INTO.",
	  fetch_into_bytes),
	C("ctl_saves_total", COUNTER, "Blocks saved through SAVE.", saves),
	C("restore_hidden_blocks", GAUGE,
	  "Blocks stored as hidden states (HIDDEN or MIXED).", hidden_blocks),
	C("restore_mixed_blocks", GAUGE, "Of those, MIXED.", mixed_blocks),
	C("restore_hidden_stored_bytes", GAUGE,
	  "Stored bytes of the blocks stored as hidden states.",
	  hidden_stored_bytes),
	C("restore_hidden_kv_bytes", GAUGE, "Their bytes as KV files.",
	  hidden_kv_bytes),
	C("restore_blocks_total", COUNTER, "Restorations run.", restores),
	C("restore_waits_total", COUNTER, "Reads that waited for one.",
	  restore_waits),
	C("restore_joined_total", COUNTER,
	  "Reads that joined a restoration under way.", restore_joined),
	C("restore_ahead_total", COUNTER,
	  "Restorations submitted ahead of need.", restore_ahead),
	C("restore_private_total", COUNTER,
	  "Restorations whose result stayed out of DRAM.", restore_private),
	C("restore_from_pool_total", COUNTER,
	  "KV copied down from the device pool, not rebuilt.",
	  restore_from_pool),
	C("restore_errors_total", COUNTER, "Restorations that failed.",
	  restore_errors),
	C("restore_commit_conversions_total", COUNTER,
	  "HIDDEN writes stored as KV.", restore_conversions),
	C("restore_commit_splits_total", COUNTER, "HIDDEN writes stored MIXED.",
	  restore_splits),
	C("restore_pipelined_total", COUNTER,
	  "Restorations streamed from the SSD.", restore_pipelined),
	C("restore_to_device_total", COUNTER,
	  "Restorations straight into the device pool.", restore_to_device),
	C("restore_to_device_gpu_total", COUNTER, "Of those, on the GPU.",
	  restore_to_device_gpu),
	C("restore_to_device_fallbacks_total", COUNTER,
	  "Of those, failed and done through DRAM.",
	  restore_to_device_fallbacks),
	C("restore_gpu_blocks_total", COUNTER, "Restorations on the GPU.",
	  restore_gpu_blocks),
	C("restore_gpu_fallbacks_total", COUNTER,
	  "GPU restorations the CPU finished.", restore_gpu_fallbacks),
	C("restore_threads", GAUGE, "Restoration threads.", restore_threads),
#undef C
};

static const struct fam chunk_fams[] = {
#define K(n, h, f)                                           \
	{                                                    \
		"kvfs_chunk_" n, COUNTER, h,                 \
			offsetof(struct kvfs_chunk_stats, f) \
	}
	K("wanted_bytes_total", "Chunk bytes asked for.", bytes_wanted),
	K("read_bytes_total", "Bytes read from the SSD for chunks.",
	  bytes_read),
	K("missed_bytes_total", "Chunk bytes the SSD had to serve.",
	  bytes_missed),
	K("ssd_reads_total", "SSD reads for chunks.", ssd_reads),
	K("mem_hits_total", "Chunks served from memory.", mem_hits),
	K("spec_loaded_total", "Chunks loaded speculatively.", spec_loaded),
	K("spec_used_total", "Speculative chunks used.", spec_used),
	K("prefetch_joined_total", "Requests that joined a prefetch.",
	  prefetch_joined),
	K("spec_cancelled_total", "Speculative loads cancelled.",
	  spec_cancelled),
	K("evictions_total", "Chunks evicted.", evictions),
	K("demotions_total", "Chunks demoted from the device set.", demotions),
#undef K
};

static void table(FILE *f, const struct fam *t, size_t n, const void *p)
{
	for (size_t i = 0; i < n; i++)
		one(f, t[i].name, t[i].type, t[i].help, U64_AT(p, t[i].off));
}

static void chunks(const struct kvfs_stats *s, FILE *f)
{
	const struct kvfs_chunk_stats *k = &s->chunk;

	if (!s->chunks)
		return;
	table(f, chunk_fams, sizeof(chunk_fams) / sizeof(chunk_fams[0]), k);
	head(f, "kvfs_chunk_used_bytes", GAUGE, "Bytes the chunk cache holds.");
	fprintf(f, "kvfs_chunk_used_bytes{tier=\"dram\"} %" PRIu64 "\n",
		k->dram_used);
	fprintf(f, "kvfs_chunk_used_bytes{tier=\"gpu\"} %" PRIu64 "\n",
		k->gpu_used);
	head(f, "kvfs_chunk_capacity_bytes", GAUGE,
	     "Bytes the chunk cache may hold.");
	fprintf(f, "kvfs_chunk_capacity_bytes{tier=\"dram\"} %" PRIu64 "\n",
		k->dram_capacity);
	fprintf(f, "kvfs_chunk_capacity_bytes{tier=\"gpu\"} %" PRIu64 "\n",
		k->gpu_capacity);
	head(f, "kvfs_chunk_pieces", GAUGE, "Pieces the chunk cache holds.");
	fprintf(f, "kvfs_chunk_pieces{tier=\"dram\"} %" PRIu64 "\n",
		k->dram_pieces);
	fprintf(f, "kvfs_chunk_pieces{tier=\"gpu\"} %" PRIu64 "\n",
		k->gpu_pieces);
}

static const struct fam ns_fams[] = {
#define N(n, ty, h, f)                                                        \
	{                                                                     \
		"kvfs_namespace_" n, ty, h, offsetof(struct kvfs_stats_ns, f) \
	}
	N("blocks", GAUGE, "Committed blocks of the namespace.", blocks),
	N("bytes", GAUGE, "Their file sizes.", bytes),
	N("hits_total", COUNTER, "Accesses of its blocks.", hits),
	N("hidden_blocks", GAUGE, "Its blocks stored as hidden states.",
	  hidden_blocks),
	N("restored_total", COUNTER, "Its restorations for reads.", restored),
#undef N
};

static void namespaces(const struct kvfs_stats *s, FILE *f)
{
	for (size_t i = 0; i < sizeof(ns_fams) / sizeof(ns_fams[0]); i++) {
		const struct fam *m = &ns_fams[i];

		head(f, m->name, m->type, m->help);
		for (size_t j = 0; j < s->n_ns; j++)
			fprintf(f, "%s{namespace=\"%s\"} %" PRIu64 "\n",
				m->name, s->ns[j].name,
				U64_AT(&s->ns[j], m->off));
	}
}

/* One histogram's series; @label is "" or 'name="value",'. */
static void hist(FILE *f, const char *name, const char *label,
		 const struct kvfs_hist_snap *h)
{
	size_t ll = strlen(label);
	/* The label set without the trailing comma, for _sum and _count. */
	int bare = ll ? (int)ll - 1 : 0;

	for (unsigned i = 0; i < KVFS_HIST_BUCKETS; i++)
		fprintf(f, "%s_bucket{%sle=\"%.9g\"} %" PRIu64 "\n", name,
			label, kvfs_hist_bound_s(i), h->le[i]);
	fprintf(f, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, label,
		h->count);
	fprintf(f, "%s_sum%s%.*s%s %.9g\n", name, ll ? "{" : "", bare, label,
		ll ? "}" : "", (double)h->sum_ns * 1e-9);
	fprintf(f, "%s_count%s%.*s%s %" PRIu64 "\n", name, ll ? "{" : "", bare,
		label, ll ? "}" : "", h->count);
}

static void histograms(const struct kvfs_stats *s, FILE *f)
{
	static const char *const ops[] = {
		[KVFS_CACHE_HIST_LOOKUP] = "op=\"lookup\",",
		[KVFS_CACHE_HIST_FETCH] = "op=\"fetch\",",
		[KVFS_CACHE_HIST_FETCH_INTO] = "op=\"fetch_into\",",
		[KVFS_CACHE_HIST_FETCH_CHUNKS] = "op=\"fetch_chunks\",",
	};

	head(f, "kvfs_ctl_request_duration_seconds", "histogram",
	     "Time of .kvfs/ctl LOOKUP and FETCH requests, from decoding to "
	     "the response.");
	for (int i = KVFS_CACHE_HIST_LOOKUP; i <= KVFS_CACHE_HIST_FETCH_CHUNKS;
	     i++)
		hist(f, "kvfs_ctl_request_duration_seconds", ops[i],
		     &s->hist[i]);
	head(f, "kvfs_fuse_read_duration_seconds", "histogram",
	     "Time of a FUSE read of a block, reply included.");
	hist(f, "kvfs_fuse_read_duration_seconds", "",
	     &s->hist[KVFS_CACHE_HIST_READ]);
	if (!s->remote)
		return;
	head(f, "kvfs_remote_round_trip_seconds", "histogram",
	     "Time of one pipeline of commands to the remote tier, of the "
	     "callers' client and of the write-back's (retries included).");
	hist(f, "kvfs_remote_round_trip_seconds", "client=\"caller\",",
	     &s->remote_st.rtt);
	hist(f, "kvfs_remote_round_trip_seconds", "client=\"writeback\",",
	     &s->remote_st.rtt_bg);
}

void kvfs_metrics_write(const struct kvfs_stats *s, FILE *f)
{
	head(f, "kvfs_policy_info", GAUGE, "The placement policy (always 1).");
	fprintf(f, "kvfs_policy_info{policy=\"%s\"} 1\n", s->policy);
	tiers(s, f);
	remote(s, f);
	fleet(s, f);
	table(f, cache_fams, sizeof(cache_fams) / sizeof(cache_fams[0]), s);
	head(f, "kvfs_restore_seconds_total", COUNTER,
	     "Time spent in restorations.");
	fprintf(f, "kvfs_restore_seconds_total %.9g\n",
		(double)s->restore_ns * 1e-9);
	chunks(s, f);
	namespaces(s, f);
	histograms(s, f);
}

/* ---- the server ---- */

static enum MHD_Result reply(struct MHD_Connection *con, unsigned code,
			     char *body, size_t len)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (!body)
		return MHD_NO;
	r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	if (code == MHD_HTTP_OK)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
					"text/plain; version=0.0.4; "
					"charset=utf-8");
	ret = MHD_queue_response(con, code, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *con,
			     const char *url, const char *method,
			     const char *version, const char *upload,
			     size_t *upload_len, void **con_cls)
{
	struct kvfs_metrics *m = cls;
	struct kvfs_stats *s;
	char *body = NULL;
	size_t len = 0;
	FILE *f;

	if (strcmp(method, MHD_HTTP_METHOD_GET) || strcmp(url, "/metrics"))
		return reply(con, MHD_HTTP_NOT_FOUND, strdup("not found\n"),
			     10);
	if (kvfs_cache_stats_get(m->c, &s))
		return MHD_NO; /* out of memory: drop the connection */
	f = open_memstream(&body, &len);
	if (!f) {
		kvfs_cache_stats_free(s);
		return MHD_NO;
	}
	kvfs_metrics_write(s, f);
	kvfs_cache_stats_free(s);
	if (fclose(f)) {
		free(body);
		return MHD_NO;
	}
	return reply(con, MHD_HTTP_OK, body, len);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[256];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	msg[strcspn(msg, "\n")] = 0;
	kvfs_warn("metrics: %s", msg);
}

/* A listening socket on @ss: the bind's errors are ours to report. */
static int listen_on(const struct sockaddr_storage *ss, socklen_t len, int *out)
{
	int one = 1, fd, rc;

	fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
		    0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    (ss->ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one))) ||
	    bind(fd, (const struct sockaddr *)ss, len) || listen(fd, 16)) {
		rc = -errno;
		close(fd);
		return rc;
	}
	*out = fd;
	return 0;
}

int kvfs_metrics_start(struct kvfs_cache *c, const char *addr,
		       struct kvfs_metrics **out)
{
	struct sockaddr_storage ss;
	struct kvfs_metrics *m;
	const char *why;
	socklen_t len;
	int fd = -1, rc;

	*out = NULL;
	rc = kvfs_metrics_addr_parse(addr, &ss, &len, &why);
	if (rc) {
		kvfs_err("metrics = %s: %s", addr, why);
		return rc;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->c = c;
	rc = listen_on(&ss, len, &fd);
	if (rc) {
		kvfs_err("metrics: cannot listen on %s: %s", addr,
			 strerror(-rc));
		goto out_free;
	}
	/* One thread polls and serves: a scrape is a snapshot and a few
	 * kilobytes of text, and nothing else is served.
	 */
	m->d = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
			(ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
		0, NULL, NULL, serve, m,
		/* First, or MHD logs its own way until it sees it. */
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
		MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, 16u,
		MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
	if (!m->d) {
		kvfs_err("metrics: the HTTP server did not start on %s", addr);
		close(fd);
		rc = -EIO;
		goto out_free;
	}
	kvfs_info("metrics: serving http://%s/metrics", addr);
	*out = m;
	return 0;
out_free:
	free(m);
	return rc;
}

void kvfs_metrics_stop(struct kvfs_metrics *m)
{
	if (!m)
		return;
	/* Joins the server's thread and closes the listening socket. */
	MHD_stop_daemon(m->d);
	free(m);
}
