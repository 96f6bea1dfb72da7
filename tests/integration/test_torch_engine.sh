#!/usr/bin/env bash
# The reference engine (client/kvfs_engine, kvfs-torch-engine): a small
# Llama-architecture decoder serves prompts that share prefixes through
# kvfs, and every request's logits equal a full recompute's (f32 within
# 1e-4, bf16 within the rounding of the computation, the engine's
# "bound"): through block files and through the control file, across a
# remount, from blocks written back to the SSD and evicted from DRAM (a
# small DRAM tier), and from a namespace stored as hidden states (kvfs
# rebuilds K and V with the checkpoint the engine exports). A prefix
# block replaced by a well-formed block carrying other KV must show up
# as a difference.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
if ! "$PY" -c 'import torch' 2>/dev/null; then
	printf '# SKIP %s: /usr/bin/python3 cannot import torch (apt-get install python3-torch)\n' "$T_NAME"
	exit 0
fi
ENG=$BIN/kvfs-torch-engine
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$SRC/client
export KVFS_LIB=$BIN/../lib/libkvfs.so
# Everything python3 runs here loads libkvfs.so: with a sanitizer build,
# its runtime goes first (lib.sh).
kvfs_san_env "$KVFS_LIB"
[ "${#SAN_ENV[@]}" -eq 0 ] || export "${SAN_ENV[@]}"
CK=$T_DIR/ck

# prompts SEED FILE: two system prefixes of 40 tokens, seven prompts.
prompts() {
	"$PY" - "$1" >"$2" <<'EOF'
import json, random, sys
r = random.Random(int(sys.argv[1]))
sysp = [[r.randrange(1024) for _ in range(40)] for _ in range(2)]
out = [sysp[i % 2] + [r.randrange(1024) for _ in range(r.randrange(5, 40))]
       for i in range(6)]
out.append(out[0] + [r.randrange(1024) for _ in range(20)])
for p in out:
    print(json.dumps({"tokens": p}))
EOF
}
prompts 7 "$T_DIR/p7.jsonl"
prompts 9 "$T_DIR/p9.jsonl"

# verify OUT MODE: MODE first (some requests hit, the rest save), all
# (every request loads all but its last block's worth), corrupt (request
# 0 must differ). Every diff must be within the engine's bound.
verify() {
	"$PY" - "$1" "$2" <<'EOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
mode = sys.argv[2]
assert len(rows) == 7, "expected 7 requests, got %d" % len(rows)
if mode == "corrupt":
    d = rows[0]["max_abs_diff"]
    assert rows[0]["cached_tokens"] > 0, rows[0]
    assert math.isnan(d) or d > 1e-3, "a forged block went unnoticed: %r" % d
    sys.exit(0)
for r in rows:
    d, b = r["max_abs_diff"], r["bound"]
    assert d is not None and d <= b, "request %d: diff %r > bound %r" % (
        r["request"], d, b)
    assert r["ttft_ms"] > 0 and r["ttft_full_ms"] > 0, r
if mode == "first":
    assert sum(r["saved_blocks"] for r in rows) > 0, "nothing saved"
    assert sum(r["cached_tokens"] > 0 for r in rows) >= 4, "too few hits"
else:
    for r in rows:
        want = (r["tokens"] - 1) // 16 * 16
        assert r["cached_tokens"] == want, "request %d: cached %d, want %d" % (
            r["request"], r["cached_tokens"], want)
EOF
}

# run TAG MODE PROMPTS ENGINE-ARGS...: one engine run, checked.
run() {
	local tag=$1 mode=$2 p=$3 out=$T_DIR/out.$1
	shift 3
	if ! "$ENG" --mount "$MNT" --prompts "$p" --check "$@" >"$out" 2>&1; then
		t_fail "$tag: the engine failed"
		sed 's/^/#   /' "$out" | tail -n 15
		return
	fi
	if msg=$(verify "$out" "$mode" 2>&1); then
		t_ok "$tag"
	else
		t_fail "$tag: $(tail -n 1 <<<"$msg")"
	fi
}

conf() { # DRAM_CAPACITY
	{
		printf '[daemon]\nflush_ms = 100\n\n[tier.dram]\ncapacity = %s\n\n' "$1"
		printf '[tier.gpu]\nbackend = shm\ncapacity = 8M\n\n'
		"$ENG" --print-conf f
		printf '\n'
		"$ENG" --print-conf b --dtype bf16
		printf '\n'
		"$ENG" --print-conf h --hcache "$CK"
	} >"$STORE/kvfs.conf"
}

kvfs_mkfs 64M
t_check "print-conf and the exported checkpoint" conf 16M
t_check "the checkpoint is a safetensors file" test -s "$CK/model.safetensors"
t_check "mount" kvfs_mount

t_check "the engine's keys are libkvfs's" "$PY" - "$MNT" <<'EOF'
import sys, kvfs
from kvfs_engine import core
toks = list(range(100, 150))
with kvfs.Client(sys.argv[1]) as c:
    root = c.ns_info("f").root
