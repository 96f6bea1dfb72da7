/* SPDX-License-Identifier: MIT */
/*
 * Private to kvfs's own policy (policy_kvfs.c, and its gates in
 * policy_kvfs_gate.c): the lists and flags a block carries, the options,
 * the policy's state, and the gates' calls.
 *
 * Locking: none of its own; every call runs under the caller's policy
 * lock, like every policy call (policy_i.h).
 */
#ifndef KVFS_CACHE_POLICY_KVFS_I_H
#define KVFS_CACHE_POLICY_KVFS_I_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/policy.h"
#include "cache/policy_i.h"

enum { KV_TAIL = 1, KV_PROB = 2, KV_MAIN = 3 };

#define KV_WINDOW 8 /* sketch horizon, in capacities */
#define KV_PROB_SHARE 0 /* per mille of a tier kept for probation */
#define KV_SPAN 32 /* sketch sized for this horizon with shadows on */
#define KV_NCAND 2 /* horizons the shadows try (kv_cand[]) */
#define KV_MINI_MIN 512 /* smallest shadow, in blocks */
#define KV_MINI_SHIFT 10 /* sample at most 1/1024 of the chains */
#define KV_MINI_DECAY 4 /* a shadow's score loses 1/16 per epoch */
#define KV_MINI_HYST 50 /* per mille a shadow must lead by to be adopted */
#define KV_CONV_PASSES 1 /* most CLOCK passes of a conversation's block */
/* Tokens of depth at which recomputing a token costs twice what it costs
 * at the root: P / (2 L d) for Llama-3-8B (P 8.03e9 parameters, L 32
 * layers, d 4,096), the simulator's default model.
 */
#define KV_DEEP 30632
#define KV_DEEP_MAX 3 /* most passes depth buys, as many as hits can */
/* hist[1]: the new suffixes seen under a block (capped), and flags. */
#define KV_FAN_MAX 255
#define KV_FAN_MASK 0xffull
#define KV_SHARED (1ull << 8) /* it or a descendant has had two suffixes */
#define KV_CONV (1ull << 9) /* a conversation's block: a turn or below one */
#define KV_REFILL (1ull << 10) /* refilled context held in probation */
#define KV_REF (1ull << 11) /* referenced before: the stamp is set */
#define KV_REF_SHIFT 12 /* the stamp: fills from nowhere at last reference */
#define KV_REF_MASK ((1ull << 32) - 1)
/* Classed by the turn rule (the suffix rule), never referenced before
 * (the history table does not know it), and not read again since. */
#define KV_CTURN (1ull << 44)
#define KV_CSUFX (1ull << 45)
#define KV_FFIRST (1ull << 46) /* a first sight, not read again yet */
#define KV_SFIRST (1ull << 47) /* a new session's block, not read again yet */
/* What the history table keeps of a block let go: all but KV_REFILL. */
#define KV_KEEP (((1ull << 48) - 1) & ~KV_REFILL)
#define KV_HIST_SHIFT 2 /* history slots: 4 per sketch counter of a row */
#define KV_GATE_MIN 64 /* samples the refill gate wants on each side */
#define KV_GATE_DECAY 4 /* its sums halve every 4 capacities of fills */
/* The refill gate holds refills only when the mean gap exceeds main's
 * reach by this factor (4/3).
 */
#define KV_GATE_NUM 4
#define KV_GATE_DEN 3
/* How long first sights stay: their returns counted by gap in bins of
 * 1/KV_STAY_BINS of the capacity (the last bin: a capacity or more), and
 * the residence chosen again every KV_STAY_EVERY fills, at most half the
 * capacity.
 */
#define KV_STAY_BINS 64
#define KV_STAY_EVERY 256
#define KV_STAY_SMOOTH 16 /* the lead moves 1/16 of the way each time */
#define KV_ASIDE_WARM 2 /* capacities of fills before aside's share counts */
/* The rules whose blocks step aside into probation (`aside`): [KV_AS_TURN]
 * a conversation's next turn, [KV_AS_SUFFIX] a shared prefix's new suffix.
 */
