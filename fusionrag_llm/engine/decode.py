"""Token-id checks."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral
from typing import Any

import torch

from fusionrag_llm.errors import FusionRAGError


def check_token_ids(ids: Any, vocab_size: int, name: str = "continuation_ids") -> list[int]:
    """``ids`` as a list of ints in ``[0, vocab_size)``, else a ``FusionRAGError`` naming the bad value.

    Callers check before any compute: a bad id would otherwise surface from inside the embedding
    lookup as a torch ``IndexError`` (or a device-side assert on CUDA), and a float or a bool would
    be silently truncated. Accepts a list/tuple, a 1-D integer tensor or array.
    """
    if isinstance(ids, torch.Tensor) and ids.dim() == 1 and not ids.dtype.is_floating_point and ids.dtype != torch.bool:
        ids = ids.tolist()
    if isinstance(ids, (str, bytes, Mapping, torch.Tensor)) or not hasattr(ids, "__iter__"):
        raise FusionRAGError(f"{name} must be a sequence of int token ids, got {type(ids).__name__} {ids!r:.60}")
    checked = list(ids)
    for index, value in enumerate(checked):
        if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value < vocab_size:
            raise FusionRAGError(
                f"{name}[{index}] is {value!r:.40} ({type(value).__name__}); token ids must be ints in "
                f"[0, {vocab_size}), the model's vocabulary"
            )
    return [int(value) for value in checked]

