/* SPDX-License-Identifier: MIT */
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hcache/restore.h"
#include "hcache/safetensors.h"
#include "meta/fmt.h"
#include "meta/log.h"

/* Positions are turned into doubles for the RoPE angle; above 2^53 two
 * positions would share an angle.
 */
#define MAX_POS (1ull << 53)
/* Sanity bounds on a model description; far above any real model, low
 * enough that sizes computed from them cannot overflow 64 bits.
 */
#define MAX_LAYERS 4096u
#define MAX_HIDDEN (1u << 20)
#define MAX_HEAD_DIM 4096u
#define MAX_KV_DIM (1u << 20)

struct layer_w {
	const float *wk, *wv;   /* f32 [kv_dim][hidden], NULL when lazy */
	bool wk_owned, wv_owned;
	struct kvfs_st_tensor tk, tv; /* the mapped tensors (lazy source) */
	float *norm;            /* [hidden] */
	float *bk, *bv;         /* [kv_dim] or NULL */
};

struct kvfs_restore {
	struct kvfs_restore_model m;
	uint32_t kv_dim;
	uint64_t id;            /* keys workspace caches; never reused */
	unsigned flags;
	struct kvfs_st *st;
	struct layer_w *layers;
	double *inv_freq;       /* [head_dim / 2] */
	uint64_t mem_bytes;
};

struct kvfs_restore_ws {
	float *xn;              /* [n_tokens][hidden] normalised input */
	size_t xn_cap;
	float *k, *v;           /* [n_tokens][kv_dim] each */
	size_t k_cap, v_cap;
	float *w;               /* lazy weights [kv_dim][hidden] */
	size_t w_cap;
	float *cs;              /* [n_tokens][head_dim / 2][cos, sin] */
	size_t cs_cap;
	/* What cs holds, so that the layers of one block share it. */
	uint64_t cs_id, cs_pos;
	uint32_t cs_n;
};

static atomic_uint_least64_t next_id = 1;

/* ------------------------------------------------------- conversions */

static inline uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float kvfs_restore_bf16_to_f32(uint16_t v)
{
	return u2f((uint32_t)v << 16);
}

uint16_t kvfs_restore_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float kvfs_restore_f16_to_f32(uint16_t v)
{
	uint32_t sign = (uint32_t)(v & 0x8000u) << 16;
	uint32_t exp = (v >> 10) & 0x1fu, man = v & 0x3ffu;
	float f;

	if (exp == 0) {
		f = (float)man * 0x1p-24f; /* exact: man < 2^10 */
		return u2f(f2u(f) | sign);
	}
	if (exp == 31)
		return u2f(sign | 0x7f800000u | man << 13);
	return u2f(sign | (exp + 112) << 23 | man << 13);
}

/* @m >> @shift rounded to nearest, ties to even; @shift in 1..31. */
static inline uint32_t shift_rne(uint32_t m, unsigned shift)
{
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1);
	uint32_t half = 1u << (shift - 1);

	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

/* |f| (bits @a, finite) scaled by 2^@scale_log2 and rounded to an integer,
 * for values whose result lands in a format's subnormal range.
 */
static inline uint32_t subnormal_rne(uint32_t a, int scale_log2)
{
	int e = (int)(a >> 23);
	uint32_t mant = a & 0x7fffffu;
	int shift;

	if (e)
		mant |= 0x800000u;
	else
		e = 1;
	/* value = mant * 2^(e - 150); result = mant * 2^(e - 150 + s). */
	shift = 150 - e - scale_log2;
	if (shift <= 0)
		return mant << -shift; /* not reached for subnormal inputs */
	if (shift > 24)
		return 0;
	return shift_rne(mant, (unsigned)shift);
}

