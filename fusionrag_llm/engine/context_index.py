"""RAGBoost's context ordering: retrieved chunks reordered so a request starts with chunks earlier
requests started with (their KV then comes from the exact prefix cache or the turn cache), plus an
order hint that tells the model the retriever's original ranking.

The index is a tree of chunk ids (plain Python, no tensors): every ordered context is a path from
the root. A new context follows, from the root, the child whose chunk it also holds, preferring the
child under which the most earlier contexts went (the most likely to still be cached); the chunks
on that path come first, in the path's order, then its other chunks in retrieval order. Contexts
with nothing in common with earlier ones keep their order, and the new path is added to the tree.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

ORDER_HINT = "Please read the context in the following priority order: {order} and answer the question."
POSITION_NAME = "document {n}"  # documents named by where they appear, when they carry no label


@dataclass
class _Node:
    visits: int = 0
    children: dict[str, "_Node"] = field(default_factory=dict)


class ContextIndex:
    """Ordered contexts seen so far, as a tree of chunk ids; ``order`` reorders and records one."""

    def __init__(self, max_nodes: int = 1_000_000):
        self._root = _Node()
        self._nodes = 0
        self.max_nodes = max_nodes
        self._lock = threading.Lock()

    def order(self, chunk_ids: Sequence[str]) -> list[int]:
        """The positions of ``chunk_ids`` in their new order (a permutation of ``range(len)``); the
        ordered context is recorded, so later contexts can follow it."""
        wanted = {chunk: index for index, chunk in enumerate(chunk_ids)}
        with self._lock:
            node, path = self._root, []
            while True:
                options = [(child.visits, chunk) for chunk, child in node.children.items()
                           if chunk in wanted and wanted[chunk] not in path]  # fmt: skip
                if not options:
                    break
                _, chunk = max(options)
                path.append(wanted[chunk])
                node = node.children[chunk]
            ordered = path + [index for index in range(len(chunk_ids)) if index not in path]
            self._record([chunk_ids[index] for index in ordered])
        return ordered

    def _record(self, chunk_ids: Sequence[str]) -> None:
        node = self._root
        node.visits += 1
        for chunk in chunk_ids:
            child = node.children.get(chunk)
            if child is None:
                if self._nodes >= self.max_nodes:
                    return  # full: earlier paths stay, new ones are not added
                child = node.children[chunk] = _Node()
                self._nodes += 1
            child.visits += 1
            node = child


def order_hint(ordered: Sequence[int], label: str | None = None) -> str | None:
    """The hint naming documents in their original ranking, by ``label`` (numbered in prompt order)
    or else as "document n" (the n-th in the prompt); None when the order did not change."""
    if list(ordered) == sorted(ordered):
        return None
    place = {original: position + 1 for position, original in enumerate(ordered)}
    names = [(label or POSITION_NAME).format(n=place[original]).strip() for original in range(len(ordered))]
    return ORDER_HINT.format(order=" >> ".join(names))
