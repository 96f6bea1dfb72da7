#!/usr/bin/env bash
# ContiguousKV benchmarks (issue 6): chunk-granular sparse loads of an
# SSD-resident prefix against IMPRESS's 64-token granularity, with and
# without period prefetching, and full-layer FETCH_CHUNKS against fio on
# the same data file. Figures only, nothing is asserted.
#
#   tests/bench/chunks.sh [--summary FILE]
#
# Standalone it prints its own summary table; with --summary it appends
# its lines ("label|kvfs|baseline|unit|ratio|target") to FILE, for run.sh.
# docs/benchmarks.md ("ContiguousKV (issue 6)") explains every figure.
#
# Environment:
#   BUILD                     build directory (default build)
#   BENCH_TMP                 where the store goes (default /tmp; a disk)
#   BENCH_CHUNKS_PREFIXES     prefix lengths in tokens (default
#                             "4096 8192 16384"; multiples of 256)
#   BENCH_CHUNKS_BUDGETS      budget ratios in % (default "5 10 25 50")
#   BENCH_CHUNKS_REPS         passes per configuration (default 1)
#   BENCH_CHUNKS_COMPUTE_US   simulated compute per layer, every system
#                             (default 1000)
#   BENCH_CHUNKS_EXTRA_US     more compute times, ContiguousKV only, with
#                             and without prefetching (default 5000; ""
#                             for none)
#   BENCH_CHUNKS_FULL_RUNS    full-layer kvfs/fio pairs (default 3)
#   BENCH_CHUNKS_SPEC_DEPTH   [chunks] spec_depth of the daemon (default:
#                             unset, the daemon's default)
#   BENCH_CHUNKS_RESULTS      also append the raw result lines to this file
#                             (`bench_chunks report FILE` tabulates the
#                             medians of several runs)
set -u
export LC_ALL=C
cd "$(dirname "$0")/../.." || exit 1

SUMMARY_OUT=
while [ $# -gt 0 ]; do
	case $1 in
	--summary)
		SUMMARY_OUT=${2:?--summary needs a file}
		shift 2
		;;
	*)
		echo "usage: $0 [--summary FILE]" >&2
		exit 2
		;;
	esac
done

