# shellcheck shell=bash
# A second kvfs host on this machine for the fleet tests (test_remote.sh,
# test_fleet.sh), sourced after lib.sh: host B has its own store and
# mount; host A is lib.sh's STORE and MNT. The caller's EXIT trap calls
# unmount_b before it stops any server B talks to.

STORE_B=$T_DIR/store-b
MNT_B=$T_DIR/mnt-b
B_PID=
mkdir -p "$MNT_B"

# Unmount B as lib.sh's kvfs_unmount does A (bash's dynamic scope hands
# it B's mount and pid), and wait, bounded, for B's daemon to end.
unmount_b() {
	local MNT=$MNT_B KVFS_PID=$B_PID

	kvfs_unmount
	B_PID=$KVFS_PID
}

mount_b() {
	"$BIN/kvfs" "$STORE_B" "$MNT_B" || return 1
	B_PID=$(cat "$STORE_B/kvfs.pid")
}

# stat_a KEY, stat_b KEY: the value of KEY in the host's .kvfs/stats.
stat_a() { awk -v k="$1" '$1 == k { print $2 }' "$MNT/.kvfs/stats"; }
stat_b() { awk -v k="$1" '$1 == k { print $2 }' "$MNT_B/.kvfs/stats"; }
