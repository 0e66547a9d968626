"""The hardened protocol: rings, late copies, abandoned requests, lost counters."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from redis_fifo_lock.errors import LockUsageError
from redis_fifo_lock.settings import LockSettings
from redis_fifo_lock.waiting import hub_for
from tests.adversarial.actors import Actor, Plan
from tests.adversarial.arena import Arena, LoopThread, NotStaged, in_fresh_arena
from tests.adversarial.clients import make_client, names
from tests.adversarial.faults import KEY_PARTS, kill_connections
from tests.adversarial.registry import Context, Outcome, outcome, scenario
from tests.support.record import read_lines
from tests.support.replay import reply_code, script_calls
from tests.support.rings import forged_ring


def _ticket_of(arena: Arena, token: str) -> int:
    """The ticket of ``token``'s latest acquire reply, from the record."""
    return [
        int(line.fields[1])
        for line in read_lines(arena.record.path)
        if line.kind == "queued" and line.fields[0] == token
    ][-1]


def _session_of(client: Redis, token: str) -> str:
    """The liveness session of the process (hub) where ``token`` waits."""
    groups = [group for group in hub_for(client).groups.values() if token in group.waiters]
    assert len(groups) == 1, "the core's wait groups changed; update _session_of"
    return groups[0].session


RING_LEASE_MS = 1000
RING_POLL_MS = 500
BLOCK_MS = 900
"""The blocked waiter's loop stalls 0.9 s: less than its lease (1 s), but longer
than what its liveness may have left when its grant lands 0.1 s into the stall."""


@dataclass
class _RungWaiter:
    """A holder, and a waiter on a client of its own queued behind it, whose
    doorbell channel is watched; with a ring for it that no script sent (fence
    999999, its call and ticket, signed with a made-up key)."""

    leave: Callable[[], Awaitable[str]]  # the holder leaves: its release outcome
    waiting: asyncio.Task[Any]  # the waiter's acquire
    token: str
    channel: str
    forged: str


