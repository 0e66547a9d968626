"""Outages: requests whose fate is unknown, and acquire's timeout while Redis is silent.

Issue 11, items 3 and 4. A request whose acquire raised ``RedisUnavailable``
after its script ran is withdrawn once Redis answers again, so it stalls
nobody; and ``acquire(timeout=T)`` returns within about T whatever Redis does
(frozen with SIGSTOP, or behind a proxy that black-holes the connection), on
every supported redis-py, its abandoned request being withdrawn later.

The clients that must see an outage as an error have redis-py's retries off
(``Retry(NoBackoff(), 0)``) and a short ``socket_timeout``: with retries, a
redis-py 5-8 client re-sends the script on a new connection instead, which is
what ``test_late_messages.py`` and the adversarial proxy scenario cover. The
timeout tests use a client with redis-py's defaults (no socket timeout), as
users have them: the bound must come from the lock, not from the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
import weakref
from asyncio import selector_events
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from redis._parsers.base import BaseParser
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from redis_fifo_lock import (
    FifoLock,
    Lease,
    LeaseLost,
    LockError,
    LockTimeout,
    LoopClients,
    RedisUnavailable,
    SyncFifoLock,
    holding,
    protocol,
)
from redis_fifo_lock import doorbell as doorbell_module
from redis_fifo_lock import lock as lock_module
from redis_fifo_lock import protocol as protocol_module
from redis_fifo_lock.doorbell import LINGER_S
from redis_fifo_lock.inventory import lock_names_sync
from redis_fifo_lock.protocol import CALL_TIMEOUT_S, LockKeys
from redis_fifo_lock.testing import PrivateRedis, PrivateRedisFactory
from redis_fifo_lock.waiting import (
    CLOSING_S,
    MAX_CONCURRENT_CALLS,
    RETRY_AFTER_ERROR_S,
    WITHDRAW_PROBES_PER_ROUND,
    WaitGroup,
    _about_its_keys,
    hub_for,
)
from tests.conftest import FaultProxyFactory
from tests.support.damage import garble_floors
from tests.support.polling import until
from tests.support.proxy import FaultProxy

pytestmark = pytest.mark.timeout(90)

ON_3_11 = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="the lock bounds its own calls on Python 3.11+ only"
)
"""For the lock's own call bound (``protocol.CALL_TIMEOUT_S``)."""

