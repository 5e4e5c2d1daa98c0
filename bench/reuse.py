"""Reuse across requests: a multi-turn chat with and without turn reuse and de-duplication, and
RAGBoost's reordering on requests that share chunks.

    python bench/reuse.py [--model smollm2-135m] [--dataset FILE|synthetic] [--turns 5] [--out DIR]

Turns: a ``RAGSession`` of ``turns`` turns over one question's passages; turn t retrieves passages
t .. t+window-1 of the question (each turn shares all but one with the turn before), asks the
question again in other words, and decodes ``max_new_tokens``. It runs three times: without the turn
cache (every turn reads its chunks from their entries and computes the whole chat's text), with it,
and with it plus de-duplication. Per-turn TTFT and the tokens each turn computed are reported.

Reorder: ``requests`` requests over a pool of passages, each drawing ``per_request`` of them in
random order (seeded), answered one by one with ``reorder`` off and on. The prefix-hit rate is the
share of prompt tokens whose KV was read as it is (exact prefix, exact first chunk, prefix and turn
caches); TTFT is averaged.

Every run has an engine of its own (the model loaded again, an in-memory store holding the same
entries, empty prefix and turn caches), so no run reads what another left behind; ratios compare
runs of one process. Writes reuse.json, reuse.md and reuse.png.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from fusionrag_llm import FusionRAG, RAGRequest, RAGSession
from fusionrag_llm.eval.bench_data import dataset_label, load_examples
from fusionrag_llm.eval.results import figure, fmt, machine_info, markdown_table, ms, write_report

TINY_ARGS = ["--model", "tiny", "--dataset", "synthetic", "--turns", "2", "--window", "1", "--requests", "2",
             "--pool", "2", "--per-request", "1", "--max-new-tokens", "1"]  # fmt: skip
REPHRASINGS = ("{q}", "Once more: {q}", "Check again: {q}", "To be sure, {q}", "Finally, {q}", "Last time: {q}")
TURN_CACHE_GIB = 2.0


def engine(args, passages: list[str], turn_cache: bool) -> FusionRAG:
    """A fresh engine over ``passages``, warmed up by a request that shares no chunk with the runs."""
    rag = FusionRAG.from_pretrained(args.model, store=":memory:",
                                     options={"turn_cache_gib": TURN_CACHE_GIB if turn_cache else 0.0})
    rag.add_chunks(passages, neighbors=args.neighbors)
    rag.generate("A warm-up question?", **knobs(args))
    return rag


def knobs(args) -> dict:
    return {"method": args.method, "recompute_ratio": args.ratio, "max_new_tokens": args.max_new_tokens}


def run_turns(args, passages: list[str], question: str) -> dict:
    runs = {}
    for name, turn_cache, dedupe in (("no reuse", False, False), ("turn reuse", True, False),
                                     ("turn reuse + dedupe", True, True)):  # fmt: skip
        session = RAGSession(engine(args, passages, turn_cache), dedupe=dedupe)
        rows = []
        for turn in range(args.turns):
            chunks = passages[turn : turn + args.window]
            out = session.ask(chunks, REPHRASINGS[turn % len(REPHRASINGS)].format(q=question), **knobs(args))
            s = out.stats
            rows.append({"turn": turn + 1, "prompt_tokens": s.prompt_tokens, "computed_tokens": s.computed_tokens,
                         "turn_tokens": s.turn_tokens, "ttft_s": s.ttft_s, "text": out.text})  # fmt: skip
        runs[name] = rows
    return runs


def shared_chunk_requests(args, passages: list[str], questions: list[str]) -> list[RAGRequest]:
    rng = random.Random(0)
    pool = passages[: args.pool]
    return [RAGRequest(chunks=rng.sample(pool, args.per_request), question=questions[i % len(questions)])
            for i in range(args.requests)]  # fmt: skip


def run_reorder(args, passages: list[str], requests: list[RAGRequest]) -> dict:
    runs = {}
    for reorder in (False, True):
        rag = engine(args, passages[: args.pool], turn_cache=True)
        outs = [rag.generate(rag.ordered(request) if reorder else request, **knobs(args)) for request in requests]
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
        f"# Reuse across requests: {config['model']}, {config['method']}@{config['ratio']:g}, "
        f"{config['max_new_tokens']} new tokens\n\n"
        f"{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']} ({machine['torch_threads']} threads).\n\n"
        f"## A {config['turns']}-turn chat ({config['window']} passages per turn, one new per turn)\n\n"
        + markdown_table(header, rows)
        + "\n\n" + markdown_table(["run", "TTFT of all turns s", "vs no reuse"], summary)
        + f"\n\n## Reordering ({config['requests']} requests, {config['per_request']} of {config['pool']} shared passages each)\n\n"
        + markdown_table(["run", "prefix-hit rate", "tokens computed", "mean TTFT ms"], rows_reorder)
        + f"\n\nMean TTFT, as retrieved / reordered: {speed:.2f}x\n"
    )


def plot_turns(turns: dict, path: Path, title: str) -> Path:
    with figure(path, figsize=(6.4, 4.0)) as (fig, ax):
        for name, rows in turns.items():
            ax.plot([r["turn"] for r in rows], [r["ttft_s"] * 1000 for r in rows], marker="o", label=name)
        ax.set(xlabel="turn", ylabel="TTFT (ms)")
        ax.legend(fontsize=8)
        fig.suptitle(title)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default=None, help="'synthetic' or a MuSiQue-format file (default: the shared one)")
    p.add_argument("--turns", type=int, default=5, choices=range(1, len(REPHRASINGS) + 1), metavar="1..6")
    p.add_argument("--window", type=int, default=2, help="passages per turn (one new per turn)")
    p.add_argument("--requests", type=int, default=12, help="requests of the reordering run")
    p.add_argument("--pool", type=int, default=8, help="passages they share")
    p.add_argument("--per-request", type=int, default=4, help="passages per request")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--method", default="fusionrag")
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--neighbors", type=int, default=3)
    p.add_argument("--out", default="bench_results")
    args = p.parse_args(argv)
    if args.per_request > args.pool:
        p.error(f"--per-request ({args.per_request}) cannot exceed --pool ({args.pool})")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    dataset = dataset_label(args.dataset)
    need = max(args.pool, args.turns + args.window - 1)
    examples = load_examples(dataset, args.requests, passages=need, seed=0)
    passages = [p.text for p in examples[0].passages]
    if len(passages) < need:
        raise SystemExit(f"{args.turns} turns of {args.window} passages and a pool of {args.pool} need {need} "
                         f"passages; the first question has {len(passages)}")  # fmt: skip
    requests = shared_chunk_requests(args, passages, [ex.question for ex in examples])
    result = {"turns": run_turns(args, passages, examples[0].question), "reorder": run_reorder(args, passages, requests)}
    config = {**vars(args), "dataset": dataset}
    machine = machine_info()
    paths = write_report(Path(args.out), "reuse", {"config": config, "machine": machine, **result},
                         reuse_markdown(result, config, machine),
                         lambda path: plot_turns(result["turns"], path, f"Per-turn TTFT, {args.model}"))  # fmt: skip
    print(paths[1].read_text() + "wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
