"""llama.cpp as the benchmarks' yardstick (runs only where llama-cpp-python, an optional extra, is installed)."""

import pytest

from fusionrag_llm import RAGRequest
from fusionrag_llm.eval.baselines import LlamaCpp, default_gguf, find_llama_cpp, llama_cpp_decode

pytest.importorskip("llama_cpp")


def test_llama_cpp_decodes_the_engine_s_greedy_tokens_on_the_default_gguf(smollm2_rag):
    gguf, note = find_llama_cpp("smollm2-135m")
    assert gguf == default_gguf("smollm2-135m") and gguf is not None, note
    request = RAGRequest(chunks=["The river Sel floods Brightwater every spring."], question="Which river floods Brightwater?")
    ours = smollm2_rag.generate(request, method="full_attention", max_new_tokens=6, sampling={"ignore_eos": True})
    runner = LlamaCpp(gguf, n_ctx=len(ours.prompt_ids) + 16)
    try:
        first = runner.generate(ours.prompt_ids, 6)
        again = runner.generate(ours.prompt_ids, 6)  # a fresh prefill each time, not the cache of the last
    finally:
        runner.close()
    assert first["token_ids"] == again["token_ids"] == ours.token_ids
    assert 0 < first["ttft_s"] < first["e2e_s"] and first["decode_s"] > 0
    assert llama_cpp_decode(gguf, ours.prompt_ids, 4) > 0


def test_a_model_without_a_gguf_file_is_skipped_with_the_reason():
    gguf, note = find_llama_cpp("tiny")
    assert gguf is None and "no GGUF file is known for 'tiny'" in note
