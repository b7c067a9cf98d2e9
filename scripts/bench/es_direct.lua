-- The straightforward way of counting in Elasticsearch, for comparison with
-- the gateway: one scripted `_update` per event, with `retry_on_conflict`,
-- sent by the load client straight to the node. It calls the same stored
-- counter script the gateway installs (so both do the same work per counter
-- document), on the same Zipf keys as zipf.lua (KEYS of them, 10,000 unless set); it writes no day bucket,
-- which the gateway does, so it does half the gateway's document work.
--
--   wrk -s scripts/bench/es_direct.lua http://127.0.0.1:9200 -- <index prefix>
--
-- Prints "conflicts N" (409s that outlived retry_on_conflict) and
-- "acknowledged N" (2xx answers) at the end.
local keys, s = tonumber(os.getenv("KEYS") or "10000"), 1.0
local cdf = {}
local prefix = "bench-direct"
local threads = {}

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
  table.insert(threads, thread)
end

init = function(args)
  math.randomseed(1000 + (thread_id or 0))
  prefix = args[1] or prefix
  local total = 0
  for k = 1, keys do
    total = total + 1 / k ^ s
    cdf[k] = total
  end
  for k = 1, keys do cdf[k] = cdf[k] / total end
  cdf[keys] = 1.0
  conflicts, acknowledged = 0, 0
end

request = function()
  local id = "VIDEO_VIEW_item-" .. draw()
  local now = os.time() * 1000
  local body = string.format(
    '{"scripted_upsert":true,"upsert":{},"script":{"id":"%s-counter-update-v2","params":' ..
    '{"counter_id":"%s","entity":"VIDEO","action":"VIEW","uuid":"%s","delta":1,"first_ms":%d,"last_ms":%d}}}',
    prefix, id, string.sub(id, 12), now, now)
  return wrk.format("POST", "/" .. prefix .. "_default_counters/_update/" .. id .. "?retry_on_conflict=5",
    { ["Content-Type"] = "application/json" }, body)
end

response = function(status, headers, body)
  if status == 409 then conflicts = conflicts + 1 end
  if status >= 200 and status < 300 then acknowledged = acknowledged + 1 end
end

done = function(summary, latency, requests)
  local c, a = 0, 0
  for _, t in ipairs(threads) do
    c = c + (t:get("conflicts") or 0)
    a = a + (t:get("acknowledged") or 0)
  end
  io.write(string.format("conflicts %d\nacknowledged %d\n", c, a))
end
