-- The node's own ceiling for the gateway's kind of bulk, with no gateway in
-- the way: each request is one `_bulk` holding what one flush would hold
-- when DRAWS connections each have one increment waiting (Zipf s = 1 over
-- KEYS keys, as zipf.lua draws them), coalesced per key the way the gateway
-- coalesces them: one counter update and one day-bucket update per distinct
-- key, through the same stored scripts, each bulk under a name of its own.
-- A few connections keep a few bulks in flight, so the node, not a client
-- waiting on answers, is the limit.
--
--   DRAWS=2048 KEYS=10000 wrk -c 4 -s scripts/bench/es_ceiling.lua http://127.0.0.1:9200 -- <index prefix>
--
-- Prints at the end "events N", "items N" (in bulks answered 200 with no
-- item failed), "failed N" (bulks with an error or an item failed), and
-- "events/s" and "items/s" over the run's duration.
local keys, s = tonumber(os.getenv("KEYS") or "10000"), 1.0
local draws = tonumber(os.getenv("DRAWS") or "2048")
-- COUNTER_SOURCE and BUCKET_SOURCE, when set, are the `_source` asked of
-- each counter and bucket item (JSON: `true`, or `{"includes":[...]}` as the
-- gateway once asked); TIMEOUT sets the bulk's `timeout` parameter.
local counter_source = os.getenv("COUNTER_SOURCE")
local bucket_source = os.getenv("BUCKET_SOURCE")
local timeout = os.getenv("TIMEOUT")
counter_source = counter_source and ('"_source":' .. counter_source .. ',') or ""
bucket_source = bucket_source and ('"_source":' .. bucket_source .. ',') or ""
local cdf = {}
local prefix = "bench-ceiling"
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
  math.randomseed(2000 + (thread_id or 0))
  prefix = args[1] or prefix
  local total = 0
  for k = 1, keys do
    total = total + 1 / k ^ s
    cdf[k] = total
  end
  for k = 1, keys do cdf[k] = cdf[k] / total end
  cdf[keys] = 1.0
  events, items, failed, seq = 0, 0, 0, 0
end

request = function()
  local counts, order = {}, {}
  for _ = 1, draws do
    local k = draw()
    if not counts[k] then order[#order + 1] = k; counts[k] = 0 end
    counts[k] = counts[k] + 1
  end
  seq = seq + 1
  local op = string.format("ceiling-%d-%d", thread_id or 0, seq)
  local now = os.time() * 1000
  local day = math.floor(now / 86400000)
  local month = os.date("!%Y.%m", day * 86400)
  local date = os.date("!%Y-%m-%d", day * 86400)
  local lines = {}
  for _, k in ipairs(order) do
    local uuid = "item-" .. k
    local id = "VIDEO_VIEW_" .. uuid
    local params = string.format(
      '"counter_id":"%s","entity":"VIDEO","action":"VIEW","uuid":"%s","delta":%d,"first_ms":%d,"last_ms":%d,' ..
      '"op":"%s","max_ops":16', id, uuid, counts[k], now, now, op)
    lines[#lines + 1] = string.format(
      '{"update":{"_index":"%s_default_counters","_id":"%s","retry_on_conflict":5}}', prefix, id)
    lines[#lines + 1] = string.format(
      '{%s"scripted_upsert":true,"upsert":{},"script":{"id":"%s-counter-update-v2","params":{%s}}}',
      counter_source, prefix, params)
    lines[#lines + 1] = string.format(
      '{"update":{"_index":"%s_default_histogram_counters-%s","_id":"%s@%s","routing":"%s","retry_on_conflict":5}}',
      prefix, month, id, date, id)
    lines[#lines + 1] = string.format(
      '{%s"scripted_upsert":true,"upsert":{},"script":{"id":"%s-bucket-update-v2","params":{%s,"day":%d}}}',
      bucket_source, prefix, params, day * 86400000)
  end
  local path = "/_bulk"
  if timeout then path = path .. "?timeout=" .. timeout end
  return wrk.format("POST", path, { ["Content-Type"] = "application/x-ndjson" },
    table.concat(lines, "\n") .. "\n")
end

response = function(status, headers, body)
  if status == 200 and not string.find(body, '"errors":true', 1, true) then
    local _, n = string.gsub(body, '"update":', '')
    events = events + draws
    items = items + n
  else
    failed = failed + 1
  end
end

done = function(summary, latency, requests)
  local e, i, f = 0, 0, 0
  for _, t in ipairs(threads) do
    e = e + (t:get("events") or 0)
    i = i + (t:get("items") or 0)
    f = f + (t:get("failed") or 0)
  end
  local secs = summary.duration / 1e6
  io.write(string.format("events %d\nitems %d\nfailed %d\nevents/s %.0f\nitems/s %.0f\n",
    e, i, f, e / secs, i / secs))
end
