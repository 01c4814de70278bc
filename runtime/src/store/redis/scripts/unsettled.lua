-- One shard's claims to reconcile: in flight with the lease ended at or before now, or unknown.
-- KEYS: 1 unsettled index. ARGV: 1 now, 2 '1' to trust the caller's times, 3 at most this many,
-- 4 the shard's record key prefix (records are under it + index member).
-- Returns {member, key_rest, gen, state, token, claimed, tenant, subject, tool} per claim;
-- entries whose record moved on (settled, or expired) are dropped from the index on the way.
local FMT = '>BI4dddI1c0I1c0I1c0I2c0I2c0I2c0I4c0'
local now = tonumber(ARGV[1])
local off = 0
if ARGV[2] ~= '1' then
  local t = redis.call('TIME')
  off = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - now
  now = now + off
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, m in ipairs(due) do
  local blob = redis.call('GET', ARGV[4] .. m)
  local s, g, c, e, k, t, tn, sb, tl
  if blob then
    local _d, _f
    s, g, c, e, _d, k, _f, t, tn, sb, tl = struct.unpack(FMT, blob)
  end
  if not blob or (s ~= 0 and s ~= 2) then
    redis.call('ZREM', KEYS[1], m)
  elseif s == 2 or e <= now then
    out[#out + 1] = {m, k, g, s, t, c - off, tn, sb, tl}
  end
end
return out
