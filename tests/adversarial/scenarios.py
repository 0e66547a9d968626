"""The adversarial scenarios: each attacks one guarantee and returns what went wrong.

A scenario is an ``async`` function of a ``Context`` (seed, run directory, a
factory of private Redis servers, and the lock variant to attack: ``"real"`` or
a mutant's name) that returns an ``Outcome``: the checker's report on the shared
record plus the scenario's own findings. It never asserts: the real-lock tests
assert that an outcome is clean, the mutant tests that it is not.

Fleet scenarios run real contender processes (``driver.Fleet``); the others
run several clients - several sessions - in this process (``Arena``), where
faults can be placed at exact stages. Every scenario that needs a broken
server (paused, evicting, restarted) gets a fresh one.

Timing: ``lease_ms`` 400 and ``poll_ms`` 100 unless a scenario says otherwise,
so long holds span many polls and several leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from redis_fifo_lock import FifoLock
from redis_fifo_lock.testing import PrivateRedis, PrivateRedisFactory
from redis_fifo_lock.waiting import hub_for
from tests.adversarial.actors import Actor, Plan, recorded
from tests.adversarial.checker import Report, check
from tests.adversarial.clients import StagedRedis, make_client
from tests.adversarial.driver import Fleet
from tests.adversarial.mutants import variant
from tests.adversarial.replay import tapped
from tests.support.record import Record, read_lines
from tests.support.replay import reply_code

T = TypeVar("T")

LEASE_MS = 400
POLL_MS = 100
LAG_MS = LEASE_MS // 3
"""A contender records a ``lag`` fault when its event loop stalls longer than this."""
LEARN_MS = LEASE_MS + 500
"""A holder hit by a fault must see ``lease.lost`` within this long of the fault's
end: a lease at most, plus slack for a busy machine."""


@dataclass
class Context:
    """What a scenario runs against.

    Attributes:
        seed: the seed of every random choice the scenario makes.
        run_dir: an empty directory for the record and the contenders' stderr.
        servers: starts private Redis servers (the ``fresh_redis_server`` fixture).
        mutant: ``"real"`` or the name of the mutant under attack.
        dup_exec: every client sends each script call twice.
    """

    seed: int
    run_dir: Path
    servers: PrivateRedisFactory
    mutant: str = "real"
    dup_exec: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def fleet(self, server: PrivateRedis, **defaults: Any) -> Fleet:
        """A fleet on ``server`` whose contenders all run this context's variant."""
        base = {
            "lease_ms": LEASE_MS,
            "poll_ms": POLL_MS,
            "mutant": self.mutant,
            "dup_exec": self.dup_exec,
            "lag_fault_ms": LAG_MS,
        }
        return Fleet(server.url, self.run_dir, self.rng.getrandbits(32), {**base, **defaults})


@dataclass
class Outcome:
    """What a scenario found."""

    scenario: str
    seed: int
    report: Report
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def violations(self) -> list[str]:
        """Every violation: the checker's and the scenario's own."""
        return self.report.violations + self.problems

    def summary(self) -> str:
        """One paragraph for logs and assertion messages."""
        faults = ", ".join(f"{kind}={n}" for kind, n in sorted(self.report.faults.items()))
        head = (
            f"{self.scenario} (seed {self.seed}): {self.report.entries} record entries, "
            f"{self.report.holds} holds, {self.report.requests} requests, faults "
            f"[{faults or 'none'}], {len(self.violations)} violations, "
            f"{len(self.report.known)} known-bug findings, {self.seconds:.1f} s"
        )
        shown = self.violations[:15]
        more = len(self.violations) - len(shown)
        lines = [head, *(f"  - {v}" for v in shown)]
        if more:
            lines.append(f"  ... and {more} more")
        return "\n".join(lines)


ScenarioFn = Callable[[Context], Coroutine[Any, Any, Outcome]]


@dataclass(frozen=True)
class Scenario:
    """A registered scenario and the mutants it is expected to kill."""

    name: str
    run: ScenarioFn
    kills: tuple[str, ...]
    faults: str


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str, *, kills: tuple[str, ...], faults: str
) -> Callable[[ScenarioFn], ScenarioFn]:
    """Register ``fn`` as the scenario ``name`` that must kill ``kills``."""

    def register(fn: ScenarioFn) -> ScenarioFn:
        SCENARIOS[name] = Scenario(name, fn, kills, faults)
        return fn

    return register


SCENARIO_TIMEOUT_S = 90.0
"""No scenario takes a quarter of this against the real lock; a mutant that makes
one hang is reported at this bound instead of hanging the test."""

CRASH = "CRASH: "
"""Prefix of a finding that is the scenario's own failure, not the lock's: it fails
a real-lock test, and never counts as killing a mutant."""


async def run(name: str, ctx: Context) -> Outcome:
    """Run scenario ``name`` in ``ctx`` with the context's variant installed.

    A scenario that hangs or raises still yields an ``Outcome``: a hang, or an
    ``AssertionError``/``TimeoutError`` (a state the lock never reached), is a
    finding; any other exception is a ``CRASH:`` of the harness. Every task the
    scenario left behind is cancelled, repeatedly if need be (Python 3.11's
    ``wait_for`` can swallow one cancellation), so the loop can close.
    """
    started = time.monotonic()
    before = asyncio.all_tasks()
    with variant(ctx.mutant).installed():
        task = asyncio.create_task(SCENARIOS[name].run(ctx))
        done, _ = await asyncio.wait({task}, timeout=SCENARIO_TIMEOUT_S)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=5)
            result = outcome(ctx, name, [f"the scenario hung for {SCENARIO_TIMEOUT_S:g} s"])
        elif task.exception() is None:
            result = task.result()
        else:
            exc = task.exception()
            finding = isinstance(exc, (AssertionError, asyncio.TimeoutError))
            prefix = "" if finding else CRASH
            result = outcome(ctx, name, [f"{prefix}the scenario stopped: {exc!r}"])
        await reap(before | {task})
    result.seconds = time.monotonic() - started
    return result


async def reap(keep: set[asyncio.Task[Any]]) -> None:
    """Cancel every task but ``keep`` and the current one until they are gone
    (at most ~5 s: a task that still runs then is left to the loop's close)."""
    for _ in range(50):
        current = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t not in keep and t is not current]
        if not left:
            return
        for leftover in left:
            leftover.cancel()
        await asyncio.wait(left, timeout=0.1)