async def _rung_waiter(arena: Arena, timeout_s: float, ahead: Plan | None = None) -> _RungWaiter:
    """``ahead``: a request of a third contender (``x``) queued before the waiter."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    if ahead is not None:
        _, x_token = arena.waiter("x", ahead)
        await arena.until(lambda: arena.queued(x_token), "x is queued")
    client = arena.client("w")
    lock_w, actor_w = arena.lock(client), Actor(arena.record, "w")
    token = f"w-{arena.ctx.rng.getrandbits(20):05x}"
    waiting = asyncio.create_task(actor_w.attempt(lock_w, token, Plan(0.05, timeout_s=timeout_s)))
    await arena.until(lambda: arena.queued(token), "w is queued")
    channel, forged = await forged_ring(arena.admin, arena.keys, token, 999999)
    assert channel == arena.keys.doorbell_of(_session_of(client, token))
    await _watched(arena, channel)
    return _RungWaiter(
        lambda: arena.leave(lock_h, actor_h, lease_h), waiting, token, channel, forged
    )


async def _forged_ring(arena: Arena) -> list[str]:
    """A ring nobody's script sent (anyone with PUBLISH rights can): the waiter it
    names asks Redis, is told it does not hold the lock, and waits on."""
    w = await _rung_waiter(arena, 10)
    if not await arena.admin.publish(w.channel, w.forged):
        return ["the forged ring reached no subscriber: the doorbell's channels changed"]
    # Time for the forged ring to be read and claimed; nothing may come of it.
    await asyncio.sleep(RING_LEASE_MS / 1000 / 2)
    problems = [] if arena.entered(w.token) is None else ["a forged ring let w in"]
    await w.leave()
    return problems + await arena.served(w.waiting, w.token, 5.0)


async def _watched(arena: Arena, channel: str) -> None:
    """Wait until a process subscribed to doorbell ``channel``."""

    async def subscribed() -> bool:
        counts = await arena.admin.pubsub_numsub(channel)
        return bool(counts and counts[0][1])

    await arena.until(subscribed, f"a process watches {channel}")


MALFORMED_LEASE_MS = 10_000
MALFORMED_POLL_MS = 5_000
NOT_ASCII_PROOF = "\u00e9" * 40
MALFORMED_BOUND_S = 2.0
"""The waiter must be handed the lock this soon after the holder's release (the
request queued between them holds 0.2 s): by its ring, since its poll comes
only every 5 s."""


@scenario(
    "ring-malformed",
    kills=("malformed-ring-ends-reader",),
    faults="rings no script sent, malformed: a proof that is not ASCII, fields missing",
)
async def ring_malformed(ctx: Context) -> Outcome:
    """Anyone allowed to PUBLISH on a lock's channels can send anything there.
    Malformed rings are ignored, and the doorbell goes on serving: the waiter is
    handed the lock by the next real ring, long before its poll."""
    server = ctx.servers()
    arena = Arena(
        ctx, server.url, "ring-malformed", lease_ms=MALFORMED_LEASE_MS, poll_ms=MALFORMED_POLL_MS
    )
    return outcome(ctx, "ring-malformed", await in_fresh_arena(arena, _malformed_rings))


async def _malformed_rings(arena: Arena) -> list[str]:
    # x, queued between the holder and w, holds 0.2 s: w's first poll (made when
    # its process began to wait) is long done when the lock comes to w, so only
    # a ring can bring it before the next poll.
    w = await _rung_waiter(arena, 30, ahead=Plan(0.2, timeout_s=30))
    body = w.forged.rsplit(" ", 1)[0]
    for junk in (f"{body} {NOT_ASCII_PROOF}", body, "x"):
        if not await arena.admin.publish(w.channel, junk):
            return ["a malformed ring reached no subscriber: the doorbell's channels changed"]
    await w.leave()
    return await arena.served(w.waiting, w.token, MALFORMED_BOUND_S)


async def _ring_read_late(arena: Arena) -> list[str]:
    """The waiter's event loop is blocked (0.9 s, under its 1 s lease) when its
    grant lands, so it reads the ring late; the grant's TTL may be cut to its
    remaining liveness, and Redis may expire it before the waiter looks. The
    next waiter must not enter while the first one holds with ``lease.lost``
    unset, nor may the first one lose a lease it was handed."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    thread = LoopThread()
    token = f"w-{arena.ctx.rng.getrandbits(20):05x}"

    async def blocked_waiter() -> Any:
        client = make_client(arena.url, dup_exec=arena.ctx.dup_exec, name="adv-w")
        try:
            lock = arena.lock(client)
            return await Actor(arena.record, "w").attempt(lock, token, Plan(0.6, timeout_s=15))
        finally:
            await client.aclose()

    try:
        waited = thread.run(blocked_waiter())
        await arena.until(lambda: arena.queued(token), "w is queued")
        nxt, next_token = arena.waiter("n", Plan(1.5, timeout_s=15))
        await arena.until(lambda: arena.queued(next_token), "n is queued")
        started = thread.block(BLOCK_MS / 1000)
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, started.wait, 5):
            return ["the waiter's loop never ran the blocking call"]
        arena.faults.fault("block", f"{os.getpid()}:{BLOCK_MS}")
        await asyncio.sleep(0.1)  # the schedule: the grant lands 0.1 s into the stall
        await arena.leave(lock_h, actor_h, lease_h)
        done, _ = await asyncio.wait({waited}, timeout=20)
        problems = [] if done else ["the blocked waiter never ended its request"]
        problems += await arena.served(nxt, next_token, 15.0)
    finally:
        await thread.close()
    if arena.entered(token) is None:
        problems.append("the blocked waiter was never served")
    return problems


@scenario(
    "ring-read-late",
    kills=("lease-dated-from-ring", "ring-proof-unchecked", "signed-ring-dated-at-read"),
    faults="a forged doorbell ring; a waiter's event loop blocked while its grant lands",
)
async def ring_read_late(ctx: Context) -> Outcome:
    """A ring is a hint, never a grant: a forged ring lets nobody in, and a ring
    read late (the waiter's loop blocked for less than a lease) never makes a
    holder whose local deadline is later than Redis's expiry of its grant."""
    server = ctx.servers()
    problems: list[str] = []
    cases = {"forged": _forged_ring, "late": _ring_read_late}
    for label, case in cases.items():
        arena = Arena(
            ctx, server.url, f"ring-{label}", lease_ms=RING_LEASE_MS, poll_ms=RING_POLL_MS
        )
        found = await in_fresh_arena(arena, case)
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "ring-read-late", problems)


HISTORY_GRANTS = 80
"""Grants made (each by a process of its own) between a release and its late
copy: more records than a count-bounded history of 64 keeps."""


