"""The OpenAI-compatible server, over loopback with the real OpenAI client: answers equal the
library's, streams equal whole answers, concurrent clients equal one by one, errors are 4xx."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fusionrag_llm import TextPrompt
from fusionrag_llm.server.app import create_app

from server_helpers import CHUNKS, RunningServer, make_rag

openai = pytest.importorskip("openai")


def chat(question: str, chunks=CHUNKS) -> list[dict]:
    context = "\n\n".join(chunks)
    return [{"role": "system", "content": "Answer from the documents."},
            {"role": "user", "content": f"Documents:\n{context}\n\nQuestion: {question}"}]  # fmt: skip


QUESTIONS = ["Who kept the log?", "When was the lighthouse lit?", "What happened in 1901?", "Where is the light?"]


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)


def test_a_chat_completion_equals_the_library_answer_and_reports_usage(served, client):
    messages = chat(QUESTIONS[0])
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    expected = served.rag.generate(messages, max_new_tokens=8)
    assert reply.choices[0].message.content == expected.text and reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.object == "chat.completion"
    assert reply.usage.prompt_tokens == len(expected.prompt_ids)
    assert reply.usage.completion_tokens == len(expected.token_ids)
    stats = reply.model_extra["fusionrag"]["stats"][0]
    assert stats["path_hits"]["chunk"] + stats["path_hits"]["exact"] >= 3  # the registered chunks were found
    assert reply.usage.prompt_tokens_details.cached_tokens == stats["exact_tokens"] + stats["reused_tokens"] > 0


def test_extra_body_fields_choose_the_method(served, client):
    messages = chat(QUESTIONS[1])
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                           extra_body={"method": "full_attention"})  # fmt: skip
    assert reply.choices[0].message.content == served.rag.generate(messages, method="full_attention", max_new_tokens=6).text
    assert reply.model_extra["fusionrag"]["stats"][0]["method"] == "full_attention"


def test_a_text_completion_reads_the_raw_prompt(served, client):
    prompt = f"{CHUNKS[0]} {CHUNKS[1]} Q: Who kept the log? A:"
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=6)
    assert reply.choices[0].text == served.rag.generate(TextPrompt(prompt), max_new_tokens=6).text
    assert reply.object == "text_completion"


def test_a_stream_equals_the_whole_answer_and_ends_with_usage(served, client):
    messages = chat(QUESTIONS[2])
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12).choices[0].message.content
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Q: Who kept the log? A:", max_tokens=8, stream=True) if c.choices)  # fmt: skip
    assert streamed == client.completions.create(model="tiny", prompt="Q: Who kept the log? A:", max_tokens=8).choices[0].text


def test_seeded_sampling_is_reproducible_and_equals_the_library(served, client):
    messages = chat(QUESTIONS[0])
    options = {"temperature": 1.2, "seed": 5, "top_p": 0.95}
    one = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, **options)
    two = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, **options)
    assert one.choices[0].message.content == two.choices[0].message.content
    assert one.choices[0].message.content == served.rag.generate(messages, max_new_tokens=8, sampling=options).text


def test_n_answers_come_as_choices(served, client):
    reply = client.chat.completions.create(model="tiny", messages=chat(QUESTIONS[1]), max_tokens=5, n=3,
                                           temperature=1.0, seed=2)  # fmt: skip
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == sum(s["generated_tokens"] for s in reply.model_extra["fusionrag"]["stats"])


def test_models_lists_the_served_model(client):
    assert [model.id for model in client.models.list().data][0] == "tiny"  # then the embedding model


def test_concurrent_clients_get_the_answers_of_one_by_one(served, client):
    requests = [chat(question, CHUNKS[i % 3 :] + CHUNKS[: i % 3]) for i, question in enumerate(QUESTIONS * 2)]
    alone = [client.chat.completions.create(model="tiny", messages=m, max_tokens=8).choices[0].message.content
             for m in requests]  # fmt: skip
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda m: client.chat.completions.create(model="tiny", messages=m, max_tokens=8)
                                 .choices[0].message.content, requests))  # fmt: skip
    assert together == alone


def test_a_disconnected_stream_frees_its_slot(served):
    body = {"model": "tiny", "messages": chat(QUESTIONS[0]), "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{served.url}/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert http.get(f"{served.base}/health").json()["running"] == 1
        deadline = time.monotonic() + 20
        while http.get(f"{served.base}/health").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        health = http.get(f"{served.base}/health").json()
        assert health == {"status": "ok", "model": "tiny", "running": 0, "waiting": 0, "registering": 0}


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "does not exist"),
        ({"model": "tiny", "messages": []}, 400, "messages"),
        ({"model": "tiny"}, 400, "messages: Field required"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature must be"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p must be"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, "n: Input should be greater"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "method": "magic"}, 400, "unknown method"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "tools[0] must be"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400, "logprobs"),
        ({"model": "tiny", "messages": [{"role": "assistant", "content": "hi"}]}, 400, "last chat message must be"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, 400, "context window"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "word " * 5000}]}, 400, "context window"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stop": [""]}, 400, "stop must hold"),
    ],
)
def test_bad_requests_get_openai_style_4xx_errors(served, body, status, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{served.url}/chat/completions", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["type"]


def test_an_oversize_prompt_says_context_length_exceeded(served, client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="word " * 5000, max_tokens=4)
    assert caught.value.code == "context_length_exceeded"


def test_unknown_routes_are_json_404s(served):
    response = httpx.get(f"{served.url}/engines")
    assert response.status_code == 404 and "error" in response.json()


def test_chunks_registered_over_http_are_reused(served, client):
    text = "The harbour master, Ana Reyes, rebuilt the archive in 1903 from copies kept in the capital."
    response = httpx.post(f"{served.url}/chunks", json={"texts": [text], "fuse": False}, timeout=60)
    assert response.status_code == 200 and response.json()["plain_computed"] == 1
    reply = client.chat.completions.create(model="tiny", messages=chat("Who rebuilt it?", [CHUNKS[0], text]), max_tokens=4)
    assert reply.model_extra["fusionrag"]["stats"][0]["path_hits"]["miss"] == 0
    assert httpx.post(f"{served.url}/chunks", json={"texts": []}).status_code == 400


def test_two_hundred_requests_sixteen_at_once_all_succeed(served, client):
    prompts = [chat(QUESTIONS[i % 4], CHUNKS[i % 3 :] + CHUNKS[: i % 3]) for i in range(200)]

    def ask(messages):
        return client.chat.completions.create(model="tiny", messages=messages, max_tokens=4).choices[0].finish_reason

    with ThreadPoolExecutor(16) as pool:
        reasons = list(pool.map(ask, prompts))
    assert len(reasons) == 200 and set(reasons) <= {"stop", "length"}


def test_a_full_queue_answers_429_and_a_slow_request_408():
    rag = make_rag()
    body = {"model": "tiny", "messages": chat(QUESTIONS[0]), "max_tokens": 2}
    with RunningServer(create_app(rag, "tiny", max_waiting=1, request_timeout=1.0)) as base:
        with rag.engine.lock:  # the engine thread cannot tokenize or step while the test holds its lock
            with ThreadPoolExecutor(3) as pool:
                statuses = list(pool.map(lambda _: httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30),
                                         range(3)))  # fmt: skip
        codes = sorted(response.status_code for response in statuses)
        assert 429 in codes and set(codes) <= {408, 429}, codes
        assert any(r.json()["error"]["type"] == "rate_limit_exceeded" for r in statuses if r.status_code == 429)
        assert any(r.json()["error"]["type"] == "timeout" for r in statuses if r.status_code == 408)
        again = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert again.status_code == 200  # the timed-out requests were aborted; the server serves on


def test_a_chats_second_turn_over_http_computes_only_its_new_tokens():
    from fusionrag_llm import FusionRAG

    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"turn_cache_gib": 0.1})
    with RunningServer(create_app(rag, "tiny")) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        messages = chat(QUESTIONS[0])
        first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
        messages += [{"role": "assistant", "content": "Tomas Vell."}, {"role": "user", "content": "When?"}]
        second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
    stats = second.model_extra["fusionrag"]["stats"][0]
    assert stats["turn_tokens"] >= first.usage.prompt_tokens  # the whole first prompt was read back
    assert stats["computed_tokens"] == stats["prompt_tokens"] - stats["turn_tokens"]
    assert second.usage.prompt_tokens_details.cached_tokens >= stats["turn_tokens"]
