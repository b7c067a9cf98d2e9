-- Like events.lua, but each request names one of `tenants` tenants in turn
-- (X-Tenant: t0 ... t7), so the queue fills as a whole and not only one
-- tenant's share of it.
local keys, per_batch, tenants, bodies = 10000, 1000, 8, {}
init = function(args)
  for b = 1, 16 do
    local parts = {}
    for i = 1, per_batch do
      parts[i] = string.format('{"entity":"VIDEO","action":"VIEW","uuid":"item-%d"}', math.random(keys))
    end
    bodies[b] = '{"events":[' .. table.concat(parts, ",") .. ']}'
  end
end
local n = 0
request = function()
  n = n + 1
  local headers = { ["Content-Type"] = "application/json", ["X-Tenant"] = "t" .. (n % tenants) }
  return wrk.format("POST", "/v1/events", headers, bodies[n % #bodies + 1])
end
