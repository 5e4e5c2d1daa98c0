"""The ``FusionRAG`` facade: load a model, answer requests."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from fusionrag_llm.engine.llm_engine import METHODS, Generation, LLMEngine
from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.models.default_model import DEFAULT_MODEL
from fusionrag_llm.models.loader import LoadedModel, load_model
from fusionrag_llm.request import RAGRequest, Segment, build_segments


class FusionRAG:
    """Answer questions over retrieved chunks with a local model.

    >>> rag = FusionRAG.from_pretrained("tiny")
    >>> out = rag.generate(RAGRequest(chunks=["Paris is in France."], question="Where is Paris?"),
    ...                    method="full_attention", max_new_tokens=4)
    >>> out.stats.computed_tokens == len(out.prompt_ids)
    True
    """

    methods = METHODS

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.engine = LLMEngine(loaded)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path = DEFAULT_MODEL,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> "FusionRAG":
        """Load ``"smollm2-135m"`` (default), ``"tiny"``, a model folder, a ``.gguf`` file or a hub id."""
        return cls(load_model(name_or_path, device=device, dtype=dtype))

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def context_window(self) -> int:
        return self.loaded.context_window

    def segments(self, request: RAGRequest | str) -> list[Segment]:
        """How ``request`` is split into prefix, chunks, text between, and suffix."""
        if isinstance(request, RAGRequest):
            head, tail = self.tokenizer.chat_frame(request.system)
            return build_segments(head, request.pieces(), tail, self.tokenizer.encode)
        if isinstance(request, str):
            if not request.strip():
                raise FusionRAGError("the prompt is empty; pass a non-empty string or a RAGRequest")
            head, tail = self.tokenizer.chat_frame(None)
            return build_segments(head, [("text", request)], tail, self.tokenizer.encode)
        raise FusionRAGError(f"a request must be a RAGRequest or a prompt string, got {type(request).__name__}")

    def generate(
        self,
        request: RAGRequest | str,
        method: str = "full_attention",
        max_new_tokens: int = 32,
    ) -> Generation:
        """Answer ``request`` greedily; ``out.stats`` holds TTFT and token counts."""
        self.engine.check_method(method)
        return self.engine.generate(self.segments(request), method=method, max_new_tokens=max_new_tokens)
