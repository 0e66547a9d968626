"""A shared record of who was inside a critical section, and its checker.

The record is an append-only file, independent of the lock's own keys: each
holder appends one line on entry and one on exit, written with ``O_APPEND`` in
a single ``write`` so lines from many processes never interleave. The entry is
written after ``acquire`` returned and the exit before ``release`` is called,
so the recorded spans sit inside the real holds. ``time.monotonic_ns()`` is the
system-wide monotonic clock on Linux, comparable across processes of one
machine.

Every line is ``<kind> <monotonic ns> <pid> <fields...>``, fields separated by
single spaces. ``enter`` and ``exit`` are all that ``holds()`` and
``violations()`` need; the other kinds let a richer checker (the adversarial
suite's, ``tests/adversarial/checker.py``) follow a request from start to end:

========  ==============================  =====================================
kind      fields after the pid            written
========  ==============================  =====================================
enter     token ticket fence who          after ``acquire`` returned the lease
exit      token lost(0/1)                 before ``release`` is called
request   token timeout_ms(-1: none) who  before ``acquire`` is called
queued    token ticket granted(0/1)       when the acquire script replied
cancel    token                           before the acquire task is cancelled
gaveup    token reason                    ``acquire`` ended without a lease
lost      token                           when ``lease.lost`` was seen set
release   token outcome                   after ``release`` returned or raised
fault     kind detail                     a fault was injected (or observed)
========  ==============================  =====================================
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from redis_fifo_lock import Lease


class Record:
    """Appends lines about leases and requests to ``path``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _append(self, line: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def _line(self, kind: str, *fields: object) -> None:
        """Append one ``kind`` line stamped now, in this process."""
        words = " ".join(str(word) for word in fields)
        self._append(f"{kind} {time.monotonic_ns()} {os.getpid()} {words}\n")

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

    def request(self, token: str, timeout_s: float | None, who: str = "") -> None:
        """Record that ``acquire(timeout_s, token=token)`` is about to be called."""
        timeout_ms = -1 if timeout_s is None else round(timeout_s * 1000)
        self._line("request", token, timeout_ms, who or "-")

    def queued(self, token: str, ticket: int, granted: bool) -> None:
        """Record the acquire script's reply for ``token``: its ticket, granted or not."""
        self._line("queued", token, ticket, 1 if granted else 0)

    def cancel(self, token: str) -> None:
        """Record that the acquire of ``token`` is about to be cancelled."""
        self._line("cancel", token)

    def gave_up(self, token: str, reason: str) -> None:
        """Record that the acquire of ``token`` ended without a lease (one word why)."""
        self._line("gaveup", token, "_".join(reason.split()) or "-")

    def lost(self, lease: Lease) -> None:
        """Record that ``lease.lost`` was seen set."""
        self._line("lost", lease.token)

    def released(self, lease: Lease, outcome: str) -> None:
        """Record how ``release`` ended: ``ok``, ``leaselost`` or an error name."""
        self._line("release", lease.token, "_".join(outcome.split()) or "-")

    def fault(self, kind: str, detail: object = "-") -> None:
        """Record a fault of ``kind`` (one word) aimed at ``detail`` (one word)."""
        self._line("fault", kind, "_".join(str(detail).split()) or "-")

    def holds(self) -> list[Hold]:
        """The holds read back, in order of entry."""
        return read_holds(self.path)

    def lines(self) -> list[Line]:
        """Every complete line read back, in file order."""
        return read_lines(self.path)


@dataclass
class Line:
    """One parsed line of a record."""

    kind: str
    ns: int
    pid: int
    fields: list[str] = field(default_factory=list)


def read_lines(path: Path) -> list[Line]:
    """Parse every complete line of the record at ``path`` (a missing file is empty).

    A line still being written by another process (no newline yet) is skipped.
    """
    if not path.exists():
        return []
    text = path.read_text()
    complete = text.split("\n")[:-1]  # the last piece is "" or an unfinished line
    parsed = []
    for raw in complete:
        kind, stamp, pid, *fields = raw.split(" ")
        parsed.append(Line(kind, int(stamp), int(pid), fields))
    return parsed


@dataclass
class Hold:
    """One hold of a lock, as its holder recorded it: the record of every test
    that judges exclusion (this file's record, the Celery tasks' record).

    Attributes:
        fence: the lease's fence (int).
        ticket: the lease's ticket (int): its place in arrival order.
        entered_ns: ``time.monotonic_ns()`` just after ``acquire`` returned.
        exited_ns: ``time.monotonic_ns()`` just before ``release`` was called;
            None while inside, or when the holder was killed inside.
        lost: whether the lock told the holder its lease was lost (such a hold
            may overlap the next one).
        who: who held it (str, free text), default "".
        pid: the holder's process id (int), default 0 (not recorded).
        token: the lease's token (str), default "".
    """

    fence: int
    ticket: int
    entered_ns: int
    exited_ns: int | None = None
    lost: bool = False
    who: str = ""
    pid: int = 0
    token: str = ""

    def overlaps(self, other: Hold) -> bool:
        """Whether the two holds were inside at one moment (an open hold lasts for ever)."""
        self_end = self.exited_ns if self.exited_ns is not None else float("inf")
        other_end = other.exited_ns if other.exited_ns is not None else float("inf")
        return self.entered_ns < other_end and other.entered_ns < self_end


def read_holds(path: Path) -> list[Hold]:
    """Parse the record at ``path`` into holds sorted by entry time."""
    holds: dict[str, Hold] = {}
    for line in read_lines(path):
        if line.kind == "enter":
            token, ticket, fence, who = line.fields
            holds[token] = Hold(
                int(fence), int(ticket), line.ns, who=who, pid=line.pid, token=token
            )
        elif line.kind == "exit":
            token, lost = line.fields
            holds[token].exited_ns = line.ns
            holds[token].lost = lost == "1"
    return sorted(holds.values(), key=lambda hold: hold.entered_ns)


def violations(holds: Sequence[Hold], *, allow_open: bool = False) -> list[str]:
    """Everything wrong with ``holds`` of one lock, in order of entry; an empty
    list means the lock held. The one checker of exclusion in the suite (the
    adversarial checker adds faults, requests and timing on top).

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
