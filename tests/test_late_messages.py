"""Late messages: rings and replies read late, forged rings, late copies of scripts.

Issue 11, items 1 and 2. A holder's local deadline is never later than Redis's
expiry of its grant, however late the ring or reply is read; a ring is only a
wake-up hint, so a forged one never makes ``acquire()`` return; and once a
request (token and ticket) was granted, withdrawn or released, no later copy
of its acquire, release or withdraw changes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LockError, LockTimeout
from redis_fifo_lock.holds import violations
from redis_fifo_lock.lock import WITHDRAW_GRACE_S
from redis_fifo_lock.protocol import (
    ALREADY_RELEASED,
    NOT_HELD,
    RELEASED,
    LockKeys,
    PollReply,
    Script,
)
from redis_fifo_lock.settings import LockSettings
from redis_fifo_lock.waiting import WaitGroup, hub_for
from tests.conftest import FaultProxyFactory
from tests.support.polling import until
from tests.support.record import Record
from tests.support.replay import ScriptCalls, reply_code
from tests.support.rings import forged_ring

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[Callable[[], AsyncRedis]]:
    """Makes new clients of the test server (each one a waiting session of its own)."""
    made: list[AsyncRedis] = []

    def make() -> AsyncRedis:
        client = AsyncRedis.from_url(redis_url)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


def local_deadline(lease: Lease) -> float:
    """``lease.expires_at``: the holder's deadline, in ``time.monotonic()`` seconds.

    Before the redesign ``Lease`` had no ``expires_at``; the same deadline lived
    in the lease's renewal, in loop time (``time.monotonic()`` on asyncio's
    default loop). Reading it there lets this test show the bug today, rather
    than an ``AttributeError``.
    """
    if hasattr(lease, "expires_at"):
        return float(lease.expires_at)
    renewal = lease._renewal
    assert renewal is not None, "the lease has neither expires_at nor a renewal"
    return renewal.expires_at


async def queued(admin: AsyncRedis, keys: LockKeys, token: str) -> bool:
    return await admin.zscore(keys.key("queue"), token) is not None


async def holder_token(admin: AsyncRedis, keys: LockKeys) -> str | None:
    token = await admin.hget(keys.key("lease"), "token")
    return None if token is None else _text(token)


async def waiting_count(lock: FifoLock, count: int) -> bool:
    return (await lock.status()).waiting == count


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- item 1: grants read late, forged rings ------------------------------------------------


async def test_a_waiter_whose_loop_was_blocked_when_its_grant_landed_keeps_no_deadline_past_redis(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis]
) -> None:
    settings = {"lease_ms": 3000, "poll_ms": 1500}
    holder = FifoLock(clients(), "blocked-loop", **settings)
    waiter = FifoLock(clients(), "blocked-loop", **settings)
    lease_h = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
    await until(lambda: queued(aredis, waiter.keys, "w"), "w is queued")
    await holder.release(lease_h)  # the grant to w lands in Redis now ...
    time.sleep(1.0)  # noqa: ASYNC251 - the fault under test: w's loop is blocked
    lease_w = await waiting
    pttl_ms = await aredis.pttl(waiter.keys.key("lease"))
    after_reply = time.monotonic()
    try:
        assert pttl_ms > 0, f"w's grant is gone from Redis already (PTTL {pttl_ms})"
        redis_expiry = after_reply + pttl_ms / 1000  # Redis expires it at or before this
        late_s = local_deadline(lease_w) - redis_expiry
        assert late_s <= 0.005, (
            f"w believes it holds the lock {late_s:.3f} s after Redis lets the grant expire "
            "(its lease was dated from when the late ring was read)"
        )
    finally:
        await waiter.release(lease_w)


async def test_a_waiter_blocked_past_its_lease_when_its_grant_landed_never_enters_beside_the_next(
    aredis: AsyncRedis, redis_url: str, tmp_path: Path
) -> None:
    """W1's loop is blocked for longer than the lease right when its grant lands;
    Redis lets that grant expire and grants W2. When W1's loop runs again it
    must not enter while W2 is inside (W1 may wait on, or give up)."""
    settings = {"lease_ms": 3000, "poll_ms": 1500}
    record = Record(tmp_path / "blocked.rec")
    keys = LockKeys("blocked-past-lease")
    w1_queued, w2_queued = threading.Event(), threading.Event()
    outcome: dict[str, str] = {}

    async def blocked_side() -> None:
        """The holder and W1, on an event loop of their own (this thread's)."""
        h_client, w_client = AsyncRedis.from_url(redis_url), AsyncRedis.from_url(redis_url)
        admin = AsyncRedis.from_url(redis_url)
        try:
            holder = FifoLock(h_client, keys.name, **settings)
            lease_h = await holder.acquire(timeout=5)
            record.enter(lease_h, "h")
            w1 = FifoLock(w_client, keys.name, **settings)
            acquiring = asyncio.create_task(w1.acquire(timeout=15, token="w1"))
            await until(lambda: queued(admin, keys, "w1"), "w1 is queued")
            w1_queued.set()
            assert await asyncio.to_thread(w2_queued.wait, 10), "w2 never queued"
            record.exit(lease_h)
            await holder.release(lease_h)  # the grant to w1 lands now ...
            time.sleep(3.5)  # noqa: ASYNC251 - the fault: w1's loop blocked past the lease
            try:
                lease = await acquiring
            except LockError as exc:
                outcome["w1"] = type(exc).__name__
                return
            record.enter(lease, "w1")
            outcome["w1"] = "entered (lost)" if lease.lost else "entered"
            await asyncio.sleep(0.2)  # the critical section
            record.exit(lease)
            try:
                await w1.release(lease)
            except LeaseLost:
                outcome["w1"] += ", LeaseLost at release"
        finally:
            for client in (h_client, w_client, admin):
                await client.aclose()

    side = asyncio.create_task(asyncio.to_thread(asyncio.run, blocked_side()))
    assert await asyncio.to_thread(w1_queued.wait, 10), "w1 never queued"
    w2_client = AsyncRedis.from_url(redis_url)
    try:
        w2 = FifoLock(w2_client, keys.name, **settings)
        acquiring_w2 = asyncio.create_task(w2.acquire(timeout=20, token="w2"))
        await until(lambda: queued(aredis, keys, "w2"), "w2 is queued")
        w2_queued.set()
        lease_w2 = await acquiring_w2
        record.enter(lease_w2, "w2")
        await asyncio.sleep(2.5)  # inside while w1's loop comes back (3.5 s after its grant)
        record.exit(lease_w2)
        await w2.release(lease_w2)
        await side
    finally:
        await w2_client.aclose()
    overlaps = [v for v in violations(record.holds(), allow_open=True) if v.kind == "overlap"]
    assert overlaps == [], f"w1: {outcome.get('w1')}; {overlaps}"


class _OnRecord(logging.Handler):
    """Calls ``then()`` once, at the first log record whose message holds ``text``."""

    def __init__(self, text: str, then: Callable[[], object]) -> None:
        super().__init__()
        self.text, self.then, self.seen = text, then, False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.seen and self.text in record.getMessage():
            self.seen = True
            self.then()


@pytest.mark.parametrize("lock_was", ["free", "held"])
async def test_a_grant_whose_reply_came_after_its_lease_ran_out_is_never_returned(
    aredis: AsyncRedis, redis_url: str, fault_proxy: FaultProxyFactory, lock_was: str
) -> None:
    """Every reply reaches the caller 0.9 s late, and the lease lasts
    0.6 s: the reply that grants the lock (the acquire script's on a free lock;
    on a held one, the claim of a waiter that read its ring too late to take
    it as the grant) comes after the lease it grants ran out, dated from when
    the call was sent. Before, ``acquire`` returned that lease, already lost: the
    caller entered its critical section holding nothing, and learnt it only
    from ``LeaseLost`` at its release (found by an outside attack). Now the
    lock asks Redis again, and returns a lease only from a reply in time."""
    settings = {"lease_ms": 600, "poll_ms": 300}
    proxy = fault_proxy(redis_url)
    client = AsyncRedis.from_url(proxy.url)
    lock = FifoLock(client, f"late-grant-{lock_was}", **settings)
    try:
        await lock.release(await lock.acquire(timeout=5))  # scripts loaded, connection open
        if lock_was == "held":
            holder = FifoLock(aredis, lock.name, **settings)
            lease_h = await holder.acquire(timeout=5)
            acquiring = asyncio.create_task(lock.acquire(timeout=30, token="w"))
            await until(lambda: queued(aredis, lock.keys, "w"), "w is queued")
            await holder.release(lease_h)  # w's grant lands, and its ring reaches w's socket
            # The fault: w's loop reads the ring too late to take it as the grant
            # (see _take_granted), and so claims it; the claim's reply is late.
            time.sleep(0.2)  # noqa: ASYNC251
            proxy.delay("down", 900)
        else:
            proxy.delay("down", 900)
            acquiring = asyncio.create_task(lock.acquire(timeout=30, token="w"))
        # The link recovers once the lock has seen a late grant (or after 15 s).
        recovered = asyncio.get_running_loop().call_later(15.0, proxy.delay, "down", 0)
        seen = _OnRecord("after the lease it granted ran out", lambda: proxy.delay("down", 0))
        logging.getLogger("redis_fifo_lock").addHandler(seen)
        try:
            lease = await acquiring
        finally:
            logging.getLogger("redis_fifo_lock").removeHandler(seen)
            recovered.cancel()
        returned = time.monotonic()
        try:
            assert lease.expires_at > returned and not lease.lost, (
                f"acquire returned a lease that ran out {returned - lease.expires_at:.3f} s "
                "before it returned: its grant's reply came after the lease it granted"
            )
            assert await holder_token(aredis, lock.keys) == "w"
        finally:
            with contextlib.suppress(LeaseLost):
                await lock.release(lease)
    finally:
        await client.aclose()


async def test_acquire_on_a_link_slower_than_its_lease_times_out_in_time(
    redis_url: str, fault_proxy: FaultProxyFactory
) -> None:
    """Every reply is 0.4 s late and the lease lasts 0.3 s, so no grant ever
    comes in time: the acquire claims again, loses its place and joins the
    queue again, call after call. Before, each call was given at least
    ``ATTEMPT_FLOOR_S`` (0.5 s) however little of the timeout was left, so
    ``acquire(timeout=1.3)`` raised ``LockTimeout`` after 2.26 s (found by an
    outside attack; 0.57 s late here, 0.92 s with a timeout of 1.5). The calls
    of one acquire now end at its timeout (or ``ATTEMPT_FLOOR_S`` after it
    began, for a shorter one), and only the withdrawal's grace
    (``WITHDRAW_GRACE_S``) may come after."""
    proxy = fault_proxy(redis_url)
    client = AsyncRedis.from_url(proxy.url)
    lock = FifoLock(client, "slow-link-timeout", lease_ms=300, poll_ms=150)
    try:
        await lock.release(await lock.acquire(timeout=5))  # scripts loaded, connection open
        proxy.delay("down", 400)
        timeout = 1.5
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            await lock.acquire(timeout=timeout)
        late_s = time.monotonic() - started - timeout
        bound_s = WITHDRAW_GRACE_S + 0.2  # scheduling slack
        assert late_s <= bound_s, (
            f"acquire(timeout={timeout}) raised {late_s:.3f} s after its timeout "
            f"(bound {bound_s:.2f} s)"
        )
    finally:
        proxy.delay("down", 0)
        await client.aclose()


async def test_a_forged_ring_never_makes_acquire_return(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis]
) -> None:
    settings = {"lease_ms": 4000, "poll_ms": 400}
    holder = FifoLock(clients(), "forged", **settings)
    waiter = FifoLock(clients(), "forged", **settings)
    lease_h = await holder.acquire(timeout=5)
    acquiring = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
    await until(lambda: queued(aredis, waiter.keys, "w"), "w is queued")

    async def doorbells() -> list[str]:
        return [_text(channel) for channel in await aredis.pubsub_channels("*doorbell*")]

    await until(doorbells, "w's doorbell is subscribed")
    # Anyone with PUBLISH rights can send this; the lock never granted fence 999.
    channel, ring = await forged_ring(aredis, waiter.keys, "w", 999)
    assert await aredis.publish(channel, ring) == 1
    done, _ = await asyncio.wait({acquiring}, timeout=1.0)  # two polls and more
    if done:
        forged = acquiring.result()
        await holder.release(lease_h)
        with pytest.raises(LockError):
            await waiter.release(forged)
        pytest.fail(f"acquire() returned {forged!r} on a forged ring while the holder was inside")
    await holder.release(lease_h)
    lease_w = await acquiring
    assert lease_w.fence != 999
    await waiter.release(lease_w)


