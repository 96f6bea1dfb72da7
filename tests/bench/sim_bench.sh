#!/usr/bin/env bash
# Policy results for docs/policies.md: runs kvfs-sim on the Mooncake trace
# and on the generated workloads of papers 002 and 000 (and, for issue 16,
# the chat and agent generators and the fleet mode), and prints the tables as
# Markdown (figures only, nothing is asserted).
#
# Environment: BUILD (default build), TRACE (default
# ../shared/traces/mooncake_synthetic.jsonl), CONV_TRACE (Mooncake's
# conversation trace, FAST25-release/traces/conversation_trace.jsonl of
# the Mooncake repository; its tables are printed when the file is there,
# default ../shared/traces/mooncake_conversation.jsonl), OUT (where the
# sweep CSV/PNG go, default /tmp/kvfs-sim-bench).
set -u
export LC_ALL=C
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
SIM=$BUILD/bin/kvfs-sim
TRACE=${TRACE:-../shared/traces/mooncake_synthetic.jsonl}
CONV_TRACE=${CONV_TRACE:-../shared/traces/mooncake_conversation.jsonl}
OUT=${OUT:-/tmp/kvfs-sim-bench}
POLICIES="lru arc hotprefix wa plfu belady"

if [ ! -x "$SIM" ]; then
	echo "sim_bench: $SIM missing; run make BUILD=$BUILD all" >&2
	exit 1
fi
mkdir -p "$OUT"

# JSON lines -> "policy value" for one numeric field.
field() {
	sed -n 's/.*"policy": "\([^"]*\)".*"'"$1"'": \([0-9.e+-]*\).*/\1 \2/p'
}

pflags() {
	for p in $POLICIES; do printf -- '--policy %s ' "$p"; done
}

# table TITLE SOURCE-ARGS -- PCT...: hit ratio per policy and capacity, and
# the share of the LRU->Belady gap each policy closes.
table() {
	local title=$1 src=$2
	shift 2
	echo
	echo "#### $title"
	echo
	printf '| policy |'
	for pct in "$@"; do printf ' %s%% hit | gap |' "$pct"; done
	echo
	printf '|---|'
	for pct in "$@"; do printf -- '---:|---:|'; done
	echo
	local tmp
	tmp=$(mktemp)
	for pct in "$@"; do
		# shellcheck disable=SC2086
		$SIM $src --capacity-pct "$pct" --json $(pflags) \
			2>/dev/null | field hit_ratio | sed "s/^/$pct /" >>"$tmp"
	done
	for p in $POLICIES; do
		printf '| %s |' "$p"
		for pct in "$@"; do
			awk -v pct="$pct" -v p="$p" '
				$1 == pct && $2 == p { h = $3 }
				$1 == pct && $2 == "lru" { l = $3 }
				$1 == pct && $2 == "belady" { b = $3 }
				END {
					g = (b > l) ? (h - l) / (b - l) * 100 : 0
					printf " %.4f | %+.0f%% |", h, g
				}' "$tmp"
		done
		echo
	done
	rm -f "$tmp"
}

MOON="--trace $TRACE --format mooncake"
echo "### Single tier: block hit ratio, and share of the LRU-to-Belady gap closed"
table "Mooncake trace ($TRACE), % of its unique blocks" "$MOON" 2 5 10
table "Paper 002's windowed Zipf document QA (--gen zipf-docqa)" \
	"--gen zipf-docqa" 1 2 5
table "Paper 000's shuffled 5-shot stream (--gen fewshot)" \
	"--gen fewshot" 0.5 1 2

echo
echo "### Policy cost (ns, Mooncake trace at 5%)"
echo
echo '| policy | per access | per eviction |'
echo '|---|---:|---:|'
# shellcheck disable=SC2086
$SIM $MOON --capacity-pct 5 --json $(pflags) 2>/dev/null |
	sed -n 's/.*"policy": "\([^"]*\)".*"access_ns": \([0-9.]*\), "evict_ns": \([0-9.]*\).*/| \1 | \2 | \3 |/p'

