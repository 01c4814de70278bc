-- The claim, in one round trip: create, take over, or report the record under the reference.
-- KEYS: 1 record, 2 unsettled index, 3 settled index (one hash slot: the shard's hash tag).
-- ARGV: 1 index member (reference prefix, hex), 2 key_rest (24 bytes), 3 tenant, 4 subject
-- ('' for a tenant-scoped record), 5 tool, 6 fingerprint ('' for none), 7 now, 8 lease end,
-- 9 token (decimal: tokens do not fit a Lua number), 10 '1' to trust the caller's times.
-- Times are decided on the server's clock: every time of the call is shifted by
-- TIME - now; the times returned are shifted back into the caller's frame.
-- Returns {0, gen} new | {1, gen, claimed, lease} in flight | {2, gen, state, completed, body}
-- completed | {3, gen, claimed} unknown | {4, gen} mismatch | {5, gen} reference taken.
--
-- A record is one string (see mod.rs, `Record`): state, generation, claimed, lease or window
-- end, completed (doubles: exact for milliseconds), then key_rest, fingerprint, token, tenant,
-- subject, tool and answer, each after its length.
local FMT = '>BI4dddI1c0I1c0I1c0I2c0I2c0I2c0I4c0'
local now = tonumber(ARGV[7])
local off = 0
if ARGV[10] ~= '1' then
  local t = redis.call('TIME')
  off = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - now
  now = now + off
end
local lease = tonumber(ARGV[8]) + off
local rec = KEYS[1]
local blob = redis.call('GET', rec)

-- A plain SET also ends the expiry of a settled record it takes over.
local function take(g, existed)
  local k, f, t, tn, sb, tl = ARGV[2], ARGV[6], ARGV[9], ARGV[3], ARGV[4], ARGV[5]
  redis.call('SET', rec, struct.pack(FMT, 0, g, now, lease, 0, #k, k, #f, f, #t, t, #tn, tn,
    #sb, sb, #tl, tl, 0, ''))
  if existed then
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  redis.call('ZADD', KEYS[2], lease, ARGV[1])
  return {0, g}
end

-- A settled-index entry left by a record that expired is harmless: purge drops it.
if not blob then
  return take(1, false)
end
local s, g, c, e, d, k, f, _, _, _, _, r = struct.unpack(FMT, blob)
if k ~= ARGV[2] then
  return {5, g}
end
if s == 3 then
  return take(g, true)
end
if (s == 1 or s == 4) and now >= e then
  return take(g + 1, true)
end
if f ~= '' and ARGV[6] ~= '' and f ~= ARGV[6] then
  return {4, g}
end
if s == 0 then
  return {1, g, c - off, e - off}
end
if s == 2 then
  return {3, g, c - off}
end
return {2, g, s, d - off, r}
