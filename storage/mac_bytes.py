"""`AuthenticatedBytes`: a shared byte tier whose values carry a keyed MAC, so only holders of the
secret can write values that are served.

Whoever can write a shared tier (a Redis server, say) can write any bytes under any key, and the
checksum in every frame (`frame.py`) is one anyone can compute: it proves integrity, not origin.
This wrapper, put in front of every shared byte tier (`tier_list.remote_tier`), stores each value as

    MAGIC b"FRKA" | secret id (8 bytes) | tag (32 bytes) | the frame

with tag = HMAC-SHA256(secret, MAGIC | store key | frame), and passes a value read on only when its
tag verifies for the key it was read under. Anything else (no tag, a tag made with another secret,
a forged or truncated one, a value moved to another key) is a miss: counted in `corrupt_count`,
logged (the first, then every `WARN_EVERY`-th at warning level, the others at debug level, so two
engines with different secrets do not flood the log) and discarded from the tier unless it is
read-only, so that the entry recomputed on the miss takes its place. The frame's own checks
(checksum, key binding, codec) and the reader's entry-form checks run on what passes.

The secret id (the first bytes of an HMAC of a fixed text; it tells nothing of the secret) names
which secret a value was written with. It authenticates nothing (anyone can copy it), but lets a
reader tell another secret's value from a forged one in its log, and lets `in` say no to another
secret's values without reading them, when the byte tier can read a value's first bytes
(`head(key, n)`, as `RedisBytes` does): an engine then computes and ingests what only engines with
another secret have stored, as it would on an empty tier.

Trusted network (`secret=None`, chosen explicitly in the store's settings): values are written as
bare frames, the bytes older builds write and read, and a tagged value is read without checking its
tag, since every writer of the tier is trusted.

Example:
    >>> from fusionrag_llm.storage.disk import DiskBytes
    >>> import tempfile
    >>> tier = AuthenticatedBytes(DiskBytes(tempfile.mkdtemp(), budget_bytes=2**20), "s" * 16)
    >>> tier.put("ab" * 32, b"frame bytes"), tier.get("ab" * 32)
    (True, b'frame bytes')
    >>> other = AuthenticatedBytes(tier.tier, "another secret!!")
    >>> other.get("ab" * 32) is None, other.corrupt_count
    (True, 1)
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from operator import attrgetter

from .byte_tier import ByteTier, Classify
from .keys import is_store_key
from .stats import VerifyReport

logger = logging.getLogger(__name__)
MAGIC = b"FRKA"
ID_BYTES = 8
TAG_BYTES = 32
HEAD_BYTES = len(MAGIC) + ID_BYTES + TAG_BYTES  # before the frame
MIN_SECRET_CHARS = 16
WARN_EVERY = 100  # after the first refused value, warn again every this many (the others: debug)


def check_secret(secret: object) -> str:
    """`secret` when it can key the MAC (a str of at least `MIN_SECRET_CHARS` characters), else
    `ValueError` saying what is allowed; the message never shows the secret itself."""
    if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS:
        got = f"a str of {len(secret)} characters" if isinstance(secret, str) else type(secret).__name__
        raise ValueError(f"remote_secret must be a str of at least {MIN_SECRET_CHARS} characters (e.g. "
                         f"python -c 'import secrets; print(secrets.token_hex(32))'), got {got}")  # fmt: skip
    return secret


def secret_id(secret: bytes) -> bytes:
    """The id of `secret` written in every value: an HMAC of a fixed text, cut short."""
    return hmac.new(secret, b"fusionrag_llm remote secret id", hashlib.sha256).digest()[:ID_BYTES]


def mac_tag(secret: bytes, key: str, data: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of `data` stored under `key`: binds the value to the key as well as the secret."""
    mac = hmac.new(secret, MAGIC, hashlib.sha256)
    mac.update(key.encode("ascii"))
    mac.update(data)
    return mac.digest()


