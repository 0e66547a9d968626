"""``LoopClients``: one client per event loop, closed with its loop."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable

import pytest
import redis
from asgiref.sync import async_to_sync
from redis.asyncio import Redis

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LoopClients, SyncFifoLock
from redis_fifo_lock.protocol import CALL_TIMEOUT_S
from tests.support.forking import RETURNED, in_child, needs_fork


def connections(url: str, name: str) -> int:
    probe = redis.Redis.from_url(url)
    try:
        return sum(1 for entry in probe.client_list() if entry["name"] == name)
    finally:
        probe.close()


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="the lock bounds its own calls on Python 3.11+ only"
)
def test_a_plain_client_built_for_the_lock_leaves_the_call_bound_to_the_lock(
    redis_url: str,
) -> None:
    """No ``socket_timeout`` of its own unless one is given (redis-py 8's 5 s
    default starts a task for every command written on Python 3.11), and a
    bounded connect; what the user gives, in the kwargs or the URL, is kept."""

    async def options(clients: LoopClients) -> dict[str, object]:
        client = clients.client()
        try:
            return dict(client.connection_pool.connection_kwargs)
        finally:
            await clients.aclose()

    default = asyncio.run(options(LoopClients(redis_url)))
    assert default["socket_timeout"] is None
    assert default["socket_connect_timeout"] == CALL_TIMEOUT_S
    given = asyncio.run(options(LoopClients(redis_url, socket_timeout=2.0)))
    assert given["socket_timeout"] == 2.0
    in_url = asyncio.run(options(LoopClients(f"{redis_url.partition('?')[0]}?socket_timeout=3")))
    assert in_url["socket_timeout"] == 3.0


def test_each_asyncio_run_gets_its_own_client_and_closes_it(redis_url: str) -> None:
    clients = LoopClients(redis_url, client_name="per-loop")
    seen = []

    async def use() -> None:
        client = clients.client()
        assert client is clients.client()
        seen.append(client)
        async with FifoLock(client, "loops", lease_ms=600, poll_ms=100).hold():
            pass

    for _ in range(3):
        asyncio.run(use())
        assert len(clients) == 0
    assert len({id(client) for client in seen}) == 3
    assert connections(redis_url, "per-loop") == 0


def test_many_async_to_sync_calls_leave_no_connections_behind(redis_url: str) -> None:
    clients = LoopClients(redis_url, client_name="a2s")

    async def use() -> int:
        async with FifoLock(clients.client(), "a2s", lease_ms=600, poll_ms=100).hold() as lease:
            return lease.fence

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fences = [async_to_sync(use)() for _ in range(30)]
    assert fences == sorted(set(fences)) and len(fences) == 30
    assert len(clients) == 0
    assert connections(redis_url, "a2s") == 0


def test_a_lease_acquired_in_one_async_to_sync_call_is_released_in_another(
    redis_url: str,
) -> None:
    clients = LoopClients(redis_url)

    def lock() -> FifoLock:
        return FifoLock(clients.client(), "split", lease_ms=600, poll_ms=100)

    async def acquire():  # type: ignore[no-untyped-def]
        return await lock().acquire()

    async def release(lease) -> None:  # type: ignore[no-untyped-def]
        await lock().release(lease)

    async def status():  # type: ignore[no-untyped-def]
        return await lock().status()

    lease = async_to_sync(acquire)()
    assert async_to_sync(status)().holder_fence == lease.fence
    async_to_sync(release)(lease)
    assert not async_to_sync(status)().held


def hold_across_closed_loop(redis_url: str, lock: Callable[[], FifoLock], lease_ms: int) -> bool:
    """Acquire in one ``asyncio.run`` (whose loop then closes), watch the lock
    from a plain client for 4 x ``lease_ms`` (many renewal intervals), then
    release in another ``asyncio.run``. Returns whether the lease key was there
    at every look; raises what the release raises. ``lock()`` is called on each
    loop."""

    async def acquire() -> Lease:
        return await lock().acquire()

    lease = asyncio.run(acquire())
    watcher = redis.Redis.from_url(redis_url)
    seen = []
    try:
        deadline = time.monotonic() + 4 * lease_ms / 1000
        while time.monotonic() < deadline:
            seen.append(bool(watcher.exists(f"fifolock:{{{lease.name}}}:lease")))
            time.sleep(lease_ms / 10000)  # sampling the state, not waiting for it
    finally:
        watcher.close()

    async def release() -> None:
        await lock().release(lease)

    asyncio.run(release())
    return len(seen) > 10 and all(seen)


def test_a_lease_outlives_the_loop_that_acquired_it_with_loop_clients(redis_url: str) -> None:
    one = FifoLock(LoopClients(redis_url), "handed-over", lease_ms=300, poll_ms=100)
    assert hold_across_closed_loop(redis_url, lambda: one, 300)


def test_with_a_plain_client_the_lease_stops_renewing_when_its_loop_closes(
    redis_url: str,
) -> None:
    # The control for the test above: with a client of its own loop, there is
    # no client to hand the renewal to, so the lease lapses and release says so.
    clients = LoopClients(redis_url)

    def lock() -> FifoLock:
        return FifoLock(clients.client(), "not-handed-over", lease_ms=300, poll_ms=100)

    with pytest.raises(LeaseLost):
        hold_across_closed_loop(redis_url, lock, 300)


def test_wait_lost_wakes_a_waiter_on_another_loop_after_the_hand_over(redis_url: str) -> None:
    # The lease is renewed by the portal thread once its loop closed; losing it
    # there must wake a wait_lost() awaited on yet another loop.
    lock = FifoLock(LoopClients(redis_url), "lost-elsewhere", lease_ms=300, poll_ms=100)

    async def acquire() -> Lease:
        return await lock.acquire()

    lease = asyncio.run(acquire())

    async def lose_and_wait() -> float:
        await lock.client.delete(lock.keys.key("lease"))
        deleted = time.monotonic()
        await asyncio.wait_for(lease.wait_lost(), 5)
        return time.monotonic() - deleted

    assert asyncio.run(lose_and_wait()) < 1.0
    assert lease.lost


@needs_fork
def test_a_child_forked_while_another_thread_builds_a_client_builds_its_own(
    redis_url: str,
) -> None:
    parent = os.getpid()
    building, go_on = threading.Event(), threading.Event()

    def factory() -> Redis:
        if os.getpid() == parent:
            building.set()
            go_on.wait(20)  # the fork happens while this thread builds a client
        return Redis.from_url(redis_url)

    clients = LoopClients(factory=factory)

    async def ping() -> object:
        return await clients.client().ping()

    def ping_in_a_thread() -> None:
        # A thread, so that a child stuck on the inherited lock still exits.
        answers: list[object] = []
        thread = threading.Thread(target=lambda: answers.append(asyncio.run(ping())), daemon=True)
        thread.start()
        thread.join(5)
        if not answers:
            raise TimeoutError("the child got no client within 5 s")

    builder = threading.Thread(target=lambda: asyncio.run(ping()))
    builder.start()
    try:
        assert building.wait(20)
        code = in_child(ping_in_a_thread, TimeoutError)
    finally:
        go_on.set()
        builder.join(20)
    assert code == RETURNED


def test_a_sync_release_of_a_lease_handed_to_the_portal_returns_at_once(redis_url: str) -> None:
    # The lease moves to the portal as asyncio.run closes its loop, with a
    # renewal due at once; the sync release then cuts that renewal off in
    # flight. On Python 3.10 / 3.11 asyncio.wait_for can swallow that
    # cancellation (bpo-42130), and the release must not wait for the renewal
    # task to notice (it would sleep until the next renewal, 5 s here).
    clients = LoopClients(redis_url)
    settings = {"lease_ms": 15_000, "poll_ms": 5000}
    core = FifoLock(clients, "handed-back", **settings)
    sync = SyncFifoLock(clients, "handed-back", **settings)

    async def acquire() -> Lease:
        return await core.acquire()

    for attempt in range(12):
        lease = asyncio.run(acquire())
        started = time.monotonic()
        sync.release(lease)
        took = time.monotonic() - started
        assert took < 2.0, f"release {attempt} took {took:.1f} s (renewal interval: 5 s)"
        assert not sync.status().held
