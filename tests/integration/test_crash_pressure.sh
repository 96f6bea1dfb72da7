#!/usr/bin/env bash
# kill -9 under pressure, several times in a row. A DRAM tier of 16 blocks
# takes a storm of hundreds, so write-back and DRAM eviction are in flight
# when the daemon dies; meanwhile blocks are unlinked and re-created under
# the same keys, and pinned and unpinned. Four kill/remount cycles run back
# to back on the same store; the last one fills the SSD first, so that
# write-back evicts SSD blocks and reuses their extents.
#
# The contract (docs/operations.md, "Durability"), checked after every
# remount for every key the test touched:
# - fsync returned 0: the block is served, byte for byte;
# - rm returned 0: the record is gone and the extent freed, durably. The
#   block stays gone (it never comes back, torn or whole) unless it is
#   created again;
# - pin or unpin returned 0 on a durable block: recorded durably, so
#   getfattr user.kvfs.pin says so after the remount. A pin in ssd waits
#   until the block is durable, so once it returned the block is there, and
#   a pin on a block not yet durable is recorded along with the block;
# - a block that was only committed (close, no fsync) may be absent, and
#   an operation in flight at the kill may or may not have happened; none
#   of them may leave anything else behind;
# - whatever is present verifies (never torn), cache.checksum_errors is 0;
# - recovery serves every record (0 skipped, 0 damaged), the persistent
#   free map agrees with the records (no "free map disagrees" rewrite), the
#   daemon logs no error, and the SSD tier's used bytes are exactly the
#   extents of the stored blocks.
# Under SSD pressure an unpinned block may also be evicted: there, a block
# acknowledged durable may be missing only if the log names it (at debug
# level the daemon says "evicting" before the transaction, so the eviction
# under way at the kill is named too).
#
# The kill follows events: the N-th fsync acknowledgement, progress of every
# actor and a DRAM (and in the last cycle, SSD) eviction count, polled.
. "$(dirname "$0")/lib.sh"

BLK=40960 # one test block: its file, its DRAM copy and its SSD extent
W=$T_DIR/work
mkdir -p "$W"

kvfs_mkfs 96M
# The test namespace of lib.sh; small write-back batches so that a batch is
# under way at any moment, and debug logging for the eviction lines.
cat >"$STORE/kvfs.conf" <<EOC
[daemon]
flush_ms = 50
log_level = debug

[tier.dram]
capacity = 640K

[tier.ssd]
writeback_batch = 4

[policy]
name = lru

[namespace $NS]
layers = 4
kv_heads = 2
head_dim = 64
dtype = bf16
block_tokens = 16
chunk_tokens = 4
EOC

# Sets of blocks. Every key belongs to one actor, which logs each of its
# operations on the key as "try OP KEY" before and "ok OP KEY" once it
# returned 0, so the events of one key are in order in one file.
#   churn: 8 blocks unlinked and re-created, round after round
#   pin.C: 8 blocks per cycle, pinned (ssd, one of them dram too) and
#          unpinned, round after round
#   a.C:   two fsync writers; every 10th acknowledged block is unlinked
#   b.C:   a writer without fsync; of its committed blocks every 8th is
#          pinned in ssd and every 8th (another) unlinked
wr() { # wr SEED PREFIXES [gen write options]: 8-block chains, none shared
	local seed=$1 p=$2
	shift 2
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes "$p" --blocks 8 --shared 0 \
		--seed "$seed" --quiet "$@"
}
churn_write() {
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 4 --shared 0 \
		--seed 200 --quiet "$@"
}
# Set right after the kill. Not a stat of the mount: the kernel may answer
# that from its caches for a while after the daemon died.
live() { [ ! -e "$W/killed" ]; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' <<<"$st"; }

# op EVENT KEY CMD...: runs CMD, logging the event around it. Fails only
# when CMD met the dead mount, so that the actor stops.
op() {
	local ev=$1 k=$2 err
	shift 2
	echo "try $ev $k"
	if err=$("$@" 2>&1); then
		echo "ok $ev $k"
		return 0
	fi
	printf '%s\n' "$err" >>"$ERRF"
	! grep -q 'not connected\|connection abort' <<<"$err"
}
f() { echo "$MNT/$NS/$1.kv"; }

actor_a() { # fsync writers; reads their acknowledgements
	local i=0 k on=1
	{
		wr $((1000 + 10 * cyc + 1)) 12 --fsync --log - 2>>"$ERRF" &
		wr $((1000 + 10 * cyc + 2)) 12 --fsync --log - 2>>"$ERRF" &
		wait
	} | while read -r k; do
		echo "ack $k"
		i=$((i + 1))
		# after the kill, only record the acknowledgements still queued
		if [ "$on" = 1 ] && [ $((i % 10)) = 0 ]; then
			op rm "$k" rm "$(f "$k")" || on=0
		fi
	done >>"$W/ev.$cyc.a"
}

actor_b() { # a writer without fsync, and what happens to its blocks
	local i=0 k on=1
	wr $((3000 + cyc)) "$1" --log - 2>>"$ERRF" | while read -r k; do
		echo "new $k"
		i=$((i + 1))
		[ "$on" = 1 ] || continue
		case $((i % 8)) in
		0) op "pin ssd" "$k" setfattr -n user.kvfs.pin -v ssd \
			"$(f "$k")" || on=0 ;;
		3) op rm "$k" rm "$(f "$k")" || on=0 ;;
		esac
	done >>"$W/ev.$cyc.b"
}

