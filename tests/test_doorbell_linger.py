"""A doorbell channel outlives its wait by ``LINGER_S``, within bounds.

One waiter per process taking a lock again and again (Celery prefork workers)
used to open a pub/sub connection, ``SUBSCRIBE``, and drop the connection on
every wait. The channel now stays subscribed for ``LINGER_S`` after its last
watch, so the next wait reuses it; after that, or beyond ``MAX_LINGERING``
channels, it is unsubscribed, and the connection is dropped once nothing is
watched or lingers.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from redis_fifo_lock import FifoLock, RedisUnavailable
from redis_fifo_lock import doorbell as doorbell_module
from redis_fifo_lock.doorbell import (
    CONFIRM_TIMEOUT_S,
    IDLE_PROBE_S,
    IDLE_PROBE_TIMEOUT_S,
    LINGER_S,
    MAX_LINGERING,
    PROBE_TIMEOUT_S,
    Doorbell,
)
from redis_fifo_lock.protocol import ClaimReply, Grant, PollReply, Protocol
from redis_fifo_lock.waiting import RETRY_AFTER_ERROR_S, WaitGroup, hub_for
from tests.conftest import FaultProxyFactory
from tests.support.polling import until
from tests.support.processes import contender, first_line
from tests.support.proxy import (
    FaultProxy,
    hold_the_subscription_only,
    lose_the_reconnection_handshake,
    taken_for_dead,
    watch_through_a_lost_handshake,
)

SETTINGS = {"lease_ms": 4000, "poll_ms": 1000}


async def _subscribes(admin: Redis) -> int:
    stats = await admin.info("commandstats")
    return int(stats.get("cmdstat_subscribe", {}).get("calls", 0))


async def _connections(admin: Redis) -> int:
    """How many connections the server has accepted so far."""
    return int((await admin.info("stats"))["total_connections_received"])


async def _doorbells(admin: Redis) -> list[bytes]:
    return list(await admin.pubsub_channels("*doorbell*"))


async def _wait_once(
    holder: FifoLock,
    waiter: FifoLock,
    *,
    before_release: Callable[[], object] | None = None,
    after_release: Callable[[], object] | None = None,
) -> float:
    """One wait of ``waiter`` that is granted on a hand-off (never at once):
    seconds from the holder's ``release`` call to the waiter's ``acquire``
    returning. ``before_release`` runs (and is awaited, if it returns an
    awaitable) once the waiter is queued, ``after_release`` once the holder's
    release returned."""
    held = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await until(
        lambda: _has_waiter(holder), f"a waiter of {waiter.name!r} is queued", pause_s=0.005
    )
    await _run_hook(before_release)
    released = time.monotonic()
    await holder.release(held)
    await _run_hook(after_release)
    lease = await waiting
    took = time.monotonic() - released
    await waiter.release(lease)
    return took


async def _run_hook(hook: Callable[[], object] | None) -> None:
    result = None if hook is None else hook()
    if inspect.isawaitable(result):
        await result


async def _no_doorbells(admin: Redis) -> bool:
    return await _doorbells(admin) == []


async def _has_waiter(lock: FifoLock) -> bool:
    return (await lock.status()).waiting > 0


async def test_waits_one_after_another_share_one_subscription(
    aredis: Redis, redis_url: str
) -> None:
    client = Redis.from_url(redis_url)
    holder = FifoLock(aredis, "serial", **SETTINGS)
    waiter = FifoLock(client, "serial", **SETTINGS)
    await _wait_once(holder, waiter)
    connections = await _connections(aredis)
    for _ in range(4):
        await _wait_once(holder, waiter)
    assert await _connections(aredis) == connections, "a wait opened a connection"
    doorbell = hub_for(client).doorbell
    assert doorbell.active
    # Unsubscribed and the connection dropped once the linger is over.
    await until(lambda: not doorbell.active, "the doorbell dropped", timeout_s=LINGER_S + 5)
    await until(lambda: _no_doorbells(aredis), "the server saw the connection go")
    await client.aclose()


async def test_no_more_than_max_lingering_channels_stay_subscribed(
    aredis: Redis, redis_url: str
) -> None:
    client = Redis.from_url(redis_url)
    names = [f"many-{n}" for n in range(MAX_LINGERING + 8)]
    for name in names:
        await _wait_once(FifoLock(aredis, name, **SETTINGS), FifoLock(client, name, **SETTINGS))

    async def within_bound() -> bool:
        # The UNSUBSCRIBE of the channel dropped last may still be on its way.
        return 0 < len(await _doorbells(aredis)) <= MAX_LINGERING

    await until(
        within_bound, f"at most {MAX_LINGERING} channels subscribed", LINGER_S / 4, pause_s=0.01
    )
    await client.aclose()


@pytest.mark.parametrize("watched", [False, True])
async def test_a_lingering_channel_is_watched_again_when_a_new_wait_needs_it(
    aredis: Redis, redis_url: str, watched: bool
) -> None:
    """After the linger: subscribed anew for the next wait, which is rung."""
    client = Redis.from_url(redis_url)
    holder = FifoLock(aredis, "again", **SETTINGS)
    waiter = FifoLock(client, "again", **SETTINGS)
    if watched:  # another channel keeps the connection open meanwhile
        other = FifoLock(aredis, "other", **SETTINGS)
        other_held = await other.acquire(timeout=5)
        other_waiter = FifoLock(client, "other", **SETTINGS)
        other_waiting = asyncio.create_task(other_waiter.acquire(timeout=20))
    await _wait_once(holder, waiter)
    doorbell = hub_for(client).doorbell
    channel = waiter.keys.doorbell_of(hub_for(client).session_for(waiter.settings))
    await until(
        lambda: _not_subscribed(aredis, channel), "the channel unsubscribed", timeout_s=LINGER_S + 5
    )
    assert doorbell.active == watched
    await aredis.config_resetstat()
    await _wait_once(holder, waiter)
    assert await _subscribes(aredis) == 1
    if watched:
        await other.release(other_held)
        await other_waiter.release(await other_waiting)
    await client.aclose()


async def _not_subscribed(admin: Redis, channel: str) -> bool:
    return channel.encode() not in await _doorbells(admin)


# --- a wait on a channel still subscribed needs no catch-up poll ----------------


def _count_polls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times (``time.monotonic()``) of every poll script call from now on."""
    polls: list[float] = []
    original = Protocol.poll

    async def counted(self: Protocol, *args: Any, **kwargs: Any) -> PollReply:
        polls.append(time.monotonic())
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(Protocol, "poll", counted)
    return polls


