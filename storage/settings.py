"""Settings of the tiered store as typed, validated dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

from .mac_bytes import check_secret
from .redis_bytes import check_remote_url, redacted

GiB = 2**30


def _check(owner: object, kinds: tuple[type, ...], test, allowed: str, *names: str) -> None:
    """`ValueError` naming the first field of `names` that is not one of `kinds` (a bool only where
    `kinds` says so) passing `test`."""
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds) or not test(value):
            raise ValueError(f"{type(owner).__name__}.{name} must be {allowed}, got {value!r}")


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
        _check(self, (int,), lambda v: v >= 0, "an int >= 0 (bytes)", "device_bytes", "host_bytes", "disk_bytes",
               "remote_bytes")  # fmt: skip


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
    * `remote_prefix`: prefix of every Redis key the tier uses (the db may hold other data); with a
      secret, followed by the secret's id (`tier_list.remote_key_prefix`): one key space per secret.
    * `remote_timeout_s`: connect and read timeout of one call to the server.
    * `remote_retry_s`: after a failed call, how long the remote tier is skipped (reads miss, writes
      stay local) before it is tried again; the failure is logged once per interval.
    * `remote_secret`: the key of the MAC every value of the remote tier carries (a str of at least
      16 characters, the same in every engine sharing the tier); a value whose MAC does not verify
      is a miss. Not shown by `repr`. See `mac_bytes.py`.
    * `remote_trusted`: True opens the remote tier without a secret, on a network where everyone
      who can write the server is trusted: values carry no MAC, and a forged one with a valid
      checksum is served. A remote tier needs exactly one of `remote_secret` and `remote_trusted`.
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
    remote_secret: str | None = field(default=None, repr=False)
    remote_trusted: bool = False

    def __post_init__(self) -> None:
        number = (int, float)
        _check(self, number, lambda v: v > 0, "a number > 0", "heat_half_life", "disk_timeout_s",
               "shared_heat_half_life_s", "remote_timeout_s")  # fmt: skip
        _check(self, number, lambda v: v >= 0, "a number >= 0 (seconds)", "remote_retry_s")
        _check(self, (int,), lambda v: v >= 0, "an int >= 0 (bytes)", "disk_min_file_bytes")
        _check(self, (bool,), lambda v: True, "a bool", "copy_on_get", "read_only", "remote_trusted")
        _check(self, (str,), bool, "a registered codec id such as 'raw'", "codec")
        _check(self, (str,), bool, "a non-empty str", "remote_prefix")
        if self.remote_secret is not None:
            check_secret(self.remote_secret)
        if self.remote_url is not None:
            check_remote_url(self.remote_url)
            self._check_remote_auth()

    def _check_remote_auth(self) -> None:
        """A remote tier needs a secret, or the explicit word that its network is trusted: not both."""
        if self.remote_secret is not None and self.remote_trusted:
            raise ValueError(
                "remote_secret and remote_trusted=True exclude each other: with a secret the remote "
                "tier's values are authenticated, on a trusted network they are not; set one"
            )
        if self.remote_secret is None and not self.remote_trusted:
            raise ValueError(
                f"the remote tier at {redacted(self.remote_url)} needs a secret to authenticate its values (anyone "
                "who can write the server could otherwise plant KV that is served): set remote_secret to the "
                f"same string of at least 16 characters in every engine sharing it ($FUSIONRAG_REMOTE_SECRET for "
                "engines and the CLI), or remote_trusted=True ($FUSIONRAG_REMOTE_TRUSTED=1) on a network where "
                "everyone who can write the server is trusted (docs/SECURITY.md)"
            )
