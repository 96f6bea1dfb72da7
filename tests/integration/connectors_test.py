# SPDX-License-Identifier: MIT
"""The vLLM and SGLang adapters (client/kvfs_engine): their translation
with fakes of the engines' objects and a fake core, then end to end on
a mount (argv[1], namespace argv[2]) with the real core."""
import os
import sys
import types
import unittest

import torch

from kvfs_engine import core, sglang_backend, vllm_connector

MNT, NS = sys.argv[1], sys.argv[2]


class FakeCore:
    def __init__(self, bt=16):
        self.g = types.SimpleNamespace(block_tokens=bt)
        self.calls = []

    def __getattr__(self, name):
        def rec(*a):
            self.calls.append((name,) + a)
            return {"match": 32, "take_load_errors": {7}}.get(name)
        return rec


def req(rid, toks):
    return types.SimpleNamespace(request_id=rid, prompt_token_ids=toks)


def new_req(rid, toks, ids, computed):
    return types.SimpleNamespace(req_id=rid, prompt_token_ids=toks,
                                 block_ids=(ids,), num_computed_tokens=computed)


class Blocks:
    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (self.ids,)


class VllmTranslation(unittest.TestCase):
    def test_scheduler_and_worker(self):
        fc = FakeCore()
        c = vllm_connector.KvfsConnector(None, vllm_connector.KVConnectorRole.SCHEDULER, core=fc)
        toks = list(range(50))
        self.assertEqual(c.get_num_new_matched_tokens(req("a", toks), 0), (32, False))
        self.assertEqual(fc.calls[-1], ("match", toks, 0))
        c.update_state_after_alloc(req("a", toks), Blocks([5, 6, 7, 8]), 32)
        so = types.SimpleNamespace(scheduled_new_reqs=[new_req("a", toks, [5, 6, 7, 8], 0)],
                                   num_scheduled_tokens={"a": 18})
        m = c.build_connector_meta(so)
        self.assertEqual(m.loads, [(toks, 0, [5, 6])])
        self.assertEqual(m.saves, [])  # blocks 0-1 load, 2-3 not yet computed
        self.assertEqual(c.build_connector_meta(types.SimpleNamespace()).loads, [])
        self.assertEqual(c.request_finished(req("a", toks), [5]), (False, None))
        w = vllm_connector.KvfsConnector(None, vllm_connector.KVConnectorRole.WORKER, core=fc)
        kv = {"model.layers.1.attn": torch.zeros(2, 9, 16, 2, 4),
              "model.layers.0.attn": torch.zeros(9, 2, 16, 2, 4)}
        w.register_kv_caches(kv)
        reg = [x for x in fc.calls if x[0] == "register"][-1][1]
        self.assertEqual([tuple(t.shape) for t in reg], [(9, 2, 16, 2, 4)] * 2)
        w.bind_connector_metadata(m)
        w.start_load_kv(None)
        self.assertEqual(fc.calls[-1], ("start_load", m.loads))
        w.wait_for_layer_load("model.layers.1.attn")
        self.assertEqual(fc.calls[-1], ("wait_layer", 1))
        w.save_kv_layer("model.layers.0.attn", None, None)
        w.wait_for_save()
        self.assertEqual(fc.calls[-2:], [("finish_load",), ("save", m.saves)])
        self.assertEqual(w.get_finished({"a"}), (None, None))
        self.assertEqual(w.get_block_ids_with_load_errors(), {7})


class FakePages:
    def __init__(self):
        self.d = {}

    def get(self, k, out=None):
        return self.d.get(k)

    def set(self, k, v):
        self.d[k] = v
        return True

    def exists_leading(self, keys):
        n = 0
        for k in keys:
            if k not in self.d:
                break
            n += 1
        return n


class SglangTranslation(unittest.TestCase):
    def test_calls(self):
        s = sglang_backend.KvfsHiCacheStorage(pages=FakePages())
        self.assertTrue(s.batch_set(["a", "b"], [1, 2]))
        self.assertTrue(s.set("d", target_location=4))
        self.assertEqual(s.get("a"), 1)
        self.assertEqual(s.batch_get(["b", "c"]), [2, None])
        self.assertTrue(s.exists("d"))
        self.assertEqual(s.batch_exists(["a", "b", "c", "d"]), 2)