async def _release_replayed(arena: Arena) -> list[str]:
    """A release re-sent after many other grants is recognised as already done."""
    lock_a, actor_a = arena.contender("a")
    token_a = f"a-{arena.ctx.rng.getrandbits(20):05x}"
    lease_a = await actor_a.acquire(lock_a, token_a, Plan(0, timeout_s=5))
    assert lease_a is not None, "a could not enter"
    actor_a.record.exit(lease_a)
    with script_calls() as recorded:
        first = await actor_a.release(lock_a, lease_a, Plan(0))
    calls = recorded.since(0, mentioning=lease_a.token, script="release")
    if len(calls) != 1:
        return [f"captured {len(calls)} release calls, expected 1"]
    keys, settings = lock_a.keys, lock_a.settings
    # The variant's scripts, unrecorded: these stand-in processes are no actors.
    protocol = getattr(lock_a._protocol, "inner", lock_a._protocol)
    for round_ in range(HISTORY_GRANTS):
        # Each by a process of its own (ids that sort after any real one), which
        # never speaks again and so keeps its record for keep_ms: the history
        # holds more than 64 records, a's first in their order (a history
        # trimmed by count, mutant history-by-count, drops it first).
        process = f"zz{round_:03d}"
        call = f"{process}/000000000001"
        grant, _, _, _ = await protocol.acquire(
            arena.admin, keys, f"b-{round_}", process, settings, call=call, floor=call
        )
        if grant is None:
            return [f"grant {round_} of {HISTORY_GRANTS} failed"]
        await protocol.release(
            arena.admin, keys, f"b-{round_}", grant.fence, settings.keep_ms, call, process, call
        )
    reply = reply_code(await calls[0].replay())
    outcomes = {0: "dup-ok", -1: "dup-leaselost"}
    arena.record.released(lease_a, outcomes.get(reply, f"dup-error:reply-{reply}"))
    problems = [] if first == "ok" else [f"the first release gave {first!r}"]
    if reply != 0:
        problems.append(
            f"a release re-sent after {HISTORY_GRANTS} grants got {reply}, not 'already "
            "released': the history forgot it (a false LeaseLost)"
        )
    return problems


async def _acquire_replayed(arena: Arena) -> list[str]:
    """A late copy of an acquire, arriving after its request was granted and
    released and after its process moved on (so Redis dropped the request's
    record): refused, it queues nothing and grants nothing."""
    lock_a, actor_a = arena.contender("a")
    token = f"a-{arena.ctx.rng.getrandbits(20):05x}"
    with script_calls() as recorded:
        if await actor_a.attempt(lock_a, token, Plan(0, timeout_s=5)) is None:
            return ["a was not granted"]
    calls = recorded.since(0, mentioning=token, script="acquire")
    if len(calls) != 1:
        return [f"captured {len(calls)} acquire calls, expected 1"]
    for round_ in range(3):  # a's process moves on: its floor passes the request
        later = f"a-{round_}-{arena.ctx.rng.getrandbits(16):04x}"
        if await actor_a.attempt(lock_a, later, Plan(0, timeout_s=5)) is None:
            return [f"a's later request {round_} was not granted"]
    reply = await calls[0].replay()
    status = await lock_a.status()
    problems = []
    if reply_code(reply) != -1:
        problems.append(f"a late copy of a released request's acquire got {reply}, not refused")
    if status.held or status.waiting:
        problems.append(f"after the late copy the lock shows {status}")
    return problems


