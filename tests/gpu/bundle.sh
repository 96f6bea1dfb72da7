#!/usr/bin/env bash
# Pack the GPU tests for a device host that has the NVIDIA driver (and a
# CUDA runtime) but none of the Debian development packages kvfs builds
# against.
#
#   make WERROR=1 all && tests/gpu/bundle.sh [DIR]    (default .gpubundle)
#   DIR/run.sh                                         (on the device host)
#
# Copies the unit tests that `make test-gpu` runs (every tests/unit/test_*.c
# that mentions KVFS_TEST_GPU), bench/bench_restore_cuda,
# bench/bench_gpu_fetch (FETCH of a 2 GiB prefix against the raw H2D copy,
# docs/benchmarks.md figure [11]) and bench/bench_hcache (for [9g], the
# daemon's restore from the SSD on the GPU) from $BUILD (default build), flat into
# DIR.  For the mount-level suites (GPU_ITEST of the Makefile: every
# tests/integration/test_*.sh that mentions KVFS_TEST_GPU) it lays out what
# lib.sh expects of a $BUILD: DIR/bin (kvfs, mkfs.kvfs, kvfsctl),
# DIR/itests (the clients those scripts name), and the scripts with lib.sh
# in DIR/integration; getfattr, which they call and a bare host may lack,
# goes to DIR/tools (it needs only libc).
#
# Every shared library ldd says these load goes flat into DIR, except the C
# library's own (libc, libm, libpthread, libdl, librt, ld-linux, and
# libgcc_s, which every system has in a version at least as new) and the
# driver's (libcuda, libnvidia-*).  cuBLAS is dlopen'ed, so ldd cannot
# name it; it is about 600 MiB, so it is left out unless BUNDLE_CUBLAS=1
# (run.sh finds the device host's own: see there).  Programs are copied
# without their debug sections (BUNDLE_STRIP=0 keeps them): a device
# session carries at most 64 MiB, working tree included, and OpenBLAS
# alone is 35 MiB.  Keep DIR out of git (.git/info/exclude) and carry it
# to a device session as an ignored path.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=${1:-.gpubundle}

# Each program as "path=subdir of DIR" (. for the flat part).
progs=()
while read -r src; do
	progs+=("$BUILD/tests/$(basename "$src" .c)=.")
done < <(grep -l KVFS_TEST_GPU tests/unit/test_*.c)
progs+=("$BUILD/bench/bench_restore_cuda=." "$BUILD/bench/bench_gpu_fetch=."
	"$BUILD/bench/bench_hcache=.")
# The mount-level suites, and the clients they run (named $BIN/../itests/X).
mapfile -t itests < <(grep -l KVFS_TEST_GPU tests/integration/test_*.sh)
for p in kvfs mkfs.kvfs kvfsctl; do
	progs+=("$BUILD/bin/$p=bin")
done
while read -r c; do
	progs+=("$BUILD/$c=itests")
done < <(grep -ho 'itests/[A-Za-z0-9_]*' "${itests[@]}" | sort -u)
for entry in "${progs[@]}"; do
	p=${entry%=*}
	if [ ! -x "$p" ]; then
		echo "bundle: $p missing: run 'make WERROR=1 all' first" >&2
		exit 1
	fi
done
# Tools the scripts call that are not in every base image.  fusermount3
# is not among them: run.sh runs as root on a device host, where libfuse
# mounts and unmounts with mount(2)/umount2(2) itself, and lib.sh falls
# back to umount(8) without it (a copied fusermount3 would lack its
# setuid bit anyway).
tools=()
for t in getfattr setfattr; do
	grep -qw "$t" "${itests[@]}" || continue
	if ! path=$(command -v "$t"); then
		echo "bundle: $t missing here (Debian package attr): the mount-level suites call it" >&2
		exit 1
	fi
	tools+=("$path")
done