uint16_t kvfs_restore_f32_to_f16(float f)
{
	uint32_t u = f2u(f), a = u & 0x7fffffffu;
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t h;

	if (a > 0x7f800000u)
		return sign | 0x7e00u;
	if (a >= 0x477ff000u) /* >= 65520 rounds to infinity */
		return sign | 0x7c00u;
	if (a < 0x38800000u) /* below 2^-14: f16 subnormal */
		return (uint16_t)(sign | subnormal_rne(a, 24));
	h = (a >> 13) - (112u << 10);
	if ((a & 0x1fffu) > 0x1000u ||
	    ((a & 0x1fffu) == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

float kvfs_restore_f8e4m3_to_f32(uint8_t v)
{
	uint32_t exp = (v >> 3) & 0xfu, man = v & 7u;
	float f;

	if (exp == 15 && man == 7)
		return (v & 0x80) ? -NAN : NAN;
	if (exp == 0)
		f = (float)man * 0x1p-9f;
	else
		f = ldexpf((float)(8 + man), (int)exp - 10);
	return (v & 0x80) ? -f : f;
}

uint8_t kvfs_restore_f32_to_f8e4m3(float f)
{
	uint32_t u = f2u(f), a = u & 0x7fffffffu, m;
	uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
	int e;

	if (a > 0x7f800000u)
		return sign | 0x7fu;
	if (a >= 0x43e00000u) /* >= 448, infinity included: saturate */
		return sign | 0x7eu;
	if (a < 0x3c800000u) /* below 2^-6: e4m3 subnormal, step 2^-9 */
		return (uint8_t)(sign | subnormal_rne(a, 9));
	e = (int)(a >> 23) - 127;
	m = shift_rne((a & 0x7fffffu) | 0x800000u, 20); /* 8..16 */
	if (m == 16) {
		m = 8;
		e++;
	}
	m = (uint32_t)(e + 7) << 3 | (m & 7u);
	if (m > 0x7eu)
		m = 0x7eu;
	return (uint8_t)(sign | m);
}

int kvfs_restore_to_f32(const void *src, uint16_t dtype, float *dst, size_t n)
{
	const uint8_t *s = src;
	uint16_t h;

	switch (dtype) {
	case KVFS_DTYPE_F32:
		memcpy(dst, src, n * 4);
		return 0;
	case KVFS_DTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			memcpy(&h, s + 2 * i, 2);
			dst[i] = kvfs_restore_bf16_to_f32(h);
		}
		return 0;
	case KVFS_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			memcpy(&h, s + 2 * i, 2);
			dst[i] = kvfs_restore_f16_to_f32(h);
		}
		return 0;
	case KVFS_DTYPE_F8_E4M3:
		for (size_t i = 0; i < n; i++)
			dst[i] = kvfs_restore_f8e4m3_to_f32(s[i]);
		return 0;
	default:
		return -EINVAL;
	}
}

int kvfs_restore_from_f32(const float *src, uint16_t dtype, void *dst,
			  size_t n)
{
	uint8_t *d = dst;
	uint16_t h;

	switch (dtype) {
	case KVFS_DTYPE_F32:
		memcpy(dst, src, n * 4);
		return 0;
	case KVFS_DTYPE_BF16:
		for (size_t i = 0; i < n; i++) {
			h = kvfs_restore_f32_to_bf16(src[i]);
			memcpy(d + 2 * i, &h, 2);
		}
		return 0;
	case KVFS_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			h = kvfs_restore_f32_to_f16(src[i]);
			memcpy(d + 2 * i, &h, 2);
		}
		return 0;
	case KVFS_DTYPE_F8_E4M3:
		for (size_t i = 0; i < n; i++)
			d[i] = kvfs_restore_f32_to_f8e4m3(src[i]);
		return 0;
	default:
		return -EINVAL;
	}
}

/* fmt.h's dtype sizes, kept here so this module links on its own. */
/* Checkpoint dtype -> enum kvfs_dtype for the three usable ones. */
static int st_to_kvfs_dtype(int st_dtype)
{
	switch (st_dtype) {
	case KVFS_ST_F32:
		return KVFS_DTYPE_F32;
	case KVFS_ST_F16:
		return KVFS_DTYPE_F16;
	case KVFS_ST_BF16:
		return KVFS_DTYPE_BF16;
	default:
		return -EINVAL;
	}
}

/* ------------------------------------------------------------- model */

int kvfs_restore_family_parse(const char *name)
{
	if (!name)
		return -EINVAL;
	if (!strcmp(name, "llama"))
		return KVFS_FAMILY_LLAMA;
	if (!strcmp(name, "qwen2"))
		return KVFS_FAMILY_QWEN2;
	return -EINVAL;
}

int kvfs_restore_rope_parse(const char *name)
{
	if (!name)
		return -EINVAL;
	if (!strcmp(name, "default") || !strcmp(name, "none"))
		return KVFS_ROPE_DEFAULT;
	if (!strcmp(name, "linear"))
		return KVFS_ROPE_LINEAR;
	if (!strcmp(name, "llama3"))
		return KVFS_ROPE_LLAMA3;
	return -EINVAL;
}

static int model_bad(const char *why)
{
	kvfs_err("restore: model description refused: %s", why);
	return -EINVAL;
}