def outcome(
    ctx: Context,
    name: str,
    problems: list[str],
    *,
    handoff_ms: float | None = None,
    recovery_ms: float | None = None,
    unexcused: frozenset[str] = frozenset(),
    learn_ms: float | None = None,
) -> Outcome:
    """Check the run's record (see ``checker.check`` for the options) into an ``Outcome``."""
    report = check(
        ctx.run_dir,
        handoff_ms=handoff_ms,
        recovery_ms=recovery_ms,
        unexcused=unexcused,
        learn_ms=LEARN_MS if learn_ms is None else learn_ms,
    )
    return Outcome(name, ctx.seed, report, problems)


# --- fleets: several processes, many tasks ----------------------------------------------

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


@scenario(
    "sigstop-holder",
    kills=("release-no-owner-check",),
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
            "frozen", tasks=1, rounds=1, long_share=1.0, long_hold_leases=[8.0, 8.0]
        )
        await fleet.until(lambda: fleet.inside("a"), "the holder entered")
        # The first in line holds 4 leases: it is inside while the frozen holder resumes.
        successor = await fleet.spawn(
            "next", tasks=1, rounds=1, long_share=1.0, long_hold_leases=[4.0, 4.0]
        )
        await fleet.until(lambda: fleet.waiting("a").get(successor.pid), "the successor waits")
        mix = {"tasks": 2, "rounds": 3, "long_share": 0.3, "long_hold_leases": [1.0, 2.0]}
        await asyncio.gather(fleet.spawn("w1", **mix), fleet.spawn("w2", **mix))
        await fleet.until(lambda: sum(fleet.waiting("a").values()) >= 3, "three requests wait")
        await asyncio.sleep(rng.uniform(0.0, 0.3))  # a random moment of the hold
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


async def pause_server(admin: Redis, faults: Record, pause_ms: int) -> None:
    """``CLIENT PAUSE ALL`` for ``pause_ms`` and wait it out; recorded as a fault."""
    faults.fault("pause", f"{pause_ms}ms")
    await admin.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")  # type: ignore[no-untyped-call]
    await asyncio.sleep(pause_ms / 1000)  # the fault itself: the server is paused


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
        holding = asyncio.create_task(_hold_and_release(actor_h, lock_h, lease_h, 10 * LEASE_MS))
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


# --- in-process arenas: exact stages --------------------------------------------------


class Arena:
    """Several contenders of one lock in this process, each on its own client (so
    each is its own waiting session), writing to the run's shared record.

    Args:
        ctx: the scenario's context (variant, duplicate execution, record dir).
        url: the server.
        name: the lock name.
        settings: ``lease_ms``, ``poll_ms``, ``max_hold_ms``.
    """

    def __init__(self, ctx: Context, url: str, name: str, **settings: int) -> None:
        self.ctx = ctx
        self.url = url
        self.name = name
        self.settings = {"lease_ms": LEASE_MS, "poll_ms": POLL_MS, **settings}
        self.record = Record(ctx.run_dir / f"{name}.rec")
        self.faults = Record(ctx.run_dir / "faults.rec")
        self.admin = Redis.from_url(url)
        self.clients: list[Redis] = [self.admin]
        self.keys = FifoLock(self.admin, name).keys

    def client(self, who: str, *, retries: bool = True) -> StagedRedis:
        """A new client (a new session) for contender ``who``."""
        client = make_client(
            self.url, dup_exec=self.ctx.dup_exec, name=f"adv-{who}", retries=retries
        )
        self.clients.append(client)
        return client

    def lock(self, client: Redis) -> FifoLock:
        """The variant under attack, on ``client``, recording its acquire replies."""
        lock = variant(self.ctx.mutant).lock(client, self.name, **self.settings)
        return recorded(lock, self.record, self.faults)

    def contender(self, who: str, *, retries: bool = True) -> tuple[FifoLock, Actor]:
        """A lock on a client of its own, and an actor recording as ``who``."""
        return self.lock(self.client(who, retries=retries)), Actor(self.record, who)

    async def enter(self, who: str) -> tuple[FifoLock, Actor, Any]:
        """A contender that acquires now and is inside when this returns."""
        lock, actor = self.contender(who)
        token = f"{who}-{self.ctx.rng.getrandbits(20):05x}"
        lease = await actor.acquire(lock, token, Plan(0, timeout_s=5))
        assert lease is not None, f"{who} could not enter {self.name!r}"
        return lock, actor, lease

    async def leave(self, lock: FifoLock, actor: Actor, lease: Any) -> str:
        """Record the exit and release."""
        actor.record.exit(lease)
        return await actor.release(lock, lease, Plan(0))

    def queued(self, token: str) -> bool:
        """Whether the record shows ``token``'s acquire reply."""
        return any(
            line.kind == "queued" and line.fields[0] == token
            for line in read_lines(self.record.path)
        )

    def entered(self, token: str) -> int | None:
        """When ``token`` entered, from the record (None if it has not)."""
        return next(
            (
                line.ns
                for line in read_lines(self.record.path)
                if line.kind == "enter" and line.fields[0] == token
            ),
            None,
        )

    async def until(self, check: Callable[[], Any], what: str, timeout_s: float = 10) -> Any:
        """Re-check ``check`` (record or Redis state) until truthy; AssertionError after
        ``timeout_s`` seconds. There is no event for state another session made."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g} s waiting until {what}")
            await asyncio.sleep(0.002)

    async def in_queue(self, token: str) -> bool:
        """Whether Redis has ``token`` queued (read only to synchronise the test)."""
        return await self.admin.zscore(self.keys.key("queue"), token) is not None

    def waiter(self, who: str, plan: Plan) -> tuple[asyncio.Task[Any], str]:
        """Start a contender's request in a task; returns (task, token)."""
        lock, actor = self.contender(who)
        token = f"{who}-{self.ctx.rng.getrandbits(20):05x}"
        return asyncio.create_task(actor.attempt(lock, token, plan)), token

    async def served(self, task: asyncio.Task[Any], token: str, bound_s: float) -> list[str]:
        """Wait for ``task``'s request; a problem if it did not enter within ``bound_s``."""
        done, _ = await asyncio.wait({task}, timeout=bound_s)
        if not done and self.entered(token) is None:
            problem = f"{token} was not granted within {bound_s:g} s: the lock stalled"
            await asyncio.wait({task}, timeout=self.settings["lease_ms"] / 1000 * 3)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            return [problem]
        await asyncio.gather(task, return_exceptions=True)
        if self.entered(token) is None:
            return [f"{token} ended without being granted"]
        return []

    async def consistent(self) -> list[str]:
        """A plain acquire and release work at once and leave nothing behind."""
        lock, actor = self.contender("probe")
        token = f"probe-{self.ctx.rng.getrandbits(20):05x}"
        started = time.monotonic()
        lease = await actor.attempt(
            lock, token, Plan(0, timeout_s=self.settings["lease_ms"] / 1000 * 2)
        )
        problems = []
        if lease is None:
            problems.append("the next normal acquire failed: the lock was left inconsistent")
        elif time.monotonic() - started > self.settings["lease_ms"] / 1000 + 0.5:
            problems.append(f"the next normal acquire took {time.monotonic() - started:.2f} s")
        status = await lock.status()
        if status.held or status.waiting:
            problems.append(f"left behind: {status}")
        return problems

    async def load_scripts(self) -> None:
        """Load the variant's scripts, so no first call of a stage meets NOSCRIPT."""
        for script in variant(self.ctx.mutant).protocol().scripts.values():
            await self.admin.script_load(script.source)

    async def close(self) -> None:
        """Close every client of the arena."""
        for client in self.clients:
            await client.aclose()


