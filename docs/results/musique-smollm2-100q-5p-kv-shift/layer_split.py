"""Recomputing the selected tokens in only the upper (or lower) layers, on the shared 100 (analysis only).

Runs ``fusionrag bench quality`` with the engine's sparse prefill patched so that the selected
tokens keep their reused K/V at every layer below UPPER_FROM (or from LOWER_TO up): the question
and the selected tokens read the reused KV there. Recomputing 2x the tokens in half the layers
costs what r = 0.15 costs in all of them; with stored hidden states at the split layer it could be
run for that cost (this emulation still runs every layer).

    UPPER_FROM=15 python layer_split.py bench quality --methods fusionrag --ratios 0.3 ...
"""
import os

from fusionrag_llm.cli.main import main
from fusionrag_llm.engine import llm_engine

UPPER_FROM = int(os.environ.get("UPPER_FROM", 0))
LOWER_TO = int(os.environ.get("LOWER_TO", 10**6))
planned = llm_engine.LLMEngine._plan_prefill


def _plan_prefill(self, work, selected):
    planned(self, work, selected)
    if work.exact or not len(selected):
        return
    cache = work.seq.cache
    keys, values = cache.keys[:, :, selected].clone(), cache.values[:, :, selected].clone()

    def keep_reused(layer, q, c, step):  # called once the layer's new K/V are in the cache
        if layer < UPPER_FROM or layer >= LOWER_TO:
            c.keys[layer][:, selected] = keys[layer]
            c.values[layer][:, selected] = values[layer]

    work.forward.observe = keep_reused


llm_engine.LLMEngine._plan_prefill = _plan_prefill
main()
