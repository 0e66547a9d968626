-- withdraw.lua: a request gives up (timeout or cancellation). If it is still
-- queued it leaves the queue; if its grant landed meanwhile, the grant is given
-- back and handed to the next waiter at once, so the lock never stalls.
--
-- KEYS: the seven lock keys, see lib.lua.
-- ARGV[1] doorbell channel prefix (a grant rings "<prefix>:<session>")
-- ARGV[2] request token
--
-- Returns:
--   1  withdrawn from the queue (cancelled before the grant)
--   2  the grant had landed and was given back (cancelled after the grant)
--   0  nothing to withdraw (never queued, or already gone)
local doorbell, token = ARGV[1], ARGV[2]
if redis.call('ZREM', K_QUEUE, token) == 1 then
    redis.call('HDEL', K_WAITERS, token)
    grant_next(now_ms(), doorbell)
    return 1
end
local held = current_grant()
if held and held[1] == token then
    redis.call('DEL', K_LEASE)
    note_release(token, held[2])
    grant_next(now_ms(), doorbell)
    return 2
end
return 0
