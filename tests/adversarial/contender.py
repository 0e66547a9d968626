"""An adversarial contender process: several tasks contending for one or more locks.

Run as ``python -m tests.adversarial.contender '<json spec>'`` (see ``Spec``); the
driver (``driver.py``) starts these. Everything the process does is written to
the run's record (one file per lock, ``<run_dir>/<lock>.rec``) and observed
faults to ``<run_dir>/faults.rec``. Each task draws its plans from its own
``random.Random`` seeded from the spec, so a seed replays the same schedule.

``--mutant``-like selection is the spec's ``mutant`` field: the named variant's
lock class, scripts and wait-group class are used for the whole process.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from redis.exceptions import RedisError

import redis_fifo_lock.doorbell as doorbell_module
from redis_fifo_lock import FifoLock
from tests.adversarial.actors import Actor, Plan, recorded, watch_lag
from tests.adversarial.clients import make_client
from tests.adversarial.mutants import variant
from tests.support.record import Record


@dataclass
class Spec:
    """What one contender process does; every duration is in milliseconds.

    A task runs ``rounds`` requests, each on a lock picked at random. A request
    holds for a long time (``long_hold_leases`` lease lengths) with probability
    ``long_share``, else for ``short_hold_ms``; it has a timeout with probability
    ``timeout_share``, is cancelled at a random moment with ``cancel_share``,
    releases twice with ``repeat_share`` and goes through ``hold()`` with
    ``hold_cm_share``. ``hold_forever`` makes every hold last until the lease is
    lost (an abandoned holder, for ``max_hold_ms``).
    """

    url: str
    run_dir: str
    who: str
    seed: int
    locks: list[str] = field(default_factory=lambda: ["a"])
    lease_ms: int = 400
    poll_ms: int = 100
    max_hold_ms: int = 1_800_000
    tasks: int = 2
    rounds: int = 4
    start_after_ms: list[int] = field(default_factory=lambda: [0, 0])
    short_hold_ms: list[int] = field(default_factory=lambda: [0, 20])
    long_hold_leases: list[float] = field(default_factory=lambda: [1.0, 3.0])
    long_share: float = 0.3
    timeout_share: float = 0.0
    timeout_ms: list[int] = field(default_factory=lambda: [0, 500])
    cancel_share: float = 0.0
    cancel_after_ms: list[int] = field(default_factory=lambda: [0, 300])
    repeat_share: float = 0.0
    hold_cm_share: float = 0.0
    hold_forever: bool = False
    retry_ms: int = 0
    mutant: str = "real"
    dup_exec: bool = False
    no_doorbell: bool = False
    client_retries: bool = True
    lag_fault_ms: int = 0

    def to_json(self) -> str:
        """The spec as the single command-line argument of a contender."""
        return json.dumps(asdict(self))


def plan(spec: Spec, rng: random.Random) -> Plan:
    """Draw one request's plan from ``spec``'s distributions."""
    if spec.hold_forever:
        hold_s = 3600.0
    elif rng.random() < spec.long_share:
        hold_s = rng.uniform(*spec.long_hold_leases) * spec.lease_ms / 1000
    else:
        hold_s = rng.uniform(*spec.short_hold_ms) / 1000
    timeout_s = rng.uniform(*spec.timeout_ms) / 1000 if rng.random() < spec.timeout_share else None
    cancel_s = (
        rng.uniform(*spec.cancel_after_ms) / 1000 if rng.random() < spec.cancel_share else None
    )
    return Plan(
        hold_s=hold_s,
        timeout_s=timeout_s,
        cancel_after_s=cancel_s,
        repeat_release=rng.random() < spec.repeat_share,
        use_hold=rng.random() < spec.hold_cm_share,
        retry_s=spec.retry_ms / 1000,
    )


class NoDoorbell(doorbell_module.Doorbell):
    """The doorbell removed entirely: every subscription fails, so waiters poll."""

    async def watch(self, channel: str, ring: doorbell_module.Ring) -> None:
        raise RedisError("doorbell removed by the adversarial suite")


async def contend(spec: Spec) -> None:
    """Run the spec's tasks to completion."""
    run_dir = Path(spec.run_dir)
    faults = Record(run_dir / "faults.rec")
    client = make_client(
        spec.url, dup_exec=spec.dup_exec, name=f"adv-{spec.who}", retries=spec.client_retries
    )
    mutant = variant(spec.mutant)
    settings = {"lease_ms": spec.lease_ms, "poll_ms": spec.poll_ms, "max_hold_ms": spec.max_hold_ms}
    locks: dict[str, tuple[FifoLock, Actor]] = {}
    for name in spec.locks:
        record = Record(run_dir / f"{name}.rec")
        lock = recorded(mutant.lock(client, name, **settings), record, faults)
        locks[name] = (lock, Actor(record, spec.who))
    lag = (
        asyncio.create_task(watch_lag(faults, spec.lag_fault_ms / 1000))
        if spec.lag_fault_ms
        else None
    )

    async def task(index: int) -> None:
        rng = random.Random(spec.seed * 1009 + index)
        await asyncio.sleep(rng.uniform(*spec.start_after_ms) / 1000)  # staggered start
        for round_ in range(spec.rounds):
            name = rng.choice(spec.locks)
            lock, actor = locks[name]
            token = f"{spec.who}.{index}.{round_}.{rng.getrandbits(24):06x}"
            await actor.attempt(lock, token, plan(spec, rng))

    with mutant.installed():
        await asyncio.gather(*(task(index) for index in range(spec.tasks)))
    if lag is not None:
        lag.cancel()
    await client.aclose()


def main() -> None:
    """Entry point: the spec is the only argument."""
    spec = Spec(**json.loads(sys.argv[1]))
    if spec.no_doorbell:
        import redis_fifo_lock.waiting as waiting_module

        # Every hub builds its doorbell from the name waiting.py imported.
        setattr(waiting_module, "Doorbell", NoDoorbell)  # noqa: B010
    asyncio.run(contend(spec))
    print("done", flush=True)


if __name__ == "__main__":
    main()
