#!/usr/bin/env bash
# ContiguousKV through the mount: FETCH_CHUNKS returns exactly the chunks
# asked for (random sets, partial last chunks, every dtype), adjacent
# chunks are read in one request, the next period reads only what the
# speculative prefetch did not bring, pool delivery, SCORES, bad input.
# The checks run on SSD-only blocks (written, then a remount).
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 128M
{
	printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = 16M\n\n'
	printf '[tier.gpu]\nbackend = shm\ncapacity = 32M\n\n'
	printf '[chunks]\ndram_capacity = 4M\ngpu_capacity = 1M\n\n'
	for ns in c16:bf16 h16:f16 f32:f32 f8:f8_e4m3; do
		printf '[namespace %s]\nlayers = 4\nkv_heads = 2\nhead_dim = 128\n' "${ns%%:*}"
		printf 'dtype = %s\nblock_tokens = 64\nchunk_tokens = 16\n\n' "${ns#*:}"
	done
} >"$STORE/kvfs.conf"
CLIENT=$BIN/../itests/chunks_client
t_check "mount" kvfs_mount
t_check "write the test prefixes (every dtype, a partial last block)" "$CLIENT" write "$MNT"
t_check "unmount" kvfs_unmount
t_check "remount: the blocks are on the SSD only" kvfs_mount
t_check "a block reports ssd only" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier \
	"$MNT/c16/$(ls "$MNT/c16" | head -n1)")" = ssd
t_cmocka chunks "$CLIENT" check "$MNT"
t_check "read amplification in .kvfs/stats is 1000 (none: 4 KiB-aligned chunks)" test "$(kvfs_stat chunk.read_amplification_milli)" -eq 1000
t_check "malformed chunk requests were logged" grep -q "ctl: malformed request" "$STORE/kvfs.log"
t_check "no checksum failures" sh -c "! grep -q 'failed its checksum\|fails verification' '$STORE/kvfs.log'"
t_check "clean unmount" kvfs_unmount
t_done
