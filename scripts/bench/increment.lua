-- Single increments spread uniformly over 10,000 keys (KEYS=n for n), no body.
-- Up to 100,000 requests are formatted once per thread at start, so each
-- request costs the client a table lookup rather than a string built in Lua.
local keys = tonumber(os.getenv("KEYS") or "10000")
local made = {}
local function format(i)
  return wrk.format("POST", "/v1/counters/VIDEO/VIEW/item-" .. i .. "/increment")
end
init = function(args)
  for i = 1, math.min(keys, 100000) do made[i] = format(i) end
end
request = function()
  local i = math.random(keys)
  return made[i] or format(i)
end
