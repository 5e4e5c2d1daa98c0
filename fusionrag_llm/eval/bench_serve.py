"""Serving benchmark: the OpenAI-compatible server under 1, 4, 16... concurrent streaming clients.

The server runs in this process on a loopback port over the engine being measured; clients are
OpenAI-protocol HTTP streams (``httpx``), each request a question over as many of its own passages
as bring the prompt closest to a target length, sent as one chat message (the server finds the
registered passages in it by content). The offline stage runs first (not timed), then one warm-up
request. At each concurrency level the same requests are sent with that many clients at once; TTFT
is the time from sending a request to its first content token, throughput the completion tokens of
all requests over the level's wall time. Concurrency 1 is the one-by-one baseline; ratios compare
levels of the same run. Greedy answers must not depend on the level: identical answers are counted.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fusionrag_llm.eval.results import check_ints, figure, fmt, machine_line, markdown_table, ms, write_report
from fusionrag_llm.request import RAGRequest


@dataclass(frozen=True)
class ServeConfig:
    dataset: str
    model: str
    requests: int = 16
    target_tokens: int = 1024
    max_new_tokens: int = 32
    concurrency: tuple[int, ...] = (1, 4, 16)
    method: str = "fusionrag"
    ratio: float = 0.15
    neighbors: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        check_ints(self, ("requests", "target_tokens", "max_new_tokens"))
        if not self.concurrency or any(not isinstance(c, int) or c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be ints >= 1, got {self.concurrency!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def chat_messages(request: RAGRequest) -> list[dict[str, str]]:
    """The request as one user message, written as the library writes it (passages found by content)."""
    return [{"role": "user", "content": "".join(text for _, text in request.pieces())}]


class LoopbackServer:
    """The app over ``rag`` served by uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, rag, name: str = "bench"):
        import uvicorn

        from fusionrag_llm.server.app import create_app

        self.name = name
        self._server = uvicorn.Server(uvicorn.Config(create_app(rag, name), host="127.0.0.1", port=0, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)


def stream_one(http, url: str, body: dict) -> dict:
    """One streamed chat completion: TTFT, end-to-end time, text and completion tokens."""
    start = time.perf_counter()
    first, text, tokens = None, [], 0
    with http.stream("POST", f"{url}/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"the server answered {response.status_code}: {response.read()[:200]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"the stream failed: {event['error']['message']}")
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft_s": (first or end) - start, "latency_s": end - start, "text": "".join(text), "tokens": tokens}


def run_serve(rag, requests: list[RAGRequest], config: ServeConfig) -> dict:
    import httpx

    bodies = [{"model": "bench", "messages": chat_messages(request), "max_tokens": config.max_new_tokens,
               "stream": True, "stream_options": {"include_usage": True}, "method": config.method,
               "recompute_ratio": config.ratio} for request in requests]  # fmt: skip
    # every client of the busiest level decodes in the same batch
    scheduler = rag.engine.scheduler
    scheduler.config = replace(scheduler.config, max_num_seqs=max(scheduler.limit("max_num_seqs"), *config.concurrency))
    levels = []
    with LoopbackServer(rag) as url, httpx.Client(timeout=None) as http:
        stream_one(http, url, bodies[0])  # warm-up
        for concurrency in config.concurrency:
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda body: stream_one(http, url, body), bodies))
            levels.append(_level(concurrency, results, time.perf_counter() - start))
    base = levels[0]
    for level in levels:
        level["throughput_ratio"] = level["tokens_per_s"] / base["tokens_per_s"]
        level["same_answers"] = sum(a == b for a, b in zip(level["texts"], base["texts"]))
    for level in levels:
        del level["texts"]
    return {"levels": levels}


def _level(concurrency: int, results: list[dict], seconds: float) -> dict:
    ttfts = sorted(r["ttft_s"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    texts = [r["text"] for r in results]
    return {"concurrency": concurrency, "seconds": seconds, "completion_tokens": tokens, "tokens_per_s": tokens / seconds,
            "requests_per_s": len(results) / seconds, "ttft_p50_s": statistics.median(ttfts),
            "ttft_p95_s": _percentile(ttfts, 0.95), "latency_p50_s": statistics.median(r["latency_s"] for r in results),
            "ttft_s": [r["ttft_s"] for r in results], "texts": texts}  # fmt: skip


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) - 1e-9)))
    return ordered[rank - 1]


def serve_markdown(result: dict, config: dict, machine: dict) -> str:
    rows = [[r["concurrency"], fmt(r["seconds"], 2), r["completion_tokens"], fmt(r["tokens_per_s"], 2),
             f"{r['throughput_ratio']:.2f}x", fmt(r["requests_per_s"], 3), ms(r["ttft_p50_s"]), ms(r["ttft_p95_s"]),
             ms(r["latency_p50_s"]), f"{r['same_answers']}/{config['requests']}"] for r in result["levels"]]  # fmt: skip
    return (
        f"# Serving: {config['model']}, {config['requests']} requests of ~{config['target_tokens']} tokens, "
        f"{config['max_new_tokens']} new tokens, {config['method']} r={config['ratio']:g}\n\n"
        f"{machine_line(machine)}. One server process (loopback HTTP, streamed); one warm-up "
        "request first; concurrency 1 is one by one.\n\n"
        + markdown_table(["clients", "wall s", "tokens", "tokens/s", "throughput", "requests/s", "TTFT p50 ms",
                          "TTFT p95 ms", "latency p50 ms", "same answers"], rows)  # fmt: skip
        + "\n"
    )


def write_serve(out_dir: Path, config: dict, machine: dict, offline: dict, result: dict) -> list[Path]:
    """serve.json, serve.md and serve.png in ``out_dir``."""
    data = {"config": config, "machine": machine, "offline": offline, **result}
    return write_report(out_dir, "serve", data, serve_markdown(result, config, machine),
                        lambda path: plot_serve(result, path, f"Serving, {config['model']}"))


def plot_serve(result: dict, path: Path, title: str) -> Path:
    """Throughput per level, and the TTFT distribution per level."""
    levels = result["levels"]
    names = [str(level["concurrency"]) for level in levels]
    with figure(path, ncols=2, figsize=(9.6, 4.0)) as (fig, (left, right)):
        left.bar(names, [level["tokens_per_s"] for level in levels])
        left.set(xlabel="concurrent clients", ylabel="completion tokens / s")
        right.boxplot([[t * 1000 for t in level["ttft_s"]] for level in levels], tick_labels=names)
        right.set(xlabel="concurrent clients", ylabel="TTFT (ms)")
        fig.suptitle(title)
    return Path(path)
