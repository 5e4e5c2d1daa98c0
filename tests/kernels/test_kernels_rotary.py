"""Rotary at arbitrary positions: reference vs transformers' Llama, Triton vs reference."""

import pytest
import torch
from kernel_cases import needs_cuda, needs_triton

from fusionrag_llm.kernels.rotary import apply_rotary, apply_rotary_ref


def _inv_freq(d, theta=10000.0):
    return 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)


def _inputs(h, n, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(h, n, d, generator=g).to(dtype)
    positions = torch.randperm(40000, generator=g)[:n]  # arbitrary, unsorted, large
    return x.to(device), positions.to(device), _inv_freq(d).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_matches_transformers_llama_bitwise(dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    d = 64
    cfg = LlamaConfig(hidden_size=4 * d, num_attention_heads=4, num_key_value_heads=2,
                      rope_theta=10000.0, max_position_embeddings=65536)
    rope = llama.LlamaRotaryEmbedding(cfg)
    x, positions, _ = _inputs(2, 37, d, dtype)
    cos, sin = rope(x, positions[None])  # [1, N, D] in x's dtype
    want, _ = llama.apply_rotary_pos_emb(x[None], x[None], cos, sin)
    got = apply_rotary_ref(x, positions, rope.inv_freq.float())
    assert torch.equal(got, want[0])


@needs_triton
@pytest.mark.parametrize("h,n,d", [(3, 37, 16), (2, 50, 64), (2, 19, 128), (1, 23, 80)])
def test_triton_matches_reference_fp32(h, n, d):
    x, positions, inv_freq = _inputs(h, n, d, seed=n)
    torch.testing.assert_close(apply_rotary(x, positions, inv_freq),
                               apply_rotary_ref(x, positions, inv_freq), rtol=1e-5, atol=1e-5)


@needs_triton
def test_triton_fp16_matches_reference():
    """fp16 goes through the same per-op rounding as torch (bf16 is GPU-only: the interpreter's
    bf16 conversions are not faithful)."""
    x, positions, inv_freq = _inputs(2, 40, 64, torch.float16)
    torch.testing.assert_close(apply_rotary(x, positions, inv_freq),
                               apply_rotary_ref(x, positions, inv_freq), rtol=1e-3, atol=1e-3)


@needs_triton
def test_triton_strided_input_and_rotary_is_a_rotation():
    x, positions, inv_freq = _inputs(4, 21, 32)
    x_view = x.transpose(0, 1).contiguous().transpose(0, 1)  # [H, N, D] view with stride(0) = D
    out = apply_rotary(x_view, positions, inv_freq)
    torch.testing.assert_close(out, apply_rotary_ref(x, positions, inv_freq), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [apply_rotary_ref, pytest.param(apply_rotary, marks=needs_triton)])
def test_rotated_rows_written_into_given_slots_of_a_cache_view(fn):
    """``out`` and ``slots``: the rotated rows go to those rows of ``out`` (a view into a bigger buffer,
    as a pooled cache's keys are), every other row untouched, the same values as rotating first."""
    x, positions, inv_freq = _inputs(6, 23, 32)
    buffer = torch.randn(6, 90, 32)
    out = buffer[:, 30:80]  # [H, C=50, D], rows 50 apart... as a cache's span of a pool
    before = buffer.clone()
    slots = torch.randperm(50, generator=torch.Generator().manual_seed(1))[:23]
    assert fn(x, positions, inv_freq, out, slots) is out
    rows = slots + 30
    torch.testing.assert_close(buffer[:, rows], apply_rotary_ref(x, positions, inv_freq), rtol=1e-5, atol=1e-5)
    untouched = torch.ones(90, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(buffer[:, untouched], before[:, untouched])


@needs_triton
def test_slots_without_out_or_of_another_count_are_refused():
    x, positions, inv_freq = _inputs(2, 5, 16)
    with pytest.raises(ValueError, match="out and slots go together"):
        apply_rotary(x, positions, inv_freq, slots=torch.arange(5))
    with pytest.raises(ValueError, match="slots has 4 entries, x has 5"):
        apply_rotary(x, positions, inv_freq, torch.zeros(2, 9, 16), torch.arange(4))
    with pytest.raises(ValueError, match="out must be"):
        apply_rotary(x, positions, inv_freq, torch.zeros(3, 9, 16), torch.arange(5))


@pytest.mark.parametrize("fn", [apply_rotary_ref, pytest.param(apply_rotary, marks=needs_triton)])
def test_validation_errors(fn):
    x, positions, inv_freq = _inputs(2, 5, 16)
    bad = [
        ((x[0], positions, inv_freq), "x \\[H, N, D\\] must have 3 dimensions"),
        ((x, positions[:-1], inv_freq), "positions has 4 entries, x has 5"),
        ((x, positions, inv_freq[:-1]), "expected D/2 = 8"),
        ((x, positions.float(), inv_freq), "positions \\[N\\] has dtype"),
        ((x, positions, inv_freq.double()), "inv_freq \\[D/2\\] has dtype"),
        ((torch.randn(2, 5, 15), positions, inv_freq), "must be even"),
    ]
    for args, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn(*args)


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_parity(dtype):
    x, positions, inv_freq = _inputs(8, 4099, 128, dtype, device="cuda")
    got, want = apply_rotary(x, positions, inv_freq), apply_rotary_ref(x, positions, inv_freq)
    # cos/sin of large arguments may differ by an ulp between libraries: allow one low-precision ulp
    tol = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _compiled():
    from fusionrag_llm.kernels import cpu_quant

    try:
        cpu_quant.load_library()
    except RuntimeError:
        pytest.skip("no C compiler: the compiled CPU kernels are not built here")


@pytest.mark.parametrize("h,n,d", [(3, 37, 16), (2, 50, 64), (9, 19, 128), (1, 23, 80), (4, 1, 2)])
def test_the_compiled_cpu_rotation_has_the_references_bits(h, n, d):
    from fusionrag_llm.kernels.rotary import rotary_cos_sin, rotate, rotate_cpu

    _compiled()
    x, positions, inv_freq = _inputs(h, n, d, seed=n + d)
    positions = positions - 20000  # negative ones too: rotating back to position-free keys
    cos, sin = rotary_cos_sin(positions, inv_freq, torch.float32)
    assert torch.equal(rotate_cpu(x, cos, sin), rotate(x, cos, sin))
    wide = torch.randn(n, h + 2, d)  # heads of a projection's output: a strided view, rows contiguous
    view = wide.transpose(0, 1)[1 : h + 1]
    assert torch.equal(rotate_cpu(view, cos, sin), rotate(view, cos, sin))
    layers = torch.randn(2, h, n, d)[:, :, :]  # [layers, heads, n, d] into a cache's slots, in any order
    cache, want = torch.zeros(2, h, n + 9, d), torch.zeros(2, h, n + 9, d)
    slots = torch.randperm(n + 9, generator=torch.Generator().manual_seed(d))[:n]
    assert rotate_cpu(layers, cos, sin, cache, slots) is cache
    want[:, :, slots] = rotate(layers, cos, sin)
    assert torch.equal(cache, want)


def test_the_compiled_cpu_rotation_leaves_what_it_does_not_take_and_checks_slots():
    from fusionrag_llm.kernels.rotary import rotary_cos_sin, rotate_cpu

    _compiled()
    x, positions, inv_freq = _inputs(2, 5, 8)
    cos, sin = rotary_cos_sin(positions, inv_freq, torch.float32)
    assert rotate_cpu(x.to(torch.bfloat16), cos, sin) is None  # the torch reference handles these
    assert rotate_cpu(x.transpose(1, 2).contiguous().transpose(1, 2), cos, sin) is None  # rows not contiguous
    assert rotate_cpu(x, cos[:4], sin[:4]) is None
    cache = torch.zeros(2, 6, 8)
    with pytest.raises(IndexError, match=r"slots outside \[0, 6\)"):
        rotate_cpu(x, cos, sin, cache, torch.tensor([0, 1, 2, 3, 6]))
    with pytest.raises(IndexError):
        rotate_cpu(x, cos, sin, cache, torch.tensor([0, 1, -1, 3, 4]))
    with pytest.raises(ValueError, match="4 slots for 5 rows"):
        rotate_cpu(x, cos, sin, cache, torch.tensor([0, 1, 2, 3]))
    assert not cache.any()  # nothing written by a refused call
