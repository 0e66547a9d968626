"""The benchmark's child processes: ``python -m benchmarks.worker ROLE SPEC``.

``SPEC`` is a JSON object; the worker talks to the driver (``benchmarks.run``)
in JSON lines: events on stdout, commands on stdin. Roles:

- ``contend``: ``tasks`` contenders (asyncio tasks, or threads for sync
  libraries) in this process. For every ``{"cmd": "run", ...}`` line: warm up
  with the reply parser the line names, wait for the common start time, take
  and release the lock in a loop until the stop time, then print every hold and
  the CPU time the process used. ``{"cmd": "exit"}`` ends it. With
  ``BENCH_PROFILE_DIR`` set, an asyncio library's phase runs under cProfile
  and its stats are written there (``contend-<row>-<cs>-p<process>.pstats``).
- ``relay``: ``contenders`` handles on one lock, each driven by the driver
  (``take``, ``wait``, ``release``), with ``ECHO`` markers sent on a separate
  connection just before a ``release`` and just after a ``wait``'s acquire
  returned, so that ``MONITOR`` can count the commands of one hand-off.
- ``idle``: ``waiters`` contenders all blocked on a lock the driver holds;
  prints ``ready`` when all have called ``acquire``, ``report`` (memory, errors)
  on request, and is then killed by the driver.
- ``ping``: times PING round trips while the contenders run, with the parser
  of the run (see ``ping``).
- ``crash-holder``: on ``go``, takes the lock with a short lease, prints when
  it got it, and waits to be killed.
- ``crash-waiter``: on ``go``, asks for the lock and prints when it got it.

Every loop here is bounded: by the stop time, by a count, or by ``MAX_LIFE_S``.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from benchmarks.libraries import (
    BY_KEY,
    AsyncContender,
    Connection,
    Library,
    SyncContender,
    row_key,
)

MAX_LIFE_S = 600.0
"""No worker outlives this, whatever the driver does."""


_EMIT_GUARD = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """Print one JSON event line for the driver (from any thread)."""
    line = json.dumps({"event": event, **fields})
    with _EMIT_GUARD:
        print(line, flush=True)


def read_command() -> dict[str, Any]:
    """Read the driver's next command (``{"cmd": "exit"}`` on EOF)."""
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else {"cmd": "exit"}


def rss_kb() -> dict[str, int]:
    """This process's resident memory now and at its peak, in KiB, and its thread count."""
    fields: dict[str, int] = {}
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                fields[key] = int(value.split()[0])
    return {
        "rss_kb": fields.get("VmRSS", 0),
        "peak_rss_kb": fields.get("VmHWM", 0),
        "threads": fields.get("Threads", 0),
    }


def async_factory(library: Library) -> Callable[[Connection, str, int | None], AsyncContender]:
    """The library's asyncio adapter factory (raises if it has none)."""
    if library.make_async is None:
        raise ValueError(f"{library.key} has no asyncio adapter")
    return library.make_async


def sync_factory(library: Library) -> Callable[[Connection, str, int | None], SyncContender]:
    """The library's threaded adapter factory (raises if it has none)."""
    if library.make_sync is None:
        raise ValueError(f"{library.key} has no sync adapter")
    return library.make_sync


# --- contend -------------------------------------------------------------------------

Row = tuple[int, int, int, int, int, "int | None", "int | None"]
"""One hold as recorded (see ``benchmarks.analysis.TimedHold``). A tuple of ints, so
that the records cost the garbage collector nothing while the lock is measured."""


class Tally:
    """Holds and errors of one phase, shared by the contenders of this process."""

    def __init__(self) -> None:
        self.holds: list[Row] = []
        self.errors: list[str] = []
        self._guard = threading.Lock()

    def add(self, holds: list[Row]) -> None:
        """Record a contender's holds."""
        with self._guard:
            self.holds.extend(holds)

    def error(self, exc: BaseException) -> None:
        """Record a contender's failure."""
        with self._guard:
            self.errors.append(f"{type(exc).__name__}: {exc}")


