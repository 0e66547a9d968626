"""Turn benchmark results into the targets' verdicts, a Markdown report, a PNG,
and check that a results file has the expected shape (``check``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

TIMES = "\u00d7"
"""The multiplication sign, for ratios in the report."""

OURS = "fifolock"
"""The library the targets are judged on: the asyncio core."""

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
    when the run did not measure what the target needs)."""
    verdicts = []
    contended = results.get("contended", {})
    for cs, by_lib in contended.items():
        ours = by_lib.get(OURS)
        if ours is None:
            continue
        for suffix, baseline in (
            ("", "PING timed during the same run"),
            ("_quiet", "PING timed on the quiet server before the run"),
        ):
            p50 = ours.get(f"handoff_p50{suffix}_ping")
            p99 = ours.get(f"handoff_p99{suffix}_ping")
            verdicts.append(
                _target(
                    f"handoff{suffix.replace('_', '-')}-{cs}",
                    f"hand-off p50 <= 3 x PING and p99 <= 10 x PING ({cs} critical "
                    f"section; {baseline})",
                    None if p50 is None or p99 is None else p50 <= 3 and p99 <= 10,
                    f"p50 {_fmt(p50, 2)} x, p99 {_fmt(p99, 2)} x",
                )
            )
        rate = ours["handoffs_per_s"]
        checks, parts = [], []
        prl = by_lib.get("python-redis-lock")
        if prl is not None:
            checks.append(rate >= prl["handoffs_per_s"])
            parts.append(f"python-redis-lock {_fmt(prl['handoffs_per_s'])}")
        for peer in ("redis-py", "redis-py-async"):
            if peer in by_lib:
                checks.append(rate >= 10 * by_lib[peer]["handoffs_per_s"])
                parts.append(f"10 x {peer} {_fmt(10 * by_lib[peer]['handoffs_per_s'])}")
        verdicts.append(
            _target(
                f"throughput-{cs}",
                f"hand-offs/s >= python-redis-lock's and >= 10 x redis-py Lock's ({cs})",
                all(checks) if checks else None,
                f"ours {_fmt(rate)}/s vs " + ", ".join(parts) if parts else "no peers run",
            )
        )
        ours_rows = {key: by_lib[key] for key in (OURS, "fifolock-sync") if key in by_lib}
        by_ticket = [row.get("fifo_violations_ticket_order") for row in ours_rows.values()]
        by_call = ", ".join(
            f"{key} {row['fifo_violations_call_order']} (worst overtake "
            f"{_fmt(row.get('fifo_worst_overtake_ms'), 2)} ms)"
            for key, row in ours_rows.items()
        )
        peers = ", ".join(
            f"{key} {by_lib[key]['fifo_violations_call_order']} (worst overtake "
            f"{_fmt(by_lib[key].get('fifo_worst_overtake_ms'), 0)} ms)"
            for key in PEERS
            if key in by_lib
        )
        verdicts.append(
            _target(
                f"fifo-{cs}",
                f"0 FIFO violations for ours, against arrival at Redis (ticket order) ({cs})",
                all(v == 0 for v in by_ticket) if by_ticket else None,
                f"by ticket: {by_ticket}; by call order: {by_call}; "
                f"peers by call order: {peers or 'not run'}",
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
        key: uncontended[key]["round_trips"]
        for key in (OURS, "fifolock-sync")
        if key in uncontended
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
        "handoffs_per_s",
        "handoff_p50_ping",
        "handoff_p99_ping",
        "fifo_violations_call_order",
        "overlaps",
    ),
    "idle": ("commands_per_s", "connections_max", "rss_mib", "window_s"),
    "crash": ("lease_ms", "kill_to_grant_ms_p50", "kill_to_grant_ms_max"),
}


