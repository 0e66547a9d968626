"""Core scenarios across real processes, shared by the topology suites.

The cluster and Sentinel suites run the same three attacks as
``tests/test_lock.py`` does on one server, each contender a real process
(``tests.support.contender``) reaching Redis through the topology under test:
FIFO order across processes, mutual exclusion over holds spanning many polls,
and a SIGKILLed holder replaced within one lease. A suite passes the
contender's connection arguments (e.g. ``["--cluster", "--url", url]``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from redis_fifo_lock import FifoLock
from redis_fifo_lock.holds import violations
from tests.support.polling import until
from tests.support.record import Record

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int, *, group: bool = False) -> bool:
    """Whether process ``pid`` (``group``: any process of process group ``pid``)
    still exists; a zombie counts."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True


def group_members(pgid: int) -> list[int]:
    """The process ids of process group ``pgid``, lowest first (Linux: from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) is in parentheses and may hold spaces.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid:  # fields: state, ppid, pgrp, ...
            members.append(int(stat.parent.name))
    return sorted(members)


def contender(connection: Sequence[str], record: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``tests.support.contender`` with ``connection`` arguments; read its
    stdout lines (``granted`` / ``queued ...``)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.contender",
            *connection,
            "--record",
            str(record),
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def first_line(proc: subprocess.Popen[str]) -> str:
    """The contender's first stdout line, read without blocking the event loop."""
    assert proc.stdout is not None
    return await asyncio.to_thread(proc.stdout.readline)


async def entered(record: Path) -> bool:
    """Whether a hold was entered in ``record`` (written by another process)."""
    text = await asyncio.to_thread(lambda: record.read_text() if record.exists() else "")
    return "enter" in text


async def served_in_arrival_order(
    gate: FifoLock, connection: Sequence[str], record_path: Path, processes: int
) -> None:
    """While ``gate`` holds the lock "fifo", queue ``processes`` contenders one
    after another; once released, they must hold it in that order."""
    record = Record(record_path)
    gate_lease = await gate.acquire()
    record.enter(gate_lease, "gate")
    arrivals = []
    for i in range(processes):
        proc = contender(
            connection, record_path, "--name", gate.name, "--hold-ms", "10", "--who", str(i)
        )
        arrivals.append(proc)
        assert (await first_line(proc)).startswith("queued")
    record.exit(gate_lease)
    await gate.release(gate_lease)
    codes = await asyncio.gather(*(asyncio.to_thread(proc.wait, 30) for proc in arrivals))
    assert codes == [0] * len(arrivals)
    holds = record.holds()
    assert [hold.who for hold in holds] == ["gate", *map(str, range(len(arrivals)))]
    assert violations(holds) == []


async def never_overlap(connection: Sequence[str], record: Path, poll_ms: int) -> None:
    """3 processes x 2 tasks x 3 rounds; each hold lasts 3 polls of the waiters."""
    options = ["--name", "excl", "--poll-ms", str(poll_ms), "--hold-ms", str(3 * poll_ms)]
    procs = [
        contender(connection, record, *options, "--tasks", "2", "--rounds", "3", "--who", f"p{i}")
        for i in range(3)
    ]
    codes = await asyncio.gather(*(asyncio.to_thread(proc.wait, 60) for proc in procs))
    assert codes == [0, 0, 0]
    holds = Record(record).holds()
    assert len(holds) == 18
    assert violations(holds) == []


async def killed_holder_replaced(connection: Sequence[str], record: Path) -> None:
    """SIGKILL a holder: a queued process must hold next, with a higher fence,
    within one lease (1000 ms) plus one poll (200 ms) and some slack."""
    common = ["--name", "crash", "--lease-ms", "1000", "--poll-ms", "200"]
    victim = contender(connection, record, *common, "--hold-ms", "60000", "--who", "victim")
    assert (await first_line(victim)).strip() == "granted"
    heir = contender(connection, record, *common, "--hold-ms", "1", "--who", "heir")
    assert (await first_line(heir)).startswith("queued")
    # The victim printed "granted" before entering: wait for its entry line.
    await until(lambda: entered(record), "the victim entered")
    killed_at = time.monotonic_ns()
    victim.send_signal(signal.SIGKILL)
    await asyncio.to_thread(victim.wait)
    assert await asyncio.to_thread(heir.wait, 10) == 0
    holds = Record(record).holds()
    dead, new = holds
    assert (dead.who, new.who) == ("victim", "heir")
    assert new.fence > dead.fence
    assert violations(holds, allow_open=True) == []
    waited_ms = (new.entered_ns - killed_at) / 1e6
    assert waited_ms < 1000 + 200 + 300, waited_ms
