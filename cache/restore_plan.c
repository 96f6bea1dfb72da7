/* SPDX-License-Identifier: MIT */
/*
 * Start-up and shutdown of hidden-state restoration (cache/rpool_i.h):
 * each namespace's checkpoint, its start-up profile (paper 003 §4.1), its
 * device restorer, the bubble-free plans and the split HIDDEN writes are
 * stored with; and the stats lines that report them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/rpool_i.h"
#include "gpu/restore_cuda.h"
#include "meta/log.h"
#include "meta/util.h"

/* Start-up profile: samples per figure, the median is used. */
#define PROF_REPS 5

/* ------------------------------------------------------------- profiling */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[n / 2];
}

static double secs_since(uint64_t t0)
{
	return (double)(kvfs_util_now_mono() - t0) * 1e-9;
}

/* Median seconds of a DRAM load of @len bytes: a memcpy, as a restore
 * from DRAM reads its source.
 */
static double prof_dram(uint8_t *dst, const uint8_t *src, uint64_t len)
{
	double t[PROF_REPS];

	memcpy(dst, src, len); /* fault the pages in */
	for (int i = 0; i < PROF_REPS; i++) {
		uint64_t t0 = kvfs_util_now_mono();

		memcpy(dst, src, len);
		t[i] = secs_since(t0);
	}
	return median(t, PROF_REPS);
}

/* Median seconds of an O_DIRECT read of @len bytes from the data file
 * (read only; whatever the bytes are), at offsets that move on so that
 * no sample repeats another's range.  -1 if the file cannot be read.
 */
static double prof_ssd(struct kvfs_cache *c, int fd, uint8_t *buf, uint64_t len,
		       uint64_t *cursor)
{
	uint64_t base = c->store->sb.data_off;
	uint64_t span = c->store->sb.ssd_size - base;
	double t[PROF_REPS];

	len = kvfs_util_align_up(len, KVFS_FMT_ALIGN);
	if (span < len)
		return -1;
	for (int i = 0; i < PROF_REPS; i++) {
		uint64_t off;

		if (*cursor + len > span)
			*cursor = 0;
		off = base + *cursor;
		*cursor += len;
		uint64_t t0 = kvfs_util_now_mono();
		ssize_t n = pread(fd, buf, len, (off_t)off);

		if (n != (ssize_t)len)
			return -1;
		t[i] = secs_since(t0);
	}
	return median(t, PROF_REPS);
}

static const char *mode_name(int mode)
{
	switch (mode) {
	case KVFS_HSCHED_MODE_HIDDEN_ONLY:
		return "hidden-only";
	case KVFS_HSCHED_MODE_HIDDEN_KV:
		return "hidden+kv";
	case KVFS_HSCHED_MODE_HIDDEN_RECOMPUTE:
		return "hidden+recompute";
	case KVFS_HSCHED_MODE_KV_ONLY:
		return "kv-only";
	case KVFS_HSCHED_MODE_RECOMPUTE_ONLY:
		return "recompute-only";
	}
	return "none";
}

/*
 * Per-layer times for a full block of @ns (paper 003 §4.1): loading its
 * hidden states and its KV from DRAM and from the SSD, and projecting it.
 * There is no model runner, so token recomputation is left out (C_Token =
 * 0) and the plans never recompute.
 */
