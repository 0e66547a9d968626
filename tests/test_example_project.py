"""The example project's demo, end to end, and the checks it makes.

The end-to-end tests run ``python -m example_project.demo`` as a subprocess with
small sizes: once starting its own Redis server (``REDIS_URL`` unset), once on
the session's server (``REDIS_URL`` set), and once interrupted with SIGINT (as
Ctrl-C does) to prove it stops what it started. The unit tests feed
``example_project.report.verify`` hand-made data, good and bad, to show that
each check passes on good data and fails on the defect it is there to catch.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from redis import Redis

from example_project import report
from example_project.report import Row

ROOT = Path(__file__).resolve().parent.parent
DEMO_TIMEOUT_S = 150.0
"""Seconds one small demo run may take, start-up and shut-down included."""
SMALL = ["--tasks", "30", "--requests", "10", "--command-runs", "2", "--per-command", "3"]
CHECK_NAMES = (
    "operations",
    "count",
    "gap-free",
    "one holder per fence",
    "no overlap",
    "ticket order",
    "numbers follow fences",
    "lock idle",
)


# -- end to end ----------------------------------------------------------------------


def demo_env(marker: str, redis_url: str | None) -> dict[str, str]:
    """The environment for a demo run: ``REDIS_URL`` as given, and a marker
    variable that every process the demo starts inherits."""
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    env["FIFOLOCK_DEMO_TEST"] = marker
    env["PYTHONUNBUFFERED"] = "1"
    return env


def processes_with(marker: str) -> list[int]:
    """Ids of live processes whose environment holds ``FIFOLOCK_DEMO_TEST=marker``."""
    needle = f"FIFOLOCK_DEMO_TEST={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def assert_redis_stopped(output: str) -> None:
    """Assert that the private server the demo reported starting is gone.

    (redis-server rewrites its environment for its process title, so the
    marker cannot find it; its command line names its address instead.)
    """
    found = re.search(r"redis   started \S+ on port (\d+)", output)
    assert found, output
    address = f"127.0.0.1:{found.group(1)}".encode()
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if address in (entry / "cmdline").read_bytes():
                    alive.append(entry.name)
    assert alive == [], f"redis-server on {address.decode()} still running"


@pytest.fixture
def marker() -> Iterator[str]:
    """A fresh marker; fails the test if a process carrying it is still alive."""
    value = uuid.uuid4().hex
    yield value
    deadline = time.monotonic() + 10
    while processes_with(value) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(value) == [], "the demo left processes running"


def run_demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the demo to completion and return its outcome (output as text)."""
    return subprocess.run(
        [sys.executable, "-m", "example_project.demo", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )


def assert_passed(result: subprocess.CompletedProcess[str]) -> None:
    """Assert that the demo exited 0 after printing the table and every check."""
    output = result.stdout
    assert result.returncode == 0, f"{output}\n{result.stderr}"
    assert "source   holds invoices" in output
    for label in ("task", "view", "command", "all"):
        assert f"\n{label} " in output, label
    for name in CHECK_NAMES:
        assert f"PASS  {name}" in output, name
    assert "FAIL" not in output
    assert "RESULT  all checks passed" in output
    assert "stop    done" in output


@pytest.mark.timeout(DEMO_TIMEOUT_S + 30)
def test_demo_starts_its_own_redis_and_passes(marker: str) -> None:
    """With ``REDIS_URL`` unset the demo starts a server and every check passes."""
    result = run_demo(demo_env(marker, None), *SMALL)
    assert_passed(result)
    assert_redis_stopped(result.stdout)
    # 30 tasks + 10 requests + 2 runs x 3 invoices.
    assert "46 invoices stored, 46 reported issued" in result.stdout
    assert "numbers are exactly 1..46" in result.stdout
    # The lock's OpenTelemetry metrics, from the worker's pool processes, the web
    # server and the command runs: one successful wait per task, request and run.
    assert "OpenTelemetry metrics (fifolock.*), all processes" in result.stdout
    assert re.search(r"^celery +\S+ +30 +\d", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^django +invoices +12 +\d", result.stdout, re.MULTILINE), result.stdout


@pytest.mark.timeout(DEMO_TIMEOUT_S + 30)
def test_demo_uses_redis_url_and_cleans_its_queue(
    marker: str, redis_url: str, redis: Redis
) -> None:
    """With ``REDIS_URL`` set the demo uses that server and leaves only the lock's keys."""
    result = run_demo(demo_env(marker, redis_url), *SMALL)
    assert_passed(result)
    assert f"redis   using REDIS_URL={redis_url}" in result.stdout
    leftovers = [
        key.decode()
        for key in redis.scan_iter(count=1000)
        if not key.startswith(b"fifolock:") and key != b"_kombu.binding_deadlines"
    ]
    assert leftovers == []


def ignore_sigint() -> None:
    """Start the child with SIGINT ignored, as a shell starts a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(DEMO_TIMEOUT_S + 30)
def test_demo_stops_everything_on_ctrl_c(marker: str, tmp_path: Path) -> None:
    """SIGINT in the middle of the load: exit 130, and no process left behind.

    The demo is started with SIGINT ignored, the harder case: it must install
    its own handler rather than rely on Python's default one.
    """
    out = tmp_path / "demo.out"
    with out.open("w") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "example_project.demo", "--tasks", "2000"],
            cwd=ROOT,
            env=demo_env(marker, None),
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=ignore_sigint,
        )
    try:
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        while "load " not in out.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, out.read_text()
            time.sleep(0.1)
        assert "load " in out.read_text()
        assert len(processes_with(marker)) >= 3  # redis, worker (+pool), web
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 130, out.read_text()
    finally:
        if demo.poll() is None:  # the test failed: SIGTERM still cleans up
            demo.terminate()
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
    output = out.read_text()
    assert "interrupted (Ctrl-C)" in output
    assert "stop    done" in output
    assert "killed" not in output  # every child stopped on its graceful signal
    assert_redis_stopped(output)


# -- the checks, on hand-made data --------------------------------------------------

MS = 1_000_000
"""Nanoseconds in a millisecond."""


def good_rows() -> list[Row]:
    """Six invoices in five holds: a task, a view, a two-invoice command, two tasks.

    Each hold lasts 2 ms and the next starts 1 ms after; every holder except the
    first was already waiting when the previous hold ended.
    """
    rows = []
    holds = [("task", 101, 1), ("view", 202, 1), ("command", 303, 2), ("task", 104, 1)]
    holds.append(("task", 102, 1))
    number, clock = 1, 1_000 * MS
    for fence, (source, pid, invoices) in enumerate(holds, start=1):
        for _ in range(invoices):
            rows.append(
                Row(
                    number=number,
                    source=source,
                    fence=fence,
                    ticket=fence + 10,
                    pid=pid,
                    entered_ns=clock,
                    exited_ns=clock + 2 * MS,
                    waited_ms=5.0,
                )
            )
            number += 1
            clock += 2 * MS
        clock += 1 * MS
    return rows


def failed(rows: list[Row], expected: int | None = None) -> list[str]:
    """Names of the checks that fail on ``rows``."""
    checks = report.verify(rows, len(rows) if expected is None else expected)
    return [check.name for check in checks if not check.ok]


def test_good_data_passes_every_check() -> None:
    """The reference data is clean: nothing fails."""
    checks = report.verify(good_rows(), 6)
    assert [check.name for check in checks] == list(CHECK_NAMES[1:-1])
    assert all(check.ok for check in checks), checks


def test_count_mismatch_is_caught() -> None:
    """Fewer invoices stored than the callers reported."""
    assert failed(good_rows(), expected=7) == ["count"]


def test_gap_is_caught() -> None:
    """Number 3 missing (4 and 5 shifted up): a gap."""
    rows = [replace(row, number=row.number + 1) if row.number >= 3 else row for row in good_rows()]
    assert "gap-free" in failed(rows)
    detail = next(c.detail for c in report.verify(rows, 6) if c.name == "gap-free")
    assert "missing 3" in detail


def test_duplicate_number_is_caught() -> None:
    """Two holders read the same maximum and both issued 3."""
    rows = good_rows()
    rows[3] = replace(rows[3], number=3)  # the command's second invoice
    assert "gap-free" in failed(rows)
    detail = next(c.detail for c in report.verify(rows, 6) if c.name == "gap-free")
    assert "duplicates 3" in detail


def test_overlapping_holds_are_caught() -> None:
    """The view's hold starts before the first task's hold ended."""
    rows = good_rows()
    first_end = rows[0].exited_ns
    assert first_end is not None
    rows[1] = replace(rows[1], entered_ns=first_end - 1)
    assert failed(rows) == ["no overlap"]


def test_unfinished_hold_is_caught() -> None:
    """A holder that never stamped its exit (it died mid-way)."""
    rows = good_rows()
    rows[0] = replace(rows[0], exited_ns=None)
    assert set(failed(rows)) == {"one holder per fence", "no overlap"}


def test_out_of_order_tickets_are_caught() -> None:
    """A later grant went to an earlier arrival: not FIFO."""
    rows = [replace(row, ticket=5) if row.fence == 4 else row for row in good_rows()]
    assert failed(rows) == ["ticket order"]


def test_shared_fence_is_caught() -> None:
    """Two processes with one fence: e.g. two surfaces on differently named locks."""
    rows = good_rows()
    rows[4] = replace(rows[4], fence=3, ticket=13)  # a task claims the command's fence
    assert "one holder per fence" in failed(rows)


def test_numbers_against_fences_are_caught() -> None:
    """A later grant issued an earlier number: the critical section leaked."""
    rows = good_rows()
    swapped = {1: 2, 2: 1}
    rows = [replace(row, number=swapped.get(row.number, row.number)) for row in rows]
    assert failed(rows) == ["numbers follow fences"]


def test_summary_counts_holds_waits_and_hand_offs() -> None:
    """Per-source holds and invoices; hand-offs 1 ms, counted only for waiting holders."""
    rows = good_rows()
    # The last task asked for the lock after the previous hold ended: no hand-off.
    rows[5] = replace(rows[5], waited_ms=0.5)
    lines = {line.label: line for line in report.summarise(rows)}
    assert list(lines) == ["task", "view", "command", "all"]
    assert (lines["task"].holds, lines["task"].invoices) == (3, 3)
    assert (lines["command"].holds, lines["command"].invoices) == (1, 2)
    assert (lines["all"].holds, lines["all"].invoices) == (5, 6)
    assert lines["all"].handoff_ms == (1.0, 1.0)
    assert lines["task"].wait_ms == (5.0, 5.0)
    # 6 invoices from the first start to the last exit: 6 x 2 ms + 4 x 1 ms.
    assert lines["all"].per_second == pytest.approx(6 / 0.016)
    table = report.format_table(report.summarise(rows))
    assert table.splitlines()[0].split()[:3] == ["source", "holds", "invoices"]
    assert len(table.splitlines()) == 1 + 1 + 4 + 1


def test_percentile_nearest_rank() -> None:
    """p50 and p99 of 1..100 by nearest rank; NaN for nothing."""
    values = [float(v) for v in range(100, 0, -1)]
    assert report.percentile(values, 50) == 50.0
    assert report.percentile(values, 99) == 99.0
    assert report.percentile([7.0], 99) == 7.0
    assert report.percentile([], 50) != report.percentile([], 50)  # NaN
