"""What differs on uvloop (as uvicorn runs it when installed), tested on a uvloop
loop whatever loop the suite runs on, and on asyncio's for comparison.

The whole suite runs on uvloop with ``FIFOLOCK_TEST_LOOP=uvloop`` (see
``tests/conftest.py``); the tests here pin the loop themselves, so that the
default run covers what uvloop does differently.
"""

from __future__ import annotations

import asyncio
import functools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import uvloop
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock
from redis_fifo_lock import alarms as alarms_module
from redis_fifo_lock import doorbell as doorbell_module
from redis_fifo_lock import protocol as protocol_module
from redis_fifo_lock.alarms import Alarms
from redis_fifo_lock.portal import Portal
from redis_fifo_lock.protocol import LockKeys
from tests.conftest import FaultProxyFactory

LOOPS = pytest.mark.parametrize(
    "new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)


def _on(new_loop: Callable[[], asyncio.AbstractEventLoop], main: Any) -> Any:
    """Run the coroutine ``main`` on a fresh loop made by ``new_loop``, then close it."""
    loop = new_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()


async def _calls_after_the_pooled_connection_was_reset(proxy_url: str, proxy: Any) -> list[str]:
    """Through ``proxy``: take a lease, reset every connection while the client
    is idle (a restart, a proxy, a firewall), then release it; and leave a
    ``hold()`` whose connections were reset inside. What each did, in order."""
    client = AsyncRedis.from_url(proxy_url)
    seen: list[str] = []
    try:
        lock = FifoLock(client, "reset-while-idle", lease_ms=30_000, poll_ms=5000)
        lease = await lock.acquire(timeout=5)
        proxy.reset()
        await asyncio.sleep(0.2)  # the loop sees the connection closed
        try:
            await lock.release(lease)
            seen.append("release: ok")
        except Exception as exc:
            seen.append(f"release: {type(exc).__name__}")
        held = FifoLock(client, "reset-inside-hold", lease_ms=30_000, poll_ms=5000)
        try:
            async with held.hold(timeout=5):
                proxy.reset()
                await asyncio.sleep(0.2)
            seen.append("hold: ok")
        except Exception as exc:
            seen.append(f"hold: {exc!r}")
        seen.append("hold's lock held" if (await held.status()).held else "hold's lock free")
    finally:
        await client.aclose()
    return seen


@LOOPS
def test_a_call_on_a_pooled_connection_reset_while_idle_goes_through(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    fault_proxy: FaultProxyFactory,
    redis_url: str,
    redis: Redis,
) -> None:
    """A call on a pooled connection that the other side reset while it was
    idle fails as Redis being out of reach (``RedisUnavailable``), on uvloop
    as on asyncio, so ``hold()`` retries its release and frees the lock. On
    asyncio the write fails with redis-py's ConnectionError; uvloop's closed
    transport refuses it with a bare RuntimeError ("unable to perform
    operation on <TCPTransport closed=True ...>; the handler is closed"),
    which the lock once let through untyped: out of release(), and out of
    ``hold()`` without a retry, the lock held until its lease ran out (as
    test_sync.py's interrupted holds found, on a portal running on uvloop)."""
    proxy = fault_proxy(redis_url)  # ``redis`` flushed the server
    assert _on(new_loop, _calls_after_the_pooled_connection_was_reset(proxy.url, proxy)) == [
        "release: RedisUnavailable",
        "hold: ok",
        "hold's lock free",
    ]


def _not_transport_closed(exc: BaseException) -> bool:
    """MUTANT uvloop-closed-transport: uvloop's RuntimeError for a closed
    transport is not taken for a dead connection, and escapes as it is."""
    return False


def test_a_reset_pooled_connection_on_uvloop_kills_closed_transport_let_through(
    fault_proxy: FaultProxyFactory,
    redis_url: str,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(protocol_module, "lost_in_transport", _not_transport_closed)
    proxy = fault_proxy(redis_url)
    problems = _on(
        uvloop.new_event_loop, _calls_after_the_pooled_connection_was_reset(proxy.url, proxy)
    )
    assert problems[0] == "release: RuntimeError", problems


def _portal_loop_type() -> type[asyncio.AbstractEventLoop]:
    """The type of the loop of a new ``Portal`` (then stopped and closed)."""
    made = Portal()
    try:
        return type(made.loop)
    finally:
        made.loop.call_soon_threadsafe(made.loop.stop)
        made.thread.join(5)
        made.loop.close()


def test_the_portal_loop_follows_the_installed_policy_and_never_picks_uvloop() -> None:
    """The library never picks uvloop: the portal's loop comes from the
    installed policy, asyncio's under uvicorn (a loop factory) or
    ``uvloop.run()``, uvloop's after ``uvloop.install()``."""
    previous = asyncio.get_event_loop_policy()
    try:
        asyncio.set_event_loop_policy(None)  # asyncio's default policy
        assert not issubclass(_portal_loop_type(), uvloop.Loop)
        with warnings.catch_warnings():  # policies are deprecated from Python 3.12
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        assert issubclass(_portal_loop_type(), uvloop.Loop)
    finally:
        asyncio.set_event_loop_policy(previous)


async def _timers_armed_for_alarms(alarms_class: type[Alarms], rounds: int) -> int:
    """On the running loop: ``rounds`` alarms one after another, each due a
    few milliseconds and a fraction ahead; how many timers were armed for them."""
    loop = asyncio.get_running_loop()
    call_at = loop.call_at
    armed = 0

    def counting_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.Handle:
        nonlocal armed
        armed += 1
        return call_at(when, *args, **kwargs)

    loop.call_at = counting_call_at  # type: ignore[method-assign]
    try:
        on_loop = alarms_class()
        for n in range(rounds):
            rang = loop.create_future()
            when = loop.time() + 0.003 + n * 0.000037
            on_loop.set(loop, when, functools.partial(rang.set_result, n))
            await rang  # no timer of its own (the test's timeout bounds it)
    finally:
        del loop.call_at
    return armed


@LOOPS
def test_an_alarm_arms_one_timer_though_the_loop_rings_it_early(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """uvloop arms timers in whole milliseconds and may run one up to a
    millisecond before its time; asyncio's clock has the same margin
    (``_clock_resolution``). The alarms took such an early ring for no ring,
    and armed a timer for the rest of the wait: under half a millisecond,
    which uvloop runs at once, so they armed it again and again (hundreds of
    times, a busy loop) until the clock reached the alarm. On uvloop, alarms
    due within a millisecond ring now; asyncio's loop rings them as before."""
    assert _on(new_loop, _timers_armed_for_alarms(Alarms, 30)) <= 30 + 10


def test_a_uvloop_ring_a_millisecond_early_kills_no_ring_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MUTANT no-ring-margin: on uvloop an alarm rings only once the loop's
    clock reached it, as before; the scenario above arms hundreds of timers."""
    monkeypatch.setattr(alarms_module, "RING_MARGIN_S", 0.0)
    assert _on(uvloop.new_event_loop, _timers_armed_for_alarms(Alarms, 30)) > 100


async def _first_acquire_after_an_idle_reset(proxy_url: str, proxy: Any) -> str:
    """Through ``proxy``: use the client, reset its connections while it is
    idle, then a lock's first acquire on that server (its eviction check comes
    first): how the acquire ended."""
    client = AsyncRedis.from_url(proxy_url)
    try:
        await client.ping()
        proxy.reset()
        await asyncio.sleep(0.2)  # the loop sees the connection closed
        lock = FifoLock(client, "evict-after-reset", lease_ms=5000, poll_ms=1000)
        try:
            await lock.release(await lock.acquire(timeout=3))
        except Exception as exc:
            return type(exc).__name__
        return "ok"
    finally:
        await client.aclose()


@LOOPS
def test_a_first_acquire_on_a_connection_reset_while_idle_is_typed(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    fault_proxy: FaultProxyFactory,
    redis_url: str,
    redis: Redis,
) -> None:
    """The eviction check (``CONFIG GET``) of a lock's first acquire on a server
    let uvloop's ``RuntimeError`` for a closed transport out of ``acquire``
    (3/3, found by an outside attack); an outage is ``RedisUnavailable``."""
    proxy = fault_proxy(redis_url)
    outcome = _on(new_loop, _first_acquire_after_an_idle_reset(proxy.url, proxy))
    assert outcome in ("ok", "RedisUnavailable"), outcome


class _ClosedTransportClient:
    """A client whose every command meets uvloop's closed transport."""

    connection_pool = None

    async def publish(self, channel: object, message: object) -> int:
        raise RuntimeError(
            "unable to perform operation on <TCPTransport closed=True>; the handler is closed"
        )


async def test_a_ringing_check_on_a_lost_connection_is_made_again_later() -> None:
    """The check that Redis lets the lock ring took a lost connection for a bug:
    an ERROR, and the check counted as made, so a refused PUBLISH was never
    reported (uvloop 3/3, Python 3.13.0 3/3; an outside attack). It is not
    made, and a later wait checks again."""
    client: Any = _ClosedTransportClient()
    assert await doorbell_module.check_ringing(client, LockKeys("ringing"), 1000) is False
