#!/usr/bin/env bash
# Two tenants on one host (docs/operations.md, "Sharing a host"): two
# unprivileged users, each owning a namespace of mode 0750, on a mount
# made with allow_other. Each reads and writes its own namespace through
# files and .kvfs/ctl; every operation on the other's is refused with
# EACCES, through files, ctl and xattrs; client memory a tenant could not
# open itself is never used; root can do everything; the pin quota holds;
# the other tenant's blocks and pins stay as they were throughout.
# The device pool is one per owner: each tenant FETCHes into its own,
# maps it and finds its blocks there, and cannot open the other's; a
# reader of a namespace that is not its owner (a member of its group) is
# sent to FETCH_INTO; root sees every pool. A start removes the pools of
# dead daemons of its store, and /dev/shm is left as it was found.
#
# Needs root, useradd/userdel and runuser (util-linux). The users get
# names unique to this run and are removed on every exit path.
. "$(dirname "$0")/lib.sh"

TC=$BIN/../itests/tenant_client
for tool in useradd userdel runuser getfattr setfattr; do
	if ! command -v "$tool" >/dev/null; then
		t_ok "tenants # SKIP $tool is missing"
		t_done
		exit
	fi
done
if [ "$(id -u)" -ne 0 ]; then
	t_ok "tenants # SKIP needs root (to create the users)"
	t_done
	exit
fi

UA=kvfsta$$
UB=kvfstb$$
UC=kvfstc$$
SHM_C=/kvfs-ten-$$-c
SHM_A=/kvfs-ten-$$-a
SHM_A2=/kvfs-ten-$$-a2
SHM_B=/kvfs-ten-$$-b
SHM_R=/kvfs-ten-$$-root
HOLD=
tenants_cleanup() {
	[ -n "$HOLD" ] && kill "$HOLD" "${HOLD2:-}" 2>/dev/null
	rm -f "/dev/shm$SHM_A" "/dev/shm$SHM_A2" "/dev/shm$SHM_B" "/dev/shm$SHM_R" "/dev/shm$SHM_C"
	[ -n "${FAKE:-}" ] && rm -f "/dev/shm$FAKE"
	t_cleanup
	userdel "$UA" 2>/dev/null
	userdel "$UB" 2>/dev/null
	userdel "$UC" 2>/dev/null
	getent group "$UA" >/dev/null && groupdel "$UA"
	getent group "$UB" >/dev/null && groupdel "$UB"
}
trap tenants_cleanup EXIT
# A user of its own group, without a home.
t_check "create user $UA" useradd -M -U -s /bin/sh "$UA"
t_check "create user $UB" useradd -M -U -s /bin/sh "$UB"
# A reader of a's through its group.
t_check "create user $UC in group $UA" useradd -M -U -G "$UA" -s /bin/sh "$UC"
UIDA=$(id -u "$UA") GIDA=$(id -g "$UA") UIDB=$(id -u "$UB")
asA() { runuser -u "$UA" -- "$@"; }
asB() { runuser -u "$UB" -- "$@"; }
asC() { runuser -u "$UC" -- "$@"; }
# The test store lives in a 0700 temp dir: the tenants must reach the mount.
chmod 0755 "$T_DIR"
# ... and the programs they run.
UBIN=$(t_user_bin "$BIN/kvfs-gen" "$TC") || {
	echo "test_tenants: cannot copy the tenants' programs" >&2
	exit 1
}
GEN=$UBIN/kvfs-gen
TC=$UBIN/tenant_client

