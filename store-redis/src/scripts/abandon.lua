-- Delete the record: validation failed before any effect (machine.rs abandon).
-- ARGV: token.
-- Then the publish mode and the change channel (prelude's announce_change).
-- Replies 'applied' or 'lease_lost'.
local token = ARGV[1]
local now = now_ms()
local record = live(read_record(KEYS[1]), now)
if record == nil then
  -- Already gone: a retried abandon whose first reply was lost.
  return 'applied'
end
if not held(record, token) then
  return 'lease_lost'
end
redis.call('DEL', KEYS[1])
-- The claim wrote a tombstone for this record, which now never expires into
-- one: put back the tombstone it replaced, if that one is still due.
local before = record.tomb_until_before_ms
if before > now then
  redis.call('SET', KEYS[2], int(before), 'PXAT', int(before))
else
  redis.call('DEL', KEYS[2])
end
announce_change()
return 'applied'
