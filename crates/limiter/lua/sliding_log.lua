-- sliding_log, the twin of src/algorithm/sliding_log.rs.
--
-- KEYS[i]  sorted set: one member "<stamp>:<units>" per stamp (µs) with
--          the stamp as score. A stamp counts while stamp > now - window.
--          Units admitted in the same microsecond share a member, so the
--          set never holds more members than the limit has units.
-- ARGV     limit, window_us, cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us (0).
-- TTL      until the newest stamp leaves the window.

local function sliding_log_evaluate(limit, window, entries, now, cost)
  local newest = 0
  if #entries > 0 then newest = entries[#entries].stamp end
  local now_eff = math.max(now, newest)
  local used = 0
  local live = {}
  for _, e in ipairs(entries) do
    if e.stamp + window > now_eff then
      used = used + e.units
      live[#live + 1] = e
    end
  end
  local idle_at = now_eff
  if #entries > 0 then idle_at = newest + window end
  local reset_after = math.max(idle_at - now, 0)
  if cost > limit then
    return oversized(limit, math.max(limit - used, 0), reset_after, idle_at)
  end
  if used + cost <= limit then
    if cost == 0 then
      return admitted(limit, limit - used, reset_after, nil, idle_at, now_eff)
    end
    local after = now_eff + window
    return admitted(limit, limit - used - cost, math.max(after - now, 0),
      { stamp = now_eff, cost = cost, window = window }, after, now_eff)
  end
  local must_leave = used + cost - limit
  local left = 0
  local retry_at = idle_at
  for _, e in ipairs(live) do
    left = left + e.units
    if left >= must_leave then
      retry_at = e.stamp + window
      break
    end
  end
  return refused(limit, math.max(limit - used, 0), reset_after, retry_at - now, idle_at)
end

local function sliding_log_load(key)
  local raw = redis.call('ZRANGE', key, 0, -1)
  local entries = {}
  for i, member in ipairs(raw) do
    local sep = string.find(member, ':', 1, true)
    entries[i] = {
      stamp = tonumber(string.sub(member, 1, sep - 1)),
      units = tonumber(string.sub(member, sep + 1)),
      member = member,
    }
  end
  return entries
end

local function sliding_log_store(key, u, idle_at, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(u.stamp - u.window))
  local units = u.cost
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 2 and tonumber(last[2]) == u.stamp then
    local member = last[1]
    units = units + tonumber(string.sub(member, string.find(member, ':', 1, true) + 1))
    redis.call('ZREM', key, member)
  end
  redis.call('ZADD', key, int(u.stamp), int(u.stamp) .. ':' .. int(units))
  redis.call('PEXPIRE', key, ttl_ms(idle_at, now))
end

-- A reservation's units taken off the stamp they were admitted at (`at`),
-- written here (a removal is no append for `store`); the entries as they
-- are after, or nil when that stamp has left the log.
local function sliding_log_refund(limit, window, key, entries, now, units, at)
  for i, e in ipairs(entries) do
    if e.stamp == at then
      redis.call('ZREM', key, e.member)
      local after = {}
      for j, other in ipairs(entries) do
        if j ~= i then after[#after + 1] = other end
      end
      if e.units > units then
        local left = e.units - units
        local member = int(at) .. ':' .. int(left)
        redis.call('ZADD', key, int(at), member)
        after = {}
        for j, other in ipairs(entries) do
          if j == i then
            after[#after + 1] = { stamp = at, units = left, member = member }
          else
            after[#after + 1] = other
          end
        end
      end
      return after
    end
  end
  return nil
end

ALGORITHMS[CODE.sliding_log] = { load = sliding_log_load, evaluate = sliding_log_evaluate, store = sliding_log_store, refund = sliding_log_refund, writes_refund = true }
