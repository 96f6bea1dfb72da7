#!/usr/bin/env bash
# The Prometheus endpoint ([daemon] metrics, docs/operations.md "Metrics"):
# a bad address is refused at its config line; a mount serves GET /metrics
# on a free loopback port (404 for anything else), the page passes
# `promtool check metrics`, and reads, LOOKUP and FETCH move what they
# should; with a remote tier its families and round trips appear; a port
# already taken stops the start; the port is closed once the daemon is
# gone. Mounts and servers always go.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/redis_lib.sh"

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=$(dirname "$BIN")/lib/libkvfs.so
HOLDER=
cleanup_all() {
	[ -z "$HOLDER" ] || kill "$HOLDER" 2>/dev/null
	t_cleanup
	redis_stop_all
}
trap cleanup_all EXIT

PORT=$(free_port)
URL=http://127.0.0.1:$PORT/metrics

# scrape FILE [URL]: the page into FILE.
scrape() { curl -sf --max-time 10 -o "$1" "${2:-$URL}"; }
# val FILE SERIES: the value of one series (name and labels as printed).
val() { awk -v s="$2" '$1 == s { print $2 }' "$1"; }
# a port nothing listens on: it can be bound (as the daemon binds it,
# past connections of the last one in TIME_WAIT).
port_free() {
	python3 -c 'import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))' "$1" "$2"
}
promcheck() { promtool check metrics <"$1" >"$1.lint" 2>&1; }

kvfs_mkfs 64M
kvfs_conf 16M
cat >>"$STORE/kvfs.conf" <<EOC

[tier.gpu]
backend = shm
capacity = 1M
EOC

# Bad values, each at its line (line 3: right after flush_ms).
for bad in "localhost:$PORT" "127.0.0.1:0" "127.0.0.1:65536" "[::1]$PORT" \
	"127.0.0.1" "::1:$PORT" "127.0.0.1:${PORT}x" ""; do
	sed -i '/^metrics = /d' "$STORE/kvfs.conf"
	sed -i "2a metrics = $bad" "$STORE/kvfs.conf"
	t_errno "metrics = '$bad' is refused at its line" \
		"kvfs.conf:3: metrics = '${bad//[/\\[}'" "$BIN/kvfs" -f "$STORE" "$MNT"
done
sed -i '/^metrics = /d' "$STORE/kvfs.conf"
sed -i "2a metrics = 127.0.0.1:$PORT" "$STORE/kvfs.conf"

t_check "mount with metrics on 127.0.0.1:$PORT" kvfs_mount
t_check "GET /metrics answers" scrape "$T_DIR/m0"
t_check "the page passes promtool check metrics" promcheck "$T_DIR/m0"
[ -s "$T_DIR/m0.lint" ] && sed 's/^/#   promtool: /' "$T_DIR/m0.lint"
t_check "the content type is the text format 0.0.4" sh -c \
	"curl -sf -o /dev/null -w '%{content_type}' '$URL' | grep -q 'text/plain; version=0.0.4'"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/")
t_check "GET / is 404 (got $code)" test "$code" = 404
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d x "$URL")
t_check "POST /metrics is 404 (got $code)" test "$code" = 404
fams=$(grep -c '^# TYPE ' "$T_DIR/m0")
helps=$(grep -c '^# HELP ' "$T_DIR/m0")
t_check "every family has HELP and TYPE ($fams families)" test "$fams" -eq "$helps" -a "$fams" -gt 50
t_check "every name is kvfs_*" sh -c "! grep -v '^#' '$T_DIR/m0' | grep -qv '^kvfs_'"
for s in 'kvfs_tier_capacity_bytes{tier="dram"}' 'kvfs_tier_used_bytes{tier="ssd"}' \
	'kvfs_tier_hits_total{tier="gpu"}' 'kvfs_chunk_mem_hits_total' \
	'kvfs_namespace_blocks{namespace="m"}' 'kvfs_ctl_leases' \
	'kvfs_restore_blocks_total' 'kvfs_writeback_blocks_total' \
	'kvfs_fuse_read_duration_seconds_count' \
	'kvfs_ctl_request_duration_seconds_count{op="lookup"}'; do
	t_check "the page has $s" test -n "$(val "$T_DIR/m0" "$s")"