BUILD=${BUILD:-build}
case "$BUILD" in
/*) BDIR=$BUILD ;;
*) BDIR=$PWD/$BUILD ;;
esac
BIN=$BDIR/bin
BC=$BDIR/bench/bench_chunks
BIO=$BDIR/bench/bench_io
PREFIXES=${BENCH_CHUNKS_PREFIXES:-4096 8192 16384}
BUDGETS=${BENCH_CHUNKS_BUDGETS:-5 10 25 50}
REPS=${BENCH_CHUNKS_REPS:-1}
COMPUTE_US=${BENCH_CHUNKS_COMPUTE_US:-1000}
EXTRA_US=${BENCH_CHUNKS_EXTRA_US-5000}
FULL_RUNS=${BENCH_CHUNKS_FULL_RUNS:-3}
SPEC_DEPTH=${BENCH_CHUNKS_SPEC_DEPTH:-}
FIO=${FIO:-fio}

for p in "$BIN/mkfs.kvfs" "$BIN/kvfs" "$BIN/kvfs-gen" "$BC" "$BIO"; do
	if [ ! -x "$p" ]; then
		echo "chunks: $p missing; run make BUILD=$BUILD all" >&2
		exit 1
	fi
done
command -v "$FIO" >/dev/null || {
	echo "chunks: fio not found" >&2
	exit 1
}

WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/kvfs-chunks.XXXXXX") || exit 1
STORE=$WORK/store
MNT=$WORK/mnt
NS=q
RESULTS=$WORK/results
SUMMARY=${SUMMARY_OUT:-$WORK/summary}
KVFS_PID=
BC_PIDS=()
mkdir -p "$MNT"
: >"$RESULTS"
[ -n "$SUMMARY_OUT" ] || : >"$SUMMARY"

# Qwen2.5-7B-like: 28 layers x 4 KV heads x head_dim 128 in bf16. A
# 16-token chunk of one layer is 2 * 16 * 4 * 128 * 2 = 32 KiB (K then V),
# a 256-token block holds 16 of them per layer: 512 KiB per layer, 14 MiB
# of K/V per block.
LAYERS=28
GEOM=(--ns "$NS" --layers "$LAYERS" --kv-heads 4 --head-dim 128
	--dtype bf16 --block-tokens 256 --chunk-tokens 16)
BGEOM=(--layers "$LAYERS" --kv-heads 4 --head-dim 128 --dtype-size 2
	--chunk-tokens 16 --block-tokens 256 --impress-tokens 64
	--period 8 --sub-period 4 --compute-us "$COMPUTE_US" --seed 42)

# wait_exit PID: until PID has exited (at most 60 s). A zombie has: it
# holds no file any more, and the reaper here may take seconds (tail --pid
# would wait for that too).
wait_exit() {
	local st i

	for ((i = 0; i < 6000; i++)); do
		st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
		case $st in
		'' | Z | X) return 0 ;;
		esac
		sleep 0.01
	done
	return 1
}

unmount() {
	if mountpoint -q "$MNT" 2>/dev/null; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT"
	elif grep -q " $MNT fuse" /proc/mounts; then
		fusermount3 -u -z "$MNT" 2>/dev/null
	fi
	if [ -n "$KVFS_PID" ]; then
		# The store is free once the daemon has exited.
		wait_exit "$KVFS_PID"
		KVFS_PID=
	fi
}

# shellcheck disable=SC2317 # called by the trap
cleanup() {
	local p

	# A bench_chunks still running holds the control file open: stop it
	# first so the unmount is not busy. It unlinks its shm objects
	# itself; these are left only when it was killed.
	for p in "${BC_PIDS[@]}"; do
		kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
		rm -f /dev/shm/kvfs-bench-chunks-*-"$p"
	done
	unmount
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
	echo "chunks: $*" >&2
	[ -f "$STORE/kvfs.log" ] && tail -n 5 "$STORE/kvfs.log" >&2
	exit 1
}

mount_kvfs() {
	"$BIN/kvfs" "$STORE" "$MNT" || die "mount failed"
	KVFS_PID=$(cat "$STORE/kvfs.pid")
}

# A fresh daemon: the chunk cache (DRAM and device sets) starts empty, so
# no configuration is helped by pieces an earlier one loaded.
remount() {
	unmount
	mount_kvfs
}

tier_of() {
	getfattr --absolute-names --only-values -n user.kvfs.tier \
		"$MNT/$NS/$1.kv" 2>/dev/null
}

# run_bc OUT ARGS...: bench_chunks ARGS > OUT, in the background of this
# shell so that the trap knows its pid.
run_bc() {
	local out=$1

	shift
	"$BC" "$@" >"$out" &
	BC_PIDS+=("$!")
	wait "$!"
}

echo "kvfs ContiguousKV benchmarks  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "  machine: $(nproc) CPUs, kernel $(uname -r)," \
	"$(df --output=source "$WORK" | tail -n1)" \
	"($(findmnt -no FSTYPE -T "$WORK" 2>/dev/null))"
echo "  load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at start"

# --- store and prefixes --------------------------------------------------
blocks_total=0
for t in $PREFIXES; do
	[ $((t % 256)) -eq 0 ] || die "prefix $t is not a multiple of 256"
	blocks_total=$((blocks_total + t / 256))
done
# 14 MiB + 8 KiB a block, and room to spare.
ssd_mib=$((blocks_total * 15 + 256))
"$BIN/mkfs.kvfs" --ssd-size "${ssd_mib}M" "$STORE" >/dev/null ||
	die "mkfs failed"
cat >"$STORE/kvfs.conf" <<EOF
[daemon]
log_level = warn

[tier.dram]
capacity = 1G

[tier.gpu]
backend = shm
capacity = 64M

[chunks]
# Room for a whole period of speculative loads (IMPRESS at 50% of 16K
# tokens: 8 layers x 1024 chunks x 32 KiB = 256 MiB) next to the demand
# loads, so nothing speculated is evicted before it is asked for.
dram_capacity = 2G
${SPEC_DEPTH:+spec_depth = $SPEC_DEPTH}

[policy]
name = lru

[namespace $NS]
layers = $LAYERS
kv_heads = 4
head_dim = 128
dtype = bf16
block_tokens = 256
chunk_tokens = 16
EOF
mount_kvfs
seed=1
t0=$(date +%s%N)
for t in $PREFIXES; do
	"$BIN/kvfs-gen" write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 \
		--blocks $((t / 256)) --shared 0 --seed $seed \
		--log "$WORK/keys.$t" --quiet || die "kvfs-gen write failed"
	seed=$((seed + 1))
done
# Unmounting persists every block; the remount leaves them on the SSD
# only (the daemon reads them with O_DIRECT: no page cache either).
unmount
t1=$(date +%s%N)
echo "  wrote:   $blocks_total blocks ($PREFIXES tokens) in" \
	"$(((t1 - t0) / 1000000)) ms, persisted, unmounted"
LONGEST=
for t in $PREFIXES; do LONGEST=$t; done
mapfile -t LKEYS <"$WORK/keys.$LONGEST"
"$BIO" extents "$STORE" "${LKEYS[@]/%/.kv}" >"$WORK/extents" ||
	die "could not read the extents"
mount_kvfs
for t in $PREFIXES; do
	first=$(head -n1 "$WORK/keys.$t")
	last=$(tail -n1 "$WORK/keys.$t")
	for k in "$first" "$last"; do
		tier=$(tier_of "$k")
		[ "$tier" = ssd ] ||
			die "block $k of prefix $t is on '$tier', not ssd"
	done
done
echo "  tiers:   first and last block of every prefix: ssd"

# --- sparse loads ----------------------------------------------------------
echo
echo "sparse loads: every configuration on a fresh mount (empty chunk cache)"
echo "  \$ bench_chunks pass \$MNT $NS --keys keys.N --system ckv|impress" \
	"--budget B [--prefetch] ${BGEOM[*]} [--compute-us T]"
# one_pass SYS PREFIX BUDGET PF COMPUTE_US
one_pass() {
	local args=(pass "$MNT" "$NS" --keys "$WORK/keys.$2" --system "$1"
		--budget "$3" "${BGEOM[@]}" --compute-us "$5")

	[ "$4" = 1 ] && args+=(--prefetch)
	remount
	run_bc "$WORK/line" "${args[@]}" ||
		die "bench_chunks pass failed ($1 $2 $3% pf=$4)"
	cat "$WORK/line" >>"$RESULTS"
	awk '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "  %-7s %5s tok %3s%% pf=%s %4.1f ms: read %7.1f MiB " \
			"(%5d reads), load %7.1f ms, stall %7.1f ms\n",
			v["sys"], v["tokens"], v["budget"], v["pf"],
			v["compute_us"] / 1000, v["st_read"] / 1048576,
			v["ssd_reads"], v["load_ns"] / 1e6, v["stall_ns"] / 1e6
	}' "$WORK/line"
}

for ((rep = 1; rep <= REPS; rep++)); do
	for t in $PREFIXES; do
		for b in $BUDGETS; do
			for pf in 0 1; do
				for sys in ckv impress; do
					one_pass $sys "$t" "$b" $pf "$COMPUTE_US"
				done
			done
			for c in $EXTRA_US; do
				for pf in 0 1; do
					one_pass ckv "$t" "$b" $pf "$c"
				done
			done
		done
	done
done

# --- full layers against fio -------------------------------------------------
echo
echo "full-layer reads of the $LONGEST-token prefix: kvfs, then fio with" \
	"kvfs's read size and batch depth, alternating"
# The extents' region in data.kvd (the longest prefix's blocks).
# The I/O path alone: with a chunk cache, every piece of a full read would
# also be copied into it (docs/benchmarks.md, 7d).
sed -i 's/^dram_capacity = .*/dram_capacity = 0/' "$STORE/kvfs.conf"
read -r reg_lo reg_hi < <(awk '{ if (lo == "" || $2 < lo) lo = $2
	if ($2 + $3 > hi) hi = $2 + $3 } END { print lo, hi }' "$WORK/extents")
