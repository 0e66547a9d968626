"""Turn benchmark results into the targets' verdicts, a Markdown report, a PNG,
and check that a results file has the expected shape (``check``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.libraries import row_key, split_row_key

SCHEMA_VERSION = 2
"""2: grants/s and the idle gap from the release call are the headline figures;
rows per reply parser; PINGs per parser; the ``handoff`` workload."""

TIMES = "\u00d7"
"""The multiplication sign, for ratios in the report."""

OURS = "fifolock"
"""The asyncio core; the targets are judged on it and on ``OURS_SYNC``."""

OURS_SYNC = "fifolock-sync"
"""The sync facade, judged against the same targets."""

BASELINE = "python-redis-lock"
"""The peer whose grants/s ours must at least match (issue 15)."""

PEERS = ("redis-py-async", "redis-py", "python-redis-lock", "pottery")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


# --- targets -----------------------------------------------------------------------------


def _target(key: str, text: str, met: bool | None, detail: str) -> dict[str, Any]:
    return {"id": key, "target": text, "met": met, "detail": detail}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each judged on this run's figures (``met`` is None
    when the run did not measure what the target needs).

    The contended targets are judged for our asyncio core and our sync facade,
    with each reply parser, against the peers' figures with the same parser.
    """
    verdicts = []
    contended = results.get("contended", {})
    for cs, by_row in contended.items():
        for row, ours in by_row.items():
            library, parser = split_row_key(row)
            if library not in (OURS, OURS_SYNC):
                continue
            p50, p99 = ours.get("gap_p50_ping"), ours.get("gap_p99_ping")
            quiet50, quiet99 = ours.get("gap_p50_quiet_ping"), ours.get("gap_p99_quiet_ping")
            verdicts.append(
                _target(
                    f"gap-{row}-{cs}",
                    f"{row}: idle gap p50 <= 3 x and p99 <= 10 x the PING timed in the same "
                    f"run ({cs} critical section)",
                    None if p50 is None or p99 is None else p50 <= 3 and p99 <= 10,
                    f"p50 {_fmt(ours.get('gap_p50_us'), 0)} µs = {_fmt(p50, 2)} x, "
                    f"p99 {_fmt(ours.get('gap_p99_us'), 0)} µs = {_fmt(p99, 2)} x "
                    f"(quiet PING: {_fmt(quiet50, 2)} x / {_fmt(quiet99, 2)} x)",
                )
            )
            peer = by_row.get(BASELINE if parser == "python" else f"{BASELINE}+{parser}")
            rate = ours["grants_per_s"]
            verdicts.append(
                _target(
                    f"throughput-{row}-{cs}",
                    f"{row}: grants/s >= {BASELINE}'s with the same parser ({cs})",
                    None if peer is None else rate >= peer["grants_per_s"],
                    f"ours {_fmt(rate)}/s vs "
                    + ("not run" if peer is None else f"{_fmt(peer['grants_per_s'])}/s"),
                )
            )
            ticket = ours.get("fifo_violations_ticket_order")
            verdicts.append(
                _target(
                    f"fifo-{row}-{cs}",
                    f"{row}: 0 FIFO violations by ticket and 0 overlaps ({cs})",
                    None if ticket is None else ticket == 0 and ours["overlaps"] == 0,
                    f"by ticket {ticket}, overlaps {ours['overlaps']}; by call order "
                    f"{ours['fifo_violations_call_order']} (worst overtake "
                    f"{_fmt(ours.get('fifo_worst_overtake_ms'), 2)} ms)",
                )
            )
    idle = results.get("idle", {})
    if idle:
        largest = max(idle, key=int)
        ours = idle[largest].get(OURS)
        if ours is not None:
            met = ours["connections_max"] <= 4 and ours["commands_per_s"] <= 20
            if int(largest) < 10_000:
                met_or_none: bool | None = None
                note = f" (only {largest} waiters in this run: not judged)"
            else:
                met_or_none, note = met, ""
            verdicts.append(
                _target(
                    "idle",
                    "10,000 idle waiters in one process: <= 4 connections, <= 20 commands/s",
                    met_or_none,
                    f"{largest} waiters: {ours['connections_max']} connections, "
                    f"{_fmt(ours['commands_per_s'], 2)} commands/s{note}",
                )
            )
    space = results.get("keyspace")
    if space:
        judged = space["idle_after_s"] is not None or space["idle_window_s"] >= 30
        verdicts.append(
            _target(
                "keyspace-idle",
                "a lock name used and left idle keeps 0 bytes in Redis after its idle window",
                space["idle_bytes"] == 0 if judged else None,
                f"{space['idle_keys']} keys, {space['idle_bytes']} B after "
                f"{space['idle_after_s'] or space['idle_window_s']} s"
                + ("" if judged else " (window too short in this run: not judged)"),
            )
        )
    uncontended = results.get("uncontended", {})
    ours_rt = {
        key: row["round_trips"]
        for key, row in uncontended.items()
        if split_row_key(key)[0] in (OURS, OURS_SYNC)
    }
    if ours_rt:
        verdicts.append(
            _target(
                "round-trips",
                "uncontended acquire + release in at most 2 round trips",
                all(value <= 2 for value in ours_rt.values()),
                ", ".join(f"{key} {_fmt(value, 2)}" for key, value in ours_rt.items()),
            )
        )
    return verdicts


