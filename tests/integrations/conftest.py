"""Fixtures of the framework tests: one ``tiny`` engine (in-memory store) and the bundled demo corpus."""

import importlib.resources
import json

import pytest
from integration_helpers import RecordingEmbedder

from fusionrag_llm import FusionRAG


@pytest.fixture(scope="session")
def corpus() -> dict:
    return json.loads(importlib.resources.files("fusionrag_llm.data").joinpath("demo_corpus.json").read_text())


@pytest.fixture(scope="session")
def rag() -> FusionRAG:
    return FusionRAG.from_pretrained("tiny", store=":memory:", embedder=RecordingEmbedder())


@pytest.fixture
def fresh_rag(rag) -> FusionRAG:
    """A new engine (empty store and catalog) over the already loaded tiny model."""
    return FusionRAG(rag.engine.loaded, store=":memory:", embedder=RecordingEmbedder())
