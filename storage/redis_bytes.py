"""`RedisBytes`: a `ByteTier` on a Redis (or Valkey) server, shared by every process that opens it.

* Values are the framed bytes the disk holds (the store has one codec) behind the keyed MAC of
  `AuthenticatedBytes`, which a store always puts in front of this tier (`tier_list.remote_tier`):
  a value is used only when its MAC verifies, then `CodedTier` checks it (checksum, key binding)
  and discards a corrupt one. Nothing read from the server is unpickled or run, and with a secret
  a value written without it is a miss (on a trusted network, the server is trusted with bytes).
* Keys live under a prefix (`fusionrag:kv:` by default), so a Redis database can hold other data;
  the budget's used bytes and each entry's heat live in Redis too (the layout below), and
  every write is one Lua script (atomic), so processes agree on what is held and what is cold.
* Budget eviction is by heat (access count with exponential decay over wall time, as on disk).
* The server going away is never fatal: a failed call is logged (once per back-off interval) and
  counted in `write_failures` when it was a write; then the tier stops calling the server for
  `retry_s` seconds. Meanwhile reads are misses and writes return False, so the store falls back
  to its local tiers. The `redis` client is imported only when a tier is opened.

The Lua scripts at the end run one per operation. Layout under a prefix `p` (`RedisBytes.prefix`):
`p e:<key>` holds a value (the framed bytes the disk holds, after their MAC), the hash `p size` each
value's length, the sorted set `p heat` each key's heat time (see `heat.bump_heat_time`) and
`p used` the sum of the sizes. Every script keeps the four in step. Scripts touch only keys under the
prefix (value keys are built from it, so this tier needs a single Redis server, not a cluster).
Their KEYS are [size hash, heat zset, used counter]; the value key is `ARGV[1] .. 'e:' .. key`.
"""

from __future__ import annotations

import errno
import logging
import time
from urllib.parse import urlsplit, urlunsplit

from .byte_tier import ByteTierBase
from .errors import StoreWriteError
from .keys import check_key, is_store_key

logger = logging.getLogger(__name__)
SCHEMES = ("redis", "rediss", "unix")
DEFAULT_PREFIX = "fusionrag:kv:"


def check_remote_url(url: object) -> str:
    """`url` when it names a Redis server, else `ValueError` saying what is allowed.

    Example:
        >>> check_remote_url("redis://127.0.0.1:6379/0")
        'redis://127.0.0.1:6379/0'
        >>> check_remote_url("http://x")
        Traceback (most recent call last):
        ...
        ValueError: remote_url must start with redis://, rediss:// or unix://, got 'http://x'
    """
    if not isinstance(url, str) or urlsplit(url).scheme not in SCHEMES or not url.split("://", 1)[1]:
        raise ValueError(f"remote_url must start with redis://, rediss:// or unix://, got {url!r}")
    return url


