#!/usr/bin/env bash
# [14] Time to first token of the reference engine (kvfs-torch-engine,
# client/kvfs_engine) with a cached 2K-token prefix against a full
# prefill of the same prompt, in the same run on the same CPU: the
# engine's --check times the full recompute right after each request it
# served through kvfs. Prompts: a 2048-token prefix and a 32-token
# suffix of their own; the first request saves the prefix, the others
# load it. Through block files (read()) and through the control file
# (FETCH_INTO into the engine's pages), from DRAM, and after a remount
# (blocks on the SSD only).
#
#   tests/bench/ttft.sh [--summary FILE]     (BUILD, BENCH_TTFT_REQS)
set -u
export LC_ALL=C
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
case "$BUILD" in /*) BDIR=$BUILD ;; *) BDIR=$PWD/$BUILD ;; esac
BIN=$BDIR/bin
SUMMARY_OUT=
[ "${1:-}" = --summary ] && SUMMARY_OUT=${2:?--summary needs a file}
REQS=${BENCH_TTFT_REQS:-8}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	echo "    (no figure: /usr/bin/python3 cannot import torch)"
	exit 0
fi
WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/kvfs-ttft.XXXXXX") || exit 1
STORE=$WORK/store
MNT=$WORK/mnt
PID=
mkdir -p "$MNT"
unmount() {
	if mountpoint -q "$MNT"; then fusermount3 -u "$MNT"; fi
	[ -n "$PID" ] && timeout 120 tail --pid="$PID" -f /dev/null
	PID=
}
trap 'unmount; rm -rf "$WORK"' EXIT
"$BIN/mkfs.kvfs" --ssd-size 1G "$STORE" >/dev/null || exit 1
{
	printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = 256M\n\n'
	printf '[tier.gpu]\nbackend = shm\ncapacity = 64M\n\n'
	"$BIN/kvfs-torch-engine" --print-conf f
} >"$STORE/kvfs.conf"
/usr/bin/python3 - "$REQS" >"$WORK/prompts" <<'PY'
import json, random, sys
r = random.Random(12)
pre = [r.randrange(1024) for _ in range(2048)]
for _ in range(int(sys.argv[1]) + 1):
    print(json.dumps({"tokens": pre + [r.randrange(1024) for _ in range(32)]}))
PY
mount_kvfs() {
	"$BIN/kvfs" "$STORE" "$MNT" || exit 1
	PID=$(cat "$STORE/kvfs.pid")
}
# figure LABEL VIA: requests 1.. of one engine run (request 0 saves, or
# warms up after a remount)
figure() {
	"$BIN/kvfs-torch-engine" --mount "$MNT" --ns f --prompts "$WORK/prompts" \
		--via "$2" --check >"$WORK/out" || { echo "    (no figure: the engine failed)"; return; }
	/usr/bin/python3 - "$1" "$WORK/out" "$SUMMARY_OUT" <<'PY'
import json, statistics as st, sys
label, out, summ = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open(out)][1:]
c = st.median(r["ttft_ms"] for r in rows)
f = st.median(r["ttft_full_ms"] for r in rows)
d = max(r["max_abs_diff"] for r in rows)
hit = min(r["cached_tokens"] for r in rows)
print("  %-38s cached %4d tokens: TTFT %8.2f ms, full prefill %8.2f ms, "
      "%.2fx; max |diff| %.2g" % (label, hit, c, f, f / c, d))
if summ:
    with open(summ, "a") as s:
        s.write("%s|%.2f|%.2f|ms|%.2f|-\n" % (label, c, f, f / c))
PY
}
echo
echo "[14] TTFT of the reference engine, 2048-token cached prefix + 32 new"
echo "     tokens, against a full prefill (ratio = full / cached: the speedup)"
mount_kvfs
figure "[14] TTFT 2K prefix, files (DRAM)" files
figure "[14] TTFT 2K prefix, ctl (DRAM)" ctl
unmount
mount_kvfs
figure "[14] TTFT 2K prefix, files (SSD)" files
unmount
mount_kvfs
figure "[14] TTFT 2K prefix, ctl (SSD)" ctl
unmount