rm -rf "${OUT:?}/bin" "$OUT/itests" "$OUT/integration" "$OUT/tools"
mkdir -p "$OUT/bin" "$OUT/itests" "$OUT/integration" "$OUT/tools"
abs=$(cd "$OUT" && pwd)
libs=()
for entry in "${progs[@]}" "${tools[@]/%/=tools}"; do
	p=${entry%=*}
	dst=$OUT/${entry##*=}/$(basename "$p")
	if [ "${BUNDLE_STRIP:-1}" = 1 ] && [ "${entry##*=}" != tools ]; then
		strip --strip-debug -o "$dst" "$p"
	else
		cp -f "$p" "$dst"
	fi
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
cp -f tests/integration/lib.sh "${itests[@]}" "$OUT/integration/"
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
for entry in "${progs[@]}" "${tools[@]/%/=tools}"; do
	p=${entry%=*}
	bp=$OUT/${entry##*=}/$(basename "$p")
	stray=$(LD_LIBRARY_PATH="$abs" ldd "$bp" |
		awk '$2 == "=>" { print $1, $3 }' |
		grep -Ev '^(linux-vdso|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|ld-linux|libgcc_s\.so|libcuda\.so|libnvidia-)' |
		grep -v " $abs/" || true)
	if [ -n "$stray" ]; then
		echo "bundle: $bp loads from outside the bundle: $stray" >&2
		exit 1
	fi
done

cat > "$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Run the bundled GPU tests, then the GPU restore benchmark, then FETCH of
# a long prefix into the cuda pool against the raw H2D copy
# (bench_gpu_fetch), the daemon's restore from the SSD on the GPU
# (bench_hcache [9g]), FETCH of a prefix stored as hidden states restored
# into the pool with f32 and with bf16 weights, batched and one block a
# GEMM (bench_gpu_fetch --hidden, [11h]), then the mount-level
# suites (integration/test_*.sh)
# against the cuda backend.  With an NVIDIA GPU visible (nvidia-smi -L, or
# /dev/nvidia0) they run with KVFS_TEST_GPU=cuda; without one the GPU
# tests skip, the shm variants run, the benchmarks say there is no device
# and the mount-level suites are skipped.  Set KVFS_TEST_GPU yourself to
# force either.  The mount-level suites also need FUSE: they run only if a
# trivial kvfs mount works here, else one line says why not.
#
# RUN_STAGES: which of "unit bench itest" to run (default all three);
# BENCH_TOKENS: token counts for the restore benchmark (default 256 1024
# 4096 16384); BENCH_FETCH_BYTES: the prefix of bench_gpu_fetch (default
# 2G; its store goes to $TMPDIR or /tmp); BENCH_DEVICE: the CUDA device
# (default 0); BENCH_HCACHE_LAYERS: the layers of bench_hcache's model
# (default 32); BENCH_FETCH_HIDDEN_BYTES: the K/V bytes of [11h]'s prefix
# (default 1G); ITEST_TIMEOUT: seconds each mount-level script may take
# (default 120; then it is killed, its mount removed, and it fails).
# One summary line per program; exits non-zero if any failed.
set -u
cd "$(dirname "$0")" || exit 1
export LD_LIBRARY_PATH="$PWD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
stages=" ${RUN_STAGES:-unit bench itest} "
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
	[[ $stages == *" unit "* ]] || break
	[ -x "$t" ] || continue
	name=$(basename "$t")
	echo "=== $name (KVFS_TEST_GPU=${KVFS_TEST_GPU:-})"
	out=$(KVFS_TEST_SHOW_LOG=1 "$t" 2>&1)
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
if [[ $stages == *" bench "* ]]; then
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
	# [9g]: the daemon's restore from the SSD on the GPU, a whole
	# model's worth of layers (BENCH_HCACHE_LAYERS, default 32).
	if [ "${KVFS_TEST_GPU:-}" != cuda ]; then
		summary+=("$(printf '%-24s skipped: no device' bench_hcache)")
	else
		layers=${BENCH_HCACHE_LAYERS:-32}
		echo "=== bench_hcache --gpu ${BENCH_DEVICE:-0} --gpu-only --layers $layers"
		hsum=$(mktemp "${TMPDIR:-/tmp}/gpu-hcache.XXXXXX") || hsum=
		if ./bench_hcache --gpu "${BENCH_DEVICE:-0}" --gpu-only --layers "$layers" \
			--iters 11 --dir "${TMPDIR:-/tmp}" ${hsum:+--summary "$hsum"}; then
			while IFS='|' read -r label k b unit ratio goal; do
				# the daemon's way: page-locked buffers
				[[ $label == "[9g]"* && $label != *pageable* ]] || continue
				summary+=("$(printf '%-24s %s: %s of %s %s = %s' \
					bench_hcache "$label" "$k" "$b" "$unit" "$ratio")")
			done <"${hsum:-/dev/null}"
		else
			fail=1
			summary+=("$(printf '%-24s FAILED' bench_hcache)")
		fi
		[ -n "$hsum" ] && rm -f "$hsum"
		# [11h]: FETCH of a prefix stored as hidden states, each
		# block restored on the GPU into the pool, against the raw
		# copy of its K/V bytes (BENCH_FETCH_HIDDEN_BYTES, 1G).
		hbytes=${BENCH_FETCH_HIDDEN_BYTES:-1G}
		# Each weight precision twice: batched (the default), and
		# with KVFS_RESTORE_BATCH_ROWS=1, one block per GEMM as
		# before batching, the figure's same-run reference.
		for run in f32: f32:1 bf16: bf16:1; do
			w=${run%%:*} rows=${run#*:}
			echo "=== bench_gpu_fetch --backend cuda --hidden --weights $w --bytes $hbytes${rows:+ (KVFS_RESTORE_BATCH_ROWS=$rows)}"
			xsum=$(mktemp "${TMPDIR:-/tmp}/gpu-fetch-h.XXXXXX") || xsum=
			if env ${rows:+KVFS_RESTORE_BATCH_ROWS=$rows} \
				./bench_gpu_fetch --backend cuda --device "${BENCH_DEVICE:-0}" \
				--hidden --weights "$w" --bytes "$hbytes" --iters 5 \
				${xsum:+--summary "$xsum"}; then
				if [ -n "$xsum" ] &&
					IFS='|' read -r label k b unit ratio goal <"$xsum"; then
					summary+=("$(printf '%-24s %s%s: %s of %s %s = %s' \
						bench_gpu_fetch "$label" "${rows:+ one block a GEMM}" "$k" "$b" "$unit" "$ratio")")
				fi
			else
				fail=1
				summary+=("$(printf '%-24s FAILED (--hidden --weights %s%s)' bench_gpu_fetch "$w" "${rows:+, one block a GEMM}")")
			fi
			[ -n "$xsum" ] && rm -f "$xsum"
		done
	fi
fi

# Take down whatever a killed script or probe left in DIR: its daemons
# (any process with DIR/store in its arguments: one that hangs before its
# mount is ready has written no pid file) and its mount, then the folder.
itest_reap() { # DIR...
	local d p
	for d in "$@"; do
		[ -d "$d" ] || continue
		for p in /proc/[0-9]*; do
			tr '\0' ' ' <"$p/cmdline" 2>/dev/null |
				grep -qF " $d/store " && kill -9 "${p#/proc/}" 2>/dev/null
		done
		if grep -q " $d/mnt " /proc/mounts; then
			fusermount3 -u -z "$d/mnt" 2>/dev/null ||
				umount -l "$d/mnt" 2>/dev/null
		fi
		rm -rf "$d"
	done
}
# Why a kvfs mount cannot be made here (printed), or nothing: mkfs, mount
# with the default config (no device tier), list the mount, unmount, all
# time-boxed.
fuse_probe() {
	local d pid why=
	[ -e /dev/fuse ] || { echo "no /dev/fuse"; return; }
	d=$(mktemp -d /tmp/kvfs-probe.XXXXXX) || { echo "mktemp failed"; return; }
	mkdir "$d/mnt"
	if ! timeout 30 bin/mkfs.kvfs --ssd-size 16M "$d/store" >"$d/err" 2>&1; then
		why="mkfs.kvfs failed: $(head -n 1 "$d/err")"
	elif ! timeout 30 bin/kvfs "$d/store" "$d/mnt" >"$d/err" 2>&1; then
		why="kvfs did not mount: $(head -n 1 "$d/err")"
	elif ! pid=$(cat "$d/store/kvfs.pid") ||
		! timeout 10 ls "$d/mnt/.kvfs/stats" >/dev/null 2>&1; then
		why="the mount does not answer"
	elif ! { fusermount3 -u "$d/mnt" 2>/dev/null || umount "$d/mnt" 2>/dev/null; }; then
		why="cannot unmount"
	elif ! timeout 30 tail --pid="$pid" -f /dev/null; then
		# (the daemon removes its pid file as it exits)
		why="the daemon did not exit after unmount"
	fi
	itest_reap "$d"
	printf '%s' "$why"
}
if [[ $stages == *" itest "* ]]; then
	why=
	if [ "${KVFS_TEST_GPU:-}" != cuda ]; then
		why="no GPU (KVFS_TEST_GPU=cuda forces them)"
	elif ! ls integration/test_*.sh >/dev/null 2>&1; then
		why="none bundled"
	else
		why=$(fuse_probe)
		[ -z "$why" ] || why="FUSE unavailable ($why)"
	fi
	if [ -n "$why" ]; then
		echo "mount-level GPU tests skipped: $why"
		summary+=("mount-level GPU tests skipped: $why")
	else
		# lib.sh finds $BUILD/bin and $BUILD/itests; getfattr from tools/.
		export BUILD=$PWD PATH="$PWD/tools:$PATH"
		for t in integration/test_*.sh; do
			name=$(basename "$t" .sh)
			before=$(ls -d /tmp/kvfs-"$name".* 2>/dev/null)
			echo "=== $name.sh (KVFS_TEST_GPU=$KVFS_TEST_GPU)"
			# To a file, not through a pipe: a daemon that hangs
			# before its mount is ready still holds its stderr.
			log=$(mktemp "${TMPDIR:-/tmp}/kvfs-itest.XXXXXX")
			timeout -k 30 "${ITEST_TIMEOUT:-120}" bash "$t" >"$log" 2>&1
			rc=$?
			cat "$log"
			# lib.sh's t_ok/t_fail lines, counted also when the
			# script was killed before its t_done
			counts="$(grep -c '^ok - ' "$log") passed, $(grep -c '^not ok - ' "$log") failed"
			rm -f "$log"
			left=()
			for d in /tmp/kvfs-"$name".*; do
				grep -qxF "$d" <<<"$before" || left+=("$d")
			done
			itest_reap "${left[@]}"
			if [ "$rc" -eq 0 ]; then
				summary+=("$(printf '%-24s %s' "$name.sh" "$counts")")
			elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
				fail=1
				summary+=("$(printf '%-24s FAILED: killed after %ss%s' "$name.sh" "${ITEST_TIMEOUT:-120}" " ($counts so far)")")
			else
				fail=1
				summary+=("$(printf '%-24s FAILED, exit %d%s' "$name.sh" "$rc" ": $counts")")
			fi
		done
	fi
fi
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $fail
RUN
chmod +x "$OUT/run.sh"
nlibs=$(printf '%s\n' "${libs[@]}" | sort -u | wc -l)
echo "bundle: $OUT: ${#progs[@]} programs, ${#itests[@]} mount-level scripts, $nlibs libraries, $(du -sh "$OUT" | cut -f1)"
