// SPDX-License-Identifier: MIT
/*
 * kvfs-sim: replay a request trace (or a generated workload) through the
 * kvfs cache policies and report hit ratios, tier traffic, modeled TTFT
 * and policy cost.  Usage: kvfs-sim --help; docs/policies.md.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/policy.h"
#include "sim/sim.h"
#include "sim/trace.h"
#include "meta/log.h"

#define MAX_POLICIES 16
#define MAX_OPTS 32
#define MAX_POINTS 64

struct opts {
	const char *trace, *gen, *gen_out, *sweep_out, *points, *req_out;
	int format;
	uint32_t block_tokens;
	const char *policy[MAX_POLICIES];
	unsigned npolicy;
	char *opt_pol[MAX_OPTS], *opt_key[MAX_OPTS], *opt_val[MAX_OPTS];
	unsigned nopt;
	uint64_t capacity;
	double capacity_pct;
	uint64_t tier[KVFS_NTIERS];
	bool multi, json, sweep, tables;
	const char *table_pcts;
	unsigned fleet;          /* hosts; 0 = not fleet mode */
	int route;               /* enum kvfs_fleet_route; -1 = both */
	const char *fleet_pcts;
	long sight_ms;            /* --fleet-sight; -1 = off */
	struct kvfs_trace_gen g;
	struct kvfs_sim_conf c;
	char deep[24]; /* kvfs's `deep`, from the model (model_deep()) */
};

static void usage(FILE *f)
{
	fputs(
"usage: kvfs-sim (--trace FILE --format mooncake|bailian | --gen KIND)\n"
"                [--policy P]... [capacity] [options]\n"
"\n"
"input:\n"
"  --trace FILE          JSONL trace\n"
"  --format F            mooncake (ms, 512-token blocks) or bailian\n"
"                        (s, 16-token blocks)\n"
"  --block-tokens N      tokens per hash id (overrides the format's)\n"
"  --gen KIND            zipf-docqa (paper 002), fewshot (paper 000),\n"
"                        chat (multi-turn sessions, after paper 001's\n"
"                        to-C trace) or agent (tool-and-agent sessions,\n"
"                        after Mooncake FAST'25's tool&agent trace)\n"
"  --gen-requests N      requests to generate (3072 / 14042 / 20000 /\n"
"                        23608)\n"
"  --seed N              generator seed (42)\n"
"  --gen-out FILE        write the generated trace as bailian JSONL\n"
"policies:\n"
"  --policy P            run P (repeatable); default: every policy\n"
"  --opt P.KEY=VAL       option KEY of policy P (repeatable)\n"
"capacity:\n"
"  --capacity-blocks N   single tier of N blocks\n"
"  --capacity-pct X      single tier of X%% of the trace's unique blocks\n"
"  --gpu-blocks N --dram-blocks N --ssd-blocks N   multi-tier run\n"
"  --promote-every N     requests between promotion plans (1; 0 = off)\n"
"  --promote-max N       moves per promotion plan (64)\n"
"  --warmup N            leave the first N requests out of the stats\n"
"  --sweep               1%..50% of unique blocks, every policy: CSV+PNG\n"
"  --sweep-out PREFIX    PREFIX.csv and PREFIX.png (sweep)\n"
"  --sweep-points LIST   percentages (1,2,3,5,7.5,10,15,20,30,40,50)\n"
"TTFT model (defaults: Llama-3-8B, H100, PCIe 4, NVMe):\n"
"  --flops F             effective prefill FLOP/s (4e14)\n"
"  --pcie-gbps G         host<->GPU GB/s (25)\n"
"  --ssd-gbps G          SSD GB/s (6)\n"
"  --net-gbps G          host<->shared tier GB/s, fleet (12.5)\n"
"  --model-params N      parameters (8.03e9)\n"
"  --layers N --hidden N --kv-heads N --head-dim N --dtype-bytes N\n"
"                        (32, 4096, 8, 128, 2)\n"
"                        kvfs's deep option follows them: params /\n"
"                        (2 x layers x hidden) unless --opt kvfs.deep\n"
"  --tables              markdown tables of hit ratio and mean TTFT, every\n"
"                        policy (or the --policy list) by capacity; with\n"
"                        --fleet, of the private caches (--route, rr)\n"
"  --table-pcts LIST     capacities, %% of unique blocks (1,2,5,10)\n"
"fleet (several hosts, one shared tier; docs/remote.md):\n"
"  --fleet N             N hosts: private caches of X%% of the unique\n"
"                        blocks each, against a shared tier of N times X%%\n"
"  --route R             rr or affinity (default: both)\n"
"  --fleet-pcts LIST     X per host (1,2,5); policy: the first --policy (lru)\n"
"  --fleet-sight MS      hosts tell each other the blocks they reference,\n"
"                        each heard MS ms (trace time) later, as kvfs's\n"
"                        [fleet] sightings do (docs/remote.md); off unless\n"
"                        given\n"
"output:\n"
"  --json                one JSON object per policy per line\n"
"  --requests-out FILE   a CSV line per request of every run: policy,\n"
"                        capacity_blocks, request, blocks, hit_blocks,\n"
"                        tokens, hit_tokens, ttft_ms (not with --fleet)\n", f);
}

