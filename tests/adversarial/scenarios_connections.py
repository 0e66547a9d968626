"""Dropped connections, lost replies, retries, and late and repeated releases."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from redis_fifo_lock import FifoLock, Lease, LockTimeout, RedisUnavailable
from redis_fifo_lock.lock import WITHDRAW_GRACE_S
from redis_fifo_lock.protocol import LockKeys
from redis_fifo_lock.waiting import Hub, hub_for
from tests.adversarial.actors import Actor, Plan
from tests.adversarial.arena import Arena, NotStaged, in_fresh_arena
from tests.adversarial.clients import names
from tests.adversarial.faults import kill_connections
from tests.adversarial.mutants import variant
from tests.adversarial.registry import LEASE_MS, POLL_MS, Context, Outcome, outcome, scenario
from tests.support.damage import garble_floors
from tests.support.proxy import FaultProxy
from tests.support.record import read_lines


async def _reply_lost(arena: Arena, held: bool, *, resent: bool) -> list[str]:
    """The acquire script ran, the connection is killed before its reply is read,
    and the same acquire is sent again: same ticket, or the same grant.

    ``resent``: redis-py's own retry re-sends the script (the client keeps its
    default retries). Otherwise the client has no retries, ``acquire`` raises
    ``RedisUnavailable`` and the caller retries with the same token, as the
    README's "Idempotence" promises it may."""
    holder = await arena.enter("h") if held else None
    client = arena.client("v", retries=resent)
    victim = arena.lock(client)
    actor = Actor(arena.record, "v")
    seen: dict[str, Any] = {}

    async def drop_reply(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name != "EVALSHA" or not names(args, "v"):
            return
        client.after_send = None
        if held:
            ticket = await arena.until(
                lambda: arena.admin.zscore(arena.keys.key("queue"), "v"), "v queued"
            )
            seen["ticket"] = int(ticket)
            nxt, token = arena.waiter("n", Plan(0.01))
            seen["next"] = (nxt, token)
            await arena.until(lambda: arena.queued(token), "n is queued behind v")
        else:
            status = await arena.until(lambda: _status_held(arena), "v's grant is in Redis")
            seen["ticket"], seen["fence"] = status.holder_ticket, status.holder_fence
        arena.record.queued("v", seen["ticket"], not held)  # what Redis did, as the driver saw
        arena.faults.fault("clientkill", os.getpid())
        await kill_connections(arena, "v")
        # The kill beats the reply: what redis-py raises when the socket dies before
        # the reply is read (a reply already buffered would otherwise still be read).
        raise RedisConnectionError("Connection closed by server (CLIENT KILL)")

    client.after_send = drop_reply
    acquiring = asyncio.create_task(
        actor.acquire(victim, "v", Plan(0.05, timeout_s=5, retry_s=0.0 if resent else 3.0))
    )
    if holder is not None:
        await arena.until(lambda: "next" in seen, "the reply is being dropped")
        await arena.until(lambda: _retried(arena, "v"), "v retried")
        await arena.leave(*holder)
    lease = await acquiring
    problems = []
    if lease is None:
        problems.append("the retried acquire never got the lock")
    else:
        await actor.hold(lease, 0.05)
        await actor.release(victim, lease, Plan(0))
        # redis-py's own re-send must find the request where it was. A caller's
        # retry after RedisUnavailable races the withdrawal of the request whose
        # reply was lost (issue 11: withdrawn as soon as Redis answers): it keeps
        # its place if it comes first, else it queues (and is granted) anew.
        if resent and lease.ticket != seen.get("ticket"):
            problems.append(
                f"the retry took ticket {lease.ticket}, not its place {seen.get('ticket')}"
            )
        if resent and not held and lease.fence != seen.get("fence"):
            problems.append(f"the retry got fence {lease.fence}, not its grant {seen.get('fence')}")
    if "next" in seen:
        nxt, token = seen["next"]
        problems += await arena.served(nxt, token, 5.0)
    status = await arena.lock(arena.admin).status()
    if resent and not held and status.last_fence != seen.get("fence"):
        problems.append("the retried acquire was granted twice (the fence counter moved)")
    if status.held or status.waiting:
        problems.append(f"the lost request was left behind: {status}")
    return problems


def _retried(arena: Arena, token: str) -> bool:
    """Whether ``token``'s retried acquire got its reply (a second ``queued`` line:
    the first is the driver's note of what the lost call did)."""
    lines = [line for line in read_lines(arena.record.path) if line.fields[:1] == [token]]
    return sum(line.kind == "queued" for line in lines) >= 2


async def _status_held(arena: Arena) -> Any:
    status = await arena.lock(arena.admin).status()
    return status if status.held else None


async def _killed_while_waiting(arena: Arena) -> list[str]:
    """Every connection of a waiting process is killed: it still gets its turn."""
    holder = await arena.enter("h")
    victim, token = arena.waiter("v", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "v is queued")
    nxt, next_token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(next_token), "n is queued")
    arena.faults.fault("clientkill", os.getpid())
    killed = await kill_connections(arena, "v")
    await arena.leave(*holder)
    problems = [] if killed else ["found no connection of v to kill"]
    problems += await arena.served(victim, token, POLL_MS / 1000 + 1.5)
    return problems + await arena.served(nxt, next_token, 3.0)