async def cancel_and_record(arena: Arena, task: asyncio.Task[Any], token: str) -> list[str]:
    """Cancel the acquire ``task`` of ``token``; record it; problems if it did not end so.

    An acquire that had already returned when the cancellation came (the stage
    missed its moment, as when every call runs twice) is recorded as a normal
    hold, not blamed on the lock.
    """
    finished = task.done()
    arena.record.cancel(token)
    task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        arena.record.gave_up(token, "cancelled")
        return []
    except Exception as exc:  # any other ending is the finding
        arena.record.gave_up(token, f"error:{type(exc).__name__}")
        return [f"cancelling {token} raised {exc!r} instead of CancelledError"]
    arena.record.enter(lease, "late")
    arena.record.exit(lease)
    await arena.lock(arena.admin).release(lease)
    arena.record.released(lease, "ok")
    if finished:
        return []
    return [f"{token}: the acquire returned a lease although it was cancelled before returning"]


STAGE_LEASE_MS = 2000
"""Cancellation stages use a long lease, so a stall (a grant left behind) is ~2 s
against a hand-off bound of 1 s: the difference cannot be noise."""
STAGE_BOUND_S = 1.0

Stage = Callable[[Arena], Awaitable[list[str]]]


def hold_at(
    client: StagedRedis, command: str, token: str | None = None
) -> tuple[asyncio.Event, asyncio.Event]:
    """Stop ``client``'s first ``command`` call (naming ``token``, if given) between
    send and reply. Returns (reached, proceed): ``reached`` is set when the call
    was sent; the reply is read once ``proceed`` is set."""
    reached, proceed = asyncio.Event(), asyncio.Event()

    async def hook(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name.split(" ")[0] != command or reached.is_set():
            return
        if token is not None and token not in (
            a.decode() if isinstance(a, bytes) else a for a in args
        ):
            return
        reached.set()
        await proceed.wait()

    client.after_send = hook
    return reached, proceed


async def stage_before_send(arena: Arena) -> list[str]:
    """Cancelled before the acquire task ever ran: nothing reaches Redis."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    victim, _ = arena.contender("v")
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    problems = await cancel_and_record(arena, task, "v")
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_policy_check(arena: Arena) -> list[str]:
    """Cancelled during the first call a process makes to a server (its check of
    the eviction policy). The arena's server is fresh: nothing checked it yet."""
    client = arena.client("v")
    victim = arena.lock(client)
    reached, proceed = hold_at(client, "CONFIG")
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await asyncio.wait_for(reached.wait(), 5)
    cancelled = asyncio.create_task(cancel_and_record(arena, task, "v"))
    await asyncio.sleep(0)  # let the cancellation land while the call is held
    proceed.set()
    problems = await cancelled
    lock_h, actor_h, lease_h = await arena.enter("h")
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def _sent_before_reply(arena: Arena, held: bool) -> list[str]:
    """The acquire script was sent and ran; the caller is cancelled before its reply."""
    holder = await arena.enter("h") if held else None
    client = arena.client("v")
    victim = arena.lock(client)
    reached, proceed = hold_at(client, "EVALSHA", "v")
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await asyncio.wait_for(reached.wait(), 5)
    if held:
        await arena.until(lambda: arena.in_queue("v"), "v is queued in Redis")
    else:
        await arena.until(lambda: _held(arena), "v's grant is in Redis")
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    cancelled = asyncio.create_task(cancel_and_record(arena, task, "v"))
    await asyncio.sleep(0)  # the cancellation lands while the reply is held back
    proceed.set()
    problems = await cancelled
    if holder is not None:
        await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def _held(arena: Arena) -> bool:
    return bool(await arena.admin.exists(arena.keys.key("lease")))


async def stage_sent_queued(arena: Arena) -> list[str]:
    """After the acquire script queued the request, before its reply arrived."""
    return await _sent_before_reply(arena, held=True)


async def stage_sent_granted(arena: Arena) -> list[str]:
    """After the acquire script granted the lock, before its reply arrived."""
    return await _sent_before_reply(arena, held=False)


async def _queued_victim(arena: Arena) -> tuple[Any, asyncio.Task[Any], StagedRedis]:
    """A holder inside, and the victim ``v`` queued and waiting behind it."""
    holder = await arena.enter("h")
    client = arena.client("v")
    victim = arena.lock(client)
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await arena.until(lambda: arena.queued("v"), "v is queued")
    return holder, task, client


async def stage_waiting(arena: Arena) -> list[str]:
    """Cancelled while queued and waiting for the grant."""
    holder, task, _ = await _queued_victim(arena)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    problems = await cancel_and_record(arena, task, "v")
    await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_grant_landed(arena: Arena) -> list[str]:
    """The grant landed in Redis, and the waiter is cancelled before it noticed."""
    (lock_h, actor_h, lease_h), task, _ = await _queued_victim(arena)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)  # hands the lock to v in Redis ...
    problems = await cancel_and_record(arena, task, "v")  # ... cancelled in the same tick
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_rung(arena: Arena) -> list[str]:
    """The grant reached the waiter (its future is done) but its task has not resumed.

    The cancelling callback is attached to the waiter's future while the acquire
    script is in flight, before the acquiring task awaits that future, so it runs
    before the task's own wake-up.
    """
    from redis_fifo_lock.waiting import hub_for

    lock_h, actor_h, lease_h = await arena.enter("h")
    client = arena.client("v")
    victim = arena.lock(client)
    task: asyncio.Task[Any] | None = None
    attached = asyncio.Event()

    def cancel_on_ring(_: object) -> None:
        assert task is not None
        arena.record.cancel("v")
        task.cancel()

    async def attach(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name != "EVALSHA" or attached.is_set():
            return
        groups = [group for group in hub_for(client).groups.values() if "v" in group.waiters]
        assert len(groups) == 1, "the core's wait groups changed; update stage_rung"
        # The waiter's hint: set by the ring (or a poll), before the task claims.
        groups[0].waiters["v"]._hint.add_done_callback(cancel_on_ring)
        attached.set()

    client.after_send = attach
    arena.record.request("v", None, "v")
    task = asyncio.create_task(victim.acquire(token="v"))
    await arena.until(lambda: arena.queued("v"), "v is queued")
    client.after_send = None
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(lock_h, actor_h, lease_h)
    await asyncio.wait({task}, timeout=STAGE_LEASE_MS / 1000 * 2)
    if not task.done():
        task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        arena.record.gave_up("v", "cancelled")
        problems = []
    else:
        arena.record.gave_up("v", "cancelled-too-late")
        await victim.release(lease)
        problems = ["v's acquire returned a lease although it was cancelled when rung"]
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_timeout(arena: Arena) -> list[str]:
    """Timed out while queued."""
    holder = await arena.enter("h")
    victim, _ = arena.waiter("v", Plan(0.01, timeout_s=0.2))
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await victim
    problems = [] if arena.entered("v") is None else ["v entered despite its timeout"]
    await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_timeout_zero(arena: Arena) -> list[str]:
    """``timeout=0`` on a held lock: one try, then withdrawn."""
    holder = await arena.enter("h")
    victim, _ = arena.waiter("v", Plan(0.01, timeout_s=0))
    await victim
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    await arena.leave(*holder)
    return await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_cancelled_twice(arena: Arena) -> list[str]:
    """Cancelled, and cancelled again while its withdrawal is on the wire."""
    holder, task, client = await _queued_victim(arena)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")

    async def second_cancel(conn: Any, name: str, args: tuple[Any, ...]) -> None:
        if name == "EVALSHA" and not task.done():
            arena.record.cancel("v")
            task.cancel()

    client.after_send = second_cancel
    problems = await cancel_and_record(arena, task, "v")
    await arena.leave(*holder)
    return problems + await arena.served(nxt, token, STAGE_BOUND_S)


async def stage_hold_body(arena: Arena) -> list[str]:
    """Cancelled inside ``async with lock.hold()``: the release still goes out."""
    client = arena.client("v")
    lock = arena.lock(client)
    entered = asyncio.Event()
    box: dict[str, Any] = {}

    async def body() -> None:
        arena.record.request("v", None, "v")
        async with lock.hold(token="v") as lease:
            box["lease"] = lease
            arena.record.enter(lease, "v")
            entered.set()
            try:
                await asyncio.Event().wait()  # inside until cancelled
            finally:
                arena.record.exit(lease)

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), 5)
    nxt, token = arena.waiter("n", Plan(0.01))
    await arena.until(lambda: arena.queued(token), "n is queued")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    lease = box["lease"]
    arena.record.released(lease, "ok" if lease.released and not lease.lost else "leaselost")
    return await arena.served(nxt, token, STAGE_BOUND_S)


