-- Load for scripts/soak.sh: increments whose fate can be checked afterwards.
--
--   wrk -s scripts/bench/soak.lua URL -- batch  LABEL EVENTS KEYS   # POST /v1/events, EVENTS each
--   wrk -s scripts/bench/soak.lua URL -- single LABEL 1      KEYS   # single increments
--
-- Every wrk thread writes only its own keys (entity LABEL, action BATCH or
-- SINGLE, uuid t<thread>-k<n>, n < KEYS), so the store's totals can be held
-- against what each thread saw acknowledged: wrk cannot tell which request a
-- response answers, but it can tell which thread's keys it was about.
-- Each thread counts the requests it started, the 200s and the increments
-- they acknowledged, and sorts the 503s: `overloaded` (never applied) and
-- any other (a timeout may have been applied). A 503 without Retry-After
-- and any other status are failures, counted here and judged by
-- scripts/bench/soak_report.py from the lines `done` prints.
local threads = {}
local next_id = 0

setup = function(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local bodies, paths, n = {}, {}, 0
-- What `done` reads through thread:get must be global in the thread's state.
mode, label, per_request, keys = "batch", "", 1, 1
sent, ok, acked, overloaded, maybe, no_retry_after, other, bad_body = 0, 0, 0, 0, 0, 0, 0, 0
timeouts, unavailable, first_other = 0, 0, ""

init = function(args)
  mode, label = args[1], args[2]
  per_request, keys = tonumber(args[3]), tonumber(args[4])
  math.randomseed(7919 * tid + (mode == "batch" and 1 or 2))
  if mode == "batch" then
    -- A few bodies made up front and sent in turn, as events.lua does.
    for b = 1, 16 do
      local parts = {}
      for i = 1, per_request do
        parts[i] = string.format('{"entity":"%s","action":"BATCH","uuid":"t%d-k%d"}', label, tid, math.random(keys) - 1)
      end
      bodies[b] = '{"events":[' .. table.concat(parts, ",") .. ']}'
    end
  else
    per_request = 1
    for k = 1, keys do
      paths[k] = string.format("/v1/counters/%s/SINGLE/t%d-k%d/increment", label, tid, k - 1)
    end
  end
end

request = function()
  sent = sent + 1
  if mode == "batch" then
    n = n % #bodies + 1
    return wrk.format("POST", "/v1/events", { ["Content-Type"] = "application/json" }, bodies[n])
  end
  n = n % #paths + 1
  return wrk.format("POST", paths[n])
end

local function header(headers, name)
  local v = headers[name]
  if v then return v end
  name = name:lower()
  for k, val in pairs(headers) do
    if k:lower() == name then return val end
  end
  return nil
end

response = function(status, headers, body)
  if status == 200 then
    ok = ok + 1
    if mode == "batch" then
      local a = tonumber(body:match('"accepted":(%d+)'))
      if a then acked = acked + a else bad_body = bad_body + 1 end
    elseif body:find('"value":', 1, true) then
      acked = acked + 1
    else
      bad_body = bad_body + 1
    end
  elseif status == 503 then
    if not header(headers, "Retry-After") then no_retry_after = no_retry_after + 1 end
    local t = body:match('"type":"([%w_]+)"')
    if t == "overloaded" then
      overloaded = overloaded + 1
    else
      maybe = maybe + 1
      if t == "timeout" then timeouts = timeouts + 1 else unavailable = unavailable + 1 end
    end
  else
    other = other + 1
    if first_other == "" then first_other = status .. " " .. body:sub(1, 200):gsub("%s", " ") end
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("soak-wrk duration_us=%d responses=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.duration, summary.requests, e.connect, e.read, e.write, e.timeout))
  for _, t in ipairs(threads) do
    io.write(string.format(
      "soak-thread label=%s action=%s tid=%d per_request=%d sent=%d ok=%d acked=%d overloaded=%d maybe=%d"
        .. " timeouts=%d unavailable=%d no_retry_after=%d other=%d bad_body=%d first_other=%q\n",
      t:get("label"), t:get("mode") == "batch" and "BATCH" or "SINGLE", t:get("tid"), t:get("per_request"),
      t:get("sent"), t:get("ok"), t:get("acked"), t:get("overloaded"), t:get("maybe"),
      t:get("timeouts"), t:get("unavailable"), t:get("no_retry_after"), t:get("other"), t:get("bad_body"),
      t:get("first_other")))
  end
end
