#!/usr/bin/env bash
# The daemon driven by the paper policies through the mount: ARC keeps a
# re-used set in DRAM through a scan that flushes it out under LRU, and
# HotPrefix's selective admission discards cold blocks instead of keeping
# them on the SSD. Accesses reach the policy at the next eviction, so every
# step below is ordered by the writes themselves, not by timing.
. "$(dirname "$0")/lib.sh"

# The mover thread's timer (promotion plans, aging) would make the order of
# moves depend on timing: keep it out of these runs, so that accesses reach
# the policy only at evictions, in the order the test makes them.
export KVFS_FLUSH_MS=3600000

# DRAM holds 12 test blocks (40 KiB each).
hot_in_dram() {
	local n=0 k
	for k in $(cat "$T_DIR/hot"); do
		case $(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/$k") in
		*dram*) n=$((n + 1)) ;;
		esac
	done
	echo "$n"
}

# scenario POLICY READS: 8 hot blocks read READS times each, then a scan
# of 30 blocks written once. Prints how many hot blocks are still in DRAM.
scenario() {
	rm -rf "$STORE"
	kvfs_mkfs 64M
	kvfs_conf 480K "$1"
	kvfs_mount || return 1
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 --blocks 8 --shared 0 --seed 1 --fsync --quiet >/dev/null
	ls "$MNT/$NS" >"$T_DIR/hot"
	for i in $(seq "$2"); do
		for k in $(cat "$T_DIR/hot"); do cat "$MNT/$NS/$k" >/dev/null; done
	done
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 30 --blocks 1 --shared 0 --seed 2 --fsync --quiet >/dev/null
}

scenario lru 2
lru_kept=$(hot_in_dram)
t_check "lru: the scan flushed the re-used blocks out of DRAM ($lru_kept of 8 left)" test "$lru_kept" -le 1
t_check "lru: nothing discarded" test "$(kvfs_stat policy.discarded)" -eq 0
kvfs_unmount

scenario arc 2
arc_kept=$(hot_in_dram)
t_check "arc: the re-used blocks survived the scan in DRAM ($arc_kept of 8)" test "$arc_kept" -ge 7
t_check "arc: stats name the policy" test "$(awk '$1 == "policy.name" { print $2 }' "$MNT/.kvfs/stats")" = arc
t_check "arc: DRAM evictions happened" test "$(kvfs_stat tier.dram.evictions)" -ge 20
t_check "arc: every block still reads back" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
kvfs_unmount

scenario hotprefix 12
hp_kept=$(hot_in_dram)
disc=$(kvfs_stat policy.discarded)
t_check "hotprefix: the hot blocks stayed in DRAM ($hp_kept of 8)" test "$hp_kept" -ge 7
t_check "hotprefix: cold blocks were refused by selective admission and discarded ($disc)" test "$disc" -ge 15
left=$(ls "$MNT/$NS" | wc -l)
t_check "hotprefix: discarded blocks are gone from the namespace ($left = 38 - $disc)" test "$left" -eq $((38 - disc))
t_check "hotprefix: what remains reads back intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
kvfs_unmount

# kvfs's own policy: the blocks read twice were seen twice (main); the
# scan's blocks are first sights (probation), evicted first, and kept on
# the SSD (admitted: they are full blocks with a live parent).
scenario kvfs 2
kv_kept=$(hot_in_dram)
t_check "kvfs: the re-used blocks survived the scan in DRAM ($kv_kept of 8)" test "$kv_kept" -ge 7
t_check "kvfs: stats name the policy" test "$(awk '$1 == "policy.name" { print $2 }' "$MNT/.kvfs/stats")" = kvfs
t_check "kvfs: DRAM evictions happened" test "$(kvfs_stat tier.dram.evictions)" -ge 20
t_check "kvfs: nothing discarded" test "$(kvfs_stat policy.discarded)" -eq 0
t_check "kvfs: every block still reads back" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
kvfs_unmount

# A bad policy option is refused at start, naming it.
rm -rf "$STORE"
kvfs_mkfs 64M
kvfs_conf 480K "hotprefix
threshold = lots"
t_errno "bad policy option refused at mount" "Invalid argument\|threshold" "$BIN/kvfs" -f "$STORE" "$MNT"
kvfs_conf 480K "kvfs
window = 0"
t_errno "bad kvfs option refused at mount" "Invalid argument\|window" "$BIN/kvfs" -f "$STORE" "$MNT"
kvfs_conf 480K "kvfs
deep = -1"
t_errno "bad kvfs depth refused at mount" "Invalid argument\|deep" "$BIN/kvfs" -f "$STORE" "$MNT"
kvfs_conf 480K nosuchpolicy
t_errno "unknown policy refused at mount" "No such file\|nosuchpolicy\|unknown" "$BIN/kvfs" -f "$STORE" "$MNT"
t_done
