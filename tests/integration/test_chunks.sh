#!/usr/bin/env bash
# ContiguousKV through the mount: FETCH_CHUNKS returns exactly the chunks
# asked for (random sets, partial last chunks, every dtype), adjacent
# chunks are read in one request, the next period reads only what the
# speculative prefetch did not bring, pool delivery, SCORES, bad input.
# The checks run on SSD-only blocks (written, then a remount). Then the
# same for prefixes written as HIDDEN blocks to namespaces with a
# checkpoint, stored as hidden states (hid) or split (hmix): chunks come
# back as a full read of the file has them. The device tier is shm, or
# cuda with KVFS_TEST_GPU=cuda (make test-gpu on a GPU host, make
# test-gpu-emu against the cudart stand-in): chunks are then staged in host
# memory and copied into the client's cudaMalloc'ed memory.
. "$(dirname "$0")/lib.sh"

backend=shm
[ "${KVFS_TEST_GPU:-}" = cuda ] && backend=cuda

CLIENT=$BIN/../itests/chunks_client
CK=$T_DIR/ck
mkdir -p "$CK"
t_check "generate the checkpoint of the hidden-state namespaces" "$CLIENT" hsetup "$CK"

kvfs_mkfs 128M
{
	printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = 16M\n\n'
	printf '[tier.gpu]\nbackend = %s\ncapacity = 32M\n\n' "$backend"
	# One speculative read on the disk at a time, so that a request
	# arriving at once finds most of the load still to issue and calls
	# it off (test_inter_period_superseded).
	printf '[chunks]\ndram_capacity = 4M\ngpu_capacity = 1M\n'
	printf 'spec_depth = 1\n\n'
	for ns in c16:bf16 h16:f16 f32:f32 f8:f8_e4m3; do
		printf '[namespace %s]\nlayers = 4\nkv_heads = 2\nhead_dim = 128\n' "${ns%%:*}"
		printf 'dtype = %s\nblock_tokens = 64\nchunk_tokens = 16\n\n' "${ns#*:}"
	done
	for ns in hid:hidden hmix:auto; do
		printf '[namespace %s]\nlayers = 4\nkv_heads = 4\nhead_dim = 64\n' "${ns%%:*}"
		printf 'hidden_size = 256\ndtype = bf16\nblock_tokens = 64\nchunk_tokens = 16\n'
		printf 'weights = %s/model.safetensors\nfamily = llama\n' "$CK"
		printf 'rms_norm_eps = 1e-5\nrope_theta = 10000\nstore_as = %s\n' "${ns#*:}"
		[ "${ns#*:}" = auto ] && printf 'hcache_kv_layers = 2\n'
		printf '\n'
	done
} >"$STORE/kvfs.conf"
t_check "mount" kvfs_mount
t_check "write the test prefixes (every dtype, a partial last block)" "$CLIENT" write "$MNT"
t_check "write the hidden-state prefixes" "$CLIENT" hwrite "$MNT"
t_check "hid keeps hidden states" test "$(getfattr --absolute-names --only-values -n user.kvfs.stored_as \
	"$MNT/hid/$(ls "$MNT/hid" | head -n1)")" = hidden
t_check "unmount" kvfs_unmount
t_check "remount with the $backend device tier: the blocks are on the SSD only" kvfs_mount
t_check "a block reports ssd only" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier \
	"$MNT/c16/$(ls "$MNT/c16" | head -n1)")" = ssd
t_cmocka chunks "$CLIENT" check "$MNT"
t_check "read amplification in .kvfs/stats is 1000 (none: 4 KiB-aligned chunks)" test "$(kvfs_stat chunk.read_amplification_milli)" -eq 1000
t_check "chunk.spec_cancelled is in .kvfs/stats" test "$(kvfs_stat chunk.spec_cancelled)" -ge 0
t_check "malformed chunk requests were logged" grep -q "ctl: malformed request" "$STORE/kvfs.log"
t_cmocka hidden "$CLIENT" hcheck "$MNT"
t_check "the hidden-state chunks read less than they deliver" test "$(kvfs_stat chunk.read_amplification_milli)" -lt 1000
t_check "no checksum failures" sh -c "! grep -q 'failed its checksum\|fails verification' '$STORE/kvfs.log'"
if [ "$backend" = cuda ]; then
	# Each session's staging buffer for chunks bound for device memory
	# is pinned, so those copies go by DMA (this script FETCHes no whole
	# blocks, so the DRAM arena's direct uploads do not count here).
	t_check "chunks reached device memory by DMA from a pinned stage" \
		test "$(kvfs_stat tier.gpu.direct_bytes)" -gt 0
fi
t_check "clean unmount" kvfs_unmount
t_done
