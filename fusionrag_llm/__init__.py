"""fusionrag_llm: answer questions over retrieved documents with a local LLM, reusing chunk KV caches.

    from fusionrag_llm import FusionRAG, RAGRequest
    rag = FusionRAG.from_pretrained("smollm2-135m")
    out = rag.generate(RAGRequest(chunks=[...], question="..."))
"""

from fusionrag_llm.api import FusionRAG
from fusionrag_llm.engine.llm_engine import Generation
from fusionrag_llm.engine.stats import GenerationStats
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.catalog import CatalogWriteError
from fusionrag_llm.fusion.offline import IngestionWriteError, IngestReport
from fusionrag_llm.request import PromptFormat, RAGRequest

__all__ = [
    "CatalogWriteError", "FusionRAG", "FusionRAGError", "Generation", "GenerationStats", "IngestReport",
    "IngestionWriteError", "PromptFormat", "RAGRequest",
]
__version__ = "0.1.0"
