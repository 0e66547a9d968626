"""The checker: what the shared record says about the lock, and nothing else.

It reads a run directory (``<lock>.rec`` per lock and ``faults.rec``, written by
``tests.support.record.Record``) and checks, per lock:

1. **Exclusion** - never two holders inside at once. An overlap is allowed only
   when the earlier holder's ``lease.lost`` was set before the overlap began,
   or when one of the two was hit by a fault outside the lock's guarantee (a
   freeze, an event-loop stall, a server pause, eviction or deletion of the
   lease key, a restart, a hold past ``max_hold_ms``) before the overlap began
   *and* saw ``lease.lost`` set while still inside, within ``learn_ms`` of the
   fault's end: loud failure. After a fault that made the server forget the
   lease (a restart, eviction, deletion), a holder that left within
   ``renew_ms`` of the fault's end, before its next renewal could ask Redis,
   may learn from its release instead (``LeaseLost``, within ``learn_ms``): it
   could not have learned sooner.
2. **Fences** strictly increase in entry order, also across lost keys, a
   FLUSHALL or a restart (fences are dated by the server's clock).
3. **FIFO among live waiters** - when a request is granted, every request with
   a lower ticket was granted before it, or had stopped waiting: it gave up
   (cancel, timeout), its process was killed, frozen or stalled, or a fault
   that loses liveness or queue state happened meanwhile.
4. **Every grant ends** - every entered hold was released (with any outcome)
   or its process killed; every request ended in an entry or a give-up.
5. **No loss without a cause** - ``lease.lost`` or ``LeaseLost`` only for a
   holder hit by such a fault; a repeated release is never ``LeaseLost`` after
   a successful one; no script error (``ResponseError``) ever.
6. Optionally, **hand-off latency** - after a holder leaves while live requests
   wait, the next holder enters within ``handoff_ms``; after a holder is
   killed, within ``recovery_ms``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from redis_fifo_lock.holds import Hold, violations
from tests.support.record import Line, read_lines

INF = math.inf
FAULTS_FILE = "faults.rec"


LEASE_THREATS = frozenset({"pause", "evict", "restart", "stop", "lag", "overhold"})
"""Faults after which a holder may lose its lease (the lock promises nothing then)."""

LIVENESS_THREATS = frozenset({"pause", "restart", "stop", "lag", "kill", "block"})
"""Faults after which a waiter may lose its place in the queue. ``block`` is a
waiter's event loop blocked for less than ``lease_ms``, but long enough that its
session's liveness may run out: it may lose its place, never its exclusion."""

TARGETED = frozenset({"stop", "kill", "clientkill", "block"})
"""Faults whose detail is the pid they hit (``lag`` hits the pid that wrote it)."""


@dataclass
class Fault:
    """A fault as the record tells it, with the time span it covers (ns)."""

    kind: str
    start: int
    end: float
    pid: int | None  # the process it hit, None for the whole server
    detail: str

    def hits(self, pid: int, token: str) -> bool:
        """Whether this fault is aimed at (or global to) the given holder/request."""
        if self.kind == "overhold":
            return self.detail == token
        return self.pid is None or self.pid == pid

    def within(self, start: float, end: float) -> bool:
        """Whether the fault's span meets the window [start, end]."""
        return self.start <= end and self.end >= start


@dataclass(kw_only=True)
class TrackedHold(Hold):
    """One granted request, from its request to its release: the record's
    ``Hold`` (``lost`` once the holder saw ``lease.lost``), and when it was first
    requested and learned of a loss, and how its release ended."""

    requested: int
    lost_ns: int | None = None
    released: int | None = None
    outcome: str | None = None
    repeats: list[str] = field(default_factory=list)