enum { KV_AS_TURN, KV_AS_SUFFIX, KV_AS_N };

enum kvfs_pkvfs_opt {
	KO_MINI, /* 1: shadows choose the horizon */
	KO_WINDOW, /* the horizon, in capacities; setting it fixes it */
	KO_SPAN, /* the horizon the sketch's width is sized for; 0: derived */
	KO_PROB, /* per mille of a tier kept for probation */
	KO_GHOST, /* admission on second sight */
	KO_TAIL, /* partial first-sight tails on the evicted-first list */
	KO_SUFFIX, /* suffixes of shared prefixes on that list too */
	KO_TURN, /* a conversation's next turn enters main */
	KO_CONV, /* most CLOCK passes of a conversation's block */
	KO_LEAF, /* victims only among leaves */
	KO_LRU, /* main as an LRU instead of a CLOCK */
	KO_CREDIT, /* CLOCK passes a returning block gets from its history */
	KO_REFILL, /* refilled context: 0 to main, 1 gated, 2 always held */
	KO_HIST, /* keep what is known of blocks let go (the history table) */
	KO_SESS, /* new sessions: 0 evicted first, 1 gated, 2 always to main */
	KO_SIGHT, /* the fleet's sightings: 1 in the sketch, 2 and as passes
		   * in main, 3 and as hits */
	KO_RECENT, /* blocks let go lately, kept as ARC's ghosts, are seen */
	KO_DEEP, /* tokens of depth that buy a block in main one more pass */
	KO_STAY, /* first sights stay while their returns pay as main does:
		  * 2 each bin's against main's margin, 1 those from the
		  * first bin on against main's mean */
	KO_ASIDE, /* the turn and suffix rules step aside while probation
		   * keeps what they would */
	KO_N
};

struct kvfs_pkvfs_tier {
	struct kvfs_plist l[4]; /* indexed by KV_*; [0] unused */
};

struct kvfs_pkvfs {
	struct kvfs_pkvfs_tier t[KVFS_NTIERS];
	struct kvfs_pclock clock;
	struct kvfs_psketch sk;
	struct kvfs_phist hist; /* hist[1] of blocks let go, by key */
	uint32_t maxtok; /* largest block seen, in tokens */
	uint64_t ins, insz; /* fills from nowhere and their total size */
	uint32_t opt[KO_N]; /* as set, then defaults (init) */
	uint32_t opt_set; /* 1 << KO_*: given by the caller */
	/* what init derives from opt[] */
	uint32_t window; /* the horizon now (the shadows move it) */
	uint32_t span; /* the sketch's width is sized for this horizon */
	/* Miniature simulations: one shadow per candidate horizon. */
	struct kvfs_pmini sh[KV_NCAND];
	uint64_t score[KV_NCAND]; /* decayed hits, x 256 */
	uint64_t mrefs, epoch; /* sampled references: since, between choices */
	uint32_t cur; /* the candidate in use */
	bool mini, mini_on, mini_fail; /* wanted; running; could not start */
	/* The refill gate: a conversation's mean gap between references
	 * against main's reach, both in fills from nowhere, decayed.
	 */
	uint64_t fills; /* fills from nowhere, ever */
	uint64_t gap_sum, gap_n; /* conversations' references: gaps, count */
	uint64_t main_in, main_fills; /* entries into main; fills */
	/* The refills of the request in progress held in probation: the
	 * deepest (NULL: none) and its request.  Its ancestors flagged
	 * KV_REFILL are the rest; kv_forget() clears it before any of them
	 * can be freed.
	 */
	struct kvfs_pnode *rf_last;
	uint64_t rf_req;
	/* The session gate: how long after their first sight the blocks of
	 * new sessions under a shared prefix are read again, summed over
	 * those read again, and their count; decayed with the refill gate.
	 */
	uint64_t ses_sum, ses_n;
	/* How long first sights stay in probation (`stay`,
	 * kvfs_pkvfs_stay()): the returns of first sights by gap since
	 * their first sight, the first sights, and the hits on main, decayed
	 * with the refill gate; the capacity in blocks the gaps were binned
	 * by; and the blocks probation keeps (0: it goes first whenever the
	 * tier is full).
	 */
	uint64_t st_ret[KV_STAY_BINS + 1], st_first, st_main;
	/* Main's margin (`stay=2`): main's blocks with no CLOCK pass left,
	 * over every tier, the next the hand takes (kept at every change
	 * of a count or of a list), and this host's hits on them, decayed
	 * with st_main.
	 */
	uint64_t st_idle, st_idle_hits;
	uint64_t st_cap, st_keep;
	double st_lead; /* the best return rate over main's, smoothed */
	/* Whether the turn and suffix rules step aside (`aside`,
	 * kvfs_pkvfs_stay()): the returns of the blocks each classed, by gap
	 * in the bins of st_ret, decayed with it; the share of them that
	 * came within probation's residence, smoothed; and the verdict.
	 */
	uint64_t as_ret[KV_AS_N][KV_STAY_BINS + 1];
	double as_share[KV_AS_N];
	bool as_prob[KV_AS_N]; /* the rule's blocks enter probation */
	/* The blocks let go lately, as ARC keeps its ghosts (B1 and B2):
	 * [0] those let go from the first-sight lists, [1] from main.
	 */
	struct kvfs_pghost recent[2];
	/* The fleet's sightings (kv_sight()), apart from the host's own in
	 * sk so that hearing N - 1 other hosts does not halve sk N times as
	 * often.  Each halves after the same number of its own additions
	 * (sample, kv_horizon()), the load its width is sized for.
	 * Allocated at the first sighting (c NULL before, or when that
	 * failed: sightings are then only moves).
	 */
	struct kvfs_psketch fleet;
	bool fleet_tried;
};

