-- Single increments spread uniformly over 10,000 keys (KEYS=n for n), no body.
local keys = tonumber(os.getenv("KEYS") or "10000")
request = function()
  return wrk.format("POST", "/v1/counters/VIDEO/VIEW/item-" .. math.random(keys) .. "/increment")
end