done
t_check "the DRAM capacity is the config's" \
	test "$(val "$T_DIR/m0" 'kvfs_tier_capacity_bytes{tier="dram"}')" -eq $((16 << 20))
t_check "no remote families without a remote tier" \
	sh -c "! grep -q 'kvfs_remote_\|tier=\"remote\"' '$T_DIR/m0'"

# Work: writes and reads through the mount...
gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 3 --quiet
gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
# ...and LOOKUP and FETCH of a two-block chain through kvfs.py.
k1=$(gen make "$T_DIR/a.kv" "${GEOM[@]}" --parent root --start-pos 0 --tokens "$(seq -s, 100 115)")
k2=$(gen make "$T_DIR/b.kv" "${GEOM[@]}" --parent "$k1" --start-pos 16 --tokens "$(seq -s, 116 131)")
cp "$T_DIR/a.kv" "$MNT/$NS/$k1.kv" && cp "$T_DIR/b.kv" "$MNT/$NS/$k2.kv"
kvfs_san_env "$LIB"
out=$(env "${SAN_ENV[@]}" KVFS_LIB="$LIB" PYTHONPATH="$ROOT/client" PYTHONDONTWRITEBYTECODE=1 \
	python3 - "$MNT" "$NS" "$k1" "$k2" 2>&1 <<'PYEOF'
import sys, kvfs
mnt, ns, keys = sys.argv[1], sys.argv[2], [bytes.fromhex(k) for k in sys.argv[3:]]
c = kvfs.Client(mnt)
h = c.lookup(ns, keys)
f = c.fetch(ns, keys)
print("cached", h.n_cached, "fetched", len(f.blocks))
c.release(ns, keys)
c.close()
PYEOF
)
t_check "LOOKUP and FETCH through kvfs.py ($out)" grep -q "cached 2 fetched 2" <<<"$out"
nblk=$(ls "$MNT/$NS" | wc -l)
t_check "a scrape after the work" scrape "$T_DIR/m1"
t_check "that page passes promtool too" promcheck "$T_DIR/m1"
r0=$(val "$T_DIR/m0" kvfs_fuse_read_duration_seconds_count)
r1=$(val "$T_DIR/m1" kvfs_fuse_read_duration_seconds_count)
t_check "block reads are counted in the read histogram ($r0 -> $r1)" test "$r1" -gt "$r0"
t_check "the read histogram's +Inf bucket is its count" \
	test "$(val "$T_DIR/m1" 'kvfs_fuse_read_duration_seconds_bucket{le="+Inf"}')" = "$r1"
t_check "one LOOKUP in its histogram" \
	test "$(val "$T_DIR/m1" 'kvfs_ctl_request_duration_seconds_count{op="lookup"}')" -eq 1
t_check "one FETCH in its histogram" \
	test "$(val "$T_DIR/m1" 'kvfs_ctl_request_duration_seconds_count{op="fetch"}')" -eq 1
t_check "FETCH is counted" test "$(val "$T_DIR/m1" kvfs_ctl_fetches_total)" -eq 1
t_check "FETCH made two blocks resident" \
	test "$(val "$T_DIR/m1" kvfs_ctl_fetch_bytes_total)" -gt 0
t_check "the namespace's blocks are the listing's ($nblk)" \
	test "$(val "$T_DIR/m1" 'kvfs_namespace_blocks{namespace="m"}')" -eq "$nblk"