class OnMount(unittest.TestCase):
    def test_vllm_round_trip(self):
        sch = vllm_connector.KvfsConnector(None, vllm_connector.KVConnectorRole.SCHEDULER,
                                           core=core.ConnectorCore(MNT, NS))
        wk = vllm_connector.KvfsConnector(None, vllm_connector.KVConnectorRole.WORKER,
                                          core=core.ConnectorCore(MNT, NS))
        g = wk.core.g
        shape = (2, 12, g.block_tokens, g.n_kv_heads, g.head_dim)
        caches = {"layers.%d.attn" % l: torch.randn(shape).to(g.tdtype)
                  for l in range(g.n_layers)}
        wk.register_kv_caches(caches)
        toks = [int(x) for x in torch.randint(0, 1000, (70,), generator=torch.Generator().manual_seed(5))]
        # step 1: nothing cached; the prompt is computed and saved
        self.assertEqual(sch.get_num_new_matched_tokens(req("a", toks), 0), (0, False))
        sch.update_state_after_alloc(req("a", toks), Blocks([0, 1, 2, 3, 4]), 0)
        m = sch.build_connector_meta(types.SimpleNamespace(
            scheduled_new_reqs=[new_req("a", toks, [0, 1, 2, 3, 4], 0)],
            num_scheduled_tokens={"a": 70}))
        wk.bind_connector_metadata(m)
        wk.start_load_kv(None)
        wk.wait_for_save()
        # step 2: same prompt, other pages: 64 tokens come from kvfs
        n, _ = sch.get_num_new_matched_tokens(req("b", toks), 0)
        self.assertEqual(n, 64)
        sch.update_state_after_alloc(req("b", toks), Blocks([7, 8, 9, 10, 11]), n)
        m = sch.build_connector_meta(types.SimpleNamespace(
            scheduled_new_reqs=[new_req("b", toks, [7, 8, 9, 10, 11], 0)],
            num_scheduled_tokens={"b": 6}))
        wk.bind_connector_metadata(m)
        wk.start_load_kv(None)
        for name in caches:
            wk.wait_for_layer_load(name)
        wk.wait_for_save()
        self.assertEqual(wk.get_block_ids_with_load_errors(), set())
        for t in caches.values():
            self.assertTrue(torch.equal(t[:, 0:4], t[:, 7:11]))
        # a block gone between the match and the load: reported, unused
        n, _ = sch.get_num_new_matched_tokens(req("c", toks), 0)
        sch.update_state_after_alloc(req("c", toks), Blocks([5, 6, 7, 8, 9]), n)
        keys = wk.core.store.keys(toks)
        os.unlink(wk.core.store.path(keys[1]))
        m = sch.build_connector_meta(types.SimpleNamespace())
        wk.bind_connector_metadata(m)
        wk.start_load_kv(None)
        wk.wait_for_save()
        self.assertEqual(wk.get_block_ids_with_load_errors(), {5, 6, 7, 8})

    def test_sglang_round_trip(self):
        s = sglang_backend.KvfsHiCacheStorage({"kvfs_mount": MNT, "kvfs_namespace": NS})
        g = s.pages.g
        page = torch.randn(g.payload_bytes(g.block_tokens) // g.esz).to(g.tdtype)
        self.assertTrue(s.batch_set(["h1", "h2"], [page, page * 2]))
        self.assertTrue(s.set("h1", page))  # already there
        self.assertEqual(s.batch_exists(["h1", "h2", "h3", "h1"]), 2)
        self.assertFalse(s.exists("h3"))
        self.assertTrue(torch.equal(s.get("h2").view(g.tdtype), page * 2))
        out = torch.empty_like(page)
        got = s.batch_get(["h1", "h3"], [out, None])
        self.assertTrue(torch.equal(out, page))
        self.assertIsNone(got[1])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
