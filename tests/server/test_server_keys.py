"""API keys and chunk writes over loopback with the real OpenAI client: a wrong or missing key is a
401 in OpenAI's shape (``openai.AuthenticationError``), a right one works, ``/health`` stays open; chunk
writes can be held by their own key or turned off (403 saying so)."""

import httpx
import pytest

from fusionrag_llm import FusionRAGError
from fusionrag_llm.server.app import create_app

from server_helpers import RunningServer, make_rag

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "Who kept the log?"}]
TEXT = {"texts": ["The harbour master rebuilt the archive in 1903."], "fuse": False}


@pytest.fixture(scope="module")
def rag():
    return make_rag()


def client(base: str, key: str):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def assert_error(response: httpx.Response, status: int, code: str, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert words in error["message"], error


def test_with_api_keys_every_route_but_health_needs_one(rag):
    with RunningServer(create_app(rag, "tiny", api_keys=["sk-one", "sk-two"])) as base:
        with pytest.raises(openai.AuthenticationError) as refused:
            client(base, "sk-wrong").chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        for key in ("sk-one", "sk-two"):
            reply = client(base, key).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
            assert reply.choices[0].finish_reason in ("stop", "length")
        assert [model.id for model in client(base, "sk-two").models.list()][0] == "tiny"
        assert httpx.get(f"{base}/health").status_code == 200
        for path in ("/v1/models", "/v1/chunks", "/v1/no-such-route", "/docs", "/openapi.json"):
            assert_error(httpx.get(f"{base}{path}"), 401, "invalid_api_key", "no API key was given")
        wrong = {"Authorization": "Bearer sk-one-and-more"}
        assert_error(httpx.post(f"{base}/v1/chunks", json=TEXT, headers=wrong), 401, "invalid_api_key", "not one")
        registered = httpx.post(f"{base}/v1/chunks", json=TEXT, headers={"Authorization": "Bearer sk-one"}, timeout=60)
        assert registered.status_code == 200, registered.text


def test_a_chunks_key_alone_may_register_chunks(rag):
    with RunningServer(create_app(rag, "tiny", api_keys=["sk-team"], chunk_writes="sk-admin")) as base:
        team = client(base, "sk-team")
        with pytest.raises(openai.PermissionDeniedError) as refused:
            team.post("/chunks", body=TEXT, cast_to=object)
        assert refused.value.status_code == 403 and refused.value.code == "chunks_key_required"
        with pytest.raises(openai.AuthenticationError):
            client(base, "sk-other").post("/chunks", body=TEXT, cast_to=object)
        admin = client(base, "sk-admin")
        assert admin.post("/chunks", body=TEXT, cast_to=object)["object"] == "list"
        assert admin.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices
        assert team.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices


def test_chunk_writes_can_be_turned_off(rag):
    with RunningServer(create_app(rag, "tiny", chunk_writes=False)) as base:
        refused = httpx.post(f"{base}/v1/chunks", json=TEXT)
        assert_error(refused, 403, "chunk_writes_disabled", "chunk writes are disabled on this server")
        assert httpx.get(f"{base}/v1/chunks", timeout=60).json()["count"] >= 3  # reading stays open
        assert client(base, "any").chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices


def test_a_chunks_key_without_api_keys_guards_only_chunk_writes(rag):
    with RunningServer(create_app(rag, "tiny", chunk_writes="sk-admin")) as base:
        assert_error(httpx.post(f"{base}/v1/chunks", json=TEXT), 401, "invalid_api_key", "no API key was given")
        admin = {"Authorization": "Bearer sk-admin"}
        assert httpx.post(f"{base}/v1/chunks", json=TEXT, headers=admin, timeout=60).status_code == 200
        assert client(base, "anything").chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices


@pytest.mark.parametrize(
    ("api_keys", "chunk_writes", "words"),
    [
        ("sk-one", True, "a list of keys"),
        (["sk one"], True, "API key 1 of 1 must be a non-empty string of printable ASCII"),
        (["sk-one", ""], True, "API key 2 of 2"),
        ([], "", "the chunks key must be"),
        ([], 1, "chunk_writes must be True, False or a key"),
    ],
)
def test_bad_keys_are_refused_when_the_app_is_made(rag, api_keys, chunk_writes, words):
    with pytest.raises(FusionRAGError, match=words):
        create_app(rag, "tiny", api_keys=api_keys, chunk_writes=chunk_writes)
