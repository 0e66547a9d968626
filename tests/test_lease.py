"""``Lease``: its state changes only through its own methods."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock


async def test_the_holder_can_read_but_not_set_the_release_state(aredis: Redis) -> None:
    lock = FifoLock(aredis, "own-state", lease_ms=600, poll_ms=100)
    lease = await lock.acquire(timeout=5)
    with pytest.raises(AttributeError):
        lease.released = True  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lease.releasing = True  # type: ignore[misc]
    assert not lease.released and not lease.releasing
    await lock.release(lease)
    assert lease.released and not lease.lost