enum {
	O_TRACE = 256, O_FORMAT, O_BT, O_GEN, O_GENREQ, O_SEED, O_GENOUT,
	O_POLICY, O_OPT, O_CAP, O_CAPPCT, O_GPU, O_DRAM, O_SSD, O_PEVERY,
	O_PMAX, O_WARMUP, O_SWEEP, O_SWEEPOUT, O_POINTS, O_FLOPS, O_PCIE,
	O_SSDBW, O_NETBW, O_PARAMS, O_LAYERS, O_HIDDEN, O_KVH, O_HDIM, O_DTYPE,
	O_JSON, O_HELP, O_FLEET, O_ROUTE, O_FLEETPCT, O_SIGHT, O_TABLES, O_TABLEPCT,
	O_REQOUT,
};

static const struct option longopts[] = {
	{ "trace", required_argument, NULL, O_TRACE },
	{ "format", required_argument, NULL, O_FORMAT },
	{ "block-tokens", required_argument, NULL, O_BT },
	{ "gen", required_argument, NULL, O_GEN },
	{ "gen-requests", required_argument, NULL, O_GENREQ },
	{ "seed", required_argument, NULL, O_SEED },
	{ "gen-out", required_argument, NULL, O_GENOUT },
	{ "policy", required_argument, NULL, O_POLICY },
	{ "opt", required_argument, NULL, O_OPT },
	{ "capacity-blocks", required_argument, NULL, O_CAP },
	{ "capacity-pct", required_argument, NULL, O_CAPPCT },
	{ "gpu-blocks", required_argument, NULL, O_GPU },
	{ "dram-blocks", required_argument, NULL, O_DRAM },
	{ "ssd-blocks", required_argument, NULL, O_SSD },
	{ "promote-every", required_argument, NULL, O_PEVERY },
	{ "promote-max", required_argument, NULL, O_PMAX },
	{ "warmup", required_argument, NULL, O_WARMUP },
	{ "sweep", no_argument, NULL, O_SWEEP },
	{ "sweep-out", required_argument, NULL, O_SWEEPOUT },
	{ "sweep-points", required_argument, NULL, O_POINTS },
	{ "flops", required_argument, NULL, O_FLOPS },
	{ "pcie-gbps", required_argument, NULL, O_PCIE },
	{ "ssd-gbps", required_argument, NULL, O_SSDBW },
	{ "net-gbps", required_argument, NULL, O_NETBW },
	{ "model-params", required_argument, NULL, O_PARAMS },
	{ "layers", required_argument, NULL, O_LAYERS },
	{ "hidden", required_argument, NULL, O_HIDDEN },
	{ "kv-heads", required_argument, NULL, O_KVH },
	{ "head-dim", required_argument, NULL, O_HDIM },
	{ "dtype-bytes", required_argument, NULL, O_DTYPE },
	{ "json", no_argument, NULL, O_JSON },
	{ "help", no_argument, NULL, O_HELP },
	{ "fleet", required_argument, NULL, O_FLEET },
	{ "route", required_argument, NULL, O_ROUTE },
	{ "fleet-pcts", required_argument, NULL, O_FLEETPCT },
	{ "fleet-sight", required_argument, NULL, O_SIGHT },
	{ "tables", no_argument, NULL, O_TABLES },
	{ "table-pcts", required_argument, NULL, O_TABLEPCT },
	{ "requests-out", required_argument, NULL, O_REQOUT },
	{ NULL, 0, NULL, 0 },
};

static int parse_u64(const char *name, const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	if (!s || *s < '0' || *s > '9')
		goto out_bad;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		goto out_bad;
	*out = v;
	return 0;
out_bad:
	kvfs_err("kvfs-sim: --%s wants a non-negative integer, got '%s'",
		 name, s ? s : "");
	return -EINVAL;
}

static int parse_u32(const char *name, const char *s, uint32_t *out)
{
	uint64_t v;

	if (parse_u64(name, s, &v))
		return -EINVAL;
	if (v > UINT32_MAX) {
		kvfs_err("kvfs-sim: --%s out of range: %s", name, s);
		return -EINVAL;
	}
	*out = (uint32_t)v;
	return 0;
}

