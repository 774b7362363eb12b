-- quota (calendar), the twin of src/algorithm/quota.rs.
--
-- KEYS[i]  hash: e = the period's end (µs), n = units admitted in it.
-- ARGV     limit, period_end_us (the proxy reads the zone's calendar;
--          Lua cannot), cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us (0).
-- TTL      until the period ends.

local function quota_evaluate(limit, period_end, st, now, cost)
  local finish = math.max(period_end, st.e)
  local count = 0
  if finish == st.e then count = st.n end
  local reset_after = finish - math.min(now, finish)
  if cost > limit then
    return oversized(limit, math.max(limit - count, 0), reset_after, finish)
  end
  if count + cost <= limit then
    local update = nil
    if cost > 0 then update = { e = finish, n = count + cost } end
    return admitted(limit, limit - count - cost, reset_after, update, finish, finish)
  end
  return refused(limit, math.max(limit - count, 0), reset_after, reset_after, finish)
end

local function quota_load(key)
  local v = redis.call('HMGET', key, 'e', 'n')
  return { e = tonumber(v[1] or '0'), n = tonumber(v[2] or '0') }
end

local function quota_store(key, u, idle_at, now)
  redis.call('HSET', key, 'e', int(u.e), 'n', int(u.n))
  redis.call('PEXPIRE', key, ttl_ms(idle_at, now))
end

-- Units given back to the running period's count, down to zero; nil for
-- no change.
local function quota_credit(limit, period_end, st, now, units)
  if st.e < period_end or st.n <= 0 then return nil end
  return { e = st.e, n = math.max(st.n - units, 0) }
end

-- A reservation's units given back to the period they were counted in
-- (`at`, its end); nil once that period is over.
local function quota_refund(limit, period_end, key, st, now, units, at)
  if st.e ~= at or st.n <= 0 then return nil end
  return { e = st.e, n = math.max(st.n - units, 0) }
end

ALGORITHMS[CODE.quota] = { load = quota_load, evaluate = quota_evaluate, store = quota_store, credit = quota_credit, refund = quota_refund, leased = true }
