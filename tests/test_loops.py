"""``LoopContext``: what the lock keeps per event loop goes when the loop closes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LoopClients, SyncFifoLock
from redis_fifo_lock.calls import call_ids
from redis_fifo_lock.loops import contexts
from redis_fifo_lock.portal import is_portal_loop, portal
from redis_fifo_lock.protocol import AsyncClient
from redis_fifo_lock.waiting import hub_for
from tests.support.polling import until, until_sync

SETTINGS = {"lease_ms": 600, "poll_ms": 100}


def other_loops() -> list[asyncio.AbstractEventLoop]:
    """The loops of this process with a context, but for the portal's (which never closes)."""
    return [loop for loop in contexts() if not is_portal_loop(loop)]


async def hold_and_wait(lock: FifoLock) -> None:
    """Hold ``lock`` while a second request waits for it, so that hubs, wait
    groups and a renewal all exist on the loop."""
    async with lock.hold(timeout=5):
        second = asyncio.create_task(lock.acquire(timeout=5))
        await asyncio.sleep(0.25)  # past a renewal (lease_ms / 3): it is not awaited
    await lock.release(await second)


def test_no_loop_context_is_left_after_asyncio_run(redis_url: str) -> None:
    lock = FifoLock(LoopClients(redis_url), "run", **SETTINGS)
    for _ in range(3):
        asyncio.run(hold_and_wait(lock))
        assert other_loops() == []
    assert len(lock.clients or ()) == 0


def test_no_loop_context_is_left_after_async_to_sync(redis_url: str) -> None:
    lock = FifoLock(LoopClients(redis_url), "a2s", **SETTINGS)
    for _ in range(3):
        async_to_sync(hold_and_wait)(lock)
        assert other_loops() == []
    assert len(lock.clients or ()) == 0


def test_a_lease_handed_over_at_loop_close_leaves_no_context_behind(redis_url: str) -> None:
    lock = FifoLock(LoopClients(redis_url), "handed", **SETTINGS)

    async def acquire() -> Lease:
        return await lock.acquire(timeout=5)

    async def release(lease: Lease) -> None:
        await lock.release(lease)

    lease = async_to_sync(acquire)()
    assert other_loops() == []  # its renewal went to the portal with its loop's close
    async_to_sync(release)(lease)
    assert other_loops() == []
    assert lease.released and not lease.lost
    assert len(contexts()[portal().loop].renewals) == 0


def test_the_sync_facade_keeps_only_the_portal_loops_context(redis_url: str) -> None:
    lock = SyncFifoLock(redis_url, "sync", **SETTINGS)
    with lock.hold(timeout=5) as lease:
        assert not lease.lost
    assert other_loops() == []
    assert portal().loop in contexts()
    assert len(contexts()[portal().loop].renewals) == 0


