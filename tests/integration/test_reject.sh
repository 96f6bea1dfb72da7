#!/usr/bin/env bash
# Every kind of bad block file is refused at close() with the right errno,
# is not stored, and harms nothing already stored.
. "$(dirname "$0")/lib.sh"

kvfs_mkfs 64M
kvfs_conf 16M
t_check "mount" kvfs_mount
t_check "seed data" gen write "$MNT/$NS" "${GEOM[@]}" --prefixes 2 --blocks 3 --shared 1 --quiet
before=$(ls "$MNT/$NS" | wc -l)

toks=$(seq -s, 2000 2015)
# corruption -> the strerror cp must print
for c in magic:"Invalid argument" version:"Invalid argument" kind:"Invalid argument" \
	dtype:"Invalid argument" geom:"Invalid argument" ntokens:"Invalid argument" \
	short:"Invalid argument" long:"Invalid argument" hdrcrc:"Bad message" \
	payloadcrc:"Bad message" key:"Invalid argument" startpos:"Invalid argument" \
	hidden:"Invalid argument" pad:"Invalid argument"; do
	what=${c%%:*}
	msg=${c#*:}
	key=$(gen make "$T_DIR/bad-$what.kv" "${GEOM[@]}" --parent root --start-pos 0 --tokens "$toks" --corrupt "$what")
	[ -n "$key" ] || key=0123456789abcdef0123456789abcdef
	t_errno "corrupt $what refused with '$msg'" "$msg" cp "$T_DIR/bad-$what.kv" "$MNT/$NS/$key.kv"
	t_check "corrupt $what not stored" test ! -e "$MNT/$NS/$key.kv"
done

# A good block under the wrong name: the key must equal the name.
key=$(gen make "$T_DIR/good.kv" "${GEOM[@]}" --parent root --start-pos 0 --tokens "$toks")
t_errno "good block under another name refused" "Invalid argument" cp "$T_DIR/good.kv" "$MNT/$NS/ffffffffffffffffffffffffffffffff.kv"
# A block from a namespace of another geometry.
gen make "$T_DIR/other.kv" --ns "$NS" --layers 8 --kv-heads 2 --head-dim 64 --dtype bf16 \
	--block-tokens 16 --chunk-tokens 4 --parent root --start-pos 0 --tokens "$toks" >"$T_DIR/okey"
t_errno "other geometry refused" "Invalid argument" cp "$T_DIR/other.kv" "$MNT/$NS/$(cat "$T_DIR/okey").kv"
# Empty file.
t_errno "empty file refused" "Invalid argument" cp /dev/null "$MNT/$NS/$key.kv"
# Larger than any block of the namespace: the write itself fails.
head -c 1048576 /dev/zero >"$T_DIR/big"
t_errno "oversized file refused" "File too large" cp "$T_DIR/big" "$MNT/$NS/$key.kv"
# Blocks go in namespace directories only.
t_errno "block at the root refused" "Operation not permitted" cp "$T_DIR/good.kv" "$MNT/$key.kv"

t_check "the rejections are logged with a reason" grep -q "rejected" "$STORE/kvfs.log"
t_check "nothing extra stored" test "$(ls "$MNT/$NS" | wc -l)" -eq "$before"
t_check "stored data intact" gen verify "$MNT/$NS" "${GEOM[@]}" --quiet
t_check "the good block is accepted afterwards" cp "$T_DIR/good.kv" "$MNT/$NS/$key.kv"
t_check "rejects counted" test "$(kvfs_stat cache.rejects)" -ge 14
t_check "daemon still up" test -d "$MNT/$NS"
t_done
