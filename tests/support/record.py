"""A shared record of who was inside a critical section, and its checker.

The record is an append-only file, independent of the lock's own keys: each
holder appends one line on entry and one on exit, written with ``O_APPEND`` in
a single ``write`` so lines from many processes never interleave. The entry is
written after ``acquire`` returned and the exit before ``release`` is called,
so the recorded spans sit inside the real holds. ``time.monotonic_ns()`` is the
system-wide monotonic clock on Linux, comparable across processes of one
machine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from redis_fifo_lock import Lease


class Record:
    """Appends enter/exit lines for leases to ``path``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _append(self, line: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def enter(self, lease: Lease, who: str = "") -> None:
        """Record that ``lease``'s holder entered the critical section."""
        self._append(
            f"enter {time.monotonic_ns()} {os.getpid()} {lease.token} {lease.ticket} "
            f"{lease.fence} {who or '-'}\n"
        )

    def exit(self, lease: Lease) -> None:
        """Record that ``lease``'s holder is leaving (before release)."""
        lost = 1 if lease.lost else 0
        self._append(f"exit {time.monotonic_ns()} {os.getpid()} {lease.token} {lost}\n")

    def holds(self) -> list[Hold]:
        """The holds read back, in order of entry."""
        return read_holds(self.path)


@dataclass
class Hold:
    """One recorded hold."""

    token: str
    pid: int
    ticket: int
    fence: int
    who: str
    entered_ns: int
    exited_ns: int | None = None
    lost: bool = False


def read_holds(path: Path) -> list[Hold]:
    """Parse the record at ``path`` into holds sorted by entry time."""
    holds: dict[str, Hold] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        kind, stamp, pid, token, *rest = line.split(" ")
        if kind == "enter":
            ticket, fence, who = rest
            holds[token] = Hold(token, int(pid), int(ticket), int(fence), who, int(stamp))
        else:
            holds[token].exited_ns = int(stamp)
            holds[token].lost = rest[0] == "1"
    return sorted(holds.values(), key=lambda hold: hold.entered_ns)


def violations(holds: list[Hold], *, allow_open: bool = False) -> list[str]:
    """Everything wrong with ``holds``; an empty list means the lock held.

    Checks: never two inside at once (a hold whose lease was marked lost may
    overlap the next one: the lock told it so); fences strictly increase in
    entry order; tickets increase in entry order (grants in arrival order);
    every hold was exited (unless ``allow_open``, for holders that were killed).
    """
    found: list[str] = []
    previous: Hold | None = None
    latest_exit: Hold | None = None  # among exited holds, the one that left last
    for hold in holds:
        if hold.exited_ns is None and not allow_open:
            found.append(f"hold fence={hold.fence} pid={hold.pid} never exited")
        if previous is not None:
            if hold.fence <= previous.fence:
                found.append(f"fence {hold.fence} entered after fence {previous.fence}")
            if hold.ticket <= previous.ticket:
                found.append(f"ticket {hold.ticket} granted after ticket {previous.ticket}")
        last = latest_exit
        if (
            last is not None
            and last.exited_ns is not None
            and last.exited_ns > hold.entered_ns
            and not last.lost
        ):
            found.append(
                f"overlap: fence {hold.fence} (pid {hold.pid}) entered while fence "
                f"{last.fence} (pid {last.pid}) was inside"
            )
        if hold.exited_ns is not None and (
            last is None or last.exited_ns is None or hold.exited_ns > last.exited_ns
        ):
            latest_exit = hold
        previous = hold
    return found