static int hc_profile(struct kvfs_cache *c, struct kvfs_ns *ns,
		      struct kvfs_restore_ws *ws)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	const struct kvfs_restore_model *m = kvfs_restore_model(hc->rst);
	const struct kvfs_geom *g = &ns->geom;
	uint32_t T = g->block_tokens, C = g->chunk_tokens;
	uint64_t hb = kvfs_restore_hidden_layer_bytes(m, T, C, g->dtype);
	uint64_t kb = kvfs_restore_kv_layer_bytes(m, T, C, g->dtype);
	uint64_t rows = (uint64_t)(T + C - 1) / C * C, cursor = 0;
	uint64_t len = kvfs_util_align_up(hb > kb ? hb : kb, KVFS_FMT_ALIGN);
	uint8_t *x = NULL, *y = NULL;
	float *xf = NULL;
	double t[PROF_REPS];
	int fd, rc = -ENOMEM;

	if (!hb || !kb)
		return -EINVAL;
	x = aligned_alloc(KVFS_FMT_ALIGN, len);
	y = aligned_alloc(KVFS_FMT_ALIGN, len);
	xf = malloc(rows * g->hidden_size * sizeof(*xf));
	if (!x || !y || !xf)
		goto out_free;
	memset(x, 0, len);
	/* Synthetic hidden states of the order of real ones. */
	for (uint64_t i = 0; i < rows * g->hidden_size; i++)
		xf[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 500.0f;
	rc = kvfs_restore_from_f32(xf, g->dtype, x, rows * g->hidden_size);
	if (rc)
		goto out_free;
	memset(&hc->prof, 0, sizeof(hc->prof));
	hc->prof.io_hidden[KVFS_TIER_DRAM] = prof_dram(y, x, hb);
	hc->prof.io_kv[KVFS_TIER_DRAM] = prof_dram(y, x, kb);

	/* The projection; the first call also grows the workspace. */
	rc = kvfs_restore_layer(hc->rst, ws, 0, x, g->dtype, 0, T, C, y,
				g->dtype);
	for (int i = 0; i < PROF_REPS && !rc; i++) {
		uint64_t t0 = kvfs_util_now_mono();

		rc = kvfs_restore_layer(hc->rst, ws, (uint32_t)i % g->n_layers,
					x, g->dtype, 0, T, C, y, g->dtype);
		t[i] = secs_since(t0);
	}
	if (rc)
		goto out_free;
	hc->prof.c_hidden = median(t, PROF_REPS);
	hc->prof.c_token = 0;

	fd = open(c->store->data_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd >= 0) {
		double ih = prof_ssd(c, fd, y, hb, &cursor);
		double ik = prof_ssd(c, fd, y, kb, &cursor);

		close(fd);
		if (ih >= 0 && ik >= 0) {
			hc->prof.io_hidden[KVFS_TIER_SSD] = ih;
			hc->prof.io_kv[KVFS_TIER_SSD] = ik;
			hc->ssd_profiled = true;
		}
	}
	if (!hc->ssd_profiled)
		kvfs_warn("ns %s: hcache: the SSD could not be profiled "
			  "(O_DIRECT read of %s failed): no SSD plan",
			  ns->rec.name, c->store->data_path);
	hc->profiled = true;
	kvfs_info("ns %s: hcache profile per layer of a %u-token block: "
		  "DRAM hidden %.1f us, KV %.1f us; SSD hidden %.1f us, KV "
		  "%.1f us; projection on the CPU %.1f us; token "
		  "recomputation: no model runner, left out",
		  ns->rec.name, T, hc->prof.io_hidden[KVFS_TIER_DRAM] * 1e6,
		  hc->prof.io_kv[KVFS_TIER_DRAM] * 1e6,
		  hc->prof.io_hidden[KVFS_TIER_SSD] * 1e6,
		  hc->prof.io_kv[KVFS_TIER_SSD] * 1e6, hc->prof.c_hidden * 1e6);
out_free:
	free(x);
	free(y);
	free(xf);
	return rc;
}

/*
 * The bubble-free plans of @ns for blocks read from DRAM and from the SSD
 * (paper 003 §4.1), from the start-up profile.  C_H is the projection
 * time of whoever restores: the GPU's (kvfs_restore_cuda_profile(), taken
 * by hc_dev_init()) when the namespace has a GPU restorer that could be
 * profiled, else the CPU's.  The I/O figures are the host's either way.
 */
