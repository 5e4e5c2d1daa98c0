"""LlamaIndex's embedding model and retriever over the engine's own: ``FusionRAGEmbedding`` (a
``BaseEmbedding``) and ``FusionRAGRetriever`` (a ``BaseRetriever`` over the store's document index)."""

from __future__ import annotations

import asyncio

from fusionrag_llm.integrations import _shared
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import ConfigDict, Field, field_validator

from fusionrag_llm import (
    DEFAULT_EMBEDDING_NAME,
    EmbeddingModel,
    FusionRAG,
    load_embedder,
)
from fusionrag_llm.ingest.search import DocumentHit, search_documents

# kept on the node, never put in the prompt or embedded
_HIT_METADATA = ["source", "chunk_id"]


class FusionRAGEmbedding(BaseEmbedding):
    """The packaged all-MiniLM-L6-v2 (``fusionrag ingest``'s model), or a sentence-transformers model
    folder given as ``model_name``, as a LlamaIndex embedding model. Offline; loaded on first use and
    shared with the engine. Vectors are L2-normalised; the async methods run on worker threads.

    >>> FusionRAGEmbedding().model_name
    'all-MiniLM-L6-v2'
    """

    model_config = ConfigDict(
        arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid"
    )

    model_name: str = Field(
        default=DEFAULT_EMBEDDING_NAME,
        description="The packaged model's name or a model folder.",
    )
    embed_batch_size: int = Field(
        default=32, gt=0, le=2048, description="Texts per call of the model."
    )

    _check_model = field_validator("model_name")(_shared.embedding_model_name)

    @classmethod
    def class_name(cls) -> str:
        return "FusionRAGEmbedding"

    @property
    def embedder(self) -> EmbeddingModel:
        return load_embedder(self.model_name)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self.embedder([query])[0].tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self.embedder([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self.embedder(texts).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


class FusionRAGRetriever(BaseRetriever):
    """Retrieves from the document index that ``fusionrag ingest DIR --store S`` built (the search of
    ``fusionrag query``): the ``similarity_top_k`` nearest chunks as ``NodeWithScore``s, best first.

    Give the engine whose store was ingested (``rag``; or ``model_name``, loaded on first use as by
    the LLM adapters). Each node's text is the registered chunk text, so ``FusionRAGLLM`` reuses its
    stored KV; ``metadata`` has ``source`` (the file) and ``chunk_id``, kept out of the prompt.
    ``tenant``: search what was ingested for that tenant (``fusionrag ingest --tenant``); give the LLM
    the same tenant so that its chunks' KV is reused.

        retriever = FusionRAGRetriever(rag=rag, similarity_top_k=3)
        engine = RetrieverQueryEngine.from_args(retriever, llm=FusionRAGLLM(rag=rag))
    """

    def __init__(self, rag: FusionRAG | None = None, *, model_name: str = _shared.DEFAULT_MODEL_NAME,
                 similarity_top_k: int = 5, tenant: str | None = None,
                 callback_manager: CallbackManager | None = None, verbose: bool = False) -> None:  # fmt: skip
        if (
            isinstance(similarity_top_k, bool)
            or not isinstance(similarity_top_k, int)
            or similarity_top_k < 1
        ):
            raise ValueError(
                f"similarity_top_k must be an int >= 1, got {similarity_top_k!r}"
            )
        self._rag, self._model_name = _shared.check_rag(rag), model_name
        self.similarity_top_k, self.tenant = similarity_top_k, _shared.checked_tenant(tenant)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @property
    def engine(self) -> FusionRAG:
        """The engine (loads ``model_name`` on first use when no ``rag`` was given)."""
        return _shared.resolve_rag(self._rag, self._model_name)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = search_documents(self.engine, query_bundle.query_str, self.similarity_top_k, self.tenant)
        return [NodeWithScore(node=_node(hit), score=hit.score) for hit in hits]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


def _node(hit: DocumentHit) -> TextNode:
    return TextNode(id_=hit.chunk_id, text=hit.text, metadata={"source": hit.source, "chunk_id": hit.chunk_id},
                    excluded_llm_metadata_keys=_HIT_METADATA, excluded_embed_metadata_keys=_HIT_METADATA)  # fmt: skip
