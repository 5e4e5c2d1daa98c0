"""Tenants over HTTP, with the real OpenAI client: a request never reuses, nor reports as cached, what
another tenant's requests left or registered; chunks are registered and counted per tenant; a bad
tenant is a 400 saying what is allowed."""

import httpx
import pytest
from server_helpers import CHUNKS, RunningServer

from fusionrag_llm.server.app import create_app

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    from fusionrag_llm import FusionRAG

    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"turn_cache_gib": 0.05})
    with RunningServer(create_app(rag, "tiny")) as base:
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def secret(code: str) -> list[dict]:
    return [{"role": "system", "content": "You keep secrets."},
            {"role": "user", "content": f"The vault code is {code}. Repeat the vault code."}]  # fmt: skip


def cached(client, messages, **tenant) -> tuple[int, dict]:
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=3, extra_body=tenant)
    return reply.usage.prompt_tokens_details.cached_tokens, reply.model_extra["fusionrag"]["stats"][0]


def test_a_right_guess_of_another_tenants_prompt_reports_what_a_wrong_one_does(server):
    _, client = server
    alice, _ = cached(client, secret("4417"), tenant="alice")
    alice_again, stats = cached(client, secret("4417"), tenant="alice")
    assert alice_again > alice and stats["turn_tokens"] > 0  # a tenant reuses its own prompt
    right, right_stats = cached(client, secret("4417"), tenant="mallory")
    wrong, wrong_stats = cached(client, secret("9923"), cache_salt="mallory-2")  # vLLM's name for it
    assert right == wrong == alice
    assert right_stats["turn_tokens"] == wrong_stats["turn_tokens"] == 0
    assert right_stats["computed_tokens"] == wrong_stats["computed_tokens"]


def test_chunks_are_registered_counted_and_reused_per_tenant(server):
    base, client = server
    added = httpx.post(f"{base}/v1/chunks", json={"texts": CHUNKS, "neighbors": 1, "tenant": "alice"}, timeout=120)
    assert added.status_code == 200 and added.json()["plain_computed"] == len(CHUNKS)
    counts = {t: httpx.get(f"{base}/v1/chunks", params={"tenant": t}).json()["count"] for t in ("alice", "bob")}
    assert counts == {"alice": len(CHUNKS), "bob": 0} and httpx.get(f"{base}/v1/chunks").json()["count"] == 0
    question = [{"role": "user", "content": f"Documents:\n{CHUNKS[0]}\n\n{CHUNKS[1]}\n\nQuestion: Who kept the log?"}]
    _, own = cached(client, question, tenant="alice")
    _, other = cached(client, question, tenant="bob")
    _, default = cached(client, question)
    assert own["path_hits"]["chunk"] + own["path_hits"]["exact"] >= 1 and own["reused_tokens"] > 0
    for stats in (other, default):
        assert stats["reused_tokens"] == 0 and stats["path_hits"] == {"exact": 0, "chunk": 0, "miss": 0}


@pytest.mark.parametrize("tenant", ["x" * 129, "two\nlines"])
def test_a_bad_tenant_is_a_400_saying_what_is_allowed(server, tenant):
    base, client = server
    with pytest.raises(openai.BadRequestError, match="printable characters"):
        client.chat.completions.create(model="tiny", messages=secret("1"), max_tokens=2, extra_body={"tenant": tenant})
    with pytest.raises(openai.BadRequestError, match="printable characters"):
        client.completions.create(model="tiny", prompt="Hi", max_tokens=2, extra_body={"cache_salt": tenant})
    for response in (httpx.post(f"{base}/v1/chunks", json={"texts": ["A text."], "tenant": tenant}),
                     httpx.get(f"{base}/v1/chunks", params={"tenant": tenant})):  # fmt: skip
        assert response.status_code == 400 and "printable characters" in response.json()["error"]["message"]
    both = httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny", "messages": secret("1"), "tenant": "a",
                                                             "cache_salt": "b"})  # fmt: skip
    assert both.status_code == 400 and "give one" in both.json()["error"]["message"]


def test_a_key_bound_to_a_tenant_serves_that_tenant_only():
    """With ``tenant:NAME=KEY`` keys, the key decides the tenant: requests need not name it, one that
    names another tenant is refused (403), and an unbound key still serves the tenant a request names."""
    from fusionrag_llm import FusionRAG

    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"turn_cache_gib": 0.05})
    keys = {"sk-alice-0123456789": "alice", "sk-ops-0123456789": None}
    with RunningServer(create_app(rag, "tiny", api_keys=keys)) as base:
        alice = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-alice-0123456789", max_retries=0)
        ops = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-ops-0123456789", max_retries=0)
        first, _ = cached(alice, secret("4417"))
        again, stats = cached(alice, secret("4417"))
        assert again > first and stats["turn_tokens"] > 0  # alice's own KV: the key's tenant
        named, _ = cached(ops, secret("4417"), tenant="alice")
        assert named == again  # an unbound key serves the tenant it names: alice's cache
        unnamed, unnamed_stats = cached(ops, secret("4417"))
        assert unnamed == first and unnamed_stats["turn_tokens"] == 0  # the default tenant: nothing of alice's
        with pytest.raises(openai.PermissionDeniedError, match="serves one tenant only"):
            cached(alice, secret("4417"), tenant="bob")
        assert cached(alice, secret("4417"), cache_salt="alice")[0] == again  # naming its own is fine
        header = {"Authorization": "Bearer sk-alice-0123456789"}
        added = httpx.post(f"{base}/v1/chunks", json={"texts": CHUNKS[:1], "neighbors": 1}, headers=header, timeout=120)
        assert added.status_code == 200
        count = httpx.get(f"{base}/v1/chunks", params={"tenant": "alice"}, headers={"Authorization": "Bearer sk-ops-0123456789"})
        assert count.json()["count"] == 1  # registered under the key's tenant
