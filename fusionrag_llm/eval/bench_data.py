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


def open_bench_rag(model: str, device: str | None, dtype: str | None, store: str | None, host_gib: float,
                   disk_gib: float = 20.0, kv_codec: str | None = None):  # fmt: skip
    """The engine as the benchmarks run it: ``prefix_cache=False`` and a store of their own.

    Without the path cache, an exact run (Full Attention, ratio 1) cannot leave exact KV of a
    prompt behind for the next method to reuse, so every method is measured on its own entries.
    ``store``: a folder (persistent, at most ``disk_gib`` GiB; resumed runs skip the offline stage)
    or ``None`` (memory only). Either way ``host_gib`` GiB of host memory; never the user's default
    store. ``kv_codec``: how the store keeps chunk KV (None: ``"model"``, the compute dtype, lossless,
    not the product's default: every recorded run compares against it).
    """
    from fusionrag_llm import FusionRAG
    from fusionrag_llm.models.loader import load_model
    from fusionrag_llm.paths import remote_url
    from fusionrag_llm.storage.settings import GiB, StoreBudgets
    from fusionrag_llm.storage.store import MEMORY, open_store

    if not host_gib > 0 or not disk_gib > 0:
        raise ValueError(f"store budgets must be > 0 GiB, got host {host_gib}, disk {disk_gib}")
    loaded = load_model(model, device=device, dtype=dtype)
    budgets = StoreBudgets(host_bytes=int(host_gib * GiB), disk_bytes=int(disk_gib * GiB))
    kv_store = open_store(MEMORY if store is None else store, loaded.model.device, budgets=budgets,
                          remote=remote_url(), kv_codec=kv_codec or "model")
    return FusionRAG(loaded, store=kv_store, prefix_cache=False)
