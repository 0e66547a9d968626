"""Who runs first once the lock has a new holder: the next holder.

A hand-off is on the critical path of every contended grant: until the next
holder's ``acquire`` returns, the lock serves nobody. The task that woke it (the
releasing task, for a waiter of its own process; the doorbell's reader, for a
ring) has work of its own to go on with - the releasing task its next acquire,
the reader its next read - and must let the next holder run first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from redis_fifo_lock import FifoLock, Lease, RedisUnavailable, doorbell
from redis_fifo_lock import waiting as waiting_module
from redis_fifo_lock.protocol import LockKeys, Protocol
from redis_fifo_lock.testing import PrivateRedisFactory
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
        await until(
            lambda: aredis.pubsub_channels("*order-ring*"), "the waiter's doorbell is subscribed"
        )
        reads.append("release called")
        await holder.release(held)
        await waiting.release(await waiter)
    finally:
        await other.aclose()
    after = reads[reads.index("release called") + 1 :]
    assert after[:2] == ["next holder's acquire returned", "reader reads on"], after


async def test_a_server_that_refuses_publish_is_named_in_a_warning_once(
    fresh_redis_server: PrivateRedisFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scripts ring with redis.pcall: a ring the server refuses fails
    # nothing, and every hand-off would wait for a poll without a word.
    monkeypatch.setattr(doorbell, "_ringing_checked", set())
    server = fresh_redis_server(["--rename-command", "PUBLISH", ""])
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    holding, waiting = Redis.from_url(server.url), Redis.from_url(server.url)
    try:
        for name in ("no-publish-1", "no-publish-2"):
            holder = FifoLock(holding, name, lease_ms=2000, poll_ms=500)
            held = await holder.acquire()
            waiter = asyncio.create_task(
                FifoLock(waiting, name, lease_ms=2000, poll_ms=500).acquire(timeout=10)
            )
            await _queued(holder, 1)
            await holder.release(held)
            await FifoLock(waiting, name, lease_ms=2000, poll_ms=500).release(await waiter)
    finally:
        await holding.aclose()
        await waiting.aclose()
    told = [r.getMessage() for r in caplog.records if "PUBLISH" in r.getMessage()]
    assert len(told) == 1 and "rename-command" in told[0], told


async def test_the_publish_check_is_made_once_however_many_waits_start_together(
    fresh_redis_server: PrivateRedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doorbell, "_ringing_checked", set())
    server = fresh_redis_server()
    holding, waiting = Redis.from_url(server.url), Redis.from_url(server.url)
    names = [f"check-once-{i}" for i in range(20)]

    async def every_group_polled_and_one_checked() -> bool:
        # 20 grants, 20 queued acquires, then 20 first polls (a script's first
        # EVALSHA on this fresh server fails with NOSCRIPT: not counted); the
        # group that claims the check sends it after its first poll, maybe
        # behind the others' polls.
        stats = await holding.info("commandstats")
        ran = sum(
            stat.get("calls", 0) - stat.get("failed_calls", 0) - stat.get("rejected_calls", 0)
            for stat in (stats.get(f"cmdstat_{cmd}", {}) for cmd in ("eval", "evalsha"))
        )
        return ran >= 3 * len(names) and "cmdstat_publish" in stats

    held = [await FifoLock(holding, name).acquire() for name in names]
    waits = [asyncio.create_task(FifoLock(waiting, name).acquire()) for name in names]
    try:
        await until(every_group_polled_and_one_checked, "every wait group polled, one checked")
        stats = await holding.info("commandstats")
        assert stats["cmdstat_publish"]["calls"] == 1, stats.get("cmdstat_publish")
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        for name, lease in zip(names, held, strict=True):
            await FifoLock(holding, name).release(lease)
        await holding.aclose()
        await waiting.aclose()


async def _first_poll_while_the_check_hangs(
    server_url: str, monkeypatch: pytest.MonkeyPatch, *, first_poll_fails: bool = False
) -> bool:
    """A process's first wait, whose check that the lock may ring does not
    answer (as a call on a connection still being opened over a slow link):
    whether the group's first poll (its second, once the first failed if
    ``first_poll_fails``) was sent within a quarter of the lease (the check's
    bound is half of it)."""
    monkeypatch.setattr(doorbell, "_ringing_checked", set())
    checking, polled = asyncio.Event(), asyncio.Event()
    polls: list[object] = []

    async def unanswered_check(client: object, keys: object, poll_ms: int) -> bool:
        checking.set()
        await asyncio.Event().wait()
        return True

    poll = Protocol.poll

    async def recorded_poll(self: Protocol, client: Any, keys: LockKeys, *args: Any) -> Any:
        polls.append(keys)
        if first_poll_fails and len(polls) == 1:
            raise RedisUnavailable(keys.name, "the first poll's connection was lost")
        polled.set()
        return await poll(self, client, keys, *args)

    monkeypatch.setattr(waiting_module, "check_ringing", unanswered_check)
    monkeypatch.setattr(Protocol, "poll", recorded_poll)
    settings = {"lease_ms": 4000, "poll_ms": 2000}
    holding, waiting = Redis.from_url(server_url), Redis.from_url(server_url)
    try:
        held = await FifoLock(holding, "first-poll", **settings).acquire(timeout=5)
        waiter = asyncio.create_task(
            FifoLock(waiting, "first-poll", **settings).acquire(timeout=10)
        )
        await until(lambda: waiter.done() or checking.is_set(), "the check began", pause_s=0.01)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(polled.wait(), 1.0)
        await FifoLock(holding, "first-poll", **settings).release(held)
        await FifoLock(waiting, "first-poll", **settings).release(await waiter)
        return polled.is_set()
    finally:
        await holding.aclose()
        await waiting.aclose()


async def test_a_first_wait_polls_before_its_ringing_check_answers(
    fresh_redis_server: PrivateRedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first poll of a wait group keeps the process's requests queued
    (Redis drops them ``lease_ms`` after the last poll or acquire of the
    process). A process's first wait used to make its ringing check before
    that poll, and on a slow link (200 ms each way, lease 3 s) the check's call,
    on a connection still to be opened, held the poll back past the lease: a
    waiter first in line was served after one that came later."""
    assert await _first_poll_while_the_check_hangs(fresh_redis_server().url, monkeypatch)


