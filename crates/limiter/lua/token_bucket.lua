-- token_bucket (GCRA form), the twin of src/algorithm/token_bucket.rs.
--
-- KEYS[i]  string: tat, the instant at which the bucket is full again, in
--          µs ("1750000000000000"), with six decimals when it falls
--          between two µs ("1750000000000000.100000"); while leases are
--          outstanding, then the ledger: the running epoch's end, the
--          epoch's length, the units leased in it and in the one before
--          ("1750000000000000 1750000001000000 1000000 300 100"; none
--          reads as nothing outstanding). See the ledger below.
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

-- The ledger of no lease outstanding.
local function ledger_none()
  return { e = 0, p = 0, c = 0, v = 0 }
end

-- The state: t = tat in whole µs, f = the picoseconds past it, l = the
-- ledger (e = the running epoch's end, p = an epoch's length, c = units
-- leased in it, v = in the one before).
local function tat_load(key)
  local v = redis.call('GET', key)
  if not v then return { t = 0, f = 0, l = ledger_none() } end
  local l = ledger_none()
  local space = string.find(v, ' ', 1, true)
  if space ~= nil then
    local e, p, c, prev = string.match(string.sub(v, space + 1), '^(%d+) (%d+) (%d+) (%d+)$')
    l = { e = tonumber(e), p = tonumber(p), c = tonumber(c), v = tonumber(prev) }
    v = string.sub(v, 1, space - 1)
  end
  local dot = string.find(v, '.', 1, true)
  if dot == nil then return { t = tonumber(v), f = 0, l = l } end
  return { t = tonumber(string.sub(v, 1, dot - 1)), f = tonumber(string.sub(v, dot + 1)), l = l }
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

local function token_bucket_plain(capacity, iv, tat, now, cost)
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

-- The lease ledger, the twin of crates/algorithm/src/ledger.rs (which
-- says why it keeps the burst bound): the units leased and not yet given
-- back or lapsed, in two epochs of at least a lease's life; the refill
-- stops short of them.

local function ledger_outstanding(l)
  return l.c + l.v
end

-- tat with at least `outstanding` tokens of debt at `at`.
local function ledger_held(iv, tat, outstanding, at)
  local floor = outstanding * iv.n
  if token_bucket_debt(iv, tat, at) >= floor then return tat end
  return token_bucket_after(iv, at, floor)
end

-- The ledger at now and its tat: each epoch whose leases have all ended
-- lapses at its end, the debt kept as it stood then.
local function ledger_settled(iv, tat, now)
  local l = { e = tat.l.e, p = tat.l.p, c = tat.l.c, v = tat.l.v }
  local t = { t = tat.t, f = tat.f }
  while l.e ~= 0 and now >= l.e and ledger_outstanding(l) > 0 do
    local at = l.e
    t = ledger_held(iv, t, ledger_outstanding(l), at)
    l.v = l.c
    l.c = 0
    l.e = at + l.p
  end
  if ledger_outstanding(l) == 0 then l = ledger_none() end
  t.l = l
  return t
end

-- The state kept until the bucket is full again: its last epoch lapses
-- at e + p, keeping the debt of what is outstanding then.
local function ledger_idle_at(iv, l, idle_at)
  if ledger_outstanding(l) == 0 then return idle_at end
  return math.max(idle_at, l.e + l.p + math.ceil(ledger_outstanding(l) * iv.n / iv.per))
end

-- A settled state's decision: the refill held short of the ledger, which
-- the update writes.
local function ledger_evaluate(capacity, iv, tat, l, now, cost)
  local d = token_bucket_plain(capacity, iv, ledger_held(iv, tat, ledger_outstanding(l), now), now, cost)
  if d.update ~= nil then d.update.l = l end
  d.idle_at = ledger_idle_at(iv, l, d.idle_at)
  return d
end

local function token_bucket_evaluate(capacity, iv, tat, now, cost)
  local settled = ledger_settled(iv, tat, now)
  return ledger_evaluate(capacity, iv, settled, settled.l, now, cost)
end

-- A request of `cost` admitted with `units` leased beside it, counted in
-- epochs of `epoch` µs: the decision, or nil for no lease (an admission
-- refused by the arithmetic, or a ledger in shorter epochs than the
-- lease's life). The request's own units go on the ledger too, so that a
-- refund of it, counted where the lease is, takes only what was put there.
local function token_bucket_lease(capacity, iv, tat, now, cost, units, epoch)
  if epoch <= 0 then return nil end
  local settled = ledger_settled(iv, tat, now)
  local l = settled.l
  local after
  if l.e == 0 then
    after = { e = (div(now, epoch) + 1) * epoch, p = epoch, c = cost + units, v = 0 }
  elseif epoch > l.p then
    return nil
  else
    after = { e = l.e, p = l.p, c = l.c + cost + units, v = l.v }
  end
  local d = ledger_evaluate(capacity, iv, settled, l, now, cost + units)
  if d.allowed ~= 1 then return nil end
  d.update.l = after
  d.idle_at = ledger_idle_at(iv, after, d.idle_at)
  d.counted_at = after.e
  return d
end

local function token_bucket_store(key, tat, idle_at, now)
  local v = int(tat.t)
  if tat.f > 0 then v = string.format('%d.%06d', tat.t, tat.f) end
  local l = tat.l
  if l ~= nil and ledger_outstanding(l) > 0 then
    v = string.format('%s %d %d %d %d', v, l.e, l.p, l.c, l.v)
  end
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
-- The ledger is left as it was (the units outstanding stay out).
local function token_bucket_credit(capacity, iv, tat, now, units)
  local debt = token_bucket_debt(iv, tat, now)
  if debt == 0 then return nil end
  local t = token_bucket_after(iv, now, math.max(debt - units * iv.n, 0))
  t.l = tat.l
  return t
end

-- A reservation's tokens go back as a credit does; a lease's (`at` is then
-- its epoch's end in the ledger) off the ledger and into the bucket, as
-- many as its epoch still counts; none once it has lapsed.
local function token_bucket_refund(capacity, iv, key, tat, now, units, at)
  if at == 0 then return token_bucket_credit(capacity, iv, tat, now, units) end
  local settled = ledger_settled(iv, tat, now)
  local l = settled.l
  if l.e == 0 then return nil end
  local held = ledger_held(iv, settled, ledger_outstanding(l), now)
  local back
  if at == l.e then
    back = math.min(units, l.c)
    l.c = l.c - back
  elseif at + l.p == l.e then
    back = math.min(units, l.v)
    l.v = l.v - back
  else
    return nil
  end
  if back == 0 then return nil end
  local t = token_bucket_credit(capacity, iv, held, now, back)
  if t == nil then t = { t = held.t, f = held.f } end
  t.l = l
  return ledger_settled(iv, t, now)
end

ALGORITHMS[CODE.token_bucket] = { period = token_bucket_period, load = tat_load, evaluate = token_bucket_evaluate, store = token_bucket_store, credit = token_bucket_credit, refund = token_bucket_refund, leased = true, lease = token_bucket_lease }