LATE_STARTS = ["doorbell", "withdrawal"]
"""What a task cancelled by a loop's shutdown starts on its way out: a doorbell
subscription (CI saw one being confirmed as the cancellation came) or a
withdrawal (a ring for a request nobody waits for any more)."""


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the own client, left open
@pytest.mark.parametrize("late", LATE_STARTS)
@pytest.mark.parametrize("whose", ["LoopClients", "own client"])
def test_what_a_cancelled_task_starts_at_shutdown_ends_with_the_loop(
    redis_url: str, redis: Redis, whose: str, late: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``asyncio.run`` (and ``async_to_sync``) cancel the tasks they find before
    closing the loop, but a task they cancel can start another on its way out.
    That task must end with the loop, not be destroyed pending; a subscription
    on a client the caller keeps must not stay subscribed."""
    clients = LoopClients(redis_url)
    lock = FifoLock(clients, f"late-{late}-{whose}", **SETTINGS)
    channel = lock.keys.doorbell_of("late")
    kept: list[AsyncClient] = []
    started: list[asyncio.Task[None]] = []

    async def main() -> None:
        client = clients.client() if whose == "LoopClients" else AsyncRedis.from_url(redis_url)
        kept.append(client)
        hub = hub_for(client)

        async def starts_when_cancelled() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                if late == "doorbell":
                    await hub.doorbell.watch(channel, lambda token, grant: None)
                else:
                    group = hub.group(lock.keys, lock.settings, lock._protocol)
                    call = call_ids().start(lock.keys)
                    hub.withdraw(group, "nobody-waits", 0, call)
                    call_ids().leave(lock.keys, call)

        started.append(asyncio.create_task(starts_when_cancelled()))
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
        # The server may read the closed connection's end after this client's
        # next command, so the count is awaited, not read once.
        until_sync(
            lambda: redis.pubsub_numsub(channel) == [(channel.encode(), 0)],
            "the doorbell's subscription is gone with its loop",
        )
    assert [r.getMessage() for r in caplog.records if "destroyed" in r.getMessage()] == []
    assert other_loops() == []
    kept.clear()
    gc.collect()  # the own client's connections, with its loop gone


def test_acquires_on_many_threads_at_once_are_never_taken_for_late_copies(redis_url: str) -> None:
    """Every thread's event loop shares the process's call ids. A call id issued
    on one thread must count as in flight before another thread reads the
    floor: a floor past it would make Redis refuse its acquire as a late copy
    (CI saw an async Django view get LockUsageError that way)."""
    threads, rounds = 6, 40
    lock = FifoLock(LoopClients(redis_url), "threads-floor", **SETTINGS)
    inside: list[int] = []
    most: list[int] = [0]
    guard = threading.Lock()

    async def contend() -> None:
        for _ in range(rounds):
            async with lock.hold(timeout=30):
                with guard:
                    inside.append(1)
                    most[0] = max(most[0], len(inside))
                await asyncio.sleep(0)
                with guard:
                    inside.pop()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two steps
    try:
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(asyncio.run, contend()) for _ in range(threads)]:
                done.result()
    finally:
        sys.setswitchinterval(interval)
    assert most[0] == 1


OWED = ["withdraw", "release of hold()", "release of a dropped lease"]
"""What the lock owes Redis when a loop's shutdown cancels its caller."""


@pytest.mark.parametrize("owed", OWED)
def test_what_the_lock_owes_redis_is_done_before_its_loop_closes(redis_url: str, owed: str) -> None:
    """A task cancelled just before ``asyncio.run`` returns is cancelled again
    by the shutdown, which can cancel the withdrawal or release its
    cancellation started before that ran a step; a lease dropped as the loop
    ends has its release scheduled on that loop. Each is done before the loop
    closes: the lock is not left held, nor the request queued, until leases
    or liveness run out."""
    lock = FifoLock(LoopClients(redis_url), f"owed-{owed}", lease_ms=30_000, poll_ms=10_000)
    other = SyncFifoLock(redis_url, f"owed-{owed}", lease_ms=30_000, poll_ms=10_000)

    async def queued() -> bool:
        return (await lock.status()).waiting > 0

    async def withdraw() -> None:
        task = asyncio.create_task(lock.acquire(timeout=60))
        await until(queued, "the request queued")
        task.cancel()

    async def release_of_hold() -> None:
        inside = asyncio.Event()

        async def holds() -> None:
            async with lock.hold(timeout=5):
                inside.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(holds())
        await inside.wait()
        task.cancel()

    async def dropped() -> None:
        await lock.acquire(timeout=5)  # and dropped as the loop ends

    if owed == "withdraw":
        with other.hold(timeout=5):
            asyncio.run(withdraw())
            assert other.status().waiting == 0
    else:
        asyncio.run(release_of_hold() if owed == "release of hold()" else dropped())
        assert not other.status().held
    assert other_loops() == []


def test_a_loop_closes_however_its_renewals_meet_the_shutdown(redis_url: str) -> None:
    """20 leases renewing every 20 ms as ``asyncio.run`` returns: some renewal
    is always on its way when the shutdown (or the hand-over to the portal)
    cancels it, and Python 3.10/3.11's ``wait_for`` swallowed that cancellation
    when it met the reply; the renewal carried on and the loop never closed."""
    clients = LoopClients(redis_url)
    for round_ in range(8):
        fast = {"lease_ms": 60, "poll_ms": 30}
        locks = [FifoLock(clients, f"fast-{round_}-{k}", **fast) for k in range(20)]
        leases: list[Lease] = []
        closing = threading.Thread(target=asyncio.run, args=(_hold_all(locks, leases),))
        closing.daemon = True
        closing.start()
        closing.join(10)
        assert not closing.is_alive(), f"round {round_}: asyncio.run did not return in 10 s"
        asyncio.run(_release_all(locks, leases))
    assert other_loops() == []


async def _hold_all(locks: list[FifoLock], leases: list[Lease]) -> None:
    leases.extend([await lock.acquire(timeout=5) for lock in locks])
    await asyncio.sleep(0.04)  # a moment of renewals, not a synchronisation


async def _release_all(locks: list[FifoLock], leases: list[Lease]) -> None:
    for lock, lease in zip(locks, leases, strict=True):
        with contextlib.suppress(LeaseLost):
            await lock.release(lease)


class _SwallowingRedis(AsyncRedis):
    """A client that, once, loses a cancellation that comes while its script call
    is on its way, as redis-py can while it opens a connection."""

    on_its_way: asyncio.Event

    async def evalsha(self, *args: Any, **kwargs: Any) -> Any:
        if not self.on_its_way.is_set():
            self.on_its_way.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.5)
        return await super().evalsha(*args, **kwargs)


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="a lost cancellation can be told from 3.11 on"
)
async def test_an_acquire_whose_cancellation_was_lost_on_its_way_still_ends(
    redis_url: str,
) -> None:
    """The acquire call's client lost the cancellation and the request queued:
    the acquire must not wait on (for its timeout, or for ever) as if never
    cancelled, which keeps a closing loop waiting for it; it withdraws and
    raises CancelledError."""
    holder_lock = FifoLock(AsyncRedis.from_url(redis_url), "lost-cancel", **SETTINGS)
    holder = await holder_lock.acquire(timeout=5)
    client = _SwallowingRedis.from_url(redis_url)
    client.on_its_way = asyncio.Event()
    waiting = asyncio.create_task(FifoLock(client, "lost-cancel", **SETTINGS).acquire())
    await client.on_its_way.wait()
    waiting.cancel()
    done, _ = await asyncio.wait({waiting}, timeout=5)
    assert done, "the cancelled acquire still waits"
    assert waiting.cancelled()
    assert (await holder_lock.status()).waiting == 0
    await holder_lock.release(holder)
    await client.aclose()
    await holder_lock.client.aclose()
