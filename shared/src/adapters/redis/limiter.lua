-- The limiter's steps (see limiter.rs) over one hash key, atomically: `take` (decide), `put`
-- (reconcile), `back` (return an unused reservation), `cool` (start or extend the shared cooldown)
-- and `align` (store the learned limits and line fresh buckets up with the provider's window).
-- Numbers are stored with 17 digits, so they read back exactly.
-- ARGV: op, now_ms, class (0/1), tokens, estimated (or the cooldown's ms for `cool`), rpm, tpm,
-- interactive share, wait_for, window_ms, burst, reserve_up_to_ms, and for `align` the resets of
-- requests and tokens (with the remaining requests and tokens in the tokens and estimated slots;
-- values of 1e18 and more mean "not said"). Returns 0 when granted, the wait in ms when nothing was
-- taken, minus the wait when the budget was reserved (see `decide`).
local k = KEYS[1]
local op, now, class, tokens, estimated = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rpm, tpm, share, wait_for, window = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local burst = tonumber(ARGV[11])
local reserve = tonumber(ARGV[12]) or 0
local raw = redis.call('HMGET', k, 'l1', 'l2', 'l3', 'l4', 'at', 'cool', 'al', 'lr', 'lt')
local levels, at, cool, aligned = {}, tonumber(raw[5]), tonumber(raw[6]) or 0, raw[7] == '1'
-- The limits some worker learned from the provider (stored by `align`): every worker paces by them,
-- also one that has not had an answer yet.
rpm = math.min(rpm, tonumber(raw[8]) or rpm)
tpm = math.min(tpm, tonumber(raw[9]) or tpm)
local shares = {rpm * share, rpm * (1 - share), tpm * share, tpm * (1 - share)}
local caps, rates = {}, {}
for i = 1, 4 do
  caps[i] = shares[i] * burst
  rates[i] = shares[i] * (1 - burst) / window
end
if at == nil then
  for i = 1, 4 do levels[i] = caps[i] end
  at = now
else
  for i = 1, 4 do levels[i] = tonumber(raw[i]) end
end
local elapsed = math.max(0, now - at)
for i = 1, 4 do
  -- Above its cap: the limits just came down, so the new pace starts from empty. (The tolerance
  -- keeps a full bucket that went through text from reading as above its cap.)
  if levels[i] > caps[i] * (1 + 1e-9) + 1e-9 then
    levels[i] = 0
    aligned = false
  end
end
-- Refill; a full bucket's overflow goes to the other class's bucket of the same dimension (`spill`).
for d = 1, 3, 2 do
  local a, b = levels[d] + elapsed * rates[d], levels[d + 1] + elapsed * rates[d + 1]
  if a > caps[d] then b = b + a - caps[d]; a = caps[d] end
  if b > caps[d + 1] then a = math.min(a + b - caps[d + 1], caps[d]); b = caps[d + 1] end
  levels[d], levels[d + 1] = a, math.min(b, caps[d + 1])
end
at = math.max(at, now)
local wait = 0
if op == 'align' then
  if rpm < 1e11 then redis.call('HSET', k, 'lr', string.format('%.17g', rpm)) end
  if tpm < 1e11 then redis.call('HSET', k, 'lt', string.format('%.17g', tpm)) end
  local left = {tokens, estimated}
  if not aligned and (left[1] < 1e18 or left[2] < 1e18) then
    aligned = true
    local resets = {tonumber(ARGV[13]) or 1e19, tonumber(ARGV[14]) or 1e19}
    -- Both buckets together hold at most what is left less their refill before the reset; the debt
    -- is the answered call's class's, and the other starts full unless the debt passes that floor.
    for d = 1, 2 do
      if left[d] < 1e18 then
        -- No reset said: the window may have just begun, so what is left must last a whole one.
        local reset = resets[d]
        if reset >= 1e18 then reset = window end
        local own, other = (d - 1) * 2 + 1 + class, (d - 1) * 2 + 2 - class
        local ceiling = left[d] - (rates[own] + rates[other]) * reset
        levels[other] = math.max(math.min(caps[other], ceiling + shares[own]), -shares[other])
        levels[own] = math.max(math.min(levels[own], ceiling - math.max(levels[other], 0)), -shares[own])
      end
    end
  end
elseif op == 'back' then
  -- An unused reservation: its request and tokens return to the class's buckets.
  levels[1 + class] = math.min(levels[1 + class] + 1, caps[1 + class])
  levels[3 + class] = math.min(levels[3 + class] + tokens, caps[3 + class])
elseif op == 'cool' then
  cool = math.max(cool, now + estimated)
elseif op == 'put' then
  local i = 3 + class
  levels[i] = math.min(levels[i] + estimated - tokens, caps[i])
elseif cool > now then
  wait = cool - now
else
  local own_off, other_off = class, 1 - class
  local lent_sooner = false
  local dims = {{1, 1}, {3, tokens}}
  for _, d in ipairs(dims) do
    local own, other, need = d[1] + own_off, d[1] + other_off, d[2]
    local need_now = math.min(need, caps[own] * math.max(0.1, math.min(wait_for, 1)))
    if levels[own] < need_now then
      local w = window
      if rates[own] > 0 then w = (need_now - levels[own]) / rates[own] end
      local both = rates[own] + rates[other]
      local sooner = w
      if levels[other] >= caps[other] * (1 - 1e-9) and both > 0 then
        sooner = (need_now - levels[own]) / both
      end
      if sooner < w then lent_sooner = true end
      wait = math.max(wait, sooner)
    end
  end
  if wait == 0 or ((not lent_sooner) and math.ceil(wait) <= reserve) then
    levels[1 + own_off] = levels[1 + own_off] - 1
    levels[3 + own_off] = levels[3 + own_off] - tokens
    wait = -wait
  end
end
local al = '0'
if aligned then al = '1' end
local function num(x) return string.format('%.17g', x) end
redis.call('HSET', k, 'l1', num(levels[1]), 'l2', num(levels[2]), 'l3', num(levels[3]), 'l4', num(levels[4]), 'at', num(at), 'cool', num(cool), 'al', al)
redis.call('PEXPIRE', k, math.ceil(2 * window + math.max(0, cool - now)))
if wait < 0 then return -math.ceil(-wait) end
return math.ceil(wait)
