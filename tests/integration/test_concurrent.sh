#!/usr/bin/env bash
# Several writer and reader processes at once, sharing prefixes.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 128M
kvfs_conf 1M
t_check "mount" kvfs_mount
pids=()
for s in 1 2 3 4; do
	# Same seed for the shared part: writers race on the same names.
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 4 --blocks 6 --shared 2 --seed "$s" --quiet \
		>"$T_DIR/w$s.out" 2>&1 &
	pids+=($!)
done
for r in 1 2 3; do
	# Readers verify whatever is committed while the writers run.
	( for i in 1 2 3 4 5; do gen verify "$MNT/$NS" "${GEOM[@]}" --quiet || exit 1; done ) \
		>"$T_DIR/r$r.out" 2>&1 &
	pids+=($!)
done
fails=0
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
t_check "4 writers and 3 readers all succeeded ($fails failed)" test "$fails" -eq 0
[ "$fails" -eq 0 ] || cat "$T_DIR"/*.out
t_check "final verify" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "DRAM pressure happened under concurrency" test "$(kvfs_stat tier.dram.evictions)" -gt 0
t_check "no checksum errors" test "$(kvfs_stat cache.checksum_errors)" -eq 0
t_done
