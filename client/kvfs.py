# SPDX-License-Identifier: MIT
"""kvfs: talk to a mounted kvfs from Python (an engine's KV connector).

A thin binding of libkvfs (client/libkvfs.h) through ctypes, standard library
only. It loads ``libkvfs.so`` on first use, from (in order) ``$KVFS_LIB``,
``$KVFS_BUILD/lib/libkvfs.so``, ``build/lib/libkvfs.so`` next to this
source tree, and the system's library path; if none exists every call
raises :class:`LibraryNotFound` saying where it looked (``make`` builds
it). Importing this module never fails for that reason.

Keys are 16-byte ``bytes`` (a 32-character hex ``str`` is accepted
wherever a key goes in). Token ids are ints (u32). Every call that fails
raises ``OSError`` with the errno the daemon or the transport gave
(``ENOENT`` for an unknown namespace or key, ``ENOSPC``, ``EBUSY``,
``EPROTO`` for a response that breaks the ABI ...).

Example::

    import kvfs
    with kvfs.Client("/mnt/kvfs") as c:
        info = c.ns_info("llama3-8b")
        keys = kvfs.chain(info.root, tokens, info.block_tokens)
        hit = c.lookup("llama3-8b", keys)          # hit.n_cached
        f = c.fetch("llama3-8b", keys[:hit.n_cached])
        for b in f.blocks:                         # shm: b.data is a
            consume(b.data)                        # read-only memoryview
        c.release("llama3-8b", keys[:hit.n_cached])

Per-layer loading (the shape of vLLM's ``wait_for_layer_load``)::

    peer, sync = kvfs.Peer(nbytes), kvfs.Sync()
    job = c.fetch_into_async(ns, keys, peer, offsets, sync)
    for layer in range(n_layers):
        sync.wait_layer(layer)      # layer is in peer.buf now
        ...
    blocks = job.join()
"""

import array
import ctypes
import ctypes.util
import os

__all__ = [
    "Client", "Peer", "Sync", "Job", "Block", "Lookup", "Fetch", "NsInfo",
    "LibraryNotFound", "root_key", "chain", "key_hex", "key_bytes",
    "set_log_level", "library_path",
    "LOOKUP", "FETCH", "FETCH_INTO", "SAVE", "RELEASE", "PIN", "UNPIN",
    "PREFETCH", "EVICT", "STATS", "F_ACCESS", "F_TOKENS", "F_REMOTE",
    "TIER_GPU",
    "TIER_DRAM", "TIER_SSD", "TIER_ALL", "BACKEND_SHM", "BACKEND_CUDA",
    "XPORT_AUTO", "XPORT_IOCTL", "XPORT_RW", "SYNC_FAILED", "KEY_LEN",
]

KEY_LEN = 16
NS_MAX = 64
NAME_MAX = 64
CLIENT_VERSION = 1

# enum kvfs_ctl_op
LOOKUP, FETCH, FETCH_INTO, SAVE, RELEASE = 1, 2, 3, 4, 5
PIN, UNPIN, PREFETCH, EVICT, STATS = 6, 7, 8, 9, 10
# enum kvfs_ctl_flags
F_ACCESS = 1 << 0
F_TOKENS = 1 << 1
F_REMOTE = 1 << 4
# enum kvfs_client_tier
TIER_GPU, TIER_DRAM, TIER_SSD, TIER_ALL = 0, 1, 2, 3
# enum kvfs_ctl_backend
BACKEND_SHM, BACKEND_CUDA = 1, 2
# enum kvfs_client_xport
XPORT_AUTO, XPORT_IOCTL, XPORT_RW = 0, 1, 2
SYNC_FAILED = 0x80000000

_DTYPES = {1: "f16", 2: "bf16", 3: "f32", 4: "f8_e4m3"}


class LibraryNotFound(RuntimeError):
    """libkvfs.so could not be loaded (build it with ``make``)."""


# ------------------------------------------------------------ ABI structs

_u8, _u16, _u32, _u64 = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32,
                         ctypes.c_uint64)


