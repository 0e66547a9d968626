"""Where a hand-off to another process spends its time: stamps along its path.

    uv run --all-extras python -m benchmarks.timeline --processes 4 --tasks 4 --seconds 5

N processes with T asyncio tasks each take and release one lock in a loop with
an empty critical section. Each process stamps (``time.monotonic_ns``, one
clock for the machine) the moments a hand-off passes:

- ``release called``: the holder's task is about to call ``release``;
- ``script``: the release's ``EVALSHA`` enters redis-py (our layers are done);
- ``packed``: redis-py hands the packed command to ``send_packed_command``;
- ``written``: the bytes reach the socket transport;
- ``bytes in``: bytes arrived on a connection of the next holder's process
  (the last arrival before ``ring read``: the ring's, unless another
  connection's bytes came in between);
- ``ring read``: the next holder's process dispatches the ring it read;
- ``resumed``: the next holder's waiting task runs again;
- ``returned``: its ``acquire`` returned.

It prints the median of each, from ``release called``, over the hand-offs to
another process (fence order), and the median from ``release called`` to
``returned`` over the hand-offs within a process. Every client reads replies
with the parser ``--parser`` names (default: redis-py's pure-Python one, as in
the benchmark's headline rows). Instrumentation for profiling, not a benchmark
result: the stamps are monkeypatched into the running code (asyncio's socket
transport and stream protocol, redis-py's connection, the lock's doorbell and
waiter), which costs a little time itself.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.selector_events
import bisect
import itertools
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.connection import AbstractConnection

from benchmarks.harness import redis_server
from benchmarks.libraries import PARSERS, Parser, async_parser_class
from redis_fifo_lock import FifoLock
from redis_fifo_lock.doorbell import Doorbell
from redis_fifo_lock.protocol import Script
from redis_fifo_lock.waiting import Waiter

HOLDER_SIDE = ("script", "packed", "written")
"""Stamps taken in the releasing process, the first after ``release called``."""
WAITER_SIDE = ("bytes in", "ring read", "resumed")
"""Stamps taken in the next holder's process, the last before ``returned``."""

Events = dict[str, list[int]]


def _stamped(events: Events) -> Callable[[str], None]:
    """Install the stamps in this process; returns ``arm(kind)``: the holder side's
    stamps are taken once after each ``arm("release called")``."""
    armed: set[str] = set()

    def stamp(kind: str) -> None:
        events[kind].append(time.monotonic_ns())

    def once(kind: str) -> None:
        if kind in armed:
            armed.discard(kind)
            stamp(kind)

    def arm(kind: str) -> None:
        stamp(kind)
        armed.update(HOLDER_SIDE)

    transport = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    for method in ("write", "writelines"):
        original_write = getattr(transport, method)

        def write(self: Any, data: Any, _original: Any = original_write) -> Any:
            once("written")
            return _original(self, data)

        setattr(transport, method, write)

    original_received = asyncio.StreamReaderProtocol.data_received

    def received(self: asyncio.StreamReaderProtocol, data: bytes) -> None:
        stamp("bytes in")
        original_received(self, data)

    asyncio.StreamReaderProtocol.data_received = received  # type: ignore[method-assign]

    original_run = Script.run

    def run(self: Script, client: Any, keys: list[bytes], args: list[bytes]) -> Any:
        once("script")
        return original_run(self, client, keys, args)

    Script.run = run  # type: ignore[method-assign]

    original_send = AbstractConnection.send_packed_command

    def send(self: AbstractConnection, command: Any, check_health: bool = True) -> Any:
        once("packed")
        return original_send(self, command, check_health)

    AbstractConnection.send_packed_command = send  # type: ignore[method-assign]

    original_dispatch = Doorbell._dispatch

    def dispatch(self: Doorbell, message: dict[str, object], encoding: tuple[str, str]) -> None:
        if message["type"] == "message":
            stamp("ring read")
        original_dispatch(self, message, encoding)

    Doorbell._dispatch = dispatch  # type: ignore[method-assign]

    original_next_hint = Waiter.next_hint

    async def next_hint(self: Waiter, deadline: float | None) -> bool:
        hinted = await original_next_hint(self, deadline)
        stamp("resumed")
        return hinted

    Waiter.next_hint = next_hint  # type: ignore[method-assign]
    return arm


