-- One shard's outbox messages visible at now: first those handed out before whose invisibility
-- ended (claimed again in the consumer group, so their delivery count goes up), then new ones
-- (read by the group). Each becomes invisible until invisible_until.
-- KEYS: 1 outbox stream, 2 visibility index (stream id -> visible again at).
-- ARGV: 1 now, 2 invisible until, 3 limit, 4 '1' to trust the caller's times.
-- Returns {id, fields, attempts before this one} per message.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local now = tonumber(ARGV[1])
local off = 0
if ARGV[4] ~= '1' then
  local t = redis.call('TIME')
  off = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - now
  now = now + off
end
local hidden = tonumber(ARGV[2]) + off
local limit = tonumber(ARGV[3])
local out = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
  local got = redis.call('XCLAIM', KEYS[1], 'g', 'c', 0, id)
  if #got == 0 or not got[1] then
    redis.call('ZREM', KEYS[2], id)
  else
    local p = redis.call('XPENDING', KEYS[1], 'g', id, id, 1)
    redis.call('ZADD', KEYS[2], hidden, id)
    out[#out + 1] = {id, got[1][2], p[1][4] - 1}
  end
end
if #out < limit then
  local new = redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', limit - #out, 'STREAMS',
    KEYS[1], '>')
  if new then
    for _, e in ipairs(new[1][2]) do
      redis.call('ZADD', KEYS[2], hidden, e[1])
      out[#out + 1] = {e[1], e[2], 0}
    end
  end
end
return out
