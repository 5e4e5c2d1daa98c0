"""Benchmark inputs: questions from ``synthetic`` or a MuSiQue-format file, and the KV store to use.

A passage becomes a chunk through its text alone (MuSiQue titles are empty in the shared file;
synthetic titles are only the passage's subject).

Example:
    >>> examples = load_examples("synthetic", limit=2, passages=3, seed=0)
    >>> len(examples), len(chunk_texts(examples[0]))
    (2, 3)
"""

from __future__ import annotations

from pathlib import Path

from fusionrag_llm.eval.datasets import QAExample, default_musique_path, load_musique
from fusionrag_llm.eval.synthetic import make_synthetic
from fusionrag_llm.request import RAGRequest

SYNTHETIC = "synthetic"
DEFAULT_SYNTHETIC_QUESTIONS = 20


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


def passage_pool(examples: list[QAExample]) -> list[str]:
    """All distinct chunk texts of ``examples``, in first-seen order."""
    return list(dict.fromkeys(text for ex in examples for text in chunk_texts(ex)))


def add_chunks(rag, texts: list[str], neighbors: int, notes: bool = False, progress: bool = False) -> None:
    """The offline stage for ``texts``; ``notes``: also the notes a method reads from fused entries
    (asked for only then: measuring them makes every fused entry slower to compute)."""
    extra = {"variant_notes": True} if notes else {}
    rag.add_chunks(texts, neighbors=neighbors, progress=progress, **extra)


def closest_request(rag, passages: list[str], question: str, target: int) -> RAGRequest:
    """The question over the prefix of ``passages`` whose prompt length (in tokens) is closest to ``target``."""
    best, best_gap = None, None
    for count in range(1, len(passages) + 1):
        request = RAGRequest(chunks=passages[:count], question=question)
        size = sum(len(s.token_ids) for s in rag.segments(request))
        if best is None or abs(size - target) < best_gap:
            best, best_gap = request, abs(size - target)
        if size >= target:
            break
    return best


def workload_requests(rag, dataset: str, requests: int, target_tokens: int, seed: int = 0) -> list[RAGRequest]:
    """One request per question of ``dataset``: the prefix of its passages whose prompt is closest to
    ``target_tokens`` (synthetic: 10 passages per question; MuSiQue: all of each question's)."""
    passages = 10 if dataset == SYNTHETIC else None
    examples = load_examples(dataset, requests, passages=passages, seed=seed)
    if len(examples) < requests:
        raise ValueError(f"the dataset has {len(examples)} questions; --questions asks for {requests}")
    return [closest_request(rag, [p.text for p in ex.passages], ex.question, target_tokens) for ex in examples]


def open_bench_rag(model: str, device: str | None = None, dtype: str | None = None, store: str | None = None,
                   kv_codec: str | None = None):  # fmt: skip
    """The engine as the benchmarks run it: ``prefix_cache=False`` and a store of their own.

    Without the path cache, an exact run (Full Attention, ratio 1) cannot leave exact KV of a
    prompt behind for the next method to reuse, so every method is measured on its own entries.
    ``store``: a folder (persistent; resumed runs skip the offline stage) or ``None`` (memory only);
    never the user's default store. ``kv_codec``: how the store keeps chunk KV (None: ``"model"``, the
    compute dtype, lossless, not the product's default: every recorded run compares against it).
    """
    from fusionrag_llm import FusionRAG

    return FusionRAG.from_pretrained(model, device=device, dtype=dtype, store=":memory:" if store is None else store,
                                     options={"prefix_cache": False, "kv_codec": kv_codec or "model"})  # fmt: skip
