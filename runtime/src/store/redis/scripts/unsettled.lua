-- One shard's claims to reconcile: in flight with the lease ended at or before now, or unknown.
-- KEYS: 1 unsettled index. ARGV: 1 now, 2 '1' to trust the caller's times, 3 at most this many,
-- 4 the shard's record key prefix (records are under it + index member).
-- Returns {member, key_rest, gen, state, token, claimed, tenant, subject, tool} per claim;
-- entries whose record moved on (settled, or expired) are dropped from the index on the way.
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
  local r = redis.call('HMGET', ARGV[4] .. m, 'k', 'g', 's', 't', 'c', 'e', 'tn', 'sb', 'tl')
  if not r[1] or (r[3] ~= '0' and r[3] ~= '2') then
    redis.call('ZREM', KEYS[1], m)
  elseif r[3] == '2' or tonumber(r[6]) <= now then
    out[#out + 1] = {m, r[1], tonumber(r[2]), tonumber(r[3]), r[4], tonumber(r[5]) - off, r[7],
      r[8], r[9]}
  end
end
return out
