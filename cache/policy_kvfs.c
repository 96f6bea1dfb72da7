// SPDX-License-Identifier: MIT
/*
 * kvfs: kvfs's own policy for prefix KV caches (docs/policies.md, "kvfs").
 *
 * What a prefix cache knows and a CDN cache does not, and how it is used:
 *  - Admission on second sight.  A sketch of sightings (struct
 *    kvfs_psketch, keyed by the block key, halved every `window` x the
 *    cache's capacity in blocks) remembers every block the cache has seen,
 *    resident or not, in a fixed size.  A block filled from nowhere whose
 *    key was seen before enters main; a first sight enters probation,
 *    which is evicted first.  In a single tier, where a miss is always
 *    cached, probation is how a first sight is "not admitted": it holds
 *    the block until the next request needs room.
 *  - What was let go lately is remembered exactly.  The sketch halves its
 *    counts every `window` capacities, so a block seen once just before
 *    a halving is forgotten at once.  The keys of the blocks that left
 *    the last tier lately are also kept as ARC keeps its ghost lists
 *    (Megiddo & Modha, FAST '03): those let go from probation and the
 *    tail's list while they and those lists fit in a capacity, those
 *    let go from main while everything fits in two.  A block filled
 *    from nowhere that is among them is a second sight, whatever the
 *    sketch says (`recent` = 0: the sketch alone).
 *  - The request's tail.  The last block of a prompt is usually partial
 *    (fewer tokens than the largest block seen); the next turn extends it
 *    into a different block, so a first-sight partial block is the first
 *    to go (its own list), and is refused by a full lower tier.
 *  - The request's new suffix.  A first sight under a parent that is a
 *    known prefix (any parent but one still on its first sight in this
 *    tier) is the new part of a request that reused a prefix.  The first
 *    such suffix a block gets is a conversation's next turn: the turn
 *    after it will read it again, so it enters main (`turn` = 0: a first
 *    sight).  From the second on the block is a shared prefix (few-shot
 *    examples, a system prompt) and its suffixes are one-off queries,
 *    read again far less often (never on few-shot, 0.02 against 0.46 for
 *    new chains on the Mooncake trace).  Those join the tail's list,
 *    evicted first; hist[1] counts a block's suffixes.  A block under a
 *    parent on its first sight takes its parent's list.  A full one is
 *    still admitted below (`suffix` = 0: any first sight).
 *  - The conversation.  A turn and every block filled below it are a
 *    conversation's (KV_CONV), unless a second suffix made them a shared
 *    prefix (KV_SHARED, marked up to the root).  Their hits buy at most
 *    `conv` (1) CLOCK passes instead of 3: each turn reads the whole
 *    context again, so hits there say the session goes on, not that the
 *    block is popular, and a session that ended should leave at the
 *    next pass.
 *  - A new session.  The full blocks of a new suffix under a shared
 *    prefix (a system prompt every request begins with) are, on some
 *    traces, the first turn of a conversation, read again at its next.
 *    They are evicted first while, on average, their first reuse comes
 *    later than main's reach: then no list could keep them for it.  When
 *    it comes sooner, they enter main as a conversation's blocks, so the
 *    first reuse is a hit (`sess`: 0 never, 2 always).
 *  - A conversation's refilled context.  When a conversation's blocks
 *    come back, on average, a third later than main keeps a block it
 *    does not hit (its reach, by Little's law), a refill is held in
 *    probation while its request runs: if the request goes on past it
 *    with a new block (the next turn) it stays there, and main keeps the
 *    blocks many requests share; if not (a question asked again) it
 *    moves to main (`refill`: 0 always main, 2 always held).
 *  - History outlives the node.  The daemon frees a block's node when the
 *    block leaves the last tier; what the policy learnt of it (suffix
 *    count, conversation and shared flags, when it was last referenced)
 *    goes to a table keyed by the block key (struct kvfs_phist) and comes
 *    back when the same prefix is written again (`hist` = 0: forgotten).
 *    forget() leaves the node as a new one, so the simulator, whose nodes
 *    live on, knows no more than the daemon.
 *  - The prefix tree.  A child of an evicted parent is dead weight: a
 *    victim is taken from the head of its list even when it has resident
 *    children, and in the last tier the caller drops them with it, so a
 *    cold prefix leaves whole instead of being trimmed block by block
 *    (`leaf` = 1 restores the leaf-only rule of the other policies).  A
 *    block whose parent is resident nowhere is never admitted into a
 *    lower tier.  Shared system prompts need no rule of their own: every
 *    request through them touches them, so they stay hot in main.
 *  - Main is a CLOCK (a hit while resident buys one more pass, up to 3)
 *    over blocks seen at least twice; blocks of one request share an
 *    order stamp, deepest first.  `prob` (per mille) keeps a share of a
 *    tier for probation; the default 0 always evicts probation first.
 *  - What a miss costs.  A token deep in a prompt costs more to compute
 *    again than one near the root (attention reads the whole prefix):
 *    1 + h/`deep` times as much at depth h.  A block entering main gets a
 *    CLOCK pass for each whole `deep` tokens of its depth (up to 3), and
 *    its ancestors in main as many, so a long prompt read again is kept
 *    whole for longer than its hits alone would keep it (`deep` = 0:
 *    never).  A conversation's blocks get none: their cap (`conv`) is
 *    about the session, not the cost.
 *  - The fleet's references.  A key another host referenced
 *    (kvfs_policy_sight()) is a sighting, in a sketch of the fleet's own
 *    (so that N - 1 hosts' keys do not shorten the host's memory of its
 *    own), so a block the fleet has seen enters main at its first fill
 *    here; and a block this host holds in main gets one more CLOCK pass:
 *    demand on the fleet is demand a balancer will send here too.  A
 *    block on its first sight here stays there: the session that read
 *    it elsewhere goes on elsewhere (`sight`: 0 ignored, 1 the sketch
 *    only, 3 moved into main as by a hit of this host's).
 *
 *  - The horizon chooses itself.  How long a first sight is remembered
 *    (`window`) is what traces disagree on: some reuse a block many
 *    capacities later, some within a few.  Miniature simulations
 *    (policy_mini.c) run this policy with each candidate horizon (8 and
 *    16 capacities) over the prefix chains whose root hashes into a
 *    sample (the largest rate of 1/2^k that leaves a shadow 512 blocks),
 *    on capacities scaled alike; every shadow-capacity of sampled
 *    references the real policy takes the horizon of a shadow whose
 *    decayed hits lead by 5%.  With shadows on, the sketch is sized for
 *    32 capacities, so fewer first sights pass for second ones.
 *
 *  - How long a first sight stays.  Probation goes first whenever the
 *    tier is full, so a first sight read again a few requests later (an
 *    agent's next step) would be gone.  The gates (policy_kvfs_gate.c)
 *    count first sights' returns by their gap and keep room in
 *    probation for the longest residence whose returns per block kept
 *    beat main's hits per block (`stay`).  Where most of the blocks the
 *    turn rule or the suffix rule classed come back within that
 *    residence, the rule steps aside and its blocks enter probation
 *    like any first sight (`aside`).
 *
 * Options (for the ablation; the defaults are the one configuration used
 * for every trace and size): mini (1: shadows choose the horizon),
 * window (8; setting it fixes the horizon and turns the shadows off),
 * span (the horizon the sketch's width is sized for: 32 with shadows,
 * else window), prob (0), ghost (1), tail (1), suffix (1), turn (1),
 * conv (1), leaf (0), lru (0: 1 makes main an LRU), credit (0: CLOCK
 * passes a returning block gets from its sketch count), refill (1),
 * hist (1; the shadows run with 0), sess (1; the shadows run with 0),
 * sight (2: other hosts' references, kvfs_policy_sight(), count in the
 * sketch and as passes for blocks held in main; 1 the sketch only; 3 as
 * hits on every block held),
 * recent (1: blocks let go lately, kept as ARC's ghosts, are seen),
 * stay (2: probation keeps first sights while each bin of their
 * residence earns what main's blocks with no pass left do; 1: while the
 * returns from the first bin on beat main's mean; 0: off),
 * aside (1: the turn and suffix rules step aside while it keeps theirs),
 * deep (30632 tokens, Llama-3-8B's P / (2Ld); kvfs-sim sets it from its
 * model; 0: off).
 * Deterministic: no randomness (the sample is a hash of the root's key);
 * the same calls give the same victims.  Writes hist[0] of the nodes it
 * samples (policy_mini.c caches the sampling hash there) and hist[1] of
 * every block it classes (suffix count, flags, and the stamp of its last
 * reference); clears hist[1] in forget().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/policy.h"
#include "cache/policy_i.h"
#include "cache/policy_kvfs_i.h"
#include "meta/log.h"

/* The horizons (`window`) the shadows try; the first is the start. */
static const uint32_t kv_cand[KV_NCAND] = { 8, 16 };

