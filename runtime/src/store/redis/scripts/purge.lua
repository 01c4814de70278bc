-- One shard's purge: deletes settled records whose window ended before older_than, up to a
-- limit, reading the settled band of the shard's index (scores window end - 2^50), never the
-- keyspace. Records expire natively anyway (window end + retention); entries of records
-- already gone are dropped, not counted.
-- KEYS: 1 the shard's index. ARGV: 1 now, 2 older_than, 3 '1' to trust the caller's times,
-- 4 limit, 5 the shard's record key prefix.
local BAND = 1125899906842624
local older = tonumber(ARGV[2])
if ARGV[3] ~= '1' then
  local t = redis.call('TIME')
  older = older + tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
end
local limit = tonumber(ARGV[4])
local n, kept = 0, 0
for _ = 1, 100 do
  local batch = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', older - 1 - BAND, 'LIMIT', kept,
    limit - n)
  if #batch == 0 then
    break
  end
  for _, m in ipairs(batch) do
    local rec = ARGV[5] .. m
    local blob = redis.call('GET', rec)
    local gone, s, e = not blob, nil, nil
    if blob then
      -- The record's head: state, generation, claimed, window end.
      s, _, _, e = struct.unpack('>BI4dd', blob)
      if (s == 1 or s == 3 or s == 4) and e < older then
        redis.call('DEL', rec)
        n = n + 1
        gone = true
      end
    end
    if gone then
      redis.call('ZREM', KEYS[1], m)
    elseif s == 0 or s == 2 then
      -- A record claimed again after it expired, whose claim died before it moved the old
      -- entry (see claim.rs): into the unsettled band, where the reconciler reads it.
      redis.call('ZADD', KEYS[1], s == 0 and e or 0, m)
    else
      -- A settled record not past the cutoff (never the case: every write moves its entry).
      kept = kept + 1
    end
  end
  if n >= limit then
    break
  end
end
return n
