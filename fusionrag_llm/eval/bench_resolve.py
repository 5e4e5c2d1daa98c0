"""Resolve-cost benchmark: planning a request's context, and planning plus assembling it, per prompt token.

Prompts are registered chunks of about ``chunk_tokens`` tokens each, from 1k to 32k tokens in all.
Planning is plain Python (segment slots, chained path-block keys, chunk-entry keys), so its cost per
token should stay flat as prompts grow; assembly adds reading every chunk's entry from the store and
placing it (rotary at its position) in a fresh cache. Assembly does not run the model over the
prompt, and positions past the model's window are plain arithmetic for it, so every size is
resolved even past the random-weight ``tiny`` model's 4096-token window; the rows say which sizes
fit it (the ones a request could actually generate from).

Example:
    >>> cfg = ResolveBenchConfig(sizes=(256,), chunk_tokens=64, method="full_reuse", repeats=1, threads=1)
    >>> [row["prompt_tokens"] >= 256 for row in run_resolve_bench(cfg)["rows"]]
    [True]
"""

from __future__ import annotations

import contextlib
import logging
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from fusionrag_llm import FusionRAG, RAGRequest
from fusionrag_llm.engine.methods import METHODS, plan_run
from fusionrag_llm.engine.resolve import ContextResolver
from fusionrag_llm.eval.results import fmt, machine_info, markdown_table, write_json

logger = logging.getLogger(__name__)

DEFAULT_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
WORDS = ("harbour", "ferry", "tide", "gull", "pier", "lantern", "net", "keel", "north", "salt", "rope", "dock")


@dataclass(frozen=True)
class ResolveBenchConfig:
    """``sizes``: prompt tokens of chunks per request; ``repeats``: timed runs per size (median kept)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    chunk_tokens: int = 128
    model: str = "tiny"
    method: str = "fusionrag"  # fused entries fall back to plain; "full_reuse" reads plain only
    prefix_cache: bool = True
    repeats: int = 5
    seed: int = 0
    threads: int | None = None  # torch CPU threads during the run (restored after); None: as set
    out: Path | None = None  # folder for resolve.json and resolve.md; None: nothing written

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"sizes must be positive token counts, got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)
        if isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 8:
            raise ValueError(f"chunk_tokens must be an int >= 8, got {self.chunk_tokens!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):  # fmt: skip
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {self.repeats!r}")
        if self.method not in METHODS or METHODS[self.method].kv_variant is None:
            reusing = [name for name, spec in METHODS.items() if spec.kv_variant is not None]
            raise ValueError(f"method must reuse chunk entries, one of {', '.join(reusing)}; got {self.method!r}")


def chunk_texts(count: int, chars: int, seed: int) -> list[str]:
    """``count`` distinct texts of about ``chars`` characters (a token each with a byte tokenizer)."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        words = [f"Passage {index}:"]
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(WORDS))
        texts.append(" ".join(words)[:chars].rstrip() + ".")
    return texts


def run_resolve_bench(config: ResolveBenchConfig) -> dict:
    """Median plan and plan+assembly times per size; returns rows, a markdown table and the setup."""
    rag = FusionRAG.from_pretrained(config.model, store=":memory:", prefix_cache=config.prefix_cache)
    with _torch_threads(config.threads):
        texts = _register(rag, config)
        rows = [_measure(rag, texts, size, config) for size in config.sizes]
    result = {"config": {**asdict(config), "out": str(config.out) if config.out else None},
              "machine": machine_info(rag), "window": rag.parts.loaded.context_window, "rows": rows}  # fmt: skip
    result["table"] = resolve_markdown(result)
    logger.info("resolve cost per prompt token:\n%s", result["table"])
    if config.out is not None:
        write_json(Path(config.out) / "resolve.json", result)
        (Path(config.out) / "resolve.md").write_text(result["table"] + "\n")
    rag.store.close()
    return result


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Small tensor ops on a loaded machine run far slower on several threads than on one."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _register(rag: FusionRAG, config: ResolveBenchConfig) -> list[str]:
    """Texts of enough chunks for the largest size, registered (plain, and fused when the method uses it)."""
    count = -(-max(config.sizes) // config.chunk_tokens)
    texts = chunk_texts(count, config.chunk_tokens, config.seed)
    rng = random.Random(config.seed)
    vectors = [[rng.gauss(0, 1) for _ in range(8)] for _ in texts]
    fuse = METHODS[config.method].kv_variant == "fused"
    rag.add_chunks(texts, fuse=fuse, neighbors=1, embeddings=vectors)
    return texts


def _measure(rag: FusionRAG, texts: list[str], size: int, config: ResolveBenchConfig) -> dict:
    chunks = texts[: -(-size // config.chunk_tokens)]
    segments = rag.segments(RAGRequest(chunks=chunks, question="Which passage mentions the lantern?"))
    run_plan = plan_run(config.method, 0.15)
    resolver = ContextResolver(rag.parts.entries, prefix_cache=config.prefix_cache)
    model = rag.parts.loaded.model
    tokens = sum(len(s.token_ids) for s in segments)

    def assemble() -> float:
        cache = model.new_cache(tokens)
        start = time.perf_counter()
        resolver.assemble_plan(resolver.plan(segments, run_plan), cache)
        resolver.release()  # as the engine does once the KV is placed
        return time.perf_counter() - start

    assemble()  # the first run computes what is missing (the prefix's block); later runs only read
    plan_s = _median_seconds(lambda: resolver.plan(segments, run_plan), config.repeats)
    assemble_s = statistics.median(assemble() for _ in range(config.repeats))
    return {"prompt_tokens": tokens, "chunks": len(chunks), "plan_s": plan_s, "plan_assemble_s": assemble_s,
            "plan_us_per_token": plan_s / tokens * 1e6, "plan_assemble_us_per_token": assemble_s / tokens * 1e6,
            "within_window": tokens <= rag.parts.loaded.context_window}  # fmt: skip


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def resolve_markdown(result: dict) -> str:
    headers = ["prompt tokens", "chunks", "plan ms", "plan us/token", "plan+assembly ms", "plan+assembly us/token",
               f"fits the {result['window']}-token window"]  # fmt: skip
    rows = [[str(r["prompt_tokens"]), str(r["chunks"]), fmt(r["plan_s"] * 1e3, 2), fmt(r["plan_us_per_token"], 2),
             fmt(r["plan_assemble_s"] * 1e3, 1), fmt(r["plan_assemble_us_per_token"], 2),
             "yes" if r["within_window"] else "no"] for r in result["rows"]]  # fmt: skip
    return markdown_table(headers, rows)