assert core.root_key("f") == root
assert core.chain(root, toks, 16) == kvfs.chain(root, toks, 16)
assert core.crc32c(b"123456789") == 0xe3069283
EOF

run "f32, files: first pass saves, later requests hit" first "$T_DIR/p7.jsonl" --ns f --via files
run "f32, ctl (FETCH_INTO into the engine's pages)" all "$T_DIR/p7.jsonl" --ns f --via ctl
run "f32, files by mmap" all "$T_DIR/p7.jsonl" --ns f --via files --mmap
run "bf16, ctl: first pass saves by SAVE" first "$T_DIR/p7.jsonl" --ns b --via ctl --dtype bf16
run "bf16, files" all "$T_DIR/p7.jsonl" --ns b --via files --dtype bf16
run "hcache: HIDDEN blocks saved" first "$T_DIR/p7.jsonl" --ns h --via files --hcache "$CK"
blk=$(ls "$MNT/h" | head -n 1)
t_check "hcache: blocks are stored as hidden states" \
	test "$(getfattr --only-values -n user.kvfs.stored_as "$MNT/h/$blk" 2>/dev/null)" = hidden
run "hcache: K and V rebuilt by kvfs, read as files" all "$T_DIR/p7.jsonl" --ns h --via files
run "hcache: K and V rebuilt by kvfs, FETCH_INTO" all "$T_DIR/p7.jsonl" --ns h --via ctl
t_check "unmount" kvfs_unmount

t_check "remount" kvfs_mount
run "after a remount, f32 files" all "$T_DIR/p7.jsonl" --ns f --via files
run "after a remount, f32 ctl" all "$T_DIR/p7.jsonl" --ns f --via ctl
run "after a remount, bf16 ctl" all "$T_DIR/p7.jsonl" --ns b --via ctl --dtype bf16
run "after a remount, hcache ctl" all "$T_DIR/p7.jsonl" --ns h --via ctl
t_check "unmount" kvfs_unmount

# A DRAM tier of 256 KiB holds six f32 blocks: a second prompt set
# pushes the first one's blocks out to the SSD.
conf 256K
t_check "remount with a small DRAM tier" kvfs_mount
run "small DRAM: a second prompt set saved" first "$T_DIR/p9.jsonl" --ns f --via ctl
run "small DRAM: and more" first "$T_DIR/p9.jsonl" --ns b --via files --dtype bf16
key0=$("$PY" - "$T_DIR/p7.jsonl" <<'EOF'
import json, sys
from kvfs_engine import core
t = json.loads(open(sys.argv[1]).readline())["tokens"]
print(core.chain(core.root_key("f"), t, 16)[0].hex())
EOF
)
t_check "the first prompt's first block is on the SSD only" \
	test "$(getfattr --only-values -n user.kvfs.tier "$MNT/f/$key0.kv" 2>/dev/null)" = ssd
run "from the SSD, f32 files" all "$T_DIR/p7.jsonl" --ns f --via files
t_check "evict the first prompt set from DRAM" "$PY" - "$MNT" "$T_DIR/p7.jsonl" <<'EOF'
import json, sys, kvfs
from kvfs_engine import core
with kvfs.Client(sys.argv[1]) as c:
    for l in open(sys.argv[2]):
        ks = core.chain(c.ns_info("f").root, json.loads(l)["tokens"], 16)
        try:
            c.evict("f", ks, kvfs.TIER_DRAM)
        except OSError:
            pass
EOF
run "from the SSD, f32 ctl" all "$T_DIR/p7.jsonl" --ns f --via ctl
run "from the SSD, bf16 ctl" all "$T_DIR/p7.jsonl" --ns b --via ctl --dtype bf16
t_check "unmount" kvfs_unmount

# The comparison is real: the first block of prompt 0 replaced by a
# well-formed block (valid checksums, the right key) with other KV.
conf 16M
t_check "remount" kvfs_mount
t_check "forge the first block of prompt 0 with other KV" "$PY" - "$MNT" "$key0" <<'EOF'
import os, sys, torch
from kvfs_engine import core
mnt, key = sys.argv[1], bytes.fromhex(sys.argv[2])
st = core.Store(mnt, "f")
path = st.path(key)
img = bytearray(open(path, "rb").read())
h = core.parse_header(img)
n = h["n_tokens"]
toks = list(memoryview(img)[4096:4096 + 4 * n].cast("I"))
pay = torch.frombuffer(img, dtype=torch.uint8)[st.g.payload_off(n):]
kv = pay.view(torch.float32).clone()
kv[: kv.numel() // 2] *= 1.25  # other K and V for the first layers
os.unlink(path)
st.write_block(key, h["parent"], h["start_pos"], toks,
               kv.view(torch.uint8).numpy().tobytes())
st.close()
EOF
run "a forged prefix block shows up as a difference" corrupt "$T_DIR/p7.jsonl" --ns f --via files
t_check "unmount" kvfs_unmount

t_done
