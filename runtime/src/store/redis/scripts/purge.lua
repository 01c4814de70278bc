-- One shard's purge: deletes settled records whose window ended before older_than, up to a
-- limit, reading the shard's settled index (never the keyspace). Records expire natively
-- anyway (window end + retention); entries of records already gone are dropped, not counted.
-- KEYS: 1 settled index. ARGV: 1 now, 2 older_than, 3 '1' to trust the caller's times,
-- 4 limit, 5 the shard's record key prefix.
local older = tonumber(ARGV[2])
if ARGV[3] ~= '1' then
  local t = redis.call('TIME')
  older = older + tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
end
local limit = tonumber(ARGV[4])
local n = 0
for _ = 1, 100 do
  local batch = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', older - 1, 'LIMIT', 0, limit - n)
  if #batch == 0 then
    break
  end
  for _, m in ipairs(batch) do
    local rec = ARGV[5] .. m
    local blob = redis.call('GET', rec)
    if blob then
      -- The record's head: state, generation, claimed, window end.
      local s, _, _, e = struct.unpack('>BI4dd', blob)
      if (s == 1 or s == 3 or s == 4) and e < older then
        redis.call('DEL', rec)
        n = n + 1
      end
    end
    redis.call('ZREM', KEYS[1], m)
  end
  if n >= limit then
    break
  end
end
return n