@dataclass
class Request:
    """Everything recorded about one token's requests."""

    token: str
    pid: int
    requests: list[tuple[int, int]] = field(default_factory=list)  # (ns, timeout_ms)
    tickets: dict[int, int] = field(default_factory=dict)  # ticket -> first seen ns
    cancel: int | None = None
    gave_up: list[tuple[int, str]] = field(default_factory=list)
    entered: int | None = None

    def stopped_waiting(self) -> float:
        """When this token stopped waiting of its own accord (cancel, timeout, give-up)."""
        ends: list[float] = []
        if self.cancel is not None:
            ends.append(self.cancel)
        ends.extend(ns + timeout * 1_000_000 for ns, timeout in self.requests if timeout >= 0)
        # Also "unavailable" with a retry after it: the library withdraws a request
        # whose reply was lost as soon as Redis answers (issue 11), so the retry
        # keeps the place only if it beats that withdrawal, and may queue anew.
        ends.extend(ns for ns, _ in self.gave_up)
        return min(ends, default=INF)


@dataclass
class Report:
    """The checker's findings for one run."""

    violations: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    entries: int = 0
    holds: int = 0
    requests: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Report) -> None:
        """Add ``other``'s findings and counts to this report."""
        self.violations.extend(other.violations)
        self.known.extend(other.known)
        self.entries += other.entries
        self.holds += other.holds
        self.requests += other.requests
        for kind, count in other.faults.items():
            self.faults[kind] = self.faults.get(kind, 0) + count


def read_faults(lines: list[Line]) -> list[Fault]:
    """The faults of a run, with spans (a stop lasts until its cont, etc.)."""
    faults: list[Fault] = []
    stopped: dict[int, Fault] = {}
    down: Fault | None = None
    for line in lines:
        if line.kind != "fault":
            continue
        kind, detail = line.fields[0], line.fields[1]
        if kind == "block":
            pid, _, ms = detail.partition(":")
            faults.append(Fault(kind, line.ns, line.ns + int(ms) * 1_000_000, int(pid), ""))
        elif kind in TARGETED:
            fault = Fault(kind, line.ns, INF if kind != "clientkill" else line.ns, int(detail), "")
            if kind == "stop":
                stopped[fault.pid] = fault  # type: ignore[index]
            faults.append(fault)
        elif kind == "cont":
            began = stopped.pop(int(detail), None)
            if began is not None:
                began.end = line.ns
        elif kind == "lag":
            lag_ns = int(detail.removesuffix("ms")) * 1_000_000
            faults.append(Fault("lag", line.ns - lag_ns, line.ns, line.pid, detail))
        elif kind == "pause":
            span = int(detail.removesuffix("ms")) * 1_000_000
            faults.append(Fault("pause", line.ns, line.ns + span, None, detail))
        elif kind == "restart":
            down = Fault("restart", line.ns, INF, None, detail)
            faults.append(down)
        elif kind == "restarted":
            if down is not None:
                down.end = line.ns
        elif kind == "overhold":
            faults.append(Fault("overhold", line.ns, INF, None, detail))
        else:  # evict, delete, and anything else that hits the whole server at once
            faults.append(Fault(kind, line.ns, line.ns, None, detail))
    return faults


def lease_threat(fault: Fault) -> bool:
    """Whether ``fault`` can take a holder's lease away."""
    if fault.kind == "delete":
        return "lease" in fault.detail.split(",")
    return fault.kind in LEASE_THREATS


def forgets_lease(fault: Fault) -> bool:
    """Whether ``fault`` makes the server forget a lease with no sign to its holder
    (a restart that lost every key, eviction, deletion of the lease key): the
    holder's own clock still says it holds, so it can learn of the loss only at
    its next call to Redis - a renewal, or its release."""
    if fault.kind == "delete":
        return "lease" in fault.detail.split(",")
    return fault.kind in {"restart", "evict"}


