#!/usr/bin/env bash
# make install into a DESTDIR: every file where it belongs, man pages that
# man(1) formats without a warning, libkvfs usable through pkg-config, the
# Python module, the systemd unit; the mount helper through mount(8) (an
# fstab line of type fuse.kvfs) and a clean umount; READY=1 to systemd.
. "$(dirname "$0")/lib.sh"

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$T_DIR/root
t_check "make install DESTDIR PREFIX=/usr" \
	make -s -C "$REPO" BUILD="$BUILD" DESTDIR="$ROOT" PREFIX=/usr install
for f in usr/bin/kvfs usr/bin/kvfsctl usr/bin/mkfs.kvfs usr/bin/kvfs-gen \
	usr/lib/libkvfs.a usr/lib/libkvfs.so.1 usr/lib/libkvfs.so \
	usr/include/kvfs/libkvfs.h usr/include/kvfs/meta/kvfs_ctl.h \
	usr/include/kvfs/meta/fmt.h usr/lib/pkgconfig/kvfs.pc \
	usr/lib/python3/dist-packages/kvfs.py \
	usr/share/man/man8/kvfs.8 usr/share/man/man8/mkfs.kvfs.8 \
	usr/share/man/man8/kvfsctl.8 usr/share/man/man5/kvfs.conf.5 \
	usr/share/man/man3/libkvfs.3 sbin/mount.kvfs sbin/mount.fuse.kvfs \
	lib/systemd/system/kvfs@.service; do
	t_check "installed: /$f" test -e "$ROOT/$f"
done
t_check "programs are executable" test -x "$ROOT/usr/bin/kvfs" -a -x "$ROOT/sbin/mount.kvfs"

