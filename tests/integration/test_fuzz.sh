#!/usr/bin/env bash
# Seeded fuzzing of a live mount (tests/integration/fuzz_client.c): garbage
# and boundary requests on .kvfs/ctl over both transports, xattrs on every
# kind of inode, mutated block files under odd names and write patterns,
# and namespace operations. The daemon must answer each with success or an
# errno, stay up, store exactly what it accepts, and lose nothing of the
# data seeded before, across a remount too.
#
# The seed is printed; KVFS_FUZZ_SEED=N replays a run, KVFS_FUZZ_SCALE=X
# scales the iterations (1 takes about 15 s on two cores, 30 s under ASan).
# A failure prints the line that replays its iteration alone.
. "$(dirname "$0")/lib.sh"

SEED=${KVFS_FUZZ_SEED:-1}
SCALE=${KVFS_FUZZ_SCALE:-1}
SHM_TAG=${T_DIR##*.}
t_log "fuzz seed $SEED (KVFS_FUZZ_SEED=$SEED replays it), scale $SCALE"

# A sanitizer report from the daemon, anywhere in its log.
no_sanitizer_report() {
	! grep -q 'ERROR: AddressSanitizer\|runtime error\|LeakSanitizer' "$STORE/kvfs.log"
}

# The daemon is running (not a zombie nobody reaped yet) and answers.
daemon_alive() {
	[ -r "/proc/$KVFS_PID/status" ] &&
		! grep -q '^State:[[:space:]]*[ZX]' "/proc/$KVFS_PID/status" &&
		test -r "$MNT/.kvfs/stats"
}

# The seeded blocks: all there, intact.
seeded_intact() {
	gen verify "$MNT/$NS" "${GEOM[@]}" --log "$T_DIR/seed.keys" --quiet >/dev/null
}

# Nothing else stored: the fuzzer removes every block it had accepted
# (after a daemon crash, those SAVE made before it can remain).
nothing_else() {
	gen verify "$MNT/$NS" "${GEOM[@]}" --quiet >/dev/null &&
		test "$(ls "$MNT/$NS" | wc -l)" -eq "$(wc -l <"$T_DIR/seed.keys")"
}

kvfs_mkfs 64M
kvfs_conf 16M
# A device tier, so that FETCH, FETCH_INTO, SAVE and FETCH_CHUNKS get past
# their first check.
cat >>"$STORE/kvfs.conf" <<EOC

[tier.gpu]
backend = shm
capacity = 1M
EOC
# allow_other: a second pass runs as another user (below).
t_check "mount" kvfs_mount -o allow_other
t_check "seed data" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 3 \
	--shared 1 --seed 7 --log "$T_DIR/seed.keys" --quiet

# Good blocks made by kvfs-gen, the fuzzer's templates: first blocks of
# several lengths, and children of a seeded block.
mkdir -p "$T_DIR/good"
first=$(head -n 1 "$T_DIR/seed.keys")
for n in 1 3 4 5 15 16; do
	gen make "$T_DIR/good" "${GEOM[@]}" --parent root --start-pos 0 \
		--tokens "$(seq -s, 3000 $((3000 + n - 1)))" >/dev/null
done
gen make "$T_DIR/good" "${GEOM[@]}" --parent "$first" --start-pos 16 \
	--tokens "$(seq -s, 4000 4015)" >/dev/null
gen make "$T_DIR/good" "${GEOM[@]}" --parent "$first" --start-pos 16 \
	--tokens "$(seq -s, 5000 5006)" >/dev/null
t_check "templates made" test "$(ls "$T_DIR/good" | wc -l)" -eq 8

# The backstop for a hang the client's watchdog cannot report.
KVFS_MNT=$MNT KVFS_NS=$NS KVFS_PID=$KVFS_PID KVFS_FUZZ_SEED=$SEED \
	KVFS_FUZZ_SCALE=$SCALE KVFS_FUZZ_SEEDKEYS=$T_DIR/seed.keys \
	KVFS_FUZZ_GOOD=$T_DIR/good KVFS_FUZZ_SUMMARY=$T_DIR/summary \
	KVFS_FUZZ_SHM_TAG=$SHM_TAG \
	t_cmocka fuzz timeout -s KILL 600 "$BIN/../itests/fuzz_client"
[ -f "$T_DIR/summary" ] && sed 's/^/# fuzz: /' "$T_DIR/summary"
# A client that was killed leaves its shm objects.
rm -f "/dev/shm/kvfs-fuzz-$SHM_TAG-peer" "/dev/shm/kvfs-fuzz-$SHM_TAG-sync"

t_check "the daemon survived" daemon_alive
t_check "the seeded data is intact" seeded_intact
t_check "nothing else is stored" nothing_else
t_check "no checksum errors" test "$(kvfs_stat cache.checksum_errors)" -eq 0
t_check "bad blocks were logged as rejected" grep -q "rejected" "$STORE/kvfs.log"
t_check "bad ctl requests were logged" grep -q "ctl: malformed request" "$STORE/kvfs.log"
t_check "no sanitizer report while fuzzing" no_sanitizer_report

# The same operations from a caller that is neither root nor the
# namespace's owner (the namespace is root's, 0755: it may read, not
# write). The client's own verdicts expect its writes to succeed, so they
# are not counted; what must hold is that this caller changed nothing.
FUZZ_USER=kvfsfz$$
if [ "$(id -u)" -eq 0 ] && command -v useradd >/dev/null && command -v runuser >/dev/null &&
	useradd -M -U -s /bin/sh "$FUZZ_USER" 2>/dev/null; then
	trap 'userdel "$FUZZ_USER" 2>/dev/null; getent group "$FUZZ_USER" >/dev/null && groupdel "$FUZZ_USER"; t_cleanup' EXIT
	chmod 0755 "$T_DIR"
	chmod -R a+rX "$T_DIR/good" "$T_DIR/seed.keys"
	UBIN=$(t_user_bin "$BIN/../itests/fuzz_client")
	runuser -u "$FUZZ_USER" -- env KVFS_MNT="$MNT" KVFS_NS="$NS" KVFS_PID="$KVFS_PID" \
		KVFS_FUZZ_SEED=$((SEED + 1)) KVFS_FUZZ_SCALE=0.3 \
		KVFS_FUZZ_SEEDKEYS="$T_DIR/seed.keys" KVFS_FUZZ_GOOD="$T_DIR/good" \
		KVFS_FUZZ_SHM_TAG="$SHM_TAG-u" \
		timeout -s KILL 600 "$UBIN/fuzz_client" >"$T_DIR/fuzz-user.out" 2>&1
	rm -f "/dev/shm/kvfs-fuzz-$SHM_TAG-u-peer" "/dev/shm/kvfs-fuzz-$SHM_TAG-u-sync"
	t_check "fuzzing as $FUZZ_USER: the daemon survived" daemon_alive
	t_check "fuzzing as $FUZZ_USER: the seeded data is intact" seeded_intact
	t_check "fuzzing as $FUZZ_USER: it stored nothing" nothing_else
	t_check "fuzzing as $FUZZ_USER: its writes were refused and logged" \
		grep -q "uid $(id -u "$FUZZ_USER") may not" "$STORE/kvfs.log"
	t_check "fuzzing as $FUZZ_USER: no sanitizer report" no_sanitizer_report
else
	t_ok "fuzzing as another user # SKIP needs root, useradd and runuser"
fi

t_check "unmount" kvfs_unmount
t_check "no sanitizer report at exit" no_sanitizer_report
t_check "remount" kvfs_mount
t_check "after the remount the seeded data is intact" seeded_intact
t_check "after the remount nothing else is stored" nothing_else
t_check "no checksum errors after the remount" \
	test "$(kvfs_stat cache.checksum_errors)" -eq 0
t_check "unmount again" kvfs_unmount
t_check "no sanitizer report at the end" no_sanitizer_report
t_done
