"""The checker's reading of one overlap the lock cannot prevent, on made-up records.

A restart that loses every key lets a waiter in while the holder's own clock
still says it holds; the holder learns at its next call to Redis. If its hold
ends before its next renewal, that call is its release, and ``LeaseLost`` there
is the loud failure. A CI run saw exactly that and called it a violation; these
records pin where the excuse ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adversarial.checker import check

pytestmark = pytest.mark.adversarial

MS = 1_000_000
LEARN_MS = 900
RENEW_MS = 333


def write_run(run_dir: Path, *, fault: str, holder_exit_ms: int, holder_release: str) -> list[str]:
    """Write a run in which ``a`` holds, ``fault`` hits at 100 ms (a restart is
    back at 400 ms), ``b`` enters at 460 ms, and ``a`` leaves at
    ``holder_exit_ms``; return the checker's violations."""
    lines = [
        "request 0 1 a -1 a",
        f"queued {1 * MS} 1 a 100 1",
        f"enter {2 * MS} 1 a 100 100 a",
        f"request {10 * MS} 2 b -1 b",
        f"queued {11 * MS} 2 b 101 0",
        f"queued {450 * MS} 2 b 500 1",
        f"enter {460 * MS} 2 b 500 500 b",
        f"exit {470 * MS} 2 b 0",
        f"release {471 * MS} 2 b ok",
        f"exit {holder_exit_ms * MS} 1 a 0",
        f"release {(holder_exit_ms + 120) * MS} 1 a {holder_release}",
    ]
    if holder_release == "leaselost":
        lines.append(f"lost {(holder_exit_ms + 120) * MS} 1 a")
    faults = (
        [f"fault {100 * MS} 9 restart 1", f"fault {400 * MS} 9 restarted 1"]
        if fault == "restart"
        else [f"fault {100 * MS} 9 pause 300ms"]
    )
    (run_dir / "lock.rec").write_text("\n".join(lines) + "\n")
    (run_dir / "faults.rec").write_text("\n".join(faults) + "\n")
    return check(run_dir, learn_ms=LEARN_MS, renew_ms=RENEW_MS).violations


def test_a_holder_that_left_before_its_next_renewal_may_learn_at_release(
    tmp_path: Path,
) -> None:
    assert (
        write_run(tmp_path, fault="restart", holder_exit_ms=480, holder_release="leaselost") == []
    )


@pytest.mark.parametrize(
    ("fault", "holder_exit_ms", "holder_release"),
    [
        ("restart", 480, "ok"),  # never told at all
        ("restart", 800, "leaselost"),  # stayed past its next renewal, told only at release
        ("pause", 480, "leaselost"),  # a paused server forgets nothing: the holder's clock knows
    ],
)
def test_other_overlaps_stay_violations(
    tmp_path: Path, fault: str, holder_exit_ms: int, holder_release: str
) -> None:
    found = write_run(
        tmp_path, fault=fault, holder_exit_ms=holder_exit_ms, holder_release=holder_release
    )
    assert any(finding.startswith("overlap on 'lock'") for finding in found), found