class AuthenticatedBytes:
    """`tier`'s values tagged with a MAC under `secret` (None: a trusted network, no tags); a `ByteTier`."""

    def __init__(self, tier: ByteTier, secret: str | None):
        if not isinstance(tier, ByteTier):
            raise ValueError(f"tier must have the ByteTier shape (get/put/delete/discard/...), got {tier!r}")
        self.tier = tier
        self._secret = None if secret is None else check_secret(secret).encode("utf-8")
        self._head = b"" if self._secret is None else MAGIC + secret_id(self._secret)
        self.refused = 0  # values whose tag did not verify (this process)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AuthenticatedBytes({self.tier!r}, {'keyed' if self.authenticated else 'trusted network'})"

    @property
    def authenticated(self) -> bool:
        """False on a trusted network: values carry no MAC."""
        return self._secret is not None

    # ----------------------------------------------------------------------------- the tier's own
    # name, read_only, budget_bytes, used_bytes, evictions, write_failures, len, keys, stats, delete,
    # clear and close are the tier's, passed through unchanged (set below the class)
    @property
    def where(self) -> str:
        return str(getattr(self.tier, "where", self.tier.name))

    @property
    def shared(self) -> bool:
        return bool(getattr(self.tier, "shared", False))

    @property
    def corrupt_count(self) -> int:
        """Values refused here (no valid MAC) plus those the tier refused to read itself."""
        return self.refused + self.tier.corrupt_count

    def __contains__(self, key: object) -> bool:
        """Whether `key` holds a value, written with this secret when the tier can tell cheaply (`head`)."""
        head = getattr(self.tier, "head", None)
        if self._secret is None or head is None or not is_store_key(key):
            return key in self.tier
        return head(key, len(self._head)) == self._head  # one round trip: None when absent

    # ----------------------------------------------------------------------------- values
    def seal(self, key: str, data: bytes) -> bytes:
        """What is stored for `data` under `key`: tagged, or as it is on a trusted network."""
        if self._secret is None:
            return data
        return b"".join((self._head, mac_tag(self._secret, key, data), data))

    def unseal(self, key: str, stored: bytes) -> tuple[bytes | None, str]:
        """`(the value, "")` when `stored` may be served under `key`, else `(None, why not)`."""
        tagged = stored[: len(MAGIC)] == MAGIC and len(stored) >= HEAD_BYTES
        if self._secret is None:
            return (stored[HEAD_BYTES:] if tagged else stored), ""
        if not tagged:
            return None, "it carries no MAC (written on a trusted network, by an older version, or forged)"
        data = stored[HEAD_BYTES:]
        if not hmac.compare_digest(stored[len(self._head) : HEAD_BYTES], mac_tag(self._secret, key, data)):
            if stored[: len(self._head)] != self._head:
                return None, "it was written with another secret"
            return None, "its MAC does not verify (forged or damaged)"
        return data, ""

    def get(self, key: str) -> bytes | None:
        """The value under `key` when its MAC verifies; a value that fails is a miss (counted,
        logged and discarded, see the module docstring)."""
        stored = self.tier.get(key)
        if stored is None:
            return None
        data, why = self.unseal(key, stored)
        if data is None:
            self._refuse(key, stored, why)
        return data

    def _refuse(self, key: str, stored: bytes, why: str) -> None:
        with self._lock:
            self.refused += 1
            count = self.refused
        level = logging.WARNING if count == 1 or count % WARN_EVERY == 0 else logging.DEBUG
        action = "skipped (read-only store)" if self.read_only else "deleting it"
        logger.log(level, "%s tier: entry %s in %s is not authenticated: %s; treated as a miss, %s (%d refused so "
                   "far)", self.name, key, self.where, why, action, count)  # fmt: skip
        if not self.read_only:
            self.tier.discard(key, stored)

    def put(self, key: str, data: bytes, *, persist: bool = False) -> bool:
        return self.tier.put(key, self.seal(key, data), persist=persist)

    def discard(self, key: str, data: bytes) -> bool:
        """Remove `key` only while it still holds `data` as this tier stored it (tags are deterministic)."""
        return self.tier.discard(key, self.seal(key, data))

    def verify(self, classify: Classify, repair: bool = False) -> VerifyReport:
        """The tier's `verify`, a value without a valid MAC being corrupt (removed unless read-only)."""

        def check(key: str, stored: bytes):
            data, why = self.unseal(key, stored)
            return ("corrupt", f"not authenticated: {why}") if data is None else classify(key, data)

        return self.tier.verify(check, repair)


def _passed_to_tier(name: str):
    """`AuthenticatedBytes.<name>(...)`: the wrapped tier's method, called as it is."""

    def method(self: AuthenticatedBytes, *args, **kwargs):
        return getattr(self.tier, name)(*args, **kwargs)

    method.__name__, method.__qualname__ = name, f"AuthenticatedBytes.{name}"
    method.__doc__ = f"The wrapped tier's `{name}`."
    return method


# What the wrapper adds nothing to, passed through to the tier as members of the class (not
# `__getattr__`: `isinstance(x, ByteTier)` looks members up on the class, with getattr_static).
for _name in ("name", "read_only", "budget_bytes", "used_bytes", "evictions", "write_failures"):
    setattr(AuthenticatedBytes, _name, property(attrgetter(f"tier.{_name}"), doc=f"The wrapped tier's `{_name}`."))
for _name in ("__len__", "keys", "stats", "delete", "clear", "close"):
    setattr(AuthenticatedBytes, _name, _passed_to_tier(_name))
del _name
