"""An ingestion into a store too small for it says so: ``add_chunks`` counts the chunks whose entries the
store dropped before the call ended (``report.evicted``) and logs a warning naming the remedy."""

import logging
import random

import pytest
import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.storage import StoreBudgets, TieredStore

MiB = 2**20


def _texts(count: int) -> list[str]:
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(5)) for _ in range(300)]
    return [f"Doc {i}: " + " ".join(rng.choice(words) for _ in range(150)) for i in range(count)]


def _rag(host_mib: int) -> FusionRAG:
    store = TieredStore(None, StoreBudgets(device_bytes=0, host_bytes=host_mib * MiB), torch.device("cpu"))
    return FusionRAG.from_pretrained("tiny", store=store)


def _embeddings(count: int) -> list[list[float]]:
    return torch.randn(count, 8, generator=torch.Generator().manual_seed(0)).tolist()


@pytest.mark.parametrize("host_mib, evicts", [(6, True), (256, False)])
def test_add_chunks_counts_and_warns_about_entries_a_small_store_dropped(host_mib, evicts, caplog):
    rag = _rag(host_mib)
    texts, embeddings = _texts(12), _embeddings(12)
    with caplog.at_level(logging.WARNING, logger="fusionrag_llm.fusion.offline"):
        report = rag.add_chunks(texts, embeddings=embeddings, neighbors=2, progress=False)
    assert (report.evicted > 0) == evicts
    warned = [r.getMessage() for r in caplog.records if "no longer holds" in r.getMessage()]
    assert bool(warned) == evicts
    if evicts:
        assert f"{report.evicted} of the 12 chunks" in warned[0] and "store folder" in warned[0]
        missing = [i for i in report.chunk_ids if rag.stored(i, "plain") is None or rag.stored(i, "fused") is None]
        assert len(missing) >= report.evicted  # what it counts is really gone
    else:
        assert all(rag.stored(i, "fused") is not None and rag.stored(i, "plain") is not None for i in report.chunk_ids)
