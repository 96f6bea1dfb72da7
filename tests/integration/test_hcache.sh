#!/usr/bin/env bash
# Hidden-state restoration (HCache) through the mount: HIDDEN-kind blocks
# written to namespaces with real safetensors checkpoints (Llama MHA in f32
# and bf16 with llama3 RoPE, Qwen2 GQA with biases) read back as KV-kind
# files whose every element matches a double-precision reference; stat
# size, user.kvfs.stored_as, store_as kv/hidden/auto, one restoration for
# many readers, FETCH and PREFETCH, refusals (no weights, bad checkpoint);
# a per-layer split (store_as = auto, hcache_kv_layers = 1: MIXED blocks)
# served from DRAM, after a remount and after kill -9.
# FETCH restores HIDDEN and MIXED blocks straight into the device pool:
# shm, or cuda with KVFS_TEST_GPU=cuda (make test-gpu on a GPU host; make
# test runs it against the cudart stand-in, tests/gpu/cudaemu.c), where
# [tier.gpu] restore = auto uses the GPU if its restoration starts and
# the CPU otherwise, as the log says.  With a GPU restorer, reads and
# restorations ahead of need run there too, the plans use its projection
# time, and a failing GPU (a cuBLAS whose GEMMs fail) falls back to the
# CPU for reads.
. "$(dirname "$0")/lib.sh"

backend=shm
[ "${KVFS_TEST_GPU:-}" = cuda ] && backend=cuda

CLIENT=$BIN/../itests/hcache_client
CK=$T_DIR/ck
mkdir -p "$CK"

kvfs_mkfs 64M
t_check "generate the checkpoints and the namespace config" "$CLIENT" setup "$CK"
write_conf() { # WEIGHTS_FILE_FOR_llama_f32 [EXTRA_LINE_IN_TIER_GPU]
	{
		printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = 16M\n\n'
		printf '[tier.gpu]\nbackend = %s\ncapacity = 8M\n%s\n' \
			"$backend" "${2:-}"
		sed "s|/llama_f32.safetensors|/$1|" "$CK/ns.conf"
	} >"$STORE/kvfs.conf"
}
write_conf llama_f32.safetensors

t_check "mount" kvfs_mount
t_check "the checkpoints were loaded and profiled" \
	grep -q "hcache plan for blocks read from ssd" "$STORE/kvfs.log"
t_check "token recomputation is reported as left out" \
	grep -q "token recomputation: no model runner, left out" "$STORE/kvfs.log"
t_check "the plans say whose projection time they use" \
	grep -Eq "ns lf32: hcache plans use the (CPU|GPU)'s projection time" "$STORE/kvfs.log"
if [ "$backend" = shm ]; then
	t_check "the plans use the CPU's projection time (no GPU restorer)" \
		grep -q "ns lf32: hcache plans use the CPU's projection time, .* (no GPU restorer)" "$STORE/kvfs.log"
	t_check "restore = auto on shm restores on the CPU into the pool" \
		grep -q "ns lf32: blocks stored as hidden states are restored on the CPU straight into the device pool when it loads them (\[tier.gpu\] restore = auto)" "$STORE/kvfs.log"
else
	t_check "restore = auto on cuda says where it restores" \
		grep -Eq "ns lf32: (blocks stored as hidden states are restored on CUDA device 0 straight into the device pool|\[tier.gpu\] restore = auto: GPU restoration cannot start on CUDA device 0)" "$STORE/kvfs.log"
fi
t_cmocka write "$CLIENT" write "$MNT"
t_check "the refusal without weights is logged" \
	grep -q "HIDDEN-kind block needs a namespace with weights" "$STORE/kvfs.log"
# Blocks still in DRAM as hidden states (maybe not yet durable).
t_cmocka check-dram "$CLIENT" check "$MNT"
t_check "unmount" kvfs_unmount

