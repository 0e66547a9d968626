"""Issue 11's fault kinds as adversarial scenarios.

* ``proxy-late-copies``: every contender reaches Redis through a TCP fault
  proxy (``tests/support/proxy.py``) with redis-py's own retries on and a short
  socket timeout. The proxy holds the bytes of the connections open at a
  random moment, so redis-py times out and re-sends on a new connection, then
  lets the original copies through a lease later; it also delays replies and
  resets every connection. Late copies of acquire, withdraw and release must
  change nothing.
* ``blocked-loop-grant``: a waiter whose event loop is blocked (``time.sleep``
  on its own thread's loop) right when its grant lands, for 1.5-3 leases; it
  must not enter beside the holder that Redis granted meanwhile.
* ``fork-in-hold``: a process forks inside ``with lock.hold()`` (the sync
  facade); the child leaves the block (and so tries to release) and exits. The parent's
  grant must stay: nobody enters while the parent is still inside.
* ``restricted-acl``: some contenders authenticate as a user whose channels
  deny ``PUBLISH``; nobody stalls, no grant is left behind a failed call.

They are registered in ``AWAITING_MUTANTS``: the mutants issue 11 designates
for them (a lease dated from the ring, a history bounded by count, withdraw by
token alone, no withdrawal of abandoned requests, a fence counter restarting at
1) belong to the redesigned protocol and do not exist yet. Against today's lock
they find the bugs of issue 11.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import cast
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import RedisError

import redis_fifo_lock.protocol as protocol_module
import redis_fifo_lock.waiting as waiting_module
from redis_fifo_lock import FifoLock, RedisUnavailable
from redis_fifo_lock.doorbell import (
    CONFIRM_TIMEOUT_S,
    IDLE_PROBE_S,
    IDLE_PROBE_TIMEOUT_S,
    PROBE_TIMEOUT_S,
)
from redis_fifo_lock.protocol import CALL_TIMEOUT_S
from redis_fifo_lock.waiting import RETRY_AFTER_ERROR_S, hub_for
from tests.adversarial.actors import Plan
from tests.adversarial.arena import Arena
from tests.adversarial.clients import StagedRedis
from tests.adversarial.driver import ROOT
from tests.adversarial.registry import LEASE_MS, Context, Outcome, outcome, scenario
from tests.support.polling import until
from tests.support.proxy import (
    FaultProxy,
    hold_the_subscription_only,
    lose_the_reconnection_handshake,
    taken_for_dead,
    watch_through_a_lost_handshake,
)
from tests.support.record import read_lines

# --- proxy-late-copies --------------------------------------------------------------

PROXY_FAULT_MS = 300
"""How long a delay or a reset counts as a pause for the checker: the delay lasts
0.3 s, and a reset's reconnections and redis-py's retries about as long."""


class ProxiedArena(Arena):
    """An arena whose contenders reach Redis through ``proxy`` (the admin client
    does not), with redis-py's retries on and a socket timeout of ``timeout_s``."""

    def __init__(
        self, ctx: Context, url: str, name: str, proxy: FaultProxy, timeout_s: float
    ) -> None:
        super().__init__(ctx, url, name)
        self.proxy = proxy
        self.timeout_s = timeout_s

    def client(self, who: str, *, retries: bool = True) -> StagedRedis:
        client = cast(
            StagedRedis,
            StagedRedis.from_url(
                self.proxy.url, client_name=f"adv-{who}", socket_timeout=self.timeout_s
            ),
        )
        self.clients.append(client)
        return client


async def _proxy_faults(arena: ProxiedArena, stop: asyncio.Event) -> None:
    """Until ``stop``: hold a direction of the current connections so redis-py
    re-sends, release the held bytes a lease later; delay; reset."""
    rng = arena.ctx.rng
    proxy = arena.proxy
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0.1, 0.4))  # a random moment
        kind = rng.choice(("hold-up", "hold-down", "delay", "reset"))
        if kind.startswith("hold"):
            direction = "up" if kind == "hold-up" else "down"
            late_ms = rng.uniform(0.5, 1.5) * LEASE_MS  # the original copies arrive this late
            # For the connections it holds, this is a server pause: it may cost a
            # holder its lease (loudly) and a waiter its place, as a pause does.
            arena.faults.fault("pause", f"{round(late_ms)}ms")
            proxy.hold(direction, current_only=True)  # type: ignore[arg-type]
            proxy.release(direction, after_ms=late_ms)  # type: ignore[arg-type]
            continue
        # Slow replies and cut connections are a short outage for the calls they
        # catch (a renewal retried by redis-py with its back-off can outlast a
        # 400 ms lease): like a pause, they may cost a lease, loudly, and a place
        # in the queue; never an overlap.
        arena.faults.fault("pause", f"{PROXY_FAULT_MS}ms")
        if kind == "delay":
            proxy.delay("down", rng.uniform(20, 150))
            await asyncio.sleep(0.3)  # the fault itself: replies are slow this long
            proxy.delay("down", 0)
        else:
            proxy.reset()


