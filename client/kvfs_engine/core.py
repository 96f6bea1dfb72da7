# SPDX-License-Identifier: MIT
"""The connector core: what every engine adapter shares.

Standard library plus torch. It

- maps an engine's token blocks to kvfs keys (the chained hash of
  docs/format.md section 2, the same one libkvfs and kvfs.py compute);
- builds and parses block images (format version 1) for engines that
  write and read block files;
- moves tensors between an engine's paged KV cache (vLLM's layout per
  layer, ``[num_pages, 2, block_size, num_kv_heads, head_dim]``) and the
  block payload (layer-major, then chunk-major, K then V per chunk);
- batches LOOKUP, FETCH_INTO and SAVE through the control file
  (``client/kvfs.py``), or does the same with file reads and writes.

An engine page holds exactly one kvfs block: ``block_size`` of the engine
equals the namespace's ``block_tokens``. Only full blocks are stored or
loaded (a partial block may only end a chain, and engines recompute the
tail anyway).
"""

import ctypes
import errno
import hashlib
import mmap
import os
import struct

import torch

try:  # kvfs.py sits next to this package (client/)
    import kvfs
except ImportError:  # pragma: no cover - the launcher sets sys.path
    kvfs = None

KEY_LEN = 16
ALIGN = 4096
HDR_FMT = "<8sHHHHIIIIIIQ16s16sII"
HDR_LEN = struct.calcsize(HDR_FMT)  # 88
MAGIC = b"KVFSBLK1"
KIND_KV, KIND_HIDDEN = 1, 2
DTYPES = {"f16": (1, torch.float16, 2), "bf16": (2, torch.bfloat16, 2),
          "f32": (3, torch.float32, 4)}
DTYPE_BY_CODE = {v[0]: k for k, v in DTYPES.items()}


def align(n, a=ALIGN):
    return (n + a - 1) // a * a


# ---------------------------------------------------------------- CRC-32C

_crc_fn = None
_crc_table = None


