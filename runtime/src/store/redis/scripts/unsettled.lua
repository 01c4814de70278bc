-- One shard's claims to reconcile: in flight with the lease ended at or before now, or unknown.
-- KEYS: 1 the shard's index. ARGV: 1 now, 2 '1' to trust the caller's times, 3 at most this
-- many, 4 the shard's record key prefix (records are under it + index member).
-- Reads the index's unsettled band only (scores from -2^49: settled records sit below, at
-- window end - 2^50). Returns {member, key_rest, gen, state, token (8 bytes), claimed, tenant,
-- subject, tool, window (ms)} per claim; entries whose record is gone are dropped on the way.
local HEAD = '>BI4ddddc24c8I1c0I2c0I2c0I2c0'
local now = tonumber(ARGV[1])
local off = 0
if ARGV[2] ~= '1' then
  local t = redis.call('TIME')
  off = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - now
  now = now + off
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], -562949953421312, now, 'LIMIT', 0,
  tonumber(ARGV[3]))
local out = {}
for _, m in ipairs(due) do
  local blob = redis.call('GET', ARGV[4] .. m)
  if not blob then
    redis.call('ZREM', KEYS[1], m)
  else
    local s, g, c, e, _, w, k, t, _, tn, sb, tl = struct.unpack(HEAD, blob)
    if s == 2 or (s == 0 and e <= now) then
      out[#out + 1] = {m, k, g, s, t, c - off, tn, sb, tl, w}
    end
  end
end
return out
