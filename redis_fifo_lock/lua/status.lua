-- status.lua: read-only snapshot of the lock.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV: none.
--
-- Returns {holder_token, holder_fence, holder_ticket, pttl_ms, last_fence, waiting}:
--   holder_token is false (and its numbers 0) when nobody holds the lock;
--   last_fence is the last fence granted (0 once the name's keys expired);
--   waiting counts queued requests.
local held = current_grant() or {false, 0, 0, 0}
held[5] = tonumber(redis.call('HGET', K_COUNTERS, 'fence')) or 0
held[6] = redis.call('ZCARD', K_QUEUE)
return held