static int hc_plan(struct kvfs_ns *ns)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	const struct kvfs_geom *g = &ns->geom;
	struct kvfs_hsched_profile p;
	int rc;

	if (!hc->profiled)
		return 0;
	p = hc->prof;
	hc->plan_gpu = hc->rc && hc->gpu_profiled;
	if (hc->plan_gpu)
		p.c_hidden = hc->gpu_compute;
	rc = kvfs_hsched_plan(&p, KVFS_TIER_DRAM, g->n_layers,
			      &hc->plan[KVFS_TIER_DRAM]);
	if (!rc && hc->ssd_profiled)
		rc = kvfs_hsched_plan(&p, KVFS_TIER_SSD, g->n_layers,
				      &hc->plan[KVFS_TIER_SSD]);
	if (rc) {
		kvfs_warn("ns %s: hcache: no plan (%s)", ns->rec.name,
			  strerror(-rc));
		return 0;
	}
	hc->planned = true;
	if (hc->plan_gpu)
		kvfs_info("ns %s: hcache plans use the GPU's projection time, "
			  "%.1f us per layer (the CPU's: %.1f us): the GPU "
			  "restores reads, FETCH and restorations ahead of "
			  "need",
			  ns->rec.name, p.c_hidden * 1e6,
			  hc->prof.c_hidden * 1e6);
	else
		kvfs_info("ns %s: hcache plans use the CPU's projection time, "
			  "%.1f us per layer (%s)",
			  ns->rec.name, p.c_hidden * 1e6,
			  hc->rc ? "the GPU restorer could not be profiled" :
				   "no GPU restorer");
	for (int tier = KVFS_TIER_DRAM; tier <= KVFS_TIER_SSD; tier++) {
		const struct kvfs_hsched_plan *pl = &hc->plan[tier];

		if (tier == KVFS_TIER_SSD && !hc->ssd_profiled)
			continue;
		kvfs_info("ns %s: hcache plan for blocks read from %s: %s, "
			  "%u hidden + %u KV + %u recomputed layers, "
			  "predicted %.1f us (I/O %.1f, compute %.1f)",
			  ns->rec.name, kvfs_tier_name(tier),
			  mode_name(pl->mode), pl->n_hidden, pl->n_kv,
			  pl->n_recompute, pl->t_total * 1e6, pl->t_io * 1e6,
			  pl->t_compute * 1e6);
	}
	return 0;
}

/*
 * The split HIDDEN writes to @ns are stored with, from its store_as, the
 * SSD plan and hcache_kv_layers (@cn).  store_as = auto follows the plan
 * of the SSD, where blocks live for the long term: its hidden layers stay
 * hidden states, its KV layers are stored only as K and V.
 */
