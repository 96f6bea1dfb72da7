# shellcheck shell=bash
# Shared harness for kvfs mount-level tests.  Each test script sources it,
# then calls t_ok/t_fail (or t_check) and ends with t_done.
#
# Every script gets its own temp dir with a store and a mount point; the
# EXIT trap always unmounts and waits for the daemon, even when a test
# fails or the script is interrupted.
set -u
export LC_ALL=C

BUILD=${BUILD:-build}
case $BUILD in /*) BIN=$BUILD/bin ;; *) BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/$BUILD/bin ;; esac
T_NAME=$(basename "$0" .sh)
T_PASS=0
T_FAIL=0
T_DIR=$(mktemp -d "/tmp/kvfs-$T_NAME.XXXXXX")
STORE=$T_DIR/store
MNT=$T_DIR/mnt
NS=m
KVFS_PID=
mkdir -p "$MNT"

# Geometry of the test namespace: small blocks keep the tests fast, and
# every code path is the same as for real sizes.
GEOM=(--ns "$NS" --layers 4 --kv-heads 2 --head-dim 64 --dtype bf16
	--block-tokens 16 --chunk-tokens 4)

t_log() { printf '# %s\n' "$*"; }
t_ok() { T_PASS=$((T_PASS + 1)); printf 'ok - %s: %s\n' "$T_NAME" "$1"; }
t_fail() {
	T_FAIL=$((T_FAIL + 1))
	printf 'not ok - %s: %s\n' "$T_NAME" "$1"
	if [ -f "$STORE/kvfs.log" ]; then
		tail -n 5 "$STORE/kvfs.log" | sed 's/^/#   log: /'
		# a sanitizer report from the daemon, if any
		grep -A 40 -m 1 'ERROR: AddressSanitizer\|runtime error\|LeakSanitizer' \
			"$STORE/kvfs.log" | sed 's/^/#   log: /'
		# the whole log, where a run asks for it (KVFS_TEST_KEEP_LOGS=DIR)
		if [ -n "${KVFS_TEST_KEEP_LOGS:-}" ] &&
			mkdir -p "$KVFS_TEST_KEEP_LOGS" &&
			cp "$STORE/kvfs.log" "$KVFS_TEST_KEEP_LOGS/$T_NAME.$$.log"; then
			printf '#   log kept: %s\n' "$KVFS_TEST_KEEP_LOGS/$T_NAME.$$.log"
		fi
	fi
}
# t_check DESC CMD...: pass when CMD succeeds.
t_check() {
	local d=$1
	shift
	if "$@"; then t_ok "$d"; else t_fail "$d"; fi
}
# t_errno DESC MSG CMD...: pass when CMD fails and says MSG (strerror text).
t_errno() {
	local d=$1 msg=$2 out
	shift 2
	if out=$("$@" 2>&1); then
		t_fail "$d (succeeded, expected '$msg')"
	elif grep -q -- "$msg" <<<"$out"; then
		t_ok "$d"
	else
		t_fail "$d (said: $out)"
	fi
}

# kvfs_san_env LIB: SAN_ENV gets the env assignments that a program which
# is not instrumented (python3, a client a test compiles) needs to load
# LIB when LIB is a sanitizer build's: its runtime first, and no leak
# report for the interpreter's own. Empty for a plain build.
SAN_ENV=()
kvfs_san_env() {
	local asan
	SAN_ENV=()
	asan=$(ldd "$1" 2>/dev/null | awk '/libasan/ { print $3 }')
	if [ -n "$asan" ]; then
		SAN_ENV=(LD_PRELOAD="$asan"
			ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
	fi
	return 0
}

# t_cmocka TAG PROGRAM [ARGS...]: run a cmocka program against the mount
# and count each of its tests as one of ours.
t_cmocka() {
	local tag=$1 out rc name res
	shift
	out=$("$@" 2>&1)
	rc=$?
	while read -r name res; do
		if [ "$res" = OK ]; then t_ok "$tag: $name"; else t_fail "$tag: $name"; fi
	done < <(awk '/^\[ RUN      \]/ { cur = $4; next }
		/^\[       OK \]/ && cur != "" { print cur, "OK"; cur = ""; next }
		/^\[  FAILED  \]/ && cur != "" { print cur, "FAILED"; cur = "" }' <<<"$out")
	if [ "$rc" -ne 0 ]; then
		t_fail "$tag: $1 exited $rc"
		printf '%s\n' "$out" | grep -v '^\[ *\(RUN\|OK\) ' | sed 's/^/#   /' | tail -n "${T_CMOCKA_TAIL:-30}"
	fi
}

# fuse_unmount [-z] DIR: fusermount3 -u, or where the fuse3 package is
# missing (a bare GPU host running a bundle as root) umount, which does
# the same for root; -z is the lazy form.
fuse_unmount() {
	if command -v fusermount3 >/dev/null; then
		fusermount3 -u "$@"
	elif [ "$1" = -z ]; then
		umount -l "$2"
	else
		umount "$1"
	fi
}

kvfs_unmount() {
	if mountpoint -q "$MNT" 2>/dev/null; then
		fuse_unmount "$MNT" 2>/dev/null || fuse_unmount -z "$MNT"
	elif grep -q " $MNT fuse" /proc/mounts; then
		# A daemon killed with -9 leaves a dead mount behind.
		fuse_unmount -z "$MNT" 2>/dev/null
	fi
	if [ -n "$KVFS_PID" ]; then
		# fusermount3 returns before the daemon has persisted the
		# last blocks; the store is free once the process is gone.
		timeout 120 tail --pid="$KVFS_PID" -f /dev/null
		KVFS_PID=
	fi
}

# t_user_bin PROG...: copies of the programs other users must run, in
# $T_DIR/ubin (made 0755 with its copies): the build may sit under a
# directory only its owner can enter, such as a 0700 temporary clone.
# Prints the directory. $T_DIR itself must be 0755 for them to reach it.
t_user_bin() {
	mkdir -p "$T_DIR/ubin" && chmod 0755 "$T_DIR/ubin" || return 1
	cp "$@" "$T_DIR/ubin/" || return 1
	chmod -R a+rX "$T_DIR/ubin"
	echo "$T_DIR/ubin"
}

t_cleanup() {
	kvfs_unmount
	rm -rf "$T_DIR"
}
trap t_cleanup EXIT
trap 'exit 130' INT TERM

# kvfs_mkfs [SIZE]
kvfs_mkfs() {
	"$BIN/mkfs.kvfs" --ssd-size "${1:-64M}" "$STORE" >"$T_DIR/mkfs.out" || return 1
	kvfs_shm_track "$T_DIR/mkfs.out"
}

# The device pools of a store's daemon are /dev/shm/kvfs-<uuid[0..3]>-<pid>-pool-<uid>.
# kvfs_shm_track MKFS_OUTPUT: t_done checks that no such object of the
# store is left, the test's stores being new: /dev/shm as the test found it.
T_SHM_PREFIXES=
kvfs_shm_track() {
	local u
	u=$(awk '$1 == "uuid" { print substr($2, 1, 8) }' "$1")
	[ -z "$u" ] || T_SHM_PREFIXES="$T_SHM_PREFIXES kvfs-$u-"
}
kvfs_shm_check() {
	local p left=
	[ -n "$T_SHM_PREFIXES" ] || return 0
	kvfs_unmount
	for p in $T_SHM_PREFIXES; do
		left="$left$(ls /dev/shm | grep "^$p" | tr '\n' ' ')"
	done
	if [ -z "$left" ]; then
		t_ok "/dev/shm is as the test found it"
	else
		t_fail "/dev/shm keeps the test's pools: $left"
	fi
}

# kvfs_conf DRAM_CAPACITY [POLICY]: the store's config with the test
# namespace.
kvfs_conf() {
	cat >"$STORE/kvfs.conf" <<EOC
[daemon]
flush_ms = ${KVFS_FLUSH_MS:-100}

[tier.dram]
capacity = ${1:-16M}

[policy]
name = ${2:-lru}

[namespace $NS]
layers = 4
kv_heads = 2
head_dim = 64
dtype = bf16
block_tokens = 16
chunk_tokens = 4
EOC
}

# kvfs_mount [ARGS...]: returns once the mount is ready.
kvfs_mount() {
	"$BIN/kvfs" "$@" "$STORE" "$MNT" || return 1
	KVFS_PID=$(cat "$STORE/kvfs.pid")
}

# stat KEY of the running mount
kvfs_stat() {
	awk -v k="$1" '$1 == k { print $2 }' "$MNT/.kvfs/stats"
}

gen() { "$BIN/kvfs-gen" "$@"; }

t_done() {
	kvfs_shm_check
	printf '# %s: %d passed, %d failed\n' "$T_NAME" "$T_PASS" "$T_FAIL"
	[ "$T_FAIL" -eq 0 ]
}
