#!/usr/bin/env bash
# .kvfs/ctl against the device tier: lookup, fetch, leases, per-layer
# FETCH_INTO, SAVE and every bad-input path (tests/integration/ctl_client.c),
# and the start-up checks of [tier.gpu]. The tier is shm, or cuda with
# KVFS_TEST_GPU=cuda (make test-gpu on a GPU host; make test runs it against
# the cudart stand-in, tests/gpu/cudaemu.c).
#
# [tier.dram] pinned is left at auto: with cuda the DRAM tier is one pinned
# arena and uploads from it go direct, so the whole suite runs over that
# path; with shm it is the per-block heap buffers (the arena itself is
# covered by test_tier and test_gpu_tier in both cases).
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
if [ "$backend" = cuda ]; then
	t_check "pinned = auto pins the DRAM tier for cuda" \
		grep -q "cuda: pinned 2.0 MiB of host memory" "$STORE/kvfs.log"
else
	t_check "pinned = auto pins nothing for shm" \
		sh -c "! grep -q 'pinned .* of host memory' '$STORE/kvfs.log'"
fi

KVFS_MNT=$MNT KVFS_NS=$NS t_cmocka ctl "$BIN/../itests/ctl_client"
t_check "the daemon survived every bad request" test "$(kvfs_stat ctl.leases)" -eq 0
t_check "bad requests were logged" grep -q "ctl: malformed request" "$STORE/kvfs.log"
# test_fetch_into_overlap's second case: blocks 0 and 2, given out of order.
t_check "overlapping FETCH_INTO destinations were logged, naming both blocks" \
	grep -q "destinations of blocks 0 \[[0-9]*, +[0-9]*) and 2 \[[0-9]*, +[0-9]*) overlap" "$STORE/kvfs.log"
pid=$KVFS_PID
if [ "$backend" = shm ]; then
	t_check "the pool is a shm object named for this daemon and its owner" sh -c "ls /dev/shm | grep -q '^kvfs-.*-$pid-pool-$(id -u)\$'"
fi
t_check "unmount with the pool" kvfs_unmount
if [ "$backend" = shm ]; then
	t_check "the pool's shm object is gone after unmount" sh -c "! ls /dev/shm | grep -q '^kvfs-.*-$pid-pool'"
else
	# The tier's closing line: FETCH copied blocks straight from the
	# pinned DRAM tier.
	direct=$(sed -n 's/.*host<->device copies: \([0-9]*\) bytes direct.*/\1/p' "$STORE/kvfs.log" | tail -n 1)
	t_check "uploads went direct from pinned DRAM ($direct bytes)" test "${direct:-0}" -gt 0
fi

# pinned = yes asks for a CUDA device to pin for.
sed -i 's/^capacity = 2M$/capacity = 2M\npinned = yes/' "$STORE/kvfs.conf"
if [ "$backend" = shm ]; then
	t_errno "pinned = yes without cuda is a config error at its line" \
		"kvfs.conf:[0-9]*: \[tier.dram\]: pinned = yes needs \[tier.gpu\] backend = cuda" \
		"$BIN/kvfs" -f "$STORE" "$MNT"
elif ! nvidia-smi -L >/dev/null 2>&1; then
	# The stand-in refuses to pin more than KVFS_CUDAEMU_PIN_LIMIT bytes,
	# as a low RLIMIT_MEMLOCK would: asked for, that stops the start...
	KVFS_CUDAEMU_PIN_LIMIT=4096 t_errno "pinned = yes refuses to start when pinning fails" \
		"refusing to start" "$BIN/kvfs" -f "$STORE" "$MNT"
	# ...under auto it is a warning, and copies are staged.
	sed -i 's/^pinned = yes$/pinned = auto/' "$STORE/kvfs.conf"
	: >"$STORE/kvfs.log"
	KVFS_CUDAEMU_PIN_LIMIT=4096 t_check "pinned = auto starts when pinning fails" kvfs_mount
	t_check "with a warning saying uploads are staged" \
		grep -q "cannot be pinned.*staging buffers" "$STORE/kvfs.log"
	t_check "unmount after the unpinned start" kvfs_unmount
fi
sed -i '/^pinned = /d' "$STORE/kvfs.conf"

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
