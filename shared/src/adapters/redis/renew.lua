-- Extends the lease if ARGV[1] holds it; takes it again if no one does (a failover without
-- persistence lost the key: whoever held it may go on, and the fence decides its write).
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
