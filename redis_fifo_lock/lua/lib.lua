-- lib.lua: definitions shared by every script; the loader puts this text in front
-- of each script, so each loaded script stays self-contained.
--
-- KEYS (the same seven for every script, all under the lock's hash tag):
--   KEYS[1] queue     sorted set: request token -> ticket (arrival order)
--   KEYS[2] waiters   hash: request token -> "<session> <lease_ms> <max_hold_ms>"
--   KEYS[3] alive     sorted set: session id -> alive-until (server ms)
--   KEYS[4] lease     hash {token, fence, ticket, deadline}; exists while held,
--                     expires (PEXPIRE) when not renewed
--   KEYS[5] tickets   counter of arrivals; never expires
--   KEYS[6] fences    counter of grants; never expires
--   KEYS[7] released  sorted set: token -> fence of the last 64 releases
local K_QUEUE, K_WAITERS, K_ALIVE, K_LEASE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_TICKETS, K_FENCES, K_RELEASED = KEYS[5], KEYS[6], KEYS[7]

-- Server time in milliseconds: the only clock any decision is based on.
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The current grant as {token, fence, ticket, pttl_ms}, or nil when nobody holds it.
local function current_grant()
    local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'ticket')
    if not held[1] then
        return nil
    end
    return {held[1], tonumber(held[2]) or 0, tonumber(held[3]) or 0, redis.call('PTTL', K_LEASE)}
end

-- Remember a release so that the same release sent again is recognised.
local function note_release(token, fence)
    redis.call('ZADD', K_RELEASED, fence, token)
    redis.call('ZREMRANGEBYRANK', K_RELEASED, 0, -65)
end

-- Hand the lock to the first live waiter when nobody holds it (the hand-off).
-- Waiters whose session stopped refreshing its liveness are dropped on the way:
-- their process died, and one pass skips all of them. The grant's lease lasts
-- lease_ms, or less when the waiter's liveness runs out sooner, so a grant to a
-- waiter that died a moment ago stalls the lock no longer than its liveness.
-- Rings the doorbell of the waiter's own session, channel "<doorbell>:<session>",
-- with "<token> <fence> <ticket> <pttl_ms>": only the process that waits for this
-- grant is woken, however many other processes wait. Returns the new grant as
-- {token, fence, ticket, pttl_ms}, or nil if nothing was granted.
local function grant_next(now, doorbell)
    if redis.call('EXISTS', K_LEASE) == 1 then
        return nil
    end
    redis.call('ZREMRANGEBYSCORE', K_ALIVE, '-inf', now)
    while true do
        local head = redis.call('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
        if #head == 0 then
            return nil
        end
        local token, ticket = head[1], tonumber(head[2])
        local meta = redis.call('HGET', K_WAITERS, token)
        redis.call('ZREM', K_QUEUE, token)
        redis.call('HDEL', K_WAITERS, token)
        local session, lease_ms, max_hold_ms
        if meta then
            session, lease_ms, max_hold_ms = string.match(meta, '^(%S+) (%d+) (%d+)$')
        end
        local alive_until = session and tonumber(redis.call('ZSCORE', K_ALIVE, session))
        if alive_until then
            local ttl = math.min(tonumber(lease_ms), alive_until - now)
            local fence = redis.call('INCR', K_FENCES)
            redis.call('HSET', K_LEASE, 'token', token, 'fence', fence, 'ticket', ticket,
                'deadline', now + tonumber(max_hold_ms))
            redis.call('PEXPIRE', K_LEASE, ttl)
            redis.call('PUBLISH', doorbell .. ':' .. session,
                token .. ' ' .. fence .. ' ' .. ticket .. ' ' .. ttl)
            return {token, fence, ticket, ttl}
        end
        -- Dead waiter (or an entry whose metadata was lost): skipped.
    end
end
