-- fixed_window, the twin of src/algorithm/fixed_window.rs.
--
-- KEYS[i]  hash: s = window start (µs), n = units admitted in it.
-- ARGV     limit, window_us, cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us (0).
-- TTL      until the window ends.

local function fixed_window_evaluate(limit, window, st, now, cost)
  local start = math.max(now - math.fmod(now, window), st.s)
  local count = 0
  if start == st.s then count = st.n end
  local finish = start + window
  local reset_after = finish - math.min(now, finish)
  if cost > limit then
    return oversized(limit, math.max(limit - count, 0), reset_after, finish)
  end
  if count + cost <= limit then
    local update = nil
    if cost > 0 then update = { s = start, n = count + cost } end
    return admitted(limit, limit - count - cost, reset_after, update, finish, start)
  end
  return refused(limit, math.max(limit - count, 0), reset_after, reset_after, finish)
end

local function fixed_window_load(key)
  local v = redis.call('HMGET', key, 's', 'n')
  return { s = tonumber(v[1] or '0'), n = tonumber(v[2] or '0') }
end

local function fixed_window_store(key, u, idle_at, now)
  redis.call('HSET', key, 's', int(u.s), 'n', int(u.n))
  redis.call('PEXPIRE', key, ttl_ms(idle_at, now))
end

-- Units given back to the running window's count, down to zero; nil for
-- no change (an older window is spent anyway).
local function fixed_window_credit(limit, window, st, now, units)
  if st.s < now - math.fmod(now, window) or st.n <= 0 then return nil end
  return { s = st.s, n = math.max(st.n - units, 0) }
end

-- A reservation's units given back to the window they were counted in
-- (`at`, its start); nil once that window is over.
local function fixed_window_refund(limit, window, key, st, now, units, at)
  if st.s ~= at or st.n <= 0 then return nil end
  return { s = st.s, n = math.max(st.n - units, 0) }
end

ALGORITHMS[CODE.fixed_window] = { load = fixed_window_load, evaluate = fixed_window_evaluate, store = fixed_window_store, credit = fixed_window_credit, refund = fixed_window_refund, leased = true }
