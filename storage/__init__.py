"""Content-addressed, tiered store of KV entries. Depends on torch and diskcache only."""

from .codec import CorruptEntryError, decode, encode
from .disk_tier import DiskTier, VerifyReport
from .entry import KVEntry
from .heat import HeatTracker
from .keys import chunk_key, model_fingerprint, path_key
from .ledger import TierLedger
from .loader import LoaderStats, LoadResult, PrefetchLoader
from .memory_tier import DeviceTier, HostTier, MemoryTier
from .settings import StoreBudgets, StoreOptions
from .stats import StoreStats, TierStats
from .tiered import TieredStore

__all__ = [
    "CorruptEntryError",
    "DeviceTier",
    "DiskTier",
    "HeatTracker",
    "HostTier",
    "KVEntry",
    "LoadResult",
    "LoaderStats",
    "MemoryTier",
    "PrefetchLoader",
    "StoreBudgets",
    "StoreOptions",
    "StoreStats",
    "TierLedger",
    "TierStats",
    "TieredStore",
    "VerifyReport",
    "chunk_key",
    "decode",
    "encode",
    "model_fingerprint",
    "path_key",
]
