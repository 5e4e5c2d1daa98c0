"""KV of token prefixes, kept by token blocks: what a chat's next turn and a lossy store's
exact prompt prefixes are read from instead of computed.

KV is kept in blocks of ``BLOCK`` tokens plus a last partial block, in a ``BlockPool`` (fixed-size
blocks with reference counts, on the model's device, within ``budget_bytes``); the index is integers
only: a hash chain ``h_i = sha256(h_{i-1}, tokens of block i)`` from a root per namespace, each key
naming its pool block (nano-vllm's prefix index). A lookup finds the longest chain matching the start
of the given tokens. Least recently used blocks that no reader holds are dropped when the pool is
full, deepest first (with whatever hangs under them); a reader holds its blocks' references while it
copies, so it copies without the index's lock.

KV is kept by what computed it (the namespace): ``EXACT`` for KV computed from position 0 with
nothing approximated, which any request may read; the engine keeps a run's approximated KV under that
run's own namespace (``engine/connector.py``). A tenant other than the default one salts every
namespace it reads and writes (``tenant_namespace``, as vLLM salts its prefix block hashes with
``cache_salt``), so its chains start from roots of their own: no request of another tenant matches,
reads or learns of its blocks.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from fusionrag_llm.models.block_pool import BlockPool

BLOCK = 64
EXACT = "exact"


def tenant_namespace(tenant: str, namespace: str) -> str:
    """``namespace`` as ``tenant`` (a checked tenant name) reads and writes it; the default tenant's
    (``""``) is the namespace itself.

    >>> tenant_namespace("", EXACT), tenant_namespace("acme", EXACT) == tenant_namespace("acme2", EXACT)
    ('exact', False)
    """
    if not tenant:
        return namespace
    return f"tenant:{hashlib.sha256(tenant.encode()).hexdigest()}|{namespace}"


def _digest(payload: str) -> int:
    return int.from_bytes(hashlib.sha256(payload.encode()).digest()[:16], "big")


def _root(namespace: str) -> int:
    return _digest(f"root|{namespace}")


def block_key(previous: int, token_ids: Sequence[int]) -> int:
    """The chain key of a block of ``token_ids`` hung under the block (or root) keyed ``previous``."""
    return _digest(f"{previous}|{','.join(map(str, token_ids))}")


@dataclass(frozen=True)
class _Block:
    block: int  # its pool block
    parent: int  # the key of the block before it (or of its namespace's root)
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class PrefixHit:
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


class PrefixCache:
    """Blocks of kept KV as a tree: each block hangs under the block before it, so a prompt follows
    whole blocks while they match and takes the matching start of the next one."""

    def __init__(self, budget_bytes: int, block: int = BLOCK):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be an int >= 0 bytes, got {budget_bytes!r}")
        self.budget_bytes, self.block = budget_bytes, block
        self.pool: BlockPool | None = None  # made for the first KV kept: its shape, dtype and device
        self._index: OrderedDict[int, _Block] = OrderedDict()  # chain key -> block, least recently used first
        self._children: dict[int, list[int]] = {}  # parent key -> keys of the blocks under it
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._index)

    def clear(self) -> None:
        """Forget every kept block (a reader copying one still finishes its copy)."""
        with self._lock:
            if self.pool is not None:
                self.pool.unref([block.block for block in self._index.values()])
            self._index.clear()
            self._children.clear()

    @property
    def nbytes(self) -> int:
        """Memory of the blocks kept or being read."""
        return 0 if self.pool is None else self.pool.used * self.pool.block_bytes

    def lookup(self, token_ids: Sequence[int], namespaces: Sequence[str], limit: int,
               beyond: int = 0) -> PrefixHit | None:  # fmt: skip
        """The longest kept prefix of ``token_ids`` (at most ``limit`` tokens) in any of ``namespaces``;
        None unless it covers more than ``beyond`` tokens (then nothing is copied)."""
        token_ids = list(token_ids[:limit])
        with self._lock:
            walks = [(self._walk(token_ids, namespace), namespace) for namespace in namespaces]
            (length, path), namespace = max(walks, key=lambda walk: walk[0][0])
            if length <= beyond:
                return None
            self._touch([key for key, _ in path])
            held = [self._index[key].block for key, _ in path]
            self.pool.ref(held)
        try:  # the references keep the blocks whole while they are copied, without the lock
            parts = [(self.pool.kv(block), used) for block, (_, used) in zip(held, path)]
            keys = torch.cat([kv[0][:, :, :used] for kv, used in parts], dim=2)
            values = torch.cat([kv[1][:, :, :used] for kv, used in parts], dim=2)
        finally:
            self.pool.unref(held)
        return PrefixHit(length, keys, values, namespace)

    def _walk(self, token_ids: list[int], namespace: str) -> tuple[int, list[tuple[int, int]]]:
        """Whole blocks while one matches the next tokens, then the longest matching start of one:
        the length covered and the path's (key, tokens used)."""
        node, length, path = _root(namespace), 0, []
        while length < len(token_ids):
            best, best_used = None, 0
            for key in self._children.get(node, ()):
                used = _common(self._index[key].tokens, token_ids[length:])
                whole = used == len(self._index[key].tokens)
                if used > best_used or (used == best_used and best is not None and whole):
                    best, best_used = key, used
            if best is None:
                break
            path.append((best, best_used))
            length += best_used
            if best_used < len(self._index[best].tokens):
                break
            node = best
        return length, path

    def _find(self, parent: int, tokens: tuple[int, ...]) -> int | None:
        """The key of the kept block of ``tokens`` under ``parent``, if kept (its tokens checked, not
        only its key)."""
        key = block_key(parent, tokens)
        found = self._index.get(key)
        return key if found is not None and found.parent == parent and found.tokens == tokens else None

    def kept(self, token_ids: Sequence[int], namespace: str) -> int:
        """How many leading tokens of ``token_ids`` whole kept blocks already hold (a multiple of the
        block size): ``remember`` needs their KV no more."""
        parent, length = _root(namespace), 0
        with self._lock:
            while length + self.block <= len(token_ids):
                key = self._find(parent, tuple(token_ids[length : length + self.block]))
                if key is None:
                    break
                parent, length = key, length + self.block
        return length

    def remember(self, token_ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor, namespace: str,
                 start: int = 0) -> int:  # fmt: skip
        """Keep the blocks of ``token_ids`` not kept yet; ``keys``/``values`` are the raw KV of tokens
        ``start..`` (``[layers, kv_heads, len - start, head_dim]``; ``start`` from ``kept``, the blocks
        before it are kept already). Returns how many blocks were added."""
        added, parent, path = 0, _root(namespace), []
        on_path: set[int] = set()  # never dropped to make room for the blocks after them
        with self._lock:
            if self.pool is None:
                layers, heads, _, head_dim = keys.shape
                self.pool = BlockPool(layers, heads, self.block, head_dim, keys.dtype, keys.device, self.budget_bytes)
            if not self.pool.fits(keys):
                raise ValueError(f"KV {tuple(keys.shape)} {keys.dtype} on {keys.device} does not fit this "
                                 f"cache's blocks {self.pool.shape} {self.pool.dtype} on {self.pool.device}")
            for first in range(0, len(token_ids), self.block):
                tokens = tuple(token_ids[first : first + self.block])
                key = self._find(parent, tokens)
                if key is None:
                    if first < start:
                        break  # dropped since ``kept`` looked: the blocks after it would hang under nothing
                    key = block_key(parent, tokens)
                    if key in self._index:  # another block under this key: leave it
                        break
                    block = self._allocate(on_path)
                    if block is None:
                        break
                    rows = slice(first - start, first - start + len(tokens))
                    block_keys, block_values = self.pool.kv(block)
                    block_keys[:, :, : len(tokens)] = keys[:, :, rows]
                    block_values[:, :, : len(tokens)] = values[:, :, rows]
                    self._index[key] = _Block(block, parent, tokens)
                    self._children.setdefault(parent, []).append(key)
                    added += 1
                parent = key
                path.append(key)
                on_path.add(key)
            self._touch(path)
        return added

    def _allocate(self, keep: set[int]) -> int | None:
        """A pool block, dropping least recently used blocks no reader holds (none of ``keep``) while
        the pool is full."""
        while True:
            block = self.pool.allocate()
            if block is not None:
                return block
            victim = next((key for key, kept in self._index.items()
                           if key not in keep and self.pool.refs(kept.block) == 1), None)  # fmt: skip
            if victim is None:
                return None
            self._drop(victim)

    def _drop(self, key: int) -> None:
        """Forget a block and every block under it (no chain reaches them any more)."""
        block = self._index.pop(key)
        self.pool.unref([block.block])
        siblings = self._children.get(block.parent, [])
        if key in siblings:
            siblings.remove(key)
        if not siblings:
            self._children.pop(block.parent, None)
        for child in list(self._children.get(key, ())):
            self._drop(child)

    def _touch(self, path: list[int]) -> None:
        """Mark a path used, its first block last: dropping takes a path's deepest blocks first."""
        for key in reversed(path):
            self._index.move_to_end(key)
