"""Client instructions per acquire + release, counted by callgrind.

    uv run --all-extras --group bench python -m benchmarks.instructions --cycles 500

The contended figures of ``benchmarks.run`` move by a tenth or more between two
runs of the same code on a small shared VM, which hides any change smaller than
that. ``valgrind --tool=callgrind`` counts instructions instead of time: the same
program with the same inputs gives the same count, whatever else the machine is
doing. So a change to the client's path can be judged here, then confirmed in
the contended runs.

Each case runs in a child Python under callgrind twice, after the same set-up
and warm-up: once with no measured cycles and once with ``--cycles``; the
difference divided by ``--cycles`` is what one cycle costs the client process,
all its threads counted (Redis runs outside valgrind and is not counted).
Cases, every client with redis-py's defaults and the reply parser ``--parser``
names (default: redis-py's pure-Python one, as in the headline rows):

- ``ping-async`` / ``ping-sync``: two PINGs (an acquire + release is at least
  two round trips), asyncio and sync client: the yardsticks;
- ``<library>``: one contender's uncontended acquire + release, as
  ``benchmarks.libraries`` calls it (``fifolock``, ``fifolock-sync``,
  ``redis-py-async``, ``redis-py``, ``python-redis-lock``, ``pottery``);
- ``fifolock-handoff``: two ``FifoLock`` tasks of one process take turns, so
  each grant is a hand-off to a waiter in the release's reply (the waiter's
  path: its wait, the hand-over, its lease); a cycle is one grant to each
  task, two grants.

Instructions are not seconds: a system call or a cache miss counts as a few
instructions, so compare cases of the same kind, and a change's effect here
with its effect on the contended runs.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import redis_server
from benchmarks.libraries import BY_KEY, Connection, Parser, available_parsers

WARMUP_CYCLES = 100
"""Cycles run before the count starts, in both runs of a case."""

CASES = ("ping-async", "ping-sync", *BY_KEY, "fifolock-handoff")


async def _async_case(case: str, conn: Connection, cycles: int) -> None:
    if case == "ping-async":
        client = conn.async_()
        for _ in range(WARMUP_CYCLES + cycles):
            await client.ping()
            await client.ping()
    elif case == "fifolock-handoff":
        from redis_fifo_lock import FifoLock

        lock = FifoLock(conn.async_(), "instructions")

        async def taker(grants: int) -> None:
            for _ in range(grants):
                lease = await lock.acquire()
                await asyncio.sleep(0)
                await lock.release(lease)

        # Each task's next acquire queues behind the other's grant: every grant
        # after the first is handed over in a release's reply.
        grants = WARMUP_CYCLES + cycles
        await asyncio.gather(taker(grants), taker(grants))
    else:
        make = BY_KEY[case].make_async
        assert make is not None
        contender = make(conn, "instructions", None)
        for _ in range(WARMUP_CYCLES + cycles):
            await contender.acquire()
            await contender.release()
    await conn.aclose()


def _child(case: str, parser: Parser, url: str, cycles: int) -> None:
    """Run ``case`` for the warm-up and ``cycles`` more, in this process."""
    conn = Connection(url, "instructions", parser)
    library = BY_KEY.get(case)
    if case == "ping-sync":
        client = conn.sync()
        for _ in range(WARMUP_CYCLES + cycles):
            client.ping()
            client.ping()
    elif library is not None and library.kind == "sync":
        assert library.make_sync is not None
        contender = library.make_sync(conn, "instructions", None)
        for _ in range(WARMUP_CYCLES + cycles):
            contender.acquire()
            contender.release()
    else:
        asyncio.run(_async_case(case, conn, cycles))


def _count(case: str, parser: Parser, url: str, cycles: int, folder: Path) -> int:
    """The instructions callgrind counted in one child run of ``case``."""
    out = folder / f"{case}-{cycles}.callgrind"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            case,
            "--parser",
            parser,
            "--url",
            url,
            "--cycles",
            str(cycles),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return total_of(out.read_text(), str(out))


def total_of(callgrind_out: str, where: str = "callgrind's output") -> int:
    """The instruction total in the text of a callgrind output file (its
    ``summary:`` line, or ``totals:`` in older files).

    Raises:
        RuntimeError: naming ``where``, when the text has no total.
    """
    found = re.search(r"^(?:summary|totals): (\d+)", callgrind_out, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in {where}")
    return int(found.group(1))


def per_cycle(case: str, parser: Parser, url: str, cycles: int) -> float:
    """Instructions one cycle of ``case`` costs the client (see the module)."""
    with tempfile.TemporaryDirectory() as folder:
        base = _count(case, parser, url, 0, Path(folder))
        total = _count(case, parser, url, cycles, Path(folder))
    return (total - base) / cycles


def main(argv: Sequence[str] | None = None) -> None:
    """Print each case's client instructions per cycle (k = thousands)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--parser", choices=available_parsers(), default="python")
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.parser, args.url, args.cycles)
        return
    with redis_server(max_waiters=0) as url:
        for case in args.only:
            count = per_cycle(case, args.parser, url, args.cycles)
            print(f"{case:20} {count / 1000:8,.0f} k instructions per cycle", flush=True)


if __name__ == "__main__":
    main()
