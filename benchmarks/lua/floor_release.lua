-- The floor yardstick's release (benchmarks/floor.py): the lock goes to the
-- head of the queue, whose process is rung unless it is the caller's (that
-- one learns of it from this reply); with nobody queued it is freed.
-- KEYS: holder, queue, tickets, doorbell prefix (a channel per process).
-- ARGV: the releasing contender's id "<process>/<n>", its process.
-- Returns the new holder's id, false when freed, -1 when the caller did not hold it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return -1
end
local next_holder = redis.call('LPOP', KEYS[2])
if not next_holder then
    redis.call('DEL', KEYS[1])
    return false
end
redis.call('SET', KEYS[1], next_holder)
local process = string.match(next_holder, '^([^/]+)/')
if process ~= ARGV[2] then
    redis.call('PUBLISH', KEYS[4] .. process, next_holder)
end
return next_holder
