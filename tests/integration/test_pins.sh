#!/usr/bin/env bash
# DRAM pins across a restart whose DRAM tier is too small for them: the pins
# are kept, shown, explained in the log, and honoured once there is room.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount" kvfs_mount
t_check "write" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 4 --shared 1 --quiet
ls "$MNT/$NS" | sort >"$T_DIR/all"
sz=$(stat -c %s "$MNT/$NS/$(head -n1 "$T_DIR/all")")
t_log "block size $sz, $(wc -l <"$T_DIR/all") blocks"
head -n 6 "$T_DIR/all" >"$T_DIR/pinned"
while read -r n; do setfattr -n user.kvfs.pin -v dram "$MNT/$NS/$n" || t_fail "pin $n"; done <"$T_DIR/pinned"
t_check "6 dram pins" test "$(kvfs_stat cache.dram_pins)" = 6
t_check "unmount" kvfs_unmount
sed -i 's/^capacity = 16M$/capacity = 160K/' "$STORE/kvfs.conf"
t_check "remount with a small DRAM tier" kvfs_mount
t_log "$(kvfs_stat tier.dram.blocks) resident, $(kvfs_stat cache.dram_pins_waiting) waiting"
t_check "some pins wait" test "$(kvfs_stat cache.dram_pins_waiting)" -gt 0
t_check "every pin visible" sh -c "while read -r n; do test \"\$(getfattr --absolute-names --only-values -n user.kvfs.pin '$MNT/$NS/'\$n)\" = dram || exit 1; done <'$T_DIR/pinned'"
t_check "log says why" grep -q "DRAM pin kept but not loaded: the DRAM tier is full of pinned blocks" "$STORE/kvfs.log"
grep "pin" "$STORE/kvfs.log" | tail -n 3 | sed 's/^/# log: /'
w=
while read -r n; do
	if [ "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/$n")" = ssd ]; then w=$n; break; fi
done <"$T_DIR/pinned"
t_check "found a waiting block" test -n "$w"
t_check "ssd pin on it (a record update)" setfattr -n user.kvfs.pin -v ssd "$MNT/$NS/$w"
t_check "both pins" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$MNT/$NS/$w")" = dram,ssd
t_errno "dram pin again fails, ENOSPC" "No space" setfattr -n user.kvfs.pin -v dram "$MNT/$NS/$w"
t_check "still pinned after the failed retry" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$MNT/$NS/$w")" = dram,ssd
t_check "reads intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "unmount" kvfs_unmount
sed -i 's/^capacity = 160K$/capacity = 16M/' "$STORE/kvfs.conf"
t_check "remount with room" kvfs_mount
t_check "no pin waits" test "$(kvfs_stat cache.dram_pins_waiting)" = 0
t_check "waiting block resident" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/$w")" = dram,ssd
t_check "its pins" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$MNT/$NS/$w")" = dram,ssd
t_check "unmount" kvfs_unmount
t_done
