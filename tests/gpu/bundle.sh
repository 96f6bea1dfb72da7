#!/usr/bin/env bash
# Pack the GPU tests for a device host that has the NVIDIA driver (and a
# CUDA runtime) but none of the Debian development packages kvfs builds
# against.
#
#   make WERROR=1 all && tests/gpu/bundle.sh [DIR]    (default .gpubundle)
#   DIR/run.sh                                         (on the device host)
#
# Copies the unit tests that `make test-gpu` runs (every tests/unit/test_*.c
# that mentions KVFS_TEST_GPU), bench/bench_restore_cuda and
# bench/bench_gpu_fetch (FETCH of a 2 GiB prefix against the raw H2D copy,
# docs/benchmarks.md figure [11]) from $BUILD
# (default build), every shared library ldd says they load except the C
# library's own (libc, libm, libpthread, libdl, librt, ld-linux, and
# libgcc_s, which every system has in a version at least as new) and the
# driver's (libcuda, libnvidia-*).  cuBLAS is dlopen'ed, so ldd cannot
# name it; it is about 600 MiB, so it is left out unless BUNDLE_CUBLAS=1
# (run.sh finds the device host's own: see there).  Everything goes flat
# into DIR, with DIR/run.sh.  Keep DIR out of git (.git/info/exclude) and
# carry it to a device session as an ignored path.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=${1:-.gpubundle}

progs=()
while read -r src; do
	progs+=("$BUILD/tests/$(basename "$src" .c)")
done < <(grep -l KVFS_TEST_GPU tests/unit/test_*.c)
progs+=("$BUILD/bench/bench_restore_cuda" "$BUILD/bench/bench_gpu_fetch")
for p in "${progs[@]}"; do
	if [ ! -x "$p" ]; then
		echo "bundle: $p missing: run 'make WERROR=1 all' first" >&2
		exit 1
	fi
done

mkdir -p "$OUT"
abs=$(cd "$OUT" && pwd)
libs=()
for p in "${progs[@]}"; do
	cp -f "$p" "$OUT/"
	# "name => path (addr)"; a library ldd cannot find stops the bundle.
	if ldd "$p" | grep -q 'not found'; then
		echo "bundle: $p: $(ldd "$p" | grep 'not found')" >&2
		exit 1
	fi
	while read -r name path; do
		case "$name" in
		linux-vdso* | libc.so* | libm.so* | libpthread.so* | \
			libdl.so* | librt.so* | ld-linux* | libgcc_s.so* | \
			libcuda.so* | libnvidia-*) continue ;;
		esac
		libs+=("$name=$path")
	done < <(ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
done
if [ "${BUNDLE_CUBLAS:-0}" = 1 ]; then
	for name in libcublas.so.13 libcublasLt.so.13; do
		if [ -e "$CUDA_HOME/lib64/$name" ]; then
			libs+=("$name=$CUDA_HOME/lib64/$name")
		else
			echo "bundle: warning: $CUDA_HOME/lib64/$name missing; the GPU restore tests need cuBLAS on the device host" >&2
		fi
	done
fi
# Under the soname the programs ask for; -L follows the alternatives
# symlinks (libopenblas.so.0 and the like) to the real file.
for entry in $(printf '%s\n' "${libs[@]}" | sort -u); do
	cp -fL "${entry#*=}" "$OUT/${entry%%=*}"
done

# Every library but the system's must now come from the bundle.
for p in "${progs[@]}"; do
	stray=$(LD_LIBRARY_PATH="$abs" ldd "$OUT/$(basename "$p")" |
		awk '$2 == "=>" { print $1, $3 }' |
		grep -Ev '^(linux-vdso|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|ld-linux|libgcc_s\.so|libcuda\.so|libnvidia-)' |
		grep -v " $abs/" || true)
	if [ -n "$stray" ]; then
		echo "bundle: $(basename "$p") loads from outside the bundle: $stray" >&2
		exit 1
	fi
done

cat > "$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Run the bundled GPU tests, then the GPU restore benchmark, then FETCH of
# a long prefix into the cuda pool against the raw H2D copy
# (bench_gpu_fetch).  With an NVIDIA GPU visible (nvidia-smi -L, or
# /dev/nvidia0) they run with KVFS_TEST_GPU=cuda; without one the GPU
# tests skip, the shm variants run and the benchmarks say there is no
# device.  Set KVFS_TEST_GPU yourself to force either.  BENCH_TOKENS: token
# counts for the restore benchmark (default 256 1024 4096 16384);
# BENCH_FETCH_BYTES: the prefix of bench_gpu_fetch (default 2G; its store
# goes to $TMPDIR or /tmp); BENCH_DEVICE: the CUDA device (default 0).
# One summary line per program; exits non-zero if any failed.
set -u
cd "$(dirname "$0")" || exit 1
export LD_LIBRARY_PATH="$PWD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuBLAS is dlopen'ed (libcublas.so.13): from this folder if bundled, else
# the system's, $CUDA_HOME/lib64, /usr/local/cuda/lib64, or the pip wheel
# nvidia-cublas that PyTorch images carry.
if [ ! -e libcublas.so.13 ]; then
	whl=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
	[ -n "$whl" ] && [ -e "$whl/libcublas.so.13" ] &&
		LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$whl"
fi
if [ -z "${KVFS_TEST_GPU+x}" ]; then
	if { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; } ||
		[ -e /dev/nvidia0 ]; then
		export KVFS_TEST_GPU=cuda
	else
		echo "run.sh: no NVIDIA GPU: KVFS_TEST_GPU unset, GPU tests skip"
	fi
fi
fail=0
summary=()
for t in ./test_*; do
	[ -x "$t" ] || continue
	name=$(basename "$t")
	echo "=== $name (KVFS_TEST_GPU=${KVFS_TEST_GPU:-})"
	out=$("$t" 2>&1)
	rc=$?
	printf '%s\n' "$out"
	p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
	f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
	s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -n1)
	p=${p:-0} f=${f:-0} s=${s:-0}
	if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then
		# a crash counts as one failure
		fail=1
		[ "$f" -ne 0 ] || f=1
	fi
	summary+=("$(printf '%-24s %3d passed, %d failed, %d skipped' "$name" "$p" "$f" "$s")")