def liveness_threat(fault: Fault) -> bool:
    """Whether ``fault`` can cost a waiter its place or reorder the queue: a
    deletion or an eviction (whose detail names the keys it may take) of a key
    that holds the queue, or a fault of ``LIVENESS_THREATS``."""
    if fault.kind in {"delete", "evict"}:
        parts = set(fault.detail.split(","))
        return bool(parts & {"queue", "waiters", "alive"})
    return fault.kind in LIVENESS_THREATS


def resets_tickets(fault: Fault) -> bool:
    """Whether ``fault`` separates two ticket orders: a restart loses the queue, so
    tickets before and after it are not one queue (they still rise: they are
    dated by the server's clock)."""
    return fault.kind == "restart"


class LockHistory:
    """The holds and requests of one lock, read from its record."""

    def __init__(
        self,
        name: str,
        lines: list[Line],
        faults: list[Fault],
        unexcused: frozenset[str] = frozenset(),
        learn_ms: float | None = None,
        renew_ms: float | None = None,
    ) -> None:
        self.name = name
        self.faults = faults
        self.unexcused = unexcused
        self.learn_ms = learn_ms
        self.renew_ms = renew_ms
        self.known: list[str] = []
        self.entries = len(lines)
        self.holds: list[TrackedHold] = []
        self.requests: dict[str, Request] = {}
        open_holds: dict[str, TrackedHold] = {}
        for line in lines:
            token = line.fields[0] if line.fields else ""
            request = self.requests.get(token)
            if request is None:
                request = self.requests[token] = Request(token, line.pid)
            if line.kind == "request":
                request.requests.append((line.ns, int(line.fields[1])))
            elif line.kind == "queued":
                request.tickets.setdefault(int(line.fields[1]), line.ns)
            elif line.kind == "cancel":
                request.cancel = request.cancel or line.ns
            elif line.kind == "gaveup":
                request.gave_up.append((line.ns, line.fields[1]))
            elif line.kind == "enter":
                first = request.requests[0][0] if request.requests else line.ns
                hold = TrackedHold(
                    fence=int(line.fields[2]),
                    ticket=int(line.fields[1]),
                    entered_ns=line.ns,
                    who=line.fields[3],
                    pid=line.pid,
                    token=token,
                    requested=first,
                )
                request.entered = request.entered or line.ns
                open_holds[token] = hold
                self.holds.append(hold)
            elif line.kind in ("exit", "lost", "release"):
                hold = open_holds.get(token)  # type: ignore[assignment]
                if hold is None:
                    continue
                if line.kind == "exit":
                    hold.exited_ns = hold.exited_ns or line.ns
                elif line.kind == "lost":
                    hold.lost_ns = hold.lost_ns or line.ns
                    hold.lost = True
                elif line.fields[1].startswith("dup"):
                    hold.repeats.append(line.fields[1])
                elif hold.released is None:
                    hold.released, hold.outcome = line.ns, line.fields[1]
        self.holds.sort(key=lambda hold: hold.entered_ns)

    # --- helpers -----------------------------------------------------------------------

    def killed(self, pid: int) -> float:
        """When process ``pid`` was killed (INF if never)."""
        return min((f.start for f in self.faults if f.kind == "kill" and f.pid == pid), default=INF)

    def end(self, hold: TrackedHold) -> float:
        """When ``hold`` stopped being inside: its exit, or its process's death."""
        if hold.exited_ns is not None:
            return hold.exited_ns
        return self.killed(hold.pid)

    def lease_threatened(
        self, hold: TrackedHold, until: float, *, for_overlap: bool = False, learned: bool = False
    ) -> bool:
        """Whether a fault that can cost ``hold`` its lease hit it before ``until``.

        A fault aimed at the holder's process (a freeze, a stall) counts from its
        request on: a grant can go stale before the holder even sees it. A fault
        of the whole server counts only once the holder had entered: a lease
        granted after an eviction, say, was never touched by it. With
        ``for_overlap``, the ``unexcused`` kinds do not count; with ``learned``, only
        a fault after which the holder saw ``lease.lost`` within ``learn_ms`` of the
        fault's end counts (failing loudly means failing soon).
        """
        for fault in self.faults:
            if not (lease_threat(fault) and fault.hits(hold.pid, hold.token)):
                continue
            if for_overlap and fault.kind in self.unexcused:
                continue
            since = hold.requested if fault.pid is not None else hold.entered_ns
            if not fault.within(since, until):
                continue
            if learned and not self.learned_after(hold, fault):
                continue
            return True
        return False

    def learned_after(self, hold: TrackedHold, fault: Fault) -> bool:
        """Whether ``hold`` saw ``lease.lost`` while inside, soon enough after ``fault``.

        After a fault that made the server forget the lease, a holder that left
        within ``renew_ms`` of the fault's end (before its next renewal could
        ask Redis) learns at its release (``LeaseLost``): as soon as any lease
        lock could tell it, so that counts too, within the same ``learn_ms``.
        """
        if self.learned(hold):
            told_ns = hold.lost_ns
        elif self.told_at_release(hold, fault):
            told_ns = hold.released
        else:
            return False
        if self.learn_ms is None or fault.end == INF:
            return True
        assert told_ns is not None
        return told_ns <= fault.end + self.learn_ms * 1_000_000

    def told_at_release(self, hold: TrackedHold, fault: Fault) -> bool:
        """Whether ``hold``'s release reported the loss that ``fault`` caused, the
        holder having left before its next renewal after the fault could run."""
        return (
            self.renew_ms is not None
            and forgets_lease(fault)
            and hold.outcome == "leaselost"
            and hold.exited_ns is not None
            and hold.exited_ns <= fault.end + self.renew_ms * 1_000_000
        )

    def learned(self, hold: TrackedHold) -> bool:
        """Whether ``hold`` saw ``lease.lost`` set while it was still inside."""
        return hold.lost_ns is not None and (
            hold.exited_ns is None or hold.lost_ns <= hold.exited_ns
        )

    def describe(self, hold: Hold) -> str:
        """A short description of ``hold`` for messages."""
        return f"fence {hold.fence} (ticket {hold.ticket}, {hold.token}, pid {hold.pid})"

    # --- the properties ----------------------------------------------------------------

    def exclusion(self) -> list[str]:
        """Property 1: never two inside at once, except loudly failed faulted holders."""
        found = []
        for index, later in enumerate(self.holds):
            for earlier in self.holds[:index]:
                if not later.entered_ns < self.end(earlier):
                    continue
                start = later.entered_ns
                if earlier.lost_ns is not None and earlier.lost_ns <= start:
                    continue  # the lock told the earlier holder before the overlap
                if any(
                    self.lease_threatened(hold, start, for_overlap=True, learned=True)
                    for hold in (earlier, later)
                ):
                    continue  # a fault outside the guarantee, reported loudly
                found.append(
                    f"overlap on {self.name!r}: {self.describe(later)} entered while "
                    f"{self.describe(earlier)} was inside (lost "
                    f"{'never' if earlier.lost_ns is None else 'after the overlap began'})"
                )
        return found

    def fences(self) -> list[str]:
        """Property 2: fences strictly increase in entry order. No fault excuses a
        fence that does not: fences are ``max(last + 1, server clock in us)``, so
        they rise across lost keys, FLUSHDB and restarts of a server on this
        machine's clock."""
        return [
            f"fences on {self.name!r}: {self.describe(found.hold)} entered after "
            f"{self.describe(found.earlier)}"
            for found in violations(self.holds, allow_open=True)
            if found.kind == "fence" and found.earlier is not None
        ]

    def fifo(self) -> list[str]:
        """Property 3: grants in ticket order among live waiters."""
        found = []
        instances = [
            (ticket, seen, request)
            for request in self.requests.values()
            for ticket, seen in request.tickets.items()
        ]
        resets = [f for f in self.faults if resets_tickets(f)]
        for hold in self.holds:
            hold_request = self.requests.get(hold.token)
            hold_seen = (
                hold_request.tickets.get(hold.ticket, hold.entered_ns)
                if hold_request
                else hold.entered_ns
            )
            for ticket, seen, request in instances:
                if ticket >= hold.ticket or request.token == hold.token:
                    continue
                if seen > hold.entered_ns or any(
                    f.within(min(seen, hold_seen), hold.entered_ns) for f in resets
                ):
                    continue  # tickets from different counters (the counter was lost between)
                if request.entered is not None and request.entered < hold.entered_ns:
                    continue
                if request.stopped_waiting() <= hold.entered_ns:
                    continue
                first = request.requests[0][0] if request.requests else seen
                if any(
                    liveness_threat(f)
                    and f.hits(request.pid, request.token)
                    and f.within(first, hold.entered_ns)
                    for f in self.faults
                ):
                    continue
                found.append(
                    f"FIFO on {self.name!r}: {self.describe(hold)} was granted while ticket "
                    f"{ticket} ({request.token}, pid {request.pid}) was still waiting and alive"
                )
        return found

    def endings(self, finished: bool) -> list[str]:
        """Properties 4 and 5: every grant and request ends; losses have causes."""
        found = []
        for hold in self.holds:
            if hold.outcome is None:
                if finished and self.killed(hold.pid) == INF:
                    found.append(f"{self.describe(hold)} on {self.name!r} was never released")
                continue
            lost = hold.lost_ns is not None or hold.outcome == "leaselost"
            until = hold.released if hold.released is not None else INF
            left = hold.exited_ns if hold.exited_ns is not None else INF
            if hold.outcome == "ok" and hold.lost_ns is not None and hold.lost_ns >= left:
                # Redis confirmed the release, so the lease was held until then: a
                # loss marked after the holder left is the core's own mistake.
                found.append(
                    f"{self.describe(hold)} on {self.name!r}: lease.lost set after a "
                    "successful release"
                )
                continue
            if lost and not self.lease_threatened(hold, until):
                found.append(
                    f"{self.describe(hold)} on {self.name!r} lost its lease with no fault "
                    f"to blame (release: {hold.outcome})"
                )
            if hold.outcome.startswith("unavailable") and not self.any_fault(
                hold.entered_ns, until
            ):
                found.append(
                    f"{self.describe(hold)} on {self.name!r}: release failed "
                    f"({hold.outcome}) with no fault to blame"
                )
            if hold.outcome.startswith("error") or "ResponseError" in hold.outcome:
                found.append(f"{self.describe(hold)} on {self.name!r}: release -> {hold.outcome}")
            for repeat in hold.repeats:
                if repeat != "dup-ok" and not (
                    repeat == "dup-leaselost" and hold.outcome == "leaselost"
                ):
                    found.append(
                        f"{self.describe(hold)} on {self.name!r}: release repeated after "
                        f"'{hold.outcome}' gave '{repeat}'"
                    )
        for request in self.requests.values():
            for ns, reason in request.gave_up:
                if "ResponseError" in reason or reason.startswith("error"):
                    found.append(
                        f"request {request.token} on {self.name!r} failed with {reason} "
                        "(a script error or a misuse)"
                    )
                elif reason.startswith("unavailable") and not self.any_fault(
                    request.requests[0][0] if request.requests else ns, ns
                ):
                    found.append(
                        f"request {request.token} on {self.name!r} gave up with {reason} "
                        "with no fault to blame"
                    )
            if not finished or request.entered is not None or not request.requests:
                continue
            ended = request.gave_up and request.gave_up[-1][0] >= request.requests[-1][0]
            if not ended and self.killed(request.pid) == INF:
                found.append(
                    f"request {request.token} on {self.name!r} (pid {request.pid}) never "
                    "ended: neither granted nor given up"
                )
        return found

    def any_fault(self, start: float, end: float) -> bool:
        """Whether any fault other than an observed stall happened in [start, end]."""
        return any(f.within(start, end) and f.kind != "lag" for f in self.faults)

    def handoffs(self, handoff_ms: float | None, recovery_ms: float | None) -> list[str]:
        """Property 6: the next holder enters promptly once a holder leaves or dies."""
        found = []
        for hold in self.holds:
            bound: float | None
            left: float
            if hold.exited_ns is not None:
                bound, left, how = handoff_ms, hold.exited_ns, "left"
            else:
                bound, left, how = recovery_ms, self.killed(hold.pid), "was killed"
            if bound is None or left == INF:
                continue
            if not self.someone_waiting(hold, left):
                continue
            if any(
                other is not hold and other.entered_ns < left < self.end(other)
                for other in self.holds
            ):
                continue  # someone else was inside (an excused overlap): nothing was handed off
            if any(f.within(left, left + bound * 1e6) for f in self.faults if f.kind == "lag"):
                continue  # the machine stalled; latency says nothing about the lock then
            following = [h.entered_ns for h in self.holds if h.entered_ns > left]
            took_ms = (min(following) - left) / 1e6 if following else INF
            if took_ms > bound:
                found.append(
                    f"hand-off on {self.name!r}: after {self.describe(hold)} {how}, the next "
                    f"holder entered {took_ms:.0f} ms later (bound {bound:.0f} ms)"
                )
        return found

    def someone_waiting(self, hold: TrackedHold, at: float) -> bool:
        """Whether a live request other than ``hold``'s was queued at ``at``."""
        for request in self.requests.values():
            if request.token == hold.token or not request.tickets:
                continue
            if min(request.tickets.values()) > at:
                continue
            if request.entered is not None and request.entered <= at:
                continue
            if request.stopped_waiting() <= at or self.killed(request.pid) <= at:
                continue
            return True
        return False


