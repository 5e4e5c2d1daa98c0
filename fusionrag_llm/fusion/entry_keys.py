"""The key scheme of one model's entries in one store: chunk keys, path-block keys, meta and its check.

Plain Python over ints and strings, so the resolve plan and the offline stage can name every entry
a request or an ingestion touches without a model or a tensor (only ``accepts`` reads a tensor). What an entry claims to be is
checked on every read, not only its bytes: the store binds each entry to its key, and the entry's
meta names its variant and the model fingerprint, so an entry filed under the wrong variant or
written by another model is a miss. Fused entries are laid out as the paper does (most similar
neighbour first); one whose meta names another layout (earlier versions could write them) is a miss.

A store that keeps chunk entries in a lossy dtype (``kv_codec="bf16"`` under float32 compute) or
through a quantizing codec (``kv_codec="int8"``, ...; the codec id fixes its settings) gets a
fingerprint, and so chunk keys, of its own: such KV is approximate. Path blocks are exact KV: a
store of a float codec keeps them in the compute dtype under the model's own fingerprint (the keys
a lossless store gives them); a quantizing codec's store holds none (its tiers keep packed entries).

Example:
    >>> keys = EntryKeys("ab" * 32, s0_ids=(1, 2), lossless=True)
    >>> keys.key((7, 8), "plain") == keys.key((7, 8), "fused")
    False
    >>> keys.path_block_key(None, (1, 2)) == keys.path_key((1, 2))
    True
    >>> bf16 = EntryKeys.for_store("ab" * 32, (1, 2), torch.float32, torch.bfloat16)
    >>> bf16.key((7, 8), "plain") == keys.key((7, 8), "plain"), bf16.path_key((1, 2)) == keys.path_key((1, 2))
    (False, True)
    >>> bf16.lossless, bf16.exact_blocks, EntryKeys.for_store("ab" * 32, (1, 2), torch.float32, None, "int8").exact_blocks
    (False, True, False)
    >>> acme = keys.for_tenant("acme")  # another tenant: every key of its own, the default's unchanged
    >>> acme.key((7, 8), "plain") == keys.key((7, 8), "plain"), acme.path_key((1, 2)) == keys.path_key((1, 2))
    (False, False)
    >>> keys.for_tenant("") is keys
    True
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from fusionrag_llm.storage import EntryForm, KVEntry, chunk_key
from fusionrag_llm.storage.keys import path_block_key, path_key
from fusionrag_llm.storage.quantize import SCHEMES

TokenIds = tuple[int, ...]
RAW_CODEC = "raw"  # today's format: the stored tensors exactly
logger = logging.getLogger(__name__)


def storage_fingerprint(fingerprint: str, model_dtype: torch.dtype, storage_dtype: torch.dtype | None,
                        codec_id: str = RAW_CODEC) -> str:  # fmt: skip
    """The fingerprint keys are made from: the model's own, or a distinct one when the store keeps
    entries in another dtype or through another codec than the raw one (their KV is not the same)."""
    lossy_dtype = storage_dtype is not None and storage_dtype != model_dtype
    if not lossy_dtype and codec_id == RAW_CODEC:
        return fingerprint
    stored_as = str(storage_dtype or model_dtype).removeprefix("torch.")
    tag = f"{fingerprint}:stored-as:{stored_as}" + ("" if codec_id == RAW_CODEC else f":codec:{codec_id}")
    return hashlib.sha256(tag.encode()).hexdigest()


@dataclass(frozen=True)
class EntryKeys:
    """Keys and meta of the entries one model writes to one store, after the canonical prefix S0.

    ``fingerprint`` is the storage fingerprint of chunk entries (see ``for_store``); ``lossless``:
    chunk entries keep the compute dtype's exact numbers; ``block_fingerprint``: the fingerprint of
    exact path blocks kept in the compute dtype beside approximate chunk entries (None: a lossless
    store's blocks share ``fingerprint``, a quantizing codec's store keeps none). ``chunk_form`` and
    ``block_form``: the form a chunk entry and a path block must have to be used (None: unchecked).
    """

    fingerprint: str
    s0_ids: TokenIds
    lossless: bool
    block_fingerprint: str | None = None
    chunk_form: EntryForm | None = None
    block_form: EntryForm | None = None

    @classmethod
    def for_store(cls, fingerprint: str, s0_ids: Sequence[int], model_dtype: torch.dtype,
                  storage_dtype: torch.dtype | None, codec_id: str = RAW_CODEC,
                  kv_shape: tuple[int, int, int] | None = None) -> "EntryKeys":  # fmt: skip
        """A codec other than the raw one may be lossy, so its entries never serve as exact path blocks.
        ``kv_shape``: the model's ``(num_layers, num_kv_heads, head_dim)``; given, every entry read is
        checked against the form this store keeps it in (``chunk_form``, ``block_form``)."""
        lossless = storage_dtype in (None, model_dtype) and codec_id == RAW_CODEC
        blocks = fingerprint if not lossless and codec_id == RAW_CODEC else None
        forms = (None, None) if kv_shape is None else _forms(kv_shape, model_dtype, storage_dtype, codec_id)
        fingerprint = storage_fingerprint(fingerprint, model_dtype, storage_dtype, codec_id)
        return cls(fingerprint, tuple(s0_ids), lossless, blocks, *forms)

    def for_tenant(self, tenant: str) -> EntryKeys:
        """The keys of ``tenant``'s entries (a checked tenant name; ``""``: these keys). Chunk entries,
        fused entries and path blocks of a tenant are all keyed apart from every other tenant's."""
        if not tenant:
            return self
        blocks = None if self.block_fingerprint is None else tenant_fingerprint(self.block_fingerprint, tenant)
        return replace(self, fingerprint=tenant_fingerprint(self.fingerprint, tenant), block_fingerprint=blocks)

    @property
    def exact_blocks(self) -> bool:
        """Whether the store keeps exact path blocks (the alternative path and exact prompt prefixes)."""
        return self.lossless or self.block_fingerprint is not None

    def _owner(self, variant: str) -> str:
        """The fingerprint an entry of ``variant`` is written under."""
        return self.block_fingerprint or self.fingerprint if variant == "path" else self.fingerprint

    def key(self, token_ids: Sequence[int], variant: str) -> str:
        """Key of the chunk's ``variant`` entry (computed after S0)."""
        return chunk_key(self.fingerprint, self.s0_ids, token_ids, variant, None)

    def request_key(self, token_ids: Sequence[int], prefix: Sequence[str]) -> str:
        """Key of the chunk's KV as a request computed it after the chunks ``prefix`` (catalog ids, in
        order): Cache-Craft's request-made variant (``fusion/request_variants.py``)."""
        return chunk_key(self.fingerprint, self.s0_ids, token_ids, "request", {"prefix": list(prefix)})

    def path_block_key(self, previous: str | None, token_ids: Sequence[int]) -> str:
        """Key of the path block ``token_ids`` right after the block keyed ``previous`` (None: position 0)."""
        return path_block_key(self._owner("path"), previous, token_ids)

    def path_key(self, *blocks: Sequence[int]) -> str:
        """Key of the last block of a path of ``blocks`` from position 0."""
        return path_key(self._owner("path"), *blocks)

    def meta(self, variant: str, **extra) -> dict:
        """Meta of an entry this engine writes: what it is and which model computed it."""
        return {"variant": variant, "model": self._owner(variant), **extra}

    def accepts(self, entry: KVEntry, key: str, variant: str) -> bool:
        """Whether a stored entry is what ``key`` asked for: its variant and model, not only its bytes."""
        claimed = (entry.meta.get("variant"), entry.meta.get("model"))
        if claimed != (variant, self._owner(variant)):
            logger.warning("store entry %s claims variant %r of model %.12s, expected %r of %.12s; treated as a miss",
                           key, claimed[0], claimed[1], variant, self._owner(variant))  # fmt: skip
            return False
        layout = entry.meta.get("fused_order", "similar_first")  # the paper's layout names none
        if variant == "fused" and layout != "similar_first":
            logger.warning("store entry %s is a fused entry of layout %r, not the paper's; treated as a miss", key, layout)
            return False
        form = self.block_form if variant == "path" else self.chunk_form
        problem = None if form is None else form.problem(entry)
        if problem is not None:
            logger.warning("store entry %s does not fit this model (%s); treated as a miss", key, problem)
            return False
        return True


def tenant_fingerprint(fingerprint: str, tenant: str) -> str:
    """The fingerprint a tenant's entries are keyed by: the store's own for the default tenant (``""``),
    else a hash of it and the tenant, so no key (nor the model a stored entry names) is another's."""
    if not tenant:
        return fingerprint
    return hashlib.sha256(f"{fingerprint}:tenant:{tenant}".encode()).hexdigest()


def _forms(kv_shape: tuple[int, int, int], model_dtype: torch.dtype, storage_dtype: torch.dtype | None,
           codec_id: str) -> tuple[EntryForm | None, EntryForm]:  # fmt: skip
    """``(chunk form, block form)``: chunk entries as the store keeps them (cast to its dtype, or packed
    by its quantizing codec; None for a codec of unknown form), path blocks in the compute dtype."""
    def name(dtype: torch.dtype) -> str:
        return str(dtype).removeprefix("torch.")

    block = EntryForm(*kv_shape, dtype=name(model_dtype))
    if codec_id == RAW_CODEC:
        return EntryForm(*kv_shape, dtype=name(storage_dtype or model_dtype)), block
    return (EntryForm(*kv_shape, scheme=codec_id) if codec_id in SCHEMES else None), block
