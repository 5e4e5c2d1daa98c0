"""Packed CPU linear layers: the same products as F.linear, used only while they match the weight."""

import pytest
import torch
import torch.nn.functional as F

from fusionrag_llm.models.forward import ForwardPass
from fusionrag_llm.models.linear import PACKED_MAX_ROWS, Linear, can_pack
from fusionrag_llm.models.loader import load_model

pytestmark = pytest.mark.skipif(not can_pack(torch.empty(0)), reason="this torch build has no oneDNN linear")


def _layer(bias: bool) -> Linear:
    torch.manual_seed(0)
    return Linear(48, 80, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 8, PACKED_MAX_ROWS])
def test_packed_products_equal_f_linear(bias, rows):
    layer = _layer(bias)
    assert layer.pack() and layer.packed
    x = torch.randn(rows, 96)[:, ::2]  # a strided input too
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_prefill_sized_inputs_and_changed_weights_use_f_linear_exactly():
    layer = _layer(True)
    layer.pack()
    big = torch.randn(PACKED_MAX_ROWS + 1, 48)
    assert torch.equal(layer(big), F.linear(big, layer.weight, layer.bias))
    with torch.no_grad():
        layer.weight.mul_(-1)  # an in-place update after packing: the packed copy is stale
    assert not layer.packed
    x = torch.randn(2, 48)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    layer.pack()
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_only_float32_cpu_weights_pack():
    layer = _layer(False).to(torch.bfloat16)
    assert not layer.pack() and not layer.packed
    layer.unpack()
    x = torch.randn(3, 48, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))


def test_a_loaded_cpu_model_is_packed_and_unpacking_keeps_its_logits():
    model = load_model("tiny").model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed for m in linears)
    ids = torch.arange(3, 9)

    def decode_logits():
        cache = model.new_cache(len(ids) + 1)
        model(ForwardPass(ids, torch.arange(len(ids)), cache.reserve(len(ids))), cache)
        return model(ForwardPass(torch.tensor([5]), torch.tensor([len(ids)]), cache.reserve(1)), cache).logits

    packed = decode_logits()
    model.unpack_linears()
    assert not any(m.packed for m in linears)
    torch.testing.assert_close(decode_logits(), packed, atol=1e-4, rtol=1e-4)
    assert model.pack_linears() == len(linears)