int kvfs_restore_model_check(const struct kvfs_restore_model *m)
{
	if (!m)
		return -EINVAL;
	if (m->family != KVFS_FAMILY_LLAMA && m->family != KVFS_FAMILY_QWEN2)
		return model_bad("unknown family");
	if (!m->n_layers || m->n_layers > MAX_LAYERS)
		return model_bad("n_layers out of range");
	if (!m->hidden_size || m->hidden_size > MAX_HIDDEN)
		return model_bad("hidden_size out of range");
	if (!m->head_dim || m->head_dim % 2 || m->head_dim > MAX_HEAD_DIM)
		return model_bad("head_dim must be even and in range");
	if (!m->n_kv_heads ||
	    (uint64_t)m->n_kv_heads * m->head_dim > MAX_KV_DIM)
		return model_bad("n_kv_heads * head_dim out of range");
	if (!(m->rms_norm_eps > 0) || !isfinite(m->rms_norm_eps))
		return model_bad("rms_norm_eps must be a positive number");
	if (!(m->rope_theta > 0) || !isfinite(m->rope_theta))
		return model_bad("rope_theta must be a positive number");
	switch (m->rope_type) {
	case KVFS_ROPE_DEFAULT:
		break;
	case KVFS_ROPE_LLAMA3:
		if (!(m->rope_low_freq_factor > 0) ||
		    !isfinite(m->rope_low_freq_factor))
			return model_bad("llama3 low_freq_factor must be > 0");
		if (!(m->rope_high_freq_factor > m->rope_low_freq_factor) ||
		    !isfinite(m->rope_high_freq_factor))
			return model_bad("llama3 high_freq_factor must exceed low_freq_factor");
		if (!m->rope_orig_max_pos)
			return model_bad("llama3 original_max_position_embeddings must be > 0");
		__attribute__((fallthrough));
	case KVFS_ROPE_LINEAR:
		if (!(m->rope_factor > 0) || !isfinite(m->rope_factor))
			return model_bad("rope scaling factor must be > 0");
		break;
	default:
		return model_bad("unknown rope scaling type");
	}
	return 0;
}

/* inv_freq as the checkpoint's Hugging Face config defines it, in double. */
static void rope_inv_freq(const struct kvfs_restore_model *m, double *inv)
{
	uint32_t half = m->head_dim / 2;

	for (uint32_t j = 0; j < half; j++) {
		double f = pow(m->rope_theta,
			       -(2.0 * j) / (double)m->head_dim);

		if (m->rope_type == KVFS_ROPE_LINEAR) {
			f /= m->rope_factor;
		} else if (m->rope_type == KVFS_ROPE_LLAMA3) {
			/* Long wavelengths are slowed by factor, short ones
			 * kept, the band between blended linearly in
			 * 1/wavelength.
			 */
			double ctx = (double)m->rope_orig_max_pos;
			double lo = m->rope_low_freq_factor;
			double hi = m->rope_high_freq_factor;
			double wl = 2.0 * M_PI / f;

			if (wl > ctx / lo) {
				f /= m->rope_factor;
			} else if (wl >= ctx / hi) {
				double s = (ctx / wl - lo) / (hi - lo);

				f = (1.0 - s) * f / m->rope_factor + s * f;
			}
		}
		inv[j] = f;
	}
}

/* ------------------------------------------------------------ loading */

