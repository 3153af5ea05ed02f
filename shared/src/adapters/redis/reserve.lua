-- A quota reservation: every charge or none, atomically (domain::quota::refuses and ::apply).
-- KEYS: the counters (one hash tag). ARGV, three per key: amount (signed), limit (-1: none),
-- ttl in ms of a counter this creates. Returns 0 when all were applied, else the 1-based index of
-- the first charge refused (and none was applied).
local current = {}
for i = 1, #KEYS do
  current[i] = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  local amount = tonumber(ARGV[3 * i - 2])
  local limit = tonumber(ARGV[3 * i - 1])
  if amount > 0 and limit >= 0 and current[i] > 0 and current[i] + amount > limit then
    return i
  end
end
for i = 1, #KEYS do
  local value = math.max(0, current[i] + tonumber(ARGV[3 * i - 2]))
  local text = string.format('%.0f', value)
  if redis.call('PTTL', KEYS[i]) > 0 then
    redis.call('SET', KEYS[i], text, 'KEEPTTL')
  else
    redis.call('SET', KEYS[i], text, 'PX', ARGV[3 * i])
  end
end
return 0