class CtlMem(ctypes.Structure):
    """struct kvfs_ctl_mem: the daemon's pool or a caller's memory."""
    _fields_ = [("backend", _u32), ("device", _u32), ("size", _u64),
                ("shm_name", ctypes.c_char * NAME_MAX),
                ("ipc", _u8 * 64)]

    @classmethod
    def cuda(cls, handle, size, device=0):
        """A caller's device memory, for a cuda tier: the 64 bytes of the
        cudaIpcMemHandle_t of the allocation, its size and device ordinal.

        Offsets in requests count from the start of that allocation. In
        PyTorch, ``t.untyped_storage()._share_cuda_()`` gives the handle
        of the caching allocator's block that holds ``t``, and the offset
        of ``t``'s storage inside it.
        """
        handle = bytes(handle)
        if len(handle) != 64:
            raise ValueError("a cudaIpcMemHandle_t is 64 bytes")
        if size <= 0 or device < 0:
            raise ValueError("size must be > 0 and device >= 0")
        m = cls(backend=BACKEND_CUDA, device=device, size=size)
        ctypes.memmove(m.ipc, handle, 64)
        return m


class CtlSync(ctypes.Structure):
    """struct kvfs_ctl_sync: where FETCH_INTO's completion word lives."""
    _fields_ = [("shm_name", ctypes.c_char * NAME_MAX), ("off", _u64)]


class CtlBlock(ctypes.Structure):
    """struct kvfs_ctl_block."""
    _fields_ = [("key", _u8 * KEY_LEN), ("tiers", _u32),
                ("n_tokens", _u32), ("pool_off", _u64), ("len", _u64),
                ("layer_bytes", _u64)]


_STATS_FIELDS = ["leases", "leases_total", "leases_reclaimed",
                 "pool_capacity", "pool_used", "pool_blocks", "fetches",
                 "fetch_bytes", "fetch_into_bytes", "saves"]


class CtlStats(ctypes.Structure):
    """struct kvfs_ctl_stats."""
    _fields_ = [(n, _u64) for n in _STATS_FIELDS] + [("reserved", _u64 * 6)]


class CtlResp(ctypes.Structure):
    """struct kvfs_ctl_resp (the header of a response)."""
    _fields_ = [("magic", _u32), ("abi", _u16), ("op", _u16),
                ("size", _u32), ("error", ctypes.c_int32),
                ("n_blocks", _u32), ("n_cached", _u32),
                ("key", _u8 * KEY_LEN), ("pool", CtlMem),
                ("stats", CtlStats), ("reserved", _u8 * 40)]


class _Geom(ctypes.Structure):
    _fields_ = [("n_layers", _u32), ("n_kv_heads", _u32),
                ("head_dim", _u32), ("hidden_size", _u32),
                ("block_tokens", _u32), ("chunk_tokens", _u32),
                ("dtype", _u16)]


class _ClientNs(ctypes.Structure):
    _fields_ = [("root", _u8 * KEY_LEN), ("geom", _Geom)]


class _ClientBlocks(ctypes.Structure):
    _fields_ = [("resp", CtlResp), ("blocks", ctypes.POINTER(CtlBlock)),
                ("data", ctypes.POINTER(ctypes.c_void_p))]


class _ClientPeer(ctypes.Structure):
    _fields_ = [("mem", CtlMem), ("base", ctypes.c_void_p),
                ("fd", ctypes.c_int)]


class _ClientSync(ctypes.Structure):
    _fields_ = [("desc", CtlSync), ("word", ctypes.POINTER(_u32)),
                ("fd", ctypes.c_int)]


class _ClientReq(ctypes.Structure):
    _fields_ = [("op", _u32), ("flags", _u32), ("ns", ctypes.c_char_p),
                ("tier", _u32), ("xport", _u32),
                ("keys", ctypes.c_void_p), ("n_keys", ctypes.c_size_t),
                ("tokens", ctypes.c_void_p), ("n_tokens", ctypes.c_size_t),
                ("dst_off", ctypes.c_void_p),
                ("peer", ctypes.POINTER(CtlMem)),
                ("sync", ctypes.POINTER(CtlSync)),
                ("src_off", _u64), ("start_pos", _u64),
                ("parent", ctypes.c_void_p), ("max_blocks", _u32)]


