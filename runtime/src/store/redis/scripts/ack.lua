-- Acknowledges one outbox message: out of the group's pending list, the stream and the
-- visibility index. Acknowledging one already gone changes nothing.
-- KEYS: 1 outbox stream, 2 visibility index. ARGV: 1 stream id.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.pcall('XACK', KEYS[1], 'g', ARGV[1])
  redis.call('XDEL', KEYS[1], ARGV[1])
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 0
