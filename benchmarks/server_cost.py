"""Redis's own work per grant, counted by callgrind on the server.

    uv run --all-extras --group bench python -m benchmarks.server_cost \\
        --only fifolock fifo-floor python-redis-lock

``benchmarks.instructions`` counts the client's instructions; this counts the
server's, which the contended rows report as CPU µs per grant and which, time
on a shared VM being what it is, move by a tenth between runs. Redis runs under
``valgrind --tool=callgrind``, so it is some fifty times slower than usual:
every contender waits on it, and each grant is a hand-off.

Each case runs twice on a fresh server: ``--processes`` processes (default 2,
one contender each, as ``benchmarks.libraries`` makes it; a different process
for each so that a FIFO hand-off is rung) take the lock in turn ``--small``
and then ``--big`` grants in all; the difference in instructions, divided by
the difference in grants, is what one grant costs Redis: the scripts, the
commands they run, the replies and the rings (``PUBLISH``), and the network
I/O. The commands run inside scripts are counted too (``INFO commandstats``,
not counting ``EVALSHA``, ``EVAL`` and the tool's own ``PING`` and ``INFO``).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from collections.abc import Sequence
from multiprocessing import Event, Process
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import redis

from benchmarks.instructions import total_of
from benchmarks.libraries import BY_KEY, Connection
from redis_fifo_lock.testing import find_redis_server, free_port

NOT_COUNTED = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_ping", "cmdstat_info"}
"""Commands left out of the commands per grant: the scripts themselves, and the tool's."""

START_TIMEOUT_S = 120.0
"""How long the server under valgrind may take to answer its first PING."""


def _contend(key: str, url: str, grants: int, start: EventType) -> None:
    """Take and release the lock ``grants`` times, once ``start`` is set."""
    library = BY_KEY[key]
    conn = Connection(url, "server-cost")
    if library.kind == "sync":
        assert library.make_sync is not None
        contender = library.make_sync(conn, "server-cost", None)
        start.wait()
        for _ in range(grants):
            contender.acquire()
            contender.release()
        return

    async def run() -> None:
        assert library.make_async is not None
        async_contender = library.make_async(conn, "server-cost", None)
        start.wait()
        for _ in range(grants):
            await async_contender.acquire()
            await async_contender.release()
        await conn.aclose()

    asyncio.run(run())


def count(key: str, grants: int, processes: int, folder: Path) -> tuple[int, int]:
    """Redis's instructions and the commands its scripts ran while
    ``processes`` contenders of ``key`` took ``grants`` grants in all."""
    port = free_port()
    out = folder / f"{key}-{grants}.callgrind"
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            find_redis_server(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    admin = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        start = Event()
        workers = [
            Process(target=_contend, args=(key, url, grants // processes, start))
            for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        start.set()
        for worker in workers:
            worker.join()
            if worker.exitcode != 0:
                raise RuntimeError(f"a {key} contender failed (exit code {worker.exitcode})")
        stats = admin.info("commandstats")
        commands = sum(int(row["calls"]) for name, row in stats.items() if name not in NOT_COUNTED)
        admin.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # the SHUTDOWN's connection closes without a reply
    finally:
        admin.close()
        server.wait(timeout=START_TIMEOUT_S)
    return total_of(out.read_text(), str(out)), commands


def per_grant(key: str, small: int, big: int, processes: int) -> tuple[float, float]:
    """Redis's instructions and script commands per grant for ``key``."""
    with tempfile.TemporaryDirectory() as folder:
        (few, few_commands), (many, many_commands) = (
            count(key, grants, processes, Path(folder)) for grants in (small, big)
        )
    grants = big // processes * processes - small // processes * processes
    return (many - few) / grants, (many_commands - few_commands) / grants


def main(argv: Sequence[str] | None = None) -> None:
    """Print Redis's instructions and script commands per grant for each case."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=["fifolock", "fifo-floor"])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--big", type=int, default=500)
    args = parser.parse_args(argv)
    unknown = [key for key in args.only if key not in BY_KEY]
    if unknown:
        parser.error(f"unknown library {unknown}; choose from {sorted(BY_KEY)}")
    for key in args.only:
        instructions, commands = per_grant(key, args.small, args.big, args.processes)
        print(
            f"{key:20s} {instructions / 1000:8.1f} k instructions per grant in Redis, "
            f"{commands:5.1f} commands (inside scripts too), {args.processes} processes"
        )


if __name__ == "__main__":
    main()
