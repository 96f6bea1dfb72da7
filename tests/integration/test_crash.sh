#!/usr/bin/env bash
# kill -9 of the daemon during a write storm: a remount serves every block
# that was acknowledged durable (fsync returned), and never a torn one.
# The daemon has a device pool (shm): the killed one's object stays in
# /dev/shm until the next start of the store removes it.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 128M
kvfs_conf 2M
printf '\n[tier.gpu]\nbackend = shm\ncapacity = 1M\n' >>"$STORE/kvfs.conf"
t_check "mount" kvfs_mount
pool_of() { ls /dev/shm | grep -- "-$1-pool-[0-9]*\$"; }
t_check "the daemon's device pool is in /dev/shm" test -n "$(pool_of "$KVFS_PID")"
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
dead_pool=$(pool_of "$victim")
t_check "the killed daemon left its pool ($dead_pool)" test -n "$dead_pool"

t_check "remount after kill -9" kvfs_mount
t_check "the start removed the dead daemon's pool" sh -c "! test -e '/dev/shm/$dead_pool'"
t_check "the start says so in the log" grep -q "removed /$dead_pool" "$STORE/kvfs.log"
t_check "the new daemon has its own pool" test -n "$(pool_of "$KVFS_PID")"
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
