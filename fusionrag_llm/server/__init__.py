"""``fusionrag serve``: the engine behind an OpenAI-compatible HTTP API (``create_app``, ``serve``).

Any OpenAI client works against it unchanged (``base_url="http://127.0.0.1:8000/v1"``); requests of
all clients are batched by one engine thread (``engine_loop.py``); embeddings run beside it
(``embeddings.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)


def serve(rag, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
          max_waiting: int = 256, request_timeout: float = 600.0, max_num_seqs: int | None = None,
          log_level: str = "warning", max_body_bytes: int | None = None, api_keys: Sequence[str] | Mapping[str, str | None] = (),
          chunk_writes: bool | str = True, embedding_model: str | None = "all-MiniLM-L6-v2") -> None:  # fmt: skip
    """Run the server until interrupted (blocking). Binds 127.0.0.1 unless told otherwise.
    ``max_num_seqs``: answers decoding together (default: the engine's setting, 16 on a CPU, 256 on a GPU); the other options
    are ``create_app``'s. Bound to a non-loopback address without API keys, it warns that anyone who
    reaches the port may use it."""
    import dataclasses

    from fusionrag_llm.errors import require

    if max_num_seqs is not None:
        config = rag.engine.scheduler.config
        rag.engine.scheduler.config = dataclasses.replace(config, max_num_seqs=max_num_seqs)

    uvicorn = require("uvicorn", "serve", "fusionrag serve")
    from fusionrag_llm.server.access import is_loopback
    from fusionrag_llm.server.app import MAX_BODY_BYTES, create_app

    app = create_app(rag, served_model_name, max_waiting=max_waiting, request_timeout=request_timeout,
                     max_body_bytes=max_body_bytes or MAX_BODY_BYTES, api_keys=api_keys,
                     chunk_writes=chunk_writes, embedding_model=embedding_model)  # fmt: skip
    if not api_keys and not is_loopback(host):
        logger.warning(OPEN_WARNING, host)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


OPEN_WARNING = (
    "the server binds %s without an API key: it is open to anyone who can reach this port, who may "
    "use the model and register chunks in its store. Set a key with --api-key KEY (or $FUSIONRAG_API_KEY; "
    "create_app(api_keys=[...]) from Python), or bind 127.0.0.1."
)
