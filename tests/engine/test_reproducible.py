"""Reproducible answers: under ``reproducible=True`` a request reads the stored chunk entries and its
prompt prefix only, so its answer is the one a fresh engine gives, whatever earlier requests left
(exact path blocks of a Full Attention run, a chat's turn KV)."""

import pytest
import torch
from lighthouse import CHUNKS, EMBEDDINGS, REQUEST

from fusionrag_llm import FusionRAG, FusionRAGError


def engine(**options):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options=options)
    rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag


def test_exact_kv_left_by_full_attention_changes_answers_unless_reproducible():
    fresh = engine()
    answer = fresh.generate(REQUEST, max_new_tokens=6)
    cold = fresh.logits(REQUEST, answer.token_ids)
    rag = engine()
    rag.generate(REQUEST, method="full_attention", max_new_tokens=1)  # leaves the prompt's exact path blocks
    warm = rag.generate(REQUEST, max_new_tokens=6)
    assert warm.stats.path_hits["exact"] > answer.stats.path_hits["exact"]  # read what the first run left
    assert not torch.allclose(rag.logits(REQUEST, answer.token_ids), cold, atol=1e-4)
    again = rag.generate(REQUEST, max_new_tokens=6, reproducible=True)
    assert again.token_ids == answer.token_ids and again.stats.path_hits == answer.stats.path_hits
    torch.testing.assert_close(rag.logits(REQUEST, answer.token_ids, reproducible=True), cold, rtol=1e-5, atol=1e-5)
    many = rag.generate_many([REQUEST, REQUEST], max_new_tokens=6, reproducible=True)
    assert [out.token_ids for out in many] == [answer.token_ids] * 2
    streamed = rag.stream(REQUEST, max_new_tokens=6, reproducible=True)
    assert "".join(streamed) == answer.text


def test_the_engine_option_is_every_requests_default_and_a_request_may_override_it():
    rag = engine(reproducible=True)
    first = rag.generate(REQUEST, max_new_tokens=6)
    rag.generate(REQUEST, method="full_attention", max_new_tokens=1, reproducible=False)  # leaves exact KV
    assert rag.generate(REQUEST, max_new_tokens=6).stats.path_hits == first.stats.path_hits
    read = rag.generate(REQUEST, max_new_tokens=6, reproducible=False).stats.path_hits
    assert read["exact"] > first.stats.path_hits["exact"]


def test_turn_kv_is_not_read_under_reproducible():
    rag = engine(turn_cache_gib=0.05)
    chat = [{"role": "user", "content": "Tell me about the lighthouse at Keldmouth and its engineer."}]
    first = rag.generate(chat, method="full_attention", max_new_tokens=4)
    follow = chat + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    assert rag.generate(follow, method="full_attention", max_new_tokens=2).stats.turn_tokens > 0
    assert rag.generate(follow, method="full_attention", max_new_tokens=2, reproducible=True).stats.turn_tokens == 0


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_a_bad_value_is_refused(bad):
    rag = FusionRAG.from_pretrained("tiny", store=":memory:")
    with pytest.raises(FusionRAGError, match="reproducible must be True, False or None"):
        rag.generate("Hi", max_new_tokens=1, reproducible=bad)
    with pytest.raises(FusionRAGError, match="reproducible must be True or False"):
        FusionRAG.from_pretrained("tiny", store=":memory:", options={"reproducible": bad})
