/* SPDX-License-Identifier: MIT */
/*
 * Restoration test support: see ckpt_ref_i.h.  Moved out of
 * test_restore.c so that the GPU suite, the chunk tests and the
 * integration clients use the same checkpoints and reference.
 */
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "hcache/restore.h"
#include "meta/log.h"
#include "tests/unit/ckpt_ref_i.h"

/* ---------------------------------------------- PRNG and test encodings */

static uint64_t rng;

static uint64_t rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

size_t esize(uint16_t dt)
{
	return dt == KVFS_DTYPE_F32 ? 4 : dt == KVFS_DTYPE_F8_E4M3 ? 1 : 2;
}

/* Write a random normal number with exponent in [lo, hi) as @dt at @dst;
 * return its exact value.
 */
static double gen(uint16_t dt, int lo, int hi, void *dst)
{
	int s = (int)(rnd() & 1), e = lo + (int)(rnd() % (uint64_t)(hi - lo));
	uint64_t r = rnd();
	uint32_t u32;
	uint16_t u16;
	double v;

	switch (dt) {
	case KVFS_DTYPE_F32:
		u32 = (uint32_t)s << 31 | (uint32_t)(e + 127) << 23 |
		      (uint32_t)(r & 0x7fffff);
		memcpy(dst, &u32, 4);
		v = ldexp(1.0 + (double)(r & 0x7fffff) / 8388608.0, e);
		break;
	case KVFS_DTYPE_BF16:
		u16 = (uint16_t)(s << 15 | (e + 127) << 7 | (int)(r & 0x7f));
		memcpy(dst, &u16, 2);
		v = ldexp(1.0 + (double)(r & 0x7f) / 128.0, e);
		break;
	case KVFS_DTYPE_F16:
		u16 = (uint16_t)(s << 15 | (e + 15) << 10 | (int)(r & 0x3ff));
		memcpy(dst, &u16, 2);
		v = ldexp(1.0 + (double)(r & 0x3ff) / 1024.0, e);
		break;
	default:
		fail();
		return 0;
	}
	return s ? -v : v;
}

/* The test's own decoders. */
double dec(uint16_t dt, const void *base, size_t i)
{
	const uint8_t *p = (const uint8_t *)base + i * esize(dt);
	uint32_t u32;
	uint16_t h;
	float f;
	int e, m;

	switch (dt) {
	case KVFS_DTYPE_F32:
		memcpy(&f, p, 4);
		return f;
	case KVFS_DTYPE_BF16:
		memcpy(&h, p, 2);
		u32 = (uint32_t)h << 16;
		memcpy(&f, &u32, 4);
		return f;
	case KVFS_DTYPE_F16:
		memcpy(&h, p, 2);
		e = (h >> 10) & 31;
		m = h & 1023;
		if (e == 31)
			return m ? NAN : (h & 0x8000 ? -INFINITY : INFINITY);
		f = e ? (float)ldexp(1.0 + m / 1024.0, e - 15) :
			(float)ldexp(m, -24);
		return (h & 0x8000) ? -f : f;
	case KVFS_DTYPE_F8_E4M3:
		e = (p[0] >> 3) & 15;
		m = p[0] & 7;
		if (e == 15 && m == 7)
			return NAN;
		f = e ? (float)ldexp(1.0 + m / 8.0, e - 7) :
			(float)ldexp(m, -9);
		return (p[0] & 0x80) ? -f : f;
	}
	fail();
	return 0;
}

double tol(uint16_t dt, double ref)
{
	switch (dt) {
	case KVFS_DTYPE_F32:
		return 1e-5 * fabs(ref) + 2e-5;
	case KVFS_DTYPE_BF16:
		return ldexp(1, -8) * fabs(ref) + 2e-5;
	case KVFS_DTYPE_F16:
		return ldexp(1, -11) * fabs(ref) + 2e-5;
	default:
		return ldexp(1, -4) * fabs(ref) + ldexp(1, -10) + 2e-5;
	}
}

/* ---------------------------------------------------- checkpoint writer */

/* Header padded with spaces so the data section starts 8-aligned, as
 * real writers do.
 */