@scenario(
    "connection-killed",
    kills=("acquire-not-idempotent", "doorbell-only"),
    faults="CLIENT KILL of a caller's connection after its acquire ran, and of a waiter",
)
async def connection_killed(ctx: Context) -> Outcome:
    """Acquire re-sent by redis-py after its reply was lost to CLIENT KILL
    (queued: it keeps its place; granted: it gets the same grant, not a second
    one), and a waiter whose connections are all killed still gets its turn
    (with a 2 s lease; see ``connection-killed-short-lease`` for 400 ms)."""
    return await _connection_killed(ctx, "connection-killed", waiting_lease_ms=2000)


@scenario(
    "same-token-retry",
    kills=(),
    faults="CLIENT KILL after the acquire ran (no redis-py retries); the caller retries "
    "with the same token",
)
async def same_token_retry(ctx: Context) -> Outcome:
    """The README's idempotence promise, from the caller's side: ``acquire`` raised
    ``RedisUnavailable`` after its script ran, and the caller retries with the
    same token: it gets the lock (keeping its place if its retry beats the
    withdrawal of the lost request, else queueing anew), nothing is left behind,
    and the waiter after it is served. (Was core bug 5: the withdrawal marked the
    token as ended and the retry raised ``LockUsageError``.)"""
    server = ctx.servers()
    problems: list[str] = []
    for label, held in (("queued", True), ("granted", False)):
        found = await in_fresh_arena(
            Arena(ctx, server.url, f"retry-{label}"),
            partial(_reply_lost, held=held, resent=False),
        )
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "same-token-retry", problems)


@scenario(
    "connection-killed-short-lease",
    kills=(),
    faults="CLIENT KILL of a waiter's connections, lease_ms 400",
)
async def connection_killed_short_lease(ctx: Context) -> Outcome:
    """As ``connection-killed`` with the usual 400 ms lease: the waiter whose
    connections were killed must still keep its place among live waiters."""
    return await _connection_killed(ctx, "connection-killed-short-lease", waiting_lease_ms=LEASE_MS)


async def _connection_killed(ctx: Context, name: str, waiting_lease_ms: int) -> Outcome:
    server = ctx.servers()
    problems: list[str] = []
    cases: dict[str, tuple[Callable[[Arena], Awaitable[list[str]]], int]] = {
        "queued": (lambda arena: _reply_lost(arena, held=True, resent=True), LEASE_MS),
        "granted": (lambda arena: _reply_lost(arena, held=False, resent=True), LEASE_MS),
        "waiting": (_killed_while_waiting, waiting_lease_ms),
    }
    if name.endswith("short-lease"):
        del cases["queued"], cases["granted"]
    for label, (case, lease_ms) in cases.items():
        found = await in_fresh_arena(
            Arena(ctx, server.url, f"killed-{label}", lease_ms=lease_ms), case
        )
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, name, problems)


async def _late_release(arena: Arena) -> list[str]:
    """The lease vanishes between a holder's exit and its release; by the time the
    release arrives the next holder is inside. The late release must raise
    LeaseLost and leave the new holder alone."""
    lock_a, actor_a, lease_a = await arena.enter("a")
    second, second_token = arena.waiter("b", Plan(3 * LEASE_MS / 1000))
    await arena.until(lambda: arena.queued(second_token), "b is queued")
    third, third_token = arena.waiter("c", Plan(0.01))
    await arena.until(lambda: arena.queued(third_token), "c is queued")
    actor_a.record.exit(lease_a)
    arena.faults.fault("delete", "lease")
    await arena.admin.delete(arena.keys.key("lease"))  # the lease is gone (expired, evicted)
    await arena.until(lambda: arena.entered(second_token), "b entered", 5)
    outcome_a = await actor_a.release(lock_a, lease_a, Plan(0, repeat_release=True))
    status = await lock_a.status()
    problems = []
    if outcome_a != "leaselost":
        problems.append(f"the late release gave {outcome_a!r}, expected LeaseLost")
    fence_b = next(
        int(line.fields[2])
        for line in read_lines(arena.record.path)
        if line.kind == "enter" and line.fields[0] == second_token
    )
    if status.holder_fence != fence_b:
        problems.append(
            f"after the late release the holder is {status.holder_fence}, not b ({fence_b})"
        )
    problems += await arena.served(second, second_token, 5.0)
    return problems + await arena.served(third, third_token, 5.0)


async def _repeated_release(arena: Arena) -> list[str]:
    """A release sent twice (a retry after a lost reply) while the next holder is
    inside: the second is a no-op, never LeaseLost, never a second hand-off."""
    lock_x, actor_x, lease_x = await arena.enter("x")
    second, second_token = arena.waiter("y", Plan(2 * LEASE_MS / 1000))
    await arena.until(lambda: arena.queued(second_token), "y is queued")
    third, third_token = arena.waiter("z", Plan(0.01))
    await arena.until(lambda: arena.queued(third_token), "z is queued")
    actor_x.record.exit(lease_x)
    first = await actor_x.release(lock_x, lease_x, Plan(0))
    await arena.until(lambda: arena.entered(second_token), "y entered", 5)
    await actor_x.repeat_release(lock_x, lease_x)
    status = await lock_x.status()
    problems = [] if first == "ok" else [f"the first release gave {first!r}"]
    if status.held and status.holder_ticket is not None:
        y_ticket = next(
            int(line.fields[1])
            for line in read_lines(arena.record.path)
            if line.kind == "enter" and line.fields[0] == second_token
        )
        if status.holder_ticket != y_ticket:
            problems.append("the repeated release moved the lock away from y")
    else:
        problems.append("the repeated release freed y's lock")
    problems += await arena.served(second, second_token, 5.0)
    return problems + await arena.served(third, third_token, 5.0)