# --- item 2: late copies of acquire, withdraw and release ----------------------------------


async def test_a_late_copy_of_an_acquire_granted_and_released_changes_nothing(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = ScriptCalls(monkeypatch)
    settings = {"lease_ms": 5000, "poll_ms": 500}
    lock = FifoLock(clients(), "late-acquire", **settings)
    mark = calls.mark()
    lease = await lock.acquire(timeout=5, token="first")
    copies = calls.since(mark, mentioning="first")
    assert copies, "acquire made no script call naming its token"
    await lock.release(lease)
    for copy in copies:  # redis-py's re-sent copy, arriving after grant and release
        await copy.replay(aredis)
    queue = await aredis.zrange(lock.keys.key("queue"), 0, -1)
    held_by = await holder_token(aredis, lock.keys)
    newcomer = FifoLock(clients(), "late-acquire", **settings)
    started = time.monotonic()
    try:
        lease_n = await newcomer.acquire(timeout=1.0)
    except LockTimeout:
        waited = "not within 1 s"
    else:
        waited = f"{time.monotonic() - started:.3f} s"
        await newcomer.release(lease_n)
    assert (queue, held_by) == ([], None), (
        f"the late copy left queue {queue} and holder {held_by}; a new caller got the free "
        f"lock {waited}"
    )
    assert waited != "not within 1 s"
    assert time.monotonic() - started < 0.5, f"a new caller waited {waited} for a free lock"


async def test_a_late_copy_of_a_withdrawal_never_gives_away_a_later_grant_of_the_same_token(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = ScriptCalls(monkeypatch)
    settings = {"lease_ms": 5000, "poll_ms": 500}
    holder = FifoLock(clients(), "late-withdraw", **settings)
    lock = FifoLock(clients(), "late-withdraw", **settings)
    lease_h = await holder.acquire(timeout=5)
    mark = calls.mark()
    with pytest.raises(LockTimeout):
        await lock.acquire(timeout=0.3, token="v")  # queued, then withdrawn
    copies = calls.since(mark, mentioning="v")  # its acquire and its withdrawal
    again = asyncio.create_task(lock.acquire(timeout=10, token="v"))  # the same token, later
    await until(lambda: queued(aredis, lock.keys, "v"), "v is queued again")
    nxt = FifoLock(clients(), "late-withdraw", **settings)
    next_waits = asyncio.create_task(nxt.acquire(timeout=15, token="n"))
    await until(lambda: queued(aredis, lock.keys, "n"), "n is queued")
    await holder.release(lease_h)
    lease_v = await again
    for copy in copies:  # the first request's copies arrive only now
        await copy.replay(aredis)
    held_by = await holder_token(aredis, lock.keys)
    done, _ = await asyncio.wait({next_waits}, timeout=0.5)
    try:
        assert held_by == "v", f"after the late copies the lock is held by {held_by}, not v"
        assert not done, "n was granted the lock while v still held it"
    finally:
        # Judged above; today this release may find the lock given away.
        with contextlib.suppress(LeaseLost):
            await lock.release(lease_v)
        lease_n = await next_waits
        await nxt.release(lease_n)


async def test_a_release_sent_again_after_a_hundred_later_grants_is_already_released(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = ScriptCalls(monkeypatch)
    lock = FifoLock(clients(), "old-release", lease_ms=5000, poll_ms=500)
    lease = await lock.acquire(timeout=5, token="old")
    mark = calls.mark()
    await lock.release(lease)
    copies = calls.since(mark, mentioning="old")
    assert copies, "release made no script call naming its token"
    for _ in range(100):
        later = await lock.acquire(timeout=5)
        await lock.release(later)
    codes = [reply_code(await copy.replay(aredis)) for copy in copies]
    assert NOT_HELD not in codes, f"the re-sent release answered NOT_HELD (replies {codes})"
    assert ALREADY_RELEASED in codes, f"replies {codes}"
    assert await holder_token(aredis, lock.keys) is None


async def test_a_late_withdraw_leaves_alone_a_request_a_retry_took_over(
    aredis: AsyncRedis,
) -> None:
    """A withdraw names the call it withdraws: once a retry of the same token
    (a new call) took the queued request over, keeping its ticket, a withdraw
    of the first call arriving late changes nothing (it gave the request, or
    its grant, away before: two holders)."""
    lock = FifoLock(aredis, "late-withdraw-takeover", lease_ms=5000, poll_ms=2500)
    holder = await lock.acquire(timeout=5)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "attacker-session"
    first, retry = "proc/000000000001", "proc/000000000002"
    _, ticket, _, _ = await protocol.acquire(
        aredis, keys, "v", session, settings, call=first, floor=first
    )
    _, same_ticket, _, _ = await protocol.acquire(
        aredis, keys, "v", session, settings, call=retry, floor=first
    )
    assert same_ticket == ticket
    outcome = await protocol.withdraw(
        aredis, keys, "v", ticket, session, settings.keep_ms, first, first
    )
    assert outcome == 0, f"a late withdraw of the replaced call gave {outcome}"
    assert await aredis.zscore(keys.key("queue"), "v") == ticket
    await lock.release(holder)


async def test_a_withdrawal_asked_for_again_after_it_landed_holds_up_no_other(
    aredis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire that timed out waits for its withdrawal; its caller's own
    cancellation (``asyncio.wait_for`` a hair longer) can come just as that
    withdrawal lands, and the acquire asks for it again. That second request
    is a fact about the moment before the answer; the withdrawals owed
    meanwhile must not be held up by it (taken for one Redis did not answer,
    it made the hub pause its withdrawals for ``RETRY_AFTER_ERROR_S``, and
    the requests that timed out stayed queued, the next granted one stalling
    the lock)."""
    lock = FifoLock(aredis, "withdrawn-twice", lease_ms=5000, poll_ms=2500)
    holder = await lock.acquire(timeout=5)
    hub = hub_for(aredis)
    tasks: dict[str, asyncio.Task[Lease]] = {}
    asked: list[str] = []
    withdraw = hub.withdraw

    def choreographed(group: WaitGroup, token: str, ticket: int, call: str) -> Any:
        asked.append(token)
        if token == "a" and asked.count("a") == 1:
            tasks["b"].cancel()  # owed in the same round as a's, and sent after it
        if token == "a" and asked.count("a") == 2:
            tasks["c"].cancel()  # owed while the round that landed a's goes on
        done = withdraw(group, token, ticket, call)
        if token == "a" and asked.count("a") == 1:
            # a's caller gives up as a's withdrawal lands (wait_for's own timeout).
            done.add_done_callback(lambda _: tasks["a"].cancel())
        return done

    monkeypatch.setattr(hub, "withdraw", choreographed)
    tasks["a"] = asyncio.create_task(lock.acquire(timeout=0.5, token="a"))
    for token in ("b", "c"):
        tasks[token] = asyncio.create_task(lock.acquire(token=token))
    await until(lambda: waiting_count(lock, 3), "a, b and c are queued", timeout_s=5)
    outcomes = await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert asked.count("a") == 2, f"a's withdrawal was asked for {asked.count('a')} times"
    status = await lock.status()
    await lock.release(holder)
    assert status.waiting == 0, (
        f"{status.waiting} given-up request(s) still queued once their acquires ended: "
        "the withdrawals owed were held up"
    )


async def test_a_late_copy_of_an_earlier_call_never_takes_a_request_over(
    aredis: AsyncRedis,
) -> None:
    """Two acquire calls of one process for one token: the later one owns the
    request. A late copy of the earlier one (its floor held down by another
    request in flight) is refused, and the request stays the later call's."""
    lock = FifoLock(aredis, "late-earlier-call", lease_ms=5000, poll_ms=2500)
    holder = await lock.acquire(timeout=5)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "attacker-session"
    pinned, first, retry = "proc/000000000001", "proc/000000000002", "proc/000000000003"
    await protocol.acquire(aredis, keys, "v", session, settings, call=retry, floor=pinned)
    with pytest.raises(LockError, match="already ended"):
        await protocol.acquire(aredis, keys, "v", session, settings, call=first, floor=pinned)
    waiter = (await aredis.hget(keys.key("waiters"), "v") or b"").decode()
    assert waiter.split(" ")[3] == retry, waiter
    await lock.release(holder)


async def test_a_waiter_of_another_process_is_woken_by_the_ring_not_its_poll(
    clients: Callable[[], AsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doorbell carries every grant to its waiter's process at once: with a
    poll every 30 s, a waiter of another session is served within a second of
    the release (a ring its process could not read would leave it to its poll)."""
    settings = {"lease_ms": 60_000, "poll_ms": 30_000}
    holder = FifoLock(clients(), "rung", **settings)
    waiter_client = clients()
    waiter = FifoLock(waiter_client, "rung", **settings)
    polled = asyncio.Event()
    settle = WaitGroup._settle

    def settled(group: WaitGroup, reply: PollReply, sent: float) -> None:
        settle(group, reply, sent)
        if group.hub.client is waiter_client:
            polled.set()

    monkeypatch.setattr(WaitGroup, "_settle", settled)
    lease = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
    # Its first poll (as its group starts) has been answered: the next is 30 s away.
    await asyncio.wait_for(polled.wait(), 10)
    await holder.release(lease)
    started = time.monotonic()
    granted = await waiting
    waited = time.monotonic() - started
    await waiter.release(granted)
    assert waited < 2.0, f"the waiter was served {waited:.1f} s after the release"


async def test_a_lease_lost_while_its_process_moved_on_is_lost_at_its_release(
    aredis: AsyncRedis,
) -> None:
    """A process holds a lease while its other requests on the lock come and go
    (their floors pass the held request's number); then the lease is lost (its
    key vanishes, as after an eviction or a failover). Its late release must
    raise ``LeaseLost``: the held request is not taken for one whose process
    already had its answer."""
    lock = FifoLock(aredis, "held-below-floor", lease_ms=5000, poll_ms=2500)
    lease = await lock.acquire(timeout=5)
    for _ in range(3):
        with pytest.raises(LockTimeout):
            await lock.acquire(timeout=0)
    await aredis.delete(lock.keys.key("lease"))
    with pytest.raises(LeaseLost):
        await lock.release(lease)


async def test_a_signed_ring_is_the_grant_and_no_claim_is_sent(
    clients: Callable[[], AsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-off to a waiter of another process costs the release and the ring,
    not a third round trip: the ring is signed for the waiter's acquire call, so
    the waiter takes it as its grant without claiming it, and dates its lease
    from when it sent that call (before the grant was made)."""
    settings = {"lease_ms": 60_000, "poll_ms": 30_000}
    holder = FifoLock(clients(), "signed", **settings)
    waiter = FifoLock(clients(), "signed", **settings)
    claims: list[str] = []
    claim = waiter._protocol.claim

    async def counted(client: AsyncRedis, keys: LockKeys, token: str, *args: object) -> object:
        claims.append(token)
        return await claim(client, keys, token, *args)  # type: ignore[arg-type]

    polled: list[object] = []
    poll = waiter._protocol.poll

    async def answered(*args: object) -> object:
        reply = await poll(*args)  # type: ignore[arg-type]
        polled.append(reply)
        return reply

    monkeypatch.setattr(waiter._protocol, "claim", counted)
    monkeypatch.setattr(waiter._protocol, "poll", answered)
    lease = await holder.acquire(timeout=5)
    before_acquire = time.monotonic()
    waiting = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
    await until(lambda: queued(waiter.client, waiter.keys, "w"), "w is queued")
    # Released only once the waiter's first poll answered: that poll comes when
    # its doorbell subscription is confirmed. A ring sent before then reaches
    # nobody, the poll finds the grant instead, and a waiter woken by a poll
    # claims (CI on Valkey released that early once).
    await until(lambda: polled, "the waiter's first poll answered")
    release_called = time.monotonic()
    await holder.release(lease)
    granted = await waiting
    try:
        assert claims == [], "the waiter claimed a grant its signed ring had brought"
        # The ring's lease may be cut to the waiter's liveness (set at its acquire).
        assert before_acquire + 59 <= granted.expires_at <= release_called + 60
    finally:
        await waiter.release(granted)


@pytest.mark.parametrize("proof", ["\u00e9", "not-hex-" * 5, "0" * 39])
async def test_a_malformed_ring_leaves_the_doorbell_ringing(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis], proof: str
) -> None:
    """Anyone who may PUBLISH on the lock's channels can send any text there. A
    ring whose proof is not a digest (here: non-ASCII, not hex, too short) is
    ignored, and the doorbell goes on carrying real rings: with a poll every
    30 s, the next hand-off still comes within a second of the release."""
    settings = {"lease_ms": 60_000, "poll_ms": 30_000}
    holder = FifoLock(clients(), "malformed", **settings)
    waiter = FifoLock(clients(), "malformed", **settings)
    lease = await holder.acquire(timeout=5)
    acquiring = asyncio.create_task(waiter.acquire(timeout=20, token="w"))
    await until(lambda: queued(aredis, waiter.keys, "w"), "w is queued")
    channel, ring = await forged_ring(aredis, waiter.keys, "w", 999)

    async def watched() -> bool:
        return bool((await aredis.pubsub_numsub(channel))[0][1])

    await until(watched, "the waiter's process watches its doorbell")
    assert await aredis.publish(channel, ring.rsplit(" ", 1)[0] + " " + proof) == 1
    # A ring published after it on the same channel is read after it: once the
    # waiter was woken by this one, the malformed one has been handled.
    woken = asyncio.Event()
    group = hub_for(waiter.client).groups[(waiter.keys, waiter.settings)]
    group.waiters["w"]._hint.add_done_callback(lambda _: woken.set())
    assert await aredis.publish(channel, ring) == 1
    await asyncio.wait_for(woken.wait(), 5)
    assert not acquiring.done(), "a forged ring made acquire return"
    started = time.monotonic()
    await holder.release(lease)
    granted = await acquiring
    waited = time.monotonic() - started
    await waiter.release(granted)
    assert waited < 2.0, f"the waiter was served {waited:.1f} s after the release"


# --- late floors: a process's word about its requests, read after it changed ---------------


async def test_a_floor_sent_while_a_request_waited_never_sweeps_its_later_loss(
    aredis: AsyncRedis,
) -> None:
    """A process's request ``w`` waits in the queue (no call of it in flight), and
    the process sends another acquire, whose floor passes ``w``. A copy of that
    acquire reaches Redis late: after ``w`` was granted and evicted. Its floor
    spoke of a moment when ``w`` had no record to sweep; read now, it must not
    sweep ``w``'s loss, or ``w``'s release is told "already released" (a silent
    overlap with the next holder) instead of LeaseLost."""
    lock = FifoLock(aredis, "late-floor-loss", lease_ms=30_000, poll_ms=2500)
    holder = await lock.acquire(timeout=5)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "late-floor-session"
    waiting, later = "proc/000000000001", "proc/000000000002"
    await protocol.acquire(aredis, keys, "w", session, settings, call=waiting, floor=waiting)
    await aredis.zadd(keys.key("alive"), {session: 2**50})  # the process stays alive
    await lock.release(holder)  # w is granted (its ring goes to a session nobody reads)
    fence = int(await aredis.hget(keys.key("lease"), "fence") or 0)
    assert await lock.force_release(fence) == fence, "w was not the holder"
    # The later acquire's copy, sent while w waited, arrives only now.
    await protocol.acquire(aredis, keys, "q", session, settings, call=later, floor=later)
    outcome, _ = await protocol.release(
        aredis, keys, "w", fence, settings.keep_ms, waiting, session, waiting
    )
    assert outcome == NOT_HELD, (
        f"the evicted holder's release answered {outcome}, not NOT_HELD: the late floor "
        "swept the record of its loss"
    )


async def test_a_floor_that_listed_a_request_as_held_read_after_its_release_changes_nothing(
    aredis: AsyncRedis,
) -> None:
    """A process holds ``w`` and sends an acquire whose floor lists ``w`` as held;
    that copy is delayed. ``w`` is released, and a later message of the process
    (the same floor, ``w`` no longer listed) lets Redis drop ``w``'s record. When
    the delayed copy arrives it must not make Redis take ``w`` for held again: a
    re-sent copy of ``w``'s release would then be told NOT_HELD (a false
    LeaseLost) instead of "already released"."""
    lock = FifoLock(aredis, "late-floor-held", lease_ms=30_000, poll_ms=2500)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "late-held-session"
    held, later = "proc/000000000001", "proc/000000000002"
    grant, _, _, _ = await protocol.acquire(
        aredis, keys, "w", session, settings, call=held, floor=held
    )
    assert grant is not None
    delayed = {"call": later, "floor": f"{later}+{held.split('/')[1]}"}
    outcome, _ = await protocol.release(
        aredis, keys, "w", grant.fence, settings.keep_ms, held, session, held
    )
    assert outcome == RELEASED
    # The acquire was answered through a retry, then given up: its withdrawal
    # carries the floor without w, and w's record goes.
    _, ticket, _, _ = await protocol.acquire(
        aredis, keys, "q", session, settings, call=later, floor=later
    )
    await protocol.withdraw(aredis, keys, "q", ticket, session, settings.keep_ms, later, later)
    with pytest.raises(LockError, match="already ended"):
        await protocol.acquire(aredis, keys, "q", session, settings, **delayed)
    outcome, _ = await protocol.release(
        aredis, keys, "w", grant.fence, settings.keep_ms, held, session, held
    )
    assert outcome == ALREADY_RELEASED, (
        f"a re-sent copy of a clean release answered {outcome}: the delayed floor made "
        "Redis take the released request for held again"
    )


async def test_a_release_whose_reply_was_lost_still_hands_over_to_a_waiter_of_its_process(
    aredis: AsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release hands the lock to a waiter of its own process in its reply (no
    ring). When that reply is lost and redis-py re-sends the release, the copy
    finds the lease already released: its reply must carry the hand-over too,
    or the waiter learns of its grant only at its next poll."""
    calls = ScriptCalls(monkeypatch)
    lock = FifoLock(aredis, "resent-handover", lease_ms=30_000, poll_ms=10_000)
    holder = await lock.acquire(timeout=5)
    waiting = asyncio.create_task(lock.acquire(timeout=20, token="next"))
    await until(lambda: queued(aredis, lock.keys, "next"), "next is queued")
    # Its group's first poll is done: the next one is 10 s away.
    await until(
        lambda: any(call.script.filename == "poll.lua" for call in calls.calls),
        "the waiter's group polled once",
    )
    original = Script.run

    async def reply_lost(self: Script, client: Any, keys: list[str], args: list[Any]) -> Any:
        if self.filename == "release.lua":
            await original(self, client, keys, args)  # ran; its reply never arrived
        return await original(self, client, keys, args)

    monkeypatch.setattr(Script, "run", reply_lost)
    released = time.monotonic()
    await lock.release(holder)
    done, _ = await asyncio.wait({waiting}, timeout=5)
    monkeypatch.setattr(Script, "run", original)
    assert done, "the waiter was not handed the lock within 5 s (its poll is every 10 s)"
    took = time.monotonic() - released
    await lock.release(waiting.result())
    assert took < 2.0, f"the waiter got the lock {took:.1f} s after the release"


@pytest.mark.parametrize("late_copy", ["acquire", "claim"])
async def test_a_late_copy_of_the_lost_requests_own_call_does_not_unprotect_its_loss(
    aredis: AsyncRedis, late_copy: str
) -> None:
    """As the late-floor case above, with one more late copy before the floor: the
    lost request's own acquire (refused: it ended) or claim (not held). Nobody
    reads their replies, so they tell its process nothing: the loss must stay
    for the holder's release (found by an attack on a design that let such a
    reply count as telling the process)."""
    lock = FifoLock(aredis, "late-own-copy", lease_ms=30_000, poll_ms=2500)
    holder = await lock.acquire(timeout=5)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "late-own-session"
    waiting, later = "proc/000000000001", "proc/000000000002"
    _, ticket, _, _ = await protocol.acquire(
        aredis, keys, "w", session, settings, call=waiting, floor=waiting
    )
    await aredis.zadd(keys.key("alive"), {session: 2**50})
    await lock.release(holder)
    reply = await protocol.claim(aredis, keys, "w", ticket, settings)
    assert reply.grant is not None, "w was not granted"
    fence = reply.grant.fence
    assert await lock.force_release(fence) == fence
    if late_copy == "acquire":
        with pytest.raises(LockError, match="already ended"):
            await protocol.acquire(
                aredis, keys, "w", session, settings, call=waiting, floor=waiting
            )
    else:
        assert (await protocol.claim(aredis, keys, "w", ticket, settings)).grant is None
    await protocol.acquire(aredis, keys, "q", session, settings, call=later, floor=later)
    outcome, _ = await protocol.release(
        aredis, keys, "w", fence, settings.keep_ms, waiting, session, waiting
    )
    assert outcome == NOT_HELD, f"the evicted holder's release answered {outcome}"


async def test_a_floor_below_the_kept_one_never_sweeps_a_request_the_kept_one_lists_as_held(
    aredis: AsyncRedis,
) -> None:
    """The kept floor (from a message sent during ``w``'s hold) lists ``w`` as held.
    A late copy of an acquire sent while ``w`` still waited carries a lower
    floor, above ``w``; arriving between ``w``'s release and redis-py's re-send
    of it (its reply lost), it must not sweep ``w``'s record: the re-send is
    "already released", not NOT_HELD (a false LeaseLost). Found by an attack."""
    lock = FifoLock(aredis, "late-lower-floor", lease_ms=30_000, poll_ms=2500)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    session = "late-lower-session"
    other = await lock.acquire(timeout=5)

    def call(n: int) -> str:
        return f"proc/{n:012x}"

    _, ticket, _, _ = await protocol.acquire(
        aredis, keys, "w", session, settings, call=call(1), floor=call(1)
    )
    await aredis.zadd(keys.key("alive"), {session: 2**50})
    waited = {"call": call(3), "floor": call(3)}  # another task's acquire, while w waits
    await protocol.acquire(aredis, keys, "q", session, settings, **waited)
    await lock.release(other)  # w is granted
    reply = await protocol.claim(aredis, keys, "w", ticket, settings)
    assert reply.grant is not None
    fence = reply.grant.fence
    await protocol.acquire(  # sent during w's hold: the kept floor lists w as held
        aredis, keys, "r", session, settings, call=call(5), floor=f"{call(5)}+{call(1)[-12:]}"
    )
    released, _ = await protocol.release(
        aredis, keys, "w", fence, settings.keep_ms, call(1), session, call(1)
    )
    assert released == RELEASED
    await protocol.acquire(aredis, keys, "q", session, settings, **waited)  # the late copy
    outcome, _ = await protocol.release(
        aredis, keys, "w", fence, settings.keep_ms, call(1), session, call(1)
    )
    assert outcome == ALREADY_RELEASED, f"redis-py's re-sent release answered {outcome}"


async def test_a_floor_that_passes_a_request_granted_meanwhile_never_makes_its_loss_settled(
    aredis: AsyncRedis, clients: Callable[[], AsyncRedis]
) -> None:
    """A process's request ``w`` waits; Redis grants it (the ring or the claim's
    reply is on its way) while another call of the process, whose floor passes
    ``w`` (no call of it in flight, not held yet here), reaches Redis - in
    order, not late. ``w``'s lease then runs out before any script notices. Its
    release must be told NOT_HELD (LeaseLost: the holder worked past its
    lease), not "already released" (the floor's word that ``w`` was settled),
    which a repeat of it then contradicts. Found by ``proxy-late-copies``,
    where it looked like a false alarm on the repeated release."""
    lock = FifoLock(clients(), "granted-meanwhile", lease_ms=30_000, poll_ms=2500)
    holder = await lock.acquire(timeout=5)
    protocol, keys, settings = lock._protocol, lock.keys, lock.settings
    short = LockSettings(lease_ms=300, poll_ms=100)
    session = "granted-meanwhile-session"
    waiting, later = "proc/000000000001", "proc/000000000002"
    await protocol.acquire(aredis, keys, "w", session, short, call=waiting, floor=waiting)
    await aredis.zadd(keys.key("alive"), {session: 2**50})
    await lock.release(holder)  # w is granted, for 300 ms
    fence = int(await aredis.hget(keys.key("lease"), "fence") or 0)
    await protocol.acquire(aredis, keys, "q", session, settings, call=later, floor=later)
    await until(lambda: _lease_gone(aredis, keys), "w's lease ran out", 5)
    outcome, _ = await protocol.release(
        aredis, keys, "w", fence, settings.keep_ms, waiting, session, waiting
    )
    assert outcome == NOT_HELD, f"the release of a lease that ran out answered {outcome}"


async def _lease_gone(client: AsyncRedis, keys: LockKeys) -> bool:
    return not await client.exists(keys.key("lease"))