@scenario(
    "proxy-late-copies",
    kills=(),
    faults="a TCP proxy that black-holes, delays and resets connections, so redis-py's "
    "retries re-send scripts and the originals arrive late",
)
async def proxy_late_copies(ctx: Context) -> Outcome:
    """Six contenders, each 4 requests, through the fault proxy; the checker judges."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    with FaultProxy(host, server.port) as proxy:
        arena = ProxiedArena(ctx, server.url, "proxied", proxy, timeout_s=0.25)
        stop = asyncio.Event()
        try:
            await arena.load_scripts()
            faults = asyncio.create_task(_proxy_faults(arena, stop))

            async def contender(who: str) -> None:
                lock, actor = arena.contender(who)
                for round_ in range(4):
                    hold_s = ctx.rng.uniform(0.0, 1.5) * LEASE_MS / 1000
                    token = f"{who}.{round_}.{ctx.rng.getrandbits(20):05x}"
                    plan = Plan(hold_s, timeout_s=8, repeat_release=True, retry_s=4.0)
                    await actor.attempt(lock, token, plan)

            await asyncio.gather(*(contender(f"p{n}") for n in range(6)))
            stop.set()
            await faults
            proxy.release("up")
            proxy.release("down")
            proxy.delay("down", 0)
            await asyncio.sleep(2 * LEASE_MS / 1000)  # the last late copies arrive
            problems += await arena.consistent()
        finally:
            stop.set()
            await arena.close()
    # Held bytes may cost a waiter its place (FIFO excused, as for a pause), but
    # never excuse an overlap: a holder must see lease.lost before Redis moves on.
    return outcome(ctx, "proxy-late-copies", problems, unexcused=frozenset({"pause"}))


# --- blocked-loop-grant -----------------------------------------------------------------


@scenario(
    "blocked-loop-grant",
    kills=(),
    faults="a waiter's event loop blocked (time.sleep) for 1.5-3 leases right when its grant lands",
)
async def blocked_loop_grant(ctx: Context) -> Outcome:
    """A holder and waiter ``w1`` share a loop on a thread of their own; the holder
    releases and that loop is blocked at once. Waiters on this loop go on."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "blocked")
    block_s = ctx.rng.uniform(1.5, 3.0) * LEASE_MS / 1000
    w1_queued, others_queued = threading.Event(), threading.Event()
    errors: list[str] = []

    async def blocked_side() -> None:
        side = Arena(ctx, server.url, "blocked")  # clients of this thread's loop
        try:
            lock_h, actor_h, lease_h = await side.enter("h")
            w1, _ = side.waiter("w1", Plan(0.05, timeout_s=10))
            await side.until(lambda: _queued(side, "w1-"), "w1 is queued")
            w1_queued.set()
            if not await asyncio.to_thread(others_queued.wait, 10):
                errors.append("the other waiters never queued")
            side.record.exit(lease_h)
            await actor_h.release(lock_h, lease_h, Plan(0))  # the grant to w1 lands ...
            time.sleep(block_s)  # noqa: ASYNC251 - ... and this loop is blocked (the fault)
            # Recorded as a stall of this process: it may cost w1 its place in the
            # queue (FIFO excused), but never excuses an overlap (unexcused below).
            side.faults.fault("lag", f"{round(block_s * 1000)}ms")
            await w1
        finally:
            await side.close()

    def run_side() -> None:
        try:
            asyncio.run(blocked_side())
        except Exception as exc:  # reported as the scenario's own failure
            errors.append(f"CRASH: the blocked side stopped: {exc!r}")

    thread = threading.Thread(target=run_side, name="blocked-loop", daemon=True)
    thread.start()
    try:
        if not await asyncio.to_thread(w1_queued.wait, 10):
            raise AssertionError("w1 never queued")
        waiters = []
        for who in ("b", "c"):
            task, token = arena.waiter(who, Plan(1.5 * LEASE_MS / 1000, timeout_s=10))
            await arena.until(partial(arena.queued, token), f"{who} is queued")
            waiters.append((task, token))
        others_queued.set()
        for task, token in waiters:
            errors.extend(await arena.served(task, token, 10.0))
        await asyncio.to_thread(thread.join, 20)
        errors.extend(await arena.consistent())
    finally:
        others_queued.set()
        await arena.close()
    # A blocked waiter is no excuse: "lag" would excuse holders, and none is recorded.
    return outcome(ctx, "blocked-loop-grant", errors, unexcused=frozenset({"lag"}))


