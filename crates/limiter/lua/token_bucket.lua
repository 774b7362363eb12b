-- token_bucket (GCRA form), the twin of src/algorithm/token_bucket.rs.
--
-- KEYS[i]  string: tat, the instant at which the bucket is full again, in
--          µs ("1750000000000000"), with six decimals when it falls
--          between two µs ("1750000000000000.100000").
-- ARGV     capacity, interval (one token back every interval: µs, with
--          as many decimals as the bucket counts in, "100000", "0.1",
--          "333.333334"), cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us (always 0).
-- TTL      until tat: a bucket full again is a fresh bucket.
--
-- The interval is n units of 1/per µs (per = 10^decimals). The arithmetic
-- runs on the debt, tat - now in those units, which the burst bounds
-- (capacity * n <= 2^51, checked by the proxy's config) and
-- token_bucket_debt caps at 2^52, and on whole µs to tat: never on
-- instants in units finer than a µs, which would not fit a double.

local POW10 = { [0] = 1, 10, 100, 1000, 10000, 100000, 1000000 }

-- ARGV's interval as { n = units, per = units in a µs }.
local function token_bucket_period(text)
  local dot = string.find(text, '.', 1, true)
  if dot == nil then return { n = tonumber(text), per = 1 } end
  return {
    n = tonumber(string.sub(text, 1, dot - 1) .. string.sub(text, dot + 1)),
    per = POW10[#text - dot],
  }
end

-- The state: t = tat in whole µs, f = the picoseconds past it.
local function tat_load(key)
  local v = redis.call('GET', key)
  if not v then return { t = 0, f = 0 } end
  local dot = string.find(v, '.', 1, true)
  if dot == nil then return { t = tonumber(v), f = 0 } end
  return { t = tonumber(string.sub(v, 1, dot - 1)), f = tonumber(string.sub(v, dot + 1)) }
end

-- Whether tat has passed at now.
local function tat_past(tat, now)
  return tat.t < now or (tat.t == now and tat.f == 0)
end

-- Units from now until tat, 0 when it is past; at most 2^52 (a credit to
-- a state further ahead reckons from that far). A fraction finer than the
-- unit is a unit more.
local function token_bucket_debt(iv, tat, now)
  if tat_past(tat, now) then return 0 end
  return math.min(tat.t - now, div(4503599627370496, iv.per)) * iv.per
    + math.ceil(tat.f / (1000000 / iv.per))
end

-- Whole µs until tat has passed, exact however far ahead it is.
local function token_bucket_wait(tat, now)
  if tat_past(tat, now) then return 0 end
  if tat.f > 0 then return tat.t - now + 1 end
  return tat.t - now
end

-- Whole µs until the debt is at most `room` units, reckoned from the whole
-- µs to tat so that it is exact however far ahead tat is.
local function token_bucket_wait_for_room(iv, tat, now, room)
  if tat_past(tat, now) then return 0 end
  local rem = math.ceil(tat.f / (1000000 / iv.per))
  if room >= rem then
    return math.max(tat.t - now - div(room - rem, iv.per), 0)
  end
  return tat.t - now + 1
end

-- The instant `units` past now.
local function token_bucket_after(iv, now, units)
  return { t = now + div(units, iv.per), f = math.fmod(units, iv.per) * (1000000 / iv.per) }
end

local function token_bucket_evaluate(capacity, iv, tat, now, cost)
  local n, per = iv.n, iv.per
  local burst = capacity * n
  local debt = token_bucket_debt(iv, tat, now)
  local wait = token_bucket_wait(tat, now)
  if cost > capacity then
    return oversized(capacity, div(math.max(burst - debt, 0), n), wait, now + wait)
  end
  local after = debt + cost * n
  if after <= burst then
    local update = nil
    if cost > 0 then update = token_bucket_after(iv, now, after) end
    local full = math.ceil(after / per)
    return admitted(capacity, div(burst - after, n), full, update, now + full)
  end
  return refused(capacity, div(math.max(burst - debt, 0), n), wait,
    token_bucket_wait_for_room(iv, tat, now, burst - cost * n), now + wait)
end

local function token_bucket_store(key, tat, idle_at, now)
  local v = int(tat.t)
  if tat.f > 0 then v = string.format('%d.%06d', tat.t, tat.f) end
  redis.call('SET', key, v, 'PX', ttl_ms(idle_at, now))
end

-- A leaky bucket's schedule, in whole µs: a fraction (left by a token
-- bucket before a reload) is a µs more.
local function gcra_load(key)
  local tat = tat_load(key)
  if tat.f > 0 then return tat.t + 1 end
  return tat.t
end

local function gcra_store(key, tat, idle_at, now)
  redis.call('SET', key, int(tat), 'PX', ttl_ms(idle_at, now))
end

-- Units given back: tat moved back by their intervals, no earlier than now
-- (a bucket holds no more than full). The new tat, or nil for no change.
local function token_bucket_credit(capacity, iv, tat, now, units)
  local debt = token_bucket_debt(iv, tat, now)
  if debt == 0 then return nil end
  return token_bucket_after(iv, now, math.max(debt - units * iv.n, 0))
end

-- A reservation's tokens go back as a credit does; a lease's (`at` is then
-- where its tokens end in the schedule, see place_lease) only while nothing
-- was charged after it, so that no other lease's tokens are freed.
local function token_bucket_refund(capacity, iv, key, tat, now, units, at)
  if at ~= 0 and tat.t ~= at then return nil end
  return token_bucket_credit(capacity, iv, tat, now, units)
end

-- Where a lease's tokens end: the schedule's end it left (its whole µs).
local function token_bucket_place_lease(d)
  return d.update.t
end

ALGORITHMS[CODE.token_bucket] = { period = token_bucket_period, load = tat_load, evaluate = token_bucket_evaluate, store = token_bucket_store, credit = token_bucket_credit, refund = token_bucket_refund, leased = true, place_lease = token_bucket_place_lease }
