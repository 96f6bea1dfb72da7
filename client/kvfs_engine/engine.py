# SPDX-License-Identifier: MIT
"""kvfs-torch-engine: the reference engine (the proof that a cached prefix
computes what a full prefill computes).

    kvfs-torch-engine --print-conf NS [--dtype f32|bf16] [--hcache DIR]
    kvfs-torch-engine --mount MNT --ns NS --prompts FILE [--via files|ctl]
                      [--dtype f32|bf16] [--check] [--hcache DIR] [--mmap]

Per request (a JSON line {"tokens": [...]}) it computes the keys of the
prompt's full blocks, LOOKUPs them, loads the cached prefix into its
paged cache (read()/mmap() of the block files, or FETCH_INTO into its own
memory), prefills only the rest and saves the new full blocks (file
writes, or SAVE; with --hcache, HIDDEN blocks of each layer's input
hidden states, by file writes). It prints one JSON line per request:
{"request", "tokens", "cached_tokens", "saved_blocks", "max_abs_diff",
"ttft_ms", "ttft_full_ms"}; the last two fields need --check, which runs
a full recompute without kvfs and compares every logit computed.
"""

import argparse
import json
import os
import sys
import time

import torch

from . import core
from .model import Config, Model

TDTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def print_conf(ns, dtype, hcache):
    cfg = Config()
    lines = ["[namespace %s]" % ns,
             "layers = %d" % cfg.layers,
             "kv_heads = %d" % cfg.kv_heads,
             "head_dim = %d" % cfg.head_dim,
             "dtype = %s" % dtype,
             "block_tokens = %d" % cfg.block_tokens,
             "chunk_tokens = %d" % cfg.block_tokens,
             "hidden_size = %d" % cfg.hidden]
    if hcache:
        os.makedirs(hcache, exist_ok=True)
        path = os.path.abspath(os.path.join(hcache, "model.safetensors"))
        Model(cfg).export_safetensors(path)
        lines += ["weights = %s" % path,
                  "family = llama",
                  "rms_norm_eps = %g" % cfg.eps,
                  "rope_theta = %g" % cfg.rope_theta,
                  "store_as = hidden"]
    print("\n".join(lines))


class Engine:
    def __init__(self, mnt, ns, via, dtype, hcache=False, use_mmap=False,
                 max_tokens=8192):
        self.cfg = Config()
        self.model = Model(self.cfg, TDTYPES[dtype])
        self.store = core.Store(mnt, ns, via, use_mmap)
        g = self.store.g
        c = self.cfg
        if (g.n_layers, g.n_kv_heads, g.head_dim, g.block_tokens) != \
                (c.layers, c.kv_heads, c.head_dim, c.block_tokens) or \
                g.dtype != dtype:
            raise SystemExit("kvfs-torch-engine: namespace %s does not fit "
                             "the model (see --print-conf)" % ns)
        self.hcache = hcache
        self.pages = -(-max_tokens // c.block_tokens)
        self.cache = core.PagedKV(g, self.pages, peer=(via == "ctl"))
        # bf16 --check: the same model in f32 measures the rounding of
        # the bf16 computation itself (see bound()).
        self.model32 = Model(self.cfg) if dtype == "bf16" else None

    def close(self):
        self.cache.close()
        self.store.close()

    def serve(self, tokens):
        """One request: returns (logits of the computed positions,
        cached_tokens, saved_blocks, ttft seconds)."""
        bt = self.cfg.block_tokens
        n = len(tokens)
        if n > self.pages * bt:
            raise ValueError("prompt longer than the engine's cache")
        pages = list(range(-(-n // bt)))
        t0 = time.perf_counter()
        keys = self.store.keys(tokens)
        hit = self.store.lookup(keys)
        # At least the last token is computed (its logits are the answer).
        hit = min(hit, (n - 1) // bt)
        got, _bad = self.store.load(keys[:hit], pages[:hit], self.cache)
        start = got * bt
        hidden = None
        if self.hcache:
            hidden = torch.zeros(self.cfg.layers, n, self.cfg.hidden,
                                 dtype=self.model.dtype)
        logits = self.model.forward(tokens[start:], start, self.cache.layers,
                                    pages, hidden)
        ttft = time.perf_counter() - t0
        if self.hcache:
            saved = self.store.save_hidden(tokens, keys, hidden, got)
        else:
            saved = self.store.save(tokens, keys, pages[got:], self.cache,
                                    got)
        return logits, start, saved, ttft

    def full(self, tokens):
        """A full recompute without kvfs, on private pages."""
        bt = self.cfg.block_tokens
        n = len(tokens)
        g = self.store.g
        cache = core.PagedKV(g, -(-n // bt))
        t0 = time.perf_counter()
        logits = self.model.forward(tokens, 0, cache.layers,
                                    list(range(cache.num_pages)))
        return logits, time.perf_counter() - t0

    def bound(self, tokens, ref, cached):
        """How far the logits served through kvfs may be from the full
        recompute's. f32: 1e-4. bf16: the rounding of the computation
        itself: twice the largest distance of the bf16 full recompute
        from the same computation in f32, and at least one bf16 ulp of
        the largest logit (2^-7 of it). Loading a prefix changes only
        where bf16 roundings fall (its K and V were computed in another
        batch); a wrong byte of KV is far outside."""
        if self.model32 is None:
            return 1e-4
        g = core.Geom(self.cfg.layers, self.cfg.kv_heads, self.cfg.head_dim,
                      self.cfg.block_tokens, dtype="f32")
        cache = core.PagedKV(g, -(-len(tokens) // self.cfg.block_tokens))
        r32 = self.model32.forward(tokens, 0, cache.layers,
                                   list(range(cache.num_pages)))[cached:]
        r = ref[cached:]
        return max(2 * (r - r32).abs().max().item(),
                   2 ** -7 * r.abs().max().item())


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kvfs-torch-engine")
    ap.add_argument("--print-conf", metavar="NS")
    ap.add_argument("--mount")
    ap.add_argument("--ns")
    ap.add_argument("--prompts")
    ap.add_argument("--via", choices=("files", "ctl"), default="files")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--hcache", metavar="DIR",
                    help="with --print-conf: export the checkpoint to DIR "
                    "and print a namespace stored as hidden states; when "
                    "serving: save HIDDEN blocks")
    ap.add_argument("--mmap", action="store_true",
                    help="--via files: mmap() the block files, not read()")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.print_conf:
        print_conf(a.print_conf, a.dtype, a.hcache)
        return 0
    if not (a.mount and a.ns and a.prompts):
        ap.error("--mount, --ns and --prompts are required")
    with open(a.prompts) as f:
        prompts = [json.loads(l)["tokens"] for l in f if l.strip()]
    longest = max([len(p) for p in prompts] + [16])
    eng = Engine(a.mount, a.ns, a.via, a.dtype, bool(a.hcache), a.mmap,
                 max_tokens=longest)
    try:
        for i, toks in enumerate(prompts):
            logits, cached, saved, ttft = eng.serve(toks)
            out = {"request": i, "tokens": len(toks), "cached_tokens": cached,
                   "saved_blocks": saved, "max_abs_diff": None,
                   "ttft_ms": round(ttft * 1e3, 3), "ttft_full_ms": None}
            if a.check:
                ref, tf = eng.full(toks)
                d = (logits - ref[cached:]).abs().max().item()
                out["max_abs_diff"] = d
                out["ttft_full_ms"] = round(tf * 1e3, 3)
                out["bound"] = eng.bound(toks, ref, cached)
            print(json.dumps(out), flush=True)
    finally:
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