for ((i = 1; i <= FULL_RUNS; i++)); do
	remount
	run_bc "$WORK/line" pass "$MNT" "$NS" --keys "$WORK/keys.$LONGEST" \
		--system full "${BGEOM[@]}" --compute-us 0 ||
		die "bench_chunks full pass failed"
	line=$(cat "$WORK/line")
	echo "$line" >>"$RESULTS"
	# fio: kvfs's average read (4 KiB multiple) and reads per batch.
	read -r bs qd bytes < <(awk -v l="$line" 'BEGIN {
		n = split(l, f, " ")
		for (j = 2; j <= n; j++) { split(f[j], kv, "="); v[kv[1]] = kv[2] }
		bs = int(v["read"] / v["ssd_reads"] / 4096 + 0.5) * 4096
		qd = int(v["ssd_reads"] / v["batches"] + 0.5)
		if (qd < 1) qd = 1
		if (qd > 256) qd = 256
		print bs, qd, v["read"] }')
	out=$("$FIO" --name=chunks --filename="$STORE/data.kvd" --readonly \
		--direct=1 --ioengine=io_uring --rw=randread --bs="$bs" \
		--iodepth="$qd" --offset="$reg_lo" --size=$((reg_hi - reg_lo)) \
		--io_size="$bytes" --runtime=30 --randrepeat=0 \
		--output-format=terse --terse-version=3 2>/dev/null) ||
		die "fio failed"
	fbw=$(cut -d';' -f7 <<<"$out")
	echo "FIO bw=$((fbw * 1024)) bs=$bs iodepth=$qd" >>"$RESULTS"
	awk -v l="$line" -v fbw="$fbw" -v bs="$bs" -v qd="$qd" 'BEGIN {
		n = split(l, f, " ")
		for (j = 2; j <= n; j++) { split(f[j], kv, "="); v[kv[1]] = kv[2] }
		printf "  run %d: kvfs %.2f GB/s (%d reads, %d batches); " \
			"fio bs=%dK iodepth=%d %.2f GB/s\n", '"$i"',
			v["wanted"] / v["load_ns"], v["ssd_reads"], v["batches"],
			bs / 1024, qd, fbw * 1024 / 1e9 }'
done
[ "$FULL_RUNS" -gt 0 ] &&
	echo "  \$ fio --name=chunks --filename=\$WORK/store/data.kvd" \
		"--readonly --direct=1 --ioengine=io_uring --rw=randread" \
		"--bs=$bs --iodepth=$qd --offset=$reg_lo" \
		"--size=$((reg_hi - reg_lo)) --io_size=$bytes --runtime=30" \
		"--randrepeat=0"

unmount
[ -n "${BENCH_CHUNKS_RESULTS:-}" ] && cat "$RESULTS" >>"$BENCH_CHUNKS_RESULTS"
echo
echo "  load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at end"
"$BC" report "$RESULTS" --summary "$SUMMARY" || die "report failed"

if [ -z "$SUMMARY_OUT" ]; then
	echo
	echo "summary (medians; ratio = kvfs / baseline)"
	row='  %-44s %10s %10s %-5s %7s %s\n'
	# shellcheck disable=SC2059 # the format is ours
	printf "$row" figure kvfs baseline unit ratio target
	while IFS='|' read -r label k b unit ratio target; do
		# shellcheck disable=SC2059
		printf "$row" "$label" "$k" "$b" "$unit" "$ratio" "$target"
	done <"$SUMMARY"
fi
exit 0
