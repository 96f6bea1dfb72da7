#!/usr/bin/env bash
# kill -9 of the daemon during a write storm: a remount serves every block
# that was acknowledged durable (fsync returned), and never a torn one.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 128M
kvfs_conf 2M
t_check "mount" kvfs_mount
t_check "durable blocks before the storm" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 4 --seed 1 --fsync --log "$T_DIR/pre.log" --quiet

# Three writers fsync every block and print its key once fsync returned.
# The daemon is killed when the 40th acknowledgement arrives: the kill
# follows an event, not a timer.
victim=$KVFS_PID
{
	for s in 2 3 4; do
		gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 20 --blocks 8 --seed "$s" \
			--fsync --log - --quiet 2>/dev/null &
	done
	wait
} | tee "$T_DIR/storm.raw" | { head -n 40 >/dev/null; kill -9 "$victim"; cat >/dev/null; }
timeout 60 tail --pid="$victim" -f /dev/null
t_check "the daemon is gone" sh -c "! kill -0 $victim 2>/dev/null"
grep -E '^[0-9a-f]{32}$' "$T_DIR/storm.raw" >"$T_DIR/storm.log"
acked=$(wc -l <"$T_DIR/storm.log")
t_check "at least 40 blocks were acknowledged durable ($acked)" test "$acked" -ge 40
KVFS_PID=
kvfs_unmount
t_check "the dead mount is gone" sh -c "! grep -q ' $MNT ' /proc/mounts"

t_check "remount after kill -9" kvfs_mount
t_check "every block durable before the storm is served intact" \
	gen verify "$MNT/$NS" "${GEOM[@]}" --log "$T_DIR/pre.log" --quiet
t_check "every block acknowledged during the storm is served intact" \
	gen verify "$MNT/$NS" "${GEOM[@]}" --log "$T_DIR/storm.log" --quiet
n=$(ls "$MNT/$NS" | wc -l)
t_check "whatever else survived is whole, never torn ($n blocks)" \
	gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "no checksum errors after the crash" test "$(kvfs_stat cache.checksum_errors)" -eq 0
t_check "new writes work after recovery" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 3 --seed 99 --quiet
t_check "clean unmount" kvfs_unmount
t_check "and a second remount still serves them all" kvfs_mount
t_check "all blocks verify after the second remount" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_done
