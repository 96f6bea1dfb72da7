#!/usr/bin/env bash
# make demo: make a store, mount it, run a realistic prefix-cache workload
# through the mount, show what an admin sees, and unmount.
set -eu
export LC_ALL=C
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD/bin ;; *) BIN=$PWD/$BUILD/bin ;; esac
DIR=$(mktemp -d /var/tmp/kvfs-demo.XXXXXX)
STORE=$DIR/store
MNT=$DIR/mnt
NS=llama3-8b
PID=
mkdir -p "$MNT"

cleanup() {
	if grep -q " $MNT fuse" /proc/mounts; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT"
	fi
	[ -z "$PID" ] || timeout 120 tail --pid="$PID" -f /dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# Llama-3-8B's KV geometry: 32 layers, 8 KV heads of 128, bf16. A block of
# 16 tokens holds 32*16*2*8*128*2 bytes = 2 MiB of K and V.
GEOM=(--ns "$NS" --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16
	--block-tokens 16 --chunk-tokens 16)

step "mkfs.kvfs: a store with a 512 MiB SSD data file"
"$BIN/mkfs.kvfs" --ssd-size 512M "$STORE"
cat >"$STORE/kvfs.conf" <<EOC
# DRAM holds 32 blocks; the workload writes 50, so the coldest are written
# back to the SSD data file and dropped from DRAM.
[tier.dram]
capacity = 64M

# The device tier: a shared-memory pool standing in for GPU memory, which
# .kvfs/ctl FETCH fills and engines map.
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
EOC

step "mount"
"$BIN/kvfs" "$STORE" "$MNT"
PID=$(cat "$STORE/kvfs.pid")
echo "mounted on $MNT (daemon pid $PID)"

step "engine: 8 requests sharing a 32-token system prompt, 8 blocks each"
"$BIN/kvfs-gen" write "$MNT/$NS" "${GEOM[@]}" --prefixes 8 --blocks 8 --shared 2 --tail 9 --seed 42

step "engine: read every block back (read()) and check its bytes"
"$BIN/kvfs-gen" verify "$MNT/$NS" "${GEOM[@]}"
step "engine: again through mmap()"
"$BIN/kvfs-gen" verify "$MNT/$NS" "${GEOM[@]}" --mmap

if [ -x "$BIN/kvfs-engine" ]; then
	step "example engine (libkvfs): requests with shared prefixes; hits fetched into the device pool and into engine memory per layer"
	"$BIN/kvfs-engine" "$MNT" --ns "$NS" --requests 24 --prefixes 4 --blocks 16 --shared 4 --seed 42
fi

step "ls -l $NS (first 8 of $(ls "$MNT/$NS" | wc -l))"
ls -l "$MNT/$NS" | head -n 9

first=$(ls "$MNT/$NS" | head -n 1)
step "pin one block in DRAM, then getfattr -d"
setfattr -n user.kvfs.pin -v dram "$MNT/$NS/$first"
getfattr --absolute-names -d "$MNT/$NS/$first"
getfattr --absolute-names -d "$MNT/$NS"

step "df"
df -h "$MNT"

step ".kvfs/stats"
cat "$MNT/.kvfs/stats"

step "kvfsctl status"
"$BIN/kvfsctl" status "$MNT"

step "unmount (every committed block is persisted first)"
fusermount3 -u "$MNT"
timeout 120 tail --pid="$PID" -f /dev/null
PID=
echo "unmounted; the store's log:"
tail -n 4 "$STORE/kvfs.log"