/* The options, for the ablation: each a number from lo to hi, def when
 * not given (span's 0: derived in init).  One table serves parsing,
 * defaults and the shadows, which are handed every option so they run
 * the configuration the real policy runs.
 */
static const struct kv_optdef {
	const char *key;
	uint32_t lo, hi, def;
} kv_opts[KO_N] = {
	[KO_MINI] = { "mini", 0, 1, 1 },
	[KO_WINDOW] = { "window", 1, 1000000, KV_WINDOW },
	[KO_SPAN] = { "span", 1, 1000000, 0 },
	[KO_PROB] = { "prob", 0, 1000, KV_PROB_SHARE },
	[KO_GHOST] = { "ghost", 0, 1, 1 },
	[KO_TAIL] = { "tail", 0, 1, 1 },
	[KO_SUFFIX] = { "suffix", 0, 1, 1 },
	[KO_TURN] = { "turn", 0, 1, 1 },
	[KO_CONV] = { "conv", 0, 3, KV_CONV_PASSES },
	[KO_LEAF] = { "leaf", 0, 1, 0 },
	[KO_LRU] = { "lru", 0, 1, 0 },
	[KO_CREDIT] = { "credit", 0, 15, 0 },
	[KO_REFILL] = { "refill", 0, 2, 1 },
	[KO_HIST] = { "hist", 0, 1, 1 },
	[KO_SESS] = { "sess", 0, 2, 1 },
	[KO_SIGHT] = { "sight", 0, 3, 2 },
	[KO_RECENT] = { "recent", 0, 1, 1 },
	[KO_DEEP] = { "deep", 0, 1u << 30, KV_DEEP },
	[KO_STAY] = { "stay", 0, 2, 2 },
	[KO_ASIDE] = { "aside", 0, 1, 1 },
};

