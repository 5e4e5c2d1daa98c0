"""Block-quantized CPU linear (8-bit and 4-bit GGUF-style weights, float inputs): kernel vs reference,
the formats checked by hand, and the model's decode steps reading them while prefills stay float."""

import pytest
import torch
import torch.nn.functional as F

from fusionrag_llm.kernels import cpu_quant

try:
    cpu_quant.load_library()
except RuntimeError as exc:
    pytest.skip(f"no CPU kernel here: {exc}", allow_module_level=True)


def linear_ref(x: torch.Tensor, weight: cpu_quant.QuantWeight) -> torch.Tensor:
    """The oracle: the rows times the dequantized weight, in float64."""
    return (x.double() @ cpu_quant.dequantize(weight).double().T).float()


@pytest.mark.parametrize("fmt", cpu_quant.FORMATS)
@pytest.mark.parametrize("m,n,k", [(1, 7, 32), (1, 300, 576), (3, 65, 1536), (17, 33, 96)])
def test_kernel_matches_reference(fmt, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x, weight = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05
    qw = cpu_quant.quantize(weight, fmt)
    got, want = cpu_quant.run_linear(x, qw), linear_ref(x, qw)
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    float_product = x @ weight.T  # the weights' rounding itself: about 1% (8 bits), 10% (4 bits) of the range
    assert (got - float_product).abs().max() < {"q8": 0.03, "q4": 0.25}[fmt] * float_product.abs().max()


def test_weights_are_rounded_as_the_formats_say():
    w = torch.linspace(-1.0, 2.0, 32)[None]
    q8 = cpu_quant.quantize(w, "q8")
    assert q8.q.dtype == torch.int8 and q8.q.abs().max() == 127
    assert q8.d.dtype == torch.float16 and torch.equal(q8.d, torch.tensor([[2.0 / 127]]).half())  # GGUF's half scales
    q4 = cpu_quant.quantize(w, "q4")
    assert q4.q.shape == (1, 16) and torch.equal(q4.m, torch.tensor([[-1.0]]).half())
    assert torch.equal(q4.d, torch.tensor([[0.2]]).half())
    nibbles = torch.cat([q4.q & 0x0F, q4.q >> 4], dim=-1)[0]  # element i low nibble, i + 16 high
    torch.testing.assert_close(nibbles.float(), torch.round((w[0] + 1.0) / float(q4.d)))


@pytest.mark.parametrize("fmt", cpu_quant.FORMATS)
def test_weights_already_in_the_format_quantize_back_to_themselves(fmt):
    """What a GGUF file in that format holds (dequantized to float) comes back unchanged."""
    g = torch.Generator().manual_seed(5)
    once = cpu_quant.dequantize(cpu_quant.quantize(torch.randn(40, 64, generator=g), fmt))
    twice = cpu_quant.dequantize(cpu_quant.quantize(once, fmt))
    torch.testing.assert_close(twice, once, rtol=0, atol=1e-6)


def _same_bits(a, b) -> bool:
    halves = [(x.view(torch.int16), y.view(torch.int16)) for x, y in ((a.d, b.d), (a.m, b.m)) if x is not None]
    return a.fmt == b.fmt and torch.equal(a.q, b.q) and all(torch.equal(x, y) for x, y in halves) and (a.m is None) == (b.m is None)


@pytest.mark.parametrize("fmt", cpu_quant.FORMATS)
def test_the_compiled_quantizer_gives_the_references_bits_and_exactness(fmt):
    """One pass in C, the numbers of ``quantize_ref`` to the bit: scales rounded to half floats first,
    levels rounded half to even (ties included), and the same exact / not exact decision at the edge of
    the tolerance (weights 0.9e-3 and 1.1e-3 steps off their levels)."""
    g = torch.Generator().manual_seed(11)
    ties = torch.tensor([[0.0, 15.0] + [i + 0.5 for i in range(15)] * 2,  # q4: step 1, levels at x.5
                         [127.0, -127.0] + [i + 0.5 for i in range(-15, 15)]])  # q8: step 1, levels at x.5
    weights = [torch.zeros(8, 64), torch.full((8, 64), 0.3), torch.full((8, 64), -2.5), ties]
    for scale in (1e-6, 1e-3, 1.0, 3e3):  # 1e-6: subnormal half scales
        exact = cpu_quant.dequantize(cpu_quant.quantize_ref(torch.randn(24, 128, generator=g) * scale, fmt))
        weights += [exact] + [exact + off * exact.abs().mean() * torch.randn(24, 128, generator=g)
                              for off in (1e-5, 9e-4, 1.1e-3, 1e-2)]  # fmt: skip
    held = []
    for weight in weights:
        ref = cpu_quant.quantize_ref(weight, fmt)
        assert _same_bits(cpu_quant.quantize(weight, fmt), ref)
        # quantize_exact: the 4-bit form where it holds the weight, else the 8-bit one where that does
        q4_holds = cpu_quant.holds_exactly(weight, cpu_quant.quantize_ref(weight, "q4"), 1e-3)
        held.append(cpu_quant.holds_exactly(weight, ref, 1e-3) and (fmt == "q4" or not q4_holds))
        exact = cpu_quant.quantize_exact(weight)
        assert (exact is not None and exact.fmt == fmt) == held[-1]
        assert not held[-1] or _same_bits(exact, ref)
    assert 3 <= sum(held) < len(weights)  # both answers were given


def test_bad_inputs_are_refused_with_what_is_allowed():
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_quant.quantize(torch.randn(4, 40), "q8")
    with pytest.raises(ValueError, match="q8, q4"):
        cpu_quant.quantize(torch.randn(4, 64), "q2")
    with pytest.raises(ValueError, match="half floats"):
        cpu_quant.quantize(torch.full((4, 64), 1e5), "q4")
    for quantize in (cpu_quant.quantize, cpu_quant.quantize_ref):  # compiled and reference alike
        with pytest.raises(ValueError, match="finite"):
            quantize(torch.tensor([[float("nan")] + [0.0] * 31]), "q8")
    from fusionrag_llm.models.linear import Linear

    layer = Linear(64, 4)
    with torch.no_grad():
        layer.weight.fill_(float("inf"))
    assert not layer.quantize("q8") and layer.quantized is None  # such a layer decodes from its float weight


def test_the_plain_c_build_reads_half_scales_like_the_reference(tmp_path, monkeypatch):
    """Without AVX2/F16C the kernel converts the half scales itself: normal and subnormal ones."""
    monkeypatch.setattr(cpu_quant, "_FLAGS", ["-O2", "-fopenmp", "-shared", "-fPIC"])  # baseline x86-64: no F16C
    plain = cpu_quant._open(cpu_quant._build(tmp_path))
    assert plain.fr_quant_has_avx2() == 0
    monkeypatch.setattr(cpu_quant, "_library", plain)
    g = torch.Generator().manual_seed(3)
    for scale in (0.05, 1e-4):  # 1e-4: the block scales are subnormal half floats
        weight = torch.randn(40, 96, generator=g) * scale
        x = torch.randn(2, 96, generator=g)
        for fmt in cpu_quant.FORMATS:
            qw = cpu_quant.quantize(weight, fmt)
            assert bool((qw.d != 0).all()) and bool((qw.d.float() < 6.1e-5).all()) == (scale < 0.01)
            want = linear_ref(x, qw)
            torch.testing.assert_close(cpu_quant.run_linear(x, qw), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_a_decode_row_through_gguf_weights_is_the_float_product():
    """Weights that already are Q4_1 / Q8_0 numbers (what the default model's GGUF holds) give the float
    layer's result up to summation order: nothing of the input is rounded."""
    g = torch.Generator().manual_seed(7)
    for fmt in cpu_quant.FORMATS:
        weight = cpu_quant.dequantize(cpu_quant.quantize(torch.randn(96, 576, generator=g) * 0.05, fmt))
        x = torch.randn(1, 576, generator=g)
        want = x @ weight.T
        torch.testing.assert_close(cpu_quant.run_linear(x, cpu_quant.quantize(weight, fmt)), want, rtol=1e-4, atol=1e-5)


def test_linear_layer_reads_the_quantized_copy_only_when_asked():
    from fusionrag_llm.models.linear import Linear, quantized_linears

    layer = Linear(64, 48, bias=True)
    x = torch.randn(2, 64)
    assert layer.quantize("q8") and layer.quantized == "q8"
    with torch.no_grad():
        float_out = layer(x)
        torch.testing.assert_close(float_out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-6)
        with quantized_linears(True):
            quant_out = layer(x)
        torch.testing.assert_close(quant_out, linear_ref(x, layer._quant[0]) + layer.bias)
        layer.weight.mul_(2.0)  # an in-place change makes the copy stale: float again
        assert layer.quantized is None
        with quantized_linears(True):
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-6)
    assert not Linear(40, 8).quantize("q8")  # inputs not a multiple of 32: stays float


def test_decode_steps_read_quantized_weights_and_prefills_stay_float(monkeypatch):
    from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest

    request = RAGRequest(chunks=["Ada Lovelace wrote the first program.", "She was born in London."],
                         question="Where was the first programmer born?")  # fmt: skip
    plain = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False, "decode_weights": "q4"})
    assert rag.engine.model.decode_weights == "q4" and plain.engine.model.decode_weights == "float"
    assert rag.engine.model.lm_head.quantized == "q8"  # the head (tied embedding) keeps 8 bits
    assert rag.fingerprint == plain.fingerprint  # stored entries do not depend on it
    for engine in (plain, rag):
        engine.add_chunks(request.chunks, fuse=False)
    ids = plain.segments(request)[1].token_ids
    ours, theirs = rag.stored(ids, "plain"), plain.stored(ids, "plain")
    assert ours.key == theirs.key and torch.equal(ours.entry.keys, theirs.entry.keys)

    calls = []
    run_linear = cpu_quant.run_linear
    monkeypatch.setattr(cpu_quant, "run_linear", lambda x, w: calls.append(x.shape[0]) or run_linear(x, w))
    first = rag.logits(request, [5, 6, 7], method="full_attention")
    assert calls == []  # the prompt's forward (and the teacher-forced continuation) is float
    torch.testing.assert_close(first, plain.logits(request, [5, 6, 7], method="full_attention"))
    rag.engine.model.compiled_decode = False  # layer by layer (models/fast_decode.py runs them in one call)
    out = rag.generate(request, method="full_attention", max_new_tokens=4)
    steps = len(out.token_ids) - 1  # the first token comes from the prefill
    layers = len(rag.engine.model.model.layers)
    # per layer one call for q/k/v, one for o, one for gate/up, one for down; plus the head
    assert steps >= 1 and calls == [1] * (steps * (4 * layers + 1))
    with pytest.raises(FusionRAGError, match="float, q8, q4"):
        FusionRAG.from_pretrained("tiny", store=":memory:", options={"decode_weights": "int3"})