static int hc_decide(struct kvfs_ns *ns, const struct kvfs_ns_params *cn)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	const struct kvfs_geom *g = &ns->geom;
	uint32_t n = g->n_layers, kv = 2 * g->n_kv_heads * g->head_dim;
	bool smaller = kvfs_hsched_hidden_smaller(g->hidden_size, g->n_kv_heads,
						  g->head_dim);
	bool ssd = hc->planned && hc->ssd_profiled;
	const char *why;
	int rc;

	switch (ns->rec.store_as) {
	case KVFS_STORE_KV:
		hc->kv_from = 0;
		return 0;
	case KVFS_STORE_HIDDEN:
		hc->kv_from = n;
		if (!smaller)
			kvfs_warn("ns %s: store_as = hidden although hidden "
				  "states (%u per token) are not smaller than "
				  "K+V (%u): they take more room",
				  ns->rec.name, g->hidden_size, kv);
		return 0;
	case KVFS_STORE_AUTO:
		break;
	default:
		kvfs_err("ns %s: unknown store_as %u in the namespace record",
			 ns->rec.name, ns->rec.store_as);
		return -EUCLEAN;
	}
	if (cn->hc.kv_layers != KVFS_PARAMS_KV_LAYERS_SCHED && smaller &&
	    cn->hc.kv_layers <= n) {
		/* fs/conf.c checked the bounds and the sizes. */
		hc->kv_from = n - cn->hc.kv_layers;
		hc->kv_fixed = true;
		why = "hcache_kv_layers";
	} else {
		rc = kvfs_hsched_split_auto(
			g->hidden_size, g->n_kv_heads, g->head_dim,
			ssd ? &hc->plan[KVFS_TIER_SSD] : NULL, n, &hc->kv_from);
		if (rc)
			return rc;
		why = !ssd	   ? "no SSD plan" :
		      hc->plan_gpu ? "SSD plan, GPU projection time" :
				     "SSD plan, CPU projection time";
	}
	if (!smaller)
		kvfs_info("ns %s: store_as = auto: hidden states (%u per "
			  "token) are not smaller than K+V (%u): HIDDEN writes "
			  "are stored as KV",
			  ns->rec.name, g->hidden_size, kv);
	else if (!hc->kv_from)
		kvfs_info("ns %s: store_as = auto keeps layers 0..%u as KV "
			  "(%s)",
			  ns->rec.name, n - 1, why);
	else if (hc->kv_from == n)
		kvfs_info("ns %s: store_as = auto keeps layers 0..%u as hidden "
			  "states (%s)",
			  ns->rec.name, n - 1, why);
	else
		kvfs_info("ns %s: store_as = auto keeps layers 0..%u as hidden "
			  "states, %u..%u as KV (%s)",
			  ns->rec.name, hc->kv_from - 1, hc->kv_from, n - 1,
			  why);
	return 0;
}

static const struct kvfs_ns_params *conf_ns(struct kvfs_cache *c,
					    const char *name)
{
	for (size_t i = 0; i < c->conf.n_ns; i++)
		if (!strcmp(c->conf.ns[i].name, name))
			return &c->conf.ns[i];
	return NULL;
}

static int hc_load(struct kvfs_cache *c, struct kvfs_ns *ns,
		   const struct kvfs_ns_params *cn, struct kvfs_restore_ws *ws)
{
	struct kvfs_restore_model m = {
		.family = cn->hc.family,
		.n_layers = ns->geom.n_layers,
		.hidden_size = ns->geom.hidden_size,
		.n_kv_heads = ns->geom.n_kv_heads,
		.head_dim = ns->geom.head_dim,
		.rms_norm_eps = cn->hc.rms_norm_eps,
		.rope_theta = cn->hc.rope_theta,
		.rope_type = cn->hc.rope_type,
		.rope_factor = cn->hc.rope_factor,
		.rope_low_freq_factor = cn->hc.rope_low_freq_factor,
		.rope_high_freq_factor = cn->hc.rope_high_freq_factor,
		.rope_orig_max_pos = cn->hc.rope_orig_max_pos,
	};
	int rc;

	rc = kvfs_restore_model_check(&m);
	if (!rc)
		rc = kvfs_restore_load(&m, cn->hc.weights, 0, &ns->hc.rst);
	if (rc) {
		kvfs_err("namespace %s: checkpoint %s refused (%s; the line "
			 "above names the tensor): not starting",
			 ns->rec.name, cn->hc.weights, strerror(-rc));
		return rc;
	}
	kvfs_info("namespace %s: checkpoint %s loaded for hidden-state "
		  "restoration (%" PRIu64 " bytes of converted weights)",
		  ns->rec.name, cn->hc.weights,
		  kvfs_restore_mem_bytes(ns->hc.rst));
	rc = hc_profile(c, ns, ws);
	if (rc)
		kvfs_warn("ns %s: hcache profiling failed (%s): no plan",
			  ns->rec.name, strerror(-rc));
	return 0;
}

/*
 * The device restorer of @ns ([tier.gpu] restore): the GPU with the cuda
 * backend when it can start (restore = gpu refuses the start otherwise,
 * auto falls back to the CPU, saying why), the CPU into the pool
 * otherwise.  Without a device tier there is none.  A GPU restorer also
 * serves the restoration jobs, and its profile feeds hc_plan().
 */
