"""The server takes a method's options as the ``method_options`` extra body field (A3's
``decode_kv_budget``, FusionRAG's ``kv_shift``), with ``method`` and ``recompute_ratio``: the answer equals
the library's with the same method, a bad value is a 400 that names it."""

import httpx
import pytest

from fusionrag_llm import get_method
from server_helpers import CHUNKS

openai = pytest.importorskip("openai")
MESSAGES = [{"role": "user", "content": "Documents:\n" + "\n\n".join(CHUNKS) + "\n\nQuestion: Who kept the log?"}]


def test_the_budget_reaches_the_engine(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                           extra_body={"method": "a3", "method_options": {"decode_kv_budget": 4}})  # fmt: skip
    expected = served.rag.generate(MESSAGES, method=get_method("a3", decode_kv_budget=4), max_new_tokens=6)
    stats = reply.model_extra["fusionrag"]["stats"][0]
    assert reply.choices[0].message.content == expected.text
    assert stats["method_stats"]["evicted_kv_tokens"] == expected.stats.method_stats["evicted_kv_tokens"] > 0
    bad = httpx.post(f"{served.url}/chat/completions", json={"model": "tiny", "messages": MESSAGES, "method": "a3",
                                                             "method_options": {"decode_kv_budget": 0}})  # fmt: skip
    assert bad.status_code == 400 and "budget must be an int >= 1" in bad.text
    other = httpx.post(f"{served.url}/chat/completions", json={"model": "tiny", "messages": MESSAGES, "method": "ape",
                                                               "method_options": {"decode_kv_budget": 4}})  # fmt: skip
    assert other.status_code == 400 and "unknown option(s) decode_kv_budget for method 'ape'" in other.text


def test_the_kv_shift_reaches_the_engine(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    for share in (0, 1):
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                               extra_body={"recompute_ratio": 0.3, "method_options": {"kv_shift": share}})  # fmt: skip
        expected = served.rag.generate(MESSAGES, method=get_method("fusionrag", kv_shift=share), recompute_ratio=0.3,
                                       max_new_tokens=6)  # fmt: skip
        assert reply.choices[0].message.content == expected.text
    bad = httpx.post(f"{served.url}/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                             "method_options": {"kv_shift": 1.5}})  # fmt: skip
    assert bad.status_code == 400 and "kv_shift must be a number in [0, 1]" in bad.text


def test_no_ratio_is_the_methods_own(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    for method, own in (("fusionrag", 0.15), ("full_reuse", 0.0), ("full_attention", 1.0)):
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, extra_body={"method": method})
        assert reply.model_extra["fusionrag"]["stats"][0]["recompute_ratio"] == own
    bad = httpx.post(f"{served.url}/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                             "recompute_ratio": 1.5})  # fmt: skip
    assert bad.status_code == 400 and "recompute_ratio must be a number in [0, 1]" in bad.text
