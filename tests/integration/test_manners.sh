#!/usr/bin/env bash
# The manners a filesystem of immutable files owes the everyday tools:
# tar -c/-x, rsync -a (with and without --inplace), cp -a and cp copy a
# namespace from one mount to another, exit 0 and copy every block.
# Metadata calls that change nothing succeed, temporaries (rsync's
# .NAME.XXXXXX) commit when renamed to their key, are dropped when
# unlinked or at restart, and directories show real times.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 32M
t_check "mount" kvfs_mount
t_check "writer stores chained blocks" \
	gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 3 --blocks 4 --shared 1 --tail 5 --quiet
n_src=$(ls "$MNT/$NS" | wc -l)
t_log "source namespace holds $n_src blocks"

# A second store and mount, the copies' target.
STORE2=$T_DIR/store2
MNT2=$T_DIR/mnt2
KVFS2_PID=
mkdir -p "$MNT2"
"$BIN/mkfs.kvfs" --ssd-size 64M "$STORE2" >/dev/null
cp "$STORE/kvfs.conf" "$STORE2/kvfs.conf"
mount2() { "$BIN/kvfs" "$STORE2" "$MNT2" && KVFS2_PID=$(cat "$STORE2/kvfs.pid"); }
umount2() {
	if mountpoint -q "$MNT2"; then fuse_unmount "$MNT2" || return 1; fi
	[ -z "$KVFS2_PID" ] || timeout 120 tail --pid="$KVFS2_PID" -f /dev/null
	KVFS2_PID=
}
trap 'umount2; t_cleanup' EXIT
# Empty the target namespace between tools.
clear2() { rm -f "$MNT2/$NS"/*.kv; test "$(ls "$MNT2/$NS" | wc -l)" -eq 0; }
# Every source block is in the target, byte for byte, and nothing else.
same() {
	local f n=0
	for f in "$MNT/$NS"/*.kv; do
		cmp -s "$f" "$MNT2/$NS/$(basename "$f")" || { t_log "differs: $f"; return 1; }
		n=$((n + 1))
	done
	test "$n" -eq "$n_src" && test "$(ls "$MNT2/$NS" | wc -l)" -eq "$n_src"
}
t_check "second mount" mount2

# Directory times: the namespace's creation and last change, not 1970.
y=$(stat -c %Y "$MNT/$NS")
t_check "namespace mtime is recent ($y)" test "$y" -gt $(($(date +%s) - 3600))
t_check "ls -l shows no 1970" sh -c "! ls -l '$MNT' | grep -q 1970"
t_check "root mtime is recent" test "$(stat -c %Y "$MNT")" -gt $(($(date +%s) - 3600))
y2=$(stat -c %Y "$MNT2/$NS")
t_check "an empty namespace shows its creation time ($y2)" test "$y2" -gt $(($(date +%s) - 3600))

# Metadata calls that change nothing.
f=$(ls "$MNT/$NS"/*.kv | head -n1)
t_check "touch of a committed block is a no-op" touch "$f"
t_check "chmod 444 of a committed block" chmod 444 "$f"
t_errno "chmod 644 of a committed block is EPERM" "not permitted" chmod 644 "$f"
t_check "chown to its owner" chown "$(id -u):$(id -g)" "$f"
t_errno "chown to another owner is EPERM" "not permitted" chown 12345 "$f"
t_check "touch of a namespace directory" touch "$MNT/$NS"
t_check "chmod 755 of a namespace directory" chmod 755 "$MNT/$NS"
t_errno "truncate of a committed block is still EPERM" "not permitted" truncate -s 0 "$f"

# tar -c / -x
t_check "tar -c of the namespace" tar -C "$MNT" -cf "$T_DIR/ns.tar" "$NS"
t_check "tar -x into the second mount exits 0" tar -C "$MNT2" -xf "$T_DIR/ns.tar"
t_check "tar -x copied every block" same
t_check "empty the target" clear2
t_check "tar -c | tar -x between the mounts exits 0" \
	sh -c "tar -C '$MNT' -cf - '$NS' | tar -C '$MNT2' -xf -"
t_check "the tar pipe copied every block" same

# rsync -a: temporaries renamed to their keys.
t_check "empty the target" clear2
t_check "rsync -a exits 0" rsync -a "$MNT/$NS/" "$MNT2/$NS/"
t_check "rsync -a copied every block" same
t_check "rsync -a again (renames onto every block) exits 0" rsync -a "$MNT/$NS/" "$MNT2/$NS/"
t_check "rsync -a again left every block" same
t_check "empty the target" clear2
t_check "rsync -a --inplace exits 0" rsync -a --inplace "$MNT/$NS/" "$MNT2/$NS/"
t_check "rsync -a --inplace copied every block" same
t_check "empty the target" clear2
t_check "rsync -a --whole-file exits 0" rsync -a --whole-file "$MNT/$NS/" "$MNT2/$NS/"
t_check "rsync -a --whole-file copied every block" same

# cp -a and cp
t_check "empty the target" clear2
t_check "cp -a exits 0" cp -a "$MNT/$NS/." "$MNT2/$NS/"
t_check "cp -a copied every block" same
t_check "empty the target" clear2
t_check "cp -a of the directory exits 0" cp -a "$MNT/$NS" "$MNT2/"
t_check "cp -a of the directory copied every block" same
t_check "empty the target" clear2
t_check "cp exits 0" sh -c "cp '$MNT/$NS'/*.kv '$MNT2/$NS/'"
t_check "cp copied every block" same

# Temporaries by hand.  mv reads EINVAL from renameat2() as "a
# subdirectory of itself": the errno is checked with rename(2) itself.
rename_py() { python3 -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$@"; }
key=$(basename "$f")
tmp="$MNT2/$NS/.$key.AbC123"
t_check "a temporary name takes a block" cp "$f" "$MNT2/$NS/notes.txt"
t_check "a temporary is not listed" sh -c "! ls -a '$MNT2/$NS' | grep -q notes.txt"
t_check "a temporary can be stat'ed" test "$(stat -c %s "$MNT2/$NS/notes.txt")" = "$(stat -c %s "$f")"
t_check "unlink drops a temporary" rm "$MNT2/$NS/notes.txt"
t_errno "an unlinked temporary is gone" "No such file" stat "$MNT2/$NS/notes.txt"
rm -f "$MNT2/$NS/$key"
t_check "write a temporary" cp "$f" "$tmp"
t_check "chmod and touch a temporary" sh -c "chmod 444 '$tmp' && touch -d @1000000 '$tmp'"
t_check "renaming it to its key commits it" mv "$tmp" "$MNT2/$NS/$key"
t_check "the committed block reads back" cmp "$f" "$MNT2/$NS/$key"
t_check "the temporary name is gone" sh -c "! test -e '$tmp'"
t_check "write the temporary again" cp "$f" "$tmp"
t_check "renaming onto the block of its key drops the copy" mv "$tmp" "$MNT2/$NS/$key"
t_check "the block is still there" cmp "$f" "$MNT2/$NS/$key"
t_check "the temporary is gone" sh -c "! test -e '$tmp'"
t_check "write the temporary again" cp "$f" "$tmp"
t_check "cp over an existing temporary rewrites it" cp "$f" "$tmp"
other=$(ls "$MNT/$NS"/*.kv | sed -n 2p)
rm -f "$MNT2/$NS/$(basename "$other")"
t_errno "a temporary renamed to another key is EINVAL" "Invalid argument" rename_py "$tmp" "$MNT2/$NS/$(basename "$other")"
t_check "a temporary failing validation stays a temporary" sh -c "test -e '$tmp' && ! test -e '$MNT2/$NS/$(basename "$other")'"
t_check "a temporary holding garbage" sh -c "head -c 5000 /dev/urandom >'$tmp'"
t_errno "renaming garbage is EINVAL" "Invalid argument" rename_py "$tmp" "$MNT2/$NS/$(basename "$other")"
t_check "unlink the temporary" rm "$tmp"
t_check "a temporary left behind" cp "$f" "$MNT2/$NS/left.tmp"
t_check "unmount the target" umount2
t_check "mount the target again" mount2
t_errno "a temporary does not survive a restart" "No such file" stat "$MNT2/$NS/left.tmp"
t_check "blocks survive the restart" cmp "$f" "$MNT2/$NS/$key"

t_check "unmount the target" umount2
t_check "clean unmount" kvfs_unmount
t_done