# --- the shape of a results file ----------------------------------------------------------------


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


REQUIRED = {
    "uncontended": ("p50_us", "p99_us", "p50_ping", "round_trips"),
    "contended": (
        "grants_per_s",
        "gap_p50_us",
        "gap_p99_us",
        "gap_p50_ping",
        "gap_p99_ping",
        "gap_p50_quiet_ping",
        "gap_p99_quiet_ping",
        "handoffs_per_s",
        "client_cpu_us_per_grant",
        "server_cpu_us_per_grant",
        "fifo_violations_call_order",
        "overlaps",
    ),
    "handoff": ("trials",),
    "idle": ("commands_per_s", "connections_max", "rss_mib", "window_s"),
    "crash": ("lease_ms", "kill_to_grant_ms_p50", "kill_to_grant_ms_max"),
}
"""Figures every row of a workload must have, as finite numbers."""

PER_PARSER = ("uncontended", "contended")
"""Workloads with a row per library and parser; the others have one per library."""

HANDOFF_CASES = ("same_process", "other_process")


def check(results: dict[str, Any]) -> list[str]:
    """Problems with the shape of ``results`` (empty when it is well formed).

    Checks the version, the machine and PING sections, that every workload
    reports every library (with every parser, where it runs per parser) with
    finite numbers for its required figures, and that no mutual-exclusion
    overlap or worker error was recorded.
    """
    problems: list[str] = []
    if results.get("schema") != SCHEMA_VERSION:
        problems.append(f"schema is {results.get('schema')!r}, expected {SCHEMA_VERSION}")
    libraries = results.get("libraries")
    if not isinstance(libraries, dict) or not libraries:
        return [*problems, "no libraries"]
    parsers = results.get("parsers")
    if not isinstance(parsers, list) or not parsers:
        return [*problems, "no parsers"]
    for field in ("cpus", "python", "redis_server"):
        if field not in results.get("machine", {}):
            problems.append(f"machine.{field} missing")
    for parser in parsers:
        for kind in ("async", "sync"):
            if not _number(results.get("ping", {}).get(parser, {}).get(kind, {}).get("p50_us")):
                problems.append(f"ping.{parser}.{kind}.p50_us missing")

    def check_rows(where: str, by_row: Any, rows: list[str], fields: tuple[str, ...]) -> None:
        if not isinstance(by_row, dict):
            problems.append(f"{where} is not a mapping")
            return
        for key in rows:
            row = by_row.get(key)
            if not isinstance(row, dict):
                problems.append(f"{where}.{key} missing")
                continue
            for field in fields:
                if not _number(row.get(field)):
                    problems.append(f"{where}.{key}.{field} is {row.get(field)!r}")
            if row.get("errors"):
                problems.append(f"{where}.{key} had errors: {row['errors'][:3]}")
            if row.get("overlaps"):
                problems.append(f"{where}.{key}: {row['overlaps']} overlapping holds")
            if row.get("acquired"):
                problems.append(f"{where}.{key}: {row['acquired']} idle waiters got a held lock")
            if where == "handoff":
                for case in HANDOFF_CASES:
                    if not _number(row.get(case, {}).get("round_trips")):
                        problems.append(f"handoff.{key}.{case}.round_trips missing")

    for workload, fields in REQUIRED.items():
        if workload not in results:
            continue
        rows = (
            [row_key(key, parser) for key in libraries for parser in parsers]
            if workload in PER_PARSER
            else list(libraries)
        )
        section = results[workload]
        if workload in ("contended", "idle"):
            if not isinstance(section, dict) or not section:
                problems.append(f"{workload} is empty")
                continue
            for sub, by_row in section.items():
                check_rows(f"{workload}.{sub}", by_row, rows, fields)
        else:
            check_rows(workload, section, rows, fields)
    for verdict in results.get("targets", []):
        if set(verdict) != {"id", "target", "met", "detail"}:
            problems.append(f"target entry {verdict!r} is malformed")
    return problems


