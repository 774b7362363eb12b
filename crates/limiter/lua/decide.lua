-- decide: the layers of one or more requests, atomically; each request
-- all-or-nothing, the requests one after the other in the order given (a
-- later request sees what an earlier one charged), all at the same instant.
--
-- KEYS     one per layer, request after request:
--          {prefix}:{limit name}:{identity hash}
-- ARGV[1]  now in µs, or -1 to read Redis TIME (clock = "redis"; the time
--          is frozen for the script's run)
-- ARGV[2]  r, the number of requests; then for each request: n, its number
--          of layers, then 5 values per layer: algorithm (its code in
--          CODE, which the proxy prepends from its algorithm table), its two
--          numbers (capacity and interval in µs, with decimals for a token
--          bucket that counts in fractions of a µs; limit and window_us; or
--          limit and the calendar period's end), cost, mode (0 enforce, 1 shadow,
--          2 peek, 3 shadow peek, 4 credit: the cost is given back, see
--          credit_layer; 5 refund: the cost of a reservation is given back
--          where it was counted, which a 6th value gives, see refund_layer;
--          6 lease: enforced, and when the request is charged a lease is
--          taken beside it, at most a 6th value's units and at most what
--          the request leaves divided by a 7th, see lease_units; an 8th is
--          the longest the lease will be used, in µs, which a token
--          bucket's ledger counts it for, see token_bucket_lease)
-- Reply    one string: 9 integers per layer, request after request,
--          separated by spaces: allowed, cost_exceeds_limit, limit,
--          remaining, reset_after_us, retry_after_us, delay_us, counted_at
--          (where an admitted request's units are counted, for a refund),
--          leased (the units of a lease taken; the decision is then the
--          one after it).
--          (One string rather than an array of integers: the client parses
--          it in a fraction of the time.)
--
-- For each request, nothing is written unless every enforcing (non-shadow)
-- layer admits; then every admitting layer, shadow ones included, is charged.
-- A peek layer is decided like an enforcing one (a shadow peek like a shadow
-- one) and never written.

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local reply = {}
local written = 0

-- An operator's credit: the units given back (the algorithm's `credit`,
-- for those that take one) are written whatever else the request holds,
-- and the layer is reported as a request of cost 0 would see it after.
local function credit_layer(algorithm, a, b, key, now, units)
  local state = algorithm.load(key)
  local credited = nil
  if algorithm.credit ~= nil then credited = algorithm.credit(a, b, state, now, units) end
  if credited == nil then return algorithm.evaluate(a, b, state, now, 0) end
  local d = algorithm.evaluate(a, b, credited, now, 0)
  algorithm.store(key, credited, d.idle_at, now)
  return d
end

-- A reservation given back: `units` off where they were counted (`at`,
-- the reservation's counted_at), as if never taken; nothing when they are
-- no longer there (their window over, their stamp gone). Reported as a
-- request of cost 0 would see the layer after.
local function refund_layer(algorithm, a, b, key, now, units, at)
  local state = algorithm.load(key)
  local refunded = nil
  if algorithm.refund ~= nil then refunded = algorithm.refund(a, b, key, state, now, units, at) end
  if refunded == nil then return algorithm.evaluate(a, b, state, now, 0) end
  local d = algorithm.evaluate(a, b, refunded, now, 0)
  if not algorithm.writes_refund then algorithm.store(key, refunded, d.idle_at, now) end
  return d
end

-- The units leased beside a request that leaves `remaining`: the twin of
-- lease_units in src/algorithm/lease.rs.
local function lease_units(remaining, max, divisor)
  return math.min(div(remaining, math.max(divisor, 1)), max)
end

-- The layers of one request from ARGV[arg] on; the ARGV index after them.
local function decide_request(first_key, arg, n)
  local layers = {}
  local blocked = false
  for i = 1, n do
    local algorithm = ALGORITHMS[tonumber(ARGV[arg])]
    local a, b = tonumber(ARGV[arg + 1]), ARGV[arg + 2]
    -- A token bucket's interval may be a decimal fraction of a µs, which
    -- a double would round: it reads its own.
    if algorithm.period ~= nil then b = algorithm.period(b) else b = tonumber(b) end
    local cost = tonumber(ARGV[arg + 3])
    local key = KEYS[first_key + i - 1]
    local mode = ARGV[arg + 4]
    arg = arg + 5
    local d
    local layer = { algorithm = algorithm, key = key, peek = mode ~= '0' and mode ~= '1' and mode ~= '6' }
    if mode == '4' then
      d = credit_layer(algorithm, a, b, key, now, cost)
    elseif mode == '5' then
      d = refund_layer(algorithm, a, b, key, now, cost, tonumber(ARGV[arg]))
      arg = arg + 1
    else
      layer.state = algorithm.load(key)
      d = algorithm.evaluate(a, b, layer.state, now, cost)
      if mode == '6' then
        layer.lease = { a = a, b = b, cost = cost, max = tonumber(ARGV[arg]), divisor = tonumber(ARGV[arg + 1]), life = tonumber(ARGV[arg + 2]) }
        arg = arg + 3
      end
    end
    layer.decision = d
    layers[i] = layer
    if mode ~= '1' and mode ~= '3' and d.allowed == 0 then
      blocked = true
    end
  end
  for i = 1, n do
    local layer = layers[i]
    local d = layer.decision
    local leased = 0
    if not blocked and d.allowed == 1 and not layer.peek then
      local lease = layer.lease
      if lease ~= nil and layer.algorithm.leased then
        leased = lease_units(d.remaining, lease.max, lease.divisor)
        if leased > 0 then
          local with_lease
          if layer.algorithm.lease ~= nil then
            with_lease = layer.algorithm.lease(lease.a, lease.b, layer.state, now, lease.cost, leased, lease.life)
          else
            with_lease = layer.algorithm.evaluate(lease.a, lease.b, layer.state, now, lease.cost + leased)
            if with_lease.allowed ~= 1 then with_lease = nil end
          end
          if with_lease ~= nil then
            d = with_lease
          else
            leased = 0
          end
        end
      end
      if d.update ~= nil then
        layer.algorithm.store(layer.key, d.update, d.idle_at, now)
      end
    end
    written = written + 1
    reply[written] = string.format('%d %d %d %d %d %d %d %d %d', d.allowed, d.oversized,
      d.limit, d.remaining, d.reset_after, d.retry_after, d.delay, d.counted_at, leased)
  end
  return arg
end

local next_key, next_arg = 1, 3
for _ = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[next_arg])
  next_arg = decide_request(next_key, next_arg + 1, n)
  next_key = next_key + n
end
return table.concat(reply, ' ')
