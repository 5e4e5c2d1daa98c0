"""The ingest benchmark: offline-stage throughput (plain and fused entries) and store size.

Embeddings are computed first and timed on their own, then passed to ``rag.ingest``, so the plain
stage measures tokenising, registering and the plain prefill, and the fused stage the neighbour
search plus the fused prefill. A third call checks that ingesting again computes nothing.

With ``workers`` (Ray worker processes) both stages run in one call, so the workers load the model
once; its per-stage seconds come from the call's own clock (``IngestReport.seconds``), and the
start-up (registering the chunks, starting the workers and loading their models) is its own row.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fusionrag_llm.eval.bench_data import SYNTHETIC, load_examples
from fusionrag_llm.eval.results import fmt, markdown_table, write_json


@dataclass(frozen=True)
class IngestConfig:
    dataset: str  # "synthetic" or a resolved file path
    model: str
    chunks: int = 100
    neighbors: int = 10
    seed: int = 0
    store: str | None = None  # a folder: the disk tier is part of the measurement
    device: str | None = None
    dtype: str | None = None
    workers: int | None = None  # Ray worker processes; None: ingest in the benchmark's process

    def __post_init__(self) -> None:
        for name, value, minimum in (("chunks", self.chunks, 1), ("neighbors", self.neighbors, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):  # fmt: skip
            raise ValueError(f"workers must be None or an int >= 1, got {self.workers!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def ingest_texts(dataset: str, chunks: int, seed: int) -> list[str]:
    """``chunks`` distinct passage texts from ``dataset`` (synthetic: 10 per generated question)."""
    if dataset == SYNTHETIC:
        examples = load_examples(SYNTHETIC, limit=math.ceil(chunks / 10), passages=10, seed=seed)
    else:
        examples = load_examples(dataset, limit=None, passages=None, seed=seed)
    texts = list(dict.fromkeys(p.text for ex in examples for p in ex.passages))
    if len(texts) < chunks:
        raise ValueError(f"{dataset} has only {len(texts)} distinct passages; lower --chunks")
    return texts[:chunks]


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def run_ingest(rag, texts: list[str], neighbors: int, progress: bool = True, workers: int | None = None) -> dict:
    """Time embedding, plain and fused stages, and an idempotent re-run; measure entry sizes."""
    from fusionrag_llm.ingest.embeddings import default_embedder

    embed = rag.embedder or default_embedder()
    embed(texts[:1])  # loads the embedding model, which is not part of the throughput
    vectors, embed_s = _timed(lambda: embed(texts))
    stages = _worker_stages if workers is not None else _stages
    plain, plain_s, fused, fused_s, extra = stages(rag, texts, vectors, neighbors, progress, workers)
    again, again_s = _timed(lambda: rag.ingest(texts, neighbors=neighbors, embeddings=vectors, workers=workers))
    sizes = entry_sizes(rag, texts)
    tokens = sum(len(rag.parts.catalog.get(t).token_ids) for t in texts)
    return {
        **extra,
        "chunks": len(texts),
        "tokens": tokens,
        "tokens_per_chunk": tokens / len(texts),
        "embed_s": embed_s,
        "plain": _stage(plain.plain_computed, plain_s, sizes["plain"]),
        "fused": _stage(fused.fused_computed, fused_s, sizes["fused"]),
        "again": {"plain_computed": again.plain_computed, "fused_computed": again.fused_computed, "seconds": again_s},
        "bytes_per_token": {v: sizes[v]["bytes"] / tokens if tokens else math.nan for v in ("plain", "fused")},
        "store": {name: {"entries": t.entries, "bytes": t.bytes} for name, t in rag.store.stats().tiers.items()},
    }


def _stages(rag, texts: list[str], vectors, neighbors: int, progress: bool, workers: None) -> tuple:
    """In this process: a plain call, then a fused one."""
    plain, plain_s = _timed(lambda: rag.ingest(texts, fuse=False, embeddings=vectors, progress=progress))
    fused, fused_s = _timed(lambda: rag.ingest(texts, neighbors=neighbors, embeddings=vectors, progress=progress))
    return plain, plain_s, fused, fused_s, {"total_s": plain_s + fused_s, "chunks_per_s": len(texts) / (plain_s + fused_s)}


def _worker_stages(rag, texts: list[str], vectors, neighbors: int, progress: bool, workers: int) -> tuple:
    """One call to ``workers`` Ray workers; its own clock splits it into start-up, plain and fused."""
    report, total_s = _timed(lambda: rag.ingest(texts, neighbors=neighbors, embeddings=vectors, progress=progress,
                                                workers=workers))  # fmt: skip
    seconds = report.seconds
    startup_s = seconds["cluster"] + seconds["register"] + seconds["workers_ready"]
    extra = {"workers": workers, "startup_s": startup_s, "stop_s": total_s - startup_s - seconds["plain"] - seconds["fused"],
             "total_s": total_s,
             "chunks_per_s": len(texts) / total_s}  # fmt: skip
    return report, seconds["plain"], report, seconds["fused"], extra


def _stage(computed: int, seconds: float, size: dict) -> dict:
    return {"computed": computed, "seconds": seconds, "chunks_per_s": computed / seconds if seconds > 0 else math.nan,
            "chunks_per_min": computed / seconds * 60 if seconds > 0 else math.nan, **size}  # fmt: skip


def entry_sizes(rag, texts: list[str]) -> dict[str, dict]:
    """Sum of entry ``nbytes`` per variant, and how many entries were not found (evicted)."""
    sizes = {}
    for variant in ("plain", "fused"):
        found = [rag.parts.entries.lookup(rag.parts.catalog.get(t).token_ids, variant) for t in texts]
        sizes[variant] = {"bytes": sum(f[0].nbytes for f in found if f is not None),
                          "missing": sum(f is None for f in found)}  # fmt: skip
    return sizes


def ingest_markdown(result: dict, config: dict, machine: dict) -> str:
    headers = ["stage", "chunks computed", "seconds", "chunks/s", "chunks/min", "entry MiB", "missing", "bytes/token"]
    table = [[stage, result[stage]["computed"], fmt(result[stage]["seconds"], 2), fmt(result[stage]["chunks_per_s"], 3),
              fmt(result[stage]["chunks_per_min"], 1), fmt(result[stage]["bytes"] / 2**20, 1), result[stage]["missing"],
              fmt(result["bytes_per_token"][stage], 0)] for stage in ("plain", "fused")]  # fmt: skip
    if "workers" in result:
        table.insert(0, ["start-up (Ray, registering, workers loading the model)", "", fmt(result["startup_s"], 2), "", "", "", "", ""])
        table.append(["stopping the workers (and the Ray it started)", "", fmt(result["stop_s"], 2), "", "", "", "", ""])
    where = f"{result['workers']} Ray worker(s)" if "workers" in result else "this process"
    table.append([f"all, {where}, end to end", result["chunks"], fmt(result["total_s"], 2), fmt(result["chunks_per_s"], 3),
                  fmt(result["chunks_per_s"] * 60, 1), "", "", ""])  # fmt: skip
    again = result["again"]
    head = (f"# Ingest: {config['model']}, {result['chunks']} chunks ({result['tokens_per_chunk']:.0f} tokens each on average), "
            f"neighbors={config['neighbors']}\n\n{machine['platform']}, {machine['cpu_count']} CPUs, torch {machine['torch']}, "
            f"{machine.get('device')} {machine.get('dtype')}. Embedding: {result['embed_s']:.2f} s "
            f"({len(result['store'])} store tier(s): "
            + ", ".join(f"{n} {s['entries']} entries / {s['bytes'] / 2**20:.1f} MiB" for n, s in result["store"].items())
            + f"). Ingesting again computed {again['plain_computed'] + again['fused_computed']} entries "
            f"in {again['seconds']:.3f} s.\n\n")  # fmt: skip
    return head + markdown_table(headers, table) + "\n"


def write_ingest(out_dir: Path, config: dict, machine: dict, result: dict) -> list[Path]:
    out_dir = Path(out_dir)
    paths = [write_json(out_dir / "ingest.json", {"config": config, "machine": machine, "result": result})]
    (out_dir / "ingest.md").write_text(ingest_markdown(result, config, machine))
    return paths + [out_dir / "ingest.md"]