static bool kv_dead(const struct kvfs_pnode *n)
{
	return n->parent && !n->parent->tiers;
}

/* @q has had a second suffix: it is a shared prefix, and so is every
 * block above it.  Each block is marked once, so the walk stops at the
 * first one already marked.
 */
static void kv_share(struct kvfs_pnode *q)
{
	for (; q && !(q->hist[1] & KV_SHARED); q = q->parent)
		q->hist[1] |= KV_SHARED;
}

/* The sightings of @key the policy remembers: its own and the fleet's. */
static uint32_t kv_seen(const struct kvfs_pkvfs *f, const uint8_t key[16])
{
	uint32_t s = kvfs_psketch_get(&f->sk, key);

	if (f->fleet.c)
		s += kvfs_psketch_get(&f->fleet, key);
	return s;
}

/* Main's margin (st_idle): a block in main in @t with no pass left
 * counts while it is so.  Every change of a block's count or list in a
 * tier calls kv_idle_out() before it and kv_idle_in() after it.
 */
static void kv_idle_out(struct kvfs_pkvfs *f, const struct kvfs_pnode *x, int t)
{
	if (x->t[t].list == KV_MAIN && !x->t[t].idx)
		f->st_idle--;
}

static void kv_idle_in(struct kvfs_pkvfs *f, const struct kvfs_pnode *x, int t)
{
	if (x->t[t].list == KV_MAIN && !x->t[t].idx)
		f->st_idle++;
}

/* Clear KV_REFILL from @q up the chain; the blocks stay where they are. */
static void kv_refill_end(struct kvfs_pkvfs *f, struct kvfs_pnode *q)
{
	for (; q && (q->hist[1] & KV_REFILL); q = q->parent)
		q->hist[1] &= ~KV_REFILL;
	f->rf_last = NULL;
}

/* The held refills move to main: the request did not go on past them (a
 * question asked again, not a next turn), or they are a shared prefix.
 */
static void kv_refill_promote(struct kvfs_pkvfs *f)
{
	for (struct kvfs_pnode *x = f->rf_last; x && (x->hist[1] & KV_REFILL);
	     x = x->parent) {
		x->hist[1] &= ~KV_REFILL;
		for (int t = 0; t < KVFS_NTIERS; t++) {
			uint64_t st;

			if (!(x->tiers & (1u << t)) || x->t[t].list != KV_PROB)
				continue;
			st = kvfs_plist_stamp(x, t);
			kvfs_plist_unlink(&f->t[t].l[KV_PROB], x, t);
			x->t[t].list = KV_MAIN;
			x->t[t].idx = 0;
			kv_idle_in(f, x, t);
			kvfs_plist_place(&f->t[t].l[KV_MAIN], x, t, st);
			f->main_in++;
		}
	}
	f->rf_last = NULL;
}

/* A new request: the last one's held refills were not extended. */
static void kv_refill_flush(struct kvfs_pkvfs *f, const struct kvfs_paccess *a)
{
	if (f->rf_last && a && a->request != f->rf_req)
		kv_refill_promote(f);
}

/* A block filled from nowhere under @q, which holds refills.  @known: the
 * block was referenced before (the sketch may have forgotten it, the
 * history table did not): more of the same context, held with it.  A
 * block never seen: the request goes on past its context, a next turn,
 * and the refills stay in probation; unless @q has had a suffix before,
 * which makes it a shared prefix (a document's next question): then they
 * go to main and the block is a one-off query.
 */
static int kv_class_held(struct kvfs_pkvfs *f, struct kvfs_pnode *n,
			 struct kvfs_pnode *q, bool known)
{
	if (known) {
		n->hist[1] |= KV_REFILL;
		f->rf_last = n;
		return KV_PROB;
	}
	if ((q->hist[1] & KV_FAN_MASK) < KV_FAN_MAX)
		q->hist[1]++;
	if ((q->hist[1] & KV_FAN_MASK) > 1) {
		kv_share(q);
		kv_refill_promote(f);
		return KV_TAIL;
	}
	kv_refill_end(f, q);
	return KV_PROB;
}

/* The list a block enters @tier on, seen @seen times before (@known: it
 * was referenced before, as the history table remembers).  A suffix
 * of a known prefix is counted in that parent's hist[1]; a conversation's
 * next turn is marked KV_CONV.
 */
