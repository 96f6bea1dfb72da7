# SPDX-License-Identifier: MIT
"""SGLang's HiCache L3 storage over kvfs: a thin adapter on core.PageStore.

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name":"kvfs",
          "module_path":"kvfs_engine.sglang_backend",
          "class_name":"KvfsHiCacheStorage",
          "kvfs_mount":"/mnt/kvfs","kvfs_namespace":"llama3-8b"}'

Written against SGLang v0.5.3 (python/sglang/srt/mem_cache/
hicache_storage.py). SGLang hands a backend its page hashes, not token
ids: each page is kept as a one-block chain (core.page_tokens). Values are
one page in the kvfs payload layout. Imports without SGLang.
"""

import os

from .core import PageStore, Store

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
except ImportError:  # SGLang is not installed
    class HiCacheStorage:
        pass


def _conf(storage_config):
    ex = getattr(storage_config, "extra_config", None) or {}
    if isinstance(storage_config, dict):
        ex = storage_config
    return (ex.get("kvfs_mount") or os.environ.get("KVFS_MOUNT"),
            ex.get("kvfs_namespace") or os.environ.get("KVFS_NAMESPACE"))


class KvfsHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config=None, kwargs=None, pages=None):
        if pages is None:
            mnt, ns = _conf(storage_config)
            pages = PageStore(Store(mnt, ns, "files"))
        self.pages = pages

    def get(self, key, target_location=None, target_sizes=None):
        return self.pages.get(key, target_location)

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        locs = target_locations or [None] * len(keys)
        return [self.pages.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.pages.set(key, value if value is not None
                              else target_location)

    def batch_set(self, keys, values=None, target_locations=None,
                  target_sizes=None):
        vals = values if values is not None else target_locations
        return all([self.pages.set(k, v) for k, v in zip(keys, vals)])

    def exists(self, key):
        return self.pages.exists_leading([key]) == 1

    def batch_exists(self, keys):
        """How many leading keys are stored (SGLang loads only those)."""
        return self.pages.exists_leading(keys)
