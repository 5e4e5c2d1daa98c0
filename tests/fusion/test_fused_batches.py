"""Fused entries computed several per forward (how ingestion runs on a GPU) equal those computed one
per forward up to float rounding, with the same neighbours and records."""

import torch

from fusionrag_llm import FusionRAG
from fusionrag_llm.fusion import offline
from fusionrag_llm.fusion.catalog import chunk_id_of

CHUNKS = ["Ferries leave Keldmouth twice a day.", "The lighthouse was built in 1872.", "Sheep graze the cliffs.",
          "The harbour froze in 1903.", "A bell rings at noon."]  # fmt: skip
EMBEDDINGS = [[1, 0, 0], [0.8, 0.6, 0], [0, 1, 0], [0, 0.6, 0.8], [0, 0, 1]]


def ingest(batch: int, monkeypatch):
    monkeypatch.setattr(offline, "fused_batch", lambda model: batch)
    rag = FusionRAG.from_pretrained("tiny", store=":memory:", options={"prefix_cache": False})
    report = rag.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    return rag, report


def assert_same_entries(one, many, variant: str) -> None:
    """Every chunk's ``variant`` entry of ``many`` equals ``one``'s up to float rounding, meta and tokens exactly."""
    for text in CHUNKS:
        a, b = one.stored(chunk_id_of(text), variant).entry, many.stored(chunk_id_of(text), variant).entry
        assert a.meta == b.meta and a.token_ids == b.token_ids
        torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.values, a.values, rtol=1e-5, atol=1e-5)


def test_fused_entries_computed_in_batches_match_one_per_forward(monkeypatch):
    one, one_report = ingest(1, monkeypatch)
    many, many_report = ingest(3, monkeypatch)  # batches of 3 and 2
    assert many_report.fused_computed == one_report.fused_computed == len(CHUNKS)
    assert_same_entries(one, many, "fused")
    again = many.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2)
    assert again.fused_computed == again.plain_computed == 0  # recorded as current: nothing to redo


def test_plain_entries_computed_in_batches_match_one_per_forward(monkeypatch):
    monkeypatch.setattr(offline, "plain_batch", lambda model: 1)
    one, one_report = ingest(1, monkeypatch)
    monkeypatch.setattr(offline, "plain_batch", lambda model: 2)  # batches of 2, 2 and 1
    many, many_report = ingest(1, monkeypatch)
    assert many_report.plain_computed == one_report.plain_computed == len(CHUNKS)
    assert_same_entries(one, many, "plain")
    assert many.add_chunks(CHUNKS, embeddings=EMBEDDINGS, neighbors=2).plain_computed == 0