__attribute__((format(printf, 3, 4)))
static int load_bad(const char *weights, const char *tensor,
		    const char *fmt, ...)
{
	char why[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (tensor)
		kvfs_err("restore %s: tensor \"%s\": %s", weights, tensor,
			 why);
	else
		kvfs_err("restore %s: %s", weights, why);
	return -EINVAL;
}

static void shape_str(const struct kvfs_st_tensor *t, char *buf, size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(buf + o, len - o, "[");
	for (uint32_t i = 0; i < t->ndim && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? ", " : "",
				      (unsigned long long)t->shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

/* Look up @name and check its dtype and shape ([d0] or [d0, d1]). */
static int get_tensor(const struct kvfs_restore *r, const char *weights,
		      const char *name, uint64_t d0, uint64_t d1,
		      struct kvfs_st_tensor *t)
{
	uint32_t ndim = d1 ? 2 : 1;
	char got[160];

	if (kvfs_st_get(r->st, name, t))
		return load_bad(weights, name, "missing from the checkpoint");
	if (st_to_kvfs_dtype(t->dtype) < 0)
		return load_bad(weights, name,
				"dtype %s is not usable (F32, F16 or BF16)",
				kvfs_st_dtype_name(t->dtype));
	if (t->ndim != ndim || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
		shape_str(t, got, sizeof(got));
		if (d1)
			return load_bad(weights, name,
					"shape %s, expected [%llu, %llu] (n_kv_heads * head_dim, hidden_size)",
					got, (unsigned long long)d0,
					(unsigned long long)d1);
		return load_bad(weights, name, "shape %s, expected [%llu]",
				got, (unsigned long long)d0);
	}
	return 0;
}

static float *tensor_f32(struct kvfs_restore *r, const struct kvfs_st_tensor *t)
{
	float *f = malloc(t->numel * sizeof(float));

	if (!f)
		return NULL;
	kvfs_restore_to_f32(t->data, (uint16_t)st_to_kvfs_dtype(t->dtype), f,
			    t->numel);
	r->mem_bytes += t->numel * sizeof(float);
	return f;
}

static bool f32_in_place(const struct kvfs_st_tensor *t)
{
	return t->dtype == KVFS_ST_F32 && !((uintptr_t)t->data % 4);
}

/* Resident f32 K/V weight: the mapping itself when possible. */
static int weight_f32(struct kvfs_restore *r, const struct kvfs_st_tensor *t,
		      const float **w, bool *owned)
{
	if (f32_in_place(t)) {
		*w = t->data;
		*owned = false;
		return 0;
	}
	if (r->flags & KVFS_RESTORE_LAZY) {
		*w = NULL;
		*owned = false;
		return 0;
	}
	*w = tensor_f32(r, t);
	*owned = true;
	return *w ? 0 : -ENOMEM;
}

static int load_layer(struct kvfs_restore *r, const char *weights, uint32_t i)
{
	struct layer_w *L = &r->layers[i];
	struct kvfs_st_tensor tn, tbk, tbv;
	char name[160];
	int ret, hk, hv;

	snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight",
		 i);
	ret = get_tensor(r, weights, name, r->m.hidden_size, 0, &tn);
	if (ret)
		return ret;
	snprintf(name, sizeof(name), "model.layers.%u.self_attn.k_proj.weight",
		 i);
	ret = get_tensor(r, weights, name, r->kv_dim, r->m.hidden_size, &L->tk);
	if (ret)
		return ret;
	snprintf(name, sizeof(name), "model.layers.%u.self_attn.v_proj.weight",
		 i);
	ret = get_tensor(r, weights, name, r->kv_dim, r->m.hidden_size, &L->tv);
	if (ret)
		return ret;

	snprintf(name, sizeof(name), "model.layers.%u.self_attn.k_proj.bias", i);
	hk = !kvfs_st_get(r->st, name, &tbk);
	snprintf(name, sizeof(name), "model.layers.%u.self_attn.v_proj.bias", i);
	hv = !kvfs_st_get(r->st, name, &tbv);
	if (r->m.family == KVFS_FAMILY_QWEN2 && !(hk && hv)) {
		snprintf(name, sizeof(name), "model.layers.%u.self_attn.%s_proj.bias",
			 i, hk ? "v" : "k");
		return load_bad(weights, name,
				"missing from the checkpoint (qwen2 has K/V biases)");
	}
	if (hk != hv) {
		snprintf(name, sizeof(name), "model.layers.%u.self_attn.%s_proj.bias",
			 i, hk ? "v" : "k");
		return load_bad(weights, name,
				"missing while the other projection has a bias");
	}
	if (hk) {
		snprintf(name, sizeof(name),
			 "model.layers.%u.self_attn.k_proj.bias", i);
		ret = get_tensor(r, weights, name, r->kv_dim, 0, &tbk);
		if (ret)
			return ret;
		snprintf(name, sizeof(name),
			 "model.layers.%u.self_attn.v_proj.bias", i);
		ret = get_tensor(r, weights, name, r->kv_dim, 0, &tbv);
		if (ret)
			return ret;
	}

	L->norm = tensor_f32(r, &tn);
	if (!L->norm)
		return -ENOMEM;
	if (hk) {
		L->bk = tensor_f32(r, &tbk);
		L->bv = tensor_f32(r, &tbv);
		if (!L->bk || !L->bv)
			return -ENOMEM;
	}
	ret = weight_f32(r, &L->tk, &L->wk, &L->wk_owned);
	if (ret)
		return ret;
	return weight_f32(r, &L->tv, &L->wv, &L->wv_owned);
}

int kvfs_restore_load(const struct kvfs_restore_model *m, const char *weights,
		      unsigned flags, struct kvfs_restore **out)
{
	struct kvfs_st_tensor extra;
	struct kvfs_restore *r;
	char name[160];
	int ret;

	if (!m || !weights || !out)
		return -EINVAL;
	ret = kvfs_restore_model_check(m);
	if (ret)
		return ret;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->m = *m;
	r->kv_dim = m->n_kv_heads * m->head_dim;
	r->flags = flags;
	r->id = atomic_fetch_add(&next_id, 1);
	r->layers = calloc(m->n_layers, sizeof(*r->layers));
	r->inv_freq = calloc(m->head_dim / 2, sizeof(double));
	if (!r->layers || !r->inv_freq) {
		ret = -ENOMEM;
		goto out_free;
	}
	rope_inv_freq(m, r->inv_freq);
	ret = kvfs_st_open(weights, &r->st);
	if (ret) {
		kvfs_err("restore %s: checkpoint refused", weights);
		goto out_free;
	}
	snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight",
		 m->n_layers);
	if (!kvfs_st_get(r->st, name, &extra)) {
		ret = load_bad(weights, name,
			       "present, but the namespace has %u layers",
			       m->n_layers);
		goto out_free;
	}
	for (uint32_t i = 0; i < m->n_layers; i++) {
		ret = load_layer(r, weights, i);
		if (ret) {
			if (ret == -ENOMEM)
				kvfs_err("restore %s: out of memory converting weights",
					 weights);
			goto out_free;
		}
	}
	kvfs_info("restore %s: %u layers, kv_dim %u, hidden %u, %llu bytes of f32 weights%s",
		  weights, m->n_layers, r->kv_dim, m->hidden_size,
		  (unsigned long long)r->mem_bytes,
		  (flags & KVFS_RESTORE_LAZY) ? " (lazy K/V conversion)" : "");
	*out = r;
	return 0;
out_free:
	kvfs_restore_free(r);
	return ret;
}

void kvfs_restore_free(struct kvfs_restore *r)
{
	if (!r)
		return;
	if (r->layers) {
		for (uint32_t i = 0; i < r->m.n_layers; i++) {
			struct layer_w *L = &r->layers[i];

			if (L->wk_owned)
				free((void *)L->wk);
			if (L->wv_owned)
				free((void *)L->wv);
			free(L->norm);
			free(L->bk);
			free(L->bv);
		}
	}
	free(r->layers);
	free(r->inv_freq);
	kvfs_st_free(r->st);
	free(r);
}

uint64_t kvfs_restore_mem_bytes(const struct kvfs_restore *r)
{
	return r ? r->mem_bytes : 0;
}

const struct kvfs_restore_model *kvfs_restore_model(
	const struct kvfs_restore *r)
{
	return r ? &r->m : NULL;
}

int kvfs_restore_layer_weights(const struct kvfs_restore *r, uint32_t layer,
			       struct kvfs_restore_weights *out)
{
	const struct layer_w *L;

	if (!r || !out || layer >= r->m.n_layers)
		return -EINVAL;
	L = &r->layers[layer];
	out->norm = L->norm;
	out->bk = L->bk;
	out->bv = L->bv;
	out->wk = L->wk ? (const void *)L->wk : L->tk.data;
	out->wk_dtype = L->wk ? KVFS_DTYPE_F32 :
		(uint16_t)st_to_kvfs_dtype(L->tk.dtype);
	out->wv = L->wv ? (const void *)L->wv : L->tv.data;
	out->wv_dtype = L->wv ? KVFS_DTYPE_F32 :
		(uint16_t)st_to_kvfs_dtype(L->tv.dtype);
	return 0;
}

void kvfs_restore_rope_inv_freq(const struct kvfs_restore_model *m,
				double *inv)
{
	rope_inv_freq(m, inv);
}

/* ---------------------------------------------------------- workspace */

int kvfs_restore_ws_alloc(struct kvfs_restore_ws **out)
{
	if (!out)
		return -EINVAL;
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

void kvfs_restore_ws_free(struct kvfs_restore_ws *ws)
{
	if (!ws)
		return;
	free(ws->xn);
	free(ws->k);
	free(ws->v);
	free(ws->w);
	free(ws->cs);
	free(ws);
}

/* Grow *@buf to @n floats; contents are not kept.  64-byte alignment
 * suits the GEMM kernels.
 */
static int ws_grow(float **buf, size_t *cap, size_t n)
{
	void *p;

	if (*cap >= n)
		return 0;
	if (n > SIZE_MAX / sizeof(float))
		return -ENOMEM;
	if (posix_memalign(&p, 64, n * sizeof(float)))
		return -ENOMEM;
	free(*buf);
	*buf = p;
	*cap = n;
	return 0;
}

/* ------------------------------------------------------------ compute */

static uint64_t layer_rows(uint32_t n_tokens, uint32_t chunk_tokens)
{
	if (!n_tokens || !chunk_tokens)
		return 0;
	return ((uint64_t)n_tokens + chunk_tokens - 1) / chunk_tokens *
	       chunk_tokens;
}

static uint64_t layer_bytes(uint32_t n_tokens, uint32_t chunk_tokens,
			    uint64_t row_elems, uint16_t dtype)
{
	uint64_t rows = layer_rows(n_tokens, chunk_tokens), b;
	size_t es = kvfs_fmt_dtype_size(dtype);

	if (!rows || !es || !row_elems)
		return 0;
	if (__builtin_mul_overflow(rows, row_elems, &b) ||
	    __builtin_mul_overflow(b, (uint64_t)es, &b))
		return 0;
	return b;
}

uint64_t kvfs_restore_hidden_layer_bytes(const struct kvfs_restore_model *m,
					 uint32_t n_tokens,
					 uint32_t chunk_tokens, uint16_t dtype)
{
	if (!m)
		return 0;
	return layer_bytes(n_tokens, chunk_tokens, m->hidden_size, dtype);
}

uint64_t kvfs_restore_kv_layer_bytes(const struct kvfs_restore_model *m,
				     uint32_t n_tokens, uint32_t chunk_tokens,
				     uint16_t dtype)
{
	if (!m)
		return 0;
	return layer_bytes(n_tokens, chunk_tokens,
			   2ull * m->n_kv_heads * m->head_dim, dtype);
}

static int ws_prepare(const struct kvfs_restore *r, struct kvfs_restore_ws *ws,
		      uint64_t start_pos, uint32_t n)
{
	uint32_t half = r->m.head_dim / 2;
	size_t xn, kv, cs;

	if (__builtin_mul_overflow((size_t)n, (size_t)r->m.hidden_size, &xn) ||
	    __builtin_mul_overflow((size_t)n, (size_t)r->kv_dim, &kv) ||
	    __builtin_mul_overflow((size_t)n, (size_t)half * 2, &cs))
		return -ENOMEM;
	if (ws_grow(&ws->xn, &ws->xn_cap, xn) ||
	    ws_grow(&ws->k, &ws->k_cap, kv) ||
	    ws_grow(&ws->v, &ws->v_cap, kv))
		return -ENOMEM;
	if ((r->flags & KVFS_RESTORE_LAZY) &&
	    ws_grow(&ws->w, &ws->w_cap, (size_t)r->kv_dim * r->m.hidden_size))
		return -ENOMEM;
	if (ws->cs_id == r->id && ws->cs_pos == start_pos && ws->cs_n == n)
		return 0;
	ws->cs_id = 0;
	if (ws_grow(&ws->cs, &ws->cs_cap, cs))
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		double pos = (double)(start_pos + i);
		float *row = ws->cs + (size_t)i * half * 2;

		for (uint32_t j = 0; j < half; j++) {
			double a = pos * r->inv_freq[j];

			row[2 * j] = (float)cos(a);
			row[2 * j + 1] = (float)sin(a);
		}
	}
	ws->cs_id = r->id;
	ws->cs_pos = start_pos;
	ws->cs_n = n;
	return 0;
}

static void rms_norm(const struct kvfs_restore *r, const float *norm,
		     float *x, uint32_t n)
{
	uint32_t hs = r->m.hidden_size;

	for (uint32_t i = 0; i < n; i++) {
		float *row = x + (size_t)i * hs;
		double ss = 0;
		float scale;

		for (uint32_t j = 0; j < hs; j++)
			ss += (double)row[j] * row[j];
		scale = (float)(1.0 / sqrt(ss / hs + r->m.rms_norm_eps));
		for (uint32_t j = 0; j < hs; j++)
			row[j] = row[j] * scale * norm[j];
	}
}

/* out[n][kv_dim] = xn[n][hidden] . w[kv_dim][hidden]^T (+ bias). */
static void project(const struct kvfs_restore *r, const float *xn,
		    const float *w, const float *bias, float *out, uint32_t n)
{
	uint32_t d = r->kv_dim, hs = r->m.hidden_size;

	if (bias)
		for (uint32_t i = 0; i < n; i++)
			memcpy(out + (size_t)i * d, bias, d * sizeof(float));
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)d,
		    (int)hs, 1.0f, xn, (int)hs, w, (int)hs, bias ? 1.0f : 0.0f,
		    out, (int)d);
}

