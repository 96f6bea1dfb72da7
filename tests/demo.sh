#!/usr/bin/env bash
# make demo: make a store, mount it, run a realistic prefix-cache workload
# through the mount, show what an admin sees, and unmount.  Act 2: two
# hosts share a Redis Cluster on loopback (the remote tier,
# docs/remote.md); one writes a prefix, the other, with an empty store,
# serves it.
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

# Act 2's hosts: mount points and daemons.
MNTS=()
PIDS2=()
. tests/integration/redis_lib.sh
REDIS_DIR=$DIR

cleanup() {
	local m p
	for m in "$MNT" "${MNTS[@]}"; do
		if grep -q " $m fuse" /proc/mounts; then
			fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m"
		fi
	done
	for p in "$PID" "${PIDS2[@]}"; do
		[ -z "$p" ] || timeout 120 tail --pid="$p" -f /dev/null
	done
	redis_stop_all
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

# ---- act 2: two hosts share prefixes through a Redis Cluster ----------

step "act 2: a 3-master Redis Cluster on loopback (redis-cli --cluster create)"
cluster_create
echo "masters on 127.0.0.1 ports $P1 $P2 $P3"

# host NAME: a store with [tier.remote] on the cluster, mounted.
host() {
	local s=$DIR/$1 m=$DIR/mnt-$1
	mkdir -p "$m"
	"$BIN/mkfs.kvfs" --ssd-size 256M "$s" >/dev/null
	cat >"$s/kvfs.conf" <<EOC
[tier.dram]
capacity = 64M

[tier.remote]
nodes = 127.0.0.1:$P1
write = back
timeout = 200ms

[namespace $NS]
layers = 32
kv_heads = 8
head_dim = 128
dtype = bf16
block_tokens = 16
chunk_tokens = 16
EOC
	"$BIN/kvfs" "$s" "$m"
	MNTS+=("$m")
	PIDS2+=("$(cat "$s/kvfs.pid")")
	echo "host $1: empty store $s, mounted on $m"
}
host a
host b
A=$DIR/mnt-a
B=$DIR/mnt-b

step "host a: an engine writes 2 requests sharing a 32-token prompt (16 blocks of 2 MiB)"
"$BIN/kvfs-gen" write "$A/$NS" "${GEOM[@]}" --prefixes 2 --blocks 8 --shared 2 --seed 7 --log "$DIR/keys"
for _ in $(seq 100); do
	q=$(awk '$1 == "tier.remote.queued" || $1 == "writeback.queued" { s += $2 } END { print s }' "$A/.kvfs/stats")
	[ "$q" = 0 ] && break
	sleep 0.1
done
echo "host a sent its blocks to the cluster after the local write-back"

step "host b: ls $NS lists local blocks only ($(ls "$B/$NS" | wc -l) files)"

step "host b: open and read() every block by name: each comes from the cluster, checked, and is served"
"$BIN/kvfs-gen" verify "$B/$NS" "${GEOM[@]}" --log "$DIR/keys"
first=$(head -n 1 "$DIR/keys")
getfattr --absolute-names -n user.kvfs.tier "$B/$NS/$first.kv"
echo "host b now lists $(ls "$B/$NS" | wc -l) blocks (local from now on)"

step "host a: .kvfs/stats (tier.remote)"
grep '^tier.remote' "$A/.kvfs/stats"
step "host b: .kvfs/stats (tier.remote, cache)"
grep '^tier.remote\|^cache.blocks' "$B/.kvfs/stats"
step "host b: kvfsctl status"
"$BIN/kvfsctl" status "$B"

step "unmount both hosts and stop the cluster"
for m in "${MNTS[@]}"; do fusermount3 -u "$m"; done
for p in "${PIDS2[@]}"; do timeout 120 tail --pid="$p" -f /dev/null; done
MNTS=()
PIDS2=()
redis_stop_all
echo "done"
