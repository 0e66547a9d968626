-- lib.lua: definitions shared by every script; the loader puts this text in front
-- of each script, so each loaded script stays self-contained.
--
-- ARGV[1]: the script's arguments in one string (see arguments below).
-- KEYS (the same six for every script, all under the lock's hash tag):
--   KEYS[1] queue     sorted set: request token -> ticket (arrival order)
--   KEYS[2] waiters   hash: request token -> "<session> <lease_ms> <max_hold_ms> <call>
--                     <ring_key> <holder>" (ring_key: the acquire call's secret, which
--                     signs its ring; holder: a description for onlookers, may be empty)
--   KEYS[3] alive     sorted set: session id -> alive-until (server ms)
--   KEYS[4] lease     hash {token, fence, ticket, session, call, deadline, holder};
--                     exists while held, expires (PEXPIRE) when not renewed
--   KEYS[5] counters  hash {ticket, fence}: the last ticket and fence issued;
--                     {holder, holder_call}: the grant last made and not yet
--                     ended by a script (to notice that its lease expired)
--   KEYS[6] finished  sorted set, every score 0, read by member (ZRANGEBYLEX):
--                     "<call> <how>": the request made by acquire call <call>
--                     ended (ENDED_*; a loss also says when: "<call> 2 <ms>");
--                     and per process "<process>/~ <floor> <ms> [+<held seq>...]":
--                     that process's floor (see advance), when (server ms) a
--                     script last spoke of it, and its held requests below the
--                     floor. Recognises a re-sent script.
--
-- A request is named by its token (the caller's, kept across retries) and the
-- id of the acquire call that made it, or adopted it (a retry with the same
-- token takes the queued request over). Redis gives it a ticket when it queues.
-- A call id is "<process>/<seq>": an id of the process that sent it (new in
-- each process, also after fork) and a number (12 hex digits) that process
-- never uses twice and issues in order. The process sends with each acquire,
-- release and withdraw its floor, "<process>/<seq>": the lowest seq of its
-- requests on this lock that it holds or has a call in flight for (or about
-- to be sent). Every request of that process below the floor that is not
-- queued or held has ended, and the process has had its answer: it can be
-- refused without a record, so the records kept are only
-- those of requests whose process is still talking about them: a handful per
-- process, however often the name is used.
--
-- Every script that writes ends with touch(keep_ms): all keys but the lease
-- expire once the name has been idle (no script at all) for keep_ms, so an
-- unused name costs nothing. Tickets and fences survive that (and FLUSHDB, and
-- a restart that lost data) because each is max(last + 1, server clock in us).
local K_QUEUE, K_WAITERS, K_ALIVE, K_LEASE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_COUNTERS, K_FINISHED = KEYS[5], KEYS[6]

-- Prefix of the channels grants are rung on, "<prefix>:<session>": the keys'
-- own prefix, then "doorbell" (see LockKeys in protocol.py). Not an argument,
-- as it holds the lock's name, which may contain spaces (see arguments).
local DOORBELL = string.sub(K_QUEUE, 1, -#'queue' - 1) .. 'doorbell'

-- The script's `count` arguments, as strings. They come in one string,
-- ARGV[1], separated by single spaces, so that a client sends one value, not
-- one per argument (redis-py packs each in Python); none contains a space but
-- the last, which may (a holder's description). A missing one fails the script.
local function arguments(count)
    local text, values, from = ARGV[1], {}, 1
    for i = 1, count - 1 do
        local space = string.find(text, ' ', from, true)
        values[i] = string.sub(text, from, space - 1)
        from = space + 1
    end
    values[count] = string.sub(text, from)
    return unpack(values, 1, count)
end

-- How a request ended, in its record in K_FINISHED.
-- ENDED_SETTLED: below its session's floor, with no record of how (and not
-- the grant no script ended: that one ran out, ENDED_LOST; see ended).
local ENDED_RELEASED, ENDED_WITHDRAWN, ENDED_LOST, ENDED_DROPPED, ENDED_SETTLED = 0, 1, 2, 3, 4

-- An integer as Redis stores it: tostring() would write 1.7e+15. '%.0f' (and
-- Redis's own '%.17g' for a number passed to redis.call, and Lua's '%.14g' for
-- one in a concatenation) goes through glibc's arbitrary-precision float
-- printer, which cost a sixth of Redis's work on a grant; so numbers reach
-- redis.call, and text, only through here. '%d' prints a C long, which may
-- have 32 bits (LLP64): a whole number in [0, 2^53) goes as two parts below
-- 10^9. The floor is exact: the quotient is below 2^24, so it is rounded by at
-- most 2^-30, less than its 10^-9 distance from the next whole number. Anything
-- else (a negative, a fraction, a huge or not-a-number value that only a
-- hand-made key or call can bring) takes the slow, exact path.
local function int(n)
    if n >= 0 and n < 9007199254740992 and n % 1 == 0 then
        if n < 1000000000 then
            return string.format('%d', n)
        end
        local high = math.floor(n / 1000000000)
        return string.format('%d%09d', high, n - high * 1000000000)
    end
    return string.format('%.0f', n)
end

-- `text`, a whole number as the client writes it (at most 15 digits, nothing
-- else), which then goes on to Redis as it came (see int); anything else fails
-- the script before it writes (PEXPIRE would refuse it after the script's
-- writes, and the waiter's record would not parse).
local function whole(text)
    if #text > 15 or not string.find(text, '^%d+$') then
        error('not a whole number: ' .. string.sub(text, 1, 24))
    end
    return text
end

-- The scripts on a grant's path (acquire, claim, release, renew) answer in one
-- RESP value: a number, or their fields (numbers, and text without spaces) in
-- one string, separated by single spaces. A client then reads one value, not
-- one per field, and in redis-py's pure-Python parser reading a value costs
-- about as much as the rest of a grant's handling of its reply.
local function reply(...)
    local fields = {...}
    for i = 1, select('#', ...) do
        if type(fields[i]) == 'number' then
            fields[i] = int(fields[i])
        end
    end
    return table.concat(fields, ' ')
end

-- Server time as {ms, us}: the only clock any decision is based on.
local function clock()
    local t = redis.call('TIME')
    local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    return math.floor(us / 1000), us
end

-- The next ticket or fence after `last` (the last one issued, or nil): above
-- it and at least the server clock in microseconds, so numbers keep rising
-- after their key was lost (as long as the clock did not step back further
-- than the time since). Below 2^53 until the year 2255.
local function next_number(last, now_us)
    return math.max((tonumber(last) or 0) + 1, now_us)
end

-- The process and seq of a call id (or of a floor), or nil for an unknown
-- call ('-').
local function split_call(call)
    return string.match(call, '^([^/%s]+)/(%x+)$')
end

-- The floor entries this script read or wrote, by session (false: none), so
-- that it reads each one at most once and writes it only when it changes.
local floors = {}

-- A floor entry as {floor, ms, held, set, entry}; held is the "+<seq>..."
-- text, set the same seqs as a table of seq -> true.
local function parse_floor(entry)
    local floor, ms, held = string.match(entry, ' (%x+) (%d+)(.*)$')
    local set = {}
    for seq in string.gmatch(held, '%+(%x+)') do
        set[seq] = true
    end
    return {floor, tonumber(ms), held, set, entry}
end

-- A process's {floor, ms, held, set, entry} entry in K_FINISHED, or nil; held
-- is the set of its requests below the floor that it holds.
local function floor_of(session)
    local known = floors[session]
    if known == nil then
        local entry = redis.call('ZRANGEBYLEX', K_FINISHED, '[' .. session .. '/~', '[' .. session .. '/~~')
        known = entry[1] and parse_floor(entry[1]) or false
        floors[session] = known
    end
    return known or nil
end

-- Added before the old entry goes, so the key is never left empty (and so
-- deleted): during a Redis Cluster slot move a write to a missing key fails,
-- and a script must not fail after its first write.
local function set_floor(session, floor, now, held, old)
    local entry = session .. '/~ ' .. floor .. ' ' .. int(now) .. held
    if entry ~= old then
        redis.call('ZADD', K_FINISHED, '0', entry)
        if old then
            redis.call('ZREM', K_FINISHED, old)
        end
        floors[session] = parse_floor(entry)
    end
end

-- Forget every session no script spoke of for keep_ms, with its records: its
-- late copies are older than any client retry. Run when a new session first
-- speaks, so the sessions kept are those heard from within keep_ms.
local function forget_silent(now, keep_ms)
    local heard = {}
    local entries = redis.call('ZRANGEBYLEX', K_FINISHED, '-', '+')
    for _, entry in ipairs(entries) do
        local session, ms = string.match(entry, '^(%S+)/~ %x+ (%d+)')
        if session and tonumber(ms) >= now - keep_ms then
            heard[session] = true
        end
    end
    for _, entry in ipairs(entries) do
        local session = string.match(entry, '^(%S+)/')
        if not heard[session] then
            redis.call('ZREM', K_FINISHED, entry)
        end
    end
    floors = {}
end

-- The call of the grant last made and not ended by a script (its lease is
-- held, or ran out unnoticed), or false.
local function unended_grant_call()
    return redis.call('HGET', K_COUNTERS, 'holder_call') or false
end

-- The record of how the request made by `call` ended, or nil.
local function record_of(call)
    return redis.call('ZRANGEBYLEX', K_FINISHED, '[' .. call .. ' ', '[' .. call .. ' ~', 'LIMIT', '0', '1')[1]
end

-- The "+<seq>..." of `held` that Redis can vouch for: each one already held
-- by the kept entry (`known`), the current or last grant (`holder_call`), or
-- a request with a record. A copy of a message sent while a request was held,
-- read after its release was answered and its record dropped, would list it
-- as held again; its late release would then look lost.
local function vouched(session, held, known)
    local kept, holder_call = '', nil
    for seq in string.gmatch(held, '%+(%x+)') do
        local call = session .. '/' .. seq
        if not known[seq] and holder_call == nil then
            holder_call = unended_grant_call()
        end
        if known[seq] or call == holder_call or record_of(call) then
            kept = kept .. '+' .. seq
        end
    end
    return kept
end

-- Remove the records in the lex range [from, to), but a loss recorded less
-- than keep_ms ago (see advance).
local function sweep(from, to, now, keep_ms)
    for _, record in ipairs(redis.call('ZRANGEBYLEX', K_FINISHED, from, to)) do
        local lost_at = tonumber(string.match(record, '^%S+ %d+ (%d+)$'))
        if not lost_at or lost_at < now - keep_ms then
            redis.call('ZREM', K_FINISHED, record)
        end
    end
end

-- The caller's process says, with `floor_id` ("<process>/<seq>", then
-- "+<seq>" for each request below it that the process holds), that its
-- other requests below that seq that are not queued or held have ended and
-- been answered: their records go, and the floor is kept (it never goes
-- down: a late copy carries an older one). The records of held requests stay
-- (a late release of one must still learn how it ended), and so does a loss
-- for keep_ms: the message may have been sent while the request waited in
-- the queue, before it was granted and lost (a loss is recorded by another
-- script, and its process, which holds the lease, may not know of it); a
-- copy later than keep_ms is older than any client retry (see forget_silent).
-- A floor below the kept one leaves the kept one in place, but only its own
-- message's word removes records: the kept floor's message may have passed a
-- request that was queued then, and was granted and lost since; re-applying
-- it would drop that loss before the holder's release could learn of it. Nor
-- does it remove the records of requests the kept entry lists as held: the
-- lower floor may be a late copy, sent before they were granted.
local function advance(floor_id, now, keep_ms)
    local session, floor, held = string.match(floor_id, '^([^/%s]+)/(%x+)(.*)$')
    if not session then
        return
    end
    local old = floor_of(session)
    local spared = {}  -- seq -> true: held, so its record stays
    if old and old[1] > floor then
        -- The kept entry came from a newer message: what it holds stays held.
        set_floor(session, old[1], now, old[3], old[5])
        for seq in pairs(old[4]) do
            spared[seq] = true
        end
    else
        if old and held ~= '' then
            held = vouched(session, held, old[4])
        end
        set_floor(session, floor, now, held, old and old[5])
    end
    if not old then
        forget_silent(now, keep_ms)
    end
    for seq in string.gmatch(held, '%+(%x+)') do
        spared[seq] = true
    end
    local seqs = {}
    for seq in pairs(spared) do
        if seq < floor then
            seqs[#seqs + 1] = seq
        end
    end
    table.sort(seqs)
    local from = '[' .. session .. '/'
    for _, seq in ipairs(seqs) do
        sweep(from, '(' .. session .. '/' .. seq, now, keep_ms)
        from = '(' .. session .. '/' .. seq .. ' ~'
    end
    sweep(from, '(' .. session .. '/' .. floor, now, keep_ms)
end

-- Record that the request made by `call` ended (ENDED_*). The record lives
-- while its session speaks of it (see advance), and keep_ms after.
local function finish(call, how, now)
    local session = split_call(call)
    if not session then
        return
    end
    local record = call .. ' ' .. int(how)
    if how == ENDED_LOST then
        record = record .. ' ' .. int(now)  -- no floor sweeps it for keep_ms (see advance)
    end
    redis.call('ZADD', K_FINISHED, '0', record)
    local floor = floor_of(session)
    set_floor(session, floor and floor[1] or '0', now, floor and floor[3] or '', floor and floor[5])
end

-- How the request made by `call` ended (ENDED_*), or nil if it did not (or too
-- long ago to tell: its session has been silent for keep_ms).
local function ended(call)
    local record = record_of(call)
    if record then
        return tonumber(string.match(record, '^%S+ (%d+)'))
    end
    local session, seq = split_call(call)
    local floor = session and floor_of(session)
    if floor and seq < floor[1] and not floor[4][seq] then
        -- Below its process's floor, but Redis granted it and no script ended
        -- it: its lease ran out unnoticed (the callers look at the lease first).
        -- The floor was sent before its process knew of the grant.
        if unended_grant_call() == call then
            return ENDED_LOST
        end
        return ENDED_SETTLED
    end
    return nil
end

-- A queued request's {session, lease_ms, max_hold_ms, call, holder, ring_key}, or nil.
local function waiter_of(token)
    local meta = redis.call('HGET', K_WAITERS, token)
    if not meta then
        return nil
    end
    local session, lease_ms, max_hold_ms, call, ring_key, holder =
        string.match(meta, '^(%S+) (%d+) (%d+) (%S+) (%S+) ?(.*)$')
    return session and {session, tonumber(lease_ms), tonumber(max_hold_ms), call, holder, ring_key}
end

-- Every key but the lease expires keep_ms after the last script that wrote.
-- keep_text is keep_ms as the script's argument gave it: text goes to Redis as
-- it came, with no format (see int).
local function touch(keep_text)
    redis.call('PEXPIRE', K_QUEUE, keep_text)
    redis.call('PEXPIRE', K_WAITERS, keep_text)
    redis.call('PEXPIRE', K_ALIVE, keep_text)
    redis.call('PEXPIRE', K_COUNTERS, keep_text)
    redis.call('PEXPIRE', K_FINISHED, keep_text)
end

-- The current grant as {token, fence, ticket, pttl_ms}, or nil when nobody holds it.
local function current_grant()
    local held = redis.call('HMGET', K_LEASE, 'token', 'fence', 'ticket')
    if not held[1] then
        return nil
    end
    return {held[1], tonumber(held[2]) or 0, tonumber(held[3]) or 0, redis.call('PTTL', K_LEASE)}
end

-- The grant ended by a script (released or given back): it is not lost.
local function end_grant(call, how, now)
    redis.call('DEL', K_LEASE)
    redis.call('HDEL', K_COUNTERS, 'holder', 'holder_call')
    finish(call, how, now)
end

-- Hand the lock to the first live waiter when nobody holds it (the hand-off).
-- A lease that expired since the last script is recorded as lost first.
-- Waiters whose session stopped refreshing its liveness are dropped on the way:
-- their process died, and one pass skips all of them. The grant's lease lasts
-- lease_ms, or less when the waiter's liveness runs out sooner, so a grant to a
-- waiter that died a moment ago stalls the lock no longer than its liveness; the
-- waiter re-arms it to lease_ms when it claims the grant.
-- `lease_gone`: the running script read the lease and found none, so it is
-- not looked up again. A script that ended the grant itself must still look:
-- during a Redis Cluster slot move, an access to a key missing from the node
-- fails the script, and that look at the deleted lease is what stops it before
-- it takes the next waiter out of the queue (the hand-off then happens when the
-- release is retried).
-- Rings the doorbell of the waiter's own session, channel "<doorbell>:<session>",
-- with "<body> <proof>", body "<token> <fence> <ticket> <pttl_ms> <call> <queued>"
-- (queued: requests still queued behind the grant) and proof the SHA-1 of
-- "<ring_key> <body>": only a sender that knows the acquire call's ring key
-- (a secret the waiter sent with it, kept in K_WAITERS until this grant) can
-- sign a ring, so the waiter takes a signed ring as its grant, dated from when
-- it sent that call; anything else only makes it claim. No ring when the
-- grant goes to `caller_token` (the request the running script acts for) or to
-- `caller_session` (the process running it): they learn of it from the reply.
-- The ring is a pcall: a PUBLISH that the server refuses (an ACL without the
-- channel) must not fail the script after its writes; the waiter then finds
-- its grant by polling.
-- Returns the new grant as {token, fence, ticket, pttl_ms, call, session}, or nil.
local function grant_next(now, now_us, doorbell, caller_token, caller_session, lease_gone)
    if not lease_gone and redis.call('EXISTS', K_LEASE) == 1 then
        return nil
    end
    -- The grant last made and not ended by a script: its lease expired.
    local last = redis.call('HMGET', K_COUNTERS, 'holder', 'holder_call', 'fence')
    if last[1] then
        redis.call('HDEL', K_COUNTERS, 'holder', 'holder_call')
        finish(last[2] or '-', ENDED_LOST, now)
    end
    redis.call('ZREMRANGEBYSCORE', K_ALIVE, '-inf', int(now))
    while true do
        local head = redis.call('ZRANGE', K_QUEUE, '0', '0', 'WITHSCORES')
        if #head == 0 then
            return nil
        end
        local token, ticket = head[1], tonumber(head[2])
        local waiter = waiter_of(token)
        redis.call('ZREM', K_QUEUE, token)
        redis.call('HDEL', K_WAITERS, token)
        local alive_until = waiter and tonumber(redis.call('ZSCORE', K_ALIVE, waiter[1]))
        if alive_until then
            local session, call = waiter[1], waiter[4]
            local ttl = math.min(waiter[2], alive_until - now)
            local fence = next_number(last[3], now_us)
            local fence_text, ticket_text, ttl_text = int(fence), int(ticket), int(ttl)
            redis.call('HSET', K_LEASE, 'token', token, 'fence', fence_text, 'ticket', ticket_text,
                'session', session, 'call', call, 'deadline', int(now + waiter[3]),
                'holder', waiter[5])
            redis.call('PEXPIRE', K_LEASE, ttl_text)
            redis.call('HSET', K_COUNTERS, 'fence', fence_text, 'holder', token, 'holder_call', call)
            if token ~= caller_token and session ~= caller_session then
                local body = token .. ' ' .. fence_text .. ' ' .. ticket_text .. ' ' .. ttl_text
                    .. ' ' .. call .. ' ' .. int(redis.call('ZCARD', K_QUEUE))
                redis.pcall('PUBLISH', doorbell .. ':' .. session,
                    body .. ' ' .. redis.sha1hex(waiter[6] .. ' ' .. body))
            end
            return {token, fence, ticket, ttl, call, session}
        end
        -- Dead waiter (or an entry whose metadata was lost): skipped, and
        -- recorded, so that a late copy of its acquire cannot queue it again.
        finish(waiter and waiter[4] or '-', ENDED_DROPPED, now)
    end
end
