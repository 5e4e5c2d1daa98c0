"""The compiled CPU prefill attention inside the engine: on a random model whose heads it takes (head size
64), every prefill path (Full Attention's prompt, entries after their neighbours, the question's scoring
pass, the sparse recompute) goes through it and gives the logits PyTorch's attention gives."""

import pytest
import torch

from compiled_kernels import needs_prefill_kernel
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

from fusionrag_llm import FusionRAG
from fusionrag_llm.eval.bench_gpu import random_model
from fusionrag_llm.models import attention

METHODS = (("full_attention", 1.0), ("full_reuse", 0.0), ("fusionrag", 0.15), ("cacheblend", 0.15))


def engine() -> FusionRAG:
    rag = FusionRAG(random_model("small", "cpu", torch.float32, seed=3), options={"reproducible": True})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


@needs_prefill_kernel
def test_every_prefill_path_gives_the_logits_of_pytorchs_attention(monkeypatch):
    calls = []
    real = attention.attend_prefix_cpu
    monkeypatch.setattr(attention, "attend_prefix_cpu", lambda *args: calls.append(1) or real(*args))
    compiled = engine()
    entries = len(calls)
    with monkeypatch.context() as patch:
        patch.setattr(attention, "attend_prefix_cpu", lambda *args: None)  # declined: PyTorch's kernels
        torch_path = engine()
        expected = {method: torch_path.logits(REQUEST, [5, 6, 7], method=method, recompute_ratio=ratio)
                    for method, ratio in METHODS}  # fmt: skip
    assert entries > 0  # the entries' causal blocks went through it
    for method, ratio in METHODS:
        before = len(calls)
        got = compiled.logits(REQUEST, [5, 6, 7], method=method, recompute_ratio=ratio)
        assert len(calls) > before, method
        torch.testing.assert_close(got, expected[method], rtol=1e-4, atol=1e-4, msg=method)


@pytest.mark.parametrize("threads", [1, 2])
@needs_prefill_kernel
def test_an_entry_is_the_same_bits_whatever_the_threads(threads):
    """Stored entries are compared across processes by their bits: the kernel's rows do not depend on the
    threads that computed them."""
    rag = engine()
    chunk = list(rag.chunks)[1]  # its id: the second chunk registered
    before = [rag.stored(chunk, variant).entry.keys.clone() for variant in ("plain", "fused")]
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        again = engine()
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(again.stored(chunk, variant).entry.keys, keys)
               for variant, keys in zip(("plain", "fused"), before))  # fmt: skip
