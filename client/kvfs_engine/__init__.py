# SPDX-License-Identifier: MIT
"""kvfs_engine: engines on kvfs.

- ``core``: the connector core every adapter shares (keys, block images,
  paged cache <-> block payload, batched LOOKUP / FETCH_INTO / SAVE);
- ``model``, ``engine``: the reference engine, a small Llama-architecture
  decoder on a paged KV cache (``kvfs-torch-engine``);
- ``vllm_connector``, ``sglang_backend``: thin adapters for vLLM's KV
  connector API v1 and SGLang's HiCache storage backends.

docs/engines.md describes them.
"""
