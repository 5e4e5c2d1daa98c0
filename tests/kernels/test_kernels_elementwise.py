"""RMSNorm (after a residual add, or alone) and SwiGLU as one kernel each: references vs transformers, Triton vs reference, the engine's use."""

import pytest
import torch
from kernel_cases import needs_cuda, needs_triton

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.kernels import elementwise
from fusionrag_llm.kernels.elementwise import (add_rms_norm, add_rms_norm_ref, rms_norm, rms_norm_ref, silu_mul,
                                               silu_mul_ref)  # fmt: skip


def _rows(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_references_are_transformers_llama_arithmetic_bitwise(dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    norm = llama.LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(_rows(96, seed=1) + 1)
    norm = norm.to(dtype)
    x = _rows(7, 96, dtype=dtype, scale=3.0)
    assert torch.equal(rms_norm_ref(x, norm.weight, 1e-5), norm(x))
    mlp = llama.LlamaMLP(llama.LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2, num_key_value_heads=2, hidden_act="silu"))
    gate, up = _rows(5, 24, dtype=dtype, seed=2, scale=4.0), _rows(5, 24, dtype=dtype, seed=3)
    assert torch.equal(silu_mul_ref(gate, up), mlp.act_fn(gate) * up)


@needs_triton
@pytest.mark.parametrize("shape", [(1, 64), (5, 96), (3, 4, 80), (0, 64), (2, 1)])
def test_triton_rms_norm_matches_the_reference_fp32(shape):
    x = _rows(*shape, seed=len(shape), scale=5.0)
    weight = _rows(shape[-1], seed=9) + 1
    got = rms_norm(x, weight, 1e-6)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, rms_norm_ref(x, weight, 1e-6), rtol=2e-6, atol=1e-6)


@needs_triton
def test_triton_rms_norm_of_strided_rows_and_mixed_dtypes():
    """Per-head rows cut from a fused projection's output (Qwen3's q/k norms), and an fp32 weight over
    fp16 rows, which torch's ``weight * x`` turns to fp32."""
    fused = _rows(6, 3 * 64 + 32, seed=4)
    q = fused[:, :192].view(6, 3, 64)  # rows 192 + 32 apart
    weight = _rows(64, seed=5) + 1
    torch.testing.assert_close(rms_norm(q, weight, 1e-5), rms_norm_ref(q, weight, 1e-5), rtol=2e-6, atol=1e-6)
    x16 = _rows(4, 64, dtype=torch.float16, seed=6)
    got = rms_norm(x16, weight, 1e-5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, rms_norm_ref(x16, weight, 1e-5), rtol=1e-3, atol=1e-3)


@needs_triton
def test_triton_fp16_rounds_where_torch_rounds():
    """fp16 (bf16 is GPU-only: the interpreter's bf16 conversions are not faithful): within one ulp, and
    all but a few elements to the bit."""
    x, weight = _rows(9, 80, dtype=torch.float16, seed=7, scale=2.0), _rows(80, dtype=torch.float16, seed=8)
    gate, up = _rows(9, 80, dtype=torch.float16, seed=10, scale=4.0), _rows(9, 80, dtype=torch.float16, seed=11)
    for got, want in ((rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5)), (silu_mul(gate, up), silu_mul_ref(gate, up))):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        assert (got == want).float().mean().item() > 0.98


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_add_rms_norm_gives_the_sum_and_its_norm(dtype):
    """The residual add rounded as torch's add (fp16: every sum to the bit), then its norm."""
    fused = _rows(6, 2 * 96, dtype=dtype, seed=12, scale=3.0)
    x, delta = fused[:, :96], fused[:, 96:]  # rows 192 apart
    weight = _rows(96, dtype=dtype, seed=13) + 1
    (total, normed), (want_total, want_normed) = add_rms_norm(x, delta, weight, 1e-5), add_rms_norm_ref(x, delta, weight, 1e-5)
    assert torch.equal(total, want_total) and normed.shape == x.shape and normed.dtype == dtype
    tolerance = 2e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(normed, want_normed, rtol=tolerance, atol=tolerance)
    if dtype == torch.float16:  # fp32 keeps the sum order's last bits; fp16's rounding hides them
        assert (normed == want_normed).float().mean().item() > 0.98
    empty = add_rms_norm(x[:0], delta[:0], weight, 1e-5)
    assert [t.shape for t in empty] == [(0, 96), (0, 96)]


