-- acquire.lua: join the queue (or find our place in it) and take the lock if it
-- is free and we are the first live waiter, in one step.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   token: the request's token (the caller's identity for this request)
--   session: id of the calling process's liveness session
--   lease_ms: lease length in milliseconds for a grant to this request
--   max_hold_ms: total renewal budget in milliseconds
--   alive_ms: how long the session counts as alive from now, in milliseconds
--   keep_ms: how long, in milliseconds, an idle name's keys, and the records
--     of a session no script spoke of, are kept
--   floor: the calling process's floor, "<process>/<seq>" (see lib.lua)
--   call: id of the acquire call sending this, "<process>/<seq>" (see
--     lib.lua); a call that finds its token queued or granted takes that
--     request over (unless it is an earlier call of the same process: a late
--     copy), and the call it replaces counts as ended. A request that lost its
--     place (its grant expired unclaimed, or its session was presumed dead)
--     joins again at the back with a new call
--   ring_key: a secret of this call, which signs the ring of its grant (see
--     grant_next in lib.lua)
--   holder: a short description of the caller (host, pid, task...), shown by
--     status.lua, never used for a decision; "" for none
--
-- Returns one string of fields (see reply in lib.lua):
--   "1 <fence> <ticket> <pttl_ms> <queued>"
--                                granted (now, or already: a re-sent acquire
--                                returns the same grant and never grants twice);
--                                queued: requests still queued behind it (a count)
--   "0 <ticket> <holder_fence> <holder_pttl_ms>"
--                                queued; the ticket is kept across re-sends;
--                                holder_fence is the current holder's fence, and
--                                holder_pttl_ms its lease's time to live (0: none)
--   "-1 <how>"                   refused: this call's request already ended, or
--                                was taken over by a later call (how is an
--                                ENDED_* code): a late copy changes nothing
local token, session, lease_text, max_hold_text, alive_text, keep_text, floor, call, ring_key,
    holder = arguments(10)
local doorbell = DOORBELL
whole(lease_text)
whole(max_hold_text)
local alive_ms, keep_ms = tonumber(alive_text), tonumber(whole(keep_text))
local now, now_us = clock()
advance(floor, now, keep_ms)

-- A call whose request ended, or was taken over by a later call of the same
-- token: a late copy of it changes nothing. (A request still queued or held
-- under this call is found below, whatever the floor says.)
local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'ticket', 'call')
local queued = tonumber(redis.call('ZSCORE', K_QUEUE, token))
local queued_call = queued and (waiter_of(token) or {})[4]
local how = held[4] ~= call and queued_call ~= call and ended(call)
if how then
    return reply(-1, how)
end
-- An earlier call of the process that made the request's current call is a
-- late copy: it never takes the request over from its successor.
local current = held[1] == token and held[4] or queued_call
if current and current ~= call then
    local process, seq = split_call(call)
    local its_process, its_seq = split_call(current)
    if process and process == its_process and seq < its_seq then
        return reply(-1, ENDED_WITHDRAWN)
    end
end

-- A retry of the token (a new call) takes its request over; the call it
-- replaces is recorded as ended, so that nothing it sent late acts again.
if held[1] == token then
    if held[4] ~= call then
        finish(held[4] or '-', ENDED_WITHDRAWN, now)
        redis.call('HSET', K_LEASE, 'call', call)
        redis.call('HSET', K_COUNTERS, 'holder_call', call)
    end
    return reply(1, held[2], held[3], redis.call('PTTL', K_LEASE),
        redis.call('ZCARD', K_QUEUE))
end

local ticket = queued
if ticket then
    if queued_call and queued_call ~= call then
        finish(queued_call, ENDED_WITHDRAWN, now)
    end
else
    ticket = next_number(redis.call('HGET', K_COUNTERS, 'ticket'), now_us)
    local ticket_text = int(ticket)
    redis.call('HSET', K_COUNTERS, 'ticket', ticket_text)
    redis.call('ZADD', K_QUEUE, ticket_text, token)
end
redis.call('HSET', K_WAITERS, token,
    session .. ' ' .. lease_text .. ' ' .. max_hold_text .. ' ' .. call .. ' ' .. ring_key .. ' ' .. holder)
redis.call('ZADD', K_ALIVE, int(now + alive_ms), session)

-- Held by another request (read above, and unchanged since), or free.
local granted = not held[1] and grant_next(now, now_us, doorbell, token, false, true)
touch(keep_text)
if granted and granted[1] == token then
    return reply(1, granted[2], granted[3], granted[4], redis.call('ZCARD', K_QUEUE))
end
if granted then
    return reply(0, ticket, granted[2], granted[4])
end
return reply(0, ticket, held[2] or 0,
    held[1] and math.max(0, redis.call('PTTL', K_LEASE)) or 0)
