"""APE on the one engine: every chunk at the positions right after the shared prefix, and computed
tokens' attention to chunk tokens sharpened (temperature) and scaled, checked by hand."""

import math

import pytest
import torch
import torch.nn.functional as F

from fusionrag_llm import FusionRAG, RAGRequest, get_method
from fusionrag_llm.methods import make_plan
from fusionrag_llm.methods.ape import APE
from fusionrag_llm.models.attention import attend_scaled
from method_spy import spy

CHUNKS = [
    "The lighthouse at Keldmouth was designed by the engineer Tamsin Orrery in 1872.",
    "Tamsin Orrery was born in Brightwater.",
    "Brightwater is the capital of Lowmarch, a flat province crossed by canals and old dykes.",
]
REQUEST = RAGRequest(chunks=CHUNKS, question="Where was the lighthouse designer born?")


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, fuse=False, embeddings=[[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    return rag


def test_rescaled_attention_follows_the_formula_by_hand():
    torch.manual_seed(0)
    q, keys, values = torch.randn(2, 2, 4), torch.randn(1, 4, 4), torch.randn(1, 4, 4)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    scaled = torch.tensor([False, True, True, False])
    out = attend_scaled(q, keys, values, mask, scaled, temperature=0.5, scale=2.0)
    for head in range(2):
        for row in range(2):
            logits = [float(q[head, row] @ keys[0, j]) / 2.0 for j in range(4)]  # sqrt(head_dim = 4)
            group = sum(math.exp(logits[j] / 0.5) for j in range(4) if mask[row, j] and scaled[j])
            weights = []
            for j in range(4):  # the chunk group weighs scale * group ** temperature, split by exp(logit / T)
                sharp = 2.0 * group**0.5 * math.exp(logits[j] / 0.5) / group
                weights.append(0.0 if not mask[row, j] else (sharp if scaled[j] else math.exp(logits[j])))
            expected = sum(w * values[0, j] for j, w in enumerate(weights)) / sum(weights)
            torch.testing.assert_close(out[head, row], expected, rtol=1e-5, atol=1e-6)
    plain = attend_scaled(q, keys, values, mask, scaled, temperature=1.0, scale=1.0)
    reference = F.scaled_dot_product_attention(q[None], keys.expand(2, -1, -1)[None], values.expand(2, -1, -1)[None],
                                               attn_mask=mask[None, None])[0]  # fmt: skip
    torch.testing.assert_close(plain, reference, rtol=1e-5, atol=1e-6)


def test_every_chunk_starts_right_after_the_prefix(rag):
    method, seen = spy("ape")
    segments = rag.segments(REQUEST)
    seq = rag.engine.add_request(segments, make_plan(method), 3)
    rag.engine.run_until_finished([seq])
    cache = seen[0].placed
    positions = cache.positions
    starts = [sum(len(s.token_ids) for s in segments[:i]) for i in range(len(segments) + 1)]
    spans = list(zip(starts, starts[1:]))
    kinds = [s.kind for s in segments]
    head = spans[0][1]
    assert kinds == ["prefix", "chunk", "text", "chunk", "text", "chunk", "suffix"]
    assert positions[:head].tolist() == list(range(head))
    longest = max(end - start for (start, end), kind in zip(spans, kinds) if kind == "chunk")
    after = head + longest
    for (start, end), kind in zip(spans[1:], kinds[1:]):
        if kind == "chunk":
            assert positions[start:end].tolist() == list(range(head, head + end - start))
        else:  # text between chunks and the question follow the longest chunk, in prompt order
            assert positions[start:end].tolist() == list(range(after, after + end - start))
            after += end - start
    assert seq.prompt_end == after
    scaling = seen[0].run.scaling  # every step of the request: its prefill and its decode steps
    scaled = scaling.slots[: cache.length]
    assert scaled.tolist() == [kind == "chunk" for (start, end), kind in zip(spans, kinds) for _ in range(start, end)]
    assert (scaling.temperature, scaling.scale) == APE.attention_scaling == (0.9, 0.9)


def test_generated_tokens_continue_after_the_prompt(rag):
    engine = rag.engine
    seq = engine.add_request(rag.segments(REQUEST), make_plan("ape"), 4)
    engine.run_until_finished([seq])
    prompt = seq.num_prompt_tokens
    generated = seq.cache.positions[prompt : seq.cache.length].tolist()
    assert generated == list(range(seq.prompt_end, seq.prompt_end + len(generated))) and seq.prompt_end < prompt


class UnscaledAPE(APE):
    """APE's layout without its attention scaling (temperature 1, scale 1)."""

    attention_scaling = (1.0, 1.0)


def test_without_scaling_one_chunk_is_full_reuse_and_several_are_not(rag):
    """Temperature 1 and scale 1 leave only the layout: with one chunk it is Full Reuse's (the
    logits match), with three the chunks overlap and the logits move; the paper's constants move
    even the one-chunk logits."""
    one = RAGRequest(chunks=[CHUNKS[1]], question="Where?")
    answer = rag.generate(one, method="full_reuse", max_new_tokens=4).token_ids
    reuse_one = rag.logits(one, answer, method="full_reuse")
    reuse_three = rag.logits(REQUEST, answer, method="full_reuse")
    scaled_one = rag.logits(one, answer, method="ape")
    assert (scaled_one - reuse_one).abs().max() > 1e-3
    unscaled = UnscaledAPE()
    torch.testing.assert_close(rag.logits(one, answer, method=unscaled), reuse_one, rtol=1e-4, atol=1e-4)
    assert (rag.logits(REQUEST, answer, method=unscaled) - reuse_three).abs().max() > 1e-3


def test_ape_recomputes_nothing_whatever_the_ratio(rag):
    plan = make_plan("ape", 0.5)
    method = get_method("ape")
    assert (plan.recompute_ratio, method.parallel_positions, method.attention_scaling) == (0.0, True, (0.9, 0.9))
    assert not method.selects and method.default_ratio == 0.0
    out = rag.generate(REQUEST, method="ape", recompute_ratio=0.5, max_new_tokens=2)
    assert out.stats.recompute_ratio == 0.0 and out.stats.recomputed_tokens == 0
