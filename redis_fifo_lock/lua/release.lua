-- release.lua: free the lock held by (token, fence) and hand it to the next live
-- waiter, in one step.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   token: the lease's request token
--   fence: the lease's fence
--   keep_ms: see acquire.lua
--   call: id of the acquire call the lease answered (see acquire.lua)
--   session: the releasing process's session: a grant to one of its own
--     waiters is returned, not rung (it hands over without a pub/sub hop)
--   floor: the releasing process's floor (see lib.lua)
--
-- Returns outcome (a number) or, when the lock went to a waiter of `session`
-- (or, for a re-sent release, is held by a grant to `session`), one string of
-- fields (see reply in lib.lua) "<outcome> <token> <fence> <ticket> <pttl_ms>
-- <call> <queued>" (queued: requests still queued behind that grant, a
-- count); outcome is:
--    1  released (and handed off if anyone was waiting)
--    0  this lease was already released: a re-sent release (hands off if the
--       first one freed the lock without doing so), or a late copy of one
--       whose process had its answer (ENDED_SETTLED)
--   -1  the lease is not held: it expired or was never granted (lease lost)
local token, fence, keep_text, call, session, floor = arguments(6)
local doorbell = DOORBELL
fence = tonumber(fence)
local keep_ms = tonumber(whole(keep_text))
local now, now_us = clock()
advance(floor, now, keep_ms)
-- The call as well as the grant: a later call of the token may have taken the
-- grant over (a retry, or a request made after its holder dropped the lease);
-- a late release of the call it replaced must leave it to its new holder.
local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'call')
local result = -1
if held[1] == token and tonumber(held[2]) == fence and held[3] == call then
    end_grant(call, ENDED_RELEASED, now)
    result = 1
else
    -- A re-sent release. The first one may have been cut short after freeing
    -- the lock (a Redis Cluster slot migrating mid-script): the hand-off below
    -- then happens now, rather than at the next poll. Below its process's
    -- floor (ENDED_SETTLED) the process had its answer already: this copy is
    -- late, and nobody reads its reply. (A grant no script ended is not
    -- settled, whatever the floor says: its lease ran out, see ended.)
    local how = ended(call)
    if how == ENDED_RELEASED or how == ENDED_SETTLED then
        result = 0
    end
end
local granted = grant_next(now, now_us, doorbell, false, session)
touch(keep_text)
if granted and granted[6] == session then
    return reply(result, granted[1], granted[2], granted[3], granted[4], granted[5],
        redis.call('ZCARD', K_QUEUE))
end
if result == 0 then
    -- A re-sent release: the first copy may have handed the lock to a waiter of
    -- this process in a reply that never arrived (no ring was sent for it).
    -- Hand the current grant of this process over again; the process wakes its
    -- waiter if it still waits, and leaves a grant it already holds alone.
    local lease = redis.call('HMGET', K_LEASE, 'token', 'fence', 'ticket', 'session', 'call')
    if lease[4] == session then
        return reply(result, lease[1], lease[2], lease[3],
            redis.call('PTTL', K_LEASE), lease[5], redis.call('ZCARD', K_QUEUE))
    end
end
return result
