// SPDX-License-Identifier: MIT
/*
 * kvfs: the gates of kvfs's own policy (docs/policies.md, "kvfs"): what
 * the policy measures of the workload as it runs, and the rules it turns
 * on or off by it.  Each compares a decayed mean of the blocks' own
 * reuse with main's reach or main's hits, so one configuration serves
 * every trace and size.
 */
#include "cache/policy_kvfs_i.h"

/* The bin of st_ret and as_ret a first return @gap fills after the first
 * sight falls in; the last holds a capacity or more.
 */
static uint64_t kv_bin(const struct kvfs_pkvfs *f, uint64_t gap)
{
	uint64_t b = gap * KV_STAY_BINS / f->st_cap;

	return b < KV_STAY_BINS ? b : KV_STAY_BINS;
}

void kvfs_pkvfs_ref(struct kvfs_pkvfs *f, struct kvfs_pnode *n)
{
	uint64_t gap = (f->fills - (n->hist[1] >> KV_REF_SHIFT)) & KV_REF_MASK;

	if ((n->hist[1] & KV_REF) && kvfs_pkvfs_conv(n)) {
		f->gap_sum += gap;
		f->gap_n++;
	}
	if ((n->hist[1] & (KV_REF | KV_SFIRST)) == (KV_REF | KV_SFIRST)) {
		f->ses_sum += gap;
		f->ses_n++;
	}
	if ((n->hist[1] & KV_REF) && f->st_cap) {
		if (n->hist[1] & KV_FFIRST)
			f->st_ret[kv_bin(f, gap)]++;
		if (n->hist[1] & KV_CTURN)
			f->as_ret[KV_AS_TURN][kv_bin(f, gap)]++;
		if (n->hist[1] & KV_CSUFX)
			f->as_ret[KV_AS_SUFFIX][kv_bin(f, gap)]++;
	}
	/* The flags of a first sight (bits 44 to 47) go with the stamp. */
	n->hist[1] = (n->hist[1] & ((1ull << KV_REF_SHIFT) - 1)) | KV_REF |
		     ((f->fills & KV_REF_MASK) << KV_REF_SHIFT);
}

/* Capacity in blocks: the sum of the tiers' over the mean block size. */
uint64_t kvfs_pkvfs_blocks(const struct kvfs_policy *p,
			   const struct kvfs_pkvfs *f)
{
	uint64_t cap = 0, avg = f->ins ? f->insz / f->ins : 1;

	for (int t = 0; t < KVFS_NTIERS; t++)
		cap += p->capacity[t];
	return cap / (avg ? avg : 1);
}

/* A fill from nowhere, classed into main or not: the gate's counts, halved
 * every KV_GATE_DECAY capacities of fills so they follow the workload.
 */
void kvfs_pkvfs_fill(struct kvfs_policy *p, struct kvfs_pkvfs *f, bool to_main)
{
	f->fills++;
	f->main_fills++;
	f->main_in += to_main;
	if (f->main_fills > KV_GATE_DECAY * kvfs_pkvfs_blocks(p, f) + 1024) {
		f->main_fills >>= 1;
		f->main_in >>= 1;
		f->gap_sum >>= 1;
		f->gap_n >>= 1;
		f->ses_sum >>= 1;
		f->ses_n >>= 1;
		for (int i = 0; i <= KV_STAY_BINS; i++) {
			f->st_ret[i] >>= 1;
			for (int r = 0; r < KV_AS_N; r++)
				f->as_ret[r][i] >>= 1;
		}
		f->st_first >>= 1;
		f->st_main >>= 1;
		f->st_idle_hits >>= 1;
	}
}

/* Blocks in main, over every tier. */
static uint64_t kv_in_main(const struct kvfs_pkvfs *f)
{
	uint64_t n = 0;

	for (int t = 0; t < KVFS_NTIERS; t++)
		n += f->t[t].l[KV_MAIN].count;
	return n;
}