CANCEL_STAGES: tuple[Stage, ...] = (
    stage_before_send,
    stage_policy_check,
    stage_sent_queued,
    stage_sent_granted,
    stage_waiting,
    stage_grant_landed,
    stage_rung,
    stage_timeout,
    stage_timeout_zero,
    stage_cancelled_twice,
    stage_hold_body,
)


@scenario(
    "cancel-stages",
    kills=("cancel-without-withdraw", "withdraw-keeps-grant", "abandoned-not-withdrawn"),
    faults="asyncio cancellation (and timeouts) of acquire at every stage",
)
async def cancel_stages(ctx: Context) -> Outcome:
    """Cancel an acquire at each stage in turn; the waiter behind it must never stall."""
    server = ctx.servers()
    problems: list[str] = []
    for stage in CANCEL_STAGES:
        label = stage.__name__.removeprefix("stage_").replace("_", "-")
        # The policy check runs once per server and process: that stage needs a new one.
        url = ctx.servers().url if stage is stage_policy_check else server.url
        arena = Arena(ctx, url, f"cancel-{label}", lease_ms=STAGE_LEASE_MS)
        try:
            if stage is not stage_policy_check:
                await arena.load_scripts()
            found = await stage(arena)
            found += await arena.consistent()
        finally:
            await arena.close()
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "cancel-stages", problems, handoff_ms=STAGE_BOUND_S * 1000)


# --- dropped connections, late and repeated releases ------------------------------------


async def kill_connections(arena: Arena, who: str) -> int:
    """``CLIENT KILL`` every connection of contender ``who``; returns how many."""
    victims = [c for c in await arena.admin.client_list() if c.get("name") == f"adv-{who}"]
    for entry in victims:
        await arena.admin.client_kill_filter(_id=entry["id"])
    return len(victims)


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
        if name != "EVALSHA" or "v" not in [
            a.decode() if isinstance(a, bytes) else a for a in args
        ]:
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
    if resent and not held and status.fence != seen.get("fence"):
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
        arena = Arena(ctx, server.url, f"retry-{label}")
        try:
            await arena.load_scripts()
            found = await _reply_lost(arena, held=held, resent=False)
            found += await arena.consistent()
        finally:
            await arena.close()
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
        arena = Arena(ctx, server.url, f"killed-{label}", lease_ms=lease_ms)
        try:
            await arena.load_scripts()
            found = await case(arena)
            found += await arena.consistent()
        finally:
            await arena.close()
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
    kills=("release-no-owner-check",),
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


