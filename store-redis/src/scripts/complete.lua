-- Save the response and end the lease; retention restarts now (machine.rs complete).
-- ARGV: token, encoded response, retention_ms, tombstone_ms.
-- Then the publish mode and the change channel (prelude's announce_change).
-- Replies 'applied' or 'lease_lost'.
local token, response = ARGV[1], ARGV[2]
local retention_ms, tombstone_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local record = live(read_record(KEYS[1]), now)
if record and record.state == 'completed' and record.completed_by == token then
  -- This attempt's own completion, applied by an earlier try whose reply was lost.
  return 'applied'
end
if not held(record, token) then
  return 'lease_lost'
end
local expires = now + retention_ms
redis.call('HDEL', KEYS[1], 'lease_token', 'locked_until_ms', 'point')
redis.call('HSET', KEYS[1], 'state', 'completed', 'completed_by', token, 'response', response, 'expires_at_ms', int(expires))
expire_record(KEYS[1], expires)
mark_tombstone(KEYS[2], expires, tombstone_ms)
announce_change()
return 'applied'