# sizes the C header fixes (meta/kvfs_ctl.h _Static_asserts)
_CTL_SIZES = {CtlMem: 144, CtlSync: 72, CtlBlock: 48, CtlStats: 128,
              CtlResp: 352}
# struct -> enum kvfs_client_struct, checked against the loaded library
_LIB_STRUCTS = {_ClientBlocks: 1, _ClientPeer: 2, _ClientSync: 3,
                _ClientNs: 4, _ClientReq: 5}

# ---------------------------------------------------------------- loading

_lib = None
_lib_path = None


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    paths = []
    if os.environ.get("KVFS_LIB"):
        paths.append(os.environ["KVFS_LIB"])
    if os.environ.get("KVFS_BUILD"):
        paths.append(os.path.join(os.environ["KVFS_BUILD"], "lib",
                                  "libkvfs.so"))
    paths.append(os.path.join(here, "..", "build", "lib", "libkvfs.so"))
    found = ctypes.util.find_library("kvfs")
    if found:
        paths.append(found)
    return paths


def _proto(lib, name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)


def _load():
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    lib = None
    for p in _candidates():
        if os.sep in p and not os.path.exists(p):
            tried.append(p + " (missing)")
            continue
        try:
            lib = ctypes.CDLL(p, use_errno=True)
            _lib_path = p
            break
        except OSError as e:
            tried.append("%s (%s)" % (p, e))
    if lib is None:
        raise LibraryNotFound(
            "kvfs: cannot load libkvfs.so; tried: %s. Build it with `make` "
            "(it lands in build/lib/) or point $KVFS_LIB at it."
            % "; ".join(tried))
    for cls, size in _CTL_SIZES.items():
        if ctypes.sizeof(cls) != size:
            raise LibraryNotFound("kvfs: %s is %d bytes here, the ABI "
                                  "says %d" % (cls.__name__,
                                               ctypes.sizeof(cls), size))
    P, I, U32, U64, SZ = (ctypes.c_void_p, ctypes.c_int, _u32, _u64,
                          ctypes.c_size_t)
    CP = ctypes.c_char_p
    _proto(lib, "kvfs_client_sizeof", SZ, I)
    for cls, which in _LIB_STRUCTS.items():
        theirs = lib.kvfs_client_sizeof(which)
        if theirs != ctypes.sizeof(cls):
            raise LibraryNotFound(
                "kvfs: %s (%s) does not match this module: struct %d is "
                "%d bytes there, %d here" % (_lib_path, "libkvfs", which,
                                             theirs, ctypes.sizeof(cls)))
    _proto(lib, "kvfs_client_root_key", None, CP, CP, P)
    _proto(lib, "kvfs_client_root_key_model", None, CP, CP, CP, P)
    _proto(lib, "kvfs_client_chain", I, P, P, SZ, U32, ctypes.c_uint, P, SZ,
           ctypes.POINTER(SZ))
    _proto(lib, "kvfs_client_chain_len", SZ, SZ, U32, ctypes.c_uint)
    _proto(lib, "kvfs_client_open", I, CP, ctypes.POINTER(P))
    _proto(lib, "kvfs_client_close", None, P)
    _proto(lib, "kvfs_client_ns_info", I, P, CP, ctypes.POINTER(_ClientNs))
    _proto(lib, "kvfs_client_blocks_release", None,
           ctypes.POINTER(_ClientBlocks))
    BL = ctypes.POINTER(_ClientBlocks)
    _proto(lib, "kvfs_client_lookup", I, P, CP, P, SZ, ctypes.c_uint, BL)
    _proto(lib, "kvfs_client_lookup_tokens", I, P, CP, P, SZ,
           ctypes.c_uint, BL)
    _proto(lib, "kvfs_client_fetch", I, P, CP, P, SZ, BL)
    _proto(lib, "kvfs_client_fetch_tokens", I, P, CP, P, SZ, BL)
    _proto(lib, "kvfs_client_fetch_into", I, P, CP, P, SZ,
           ctypes.POINTER(CtlMem), P, ctypes.POINTER(_ClientSync), BL)
    _proto(lib, "kvfs_client_fetch_into_start", I, P, CP, P, SZ,
           ctypes.POINTER(CtlMem), P, ctypes.POINTER(_ClientSync),
           ctypes.POINTER(P))
    _proto(lib, "kvfs_client_job_join", I, P, BL)
    _proto(lib, "kvfs_client_save", I, P, CP, P, U64, P, SZ,
           ctypes.POINTER(CtlMem), U64, P)
    for name in ("kvfs_client_pin", "kvfs_client_unpin",
                 "kvfs_client_prefetch", "kvfs_client_evict"):
        _proto(lib, name, I, P, CP, P, SZ, ctypes.c_int)
    _proto(lib, "kvfs_client_release", I, P, CP, P, SZ)
    _proto(lib, "kvfs_client_stats", I, P, CP, ctypes.POINTER(CtlStats))
    _proto(lib, "kvfs_client_peer_init", I, ctypes.POINTER(_ClientPeer), U64)
    _proto(lib, "kvfs_client_peer_release", None,
           ctypes.POINTER(_ClientPeer))
    _proto(lib, "kvfs_client_sync_init", I, ctypes.POINTER(_ClientSync))
    _proto(lib, "kvfs_client_sync_release", None,
           ctypes.POINTER(_ClientSync))
    _proto(lib, "kvfs_client_sync_load", U32, ctypes.POINTER(_ClientSync))
    _proto(lib, "kvfs_client_sync_reset", None, ctypes.POINTER(_ClientSync))
    _proto(lib, "kvfs_client_wait_layer", I, ctypes.POINTER(_ClientSync),
           U32, ctypes.c_int64)
    _proto(lib, "kvfs_client_call", I, P, ctypes.POINTER(_ClientReq), BL)
    _proto(lib, "kvfs_client_last_xport", I, P)
    _proto(lib, "kvfs_log_set_level", None, I)
    _lib = lib
    return lib


