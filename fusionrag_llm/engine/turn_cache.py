"""Multi-turn reuse: the KV of finished requests, kept by token blocks, so a chat's next turn (whose
prompt starts with the last turn's prompt and answer) computes only its new tokens.

When a request finishes, the KV of every token it fed (prompt and answer) is kept in blocks of
``TURN_BLOCK`` tokens plus its last partial block, each under a hash chain key
``h_i = hash(namespace, h_{i-1}, tokens of block i)`` (nano-vllm's prefix index, in host memory,
least recently used blocks evicted beyond ``budget_bytes``). A new request looks up the longest
chain matching the start of its prompt and reads that prefix instead of computing it.

KV is kept by what computed it (the namespace): a run whose context was exact (Full Attention, or
every reused token recomputed) under ``"exact"``, which any request may read; any other run under
its own method settings, which only requests with the same settings read. An exact request never
reads approximated KV, and a FusionRAG turn reads back the context its previous turn saw.

A tenant other than the default one salts every namespace it reads and writes (``tenant_namespace``,
as vLLM salts its prefix block hashes with ``cache_salt``), so its chains start from roots of their
own: no request of another tenant matches, reads or learns of its blocks.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import astuple, dataclass
from typing import Sequence

import torch

TURN_BLOCK = 64
EXACT = "exact"


def namespace_of(plan) -> str:
    """The namespace a run under ``plan`` reads besides ``"exact"`` (and writes when not exact)."""
    return "plan:" + repr((plan.name, astuple(plan.method), plan.recompute_ratio))


def tenant_namespace(tenant: str, namespace: str) -> str:
    """``namespace`` as ``tenant`` (a checked tenant name) reads and writes it; the default tenant's
    (``""``) is the namespace itself.

    >>> tenant_namespace("", EXACT), tenant_namespace("acme", EXACT) == tenant_namespace("acme2", EXACT)
    ('exact', False)
    """
    if not tenant:
        return namespace
    return f"tenant:{hashlib.sha256(tenant.encode()).hexdigest()}|{namespace}"


def block_key(namespace: str, previous: str | None, token_ids: Sequence[int]) -> str:
    payload = f"{namespace}|{previous}|{','.join(map(str, token_ids))}"
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class _Block:
    key: str
    parent: str  # the key of the block before it (or of its namespace's root)
    tokens: tuple[int, ...]
    keys: torch.Tensor  # [layers, kv_heads, n, head_dim] raw (rotary not applied), on the host
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


@dataclass(frozen=True)
class TurnHit:
    length: int  # prompt tokens covered, from position 0
    keys: torch.Tensor  # [layers, kv_heads, length, head_dim] raw
    values: torch.Tensor
    namespace: str


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


class TurnCache:
    """Blocks of earlier requests' KV as a tree: each block hangs under the block before it, so a
    prompt follows whole blocks while they match and takes the matching start of the next one."""

    def __init__(self, budget_bytes: int, block: int = TURN_BLOCK):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"the turn cache budget must be an int >= 0 bytes, got {budget_bytes!r}")
        self.budget_bytes, self.block = budget_bytes, block
        self._blocks: OrderedDict[str, _Block] = OrderedDict()  # least recently used first
        self._children: dict[str, list[str]] = {}  # parent key -> keys of the blocks under it
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        """Forget every kept block."""
        with self._lock:
            self._blocks.clear()
            self._children.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, token_ids: Sequence[int], namespaces: Sequence[str], limit: int) -> TurnHit | None:
        """The longest kept prefix of ``token_ids`` (at most ``limit`` tokens) in any of ``namespaces``."""
        token_ids = list(token_ids[:limit])
        with self._lock:
            walks = [(self._walk(token_ids, namespace), namespace) for namespace in namespaces]
            (length, path), namespace = max(walks, key=lambda walk: walk[0][0])
            if not length:
                return None
            self._touch([block.key for block, _ in path])
            keys = torch.cat([block.keys[:, :, :used] for block, used in path], dim=2)
            values = torch.cat([block.values[:, :, :used] for block, used in path], dim=2)
        return TurnHit(length, keys, values, namespace)

    def _walk(self, token_ids: list[int], namespace: str) -> tuple[int, list[tuple[_Block, int]]]:
        """Whole blocks while one matches the next tokens, then the longest matching start of one."""
        node, length, path = _root(namespace), 0, []
        while length < len(token_ids):
            best, best_used = None, 0
            for key in self._children.get(node, ()):
                block = self._blocks.get(key)
                if block is None:
                    continue
                used = _common(block.tokens, token_ids[length:])
                if used > best_used or (used == best_used and best is not None and used == len(block.tokens)):
                    best, best_used = block, used
            if best is None:
                break
            path.append((best, best_used))
            length += best_used
            if best_used < len(best.tokens):
                break
            node = best.key
        return length, path

    def kept(self, token_ids: Sequence[int], namespace: str) -> int:
        """How many leading tokens of ``token_ids`` whole kept blocks already hold (a multiple of the
        block size): ``remember`` needs their KV no more."""
        parent, length = _root(namespace), 0
        with self._lock:
            while length + self.block <= len(token_ids):
                key = block_key(namespace, parent, tuple(token_ids[length : length + self.block]))
                if key not in self._blocks:
                    break
                parent, length = key, length + self.block
        return length

    def remember(self, token_ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor, namespace: str,
                 start: int = 0) -> int:  # fmt: skip
        """Keep the blocks of ``token_ids`` not kept yet; ``keys``/``values`` are the raw KV of tokens
        ``start..`` (``[layers, kv_heads, len - start, head_dim]``; ``start`` from ``kept``, the blocks
        before it are kept already). Returns how many blocks were added."""
        added, parent, path = 0, _root(namespace), []
        with self._lock:
            for first in range(0, len(token_ids), self.block):
                tokens = tuple(token_ids[first : first + self.block])
                key = block_key(namespace, parent, tokens)
                if key not in self._blocks:
                    if first < start:
                        break  # evicted since ``kept`` looked: the blocks after it would hang under nothing
                    rows = slice(first - start, first - start + len(tokens))
                    block = _Block(key, parent, tokens, keys[:, :, rows].to("cpu", copy=True),
                                   values[:, :, rows].to("cpu", copy=True))  # fmt: skip
                    if block.nbytes > self.budget_bytes:
                        break
                    self._blocks[key] = block
                    self._children.setdefault(parent, []).append(key)
                    self._bytes += block.nbytes
                    added += 1
                parent = key
                path.append(key)
            self._touch(path)
            while self._bytes > self.budget_bytes and self._blocks:
                self._evict(next(iter(self._blocks)))
        return added

    def _touch(self, path: list[str]) -> None:
        """Mark a path used, its first block last: eviction takes a path's deepest blocks first, so
        no kept block hangs under an evicted one for long."""
        for key in reversed(path):
            self._blocks.move_to_end(key)

    def _evict(self, key: str) -> None:
        block = self._blocks.pop(key)
        self._bytes -= block.nbytes
        siblings = self._children.get(block.parent, [])
        if key in siblings:
            siblings.remove(key)
        if not siblings:
            self._children.pop(block.parent, None)


def _root(namespace: str) -> str:
    return f"root|{namespace}"
