-- One shard's count of what purge would delete (the admin tool's dry run): settled records
-- whose window ended before older_than, read from the settled band of the shard's index.
-- KEYS: 1 the shard's index. ARGV: 1 now, 2 older_than, 3 '1' to trust the caller's times,
-- 4 the shard's record key prefix.
local BAND = 1125899906842624
local older = tonumber(ARGV[2])
if ARGV[3] ~= '1' then
  local t = redis.call('TIME')
  older = older + tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
end
local n = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', older - 1 - BAND)) do
  local blob = redis.call('GET', ARGV[4] .. m)
  if blob then
    local s, _, _, e = struct.unpack('>BI4dd', blob)
    if (s == 1 or s == 3 or s == 4) and e < older then
      n = n + 1
    end
  end
end
return n
