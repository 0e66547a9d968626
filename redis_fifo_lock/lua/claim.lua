-- claim.lua: a waiter that was told (by a poll, an unsigned ring, or a signed
-- one read too late to date its lease usefully) that it may hold the lock checks
-- that it does, and re-arms the lease to its full length, in one step. This
-- reply, dated by when the caller sent it, starts the lease.
--
-- KEYS: the six lock keys, see lib.lua.
-- ARGV[1] the arguments (see arguments in lib.lua), in this order:
--   token: the request's token
--   ticket: the request's ticket
--   lease_ms: new time to live in milliseconds
--   keep_ms: see acquire.lua
--
-- Returns one string of fields (see reply in lib.lua), or a number:
--   "1 <fence> <ticket> <pttl_ms> <queued>"
--                                held by this request; the lease lives pttl_ms more;
--                                queued: requests still queued behind it (a count)
--   "0 <queued_ticket>"          not held by it; queued_ticket is the request's
--                                ticket if it is still queued, else 0 (its grant
--                                expired unclaimed, or it was dropped or ended)
--   -2                           held by it, but the max-hold deadline has passed
local token, ticket, lease_ms, keep_text = arguments(4)
ticket, lease_ms = tonumber(ticket), tonumber(lease_ms)
whole(keep_text)
local held = redis.call('HMGET', K_LEASE, 'token', 'ticket', 'fence', 'deadline')
if held[1] ~= token or tonumber(held[2]) ~= ticket then
    return reply(0, tonumber(redis.call('ZSCORE', K_QUEUE, token)) or 0)
end
local now = clock()
local remaining = (tonumber(held[4]) or 0) - now
if remaining <= 0 then
    return -2
end
local ttl = math.min(lease_ms, remaining)
redis.call('PEXPIRE', K_LEASE, int(ttl))
touch(keep_text)
return reply(1, tonumber(held[3]), ticket, ttl, redis.call('ZCARD', K_QUEUE))