def _crc_py(crc, data):
    global _crc_table
    if _crc_table is None:
        t = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
            t.append(c)
        _crc_table = t
    c = crc ^ 0xFFFFFFFF
    tb = _crc_table
    for b in bytes(data):
        c = tb[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli) of ``data``, continuing ``crc``.

    libkvfs.so's own (ISA-L) when it can be loaded, else a table in
    Python (correct, slow).
    """
    global _crc_fn
    if _crc_fn is None:
        try:
            fn = kvfs._load().kvfs_fmt_crc32c
            fn.restype = ctypes.c_uint32
            fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
            _crc_fn = fn
        except Exception:
            _crc_fn = False
    mv = memoryview(data).cast("B")
    if _crc_fn:
        if mv.readonly:
            buf = ctypes.create_string_buffer(mv.tobytes(), len(mv))
            return _crc_fn(crc, buf, len(mv))
        c = (ctypes.c_char * len(mv)).from_buffer(mv)
        return _crc_fn(crc, ctypes.addressof(c), len(mv))
    return _crc_py(crc, mv)


# ------------------------------------------------------------------- keys

def root_key(ns, salt=None):
    """The root key of namespace ``ns``: SHA-256("kvfs-ns-v1" 0 ns 0 salt)."""
    h = hashlib.sha256(b"kvfs-ns-v1\0" + ns.encode() + b"\0" +
                       (salt or "").encode())
    return h.digest()[:KEY_LEN]


def block_key(parent, tokens):
    """Key of one block: SHA-256(parent || u32 tokens)[0..16)."""
    return hashlib.sha256(bytes(parent) + struct.pack(
        "<%dI" % len(tokens), *tokens)).digest()[:KEY_LEN]


def chain(parent, tokens, block_tokens):
    """Keys of the full blocks of ``tokens`` chained from ``parent``."""
    keys = []
    for i in range(len(tokens) // block_tokens):
        parent = block_key(parent, tokens[i * block_tokens:(i + 1) *
                                          block_tokens])
        keys.append(parent)
    return keys


# --------------------------------------------------------------- geometry

class Geom:
    """A namespace's geometry (the ``[namespace]`` keys)."""

    def __init__(self, n_layers, n_kv_heads, head_dim, block_tokens,
                 chunk_tokens=None, dtype="f32", hidden_size=0):
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.block_tokens = block_tokens
        self.chunk_tokens = chunk_tokens or block_tokens
        self.dtype = dtype
        self.hidden_size = hidden_size
        self.dcode, self.tdtype, self.esz = DTYPES[dtype]

    @classmethod
    def from_info(cls, info):
        """From kvfs.NsInfo (the namespace's xattrs)."""
        return cls(info.n_layers, info.n_kv_heads, info.head_dim,
                   info.block_tokens, info.chunk_tokens, info.dtype,
                   info.hidden_size)

    def n_chunks(self, n_tokens):
        return -(-n_tokens // self.chunk_tokens)

    def row_elems(self, kind=KIND_KV):
        return (self.hidden_size if kind == KIND_HIDDEN else
                self.n_kv_heads * self.head_dim)

    def layer_elems(self, n_tokens, kind=KIND_KV):
        """Elements of one layer of the payload (chunks at full size)."""
        planes = 1 if kind == KIND_HIDDEN else 2
        return (planes * self.n_chunks(n_tokens) * self.chunk_tokens *
                self.row_elems(kind))

    def layer_bytes(self, n_tokens, kind=KIND_KV):
        return self.layer_elems(n_tokens, kind) * self.esz

    def payload_bytes(self, n_tokens, kind=KIND_KV):
        return self.n_layers * self.layer_bytes(n_tokens, kind)

    def payload_off(self, n_tokens):
        return ALIGN + align(4 * n_tokens)

    def file_size(self, n_tokens, kind=KIND_KV):
        return self.payload_off(n_tokens) + self.payload_bytes(n_tokens, kind)

    def direct(self):
        """True when one layer of a full block's payload is one engine page
        ([2, block_size, kv_heads, head_dim]): no reshuffle needed."""
        return self.chunk_tokens == self.block_tokens


# ---------------------------------------------------------------- images

def build_image(g, key, parent, start_pos, tokens, payload, kind=KIND_KV):
    """A complete, valid block file (bytes) around ``payload`` (bytes-like,
    in the payload layout)."""
    n = len(tokens)
    poff = g.payload_off(n)
    size = g.file_size(n, kind)
    payload = memoryview(payload).cast("B")
    if len(payload) != size - poff:
        raise ValueError("payload is %d bytes, the format wants %d" %
                         (len(payload), size - poff))
    img = bytearray(size)
    struct.pack_into("<%dI" % n, img, ALIGN, *tokens)
    img[poff:] = payload
    pcrc = crc32c(memoryview(img)[ALIGN:])
    hsize = g.hidden_size if kind == KIND_HIDDEN or g.hidden_size else 0
    hdr = struct.pack(HDR_FMT[:-1], MAGIC, 1, kind, g.dcode, 0, g.n_layers,
                      g.n_kv_heads, g.head_dim, hsize, n, g.chunk_tokens,
                      start_pos, bytes(parent), bytes(key), pcrc)
    img[:len(hdr)] = hdr
    struct.pack_into("<I", img, len(hdr), crc32c(hdr))
    return img


def parse_header(buf):
    """The header fields of an image (a dict); no checksum is checked here
    (kvfs checked them before serving the bytes)."""
    f = struct.unpack_from(HDR_FMT, buf, 0)
    names = ("magic", "version", "kind", "dtype", "kv_from", "n_layers",
             "n_kv_heads", "head_dim", "hidden_size", "n_tokens",
             "chunk_tokens", "start_pos", "parent", "key", "payload_crc",
             "hdr_crc")
    return dict(zip(names, f))


class BlockError(Exception):
    """A block that cannot be used (a load error: never used)."""


def check_header(g, h, key, start_pos):
    if h["magic"] != MAGIC or h["version"] != 1 or h["kind"] != KIND_KV:
        raise BlockError("not a version-1 KV block")
    if (h["dtype"] != g.dcode or h["n_layers"] != g.n_layers or
            h["n_kv_heads"] != g.n_kv_heads or h["head_dim"] != g.head_dim or
            h["chunk_tokens"] != g.chunk_tokens):
        raise BlockError("geometry differs from the engine's")
    if h["key"] != bytes(key) or h["start_pos"] != start_pos:
        raise BlockError("not the block asked for")
    if h["n_tokens"] != g.block_tokens:
        raise BlockError("partial block")


# ------------------------------------------- pages <-> payload (the layout)

def pages_to_payload(g, layers, page, n_tokens=None, out=None):
    """The payload (a flat uint8 tensor) of the block in ``page`` of the
    paged cache ``layers`` (one tensor [num_pages, 2, bs, h, d] per
    layer), chunk-major with zero rows past ``n_tokens``."""
    n = n_tokens or g.block_tokens
    c, nc = g.chunk_tokens, g.n_chunks(n)
    if out is None:
        out = torch.empty(g.payload_bytes(n), dtype=torch.uint8)
    dst = out.view(g.tdtype).view(g.n_layers, nc, 2, c, g.n_kv_heads,
                                  g.head_dim)
    for l, t in enumerate(layers):
        src = t[page, :, :n]  # [2, n, h, d]
        if nc * c == n:
            dst[l].copy_(src.reshape(2, nc, c, g.n_kv_heads,
                                     g.head_dim).transpose(0, 1))
        else:
            dst[l].zero_()
            for j in range(nc):
                m = min(c, n - j * c)
                dst[l, j, :, :m].copy_(src[:, j * c:j * c + m])
    return out


def payload_to_pages(g, payload, layers, page, n_tokens=None, only=None):
    """The inverse of pages_to_payload: scatter a payload into ``page``
    (of every layer, or of layer ``only`` alone)."""
    n = n_tokens or g.block_tokens
    c, nc = g.chunk_tokens, g.n_chunks(n)
    src = payload.view(g.tdtype).view(g.n_layers, nc, 2, c, g.n_kv_heads,
                                      g.head_dim)
    for l, t in enumerate(layers):
        if only is not None and l != only:
            continue
        dst = t[page, :, :n]
        if nc * c == n:
            dst.copy_(src[l].transpose(0, 1).reshape(2, n, g.n_kv_heads,
                                                     g.head_dim))
        else:
            for j in range(nc):
                m = min(c, n - j * c)
                dst[:, j * c:j * c + m].copy_(src[l, j, :, :m])


def hidden_to_payload(g, hidden, n_tokens=None):
    """HIDDEN payload of one block from ``hidden`` [n_layers, n, hidden]
    (each layer's input, before its norm): X[c][hidden] per chunk."""
    n = n_tokens or hidden.shape[1]
    c, nc = g.chunk_tokens, g.n_chunks(n)
    out = torch.zeros(g.n_layers, nc * c, g.hidden_size, dtype=g.tdtype)
    out[:, :n] = hidden[:, :n].to(g.tdtype)
    return out.reshape(-1).view(torch.uint8)


# ------------------------------------------------------------ paged cache

class PagedKV:
    """An engine's paged KV cache, one allocation for all layers:
    [num_pages, n_layers, 2, bs, h, d]. ``layer(l)`` is layer l's cache in
    vLLM's layout [num_pages, 2, bs, h, d] (a strided view).

    With ``peer`` the memory is a kvfs.Peer (shm the daemon can copy into
    and SAVE from), so FETCH_INTO lands in the pages themselves and SAVE
    reads them in place, when the namespace's chunk_tokens equals its
    block_tokens (the page of one layer is then one layer of the payload).
    """

    def __init__(self, g, num_pages, peer=False):
        self.g = g
        self.num_pages = num_pages
        shape = (num_pages, g.n_layers, 2, g.block_tokens, g.n_kv_heads,
                 g.head_dim)
        nel = 1
        for s in shape:
            nel *= s
        self.page_bytes = nel // num_pages * g.esz
        self.peer = None
        if peer:
            self.peer = kvfs.Peer(nel * g.esz)
            self.kv = torch.frombuffer(self.peer.buf, dtype=torch.uint8) \
                .view(g.tdtype).view(shape)
            self.kv.zero_()
        else:
            self.kv = torch.zeros(shape, dtype=g.tdtype)
        self.layers = [self.kv[:, l] for l in range(g.n_layers)]

    def layer(self, l):
        return self.layers[l]

    def close(self):
        self.layers = []
        self.kv = None
        if self.peer is not None:
            self.peer.close()
            self.peer = None


# ------------------------------------------------------------- the store

class Store:
    """One namespace of a kvfs mount, seen by one engine process.

    ``via`` is ``files`` (read()/mmap() and write() of block files) or
    ``ctl`` (FETCH_INTO and SAVE through the control file). LOOKUP always
    goes through the control file (one request for a whole prompt).
    """

    def __init__(self, mnt, ns, via="files", use_mmap=False):
        if via not in ("files", "ctl"):
            raise ValueError("via is files or ctl")
        self.mnt, self.ns, self.via = mnt, ns, via
        self.use_mmap = use_mmap
        self.client = kvfs.Client(mnt)
        info = self.client.ns_info(ns)
        self.g = Geom.from_info(info)
        self.root = bytes(info.root)
        self.dir = os.path.join(mnt, ns)
        self._sync = None
        self._stage = None

    def close(self):
        for r in (self._sync, self._stage):
            if r is not None:
                r.close()
        self._sync = self._stage = None
        self.client.close()

    # -- keys
    def keys(self, tokens):
        """Keys of the full blocks of a prompt (from position 0)."""
        return chain(self.root, tokens, self.g.block_tokens)

    def path(self, key):
        return os.path.join(self.dir, bytes(key).hex() + ".kv")

    # -- LOOKUP
    def lookup(self, keys):
        """How many leading blocks of ``keys`` kvfs holds (one request per
        163 keys at most, the ioctl's size; stops at the first miss)."""
        n = 0
        step = 160
        while n < len(keys):
            part = keys[n:n + step]
            hit = self.client.lookup(self.ns, part).n_cached
            n += hit
            if hit < len(part):
                break
        return n

    # -- loads
    def _stage_peer(self, nbytes):
        if self._stage is None or self._stage.size < nbytes:
            if self._stage is not None:
                self._stage.close()
            self._stage = kvfs.Peer(max(nbytes, 1 << 20))
        return self._stage

    def sync(self):
        if self._sync is None:
            self._sync = kvfs.Sync()
        return self._sync

    def load(self, keys, pages, cache, first=0):
        """Load blocks ``keys`` (chain order, block ``first`` of the prompt
        onwards) into ``pages`` of ``cache`` (a PagedKV, or a list of
        per-layer tensors). Returns (loaded, failed): the leading blocks
        that arrived whole and passed their checks, and the index of the
        first that did not (None): nothing from it on is used."""
        if not keys:
            return 0, None
        if self.via == "files":
            return self._load_files(keys, pages, cache, first)
        return self._load_ctl(keys, pages, cache, first)

    def _layers(self, cache):
        return cache.layers if isinstance(cache, PagedKV) else cache

    def _read_file(self, key):
        with open(self.path(key), "rb", buffering=0) as f:
            if self.use_mmap:
                m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                try:
                    return bytearray(m)
                finally:
                    m.close()
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)
            got = f.readinto(buf)
            if got != size:
                raise BlockError("short read")
            return buf

    def _load_files(self, keys, pages, cache, first):
        g = self.g
        layers = self._layers(cache)
        for i, key in enumerate(keys):
            start = (first + i) * g.block_tokens
            try:
                img = self._read_file(key)
                check_header(g, parse_header(img), key, start)
            except (OSError, BlockError):
                return i, i
            poff = g.payload_off(g.block_tokens)
            payload = torch.frombuffer(img, dtype=torch.uint8)[poff:]
            payload_to_pages(g, payload, layers, pages[i])
        return len(keys), None

    def _load_ctl(self, keys, pages, cache, first):
        g = self.g
        direct = (isinstance(cache, PagedKV) and cache.peer is not None and
                  g.direct())
        plen = g.payload_bytes(g.block_tokens)
        if direct:
            peer = cache.peer
            dst = [p * cache.page_bytes for p in pages]
        else:
            peer = self._stage_peer(plen * len(keys))
            dst = [i * plen for i in range(len(keys))]
        try:
            self.client.fetch_into(self.ns, keys, peer, dst, self.sync())
            ok, bad = len(keys), None
        except OSError:
            # Which block? Try them one by one: the leading good ones
            # are still of use; the bad one and what follows are not.
            ok, bad = 0, 0
            for i, key in enumerate(keys):
                try:
                    self.client.fetch_into(self.ns, [key], peer, [dst[i]],
                                           self.sync())
                except OSError:
                    bad = i
                    break
                ok = i + 1
            else:
                bad = None
        if not direct:
            layers = self._layers(cache)
            src = torch.frombuffer(peer.buf, dtype=torch.uint8)
            for i in range(ok):
                payload_to_pages(g, src[dst[i]:dst[i] + plen], layers,
                                 pages[i])
        return ok, bad

    # -- saves
    def save(self, tokens, keys, pages, cache, first):
        """Store blocks ``first..`` of a prompt from ``pages`` (one page
        per block, full blocks only). ``keys`` are the prompt's keys.
        Returns how many blocks were created (an existing one is not)."""
        g = self.g
        bt = g.block_tokens
        saved = 0
        layers = self._layers(cache)
        direct = (isinstance(cache, PagedKV) and cache.peer is not None and
                  g.direct())
        for i, page in zip(range(first, len(keys)), pages):
            parent = keys[i - 1] if i else self.root
            toks = tokens[i * bt:(i + 1) * bt]
            try:
                if self.via == "ctl":
                    if direct:
                        peer, off = cache.peer, page * cache.page_bytes
                    else:
                        plen = g.payload_bytes(bt)
                        peer, off = self._stage_peer(plen), 0
                        dst = torch.frombuffer(peer.buf, dtype=torch.uint8)
                        pages_to_payload(g, layers, page, out=dst[:plen])
                    self.client.save(self.ns, parent, i * bt, toks, peer, off)
                else:
                    payload = pages_to_payload(g, layers, page)
                    self.write_block(keys[i], parent, i * bt, toks,
                                     payload.numpy().tobytes())
                saved += 1
            except OSError as e:
                if e.errno != errno.EEXIST:
                    raise
        return saved

    def write_block(self, key, parent, start_pos, tokens, payload,
                    kind=KIND_KV):
        """Write one block file (O_EXCL: EEXIST if kvfs has it)."""
        img = build_image(self.g, key, parent, start_pos, tokens, payload,
                          kind)
        fd = os.open(self.path(key), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                     0o444)
        try:
            mv = memoryview(img)
            while mv:
                n = os.write(fd, mv)
                mv = mv[n:]
        finally:
            os.close(fd)  # close commits: a rejected block fails here

    def save_hidden(self, tokens, keys, hidden, first):
        """Store blocks ``first..`` as HIDDEN blocks: ``hidden`` is
        [n_layers, n_tokens_of_prompt, hidden_size], each layer's input.
        Returns how many blocks were created."""
        g = self.g
        bt = g.block_tokens
        saved = 0
        for i in range(first, len(keys)):
            parent = keys[i - 1] if i else self.root
            payload = hidden_to_payload(g, hidden[:, i * bt:(i + 1) * bt])
            try:
                self.write_block(keys[i], parent, i * bt,
                                 tokens[i * bt:(i + 1) * bt],
                                 payload.numpy().tobytes(), KIND_HIDDEN)
                saved += 1
            except OSError as e:
                if e.errno != errno.EEXIST:
                    raise
        return saved