void write_checkpoint(const char *path, const struct wt *t, size_t n)
{
	size_t cap = 256 + n * 256, o = 0, off = 0;
	char *hdr = malloc(cap);
	uint64_t hlen;
	FILE *f;

	assert_non_null(hdr);
	o += (size_t)snprintf(hdr + o, cap - o,
			      "{\"__metadata__\":{\"format\":\"pt\"}");
	for (size_t i = 0; i < n; i++) {
		o += (size_t)snprintf(hdr + o, cap - o,
				      ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
				      t[i].name, t[i].dtype);
		for (uint32_t d = 0; d < t[i].ndim; d++)
			o += (size_t)snprintf(hdr + o, cap - o, "%s%llu",
					      d ? "," : "",
					      (unsigned long long)t[i].shape[d]);
		o += (size_t)snprintf(hdr + o, cap - o,
				      "],\"data_offsets\":[%zu,%zu]}", off,
				      off + t[i].nbytes);
		off += t[i].nbytes;
	}
	o += (size_t)snprintf(hdr + o, cap - o, "}");
	while ((8 + o) % 8)
		hdr[o++] = ' ';
	hlen = o;
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(&hlen, 8, 1, f), 1);
	assert_int_equal(fwrite(hdr, 1, o, f), o);
	for (size_t i = 0; i < n; i++)
		if (t[i].nbytes)
			assert_int_equal(fwrite(t[i].bytes, 1, t[i].nbytes, f),
					 t[i].nbytes);
	assert_int_equal(fclose(f), 0);
	free(hdr);
}

/* ------------------------------------------------------ model and reference */

static const char *st_name(uint16_t dt)
{
	return dt == KVFS_DTYPE_F32 ? "F32" : dt == KVFS_DTYPE_BF16 ? "BF16" :
								   "F16";
}

static struct wt *add_tensor(struct refmodel *rm, const char *name,
			     uint64_t d0, uint64_t d1, double *vals, int lo,
			     int hi)
{
	struct wt *w = &rm->t[rm->nt++];
	uint64_t n = d0 * (d1 ? d1 : 1);

	snprintf(w->name, sizeof(w->name), "%s", name);
	w->dtype = st_name(rm->s.wdt);
	w->ndim = d1 ? 2 : 1;
	w->shape[0] = d0;
	w->shape[1] = d1;
	w->nbytes = n * esize(rm->s.wdt);
	w->bytes = malloc(w->nbytes);
	assert_non_null(w->bytes);
	for (uint64_t i = 0; i < n; i++)
		vals[i] = gen(rm->s.wdt, lo, hi, w->bytes + i * esize(rm->s.wdt));
	return w;
}

void make_model(struct refmodel *rm, const struct spec *s,
		       uint64_t seed)
{
	uint32_t L = s->L, H = s->hidden, D = s->kvh * s->hd;
	char name[96];

	memset(rm, 0, sizeof(*rm));
	rng = seed;
	rm->s = *s;
	rm->kvd = D;
	rm->m.family = s->family;
	rm->m.n_layers = L;
	rm->m.hidden_size = H;
	rm->m.n_kv_heads = s->kvh;
	rm->m.head_dim = s->hd;
	rm->m.rms_norm_eps = s->eps;
	rm->m.rope_theta = s->theta;
	rm->m.rope_type = s->rope_type;
	rm->m.rope_factor = s->factor;
	rm->m.rope_low_freq_factor = s->lo;
	rm->m.rope_high_freq_factor = s->hi;
	rm->m.rope_orig_max_pos = s->orig;
	rm->norm = calloc((size_t)L * H, sizeof(double));
	rm->wk = calloc((size_t)L * D * H, sizeof(double));
	rm->wv = calloc((size_t)L * D * H, sizeof(double));
	rm->bk = calloc((size_t)L * D, sizeof(double));
	rm->bv = calloc((size_t)L * D, sizeof(double));
	rm->t = calloc((size_t)L * 5 + 8, sizeof(*rm->t));
	assert_true(rm->norm && rm->wk && rm->wv && rm->bk && rm->bv && rm->t);
	for (uint32_t l = 0; l < L; l++) {
		snprintf(name, sizeof(name),
			 "model.layers.%u.input_layernorm.weight", l);
		add_tensor(rm, name, H, 0, rm->norm + (size_t)l * H, -1, 1);
		snprintf(name, sizeof(name),
			 "model.layers.%u.self_attn.k_proj.weight", l);
		add_tensor(rm, name, D, H, rm->wk + (size_t)l * D * H, -4, 0);
		snprintf(name, sizeof(name),
			 "model.layers.%u.self_attn.v_proj.weight", l);
		add_tensor(rm, name, D, H, rm->wv + (size_t)l * D * H, -4, 0);
		if (s->bias) {
			snprintf(name, sizeof(name),
				 "model.layers.%u.self_attn.k_proj.bias", l);
			add_tensor(rm, name, D, 0, rm->bk + (size_t)l * D, -3,
				   0);
			snprintf(name, sizeof(name),
				 "model.layers.%u.self_attn.v_proj.bias", l);
			add_tensor(rm, name, D, 0, rm->bv + (size_t)l * D, -3,
				   0);
		}
	}
	/* Tensors a restore must not need, as real checkpoints have. */
	{
		double tmp[8];

		add_tensor(rm, "model.embed_tokens.weight", 2, 4, tmp, -1, 0);
		add_tensor(rm, "model.norm.weight", 4, 0, tmp, -1, 0);
	}
}

