-- renew.lua: extend the lease of (token, fence) by lease_ms, never past its
-- max-hold deadline. Never revives a lease that already expired.
--
-- KEYS: the seven lock keys, see lib.lua.
-- ARGV[1] request token of the lease
-- ARGV[2] fence of the lease
-- ARGV[3] lease_ms: new time to live in milliseconds
--
-- Returns:
--   {1, pttl_ms}  renewed; the lease now lives pttl_ms more
--   {0}           refused: the lease is not held by this holder any more
--   {-2}          refused: the max-hold deadline has passed
local token, fence, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'deadline')
if held[1] ~= token or tonumber(held[2]) ~= fence then
    return {0}
end
local remaining = (tonumber(held[3]) or 0) - now_ms()
if remaining <= 0 then
    return {-2}
end
local ttl = math.min(lease_ms, remaining)
redis.call('PEXPIRE', K_LEASE, ttl)
return {1, ttl}
