"""``GET /metrics`` in Prometheus' text format, and one log line per finished request, on a real server
with the real OpenAI client."""

import logging
import re

import httpx
import pytest
from server_helpers import RunningServer, make_rag

from fusionrag_llm.server.app import create_app

openai = pytest.importorskip("openai")


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.M)
    assert found, f"{name} is not in /metrics"
    return float(found.group(1))


def test_metrics_count_what_was_served_and_every_request_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="fusionrag_llm.server.requests")
    with RunningServer(create_app(make_rag(), "tiny", api_keys=["sk-metrics-0123456789"])) as base:
        headers = {"Authorization": "Bearer sk-metrics-0123456789"}
        assert httpx.get(f"{base}/metrics").status_code == 401  # a route like the others
        before = httpx.get(f"{base}/metrics", headers=headers)
        assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert metric(before.text, "fusionrag_generated_tokens_total") == 0
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-metrics-0123456789", max_retries=0)
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, n=2)
        text = client.completions.create(model="tiny", prompt="The lighthouse", max_tokens=2)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=-1)
        after = httpx.get(f"{base}/metrics", headers=headers).text
    generated = chat.usage.completion_tokens + text.usage.completion_tokens
    assert metric(after, "fusionrag_generated_tokens_total") == generated
    assert metric(after, "fusionrag_prompt_tokens_total") == chat.usage.prompt_tokens + text.usage.prompt_tokens
    finished = sum(float(v) for v in re.findall(r'^fusionrag_requests_total\{endpoint="\w+",finish="\w+"\} (\S+)$', after, re.M))
    assert finished == 2 and metric(after, "fusionrag_ttft_seconds_count") == 2
    assert metric(after, 'fusionrag_errors_total{status="400"}') == 1
    assert metric(after, 'fusionrag_ttft_seconds_bucket{le="+Inf"}') == 2
    assert metric(after, "fusionrag_requests_running") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "fusionrag_llm.server.requests"]
    assert len(lines) == 2 and lines[0].startswith(chat.id) and f"generated={chat.usage.completion_tokens}" in lines[0]
    assert "method=fusionrag" in lines[1] and "ttft_ms=" in lines[1] and "Hi" not in lines[0]  # no prompt text
