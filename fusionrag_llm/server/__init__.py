"""``fusionrag serve``: the engine behind an OpenAI-compatible HTTP API (``create_app``, ``serve``).

Any OpenAI client works against it unchanged (``base_url="http://127.0.0.1:8000/v1"``); requests of
all clients are batched by one engine thread (``engine_loop.py``); embeddings run beside it
(``embeddings.py``).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def serve(rag, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
          max_waiting: int = 256, request_timeout: float = 600.0, max_num_seqs: int | None = None,
          log_level: str = "warning", embedding_model: str | None = "all-MiniLM-L6-v2") -> None:  # fmt: skip
    """Run the server until interrupted (blocking). Binds 127.0.0.1 unless told otherwise.
    ``max_num_seqs``: answers decoding together (default: the engine's setting). ``embedding_model``:
    what ``/v1/embeddings`` serves (the packaged model's name or a sentence-transformers folder; None: none)."""
    from fusionrag_llm.engine.scheduler import SchedulerConfig
    from fusionrag_llm.errors import require

    if max_num_seqs is not None:
        config = rag.engine.scheduler.config
        rag.engine.scheduler.config = SchedulerConfig(max_num_seqs, config.max_prefill_tokens)

    uvicorn = require("uvicorn", "serve", "fusionrag serve")
    from fusionrag_llm.server.app import create_app

    app = create_app(rag, served_model_name, max_waiting=max_waiting, request_timeout=request_timeout,
                     embedding_model=embedding_model)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
