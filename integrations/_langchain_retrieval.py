"""LangChain's embeddings and retriever over the engine's own: ``FusionRAGEmbeddings`` (an ``Embeddings``)
and ``FusionRAGRetriever`` (a ``BaseRetriever`` over the store's document index)."""

from __future__ import annotations

from typing import Any

from fusionrag_llm.integrations import _shared
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fusionrag_llm import (
    DEFAULT_EMBEDDING_NAME,
    EmbeddingModel,
    FusionRAG,
    load_embedder,
)
from fusionrag_llm.ingest.search import search_documents


class FusionRAGEmbeddings(BaseModel, Embeddings):
    """The packaged all-MiniLM-L6-v2 (``fusionrag ingest``'s model), or a sentence-transformers model
    folder given as ``model_name`` (alias ``model``), as LangChain embeddings. Offline; loaded on first
    use and shared with the engine. Vectors are L2-normalised; ``aembed_*`` run on worker threads.

    >>> FusionRAGEmbeddings(model="all-MiniLM-L6-v2").model_name
    'all-MiniLM-L6-v2'
    """

    model_config = ConfigDict(
        protected_namespaces=(), populate_by_name=True, extra="forbid"
    )

    model_name: str = Field(default=DEFAULT_EMBEDDING_NAME, alias="model",
                            description="The packaged model's name or a model folder.")  # fmt: skip

    _check_model = field_validator("model_name")(_shared.embedding_model_name)

    @property
    def embedder(self) -> EmbeddingModel:
        return load_embedder(self.model_name)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embedder([text])[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await run_in_executor(None, self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await run_in_executor(None, self.embed_query, text)


class FusionRAGRetriever(BaseRetriever):
    """Retrieves from the document index that ``fusionrag ingest DIR --store S`` built (the search of
    ``fusionrag query``): the ``k`` nearest chunks as ``Document``s, best first.

    Give the engine whose store was ingested (``rag``; or ``model_name``, loaded on first use as by the
    chat model). Each document's ``page_content`` is the registered chunk text, so a chain that puts
    it in the prompt reuses its stored KV; ``metadata`` has ``source`` (the file), ``chunk_id`` and
    ``score`` (cosine similarity), and ``id`` is the chunk id. ``invoke(query, k=2)`` sets ``k`` for one call.
    ``tenant``: search what was ingested for that tenant (``fusionrag ingest --tenant``); give the chat
    model the same tenant so that its chunks' KV is reused.

        retriever = FusionRAGRetriever(rag=rag, k=3)
        chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | chat
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), populate_by_name=True,
                              extra="forbid")  # fmt: skip

    rag: Any | None = Field(
        default=None,
        exclude=True,
        description="A FusionRAG engine; None: load model_name.",
    )
    model_name: str = Field(
        default=_shared.DEFAULT_MODEL_NAME,
        alias="model",
        description="Model to load when rag is None.",
    )
    k: int = Field(default=5, ge=1, strict=True, description="Chunks to retrieve.")
    tenant: str | None = Field(default=None, description="Whose retrieval index to search; None: the default tenant's.")

    @field_validator("rag")
    @classmethod
    def _check_rag(cls, value: Any) -> Any:
        return _shared.check_rag(value)

    @field_validator("tenant")
    @classmethod
    def _check_tenant(cls, value: Any) -> str | None:
        return _shared.checked_tenant(value)

    @property
    def engine(self) -> FusionRAG:
        """The engine (loads ``model_name`` on first use when no ``rag`` was given)."""
        return _shared.resolve_rag(self.rag, self.model_name)

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        """``k`` (``invoke(query, k=2)``) overrides the setting for this call."""
        hits = search_documents(self.engine, query, self.k if k is None else k, self.tenant)
        return [Document(id=hit.chunk_id, page_content=hit.text,
                         metadata={"source": hit.source, "chunk_id": hit.chunk_id, "score": hit.score})
                for hit in hits]  # fmt: skip

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        sync_manager = run_manager.get_sync()
        return await run_in_executor(
            None, self._get_relevant_documents, query, run_manager=sync_manager, k=k
        )
