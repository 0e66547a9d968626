"""Run every workload against every library, in one run, on one Redis server.

Usage::

    uv run --all-extras --group bench python -m benchmarks.run [--size smoke|full]

With ``REDIS_URL`` unset, a private ``redis-server`` is started (see
``redis_fifo_lock.testing``) with ``--maxclients`` raised so that a library
that holds a connection per waiter can be measured at 10,000 waiters. With
``REDIS_URL`` set, that server is used; the benchmark only touches keys whose
names contain its run id and deletes them at the end.

Workloads (``benchmarks.workloads``; ``--size full`` is described, ``smoke`` runs
the same code, smaller and shorter):

1. **PING**: the bare round trip on the quiet server, with a ``redis.asyncio``
   and a ``redis.Redis`` client. Latencies of asyncio libraries are divided by
   the first, of threaded libraries by the second. During each contended run a
   separate light process times PINGs again (the ``ping`` worker), the unit of
   the contended ratios.
2. **uncontended**: acquire + release in a loop in this process, timed per
   iteration after a warm-up; then a short pass under ``MONITOR`` counts the
   commands each acquire + release sends (commands run inside a Lua script
   are not round trips and are not counted).
3. **contended**: 4 processes x 8 contenders (asyncio tasks, or threads for
   sync libraries) take and release one lock in a loop, with an empty and a
   1 ms critical section; see ``benchmarks.analysis`` for the figures. Each
   repeat starts with another library.
4. **idle**: 1,000 and 10,000 waiters in one process blocked for 30 s on a lock
   held by this process: Redis commands per second (``INFO commandstats``,
   which counts commands run inside scripts too), connections the waiting
   process holds (``INFO clients``), and its resident memory. Every library's
   waiters get a pool larger than their number and no socket timeout
   (``IDLE_CLIENT_OPTIONS``), so that each can wait the way it was designed to.
5. **crash**: a holder with a 1,000 ms lease is SIGKILLed; the time until a
   waiter in another process is granted the lock.
6. **keyspace**: the bytes Redis keeps for one lock name (``MEMORY USAGE`` of
   its keys) while held with 10 waiters, right after release, and after the
   idle window (30 s at most; 1 s in the smoke size); see ``benchmarks.keyspace``.

Results go to ``--out`` (default ``benchmarks/results/<size>``): ``results.json``,
``RESULTS.md`` and ``handoff.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import redis

from benchmarks import keyspace, report
from benchmarks.analysis import median
from benchmarks.harness import ROOT, redis_server
from benchmarks.libraries import BY_KEY, LIBRARIES, Library
from benchmarks.workloads import (
    MONITOR_NAME,
    SIZES,
    WORKLOADS,
    combine_repeats,
    measure_ping,
    measure_uncontended,
    run_contended,
    run_crash,
    run_idle,
)

# --- the run --------------------------------------------------------------------------------


def machine(client: redis.Redis) -> dict[str, Any]:
    """What the figures were measured on."""
    server = client.info("server")
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": f"{server.get('redis_version')} ({server.get('server_name', 'redis')})",
        "redis_py": redis.__version__,
        "load_average_before": list(os.getloadavg()),
    }


def cleanup(client: redis.Redis, run_id: str) -> int:
    """Delete every key this run made; return how many."""
    deleted = 0
    for key in client.scan_iter(match=f"*bench-{run_id}-*", count=1000):
        deleted += int(client.delete(key))
    return deleted


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected workloads; return the results (with raw latencies)."""
    size = SIZES[args.size]
    if args.repeats is not None:
        size = replace(size, repeats=args.repeats)
    if args.idle_seconds is not None:
        size = replace(size, idle_s=args.idle_seconds)
    if args.contended_seconds is not None:
        size = replace(size, contended_s=args.contended_seconds)
    if args.idle_waiters is not None:
        size = replace(size, idle_waiters=tuple(args.idle_waiters))
    libraries = [BY_KEY[key] for key in args.only] if args.only else list(LIBRARIES)
    run_id = secrets.token_hex(4)
    results: dict[str, Any] = {
        "schema": report.SCHEMA_VERSION,
        "size": args.size,
        "settings": asdict(size),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "libraries": {
            lib.key: {
                "label": lib.label,
                "kind": lib.kind,
                "ours": lib.ours,
                "version": lib.version,
            }
            for lib in libraries
        },
    }
    with redis_server(max(size.idle_waiters)) as url:
        monitor = redis.Redis.from_url(url, client_name=MONITOR_NAME)
        results["machine"] = machine(monitor)
        log(f"server {url}; run id {run_id}; size {args.size}")
        results["ping"] = measure_ping(url, size.ping_samples)
        ping = results["ping"]
        log(
            f"PING p50: asyncio {ping['async']['p50_us']:.1f} µs, "
            f"sync {ping['sync']['p50_us']:.1f} µs"
        )

        def ping_ns(library: Library) -> float:
            return float(ping[library.kind]["p50_ns"])

        if "uncontended" in args.workloads:
            runs: dict[str, list[dict[str, Any]]] = {lib.key: [] for lib in libraries}
            for repeat in range(size.repeats):
                shift = repeat % len(libraries)
                for lib in libraries[shift:] + libraries[:shift]:
                    name = f"bench-{run_id}-uncontended-{lib.key}-{repeat}"
                    runs[lib.key].append(measure_uncontended(lib, url, name, size))
                    log(f"uncontended {lib.key}: {runs[lib.key][-1]['p50_us']:.0f} µs")
            results["uncontended"] = {}
            for lib in libraries:
                one = runs[lib.key]
                p50 = median(run["p50_us"] for run in one) or 0.0
                results["uncontended"][lib.key] = {
                    "p50_us": p50,
                    "p99_us": median(run["p99_us"] for run in one),
                    "p50_ping": p50 * 1000 / ping_ns(lib),
                    "round_trips": max(run["round_trips"] for run in one),
                    "commands": one[-1]["commands"],
                    "per_repeat_p50_us": [run["p50_us"] for run in one],
                }

        if "contended" in args.workloads:
            per: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for repeat in range(size.repeats):
                # Each repeat starts with another library, so that a burst of load
                # from elsewhere on the machine does not always hit the same one.
                shift = repeat % len(libraries)
                for lib in libraries[shift:] + libraries[:shift]:
                    outcome = run_contended(lib, url, run_id, size, repeat, ping_ns(lib))
                    for cs, summary in outcome.items():
                        per.setdefault(cs, {}).setdefault(lib.key, []).append(summary)
                        log(
                            f"contended {cs} {lib.key} #{repeat}: "
                            f"{summary['handoffs_per_s']:.0f} hand-offs/s, "
                            f"p50 {summary['handoff_p50_ping'] or float('nan'):.2f}x PING, "
                            f"violations {summary['fifo_violations_call_order']}"
                        )
            results["contended"] = {
                cs: {key: combine_repeats(lib_runs) for key, lib_runs in by_lib.items()}
                for cs, by_lib in per.items()
            }
            results["_latencies_ns"] = {
                cs: {
                    key: [ns for one in lib_runs for ns in one["_latencies_ns"]]
                    for key, lib_runs in by_lib.items()
                }
                for cs, by_lib in per.items()
            }

        if "idle" in args.workloads:
            results["idle"] = {}
            for waiters in size.idle_waiters:
                for lib in libraries:
                    outcome = run_idle(lib, url, run_id, waiters, size, monitor)
                    results["idle"].setdefault(str(waiters), {})[lib.key] = outcome
                    log(
                        f"idle {waiters} {lib.key}: {outcome['commands_per_s']:.1f} commands/s, "
                        f"{outcome['connections_max']} connections, "
                        f"{outcome['rss_mib']:.0f} MiB"
                    )

        if "crash" in args.workloads:
            results["crash"] = {}
            for lib in libraries:
                results["crash"][lib.key] = run_crash(lib, url, run_id, size)
                log(f"crash {lib.key}: {results['crash'][lib.key]['kill_to_grant_ms_p50']:.0f} ms")

        if "keyspace" in args.workloads:
            results["keyspace"] = keyspace.measure(
                url,
                waiters=size.keyspace_waiters,
                lease_ms=1000,
                idle_timeout_s=size.keyspace_idle_s,
            )
            figures = results["keyspace"]
            log(
                f"keyspace: {figures['held_bytes']} B held with {figures['waiters']} waiters, "
                f"{figures['released_bytes']} B released, {figures['idle_bytes']} B idle"
            )

        results["ping_after"] = measure_ping(url, size.ping_samples)
        results["machine"]["load_average_after"] = list(os.getloadavg())
        cleanup(monitor, run_id)
        monitor.close()
    results["targets"] = report.targets(results)
    return results


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument(
        "--out", type=Path, help="output directory (default: benchmarks/results/<size>)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=[lib.key for lib in LIBRARIES], help="libraries to run"
    )
    parser.add_argument(
        "--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), help="what to run"
    )
    parser.add_argument("--repeats", type=int, help="override the size's repeat count")
    parser.add_argument("--idle-seconds", type=float, help="override the idle window")
    parser.add_argument("--contended-seconds", type=float, help="override the contended window")
    parser.add_argument("--idle-waiters", type=int, nargs="+", help="override the idle crowd sizes")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run, write ``results.json``, ``RESULTS.md`` and ``handoff.png``; print the table."""
    args = parse(argv)
    out: Path = args.out or ROOT / "benchmarks" / "results" / args.size
    began = time.monotonic()
    results = run(args)
    results["duration_s"] = round(time.monotonic() - began, 1)
    out.mkdir(parents=True, exist_ok=True)
    latencies = results.pop("_latencies_ns", {})
    if latencies:
        report.plot(results, latencies, out / "handoff.png")
    problems = report.check(results)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.markdown(results, png="handoff.png" if latencies else None)
    (out / "RESULTS.md").write_text(markdown)
    print(markdown)
    log(
        f"wrote {out}/results.json, RESULTS.md{', handoff.png' if latencies else ''} "
        f"in {results['duration_s']:.0f} s"
    )
    if problems:
        for problem in problems:
            log(f"results problem: {problem}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
