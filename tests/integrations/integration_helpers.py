"""Helpers of the framework tests: a deterministic bag-of-words embedding for the engine and both
frameworks, and a check that a chunk has a fused entry."""

import hashlib

import numpy as np
from langchain_core.embeddings import Embeddings
from llama_index.core.embeddings import BaseEmbedding

from fusionrag_llm.fusion.catalog import chunk_id_of

DIM = 64


def bag_of_words(text: str, dim: int = DIM) -> np.ndarray:
    vector = np.zeros(dim, dtype=np.float32)
    for word in text.lower().split():
        vector[int(hashlib.md5(word.strip(".,?").encode()).hexdigest(), 16) % dim] += 1.0
    vector[0] += 1e-3  # never all-zero
    return vector / np.linalg.norm(vector)


class RecordingEmbedder:
    """The engine's embedder in these tests: bag of words, counting the texts it embeds."""

    def __init__(self):
        self.texts = 0

    def __call__(self, texts):
        self.texts += len(texts)
        return np.stack([bag_of_words(t) for t in texts])


class BagOfWordsEmbedding(BaseEmbedding):
    """LlamaIndex embedding model for the tests."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return bag_of_words(query).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return bag_of_words(text).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


class BagOfWordsEmbeddings(Embeddings):
    """LangChain embeddings for the tests."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [bag_of_words(t).tolist() for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return bag_of_words(text).tolist()


def fused_entry_exists(rag, text: str) -> bool:
    chunk_id = chunk_id_of(text.strip())
    return chunk_id in rag.chunks and rag.stored(chunk_id, "fused") is not None


class TextOnlyCapabilities:
    """The capability flags of LangChain's standard suites for a model with no tool calling and no
    structured output (plain text generation only)."""

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False
