"""The benchmark's arithmetic and report, on made-up records: no timing is asserted.

The benchmark itself runs in CI at its smoke size (``.ci/run``); these tests pin
down what its figures mean, and that the committed full-run report is complete
and agrees with its JSON.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.analysis import Hold, fifo_violations, quantile, summarize_contended
from benchmarks.libraries import LIBRARIES
from benchmarks.report import SCHEMA_VERSION, check, markdown, targets

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "benchmarks" / "results" / "full"


def hold(
    contender: int,
    arrival: int,
    acquired: int,
    release: int | None = None,
    released: int | None = None,
    ticket: int | None = None,
) -> Hold:
    release = acquired + 1 if release is None else release
    released = release + 2 if released is None else released
    return Hold(contender, arrival, acquired, release, released, ticket, ticket)


def test_a_grant_that_overtakes_an_earlier_arrival_is_one_violation() -> None:
    holds = [hold(0, 0, 10), hold(1, 5, 20), hold(2, 1, 30), hold(3, 6, 40)]
    violations = fifo_violations(holds, lambda h: h.arrival_ns)
    # Contender 1 arrived 4 ns after contender 2 and was served first.
    assert [(h.contender, head_start) for h, head_start in violations] == [(1, 4)]


def test_grants_in_arrival_order_have_no_violation() -> None:
    holds = [hold(i, i, 10 * (i + 1)) for i in range(5)]
    assert fifo_violations(holds, lambda h: h.arrival_ns) == []


def test_hand_offs_pair_grants_to_different_contenders_and_skip_reacquisitions() -> None:
    holds = [
        hold(0, 0, 100, release=110, released=150),
        hold(0, 151, 160, release=170, released=200),  # took it again: not a hand-off
        hold(1, 1, 190, release=200, released=230),  # learned of it before 0's reply
        hold(2, 2, 260, release=270, released=300),
    ]
    summary = summarize_contended(holds, (0, 1000), ping_ns=20)
    assert summary["grants"] == 4
    assert summary["handoffs"] == 2
    assert summary["reacquisitions"] == 1
    assert summary["_latencies_ns"] == [190 - 200, 260 - 230]
    assert summary["handoff_p50_ping"] == quantile([-10, 30], 50) / 20
    assert summary["overlaps"] == 0
    assert summary["fifo_violations_call_order"] == 1  # 0's second request overtook 1 and 2
    assert summary["fifo_worst_overtake_ms"] == (151 - 1) / 1e6


def test_only_grants_inside_the_window_are_measured() -> None:
    holds = [hold(i % 2, 10 * i, 10 * i + 5) for i in range(10)]
    summary = summarize_contended(holds, (30, 70), ping_ns=1)
    assert summary["grants"] == 4  # acquired at 35, 45, 55, 65
    assert summary["grants_per_s"] == pytest.approx(4 / 40e-9)


def test_a_grant_before_the_previous_release_began_is_an_overlap() -> None:
    holds = [hold(0, 0, 10, release=50, released=60), hold(1, 1, 40, release=70)]
    assert summarize_contended(holds, (0, 100), ping_ns=1)["overlaps"] == 1


def test_ticket_order_is_checked_only_for_locks_with_tickets() -> None:
    ours = [hold(0, 0, 10, ticket=2), hold(1, 1, 20, ticket=1)]
    assert summarize_contended(ours, (0, 100), 1)["fifo_violations_ticket_order"] == 1
    theirs = [hold(0, 0, 10), hold(1, 1, 20)]
    assert summarize_contended(theirs, (0, 100), 1)["fifo_violations_ticket_order"] is None


def results_for(keys: list[str]) -> dict[str, Any]:
    """A minimal, well-formed results document for libraries ``keys``."""
    contended_row = {
        "grants_per_s": 1000.0,
        "handoffs_per_s": 1000.0,
        "handoff_p50_ping": 1.0,
        "handoff_p99_ping": 5.0,
        "handoff_p50_quiet_ping": 2.0,
        "handoff_p99_quiet_ping": 9.0,
        "fifo_violations_call_order": 0,
        "fifo_violations_ticket_order": 0,
        "fifo_worst_overtake_ms": 0.0,
        "overlaps": 0,
        "errors": [],
    }
    return {
        "schema": SCHEMA_VERSION,
        "libraries": {key: {"label": key, "kind": "async"} for key in keys},
        "machine": {"cpus": 2, "python": "3.11", "redis_server": "7.0"},
        "ping": {"async": {"p50_us": 50.0}, "sync": {"p50_us": 30.0}},
        "uncontended": {
            key: {"p50_us": 100.0, "p99_us": 200.0, "p50_ping": 2.0, "round_trips": 2.0}
            for key in keys
        },
        "contended": {"0ms": {key: dict(contended_row) for key in keys}},
        "idle": {
            "10000": {
                key: {
                    "commands_per_s": 1.0,
                    "connections_max": 4,
                    "rss_mib": 90.0,
                    "window_s": 30.0,
                    "errors": [],
                }
                for key in keys
            }
        },
    }


def test_a_well_formed_results_document_passes_the_check() -> None:
    assert check(results_for(["fifolock", "python-redis-lock"])) == []


def test_the_check_names_missing_figures_errors_and_overlaps() -> None:
    results = results_for(["fifolock", "pottery"])
    broken = copy.deepcopy(results)
    del broken["contended"]["0ms"]["pottery"]
    broken["uncontended"]["fifolock"]["p50_us"] = float("nan")
    broken["idle"]["10000"]["fifolock"]["errors"] = ["ConnectionError: boom"]
    broken["contended"]["0ms"]["fifolock"]["overlaps"] = 2
    problems = check(broken)
    assert "contended.0ms.pottery missing" in problems
    assert "uncontended.fifolock.p50_us is nan" in problems
    assert any("idle.10000.fifolock had errors" in p for p in problems)
    assert "contended.0ms.fifolock: 2 overlapping holds" in problems


def test_targets_are_judged_from_the_figures() -> None:
    results = results_for(["fifolock", "python-redis-lock", "redis-py"])
    peers = results["contended"]["0ms"]
    peers["python-redis-lock"]["handoffs_per_s"] = 999.0
    peers["redis-py"]["handoffs_per_s"] = 100.0
    verdicts = {verdict["id"]: verdict["met"] for verdict in targets(results)}
    assert verdicts == {
        "handoff-0ms": True,
        "handoff-quiet-0ms": True,
        "throughput-0ms": True,
        "fifo-0ms": True,
        "idle": True,
        "round-trips": True,
    }
    peers["redis-py"]["handoffs_per_s"] = 101.0  # ours is then below 10x
    peers["fifolock"]["handoff_p99_quiet_ping"] = 10.5
    results["idle"]["10000"]["fifolock"]["connections_max"] = 5
    verdicts = {verdict["id"]: verdict["met"] for verdict in targets(results)}
    assert verdicts["throughput-0ms"] is False
    assert verdicts["handoff-quiet-0ms"] is False and verdicts["handoff-0ms"] is True
    assert verdicts["idle"] is False


def test_the_published_full_run_is_complete_and_matches_its_report() -> None:
    results = json.loads((PUBLISHED / "results.json").read_text())
    assert results["size"] == "full"
    assert check(results) == []
    assert set(results["libraries"]) == {library.key for library in LIBRARIES}
    assert set(results["idle"]) == {"1000", "10000"}
    assert (PUBLISHED / "RESULTS.md").read_text() == markdown(results, png="handoff.png")
    assert (PUBLISHED / "handoff.png").stat().st_size < 150_000
