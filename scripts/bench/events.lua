-- Batches of 1,000 events over 10,000 keys; a few bodies made up front and
-- sent in turn, so wrk spends its time sending, not building JSON.
local keys, per_batch, bodies = 10000, 1000, {}
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
  n = n % #bodies + 1
  return wrk.format("POST", "/v1/events", { ["Content-Type"] = "application/json" }, bodies[n])
end
