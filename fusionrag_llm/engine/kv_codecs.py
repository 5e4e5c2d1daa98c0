"""The ``kv_codec`` setting: how a store keeps chunk KV (a float dtype, or a quantized codec).

A float codec keeps the tensors in that dtype (the store's ``storage_dtype``, raw codec); a
quantized one packs them with scales (``storage.QuantCodec``). Either way the model computes in its
own dtype: entries are cast or expanded on the way to it. A store whose KV is not the compute
dtype's exact numbers (every codec but the compute dtype itself) gets keys of its own and holds no
exact path blocks (``fusion/entry_keys.py``).

Example:
    >>> resolve_kv_codec("bf16")
    ('bfloat16', 'raw')
    >>> resolve_kv_codec("int4")
    (None, 'int4')
    >>> resolve_kv_codec("int3")
    Traceback (most recent call last):
    ...
    fusionrag_llm.errors.FusionRAGError: kv_codec 'int3' is not supported; allowed: float32, bf16, fp16, int8, fp8, int4
"""

from __future__ import annotations

from fusionrag_llm.errors import FusionRAGError

# name -> (storage dtype, store codec id); bytes per token on SmolLM2-135M in docs/BENCHMARKS.md
KV_CODECS: dict[str, tuple[str | None, str]] = {
    "float32": ("float32", "raw"),
    "bf16": ("bfloat16", "raw"),
    "fp16": ("float16", "raw"),
    "int8": (None, "int8"),
    "fp8": (None, "fp8"),
    "int4": (None, "int4"),
}
_ALIASES = {"fp32": "float32", "bfloat16": "bf16", "float16": "fp16"}


def check_kv_codec(kv_codec: str) -> str:
    """The canonical name of ``kv_codec``; ``FusionRAGError`` listing the allowed ones otherwise."""
    name = _ALIASES.get(kv_codec.lower(), kv_codec.lower()) if isinstance(kv_codec, str) else None
    if name not in KV_CODECS:
        raise FusionRAGError(f"kv_codec {kv_codec!r} is not supported; allowed: {', '.join(KV_CODECS)}")
    return name


def resolve_kv_codec(kv_codec: str) -> tuple[str | None, str]:
    """``(storage dtype name or None, store codec id)`` of ``kv_codec``."""
    return KV_CODECS[check_kv_codec(kv_codec)]