def library_path():
    """The path libkvfs.so was loaded from (loading it if needed)."""
    _load()
    return _lib_path


def set_log_level(level):
    """libkvfs's log level: 0 err, 1 warn (refused arguments), 2 info."""
    _load().kvfs_log_set_level(int(level))


def _check(rc):
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return rc


# ------------------------------------------------------------- arguments

def key_bytes(k):
    """A key as 16 bytes, from bytes-like or 32 hex characters."""
    if isinstance(k, str):
        k = bytes.fromhex(k)
    k = bytes(k)
    if len(k) != KEY_LEN:
        raise ValueError("a key is %d bytes, not %d" % (KEY_LEN, len(k)))
    return k


def key_hex(k):
    """A key as 32 lowercase hex characters."""
    return key_bytes(k).hex()


def _ns(ns):
    if ns is None:
        return None
    b = ns.encode() if isinstance(ns, str) else bytes(ns)
    return b


def _keys(keys):
    """(buffer, count): keys packed back to back, for a const u8 (*)[16]."""
    if keys is None:
        return None, 0
    if isinstance(keys, (bytes, bytearray, str)):
        keys = [keys]
    raw = b"".join(key_bytes(k) for k in keys)
    n = len(raw) // KEY_LEN
    if not n:
        return None, 0
    return ctypes.create_string_buffer(raw, len(raw)), n


def _tokens(tokens):
    if tokens is None:
        return None, 0
    a = tokens if (isinstance(tokens, array.array) and
                   tokens.typecode == "I" and tokens.itemsize == 4) \
        else array.array("I", tokens)
    if not len(a):
        return None, 0
    return (ctypes.c_uint32 * len(a)).from_buffer(a), len(a)


def _u64s(vals):
    a = array.array("Q", vals)
    if not len(a):
        return None, 0
    return (ctypes.c_uint64 * len(a)).from_buffer(a), len(a)


