#!/usr/bin/env bash
# Unmount and remount: every block comes back, bytes and attributes.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount" kvfs_mount
t_check "write" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 5 --blocks 4 --shared 1 --tail 3 --quiet
ls "$MNT/$NS" | sort >"$T_DIR/before"
f="$MNT/$NS/$(head -n1 "$T_DIR/before")"
t_check "pin one in ssd" setfattr -n user.kvfs.pin -v ssd "$f"
g="$MNT/$NS/$(sed -n 2p "$T_DIR/before")"
t_check "pin another in dram" setfattr -n user.kvfs.pin -v dram "$g"
cat "$f" "$f" >/dev/null
hits=$(getfattr --absolute-names --only-values -n user.kvfs.hits "$f")
t_check "unmount" kvfs_unmount
t_check "mount point empty after unmount" test -z "$(ls -A "$MNT")"
t_check "remount" kvfs_mount
ls "$MNT/$NS" | sort >"$T_DIR/after"
t_check "same blocks listed after remount ($(wc -l <"$T_DIR/after"))" cmp "$T_DIR/before" "$T_DIR/after"
t_check "blocks come back on the SSD tier" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$f")" = ssd
t_check "every block reads back intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "a DRAM pin is reloaded into DRAM at mount" test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$g")" = dram,ssd
t_check "DRAM pin survives remount" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$g")" = dram
t_check "pin survives remount" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$f")" = ssd
t_check "hit count survives remount (>= $hits)" test "$(getfattr --absolute-names --only-values -n user.kvfs.hits "$f")" -ge "$hits"
t_check "ssd reads counted" test "$(kvfs_stat tier.ssd.hits)" -gt 0
mkdir -p "$T_DIR/mnt2"
t_errno "a second daemon on a store in use is refused" "busy\|Busy" "$BIN/kvfs" "$STORE" "$T_DIR/mnt2"
t_check "the first mount is unharmed" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "unmount again" kvfs_unmount

# [tier.dram] prefault = yes: the whole DRAM tier is resident from the
# start, and blocks loaded from the SSD into it read back whole.
sed -i 's/^capacity = 16M$/&\nprefault = yes/; s/^\[daemon\]$/&\nlog_level = info/' \
	"$STORE/kvfs.conf"
# A namespace of 2 MiB blocks (2,105,344-byte files) too: the mount reads
# ahead a whole one, 3 MiB, where it read ahead 1 MiB before.
printf '\n[namespace big]\nlayers = 32\nkv_heads = 8\nhead_dim = 128\ndtype = bf16\nblock_tokens = 16\nchunk_tokens = 16\n' \
	>>"$STORE/kvfs.conf"
t_check "mount with prefault = yes" kvfs_mount
bdi=$(awk -v m="$(realpath "$MNT")" '$5 == m { print $3 }' /proc/self/mountinfo)
t_check "the mount reads ahead a whole block of the largest namespace" \
	test "$(cat "/sys/class/bdi/$bdi/read_ahead_kb")" = 3072
t_check "the start says the DRAM tier was faulted in" \
	grep -q "dram: prefaulted the 16.0M arena" "$STORE/kvfs.log"
rss=$(awk '$1 == "RssAnon:" { print $2 }' "/proc/$KVFS_PID/status")
t_check "the daemon holds the 16 MiB tier from the start (RssAnon ${rss} kB)" \
	test "${rss:-0}" -ge 16384
t_check "a block is on the SSD only" \
	test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$f")" = ssd
t_check "every block reads back intact from the prefaulted tier" \
	gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "the SSD block was loaded into DRAM" \
	test "$(getfattr --absolute-names --only-values -n user.kvfs.tier "$f")" = dram,ssd
t_check "unmount after prefault" kvfs_unmount
sed -i 's/^capacity = 16M$/capacity = 16T/' "$STORE/kvfs.conf"
t_errno "a tier larger than the memory available is refused at start" \
	"Cannot allocate memory" "$BIN/kvfs" "$STORE" "$MNT"
t_check "the log says how much memory there is" \
	grep -q "dram: cannot prefault a 16.0T arena: only .* of memory is available" \
	"$STORE/kvfs.log"
t_check "the log names the key to change" \
	grep -q "prefault = yes: the DRAM tier cannot be faulted in" "$STORE/kvfs.log"
t_check "not mounted after the refusal" sh -c "! mountpoint -q '$MNT'"
t_check "the store still mounts without prefault" sh -c \
	"sed -i 's/^capacity = 16T\$/capacity = 16M/; /^prefault/d' '$STORE/kvfs.conf'"
t_check "mount without prefault" kvfs_mount
t_check "every block still reads back" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "unmount at the end" kvfs_unmount

# A store that mkfs did not make, and a bad config, fail at start.
mkdir -p "$T_DIR/notastore"
t_errno "not a store" "mkfs.kvfs\|not a kvfs store\|No such file" "$BIN/kvfs" "$T_DIR/notastore" "$MNT"
printf '[tier.dram]\ncapacity = lots\n' >"$T_DIR/bad.conf"
t_errno "bad config names the problem" "bad.conf" "$BIN/kvfs" -c "$T_DIR/bad.conf" "$STORE" "$MNT"
t_check "not mounted after failures" sh -c "! mountpoint -q '$MNT'"
# Changing a stored namespace's geometry is refused.
sed -i 's/^layers = 4/layers = 5/' "$STORE/kvfs.conf"
t_errno "changed geometry refused" "layers\|Invalid argument" "$BIN/kvfs" -f "$STORE" "$MNT"
t_done