def redacted(url: str) -> str:
    """`url` without its password, for log lines."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class RedisBytes(ByteTierBase):
    """Values (bytes) by store key on a Redis server, within `budget_bytes`; a `ByteTier`."""

    name = "remote"
    shared = True  # every put writes through to it (see `TieredStore.put`)

    def __init__(self, url: str, budget_bytes: int, *, prefix: str = DEFAULT_PREFIX, timeout_s: float = 0.5,
                 retry_s: float = 30.0, read_only: bool = False, heat_half_life_s: float = 3600.0):  # fmt: skip
        try:
            import redis
        except ImportError as exc:
            raise ImportError("a remote KV tier needs the redis client: pip install 'fusionrag-llm[remote]'") from exc
        super().__init__()
        self.url, self.where = check_remote_url(url), redacted(url)
        self.prefix, self.budget_bytes = prefix, budget_bytes
        self.retry_s, self.heat_half_life_s = retry_s, heat_half_life_s
        self._read_only = read_only
        self._down_until = 0.0  # monotonic time before which the server is not called
        self._errors = (redis.RedisError, OSError)
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._keys = [prefix + "size", prefix + "heat", prefix + "used"]
        self._scripts = {name: self._client.register_script(script) for name, script in SCRIPTS.items()}
        if self._call("connect", self._client.ping) is not None:
            logger.info("remote KV tier at %s (prefix %r): %d entries", self.where, prefix, len(self))

    def __repr__(self) -> str:
        return f"RedisBytes({self.where!r}, prefix={self.prefix!r}, budget={self.budget_bytes} B)"

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def available(self) -> bool:
        """False while the tier waits out the back-off after a failed call."""
        return time.monotonic() >= self._down_until

    # ----------------------------------------------------------------------------- server calls
    def _call(self, what: str, fn, *args, write: bool = False, **kwargs):
        """`fn(*args, **kwargs)`, or None when the server is down or waiting out its back-off."""
        if not self.available:
            if write:
                self._count("write_failures")
            return None
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            self._failed(what, exc, write)
            return None

    def _failed(self, what: str, exc: BaseException, write: bool) -> None:
        with self._lock:
            self.write_failures += int(write)
            first = time.monotonic() >= self._down_until
            self._down_until = time.monotonic() + self.retry_s
        if first:  # once per back-off interval
            logger.warning("remote KV tier at %s unreachable (%s failed: %s); using local tiers only, retrying in "
                           "%g s (%d failed writes so far)", self.where, what, exc, self.retry_s, self.write_failures)  # fmt: skip

    def _run(self, script: str, args: list, write: bool = False):
        return self._call(script, self._scripts[script], keys=self._keys, args=[self.prefix, *args], write=write)

    # ----------------------------------------------------------------------------- ByteTier
    def __contains__(self, key: object) -> bool:
        return is_store_key(key) and bool(self._call("hexists", self._client.hexists, self._keys[0], key))

    def __len__(self) -> int:
        return int(self._call("hlen", self._client.hlen, self._keys[0]) or 0)

    def head(self, key: str, size: int) -> bytes | None:
        """The first `size` bytes of the value under `key` (without reading the rest), or None:
        absent or down. Lets `AuthenticatedBytes` tell whose secret wrote a value."""
        check_key(key)
        found = self._call("getrange", self._client.getrange, self.prefix + "e:" + key, 0, size - 1)
        return found or None

    def keys(self) -> list[str]:
        found = self._call("hkeys", self._client.hkeys, self._keys[0]) or []
        return [k.decode() for k in found if is_store_key(k.decode(errors="replace"))]

    @property
    def used_bytes(self) -> int:
        used = self._call("get", self._client.get, self._keys[2])
        return max(0, int(used)) if used is not None else 0

    def get(self, key: str) -> bytes | None:
        """The bytes under `key` (counting an access in its shared heat), or None: absent or down."""
        check_key(key)
        bump = "0" if self.read_only else "1"

        def read():  # one round trip: the value, and its access counted by a script that does not copy it
            pipe = self._client.pipeline(transaction=False)
            pipe.get(self.prefix + "e:" + key)
            self._scripts["touch"](keys=self._keys, args=[self.prefix, key, time.time(), self.heat_half_life_s, bump],
                                   client=pipe)  # fmt: skip
            return pipe.execute()[0]

        return self._call("get", read)

    def put(self, key: str, data: bytes, *, persist: bool = False) -> bool:
        """Store `data` under `key`, evicting the coldest entries to stay within the budget."""
        check_key(key)
        refused = self.refused_put(key, data, persist)
        if refused is not None:
            return refused
        evicted = self._run("put", [key, data, time.time(), self.budget_bytes], write=True)
        if evicted is None:
            return self.refuse(key, persist, ConnectionError(f"the Redis server at {self.where} is unreachable"))
        if evicted < 0:
            return self.refuse(key, persist, ValueError(f"no room within the budget of {self.budget_bytes} bytes"))
        with self._lock:
            self.evictions += evicted
        return True

    def delete(self, key: str) -> bool:
        check_key(key)
        if self.read_only:
            return False
        return bool(self._run("delete", [key, b""], write=True))

    def discard(self, key: str, data: bytes) -> bool:
        """Remove `key` only while it still holds `data` (another process may have rewritten it)."""
        if self.read_only:
            return False
        return bool(self._run("delete", [key, data], write=True))

    def clear(self) -> None:
        if self.read_only:
            raise StoreWriteError(self.where, None, OSError(errno.EROFS, "the remote tier is read-only; cannot clear it"))
        self._run("clear", [], write=True)

    def close(self) -> None:
        self._client.close()


# Shared by the scripts: drop one key's value and bookkeeping; returns the bytes it freed.
_DROP = """
local function drop(prefix, key)
  local size = tonumber(redis.call('HGET', KEYS[1], key) or '0')
  redis.call('DEL', prefix .. 'e:' .. key)
  redis.call('HDEL', KEYS[1], key)
  redis.call('ZREM', KEYS[2], key)
  if size > 0 then redis.call('DECRBY', KEYS[3], size) end
  return size
