#!/usr/bin/env bash
# Two hosts sharing blocks through the remote tier (docs/remote.md): a
# 3-master Redis Cluster on free loopback ports and two kvfs daemons with
# separate stores. A writes chains; B, empty, reads every block byte for
# byte through read() and through FETCH; a value garbled in the cluster is
# refused on B and never served; a master killed mid-run (both daemons
# stay up, local reads work, remote-only reads fail fast) and restarted
# (the tier recovers by itself); A killed with -9 after its write-back (B
# still reads everything); write = through (fsync waits for the SET, and
# fails with EIO without the cluster). Mounts and servers always go.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/redis_lib.sh"
. "$(dirname "$0")/host_b.sh"

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ITESTS=$BUILD/itests ;; *) ITESTS=$ROOT/$BUILD/itests ;; esac
RC=$ITESTS/redis_client
CL=$ITESTS/remote_client

# Daemons first (their queues drain, bounded), then the servers.
trap 'kvfs_unmount; unmount_b; redis_stop_all; t_cleanup' EXIT

if ! redis_require; then
	t_done
	exit 1
fi

cluster_create
t_check "3-master cluster on free ports $P1 $P2 $P3" cluster_ok "$P1" "$P2" "$P3"
export REMOTE_TIMEOUT_MS=200

# remote_conf STORE WRITE [EXTRA]: the test namespace and [tier.remote].
remote_conf() {
	local s=$1 w=$2
	STORE=$s kvfs_conf 16M
	cat >>"$s/kvfs.conf" <<EOC

[tier.remote]
nodes = $NODES
write = $w
timeout = 200ms
EOC
	[ -n "${3:-}" ] && printf '%s\n' "$3" >>"$s/kvfs.conf"
	return 0
}

mount_a() {
	kvfs_mount
}

# A's write-back is done, locally and to the cluster.
a_sent() {
	for _ in $(seq 200); do
		[ "$(stat_a writeback.queued)" = 0 ] &&
			[ "$(stat_a tier.remote.queued)" = 0 ] && return 0
		sleep 0.05
	done
	return 1
}

kvfs_mkfs 64M
"$BIN/mkfs.kvfs" --ssd-size 64M "$STORE_B" >/dev/null
remote_conf "$STORE" back
remote_conf "$STORE_B" back "
[tier.gpu]
backend = shm
capacity = 4M"
t_check "host A mounts with the remote tier" mount_a
t_check "host B mounts with an empty store" mount_b
t_check "the stats show the remote tier: 3 nodes" [ "$(stat_b tier.remote.nodes)" = 3 ]
t_check "kvfsctl status shows the remote tier" \
	grep -q '^remote 3 nodes' <<<"$("$BIN/kvfsctl" status "$MNT_B")"

# -- A writes; B reads through read() and through FETCH ------------------
t_check "A writes chain 1 (24 blocks)" $CL "$MNT" write 24 1 fsync
t_check "A writes chain 2 (16 blocks)" $CL "$MNT" write 16 2
t_check "A writes chains 3 and 4 (8 blocks each)" \
	sh -c "$CL $MNT write 8 3 >/dev/null && $CL $MNT write 8 4 >/dev/null"
t_check "A's write-back reaches the cluster" a_sent
t_log "A: tier.remote.bytes_written $(stat_a tier.remote.bytes_written)"
t_check "ls on B lists local blocks only: none" [ -z "$(ls "$MNT_B/m")" ]

out=$($CL "$MNT_B" lookup 8 4)
t_check "a plain LOOKUP on B stays local (0 cached)" [ "$out" = 0 ]
out=$($CL "$MNT_B" lookup 8 4 remote)
t_check "LOOKUP with KVFS_CTL_F_REMOTE brings the prefix in (8)" [ "$out" = 8 ]

out=$($CL "$MNT_B" read 24 1)
t_log "$out"
t_check "B reads chain 1 through read(), byte for byte" \
	grep -q '^read ok 24 missing 0 bad 0 err 0 ' <<<"$out"
out=$($CL "$MNT_B" fetch 16 2)
t_log "$out"
t_check "B FETCHes chain 2 into the pool, byte for byte" \
	grep -q '^fetch ok 16 missing 0 bad 0 err 0 ' <<<"$out"
t_check "B counted the remote hits (>= 48)" [ "$(stat_b tier.remote.hits)" -ge 48 ]

F=$("$BIN/kvfs-gen" key --ns m --tokens "$(seq -s, 100000 100015)")
t_check "the first block of chain 1 is now listed on B" test -n "$(ls "$MNT_B/m" | grep "$F")"
t_check "user.kvfs.tier on B names the remote tier" \
	grep -q 'remote' <<<"$(getfattr --only-values -n user.kvfs.tier "$MNT_B/m/$F.kv")"