/* Main's reach, in fills from nowhere: how long main keeps a block it
 * does not hit (blocks in main over entries into main per fill: Little's
 * law).  Callers make sure main_in is not 0.
 */
static uint64_t kv_reach(const struct kvfs_pkvfs *f)
{
	return kv_in_main(f) * f->main_fills / f->main_in;
}

/* How many blocks probation keeps, so that first sights stay while
 * keeping them pays as well as main does.  Probation goes first whenever
 * the tier is full, so a first sight read again a few requests later (an
 * agent's next step, a retry) is already gone unless probation keeps
 * room.  Keeping first sights one bin (1/KV_STAY_BINS of the capacity
 * in fills) longer costs a bin x (first sights per fill) blocks taken
 * from main; it buys the returns that come in that bin.  The residence
 * is the longest d, in bins and at most half the capacity, whose last
 * bin's returns per block kept beat what main's blocks at its margin
 * earn in the same decayed period: hits on its blocks with no CLOCK pass
 * left per such block, the blocks the room would come out of (`stay=2`;
 * main's mean hits per block until 64 of each are counted).  Each bin
 * must pay for the room it takes.
 * `stay=1` (until 2026-11-28) asked it of the returns counted from the
 * first bin, whose early returns paid for late bins that did not: on the
 * agent generator at 5% it kept a sixth of the tier, whose last bin
 * returned at most a sixth of what main's blocks hit, mostly under a
 * twentieth, while the first returned 6 to 8 times as much
 * (docs/policies.md, "How long a first sight stays").  Returns that
 * residence in bins (0: probation keeps none).
 */
static uint64_t kv_stay(struct kvfs_pkvfs *f)
{
	uint64_t in_main, ret = 0, best = 0;
	double cost, main_rate, bar, peak = 0;

	f->st_keep = 0;
	if (!f->opt[KO_STAY] || !f->st_first || !f->main_fills)
		return 0;
	in_main = kv_in_main(f);
	/* Blocks one bin of residence costs, and main's hits per block. */
	cost = (double)f->st_first * ((double)f->st_cap / KV_STAY_BINS) /
	       (double)f->main_fills;
	main_rate = (double)f->st_main / (double)(in_main ? in_main : 1);
	if (cost <= 0)
		return 0;
	/* What a block of main earns at its margin: its blocks with no pass
	 * left are the next the hand takes, and the room a bin takes comes
	 * out of them.
	 */
	bar = main_rate;
	if (f->opt[KO_STAY] == 2 && f->st_idle >= KV_GATE_MIN &&
	    f->st_idle_hits >= KV_GATE_MIN)
		bar = (double)f->st_idle_hits / (double)f->st_idle;
	for (uint64_t k = 0; k < KV_STAY_BINS / 2; k++) {
		double rate, pay;

		ret += f->st_ret[k];
		if (ret < KV_GATE_MIN)
			continue;
		rate = (double)ret / (cost * (double)(k + 1));
		pay = f->opt[KO_STAY] == 1 ? rate : (double)f->st_ret[k] / cost;
		if (pay > bar)
			best = k + 1;
		if (rate > peak)
			peak = rate;
	}
	/* Smoothed, the best of those rates must lead main's by the refill
	 * gate's margin, or a trace whose first sights seldom come back
	 * soon keeps room on noise.
	 */
	f->st_lead += ((main_rate > 0 ? peak / main_rate : 0) - f->st_lead) /
		      KV_STAY_SMOOTH;
	if (KV_GATE_DEN * f->st_lead < KV_GATE_NUM)
		best = 0;
	f->st_keep = (uint64_t)((double)best * cost);
	return best;
}

