"""The server takes decode_kv_budget (A3's decode KV eviction) and kv_shift as extra body fields, like the
other run options: the answer equals the library's with the same budget, a bad value is a 400."""

import httpx
import pytest

from server_helpers import CHUNKS

openai = pytest.importorskip("openai")


def test_the_budget_reaches_the_engine(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Documents:\n" + "\n\n".join(CHUNKS) + "\n\nQuestion: Who kept the log?"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                           extra_body={"method": "a3", "decode_kv_budget": 4})  # fmt: skip
    expected = served.rag.generate(messages, method="a3", max_new_tokens=6, decode_kv_budget=4)
    stats = reply.model_extra["fusionrag"]["stats"][0]
    assert reply.choices[0].message.content == expected.text
    assert stats["evicted_kv_tokens"] == expected.stats.evicted_kv_tokens > 0
    bad = httpx.post(f"{served.url}/chat/completions", json={"model": "tiny", "messages": messages,
                                                             "decode_kv_budget": 0})  # fmt: skip
    assert bad.status_code == 400 and "budget must be an int >= 1" in bad.text


def test_the_kv_shift_reaches_the_engine(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Documents:\n" + "\n\n".join(CHUNKS) + "\n\nQuestion: Who kept the log?"}]
    for share in (0, 1):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                               extra_body={"recompute_ratio": 0.3, "kv_shift": share})  # fmt: skip
        expected = served.rag.generate(messages, recompute_ratio=0.3, max_new_tokens=6, kv_shift=share)
        assert reply.choices[0].message.content == expected.text
    bad = httpx.post(f"{served.url}/chat/completions", json={"model": "tiny", "messages": messages, "kv_shift": 1.5})
    assert bad.status_code == 400 and "kv_shift must be a number in [0, 1]" in bad.text