# --- keys lost: eviction, deletion; max_hold_ms ---------------------------------------


EVICTION_STEP_BYTES = 512
"""Size of each filler write that pushes the server past ``maxmemory``."""


async def evict_lease(arena: Arena) -> list[str]:
    """Evict the lease key the way a full server would. Under ``volatile-ttl`` the
    key closest to expiring goes first: the lease (``lease_ms``; the other keys
    live ``keep_ms``). ``maxmemory`` is set just above use and small filler keys
    are written until the lease is gone, then the limit is restored. Any other
    key of the lock evicted on the way is recorded as deleted. Problems if the
    lease survived."""
    admin = arena.admin
    parts = ("queue", "waiters", "alive", "lease", "counters", "finished")
    before = {part for part in parts if await admin.exists(arena.keys.key(part))}
    used = int((await admin.info("memory"))["used_memory"])
    arena.faults.fault("evict", "lease")
    await admin.config_set("maxmemory", used + 4 * 1024)
    fillers = []
    try:
        for index in range(1024):
            fillers.append(f"adv:filler:{index}")
            try:
                await admin.set(fillers[-1], b"x" * EVICTION_STEP_BYTES)
            except RedisError:
                break  # OOM: nothing volatile left to evict
            if not await admin.exists(arena.keys.key("lease")):
                break
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.delete(*fillers)
    gone = [
        part
        for part in parts
        if part in before and part != "lease" and not await admin.exists(arena.keys.key(part))
    ]
    if gone:
        arena.faults.fault("delete", ",".join(gone))
    if await admin.exists(arena.keys.key("lease")):
        return ["the lease key survived the eviction attempt"]
    return []


@scenario(
    "lease-evicted",
    kills=("release-no-owner-check",),
    faults="the lease key evicted under a tiny maxmemory with volatile-ttl",
)
async def lease_evicted(ctx: Context) -> Outcome:
    """The lease vanishes under a holder: it learns at its next renewal (lease.lost,
    LeaseLost at release), the queue goes on in order, a newcomer waits its turn,
    and the holder's late release frees nobody else."""
    server = ctx.servers(["--maxmemory-policy", "volatile-ttl"])
    arena = Arena(ctx, server.url, "evicted")
    try:
        lock_a, actor_a, lease_a = await arena.enter("a")
        second, second_token = arena.waiter("b", Plan(2.5 * LEASE_MS / 1000, timeout_s=5))
        await arena.until(lambda: arena.queued(second_token), "b is queued")
        third, third_token = arena.waiter("c", Plan(0.01, timeout_s=5))
        await arena.until(lambda: arena.queued(third_token), "c is queued")
        holding = asyncio.create_task(
            _hold_and_release(
                actor_a,
                lock_a,
                lease_a,
                10 * LEASE_MS,
                # A release that arrives once the next holder is in: it must free nobody.
                until=lambda: arena.until(lambda: arena.entered(second_token), "b entered", 5),
            )
        )
        await asyncio.sleep(ctx.rng.uniform(0.0, LEASE_MS / 1000))  # a random moment of the hold
        evicted_at = time.monotonic_ns()
        problems = await evict_lease(arena)
        newcomer, newcomer_token = arena.waiter("d", Plan(0.01, timeout_s=5))
        outcome_a = await holding
        if outcome_a != "leaselost":
            problems.append(f"the holder's release gave {outcome_a!r}, expected LeaseLost")
        lost = _first(arena, "lost", lease_a.token)
        if lost is None:
            problems.append("the holder never saw lease.lost set")
        elif (lost - evicted_at) / 1e6 > LEASE_MS / 3 + 400:
            problems.append(f"lease.lost was set {(lost - evicted_at) / 1e6:.0f} ms after eviction")
        for task, token in (
            (second, second_token),
            (third, third_token),
            (newcomer, newcomer_token),
        ):
            problems += await arena.served(task, token, 5.0)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "lease-evicted", problems)


async def _hold_and_release(
    actor: Actor,
    lock: FifoLock,
    lease: Any,
    max_ms: float,
    until: Callable[[], Awaitable[Any]] | None = None,
) -> str:
    """Hold until the lease is lost (at most ``max_ms``), then release - after
    ``await until()``, if given; returns the release's outcome."""
    await actor.hold(lease, max_ms / 1000)
    if until is not None:
        with contextlib.suppress(AssertionError):
            await until()  # the release is late on purpose
    return await actor.release(lock, lease, Plan(0, repeat_release=True))


def _first(arena: Arena, kind: str, token: str) -> int | None:
    """When the first ``kind`` line for ``token`` was written (None if none)."""
    return next(
        (
            line.ns
            for line in read_lines(arena.record.path)
            if line.kind == kind and line.fields[0] == token
        ),
        None,
    )


KEY_PARTS = ("queue", "waiters", "alive", "lease", "counters", "finished")


@scenario(
    "keys-missing",
    kills=("grant-not-head", "fence-restarts-at-1"),
    faults="subsets of the six lock keys deleted while a holder holds and others wait",
)
async def keys_missing(ctx: Context) -> Outcome:
    """Delete a subset of the lock's keys under load: no script raises a Lua
    error, every waiter is served, and the lock is usable again within a lease.

    Always {lease}, {lease, counters} and all six; then random subsets. Fences
    must still rise (they are dated by the server's clock).
    """
    server = ctx.servers()
    subsets = [("lease",), ("lease", "counters"), KEY_PARTS]
    while len(subsets) < 8:
        size = ctx.rng.randint(1, len(KEY_PARTS))
        subsets.append(tuple(sorted(ctx.rng.sample(KEY_PARTS, size), key=KEY_PARTS.index)))
    problems: list[str] = []
    for index, parts in enumerate(subsets):
        arena = Arena(ctx, server.url, f"keys-{index}")
        try:
            found = await _delete_keys(arena, parts)
            found += await arena.consistent()
        finally:
            await arena.close()
        problems += [f"{'+'.join(parts)}: {problem}" for problem in found]
    return outcome(ctx, "keys-missing", problems)