void free_model(struct refmodel *rm)
{
	for (size_t i = 0; i < rm->nt; i++)
		free(rm->t[i].bytes);
	free(rm->t);
	free(rm->norm);
	free(rm->wk);
	free(rm->wv);
	free(rm->bk);
	free(rm->bv);
}

/* Written as the Hugging Face config describes it, but independently:
 * exp/log instead of pow, bands tested in the other order.
 */
static double ref_inv_freq(const struct kvfs_restore_model *m, uint32_t j)
{
	double base = exp(-log(m->rope_theta) * (2.0 * j / m->head_dim));
	double wl, lo_wl, hi_wl, smooth;

	if (m->rope_type == KVFS_ROPE_LINEAR)
		return base / m->rope_factor;
	if (m->rope_type != KVFS_ROPE_LLAMA3)
		return base;
	wl = 2 * M_PI / base;
	lo_wl = m->rope_orig_max_pos / m->rope_low_freq_factor;
	hi_wl = m->rope_orig_max_pos / m->rope_high_freq_factor;
	if (wl < hi_wl)
		return base;
	if (wl > lo_wl)
		return base / m->rope_factor;
	smooth = (m->rope_orig_max_pos / wl - m->rope_low_freq_factor) /
		 (m->rope_high_freq_factor - m->rope_low_freq_factor);
	return smooth * base + (1 - smooth) * base / m->rope_factor;
}

/* K and V of layer @l, token with values @x (double, [hidden]) at @pos. */
void ref_kv(const struct refmodel *rm, uint32_t l, const double *x,
		   uint64_t pos, double *k, double *v)
{
	uint32_t H = rm->s.hidden, D = rm->kvd, hd = rm->s.hd;
	double *xn = malloc(H * sizeof(double)), ms = 0;

	assert_non_null(xn);
	for (uint32_t j = 0; j < H; j++)
		ms += x[j] * x[j];
	ms /= H;
	for (uint32_t j = 0; j < H; j++)
		xn[j] = x[j] / sqrt(ms + rm->s.eps) * rm->norm[(size_t)l * H + j];
	for (uint32_t o = 0; o < D; o++) {
		const double *wk = rm->wk + ((size_t)l * D + o) * H;
		const double *wv = rm->wv + ((size_t)l * D + o) * H;
		double sk = rm->bk[(size_t)l * D + o];
		double sv = rm->bv[(size_t)l * D + o];

		for (uint32_t j = 0; j < H; j++) {
			sk += wk[j] * xn[j];
			sv += wv[j] * xn[j];
		}
		k[o] = sk;
		v[o] = sv;
	}
	for (uint32_t h = 0; h < rm->s.kvh; h++) {
		double *q = k + (size_t)h * hd;

		for (uint32_t j = 0; j < hd / 2; j++) {
			double a = (double)pos * ref_inv_freq(&rm->m, j);
			double x1 = q[j], x2 = q[j + hd / 2];

			q[j] = x1 * cos(a) - x2 * sin(a);
			q[j + hd / 2] = x2 * cos(a) + x1 * sin(a);
		}
	}
	free(xn);
}

/* ------------------------------------------------------------ payloads */

/* Padded rows are filled with 0xff bytes (NaN in every float format) to
 * prove they are never read.
 */