static void rope(const struct kvfs_restore *r, const float *cs, float *k,
		 uint32_t n)
{
	uint32_t hd = r->m.head_dim, half = hd / 2;

	for (uint32_t i = 0; i < n; i++) {
		const float *c = cs + (size_t)i * half * 2;

		for (uint32_t h = 0; h < r->m.n_kv_heads; h++) {
			float *q = k + (size_t)i * r->kv_dim + (size_t)h * hd;

			for (uint32_t j = 0; j < half; j++) {
				float a = q[j], b = q[j + half];
				float co = c[2 * j], si = c[2 * j + 1];

				q[j] = a * co - b * si;
				q[j + half] = b * co + a * si;
			}
		}
	}
}

/* The lazy path's weights: the mapping if usable as is, else converted. */
static const float *layer_weight(const struct kvfs_restore *r,
				 struct kvfs_restore_ws *ws, const float *res,
				 const struct kvfs_st_tensor *t)
{
	if (res)
		return res;
	kvfs_restore_to_f32(t->data, (uint16_t)st_to_kvfs_dtype(t->dtype),
			    ws->w, t->numel);
	return ws->w;
}

static void scatter(const struct kvfs_restore *r, const float *k,
		    const float *v, uint32_t n, uint32_t c, uint8_t *out,
		    uint16_t dtype)
{
	size_t es = kvfs_fmt_dtype_size(dtype), d = r->kv_dim;
	size_t row = d * es;
	uint64_t rows = layer_rows(n, c);

	for (uint64_t ch = 0; ch < rows / c; ch++) {
		uint8_t *kb = out + ch * 2 * c * row, *vb = kb + c * row;

		for (uint32_t i = 0; i < c; i++) {
			uint64_t tok = ch * c + i;

			if (tok < n) {
				kvfs_restore_from_f32(k + tok * d, dtype,
						      kb + i * row, d);
				kvfs_restore_from_f32(v + tok * d, dtype,
						      vb + i * row, d);
			} else {
				memset(kb + i * row, 0, row);
				memset(vb + i * row, 0, row);
			}
		}
	}
}

