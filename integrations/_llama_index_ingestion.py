"""``FusionRAGIngestion``: a LlamaIndex ``TransformComponent`` that registers nodes in the KV store as they are indexed."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from llama_index.core.schema import BaseNode, MetadataMode, TransformComponent
from pydantic import ConfigDict, Field, model_validator

from fusionrag_llm.integrations import _shared


class FusionRAGIngestion(TransformComponent):
    """Registers nodes in the engine's KV store as they are indexed (plain and, with ``fuse``, fused entries).

    Each node is registered as ``node.get_content(metadata_mode=MetadataMode.LLM)``, the text the
    response synthesizer puts in the prompt. ``node.embedding`` is reused for the neighbour search
    when every node has one (put the embed model before this component), else the engine's
    embedder runs. Nodes are returned unchanged; registering them again computes nothing. ``tenant``:
    register them for that tenant only (give the ``FusionRAGLLM`` that answers the same ``tenant``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    rag: Optional[Any] = Field(default=None, exclude=True, description="A FusionRAG engine; None: load model_name.")
    model_name: str = Field(default=_shared.DEFAULT_MODEL_NAME, description="Model to load when rag is None.")
    fuse: bool = Field(default=True, description="Also compute fused entries (with the nearest neighbours).")
    neighbors: int = Field(default=10, ge=0, description="Neighbours per fused entry.")
    progress: bool = Field(default=False, description="Progress bars while entries are computed.")
    tenant: Optional[str] = Field(default=None, description="Register for this tenant only; None: the default one.")

    @model_validator(mode="after")
    def _check_settings(self) -> "FusionRAGIngestion":
        _shared.check_rag(self.rag)
        self.tenant = _shared.checked_tenant(self.tenant)
        return self

    @classmethod
    def class_name(cls) -> str:
        return "FusionRAGIngestion"

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        # IngestionPipeline's cache keys on this dict: tell engines apart, since each keeps its own chunk catalog.
        engine = _shared.resolve_rag(self.rag, self.model_name)
        return {**super().to_dict(**kwargs), "engine_session": _shared.engine_session(engine)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], **kwargs: Any) -> "FusionRAGIngestion":
        return super().from_dict({k: v for k, v in data.items() if k != "engine_session"}, **kwargs)

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """``show_progress=True`` (as LlamaIndex's own transformations take it) shows progress bars too."""
        self.ingest(nodes, progress=self.progress or bool(kwargs.get("show_progress")))
        return nodes

    def ingest(self, nodes: Sequence[BaseNode], progress: bool | None = None):
        """Register ``nodes``; returns the engine's ``IngestReport`` (what was computed)."""
        texts = [node.get_content(metadata_mode=MetadataMode.LLM) for node in nodes]
        embeddings = [node.embedding for node in nodes]
        vectors = embeddings if nodes and all(e is not None for e in embeddings) else None
        engine = _shared.resolve_rag(self.rag, self.model_name)
        show = self.progress if progress is None else progress
        return _shared.register_texts(engine, texts, vectors, fuse=self.fuse, neighbors=self.neighbors, progress=show,
                                      tenant=self.tenant)  # fmt: skip
