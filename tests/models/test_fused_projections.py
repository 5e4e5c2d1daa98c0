"""q/k/v and gate/up as one matrix each (``DecoderLM.fuse_projections``, done at load on CUDA): the same
logits, the layers' parameters views of the fused rows, and a model moved or reloaded afterwards
computes from its own weights."""

import pytest
import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.kernels import rotary
from fusionrag_llm.kernels._common import HAS_TRITON
from fusionrag_llm.models.llama import ForwardPass

REQUEST = RAGRequest(chunks=["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872."],
                     question="When was the lighthouse built?")  # fmt: skip


def logits(rag) -> torch.Tensor:
    return rag.logits(REQUEST, [5, 6, 7], method="full_attention")


def test_fused_projections_give_the_same_logits_from_views_of_one_matrix():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    model = rag.engine.model
    before = logits(rag)
    assert model.fuse_projections() == 2 * len(model.model.layers)
    attn = model.model.layers[0].self_attn
    shared = {p.untyped_storage().data_ptr() for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)}
    assert len(shared) == 1 and attn.q_proj.weight.shape == (attn.q_proj.out_features, attn.q_proj.in_features)
    calls = []
    linear = torch.nn.functional.linear
    torch.nn.functional.linear = lambda *args: calls.append(args[1].shape) or linear(*args)
    try:
        after = logits(rag)
    finally:
        torch.nn.functional.linear = linear
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    fused_rows = attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    assert any(shape[0] == fused_rows for shape in calls)  # one multiply for q, k and v


def test_weights_changed_after_fusing_are_the_ones_used():
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    model = rag.engine.model
    model.fuse_projections()
    mlp = model.model.layers[0].mlp
    x = torch.randn(3, mlp.gate_proj.in_features)
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2.0)  # in place: the fused rows change with it
    gate, up = mlp.gate_up(x)
    torch.testing.assert_close(up, torch.nn.functional.linear(x, mlp.up_proj.weight))
    mlp.gate_proj.weight = torch.nn.Parameter(torch.zeros_like(mlp.gate_proj.weight))  # replaced: per layer again
    gate, up = mlp.gate_up(x)
    assert torch.equal(gate, torch.zeros_like(gate))
    model.to(torch.float64)  # moved: each parameter gets new storage, the fused copy is not used
    gate, up = model.model.layers[1].mlp.gate_up(x.double())
    assert up.dtype == torch.float64
    torch.testing.assert_close(up, torch.nn.functional.linear(x.double(), model.model.layers[1].mlp.up_proj.weight))
    cache = model.new_cache(8)
    out = model(ForwardPass(torch.tensor([1, 2]), torch.arange(2), cache.reserve(2)), cache)
    assert torch.isfinite(out.logits).all()


@pytest.mark.gpu
def test_a_cuda_model_is_loaded_with_fused_projections_and_the_logits_of_a_cpu_one():
    cpu = FusionRAG.from_pretrained("tiny", device="cpu", store=":memory:", options={"prefix_cache": False})
    gpu = FusionRAG.from_pretrained("tiny", device="cuda", dtype="float32", store=":memory:",
                                    options={"prefix_cache": False, "kernels": "torch"})  # fmt: skip
    attn = gpu.engine.model.model.layers[0].self_attn  # q, k and v view one matrix
    assert len({p.untyped_storage().data_ptr() for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)}) == 1
    torch.testing.assert_close(logits(gpu).cpu(), logits(cpu), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # the engine through the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_fused_projections_rotate_queries_and_keys_in_one_kernel_call(monkeypatch):
    """On the Triton backend (interpreted here) k's heads follow q's in the fused output, so one rotary
    launch serves both: one per layer instead of two, the same logits."""
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False, "kernels": "triton"})
    model, calls = rag.engine.model, []
    logits(rag)  # the chunks' entries stored: both counted runs below do the same forwards
    real = rotary.apply_rotary
    monkeypatch.setattr(rotary, "apply_rotary", lambda x, *args: calls.append(x.shape[0]) or real(x, *args))
    before, separate = logits(rag), list(calls)
    model.fuse_projections()
    calls.clear()
    after = logits(rag)
    cfg = model.cfg
    layer_calls = separate.count(cfg.num_heads)  # q rotated alone, then k: one pair a layer and forward
    assert layer_calls >= cfg.num_layers and cfg.num_heads not in calls
    assert len(separate) - len(calls) == layer_calls  # each pair became one call (stored KV's placement as before)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
