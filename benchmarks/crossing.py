"""What the sync facade's thread crossings cost: one thread, no contention.

    uv run --all-extras python -m benchmarks.crossing --calls 3000 --rounds 5

``SyncFifoLock`` runs each call of the asyncio core on the portal's loop, in
another thread, and waits for it: one crossing there and one back per call,
two per acquire + release. Prints, per call, the median and minimum over
``--rounds`` rounds of ``--calls`` calls (µs of wall time, one caller):

- a coroutine that returns at once, run through the portal (the crossing alone);
- a PING: asyncio on the caller's own loop, through the portal (a
  ``LoopClients`` client on the portal loop), and redis-py's sync client;
- an uncontended acquire + release: ``FifoLock`` on the caller's loop, and
  ``SyncFifoLock``.

All clients have ``socket_timeout=None``, so no command's write starts a task.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from benchmarks.harness import redis_server
from redis_fifo_lock import FifoLock, LoopClients, SyncFifoLock
from redis_fifo_lock.portal import portal


def timed(call: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """(median, minimum) over ``rounds`` of the µs per ``call()``, after a warm-up."""
    for _ in range(min(calls, 200)):
        call()
    per_call = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(per_call), min(per_call)


def measure(url: str, calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Every row of the module docstring, in order."""
    rows: dict[str, tuple[float, float]] = {}
    clients = LoopClients(url, socket_timeout=None)

    async def nothing() -> None:
        return None

    async def ping_on_portal() -> object:
        return await clients.client().ping()

    rows["portal: a coroutine that returns at once"] = timed(
        lambda: portal().call("crossing", nothing), calls, rounds
    )
    loop = asyncio.new_event_loop()
    own = AsyncRedis.from_url(url, socket_timeout=None)
    lock = FifoLock(own, "crossing-async")

    async def cycle() -> None:
        await lock.release(await lock.acquire())

    rows["PING, asyncio on the caller's loop"] = timed(
        lambda: loop.run_until_complete(own.ping()), calls, rounds
    )
    rows["PING, through the portal"] = timed(
        lambda: portal().call("crossing", ping_on_portal), calls, rounds
    )
    sync_client = Redis.from_url(url, socket_timeout=None)
    rows["PING, redis-py's sync client"] = timed(sync_client.ping, calls, rounds)
    rows["acquire + release, FifoLock on the caller's loop"] = timed(
        lambda: loop.run_until_complete(cycle()), calls, rounds
    )
    sync_lock = SyncFifoLock(clients, "crossing-sync")
    rows["acquire + release, SyncFifoLock"] = timed(
        lambda: sync_lock.release(sync_lock.acquire()), calls, rounds
    )
    loop.run_until_complete(own.aclose())
    loop.close()
    sync_client.close()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments, measure, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per row")
    args = parser.parse_args(argv)
    with redis_server(1) as url:
        rows = measure(url, args.calls, args.rounds)
    print("| per call | median µs | min µs |\n|---|---|---|")
    for label, (middle, least) in rows.items():
        print(f"| {label} | {middle:.0f} | {least:.0f} |")


if __name__ == "__main__":
    main()
