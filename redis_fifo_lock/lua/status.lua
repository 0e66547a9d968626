-- status.lua: read-only snapshot of the lock.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV: none.
--
-- Returns {holder_token, holder_fence, holder_ticket, pttl_ms, last_fence, waiting,
--          holder, live_waiting, known}:
--   holder_token is false (and its numbers 0) when nobody holds the lock;
--   last_fence is the last fence granted (0 once the name's keys expired);
--   waiting counts queued requests, live_waiting those whose process still
--   refreshes its liveness (the others are skipped at the next hand-off);
--   holder is the holder's description ("" when none was recorded or nobody
--   holds it); known is 1 when any key of the name exists, else 0 (never
--   used, or idle for longer than keep_ms).
local held = current_grant() or {false, 0, 0, 0}
held[5] = tonumber(redis.call('HGET', K_COUNTERS, 'fence')) or 0
held[6] = redis.call('ZCARD', K_QUEUE)
held[7] = redis.call('HGET', K_LEASE, 'holder') or ''
-- Only commands every script already needs (see acl.py): no HVALS, no ZRANGEBYSCORE.
local live_sessions = {}
for _, session in ipairs(redis.call('ZRANGE', K_ALIVE, '(' .. int((clock())), '+inf', 'BYSCORE')) do
    live_sessions[session] = true
end
local live = 0
local tokens = redis.call('ZRANGE', K_QUEUE, '0', '-1')
for first = 1, #tokens, 1000 do
    local metas = redis.call('HMGET', K_WAITERS, unpack(tokens, first, math.min(first + 999, #tokens)))
    for _, meta in ipairs(metas) do
        if meta and live_sessions[string.match(meta, '^(%S+)')] then
            live = live + 1
        end
    end
end
held[8] = live
held[9] = redis.call('EXISTS', K_QUEUE, K_WAITERS, K_ALIVE, K_LEASE, K_COUNTERS, K_FINISHED) > 0
    and 1 or 0
return held
