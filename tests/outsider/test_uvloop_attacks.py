"""An outsider's attack on uvloop, as uvicorn runs it when it is installed.

Each test runs the contenders on uvloop loops of their own (``uvloop.run`` in
threads), whatever loop the suite runs on, and the test's own loop too under
``FIFOLOCK_TEST_LOOP=uvloop``: exclusion with many contenders and holds
spanning several leases, cancellations mid-acquire and mid-release, acquire
timeouts, a blocked loop, and Redis restarted under a holder.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, LeaseLost, LoopClients
from redis_fifo_lock.holds import Hold, violations
from redis_fifo_lock.testing import PrivateRedisFactory

pytestmark = pytest.mark.timeout(90)

LEASE_MS = 1000
POLL_MS = 200


def _on_uvloop_threads(mains: list[Callable[[], Coroutine[Any, Any, None]]]) -> list[str]:
    """Run each coroutine function on a uvloop loop of its own thread; the
    errors they raised (as text), none if all returned."""
    errors: list[str] = []

    def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            uvloop.run(main())
        except BaseException as error:  # reported to the test
            errors.append(repr(error))

    threads = [threading.Thread(target=run, args=(main,)) for main in mains]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(75)
    errors.extend("a loop thread did not return" for thread in threads if thread.is_alive())
    return errors


def test_many_contenders_on_uvloop_with_cancellations_stay_apart(redis_url: str) -> None:
    """Three uvloop loops, six contenders each: holds of 0.02 to 2.5 s with
    lease_ms = 1 s (renewed many times), some cancelled as their request is
    sent, some while queued, some during their release, some with an acquire
    timeout. The recorded
    holds never overlap, fences and tickets only grow, every timeout is
    honoured (no sooner than asked, not much later), and nothing else raises."""
    holds: list[Hold] = []
    problems: list[str] = []
    guard = threading.Lock()
    name = f"uvloop-attack-{random.getrandbits(32)}"

    async def contender(lock: FifoLock, rng: random.Random, role: str) -> None:
        if role == "timeout":
            asked = rng.uniform(0.1, 0.6)
            started = time.monotonic()
            try:
                lease = await lock.acquire(timeout=asked)
            except asyncio.TimeoutError:
                took = time.monotonic() - started
                if not asked - 0.002 <= took < asked + 1.0:
                    with guard:
                        problems.append(f"timeout {asked:.3f} s raised after {took:.3f} s")
                return
            await lock.release(lease)
            return
        async with lock.hold(timeout=60) as lease:
            hold = Hold(lease.fence, lease.ticket, time.monotonic_ns())
            with guard:
                holds.append(hold)
            await asyncio.sleep(2.5 if role == "long" else rng.uniform(0.02, 0.15))
            if lease.lost:
                with guard:
                    problems.append(f"lease {lease.fence} lost while held")
            hold.exited_ns = time.monotonic_ns()
            if role == "cancel-release":
                # Cancelled during the release's first await, as hold() exits.
                task = asyncio.current_task()
                assert task is not None
                asyncio.get_running_loop().call_soon(task.cancel)

    def loop_main(seed: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def main() -> None:
            rng = random.Random(seed)
            clients = LoopClients(redis_url)
            try:
                lock = FifoLock(clients.client(), name, lease_ms=LEASE_MS, poll_ms=POLL_MS)
                roles = [
                    "long",
                    "short",
                    "timeout",
                    "cancel-sending",
                    "cancel-queued",
                    "cancel-release",
                ]
                tasks: dict[asyncio.Task[None], str] = {}
                for role in roles:
                    task = asyncio.create_task(contender(lock, rng, role))
                    tasks[task] = role
                    if role == "cancel-sending":  # after its first step: its request sent
                        asyncio.get_running_loop().call_soon(task.cancel)
                    await asyncio.sleep(rng.uniform(0, 0.05))
                for task, role in tasks.items():
                    if role == "cancel-queued":
                        asyncio.get_running_loop().call_later(rng.uniform(0.05, 1.5), task.cancel)
                for task, role in tasks.items():
                    try:
                        await task
                    except asyncio.CancelledError:
                        if not role.startswith("cancel"):
                            raise
                    except LeaseLost as error:
                        with guard:
                            problems.append(f"{role}: {error!r}")
            finally:
                await clients.aclose()

        return main

    problems.extend(_on_uvloop_threads([loop_main(seed) for seed in (1, 2, 3)]))
    assert not problems, problems
    assert len(holds) >= 9, holds  # 3 loops x (long, short, cancel-release), at least
    assert violations(holds) == []


async def test_a_blocked_uvloop_loses_its_lease_and_says_so(redis_url: str) -> None:
    """A holder whose uvloop loop is blocked for 2.5 leases: the lock goes to
    the next in line at Redis's expiry, and the holder learns it lost the lease
    (``lease.lost``, LeaseLost out of ``hold()``) rather than believing it
    still holds it. A loop blocked for less than the renewal margin keeps it."""
    name = f"uvloop-blocked-{random.getrandbits(32)}"
    result: dict[str, Any] = {}

    async def blocked_holder() -> None:
        client = AsyncRedis.from_url(redis_url)
        lock = FifoLock(client, name, lease_ms=LEASE_MS, poll_ms=POLL_MS)
        try:
            async with lock.hold(timeout=10) as lease:
                time.sleep(0.3)  # noqa: ASYNC251 - the fault: shorter than lease_ms - poll_ms
                await asyncio.sleep(0.5)
                result["kept"] = not lease.lost
                result["in"] = time.monotonic()
                time.sleep(2.5)  # noqa: ASYNC251 - the fault: the loop stops for 2.5 leases
                await asyncio.sleep(0.05)
                result["lost"] = lease.lost
        except LeaseLost:
            result["raised"] = True
        finally:
            await client.aclose()

    async def next_in_line() -> None:
        client = AsyncRedis.from_url(redis_url)
        lock = FifoLock(client, name, lease_ms=LEASE_MS, poll_ms=POLL_MS)
        try:
            while "in" not in result:  # noqa: ASYNC110 - set on another loop
                await asyncio.sleep(0.01)
            async with lock.hold(timeout=10):
                result["next_in"] = time.monotonic()
        finally:
            await client.aclose()

    errors = await asyncio.to_thread(_on_uvloop_threads, [blocked_holder, next_in_line])
    assert not errors, errors
    assert result["kept"], result
    assert result["lost"] and result.get("raised"), result
    # In once Redis let the lease expire (lease_ms after its last renewal,
    # before the loop stopped), while the holder's loop was still blocked.
    assert 0 < result["next_in"] - result["in"] < 2.5, result


def test_a_holder_on_uvloop_through_a_redis_restart(
    fresh_redis_server: PrivateRedisFactory,
) -> None:
    """Redis is restarted (every key lost) under a holder on uvloop, with a
    waiter queued: the holder is told its lease is lost (LeaseLost), the waiter
    gets the lock from the new server, and nothing hangs."""
    server = fresh_redis_server()
    name = f"uvloop-restart-{random.getrandbits(32)}"
    result: dict[str, Any] = {}
    restarted = threading.Event()

    async def holder() -> None:
        clients = LoopClients(server.url)
        lock = FifoLock(clients.client(), name, lease_ms=LEASE_MS, poll_ms=POLL_MS)
        try:
            async with lock.hold(timeout=10) as lease:
                result["held"] = True
                await asyncio.to_thread(restarted.wait, 20)
                await asyncio.sleep(2 * LEASE_MS / 1000)
                result["lost"] = lease.lost
        except LeaseLost:
            result["raised"] = True
        finally:
            await clients.aclose()

    async def waiter() -> None:
        clients = LoopClients(server.url)
        lock = FifoLock(clients.client(), name, lease_ms=LEASE_MS, poll_ms=POLL_MS)
        try:
            while "held" not in result:  # noqa: ASYNC110 - set on another loop
                await asyncio.sleep(0.01)
            async with lock.hold(timeout=20) as lease:
                result["waiter_fence"] = lease.fence
        finally:
            await clients.aclose()

    def restart() -> None:
        while "held" not in result:
            time.sleep(0.01)
        time.sleep(0.3)  # the waiter is queued
        from redis import Redis

        Redis.from_url(server.url).shutdown(nosave=True)
        time.sleep(0.5)
        fresh_redis_server(port=server.port)
        restarted.set()

    restarter = threading.Thread(target=restart)
    restarter.start()
    errors = _on_uvloop_threads([holder, waiter])
    restarter.join(30)
    assert not errors, errors
    assert result.get("lost") and result.get("raised"), result
    assert "waiter_fence" in result, result
