"""The workloads, each a function of a library, the server URL and a ``Size``.

``benchmarks.run`` describes them and runs them in order; ``benchmarks.worker``
is the code that runs in their child processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from benchmarks.analysis import TimedHold, distribution, median, quantile, summarize_contended
from benchmarks.harness import (
    BenchError,
    Worker,
    calls_between,
    command_calls,
    connected_clients,
    workers,
)
from benchmarks.libraries import Connection, Library, Parser, holder_kind
from benchmarks.worker import sync_factory
from redis_fifo_lock.protocol import LockKeys

WAITERS_NAME = "bench-waiters"
"""``CLIENT SETNAME`` of the idle-waiting process's connections."""

MONITOR_NAME = "bench-monitor"
"""``CLIENT SETNAME`` of the driver's own connections."""

IDLE_CLIENT_OPTIONS = {"socket_timeout": None, "socket_connect_timeout": 120}
"""Client options of the idle waiters, for every library (see ``Connection``):
no read timeout, and time to connect when thousands of connections open at once."""

PING_INTERVAL_MS = 2.0
"""Pause between the PINGs timed during a contended run, in ms: a light load."""


@dataclass(frozen=True)
class Size:
    """How much of each workload to run.

    Attributes (counts, or seconds where the name says ``_s``, ms for ``_ms``):
        ping_samples: PING round trips timed per client kind.
        uncontended_iterations, uncontended_warmup: timed and untimed loops.
        roundtrip_iterations: acquire + release pairs watched under MONITOR.
        repeats: times the uncontended and contended workloads are run; the
            report shows the median of the repeats.
        processes, tasks: contended processes, contenders per process.
        critical_sections_ms: the contended critical-section lengths.
        contended_s, contended_warmup_s: measured window, and the start of the
            loop that is not measured.
        contended_lead_s: time given to every contender process to warm up
            (connect, load scripts) before the common start.
        idle_waiters: sizes of the idle-waiting crowd.
        idle_s, idle_settle_s: measured window; pause after the last waiter
            started, before measuring.
        crash_trials, crash_lease_ms: kills per library; the lease every library
            gets (python-redis-lock's is whole seconds: 1,000 ms is its least).
        handoff_trials: hand-offs watched under MONITOR per library and case
            (waiter in the releaser's process, or in another).
        handoff_settle_s: pause between a waiter's acquire call and the
            holder's release, so that the waiter is queued (or polling).
    """

    ping_samples: int
    uncontended_iterations: int
    uncontended_warmup: int
    roundtrip_iterations: int
    repeats: int
    contended_s: float
    contended_warmup_s: float
    idle_waiters: tuple[int, ...]
    idle_s: float
    idle_settle_s: float
    crash_trials: int
    contended_lead_s: float = 0.5
    processes: int = 4
    tasks: int = 4
    critical_sections_ms: tuple[float, ...] = (0.0, 1.0)
    crash_lease_ms: int = 1000
    keyspace_waiters: int = 10
    keyspace_idle_s: float = 30.0
    handoff_trials: int = 20
    handoff_settle_s: float = 0.1


SIZES = {
    "smoke": Size(
        ping_samples=300,
        uncontended_iterations=100,
        uncontended_warmup=20,
        roundtrip_iterations=10,
        repeats=1,
        contended_s=0.3,
        contended_warmup_s=0.1,
        idle_waiters=(100,),
        idle_s=0.5,
        idle_settle_s=0.2,
        crash_trials=1,
        contended_lead_s=0.3,
        keyspace_idle_s=1.0,
        handoff_trials=2,
        handoff_settle_s=0.05,
    ),
    "full": Size(
        ping_samples=3000,
        uncontended_iterations=2000,
        uncontended_warmup=200,
        roundtrip_iterations=50,
        repeats=5,
        contended_s=5.0,
        contended_warmup_s=0.5,
        idle_waiters=(1000, 10_000),
        idle_s=30.0,
        idle_settle_s=2.0,
        crash_trials=5,
    ),
}

WORKLOADS = ("uncontended", "contended", "handoff", "idle", "crash", "keyspace")


# --- 1. PING ----------------------------------------------------------------------------------