async def _release_elsewhere(arena: Arena) -> list[str]:
    """A lease released through another lock object of the same name (and another
    client): the lease, not the object, carries ownership."""
    _, actor, lease = await arena.enter("p")
    other = arena.lock(arena.client("q"))
    actor.record.exit(lease)
    outcome_p = await actor.release(other, lease, Plan(0, repeat_release=True))
    return [] if outcome_p == "ok" else [f"release through another object gave {outcome_p!r}"]


@scenario(
    "late-and-repeated-releases",
    kills=("release-no-owner-check", "release-trusts-lease-gone"),
    faults="a release after the lease vanished; the same release sent twice",
)
async def late_and_repeated_releases(ctx: Context) -> Outcome:
    """Late, repeated and cross-object releases never free someone else's lock."""
    server = ctx.servers()
    problems: list[str] = []
    cases = {"late": _late_release, "repeated": _repeated_release, "elsewhere": _release_elsewhere}
    for label, case in cases.items():
        arena = Arena(ctx, server.url, f"release-{label}")
        try:
            found = await case(arena)
            found += await arena.consistent()
        finally:
            await arena.close()
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "late-and-repeated-releases", problems)


OWED, OUTAGE_WINDOW_S = 300, 2.0
"""Requests given up during the owed-withdrawals scenario's outage, and how long
the connection attempts their withdrawals cost are counted for."""

OWED_TRIES_BOUND = 40
"""Most connections the owed withdrawals may try in ``OUTAGE_WINDOW_S`` (the
lock probes one withdrawal of the one lock a round, every
``RETRY_AFTER_ERROR_S``: about 5; each round of a lock that sends them all
tries ``OWED``)."""


@scenario(
    "owed-withdrawals-outage",
    kills=("withdrawals-all-each-round",),
    faults="Redis refuses every connection of a process whose 300 waiters give up, "
    "then answers again",
)
async def owed_withdrawals_outage(ctx: Context) -> Outcome:
    """Requests given up while Redis is unreachable are owed withdrawals. Through
    the outage their retries cost a few connection attempts a round, not one per
    request; once Redis answers, every one lands within a few seconds and the
    next waiter is served as soon as the holder leaves."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "owed", lease_ms=30_000, poll_ms=1000)
    problems: list[str] = []
    with FaultProxy("127.0.0.1", server.port) as proxy:
        client = Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        arena.clients.append(client)
        try:
            holder, _, waiters = await _queued_behind_a_holder(arena, ctx.mutant, client, OWED)
            arena.faults.fault("refuse-connections", os.getpid())
            proxy.max_connections = 0
            proxy.reset()
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            refused = proxy.refused
            await asyncio.sleep(OUTAGE_WINDOW_S)  # the window the attempts are counted in
            tried = proxy.refused - refused
            if tried > OWED_TRIES_BOUND:
                problems.append(
                    f"{tried} connections tried in {OUTAGE_WINDOW_S:g} s of outage for {OWED} "
                    f"owed withdrawals (bound {OWED_TRIES_BOUND})"
                )
            proxy.max_connections = 256
            arena.faults.fault("connections-accepted", os.getpid())
            problems += await _queue_emptied(arena, 10, "the outage")
            problems += await _next_served(arena, holder)
            problems += await arena.consistent()
        finally:
            await arena.close()
    return outcome(ctx, "owed-withdrawals-outage", problems)


OOM_LOCKS = 60
"""Locks of the oom-refusals scenario, each with one waiter of the process."""


@scenario(
    "oom-refusals",
    kills=("subclass-errors-about-keys",),
    faults="Redis refuses every write (maxmemory 1, noeviction: OOM, met inside the "
    f"scripts) while a process's waiters on {OOM_LOCKS} locks give up, then accepts "
    "writes again",
)
async def oom_refusals(ctx: Context) -> Outcome:
    """An OOM met inside a withdraw script is about all of Redis, as an outage is:
    the withdrawals owed on many locks are tried a few a round, not every
    lock's each round; once Redis accepts writes again, every one lands."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "oom", lease_ms=30_000, poll_ms=1000)
    problems: list[str] = []
    client = Redis.from_url(server.url)
    arena.clients.append(client)
    names = [f"{arena.name}-{n}" for n in range(OOM_LOCKS)]
    owners = [FifoLock(arena.admin, name, **arena.settings) for name in names]
    locks = [variant(ctx.mutant).lock(client, name, **arena.settings) for name in names]
    hub = hub_for(client)
    try:
        leases = [await owner.acquire(timeout=5) for owner in owners]
        waiters = [asyncio.create_task(lock.acquire(timeout=60, token="w")) for lock in locks]
        for lock in locks:
            await arena.until(partial(_in, arena, lock.keys.key("queue"), "w"), "w queued")
        await arena.admin.config_set("maxmemory", 1)  # with noeviction, the default
        arena.faults.fault("oom", os.getpid())
        try:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            await arena.until(lambda: len(hub._withdrawals) == OOM_LOCKS, "every one owed")
            tried = sum(owed.failures for owed in hub._withdrawals.values())
            await asyncio.sleep(OUTAGE_WINDOW_S)  # the window the tries are counted in
            tried = sum(owed.failures for owed in hub._withdrawals.values()) - tried
            if tried > OWED_TRIES_BOUND:
                problems.append(
                    f"{tried} withdrawals tried in {OUTAGE_WINDOW_S:g} s of OOM for "
                    f"{OOM_LOCKS} locks (bound {OWED_TRIES_BOUND})"
                )
        finally:
            await arena.admin.config_set("maxmemory", 0)
        try:
            await arena.until(lambda: not hub._withdrawals, "every withdrawal landed", 10)
        except AssertionError:
            problems.append(f"{len(hub._withdrawals)} withdrawals owed 10 s after the OOM")
        for owner, lease in zip(owners, leases, strict=True):
            await owner.release(lease)
    finally:
        await arena.close()
    return outcome(ctx, "oom-refusals", problems)


