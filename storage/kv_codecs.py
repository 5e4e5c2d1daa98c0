"""The ``kv_codec`` setting: how a store keeps chunk KV (a float dtype, or a quantized codec).

A float codec keeps the tensors in that dtype (the store's ``storage_dtype``, raw codec); a
quantized one packs them with scales (``QuantCodec``). Either way the model computes in its
own dtype: entries are cast or expanded on the way to it. A store whose KV is not the compute
dtype's exact numbers (every codec but the compute dtype itself) gets keys of its own and holds no
exact chunk entries (``fusion/entry_keys.py``); a float codec's store still keeps exact path
blocks, in the compute dtype.

``"model"`` names the compute dtype itself (exact entries). A store folder records the codec it was
created with (``store_codec.py``), so every engine that opens it later uses the same one;
a new store gets ``DEFAULT_KV_CODEC``.

Example:
    >>> resolve_kv_codec("bf16")
    ('bfloat16', 'raw')
    >>> resolve_kv_codec("int4")
    (None, 'int4.2')
    >>> resolve_kv_codec("model")
    (None, 'raw')
    >>> resolve_kv_codec("int3")
    Traceback (most recent call last):
    ...
    fusionrag_llm.storage.errors.StoreConfigError: kv_codec 'int3' is not supported; allowed: model, float32, bf16, fp16, int8, fp8, int4
"""

from __future__ import annotations

from .errors import StoreConfigError

# name -> (storage dtype, store codec id); bytes per token on SmolLM2-135M in docs/BENCHMARKS.md
KV_CODECS: dict[str, tuple[str | None, str]] = {
    "model": (None, "raw"),  # the compute dtype: exact
    "float32": ("float32", "raw"),
    "bf16": ("bfloat16", "raw"),
    "fp16": ("float16", "raw"),
    "int8": (None, "int8"),
    "fp8": (None, "fp8"),
    "int4": (None, "int4.2"),  # values grouped by 16 channels (quantize.py)
}
DEFAULT_KV_CODEC = "bf16"  # what a new store keeps: half of float32's bytes, no exact path block lost
_ALIASES = {"fp32": "float32", "bfloat16": "bf16", "float16": "fp16"}


def check_kv_codec(kv_codec: str) -> str:
    """The canonical name of ``kv_codec``; ``StoreConfigError`` listing the allowed ones otherwise."""
    name = _ALIASES.get(kv_codec.lower(), kv_codec.lower()) if isinstance(kv_codec, str) else None
    if name not in KV_CODECS:
        raise StoreConfigError(f"kv_codec {kv_codec!r} is not supported; allowed: {', '.join(KV_CODECS)}")
    return name


def resolve_kv_codec(kv_codec: str) -> tuple[str | None, str]:
    """``(storage dtype name or None, store codec id)`` of ``kv_codec``."""
    return KV_CODECS[check_kv_codec(kv_codec)]


def kv_codec_of(storage_dtype: str | None, codec_id: str) -> str | None:
    """The ``kv_codec`` name of a store's settings (storage dtype name, codec id); None when no name fits."""
    for name, settings in KV_CODECS.items():
        if settings == (storage_dtype, codec_id):
            return name
    return None