def _queued(arena: Arena, prefix: str) -> bool:
    return any(
        line.kind == "queued" and line.fields[0].startswith(prefix)
        for line in read_lines(arena.record.path)
    )


# --- fork-in-hold -----------------------------------------------------------------------

FORKER = "tests.adversarial.forker"


@scenario(
    "fork-in-hold",
    kills=(),
    faults="fork() inside with lock.hold() (sync); the child leaves the block and exits",
)
async def fork_in_hold(ctx: Context) -> Outcome:
    """A process forks while holding; its child exits through ``hold()``. Two
    waiters queue behind; nobody may enter while the parent is inside."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "forked")
    problems: list[str] = []
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            FORKER,
            server.url,
            str(arena.record.path),
            str(3 * LEASE_MS),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None and process.stdin is not None
        line = await asyncio.wait_for(process.stdout.readline(), 10)
        if line.strip() != b"inside":
            raise AssertionError(f"the forking holder said {line!r}, not 'inside'")
        waiters = []
        for who in ("b", "c"):
            task, token = arena.waiter(who, Plan(0.02, timeout_s=10))
            await arena.until(partial(arena.queued, token), f"{who} is queued")
            waiters.append((task, token))
        process.stdin.write(b"fork\n")  # the fault: fork now
        await process.stdin.drain()
        child = await asyncio.wait_for(process.stdout.readline(), 10)
        problems += [f"forker: {child.decode().strip()}"] if child.startswith(b"error") else []
        for task, token in waiters:
            problems += await arena.served(task, token, 10.0)
        await asyncio.wait_for(process.wait(), 10)
        problems += await arena.consistent()
    finally:
        with contextlib.suppress(ProcessLookupError, UnboundLocalError):
            if process.returncode is None:
                process.kill()
        await arena.close()
    return outcome(ctx, "fork-in-hold", problems)


# --- restricted-acl ---------------------------------------------------------------------

ACL_USER, ACL_PASSWORD = "nopublish", "adv-s3cret"


class AclArena(Arena):
    """An arena whose contenders named ``r*`` authenticate as a user who may not
    publish (nor subscribe)."""

    def client(self, who: str, *, retries: bool = True) -> StagedRedis:
        if not who.startswith("r"):
            return super().client(who, retries=retries)
        client = cast(
            StagedRedis,
            StagedRedis.from_url(
                self.url, client_name=f"adv-{who}", username=ACL_USER, password=ACL_PASSWORD
            ),
        )
        self.clients.append(client)
        return client

    def lock(self, client: Redis) -> FifoLock:
        # Not recorded through RecordingProtocol: a permission error is the fault
        # injected here, not a Lua error the lock caused.
        lock: FifoLock = super().lock(client)
        inner = getattr(lock._protocol, "inner", None)
        if inner is not None:
            lock._protocol = inner
        return lock


@scenario(
    "restricted-acl",
    kills=(),
    faults="contenders authenticated as an ACL user whose channels deny PUBLISH",
)
async def restricted_acl(ctx: Context) -> Outcome:
    """Restricted and default contenders take turns; every request that ends with
    an error leaves nothing behind, and every default contender is served."""
    server = ctx.servers()
    admin = Redis.from_url(server.url)
    await admin.acl_setuser(
        ACL_USER,
        enabled=True,
        passwords=[f"+{ACL_PASSWORD}"],
        keys=["*"],
        commands=["+@all"],
        reset_channels=True,
    )
    await admin.aclose()
    arena = AclArena(ctx, server.url, "restricted", lease_ms=2000, poll_ms=200)
    problems: list[str] = []
    try:
        await arena.load_scripts()

        async def contender(who: str) -> None:
            lock, actor = arena.contender(who)
            for round_ in range(4):
                token = f"{who}.{round_}.{ctx.rng.getrandbits(20):05x}"
                plan = Plan(ctx.rng.uniform(0, 0.2), timeout_s=8)
                await actor.attempt(lock, token, plan)

        await asyncio.gather(*(contender(who) for who in ("r1", "r2", "d1", "d2")))
        problems += await arena.consistent()
    finally:
        await arena.close()
    # A default contender waits at most a lease behind a grant left by a failed call.
    found = outcome(ctx, "restricted-acl", problems, handoff_ms=1000)
    # A restricted contender's call may be refused (the fault itself); what it must
    # not do is leave something behind, which the other checks judge.
    found.report.violations = [v for v in found.report.violations if not _refused_by_acl(v)]
    return found


def _refused_by_acl(violation: str) -> bool:
    """Whether ``violation`` only says a restricted (``r*``) contender's call was refused."""
    restricted = " r1." in violation or " r2." in violation or ", r1." in violation
    restricted = restricted or ", r2." in violation
    return restricted and "ResponseError" in violation


