-- Claim: insert, inspect or take over (machine.rs claim).
-- ARGV: fingerprint, token, lease_ms, retention_ms, tombstone_ms.
-- Replies: {'acquired', locked_until_ms, takeover, late_key, recovery point or false}
--          {'replay', response} | {'in_progress', retry_after_ms} | {'mismatch'}
local fingerprint, token = ARGV[1], ARGV[2]
local lease_ms, retention_ms, tombstone_ms = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local stored = read_record(KEYS[1])
local tombstone = redis.call('GET', KEYS[2])
local record = live(stored, now)

if record == nil then
  -- No record, or an expired one: a first run. It is late when the key was
  -- seen before (a tombstone, or an expired record Redis has not deleted).
  local late = (stored ~= nil or tombstone ~= false) and 1 or 0
  local locked_until = now + lease_ms
  local expires = now + retention_ms
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1],
    'fingerprint', fingerprint, 'state', 'started',
    'lease_token', token, 'locked_until_ms', int(locked_until),
    'created_at_ms', int(now), 'expires_at_ms', int(expires),
    'tomb_until_before_ms', int(tonumber(tombstone) or 0))
  expire_record(KEYS[1], expires)
  mark_tombstone(KEYS[2], expires, tombstone_ms)
  return {'acquired', locked_until, 0, late, false}
end

if record.fingerprint ~= fingerprint then
  return {'mismatch'}
end

if record.state == 'completed' then
  local response = redis.call('HGET', KEYS[1], 'response')
  if not response then
    corrupt(KEYS[1], 'is completed without a response')
  end
  return {'replay', response}
end

local point = redis.call('HGET', KEYS[1], 'point')
if record.locked_until_ms > now then
  if record.lease_token == token then
    -- The same attempt's claim again (its reply was lost): the same lease. It
    -- was a takeover if the lease began after the record was created.
    local takeover = (record.locked_until_ms - lease_ms > record.created_at_ms) and 1 or 0
    return {'acquired', record.locked_until_ms, takeover, 0, point}
  end
  return {'in_progress', record.locked_until_ms - now}
end

-- The lease expired: take over, keeping the record alive past the new lease.
local locked_until = now + lease_ms
local expires = math.max(record.expires_at_ms, now + retention_ms)
redis.call('HSET', KEYS[1], 'lease_token', token, 'locked_until_ms', int(locked_until), 'expires_at_ms', int(expires))
expire_record(KEYS[1], expires)
mark_tombstone(KEYS[2], expires, tombstone_ms)
return {'acquired', locked_until, 1, 0, point}
