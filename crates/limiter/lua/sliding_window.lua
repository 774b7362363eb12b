-- sliding_window (counter), the twin of src/algorithm/sliding_window.rs.
--
-- KEYS[i]  hash: s = current window start (µs), c = its count,
--          p = the previous window's count.
-- ARGV     limit, window_us, cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us (0).
-- TTL      until the end of the window after the current one, when both
--          counts have faded out.
--
-- Admits when c * window + p * (window - elapsed) + cost * window
-- <= limit * window: the estimate c + p * (1 - elapsed / window), scaled.

local function sliding_window_retry_at(limit, window, start, current, previous, cost)
  if previous > 0 and limit >= cost + current then
    local room = (limit - cost - current) * window
    local needed = window - math.min(div(room, previous), window)
    if needed < window then
      return start + needed
    end
  end
  local next_start = start + window
  if current == 0 then
    return next_start
  end
  local room = (limit - cost) * window
  return next_start + window - math.min(div(room, current), window)
end

local function sliding_window_evaluate(limit, window, st, now, cost)
  local now_eff = math.max(now, st.s)
  local start = now_eff - math.fmod(now_eff, window)
  local current, previous = 0, 0
  if start == st.s then
    current, previous = st.c, st.p
  elseif start == st.s + window then
    previous = st.c
  end
  local elapsed = now_eff - start
  local used = current * window + previous * (window - elapsed)
  local limit_scaled = limit * window
  local finish = start + window
  local reset_after = finish - now
  local idle_at = finish + window
  local remaining_before = div(math.max(limit_scaled - used, 0), window)
  if cost > limit then
    return oversized(limit, remaining_before, reset_after, idle_at)
  end
  local cost_scaled = cost * window
  if used + cost_scaled <= limit_scaled then
    local update = nil
    if cost > 0 then update = { s = start, c = current + cost, p = previous } end
    return admitted(limit, div(limit_scaled - used - cost_scaled, window), reset_after, update, idle_at, start)
  end
  local retry_at = sliding_window_retry_at(limit, window, start, current, previous, cost)
  return refused(limit, remaining_before, reset_after, retry_at - now, idle_at)
end

local function sliding_window_load(key)
  local v = redis.call('HMGET', key, 's', 'c', 'p')
  return { s = tonumber(v[1] or '0'), c = tonumber(v[2] or '0'), p = tonumber(v[3] or '0') }
end

local function sliding_window_store(key, u, idle_at, now)
  redis.call('HSET', key, 's', int(u.s), 'c', int(u.c), 'p', int(u.p))
  redis.call('PEXPIRE', key, ttl_ms(idle_at, now))
end

-- A reservation's units given back to the window they were counted in
-- (`at`, its start): the running one, or the one before, which now fades
-- out as `p`; nil when it is older.
local function sliding_window_refund(limit, window, key, st, now, units, at)
  if st.s == at and st.c > 0 then
    return { s = st.s, c = math.max(st.c - units, 0), p = st.p }
  end
  if st.s == at + window and st.p > 0 then
    return { s = st.s, c = st.c, p = math.max(st.p - units, 0) }
  end
  return nil
end

ALGORITHMS[CODE.sliding_window] = { load = sliding_window_load, evaluate = sliding_window_evaluate, store = sliding_window_store, refund = sliding_window_refund, leased = true }