SLOW_DELAY_MS, SLOW_LEASE_MS, SLOW_TIMEOUTS_S = 400, 300, (0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8)
"""The slow-link scenario: every reply 0.4 s late, a lease of 0.3 s, and the
timeouts its acquires are given (a lock that gives each call made again its
own floor raised 0.72-0.92 s after these)."""

SLOW_LATE_BOUND_S = WITHDRAW_GRACE_S + 0.25
"""Longest an acquire there may raise after its timeout: the withdrawal's grace,
and scheduling slack."""


@scenario(
    "slow-link-timeouts",
    kills=("attempt-floor-each-call",),
    faults="every reply to one process comes 0.4 s late, longer than its 0.3 s lease",
)
async def slow_link_timeouts(ctx: Context) -> Outcome:
    """On a link slower than the lease no grant comes in time: each acquire
    claims again, loses its place and joins the queue again. It must still
    raise ``LockTimeout`` in time (its timeout, then at most the withdrawal's
    grace), return no lease, and leave nothing queued: once the link recovers,
    the next waiter is served as soon as the lock is free."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "slow-link", lease_ms=SLOW_LEASE_MS, poll_ms=SLOW_LEASE_MS // 2)
    problems: list[str] = []
    with FaultProxy("127.0.0.1", server.port) as proxy:
        client = Redis.from_url(proxy.url)
        arena.clients.append(client)
        try:
            lock = variant(ctx.mutant).lock(client, arena.name, **arena.settings)
            await lock.release(await lock.acquire(timeout=5))  # scripts loaded
            proxy.delay("down", SLOW_DELAY_MS)
            for n, timeout_s in enumerate(SLOW_TIMEOUTS_S):
                started = time.monotonic()
                ended = await asyncio.gather(
                    lock.acquire(timeout=timeout_s, token=f"slow-{n}"),
                    return_exceptions=True,
                )
                late_s = time.monotonic() - started - timeout_s
                if isinstance(ended[0], Lease):
                    problems.append(f"slow-{n}: acquire returned a lease no reply granted in time")
                    with contextlib.suppress(Exception):
                        await lock.release(ended[0])
                elif not isinstance(ended[0], LockTimeout):
                    problems.append(f"slow-{n}: acquire ended in {ended[0]!r}, not LockTimeout")
                elif late_s > SLOW_LATE_BOUND_S:
                    problems.append(
                        f"slow-{n}: acquire(timeout={timeout_s:g}) raised {late_s:.3f} s "
                        f"after its timeout (bound {SLOW_LATE_BOUND_S:.2f} s)"
                    )
            proxy.delay("down", 0)
            problems += await _queue_emptied(arena, 10, "the link recovered")
            problems += await _next_served(arena, await arena.enter("h"))
            problems += await arena.consistent()
        finally:
            await arena.close()
    return outcome(ctx, "slow-link-timeouts", problems)


BACKLOG, BACKLOG_DELAY_MS = 400, 20
"""Groups catching up in the catch-up-backlog scenario, and its replies' delay."""


