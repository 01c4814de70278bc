-- The fenced updates of one record: complete, release, mark unknown, renew, settle. Each applies
-- only when the token presented is the record's and its state allows it.
-- KEYS: 1 record, 2 unsettled index, 3 settled index, 4 outbox stream (one hash slot).
-- ARGV: 1 op ('c' complete, 'r' release, 'u' unknown, 'n' renew, 's' settle), 2 index member,
-- 3 key_rest, 4 token, 5 '1' to trust the caller's times, 6 now ('0' for 'u'), 7 retention ms,
-- then per op:
--   c: 8 state code (1 ok, 4 error), 9 body, 10 window end, 11 message count, then topic, payload...
--   n: 8 lease end
--   s: 8 new token, 9 state code (1, 4, 3 released, 2 unknown), 10 body, 11 window end
-- Returns {0, gen} done | {-1} no record of this key | {-2, gen} fenced | {-3, gen, state}.
local rec = KEYS[1]
local op = ARGV[1]
local cur = redis.call('HMGET', rec, 'k', 'g', 's', 't', 'c')
if not cur[1] or cur[1] ~= ARGV[3] then
  return {-1}
end
local g = tonumber(cur[2])
if cur[4] ~= ARGV[4] then
  return {-2, g}
end
local s = tonumber(cur[3])
if not (s == 0 or (op == 's' and s == 2)) then
  return {-3, g, s}
end
if op == 'u' then
  redis.call('HSET', rec, 's', 2)
  redis.call('ZADD', KEYS[2], 0, ARGV[2])
  return {0, g}
end

local t = redis.call('TIME')
local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local given = tonumber(ARGV[6])
local now = given
if ARGV[5] ~= '1' then
  now = real
end
local off = now - given

if op == 'n' then
  local lease = tonumber(ARGV[8]) + off
  redis.call('HSET', rec, 'e', lease)
  redis.call('ZADD', KEYS[2], lease, ARGV[2])
  return {0, g}
end

-- Never earlier than the claim: a clock that steps back cannot end a window early.
local at = math.max(now, tonumber(cur[5]))
local function settled(state, body, ends)
  if body then
    redis.call('HSET', rec, 's', state, 'd', at, 'e', ends, 'r', body)
  else
    redis.call('HSET', rec, 's', state, 'd', at, 'e', ends)
    redis.call('HDEL', rec, 'r')
  end
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZADD', KEYS[3], ends, ARGV[2])
  -- Native retention: gone at window end + retention (on the server's own clock).
  redis.call('PEXPIREAT', rec, ends + tonumber(ARGV[7]) + (real - now))
end

if op == 'r' then
  settled(3, nil, at)
  return {0, g}
end
if op == 'c' then
  settled(tonumber(ARGV[8]), ARGV[9], at + tonumber(ARGV[10]) - given)
  local n = tonumber(ARGV[11])
  if n > 0 and redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('XGROUP', 'CREATE', KEYS[4], 'g', '$', 'MKSTREAM')
  end
  for i = 0, n - 1 do
    redis.call('XADD', KEYS[4], '*', 'p', ARGV[2], 'g', g, 'tp', ARGV[12 + 2 * i],
      'pl', ARGV[13 + 2 * i])
  end
  return {0, g}
end
if op == 's' then
  redis.call('HSET', rec, 't', ARGV[8])
  local code = tonumber(ARGV[9])
  if code == 2 then
    redis.call('HSET', rec, 's', 2)
    redis.call('ZADD', KEYS[2], 0, ARGV[2])
  elseif code == 3 then
    settled(3, nil, at)
  else
    settled(code, ARGV[10], at + tonumber(ARGV[11]) - given)
  end
  return {0, g}
end
return redis.error_reply('unknown operation ' .. op)