static int hc_dev_init(struct kvfs_cache *c, struct kvfs_ns *ns)
{
	struct kvfs_hc_ns *hc = &ns->hc;
	struct kvfs_restore_cuda_prof p;
	int want = c->conf.gpu_restore, rc;

	hc->dev = KVFS_HC_DEV_NONE;
	if (!c->tier[KVFS_TIER_GPU] || !c->gops)
		return 0;
	if (c->conf.gpu_backend != KVFS_PARAMS_GPU_CUDA ||
	    want == KVFS_PARAMS_RESTORE_CPU) {
		hc->dev = KVFS_HC_DEV_CPU;
		kvfs_info("ns %s: blocks stored as hidden states are restored "
			  "on the CPU straight into the device pool when it "
			  "loads them ([tier.gpu] restore = %s)",
			  ns->rec.name,
			  want == KVFS_PARAMS_RESTORE_CPU ? "cpu" : "auto");
		return 0;
	}
	rc = kvfs_restore_cuda_init(hc->rst, (int)c->conf.gpu_device,
				    c->conf.gpu_restore_weights ==
						    KVFS_PARAMS_RWEIGHTS_BF16 ?
					    KVFS_RESTORE_CUDA_BF16 :
					    0,
				    &hc->rc);
	if (rc) {
		hc->rc = NULL;
		if (want == KVFS_PARAMS_RESTORE_GPU) {
			kvfs_err("ns %s: [tier.gpu] restore = gpu, but GPU "
				 "restoration cannot start on CUDA device %u "
				 "(%s): refusing to start",
				 ns->rec.name, c->conf.gpu_device,
				 strerror(-rc));
			return rc;
		}
		hc->dev = KVFS_HC_DEV_CPU;
		kvfs_warn("ns %s: [tier.gpu] restore = auto: GPU restoration "
			  "cannot start on CUDA device %u (%s): blocks stored "
			  "as hidden states are restored on the CPU and "
			  "uploaded",
			  ns->rec.name, c->conf.gpu_device, strerror(-rc));
		return 0;
	}
	hc->dev = KVFS_HC_DEV_GPU;
	kvfs_info(
		"ns %s: blocks stored as hidden states are restored on "
		"CUDA device %u straight into the device pool, and into "
		"host memory for reads and restorations ahead of need (%" PRIu64
		" bytes of weights there)",
		ns->rec.name, c->conf.gpu_device,
		kvfs_restore_cuda_mem_bytes(hc->rc));
	rc = kvfs_restore_cuda_profile(hc->rc, ns->geom.block_tokens,
				       ns->geom.dtype, &p);
	if (rc) {
		kvfs_warn("ns %s: hcache: the GPU could not be profiled (%s)",
			  ns->rec.name, strerror(-rc));
		return 0;
	}
	hc->gpu_profiled = true;
	hc->gpu_compute = p.compute;
	hc->gpu_h2d_hidden = p.h2d_hidden;
	hc->gpu_h2d_kv = p.h2d_kv;
	kvfs_info("ns %s: hcache GPU profile per layer of a %u-token block: "
		  "projection %.1f us (GEMM %.1f), H2D hidden %.1f us, KV "
		  "%.1f us",
		  ns->rec.name, ns->geom.block_tokens, p.compute * 1e6,
		  p.gemm * 1e6, p.h2d_hidden * 1e6, p.h2d_kv * 1e6);
	return 0;
}

/* ---------------------------------------------------------- lifecycle */

