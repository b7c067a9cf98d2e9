-- Batches of 1,000 events over 10,000 keys; a few bodies made up front and
-- sent in turn, so wrk spends its time sending, not building JSON.
-- `wrk ... -s scripts/bench/events.lua URL -- 8` spreads the requests over
-- 8 tenants (X-Tenant: t0 ... t7), so the queue fills as a whole and not
-- only one tenant's share of it.
local keys, per_batch, tenants, bodies = 10000, 1000, 0, {}
init = function(args)
  tenants = tonumber(args[1]) or 0
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
  local headers = { ["Content-Type"] = "application/json" }
  if tenants > 0 then
    headers["X-Tenant"] = "t" .. (n % tenants)
  end
  return wrk.format("POST", "/v1/events", headers, bodies[n % #bodies + 1])
end
