"""Fleet scenarios: real contender processes (``driver.Fleet``), many tasks each;
crashes, stops and pauses of processes and of the server."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tests.adversarial.actors import Plan, hold_and_release
from tests.adversarial.arena import Arena
from tests.adversarial.driver import Fleet
from tests.adversarial.faults import pause_server
from tests.adversarial.registry import LEASE_MS, POLL_MS, Context, Outcome, outcome, scenario

MIXED = {
    "locks": ["a", "b"],
    "tasks": 3,
    "rounds": 5,
    "start_after_ms": [0, 300],
    "long_share": 0.3,
    "long_hold_leases": [1.0, 3.0],
    "short_hold_ms": [0, 20],
    "timeout_share": 0.15,
    "timeout_ms": [0, 600],
    "cancel_share": 0.15,
    "cancel_after_ms": [0, 300],
    "repeat_share": 0.2,
    "hold_cm_share": 0.2,
}
"""A randomised mix: long holds (1-3 leases) among short ones, timeouts, random
cancellations, repeated releases, ``hold()`` and acquire/release, two locks."""

HANDOFF_MS = 500
"""Bound on a hand-off with the doorbell: normally a few ms; generous for 2 busy cores."""


@scenario(
    "mixed-holds",
    kills=("renewal-never-started", "fence-not-incremented"),
    faults="random cancellations and timeouts of acquire, repeated releases",
)
async def mixed_holds(ctx: Context) -> Outcome:
    """4 processes x 3 tasks x 5 requests on two locks, the randomised mix."""
    fleet = ctx.fleet(ctx.servers(), **MIXED)
    try:
        await asyncio.gather(*(fleet.spawn(f"p{i}") for i in range(4)))
        await fleet.finish(60)
    finally:
        await fleet.close()
    return outcome(ctx, "mixed-holds", fleet.problems, handoff_ms=HANDOFF_MS)


@scenario(
    "duplicate-execution",
    kills=("release-no-owner-check", "split-grant"),
    faults="every script call executed twice (a retried call after a lost reply)",
)
async def duplicate_execution(ctx: Context) -> Outcome:
    """The randomised mix with every client sending each script call twice."""
    ctx.dup_exec = True
    report = await mixed_holds(ctx)
    report.scenario = "duplicate-execution"
    return report


@scenario(
    "doorbell-removed",
    kills=("doorbell-only",),
    faults="no doorbell at all: every subscription fails",
)
async def doorbell_removed(ctx: Context) -> Outcome:
    """The mix without cancellations, doorbell gone: each hand-off within poll_ms + slack."""
    mix = {**MIXED, "cancel_share": 0.0, "timeout_share": 0.0, "rounds": 4}
    fleet = ctx.fleet(ctx.servers(), no_doorbell=True, **mix)
    try:
        await asyncio.gather(*(fleet.spawn(f"p{i}") for i in range(3)))
        await fleet.finish(45)
    finally:
        await fleet.close()
    return outcome(ctx, "doorbell-removed", fleet.problems, handoff_ms=POLL_MS + 250)


@scenario(
    "sigkill",
    kills=("renewal-never-started",),
    faults="SIGKILL of holder processes and of waiting processes, at random moments",
)
async def sigkill(ctx: Context) -> Outcome:
    """Kill a holder, then a waiter-only process, then a holder; replacements join.

    A killed holder must be replaced within one lease (plus a poll and slack);
    a dead waiter may stall a hand-off by one liveness window at most.
    """
    mix = {**MIXED, "locks": ["a"], "rounds": 6, "long_share": 0.4, "cancel_share": 0.05}
    fleet = ctx.fleet(ctx.servers(), **mix)
    rng = ctx.rng
    problems: list[str] = []
    try:
        await asyncio.gather(*(fleet.spawn(f"p{i}") for i in range(4)))
        for n, target in enumerate(("holder", "waiter", "holder")):
            await asyncio.sleep(rng.uniform(0.3, 1.2))  # a random moment of the schedule
            try:
                victim = await _victim(fleet, target, rng)
            except AssertionError as exc:
                problems.append(f"no {target} to kill: {exc}")
                continue
            await fleet.kill(victim)
            await fleet.spawn(f"r{n}")
        await fleet.finish(60)
    finally:
        await fleet.close()
    return outcome(
        ctx,
        "sigkill",
        fleet.problems + problems,
        handoff_ms=LEASE_MS + POLL_MS + HANDOFF_MS,
        recovery_ms=LEASE_MS + POLL_MS + HANDOFF_MS,
    )


async def _victim(fleet: Fleet, target: str, rng: random.Random) -> Any:
    """A live process of ``fleet`` inside lock ``a`` (holder) or only waiting (waiter)."""

    def holders() -> list[int]:
        return sorted({inside.pid for inside in fleet.inside("a")})

    def waiters() -> list[int]:
        busy = set(holders())
        return sorted(pid for pid in fleet.waiting("a") if pid not in busy)

    pids = await fleet.until(holders if target == "holder" else waiters, f"a {target} exists", 10)
    return fleet.by_pid(rng.choice(pids))


FROZEN_HOLD_LEASES = 20.0
"""The frozen holder's planned hold: long enough that starting three more
processes (seconds on a loaded CI machine) cannot outlast it."""


@scenario(
    "sigstop-holder",
    kills=("release-no-owner-check", "release-trusts-lease-gone"),
    faults="SIGSTOP of the holder for 2.5 leases, then SIGCONT",
)
async def sigstop_holder(ctx: Context) -> Outcome:
    """Freeze a holder longer than its lease: the lock moves on; when the holder
    resumes, its ``lease.lost`` is set at once and its release raises LeaseLost."""
    fleet = ctx.fleet(ctx.servers(), locks=["a"])
    rng = ctx.rng
    problems: list[str] = []
    try:
        holder = await fleet.spawn(
            "frozen", tasks=1, rounds=1, long_share=1.0, long_hold_leases=[FROZEN_HOLD_LEASES] * 2
        )
        entered = await fleet.until(lambda: fleet.inside("a"), "the holder entered")
        # The first in line holds 4 leases: it is inside while the frozen holder resumes.
        successor = await fleet.spawn(
            "next", tasks=1, rounds=1, long_share=1.0, long_hold_leases=[4.0, 4.0]
        )
        await fleet.until(lambda: fleet.waiting("a").get(successor.pid), "the successor waits")
        mix = {"tasks": 2, "rounds": 3, "long_share": 0.3, "long_hold_leases": [1.0, 2.0]}
        await asyncio.gather(fleet.spawn("w1", **mix), fleet.spawn("w2", **mix))
        await fleet.until(lambda: sum(fleet.waiting("a").values()) >= 3, "three requests wait")
        # A random moment of the hold, or one where the planned hold ends while
        # the holder is frozen: its hold and its renewal then wake together.
        planned_end_s = entered[0].entered_ns / 1e9 + FROZEN_HOLD_LEASES * LEASE_MS / 1000
        across_end_s = planned_end_s - 1.25 * LEASE_MS / 1000 - time.monotonic()
        if rng.random() < 0.5 and across_end_s > 0:
            await asyncio.sleep(across_end_s)  # a moment of the plan, not a synchronisation
        else:
            await asyncio.sleep(rng.uniform(0.0, 0.3))
        if not any(inside.pid == holder.pid for inside in fleet.inside("a")):
            problems.append(
                "the holder left before it could be frozen: the setup outlasted its "
                f"{FROZEN_HOLD_LEASES:g}-lease hold (a scenario fault, not the lock's)"
            )
            return outcome(ctx, "sigstop-holder", problems)
        await fleet.freeze(holder, 2.5 * LEASE_MS)
        resumed = time.monotonic_ns()
        await fleet.finish(45)
    finally:
        await fleet.close()
    problems += _frozen_holder_findings(fleet, holder.pid, resumed)
    return outcome(ctx, "sigstop-holder", fleet.problems + problems)


def _frozen_holder_findings(fleet: Fleet, pid: int, resumed_ns: int) -> list[str]:
    """The frozen holder saw lost soon after resuming, its release raised LeaseLost,
    and someone else got the lock while it was frozen."""
    lines = fleet.lines("a")
    mine = [line for line in lines if line.pid == pid]
    lost = [line.ns for line in mine if line.kind == "lost"]
    released = [line.fields[1] for line in mine if line.kind == "release"]
    others = [line.ns for line in lines if line.kind == "enter" and line.pid != pid]
    found = []
    if not lost:
        found.append("the frozen holder never saw lease.lost set after it resumed")
    elif (lost[0] - resumed_ns) / 1e6 > LEASE_MS + 200:
        found.append(
            f"the frozen holder saw lease.lost {(lost[0] - resumed_ns) / 1e6:.0f} ms after "
            f"it resumed (bound {LEASE_MS + 200} ms)"
        )
    if released != ["leaselost"]:
        found.append(f"the frozen holder's release gave {released}, expected ['leaselost']")
    if not any(ns < resumed_ns for ns in others):
        found.append("nobody got the lock while its holder was frozen for 2.5 leases")
    return found


@scenario(
    "dead-waiters",
    kills=("no-dead-waiter-skipping",),
    faults="SIGKILL of a process with 10 queued waiters, just before the hand-off",
)
async def dead_waiters(ctx: Context) -> Outcome:
    """Ten waiters of one process die just before the holder leaves: the live
    waiters behind them get the lock within about one liveness window in total."""
    fleet = ctx.fleet(ctx.servers(), locks=["a"], short_hold_ms=[0, 5], long_share=0.0)
    hold_leases = 8.0
    try:
        holder = await fleet.spawn(
            "holder", tasks=1, rounds=1, long_share=1.0, long_hold_leases=[hold_leases] * 2
        )
        entered = await fleet.until(lambda: fleet.inside("a"), "the holder entered")
        victim = await fleet.spawn("doomed", tasks=10, rounds=1)
        await fleet.until(lambda: fleet.waiting("a").get(victim.pid) == 10, "10 doomed wait")
        live = await fleet.spawn("live", tasks=2, rounds=1)
        await fleet.until(lambda: fleet.waiting("a").get(live.pid) == 2, "2 live waiters wait")
        leaves_at = entered[0].entered_ns / 1e9 + hold_leases * LEASE_MS / 1000
        before = ctx.rng.uniform(0.05, 0.3)  # a random moment shortly before the hand-off
        await asyncio.sleep(max(0.0, leaves_at - before - time.monotonic()))
        await fleet.kill(victim)
        await fleet.finish(30)
    finally:
        await fleet.close()
    problems = list(fleet.problems)
    if not any(line.kind == "exit" and line.pid == holder.pid for line in fleet.lines("a")):
        problems.append("the holder never left")
    return outcome(ctx, "dead-waiters", problems, handoff_ms=LEASE_MS + POLL_MS + HANDOFF_MS)


@scenario(
    "client-pause",
    kills=("doorbell-only",),
    faults="CLIENT PAUSE ALL for 2.5 leases while a holder holds and others wait",
)
async def client_pause(ctx: Context) -> Outcome:
    """Pause the whole server longer than a lease: holders learn they lost the
    lease (loudly), waiters recover, nobody hangs."""
    server = ctx.servers()
    mix = {"locks": ["a"], "tasks": 2, "rounds": 4, "long_share": 0.5, "retry_ms": 5000}
    fleet = ctx.fleet(server, **mix)
    admin = Redis.from_url(server.url)
    try:
        await asyncio.gather(*(fleet.spawn(f"p{i}") for i in range(3)))
        await fleet.until(
            lambda: fleet.inside("a") and sum(fleet.waiting("a").values()) >= 2,
            "a holder is inside and two requests wait",
        )
        await asyncio.sleep(ctx.rng.uniform(0.0, 0.2))  # a random moment of the hold
        await pause_server(admin, fleet.faults, round(2.5 * LEASE_MS))
        await fleet.finish(40)
    finally:
        await fleet.close()
        await admin.aclose()
    return outcome(ctx, "client-pause", fleet.problems)


@scenario(
    "client-pause-strict",
    kills=("renewal-unbounded",),
    faults="CLIENT PAUSE ALL for 3 leases; the holder must be told before its lease is gone",
)
async def client_pause_strict(ctx: Context) -> Outcome:
    """Read strictly, a pause excuses nothing: once the holder's lease has
    certainly expired on the server (a lease after its last confirmed renewal),
    ``lease.lost`` must already be set - the holder's own loop runs all along and
    can know - and no one may enter while it is not."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "paused")
    problems: list[str] = []
    try:
        lock_h, actor_h, lease_h = await arena.enter("h")
        waiter, token = arena.waiter("w", Plan(0.01, timeout_s=6))
        await arena.until(lambda: arena.queued(token), "w is queued")
        holding = asyncio.create_task(hold_and_release(actor_h, lock_h, lease_h, 10 * LEASE_MS))
        await asyncio.sleep(ctx.rng.uniform(0.0, LEASE_MS / 1000))  # a random moment of the hold
        pause_ms = 3 * LEASE_MS
        paused = asyncio.create_task(pause_server(arena.admin, arena.faults, pause_ms))
        # The last renewal confirmed before the pause gave at most lease_ms more.
        await asyncio.sleep((LEASE_MS + 200) / 1000)  # the lease is certainly gone by now
        if not lease_h.lost:
            problems.append(
                f"{LEASE_MS + 200} ms into a {pause_ms} ms pause the holder's lease had "
                "expired on the server, yet lease.lost was not set"
            )
        await paused
        await holding
        problems += await arena.served(waiter, token, 6.0)
    finally:
        await arena.close()
    return outcome(ctx, "client-pause-strict", problems, unexcused=frozenset({"pause"}))


