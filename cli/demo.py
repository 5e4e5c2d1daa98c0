"""``fusionrag demo``: ingest the bundled corpus, then answer its questions with every method side by
side (time to first token, speed-up over full attention, tokens computed, answer), and with
llama.cpp on the model's GGUF file when llama-cpp-python is installed.

Each question's prompt holds ``--distractors`` invented passages (seeded, about 100 words each) that
stand for the rest of a long retrieval, then the question's own passages, nearest the question (the
order a long-context reordering of retrieved chunks gives): 20 of them make prompts of about 3.3k
tokens with SmolLM2's tokenizer.
"""

from __future__ import annotations

import logging
import os
import statistics

import click

from fusionrag_llm.cli.options import (baselines_option, device_option, dtype_option, engine_option, load_rag,
                                       max_new_tokens_option, model_option, progress_on, repeats_option)  # fmt: skip
from fusionrag_llm.data import demo_corpus

METHODS = ("full_attention", "full_reuse", "cacheblend", "fusionrag_paper", "fusionrag")


def distractor_passages(count: int) -> list[str]:
    """``count`` invented passages about people and places the demo's questions never mention."""
    from fusionrag_llm.eval.synthetic import make_synthetic

    if count == 0:
        return []
    examples = make_synthetic(num_questions=-(-count // 10), passages_per_question=10, seed=0, words_per_passage=100)
    return [p.text for ex in examples for p in ex.passages][:count]


@click.command()
@model_option
@device_option
@dtype_option
@click.option("--ratio", default=0.15, show_default=True, type=click.FloatRange(0, 1), help="Recompute ratio of fusionrag and cacheblend.")
@max_new_tokens_option(24)
@click.option("--distractors", default=20, show_default=True, type=click.IntRange(0, 60),
              help="Invented passages (about 100 words each) retrieved with each question's own; 20 make prompts of about 3.3k tokens.")  # fmt: skip
@baselines_option("llama_cpp", ("llama_cpp",),
                  "Also answer with llama_cpp (llama.cpp on the model's GGUF file, when llama-cpp-python is installed), or none.")  # fmt: skip
@repeats_option(3)
@click.option("--store", default=":memory:", show_default=True, help="KV store folder (the demo keeps it in memory).")
@engine_option(("kv_codec",), {"kv_codec": "model"},
               "kv_codec=C: how the store keeps chunk KV; default model (the compute dtype), as the demo's recorded results.")  # fmt: skip
@click.pass_context
def demo(ctx: click.Context, model: str, device: str | None, dtype: str | None, ratio: float, max_new_tokens: int,
         distractors: int, baselines: tuple[str, ...], repeats: int, store: str, engine_options: dict) -> None:  # fmt: skip
    """Every method, and llama.cpp when installed, on a small bundled corpus: TTFT (the median of
    --repeats runs), speed-up, answers. The engine's logs only as `fusionrag -v demo`."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # before this process adds its own
    verbose = bool(ctx.find_root().params.get("verbose"))
    logging.getLogger("fusionrag_llm").setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its weight-loading bar
    corpus, extra = demo_corpus(), distractor_passages(distractors)
    rag = load_rag(model, device, dtype, store, **{"reproducible": True, **engine_options})
    click.echo(f"model: {rag.model_name} ({rag.engine.model.device}, {rag.engine.model.dtype})")
    passages = corpus["passages"] + extra
    click.echo(f"ingesting {len(passages)} passages: a plain and a fused KV entry each ...")
    report = rag.add_chunks(passages, neighbors=3, progress=verbose or progress_on())
    click.echo(f"ingested {len(corpus['passages']) + len(extra)} passages: {report.plain_computed} plain and "
               f"{report.fused_computed} fused entries computed")  # fmt: skip
    llama = _llama_cpp(rag, "llama_cpp" in baselines, corpus, extra, max_new_tokens)
    rag.generate(corpus["passages"][0], method="full_attention", max_new_tokens=1)  # warm-up, not shown
    rows = []
    click.echo(f"TTFT: the median of {repeats} run{'s' if repeats > 1 else ''} of each method")
    for item in corpus["questions"]:
        question_rows = _answer(rag, _request(corpus, item, extra), ratio, max_new_tokens, llama, repeats)
        click.echo(f"\nQ: {item['question']}  (expected: {item['answer']}; {question_rows[0]['prompt']} prompt tokens)")
        click.echo(_table(question_rows))
        rows.extend(question_rows)
    if llama is not None:
        llama.close()
    click.echo("\n" + _summary(rows))
    note = _busy_note(rows, load)
    if note:
        click.echo(note)


def _llama_cpp(rag, wanted: bool, corpus: dict, extra: list[str], max_new_tokens: int):
    if not wanted:
        return None
    from fusionrag_llm.eval.baselines import LlamaCpp, find_llama_cpp

    gguf, note = find_llama_cpp(rag.model_name)
    click.echo(note)
    if gguf is None:
        return None
    longest = max(sum(len(s.token_ids) for s in rag.segments(_request(corpus, item, extra)))
                  for item in corpus["questions"])  # fmt: skip
    return LlamaCpp(gguf, n_ctx=longest + max_new_tokens + 8)


def _request(corpus: dict, item: dict, extra: list[str]):
    from fusionrag_llm import RAGRequest

    return RAGRequest(chunks=extra + [corpus["passages"][i] for i in item["passages"]], question=item["question"])


def _answer(rag, request, ratio: float, max_new_tokens: int, llama, repeats: int) -> list[dict]:
    rows = []
    for method in METHODS:
        runs = [rag.generate(request, method=method, recompute_ratio=ratio, max_new_tokens=max_new_tokens)
                for _ in range(repeats)]  # fmt: skip
        out, s = runs[0], runs[0].stats
        label = method if method in ("full_attention", "full_reuse") else f"{method} r={ratio:g}"
        rows.append({"method": label, **_timed([run.stats.ttft_s for run in runs]), "computed": s.computed_tokens,
                     "prompt": s.prompt_tokens, "answer": out.text.strip(), "ids": out.token_ids,
                     "prompt_ids": out.prompt_ids, "stable": all(run.token_ids == out.token_ids for run in runs)})  # fmt: skip
    if llama is not None:
        runs = [llama.generate(rows[0]["prompt_ids"], max_new_tokens, rag.tokenizer.stop_ids) for _ in range(repeats)]
        rows.append({"method": "llama.cpp", **_timed([run["ttft_s"] for run in runs]), "computed": rows[0]["prompt"],
                     "prompt": rows[0]["prompt"], "answer": rag.tokenizer.decode(runs[0]["token_ids"]).strip(),
                     "ids": runs[0]["token_ids"], "stable": True})  # fmt: skip
    reference = rows[0]
    for row in rows:
        row["vs_fa"] = reference["ttft_s"] / row["ttft_s"]
        row["same_as_fa"] = row["ids"] == reference["ids"]
    return rows


def _timed(seconds: list[float]) -> dict:
    """The median of a method's timed runs, and how far apart they were (0: one run)."""
    median = statistics.median(seconds)
    return {"ttft_s": median, "spread": (max(seconds) - min(seconds)) / median if median > 0 else 0.0}


def _busy_note(rows: list[dict], load: float) -> str:
    """A warning when the timings are noise: runs of one method far apart, or a machine already busy
    before the demo started; and when a method's repeated runs did not give the same answer."""
    notes = []
    cores = os.cpu_count() or 1
    spread = max(row["spread"] for row in rows)
    if spread > 0.25 or load > 0.5 * cores:
        notes.append(f"note: the machine looks busy (load average {load:.1f} on {cores} cores before the demo; "
                     f"runs of one method up to {spread:.0%} apart): the TTFTs and speed-ups are noisy, run it "
                     "again on an idle machine or with more --repeats")  # fmt: skip
    unstable = sorted({row["method"] for row in rows if not row["stable"]})
    if unstable:
        notes.append(f"note: repeated runs gave other answers for {', '.join(unstable)} (the first run's is shown)")
    return "\n".join(notes)


def _table(rows: list[dict]) -> str:
    lines = [f"  {'method':<22} {'TTFT ms':>9} {'vs FA':>7} {'computed':>9}  answer"]
    for r in rows:
        same = "" if r is rows[0] else ("  (= FA)" if r["same_as_fa"] else "")
        lines.append(f"  {r['method']:<22} {r['ttft_s'] * 1000:9.0f} {r['vs_fa']:6.1f}x {r['computed']:9d}  "
                     f"{r['answer'][:100]}{same}")  # fmt: skip
    return "\n".join(lines)


def _summary(rows: list[dict]) -> str:
    lines = ["Summary: median TTFT speed-up over full attention; answers the same as full attention's"]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        same = sum(r["same_as_fa"] for r in mine)
        lines.append(f"  {method:<22} {statistics.median(r['vs_fa'] for r in mine):6.1f}x   {same}/{len(mine)} answers")
    return "\n".join(lines)