async def _floor_after_loss(arena: Arena) -> list[str]:
    """A process's request ``w`` waits; the process sends another acquire, whose
    floor passes ``w`` (no call of it in flight). That copy arrives late: after
    ``w`` was granted and evicted. ``w``'s release must still be told NOT_HELD
    (LeaseLost), not "already released" (a silent overlap)."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    protocol = getattr(lock_h._protocol, "inner", lock_h._protocol)
    keys, settings, admin = lock_h.keys, lock_h.settings, arena.admin
    process = f"zl{arena.ctx.rng.getrandbits(20):05x}"  # a stand-in process, no actor
    waiting, later = f"{process}/000000000001", f"{process}/000000000002"
    await protocol.acquire(admin, keys, "w", process, settings, call=waiting, floor=waiting)
    await arena.leave(lock_h, actor_h, lease_h)  # w is granted
    fence = int(await admin.hget(keys.key("lease"), "fence") or 0)
    arena.faults.fault("evict", "lease")
    if await arena.lock(admin).force_release(fence=fence) != fence:
        raise NotStaged("w was not the holder when evicted")
    grant, _, _, _ = await protocol.acquire(  # the late copy
        admin, keys, "x", process, settings, call=later, floor=later
    )
    reply, _ = await protocol.release(
        admin, keys, "w", fence, settings.keep_ms, waiting, process, waiting
    )
    if grant is not None:
        await protocol.release(
            admin, keys, "x", grant.fence, settings.keep_ms, later, process, later
        )
    if reply != -1:
        return [
            f"the evicted holder's release got {reply}, not NOT_HELD: a late floor swept "
            "the record of its loss (a silent overlap)"
        ]
    return []


async def _floor_after_release(arena: Arena) -> list[str]:
    """A process holds ``w`` and sends an acquire whose floor lists ``w`` as held;
    that copy is delayed. ``w`` is released and a later message of the process
    lets Redis drop its record. When the delayed copy arrives it must not list
    ``w`` as held again: a re-sent copy of ``w``'s release is "already released",
    not NOT_HELD (a false LeaseLost)."""
    lock = arena.lock(arena.admin)
    protocol = getattr(lock._protocol, "inner", lock._protocol)
    keys, settings, admin = lock.keys, lock.settings, arena.admin
    process = f"zh{arena.ctx.rng.getrandbits(20):05x}"  # a stand-in process, no actor
    held, later = f"{process}/000000000001", f"{process}/000000000002"
    grant, _, _, _ = await protocol.acquire(
        admin, keys, "w", process, settings, call=held, floor=held
    )
    if grant is None:
        raise NotStaged("the lock was not free")
    keep_ms = settings.keep_ms
    await protocol.release(admin, keys, "w", grant.fence, keep_ms, held, process, held)
    _, ticket, _, _ = await protocol.acquire(
        admin, keys, "q", process, settings, call=later, floor=later
    )
    await protocol.withdraw(admin, keys, "q", ticket, process, keep_ms, later, later)
    delayed = f"{later}+{held.split('/')[1]}"
    with contextlib.suppress(LockUsageError):  # refused: its request ended
        await protocol.acquire(admin, keys, "q", process, settings, call=later, floor=delayed)
    reply, _ = await protocol.release(admin, keys, "w", grant.fence, keep_ms, held, process, held)
    if reply != 0:
        return [
            f"a re-sent copy of a clean release got {reply}, not 'already released': a "
            "delayed floor listed the released request as held again (a false LeaseLost)"
        ]
    return []


async def _floor_below_kept(arena: Arena) -> list[str]:
    """The kept floor lists ``w`` as held; a late copy of an acquire sent while ``w``
    waited (a lower floor, above ``w``) arrives between ``w``'s release and its
    re-send: the re-send is "already released", not NOT_HELD."""
    lock_o, actor_o, lease_o = await arena.enter("o")
    protocol = getattr(lock_o._protocol, "inner", lock_o._protocol)
    keys, settings, admin = lock_o.keys, lock_o.settings, arena.admin
    process = f"zk{arena.ctx.rng.getrandbits(20):05x}"  # a stand-in process, no actor
    calls = [f"{process}/{n:012x}" for n in range(6)]
    _, ticket, _, _ = await protocol.acquire(
        admin, keys, "w", process, settings, call=calls[1], floor=calls[1]
    )
    await protocol.acquire(admin, keys, "q", process, settings, call=calls[3], floor=calls[3])
    await arena.leave(lock_o, actor_o, lease_o)  # w is granted
    reply = await protocol.claim(admin, keys, "w", ticket, settings)
    if reply.grant is None:
        raise NotStaged("w was not granted")
    fence, keep_ms = reply.grant.fence, settings.keep_ms
    during = f"{calls[5]}+{calls[1].split('/')[1]}"
    await protocol.acquire(admin, keys, "r", process, settings, call=calls[5], floor=during)
    await protocol.release(admin, keys, "w", fence, keep_ms, calls[1], process, calls[1])
    await protocol.acquire(admin, keys, "q", process, settings, call=calls[3], floor=calls[3])
    again, _ = await protocol.release(admin, keys, "w", fence, keep_ms, calls[1], process, calls[1])
    for token, call in (("q", calls[3]), ("r", calls[5])):  # leave the lock free
        await protocol.withdraw(admin, keys, token, 0, process, keep_ms, call, call)
    if again != 0:
        return [
            f"a re-sent clean release got {again}, not 'already released': a lower, late "
            "floor swept the record of a request the kept floor lists as held"
        ]
    return []


async def _floor_past_grant(arena: Arena) -> list[str]:
    """A stand-in process's request ``w`` waits; Redis grants it while another call
    of the process, whose floor passes ``w`` (composed before the process knew
    of the grant), reaches Redis in order. ``w``'s short lease runs out before
    any script notices: its release must be told NOT_HELD, not "already
    released"."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    protocol = getattr(lock_h._protocol, "inner", lock_h._protocol)
    keys, settings, admin = lock_h.keys, lock_h.settings, arena.admin
    short = LockSettings(lease_ms=200, poll_ms=100)
    process = f"zg{arena.ctx.rng.getrandbits(20):05x}"  # a stand-in process, no actor
    waiting, later = f"{process}/000000000001", f"{process}/000000000002"
    await protocol.acquire(admin, keys, "w", process, short, call=waiting, floor=waiting)
    await admin.zadd(keys.key("alive"), {process: 2**50})
    await arena.leave(lock_h, actor_h, lease_h)  # w is granted, for 200 ms
    fence = int(await admin.hget(keys.key("lease"), "fence") or 0)
    await protocol.acquire(admin, keys, "q", process, settings, call=later, floor=later)
    await arena.until(lambda: _lease_gone(arena), "w's lease ran out", 5)
    reply, _ = await protocol.release(
        admin, keys, "w", fence, settings.keep_ms, waiting, process, waiting
    )
    # Leave the lock free: q (granted by that release) gives it back.
    await protocol.withdraw(admin, keys, "q", 0, process, settings.keep_ms, later, later)
    await admin.zrem(keys.key("alive"), process)
    if reply != -1:
        return [
            f"the release of a lease that ran out got {reply}, not NOT_HELD: a floor "
            "composed before the grant made the lost request look settled"
        ]
    return []


