#!/usr/bin/env bash
# Unmount and remount: every block comes back, bytes and attributes.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount" kvfs_mount
t_check "write" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 5 --blocks 4 --shared 1 --tail 3 --quiet
ls "$MNT/$NS" | sort >"$T_DIR/before"
f="$MNT/$NS/$(head -n1 "$T_DIR/before")"
t_check "pin one in ssd" setfattr -n user.kvfs.pin -v ssd "$f"
g="$MNT/$NS/$(sed -n 2p "$T_DIR/before")"
t_check "pin another in dram" setfattr -n user.kvfs.pin -v dram "$g"
cat "$f" "$f" >/dev/null
hits=$(getfattr --absolute-names --only-values -n user.kvfs.hits "$f")
t_check "unmount" kvfs_unmount
t_check "mount point empty after unmount" test -z "$(ls -A "$MNT")"
t_check "remount" kvfs_mount
ls "$MNT/$NS" | sort >"$T_DIR/after"
t_check "same blocks listed after remount ($(wc -l <"$T_DIR/after"))" cmp "$T_DIR/before" "$T_DIR/after"
t_check "blocks come back on the SSD tier" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$f")" = ssd
t_check "every block reads back intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "a DRAM pin is reloaded into DRAM at mount" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$g")" = dram,ssd
t_check "DRAM pin survives remount" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$g")" = dram
t_check "pin survives remount" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$f")" = ssd
t_check "hit count survives remount (>= $hits)" test "$(getfattr --absolute-names --only-values -n user.kvfs.hits "$f")" -ge "$hits"
t_check "ssd reads counted" test "$(kvfs_stat tier.ssd.hits)" -gt 0
mkdir -p "$T_DIR/mnt2"
t_errno "a second daemon on a store in use is refused" "busy\|Busy" "$BIN/kvfs" "$STORE" "$T_DIR/mnt2"
t_check "the first mount is unharmed" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "unmount again" kvfs_unmount

# A store that mkfs did not make, and a bad config, fail at start.
mkdir -p "$T_DIR/notastore"
t_errno "not a store" "mkfs.kvfs\|not a kvfs store\|No such file" "$BIN/kvfs" "$T_DIR/notastore" "$MNT"
printf '[tier.dram]\ncapacity = lots\n' >"$T_DIR/bad.conf"
t_errno "bad config names the problem" "bad.conf" "$BIN/kvfs" -c "$T_DIR/bad.conf" "$STORE" "$MNT"
t_check "not mounted after failures" sh -c "! mountpoint -q '$MNT'"
# Changing a stored namespace's geometry is refused.
sed -i 's/^layers = 4/layers = 5/' "$STORE/kvfs.conf"
t_errno "changed geometry refused" "layers\|Invalid argument" "$BIN/kvfs" -f "$STORE" "$MNT"
t_done