static int kv_class(struct kvfs_pkvfs *f, struct kvfs_pnode *n, uint32_t seen,
		    int tier, bool known)
{
	struct kvfs_pnode *q = n->parent;

	if (!f->opt[KO_GHOST] || seen >= 1)
		return KV_MAIN;
	if (f->opt[KO_TAIL] && n->tokens < f->maxtok)
		return KV_TAIL;
	if (q && (q->hist[1] & KV_REFILL)) {
		if (q == f->rf_last)
			return kv_class_held(f, n, q, known);
		kv_refill_end(f, q); /* left over from a chain cut short */
	}
	if (f->opt[KO_SUFFIX] && q) {
		/* A parent still on its first sight: the same run of new
		 * blocks, the same class.
		 */
		if ((q->tiers & (1u << tier)) &&
		    (q->t[tier].list == KV_PROB || q->t[tier].list == KV_TAIL))
			return q->t[tier].list;
		/* The new suffix of a known prefix.  The first one a parent
		 * gets is a conversation going on: its next turn, which will
		 * come back through it, so it enters main.  From the second
		 * on the parent is a shared prefix, and its suffixes are
		 * one-off queries.  Only a block never referenced before is
		 * marked for aside's share: one the sketch forgot and the
		 * history did not (an agent's prompt, refilled sessions
		 * apart) comes back when its prefix does, not when the
		 * rule's blocks do, and counted with them it pulled the
		 * share down to the half where the rule flipped back and
		 * forth.
		 */
		if ((q->hist[1] & KV_FAN_MASK) < KV_FAN_MAX)
			q->hist[1]++;
		if ((q->hist[1] & KV_FAN_MASK) > 1) {
			kv_share(q);
			if (!known)
				n->hist[1] |= KV_CSUFX;
			return f->as_prob[KV_AS_SUFFIX] ? KV_PROB : KV_TAIL;
		}
		if (f->opt[KO_TURN]) {
			n->hist[1] |= KV_CONV | (known ? 0 : KV_CTURN);
			return f->as_prob[KV_AS_TURN] ? KV_PROB : KV_MAIN;
		}
	}
	return KV_PROB;
}

/* Blocks the sketch should span: `window` x the capacity in blocks. */
static void kv_horizon(struct kvfs_policy *p, struct kvfs_pkvfs *f)
{
	uint64_t cap = kvfs_pkvfs_blocks(p, f);

	f->sk.sample = (uint64_t)f->window * (cap ? cap : 1);
	f->fleet.sample = f->sk.sample;
}

/* Start the shadows at the first fill, when a block's size is known:
 * the largest sampling rate that leaves each shadow KV_MINI_MIN blocks.
 */
static void kv_mini_start(struct kvfs_policy *p, struct kvfs_pkvfs *f,
			  const struct kvfs_pnode *n)
{
	/* The shadows run this policy as configured, but for the horizon:
	 * no shadows of their own, their candidate's window, and the span
	 * the real sketch has (theirs would derive another without shadows).
	 * Nor a history table: it would cost each shadow a cache miss per
	 * fill and per eviction, and the horizons chosen without it are as
	 * good (docs/policies.md, tenth round).  Nor the session gate: the
	 * shadows choose no better with it (twelfth round).  Nor the blocks
	 * let go lately: their lists cost the shadows 150 to 200 ns per
	 * access where they sample half of every chain, and the cells lost
	 * are the same without them (twentieth round).
	 */
	const char *keys[KO_N], *vals[KO_N];
	char v[KO_N][16];
	uint64_t cap = 0, blocks;
	uint32_t shift = 0;

	for (int t = 0; t < KVFS_NTIERS; t++)
		cap += p->capacity[t];
	blocks = cap / (n->size ? n->size : 1);
	while (shift < KV_MINI_SHIFT && (blocks >> (shift + 1)) >= KV_MINI_MIN)
		shift++;
	for (int o = 0; o < KO_N; o++) {
		keys[o] = kv_opts[o].key;
		vals[o] = v[o];
		snprintf(v[o], sizeof(v[o]), "%u",
			 o == KO_MINI || o == KO_HIST || o == KO_SESS ||
					 o == KO_RECENT ?
				 0 :
			 o == KO_SPAN ? f->span :
					f->opt[o]);
	}
	for (size_t c = 0; c < KV_NCAND; c++) {
		snprintf(v[KO_WINDOW], sizeof(v[KO_WINDOW]), "%u", kv_cand[c]);
		if (kvfs_pmini_init(&f->sh[c], &kvfs_policy_kvfs_ops, keys,
				    vals, KO_N, cap >> shift, shift, 0)) {
			while (c-- > 0)
				kvfs_pmini_release(&f->sh[c]);
			kvfs_warn(
				"kvfs: no memory for the shadows; window stays %u",
				f->window);
			f->mini_fail = true;
			return;
		}
	}
	f->epoch = blocks >> shift ? blocks >> shift : 1;
	f->mini_on = true;
}

/* A reference the shadows see.  Every epoch (a shadow's capacity in
 * sampled references) each shadow's hits are added to its decayed score,
 * and the real policy takes the horizon of a shadow that leads the one in
 * use by KV_MINI_HYST per mille.
 */
static void kv_mini_ref(struct kvfs_policy *p, struct kvfs_pkvfs *f,
			struct kvfs_pnode *n, const struct kvfs_paccess *a)
{
	uint32_t best;
	uint64_t lead;

