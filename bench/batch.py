"""Batching: the same requests answered one by one and as one ``generate_many`` batch.

    python bench/batch.py [--model smollm2-135m] [--dataset FILE|synthetic] [--requests 8] [--tokens 1024] [--out DIR]

Each request is a question over as many of its own passages as bring the prompt closest to a target
length. The offline stage runs first (not timed). After one warm-up request, the requests run one
by one (each alone in the engine), then together (prefills admitted together, every decode step one
forward over all unfinished answers). Throughput is generated tokens per second of wall time; the
ratio compares the two runs of the same process. Greedy answers must be the same either way: the
count of identical answers is reported, with the requests that differ. Then one decode step of 1, 2,
4, ... of the requests' caches (``--rows``), timed through the model's step API (median of 5), at the
workload's context and at a short one: what batching can give on this machine, since a step of
several sequences still reads each one's own KV. Writes batch.json, batch.md and batch.png.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from fusionrag_llm.eval.bench_data import add_chunks, dataset_label, open_bench_rag, workload_requests
from fusionrag_llm.eval.results import figure, fmt, machine_info, markdown_table, ms, write_report

TINY_ARGS = ["--model", "tiny", "--dataset", "synthetic", "--requests", "2", "--tokens", "100", "--max-new-tokens", "2",
             "--rows", "1,2"]


def run_batch(rag, requests, knobs: dict) -> dict:
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


def step_scaling(rag, rows: list[int], lengths: list[int], repeats: int = 5) -> list[dict]:
    """Milliseconds of one decode step of ``r`` sequences at once (each of ``length`` cached tokens), for
    every ``r`` in ``rows`` and ``length`` in ``lengths``; the median of ``repeats`` steps."""
    from fusionrag_llm.models.forward import ForwardPass

    model = rag.engine.model
    vocab = model.cfg.vocab_size
    table = []
    for length in lengths:
        caches = []
        for seed in range(max(rows)):
            ids = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))
            cache = model.new_cache(length + repeats + 1)
            step = ForwardPass(ids, torch.arange(length), cache.reserve(length), logit_rows=torch.tensor([length - 1]))
            model.forward(step, cache)
            caches.append(cache)
        for count in rows:
            group = [cache.fork() for cache in caches[:count]]
            times = []
            for index in range(repeats):
                steps = [ForwardPass(torch.tensor([1]), torch.tensor([length + index]), cache.reserve(1), decode=True)
                         for cache in group]  # fmt: skip
                start = time.perf_counter()
                model.forward_batch(steps, group)
                times.append(time.perf_counter() - start)
            table.append({"context": length, "rows": count, "step_ms": statistics.median(times) * 1000})
    single = {row["context"]: row["step_ms"] for row in table if row["rows"] == 1}
    for row in table:  # tokens per second of the step against one sequence's step, where rows include 1
        row["speedup"] = row["rows"] * single[row["context"]] / row["step_ms"] if row["context"] in single else None
    return table


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
    steps = [[r["context"], r["rows"], fmt(r["step_ms"], 1), fmt(r["speedup"], 2)] for r in result["steps"]]
    return (
        f"# Batching: {config['model']}, {config['requests']} requests of ~{config['tokens']} tokens, "
        f"{config['max_new_tokens']} new tokens, {config['method']}@{config['ratio']:g}\n\n"
        f"{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']} "
        f"({machine['torch_threads']} threads). Same process, same store; one warm-up request first.\n\n"
        + markdown_table(["run", "wall s", "tokens", "tokens/s", "throughput"], rows)
        + f"\n\nIdentical greedy answers: {result['same_answers']} of {len(result['requests'])}\n\n"
        + markdown_table(["request", "prompt tokens", "new tokens", "TTFT alone ms", "TTFT in batch ms", "same"],
                         per_request)  # fmt: skip
        + "\n\nOne decode step of several sequences (tokens/s against one sequence's step):\n\n"
        + markdown_table(["context tokens", "sequences", "step ms", "tokens/s vs one"], steps)
        + "\n"
    )


def plot_batch(result: dict, path: Path, title: str) -> Path:
    """Throughput of both runs, and each request's time to first token in each."""
    rows = result["requests"]
    xs = [r["request"] for r in rows]
    with figure(path, ncols=2, figsize=(9.6, 4.0)) as (fig, (left, right)):
        left.bar(["one by one", "generate_many"], [result["one_by_one"]["tokens_per_s"], result["batched"]["tokens_per_s"]])
        left.set_ylabel("generated tokens / s")
        right.plot(xs, [r["ttft_one_by_one_s"] * 1000 for r in rows], marker="o", label="alone")
        right.plot(xs, [r["ttft_batched_s"] * 1000 for r in rows], marker="s", label="in the batch (from submission)")
        right.set(xlabel="request", ylabel="TTFT (ms)")
        right.legend(fontsize=8)
        fig.suptitle(title)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default=None, help="'synthetic' or a MuSiQue-format file (default: the shared one)")
    p.add_argument("--requests", type=int, default=8, help="requests, one question each")
    p.add_argument("--tokens", type=int, default=1024, help="target prompt length in tokens")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--method", default="fusionrag")
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--neighbors", type=int, default=3)
    p.add_argument("--rows", default="1,2,4,8", help="sequences per timed decode step, comma-separated")
    p.add_argument("--out", default="bench_results")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    dataset = dataset_label(args.dataset)
    rag = open_bench_rag(args.model)
    requests = workload_requests(rag, dataset, args.requests, args.tokens)
    offline = add_chunks(rag, [chunk for request in requests for chunk in request.chunks], args.neighbors)
    knobs = {"method": args.method, "recompute_ratio": args.ratio, "max_new_tokens": args.max_new_tokens}
    result = run_batch(rag, requests, knobs)
    context = round(statistics.mean(row["prompt_tokens"] for row in result["requests"]))
    result["steps"] = step_scaling(rag, [int(r) for r in args.rows.split(",")], sorted({16, context}))
    config = {**vars(args), "dataset": dataset}
    machine = machine_info(rag)
    paths = write_report(Path(args.out), "batch", {"config": config, "machine": machine, "offline": offline, **result},
                         batch_markdown(result, config, machine),
                         lambda path: plot_batch(result, path, f"Batching, {args.model}"))  # fmt: skip
    print(paths[1].read_text() + "wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
