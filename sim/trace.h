/* SPDX-License-Identifier: MIT */
/*
 * Request traces for the simulator: a strict JSON-lines reader for the
 * Mooncake and Qwen-Bailian formats, a writer, and generators for the
 * papers' workloads.
 *
 * Formats (one flat JSON object per line):
 *   mooncake  timestamp (ms), input_length, output_length, hash_ids;
 *             one hash id per 512-token block.
 *   bailian   chat_id, parent_chat_id (-1 = first turn), timestamp (s),
 *             input_length, output_length, type (string), turn, hash_ids;
 *             one hash id per 16-token block.
 * All fields of the format are required; unknown keys are checked for
 * syntax and ignored.  The reader is strict JSON for flat objects: values
 * are numbers, strings, true/false/null or arrays of numbers; nested
 * objects, duplicate keys and trailing bytes are errors.  A bad line is
 * logged with its number and counted in trace->bad_lines; it never stops
 * the load.
 *
 * Not thread-safe; a trace is owned by one caller.
 */
#ifndef KVFS_SIM_TRACE_H
#define KVFS_SIM_TRACE_H

#include <stddef.h>
#include <stdint.h>

enum kvfs_trace_format {
	KVFS_TRACE_MOONCAKE = 1,
	KVFS_TRACE_BAILIAN = 2,
};

#define KVFS_TRACE_MAX_TYPES 32

struct kvfs_trace_req {
	uint64_t ts_ms;         /* arrival, ms since trace start */
	uint32_t input_len;     /* tokens */
	uint32_t output_len;
	int64_t chat_id;        /* -1 when the format has none */
	int64_t parent_chat_id; /* -1: none / first turn */
	uint16_t type;          /* 1 + index into trace->types; 0 unknown */
	uint16_t turn;          /* 0 unknown */
	uint32_t nhash;
	size_t off;             /* first hash id in trace->hash */
};

struct kvfs_trace {
	int format;
	uint32_t block_tokens;
	struct kvfs_trace_req *req;
	size_t nreq, capreq;
	int64_t *hash;
	size_t nhash, caphash;
	size_t lines, bad_lines;
	char *types[KVFS_TRACE_MAX_TYPES];
	unsigned ntypes;
};

/* Block size a format implies: 512 (mooncake), 16 (bailian), 0 unknown. */
uint32_t kvfs_trace_default_block_tokens(int format);
/* "mooncake"/"bailian" -> format, or -EINVAL. */
int kvfs_trace_format_parse(const char *name);

/* Set up an empty trace of @format with @block_tokens per block. */
void kvfs_trace_init(struct kvfs_trace *t, int format, uint32_t block_tokens);
/* Free what the trace holds; it is empty (and reusable) afterwards. */
void kvfs_trace_release(struct kvfs_trace *t);

/*
 * kvfs_trace_parse_buf() - append the requests of @len bytes of JSONL.
 * Lines are numbered from @first_line (for messages).  Bad lines are
 * logged (the first few in full, then counted) and skipped.
 * Returns 0 or -ENOMEM.
 */
int kvfs_trace_parse_buf(struct kvfs_trace *t, const char *buf, size_t len,
			 size_t first_line);
/* Load a file (see kvfs_trace_parse_buf). 0, -errno from open/read, or
 * -ENOMEM.
 */
int kvfs_trace_load(struct kvfs_trace *t, const char *path);
/* Write @t as JSONL in its own format. 0 or -errno. */
int kvfs_trace_write(const struct kvfs_trace *t, const char *path);

/*
 * kvfs_trace_add() - append one request (copies @hash). @type_name may be
 * NULL. Returns 0, -ENOMEM, or -E2BIG when there are too many distinct
 * type names.
 */
int kvfs_trace_add(struct kvfs_trace *t, const struct kvfs_trace_req *r,
		   const int64_t *hash, uint32_t nhash, const char *type_name);

