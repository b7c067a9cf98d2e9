-- Zipf-skewed load over 10,000 keys, or KEYS (rank k drawn with weight 1/k^s,
-- s = 1.0: over 10,000 keys the hottest gets about 10% of the load, the top
-- 100 about half; over 1,000,000 the hottest about 7%).
-- The CDF is computed once per wrk thread in init; each draw is a binary
-- search over it.
--
--   wrk -s scripts/bench/zipf.lua URL                 # single increments
--   wrk -s scripts/bench/zipf.lua URL -- batch 1000   # POST /v1/events, 1,000 events each
--   KEYS=1000000 wrk -s scripts/bench/zipf.lua URL    # over 1,000,000 keys
local keys, s = tonumber(os.getenv("KEYS") or "10000"), 1.0
local cdf = {}
local mode, per_batch, bodies = "single", 1000, {}

local function draw()
  local u, lo, hi = math.random(), 1, keys
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return lo
end

local next_id = 0
setup = function(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
end

init = function(args)
  math.randomseed(1000 + (thread_id or 0))
  local total = 0
  for k = 1, keys do
    total = total + 1 / k ^ s
    cdf[k] = total
  end
  for k = 1, keys do cdf[k] = cdf[k] / total end
  cdf[keys] = 1.0
  if args[1] == "batch" then
    mode = "batch"
    per_batch = tonumber(args[2] or per_batch)
    -- A few bodies made up front and sent in turn, as events.lua does.
    for b = 1, 16 do
      local parts = {}
      for i = 1, per_batch do
        parts[i] = string.format('{"entity":"VIDEO","action":"VIEW","uuid":"item-%d"}', draw())
      end
      bodies[b] = '{"events":[' .. table.concat(parts, ",") .. ']}'
    end
  end
end

local n = 0
request = function()
  if mode == "batch" then
    n = n % #bodies + 1
    return wrk.format("POST", "/v1/events", { ["Content-Type"] = "application/json" }, bodies[n])
  end
  return wrk.format("POST", "/v1/counters/VIDEO/VIEW/item-" .. draw() .. "/increment")
end