	if (!f->mini_on || !kvfs_pmini_sampled(&f->sh[0], n))
		return;
	for (size_t c = 0; c < KV_NCAND; c++)
		kvfs_pmini_ref(&f->sh[c], n, a);
	if (++f->mrefs < f->epoch)
		return;
	f->mrefs = 0;
	for (size_t c = 0; c < KV_NCAND; c++) {
		f->score[c] -= f->score[c] >> KV_MINI_DECAY;
		f->score[c] += f->sh[c].hits << 8;
		f->sh[c].hits = 0;
	}
	best = f->cur;
	lead = f->score[f->cur] / 1000 * KV_MINI_HYST;
	for (size_t c = 0; c < KV_NCAND; c++)
		if (f->score[c] > f->score[best] + lead)
			best = (uint32_t)c;
	if (best != f->cur) {
		f->cur = best;
		f->window = kv_cand[best];
		kv_horizon(p, f);
	}
}

/* Whether @n was let go lately (it is forgotten there either way). */
static bool kv_recent_take(struct kvfs_pkvfs *f, const struct kvfs_pnode *n)
{
	bool b1, b2;

	if (!f->opt[KO_RECENT])
		return false;
	b1 = kvfs_pghost_take(&f->recent[0], n->key);
	b2 = kvfs_pghost_take(&f->recent[1], n->key);
	return b1 || b2;
}

/* @n, on list @cls, left the last tier it was in: remembered among the
 * blocks let go lately, bounded as ARC bounds its ghost lists (with
 * probation and the tail's list as T1, main as T2, and c the capacity
 * of all tiers): the first sights' at most c less T1, the whole at most
 * 2c less what the tiers hold.
 */
static void kv_recent_put(struct kvfs_policy *p, struct kvfs_pkvfs *f,
			  const struct kvfs_pnode *n, int cls)
{
	uint64_t c = 0, t1 = 0, t2 = 0, b1;

	for (int t = 0; t < KVFS_NTIERS; t++) {
		c += p->capacity[t];
		t1 += f->t[t].l[KV_TAIL].size + f->t[t].l[KV_PROB].size;
		t2 += f->t[t].l[KV_MAIN].size;
	}
	kvfs_pghost_trim(&f->recent[0], c > t1 ? c - t1 : 0);
	if (cls != KV_MAIN)
		kvfs_pghost_add(&f->recent[0], n->key, n->size);
	b1 = f->recent[0].size;
	kvfs_pghost_trim(&f->recent[1],
			 2 * c > t1 + t2 + b1 ? 2 * c - t1 - t2 - b1 : 0);
	if (cls == KV_MAIN)
		kvfs_pghost_add(&f->recent[1], n->key, n->size);
}

/* The most CLOCK passes hits can buy @x.  A conversation's context is
 * read again at every turn and dies with the session: its hits say the
 * session goes on, not that the block is popular, so it gets fewer than
 * a block many requests share.
 */
static uint32_t kv_passes(const struct kvfs_pkvfs *f,
			  const struct kvfs_pnode *x)
{
	if ((x->hist[1] & (KV_CONV | KV_SHARED)) == KV_CONV)
		return f->opt[KO_CONV];
	return 3 + f->opt[KO_CREDIT];
}

/* A block @n entered main in @tier: the passes what a miss on it costs
 * buys.  Recomputing a token at depth h costs 2P + 4Ldh FLOPs (P the
 * parameters, L the layers, d the hidden size): 1 + h/h* times a token at
 * the root, with h* = P / (2Ld) (`deep`).  A prefix h* deep or more is
 * worth that many more hits' protection, one CLOCK pass per whole h*,
 * up to KV_DEEP_MAX.  A deep block is worth nothing without its
 * ancestors, so those in main get as many (the walk stops at the first
 * that has them).  Not a conversation's blocks: their one pass (`conv`)
 * says whether the session goes on, which a longer context does not.
 */
static void kv_deep(struct kvfs_pkvfs *f, struct kvfs_pnode *n, int tier)
{
	uint64_t x;

	if (!f->opt[KO_DEEP] || kvfs_pkvfs_conv(n))
		return;
	x = (uint64_t)(n->depth + 1) * f->maxtok / f->opt[KO_DEEP];
	if (x > KV_DEEP_MAX)
		x = KV_DEEP_MAX;
	for (struct kvfs_pnode *q = n;
	     x && q && (q->tiers & (1u << tier)) &&
	     q->t[tier].list == KV_MAIN && q->t[tier].idx < x;
	     q = q->parent) {
		kv_idle_out(f, q, tier);
		q->t[tier].idx = (uint32_t)x;
		kv_idle_in(f, q, tier);
	}
}