int kvfs_rpool_start(struct kvfs_cache *c)
{
	struct kvfs_restore_ws *ws = NULL;
	struct kvfs_rpool *rp;
	unsigned want = 0;
	int rc = 0;

	rp = calloc(1, sizeof(*rp));
	if (!rp)
		return -ENOMEM;
	pthread_mutex_init(&rp->lock, NULL);
	pthread_cond_init(&rp->work, NULL);
	pthread_cond_init(&rp->done, NULL);
	c->rpool = rp;
	rc = kvfs_restore_ws_alloc(&ws);
	if (rc)
		return rc;
	for (size_t i = 0; i < c->n_ns && !rc; i++) {
		struct kvfs_ns *ns = &c->ns[i];
		const struct kvfs_ns_params *cn = conf_ns(c, ns->rec.name);

		if (!cn || !cn->hc.weights[0])
			continue;
		/* The device restorer first: its profile feeds the plans,
		 * and the plans the split HIDDEN writes are stored with.
		 */
		rc = hc_load(c, ns, cn, ws);
		if (!rc)
			rc = hc_dev_init(c, ns);
		if (!rc)
			rc = hc_plan(ns);
		if (!rc)
			rc = hc_decide(ns, cn);
		want = KVFS_RPOOL_THREADS;
	}
	kvfs_restore_ws_free(ws);
	if (rc || !want || (c->flags & KVFS_CACHE_NOTHREADS))
		return rc;
	return kvfs_rpool_threads_start(c, want);
}

void kvfs_rpool_free(struct kvfs_cache *c)
{
	struct kvfs_rpool *rp = c->rpool;

	if (rp) {
		kvfs_rpool_stop(c);
		pthread_mutex_destroy(&rp->lock);
		pthread_cond_destroy(&rp->work);
		pthread_cond_destroy(&rp->done);
		kvfs_restore_ws_free(rp->dev_ws);
		free(rp);
		c->rpool = NULL;
	}
	for (size_t i = 0; i < c->n_ns; i++) {
		kvfs_restore_cuda_free(c->ns[i].hc.rc);
		c->ns[i].hc.rc = NULL;
		kvfs_restore_free(c->ns[i].hc.rst);
		c->ns[i].hc.rst = NULL;
	}
}

/* ---------------------------------------------------------------- stats */

static const char *const store_names[] = { "kv", "hidden", "auto" };