@scenario(
    "catch-up-backlog",
    kills=("polls-for-nobody",),
    faults="one process's connections reset while it waits on 400 locks (replies 20 ms "
    "late), and every waiter cancelled while the groups' catch-up polls wait for a call slot",
)
async def catch_up_backlog(ctx: Context) -> Outcome:
    """After a reconnection every waiting group polls to catch up, and those
    polls queue for the hub's two call slots. Waiters cancelled meanwhile leave
    them with nobody to poll for: they must not hold up the process's next
    acquire of a free lock (at most 1.5 s here; 400 polls take 4 s)."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "backlog", lease_ms=30_000, poll_ms=10_000)
    problems: list[str] = []
    with FaultProxy("127.0.0.1", server.port) as proxy:
        client = Redis.from_url(proxy.url)
        arena.clients.append(client)
        try:
            lock_names = [f"{arena.name}-{n}" for n in range(BACKLOG)]
            held = [
                await FifoLock(arena.admin, name, **arena.settings).acquire(timeout=5)
                for name in lock_names
            ]
            mutant = variant(ctx.mutant)
            locks = [mutant.lock(client, name, **arena.settings) for name in lock_names]
            waiters = [asyncio.create_task(lock.acquire(timeout=60)) for lock in locks]
            for lock in locks:
                await arena.until(
                    partial(arena.admin.zcard, lock.keys.key("queue")), f"{lock.name} queued"
                )
            free = mutant.lock(client, arena.name, **arena.settings)
            await free.release(await free.acquire(timeout=5))  # scripts loaded
            slots = hub_for(client).calls
            proxy.delay("down", BACKLOG_DELAY_MS)
            proxy.reset()
            arena.faults.fault("clientkill", os.getpid())
            await arena.until(
                lambda: len(slots._waiters or ()) >= BACKLOG // 2, "the catch-up polls queued", 20
            )
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            started = time.monotonic()
            lease = await free.acquire(timeout=30)
            took_s = time.monotonic() - started
            await free.release(lease)
            if took_s > 1.5:
                problems.append(
                    f"a free lock's acquire took {took_s:.2f} s behind {BACKLOG} polls "
                    "of groups whose waiters had left"
                )
            proxy.delay("down", 0)
            for name, lease_h in zip(lock_names, held, strict=True):
                await FifoLock(arena.admin, name, **arena.settings).release(lease_h)
            problems += await arena.consistent()
        finally:
            await arena.close()
    return outcome(ctx, "catch-up-backlog", problems)


GONE = 5
"""Waiters cancelled in the withdrawal-call-error scenario."""


@scenario(
    "withdrawal-call-error",
    kills=("withdrawer-dies-on-error",),
    faults="the first withdrawal a process sends fails with AttributeError (as redis-py "
    "raises for a client closed while it writes)",
)
async def withdrawal_call_error(ctx: Context) -> Outcome:
    """Cancelled waiters are withdrawn although the first withdrawal's call failed
    with an error that is neither an outage nor Redis's answer: the withdrawals
    are tried again, and the next live waiter is served at once when the holder
    leaves (not after the 30 s lease of a grant to a request nobody waits for)."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "withdraw-error", lease_ms=30_000, poll_ms=1000)
    problems: list[str] = []
    client = Redis.from_url(server.url)
    arena.clients.append(client)
    try:
        holder, lock, waiters = await _queued_behind_a_holder(arena, ctx.mutant, client, GONE)
        withdraw = lock._protocol.withdraw
        failed: list[str] = []

        def failing_once(*args: Any) -> Any:
            if not failed:
                failed.append("withdraw")
                arena.faults.fault("withdraw-error", os.getpid())
                raise AttributeError("'NoneType' object has no attribute 'write'")
            return withdraw(*args)

        lock._protocol.withdraw = failing_once  # type: ignore[method-assign]
        try:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            problems += await _queue_emptied(arena, 5, "they gave up")
        finally:
            del lock._protocol.withdraw  # the protocol is shared by every lock
        problems += await _next_served(arena, holder)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "withdrawal-call-error", problems)


TWICE_WITHIN_S = 0.4
"""Bound, in seconds, from the last cancellation of the withdrawn-twice scenario
until every request left the queue: a withdrawal Redis answers at once lands in
milliseconds; a hub that pauses its withdrawals pauses for 0.5 s."""


@scenario(
    "withdrawn-twice",
    kills=("round-judged-by-key",),
    faults="an acquire times out and its caller's cancellation comes just as the "
    "withdrawal lands, while other waiters of the process are cancelled",
)
async def withdrawn_twice(ctx: Context) -> Outcome:
    """An acquire given up by its timeout, then by its caller (``asyncio.wait_for``
    a hair longer) just as its withdrawal landed, asks for the withdrawal
    again. The withdrawals owed meanwhile land at once all the same: every
    request has left the queue within ``TWICE_WITHIN_S`` of the last
    cancellation, and the next live waiter is served when the holder leaves."""

    async def case(arena: Arena, holder: tuple[FifoLock, Actor, Any], lock: FifoLock) -> list[str]:
        hub = hub_for(lock.client)
        tasks: dict[str, asyncio.Task[Lease]] = {}
        asked: list[str] = []
        last_cancel: list[float] = []
        withdraw = hub.withdraw

        def cancel(token: str) -> None:
            last_cancel.append(time.monotonic())
            tasks[token].cancel()

        def timed(group: Any, token: str, ticket: int, call: str) -> Any:
            asked.append(token)
            if token == "a":
                cancel("b" if asked.count("a") == 1 else "c")
            done = withdraw(group, token, ticket, call)
            if token == "a" and asked.count("a") == 1:
                done.add_done_callback(lambda _: cancel("a"))
            return done

        hub.withdraw = timed  # type: ignore[method-assign]
        tasks["a"] = asyncio.create_task(lock.acquire(timeout=1, token="a"))
        for token in ("b", "c"):
            tasks[token] = asyncio.create_task(lock.acquire(timeout=60, token=token))
        await arena.until(partial(_queue_length, arena, 3), "a, b and c queued")
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        if asked.count("a") != 2:
            return [f"CRASH: a's withdrawal was asked for {asked.count('a')} times, not twice"]
        await arena.until(partial(_queue_length, arena, 0), "every request withdrawn", 5)
        problems = _late(time.monotonic() - last_cancel[-1], "the given-up requests", "the last")
        return problems + await _next_served(arena, holder)

    return outcome(ctx, "withdrawn-twice", await _beside_a_holder(ctx, "withdrawn-twice", case))


