-- withdraw.lua: a request gives up (timeout, cancellation, or its process could
-- not learn whether its acquire ran). If it is still queued it leaves the queue;
-- if its grant landed meanwhile, the grant is given back and handed to the next
-- waiter at once, so the lock never stalls. Only the request (token, ticket) of
-- `session` is touched: a late withdraw never gives away a later request of the
-- same token, nor another process's.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] doorbell channel prefix (a grant rings "<prefix>:<session>")
-- ARGV[2] request token
-- ARGV[3] ticket of the request; 0 when its acquire's reply never arrived, so
--         the caller does not know it (then a request of that token from
--         `session` with any ticket is withdrawn, and if there is none the token
--         is recorded as ended, so that its acquire, still on its way, changes
--         nothing when it arrives)
-- ARGV[4] session id of the process that made the request
-- ARGV[5] keep_ms: see acquire.lua
--
-- Returns:
--   1  withdrawn from the queue (cancelled before the grant)
--   2  the grant had landed and was given back (cancelled after the grant)
--   0  nothing to withdraw (never queued, or already ended)
local doorbell, token, ticket = ARGV[1], ARGV[2], tonumber(ARGV[3])
local session, keep_ms = ARGV[4], tonumber(ARGV[5])
local now, now_us = clock()
local result = 0
local queued = tonumber(redis.call('ZSCORE', K_QUEUE, token))
local held = redis.call('HMGET', K_LEASE, 'token', 'ticket', 'session')
if queued and (ticket == 0 or queued == ticket)
        and string.match(redis.call('HGET', K_WAITERS, token) or '', '^%S+') == session then
    redis.call('ZREM', K_QUEUE, token)
    redis.call('HDEL', K_WAITERS, token)
    finish(token, ENDED_WITHDRAWN, now, keep_ms)
    result = 1
elseif held[1] == token and (ticket == 0 or tonumber(held[2]) == ticket) and held[3] == session then
    end_grant(token, ENDED_WITHDRAWN, now, keep_ms)
    result = 2
elseif ticket == 0 and not queued and held[1] ~= token and not ended(token) then
    finish(token, ENDED_WITHDRAWN, now, keep_ms)
end
grant_next(now, now_us, doorbell, keep_ms, false)
touch(keep_ms)
return result
