"""The benchmark's arithmetic and report, on made-up records, and its profiling
tools on a short run: no speed is asserted.

The benchmark itself runs in CI at its smoke size (``.ci/run``); these tests pin
down what its figures mean, that the committed full-run report is complete
and agrees with its JSON, that ``benchmarks.timeline`` still sees a rung
hand-off's hops (a bound of a second only tells a ring from a poll), and that
``benchmarks.server_cost`` counts a grant's scripts.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks import server_cost, timeline
from benchmarks.analysis import TimedHold, fifo_violations, quantile, summarize_contended
from benchmarks.instructions import total_of
from benchmarks.libraries import LIBRARIES, row_key, split_row_key
from benchmarks.report import SCHEMA_VERSION, check, markdown, targets
from benchmarks.workloads import WORKLOADS, handoff_windows

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "benchmarks" / "results" / "full"


def hold(
    contender: int,
    arrival: int,
    acquired: int,
    release: int | None = None,
    released: int | None = None,
    ticket: int | None = None,
) -> TimedHold:
    release = acquired + 1 if release is None else release
    released = release + 2 if released is None else released
    return TimedHold.from_row([contender, arrival, acquired, release, released, ticket, ticket])


def test_a_grant_that_overtakes_an_earlier_arrival_is_one_violation() -> None:
    holds = [hold(0, 0, 10), hold(1, 5, 20), hold(2, 1, 30), hold(3, 6, 40)]
    violations = fifo_violations(holds, lambda h: h.arrival_ns)
    # Contender 1 arrived 4 ns after contender 2 and was served first.
    assert [(h.contender, head_start) for h, head_start in violations] == [(1, 4)]


def test_grants_in_arrival_order_have_no_violation() -> None:
    holds = [hold(i, i, 10 * (i + 1)) for i in range(5)]
    assert fifo_violations(holds, lambda h: h.arrival_ns) == []


def test_every_grant_counts_and_the_idle_gap_runs_from_the_release_call() -> None:
    holds = [
        hold(0, 0, 100, release=110, released=150),
        hold(0, 151, 160, release=170, released=200),  # took it again: a re-acquisition
        hold(1, 1, 190, release=200, released=230),  # learned of it before 0's reply
        hold(2, 2, 260, release=270, released=300),
    ]
    summary = summarize_contended(holds, (0, 1000), ping_ns=20)
    assert summary["grants"] == 4
    assert summary["grants_per_s"] == pytest.approx(4 / 1000e-9)
    assert summary["handoffs"] == 2
    assert summary["reacquisitions"] == 1
    # Release *called* -> next acquire returned, for every consecutive pair.
    gaps = [160 - 110, 190 - 170, 260 - 200]
    assert summary["_gaps_ns"] == gaps
    assert summary["gap_p50_us"] == quantile(gaps, 50) / 1000
    assert summary["gap_p99_ping"] == quantile(gaps, 99) / 20
    # The secondary figure: the gap of the hand-offs to another contender only.
    assert summary["handoff_gap_us"]["p50"] == quantile([20 / 1000, 60 / 1000], 50)
    assert summary["overlaps"] == 0
    assert summary["fifo_violations_call_order"] == 1  # 0's second request overtook 1 and 2
    assert summary["fifo_worst_overtake_ms"] == (151 - 1) / 1e6


def test_the_hold_runs_from_the_acquire_return_to_the_release_call() -> None:
    holds = [
        hold(0, 0, 100, release=130, released=140),
        hold(1, 1, 150, release=160, released=165),
        hold(2, 2, 170, release=240, released=250),
        hold(3, 3, 2000, release=2100),  # outside the window
    ]
    summary = summarize_contended(holds, (0, 1000), ping_ns=1)
    assert summary["hold_us"]["p50"] == 30 / 1000
    assert summary["hold_us"]["p100"] == 70 / 1000
    assert summary["hold_mean_us"] == pytest.approx((30 + 10 + 70) / 3 / 1000)


def test_only_grants_inside_the_window_are_measured() -> None:
    holds = [hold(i % 2, 10 * i, 10 * i + 5) for i in range(10)]
    summary = summarize_contended(holds, (30, 70), ping_ns=1)
    assert summary["grants"] == 4  # acquired at 35, 45, 55, 65
    assert summary["grants_per_s"] == pytest.approx(4 / 40e-9)


def test_a_grant_before_the_previous_release_was_called_is_an_overlap() -> None:
    holds = [hold(0, 0, 10, release=50, released=60), hold(1, 1, 40, release=70)]
    summary = summarize_contended(holds, (0, 100), ping_ns=1)
    assert summary["overlaps"] == 1
    assert summary["_gaps_ns"] == [40 - 50]  # the only way a gap is negative


def test_a_grant_while_a_holder_before_the_previous_one_is_inside_is_an_overlap() -> None:
    """Contender 2 enters after 1 called release, but 0 (before 1) is still inside."""
    holds = [hold(0, 0, 10, release=100), hold(1, 1, 20, release=30), hold(2, 2, 40, release=50)]
    assert summarize_contended(holds, (0, 1000), ping_ns=1)["overlaps"] == 2


def test_fences_that_do_not_rise_with_grant_order_are_counted() -> None:
    holds = [hold(0, 0, 10, ticket=1), hold(1, 1, 20, ticket=3), hold(2, 2, 30, ticket=2)]
    assert summarize_contended(holds, (0, 1000), ping_ns=1)["fence_order_errors"] == 1
    peers = [hold(0, 0, 10), hold(1, 1, 20)]  # no fences: not judged
    assert summarize_contended(peers, (0, 1000), ping_ns=1)["fence_order_errors"] is None


def test_row_keys_name_the_parser() -> None:
    assert row_key("fifolock", "python") == "fifolock"
    assert row_key("fifolock", "hiredis") == "fifolock+hiredis"
    assert split_row_key("redis-py+hiredis") == ("redis-py", "hiredis")
    assert split_row_key("pottery") == ("pottery", "python")


def test_a_hand_off_window_holds_the_commands_between_its_markers() -> None:
    entries = [
        ("EVALSHA abc 1 k", "1.1.1.1:1", "tcp"),  # before: not counted
        ("ECHO m-begin-0", "1.1.1.1:9", "tcp"),
        ("EVALSHA abc 1 k", "1.1.1.1:1", "tcp"),
        ("PUBLISH ch x", "lua:", "lua"),
        ("EVALSHA def 1 k", "1.1.1.1:2", "tcp"),
        ("ECHO m-end-0", "1.1.1.1:8", "tcp"),
        ("SET k v", "1.1.1.1:2", "tcp"),  # after: not counted
    ]
    assert handoff_windows(entries, [("m-begin-0", "m-end-0")]) == [
        [("EVALSHA", "1.1.1.1:1"), ("PUBLISH", "lua:"), ("EVALSHA", "1.1.1.1:2")]
    ]


def test_ticket_order_is_checked_only_for_locks_with_tickets() -> None:
    ours = [hold(0, 0, 10, ticket=2), hold(1, 1, 20, ticket=1)]
    assert summarize_contended(ours, (0, 100), 1)["fifo_violations_ticket_order"] == 1
    theirs = [hold(0, 0, 10), hold(1, 1, 20)]
    assert summarize_contended(theirs, (0, 100), 1)["fifo_violations_ticket_order"] is None


PARSERS = ["python", "hiredis"]


def results_for(keys: list[str]) -> dict[str, Any]:
    """A minimal, well-formed results document for libraries ``keys``, both parsers."""
    rows = [row_key(key, parser) for key in keys for parser in PARSERS]
    contended_row = {
        "grants_per_s": 1000.0,
        "handoffs_per_s": 1000.0,
        "gap_p50_us": 100.0,
        "gap_p99_us": 500.0,
        "gap_p50_ping": 1.0,
        "gap_p99_ping": 5.0,
        "gap_p50_quiet_ping": 2.0,
        "gap_p99_quiet_ping": 9.0,
        "hold_us": {"p50": 1012.0},
        "hold_mean_us": 1234.0,
        "client_cpu_us_per_grant": 300.0,
        "server_cpu_us_per_grant": 100.0,
        "fifo_violations_call_order": 0,
        "fifo_violations_ticket_order": 0,
        "fifo_worst_overtake_ms": 0.0,
        "overlaps": 0,
        "errors": [],
    }
    handoff_case = {"round_trips": 2.0, "commands": {"EVALSHA": 2.0}, "by_side": {}}
    ping = {"async": {"p50_us": 50.0}, "sync": {"p50_us": 30.0}}
    return {
        "schema": SCHEMA_VERSION,
        "parsers": PARSERS,
        "libraries": {key: {"label": key, "kind": "async"} for key in keys},
        "machine": {"cpus": 2, "python": "3.11", "redis_server": "7.0"},
        "ping": {parser: copy.deepcopy(ping) for parser in PARSERS},
        "uncontended": {
            row: {"p50_us": 100.0, "p99_us": 200.0, "p50_ping": 2.0, "round_trips": 2.0}
            for row in rows
        },
        "contended": {cs: {row: dict(contended_row) for row in rows} for cs in ("0ms", "1ms")},
        "handoff": {
            key: {
                "trials": 2,
                "same_process": dict(handoff_case),
                "other_process": dict(handoff_case),
            }
            for key in keys
        },
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
    del broken["contended"]["0ms"]["pottery+hiredis"]
    broken["uncontended"]["fifolock"]["p50_us"] = float("nan")
    broken["idle"]["10000"]["fifolock"]["errors"] = ["ConnectionError: boom"]
    broken["contended"]["1ms"]["fifolock"]["overlaps"] = 2
    del broken["handoff"]["pottery"]["other_process"]
    del broken["ping"]["hiredis"]
    problems = check(broken)
    assert "contended.0ms.pottery+hiredis missing" in problems
    assert "uncontended.fifolock.p50_us is nan" in problems
    assert any("idle.10000.fifolock had errors" in p for p in problems)
    assert "contended.1ms.fifolock: 2 overlapping holds" in problems
    assert "handoff.pottery.other_process.round_trips missing" in problems
    assert "ping.hiredis.async.p50_us missing" in problems


def test_targets_are_judged_from_the_figures() -> None:
    results = results_for(["fifolock", "fifolock-sync", "python-redis-lock"])
    verdicts = {verdict["id"]: verdict["met"] for verdict in targets(results)}
    for row in ("fifolock", "fifolock+hiredis", "fifolock-sync", "fifolock-sync+hiredis"):
        for cs in ("0ms", "1ms"):
            for target in ("gap", "throughput", "fifo"):
                assert verdicts.pop(f"{target}-{row}-{cs}") is True
    assert verdicts == {"idle": True, "round-trips": True}

    rows = results["contended"]["0ms"]
    rows["python-redis-lock+hiredis"]["grants_per_s"] = 1001.0  # compared per parser
    rows["fifolock"]["gap_p99_ping"] = 10.5
    rows["fifolock-sync"]["fifo_violations_ticket_order"] = 1
    results["idle"]["10000"]["fifolock"]["connections_max"] = 5
    verdicts = {verdict["id"]: verdict["met"] for verdict in targets(results)}
    assert verdicts["throughput-fifolock+hiredis-0ms"] is False
    assert verdicts["throughput-fifolock-0ms"] is True
    assert verdicts["gap-fifolock-0ms"] is False
    assert verdicts["gap-fifolock+hiredis-0ms"] is True
    assert verdicts["fifo-fifolock-sync-0ms"] is False
    assert verdicts["idle"] is False


def test_the_report_puts_each_definition_next_to_its_numbers() -> None:
    results = results_for(["fifolock", "python-redis-lock"])
    results.update(
        size="smoke",
        started="2026-01-01T00:00:00+00:00",
        settings={
            "processes": 4,
            "tasks": 4,
            "contended_s": 5.0,
            "contended_warmup_s": 0.5,
            "repeats": 1,
            "idle_s": 30.0,
            "handoff_trials": 2,
        },
    )
    results["machine"].update(platform="linux", redis_py="8.1", load_average_before=[1.0])
    for library in results["libraries"].values():
        library["version"] = "1.0"
    for kinds in results["ping"].values():
        for kind in kinds.values():
            kind["p99_us"] = 99.0
    for row in results["contended"]["0ms"].values():
        row.update(handoff_gap_us={"p50": 1.0, "p99": 2.0}, wait_ms={"p99": 1.0, "p100": 2.0})
    for row in results["contended"]["1ms"].values():
        row.update(handoff_gap_us={"p50": 1.0, "p99": 2.0}, wait_ms={"p99": 1.0, "p100": 2.0})
    for row in results["uncontended"].values():
        row["commands"] = {"EVALSHA": 2.0}
    for key in results["handoff"]:
        for case in ("same_process", "other_process"):
            results["handoff"][key][case]["in_scripts"] = {"PUBLISH": 1.0}
    for row in results["idle"]["10000"].values():
        row.update(script_calls_per_s=0.0, rss_per_waiter_kib=1.0)
    text = markdown(results)
    assert "*called* release" in text and "grants/s" in text
    assert "hold p50 / mean µs" in text and "| 1,012 / 1,234 |" in text
    assert "`fifolock+hiredis`" in text
    assert "## Round trips per hand-off" in text


def test_the_run_knows_every_workload() -> None:
    assert set(WORKLOADS) == {"uncontended", "contended", "handoff", "idle", "crash", "keyspace"}


def test_a_published_full_run_is_complete_and_matches_its_report() -> None:
    if not (PUBLISHED / "results.json").exists():
        pytest.skip("no full run committed under the current definitions yet")
    results = json.loads((PUBLISHED / "results.json").read_text())
    assert results["size"] == "full"
    assert check(results) == []
    assert set(results["libraries"]) == {library.key for library in LIBRARIES}
    assert set(results["idle"]) == {"1000", "10000"}
    assert set(WORKLOADS) <= set(results)
    assert (PUBLISHED / "RESULTS.md").read_text() == markdown(results, png="gap.png")
    assert (PUBLISHED / "gap.png").stat().st_size < 150_000


def test_the_instruction_count_is_read_from_callgrind_s_summary() -> None:
    head = "version: 1\ncmd: python -m benchmarks.instructions\nevents: Ir\nsummary: 4404105124\n"
    assert total_of(head + "fn=(1) main\n12 34\ntotals: 4404105124\n") == 4404105124
    assert total_of("events: Ir\ntotals: 17\n") == 17
    with pytest.raises(RuntimeError, match="no instruction total in cg-out"):
        total_of("events: Ir\nfn=(1) main\n", "cg-out")


def test_the_timeline_stamps_every_hop_of_a_rung_hand_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It runs the lock with its doorbell patched: a patch that no longer fitted
    # the doorbell's signature broke every subscription, and the tool printed
    # 30 s poll waits as the hops of a hand-off.
    timeline.main(["--processes", "2", "--tasks", "2", "--seconds", "2"])
    out = capsys.readouterr().out
    medians_us = {kind: int(us) for kind, us in re.findall(r"^  (\S.*?)\s+(\d+) us", out, re.M)}
    assert set(medians_us) == {*timeline.HOLDER_SIDE, *timeline.WAITER_SIDE, "returned"}, out
    assert medians_us["returned"] < 1_000_000, out


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_server_cost_counts_the_scripts_of_each_grant() -> None:
    instructions, commands = server_cost.per_grant("fifolock", small=10, big=30, processes=2)
    # Each grant is a queued acquire and a release that hands over and rings:
    # some forty commands inside the two scripts (tests/test_script_cost.py
    # pins them down), and far more instructions than commands.
    assert 20 < commands < 80
    assert instructions > 1_000 * commands