@needs_triton
@pytest.mark.parametrize("rows,size", [(1, 24), (7, 2500), (0, 8)])
def test_triton_silu_mul_of_a_fused_projection_s_halves(rows, size):
    fused = _rows(rows, 2 * size, seed=size, scale=4.0)
    gate, up = fused[:, :size], fused[:, size:]  # views with rows 2 * size apart, as gate/up's split gives
    got = silu_mul(gate, up)
    assert got.shape == (rows, size) and got.is_contiguous()
    torch.testing.assert_close(got, silu_mul_ref(gate, up), rtol=2e-6, atol=1e-6)


@needs_triton
def test_bad_inputs_are_clear_errors():
    x, weight = _rows(2, 8), _rows(8)
    with pytest.raises(ValueError, match="rms_norm: weight must be a 1-D tensor"):
        rms_norm(x, weight[None], 1e-5)
    with pytest.raises(ValueError, match="rms_norm: x must end in weight's size 8, got shape"):
        rms_norm(_rows(2, 9), weight, 1e-5)
    with pytest.raises(ValueError, match="rms_norm: x has dtype torch.int64; allowed"):
        rms_norm(torch.ones(2, 8, dtype=torch.int64), weight, 1e-5)
    with pytest.raises(ValueError, match=f"rows of {elementwise.MAX_ROW + 1} elements are not supported"):
        rms_norm(_rows(1, elementwise.MAX_ROW + 1), _rows(elementwise.MAX_ROW + 1), 1e-5)
    with pytest.raises(ValueError, match="add_rms_norm: x and delta must have one shape, got"):
        add_rms_norm(x, _rows(3, 8), weight, 1e-5)
    with pytest.raises(ValueError, match="silu_mul: gate and up must have one shape, got"):
        silu_mul(_rows(2, 8), _rows(2, 9))
    with pytest.raises(ValueError, match="silu_mul: gate and up must have one dtype"):
        silu_mul(_rows(2, 8), _rows(2, 8, dtype=torch.float16))


@needs_triton
@pytest.mark.slow  # the engine through the Triton interpreter
def test_a_triton_forward_runs_one_kernel_per_norm_and_per_swiglu(monkeypatch):
    calls = {"rms_norm": 0, "add_rms_norm": 0, "silu_mul": 0}
    for name in calls:
        real = getattr(elementwise, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(elementwise, name, counted)
    torch_rag, triton_rag = (FusionRAG.from_pretrained("tiny", store=":memory:", options={"kernels": kernels})
                             for kernels in ("torch", "triton"))  # fmt: skip
    request = RAGRequest(chunks=["Sheep graze the cliffs."], question="Where?")
    want = torch_rag.generate(request, "full_attention", 1.0, 3, sampling={"ignore_eos": True}).token_ids
    assert not any(calls.values())  # the torch backend keeps torch's ops
    got = triton_rag.generate(request, "full_attention", 1.0, 3, sampling={"ignore_eos": True}).token_ids
    layers = triton_rag.engine.model.cfg.num_layers
    assert got == want
    # every forward (the prefill's, two decode steps): per layer a norm, the residual add with the norm after
    # it and SwiGLU; and the final norm
    forwards = calls["silu_mul"] // layers
    assert forwards >= 3 and calls == {"rms_norm": forwards * (layers + 1), "add_rms_norm": forwards * layers,
                                       "silu_mul": forwards * layers}  # fmt: skip


@needs_cuda
@needs_triton
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_on_a_gpu_the_kernels_match_the_references(dtype):
    """Llama-3-8B's widths: a decode row and a prefill block; all but a few elements to the bit."""
    ulp = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 2e-6}[dtype]
    for rows in (1, 33):
        x, weight = _rows(rows, 4096, dtype=dtype, device="cuda", scale=3.0), _rows(4096, dtype=dtype, device="cuda") + 1
        got, want = rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5)
        torch.testing.assert_close(got, want, rtol=ulp, atol=ulp)
        assert (got == want).float().mean().item() > 0.99
        delta = _rows(rows, 4096, dtype=dtype, device="cuda", seed=rows + 1)
        (total, got), (want_total, want) = add_rms_norm(x, delta, weight, 1e-5), add_rms_norm_ref(x, delta, weight, 1e-5)
        assert torch.equal(total, want_total)
        torch.testing.assert_close(got, want, rtol=ulp, atol=ulp)
        assert (got == want).float().mean().item() > 0.99
        fused = _rows(rows, 2 * 14336, dtype=dtype, device="cuda", seed=rows, scale=4.0)
        got, want = silu_mul(fused[:, :14336], fused[:, 14336:]), silu_mul_ref(fused[:, :14336], fused[:, 14336:])
        torch.testing.assert_close(got, want, rtol=ulp, atol=ulp)
        assert (got == want).float().mean().item() > 0.99