# --- Markdown ------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def markdown(results: dict[str, Any], png: str | None = None) -> str:
    """The human-readable report of ``results``."""
    libs: dict[str, Any] = results["libraries"]
    m = results["machine"]
    ping = results["ping"]
    lines = [
        f"# Benchmark results ({results['size']} size)",
        "",
        f"Run {results['started']}, {_fmt(results.get('duration_s'), 0)} s, on {m['cpus']} "
        f"CPUs ({m['platform']}), Python {m['python']}, Redis {m['redis_server']}, "
        f"redis-py {m['redis_py']}; load average before "
        f"{', '.join(f'{x:.2f}' for x in m['load_average_before'])}"
        + (
            f", after {', '.join(f'{x:.2f}' for x in m['load_average_after'])}."
            if "load_average_after" in m
            else "."
        ),
        "",
        "Libraries: "
        + "; ".join(f"`{key}` = {lib['label']} {lib['version']}" for key, lib in libs.items())
        + ".",
        "",
        "Every library is run with redis-py's pure-Python reply parser (row `<library>`) "
        "and with hiredis (row `<library>+hiredis`), where the workload depends on it.",
        "",
        "PING round trips, p50 (p99), µs — the *quiet PING*, timed at the start on the "
        "quiet server:",
        "",
    ]
    rows = []
    for parser, kinds in ping.items():
        after = results.get("ping_after", {}).get(parser)
        rows.append(
            [
                parser,
                f"{_fmt(kinds['async']['p50_us'])} ({_fmt(kinds['async']['p99_us'])})",
                f"{_fmt(kinds['sync']['p50_us'])} ({_fmt(kinds['sync']['p99_us'])})",
                "-"
                if after is None
                else f"{_fmt(after['async']['p50_us'])} / {_fmt(after['sync']['p50_us'])}",
            ]
        )
    lines += _table(
        ["parser", "asyncio client", "sync client", "at the end: asyncio / sync p50"], rows
    )
    lines += [
        "",
        "A ratio divides by a PING p50 of the same kind of client (asyncio or sync) and "
        "the same parser as the row's: for the uncontended figures, the quiet PING; for "
        "the contended ones, the *in-run PING*, timed by a separate light process during "
        "the same measured window (the quiet-PING ratios are shown too).",
    ]

    if results.get("targets"):
        lines += ["", "## Targets", ""]
        for verdict in results["targets"]:
            mark = {True: "met", False: "MISSED", None: "not judged"}[verdict["met"]]
            lines.append(f"- **{mark}**: {verdict['target']} — {verdict['detail']}")

    if "uncontended" in results:
        lines += [
            "",
            "## Uncontended acquire + release",
            "",
            "Median over repeats of the per-iteration p50/p99; round trips are the "
            "commands one acquire + release sends, counted with MONITOR after warm-up.",
            "",
        ]
        rows = []
        for key, row in results["uncontended"].items():
            rows.append(
                [
                    f"`{key}`",
                    _fmt(row["p50_us"], 0),
                    _fmt(row["p50_ping"], 2),
                    _fmt(row["p99_us"], 0),
                    _fmt(row["round_trips"], 2),
                    ", ".join(f"{c} {_fmt(n, 2)}" for c, n in row["commands"].items()),
                ]
            )
        lines += _table(
            ["library", "p50 µs", f"p50 {TIMES} PING", "p99 µs", "round trips", "commands"], rows
        )

    if "contended" in results:
        settings = results["settings"]
        lines += [
            "",
            "## Contended",
            "",
            f"{settings['processes']} processes {TIMES} {settings['tasks']} contenders (asyncio "
            f"tasks; threads for sync libraries) on one lock, {settings['contended_s']:g} s "
            f"measured after {settings['contended_warmup_s']:g} s of warm-up, "
            f"{settings['repeats']} repeat(s): medians of the repeats; counts are summed.",
            "",
            "- **grants/s**: every grant whose acquire returned in the window, including a "
            "grant to the contender that held the lock just before.",
            "- **idle gap**: for every two consecutive grants, from the moment the previous "
            "holder *called* release (stamp taken just before the call) to the moment the "
            "next holder's acquire returned, both on the machine-wide monotonic clock; p50 / "
            f"p99 in µs, and in {TIMES} the in-run PING (and the quiet PING).",
            "- **hold**: from a holder's acquire returning to its call of release: the "
            "critical section's sleep and the time the contender's thread or event loop "
            "took to run it again; p50 / mean in µs. A grant takes a hold and an idle gap.",
            "- **hand-offs/s**: grants to a contender other than the previous holder "
            "(secondary); their own idle gap p50 / p99 is the next column.",
            "- **CPU µs / grant**: CPU time of all contender processes (client) and of Redis "
            "(server, with the light PING load) over the whole phase, per grant.",
            "- **overtakes**: grants made while an earlier arrival still waited, arrival = "
            "when the acquire call began (call), or our ticket from Redis (ticket); worst: "
            "the largest head start an overtaken call had. **overlaps**: a grant before an "
            "earlier holder called release (mutual-exclusion failure).",
        ]

        def kind(key: str) -> str:
            return str(libs.get(split_row_key(key)[0], {}).get("kind", "async"))

        for cs, by_row in results["contended"].items():
            lines += ["", f"### Critical section {cs}", ""]
            rows = []
            for key, row in by_row.items():
                hand = row["handoff_gap_us"]
                rows.append(
                    [
                        f"`{key}`",
                        _fmt(row["grants_per_s"], 0),
                        f"{_fmt(row['gap_p50_us'], 0)} / {_fmt(row['gap_p99_us'], 0)}",
                        f"{_fmt(row['gap_p50_ping'], 2)} / {_fmt(row['gap_p99_ping'], 2)}",
                        f"{_fmt(row.get('gap_p50_quiet_ping'), 2)} / "
                        f"{_fmt(row.get('gap_p99_quiet_ping'), 2)}",
                        f"{_fmt(row.get('hold_us', {}).get('p50'), 0)} / "
                        f"{_fmt(row.get('hold_mean_us'), 0)}",
                        _fmt(row.get("ping_during_us", {}).get(f"{kind(key)}_p50"), 0),
                        _fmt(row["handoffs_per_s"], 0),
                        f"{_fmt(hand.get('p50'), 0)} / {_fmt(hand.get('p99'), 0)}",
                        f"{_fmt(row['client_cpu_us_per_grant'], 0)} / "
                        f"{_fmt(row['server_cpu_us_per_grant'], 0)}",
                        f"{row['fifo_violations_call_order']}"
                        + (
                            f" / {row['fifo_violations_ticket_order']}"
                            if row.get("fifo_violations_ticket_order") is not None
                            else ""
                        ),
                        _fmt(row.get("fifo_worst_overtake_ms"), 2),
                        str(row["overlaps"]),
                    ]
                )
            lines += _table(
                [
                    "row",
                    "grants/s",
                    "idle gap p50 / p99 µs",
                    f"{TIMES} in-run PING",
                    f"{TIMES} quiet PING",
                    "hold p50 / mean µs",
                    "in-run PING µs",
                    "hand-offs/s",
                    "hand-off gap p50 / p99 µs",
                    "CPU µs / grant client / server",
                    "overtakes call (/ ticket)",
                    "worst overtake ms",
                    "overlaps",
                ],
                rows,
            )
        if png:
            lines += ["", f"![idle-gap distributions]({png})"]

    if "handoff" in results:
        lines += [
            "",
            "## Round trips per hand-off",
            "",
            "One holder releases while one waiter waits (in the holder's process, or in "
            "another); MONITOR lists the commands Redis received between the holder's "
            "release call and the waiter's acquire return (ECHO markers sent just before "
            "and just after; commands run inside scripts are listed apart: they are not round "
            "trips, but show how the waiter is woken), averaged over "
            f"{results['settings']['handoff_trials']} trial(s) per case, pure-Python parser. "
            "A polling lock's count includes the polls that fell in the window.",
            "",
        ]
        rows = []
        for key, row in results["handoff"].items():
            for case in HANDOFF_CASES:
                one = row[case]
                rows.append(
                    [
                        f"`{key}`",
                        case.replace("_", " "),
                        _fmt(one["round_trips"], 1),
                        ", ".join(f"{c} {_fmt(n, 1)}" for c, n in one["commands"].items()),
                        ", ".join(f"{side} {_fmt(n, 1)}" for side, n in one["by_side"].items()),
                        ", ".join(f"{c} {_fmt(n, 1)}" for c, n in one["in_scripts"].items()),
                    ]
                )
        lines += _table(
            ["library", "waiter", "round trips", "commands", "sent by", "run inside scripts"],
            rows,
        )

    if "idle" in results:
        lines += [
            "",
            "## Idle waiting",
            "",
            f"Waiters in one process blocked on a lock held by another client, "
            f"{results['settings']['idle_s']:g} s window. Commands/s is from INFO "
            "commandstats and counts the commands run inside Lua scripts too (a script "
            "call is one round trip but several commands); connections are the waiting "
            "process's (INFO clients, max over the window); memory is its resident set. "
            "Every library's waiters get a connection pool larger than the crowd and no "
            "socket timeout (redis-py 8 defaults to 100 connections and 5 s, which would "
            "fail most waiters of the libraries that need a connection each), so that "
            "each waits the way it was designed to.",
        ]
        for waiters, by_lib in results["idle"].items():
            lines += ["", f"### {int(waiters):,} waiters", ""]
            rows = []
            for key, row in by_lib.items():
                rows.append(
                    [
                        f"`{key}`",
                        str(row["connections_max"]),
                        _fmt(row["commands_per_s"], 2),
                        _fmt(row["script_calls_per_s"], 2),
                        _fmt(row["rss_mib"], 0),
                        _fmt(row["rss_per_waiter_kib"], 1),
                        str(row.get("failed", len(row["errors"]))),
                    ]
                )
            lines += _table(
                [
                    "library",
                    "connections",
                    "commands/s",
                    "of which script calls/s",
                    "RSS MiB",
                    "KiB per waiter",
                    "failed waiters",
                ],
                rows,
            )

    if "crash" in results:
        lines += [
            "",
            "## Crash detection",
            "",
            "A holder in another process is SIGKILLed about 0.1 s after its grant; the "
            "time until a waiting process is granted the lock. Every library gets the "
            "same lease; 'after expiry' subtracts the lease time that was left at the kill.",
            "",
        ]
        rows = []
        for key, row in results["crash"].items():
            rows.append(
                [
                    f"`{key}`",
                    str(row["lease_ms"]),
                    _fmt(row["kill_to_grant_ms_p50"], 0),
                    _fmt(row["kill_to_grant_ms_max"], 0),
                    _fmt(row["after_expiry_ms_p50"], 0),
                    _fmt(row["after_expiry_ms_max"], 0),
                ]
            )
        lines += _table(
            [
                "library",
                "lease ms",
                "kill → grant p50 ms",
                "max ms",
                "after expiry p50 ms",
                "max ms",
            ],
            rows,
        )
    if "keyspace" in results:
        space = results["keyspace"]
        idle = (
            f"{space['idle_after_s']} s"
            if space["idle_after_s"] is not None
            else f"not within {space['idle_window_s']:g} s"
        )
        lines += [
            "",
            "## Bytes Redis keeps per lock name",
            "",
            f"`MEMORY USAGE` summed over one name's keys (lease_ms {space['lease_ms']}); "
            f"every key gone after: {idle}.",
            "",
        ]
        lines += _table(
            ["state", "keys", "bytes"],
            [
                [
                    f"held, {space['waiters']} waiters",
                    str(space["held_keys"]),
                    str(space["held_bytes"]),
                ],
                ["right after release", str(space["released_keys"]), str(space["released_bytes"])],
                ["after the idle window", str(space["idle_keys"]), str(space["idle_bytes"])],
            ],
        )
    return "\n".join(lines) + "\n"


