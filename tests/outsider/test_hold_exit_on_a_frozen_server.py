"""Found by an outside attack: leaving ``hold()`` while Redis is frozen (SIGSTOP) never returns.

README ("Using it"): "A release that cannot reach Redis is retried for about a
second before it gives up, so a brief outage does not leave the lock held for
``lease_ms``." With redis-py's default client (no socket timeout, as the README
examples build it: ``FifoLock(Redis(), ...)``, ``SyncFifoLock(url, ...)``) no
try of that release ever fails: it waits for a reply that does not come, so the
``async with``/``with`` block's exit blocks for as long as the server is frozen
(here still blocked after 4 s with lease_ms = 1 s, when the lease is long gone
from the holder's own view: ``lease.lost`` is already True). ``acquire`` bounds
itself whatever the client; the release at the end of ``hold()`` does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, LockError, SyncFifoLock
from redis_fifo_lock.testing import PrivateRedisFactory

pytestmark = pytest.mark.timeout(60)


async def test_async_hold_exit_is_bounded_when_redis_freezes(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server()
    client = AsyncRedis.from_url(server.url)  # redis-py's defaults, as in the README
    lock = FifoLock(client, "frozen-exit", lease_ms=1000, poll_ms=500)
    pid = server.pid
    frozen = False
    try:

        async def body() -> bool:
            async with lock.hold(timeout=5) as lease:
                nonlocal frozen
                os.kill(pid, signal.SIGSTOP)
                frozen = True
                await asyncio.sleep(1.5)  # the lease runs out meanwhile
                lost = lease.lost
            return lost

        started = time.monotonic()
        task = asyncio.create_task(body())
        done, _ = await asyncio.wait({task}, timeout=6.0)
        elapsed = time.monotonic() - started
        assert done, (
            f"hold()'s exit still blocked {elapsed:.1f} s after entering (1.5 s block, "
            "lease_ms=1000): its release against a frozen server is not bounded"
        )
    finally:
        if frozen:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.2)
        if "task" in locals() and not task.done():
            with contextlib.suppress(LockError, asyncio.TimeoutError):
                await asyncio.wait_for(task, 5)
        await client.aclose()


def test_sync_hold_exit_is_bounded_when_redis_freezes(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    server = fresh_redis_server()
    lock = SyncFifoLock(server.url, "frozen-exit-sync", lease_ms=1000, poll_ms=500)
    pid = server.pid
    finished = threading.Event()
    frozen = threading.Event()

    def body() -> None:
        try:
            with lock.hold(timeout=5):
                os.kill(pid, signal.SIGSTOP)
                frozen.set()
                time.sleep(1.5)
        except LockError:
            pass
        finally:
            finished.set()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        ok = finished.wait(6.0)
        assert ok, "SyncFifoLock.hold()'s exit still blocked 6 s in against a frozen server"
    finally:
        if frozen.is_set():
            os.kill(pid, signal.SIGCONT)
        finished.wait(10)
