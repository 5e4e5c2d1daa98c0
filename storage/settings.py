"""Settings of the tiered store as typed, validated dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from .redis_bytes import check_remote_url

GiB = 2**30
MiB = 2**20


def _check_non_negative_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}.{name} must be an int >= 0 (bytes), got {value!r}")


@dataclass(frozen=True)
class StoreBudgets:
    """Byte budget of each tier; a tier never holds more than its budget.

    `device_bytes` is used only when the store is given a CUDA device (there is no device tier on
    CPU). `disk_bytes` counts the entry files plus the live pages of the SQLite index.
    `remote_bytes` is the remote tier's (used only with `StoreOptions.remote_url`): the sum of its
    values' sizes, shared by every process using it (the last writer's budget applies).
    A budget of 0 disables the tier.
    """

    device_bytes: int = 1 * GiB
    host_bytes: int = 2 * GiB
    disk_bytes: int = 20 * GiB
    remote_bytes: int = 20 * GiB

    def __post_init__(self) -> None:
        for name in ("device_bytes", "host_bytes", "disk_bytes", "remote_bytes"):
            _check_non_negative_int("StoreBudgets", name, getattr(self, name))


@dataclass(frozen=True)
class StoreOptions:
    """Tuning knobs of `TieredStore` beyond budgets.

    * `heat_half_life`: store accesses after which an entry's heat halves (heat is an access count
      with exponential decay on a logical clock that ticks on every get/put).
    * `copy_on_get`: `get` returns fresh tensors by default, so a caller that modifies them in place
      cannot corrupt the store; pass `copy=False` to `get` for the zero-copy path.
    * `disk_min_file_bytes`: entries of at least this size are files next to the disk tier's SQLite
      index, smaller ones live inside it.
    * `disk_timeout_s`: how long a process waits for the SQLite lock held by another one; a write
      still waiting then fails like one on a full disk (see `TieredStore.put`).
    * `read_only`: open the disk tier without writing to it (a precomputed store shared by several
      users). A folder that cannot take writes is opened read-only without asking.
    * `codec`: id of the codec the disk tier stores entries with, looked up in
      `codec_registry.CODECS` when the store opens (`"raw"`: tensors as they are, checksummed).
    * `shared_heat_half_life_s`: seconds after which an entry's heat halves in the tiers processes
      share (disk folder, remote tier); they evict the coldest first. Wall time, as those processes
      share no access clock.
    * `remote_url`: a Redis/Valkey server (`redis://host:port/db`, `rediss://...`, `unix://path`)
      holding a tier several engines share, after the disk: what one computes, the others load.
      Plain data, so a worker process opens the same store from these settings. See `redis_bytes.py`.
    * `remote_prefix`: prefix of every Redis key the tier uses (the db may hold other data).
    * `remote_timeout_s`: connect and read timeout of one call to the server.
    * `remote_retry_s`: after a failed call, how long the remote tier is skipped (reads miss, writes
      stay local) before it is tried again; the failure is logged once per interval.
    """

    heat_half_life: float = 1024.0
    copy_on_get: bool = True
    disk_min_file_bytes: int = 32 * 1024
    disk_timeout_s: float = 60.0
    read_only: bool = False
    codec: str = "raw"
    shared_heat_half_life_s: float = 3600.0
    remote_url: str | None = None
    remote_prefix: str = "fusionrag:kv:"
    remote_timeout_s: float = 0.5
    remote_retry_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.heat_half_life, (int, float)) or not self.heat_half_life > 0:
            raise ValueError(f"StoreOptions.heat_half_life must be a number > 0, got {self.heat_half_life!r}")
        if not isinstance(self.copy_on_get, bool):
            raise ValueError(f"StoreOptions.copy_on_get must be a bool, got {self.copy_on_get!r}")
        _check_non_negative_int("StoreOptions", "disk_min_file_bytes", self.disk_min_file_bytes)
        if not isinstance(self.disk_timeout_s, (int, float)) or not self.disk_timeout_s > 0:
            raise ValueError(f"StoreOptions.disk_timeout_s must be a number > 0, got {self.disk_timeout_s!r}")
        if not isinstance(self.read_only, bool):
            raise ValueError(f"StoreOptions.read_only must be a bool, got {self.read_only!r}")
        if not isinstance(self.codec, str) or not self.codec:
            raise ValueError(f"StoreOptions.codec must be a registered codec id such as 'raw', got {self.codec!r}")
        for name in ("shared_heat_half_life_s", "remote_timeout_s"):
            _check_positive("StoreOptions", name, getattr(self, name))
        if not isinstance(self.remote_retry_s, (int, float)) or isinstance(self.remote_retry_s, bool) or self.remote_retry_s < 0:
            raise ValueError(f"StoreOptions.remote_retry_s must be a number >= 0 (seconds), got {self.remote_retry_s!r}")
        if self.remote_url is not None:
            check_remote_url(self.remote_url)
        if not isinstance(self.remote_prefix, str) or not self.remote_prefix:
            raise ValueError(f"StoreOptions.remote_prefix must be a non-empty str, got {self.remote_prefix!r}")


def _check_positive(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}.{name} must be a number > 0 (seconds), got {value!r}")
