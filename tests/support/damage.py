"""Damage to a lock's keys, as something other than the lock might do it.

The lock's scripts must fail loudly on keys they cannot read, and a lock whose
scripts fail must hold up no other lock (``docs/guarantees.md``); these helpers
make them fail with an error Redis replies with.
"""

from __future__ import annotations

from redis.asyncio import Redis

from redis_fifo_lock.protocol import LockKeys


async def garble_floors(admin: Redis, keys: LockKeys) -> None:
    """Garble the processes' floor entries of the lock of ``keys``: every script
    on that lock then fails in its Lua (``user_script:...: bad argument``) for
    those processes. Deleting its ``finished`` key mends it."""
    finished = keys.key("finished")
    for entry in await admin.zrangebylex(finished, "-", "+"):
        if b"/~ " in entry:
            await admin.zadd(finished, {entry.split(b" ")[0] + b" zz": 0})
            await admin.zrem(finished, entry)