# Man pages: formatted without a warning, NAME sections whatis can read.
for m in "$ROOT"/usr/share/man/man*/*; do
	n=$(basename "$m")
	t_check "man --warnings $n: no warning" \
		sh -c "test -z \"\$(MANWIDTH=80 man --warnings -l '$m' 2>&1 >/dev/null)\""
	t_check "lexgrog $n" sh -c "lexgrog '$m' | grep -q ' - '"
done

# libkvfs through pkg-config: a program built against the installed copy.
pc() { PKG_CONFIG_PATH=$ROOT/usr/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$ROOT pkg-config "$@"; }
t_check "pkg-config knows kvfs" pc --exists kvfs
cat >"$T_DIR/use.c" <<'EOC'
#include <stdio.h>
#include <libkvfs.h>
int main(void)
{
	uint8_t k[KVFS_KEY_LEN];
	kvfs_client_root_key("m", "", k);
	printf("%02x\n", k[0]);
	return 0;
}
EOC
t_check "a program builds against the installed header and library" \
	sh -c "cc -o '$T_DIR/use' '$T_DIR/use.c' $(pc --cflags --libs kvfs) -lcrypto -lisal -lpthread"
kvfs_san_env "$ROOT/usr/lib/libkvfs.so"
t_check "and runs" env "${SAN_ENV[@]}" LD_LIBRARY_PATH="$ROOT/usr/lib" "$T_DIR/use"
t_check "the Python module imports and loads the installed library" \
	env PYTHONPATH="$ROOT/usr/lib/python3/dist-packages" KVFS_LIB="$ROOT/usr/lib/libkvfs.so" \
	python3 -c 'import kvfs; kvfs.Client' 
u=$ROOT/lib/systemd/system/kvfs@.service
t_check "the unit is Type=notify, restarts on failure, runs the installed kvfs" \
	sh -c "grep -q '^Type=notify' '$u' && grep -q '^Restart=on-failure' '$u' && grep -q '^ExecStart=/usr/bin/kvfs -f ' '$u'"
t_check "the mount helper runs the installed kvfs" grep -q '/usr/bin/kvfs' "$ROOT/sbin/mount.kvfs"

kvfs_mkfs 64M
kvfs_conf 16M

# Type=notify: READY=1 on $NOTIFY_SOCKET once mounted, STOPPING=1 at the end.
if grep -q sd_notify "$BIN/kvfs" 2>/dev/null || ldd "$BIN/kvfs" | grep -q libsystemd; then
	python3 - "$T_DIR/notify.sock" >"$T_DIR/notify.out" <<'EOP' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(60)
for _ in range(2):
    print(s.recv(4096).decode().replace("\n", " "), flush=True)
EOP
	listener=$!
	for ((i = 0; i < 100; i++)); do [ -S "$T_DIR/notify.sock" ] && break; sleep 0.05; done
	NOTIFY_SOCKET=$T_DIR/notify.sock "$BIN/kvfs" -f "$STORE" "$MNT" 2>"$T_DIR/fg.log" &
	fg=$!
	for ((i = 0; i < 200; i++)); do grep -q READY=1 "$T_DIR/notify.out" && break; sleep 0.05; done
	t_check "READY=1 once the mount serves" sh -c "grep -q READY=1 '$T_DIR/notify.out' && test -d '$MNT/$NS'"
	fuse_unmount "$MNT"
	timeout 60 tail --pid="$fg" -f /dev/null
	wait "$listener"
	t_check "STOPPING=1 at the unmount" grep -q STOPPING=1 "$T_DIR/notify.out"
else
	t_log "kvfs built without libsystemd: sd_notify not checked"
fi

# mount(8) with an fstab line of type fuse.kvfs, and umount. mount(8)
# looks for its helper in /sbin only: a stand-in there runs the staged
# helper with the built kvfs for the length of the test.  /sbin is the
# machine's, so runs of this test on one machine take turns under a lock,
# which dies with its holder: a stand-in found while holding it was left
# by a run that was killed, and is replaced.  Any other file there (an
# installed kvfs) is left alone and the check is skipped.
HELPER=/sbin/mount.fuse.kvfs
MARK="# the stand-in of kvfs's test_install"
helper_claim() {
	[ "$(id -u)" = 0 ] || return 1
	exec 9>/run/lock/kvfs-test-install.lock || return 1
	if ! flock -w 300 9; then
		t_log "another run held /run/lock/kvfs-test-install.lock for 300 s"
		return 1
	fi
	if [ -e "$HELPER" ]; then
		grep -qxF "$MARK" "$HELPER" 2>/dev/null || return 1
		t_log "$HELPER: a stand-in left by a killed run, replaced"
	fi
	printf '#!/bin/sh\n%s\nKVFS_BIN=%s exec %s "$@"\n' "$MARK" \
		"$BIN/kvfs" "$ROOT/sbin/mount.kvfs" >"$HELPER" &&
		chmod 755 "$HELPER"
}
if ! helper_claim; then
	t_log "$HELPER is not this test's (or not root): the mount(8) check is skipped"
else
	trap 'rm -f "$HELPER"; t_cleanup' EXIT
	printf '%s %s fuse.kvfs defaults,allow_other 0 0\n' "$STORE" "$MNT" >"$T_DIR/fstab"
	# 9>&-: the daemon must not hold the lock past the test.
	t_check "mount --fstab: the fuse.kvfs line mounts" mount -T "$T_DIR/fstab" "$MNT" 9>&-
	KVFS_PID=$(cat "$STORE/kvfs.pid" 2>/dev/null)
	t_check "the mount serves" test -d "$MNT/$NS"
	t_check "allow_other was passed on" grep -q "$MNT fuse.kvfs .*allow_other" /proc/mounts
	t_check "a block written through it" \
		gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 1 --blocks 3 --quiet
	t_check "umount MNT" umount "$MNT"
	t_check "the daemon exits cleanly" timeout 60 tail --pid="$KVFS_PID" -f /dev/null
	KVFS_PID=
	t_check "it logged a clean unmount" grep -q "unmounted $MNT" "$STORE/kvfs.log"
	t_check "mount -t fuse.kvfs again" mount -t fuse.kvfs -o defaults "$STORE" "$MNT" 9>&-
	KVFS_PID=$(cat "$STORE/kvfs.pid" 2>/dev/null)
	t_check "the blocks persisted" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
	t_check "umount again" umount "$MNT"
	timeout 60 tail --pid="$KVFS_PID" -f /dev/null
	KVFS_PID=
	rm -f "$HELPER"
fi
t_done
