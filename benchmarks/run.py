"""Run every workload against every library, in one run, on one Redis server.

Usage::

    uv run --all-extras --group bench python -m benchmarks.run [--size smoke|full]

With ``REDIS_URL`` unset, a private ``redis-server`` is started (see
``redis_fifo_lock.testing``) with ``--maxclients`` raised so that a library
that holds a connection per waiter can be measured at 10,000 waiters. With
``REDIS_URL`` set, that server is used; the benchmark only touches keys whose
names contain its run id and deletes them at the end.

Every library runs with redis-py's pure-Python reply parser and with hiredis
(``--parsers``; see ``benchmarks.libraries``): result rows are keyed
``<library>`` and ``<library>+hiredis``. ``benchmarks/README.md`` defines every
figure; in short:

1. **PING**: the bare round trip on the quiet server, with a ``redis.asyncio``
   and a ``redis.Redis`` client, per parser (the *quiet PING*). During each
   contended phase a separate light process times PINGs again (the *in-run
   PING*, the ``ping`` worker), the unit of the headline ratios.
2. **uncontended**: acquire + release in a loop in this process, timed per
   iteration after a warm-up; then a short pass under ``MONITOR`` counts the
   commands each acquire + release sends (commands run inside a Lua script
   are not round trips and are not counted).
3. **contended**: 4 processes x 4 contenders (asyncio tasks, or threads for
   sync libraries) take and release one lock in a loop, with an empty and a
   1 ms critical section. Headline: **grants/s** (every grant) and the **idle
   gap** (previous holder calls ``release`` -> next holder's ``acquire``
   returns), p50 and p99, in µs and in PINGs; secondary: hand-offs to another
   contender per second, CPU per grant, FIFO overtakes (see
   ``benchmarks.analysis``). Each repeat starts with another library.
4. **handoff**: single hand-offs under ``MONITOR``: the round trips between the
   holder's ``release`` call and the waiter's ``acquire`` return, with the
   waiter in the holder's process and in another.
5. **idle**: 1,000 and 10,000 waiters in one process blocked for 30 s on a lock
   held by this process: Redis commands per second (``INFO commandstats``,
   which counts commands run inside scripts too), connections the waiting
   process holds (``INFO clients``), and its resident memory. Every library's
   waiters get a pool larger than their number and no socket timeout
   (``IDLE_CLIENT_OPTIONS``), so that each can wait the way it was designed to.
6. **crash**: a holder with a 1,000 ms lease is SIGKILLed; the time until a
   waiter in another process is granted the lock.
7. **keyspace**: the bytes Redis keeps for one lock name (``MEMORY USAGE`` of
   its keys) while held with 10 waiters, right after release, and after the
   idle window (30 s at most; 1 s in the smoke size); see ``benchmarks.keyspace``.

The idle, crash, handoff and keyspace workloads use the pure-Python parser only.
With ``--profile DIR``, every asyncio contender process writes a cProfile of
each contended phase to ``DIR`` (see ``benchmarks/PROFILE.md``).

Results go to ``--out`` (default ``benchmarks/results/<size>``): ``results.json``,
``RESULTS.md`` and ``gap.png``.
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
from benchmarks.libraries import (
    BY_KEY,
    LIBRARIES,
    PARSERS,
    YARDSTICK_WORKLOADS,
    YARDSTICKS,
    Library,
    Parser,
    available_parsers,
    row_key,
)
from benchmarks.workloads import (
    MONITOR_NAME,
    SIZES,
    WORKLOADS,
    combine_repeats,
    measure_ping,
    measure_uncontended,
    run_contended,
    run_crash,
    run_handoff,
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
    parsers: tuple[Parser, ...] = tuple(args.parsers) if args.parsers else available_parsers()
    missing = set(parsers) - set(available_parsers())
    if missing:
        raise SystemExit(f"reply parser(s) not installed: {', '.join(sorted(missing))}")
    if args.profile:
        os.environ["BENCH_PROFILE_DIR"] = str(args.profile.resolve())  # the workers inherit it
    run_id = secrets.token_hex(4)
    results: dict[str, Any] = {
        "schema": report.SCHEMA_VERSION,
        "size": args.size,
        "parsers": list(parsers),
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
        results["ping"] = {
            parser: measure_ping(url, size.ping_samples, parser) for parser in parsers
        }
        ping = results["ping"]
        for parser in parsers:
            log(
                f"quiet PING p50 ({parser}): asyncio {ping[parser]['async']['p50_us']:.1f} µs, "
                f"sync {ping[parser]['sync']['p50_us']:.1f} µs"
            )

        def ping_ns(library: Library, parser: str) -> float:
            return float(ping[parser][library.kind]["p50_ns"])

        if "uncontended" in args.workloads:
            runs: dict[str, list[dict[str, Any]]] = {}
            for repeat in range(size.repeats):
                shift = repeat % len(libraries)
                for lib in libraries[shift:] + libraries[:shift]:
                    for parser in parsers:
                        name = f"bench-{run_id}-uncontended-{lib.key}-{parser}-{repeat}"
                        row = row_key(lib.key, parser)
                        measured = measure_uncontended(lib, url, name, size, parser)
                        runs.setdefault(row, []).append(measured)
                        log(f"uncontended {row}: {measured['p50_us']:.0f} µs")
            results["uncontended"] = {}
            for lib in libraries:
                for parser in parsers:
                    row = row_key(lib.key, parser)
                    one = runs[row]
                    p50 = median(run["p50_us"] for run in one) or 0.0
                    results["uncontended"][row] = {
                        "p50_us": p50,
                        "p99_us": median(run["p99_us"] for run in one),
                        "p50_ping": p50 * 1000 / ping_ns(lib, parser),
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
                    quiet: dict[str, float] = {parser: ping_ns(lib, parser) for parser in parsers}
                    outcome = run_contended(lib, url, run_id, size, repeat, parsers, quiet)
                    for (cs, phase_parser), summary in outcome.items():
                        row = row_key(lib.key, phase_parser)
                        per.setdefault(cs, {}).setdefault(row, []).append(summary)
                        log(
                            f"contended {cs} {row} #{repeat}: "
                            f"{summary['grants_per_s']:.0f} grants/s, idle gap p50 "
                            f"{summary['gap_p50_us'] or float('nan'):.0f} µs = "
                            f"{summary['gap_p50_ping'] or float('nan'):.2f}x PING, "
                            f"hold mean {summary['hold_mean_us'] or float('nan'):.0f} µs, "
                            f"{summary['handoffs_per_s']:.0f} hand-offs/s, "
                            f"overtakes {summary['fifo_violations_call_order']}"
                        )
            # Rows in the order of the libraries, each library's parsers together.
            order = [row_key(lib.key, parser) for lib in libraries for parser in parsers]
            results["contended"] = {
                cs: {row: combine_repeats(by_row[row]) for row in order if row in by_row}
                for cs, by_row in per.items()
            }
            results["_gaps_ns"] = {
                cs: {
                    row: [ns for one in by_row[row] for ns in one["_gaps_ns"]]
                    for row in order
                    if row in by_row
                }
                for cs, by_row in per.items()
            }

        if "handoff" in args.workloads:
            results["handoff"] = {}
            for lib in libraries:
                figures = run_handoff(lib, url, run_id, size)
                results["handoff"][lib.key] = figures
                log(
                    f"handoff {lib.key}: {figures['same_process']['round_trips']:.1f} round trips "
                    f"(same process), {figures['other_process']['round_trips']:.1f} (other)"
                )

        if "idle" in args.workloads:
            results["idle"] = {}
            for waiters in size.idle_waiters:
                for lib in libraries:
                    idle = run_idle(lib, url, run_id, waiters, size, monitor)
                    results["idle"].setdefault(str(waiters), {})[lib.key] = idle
                    log(
                        f"idle {waiters} {lib.key}: {idle['commands_per_s']:.1f} commands/s, "
                        f"{idle['connections_max']} connections, "
                        f"{idle['rss_mib']:.0f} MiB"
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

        results["ping_after"] = {
            parser: measure_ping(url, size.ping_samples, parser) for parser in parsers
        }
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
        "--only",
        nargs="+",
        choices=[lib.key for lib in (*LIBRARIES, *YARDSTICKS)],
        help="libraries to run (default: every library, no yardstick)",
    )
    parser.add_argument(
        "--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), help="what to run"
    )
    parser.add_argument(
        "--parsers",
        nargs="+",
        choices=PARSERS,
        help="reply parsers to run every library with (default: both, if hiredis is installed)",
    )
    parser.add_argument(
        "--profile", type=Path, help="write a cProfile of each asyncio contender process here"
    )
    parser.add_argument("--repeats", type=int, help="override the size's repeat count")
    parser.add_argument("--idle-seconds", type=float, help="override the idle window")
    parser.add_argument("--contended-seconds", type=float, help="override the contended window")
    parser.add_argument("--idle-waiters", type=int, nargs="+", help="override the idle crowd sizes")
    args = parser.parse_args(argv)
    yardsticks = {lib.key for lib in YARDSTICKS} & set(args.only or ())
    beyond = sorted(set(args.workloads) - set(YARDSTICK_WORKLOADS))
    if yardsticks and beyond:
        parser.error(
            f"yardstick {', '.join(sorted(yardsticks))} runs only the workloads "
            f"{', '.join(YARDSTICK_WORKLOADS)}; drop it or pass --workloads without "
            f"{', '.join(beyond)}"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run, write ``results.json``, ``RESULTS.md`` and ``gap.png``; print the table."""
    args = parse(argv)
    out: Path = args.out or ROOT / "benchmarks" / "results" / args.size
    began = time.monotonic()
    results = run(args)
    results["duration_s"] = round(time.monotonic() - began, 1)
    out.mkdir(parents=True, exist_ok=True)
    gaps = results.pop("_gaps_ns", {})
    if gaps:
        report.plot(results, gaps, out / "gap.png")
    problems = report.check(results)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.markdown(results, png="gap.png" if gaps else None)
    (out / "RESULTS.md").write_text(markdown)
    print(markdown)
    log(
        f"wrote {out}/results.json, RESULTS.md{', gap.png' if gaps else ''} "
        f"in {results['duration_s']:.0f} s"
    )
    if problems:
        for problem in problems:
            log(f"results problem: {problem}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