async def _delete_keys(arena: Arena, parts: tuple[str, ...]) -> list[str]:
    lock_a, actor_a, lease_a = await arena.enter("a")
    waiters = []
    for who in ("b", "c"):
        task, token = arena.waiter(who, Plan(0.02, timeout_s=4))
        await arena.until(partial(arena.queued, token), f"{who} is queued")
        waiters.append((task, token))
    holding = asyncio.create_task(_hold_and_release(actor_a, lock_a, lease_a, 2 * LEASE_MS))
    await asyncio.sleep(0.02)  # a moment into the hold
    deleted_at = time.monotonic_ns()
    arena.faults.fault("delete", ",".join(parts))
    await arena.admin.delete(*(arena.keys.key(part) for part in parts))
    waiters.append(arena.waiter("d", Plan(0.02, timeout_s=4)))
    await holding
    problems = []
    for task, token in waiters:
        problems += await arena.served(task, token, 5.0)
    entries = [
        line.ns
        for line in read_lines(arena.record.path)
        if line.kind == "enter" and line.ns > deleted_at and not line.fields[0].startswith("a-")
    ]
    left = _first(arena, "exit", lease_a.token) or deleted_at
    usable_by = max(left, deleted_at) + (LEASE_MS + POLL_MS + 300) * 1_000_000
    if not entries or min(entries) > usable_by:
        took = (min(entries) - max(left, deleted_at)) / 1e6 if entries else math.inf
        problems.append(f"the first grant after the holder left took {took:.0f} ms")
    return problems


MAX_HOLD_MS = 1200


@scenario(
    "max-hold",
    kills=("max-hold-ignored",),
    faults="a live holder that never releases (abandoned), past max_hold_ms",
)
async def max_hold(ctx: Context) -> Outcome:
    """An abandoned holder keeps renewing: at max_hold_ms Redis refuses, its
    lease.lost is set, and the waiter behind it gets the lock."""
    server = ctx.servers()
    arena = Arena(ctx, server.url, "abandoned", max_hold_ms=MAX_HOLD_MS)
    try:
        lock_a, actor_a, lease_a = await arena.enter("a")
        arena.faults.fault("overhold", lease_a.token)
        entered = _first(arena, "enter", lease_a.token) or time.monotonic_ns()
        waiter, token = arena.waiter("b", Plan(0.01, timeout_s=4))
        await arena.until(lambda: arena.queued(token), "b is queued")
        outcome_a = await _hold_and_release(actor_a, lock_a, lease_a, 6000)
        problems = await arena.served(waiter, token, 4.0)
        lost = _first(arena, "lost", lease_a.token)
        bound_ms = MAX_HOLD_MS + LEASE_MS + 300
        if lost is None or not MAX_HOLD_MS - 150 <= (lost - entered) / 1e6 <= bound_ms:
            at = "never" if lost is None else f"after {(lost - entered) / 1e6:.0f} ms"
            problems.append(
                f"the abandoned holder's lease.lost was set {at} (max_hold_ms {MAX_HOLD_MS})"
            )
        if outcome_a != "leaselost":
            problems.append(
                f"the abandoned holder's release gave {outcome_a!r}, expected LeaseLost"
            )
        second = _first(arena, "enter", token)
        if second is not None and (second - entered) / 1e6 > bound_ms + POLL_MS:
            problems.append(
                f"the waiter entered {(second - entered) / 1e6:.0f} ms after the holder"
            )
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "max-hold", problems)


# --- bad input ---------------------------------------------------------------------


async def _expect_error(
    label: str,
    call: Callable[[], Any],
    error: type[BaseException],
    mentions: tuple[str, ...],
) -> list[str]:
    """Run ``call`` (sync, or returning an awaitable); a problem unless it raises
    ``error`` whose message mentions each of ``mentions``."""
    try:
        result = call()
        if asyncio.iscoroutine(result):
            await asyncio.wait_for(result, 10)
    except error as exc:
        missing = [word for word in mentions if word not in str(exc)]
        if missing:
            return [f"{label}: {type(exc).__name__} does not mention {missing}: {exc}"]
        return []
    except Exception as exc:
        return [f"{label}: raised {type(exc).__name__} ({exc}), expected {error.__name__}"]
    return [f"{label}: no error, expected {error.__name__}"]


