-- The claim, in one round trip: create, take over, or report the record under the reference.
-- KEYS: 1 record, 2 the shard's index (one hash slot: the shard's hash tag).
-- ARGV: 1 now, 2 lease end, 3 '1' to trust the caller's times, 5 the tool's window (ms, kept
-- on the record for its completion and settlements), 4 the record's tail as packed
-- by the client: key_rest (24 bytes), token (8), fingerprint (1-byte length, '' for none),
-- tenant, subject ('' for a tenant-scoped record), tool (2-byte lengths each), an empty answer
-- (4-byte length 0).
-- Times are decided on the server's clock: every time of the call is shifted by
-- TIME - now; the times returned are shifted back into the caller's frame.
-- Returns {0, gen, head} new (the head written: with the tail, the record's whole string) | {1, gen, claimed, lease} in flight | {2, gen, state, completed, body}
-- completed | {3, gen, claimed} unknown | {4, gen} mismatch | {5, gen} reference taken.
--
-- A record (see mod.rs, `Record`) is one string: a 37-byte head (state, generation, claimed,
-- lease or window end, completed, window; doubles are exact for milliseconds), then the tail above with
-- the answer in place of the empty one. The index member is the record key's last 16 bytes.
local now = tonumber(ARGV[1])
local off = 0
if ARGV[3] ~= '1' then
  local t = redis.call('TIME')
  off = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - now
  now = now + off
end
local lease = tonumber(ARGV[2]) + off
local rec, tail = KEYS[1], ARGV[4]
local blob = redis.call('GET', rec)

-- A plain SET also ends the expiry of a settled record it takes over; ZADD moves its index
-- entry from the settled band into the unsettled one (scored by lease end).
-- Each claim of a record is later than the one before it (`after`: the record's last claim
-- time + 1 ms), whatever the clocks did: the claim time names the claim (MCP task ids).
local function take(g, after)
  local head = struct.pack('>BI4dddd', 0, g, math.max(now, after), lease, 0, tonumber(ARGV[5]))
  redis.call('SET', rec, head .. tail)
  redis.call('ZADD', KEYS[2], lease, string.sub(rec, -16))
  return {0, g, head}
end

if not blob then
  return take(1, now)
end
-- A record the store did not write this way is refused (CORRUPT: see conn.rs), never taken
-- over or answered from: a repeat would get the same answer, so the caller is told so.
local function corrupt(what)
  return redis.error_reply('CORRUPT the record ' .. rec .. ' ' .. what)
end
-- The head, key_rest, token and the five lengths (all fields empty).
if #blob < 80 then
  return corrupt('is ' .. #blob .. ' bytes long, shorter than its fixed fields')
end
local s, g, c, e, d, w = struct.unpack('>BI4dddd', blob)
if s > 4 then
  return corrupt('has an unknown state ' .. s)
end
if g < 1 then
  return corrupt('has generation 0')
end
for _, t in ipairs({c, e, d, w}) do
  if t ~= t or t == math.huge or t == -math.huge then
    return corrupt('holds a time that is not a number')
  end
end
if string.sub(blob, 38, 61) ~= string.sub(tail, 1, 24) then
  return {5, g}
end
if s == 3 then
  return take(g, c + 1)
end
if (s == 1 or s == 4) and now >= e then
  return take(g + 1, c + 1)
end
local ok, f, tn, sb, tl, r, after = pcall(struct.unpack, '>I1c0I2c0I2c0I2c0I4c0', blob, 70)
if not ok or after ~= #blob + 1 then
  return corrupt('has field lengths that do not add up to its size')
end
if #f ~= 0 and #f ~= 32 then
  return corrupt('has a fingerprint of ' .. #f .. ' bytes')
end
local asked = struct.unpack('>I1c0', tail, 33)
if f ~= '' and asked ~= '' and f ~= asked then
  return {4, g}
end
if s == 0 then
  return {1, g, c - off, e - off}
end
if s == 2 then
  return {3, g, c - off}
end
return {2, g, s, d - off, r}