void kvfs_rpool_stats(struct kvfs_cache *c, FILE *f)
{
	uint64_t stored = atomic_load(&c->st_hidden_stored);
	uint64_t kv = atomic_load(&c->st_hidden_kv);

#define CS(k, v) fprintf(f, "%s %" PRIu64 "\n", k, (uint64_t)(v))
	CS("cache.hidden_blocks", atomic_load(&c->st_hidden_blocks));
	CS("cache.mixed_blocks", atomic_load(&c->st_mixed_blocks));
	CS("cache.hidden_stored_bytes", stored);
	CS("cache.hidden_kv_bytes", kv);
	fprintf(f, "cache.hidden_bytes_saved %" PRId64 "\n",
		(int64_t)(kv - stored));
	CS("restore.blocks", atomic_load(&c->st_restores));
	CS("restore.ns_total", atomic_load(&c->st_restore_ns));
	CS("restore.waits", atomic_load(&c->st_restore_waits));
	CS("restore.joined", atomic_load(&c->st_restore_joined));
	CS("restore.ahead", atomic_load(&c->st_restore_ahead));
	CS("restore.private", atomic_load(&c->st_restore_private));
	CS("restore.from_pool", atomic_load(&c->st_restore_from_pool));
	CS("restore.errors", atomic_load(&c->st_restore_errors));
	CS("restore.commit_conversions", atomic_load(&c->st_converted));
	CS("restore.commit_splits", atomic_load(&c->st_splits));
	CS("restore.pipelined", atomic_load(&c->st_pipelined));
	CS("restore.to_device", atomic_load(&c->st_restore_dev));
	CS("restore.to_device_gpu", atomic_load(&c->st_restore_gpu));
	CS("restore.to_device_fallbacks",
	   atomic_load(&c->st_restore_dev_fallback));
	CS("restore.gpu_blocks", atomic_load(&c->st_restore_gpu_blocks));
	CS("restore.gpu_fallbacks", atomic_load(&c->st_restore_gpu_fallbacks));
	CS("restore.threads", c->rpool ? c->rpool->n_threads : 0);
#undef CS
	for (size_t i = 0; i < c->n_ns; i++) {
		struct kvfs_ns *ns = &c->ns[i];
		struct kvfs_hc_ns *hc = &ns->hc;
		const char *nm = ns->rec.name;

		if (!hc->rst && !atomic_load(&hc->hidden_blocks))
			continue;
#define NS(k, fmt, v) fprintf(f, "ns.%s.hcache.%s " fmt "\n", nm, k, v)
		NS("store_as", "%s",
		   ns->rec.store_as <= KVFS_STORE_AUTO ?
			   store_names[ns->rec.store_as] :
			   "unknown");
		NS("hidden_writes_kept_as", "%s",
		   hc->kv_from == ns->geom.n_layers ? "hidden" :
		   hc->kv_from			    ? "mixed" :
						      "kv");
		NS("kv_from", "%u", hc->kv_from);
		NS("kv_from_source", "%s",
		   ns->rec.store_as != KVFS_STORE_AUTO ? "store_as" :
		   hc->kv_fixed			       ? "hcache_kv_layers" :
		   hc->planned && hc->ssd_profiled     ? "ssd_plan" :
							 "no_plan");
		NS("weights", "%d", hc->rst ? 1 : 0);
		NS("hidden_blocks", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->hidden_blocks));
		NS("restored", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->restored));
		NS("mixed_blocks", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->mixed_blocks));
		NS("converted", "%" PRIu64,
		   (uint64_t)atomic_load(&hc->converted));
		NS("split", "%" PRIu64, (uint64_t)atomic_load(&hc->splits));
		NS("device_restore", "%s",
		   hc->dev == KVFS_HC_DEV_GPU ? "gpu" :
		   hc->dev == KVFS_HC_DEV_CPU ? "cpu" :
						"none");
		if (hc->gpu_profiled) {
			NS("profile.gpu.compute_ns", "%" PRIu64,
			   (uint64_t)llround(hc->gpu_compute * 1e9));
			NS("profile.gpu.h2d_hidden_ns", "%" PRIu64,
			   (uint64_t)llround(hc->gpu_h2d_hidden * 1e9));
			NS("profile.gpu.h2d_kv_ns", "%" PRIu64,
			   (uint64_t)llround(hc->gpu_h2d_kv * 1e9));
		}
		if (!hc->planned)
			continue;
		NS("profile.compute_ns", "%" PRIu64,
		   (uint64_t)llround(hc->prof.c_hidden * 1e9));
		NS("plan.compute", "%s", hc->plan_gpu ? "gpu" : "cpu");
		NS("profile.recompute", "%s", "none");
		for (int t = KVFS_TIER_DRAM; t <= KVFS_TIER_SSD; t++) {
			const struct kvfs_hsched_plan *p = &hc->plan[t];
			const char *tn = kvfs_tier_name(t);

			if (t == KVFS_TIER_SSD && !hc->ssd_profiled)
				continue;
#define TS(a, b, fmt, v) \
	fprintf(f, "ns.%s.hcache.%s.%s.%s " fmt "\n", nm, a, tn, b, v)
			TS("profile", "io_hidden_ns", "%" PRIu64,
			   (uint64_t)llround(hc->prof.io_hidden[t] * 1e9));
			TS("profile", "io_kv_ns", "%" PRIu64,
			   (uint64_t)llround(hc->prof.io_kv[t] * 1e9));
			TS("plan", "mode", "%s", mode_name(p->mode));
			TS("plan", "hidden_layers", "%u", p->n_hidden);
			TS("plan", "kv_layers", "%u", p->n_kv);
			TS("plan", "recompute_layers", "%u", p->n_recompute);
			TS("plan", "t_total_ns", "%" PRIu64,
			   (uint64_t)llround(p->t_total * 1e9));
#undef TS
		}
#undef NS
	}
}
