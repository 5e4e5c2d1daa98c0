"""Peer methods on the one engine: A3 (layer-1 question attention after layer 0 over every token) and
EPIC (the first tokens of every chunk). Their rules against hand-made expectations, and every
method of the registry through generate, stream, logits, generate_many and the CLI."""

import pytest
import torch
from click.testing import CliRunner

from fusionrag_llm import METHODS, FusionRAG, RAGRequest
from fusionrag_llm.cli.main import cli
from fusionrag_llm.engine.methods import plan_run
from fusionrag_llm.fusion.layout import RequestLayout
from fusionrag_llm.fusion.selectors import select_tokens
from fusionrag_llm.models.forward import ForwardPass

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater, a city at the mouth of the river Sel.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals.",
]
REQUEST = RAGRequest(chunks=[CHUNKS[2], CHUNKS[0], CHUNKS[1]], question="Where was the lighthouse designer born?")


def chunk_layout(spans):
    end = spans[-1][1] + 3
    reused = torch.cat([torch.arange(s, e) for s, e in spans])
    fresh = torch.tensor([p for p in range(end) if not any(s <= p < e for s, e in spans)])
    return RequestLayout(torch.zeros(end, dtype=torch.long), reused, fresh, fresh[-3:], tuple(spans))


def test_epic_recomputes_the_first_tokens_of_every_chunk():
    layout = chunk_layout([(2, 12), (13, 23), (24, 30)])
    assert select_tokens("chunk_starts", 6, None, None, layout).tolist() == [2, 3, 13, 14, 24, 25]
    assert select_tokens("chunk_starts", 7, None, None, layout).tolist() == [2, 3, 4, 13, 14, 24, 25]  # ties: earlier chunk
    assert select_tokens("chunk_starts", 20, None, None, layout).tolist() == [*range(2, 9), *range(13, 20), *range(24, 30)]


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    rag.add_chunks(CHUNKS, embeddings=[[1, 0.2], [0.9, 0.4], [0.7, 0.7]], neighbors=2)
    return rag


def test_a3_ranks_by_the_exact_layer_one_attention_of_the_question(rag):
    """Layer 0 over every token makes layer 1's queries and keys those of Full Attention: the
    selection must be the top of Full Attention's layer-1 attention from the question."""
    engine, model = rag.engine, rag.engine.model
    seq = engine._sequence(rag.segments(REQUEST), plan_run("a3", 0.3), 1)
    work = engine._assemble(seq)
    layout = work.resolved.layout
    picked = select_tokens("early_attention", work.k, model, seq.cache, layout)

    n = len(layout.token_ids)
    cache = model.new_cache(n)
    slots = cache.reserve(n)
    out = model(ForwardPass(layout.token_ids, torch.arange(n), slots, logit_rows=slots[:0],
                            capture_query_layers=frozenset({1})), cache)  # fmt: skip
    queries = out.queries[1][:, layout.suffix_slots].float()  # [heads, q, d]
    keys = cache.keys[1, :, :n].float().repeat_interleave(model.cfg.num_heads // model.cfg.num_kv_heads, dim=0)
    logits = queries @ keys.transpose(1, 2) / model.cfg.head_dim**0.5
    causal = torch.arange(n)[None, :] <= layout.suffix_slots[:, None]
    weights = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1).sum(dim=(0, 1))
    expected = layout.reused_slots[torch.topk(weights[layout.reused_slots], work.k).indices].sort().values
    assert work.k > 0 and picked.tolist() == expected.tolist()


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_runs_through_every_entry_point(rag, method):
    knobs = dict(method=method, recompute_ratio=0.3)
    alone = rag.generate(REQUEST, max_new_tokens=4, **knobs)
    streamed = "".join(rag.stream(REQUEST, max_new_tokens=4, **knobs))
    assert streamed == alone.text
    assert [o.token_ids for o in rag.generate_many([REQUEST, REQUEST], max_new_tokens=4, **knobs)] == [alone.token_ids] * 2
    logits = rag.logits(REQUEST, alone.token_ids, **knobs)
    assert logits.shape[0] == len(alone.token_ids) + 1  # before each answer token, and after the last
    assert logits[:-1].argmax(dim=-1).tolist() == alone.token_ids  # the greedy answer, scored the same way


@pytest.mark.parametrize("method", ["a3", "epic"])
def test_the_cli_offers_the_peer_methods(tmp_path, method):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(CHUNKS):
        (docs / f"{i}.md").write_text(text)
    store = str(tmp_path / "store")
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(docs), "--model", "tiny", "--store", store, "--neighbors", "1"]).exit_code == 0
    result = runner.invoke(cli, ["query", "Where was the designer born?", "--model", "tiny", "--store", store,
                                 "--method", method, "--ratio", "0.3", "--top-k", "3", "--max-new-tokens", "2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"{method} (r=0.3)" in result.output
