// SPDX-License-Identifier: MIT
/*
 * kvfs-sim's workload generators (sim/trace.h): synthetic traces built
 * into a bailian-format struct kvfs_trace, deterministic for a seed.
 * zipf-docqa and fewshot follow the setups of papers 002 and 000; chat
 * is a multi-turn conversation service shaped by the figures "KVCache
 * Cache in the Wild" reports for its to-C trace; agent is a tool-and-agent
 * service shaped by what Mooncake's FAST'25 paper reports of its tool&agent
 * trace (docs/policies.md, "Generators").
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sim/trace.h"
#include "meta/log.h"

struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double rng_unit(struct rng *r)
{
	return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform in [lo, hi]. */
static uint32_t rng_range(struct rng *r, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rng_next(r) % ((uint64_t)hi - lo + 1));
}

static void rng_shuffle(struct rng *r, uint32_t *a, uint32_t n)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t k = (uint32_t)(rng_next(r) % i), x = a[i - 1];

		a[i - 1] = a[k];
		a[k] = x;
	}
}

/* Cumulative Zipf weights k^-alpha, k = 1..n, normalised. */
static double *zipf_cdf(uint32_t n, double alpha)
{
	double *c = malloc(n * sizeof(*c)), sum = 0;

	if (!c)
		return NULL;
	for (uint32_t k = 0; k < n; k++) {
		sum += pow((double)(k + 1), -alpha);
		c[k] = sum;
	}
	for (uint32_t k = 0; k < n; k++)
		c[k] /= sum;
	return c;
}

