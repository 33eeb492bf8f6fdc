-- Shared by every idem script (store-redis/src/scripts). KEYS[1] is the
-- record hash, KEYS[2] its tombstone. Every script reads and checks
-- everything before its first write: Redis does not roll a script back when
-- it fails half-way, so a failure must come before any write.

local RECORD_FIELDS = {
  'fingerprint', 'state', 'lease_token', 'locked_until_ms',
  'completed_by', 'created_at_ms', 'expires_at_ms', 'tomb_until_before_ms',
}

-- The server's clock, never the client's.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Whole milliseconds, written as integers whatever Lua's number formatting.
local function int(number)
  return string.format('%d', number)
end

local function corrupt(key, why)
  error({err = 'IDEMCORRUPT record ' .. key .. ' ' .. why})
end

-- The record's small fields (not the response or the recovery point), or nil
-- when there is none. A hash that is not a well-formed record is an error,
-- and a key of another type makes HMGET fail: both before any write.
local function read_record(key)
  if redis.call('EXISTS', key) == 0 then
    return nil
  end
  local values = redis.call('HMGET', key, unpack(RECORD_FIELDS))
  local record = {}
  for index, name in ipairs(RECORD_FIELDS) do
    record[name] = values[index]
  end
  record.created_at_ms = tonumber(record.created_at_ms)
  record.expires_at_ms = tonumber(record.expires_at_ms)
  record.tomb_until_before_ms = tonumber(record.tomb_until_before_ms) or 0
  if not (record.fingerprint and record.created_at_ms and record.expires_at_ms) then
    corrupt(key, 'lacks its fingerprint or times')
  end
  if record.state == 'started' then
    record.locked_until_ms = tonumber(record.locked_until_ms)
    if not (record.lease_token and record.locked_until_ms) then
      corrupt(key, 'is started without a lease')
    end
  elseif record.state == 'completed' then
    if not record.completed_by then
      corrupt(key, 'is completed without its token')
    end
  else
    corrupt(key, 'has an unknown state')
  end
  return record
end

-- An expired record counts as absent everywhere, whether or not Redis has
-- deleted it yet.
local function live(record, now)
  if record and record.expires_at_ms > now then
    return record
  end
  return nil
end

-- The started record that token still holds (machine.rs held_by).
local function held(record, token)
  return record ~= nil and record.state == 'started' and record.lease_token == token
end

-- The record key lives exactly as long as the record.
local function expire_record(key, expires_at_ms)
  redis.call('PEXPIREAT', key, int(expires_at_ms))
end

-- The tombstone outlives the record by the tombstone window. It holds its own
-- end time so that an abandon can put back the one it replaced.
local function mark_tombstone(key, expires_at_ms, tombstone_ms)
  if tombstone_ms > 0 then
    local until_ms = expires_at_ms + tombstone_ms
    redis.call('SET', key, int(until_ms), 'PXAT', int(until_ms))
  end
end

-- Wakes the record's waiters in every instance (docs/design.md#waiting;
-- store-redis/src/notify.rs), after a write that ended a started state. The
-- last two arguments say how: 'sharded' (Redis Cluster: SPUBLISH, which
-- stays on the record's shard) or 'plain' (PUBLISH), and the channel, which
-- carries the record's hash tag.
local function announce_change()
  local count = #ARGV
  if ARGV[count - 1] == 'sharded' then
    redis.call('SPUBLISH', ARGV[count], 'changed')
  else
    redis.call('PUBLISH', ARGV[count], 'changed')
  end
end
