-- leaky_bucket (a scheduling GCRA), the twin of src/algorithm/leaky_bucket.rs.
--
-- KEYS[i]  string: the next free departure slot (µs).
-- ARGV     capacity (requests that may wait), interval_us (1 / rate), cost.
-- Reply    allowed, cost_exceeds_limit, limit, remaining (slots left to
--          wait in), reset_after_us, retry_after_us, delay_us (how long the
--          proxy holds the request before forwarding it).
-- TTL      until the last slot taken has passed.

local function leaky_bucket_evaluate(capacity, interval, next_slot, now, cost)
  local queue = capacity * interval
  local slot = math.max(next_slot, now)
  local wait = slot - now
  local function slots_left(backlog)
    return div(math.max(queue - backlog, 0), interval)
  end
  if cost > capacity then
    return oversized(capacity, slots_left(wait), wait, slot)
  end
  if wait <= queue then
    if cost == 0 then
      return admitted(capacity, slots_left(wait), wait, nil, slot)
    end
    local after = slot + cost * interval
    local backlog = after - now
    local d = admitted(capacity, slots_left(backlog), backlog, after, after)
    d.delay = wait
    return d
  end
  return refused(capacity, 0, wait, wait - queue, slot)
end

ALGORITHMS[CODE.leaky_bucket] = { load = gcra_load, evaluate = leaky_bucket_evaluate, store = gcra_store }
