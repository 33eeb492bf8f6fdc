-- Delete a record that cannot be read, and only such a record
-- (IdempotencyStore::forget_unreadable_record). Only KEYS[1], the record,
-- is touched: the tombstone stays as it is.
-- ARGV: 'not_a_hash', or 'hash' followed by the field names and values the
-- store read and could not decode. Replies 'deleted', 'not_found', or
-- 'changed' when the record is no longer what was judged (nothing deleted).
--
-- The response's postcard bytes cannot be decoded here, so the store judges
-- in Rust, with the decoder every call uses, and this script deletes only
-- the very bytes it judged: a record written or changed since then is left.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 'not_found'
end
-- Every record of this store is a hash: a key of another type under a
-- record's name is unreadable whatever it holds.
if kind ~= 'hash' then
  redis.call('DEL', KEYS[1])
  return 'deleted'
end
if ARGV[1] ~= 'hash' or redis.call('HLEN', KEYS[1]) ~= (#ARGV - 1) / 2 then
  return 'changed'
end
for index = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[index]) ~= ARGV[index + 1] then
    return 'changed'
  end
end
redis.call('DEL', KEYS[1])
return 'deleted'
