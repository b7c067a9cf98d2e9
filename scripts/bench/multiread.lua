-- The multi-read of 50 counters, ARTICLE/VIEW/article-0..49, in one GET.
-- Against scripts/bench/single-gets.lua (the same 50 counters, one GET
-- each): keys read per second = 50 x requests/s here.
local keys = {}
for i = 0, 49 do
  keys[#keys + 1] = "ARTICLE/VIEW/article-" .. i
end
local path = "/v1/counters?keys=" .. table.concat(keys, ",")
request = function()
  return wrk.format("GET", path)
end