G=(--layers 4 --kv-heads 2 --head-dim 64 --dtype bf16 --block-tokens 16 --chunk-tokens 4)
ns_keys() {
	cat <<EON
layers = 4
kv_heads = 2
head_dim = 64
dtype = bf16
block_tokens = 16
chunk_tokens = 4
EON
}
kvfs_mkfs 64M
# One test block is 40 KiB (payload 32 KiB): a's pin quota holds one, its
# quota three.
{
	printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = 16M\n\n'
	printf '[tier.gpu]\nbackend = shm\ncapacity = 1M\n\n'
	printf '[namespace a]\n'; ns_keys
	printf 'owner = %s\ngroup = %s\nmode = 0750\npin_quota = 40K\nquota = 120K\n\n' "$UA" "$UA"
	printf '[namespace b]\n'; ns_keys
	printf 'owner = %s\ngroup = %s\nmode = 0750\nmodel_digest = sha256:tenant-b\n' "$UB" "$UB"
} >"$STORE/kvfs.conf"
t_check "mount with allow_other" kvfs_mount -o allow_other

# ---- the kernel's view
t_check "a's directory is $UA:$UA 0750" test "$(stat -c '%U:%G %a' "$MNT/a")" = "$UA:$UA 750"
t_check "b's directory is $UB:$UB 0750" test "$(stat -c '%U:%G %a' "$MNT/b")" = "$UB:$UB 750"

KA=$(asA "$GEN" make "$MNT/a" --ns a "${G[@]}" --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16)
t_check "$UA writes a block in a (the file interface)" test -f "$MNT/a/$KA.kv"
KA2=$(asA "$GEN" make "$MNT/a" --ns a "${G[@]}" --tokens 21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36)
t_check "and a second one" test -f "$MNT/a/$KA2.kv"
# b's root key mixes in its model_digest: read it from the namespace.
root_b=$(asB getfattr --only-values -n user.kvfs.root "$MNT/b")
KB=$(asB "$GEN" make "$MNT/b" "${G[@]}" --parent "$root_b" --start-pos 0 \
	--tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16)
t_check "$UB writes a block in b" test -f "$MNT/b/$KB.kv"
t_check "the same tokens make another key in b (its model_digest)" test "$KA" != "$KB"
t_check "a block is its namespace's owner's, read bits only (0440)" \
	test "$(stat -c '%U:%G %a' "$MNT/a/$KA.kv")" = "$UA:$UA 440"
t_check "$UA reads its block" asA cmp -s "$MNT/a/$KA.kv" "$MNT/a/$KA.kv"
cp "$MNT/b/$KB.kv" "$T_DIR/kb.copy"
chmod 0644 "$T_DIR/kb.copy"
t_check "$UB pins its block (xattr? no: ctl)" test "$(asB "$TC" "$MNT" b pin "$KB" 1)" = "error=0"
t_check "b's pin shows" test "$(getfattr --only-values -n user.kvfs.pin "$MNT/b/$KB.kv")" = dram

# model_digest: the client computes the root key the daemon stores.
kvfs_san_env "$(dirname "$BIN")/lib/libkvfs.so"
py_root=$(env "${SAN_ENV[@]}" KVFS_LIB="$(dirname "$BIN")/lib/libkvfs.so" PYTHONPATH="$(dirname "$0")/../../client" \
	python3 -c 'import kvfs; print(kvfs.root_key("b", None, "sha256:tenant-b").hex())' 2>&1)
t_check "kvfs.root_key(ns, salt, model_digest) is b's user.kvfs.root ($py_root)" test "$py_root" = "$root_b"

# ---- cross-namespace through files and xattrs: EACCES
t_errno "$UB cannot list a" "Permission denied" asB ls "$MNT/a"
t_errno "$UB cannot read a's block" "Permission denied" asB cat "$MNT/a/$KA.kv"
t_errno "$UB cannot create in a" "Permission denied" \
	asB "$GEN" make "$MNT/a" "${G[@]}" --parent "$KA" --tokens 5
t_errno "$UB cannot unlink in a" "Permission denied" asB rm -f "$MNT/a/$KA.kv"
t_errno "$UB cannot read a's xattrs" "Permission denied" asB getfattr -n user.kvfs.root "$MNT/a"
t_errno "$UB cannot read a block's xattrs" "Permission denied" asB getfattr -n user.kvfs.tier "$MNT/a/$KA.kv"
t_errno "$UB cannot pin a's block by xattr" "Permission denied" asB setfattr -n user.kvfs.pin -v dram "$MNT/a/$KA.kv"
t_errno "$UA cannot read b's block" "Permission denied" asA cat "$MNT/b/$KB.kv"