static int args_bad(const char *why)
{
	kvfs_err("restore: request refused: %s", why);
	return -EINVAL;
}

const char *kvfs_restore_request_why(const struct kvfs_restore_model *m,
				     uint16_t x_dtype, uint64_t start_pos,
				     uint32_t n_tokens, uint32_t chunk_tokens,
				     uint16_t kv_dtype)
{
	if (!kvfs_fmt_dtype_size(x_dtype))
		return "unknown hidden-state dtype";
	if (!kvfs_fmt_dtype_size(kv_dtype))
		return "unknown KV dtype";
	if (!n_tokens || n_tokens > INT32_MAX)
		return "n_tokens out of range";
	if (!chunk_tokens)
		return "chunk_tokens is 0";
	if (start_pos > MAX_POS || n_tokens > MAX_POS - start_pos)
		return "positions beyond 2^53";
	if (!kvfs_restore_hidden_layer_bytes(m, n_tokens, chunk_tokens,
					     x_dtype) ||
	    !kvfs_restore_kv_layer_bytes(m, n_tokens, chunk_tokens, kv_dtype))
		return "payload size overflows";
	return NULL;
}

static int check_args(const struct kvfs_restore *r, uint16_t x_dtype,
		      uint64_t start_pos, uint32_t n_tokens,
		      uint32_t chunk_tokens, uint16_t kv_dtype)
{
	const char *why = kvfs_restore_request_why(&r->m, x_dtype, start_pos,
						   n_tokens, chunk_tokens,
						   kv_dtype);

	return why ? args_bad(why) : 0;
}