HANDOFF_BOUND_S = 1.5
"""A free lock reaches the next waiter within this long (a round trip, generously)."""


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., AsyncRedis]]:
    """Makes clients (``url``, then ``Redis.from_url`` options), closed after the test."""
    made: list[AsyncRedis] = []

    def make(url: str, **options: Any) -> AsyncRedis:
        client = AsyncRedis.from_url(url, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


def no_retries() -> dict[str, Any]:
    """Client options under which a lost reply surfaces as an error at once."""
    return {"socket_timeout": 0.5, "retry": Retry(NoBackoff(), 0)}


async def warm_up(lock: FifoLock) -> None:
    """One acquire and release on a free lock: scripts loaded, eviction policy checked,
    so that the fault hits the calls under test and not these one-time ones."""
    lease = await lock.acquire(timeout=5)
    await lock.release(lease)


async def handoff_time(
    admin: AsyncRedis, holder: FifoLock, lease: Any, waiter: FifoLock, token: str
) -> float:
    """Queue ``token`` on ``waiter`` behind ``lease``, release ``lease``, and return
    how long the waiter then took to get the lock (inf if not within 10 s)."""
    keys = waiter.keys
    waiting = asyncio.create_task(waiter.acquire(timeout=30, token=token))
    await until(
        lambda: _queued(admin, keys, token) if not waiting.done() else _true(), f"{token} queued"
    )
    released = time.monotonic()
    await holder.release(lease)
    done, _ = await asyncio.wait({waiting}, timeout=10)
    if not done:
        waiting.cancel()  # withdraws; the lock is judged by the caller
        await asyncio.gather(waiting, return_exceptions=True)
        return float("inf")
    took = time.monotonic() - released
    await waiter.release(waiting.result())
    return took


async def test_a_poller_whose_client_is_dropped_during_its_ringing_check_ends_quietly(
    aredis: AsyncRedis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first wait on a server checks that the lock may ring (a PUBLISH,
    ``check_ringing``) in a call slot; if the client is dropped while the check
    waits for one, the group's poller ends, unsubscribing, with no error left
    for asyncio to report (found by an outside attack)."""
    monkeypatch.setattr(doorbell_module, "_ringing_checked", set())  # not checked yet
    holder = FifoLock(aredis, "check-dropped", lease_ms=7000, poll_ms=1000)
    lease = await holder.acquire(timeout=5)
    client = AsyncRedis.from_url(redis_url)
    hub = hub_for(client)
    slots, doorbell = hub.calls, hub.doorbell
    waiter = asyncio.create_task(
        FifoLock(client, "check-dropped", lease_ms=7000, poll_ms=1000).acquire(timeout=1)
    )
    await until(lambda: doorbell.active, "the waiter's group subscribes", pause_s=0)
    for _ in range(MAX_CONCURRENT_CALLS):
        await slots.acquire()  # the check waits for a slot
    outcomes = await asyncio.gather(waiter, return_exceptions=True)
    assert isinstance(outcomes[0], LockTimeout), outcomes
    loop_errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: loop_errors.append(context))
    await client.aclose()
    dropped = weakref.ref(client)
    del client, waiter, hub, outcomes
    await until(lambda: gc.collect() >= 0 and dropped() is None, "the client collected")
    for _ in range(MAX_CONCURRENT_CALLS):
        slots.release()
    await until(lambda: not doorbell.active, "the doorbell closed", timeout_s=LINGER_S + 10)
    await holder.release(lease)
    gc.collect()  # a task whose exception nobody read is reported when collected
    assert loop_errors == []


async def _queued(admin: AsyncRedis, keys: LockKeys, token: str) -> bool:
    return await admin.zscore(keys.key("queue"), token) is not None


async def _queued_call(admin: AsyncRedis, keys: LockKeys, token: str) -> str | None:
    """The acquire call that ``token``'s queued request answers to, or None."""
    record = await admin.hget(keys.key("waiters"), token)
    return None if record is None else str(record.decode().split(" ")[3])


async def _lost_with_its_withdrawal_on_its_way(
    proxy: Any, admin: AsyncRedis, lock: FifoLock, token: str
) -> Any:
    """``lock.acquire(token=token)`` through ``proxy`` reaches Redis, whose reply
    never comes (``RedisUnavailable``), and nothing sent from then on reaches
    Redis. Returns the lock's hub once the withdrawal of that request is on
    its way (held by the proxy)."""
    proxy.hold("down")
    first = asyncio.create_task(lock.acquire(timeout=30, token=token))
    await until(lambda: _queued(admin, lock.keys, token), f"{token} queued")
    proxy.hold("up")
    with pytest.raises(RedisUnavailable):
        await first
    hub = hub_for(lock.client)
    await until(
        lambda: any(w.attempt for w in hub._withdrawals.values()), "the withdrawal on its way"
    )
    return hub


async def _not_queued(admin: AsyncRedis, keys: LockKeys, token: str) -> bool:
    return not await _queued(admin, keys, token)


async def _true() -> bool:
    return True


# --- item 3 --------------------------------------------------------------------------------


async def test_requests_abandoned_by_an_outage_are_withdrawn_once_redis_answers_again(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
) -> None:
    settings = {"lease_ms": 7000, "poll_ms": 1000}
    proxy = fault_proxy(redis_url)
    lock = FifoLock(clients(proxy.url, **no_retries()), "abandoned", **settings)
    holder = FifoLock(clients(redis_url), "abandoned", **settings)
    await warm_up(lock)
    lease_h = await holder.acquire(timeout=5)
    for n in range(3):
        await lock.client.ping()  # a live connection to hold the reply on
        proxy.hold("down", current_only=True)  # Redis runs the script; its reply is lost
        with pytest.raises(RedisUnavailable):
            await lock.acquire(timeout=5, token=f"lost-{n}")
        proxy.release("down", deliver=False)
        proxy.reset()
        # The proxy cut every connection: drop them from the pool (its retries are
        # off), so that the next command does not fail on a dead socket.
        await lock.client.connection_pool.disconnect()
        assert await _queued(aredis, lock.keys, f"lost-{n}"), "the fault came before the script"
    # Redis answers again. A later waiter of the same process and client:
    took = await handoff_time(aredis, holder, lease_h, lock, "later")
    assert took < HANDOFF_BOUND_S, (
        f"the next waiter got the free lock {took:.1f} s after its release (lease_ms 7000): "
        "the three requests abandoned by the outage were granted to nobody"
    )


async def test_a_retry_during_an_outage_keeps_its_place_though_its_withdrawal_was_on_its_way(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``acquire`` raised ``RedisUnavailable`` and the lock set out to withdraw
    the request; the caller retries with the same token while Redis still does
    not answer, and so before the withdrawal could land. The retry takes the
    request over and keeps its place: the withdrawal that was on its way is
    cut short and held back while the retry is on its way, and the retry does
    not wait for it (found by an outside attack: the retry waited, the
    withdrawal was re-sent as the outage ended, and the retry queued again at
    the back, behind a later caller)."""
    settings = {"lease_ms": 30_000, "poll_ms": 10_000}
    proxy = fault_proxy(redis_url)
    client = clients(proxy.url, socket_timeout=1.0)
    lock = FifoLock(client, "retried-in-outage", **settings)
    holder = FifoLock(clients(redis_url), "retried-in-outage", **settings)
    later = FifoLock(clients(redis_url), "retried-in-outage", **settings)
    await warm_up(lock)
    lease_h = await holder.acquire(timeout=5)
    keys = lock.keys

    hub = await _lost_with_its_withdrawal_on_its_way(proxy, aredis, lock, "b")
    ticket = await aredis.zscore(keys.key("queue"), "b")
    first_call = await _queued_call(aredis, keys, "b")
    behind = asyncio.create_task(later.acquire(timeout=60, token="c"))
    await until(lambda: _queued(aredis, keys, "c"), "c queued behind b")

    retrying = asyncio.Event()
    reclaim = type(hub).reclaim

    def reclaim_noted(self: Any, keys: LockKeys, token: str) -> None:
        if token == "b":
            retrying.set()
        reclaim(self, keys, token)

    monkeypatch.setattr(type(hub), "reclaim", reclaim_noted)

    async def retried_until_granted() -> Lease:
        # As the error asks: again with the same token, while Redis fails.
        for _ in range(20):
            with contextlib.suppress(RedisUnavailable):
                return await lock.acquire(timeout=60, token="b")
        raise AssertionError("b's retries never reached Redis")

    retry = asyncio.create_task(retried_until_granted())
    await retrying.wait()
    await asyncio.sleep(0)  # the retry went on past reclaim's first step
    # Redis answers again: whatever was held is lost, every connection cut.
    proxy.release("up", deliver=False)
    proxy.release("down", deliver=False)
    proxy.reset()

    async def retried() -> bool:
        return await _queued_call(aredis, keys, "b") not in (None, first_call)

    await until(retried, "b's retry at Redis")
    assert await aredis.zscore(keys.key("queue"), "b") == ticket, (
        "the retry queued b again with a new ticket: the withdrawal that was on its way "
        "when the caller retried landed first, and b lost its place to c"
    )
    await holder.release(lease_h)
    lease_b = await asyncio.wait_for(retry, 20)
    assert not behind.done(), "c, queued after b, was granted the lock before it"
    await lock.release(lease_b)
    await later.release(await asyncio.wait_for(behind, 20))


@pytest.mark.parametrize("retry_ends", ["unavailable", "cancelled"])
async def test_a_retry_that_never_reaches_redis_leaves_the_first_request_to_its_withdrawal(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    retry_ends: str,
) -> None:
    """The retry holds back the withdrawal of the request it takes over; if the
    retry ends without a reply (it failed too, or was cancelled), the
    withdrawal is sent after all, once Redis answers: otherwise the first
    request stayed queued with nobody waiting for it, and the lock stalled
    for a whole lease when its turn came (found by an outside attack on the
    change that stopped the retry waiting for the withdrawal)."""
    settings = {"lease_ms": 30_000, "poll_ms": 10_000}
    proxy = fault_proxy(redis_url)
    client = clients(proxy.url, **no_retries())
    lock = FifoLock(client, "retry-never-arrives", **settings)
    holder = FifoLock(clients(redis_url), "retry-never-arrives", **settings)
    await warm_up(lock)
    lease_h = await holder.acquire(timeout=5)
    keys = lock.keys

    hub = await _lost_with_its_withdrawal_on_its_way(proxy, aredis, lock, "b")
    retry = asyncio.create_task(lock.acquire(timeout=30, token="b"))
    await until(lambda: all(w.suspended for w in hub._withdrawals.values()), "the retry began")
    if retry_ends == "cancelled":
        retry.cancel()
    with pytest.raises((RedisUnavailable, asyncio.CancelledError)):
        await retry
    # Redis answers again: whatever was held is lost, every connection cut.
    proxy.release("up", deliver=False)
    proxy.release("down", deliver=False)
    proxy.reset()
    await until(lambda: _not_queued(aredis, keys, "b"), "b withdrawn once Redis answers")
    took = await handoff_time(
        aredis,
        holder,
        lease_h,
        FifoLock(clients(redis_url), "retry-never-arrives", **settings),
        "later",
    )
    assert took < HANDOFF_BOUND_S, (
        f"the next waiter got the free lock {took:.1f} s after its release (lease_ms 30000)"
    )


# --- item 4 --------------------------------------------------------------------------------


class Silence:
    """Makes a server stop answering and brings it back: SIGSTOP/SIGCONT of the
    process, or a proxy that black-holes both directions and then delivers late."""

    def __init__(self, kind: str, server: PrivateRedis, proxy_url: str, proxy: Any) -> None:
        self.kind = kind
        self.server = server
        self.proxy = proxy
        self.url = server.url if kind == "sigstop" else proxy_url
        self.silent = False

    def start(self) -> None:
        if self.kind == "sigstop":
            os.kill(self.server.pid, signal.SIGSTOP)
        else:
            self.proxy.hold("up")
            self.proxy.hold("down")
        self.silent = True

    def end(self) -> None:
        if not self.silent:
            return
        self.silent = False
        if self.kind == "sigstop":
            os.kill(self.server.pid, signal.SIGCONT)
        else:
            self.proxy.release("up")  # the held acquire reaches Redis now, late
            self.proxy.release("down")


@pytest.fixture(params=["sigstop", "blackhole"])
def silence(
    request: pytest.FixtureRequest,
    fresh_redis_server: PrivateRedisFactory,
    fault_proxy: FaultProxyFactory,
) -> Iterator[Silence]:
    """A private server that the test can silence (the parameter says how)."""
    server = fresh_redis_server()
    proxy = fault_proxy(server.url)
    fault = Silence(request.param, server, proxy.url, proxy)
    try:
        yield fault
    finally:
        fault.end()  # never leave a stopped server behind


async def test_a_withdrawal_held_back_for_a_retry_holds_up_no_other_withdrawal(
    aredis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A withdrawal held back while a retry of its token is on its way (see
    ``Hub.reclaim``) is no failure of the round that could not send it: the
    hub goes on withdrawing the other requests at once (found by an outside
    attack: the round counted it as unanswered, the hub paused for
    ``RETRY_AFTER_ERROR_S``, a request cancelled meanwhile was still queued
    when its acquire ended, and the holder's release granted it)."""
    lock = FifoLock(aredis, "held-back", lease_ms=30_000, poll_ms=10_000)
    holder = await lock.acquire(timeout=5)
    keys = lock.keys
    tasks: dict[str, asyncio.Task[Lease]] = {}
    for token in ("y", "z", "x"):
        tasks[token] = asyncio.create_task(lock.acquire(token=token))
        await until(functools.partial(_queued, aredis, keys, token), f"{token} queued")
    gate = asyncio.Event()  # x's retry stays on its way until it opens
    acquire = lock._protocol.acquire

    async def gated(client: Any, keys: LockKeys, token: str, *args: Any, **kw: Any) -> Any:
        if token == "x":
            await gate.wait()
        return await acquire(client, keys, token, *args, **kw)

    monkeypatch.setattr(lock._protocol, "acquire", gated)  # the protocol is shared
    tasks["y"].cancel()
    tasks["x"].cancel()
    await asyncio.sleep(0)  # both withdrawals owed; x's caller stops waiting for its own
    tasks["x"].cancel()
    await asyncio.gather(tasks["x"], return_exceptions=True)
    retry = asyncio.create_task(lock.acquire(timeout=30, token="x"))  # keeps x's place
    await asyncio.gather(tasks["y"], return_exceptions=True)
    await until(functools.partial(_not_queued, aredis, keys, "y"), "y withdrawn")
    tasks["z"].cancel()
    await asyncio.gather(tasks["z"], return_exceptions=True)
    z_queued = await _queued(aredis, keys, "z")
    gate.set()
    await until(lambda: _queued_call(aredis, keys, "x"), "x's retry at Redis")
    await lock.release(holder)
    await lock.release(await asyncio.wait_for(retry, 10))
    assert not z_queued, (
        "z was still queued when its cancelled acquire ended: its withdrawal waited "
        "behind the one held back for x's retry"
    )


async def test_a_withdrawal_held_back_for_a_retry_that_never_reached_redis_is_sent(
    aredis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub's withdrawer stops while every owed withdrawal is held back for a
    retry of its token; once the retry ends without Redis's reply (cancelled
    before it was sent), the first request is withdrawn all the same."""
    lock = FifoLock(aredis, "held-back-alone", lease_ms=30_000, poll_ms=10_000)
    holder = await lock.acquire(timeout=5)
    keys = lock.keys
    first = asyncio.create_task(lock.acquire(token="x"))
    await until(functools.partial(_queued, aredis, keys, "x"), "x queued")
    gate = asyncio.Event()  # never opened: the retry is cancelled before it is sent
    acquire, withdraw = lock._protocol.acquire, lock._protocol.withdraw
    withdrawals: list[str] = []

    async def gated(client: Any, keys: LockKeys, token: str, *args: Any, **kw: Any) -> Any:
        await gate.wait()
        return await acquire(client, keys, token, *args, **kw)

    async def first_on_its_way(*args: Any) -> Any:
        withdrawals.append("x")
        if len(withdrawals) == 1:
            await gate.wait()  # on its way until the retry cuts it short
        return await withdraw(*args)

    monkeypatch.setattr(lock._protocol, "acquire", gated)  # the protocol is shared
    monkeypatch.setattr(lock._protocol, "withdraw", first_on_its_way)
    first.cancel()
    await asyncio.sleep(0)  # its withdrawal owed; the caller stops waiting for it
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    retry = asyncio.create_task(lock.acquire(timeout=30, token="x"))
    await until(lambda: withdrawals, "x's withdrawal on its way")
    withdrawer = hub_for(aredis)._withdrawer
    assert withdrawer is not None
    await asyncio.wait({withdrawer}, timeout=5)  # nothing it may send
    assert withdrawer.done() and await _queued(aredis, keys, "x")
    retry.cancel()
    await asyncio.gather(retry, return_exceptions=True)
    await until(functools.partial(_not_queued, aredis, keys, "x"), "x withdrawn", 5)
    await lock.release(holder)


async def test_a_withdrawal_cut_short_by_a_retry_that_ended_at_once_is_no_failure(
    redis_url: str, clients: Callable[..., AsyncRedis]
) -> None:
    """A retry of a token cuts its withdrawal on its way short (see
    ``Hub.reclaim``), and ends without a reply at once (cancelled): the
    withdrawal was not answered because it was not sent, not because Redis
    is silent, and it is sent again at once (found by an outside attack: the
    hub paused for ``RETRY_AFTER_ERROR_S``, the request was still queued when
    the retry's cancellation returned, and the next waiter got the lock a
    quarter of a second after the release)."""
    # A client of its own: the withdrawal opens a second connection, and is
    # still on its way when the retry comes.
    lock = FifoLock(clients(redis_url), "cut-short", lease_ms=30_000, poll_ms=10_000)
    other = FifoLock(clients(redis_url), lock.name, lease_ms=30_000, poll_ms=10_000)
    holder = await lock.acquire(timeout=5)
    keys = lock.keys
    first = asyncio.create_task(lock.acquire(token="x"))
    await until(functools.partial(_queued, other.client, keys, "x"), "x queued")
    first.cancel()
    await asyncio.sleep(0)  # its withdrawal owed; the caller stops waiting for it
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    retry = asyncio.create_task(lock.acquire(timeout=30, token="x"))
    await asyncio.sleep(0)  # the retry cuts the withdrawal on its way short ...
    retry.cancel()  # ... and ends without a reply
    await asyncio.gather(retry, return_exceptions=True)
    admin = clients(redis_url)
    x_queued = await _queued(admin, keys, "x")
    took = await handoff_time(admin, lock, holder, other, "y")
    assert not x_queued, "x was still queued when its retry's cancellation returned"
    assert took < HANDOFF_BOUND_S


async def test_acquire_with_a_timeout_returns_in_time_while_redis_does_not_answer(
    silence: Silence, clients: Callable[..., AsyncRedis]
) -> None:
    settings = {"lease_ms": 10_000, "poll_ms": 1000}
    admin = clients(silence.server.url)
    holder = FifoLock(clients(silence.server.url), "silent", **settings)
    lock = FifoLock(clients(silence.url), "silent", **settings)  # redis-py's defaults
    await warm_up(FifoLock(lock.client, "warm-up", **settings))
    lease_h = await holder.acquire(timeout=5)
    silence.start()
    started = time.monotonic()
    acquiring = asyncio.create_task(lock.acquire(timeout=2, token="abandoned"))
    # Not wait_for: cancelling the acquire would wait for its withdrawal, which
    # cannot reach a silent server either. The bound only keeps the test short.
    done, _ = await asyncio.wait({acquiring}, timeout=8)
    took = time.monotonic() - started
    silence.end()
    if done:
        error = acquiring.exception()
        assert isinstance(error, LockError), f"acquire ended with {error!r}, not a LockError"
        # Redis confirmed no withdrawal: the error must not say it did.
        assert "the request was withdrawn" not in str(error), str(error)
    else:
        acquiring.cancel()
        await asyncio.gather(acquiring, return_exceptions=True)
    assert took < 2 + 1.0, (
        f"acquire(timeout=2) returned after {took:.1f} s while the server was silent "
        f"({silence.kind})" + ("" if done else ": it had not returned when the test gave up")
    )
    # Redis answers again: the request abandoned meanwhile must not stall the lock.
    took = await handoff_time(admin, holder, lease_h, lock, "later")
    assert took < HANDOFF_BOUND_S, (
        f"the next waiter got the free lock {took:.1f} s after its release: the request "
        "abandoned during the silence was not withdrawn"
    )


# --- a client with no socket_timeout ----------------------------------------------------


@ON_3_11
async def test_every_call_is_bounded_by_the_lock_when_the_client_has_no_socket_timeout(
    silence: Silence, clients: Callable[..., AsyncRedis]
) -> None:
    """redis-py before 8 has no socket timeout by default, and docs/performance.md
    advises none on Python < 3.12: a silent server must still end a ``release``
    (which has no timeout of its own), a ``status`` and an ``acquire`` without a
    timeout with ``RedisUnavailable`` within ``CALL_TIMEOUT_S``, never hang them."""
    settings = {"lease_ms": 60_000, "poll_ms": 30_000}
    client = clients(silence.url, socket_timeout=None, retry=Retry(NoBackoff(), 0))
    lock = FifoLock(client, "unbounded", **settings)
    await warm_up(FifoLock(lock.client, "warm-up", **settings))
    lease = await lock.acquire(timeout=5)
    waiter = FifoLock(lock.client, "unbounded-waiter", **settings)
    silence.start()
    calls = {
        "release": lock.release(lease),
        "status": lock.status(),
        "acquire": waiter.acquire(),
    }
    started = time.monotonic()
    tasks = {name: asyncio.create_task(call) for name, call in calls.items()}
    # The bound only keeps the test short; the tasks are judged below.
    await asyncio.wait(tasks.values(), timeout=CALL_TIMEOUT_S + 5)
    took = time.monotonic() - started
    silence.end()
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    for name, task in tasks.items():
        assert task.done() and not task.cancelled(), (
            f"{name}() had not returned {took:.1f} s into the silence ({silence.kind}): a "
            "client without socket_timeout left the call unbounded"
        )
        assert isinstance(task.exception(), RedisUnavailable), (
            f"{name}() ended with {task.exception()!r} while the server was silent"
        )
    assert took < CALL_TIMEOUT_S + 2.0


@ON_3_11
def test_the_clients_the_lock_builds_are_bounded_by_the_lock_while_redis_is_silent(
    silence: Silence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LoopClients`` builds plain clients with no ``socket_timeout`` on
    Python 3.11+ (the lock bounds its calls itself): a silent server still ends
    a ``SyncFifoLock`` release and the SCAN for lock names (``manage.py fifolock
    list``) with an error within the lock's bound, never a hang."""
    monkeypatch.setattr(protocol, "CALL_TIMEOUT_S", 0.5)  # the bound's length only
    clients = LoopClients(silence.url)
    lock = SyncFifoLock(clients, "own-client", lease_ms=60_000, poll_ms=30_000)
    lease = lock.acquire(timeout=5)
    assert lock_names_sync(clients) == ["own-client"]
    silence.start()
    calls: dict[str, Callable[[], object]] = {
        "release": functools.partial(lock.release, lease),
        "lock_names_sync": functools.partial(lock_names_sync, clients),
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        started = time.monotonic()
        running = {name: pool.submit(call) for name, call in calls.items()}
        for name, future in running.items():
            left = started + 10 - time.monotonic()
            try:
                future.result(timeout=max(left, 0.1))
            except TimeoutError:
                silence.end()  # lets the hung call end, so the pool can shut down
                pytest.fail(f"{name}() still hung 10 s into the silence ({silence.kind})")
            except (RedisUnavailable, redis.exceptions.RedisError):
                continue
            pytest.fail(f"{name}() returned while the server was silent ({silence.kind})")


@ON_3_11
async def test_a_poll_cut_off_by_the_lock_s_own_bound_logs_why(
    silence: Silence,
    clients: Callable[..., AsyncRedis],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warning of a poll that the lock's call bound cut off says why (that
    error has no redis-py cause to print), and the waiter is served afterwards."""
    monkeypatch.setattr(protocol, "CALL_TIMEOUT_S", 0.5)  # the bound's length only
    settings = {"lease_ms": 10_000, "poll_ms": 1000}
    holder = FifoLock(clients(silence.server.url), "why", **settings)
    client = clients(silence.url, socket_timeout=None, retry=Retry(NoBackoff(), 0))
    lock = FifoLock(client, "why", **settings)
    await warm_up(FifoLock(client, "warm-up", **settings))
    lease_h = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(lock.acquire(timeout=30, token="waits"))
    await until(lambda: _queued(holder.client, lock.keys, "waits"), "the waiter queued")
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    silence.start()
    polls = await until(
        lambda: [r.getMessage() for r in caplog.records if "poll failed" in r.getMessage()],
        "a poll failed during the silence",
    )
    silence.end()
    assert not any(message.endswith(": None") for message in polls), polls
    assert any("did not answer the poll script" in message for message in polls), polls
    await holder.release(lease_h)
    await lock.release(await asyncio.wait_for(waiting, 20))


# --- shutdown while Redis is silent --------------------------------------------------------


def test_a_hold_cancelled_at_shutdown_keeps_asyncio_run_at_most_two_closing_bounds(
    silence: Silence,
) -> None:
    """``asyncio.run`` cancels a task inside ``hold()`` as ``main`` returns, and Redis
    does not answer. The cancelled hold waits for its release at most ``CLOSING_S``
    (the release goes on as a duty of the hub), and the loop's close at most
    ``CLOSING_S`` more: the thread that runs the loop is not kept for the release's
    whole retry schedule (four tries of a second each, and their pauses)."""
    entered = threading.Event()
    # Held for the whole test: asyncio keeps tasks weakly, and a pending task
    # that nothing refers to can be garbage-collected (seen once in a full run:
    # "Task was destroyed but it is pending!", then its lease released from GC).
    tasks: list[asyncio.Task[None]] = []

    async def main() -> None:
        client = AsyncRedis.from_url(silence.url)  # redis-py's defaults, as users have them
        lock = FifoLock(client, "shutdown", lease_ms=10_000, poll_ms=1000)
        await warm_up(FifoLock(client, "warm-up"))

        async def holding() -> None:
            async with lock.hold(timeout=5):
                entered.set()
                await asyncio.Event().wait()

        tasks.append(asyncio.get_running_loop().create_task(holding()))
        await asyncio.to_thread(entered.wait, 10)
        silence.start()

    started = time.monotonic()
    asyncio.run(main())
    took = time.monotonic() - started
    assert entered.is_set()
    bound = 2 * CLOSING_S + 1.0
    assert took < bound, (
        f"asyncio.run returned {took:.1f} s after main started ({silence.kind}): the "
        f"hold cancelled at shutdown waited for its release's retries (bound {bound:g} s)"
    )


# --- many withdrawals owed through a long outage ------------------------------------------


async def test_withdrawals_owed_through_a_long_outage_are_tried_at_a_bounded_rate(
    redis_url: str, aredis: AsyncRedis, fault_proxy: FaultProxyFactory
) -> None:
    """Requests given up while Redis refuses every connection are owed
    withdrawals, tried again every ``RETRY_AFTER_ERROR_S``. Before, each
    round sent every one of them (up to ``MAX_WITHDRAWALS``): 2,000 owed kept
    a process at 67 % of a CPU for as long as the outage lasted. A round now
    tries one withdrawal of a few locks (here the one), and the withdrawals
    still all land, without delay, once Redis answers again."""
    owed = 300
    proxy = fault_proxy(redis_url)
    holder = FifoLock(aredis, "owed-many", lease_ms=30_000, poll_ms=1000)
    lease = await holder.acquire(timeout=5)
    client = AsyncRedis.from_url(proxy.url, **no_retries())
    lock = FifoLock(client, "owed-many", lease_ms=30_000, poll_ms=1000)
    tokens = [f"owed-{n}" for n in range(owed)]
    waiters = [asyncio.create_task(lock.acquire(timeout=60, token=token)) for token in tokens]

    async def all_queued() -> bool:
        return bool(await aredis.zcard(holder.keys.key("queue")) == owed)

    await until(all_queued, f"{owed} queued")
    proxy.max_connections = 0  # every new connection refused: a fast failure
    proxy.reset()
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    hub = hub_for(client)
    await until(lambda: len(hub._withdrawals) == owed, "every withdrawal owed")
    refused = proxy.refused
    window_s = 4 * RETRY_AFTER_ERROR_S
    await asyncio.sleep(window_s)  # a measurement window, not a synchronisation
    tried = proxy.refused - refused
    rounds = window_s / RETRY_AFTER_ERROR_S + 1
    bound = rounds * WITHDRAW_PROBES_PER_ROUND + 20  # + the doorbell's reconnections
    assert tried <= bound, (
        f"{tried} connections tried in {window_s:g} s of outage for {owed} owed withdrawals "
        f"(bound {bound:g}): each round sent them all"
    )
    proxy.max_connections = 256
    started = time.monotonic()
    await until(lambda: not hub._withdrawals, "every withdrawal answered", timeout_s=20)
    took = time.monotonic() - started
    left = {token.decode() for token in await aredis.zrange(holder.keys.key("queue"), 0, -1)}
    assert not left & set(tokens), f"{len(left & set(tokens))} given-up requests still queued"
    assert took < 5 * RETRY_AFTER_ERROR_S + 2, f"the owed withdrawals took {took:.1f} s to land"
    await holder.release(lease)
    await client.aclose()


async def test_an_acquire_costs_no_more_with_thousands_of_withdrawals_owed(
    redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """Every acquire looks up its token's owed withdrawals (``Hub.reclaim``, then
    ``Hub.retry_ended``). Through an outage they pile up, one per request given
    up, to ``MAX_WITHDRAWALS``; looking through all of them made each acquire
    cost in proportion, and 20,000 waiters cancelled at once took minutes of
    CPU (a hang of the suite's own 20,000-waiter test, under load). The last
    acquires of a run that leaves thousands owed cost what the first did."""
    proxy = fault_proxy(redis_url)
    client = AsyncRedis.from_url(proxy.url, **no_retries())
    lock = FifoLock(client, "owed-lookups", lease_ms=30_000, poll_ms=1000)
    await warm_up(lock)
    proxy.max_connections = 0  # every new connection refused: a fast failure
    proxy.reset()
    batch, batches = 500, 8
    took: list[float] = []
    for _ in range(batches):
        started = time.process_time()
        for _ in range(batch):
            with contextlib.suppress(RedisUnavailable):
                await lock.acquire(timeout=5)
        took.append(time.process_time() - started)
    owed = len(hub_for(client)._withdrawals)
    assert owed >= (batches - 1) * batch, f"only {owed} withdrawals owed"
    assert took[-1] < 2.5 * took[0], (
        f"the last {batch} acquires took {took[-1]:.2f} s of CPU, the first {took[0]:.2f} s, "
        f"with up to {owed} withdrawals owed"
    )
    await client.aclose()


async def test_after_an_outage_a_lock_whose_withdrawals_fail_holds_up_no_other_lock(
    redis_url: str, aredis: AsyncRedis, fault_proxy: FaultProxyFactory
) -> None:
    """Withdrawals are owed on two locks when the outage ends, and those of the
    one queued first keep failing (here its queue key was overwritten, so
    every script on it fails; on a Redis Cluster, its node still down). The
    other lock's withdrawals land at once, its oldest first, and its next
    waiter, queued behind that oldest request, gets the lock as soon as the
    holder leaves. Found by an outside attack on the first bounded rounds
    (7a98f98), which tried a few withdrawals a round in the order owed: the
    other lock's waited 24 s behind 400 failing ones."""
    proxy = fault_proxy(redis_url)
    client = AsyncRedis.from_url(proxy.url, **no_retries())
    settings = {"lease_ms": 30_000, "poll_ms": 1000}
    failing, healthy = (FifoLock(client, name, **settings) for name in ("failing", "healthy"))
    for lock in (failing, healthy):
        await warm_up(lock)
    holders = {lock.name: FifoLock(aredis, lock.name, **settings) for lock in (failing, healthy)}
    leases = {name: await holder.acquire(timeout=5) for name, holder in holders.items()}
    given_up = [asyncio.create_task(failing.acquire(timeout=60, token=f"f{n}")) for n in range(100)]
    given_up.append(asyncio.create_task(healthy.acquire(timeout=60, token="h0")))
    await until(lambda: _queued(aredis, healthy.keys, "h0"), "h0 queued")
    next_waiter = asyncio.create_task(holders["healthy"].acquire(timeout=30, token="next"))
    await until(lambda: _queued(aredis, healthy.keys, "next"), "next queued behind h0")
    given_up += [
        asyncio.create_task(healthy.acquire(timeout=60, token=f"h{n}")) for n in range(1, 20)
    ]
    for token in ("f99", "h19"):
        lock = failing if token[0] == "f" else healthy
        await until(functools.partial(_queued, aredis, lock.keys, token), f"{token} queued")
    proxy.max_connections = 0
    proxy.reset()
    for task in given_up:
        task.cancel()
    await asyncio.gather(*given_up, return_exceptions=True)
    hub = hub_for(client)
    await until(lambda: len(hub._withdrawals) == 120, "every withdrawal owed")
    await asyncio.sleep(4 * RETRY_AFTER_ERROR_S)  # rounds go by in the outage
    await aredis.delete(failing.keys.key("queue"))
    await aredis.set(failing.keys.key("queue"), "not a queue")  # its scripts fail from now on
    proxy.max_connections = 256
    ended = time.monotonic()
    await holders["healthy"].release(leases["healthy"])
    lease_next = await asyncio.wait_for(next_waiter, 20)
    took = time.monotonic() - ended
    try:
        assert took < 3 * RETRY_AFTER_ERROR_S, (
            f"next got the lock {took:.2f} s after the outage ended: h0's withdrawal waited "
            "behind the failing lock's"
        )
        await until(lambda: _not_queued(aredis, healthy.keys, "h19"), "h19 withdrawn", 5)
    finally:
        await holders["healthy"].release(lease_next)
        await aredis.delete(failing.keys.key("queue"))  # its withdrawals land now
        await until(lambda: not hub._withdrawals, "the failing lock's withdrawals landed")
        await holders["failing"].release(leases["failing"])
        await client.aclose()


@pytest.mark.parametrize(
    ("reply", "about_its_keys"),
    [
        (
            "WRONGTYPE Operation against a key holding the wrong kind of value script: 1f, "
            "on @user_script:491.",
            True,
        ),
        (
            "ERR user_script:147: bad argument #1 to 'gmatch' (string expected, got nil) "
            "script: 1f, on @user_script:147.",
            True,
        ),
        (
            "ERR Error running script (call to f_1f): @user_script:147: user_script:147: bad "
            "argument #1 to 'gmatch' (string expected, got nil)",
            True,
        ),
        (
            "ERR Error running script (call to f_1f): @user_script:12: @user_script: 12: -OOM "
            "command not allowed when used memory > 'maxmemory'.",
            False,
        ),
        (
            "OOM command not allowed when used memory > 'maxmemory'. script: 1f, on "
            "@user_script:171.",
            False,
        ),
        (
            "READONLY You can't write against a read only replica. script: 1f, on "
            "@user_script:171.",
            False,
        ),
        ("NOREPLICAS Not enough good replicas to write. script: 1f, on @user_script:171.", False),
    ],
)
def test_withdrawal_errors_are_told_apart_by_what_they_are_about(
    reply: str, about_its_keys: bool
) -> None:
    """A withdrawal that fails with an error about its own lock's keys (its type,
    or a script failing on what it read there; Redis 7's and 6.2's wording)
    proves that Redis serves: only that lock waits. One about Redis as a whole,
    also from inside a script, pauses every withdrawal (see
    ``WITHDRAW_PROBES_PER_ROUND``). Each reply is read as redis-py reads it
    off the wire: it raises a subclass for most server-wide codes, with the
    code cut off (an outside attack found OOM and READONLY taken for errors
    about the keys that way: one try per lock every half second)."""
    assert _about_its_keys(BaseParser.parse_error(reply)) is about_its_keys


async def _corrupt(admin: AsyncRedis, keys: LockKeys, how: str) -> Callable[[], Awaitable[Any]]:
    """Make every script on the lock of ``keys`` fail with an error Redis replies
    with: ``wrongtype``, its queue key overwritten (WRONGTYPE); ``script``, its
    processes' floor entries garbled (a Lua error in the script). Returns how to
    mend it (the keys deleted: the scripts on it then work)."""
    if how == "wrongtype":
        await admin.delete(keys.key("queue"))
        await admin.set(keys.key("queue"), "not a queue")
        return functools.partial(admin.delete, keys.key("queue"))
    await garble_floors(admin, keys)
    return functools.partial(admin.delete, keys.key("finished"))


@pytest.mark.parametrize("how", ["wrongtype", "script"])
async def test_a_lock_whose_withdrawals_keep_failing_holds_up_no_new_withdrawal(
    aredis: AsyncRedis, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """One lock's owed withdrawal keeps failing (its keys were overwritten, so
    every script on it fails with an error Redis replies with: WRONGTYPE, or
    a Lua error). Another lock's acquire then times out: its withdrawal goes
    at once, and its request has left the queue when ``LockTimeout`` comes.
    Before, the failure made the whole hub pause ``RETRY_AFTER_ERROR_S``
    between rounds, and a withdrawal owed in that pause waited for it, past
    the acquire's ``WITHDRAW_GRACE_S`` (found by outside attacks: requests
    still queued after their timeouts, the next hand-off 0.2 s late; then the
    same with a Lua error, taken for one about all of Redis)."""
    settings = {"lease_ms": 30_000, "poll_ms": 10_000}
    failing, healthy = (FifoLock(aredis, name, **settings) for name in ("keeps-failing", "fine"))
    leases = {lock.name: await lock.acquire(timeout=5) for lock in (failing, healthy)}
    doomed = asyncio.create_task(failing.acquire(token="doomed"))
    await until(functools.partial(_queued, aredis, failing.keys, "doomed"), "doomed queued")
    mend = await _corrupt(aredis, failing.keys, how)
    failed = asyncio.Event()  # set as a try of doomed's withdrawal fails
    withdraw = failing._protocol.withdraw

    async def watched(client: Any, keys: LockKeys, token: str, *args: Any) -> Any:
        try:
            return await withdraw(client, keys, token, *args)
        except Exception:
            if token == "doomed":
                failed.set()
            raise

    monkeypatch.setattr(failing._protocol, "withdraw", watched)  # the protocol is shared
    doomed.cancel()
    await asyncio.gather(doomed, return_exceptions=True)
    hub = hub_for(aredis)
    try:
        for attempt in range(3):
            failed.clear()
            await asyncio.wait_for(failed.wait(), 5)  # each give-up just after a failed try
            token = f"impatient-{attempt}"
            with pytest.raises(LockTimeout) as timed_out:
                await healthy.acquire(timeout=0.05, token=token)
            queued = await _queued(aredis, healthy.keys, token)
            assert not queued, (
                f"{token} was still queued when its acquire timed out ({timed_out.value}): its "
                "withdrawal waited behind the failing lock's"
            )
    finally:
        await mend()  # the failing lock's withdrawal lands now
        await until(lambda: not hub._withdrawals, "the failing lock's withdrawal landed")
        for lock in (failing, healthy):
            await lock.release(leases[lock.name])


async def test_a_new_withdrawal_costs_no_more_with_thousands_owed_on_a_failing_lock(
    aredis: AsyncRedis,
) -> None:
    """A new withdrawal wakes the withdrawer at once (the lock whose withdrawals
    fail waits on its own); each wake must cost what it did with one
    withdrawal owed there, not in proportion to the thousands owed (up to
    ``MAX_WITHDRAWALS``). Found by an outside attack: with 9,000 owed on a
    failing lock, each wake looked through all of them three times, about 4 ms
    of CPU, and 300 give-ups a second on a healthy lock kept a CPU busy."""
    settings = {"lease_ms": 60_000, "poll_ms": 30_000}
    failing, healthy = (FifoLock(aredis, name, **settings) for name in ("owes-many", "healthy"))
    leases = [await lock.acquire(timeout=5) for lock in (failing, healthy)]
    owed = 5_000
    doomed = [asyncio.create_task(failing.acquire(token=f"d{n}")) for n in range(owed + 1)]

    async def all_queued() -> bool:
        return bool(await aredis.zcard(failing.keys.key("queue")) == owed + 1)

    await until(all_queued, f"{owed + 1} queued", timeout_s=30)
    await aredis.delete(failing.keys.key("queue"))
    await aredis.set(failing.keys.key("queue"), "not a queue")  # its scripts fail
    hub = hub_for(aredis)

    async def give_ups() -> float:
        started = time.process_time()
        for n in range(200):
            with contextlib.suppress(LockTimeout):
                await healthy.acquire(timeout=0, token=f"give-up-{n}")
        return time.process_time() - started

    try:
        doomed[0].cancel()
        await until(lambda: len(hub._withdrawals) == 1, "one withdrawal owed")
        one = await give_ups()
        for task in doomed[1:]:
            task.cancel()
        await asyncio.gather(*doomed, return_exceptions=True)
        await until(lambda: len(hub._withdrawals) == owed + 1, f"{owed + 1} withdrawals owed")
        many = await give_ups()
        assert many < 2.5 * one, (
            f"200 give-ups took {many:.2f} s of CPU with {owed + 1} withdrawals owed on a "
            f"failing lock, {one:.2f} s with one"
        )
    finally:
        await aredis.delete(failing.keys.key("queue"))  # its withdrawals land now
        await until(lambda: not hub._withdrawals, "the failing lock's withdrawals landed", 30)
        for lock, lease in zip((failing, healthy), leases, strict=True):
            await lock.release(lease)


@pytest.mark.parametrize("steps", range(4))
def test_the_loop_closes_as_a_new_withdrawal_wakes_the_withdrawer(
    redis_url: str, steps: int
) -> None:
    """While one lock's withdrawal keeps failing, the withdrawer waits for the
    next try or a new withdrawal. ``asyncio.run`` ends ``steps`` loop steps
    after a new one woke it: its cancellation must end the withdrawer, and
    ``asyncio.run`` return within its closing bound. Found by an outside
    attack: on Python 3.10 and 3.11, ``asyncio.wait_for`` lost a cancellation
    that came after the event it waited for was set, and the withdrawer went
    on trying the failing withdrawal for ever; ``asyncio.run`` never returned,
    and the process renewed its leases for as long as it lived."""
    returned = threading.Event()

    async def main() -> None:
        client = AsyncRedis.from_url(redis_url)
        settings = {"lease_ms": 30_000, "poll_ms": 10_000}
        failing, healthy = (
            FifoLock(client, f"closing-{steps}-{name}", **settings) for name in ("bad", "fine")
        )
        leases = [await lock.acquire(timeout=5) for lock in (failing, healthy)]
        doomed = asyncio.create_task(failing.acquire(token="doomed"))
        await until(functools.partial(_queued, client, failing.keys, "doomed"), "doomed queued")
        await client.delete(failing.keys.key("queue"))
        await client.set(failing.keys.key("queue"), "not a queue")  # its scripts fail
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)
        hub = hub_for(client)
        await until(
            lambda: any(withdrawal.failures for withdrawal in hub._withdrawals.values()),
            "the failing lock's withdrawal failed once",
        )
        waiting = asyncio.create_task(healthy.acquire(token="waiting"))
        await until(functools.partial(_queued, client, healthy.keys, "waiting"), "waiting queued")
        waiting.cancel()
        # One loop step at a time, not Event.wait(): the steps count from the set.
        while not hub._owed_anew.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0)
        for _ in range(steps):
            await asyncio.sleep(0)
        held.extend(leases)  # kept to the end: released by hand, not from GC

    held: list[Lease] = []

    def run() -> None:
        asyncio.run(main())
        returned.set()

    thread = threading.Thread(target=run, daemon=True)  # left behind if it hangs
    started = time.monotonic()
    thread.start()
    bound = 2 * CLOSING_S + 5.0
    thread.join(bound)
    assert returned.is_set(), (
        f"asyncio.run had not returned {time.monotonic() - started:.1f} s after it started "
        f"(bound {bound:g} s): the withdrawer did not end on the loop's cancellation"
    )


async def test_after_an_outage_the_oldest_withdrawal_of_every_lock_goes_first(
    redis_url: str, aredis: AsyncRedis, fault_proxy: FaultProxyFactory
) -> None:
    """When Redis answers again, 64 locks owe a withdrawal each that keeps
    failing, one lock owes 1,000 that land, and the lock that owes the oldest
    withdrawal, heading its queue with a live waiter behind it, is probed
    last (the round's cursor points past it). Its waiter gets the lock at once:
    each lock's oldest withdrawal is sent before any lock's others, and an
    error Redis replies with ends the probing. Found by a second outside
    attack: the live waiter waited 5.6 s behind 80 failing locks (8 probed a
    round), or 1.7 s behind another lock's 3,000 withdrawals."""
    proxy = fault_proxy(redis_url)
    client = AsyncRedis.from_url(proxy.url, **no_retries())
    settings = {"lease_ms": 30_000, "poll_ms": 1000}
    names = ["heads", "many", *(f"failing-{n}" for n in range(64))]
    locks = {name: FifoLock(client, name, **settings) for name in names}
    holders = {name: FifoLock(aredis, name, **settings) for name in names}
    for lock in locks.values():
        await warm_up(lock)
    leases = {name: await holder.acquire(timeout=5) for name, holder in holders.items()}
    given_up = [asyncio.create_task(locks["heads"].acquire(timeout=60, token="h0"))]
    await until(lambda: _queued(aredis, locks["heads"].keys, "h0"), "h0 queued")
    next_waiter = asyncio.create_task(holders["heads"].acquire(timeout=30, token="next"))
    await until(lambda: _queued(aredis, locks["heads"].keys, "next"), "next queued behind h0")
    given_up += [
        asyncio.create_task(locks[name].acquire(timeout=60, token=f"{name}-0"))
        for name in names[2:]
    ]
    given_up += [
        asyncio.create_task(locks["many"].acquire(timeout=60, token=f"m{n}")) for n in range(1000)
    ]
    hub = hub_for(client)

    async def all_queued() -> bool:
        counts = [await aredis.zcard(lock.keys.key("queue")) for lock in locks.values()]
        return counts == [2, 1000] + [1] * 64

    await until(all_queued, "every request queued")
    proxy.max_connections = 0
    proxy.reset()
    for task in given_up:
        task.cancel()
    await asyncio.gather(*given_up, return_exceptions=True)
    await until(lambda: len(hub._withdrawals) == 1065, "every withdrawal owed")
    for name in names[2:]:
        await aredis.delete(locks[name].keys.key("queue"))
        await aredis.set(locks[name].keys.key("queue"), "not a queue")  # its scripts fail
    hub._withdraw_from = 1  # the next round probes the failing locks first, "heads" last
    proxy.max_connections = 256
    ended = time.monotonic()
    await holders["heads"].release(leases["heads"])
    lease_next = await asyncio.wait_for(next_waiter, 20)
    took = time.monotonic() - ended
    many_owed = sum(key[0] == locks["many"].keys for key in hub._withdrawals)
    try:
        assert took < 2 * RETRY_AFTER_ERROR_S, (
            f"next got the lock {took:.2f} s after the outage ended: h0's withdrawal, the "
            "oldest, waited behind the failing locks' probes"
        )
        assert many_owed >= 500, (
            f"only {many_owed} of the other lock's 999 later withdrawals were still owed when "
            "next got the lock: they were sent before h0's"
        )
    finally:
        await holders["heads"].release(lease_next)
        for name in names[2:]:
            await aredis.delete(locks[name].keys.key("queue"))  # their withdrawals land now
        await until(lambda: not hub._withdrawals, "every withdrawal landed")
        for name in names[1:]:
            await holders[name].release(leases[name])
        await client.aclose()


@pytest.mark.parametrize("refusal", ["NOREPLICAS", "OOM"])
async def test_withdrawals_refused_by_an_error_about_all_of_redis_are_tried_at_a_bounded_rate(
    fresh_redis_server: PrivateRedisFactory, refusal: str
) -> None:
    """Redis replies to every withdrawal with an error about Redis as a whole
    (here ``NOREPLICAS`` or ``OOM``; after a failover ``READONLY``, or
    ``BUSY``, ``CLUSTERDOWN``), which every lock meets alike: it is an outage,
    and a round probes a few locks, not every lock's oldest withdrawal. Found
    by outside attacks: such a reply ended the probing as one about a lock's
    own keys does, and 1,000 locks cost Redis 3,167 commands a second; then
    the same for ``OOM`` and ``READONLY``, which redis-py raises as
    subclasses with the code cut off, met inside a script."""
    server = fresh_redis_server()
    admin = AsyncRedis.from_url(server.url)
    client = AsyncRedis.from_url(server.url, **no_retries())
    settings = {"lease_ms": 30_000, "poll_ms": 1000}
    names = [f"refused-{n}" for n in range(100)]
    locks = [FifoLock(client, name, **settings) for name in names]
    holders = [FifoLock(admin, name, **settings) for name in names]
    await warm_up(locks[0])
    leases = [await holder.acquire(timeout=5) for holder in holders]
    given_up = [asyncio.create_task(lock.acquire(timeout=60, token="w")) for lock in locks]
    for lock in locks:
        await until(functools.partial(_queued, admin, lock.keys, "w"), f"{lock.name} queued")
    refuse, accept = {
        "NOREPLICAS": (("min-replicas-to-write", 1), ("min-replicas-to-write", 0)),
        "OOM": (("maxmemory", 1), ("maxmemory", 0)),  # with noeviction, the default
    }[refusal]
    await admin.config_set(*refuse)  # every write refused
    hub = hub_for(client)
    try:
        for task in given_up:
            task.cancel()
        await asyncio.gather(*given_up, return_exceptions=True)
        await until(lambda: len(hub._withdrawals) == len(locks), "every withdrawal owed")
        tried = sum(w.failures for w in hub._withdrawals.values())
        window_s = 4 * RETRY_AFTER_ERROR_S
        await asyncio.sleep(window_s)  # a measurement window, not a synchronisation
        tried = sum(w.failures for w in hub._withdrawals.values()) - tried
        bound = (window_s / RETRY_AFTER_ERROR_S + 1) * WITHDRAW_PROBES_PER_ROUND
        assert tried <= bound, (
            f"{tried} withdrawals sent in {window_s:g} s while Redis refused every write, for "
            f"{len(locks)} locks (bound {bound:g}): each round tried every lock"
        )
    finally:
        await admin.config_set(*accept)
    await until(lambda: not hub._withdrawals, "every withdrawal landed once Redis accepts writes")
    for holder, lease in zip(holders, leases, strict=True):
        with contextlib.suppress(LockError):
            await holder.release(lease)
    await client.aclose()
    await admin.aclose()


# --- a client dropped while the lock still owes Redis a withdrawal -------------------------


async def test_a_client_dropped_while_a_withdrawal_is_owed_ends_the_withdrawals_quietly(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request given up while Redis is silent is withdrawn as soon as Redis
    answers, by a task of the client's hub. If the caller closes and drops the
    client first, nothing can be sent any more: that task ends, saying so,
    rather than dying with "the Redis client of this hub was garbage-collected"
    (which asyncio reports as "Task exception was never retrieved")."""
    proxy = fault_proxy(redis_url)
    holder = FifoLock(aredis, "dropped", lease_ms=7000, poll_ms=1000)
    lease = await holder.acquire(timeout=5)
    client = AsyncRedis.from_url(proxy.url, **no_retries())
    lock = FifoLock(client, "dropped", lease_ms=7000, poll_ms=1000)
    await lock.status()  # scripts loaded, the connection open
    proxy.hold("up")
    proxy.hold("down")
    with pytest.raises(LockTimeout):
        await lock.acquire(timeout=1, token="owed")
    withdrawer = hub_for(client)._withdrawer  # retrying while Redis is silent
    assert withdrawer is not None and not withdrawer.done()
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    caplog.clear()  # the records so far hold the client, through their errors' tracebacks
    await client.aclose()
    dropped = weakref.ref(client)
    del lock, client
    # Collected once the withdrawal on its way (into the silence) gives up.
    await until(lambda: gc.collect() >= 0 and dropped() is None, "the client collected")
    await asyncio.wait({withdrawer}, timeout=5)
    proxy.release("up", deliver=False)
    proxy.release("down", deliver=False)
    await holder.release(lease)
    assert withdrawer.done(), "the withdrawals of a dropped client were retried for ever"
    assert withdrawer.exception() is None, withdrawer.exception()
    assert any("client was dropped" in r.getMessage() for r in caplog.records), caplog.text


async def test_withdrawals_waiting_for_a_call_slot_when_their_client_is_dropped_end_quietly(
    aredis: AsyncRedis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As above, but the withdrawals wait for a call slot when the client goes
    (both slots are taken here; 20,000 withdrawals queue so behind two). Once a
    slot is free, they find no client: they end, saying so, rather than each
    dying with "the Redis client of this hub was garbage-collected" (seen
    after the 20,000 waiters of test_renewal_priority)."""
    holder = FifoLock(aredis, "dropped", lease_ms=7000, poll_ms=1000)
    lease = await holder.acquire(timeout=5)
    client = AsyncRedis.from_url(redis_url)
    lock = FifoLock(client, "dropped", lease_ms=7000, poll_ms=1000)
    tokens = [f"owed-{n}" for n in range(MAX_CONCURRENT_CALLS + 2)]
    waiters = [asyncio.create_task(lock.acquire(timeout=1, token=token)) for token in tokens]
    for token in tokens:
        await until(functools.partial(_queued, aredis, holder.keys, token), f"{token} queued")
    hub = hub_for(client)
    slots = hub.calls
    for _ in range(MAX_CONCURRENT_CALLS):
        await slots.acquire()
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(o, LockTimeout) for o in outcomes), outcomes
    assert len(hub._withdrawals) == len(tokens)
    withdrawer = hub._withdrawer
    assert withdrawer is not None and not withdrawer.done()
    loop_errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: loop_errors.append(context))
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    caplog.clear()  # the records so far hold the client, through their errors' tracebacks
    await client.aclose()
    dropped = weakref.ref(client)
    del lock, client, waiters, outcomes, hub  # the outcomes' tracebacks hold the client
    await until(lambda: gc.collect() >= 0 and dropped() is None, "the client collected")
    for _ in range(MAX_CONCURRENT_CALLS):
        slots.release()
    await asyncio.wait({withdrawer}, timeout=5)
    await holder.release(lease)
    gc.collect()  # a task whose exception nobody read is reported when collected
    assert withdrawer.done(), "the withdrawals of a dropped client were retried for ever"
    assert withdrawer.exception() is None, withdrawer.exception()
    assert loop_errors == []
    assert any("client was dropped" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_withdrawal_whose_call_failed_unexpectedly_is_sent_again(
    aredis: AsyncRedis,
    redis_url: str,
    clients: Callable[..., AsyncRedis],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A withdrawal's call fails with an error that is neither an outage nor
    Redis's answer: here an ``AttributeError``, as redis-py raises when a client
    is closed while it writes (its writer gone). Before, that error ended the task
    sending the owed withdrawals (found by an outside attack, from the code):
    the cancelled waiter stayed queued, and the next holder waited for it to be
    granted and expire. It is now counted as a failed try, and tried again; and,
    being a bug somewhere, said loudly once, with its traceback (an outside
    attack saw a persistent one retried for ever with one WARNING and no
    traceback)."""
    holder = FifoLock(aredis, "withdraw-error", lease_ms=7000, poll_ms=1000)
    client = clients(redis_url)
    lock = FifoLock(client, holder.name, lease_ms=7000, poll_ms=1000)
    await warm_up(lock)
    lease = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(lock.acquire(timeout=30, token="gone"))
    await until(functools.partial(_queued, aredis, holder.keys, "gone"), "gone queued")
    failures = 0
    withdraw = lock._protocol.withdraw

    def failing_once(*args: Any) -> Any:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise AttributeError("'NoneType' object has no attribute 'write'")
        return withdraw(*args)

    monkeypatch.setattr(lock._protocol, "withdraw", failing_once)  # the protocol is shared
    caplog.set_level(logging.WARNING, logger="redis_fifo_lock")
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert failures == 1
    withdrawer = hub_for(client)._withdrawer
    assert withdrawer is not None

    async def withdrawn() -> bool:
        return not await _queued(aredis, holder.keys, "gone")

    try:
        await until(withdrawn, "the cancelled waiter withdrawn", 4 * RETRY_AFTER_ERROR_S + 2)
    finally:
        await holder.release(lease)
    assert not withdrawer.done() or withdrawer.exception() is None, withdrawer.exception()
    said = [
        record
        for record in caplog.records
        if record.levelno >= logging.ERROR
        and record.exc_info is not None
        and isinstance(record.exc_info[1], AttributeError)
    ]
    assert len(said) == 1, caplog.text


async def test_polls_whose_waiters_left_while_they_waited_for_a_call_slot_are_not_sent(
    aredis: AsyncRedis,
    redis_url: str,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a connection reset every waiting group catches up with a poll, and
    the polls queue for the hub's call slots. When the waiters are cancelled
    meanwhile, those polls have nobody to poll for. Before, each was sent all
    the same: 2,000 of them (10 ms replies) held a free lock's acquire past its
    5 s timeout, behind them (found by an outside attack). Here 400 polls
    (replies 20 ms late) held it about 4 s."""
    count = 400
    proxy = fault_proxy(redis_url)
    client = clients(proxy.url)
    settings = {"lease_ms": 30_000, "poll_ms": 10_000}
    locks = [FifoLock(client, f"backlog-{n}", **settings) for n in range(count)]
    holders = [FifoLock(aredis, lock.name, **settings) for lock in locks]
    leases = [await holder.acquire(timeout=5) for holder in holders]
    waiters = [asyncio.create_task(lock.acquire(timeout=60)) for lock in locks]
    for lock in locks:
        await until(functools.partial(aredis.zcard, lock.keys.key("queue")), f"{lock.name} queued")
    free = FifoLock(client, "backlog-free", **settings)
    await warm_up(free)
    caught_up: list[object] = []
    catch_up = WaitGroup.catch_up

    def counted(group: WaitGroup) -> None:
        caught_up.append(group)
        catch_up(group)

    monkeypatch.setattr(WaitGroup, "catch_up", counted)
    proxy.delay("down", 20)
    proxy.reset()  # Redis stays up; the doorbell subscribes again, every group polls
    await until(lambda: len(caught_up) >= count, "every group catching up", 20)
    slots = hub_for(client).calls
    await until(lambda: len(slots._waiters or ()) >= count // 2, "the polls queued for a slot")
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    started = time.monotonic()
    lease = await free.acquire(timeout=30)
    took_s = time.monotonic() - started
    await free.release(lease)
    proxy.delay("down", 0)
    for holder, held in zip(holders, leases, strict=True):
        await holder.release(held)
    assert took_s < 1.5, (
        f"a free lock's acquire took {took_s:.2f} s behind the polls of groups whose "
        "waiters had left"
    )


async def _out_of_reach_while_waiting(
    redis_url: str,
    aredis: AsyncRedis,
    proxy: FaultProxy,
    clients: Callable[..., AsyncRedis],
    timeout: float | None,
) -> tuple[BaseException | None, float]:
    """A request queued behind a holder, then every connection of its process
    to Redis refused: what its ``acquire(timeout)`` ended with (None: still
    waiting 10 s later) and after how long."""
    settings = {"lease_ms": 1500, "poll_ms": 300}
    lock = FifoLock(clients(proxy.url, **no_retries()), "out-of-reach", **settings)
    holder = FifoLock(clients(redis_url), "out-of-reach", **settings)
    await warm_up(lock)
    lease = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(lock.acquire(timeout, token="untimed"))
    await until(lambda: _queued(aredis, lock.keys, "untimed"), "queued")
    proxy.max_connections = 0
    proxy.reset()
    started = time.monotonic()
    done, _ = await asyncio.wait({waiting}, timeout=10)
    took = time.monotonic() - started
    proxy.max_connections = 256
    if not done:
        waiting.cancel()
    ended = waiting.exception() if done else None
    await holder.release(lease)
    await until(lambda: _gone(aredis, lock.keys, "untimed"), "withdrawn", 10)
    return ended, took


async def _gone(admin: AsyncRedis, keys: LockKeys, token: str) -> bool:
    return not await _queued(admin, keys, token)


async def test_an_untimed_waiter_raises_once_redis_was_out_of_reach_for_a_lease(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
) -> None:
    """Before, it waited as long as the outage lasted (an untimed Django view or
    Celery task held its thread for good), while the request's place was lost
    once its process could not poll for a lease."""
    ended, took = await _out_of_reach_while_waiting(
        redis_url, aredis, fault_proxy(redis_url), clients, None
    )
    assert isinstance(ended, RedisUnavailable), f"still waiting {took:.1f} s into the outage"
    assert "lease_ms" in str(ended) and "out-of-reach" in str(ended)
    # lease_ms counts from the last answered poll: up to poll_ms before the outage.
    assert (1.5 - 0.3) * 0.9 <= took < 5, f"gave up after {took:.2f} s (lease_ms 1500)"


async def test_a_timed_waiter_keeps_its_timeout_while_redis_is_out_of_reach(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
) -> None:
    ended, took = await _out_of_reach_while_waiting(
        redis_url, aredis, fault_proxy(redis_url), clients, 4.0
    )
    assert isinstance(ended, LockTimeout)
    assert took >= 3.5


def _never_out_of_reach(self: WaitGroup, failure: RedisUnavailable) -> None:
    """MUTANT outage-waits-forever: failed polls never tell the waiters, so an
    untimed acquire waits as long as the outage lasts (the bug before this
    test)."""


async def test_an_untimed_waiter_out_of_reach_kills_outage_waits_forever(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(WaitGroup, "_unreachable", _never_out_of_reach)
    ended, _ = await _out_of_reach_while_waiting(
        redis_url, aredis, fault_proxy(redis_url), clients, None
    )
    assert ended is None, "outage-waits-forever passed"


async def test_a_waiter_queued_after_a_long_outage_keeps_its_place_through_a_short_one(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
) -> None:
    """helper-32: the group dated its outage from its first failed poll, and
    only a poll answered ended it. A request queued once Redis was back (its
    acquire refreshed the session's liveness) gave up at the first failed
    poll of the next blip, 0.36 s in, though its place was safe."""
    settings = {"lease_ms": 1500, "poll_ms": 300}
    proxy = fault_proxy(redis_url)
    lock = FifoLock(clients(proxy.url, **no_retries()), "blips", **settings)
    holder = FifoLock(clients(redis_url), "blips", **settings)
    await warm_up(lock)
    lease = await holder.acquire(timeout=5)
    timed = asyncio.create_task(lock.acquire(60, token="timed"))
    await until(lambda: _queued(aredis, lock.keys, "timed"), "timed queued")
    group = next(iter(hub_for(lock.client).groups.values()))
    proxy.max_connections = 0  # a long outage, which the timed waiter waits through
    proxy.reset()
    await until(lambda: group.waiters["timed"].out_of_reach is not None, "out of reach", 10)
    proxy.max_connections = 256
    untimed = asyncio.create_task(lock.acquire(token="untimed"))
    await until(lambda: _queued(aredis, lock.keys, "untimed"), "untimed queued")
    proxy.max_connections = 0  # a short blip, at once
    proxy.reset()
    done, _ = await asyncio.wait({untimed}, timeout=1.0)  # under lease_ms
    proxy.max_connections = 256
    ended = untimed.exception() if done else None
    for task in (timed, untimed):
        task.cancel()
    await asyncio.gather(timed, untimed, return_exceptions=True)
    await holder.release(lease)
    assert not done, f"the untimed waiter gave up {ended!r} in a blip shorter than lease_ms"


async def _alive_until_ms(admin: AsyncRedis, keys: LockKeys, token: str) -> int:
    """Until when (server ms) Redis keeps the session of ``token``'s request alive."""
    waiter = await admin.hget(keys.key("waiters"), token)
    session = waiter.split()[0]
    return int(await admin.zscore(keys.key("alive"), session))


async def _server_ms(admin: AsyncRedis) -> int:
    seconds, micros = await admin.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _late_give_up_ms(
    redis_url: str,
    aredis: AsyncRedis,
    proxy: FaultProxy,
    clients: Callable[..., AsyncRedis],
) -> tuple[int, int]:
    """An untimed waiter whose process is cut off late in a poll interval: how
    long (ms, server clock) after Redis dropped its place it gave up, and how
    long after its last poll the outage began (the polls' own interval is
    measured first: it differs between stacks)."""
    lease_ms = 4000
    lock = FifoLock(
        clients(proxy.url, **no_retries()), "poll-phase", lease_ms=lease_ms, poll_ms=2000
    )
    # A long lease for the holder: the waiter polls every poll_ms, not when the
    # holder's lease is due to run out.
    holder = FifoLock(clients(redis_url), "poll-phase", lease_ms=30_000, poll_ms=2000)
    await warm_up(lock)
    lease = await holder.acquire(timeout=5)
    untimed = asyncio.create_task(lock.acquire(token="untimed"))
    await until(lambda: _queued(aredis, lock.keys, "untimed"), "untimed queued")
    refreshes = [await _alive_until_ms(aredis, lock.keys, "untimed")]
    for _ in range(2):

        async def polled() -> bool:
            return await _alive_until_ms(aredis, lock.keys, "untimed") != refreshes[-1]

        await until(polled, "a poll refreshed the session", 10)
        refreshes.append(await _alive_until_ms(aredis, lock.keys, "untimed"))
    interval_ms = refreshes[-1] - refreshes[-2]
    if interval_ms < 1500:
        # Seen with redis-py 5 on Python 3.10, whose doorbell on a client with a
        # short socket_timeout catches up (and polls) every half second.
        await holder.release(lease)
        untimed.cancel()
        await asyncio.gather(untimed, return_exceptions=True)
        pytest.skip(f"polls came {interval_ms} ms apart: no outage can start late enough")
    await asyncio.sleep(interval_ms * 0.85 / 1000)  # late in the poll interval, by design
    alive_until = await _alive_until_ms(aredis, lock.keys, "untimed")
    assert alive_until == refreshes[-1], "a poll came early: the phase is not late"
    proxy.max_connections = 0
    proxy.reset()
    phase_ms = await _server_ms(aredis) - (alive_until - lease_ms)
    done, _ = await asyncio.wait({untimed}, timeout=10)
    gave_up = await _server_ms(aredis)
    proxy.max_connections = 256
    await holder.release(lease)
    if not done:
        untimed.cancel()
    await asyncio.gather(untimed, return_exceptions=True)
    assert done and isinstance(untimed.exception(), RedisUnavailable), untimed
    return gave_up - alive_until, phase_ms


async def test_an_untimed_waiter_gives_up_when_redis_drops_its_place_not_a_poll_later(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
) -> None:
    """helper-34: Redis keeps a waiting process's requests for lease_ms from its
    last answered poll, which may come up to poll_ms before an outage; the
    group counted lease_ms from its first failed poll. An untimed waiter cut
    off just before its next poll was due gave up about a poll interval after
    Redis had dropped its place (and a shorter outage lost the place while
    the docs said it cost nothing)."""
    late_ms, phase_ms = await _late_give_up_ms(redis_url, aredis, fault_proxy(redis_url), clients)
    assert -100 <= late_ms < phase_ms - 300, (
        f"gave up {late_ms} ms after Redis dropped its place (outage {phase_ms} ms "
        "after the last poll)"
    )


def _from_the_first_failure(self: WaitGroup, failure: RedisUnavailable) -> None:
    """MUTANT liveness-from-first-failure: lease_ms is counted from the first
    failed poll, not from the last answered one (the bug before the test
    above)."""
    first = self.__dict__.setdefault("_first_failure", time.monotonic())
    if time.monotonic() - first < self.settings.lease_ms / 1000:
        return
    for waiter in self.waiters.values():
        if waiter.out_of_reach is None:
            waiter.out_of_reach = failure
            waiter.hint()


async def test_a_give_up_dated_by_the_last_answer_kills_liveness_from_first_failure(
    redis_url: str,
    aredis: AsyncRedis,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(WaitGroup, "_unreachable", _from_the_first_failure)
    late_ms, phase_ms = await _late_give_up_ms(redis_url, aredis, fault_proxy(redis_url), clients)
    assert late_ms >= phase_ms - 100, "liveness-from-first-failure passed"


# --- a lease lost while held, released while Redis is out of reach ----------------------


async def _cut_off_until_lost(
    redis_url: str,
    proxy: FaultProxy,
    clients: Callable[..., AsyncRedis],
    lease: Lease,
    how: str = "refused",
) -> Lease:
    """Cut the holder's process off from Redis (its connections ``"refused"``, or
    every byte held back: ``"silent"``) until its lease is lost by its own
    clock, then let another process take the lock (the block has overlapped
    another holder's); returns that holder's lease."""
    if how == "silent":
        proxy.hold("up")
        proxy.hold("down")
    else:
        proxy.max_connections = 0
        proxy.reset()
    await until(lambda: lease.lost, "the lease given up for lost", 10)
    other = FifoLock(clients(redis_url), lease.name, lease_ms=1000, poll_ms=300)
    return await other.acquire(timeout=10)


def _lost_lock(
    proxy: FaultProxy, clients: Callable[..., AsyncRedis], how: str = "refused"
) -> FifoLock:
    """A lock whose client reaches Redis through ``proxy``: with no retries, and
    with no socket timeout when Redis is to fall ``"silent"`` (the lock's own
    bounds then end its calls)."""
    options = no_retries() | ({"socket_timeout": None} if how == "silent" else {})
    return FifoLock(clients(proxy.url, **options), "lost-out-of-reach", lease_ms=1000, poll_ms=300)


async def test_a_lease_lost_while_held_raises_lease_lost_at_a_release_that_cannot_reach_redis(
    redis_url: str, fault_proxy: FaultProxyFactory, clients: Callable[..., AsyncRedis]
) -> None:
    """Before, the release said ``RedisUnavailable``: "the lease expires by itself
    within lease_ms", when it had expired already and another holder was in."""
    proxy = fault_proxy(redis_url)
    lock = _lost_lock(proxy, clients)
    await warm_up(lock)
    lease = await lock.acquire(timeout=5)
    other = await _cut_off_until_lost(redis_url, proxy, clients, lease)

    with pytest.raises(LeaseLost) as lost:
        await lock.release(lease)
    assert lost.value.fence == lease.fence < other.fence
    assert "overlapped" in str(lost.value) and "lost-out-of-reach" in str(lost.value)
    assert isinstance(lost.value.__cause__, RedisUnavailable)


@pytest.mark.parametrize("how", ["refused", "silent"])
async def test_a_hold_whose_lease_was_lost_raises_lease_lost_though_its_release_cannot_reach_redis(
    redis_url: str, fault_proxy: FaultProxyFactory, clients: Callable[..., AsyncRedis], how: str
) -> None:
    proxy = fault_proxy(redis_url)
    lock = _lost_lock(proxy, clients, how)
    await warm_up(lock)
    with pytest.raises(LeaseLost, match="overlapped"):
        async with lock.hold(timeout=5) as lease:
            await _cut_off_until_lost(redis_url, proxy, clients, lease, how)


def _outage_hides_the_loss(self: Lease, failure: RedisUnavailable) -> LeaseLost | None:
    """MUTANT loss-hidden-by-outage: a release that cannot reach Redis always
    says so, whether or not the lease had been lost while held (the bug before
    these tests)."""
    return None


async def test_a_lease_lost_while_held_kills_loss_hidden_by_outage(
    redis_url: str,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Lease, "unreleased", _outage_hides_the_loss)
    proxy = fault_proxy(redis_url)
    lock = _lost_lock(proxy, clients)
    await warm_up(lock)
    lease = await lock.acquire(timeout=5)
    await _cut_off_until_lost(redis_url, proxy, clients, lease)
    with pytest.raises(RedisUnavailable):
        await lock.release(lease)


async def test_a_lease_that_ran_out_only_after_its_release_was_asked_is_not_called_lost(
    redis_url: str, fault_proxy: FaultProxyFactory, clients: Callable[..., AsyncRedis]
) -> None:
    """The block ended in time; that the release could not say so before the
    lease ran out is an outage, not an overlap during the hold."""
    proxy = fault_proxy(redis_url)
    lock = _lost_lock(proxy, clients)
    await warm_up(lock)
    lease = await lock.acquire(timeout=5)
    proxy.max_connections = 0
    proxy.reset()
    with pytest.raises(RedisUnavailable):
        await lock.release(lease)
    await until(lambda: lease.lost, "the lease run out", 10)
    with pytest.raises(RedisUnavailable) as again:
        await lock.release(lease)
    assert not isinstance(again.value, LeaseLost)


async def _cancelled_lost_hold(
    redis_url: str, fault_proxy: FaultProxyFactory, clients: Callable[..., AsyncRedis]
) -> object:
    """A hold whose lease was lost (Redis silent), its block then cancelled: the
    ``fifolock_release_error`` its CancelledError carries."""
    proxy = fault_proxy(redis_url)
    lock = _lost_lock(proxy, clients, "silent")
    await warm_up(lock)
    inside = asyncio.Event()
    seen: list[object] = []

    async def body() -> None:
        try:
            async with lock.hold(timeout=5) as lease:
                await _cut_off_until_lost(redis_url, proxy, clients, lease, "silent")
                inside.set()
                await asyncio.Event().wait()  # cancelled here
        except asyncio.CancelledError as cancelled:
            # Read here: on Python 3.10 awaiting the task raises a new
            # CancelledError, not the one the block's exit carried out.
            seen.append(getattr(cancelled, "fifolock_release_error", None))
            raise

    task = asyncio.create_task(body())
    await asyncio.wait_for(inside.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return seen[0]


async def test_a_cancelled_hold_whose_lease_was_lost_carries_lease_lost(
    redis_url: str, fault_proxy: FaultProxyFactory, clients: Callable[..., AsyncRedis]
) -> None:
    """helper-38: the cancelled block waits for the release's first try at most
    RELEASE_TRY_S, as long as that try waits on a silent server: the block's
    CancelledError came back with no fifolock_release_error, and the LeaseLost
    was only logged, though the loss was known before anything was sent."""
    failure = await _cancelled_lost_hold(redis_url, fault_proxy, clients)
    assert isinstance(failure, LeaseLost), failure


async def _cancelled_without_the_loss(name: str, lease: Lease, release: asyncio.Task[None]) -> None:
    """MUTANT cancelled-loss-unsaid: a cancelled hold waits for the release's
    first try, and says nothing of a loss it knew (the bug before the test
    above)."""
    done, _ = await asyncio.wait({release}, timeout=holding.RELEASE_TRY_S)
    if done:
        release.result()
        return
    holding.keep_releasing(name, release)


async def test_a_cancelled_lost_hold_kills_cancelled_loss_unsaid(
    redis_url: str,
    fault_proxy: FaultProxyFactory,
    clients: Callable[..., AsyncRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lock_module, "release_when_cancelled", _cancelled_without_the_loss)
    failure = await _cancelled_lost_hold(redis_url, fault_proxy, clients)
    assert failure is None, "cancelled-loss-unsaid passed"


_WRITELINES_AS_IN_3_13_0 = """
def writelines(self, list_of_data):
    if self._conn_lost:
        RAISED.append(True)
        # Python 3.12 and 3.13 before CPython gh-136234: the loop the lost
        # connection dropped is used to wait for the socket to be writable.
        raise AttributeError("'NoneType' object has no attribute '_add_writer'")
    self.write(b"".join(list_of_data))
"""


def _writelines_as_in_3_13_0(raised: list[bool]) -> Callable[..., None]:
    """``_SelectorSocketTransport.writelines`` as Python 3.12 and 3.13 had it
    before CPython gh-136234 fixed it, for a connection already lost: an
    ``AttributeError`` raised inside asyncio (compiled as asyncio's own code,
    so that its traceback ends there, as the real one does). Each time it
    raises is recorded in ``raised``."""
    namespace: dict[str, Any] = {"RAISED": raised}
    exec(compile(_WRITELINES_AS_IN_3_13_0, selector_events.__file__, "exec"), namespace)
    return namespace["writelines"]  # type: ignore[no-any-return]


async def _release_on_a_lost_connection(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, name: str
) -> BaseException | None:
    """Acquire through ``proxy``, reset the connection, let asyncio see the
    loss, then release: what the release raised."""
    if not isinstance(asyncio.get_running_loop(), selector_events.BaseSelectorEventLoop):
        pytest.skip("asyncio's selector transport only (uvloop: tests/test_uvloop.py)")
    raised: list[bool] = []
    monkeypatch.setattr(
        selector_events._SelectorSocketTransport, "writelines", _writelines_as_in_3_13_0(raised)
    )
    client = AsyncRedis.from_url(proxy.url)
    lock = FifoLock(client, name, lease_ms=5000, poll_ms=1000)
    try:
        lease = await lock.acquire(timeout=5)
        proxy.reset()

        def lost() -> bool:
            pool = client.connection_pool
            return all(
                connection._writer is not None and connection._writer.transport.is_closing()
                for connection in pool._available_connections  # type: ignore[attr-defined]
            )

        await until(lost, "asyncio saw the connection lost", pause_s=0.01)
        try:
            await lock.release(lease)
        except BaseException as exc:  # what it raised is the result
            return exc
        if not raised:
            # redis-py 5.0 on Python 3.10 wrote before asyncio marked the
            # connection lost: the premise (a write on a known-lost one) failed.
            pytest.skip("no write met a connection asyncio already knew lost")
        return None
    finally:
        await client.aclose()


async def test_a_write_asyncio_fails_on_a_lost_connection_is_an_outage(
    fault_proxy: FaultProxyFactory, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Python 3.12 and 3.13 before CPython gh-136234, redis-py's write on a
    connection asyncio already knew lost raised ``AttributeError`` (or
    ``TypeError``) from inside asyncio: a sync ``hold()``'s release escaped
    with it instead of retrying (seen on 3.13.0, in
    ``test_sync.py::test_a_hold_interrupted_while_its_release_retries_still_releases``)."""
    raised = await _release_on_a_lost_connection(
        fault_proxy(redis_url), monkeypatch, "lost-in-write"
    )
    assert isinstance(raised, RedisUnavailable), repr(raised)
    assert "connection was lost" in str(raised) and "lost-in-write" in str(raised)


async def test_a_lost_write_kills_transport_error_escapes(
    fault_proxy: FaultProxyFactory, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol_module, "lost_in_transport", _never_lost)
    raised = await _release_on_a_lost_connection(
        fault_proxy(redis_url), monkeypatch, "lost-in-write-mutant"
    )
    assert isinstance(raised, AttributeError), f"transport-error-escapes passed: {raised!r}"


def _never_lost(exc: BaseException) -> bool:
    """MUTANT transport-error-escapes: an error asyncio's transport raised in a
    write is taken for a bug, not for the lost connection it is."""
    return False
