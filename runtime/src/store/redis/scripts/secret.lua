-- The store's secret fingerprint (SecretStore::swap_secret), compare-and-set.
-- KEYS[1] `<ns>:secret`; ARGV[1] the expected fingerprint ('' when none is expected), ARGV[2]
-- the new one. Answers the fingerprint stored afterwards (nil: none).
local found = redis.call('GET', KEYS[1])
if (found == false and ARGV[1] == '') or found == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2])
    return ARGV[2]
end
return found
