-- The floor yardstick's acquire (benchmarks/floor.py): a ticket in arrival
-- order; the lock when it is free, else a place at the end of the queue.
-- KEYS: holder, queue, tickets. ARGV: the contender's id.
-- Returns {1, ticket} when granted at once, {0, ticket} when queued.
local ticket = redis.call('INCR', KEYS[3])
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
    return {1, ticket}
end
redis.call('RPUSH', KEYS[2], ARGV[1])
return {0, ticket}