end
local function bump(old, now, half_life)
  if not old then return now end
  local high, low = math.max(old, now), math.min(old, now)
  return high + half_life * math.log(1 + 2 ^ ((low - high) / half_life)) / math.log(2)
end
"""

# ARGV: prefix, key, data, now, budget, half_life. Returns evicted count, or -1 when it did not fit.
PUT = _DROP + """
local prefix, key, data = ARGV[1], ARGV[2], ARGV[3]
local now, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local heat = redis.call('ZSCORE', KEYS[2], key)
drop(prefix, key)
redis.call('SET', prefix .. 'e:' .. key, data)
redis.call('HSET', KEYS[1], key, #data)
redis.call('ZADD', KEYS[2], heat or now, key)
local used = redis.call('INCRBY', KEYS[3], #data)
local evicted = 0
while used > budget do
  local coldest = redis.call('ZRANGE', KEYS[2], 0, 1)
  local victim = coldest[1]
  if victim == key then victim = coldest[2] end
  if not victim then break end
  drop(prefix, victim)
  evicted = evicted + 1
  used = tonumber(redis.call('GET', KEYS[3]))
end
if used > budget then
  drop(prefix, key)
  return -1
end
return evicted
"""

# ARGV: prefix, key, now, half_life, bump (1: count an access). Returns 1 when the value exists.
# The value itself is read by a plain GET in the same round trip (`RedisBytes.get`): a script that
# returned it would copy every byte through Lua (three times slower for a 26 MiB entry).
TOUCH = _DROP + """
local prefix, key = ARGV[1], ARGV[2]
if redis.call('EXISTS', prefix .. 'e:' .. key) == 0 then
  if redis.call('HEXISTS', KEYS[1], key) == 1 then drop(prefix, key) end  -- evicted by Redis itself
  return 0
end
if ARGV[5] == '1' then
  local old = redis.call('ZSCORE', KEYS[2], key)
  redis.call('ZADD', KEYS[2], bump(old and tonumber(old), tonumber(ARGV[3]), tonumber(ARGV[4])), key)
end
return 1
"""

# ARGV: prefix, key, expected data ('' for any). Returns 1 when removed.
DELETE = _DROP + """
local prefix, key = ARGV[1], ARGV[2]
if ARGV[3] ~= '' and redis.call('GET', prefix .. 'e:' .. key) ~= ARGV[3] then return 0 end
if redis.call('EXISTS', prefix .. 'e:' .. key) == 0 and redis.call('HEXISTS', KEYS[1], key) == 0 then return 0 end
drop(prefix, key)
return 1
"""

# ARGV: prefix. Removes every value of this prefix and the bookkeeping. Returns the count removed.
CLEAR = """
local prefix = ARGV[1]
local keys = redis.call('HKEYS', KEYS[1])
for i = 1, #keys do redis.call('DEL', prefix .. 'e:' .. keys[i]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return #keys
"""

SCRIPTS = {"put": PUT, "touch": TOUCH, "delete": DELETE, "clear": CLEAR}
