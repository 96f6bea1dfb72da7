# SPDX-License-Identifier: MIT
"""A small decoder in the Llama architecture, on a paged KV cache.

RMSNorm, rotate-half RoPE, grouped-query attention, a SwiGLU MLP; random
weights from a fixed seed (nothing is downloaded). The KV cache is paged
in vLLM's layout, one tensor [num_pages, 2, block_size, kv_heads,
head_dim] per layer (core.PagedKV). The weights export as a Hugging Face
style safetensors checkpoint, which kvfs loads to rebuild K and V from
hidden states (docs/hcache.md).
"""

import json
import math
import struct

import torch


class Config:
    """The model's shape. Defaults: a 4-layer GQA model (8 query heads, 2
    KV heads of 32), vocabulary 1024."""

    def __init__(self, vocab=1024, hidden=256, layers=4, heads=8,
                 kv_heads=2, head_dim=32, intermediate=688,
                 rope_theta=10000.0, eps=1e-5, block_tokens=16, seed=1234):
        self.vocab = vocab
        self.hidden = hidden
        self.layers = layers
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.intermediate = intermediate
        self.rope_theta = rope_theta
        self.eps = eps
        self.block_tokens = block_tokens
        self.seed = seed


def rms_norm(x, w, eps):
    """Hugging Face's LlamaRMSNorm: in f32, then back to the dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos and sin [n, head_dim] for rotate-half RoPE, angles in double
    (as kvfs's restoration computes them)."""
    inv = torch.tensor([theta ** (-2.0 * j / head_dim)
                        for j in range(head_dim // 2)], dtype=torch.float64)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Model:
    """The decoder. ``dtype`` is torch.float32 or torch.bfloat16."""

    def __init__(self, cfg, dtype=torch.float32):
        self.cfg = cfg
        self.dtype = dtype
        gen = torch.Generator().manual_seed(cfg.seed)

        def rnd(*shape, scale):
            return (torch.randn(*shape, generator=gen) * scale)

        h, kvd = cfg.hidden, cfg.kv_heads * cfg.head_dim
        qd = cfg.heads * cfg.head_dim
        w = {"model.embed_tokens.weight": rnd(cfg.vocab, h, scale=1.0)}
        for i in range(cfg.layers):
            p = "model.layers.%d." % i
            w[p + "input_layernorm.weight"] = 1.0 + rnd(h, scale=0.1)
            w[p + "self_attn.q_proj.weight"] = rnd(qd, h, scale=h ** -0.5)
            w[p + "self_attn.k_proj.weight"] = rnd(kvd, h, scale=h ** -0.5)
            w[p + "self_attn.v_proj.weight"] = rnd(kvd, h, scale=h ** -0.5)
            w[p + "self_attn.o_proj.weight"] = rnd(h, qd, scale=qd ** -0.5)
            w[p + "post_attention_layernorm.weight"] = 1.0 + rnd(h, scale=0.1)
            w[p + "mlp.gate_proj.weight"] = rnd(cfg.intermediate, h,
                                                scale=h ** -0.5)
            w[p + "mlp.up_proj.weight"] = rnd(cfg.intermediate, h,
                                              scale=h ** -0.5)
            w[p + "mlp.down_proj.weight"] = rnd(h, cfg.intermediate,
                                                scale=cfg.intermediate ** -0.5)
        w["model.norm.weight"] = 1.0 + rnd(h, scale=0.1)
        w["lm_head.weight"] = rnd(cfg.vocab, h, scale=h ** -0.5)
        self.w32 = w
        self.w = {k: v.to(dtype) for k, v in w.items()}

    def export_safetensors(self, path):
        """Write the f32 weights as a .safetensors file (kvfs reads
        input_layernorm, k_proj and v_proj of each layer)."""
        names = sorted(self.w32)
        header, off, blobs = {}, 0, []
        for n in names:
            t = self.w32[n].contiguous()
            b = t.numpy().tobytes()
            header[n] = {"dtype": "F32", "shape": list(t.shape),
                         "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        hj = json.dumps(header, separators=(",", ":")).encode()
        hj += b" " * (-len(hj) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hj)))
            f.write(hj)
            for b in blobs:
                f.write(b)

    def forward(self, tokens, start, layers, pages, hidden_out=None):
        """Prefill ``tokens`` (positions start..start+n-1) on top of the
        KV already in the paged cache for positions 0..start-1.

        ``layers``: per-layer cache tensors [num_pages, 2, bs, h, d];
        ``pages``: the request's page table (page of block j). Writes the
        new tokens' K and V into their pages; returns the logits
        [n, vocab] in f32. With ``hidden_out`` (a tensor [layers, >=
        start+n, hidden]) each layer's input hidden states of the new
        tokens are stored there (for HCache saves).
        """
        cfg, w, dt = self.cfg, self.w, self.dtype
        bs, hd = cfg.block_tokens, cfg.head_dim
        n = len(tokens)
        end = start + n
        pos = torch.arange(start, end)
        cos, sin = rope_cos_sin(pos, hd, cfg.rope_theta, dt)
        x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
        pg = torch.tensor(pages, dtype=torch.long)
        blk, off = pos // bs, pos % bs
        # causal mask of the new queries over all end keys
        allowed = torch.arange(end)[None, :] <= pos[:, None]
        mask = torch.zeros(n, end).masked_fill(~allowed, float("-inf"))
        rep = cfg.heads // cfg.kv_heads
        scale = 1.0 / math.sqrt(hd)
        n_pages = -(-end // bs)
        for i in range(cfg.layers):
            p = "model.layers.%d." % i
            if hidden_out is not None:
                hidden_out[i, start:end] = x
            xn = rms_norm(x, w[p + "input_layernorm.weight"], cfg.eps)
            q = (xn @ w[p + "self_attn.q_proj.weight"].T).view(n, cfg.heads,
                                                               hd)
            k = (xn @ w[p + "self_attn.k_proj.weight"].T).view(
                n, cfg.kv_heads, hd)
            v = (xn @ w[p + "self_attn.v_proj.weight"].T).view(
                n, cfg.kv_heads, hd)
            q = q * cos[:, None] + rotate_half(q) * sin[:, None]
            k = k * cos[:, None] + rotate_half(k) * sin[:, None]
            cache = layers[i]
            cache[pg[blk], 0, off] = k.to(cache.dtype)
            cache[pg[blk], 1, off] = v.to(cache.dtype)
            kv = cache[pg[:n_pages]]  # [np, 2, bs, kvh, hd]
            ka = kv[:, 0].reshape(-1, cfg.kv_heads, hd)[:end].to(dt)
            va = kv[:, 1].reshape(-1, cfg.kv_heads, hd)[:end].to(dt)
            ka = ka.repeat_interleave(rep, dim=1)  # [end, heads, hd]
            va = va.repeat_interleave(rep, dim=1)
            s = torch.einsum("qhd,khd->hqk", q.float(), ka.float()) * scale
            a = torch.softmax(s + mask, dim=-1)
            o = torch.einsum("hqk,khd->qhd", a.to(dt), va).reshape(n, -1)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            xn = rms_norm(x, w[p + "post_attention_layernorm.weight"],
                          cfg.eps)
            g = xn @ w[p + "mlp.gate_proj.weight"].T
            u = xn @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ \
                w[p + "mlp.down_proj.weight"].T
        x = rms_norm(x, w["model.norm.weight"], cfg.eps)
        return (x @ w["lm_head.weight"].T).float()
