"""The TTFT benchmark: time to first token per method and ratio at several prompt lengths.

Prompts are one question over as many passages as bring the prompt closest to each target length
(in the model's tokens). All chunks are ingested first (the offline stage is not timed here). Each
(length, method, ratio) runs once untimed, then ``repeats`` times; the table shows medians of the
TTFT and its parts (load, select, prefill), the speedup over Full Attention of the same engine in
the same run (``FA TTFT / TTFT``) and over the baselines on the same prompt ids: plain
``transformers`` generation of the same model (``HF TTFT / TTFT``) and llama.cpp on the model's GGUF
file with the same threads (``llama.cpp TTFT / TTFT``; skipped with a note when llama-cpp-python is
not installed). With ``new_tokens`` > 1 every run also decodes that many tokens (end tokens ignored,
so every method and baseline decodes the same count) and a second table compares the end-to-end
time, TTFT + ``new_tokens`` tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from fusionrag_llm.eval.baselines import LLAMA_CPP, LlamaCpp, hf_generate_timed
from fusionrag_llm.eval.bench_data import SYNTHETIC, add_chunks, jobs, load_examples, prompt_sizes
from fusionrag_llm.eval.results import (check_ints, figure, finite_number, machine_line, markdown_table, median, ms,
                                        reference_colour, run_label, write_report)
from fusionrag_llm.request import RAGRequest

TIMING_FIELDS = ("ttft_s", "load_s", "select_s", "prefill_s")
BASELINES = ("transformers", "llama_cpp")


@dataclass(frozen=True)
class TTFTConfig:
    dataset: str  # "synthetic" or a resolved file path
    model: str
    lengths: tuple[int, ...]
    methods: tuple[str, ...]
    ratios: tuple[float, ...]
    repeats: int = 3
    neighbors: int = 10
    seed: int = 0  # synthetic data only
    device: str | None = None
    dtype: str | None = None
    baselines: tuple[str, ...] = ("transformers",)
    new_tokens: int = 1  # decoded per run (TTFT is the first); > 1 adds the end-to-end table

    def __post_init__(self) -> None:
        check_ints(self, ("repeats", "new_tokens"))
        if any(b not in BASELINES for b in self.baselines):
            raise ValueError(f"baselines must be some of {', '.join(BASELINES)}, got {list(self.baselines)}")
        if not self.lengths or not self.methods or not self.ratios:
            raise ValueError("at least one length, one method and one ratio are needed")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["methods"] = list(self.methods)
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
    sizes = prompt_sizes(rag, question, passages, max(lengths))
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


def _timed(rag, prompt: LengthPrompt, method: str, ratio, config: TTFTConfig) -> dict:
    def once():
        start = time.perf_counter()
        out = rag.generate(prompt.request, method=method, recompute_ratio=ratio,
                           max_new_tokens=config.new_tokens, sampling={"ignore_eos": True})  # fmt: skip
        return out.stats, time.perf_counter() - start

    once()  # warm-up
    stats, walls = zip(*(once() for _ in range(config.repeats)))
    row = {name: median([getattr(s, name) for s in stats]) for name in TIMING_FIELDS}
    row.update(e2e_s=median(list(walls)), recomputed_tokens=stats[0].recomputed_tokens,
               computed_tokens=stats[0].computed_tokens, ttft_repeats_s=[s.ttft_s for s in stats])  # fmt: skip
    return row


def _baseline_row(run, repeats: int, engine_first: int | None) -> dict:
    """Median TTFT and end-to-end time of ``run()`` over ``repeats`` runs after a warm-up."""
    run()  # warm-up
    runs = [run() for _ in range(repeats)]
    first = runs[0]["token_ids"][0] if "token_ids" in runs[0] else runs[0]["first_token"]
    return {"ttft_s": median([r["ttft_s"] for r in runs]), "e2e_s": median([r["e2e_s"] for r in runs]),
            "ttft_repeats_s": [r["ttft_s"] for r in runs], "first_token_matches_engine": first == engine_first}  # fmt: skip


def run_ttft(rag, prompts: list[LengthPrompt], config: TTFTConfig, hf_model=None, gguf: Path | None = None,
             progress: bool = True) -> list[dict]:  # fmt: skip
    """One row per (length, method, ratio), plus a ``transformers`` row per length when ``hf_model``
    and a ``llama.cpp`` row per length when ``gguf`` (the model's GGUF file)."""
    rows = []
    llama = LlamaCpp(gguf, n_ctx=max(p.prompt_tokens for p in prompts) + config.new_tokens + 8) if gguf else None
    try:
        for prompt in tqdm(prompts, desc="lengths", unit="prompt", disable=not progress):
            rows.extend(_length_rows(rag, prompt, config, hf_model, llama))
    finally:
        if llama is not None:
            llama.close()
    return rows


def _length_rows(rag, prompt: LengthPrompt, config: TTFTConfig, hf_model, llama: LlamaCpp | None) -> list[dict]:
    fa_out = rag.generate(prompt.request, method="full_attention", recompute_ratio=1.0, max_new_tokens=1)
    engine_first = fa_out.token_ids[0] if fa_out.token_ids else None
    ids = list(fa_out.prompt_ids)
    base = {"length": prompt.target, "prompt_tokens": prompt.prompt_tokens, "chunks": len(prompt.request.chunks)}
    mine = []
    for method, ratio in jobs(config.methods, config.ratios):
        mine.append({**base, "label": run_label(method, ratio), "method": method, "ratio": ratio,
                     **_timed(rag, prompt, method, ratio, config)})  # fmt: skip
    if hf_model is not None:
        row = _baseline_row(lambda: hf_generate_timed(hf_model, ids, config.new_tokens), config.repeats, engine_first)
        mine.append({**base, "label": "transformers", "method": "transformers", "ratio": None, **row})
    if llama is not None:
        row = _baseline_row(lambda: llama.generate(ids, config.new_tokens), config.repeats, engine_first)
        mine.append({**base, "label": LLAMA_CPP, "method": "llama_cpp", "ratio": None, **row})
    _add_speedups(mine)
    return mine


def _add_speedups(rows: list[dict]) -> None:
    def of(method: str, key: str) -> float:
        return next((r[key] for r in rows if r["method"] == method), math.nan)

    fa, hf, lc, lc_e2e = of("full_attention", "ttft_s"), of("transformers", "ttft_s"), of("llama_cpp", "ttft_s"), of("llama_cpp", "e2e_s")
    for row in rows:
        row["speedup_vs_fa"] = fa / row["ttft_s"]
        row["speedup_vs_hf"] = hf / row["ttft_s"]
        row["speedup_vs_llama_cpp"] = lc / row["ttft_s"]
        row["e2e_speedup_vs_llama_cpp"] = lc_e2e / row["e2e_s"]


def ingest_prompts(rag, prompts: list[LengthPrompt], neighbors: int, progress: bool = True,
                   methods: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """The offline stage for every chunk of every prompt (not part of any TTFT), with the notes on
    fused entries that ``methods`` read."""
    return add_chunks(rag, [chunk for p in prompts for chunk in p.request.chunks], neighbors, methods, progress)


def _times(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def ttft_markdown(rows: list[dict], config: dict, machine: dict, note: str = "") -> str:
    headers = ["length", "tokens", "method", "TTFT ms", "load ms", "select ms", "prefill ms", "recomputed",
               "vs FA", "vs HF", "vs llama.cpp"]  # fmt: skip
    table = [[r["length"], r["prompt_tokens"], r["label"], ms(r["ttft_s"]), ms(r.get("load_s")), ms(r.get("select_s")),
              ms(r.get("prefill_s")), r.get("recomputed_tokens", "-"), _times(r["speedup_vs_fa"]),
              _times(r["speedup_vs_hf"]), _times(r.get("speedup_vs_llama_cpp", math.nan))]
             for r in rows]  # fmt: skip
    head = (f"# TTFT: {config['model']}\n\n"
            f"median of {config['repeats']} after one warm-up; {machine_line(machine)}. "
            "'vs FA' = Full Attention TTFT / TTFT (same engine, same run); "
            "'vs HF' = transformers generate TTFT / TTFT; 'vs llama.cpp' = llama.cpp TTFT / TTFT (same prompt ids).\n\n")  # fmt: skip
    text = head + (f"{note}\n\n" if note else "") + markdown_table(headers, table) + "\n"
    new = config.get("new_tokens", 1)
    if new > 1:
        e2e_rows = [[r["length"], r["prompt_tokens"], r["label"], ms(r["ttft_s"]), ms(r["e2e_s"]),
                     _times(r.get("speedup_vs_llama_cpp", math.nan)), _times(r.get("e2e_speedup_vs_llama_cpp", math.nan))]
                    for r in rows]  # fmt: skip
        text += (f"\n## End to end: TTFT + {new} tokens\n\nEvery run decodes exactly {new} tokens (end tokens ignored); "
                 "'vs llama.cpp' = llama.cpp time / time, same prompt ids and threads.\n\n"
                 + markdown_table(["length", "tokens", "method", "TTFT ms", f"TTFT + {new} tok ms", "TTFT vs llama.cpp",
                                   "end to end vs llama.cpp"], e2e_rows) + "\n")  # fmt: skip
    return text


def write_ttft(out_dir: Path, config: dict, machine: dict, offline: dict, rows: list[dict], note: str = "") -> list[Path]:
    """ttft.json, ttft.md and ttft.png in ``out_dir``."""
    data = {"config": config, "machine": machine, "offline": offline, "baseline_note": note, "rows": rows}
    return write_report(out_dir, "ttft", data, ttft_markdown(rows, config, machine, note),
                        lambda path: plot_ttft(rows, path, f"TTFT, {config['model']}"))


def plot_ttft(rows: list[dict], path: Path, title: str) -> Path:
    """Median TTFT against the prompt length, one line per method/ratio (log y)."""
    with figure(path, figsize=(6.4, 4.2)) as (fig, ax):
        for label in dict.fromkeys(r["label"] for r in rows):
            mine = sorted((r for r in rows if r["label"] == label and finite_number(r["ttft_s"])),
                          key=lambda r: r["prompt_tokens"])  # fmt: skip
            ax.plot([r["prompt_tokens"] for r in mine], [r["ttft_s"] * 1000 for r in mine], marker="o", label=label,
                    color=reference_colour(label))  # fmt: skip
        ax.set(xlabel="prompt tokens", ylabel="median TTFT (ms)", yscale="log", title=title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return Path(path)