actor_churn() { # unlink half the churn set, create it again, repeat
	local r=0 j k gone
	while live; do
		gone=()
		j=0
		for k in $(cat "$W/churn.keys"); do
			j=$((j + 1))
			[ $(((j + r) % 2)) = 0 ] || continue
			op rm "$k" rm "$(f "$k")" || return 0
			gone+=("$k")
		done
		for k in "${gone[@]}"; do echo "try add $k"; done
		churn_write --fsync --log - 2>>"$ERRF" | while read -r k; do
			echo "ok add $k"
		done
		r=$((r + 1))
	done >>"$W/ev.$cyc.churn"
}

actor_pin() { # rounds over every pin set: pin ssd, pin dram, unpin
	local r=0 j k t
	while live; do
		j=0
		for k in $(cat "$W"/pin.*.keys); do
			j=$((j + 1))
			case $((r % 3)),$((j % 8)) in
			0,* | 1,[02-7]) t=ssd ;;
			1,1) t=dram ;;
			2,*) t= ;;
			esac
			if [ -n "$t" ]; then
				op "pin $t" "$k" setfattr -n user.kvfs.pin -v "$t" \
					"$(f "$k")" || return 0
			else
				op unpin "$k" setfattr -x user.kvfs.pin \
					"$(f "$k")" || return 0
			fi
		done
		r=$((r + 1))
	done >>"$W/ev.$cyc.pin"
}

# The expected state of every key, as a set of allowed "PRESENT:PINS"
# (PINS "-", "ssd", "dram" or "dram,ssd"), from the state observed at the
# last remount (state file: KEY STATE) and this cycle's events.
# check_state STATE_IN OBSERVED EVICTED RELAXED STATE_OUT MUST_LIST
# prints one line per violation, then a "# checked" summary line.
check_state() {
	# the events before the storm first; the actors' keys are disjoint
	cat "$W/ev.$cyc.pre" "$W/ev.$cyc.a" "$W/ev.$cyc.b" "$W/ev.$cyc.churn" \
		"$W/ev.$cyc.pin" | awk -v relaxed="$4" -v out="$5" -v must="$6" '
	function addpin(p, t,   d, s) {
		d = p ~ /dram/ || t == "dram"
		s = p ~ /ssd/ || t == "ssd"
		return d && s ? "dram,ssd" : d ? "dram" : s ? "ssd" : "-"
	}
	function apply(o, st,   a) {
		split(st, a, ":")
		if (o == "rm") return "0:-"
		if (o == "add") return "1:-"
		if (o == "pin ssd") return "1:" addpin(a[2], "ssd")
		if (o == "pin dram")
			return a[1] == 1 ? "1:" addpin(a[2], "dram") : "0:-"
		if (o == "unpin") return a[1] ":-"
		return "?"
	}
	function join(set, x) {
		if (index(" " set " ", " " x " ")) return set
		return set == "" ? x : set " " x
	}
	function apply_set(o, set,   n, a, i, r) {
		n = split(set, a, " ")
		r = ""
		for (i = 1; i <= n; i++) r = join(r, apply(o, a[i]))
		return r
	}
	FILENAME == "-" {
		k = $NF
		if ($1 == "ack") { S[k] = "1:-"; next }
		if ($1 == "new") { S[k] = join(join(S[k], "0:-"), "1:-"); next }
		o = $2 (NF == 4 ? " " $3 : "")
		if (!(k in S)) S[k] = "0:-"
		# An operation may have happened from its try on: the set
		# widens at once, and narrows again if it returned 0. One that
		# failed (the kill) leaves the set wide for good.
		if ($1 == "try") {
			T[k] = o
			B[k] = S[k]
			S[k] = S[k] " " apply_set(o, S[k])
		} else if ($1 == "ok") {
			S[k] = apply_set(o, T[k] == o ? B[k] : S[k])
			delete T[k]
		}
		next
	}
	FILENAME == ARGV[1] { S[$1] = $2; next }
	FILENAME == ARGV[2] { obs[$1] = $2; next }
	FILENAME == ARGV[3] { ev[$1] = 1; next }
	END {
		bad = 0; n = 0
		for (k in obs) if (!(k in S)) S[k] = "new"
		for (k in S) {
			n++
			o = (k in obs) ? "1:" obs[k] : "0:-"
			print k, o > out
			if (S[k] == "new") continue
			# acknowledged durable: must be served (unless evicted)
			if (S[k] !~ /0:/ && !(relaxed && o == "0:-")) print k > must
			if (index(" " S[k] " ", " " o " ")) continue
			if (relaxed && o == "0:-" && (k in ev)) continue
			printf "%s: found %s, allowed %s\n", k, o, S[k]
			bad++
		}
		printf "# checked %d keys, %d violations\n", n, bad
		exit bad > 0
	}' "$1" "$2" "$3" -
}