# --- silent-without-socket-timeout ------------------------------------------------------


@scenario(
    "silent-without-socket-timeout",
    kills=("call-unbounded",),
    faults="a proxy that black-holes both directions, under a client with no "
    "socket_timeout and no redis-py retries",
)
async def silent_without_socket_timeout(ctx: Context) -> Outcome:
    """A holder's release, a status and a waiter's acquire without a timeout,
    sent into a silence, each end with ``RedisUnavailable`` within the lock's own
    call bound (``CALL_TIMEOUT_S``): nothing else bounds them on this client."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    with FaultProxy(host, server.port) as proxy:
        client = Redis.from_url(proxy.url, socket_timeout=None, retry=Retry(NoBackoff(), 0))
        try:
            lock = FifoLock(client, "silent", lease_ms=60_000, poll_ms=30_000)
            waiter = FifoLock(client, "silent-waiter", lease_ms=60_000, poll_ms=30_000)
            await waiter.release(await waiter.acquire(timeout=5))  # scripts and checks done
            lease = await lock.acquire(timeout=5)
            proxy.hold("up")
            proxy.hold("down")
            calls = {
                "release": lock.release(lease),
                "status": lock.status(),
                "acquire": waiter.acquire(),
            }
            tasks = {name: asyncio.create_task(call) for name, call in calls.items()}
            await asyncio.wait(tasks.values(), timeout=CALL_TIMEOUT_S + 5)
            proxy.release("up", deliver=False)
            proxy.release("down", deliver=False)
            proxy.reset()
            for name, task in tasks.items():
                if not task.done():
                    problems.append(
                        f"{name}() had not returned {CALL_TIMEOUT_S + 5:g} s into the silence"
                    )
                    task.cancel()
                elif task.cancelled() or not isinstance(task.exception(), RedisUnavailable):
                    problems.append(f"{name}() ended with {task!r}, not RedisUnavailable")
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        finally:
            await client.aclose()
    return outcome(ctx, "silent-without-socket-timeout", problems)


# --- cancel-at-the-bound -----------------------------------------------------------------

BOUND_S = 0.2
"""The lock's call bound in ``cancel-at-the-bound`` (``CALL_TIMEOUT_S``, 5 s
otherwise): short, so that many trials fit in a few seconds."""
CANCEL_OFFSETS_MS = [offset / 10 for offset in range(-5, 26)]
"""When each trial cancels its acquire: this many ms after the bound of its
call, counted from the acquire's start, runs out. The bound starts a little
after the acquire does, and a loop's timers fire up to a millisecond late, so
the sweep covers the moment the bound fires from both sides."""


@scenario(
    "cancel-at-the-bound",
    kills=("bound-eats-cancel",),
    faults="a proxy that black-holes both directions, under a client with no "
    "socket_timeout and no redis-py retries, and a cancellation of the acquire "
    "swept across the moment the lock's call bound runs out",
)
async def cancel_at_the_bound(ctx: Context) -> Outcome:
    """An acquire sent into a silence, cancelled near the moment the lock's own
    bound of its call runs out: if the cancellation reached the task before it
    ended, the task must end cancelled, never as an outage. A bound that takes
    every cancellation at its expiry for its own (as ``async_timeout`` does on
    Python 3.10) turned a cancelled waiter into a retrying one, which kept
    ``asyncio.run`` from closing."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    clients: list[Redis] = []
    saved = protocol_module.CALL_TIMEOUT_S
    with FaultProxy(host, server.port) as proxy:
        try:
            for trial, offset_ms in enumerate(CANCEL_OFFSETS_MS):
                client = Redis.from_url(proxy.url, socket_timeout=None, retry=Retry(NoBackoff(), 0))
                clients.append(client)
                lock = FifoLock(client, f"bound-{trial}", lease_ms=60_000, poll_ms=30_000)
                # Scripts and checks done under the usual bound: on a busy
                # machine a 0.2 s one cut this set-up off, and crashed the run.
                protocol_module.CALL_TIMEOUT_S = saved
                await lock.release(await lock.acquire(timeout=5))
                protocol_module.CALL_TIMEOUT_S = BOUND_S
                proxy.hold("up")
                proxy.hold("down")
                delivered: list[bool] = []

                async def acquire(
                    lock: FifoLock = lock,
                    offset_ms: float = offset_ms,
                    delivered: list[bool] = delivered,
                ) -> object:
                    task = asyncio.current_task()
                    assert task is not None
                    # Whether the cancellation reached the task before it ended.
                    loop.call_at(
                        loop.time() + BOUND_S + offset_ms / 1000,
                        lambda: delivered.append(task.cancel()),
                    )
                    return await lock.acquire()

                waiter = asyncio.create_task(acquire())
                await asyncio.wait({waiter}, timeout=BOUND_S + 3)
                proxy.release("up", deliver=False)
                proxy.release("down", deliver=False)
                proxy.reset()
                if not waiter.done():
                    problems.append(
                        f"trial {trial}: an acquire cancelled {offset_ms:+.1f} ms after its "
                        "call's bound ran out had not ended 3 s later"
                    )
                    waiter.cancel()
                elif delivered == [True] and not waiter.cancelled():
                    problems.append(
                        f"trial {trial}: an acquire cancelled {offset_ms:+.1f} ms after its "
                        f"call's bound ran out ended with {waiter!r}, not cancelled: the "
                        "bound took the caller's cancellation for its own"
                    )
                await asyncio.gather(waiter, return_exceptions=True)
        finally:
            protocol_module.CALL_TIMEOUT_S = saved
            for client in clients:
                await client.aclose()
    return outcome(ctx, "cancel-at-the-bound", problems)


