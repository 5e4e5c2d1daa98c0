"""`EntryForm`: the form a reader can use an entry in, and the reason an entry does not fit it."""

import pytest
import torch
from storage_testutil import make_entry

from fusionrag_llm.storage import EntryForm, KVEntry, QuantCodec


def test_entry_form_names_what_is_wrong():
    form = EntryForm(num_layers=2, num_kv_heads=2, head_dim=8, dtype="bfloat16")
    kv = torch.zeros(2, 2, 3, 8, dtype=torch.bfloat16)
    assert form.problem(KVEntry((1, 2, 3), kv, kv.clone())) is None
    assert form.problem(KVEntry((1, 2, 3), kv.float(), kv.float())) == "it is float32, the reader expects bfloat16"
    assert "[2, 2, 4], the reader expects [2, 2, 8]" in form.problem(KVEntry((1, 2, 3), kv[..., :4], kv[..., :4]))
    for bad in ({"num_layers": 0}, {"dtype": "float99"}, {"dtype": None}, {"scheme": "int3", "dtype": None}):
        with pytest.raises(ValueError):
            EntryForm(**{"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": "float32", **bad})


@pytest.mark.parametrize("scheme", ["int8", "fp8", "int4.2"])
def test_a_packed_entry_is_checked_in_its_logical_shape_and_its_scales(scheme):
    form = EntryForm(num_layers=2, num_kv_heads=2, head_dim=8, scheme=scheme)
    packed = QuantCodec(scheme).compress(make_entry(1, 5))
    assert form.problem(packed) is None
    assert form.problem(make_entry(1, 5)) == f"it is float32, the reader expects {scheme}-packed"
    assert "[2, 1, 8], the reader expects [2, 2, 8]" in form.problem(QuantCodec(scheme).compress(make_entry(1, 5, heads=1)))
    scales = {**packed.extras, "value_scales": packed.extras["value_scales"].clone().fill_(float("nan"))}
    nan_scales = KVEntry(packed.token_ids, packed.keys, packed.values, packed.meta, scales)
    assert form.problem(nan_scales) == "it holds NaN or infinite values"
