-- Single increments with `unique: "day"` (once per actor, counter and day)
-- over the 10,000 keys of increment.lua, for the once-per-actor row of
-- scripts/bench.sh:
--
--   wrk -s scripts/bench/unique.lua URL -- new      # a new actor per request: each counts
--   wrk -s scripts/bench/unique.lua URL -- repeat   # one actor per key: once each key has
--                                                   # been seen, every request is a repeat
local keys = 10000
local mode = "new"
local next_id = 0
setup = function(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
end

init = function(args)
  mode = args[1] or mode
  math.randomseed(2000 + (thread_id or 0))
end

local n = 0
request = function()
  n = n + 1
  local key, actor = math.random(keys), nil
  if mode == "repeat" then
    actor = "visitor-of-" .. key
  else
    actor = string.format("visitor-%d-%d", thread_id or 0, n)
  end
  local body = string.format('{"actor":"%s","unique":"day"}', actor)
  return wrk.format("POST", "/v1/counters/VIDEO/VIEW/item-" .. key .. "/increment",
    { ["Content-Type"] = "application/json" }, body)
end