@scenario(
    "held-back-withdrawal",
    kills=("unsent-counts-as-failed",),
    faults="two waiters cancelled together, one retried with its token at once (the "
    "retry held on its way), a third cancelled while the retry is on its way",
)
async def held_back_withdrawal(ctx: Context) -> Outcome:
    """While a same-token retry is on its way, its first request's withdrawal is
    held back (the retry takes the request over); the withdrawals of the
    others go on at once: a request cancelled meanwhile has left the queue
    within ``TWICE_WITHIN_S`` of its cancellation, and the retry keeps its
    place (it is served first when the holder leaves)."""

    async def case(arena: Arena, holder: tuple[FifoLock, Actor, Any], lock: FifoLock) -> list[str]:
        tasks: dict[str, asyncio.Task[Lease]] = {}
        for count, token in enumerate(("y", "z", "x"), start=1):
            tasks[token] = asyncio.create_task(lock.acquire(timeout=60, token=token))
            await arena.until(partial(_queue_length, arena, count), f"{token} queued")
        gate = asyncio.Event()
        acquire = lock._protocol.acquire

        async def gated(client: Any, keys: LockKeys, token: str, *args: Any, **kw: Any) -> Any:
            if token == "x":
                await gate.wait()
            return await acquire(client, keys, token, *args, **kw)

        lock._protocol.acquire = gated  # type: ignore[method-assign]
        try:
            tasks["y"].cancel()
            tasks["x"].cancel()
            await asyncio.sleep(0)
            tasks["x"].cancel()  # its caller stops waiting for the withdrawal
            await asyncio.gather(tasks["x"], tasks["y"], return_exceptions=True)
            retry = asyncio.create_task(lock.acquire(timeout=60, token="x"))
            await arena.until(lambda: _not_in_queue(arena, "y"), "y withdrawn")
            if not hub_for(lock.client)._of_token(lock.keys, "x"):
                # x's withdrawal was answered before its retry began: nothing
                # is held back, and the retry queues again at the back.
                for task in (retry, tasks["z"]):
                    task.cancel()
                await asyncio.gather(retry, tasks["z"], return_exceptions=True)
                await arena.leave(*holder)
                raise NotStaged("x's withdrawal was answered before its retry began")
            cancelled = time.monotonic()
            tasks["z"].cancel()
            await asyncio.gather(tasks["z"], return_exceptions=True)
            await arena.until(lambda: _not_in_queue(arena, "z"), "z withdrawn", 5)
            problems = _late(time.monotonic() - cancelled, "z", "its")
            gate.set()
        finally:
            del lock._protocol.acquire  # the protocol is shared by every lock
        await arena.leave(*holder)
        try:
            await lock.release(await asyncio.wait_for(retry, 2.0))
        except asyncio.TimeoutError:
            problems.append("x's retry was not served within 2 s of the holder leaving")
        return problems

    for attempt in range(3):
        with contextlib.suppress(NotStaged):
            found = await _beside_a_holder(ctx, f"held-back-{attempt}", case)
            break
    else:
        found = ["could not stage the case in 3 attempts"]
    return outcome(ctx, "held-back-withdrawal", found)


@scenario(
    "failing-neighbour",
    kills=("failure-pauses-all", "script-error-server-wide"),
    faults="another lock of the process owes a withdrawal that keeps failing (its "
    "process's floor entry garbled: the script's Lua fails); a waiter of this lock is "
    "cancelled as it fails",
)
async def failing_neighbour(ctx: Context) -> Outcome:
    """A lock whose withdrawals keep failing while Redis answers holds up no other
    lock's: a waiter cancelled just as the failing withdrawal's try failed has
    left the queue within ``TWICE_WITHIN_S`` of its cancellation, and the next
    live waiter is served when the holder leaves."""

    async def case(arena: Arena, holder: tuple[FifoLock, Actor, Any], lock: FifoLock) -> list[str]:
        name = f"{arena.name}-neighbour"
        neighbour = variant(ctx.mutant).lock(lock.client, name, **arena.settings)
        queue, finished = neighbour.keys.key("queue"), neighbour.keys.key("finished")
        owner = FifoLock(arena.admin, name, **arena.settings)
        held = await owner.acquire(timeout=5)
        doomed = asyncio.create_task(neighbour.acquire(timeout=60, token="doomed"))
        await arena.until(lambda: _in(arena, queue, "doomed"), "doomed queued")
        await garble_floors(arena.admin, neighbour.keys)  # its scripts fail from now on
        z = asyncio.create_task(lock.acquire(timeout=60, token="z"))
        await arena.until(lambda: arena.in_queue("z"), "z queued")
        withdraw = lock._protocol.withdraw
        cancelled: list[float] = []

        async def watched(client: Any, keys: LockKeys, token: str, *args: Any) -> Any:
            try:
                return await withdraw(client, keys, token, *args)
            except Exception:
                if token == "doomed" and not cancelled:
                    cancelled.append(time.monotonic())
                    z.cancel()
                raise

        lock._protocol.withdraw = watched  # type: ignore[method-assign]
        hub = hub_for(lock.client)
        try:
            doomed.cancel()
            await asyncio.gather(doomed, z, return_exceptions=True)
            await arena.until(lambda: _not_in_queue(arena, "z"), "z withdrawn", 5)
            problems = _late(time.monotonic() - cancelled[0], "z", "its")
        finally:
            del lock._protocol.withdraw  # the protocol is shared by every lock
            await arena.admin.delete(finished)  # the neighbour's withdrawal lands now
            await arena.until(lambda: not hub._withdrawals, "doomed withdrawn", 5)
            await owner.release(held)
        return problems + await _next_served(arena, holder)

    found = await _beside_a_holder(ctx, "failing-neighbour", case)
    return outcome(ctx, "failing-neighbour", found)


