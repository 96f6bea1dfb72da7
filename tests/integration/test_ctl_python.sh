#!/usr/bin/env bash
# The Python binding (client/kvfs.py over libkvfs) against a real mount with a
# shm device pool: key chains, LOOKUP (by keys and tokens, with and without
# ACCESS), SAVE, FETCH (bytes through the pool mapping, one copy for two
# fetchers), RELEASE, leases freed by close and by kill -9 of another
# process, FETCH_INTO per layer, PIN/UNPIN, PREFETCH, EVICT, STATS, both
# transports, and the bad-input paths (the daemon stays up).
. "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=$(dirname "$BIN")/lib/libkvfs.so

kvfs_mkfs 64M
kvfs_conf 16M
cat >>"$STORE/kvfs.conf" <<EOC

[tier.gpu]
backend = shm
capacity = 8M
EOC
t_check "mount with a shm device pool" kvfs_mount
if [ ! -e "$MNT/.kvfs/ctl" ]; then
	t_ok "python client # SKIP .kvfs/ctl absent (daemon side not built)"
	t_done
	exit
fi
t_check "libkvfs.so is built ($LIB)" test -f "$LIB"
t_check "python3 is here" python3 -c 'import ctypes, mmap, fcntl'

# A sanitizer build's libkvfs.so needs its runtime loaded first; Python
# itself is not instrumented, so its leaks are not ours to report.
PY_ENV=()
asan=$(ldd "$LIB" 2>/dev/null | awk '/libasan/ { print $3 }')
if [ -n "$asan" ]; then
	PY_ENV=(LD_PRELOAD="$asan"
		ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
fi

# The module prints "PASS: what" / "FAIL: what (why)"; the harness counts.
run_py() {
	local line
	while IFS= read -r line; do
		case $line in
		PASS:*) t_ok "${line#PASS: }" ;;
		FAIL:*) t_fail "${line#FAIL: }" ;;
		*) printf '# %s\n' "$line" ;;
		esac
	done < <(env "${PY_ENV[@]}" PYTHONDONTWRITEBYTECODE=1 KVFS_LIB="$LIB" \
		PYTHONPATH="$ROOT/client" \
		MNT="$MNT" NS="$NS" BIN="$BIN" python3 - 2>&1 <<'EOF'
import errno, fcntl, os, random, struct, subprocess, sys, traceback
import kvfs

MNT, NS, BIN = os.environ["MNT"], os.environ["NS"], os.environ["BIN"]
kvfs.set_log_level(0)  # refusals are the point of some checks


def check(what, cond, why=""):
    print(("PASS: %s" if cond else "FAIL: %s" + (" (%s)" % why if why
                                                 else "")) % what,
          flush=True)


def raises(what, err, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except OSError as e:
        check(what, e.errno == err, "got %s" % errno.errorcode.get(
            e.errno, e.errno))
        return
    except Exception as e:  # noqa
        check(what, False, "raised %r" % e)
        return
    check(what, False, "succeeded")


def xattr(path, name):
    try:
        return os.getxattr(path, name).decode().strip()
    except OSError:
        return None


def blockpath(k):
    return os.path.join(MNT, NS, k.hex() + ".kv")


try:
    c = kvfs.Client(MNT)
    info = c.ns_info(NS)
    check("ns_info reads the geometry", info.n_layers == 4 and
          info.block_tokens == 16 and info.chunk_tokens == 4 and
          info.dtype == "bf16", repr(info))
    check("root key: xattr == kvfs.root_key", info.root ==
          kvfs.root_key(NS) and info.root.hex() ==
          xattr(os.path.join(MNT, NS), "user.kvfs.root"))

    bt, L = info.block_tokens, info.n_layers
    PAY = 2 * L * bt * info.n_kv_heads * info.head_dim * 2  # K+V, bf16
    LB = PAY // L
    rnd = random.Random(7)
    toks = [rnd.randrange(128256) for _ in range(6 * bt + 5)]
    keys = kvfs.chain(info.root, toks, bt)
    check("chain: 6 full blocks, tail ignored", len(keys) == 6)
    tail = kvfs.chain(info.root, toks, bt, partial=True)
    check("chain: partial tail gets a 7th key", len(tail) == 7 and
          tail[:6] == keys)
    out = subprocess.run([BIN + "/kvfs-gen", "key", "--ns", NS,
                          "--block-tokens", str(bt), "--tokens",
                          ",".join(map(str, toks[:2 * bt]))],
                         capture_output=True, text=True)
    check("chain agrees with kvfs-gen key",
          keys[1].hex() in out.stdout.split(), out.stdout + out.stderr)

    h = c.lookup(NS, keys)
    check("lookup of an empty namespace: 0 cached", h.n_cached == 0 and
          len(h.blocks) == 6 and all(b.tiers == 0 for b in h.blocks))

    # SAVE the first 4 blocks from a shm region of ours
    peer = kvfs.Peer(8 * PAY)
    payloads = [bytes(rnd.randrange(256) for _ in range(64)) * (PAY // 64)
                for _ in range(6)]
    parent = info.root
    for i in range(4):
        peer.buf[i * PAY:(i + 1) * PAY] = payloads[i]
        k = c.save(NS, parent, i * bt, toks[i * bt:(i + 1) * bt], peer,
                   i * PAY)
        check("save block %d returns its chained key" % i, k == keys[i])
        parent = k
    check("saved blocks are files", all(os.path.exists(blockpath(k))
                                        for k in keys[:4]))
    raises("save of an existing block: EEXIST", errno.EEXIST, c.save, NS,
           info.root, 0, toks[:bt], peer, 0)
    raises("save with a wrong start_pos: EINVAL", errno.EINVAL, c.save, NS,
           keys[3], 3, toks[4 * bt:5 * bt], peer, 0)
    raises("save from past the region's end: EINVAL", errno.EINVAL,
           c.save, NS, keys[3], 4 * bt, toks[4 * bt:5 * bt], peer, 7 * PAY + 1)

    h = c.lookup(NS, keys)
    check("lookup: 4 of 6 cached", h.n_cached == 4, repr(h))
    check("lookup: tiers of cached blocks include dram",
          all(b.tiers & (1 << kvfs.TIER_DRAM) for b in h.blocks[:4]) and
          h.blocks[4].tiers == 0)
    ht = c.lookup(NS, tokens=toks)
    check("lookup by tokens == by keys", ht.n_cached == 4 and
          [b.key for b in ht.blocks] == keys)

    hits0 = xattr(blockpath(keys[0]), "user.kvfs.hits")
    for _ in range(3):
        c.lookup(NS, keys)
    check("a plain lookup counts no hit",
          xattr(blockpath(keys[0]), "user.kvfs.hits") == hits0)
    c.lookup(NS, keys, access=True)
    check("lookup with access counts a hit",
          int(xattr(blockpath(keys[0]), "user.kvfs.hits")) > int(hits0))

    # FETCH: leased, the bytes through the read-only pool mapping
    f = c.fetch(NS, keys[:4])
    check("fetch: 4 blocks in the shm pool", len(f.blocks) == 4 and
          f.pool.backend == kvfs.BACKEND_SHM and f.pool.size == 8 << 20)
    check("fetch: pool bytes == saved payloads",
          all(bytes(b.data) == payloads[i] for i, b in enumerate(f.blocks)))
    check("fetch: layer views", bytes(f.blocks[2].layer(1)) ==
          payloads[2][LB:2 * LB])
    check("fetch: blocks report gpu residency",
          all(b.tiers & 1 for b in c.lookup(NS, keys[:4]).blocks))
    st = c.stats(NS)
    check("stats: 4 leases on this client", st["leases"] == 4 and
          st["leases_total"] == 4, repr(st))
    check("user.kvfs.leases of a fetched block is 1",
          xattr(blockpath(keys[0]), "user.kvfs.leases") == "1")
    raises("evict of a leased block: EBUSY", errno.EBUSY, c.evict, NS,
           [keys[3]], kvfs.TIER_ALL)

    c2 = kvfs.Client(MNT)
    used = c2.stats(NS)["pool_used"]
    f2 = c2.fetch(NS, keys[:4])
    check("two fetchers of one prefix share one copy",
          [b.pool_off for b in f2.blocks] == [b.pool_off for b in f.blocks]
          and c2.stats(NS)["pool_used"] == used)
    check("each client counts its own leases",
          c2.stats(NS)["leases"] == 4 and c2.stats(NS)["leases_total"] == 8)
    c2.close()
    check("close gives the closing client's leases back",
          c.stats(NS)["leases_total"] == 4)

    c.release(NS, keys[:2])
    check("release of 2 keys", c.stats(NS)["leases"] == 2)
    c.release(NS)
    check("release of all", c.stats(NS)["leases"] == 0 and
          xattr(blockpath(keys[0]), "user.kvfs.leases") == "0")
    f3 = c.fetch(NS, tokens=toks[:4 * bt + 3])
    check("fetch by tokens: the 4 full blocks, same bytes",
          f3.keys == keys[:4] and bytes(f3.blocks[3].data) == payloads[3])
    c.release(NS, f3.keys)
    check("released by the keys fetch returned", c.stats(NS)["leases"] == 0)
    raises("fetch of a missing key: ENOENT", errno.ENOENT, c.fetch, NS,
           keys[:6])
    check("a failed fetch holds no lease", c.stats(NS)["leases"] == 0)

    # kill -9 of a process holding leases gives them back
    child = subprocess.Popen([sys.executable, "-c", """
import sys, kvfs
c = kvfs.Client(sys.argv[1])
f = c.fetch(sys.argv[2], [bytes.fromhex(k) for k in sys.argv[3:]])
print(len(f.blocks), flush=True)
sys.stdin.read()
""", MNT, NS] + [k.hex() for k in keys[:3]], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    got = child.stdout.readline().strip()
    check("another process fetches", got == "3", got)
    check("its leases show here", c.stats(NS)["leases_total"] == 3 and
          c.stats(NS)["leases"] == 0)
    child.kill()
    child.wait()
    check("kill -9 gives its leases back",
          c.stats(NS)["leases_total"] == 0)

    # FETCH_INTO: blocks in reverse order in our region, per layer
    sync = kvfs.Sync()
    dst = [(3 - i) * PAY for i in range(4)]
    peer.buf[:] = bytes(len(peer.buf))
    job = c.fetch_into_async(NS, keys[:4], peer, dst, sync)
    ok = True
    for l in range(L):
        sync.wait_layer(l, timeout=60)
        for i in range(4):
            at = dst[i] + l * LB
            ok = ok and bytes(peer.buf[at:at + LB]) == \
                payloads[i][l * LB:(l + 1) * LB]
    blocks = job.join()
    check("fetch_into: every layer right once signalled", ok)
    check("fetch_into: sync word counts all layers", sync.value == L)
    check("fetch_into: blocks and layer_bytes", len(blocks) == 4 and
          blocks[0].layer_bytes == LB and blocks[0].len == PAY)
    check("fetch_into leaves no lease", c.stats(NS)["leases"] == 0)
    blocks = c.fetch_into(NS, keys[:1], peer, [7 * PAY], sync)
    check("fetch_into (blocking)", bytes(peer.buf[7 * PAY:8 * PAY]) ==
          payloads[0] and sync.value == L)
    raises("fetch_into past the region's end: EINVAL", errno.EINVAL,
           c.fetch_into, NS, keys[:1], peer, [7 * PAY + 1], sync)
    raises("fetch_into of a missing key: ENOENT", errno.ENOENT,
           c.fetch_into, NS, keys[4:5], peer, [0], sync)
    ghost = kvfs.CtlMem(backend=kvfs.BACKEND_SHM, size=PAY,
                        shm_name=b"/kvfs-no-such-peer")
    raises("fetch_into a peer that does not exist: ENOENT", errno.ENOENT,
           c.fetch_into, NS, keys[:1], ghost, [0], sync)
    cuda = kvfs.CtlMem.cuda(bytes(range(64)), PAY, device=1)
    check("CtlMem.cuda fills the struct",
          cuda.backend == kvfs.BACKEND_CUDA and cuda.device == 1 and
          cuda.size == PAY and bytes(cuda.ipc) == bytes(range(64)))
    try:
        kvfs.CtlMem.cuda(b"x" * 63, PAY)
        check("CtlMem.cuda refuses a short handle", False, "accepted")
    except ValueError:
        check("CtlMem.cuda refuses a short handle", True)
    raises("fetch_into a cuda handle on a shm pool: EINVAL", errno.EINVAL,
           c.fetch_into, NS, keys[:1], cuda, [0], sync)

    # PIN / UNPIN / PREFETCH / EVICT
    c.pin(NS, keys[:2], kvfs.TIER_DRAM)
    check("pin shows in user.kvfs.pin",
          xattr(blockpath(keys[1]), "user.kvfs.pin") == "dram")
    c.unpin(NS, keys[:2], kvfs.TIER_DRAM)
    check("unpin removes it",
          xattr(blockpath(keys[1]), "user.kvfs.pin") is None)
    # (lru, this mount's policy, plans no promotions that could undo it)
    c.evict(NS, [keys[3]], kvfs.TIER_GPU)
    check("evict from gpu keeps the block",
          os.path.exists(blockpath(keys[3])) and
          not c.lookup(NS, [keys[3]]).blocks[0].tiers & 1)
    c.evict(NS, [keys[3]], kvfs.TIER_ALL)
    # (readdir, not stat: the kernel may keep the name's dentry for the
    # mount's entry timeout)
    listed = keys[3].hex() + ".kv" in os.listdir(os.path.join(MNT, NS))
    h = c.lookup(NS, keys)
    check("evict from all tiers deletes it", not listed and
          h.n_cached == 3, "still listed: %s, n_cached %d" % (listed,
                                                            h.n_cached))
    # a hint: returns at once, missing keys ignored
    c.prefetch(NS, keys[:2] + keys[4:5], kvfs.TIER_GPU)
    check("prefetch accepted", True)
    raises("prefetch to ssd: EINVAL", errno.EINVAL, c.prefetch, NS,
           keys[:1], kvfs.TIER_SSD)
    st = c.stats(NS)
    check("stats count saves and fetches", st["saves"] >= 4 and
          st["fetches"] >= 2 and st["fetch_into_bytes"] >= 5 * PAY, repr(st))

    # both transports carry the same request
    r1, b1 = c.call(kvfs.LOOKUP, NS, keys=keys, xport=kvfs.XPORT_IOCTL)
    r2, b2 = c.call(kvfs.LOOKUP, NS, keys=keys, xport=kvfs.XPORT_RW)
    check("lookup by ioctl == by write-then-read",
          r1.n_cached == r2.n_cached == 3 and
          [b.key for b in b1] == [b.key for b in b2])
    many = keys[:3] + [os.urandom(16) for _ in range(297)]
    h = c.lookup(NS, many)
    check("300-key lookup goes write-then-read", c.last_xport ==
          kvfs.XPORT_RW and h.n_cached == 3 and len(h.blocks) == 300)
    h = c.lookup(NS, tokens=toks + [1] * 3000)
    check("3000-token lookup goes write-then-read",
          c.last_xport == kvfs.XPORT_RW and h.n_cached == 3)
    h = c.lookup(NS, keys[:3])
    check("a small lookup goes by ioctl",
          c.last_xport == kvfs.XPORT_IOCTL and h.n_cached == 3)

    # bad input: refused, logged, and the daemon stays up
    raises("unknown namespace: ENOENT", errno.ENOENT, c.lookup, "nope",
           keys)
    fd = os.open(os.path.join(MNT, ".kvfs", "ctl"), os.O_RDWR)
    raises("garbage written to ctl: EINVAL", errno.EINVAL, os.write, fd,
           b"not a request")
    check("a read with no response pending returns nothing",
          os.read(fd, 4096) == b"")
    IOC = lambda op, size=8192: (3 << 30) | (size << 16) | (ord("K") << 8) \
        | (0x40 + op)
    msg = bytearray(8192)
    struct.pack_into("<IHHI", msg, 0, 0xdeadbeef, 1, kvfs.LOOKUP, 384)
    raises("ioctl with a bad magic: EINVAL", errno.EINVAL, fcntl.ioctl, fd,
           IOC(kvfs.LOOKUP), msg)
    raises("ioctl of an unknown size: ENOTTY", errno.ENOTTY, fcntl.ioctl, fd,
           IOC(kvfs.LOOKUP, 16), bytearray(16))
    raises("ioctl of an unknown op: ENOTTY", errno.ENOTTY, fcntl.ioctl, fd,
           IOC(40), msg)
    req = bytearray(384)
    struct.pack_into("<IHHII", req, 0, 0x5443564b, 1, kvfs.STATS, 384, 0)
    req[16:16 + len(NS)] = NS.encode()
    req[350] = 1  # a reserved byte (344..383)
    raises("a request with reserved bytes set: EINVAL", errno.EINVAL,
           os.write, fd, bytes(req))
    os.close(fd)
    check("the daemon is still up", c.lookup(NS, keys).n_cached == 3)
    c.close()
    try:
        c.stats(NS)
        check("a closed client refuses", False, "succeeded")
    except ValueError:
        check("a closed client refuses", True)
    peer.close()
    sync.close()
except Exception:
    check("python client ran to the end", False,
          traceback.format_exc().replace("\n", " | "))
EOF
)
}
run_py
t_check "daemon alive after the python client" test -d "$MNT/$NS"

# The example engine on the same mount: files in, SAVE in, both loads.
t_check "kvfs-engine: files, fetch + fetch_into, every byte checked" \
	"$BIN/kvfs-engine" "$MNT" --ns "$NS" --requests 24 --prefixes 4 \
	--blocks 6 --shared 2 --seed 11 --quiet
t_check "kvfs-engine: SAVE, fetch + fetch_into, every byte checked" \
	"$BIN/kvfs-engine" "$MNT" --ns "$NS" --requests 24 --prefixes 4 \
	--blocks 6 --shared 2 --seed 12 --store save --quiet
t_done