# --- half-open-doorbell, reconnect-during-probe, reset-without-retries ------------

LINGERING_SETTINGS = {"lease_ms": 6000, "poll_ms": 3000}
"""Long enough that a wait served only by its first poll (3 s) stands out from
one served by its probe (``PROBE_TIMEOUT_S``) or a catch-up poll."""
HALF_OPEN_WAITS = 4
RESET_SERVED_S = 0.8 * RETRY_AFTER_ERROR_S
"""Bound on a hand-off after every connection of the waiter's client was reset."""


async def _timed_hand_off(
    holder: FifoLock,
    waiter: FifoLock,
    before_release: Callable[[], Awaitable[object]] | None = None,
    after_release: Callable[[], Awaitable[object]] | None = None,
) -> float:
    """One hand-off from ``holder`` to a queued ``waiter``: seconds from the
    release call to the waiter's acquire returning (the waiter then releases).
    The hooks are awaited once the waiter is queued, and once the release
    returned."""
    held = await holder.acquire(timeout=5)
    waiting = asyncio.create_task(waiter.acquire(timeout=60))

    async def queued() -> bool:
        return (await holder.status()).waiting > 0

    await until(queued, "the waiter is queued", pause_s=0.005)
    if before_release is not None:
        await before_release()
    released = time.monotonic()
    await holder.release(held)
    if after_release is not None:
        await after_release()
    lease = await waiting
    took = time.monotonic() - released
    await waiter.release(lease)
    return took