bsz=$(stat -c %s "$T_DIR/a.kv")
t_check "the namespace's bytes are its blocks' sizes" \
	test "$(val "$T_DIR/m1" 'kvfs_namespace_bytes{namespace="m"}')" -eq $((nblk * bsz))
t_check "the namespace's hits grew" \
	test "$(val "$T_DIR/m1" 'kvfs_namespace_hits_total{namespace="m"}')" -gt 0
t_check "DRAM served bytes" \
	test "$(val "$T_DIR/m1" 'kvfs_tier_read_bytes_total{tier="dram"}')" -gt \
	"$(val "$T_DIR/m0" 'kvfs_tier_read_bytes_total{tier="dram"}')"
t_check "commits are counted ($nblk)" test "$(val "$T_DIR/m1" kvfs_cache_commits_total)" -eq "$nblk"
t_check ".kvfs/stats agrees on commits" test "$(kvfs_stat cache.commits)" -eq "$nblk"
t_check "the log says where metrics are served" \
	grep -q "metrics: serving http://127.0.0.1:$PORT/metrics" "$STORE/kvfs.log"
t_check "unmount" kvfs_unmount
t_check "after unmount nothing answers on the port" sh -c "! curl -s --max-time 5 -o /dev/null '$URL'"
t_check "and the port can be bound again" port_free 127.0.0.1 "$PORT"

# A port someone else holds stops the start, and leaves no mount behind.
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
time.sleep(60)' "$PORT" &
HOLDER=$!
for _ in $(seq 50); do port_free 127.0.0.1 "$PORT" 2>/dev/null || break; sleep 0.1; done
t_errno "a port in use stops the mount" "metrics 127.0.0.1:$PORT: Address already in use" \
	"$BIN/kvfs" "$STORE" "$MNT"
t_check "and nothing is mounted" sh -c "! grep -q ' $MNT fuse' /proc/mounts"
kill "$HOLDER" 2>/dev/null
wait "$HOLDER" 2>/dev/null
HOLDER=

# With a remote tier (a 3-master cluster on loopback), on [::1] where the
# host has IPv6 loopback.
if ! cluster_create; then
	t_fail "a Redis cluster on loopback"
	t_done
	exit
fi
cat >>"$STORE/kvfs.conf" <<EOC

[tier.remote]
nodes = $NODES
EOC
HOST=127.0.0.1
if port_free ::1 "$PORT" 2>/dev/null; then
	HOST="[::1]"
fi
sed -i "s/^metrics = .*/metrics = $HOST:$PORT/" "$STORE/kvfs.conf"
URL=http://$HOST:$PORT/metrics
t_check "mount with a remote tier, metrics on $HOST:$PORT" kvfs_mount
gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 --blocks 2 --seed 9 --quiet
sync "$MNT/$NS"/*.kv 2>/dev/null
# A name nobody has: looked up on the remote tier, a round trip.
stat "$MNT/$NS/0123456789abcdef0123456789abcdef.kv" >/dev/null 2>&1
sleep 1
t_check "GET /metrics with a remote tier" scrape "$T_DIR/m2" "$URL"
t_check "that page passes promtool" promcheck "$T_DIR/m2"
t_check "the remote tier is one of the tiers" \
	test -n "$(val "$T_DIR/m2" 'kvfs_tier_misses_total{tier="remote"}')"
t_check "kvfs_remote_nodes is 3" test "$(val "$T_DIR/m2" kvfs_remote_nodes)" = 3
t_check "caller round trips are timed" \
	test "$(val "$T_DIR/m2" 'kvfs_remote_round_trip_seconds_count{client="caller"}')" -gt 0
t_check "write-back round trips are timed" \
	test "$(val "$T_DIR/m2" 'kvfs_remote_round_trip_seconds_count{client="writeback"}')" -gt 0
t_check "unmount with the remote tier" kvfs_unmount
t_check "the port is closed after that unmount" sh -c "! curl -s --max-time 5 -o /dev/null '$URL'"
t_done