def check(
    run_dir: Path,
    *,
    finished: bool = True,
    handoff_ms: float | None = None,
    recovery_ms: float | None = None,
    unexcused: frozenset[str] = frozenset(),
    learn_ms: float | None = None,
    renew_ms: float | None = None,
) -> Report:
    """Check every lock recorded in ``run_dir``; see the module docstring.

    Args:
        finished: every contender has ended, so open requests and holds are hangs.
        handoff_ms: bound on hand-off latency after a holder leaves (None: unchecked).
        recovery_ms: bound on the next entry after a holder is killed (None: unchecked).
        unexcused: fault kinds that excuse no overlap and no loss (for a strict
            reading, e.g. ``{"pause"}``: the holder must be told in time).
        learn_ms: a fault excuses an overlap only if the holder it hit saw
            ``lease.lost`` within this many ms of the fault's end (None: any time
            while inside).
        renew_ms: after a fault that made the server forget a lease, a holder
            that left within this many ms of the fault's end may learn of the
            loss from its release (None: only ``lease.lost`` while inside counts).
    """
    fault_lines = read_lines(run_dir / FAULTS_FILE)
    faults = read_faults(fault_lines)
    report = Report()
    counts: dict[str, int] = defaultdict(int)
    for fault in faults:
        counts[fault.kind] += 1
    report.faults = dict(counts)
    report.entries += len(fault_lines)
    for path in sorted(run_dir.glob("*.rec")):
        if path.name == FAULTS_FILE:
            continue
        history = LockHistory(path.stem, read_lines(path), faults, unexcused, learn_ms, renew_ms)
        report.entries += history.entries
        report.holds += len(history.holds)
        report.requests += len(history.requests)
        report.violations += history.exclusion()
        report.violations += history.fences()
        report.violations += history.fifo()
        report.violations += history.endings(finished)
        report.violations += history.handoffs(handoff_ms, recovery_ms)
        report.known += history.known
    report.violations += [
        f"a script raised a Lua error: {fault.detail}"
        for fault in faults
        if fault.kind == "scripterror"
    ]
    return report
