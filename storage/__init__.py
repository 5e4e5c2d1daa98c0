"""Content-addressed, tiered store of KV entries. Depends on torch only (and SQLite, in the stdlib).

The disk tier is safe to share and robust to faults: it never runs code, follows a link or touches
a file outside its folder whatever `cache.db` holds, binds every entry to its key, survives a full
disk, a killed writer and a read-only folder, and reports a damaged index with the fix
(`StoreDamagedError`). A reader states the form it can use an entry in (`EntryForm`: layers, kv
heads, head dim, dtype or packing, finite values) and refuses entries that do not fit it.

Pluggable parts: a codec (`EntryCodec`; `RawCodec` by default, `QuantCodec` for int8/fp8/int4 entries,
others registered in `CODECS` by id; `kv_tensors` expands a packed entry on the compute device),
byte tiers (`ByteTier`: the disk's `DiskBytes`, a Redis server's `RedisBytes`, the latter behind
`AuthenticatedBytes`: values tagged with a keyed MAC) behind a codec (`CodedTier`), a
tier list fastest first (`TieredStore.from_tiers`), and pins (`TieredStore.pin`/`pinned`) that keep
entries handed out without a copy from being evicted. `open_store` opens the store an engine uses
(a folder, its recorded `kv_codec`, `":memory:"`).
"""

from .byte_tier import ByteTier
from .codec import CorruptEntryError, EntryCodec, RawCodec, StaleEntryError
from .codec_registry import CODECS, CodecRegistry
from .coded_tier import CodedTier
from .disk import DiskBytes, DiskTier
from .disk_files import entry_files
from .disk_repair import RebuildReport, clear_damaged, quarantine_index, rebuild_index
from .entry import KVEntry
from .entry_form import EntryForm
from .errors import StoreConfigError, StoreDamagedError, StoreWriteError
from .heat import HeatTracker
from .keys import chunk_key, path_key
from .loader import LoadResult, PrefetchLoader
from .mac_bytes import AuthenticatedBytes
from .memory_tier import DeviceTier, HostTier, MemoryTier, TierLedger
from .no_follow import UnsafePathError, read_file_in
from .pins import PinTable
from .quant_codec import QuantCodec
from .quantize import kv_tensors
from .record_log import AppendSession, FileRecordLog, MemoryRecordLog, RecordLog
from .redis_bytes import RedisBytes  # imports the redis client only when one is opened
from .settings import StoreBudgets, StoreOptions
from .stats import StoreStats, TierStats, VerifyReport
from .store import open_store
from .tier_list import remote_key_prefix
from .tiered import TieredStore

__all__ = [
    "AppendSession", "AuthenticatedBytes", "ByteTier", "CODECS", "CodecRegistry", "CodedTier",
    "CorruptEntryError", "DeviceTier", "DiskBytes", "DiskTier", "EntryCodec", "EntryForm", "FileRecordLog",
    "HeatTracker", "HostTier", "KVEntry", "LoadResult", "MemoryRecordLog", "MemoryTier", "PinTable",
    "PrefetchLoader", "QuantCodec", "RawCodec", "RebuildReport", "RecordLog", "RedisBytes", "StaleEntryError",
    "StoreBudgets", "StoreConfigError", "StoreDamagedError", "StoreOptions", "StoreStats", "StoreWriteError",
    "TierLedger", "TierStats", "TieredStore", "UnsafePathError", "VerifyReport", "chunk_key", "clear_damaged",
    "entry_files", "kv_tensors", "open_store", "path_key", "quarantine_index", "read_file_in", "rebuild_index",
    "remote_key_prefix",
]  # fmt: skip
