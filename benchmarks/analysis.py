"""How the contended figures are computed from what the contenders recorded.

Every contender records one ``TimedHold`` per grant (the shared
``redis_fifo_lock.holds.Hold`` and two more stamps), with
``time.monotonic_ns()`` stamps. On Linux that clock (``CLOCK_MONOTONIC``) is
one system-wide clock, so stamps taken by different processes on this machine
compare directly. Overlaps and fence order are judged by the checker the tests
use, ``redis_fifo_lock.holds.violations``.

Definitions (the Markdown report and ``benchmarks/README.md`` repeat them):

- **grant order**: holds sorted by the moment ``acquire`` returned. Mutual
  exclusion makes this the order in which the lock was held; for our lock the
  fences must agree with it, and ``fence_order_errors`` counts where they don't.
- **grants/s** (the headline throughput): every grant whose ``acquire``
  returned inside the measured window, divided by the window. A grant to the
  contender that held the lock just before (a barging lock re-granting to the
  thread that just released) counts like any other: it is work done.
- **idle gap** (the headline latency): for every two consecutive grants, from
  the moment the previous holder *called* ``release`` (a stamp taken just
  before the call) to the moment the next holder's ``acquire`` returned. The
  lock serves nobody during it, whoever the next holder is, so the release's
  own round trip is inside it. It is never negative unless mutual exclusion
  failed (see *overlap*).
- **hold**: from the moment a holder's ``acquire`` returned to the moment it
  called ``release``: the critical section as the contender saw it, its sleep
  (none, or 1 ms) and the time its thread or event loop took to run it again.
  One grant takes a hold and an idle gap, so grants/s is about 1 / (mean hold
  + mean idle gap); ``hold_us`` and ``hold_mean_us``.
- **hand-off** (secondary): two consecutive grants to *different* contenders;
  ``handoffs_per_s`` counts them and ``handoff_gap_us`` is the idle gap of
  those pairs only. The other pairs are *re-acquisitions*.
- **arrival order**: for every library, the order in which the contenders'
  ``acquire`` calls began (a stamp taken just before the call). For our lock,
  also the order of the tickets Redis handed out, which is what FIFO means for
  it: the order in which the requests reached Redis.
- **FIFO violation**: a grant made while a request that arrived earlier was
  still waiting (it was granted later). Each such grant counts once; the
  *worst overtake* is the largest head start (in call stamps) that an
  overtaken request had. For the barging peers these are *overtakes*.
- **overlap**: a grant whose ``acquire`` returned before an earlier holder
  (the previous one, or any before it) had even called ``release``: a
  mutual-exclusion failure.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis_fifo_lock.holds import Hold, violations

PERCENTILES = (0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0)
"""Points of each latency distribution kept in the JSON results (percent)."""


@dataclass(kw_only=True)
class TimedHold(Hold):
    """One grant, as a contender recorded it: the shared ``Hold`` (``entered_ns``
    just after ``acquire`` returned, ``exited_ns`` just before ``release`` was
    called; ``ticket`` and ``fence`` None for the other libraries), and two more
    ``time.monotonic_ns()`` stamps.

    Attributes:
        exited_ns: as ``Hold``'s, always set: a recorded grant was released.
        contender: index of the task or thread, unique across processes.
        arrival_ns: just before ``acquire`` was called.
        released_ns: just after ``release`` returned.
    """

    exited_ns: int
    contender: int
    arrival_ns: int
    released_ns: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> TimedHold:
        """Rebuild a hold from the list a worker printed (see ``as_row``)."""
        contender, arrival, acquired, release, released, ticket, fence = row
        return cls(
            None if fence is None else int(fence),
            None if ticket is None else int(ticket),
            int(acquired),
            exited_ns=int(release),
            contender=int(contender),
            arrival_ns=int(arrival),
            released_ns=int(released),
        )

    def as_row(self) -> list[int | None]:
        """A compact JSON-able form."""
        return [
            self.contender,
            self.arrival_ns,
            self.entered_ns,
            self.exited_ns,
            self.released_ns,
            self.ticket,
            self.fence,
        ]


_CUTS = 1000
"""``statistics.quantiles`` cut points per distribution: one every 0.1 percent."""


def quantile(values: Sequence[float], percent: float) -> float:
    """The ``percent`` percentile of ``values`` (0 to 100, in steps of 0.1),
    linearly interpolated as numpy's default (``statistics.quantiles``'
    inclusive method).

    Raises:
        ValueError: on an empty sequence, or a percent off the 0-100, 0.1 grid.
    """
    if not values:
        raise ValueError("quantile of no values")
    return distribution(values, (percent,))[f"p{percent:g}"]


def distribution(
    values: Sequence[float], points: Sequence[float] = PERCENTILES
) -> dict[str, float]:
    """``{"p50": ..., ...}`` at ``points`` (percent; default ``PERCENTILES``),
    as ``quantile`` computes them; empty for no values.

    Raises:
        ValueError: for a point off the 0-100, 0.1 grid.
    """
    if not values:
        return {}
    ordered = sorted(values)
    inner = statistics.quantiles(ordered, n=_CUTS, method="inclusive") if len(ordered) > 1 else []
    cuts = [ordered[0], *inner, ordered[-1]] if inner else [ordered[0]] * (_CUTS + 1)
    result = {}
    for point in points:
        step = round(point * _CUTS / 100)
        if not 0 <= step <= _CUTS or not math.isclose(step * 100 / _CUTS, point):
            raise ValueError(f"percentiles are 0 to 100 in steps of 0.1, not {point}")
        result[f"p{point:g}"] = float(cuts[step])
    return result


def fifo_violations(
    holds: Sequence[TimedHold], arrival: Callable[[TimedHold], int]
) -> list[tuple[TimedHold, int]]:
    """The grants made while an earlier arrival (by ``arrival``) still waited,
    each with how much earlier the earliest such arrival was (in the unit of
    ``arrival``: ns for call stamps, tickets for tickets).

    ``holds`` must hold every grant of the run, so that a waiter granted later
    is seen; scans the grants from last to first, keeping the earliest arrival
    among those granted later.
    """
    ordered = sorted(holds, key=lambda hold: hold.entered_ns)
    earliest_later: int | None = None
    violations = []
    for hold in reversed(ordered):
        if earliest_later is not None and earliest_later < arrival(hold):
            violations.append((hold, arrival(hold) - earliest_later))
        if earliest_later is None or arrival(hold) < earliest_later:
            earliest_later = arrival(hold)
    violations.reverse()
    return violations


@dataclass(frozen=True)
class Pair:
    """Two consecutive grants: ``before`` released, then ``after`` acquired."""

    before: TimedHold
    after: TimedHold

    @property
    def handoff(self) -> bool:
        """True when the lock went to another contender."""
        return self.before.contender != self.after.contender

    @property
    def gap_ns(self) -> int:
        """The idle gap: release called -> next acquire returned (negative only
        for an overlap)."""
        return self.after.entered_ns - self.before.exited_ns


def pairs(holds: Iterable[TimedHold]) -> list[Pair]:
    """Consecutive grants, in grant order."""
    ordered = sorted(holds, key=lambda hold: hold.entered_ns)
    return [Pair(a, b) for a, b in itertools.pairwise(ordered)]


def _ratio(values: Sequence[float], percent: float, unit: float) -> float | None:
    return quantile(values, percent) / unit if values and unit > 0 else None


def summarize_contended(
    holds: Sequence[TimedHold], window: tuple[int, int], ping_ns: float
) -> dict[str, Any]:
    """The contended figures of one run.

    Args:
        holds: every grant of the run (also those outside the window).
        window: (start, end) in ``monotonic_ns``; grants whose acquire returned
            inside it are measured. Earlier ones are warm-up; later ones drain.
        ping_ns: the PING round trip the ``*_ping`` ratios are relative to.

    Returns:
        A JSON-able dict; the raw idle gaps are under ``"_gaps_ns"`` (for the
        plot; dropped from the saved results).
    """
    start, end = window
    seconds = (end - start) / 1e9
    inside = [hold for hold in holds if start <= hold.entered_ns < end]
    measured = [pair for pair in pairs(holds) if start <= pair.after.entered_ns < end]
    handoffs = [pair for pair in measured if pair.handoff]
    gaps = [pair.gap_ns for pair in measured]
    handoff_gaps = [pair.gap_ns for pair in handoffs]
    waits = [(hold.entered_ns - hold.arrival_ns) / 1e6 for hold in inside]
    held_us = [(hold.exited_ns - hold.entered_ns) / 1000 for hold in inside]
    inside_ids = {id(hold) for hold in inside}

    def count_inside(overtakes: list[tuple[TimedHold, int]]) -> int:
        return sum(1 for hold, _ in overtakes if id(hold) in inside_ids)

    found = violations(holds)

    by_call = [
        (hold, gap)
        for hold, gap in fifo_violations(holds, lambda hold: hold.arrival_ns)
        if id(hold) in inside_ids
    ]
    has_tickets = bool(holds) and all(hold.ticket is not None for hold in holds)
    result: dict[str, Any] = {
        "window_s": seconds,
        "grants": len(inside),
        "grants_per_s": len(inside) / seconds if seconds > 0 else 0.0,
        "handoffs": len(handoffs),
        "handoffs_per_s": len(handoffs) / seconds if seconds > 0 else 0.0,
        "reacquisitions": len(measured) - len(handoffs),
        "gap_us": distribution([ns / 1000 for ns in gaps]),
        "gap_p50_us": quantile(gaps, 50) / 1000 if gaps else None,
        "gap_p99_us": quantile(gaps, 99) / 1000 if gaps else None,
        "gap_p50_ping": _ratio(gaps, 50, ping_ns),
        "gap_p99_ping": _ratio(gaps, 99, ping_ns),
        "handoff_gap_us": distribution([ns / 1000 for ns in handoff_gaps]),
        "hold_us": distribution(held_us),
        "hold_mean_us": statistics.fmean(held_us) if held_us else None,
        "wait_ms": distribution(waits),
        "fifo_violations_call_order": len(by_call),
        "fifo_worst_overtake_ms": max((gap for _, gap in by_call), default=0) / 1e6,
        "fifo_violations_ticket_order": (
            count_inside(fifo_violations(holds, lambda hold: hold.ticket or 0))
            if has_tickets
            else None
        ),
        "overlaps": sum(1 for v in found if v.kind == "overlap" and id(v.hold) in inside_ids),
        "fence_order_errors": (sum(1 for v in found if v.kind == "fence") if has_tickets else None),
        "_gaps_ns": gaps,
    }
    return result


def median(values: Iterable[float]) -> float | None:
    """The median of the non-None values, or None if there are none."""
    present = [value for value in values if value is not None]
    return quantile(present, 50) if present else None