static uint32_t zipf_draw(const double *cdf, uint32_t n, struct rng *r)
{
	double u = rng_unit(r);
	uint32_t lo = 0, hi = n - 1;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void kvfs_trace_gen_defaults(struct kvfs_trace_gen *g)
{
	memset(g, 0, sizeof(*g));
	g->seed = 42;
	g->requests = 0; /* per generator: 3072 docqa, 14042 fewshot, 20000
			  * chat, 23608 agent
			  */
	g->block_tokens = 16;
	g->docs = 381;
	g->questions = 2;
	g->doc_min = 3000;
	g->doc_max = 7000;
	g->q_min = 20;
	g->q_max = 60;
	g->window = 512;
	g->alpha = 1.0;
	g->subjects = 57;
	g->subject_alpha = 0.8;
	g->shot_min = 300;
	g->shot_max = 700;
	g->fq_min = 40;
	g->fq_max = 160;
	g->users = 2000;
	g->user_alpha = 0.9;
	g->sys_min = 200;
	g->sys_max = 2000;
	g->msg_median = 150;
	g->out_median = 250;
	g->next_first = 0.5;
	g->next_later = 0.8;
	g->think_ms = 60000;
	g->session_ms = 333;
	g->max_turns = 232;
	g->max_context = 131072;
	g->agents = 5000;
	g->agent_alpha = 0.9;
	g->prompt_min = 1000;
	g->prompt_max = 9000;
	g->task_median = 2500;
	g->tool_median = 600;
	g->reply_median = 150;
	g->next_step = 0.3;
	g->step_ms = 3000;
	g->step_min_ms = 500;
	g->max_steps = 64;
}

/*
 * Emit a prompt made of a shared part of @shared tokens (its full blocks
 * have ids @shared_base + b) and a private tail of @tail tokens (ids
 * from *@next on, unless @tail_base is given: then @tail_base + b').
 */
static int gen_prompt(struct kvfs_trace *t, struct kvfs_trace_req *r,
		      int64_t *buf, uint32_t bt, uint32_t shared,
		      int64_t shared_base, uint32_t tail, int64_t tail_base,
		      int64_t *next)
{
	uint32_t total = shared + tail, nb = (total + bt - 1) / bt;
	uint32_t full_shared = shared / bt;

	for (uint32_t b = 0; b < nb; b++) {
		if (b < full_shared)
			buf[b] = shared_base + b;
		else if (tail_base >= 0)
			buf[b] = tail_base + (b - full_shared);
		else
			buf[b] = (*next)++;
	}
	r->input_len = total;
	return kvfs_trace_add(t, r, buf, nb, "text");
}

static bool gen_check(const struct kvfs_trace_gen *g, uint32_t lo, uint32_t hi)
{
	return g->block_tokens && lo && lo <= hi && hi <= (1u << 24);
}

int kvfs_trace_gen_zipf_docqa(const struct kvfs_trace_gen *g,
			      struct kvfs_trace *t)
{
	uint32_t n = g->requests ? g->requests : 3072, bt = g->block_tokens;
	uint32_t *doc_len = NULL, *q_len = NULL, *perm = NULL;
	int64_t *doc_base = NULL, *q_base = NULL, *buf = NULL, next = 0;
	double *cdf = NULL;
	struct rng r = { g->seed };
	int ret = -ENOMEM;

	if (!gen_check(g, g->doc_min, g->doc_max) ||
	    !gen_check(g, g->q_min, g->q_max) || !g->docs || !g->questions ||
	    !g->window || g->alpha < 0 || g->docs > (1u << 20) ||
	    g->questions > 1024) {
		kvfs_err("gen zipf-docqa: bad parameters");
		return -EINVAL;
	}
	kvfs_trace_init(t, KVFS_TRACE_BAILIAN, bt);
	doc_len = calloc(g->docs, sizeof(*doc_len));
	doc_base = calloc(g->docs, sizeof(*doc_base));
	q_len = calloc((size_t)g->docs * g->questions, sizeof(*q_len));
	q_base = calloc((size_t)g->docs * g->questions, sizeof(*q_base));
	perm = calloc(g->docs, sizeof(*perm));
	buf = calloc((g->doc_max + g->q_max) / bt + 2, sizeof(*buf));
	cdf = zipf_cdf(g->docs, g->alpha);
	if (!doc_len || !doc_base || !q_len || !q_base || !perm || !buf || !cdf)
		goto out_free;
	/* Documents and their questions are fixed up front, so a repeated
	 * (document, question) pair is the identical prompt.
	 */
	for (uint32_t d = 0; d < g->docs; d++) {
		doc_len[d] = rng_range(&r, g->doc_min, g->doc_max);
		doc_base[d] = next;
		next += doc_len[d] / bt;
		perm[d] = d;
	}
	for (uint32_t d = 0; d < g->docs; d++)
		for (uint32_t q = 0; q < g->questions; q++) {
			size_t k = (size_t)d * g->questions + q;
			uint32_t tot = doc_len[d] + 0;

			q_len[k] = rng_range(&r, g->q_min, g->q_max);
			tot += q_len[k];
			q_base[k] = next;
			next += (tot + bt - 1) / bt - doc_len[d] / bt;
		}
	for (uint32_t i = 0; i < n; i++) {
		struct kvfs_trace_req req = {
			.ts_ms = (uint64_t)i * 1000,
			.output_len = 1,
			.chat_id = i,
			.parent_chat_id = -1,
			.turn = 1,
		};
		uint32_t d, q;
		size_t k;

		if (i % g->window == 0)
			rng_shuffle(&r, perm, g->docs);
		d = perm[zipf_draw(cdf, g->docs, &r)];
		q = (uint32_t)(rng_next(&r) % g->questions);
		k = (size_t)d * g->questions + q;
		ret = gen_prompt(t, &req, buf, bt, doc_len[d], doc_base[d],
				 q_len[k], q_base[k], &next);
		if (ret)
			goto out_free;
	}
	ret = 0;
out_free:
	free(doc_len);
	free(doc_base);
	free(q_len);
	free(q_base);
	free(perm);
	free(buf);
	free(cdf);
	if (ret)
		kvfs_trace_release(t);
	return ret;
}

int kvfs_trace_gen_fewshot(const struct kvfs_trace_gen *g, struct kvfs_trace *t)
{
	uint32_t n = g->requests ? g->requests : 14042, bt = g->block_tokens;
	uint32_t *shot_len = NULL, *order = NULL, *count = NULL;
	int64_t *base = NULL, *buf = NULL, next = 0;
	double *cdf = NULL;
	struct rng r = { g->seed };
	uint32_t k = 0;
	int ret = -ENOMEM;

	if (!gen_check(g, g->shot_min, g->shot_max) ||
	    !gen_check(g, g->fq_min, g->fq_max) || !g->subjects ||
	    g->subjects > (1u << 20) || g->subject_alpha < 0) {
		kvfs_err("gen fewshot: bad parameters");
		return -EINVAL;
	}
	kvfs_trace_init(t, KVFS_TRACE_BAILIAN, bt);
	shot_len = calloc(g->subjects, sizeof(*shot_len));
	base = calloc(g->subjects, sizeof(*base));
	count = calloc(g->subjects, sizeof(*count));
	order = calloc(n, sizeof(*order));
	buf = calloc((g->shot_max + g->fq_max) / bt + 2, sizeof(*buf));
	cdf = zipf_cdf(g->subjects, g->subject_alpha);
	if (!shot_len || !base || !count || !order || !buf || !cdf)
		goto out_free;
	for (uint32_t s = 0; s < g->subjects; s++) {
		shot_len[s] = rng_range(&r, g->shot_min, g->shot_max);
		base[s] = next;
		next += shot_len[s] / bt;
	}
	/* A benchmark has a fixed number of questions per subject (sizes
	 * skewed like MMLU's); the stream is that whole set shuffled.
	 */
	for (uint32_t s = 0; s < g->subjects; s++) {
		double w = cdf[s] - (s ? cdf[s - 1] : 0);

		count[s] = (uint32_t)(w * n);
		for (uint32_t c = 0; c < count[s] && k < n; c++)
			order[k++] = s;
	}
	while (k < n)
		order[k++] = zipf_draw(cdf, g->subjects, &r);
	rng_shuffle(&r, order, n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvfs_trace_req req = {
			.ts_ms = (uint64_t)i * 100,
			.output_len = 1,
			.chat_id = i,
			.parent_chat_id = -1,
			.turn = 1,
		};
		uint32_t s = order[i];

		ret = gen_prompt(t, &req, buf, bt, shot_len[s], base[s],
				 rng_range(&r, g->fq_min, g->fq_max), -1,
				 &next);
		if (ret)
			goto out_free;
	}
	ret = 0;
out_free:
	free(shot_len);
	free(base);
	free(count);
	free(order);
	free(buf);
	free(cdf);
	if (ret)
		kvfs_trace_release(t);
	return ret;
}

/* Exponential with mean @mean. */
static double rng_exp(struct rng *r, double mean)
{
	return -mean * log(1.0 - rng_unit(r));
}

/* Log-normal with median @median and log-sd @sigma, in [1, @cap]. */
static uint32_t rng_lognormal(struct rng *r, double median, double sigma,
			      uint32_t cap)
{
	double u = rng_unit(r), v = rng_unit(r);
	double z = sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * v);
	double x = median * exp(sigma * z);

	return x < 1 ? 1 : x > cap ? cap : (uint32_t)x;
}