async def contend_async(
    library: Library, conn: Connection, spec: dict[str, Any], cmd: dict[str, Any]
) -> Tally:
    """One phase of asyncio contenders; see the module docstring."""
    make = async_factory(library)
    tally = Tally()
    warm = make(conn, f"{cmd['name']}-warm-{spec['process']}", None)
    await warm.acquire()
    await warm.release()
    contenders = [make(conn, cmd["name"], None) for _ in range(spec["tasks"])]
    cs_s, stop_ns = cmd["cs_ms"] / 1000, cmd["stop_ns"]
    await asyncio.sleep(max(0.0, (cmd["start_ns"] - time.monotonic_ns()) / 1e9))

    async def run(index: int, contender: AsyncContender) -> None:
        holds: list[Row] = []
        try:
            while time.monotonic_ns() < stop_ns:
                arrival = time.monotonic_ns()
                granted = await contender.acquire()
                acquired = time.monotonic_ns()
                if cs_s:
                    await asyncio.sleep(cs_s)
                release = time.monotonic_ns()
                await contender.release()
                released = time.monotonic_ns()
                holds.append(
                    (index, arrival, acquired, release, released, granted.ticket, granted.fence)
                )
        except Exception as exc:
            tally.error(exc)
        tally.add(holds)

    first = spec["process"] * spec["tasks"]
    await asyncio.gather(*(run(first + i, c) for i, c in enumerate(contenders)))
    await asyncio.sleep(0.1)  # let a lock's background poll finish before closing
    await conn.aclose()
    return tally


def contend_sync(
    library: Library, conn: Connection, spec: dict[str, Any], cmd: dict[str, Any]
) -> Tally:
    """One phase of threaded contenders; see the module docstring."""
    make = sync_factory(library)
    tally = Tally()
    warm = make(conn, f"{cmd['name']}-warm-{spec['process']}", None)
    warm.acquire()
    warm.release()
    contenders = [make(conn, cmd["name"], None) for _ in range(spec["tasks"])]
    cs_s, stop_ns = cmd["cs_ms"] / 1000, cmd["stop_ns"]

    def run(index: int, contender: SyncContender) -> None:
        holds: list[Row] = []
        time.sleep(max(0.0, (cmd["start_ns"] - time.monotonic_ns()) / 1e9))
        try:
            while time.monotonic_ns() < stop_ns:
                arrival = time.monotonic_ns()
                granted = contender.acquire()
                acquired = time.monotonic_ns()
                if cs_s:
                    time.sleep(cs_s)
                release = time.monotonic_ns()
                contender.release()
                released = time.monotonic_ns()
                holds.append(
                    (index, arrival, acquired, release, released, granted.ticket, granted.fence)
                )
        except Exception as exc:
            tally.error(exc)
        tally.add(holds)

    first = spec["process"] * spec["tasks"]
    threads = [
        threading.Thread(target=run, args=(first + i, c), daemon=True)
        for i, c in enumerate(contenders)
    ]
    for thread in threads:
        thread.start()
    budget_s = (stop_ns - time.monotonic_ns()) / 1e9 + cmd["drain_s"]
    deadline = time.monotonic() + budget_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(1 for thread in threads if thread.is_alive())
    if stuck:
        tally.errors.append(f"{stuck} contender threads still waiting after the drain time")
    return tally


def contend(library: Library, spec: dict[str, Any]) -> None:
    """The ``contend`` role."""
    connections: dict[str, Connection] = {}
    profile_dir = os.environ.get("BENCH_PROFILE_DIR")
    emit("ready")
    for _ in range(1000):  # phases; the driver sends a handful
        cmd = read_command()
        if cmd["cmd"] != "run":
            return
        parser = cmd["parser"]
        if parser not in connections:
            connections[parser] = Connection(spec["url"], spec["client_name"], parser)
        conn = connections[parser]
        profiler = cProfile.Profile() if profile_dir and library.kind == "async" else None
        cpu_before = time.process_time_ns()
        if library.kind == "async":
            if profiler is not None:
                profiler.enable()
            tally = asyncio.run(contend_async(library, conn, spec, cmd))
            if profiler is not None:
                profiler.disable()
        else:
            tally = contend_sync(library, conn, spec, cmd)
        cpu_ns = time.process_time_ns() - cpu_before
        if profiler is not None and profile_dir:
            where = Path(profile_dir)
            where.mkdir(parents=True, exist_ok=True)
            row = row_key(library.key, parser)
            profiler.dump_stats(
                where / f"contend-{row}-{cmd['cs_ms']:g}ms-p{spec['process']}.pstats"
            )
        emit("done", holds=tally.holds, errors=tally.errors, cpu_ns=cpu_ns)


