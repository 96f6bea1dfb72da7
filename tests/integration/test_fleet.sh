#!/usr/bin/env bash
# Fleet sightings (docs/remote.md, "Fleet sightings"): one Redis server on
# a free loopback port and two kvfs daemons with separate stores and
# [fleet] sightings = redis. Blocks A writes and reads reach B as
# sightings (fleet.sight.keys_in); B's reach A; garbage PUBLISHed on the
# channel is rejected on both (counted, logged) and B keeps serving; the
# server killed leaves both daemons up and serving (the lost batches and
# faults counted); started again, the subscriptions come back by
# themselves. Then a 3-master cluster with each host on its own node
# (A's first seed dead): the messages cross the cluster bus. Mounts and
# servers always go.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/redis_lib.sh"
. "$(dirname "$0")/host_b.sh"

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ITESTS=$BUILD/itests ;; *) ITESTS=$ROOT/$BUILD/itests ;; esac
CL=$ITESTS/remote_client

trap 'kvfs_unmount; unmount_b; redis_stop_all; t_cleanup' EXIT

if ! redis_require; then
	t_done
	exit 1
fi

P=$(free_port)
t_check "a Redis server on free port $P" redis_start "$P"
# A channel of this run's own: another run's daemons never hear it.
CHAN=kt$$
SUB=$CHAN:sightings

# fleet_conf STORE: the test namespace, policy kvfs and [fleet].
fleet_conf() {
	STORE=$1 kvfs_conf 16M kvfs
	cat >>"$1/kvfs.conf" <<EOC

[fleet]
sightings = redis
nodes = 127.0.0.1:$P
channel = $CHAN
interval = 100ms
timeout = 200ms
EOC
}


# until_ge STAT_FN KEY MIN: wait (at most 30 s) for the stat to reach MIN.
until_ge() {
	local v
	for _ in $(seq 300); do
		v=$("$1" "$2")
		[ -n "$v" ] && [ "$v" -ge "$3" ] && return 0
		sleep 0.1
	done
	t_log "$1 $2 = ${v:-none}, wanted >= $3"
	return 1
}
# subscribers N: the channel has N subscribers (at most 30 s).
subscribers() {
	for _ in $(seq 300); do
		[ "$(redis-cli -p "$P" pubsub numsub "$SUB" | tail -n 1)" = "$1" ] &&
			return 0
		sleep 0.1
	done
	return 1
}

kvfs_mkfs 64M
"$BIN/mkfs.kvfs" --ssd-size 64M "$STORE_B" >/dev/null
fleet_conf "$STORE"
fleet_conf "$STORE_B"
# A serves its metrics too.
MPORT=$(free_port "$P")
sed -i "2a metrics = 127.0.0.1:$MPORT" "$STORE/kvfs.conf"
t_check "host A mounts with sightings = redis" kvfs_mount
t_check "host B mounts with sightings = redis" mount_b
t_check "both subscribed to $SUB" subscribers 2
t_check "the stats show fleet.sight.*" [ "$(stat_b fleet.sight.keys_in)" = 0 ]
t_check "the start is logged" grep -q "fleet sightings: 127.0.0.1:$P, channel $SUB" \
	"$STORE/kvfs.log"

# -- A's references reach B ---------------------------------------------
t_check "A writes chain 1 (8 blocks)" $CL "$MNT" write 8 1
t_check "B hears A's 8 new blocks" until_ge stat_b fleet.sight.keys_in 8
t_check "A published them" until_ge stat_a fleet.sight.keys_out 8
t_check "A reads chain 1" grep -q '^read ok 8 missing 0 ' <<<"$($CL "$MNT" read 8 1)"
t_check "A's reads are sightings too: B hears 16" \
	until_ge stat_b fleet.sight.keys_in 16
t_check "A hears none of its own" [ "$(stat_a fleet.sight.keys_in)" = 0 ]
t_check "B writes chain 2 (4 blocks)" $CL "$MNT_B" write 4 2
t_check "A hears B's 4" until_ge stat_a fleet.sight.keys_in 4
t_check "kvfsctl status shows the sightings" \
	grep -q '^fleet sightings [0-9]* keys sent, [1-9][0-9]* heard' \
	<<<"$("$BIN/kvfsctl" status "$MNT")"
t_check "A's metrics page answers" \
	curl -sf --max-time 10 -o "$T_DIR/metrics" "http://127.0.0.1:$MPORT/metrics"
t_check "and counts the keys heard (>= 4)" awk '
	$1 == "kvfs_fleet_sight_keys_received_total" && $2 >= 4 { ok = 1 }
	END { exit !ok }' "$T_DIR/metrics"
t_check "the page passes promtool check metrics" \
	sh -c "promtool check metrics <'$T_DIR/metrics' >'$T_DIR/metrics.lint' 2>&1"
t_log "A: $(grep '^fleet.sight' "$MNT/.kvfs/stats" | tr '\n' ' ')"
t_log "B: $(grep '^fleet.sight' "$MNT_B/.kvfs/stats" | tr '\n' ' ')"

# -- garbage on the channel --------------------------------------------
rej=$(stat_b fleet.sight.rejected)
GARBAGE='this is no sighting, only garbage'
t_check "redis-cli PUBLISHes garbage on $SUB" \
	[ "$(redis-cli -p "$P" publish "$SUB" "$GARBAGE")" = 2 ]
