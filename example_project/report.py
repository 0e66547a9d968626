"""Checking the demo's invoices and summarising them, from plain records.

Nothing here touches Django, Redis or the clock: ``verify`` and ``summarise``
take ``Row`` records (one per invoice, as stored in the ``Invoice`` table), so
they can be tested on hand-made data.

Rows are grouped into holds by fence: a fence is granted once, so all invoices
sharing one were issued during one hold of the lock (a management-command run
issues several in a single hold). The checks are:

- ``count``: as many invoices as the callers reported issued;
- ``gap-free``: the numbers are exactly 1..N, each once;
- ``one holder per fence``: the invoices of a fence come from one process with
  one ticket and one source, and each was completed (``exited_ns`` set);
- ``no overlap``: in order of start, each hold began after every earlier one
  ended, every hold ended, and the fences rise with that order;
- ``ticket order``: tickets strictly increase in that order, i.e. the lock was
  granted in order of arrival;
- ``numbers follow fences``: invoice numbers increase with fences.

The holds are the shared ``redis_fifo_lock.holds.Hold`` records, and ``no
overlap`` and ``ticket order`` report what its ``violations`` (the checker the
tests use) finds in them.

A shared lock name across the three surfaces shows up here too: surfaces on
different locks would get overlapping fence sequences and fail the second,
third or fourth check.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from redis_fifo_lock.holds import Hold, Violation, violations

SOURCES = ("task", "view", "command")
"""The surfaces that issue invoices, in the order the table lists them."""


@dataclass(frozen=True)
class Row:
    """One invoice as stored: its number and the grant it was issued under.

    Attributes:
        number: the invoice number (int).
        source: the surface that issued it (``"task"``, ``"view"``, ``"command"``).
        fence: the fence (int) of the lease held while issuing.
        ticket: the ticket (int) of that lease.
        pid: the issuing process id (int).
        entered_ns: monotonic clock (int, ns) when issuing began.
        exited_ns: monotonic clock (int, ns) after the commit, or None if the
            row was never completed.
        waited_ms: how long the caller waited for the lock (float, ms).
    """

    number: int
    source: str
    fence: int
    ticket: int
    pid: int
    entered_ns: int
    exited_ns: int | None
    waited_ms: float


@dataclass(kw_only=True)
class InvoiceHold(Hold):
    """The invoices issued under one fence: the shared ``Hold`` (from the first
    invoice's start to the last one's commit; ``who`` is the source), and the
    invoices.

    Attributes:
        rows: the invoices issued under the fence, in number order.
    """

    rows: list[Row]

    @classmethod
    def of(cls, rows: list[Row]) -> InvoiceHold:
        """The hold of ``rows`` (one fence's invoices, in number order)."""
        first = rows[0]
        ends = [row.exited_ns for row in rows]
        return cls(
            first.fence,
            first.ticket,
            min(row.entered_ns for row in rows),
            None if None in ends else max(end for end in ends if end is not None),
            who=first.source,
            pid=first.pid,
            rows=rows,
        )

    @property
    def first(self) -> Row:
        """The hold's first invoice (lowest number)."""
        return self.rows[0]

    @property
    def waited_ms(self) -> float:
        """How long the holder waited for this grant (float, ms)."""
        return self.first.waited_ms


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: what was checked (str).
        ok: whether it held (bool).
        detail: a sentence with the numbers (str).
    """

    name: str
    ok: bool
    detail: str


def group_holds(rows: Iterable[Row]) -> list[InvoiceHold]:
    """Group invoices by fence into holds, in fence order.

    Args:
        rows: the invoices, in any order.

    Returns:
        One ``InvoiceHold`` per distinct fence, sorted by fence; each hold's rows are
        sorted by number.
    """
    by_fence: dict[int, list[Row]] = {}
    for row in sorted(rows, key=lambda row: row.number):
        by_fence.setdefault(row.fence, []).append(row)
    return [InvoiceHold.of(by_fence[fence]) for fence in sorted(by_fence)]


def _few(values: Sequence[object], limit: int = 5) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return shown + (f" (+{len(values) - limit} more)" if len(values) > limit else "")


def _check_count(rows: Sequence[Row], expected: int) -> Check:
    ok = len(rows) == expected
    return Check("count", ok, f"{len(rows)} invoices stored, {expected} reported issued")


def _check_gap_free(rows: Sequence[Row]) -> Check:
    counts = Counter(row.number for row in rows)
    duplicates = sorted(number for number, times in counts.items() if times > 1)
    missing = sorted(set(range(1, len(rows) + 1)) - counts.keys())
    if not duplicates and not missing:
        return Check("gap-free", True, f"numbers are exactly 1..{len(rows)}")
    problems = []
    if duplicates:
        problems.append(f"duplicates {_few(duplicates)}")
    if missing:
        problems.append(f"missing {_few(missing)}")
    return Check("gap-free", False, "; ".join(problems))


def _check_one_holder(holds: Sequence[InvoiceHold]) -> Check:
    bad = []
    for hold in holds:
        holders = {(row.source, row.pid, row.ticket) for row in hold.rows}
        if len(holders) > 1 or hold.exited_ns is None:
            bad.append(hold.fence)
    if bad:
        return Check(
            "one holder per fence",
            False,
            f"fences shared by several holders or left unfinished: {_few(bad)}",
        )
    return Check("one holder per fence", True, f"{len(holds)} holds, each by one process")


def _check_no_overlap(found: Sequence[Violation], holds: Sequence[InvoiceHold]) -> Check:
    overlaps = [str(v) for v in found if v.kind in ("overlap", "fence", "open", "reversed")]
    if overlaps:
        return Check("no overlap", False, _few(overlaps, 3))
    pairs = max(len(holds) - 1, 0)
    return Check("no overlap", True, f"{pairs} pairs of consecutive holds, none overlapped")


def _check_ticket_order(found: Sequence[Violation]) -> Check:
    inversions = [str(v) for v in found if v.kind == "ticket"]
    if inversions:
        return Check("ticket order", False, _few(inversions, 3))
    return Check("ticket order", True, "grants were made in order of arrival")


def _check_numbers_follow_fences(holds: Sequence[InvoiceHold]) -> Check:
    inversions = [
        f"fence {current.fence} issued {current.first.number} "
        f"after fence {previous.fence} issued {previous.rows[-1].number}"
        for previous, current in pairwise(holds)
        if current.first.number <= previous.rows[-1].number
    ]
    if inversions:
        return Check("numbers follow fences", False, _few(inversions, 3))
    return Check("numbers follow fences", True, "later grants issued later numbers")


def verify(rows: Sequence[Row], expected: int) -> list[Check]:
    """Run every check on the invoices.

    Args:
        rows: all invoices of the run.
        expected: how many invoices the callers reported as issued (int).

    Returns:
        One ``Check`` per check, in the order of the module docstring.
    """
    holds = group_holds(rows)
    found = violations(holds)
    return [
        _check_count(rows, expected),
        _check_gap_free(rows),
        _check_one_holder(holds),
        _check_no_overlap(found, holds),
        _check_ticket_order(found),
        _check_numbers_follow_fences(holds),
    ]


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile of ``values`` by the nearest-rank method.

    Args:
        values: the sample (not necessarily sorted).
        pct: the percentile, 0 < pct <= 100.

    Returns:
        The smallest value with at least ``pct`` percent of the sample at or
        below it; NaN for an empty sample.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Line:
    """One line of the summary table (a source, or ``"all"``).

    Attributes:
        label: the source name, or ``"all"``.
        holds: how many times it held the lock (int).
        invoices: how many invoices it issued (int).
        per_second: invoices per second over the run's span (float).
        wait_ms: (p50, p99) of the lock wait, per hold (floats, ms).
        handoff_ms: (p50, p99) of the hand-off into its holds (floats, ms): the
            hold's start minus the previous hold's end, counted only when the
            holder was already waiting as the previous hold ended (otherwise
            the lock was idle in between and there was no hand-off).
    """

    label: str
    holds: int
    invoices: int
    per_second: float
    wait_ms: tuple[float, float]
    handoff_ms: tuple[float, float]


def summarise(rows: Sequence[Row]) -> list[Line]:
    """Per-source and overall figures, for ``format_table``.

    Throughput is invoices per second between the first invoice's start and the
    last one's commit. Unfinished rows (no ``exited_ns``) count as invoices but
    end no span. A holder is taken to have asked for the lock ``waited_ms``
    before its hold began.

    Args:
        rows: all invoices of the run.

    Returns:
        A line per source that issued anything, then the ``"all"`` line.
    """
    holds = group_holds(rows)
    starts = [row.entered_ns for row in rows]
    ends = [row.exited_ns for row in rows if row.exited_ns is not None]
    span_s = (max(ends) - min(starts)) / 1e9 if starts and ends else 0.0
    handoffs: dict[int, float] = {}
    for previous, current in pairwise(holds):
        end = previous.exited_ns
        asked_ns = current.entered_ns - current.waited_ms * 1e6
        if end is not None and asked_ns <= end:
            handoffs[current.fence] = (current.entered_ns - end) / 1e6

    def line(label: str, chosen: list[InvoiceHold]) -> Line:
        waits = [hold.waited_ms for hold in chosen]
        gaps = [handoffs[hold.fence] for hold in chosen if hold.fence in handoffs]
        invoices = sum(len(hold.rows) for hold in chosen)
        return Line(
            label=label,
            holds=len(chosen),
            invoices=invoices,
            per_second=invoices / span_s if span_s > 0 else math.nan,
            wait_ms=(percentile(waits, 50), percentile(waits, 99)),
            handoff_ms=(percentile(gaps, 50), percentile(gaps, 99)),
        )

    lines = [
        line(source, [hold for hold in holds if hold.who == source])
        for source in SOURCES
        if any(hold.who == source for hold in holds)
    ]
    lines.append(line("all", holds))
    return lines


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def format_table(lines: Sequence[Line]) -> str:
    """Render ``summarise``'s lines as a fixed-width text table.

    Args:
        lines: the lines to show.

    Returns:
        The table (str), a header line and one line per entry, no final newline.
    """
    header = ("source", "holds", "invoices", "inv/s", "wait p50", "p99", "hand-off p50", "p99")
    widths = (8, 6, 9, 8, 10, 8, 13, 8)
    rows = [header]
    for entry in lines:
        rows.append(
            (
                entry.label,
                str(entry.holds),
                str(entry.invoices),
                "-" if math.isnan(entry.per_second) else f"{entry.per_second:.1f}",
                _ms(entry.wait_ms[0]),
                _ms(entry.wait_ms[1]),
                _ms(entry.handoff_ms[0]),
                _ms(entry.handoff_ms[1]),
            )
        )
    text = [
        cells[0].ljust(widths[0])
        + "".join(cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        for cells in rows
    ]
    text.insert(1, "-" * sum(widths))
    text.append("(wait and hand-off in milliseconds; a hold is one grant of the lock)")
    return "\n".join(text)
