"""``force_release``: an operator frees a stuck lock (force_release.lua)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, LeaseLost, SyncFifoLock
from tests.support.polling import until

FAST = {"lease_ms": 900, "poll_ms": 200}


async def test_the_evicted_holder_loses_its_lease_and_the_next_waiter_gets_a_higher_fence(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    holder = await lock.acquire(timeout=5)
    waiter = asyncio.create_task(lock.acquire(timeout=10))

    async def queued() -> bool:
        return (await lock.status()).waiting == 1

    await until(queued, "the waiter is queued")
    assert await FifoLock(aredis, "jobs").force_release() == holder.fence
    nxt = await asyncio.wait_for(waiter, 10)
    await asyncio.wait_for(holder.wait_lost(), 5)  # its next renewal is refused

    assert nxt.fence > holder.fence
    assert holder.lost and "refused" in (holder.lost_reason or "")
    with pytest.raises(LeaseLost):
        await lock.release(holder)
    assert (await lock.status()).holder_fence == nxt.fence
    await lock.release(nxt)


async def test_a_fence_that_no_longer_holds_the_lock_is_left_alone(aredis: Redis) -> None:
    lock = FifoLock(aredis, "jobs", **FAST)
    assert await lock.force_release() is None
    lease = await lock.acquire(timeout=5)
    assert await lock.force_release(fence=lease.fence - 1) is None
    assert (await lock.status()).holder_fence == lease.fence
    await lock.release(lease)
    with pytest.raises(ValueError, match="fence must be a positive int"):
        await lock.force_release(fence=0)


def test_the_sync_facade_forces_a_release_too(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "jobs", **FAST)
    lease = lock.acquire(timeout=5)
    assert lock.force_release(fence=lease.fence) == lease.fence
    assert not lock.status().held
    with pytest.raises(LeaseLost):
        lock.release(lease)


async def test_the_evicted_holder_learns_it_even_when_its_process_queued_more_meanwhile(
    aredis: Redis,
) -> None:
    """A later request of the same process queued while the evicted one waited: its
    acquire carried a floor past the waiting request (not held then, nor in flight).
    That floor must not make Redis forget, at the evicted holder's release, that
    its lease was taken: the release raises LeaseLost, not "already released"."""
    lock = FifoLock(aredis, "jobs", lease_ms=10_000, poll_ms=5_000)
    holder = await lock.acquire(timeout=5)

    async def waiting(n: int) -> bool:
        return (await lock.status()).waiting == n

    first = asyncio.create_task(lock.acquire(timeout=10))
    await until(lambda: waiting(1), "the first waiter is queued")
    second = asyncio.create_task(lock.acquire(timeout=10))
    await until(lambda: waiting(2), "the second waiter is queued")
    await lock.release(holder)
    evicted = await asyncio.wait_for(first, 5)
    assert await FifoLock(aredis, "jobs").force_release() == evicted.fence
    nxt = await asyncio.wait_for(second, 5)

    with pytest.raises(LeaseLost):
        await lock.release(evicted)
    assert (await lock.status()).holder_fence == nxt.fence
    await lock.release(nxt)