def check(results: dict[str, Any]) -> list[str]:
    """Problems with the shape of ``results`` (empty when it is well formed).

    Checks the version, the machine and PING sections, that every workload
    reports every library with finite numbers for its required figures, and
    that no mutual-exclusion overlap or worker error was recorded.
    """
    problems: list[str] = []
    if results.get("schema") != SCHEMA_VERSION:
        problems.append(f"schema is {results.get('schema')!r}, expected {SCHEMA_VERSION}")
    libraries = results.get("libraries")
    if not isinstance(libraries, dict) or not libraries:
        return [*problems, "no libraries"]
    for field in ("cpus", "python", "redis_server"):
        if field not in results.get("machine", {}):
            problems.append(f"machine.{field} missing")
    for kind in ("async", "sync"):
        if not _number(results.get("ping", {}).get(kind, {}).get("p50_us")):
            problems.append(f"ping.{kind}.p50_us missing")

    def check_libs(where: str, by_lib: Any, fields: tuple[str, ...]) -> None:
        if not isinstance(by_lib, dict):
            problems.append(f"{where} is not a mapping")
            return
        for key in libraries:
            row = by_lib.get(key)
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

    for workload, fields in REQUIRED.items():
        if workload not in results:
            continue
        section = results[workload]
        if workload in ("contended", "idle"):
            if not isinstance(section, dict) or not section:
                problems.append(f"{workload} is empty")
                continue
            for sub, by_lib in section.items():
                check_libs(f"{workload}.{sub}", by_lib, fields)
        else:
            check_libs(workload, section, fields)
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
        f"PING round trip p50 (p99): asyncio client {_fmt(ping['async']['p50_us'])} µs "
        f"({_fmt(ping['async']['p99_us'])} µs), sync client {_fmt(ping['sync']['p50_us'])} µs "
        f"({_fmt(ping['sync']['p99_us'])} µs). "
        "Ratios divide by a PING p50 of the same kind of client as the library's: "
        "for the uncontended figures, this quiet one; for the contended ones, the PING "
        "timed by a separate light process during the same measured window (the quiet "
        "ratios are shown too).",
    ]
    if "ping_after" in results:
        after = results["ping_after"]
        lines[-1] += (
            f" Measured again at the end: {_fmt(after['async']['p50_us'])} µs and "
            f"{_fmt(after['sync']['p50_us'])} µs."
        )

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
            f"tasks; threads for sync libraries), {settings['contended_s']:g} s measured "
            f"after {settings['contended_warmup_s']:g} s of warm-up, {settings['repeats']} "
            "repeat(s): medians of the repeats; counts are summed. Hand-off: consecutive "
            "grants to different contenders, latency = release returned → next holder's "
            "acquire returned (negative when the next holder learns first). Re-acq: "
            "grants to the contender that held the lock just before. FIFO violations: "
            "grants made while an earlier arrival still waited — arrival = when the "
            "acquire call began (call), or our ticket from Redis (ticket); worst "
            "overtake: the largest head start an overtaken call had. Overlaps: "
            "mutual-exclusion failures seen by the clients. PING µs: the p50 timed "
            "during the run, the unit of the first ratio column.",
        ]

        def kind(key: str) -> str:
            return str(libs.get(key, {}).get("kind", "async"))

        for cs, by_lib in results["contended"].items():
            lines += ["", f"### Critical section {cs}", ""]
            rows = []
            for key, row in by_lib.items():
                hand = row["handoff_us"]
                rows.append(
                    [
                        f"`{key}`",
                        f"{_fmt(row['handoff_p50_ping'], 2)} / {_fmt(row['handoff_p99_ping'], 2)}",
                        f"{_fmt(row.get('handoff_p50_quiet_ping'), 2)} / "
                        f"{_fmt(row.get('handoff_p99_quiet_ping'), 2)}",
                        f"{_fmt(hand.get('p50'), 0)} / {_fmt(hand.get('p99'), 0)}",
                        _fmt(row.get("ping_during_us", {}).get(f"{kind(key)}_p50"), 0),
                        _fmt(row["handoffs_per_s"], 0),
                        _fmt(row["grants_per_s"], 0),
                        _fmt(100 * row["reacquisitions"] / max(1, row["grants"]), 0),
                        f"{row['fifo_violations_call_order']}"
                        + (
                            f" / {row['fifo_violations_ticket_order']}"
                            if row.get("fifo_violations_ticket_order") is not None
                            else ""
                        ),
                        _fmt(row.get("fifo_worst_overtake_ms"), 2),
                        f"{_fmt(row['wait_ms'].get('p99'), 1)} / "
                        f"{_fmt(row['wait_ms'].get('p100'), 1)}",
                        str(row["overlaps"]),
                    ]
                )
            lines += _table(
                [
                    "library",
                    f"hand-off p50 / p99 {TIMES} PING",
                    f"{TIMES} quiet PING",
                    "hand-off p50 / p99 µs",
                    "PING µs",
                    "hand-offs/s",
                    "grants/s",
                    "re-acq %",
                    "FIFO violations call (/ ticket)",
                    "worst overtake ms",
                    "wait p99 / max ms",
                    "overlaps",
                ],
                rows,
            )
        if png:
            lines += ["", f"![hand-off latency distributions]({png})"]

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


def plot(results: dict[str, Any], latencies: dict[str, dict[str, list[int]]], path: Path) -> None:
    """Hand-off latency distributions (one panel per critical section), as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(latencies.items())
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for axis, (cs, by_lib) in zip(axes[0], panels, strict=True):
        ours = results.get("contended", {}).get(cs, {}).get(OURS, {})
        ping_us = ours.get("ping_during_us", {}).get(
            "async_p50", results["ping"]["async"]["p50_us"]
        )
        for key, values in by_lib.items():
            if not values:
                continue
            xs = sorted(ns / 1000 for ns in values)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            axis.step(xs, ys, where="post", label=key, linewidth=1.4 if key == OURS else 1.0)
        axis.axvline(3 * ping_us, color="grey", linestyle="--", linewidth=0.8)
        axis.axvline(10 * ping_us, color="grey", linestyle=":", linewidth=0.8)
        axis.set_xscale("symlog", linthresh=max(1.0, ping_us))
        axis.set_xlabel(f"hand-off latency, µs (lines: 3{TIMES} and 10{TIMES} PING)")
        axis.set_ylabel("fraction of hand-offs")
        axis.set_title(f"critical section {cs}")
        axis.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
