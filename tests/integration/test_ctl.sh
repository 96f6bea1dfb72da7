#!/usr/bin/env bash
# .kvfs/ctl against the shm device tier: lookup, fetch, leases, per-layer
# FETCH_INTO, SAVE and every bad-input path (tests/integration/ctl_client.c),
# and the start-up checks of [tier.gpu].
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 2M
# The pool holds exactly 6 test blocks (40 KiB each).
cat >>"$STORE/kvfs.conf" <<EOC

[tier.gpu]
backend = shm
capacity = 240K
EOC
t_check "mount with the shm device tier" kvfs_mount
t_check ".kvfs/ctl is listed" test -e "$MNT/.kvfs/ctl"
t_check "the pool shows in the stats" test "$(kvfs_stat tier.gpu.capacity_bytes)" -eq $((240 * 1024))

KVFS_MNT=$MNT KVFS_NS=$NS t_cmocka ctl "$BIN/../itests/ctl_client"
t_check "the daemon survived every bad request" test "$(kvfs_stat ctl.leases)" -eq 0
t_check "bad requests were logged" grep -q "ctl: malformed request" "$STORE/kvfs.log"
pid=$KVFS_PID
t_check "the pool is a shm object named for this daemon" sh -c "ls /dev/shm | grep -q '^kvfs-.*-$pid-pool\$'"
t_check "unmount with the pool" kvfs_unmount
t_check "the pool's shm object is gone after unmount" sh -c "! ls /dev/shm | grep -q '^kvfs-.*-$pid-pool\$'"

# A cuda tier on a machine without a usable GPU refuses to start, saying so.
sed -i 's/^backend = shm/backend = cuda/' "$STORE/kvfs.conf"
if ! nvidia-smi -L >/dev/null 2>&1; then
	t_errno "backend = cuda without a GPU is refused at start" "cuda\|CUDA\|device" \
		"$BIN/kvfs" -f "$STORE" "$MNT"
fi
sed -i 's/^backend = cuda/backend = tape/' "$STORE/kvfs.conf"
t_errno "an unknown backend is a config error" "expected none, shm or cuda" "$BIN/kvfs" -f "$STORE" "$MNT"
t_done
