"""Lua scripts the Redis tier runs on the server: one script per operation, so each is atomic.

Layout under a prefix `p` (`RedisBytes.prefix`): `p e:<key>` holds a value (the framed bytes the
disk holds), the hash `p size` each value's length, the sorted set `p heat` each key's heat time
(see `heat.bump_heat_time`) and `p used` the sum of the sizes. Every script keeps the four in step,
so several processes agree on what the tier holds, how much of its budget is used and what is cold.
Scripts touch only keys under the prefix (value keys are built from it, so this tier needs a
single Redis server, not a cluster).

KEYS = [size hash, heat zset, used counter]; the value key is `ARGV[1] .. 'e:' .. key`.
"""

from __future__ import annotations

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