async def not_redis_server(*, answer: bool) -> tuple[asyncio.AbstractServer, int]:
    """A TCP server on 127.0.0.1 that is not Redis: it answers like an HTTP server
    (``answer``) or accepts and never answers. Returns (server, port)."""

    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(64)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # reads and never answers

    server = await asyncio.start_server(http if answer else silent, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@scenario(
    "bad-input",
    kills=("release-no-owner-check",),
    faults="bad names, durations, timeouts and tokens; foreign and forged leases; a "
    "closed client; AUTH required; a server that is not Redis",
)
async def bad_input(ctx: Context) -> Outcome:
    """Each bad input gets a clear error of ours naming the cause (and the lock,
    where the lock exists), and the lock's keys stay consistent: the holder keeps
    the lock, the waiter is not granted, the next normal acquire works."""
    from redis_fifo_lock import Lease, LeaseLost, LockUsageError

    server = ctx.servers()
    name = "bad input \u00e9t\u00e9 \u2013 n\u00b0 42"  # spaces and unicode are fine
    arena = Arena(ctx, server.url, name)
    problems: list[str] = []
    client = arena.client("x")
    try:
        for bad_name, word in (("a{b}", "hash tag"), ("x" * 10_240, "limit"), ("", "empty")):
            problems += await _expect_error(
                f"name {bad_name[:12]!r}",
                partial(FifoLock, client, bad_name),
                ValueError,
                (word,),
            )
        for setting in ("lease_ms", "poll_ms", "max_hold_ms"):
            for value in (0, -5, 1.5, True):
                problems += await _expect_error(
                    f"{setting}={value!r}",
                    # The bad input under test: durations of the wrong type or sign.
                    partial(FifoLock, client, name, **{setting: value}),  # type: ignore[arg-type]
                    ValueError,
                    (setting,),
                )
        lock_h, actor_h, lease_h = await arena.enter("h")
        waiter, token = arena.waiter("w", Plan(0.01, timeout_s=5))
        await arena.until(lambda: arena.queued(token), "w is queued")
        probe = arena.lock(arena.client("y"))
        for timeout in (-1, float("nan"), True, "5"):
            problems += await _expect_error(
                f"timeout={timeout!r}",
                # The bad input under test: timeouts of the wrong type or sign.
                partial(probe.acquire, timeout),  # type: ignore[arg-type]
                ValueError,
                ("timeout",),
            )
        for bad_token in ("", "has space", "x" * 200):
            problems += await _expect_error(
                f"token {bad_token[:12]!r}",
                partial(probe.acquire, token=bad_token),
                ValueError,
                ("token",),
            )
        foreign = Lease("another lock", "t", lease_h.fence, lease_h.ticket)
        problems += await _expect_error(
            "a lease of another lock", lambda: probe.release(foreign), LockUsageError, (name,)
        )
        forged = Lease(name, "never-granted", lease_h.fence, lease_h.ticket)
        problems += await _expect_error(
            "release of a never-granted lease", lambda: probe.release(forged), LeaseLost, (name,)
        )
        status = await probe.status()
        if status.holder_fence != lease_h.fence or arena.entered(token) is not None:
            problems.append(f"bad releases disturbed the holder: {status}")
        await arena.leave(lock_h, actor_h, lease_h)
        problems += await arena.served(waiter, token, 5.0)
        closed = arena.client("closed")
        await closed.aclose()
        problems += await _closed_client(arena, closed)
        problems += await _unreachable(ctx, name)
        problems += await arena.consistent()
    finally:
        await arena.close()
    return outcome(ctx, "bad-input", problems)


async def _closed_client(arena: Arena, closed: Redis) -> list[str]:
    """A closed client either still works (redis-py reconnects) or fails with our
    error naming the lock; either way it is recorded like any request."""
    actor = Actor(arena.record, "closed")
    lease = await asyncio.wait_for(
        actor.attempt(arena.lock(closed), "closed-client", Plan(0.01, timeout_s=2)), 10
    )
    if lease is not None:
        return []
    reasons = [
        line.fields[1]
        for line in read_lines(arena.record.path)
        if line.kind == "gaveup" and line.fields[0] == "closed-client"
    ]
    return (
        [] if reasons and reasons[-1].startswith("unavailable") else [f"closed client: {reasons}"]
    )


async def _unreachable(ctx: Context, name: str) -> list[str]:
    """AUTH required without credentials; servers that are not Redis."""
    from redis_fifo_lock import RedisUnavailable

    problems: list[str] = []
    secured = ctx.servers(["--requirepass", "s3cret"])
    anonymous = Redis.from_url(secured.url)
    problems += await _expect_error(
        "AUTH required, no credentials",
        lambda: FifoLock(anonymous, name).acquire(timeout=1),
        RedisUnavailable,
        (name, "Authentication"),
    )
    await anonymous.aclose()
    trusted = Redis.from_url(secured.url, password="s3cret")
    lock = FifoLock(trusted, name)
    lease = await lock.acquire(timeout=2)
    await lock.release(lease)
    status = await lock.status()
    if status.held or status.waiting or not status.fence:
        problems.append(f"AUTH: after the refused acquire the keys were not clean: {status}")
    await trusted.aclose()
    talker, port = await not_redis_server(answer=True)
    stranger = Redis(host="127.0.0.1", port=port)
    try:
        problems += await _expect_error(
            "an HTTP server on the port",
            lambda: FifoLock(stranger, name).acquire(timeout=1),
            RedisUnavailable,
            (name,),
        )
    finally:
        await stranger.aclose()
        talker.close()
    return problems


# --- the hardened protocol: rings, late copies, abandoned requests, lost counters ------


class LoopThread:
    """An event loop of its own, in a thread: a contender whose loop the test can
    block (``time.sleep`` inside the loop) while the rest of the scenario runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """Run ``coro`` on the thread's loop; the result is awaitable from the caller's."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def block(self, seconds: float) -> threading.Event:
        """Block the thread's loop for ``seconds``; the event is set when it starts."""
        started = threading.Event()

        def blocker() -> None:
            started.set()
            time.sleep(seconds)  # the fault: the loop runs nothing meanwhile

        self.loop.call_soon_threadsafe(blocker)
        return started

    async def close(self) -> None:
        """Cancel what still runs on the thread's loop, stop it and join the thread."""

        async def cancel_all() -> None:
            current = asyncio.current_task()
            left = [task for task in asyncio.all_tasks() if task is not current]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.run(cancel_all()), 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.get_running_loop().run_in_executor(None, self.thread.join, 5)
        if not self.thread.is_alive():
            self.loop.close()


def _ticket_of(arena: Arena, token: str) -> int:
    """The ticket of ``token``'s latest acquire reply, from the record."""
    return [
        int(line.fields[1])
        for line in read_lines(arena.record.path)
        if line.kind == "queued" and line.fields[0] == token
    ][-1]


def _session_of(client: Redis, token: str) -> str:
    """The liveness session of the process (hub) where ``token`` waits."""
    from redis_fifo_lock.waiting import hub_for

    groups = [group for group in hub_for(client).groups.values() if token in group.waiters]
    assert len(groups) == 1, "the core's wait groups changed; update _session_of"
    return groups[0].session


RING_LEASE_MS = 1000
RING_POLL_MS = 500
BLOCK_MS = 900
"""The blocked waiter's loop stalls 0.9 s: less than its lease (1 s), but longer
than what its liveness may have left when its grant lands 0.1 s into the stall."""


async def _forged_ring(arena: Arena) -> list[str]:
    """A ring nobody's script sent (anyone with PUBLISH rights can): the waiter it
    names asks Redis, is told it does not hold the lock, and waits on."""
    lock_h, actor_h, lease_h = await arena.enter("h")
    client = arena.client("w")
    lock_w, actor_w = arena.lock(client), Actor(arena.record, "w")
    token = f"w-{arena.ctx.rng.getrandbits(20):05x}"
    waiting = asyncio.create_task(actor_w.attempt(lock_w, token, Plan(0.05, timeout_s=10)))
    await arena.until(lambda: arena.queued(token), "w is queued")
    channel = arena.keys.doorbell_of(_session_of(client, token))
    forged = f"{token} 999999 {_ticket_of(arena, token)} 5000"

    async def subscribed() -> bool:
        counts = await arena.admin.pubsub_numsub(channel)
        return bool(counts and counts[0][1])

    await arena.until(subscribed, "w's process watches its doorbell")
    if not await arena.admin.publish(channel, forged):
        return ["the forged ring reached no subscriber: the doorbell's channels changed"]
    # Time for the forged ring to be read and claimed; nothing may come of it.
    await asyncio.sleep(RING_LEASE_MS / 1000 / 2)
    problems = [] if arena.entered(token) is None else ["a forged ring let w in"]
    await arena.leave(lock_h, actor_h, lease_h)
    return problems + await arena.served(waiting, token, 5.0)


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
    kills=("lease-dated-from-ring",),
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
        try:
            await arena.load_scripts()
            found = await case(arena)
            found += await arena.consistent()
        finally:
            await arena.close()
        problems += [f"{label}: {problem}" for problem in found]
    return outcome(ctx, "ring-read-late", problems)


HISTORY_GRANTS = 80
"""Grants made (each by a process of its own) between a release and its late
copy: more records than a count-bounded history of 64 keeps."""


async def _release_replayed(arena: Arena) -> list[str]:
    """A release re-sent after many other grants is recognised as already done."""
    lock_a, actor_a = arena.contender("a")
    # The first session in the record's order: a history trimmed by count
    # (mutant history-by-count) drops its records first.
    hub_for(lock_a.client).session = "0" * 16
    token_a = f"a-{arena.ctx.rng.getrandbits(20):05x}"
    lease_a = await actor_a.acquire(lock_a, token_a, Plan(0, timeout_s=5))
    assert lease_a is not None, "a could not enter"
    actor_a.record.exit(lease_a)
    with tapped("release", lease_a.token) as calls:
        first = await actor_a.release(lock_a, lease_a, Plan(0))
    if len(calls) != 1:
        return [f"captured {len(calls)} release calls, expected 1"]
    for round_ in range(HISTORY_GRANTS):
        # Each from a client of its own: a session that never speaks again keeps
        # its record for keep_ms, so the history holds more than 64 records.
        lock_b, actor_b = arena.contender(f"b{round_}")
        token = f"b-{round_}-{arena.ctx.rng.getrandbits(16):04x}"
        if await actor_b.attempt(lock_b, token, Plan(0, timeout_s=5)) is None:
            return [f"grant {round_} of {HISTORY_GRANTS} failed"]
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
    with tapped("acquire", token) as calls:
        if await actor_a.attempt(lock_a, token, Plan(0, timeout_s=5)) is None:
            return ["a was not granted"]
    if len(calls) != 1:
        return [f"captured {len(calls)} acquire calls, expected 1"]
    for round_ in range(3):  # a's process moves on: its floor passes the request
        later = f"a-{round_}-{arena.ctx.rng.getrandbits(16):04x}"
        if await actor_a.attempt(lock_a, later, Plan(0, timeout_s=5)) is None:
            return [f"a's later request {round_} was not granted"]
    reply = await calls[0].replay()
    status = await lock_a.status()
    problems = []
    if int(reply[0]) != -1:
        problems.append(f"a late copy of a released request's acquire got {reply}, not refused")
    if status.held or status.waiting:
        problems.append(f"after the late copy the lock shows {status}")
    return problems


async def _renew_replayed(arena: Arena) -> list[str]:
    """A renewal of a released lease, arriving late while the next holder is inside:
    Redis refuses it, and the new holder's lease is not touched."""
    lock_a, actor_a, lease_a = await arena.enter("a")
    with tapped("renew", lease_a.token) as calls:
        await arena.until(lambda: calls, "a renewed its lease", 5)
    await arena.leave(lock_a, actor_a, lease_a)
    holder_b = await arena.enter("b")
    reply = await calls[0].replay()
    status = await holder_b[0].status()
    await arena.leave(*holder_b)
    if int(reply[0]) != 0:
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
    ),
    faults="a release re-sent after 80 other grants; a late acquire of a released request; "
    "a late renewal of a released lease; "
    "a late withdraw of a request that "
    "joined again under the same token",
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
    }
    for label, case in cases.items():
        for attempt in range(3):
            arena = Arena(ctx, server.url, f"replay-{label}-{attempt}")
            try:
                await arena.load_scripts()
                found = await case(arena)
                found += await arena.consistent()
            except NotStaged:
                continue  # the schedule did not happen as planned: stage it again
            finally:
                await arena.close()
            problems += [f"{label}: {problem}" for problem in found]
            break
        else:
            problems.append(f"{label}: could not stage the case in 3 attempts")
    return outcome(ctx, "late-replays", problems)