# ---- cross-namespace through ctl: EACCES, and LOOKUP reveals nothing
asA "$TC" "$MNT" a mkshm "$SHM_A" 65536 0
asB "$TC" "$MNT" b mkshm "$SHM_B" 65536 0
for op in "lookup $KA" "lookup 00000000000000000000000000000000" "pin $KA 1" "unpin $KA" \
	"evict $KA 3" "prefetch $KA" "release $KA" "fetch_into $KA $SHM_B" \
	"fetch_chunks $KA $SHM_B" "save $SHM_B"; do
	# shellcheck disable=SC2086
	out=$(asB "$TC" "$MNT" a $op | head -n 1)
	t_check "$UB: ${op%% *} in a is EACCES ($out)" test "$out" = "error=-13"
done
t_check "refusals are logged with uid, op and namespace" \
	grep -q "ctl: uid $(id -u "$UB") may not LOOKUP in namespace a" "$STORE/kvfs.log"

# ---- each tenant in its own namespace through ctl
t_check "$UA: LOOKUP finds its block" test "$(asA "$TC" "$MNT" a lookup "$KA" | head -n 2 | tr '\n' ' ')" = "error=0 n_cached=1 tiers=6 "
t_check "$UA: PREFETCH" test "$(asA "$TC" "$MNT" a prefetch "$KA")" = "error=0"
out=$(asA "$TC" "$MNT" a fetch_into "$KA" "$SHM_A")
t_check "$UA: FETCH_INTO its own memory ($out)" test "$out" = "error=0"
t_check "and the bytes arrived" sh -c "! $TC $MNT a sum $SHM_A | grep -q '^sum=0\$'"
t_check "$UA: FETCH_CHUNKS into its own memory" test "$(asA "$TC" "$MNT" a fetch_chunks "$KA" "$SHM_A")" = "error=0"
out=$(asA "$TC" "$MNT" a save "$SHM_A")
KS=$(sed -n 's/^key=//p' <<<"$out")
t_check "$UA: SAVE from its own memory ($out)" test -n "$KS" -a -f "$MNT/a/$KS.kv"
t_check "$UA: PIN then UNPIN" test "$(asA "$TC" "$MNT" a pin "$KS" 1; asA "$TC" "$MNT" a unpin "$KS")" = "error=0
error=0"
t_check "$UA: EVICT (delete) its saved block" test "$(asA "$TC" "$MNT" a evict "$KS" 3)" = "error=0"

# ---- the device pool: one per owner
out=$(asA "$TC" "$MNT" a fetchmap "$KA" "$MNT/a/$KA.kv" | tr '\n' ' ')
PA=$(sed -n 's/.*pool=\([^ ]*\) .*/\1/p' <<<"$out")
t_check "$UA: FETCH into its own pool, mapped read-only: its block byte for byte, inside the pool ($out)" \
	test "$out" = "error=0 pool=$PA inside=1 same=1 "
out=$(asB "$TC" "$MNT" b fetchmap "$KB" "$MNT/b/$KB.kv" | tr '\n' ' ')
PB=$(sed -n 's/.*pool=\([^ ]*\) .*/\1/p' <<<"$out")
t_check "$UB: the same in b ($out)" test "$out" = "error=0 pool=$PB inside=1 same=1 "
t_check "the pools are named by store, daemon and owner" \
	sh -c "case '$PA' in /kvfs-*-$KVFS_PID-pool-$UIDA) ;; *) exit 1;; esac && case '$PB' in /kvfs-*-$KVFS_PID-pool-$UIDB) ;; *) exit 1;; esac"