static void kv_insert(struct kvfs_policy *p, int tier, struct kvfs_pnode *n,
		      const struct kvfs_paccess *a)
{
	struct kvfs_pkvfs *f = p->priv;
	uint32_t credit = 0;
	int cls;

	kv_refill_flush(f, a);
	if (n->tiers == (1u << tier)) {
		/* From nowhere: a miss being filled or a new write. */
		uint32_t seen;
		bool known;

		if (f->hist.slot)
			kvfs_phist_prefetch(&f->hist, n->key);
		seen = kv_seen(f, n->key);
		if (kv_recent_take(f, n) && !seen)
			seen = 1;

		/* A block let go and written again: what was known of it. */
		if (f->hist.slot && !(n->hist[1] & KV_REF))
			n->hist[1] |= kvfs_phist_take(&f->hist, n->key);
		known = n->hist[1] & KV_REF;

		if (n->tokens > f->maxtok)
			f->maxtok = n->tokens;
		if (f->mini && !f->mini_on && !f->mini_fail)
			kv_mini_start(p, f, n);
		kv_mini_ref(p, f, n, a);
		if (f->ins < (1u << 20)) {
			f->ins++;
			f->insz += n->size;
			kv_horizon(p, f);
		}
		kvfs_psketch_add(&f->sk, n->key);
		kvfs_pkvfs_ref(f, n);
		if (seen && kvfs_pkvfs_conv(n) && kvfs_pkvfs_gate(f)) {
			/* A conversation's context, refilled: held in
			 * probation until the request shows whether it goes
			 * on past it.
			 */
			if (f->rf_last && n->parent != f->rf_last)
				kv_refill_promote(f);
			cls = KV_PROB;
			n->hist[1] |= KV_REFILL;
			f->rf_last = n;
			f->rf_req = a ? a->request : 0;
		} else {
			cls = kv_class(f, n, seen, tier, known);
		}
		if (f->opt[KO_SESS] && cls == KV_TAIL && !seen && !known &&
		    n->tokens >= f->maxtok) {
			/* A full block on the tail's list is a new suffix of
			 * a shared prefix: a new session's, or a one-off query.
			 */
			n->hist[1] |= KV_SFIRST;
			if (kvfs_pkvfs_sess_gate(f)) {
				n->hist[1] |= KV_CONV;
				cls = KV_MAIN;
			}
		}
		kvfs_pkvfs_fill(p, f, cls == KV_MAIN);
		if (cls != KV_MAIN && !seen) {
			n->hist[1] |= KV_FFIRST;
			f->st_first++;
		}
		if (!(f->fills % KV_STAY_EVERY))
			kvfs_pkvfs_stay(p, f);
		/* Below a turn is the same conversation. */
		if (n->parent && (n->parent->hist[1] & KV_CONV))
			n->hist[1] |= KV_CONV;
		/* A returning block's history seeds its CLOCK count. */
		credit = seen > f->opt[KO_CREDIT] ? f->opt[KO_CREDIT] : seen;
	} else {
		/* A move keeps the class it had in the tier it leaves. */
		cls = KV_PROB;
		for (int t = 0; t < KVFS_NTIERS; t++)
			if (t != tier && (n->tiers & (1u << t)) &&
			    n->t[t].list > 0)
				cls = n->t[t].list;
	}
	n->t[tier].list = (uint8_t)cls;
	n->t[tier].idx = cls == KV_MAIN ? credit : 0;
	kv_idle_in(f, n, tier);
	kvfs_plist_place(&f->t[tier].l[cls], n, tier,
			 kvfs_pclock_stamp(&f->clock, a));
	if (cls == KV_MAIN)
		kv_deep(f, n, tier);
}

/* A reference to @x, resident: in each tier holding it, one more CLOCK
 * pass in main (or, with `lru`, main's tail at stamp @st).  @own: a hit
 * of this host's, which also moves @x out of the other lists into main
 * and counts for stay's comparison; else another host's sighting, which
 * only gives a block already in main its pass.
 */
static void kv_touch(struct kvfs_pkvfs *f, struct kvfs_pnode *x, uint64_t st,
		     bool own)
{
	bool in_main = false; /* a hit on main, for stay's comparison */

	for (int t = 0; t < KVFS_NTIERS; t++) {
		struct kvfs_pkvfs_tier *q = &f->t[t];

		if (!(x->tiers & (1u << t)))
			continue;
		in_main |= x->t[t].list == KV_MAIN;
		if (!own && x->t[t].list != KV_MAIN)
			continue;
		if (own && x->t[t].list == KV_MAIN && !x->t[t].idx)
			f->st_idle_hits++;
		kv_idle_out(f, x, t);
		if (!f->opt[KO_LRU] && x->t[t].list == KV_MAIN) {
			if (x->t[t].idx < kv_passes(f, x))
				x->t[t].idx++;
			kv_idle_in(f, x, t);
			continue;
		}
		x->t[t].idx = 0;
		kvfs_plist_unlink(&q->l[x->t[t].list], x, t);
		x->t[t].list = KV_MAIN;
		kv_idle_in(f, x, t);
		f->main_in++;
		kvfs_plist_place(&q->l[KV_MAIN], x, t, st);
		kv_deep(f, x, t);
	}
	if (own)
		f->st_main += in_main;
}

static void kv_access(struct kvfs_policy *p, struct kvfs_pnode *const *path,
		      size_t n, const struct kvfs_paccess *a)
{
	struct kvfs_pkvfs *f = p->priv;
	uint64_t st;

	kv_refill_flush(f, a);
	st = kvfs_pclock_stamp(&f->clock, a);
	for (size_t i = 0; i < n; i++)
		kv_mini_ref(p, f, path[i], a);
	/* Deepest first: each lands at the tail of the newest segment. */
	for (size_t i = n; i-- > 0;) {
		kvfs_psketch_add(&f->sk, path[i]->key);
		kvfs_pkvfs_ref(f, path[i]);
		kv_touch(f, path[i], st, true);
	}
}