def _mem(peer):
    if isinstance(peer, Peer):
        return ctypes.pointer(peer._p.mem)
    if isinstance(peer, CtlMem):
        return ctypes.pointer(peer)
    raise TypeError("peer must be a kvfs.Peer or a kvfs.CtlMem")


# ---------------------------------------------------------------- chains

def root_key(ns, salt=None, model_digest=None):
    """The root key of namespace ``ns`` (with ``salt`` and the namespace's
    ``model_digest`` value, if any): 16 bytes. With ``model_digest = auto``
    the daemon computes the value: read ``Client.ns_info(ns).root``."""
    out = ctypes.create_string_buffer(KEY_LEN)
    if model_digest:
        _load().kvfs_client_root_key_model(_ns(ns), _ns(salt),
                                           _ns(model_digest), out)
    else:
        _load().kvfs_client_root_key(_ns(ns), _ns(salt), out)
    return out.raw


def chain(parent, tokens, block_tokens, partial=False):
    """Block keys of ``tokens`` chained from ``parent``.

    ``parent`` is the namespace root for tokens from position 0, else the
    key of the block before ``tokens[0]``. One key per full block of
    ``block_tokens``; with ``partial`` a trailing partial block gets one
    too. Returns a list of 16-byte keys.
    """
    lib = _load()
    flags = 1 if partial else 0
    toks, n = _tokens(tokens)
    count = lib.kvfs_client_chain_len(n, block_tokens, flags)
    out = ctypes.create_string_buffer(max(count, 1) * KEY_LEN)
    got = ctypes.c_size_t()
    _check(lib.kvfs_client_chain(key_bytes(parent), toks, n, block_tokens,
                                 flags, out, count, ctypes.byref(got)))
    raw = out.raw
    return [raw[i * KEY_LEN:(i + 1) * KEY_LEN] for i in range(got.value)]


# ---------------------------------------------------------------- results

class Block:
    """One block of a response.

    ``key`` (bytes), ``tiers`` (bit t: resident in tier t), ``n_tokens``,
    ``pool_off``, ``len`` (payload bytes), ``layer_bytes``, and ``data``:
    for FETCH on the shm backend a read-only memoryview of the payload in
    the pool (valid while the client is open; stable while leased), else
    None.
    """
    __slots__ = ("key", "tiers", "n_tokens", "pool_off", "len",
                 "layer_bytes", "data")

    def __init__(self, b, data=None):
        self.key = bytes(b.key)
        self.tiers = b.tiers
        self.n_tokens = b.n_tokens
        self.pool_off = b.pool_off
        self.len = b.len
        self.layer_bytes = b.layer_bytes
        self.data = data

    def layer(self, l):
        """The bytes of layer ``l`` of the payload (a memoryview)."""
        if self.data is None:
            raise ValueError("no pool mapping for this block")
        return self.data[l * self.layer_bytes:(l + 1) * self.layer_bytes]

    def __repr__(self):
        return "Block(%s, tiers=%#x, n_tokens=%d, len=%d)" % (
            self.key.hex(), self.tiers, self.n_tokens, self.len)


class Lookup:
    """LOOKUP's answer: ``n_cached`` leading blocks, and ``blocks``."""
    __slots__ = ("n_cached", "blocks")

    def __init__(self, n_cached, blocks):
        self.n_cached = n_cached
        self.blocks = blocks

    def __repr__(self):
        return "Lookup(n_cached=%d, blocks=%d)" % (self.n_cached,
                                                   len(self.blocks))


class Fetch:
    """FETCH's answer: leased ``blocks`` and the ``pool`` (a CtlMem)."""
    __slots__ = ("blocks", "pool", "n_cached", "_client")

    def __init__(self, blocks, pool, n_cached, client):
        self.blocks = blocks
        self.pool = pool
        self.n_cached = n_cached
        self._client = client  # keeps the pool mapping alive

    @property
    def keys(self):
        return [b.key for b in self.blocks]

    def __repr__(self):
        return "Fetch(%d blocks, pool %s)" % (
            len(self.blocks), self.pool.shm_name.decode() or "cuda")