async def test_a_wait_on_a_lingering_channel_sends_no_catch_up_poll(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls = _count_polls(monkeypatch)
    client = Redis.from_url(redis_url)
    holder = FifoLock(aredis, "no-catch-up", **SETTINGS)
    waiter = FifoLock(client, "no-catch-up", **SETTINGS)
    await _wait_once(holder, waiter)  # subscribes, and polls at once to catch up
    first = len(polls)
    assert first >= 1
    for _ in range(4):
        await _wait_once(holder, waiter)
    assert len(polls) == first, "a wait on a channel still subscribed polled at once"
    await client.aclose()


async def test_a_ring_on_a_lingering_channel_goes_to_the_lock_s_current_group(
    aredis: Redis, redis_url: str
) -> None:
    """A new wait group watches its channel only once its first acquire replied;
    a grant rung meanwhile on the lingering channel must reach it."""
    client = Redis.from_url(redis_url)
    rung: list[tuple[str, Grant]] = []

    def watcher(token: str, grant: Grant) -> None:
        raise AssertionError("rung to a watch that ended")

    doorbell = Doorbell(weakref.ref(client), owner=lambda channel: lambda t, g: rung.append((t, g)))
    channel = "fifolock:{route}:doorbell:test"
    assert await doorbell.watch(channel, watcher)
    await doorbell.unwatch(channel, watcher)  # lingers
    assert await aredis.publish(channel, "tok 5 7 1000 call 0 " + "a" * 40) == 1
    await until(lambda: rung, "the ring reached the owner")
    assert rung[0][0] == "tok" and rung[0][1].fence == 5
    await doorbell.aclose()
    await client.aclose()


async def test_a_dead_holder_is_replaced_at_its_lease_s_end_for_a_wait_with_no_catch_up_poll(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The skipped poll's other duty: the first poll goes right after the
    holder's lease runs out (as the acquire's reply tells), not ``poll_ms``
    later, so a dead holder is still replaced within ``lease_ms``."""
    monkeypatch.setattr(doorbell_module, "LINGER_S", 60.0)  # outlasts the holder's start
    polls = _count_polls(monkeypatch)
    settings = {"lease_ms": 6000, "poll_ms": 3000}
    client = Redis.from_url(redis_url)
    waiter = FifoLock(client, "crashed", **settings)
    await _wait_once(FifoLock(aredis, "crashed", **settings), waiter)  # the channel lingers
    proc = contender(
        ["--url", redis_url],
        tmp_path / "record",
        *("--name", "crashed", "--lease-ms", "6000", "--poll-ms", "3000"),
        *("--hold-ms", "600000"),
    )
    try:
        assert (await first_line(proc)).startswith("granted")
    finally:
        proc.kill()
        proc.wait()
    lease_key = waiter.keys.key("lease")
    await until(
        lambda: _pttl_below(aredis, lease_key, 1500),
        "the dead holder's lease runs low",
        timeout_s=10,
        pause_s=0.02,
    )
    ends_at = time.monotonic() + max(0, await aredis.pttl(lease_key)) / 1000
    asked = time.monotonic()
    lease = await waiter.acquire(timeout=20)
    granted = time.monotonic()
    # A catch-up poll would go with the acquire; the lease-end poll goes at
    # ends_at, which a loaded machine may have brought close to `asked`.
    at_once = asked + min(0.5, (ends_at - asked) / 2)
    assert not [t for t in polls if asked <= t < at_once], "it polled at once"
    # A first poll after poll_ms (3 s) would come at least 1.5 s after the lease's end.
    assert granted < ends_at + 1.0, f"granted {granted - ends_at:.2f} s after the lease's end"
    await waiter.release(lease)
    await client.aclose()


async def _pttl_below(admin: Redis, key: str, ms: int) -> bool:
    return 0 < await admin.pttl(key) < ms


PROXIED = {"lease_ms": 6000, "poll_ms": 3000}
"""A first poll (3 s) stands out from a ring or a probe's catch-up."""


async def _lingering_through_a_proxy(
    aredis: Redis, proxy: FaultProxy, name: str
) -> tuple[FaultProxy, Redis, FifoLock, FifoLock]:
    """A holder (``aredis``) and a waiter whose client goes through ``proxy``,
    after one hand-off: the waiter's doorbell channel lingers."""
    client = Redis.from_url(proxy.url)
    holder = FifoLock(aredis, name, **PROXIED)
    waiter = FifoLock(client, name, **PROXIED)
    await _wait_once(holder, waiter)
    return proxy, client, holder, waiter


async def test_a_ring_lost_while_the_subscription_reconnects_is_caught_up_at_once(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """redis-py reconnects a broken pub/sub connection and subscribes again on
    its own, without a word to the reader: a ring published in between is lost.
    The channel's confirmation coming again tells the doorbell, and the lock's
    group polls at once, rather than at its next poll (``poll_ms`` later; this
    wait skipped its catch-up poll, its channel lingering). Found by an outside
    attack on an earlier try at lingering subscriptions."""
    proxy, client, holder, waiter = await _lingering_through_a_proxy(
        aredis, fault_proxy(redis_url), "gap"
    )

    def break_the_subscription() -> None:
        proxy.hold("up")  # the reconnection's SUBSCRIBE waits
        assert proxy.reset() >= 1  # the subscription's connection breaks

    # The release's ring goes to nobody: lost.
    took = await _wait_once(
        holder,
        waiter,
        before_release=break_the_subscription,
        after_release=lambda: proxy.release("up"),
    )
    assert took < 1.0, f"the lost ring was caught up {took:.2f} s after the release"
    await client.aclose()


async def test_a_kept_connection_that_died_silently_delays_a_wait_by_the_probe_at_most(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """The lingering channel's connection goes half-open: the proxy keeps what
    Redis sends on it, and no side sees an error (a NAT or middlebox that
    dropped the flow). The next wait's probe goes unanswered: its group polls
    and the subscription is rebuilt, within ``PROBE_TIMEOUT_S`` and not at the
    first poll (``poll_ms``), and the waits after it are rung again. Found by
    an outside attack on an earlier try at lingering subscriptions (each of five
    waits in a row was served at its first poll)."""
    proxy, client, holder, waiter = await _lingering_through_a_proxy(
        aredis, fault_proxy(redis_url), "half-open"
    )
    await hold_the_subscription_only(client, proxy)
    for attempt in range(4):
        took = await _wait_once(holder, waiter)
        bound = PROBE_TIMEOUT_S + 0.5 if attempt == 0 else 0.5
        assert took < bound, f"wait {attempt} was served {took:.2f} s after the release"
    await client.aclose()


async def test_a_reconnection_while_a_probe_is_on_its_way_still_catches_up(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """A client with retries: redis-py reconnects the subscription's connection
    while the wait's probe is on its way, and subscribes the channel again
    without a word to the reader. That confirmation is the reconnection's, not
    the probe's answer (which died with the old connection): the ring lost in
    the gap is caught up at once. Found by an outside attack on the first
    SUBSCRIBE probe, which took it for the answer (every such wait served at
    its first poll, 3 s)."""
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url, retry=Retry(ExponentialBackoff(), 3))
    holder = FifoLock(aredis, "reconnected", **PROXIED)
    waiter = FifoLock(client, "reconnected", **PROXIED)
    await _wait_once(holder, waiter)  # the channel lingers
    await hold_the_subscription_only(client, proxy)  # the probe's answer and the ring wait
    held: list[int] = []

    async def probe_answered() -> None:
        await until(lambda: proxy.held_bytes("down") > 0, "the probe was answered (held)")
        held.append(proxy.held_bytes("down"))

    async def ring_held_then_reset() -> None:
        await until(lambda: proxy.held_bytes("down") > held[0], "the ring is held")
        proxy.reset()  # redis-py reconnects and subscribes again, on its own

    took = await _wait_once(
        holder, waiter, before_release=probe_answered, after_release=ring_held_then_reset
    )
    assert took < 1.0, f"the lost ring was caught up {took:.2f} s after the release"
    await client.aclose()


def test_a_channel_lingering_when_its_client_is_dropped_is_closed_with_the_loop(
    redis_url: str,
) -> None:
    """The client is dropped (not closed) while its channel lingers: its hub
    goes with it, but the doorbell's subscription must still be closed when the
    loop closes, not left to garbage collection after it (unclosed sockets and
    'loop is closed' warnings; a CI run met this with Redis Cluster clients,
    whose close leaves a pub/sub connection open)."""
    doorbells: list[Doorbell] = []

    async def main() -> None:
        admin = Redis.from_url(redis_url)
        client = Redis.from_url(redis_url)
        await _wait_once(
            FifoLock(admin, "dropped", **SETTINGS), FifoLock(client, "dropped", **SETTINGS)
        )
        doorbells.append(hub_for(client).doorbell)
        assert doorbells[0].active  # lingering
        await admin.aclose()
        del client
        gc.collect()

    asyncio.run(main())
    assert not doorbells[0].active, "the lingering subscription outlived its loop"


async def test_a_wait_whose_client_lost_every_connection_is_served_at_once_without_retries(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """A client with no retries loses every connection at once (a Redis restart,
    a proxy reset) while its wait is queued on a lingering channel: the ring
    goes to nobody, and the group's catch-up poll meets a pooled connection
    that is dead. That failure is the old connection's, not news of an outage:
    the poll is tried again at once on a new one, not after
    ``RETRY_AFTER_ERROR_S`` (it was served 0.52 s after the release)."""
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
    holder = FifoLock(aredis, "all-reset", **PROXIED)
    waiter = FifoLock(client, "all-reset", **PROXIED)
    await _wait_once(holder, waiter)  # the channel lingers
    took = await _wait_once(holder, waiter, before_release=lambda: proxy.reset() or None)
    assert took < 0.8 * RETRY_AFTER_ERROR_S, f"served {took:.2f} s after the release"
    await client.aclose()


async def _claim_through_a_lost_connection(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, object]:
    """A queued request's claim whose first copy meets a lost connection (as
    after a restart, when redis-py hands out a pooled connection that is
    dead): how many claims were sent, and what ``WaitGroup.claim`` returned
    (or raised)."""
    client = Redis.from_url(redis_url, retry=Retry(NoBackoff(), 0))
    holder = FifoLock(aredis, "claim-lost", **PROXIED)
    waiter = FifoLock(client, "claim-lost", **PROXIED)
    held = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
    sent: list[str] = []
    claim = Protocol.claim

    async def lost_once(self: Protocol, client: Any, keys: Any, *args: Any) -> Any:
        sent.append(keys.name)
        if len(sent) == 1:
            raise RedisUnavailable(
                keys.name, "lost", cause=RedisConnectionError("Connection reset by peer")
            )
        return await claim(self, client, keys, *args)

    try:
        group = hub_for(client).group(waiter.keys, waiter.settings, waiter._protocol)
        await until(
            lambda: "w" in group.waiters and group.waiters["w"].ticket is not None,
            "w is queued",
            pause_s=0.005,
        )
        ticket = group.waiters["w"].ticket
        assert ticket is not None
        monkeypatch.setattr(Protocol, "claim", lost_once)
        try:
            outcome: object = await group.claim("w", ticket)
        except RedisUnavailable as exc:
            outcome = exc
        monkeypatch.undo()
        return len(sent), outcome
    finally:
        await holder.release(held)
        await waiter.release(await waiting)
        await client.aclose()


async def test_a_claim_that_met_a_lost_connection_is_sent_again_at_once(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reset of every connection, the doorbell's new subscription can
    take the pooled connection a failed poll reopened, and the waiter's claim of
    its grant then met another dead one: it was served at its next poll, 3 s
    after the release (a CI run of
    test_a_wait_whose_client_lost_every_connection_is_served_at_once_without_retries).
    A claim that met a lost connection is sent again at once."""
    sent, outcome = await _claim_through_a_lost_connection(aredis, redis_url, monkeypatch)
    assert sent == 2 and isinstance(outcome, ClaimReply), outcome
    assert outcome.grant is None and outcome.queued_ticket is not None  # w still queued


async def test_a_lost_connection_kills_claim_not_resent(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MUTANT claim-not-resent: a claim that met a lost connection is not sent
    again (before this change)."""

    async def claim_once(self: WaitGroup, token: str, ticket: int) -> Any:
        return await self.hub.run(
            self.hub.calls,
            lambda client: self.protocol.claim(client, self.keys, token, ticket, self.settings),
        )

    monkeypatch.setattr(WaitGroup, "claim", claim_once)
    _, outcome = await _claim_through_a_lost_connection(aredis, redis_url, monkeypatch)
    assert isinstance(outcome, RedisUnavailable), "claim-not-resent passed"


RACE = RuntimeError("read() called while another coroutine is already waiting for incoming data")
"""What redis-py 8 raises from a ``SUBSCRIBE`` that meets the reader's
reconnection of the subscription's connection (seen under an outside attack
that killed that connection every few ms)."""


def _failing_once(pubsub: Any, method: str, error: Exception) -> None:
    """Make ``pubsub.<method>`` raise ``error`` on its next call, and work after."""
    original = getattr(pubsub, method)

    async def fail(*args: Any, **kwargs: Any) -> Any:
        setattr(pubsub, method, original)
        raise error

    setattr(pubsub, method, fail)


async def test_a_probe_that_meets_a_reconnection_leaves_its_group_polling(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """The probe of a lingering channel meets redis-py reconnecting the
    subscription's connection, which raises a ``RuntimeError`` rather than a
    connection error, and the ring is lost. The group must still poll: its
    waiter is served by its first poll at the latest. Before, the error ended
    the group's poller, and the waiter was never served (an outside attack:
    waits that hung on a free lock, 'Task exception was never retrieved')."""
    unhandled: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))
    proxy, client, holder, waiter = await _lingering_through_a_proxy(
        aredis, fault_proxy(redis_url), "probe-race"
    )
    await hold_the_subscription_only(
        client, proxy
    )  # the ring is lost on the subscription's connection
    doorbell = hub_for(client).doorbell
    assert doorbell._pubsub is not None
    _failing_once(doorbell._pubsub, "subscribe", RACE)
    took = await _wait_once(holder, waiter)
    assert took < PROXIED["poll_ms"] / 1000 + 1.0, f"served {took:.2f} s after the release"
    await client.aclose()
    gc.collect()
    assert unhandled == []


async def test_a_reader_that_meets_a_reconnection_reads_on_and_catches_up(
    aredis: Redis, redis_url: str
) -> None:
    """The doorbell's reader gets what redis-py raises when a ``SUBSCRIBE`` tears
    its connection down under it (``AttributeError``): it takes that for a
    broken connection, as for a connection error, and its waiter is served at
    once. Before, the reader died of it, and every ring after it was lost."""
    client = Redis.from_url(redis_url)
    holder = FifoLock(aredis, "reader-race", **PROXIED)
    waiter = FifoLock(client, "reader-race", **PROXIED)
    await _wait_once(holder, waiter)  # the channel lingers, its reader reading
    doorbell = hub_for(client).doorbell
    assert doorbell._pubsub is not None
    broken = AttributeError("'NoneType' object has no attribute 'writelines'")
    _failing_once(doorbell._pubsub, "get_message", broken)
    await doorbell._pubsub.connection.disconnect()  # wakes the reader into the failing read
    for attempt in range(3):
        took = await _wait_once(holder, waiter)
        assert took < 1.0, f"wait {attempt} was served {took:.2f} s after the release"
    await client.aclose()


async def test_a_doorbell_failure_it_did_not_expect_leaves_the_waiters_polling(
    aredis: Redis, redis_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doorbell is only an optimisation: whatever it raises, the group's
    poller lives on, its waiters are served by polls, and the failure is
    logged as an error, with its traceback."""
    client = Redis.from_url(redis_url)
    holder = FifoLock(aredis, "doorbell-bug", **SETTINGS)
    waiter = FifoLock(client, "doorbell-bug", **SETTINGS)

    async def broken_watch(self: Doorbell, channel: str, ring: object) -> bool:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(Doorbell, "watch", broken_watch)
    took = await _wait_once(holder, waiter)
    assert took < SETTINGS["poll_ms"] / 1000 + 1.0, f"served {took:.2f} s after the release"
    assert any(
        record.levelname == "ERROR" and "doorbell failed unexpectedly" in record.getMessage()
        for record in caplog.records
    )
    await client.aclose()


async def test_an_error_reply_of_a_reconnection_handshake_is_no_refusal(
    aredis: Redis, redis_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py, reconnecting the subscription's connection under a ``SUBSCRIBE``,
    can leave its handshake's error reply (``CLIENT SETINFO`` on a server
    before Redis 7.2) to the doorbell's reader. That reply answers no
    subscription: the wait is rung as usual, and nothing is reported as an ACL
    refusal. Before, it failed the pending watch and was reported as "Redis's
    ACL refused the doorbell" (an outside attack: 23 times in 300 waits)."""
    stray = ResponseError("unknown subcommand 'SETINFO'. Try CLIENT HELP.")
    original = PubSub.get_message
    strays = [stray]

    async def get_message(self: PubSub, *args: Any, **kwargs: Any) -> Any:
        if strays:
            raise strays.pop()
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(PubSub, "get_message", get_message)
    client = Redis.from_url(redis_url)
    holder = FifoLock(aredis, "stray-reply", **PROXIED)
    waiter = FifoLock(client, "stray-reply", **PROXIED)
    took = await _wait_once(holder, waiter)
    assert not strays, "the stray reply was not read"
    assert took < 1.0, f"served {took:.2f} s after the release"
    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    await client.aclose()


async def test_a_subscription_whose_reconnection_never_answers_is_rebuilt_for_a_new_wait(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """On a client with no ``socket_timeout`` (``LoopClients`` on Python 3.11+,
    docs/performance.md's advice there, redis-py before 8) the subscription's
    connection is cut, and the handshake reply of redis-py's reconnection,
    inside the doorbell's reader, is lost: that reader waits for it for ever.
    A wait on another lock then finds its SUBSCRIBE unconfirmed with nothing
    read at all: the subscription is rebuilt within ``CONFIRM_TIMEOUT_S``, and
    the wait is rung, not served at a poll 15 s later. Found by an outside
    attack (every later hand-off of the process waited for a poll)."""
    settings = {"lease_ms": 30_000, "poll_ms": 15_000}
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url, socket_timeout=None)
    kept = await FifoLock(aredis, "watched", **settings).acquire(timeout=5)
    watching = asyncio.create_task(FifoLock(client, "watched", **settings).acquire(timeout=60))
    await until(lambda: _channel_count(aredis, "watched"), "the waiter subscribed", pause_s=0.01)
    await lose_the_reconnection_handshake(client, aredis, proxy)
    took = await _wait_once(
        FifoLock(aredis, "after-the-cut", **settings), FifoLock(client, "after-the-cut", **settings)
    )
    assert took < CONFIRM_TIMEOUT_S + 2.0, f"served {took:.2f} s after the release"
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)
    await FifoLock(aredis, "watched", **settings).release(kept)
    await client.aclose()


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="no socket_timeout is unsupported on Python 3.10: the lock does not bound its calls "
    "there, and redis-py 5.0 reconnects the poll's connection, not the subscription, first",
)
async def test_a_watched_subscription_whose_reconnection_never_answers_is_rebuilt(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """As above, but no new wait comes to send a SUBSCRIBE: the one waiter
    already watches its channel when the reconnection's handshake reply is
    lost. Its group must not wait for its poll (15 s) to learn of the grant:
    a subscription that read nothing for ``IDLE_PROBE_S`` is probed, and the
    unanswered probe rebuilds it. Found by an outside attack (hand-offs to the
    process served at their polls, again and again)."""
    settings = {"lease_ms": 30_000, "poll_ms": 15_000}
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url, socket_timeout=None)
    holder = FifoLock(aredis, "watched", **settings)
    kept = await holder.acquire(timeout=5)
    watching = asyncio.create_task(FifoLock(client, "watched", **settings).acquire(timeout=60))
    await until(lambda: _channel_count(aredis, "watched"), "the waiter subscribed", pause_s=0.01)
    await lose_the_reconnection_handshake(client, aredis, proxy)
    released = time.monotonic()
    await holder.release(kept)
    lease = await watching
    took = time.monotonic() - released
    bound = IDLE_PROBE_S + IDLE_PROBE_TIMEOUT_S + 2.0
    assert took < bound, f"served {took:.2f} s after the release (bound {bound:g} s)"
    await FifoLock(client, "watched", **settings).release(lease)
    await client.aclose()


async def test_a_quiet_watched_subscription_costs_one_probe_per_idle_period(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle probe's cost: while 50 waiters of one client wait on five
    locks whose holders keep them, the connection reads nothing but the
    probes' answers, and gets one probe per ``IDLE_PROBE_S`` (not one per
    waiter or per channel); once nothing is watched or lingers, none at all."""
    idle_s = 0.25
    monkeypatch.setattr(doorbell_module, "IDLE_PROBE_S", idle_s)
    client = Redis.from_url(redis_url)
    names = [f"quiet-{n}" for n in range(5)]
    leases = [await FifoLock(aredis, name, **SETTINGS).acquire(timeout=5) for name in names]
    waiters = [
        asyncio.create_task(FifoLock(client, name, **SETTINGS).acquire(timeout=30))
        for name in names
        for _ in range(10)
    ]

    async def all_subscribed() -> bool:
        return len(await _doorbells(aredis)) == len(names)

    await until(all_subscribed, "the waiters subscribed", pause_s=0.01)
    before, started = await _subscribes(aredis), time.monotonic()
    await asyncio.sleep(10 * idle_s)  # the span measured, not a synchronisation
    probes, spent = await _subscribes(aredis) - before, time.monotonic() - started
    assert 1 <= probes <= spent / idle_s + 1, f"{probes} probes in {spent:.2f} s"
    for held in leases:
        await FifoLock(aredis, held.name, **SETTINGS).release(held)
    for waiting in asyncio.as_completed(waiters):
        lease = await waiting
        await FifoLock(client, lease.name, **SETTINGS).release(lease)
    await until(
        lambda: not hub_for(client).doorbell.active, "the subscription was dropped", pause_s=0.05
    )
    after = await _subscribes(aredis)
    await asyncio.sleep(4 * idle_s)  # the span measured, not a synchronisation
    assert await _subscribes(aredis) == after, "probed with nothing watched"
    await client.aclose()


async def test_a_slow_link_is_not_taken_for_a_dead_one_by_the_idle_probe(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reply reaches the waiter's client 0.7 s late (a slow link; a busy
    event loop looks the same to a timer): the idle probes are answered, late,
    and the subscription is never rebuilt. Found by an outside attack on the
    first idle probe, which gave its answer ``PROBE_TIMEOUT_S`` (0.5 s) and
    rebuilt the subscription, and made every watched group poll, after each
    quiet period."""
    monkeypatch.setattr(doorbell_module, "IDLE_PROBE_S", 1.0)
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url)
    holder = FifoLock(aredis, "slow-link", **SETTINGS)
    lease = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(FifoLock(client, "slow-link", **SETTINGS).acquire(timeout=30))
    await until(lambda: _channel_count(aredis, "slow-link"), "the waiter subscribed", pause_s=0.01)
    proxy.delay("down", 700)
    before = await _subscribes(aredis)
    taken = taken_for_dead(hub_for(client).doorbell)
    await asyncio.sleep(6.0)  # the span measured, not a synchronisation
    assert await _subscribes(aredis) - before >= 2, "no idle probe was sent"
    assert taken == [], f"the slow subscription was taken for dead: {taken}"
    await holder.release(lease)
    await FifoLock(client, "slow-link", **SETTINGS).release(await waiting)
    await client.aclose()


@pytest.mark.parametrize(
    "client_options",
    [{}, {"socket_timeout": None}],
    ids=["redis-py-defaults", "no-socket-timeout"],
)
async def test_a_watched_subscription_gone_half_open_is_probed_and_rebuilt(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory, client_options: dict[str, Any]
) -> None:
    """The subscription's connection goes half-open while its one waiter
    waits (what Redis sends on it is held, no side sees an error: a NAT that
    dropped the flow during a long hold). No new wait sends a SUBSCRIBE that
    could find it out: the ring of the grant must still reach the waiter once
    the quiet connection is probed (``IDLE_PROBE_S``) and rebuilt, not at its
    first poll (15 s). Before the probe, it was served at that poll, with
    redis-py's default ``socket_timeout`` as with none."""
    settings = {"lease_ms": 30_000, "poll_ms": 15_000}
    proxy = fault_proxy(redis_url)
    client = Redis.from_url(proxy.url, **client_options)
    holder = FifoLock(aredis, "half-open-watched", **settings)
    waiter = FifoLock(client, "half-open-watched", **settings)

    async def confirmed_then_half_open() -> None:
        # Queued before its group's SUBSCRIBE is even sent, on a slow machine.
        channel = waiter.keys.doorbell_of(hub_for(client).session_for(waiter.settings))
        doorbell = hub_for(client).doorbell
        await until(lambda: doorbell.steady_since(channel), "the waiter's channel was confirmed")
        await hold_the_subscription_only(client, proxy)

    took = await _wait_once(holder, waiter, before_release=confirmed_then_half_open)
    bound = IDLE_PROBE_S + IDLE_PROBE_TIMEOUT_S + 2.0
    assert took < bound, f"served {took:.2f} s after the release (bound {bound:g} s)"
    await client.aclose()


@pytest.mark.parametrize("second_lingers", [False, True], ids=["new-channel", "probe"])
async def test_a_subscribe_whose_reconnection_is_never_answered_holds_no_watch_up(
    aredis: Redis, redis_url: str, fault_proxy: FaultProxyFactory, second_lingers: bool
) -> None:
    """A client with no ``socket_timeout``: the subscription's connection
    breaks and the reader cannot reconnect it at once (refused), so it waits
    ``RECONNECT_DELAY_S`` before rebuilding. A watch's SUBSCRIBE sent
    meanwhile (a new channel's, or the probe of a lingering one) reconnects it
    inside the call, and the handshake's reply is lost. That watch must not
    wait for it for ever, holding every other watch and the rebuild up: it
    returns (or fails) within ``CONFIRM_TIMEOUT_S``, and then both channels
    are subscribed on a live connection and rung
    (``watch_through_a_lost_handshake``)."""
    problem = await watch_through_a_lost_handshake(
        aredis, fault_proxy(redis_url), Doorbell, second_lingers=second_lingers
    )
    assert problem is None, problem


async def _channel_count(admin: Redis, name: str) -> int:
    return len([c for c in await _doorbells(admin) if name.encode() in c])


def _reads_as_before_redis_py_8(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``PubSub.get_message(timeout=None)`` end as it does before redis-py
    8: after the client's ``socket_timeout`` of silence, the connection is
    dropped and ``TimeoutError`` raised (a blocking pub/sub read took the
    client's read bound); and have the doorbell know it."""
    original = PubSub.get_message

    async def get_message(
        self: PubSub, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0
    ) -> Any:
        bound = getattr(self.connection, "socket_timeout", None)
        if timeout is not None or bound is None or self.connection is None:
            return await original(self, ignore_subscribe_messages, timeout)
        message = await original(self, ignore_subscribe_messages, bound)
        if message is None:
            await self.connection.disconnect()
            raise RedisTimeoutError("Timeout reading from the subscription")
        return message

    monkeypatch.setattr(PubSub, "get_message", get_message)
    monkeypatch.setattr(doorbell_module, "BLOCKING_READ_UNBOUNDED", False)


async def _quiet_wait(aredis: Redis, redis_url: str, name: str) -> tuple[int, int, float]:
    """A waiter on a client with a 0.2 s ``socket_timeout`` waits on a held lock
    for a while: (SUBSCRIBEs sent, connections opened, seconds measured)."""
    client = Redis.from_url(redis_url, socket_timeout=0.2)
    held = await FifoLock(aredis, name, **SETTINGS).acquire(timeout=5)
    waiting = asyncio.create_task(FifoLock(client, name, **SETTINGS).acquire(timeout=30))
    await until(lambda: _doorbells(aredis), "the waiter subscribed", pause_s=0.01)
    before = await _subscribes(aredis), await _connections(aredis), time.monotonic()
    await asyncio.sleep(2.0)  # the span measured, not a synchronisation
    after = await _subscribes(aredis), await _connections(aredis), time.monotonic()
    await FifoLock(aredis, name, **SETTINGS).release(held)
    await FifoLock(client, name, **SETTINGS).release(await waiting)
    await client.aclose()
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


async def _connections(admin: Redis) -> int:
    return int((await admin.info("stats"))["total_connections_received"])


@pytest.mark.parametrize("reads", ["this redis-py", "as before redis-py 8"])
async def test_a_socket_timeout_does_not_make_a_quiet_subscription_reconnect(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, reads: str
) -> None:
    """Before redis-py 8 a blocking pub/sub read takes the client's
    ``socket_timeout`` as its bound, and at its end drops the connection: a
    quiet subscription was rebuilt every ``socket_timeout`` (a new connection,
    a SUBSCRIBE and a poll each time, and an INFO line every 5 s with a 5 s
    timeout). The reader now reads in slices of its own there."""
    if reads != "this redis-py":
        _reads_as_before_redis_py_8(monkeypatch)
    subscribes, connections, spent = await _quiet_wait(aredis, redis_url, "quiet-timeout")
    assert connections == 0, f"{connections} new connections in {spent:.1f} s"
    assert subscribes <= spent / IDLE_PROBE_S + 1, f"{subscribes} SUBSCRIBEs in {spent:.1f} s"


def _reads_without_a_slice(pubsub: PubSub) -> None:
    """MUTANT read-bounded-by-socket-timeout: the reader's read is left
    unbounded whatever redis-py does with it (before the test above)."""
    return None


async def test_a_socket_timeout_kills_read_bounded_by_socket_timeout(
    aredis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reads_as_before_redis_py_8(monkeypatch)
    monkeypatch.setattr(doorbell_module, "read_slice_s", _reads_without_a_slice)
    _, connections, _ = await _quiet_wait(aredis, redis_url, "quiet-timeout-mutant")
    assert connections > 0, "read-bounded-by-socket-timeout passed"
