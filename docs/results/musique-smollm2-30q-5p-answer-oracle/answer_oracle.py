"""The answer oracle (analysis only): `oracle_attention` patched to score each reused context token by
the attention of the question *and of Full Attention's own greedy answer* to it, under Full Attention
(a full prefill, then AO_NEW greedy steps over the exact cache), over the upper half of the layers,
each layer normalised as `query_guided_layers` reads it. It is what a selector that also read the
answer's attention (a second selection pass after the first decoded tokens) could reach at best.
AO_ROWS=qa: question and answer rows (the run reported); AO_ROWS=a: the answer alone (not run).

    AO_ROWS=qa python answer_oracle.py bench quality --methods full_attention,full_reuse,fused+oracle_attention:blend~0.5 ...
"""
import dataclasses
import os
import sys

import torch
from fusionrag_llm.cli.main import main
from fusionrag_llm.kernels.dispatch import critical_scores

from fusionrag_llm.fusion import selectors
from fusionrag_llm.fusion.scorers import query_guided
from fusionrag_llm.models.forward import ForwardPass

ROWS = os.environ.get("AO_ROWS", "qa")
NEW = int(os.environ.get("AO_NEW", "16"))


def answer_scores(inp):
    """Scores per reused slot from the question's and Full Attention's answer's exact attention."""
    model, layout = inp.model, inp.layout
    n = inp.cache.length
    layers = query_guided.upper_half(inp)
    exact = model.new_cache(n + NEW)
    everything = exact.reserve(n)
    step = layout.step(everything, logit_rows=everything[-1:], capture_query_layers=frozenset(layers))
    out = model(step, exact)
    in_suffix = torch.isin(everything, layout.suffix_slots)
    pos_prompt = everything if layout.positions is None else layout.positions
    qs = {l: [out.queries[l][:, in_suffix]] if ROWS == "qa" else [] for l in layers}
    qpos = [pos_prompt[in_suffix]] if ROWS == "qa" else []
    tok = int(out.logits[-1].argmax())
    last = int(pos_prompt.max())
    for t in range(NEW):
        slot = exact.reserve(1)
        p = torch.tensor([last + 1 + t], device=slot.device)
        o = model(ForwardPass(token_ids=torch.tensor([tok], device=slot.device), positions=p, slots=slot,
                              capture_query_layers=frozenset(layers)), exact)
        for l in layers:
            qs[l].append(o.queries[l])
        qpos.append(p)
        tok = int(o.logits[-1].argmax())
    qpos = torch.cat(qpos)
    m = exact.length
    per = []
    for l in layers:
        q = torch.cat(qs[l], dim=1)
        s = critical_scores(q, qpos, exact.keys[l, :, :m], exact.positions[:m], exact.valid[:m], backend=model.kernels)
        s = s[layout.reused_slots].float()
        per.append(s / s.sum().clamp_min(1e-12))
    return torch.stack(per).mean(dim=0)

spec = selectors.SELECTORS["oracle_attention"]
selectors.SELECTORS["oracle_attention"] = dataclasses.replace(spec, scorer=answer_scores, scoring_pass=None, scores_from=None)
sys.argv = ["fusionrag"] + sys.argv[1:]
main()
