"""The engine gives the same outputs through the Triton kernels (interpreted on CPU) as through torch."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.kernels._common import HAS_TRITON

# the engine through the Triton interpreter on the CPU: the slow tier (see pyproject.toml)
pytestmark = [pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed"), pytest.mark.slow]

CHUNKS = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs."]


def build(kernels, device="cpu"):
    rag = FusionRAG.from_pretrained("tiny", device=device, dtype="float32", store=":memory:",
                                    options={"prefix_cache": False, "kernels": kernels})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.7, 0.7], [0, 1]], neighbors=1)
    return rag


def compare_paths(device):
    torch_rag, triton_rag = build("torch", device), build("triton", device)
    assert triton_rag.engine.model.kernels == "triton" and torch_rag.engine.model.kernels == "torch"
    request = RAGRequest(chunks=CHUNKS[::-1], question="When?")
    for method, ratio in (("full_attention", 1.0), ("fusionrag", 0.3)):
        a = torch_rag.generate(request, method=method, recompute_ratio=ratio, max_new_tokens=3)
        b = triton_rag.generate(request, method=method, recompute_ratio=ratio, max_new_tokens=3)
        assert a.token_ids == b.token_ids and a.stats.recomputed_tokens == b.stats.recomputed_tokens
        la = torch_rag.logits(request, a.token_ids, method=method, recompute_ratio=ratio)
        lb = triton_rag.logits(request, a.token_ids, method=method, recompute_ratio=ratio)
        assert (la - lb).abs().max().item() <= 1e-4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreted path on CPU")
def test_triton_path_matches_torch_path_interpreted():
    compare_paths("cpu")


@pytest.mark.gpu
def test_triton_path_matches_torch_path_on_gpu():
    compare_paths("cuda")


def test_unknown_kernel_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="allowed: auto, torch, triton"):
        FusionRAG.from_pretrained("tiny", store=":memory:", options={"kernels": "cuda-magic"})


def test_the_recompute_through_flex_attention_gives_the_torch_path_s_answers(monkeypatch):
    from fusionrag_llm.models import attention_backend

    masks = []
    real = attention_backend.flex_block_mask
    monkeypatch.setattr(attention_backend, "flex_block_mask", lambda *args: masks.append(1) or real(*args))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference, rag = build("torch", device), build("triton", device)
    rag.engine.model.attention.recompute = "flex"
    request = RAGRequest(chunks=CHUNKS[::-1], question="When was it built?")
    want = reference.generate(request, "fusionrag", 0.3, 3, sampling={"ignore_eos": True})
    got = rag.generate(request, "fusionrag", 0.3, 3, sampling={"ignore_eos": True})
    assert masks and got.token_ids == want.token_ids and got.stats.recomputed_tokens == want.stats.recomputed_tokens
    lw = reference.logits(request, want.token_ids, method="fusionrag", recompute_ratio=0.3)
    assert (rag.logits(request, want.token_ids, method="fusionrag", recompute_ratio=0.3) - lw).abs().max().item() <= 1e-4
    with pytest.raises(ValueError, match="recompute must be one of kernel, flex"):
        type(rag.engine.model.attention)("sdpa")


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3"])
def test_every_family_s_flags_give_the_torch_path_s_answers_with_fused_projections(family):
    """Projection biases (Qwen2) and q/k norms over rows of the fused projection (Qwen3) through the Triton
    kernels, with q/k/v fused as on CUDA."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    request = RAGRequest(chunks=CHUNKS[:2], question="Where?")
    rags = [FusionRAG.from_pretrained(f"tiny-{family}", device=device, dtype="float32", store=":memory:",
                                      options={"prefix_cache": False, "kernels": kernels}) for kernels in ("torch", "triton")]  # fmt: skip
    rags[1].engine.model.fuse_projections()
    want, got = (rag.generate(request, "full_attention", 1.0, 4, sampling={"ignore_eos": True}) for rag in rags)
    assert got.token_ids == want.token_ids
    lw, lg = (rag.logits(request, want.token_ids, method="full_attention") for rag in rags)
    assert (lw - lg).abs().max().item() <= 1e-4
