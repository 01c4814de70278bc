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
local FMT = '>BI4dddI1c0I1c0I1c0I2c0I2c0I2c0I4c0'
local rec = KEYS[1]
local op = ARGV[1]
local blob = redis.call('GET', rec)
if not blob then
  return {-1}
end
local s, g, c, e, d, k, f, t, tn, sb, tl, r = struct.unpack(FMT, blob)
if k ~= ARGV[3] then
  return {-1}
end
if t ~= ARGV[4] then
  return {-2, g}
end
if not (s == 0 or (op == 's' and s == 2)) then
  return {-3, g, s}
end

local function blob_now()
  return struct.pack(FMT, s, g, c, e, d, #k, k, #f, f, #t, t, #tn, tn, #sb, sb, #tl, tl, #r, r)
end

if op == 'u' then
  s = 2
  redis.call('SET', rec, blob_now())
  redis.call('ZADD', KEYS[2], 0, ARGV[2])
  return {0, g}
end

local time = redis.call('TIME')
local real = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local given = tonumber(ARGV[6])
local now = given
if ARGV[5] ~= '1' then
  now = real
end
local off = now - given

if op == 'n' then
  e = tonumber(ARGV[8]) + off
  redis.call('SET', rec, blob_now())
  redis.call('ZADD', KEYS[2], e, ARGV[2])
  return {0, g}
end

-- Never earlier than the claim: a clock that steps back cannot end a window early.
local at = math.max(now, c)
local function settled(state, body, ends)
  s, d, e, r = state, at, ends, body
  -- Native retention: gone at window end + retention (on the server's own clock).
  redis.call('SET', rec, blob_now(), 'PXAT', ends + tonumber(ARGV[7]) + (real - now))
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZADD', KEYS[3], ends, ARGV[2])
end

if op == 'r' then
  settled(3, '', at)
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
  t = ARGV[8]
  local code = tonumber(ARGV[9])
  if code == 2 then
    s = 2
    redis.call('SET', rec, blob_now())
    redis.call('ZADD', KEYS[2], 0, ARGV[2])
  elseif code == 3 then
    settled(3, '', at)
  else
    settled(code, ARGV[10], at + tonumber(ARGV[11]) - given)
  end
  return {0, g}
end
return redis.error_reply('unknown operation ' .. op)