static int parse_dbl(const char *name, const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0) || isinf(v)) {
		kvfs_err("kvfs-sim: --%s wants a non-negative number, got "
			 "'%s'", name, s);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

static int add_opt(struct opts *o, const char *arg)
{
	const char *dot = strchr(arg, '.'), *eq = strchr(arg, '=');

	if (!dot || !eq || dot > eq || dot == arg || eq == dot + 1) {
		kvfs_err("kvfs-sim: --opt wants POLICY.KEY=VALUE, got '%s'",
			 arg);
		return -EINVAL;
	}
	if (o->nopt == MAX_OPTS) {
		kvfs_err("kvfs-sim: too many --opt");
		return -EINVAL;
	}
	o->opt_pol[o->nopt] = strndup(arg, (size_t)(dot - arg));
	o->opt_key[o->nopt] = strndup(dot + 1, (size_t)(eq - dot - 1));
	o->opt_val[o->nopt] = strdup(eq + 1);
	if (!o->opt_pol[o->nopt] || !o->opt_key[o->nopt] ||
	    !o->opt_val[o->nopt])
		return -ENOMEM;
	o->nopt++;
	return 0;
}

static int parse_args(struct opts *o, int argc, char **argv)
{
	struct kvfs_sim_model *m = &o->c.model;
	int ch, rc = 0;
	int t;

	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		const char *name = ch >= O_TRACE && ch <= O_HELP ?
				   longopts[ch - O_TRACE].name : "?";

		switch (ch) {
		case O_TRACE: o->trace = optarg; break;
		case O_FORMAT:
			o->format = kvfs_trace_format_parse(optarg);
			if (o->format < 0) {
				kvfs_err("kvfs-sim: unknown format '%s'",
					 optarg);
				return -EINVAL;
			}
			break;
		case O_BT: rc = parse_u32(name, optarg, &o->block_tokens);
			break;
		case O_GEN: o->gen = optarg; break;
		case O_GENREQ:
			rc = parse_u32(name, optarg, &o->g.requests);
			break;
		case O_SEED: rc = parse_u64(name, optarg, &o->g.seed); break;
		case O_GENOUT: o->gen_out = optarg; break;
		case O_POLICY:
			if (o->npolicy == MAX_POLICIES) {
				kvfs_err("kvfs-sim: too many --policy");
				return -EINVAL;
			}
			o->policy[o->npolicy++] = optarg;
			break;
		case O_OPT: rc = add_opt(o, optarg); break;
		case O_CAP: rc = parse_u64(name, optarg, &o->capacity); break;
		case O_CAPPCT:
			rc = parse_dbl(name, optarg, &o->capacity_pct);
			break;
		case O_GPU: case O_DRAM: case O_SSD:
			t = ch - O_GPU;
			rc = parse_u64(name, optarg, &o->tier[t]);
			o->multi = true;
			break;
		case O_PEVERY:
			rc = parse_u32(name, optarg, &o->c.promote_every);
			break;
		case O_PMAX:
			rc = parse_u32(name, optarg, &o->c.promote_max);
			break;
		case O_WARMUP: rc = parse_u32(name, optarg, &o->c.warmup);
			break;
		case O_SWEEP: o->sweep = true; break;
		case O_SWEEPOUT: o->sweep_out = optarg; break;
		case O_POINTS: o->points = optarg; break;
		case O_FLOPS: rc = parse_dbl(name, optarg, &m->flops); break;
		case O_PCIE:
			rc = parse_dbl(name, optarg, &m->pcie_bps);
			m->pcie_bps *= 1e9;
			break;
		case O_SSDBW:
			rc = parse_dbl(name, optarg, &m->ssd_bps);
			m->ssd_bps *= 1e9;
			break;
		case O_NETBW:
			rc = parse_dbl(name, optarg, &m->net_bps);
			m->net_bps *= 1e9;
			break;
		case O_PARAMS: rc = parse_dbl(name, optarg, &m->params);
			break;
		case O_LAYERS: rc = parse_u32(name, optarg, &m->layers);
			break;
		case O_HIDDEN: rc = parse_u32(name, optarg, &m->hidden);
			break;
		case O_KVH: rc = parse_u32(name, optarg, &m->kv_heads); break;
		case O_HDIM: rc = parse_u32(name, optarg, &m->head_dim);
			break;
		case O_DTYPE: rc = parse_u32(name, optarg, &m->dtype_bytes);
			break;
		case O_JSON: o->json = true; break;
		case O_REQOUT: o->req_out = optarg; break;
		case O_FLEET: rc = parse_u32("fleet", optarg, &o->fleet);
			if (!rc && (!o->fleet || o->fleet > 1024)) {
				kvfs_err("kvfs-sim: --fleet wants 1..1024");
				return -EINVAL;
			}
			break;
		case O_ROUTE:
			if (!strcmp(optarg, "rr"))
				o->route = KVFS_FLEET_RR;
			else if (!strcmp(optarg, "affinity"))
				o->route = KVFS_FLEET_AFFINITY;
			else {
				kvfs_err("kvfs-sim: --route rr or affinity");
				return -EINVAL;
			}
			break;
		case O_FLEETPCT: o->fleet_pcts = optarg; break;
		case O_SIGHT: {
			uint32_t v;

			rc = parse_u32("fleet-sight", optarg, &v);
			o->sight_ms = v;
			break;
		}
		case O_TABLES: o->tables = true; break;
		case O_TABLEPCT: o->table_pcts = optarg; break;
		case 'h': case O_HELP: usage(stdout); exit(0);
		default: usage(stderr); return -EINVAL;
		}
		if (rc)
			return rc;
	}
	if (optind < argc) {
		kvfs_err("kvfs-sim: unexpected argument '%s'", argv[optind]);
		return -EINVAL;
	}
	if (!o->trace == !o->gen) {
		kvfs_err("kvfs-sim: give exactly one of --trace and --gen");
		return -EINVAL;
	}
	if (o->trace && !o->format) {
		kvfs_err("kvfs-sim: --trace needs --format");
		return -EINVAL;
	}
	if (o->gen && strcmp(o->gen, "zipf-docqa") &&
	    strcmp(o->gen, "fewshot") && strcmp(o->gen, "chat") &&
	    strcmp(o->gen, "agent")) {
		kvfs_err("kvfs-sim: unknown generator '%s'", o->gen);
		return -EINVAL;
	}
	if (o->multi && (o->capacity || o->capacity_pct)) {
		kvfs_err("kvfs-sim: --capacity-* and per-tier sizes exclude "
			 "each other");
		return -EINVAL;
	}
	return 0;
}

