"""Adapter ingestion shows progress bars when asked (and stays quiet otherwise)."""

import pytest

from fusionrag_llm import FusionRAG

TEXTS = [
    "The ferry to Osterholm leaves at nine every morning from the north quay.",
    "Osterholm's harbour master, Lene Vik, keeps the tide tables in the old customs house.",
]


@pytest.fixture()
def rag():
    return FusionRAG.from_pretrained("tiny", store=":memory:")


def _nodes():
    from llama_index.core.schema import TextNode

    return [TextNode(text=text, embedding=[1.0, float(i)]) for i, text in enumerate(TEXTS)]


@pytest.mark.parametrize("how", ["quiet", "progress", "show_progress"])
def test_llama_index_ingestion_progress(rag, capfd, how):
    from fusionrag_llm.integrations.llama_index import FusionRAGIngestion

    ingestion = FusionRAGIngestion(rag=rag, neighbors=1, progress=how == "progress")
    ingestion(_nodes(), **({"show_progress": True} if how == "show_progress" else {}))
    shown = "plain entries" in capfd.readouterr().err
    assert shown == (how != "quiet") and len(rag.chunks) == 2


@pytest.mark.parametrize("progress", [False, True])
def test_langchain_ingestion_progress(rag, capfd, progress):
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore

    from fusionrag_llm.integrations.langchain import FusionRAGDocumentTransformer, add_documents

    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    add_documents(rag, store, [Document(page_content=TEXTS[0])], neighbors=1, progress=progress)
    FusionRAGDocumentTransformer(rag, embeddings=DeterministicFakeEmbedding(size=8), neighbors=1,
                                 progress=progress).transform_documents([Document(page_content=TEXTS[1])])  # fmt: skip
    assert ("plain entries" in capfd.readouterr().err) == progress and len(rag.chunks) == 2