async def _lease_gone(arena: Arena) -> bool:
    return not await arena.admin.exists(arena.keys.key("lease"))


async def _renew_replayed(arena: Arena) -> list[str]:
    """A renewal of a released lease, arriving late while the next holder is inside:
    Redis refuses it, and the new holder's lease is not touched."""
    lock_a, actor_a, lease_a = await arena.enter("a")
    with script_calls() as recorded:
        await arena.until(
            lambda: recorded.since(0, mentioning=lease_a.token, script="renew"),
            "a renewed its lease",
            5,
        )
    calls = recorded.since(0, mentioning=lease_a.token, script="renew")
    await arena.leave(lock_a, actor_a, lease_a)
    holder_b = await arena.enter("b")
    reply = await calls[0].replay()
    status = await holder_b[0].status()
    await arena.leave(*holder_b)
    if reply_code(reply) != 0:
        return [
            f"a late renewal of a released lease got {reply} (renewed), not refused; the "
            f"holder's lease now has {status.lease_left_ms} ms"
        ]
    return []


async def _withdraw_replayed(arena: Arena) -> list[str]:
    """A request lost its place (its session looked dead at the hand-off) and joined
    again with the same token and a new ticket, and holds the lock. A late
    withdraw of its first ticket arrives: it must change nothing."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    client = arena.client("v")
    lock_v, actor_v = arena.lock(client), Actor(arena.record, "v")
    token = f"v-{arena.ctx.rng.getrandbits(20):05x}"
    waiting = asyncio.create_task(actor_v.attempt(lock_v, token, Plan(2.0, timeout_s=10)))
    await arena.until(lambda: arena.queued(token), "v is queued")
    first_ticket, session = _ticket_of(arena, token), _session_of(client, token)
    arena.faults.fault("delete", "alive")
    await arena.admin.zrem(arena.keys.key("alive"), session)  # v looks dead at the hand-off
    await arena.leave(lock_h, actor_h, lease_h)
    entered = await arena.until(lambda: arena.entered(token), "v entered again", 5)
    if _ticket_of(arena, token) == first_ticket:
        # Not the lock's fault: v's poll refreshed its liveness before the hand-off.
        raise NotStaged("v kept its first ticket: its poll came first")
    nxt, next_token = arena.waiter("n", Plan(0.01, timeout_s=10))
    await arena.until(lambda: arena.queued(next_token), "n is queued")
    late = arena.lock(arena.admin)._protocol
    keep_ms = lock_v.settings.keep_ms
    reply = await late.withdraw(
        arena.admin, arena.keys, token, first_ticket, session, keep_ms, "late-copy", "0" * 12
    )
    problems = [] if reply == 0 else [f"a late withdraw of v's first ticket gave {reply}"]
    problems += await arena.served(waiting, token, 10.0)
    problems += await arena.served(nxt, next_token, 10.0)
    if entered and arena.entered(next_token) is None:
        problems.append("n was never served")
    return problems


@scenario(
    "late-replays",
    kills=(
        "history-by-count",
        "withdraw-by-token-alone",
        "renew-no-owner-check",
        "floor-ignored",
        "young-loss-swept",
        "held-unvouched",
        "kept-held-swept",
        "granted-taken-as-settled",
    ),
    faults="a release re-sent after 80 other grants; a late acquire of a released request; "
    "a late renewal of a released lease; "
    "a late withdraw of a request that "
    "joined again under the same token; "
    "late floors: one sent while a request waited, read after its grant was evicted, "
    "and one that listed a request as held, read after its release",
)
async def late_replays(ctx: Context) -> Outcome:
    """Late copies of a request's scripts change nothing: a re-sent release (the
    same EVALSHA, captured and sent again) is "already released" however many
    grants came between, and a late withdraw of a ticket the token no longer has
    leaves its later grant alone."""
    server = ctx.servers()
    problems: list[str] = []
    cases = {
        "release": _release_replayed,
        "acquire": _acquire_replayed,
        "renew": _renew_replayed,
        "withdraw": _withdraw_replayed,
        "floor-after-loss": _floor_after_loss,
        "floor-after-release": _floor_after_release,
        "floor-below-kept": _floor_below_kept,
        "floor-past-grant": _floor_past_grant,
    }
    for label, case in cases.items():
        for attempt in range(3):
            try:
                found = await in_fresh_arena(
                    Arena(ctx, server.url, f"replay-{label}-{attempt}"), case
                )
            except NotStaged:
                continue  # the schedule did not happen as planned: stage it again
            problems += [f"{label}: {problem}" for problem in found]
            break
        else:
            problems.append(f"{label}: could not stage the case in 3 attempts")
    return outcome(ctx, "late-replays", problems)


RESENT_POLL_MS = 5000
"""Polls of the resent-release-handover scenario: far longer than its bound."""


@scenario(
    "resent-release-handover",
    kills=("resent-release-no-handover",),
    faults="a release executed twice, its first reply lost (the hand-over to a waiter "
    "of the same process was in it), after that waiter's first poll",
)
async def resent_release_handover(ctx: Context) -> Outcome:
    """A holder and a waiter share a client (one process, one session). The
    release hands the lock over in its reply, not by a ring; that reply is lost
    and the release re-sent (every script runs twice, the second reply read).
    The waiter must enter within a second, not at its next poll (5 s)."""
    ctx.dup_exec = True
    server = ctx.servers()
    arena = Arena(
        ctx, server.url, "resent-handover", lease_ms=4 * RESENT_POLL_MS, poll_ms=RESENT_POLL_MS
    )
    problems: list[str] = []
    try:
        lock, actor_h, lease = await arena.enter("h")
        actor_w = Actor(arena.record, "w")
        token = f"w-{ctx.rng.getrandbits(20):05x}"
        with script_calls() as recorded:
            waiting = asyncio.create_task(
                actor_w.attempt(lock, token, Plan(0.01, timeout_s=4 * RESENT_POLL_MS / 1000))
            )
            await arena.until(lambda: arena.queued(token), "w is queued")
            # Its reply, not only its sending: a poll sent on a connection still
            # being opened may reach Redis after the release and find w served.
            await arena.until(
                lambda: any(call.script.filename == "poll.lua" for call in recorded.answered),
                "w's group's first poll was answered (the next poll is 5 s away)",
            )
        await arena.leave(lock, actor_h, lease)
        problems += await arena.served(waiting, token, 1.0)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "resent-release-handover", problems)


ABANDON_LEASE_MS = 2000
"""Leases of the abandoned-requests scenario: a request left behind stalls the
lock ~2 s, against a bound of ``ABANDON_BOUND_S``."""
ABANDON_BOUND_S = 0.6
"""About a round trip (a withdrawal), with slack for a busy machine."""


async def _abandon(arena: Arena, who: str, *, how: str) -> list[str]:
    """An acquire whose reply never comes: its script ran, then its connection is
    killed (``how="killed"``, no redis-py retries: RedisUnavailable) or its reply
    is held past the acquire's timeout (``how="timeout"``)."""
    client = arena.client(who, retries=False)
    lock, actor = arena.lock(client), Actor(arena.record, who)
    token = f"{who}-{arena.ctx.rng.getrandbits(20):05x}"

    async def lose_reply(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name != "EVALSHA" or not names(args, token):
            return
        client.after_send = None
        await arena.until(lambda: _queued_or_held(arena, token), f"{who}'s acquire ran in Redis")
        if how == "timeout":
            await asyncio.Event().wait()  # the reply never comes: the timeout ends the call
        arena.faults.fault("clientkill", os.getpid())
        await kill_connections(arena, who)
        raise RedisConnectionError("Connection closed by server (CLIENT KILL)")

    client.after_send = lose_reply
    timeout_s = 0.3 if how == "timeout" else 5.0
    if await actor.acquire(lock, token, Plan(0, timeout_s=timeout_s)) is not None:
        return [f"{who}: the abandoned acquire returned a lease"]
    return []


async def _queued_or_held(arena: Arena, token: str) -> bool:
    if await arena.in_queue(token):
        return True
    return await arena.admin.hget(arena.keys.key("lease"), "token") == token.encode()


async def _abandoned_queued(arena: Arena) -> list[str]:
    """Three requests abandoned in the queue behind a holder; a live waiter behind
    them gets the lock within about a round trip of the holder leaving."""
    holder = await arena.enter("h")
    problems: list[str] = []
    for index, how in enumerate(("killed", "timeout", "killed")):
        problems += await _abandon(arena, f"x{index}", how=how)
    live, token = arena.waiter("l", Plan(0.01, timeout_s=10))
    await arena.until(lambda: arena.queued(token), "l is queued")
    await arena.leave(*holder)
    return problems + await arena.served(live, token, ABANDON_BOUND_S)


async def _abandoned_granted(arena: Arena) -> list[str]:
    """A free lock granted to an acquire whose reply was lost: it is given back,
    and the next caller gets the lock within about a round trip."""
    problems = await _abandon(arena, "x", how="killed")
    live, token = arena.waiter("l", Plan(0.01, timeout_s=10))
    return problems + await arena.served(live, token, ABANDON_BOUND_S)


@scenario(
    "abandoned-requests",
    kills=("abandoned-not-withdrawn",),
    faults="acquires whose reply never came (CLIENT KILL without retries; a reply held "
    "past the timeout), queued and granted",
)
async def abandoned_requests(ctx: Context) -> Outcome:
    """A request whose fate its process does not know is withdrawn as soon as Redis
    answers: the lock is free for a live waiter within about a round trip, not
    after the abandoned requests' leases or liveness run out (lease 2 s here)."""
    server = ctx.servers()
    problems: list[str] = []
    cases = {"queued": _abandoned_queued, "granted": _abandoned_granted}
    for label, case in cases.items():
        found = await in_fresh_arena(
            Arena(ctx, server.url, f"abandoned-{label}", lease_ms=ABANDON_LEASE_MS), case
        )
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "abandoned-requests", problems, handoff_ms=ABANDON_BOUND_S * 1000)


@scenario(
    "flushall",
    kills=("fence-restarts-at-1",),
    faults="FLUSHALL between grants, and under a holder and a waiter",
)
async def flushall(ctx: Context) -> Outcome:
    """Every key of the lock vanishes (FLUSHALL, as Django's cache.clear() can do,
    or the idle name's keys expiring): fences still rise, and the lock works."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "flushed")
    problems: list[str] = []
    try:
        for round_ in range(3):
            lock, actor = arena.contender(f"a{round_}")
            token = f"a{round_}-{ctx.rng.getrandbits(16):04x}"
            if await actor.attempt(lock, token, Plan(0.01, timeout_s=5)) is None:
                problems.append(f"round {round_}: the acquire failed")
            arena.faults.fault("delete", ",".join(KEY_PARTS))
            await arena.admin.flushall()
        lock_h, actor_h, lease_h = await arena.enter("h")
        waiter, token = arena.waiter("w", Plan(0.01, timeout_s=5))
        await arena.until(lambda: arena.queued(token), "w is queued")
        arena.faults.fault("delete", ",".join(KEY_PARTS))
        await arena.admin.flushall()
        await arena.leave(lock_h, actor_h, lease_h)
        problems += await arena.served(waiter, token, 5.0)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "flushall", problems)
