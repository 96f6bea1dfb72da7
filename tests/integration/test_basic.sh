#!/usr/bin/env bash
# Basic manners: cp in and out, read and mmap, ls, stat, df, xattrs, pins,
# immutability, unlink, and the stats file.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount returns once ready" kvfs_mount
t_check "namespace directory listed" test -d "$MNT/$NS"
t_check ".kvfs/stats exists" test -r "$MNT/.kvfs/stats"

# Workload: 4 chains of 6 blocks sharing 2, ending with a partial block.
t_check "writer stores chained blocks" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 4 --blocks 6 --shared 2 --tail 5 --quiet
n=$(ls "$MNT/$NS" | wc -l)
t_check "ls shows every block (2 shared + 4x4 own, the last partial = 18, got $n)" test "$n" -eq 18
t_check "read() returns the bytes written" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "mmap() returns the bytes written" gen verify "$MNT/$NS" "${GEOM[@]}" --mmap --quiet

# cp in and out, compared byte for byte.
key=$(gen make "$T_DIR/one.kv" "${GEOM[@]}" --parent root --start-pos 0 --tokens "$(seq -s, 1000 1015)")
t_check "cp into the namespace" cp "$T_DIR/one.kv" "$MNT/$NS/$key.kv"
t_check "cp out again is identical" sh -c "cp '$MNT/$NS/$key.kv' '$T_DIR/back.kv' && cmp '$T_DIR/one.kv' '$T_DIR/back.kv'"
t_check "cmp through the mount" cmp "$T_DIR/one.kv" "$MNT/$NS/$key.kv"

# stat: immutable regular file of the right size.
size=$(stat -c %s "$T_DIR/one.kv")
t_check "stat size" test "$(stat -c %s "$MNT/$NS/$key.kv")" = "$size"
t_check "stat mode is read-only" test "$(stat -c %a "$MNT/$NS/$key.kv")" = 444
t_check "stat type regular" test "$(stat -c %F "$MNT/$NS/$key.kv")" = "regular file"

# df reports the SSD tier.
total=$(df -B1 --output=size "$MNT" | tail -n1 | tr -d ' ')
t_check "df size is the SSD tier capacity ($total)" test "$total" -eq $((64 * 1024 * 1024 - 4096))

# xattrs
f="$MNT/$NS/$key.kv"
t_check "user.kvfs.tokens" test "$(getfattr --absolute-names --only-values -n user.kvfs.tokens "$f")" = 16
root=$(getfattr --absolute-names --only-values -n user.kvfs.root "$MNT/$NS")
t_check "user.kvfs.root is 32 hex" grep -Eq '^[0-9a-f]{32}$' <<<"$root"
t_check "user.kvfs.parent of a first block is the root" test "$(getfattr --absolute-names --only-values -n user.kvfs.parent "$f")" = "$root"
t_check "user.kvfs.tier lists dram" grep -q dram <<<"$(getfattr --absolute-names --only-values -n user.kvfs.tier "$f")"
h1=$(getfattr --absolute-names --only-values -n user.kvfs.hits "$f")
cat "$f" >/dev/null
h2=$(getfattr --absolute-names --only-values -n user.kvfs.hits "$f")
t_check "user.kvfs.hits counts opens ($h1 -> $h2)" test "$h2" -gt "$h1"
t_check "user.kvfs.last_access is a time" grep -Eq '^[0-9]+\.[0-9]{9}$' <<<"$(getfattr --absolute-names --only-values -n user.kvfs.last_access "$f")"
t_check "getfattr --absolute-names -d lists the kvfs attributes" grep -q 'user.kvfs.tier=' <<<"$(getfattr --absolute-names -d "$f" 2>/dev/null)"
t_errno "unknown xattr gives ENODATA" "No such attribute" getfattr --absolute-names -n user.kvfs.nope "$f"
t_errno "read-only xattr refuses writes" "Operation not permitted" setfattr -n user.kvfs.tokens -v 3 "$f"
t_errno "bad pin tier refused" "Invalid argument" setfattr -n user.kvfs.pin -v floppy "$f"

# pin / unpin
t_check "pin in dram" setfattr -n user.kvfs.pin -v dram "$f"
t_check "pin reads back" test "$(getfattr --absolute-names --only-values -n user.kvfs.pin "$f")" = dram
t_errno "unlink of a pinned block is EBUSY" "busy" rm -f "$f"
t_check "unpin" setfattr -x user.kvfs.pin "$f"
t_errno "pin gone after unpin" "No such attribute" getfattr --absolute-names -n user.kvfs.pin "$f"

# immutability
t_errno "open for write is EPERM" "Operation not permitted" sh -c "echo x >> '$f'"
t_errno "truncate is EPERM" "Operation not permitted" truncate -s 0 "$f"
t_errno "rename is EPERM" "Operation not permitted" mv "$f" "$MNT/$NS/00000000000000000000000000000000.kv"
t_errno "link is EPERM" "Operation not permitted" ln "$f" "$MNT/$NS/11111111111111111111111111111111.kv"
t_errno "mkdir is EPERM" "Operation not permitted" mkdir "$MNT/newns"
t_errno "cp over an existing block fails" "exists\|not permitted" cp "$T_DIR/one.kv" "$f"
# Another name is a temporary (test_manners.sh): renamed to its key it
# commits; never listed as a block.
t_check "a non-block name holds a temporary" cp "$T_DIR/one.kv" "$MNT/$NS/notes.txt"
t_check "a temporary is not listed" sh -c "! ls -a '$MNT/$NS' | grep -q notes.txt"
t_check "a temporary can be removed" rm "$MNT/$NS/notes.txt"

# unlink
t_check "unlink" rm "$f"
t_check "gone from ls" sh -c "! ls '$MNT/$NS' | grep -q $key"
t_errno "gone for stat" "No such file" stat "$f"
t_check "stats file has every tier key" sh -c "for k in capacity_bytes used_bytes blocks hits misses evictions bytes_read bytes_written; do grep -q \"^tier.dram.\$k \" '$MNT/.kvfs/stats' && grep -q \"^tier.ssd.\$k \" '$MNT/.kvfs/stats' || exit 1; done"
t_check "kvfsctl status" sh -c "'$BIN/kvfsctl' status '$MNT' | grep -q '^dram'"
t_check "clean unmount" kvfs_unmount
t_done
