"""A store whose codec is lossy keeps no exact path blocks: the exact KV of a prompt's prefix is kept
in the engine's prefix cache instead (the turn cache's blocks when there is one), per tenant."""

import torch

from fusionrag_llm import FusionRAG, RAGRequest

CHUNKS = ["Carrow Point's lighthouse was first lit in 1862. " * 3, "Tomas Vell kept its log until 1901. " * 3]
QUESTION = "Who kept the log?"
SYSTEM = "You answer from the documents only, in one short sentence, and name your source."


def _rag(**options) -> FusionRAG:
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"kv_codec": "int8", **options})
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.6, 0.8]], neighbors=1)
    return rag


def test_the_prompt_prefix_is_computed_once_then_read_with_the_same_answer():
    rag, fresh = _rag(), _rag()
    request = RAGRequest(chunks=CHUNKS, question=QUESTION, system=SYSTEM)
    first = rag.generate(request, method="full_reuse", max_new_tokens=5)
    again = rag.generate(request, method="full_reuse", max_new_tokens=5)
    assert again.token_ids == first.token_ids
    assert 0 < again.stats.computed_tokens < first.stats.computed_tokens  # the prefix is read, the question not
    other = rag.generate(RAGRequest(chunks=CHUNKS[::-1], question="When was it lit?", system=SYSTEM), method="full_reuse",
                         max_new_tokens=5)  # fmt: skip
    assert other.stats.computed_tokens == again.stats.computed_tokens - len(again.prompt_ids) + len(other.prompt_ids)
    torch.testing.assert_close(rag.logits(request, first.token_ids, method="full_reuse"),
                               fresh.logits(request, first.token_ids, method="full_reuse"), rtol=0, atol=0)  # fmt: skip


def test_the_prefixes_sit_in_the_turn_cache_s_blocks_and_each_tenant_computes_its_own():
    rag = _rag(turn_cache_gib=0.05)
    turns = rag.engine.kv.turns
    kept = len(turns)
    assert kept > 0  # the canonical prefix S0 that add_chunks started every entry from
    request = RAGRequest(chunks=CHUNKS, question=QUESTION, system=SYSTEM)
    stream = rag.stream(request, method="full_reuse", max_new_tokens=5)  # prefilled, not finished: no turn KV yet
    assert len(turns) > kept  # the prompt's prefix
    list(stream)
    rag.add_chunks(CHUNKS, embeddings=[[1, 0], [0.6, 0.8]], neighbors=1, tenant="bob")
    bob = rag.generate(RAGRequest(chunks=CHUNKS, question=QUESTION, system=SYSTEM, tenant="bob"), method="full_reuse", max_new_tokens=5)
    assert bob.stats.computed_tokens == stream.stats.computed_tokens  # not another tenant's prefix
    assert bob.token_ids == stream.token_ids


def test_a_plain_chat_s_next_turn_reads_the_last_turn_s_kv_and_computes_only_the_rest():
    with_turns = FusionRAG.from_pretrained("tiny", store=":memory:", options={"kv_codec": "int8", "turn_cache_gib": 0.05})
    alone = FusionRAG.from_pretrained("tiny", store=":memory:", options={"kv_codec": "int8"})
    chat = [{"role": "user", "content": "Tell me about the lighthouse at Carrow Point and the keeper of its log."}]
    first = with_turns.generate(chat, method="full_attention", max_new_tokens=6, sampling={"ignore_eos": True})
    chat += [{"role": "assistant", "content": with_turns.tokenizer.decode(first.token_ids)},
             {"role": "user", "content": "When was it lit?"}]  # fmt: skip
    second = with_turns.generate(chat, method="full_attention", max_new_tokens=6)
    baseline = alone.generate(chat, method="full_attention", max_new_tokens=6)
    assert second.token_ids == baseline.token_ids
    assert second.stats.computed_tokens < baseline.stats.computed_tokens - len(first.prompt_ids) // 2
    torch.testing.assert_close(with_turns.logits(chat, second.token_ids[:3], method="full_attention"),
                               alone.logits(chat, second.token_ids[:3], method="full_attention"), rtol=1e-4, atol=1e-4)  # fmt: skip
