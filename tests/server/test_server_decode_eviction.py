"""The server takes decode_kv_budget (A3's decode KV eviction) as an extra body field, like the
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