@scenario(
    "half-open-doorbell",
    kills=("probe-skipped",),
    faults="the connection of a lingering doorbell channel goes half-open: a proxy "
    "keeps what Redis sends on it, with no error on either side",
)
async def half_open_doorbell(ctx: Context) -> Outcome:
    """One waiter process taking a lock again and again, its doorbell channel
    lingering between waits, and that connection silently dead: the first wait
    after it must be served within the probe's bound, not at its first poll,
    and every later one at once, on a rebuilt subscription."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    admin = Redis.from_url(server.url)
    with FaultProxy(host, server.port) as proxy:
        client = Redis.from_url(proxy.url)
        try:
            holder = FifoLock(admin, "half-open", **LINGERING_SETTINGS)
            waiter = FifoLock(client, "half-open", **LINGERING_SETTINGS)
            for wait in range(HALF_OPEN_WAITS + 1):
                if wait == 1:  # the channel lingers: its connection goes half-open
                    await hold_the_subscription_only(client, proxy)
                took = await _timed_hand_off(holder, waiter)
                bound = PROBE_TIMEOUT_S + 0.5 if wait == 1 else 0.5
                if took > bound:
                    problems.append(
                        f"wait {wait} was served {took:.2f} s after the release (bound "
                        f"{bound:.1f} s): a ring lost on the silent connection waited for a poll"
                    )
        finally:
            await client.aclose()
            await admin.aclose()
    return outcome(ctx, "half-open-doorbell", problems)


@scenario(
    "reconnect-handshake-lost",
    kills=("unconfirmed-subscribe-trusted",),
    faults="a client with no socket_timeout; the subscription's connection is cut and "
    "the handshake reply of redis-py's reconnection, inside the reader, is lost",
)
async def reconnect_handshake_lost(ctx: Context) -> Outcome:
    """The doorbell's reader is left waiting for ever in redis-py's
    reconnection (no ``socket_timeout``, as ``LoopClients`` builds on Python
    3.11+). Waits on other locks of the process must still be rung: each new
    channel's SUBSCRIBE, unconfirmed with nothing read, rebuilds the
    subscription; none is served at its first poll (15 s)."""
    settings = {"lease_ms": 30_000, "poll_ms": 15_000}
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    admin = Redis.from_url(server.url)
    with FaultProxy(host, server.port) as proxy:
        client = Redis.from_url(proxy.url, socket_timeout=None)
        kept = await FifoLock(admin, "watched", **settings).acquire(timeout=5)
        watching = asyncio.create_task(FifoLock(client, "watched", **settings).acquire(timeout=60))
        try:

            async def subscribed() -> bool:
                return bool(await admin.pubsub_channels("*watched*doorbell*"))

            await until(subscribed, "the waiter subscribed", pause_s=0.01)
            await lose_the_reconnection_handshake(client, admin, proxy)
            for wait in range(2):
                name = f"after-the-cut-{wait}"
                took = await _timed_hand_off(
                    FifoLock(admin, name, **settings), FifoLock(client, name, **settings)
                )
                if took > CONFIRM_TIMEOUT_S + 1.5:
                    problems.append(
                        f"a wait on {name!r} was served {took:.2f} s after the release: the "
                        "subscription stuck in its reconnection was not rebuilt"
                    )
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await FifoLock(admin, "watched", **settings).release(kept)
            await client.aclose()
            await admin.aclose()
    return outcome(ctx, "reconnect-handshake-lost", problems)


@scenario(
    "subscribe-reconnect-unanswered",
    kills=("unbounded-pubsub-send",),
    faults="a client with no socket_timeout and no retries; the subscription's connection "
    "is reset and the reader's reconnection refused; a watch's SUBSCRIBE (a new channel's, "
    "then a lingering one's probe) reconnects it inside the call, and the handshake's "
    "reply is lost",
)
async def subscribe_reconnect_unanswered(ctx: Context) -> Outcome:
    """A SUBSCRIBE the doorbell sends while its reader waits to rebuild a
    broken subscription reconnects the connection inside the call; with the
    handshake's reply lost, redis-py would wait for it for ever, and the watch
    with it, holding the doorbell's lock (every other watch, and the rebuild).
    Each watch must return within ``CONFIRM_TIMEOUT_S`` + 2 s, the rebuilt
    subscription ring both channels."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    admin = Redis.from_url(server.url)
    try:
        for second_lingers in (False, True):
            with FaultProxy(host, server.port) as proxy:
                # Looked up now: a mutant replaces the class in that module.
                problem = await watch_through_a_lost_handshake(
                    admin, proxy, waiting_module.Doorbell, second_lingers=second_lingers
                )
            if problem:
                problems.append(problem)
    finally:
        await admin.aclose()
    return outcome(ctx, "subscribe-reconnect-unanswered", problems)


@scenario(
    "slow-link-quiet-subscription",
    kills=("slow-answer-taken-for-dead",),
    faults="every reply to the waiter's client is delayed 0.7 s (a slow link) while its "
    "subscription stays quiet for two idle periods",
)
async def slow_link_quiet_subscription(ctx: Context) -> Outcome:
    """A slow connection is not a dead one: over two quiet periods
    (``IDLE_PROBE_S``) of a waiter whose replies all come 0.7 s late, the
    idle probes are answered late and the subscription is never rebuilt (each
    rebuild opens a connection and makes every watched group poll); then the
    waiter is rung."""
    problems: list[str] = []

    async def quiet_and_slow(client: Redis, admin: Redis, proxy: FaultProxy) -> None:
        proxy.delay("down", 700)
        taken = taken_for_dead(hub_for(client).doorbell)
        await asyncio.sleep(2 * IDLE_PROBE_S + 1.0)  # the span under test
        if taken:
            problems.append(
                f"the slow subscription was taken for dead {len(taken)} time(s) in two quiet "
                f"periods ({taken[0]} unanswered)"
            )

    took = await _rung_behind_a_fault(ctx, "slow-link", {}, quiet_and_slow)
    if took > 3.0:
        problems.append(f"the waiter was served {took:.2f} s after the release")
    return outcome(ctx, "slow-link-quiet-subscription", problems)


