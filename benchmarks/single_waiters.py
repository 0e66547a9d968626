"""One waiter per process: N processes, each with one asyncio task that takes
and releases one lock in a loop with an empty critical section, as Celery
prefork workers running one task after another do (``--sync``: one thread
with ``SyncFifoLock``, as they do).

    uv run --all-extras python -m benchmarks.single_waiters --processes 4 --seconds 4 [--sync]

Prints grants/s (every grant in the window), the idle gap p50 (the previous
holder's stamp just before it calls ``release`` to the next holder's stamp
just after its ``acquire`` returned; ``time.monotonic_ns``, one clock for the
machine) and the commands Redis ran per grant (``INFO commandstats``).
Only this project's lock: the peers have no per-process wait state.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from benchmarks.analysis import TimedHold, median, pairs
from benchmarks.harness import command_calls, redis_server
from redis_fifo_lock import FifoLock, Lease, SyncFifoLock

COUNTED = ("evalsha", "eval", "subscribe", "unsubscribe", "publish")
"""Commands reported per grant."""


def contend(url: str, contender: int, seconds: float, out: Connection, sync: bool) -> None:
    """Take and release the lock for ``seconds`` (with ``SyncFifoLock`` if
    ``sync``); send back each grant as a ``TimedHold`` row (see
    ``TimedHold.as_row``)."""
    if sync:
        out.send(contend_sync(url, contender, seconds))
        return

    async def run() -> list[list[int | None]]:
        client = AsyncRedis.from_url(url)
        lock = FifoLock(client, "single-waiters")
        rows: list[list[int | None]] = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            arrival = time.monotonic_ns()
            lease = await lock.acquire()
            acquired = time.monotonic_ns()
            await lock.release(lease)
            rows.append(_row(lease, contender, arrival, acquired))
        await client.aclose()
        return rows

    out.send(asyncio.run(run()))


def contend_sync(url: str, contender: int, seconds: float) -> list[list[int | None]]:
    """``contend`` with ``SyncFifoLock`` from this (the main) thread."""
    lock = SyncFifoLock(url, "single-waiters")
    rows: list[list[int | None]] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        arrival = time.monotonic_ns()
        lease = lock.acquire()
        acquired = time.monotonic_ns()
        lock.release(lease)
        rows.append(_row(lease, contender, arrival, acquired))
    return rows


def _row(lease: Lease, contender: int, arrival_ns: int, acquired_ns: int) -> list[int | None]:
    """The ``TimedHold`` row of one grant, just released (now): asked for at
    ``arrival_ns``, held from ``acquired_ns`` (``time.monotonic_ns()``), whose
    release was called at once."""
    return TimedHold(
        lease.fence,
        lease.ticket,
        acquired_ns,
        exited_ns=acquired_ns,
        contender=contender,
        arrival_ns=arrival_ns,
        released_ns=time.monotonic_ns(),
    ).as_row()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the workload ($REDIS_URL, or a private server) and print its figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--sync", action="store_true", help="SyncFifoLock, one thread")
    args = parser.parse_args(argv)
    with redis_server(args.processes) as url:
        before = command_calls(Redis.from_url(url))
        pipes = [multiprocessing.Pipe(duplex=False) for _ in range(args.processes)]
        workers = [
            multiprocessing.Process(
                target=contend, args=(url, index, args.seconds, sender, args.sync)
            )
            for index, (_, sender) in enumerate(pipes)
        ]
        for worker in workers:
            worker.start()
        rows: list[Any] = [row for receiver, _ in pipes for row in receiver.recv()]
        for worker in workers:
            worker.join()
        after = command_calls(Redis.from_url(url))
    holds = [TimedHold.from_row(row) for row in rows]
    gap_us = median(pair.gap_ns / 1000 for pair in pairs(holds))
    per_grant = {
        command: (after.get(command, 0) - before.get(command, 0)) / len(holds)
        for command in COUNTED
    }
    print(
        f"{args.processes} processes x 1 {'SyncFifoLock' if args.sync else 'FifoLock'} waiter: "
        f"{len(holds) / args.seconds:.0f} grants/s, "
        f"idle gap p50 {gap_us or 0:.0f} us; per grant: "
        + ", ".join(f"{command} {count:.2f}" for command, count in per_grant.items())
    )


if __name__ == "__main__":
    main()