async def _beside_a_holder(
    ctx: Context,
    name: str,
    case: Callable[[Arena, tuple[FifoLock, Actor, Any], FifoLock], Awaitable[list[str]]],
) -> list[str]:
    """``case(arena, holder, lock)`` in a fresh arena ``name`` (lease 30 s, poll
    1 s) whose lock a contender holds (``Arena.enter``'s), with ``lock`` of the
    context's variant on a client of its own; its findings and the end state's."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, name, lease_ms=30_000, poll_ms=1000)
    client = Redis.from_url(server.url)
    arena.clients.append(client)

    async def held(arena: Arena) -> list[str]:
        holder = await arena.enter("h")
        lock = variant(ctx.mutant).lock(client, arena.name, **arena.settings)
        return await case(arena, holder, lock)

    return await in_fresh_arena(arena, held, load_scripts=False)


def _late(late_s: float, who: str, whose: str) -> list[str]:
    """A problem if ``who`` left the queue more than ``TWICE_WITHIN_S`` after
    ``whose`` cancellation."""
    if late_s <= TWICE_WITHIN_S:
        return []
    return [
        f"{who} left the queue {late_s:.3f} s after {whose} cancellation (bound {TWICE_WITHIN_S} s)"
    ]


async def _not_in_queue(arena: Arena, token: str) -> bool:
    return not await arena.in_queue(token)


async def _in(arena: Arena, queue: str, token: str) -> bool:
    """Whether ``token`` is queued in ``queue`` (another lock's than the arena's)."""
    return await arena.admin.zscore(queue, token) is not None


async def _queued_behind_a_holder(
    arena: Arena, mutant: str, client: Redis, count: int
) -> tuple[tuple[FifoLock, Actor, Any], FifoLock, list[asyncio.Task[Lease]]]:
    """A contender holds the arena's lock and ``count`` acquires (timeout 60 s)
    of ``mutant``'s lock on ``client`` wait behind it, all queued: the holder
    (``Arena.enter``'s), that lock, and their tasks."""
    holder = await arena.enter("h")
    lock = variant(mutant).lock(client, arena.name, **arena.settings)
    waiters = [asyncio.create_task(lock.acquire(timeout=60)) for _ in range(count)]
    await arena.until(partial(_queue_length, arena, count), "every waiter queued")
    return holder, lock, waiters


async def _queue_emptied(arena: Arena, within_s: float, after: str) -> list[str]:
    """A problem unless every request leaves the queue within ``within_s``
    seconds (``after`` what, for the message)."""
    try:
        await arena.until(partial(_queue_length, arena, 0), "every request withdrawn", within_s)
    except AssertionError:
        left = await arena.admin.zcard(arena.keys.key("queue"))
        return [f"{left} given-up requests still queued {within_s:g} s after {after}"]
    return []


async def _next_served(arena: Arena, holder: tuple[FifoLock, Actor, Any]) -> list[str]:
    """A live waiter queued behind ``holder`` (``Arena.enter``'s) enters within
    2 s of the holder leaving."""
    live, token = arena.waiter("l", Plan(0.01, timeout_s=10))
    await arena.until(lambda: arena.queued(token), "l is queued")
    await arena.leave(*holder)
    return await arena.served(live, token, 2.0)


async def _queue_length(arena: Arena, length: int) -> bool:
    return bool(await arena.admin.zcard(arena.keys.key("queue")) == length)


RETRY_LEASE_MS, RETRY_POLL_MS = 30_000, 10_000
"""Timing of the retry-in-outage scenario: a stall behind a request nobody waits
for lasts a lease, far past its bounds."""


async def _lost_in_outage(
    arena: Arena, proxy: FaultProxy, lock: FifoLock, token: str
) -> tuple[Hub, str | None] | None:
    """``lock.acquire(token=token)`` through ``proxy`` reaches Redis and its reply
    never comes; nothing sent from then on reaches Redis. Returns the lock's hub
    and the queued request's acquire call once its withdrawal is on its way
    (held by the proxy), or None if the fault missed."""
    proxy.hold("down")
    first = asyncio.create_task(lock.acquire(timeout=30, token=token))
    await arena.until(partial(arena.in_queue, token), f"{token} queued")
    proxy.hold("up")
    outcome_first = (await asyncio.gather(first, return_exceptions=True))[0]
    if not isinstance(outcome_first, RedisUnavailable):
        return None
    hub = hub_for(lock.client)
    await arena.until(
        lambda: any(w.attempt for w in hub._withdrawals.values()), "the withdrawal on its way"
    )
    return hub, await _queued_call(arena, token)


async def _queued_call(arena: Arena, token: str) -> str | None:
    """The acquire call that ``token``'s queued request answers to, or None."""
    record = await arena.admin.hget(arena.keys.key("waiters"), token)
    return None if record is None else str(record.decode().split(" ")[3])


def _outage_ends(proxy: FaultProxy) -> None:
    """Redis answers again: what the proxy held is lost, every connection cut."""
    proxy.release("up", deliver=False)
    proxy.release("down", deliver=False)
    proxy.reset()


async def _retry_keeps_its_place(arena: Arena, proxy: FaultProxy, mutant: str) -> list[str]:
    """A same-token retry made while the first request's withdrawal is on its way
    takes the request over and keeps its place ahead of a later caller."""
    client = Redis.from_url(proxy.url, socket_timeout=1.0)  # redis-py's retries on
    arena.clients.append(client)
    lock = variant(mutant).lock(client, arena.name, **arena.settings)
    # Scripts loaded, eviction policy checked: the fault hits the acquire script.
    await lock.release(await lock.acquire(timeout=5))
    holder = await arena.enter("h")
    lost = await _lost_in_outage(arena, proxy, lock, "b")
    if lost is None:
        _outage_ends(proxy)
        await arena.leave(*holder)
        return ["b's first acquire did not end in RedisUnavailable"]
    hub, first_call = lost
    ticket = await arena.admin.zscore(arena.keys.key("queue"), "b")
    later, later_token = arena.waiter("c", Plan(0.01, timeout_s=60))
    await arena.until(partial(arena.in_queue, later_token), "c queued behind b")
    retrying = asyncio.Event()
    reclaim = type(hub).reclaim

    def noted(self: Hub, keys: LockKeys, token: str) -> None:
        retrying.set()
        reclaim(self, keys, token)

    type(hub).reclaim = noted  # type: ignore[method-assign]
    try:

        async def retried_until_granted() -> Lease | None:
            # As RedisUnavailable asks: again with the same token, while Redis fails.
            for _ in range(20):
                with contextlib.suppress(RedisUnavailable):
                    return await lock.acquire(timeout=60, token="b")
            return None

        retry = asyncio.create_task(retried_until_granted())
        # A lock whose retry waits for the withdrawal never gets that far.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(retrying.wait(), 5)
        await asyncio.sleep(0)  # the retry went on past reclaim's first step
    finally:
        type(hub).reclaim = reclaim  # type: ignore[method-assign]
    _outage_ends(proxy)

    async def retried() -> bool:
        return await _queued_call(arena, "b") not in (None, first_call)

    await arena.until(retried, "b's retry at Redis", 20)
    problems = []
    if await arena.admin.zscore(arena.keys.key("queue"), "b") != ticket:
        problems.append("the retry queued b again at the back: its withdrawal landed first")
    await arena.leave(*holder)
    done, _ = await asyncio.wait({retry}, timeout=20)
    if not done or retry.result() is None:
        problems.append("b's retry was not granted within 20 s of the holder leaving")
    elif later.done() and arena.entered(later_token) is not None:
        problems.append("c, queued after b, was granted the lock before b's retry")
    if done and retry.result() is not None:
        await lock.release(retry.result())
    return problems + await arena.served(later, later_token, 20)


async def _retry_lost_too(arena: Arena, proxy: FaultProxy, mutant: str) -> list[str]:
    """A retry that never reaches Redis (it fails as well) leaves the first request
    to its withdrawal: once Redis answers, the next waiter is served at once."""
    client = Redis.from_url(proxy.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    arena.clients.append(client)
    lock = variant(mutant).lock(client, arena.name, **arena.settings)
    # Scripts loaded, eviction policy checked: the fault hits the acquire script.
    await lock.release(await lock.acquire(timeout=5))
    holder = await arena.enter("h")
    problems = []
    if await _lost_in_outage(arena, proxy, lock, "b") is None:
        problems.append("b's first acquire did not end in RedisUnavailable")
    else:
        retry = await asyncio.gather(lock.acquire(timeout=5, token="b"), return_exceptions=True)
        if not isinstance(retry[0], RedisUnavailable):
            problems.append(f"b's retry in the outage ended in {retry[0]!r}, not RedisUnavailable")
    _outage_ends(proxy)
    if problems:
        await arena.leave(*holder)
        return problems
    live, token = arena.waiter("l", Plan(0.01, timeout_s=60))
    await arena.until(partial(arena.in_queue, token), "l queued")
    await arena.leave(*holder)
    return await arena.served(live, token, 3.0)


@scenario(
    "retry-in-outage",
    kills=("retry-waits-for-withdrawal", "retry-drops-withdrawals"),
    faults="an acquire's reply lost and Redis then unreachable (a proxy holding both "
    "directions) while its withdrawal is on its way; a same-token retry that "
    "reaches Redis as the outage ends, and one that fails too",
)
async def retry_in_outage(ctx: Context) -> Outcome:
    """``RedisUnavailable`` promises the request is withdrawn unless it is retried
    with the same token first: a retry made while the withdrawal is on its way
    keeps the request's place, and a retry that fails as well leaves the
    request to its withdrawal, so that it stalls nobody (lease 30 s here)."""
    server = ctx.servers()
    problems: list[str] = []
    cases = {"retried": _retry_keeps_its_place, "lost-too": _retry_lost_too}
    for label, case in cases.items():
        arena = Arena(
            ctx, server.url, f"retry-{label}", lease_ms=RETRY_LEASE_MS, poll_ms=RETRY_POLL_MS
        )
        with FaultProxy("127.0.0.1", server.port) as proxy:
            try:
                found = await case(arena, proxy, ctx.mutant)
                found += await arena.consistent()
            finally:
                await arena.close()
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "retry-in-outage", problems)
