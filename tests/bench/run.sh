#!/usr/bin/env bash
# kvfs benchmarks (`make bench`): figures only, nothing is asserted.
#
# Every figure is a ratio against a baseline measured in the same run, by
# the same program (BUILD/bench/bench_io), alternating kvfs and baseline
# samples; each figure is the median of its samples. docs/benchmarks.md
# explains what each one measures and records results.
#
# Environment: BUILD (default build), BENCH_TMP (where the store goes,
# default /tmp; it should be a real disk, not tmpfs), BENCH_ITERS (samples
# per read figure, default 48), BENCH_SSD_ITERS (default 12),
# BENCH_CREATE_REPS (default 7), BENCH_CREATE_BLOCKS (default 16).
set -u
export LC_ALL=C
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
case "$BUILD" in
/*) BDIR=$BUILD ;;
*) BDIR=$PWD/$BUILD ;;
esac
BIN=$BDIR/bin
BIO=$BDIR/bench/bench_io
ITERS=${BENCH_ITERS:-48}
SSD_ITERS=${BENCH_SSD_ITERS:-12}
CREATE_REPS=${BENCH_CREATE_REPS:-7}
CREATE_BLOCKS=${BENCH_CREATE_BLOCKS:-16}
# Blocks rotated through by the read figures: 16 x 2 MiB is beyond a
# typical last-level cache, as when an engine loads a long prefix.
READ_SET=16

for p in "$BIN/mkfs.kvfs" "$BIN/kvfs" "$BIN/kvfs-gen" "$BIO"; do
	if [ ! -x "$p" ]; then
		echo "bench: $p missing; run make BUILD=$BUILD all" >&2
		exit 1
	fi
done

WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/kvfs-bench.XXXXXX") || exit 1
SHM=$(mktemp -d /dev/shm/kvfs-bench.XXXXXX) || { rm -rf "$WORK"; exit 1; }
STORE=$WORK/store
MNT=$WORK/mnt
NS=m
SUMMARY=$WORK/summary
KVFS_PID=
mkdir -p "$MNT" "$SHM/read" "$SHM/src" "$SHM/create"
: >"$SUMMARY"

# Llama-3-8B-like geometry: 32 layers x 8 KV heads x head_dim 128 in bf16,
# 16 tokens per block = 2 MiB of K and V plus 8 KiB of header and tokens.
GEOM=(--ns "$NS" --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16
	--block-tokens 16 --chunk-tokens 16)

unmount() {
	if mountpoint -q "$MNT" 2>/dev/null; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT"
	elif grep -q " $MNT fuse" /proc/mounts; then
		fusermount3 -u -z "$MNT" 2>/dev/null
	fi
	if [ -n "$KVFS_PID" ]; then
		# The store is free (all blocks persisted) once the daemon
		# has exited, not when fusermount3 returns.
		timeout 60 tail --pid="$KVFS_PID" -f /dev/null
		KVFS_PID=
	fi
}

cleanup() {
	unmount
	rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
	echo "bench: $*" >&2
	[ -f "$STORE/kvfs.log" ] && tail -n 5 "$STORE/kvfs.log" >&2
	exit 1
}

mount_kvfs() {
	"$BIN/kvfs" "$STORE" "$MNT" || die "mount failed"
	KVFS_PID=$(cat "$STORE/kvfs.pid")
}

# figure TITLE CMD...: print the title and the command, then run it.
figure() {
	local title=$1
	shift
	local cmd="$*"

	# Readable: the temp dirs by name, the block list by count.
	cmd=${cmd//"$NAMES_STR"/"<${#NAMES[@]} block names>"}
	cmd=${cmd//"$WORK"/"\$WORK"}
	cmd=${cmd//"$SHM"/"\$SHM"}
	cmd=${cmd//"$BDIR"/"\$BUILD"}
	printf '\n%s\n  $ %s\n' "$title" "$cmd"
	"$@" --summary "$SUMMARY" || echo "    (no figure: the command failed)"
}

# --- the machine --------------------------------------------------------
tmpdev=$(df --output=source "$WORK" | tail -n1)
tmpfstype=$(findmnt -no FSTYPE -T "$WORK" 2>/dev/null || stat -f -c %T "$WORK")
blk=$(basename "$tmpdev")
disk=unknown
if [ -e "/sys/class/block/$blk" ]; then
	d=$(basename "$(readlink -f "/sys/class/block/$blk/..")")
	[ -e "/sys/block/$blk" ] && d=$blk
	rot=$(cat "/sys/block/$d/queue/rotational" 2>/dev/null)
	model=$(cat "/sys/block/$d/device/model" 2>/dev/null | tr -s ' ')
	case "$d" in
	vd*) disk="virtio-blk ($d)" ;;
	nvme*) disk="NVMe ($d${model:+, $model})" ;;
	*) disk="$d${model:+ ($model)}, rotational=$rot" ;;
	esac
fi
echo "kvfs benchmarks  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "  machine: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), kernel $(uname -r), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM"
echo "  \$WORK:   $WORK on $tmpdev ($tmpfstype, $disk); baseline files in \$SHM = $SHM (tmpfs)"
echo "  load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at start"
[ "$tmpfstype" = tmpfs ] &&
	echo "  WARNING: the store is on tmpfs; set BENCH_TMP to a disk"

# --- store and workload --------------------------------------------------
"$BIN/mkfs.kvfs" --ssd-size 256M "$STORE" >/dev/null || die "mkfs failed"
cat >"$STORE/kvfs.conf" <<EOF
[daemon]
log_level = warn

[tier.dram]
capacity = 512M

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
mount_kvfs
# 3 chains of 8 blocks: 24 blocks, all DRAM-resident (and written back).
"$BIN/kvfs-gen" write "$MNT/$NS" "${GEOM[@]}" --prefixes 3 --blocks 8 \
	--shared 0 --quiet || die "kvfs-gen write failed"
mapfile -t ALL < <(ls "$MNT/$NS")
[ "${#ALL[@]}" -ge $((2 * SSD_ITERS)) ] || die "only ${#ALL[@]} blocks"
NAMES=("${ALL[@]:0:READ_SET}")
NAMES_STR="${NAMES[*]}"
for n in "${NAMES[@]}"; do
	cp "$MNT/$NS/$n" "$SHM/read/$n" || die "cp $n failed"
done
size=$(stat -c %s "$MNT/$NS/${NAMES[0]}")
tier=$(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/${NAMES[0]}")
echo "  blocks:  $size bytes each; ${#NAMES[@]} rotated through for reads; tier $tier"

# --- 1. read() of DRAM-resident blocks -----------------------------------
figure "[1a] read() of a DRAM block, first read through FUSE (page cache dropped with POSIX_FADV_DONTNEED before each sample)" \
	"$BIO" read --drop --iters "$ITERS" --names kvfs,tmpfs \
	--label "read() first read (DRAM tier)" --target 0.50 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"
figure "[1b] read() of a DRAM block, page-cache re-read (open + read + close)" \
	"$BIO" read --iters "$ITERS" --names kvfs,tmpfs \
	--label "read() page-cache re-read" --target 0.50 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"

# --- 2. mmap re-read -----------------------------------------------------
figure "[2a] mmap re-read (open + mmap + copy out + munmap + close, pages cached)" \
	"$BIO" mmap --iters "$ITERS" --names kvfs,tmpfs \
	--label "mmap re-read (with open/close)" --target 0.90 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"
figure "[2b] mmap re-read, file kept open (mmap + copy out + munmap)" \
	"$BIO" mmap --hold --iters "$ITERS" --names kvfs,tmpfs \
	--label "mmap re-read (fd held open)" --target 0.90 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"

# --- 4. creates (before the remount: DRAM has room) ------------------------
# Same geometry, another seed: new keys, valid in namespace m.
"$BIN/kvfs-gen" write "$SHM/src" "${GEOM[@]}" --prefixes 1 \
	--blocks "$CREATE_BLOCKS" --shared 0 --seed 4242 --quiet ||
	die "kvfs-gen write to tmpfs failed"
figure "[4] block creates (open O_CREAT + write 2 MiB + close; kvfs validates and commits to DRAM on close)" \
	"$BIO" create --iters "$CREATE_REPS" --stats "$MNT/.kvfs/stats" \
	--names kvfs,tmpfs --label "block creates" \
	"$SHM/src" "$MNT/$NS" "$SHM/create"

# --- 3. SSD-resident blocks ----------------------------------------------
# A remount starts with every block on the SSD only and an empty page
# cache; the extents come from the store's metadata while it is unmounted.
unmount
"$BIO" extents "$STORE" "${ALL[@]}" >"$WORK/extents" ||
	die "could not read the extents"
mount_kvfs
echo
echo "  after remount: ${ALL[0]} tier $(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/${ALL[0]}")"
figure "[3] read() of an SSD-only block (cold: io_uring O_DIRECT + checksum verify + copy), against O_DIRECT pread of another block's extent in data.kvd" \
	"$BIO" ssd --iters "$SSD_ITERS" --names kvfs,O_DIRECT \
	--label "SSD block read()" --target 0.80 \
	--dir "$MNT/$NS" --map "$WORK/extents" --data "$STORE/data.kvd"

# --- summary ------------------------------------------------------------
echo
echo "  load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at end"
echo
echo "summary (medians; ratio = kvfs / baseline)"
printf '  %-32s %12s %12s %-10s %6s %7s\n' figure kvfs baseline unit ratio target
while IFS='|' read -r label k b unit ratio target; do
	printf '  %-32s %12s %12s %-10s %6s %7s\n' "$label" "$k" "$b" "$unit" \
		"$ratio" "$target"
done <"$SUMMARY"
exit 0