t_check "a's pool object is $UA's, 0600" test "$(stat -c '%a %U' "/dev/shm$PA")" = "600 $UA"
t_check "b's pool object is $UB's, 0600" test "$(stat -c '%a %U' "/dev/shm$PB")" = "600 $UB"
t_check "the mounting user's pool (namespaces without an owner) is root's, 0600" \
	test "$(stat -c '%a %U' /dev/shm/kvfs-*-"$KVFS_PID"-pool-0)" = "600 root"
t_check "$UA cannot open $UB's pool (EACCES from shm_open)" test "$(asA "$TC" "$MNT" a openshm "$PB")" = "open=-13"
t_check "$UB cannot open $UA's pool" test "$(asB "$TC" "$MNT" b openshm "$PA")" = "open=-13"
P0=/$(ls /dev/shm | grep -- "-$KVFS_PID-pool-0\$")
t_check "neither can open root's ($P0)" test "$(asA "$TC" "$MNT" a openshm "$P0")" = "open=-13"
out=$(asA "$TC" "$MNT" a pool_chunks "$KA" | tr '\n' ' ')
t_check "$UA: FETCH_CHUNKS with F_POOL, into a region of its own pool ($out)" \
	test "$out" = "error=0 pool=$PA inside=1 "
t_check "$UC (a's group) reads a: LOOKUP" test "$(asC "$TC" "$MNT" a lookup "$KA" | head -n 1)" = "error=0"
t_check "$UC: FETCH (pool mode) of a is EACCES: the pool is $UA's" test "$(asC "$TC" "$MNT" a fetch "$KA")" = "error=-13"
t_check "$UC: FETCH_CHUNKS with F_POOL too" test "$(asC "$TC" "$MNT" a pool_chunks "$KA")" = "error=-13"
t_check "the refusal says to use FETCH_INTO" \
	grep -q "ctl: uid $(id -u "$UC") may not FETCH in namespace a: the device pool of the namespace is uid $UIDA's.*use FETCH_INTO" "$STORE/kvfs.log"
asC "$TC" "$MNT" a mkshm "$SHM_C" 65536 0
t_check "$UC: FETCH_INTO its own memory instead" test "$(asC "$TC" "$MNT" a fetch_into "$KA" "$SHM_C")" = "error=0"
t_check "$UC cannot open a's pool" test "$(asC "$TC" "$MNT" a openshm "$PA")" = "open=-13"
out=$("$TC" "$MNT" a fetchmap "$KA" "$MNT/a/$KA.kv" | tr '\n' ' ')
t_check "root: FETCH in a gives a's pool, and root maps it ($out)" test "$out" = "error=0 pool=$PA inside=1 same=1 "
out=$("$TC" "$MNT" b fetchmap "$KB" "$MNT/b/$KB.kv" | tr '\n' ' ')
t_check "root: and b's ($out)" test "$out" = "error=0 pool=$PB inside=1 same=1 "

# ---- client memory the caller could not open itself
"$TC" "$MNT" a mkshm "$SHM_R" 65536 90
sum_r=$("$TC" "$MNT" a sum "$SHM_R")
nb=$(asA getfattr --only-values -n user.kvfs.blocks "$MNT/a")
t_check "$UA: SAVE from root's 0600 shm is EACCES" test "$(asA "$TC" "$MNT" a save "$SHM_R")" = "error=-13"
t_check "and no block was made" test "$(asA getfattr --only-values -n user.kvfs.blocks "$MNT/a")" = "$nb"
t_check "$UA: FETCH_INTO root's 0600 shm is EACCES" test "$(asA "$TC" "$MNT" a fetch_into "$KA" "$SHM_R")" = "error=-13"
t_check "$UA: FETCH_INTO $UB's shm is EACCES" test "$(asA "$TC" "$MNT" a fetch_into "$KA" "$SHM_B")" = "error=-13"
t_check "$UA: FETCH_CHUNKS into $UB's shm is EACCES" test "$(asA "$TC" "$MNT" a fetch_chunks "$KA" "$SHM_B")" = "error=-13"
t_check "$UA: a sync word in root's shm is EACCES" \
	test "$(asA "$TC" "$MNT" a fetch_into "$KA" "$SHM_A" "$SHM_R")" = "error=-13"
