"""The adversarial scenarios' registry: what a scenario is, how it runs, and its outcome.

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
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from redis_fifo_lock.testing import PrivateRedis, PrivateRedisFactory
from tests.adversarial.checker import Report, check
from tests.adversarial.driver import Fleet
from tests.adversarial.mutants import variant

T = TypeVar("T")

LEASE_MS = 400
POLL_MS = 100
LAG_MS = LEASE_MS // 3
"""A contender records a ``lag`` fault when its event loop stalls longer than this."""
LEARN_MS = LEASE_MS + 500
"""A holder hit by a fault must see ``lease.lost`` within this long of the fault's
end: a lease at most, plus slack for a busy machine."""
RENEW_MS = LEASE_MS // 3 + 200
"""A holder's next renewal after a fault's end (one renewal interval, plus slack
for a busy machine): a holder that left sooner after a fault that made the server
forget its lease learns of the loss from its release."""


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
        renew_ms=RENEW_MS,
    )
    return Outcome(name, ctx.seed, report, problems)