/* kvfs's `deep` for the model the TTFT figures use: the depth at which a
 * token costs twice a shallow one to recompute, P / (2 L d) tokens
 * (kvfs_sim_prefill_s()), so that the policy weighs misses as the
 * figures do.  Empty when the model gives no such depth.
 */
static void model_deep(struct opts *o)
{
	const struct kvfs_sim_model *m = &o->c.model;
	double h = m->layers && m->hidden ?
			   m->params / (2.0 * m->layers * m->hidden) :
			   0;

	o->deep[0] = 0;
	if (h >= 1 && h < (double)(1u << 30))
		snprintf(o->deep, sizeof(o->deep), "%u", (uint32_t)h);
}

/* Options of @policy, as arrays for kvfs_policy_new(): the --opt ones,
 * and for kvfs a `deep` from the model unless one was given.
 */
static size_t policy_opts(const struct opts *o, const char *policy,
			  const char **keys, const char **vals)
{
	bool deep = false;
	size_t n = 0;

	for (unsigned i = 0; i < o->nopt; i++)
		if (!strcmp(o->opt_pol[i], policy)) {
			keys[n] = o->opt_key[i];
			vals[n] = o->opt_val[i];
			deep |= !strcmp(keys[n], "deep");
			n++;
		}
	if (!strcmp(policy, "kvfs") && !deep && o->deep[0] && n < MAX_OPTS) {
		keys[n] = "deep";
		vals[n] = o->deep;
		n++;
	}
	return n;
}

static int run_one(const struct opts *o, struct kvfs_sim *s,
		   const char *policy, const uint64_t cap[KVFS_NTIERS],
		   struct kvfs_sim_stats *st)
{
	const char *keys[MAX_OPTS], *vals[MAX_OPTS];
	struct kvfs_sim_conf c = o->c;

	c.policy = policy;
	c.nopts = policy_opts(o, policy, keys, vals);
	c.keys = keys;
	c.vals = vals;
	memcpy(c.cap, cap, sizeof(c.cap));
	return kvfs_sim_run(s, &c, st);
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0.0;
}

/* Mean milliseconds of @s seconds over @n requests; 0 without any. */
static double mean_ms(double s, uint64_t n)
{
	return n ? 1e3 * s / (double)n : 0.0;
}

static double per(uint64_t ns, uint64_t n)
{
	return n ? (double)ns / (double)n : 0.0;
}

static void print_single(const struct opts *o, const char *policy,
			 uint64_t cap, const struct kvfs_sim_stats *st)
{
	uint64_t ev = st->evicted[KVFS_TIER_GPU];

	if (o->json) {
		printf("{\"policy\": \"%s\", \"capacity_blocks\": %" PRIu64
		       ", \"requests\": %" PRIu64 ", \"block_accesses\": %"
		       PRIu64 ", \"hit_blocks\": %" PRIu64
		       ", \"hit_ratio\": %.6f, \"evictions\": %" PRIu64
		       ", \"access_ns\": %.1f, \"evict_ns\": %.1f}\n",
		       policy, cap, st->requests, st->block_accesses,
		       st->hit_blocks, ratio(st->hit_blocks,
					     st->block_accesses),
		       ev, per(st->access_ns, st->block_accesses),
		       per(st->victim_ns, st->victim_calls));
		return;
	}
	printf("%-10s %10" PRIu64 " %9" PRIu64 " %11" PRIu64 " %11" PRIu64
	       "  %8.4f %10" PRIu64 " %9.1f %9.1f\n", policy, cap,
	       st->requests, st->block_accesses, st->hit_blocks,
	       ratio(st->hit_blocks, st->block_accesses), ev,
	       per(st->access_ns, st->block_accesses),
	       per(st->victim_ns, st->victim_calls));
}

