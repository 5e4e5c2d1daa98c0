"""Bodies past the server's limits are refused with OpenAI-shaped 4xx errors that say what is allowed,
never a 500: huge integers, floats past float range, NaN, deep nesting, bytes that are not UTF-8,
bodies over the size limit (with or without a Content-Length)."""

import httpx
import pytest

from fusionrag_llm.server.body import MAX_BODY_BYTES, MAX_DEPTH

MESSAGES = '[{"role": "user", "content": "hi"}]'
HUGE = "9" * 5000


def chat_body(extra: str) -> bytes:
    return f'{{"model": "tiny", "messages": {MESSAGES}, {extra}}}'.encode()


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("chat/completions", chat_body(f'"max_tokens": {HUGE}'), "integers must lie in [-9223372036854775808"),
        ("chat/completions", chat_body(f'"seed": -{HUGE}'), "integers must lie in"),
        ("completions", f'{{"model": "tiny", "prompt": "hi", "n": {HUGE}}}'.encode(), "integers must lie in"),
        ("chunks", f'{{"texts": ["a"], "neighbors": {HUGE}}}'.encode(), "integers must lie in"),
        ("chat/completions", chat_body('"temperature": 1e400'), "too large for a float"),
        ("chat/completions", chat_body('"top_p": NaN'), "NaN is not a JSON number"),
        ("chat/completions", chat_body('"top_p": -Infinity'), "-Infinity is not a JSON number"),
        ("chat/completions", b'{"model": "tiny", "messages": ' + b"[" * 10**5 + b"]" * 10**5 + b"}", "too deeply"),
        ("chat/completions", chat_body('"method_options": ' + "[" * 40 + "]" * 40), f"at most {MAX_DEPTH} levels"),
        ("chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff"}]}', "not UTF-8"),
        ("chat/completions", '{"model": "tiny", "messages": []}'.encode("utf-16"), "not UTF-8"),
    ],
)
def test_bodies_past_the_limits_are_400s_that_say_what_is_allowed(served, path, body, words):
    headers = {"content-type": "application/json"}
    response = httpx.post(f"{served.url}/{path}", content=body, headers=headers, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error", error
    assert set(error) == {"message", "type", "param", "code"}


def test_the_largest_64_bit_seed_is_served(served):
    body = chat_body('"seed": 9223372036854775807, "temperature": 1.0, "max_tokens": 2')
    response = httpx.post(f"{served.url}/chat/completions", content=body, timeout=60)
    assert response.status_code == 200, response.text


def test_a_body_over_the_size_limit_is_413_with_or_without_a_content_length(served):
    declared = httpx.post(f"{served.url}/chat/completions", content=b" " * (MAX_BODY_BYTES + 1), timeout=60)

    def streamed():  # chunked transfer: no Content-Length to refuse early
        for _ in range(MAX_BODY_BYTES // 2**20 + 1):
            yield b" " * 2**20

    chunked = httpx.post(f"{served.url}/chunks", content=streamed(), timeout=60)
    for response in (declared, chunked):
        assert response.status_code == 413, response.text
        assert f"limit of {MAX_BODY_BYTES} bytes" in response.json()["error"]["message"]
