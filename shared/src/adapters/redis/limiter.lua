-- The limiter's decide and reconcile steps (see limiter.rs) over one hash key, atomically.
-- ARGV: op (take/put), now_ms, class (0/1), tokens, estimated, rpm, tpm, interactive share,
-- lend_above, window_ms. Returns the wait in ms (0 = granted).
local k = KEYS[1]
local op, now, class, tokens, estimated = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rpm, tpm, share, lend, window = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local caps = {rpm * share, rpm * (1 - share), tpm * share, tpm * (1 - share)}
local raw = redis.call('HMGET', k, 'l1', 'l2', 'l3', 'l4', 'at')
local levels, at = {}, tonumber(raw[5])
if at == nil then
  for i = 1, 4 do levels[i] = caps[i] end
  at = now
else
  for i = 1, 4 do levels[i] = tonumber(raw[i]) end
end
local elapsed = math.max(0, now - at)
for i = 1, 4 do levels[i] = math.min(levels[i] + elapsed * caps[i] / window, caps[i]) end
at = math.max(at, now)
local wait = 0
if op == 'put' then
  local i = 3 + class
  levels[i] = math.min(levels[i] + estimated - tokens, caps[i])
else
  local own_off, other_off = class, 1 - class
  local takes = {0, 0, 0, 0}
  local dims = {{1, 1}, {3, tokens}}
  for _, d in ipairs(dims) do
    local own, other, need = d[1] + own_off, d[1] + other_off, d[2]
    local need_now = math.min(need, caps[own])
    local have = math.max(levels[own], 0)
    if have >= need_now then
      takes[own] = need
    else
      local lendable = levels[other] - lend * caps[other]
      if lendable >= need_now - have then
        takes[own] = have + (need - need_now)
        takes[other] = need_now - have
      else
        local rate = caps[own] / window
        local w = window
        if rate > 0 then w = (need_now - levels[own]) / rate end
        wait = math.max(wait, w)
      end
    end
  end
  if wait == 0 then
    for i = 1, 4 do levels[i] = levels[i] - takes[i] end
  end
end
redis.call('HSET', k, 'l1', tostring(levels[1]), 'l2', tostring(levels[2]), 'l3', tostring(levels[3]), 'l4', tostring(levels[4]), 'at', tostring(at))
redis.call('PEXPIRE', k, math.ceil(2 * window))
return math.ceil(wait)
