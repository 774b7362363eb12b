-- token_bucket (GCRA form), the twin of src/algorithm/token_bucket.rs.
--
-- KEYS[i]  string: tat, the instant (µs) at which the bucket is full again.
-- ARGV     capacity, interval_us (one token back every interval), cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us (always 0).
-- TTL      until tat: a bucket full again is a fresh bucket.

local function token_bucket_evaluate(capacity, interval, tat, now, cost)
  local burst = capacity * interval
  local start = math.max(tat, now)
  local debt = start - now
  if cost > capacity then
    return oversized(capacity, div(math.max(burst - debt, 0), interval), debt, start)
  end
  local after = start + cost * interval
  local needed = after - now
  if needed <= burst then
    local update = nil
    if cost > 0 then update = after end
    return admitted(capacity, div(burst - needed, interval), needed, update, after)
  end
  return refused(capacity, div(math.max(burst - debt, 0), interval), debt, needed - burst, start)
end

local function gcra_load(key)
  return tonumber(redis.call('GET', key) or '0')
end

local function gcra_store(key, tat, idle_at, now)
  redis.call('SET', key, int(tat), 'PX', ttl_ms(idle_at, now))
end

-- Units given back: tat moved back by their intervals, no earlier than now
-- (a bucket holds no more than full). The new tat, or nil for no change.
local function token_bucket_credit(capacity, interval, tat, now, units)
  if tat <= now then return nil end
  return math.max(tat - units * interval, now)
end

-- A reservation's tokens go back as a credit does; a lease's (`at` is then
-- where its tokens end in the schedule, see place_lease) only while nothing
-- was charged after it, so that no other lease's tokens are freed.
local function token_bucket_refund(capacity, interval, key, tat, now, units, at)
  if at ~= 0 and tat ~= at then return nil end
  return token_bucket_credit(capacity, interval, tat, now, units)
end

-- Where a lease's tokens end: the schedule's end it left.
local function token_bucket_place_lease(d)
  return d.update
end

ALGORITHMS[CODE.token_bucket] = { load = gcra_load, evaluate = token_bucket_evaluate, store = gcra_store, credit = token_bucket_credit, refund = token_bucket_refund, leased = true, place_lease = token_bucket_place_lease }
