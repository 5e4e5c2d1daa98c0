"""The TTFT benchmark: time to first token per method and ratio at several prompt lengths.

Prompts are one question over as many passages as bring the prompt closest to each target length
(in the model's tokens). All chunks are ingested first (the offline stage is not timed here). Each
(length, method, ratio) runs once untimed, then ``repeats`` times; the table shows medians of the
TTFT and its parts (load, select, prefill), the speedup over Full Attention of the same engine in
the same run (``FA TTFT / TTFT``) and over plain ``transformers`` generation of the same model on
the same prompt ids (``HF TTFT / TTFT``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from fusionrag_llm.eval.bench_data import SYNTHETIC, load_examples
from fusionrag_llm.eval.bench_methods import BenchMethod, jobs
from fusionrag_llm.eval.hf_baseline import hf_first_token
from fusionrag_llm.eval.plots import plot_ttft
from fusionrag_llm.eval.results import fmt, markdown_table, median, ms, write_json
from fusionrag_llm.request import RAGRequest

TIMING_FIELDS = ("ttft_s", "load_s", "select_s", "prefill_s")


@dataclass(frozen=True)
class TTFTConfig:
    dataset: str  # "synthetic" or a resolved file path
    model: str
    lengths: tuple[int, ...]
    methods: tuple[BenchMethod, ...]
    ratios: tuple[float, ...]
    repeats: int = 3
    neighbors: int = 10
    seed: int = 0
    device: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {self.repeats!r}")
        if not self.lengths or not self.methods or not self.ratios:
            raise ValueError("at least one length, one method and one ratio are needed")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["methods"] = [m.label for m in self.methods]
        return data


@dataclass(frozen=True)
class LengthPrompt:
    target: int  # the asked-for length
    request: RAGRequest
    prompt_tokens: int  # the length it got


def source_passages(dataset: str, max_tokens: int, seed: int) -> tuple[str, list[str]]:
    """A question and a long list of passages (its own first) to build prompts from."""
    if dataset == SYNTHETIC:
        # ~60 words per passage is >= 60 tokens in any tokenizer; 10 passages per question.
        examples = load_examples(SYNTHETIC, limit=max(1, math.ceil(max_tokens / 600)) + 1, passages=10, seed=seed)
    else:
        examples = load_examples(dataset, limit=None, passages=None, seed=seed)
    passages = list(dict.fromkeys(p.text for ex in examples for p in ex.passages))
    return examples[0].question, passages


def build_prompts(rag, question: str, passages: list[str], lengths: tuple[int, ...]) -> list[LengthPrompt]:
    """For each target, the prefix of ``passages`` whose prompt length is closest to it."""
    window = rag.context_window
    too_long = [n for n in lengths if n >= window]
    if too_long:
        raise ValueError(f"--lengths {too_long} do not fit the context window of {window} tokens of {rag.model_name!r}")
    sizes, count = [], 0
    while count < len(passages) and (not sizes or sizes[-1] < max(lengths)):
        count += 1
        request = RAGRequest(chunks=passages[:count], question=question)
        sizes.append(sum(len(s.token_ids) for s in rag.segments(request)))
    if sizes[-1] < max(lengths) * 0.9:
        raise ValueError(f"the dataset has only enough passages for {sizes[-1]} prompt tokens; lower --lengths")
    fitting = [i for i, n in enumerate(sizes) if n < window]
    if not fitting:
        raise ValueError(f"one passage already makes a prompt of {sizes[0]} tokens, beyond the {window}-token window")
    prompts = []
    for target in lengths:
        best = min(fitting, key=lambda i: abs(sizes[i] - target))
        request = RAGRequest(chunks=passages[: best + 1], question=question)
        prompts.append(LengthPrompt(target, request, sizes[best]))
    return prompts


def _timed(rag, prompt: LengthPrompt, method: BenchMethod, ratio, config: TTFTConfig) -> dict:
    def once():
        return rag.generate(prompt.request, method.method, method.engine_ratio(ratio), max_new_tokens=1,
                            seed=config.seed, **method.overrides())  # fmt: skip

    once()  # warm-up
    stats = [once().stats for _ in range(config.repeats)]
    row = {name: median([getattr(s, name) for s in stats]) for name in TIMING_FIELDS}
    row.update(recomputed_tokens=stats[0].recomputed_tokens, computed_tokens=stats[0].computed_tokens,
               ttft_repeats_s=[s.ttft_s for s in stats])  # fmt: skip
    return row


def _hf_row(hf_model, prompt_ids: list[int], repeats: int) -> dict:
    hf_first_token(hf_model, prompt_ids)  # warm-up
    times, token = zip(*(hf_first_token(hf_model, prompt_ids) for _ in range(repeats)))
    return {"ttft_s": median(list(times)), "ttft_repeats_s": list(times), "first_token": token[0]}


def run_ttft(rag, prompts: list[LengthPrompt], config: TTFTConfig, hf_model=None, progress: bool = True) -> list[dict]:
    """One row per (length, method, ratio), plus a ``transformers`` row per length when ``hf_model``."""
    rows = []
    for prompt in tqdm(prompts, desc="lengths", unit="prompt", disable=not progress):
        fa_out = rag.generate(prompt.request, "full_attention", max_new_tokens=1)
        base = {"length": prompt.target, "prompt_tokens": prompt.prompt_tokens, "chunks": len(prompt.request.chunks)}
        mine = []
        for method, ratio in jobs(config.methods, config.ratios):
            label = method.label if ratio is None else f"{method.label} r={ratio:g}"
            mine.append({**base, "label": label, "method": method.label, "ratio": ratio,
                         **_timed(rag, prompt, method, ratio, config)})  # fmt: skip
        if hf_model is not None:
            hf = _hf_row(hf_model, list(fa_out.prompt_ids), config.repeats)
            hf_agrees = hf.pop("first_token") == (fa_out.token_ids[0] if fa_out.token_ids else None)
            mine.append({**base, "label": "transformers", "method": "transformers", "ratio": None,
                         "first_token_matches_engine": hf_agrees, **hf})  # fmt: skip
        _add_speedups(mine)
        rows.extend(mine)
    return rows


def _add_speedups(rows: list[dict]) -> None:
    fa = next(r["ttft_s"] for r in rows if r["method"] == "full_attention")
    hf = next((r["ttft_s"] for r in rows if r["method"] == "transformers"), math.nan)
    for row in rows:
        row["speedup_vs_fa"] = fa / row["ttft_s"]
        row["speedup_vs_hf"] = hf / row["ttft_s"]


def ingest_prompts(rag, prompts: list[LengthPrompt], neighbors: int, progress: bool = True) -> dict:
    """The offline stage for every chunk of every prompt (not part of any TTFT)."""
    start = time.perf_counter()
    pool = list(dict.fromkeys(chunk for p in prompts for chunk in p.request.chunks))
    report = rag.ingest(pool, neighbors=neighbors, progress=progress)
    return {"chunks": len(pool), "plain_computed": report.plain_computed,
            "fused_computed": report.fused_computed, "seconds": time.perf_counter() - start}  # fmt: skip


def ttft_markdown(rows: list[dict], config: dict, machine: dict) -> str:
    headers = ["length", "tokens", "method", "TTFT ms", "load ms", "select ms", "prefill ms", "recomputed",
               "vs FA", "vs HF"]  # fmt: skip
    table = [[r["length"], r["prompt_tokens"], r["label"], ms(r["ttft_s"]), ms(r.get("load_s")), ms(r.get("select_s")),
              ms(r.get("prefill_s")), r.get("recomputed_tokens", "-"), f"{r['speedup_vs_fa']:.2f}x",
              fmt(r["speedup_vs_hf"], 2) + ("x" if math.isfinite(r["speedup_vs_hf"]) else "")]
             for r in rows]  # fmt: skip
    head = (f"# TTFT: {config['model']}\n\n"
            f"median of {config['repeats']} after one warm-up; {machine['platform']}, {machine['cpu_count']} CPUs, "
            f"torch {machine['torch']} ({machine['torch_threads']} threads), {machine.get('device')} {machine.get('dtype')}. "
            "'vs FA' = Full Attention TTFT / TTFT (same engine, same run); "
            "'vs HF' = transformers generate(max_new_tokens=1) TTFT / TTFT.\n\n")  # fmt: skip
    return head + markdown_table(headers, table) + "\n"


def write_ttft(out_dir: Path, config: dict, machine: dict, offline: dict, rows: list[dict]) -> list[Path]:
    """ttft.json, ttft.md and ttft.png in ``out_dir``."""
    out_dir = Path(out_dir)
    paths = [write_json(out_dir / "ttft.json", {"config": config, "machine": machine, "offline": offline, "rows": rows})]
    (out_dir / "ttft.md").write_text(ttft_markdown(rows, config, machine))
    paths.append(out_dir / "ttft.md")
    paths.append(plot_ttft(rows, out_dir / "ttft.png", f"TTFT, {config['model']}"))
    return paths
