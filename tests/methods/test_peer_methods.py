"""Peer methods on the one engine: A3 (layer-1 question attention after layer 0 over every token),
EPIC (the first tokens of every chunk) and CacheClip (a shallower model's question attention, chunk
by chunk, in 8-token windows). Their rules against hand-made expectations, and every
method of the registry through generate, stream, logits, generate_many and the CLI."""

import pytest
import torch
from click.testing import CliRunner
from cli_store import cli_ingested_store

from fusionrag_llm import FusionRAG, get_method, method_names
from fusionrag_llm.cli.main import cli
from fusionrag_llm.fusion.layout import RequestLayout, ScoringInput
from fusionrag_llm.fusion.scorers import auxiliary_attention
from fusionrag_llm.methods.base import select_many
from fusionrag_llm.models.forward import ForwardPass
from method_spy import spy
from lighthouse import CHUNKS, REQUEST, lighthouse_rag



def chunk_layout(spans):
    end = spans[-1][1] + 3
    reused = torch.cat([torch.arange(s, e) for s, e in spans])
    fresh = torch.tensor([p for p in range(end) if not any(s <= p < e for s, e in spans)])
    return RequestLayout(torch.zeros(end, dtype=torch.long), reused, fresh, fresh[-3:], tuple(spans))


def epic(layout, k):
    """EPIC's picks without a model: its scores read only the layout."""
    return select_many([(get_method("epic"), k, ScoringInput(None, None, layout, k=k))], None)[0]


def test_epic_recomputes_the_first_tokens_of_every_chunk():
    layout = chunk_layout([(2, 12), (13, 23), (24, 30)])
    assert epic(layout, 6).tolist() == [2, 3, 13, 14, 24, 25]
    assert epic(layout, 7).tolist() == [2, 3, 4, 13, 14, 24, 25]  # ties: earlier chunk
    assert epic(layout, 20).tolist() == [*range(2, 9), *range(13, 20), *range(24, 30)]


@pytest.fixture(scope="module")
def rag():
    return lighthouse_rag()


def test_a3_ranks_by_the_exact_layer_one_attention_of_the_question(rag):
    """Layer 0 over every token makes layer 1's queries and keys those of Full Attention: the
    selection must be the top of Full Attention's layer-1 attention from the question."""
    model = rag.engine.model
    method, seen = spy("a3")
    rag.generate(REQUEST, method=method, recompute_ratio=0.3, max_new_tokens=1)
    layout, picked = seen[0].layout, seen[0].prefill.selected
    k = round(0.3 * len(layout.reused_slots))

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
    expected = layout.reused_slots[torch.topk(weights[layout.reused_slots], k).indices].sort().values
    assert k > 0 and picked.tolist() == expected.tolist()


@pytest.mark.parametrize("method", method_names())
def test_every_method_runs_through_every_entry_point(rag, method):
    knobs = dict(method=method, recompute_ratio=0.3)
    alone = rag.generate(REQUEST, max_new_tokens=4, **knobs)
    streamed = "".join(rag.stream(REQUEST, max_new_tokens=4, **knobs))
    assert streamed == alone.text
    assert [o.token_ids for o in rag.generate_many([REQUEST, REQUEST], max_new_tokens=4, **knobs)] == [alone.token_ids] * 2
    logits = rag.logits(REQUEST, alone.token_ids, **knobs)
    assert logits.shape[0] == len(alone.token_ids) + 1  # before each answer token, and after the last
    assert logits[:-1].argmax(dim=-1).tolist() == alone.token_ids  # the greedy answer, scored the same way


