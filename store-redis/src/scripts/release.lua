-- End the lease now, keeping the record, so the next claim takes over at once
-- (machine.rs release). ARGV: token.
-- Then the publish mode and the change channel (prelude's announce_change).
-- Replies 'applied' or 'lease_lost'.
local token = ARGV[1]
local now = now_ms()
local record = live(read_record(KEYS[1]), now)
if not held(record, token) then
  return 'lease_lost'
end
redis.call('HSET', KEYS[1], 'locked_until_ms', int(math.min(record.locked_until_ms, now)))
announce_change()
return 'applied'
