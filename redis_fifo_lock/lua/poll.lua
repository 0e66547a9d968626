-- poll.lua: the periodic check of a process that has waiters on this lock. It
-- refreshes the process's liveness, grants the lock if it is free (the poll is
-- the authority: it works with no doorbell at all), and reports the state.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   session: the polling process's session
--   alive_ms: how long the session counts as alive from now, in milliseconds
--   keep_ms: see acquire.lua
--
-- Returns {holder_token, fence, ticket, pttl_ms, head_ticket}:
--   the holder's grant (holder_token false and the numbers 0 when nobody holds
--   the lock) and the ticket of the first queued request (false when the queue
--   is empty). A waiter whose ticket is below head_ticket and that is not the
--   holder is no longer queued.
local session, alive_ms, keep_text = arguments(3)
local doorbell = DOORBELL
alive_ms = tonumber(alive_ms)
whole(keep_text)
local now, now_us = clock()
redis.call('ZADD', K_ALIVE, int(now + alive_ms), session)
grant_next(now, now_us, doorbell, false, false)
touch(keep_text)
local held = current_grant() or {false, 0, 0, 0}
local head = redis.call('ZRANGE', K_QUEUE, '0', '0', 'WITHSCORES')
held[5] = head[2] and tonumber(head[2]) or false
return held