static void print_multi(const struct opts *o, const char *policy,
			const uint64_t cap[KVFS_NTIERS],
			const struct kvfs_sim_stats *st)
{
	uint64_t adm = 0;
	double req = st->requests ? (double)st->requests : 1;

	for (int t = 0; t < KVFS_NTIERS; t++)
		adm += st->admitted[t];
	if (o->json) {
		printf("{\"policy\": \"%s\", \"gpu_blocks\": %" PRIu64
		       ", \"dram_blocks\": %" PRIu64 ", \"ssd_blocks\": %"
		       PRIu64 ", \"requests\": %" PRIu64
		       ", \"block_accesses\": %" PRIu64 ", \"hit_blocks\": %"
		       PRIu64 ", \"hit_ratio\": %.6f, \"hit_ratio_gpu\": %.6f"
		       ", \"hit_ratio_dram\": %.6f, \"hit_ratio_ssd\": %.6f"
		       ", \"loaded\": %" PRIu64 ", \"promoted\": %" PRIu64
		       ", \"demoted\": %" PRIu64 ", \"admitted\": %" PRIu64
		       ", \"admitted_dram\": %" PRIu64 ", \"admitted_ssd\": %"
		       PRIu64 ", \"refused\": %" PRIu64 ", \"discarded\": %"
		       PRIu64 ", \"orphans\": %" PRIu64 ", \"bypassed\": %"
		       PRIu64 ", \"ttft_ms\": %.3f, \"ttft_nocache_ms\": %.3f"
		       ", \"offload_s\": %.3f, \"access_ns\": %.1f"
		       ", \"evict_ns\": %.1f}\n",
		       policy, cap[0], cap[1], cap[2], st->requests,
		       st->block_accesses, st->hit_blocks,
		       ratio(st->hit_blocks, st->block_accesses),
		       ratio(st->hit_tier[0], st->block_accesses),
		       ratio(st->hit_tier[1], st->block_accesses),
		       ratio(st->hit_tier[2], st->block_accesses),
		       st->loaded, st->promoted, st->demoted, adm,
		       st->admitted[1], st->admitted[2], st->refused,
		       st->discarded, st->orphans, st->bypassed,
		       1e3 * st->ttft_s / req, 1e3 * st->ttft_nocache_s / req,
		       st->offload_s, per(st->access_ns, st->block_accesses),
		       per(st->victim_ns, st->victim_calls));
		return;
	}
	printf("%s: hit %.4f (gpu %.4f dram %.4f ssd %.4f) of %" PRIu64
	       " blocks in %" PRIu64 " requests\n", policy,
	       ratio(st->hit_blocks, st->block_accesses),
	       ratio(st->hit_tier[0], st->block_accesses),
	       ratio(st->hit_tier[1], st->block_accesses),
	       ratio(st->hit_tier[2], st->block_accesses),
	       st->block_accesses, st->requests);
	printf("  moves: loaded %" PRIu64 " promoted %" PRIu64 " demoted %"
	       PRIu64 " admitted %" PRIu64 " (dram %" PRIu64 " ssd %" PRIu64
	       ") refused %" PRIu64 " discarded %" PRIu64 " orphans %" PRIu64
	       " bypassed %" PRIu64 "\n", st->loaded, st->promoted,
	       st->demoted, adm, st->admitted[1], st->admitted[2],
	       st->refused, st->discarded, st->orphans, st->bypassed);
	printf("  ttft %.3f ms (no cache %.3f ms), offload %.3f s, "
	       "policy %.1f ns/access %.1f ns/eviction\n",
	       1e3 * st->ttft_s / req, 1e3 * st->ttft_nocache_s / req,
	       st->offload_s, per(st->access_ns, st->block_accesses),
	       per(st->victim_ns, st->victim_calls));
}

static bool have_gnuplot(void)
{
	const char *path = getenv("PATH");
	char buf[4096];

	while (path && *path) {
		const char *c = strchr(path, ':');
		size_t n = c ? (size_t)(c - path) : strlen(path);

		if (n && n + sizeof("/gnuplot") < sizeof(buf)) {
			memcpy(buf, path, n);
			strcpy(buf + n, "/gnuplot");
			if (!access(buf, X_OK))
				return true;
		}
		path = c ? c + 1 : NULL;
	}
	return false;
}

static int plot(const char *csv, const char *png, const char *const *pol,
		unsigned npol, const char *title)
{
	FILE *g;

	if (!have_gnuplot()) {
		kvfs_warn("kvfs-sim: gnuplot not found; no plot written");
		return 0;
	}
	g = popen("gnuplot", "w");
	if (!g) {
		kvfs_warn("kvfs-sim: cannot run gnuplot; no plot written");
		return 0;
	}
	fprintf(g, "set terminal png size 900,600\nset output '%s'\n"
		"set datafile separator ','\nset key bottom right\n"
		"set title \"%s\" noenhanced\nset xlabel 'capacity (%% of unique blocks)'\n"
		"set ylabel 'block hit ratio'\nset grid\nset logscale x\n"
		"plot ", png, title);
	for (unsigned i = 0; i < npol; i++)
		fprintf(g, "%s'%s' using 2:(strcol(1) eq '%s' ? $4 : 1/0) "
			"with linespoints title '%s'", i ? ", " : "", csv,
			pol[i], pol[i]);
	fputs("\n", g);
	if (pclose(g)) {
		kvfs_warn("kvfs-sim: gnuplot failed; %s may be missing", png);
		return 0;
	}
	return 0;
}