# --- the plot ---------------------------------------------------------------------------------


def plot(results: dict[str, Any], gaps: dict[str, dict[str, list[int]]], path: Path) -> None:
    """Idle-gap distributions (one panel per critical section; hiredis rows
    dashed), as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(gaps.items())
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for axis, (cs, by_row) in zip(axes[0], panels, strict=True):
        ours = results.get("contended", {}).get(cs, {}).get(OURS, {})
        ping_us = ours.get("ping_during_us", {}).get(
            "async_p50", next(iter(results["ping"].values()))["async"]["p50_us"]
        )
        for key, values in by_row.items():
            if not values:
                continue
            xs = sorted(ns / 1000 for ns in values)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            library, parser = split_row_key(key)
            axis.step(
                xs,
                ys,
                where="post",
                label=key,
                linewidth=1.4 if library in (OURS, OURS_SYNC) else 1.0,
                linestyle="--" if parser != "python" else "-",
            )
        axis.axvline(3 * ping_us, color="grey", linestyle="--", linewidth=0.8)
        axis.axvline(10 * ping_us, color="grey", linestyle=":", linewidth=0.8)
        axis.set_xscale("symlog", linthresh=max(1.0, ping_us))
        axis.set_xlabel(f"idle gap, µs (lines: 3{TIMES} and 10{TIMES} in-run PING of {OURS})")
        axis.set_ylabel("fraction of grants")
        axis.set_title(f"critical section {cs}")
        axis.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
