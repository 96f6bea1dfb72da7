#!/usr/bin/env bash
# Runs the unit tests (cmocka programs) and the mount-level integration
# tests, then prints one summary line: "total: N passed, M failed".
#   tests/run.sh [unit|integration]   (default: both)
set -u
export LC_ALL=C
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD
what=${1:-all}
pass=0
fail=0
failed=()

run_unit() {
	local t out rc p f
	for t in "$BUILD"/tests/test_*; do
		[ -x "$t" ] || continue
		case " ${KVFS_TEST_SKIP:-} " in
		*" $(basename "$t") "*)
			printf '%-28s skipped (KVFS_TEST_SKIP)\n' "$(basename "$t")"
			continue
			;;
		esac
		out=$("$t" 2>&1)
		rc=$?
		printf '%s\n' "$out" | grep -E '^\[ *(OK|FAILED|PASSED|ERROR|SKIPPED) *\]|^\[ *RUN' | grep -v '^\[ RUN' | grep -v '^\[       OK' || true
		p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
		f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
		p=${p:-0}
		f=${f:-0}
		if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
			# crashed, or a sanitizer stopped it
			f=1
			printf '%s\n' "$out" | tail -n 30
		elif [ "$f" -ne 0 ]; then
			printf '%s\n' "$out" | grep -E 'FAILED|error|Failure' | head -n 20
		fi
		pass=$((pass + p))
		fail=$((fail + f))
		[ "$f" -eq 0 ] || failed+=("$(basename "$t")")
		printf '%-28s %3d passed, %d failed\n' "$(basename "$t")" "$p" "$f"
	done
}

# The shape of the source tree (tests/house.py): layers, private headers,
# file sizes, helpers kept once, calls in one direction.
run_house() {
	local out p f
	out=$(/usr/bin/python3 tests/house.py "$BUILD" 2>&1)
	p=$(grep -c '^ok - ' <<<"$out")
	f=$(grep -c '^not ok - ' <<<"$out")
	grep -q '^house: [0-9]* passed, [0-9]* failed$' <<<"$out" || f=$((f + 1))
	if [ "$f" -ne 0 ]; then
		printf '%s\n' "$out" | grep -v '^ok - '
		failed+=(house)
	fi
	pass=$((pass + p))
	fail=$((fail + f))
	printf '%-28s %3d passed, %d failed\n' house "$p" "$f"
}

run_integration() {
	local t out p f
	for t in tests/integration/test_*.sh; do
		[ -f "$t" ] || continue
		out=$(timeout 900 bash "$t" 2>&1)
		p=$(grep -c '^ok - ' <<<"$out")
		f=$(grep -c '^not ok - ' <<<"$out")
		if ! grep -q '^# .*: [0-9]* passed, [0-9]* failed$' <<<"$out"; then
			# the script died before its summary
			f=$((f + 1))
		fi
		if [ "$f" -ne 0 ]; then
			printf '%s\n' "$out" | grep -v '^ok - ' | tail -n 40
			failed+=("$(basename "$t")")
		fi
		pass=$((pass + p))
		fail=$((fail + f))
		printf '%-28s %3d passed, %d failed\n' "$(basename "$t" .sh)" "$p" "$f"
	done
}

case $what in
unit) run_unit; run_house ;;
integration) run_integration ;;
*) run_unit; run_house; run_integration ;;
esac

if [ "${#failed[@]}" -gt 0 ]; then
	echo "failed: ${failed[*]}"
fi
echo "total: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
