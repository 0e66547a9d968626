-- force_release.lua: an operator frees a lock whose holder is stuck, and the
-- lock goes to the next live waiter, in one step. The evicted holder is not
-- told: its next renewal is refused (its lease is gone), which marks it lost,
-- and its release fails as for any lost lease. The next grant gets a higher
-- fence, as every grant does, so a resource that checks fences refuses the
-- evicted holder's late writes.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   fence: the fence of the grant to evict; 0 for whichever grant holds the
--     lock (a non-zero fence keeps a lock that changed hands since the
--     operator looked from being taken from its new holder)
--   keep_ms: see acquire.lua
--
-- Returns:
--   {1, evicted_fence, holder}  the grant was evicted (holder: its description)
--   {0, holder_fence}           nothing evicted: nobody holds the lock
--                               (holder_fence 0), or the holder's fence is not
--                               `fence`
local fence, keep_text = arguments(2)
local doorbell = DOORBELL
fence = tonumber(fence)
whole(keep_text)
local now, now_us = clock()
local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'call', 'holder')
if not held[1] or (fence ~= 0 and tonumber(held[2]) ~= fence) then
    return {0, tonumber(held[2]) or 0}
end
-- Recorded as lost (not released): the holder did not give it up.
end_grant(held[3] or '-', ENDED_LOST, now)
grant_next(now, now_us, doorbell, false, false)
touch(keep_text)
return {1, tonumber(held[2]), held[4] or ''}