static void kv_remove(struct kvfs_policy *p, int tier, struct kvfs_pnode *n)
{
	struct kvfs_pkvfs *f = p->priv;

	kv_idle_out(f, n, tier);
	kvfs_plist_unlink(&f->t[tier].l[n->t[tier].list], n, tier);
	if (f->opt[KO_RECENT] && !n->tiers)
		kv_recent_put(p, f, n, n->t[tier].list);
	n->t[tier].list = 0;
}

/* The first block of @l that passes @ok (a leaf or a dead block, with
 * `leaf`).
 */
/* @n left every tier, and its node may be freed (the daemon deletes the
 * block): what the policy knows of it goes to the history table, keyed by
 * the key, and the node is left as a new one would be, so the simulator's
 * nodes, which live on, know no more than the daemon's.
 */
static void kv_forget(struct kvfs_policy *p, struct kvfs_pnode *n)
{
	struct kvfs_pkvfs *f = p->priv;

	if (n->hist[1] & KV_REFILL)
		f->rf_last = NULL;
	if (f->hist.slot)
		kvfs_phist_put(&f->hist, n->key, n->hist[1] & KV_KEEP);
	n->hist[1] = 0;
}

static struct kvfs_pnode *kv_scan(struct kvfs_pkvfs *f, struct kvfs_plist *l,
				  int tier, kvfs_policy_ok_fn ok, void *arg)
{
	for (struct kvfs_pnode *x = l->head; x; x = x->t[tier].next) {
		if (f->opt[KO_LEAF] && x->children[tier] && !kv_dead(x))
			continue;
		if (ok(x, arg))
			return x;
	}
	return NULL;
}

/* Main as a CLOCK: a block hit since the hand last passed is moved to
 * the tail with its count lowered; the first candidate with none goes.
 */
static struct kvfs_pnode *kv_clock(struct kvfs_pkvfs *f, struct kvfs_plist *l,
				   int tier, kvfs_policy_ok_fn ok, void *arg)
{
	uint64_t budget = 4 * l->count + 4;
	struct kvfs_pnode *x = l->head, *nx;

	for (; x && budget; x = nx, budget--) {
		nx = x->t[tier].next;
		if (x->t[tier].idx && !kv_dead(x)) {
			x->t[tier].idx--;
			kv_idle_in(f, x, tier);
			kvfs_plist_unlink(l, x, tier);
			kvfs_plist_place(l, x, tier,
					 kvfs_pclock_stamp(&f->clock, NULL));
			if (!nx)
				nx = l->head;
			continue;
		}
		if (f->opt[KO_LEAF] && x->children[tier] && !kv_dead(x))
			continue;
		if (ok(x, arg))
			return x;
	}
	return kv_scan(f, l, tier, ok, arg);
}

static struct kvfs_pnode *kv_victim(struct kvfs_policy *p, int tier,
				    kvfs_policy_ok_fn ok, void *arg)
{
	struct kvfs_pkvfs *f = p->priv;
	struct kvfs_pkvfs_tier *q = &f->t[tier];
	uint64_t keep = p->capacity[tier] * f->opt[KO_PROB] / 1000;
	uint64_t stay = f->st_keep * (f->ins ? f->insz / f->ins : 1);
	struct kvfs_pnode *x;

	if (stay > keep)
		keep = stay < p->capacity[tier] / 2 ? stay :
						      p->capacity[tier] / 2;
	if (q->l[KV_TAIL].size + q->l[KV_PROB].size > keep ||
	    !q->l[KV_MAIN].count) {
		x = kv_scan(f, &q->l[KV_TAIL], tier, ok, arg);
		if (!x)
			x = kv_scan(f, &q->l[KV_PROB], tier, ok, arg);
		if (x)
			return x;
	}
	x = f->opt[KO_LRU] ? kv_scan(f, &q->l[KV_MAIN], tier, ok, arg) :
			     kv_clock(f, &q->l[KV_MAIN], tier, ok, arg);
	if (!x)
		x = kv_scan(f, &q->l[KV_TAIL], tier, ok, arg);
	if (!x)
		x = kv_scan(f, &q->l[KV_PROB], tier, ok, arg);
	for (int c = KV_TAIL; !x && c <= KV_MAIN; c++)
		x = kvfs_plist_first(&q->l[c], tier, ok, arg, false, 0);
	return x;
}

static bool kv_admit(struct kvfs_policy *p, int from, int to,
		     struct kvfs_pnode *n)
{
	const struct kvfs_pkvfs *f = p->priv;

	if (kv_dead(n))
		return false;
	for (int t = 0; t < KVFS_NTIERS; t++)
		if (n->children[t])
			return true;
	if (p->used[to] + n->size <= p->capacity[to])
		return true;
	/* Only a partial tail is refused: a full block of a new suffix is
	 * evicted early, but kept below like any first sight.
	 */
	return n->t[from].list != KV_TAIL || n->tokens >= f->maxtok;
}

