#!/usr/bin/env bash
# DRAM pressure pushes blocks to the SSD and reads bring them back; SSD
# pressure deletes the least recently used blocks. Pinned and open blocks
# are never evicted, and a write fails with ENOSPC only when nothing can be.
. "$(dirname "$0")/lib.sh"

# One test block is 40 KiB: DRAM holds 12 of them.
kvfs_mkfs 64M
kvfs_conf 480K
t_check "mount" kvfs_mount
t_check "write 60 blocks through a 12-block DRAM tier" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 6 --blocks 10 --shared 0 --quiet
t_check "all 60 listed" test "$(ls "$MNT/$NS" | wc -l)" -eq 60
t_check "DRAM evicted blocks" test "$(kvfs_stat tier.dram.evictions)" -gt 0
used=$(kvfs_stat tier.dram.used_bytes)
t_check "DRAM use within capacity ($used)" test "$used" -le $((480 * 1024))
t_check "every block reads back (from the SSD where evicted)" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "SSD reads happened" test "$(kvfs_stat tier.ssd.hits)" -gt 0
t_check "SSD tier holds all of them" test "$(kvfs_stat tier.ssd.blocks)" -eq 60
t_check "no checksum errors" test "$(kvfs_stat cache.checksum_errors)" -eq 0
kvfs_unmount

# SSD pressure: a 1 MiB data file holds 25 test blocks.
rm -rf "$STORE"
kvfs_mkfs 1M
kvfs_conf 480K
t_check "mount small store" kvfs_mount
first=$(gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 --blocks 2 --shared 0 --seed 7 --quiet >/dev/null; ls "$MNT/$NS" | head -n1)
t_check "pin one block on the SSD" setfattr -n user.kvfs.pin -v ssd "$MNT/$NS/$first"
# --fsync: each block is on the SSD when its write returns, so the set of
# blocks is settled before it is checked.
t_check "write 80 blocks into a 25-block SSD" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 8 --blocks 10 --shared 0 --seed 9 --fsync --quiet
ev=$(kvfs_stat tier.ssd.evictions)
t_check "SSD evictions happened ($ev)" test "$ev" -gt 0
n=$(ls "$MNT/$NS" | wc -l)
t_check "blocks kept fit the SSD ($n <= 25)" test "$n" -le 25
t_check "pinned block survived SSD pressure" test -e "$MNT/$NS/$first"
t_check "every remaining block reads back intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "SSD use within capacity" test "$(kvfs_stat tier.ssd.used_bytes)" -le $((1024 * 1024))
kvfs_unmount

# A full disk: every SSD block pinned, so nothing can be evicted.
rm -rf "$STORE"
kvfs_mkfs 1M
kvfs_conf 480K
t_check "mount a 25-block store" kvfs_mount
t_check "fill it durably" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 --blocks 25 --shared 0 --seed 3 --fsync --quiet
for k in $(ls "$MNT/$NS"); do setfattr -n user.kvfs.pin -v ssd "$MNT/$NS/$k"; done
t_errno "fsync with the SSD full of pinned blocks is ENOSPC" "No space left" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 --blocks 1 --shared 0 --seed 5 --fsync --quiet
t_errno "then DRAM fills with blocks that cannot be persisted: close is ENOSPC" "No space left" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 20 --blocks 1 --shared 0 --seed 6 --quiet
t_check "the failure is logged" grep -q "nothing evictable" "$STORE/kvfs.log"
t_check "every stored block is intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "the daemon is still serving" test "$(kvfs_stat tier.ssd.blocks)" -eq 25
stalled=$(kvfs_stat writeback.stalled)
t_check "blocks waiting for SSD space are counted ($stalled)" test "$stalled" -ge 1
# Free room: the waiting blocks are written back, and fsync (sync FILE)
# on each of them then succeeds.
for k in $(ls "$MNT/$NS" | head -n 14); do
	setfattr -x user.kvfs.pin "$MNT/$NS/$k" 2>/dev/null
	rm -f "$MNT/$NS/$k"
done
t_check "once space frees, every committed block becomes durable" sync "$MNT/$NS"/*.kv
t_check "nothing waits any more" test "$(kvfs_stat writeback.stalled)" -eq 0
t_check "and everything verifies" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_done