@pytest.mark.parametrize("method", ["a3", "epic", "cacheclip", "cache_craft", "ape"])
def test_the_cli_offers_the_peer_methods(tmp_path, method):
    store = cli_ingested_store(tmp_path, CHUNKS)
    runner = CliRunner()
    result = runner.invoke(cli, ["query", "Where was the designer born?", "--model", "tiny", "--store", store,
                                 "--method", method, "--ratio", "0.3", "--top-k", "3", "--max-new-tokens", "2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"{method} (r={0.0 if method == 'ape' else 0.3})" in result.output  # APE recomputes nothing


def test_the_cli_ratio_defaults_to_the_methods_own(tmp_path):
    store = cli_ingested_store(tmp_path, CHUNKS)
    for method, own in (("a3", 0.15), ("full_reuse", 0.0)):
        result = CliRunner().invoke(cli, ["query", "Where was the designer born?", "--model", "tiny", "--store", store,
                                          "--method", method, "--top-k", "3", "--max-new-tokens", "2"])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert f"{method} (r={own})" in result.output


def test_cacheclip_keeps_only_windows_with_more_than_five_picks():
    """Windows of 8 tokens start at each chunk's first token; picks in a window with 5 or fewer go."""
    layout = chunk_layout([(3, 19), (20, 28)])  # windows 3-10, 11-18 | 20-27
    scores = torch.zeros(len(layout.reused_slots))
    high = {3: 9, 4: 9, 5: 9, 6: 9, 7: 9, 8: 9, 11: 8, 12: 8, 20: 7, 21: 7, 22: 7, 23: 7, 24: 7}
    for slot, value in high.items():
        scores[(layout.reused_slots == slot).nonzero()] = value
    pick = get_method("cacheclip").pick
    assert pick(layout, scores, 13).tolist() == [3, 4, 5, 6, 7, 8]  # 6 > 5 kept; 2 and 5 dropped
    scores[(layout.reused_slots == 27).nonzero()] = 7
    assert pick(layout, scores, 14).tolist() == [3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 24, 27]
    assert pick(layout, scores, 5).tolist() == []  # no window reaches 6 picks


def test_cacheclip_scores_are_the_shallow_models_attention_to_each_chunk_alone():
    """The auxiliary model is the first 2 of tiny's 3 layers. Its score of a chunk token must be the
    attention the question gives it in an exact run of [S0, that chunk, question] through those
    layers (softmax over all three parts, only the chunk read), whatever the other chunks."""
    rag = lighthouse_rag(auxiliary=2)
    model = rag.engine.model
    method, seen = spy("cacheclip")
    rag.generate(REQUEST, method=method, recompute_ratio=0.3, max_new_tokens=1)
    layout = seen[0].layout
    got = auxiliary_attention.scores(ScoringInput(model, seen[0].placed, layout, auxiliary_layers=2))

    s0 = layout.token_ids[: layout.prefix_length]
    question = layout.token_ids[layout.suffix_slots]
    owner = torch.searchsorted(torch.tensor([s for s, _ in layout.chunk_spans]), layout.reused_slots, right=True) - 1
    checked = 0
    for index, (start, end) in enumerate(layout.chunk_spans):
        if not bool((owner == index).any()):
            continue  # the chunk right after S0 is exact: never selected, not scored
        ids = torch.cat([s0, layout.token_ids[start:end], question])
        n, first_q = len(ids), len(ids) - len(question)
        cache = model.new_cache(n)
        slots = cache.reserve(n)
        out = model(ForwardPass(ids, torch.arange(n), slots, logit_rows=slots[:0], capture_query_layers=frozenset({1})), cache)
        queries = out.queries[1][:, first_q:].float()
        keys = cache.keys[1, :, :n].float().repeat_interleave(model.cfg.num_heads // model.cfg.num_kv_heads, dim=0)
        logits = queries @ keys.transpose(1, 2) / model.cfg.head_dim**0.5
        causal = torch.arange(n)[None, :] <= torch.arange(first_q, n)[:, None]
        weights = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1).sum(dim=(0, 1))
        expected = weights[len(s0) : first_q]
        mine = got[owner == index]
        assert mine.shape == expected.shape and mine.sum() > 0
        torch.testing.assert_close(mine, expected, rtol=1e-4, atol=1e-5)
        checked += 1
    assert checked == 2


def test_cacheclip_auxiliary_depth_is_checked():
    with pytest.raises(ValueError, match=r"auxiliary must be a number of layers of the main model in \[1, 3\], got 4"):
        FusionRAG.from_pretrained("tiny", store=":memory:", options={"auxiliary": 4})
    assert FusionRAG.from_pretrained("tiny", store=":memory:").engine.auxiliary_layers == 1  # a quarter of 3, at least 1
