-- The claim, in one round trip: create, take over, or report the record under the reference.
-- KEYS: 1 record, 2 unsettled index, 3 settled index (one hash slot: the shard's hash tag).
-- ARGV: 1 index member (reference prefix, hex), 2 key_rest (24 bytes), 3 tenant, 4 subject
-- ('' for a tenant-scoped record), 5 tool, 6 fingerprint ('' for none), 7 now, 8 lease end,
-- 9 token (decimal: tokens do not fit a Lua number), 10 '1' to trust the caller's times.
-- Times are decided on the server's clock: every time of the call is shifted by
-- TIME - now; the times returned are shifted back into the caller's frame.
-- Returns {0, gen} new | {1, gen, claimed, lease} in flight | {2, gen, state, completed, body}
-- completed | {3, gen, claimed} unknown | {4, gen} mismatch | {5, gen} reference taken.
local now = tonumber(ARGV[7])
local off = 0
if ARGV[10] ~= '1' then
  local t = redis.call('TIME')
  off = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - now
  now = now + off
end
local lease = tonumber(ARGV[8]) + off
local rec = KEYS[1]
local cur = redis.call('HMGET', rec, 'k', 'g', 's', 'f', 'c', 'e', 'd', 'r')

local function take(g, existed)
  redis.call('HSET', rec, 'k', ARGV[2], 'g', g, 's', 0, 'f', ARGV[6], 't', ARGV[9], 'c', now,
    'e', lease, 'tn', ARGV[3], 'sb', ARGV[4], 'tl', ARGV[5])
  if existed then
    redis.call('HDEL', rec, 'd', 'r')
    redis.call('PERSIST', rec)
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  redis.call('ZADD', KEYS[2], lease, ARGV[1])
  return {0, g}
end

-- A settled-index entry left by a record that expired is harmless: purge drops it.
if not cur[1] then
  return take(1, false)
end
local g = tonumber(cur[2])
if cur[1] ~= ARGV[2] then
  return {5, g}
end
local s = tonumber(cur[3])
if s == 3 then
  return take(g, true)
end
if (s == 1 or s == 4) and now >= tonumber(cur[6]) then
  return take(g + 1, true)
end
if cur[4] ~= '' and ARGV[6] ~= '' and cur[4] ~= ARGV[6] then
  return {4, g}
end
if s == 0 then
  return {1, g, tonumber(cur[5]) - off, tonumber(cur[6]) - off}
end
if s == 2 then
  return {3, g, tonumber(cur[5]) - off}
end
return {2, g, s, tonumber(cur[7]) - off, cur[8]}
