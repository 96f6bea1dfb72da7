#!/usr/bin/env bash
# kvfs benchmarks (`make bench`): figures only, nothing is asserted.
#
# Every figure is a ratio against a baseline measured in the same run, by
# the same program (BUILD/bench/bench_io), alternating one kvfs sample and
# one baseline sample; each figure is the median of its samples.
# docs/benchmarks.md explains what each one measures and records results.
#
# Environment:
#   BUILD                build directory (default build)
#   BENCH_TMP            where the store goes (default /tmp); a real disk,
#                        not tmpfs
#   BENCH_ITERS          samples per DRAM figure (default 128)
#   BENCH_SSD_ITERS      samples per SSD figure (default 20)
#   BENCH_CREATE_REPS    repetitions of the create figure (default 21)
#   BENCH_CREATE_BLOCKS  blocks created per repetition (default 16)
#   BENCH_GPU_FETCH_BYTES  prefix size of figure [11] (default 256M)
#   BENCH_GPU_FETCH_ITERS  samples of figure [11] (default 11)
#   BENCH_REMOTE_ITERS   samples per remote-tier figure (default 9)
#   BENCH_SIGHT_ITERS    samples per fleet-sightings figure (default 31)
#   BENCH_READ_AHEAD_KB  sets the mount's read_ahead_kb (default: leave the
#                        kernel's 128, which caps FUSE read-ahead requests
#                        at 128 KiB)
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
ITERS=${BENCH_ITERS:-128}
SSD_ITERS=${BENCH_SSD_ITERS:-20}
CREATE_REPS=${BENCH_CREATE_REPS:-21}
CREATE_BLOCKS=${BENCH_CREATE_BLOCKS:-16}
# Blocks the DRAM figures rotate through: 16 x 2 MiB is beyond a typical
# last-level cache, as when an engine loads a long prefix.
READ_SET=16

for p in "$BIN/mkfs.kvfs" "$BIN/kvfs" "$BIN/kvfs-gen" "$BIO"; do
	if [ ! -x "$p" ]; then
		echo "bench: $p missing; run make BUILD=$BUILD all" >&2
		exit 1
	fi
done

WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/kvfs-bench.XXXXXX") || exit 1
SHM=$(mktemp -d /dev/shm/kvfs-bench.XXXXXX) || {
	rm -rf "$WORK"
	exit 1
}
STORE=$WORK/store
MNT=$WORK/mnt
NS=m
SUMMARY=$WORK/summary
KVFS_PID=
RA_KB='?'
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
		# The store is free (every block persisted) once the daemon
		# has exited, not when fusermount3 returns.
		timeout 60 tail --pid="$KVFS_PID" -f /dev/null
		KVFS_PID=
	fi
}

# The remote tier's figures (12, 13) run their own cluster and mount;
# the fleet sightings' (15, 16) a server of their own.
. tests/integration/redis_lib.sh
REDIS_DIR=$WORK
RMNT=$WORK/rmnt
R_PID=
runmount() {
	if grep -q " $RMNT fuse" /proc/mounts; then
		fusermount3 -u "$RMNT" 2>/dev/null || fusermount3 -u -z "$RMNT"
	fi
	if [ -n "$R_PID" ]; then
		timeout 60 tail --pid="$R_PID" -f /dev/null
		R_PID=
	fi
}

# shellcheck disable=SC2317 # called by the trap
cleanup() {
	unmount
	runmount
	redis_stop_all
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
	local bdi

	"$BIN/kvfs" "$STORE" "$MNT" || die "mount failed"
	KVFS_PID=$(cat "$STORE/kvfs.pid")
	bdi=/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb
	if [ -n "${BENCH_READ_AHEAD_KB:-}" ]; then
		echo "$BENCH_READ_AHEAD_KB" >"$bdi" ||
			echo "  (could not set $bdi)"
	fi
	RA_KB=$(cat "$bdi" 2>/dev/null || echo "?")
}

tier_of() {
	getfattr --absolute-names --only-values -n user.kvfs.tier "$1" 2>/dev/null
}

