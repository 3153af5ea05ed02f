-- Token-weighted fairness, one step: domain::token_share::step with the same whole-number arithmetic.
-- KEYS[1]: the lane's hash, one field per group: current, previous, window, queued, seen, weight,
-- since, stored as the byte 1 and seven little-endian doubles (struct.pack '<Bddddddd'), which a
-- decision's scan decodes in one C call each. A hash may also hold entries in the text form
-- "current previous window queued seen weight since" (six numbers: since 0); they read alike, and
-- a group's next step stores its entry packed.
-- KEYS[2]: the lane's waiting groups, the same entries for every group whose stored count of tasks
-- waiting is above 0 (the only groups that can compete), kept with each write of KEYS[1] and made
-- whole again by each sweep.
-- KEYS[3]: when the lane was last swept (ms, text).
-- ARGV: group, weight, kind (submit | decide | settle), amount (the estimate, or the signed
-- correction), now ms, window ms, forget ms, the keys' ttl ms, patience ms. Returns 1 to go on, 0
-- to put off.
-- A submission or a correction reads and writes the asking group's field alone, so what it costs
-- Redis does not grow with the lane's groups. A start decision reads the waiting groups alone (the
-- others' shares are its question, and only a group with tasks waiting competes), so it does not
-- grow with the groups merely active in the window. Entries are decoded into locals, without a
-- table per group: the scan is what a decision costs. Idle groups are dropped by a sweep, the first
-- start decision a window or more after the last, which reads every group once.
local group, kind = ARGV[1], ARGV[3]
local weight = math.min(math.max(tonumber(ARGV[2]), 1), 1000)
local amount, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local window_ms, forget_ms, patience_ms = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[9])
local w = math.floor(now / window_ms)

-- A stored double the Rust side reads too: a whole number from 0 to 2^53 (not NaN).
local function whole(d)
  return d >= 0 and d <= 9007199254740992 and d % 1 == 0
