-- A repeat on another process starts waiting for a record (see notices.rs): marks the record
-- as watched when it is in flight, so that its settlement announces itself.
-- KEYS: 1 record, 2 the record's watch key (one hash slot). ARGV: 1 the watch key's expiry (ms).
-- Returns 1 when the record is in flight (marked now or before), 0 when it is not.
--
-- The mark is 1.0 in the record's completion time (bytes 22-29 of the head), which an
-- in-flight record never uses otherwise (0 until settled; renewals, takeovers and marking it
-- unknown keep it). A marked record is no longer the string its claim wrote, so the
-- compare-and-set completions and releases (settle.lua, SET … IFEQ; see cas.rs) do not apply
-- and the fenced script, which announces a marked record's settlement, decides instead. So a
-- settlement costs no watch-key work unless someone waits. The watch key is still set, with an
-- expiry, for processes of the previous version, whose settlements announce through it.
local MARK = struct.pack('>d', 1)
local blob = redis.call('GET', KEYS[1])
if not blob or #blob < 37 or string.byte(blob, 1) ~= 0 then
  return 0
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
if string.sub(blob, 22, 29) ~= MARK then
  redis.call('SETRANGE', KEYS[1], 21, MARK)
end
return 1