# A checkpoint that does not match refuses the start and names the tensor.
write_conf bad_missing.safetensors
t_check "a checkpoint missing a tensor refuses the mount" sh -c "! '$BIN/kvfs' '$STORE' '$MNT' 2>/dev/null"
t_check "the log names the missing tensor" \
	grep -q 'model.layers.1.self_attn.v_proj.weight' "$STORE/kvfs.log"
write_conf bad_shape.safetensors
t_check "a checkpoint with a wrong shape refuses the mount" sh -c "! '$BIN/kvfs' '$STORE' '$MNT' 2>/dev/null"
t_check "the log names the misshapen tensor" \
	grep -q 'tensor "model.layers.2.self_attn.k_proj.weight": shape \[32, 64\]' "$STORE/kvfs.log"

# restore = gpu needs the cuda backend (a config error at its line), and
# on cuda the GPU restoration.
if [ "$backend" = shm ]; then
	write_conf llama_f32.safetensors "restore = gpu"
	t_errno "restore = gpu on shm is a config error naming its line" \
		"kvfs.conf:10: \[tier.gpu\]: restore = gpu needs backend = cuda" \
		"$BIN/kvfs" -f "$STORE" "$MNT"
else
	# restore = gpu refuses the start when the GPU restoration cannot
	# start: a "cuBLAS" without cuBLAS's symbols makes that so anywhere.
	write_conf llama_f32.safetensors "restore = gpu"
	KVFS_CUBLAS_LIB=libm.so.6 t_errno \
		"restore = gpu refuses the start when GPU restoration cannot start" \
		"restore = gpu, but GPU restoration cannot start on CUDA device 0" \
		timeout 120 "$BIN/kvfs" -f "$STORE" "$MNT"
fi

write_conf llama_f32.safetensors
# The log so far holds the refusals above; what follows must add no
# error from the GPU restorer.
log_from=$(($(wc -l <"$STORE/kvfs.log") + 1))
t_check "remount: every block on the SSD only" kvfs_mount
blk=$(ls "$MNT/lf32" | head -n1)
t_check "a hidden block reports ssd only" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/lf32/$blk")" = ssd
t_cmocka concurrent "$CLIENT" concurrent "$MNT"
t_cmocka check-ssd "$CLIENT" check "$MNT"
t_cmocka stats "$CLIENT" stats "$MNT"
t_check "no checksum failures" sh -c "! grep -q 'fails verification' '$STORE/kvfs.log'"
t_check "the GPU restorer logged no error" \
	sh -c "! tail -n +$log_from '$STORE/kvfs.log' | grep 'kvfs err: restore cuda'"
t_check "the split of lmix is logged" \
	grep -q "ns lmix: store_as = auto keeps layers 0..1 as hidden states, 2..2 as KV (hcache_kv_layers)" "$STORE/kvfs.log"
t_check "clean unmount" kvfs_unmount

# MIXED blocks written just before a kill -9 are recovered and served.
t_check "remount for the kill -9 case" kvfs_mount
t_cmocka crash-write "$CLIENT" crash-write "$MNT"
victim=$KVFS_PID
t_check "kill -9 the daemon" kill -9 "$victim"
kvfs_unmount
t_check "the daemon is gone" sh -c "! kill -0 $victim 2>/dev/null"
t_check "remount after kill -9" kvfs_mount
t_cmocka crash-check "$CLIENT" crash-check "$MNT"
t_cmocka check-after-kill "$CLIENT" check "$MNT"
t_check "no checksum failures after kill -9" sh -c "! grep -q 'fails verification' '$STORE/kvfs.log'"
t_check "clean unmount after kill -9" kvfs_unmount

# A GPU restoration that fails for reads: a "cuBLAS" whose GEMMs all fail
# (built here, loaded through KVFS_CUBLAS_LIB) lets the GPU restorer
# start; its profile fails, so the plans use the CPU's projection time,
# and each read is restored on the CPU instead, counted as a fallback.
# A device host may have no C compiler: then the case is skipped.
if [ "$backend" = cuda ] && ! command -v "${CC:-cc}" >/dev/null; then
	t_log "no C compiler (${CC:-cc}): the failing-cuBLAS case is skipped"
