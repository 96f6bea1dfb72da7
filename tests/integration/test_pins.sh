#!/usr/bin/env bash
# DRAM pins across a restart whose DRAM tier is too small for them: the pins
# are kept, shown, explained in the log, and honoured once there is room.
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=$(dirname "$BIN")/lib/libkvfs.so

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount" kvfs_mount
t_check "write" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 4 --shared 1 --quiet
ls "$MNT/$NS" | sort >"$T_DIR/all"
sz=$(stat -c %s "$MNT/$NS/$(head -n1 "$T_DIR/all")")
t_log "block size $sz, $(wc -l <"$T_DIR/all") blocks"
head -n 6 "$T_DIR/all" >"$T_DIR/pinned"
while read -r n; do setfattr -n user.kvfs.pin -v dram "$MNT/$NS/$n" || t_fail "pin $n"; done <"$T_DIR/pinned"
t_check "6 dram pins" test "$(kvfs_stat cache.dram_pins)" = 6
t_check "unmount" kvfs_unmount
sed -i 's/^capacity = 16M$/capacity = 160K/' "$STORE/kvfs.conf"
t_check "remount with a small DRAM tier" kvfs_mount
t_log "$(kvfs_stat tier.dram.blocks) resident, $(kvfs_stat cache.dram_pins_waiting) waiting"
t_check "some pins wait" test "$(kvfs_stat cache.dram_pins_waiting)" -gt 0
t_check "every pin visible" sh -c "while read -r n; do test \"\$(getfattr --absolute-names --only-values -n user.kvfs.pin '$MNT/$NS/'\$n)\" = dram || exit 1; done <'$T_DIR/pinned'"
t_check "log says why" grep -q "DRAM pin kept but not loaded: the DRAM tier is full of pinned blocks" "$STORE/kvfs.log"
grep "pin" "$STORE/kvfs.log" | tail -n 3 | sed 's/^/# log: /'
w=
while read -r n; do
	if [ "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/$n")" = ssd ]; then w=$n; break; fi
done <"$T_DIR/pinned"
t_check "found a waiting block" test -n "$w"
t_check "ssd pin on it (a record update)" setfattr -n user.kvfs.pin -v ssd "$MNT/$NS/$w"
t_check "both pins" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$MNT/$NS/$w")" = dram,ssd
t_errno "dram pin again fails, ENOSPC" "No space" setfattr -n user.kvfs.pin -v dram "$MNT/$NS/$w"
t_check "still pinned after the failed retry" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$MNT/$NS/$w")" = dram,ssd
t_check "reads intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "unmount" kvfs_unmount
sed -i 's/^capacity = 160K$/capacity = 16M/' "$STORE/kvfs.conf"
t_check "remount with room" kvfs_mount
t_check "no pin waits" test "$(kvfs_stat cache.dram_pins_waiting)" = 0
t_check "waiting block resident" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$MNT/$NS/$w")" = dram,ssd
t_check "its pins" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$MNT/$NS/$w")" = dram,ssd
t_check "unmount" kvfs_unmount

# A pin racing an unlink: exactly one of them wins. Before, a pin waiting
# for the metadata lock wrote the record of a block the unlink had just
# deleted, and the block came back after a remount on a freed extent.
t_check "python3 and libkvfs.so" sh -c "command -v python3 >/dev/null && test -f '$LIB'"
PY_ENV=()
asan=$(ldd "$LIB" 2>/dev/null | awk '/libasan/ { print $3 }')
if [ -n "$asan" ]; then
	PY_ENV=(LD_PRELOAD="$asan"
		ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
fi
t_check "mount for the race" kvfs_mount
t_check "blocks to race on" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 12 --blocks 4 --shared 0 --fsync --quiet
t_check "pin and unlink race, never both succeed" \
	env "${PY_ENV[@]}" PYTHONDONTWRITEBYTECODE=1 KVFS_LIB="$LIB" PYTHONPATH="$ROOT/client" \
	python3 - "$MNT" "$NS" "$T_DIR/removed" <<'EOF_PY'
# Per block: a thread pins it in ssd through .kvfs/ctl while this one
# unlinks it, released together; a third keeps the metadata lock busy
# with pins of another block. Exit 1 if both the pin and the unlink of a
# block succeeded.
import errno, os, sys, threading
import kvfs

kvfs.set_log_level(0)
mnt, ns, out = sys.argv[1:4]
d = os.path.join(mnt, ns)
keys = sorted(n[:-3] for n in os.listdir(d) if n.endswith(".kv"))
busy_key, keys = keys[0], keys[1:]
cl = kvfs.Client(mnt)
stop = threading.Event()


def busy():
    while not stop.is_set():
        try:
            cl.pin(ns, [busy_key], kvfs.TIER_SSD)
            cl.unpin(ns, [busy_key])
        except OSError:
            pass


bt = threading.Thread(target=busy)
bt.start()
removed, both = [], 0
for k in keys:
    res = {}
    go = threading.Barrier(2)

    def pinner():
        go.wait()
        try:
            cl.pin(ns, [k], kvfs.TIER_SSD)
            res["pin"] = True
        except OSError:
            res["pin"] = False

    t = threading.Thread(target=pinner)
    t.start()
    go.wait()
    try:
        os.unlink(os.path.join(d, k + ".kv"))
        rm = True
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
        rm = False
    t.join()
    if rm:
        removed.append(k)
    both += rm and res["pin"]
stop.set()
bt.join()
open(out, "w").write("".join(k + "\n" for k in removed))
print("# %d blocks: %d unlinked, %d both pinned and unlinked"
      % (len(keys), len(removed), both))
sys.exit(1 if both else 0)
EOF_PY
t_check "unmount after the race" kvfs_unmount
t_check "remount after the race" kvfs_mount
back=0
while read -r k; do [ -e "$MNT/$NS/$k.kv" ] && back=$((back + 1)); done <"$T_DIR/removed"
t_check "no acknowledged unlink came back ($back of $(wc -l <"$T_DIR/removed"))" test "$back" -eq 0
t_check "the free map agrees with the records" sh -c "! grep -q 'free map disagrees' '$STORE/kvfs.log'"
t_check "what remains verifies" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_done
