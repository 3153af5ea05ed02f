-- Token-weighted fairness, one step: domain::token_share::step with the same whole-number arithmetic.
-- KEYS[1]: the lane's hash, one field per group: "current previous window queued seen weight since"
-- (an entry of six numbers has since 0).
-- ARGV: group, weight, kind (submit | decide | settle), amount (the estimate, or the signed
-- correction), now ms, window ms, forget ms, the key's ttl ms, patience ms. Returns 1 to go on, 0
-- to put off.
local group, kind = ARGV[1], ARGV[3]
local weight = math.min(math.max(tonumber(ARGV[2]), 1), 1000)
local amount, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local window_ms, forget_ms, patience_ms = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[9])
local w = math.floor(now / window_ms)

local function decode(s)
  local v = {}
  for n in string.gmatch(s, '[^ ]+') do v[#v + 1] = tonumber(n) end
  if #v == 6 then v[7] = 0 end
  if #v ~= 7 then return nil end
  for i = 1, 7 do if v[i] == nil or v[i] < 0 or v[i] ~= math.floor(v[i]) then return nil end end
  return {current = v[1], previous = v[2], window = v[3], queued = v[4], seen = v[5], weight = v[6], since = v[7]}
end
local function rolled(u)
  local r = {current = u.current, previous = u.previous, window = u.window, queued = u.queued, seen = u.seen,
    weight = u.weight, since = u.since}
  if w > u.window then
    if w - u.window == 1 then r.previous = u.current else r.previous = 0 end
    r.current = 0
    r.window = w
  end
  return r
end
local function waiting(u)
  if now - u.seen > forget_ms then return 0 end
  return u.queued
end
local function competes(u)
  return waiting(u) > 0 and math.max(0, now - u.since) >= patience_ms
end
local function recent(u)
  local r = rolled(u)
  local left = window_ms - (now % window_ms)
  return math.floor(r.previous * left / window_ms) + r.current
end

local state = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local u = decode(flat[i + 1])
  if u then state[flat[i]] = u end
end
for g, u in pairs(state) do
  if g ~= group and u.seen + 2 * window_ms < now and waiting(u) == 0 then
    redis.call('HDEL', KEYS[1], g)
  end
end

local stored = state[group] or {current = 0, previous = 0, window = w, queued = 0, seen = 0, weight = 0, since = 0}
local mine = rolled(stored)
mine.queued = waiting(stored)
mine.weight = weight
local go = 1
if kind == 'submit' then
  if mine.queued == 0 then mine.since = now end
  mine.queued = mine.queued + 1
  mine.seen = now
elseif kind == 'settle' then
  mine.current = math.max(0, mine.current + amount)
else
  mine.seen = now
  local used, total, weights, others = recent(mine), 0, mine.weight, 0
  for g, u in pairs(state) do
    if g ~= group and competes(u) then
      others = others + 1
      total = total + recent(u)
      weights = weights + math.max(u.weight, 1)
    end
  end
  total = total + used
  if others > 0 and used > 0 and used * weights > total * mine.weight then
    go = 0
  else
    mine.current = mine.current + amount
    mine.queued = math.max(0, mine.queued - 1)
  end
end
redis.call('HSET', KEYS[1], group, string.format('%.0f %.0f %.0f %.0f %.0f %.0f %.0f',
  mine.current, mine.previous, mine.window, mine.queued, mine.seen, mine.weight, mine.since))
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return go
