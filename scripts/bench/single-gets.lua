-- The 50 counters of scripts/bench/multiread.lua, one GET each, in turn.
local i = 0
request = function()
  i = (i + 1) % 50
  return wrk.format("GET", "/v1/counters/ARTICLE/VIEW/article-" .. i)
end
