"""Check, in your own tests, that the holders of a lock excluded each other.

Record one :class:`Hold` per grant of a lock, stamped with a clock that every
holder shares, then ask :func:`violations` what went wrong; an empty list means
the lock held. ``time.monotonic_ns()`` is one system-wide clock on Linux, so
processes of one machine can compare their stamps. Stamp ``entered_ns`` just
after ``acquire`` returned and ``exited_ns`` just before ``release`` is called:
the recorded span then sits inside the real hold, and an overlap of two
recorded spans is an overlap of the holds::

    import time
    from redis_fifo_lock.holds import Hold, violations

    holds: list[Hold] = []

    async def worker(lock):
        async with lock.hold(timeout=30) as lease:
            hold = Hold(lease.fence, lease.ticket, time.monotonic_ns())
            holds.append(hold)
            ...  # the critical section
            hold.exited_ns = time.monotonic_ns()

    ...  # run many workers, in tasks, threads or processes
    assert violations(holds) == []

Holders in other processes can send their stamps back (a file, a Redis list)
and the test rebuilds the holds from them. A hold without a fence or ticket (a
lock that has none, such as another library's) is checked for overlaps only.
This module needs no server and imports nothing beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Hold", "Violation", "ViolationKind", "violations"]

ViolationKind = Literal["open", "reversed", "fence", "ticket", "overlap"]
"""What a :class:`Violation` found (see :func:`violations`)."""


@dataclass
class Hold:
    """One hold of a lock, as its holder recorded it.

    Attributes:
        fence: the lease's fence (int), or None for a lock without fences.
        ticket: the lease's ticket (int): its place in arrival order; None for a
            lock without tickets.
        entered_ns: a shared clock's stamp (int, ns) taken just after ``acquire``
            returned.
        exited_ns: a stamp (int, ns) taken just before ``release`` was called;
            None while inside, or when the holder was killed inside.
        lost: whether the lock told the holder its lease was lost (``lease.lost``
            was set; such a hold may overlap the next one), default False.
        who: who held it (str, free text), default "".
        pid: the holder's process id (int), default 0 (not recorded).
        token: the lease's token (str), default "".
    """

    fence: int | None
    ticket: int | None
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


@dataclass(frozen=True, repr=False)
class Violation:
    """One thing wrong with a run of holds; ``str()`` and ``repr()`` give a
    sentence with the fences, tickets and process ids in it.

    Attributes:
        kind: what was found (``ViolationKind``): ``"open"`` a hold never
            exited; ``"reversed"`` a hold exited before it entered (the stamps
            are not from one clock); ``"fence"`` a fence did not rise with entry
            order; ``"ticket"`` a ticket did not (a grant out of arrival order);
            ``"overlap"`` a hold entered while ``earlier`` was still inside.
        hold: the hold at fault (``Hold``; the later one of a pair).
        earlier: the hold it conflicts with (``Hold``), None for ``"open"`` and
            ``"reversed"``.
    """

    kind: ViolationKind
    hold: Hold
    earlier: Hold | None = None

    def __str__(self) -> str:
        hold, earlier = self.hold, self.earlier
        if self.kind == "open" or earlier is None:
            what = "never exited" if self.kind == "open" else "exited before it entered"
            return f"hold fence={hold.fence} pid={hold.pid} {what}"
        if self.kind == "fence":
            return f"fence {hold.fence} entered after fence {earlier.fence}"
        if self.kind == "ticket":
            return f"ticket {hold.ticket} granted after ticket {earlier.ticket}"
        return (
            f"overlap: fence {hold.fence} (pid {hold.pid}) entered while fence "
            f"{earlier.fence} (pid {earlier.pid}) was inside"
        )

    __repr__ = __str__


def violations(holds: Iterable[Hold], *, allow_open: bool = False) -> list[Violation]:
    """Everything wrong with the holds of one lock, in order of entry; an empty
    list means the lock held.

    The holds are taken in order of ``entered_ns`` (in any order given). Checks:

    - never two inside at once (``"overlap"``): each hold entered after every
      earlier one had exited; a hold marked ``lost`` may overlap the next one,
      as the lock told its holder so;
    - fences strictly increase in entry order (``"fence"``);
    - tickets strictly increase in entry order, i.e. grants in arrival order
      (``"ticket"``);
    - every hold exited (``"open"``), unless ``allow_open`` (for holders that
      were killed inside: an open hold is then not taken to overlap anything,
      as its lease expired), and none exited before it entered (``"reversed"``).

    A hold whose fence (ticket) is None is not compared by fence (ticket).

    Args:
        holds: the holds (``Hold``, or a subclass), in any order.
        allow_open: whether a hold may lack ``exited_ns`` (bool), default False.

    Returns:
        One ``Violation`` per finding (list), in order of entry.
    """
    found: list[Violation] = []
    previous: Hold | None = None
    last_out: Hold | None = None  # among exited holds, the one that left last
    for hold in sorted(holds, key=lambda hold: hold.entered_ns):
        if hold.exited_ns is None and not allow_open:
            found.append(Violation("open", hold))
        if hold.exited_ns is not None and hold.exited_ns < hold.entered_ns:
            found.append(Violation("reversed", hold))
        if previous is not None:
            if _falls(hold.fence, previous.fence):
                found.append(Violation("fence", hold, previous))
            if _falls(hold.ticket, previous.ticket):
                found.append(Violation("ticket", hold, previous))
        if (
            last_out is not None
            and last_out.exited_ns is not None
            and last_out.exited_ns > hold.entered_ns
            and not last_out.lost
        ):
            found.append(Violation("overlap", hold, last_out))
        if hold.exited_ns is not None and (
            last_out is None or last_out.exited_ns is None or hold.exited_ns > last_out.exited_ns
        ):
            last_out = hold
        previous = hold
    return found


def _falls(later: int | None, earlier: int | None) -> bool:
    """Whether a number that must rise did not (never when either is missing)."""
    return later is not None and earlier is not None and later <= earlier
