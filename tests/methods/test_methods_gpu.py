"""Every method of the registry end to end on a CUDA model (bf16, Triton kernels): generate, stream,
generate_many and logits run, agree with each other, and r = 1 stays within bf16 reach of Full
Attention."""

import pytest
import torch

from fusionrag_llm import FusionRAG, get_method, method_names
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

pytestmark = pytest.mark.gpu

@pytest.fixture(scope="module")
def rag():
    rag = FusionRAG.from_pretrained("tiny", device="cuda", dtype="bfloat16", store=":memory:",
                                    options={"prefix_cache": False})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


@pytest.mark.parametrize("method", method_names())
def test_every_method_runs_on_cuda_through_every_entry_point(rag, method):
    ratio = 0.3  # a method that selects nothing runs at 0 (full_attention at 1) whatever is asked
    one = rag.generate(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=4)
    streamed = "".join(rag.stream(REQUEST, method=method, recompute_ratio=ratio, max_new_tokens=4))
    many = rag.generate_many([REQUEST, REQUEST], method=method, recompute_ratio=ratio, max_new_tokens=4)
    logits = rag.logits(REQUEST, one.token_ids, method=method, recompute_ratio=ratio)
    assert streamed == one.text and [g.token_ids for g in many] == [one.token_ids] * 2
    assert logits.shape[0] == len(one.token_ids) + 1 and bool(torch.isfinite(logits).all())
    assert logits[:-1].argmax(-1).tolist() == one.token_ids


@pytest.mark.parametrize("method", [m for m in method_names() if get_method(m).selects])
def test_recomputing_everything_is_full_attention_on_cuda(rag, method):
    full = rag.logits(REQUEST, [5, 6, 7], method="full_attention")
    every = rag.logits(REQUEST, [5, 6, 7], method=method, recompute_ratio=1.0)
    assert (every - full).abs().max().item() <= 0.05 * full.abs().max().item()


def test_a_chat_s_next_turn_reads_its_kv_from_blocks_on_the_device():
    rag = FusionRAG.from_pretrained("tiny", device="cuda", dtype="bfloat16", store=":memory:",
                                    options={"turn_cache_gib": 0.05})
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    chat = [{"role": "user", "content": f"{CHUNKS[0]}\nWho kept the log?"}]
    first = rag.generate(chat, method="full_attention", max_new_tokens=6)
    chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And when?"}]
    second = rag.generate(chat, method="full_attention", max_new_tokens=6)
    pool = rag.engine.kv.turns.pool
    assert pool.device.type == "cuda" and pool.dtype == torch.bfloat16 and pool.used > 0
    assert second.stats.turn_tokens > 0