# ------------------------------------------- per-layer loads (connectors)

class LayerLoad:
    """A FETCH_INTO of some blocks into a staging peer, consumed layer by
    layer: ``wait_layer(l)`` waits on the completion word until layer l
    has arrived and scatters it into the pages of the per-layer caches.
    ``finish()`` joins the copy; a failure marks every page of the load
    as failed (``failed``), and such pages are never used."""

    def __init__(self, store, keys, pages, layers):
        self.store, self.keys, self.pages = store, list(keys), list(pages)
        self.layers = layers
        g = store.g
        self.plen = g.payload_bytes(g.block_tokens)
        self.peer = kvfs.Peer(max(self.plen * len(self.keys), 4096))
        self.sync = kvfs.Sync()
        self.failed = set()
        self.done = set()
        self.job = None
        if self.keys:
            try:
                self.job = store.client.fetch_into_async(
                    store.ns, self.keys, self.peer,
                    [i * self.plen for i in range(len(self.keys))],
                    self.sync)
            except OSError:
                self.failed = set(self.pages)

    def wait_layer(self, l, timeout=60):
        if l in self.done or self.failed or not self.keys:
            return not self.failed
        try:
            self.sync.wait_layer(l, timeout)
        except OSError:
            self.failed = set(self.pages)
            return False
        src = torch.frombuffer(self.peer.buf, dtype=torch.uint8)
        for i, page in enumerate(self.pages):
            payload_to_pages(self.store.g,
                             src[i * self.plen:(i + 1) * self.plen],
                             self.layers, page, only=l)
        self.done.add(l)
        return True

    def finish(self):
        if self.job is not None:
            try:
                self.job.join()
            except OSError:
                self.failed = set(self.pages)
            self.job = None
        self.sync.close()
        self.peer.close()
        return self.failed