/* Whether @n is a conversation's block that no shared prefix claimed. */
static inline bool kvfs_pkvfs_conv(const struct kvfs_pnode *n)
{
	return (n->hist[1] & (KV_CONV | KV_SHARED)) == KV_CONV;
}

/*
 * policy_kvfs_gate.c.  All take the policy's state @f (and @p, the
 * policy, for its capacities); none fails or allocates.
 *
 * kvfs_pkvfs_ref() - a reference to @n (a hit or a fill from nowhere):
 *   adds the gap since its last one to the means that want it (the
 *   refill gate's for a conversation's block, the session gate's for a
 *   new session's, stay's and aside's histograms for a first sight's
 *   first return), then stamps @n with the fills so far.
 * kvfs_pkvfs_blocks() - the capacity in blocks: the tiers' bytes over the
 *   mean block size filled so far.
 * kvfs_pkvfs_fill() - a fill from nowhere, classed into main (@to_main)
 *   or not; halves every mean every KV_GATE_DECAY capacities of fills.
 * kvfs_pkvfs_stay() - chooses again how many blocks probation keeps
 *   (st_keep) and whether the turn and suffix rules step aside
 *   (as_prob); called every KV_STAY_EVERY fills.
 * kvfs_pkvfs_gate() - whether a conversation's refilled context is held
 *   in probation (`refill`).
 * kvfs_pkvfs_sess_gate() - whether the first blocks of a new session
 *   under a shared prefix enter main (`sess`).
 */
void kvfs_pkvfs_ref(struct kvfs_pkvfs *f, struct kvfs_pnode *n);
uint64_t kvfs_pkvfs_blocks(const struct kvfs_policy *p,
			   const struct kvfs_pkvfs *f);
void kvfs_pkvfs_fill(struct kvfs_policy *p, struct kvfs_pkvfs *f, bool to_main);
void kvfs_pkvfs_stay(struct kvfs_policy *p, struct kvfs_pkvfs *f);
bool kvfs_pkvfs_gate(const struct kvfs_pkvfs *f);
bool kvfs_pkvfs_sess_gate(const struct kvfs_pkvfs *f);

#endif
