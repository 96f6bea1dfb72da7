#!/usr/bin/env bash
# .kvfs/ctl against the device tier: lookup, fetch, leases, per-layer
# FETCH_INTO, SAVE and every bad-input path (tests/integration/ctl_client.c),
# and the start-up checks of [tier.gpu]. The tier is shm, or cuda with
# KVFS_TEST_GPU=cuda (make test-gpu on a GPU host; make test runs it against
# the cudart stand-in, tests/gpu/cudaemu.c).
. "$(dirname "$0")/lib.sh"

backend=shm
[ "${KVFS_TEST_GPU:-}" = cuda ] && backend=cuda

kvfs_mkfs 64M
kvfs_conf 2M
# The pool holds exactly 6 test blocks (40 KiB each).
cat >>"$STORE/kvfs.conf" <<EOC

[tier.gpu]
backend = $backend
capacity = 240K
EOC
t_check "mount with the $backend device tier" kvfs_mount
t_check ".kvfs/ctl is listed" test -e "$MNT/.kvfs/ctl"
t_check "the pool shows in the stats" test "$(kvfs_stat tier.gpu.capacity_bytes)" -eq $((240 * 1024))

KVFS_MNT=$MNT KVFS_NS=$NS t_cmocka ctl "$BIN/../itests/ctl_client"
t_check "the daemon survived every bad request" test "$(kvfs_stat ctl.leases)" -eq 0
t_check "bad requests were logged" grep -q "ctl: malformed request" "$STORE/kvfs.log"
pid=$KVFS_PID
if [ "$backend" = shm ]; then
	t_check "the pool is a shm object named for this daemon" sh -c "ls /dev/shm | grep -q '^kvfs-.*-$pid-pool\$'"
fi
t_check "unmount with the pool" kvfs_unmount
if [ "$backend" = shm ]; then
	t_check "the pool's shm object is gone after unmount" sh -c "! ls /dev/shm | grep -q '^kvfs-.*-$pid-pool\$'"
fi

# A cuda tier on a machine without a usable GPU refuses to start, saying so
# (KVFS_CUDAEMU_DEVICES=0 makes the cudart stand-in such a machine).
sed -i "s/^backend = $backend/backend = cuda/" "$STORE/kvfs.conf"
if ! nvidia-smi -L >/dev/null 2>&1; then
	KVFS_CUDAEMU_DEVICES=0 t_errno "backend = cuda without a GPU is refused at start" \
		"cuda\|CUDA\|device" "$BIN/kvfs" -f "$STORE" "$MNT"
fi
sed -i 's/^backend = cuda/backend = tape/' "$STORE/kvfs.conf"
t_errno "an unknown backend is a config error" "expected none, shm or cuda" "$BIN/kvfs" -f "$STORE" "$MNT"
t_done
