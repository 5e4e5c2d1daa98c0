"""Packed CPU linear layers: the same products as F.linear, used only while they match the weight."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusionrag_llm.models.forward import ForwardPass
from fusionrag_llm.models import linear
from fusionrag_llm.models.linear import PACKED_MAX_ROWS, Linear, can_pack, packed_max_rows
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


@pytest.fixture
def vendor(monkeypatch):
    """Set the processor vendor (and machine) the row limit is decided from."""

    def set_vendor(name: str, machine: str = "x86_64") -> float:
        monkeypatch.setattr(linear, "cpu_vendor", lambda: name)
        monkeypatch.setattr(linear.platform, "machine", lambda: machine)
        packed_max_rows.cache_clear()
        return packed_max_rows()

    yield set_vendor
    monkeypatch.undo()
    packed_max_rows.cache_clear()


def test_the_packed_multiply_serves_prefills_too_where_mkl_is_slower(vendor, monkeypatch):
    calls = []
    packed = linear._PACKED_LINEAR
    monkeypatch.setattr(linear, "_PACKED_LINEAR", lambda *args: calls.append(len(args[0])) or packed(*args))
    assert vendor("GenuineIntel") == PACKED_MAX_ROWS
    assert vendor("") == PACKED_MAX_ROWS  # unknown: as on Intel
    assert vendor("AuthenticAMD", "aarch64") == PACKED_MAX_ROWS  # not x86: MKL is not what F.linear runs
    assert vendor("AuthenticAMD") == float("inf")
    layer = _layer(True)
    layer.pack()
    big = torch.randn(PACKED_MAX_ROWS * 4, 48)
    with torch.inference_mode():
        torch.testing.assert_close(layer(big), F.linear(big, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    assert calls == [len(big)]
    vendor("GenuineIntel")
    assert torch.equal(layer(big), F.linear(big, layer.weight, layer.bias))  # MKL's own multiply
    assert calls == [len(big)]


def test_the_vendor_is_read_from_proc_cpuinfo_where_there_is_one():
    assert isinstance(linear.cpu_vendor(), str)
    if Path("/proc/cpuinfo").exists() and "vendor_id" in Path("/proc/cpuinfo").read_text():
        assert linear.cpu_vendor() in Path("/proc/cpuinfo").read_text()


def test_prefill_sized_inputs_and_changed_weights_use_f_linear_exactly(vendor):
    vendor("GenuineIntel")
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
