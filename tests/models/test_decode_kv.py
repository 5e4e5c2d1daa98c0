"""decode_kv: decode steps read a half-precision copy of the request KV; everything else reads float32."""

import pytest
import torch

from fusionrag_llm import FusionRAG, FusionRAGError, RAGRequest
from fusionrag_llm.eval.bench_decode import _decode, _prefill

REQUEST = RAGRequest(chunks=["Ada Lovelace wrote the first program.", "She was born in London in 1815."],
                     question="Where was the first programmer born?")  # fmt: skip


@pytest.mark.parametrize("kv", ["float16", "bfloat16"])
def test_decode_steps_read_the_copy_and_the_float32_cache_is_kept(kv):
    model = FusionRAG.from_pretrained("tiny", store=":memory:").engine.model
    ids = list(range(5, 60))
    cache, first = _prefill(model, ids, 8)
    prompt_keys = cache.keys[:, :, : len(ids)].clone()
    reference, reference_logits = _decode(model, cache, len(ids), first, 8)
    assert cache.decode_keys is None  # "model": no copy
    assert model.set_decode_kv(kv) == kv
    tokens, logits = _decode(model, cache, len(ids), first, 8, forced=reference)
    assert cache.decode_keys.dtype == getattr(torch, kv) and cache.decode_values.dtype == getattr(torch, kv)
    # the copy is the cache rounded, grown by the decode steps; the float32 prompt KV is untouched
    used = len(ids) + 7
    torch.testing.assert_close(cache.decode_keys[:, :, :used].float(), cache.keys[:, :, :used], rtol=1e-2, atol=1e-2)
    assert torch.equal(cache.keys[:, :, : len(ids)], prompt_keys)
    difference = (logits - reference_logits).abs().max()
    assert 0 < difference < 0.05 * reference_logits.abs().max()  # close, not the same computation
    model.set_decode_kv("model")
    again, again_logits = _decode(model, cache, len(ids), first, 8)
    assert cache.decode_keys is None and again == reference and torch.equal(again_logits, reference_logits)


def test_scoring_after_a_stream_reads_the_float32_cache():
    plain = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False)
    half = FusionRAG.from_pretrained("tiny", store=":memory:", prefix_cache=False, decode_kv="float16")
    assert (plain.engine.model.decode_kv, half.engine.model.decode_kv) == ("model", "float16")
    scores = []
    for rag in (plain, half):
        stream = rag.stream(REQUEST, method="full_attention", max_new_tokens=6, ignore_eos=True)
        tokens = list(stream) and stream.token_ids
        scores.append(stream.score([*tokens[:4], 7]))
    assert torch.equal(scores[0], scores[1])


def test_bad_or_unusable_decode_kv():
    with pytest.raises(FusionRAGError, match="decode_kv must be one of model, float16, bfloat16"):
        FusionRAG.from_pretrained("tiny", store=":memory:", decode_kv="int8")
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", dtype="bfloat16", decode_kv="float16")
    assert rag.engine.model.decode_kv == "model"  # only float32 models on CPU keep a half-precision copy