# figure TITLE CMD...: print the title and the command, then run it.
figure() {
	local title=$1 cmd='' a
	shift
	for a in "$@"; do
		case "$a" in
		*' '*) cmd+=" '$a'" ;;
		*) cmd+=" $a" ;;
		esac
	done
	# Readable: the temp dirs by name, the block list by count.
	cmd=${cmd//" $NAMES_STR"/" <${#NAMES[@]} block names>"}
	cmd=${cmd//"$WORK"/"\$WORK"}
	cmd=${cmd//"$SHM"/"\$SHM"}
	cmd=${cmd//"$BDIR"/"\$BUILD"}
	printf '\n%s\n  $%s\n' "$title" "$cmd"
	"$@" --summary "$SUMMARY" || echo "    (no figure: the command failed)"
}

# --- the machine --------------------------------------------------------
tmpdev=$(df --output=source "$WORK" | tail -n1)
tmpfstype=$(findmnt -no FSTYPE -T "$WORK" 2>/dev/null ||
	stat -f -c %T "$WORK")
blk=$(basename "$tmpdev")
disk=unknown
if [ -e "/sys/class/block/$blk" ]; then
	d=$blk
	[ -e "/sys/block/$d" ] ||
		d=$(basename "$(readlink -f "/sys/class/block/$blk/..")")
	rot=$(cat "/sys/block/$d/queue/rotational" 2>/dev/null)
	model=$(tr -s ' ' 2>/dev/null <"/sys/block/$d/device/model")
	case "$d" in
	vd*) disk="virtio-blk $d" ;;
	nvme*) disk="NVMe $d${model:+, $model}" ;;
	*) disk="$d${model:+, $model}, rotational=$rot" ;;
	esac
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
mem=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
echo "kvfs benchmarks  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "  machine: $(nproc) CPUs ($cpu), kernel $(uname -r), $mem RAM"
echo "  \$WORK:   $WORK on $tmpdev ($tmpfstype, $disk)"
echo "  \$SHM:    $SHM (tmpfs: the baseline files)"
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
prefault = yes

[tier.gpu]
backend = shm
capacity = 256M

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
# Chains of 8 blocks, DRAM-resident (and written back): the read set, and
# after the remount two unread blocks per sample of each SSD figure.
chains=$(((4 * SSD_ITERS + 7) / 8))
[ "$chains" -ge $(((READ_SET + 7) / 8)) ] || chains=$(((READ_SET + 7) / 8))
"$BIN/kvfs-gen" write "$MNT/$NS" "${GEOM[@]}" --prefixes "$chains" \
	--blocks 8 --shared 0 --quiet || die "kvfs-gen write failed"
mapfile -t ALL < <(ls "$MNT/$NS")
NAMES=("${ALL[@]:0:READ_SET}")
NAMES_STR="${NAMES[*]}"
for n in "${NAMES[@]}"; do
	cp "$MNT/$NS/$n" "$SHM/read/$n" || die "cp $n failed"
done
size=$(stat -c %s "$MNT/$NS/${NAMES[0]}")
echo "  blocks:  ${#ALL[@]} of $size bytes;" \
	"the DRAM figures rotate through ${#NAMES[@]}"
echo "  mount:   tier of ${NAMES[0]}: $(tier_of "$MNT/$NS/${NAMES[0]}");" \
	"read_ahead_kb $RA_KB"

# --- 0. the fixed cost of a file through FUSE ----------------------------
t="[0] open + close of a block (diagnostic: the per-file cost"
t+=" inside the read figures)"
figure "$t" \
	"$BIO" open --iters "$ITERS" --names kvfs,tmpfs \
	--label "[0] open + close" \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"

# --- 1. read() of DRAM-resident blocks -----------------------------------
t="[1a] read() of a DRAM block, first read through FUSE (page cache"
t+=" dropped with POSIX_FADV_DONTNEED before each sample, untimed)"
figure "$t" \
	"$BIO" read --drop --iters "$ITERS" --names kvfs,tmpfs \
	--label "[1a] read() first read" --target 0.50 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"
t="[1b] read() of a DRAM block, page-cache re-read (open + read + close)"
figure "$t" \
	"$BIO" read --iters "$ITERS" --names kvfs,tmpfs \
	--label "[1b] read() page-cache re-read" --target 0.50 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"
