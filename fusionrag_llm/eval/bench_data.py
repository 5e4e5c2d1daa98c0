"""Benchmark inputs: the questions (``synthetic`` or a MuSiQue-format file), the methods and ratios to
run, the prompts, the offline stage, and the engine as the benchmarks open it.

A passage becomes a chunk through its text alone (MuSiQue titles are empty in the shared file;
synthetic titles are only the passage's subject). A benchmark line is a method the engine registers
(``fusionrag_llm.method_names()``, and any registered from ``bench/methods/``) at a recompute ratio;
a method that selects nothing (Full Attention recomputes everything, Full Reuse and APE nothing)
does not depend on the ratio, so it runs once per question, with ratio ``None``.

Example:
    >>> examples = load_examples("synthetic", limit=2, passages=3, seed=0)
    >>> len(examples), len(chunk_texts(examples[0]))
    (2, 3)
    >>> parse_methods("cacheblend,fusionrag")
    ('full_attention', 'full_reuse', 'cacheblend', 'fusionrag')
    >>> parse_ratios("0.15,0,1")
    (0.0, 0.15, 1.0)
    >>> jobs(("full_attention", "fusionrag"), (0.0, 0.15))
    [('full_attention', None), ('fusionrag', 0.0), ('fusionrag', 0.15)]
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from pathlib import Path

from fusionrag_llm.eval.datasets import QAExample, default_musique_path, load_musique
from fusionrag_llm.eval.synthetic import make_synthetic
from fusionrag_llm.request import RAGRequest

SYNTHETIC = "synthetic"
DEFAULT_SYNTHETIC_QUESTIONS = 20
BASELINES = ("full_attention", "full_reuse")


def dataset_label(dataset: str | None) -> str:
    """``"synthetic"`` or the resolved path of the MuSiQue-format file (``None``: the default file)."""
    if dataset == SYNTHETIC:
        return SYNTHETIC
    if dataset is None:
        path = default_musique_path()
        if path is None:
            raise ValueError(
                "no dataset given and the default ../shared/data/musique_dev.json was not found; "
                "pass --dataset PATH (a MuSiQue-format JSON file) or --dataset synthetic"
            )
        return str(path)
    return str(Path(dataset).expanduser().resolve())


def load_examples(dataset: str, limit: int | None, passages: int, seed: int,
                  words_per_passage: int = 60, skip: int = 0) -> list[QAExample]:  # fmt: skip
    """``limit`` questions after the first ``skip``, ``passages`` passages each.

    Synthetic: ``limit`` defaults to 20; the set is made for ``skip + limit`` questions and the first
    ``skip`` dropped, so a skipped run never repeats a question of an unskipped one with that seed.
    """
    if dataset == SYNTHETIC:
        count = DEFAULT_SYNTHETIC_QUESTIONS if limit is None else limit
        return make_synthetic(skip + count, passages, seed, words_per_passage=words_per_passage)[skip:]
    return load_musique(dataset, limit=limit, passages=passages, skip=skip)


def chunk_texts(example: QAExample) -> list[str]:
    return [p.text for p in example.passages]


def add_chunks(rag, texts: list[str], neighbors: int, methods: tuple[str, ...] = (), progress: bool = False) -> dict:
    """The offline stage for the distinct ``texts``, with the notes on fused entries that ``methods`` read
    (asked for only then: measuring them makes every fused entry slower); its chunk count, seconds and
    the chunks whose entries the store dropped before it ended (``IngestReport.evicted``: 0 unless the
    store is too small for the run)."""
    start = time.perf_counter()
    pool = list(dict.fromkeys(texts))
    extra = {"variant_notes": True} if needs_variant_notes(methods) else {}
    report = rag.add_chunks(pool, neighbors=neighbors, progress=progress, **extra)
    return {"chunks": len(pool), "seconds": time.perf_counter() - start, "evicted": report.evicted}


def prompt_sizes(rag, question: str, passages: list[str], target: int) -> list[int]:
    """Prompt lengths (tokens) of the question over the first 1, 2, ... passages, up to the first that
    reaches ``target`` (or all of them)."""
    sizes: list[int] = []
    while len(sizes) < len(passages) and (not sizes or sizes[-1] < target):
        request = RAGRequest(chunks=passages[: len(sizes) + 1], question=question)
        sizes.append(sum(len(s.token_ids) for s in rag.segments(request)))
    return sizes


def closest_request(rag, passages: list[str], question: str, target: int) -> RAGRequest:
    """The question over the prefix of ``passages`` whose prompt length (in tokens) is closest to ``target``."""
    sizes = prompt_sizes(rag, question, passages, target)
    best = min(range(len(sizes)), key=lambda i: abs(sizes[i] - target))
    return RAGRequest(chunks=passages[: best + 1], question=question)


def workload_requests(rag, dataset: str, requests: int, target_tokens: int, seed: int = 0) -> list[RAGRequest]:
    """One request per question of ``dataset``: the prefix of its passages whose prompt is closest to
    ``target_tokens`` (synthetic: 10 passages per question; MuSiQue: all of each question's)."""
    passages = 10 if dataset == SYNTHETIC else None
    examples = load_examples(dataset, requests, passages=passages, seed=seed)
    if len(examples) < requests:
        raise ValueError(f"the dataset has {len(examples)} questions; --questions asks for {requests}")
    return [closest_request(rag, chunk_texts(ex), ex.question, target_tokens) for ex in examples]


def open_bench_rag(model: str, device: str | None = None, dtype: str | None = None, store: str | None = None,
                   kv_codec: str | None = None):  # fmt: skip
    """The engine as the benchmarks run it: ``reproducible=True`` and a store of their own.

    Reproducible, no request reads exact KV another left (an exact run, Full Attention or ratio 1,
    leaves none of a prompt behind for the next method), so every method is measured on its own entries.
    ``store``: a folder (persistent; resumed runs skip the offline stage) or ``None``: a temporary
    folder, removed when the engine is, so that entries beyond the memory tier's budget go to disk
    instead of being evicted (a method served plain entries for evicted fused ones would be measured
    on something else than it asks for); never the user's default store. ``kv_codec``: how the store
    keeps chunk KV (None: ``"model"``, the compute dtype, lossless, not the product's default: every
    recorded run compares against it).
    """
    from fusionrag_llm import FusionRAG

    folder = tempfile.mkdtemp(prefix="fusionrag-bench-") if store is None else store
    try:
        rag = FusionRAG.from_pretrained(model, device=device, dtype=dtype, store=folder,
                                        options={"reproducible": True, "kv_codec": kv_codec or "model"})  # fmt: skip
    except BaseException:
        if store is None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if store is None:
        weakref.finalize(rag, shutil.rmtree, folder, True)
    return rag


def parse_methods(text: str) -> tuple[str, ...]:
    """Comma-separated method names; the two baselines (needed for eq. 11) always come first, once each."""
    from fusionrag_llm import method_names

    names = [s for s in (part.strip() for part in text.split(",")) if s]
    if not names:
        raise ValueError("--method is empty; give at least one method, e.g. 'fusionrag'")
    unknown = [name for name in names if name not in method_names()]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; valid methods: {', '.join(method_names())}")
    return tuple(dict.fromkeys((*BASELINES, *names)))


def jobs(methods: tuple[str, ...], ratios: tuple[float, ...]) -> list[tuple[str, float | None]]:
    """(method, ratio) pairs to run; a method the ratio cannot change (it selects no token to
    recompute) appears once with ratio ``None``."""
    from fusionrag_llm import get_method

    return [pair for m in methods for pair in ([(m, None)] if not get_method(m).selects else [(m, r) for r in ratios])]


def needs_variant_notes(methods: tuple[str, ...]) -> bool:
    """Whether a method of the run reads notes stored with the fused entries (Cache-Craft's), which
    the offline stage then has to measure."""
    from fusionrag_llm import get_method

    return any(get_method(name).offline_notes for name in methods)


def _numbers(text: str, name: str, kind: type) -> list:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"--{name} is empty; give a comma-separated list")
    try:
        return [kind(p) for p in parts]
    except ValueError:
        raise ValueError(f"--{name} must be a comma-separated list of {kind.__name__}s, got {text!r}") from None


def parse_ratios(text: str) -> tuple[float, ...]:
    """Sorted, de-duplicated recompute ratios in [0, 1]."""
    ratios = _numbers(text, "ratios", float)
    bad = [r for r in ratios if not 0.0 <= r <= 1.0]
    if bad:
        raise ValueError(f"--ratio must lie in [0, 1], got {bad}")
    return tuple(sorted(set(ratios)))


def parse_lengths(text: str) -> tuple[int, ...]:
    """Sorted, de-duplicated prompt lengths in tokens (each >= 16)."""
    lengths = _numbers(text, "lengths", int)
    bad = [n for n in lengths if n < 16]
    if bad:
        raise ValueError(f"--lengths must be token counts >= 16, got {bad}")
    return tuple(sorted(set(lengths)))
