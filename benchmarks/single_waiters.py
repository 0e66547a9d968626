"""One waiter per process: N processes, each with one asyncio task that takes
and releases one lock in a loop with an empty critical section, as Celery
prefork workers running one task after another do.

    uv run --all-extras python -m benchmarks.single_waiters --processes 4 --seconds 4

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
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_fifo_lock import FifoLock
from redis_fifo_lock.testing import private_redis_server

COUNTED = ("evalsha", "eval", "subscribe", "unsubscribe", "publish")
"""Commands reported per grant."""


def contend(url: str, seconds: float, out: Connection) -> None:
    """Take and release the lock for ``seconds``; send back the stamps
    (kind, ns): "a" just after acquire returned, "r" just before release."""

    async def run() -> list[tuple[str, int]]:
        client = AsyncRedis.from_url(url)
        lock = FifoLock(client, "single-waiters")
        stamps: list[tuple[str, int]] = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            lease = await lock.acquire()
            stamps.append(("a", time.monotonic_ns()))
            stamps.append(("r", time.monotonic_ns()))
            await lock.release(lease)
        await client.aclose()
        return stamps

    out.send(asyncio.run(run()))


def main(argv: Sequence[str] | None = None) -> None:
    """Run the workload on a private server and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    with private_redis_server() as server:
        pipes = [multiprocessing.Pipe(duplex=False) for _ in range(args.processes)]
        workers = [
            multiprocessing.Process(target=contend, args=(server.url, args.seconds, sender))
            for _, sender in pipes
        ]
        for worker in workers:
            worker.start()
        stamps = [stamp for receiver, _ in pipes for stamp in receiver.recv()]
        for worker in workers:
            worker.join()
        stats = Redis.from_url(server.url).info("commandstats")
    events = sorted((ns, kind) for kind, ns in stamps)
    grants = sum(1 for _, kind in events if kind == "a")
    gaps, called = [], None
    for ns, kind in events:
        if kind == "r":
            called = ns
        elif called is not None:
            gaps.append((ns - called) / 1000)
            called = None
    per_grant = {
        command: int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)) / grants
        for command in COUNTED
    }
    print(
        f"{args.processes} processes x 1 waiter: {grants / args.seconds:.0f} grants/s, "
        f"idle gap p50 {statistics.median(gaps):.0f} us; per grant: "
        + ", ".join(f"{command} {count:.2f}" for command, count in per_grant.items())
    )


if __name__ == "__main__":
    main()
