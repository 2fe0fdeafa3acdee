"""The one Redis script a settle runs: every fleet-wide budget of one sidecar, updated atomically.

Redis keeps, per budget, a pool the way ``policy.RetryBudget`` keeps it locally (a ratio part fed by the
events members report, capped at ``ratio`` x the events of the last ``window``; a floor bucket refilled at
``rate`` up to ``capacity``), and each member's recent demand. A settle, for each budget: refills with the
time passed on **Redis's own clock** (``TIME``: pod clocks do not matter), adds the member's events and the
unused rest of its last lease, records its demand, and takes its next lease: its share of what is in the pool,
proportional to its demand among the members that report this budget (a little for an idle member, equal
shares when all are idle). Members are a sorted set scored by Redis time; one not seen for ``ttl`` seconds is
dropped with its demand. Idle keys expire.

The same pool serves a fleet-wide rate limit (``ratio`` 0, ``rate``/``capacity`` its rate and burst).

KEYS: the members set, then per budget its state hash and its demand hash (all one hash tag: Cluster-safe).
ARGV: member, ttl, budgets, expire (seconds); then per budget: ratio, rate, capacity, window, events,
returned, demand.
Reply: members alive, then per budget the grant and the share (as strings: Lua numbers would be truncated).
"""

from __future__ import annotations

from typing import Final

#: Arguments per budget after the four leading ones.
PER_BUDGET: Final = 7

SETTLE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local member, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local expire_ms = math.floor(tonumber(ARGV[4]) * 1000)
redis.call('ZADD', KEYS[1], now, member)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. tostring(now - ttl))
if #dead > 0 then redis.call('ZREM', KEYS[1], unpack(dead)) end
local members = redis.call('ZCARD', KEYS[1])
redis.call('PEXPIRE', KEYS[1], expire_ms)
local out = {members}
local IDLE = 0.01
for i = 0, n - 1 do
  local state, demands = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  local a = 5 + 7 * i
  local ratio, rate, cap, window = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local events, returned, demand = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  local s = redis.call('HMGET', state, 'pool', 'floor', 'seen', 'at')
  local at = tonumber(s[4]) or now
  local dt = now - at
  if dt < 0 then dt = 0 end
  local seen = (tonumber(s[3]) or 0) * math.exp(-dt / window) + events
  local most = ratio * seen
  local pool = math.min((tonumber(s[1]) or 0) + ratio * events, most)
  local back = math.min(pool + returned, most)
  local overflow = pool + returned - back
  pool = back
  local floor = math.min(cap, (tonumber(s[2]) or cap) + rate * dt + overflow)
  if #dead > 0 then redis.call('HDEL', demands, unpack(dead)) end
  redis.call('HSET', demands, member, demand)
  local total, count = 0, 0
  for _, v in ipairs(redis.call('HVALS', demands)) do
    total = total + tonumber(v)
    count = count + 1
  end
  local share = (demand + IDLE) / (total + IDLE * count)
  local grant = (pool + floor) * share
  local from_pool = math.min(pool, grant)
  pool = pool - from_pool
  floor = math.max(0, floor - (grant - from_pool))
  redis.call('HSET', state, 'pool', pool, 'floor', floor, 'seen', seen, 'at', now)
  redis.call('PEXPIRE', state, expire_ms)
  redis.call('PEXPIRE', demands, expire_ms)
  out[#out + 1] = tostring(grant)
  out[#out + 1] = tostring(share)
end
return out
"""