# multi TITLE ARGS: per-tier hit ratios, traffic and modeled TTFT.
multi() {
	echo
	echo "#### $1"
	echo
	echo '| policy | hit | GPU | DRAM | SSD | loaded | demoted | admitted | refused | discarded | promoted | offload s | TTFT ms |'
	echo '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
	# shellcheck disable=SC2086
	$SIM $2 --json $(pflags) 2>/dev/null | awk '
		function v(k,   m) {
			if (match($0, "\"" k "\": [^,}]*")) {
				m = substr($0, RSTART, RLENGTH)
				sub(/^[^:]*: /, "", m)
				gsub(/"/, "", m)
				return m
			}
			return "?"
		}
		{
			printf "| %s | %.4f | %.4f | %.4f | %.4f | %s | %s | %s | %s | %s | %s | %.1f | %.1f |\n",
				v("policy"), v("hit_ratio"), v("hit_ratio_gpu"),
				v("hit_ratio_dram"), v("hit_ratio_ssd"), v("loaded"),
				v("demoted"), v("admitted"), v("refused"),
				v("discarded"), v("promoted"), v("offload_s"),
				v("ttft_ms")
		}'
}

echo
echo "### Multi-tier"
multi "Mooncake: GPU 2%, DRAM 10%, SSD 20% of unique blocks" \
	"$MOON --gpu-blocks 878 --dram-blocks 4392 --ssd-blocks 8785"
multi "Few-shot, paper 000's two tiers: GPU 0.5%, host DRAM = GPU" \
	"--gen fewshot --gpu-blocks 513 --dram-blocks 513"

# Issue 16: kvfs's own policy against the published online policies, at
# 1/2/5/10% of each trace's unique blocks, hit ratio and modeled TTFT
# (docs/policies.md, "kvfs").
I16="--policy lru --policy arc --policy s3fifo --policy sieve --policy kvfs"
CONV=
if [ -r "$CONV_TRACE" ]; then
	CONV="--trace $CONV_TRACE --format mooncake"
else
	echo
	echo "(no conversation trace at $CONV_TRACE: its tables are left out)"
fi
echo
echo "### kvfs against lru, arc, s3fifo and sieve (bold: best online)"
# title|source|more policies (in the fleet belady looks ahead per host;
# the hosts hear each other's references a second later, as the daemon's
# [fleet] sightings at their default interval: docs/remote.md)
for set in "mooncake|$MOON|--policy belady" \
	"zipf-docqa seed 42|--gen zipf-docqa --seed 42|--policy belady" \
	"fewshot seed 42|--gen fewshot --seed 42|--policy belady" \
	"zipf-docqa seed 7|--gen zipf-docqa --seed 7|--policy belady" \
	"fewshot seed 7|--gen fewshot --seed 7|--policy belady" \
	"chat seed 42|--gen chat --seed 42|--policy belady" \
	"chat seed 7|--gen chat --seed 7|--policy belady" \
	"agent seed 42|--gen agent --seed 42|--policy belady" \
	"agent seed 7|--gen agent --seed 7|--policy belady" \
	"fleet 4 hosts rr, mooncake|$MOON --fleet 4 --route rr --fleet-sight 1000|--policy belady" \
	"fleet 4 hosts rr, zipf-docqa seed 42|--gen zipf-docqa --seed 42 --fleet 4 --route rr --fleet-sight 1000|--policy belady" \
	"fleet 4 hosts rr, agent seed 42|--gen agent --seed 42 --fleet 4 --route rr --fleet-sight 1000|--policy belady" \
	"fleet 4 hosts rr, agent seed 7|--gen agent --seed 7 --fleet 4 --route rr --fleet-sight 1000|--policy belady" \
	${CONV:+"mooncake conversation|$CONV|--policy belady"} \
	${CONV:+"fleet 4 hosts rr, mooncake conversation|$CONV --fleet 4 --route rr --fleet-sight 1000|--policy belady"}; do
	title=${set%%|*}
	rest=${set#*|}
	echo
	echo "#### $title"
	echo
	# shellcheck disable=SC2086
	$SIM ${rest%|*} --tables $I16 ${rest##*|} 2>/dev/null
done

# shellcheck disable=SC2086
$SIM $MOON --sweep --sweep-out "$OUT/mooncake" $(pflags) >/dev/null 2>&1
echo
echo "Sweep: $OUT/mooncake.csv and $OUT/mooncake.png"