@scenario(
    "server-restart",
    kills=("doorbell-only",),
    faults="SHUTDOWN NOSAVE of the server mid-run and a new, empty server on the same port",
)
async def server_restart(ctx: Context) -> Outcome:
    """The server restarts empty: holders and waiters fail loudly or recover
    (retrying with the same token), and nobody hangs. Fences restart with the
    lost counter, which the lock does not promise to survive."""
    server = ctx.servers()
    mix = {"locks": ["a"], "tasks": 3, "rounds": 4, "long_share": 0.4, "retry_ms": 6000}
    fleet = ctx.fleet(server, **mix)
    try:
        await asyncio.gather(*(fleet.spawn(f"p{i}") for i in range(3)))
        await fleet.until(
            lambda: fleet.inside("a") and sum(fleet.waiting("a").values()) >= 2,
            "a holder is inside and two requests wait",
        )
        await asyncio.sleep(ctx.rng.uniform(0.0, 0.3))  # a random moment of the hold
        admin = Redis.from_url(server.url)
        fleet.faults.fault("restart", server.port)
        with contextlib.suppress(RedisError):  # the server drops us as it goes down
            await admin.shutdown(nosave=True)
        await admin.aclose()
        await asyncio.sleep(ctx.rng.uniform(0.2, 0.8))  # the fault itself: the server is down
        ctx.servers(port=server.port)
        fleet.faults.fault("restarted", server.port)
        await fleet.finish(45)
    finally:
        await fleet.close()
    return outcome(ctx, "server-restart", fleet.problems)