t_check "root's object is untouched" test "$("$TC" "$MNT" a sum "$SHM_R")" = "$sum_r"
t_check "$UB's object is untouched" test "$("$TC" "$MNT" a sum "$SHM_B")" = "sum=0"
t_check "refused memory is logged" grep -q "it cannot open the shm object $SHM_R itself" "$STORE/kvfs.log"
out=$("$TC" "$MNT" a kept "$KA" "$SHM_R" "$UIDA" "$GIDA" | tr '\n' ' ')
t_check "a session's kept peer serves only who opened it ($out)" test "$out" = "error=0 error=-13 "

# ---- leases are per client
"$TC" "$MNT" a hold "$KA" 30 >"$T_DIR/hold.out" &
HOLD=$!
for _ in $(seq 50); do
	[ "$(getfattr --only-values -n user.kvfs.leases "$MNT/a/$KA.kv")" = 1 ] && break
	sleep 0.1
done
t_check "root holds a lease on a's block" test "$(getfattr --only-values -n user.kvfs.leases "$MNT/a/$KA.kv")" = 1
t_check "$UA: RELEASE of the key" test "$(asA "$TC" "$MNT" a release "$KA")" = "error=0"
t_check "$UA: RELEASE of everything" test "$(asA "$TC" "$MNT" a release)" = "error=0"
t_check "$UB: RELEASE in a is EACCES" test "$(asB "$TC" "$MNT" a release "$KA")" = "error=-13"
t_check "root's lease is still there" test "$(getfattr --only-values -n user.kvfs.leases "$MNT/a/$KA.kv")" = 1
kill "$HOLD" 2>/dev/null
wait "$HOLD" 2>/dev/null
HOLD=

# ---- pin quota
t_check "$UA pins one block (within pin_quota)" test "$(asA "$TC" "$MNT" a pin "$KA" 1)" = "error=0"
t_check "re-pinning it adds nothing" test "$(asA "$TC" "$MNT" a pin "$KA" 1)" = "error=0"
t_check "a second is past pin_quota: EDQUOT" test "$(asA "$TC" "$MNT" a pin "$KA2" 1)" = "error=-122"
t_errno "and through the xattr, for root too" "quota exceeded" setfattr -n user.kvfs.pin -v dram "$MNT/a/$KA2.kv"
t_check "the refusal is logged" grep -q "namespace a: pinning .* pin_quota" "$STORE/kvfs.log"

# ---- quota: a's commits over it evict a's own oldest blocks
mk() { asA "$GEN" make "$MNT/a" --ns a "${G[@]}" --tokens "$(seq -s, "$1" $(($1 + 15)))"; }
t_check "a holds two blocks" test "$(asA getfattr --only-values -n user.kvfs.blocks "$MNT/a")" = 2
K3=$(mk 300)
t_check "a third fits in the quota" test "$(asA getfattr --only-values -n user.kvfs.blocks "$MNT/a")" = 3
sleep 0.2
K4=$(mk 400)
t_check "a fourth evicts a's oldest unpinned block" \
	test -f "$MNT/a/$K4.kv" -a ! -e "$MNT/a/$KA2.kv" -a -f "$MNT/a/$KA.kv" -a -f "$MNT/a/$K3.kv"
t_check "the eviction is logged" grep -q "evicted for its namespace's quota" "$STORE/kvfs.log"
"$TC" "$MNT" a hold "$K3" 30 >/dev/null &
HOLD=$!
"$TC" "$MNT" a hold "$K4" 30 >/dev/null &
HOLD2=$!
for _ in $(seq 50); do
	[ "$(getfattr --only-values -n user.kvfs.leases "$MNT/a/$K4.kv")$(getfattr --only-values -n user.kvfs.leases "$MNT/a/$K3.kv")" = 11 ] && break
	sleep 0.1