t_check "B rejects it (counted)" until_ge stat_b fleet.sight.rejected $((rej + 1))
t_check "and logs why" grep -q "fleet sightings: $SUB: a message of ${#GARBAGE} bytes rejected: bad magic" \
	"$STORE_B/kvfs.log"
# A well-formed header for one key whose CRC is wrong.
printf 'KSGT\001\000\030\000\001\002\003\004\005\006\007\010\001\000\000\000\000\000\000\000%s' \
	0123456789abcdef >"$T_DIR/badcrc"
t_check "redis-cli PUBLISHes a message with a bad CRC" \
	[ "$(redis-cli -p "$P" -x publish "$SUB" <"$T_DIR/badcrc")" = 2 ]
t_check "B rejects it too" until_ge stat_b fleet.sight.rejected $((rej + 2))
# Fault lines are rate-limited (one a second): publish it again until
# the line shows (at most 30 s).
crc_logged() {
	for _ in $(seq 300); do
		grep -q "rejected: CRC mismatch" "$STORE_B/kvfs.log" && return 0
		redis-cli -p "$P" -x publish "$SUB" <"$T_DIR/badcrc" >/dev/null
		sleep 0.1
	done
	return 1
}
t_check "and logs the CRC mismatch" crc_logged
t_check "A rejected both as well" until_ge stat_a fleet.sight.rejected 2
t_check "B is up and serves its blocks" \
	grep -q '^read ok 4 missing 0 bad 0 err 0 ' <<<"$($CL "$MNT_B" read 4 2)"
t_check "the garbage was never a sighting: B heard 16 keys in 2+ messages" \
	[ "$(stat_b fleet.sight.keys_in)" -ge 16 ]

# -- the server killed ---------------------------------------------------
redis_stop_all
lost=$(stat_a fleet.sight.lost)
t_check "A writes chain 3 with no server" $CL "$MNT" write 8 3
t_check "A serves it" grep -q '^read ok 8 missing 0 bad 0 err 0 ' <<<"$($CL "$MNT" read 8 3)"
t_check "B serves chain 2" grep -q '^read ok 4 missing 0 bad 0 err 0 ' <<<"$($CL "$MNT_B" read 4 2)"
t_check "A counts the lost sightings" until_ge stat_a fleet.sight.lost $((lost + 1))
t_check "and the faults" until_ge stat_a fleet.sight.errors 1
t_check "both daemons stay up" kill -0 "$KVFS_PID" "$B_PID"
t_check "the faults are logged" grep -q "fleet sightings: 127.0.0.1:$P: " "$STORE/kvfs.log"

# -- back again ----------------------------------------------------------
t_check "the server starts again on port $P" redis_start "$P"
t_check "both subscribe again by themselves" subscribers 2
t_check "and count it" until_ge stat_b fleet.sight.reconnects 1
in=$(stat_b fleet.sight.keys_in)
t_check "A writes chain 4 (8 blocks)" $CL "$MNT" write 8 4
t_check "B hears them" until_ge stat_b fleet.sight.keys_in $((in + 8))

# -- a Redis Cluster: each host on its own node, A's first seed dead -------
t_check "A unmounts" kvfs_unmount
unmount_b
t_check "B unmounted" [ -z "$(grep " $MNT_B fuse" /proc/mounts)" ]
redis_stop_all
cluster_create
t_check "3-master cluster on free ports $P1 $P2 $P3" cluster_ok "$P1" "$P2" "$P3"
DEAD=$(free_port "$P" "$P1" "$P2" "$P3")
sed -i "s/^nodes = .*/nodes = 127.0.0.1:$DEAD,127.0.0.1:$P1/" "$STORE/kvfs.conf"
sed -i "s/^nodes = .*/nodes = 127.0.0.1:$P2/" "$STORE_B/kvfs.conf"
t_check "A mounts again, seeds: nothing on $DEAD, then master $P1" kvfs_mount
t_check "B mounts again, seed: master $P2" mount_b
# numsub_on PORT: the node's own subscribers to the channel are 1.
numsub_on() {
	for _ in $(seq 300); do
		[ "$(redis-cli -p "$1" pubsub numsub "$SUB" | tail -n 1)" = 1 ] &&
			return 0
		sleep 0.1
	done
	return 1
}
t_check "A subscribed on $P1 (past the dead seed)" numsub_on "$P1"
t_check "B subscribed on $P2" numsub_on "$P2"
t_check "A writes chain 5 (8 blocks)" $CL "$MNT" write 8 5
t_check "B hears all 8 through the cluster bus" until_ge stat_b fleet.sight.keys_in 8
t_check "A lost none (it published past the dead seed)" \
	[ "$(stat_a fleet.sight.lost)" = 0 ]
t_check "B writes chain 6 (4 blocks)" $CL "$MNT_B" write 4 6
t_check "A hears B's 4" until_ge stat_a fleet.sight.keys_in 4

t_check "A unmounts" kvfs_unmount
unmount_b
t_check "B unmounted" [ -z "$(grep " $MNT_B fuse" /proc/mounts)" ]
t_check "neither log has a sanitizer report (make asan)" \
	sh -c "! grep -q 'Sanitizer\|runtime error' '$STORE/kvfs.log' '$STORE_B/kvfs.log'"
redis_stop_all
t_done
