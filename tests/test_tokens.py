"""One token, one request, in a process: a second use of a token that waits or
holds is refused (``redis_fifo_lock.tokens``), through any client, event loop
or settings.

Before, the check looked only at the waiters of one client's wait group: the
same token acquired again while its lease was held was handed a second
``Lease`` for the same grant and fence (both callers inside at once), and one
waiting through two clients or two ``lease_ms`` queued as one request (an
outside attack, helper-34).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LockUsageError, SyncFifoLock, tokens
from redis_fifo_lock.protocol import LockKeys
from tests.support.polling import until

FAST = {"lease_ms": 2000, "poll_ms": 500}


@pytest.fixture
async def second_client(redis_url: str) -> AsyncIterator[Redis]:
    """Another client of the same server: another hub, as another library's own."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _queued(client: Redis, lock: FifoLock, token: str) -> bool:
    return await client.zscore(lock.keys.key("queue"), token) is not None


async def test_a_token_whose_lease_is_held_is_refused_before_anything_is_sent(
    aredis: Redis,
) -> None:
    lock = FifoLock(aredis, "token-held", **FAST)
    first = await lock.acquire(timeout=5, token="job-42")
    with pytest.raises(LockUsageError, match="'job-42' already holds this lock"):
        await lock.acquire(timeout=1, token="job-42")
    assert not first.lost
    await lock.release(first)


async def test_a_token_waiting_through_another_client_or_other_settings_is_refused(
    aredis: Redis, second_client: Redis
) -> None:
    holder = FifoLock(aredis, "token-waits", **FAST)
    held = await holder.acquire(timeout=5)
    lock = FifoLock(aredis, "token-waits", **FAST)
    waiting = asyncio.create_task(lock.acquire(timeout=10, token="job-7"))
    await until(lambda: _queued(aredis, lock, "job-7"), "job-7 queued")
    others = [
        FifoLock(second_client, "token-waits", **FAST),
        FifoLock(aredis, "token-waits", lease_ms=4000, poll_ms=1000),
    ]
    for other in others:
        with pytest.raises(LockUsageError, match="'job-7' already waits for this lock"):
            await other.acquire(timeout=1, token="job-7")
    await holder.release(held)
    await lock.release(await waiting)


def test_a_thread_holding_with_a_token_another_thread_holds_is_refused(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "token-threads", **FAST)
    inside, tried = threading.Event(), threading.Event()
    outcomes: list[str] = []

    def first() -> None:
        with lock.hold(timeout=5, token="job-9"):
            inside.set()
            tried.wait(10)

    def second() -> None:
        inside.wait(10)
        try:
            with lock.hold(timeout=1, token="job-9"):
                outcomes.append("held as well")
        except LockUsageError as refused:
            outcomes.append(str(refused))
        finally:
            tried.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert len(outcomes) == 1 and "already holds this lock" in outcomes[0], outcomes


async def test_the_record_of_tokens_ends_with_their_requests_and_leases(aredis: Redis) -> None:
    lock = FifoLock(aredis, "token-bound", **FAST)
    before = tokens.in_use()
    for number in range(50):
        await lock.release(await lock.acquire(timeout=5, token=f"job-{number}"))
    held = await lock.acquire(timeout=5, token="held")
    with pytest.raises(TimeoutError):
        await lock.acquire(timeout=0.1, token="timed-out")
    assert tokens.in_use() == before + 1
    del held  # dropped unreleased: its grant is released in the background
    gc.collect()
    await until(lambda: tokens.in_use() == before, "the dropped lease's token free", 10)


async def test_the_token_of_a_dropped_lease_stays_in_use_until_its_grant_is_released(
    aredis: Redis, second_client: Redis
) -> None:
    """helper-38: the token was free as soon as the lease was dropped; a request
    of that token took the still-held grant over (same fence), and the late
    background release of the dropped lease then freed it under its new
    holder: another process got in beside it, 30 of 30 runs."""
    lock = FifoLock(aredis, "token-dropped", **FAST)
    before = tokens.in_use()
    lease = await lock.acquire(timeout=5, token="job-3")
    fence = lease.fence
    del lease
    gc.collect()
    with pytest.raises(LockUsageError, match="'job-3' already holds this lock"):
        await lock.acquire(timeout=1, token="job-3")
    await until(lambda: tokens.in_use() == before, "the dropped grant released", 10)
    again = await lock.acquire(timeout=5, token="job-3")
    assert again.fence > fence
    other = FifoLock(second_client, "token-dropped", **FAST)
    with pytest.raises(TimeoutError):
        await other.acquire(timeout=0.5)
    await lock.release(again)


def _never_refuses(keys: LockKeys, token: str) -> tokens.Use:
    """MUTANT token-used-twice: a token in use is taken again, as before these
    tests (only one client's waiters were looked at)."""
    return tokens.Use(keys, token)


async def test_a_held_token_kills_token_used_twice(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens, "take", _never_refuses)
    lock = FifoLock(aredis, "token-mutant", **FAST)
    first = await lock.acquire(timeout=5, token="job-1")
    second: Lease = await lock.acquire(timeout=1, token="job-1")
    assert second.fence == first.fence, "token-used-twice passed"
    await lock.release(first)


def _freed_at_drop(self: tokens.Use, _: object) -> None:
    """MUTANT token-freed-at-drop: a dropped lease frees its token at once,
    before the background release of its grant (the bug before the test
    above)."""
    self.end()


async def test_a_dropped_lease_s_token_kills_token_freed_at_drop(
    aredis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens.Use, "_dropped", _freed_at_drop)
    lock = FifoLock(aredis, "token-dropped-mutant", **FAST)
    lease = await lock.acquire(timeout=5, token="job-4")
    del lease
    gc.collect()
    again = await lock.acquire(timeout=1, token="job-4")  # "token-freed-at-drop passed"
    with contextlib.suppress(LeaseLost):
        await lock.release(again)
