-- withdraw.lua: a request gives up (timeout, cancellation, or its process could
-- not learn whether its acquire ran). If it is still queued it leaves the queue;
-- if its grant landed meanwhile, the grant is given back and handed to the next
-- waiter at once, so the lock never stalls. Only the request of `session` with
-- that ticket and made by that call is touched: a late withdraw never gives
-- away a later request of the same token (nor one a retry took over), nor
-- another process's.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   token: the request's token
--   ticket: the request's ticket; 0 when its acquire's reply never arrived, so
--     the caller does not know it: then the request made by `call` is
--     withdrawn, and if there is none, (token, call) is recorded as ended, so
--     that its acquire, if still on its way, changes nothing when it lands
--   session: the session of the process that made the request
--   keep_ms: see acquire.lua
--   call: id of the acquire call that made the request (see acquire.lua), or
--     '-' for a grant rung for a request nobody waits for, given back by its
--     ticket
--   floor: the calling process's floor (see lib.lua)
--
-- Returns:
--   1  withdrawn from the queue (cancelled before the grant)
--   2  the grant had landed and was given back (cancelled after the grant)
--   0  nothing to withdraw (never queued, or already ended)
local token, ticket, session, keep_text, call, floor = arguments(6)
local doorbell = DOORBELL
ticket = tonumber(ticket)
local keep_ms = tonumber(whole(keep_text))
local now, now_us = clock()
advance(floor, now, keep_ms)
local result = 0

-- Whether the request (queued or holding) with `its_ticket` and `its_call` is
-- this one: of this session, made by this call (when the caller knows it:
-- not for a ring given back) and holding this ticket (when known). A request
-- a later call took over is no longer this call's.
local function is_this(its_session, its_ticket, its_call)
    if its_session ~= session then
        return false
    end
    if call ~= '-' and its_call ~= call then
        return false
    end
    return ticket == 0 or its_ticket == ticket
end

local queued = tonumber(redis.call('ZSCORE', K_QUEUE, token))
local waiter = queued and waiter_of(token)
local held = redis.call('HMGET', K_LEASE, 'token', 'ticket', 'session', 'call')
if waiter and is_this(waiter[1], queued, waiter[4]) then
    redis.call('ZREM', K_QUEUE, token)
    redis.call('HDEL', K_WAITERS, token)
    finish(waiter[4], ENDED_WITHDRAWN, now)
    result = 1
elseif held[1] == token and is_this(held[3], tonumber(held[2]), held[4]) then
    end_grant(held[4], ENDED_WITHDRAWN, now)
    result = 2
elseif ticket == 0 and not ended(call) then
    finish(call, ENDED_WITHDRAWN, now)
end
grant_next(now, now_us, doorbell, false, false)
touch(keep_text)
return result
