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


def write_eviction_run(run_dir: Path, evicted: str) -> list[str]:
    """Write a run in which ``b`` and then ``c`` queue behind ``a``; an eviction of
    the keys ``evicted`` hits at 100 ms, after ``a`` left; ``b``, its place lost,
    queues again and is granted a newer ticket while ``c``'s older one waits;
    return the checker's violations."""
    lines = [
        "request 0 1 a -1 a",
        f"queued {1 * MS} 1 a 100 1",
        f"enter {2 * MS} 1 a 100 100 a",
        f"request {3 * MS} 2 b -1 b",
        f"queued {4 * MS} 2 b 101 0",
        f"request {5 * MS} 3 c -1 c",
        f"queued {6 * MS} 3 c 102 0",
        f"exit {90 * MS} 1 a 0",
        f"release {91 * MS} 1 a ok",
        f"queued {150 * MS} 2 b 105 1",
        f"enter {151 * MS} 2 b 105 105 b",
        f"exit {160 * MS} 2 b 0",
        f"release {161 * MS} 2 b ok",
        f"queued {170 * MS} 3 c 106 1",
        f"enter {171 * MS} 3 c 106 106 c",
        f"exit {180 * MS} 3 c 0",
        f"release {181 * MS} 3 c ok",
    ]
    (run_dir / "lock.rec").write_text("\n".join(lines) + "\n")
    (run_dir / "faults.rec").write_text(f"fault {100 * MS} 9 evict {evicted}\n")
    return check(run_dir, learn_ms=LEARN_MS, renew_ms=RENEW_MS).violations


def test_an_eviction_that_may_take_the_queue_excuses_a_waiter_s_lost_place(
    tmp_path: Path,
) -> None:
    """An eviction names, when it starts, every key it may take: the waiters
    react while it is still going on, so a deletion recorded after it came too
    late (a CI run of lease-evicted saw that, with every key of the lock gone)."""
    found = write_eviction_run(tmp_path, "queue,waiters,alive,lease,counters,finished")
    assert not [finding for finding in found if finding.startswith("FIFO on")], found


def test_an_eviction_of_the_lease_alone_excuses_no_reordered_queue(tmp_path: Path) -> None:
    found = write_eviction_run(tmp_path, "lease")
    assert any(finding.startswith("FIFO on 'lock'") for finding in found), found
