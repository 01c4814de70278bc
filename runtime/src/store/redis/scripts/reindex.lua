-- Puts a record's index entry where its state says (after a compare-and-set that did not
-- apply moved it, see cas.rs): in flight by lease end, unknown at 0, settled by window end -
-- 2^50; no record, no entry.
-- KEYS: 1 record, 2 the shard's index (one hash slot). The index member is the record key's
-- last 16 bytes.
local BAND = 1125899906842624
local member = string.sub(KEYS[1], -16)
local blob = redis.call('GET', KEYS[1])
if not blob then
  redis.call('ZREM', KEYS[2], member)
  return 0
end
local s, _, _, e = struct.unpack('>BI4dd', blob)
if s == 0 then
  redis.call('ZADD', KEYS[2], e, member)
elseif s == 2 then
  redis.call('ZADD', KEYS[2], 0, member)
else
  redis.call('ZADD', KEYS[2], e - BAND, member)
end
return 1