elif [ "$backend" = cuda ]; then
	cat >"$T_DIR/failblas.c" <<'EOC'
/* cuBLAS's seven entry points as restore_cuda.c calls them; every GEMM
 * fails with CUBLAS_STATUS_EXECUTION_FAILED (13).
 */
static int handle;
int cublasCreate_v2(void **h) { *h = &handle; return 0; }
int cublasDestroy_v2(void *h) { (void)h; return 0; }
int cublasSetStream_v2(void *h, void *s) { (void)h; (void)s; return 0; }
int cublasSetMathMode(void *h, int m) { (void)h; (void)m; return 0; }
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k,
		   const float *al, const float *a, int lda, const float *b,
		   int ldb, const float *be, float *c, int ldc)
{ return 13; }
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k,
		 const void *al, const void *a, int at, int lda, const void *b,
		 int bt, int ldb, const void *be, void *c, int ct, int ldc,
		 int comp, int algo)
{ return 13; }
const char *cublasGetStatusString(int s) { return "failing on purpose"; }
EOC
	t_check "build a cuBLAS whose GEMMs fail" \
		"${CC:-cc}" -shared -fPIC -o "$T_DIR/libcublas-fail.so" "$T_DIR/failblas.c"
	KVFS_CUBLAS_LIB=$T_DIR/libcublas-fail.so t_check \
		"mount with the failing cuBLAS" kvfs_mount
	if [ "$(kvfs_stat ns.lf32.hcache.device_restore)" = gpu ]; then
		t_check "the plans say they use the CPU's projection time" \
			grep -q "ns lf32: hcache plans use the CPU's projection time, .* (the GPU restorer could not be profiled)" "$STORE/kvfs.log"
		t_cmocka fallback "$CLIENT" fallback "$MNT"
		t_check "the fallbacks are logged" \
			grep -q "restoration on the GPU failed .*: restoring it on the CPU" "$STORE/kvfs.log"
		t_check "the streamed fallbacks are logged" \
			grep -q "restoration on the GPU failed after 0 layers: the CPU restored the others" "$STORE/kvfs.log"
	else
		t_log "no GPU restorer here (restore = auto fell back to the CPU): fallback reads not tested"
	fi
	t_check "unmount after the fallback reads" kvfs_unmount
fi
# restore_weights = bf16: the GPU restorer keeps bf16 weights and runs
# bf16 GEMMs (its numerics are test_restore_cuda's); blocks stored as
# hidden states still read whole through it.
if [ "$backend" = cuda ]; then
	write_conf llama_f32.safetensors "restore = gpu
restore_weights = bf16"
	from=$(($(wc -l <"$STORE/kvfs.log") + 1))
	t_check "mount with restore_weights = bf16" kvfs_mount
	t_check "the GPU restorer keeps bf16 weights" \
		sh -c "tail -n +$from '$STORE/kvfs.log' | grep -q 'restore cuda: device 0, .* bytes of bf16 weights'"
	t_check "restoration runs on the GPU" \
		test "$(kvfs_stat ns.lf32.hcache.device_restore)" = gpu
	ok=1
	for n in $(ls "$MNT/lf32"); do
		want=$(stat -c %s "$MNT/lf32/$n")
		got=$(cat "$MNT/lf32/$n" | wc -c)
		[ "$got" = "$want" ] || ok=0
	done
	t_check "every hidden block of lf32 reads whole, restored with bf16 weights" \
		test "$ok" = 1
	t_check "no restoration failed" \
		sh -c "! tail -n +$from '$STORE/kvfs.log' | grep -q 'restoration on the GPU failed\\|fails verification'"
	t_check "unmount after the bf16 reads" kvfs_unmount
fi
t_check "no sanitizer report in the daemon log" \
	sh -c "! grep -q 'AddressSanitizer\\|runtime error\\|LeakSanitizer' '$STORE/kvfs.log'"
t_done
