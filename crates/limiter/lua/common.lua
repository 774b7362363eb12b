-- floodgate: helpers shared by the algorithm scripts. The scripts are joined
-- in this order into one script: the CODE table (each algorithm's number,
-- from the proxy's algorithm table), common.lua, the algorithms,
-- decide.lua.
--
-- Every quantity is an integer below 2^53 (microseconds, counts, a token
-- bucket's fractions of a µs relative to now), so Lua's doubles hold it
-- exactly: each algorithm keeps what it forms within 2^51, and config
-- validation keeps its numbers in the range where it does (see
-- crates/algorithm/src/validated.rs).
-- Integers are written back with '%d', which Redis's Lua 5.1 formats through
-- a 64-bit C long: exact at these magnitudes (tostring() would round to 14
-- digits), and far cheaper than '%.0f', whose float printing was the largest
-- single cost of a script run in a profile of redis-server.

local function int(x)
  return string.format('%d', x)
end

-- floor(a / b) for non-negative integers below 2^53: the correctly rounded
-- quotient never crosses the next integer at these magnitudes.
local function div(a, b)
  return math.floor(a / b)
end

-- Keys expire once their state is as good as fresh, but not in under a
-- second: a state that goes idle that fast is cheaper kept than recreated, and
-- expiry runs on Redis's clock, which with clock = "local" is not the one the
-- state was computed with. Keeping idle state longer changes no decision.
local function ttl_ms(idle_at, now)
  return int(math.max(1000, math.ceil((idle_at - now) / 1000)))
end

-- A decision as the Rust twin's Evaluation: the reply fields, the state
-- change to write if the request goes through, and when the state goes idle.
-- `counted_at` is where an admitted request's units are counted (a
-- window's start, a period's end, a log's stamp; 0 for the buckets): a
-- refund finds them there.
local function decision(allowed, oversized, limit, remaining, reset_after, retry_after, update, idle_at)
  return {
    allowed = allowed, oversized = oversized, limit = limit, remaining = remaining,
    reset_after = reset_after, retry_after = retry_after, delay = 0,
    update = update, idle_at = idle_at, counted_at = 0,
  }
end

local function admitted(limit, remaining, reset_after, update, idle_at, counted_at)
  local d = decision(1, 0, limit, remaining, reset_after, 0, update, idle_at)
  d.counted_at = counted_at or 0
  return d
end

local function refused(limit, remaining, reset_after, retry_after, idle_at)
  return decision(0, 0, limit, remaining, reset_after, retry_after, nil, idle_at)
end

local function oversized(limit, remaining, reset_after, idle_at)
  return decision(0, 1, limit, remaining, reset_after, 0, nil, idle_at)
end

local ALGORITHMS = {}