@scenario(
    "watched-reconnect-handshake-lost",
    kills=("quiet-subscription-trusted",),
    faults="a client with no socket_timeout; while its one waiter is subscribed, the "
    "subscription's connection is cut and the reply to redis-py's reconnection handshake "
    "is lost; no new wait follows",
)
async def watched_reconnect_handshake_lost(ctx: Context) -> Outcome:
    """As ``reconnect-handshake-lost``, but no new wait sends a SUBSCRIBE that
    would find the connection dead: the waiter already subscribed must still
    be rung, the subscription that read nothing for ``IDLE_PROBE_S`` probed and
    rebuilt; not served at its first poll (15 s). Twice, on one client."""
    bound = IDLE_PROBE_S + IDLE_PROBE_TIMEOUT_S + 2.0
    took = await _rung_behind_a_fault(
        ctx, "watched", {"socket_timeout": None}, lose_the_reconnection_handshake, waits=2
    )
    problems = [
        f"a wait was served {took:.2f} s after the release (bound {bound:g} s): the quiet "
        "subscription was never probed"
    ]
    return outcome(ctx, "watched-reconnect-handshake-lost", problems if took > bound else [])


async def _rung_behind_a_fault(
    ctx: Context,
    name: str,
    client_options: dict[str, object],
    fault: Callable[[Redis, Redis, FaultProxy], Awaitable[object]],
    waits: int = 1,
) -> float:
    """The longest of ``waits`` hand-offs (lease 30 s, poll 15 s) to a waiter
    whose client (``client_options``) goes through a fault proxy: seconds from
    the release call to its acquire returning. ``fault(client, admin, proxy)``
    is awaited once the waiter is queued and its doorbell subscribed."""
    settings = {"lease_ms": 30_000, "poll_ms": 15_000}
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    admin = Redis.from_url(server.url)
    longest = 0.0
    with FaultProxy(host, server.port) as proxy:
        client = Redis.from_url(proxy.url, **client_options)

        async def subscribed_then_fault() -> None:
            async def subscribed() -> bool:
                return bool(await admin.pubsub_channels(f"*{name}*doorbell*"))

            await until(subscribed, "the waiter subscribed", pause_s=0.01)
            await fault(client, admin, proxy)

        try:
            for _ in range(waits):
                took = await _timed_hand_off(
                    FifoLock(admin, name, **settings),
                    FifoLock(client, name, **settings),
                    subscribed_then_fault,
                )
                longest = max(longest, took)
        finally:
            await client.aclose()
            await admin.aclose()
    return longest


@scenario(
    "reconnect-during-probe",
    kills=("reconnect-taken-for-answer",),
    faults="a client with retries; the lingering channel's connection reset while "
    "the wait's probe and the ring are on it: redis-py reconnects and subscribes again",
)
async def reconnect_during_probe(ctx: Context) -> Outcome:
    """A wait reuses a lingering channel; its probe's answer and then the ring
    are held on the subscription's connection, which is reset: redis-py (with
    retries) reconnects and subscribes the channel again on its own. The
    waiter must be served at once (its group catches up), never at its first
    poll, in each of three rounds."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    admin = Redis.from_url(server.url)
    with FaultProxy(host, server.port) as proxy:
        client = Redis.from_url(proxy.url, retry=Retry(ExponentialBackoff(), 3))
        try:
            holder = FifoLock(admin, "reconnected", **LINGERING_SETTINGS)
            waiter = FifoLock(client, "reconnected", **LINGERING_SETTINGS)
            await _timed_hand_off(holder, waiter)  # the channel lingers
            for round_ in range(3):
                await hold_the_subscription_only(client, proxy)
                held: list[int] = []

                async def probe_answered(held: list[int] = held) -> None:
                    await until(lambda: proxy.held_bytes("down") > 0, "the probe was answered")
                    held.append(proxy.held_bytes("down"))

                async def ring_held_then_reset(held: list[int] = held) -> None:
                    await until(lambda: proxy.held_bytes("down") > held[0], "the ring is held")
                    proxy.reset()

                took = await _timed_hand_off(holder, waiter, probe_answered, ring_held_then_reset)
                if took > 1.0:
                    problems.append(
                        f"round {round_}: served {took:.2f} s after the release: the "
                        "reconnection's confirmation was taken for the probe's answer, and "
                        "the ring lost in the gap waited for a poll"
                    )
        finally:
            await client.aclose()
            await admin.aclose()
    return outcome(ctx, "reconnect-during-probe", problems)


@scenario(
    "reset-without-retries",
    kills=("poll-retry-paused",),
    faults="a client with no retries; every connection of it reset (as by a restart "
    "or a proxy) while its wait is queued on a lingering channel",
)
async def reset_without_retries(ctx: Context) -> Outcome:
    """The ring goes to nobody and the group's catch-up poll meets a dead pooled
    connection, which redis-py (no retries) reports and drops: the poll must be
    tried again at once on a new connection, so that each of three waits is
    served well within ``RETRY_AFTER_ERROR_S`` of the release."""
    server = ctx.servers()
    host = urlsplit(server.url).hostname or "127.0.0.1"
    problems: list[str] = []
    admin = Redis.from_url(server.url)
    with FaultProxy(host, server.port) as proxy:
        client = Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
        try:
            holder = FifoLock(admin, "reset-all", **LINGERING_SETTINGS)
            waiter = FifoLock(client, "reset-all", **LINGERING_SETTINGS)
            await _timed_hand_off(holder, waiter)  # the channel lingers

            async def reset() -> None:
                proxy.reset()

            for round_ in range(3):
                took = await _timed_hand_off(holder, waiter, reset)
                if took > RESET_SERVED_S:
                    problems.append(
                        f"round {round_}: served {took:.2f} s after the release: the poll "
                        "that met the dead connection waited before it was tried again"
                    )
        finally:
            await client.aclose()
            await admin.aclose()
    return outcome(ctx, "reset-without-retries", problems)


# --- pubsub-kill-storm ------------------------------------------------------------

STORM_WAITS = 300
STORM_KILL_MS = (1, 30)
"""Pause range (ms) between two kills of every pub/sub connection on the server."""
STORM_SETTINGS = {"lease_ms": 4000, "poll_ms": 1000}
STORM_CAP_S = (STORM_SETTINGS["lease_ms"] + STORM_SETTINGS["poll_ms"]) / 1000 + 1.0
"""Longest a wait may take from the release: a lost ring is found by a poll."""


class _Errors(logging.Handler):
    """Keeps the ERROR records of the lock's loggers."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:200])