# ----------------------------------------------- key-addressed pages (SGLang)

def page_tokens(page_key, block_tokens):
    """The token area of a page stored under an engine's own page hash
    (SGLang gives a backend its hash, not the tokens): the hash's bytes as
    u32 words, zero-padded to ``block_tokens``. The page is then a
    one-block chain from the namespace root, its kvfs key a function of
    the engine's key alone."""
    raw = hashlib.sha256(page_key.encode()).digest()
    words = list(struct.unpack("<8I", raw))
    return (words + [0] * block_tokens)[:block_tokens]


class PageStore:
    """Pages addressed by an engine's string keys (SGLang's HiCache), kept
    as kvfs blocks of one namespace; values are flat tensors holding one
    page in the payload layout (``g.payload_bytes`` bytes)."""

    def __init__(self, store):
        self.store = store
        self.g = store.g

    def key(self, page_key):
        return block_key(self.store.root,
                         page_tokens(page_key, self.g.block_tokens))

    def exists_leading(self, page_keys):
        """How many leading keys kvfs holds (one LOOKUP per 160 keys)."""
        keys = [self.key(k) for k in page_keys]
        n = 0
        while n < len(keys):
            part = keys[n:n + 160]
            r = self.store.client.lookup(self.store.ns, part)
            lead = 0
            for b in r.blocks:
                if not b.tiers:
                    break
                lead += 1
            n += lead
            if lead < len(part):
                break
        return n

    def get(self, page_key, out=None):
        """The page as a flat uint8 tensor (into ``out`` if given), or None
        when kvfs does not have it or it fails its checks."""
        key = self.key(page_key)
        g = self.g
        try:
            img = self.store._read_file(key)
            check_header(g, parse_header(img), key, 0)
        except (OSError, BlockError):
            return None
        payload = torch.frombuffer(img, dtype=torch.uint8)[
            g.payload_off(g.block_tokens):]
        if out is None:
            return payload
        out.view(-1).view(torch.uint8).copy_(payload)
        return out

    def set(self, page_key, value):
        """Store a page; True when stored or already there."""
        g = self.g
        data = value.contiguous().view(-1).view(torch.uint8)
        if data.numel() != g.payload_bytes(g.block_tokens):
            raise ValueError("a page is %d bytes in this namespace, not %d"
                             % (g.payload_bytes(g.block_tokens), data.numel()))
        try:
            self.store.write_block(self.key(page_key), self.store.root, 0,
                                   page_tokens(page_key, g.block_tokens),
                                   data.numpy().tobytes())
        except OSError as e:
            if e.errno != errno.EEXIST:
                return False
        return True


