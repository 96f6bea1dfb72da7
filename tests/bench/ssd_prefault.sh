#!/usr/bin/env bash
# Figure [3a] (read() of an SSD-only block against an O_DIRECT pread of
# another block's extent) with [tier.dram] prefault = no and = yes, in one
# run on one store: rounds alternate the two configs, remounting between
# them so every block is on the SSD only again, and each round reads
# blocks no round read before.  `make bench` runs it after run.sh.
#
# Environment: BUILD, BENCH_TMP as in run.sh; BENCH_AB_ROUNDS rounds per
# config (default 4); BENCH_SSD_ITERS samples per round (default 20).
# Prints each round's figure, then the median ratio per config.
set -u
export LC_ALL=C
cd "$(dirname "$0")/../.." || exit 1

BUILD=${BUILD:-build}
case "$BUILD" in
/*) BDIR=$BUILD ;;
*) BDIR=$PWD/$BUILD ;;
esac
BIN=$BDIR/bin
BIO=$BDIR/bench/bench_io
ROUNDS=${BENCH_AB_ROUNDS:-4}
ITERS=${BENCH_SSD_ITERS:-20}
NS=m
KVFS_PID=
for p in "$BIN/kvfs" "$BIN/mkfs.kvfs" "$BIN/kvfs-gen" "$BIO"; do
	[ -x "$p" ] || {
		echo "ssd_prefault: $p missing; run make BUILD=$BUILD all" >&2
		exit 1
	}
done
WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/kvfs-prefault.XXXXXX") || exit 1
STORE=$WORK/store
MNT=$WORK/mnt
mkdir -p "$MNT"

unmount() {
	if mountpoint -q "$MNT" 2>/dev/null; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT"
	fi
	if [ -n "$KVFS_PID" ]; then
		timeout 60 tail --pid="$KVFS_PID" -f /dev/null
		KVFS_PID=
	fi
}
cleanup() {
	unmount
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() {
	echo "ssd_prefault: $*" >&2
	exit 1
}
# write_conf yes|no
write_conf() {
	cat >"$STORE/kvfs.conf" <<EOF
[daemon]
log_level = warn

[tier.dram]
capacity = 512M
prefault = $1

[policy]
name = lru

[namespace $NS]
layers = 32
kv_heads = 8
head_dim = 128
dtype = bf16
block_tokens = 16
chunk_tokens = 16
EOF
}
mount_kvfs() {
	"$BIN/kvfs" "$STORE" "$MNT" || die "mount failed"
	KVFS_PID=$(cat "$STORE/kvfs.pid")
}

GEOM=(--ns "$NS" --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16
	--block-tokens 16 --chunk-tokens 16)
"$BIN/mkfs.kvfs" --ssd-size 1G "$STORE" >/dev/null || die "mkfs failed"
write_conf no
# Each round reads ITERS blocks through kvfs and ITERS other extents.
need=$((2 * ROUNDS * 2 * ITERS))
mount_kvfs
"$BIN/kvfs-gen" write "$MNT/$NS" "${GEOM[@]}" \
	--prefixes $(((need + 7) / 8)) --blocks 8 --shared 0 --quiet ||
	die "kvfs-gen write failed"
mapfile -t ALL < <(ls "$MNT/$NS")
unmount
"$BIO" extents "$STORE" "${ALL[@]}" >"$WORK/extents" ||
	die "could not read the extents"
echo "kvfs [3a] with [tier.dram] prefault = no and yes" \
	"$(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  ${#ALL[@]} blocks; $ROUNDS rounds per config, $ITERS samples each"
per=$((2 * ITERS))
r=0
for ((k = 0; k < ROUNDS; k++)); do
	for pf in no yes; do
		sed -n "$((r * per + 1)),$(((r + 1) * per))p" "$WORK/extents" \
			>"$WORK/map"
		r=$((r + 1))
		write_conf "$pf"
		mount_kvfs
		out=$("$BIO" ssd --iters "$ITERS" --names kvfs,O_DIRECT \
			--label "[3a] prefault = $pf" --dir "$MNT/$NS" \
			--map "$WORK/map" --data "$STORE/data.kvd")
		unmount
		ratio=$(awk '$1 == "ratio" { print $2 }' <<<"$out")
		kv=$(awk '$1 == "kvfs" { print $2 }' <<<"$out")
		od=$(awk '$1 == "O_DIRECT" { print $2 }' <<<"$out")
		[ -n "$ratio" ] || die "bench_io ssd printed no ratio: $out"
		echo "  round $((k + 1)) prefault = $pf: kvfs $kv GB/s," \
			"O_DIRECT $od GB/s, ratio $ratio"
		echo "$pf $ratio" >>"$WORK/ratios"
	done
done
for pf in no yes; do
	awk -v n="$pf" '$1 == n { print $2 }' "$WORK/ratios" | sort -g |
		awk -v n="$pf" '{ v[NR] = $1 }
			END { printf "  prefault = %s: median ratio %.2f (range %.2f-%.2f)\n",
				n, v[int((NR + 1) / 2)], v[1], v[NR] }'
done
