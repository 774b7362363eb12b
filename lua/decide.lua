-- decide: all layers of one request, atomically, all-or-nothing.
--
-- KEYS     one per layer: {prefix}:{limit name}:{identity hash}
-- ARGV[1]  now in µs, or -1 to read Redis TIME (clock = "redis"; the time
--          is frozen for the script's run)
-- ARGV[2]  n, the number of layers; then 5 values per layer:
--          algorithm (1 token_bucket, 2 leaky_bucket, 3 fixed_window,
--          4 sliding_window, 5 sliding_log), its two numbers (capacity and
--          interval_us, or limit and window_us), cost, shadow (1 or 0)
-- Reply    one string: 7 integers per layer, separated by spaces: allowed,
--          cost_exceeds_limit, limit, remaining, reset_after_us,
--          retry_after_us, delay_us. (One string rather than an array of
--          integers: the client parses it in a fraction of the time.)
--
-- Nothing is written unless every enforcing (non-shadow) layer admits; then
-- every admitting layer, shadow ones included, is charged.

local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = tonumber(ARGV[2])
local layers = {}
local blocked = false
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local algorithm = ALGORITHMS[tonumber(ARGV[base + 1])]
  local a, b = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local cost = tonumber(ARGV[base + 4])
  local d = algorithm.evaluate(a, b, algorithm.load(KEYS[i]), now, cost)
  layers[i] = { algorithm = algorithm, decision = d }
  if ARGV[base + 5] ~= '1' and d.allowed == 0 then
    blocked = true
  end
end

local reply = {}
for i = 1, n do
  local d = layers[i].decision
  if not blocked and d.allowed == 1 and d.update ~= nil then
    layers[i].algorithm.store(KEYS[i], d.update, d.idle_at, now)
  end
  local at = (i - 1) * 7
  reply[at + 1] = int(d.allowed)
  reply[at + 2] = int(d.oversized)
  reply[at + 3] = int(d.limit)
  reply[at + 4] = int(d.remaining)
  reply[at + 5] = int(d.reset_after)
  reply[at + 6] = int(d.retry_after)
  reply[at + 7] = int(d.delay)
end
return table.concat(reply, ' ')