class NotStaged(Exception):
    """A case's schedule did not come about (a race the lock is free to win); run it again."""


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
        if name != "EVALSHA" or token not in [
            a.decode() if isinstance(a, bytes) else a for a in args
        ]:
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
        arena = Arena(ctx, server.url, f"abandoned-{label}", lease_ms=ABANDON_LEASE_MS)
        try:
            await arena.load_scripts()
            found = await case(arena)
            found += await arena.consistent()
        finally:
            await arena.close()
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


# Issue 11's fault kinds register themselves here (the module needs the above).
from tests.adversarial import late_faults  # noqa: E402, F401

KNOWN_BUG_SCENARIOS = ("connection-killed-short-lease", "same-token-retry")
"""Scenarios that pinned core bugs; ``test_adversarial_regressions.py`` runs them."""

AWAITING_MUTANTS = (
    "proxy-late-copies",
    "blocked-loop-grant",
    "fork-in-hold",
    "restricted-acl",
)
"""Scenarios of issue 11's fault kinds (``late_faults.py``). The real lock must
pass them once the redesign lands (today they find issue 11's bugs). The mutants
issue 11 designates for them (a lease dated from the ring, a history bounded by
count, withdraw by token alone, no withdrawal of requests abandoned by an
outage, a fence counter that restarts at 1) target the redesigned protocol and
are written with it; until a scenario names one in ``kills`` it stays here,
exempt from the must-kill check, and ``test_adversarial_scenarios.py`` runs it
against the real lock on its own."""

REAL = [
    name for name in SCENARIOS if name not in KNOWN_BUG_SCENARIOS and name not in AWAITING_MUTANTS
]
"""Scenarios the real lock must pass, each killing at least one mutant."""

IN_PROCESS = (
    "cancel-stages",
    "connection-killed",
    "late-and-repeated-releases",
    "lease-evicted",
    "keys-missing",
    "max-hold",
    "bad-input",
)
"""Scenarios cheap enough to run again with every script call executed twice."""
