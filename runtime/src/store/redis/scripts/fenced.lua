-- The fenced updates of one record: complete, release, mark unknown, renew, settle, and the
-- takeover of a call whose worker is gone. Each applies only when the token presented is the
-- record's and its state allows it; the takeover is fenced by the state and the lease instead
-- (its token is the new one).
-- KEYS: 1 record, 2 the shard's index, 3 the shard's outbox stream, 4 the record's channel
-- (one hash slot).
-- ARGV: 1 op ('c' complete, 'r' release, 'u' unknown, 'n' renew, 's' settle, 't' take over), 2 key_rest
-- (24 bytes), 3 token (8 bytes), 4 two flags: '1' to trust the caller's times (else '0'), then
-- 's' to announce on a shard channel (a cluster) or 'p' on a channel, 5 now ('0' for 'u'),
-- 6 retention ms, then per op:
--   c: 7 state code (1 ok, 4 error), 8 body, 9 message count, then topic, payload...
--   n: 7 lease end
--   t: 7 lease end (3 is the new token; in flight with its lease ended, or unknown, only)
--   s: 7 new token (8 bytes; unused for 2, which keeps the token), 8 state code (1, 4, 3
--      released, 2 unknown), 9 body
-- A completed answer is replayed for the record's own window (the claim's, in its head).
-- Returns {0, gen} done | {-1} no record of this key | {-2, gen} fenced | {-3, gen, state}.
--
-- The index holds every record of the shard once: unsettled ones scored by lease end (unknown
-- ones at 0), settled ones by window end - 2^50 (a band of their own, far below any lease).
local BAND = 1125899906842624
local rec = KEYS[1]
local op = ARGV[1]
local blob = redis.call('GET', rec)
if not blob then
  return {-1}
end
local s, g, c, e, d, w = struct.unpack('>BI4dddd', blob)
if string.sub(blob, 38, 61) ~= ARGV[2] then
  return {-1}
end
if op ~= 't' and string.sub(blob, 62, 69) ~= ARGV[3] then
  return {-2, g}
end
-- An unknown record is still its worker's to complete or release (same token: a round marked it
-- unknown while the worker was paused or cut off, and nobody took over since).
if not (s == 0 or (op ~= 'u' and op ~= 'n' and s == 2)) then
  return {-3, g, s}
end
-- An unsettled record's answer is empty: its tail is everything between head and that.
if string.sub(blob, -4) ~= '\0\0\0\0' then
  return redis.error_reply('CORRUPT the unsettled record ' .. rec .. ' holds an answer')
end
local mid = string.sub(blob, 38, -5)
local member = string.sub(rec, -16)
local EMPTY = '\0\0\0\0'

-- A repeat waiting on another process marked the record (1.0 as its completion time while
-- unsettled, see watch.lua): tell it the record left flight, on the channel KEYS[4].
local watched = (s == 0 or s == 2) and d ~= 0
local function announce()
  if watched then
    if string.sub(ARGV[4], 2, 2) == 's' then
      redis.call('SPUBLISH', KEYS[4], '')
    else
      redis.call('PUBLISH', KEYS[4], '')
    end
  end
end

local function unknown()
  redis.call('SET', rec, struct.pack('>BI4dddd', 2, g, c, e, d, w) .. mid .. EMPTY)
  redis.call('ZADD', KEYS[2], 0, member)
  announce()
  return {0, g}
end

if op == 'u' then
  return unknown()
end

local time = redis.call('TIME')
local real = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local given = tonumber(ARGV[5])
local now = given
if string.sub(ARGV[4], 1, 1) ~= '1' then
  now = real
end
local off = now - given

if op == 't' then
  if s == 0 and e > now then
    return {-3, g, s}
  end
  e = tonumber(ARGV[7]) + off
  redis.call('SET', rec, struct.pack('>BI4dddd', 0, g, c, e, d, w) .. string.sub(mid, 1, 24) ..
    ARGV[3] .. string.sub(mid, 33) .. EMPTY)
  redis.call('ZADD', KEYS[2], e, member)
  return {0, g}
end

if op == 'n' then
  e = tonumber(ARGV[7]) + off
  redis.call('SET', rec, struct.pack('>BI4dddd', s, g, c, e, d, w) .. string.sub(blob, 38))
  redis.call('ZADD', KEYS[2], e, member)
  return {0, g}
end

-- Never earlier than the claim: a clock that steps back cannot end a window early.
local at = math.max(now, c)
local function settled(state, body, ends)
  -- Native retention: gone at window end + retention (on the server's own clock).
  redis.call('SET', rec, struct.pack('>BI4dddd', state, g, c, ends, at, w) .. mid ..
    struct.pack('>I4', #body) .. body, 'PXAT', ends + tonumber(ARGV[6]) + (real - now))
  redis.call('ZADD', KEYS[2], ends - BAND, member)
  announce()
end

if op == 'r' then
  settled(3, '', at)
  return {0, g}
end
if op == 'c' then
  settled(tonumber(ARGV[7]), ARGV[8], at + w)
  local n = tonumber(ARGV[9])
  if n > 0 and redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('XGROUP', 'CREATE', KEYS[3], 'g', '$', 'MKSTREAM')
  end
  for i = 0, n - 1 do
    redis.call('XADD', KEYS[3], '*', 'p', member, 'g', g, 'tp', ARGV[10 + 2 * i],
      'pl', ARGV[11 + 2 * i])
  end
  return {0, g}
end
if op == 's' then
  local code = tonumber(ARGV[8])
  if code == 2 then
    -- An unknown settlement keeps the token: the worker's late answer still lands.
    return unknown()
  end
  mid = string.sub(mid, 1, 24) .. ARGV[7] .. string.sub(mid, 33)
  if code == 3 then
    settled(3, '', at)
  else
    settled(code, ARGV[9], at + w)
  end
  return {0, g}
end
return redis.error_reply('unknown operation ' .. op)
