-- slots: leases of a concurrency limit, the twin of src/algorithm/concurrency.rs.
--
-- KEYS[1]  a sorted set: lease ids scored by the instant (µs) they expire.
-- ARGV     op ('acquire', 'renew' or 'release'), now in µs or -1 to read
--          Redis TIME, max, lease_us, the lease id.
-- Reply    one string: allowed (1 or 0), remaining, reset_after_us,
--          retry_after_us. For renew and release, allowed says whether the
--          lease was held.
-- TTL      the set lives as long as its longest lease.
--
-- Scores are doubles: expiry instants stay below 2^53 µs, so exact.

local key = KEYS[1]
local op = ARGV[1]
local now = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max, lease, id = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]

local function int(x)
  return string.format('%d', x)
end

-- A lease has expired at its expiry instant.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

local function until_one_frees()
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return 0
  end
  return tonumber(first[2]) - now
end

local function keep_until_longest()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] ~= nil then
    redis.call('PEXPIRE', key, int(math.max(1, math.ceil((tonumber(last[2]) - now) / 1000))))
  end
end

if op == 'acquire' then
  local held = redis.call('ZCARD', key)
  -- A lease id already holding a slot keeps that one slot, renewed.
  if redis.call('ZSCORE', key, id) then
    redis.call('ZADD', key, 'XX', int(now + lease), id)
    keep_until_longest()
    return table.concat({ '1', int(math.max(0, max - held)), int(until_one_frees()), '0' }, ' ')
  end
  if held >= max then
    local wait = until_one_frees()
    return table.concat({ '0', '0', int(wait), int(wait) }, ' ')
  end
  redis.call('ZADD', key, int(now + lease), id)
  keep_until_longest()
  return table.concat({ '1', int(max - held - 1), int(until_one_frees()), '0' }, ' ')
elseif op == 'renew' then
  if not redis.call('ZSCORE', key, id) then
    return '0 0 0 0'
  end
  redis.call('ZADD', key, 'XX', int(now + lease), id)
  keep_until_longest()
  return '1 0 0 0'
else
  local held = redis.call('ZREM', key, id)
  return (held == 1 and '1' or '0') .. ' 0 0 0'
end
