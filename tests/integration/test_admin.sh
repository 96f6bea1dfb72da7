#!/usr/bin/env bash
# kvfsctl's admin verbs on a real mount (top, pin/unpin/evict, ls, df,
# scrub) and fsck on a clean, a corrupted and a repaired store, and on
# one with orphan chunk CRC tables and scores.
. "$(dirname "$0")/lib.sh"

CTL=$BIN/kvfsctl
EDIT=$(dirname "$BIN")/itests/store_edit
xa() { getfattr --absolute-names --only-values -n "user.kvfs.$1" "$2" 2>/dev/null; }

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount" kvfs_mount
t_check "write" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 3 --blocks 3 --shared 1 --quiet
# A chain of two blocks with known tokens (for --tokens and --prefix).
mkdir -p "$T_DIR/c"
T1=$(seq -s, 1 16)
T2=$(seq -s, 17 32)
k1=$(gen make "$T_DIR/c" "${GEOM[@]}" --parent root --start-pos 0 --tokens "$T1")
k2=$(gen make "$T_DIR/c" "${GEOM[@]}" --parent "$k1" --start-pos 16 --tokens "$T2")
t_check "chain stored" cp "$T_DIR/c/$k1.kv" "$T_DIR/c/$k2.kv" "$MNT/$NS/"
# every block durable before we look at tiers
for f in "$MNT/$NS"/*.kv; do python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)" "$f"; done
cat "$MNT/$NS"/*.kv >/dev/null

# top, ls, df, status
out=$("$CTL" top "$MNT" -n 1 -d 0.2)
t_check "top -n 1 prints tiers and the namespace" bash -c 'grep -q "^dram" <<<"$1" && grep -q "^$2 " <<<"$1"' _ "$out" "$NS"
out=$("$CTL" top "$MNT" -n 2 -d 0.1 | grep -c '^kvfs top')
t_check "top -n 2 prints two frames" test "$out" = 2
t_check "ls lists the namespace" sh -c "'$CTL' ls '$MNT' | grep -q '^$NS '"
n=$(ls "$MNT/$NS" | wc -l)
t_check "ls NS lists every block with its tier" test "$("$CTL" ls "$MNT" "$NS" | grep -c 'ssd')" = "$n"
t_check "df shows the ssd tier" sh -c "'$CTL' df '$MNT' | grep -q '^ssd '"
t_check "status still works" sh -c "'$CTL' status '$MNT' | grep -q '^dram'"
t_check "stats has the scrub counters" sh -c "'$CTL' stats '$MNT' | grep -q '^scrub.passes '"

# pin / unpin / evict: by key, prefix, tokens and namespace
f1=$MNT/$NS/$k1.kv f2=$MNT/$NS/$k2.kv
t_check "pin a key" "$CTL" pin "$MNT" "$NS" "$k2"
t_check "its pin shows" test "$(xa pin "$f2")" = dram
t_check "its parent is not pinned" test -z "$(xa pin "$f1")"
t_check "unpin a key" "$CTL" unpin "$MNT" "$NS" "$k2"
t_check "its pin is gone" test -z "$(xa pin "$f2")"
t_check "pin a prefix" "$CTL" pin "$MNT" "$NS" --prefix "$k2" --tier ssd
t_check "the key and its parent are pinned" test "$(xa pin "$f1"),$(xa pin "$f2")" = ssd,ssd
t_errno "a pinned block cannot be removed" "busy\|Busy" rm "$f1"
t_check "unpin by tokens" "$CTL" unpin "$MNT" "$NS" --tokens "$T1,$T2"
t_check "both unpinned" test -z "$(xa pin "$f1")$(xa pin "$f2")"
t_check "pin a whole namespace" "$CTL" pin "$MNT" "$NS" --all
t_check "every block pinned" test "$(for f in "$MNT/$NS"/*.kv; do xa pin "$f"; echo; done | grep -c dram)" = "$n"
t_check "unpin the namespace" "$CTL" unpin "$MNT" "$NS" --all
cat "$f1" >/dev/null
t_check "evict a key from DRAM" "$CTL" evict "$MNT" "$NS" "$k1"
t_check "it is on the SSD only" test "$(xa tier "$f1")" = ssd
t_check "evict the namespace from DRAM" "$CTL" evict "$MNT" "$NS" --all
t_check "no block left in DRAM" test -z "$(for f in "$MNT/$NS"/*.kv; do xa tier "$f"; echo; done | grep dram)"
t_check "evict --tier all deletes a prefix" "$CTL" evict "$MNT" "$NS" --prefix "$k2" --tier all
t_check "both are gone" test ! -e "$f1" -a ! -e "$f2"
t_check "the rest still verifies" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet

# scrub: damage one block's extent under the mount, ask for a pass
keys=$(ls "$MNT/$NS" | sed 's/\.kv$//')
victim=$(head -n1 <<<"$keys")
t_check "unmount" kvfs_unmount
read -r voff vlen vsize < <("$EDIT" extent "$STORE" "$victim")
t_check "remount" kvfs_mount
out=$("$CTL" fsck "$STORE" 2>&1); rc=$?
t_check "fsck refuses a mounted store (busy, exit 8)" bash -c '[ "$1" = 8 ] && grep -qi busy <<<"$2"' _ "$rc" "$out"
printf '\xff' | dd of="$STORE/data.kvd" bs=1 seek=$((voff + vsize - 1)) conv=notrunc status=none
before=$(kvfs_stat scrub.bad)
t_check "kvfsctl scrub --wait runs a pass" "$CTL" scrub "$MNT" --wait 20
t_check "the damaged block is counted" test "$(kvfs_stat scrub.bad)" = $((before + 1))
t_check "the damaged block is dropped" test ! -e "$MNT/$NS/$victim.kv"
t_check "the scrub checked the others" test "$(kvfs_stat scrub.blocks)" -ge "$(wc -l <<<"$keys")"
t_check "the others are untouched" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "the log names it" grep -q "$victim.kv fails the scrub" "$STORE/kvfs.log"
t_check "unmount" kvfs_unmount

# fsck: clean, corrupted, repaired
out=$("$CTL" fsck "$STORE"); rc=$?
t_check "fsck of a clean store exits 0 ($out)" test "$rc" = 0
t_check "remount to copy" kvfs_mount
keys=$(ls "$MNT/$NS" | sed "s/\.kv$//")
mkdir -p "$T_DIR/copy"
cp "$MNT/$NS"/*.kv "$T_DIR/copy/"
kvfs_unmount
kflip=$(sed -n 1p <<<"$keys")
kgone=$(sed -n 2p <<<"$keys")
read -r o1 l1 s1 < <("$EDIT" extent "$STORE" "$kflip")
read -r o2 l2 s2 < <("$EDIT" extent "$STORE" "$kgone")
printf '\x5a' | dd of="$STORE/data.kvd" bs=1 seek=$((o1 + 8192 + 7)) conv=notrunc status=none
dd if=/dev/zero of="$STORE/data.kvd" bs=4096 seek=$((o2 / 4096)) count=$((l2 / 4096)) conv=notrunc status=none
t_check "leave an orphan allocation" "$EDIT" orphan "$STORE"
out=$("$CTL" fsck "$STORE" 2>&1); rc=$?
t_check "fsck of a damaged store exits 4" test "$rc" = 4
t_check "it names the flipped block" grep -q "block $kflip .*payload checksum" <<<"$out"
t_check "it names the block without data" grep -q "block $kgone .*fails verification" <<<"$out"
t_check "it reports the orphan" grep -q "^orphan: " <<<"$out"
out=$("$CTL" fsck --repair "$STORE" 2>&1); rc=$?
t_check "fsck --repair exits 1" test "$rc" = 1
out=$("$CTL" fsck "$STORE" 2>&1); rc=$?
t_check "a second fsck exits 0 ($(tail -n1 <<<"$out"))" test "$rc" = 0
# Side records whose block record does not exist (a crash between
# transactions): a chunk CRC table with scores, and scores alone.
ko1=00112233445566778899aabbccddeeff
ko2=ffeeddccbbaa99887766554433221100
read -r nccrc nscore < <("$EDIT" sides "$STORE")
t_check "the blocks kept have chunk CRC tables ($nccrc)" test "${nccrc:-0}" -gt 0
t_check "store_edit refuses a key that has a record" bash -c '! "$1" ccrc "$2" "$3" 2>/dev/null' _ "$EDIT" "$STORE" "$(sed -n 3p <<<"$keys")"
t_check "plant an orphan chunk CRC table" "$EDIT" ccrc "$STORE" "$ko1"
t_check "plant orphan scores beside it" "$EDIT" score "$STORE" "$ko1" 3
t_check "plant orphan scores alone" "$EDIT" score "$STORE" "$ko2" 2
out=$("$CTL" fsck "$STORE" 2>&1); rc=$?
t_check "fsck of a store with orphan side records exits 4" test "$rc" = 4
t_check "it names the orphan table" grep -qx "block $ko1: orphan chunk CRC table (no block record)" <<<"$out"
t_check "it names the orphan scores" grep -qx "block $ko1: orphan chunk scores, 3 entries (no block record)" <<<"$out"
t_check "and the scores alone" grep -qx "block $ko2: orphan chunk scores, 2 entries (no block record)" <<<"$out"
t_check "nothing else is reported" test "$(grep -c '^block \|^orphan: \|^free map: ' <<<"$out")" = 3
t_check "the summary counts them" grep -q " 1 orphan chunk CRC tables, 2 keys with orphan chunk scores (5 entries), .*; errors left$" <<<"$out"
out=$("$CTL" fsck --repair "$STORE" 2>&1); rc=$?
t_check "fsck --repair drops them, exit 1" test "$rc" = 1
t_check "each one dropped" test "$(grep -c "^block $ko1: .*: dropped$\|^block $ko2: .*: dropped$" <<<"$out")" = 3
out=$("$CTL" fsck "$STORE" 2>&1); rc=$?
t_check "a fsck after the repair exits 0 ($(tail -n1 <<<"$out"))" test "$rc" = 0
t_check "and finds no orphan side record" grep -q " 0 orphan chunk CRC tables, 0 keys with orphan chunk scores (0 entries), " <<<"$out"
t_check "the kept blocks' tables and scores are all still there" test "$("$EDIT" sides "$STORE")" = "$nccrc $nscore"
t_check "mount the repaired store" kvfs_mount
t_check "the bad blocks are gone" test ! -e "$MNT/$NS/$kflip.kv" -a ! -e "$MNT/$NS/$kgone.kv"
ok=1
for k in $keys; do
	[ "$k" = "$kflip" ] || [ "$k" = "$kgone" ] && continue
	cmp -s "$T_DIR/copy/$k.kv" "$MNT/$NS/$k.kv" || ok=0
done
t_check "every block that verified is there, byte for byte" test "$ok" = 1
t_check "and verifies" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "unmount" kvfs_unmount

# A configured interval runs passes on its own, at the rate given.
sed -i 's/^flush_ms = .*/&\nscrub_interval = 1s\nscrub_rate = 1M/' "$STORE/kvfs.conf"
t_check "mount with scrub_interval = 1s" kvfs_mount
for _ in $(seq 50); do [ "$(kvfs_stat scrub.passes)" -ge 2 ] && break; sleep 0.1; done
t_check "passes run on their own" test "$(kvfs_stat scrub.passes)" -ge 2
t_check "unmount" kvfs_unmount
printf '[daemon]\nscrub_interval = soon\n' >"$T_DIR/bad.conf"
t_errno "a bad scrub_interval is refused" "scrub_interval" "$BIN/kvfs" -c "$T_DIR/bad.conf" "$STORE" "$MNT"
t_done
