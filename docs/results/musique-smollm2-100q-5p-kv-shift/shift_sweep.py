"""The sweep that chose ``kv_shift``'s form, on questions 1-30 of the shared 100 (analysis only).

Runs ``fusionrag bench quality`` with the engine's sparse prefill patched so that, at every layer from
SHIFT_FROM up, each chunk's reused tokens take SHIFT_SHARE x the mean change of the chunk's recomputed
tokens' values (SHIFT_PARTS=v) or keys and values (SHIFT_PARTS=kv; keys compared un-rotated). With
SHIFT_PARTS=kv and SHIFT_FROM = half the layers it computes what ``kv_shift=SHIFT_SHARE`` computes
(matched to 2e-7 in KL per question); the other settings are the forms the sweep set aside.

    SHIFT_SHARE=0.5 SHIFT_PARTS=kv SHIFT_FROM=15 python shift_sweep.py bench quality --methods fusionrag~0 ...
"""
import os

import torch

from fusionrag_llm.cli.main import main
from fusionrag_llm.engine import llm_engine

SHARE = float(os.environ.get("SHIFT_SHARE", "0.5"))
PARTS = os.environ.get("SHIFT_PARTS", "kv")
FROM = int(os.environ.get("SHIFT_FROM", "15"))
planned = llm_engine.LLMEngine._plan_prefill


def _plan_prefill(self, work, selected):
    planned(self, work, selected)
    if work.exact or not len(selected):
        return
    model, cache, layout = self.model, work.seq.cache, work.resolved.layout
    sel = selected.sort().values
    reused, pos = layout.reused_slots, cache.positions
    groups = []  # per chunk: (its recomputed slots, its other reused slots)
    for start, end in layout.chunk_spans:
        chunk = reused[(pos[reused] >= start) & (pos[reused] < end)]
        picked = torch.isin(chunk, sel)
        if picked.any() and (~picked).any():
            groups.append((chunk[picked], chunk[~picked]))
    old_keys = model.rotate(cache.keys[:, :, sel].clone(), -pos[sel])  # position-free
    old_values = cache.values[:, :, sel].clone()
    row = {int(s): i for i, s in enumerate(sel.tolist())}

    def spread(layer, q, c, step):  # called once the layer's new K/V are in the cache
        if layer < FROM:
            return
        for picked, left in groups:
            rows = torch.tensor([row[int(s)] for s in picked])
            if "v" in PARTS:
                change = (c.values[layer][:, picked] - old_values[layer][:, rows]).mean(dim=1, keepdim=True)
                c.values[layer][:, left] += SHARE * change
            if "k" in PARTS:
                new = model.rotate(c.keys[layer][None, :, picked], -pos[picked])[0]
                change = (new - old_keys[layer][:, rows]).mean(dim=1, keepdim=True)
                c.keys[layer][:, left] += SHARE * model.rotate(change.expand(-1, len(left), -1)[None].contiguous(), pos[left])[0]

    work.forward.observe = spread


llm_engine.LLMEngine._plan_prefill = _plan_prefill
main()
