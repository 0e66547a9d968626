"""Who runs first once the lock has a new holder: the next holder.

A hand-off is on the critical path of every contended grant: until the next
holder's ``acquire`` returns, the lock serves nobody. The task that woke it (the
releasing task, for a waiter of its own process; the doorbell's reader, for a
ring) has work of its own to go on with - the releasing task its next acquire,
the reader its next read - and must let the next holder run first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from redis_fifo_lock import FifoLock, Lease
from tests.support.polling import until


async def _queued(lock: FifoLock, count: int) -> None:
    async def check() -> bool:
        return (await lock.status()).waiting == count

    await until(check, f"{count} request(s) wait for {lock.name!r}")


async def test_a_release_that_hands_over_within_its_process_lets_the_next_holder_run_first(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "order-local")
    held = await lock.acquire()
    events: list[str] = []

    async def wait() -> Lease:
        lease = await lock.acquire()
        events.append("next holder's acquire returned")
        return lease

    waiter = asyncio.create_task(wait())
    await _queued(lock, 1)
    await lock.release(held)
    events.append("release returned")
    await lock.release(await waiter)
    assert events == ["next holder's acquire returned", "release returned"]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every pub/sub read started in this test, as "reader reads on" in a shared list."""
    events: list[str] = []
    original = PubSub.get_message

    async def get_message(self: PubSub, *args: object, **kwargs: object) -> object:
        events.append("reader reads on")
        return await original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PubSub, "get_message", get_message)
    yield events


async def test_a_ring_lets_the_next_holder_run_before_the_doorbell_reads_on(
    redis_url: str, aredis: Redis, reads: list[str]
) -> None:
    # Two clients: two hubs, two sessions, so the grant is rung, not handed over.
    other = Redis.from_url(redis_url)
    try:
        holder, waiting = FifoLock(aredis, "order-ring"), FifoLock(other, "order-ring")
        held = await holder.acquire()

        async def wait() -> Lease:
            lease = await waiting.acquire()
            reads.append("next holder's acquire returned")
            return lease

        waiter = asyncio.create_task(wait())
        await _queued(holder, 1)
        reads.append("release called")
        await holder.release(held)
        await waiting.release(await waiter)
    finally:
        await other.aclose()
    after = reads[reads.index("release called") + 1 :]
    assert after[:2] == ["next holder's acquire returned", "reader reads on"], after
