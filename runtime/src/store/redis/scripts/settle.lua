-- A completion or release by compare-and-set, for servers without `SET … IFEQ` (Redis < 8.4,
-- Valkey < 8.1; see cas.rs): the record is settled only while it is exactly the string this
-- process's claim wrote (same key, same token, in flight, not renewed, taken over or marked as
-- watched since), so the whole string is the token fence and nothing needs unpacking here.
-- No announcement: a record a repeat waits on is marked (watch.lua), so it does not match, and
-- the fenced script settles and announces it.
-- KEYS: 1 record, 2 the shard's index (one hash slot).
-- ARGV: 1 the claim's string, 2 the settled record, 3 its expiry (PXAT), 4 its index score
-- (window end - 2^50), 5 its index member.
-- Returns 1 when it settled the record, 0 when it wrote nothing (the caller then runs the
-- fenced script, which answers as it always did).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return 1