# observe FILE: "KEY PINS" for every stored block; prints the sum of their
# extents (stored bytes rounded up to 4 KiB).
observe() {
	ls "$MNT/$NS" | grep '\.kv$' >"$W/ls" || true
	[ -s "$W/ls" ] || { : >"$1"; echo 0; return; }
	(cd "$MNT/$NS" && getfattr -d -m '^user\.kvfs\.(pin|stored_bytes)$' \
		$(cat "$W/ls")) 2>>"$W/getfattr.err" | awk -v out="$1" '
		function flush() { if (k != "") print k, pin > out }
		/^# file: / { flush(); k = $3; sub(/\.kv$/, "", k); pin = "-" }
		/^user\.kvfs\.pin=/ {
			pin = $0; sub(/^[^"]*"/, "", pin); sub(/"$/, "", pin)
		}
		/^user\.kvfs\.stored_bytes=/ {
			v = $0; gsub(/[^0-9]/, "", v)
			sum += int((v + 4095) / 4096) * 4096
		}
		END { flush(); printf "%d\n", sum }'
}

# Log lines of the daemon from line $1 on.
log_from() { tail -n +"$1" "$STORE/kvfs.log"; }
log_mark() { echo $(($(wc -l <"$STORE/kvfs.log") + 1)); }

# After a remount: everything the contract says, for cycle $cyc.
verify_remount() {
	local relaxed=$1 from=$2 storm_from=$3 n rec used sum bad
	# From the cycle's start: with the SSD full, the writes before the
	# storm evict too.
	log_from "${cycle_from:-$storm_from}" |
		sed -n 's/.*evicting block \([0-9a-f]*\)\.kv from the SSD tier.*/\1/p' \
		>"$W/evicted.$cyc"
	sum=$(observe "$W/obs.$cyc")
	used=$(kvfs_stat tier.ssd.used_bytes)
	n=$(wc -l <"$W/obs.$cyc")
	rec=$(log_from "$from" | sed -n 's/.*recovered \([0-9]*\) blocks from the metadata (0 skipped, 0 damaged records).*/\1/p')
	t_check "cycle $cyc: recovery served all $n records, none skipped or damaged" \
		test "${rec:-none}" = "$n"
	t_check "cycle $cyc: the free map agrees with the records, nothing leaked or shared" \
		sh -c "! tail -n +$from '$STORE/kvfs.log' | grep -q 'free map disagrees\|extent: \|meta: free_\|inconsistent\|duplicated'"
	t_check "cycle $cyc: SSD used bytes ($used) are the stored blocks' extents ($sum)" \
		test "$used" -eq "$sum"
	t_check "cycle $cyc: the SSD tier and the index hold the $n blocks" \
		test "$(kvfs_stat tier.ssd.blocks)" -eq "$n" -a "$(kvfs_stat cache.blocks)" -eq "$n"
	: >"$W/must.$cyc"
	: >"$W/state.next"
	bad=$(check_state "$W/state" "$W/obs.$cyc" "$W/evicted.$cyc" "$relaxed" \
		"$W/state.next" "$W/must.$cyc")
	if [ $? -eq 0 ]; then
		t_ok "cycle $cyc: every acknowledged write, unlink and pin holds ($(tail -n 1 <<<"$bad" | cut -c3-))"
	else
		t_fail "cycle $cyc: acknowledged operations lost"
	fi
	grep -v '^# checked' <<<"$bad" | head -n 20 | sed 's/^\([^#]\)/#   \1/'
	mv "$W/state.next" "$W/state"
	t_check "cycle $cyc: every block acknowledged durable verifies ($(wc -l <"$W/must.$cyc"))" \
		gen verify "$MNT/$NS" "${GEOM[@]}" --log "$W/must.$cyc" --quiet
	t_check "cycle $cyc: every block present verifies, none torn ($n)" \
		gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
	t_check "cycle $cyc: no checksum errors" test "$(kvfs_stat cache.checksum_errors)" -eq 0
	t_check "cycle $cyc: the daemon logged no error and loaded every DRAM pin" \
		sh -c "! tail -n +$storm_from '$STORE/kvfs.log' | grep 'kvfs err: \|DRAM pin kept but not loaded\|pinned in DRAM could not\|nothing evictable'"
}

# reap PID: waits for the killed daemon to be gone, and fails if it is
# not within 30 s. It once hung, about 1 kill in 4 to 8: a thread that
# was invalidating a name after an SSD eviction waited in the kernel,
# unkillably, for the directory's lock, held by a client waiting for the
# dead daemon. The daemon now invalidates no names (fs/kvfs_main.c), so
# no kill may hang; should one, the test says which kernel function the
# threads wait in, then aborts the fuse connection so that the remaining
# checks can run, and counts the cycle as failed.
reap() {
	local pid=$1 i t conn=/sys/fs/fuse/connections/$FUSE_CONN
	for ((i = 0; i < 1500; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.02
	done
	for t in /proc/"$pid"/task/*/wchan; do
		t_log "cycle $cyc: the killed daemon hangs: a thread waits in $(cat "$t" 2>/dev/null)"
	done
	if [ ! -e "$conn/abort" ] && [ "$(id -u)" = 0 ]; then
		mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null
	fi
	echo 1 >"$conn/abort" 2>/dev/null
	timeout 60 tail --pid="$pid" -f /dev/null
	return 1
}

# The fuse connection of the mount (its device minor): read from
# mountinfo, because stat would ask the daemon.
fuse_conn() {
	awk -v m="$MNT" '$5 == m { split($3, d, ":"); print d[2] }' \
		/proc/self/mountinfo | tail -n 1
}

# Errors the actors may meet: the dead mount, and under SSD pressure a
# block evicted under their feet.
storm_errors() {
	local ok='Transport endpoint is not connected\|Software caused connection abort'
	[ "$1" = 1 ] && ok="$ok\|No such file or directory"
	grep -v "$ok" "$ERRF" | grep .
}
no_storm_errors() { ! storm_errors "$1" >/dev/null; }

t_check "mount" kvfs_mount
cyc=0
ERRF=$W/err.pre
t_check "the churn set, durable" churn_write --fsync --log "$W/churn.keys"
sed 's/$/ 1:-/' "$W/churn.keys" >"$W/state"

# cycle: acknowledgements to wait for, writer-B prefixes, relaxed (SSD full)
# KVFS_CRASH_CYCLES=N runs N cycles instead of 4, the ones past the third
# like the last (the SSD full, so SSD evictions, whose deleted names the
# daemon once invalidated, run at every kill): repeated kills show that
# none hangs.
specs=("30 40 0" "60 40 0" "45 40 0")
for ((i = 3; i < ${KVFS_CRASH_CYCLES:-4}; i++)); do specs+=("40 0 1"); done
for spec in "${specs[@]}"; do
	set -- $spec
	cyc=$((cyc + 1))
	acks_at=$1 bpre=$2 relaxed=$3
	cycle_from=$(log_mark)
	ERRF=$W/err.$cyc
	: >"$ERRF"
	rm -f "$W/killed"
	: >"$W/ev.$cyc.a"
	: >"$W/ev.$cyc.b"
	: >"$W/ev.$cyc.churn"
	: >"$W/ev.$cyc.pin"
	# Before the storm, durably: this cycle's pin set, and the churn
	# blocks the last cycle left unlinked.
	wr $((100 + cyc)) 1 --fsync --log "$W/pin.$cyc.keys" 2>>"$ERRF"
	churn_write --fsync --log - 2>>"$ERRF" | sed 's/^/ack /' >"$W/ev.$cyc.pre"
	sed 's/^/ack /' "$W/pin.$cyc.keys" >>"$W/ev.$cyc.pre"
	if [ "$relaxed" = 1 ]; then
		# Fill the SSD: writer B writes 200 blocks more than it holds.
		free=$(($(kvfs_stat tier.ssd.capacity_bytes) -
			$(kvfs_stat tier.ssd.used_bytes)))
		bpre=$(((free / BLK + 200) / 8))
	fi
	d_ev0=$(kvfs_stat tier.dram.evictions)
	s_ev0=$(kvfs_stat tier.ssd.evictions)
	storm_from=$(log_mark)
	victim=$KVFS_PID
	FUSE_CONN=$(fuse_conn)
	actor_a &
	pa=$!
	actor_b "$bpre" &
	pb=$!
	actor_churn &
	pc=$!
	actor_pin &
	pp=$!

	# Kill once every actor is well under way, DRAM evicts (and in the
	# last cycle the SSD too), and write-back has blocks in flight.
	ready=0
	st=
	for ((i = 0; i < 3000; i++)); do
		st=$(cat "$MNT/.kvfs/stats" 2>/dev/null) || break
		d_ev=$(($(stat_of tier.dram.evictions) - d_ev0))
		s_ev=$(($(stat_of tier.ssd.evictions) - s_ev0))
		if [ "$(grep -c '^ack ' "$W/ev.$cyc.a")" -ge "$acks_at" ] &&
		   [ "$(grep -c '^new ' "$W/ev.$cyc.b")" -ge 40 ] &&
		   [ "$(grep -c '^ok rm ' "$W/ev.$cyc.churn")" -ge 4 ] &&
		   [ "$(grep -c '^ok ' "$W/ev.$cyc.pin")" -ge 12 ] &&
		   [ "$d_ev" -ge 20 ] &&
		   { [ "$relaxed" = 0 ] || [ "$s_ev" -ge 10 ]; } &&
		   [ "$(stat_of writeback.queued)" -ge 1 ]; then
			ready=1
			break
		fi
		sleep 0.01
	done
	b_live=$(kill -0 "$pb" 2>/dev/null && echo "still writing" || echo done)
	kill -9 "$victim"
	touch "$W/killed"
	t_check "cycle $cyc: the storm reached its kill point (DRAM evictions $d_ev, SSD evictions $s_ev, write-back queued $(stat_of writeback.queued))" \
		test "$ready" = 1
	if [ "$relaxed" = 0 ]; then
		t_check "cycle $cyc: no SSD eviction yet, so every acknowledged block must survive" \
			test "$s_ev" -eq 0
	fi
	t_check "cycle $cyc: the killed daemon exits, no client hangs" reap "$victim"
	if [ -d "/proc/$victim" ]; then
		# the stuck clients would hang every step from here on
		t_fail "cycle $cyc: the hung daemon cannot be aborted"
		t_done
		exit
	fi
	t_check "cycle $cyc: the daemon is gone" sh -c "! kill -0 $victim 2>/dev/null"
	for p in $pa $pb $pc $pp; do
		timeout 60 tail --pid="$p" -f /dev/null || kill "$p"
		wait "$p"
	done
	t_check "cycle $cyc: the actors met no error but the kill's ($(grep -c . "$ERRF") lines)" \
		no_storm_errors "$relaxed"
	storm_errors "$relaxed" | head -n 5 | sed 's/^/#   /'
	t_log "cycle $cyc: $(grep -c '^ack ' "$W/ev.$cyc.a") fsyncs, $(grep -c '^new ' "$W/ev.$cyc.b") commits (writer B $b_live at the kill)," \
		"$(cat "$W"/ev.$cyc.* | grep -c '^ok rm ') unlinks, $(grep -c '^ok add ' "$W/ev.$cyc.churn") re-creates," \
		"$(cat "$W"/ev.$cyc.* | grep -c '^ok \(pin\|unpin\)') pin changes acknowledged"
	KVFS_PID=
	kvfs_unmount
	from=$(log_mark)
	t_check "cycle $cyc: remount after kill -9" kvfs_mount
	verify_remount "$relaxed" "$from" "$storm_from"
done

# A clean unmount and mount after the last crash changes nothing.
cyc=final
for a in pre a b churn pin; do : >"$W/ev.final.$a"; done
cycle_from=
t_check "clean unmount" kvfs_unmount
from=$(log_mark)
t_check "and mount" kvfs_mount
verify_remount 0 "$from" "$from"
t_done