def test_auto_quantizes_only_weights_that_are_their_own_blocks():
    """The default ("auto"): a model whose weights are 4-bit / 8-bit block numbers (as one converted from
    a GGUF file) decodes through the blocks with the float model's answers; random float weights stay float."""
    from fusionrag_llm import FusionRAG, RAGRequest
    from fusionrag_llm.models.linear import Linear

    request = RAGRequest(chunks=["Grace Hopper wrote the first compiler."], question="Who wrote the first compiler?")
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    model = rag.engine.model
    assert model.decode_weights == "float"  # random weights are on no grid
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    with torch.no_grad():
        for i, layer in enumerate(layers):  # put every weight on a grid, as a GGUF file's are
            fmt = "q8" if layer is model.lm_head or i % 2 else "q4"
            layer.weight.copy_(cpu_quant.dequantize(cpu_quant.quantize(layer.weight, fmt)))
    model.quantize_linears("float")
    reference = rag.generate(request, method="full_attention", max_new_tokens=6)
    assert model.quantize_linears("auto") == len(layers)
    assert model.lm_head.quantized == "q8" and {layer.quantized for layer in layers} == {"q4", "q8"}
    assert rag.generate(request, method="full_attention", max_new_tokens=6).token_ids == reference.token_ids


def test_fused_linears_give_each_layer_s_own_product_in_one_call():
    from fusionrag_llm.models.linear import FusedLinears, Linear, quantized_linears

    torch.manual_seed(0)
    layers = [Linear(64, n, bias=True) for n in (96, 32, 32)]
    group = FusedLinears(*layers)
    x = torch.randn(2, 64)
    floats = [layer(x) for layer in layers]
    for layer in layers:
        layer.quantize("q4")
    alone = []
    with quantized_linears(True):
        alone = [layer(x) for layer in layers]
        assert group.fuse()
        fused = group(x)
        # the layers now hold views of the fused rows: no second copy of the weights
        assert all(layer._quant[0].q.untyped_storage().data_ptr() == group._fused[0].q.untyped_storage().data_ptr()
                   for layer in layers)  # fmt: skip
        again = [layer(x) for layer in layers]
    for a, f, g in zip(alone, fused, again):
        torch.testing.assert_close(f, a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(g, a)
    assert [tuple(f.shape) for f in fused] == [(2, 96), (2, 32), (2, 32)]
    assert all(torch.equal(a, b) for a, b in zip(group(x), floats))  # outside decode steps: float
    layers[1].quantize("q8")  # one layer changed: the group calls each layer again
    with quantized_linears(True):
        mixed = group(x)
        torch.testing.assert_close(mixed[1], layers[1](x))
    layers[2].quantize(None)
    assert not group.fuse()  # not every layer quantized: nothing joined


def test_tiles_hold_the_same_numbers_and_slice_and_join_like_rows():
    g = torch.Generator().manual_seed(11)
    weight = cpu_quant.quantize(torch.randn(48, 96, generator=g), "q4")
    tiled = cpu_quant.tile(weight)
    assert tiled.tiled and tiled.nbytes == weight.nbytes and tiled.q.shape == (3, 3, 16, 16)
    assert torch.equal(cpu_quant.dequantize(tiled), cpu_quant.dequantize(weight))
    back = cpu_quant.untile(tiled)
    assert not back.tiled and all(torch.equal(a, b) for a, b in zip((back.q, back.d, back.m), (weight.q, weight.d, weight.m)))
    whole = cpu_quant.row_slice(tiled, 16, 32)  # whole tiles: views, still tiled
    assert whole.tiled and whole.q.data_ptr() == tiled.q[1].data_ptr()
    assert torch.equal(cpu_quant.dequantize(whole), cpu_quant.dequantize(weight)[16:48])
    cut = cpu_quant.row_slice(tiled, 8, 20)  # across tiles: an untiled copy of those rows
    assert not cut.tiled and torch.equal(cpu_quant.dequantize(cut), cpu_quant.dequantize(weight)[8:28])
    joined = cpu_quant.concat_rows([tiled, cpu_quant.tile(weight)])
    assert joined.tiled and torch.equal(cpu_quant.dequantize(joined), cpu_quant.dequantize(weight).repeat(2, 1))
    mixed = cpu_quant.concat_rows([tiled, weight])
    assert not mixed.tiled and torch.equal(cpu_quant.dequantize(mixed), cpu_quant.dequantize(weight).repeat(2, 1))
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        cpu_quant.tile(cpu_quant.quantize(torch.randn(40, 96, generator=g), "q4"))
    with pytest.raises(ValueError, match="q4"):
        cpu_quant.tile(cpu_quant.quantize(torch.randn(48, 96, generator=g), "q8"))


@pytest.mark.skipif(not cpu_quant.load_library().fr_quant_can_tile(), reason="the tiled 4-bit kernel needs an AVX-512 build")
def test_the_tiled_kernel_multiplies_like_the_reference():
    from fusionrag_llm.models.linear import Linear

    g = torch.Generator().manual_seed(12)
    for n, k, rows in ((16, 32, 1), (64, 576, 1), (48, 1536, 3), (32, 96, 11)):
        weight = cpu_quant.quantize(torch.randn(n, k, generator=g) * 0.05, "q4")
        assert cpu_quant.can_tile(weight)
        x = torch.randn(rows, k, generator=g)
        want = linear_ref(x, weight)
        got = cpu_quant.run_linear(x, cpu_quant.tile(weight))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    layer = Linear(64, 48)
    assert layer.quantize("q4") and layer._quant[0].tiled  # a layer's 4-bit copy is tiled where it helps
    assert not cpu_quant.can_tile(cpu_quant.quantize(torch.randn(40, 64), "q4"))  # not whole tiles


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_a_row_s_product_does_not_depend_on_the_rows_beside_it(fmt):
    """A batch's rows share each dequantized block (groups of up to 8 rows): every row must still come out
    bit for bit as it does alone, so a sequence's answer does not depend on the batch it decodes in."""
    g = torch.Generator().manual_seed(5)
    weight = cpu_quant.quantize(torch.randn(64, 576, generator=g) * 0.05, fmt)
    if cpu_quant.can_tile(weight) and cpu_quant.load_library().fr_quant_can_tile():
        weight = cpu_quant.tile(weight)
    x = torch.randn(19, 576, generator=g)
    together = cpu_quant.run_linear(x, weight)
    alone = torch.cat([cpu_quant.run_linear(x[i : i + 1], weight) for i in range(len(x))])
    assert torch.equal(together, alone)
