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
--          numbers (capacity and interval_us, limit and window_us, or limit
--          and the calendar period's end), cost, mode (0 enforce, 1 shadow,
--          2 peek, 3 shadow peek, 4 credit: the cost is given back, see
--          credit_layer)
-- Reply    one string: 7 integers per layer, request after request,
--          separated by spaces: allowed, cost_exceeds_limit, limit,
--          remaining, reset_after_us, retry_after_us, delay_us. (One string
--          rather than an array of integers: the client parses it in a
--          fraction of the time.)
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

local function decide_request(first_key, first_arg, n)
  local layers = {}
  local blocked = false
  for i = 1, n do
    local base = first_arg + (i - 1) * 5
    local algorithm = ALGORITHMS[tonumber(ARGV[base])]
    local a, b = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
    local cost = tonumber(ARGV[base + 3])
    local key = KEYS[first_key + i - 1]
    local mode = ARGV[base + 4]
    local d
    if mode == '4' then
      d = credit_layer(algorithm, a, b, key, now, cost)
    else
      d = algorithm.evaluate(a, b, algorithm.load(key), now, cost)
    end
    layers[i] = { algorithm = algorithm, decision = d, key = key, peek = mode ~= '0' and mode ~= '1' }
    if mode ~= '1' and mode ~= '3' and d.allowed == 0 then
      blocked = true
    end
  end
  for i = 1, n do
    local d = layers[i].decision
    if not blocked and d.allowed == 1 and d.update ~= nil and not layers[i].peek then
      layers[i].algorithm.store(layers[i].key, d.update, d.idle_at, now)
    end
    written = written + 1
    reply[written] = string.format('%d %d %d %d %d %d %d', d.allowed, d.oversized,
      d.limit, d.remaining, d.reset_after, d.retry_after, d.delay)
  end
end

local next_key, next_arg = 1, 3
for _ = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[next_arg])
  decide_request(next_key, next_arg + 1, n)
  next_key = next_key + n
  next_arg = next_arg + 1 + n * 5
end
return table.concat(reply, ' ')
