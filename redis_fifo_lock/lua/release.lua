-- release.lua: free the lock held by (token, fence) and hand it to the next live
-- waiter, in one step.
--
-- KEYS: the seven lock keys, see lib.lua.
-- ARGV[1] doorbell channel prefix (a grant rings "<prefix>:<session>")
-- ARGV[2] request token of the lease
-- ARGV[3] fence of the lease
--
-- Returns:
--    1  released (and handed off if anyone was waiting)
--    0  this lease was already released: a re-sent release (hands off if the
--       first one freed the lock without doing so)
--   -1  the lease is not held: it expired or was never granted (lease lost)
local doorbell, token, fence = ARGV[1], ARGV[2], tonumber(ARGV[3])
local held = current_grant()
if held and held[1] == token and held[2] == fence then
    redis.call('DEL', K_LEASE)
    note_release(token, fence)
    grant_next(now_ms(), doorbell)
    return 1
end
if tonumber(redis.call('ZSCORE', K_RELEASED, token)) == fence then
    -- A re-sent release. The first one may have been cut short after freeing
    -- the lock (a Redis Cluster slot migrating mid-script): hand off now if
    -- nobody holds it, rather than leave the lock to the next poll.
    grant_next(now_ms(), doorbell)
    return 0
end
return -1
