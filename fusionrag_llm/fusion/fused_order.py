"""How a fused entry's neighbours are laid out before its chunk (``fused_order``).

A fused entry is its chunk's KV computed after S0 and its neighbours' plain entries at consecutive
positions (DESIGN.md section 3.4). Which neighbour sits where changes that KV, so the layout is
part of the entry's identity (its key, meta and catalog record): entries of different layouts
never serve one another.

* ``similar_first`` (the paper's, the default): most similar neighbour first, right after S0.
* ``similar_last``: most similar neighbour last, right before the chunk, where a chunk retrieved
  together with it is most likely to be read.
* ``corpus``: in the order the chunks were registered (a document's chunks in reading order), the
  order they keep when a retriever returns several of them in corpus order.

``context_in_place`` tells whether a request holds a fused entry's own context: every neighbour it
was computed after sits ahead of its chunk, in the order they were placed. Such a chunk is served
from its fused entry whatever the variant policy.

Example:
    >>> placement_order("similar_last", rows=[7, 2, 5])
    [2, 1, 0]
    >>> placement_order("corpus", rows=[7, 2, 5])
    [1, 2, 0]
    >>> context_in_place({"neighbours": ["a", "b"]}, ahead=["a", "x", "b"])
    True
    >>> context_in_place({"neighbours": ["a", "b"]}, ahead=["b", "a"])
    False
"""

from __future__ import annotations

from typing import Sequence

from fusionrag_llm.errors import FusionRAGError

FUSED_ORDERS = ("similar_first", "similar_last", "corpus")
DEFAULT_FUSED_ORDER = "similar_first"
# the layout of fused entries made before layouts existed: its keys, meta and records name no layout
UNTAGGED_FUSED_ORDER = "similar_first"


def check_fused_order(value: object) -> str:
    """``value`` when it names a layout; a ``FusionRAGError`` listing the layouts otherwise."""
    if not isinstance(value, str) or value not in FUSED_ORDERS:
        raise FusionRAGError(f"fused_order must be one of {', '.join(FUSED_ORDERS)}; got {value!r}")
    return value


def placement_order(fused_order: str, rows: Sequence[int]) -> list[int]:
    """Indices into the neighbours (given most similar first) in the order they are placed before
    the chunk. ``rows``: each neighbour's registration row in the catalog (read by ``corpus``)."""
    indices = list(range(len(rows)))
    if fused_order == "similar_first":
        return indices
    if fused_order == "similar_last":
        return indices[::-1]
    if fused_order == "corpus":
        return sorted(indices, key=lambda i: rows[i])
    raise FusionRAGError(f"fused_order must be one of {', '.join(FUSED_ORDERS)}; got {fused_order!r}")


def context_in_place(meta: dict, ahead: Sequence[str]) -> bool:
    """Whether every neighbour a fused entry (``meta``) was computed after is in ``ahead`` (the
    catalog ids of the chunks before its chunk in a request, in prompt order), in placement order.

    Other chunks may sit between them. The ``corpus`` layout's order needs the catalog's rows, which
    the entry does not keep: for it only the neighbours' presence is checked."""
    neighbours = list(meta.get("neighbours") or [])
    layout = meta.get("fused_order", UNTAGGED_FUSED_ORDER)
    where = {chunk_id: index for index, chunk_id in enumerate(ahead)}
    if any(n not in where for n in neighbours):
        return False
    if layout == "corpus":
        return True
    placed = [neighbours[i] for i in placement_order(layout, range(len(neighbours)))]
    return all(where[a] < where[b] for a, b in zip(placed, placed[1:]))
