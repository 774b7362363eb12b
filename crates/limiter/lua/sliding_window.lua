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
-- Admits when c * steps + p * (steps - elapsed) + cost * steps
-- <= limit * steps: the estimate c + p * (1 - elapsed / window), scaled,
-- with the window cut into `steps` steps of `step` µs and `elapsed` the
-- steps begun (see sliding_window_steps). Counts above the limit weigh as
-- the limit. Every product stays within 2^51, every sum within 3 * 2^51.

-- The twin of `steps` in sliding_window.rs: 1 µs steps unless
-- limit * window would pass 2^51, else the shortest that keep
-- limit * steps within it. Both divisions are of integers below 2^53, whose
-- correctly rounded quotient is on the right side of every integer, so
-- floor and ceil are exact.
local function sliding_window_steps(limit, window)
  local most = math.max(div(2251799813685248, limit), 1)
  local step = math.ceil(window / most)
  return step, math.ceil(window / step)
end

local function sliding_window_retry_at(limit, window, step, steps, start, current, previous, cost)
  if previous > 0 and limit >= cost + current then
    local room = (limit - cost - current) * steps
    local needed = steps - math.min(div(room, previous), steps)
    if needed < steps then
      return start + needed * step
    end
  end
  local next_start = start + window
  if current == 0 then
    return next_start
  end
  local room = (limit - cost) * steps
  return next_start + math.min((steps - math.min(div(room, current), steps)) * step, window)
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
  current, previous = math.min(current, limit), math.min(previous, limit)
  local step, steps = sliding_window_steps(limit, window)
  local elapsed = div(now_eff - start, step)
  local used = current * steps + previous * (steps - elapsed)
  local limit_scaled = limit * steps
  local finish = start + window
  local reset_after = finish - now
  local idle_at = finish + window
  local remaining_before = div(math.max(limit_scaled - used, 0), steps)
  if cost > limit then
    return oversized(limit, remaining_before, reset_after, idle_at)
  end
  local cost_scaled = cost * steps
  if used + cost_scaled <= limit_scaled then
    local update = nil
    if cost > 0 then update = { s = start, c = current + cost, p = previous } end
    return admitted(limit, div(limit_scaled - used - cost_scaled, steps), reset_after, update, idle_at, start)
  end
  local retry_at = sliding_window_retry_at(limit, window, step, steps, start, current, previous, cost)
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
