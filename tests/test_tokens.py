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
from redis_fifo_lock.protocol import LockKeys, Protocol, Script
from tests.adversarial.mutants import SourceScript
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
    for number in range(50):
        await lock.release(await lock.acquire(timeout=5, token=f"job-{number}"))
    held = await lock.acquire(timeout=5, token="held")
    with pytest.raises(TimeoutError):
        await lock.acquire(timeout=0.1, token="timed-out")
    assert tokens.in_use(lock.keys) == 1
    del held  # dropped unreleased: its token is free, its grant released in the background
    gc.collect()
    assert tokens.in_use(lock.keys) == 0


async def _reuse_after_drop(lock: FifoLock, other: FifoLock) -> bool:
    """Drop a lease of token "job-3" unreleased, take the lock again with that
    token at once, and let the dropped lease's background release run: whether
    ``other`` then got in beside the new holder."""
    lease = await lock.acquire(timeout=5, token="job-3")
    del lease
    gc.collect()
    again = await lock.acquire(timeout=5, token="job-3")
    await asyncio.sleep(0.5)  # the dropped lease's release runs as a background duty
    try:
        inside = await other.acquire(timeout=0.5)
    except TimeoutError:
        inside = None
    with contextlib.suppress(LeaseLost):
        await lock.release(again)
    if inside is not None:
        await other.release(inside)
    return inside is not None


async def test_a_dropped_lease_s_late_release_leaves_its_token_s_new_request_alone(
    aredis: Redis, second_client: Redis
) -> None:
    """helper-38: a request of the token of a dropped lease took the still-held
    grant over, and the late background release of the dropped lease (its
    token and fence were the grant's) freed it under its new holder: another
    process got in beside it, 30 of 30 runs. Redis now checks the release's
    call as well."""
    lock = FifoLock(aredis, "token-dropped", **FAST)
    other = FifoLock(second_client, "token-dropped", **FAST)
    assert not await _reuse_after_drop(lock, other), "another holder got in beside it"


def _release_by_grant_only() -> Protocol:
    """MUTANT release-ignores-call: the release script frees the grant its
    token and fence name, whichever call holds it now (the bug before the test
    above)."""
    source = Script("release.lua").source
    check = " and held[3] == call then"
    assert source.count(check) == 1, "release.lua changed: update this mutant"
    return Protocol(release=SourceScript("release.lua", source.replace(check, " then")))


async def test_a_dropped_lease_s_late_release_kills_release_ignores_call(
    aredis: Redis, second_client: Redis
) -> None:
    lock = FifoLock(aredis, "token-dropped-mutant", **FAST)
    lock._protocol = _release_by_grant_only()
    other = FifoLock(second_client, "token-dropped-mutant", **FAST)
    assert await _reuse_after_drop(lock, other), "release-ignores-call passed"


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
    await lock.release(second)  # the later call holds the grant now


async def test_a_held_lease_s_own_fresh_token_passed_again_is_refused(aredis: Redis) -> None:
    """A lease's token (``lease.token``) is fresh unless the caller gave one; it
    names one request all the same."""
    lock = FifoLock(aredis, "token-fresh", **FAST)
    lease = await lock.acquire(timeout=5)
    with pytest.raises(LockUsageError, match="already holds this lock"):
        await lock.acquire(timeout=1, token=lease.token)
    await lock.release(lease)