# --- ping --------------------------------------------------------------------------------


def ping(spec: dict[str, Any]) -> None:
    """The ``ping`` role: for every ``run`` command, time bare PINGs (alternately
    with a ``redis.asyncio`` and a ``redis.Redis`` client, ``interval_ms`` apart,
    both with the run's reply parser) while the contenders run, so the latency
    ratios have a round trip measured under the same load."""
    connections: dict[str, Connection] = {}
    emit("ready")
    for _ in range(1000):  # phases; the driver sends a handful
        cmd = read_command()
        if cmd["cmd"] != "run":
            return
        parser = cmd["parser"]
        if parser not in connections:
            connections[parser] = Connection(spec["url"], "bench-ping", parser)
        emit("done", samples=asyncio.run(ping_phase(connections[parser], spec, cmd)))


async def ping_phase(
    conn: Connection, spec: dict[str, Any], command: dict[str, Any]
) -> dict[str, list[int]]:
    """One phase of the ``ping`` role: PINGs from ``measured_from_ns`` to ``stop_ns``."""
    sync_client = conn.sync()
    client = conn.async_()
    samples: dict[str, list[int]] = {"async": [], "sync": []}
    await client.ping()
    sync_client.ping()
    await asyncio.sleep(max(0.0, (command["measured_from_ns"] - time.monotonic_ns()) / 1e9))
    pause = spec["interval_ms"] / 1000
    while time.monotonic_ns() < command["stop_ns"]:
        begin = time.perf_counter_ns()
        await client.ping()
        samples["async"].append(time.perf_counter_ns() - begin)
        await asyncio.sleep(pause)
        begin = time.perf_counter_ns()
        sync_client.ping()
        samples["sync"].append(time.perf_counter_ns() - begin)
        await asyncio.sleep(pause)
    await conn.aclose()
    return samples


# --- relay ---------------------------------------------------------------------------


def relay_async(library: Library, spec: dict[str, Any]) -> None:
    """The ``relay`` role for an asyncio library: every contender a task of one loop."""
    make = async_factory(library)
    conn = Connection(spec["url"], spec["client_name"], spec["parser"])

    async def main() -> None:
        marker = redis.asyncio.Redis.from_url(spec["url"], client_name=spec["marker_name"])
        contenders = [make(conn, spec["name"], None) for _ in range(spec["contenders"])]
        warm = make(conn, f"{spec['name']}-warm", None)
        await warm.acquire()
        await warm.release()
        await marker.ping()
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[None]] = set()

        async def take(who: int) -> None:
            await contenders[who].acquire()
            emit("held", who=who)

        async def wait(who: int, end: str) -> None:
            emit("waiting", who=who)
            await contenders[who].acquire()
            await marker.echo(end)
            emit("acquired", who=who)

        async def release(who: int, begin: str | None) -> None:
            if begin is not None:
                await marker.echo(begin)
            await contenders[who].release()
            emit("released", who=who)

        emit("ready")
        for _ in range(100_000):
            cmd = await loop.run_in_executor(None, read_command)
            if cmd["cmd"] == "take":
                job = take(cmd["who"])
            elif cmd["cmd"] == "wait":
                job = wait(cmd["who"], cmd["end"])
            elif cmd["cmd"] == "release":
                job = release(cmd["who"], cmd.get("begin"))
            else:
                break
            task = asyncio.create_task(job)
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.sleep(0.1)
        await marker.aclose()
        await conn.aclose()

    asyncio.run(main())


