"""The ``fifo-floor`` yardstick of ``benchmarks/floor.py``: a fair mutex while
nothing fails, so its figures can stand beside ``FifoLock``'s; and it is kept
out of the workloads it cannot survive.

The contended run is the benchmark's own: 4 processes x 4 asyncio tasks on a
private Redis, every grant recorded with the machine-wide clock and Redis's
ticket; its analysis counts overlaps (a grant before the previous holder called
release) and grants out of ticket order.
"""

from __future__ import annotations

import pytest

from benchmarks.run import parse, run


def test_the_floor_grants_one_holder_at_a_time_in_ticket_order() -> None:
    # run(), not main(): main() also draws the plot, whose matplotlib is in
    # the bench group only.
    results = run(
        parse(
            [
                "--size",
                "smoke",
                "--only",
                "fifo-floor",
                "--workloads",
                "uncontended",
                "contended",
                "--parsers",
                "python",
                "--repeats",
                "1",
                "--contended-seconds",
                "1",
            ]
        )
    )
    for section in ("0ms", "1ms"):
        row = results["contended"][section]["fifo-floor"]
        assert row["grants"] > 100, row["grants"]
        assert row["overlaps"] == 0
        assert row["fifo_violations_ticket_order"] == 0
        assert row["errors"] == []
    assert results["uncontended"]["fifo-floor"]["round_trips"] == 2.0


def test_the_floor_is_refused_in_a_workload_it_cannot_survive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse(["--only", "fifolock", "fifo-floor", "--workloads", "contended", "crash"])
    assert "yardstick fifo-floor runs only the workloads uncontended, contended" in (
        capsys.readouterr().err
    )
    assert parse(["--only", "fifo-floor", "--workloads", "contended"]).only == ["fifo-floor"]
    assert parse([]).only is None  # the default run has no yardstick