class NsInfo:
    """A namespace's root key and geometry (from its xattrs)."""
    __slots__ = ("root", "n_layers", "n_kv_heads", "head_dim",
                 "hidden_size", "block_tokens", "chunk_tokens", "dtype")

    def __init__(self, n):
        self.root = bytes(n.root)
        g = n.geom
        self.n_layers = g.n_layers
        self.n_kv_heads = g.n_kv_heads
        self.head_dim = g.head_dim
        self.hidden_size = g.hidden_size
        self.block_tokens = g.block_tokens
        self.chunk_tokens = g.chunk_tokens
        self.dtype = _DTYPES.get(g.dtype, str(g.dtype))

    def __repr__(self):
        return ("NsInfo(root=%s, layers=%d, kv_heads=%d, head_dim=%d, "
                "dtype=%s, block_tokens=%d, chunk_tokens=%d)" % (
                    self.root.hex(), self.n_layers, self.n_kv_heads,
                    self.head_dim, self.dtype, self.block_tokens,
                    self.chunk_tokens))


def _blocks(out, with_data=False):
    n = out.resp.n_blocks
    res = []
    for i in range(n):
        b = out.blocks[i]
        data = None
        if with_data and out.data:
            ptr = out.data[i]
            data = memoryview((ctypes.c_ubyte * b.len).from_address(ptr)) \
                .cast("B").toreadonly()
        res.append(Block(b, data))
    return res


# ------------------------------------------------------- peers and syncs

class _Closing:
    """``with`` support and a best-effort close at collection, for the
    classes that own a native resource (they define ``close()``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Peer(_Closing):
    """A POSIX shm region of this process's for FETCH_INTO and SAVE.

    ``buf`` is a writable memoryview of its ``size`` bytes; ``mem`` is
    what requests carry. ``close()`` (or leaving a ``with``) unmaps and
    unlinks it.
    """

    def __init__(self, size):
        lib = _load()
        self._p = _ClientPeer()
        _check(lib.kvfs_client_peer_init(ctypes.byref(self._p), size))
        self.size = size
        self.buf = memoryview(
            (ctypes.c_ubyte * size).from_address(self._p.base)).cast("B")

    @property
    def mem(self):
        return self._p.mem

    @property
    def name(self):
        return self._p.mem.shm_name.decode()

    def close(self):
        if self._p is not None:
            self.buf.release()
            _load().kvfs_client_peer_release(ctypes.byref(self._p))
            self._p = None


class Sync(_Closing):
    """FETCH_INTO's completion word (a one-page shm object of its own)."""

    def __init__(self):
        lib = _load()
        self._s = _ClientSync()
        _check(lib.kvfs_client_sync_init(ctypes.byref(self._s)))

    @property
    def value(self):
        """Layers complete so far, or SYNC_FAILED | failed layer."""
        return _load().kvfs_client_sync_load(ctypes.byref(self._s))

    def reset(self):
        """Set the word to 0 (fetch_into does it before each request)."""
        _load().kvfs_client_sync_reset(ctypes.byref(self._s))

    def wait_layer(self, layer, timeout=None):
        """Block until ``layer`` (0-based) is copied.

        ``timeout`` in seconds (None: forever). Raises OSError ETIMEDOUT,
        or EIO when the copy failed at or before ``layer``. The GIL is
        released while waiting.
        """
        ns = -1 if timeout is None else int(timeout * 1e9)
        _check(_load().kvfs_client_wait_layer(ctypes.byref(self._s), layer,
                                              ns))

    def close(self):
        if self._s is not None:
            _load().kvfs_client_sync_release(ctypes.byref(self._s))
            self._s = None


class Job:
    """A FETCH_INTO running on a thread of libkvfs's: ``join()`` it."""

    def __init__(self, handle, keep):
        self._h = handle
        self._keep = keep  # the peer and sync must outlive the copy

    def join(self):
        """Wait for the copy; returns its blocks, raises its error."""
        if self._h is None:
            raise ValueError("job already joined")
        out = _ClientBlocks()
        lib = _load()
        rc = lib.kvfs_client_job_join(self._h, ctypes.byref(out))
        self._h = None
        try:
            _check(rc)
            return _blocks(out)
        finally:
            lib.kvfs_client_blocks_release(ctypes.byref(out))
            self._keep = None

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            try:
                self.join()
            except Exception:
                pass