void make_block(struct block *b, const struct refmodel *rm,
		       uint16_t hdt, uint32_t n, uint32_t c, uint64_t pos)
{
	uint32_t H = rm->s.hidden, L = rm->s.L;
	size_t es = esize(hdt);

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->c = c;
	b->rows = (n + c - 1) / c * c;
	b->pos = pos;
	b->hdt = hdt;
	b->hidden_len = (size_t)L * b->rows * H * es;
	b->hidden = malloc(b->hidden_len);
	b->x = malloc((size_t)L * n * H * sizeof(double));
	assert_true(b->hidden && b->x);
	memset(b->hidden, 0xff, b->hidden_len);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t j = 0; j < H; j++) {
				size_t at = (((size_t)l * b->rows + i) * H + j);

				b->x[((size_t)l * n + i) * H + j] =
					gen(hdt, -2, 2, b->hidden + at * es);
			}
}

void free_block(struct block *b)
{
	free(b->hidden);
	free(b->x);
}

void ckpt_seed(uint64_t seed)
{
	rng = seed;
}

/* Check layer @l of a KV payload against the reference; returns the
 * largest error/tolerance ratio seen.
 */
double check_layer(const struct refmodel *rm, const struct block *b,
			  uint32_t l, const uint8_t *kvl, uint16_t kdt)
{
	uint32_t D = rm->kvd, c = b->c;
	double *k = malloc(D * sizeof(double)), *v = malloc(D * sizeof(double));
	double worst = 0;

	assert_true(k && v);
	for (uint32_t r = 0; r < b->rows; r++) {
		uint32_t ch = r / c, i = r % c;
		size_t kbase = ((size_t)ch * 2 * c + i) * D;
		size_t vbase = ((size_t)ch * 2 * c + c + i) * D;

		if (r >= b->n) {
			for (uint32_t o = 0; o < D; o++) {
				assert_true(dec(kdt, kvl, kbase + o) == 0);
				assert_true(dec(kdt, kvl, vbase + o) == 0);
			}
			continue;
		}
		ref_kv(rm, l, b->x + ((size_t)l * b->n + r) * rm->s.hidden,
		       b->pos + r, k, v);
		for (uint32_t o = 0; o < D; o++) {
			double gk = dec(kdt, kvl, kbase + o);
			double gv = dec(kdt, kvl, vbase + o);
			double ek = fabs(gk - k[o]) / tol(kdt, k[o]);
			double ev = fabs(gv - v[o]) / tol(kdt, v[o]);

			if (!(ek <= 1) || !(ev <= 1))
				print_error("layer %u row %u elem %u: K %.9g vs %.9g, V %.9g vs %.9g\n",
					    l, r, o, gk, k[o], gv, v[o]);
			assert_true(ek <= 1);
			assert_true(ev <= 1);
			worst = fmax(worst, fmax(ek, ev));
		}
	}
	free(k);
	free(v);
	return worst;
}


/* ------------------------------------------- restoration suites' fixture */

const struct spec ckpt_llama_mha_f32 = {
	.family = KVFS_FAMILY_LLAMA, .L = 2, .hidden = 32, .kvh = 4, .hd = 8,
	.wdt = KVFS_DTYPE_F32, .theta = 10000, .eps = 1e-5,
};

/* hd 8, theta 5e5: wavelengths 6.3, 167, 4.4e3, 1.2e5; with a 512-token
 * original context and factors 1/4 the bands are: keep, blend, scale,
 * scale - every branch of the llama3 rule.
 */
const struct spec ckpt_llama_gqa_bf16 = {
	.family = KVFS_FAMILY_LLAMA, .L = 3, .hidden = 48, .kvh = 2, .hd = 8,
	.wdt = KVFS_DTYPE_BF16, .theta = 500000, .eps = 1e-5,
	.rope_type = KVFS_ROPE_LLAMA3, .factor = 8, .lo = 1, .hi = 4,
	.orig = 512,
};

const struct spec ckpt_qwen2_bias = {
	.family = KVFS_FAMILY_QWEN2, .L = 2, .hidden = 64, .kvh = 2, .hd = 16,
	.wdt = KVFS_DTYPE_BF16, .bias = true, .theta = 1000000, .eps = 1e-6,
};

const struct spec ckpt_llama_linear_f16 = {
	.family = KVFS_FAMILY_LLAMA, .L = 1, .hidden = 16, .kvh = 2, .hd = 8,
	/* a large eps, so that dropping it would show */
	.wdt = KVFS_DTYPE_F16, .theta = 10000, .eps = 0.25,
	.rope_type = KVFS_ROPE_LINEAR, .factor = 4,
};

