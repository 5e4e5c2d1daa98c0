"""CacheClip with a separate auxiliary model of the same tokenizer (``auxiliary=`` a name, path or
engine): its last layer's attention from the question to each chunk, checked by hand."""

import dataclasses

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.fusion.layout import ScoringInput
from fusionrag_llm.fusion.scorers import auxiliary_attention
from fusionrag_llm.models.forward import ForwardPass
from fusionrag_llm.models.loader import load_model
from fusionrag_llm.models.tiny import byte_tokenizer
from fusionrag_llm.models.tokenizer import ChatTokenizer
from method_spy import spy

CHUNKS = [
    "The lighthouse at Carrow Point was lit for the first time in 1862 by the harbour board.",
    "Its keeper, Tomas Vell, kept a log of every ship that passed the point for forty years.",
    "The log was lost in the harbour fire of 1901, with the rest of the board's archive.",
]
REQUEST = RAGRequest(chunks=[CHUNKS[2], CHUNKS[0], CHUNKS[1]], question="Who kept the log?")


def _scores(rag):
    """CacheClip's scores of the request's reused tokens over its cache as assembled."""
    engine = rag.engine
    method, seen = spy("cacheclip")
    rag.generate(REQUEST, method=method, recompute_ratio=0.3, max_new_tokens=1)
    layout = seen[0].layout
    inp = ScoringInput(engine.model, seen[0].placed, layout, auxiliary_layers=engine.auxiliary_layers,
                       auxiliary_model=engine.auxiliary_model)  # fmt: skip
    return auxiliary_attention.scores(inp), layout


def _rag(auxiliary):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False, "auxiliary": auxiliary})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0.2], [0.9, 0.4], [0.7, 0.7]], neighbors=2)
    return rag


def test_a_separate_models_scores_are_its_last_layer_attention_to_each_chunk_alone():
    rag = _rag("tiny-qwen2")
    aux = rag.engine.auxiliary_model
    assert aux is not None and aux is not rag.engine.model and rag.engine.auxiliary_layers is None
    got, layout = _scores(rag)
    last = aux.cfg.num_layers - 1
    s0, question = layout.token_ids[: layout.prefix_length], layout.token_ids[layout.suffix_slots]
    owner = torch.searchsorted(torch.tensor([s for s, _ in layout.chunk_spans]), layout.reused_slots, right=True) - 1
    checked = 0
    for index, (start, end) in enumerate(layout.chunk_spans):
        if not bool((owner == index).any()):
            continue  # the chunk right after S0 is exact: never selected, not scored
        ids = torch.cat([s0, layout.token_ids[start:end], question])
        n, first_q = len(ids), len(ids) - len(question)
        cache = aux.new_cache(n)
        slots = cache.reserve(n)
        out = aux(ForwardPass(ids, torch.arange(n), slots, logit_rows=slots[:0], capture_query_layers=frozenset({last})), cache)
        queries = out.queries[last][:, first_q:].float()
        keys = cache.keys[last, :, :n].float().repeat_interleave(aux.cfg.num_heads // aux.cfg.num_kv_heads, dim=0)
        logits = queries @ keys.transpose(1, 2) / aux.cfg.head_dim**0.5
        causal = torch.arange(n)[None, :] <= torch.arange(first_q, n)[:, None]
        weights = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1).sum(dim=(0, 1))
        torch.testing.assert_close(got[owner == index], weights[len(s0) : first_q], rtol=1e-4, atol=1e-5)
        checked += 1
    assert checked == 2


def test_the_main_model_as_a_separate_auxiliary_scores_as_all_its_layers_do():
    by_layers, _ = _scores(_rag(3))  # every layer of the main model, read from the request cache
    separate, _ = _scores(_rag("tiny"))  # the same weights, loaded again and run on their own
    torch.testing.assert_close(separate, by_layers, rtol=1e-4, atol=1e-5)


def test_a_separate_auxiliary_runs_every_entry_point_and_r1_stays_exact():
    rag = _rag("tiny-qwen2")
    full = rag.generate(REQUEST, method="full_attention", max_new_tokens=4)
    assert rag.generate(REQUEST, method="cacheclip", recompute_ratio=1.0, max_new_tokens=4).token_ids == full.token_ids
    out = rag.generate(REQUEST, method="cacheclip", recompute_ratio=0.6, max_new_tokens=4)
    assert out.stats.recomputed_tokens > 0
    assert "".join(rag.stream(REQUEST, method="cacheclip", recompute_ratio=0.6, max_new_tokens=4)) == out.text
    assert rag.generate_many([REQUEST], method="cacheclip", recompute_ratio=0.6, max_new_tokens=4)[0].token_ids == out.token_ids
    engine = FusionRAG.from_pretrained("tiny", store=":memory:", options={"auxiliary": rag})  # an engine: its model
    assert engine.engine.auxiliary_model is rag.engine.model


def test_an_auxiliary_model_with_another_tokenizer_is_refused():
    loaded = load_model("tiny-qwen2")
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    stranger = dataclasses.replace(loaded, name="stranger", tokenizer=ChatTokenizer(other))
    with pytest.raises(ValueError, match="the auxiliary model 'stranger' does not share the tokenizer of 'tiny'"):
        FusionRAG.from_pretrained("tiny", store=":memory:", options={"auxiliary": stranger})
