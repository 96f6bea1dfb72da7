# SPDX-License-Identifier: MIT
"""vLLM's KV connector API v1 over kvfs: a thin adapter on core.ConnectorCore.

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"KvfsConnector",
        "kv_connector_module_path":"kvfs_engine.vllm_connector",
        "kv_role":"kv_both",
        "kv_connector_extra_config":{"kvfs_mount":"/mnt/kvfs",
                                     "kvfs_namespace":"llama3-8b"}}'

Written against vLLM v0.11.0 (vllm/distributed/kv_transfer/kv_connector/
v1/base.py). Every method only translates vLLM's objects into core calls;
the logic is in the core, which the reference engine tests. Imports
without vLLM (the base classes are then stand-ins).
"""

import enum
import os
import re

from .core import ConnectorCore

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
except ImportError:  # vLLM is not installed: stand-ins of the same shape
    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        pass

    class KVConnectorBase_V1:
        def __init__(self, vllm_config, role):
            self._vllm_config = vllm_config
            self._role = role
            self._connector_metadata = None

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            return self._connector_metadata


class KvfsConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers for one step: loads and saves
    as (token ids, first block of the prompt, block ids)."""

    def __init__(self, loads=None, saves=None):
        self.loads = loads or []
        self.saves = saves or []


def _extra(vllm_config):
    kt = getattr(vllm_config, "kv_transfer_config", None)
    ex = getattr(kt, "kv_connector_extra_config", None) or {}
    return (ex.get("kvfs_mount") or os.environ.get("KVFS_MOUNT"),
            ex.get("kvfs_namespace") or os.environ.get("KVFS_NAMESPACE"))


def _block_ids(blocks):
    """KVCacheBlocks (or a list of ids, or a tuple of per-group lists) to
    the first group's ids."""
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    if blocks and isinstance(blocks[0], (list, tuple)):
        blocks = blocks[0]
    return list(blocks)


def _layer_index(name):
    m = re.findall(r"\d+", name)
    return int(m[-1]) if m else 0


class KvfsConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, core=None):
        super().__init__(vllm_config, role)
        mnt, ns = _extra(vllm_config)
        self.core = core or ConnectorCore(mnt, ns, "ctl")
        self.bt = self.core.g.block_tokens
        self._matched = {}   # req id -> (num_computed, num_external)
        self._loads = []
        self._layers = {}    # layer name -> index

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        n = self.core.match(list(request.prompt_token_ids),
                            num_computed_tokens)
        self._matched[request.request_id] = (num_computed_tokens, n)
        return n, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        computed, _ = self._matched.get(request.request_id, (0, 0))
        first = computed // self.bt
        ids = _block_ids(blocks)
        n = num_external_tokens // self.bt
        self._loads.append((list(request.prompt_token_ids), first,
                            ids[first:first + n]))

    def build_connector_meta(self, scheduler_output):
        saves = []
        sched = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for r in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            toks = list(r.prompt_token_ids)
            done = r.num_computed_tokens + sched.get(r.req_id, 0)
            last = min(done, len(toks)) // self.bt
            _, ext = self._matched.pop(r.req_id, (0, 0))
            first = (r.num_computed_tokens + ext) // self.bt
            ids = _block_ids(r.block_ids)
            if last > first:
                saves.append((toks, first, ids[first:last]))
        meta = KvfsConnectorMetadata(self._loads, saves)
        self._loads = []
        return meta

    def request_finished(self, request, block_ids):
        # Saves complete in wait_for_save: the blocks may be freed now.
        self._matched.pop(request.request_id, None)
        return False, None

    # ---- worker side
    def register_kv_caches(self, kv_caches):
        names = sorted(kv_caches, key=_layer_index)
        self._layers = {n: i for i, n in enumerate(names)}
        layers = []
        for n in names:
            t = kv_caches[n]
            # FlashAttention's [2, num_blocks, ...] as [num_blocks, 2, ...]
            if t.dim() == 5 and t.shape[0] == 2 and t.shape[1] != 2:
                t = t.transpose(0, 1)
            layers.append(t)
        self.core.register(layers)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self.core.start_load(meta.loads if meta else [])

    def wait_for_layer_load(self, layer_name):
        self.core.wait_layer(self._layers.get(layer_name, 0))

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        # The pages are read whole in wait_for_save (one SAVE per block).
        return None

    def wait_for_save(self):
        self.core.finish_load()
        meta = self._get_connector_metadata()
        if meta:
            self.core.save(meta.saves)

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return self.core.take_load_errors()