static int do_layer(const struct kvfs_restore *r, struct kvfs_restore_ws *ws,
		    uint32_t layer, const void *x, uint16_t x_dtype,
		    uint64_t start_pos, uint32_t n, uint32_t c, void *kv,
		    uint16_t kv_dtype)
{
	const struct layer_w *L = &r->layers[layer];
	const float *w;
	int ret;

	ret = ws_prepare(r, ws, start_pos, n);
	if (ret)
		return ret;
	/* Only the n real rows are read: chunk padding is not looked at. */
	kvfs_restore_to_f32(x, x_dtype, ws->xn, (size_t)n * r->m.hidden_size);
	rms_norm(r, L->norm, ws->xn, n);
	w = layer_weight(r, ws, L->wk, &L->tk);
	project(r, ws->xn, w, L->bk, ws->k, n);
	w = layer_weight(r, ws, L->wv, &L->tv);
	project(r, ws->xn, w, L->bv, ws->v, n);
	rope(r, ws->cs, ws->k, n);
	scatter(r, ws->k, ws->v, n, c, kv, kv_dtype);
	return 0;
}

int kvfs_restore_layer(const struct kvfs_restore *r,
		       struct kvfs_restore_ws *ws, uint32_t layer,
		       const void *x, uint16_t x_dtype, uint64_t start_pos,
		       uint32_t n_tokens, uint32_t chunk_tokens, void *kv,
		       uint16_t kv_dtype)
{
	struct kvfs_restore_ws *tmp = NULL;
	int ret;

	if (!r || !x || !kv)
		return -EINVAL;
	if (layer >= r->m.n_layers)
		return args_bad("layer out of range");
	ret = check_args(r, x_dtype, start_pos, n_tokens, chunk_tokens,
			 kv_dtype);
	if (ret)
		return ret;
	if (!ws) {
		ret = kvfs_restore_ws_alloc(&tmp);
		if (ret)
			return ret;
		ws = tmp;
	}
	ret = do_layer(r, ws, layer, x, x_dtype, start_pos, n_tokens,
		       chunk_tokens, kv, kv_dtype);
	kvfs_restore_ws_free(tmp);
	return ret;
}

