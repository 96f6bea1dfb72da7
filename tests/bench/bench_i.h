/* SPDX-License-Identifier: MIT */
/*
 * What every benchmark program shares: a monotonic clock, medians, and
 * the figure lines, printed and appended to the summary file that
 * tests/bench/run.sh turns into its closing table
 * ("label|kvfs|baseline|unit|ratio|target").
 */
#ifndef KVFS_TESTS_BENCH_I_H
#define KVFS_TESTS_BENCH_I_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The upper median of @n >= 1 samples; sorts @v. */
static inline double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
	return v[n / 2];
}

/*
 * Print one figure (kvfs, baseline, their ratio) and append it to @file
 * (NULL: print only).  @target is the goal for the ratio, or "-".
 */
static inline void bench_summary(const char *file, const char *label,
				 double k, double b, const char *unit,
				 const char *target)
{
	FILE *f = file ? fopen(file, "a") : NULL;

	printf("    kvfs      %12.2f %s\n    baseline  %12.2f %s\n"
	       "    ratio     %12.2f\n",
	       k, unit, b, unit, b > 0 ? k / b : 0);
	if (!f)
		return;
	fprintf(f, "%s|%.2f|%.2f|%s|%.2f|%s\n", label, k, b, unit,
		b > 0 ? k / b : 0, target ? target : "-");
	fclose(f);
}

#endif