async def test_a_first_poll_that_failed_is_retried_before_the_ringing_check(
    fresh_redis_server: PrivateRedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check waits for a poll that Redis answered: a first poll that failed
    (its pooled connection reset while idle, say) is tried again at once, not
    after the check (which may take half a lease on a slow link: found by an
    outside attack; the retry was then as late as before f8bc78d)."""
    url = fresh_redis_server().url
    assert await _first_poll_while_the_check_hangs(url, monkeypatch, first_poll_fails=True)


def _check_first(waiting_group: type[waiting_module.WaitGroup]) -> None:
    """MUTANT ringing-check-before-first-poll: the group makes the ringing check
    before its first poll (before the test above)."""
    watch = waiting_group._watch

    async def watch_then_check(self: waiting_module.WaitGroup) -> bool:
        watching = await watch(self)
        if watching:
            await self._check_ringing()
        return watching

    waiting_group._watch = watch_then_check  # type: ignore[method-assign]


async def test_a_hanging_ringing_check_kills_ringing_check_before_first_poll(
    fresh_redis_server: PrivateRedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting_module.WaitGroup, "_watch", waiting_module.WaitGroup._watch)
    _check_first(waiting_module.WaitGroup)
    polled = await _first_poll_while_the_check_hangs(fresh_redis_server().url, monkeypatch)
    assert not polled, "ringing-check-before-first-poll passed"


async def test_a_failed_first_poll_kills_check_after_failed_poll(
    fresh_redis_server: PrivateRedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MUTANT check-after-failed-poll: the check follows the first poll even
    when it failed (as in f8bc78d)."""
    monkeypatch.setattr(waiting_module.WaitGroup, "_may_check_ringing", lambda self: True)
    url = fresh_redis_server().url
    polled = await _first_poll_while_the_check_hangs(url, monkeypatch, first_poll_fails=True)
    assert not polled, "check-after-failed-poll passed"
