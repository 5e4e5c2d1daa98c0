"""Reuse across requests: a multi-turn chat with and without turn reuse and de-duplication, and
RAGBoost's reordering on requests that share chunks.

Turns: a ``RAGSession`` of ``turns`` turns over one question's passages; turn t retrieves passages
t .. t+window-1 of the question (each turn shares all but one with the turn before), asks the
question again in other words, and decodes ``max_new_tokens``. It runs three times on the same
engine and store: without the turn cache (every turn reads its chunks from their entries and
computes the whole chat's text), with it, and with it plus de-duplication. Per-turn TTFT and the
tokens each turn computed are reported; ratios compare the runs of one process.

Reorder: ``requests`` requests over a pool of passages, each drawing ``per_request`` of them in
random order (seeded), answered one by one with ``reorder`` off and on, each run on a fresh
in-memory store with the turn cache on (so both caches start empty) holding the same entries. The
prefix-hit rate is the share of prompt tokens whose KV was read as it is (exact prefix, exact first
chunk, prefix and turn caches); TTFT is averaged.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from fusionrag_llm.eval.results import check_positive_ints, fmt, markdown_table, ms, write_report

REPHRASINGS = ("{q}", "Once more: {q}", "Check again: {q}", "To be sure, {q}", "Finally, {q}", "Last time: {q}")


@dataclass(frozen=True)
class ReuseConfig:
    dataset: str
    model: str
    turns: int = 5
    window: int = 3
    requests: int = 12
    pool: int = 8
    per_request: int = 4
    max_new_tokens: int = 16
    method: str = "fusionrag"
    ratio: float = 0.15
    neighbors: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_ints(self, ("turns", "window", "requests", "pool", "per_request", "max_new_tokens"))
        if self.per_request > self.pool:
            raise ValueError(f"per_request ({self.per_request}) cannot exceed pool ({self.pool})")

    def to_dict(self) -> dict:
        return asdict(self)


def run_turns(rag, passages: list[str], question: str, config: ReuseConfig) -> dict:
    """The chat three ways on ``rag`` (its turn cache is swapped per run; entries stay stored)."""
    from fusionrag_llm import RAGSession
    from fusionrag_llm.engine.turn_cache import TurnCache

    need = config.turns + config.window - 1
    if len(passages) < need:
        raise ValueError(f"{config.turns} turns of {config.window} passages need {need} passages, the question has {len(passages)}")
    knobs = {"method": config.method, "recompute_ratio": config.ratio, "max_new_tokens": config.max_new_tokens}
    RAGSession(rag).ask(passages[-1:], "A warm-up question?", **knobs)  # one-time costs (the prompt prefix) out of the way
    runs = {}
    for name, turn_cache, dedupe in (("no reuse", False, False), ("turn reuse", True, False),
                                     ("turn reuse + dedupe", True, True)):  # fmt: skip
        rag.engine.turns = TurnCache(2**31) if turn_cache else None
        session = RAGSession(rag, dedupe=dedupe)
        rows = []
        for turn in range(config.turns):
            chunks = passages[turn : turn + config.window]
            out = session.ask(chunks, REPHRASINGS[turn % len(REPHRASINGS)].format(q=question), **knobs)
            s = out.stats
            rows.append({"turn": turn + 1, "prompt_tokens": s.prompt_tokens, "computed_tokens": s.computed_tokens,
                         "turn_tokens": s.turn_tokens, "ttft_s": s.ttft_s, "text": out.text})  # fmt: skip
        runs[name] = rows
    rag.engine.turns = None
    return runs


def shared_chunk_requests(passages: list[str], questions: list[str], config: ReuseConfig):
    from fusionrag_llm.request import RAGRequest

    rng = random.Random(config.seed)
    pool = passages[: config.pool]
    return [RAGRequest(chunks=rng.sample(pool, config.per_request), question=questions[i % len(questions)])
            for i in range(config.requests)]  # fmt: skip


def run_reorder(make_rag, requests, config: ReuseConfig) -> dict:
    """``make_rag()`` gives a fresh engine (empty prefix cache, a turn cache) with the requests' chunks
    ingested; one warm-up request runs first, whose turn KV is then dropped."""
    from fusionrag_llm.request import RAGRequest

    knobs = {"method": config.method, "recompute_ratio": config.ratio, "max_new_tokens": config.max_new_tokens}
    runs = {}
    for reorder in (False, True):
        rag = make_rag()
        rag.generate(RAGRequest(chunks=requests[0].chunks[:1], question="A warm-up question?"), **knobs)
        rag.engine.turns.clear()  # the warm-up's KV: the run starts with an empty turn cache
        outs = [rag.generate(request, reorder=reorder, **knobs) for request in requests]
        prompt = sum(o.stats.prompt_tokens for o in outs)
        exact = sum(o.stats.exact_tokens for o in outs)
        runs["reordered" if reorder else "as retrieved"] = {
            "prefix_hit_rate": exact / prompt, "prompt_tokens": prompt, "exact_tokens": exact,
            "computed_tokens": sum(o.stats.computed_tokens for o in outs),
            "ttft_mean_s": statistics.mean(o.stats.ttft_s for o in outs),
            "ttft_s": [o.stats.ttft_s for o in outs],
        }  # fmt: skip
    return runs


def reuse_markdown(result: dict, config: dict, machine: dict) -> str:
    turns = result["turns"]
    names = list(turns)
    header = ["turn", "prompt tokens"] + [f"{n}: TTFT ms" for n in names] + [f"{n}: computed" for n in names]
    rows = []
    for index in range(len(turns[names[0]])):
        cells = [turns[n][index] for n in names]
        rows.append([index + 1, " / ".join(str(c["prompt_tokens"]) for c in cells)]
                    + [ms(c["ttft_s"]) for c in cells] + [c["computed_tokens"] for c in cells])  # fmt: skip
    totals = {n: sum(r["ttft_s"] for r in turns[n]) for n in names}
    base = totals[names[0]]
    summary = [[n, fmt(totals[n], 2), f"{base / totals[n]:.2f}x"] for n in names]
    reorder = result["reorder"]
    rows_reorder = [[name, f"{r['prefix_hit_rate']:.1%}", r["computed_tokens"], ms(r["ttft_mean_s"])]
                    for name, r in reorder.items()]  # fmt: skip
    speed = reorder["as retrieved"]["ttft_mean_s"] / reorder["reordered"]["ttft_mean_s"]
    return (
        f"# Reuse across requests: {config['model']}, {config['method']} r={config['ratio']:g}, "
        f"{config['max_new_tokens']} new tokens\n\n"
        f"{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']} ({machine['torch_threads']} threads).\n\n"
        f"## A {config['turns']}-turn chat ({config['window']} passages per turn, one new per turn)\n\n"
        + markdown_table(header, rows)
        + "\n\n" + markdown_table(["run", "TTFT of all turns s", "vs no reuse"], summary)
        + f"\n\n## Reordering ({config['requests']} requests, {config['per_request']} of {config['pool']} shared passages each)\n\n"
        + markdown_table(["run", "prefix-hit rate", "tokens computed", "mean TTFT ms"], rows_reorder)
        + f"\n\nMean TTFT, as retrieved / reordered: {speed:.2f}x\n"
    )


def write_reuse(out_dir: Path, config: dict, machine: dict, result: dict) -> list[Path]:
    """reuse.json, reuse.md and reuse.png (per-turn TTFT) in ``out_dir``."""
    return write_report(out_dir, "reuse", {"config": config, "machine": machine, **result},
                        reuse_markdown(result, config, machine),
                        lambda path: plot_turns(result["turns"], path, f"Per-turn TTFT, {config['model']}"))


def plot_turns(turns: dict, path: Path, title: str) -> Path:
    from fusionrag_llm.eval.plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, rows in turns.items():
        ax.plot([r["turn"] for r in rows], [r["ttft_s"] * 1000 for r in rows], marker="o", label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT (ms)")
    ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, plt, path)

