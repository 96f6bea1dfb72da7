/* SPDX-License-Identifier: MIT */
/*
 * Checkpoints and hidden states for the benchmarks of hidden-state
 * restoration (bench_hcache, bench_gpu_fetch --hidden): a safetensors
 * file of random BF16 weights with exactly the tensors restoration reads
 * (each layer's input_layernorm, k_proj and v_proj), and random BF16
 * hidden states, both from one fixed xorshift sequence so that every run
 * restores the same numbers.
 */
#ifndef KVFS_TESTS_BENCH_CKPT_I_H
#define KVFS_TESTS_BENCH_CKPT_I_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t bench_rng = 0x243f6a8885a308d3ull;

static inline uint64_t bench_rnd(void)
{
	bench_rng ^= bench_rng << 13;
	bench_rng ^= bench_rng >> 7;
	bench_rng ^= bench_rng << 17;
	return bench_rng;
}

/* A bf16 value of magnitude 2^-7..2^-5 (weights of a 4096-wide layer). */
static inline uint16_t bench_wval(void)
{
	uint64_t r = bench_rnd();

	return (uint16_t)((r & 1) << 15 | (uint64_t)(120 + r % 3) << 7 |
			  (r >> 8 & 0x7f));
}

/* @n bytes of bf16 hidden states of magnitude 2^-1..2^2, either sign. */
static inline void bench_fill_hidden(uint8_t *x, size_t n)
{
	uint16_t *p = (uint16_t *)x;

	for (size_t i = 0; i < n / 2; i++)
		p[i] = (uint16_t)((bench_rnd() & 1) << 15 |
				  (uint64_t)(126 + bench_rnd() % 3) << 7 |
				  (bench_rnd() & 0x7f));
}

/*
 * Write to @path a checkpoint of @L layers with hidden size @hid and
 * K/V width @kvd (n_kv_heads * head_dim), BF16.  0 or -EIO.
 */
static inline int bench_write_ckpt(const char *path, uint32_t L, uint32_t hid,
				   uint32_t kvd)
{
	size_t cap = 256 + (size_t)L * 3 * 200, o = 0;
	uint64_t off = 0, hlen;
	char *hdr = malloc(cap);
	uint16_t *buf = malloc((size_t)kvd * hid * 2);
	FILE *f = fopen(path, "wb");

	if (!hdr || !buf || !f)
		goto out_fail;
	o += (size_t)snprintf(hdr + o, cap - o, "{");
	for (uint32_t l = 0; l < L; l++) {
		uint64_t nb = hid * 2ull, wb = (uint64_t)kvd * hid * 2;

		o += (size_t)snprintf(
			hdr + o, cap - o,
			"%s\"model.layers.%u.input_layernorm.weight\":"
			"{\"dtype\":\"BF16\",\"shape\":[%u],\"data_offsets\":"
			"[%llu,%llu]},",
			l ? "," : "", l, hid, (unsigned long long)off,
			(unsigned long long)(off + nb));
		off += nb;
		for (int kv = 0; kv < 2; kv++) {
			o += (size_t)snprintf(
				hdr + o, cap - o,
				"\"model.layers.%u.self_attn.%c_proj.weight\":"
				"{\"dtype\":\"BF16\",\"shape\":[%u,%u],"
				"\"data_offsets\":[%llu,%llu]}%s",
				l, kv ? 'v' : 'k', kvd, hid,
				(unsigned long long)off,
				(unsigned long long)(off + wb), kv ? "" : ",");
			off += wb;
		}
	}
	o += (size_t)snprintf(hdr + o, cap - o, "}");
	while (o % 8)
		hdr[o++] = ' ';
	hlen = o;
	if (fwrite(&hlen, 8, 1, f) != 1 || fwrite(hdr, 1, o, f) != o)
		goto out_fail;
	for (uint32_t l = 0; l < L; l++) {
		for (uint32_t j = 0; j < hid; j++)
			buf[j] = 0x3f80; /* norm weights 1.0 */
		if (fwrite(buf, 2, hid, f) != hid)
			goto out_fail;
		for (int kv = 0; kv < 2; kv++) {
			for (size_t j = 0; j < (size_t)kvd * hid; j++)
				buf[j] = bench_wval();
			if (fwrite(buf, 2, (size_t)kvd * hid, f) !=
			    (size_t)kvd * hid)
				goto out_fail;
		}
	}
	free(hdr);
	free(buf);
	return fclose(f) ? -EIO : 0;
out_fail:
	free(hdr);
	free(buf);
	if (f)
		fclose(f);
	return -EIO;
}

#endif
