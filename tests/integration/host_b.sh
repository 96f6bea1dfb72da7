# shellcheck shell=bash
# A second kvfs host on this machine for the fleet tests (test_remote.sh,
# test_fleet.sh), sourced after lib.sh: host B has its own store and
# mount; host A is lib.sh's STORE and MNT. The caller's EXIT trap calls
# unmount_b before it stops any server B talks to.

STORE_B=$T_DIR/store-b
MNT_B=$T_DIR/mnt-b
B_PID=
mkdir -p "$MNT_B"

# Unmount B if it is mounted, and wait (bounded) for its daemon to end:
# fusermount3 returns before the daemon's last write-back.
unmount_b() {
	if mountpoint -q "$MNT_B" 2>/dev/null; then
		fuse_unmount "$MNT_B" 2>/dev/null || fuse_unmount -z "$MNT_B"
	elif grep -q " $MNT_B fuse" /proc/mounts; then
		fuse_unmount -z "$MNT_B" 2>/dev/null
	fi
	if [ -n "$B_PID" ]; then
		timeout 120 tail --pid="$B_PID" -f /dev/null
		B_PID=
	fi
}

mount_b() {
	"$BIN/kvfs" "$STORE_B" "$MNT_B" || return 1
	B_PID=$(cat "$STORE_B/kvfs.pid")
}

# stat_a KEY, stat_b KEY: the value of KEY in the host's .kvfs/stats.
stat_a() { awk -v k="$1" '$1 == k { print $2 }' "$MNT/.kvfs/stats"; }
stat_b() { awk -v k="$1" '$1 == k { print $2 }' "$MNT_B/.kvfs/stats"; }
