-- Single increments spread uniformly over 10,000 keys, no body.
local keys = 10000
request = function()
  return wrk.format("POST", "/v1/counters/VIDEO/VIEW/item-" .. math.random(keys) .. "/increment")
end