def relay_sync(library: Library, spec: dict[str, Any]) -> None:
    """The ``relay`` role for a threaded library: one thread per contender (some
    libraries keep the owner's token in the thread), fed by a queue."""
    make = sync_factory(library)
    conn = Connection(spec["url"], spec["client_name"], spec["parser"])
    marker = redis.Redis.from_url(spec["url"], client_name=spec["marker_name"])
    warm = make(conn, f"{spec['name']}-warm", None)
    warm.acquire()
    warm.release()
    marker.ping()
    inboxes: list[queue.Queue[dict[str, Any]]] = [queue.Queue() for _ in range(spec["contenders"])]

    def serve(who: int) -> None:
        contender = make(conn, spec["name"], None)
        for _ in range(100_000):
            cmd = inboxes[who].get()
            if cmd["cmd"] == "take":
                contender.acquire()
                emit("held", who=who)
            elif cmd["cmd"] == "wait":
                emit("waiting", who=who)
                contender.acquire()
                marker.echo(cmd["end"])
                emit("acquired", who=who)
            elif cmd["cmd"] == "release":
                if cmd.get("begin") is not None:
                    marker.echo(cmd["begin"])
                contender.release()
                emit("released", who=who)
            else:
                return

    for who in range(spec["contenders"]):
        threading.Thread(target=serve, args=(who,), daemon=True).start()
    emit("ready")
    for _ in range(100_000):
        cmd = read_command()
        if cmd["cmd"] not in ("take", "wait", "release"):
            return
        inboxes[cmd["who"]].put(cmd)


# --- idle ------------------------------------------------------------------------------


class Counters:
    """How many waiters started, got the lock (they should not) or failed."""

    def __init__(self) -> None:
        self.started = 0
        self.acquired = 0
        self.failed = 0
        self.errors: list[str] = []
        self._guard = threading.Lock()

    def bump(self, field: str) -> None:
        """Add one to ``started`` or ``acquired``."""
        with self._guard:
            setattr(self, field, getattr(self, field) + 1)

    def error(self, exc: BaseException) -> None:
        """Count a waiter's failure; the first 5 distinct messages are kept."""
        message = f"{type(exc).__name__}: {exc}"
        with self._guard:
            self.failed += 1
            if len(self.errors) < 5 and message not in self.errors:
                self.errors.append(message)


def _report(counters: Counters) -> dict[str, Any]:
    return {
        "acquired": counters.acquired,
        "failed": counters.failed,
        "errors": counters.errors,
        **rss_kb(),
    }


async def idle_async(library: Library, spec: dict[str, Any]) -> None:
    """The ``idle`` role for an asyncio library."""
    make = async_factory(library)
    conn = Connection(spec["url"], spec["client_name"], **spec["client_options"])
    counters = Counters()
    loop = asyncio.get_running_loop()
    emit("baseline", **rss_kb())

    async def wait(contender: AsyncContender) -> None:
        counters.bump("started")
        try:
            await contender.acquire()
            counters.bump("acquired")
        except Exception as exc:
            counters.error(exc)

    contenders = [make(conn, spec["name"], None) for _ in range(spec["waiters"])]
    tasks = [asyncio.create_task(wait(c)) for c in contenders]
    for _ in range(int(MAX_LIFE_S * 10)):
        if counters.started >= len(tasks):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(spec["settle_s"])
    emit("ready", started=counters.started, **rss_kb())
    await loop.run_in_executor(None, read_command)
    emit("report", **_report(counters))
    await loop.run_in_executor(None, read_command)  # killed before this returns
    for task in tasks:
        task.cancel()