/* Generator knobs; kvfs_trace_gen_defaults() fills the documented ones. */
struct kvfs_trace_gen {
	uint64_t seed;
	uint32_t requests;
	uint32_t block_tokens;  /* every generator: 16, like paper 002/vLLM */
	/* zipf-docqa (paper 002, QuALITY-like) */
	uint32_t docs;          /* 381 documents */
	uint32_t questions;     /* per document: 2 */
	uint32_t doc_min, doc_max;   /* tokens: 3000..7000 (mean 5000) */
	uint32_t q_min, q_max;       /* tokens: 20..60 */
	uint32_t window;        /* 512 requests per popularity window */
	double alpha;           /* Zipf exponent 1.0 */
	/* fewshot (paper 000, 5-shot MMLU-like) */
	uint32_t subjects;      /* 57 */
	double subject_alpha;   /* Zipf skew of subject sizes: 0.8 */
	uint32_t shot_min, shot_max; /* few-shot prefix tokens: 300..700 */
	uint32_t fq_min, fq_max;     /* question tokens: 40..160 */
	/* chat (multi-turn sessions, after paper 001's to-C trace) */
	uint32_t users;         /* 2000, each with its own system prompt */
	double user_alpha;      /* Zipf skew of sessions per user: 0.9 */
	uint32_t sys_min, sys_max;   /* system prompt tokens: 200..2000 */
	uint32_t msg_median;    /* user message tokens, log-normal: 150 */
	uint32_t out_median;    /* reply tokens, log-normal: 250 */
	double next_first;      /* P(a second turn) after turn 1: 0.5 */
	double next_later;      /* P(one more turn) after the others: 0.8 */
	uint32_t think_ms;      /* mean time between turns: 60000 */
	uint32_t session_ms;    /* mean time between new sessions: 333 */
	uint32_t max_turns;     /* 232, the paper's longest session */
	uint32_t max_context;   /* tokens, chat and agent; a session ends
				 * beyond: 131072
				 */
	/* agent (tool-and-agent sessions, after Mooncake's FAST'25 trace) */
	uint32_t agents;        /* 5000, each with its own system prompt */
	double agent_alpha;     /* Zipf skew of sessions per agent: 0.9 */
	uint32_t prompt_min, prompt_max; /* system prompt tokens: 1000..9000 */
	uint32_t task_median;   /* task message tokens, log-normal: 2500 */
	uint32_t tool_median;   /* tool result tokens, log-normal: 600 */
	uint32_t reply_median;  /* reply tokens, log-normal: 150 */
	double next_step;       /* P(one more step) after each step: 0.3 */
	uint32_t step_ms;       /* mean wait between steps beyond: 3000 */
	uint32_t step_min_ms;   /* the least wait between steps: 500 */
	uint32_t max_steps;     /* steps per session at most: 64 */
};

/* @g gets the defaults in the comments above. */
void kvfs_trace_gen_defaults(struct kvfs_trace_gen *g);
/* Build the workload into an empty bailian-format trace @t (type "text",
 * turn 1, parent -1). 0, -EINVAL (bad knobs) or -ENOMEM.  Deterministic
 * for g->seed.
 */
int kvfs_trace_gen_zipf_docqa(const struct kvfs_trace_gen *g,
			      struct kvfs_trace *t);
int kvfs_trace_gen_fewshot(const struct kvfs_trace_gen *g,
			   struct kvfs_trace *t);
/* Multi-turn sessions: turn k's prompt is the system prompt, every
 * earlier message and reply, and a new message, so it extends turn
 * k-1's full blocks; parent_chat_id links the turns, turn counts them.
 * Same returns as above.
 */
int kvfs_trace_gen_chat(const struct kvfs_trace_gen *g, struct kvfs_trace *t);
/*
 * kvfs_trace_gen_agent() - tool-and-agent sessions into an empty trace @t
 * (bailian format, g->block_tokens per block, type "text"), deterministic
 * for g->seed: g->requests of them (23608 when 0) in timestamp order.
 * A session is one agent's system prompt and a task; each further step
 * appends the reply and a tool result to the step before, so it begins
 * with that step's full blocks; parent_chat_id links the steps, turn
 * counts them from 1.  Sessions start over about an hour whatever the
 * count.  Returns 0, -EINVAL (bad knobs: g->agents, prompt_min..
 * prompt_max, the medians, next_step outside [0, 1), max_steps 0,
 * max_context not above prompt_max, too many requests) or -ENOMEM; @t is
 * empty after an error.
 */
int kvfs_trace_gen_agent(const struct kvfs_trace_gen *g, struct kvfs_trace *t);

#endif
