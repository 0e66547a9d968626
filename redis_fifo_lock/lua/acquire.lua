-- acquire.lua: join the queue (or find our place in it) and take the lock if it
-- is free and we are the first live waiter, in one step.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] doorbell channel prefix (a grant rings "<prefix>:<session>")
-- ARGV[2] request token (the caller's identity for this request)
-- ARGV[3] session id of the calling process (its liveness record)
-- ARGV[4] lease_ms: lease length in milliseconds for a grant to this request
-- ARGV[5] max_hold_ms: total renewal budget in milliseconds
-- ARGV[6] alive_ms: how long the session counts as alive from now, in milliseconds
-- ARGV[7] keep_ms: how long, in milliseconds, an idle name's keys and a
--         finished request's record are kept
-- ARGV[8] requeue: 1 when the request lost its place (its grant expired
--         unclaimed, or its session was presumed dead) and joins again at the
--         back; 0 for a first (or re-sent) acquire
-- ARGV[9] call: id of the acquire call sending this (unique per call); a call
--         that finds its token queued or granted adopts that request
--
-- Returns:
--   {1, fence, ticket, pttl_ms}  granted (now, or already: a re-sent acquire
--                                returns the same grant and never grants twice)
--   {0, ticket, holder_fence}    queued; the ticket is kept across re-sends;
--                                holder_fence is the current holder's fence
--   {-1, how}                    refused: this call's request already ended (how
--                                is an ENDED_* code): a late copy of its acquire
--                                changes nothing
local doorbell, token, session = ARGV[1], ARGV[2], ARGV[3]
local lease_ms, max_hold_ms, alive_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local keep_ms, requeue, call = tonumber(ARGV[7]), ARGV[8] == '1', ARGV[9]
local now, now_us = clock()

local held = current_grant()
if held and held[1] == token then
    redis.call('HSET', K_LEASE, 'call', call)
    redis.call('HSET', K_COUNTERS, 'holder_call', call)
    return {1, held[2], held[3], held[4]}
end

local ticket = tonumber(redis.call('ZSCORE', K_QUEUE, token))
if not ticket then
    local how = ended(token, call)
    -- Only a request that lost its place without giving it up may come back.
    if how and not (requeue and (how == ENDED_LOST or how == ENDED_DROPPED)) then
        return {-1, how}
    end
    if how then
        redis.call('ZREM', K_FINISHED, token .. ' ' .. call)
    end
    ticket = next_number('ticket', now_us)
    redis.call('ZADD', K_QUEUE, int(ticket), token)
end
redis.call('HSET', K_WAITERS, token,
    session .. ' ' .. lease_ms .. ' ' .. max_hold_ms .. ' ' .. call)
redis.call('ZADD', K_ALIVE, int(now + alive_ms), session)

local granted = grant_next(now, now_us, doorbell, keep_ms, token, false)
touch(keep_ms)
if granted and granted[1] == token then
    return {1, granted[2], granted[3], granted[4]}
end
local holder = current_grant()
return {0, ticket, holder and holder[2] or 0}