sleep 0.5
t_check "B persisted the fetched block (user.kvfs.durable = 1)" \
	[ "$(getfattr --only-values -n user.kvfs.durable "$MNT_B/m/$F.kv")" = 1 ]
t_check "B sent nothing back (the blocks came from there)" \
	[ "$(stat_b tier.remote.bytes_written)" = 0 ]

# -- a remote-only key: stat and open work -------------------------------
K5=$($RC "$NODES" key 5 3 | cut -d: -f3)
t_check "stat of a remote-only key on B gives its size" \
	[ "$(stat -c %s "$MNT_B/m/$K5.kv")" -gt 0 ]

# -- garbage in the cluster is refused and never served ------------------
K6=$($RC "$NODES" key 6 3 | cut -d: -f3)
$RC "$NODES" garble 6 3
rej0=$(stat_b tier.remote.rejected)
out=$($CL "$MNT_B" read 8 3 6)
t_log "$out"
t_check "a garbled value is refused on B: ENOENT, never served" \
	grep -q '^read ok 1 missing 1 bad 0 err 0 ' <<<"$out"
t_check "and counted in tier.remote.rejected" \
	[ "$(stat_b tier.remote.rejected)" -gt "$rej0" ]
t_check "the garbled value was deleted from the cluster" \
	[ "$(redis-cli -c -p "$P1" exists "$($RC "$NODES" key 6 3)")" = 0 ]
t_check "the refused block is not on B" [ ! -e "$MNT_B/m/$K6.kv" ]

# -- a master killed mid-run ---------------------------------------------
t_check "A writes chain 5 (32 blocks)" $CL "$MNT" write 32 5
t_check "A's write-back of chain 5 reaches the cluster" a_sent
kill -KILL "${PIDS[2]}"
sleep 0.3
t_check "A still serves its own blocks" \
	grep -q '^read ok 32 missing 0 ' <<<"$($CL "$MNT" read 32 5)"
t_check "B still serves what it fetched" \
	grep -q '^read ok 24 missing 0 ' <<<"$($CL "$MNT_B" read 24 1)"
out=$($CL "$MNT_B" read 32 5)
t_log "$out"
ms=$(awk '{ print $11 }' <<<"$out")
t_check "remote-only reads: the live masters' blocks served, the dead one's fail" \
	awk '$3 > 0 && $5 > 0 && $7 == 0 { ok = 1 } END { exit !ok }' <<<"$out"
t_check "and fail fast: 32 reads in ${ms} ms (< 3000)" \
	awk -v m="$ms" 'BEGIN { exit !(m < 3000) }'
t_check "both daemons stay up" kill -0 "$KVFS_PID" "$B_PID"
t_check "the faults are counted" [ "$(stat_b tier.remote.errors)" -gt 0 ]

t_check "the master restarts (its data is gone)" redis_restart "$P3"
t_check "A writes chain 6 (32 blocks)" $CL "$MNT" write 32 6
ok=0
for _ in $(seq 50); do
	a_sent && out=$($CL "$MNT_B" read 32 6) && { ok=1; break; }
	sleep 0.2
done
t_log "$out"
t_check "the tier recovered by itself: B reads chain 6 whole" [ $ok = 1 ]

# -- A killed with -9 after its write-back ------------------------------
t_check "A writes chain 7 (16 blocks)" $CL "$MNT" write 16 7
t_check "A's write-back of chain 7 reaches the cluster" a_sent
kill -KILL "$KVFS_PID"
timeout 10 tail --pid="$KVFS_PID" -f /dev/null
kvfs_unmount
out=$($CL "$MNT_B" read 16 7)
t_log "$out"
t_check "A is gone: B still reads all of chain 7" \
	grep -q '^read ok 16 missing 0 bad 0 err 0 ' <<<"$out"

# -- write = through ----------------------------------------------------
remote_conf "$STORE" through
t_check "A remounts after kill -9, with write = through" mount_a
t_check "A writes chain 8 with fsync" $CL "$MNT" write 8 8 fsync
out=$($CL "$MNT_B" read 8 8)
t_check "fsync returned after the SET: B reads chain 8 at once" \
	grep -q '^read ok 8 missing 0 ' <<<"$out"
redis_stop_all
out=$($CL "$MNT" write 4 9 fsync 2>&1)
t_log "$out"
t_check "without the cluster, fsync fails with EIO" \
	grep -q 'Input/output error' <<<"$out"
t_check "the block is local all the same" \
	grep -q '^read ok 4 missing 0 ' <<<"$($CL "$MNT" read 4 9)"
t_check "the failed SET is logged" grep -q 'the remote SET failed' "$STORE/kvfs.log"
t_check "both daemons still up" kill -0 "$KVFS_PID" "$B_PID"

t_done
