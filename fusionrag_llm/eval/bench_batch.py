"""Batching benchmark: the same requests answered one by one and as one ``generate_many`` batch.

Each request is a question over as many of its own passages as bring the prompt closest to a target
length. The offline stage runs first (not timed). After one warm-up request, the requests run one
by one (each alone in the engine), then together (prefills admitted together, every decode step one
forward over all unfinished answers). Throughput is generated tokens per second of wall time; the
ratio compares the two runs of the same process. Greedy answers must be the same either way: the
count of identical answers is reported, with the requests that differ.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fusionrag_llm.eval.bench_data import SYNTHETIC, load_examples
from fusionrag_llm.eval.results import check_positive_ints, fmt, markdown_table, ms, write_report
from fusionrag_llm.request import RAGRequest


@dataclass(frozen=True)
class BatchConfig:
    dataset: str  # "synthetic" or a resolved MuSiQue-format file
    model: str
    requests: int = 8
    target_tokens: int = 1024
    max_new_tokens: int = 32
    method: str = "fusionrag"
    ratio: float = 0.15
    neighbors: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_ints(self, ("requests", "target_tokens", "max_new_tokens"))

    def to_dict(self) -> dict:
        return asdict(self)


def build_requests(rag, config: BatchConfig) -> list[RAGRequest]:
    """One request per question: the prefix of its passages whose prompt is closest to the target
    (``config``: any workload settings with ``dataset``, ``requests``, ``target_tokens`` and ``seed``)."""
    passages = 10 if config.dataset == SYNTHETIC else None  # MuSiQue: all of each question's passages
    examples = load_examples(config.dataset, config.requests, passages=passages, seed=config.seed)
    if len(examples) < config.requests:
        raise ValueError(f"the dataset has {len(examples)} questions; --requests asks for {config.requests}")
    return [closest_request(rag, [p.text for p in ex.passages], ex.question, config.target_tokens) for ex in examples]


def closest_request(rag, passages: list[str], question: str, target: int) -> RAGRequest:
    best, best_gap = None, None
    for count in range(1, len(passages) + 1):
        request = RAGRequest(chunks=passages[:count], question=question)
        size = sum(len(s.token_ids) for s in rag.segments(request))
        if best is None or abs(size - target) < best_gap:
            best, best_gap = request, abs(size - target)
        if size >= target:
            break
    return best


def run_batch(rag, requests: list[RAGRequest], config: BatchConfig) -> dict:
    knobs = {"method": config.method, "recompute_ratio": config.ratio, "max_new_tokens": config.max_new_tokens}
    rag.generate(requests[0], **knobs)  # warm-up
    start = time.perf_counter()
    single = [rag.generate(request, **knobs) for request in requests]
    single_s = time.perf_counter() - start
    start = time.perf_counter()
    batch = rag.generate_many(requests, **knobs)
    batch_s = time.perf_counter() - start
    return {
        "one_by_one": _summary(single, single_s),
        "batched": _summary(batch, batch_s),
        "throughput_ratio": (_tokens(batch) / batch_s) / (_tokens(single) / single_s),
        "same_answers": sum(a.token_ids == b.token_ids for a, b in zip(single, batch)),
        "different_answers": [i for i, (a, b) in enumerate(zip(single, batch)) if a.token_ids != b.token_ids],
        "requests": [_request_row(i, a, b) for i, (a, b) in enumerate(zip(single, batch))],
    }


def _tokens(generations) -> int:
    return sum(len(g.token_ids) for g in generations)


def _summary(generations, seconds: float) -> dict:
    return {"seconds": seconds, "generated_tokens": _tokens(generations), "tokens_per_s": _tokens(generations) / seconds}


def _request_row(index: int, single, batch) -> dict:
    return {
        "request": index,
        "prompt_tokens": single.stats.prompt_tokens,
        "generated_one_by_one": len(single.token_ids),
        "generated_batched": len(batch.token_ids),
        "ttft_one_by_one_s": single.stats.ttft_s,
        "ttft_batched_s": batch.stats.queue_s + batch.stats.ttft_s,  # from submission: the batch queues
        "same_answer": single.token_ids == batch.token_ids,
    }


def batch_markdown(result: dict, config: dict, machine: dict) -> str:
    one, many = result["one_by_one"], result["batched"]
    rows = [["one by one", fmt(one["seconds"], 2), one["generated_tokens"], fmt(one["tokens_per_s"], 2), "1.00x"],
            ["generate_many", fmt(many["seconds"], 2), many["generated_tokens"], fmt(many["tokens_per_s"], 2),
             f"{result['throughput_ratio']:.2f}x"]]  # fmt: skip
    per_request = [[r["request"], r["prompt_tokens"], r["generated_one_by_one"], ms(r["ttft_one_by_one_s"]),
                    ms(r["ttft_batched_s"]), "yes" if r["same_answer"] else "NO"] for r in result["requests"]]  # fmt: skip
    return (
        f"# Batching: {config['model']}, {config['requests']} requests of ~{config['target_tokens']} tokens, "
        f"{config['max_new_tokens']} new tokens, {config['method']} r={config['ratio']:g}\n\n"
        f"{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']} "
        f"({machine['torch_threads']} threads). Same process, same store; one warm-up request first.\n\n"
        + markdown_table(["run", "wall s", "tokens", "tokens/s", "throughput"], rows)
        + f"\n\nIdentical greedy answers: {result['same_answers']} of {len(result['requests'])}\n\n"
        + markdown_table(["request", "prompt tokens", "new tokens", "TTFT alone ms", "TTFT in batch ms", "same"],
                         per_request)  # fmt: skip
        + "\n"
    )


def write_batch(out_dir: Path, config: dict, machine: dict, offline: dict, result: dict) -> list[Path]:
    """batch.json, batch.md and batch.png in ``out_dir``."""
    data = {"config": config, "machine": machine, "offline": offline, **result}
    return write_report(out_dir, "batch", data, batch_markdown(result, config, machine),
                        lambda path: plot_batch(result, path, f"Batching, {config['model']}"))


def plot_batch(result: dict, path: Path, title: str) -> Path:
    """Throughput of both runs, and each request's time to first token in each."""
    from fusionrag_llm.eval.plots import _pyplot, _save

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 4.0))
    left.bar(["one by one", "generate_many"], [result["one_by_one"]["tokens_per_s"], result["batched"]["tokens_per_s"]])
    left.set_ylabel("generated tokens / s")
    rows = result["requests"]
    xs = [r["request"] for r in rows]
    right.plot(xs, [r["ttft_one_by_one_s"] * 1000 for r in rows], marker="o", label="alone")
    right.plot(xs, [r["ttft_batched_s"] * 1000 for r in rows], marker="s", label="in the batch (from submission)")
    right.set_xlabel("request")
    right.set_ylabel("TTFT (ms)")
    right.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, plt, path)
