"""Offline-stage throughput: plain and fused chunks per minute, and a re-run that computes nothing.

    python bench/ingest.py [--model smollm2-135m] [--dataset FILE|synthetic] [--chunks 100] [--neighbors 10]
    python bench/ingest.py --workers 2 --store /tmp/kv ...   # entries computed by Ray worker processes

In this process: ``add_chunks(fuse=False)`` (tokenising, registering and the plain prefill), then
``add_chunks`` again with fusion (embedding, neighbour search and the fused prefill), then once more
(everything stored: it must compute nothing, so its time is the cost of checking). With ``--workers``
one call does both stages in the worker processes (the start-up of Ray and of the workers' models
included), writing into the ``--store`` folder they share. Writes ingest.json and ingest.md.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from fusionrag_llm import FusionRAG
from fusionrag_llm.eval.bench_data import SYNTHETIC, dataset_label, load_examples
from fusionrag_llm.eval.results import fmt, machine_info, markdown_table, write_json

TINY_ARGS = ["--model", "tiny", "--dataset", "synthetic", "--chunks", "3", "--neighbors", "1"]


def ingest_texts(dataset: str, chunks: int) -> list[str]:
    """``chunks`` distinct passage texts from ``dataset`` (synthetic: 10 per generated question)."""
    if dataset == SYNTHETIC:
        examples = load_examples(SYNTHETIC, limit=math.ceil(chunks / 10), passages=10, seed=0)
    else:
        examples = load_examples(dataset, limit=None, passages=None, seed=0)
    texts = list(dict.fromkeys(p.text for ex in examples for p in ex.passages))
    if len(texts) < chunks:
        raise SystemExit(f"{dataset} has only {len(texts)} distinct passages; lower --chunks")
    return texts[:chunks]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _stage(chunks: int, seconds: float) -> dict:
    return {"chunks": chunks, "seconds": seconds, "chunks_per_min": chunks / seconds * 60 if seconds > 0 else math.nan}


def run_ingest(rag: FusionRAG, texts: list[str], neighbors: int, workers: int | None) -> dict:
    tokens = sum(len(rag.tokenizer.encode(text)) for text in texts)
    stages = {}
    if workers is None:
        stages["plain"] = _stage(len(texts), _timed(lambda: rag.add_chunks(texts, fuse=False)))
        stages["fused"] = _stage(len(texts), _timed(lambda: rag.add_chunks(texts, neighbors=neighbors)))
    else:
        seconds = _timed(lambda: rag.add_chunks(texts, neighbors=neighbors, workers=workers))
        stages[f"plain and fused, {workers} Ray worker(s)"] = _stage(len(texts), seconds)
    stages["again (all stored)"] = _stage(len(texts), _timed(lambda: rag.add_chunks(texts, neighbors=neighbors)))
    return {"chunks": len(texts), "tokens_per_chunk": tokens / len(texts), "stages": stages}


def ingest_markdown(result: dict, config: dict, machine: dict) -> str:
    rows = [[name, s["chunks"], fmt(s["seconds"], 2), fmt(s["chunks_per_min"], 1)] for name, s in result["stages"].items()]
    return (f"# Ingest: {config['model']}, {result['chunks']} chunks ({result['tokens_per_chunk']:.0f} tokens each on "
            f"average), neighbors={config['neighbors']}\n\n{machine['platform']}, {machine['cpu_count']} CPUs, "
            f"torch {machine['torch']}.\n\n" + markdown_table(["stage", "chunks", "seconds", "chunks/min"], rows) + "\n")  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default=None, help="'synthetic' or a MuSiQue-format file (default: the shared one)")
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--neighbors", type=int, default=10)
    p.add_argument("--store", default=None, help="a store folder (the disk tier is then part of the measurement)")
    p.add_argument("--workers", type=int, default=None, help="Ray worker processes (needs --store)")
    p.add_argument("--out", default="bench_results")
    args = p.parse_args(argv)
    if args.workers is not None and args.store is None:
        p.error("--workers needs --store: the workers write into a folder they share")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    dataset = dataset_label(args.dataset)
    rag = FusionRAG.from_pretrained(args.model, store=args.store or ":memory:")
    result = run_ingest(rag, ingest_texts(dataset, args.chunks), args.neighbors, args.workers)
    config, machine = {**vars(args), "dataset": dataset}, machine_info(rag)
    out = Path(args.out)
    write_json(out / "ingest.json", {"config": config, "machine": machine, "result": result})
    (out / "ingest.md").write_text(ingest_markdown(result, config, machine))
    print((out / "ingest.md").read_text() + f"wrote {out / 'ingest.json'}, {out / 'ingest.md'}")


if __name__ == "__main__":
    main()