end
-- current, previous, window, queued, seen, weight, since; nothing for anything else (as
-- adapters/redis/share.rs reads an entry back: a packed double out of range makes it unreadable).
local function decode(s)
  if not s then return nil end
  if #s == 57 and string.byte(s, 1) == 1 then
    local _, c, p, win, q, seen, wt, since = struct.unpack('<Bddddddd', s)
    if not (whole(c) and whole(p) and whole(win) and whole(q) and whole(seen) and whole(wt)
        and whole(since)) then return nil end
    return c, p, win, q, seen, wt, since
  end
  local c, p, win, q, seen, wt, since = string.match(s, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  if not c then
    c, p, win, q, seen, wt = string.match(s, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
    since = '0'
  end
  if not c then return nil end
  return tonumber(c), tonumber(p), tonumber(win), tonumber(q), tonumber(seen), tonumber(wt), tonumber(since)
end
-- The tasks waiting, unless the count was left untouched for forget_ms.
local function waiting(queued, seen)
  if now - seen > forget_ms then return 0 end
  return queued
end
-- current and previous moved on to window w by whole windows.
local function rolled(current, previous, window)
  if w > window then
    if w - window == 1 then return 0, current end
    return 0, 0
  end
  return current, previous
end
-- The tokens over the sliding window ending now.
local function recent(current, previous, window)
  local c, p = rolled(current, previous, window)
  return math.floor(p * (window_ms - (now % window_ms)) / window_ms) + c
end

-- Whether a group is idle: nothing seen from it for two windows and nothing waiting.
local function idle(queued, seen)
  return waiting(queued, seen) == 0 and seen + 2 * window_ms < now
end

local mine_entry = redis.call('HGET', KEYS[1], group)
local others, total, weights = 0, 0, 0
if kind == 'decide' then
  -- A sweep, at most once a window: every group read once, the idle (or unreadable) ones dropped,
  -- and the waiting groups made again exactly the packed copies of the entries with tasks waiting.
  -- Every step keeps them so for its own group; the sweep repairs what no step wrote: entries
  -- written without the waiting groups (a lane's state from an earlier version of this script, or
  -- that version running beside this one during a deploy), or in the text form. The scan below
  -- reads the copies unchecked: only this script writes them, from entries it has read.
  local swept = tonumber(redis.call('GET', KEYS[3])) or 0
  if now - swept >= window_ms then
    local flat, copies, kept = redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), {}
    for i = 1, #copies, 2 do kept[copies[i]] = copies[i + 1] end
    for i = 1, #flat, 2 do
      local g, v = flat[i], flat[i + 1]
      local c, p, win, q, seen, wt, since = decode(v)
      if g == group then
        kept[g] = nil -- the step below writes the asking group's entry and its copy, or drops it
      elseif not c or idle(q, seen) then
        redis.call('HDEL', KEYS[1], g) -- idle, or an entry no step can read (never written here)
      elseif q > 0 then
        local packed = struct.pack('<Bddddddd', 1, c, p, win, q, seen, wt, since)
        if packed ~= v then redis.call('HSET', KEYS[1], g, packed) end
        if kept[g] ~= packed then redis.call('HSET', KEYS[2], g, packed) end
        kept[g] = nil
      end
    end
    -- What is left is a copy of no entry with tasks waiting.
    for g in pairs(kept) do redis.call('HDEL', KEYS[2], g) end
    redis.call('SET', KEYS[3], string.format('%.0f', now), 'PX', ARGV[8])
  end
  -- The scan reads the waiting groups' values alone and is inlined (a call per group costs as much
  -- as decoding it): decode, forget, and sum the tokens over the sliding window and the weights of
  -- the groups competing. The asking group's own copy is passed over once by equality: a group
  -- with the very same bytes would count the same.
  local unpack, byte, floor = struct.unpack, string.byte, math.floor
  local left = window_ms - (now % window_ms)
  local mine_copy = redis.call('HGET', KEYS[2], group)
  local values, passed = redis.call('HVALS', KEYS[2]), mine_copy == false
  for i = 1, #values do
    local s = values[i]
    if not passed and s == mine_copy then
      passed = true
    elseif #s == 57 and byte(s, 1) == 1 then
      local _, c, p, win, q, seen, wt, since = unpack('<Bddddddd', s)
      if now - seen > forget_ms then q = 0 end
      local waited = now - since
      if waited < 0 then waited = 0 end
      if q > 0 and waited >= patience_ms then
        if w > win then
          if w - win == 1 then p = c else p = 0 end
          c = 0
        end
        others = others + 1
        total = total + floor(p * left / window_ms) + c
        if wt < 1 then wt = 1 end
        weights = weights + wt
      end
    end
  end
end

local current, previous, window, queued, seen, _, since = decode(mine_entry or nil)
if not current then current, previous, window, queued, seen, since = 0, 0, w, 0, 0, 0 end
local used = recent(current, previous, window)
current, previous = rolled(current, previous, window)
if w > window then window = w end
queued = waiting(queued, seen)
local go = 1
if kind == 'submit' then
  if queued == 0 then since = now end
  queued = queued + 1
  seen = now
elseif kind == 'settle' then
  current = math.max(0, current + amount)
else
  seen = now
  total = total + used
  weights = weights + weight
  if others > 0 and used > 0 and used * weights > total * weight then
    go = 0
  else
    current = current + amount
    queued = math.max(0, queued - 1)
  end
end
local entry = struct.pack('<Bddddddd', 1, current, previous, window, queued, seen, weight, since)
redis.call('HSET', KEYS[1], group, entry)
if queued > 0 then
  redis.call('HSET', KEYS[2], group, entry)
else
  redis.call('HDEL', KEYS[2], group)
end
-- The three keys live and expire together (a key that is not there is left so).
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[8]) end
return go