t="[1c] read() of a DRAM block opened with O_DIRECT (no page cache:"
t+=" one copy, daemon to reader)"
figure "$t" \
	"$BIO" read --direct --iters "$ITERS" --names kvfs,tmpfs \
	--label "[1c] read() O_DIRECT" --target 0.50 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"

# --- 2. mmap re-read -----------------------------------------------------
t="[2a] mmap re-read (open + mmap + copy out + munmap + close, pages"
t+=" cached)"
figure "$t" \
	"$BIO" mmap --iters "$ITERS" --names kvfs,tmpfs \
	--label "[2a] mmap re-read" --target 0.90 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"
figure "[2b] mmap re-read, file kept open (mmap + copy out + munmap)" \
	"$BIO" mmap --hold --iters "$ITERS" --names kvfs,tmpfs \
	--label "[2b] mmap re-read, fd held" --target 0.90 \
	"$MNT/$NS" "$SHM/read" "${NAMES[@]}"

# --- 3. SSD-resident blocks ----------------------------------------------
# After a remount every block is on the SSD only and the page cache of the
# mount is empty; the extents come from the metadata while unmounted.
unmount
"$BIO" extents "$STORE" "${ALL[@]}" >"$WORK/extents" ||
	die "could not read the extents"
half=$(($(wc -l <"$WORK/extents") / 2))
head -n "$half" "$WORK/extents" >"$WORK/extents.a"
tail -n +"$((half + 1))" "$WORK/extents" >"$WORK/extents.b"
mount_kvfs
echo
echo "  remounted: tier of ${ALL[0]}: $(tier_of "$MNT/$NS/${ALL[0]}")"
t="[3a] read() of an SSD-only block (io_uring O_DIRECT + checksums +"
t+=" FUSE), against an O_DIRECT pread of another block's extent in"
t+=" data.kvd"
figure "$t" \
	"$BIO" ssd --iters "$SSD_ITERS" --names kvfs,O_DIRECT \
	--label "[3a] SSD block read()" --target 0.80 \
	--dir "$MNT/$NS" --map "$WORK/extents.a" --data "$STORE/data.kvd"
figure "[3b] the same, the kvfs file opened with O_DIRECT" \
	"$BIO" ssd --direct --iters "$SSD_ITERS" --names kvfs,O_DIRECT \
	--label "[3b] SSD block read() O_DIRECT" --target 0.80 \
	--dir "$MNT/$NS" --map "$WORK/extents.b" --data "$STORE/data.kvd"

# --- 4. creates ------------------------------------------------------------
# Same geometry, another seed: new keys, valid in namespace m.
"$BIN/kvfs-gen" write "$SHM/src" "${GEOM[@]}" --prefixes 1 \
	--blocks "$CREATE_BLOCKS" --shared 0 --seed 4242 --quiet ||
	die "kvfs-gen write to tmpfs failed"
t="[4] block creates (open O_CREAT + write 2 MiB + close; kvfs validates"
t+=" and commits to DRAM on close; write-back drained between repetitions)"
figure "$t" \
	"$BIO" create --iters "$CREATE_REPS" --stats "$MNT/.kvfs/stats" \
	--names kvfs,tmpfs --label "[4] block creates" \
	"$SHM/src" "$MNT/$NS" "$SHM/create"

# --- 5, 6. the control file ------------------------------------------------
if [ -x "$BDIR/bench/bench_ctl" ]; then
	"$BDIR/bench/bench_ctl" "$MNT" "$NS" --iters "${BENCH_CTL_ITERS:-2000}" \
		--summary "$SUMMARY" || echo "    (no figure: bench_ctl failed)"
fi

# --- 7. ContiguousKV (its own store and mount) -----------------------------
if [ -x "$BDIR/bench/bench_chunks" ]; then
	echo
	echo "[7] ContiguousKV: chunk-granular loads against 64-token chunks, and fio"
	BUILD=$BUILD tests/bench/chunks.sh --summary "$SUMMARY" ||
		echo "    (no figure: chunks.sh failed)"
fi

# --- 8, 9, 10. hidden-state restoration on this CPU (bench_hcache.c) -----
[ -x "$BDIR/bench/bench_hcache" ] && { "$BDIR/bench/bench_hcache" --dir "$WORK" --summary "$SUMMARY" || echo "    (no figure: bench_hcache failed)"; }