/* Another host of the fleet referenced @key: a sighting, kept in the
 * fleet's sketch.  A host behind a round-robin balancer sees a quarter
 * of a prefix's references (of four hosts), so its own sketch takes four
 * times as long to call a block a second sight; what the others saw
 * closes that gap (docs/policies.md, eighteenth round).  For a block held
 * here (@n) in main it is also a reference to its place, one more CLOCK
 * pass, as the balancer sends the fleet's demand here too (twenty-first
 * round).  A block still on its first sight here stays there: another
 * host's next step of a session is not this host's, and moving such
 * blocks into main filled it with sessions that went on elsewhere (the
 * agent generator over the fleet lost 1% and 2%; twenty-fifth round).
 * `sight=3` moves them as a hit of this host's would.  Neither the
 * block's stamp nor the gates' means move: those measure this host's
 * own reuse.  The shadows are not told: they choose the horizon on the
 * host's own references.
 */
static void kv_sight(struct kvfs_policy *p, const uint8_t key[16],
		     struct kvfs_pnode *n)
{
	struct kvfs_pkvfs *f = p->priv;

	if (!f->opt[KO_SIGHT])
		return;
	if (!f->fleet_tried) {
		f->fleet_tried = true;
		if (kvfs_psketch_init(&f->fleet, f->sk.width, f->sk.sample))
			f->fleet.c = NULL;
	}
	if (f->fleet.c)
		kvfs_psketch_add(&f->fleet, key);
	if (n && f->opt[KO_SIGHT] >= 2)
		kv_touch(f, n, kvfs_pclock_stamp(&f->clock, NULL),
			 f->opt[KO_SIGHT] == 3);
}

static int kv_set(struct kvfs_policy *p, const char *key, const char *val)
{
	struct kvfs_pkvfs *f = p->priv;
	unsigned long v;
	char *end;
	int o;

	for (o = 0; o < KO_N && strcmp(key, kv_opts[o].key); o++)
		;
	if (o == KO_N) {
		kvfs_err("kvfs: unknown option %s", key);
		return -EINVAL;
	}
	v = strtoul(val, &end, 10);
	if (end == val || *end || *val == '-' || v < kv_opts[o].lo ||
	    v > kv_opts[o].hi) {
		kvfs_err("kvfs: %s wants a number from %u to %u, got '%s'", key,
			 kv_opts[o].lo, kv_opts[o].hi, val);
		return -EINVAL;
	}
	f->opt[o] = (uint32_t)v;
	f->opt_set |= 1u << o;
	return 0;
}

/* Options not set keep their defaults (set() runs first, on zeroes). */
static int kv_init(struct kvfs_policy *p)
{
	struct kvfs_pkvfs *f = p->priv;
	uint64_t cap = 0, w = 1024;

	for (int o = 0; o < KO_N; o++)
		if (!(f->opt_set & (1u << o)))
			f->opt[o] = kv_opts[o].def;
	f->window = f->opt[KO_WINDOW];
	/* Shadows choose the horizon, unless one was set. */
	f->mini = f->opt[KO_MINI] && !(f->opt_set & (1u << KO_WINDOW));
	if (f->mini)
		f->window = kv_cand[0];
	f->span = f->opt[KO_SPAN] ? f->opt[KO_SPAN] :
		  f->mini	  ? KV_SPAN :
				    f->window;

	for (int t = 0; t < KVFS_NTIERS; t++)
		cap += p->capacity[t];
	/* Enough counters for the horizon when capacities are in blocks;
	 * in bytes the horizon is far fewer blocks than the count.
	 */
	while (w < (1u << 20) && w < cap * f->span / 2)
		w <<= 1;
	if (f->opt[KO_HIST] &&
	    kvfs_phist_init(&f->hist, (uint32_t)w << KV_HIST_SHIFT))
		return -ENOMEM;
	if (kvfs_psketch_init(&f->sk, (uint32_t)w,
			      (uint64_t)f->window * (cap ? cap : 1)))
		goto out_hist;
	if (f->opt[KO_RECENT] && (kvfs_pghost_init(&f->recent[0], 0) ||
				  kvfs_pghost_init(&f->recent[1], 0)))
		goto out_recent;
	return 0;

out_recent:
	kvfs_pghost_release(&f->recent[0]);
	kvfs_pghost_release(&f->recent[1]);
	kvfs_psketch_release(&f->sk);
out_hist:
	kvfs_phist_release(&f->hist);
	return -ENOMEM;
}

static void kv_release(struct kvfs_policy *p)
{
	struct kvfs_pkvfs *f = p->priv;

	kvfs_psketch_release(&f->sk);
	kvfs_psketch_release(&f->fleet);
	kvfs_phist_release(&f->hist);
	kvfs_pghost_release(&f->recent[0]);
	kvfs_pghost_release(&f->recent[1]);
	if (f->mini_on)
		for (size_t c = 0; c < KV_NCAND; c++)
			kvfs_pmini_release(&f->sh[c]);
	f->mini_on = false;
}

const struct kvfs_policy_ops kvfs_policy_kvfs_ops = {
	.name = "kvfs",
	.priv_size = sizeof(struct kvfs_pkvfs),
	.set = kv_set,
	.init = kv_init,
	.release = kv_release,
	.sight = kv_sight,
	.insert = kv_insert,
	.access = kv_access,
	.remove = kv_remove,
	.forget = kv_forget,
	.victim = kv_victim,
	.admit = kv_admit,
};