def ping_stats(samples_ns: list[int]) -> dict[str, Any]:
    """p50/p99 of PING round trips, in µs and ns."""
    return {
        "samples": len(samples_ns),
        "p50_ns": quantile(samples_ns, 50),
        "p99_ns": quantile(samples_ns, 99),
        "p50_us": quantile(samples_ns, 50) / 1000,
        "p99_us": quantile(samples_ns, 99) / 1000,
    }


def measure_ping(url: str, samples: int, parser: Parser) -> dict[str, Any]:
    """Bare PING round trips with an asyncio and a sync client, after a warm-up."""
    conn = Connection(url, MONITOR_NAME, parser)

    async def run_async() -> list[int]:
        client = conn.async_()
        try:
            for _ in range(max(50, samples // 10)):
                await client.ping()
            times = []
            for _ in range(samples):
                begin = time.perf_counter_ns()
                await client.ping()
                times.append(time.perf_counter_ns() - begin)
            return times
        finally:
            await conn.aclose()

    client = conn.sync()
    try:
        for _ in range(max(50, samples // 10)):
            client.ping()
        sync_times = []
        for _ in range(samples):
            begin = time.perf_counter_ns()
            client.ping()
            sync_times.append(time.perf_counter_ns() - begin)
    finally:
        client.close()
    return {"async": ping_stats(asyncio.run(run_async())), "sync": ping_stats(sync_times)}


# --- 2. uncontended -----------------------------------------------------------------------------


class MonitorLog:
    """Every command the server receives (``MONITOR``) between two markers of
    its own, as (command, client address, client type) tuples."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url, client_name=MONITOR_NAME)
        self._marker = f"bench-log-{secrets.token_hex(4)}"
        self.entries: list[tuple[str, str, str]] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-monitor", daemon=True)

    def _watch(self) -> None:
        inside = False
        with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
            self._ready.set()
            for _ in range(10_000_000):
                entry = monitor.next_command()
                command = str(entry["command"])
                if self._marker in command:
                    if inside:
                        return
                    inside = True
                elif inside:
                    address = f"{entry['client_address']}:{entry['client_port']}"
                    self.entries.append((command, address, str(entry["client_type"])))

    def __enter__(self) -> MonitorLog:
        self._thread.start()
        if not self._ready.wait(10):
            raise BenchError("MONITOR did not start")
        time.sleep(0.05)  # MONITOR's OK is read; let the server register it
        self._client.echo(self._marker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.echo(self._marker)
        self._thread.join(30)
        self._client.close()

    def commands(self) -> list[str]:
        """The names (upper case) of the commands clients sent, in order; not
        those a script ran."""
        return [
            command.split(" ", 1)[0].upper()
            for command, _address, client_type in self.entries
            if client_type != "lua"
        ]


def per_iteration(commands: list[str], iterations: int) -> dict[str, float]:
    """{command: how many per acquire + release}."""
    counts: dict[str, int] = {}
    for command in commands:
        counts[command] = counts.get(command, 0) + 1
    return {command: count / iterations for command, count in sorted(counts.items())}


def measure_uncontended(
    library: Library, url: str, name: str, size: Size, parser: Parser
) -> dict[str, Any]:
    """Time acquire + release with nobody else around, then count its commands."""
    conn = Connection(url, "bench-uncontended", parser)
    times: list[int] = []
    watch = MonitorLog(url)
    n, warm, watched = (
        size.uncontended_iterations,
        size.uncontended_warmup,
        size.roundtrip_iterations,
    )
    if library.make_async is not None:
        make_async = library.make_async

        async def run() -> None:
            lock = make_async(conn, name, None)
            for _ in range(warm):
                await lock.acquire()
                await lock.release()
            for _ in range(n):
                begin = time.perf_counter_ns()
                await lock.acquire()
                await lock.release()
                times.append(time.perf_counter_ns() - begin)
            with watch:
                for _ in range(watched):
                    await lock.acquire()
                    await lock.release()
            await conn.aclose()

        asyncio.run(run())
    else:
        lock = sync_factory(library)(conn, name, None)
        for _ in range(warm):
            lock.acquire()
            lock.release()
        for _ in range(n):
            begin = time.perf_counter_ns()
            lock.acquire()
            lock.release()
            times.append(time.perf_counter_ns() - begin)
        with watch:
            for _ in range(watched):
                lock.acquire()
                lock.release()
    commands = per_iteration(watch.commands(), watched)
    return {
        "iterations": n,
        "p50_us": quantile(times, 50) / 1000,
        "p99_us": quantile(times, 99) / 1000,
        "round_trips": sum(commands.values()),
        "commands": commands,
    }


# --- 3. contended -----------------------------------------------------------------------------


def server_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (user + system, ``INFO cpu``)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run_contended(
    library: Library,
    url: str,
    run_id: str,
    size: Size,
    repeat: int,
    parsers: tuple[Parser, ...],
    quiet_ping_ns: dict[str, float],
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every (critical section, parser) phase for one library, in one set of
    processes; returns {(cs, parser): summary}.

    A ``ping`` worker times PING round trips during each measured window with
    the phase's parser; the ``gap_*_ping`` ratios divide by its p50 for the
    library's kind of client, the ``gap_*_quiet_ping`` ratios by the PING
    measured at the start on a quiet server (``quiet_ping_ns``, by parser).
    """
    specs = [
        {
            "library": library.key,
            "url": url,
            "client_name": f"bench-contend-{process}",
            "process": process,
            "tasks": size.tasks,
        }
        for process in range(size.processes)
    ]
    ping_spec = {"library": library.key, "url": url, "interval_ms": PING_INTERVAL_MS}
    results: dict[tuple[str, str], dict[str, Any]] = {}
    server = redis.Redis.from_url(url, client_name=MONITOR_NAME)
    with workers("contend", specs) as procs, workers("ping", [ping_spec]) as (pinger,):
        for worker in [*procs, pinger]:
            worker.expect("ready", 60)
        for parser in parsers:
            for cs_ms in size.critical_sections_ms:
                cs = f"{cs_ms:g}ms"
                name = f"bench-{run_id}-contend-{library.key}-{parser}-{cs}-{repeat}"
                load_before = os.getloadavg()[0]
                start_ns = time.monotonic_ns() + int(size.contended_lead_s * 1e9)
                measured_from = start_ns + int(size.contended_warmup_s * 1e9)
                stop_ns = measured_from + int(size.contended_s * 1e9)
                drain_s = 30.0
                server_cpu_before = server_cpu_s(server)
                for worker in procs:
                    worker.send(
                        cmd="run",
                        name=name,
                        parser=parser,
                        cs_ms=cs_ms,
                        start_ns=start_ns,
                        stop_ns=stop_ns,
                        drain_s=drain_s,
                    )
                pinger.send(
                    cmd="run", parser=parser, measured_from_ns=measured_from, stop_ns=stop_ns
                )
                holds: list[TimedHold] = []
                errors: list[str] = []
                client_cpu_ns = 0
                budget = (stop_ns - time.monotonic_ns()) / 1e9 + drain_s + 30
                for worker in procs:
                    done = worker.expect("done", budget)
                    holds.extend(TimedHold.from_row(row) for row in done["holds"])
                    errors.extend(done["errors"])
                    client_cpu_ns += int(done["cpu_ns"])
                samples = pinger.expect("done", budget)["samples"]
                server_cpu = server_cpu_s(server) - server_cpu_before
                during = {kind: ping_stats(samples[kind]) for kind in ("async", "sync")}
                summary = summarize_contended(
                    holds, (measured_from, stop_ns), during[library.kind]["p50_ns"]
                )
                gaps = summary["_gaps_ns"]
                quiet = quiet_ping_ns[parser]
                summary["ping_during_us"] = {
                    f"{kind}_{point}": during[kind][f"{point}_us"]
                    for kind in ("async", "sync")
                    for point in ("p50", "p99")
                }
                summary["gap_p50_quiet_ping"] = quantile(gaps, 50) / quiet if gaps else None
                summary["gap_p99_quiet_ping"] = quantile(gaps, 99) / quiet if gaps else None
                # CPU per grant over the whole phase (warm-up and drain included),
                # all contender processes together; the server's includes the
                # light PING load.
                every_grant = max(1, len(holds))
                summary["client_cpu_us_per_grant"] = client_cpu_ns / 1000 / every_grant
                summary["server_cpu_us_per_grant"] = server_cpu * 1e6 / every_grant
                summary["errors"] = errors
                summary["load_average_1min"] = load_before
                results[(cs, parser)] = summary
    server.close()
    return results


SUMMED = (
    "fifo_violations_call_order",
    "fifo_violations_ticket_order",
    "overlaps",
    "fence_order_errors",
    "grants",
    "handoffs",
    "reacquisitions",
)
"""Counts that are added up over repeats rather than taken the median of."""


def combine_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure per metric: the median over repeats (sums for counts, the
    largest worst overtake); the gaps of all repeats pooled as ``gap_pooled_us``."""
    if not runs:
        return {}
    combined: dict[str, Any] = {"repeats": len(runs)}
    for key, value in runs[0].items():
        if key.startswith("_"):
            continue
        values = [run[key] for run in runs]
        if key == "fifo_worst_overtake_ms":
            combined[key] = max(values)
        elif key in SUMMED:
            combined[key] = None if value is None else sum(values)
        elif key == "errors":
            combined[key] = [error for run in runs for error in run[key]]
        elif isinstance(value, dict):
            combined[key] = {point: median(run[key].get(point) for run in runs) for point in value}
        else:
            combined[key] = median(values)
    gaps = [ns for run in runs for ns in run["_gaps_ns"]]
    combined["gap_pooled_us"] = distribution([ns / 1000 for ns in gaps])
    combined["per_repeat"] = [
        {
            key: run[key]
            for key in (
                "grants_per_s",
                "handoffs_per_s",
                "gap_p50_ping",
                "gap_p99_ping",
                "fifo_violations_call_order",
                "load_average_1min",
            )
        }
        for run in runs
    ]
    return combined


# --- 4. hand-off commands ---------------------------------------------------------------------


def handoff_windows(
    entries: list[tuple[str, str, str]], markers: list[tuple[str, str]]
) -> list[list[tuple[str, str]]]:
    """For each (begin, end) marker pair, the (command name, client address) of
    every command the server ran between the two ``ECHO``s; the address is
    ``lua:`` for a command run inside a script (not a round trip). The markers'
    own connection sends nothing else."""
    windows: list[list[tuple[str, str]]] = []
    for begin, end in markers:
        inside: list[tuple[str, str]] | None = None
        for command, address, _client_type in entries:
            if begin in command:
                inside = []
            elif end in command:
                if inside is not None:
                    windows.append(inside)
                break
            elif inside is not None:
                inside.append((command.split(" ", 1)[0].upper(), address))
    return windows


SIDES = {"-a": "releaser's process", "-b": "waiter's process"}
"""Which process a hand-off command came from, by its connection's name suffix."""


def run_handoff(library: Library, url: str, run_id: str, size: Size) -> dict[str, Any]:
    """Count the commands of single hand-offs under MONITOR, with the pure-Python
    parser (the parser changes no command).

    Process A has two contenders and process B one. In each trial the holder
    (A's first) releases while one waiter is waiting, either in its own process
    (A's second) or in the other (B's): the round trips between the holder's
    ``release`` call and the waiter's ``acquire`` return are counted, split by
    which process sent them.
    """
    name = f"bench-{run_id}-handoff-{library.key}"
    specs = [
        {
            "library": library.key,
            "url": url,
            "parser": "python",
            "name": name,
            "client_name": f"bench-relay-{side}",
            "marker_name": f"bench-marker-{side}",
            "contenders": count,
        }
        for side, count in (("a", 2), ("b", 1))
    ]
    monitor = redis.Redis.from_url(url, client_name=MONITOR_NAME)
    markers: list[tuple[str, str]] = []
    cases: list[str] = []
    names: dict[str, str] = {}
    prefix = f"bench-handoff-{secrets.token_hex(3)}"

    def trial(waiter: Worker, who: int, begin: str, end: str) -> None:
        a.send(cmd="take", who=0)
        a.expect("held", 30)
        waiter.send(cmd="wait", who=who, end=end)
        waiter.expect("waiting", 30)
        time.sleep(size.handoff_settle_s)
        a.send(cmd="release", who=0, begin=begin)
        if waiter is a:
            # Both from one process: the waiter may report before the releaser.
            a.expect_all(("released", "acquired"), 30)
        else:
            a.expect("released", 30)
            waiter.expect("acquired", 30)
        waiter.send(cmd="release", who=who)
        waiter.expect("released", 30)
        # Who sent what: the names of the connections open now (a library may
        # open and close connections between trials).
        for entry in monitor.client_list():
            names[str(entry["addr"])] = str(entry["name"])

    with workers("relay", specs) as (a, b):
        a.expect("ready", 60)
        b.expect("ready", 60)
        # One unwatched hand-off of each case first: connections are opened and
        # scripts loaded, as in a lock that has been used before.
        trial(a, 1, f"{prefix}-warm", f"{prefix}-warm")
        trial(b, 0, f"{prefix}-warm", f"{prefix}-warm")
        with MonitorLog(url) as log:
            for number in range(size.handoff_trials):
                for case, waiter, who in (("same process", a, 1), ("other process", b, 0)):
                    begin = f"{prefix}-begin-{number}-{who}"
                    end = f"{prefix}-end-{number}-{who}"
                    trial(waiter, who, begin, end)
                    markers.append((begin, end))
                    cases.append(case)
    monitor.close()
    windows = handoff_windows(log.entries, markers)
    if len(windows) != len(markers):
        raise BenchError(f"{library.key}: {len(windows)} of {len(markers)} hand-offs seen")
    result: dict[str, Any] = {"trials": size.handoff_trials}
    for case in ("same process", "other process"):
        picked = [window for window, one in zip(windows, cases, strict=True) if one == case]
        counts: dict[str, float] = {}
        in_scripts: dict[str, float] = {}
        by_side: dict[str, float] = {}
        for window in picked:
            for command, address in window:
                if address == "lua:":
                    in_scripts[command] = in_scripts.get(command, 0) + 1 / len(picked)
                    continue
                counts[command] = counts.get(command, 0) + 1 / len(picked)
                side = SIDES.get(names.get(address, "")[-2:], "unnamed connection")
                by_side[side] = by_side.get(side, 0) + 1 / len(picked)
        result[case.replace(" ", "_")] = {
            "round_trips": sum(counts.values()),
            "commands": dict(sorted(counts.items())),
            "by_side": by_side,
            "in_scripts": dict(sorted(in_scripts.items())),
            "per_trial": [
                sum(1 for _, address in window if address != "lua:") for window in picked
            ],
        }
    return result


# --- 5. idle -----------------------------------------------------------------------------------


def wait_queued(client: redis.Redis, name: str, count: int, timeout_s: float) -> None:
    """For our lock: wait until ``count`` requests are in its queue."""
    key = LockKeys(name).key("queue")
    deadline = time.monotonic() + timeout_s
    while client.zcard(key) < count:
        if time.monotonic() > deadline:
            raise BenchError(f"only {client.zcard(key)} of {count} waiters queued on {name}")
        time.sleep(0.1)


def wait_steady(client: redis.Redis, every_s: float, timeout_s: float) -> float:
    """Wait until the server's connected and blocked client counts are the same
    in two samples ``every_s`` apart (thousands of waiters take a while to
    connect, or to reach their ``BLPOP``); return the seconds waited."""

    def sample() -> tuple[int, int]:
        info = client.info("clients")
        return int(info["connected_clients"]), int(info["blocked_clients"])

    began = time.monotonic()
    last = sample()
    for _ in range(int(timeout_s / every_s) + 1):
        time.sleep(every_s)
        now = sample()
        if now == last:
            break
        last = now
    return time.monotonic() - began


def run_idle(
    library: Library, url: str, run_id: str, waiters: int, size: Size, monitor: redis.Redis
) -> dict[str, Any]:
    """``waiters`` waiters in one process on a held lock; measure the window."""
    name = f"bench-{run_id}-idle-{library.key}-{waiters}"
    holder_library = holder_kind(library)
    holder = sync_factory(holder_library)(
        Connection(url, "bench-holder"), name, holder_library.hold_lease_ms
    )
    holder.acquire()
    try:
        baseline_clients = connected_clients(monitor)
        spec = {
            "library": library.key,
            "url": url,
            "client_name": WAITERS_NAME,
            "name": name,
            "waiters": waiters,
            "settle_s": size.idle_settle_s,
            "client_options": IDLE_CLIENT_OPTIONS | {"max_connections": waiters + 100},
        }
        with workers("idle", [spec]) as (worker,):
            try:
                baseline = worker.expect("baseline", 60)
                ready = worker.expect("ready", 300)
                if library.ours:
                    wait_queued(monitor, name, waiters, 300)
                settled = wait_steady(monitor, size.idle_settle_s, 300)
                before = command_calls(monitor)
                began = time.monotonic()
                samples = []
                end = began + size.idle_s
                while time.monotonic() < end:
                    samples.append(connected_clients(monitor) - baseline_clients)
                    time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                after = command_calls(monitor)
                seconds = time.monotonic() - began
                samples.append(connected_clients(monitor) - baseline_clients)
                named = sum(1 for entry in monitor.client_list() if entry["name"] == WAITERS_NAME)
                worker.send(cmd="report")
                final = worker.expect("report", 60)
            finally:
                worker.kill()
    finally:
        with contextlib.suppress(Exception):
            holder.release()
    calls = calls_between(before, after)
    total = sum(calls.values())
    scripts = sum(calls.get(command, 0) for command in ("evalsha", "eval", "fcall"))
    return {
        "waiters": waiters,
        "settled_s": settled,
        "window_s": seconds,
        "commands_per_s": total / seconds,
        "script_calls_per_s": scripts / seconds,
        "commands": calls,
        "connections_max": max(samples),
        "connections_named": named,
        "rss_mib": final["rss_kb"] / 1024,
        "baseline_rss_mib": baseline["rss_kb"] / 1024,
        "rss_per_waiter_kib": (final["rss_kb"] - baseline["rss_kb"]) / waiters,
        "threads": final["threads"],
        "started": ready["started"],
        "acquired": final["acquired"],
        "failed": final["failed"],
        "errors": final["errors"],
    }


# --- 6. crash -----------------------------------------------------------------------------------


def run_crash_trial(library: Library, url: str, name: str, lease_ms: int) -> dict[str, float]:
    """Kill a holder soon after its grant; time until the waiter is granted."""
    spec = {"library": library.key, "url": url, "name": name, "lease_ms": lease_ms}
    waiter_spec = {**spec, "client_name": "bench-crash-waiter"}
    holder_spec = {**spec, "client_name": "bench-crash-holder"}
    with workers("crash-waiter", [waiter_spec]) as (waiter,):
        with workers("crash-holder", [holder_spec]) as (holder,):
            holder.expect("ready", 60)
            waiter.expect("ready", 60)
            holder.send(cmd="go")
            held_ns = holder.expect("acquired", 60)["ns"]
            waiter.send(cmd="go")
            waiter.expect("waiting", 30)
            time.sleep(0.1)  # the waiter's request is in (ours: queued, others: polling)
            killed_ns = time.monotonic_ns()
            holder.kill()
        granted_ns = waiter.expect("acquired", lease_ms / 1000 + 30)["ns"]
    lease_left_ms = lease_ms - (killed_ns - held_ns) / 1e6
    kill_to_grant_ms = (granted_ns - killed_ns) / 1e6
    return {
        "kill_to_grant_ms": kill_to_grant_ms,
        "lease_left_at_kill_ms": lease_left_ms,
        "after_expiry_ms": kill_to_grant_ms - lease_left_ms,
    }


def run_crash(library: Library, url: str, run_id: str, size: Size) -> dict[str, Any]:
    """``crash_trials`` kills, each on a fresh lock name."""
    trials = [
        run_crash_trial(
            library, url, f"bench-{run_id}-crash-{library.key}-{trial}", size.crash_lease_ms
        )
        for trial in range(size.crash_trials)
    ]
    kill_to_grant = [trial["kill_to_grant_ms"] for trial in trials]
    after = [trial["after_expiry_ms"] for trial in trials]
    return {
        "lease_ms": size.crash_lease_ms,
        "trials": trials,
        "kill_to_grant_ms_p50": quantile(kill_to_grant, 50),
        "kill_to_grant_ms_max": max(kill_to_grant),
        "after_expiry_ms_p50": quantile(after, 50),
        "after_expiry_ms_max": max(after),
    }