/* A session between two turns: who, how far it got, what comes next. */
struct chat_sess {
	uint64_t at; /* ms: when its next turn arrives */
	uint64_t seq; /* tie-break: order of scheduling */
	uint32_t user;
	uint32_t conv; /* session number: its block ids */
	uint32_t turn; /* of the next request */
	uint32_t context; /* tokens carried into the next turn */
	int64_t parent; /* chat id of the previous turn */
};

static bool sess_before(const struct chat_sess *a, const struct chat_sess *b)
{
	return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

/* Binary min-heap on (at, seq). */
static void heap_push(struct chat_sess *h, size_t *n, struct chat_sess s)
{
	size_t i = (*n)++;

	while (i && sess_before(&s, &h[(i - 1) / 2])) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = s;
}

static struct chat_sess heap_pop(struct chat_sess *h, size_t *n)
{
	struct chat_sess top = h[0], last = h[--*n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= *n)
			break;
		if (c + 1 < *n && sess_before(&h[c + 1], &h[c]))
			c++;
		if (!sess_before(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

/*
 * Block ids (chat and agent): a user's or an agent's system prompt blocks
 * are CHAT_SYS(u) + j, shared by all its sessions; block j of a session
 * beyond them is CHAT_CONV(c) + j, the same in every later turn (the
 * context only grows at its end); the partial last block of a prompt is
 * new each time, as a reply fills it.
 */
#define CHAT_SPAN (1ll << 20) /* ids per user or session */
#define CHAT_SYS(u) ((int64_t)(u)*CHAT_SPAN)
#define CHAT_CONV(c) ((int64_t)(1ll << 42) + (int64_t)(c)*CHAT_SPAN)
#define CHAT_TAIL (1ll << 62)

/* Add request @i of session @s to @t: @in tokens of prompt, the first
 * @sys of them its user's (or agent's) system prompt, and @out of
 * output.  @buf holds a prompt's ids; @tail is the next partial block's.
 * Returns 0 or kvfs_trace_add()'s -errno.
 */
static int sess_add(struct kvfs_trace *t, const struct chat_sess *s, uint32_t i,
		    uint32_t in, uint32_t sys, uint32_t out, int64_t *buf,
		    int64_t *tail)
{
	struct kvfs_trace_req req = { .type = 0 };
	uint32_t bt = t->block_tokens, nb = 0;

	for (uint32_t j = 0; j < in / bt; j++)
		buf[nb++] = j < sys / bt ? CHAT_SYS(s->user) + j :
					   CHAT_CONV(s->conv) + j;
	if (in % bt)
		buf[nb++] = (*tail)++;
	req.ts_ms = s->at;
	req.input_len = in;
	req.output_len = out;
	req.chat_id = i;
	req.parent_chat_id = s->parent;
	req.turn = (uint16_t)(s->turn < 65535 ? s->turn : 65535);
	return kvfs_trace_add(t, &req, buf, nb, "text");
}

/* Session @s, whose turn was request @i, goes on @after ms later with a
 * prompt of @context tokens: onto the heap of @n turns due, in the order
 * of @seq among turns due at the same time.
 */
static void sess_next(struct chat_sess *heap, size_t *n, struct chat_sess s,
		      uint32_t i, uint32_t context, uint64_t after,
		      uint64_t *seq)
{
	s.context = context;
	s.turn++;
	s.parent = i;
	s.at += after;
	s.seq = (*seq)++;
	heap_push(heap, n, s);
}

int kvfs_trace_gen_chat(const struct kvfs_trace_gen *g, struct kvfs_trace *t)
{
	uint32_t n = g->requests ? g->requests : 20000, bt = g->block_tokens;
	uint32_t *sys_len = NULL, conv = 0;
	struct chat_sess *heap = NULL;
	int64_t *buf = NULL, tail = CHAT_TAIL;
	double *cdf = NULL, arrive = 0;
	struct rng r = { g->seed };
	size_t nheap = 0;
	uint64_t seq = 0;
	int ret = -ENOMEM;

	if (!gen_check(g, g->sys_min, g->sys_max) || !g->users ||
	    g->users > (1u << 20) || g->user_alpha < 0 || !g->msg_median ||
	    !g->out_median || g->next_first < 0 || g->next_first > 1 ||
	    g->next_later < 0 || g->next_later > 1 || !g->session_ms ||
	    !g->max_turns || g->max_context <= g->sys_max ||
	    g->max_context / bt >= CHAT_SPAN || n >= (1u << 21)) {
		kvfs_err("gen chat: bad parameters");
		return -EINVAL;
	}
	kvfs_trace_init(t, KVFS_TRACE_BAILIAN, bt);
	sys_len = calloc(g->users, sizeof(*sys_len));
	heap = calloc(n, sizeof(*heap));
	buf = calloc(g->max_context / bt + 2, sizeof(*buf));
	cdf = zipf_cdf(g->users, g->user_alpha);
	if (!sys_len || !heap || !buf || !cdf)
		goto out_free;
	for (uint32_t u = 0; u < g->users; u++)
		sys_len[u] = rng_range(&r, g->sys_min, g->sys_max);
	arrive = rng_exp(&r, g->session_ms);
	for (uint32_t i = 0; i < n; i++) {
		struct chat_sess s;
		uint32_t msg, out, in;
		double p;

		/* The earliest of the next new session and the turns due. */
		if (nheap && heap[0].at <= (uint64_t)arrive) {
			s = heap_pop(heap, &nheap);
		} else {
			s = (struct chat_sess){
				.at = (uint64_t)arrive,
				.user = zipf_draw(cdf, g->users, &r),
				.conv = conv++,
				.turn = 1,
				.parent = -1,
			};
			s.context = sys_len[s.user];
			arrive += rng_exp(&r, g->session_ms);
		}
		msg = rng_lognormal(&r, g->msg_median, 1.0, g->max_context);
		out = rng_lognormal(&r, g->out_median, 0.8, g->max_context);
		in = s.context + msg;
		if (in > g->max_context)
			in = g->max_context;
		ret = sess_add(t, &s, i, in, sys_len[s.user], out, buf, &tail);
		if (ret)
			goto out_free;
		p = s.turn == 1 ? g->next_first : g->next_later;
		if (rng_unit(&r) < p && s.turn < g->max_turns &&
		    (uint64_t)in + out + 1 < g->max_context) {
			sess_next(heap, &nheap, s, i, in + out,
				  (uint64_t)rng_exp(&r, g->think_ms) + 1, &seq);
		}
	}
	ret = 0;
out_free:
	free(sys_len);
	free(heap);
	free(buf);
	free(cdf);
	if (ret)
		kvfs_trace_release(t);
	return ret;
}

/*
 * Tool-and-agent sessions.  A session is a step with one agent's system
 * prompt and a task; with probability next_step another step follows,
 * whose prompt is the one before, the model's reply to it and a tool's
 * result.  The reply drawn for a step is its output_length, the last
 * step's too.  Sessions start as a Poisson process that spreads @n
 * requests, 1 / (1 - next_step) to a session, over an hour.
 */
int kvfs_trace_gen_agent(const struct kvfs_trace_gen *g, struct kvfs_trace *t)
{
	uint32_t n = g->requests ? g->requests : 23608, bt = g->block_tokens;
	uint32_t *sys_len = NULL, *perm = NULL, sess = 0;
	struct chat_sess *heap = NULL;
	int64_t *buf = NULL, tail = CHAT_TAIL;
	double *cdf = NULL, arrive = 0, gap;
	struct rng r = { g->seed };
	size_t nheap = 0;
	uint64_t seq = 0;
	int ret = -ENOMEM;

	if (!gen_check(g, g->prompt_min, g->prompt_max) || !g->agents ||
	    g->agents > (1u << 20) || !(g->agent_alpha >= 0) ||
	    !g->task_median || !g->tool_median || !g->reply_median ||
	    !(g->next_step >= 0) || g->next_step >= 1 || !g->max_steps ||
	    g->max_context <= g->prompt_max ||
	    g->max_context / bt >= CHAT_SPAN || n >= (1u << 21)) {
		kvfs_err("gen agent: bad parameters");
		return -EINVAL;
	}
	gap = 3600000.0 / ((double)n * (1.0 - g->next_step));
	kvfs_trace_init(t, KVFS_TRACE_BAILIAN, bt);
	sys_len = calloc(g->agents, sizeof(*sys_len));
	perm = calloc(g->agents, sizeof(*perm));
	heap = calloc(n, sizeof(*heap));
	buf = calloc(g->max_context / bt + 2, sizeof(*buf));
	cdf = zipf_cdf(g->agents, g->agent_alpha);
	if (!sys_len || !perm || !heap || !buf || !cdf)
		goto out_free;
	for (uint32_t a = 0; a < g->agents; a++) {
		sys_len[a] = rng_range(&r, g->prompt_min, g->prompt_max);
		perm[a] = a;
	}
	/* Popularity rank is not agent id. */
	rng_shuffle(&r, perm, g->agents);
	arrive = rng_exp(&r, gap);
	for (uint32_t i = 0; i < n; i++) {
		struct chat_sess s;
		uint32_t in, out;
		uint64_t next;

		/* The earliest of the next new session and the steps due. */
		if (nheap && heap[0].at <= (uint64_t)arrive) {
			s = heap_pop(heap, &nheap);
		} else {
			s = (struct chat_sess){
				.at = (uint64_t)arrive,
				.user = perm[zipf_draw(cdf, g->agents, &r)],
				.conv = sess++,
				.turn = 1,
				.parent = -1,
			};
			next = (uint64_t)sys_len[s.user] +
			       rng_lognormal(&r, g->task_median, 0.8,
					     g->max_context);
			s.context = next < g->max_context ? (uint32_t)next :
							    g->max_context;
			arrive += rng_exp(&r, gap);
		}
		in = s.context;
		out = rng_lognormal(&r, g->reply_median, 0.7, g->max_context);
		ret = sess_add(t, &s, i, in, sys_len[s.user], out, buf, &tail);
		if (ret)
			goto out_free;
		if (s.turn >= g->max_steps || rng_unit(&r) >= g->next_step)
			continue;
		next = (uint64_t)in + out +
		       rng_lognormal(&r, g->tool_median, 1.0, g->max_context);
		if (next > g->max_context)
			continue;
		sess_next(heap, &nheap, s, i, (uint32_t)next,
			  g->step_min_ms + (uint64_t)rng_exp(&r, g->step_ms),
			  &seq);
	}
	ret = 0;
out_free:
	free(sys_len);
	free(perm);
	free(heap);
	free(buf);
	free(cdf);
	if (ret)
		kvfs_trace_release(t);
	return ret;
}
