-- Save a recovery point, keeping the lease (machine.rs checkpoint).
-- ARGV: token, recovery point. Replies 'applied' or 'lease_lost'.
local token, point = ARGV[1], ARGV[2]
local record = live(read_record(KEYS[1]), now_ms())
if not held(record, token) then
  return 'lease_lost'
end
redis.call('HSET', KEYS[1], 'point', point)
return 'applied'
