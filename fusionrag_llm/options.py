"""``EngineOptions``: every engine setting beyond the model, its device and dtype, the store and the embedder.

One typed object, so ``FusionRAG.from_pretrained`` keeps a short signature and a new setting touches
this file and the code that reads it. A dict of its fields works wherever it is taken; an unknown
field is an error that lists the known ones.

    >>> EngineOptions.of({"turn_cache_gib": 0.5}).turn_cache_gib
    0.5
    >>> EngineOptions.of({"turn_cache": 1})
    Traceback (most recent call last):
    ...
    fusionrag_llm.errors.FusionRAGError: unknown engine option(s) turn_cache; known: kernels, decode_weights, prefix_cache, turn_cache_gib, kv_codec, remote, remote_secret, remote_trusted, auxiliary, craft_variants, layerwise_load, reproducible
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from fusionrag_llm.errors import FusionRAGError


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings; the defaults suit one process on one machine.

    * ``kernels``: ``"auto"`` (Triton on CUDA, compute capability 8.0+), ``"torch"`` or ``"triton"``;
      default ``$FUSIONRAG_KERNELS`` or auto (docs/gpu.md).
    * ``decode_weights``: what decode steps read on CPU: ``"float"``, or 8-bit / 4-bit GGUF-style blocks
      ``"q8"`` / ``"q4"``; default ``$FUSIONRAG_DECODE_WEIGHTS`` or ``"auto"`` (blocks only where they hold
      the weights' own numbers, so answers do not change; docs/cpu.md).
    * ``prefix_cache``: also store and reuse exact KV of whole chunk paths (the alternative path).
    * ``turn_cache_gib``: memory for multi-turn reuse, on the model's device (0: off): a request whose prompt starts with an
      earlier prompt and answer computes only the rest (``stats.turn_tokens``; docs/store.md).
    * ``kv_codec``: how the store keeps chunk KV: ``"model"`` (exact), ``"float32"``, ``"bf16"``, ``"fp16"``,
      ``"int8"``, ``"fp8"``, ``"int4"``; default the codec the store folder records, ``"bf16"`` for a new
      folder, ``"model"`` for ``":memory:"`` (docs/store.md).
    * ``remote``: a Redis/Valkey URL for a KV tier shared with other engines; default ``$FUSIONRAG_REMOTE``.
    * ``remote_secret``: the key of the MAC on every value of the remote tier (at least 16 characters, the
      same in every engine sharing it); default ``$FUSIONRAG_REMOTE_SECRET``. Not shown by ``repr``.
    * ``remote_trusted``: True opens the remote tier without a secret, trusting everyone who can write the
      server (its values carry no MAC); default ``$FUSIONRAG_REMOTE_TRUSTED``. A remote tier needs one of
      the two (docs/SECURITY.md). When either is given here, neither is read from the environment.
    * ``auxiliary``: CacheClip's auxiliary model: a model of the same tokenizer (a name, path, ``FusionRAG``
      or loaded model) or an int, how many layers of this model it keeps (default: a quarter).
    * ``craft_variants``: Cache-Craft's request-made chunk variants, about M per chunk kept (0: off).
    * ``layerwise_load``: stored KV reaches a request's cache layer by layer on a CUDA stream while the
      forward computes (default: on for a CUDA model, off on the CPU).
    * ``reproducible``: every request that does not say otherwise (``generate(..., reproducible=)``) answers
      from the stored chunk entries and the prompt prefix's KV only, never from exact KV, turn KV or
      Cache-Craft variants earlier requests left, so its answer does not depend on what ran before.
    """

    kernels: str | None = None
    decode_weights: str | None = None
    prefix_cache: bool = True
    turn_cache_gib: float = 0.0
    kv_codec: str | None = None
    remote: str | None = None
    remote_secret: str | None = field(default=None, repr=False)
    remote_trusted: bool | None = None
    auxiliary: Any = None
    craft_variants: int = 0
    layerwise_load: bool | None = None
    reproducible: bool = False

    def __post_init__(self) -> None:
        for name in ("prefix_cache", "reproducible"):
            if not isinstance(getattr(self, name), bool):
                raise FusionRAGError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, default in (("layerwise_load", "auto"), ("remote_trusted", "$FUSIONRAG_REMOTE_TRUSTED")):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise FusionRAGError(f"{name} must be True, False or None ({default}), got {value!r}")
        for name in ("kernels", "decode_weights", "kv_codec", "remote", "remote_secret"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                shown = "a value" if name == "remote_secret" else repr(value)
                raise FusionRAGError(f"{name} must be a string or None, got {shown}")

    @classmethod
    def of(cls, value: "EngineOptions | Mapping[str, Any] | None") -> "EngineOptions":
        """``value`` as options: None gives the defaults, a mapping its fields."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise FusionRAGError(f"options must be EngineOptions or a dict of its fields, got {type(value).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = [name for name in value if name not in known]
        if unknown:
            raise FusionRAGError(f"unknown engine option(s) {', '.join(map(str, unknown))}; known: {', '.join(known)}")
        return cls(**value)
