-- renew.lua: extend the lease of (token, fence) by lease_ms, never past its
-- max-hold deadline. Never revives a lease that already expired.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   token: the lease's request token
--   fence: the lease's fence
--   lease_ms: new time to live in milliseconds
--   keep_ms: see acquire.lua
--
-- Returns one string of fields (see reply in lib.lua) "<outcome> <pttl_ms>
-- <now_ms>", now_ms the server's clock (by which it expires keys), so that
-- the holder can tell a step of that clock:
--   "1 <pttl_ms> <now_ms>"  renewed; the lease now lives pttl_ms more
--   "0 0 <now_ms>"          refused: the lease is not held by this holder any more
--   "-2 0 <now_ms>"         refused: the max-hold deadline has passed
local token, fence, lease_ms, keep_text = arguments(4)
fence, lease_ms = tonumber(fence), tonumber(lease_ms)
whole(keep_text)
local now = clock()
local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'deadline')
if held[1] ~= token or tonumber(held[2]) ~= fence then
    return reply(0, 0, now)
end
local remaining = (tonumber(held[3]) or 0) - now
if remaining <= 0 then
    return reply(-2, 0, now)
end
local ttl = math.min(lease_ms, remaining)
redis.call('PEXPIRE', K_LEASE, int(ttl))
touch(keep_text)
return reply(1, ttl, now)
