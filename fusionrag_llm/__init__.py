"""fusionrag_llm: answer questions over retrieved documents with a local LLM, reusing chunk KV caches.

    from fusionrag_llm import FusionRAG, RAGRequest
    rag = FusionRAG.from_pretrained("smollm2-135m")
    out = rag.generate(RAGRequest(chunks=[...], question="..."))

These are the public names the adapters, the CLI and users import. Each is loaded on first access
(PEP 562), so ``import fusionrag_llm`` (or one of its subpackages) loads no model code, and no
optional dependency (FAISS, sentence-transformers, LlamaIndex, LangChain) is ever loaded by it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS = {
    "FusionRAG": "fusionrag_llm.api",
    "Generation": "fusionrag_llm.engine.llm_engine",
    "GenerationStats": "fusionrag_llm.engine.stats",
    "SamplingParams": "fusionrag_llm.engine.sampling",
    "FusionRAGError": "fusionrag_llm.errors",
    "CatalogWriteError": "fusionrag_llm.fusion.catalog",
    "CATALOG_FILE": "fusionrag_llm.fusion.catalog",
    "TENANT_CATALOGS": "fusionrag_llm.fusion.catalog",
    "registered_chunk_count": "fusionrag_llm.fusion.catalog",
    "DEFAULT_EMBEDDING_NAME": "fusionrag_llm.fusion.embeddings",
    "EmbeddingModel": "fusionrag_llm.fusion.embeddings",
    "load_embedder": "fusionrag_llm.fusion.embeddings",
    "IngestionWriteError": "fusionrag_llm.fusion.offline",
    "IngestReport": "fusionrag_llm.fusion.offline",
    "ChatRequest": "fusionrag_llm.request",
    "PromptFormat": "fusionrag_llm.request",
    "RAGRequest": "fusionrag_llm.request",
    "RAGSession": "fusionrag_llm.session",
    "TextPrompt": "fusionrag_llm.request",
    "check_tenant": "fusionrag_llm.request",
    "EngineOptions": "fusionrag_llm.options",
    "Method": "fusionrag_llm.methods",
    "MethodRun": "fusionrag_llm.methods",
    "Prefill": "fusionrag_llm.methods",
    "RunPlan": "fusionrag_llm.methods",
    "get_method": "fusionrag_llm.methods",
    "method_names": "fusionrag_llm.methods",
    "register_method": "fusionrag_llm.methods",
    "LayerHook": "fusionrag_llm.models.forward",
    "DecodeEviction": "fusionrag_llm.models.kv_eviction",
    "DEFAULT_MODEL": "fusionrag_llm.models.default_model",
    "conversion_source": "fusionrag_llm.models.gguf",
    "MissingDependencyError": "fusionrag_llm.errors",
    "KV_CODECS": "fusionrag_llm.storage.store_codec",
    "DEFAULT_KV_CODEC": "fusionrag_llm.storage.store_codec",
    "recorded_kv_codec": "fusionrag_llm.storage.store_codec",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fusionrag_llm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and IDEs see; never executed
    from fusionrag_llm.api import FusionRAG
    from fusionrag_llm.engine.llm_engine import Generation
    from fusionrag_llm.engine.sampling import SamplingParams
    from fusionrag_llm.engine.stats import GenerationStats
    from fusionrag_llm.errors import FusionRAGError, MissingDependencyError
    from fusionrag_llm.fusion.catalog import CATALOG_FILE, TENANT_CATALOGS, CatalogWriteError, registered_chunk_count
    from fusionrag_llm.fusion.embeddings import DEFAULT_EMBEDDING_NAME, EmbeddingModel, load_embedder
    from fusionrag_llm.fusion.offline import IngestionWriteError, IngestReport
    from fusionrag_llm.methods import Method, MethodRun, Prefill, RunPlan, get_method, method_names, register_method
    from fusionrag_llm.models.forward import LayerHook
    from fusionrag_llm.options import EngineOptions
    from fusionrag_llm.models.default_model import DEFAULT_MODEL
    from fusionrag_llm.models.gguf import conversion_source
    from fusionrag_llm.models.kv_eviction import DecodeEviction
    from fusionrag_llm.request import ChatRequest, PromptFormat, RAGRequest, TextPrompt, check_tenant
    from fusionrag_llm.session import RAGSession
    from fusionrag_llm.storage.store_codec import DEFAULT_KV_CODEC, KV_CODECS, recorded_kv_codec