def idle_sync(library: Library, spec: dict[str, Any]) -> None:
    """The ``idle`` role for a threaded library: one thread per waiter."""
    make = sync_factory(library)
    conn = Connection(spec["url"], spec["client_name"], **spec["client_options"])
    counters = Counters()
    emit("baseline", **rss_kb())

    def wait(contender: SyncContender) -> None:
        counters.bump("started")
        try:
            contender.acquire()
            counters.bump("acquired")
        except Exception as exc:
            counters.error(exc)

    for _ in range(spec["waiters"]):
        contender = make(conn, spec["name"], None)
        threading.Thread(target=wait, args=(contender,), daemon=True).start()
    for _ in range(int(MAX_LIFE_S * 10)):
        if counters.started >= spec["waiters"]:
            break
        time.sleep(0.1)
    time.sleep(spec["settle_s"])
    emit("ready", started=counters.started, **rss_kb())
    read_command()
    emit("report", **_report(counters))
    read_command()  # killed before this returns


# --- crash -------------------------------------------------------------------------------


def crash_holder(library: Library, spec: dict[str, Any]) -> None:
    """The ``crash-holder`` role: on ``go``, take the lock with a short lease and
    hold it until killed."""
    conn = Connection(spec["url"], spec["client_name"])
    if library.kind == "async":
        make_async = async_factory(library)

        async def hold() -> None:
            holder = make_async(conn, spec["name"], spec["lease_ms"])
            emit("ready")
            await asyncio.get_running_loop().run_in_executor(None, read_command)
            await holder.acquire()
            emit("acquired", ns=time.monotonic_ns())
            await asyncio.sleep(MAX_LIFE_S)  # renewing, for a lock that renews

        asyncio.run(hold())
    else:
        holder = sync_factory(library)(conn, spec["name"], spec["lease_ms"])
        emit("ready")
        read_command()
        holder.acquire()
        emit("acquired", ns=time.monotonic_ns())
        time.sleep(MAX_LIFE_S)


def crash_waiter(library: Library, spec: dict[str, Any]) -> None:
    """The ``crash-waiter`` role: on ``go``, wait for the lock and report when granted."""
    conn = Connection(spec["url"], spec["client_name"])
    warm_name = f"{spec['name']}-warm"
    if library.kind == "async":
        make_async = async_factory(library)

        async def wait() -> None:
            warm = make_async(conn, warm_name, spec["lease_ms"])
            await warm.acquire()
            await warm.release()
            emit("ready")
            await asyncio.get_running_loop().run_in_executor(None, read_command)
            contender = make_async(conn, spec["name"], spec["lease_ms"])
            emit("waiting", ns=time.monotonic_ns())
            await contender.acquire()
            emit("acquired", ns=time.monotonic_ns())
            await contender.release()
            await conn.aclose()

        asyncio.run(wait())
    else:
        make_sync = sync_factory(library)
        warm_sync = make_sync(conn, warm_name, spec["lease_ms"])
        warm_sync.acquire()
        warm_sync.release()
        emit("ready")
        read_command()
        contender = make_sync(conn, spec["name"], spec["lease_ms"])
        emit("waiting", ns=time.monotonic_ns())
        contender.acquire()
        emit("acquired", ns=time.monotonic_ns())
        contender.release()


ROLES: dict[str, Callable[[Library, dict[str, Any]], None]] = {
    "contend": contend,
    "ping": lambda library, spec: ping(spec),
    "idle": lambda library, spec: (
        asyncio.run(idle_async(library, spec))
        if library.kind == "async"
        else idle_sync(library, spec)
    ),
    "relay": lambda library, spec: (
        relay_async(library, spec) if library.kind == "async" else relay_sync(library, spec)
    ),
    "crash-holder": crash_holder,
    "crash-waiter": crash_waiter,
}


def main(argv: list[str]) -> int:
    """Run the role named by ``argv[0]`` with the JSON spec in ``argv[1]``."""
    role, spec = argv[0], json.loads(argv[1])
    # A worker never outlives its budget, even if the driver dies.
    threading.Timer(MAX_LIFE_S, os._exit, args=(3,)).start()
    ROLES[role](BY_KEY[spec["library"]], spec)
    sys.stdout.flush()
    os._exit(0)  # don't wait for daemon threads still blocked in a library call


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
