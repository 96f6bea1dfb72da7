# shellcheck shell=bash
# Redis servers on loopback for the remote-tier tests, the demo and the
# benchmarks (sourced after lib.sh, or with REDIS_DIR set): free ports,
# servers started in the foreground of a background job and always
# stopped (redis_stop_all, for the EXIT trap), a 3-master cluster.

SERVERS=()

redis_stop_all() {
	local p
	for p in "${SERVERS[@]}"; do
		kill -CONT "$p" 2>/dev/null
		kill -KILL "$p" 2>/dev/null
	done
	for p in "${SERVERS[@]}"; do
		timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null
	done
	SERVERS=()
}

# The servers' programs are there (make deps installs them); a failed
# check otherwise. Callers end the test when it returns 1.
redis_require() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null &&
		return 0
	t_fail "redis-server and redis-cli are installed (make deps)"
	return 1
}

# A port that can be bound, and whose cluster bus port (+10000) can too.
free_port() {
	python3 - "$@" <<'PYEOF'
import socket, sys
taken = set(int(a) for a in sys.argv[1:])
for _ in range(200):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    if p in taken or p + 10000 > 65535:
        continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 10000))
    except OSError:
        continue
    finally:
        b.close()
    print(p)
    break
PYEOF
}

# redis_start PORT [ARGS...]: a server in $REDIS_DIR/redis-PORT (default
# $T_DIR); pid in SERVERS.
redis_start() {
	local port=$1 d=${REDIS_DIR:-$T_DIR}/redis-$1
	shift
	mkdir -p "$d"
	redis-server --port "$port" --bind 127.0.0.1 --dir "$d" --save '' \
		--appendonly no --daemonize no --logfile "$d/log" "$@" &
	SERVERS+=($!)
	disown $!
	for _ in $(seq 100); do
		redis-cli -p "$port" ${REDIS_AUTH:+-a "$REDIS_AUTH" --no-auth-warning} \
			ping 2>/dev/null | grep -q PONG && return 0
		sleep 0.1
	done
	return 1
}

cluster_ok() {
	local p
	for p in "$@"; do
		redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || return 1
	done
}

CL_ARGS=(--cluster-enabled yes --cluster-node-timeout 2000
	--cluster-require-full-coverage no)

# cluster_create: 3 masters on free ports made into a cluster with
# `redis-cli --cluster create`; sets P1 P2 P3, PIDS (theirs) and NODES
# (one seed). Returns 0 once every master says cluster_state:ok.
cluster_create() {
	local p d=${REDIS_DIR:-$T_DIR}
	P1=$(free_port)
	P2=$(free_port "$P1")
	P3=$(free_port "$P1" "$P2")
	for p in $P1 $P2 $P3; do
		redis_start "$p" "${CL_ARGS[@]}" --cluster-config-file "nodes-$p.conf" ||
			return 1
	done
	PIDS=("${SERVERS[@]}")
	yes yes | redis-cli --cluster create "127.0.0.1:$P1" "127.0.0.1:$P2" \
		"127.0.0.1:$P3" --cluster-replicas 0 --cluster-yes \
		>"$d/create.log" 2>&1
	for _ in $(seq 100); do cluster_ok "$P1" "$P2" "$P3" && break; sleep 0.1; done
	NODES="127.0.0.1:$P1"
	cluster_ok "$P1" "$P2" "$P3"
}

# redis_restart PORT: a killed master of the cluster started again on its
# port with its node file (its data is gone: no persistence); waits for
# cluster_state:ok. Its pid joins SERVERS.
redis_restart() {
	local port=$1 d=${REDIS_DIR:-$T_DIR}/redis-$1
	redis-server --port "$port" --bind 127.0.0.1 --dir "$d" --save '' \
		--appendonly no --daemonize no --logfile "$d/log2" \
		"${CL_ARGS[@]}" --cluster-config-file "nodes-$port.conf" &
	SERVERS+=($!)
	disown $!
	for _ in $(seq 100); do
		redis-cli -p "$port" cluster info 2>/dev/null |
			grep -q cluster_state:ok && return 0
		sleep 0.1
	done
	return 1
}
