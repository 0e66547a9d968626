"""Many deadlines on one event loop, kept by one timer: ``Alarms``, found with ``alarms(loop)``.

A lock arms two deadlines for nearly every grant that it almost never
reaches: the bound of each script call (``timeouts.within``) and a
lease's first renewal (``renewal.Renewal``). A ``TimerHandle`` each would be
pushed on the loop's heap (whose order asyncio compares in Python) and, since
most end long before they are due, left there cancelled until asyncio next
cleans the heap: together about a tenth of an uncontended acquire and
release's bytecodes. ``Alarms`` keep them in a heap of their own (compared in
C) and arm one timer, for the earliest.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import weakref
from collections.abc import Callable

from . import native

RING_MARGIN_S = 0.001
"""On a loop without asyncio's ``_clock_resolution`` (uvloop's), alarms due
this soon (seconds) ring with those due now. uvloop arms its timers in whole
milliseconds and can run one up to a millisecond before its time; an alarm
not rung then would arm a timer for the rest of the wait, which uvloop runs at
once when it is under half a millisecond: a busy loop until its clock reached
the alarm. asyncio's own loop runs a timer within ``_clock_resolution`` of its
time (a nanosecond on Linux), and its alarms ring within that too."""

Alarm = Callable[[], object]
"""What an alarm calls when it is due: any callable without arguments, hashable
(a bound method or a ``functools.partial``): it names the alarm to ``cancel``."""


class Alarms:
    """The alarms of one event loop, due at ``loop.time()`` instants, kept by
    one timer armed for the earliest. Used on the loop's thread only.

    Each alarm is kept under a number of its own; the heap orders the numbers
    by when they are due. A cancelled alarm leaves its number in the heap (not
    the alarm: whatever the alarm holds, a task and its loop, goes at once)
    until it reaches the top or the heap is rebuilt, which it is once most of
    it is such numbers. So the size is bounded by the alarms set and neither
    due yet nor cancelled (times two, plus 64). While any alarm is set, a
    timer is armed, so the loop holds its alarms (see ``_by_loop``).
    """

    def __init__(self) -> None:
        self._numbers: dict[Alarm, int] = {}
        self._alarms: dict[int, Alarm] = {}
        self._heap: list[tuple[float, int]] = []
        self._next = itertools.count()
        # The armed timer, held weakly: a handle holds its loop, and the loop
        # holds the handle while it is pending. A ``Handle``, not always a
        # ``TimerHandle``: uvloop's ``call_at`` calls soon instead, and returns
        # a handle without ``when()``, for a time less than 0.5 ms away. So
        # when it is due is kept here.
        self._handle: weakref.ref[asyncio.Handle] | None = None
        self._armed_at = 0.0

    def set(self, loop: asyncio.AbstractEventLoop, when: float, alarm: Alarm) -> None:
        """Call ``alarm`` on ``loop`` (the running loop) at ``when`` (in
        ``loop.time()`` seconds, float), or at once if that has passed, unless
        it is ``cancel``-ed first. Setting an alarm again moves it."""
        self.cancel(alarm)
        number = next(self._next)
        self._numbers[alarm] = number
        self._alarms[number] = alarm
        heapq.heappush(self._heap, (when, number))
        if len(self._heap) > 2 * len(self._alarms) + 64:
            self._heap = [entry for entry in self._heap if entry[1] in self._alarms]
            heapq.heapify(self._heap)
        self._arm(loop, when)

    def cancel(self, alarm: Alarm) -> None:
        """Forget ``alarm`` (a no-op if it rang or was cancelled already)."""
        number = self._numbers.pop(alarm, None)
        if number is not None:
            del self._alarms[number]

    def pending(self) -> int:
        """How many alarms are set and neither due yet nor cancelled (int)."""
        return len(self._alarms)

    def _ring(self) -> None:
        loop = asyncio.get_running_loop()
        self._handle = None
        heap, alarms = self._heap, self._alarms
        try:
            now = loop.time() + getattr(loop, "_clock_resolution", RING_MARGIN_S)
            while heap and heap[0][0] <= now:
                alarm = alarms.pop(heapq.heappop(heap)[1], None)
                if alarm is not None:  # not cancelled, nor moved since
                    del self._numbers[alarm]
                    alarm()
        finally:
            # Whatever an alarm raised (the loop's handler reports it), the
            # others keep a timer.
            while heap and heap[0][1] not in alarms:
                heapq.heappop(heap)
            if heap:
                self._arm(loop, heap[0][0])

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Have the timer ring at ``when`` at the latest (an alarm set from
        within ``_ring`` may have armed it already)."""
        handle = self._handle() if self._handle is not None else None
        if handle is None or when < self._armed_at:
            if handle is not None:
                handle.cancel()
            self._handle = weakref.ref(loop.call_at(when, self._ring))
            self._armed_at = when


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[Alarms]] = (
    weakref.WeakKeyDictionary()
)
"""Each loop's ``Alarms``, held weakly. What holds them is the loop (their armed
timer, while any alarm is set; ``close()`` drops it) and whoever set an alarm
and may cancel it. Their alarms lead back to the loop (a task, a renewal), so
a strong reference here would keep every loop that closed with an alarm set
(a lease still held, a call cut off by the loop's end), and all it holds."""
_guard = native.lock()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the guard at the moment of the fork;
    # the parent's loops are not the child's.
    global _by_loop, _guard
    _by_loop = weakref.WeakKeyDictionary()
    _guard = native.lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def alarms(loop: asyncio.AbstractEventLoop) -> Alarms:
    """``loop``'s ``Alarms``, created on first use (and again once the last
    ones were dropped)."""
    kept = _by_loop.get(loop)
    found = kept() if kept is not None else None
    if found is None:
        with _guard:
            kept = _by_loop.get(loop)
            found = kept() if kept is not None else None
            if found is None:
                found = Alarms()
                _by_loop[loop] = weakref.ref(found)
    return found