static int sweep(const struct opts *o, struct kvfs_sim *s,
		 const char *const *pol, unsigned npol)
{
	const char *prefix = o->sweep_out ? o->sweep_out : "sweep";
	const char *pts = o->points ? o->points :
			  "1,2,3,5,7.5,10,15,20,30,40,50";
	double pct[MAX_POINTS];
	unsigned npts = 0;
	char csv[4096], png[4096], *end;
	uint64_t uniq = kvfs_sim_unique_blocks(s);
	FILE *f;
	int ret = 0;

	while (*pts) {
		double v = strtod(pts, &end);

		if (end == pts || !(v > 0) || v > 100 || npts == MAX_POINTS ||
		    (*end && *end != ',')) {
			kvfs_err("kvfs-sim: bad --sweep-points near '%s'", pts);
			return -EINVAL;
		}
		pct[npts++] = v;
		pts = *end ? end + 1 : end;
	}
	snprintf(csv, sizeof(csv), "%s.csv", prefix);
	snprintf(png, sizeof(png), "%s.png", prefix);
	f = fopen(csv, "w");
	if (!f) {
		ret = -errno;
		kvfs_err("kvfs-sim: cannot create %s: %s", csv, strerror(errno));
		return ret;
	}
	fprintf(f, "policy,capacity_pct,capacity_blocks,hit_ratio,"
		"hit_blocks,block_accesses\n");
	for (unsigned i = 0; i < npol; i++)
		for (unsigned k = 0; k < npts; k++) {
			uint64_t cap[KVFS_NTIERS] = { 0 };
			struct kvfs_sim_stats st;

			cap[0] = (uint64_t)llround(pct[k] * (double)uniq / 100);
			if (!cap[0])
				cap[0] = 1;
			ret = run_one(o, s, pol[i], cap, &st);
			if (ret) {
				kvfs_err("kvfs-sim: policy %s failed (%d)",
					 pol[i], ret);
				goto out_close;
			}
			fprintf(f, "%s,%g,%" PRIu64 ",%.6f,%" PRIu64 ",%"
				PRIu64 "\n", pol[i], pct[k], cap[0],
				ratio(st.hit_blocks, st.block_accesses),
				st.hit_blocks, st.block_accesses);
			if (!o->json)
				print_single(o, pol[i], cap[0], &st);
		}
out_close:
	if (fclose(f) && !ret)
		ret = -errno;
	if (ret)
		return ret;
	printf("sweep: wrote %s\n", csv);
	return plot(csv, png, pol, npol, o->trace ? o->trace : o->gen);
}

/*
 * The fleet table: for each per-host share X of the unique blocks, the
 * block hit ratio of private caches (each routing), of one shared tier of
 * the same total size, and of both together.
 */
static int fleet(const struct opts *o, struct kvfs_sim *s, const char *pol)
{
	const char *keys[MAX_OPTS], *vals[MAX_OPTS];
	const char *p = o->fleet_pcts ? o->fleet_pcts : "1,2,5";
	uint64_t uniq = kvfs_sim_unique_blocks(s);
	struct kvfs_fleet_conf c = { .policy = pol, .keys = keys,
				     .vals = vals, .hosts = o->fleet };

	c.nopts = policy_opts(o, pol, keys, vals);
	c.model = o->c.model;
	c.sight = o->sight_ms >= 0;
	c.sight_ms = o->sight_ms >= 0 ? (uint64_t)o->sight_ms : 0;
	printf("| per host | hosts | policy | private rr | private affinity "
	       "| shared only (hosts x per host) | private + shared (rr) "
	       "| of which shared | TTFT ms, private rr "
	       "| TTFT ms, private + shared (rr) |\n"
	       "| --- | --- | --- | --- | --- | --- | --- | --- | ---: "
	       "| ---: |\n");
	while (*p) {
		char *end;
		double pct = strtod(p, &end);
		double r[4] = { 0 }, ms[4] = { 0 }, via_shared = 0;
		struct kvfs_fleet_stats st;
		uint64_t cap;
		int ret;

		if (end == p || pct <= 0 || pct > 100 ||
		    (*end && *end != ',')) {
			kvfs_err("kvfs-sim: bad --fleet-pcts '%s'", p);
			return -EINVAL;
		}
		p = *end ? end + 1 : end;
		cap = (uint64_t)llround(pct * (double)uniq / 100.0);
		cap = cap ? cap : 1;
		for (int k = 0; k < 4; k++) {
			c.route = k == 1 ? KVFS_FLEET_AFFINITY : KVFS_FLEET_RR;
			if (o->route >= 0 && k < 2 && c.route != o->route) {
				r[k] = -1;
				continue;
			}
			c.host_cap = k == 2 ? 0 : cap;
			c.shared_cap = k >= 2 ? cap * o->fleet : 0;
			ret = kvfs_sim_fleet_run(s, &c, &st);
			if (ret)
				return ret;
			r[k] = ratio(st.hit_blocks, st.block_accesses);
			ms[k] = mean_ms(st.ttft_s, st.requests);
			if (k == 3)
				via_shared = ratio(st.hit_shared,
						   st.block_accesses);
		}
		printf("| %g%% | %u | %s |", pct, o->fleet, pol);
		for (int k = 0; k < 4; k++) {
			if (r[k] < 0)
				printf(" - |");
			else
				printf(" %.1f%% |", 100 * r[k]);
		}
		printf(" %.1f%% |", 100 * via_shared);
		if (r[0] < 0)
			printf(" - |");
		else
			printf(" %.1f |", ms[0]);
		printf(" %.1f |\n", ms[3]);
		fflush(stdout);
	}
	return 0;
}

