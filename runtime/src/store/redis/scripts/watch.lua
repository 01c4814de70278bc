-- A repeat on another process starts waiting for a record (see notices.rs): marks the record
-- as watched when it is in flight, so that its settlement announces itself.
-- KEYS: 1 record.
-- Returns 1 when the record is in flight (marked now or before), 0 when it is not.
--
-- The mark is 1.0 in the record's completion time (bytes 22-29 of the head), which an
-- in-flight record never uses otherwise (0 until settled; renewals, takeovers and marking it
-- unknown keep it). A marked record is no longer the string its claim wrote, so the
-- compare-and-set completions and releases (settle.lua, SET … IFEQ; see cas.rs) do not apply
-- and the fenced script, which announces a marked record's settlement, decides instead. So a
-- settlement costs nothing for the waiters unless someone waits.
local MARK = struct.pack('>d', 1)
local blob = redis.call('GET', KEYS[1])
if not blob or #blob < 37 or string.byte(blob, 1) ~= 0 then
  return 0
end
if string.sub(blob, 22, 29) ~= MARK then
  redis.call('SETRANGE', KEYS[1], 21, MARK)
end
return 1