@scenario(
    "pubsub-kill-storm",
    kills=("pubsub-races-unhandled",),
    faults="every pub/sub connection killed (CLIENT KILL TYPE pubsub) every 1-30 ms "
    "while one waiter, whose channel lingers, takes the lock after hand-offs",
)
async def pubsub_kill_storm(ctx: Context) -> Outcome:
    """redis-py, reconnecting the subscription's connection as the reader reads
    and a probe subscribes, raises ``RuntimeError`` or ``AttributeError``
    instead of a connection error: the doorbell must take those for the
    connection's failure. Each wait is served (by its ring, a catch-up poll or
    its first poll) within ``STORM_CAP_S``; no exception reaches the loop's
    handler, and nothing is logged as an error. Found by an outside attack,
    which left waiters hanging on a free lock."""
    server = ctx.servers()
    problems: list[str] = []
    unhandled: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unhandled.append(str(context)[:200]))
    errors = _Errors()
    logging.getLogger("redis_fifo_lock").addHandler(errors)
    admin = Redis.from_url(server.url)
    client = Redis.from_url(server.url)
    rng = random.Random(ctx.rng.getrandbits(32))

    async def storm() -> None:
        while True:
            await asyncio.sleep(rng.uniform(*STORM_KILL_MS) / 1000)
            with contextlib.suppress(RedisError):
                await admin.client_kill_filter(_type="pubsub")

    killer = asyncio.create_task(storm())
    try:
        holder = FifoLock(admin, "storm", **STORM_SETTINGS)
        waiter = FifoLock(client, "storm", **STORM_SETTINGS)
        for wait in range(STORM_WAITS):
            held = await holder.acquire(timeout=STORM_CAP_S)
            waiting = asyncio.create_task(waiter.acquire())
            await asyncio.sleep(0.01)
            await holder.release(held)
            done, _ = await asyncio.wait({waiting}, timeout=STORM_CAP_S)
            if not done:
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                problems.append(f"wait {wait} was not served {STORM_CAP_S:g} s after the release")
                break
            await waiter.release(waiting.result())
    finally:
        killer.cancel()
        await asyncio.gather(killer, return_exceptions=True)
        await client.aclose()
        await admin.aclose()
        logging.getLogger("redis_fifo_lock").removeHandler(errors)
        gc.collect()  # a dead task's unretrieved exception is reported now
        loop.set_exception_handler(None)
    problems += [f"reached the loop's exception handler: {text}" for text in unhandled[:3]]
    problems += [f"logged as an error: {text}" for text in errors.messages[:3]]
    return outcome(ctx, "pubsub-kill-storm", problems)
