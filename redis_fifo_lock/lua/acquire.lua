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
--         that finds its token queued or granted takes that request over, and
--         the call it replaces counts as ended
--
-- Returns:
--   {1, fence, ticket, pttl_ms}  granted (now, or already: a re-sent acquire
--                                returns the same grant and never grants twice)
--   {0, ticket, holder_fence}    queued; the ticket is kept across re-sends;
--                                holder_fence is the current holder's fence
--   {-1, how}                    refused: this call's request already ended, or
--                                was taken over by a later call (how is an
--                                ENDED_* code): a late copy changes nothing
local doorbell, token, session = ARGV[1], ARGV[2], ARGV[3]
local lease_ms, max_hold_ms, alive_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local keep_ms, requeue, call = tonumber(ARGV[7]), ARGV[8] == '1', ARGV[9]
local holder = ARGV[10] or ''
local now, now_us = clock()

-- A call whose request ended, or was taken over by a later call of the same
-- token: a late copy of it changes nothing. Only a request that lost its place
-- without giving it up may come back (requeue).
local how = ended(token, call)
if how and not (requeue and (how == ENDED_LOST or how == ENDED_DROPPED)) then
    return {-1, how}
end
if how then
    redis.call('ZREM', K_FINISHED, token .. ' ' .. call)
end

-- A retry of the token (a new call) takes its request over; the call it
-- replaces is recorded as ended, so that nothing it sent late acts again.
local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'ticket', 'call')
if held[1] == token then
    if held[4] ~= call then
        finish(token, held[4] or '-', ENDED_WITHDRAWN, now, keep_ms)
        redis.call('HSET', K_LEASE, 'call', call)
        redis.call('HSET', K_COUNTERS, 'holder_call', call)
    end
    return {1, tonumber(held[2]), tonumber(held[3]), redis.call('PTTL', K_LEASE)}
end

local ticket = tonumber(redis.call('ZSCORE', K_QUEUE, token))
if ticket then
    local waiter = waiter_of(token)
    if waiter and waiter[4] ~= call then
        finish(token, waiter[4], ENDED_WITHDRAWN, now, keep_ms)
    end
else
    ticket = next_number('ticket', now_us)
    redis.call('ZADD', K_QUEUE, int(ticket), token)
end
redis.call('HSET', K_WAITERS, token,
    session .. ' ' .. lease_ms .. ' ' .. max_hold_ms .. ' ' .. call .. ' ' .. holder)
redis.call('ZADD', K_ALIVE, int(now + alive_ms), session)

local granted = grant_next(now, now_us, doorbell, keep_ms, token, false)
touch(keep_ms)
if granted and granted[1] == token then
    return {1, granted[2], granted[3], granted[4]}
end
local holder = current_grant()
return {0, ticket, holder and holder[2] or 0}