/* Whether the turn rule and the suffix rule step aside: their blocks then
 * enter probation as any first sight does, instead of main (a next turn)
 * or the list evicted first (a shared prefix's new suffix).  Both rules
 * were made for a probation that keeps nothing: a next turn read again a
 * turn later would be gone from it, and a one-off query should go before
 * a new chain.  Where most of a rule's blocks that come back at all come
 * back within the residence probation keeps (@best bins, kv_stay()), as
 * an agent's next step does seconds after its last, probation already
 * keeps them for it: the turn rule then fills main with the 70% of next
 * steps that never come, and the suffix rule evicts a task before its
 * next step (docs/policies.md, "When the rules step aside").  The share
 * is smoothed as stay's lead is, and counts only once KV_ASIDE_WARM
 * capacities of fills have passed: the histograms' last bin holds returns
 * a capacity or more after the first sight, so before one capacity no
 * long gap can have been seen and every share looks high; after two, at
 * least half of the first sights counted have had a capacity to come
 * back in.  (Until 2026-11-28 it waited for a decay period, four
 * capacities: a third of a one-hour trace at 10%, run with the rules as
 * if probation kept nothing.)
 */
static void kv_aside(struct kvfs_pkvfs *f, uint64_t best)
{
	bool warm = f->fills >= KV_ASIDE_WARM * f->st_cap;

	for (int r = 0; r < KV_AS_N; r++) {
		uint64_t in = 0, all = 0;
		double share;

		for (uint64_t k = 0; k <= KV_STAY_BINS; k++) {
			all += f->as_ret[r][k];
			in += k < best ? f->as_ret[r][k] : 0;
		}
		share = all >= KV_GATE_MIN ? (double)in / (double)all : 0;
		f->as_share[r] += (share - f->as_share[r]) / KV_STAY_SMOOTH;
		f->as_prob[r] = f->opt[KO_ASIDE] && warm &&
				2 * f->as_share[r] >= 1;
	}
}

void kvfs_pkvfs_stay(struct kvfs_policy *p, struct kvfs_pkvfs *f)
{
	f->st_cap = kvfs_pkvfs_blocks(p, f);
	kv_aside(f, kv_stay(f));
}

/* Whether a gate with @n samples has seen enough to decide: both its own
 * mean and main's reach want KV_GATE_MIN.
 */
static bool kv_gate_ready(const struct kvfs_pkvfs *f, uint64_t n)
{
	return n >= KV_GATE_MIN && f->main_in >= KV_GATE_MIN;
}

/* Whether a conversation's refilled context is held in probation.  When
 * a conversation's blocks come back later than main's reach on average,
 * refilling them into main displaces blocks main would have hit and buys
 * few hits of their own.  The gaps are skewed (many sessions return
 * soon, a few much later), so a mean just past the reach still has most
 * of them back within it: the gate holds only when the mean is a third
 * longer (on Mooncake's conversation trace at 5% it hovers at 0.98 of
 * the reach, and holding there lost 0.005 of hit ratio; docs/policies.md,
 * thirteenth round).
 */
bool kvfs_pkvfs_gate(const struct kvfs_pkvfs *f)
{
	if (f->opt[KO_REFILL] != 1)
		return f->opt[KO_REFILL] == 2;
	if (!kv_gate_ready(f, f->gap_n))
		return false;
	return KV_GATE_DEN * (f->gap_sum / f->gap_n) >
	       KV_GATE_NUM * kv_reach(f);
}

/* Whether the first blocks of a new session under a shared prefix (a
 * system prompt) enter main.  They are evicted first while, on average,
 * they are read again later than main's reach: at a small cache the next
 * turn comes too late for any list to keep them, and they would only
 * displace what main holds.  When they come back sooner, second-sight
 * admission would lose that first reuse, and main keeps them as a
 * conversation's blocks.
 */
bool kvfs_pkvfs_sess_gate(const struct kvfs_pkvfs *f)
{
	if (f->opt[KO_SESS] != 1)
		return f->opt[KO_SESS] == 2;
	if (!kv_gate_ready(f, f->ses_n))
		return false;
	return f->ses_sum / f->ses_n < kv_reach(f);
}