# ---------------------------------------------------------------- client

class Client(_Closing):
    """A client on the kvfs mounted at ``mnt`` (opens MNT/.kvfs/ctl).

    Thread-safe. Closing it (``close()``, ``with``, or process exit)
    gives back every lease it holds; pool memoryviews from ``fetch`` must
    not be used after.
    """

    def __init__(self, mnt):
        lib = _load()
        self._c = ctypes.c_void_p()
        _check(lib.kvfs_client_open(os.fsencode(mnt),
                                    ctypes.byref(self._c)))
        self.mnt = mnt

    def close(self):
        if self._c:
            _load().kvfs_client_close(self._c)
            self._c = ctypes.c_void_p()

    def _handle(self):
        if not self._c:
            raise ValueError("client is closed")
        return self._c

    def _run(self, fn, *args, with_data=False):
        out = _ClientBlocks()
        lib = _load()
        rc = fn(self._handle(), *args, ctypes.byref(out))
        try:
            _check(rc)
            resp = CtlResp()  # a copy: the release below zeroes out
            ctypes.memmove(ctypes.byref(resp), ctypes.byref(out.resp),
                           ctypes.sizeof(resp))
            return resp, _blocks(out, with_data)
        finally:
            lib.kvfs_client_blocks_release(ctypes.byref(out))

    @property
    def last_xport(self):
        """XPORT_IOCTL or XPORT_RW: how the last request went."""
        return _load().kvfs_client_last_xport(self._handle())

    def ns_info(self, ns):
        """Root key and geometry of namespace ``ns`` (an :class:`NsInfo`)."""
        n = _ClientNs()
        _check(_load().kvfs_client_ns_info(self._handle(), _ns(ns),
                                           ctypes.byref(n)))
        return NsInfo(n)

    def lookup(self, ns, keys=None, tokens=None, access=False,
               remote=False):
        """How many leading blocks are cached, and where each is.

        Give ``keys`` (chain order) or ``tokens`` (from position 0; the
        daemon chains full blocks). ``access`` counts the matched prefix
        as a use; a plain lookup changes nothing. ``remote`` first brings
        in the blocks the remote tier has (a mount with [tier.remote];
        docs/remote.md); a plain lookup stays local. Returns a
        :class:`Lookup`.
        """
        lib = _load()
        flags = (F_ACCESS if access else 0) | (F_REMOTE if remote else 0)
        if tokens is not None:
            t, n = _tokens(tokens)
            resp, blocks = self._run(lib.kvfs_client_lookup_tokens, _ns(ns),
                                     t, n, flags)
        else:
            k, n = _keys(keys)
            resp, blocks = self._run(lib.kvfs_client_lookup, _ns(ns), k, n,
                                     flags)
        return Lookup(resp.n_cached, blocks)

    def fetch(self, ns, keys=None, tokens=None):
        """Make a prefix resident in the device pool, leased to this client.

        Returns a :class:`Fetch`; on the shm backend each block's ``data``
        is a read-only view of its payload in the pool.
        """
        lib = _load()
        if tokens is not None:
            t, n = _tokens(tokens)
            resp, blocks = self._run(lib.kvfs_client_fetch_tokens, _ns(ns),
                                     t, n, with_data=True)
        else:
            k, n = _keys(keys)
            resp, blocks = self._run(lib.kvfs_client_fetch, _ns(ns), k, n,
                                     with_data=True)
        return Fetch(blocks, resp.pool, resp.n_cached, self)

    def fetch_into(self, ns, keys, peer, dst_offs, sync):
        """Copy blocks into ``peer`` at ``dst_offs`` (one per key).

        Layer l of block i lands at dst_offs[i] + l * layer_bytes. The
        blocks' ranges must not overlap (OSError EINVAL), and device work
        on them must be synchronised first. Returns when every layer is
        copied (``sync`` counts them as it goes); returns the blocks.
        """
        k, n = _keys(keys)
        d, nd = _u64s(dst_offs)
        if nd != n:
            raise ValueError("one destination offset per key")
        _, blocks = self._run(_load().kvfs_client_fetch_into, _ns(ns), k, n,
                              _mem(peer), d, ctypes.byref(sync._s))
        return blocks

    def fetch_into_async(self, ns, keys, peer, dst_offs, sync):
        """Start :meth:`fetch_into` on a thread; returns a :class:`Job`.

        Wait for layers with ``sync.wait_layer(l)``, then ``job.join()``.
        """
        k, n = _keys(keys)
        d, nd = _u64s(dst_offs)
        if nd != n:
            raise ValueError("one destination offset per key")
        h = ctypes.c_void_p()
        _check(_load().kvfs_client_fetch_into_start(
            self._handle(), _ns(ns), k, n, _mem(peer), d,
            ctypes.byref(sync._s), ctypes.byref(h)))
        return Job(h, (self, peer, sync))

    def save(self, ns, parent, start_pos, tokens, peer, src_off=0):
        """Create one block from the payload at ``src_off`` in ``peer``.

        ``parent`` is the namespace root for a first block. Returns the
        new block's key.
        """
        t, n = _tokens(tokens)
        out = ctypes.create_string_buffer(KEY_LEN)
        _check(_load().kvfs_client_save(self._handle(), _ns(ns),
                                        key_bytes(parent), start_pos, t, n,
                                        _mem(peer), src_off, out))
        return out.raw

    def release(self, ns=None, keys=None):
        """Drop this client's leases on ``keys``, or all of them."""
        k, n = _keys(keys)
        _check(_load().kvfs_client_release(self._handle(), _ns(ns), k, n))

    def _tier_op(self, name, ns, keys, tier):
        k, n = _keys(keys)
        _check(getattr(_load(), name)(self._handle(), _ns(ns), k, n, tier))

    def pin(self, ns, keys, tier=TIER_DRAM):
        """Pin blocks in ``tier``."""
        self._tier_op("kvfs_client_pin", ns, keys, tier)

    def unpin(self, ns, keys, tier=TIER_DRAM):
        """Remove pins of blocks."""
        self._tier_op("kvfs_client_unpin", ns, keys, tier)

    def prefetch(self, ns, keys, tier=TIER_GPU):
        """Hint: bring blocks up to ``tier`` in the background."""
        self._tier_op("kvfs_client_prefetch", ns, keys, tier)

    def evict(self, ns, keys, tier=TIER_ALL):
        """Drop blocks from ``tier``; TIER_ALL deletes them."""
        self._tier_op("kvfs_client_evict", ns, keys, tier)

    def stats(self, ns=None):
        """The daemon's counters, as a dict."""
        st = CtlStats()
        _check(_load().kvfs_client_stats(self._handle(), _ns(ns),
                                         ctypes.byref(st)))
        return {n: getattr(st, n) for n in _STATS_FIELDS}

    def call(self, op, ns=None, keys=None, tokens=None, flags=0, tier=0,
             xport=XPORT_AUTO, max_blocks=0):
        """A raw request (tests, tools): returns (CtlResp, [Block]).

        ``xport`` forces a transport; FETCH_INTO and SAVE need the
        dedicated methods.
        """
        if op in (FETCH_INTO, SAVE):
            raise ValueError("use fetch_into() or save()")
        k, nk = _keys(keys)
        t, nt = _tokens(tokens)
        r = _ClientReq(op=op, flags=flags, ns=_ns(ns), tier=tier,
                       xport=xport, max_blocks=max_blocks)
        r.keys = ctypes.cast(k, ctypes.c_void_p) if k is not None else None
        r.n_keys = nk
        r.tokens = ctypes.cast(t, ctypes.c_void_p) if t is not None else None
        r.n_tokens = nt
        return self._run(_load().kvfs_client_call, ctypes.byref(r),
                         with_data=(op == FETCH))
