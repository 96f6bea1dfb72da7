#!/usr/bin/env bash
# The vLLM and SGLang adapters of client/kvfs_engine: their translation
# with fakes of the engines' objects, and end to end through the shared
# core on a mount (tests/integration/connectors_test.py). Neither engine
# is installed: the adapters import without them.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
if ! "$PY" -c 'import torch' 2>/dev/null; then
	printf '# SKIP %s: /usr/bin/python3 cannot import torch (apt-get install python3-torch)\n' "$T_NAME"
	exit 0
fi
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$SRC/client
export KVFS_LIB=$BIN/../lib/libkvfs.so
# Everything python3 runs here loads libkvfs.so: with a sanitizer build,
# its runtime goes first (lib.sh).
kvfs_san_env "$KVFS_LIB"
[ "${#SAN_ENV[@]}" -eq 0 ] || export "${SAN_ENV[@]}"

kvfs_mkfs 64M
{
	printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = 16M\n\n'
	printf '[tier.gpu]\nbackend = shm\ncapacity = 8M\n\n'
	"$BIN/kvfs-torch-engine" --print-conf f
} >"$STORE/kvfs.conf"
t_check "mount" kvfs_mount
out=$("$PY" "$SRC/tests/integration/connectors_test.py" "$MNT" f 2>&1)
rc=$?
while read -r name res; do
	if [ "$res" = ok ]; then t_ok "$name"; else t_fail "$name ($res)"; fi
done < <(sed -n 's/^\(test_[a-z_]*\) (.*) \.\.\. \([a-zA-Z]*\)$/\1 \2/p' <<<"$out")
[ "$rc" -eq 0 ] || { t_fail "connectors_test.py exited $rc"; sed 's/^/#   /' <<<"$out" | tail -n 30; }
t_check "unmount" kvfs_unmount
t_done