# ------------------------------------------------------ connector core

class ConnectorCore:
    """What a connector does, engine-neutral: the adapters only translate
    an engine's objects into these calls.

    Scheduler side: ``match``. Worker side: ``register`` the per-layer
    caches, ``start_load`` (one FETCH_INTO for a step's loads),
    ``wait_layer``, ``finish_load``, ``save`` (SAVE of new full blocks),
    ``take_load_errors``.
    """

    def __init__(self, mnt, ns, via="ctl", store=None):
        self.store = store or Store(mnt, ns, via)
        self.g = self.store.g
        self.layers = []
        self.load = None
        self.errors = set()

    # scheduler
    def match(self, tokens, num_computed):
        """Tokens kvfs can provide beyond ``num_computed`` (whole blocks;
        the last token is always left to compute)."""
        bt = self.g.block_tokens
        keys = self.store.keys(tokens)
        hit = min(self.store.lookup(keys), (len(tokens) - 1) // bt)
        return max(0, hit * bt - num_computed)

    # worker
    def register(self, layers):
        """``layers``: one tensor per layer, [num_pages, 2, bs, h, d]."""
        self.layers = list(layers)

    def start_load(self, loads):
        """``loads``: (tokens, first_block, pages) per request: blocks
        first_block.. of the prompt go to ``pages``."""
        keys, pages = [], []
        for tokens, first, pg in loads:
            k = self.store.keys(tokens)[first:first + len(pg)]
            keys += k
            pages += list(pg)[:len(k)]
        self.load = LayerLoad(self.store, keys, pages, self.layers) \
            if keys else None

    def wait_layer(self, l):
        return self.load.wait_layer(l) if self.load else True

    def finish_load(self):
        if self.load is not None:
            for l in range(len(self.layers)):
                self.load.wait_layer(l)
            self.errors |= self.load.finish()
            self.load = None

    def save(self, saves):
        """``saves``: (tokens, first_block, pages) per request: blocks
        first_block.. of the prompt, in ``pages``, are stored. Returns
        the number created."""
        n = 0
        for tokens, first, pg in saves:
            keys = self.store.keys(tokens)
            last = min(len(keys), first + len(pg))
            if last > first:
                n += self.store.save(tokens, keys[:last], list(pg),
                                     self.layers, first)
        return n

    def take_load_errors(self):
        e, self.errors = self.errors, set()
        return e

    def close(self):
        self.store.close()