def contend(url: str, parser: Parser, tasks: int, seconds: float, out: Connection) -> None:
    """Take and release the lock from ``tasks`` tasks for ``seconds``; send back
    the stamps and the (fence, returned, release called) of each grant."""
    events: Events = {kind: [] for kind in (*HOLDER_SIDE, *WAITER_SIDE, "release called")}
    arm = _stamped(events)
    grants: list[tuple[int, int, int]] = []

    async def run() -> None:
        client = AsyncRedis.from_url(url, parser_class=async_parser_class(parser))
        lock = FifoLock(client, "timeline")
        stop = time.monotonic() + seconds

        async def task() -> None:
            while time.monotonic() < stop:
                lease = await lock.acquire()
                returned = time.monotonic_ns()
                arm("release called")
                grants.append((lease.fence, returned, events["release called"][-1]))
                await lock.release(lease)

        await asyncio.gather(*(task() for _ in range(tasks)))
        await client.aclose()

    asyncio.run(run())
    out.send((events, grants))


def _first_after(stamps: list[int], moment: int) -> int | None:
    index = bisect.bisect_left(stamps, moment)
    return stamps[index] if index < len(stamps) else None


def _last_before(stamps: list[int], moment: int) -> int | None:
    index = bisect.bisect_right(stamps, moment)
    return stamps[index - 1] if index else None


def main(argv: Sequence[str] | None = None) -> None:
    """Run the workload on a private server and print the median stamps."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--parser", choices=PARSERS, default="python", help="reply parser (default: python)"
    )
    args = parser.parse_args(argv)
    with redis_server(args.processes * args.tasks) as url:
        pipes = [multiprocessing.Pipe(duplex=False) for _ in range(args.processes)]
        workers = [
            multiprocessing.Process(
                target=contend, args=(url, args.parser, args.tasks, args.seconds, sender)
            )
            for _, sender in pipes
        ]
        for worker in workers:
            worker.start()
        results: list[tuple[Events, list[tuple[int, int, int]]]] = [
            receiver.recv() for receiver, _ in pipes
        ]
        for worker in workers:
            worker.join()
    grants = sorted(
        (fence, process, returned, called)
        for process, (_, made) in enumerate(results)
        for fence, returned, called in made
    )
    delays: dict[str, list[float]] = {kind: [] for kind in (*HOLDER_SIDE, *WAITER_SIDE)}
    delays["returned"] = []
    within_process: list[float] = []
    for before, after in itertools.pairwise(grants):
        _, holder, _, called = before
        _, waiter, returned, _ = after
        if holder == waiter:
            within_process.append((returned - called) / 1000)
            continue
        for kind in HOLDER_SIDE:
            moment = _first_after(results[holder][0][kind], called)
            if moment is not None and moment <= returned:
                delays[kind].append((moment - called) / 1000)
        for kind in WAITER_SIDE:
            moment = _last_before(results[waiter][0][kind], returned)
            if moment is not None and moment >= called:
                delays[kind].append((moment - called) / 1000)
        delays["returned"].append((returned - called) / 1000)
    print(
        f"{args.processes} processes x {args.tasks} tasks: {len(grants) / args.seconds:.0f} "
        f"grants/s; {len(delays['returned'])} hand-offs to another process; medians from "
        "'release called':"
    )
    for kind, values in delays.items():
        if values:
            print(f"  {kind:12s} {statistics.median(values):8.0f} us  ({len(values)} stamps)")
    if within_process:
        print(
            f"{len(within_process)} hand-offs within a process: 'release called' to "
            f"'returned' {statistics.median(within_process):.0f} us (median)"
        )


if __name__ == "__main__":
    main()
