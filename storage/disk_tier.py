"""`DiskTier`: the persistent home of entries, a codec in front of a diskcache folder.

The folder's guarantees (several processes, interrupted writers, no code run and no file touched
outside the folder whatever `cache.db` holds, full disk, read-only folder, damaged index, budget)
are those of `DiskBytes`; the checks on every value read (checksum, key binding, codec) those of
`CodedTier`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .codec import EntryCodec, RawCodec
from .coded_tier import CodedTier
from .disk_bytes import DiskBytes


class DiskTier(CodedTier):
    """Entries as checksummed `codec` bytes in a diskcache folder, within `budget_bytes`.

    `codec` defaults to the raw codec, casting tensors to `storage_dtype` when given (give one or
    the other). `directory`, `read_only`, `evictions`, `write_failures` are the folder's.

    Example:
        >>> import tempfile, torch
        >>> from fusionrag_llm.storage.entry import KVEntry
        >>> tier = DiskTier(tempfile.mkdtemp(), budget_bytes=2**20)
        >>> e = KVEntry((1,), torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
        >>> tier.put("ab" * 32, e), tier.get("ab" * 32).bitwise_equal(e)
        (True, True)
        >>> tier.close()
    """

    def __init__(
        self,
        directory: str | Path,
        budget_bytes: int,
        *,
        codec: EntryCodec | None = None,
        storage_dtype: torch.dtype | None = None,
        min_file_bytes: int = 32 * 1024,
        timeout_s: float = 60.0,
        read_only: bool = False,
        heat_half_life_s: float = 3600.0,
    ):
        if codec is not None and storage_dtype is not None:
            raise ValueError("give DiskTier a codec or a storage_dtype (for the raw codec), not both")
        folder = DiskBytes(directory, budget_bytes, min_file_bytes=min_file_bytes, timeout_s=timeout_s,
                           read_only=read_only, heat_half_life_s=heat_half_life_s)  # fmt: skip
        try:
            super().__init__(folder, codec if codec is not None else RawCodec(storage_dtype))
        except BaseException:
            folder.close()
            raise
        self.storage_dtype = storage_dtype

    def __repr__(self) -> str:
        return (f"DiskTier({str(self.directory)!r}, entries={len(self)}, used={self.used_bytes}/{self.budget_bytes} B, "
                f"codec={self.codec_id!r})")  # fmt: skip

    @property
    def directory(self) -> Path:
        return self.bytes.directory