done
echo "=== bench_restore_cuda ${BENCH_TOKENS:-}"
# shellcheck disable=SC2086
if ./bench_restore_cuda ${BENCH_TOKENS:-}; then
	summary+=("$(printf '%-24s ok' bench_restore_cuda)")
else
	fail=1
	summary+=("$(printf '%-24s FAILED' bench_restore_cuda)")
fi
fetch=${BENCH_FETCH_BYTES:-2G}
echo "=== bench_gpu_fetch --backend cuda --bytes $fetch"
fsum=$(mktemp "${TMPDIR:-/tmp}/gpu-fetch.XXXXXX") || fsum=
./bench_gpu_fetch --backend cuda --device "${BENCH_DEVICE:-0}" \
	--bytes "$fetch" ${fsum:+--summary "$fsum"}
rc=$?
# The first summary line is the whole prefix: label|kvfs|raw|unit|ratio|goal
ratio=
if [ -n "$fsum" ]; then
	IFS='|' read -r label k b unit ratio goal <"$fsum"
	rm -f "$fsum"
fi
if [ "$rc" -eq 0 ] && [ -n "${ratio:-}" ]; then
	summary+=("$(printf '%-24s %s: %s of %s %s = %s (goal %s)' \
		bench_gpu_fetch "$label" "$k" "$b" "$unit" "$ratio" "$goal")")
elif [ "$rc" -eq 2 ] && [ "${KVFS_TEST_GPU:-}" != cuda ]; then
	summary+=("$(printf '%-24s skipped: no device' bench_gpu_fetch)")
else
	fail=1
	summary+=("$(printf '%-24s FAILED' bench_gpu_fetch)")
fi
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $fail
RUN
chmod +x "$OUT/run.sh"
nlibs=$(printf '%s\n' "${libs[@]}" | sort -u | wc -l)
echo "bundle: $OUT: ${#progs[@]} programs, $nlibs libraries, $(du -sh "$OUT" | cut -f1)"