done
t_errno "with the rest pinned or leased, close fails: EDQUOT" "quota exceeded" mk 500
t_check "and a keeps what it had" \
	test "$(asA getfattr --only-values -n user.kvfs.blocks "$MNT/a")" = 3 -a -f "$MNT/a/$KA.kv" -a -f "$MNT/a/$K3.kv" -a -f "$MNT/a/$K4.kv"
t_check "SAVE over the quota is EDQUOT too" test "$(asA "$TC" "$MNT" a save "$SHM_A")" = "error=-122"
kill "$HOLD" "$HOLD2" 2>/dev/null
wait "$HOLD" "$HOLD2" 2>/dev/null
HOLD=
t_check "b lost nothing to a's quota" test "$(asB getfattr --only-values -n user.kvfs.blocks "$MNT/b")" = 1

# ---- stats
t_check "$UB sees global counters" asB grep -q "^tier.dram" "$MNT/.kvfs/stats"
t_check "$UB sees b's figures" asB grep -q "^ns.b.blocks" "$MNT/.kvfs/stats"
t_check "$UB does not see a's" asB sh -c "! grep -q '^ns.a\\.' $MNT/.kvfs/stats"
t_check "root sees both" sh -c "grep -q '^ns.a.blocks' $MNT/.kvfs/stats && grep -q '^ns.b.blocks' $MNT/.kvfs/stats"

# ---- root can do all of it
t_check "root lists a" ls "$MNT/a/$KA.kv"
t_check "root reads b's block" cmp -s "$MNT/b/$KB.kv" "$T_DIR/kb.copy"
t_check "root: LOOKUP in b" test "$("$TC" "$MNT" b lookup "$KB" | head -n 1)" = "error=0"
t_check "root: UNPIN, PIN and UNPIN in a" \
	test "$("$TC" "$MNT" a unpin "$KA"; "$TC" "$MNT" a pin "$K3" 2; "$TC" "$MNT" a unpin "$K3")" = "error=0
error=0
error=0"
t_check "root reads a's xattrs" getfattr -n user.kvfs.tier "$MNT/a/$KA.kv"

# ---- the other tenant, untouched
t_check "b's block is intact" asB cmp -s "$MNT/b/$KB.kv" "$T_DIR/kb.copy"
t_check "b's pin stayed" test "$(asB getfattr --only-values -n user.kvfs.pin "$MNT/b/$KB.kv")" = dram
t_check "b holds its one block" test "$(asB getfattr --only-values -n user.kvfs.blocks "$MNT/b")" = 1
t_check "a's blocks are there" test -f "$MNT/a/$KA.kv" -a -f "$MNT/a/$K3.kv"
PID1=$KVFS_PID
t_check "unmount" kvfs_unmount
t_check "the unmount removed every pool" test -z "$(ls /dev/shm | grep -- "-$PID1-pool")"

# ---- a start removes the pools a dead daemon of this store left
dead=$(sh -c 'echo $$')
FAKE=$(sed "s/-$PID1-pool-/-$dead-pool-/" <<<"$PA")
: >"/dev/shm$FAKE"
t_check "mount again over a dead daemon's pool ($FAKE)" kvfs_mount -o allow_other
t_check "its pool is gone" test ! -e "/dev/shm$FAKE"
t_check "and the removal is logged" grep -q "removed $FAKE, left by daemon $dead" "$STORE/kvfs.log"
t_check "unmount" kvfs_unmount
rm -f "/dev/shm$SHM_A" "/dev/shm$SHM_A2" "/dev/shm$SHM_B" "/dev/shm$SHM_R" "/dev/shm$SHM_C"
# The store is this test's: nothing of it was there before.
SPFX=${PA#/}
SPFX=${SPFX%%-"$PID1"-pool-*}-
t_check "/dev/shm is as it was found ($SPFX...)" \
	test -z "$(ls /dev/shm | grep -e "^$SPFX" -e "^kvfs-ten-$$-")"
t_done
