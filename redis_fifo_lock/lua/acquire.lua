-- acquire.lua: join the queue (or find our place in it) and take the lock if it
-- is free and we are the first live waiter, in one step.
--
-- KEYS: the seven lock keys, see lib.lua.
-- ARGV[1] doorbell channel prefix (a grant rings "<prefix>:<session>")
-- ARGV[2] request token (the caller's identity for this request)
-- ARGV[3] session id of the calling process (its liveness record)
-- ARGV[4] lease_ms: lease length in milliseconds for a grant to this request
-- ARGV[5] max_hold_ms: total renewal budget in milliseconds
-- ARGV[6] alive_ms: how long the session counts as alive from now, in milliseconds
--
-- Returns:
--   {1, fence, ticket, pttl_ms}  granted (now, or already: a re-sent acquire
--                                returns the same grant and never grants twice)
--   {0, ticket, holder_fence}    queued; the ticket is kept across re-sends;
--                                holder_fence is the current holder's fence
local doorbell, token, session = ARGV[1], ARGV[2], ARGV[3]
local lease_ms, max_hold_ms, alive_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
redis.call('ZADD', K_ALIVE, now + alive_ms, session)

local held = current_grant()
if held and held[1] == token then
    return {1, held[2], held[3], held[4]}
end

local ticket = tonumber(redis.call('ZSCORE', K_QUEUE, token))
if not ticket then
    ticket = redis.call('INCR', K_TICKETS)
    redis.call('ZADD', K_QUEUE, ticket, token)
end
redis.call('HSET', K_WAITERS, token, session .. ' ' .. lease_ms .. ' ' .. max_hold_ms)

local granted = grant_next(now, doorbell)
if granted and granted[1] == token then
    return {1, granted[2], granted[3], granted[4]}
end
local holder = current_grant()
return {0, ticket, holder and holder[2] or 0}
