"""kv_shift: each chunk's reused tokens take a share of the mean K/V change of its recomputed tokens,
from the upper half of the layers up (``fusion/kv_shift.py``)."""

import pytest
import torch

pytest.importorskip("langchain_core", reason="the framework checks need the langchain extra")
pytest.importorskip("llama_index.core", reason="the framework checks need the llama-index extra")

from fusionrag_llm import FusionRAG, FusionRAGError, LayerHook, RAGRequest, get_method  # noqa: E402
from fusionrag_llm.fusion.kv_shift import ChunkShift  # noqa: E402
from fusionrag_llm.integrations.langchain import ChatFusionRAG  # noqa: E402
from fusionrag_llm.integrations.llama_index import FusionRAGLLM  # noqa: E402
from fusionrag_llm.models.forward import ForwardPass  # noqa: E402
from method_spy import spy  # noqa: E402

CHUNKS = [
    "The river Sel floods the lower town of Brightwater every spring after the snow melts in the hills.",
    "Brightwater's mayor in 1901 was Ida Renn, who built the first stone embankment along the river.",
    "Renn's embankment was rebuilt in 1950 after a storm broke its eastern wall near the old mill.",
]
REQUEST = RAGRequest(chunks=CHUNKS, question="Who built the embankment, and when was it rebuilt?")


@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.8, 0.6], [0.6, 0.8]], neighbors=2)
    return rag


def test_the_reused_tokens_of_a_chunk_move_by_the_share_of_its_recomputed_tokens_mean_change(rag):
    model = rag.engine.model
    method, seen = spy("fusionrag")
    rag.generate(REQUEST, method=method, recompute_ratio=0.2, max_new_tokens=1)
    layout, cache = seen[0].layout, seen[0].placed
    positions = cache.positions
    assert any(isinstance(hook, ChunkShift) for hook in seen[0].run.hooks)  # the method shifts at r = 0.2
    (s1, e1), (s2, e2) = layout.chunk_spans[-2:]  # the two reused chunks (the first one is exact)
    chunk1 = layout.reused_slots[(positions[layout.reused_slots] >= s1) & (positions[layout.reused_slots] < e1)]
    chunk2 = layout.reused_slots[(positions[layout.reused_slots] >= s2) & (positions[layout.reused_slots] < e2)]
    selected = chunk1[[1, 4]]  # two tokens of the middle chunk, none of the last
    recompute = torch.cat([selected, layout.fresh_slots]).sort().values
    share, top = 0.5, model.cfg.num_layers // 2
    shift = ChunkShift(model, layout, positions, recompute, selected, share, top)
    assert shift.active
    kv_heads, dim = cache.keys.shape[1], cache.keys.shape[3]
    torch.manual_seed(0)
    new_k, new_v = torch.randn(kv_heads, len(recompute), dim), torch.randn(kv_heads, len(recompute), dim)
    rows = torch.searchsorted(recompute, selected)
    for layer in (top - 1, top, model.cfg.num_layers - 1):
        keys, values = cache.keys[layer].clone(), cache.values[layer].clone()
        shift.before_write(layer, cache, new_k, new_v)
        left = chunk1[~torch.isin(chunk1, selected)]
        untouched = torch.ones(keys.shape[1], dtype=torch.bool)
        if layer >= top:
            mean_v = (new_v[:, rows] - values[:, selected]).mean(dim=1, keepdim=True)
            assert torch.allclose(cache.values[layer][:, left], values[:, left] + share * mean_v, atol=1e-5)
            free_change = model.rotate(new_k[:, rows] - keys[:, selected], -positions[selected]).mean(dim=1, keepdim=True)
            moved = model.rotate(cache.keys[layer][:, left] - keys[:, left], -positions[left])
            assert torch.allclose(moved, share * free_change.expand_as(moved), atol=1e-4)
            untouched[left] = False
        # every other slot (the recomputed ones, the chunk with no recomputed token, the prefix and the
        # question) is left to the prefill, as are all slots below the upper half
        assert torch.equal(cache.keys[layer][:, untouched], keys[:, untouched])
        assert torch.equal(cache.values[layer][:, untouched], values[:, untouched])
    assert len(chunk2) and not bool(torch.isin(chunk2, selected).any())


def test_nothing_to_shift_at_either_end_of_the_ratio(rag):
    exact = rag.generate(REQUEST, method="full_attention", max_new_tokens=4).token_ids
    shifting = get_method("fusionrag", kv_shift=0.5)
    assert rag.generate(REQUEST, method=shifting, recompute_ratio=1.0, max_new_tokens=4).token_ids == exact
    at_zero = [rag.logits(REQUEST, [5, 6], method=get_method("fusionrag", kv_shift=share), recompute_ratio=0.0)
               for share in (0, 0.5)]  # fmt: skip
    assert torch.equal(at_zero[0], at_zero[1])


def test_the_shift_reaches_the_answer_and_follows_the_share(rag):
    runs = [rag.logits(REQUEST, [5, 6], method=get_method("fusionrag", kv_shift=share), recompute_ratio=0.3)
            for share in (0, 0.5, 1)]  # fmt: skip
    assert (runs[1] - runs[0]).abs().max() > 1e-4 and (runs[2] - runs[1]).abs().max() > 1e-4
    method_default = rag.logits(REQUEST, [5, 6], method="fusionrag", recompute_ratio=0.3)
    assert get_method("fusionrag").kv_shift == 0.5 and torch.equal(method_default, runs[1])


@pytest.mark.parametrize("value", [-0.1, 1.5, True, "half", float("nan")])
def test_a_bad_share_is_refused_with_the_range(value):
    with pytest.raises(FusionRAGError, match=r"kv_shift must be a number in \[0, 1\]"):
        get_method("fusionrag", kv_shift=value)


@pytest.mark.parametrize("method", ["cache_craft", "fusionrag_paper", "full_reuse", "full_attention"])
def test_the_share_is_an_option_of_fusionrag_only(method):
    with pytest.raises(FusionRAGError, match=f"unknown option.*kv_shift for method '{method}'; it takes none"):
        get_method(method, kv_shift=0.5)


class _Shifting(LayerHook):
    writes_kv = True


def test_a_step_that_shifts_keeps_all_its_rows():
    step = ForwardPass(torch.arange(3), torch.arange(3), torch.arange(3), logit_rows=torch.tensor([2]),
                       hooks=(_Shifting(),))  # fmt: skip
    with pytest.raises(ValueError, match="cannot drop rows part way"):
        step.narrowed(torch.tensor([False, True, True]))


def test_the_adapters_pass_the_share(rag):
    text = f"Context:\n{CHUNKS[0]}\n\n{CHUNKS[1]}\n\n{CHUNKS[2]}\n\nWho built the embankment?"
    off = ChatFusionRAG(rag=rag, method_options={"kv_shift": 0}, recompute_ratio=0.3, max_tokens=3).invoke(text).content
    unshifted = get_method("fusionrag", kv_shift=0)
    assert off == rag.generate(text, method=unshifted, recompute_ratio=0.3, max_new_tokens=3).text
    with pytest.raises(ValueError, match=r"kv_shift must be a number in \[0, 1\]"):
        ChatFusionRAG(rag=rag, method_options={"kv_shift": 2.0})
    with pytest.raises(ValueError, match=r"kv_shift must be a number in \[0, 1\]"):
        FusionRAGLLM(rag=rag, max_tokens=2).complete(text, method_options={"kv_shift": -1})