/*
 * The comparison tables: hit ratio and mean modeled TTFT of each policy
 * at each capacity (single tier), or the hit ratio of private caches
 * routed round-robin (fleet).  The best online policy of a column (not
 * belady) is in bold.
 */
static int tables(const struct opts *o, struct kvfs_sim *s,
		  const char *const *pol, unsigned npol)
{
	const char *p = o->table_pcts ? o->table_pcts : "1,2,5,10";
	uint64_t uniq = kvfs_sim_unique_blocks(s);
	double pct[MAX_POINTS], v[3][MAX_POLICIES][MAX_POINTS];
	int nm = o->fleet && o->sight_ms >= 0 ? 3 : 2;
	unsigned np = 0;

	while (*p && np < MAX_POINTS) {
		char *end;

		pct[np] = strtod(p, &end);
		if (end == p || pct[np] <= 0 || pct[np] > 100 ||
		    (*end && *end != ',')) {
			kvfs_err("kvfs-sim: bad --table-pcts '%s'", p);
			return -EINVAL;
		}
		p = *end ? end + 1 : end;
		np++;
	}
	for (unsigned i = 0; i < npol; i++) {
		const char *keys[MAX_OPTS], *vals[MAX_OPTS];
		size_t nopts = policy_opts(o, pol[i], keys, vals);

		for (unsigned k = 0; k < np; k++) {
			uint64_t cap[KVFS_NTIERS] = { 0 };
			struct kvfs_sim_stats st;
			int ret;

			cap[KVFS_TIER_GPU] =
				(uint64_t)llround(pct[k] * (double)uniq / 100.0);
			if (!cap[KVFS_TIER_GPU])
				cap[KVFS_TIER_GPU] = 1;
			if (o->fleet) {
				struct kvfs_fleet_conf c = {
					.policy = pol[i], .keys = keys,
					.vals = vals, .nopts = nopts,
					.hosts = o->fleet,
					.route = o->route >= 0 ? o->route :
								 KVFS_FLEET_RR,
					.host_cap = cap[KVFS_TIER_GPU],
				};
				struct kvfs_fleet_stats fs;

				c.model = o->c.model;
				c.sight = o->sight_ms >= 0;
				c.sight_ms = o->sight_ms >= 0 ?
					(uint64_t)o->sight_ms : 0;
				ret = kvfs_sim_fleet_run(s, &c, &fs);
				v[0][i][k] = ratio(fs.hit_blocks,
						   fs.block_accesses);
				v[1][i][k] = mean_ms(fs.ttft_s, fs.requests);
				v[2][i][k] = fs.sightings ?
					(double)fs.sight_ns /
						(double)fs.sightings :
					0;
			} else {
				ret = run_one(o, s, pol[i], cap, &st);
				v[0][i][k] = ratio(st.hit_blocks,
						   st.block_accesses);
				v[1][i][k] = mean_ms(st.ttft_s, st.requests);
			}
			if (ret) {
				kvfs_err("kvfs-sim: policy %s failed (%d)",
					 pol[i], ret);
				return ret;
			}
		}
	}
	for (int m = 0; m < nm; m++) {
		printf("\n%s%s\n\n| policy |",
		       m == 2 ? "ns per sighting heard (the policy's time in "
				"kvfs_policy_sight())" :
		       m       ? "mean TTFT, ms (lower is better)" :
				 "block hit ratio",
		       o->fleet ? ", private caches" : "");
		for (unsigned k = 0; k < np; k++)
			printf(" %g%% |", pct[k]);
		printf("\n| --- |");
		for (unsigned k = 0; k < np; k++)
			printf(" ---: |");
		printf("\n");
		for (unsigned i = 0; i < npol; i++) {
			printf("| %s |", pol[i]);
			for (unsigned k = 0; k < np; k++) {
				bool best = strcmp(pol[i], "belady") != 0;

				if (m == 2) {
					printf(" %.1f |", v[m][i][k]);
					continue;
				}
				for (unsigned j = 0; j < npol && best; j++) {
					double a = v[m][i][k], b = v[m][j][k];

					if (j == i || !strcmp(pol[j], "belady"))
						continue;
					if (m ? b < a : b > a)
						best = false;
				}
				printf(best ? " **%.4f** |" : " %.4f |",
				       m ? v[m][i][k] : v[m][i][k]);
			}
			printf("\n");
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .route = -1, .sight_ms = -1 };
	struct kvfs_trace t;
	struct kvfs_sim *s = NULL;
	const char *pol[MAX_POLICIES];
	unsigned npol = 0;
	int ret;

	kvfs_trace_gen_defaults(&o.g);
	kvfs_sim_model_default(&o.c.model);
	o.c.promote_every = 1;
	o.c.promote_max = 64;
	ret = parse_args(&o, argc, argv);
	if (ret)
		goto out_opts;
	if (o.req_out) {
		if (o.fleet) {
			kvfs_err("kvfs-sim: --requests-out is not for --fleet");
			ret = -EINVAL;
			goto out_opts;
		}
		o.c.req_out = fopen(o.req_out, "w");
		if (!o.c.req_out) {
			ret = -errno;
			kvfs_err("kvfs-sim: %s: %s", o.req_out, strerror(-ret));
			goto out_opts;
		}
		fputs("policy,capacity_blocks,request,blocks,hit_blocks,"
		      "tokens,hit_tokens,ttft_ms\n", o.c.req_out);
	}
	model_deep(&o);
	if (o.gen) {
		if (o.block_tokens)
			o.g.block_tokens = o.block_tokens;
		if (!strcmp(o.gen, "fewshot"))
			ret = kvfs_trace_gen_fewshot(&o.g, &t);
		else if (!strcmp(o.gen, "chat"))
			ret = kvfs_trace_gen_chat(&o.g, &t);
		else if (!strcmp(o.gen, "agent"))
			ret = kvfs_trace_gen_agent(&o.g, &t);
		else
			ret = kvfs_trace_gen_zipf_docqa(&o.g, &t);
		if (ret)
			goto out_opts;
		if (o.gen_out) {
			ret = kvfs_trace_write(&t, o.gen_out);
			if (ret)
				goto out_trace;
			fprintf(stderr, "kvfs-sim: wrote %zu requests to %s\n",
				t.nreq, o.gen_out);
		}
	} else {
		kvfs_trace_init(&t, o.format, o.block_tokens);
		ret = kvfs_trace_load(&t, o.trace);
		if (ret)
			goto out_trace;
		if (t.bad_lines)
			fprintf(stderr, "kvfs-sim: %zu of %zu lines were bad "
				"and skipped\n", t.bad_lines, t.lines);
	}
	ret = kvfs_sim_new(&t, &s);
	if (ret)
		goto out_trace;
	fprintf(stderr, "kvfs-sim: %" PRIu64 " requests, %zu block accesses,"
		" %" PRIu64 " unique blocks of %u tokens\n",
		kvfs_sim_requests(s), t.nhash, kvfs_sim_unique_blocks(s),
		t.block_tokens);
	kvfs_trace_release(&t);
	if (o.npolicy) {
		memcpy(pol, o.policy, o.npolicy * sizeof(*pol));
		npol = o.npolicy;
	} else {
		for (size_t i = 0; kvfs_policy_registry[i] &&
				   npol < MAX_POLICIES; i++)
			pol[npol++] = kvfs_policy_registry[i]->name;
	}
	if (o.sweep) {
		ret = sweep(&o, s, pol, npol);
		goto out_sim;
	}
	if (o.tables) {
		ret = tables(&o, s, pol, npol);
		goto out_sim;
	}
	if (o.fleet) {
		ret = fleet(&o, s, o.npolicy ? pol[0] : "lru");
		goto out_sim;
	}
	if (o.capacity_pct && !o.capacity) {
		o.capacity = (uint64_t)llround(o.capacity_pct *
			(double)kvfs_sim_unique_blocks(s) / 100.0);
		if (!o.capacity)
			o.capacity = 1;
	}
	if (!o.multi && !o.capacity) {
		if (!o.gen_out) {
			kvfs_err("kvfs-sim: no capacity given (--capacity-"
				 "blocks, --gpu-blocks..., or --sweep)");
			ret = -EINVAL;
		}
		goto out_sim;
	}
	if (!o.multi)
		o.tier[KVFS_TIER_GPU] = o.capacity;
	if (!o.json && !o.multi)
		printf("%-10s %10s %9s %11s %11s  %8s %10s %9s %9s\n",
		       "policy", "capacity", "requests", "accesses", "hits",
		       "ratio", "evictions", "ns/acc", "ns/evict");
	for (unsigned i = 0; i < npol; i++) {
		struct kvfs_sim_stats st;

		ret = run_one(&o, s, pol[i], o.tier, &st);
		if (ret) {
			kvfs_err("kvfs-sim: policy %s failed (%d)", pol[i],
				 ret);
			if (o.npolicy)
				goto out_sim;
			ret = 0; /* running "every policy": skip it */
			continue;
		}
		if (o.multi)
			print_multi(&o, pol[i], o.tier, &st);
		else
			print_single(&o, pol[i], o.capacity, &st);
		fflush(stdout);
	}
	goto out_sim;

out_trace:
	kvfs_trace_release(&t);
out_sim:
	kvfs_sim_free(s);
out_opts:
	/* A short write (a full disk) fails the run, not only the file. */
	if (o.c.req_out &&
	    (ferror(o.c.req_out) | fclose(o.c.req_out)) && !ret) {
		kvfs_err("kvfs-sim: %s: could not write it whole", o.req_out);
		ret = -EIO;
	}
	for (unsigned i = 0; i < o.nopt; i++) {
		free(o.opt_pol[i]);
		free(o.opt_key[i]);
		free(o.opt_val[i]);
	}
	return ret ? 1 : 0;
}