int kvfs_restore_block(const struct kvfs_restore *r,
		       struct kvfs_restore_ws *ws,
		       const struct kvfs_restore_io *io)
{
	struct kvfs_restore_ws *tmp = NULL;
	uint64_t hl, kl, first, count;
	int ret;

	if (!r || !io || !io->hidden || !io->kv)
		return -EINVAL;
	ret = check_args(r, io->hidden_dtype, io->start_pos, io->n_tokens,
			 io->chunk_tokens, io->kv_dtype);
	if (ret)
		return ret;
	if (io->flags & (KVFS_RC_HIDDEN_DEVICE | KVFS_RC_KV_DEVICE))
		return args_bad("device memory on the CPU");
	hl = kvfs_restore_hidden_layer_bytes(&r->m, io->n_tokens,
					     io->chunk_tokens,
					     io->hidden_dtype);
	kl = kvfs_restore_kv_layer_bytes(&r->m, io->n_tokens,
					 io->chunk_tokens, io->kv_dtype);
	/* n_layers <= 4096 and a layer < 2^64 / 4096 is checked here. */
	if (hl > UINT64_MAX / r->m.n_layers || kl > UINT64_MAX / r->m.n_layers)
		return args_bad("payload size overflows");
	if (io->hidden_len != hl * r->m.n_layers)
		return args_bad("hidden payload length does not match the geometry");
	if (io->kv_len != kl * r->m.n_layers)
		return args_bad("KV payload length does not match the geometry");
	first = io->first_layer;
	if (first >= r->m.n_layers)
		return args_bad("first layer out of range");
	count = io->n_layers ? io->n_layers : r->m.n_layers - first;
	if (count > r->m.n_layers - first)
		return args_bad("layer range out of bounds");
	if (!ws) {
		ret = kvfs_restore_ws_alloc(&tmp);
		if (ret)
			return ret;
		ws = tmp;
	}
	for (uint64_t l = first; l < first + count; l++) {
		ret = do_layer(r, ws, (uint32_t)l,
			       (const uint8_t *)io->hidden + l * hl,
			       io->hidden_dtype, io->start_pos, io->n_tokens,
			       io->chunk_tokens, (uint8_t *)io->kv + l * kl,
			       io->kv_dtype);
		if (ret)
			break;
	}
	kvfs_restore_ws_free(tmp);
	return ret;
}

int kvfs_restore_split(const struct kvfs_restore *r,
		       struct kvfs_restore_ws *ws,
		       const struct kvfs_restore_split_io *io)
{
	struct kvfs_restore_ws *tmp = NULL;
	const uint8_t *src;
	uint8_t *dst;
	uint64_t hl, kl, n;
	int ret;

	if (!r || !io || !io->src || !io->dst)
		return -EINVAL;
	ret = check_args(r, io->dtype, io->start_pos, io->n_tokens,
			 io->chunk_tokens, io->dtype);
	if (ret)
		return ret;
	n = r->m.n_layers;
	if (io->src_kv_from > n || io->dst_kv_from > io->src_kv_from)
		return args_bad("split layers out of order or out of range");
	hl = kvfs_restore_hidden_layer_bytes(&r->m, io->n_tokens,
					     io->chunk_tokens, io->dtype);
	kl = kvfs_restore_kv_layer_bytes(&r->m, io->n_tokens,
					 io->chunk_tokens, io->dtype);
	/* As in kvfs_restore_block(): n <= 4096 layers. */
	if (hl > UINT64_MAX / n || kl > UINT64_MAX / n)
		return args_bad("payload size overflows");
	if (io->src_len != hl * io->src_kv_from + kl * (n - io->src_kv_from))
		return args_bad("source payload length does not match the "
				"geometry");
	if (io->dst_len != hl * io->dst_kv_from + kl * (n - io->dst_kv_from))
		return args_bad("destination payload length does not match "
				"the geometry");
	src = io->src;
	dst = io->dst;
	/* Hidden layers both forms keep, then those restored, then the KV
	 * layers both keep: the offsets advance by each layer's form.
	 */
	memcpy(dst, src, hl * io->dst_kv_from);
	src += hl * io->dst_kv_from;
	dst += hl * io->dst_kv_from;
	if (io->dst_kv_from < io->src_kv_from && !ws) {
		ret = kvfs_restore_ws_alloc(&tmp);
		if (ret)
			return ret;
		ws = tmp;
	}
	for (uint32_t l = io->dst_kv_from; l < io->src_kv_from; l++) {
		ret = do_layer(r, ws, l, src, io->dtype, io->start_pos,
			       io->n_tokens, io->chunk_tokens, dst, io->dtype);
		if (ret)
			goto out_free_ws;
		src += hl;
		dst += kl;
	}
	memcpy(dst, src, kl * (n - io->src_kv_from));
out_free_ws:
	kvfs_restore_ws_free(tmp);
	return ret;
}

void kvfs_restore_set_blas_threads(int n)
{
	if (n <= 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		n = cpus < 1 ? 1 : cpus > 4 ? 4 : (int)cpus;
	}
	openblas_set_num_threads(n);
}
