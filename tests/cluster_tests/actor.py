"""A lock user that keeps to the lock's contract while the cluster is reshaped.

``Actor.attempt`` is one request, every step written to a shared ``Record``:
acquire (retried with the same token while it raises ``RedisUnavailable``, as
the lock's documentation says to), hold until the hold time is up or the lease
is lost, then release (retried likewise; ``LeaseLost`` is recorded). Only the
lock's typed errors are handled: anything else propagates, failing the test or
the process (traceback on stderr, exit code 1).

``summary()`` reads a record back: the holds with every lease the lock
declared lost marked so, how each request ended, and the typed errors seen.

Run as a process: ``python -m tests.cluster_tests.actor --url URL --name NAME
--record PATH [--tasks N --rounds N --hold-ms LOW HIGH --lease-ms MS
--poll-ms MS --seed N --who LABEL]``; prints ``done`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import secrets
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio.cluster import RedisCluster

from redis_fifo_lock import FifoLock, Lease, LeaseLost, LockTimeout, RedisUnavailable
from tests.support.record import Hold, Record, read_holds, read_lines

RETRY_S = 0.05
"""Pause before a call that raised ``RedisUnavailable`` is retried, in seconds."""

BOUND_S = 60.0
"""Longest one request may take from acquire to released, in seconds."""


class Actor:
    """Makes requests on ``lock`` and records them in ``record`` as ``who``."""

    def __init__(self, lock: FifoLock, record: Record, who: str) -> None:
        self.lock = lock
        self.record = record
        self.who = who

    async def acquire(self) -> Lease | None:
        """Acquire with one token, retrying while Redis is unavailable; None if the
        request ended without a lease (recorded as ``gaveup``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOUND_S
        token = secrets.token_hex(8)
        self.record.request(token, BOUND_S, self.who)
        while True:
            try:
                lease = await self.lock.acquire(max(0.0, deadline - loop.time()), token=token)
            except RedisUnavailable as exc:
                self._unavailable("acquire", token, exc)
                if loop.time() >= deadline:
                    self.record.gave_up(token, "unavailable")
                    return None
                await asyncio.sleep(RETRY_S)
                continue
            except LockTimeout:
                self.record.gave_up(token, "timeout")
                return None
            self.record.enter(lease, self.who)
            return lease

    async def hold(self, lease: Lease, seconds: float) -> None:
        """Stay inside for ``seconds``, or until the lease is declared lost."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(lease.wait_lost(), seconds)

    async def release(self, lease: Lease) -> None:
        """Leave (recorded), then release, retrying while Redis is unavailable."""
        if lease.lost:
            self.record.lost(lease)
            self.record.fault("lostwhy", f"{lease.token}:{lease.lost_reason}")
        self.record.exit(lease)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOUND_S
        while True:
            try:
                await self.lock.release(lease)
            except RedisUnavailable as exc:
                self._unavailable("release", lease.token, exc)
                if loop.time() >= deadline:
                    self.record.released(lease, "unavailable")
                    return
                await asyncio.sleep(RETRY_S)
                continue
            except LeaseLost:
                self.record.released(lease, "leaselost")
                return
            self.record.released(lease, "ok")
            return

    async def attempt(self, hold_s: float) -> None:
        """One request: acquire, hold ``hold_s`` seconds, release."""
        lease = await self.acquire()
        if lease is not None:
            await self.hold(lease, hold_s)
            await self.release(lease)

    def _unavailable(self, call: str, token: str, exc: RedisUnavailable) -> None:
        self.record.fault("unavailable", f"{call}:{token}:{type(exc.cause).__name__}")


@dataclass
class Summary:
    """What a record says about the requests made on one lock."""

    holds: list[Hold]
    requests: int
    gave_up: Counter[str] = field(default_factory=Counter)
    unavailable: Counter[str] = field(default_factory=Counter)
    """(call:cause) -> how often a call raised ``RedisUnavailable``."""
    lost: set[str] = field(default_factory=set)
    """Tokens whose lease the lock declared lost (``lease.lost`` or ``LeaseLost``)."""
    lost_why: list[str] = field(default_factory=list)
    """``lease.lost_reason`` of each lease seen lost while held."""
    released: Counter[str] = field(default_factory=Counter)


def summary(path: Path) -> Summary:
    """Read the record at ``path``; holds whose lease was declared lost are marked
    ``lost`` (the lock said so: such a hold may overlap the next one)."""
    result = Summary(holds=read_holds(path), requests=0)
    for line in read_lines(path):
        if line.kind == "request":
            result.requests += 1
        elif line.kind == "gaveup":
            result.gave_up[line.fields[1]] += 1
        elif line.kind == "fault" and line.fields[0] == "unavailable":
            call, _, cause = line.fields[1].split(":")
            result.unavailable[f"{call}:{cause}"] += 1
        elif line.kind == "fault" and line.fields[0] == "lostwhy":
            result.lost_why.append(line.fields[1].split(":", 1)[1])
        elif line.kind == "lost":
            result.lost.add(line.fields[0])
        elif line.kind == "release":
            token, outcome = line.fields
            result.released[outcome] += 1
            if outcome == "leaselost":
                result.lost.add(token)
    for hold in result.holds:
        hold.lost = hold.lost or hold.token in result.lost
    return result


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="a node of the cluster")
    parser.add_argument("--name", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--tasks", type=int, default=1, help="concurrent tasks")
    parser.add_argument("--rounds", type=int, default=1, help="requests per task")
    parser.add_argument("--hold-ms", type=float, nargs=2, default=[20.0, 80.0])
    parser.add_argument("--lease-ms", type=int, default=1500)
    parser.add_argument("--poll-ms", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--who", default="proc")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> None:
    client = RedisCluster.from_url(args.url)
    lock = FifoLock(client, args.name, lease_ms=args.lease_ms, poll_ms=args.poll_ms)
    actor = Actor(lock, Record(args.record), args.who)
    rng = random.Random(args.seed)

    async def task() -> None:
        for _ in range(args.rounds):
            await actor.attempt(rng.uniform(*args.hold_ms) / 1000)

    try:
        await asyncio.gather(*(task() for _ in range(args.tasks)))
    finally:
        await client.aclose()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(parse()))
