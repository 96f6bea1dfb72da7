#!/usr/bin/env bash
# The remote tier and its cluster client against real servers on
# loopback, no mount: a 3-master Redis Cluster made with
# `redis-cli --cluster create` on free ports, and a plain server. Block
# chains go in and out byte for byte across slots; a slot moved under a
# client (ASK while it migrates, MOVED after), a master stopped with
# SIGSTOP (timeouts, bounded) and killed (faults, bounded), both
# recovering by themselves; garbage refused and deleted; the write-back
# queue; a plain server with AUTH. Every server is stopped on exit.
. "$(dirname "$0")/lib.sh"

RC=$BUILD/itests/redis_client
case $RC in /*) ;; *) RC=$(cd "$(dirname "$0")/../.." && pwd)/$RC ;; esac
. "$(dirname "$0")/redis_lib.sh"

trap 'redis_stop_all; t_cleanup' EXIT

if ! redis_require; then
	t_done
	exit 1
fi

cluster_create
t_check "3-master cluster created on free ports $P1 $P2 $P3" cluster_ok "$P1" "$P2" "$P3"
export REMOTE_TIMEOUT_MS=200

# -- hash slots agree with the server's ----------------------------------
slots_ok=1
for k in foo bar hello 123456789 '{user1000}.following' 'foo{bar}{zap}' \
	'foo{}{bar}' "$($RC "$NODES" key 0 1)"; do
	a=$($RC "$NODES" slot "$k")
	b=$(redis-cli -p "$P1" cluster keyslot "$k")
	[ "$a" = "$b" ] || { slots_ok=0; t_log "slot of $k: kvfs $a, redis $b"; }
done
t_check "hash slots equal CLUSTER KEYSLOT" [ $slots_ok = 1 ]
t_check "topology discovered from one seed: 3 masters" \
	[ "$($RC "$NODES" nodes)" = 3 ]

# -- a chain across slots, byte for byte ---------------------------------
out=$($RC "$NODES" put 64 1)
t_check "64 blocks SET NX across the cluster ($out)" [ $? = 0 ]
spread=0
for p in $P1 $P2 $P3; do
	[ "$(redis-cli -p "$p" dbsize)" -gt 0 ] && spread=$((spread + 1))
done
t_check "the blocks spread over all 3 masters" [ $spread = 3 ]
out=$($RC "$NODES" get 64 1)
t_check "a second client reads all 64 in one pipelined batch ($out)" [ $? = 0 ]
out=$($RC "$NODES" put 64 1)
t_check "a second SET NX of the same blocks is a success" [ $? = 0 ]

# -- a slot moves under a running client: ASK, then MOVED ----------------
KEY=$($RC "$NODES" key 5 1)
SLOT=$(redis-cli -p "$P1" cluster keyslot "$KEY")
OWNER=
for p in $P1 $P2 $P3; do
	[ "$(redis-cli -p "$p" exists "$KEY")" = 1 ] && OWNER=$p
done
DEST=$P1
[ "$OWNER" = "$P1" ] && DEST=$P2
id_of() { redis-cli -p "$1" cluster myid; }
SRC_ID=$(id_of "$OWNER")
DST_ID=$(id_of "$DEST")
MIGRATE="redis-cli -p $DEST cluster setslot $SLOT importing $SRC_ID >/dev/null &&
 redis-cli -p $OWNER cluster setslot $SLOT migrating $DST_ID >/dev/null &&
 redis-cli -p $OWNER migrate 127.0.0.1 $DEST '$KEY' 0 5000 >/dev/null"
FINISH="for p in $P1 $P2 $P3; do redis-cli -p \$p cluster setslot $SLOT node $DST_ID >/dev/null; done"
out=$($RC "$NODES" get 64 1 "$MIGRATE" "$FINISH")
rc=$?
t_log "$out"
t_check "a key migrating: the client follows ASK (round 1 all hits)" \
	grep -q '^round 1 hits 64 ' <<<"$out"
t_check "the slot moved: the client follows MOVED (round 2 all hits)" [ $rc = 0 ]
t_check "the slot's key now lives on the new owner" \
	[ "$(redis-cli -p "$DEST" exists "$KEY")" = 1 ]

# -- garbage is refused, counted and deleted -----------------------------
$RC "$NODES" garble 7 1
out=$($RC "$NODES" get 64 1)
t_log "$out"
t_check "a corrupt value is a miss, never served" \
	grep -q '^round 0 hits 63 misses 1 rejected 1 .* bad 0 ' <<<"$out"
KEY7=$($RC "$NODES" key 7 1)
gone=1
for p in $P1 $P2 $P3; do
	[ "$(redis-cli -c -p "$p" exists "$KEY7")" = 0 ] || gone=0
done
t_check "the corrupt value is deleted from the cluster" [ $gone = 1 ]
$RC "$NODES" put 64 1 >/dev/null

# -- the write-back queue -------------------------------------------------
out=$($RC "$NODES" queue 64 2)
t_check "64 blocks through the write-back queue ($out)" [ $? = 0 ]
out=$($RC "$NODES" get 64 2)
t_check "another client reads them all" [ $? = 0 ]

# -- a master stopped (SIGSTOP): timeouts, bounded; then recovery --------
STOP_PID=${PIDS[2]}
out=$($RC "$NODES" get 64 1 "kill -STOP $STOP_PID" "kill -CONT $STOP_PID; sleep 0.5")
t_log "$out"
r1=$(grep '^round 1 ' <<<"$out")
ms=$(awk '{ print $NF }' <<<"$r1")
t_check "a stopped master: its blocks fail, the others hit" \
	awk '$4 > 0 && $4 < 64 && $10 > 0 { ok = 1 } END { exit !ok }' <<<"$r1"
t_check "the lookup gives up within its retries (${ms} ms < 2500)" \
	awk -v m="$ms" 'BEGIN { exit !(m < 2500) }'
t_check "the node resumed: the same client reads everything again" \
	grep -q '^round 2 hits 64 ' <<<"$out"

# -- a master killed: faults, bounded; restarted: recovery ---------------
KILL_PORT=$P3
KILL_PID=${PIDS[2]}
RESTART="redis-server --port $KILL_PORT --bind 127.0.0.1 --dir $T_DIR/redis-$KILL_PORT \
 --save '' --appendonly no --daemonize yes --pidfile $T_DIR/restarted.pid \
 --logfile $T_DIR/redis-$KILL_PORT/log2 ${CL_ARGS[*]} --cluster-config-file nodes-$KILL_PORT.conf;
 for i in \$(seq 100); do redis-cli -p $KILL_PORT cluster info 2>/dev/null | grep -q cluster_state:ok && break; sleep 0.1; done;
 $RC $NODES put 64 1 >/dev/null"
out=$($RC "$NODES" get 64 1 "kill -KILL $KILL_PID; sleep 0.2" "$RESTART")
rc=$?
[ -f "$T_DIR/restarted.pid" ] && SERVERS+=("$(cat "$T_DIR/restarted.pid")")
t_log "$out"
r1=$(grep '^round 1 ' <<<"$out")
ms=$(awk '{ print $NF }' <<<"$r1")
t_check "a killed master: its blocks fail, the others hit" \
	awk '$4 > 0 && $4 < 64 && $10 > 0 { ok = 1 } END { exit !ok }' <<<"$r1"
t_check "the lookup fails fast (${ms} ms < 2500)" \
	awk -v m="$ms" 'BEGIN { exit !(m < 2500) }'
t_check "the master restarted: the same client recovers by itself" [ $rc = 0 ]

# -- a plain server (cluster mode off), with AUTH ------------------------
P4=$(free_port "$P1" "$P2" "$P3")
REDIS_AUTH=pw4 redis_start "$P4" --requirepass pw4 || t_fail "plain server starts"
out=$(REMOTE_PASSWORD=pw4 $RC "127.0.0.1:$P4" put 16 3)
t_check "a plain server: SET NX with AUTH ($out)" [ $? = 0 ]
t_check "a plain server owns every slot: 1 node" \
	[ "$(REMOTE_PASSWORD=pw4 $RC "127.0.0.1:$P4" nodes)" = 1 ]
out=$(REMOTE_PASSWORD=pw4 $RC "127.0.0.1:$P4" get 16 3)
t_check "a plain server: read back byte for byte" [ $? = 0 ]
out=$($RC "127.0.0.1:$P4" get 16 3 2>/dev/null)
t_check "without the password: no block is served" [ $? != 0 ]

t_done