const uint16_t ckpt_kv_dtypes[4] = { KVFS_DTYPE_F32, KVFS_DTYPE_BF16,
				     KVFS_DTYPE_F16, KVFS_DTYPE_F8_E4M3 };

#define ALL_KV                                                             \
	{ KVFS_DTYPE_F32, KVFS_DTYPE_BF16, KVFS_DTYPE_F16,                 \
	  KVFS_DTYPE_F8_E4M3 }

/* 37 tokens in chunks of 16 leave a last chunk of 5; positions 0 and past
 * 2^32 check RoPE's ends.
 */
const struct ckpt_case ckpt_case_mha_f32 = {
	&ckpt_llama_mha_f32, 1,
	{ { KVFS_DTYPE_F32, 37, 16, 1000, ALL_KV },
	  { KVFS_DTYPE_F32, 16, 16, 0, { KVFS_DTYPE_F32 } },
	  { KVFS_DTYPE_F32, 3, 4, 1ull << 33, { KVFS_DTYPE_F32 } } },
};
const struct ckpt_case ckpt_case_gqa_bf16 = {
	&ckpt_llama_gqa_bf16, 2,
	{ { KVFS_DTYPE_BF16, 37, 16, 1000, ALL_KV },
	  { KVFS_DTYPE_F16, 50, 64, 4096 + 7, { KVFS_DTYPE_BF16 } } },
};
const struct ckpt_case ckpt_case_linear_f16 = {
	&ckpt_llama_linear_f16, 3,
	{ { KVFS_DTYPE_F16, 9, 4, 777, { KVFS_DTYPE_F32, KVFS_DTYPE_F16 } } },
};
const struct ckpt_case ckpt_case_qwen2 = {
	&ckpt_qwen2_bias, 4,
	{ { KVFS_DTYPE_BF16, 37, 16, 1000, { KVFS_DTYPE_BF16, KVFS_DTYPE_F32 } },
	  { KVFS_DTYPE_F16, 20, 8, 31,
	    { KVFS_DTYPE_F16, KVFS_DTYPE_F8_E4M3 } } },
};

void ckpt_case_run(const struct ckpt_case *t, const struct refmodel *rm,
		   void (*fn)(void *arg, const struct refmodel *rm,
			      const struct block *b, uint16_t kdt),
		   void *arg)
{
	struct block b;

	for (const struct ckpt_block *g = t->b; g->n; g++) {
		make_block(&b, rm, g->hdt, g->n, g->c, g->pos);
		for (const uint16_t *k = g->kdt; *k; k++)
			fn(arg, rm, &b, *k);
		free_block(&b);
	}
}

static char ck_dir[64];
static char ck_log[80];

static int rm_one(const char *p, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	return remove(p);
}

int ckpt_dir_setup(const char *tag)
{
	snprintf(ck_dir, sizeof(ck_dir), "/tmp/kvfs-test-%s-XXXXXX", tag);
	if (!mkdtemp(ck_dir))
		return -1;
	snprintf(ck_log, sizeof(ck_log), "%s.log", ck_dir);
	kvfs_restore_set_blas_threads(2);
	return kvfs_log_open(ck_log);
}

int ckpt_dir_teardown(void)
{
	kvfs_log_close();
	/* The log goes to a file some tests read back; where a run's log
	 * must be kept (the GPU bundle), copy it to stderr first.
	 */
	if (getenv("KVFS_TEST_SHOW_LOG")) {
		FILE *f = fopen(ck_log, "r");
		char line[1024];

		fprintf(stderr, "--- log of this run (%s)\n", ck_log);
		while (f && fgets(line, sizeof(line), f))
			fputs(line, stderr);
		if (f)
			fclose(f);
		fprintf(stderr, "--- end of the log\n");
	}
	unlink(ck_log);
	return nftw(ck_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *ckpt_path(const char *name)
{
	static char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", ck_dir, name);
	return p;
}

const char *ckpt_log_path(void)
{
	return ck_log;
}

struct kvfs_restore *ckpt_load(struct refmodel *rm, const char *file,
			       unsigned flags)
{
	struct kvfs_restore *r = NULL;

	write_checkpoint(ckpt_path(file), rm->t, rm->nt);
	assert_int_equal(kvfs_restore_load(&rm->m, ckpt_path(file), flags, &r),
			 0);
	return r;
}