# --- 11. FETCH of a long prefix into the device pool, no mount ------------
# bench_gpu_fetch.c opens a cache in-process (store under $WORK) with the
# shm tier; on a GPU host the bundle (tests/gpu/bundle.sh) runs it with
# --backend cuda --bytes 2G.
if [ -x "$BDIR/bench/bench_gpu_fetch" ]; then
	"$BDIR/bench/bench_gpu_fetch" --backend shm \
		--bytes "${BENCH_GPU_FETCH_BYTES:-256M}" \
		--iters "${BENCH_GPU_FETCH_ITERS:-11}" --dir "$WORK" \
		--summary "$SUMMARY" ||
		echo "    (no figure: bench_gpu_fetch failed)"
fi

# --- 12, 13. the remote tier: fetch and write-back against raw Redis ----
# bench_remote.c: a 3-master Redis Cluster on loopback and a mount with an
# empty store and [tier.remote] on it; a 64-block prefix (2 MiB blocks)
# brought in from the cluster vs one pipelined batch of raw GETs of the
# same values, and the write-back queue vs raw pipelined SET NX.
if [ -x "$BDIR/bench/bench_remote" ] && command -v redis-server >/dev/null; then
	echo
	echo "[12, 13] the remote tier (Redis Cluster on loopback)"
	if cluster_create; then
		mkdir -p "$RMNT"
		"$BIN/mkfs.kvfs" --ssd-size 1G "$WORK/rstore" >/dev/null
		cat >"$WORK/rstore/kvfs.conf" <<EOC
[tier.dram]
capacity = 512M

[tier.gpu]
backend = shm
capacity = 256M

[tier.remote]
nodes = $NODES

[namespace $NS]
layers = 32
kv_heads = 8
head_dim = 128
dtype = bf16
block_tokens = 16
chunk_tokens = 16
EOC
		if "$BIN/kvfs" "$WORK/rstore" "$RMNT"; then
			R_PID=$(cat "$WORK/rstore/kvfs.pid")
			"$BDIR/bench/bench_remote" "$NODES" "$RMNT" "$NS" \
				--blocks 64 --iters "${BENCH_REMOTE_ITERS:-9}" \
				--summary "$SUMMARY" ||
				echo "    (no figure: bench_remote failed)"
			runmount
		fi
	else
		echo "    (no figure: the cluster did not start)"
	fi
	redis_stop_all
fi

# --- 14. time to first token of the reference engine (its own mount) ----
BUILD=$BUILD tests/bench/ttft.sh --summary "$SUMMARY" ||
	echo "    (no figure: ttft.sh failed)"

# --- 15, 16. fleet sightings: their cost on commits, and keys heard ----
# bench_sight.c: caches in-process (stores under $WORK), one publishing
# through a plain Redis server on loopback and one listening; commits with
# sightings on vs off, and keys heard through the server vs given to the
# policy directly.
if [ -x "$BDIR/bench/bench_sight" ]; then
	echo
	echo "[15, 16] fleet sightings (Redis on loopback)"
	if ! command -v redis-server >/dev/null; then
		echo "    (no figure: redis-server is not installed)"
	elif SP=$(free_port) && [ -n "$SP" ] && redis_start "$SP"; then
		"$BDIR/bench/bench_sight" --nodes "127.0.0.1:$SP" \
			--iters "${BENCH_SIGHT_ITERS:-31}" --dir "$WORK" \
			--summary "$SUMMARY" ||
			echo "    (no figure: bench_sight failed)"
	else
		echo "    (no figure: redis-server did not start)"
	fi
	redis_stop_all
fi

# --- summary ------------------------------------------------------------
echo
echo "  load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at end"
echo
echo "summary (medians; ratio = kvfs / baseline, higher is better)"
row='  %-32s %11s %11s %-10s %6s %7s\n'
# shellcheck disable=SC2059 # the format is ours
printf "$row" figure kvfs baseline unit ratio target
while IFS='|' read -r label k b unit ratio target; do
	# shellcheck disable=SC2059
	printf "$row" "$label" "$k" "$b" "$unit" "$ratio" "$target"
done <"$SUMMARY"
exit 0
